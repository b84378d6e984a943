#!/usr/bin/env bash
# The next call after session 21 (whose short call s21c ran on one H100: the w8wg harness stopped at
# a case of its own that broke matmul_w8wg's split precondition, fixed since). In order: the
# matmul_w8wg cases again (forced plans, the 8B plans with at most 3 splits, the whole FP8 decode
# step with option w8wg on against off, the backend route), `gpu_bench w8wg` (w8wg against the FP8
# op at n 1..64), the decode step with w8wg off and on at batch 1 / 64, the whole kernel harness
# (every family; the sampler's bucket path now the default), memcheck of the w8wg cases, ncu of
# the n-64 w8wg launches (why the weight stream stays near 60% of DRAM).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s21a.sh
#   DEADLINE=560 bash .gpu-round/run-round-s21a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W8WG=1 st kw8 100 $G/bin/test_gpu_kernels; cases kw8; grep -E "w8wg|    t " $L/kw8.log | head -40
st bw8 90 $G/bin/gpu_bench w8wg; tab bw8
for w in 0 1; do PD_CUDA_W8WG=$w GPU_BENCH_DECODE_BATCHES="1 64" st decode_w$w 45 $G/bin/gpu_bench decode; tab decode_w$w; done
st kernels 220 $G/bin/test_gpu_kernels; cases kernels
PD_GPU_TEST_W8WG=1 PD_GPU_TEST_SMALL=1 st mcw8 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcw8
st ncu 45 ncu --clock-control none --kernel-name regex:w8wg --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats -f -o $L/w8 env GPU_BENCH_W8WG_ONCE=1 GPU_BENCH_W8WG_N=64 $G/bin/gpu_bench w8wg
st ncudet 20 ncu -i $L/w8.ncu-rep --page details; grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Compute \(SM\) Thr|Warp Cycles Per Issued|No Eligible" $L/ncudet.log | head -40
round_end
