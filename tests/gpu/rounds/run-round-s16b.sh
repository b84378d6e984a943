#!/usr/bin/env bash
# Session 16, call 2 (right after s16a on the same warm machine, same carry): the Llama-3-8B
# decode step at batch 1 / 64 (INT4 + FP8 KV, FP8 + BF16 KV; device greedy) and the PyTorch
# decode baseline in the same call: sessions 14-15 were measured on an H100 only.
#   DEADLINE=200 bash .gpu-round/run-round-s16b.sh   (carry .gpu-round, .gpu-models/glm-dsv3.tar.xz)
set -uo pipefail
ROUND_DEADLINE=200
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
GPU_BENCH_DECODE_BATCHES="1 64" st decode 70 $G/bin/gpu_bench decode; tab decode
st baseline 100 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
round_end
