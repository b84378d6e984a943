#!/usr/bin/env bash
# Session 9's sixth round: the split merge rewritten with 4 thread groups per dimension (s9e's
# one-group staging measured slower under ncu: 28.8 against the old kernel's 21.3 us at batch 1 /
# 32k) and the bf16 batch-64 split from 4k context only (s9e: at 1k the step lost 0.1 ms). The
# attention cases and the harness at fixture shapes under memcheck, the merge under the same ncu
# command, the attention table and the whole decode steps.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s9f.sh
#   DEADLINE=250 bash .gpu-round/run-round-s9f.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=250
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_ATTN=1 st kattn 90 $G/bin/test_gpu_kernels; cases kattn
PD_GPU_TEST_SMALL=1 st memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st ncu_merge 40 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:attention__merge" --launch-count 2 --section SpeedOfLight --section LaunchStats --section WarpStateStats $G/bin/gpu_bench attnprof
grep -E "attention__|Duration|Memory Throughput|Warp Cycles Per Issued|Grid Size" $L/ncu_merge.log | head -20
st attn 30 $G/bin/gpu_bench attn; tab attn
GPU_BENCH_DECODE_BATCHES="1 64" st decode 45 $G/bin/gpu_bench decode; tab decode
round_end
