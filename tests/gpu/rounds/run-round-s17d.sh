#!/usr/bin/env bash
# Session 17, call 4: two 16-token tiles per warp step in the FP8-KV decode attention
# (attention_tc_pair, PD_CUDA_ATTN_PAIR=1: blocks of 3 warps, 4 per SM, 150 registers; the two
# tiles' S chains and P V products give each warp independent work, where s17a / s17b showed the
# one-tile warp bound by its own dependency chain): the attention harness cases (each fp8 hd 128
# case runs both) and memcheck on them, `gpu_bench attn` and the decode step with 0 / 1.
#   bash tests/gpu/build-bundle.sh build-cuda && cp .gpu/bundle.tar.xz tests/gpu/rounds/run-round-s17d.sh .gpu-round/
#   DEADLINE=240 bash .gpu-round/run-round-s17d.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=240
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_ATTN=1 PD_GPU_TEST_SMALL=1 st memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
for p in 0 1; do PD_CUDA_ATTN_PAIR=$p st attn_p$p 30 $G/bin/gpu_bench attn; tab attn_p$p | head -14; done
for p in 0 1; do PD_CUDA_ATTN_PAIR=$p GPU_BENCH_DECODE_BATCHES="1 64" st decode_p$p 50 $G/bin/gpu_bench decode; tab decode_p$p; done
PD_GPU_TEST_ATTN=1 st kattn 60 $G/bin/test_gpu_kernels; cases kattn; grep -E "two tiles" -A1 $L/kattn.log | head -12
round_end
