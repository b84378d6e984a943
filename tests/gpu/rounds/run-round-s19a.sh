#!/usr/bin/env bash
# Session 19, call 1: the INT4 wgmma GEMM (matmul_w4wg) with its stages handed back late
# (configuration 3, PD_CUDA_W4WG_LAZY=1): a consumer warp no longer drains its wgmma at each stage
# end, so the two warpgroups stop dequantizing their next first tile together with the tensor
# cores idle (session 10's ncu at n 64: 61% of cycles with no eligible warp); and configuration
# 4 (PD_CUDA_W4WG_LAZY=2): the same block on four consumer warpgroups of 64 rows with half-group
# A buffers, so more warpgroups queue wgmma while one dequantizes. The w4wg harness
# cases (cfg 3 and 4 forced, the plans with LAZY=2) and memcheck on them; `gpu_bench w4wg` at n 64
# and the decode step at batch 1 / 32 / 64 with LAZY 0 / 1 / 2; ncu (speed of light, warp states,
# compute workload incl. the tensor pipe) of the four 8B shapes at n 64 both ways; stepprof of
# the decode steps with LAZY=1; the PyTorch decode baseline in the same call. Also the batch-1
# step with 8 and 1 attention splits (GPU_BENCH_ATTN_TARGET=64 / 8) against the default 16.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s19a.sh
#   DEADLINE=540 bash .gpu-round/run-round-s19a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_CUDA_W4WG_LAZY=2 PD_GPU_TEST_W4WG=1 st kw4 90 $G/bin/test_gpu_kernels; cases kw4; grep -E "lazy" $L/kw4.log | head -8
for z in 0 1 2; do PD_CUDA_W4WG_LAZY=$z GPU_BENCH_W4MMA_N=64 st w4wg_z$z 40 $G/bin/gpu_bench w4wg; tab w4wg_z$z; done
for z in 0 1 2; do PD_CUDA_W4WG_LAZY=$z GPU_BENCH_DECODE_BATCHES="1 32 64" st decode_z$z 60 $G/bin/gpu_bench decode; tab decode_z$z; done
# batch 1 / 1k: 16 attention splits (target 528, the default) against 8 (target 64) and 1 (no merge
# launch; target 8)
for tg in 8 64; do GPU_BENCH_ATTN_TARGET=$tg GPU_BENCH_DECODE_BATCHES=1 st decode_t$tg 40 $G/bin/gpu_bench decode; tab decode_t$tg; done
for z in 0 1 2; do
  st ncu_z$z 60 ncu --clock-control none --kernel-name regex:w4wg --launch-count 4 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy -f -o $L/w4_z$z env PD_CUDA_W4WG_LAZY=$z GPU_BENCH_W4MMA_ONCE=1 GPU_BENCH_W4MMA_N=64 $G/bin/gpu_bench w4wg
  st ncudet_z$z 30 ncu -i $L/w4_z$z.ncu-rep --page details; grep -E "matmul__w4wg|Duration|DRAM Throughput|Compute \(SM\) Thr|Warp Cycles Per Issued|No Eligible|Grid Size|Registers Per" $L/ncudet_z$z.log | head -44
  st ncuraw_z$z 30 ncu -i $L/w4_z$z.ncu-rep --page raw --csv
  python3 -c 'import csv,sys
r=list(csv.reader(open(sys.argv[1])))
h=r[0]
for x in r[2:]:
  print(x[h.index("Kernel Name")][:32], *["%s=%s" % (h[i], x[i]) for i in range(len(h)) if "tensor" in h[i] or h[i].startswith("gpu__time_duration.sum")])' $L/ncuraw_z$z.log | head -8
done
PD_CUDA_W4WG_LAZY=1 GPU_BENCH_STEPPROF=decode st stepprof 90 $G/bin/gpu_bench stepprof; tab stepprof | head -60
PD_CUDA_W4WG_LAZY=1 PD_GPU_TEST_W4WG=1 PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
round_end
