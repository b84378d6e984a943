#!/usr/bin/env bash
# Session 12, call 4: call 3's harness failures mended (the act f16wg case's output buffer was
# too small for d > f: an out-of-bounds write that also broke its neighbours; the act_quant case
# now expects PD_ACT_F16WG at n 200 on sm_90a), the fused SiLU·mul image kernel with the row in
# shared memory (call 3: 8.5 us per launch on the batch-64 critical path, more than the two
# launches it replaced), greedy sampling split across blocks (PD_CUDA_SAMPLE_SPLIT=0: one block
# per row, A / B). Harness at fixture shapes, memcheck, the w4wg / act cases, decode at batch 1 /
# 32 / 64 with both A / Bs, stepprof, `gpu_bench attn`, the accuracy gates.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s12d.sh
#   DEADLINE=420 bash .gpu-round/run-round-s12d.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=420
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SMALL=1 st ksmall 90 $G/bin/test_gpu_kernels; cases ksmall; grep -E "act f16wg|sample " $L/ksmall.log | head -40
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
PD_GPU_TEST_W4WG=1 st kw4wg 60 $G/bin/test_gpu_kernels; cases kw4wg
GPU_BENCH_DECODE_BATCHES="1 32 64" st decode 60 $G/bin/gpu_bench decode; tab decode
PD_CUDA_WG_ACT=0 PD_CUDA_SAMPLE_SPLIT=0 GPU_BENCH_DECODE_BATCHES="1 32 64" st decode_off 60 $G/bin/gpu_bench decode; tab decode_off
GPU_BENCH_STEPPROF=decode st stepprof 90 $G/bin/gpu_bench stepprof; tab stepprof
st attn 40 $G/bin/gpu_bench attn; tab attn
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
round_end
