#!/usr/bin/env bash
# Session 22's first call. In order: the matmul_w4wg cases (the K splits added inside
# thread-block clusters: forced plans 2..8 blocks, plans at the 8B shapes, the same bits as the
# partial sums' second launch, the grouped q / k / v, the whole INT4 decode step with option
# w4wg_cluster on against off), `gpu_bench w4wg` at n 64 (the plans with and without clusters,
# forced sweeps), the decode step at batch 1 / 64 with PD_CUDA_W4WG_CLUSTER=0 / 1, the PyTorch
# baseline, the matmul_w8wg cases (its epilogue now mma_cluster_sum) and `gpu_bench w8wg`, the
# whole kernel harness (not run since session 20), memcheck of the w4wg cases, stepprof of the
# batch-64 steps with clusters, ncu of the n-64 w4wg launches. decode_old: HEAD e59e451's
# gpu_bench (.gpu-round/gpu_bench_old.xz, copied in by hand) against this tree's with clusters
# off: the SiLU·mul image kernel's loads first and the RMSNorm row kept in shared memory.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s22a.sh
#   DEADLINE=560 bash .gpu-round/run-round-s22a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W4WG=1 st kw4 150 $G/bin/test_gpu_kernels; cases kw4; grep -E "cluster|decode_w4cl" $L/kw4.log | head -40
GPU_BENCH_W4MMA_N=64 st bw4 90 $G/bin/gpu_bench w4wg; tab bw4
for c in 0 1; do PD_CUDA_W4WG_CLUSTER=$c GPU_BENCH_DECODE_BATCHES="1 64" st decode_c$c 45 $G/bin/gpu_bench decode; tab decode_c$c; done
# HEAD e59e451's gpu_bench (before session 22), carried xz-compressed: the same step A / B
[ -f $F/gpu_bench_old.xz ] && xz -dc $F/gpu_bench_old.xz > $G/bin/gpu_bench_old && chmod +x $G/bin/gpu_bench_old
GPU_BENCH_DECODE_BATCHES="1 64" st decode_old 45 $G/bin/gpu_bench_old decode; tab decode_old
st baseline 40 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
PD_GPU_TEST_W8WG=1 st kw8 100 $G/bin/test_gpu_kernels; cases kw8
GPU_BENCH_W8WG_N=64 st bw8 60 $G/bin/gpu_bench w8wg; tab bw8
st kernels 220 $G/bin/test_gpu_kernels; cases kernels
PD_GPU_TEST_W4WG=1 PD_GPU_TEST_SMALL=1 st mcw4 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcw4
PD_CUDA_W4WG_CLUSTER=1 GPU_BENCH_STEPPROF=decode st prof 70 $G/bin/gpu_bench stepprof; tab prof
st ncu 45 ncu --clock-control none --kernel-name regex:w4wg --launch-count 6 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats -f -o $L/w4 env GPU_BENCH_W4MMA_ONCE=1 GPU_BENCH_W4MMA_N=64 $G/bin/gpu_bench w4wg
st ncudet 20 ncu -i $L/w4.ncu-rep --page details; grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Compute \(SM\) Thr|Warp Cycles Per Issued|No Eligible" $L/ncudet.log | head -60
round_end
