#!/usr/bin/env bash
# Session 17, call 1: where the FP8-KV decode attention's time goes at batch 64 / context 1k (ncu
# per-instruction stall samples of attention__tc_kernel<fp8, 128>, the first launch of `gpu_bench
# attnprof`), for the tree before session 17 (gpu_bench_old: HEAD 4cd9324's binary, carried as
# .gpu-round/gpu_bench_old.xz) and after it (a 16-token tile's page looked up once, not per
# 16-byte chunk; two mma chains for S), with `gpu_bench attn` for both; then session 16's unrun call s16c (the tiled MLA kernel checked and timed), then, on
# an H200 only, the decode step and the PyTorch baseline (the targets' machine; the last H200
# figures are session 12's).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s17a.sh
#   DEADLINE=520 bash .gpu-round/run-round-s17a.sh   (carry .gpu-round, .gpu-models/glm-dsv3.tar.xz)
set -uo pipefail
ROUND_DEADLINE=520
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
xz -dc $F/gpu_bench_old.xz > $G/bin/gpu_bench_old && chmod +x $G/bin/gpu_bench_old
for b in gpu_bench_old gpu_bench; do st attn_$b 40 $G/bin/$b attn; tab attn_$b; done
ATT="--clock-control none --kernel-name regex:attention__tc_kernel --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis"
for b in gpu_bench_old gpu_bench; do
  st ncu_$b 90 ncu $ATT -f -o $L/att_$b $G/bin/$b attnprof
  st ncudet_$b 60 ncu -i $L/att_$b.ncu-rep --page details; grep -E "Duration|DRAM Through|Warp Cycles|Registers|Achieved Occ|Theoretical Occ|Block Limit|Executed Ipc|Issue Slots|Executed Instructions " $L/ncudet_$b.log | head -24
  st ncupage_$b 60 ncu -i $L/att_$b.ncu-rep --page source --csv --print-source sass; wc -l $L/ncupage_$b.log
done
PD_GPU_TEST_FAMILY=1 st kfam 90 $G/bin/test_gpu_kernels; cases kfam; grep -E "latent_attn" $L/kfam.log | head -20
PD_GPU_TEST_FAMILY=1 PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
for t in 0 1; do PD_CUDA_MLA_TILE=$t PD_BENCH_FAMILY_PREFILL=0 st family_t$t 60 $G/bin/gpu_bench family; tab family_t$t; done
for t in 0 1; do PD_CUDA_MLA_TILE=$t GPU_BENCH_FAMILY_PROF=1 st famprof_t$t 60 $G/bin/gpu_bench family; tab famprof_t$t | head -40; done
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  GPU_BENCH_DECODE_BATCHES="1 64" st decode 60 $G/bin/gpu_bench decode; tab decode
  st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
fi
round_end
