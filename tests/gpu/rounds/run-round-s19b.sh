#!/usr/bin/env bash
# Session 19, call 2 (s19a cut to the device time left after a run of refused starts): the INT4
# wgmma GEMM with configuration 3 (PD_CUDA_W4WG_LAZY=1) against configuration 0, most telling
# first: `gpu_bench w4wg` at n 64, the decode step at batch 64 (and 1), the w4wg harness cases
# with LAZY=1, then ncu of the four 8B shapes at n 64 both ways.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s19b.sh
#   DEADLINE=240 bash .gpu-round/run-round-s19b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=240
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for z in 0 1 2; do PD_CUDA_W4WG_LAZY=$z GPU_BENCH_W4MMA_N=64 st w4wg_z$z 30 $G/bin/gpu_bench w4wg; tab w4wg_z$z; done
for z in 0 1 2; do PD_CUDA_W4WG_LAZY=$z GPU_BENCH_DECODE_BATCHES="64 1" st decode_z$z 45 $G/bin/gpu_bench decode; tab decode_z$z; done
PD_CUDA_W4WG_LAZY=1 PD_GPU_TEST_W4WG=1 st kw4 60 $G/bin/test_gpu_kernels; cases kw4; grep -E "lazy" $L/kw4.log | head -8
for z in 1 2 0; do
  st ncu_z$z 40 ncu --clock-control none --kernel-name regex:w4wg --launch-count 4 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis -f -o $L/w4_z$z env PD_CUDA_W4WG_LAZY=$z GPU_BENCH_W4MMA_ONCE=1 GPU_BENCH_W4MMA_N=64 $G/bin/gpu_bench w4wg
  st ncudet_z$z 20 ncu -i $L/w4_z$z.ncu-rep --page details; grep -E "matmul__w4wg|Duration|DRAM Throughput|Compute \(SM\) Thr|Warp Cycles Per Issued|No Eligible|Executed Ipc A" $L/ncudet_z$z.log | head -36
done
round_end
