#!/usr/bin/env bash
# Session 24, call 2: option w8wg's new default (FP8 matmuls of n 17..64 on matmul_w8wg for
# weights of at most 4096 rows: o and down at the 8B shapes; call s23c measured the FP8 batch-64
# step 8.58 -> 7.94 ms on an H200 with PD_CUDA_W8WG=17 PD_CUDA_W8WG_ROWS=4096). The w8wg harness
# cases (decode_w8wg restores the new default) and the greedy / perplexity gates beside them,
# memcheck of the w8wg cases, the decode step with the default and with PD_CUDA_W8WG=0 (the old
# default) in the same call, and session 22's FP8 batch-1 switches again (s23c: FP8_CLUSTER
# alone +0.08 ms, with fp8_group -0.03: within the noise?), each twice, alternating.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s24a.sh
#   DEADLINE=330 bash .gpu-round/run-round-s24a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=330
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
fx="tiny-llama tiny-moe"
st greedy 100 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --only $fx --jobs 6 > $L/greedy.st &
st ppl 100 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only $fx --jobs 4 > $L/ppl.st &
PD_GPU_TEST_W8WG=1 st kw8 60 $G/bin/test_gpu_kernels; cases kw8; grep -E "decode_w8wg|PD_CUDA_W8WG" $L/kw8.log
wait
for s in greedy ppl; do cat $L/$s.st; grep -qE "^=== $s: rc 0," $L/$s.st || rc=1; done
tail -8 $L/greedy.log; tail -8 $L/ppl.log
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 40 $G/bin/gpu_bench decode; tab decode
PD_CUDA_W8WG=0 st decode_w0 40 $G/bin/gpu_bench decode; tab decode_w0
export GPU_BENCH_DECODE_BATCHES="1"
for i in 1 2; do
  st d1_$i 25 $G/bin/gpu_bench decode; tab d1_$i
  PD_CUDA_FP8_CLUSTER=1 PD_CUDA_FP8_GROUP=1 st d1grp_$i 25 $G/bin/gpu_bench decode; tab d1grp_$i
done
unset GPU_BENCH_DECODE_BATCHES
PD_GPU_TEST_W8WG=1 PD_GPU_TEST_SMALL=1 st mcw8 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcw8
round_end
