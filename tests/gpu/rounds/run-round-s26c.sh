#!/usr/bin/env bash
# Session 26, call 2 (short: the budget left after s26b): the K-split GEMV as the default FP8
# route at n 1..8 (PD_CUDA_FP8_KSPLIT=15 built in): the gates, the harness sets whose cases now
# pin the older routes (PD_GPU_TEST_FP8CL: the FP8 mma kernel and its q / k / v group;
# PD_GPU_TEST_GEMVW: the f32 GEMV) and the K-split set, then the default decode table (all four
# rows, batch 1 / 64) against PyTorch in the same call.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s26c.sh
#   DEADLINE=200 bash .gpu-round/run-round-s26c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=200
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
gates_start 80
PD_GPU_TEST_KSPLIT=1 PD_GPU_TEST_SMALL=1 st kks 40 $G/bin/test_gpu_kernels; cases kks
PD_GPU_TEST_FP8CL=1 PD_GPU_TEST_SMALL=1 st kcl 40 $G/bin/test_gpu_kernels; cases kcl
PD_GPU_TEST_GEMVW=1 PD_GPU_TEST_SMALL=1 st kgw 30 $G/bin/test_gpu_kernels; cases kgw
gates_end
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 40 $G/bin/gpu_bench decode; tab decode
st baseline 30 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
round_end
