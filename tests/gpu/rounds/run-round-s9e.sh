#!/usr/bin/env bash
# Session 9's fifth round: A / B of s9d's two attention changes in one call. The split merge under
# ncu at batch 1 / 32k (66 splits; s9c measured the old merge at 21.3 us with the same ncu
# command), and the whole decode steps and the context table with the default split policy
# against GPU_BENCH_ATTN_TARGET=528 (the built-in target with the bf16 batch-64 split off).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s9e.sh
#   DEADLINE=240 bash .gpu-round/run-round-s9e.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=240
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
st ncu_merge 60 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:attention__merge" --launch-count 2 --section SpeedOfLight --section LaunchStats --section WarpStateStats $G/bin/gpu_bench attnprof
grep -E "attention__|Duration|Memory Throughput|Warp Cycles Per Issued|Grid Size" $L/ncu_merge.log | head -20
GPU_BENCH_DECODE_BATCHES="1 64" st decode 45 $G/bin/gpu_bench decode; tab decode
GPU_BENCH_ATTN_TARGET=528 GPU_BENCH_DECODE_BATCHES="1 64" st decode_nosplit 45 $G/bin/gpu_bench decode; tab decode_nosplit
st ctxscale 40 $G/bin/gpu_bench ctxscale; tab ctxscale
GPU_BENCH_ATTN_TARGET=528 st ctxscale_nosplit 40 $G/bin/gpu_bench ctxscale; tab ctxscale_nosplit
round_end
