#!/usr/bin/env bash
# Session 20, call 2: every launcher now sets the dynamic shared-memory attribute per device
# (kutil_allow_smem, kernels/kutil.cuh) instead of once per process; this call runs the whole
# kernel harness on it (every kernel family, CPU reference, per-element errors), then the
# decode step (batch 1 / 32 / 64, INT4 and FP8) and the prefill table, with the w4wg
# configuration Z chosen from call 1 (s19a): Z=0 (default), 1 or 2 (PD_CUDA_W4WG_LAZY).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s20a.sh
#   Z=1 DEADLINE=420 bash .gpu-round/run-round-s20a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=420
. "$(dirname "$0")/round-lib.sh"
Z=${Z:-0}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_CUDA_W4WG_LAZY=$Z st kernels 200 $G/bin/test_gpu_kernels; cases kernels
PD_CUDA_W4WG_LAZY=$Z GPU_BENCH_DECODE_BATCHES="1 32 64" st decode 60 $G/bin/gpu_bench decode; tab decode
st prefill 90 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
round_end
