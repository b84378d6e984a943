#!/usr/bin/env bash
# Session 21, first call: the FP8 wgmma + TMA GEMM (matmul_w8wg, option w8wg, off by default) and
# session 20's sampler (PD_CUDA_SAMPLE_BUCKET=1, off by default), both unrun before. In order:
# the w8wg harness cases (forced plans, plans at the 8B shapes, the whole FP8 decode step with the
# option on against off, the backend route), the sampling / logprobs cases on both sampler paths,
# `gpu_bench w8wg` (w8wg against the FP8 op and the INT4 op, n 1..64), the decode step with both
# switches off (the defaults) and on, memcheck of the w8wg and sampling cases, `gpu_bench sample`,
# then ncu of w8wg's n-64 plans against the FP8 op.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s21a.sh
#   DEADLINE=540 bash .gpu-round/run-round-s21a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W8WG=1 st kw8 90 $G/bin/test_gpu_kernels; cases kw8; grep -E "w8wg|forced|plan" $L/kw8.log | head -40
PD_GPU_TEST_SAMPLE=1 st ksample 40 $G/bin/test_gpu_kernels; cases ksample
st bw8 90 $G/bin/gpu_bench w8wg; tab bw8
for w in 0 1; do PD_CUDA_W8WG=$w PD_CUDA_SAMPLE_BUCKET=$w GPU_BENCH_DECODE_BATCHES="1 16 64" st decode_w$w 60 $G/bin/gpu_bench decode; tab decode_w$w; done
PD_GPU_TEST_W8WG=1 PD_GPU_TEST_SMALL=1 st mcw8 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcw8
PD_GPU_TEST_SAMPLE=1 PD_GPU_TEST_SMALL=1 st mcsample 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcsample
st sample 40 $G/bin/gpu_bench sample; tab sample
st ncu 45 ncu --clock-control none --kernel-name regex:"w8wg|gemm|Kernel" --launch-count 8 --section SpeedOfLight --section MemoryWorkloadAnalysis -f -o $L/w8 env GPU_BENCH_W8WG_ONCE=1 GPU_BENCH_W8WG_N=64 $G/bin/gpu_bench w8wg
st ncudet 20 ncu -i $L/w8.ncu-rep --page details; grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Thr" $L/ncudet.log | head -60
round_end
