#!/usr/bin/env bash
# Session 20, call 2: the whole kernel harness after configurations 3 and 4 of matmul_w4wg were
# removed (call s20b: configuration 4 hung, configuration 3 no faster), with session 20's sampler
# cases and every launcher on the per-device shared-memory attribute; memcheck of the fixture-size
# cases (the sampler's sampled rows among them); the decode step at batch 1 / 64 again (greedy and
# top-p columns).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s20c.sh
#   DEADLINE=330 bash .gpu-round/run-round-s20c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=330
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
st kernels 200 $G/bin/test_gpu_kernels; cases kernels; grep -E "^sample" $L/kernels.log | head -30
GPU_BENCH_DECODE_BATCHES="1 64" st decode 40 $G/bin/gpu_bench decode; tab decode
PD_GPU_TEST_SMALL=1 st memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
round_end
