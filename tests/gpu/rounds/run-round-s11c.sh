#!/usr/bin/env bash
# Session 11, call 3: the attention block's q, k, v INT4 projections as one grouped launch (backend
# op matmul_group: matmul_w4gemv_group at the GEMV sizes, matmul_w4wg_group at n 25..256) on top
# of call 2's PDL launches. The harness's w4wg + grouped cases, the xgemv cases (the single-weight
# GEMV now runs through the grouped launcher), memcheck, `gpu_bench qkvgroup` (three matmul calls
# against one group), the decode steps at batch 1 / 16 / 32 / 64, stepprof, the PyTorch baseline,
# the accuracy gates (tiny-llama decode runs the grouped GEMV).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s11c.sh
#   DEADLINE=450 bash .gpu-round/run-round-s11c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=450
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W4WG=1 st kw4wg 90 $G/bin/test_gpu_kernels; cases kw4wg; grep -E "mm group" $L/kw4wg.log | head -60
PD_GPU_TEST_XGEMV=1 st kxgemv 90 $G/bin/test_gpu_kernels; cases kxgemv
PD_GPU_TEST_W4WG=1 PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st qkvgroup 60 $G/bin/gpu_bench qkvgroup; tab qkvgroup
GPU_BENCH_DECODE_BATCHES="1 16 32 64" st decode 80 $G/bin/gpu_bench decode; tab decode
GPU_BENCH_STEPPROF=decode st stepprof 90 $G/bin/gpu_bench stepprof; tab stepprof | grep -E "^####|steps;|w4|quant|sum|group"
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
round_end
