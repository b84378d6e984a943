#!/usr/bin/env bash
# Session 14, call 2: the gates after matmul_fused (call 1): the whole harness at fixture shapes,
# the pdl / fused whole-step cases, the accuracy gates (ppl, greedy against transformers), the
# cluster check, prefill (no fused path there: a regression check) and its PyTorch baseline.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s14b.sh
#   DEADLINE=540 bash .gpu-round/run-round-s14b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SMALL=1 st ksmall 120 $G/bin/test_gpu_kernels; cases ksmall; grep -E "mm fused|decode_fuse|decode_pdl" $L/ksmall.log | head -30
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
st prefill 90 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
st baseline_prefill 120 python3 $G/torch_prefill_baseline.py; tail -20 $L/baseline_prefill.log
round_end
