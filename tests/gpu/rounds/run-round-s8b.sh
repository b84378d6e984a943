#!/usr/bin/env bash
# Session 8's third round: int4_gemm=fp8's plan query with non-NULL stand-in pointers (the second
# round's query, with NULL scale pointers, was refused for every shape, so nothing ran on FP8),
# the moe_grouped INT4 tolerance for moe_gmm3 (f16 operands, 2e-3 as case_moe_gmm2's), then the
# INT4 prefill table and the same-run PyTorch prefill step.
#   DEADLINE=400 bash .gpu-round/run-round-s8b.sh   (prepare-round.sh tests/gpu/rounds/run-round-s8b.sh)
set -uo pipefail
ROUND_DEADLINE=400
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SMALL=1 st ksmall 60 $G/bin/test_gpu_kernels; cases ksmall; grep -A1 "int4_gemm=fp8" $L/ksmall.log
PD_GPU_TEST_MOE=1 st moe_cases 60 $G/bin/test_gpu_kernels; cases moe_cases
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
PD_CUDA_INT4_GEMM=fp8 st ppl_int4fp8 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl_int4fp8.log
PD_CUDA_INT4_GEMM=fp8 st prefill_int4fp8 60 $G/bin/gpu_bench prefill; grep -E "prefill|int4_gemm" $L/prefill_int4fp8.log | head -12
st baseline_prefill 120 python3 $G/torch_prefill_baseline.py; tail -20 $L/baseline_prefill.log
round_end
