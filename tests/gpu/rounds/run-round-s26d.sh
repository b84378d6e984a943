#!/usr/bin/env bash
# Session 26, a short call with the budget's last minutes: the INT4 K-split GEMV's first run (its
# harness cases with the FP8 ones, small) and the INT4 step at batch 1 / 4 with masks 3 and 7
# against the default, alternating.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s26d.sh
#   DEADLINE=110 bash .gpu-round/run-round-s26d.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=110
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PD_GPU_TEST_KSPLIT=1 PD_GPU_TEST_SMALL=1 st kks 45 $G/bin/test_gpu_kernels; cases kks; grep -E "i4ksplit|ksplit u. op|FAIL" $L/kks.log | head -30
export GPU_BENCH_DECODE_ONLY=int4 GPU_BENCH_DECODE_BATCHES="1 4"
st i0 20 $G/bin/gpu_bench decode; tab i0
PD_CUDA_INT4_KSPLIT=3 st i3 20 $G/bin/gpu_bench decode; tab i3
PD_CUDA_INT4_KSPLIT=7 st i7 20 $G/bin/gpu_bench decode; tab i7
st i0b 20 $G/bin/gpu_bench decode; tab i0b
round_end
