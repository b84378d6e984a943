#!/usr/bin/env bash
# Session 26, call 1 (in place of s26a, which no machine came for): the FP8 K-split mma GEMV
# (matmul_fp8_ksplit, PD_CUDA_FP8_KSPLIT=MASK, off by default) checked and measured, plus
# session 25's defaults against PyTorch in the same call: the harness's K-split cases and their
# memcheck, the gates, `gpu_bench ksplit` (per GEMM, n 1..8, both load batches), the decode step
# (FP8 batch 1 / 8 with route masks 3, 11 (q, k, v grouped), 15, 1 and the load batch 8,
# alternating with the default), the whole default step
# table and PyTorch's, stepprof with the K-split on, the prefill table when the card is an H200
# (the status tables' card), then the whole harness with what is left.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s26b.sh
#   DEADLINE=560 bash .gpu-round/run-round-s26b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gates_start 150
PD_GPU_TEST_KSPLIT=1 PD_GPU_TEST_SMALL=1 st kks 60 $G/bin/test_gpu_kernels; cases kks
PD_GPU_TEST_KSPLIT=1 PD_GPU_TEST_SMALL=1 st kks_mc 90 compute-sanitizer --tool memcheck $G/bin/test_gpu_kernels; cases kks_mc
gates_end
st ksplit 60 $G/bin/gpu_bench ksplit; tab ksplit
export GPU_BENCH_DECODE_ONLY=fp8 GPU_BENCH_DECODE_BATCHES="1 8"
st d0 30 $G/bin/gpu_bench decode; tab d0
PD_CUDA_FP8_KSPLIT=3 st d3 30 $G/bin/gpu_bench decode; tab d3
PD_CUDA_FP8_KSPLIT=11 st d11 30 $G/bin/gpu_bench decode; tab d11
PD_CUDA_FP8_KSPLIT=15 st d15 30 $G/bin/gpu_bench decode; tab d15
st d0b 30 $G/bin/gpu_bench decode; tab d0b
PD_CUDA_FP8_KSPLIT=11 PD_CUDA_FP8_KSPLIT_U=8 st d11u8 30 $G/bin/gpu_bench decode; tab d11u8
PD_CUDA_FP8_KSPLIT=1 st d1 30 $G/bin/gpu_bench decode; tab d1
PD_CUDA_FP8_KSPLIT=11 st d11b 30 $G/bin/gpu_bench decode; tab d11b
unset GPU_BENCH_DECODE_ONLY
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 45 $G/bin/gpu_bench decode; tab decode
st baseline 45 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
unset GPU_BENCH_DECODE_BATCHES
PD_CUDA_FP8_KSPLIT=11 GPU_BENCH_STEPPROF=decode st prof 60 $G/bin/gpu_bench stepprof; tab prof
case "$card" in *H200*)
  st prefill 60 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
  st baseline_prefill 60 python3 $G/torch_prefill_baseline.py; tail -12 $L/baseline_prefill.log ;;
esac
st kernels 300 $G/bin/test_gpu_kernels; cases kernels
round_end
