#!/usr/bin/env bash
# Session 26, call 1 (prepared in session 25, which had only H100s): session 25's defaults on an
# H200, against PyTorch in the same call: the decode steps at batch 1 / 64 (the status tables of
# docs/performance.md are H200 figures), the A / Bs of session 25's three changes (the BF16-KV
# attention variant: PD_CUDA_ATTN_BF16=0 the old blocks; PD_CUDA_GEMV_WIDE=0 the FP8 GEMV's
# 8-byte loads), gpu_bench attn and attnbf, the prefill table and its PyTorch step, stepprof, the
# gates, the GPU cluster, then the whole harness with what is left.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s26a.sh
#   DEADLINE=560 bash .gpu-round/run-round-s26a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gates_start 150
PD_GPU_TEST_ATTN=1 PD_GPU_TEST_SMALL=1 st katt 60 $G/bin/test_gpu_kernels; cases katt
PD_GPU_TEST_GEMVW=1 st kgw 30 $G/bin/test_gpu_kernels; cases kgw
gates_end
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 45 $G/bin/gpu_bench decode; tab decode
st baseline 45 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
GPU_BENCH_DECODE_ONLY=fp8 PD_CUDA_ATTN_BF16=0 st decode_a0 30 $G/bin/gpu_bench decode; tab decode_a0
GPU_BENCH_DECODE_ONLY=fp8 PD_CUDA_GEMV_WIDE=0 st decode_g0 30 $G/bin/gpu_bench decode; tab decode_g0
GPU_BENCH_DECODE_ONLY=fp8 st decode_f8 30 $G/bin/gpu_bench decode; tab decode_f8
unset GPU_BENCH_DECODE_BATCHES
st attn 40 $G/bin/gpu_bench attn; tab attn
st attnbf 40 $G/bin/gpu_bench attnbf; tab attnbf
st prefill 60 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
st baseline_prefill 60 python3 $G/torch_prefill_baseline.py; tail -12 $L/baseline_prefill.log
GPU_BENCH_STEPPROF=decode st prof 60 $G/bin/gpu_bench stepprof; tab prof
st cluster 90 python3 $G/check_cluster.py $G/bin --models deploy/models; tail -12 $L/cluster.log
st kernels 280 $G/bin/test_gpu_kernels; cases kernels
round_end
