#!/usr/bin/env bash
# Session 11, call 1: matmul_w4wg with its wgmma groups running on across stages (a stage's
# memory given back after the next stage's first use, not after wait_group 0 at its end) and
# two A buffers for MT 1 NT 2 too; the route from n 25 (was 17). Its harness cases and memcheck,
# `gpu_bench w4wg`, ncu of gate_up at n 64 and 128, the decode steps at batch 1 / 16 / 32 / 64
# with the PyTorch baseline in the same call, then the accuracy gates.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s11.sh
#   DEADLINE=520 bash .gpu-round/run-round-s11.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=520
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W4WG=1 st kw4wg 90 $G/bin/test_gpu_kernels; cases kw4wg; grep -E "w4wg|plan 8B|default op" $L/kw4wg.log | head -40
PD_GPU_TEST_W4WG=1 PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st w4wg 120 $G/bin/gpu_bench w4wg; tab w4wg
for n in 64 128; do
GPU_BENCH_W4MMA_ONCE=1 GPU_BENCH_INT4_SHAPES=1 GPU_BENCH_W4MMA_N=$n st ncu$n 60 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:matmul__w4wg" --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats $G/bin/gpu_bench w4wg
grep -E "matmul__|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall|Grid Size" $L/ncu$n.log | head -30
done
GPU_BENCH_DECODE_BATCHES="1 16 32 64" st decode 80 $G/bin/gpu_bench decode; tab decode
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
round_end
