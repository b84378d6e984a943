#!/usr/bin/env bash
# The next session's first call (after session 22, whose second call found no device time left).
# In order: matmul_fp8_mma's K splits inside clusters and its q / k / v group (PD_GPU_TEST_FP8CL=1:
# forced 2..8 splits, plans, the backend route, the same bits as the partial sums and as the
# weights one by one, the whole FP8 step with option fp8_group) and under memcheck; the decode
# step at batch 1 / 64 by default, with PD_CUDA_FP8_CLUSTER=1, with that and PD_CUDA_FP8_GROUP=1,
# and with the w8wg route limited to the 4096-row weights (PD_CUDA_W8WG=17
# PD_CUDA_W8WG_ROWS=4096), and batch 1 with 8 attention splits (GPU_BENCH_ATTN_TARGET=64); the
# PyTorch baseline; the
# whole kernel harness at full size (session 22's was cut at 220 s in the attention cases);
# stepprof of the four decode steps with both switches on.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s23a.sh
#   DEADLINE=560 bash .gpu-round/run-round-s23a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_FP8CL=1 st kf8 60 $G/bin/test_gpu_kernels; cases kf8; grep -E "cluster" $L/kf8.log | head -30
PD_GPU_TEST_FP8CL=1 PD_GPU_TEST_SMALL=1 st mcf8 40 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcf8
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 40 $G/bin/gpu_bench decode; tab decode
PD_CUDA_FP8_CLUSTER=1 st decode_f8cl 40 $G/bin/gpu_bench decode; tab decode_f8cl
PD_CUDA_FP8_CLUSTER=1 PD_CUDA_FP8_GROUP=1 st decode_f8grp 40 $G/bin/gpu_bench decode; tab decode_f8grp
PD_CUDA_W8WG=17 PD_CUDA_W8WG_ROWS=4096 st decode_w8r 40 $G/bin/gpu_bench decode; tab decode_w8r
# session 14 (H100): 8 attention splits at batch 1 / 1k 0.08 ms faster than the default 16;
# not the default without an H200 measurement: the batch-1 step with target 64 (8 splits)
GPU_BENCH_DECODE_BATCHES="1" GPU_BENCH_ATTN_TARGET=64 st decode_t64 30 $G/bin/gpu_bench decode; tab decode_t64
unset GPU_BENCH_DECODE_BATCHES
st baseline 40 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
st kernels 280 $G/bin/test_gpu_kernels; cases kernels
PD_CUDA_FP8_CLUSTER=1 PD_CUDA_FP8_GROUP=1 PD_CUDA_W8WG=17 PD_CUDA_W8WG_ROWS=4096 GPU_BENCH_STEPPROF=decode st prof 60 $G/bin/gpu_bench stepprof; tab prof
round_end
