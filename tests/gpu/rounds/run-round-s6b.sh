#!/usr/bin/env bash
# Session 6, the merged round's second call (lead): moe_gmm2 made the default and the bf16 page
# check of rope_wr_bf16 widened for k rotations that cancel to ~0 (the first call failed 3 of
# 16.7 M elements at 8B n 8192). Run with .gpu-round/ and .gpu-models/llama-moe.tar.xz carried:
#   DEADLINE=300 bash .gpu-round/run-round-s6b.sh
# (tests/gpu/round-lib.sh, which it sources, beside it in .gpu-round/: prepare-round.sh copies
# both.)
set -uo pipefail
ROUND_DEADLINE=300
. "$(dirname "$0")/round-lib.sh"
PD_GPU_TEST_PREFILL=1 st prefill_cases 60 $G/bin/test_gpu_kernels; cases prefill_cases; grep rope_wr $L/prefill_cases.log | grep "8B bf16"
PD_GPU_TEST_MOE=1 st moe_cases 60 $G/bin/test_gpu_kernels; cases moe_cases
PD_GPU_TEST_MOE=1 PD_GPU_TEST_SMALL=1 st moe_memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases moe_memcheck
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -6 $L/greedy.log
st cluster 60 python3 $G/check_cluster.py $G/bin --models deploy/models; grep -i "identical\|failures" $L/cluster.log
st moe 60 $G/bin/gpu_bench moe; grep "^| " $L/moe.log
PD_GPU_FLASH_VARIANTS=6 st kernels 200 $G/bin/test_gpu_kernels; cases kernels
round_end
