#!/usr/bin/env bash
# The next session's first round (prepared in session 9, whose device time ran out): the ppl gate
# with its fp8 / int4 rows on the backend's defaults (session 9 found the gate ran them in the bf16
# split mode, which keeps INT4 GEMMs in bf16: int4_gemm=fp8, the default since session 8, was
# never gated end to end), greedy ids, the GPU cluster, and the decode / context tables on session
# 9's final merge (call 6 measured only batch 1 / 64 at 1k); session 9's moe_group kernel (never
# run: PD_CUDA_MOE_GROUP=2, harness cases for both kernels in cases_moe, the MoE step with each).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s10.sh
#   DEADLINE=560 bash .gpu-round/run-round-s10.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SMALL=1 st ksmall 60 $G/bin/test_gpu_kernels; cases ksmall
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st ppl 90 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
st cluster 90 python3 $G/check_cluster.py $G/bin --models deploy/models; tail -8 $L/cluster.log
GPU_BENCH_DECODE_BATCHES="1 16 64" st decode 60 $G/bin/gpu_bench decode; tab decode
st ctxscale 40 $G/bin/gpu_bench ctxscale; tab ctxscale
PD_GPU_TEST_MOE=1 st moe_cases 60 $G/bin/test_gpu_kernels; cases moe_cases; grep "moe_group" $L/moe_cases.log
st moe 60 $G/bin/gpu_bench moe; tab moe
PD_CUDA_MOE_GROUP=2 st moe_group2 60 $G/bin/gpu_bench moe; tab moe_group2
round_end
