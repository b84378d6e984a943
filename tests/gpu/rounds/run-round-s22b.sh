#!/usr/bin/env bash
# Session 22's second call (little budget left): the decode step with the new defaults (w4wg
# clusters on), the FP8 step with matmul_w8wg routed only for weights of at most 4096 rows
# (PD_CUDA_W8WG=17 PD_CUDA_W8WG_ROWS=4096: o, down and the separate q / k / v, where gpu_bench
# w8wg measured it faster than cuBLASLt) against the default, then as much of the whole kernel
# harness at fixture shapes as the time left allows (the full-size run of call s22a was cut at
# 220 s in the attention cases).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s22b.sh
#   DEADLINE=110 bash .gpu-round/run-round-s22b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=110
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
GPU_BENCH_DECODE_BATCHES="1 64" st decode 40 $G/bin/gpu_bench decode; tab decode
PD_CUDA_W8WG=17 PD_CUDA_W8WG_ROWS=4096 GPU_BENCH_DECODE_BATCHES="32 64" st decode_w8r 35 $G/bin/gpu_bench decode; tab decode_w8r
PD_GPU_TEST_SMALL=1 st kernels 80 $G/bin/test_gpu_kernels; cases kernels
round_end
