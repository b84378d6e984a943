#!/usr/bin/env bash
# Session 26's second round (prepared, not run: the budget ran out; session 27 ran it with the INT4
# K-split also reading the fused ops' f16 image, act_quant PD_ACT_F16WG at n 1..8):
# the FP8 K-split GEMV as the default FP8 route at n 1..8 (PD_CUDA_FP8_KSPLIT=15 built in) on
# whichever card comes, ideally an H200 (the status tables' card), and the INT4 K-split GEMV
# (PD_CUDA_INT4_KSPLIT=MASK, off by default, never run yet): the gates; the K-split cases (FP8 and
# INT4) and their memcheck; the harness sets whose cases now pin the older FP8 routes
# (PD_GPU_TEST_FP8CL, PD_GPU_TEST_GEMVW); `gpu_bench ksplit` against the routes before
# (PD_CUDA_FP8_KSPLIT=0 for its FP8 op column); the INT4 step at batch 1 / 4 with each INT4 mask,
# alternating with the default; the default table against PyTorch; stepprof with the INT4
# K-split on; the prefill table on an H200; the harness with what is left.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s26c.sh
#   DEADLINE=540 bash .gpu-round/run-round-s26c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gates_start 150
PD_GPU_TEST_KSPLIT=1 PD_GPU_TEST_SMALL=1 st kks 60 $G/bin/test_gpu_kernels; cases kks
PD_GPU_TEST_KSPLIT=1 PD_GPU_TEST_SMALL=1 st kks_mc 100 compute-sanitizer --tool memcheck $G/bin/test_gpu_kernels; cases kks_mc
PD_GPU_TEST_FP8CL=1 PD_GPU_TEST_SMALL=1 st kcl 40 $G/bin/test_gpu_kernels; cases kcl
PD_GPU_TEST_GEMVW=1 PD_GPU_TEST_SMALL=1 st kgw 30 $G/bin/test_gpu_kernels; cases kgw
gates_end
PD_CUDA_FP8_KSPLIT=0 st ksplit 80 $G/bin/gpu_bench ksplit; tab ksplit
export GPU_BENCH_DECODE_ONLY=int4 GPU_BENCH_DECODE_BATCHES="1 4"
st i0 30 $G/bin/gpu_bench decode; tab i0
PD_CUDA_INT4_KSPLIT=1 st i1 30 $G/bin/gpu_bench decode; tab i1
PD_CUDA_INT4_KSPLIT=3 st i3 30 $G/bin/gpu_bench decode; tab i3
PD_CUDA_INT4_KSPLIT=3 PD_CUDA_WG_ACT=0 st i3na 30 $G/bin/gpu_bench decode; tab i3na
PD_CUDA_INT4_KSPLIT=3 PD_CUDA_INT4_KSPLIT_U=4 st i3u4 30 $G/bin/gpu_bench decode; tab i3u4
st i0b 30 $G/bin/gpu_bench decode; tab i0b
GPU_BENCH_DECODE_BATCHES=8 st i0_8 30 $G/bin/gpu_bench decode; tab i0_8
PD_CUDA_INT4_KSPLIT=7 GPU_BENCH_DECODE_BATCHES=8 st i7_8 30 $G/bin/gpu_bench decode; tab i7_8
unset GPU_BENCH_DECODE_ONLY
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 45 $G/bin/gpu_bench decode; tab decode
st baseline 45 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
unset GPU_BENCH_DECODE_BATCHES
PD_CUDA_INT4_KSPLIT=3 GPU_BENCH_STEPPROF=decode st prof 60 $G/bin/gpu_bench stepprof; tab prof
case "$card" in *H200*)
  st prefill 60 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
  st baseline_prefill 60 python3 $G/torch_prefill_baseline.py; tail -12 $L/baseline_prefill.log ;;
esac
st kernels 300 $G/bin/test_gpu_kernels; cases kernels
round_end
