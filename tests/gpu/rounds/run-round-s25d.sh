#!/usr/bin/env bash
# Session 25, call 4 (short: the budget's last minutes): the FP8 f32 GEMV with 16-byte weight
# loads (matmul_gemv_fp8_wide, PD_CUDA_GEMV_WIDE=1: gate_up at batch 1, 44.6 us per launch on
# the H100 in call s25c's stepprof) — its harness cases, memcheck, and the FP8 batch-1 step
# with and without it, twice, alternating.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s25d.sh
#   DEADLINE=150 bash .gpu-round/run-round-s25d.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=150
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_GEMVW=1 st kgw 30 $G/bin/test_gpu_kernels; cases kgw; grep -E "gemv wide" $L/kgw.log
export GPU_BENCH_DECODE_BATCHES="1" GPU_BENCH_DECODE_ONLY=fp8
for i in 1 2; do
  st d1_$i 25 $G/bin/gpu_bench decode; tab d1_$i
  PD_CUDA_GEMV_WIDE=1 st d1w_$i 25 $G/bin/gpu_bench decode; tab d1w_$i
done
unset GPU_BENCH_DECODE_BATCHES GPU_BENCH_DECODE_ONLY
PD_GPU_TEST_GEMVW=1 PD_GPU_TEST_SMALL=1 st mcgw 30 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcgw
round_end
