#!/usr/bin/env bash
# Session 21, first call: the FP8 wgmma + TMA GEMM (matmul_w8wg, option w8wg), the W4A8 INT4 GEMM
# on it (matmul_w4a8wg, PD_CUDA_W4A8) and session 20's sampler (PD_CUDA_SAMPLE_BUCKET=1), all off
# by default and unrun before. In order: their harness cases (forced plans, plans at the 8B
# shapes, the whole FP8 decode step with w8wg on against off, the backend route), `gpu_bench
# w8wg` (w8wg against the FP8 op, w4a8wg against the INT4 op, n 1..64), the decode step with
# every switch off (the defaults) and on, the sampling / logprobs cases on both sampler paths,
# memcheck of both case sets, `gpu_bench sample`, then ncu of the n-64 GEMMs.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s21a.sh
#   DEADLINE=540 bash .gpu-round/run-round-s21a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W8WG=1 st kw8 100 $G/bin/test_gpu_kernels; cases kw8; grep -E "w8wg|w4a8|    t " $L/kw8.log | head -50
st bw8 100 $G/bin/gpu_bench w8wg; tab bw8
# off: every default; on: w8wg (FP8 n >= 1), W4A8 (INT4 n >= 9), the bucket sampler (top-p column)
PD_CUDA_W8WG=0 PD_CUDA_W4A8=0 PD_CUDA_SAMPLE_BUCKET=0 GPU_BENCH_DECODE_BATCHES="1 16 64" st decode_off 60 $G/bin/gpu_bench decode; tab decode_off
PD_CUDA_W8WG=1 PD_CUDA_W4A8=9 PD_CUDA_SAMPLE_BUCKET=1 GPU_BENCH_DECODE_BATCHES="1 16 64" st decode_on 60 $G/bin/gpu_bench decode; tab decode_on
PD_GPU_TEST_SAMPLE=1 st ksample 40 $G/bin/test_gpu_kernels; cases ksample
PD_GPU_TEST_W8WG=1 PD_GPU_TEST_SMALL=1 st mcw8 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcw8
PD_GPU_TEST_SAMPLE=1 PD_GPU_TEST_SMALL=1 st mcsample 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcsample
st sample 40 $G/bin/gpu_bench sample; tab sample
st ncu 45 ncu --clock-control none --kernel-name regex:"w8wg|w4a8|w4wg|gemm|Kernel" --launch-count 12 --section SpeedOfLight -f -o $L/w8 env GPU_BENCH_W8WG_ONCE=1 GPU_BENCH_W8WG_N=64 $G/bin/gpu_bench w8wg
st ncudet 20 ncu -i $L/w8.ncu-rep --page details; grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Thr" $L/ncudet.log | head -60
round_end
