#!/usr/bin/env bash
# Session 14, call 2: the batch-1 attention split count on an H200 if one starts (call s14a ran
# on an H100: 8 splits at 1k 2.83 ms against 16 splits' 2.91). Bundle of call s14a (7107ef4),
# so PD_CUDA_GEMV_FUSE=0 (today's default) is set explicitly. Decode at batch 1 / 64 with the
# default splits and at GPU_BENCH_ATTN_TARGET=64 / 128, the PyTorch decode baseline.
#   DEADLINE=240 bash .gpu-round/run-round-s14c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=240
. "$(dirname "$0")/round-lib.sh"
export PD_CUDA_GEMV_FUSE=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
GPU_BENCH_DECODE_BATCHES="1 64" st decode 50 $G/bin/gpu_bench decode; tab decode
for t in 64 128; do GPU_BENCH_ATTN_TARGET=$t GPU_BENCH_DECODE_BATCHES="1" st decode_t$t 30 $G/bin/gpu_bench decode; tab decode_t$t; done
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
round_end
