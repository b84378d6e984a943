#!/usr/bin/env bash
# Session 21, the short call that ran (one H100; docs/performance.md, s21 round; the W4A8 kernel it
# measured, matmul_w4a8wg, was removed after it): the w8wg / w4a8wg harness cases, `gpu_bench
# w8wg` at n 64 and 1, the decode step with every switch off and on (w8wg, W4A8 from n 9, the
# bucket sampler) at batch 1 / 64, then the sampling cases.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s21c.sh
#   DEADLINE=240 bash .gpu-round/run-round-s21c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=240
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W8WG=1 st kw8 90 $G/bin/test_gpu_kernels; cases kw8; grep -E "w8wg|w4a8|    t " $L/kw8.log | head -50
for nn in 64 1; do GPU_BENCH_W8WG_N=$nn st bw8_$nn 30 $G/bin/gpu_bench w8wg; tab bw8_$nn; done
PD_CUDA_W8WG=0 PD_CUDA_W4A8=0 PD_CUDA_SAMPLE_BUCKET=0 GPU_BENCH_DECODE_BATCHES="1 64" st decode_off 45 $G/bin/gpu_bench decode; tab decode_off
PD_CUDA_W8WG=1 PD_CUDA_W4A8=9 PD_CUDA_SAMPLE_BUCKET=1 GPU_BENCH_DECODE_BATCHES="1 64" st decode_on 45 $G/bin/gpu_bench decode; tab decode_on
PD_GPU_TEST_SAMPLE=1 st ksample 40 $G/bin/test_gpu_kernels; cases ksample
round_end
