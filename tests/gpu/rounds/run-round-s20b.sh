#!/usr/bin/env bash
# Session 20, one call for what s19a and s20a hold (device starts kept failing): the batch-64
# INT4 GEMM's configurations 3 and 4 (PD_CUDA_W4WG_LAZY=1 / 2) against configuration 0 (`gpu_bench
# w4wg` at n 64, the decode step at batch 1 / 64, whose top-p column now runs session 20's
# sampler), the whole kernel harness (every family, incl. the w4wg cases with configurations 3
# and 4 forced, the new sampler cases, every launcher on the per-device shared-memory attribute),
# the PyTorch decode baseline, then ncu of the n-64 GEMMs and stepprof as time allows.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s20b.sh
#   DEADLINE=540 bash .gpu-round/run-round-s20b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for z in 0 1 2; do PD_CUDA_W4WG_LAZY=$z GPU_BENCH_W4MMA_N=64 st w4wg_z$z 35 $G/bin/gpu_bench w4wg; tab w4wg_z$z; done
for z in 0 1 2; do PD_CUDA_W4WG_LAZY=$z GPU_BENCH_DECODE_BATCHES="1 64" st decode_z$z 50 $G/bin/gpu_bench decode; tab decode_z$z; done
st kernels 200 $G/bin/test_gpu_kernels; cases kernels; grep -E "sample|lazy" $L/kernels.log | head -30
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
for z in 1 2 0; do
  st ncu_z$z 45 ncu --clock-control none --kernel-name regex:w4wg --launch-count 4 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis -f -o $L/w4_z$z env PD_CUDA_W4WG_LAZY=$z GPU_BENCH_W4MMA_ONCE=1 GPU_BENCH_W4MMA_N=64 $G/bin/gpu_bench w4wg
  st ncudet_z$z 20 ncu -i $L/w4_z$z.ncu-rep --page details; grep -E "matmul__w4wg|Duration|DRAM Throughput|Compute \(SM\) Thr|Warp Cycles Per Issued|No Eligible|Executed Ipc A" $L/ncudet_z$z.log | head -36
done
round_end
