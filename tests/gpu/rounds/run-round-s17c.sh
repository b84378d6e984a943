#!/usr/bin/env bash
# Session 17, call 3: the correctness gates after session 17's defaults changed (the tiled MLA
# kernel for DeepSeek-V3; the decode attention's per-tile page lookup and two S chains): the
# flash and decode-attention harness subsets in full (s17b's full harness hit its time limit),
# greedy ids against transformers and the perplexity gate on tiny-llama and tiny-dsv3; then ncu of
# flash v5 against v10 (the TMA producer, measured slower in s17b) at 8192 causal.
# The fixture archive carried holds tiny-llama and tiny-dsv3 only (named llama-moe.tar.xz so that
# round-lib.sh unpacks it; 64 MiB limit):
#   tar -cf - deploy/models/tiny-llama deploy/models/tiny-dsv3 | xz -6 > .gpu-models/llama-moe.tar.xz
#   DEADLINE=230 bash .gpu-round/run-round-s17c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=230
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
fx="tiny-llama tiny-dsv3"
st greedy 90 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --only $fx --jobs 6 > $L/greedy.st &
st ppl 90 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only $fx --jobs 4 > $L/ppl.st &
PD_GPU_TEST_ATTN=1 st kattn 60 $G/bin/test_gpu_kernels; cases kattn
wait
for s in greedy ppl; do cat $L/$s.st; grep -qE "^=== $s: rc 0," $L/$s.st || rc=1; done
tail -8 $L/greedy.log; tail -8 $L/ppl.log
PD_GPU_TEST_FLASH=1 st kflash 80 $G/bin/test_gpu_kernels; cases kflash; grep -E "8B .*flash v(5|10|12) " $L/kflash.log | head -8
SEC="--clock-control none --kernel-name regex:fwg__kernel --launch-count 1 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats"
for v in 5 10; do PD_GPU_FLASH_LIST="$v" st ncu_v$v 40 ncu $SEC $G/bin/gpu_bench flash; grep -E "Duration|Throughput|Warp Cycles Per Issued|Registers Per|Issue Slots|L2 Hit|L1/TEX Hit" $L/ncu_v$v.log | head -12; done
round_end
