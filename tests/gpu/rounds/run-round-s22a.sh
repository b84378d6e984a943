#!/usr/bin/env bash
# Session 22's first call: thread-block clusters in place of second launches. In order: the
# matmul_w4wg cases (K splits added inside clusters: forced plans of 2..8 blocks, plans at the 8B
# shapes, the same bits as the partial sums' launch, the grouped q / k / v, the whole INT4
# decode step with option w4wg_cluster on against off); the decode attention cases (every case
# also with attention_cluster: split contexts merged inside clusters); `gpu_bench w4wg` at n 64;
# the decode step at batch 1 / 64: this tree with both off (c0), w4wg clusters (c1), both (c2),
# and HEAD e59e451's gpu_bench (decode_old: before session 22; against c0 it measures the
# SiLU·mul image kernel's loads first and the RMSNorm row kept in shared memory); the PyTorch
# baseline; `gpu_bench attn` with PD_CUDA_ATTN_CLUSTER=0 / 1; the matmul_w8wg cases (its epilogue
# now kutil_cluster_sum) and `gpu_bench w8wg` at n 64; the whole kernel harness (not run since
# session 20); memcheck of the w4wg and attention cases; stepprof with both on; ncu of w4wg.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s22a.sh
#   xz -c OLD/tests/gpu_bench > .gpu-round/gpu_bench_old.xz   (HEAD e59e451's build, -Dcuda-arch=90a)
#   DEADLINE=560 bash .gpu-round/run-round-s22a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W4WG=1 st kw4 120 $G/bin/test_gpu_kernels; cases kw4; grep -E "cluster|decode_w4cl" $L/kw4.log | head -40
PD_GPU_TEST_ATTN=1 st kattn 100 $G/bin/test_gpu_kernels; cases kattn
GPU_BENCH_W4MMA_N=64 st bw4 60 $G/bin/gpu_bench w4wg; tab bw4
export GPU_BENCH_DECODE_BATCHES="1 64"
PD_CUDA_W4WG_CLUSTER=0 PD_CUDA_ATTN_CLUSTER=0 st decode_c0 45 $G/bin/gpu_bench decode; tab decode_c0
PD_CUDA_W4WG_CLUSTER=1 PD_CUDA_ATTN_CLUSTER=0 st decode_c1 45 $G/bin/gpu_bench decode; tab decode_c1
PD_CUDA_W4WG_CLUSTER=1 PD_CUDA_ATTN_CLUSTER=1 st decode_c2 45 $G/bin/gpu_bench decode; tab decode_c2
[ -f $F/gpu_bench_old.xz ] && xz -dc $F/gpu_bench_old.xz > $G/bin/gpu_bench_old && chmod +x $G/bin/gpu_bench_old
st decode_old 45 $G/bin/gpu_bench_old decode; tab decode_old
unset GPU_BENCH_DECODE_BATCHES
st baseline 40 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
for c in 0 1; do PD_CUDA_ATTN_CLUSTER=$c st attn_c$c 30 $G/bin/gpu_bench attn; tab attn_c$c; done
PD_GPU_TEST_W8WG=1 st kw8 60 $G/bin/test_gpu_kernels; cases kw8
GPU_BENCH_W8WG_N=64 st bw8 40 $G/bin/gpu_bench w8wg; tab bw8
st kernels 220 $G/bin/test_gpu_kernels; cases kernels
PD_GPU_TEST_W4WG=1 PD_GPU_TEST_SMALL=1 st mcw4 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcw4
PD_GPU_TEST_ATTN=1 PD_GPU_TEST_SMALL=1 st mcattn 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcattn
PD_CUDA_W4WG_CLUSTER=1 PD_CUDA_ATTN_CLUSTER=1 GPU_BENCH_STEPPROF=decode st prof 70 $G/bin/gpu_bench stepprof; tab prof
st ncu 45 ncu --clock-control none --kernel-name regex:w4wg --launch-count 6 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats -f -o $L/w4 env GPU_BENCH_W4MMA_ONCE=1 GPU_BENCH_W4MMA_N=64 $G/bin/gpu_bench w4wg
st ncudet 20 ncu -i $L/w4.ncu-rep --page details; grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Compute \(SM\) Thr|Warp Cycles Per Issued|No Eligible" $L/ncudet.log | head -60
round_end
