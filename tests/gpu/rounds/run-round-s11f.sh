#!/usr/bin/env bash
# Session 11, call 6: matmul_quant_act_f16wg (the wgmma GEMM's activation image, one block per
# row) with 512 threads per block (1024 from K 8192) instead of 256, A / B in the same call
# (PD_CUDA_F16WG_THREADS=256: the old launch): `gpu_bench w4wg` (its int4 op column includes the
# quantization), `gpu_bench qkvgroup`, the decode steps at batch 32 / 64; the w4wg harness cases,
# the accuracy gates.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s11f.sh
#   DEADLINE=300 bash .gpu-round/run-round-s11f.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=300
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W4WG=1 st kw4wg 60 $G/bin/test_gpu_kernels; cases kw4wg
PD_CUDA_F16WG_THREADS=256 GPU_BENCH_DECODE_BATCHES="1 32 64" st decode0 50 $G/bin/gpu_bench decode; tab decode0
GPU_BENCH_DECODE_BATCHES="1 32 64" st decode1 50 $G/bin/gpu_bench decode; tab decode1
PD_CUDA_F16WG_THREADS=256 st qkvgroup0 20 $G/bin/gpu_bench qkvgroup; tab qkvgroup0 | head -12
st qkvgroup1 20 $G/bin/gpu_bench qkvgroup; tab qkvgroup1 | head -12
PD_CUDA_F16WG_THREADS=256 GPU_BENCH_W4MMA_N=64 st w4wg0 30 $G/bin/gpu_bench w4wg; tab w4wg0
GPU_BENCH_W4MMA_N=64 st w4wg1 30 $G/bin/gpu_bench w4wg; tab w4wg1
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
round_end
