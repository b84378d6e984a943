#!/usr/bin/env bash
# Session 11, call 5: the backend op silu_matmul (the down projection computes silu·mul of the
# gate_up product inside its activation pass: the slice GEMV's prologue at n <= 4, the f16 image
# of the wgmma GEMM at n 25..256; one launch and the (n, f) f32 intermediate less). Its harness
# cases with the w4wg and grouped ones (full size) and under memcheck, `gpu_bench qkvgroup` (q /
# k / v and silu_matmul tables), the decode steps with it on and off (PD_CUDA_SILU_MM=0) in the
# same call, stepprof, the PyTorch baseline, the accuracy gates and the cluster check.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s11e.sh
#   DEADLINE=420 bash .gpu-round/run-round-s11e.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=420
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W4WG=1 st kw4wg 90 $G/bin/test_gpu_kernels; cases kw4wg; grep -E "silu mm" $L/kw4wg.log | head -40
PD_GPU_TEST_W4WG=1 PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st qkvgroup 40 $G/bin/gpu_bench qkvgroup; tab qkvgroup
PD_CUDA_SILU_MM=0 GPU_BENCH_DECODE_BATCHES="1 16 32 64" st decode0 60 $G/bin/gpu_bench decode; tab decode0
GPU_BENCH_DECODE_BATCHES="1 16 32 64" st decode1 60 $G/bin/gpu_bench decode; tab decode1
GPU_BENCH_STEPPROF=decode st stepprof 60 $G/bin/gpu_bench stepprof; tab stepprof | grep -E "^####|steps;"
st baseline 60 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
st cluster 90 python3 $G/check_cluster.py $G/bin --models deploy/models; tail -8 $L/cluster.log
round_end
