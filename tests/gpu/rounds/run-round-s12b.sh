#!/usr/bin/env bash
# Session 12, call 2: two latency fixes found by call 1's critical-path column, both bit-identical
# to what they replace: kv_rope_write as a warp per (token, head) (PD_CUDA_ROPE_WARPS=0: the old
# block-per-token kernel, A / B in the same call) and add_rmsnorm's loads before its stores. The
# harness at fixture shapes (rope_kv_write byte-equal to rope + rope + kv_write) and under memcheck,
# decode at batch 1 / 64 with the A / B, stepprof, the prefill table, the accuracy gates.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s12b.sh
#   DEADLINE=420 bash .gpu-round/run-round-s12b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=420
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SMALL=1 st ksmall 90 $G/bin/test_gpu_kernels; cases ksmall; grep -E "rope_kv_wr|add_rmsnorm" $L/ksmall.log | head -20
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
GPU_BENCH_DECODE_BATCHES="1 64" st decode 60 $G/bin/gpu_bench decode; tab decode
PD_CUDA_ROPE_WARPS=0 GPU_BENCH_DECODE_BATCHES="1 64" st decode_rope0 60 $G/bin/gpu_bench decode; tab decode_rope0
GPU_BENCH_STEPPROF=decode st stepprof 90 $G/bin/gpu_bench stepprof; tab stepprof
st prefill 60 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
round_end
