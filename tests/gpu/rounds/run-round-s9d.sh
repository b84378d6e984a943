#!/usr/bin/env bash
# Session 9's fourth round: the split merge with its weights staged once in shared memory (the same
# sums in the same order; ncu in s9c: 21 us for 66 splits at batch 1 / 32k) and bf16 KV split at
# batch 64 from 1k context (chunks >= 512 tokens, at most 4; s9c's attnsplit). The attention
# cases at full size and under memcheck, the decode attention table, the whole decode steps with
# the same-run PyTorch step, and the context scaling table (the harness at fixture shapes too: the
# SIMT kernels share the merge).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s9d.sh
#   DEADLINE=560 bash .gpu-round/run-round-s9d.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_ATTN=1 st kattn 120 $G/bin/test_gpu_kernels; cases kattn; grep -E "8B b64|32k" $L/kattn.log | head -24
PD_GPU_TEST_SMALL=1 st ksmall 60 $G/bin/test_gpu_kernels; cases ksmall
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st attn 60 $G/bin/gpu_bench attn; tab attn
GPU_BENCH_DECODE_BATCHES="1 16 64" st decode 90 $G/bin/gpu_bench decode; tab decode
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
st ctxscale 90 $G/bin/gpu_bench ctxscale; tab ctxscale
round_end
