#!/usr/bin/env bash
# Session 8's round: moe_gmm3 is now the default grouped MoE matmul (measured in session 8's first
# round: Qwen3-30B-A3B batch 64 step 16.39 -> 8.28 ms FP8, 17.03 -> 6.98 ms INT4), and
# int4_gemm=fp8 with cuBLASLt's VEC128 scales in their real layout (outer-dimension-major; the
# first round's per-row layout failed its harness cases and the ppl gate), a shape where cuBLASLt
# has no GEMM split into multiples of 16 rows + a padded tail. Then Nsight Compute on the INT4
# tensor-core GEMM at n 64 (the largest kernel of the INT4 batch-64 decode step).
# Prepare here with `bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s8.sh`, then on the device
# (carry .gpu-round and .gpu-models/llama-moe.tar.xz):
#   DEADLINE=400 bash .gpu-round/run-round-s8.sh
set -uo pipefail
ROUND_DEADLINE=400
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SMALL=1 st ksmall 60 $G/bin/test_gpu_kernels; cases ksmall; grep -A1 "int4_gemm=fp8" $L/ksmall.log
PD_GPU_TEST_MOE=1 PD_GPU_TEST_SMALL=1 st moe_memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases moe_memcheck
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -12 $L/greedy.log
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
PD_CUDA_INT4_GEMM=fp8 st ppl_int4fp8 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl_int4fp8.log
PD_CUDA_INT4_GEMM=fp8 st prefill_int4fp8 60 $G/bin/gpu_bench prefill; tab prefill_int4fp8; grep -E "prefill|int4_gemm" $L/prefill_int4fp8.log | head -12
st moe 90 $G/bin/gpu_bench moe; tab moe
GPU_BENCH_W4MMA_ONCE=1 GPU_BENCH_W4MMA_N=64 st ncu_int4mma 90 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:int4_mma_cp|fp8_mma_cp" --launch-count 8 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats $G/bin/gpu_bench w4mma
grep -E "matmul__|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall" $L/ncu_int4mma.log | head -90
round_end
