#!/usr/bin/env bash
# Session 13, call 2: the slice GEMV's weights through bulk copies (cp.async.bulk by lane 0 of each
# warp into a ring of 4 steps in shared memory, mbarrier per slot) instead of 16-byte loads into
# registers (PD_CUDA_W4BULK=1 on, default off: the register stream, A / B). Harness at fixture shapes (xgemv cases
# on both streams), the xgemv cases at full size and under memcheck, `gpu_bench xgemv` at the
# plans (both streams) and swept (bulk), ncu of gate_up n 1 (both), decode at batch 1 / 2 / 4 /
# 64 (both), stepprof, the accuracy gates.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s13a.sh
#   DEADLINE=330 bash .gpu-round/run-round-s13a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=330
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_XGEMV=1 st kxgemv 60 $G/bin/test_gpu_kernels; cases kxgemv; grep -E "bulk" $L/kxgemv.log | head -4
PD_GPU_TEST_XGEMV=1 PD_GPU_TEST_SMALL=1 st memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
PD_CUDA_W4BULK=1 GPU_BENCH_DECODE_BATCHES="1 2 4 64" st decode 60 $G/bin/gpu_bench decode; tab decode
PD_CUDA_W4BULK=0 GPU_BENCH_DECODE_BATCHES="1 2 4 64" st decode_regs 60 $G/bin/gpu_bench decode; tab decode_regs
PD_CUDA_W4BULK=1 GPU_BENCH_XGEMV_NOSWEEP=1 st xgemv 60 $G/bin/gpu_bench xgemv; grep -E "^(int4|fp8) |^\| " $L/xgemv.log
PD_CUDA_W4BULK=0 GPU_BENCH_XGEMV_NOSWEEP=1 st xgemv_regs 60 $G/bin/gpu_bench xgemv; grep -E "^(int4|fp8) |^\| " $L/xgemv_regs.log
PD_CUDA_W4BULK=1 st ncu 60 ncu --clock-control none --kernel-name regex:w4gemv --launch-skip 5 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats env GPU_BENCH_XGEMV_NOSWEEP=1 GPU_BENCH_XGEMV_SHAPES=1 $G/bin/gpu_bench xgemv; grep -E "w4gemv|Duration|DRAM Through|Memory Through|Registers|Achieved Occ|Theoretical Occ|Stall|Issued Warp|Block Limit|Dynamic Shared" $L/ncu.log | head -40
PD_CUDA_W4BULK=0 st ncu_regs 60 ncu --clock-control none --kernel-name regex:w4gemv --launch-skip 5 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats env GPU_BENCH_XGEMV_NOSWEEP=1 GPU_BENCH_XGEMV_SHAPES=1 $G/bin/gpu_bench xgemv; grep -E "w4gemv|Duration|DRAM Through|Memory Through|Registers|Achieved Occ|Theoretical Occ|Stall|Issued Warp|Block Limit|Dynamic Shared" $L/ncu_regs.log | head -40
PD_CUDA_W4BULK=1 GPU_BENCH_STEPPROF=decode st stepprof 60 $G/bin/gpu_bench stepprof; tab stepprof | head -24
PD_GPU_TEST_W4WG=1 st kw4wg 60 $G/bin/test_gpu_kernels; cases kw4wg
PD_CUDA_W4BULK=1 st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
round_end
