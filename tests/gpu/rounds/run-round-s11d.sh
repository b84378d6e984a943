#!/usr/bin/env bash
# Session 11, call 4: matmul__w4gemv asks L2 for its slice of the block's first tile before the
# PDL wait (PD_CUDA_W4PREFETCH=0: not), A / B in the same call: `gpu_bench qkvgroup` and the
# decode steps at batch 1 / 16 / 64 with it off and on; stepprof; the whole harness at fixture
# shapes and under memcheck (every route since calls 2-3 changed the split-K sums' launches and
# the GEMV launcher), the xgemv cases at full size, the cluster check, the accuracy gates, the
# PyTorch baseline.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s11d.sh
#   DEADLINE=500 bash .gpu-round/run-round-s11d.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=500
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_CUDA_W4PREFETCH=0 st qkvgroup0 30 $G/bin/gpu_bench qkvgroup; tab qkvgroup0
st qkvgroup1 30 $G/bin/gpu_bench qkvgroup; tab qkvgroup1
PD_CUDA_W4PREFETCH=0 GPU_BENCH_DECODE_BATCHES="1 16 64" st decode0 60 $G/bin/gpu_bench decode; tab decode0
GPU_BENCH_DECODE_BATCHES="1 16 64" st decode1 60 $G/bin/gpu_bench decode; tab decode1
GPU_BENCH_STEPPROF=decode st stepprof 60 $G/bin/gpu_bench stepprof; tab stepprof | grep -E "^####|steps;|w4gemv"
st baseline 60 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
PD_GPU_TEST_SMALL=1 st ksmall 90 $G/bin/test_gpu_kernels; cases ksmall
PD_GPU_TEST_SMALL=1 st memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
PD_GPU_TEST_XGEMV=1 st kxgemv 60 $G/bin/test_gpu_kernels; cases kxgemv
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
st cluster 90 python3 $G/check_cluster.py $G/bin --models deploy/models; tail -8 $L/cluster.log
round_end
