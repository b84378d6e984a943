#!/usr/bin/env bash
# Session 20, call 2 cut to the device time left (s20c with the quick parts first): the sampling
# harness cases alone (PD_GPU_TEST_SAMPLE=1: session 20's bucket-refinement sampler against the
# CPU reference) and under memcheck, the decode step at batch 1 / 64 (greedy and top-p columns),
# then the whole kernel harness as time allows.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s20d.sh
#   DEADLINE=210 bash .gpu-round/run-round-s20d.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=210
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SAMPLE=1 st ksample 40 $G/bin/test_gpu_kernels; cases ksample; grep -E "^sample" $L/ksample.log | head -30
PD_GPU_TEST_SAMPLE=1 PD_GPU_TEST_SMALL=1 st mcsample 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcsample
GPU_BENCH_DECODE_BATCHES="1 64" st decode 40 $G/bin/gpu_bench decode; tab decode
st kernels 200 $G/bin/test_gpu_kernels; cases kernels
round_end
