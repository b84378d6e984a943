#!/usr/bin/env bash
# Session 10, call 2: the wgmma INT4 GEMM (matmul_w4wg, kernels/matmul_w4wg.cu; the default for
# tiled INT4 at n 17..256 where usable, PD_CUDA_INT4_WG=0 turns it off): its harness cases (forced
# configurations, plans at the 8B shapes, the backend route) and memcheck on the small ones, the
# `gpu_bench w4wg` table against int4 mma and the FP8 op, ncu of gate_up at n 64, then the decode
# steps with and without it, the PyTorch baseline in the same call, and the accuracy gates.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s10b.sh
#   DEADLINE=540 bash .gpu-round/run-round-s10b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W4WG=1 st kw4wg 90 $G/bin/test_gpu_kernels; cases kw4wg; grep -E "w4wg|plan 8B|default op" $L/kw4wg.log | head -60
PD_GPU_TEST_W4WG=1 PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st w4wg 120 $G/bin/gpu_bench w4wg; tab w4wg
GPU_BENCH_W4MMA_ONCE=1 GPU_BENCH_W4MMA_N=64 st ncu 90 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:matmul__w4wg|int4_mma_cp" --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats $G/bin/gpu_bench w4wg
grep -E "matmul__|int4_mma|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall|Grid Size" $L/ncu.log | head -60
GPU_BENCH_DECODE_BATCHES="1 16 64" st decode 60 $G/bin/gpu_bench decode; tab decode
PD_CUDA_INT4_WG=0 GPU_BENCH_DECODE_BATCHES="16 64" st decode_off 50 $G/bin/gpu_bench decode; tab decode_off
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
round_end
