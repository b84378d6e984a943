#!/usr/bin/env bash
# Session 8's last round: int4_gemm=fp8 now the default (the bf16 split accuracy mode keeps bf16)
# and moe_gmm3 the default: the harness at fixture shapes and under memcheck, greedy ids, the ppl
# gate and the GPU cluster on the new defaults, then the kernel profile of the INT4 and FP8
# 8192-token prefill (gpu_bench stepprof, GPU_BENCH_STEPPROF=prefill).
#   DEADLINE=330 bash .gpu-round/run-round-s8c.sh   (prepare-round.sh tests/gpu/rounds/run-round-s8c.sh)
set -uo pipefail
ROUND_DEADLINE=330
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SMALL=1 st ksmall 60 $G/bin/test_gpu_kernels; cases ksmall; grep -A1 "int4_gemm=fp8" $L/ksmall.log
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
GPU_BENCH_STEPPROF=prefill st stepprof_prefill 90 $G/bin/gpu_bench stepprof; tab stepprof_prefill
st cluster 90 python3 $G/check_cluster.py $G/bin --models deploy/models; tail -8 $L/cluster.log
round_end
