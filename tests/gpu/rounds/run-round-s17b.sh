#!/usr/bin/env bash
# Session 17, call 2: (1) the decode attention with its page ids read one tile ahead (s17a's ncu
# put 23% of the stall samples on that load), A / B against HEAD 4cd9324's binary (gpu_bench_old,
# carried as .gpu-round/gpu_bench_old.xz): `gpu_bench attn`, the whole decode step, ncu source;
# (2) flash variants 10..12 (a TMA producer: one thread copies each 128-key tile as 64-dim x
# P-token boxes of a 5-d tensor map over the KV pages; 11: 2 stages; 12: + v8's overlapped
# consumer) checked in the harness (whose flash cases now poison the tokens past each context and
# run pages of 8 / 32 tokens too) and under memcheck, timed against v5 (`gpu_bench flash`) and in
# the 8192-token prefill; (3) the PyTorch baselines of both, same call.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s17b.sh
#   DEADLINE=540 bash .gpu-round/run-round-s17b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
xz -dc $F/gpu_bench_old.xz > $G/bin/gpu_bench_old && chmod +x $G/bin/gpu_bench_old
st kern 120 $G/bin/test_gpu_kernels; cases kern; grep -E "flash v1[0-2]|page (8|32)" $L/kern.log | head -40
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
for b in gpu_bench_old gpu_bench; do st attn_$b 40 $G/bin/$b attn; tab attn_$b | head -8; done
PD_GPU_FLASH_LIST="5 10 11 12" st flash 60 $G/bin/gpu_bench flash; tab flash
st prefill 90 $G/bin/gpu_bench prefill; grep -E "^prefill" $L/prefill.log
for v in 10 12; do PD_CUDA_FLASH_VARIANT=$v PD_BENCH_PREFILL_QUICK=1 st prefill_v$v 40 $G/bin/gpu_bench prefill; grep -E "^prefill" $L/prefill_v$v.log; done
st baseline_prefill 100 python3 $G/torch_prefill_baseline.py; grep "prefill_" $L/baseline_prefill.log | tail -3
for b in gpu_bench_old gpu_bench; do GPU_BENCH_DECODE_BATCHES="1 64" st decode_$b 60 $G/bin/$b decode; tab decode_$b; done
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -3
ATT="--clock-control none --kernel-name regex:attention__tc_kernel --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters --section LaunchStats"
st ncu_attn 60 ncu $ATT -f -o $L/att $G/bin/gpu_bench attnprof
st ncupage 30 ncu -i $L/att.ncu-rep --page source --csv --print-source sass; wc -l $L/ncupage.log
st ncudet 30 ncu -i $L/att.ncu-rep --page details; grep -E "Duration|DRAM Through|Warp Cycles Per Issued" $L/ncudet.log
round_end
