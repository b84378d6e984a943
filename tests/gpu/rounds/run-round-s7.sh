#!/usr/bin/env bash
# Session 7's round (prepared in a session with no device time left; run it first in the next
# one): moe_gmm3 (the grouped expert matmul on mma.sync, PD_CUDA_MOE_GMM=3, never run yet) and
# kernels/mma.cuh (the dense INT4 / FP8 mma GEMMs' building blocks moved out of matmul.cu:
# behaviour unchanged, to be shown), the tensor-core decode attention PDL-launched and its
# optional in-kernel split merge (PD_CUDA_ATTN_FOLD=1), INT4 prefill GEMMs on the FP8 tensor
# cores (PD_CUDA_INT4_GEMM=fp8: the harness case, the ppl gate, the prefill table), then
# gpu_bench stepprof (CUPTI: kernel time per step).
# Prepare here with `bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s7.sh`, then run from the
# repository root on the device with .gpu-round/ (bundle.tar.xz from tests/gpu/build-bundle.sh)
# and .gpu-models/llama-moe.tar.xz carried:
#   DEADLINE=430 bash .gpu-round/run-round-s7.sh [check|bench|all]
# check: the correctness steps only (through the GPU cluster); bench: the benchmarks and the
# full-size harness only; all (default): both, in that order (more than one call's 600 s).
# Order: the new kernel's cases alone (fast, and a hang shows at once), the MoE cases under
# memcheck, the harness at fixture shapes (matmul.cu's refactor) and under memcheck, greedy ids
# and the ppl gate (moe_gmm2 and moe_gmm3), the GPU cluster, then the benchmarks: MoE (every
# grouped kernel) with its PyTorch step, stepprof, the Llama decode step with its PyTorch step,
# and the full-size harness with what time is left. Logs: $OUT/r.tgz; the summary is printed.
set -uo pipefail
ROUND_DEADLINE=430
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PART=${1:-all}
if [ "$PART" != bench ]; then
PD_GPU_TEST_MOE=1 PD_GPU_TEST_SMALL=1 st moe_small 40 $G/bin/test_gpu_kernels; cases moe_small; grep "gmm3" $L/moe_small.log | head -24
PD_GPU_TEST_MOE=1 st moe_cases 60 $G/bin/test_gpu_kernels; cases moe_cases
PD_GPU_TEST_MOE=1 PD_GPU_TEST_SMALL=1 st moe_memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases moe_memcheck
# the tensor-core decode attention is now PDL-launched, and attention_fold (the split merge inside
# the kernel, PD_CUDA_ATTN_FOLD=1) is new: the attention cases (both ways) alone, and racecheck
PD_GPU_TEST_ATTN=1 st attn_cases 60 $G/bin/test_gpu_kernels; cases attn_cases; grep -c "tc fold" $L/attn_cases.log
PD_GPU_TEST_ATTN=1 PD_GPU_TEST_SMALL=1 st attn_racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases attn_racecheck
PD_GPU_TEST_SMALL=1 st ksmall 60 $G/bin/test_gpu_kernels; cases ksmall
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -12 $L/greedy.log
PD_CUDA_MOE_GMM=3 st greedy_gmm3 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -12 $L/greedy_gmm3.log
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
PD_CUDA_MOE_GMM=3 st ppl_gmm3 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-moe --jobs 4; tail -12 $L/ppl_gmm3.log
PD_CUDA_INT4_GEMM=fp8 st ppl_int4fp8 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl_int4fp8.log
st cluster 120 python3 $G/check_cluster.py $G/bin --models deploy/models; tail -8 $L/cluster.log
fi
if [ "$PART" != check ]; then
st moe 90 $G/bin/gpu_bench moe; tab moe
st baseline_moe 90 python3 $G/torch_moe_baseline.py; tail -15 $L/baseline_moe.log
st stepprof 150 $G/bin/gpu_bench stepprof; tab stepprof
GPU_BENCH_DECODE_BATCHES="1 16 64" st decode 80 $G/bin/gpu_bench decode; tab decode
PD_CUDA_ATTN_FOLD=1 GPU_BENCH_DECODE_BATCHES="1 16" st decode_fold 50 $G/bin/gpu_bench decode; tab decode_fold
PD_CUDA_ATTN_FOLD=1 st attn_fold 40 $G/bin/gpu_bench attn; tab attn_fold
st baseline 60 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
PD_CUDA_INT4_GEMM=fp8 st prefill_int4fp8 90 $G/bin/gpu_bench prefill; tab prefill_int4fp8
st kernels 240 $G/bin/test_gpu_kernels; cases kernels
fi
round_end
