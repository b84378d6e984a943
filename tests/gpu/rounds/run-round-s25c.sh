#!/usr/bin/env bash
# Session 25, call 3: the split policy again, A / B alternating in the decode step at batch 8 /
# 16 / 32 (call s25b: the attention kernel 9-15% faster at batch 16 / 32 with
# PD_CUDA_ATTN_SPLITS=waves, the steps within noise), stepprof of the four decode steps with
# session 25's defaults (bf16-KV attention variant 1, the SiLU·mul loads), the GPU cluster gate
# (pdctl up; KV over CUDA IPC) with them, then the whole harness with what is left.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s25c.sh
#   DEADLINE=470 bash .gpu-round/run-round-s25c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=470
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
export GPU_BENCH_DECODE_BATCHES="8 16 32"
for i in 1 2; do
  st mid_$i 40 $G/bin/gpu_bench decode; tab mid_$i
  PD_CUDA_ATTN_SPLITS=waves st midw_$i 40 $G/bin/gpu_bench decode; tab midw_$i
done
unset GPU_BENCH_DECODE_BATCHES
GPU_BENCH_STEPPROF=decode st prof 60 $G/bin/gpu_bench stepprof; tab prof
st cluster 90 python3 $G/check_cluster.py $G/bin --models deploy/models; tail -12 $L/cluster.log
st kernels 200 $G/bin/test_gpu_kernels; cases kernels
round_end
