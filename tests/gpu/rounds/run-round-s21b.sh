#!/usr/bin/env bash
# Session 21, second call: the whole kernel harness (every family, now with the matmul_w8wg cases),
# the PyTorch decode baseline (same call as the figures it is compared with), the decode step with
# w8wg on (PD_CUDA_W8WG=1) and off at batch 1 / 64, and the step profile of the FP8 decode steps
# with w8wg on.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s21b.sh
#   DEADLINE=560 bash .gpu-round/run-round-s21b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
st kernels 220 $G/bin/test_gpu_kernels; cases kernels; grep -E "w8wg|sample" $L/kernels.log | grep -v PASS | head -20
for w in 0 1; do PD_CUDA_W8WG=$w GPU_BENCH_DECODE_BATCHES="1 64" st decode_w$w 50 $G/bin/gpu_bench decode; tab decode_w$w; done
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
PD_CUDA_W8WG=1 GPU_BENCH_STEPPROF=decode st stepprof 90 $G/bin/gpu_bench stepprof; tab stepprof | head -80
round_end
