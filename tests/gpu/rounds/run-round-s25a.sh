#!/usr/bin/env bash
# Session 25, call 1: the bf16-KV decode attention's variants (attention_tc_bf16, PD_CUDA_ATTN_BF16:
# 1 blocks of 3 warps, 4 per SM, so batch 64 x 8 KV heads is one wave; 2 Q / P in two bf16 parts;
# 3 both) against the default (0) — their harness cases, gpu_bench attnbf, the FP8 decode step
# with each — and session 24's unrun call s24a: the w8wg default's harness cases, the greedy /
# perplexity gates, the decode step with the default and with PD_CUDA_W8WG=0, memcheck.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s25a.sh
#   DEADLINE=450 bash .gpu-round/run-round-s25a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=450
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
fx="tiny-llama tiny-moe"
st greedy 110 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --only $fx --jobs 6 > $L/greedy.st &
st ppl 110 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only $fx --jobs 4 > $L/ppl.st &
PD_GPU_TEST_ATTN=1 st katt 60 $G/bin/test_gpu_kernels; cases katt; grep -E "variant|decode_abf16" $L/katt.log | head -40
PD_GPU_TEST_W8WG=1 st kw8 60 $G/bin/test_gpu_kernels; cases kw8; grep -E "decode_w8wg" $L/kw8.log
wait
for s in greedy ppl; do cat $L/$s.st; grep -qE "^=== $s: rc 0," $L/$s.st || rc=1; done
tail -8 $L/greedy.log; tail -8 $L/ppl.log
st attnbf 60 $G/bin/gpu_bench attnbf; tab attnbf
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 45 $G/bin/gpu_bench decode; tab decode
export GPU_BENCH_DECODE_ONLY=fp8
PD_CUDA_ATTN_BF16=1 st decode_a1 30 $G/bin/gpu_bench decode; tab decode_a1
PD_CUDA_ATTN_BF16=3 st decode_a3 30 $G/bin/gpu_bench decode; tab decode_a3
PD_CUDA_W8WG=0 st decode_w0 30 $G/bin/gpu_bench decode; tab decode_w0
PD_CUDA_ATTN_BF16=2 st decode_a2 30 $G/bin/gpu_bench decode; tab decode_a2
st decode_a0 30 $G/bin/gpu_bench decode; tab decode_a0
unset GPU_BENCH_DECODE_BATCHES GPU_BENCH_DECODE_ONLY
PD_GPU_TEST_ATTN=1 PD_GPU_TEST_SMALL=1 st mcatt 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcatt
PD_GPU_TEST_W8WG=1 PD_GPU_TEST_SMALL=1 st mcw8 50 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcw8
round_end
