#!/usr/bin/env bash
# Session 25, call 2: the new default bf16-KV attention variant (attention_tc_bf16 = 1: blocks of
# 3 warps, 4 per SM; call s25a measured it on an H100) on this machine: the greedy / perplexity
# gates with it, the attention harness (each variant, and attention_splits' new `waves` policy
# where it picks another count), the decode step against PyTorch in the same call, the A / B
# against variant 0, ncu of both at batch 64 / 1k; the split policy (PD_CUDA_ATTN_SPLITS=waves:
# no more blocks than one wave where the ceil count overshoots, e.g. batch 16 x 8 KV heads at 1k
# 5 -> 4 splits) in gpu_bench attn and the decode step at batch 8 / 16 / 32; memcheck.
# Also the f32 SiLU·mul + FP8 kernel with every load first (the FP8 batch-1 step's 6.65 us per
# layer), A / B against gpu_bench_old (f413273's gpu_bench, the same tree but that kernel,
# carried xz-compressed in .gpu-round/), and PD_CUDA_ATTN_FOLD=1 at batch 1 / 1k (16 splits).
#   xz -c <f413273's b/bin/gpu_bench> > .gpu-round/gpu_bench_old.xz
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s25b.sh
#   DEADLINE=540 bash .gpu-round/run-round-s25b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
xz -dc $F/gpu_bench_old.xz > $G/bin/gpu_bench_old && chmod +x $G/bin/gpu_bench_old || rc=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
fx="tiny-llama tiny-moe"
st greedy 140 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --only $fx --jobs 6 > $L/greedy.st &
st ppl 140 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only $fx --jobs 4 > $L/ppl.st &
PD_GPU_TEST_ATTN=1 st katt 130 $G/bin/test_gpu_kernels; cases katt; grep -E "split policy|decode_abf16" $L/katt.log | head -40
PD_GPU_TEST_SILU=1 st ksilu 30 $G/bin/test_gpu_kernels; cases ksilu
wait
for s in greedy ppl; do cat $L/$s.st; grep -qE "^=== $s: rc 0," $L/$s.st || rc=1; done
tail -8 $L/greedy.log; tail -8 $L/ppl.log
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 45 $G/bin/gpu_bench decode; tab decode
GPU_BENCH_DECODE_ONLY=fp8 PD_CUDA_ATTN_BF16=0 st decode_a0 30 $G/bin/gpu_bench decode; tab decode_a0
st baseline 45 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
export GPU_BENCH_DECODE_BATCHES="1"
for i in 1 2; do
  GPU_BENCH_DECODE_ONLY=fp8 st d1old_$i 25 $G/bin/gpu_bench_old decode; tab d1old_$i
  GPU_BENCH_DECODE_ONLY=fp8 st d1new_$i 25 $G/bin/gpu_bench decode; tab d1new_$i
done
PD_CUDA_ATTN_FOLD=1 st d1fold 40 $G/bin/gpu_bench decode; tab d1fold
export GPU_BENCH_DECODE_BATCHES="8 16 32"
st decode_mid 45 $G/bin/gpu_bench decode; tab decode_mid
PD_CUDA_ATTN_SPLITS=waves st decode_midw 45 $G/bin/gpu_bench decode; tab decode_midw
unset GPU_BENCH_DECODE_BATCHES
st attn 40 $G/bin/gpu_bench attn; tab attn
PD_CUDA_ATTN_SPLITS=waves st attnw 40 $G/bin/gpu_bench attn; tab attnw
ATT="--clock-control none --kernel-name regex:attention__tc_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis"
for v in 1 0; do
  PD_CUDA_ATTN_BF16=$v st ncu_a$v 60 ncu $ATT $G/bin/gpu_bench attnprof
  grep -E "attention__tc|Duration|DRAM Through|Memory Throughput|Warp Cycles Per Issued|Registers Per|Achieved Occ|Theoretical Occ|Block Limit|Executed Ipc A|Issue Slots Busy|Stall" $L/ncu_a$v.log | head -30
done
PD_GPU_TEST_ATTN=1 PD_GPU_TEST_SMALL=1 st mcatt 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcatt
round_end
