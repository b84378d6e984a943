#!/usr/bin/env bash
# Session 9's third round: the decode attention at batch 64 (issue 11: BF16 KV 116 us per layer
# in the FP8 batch-64 step, 1.3 waves of 3 blocks per SM) by split target (`gpu_bench attnsplit`)
# and under ncu (`gpu_bench attnprof`: one launch each of fp8 / bf16 at B 64 / 1k and B 1 / 32k),
# then the full-size harness (session 9's new W4A8 blk cases at 8B shapes).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s9c.sh
#   DEADLINE=520 bash .gpu-round/run-round-s9c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=520
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
st attnsplit 90 $G/bin/gpu_bench attnsplit; grep -E "^\||target" $L/attnsplit.log
st ncu_attn 120 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:attention__tc_kernel|attention__merge" --launch-count 8 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats $G/bin/gpu_bench attnprof
grep -E "attention__|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Waves Per SM|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall|Grid Size" $L/ncu_attn.log | head -120
st kernels 300 $G/bin/test_gpu_kernels; cases kernels; grep -E "blk|seed 24[2-6]" $L/kernels.log | grep -v PASS | head
round_end
