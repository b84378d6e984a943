#!/usr/bin/env bash
# Session 17, call 4: two 16-token tiles per warp step in the FP8-KV decode attention
# (attention_tc_pair, PD_CUDA_ATTN_PAIR=1: blocks of 3 warps, 4 per SM, 150 registers; the two
# tiles' S chains and P V products give each warp independent work, where s17a / s17b showed the
# one-tile warp bound by its own dependency chain): the attention harness cases (each fp8 hd 128
# case runs both) and memcheck on them, `gpu_bench attn` and the decode step with 0 / 1. Then the
# LM head in FP8 / INT4 (pdctl --lm-head; GPU_BENCH_LM_HEAD): the bf16 LM head GEMV is ~12% of
# the INT4 batch-1 step (s15 stepprof); the decode step with each, and the perplexity gate with
# `--lm-heads fp8 int4` (on the CPU backend, tiny-llama: INT4 + FP8 KV with an FP8 head -0.03%,
# with an INT4 head +0.31% against bf16 / bf16; gate +0.5%).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s17d.sh
#   DEADLINE=360 bash .gpu-round/run-round-s17d.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=360
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_ATTN=1 PD_GPU_TEST_SMALL=1 st memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
for p in 0 1; do PD_CUDA_ATTN_PAIR=$p st attn_p$p 30 $G/bin/gpu_bench attn; tab attn_p$p | head -14; done
for p in 0 1; do PD_CUDA_ATTN_PAIR=$p GPU_BENCH_DECODE_BATCHES="1 64" st decode_p$p 50 $G/bin/gpu_bench decode; tab decode_p$p; done
for h in fp8 int4; do GPU_BENCH_LM_HEAD=$h GPU_BENCH_DECODE_BATCHES="1 64" st decode_lm$h 50 $G/bin/gpu_bench decode; tab decode_lm$h; done
st ppl 90 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama --lm-heads fp8 int4 --jobs 4; tail -10 $L/ppl.log
PD_GPU_TEST_ATTN=1 st kattn 60 $G/bin/test_gpu_kernels; cases kattn; grep -E "two tiles" -A1 $L/kattn.log | head -12
round_end
