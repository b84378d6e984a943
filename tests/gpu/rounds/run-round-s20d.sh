#!/usr/bin/env bash
# The next call after session 20 (s20c cut to a short call, the quick parts first): the sampling
# and logprobs harness cases alone (PD_GPU_TEST_SAMPLE=1: every case on both paths, the bisection
# and session 20's bucket refinement, against the CPU reference) and under memcheck, the ops
# timed on both paths (`gpu_bench sample`), the decode step at batch
# 1 / 64 with the bucket path off (default) and on (the greedy and top-p columns), then the whole
# kernel harness (configurations 3 and 4 of matmul_w4wg gone, every launcher on the per-device
# shared-memory attribute).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s20d.sh
#   DEADLINE=300 bash .gpu-round/run-round-s20d.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=300
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SAMPLE=1 st ksample 40 $G/bin/test_gpu_kernels; cases ksample; grep -E "^sample|^logprobs" $L/ksample.log | head -60
PD_GPU_TEST_SAMPLE=1 PD_GPU_TEST_SMALL=1 st mcsample 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcsample
st sample 40 $G/bin/gpu_bench sample; tab sample
for b in 0 1; do PD_CUDA_SAMPLE_BUCKET=$b GPU_BENCH_DECODE_BATCHES="1 64" st decode_b$b 40 $G/bin/gpu_bench decode; tab decode_b$b; done
st kernels 200 $G/bin/test_gpu_kernels; cases kernels
round_end
