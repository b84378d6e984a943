#!/usr/bin/env bash
# Session 12, call 3: the wgmma INT4 GEMM's f16 activation image made by the fused RMSNorm and
# SiLU·mul (act_quant's PD_ACT_F16WG; PD_CUDA_WG_ACT=0: the matmul_quant_act_f16wg launch per GEMM
# as before, A / B in the same call), the decode attention's first tiles loaded before its PDL
# wait, the split merge's partials loaded with its (m, l), add_rmsnorm's weights before its wait.
# The harness (act f16wg byte-equality cases) at fixture shapes and under memcheck, the 8B cases,
# decode at batch 1 / 32 / 64, stepprof, the accuracy gates; the slice GEMV's SASS for the record.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s12c.sh
#   DEADLINE=420 bash .gpu-round/run-round-s12c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=420
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SMALL=1 st ksmall 90 $G/bin/test_gpu_kernels; cases ksmall; grep -E "act f16wg|attn|merge" $L/ksmall.log | head -30
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
PD_GPU_TEST_W4WG=1 st kw4wg 90 $G/bin/test_gpu_kernels; cases kw4wg; grep -E "act f16wg" $L/kw4wg.log | head -30
GPU_BENCH_DECODE_BATCHES="1 32 64" st decode 60 $G/bin/gpu_bench decode; tab decode
PD_CUDA_WG_ACT=0 GPU_BENCH_DECODE_BATCHES="1 32 64" st decode_wg0 60 $G/bin/gpu_bench decode; tab decode_wg0
GPU_BENCH_STEPPROF=decode st stepprof 90 $G/bin/gpu_bench stepprof; tab stepprof
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
st sass 40 bash -c "cuobjdump -sass $G/bin/gpu_bench | awk '/Function : /{p = /w4gemvILi2ELi2ELb0/} p' | head -6000"; grep -c "" $L/sass.log
round_end
