#!/usr/bin/env bash
# Session 28's second round (prepared; not run in session 28: its device budget went to failed
# starts). The new INT4 K-split defaults chosen from call s28a (route 14 with bit 0 now n 1..2, bit
# 3 n 3..4: the K-split GEMV at n 3..8 with the q, k, v group; the group scale after the
# products) and the 16-warp blocks for launches of few row blocks (PD_CUDA_INT4_KSPLIT_WIDE=1,
# session 28, unmeasured) and the rolled reloads (PD_CUDA_INT4_KSPLIT_ROLL=1, session 28,
# unmeasured) and the fused ops' f16 rows for it (PD_CUDA_KS_ACT=1, session 28, unmeasured):
# the K-split cases (the wide, rolled and f16-row ones among them; decode steps at n 1 / 3 / 4 /
# 8) and their memcheck, the INT4 step at batches 1..8 with the defaults, with the K-split
# off, with the wide blocks, the rolled reloads, both, and the f16 rows (alternating, twice, same
# call), batches 1 / 2 with every route on (plain, then wide and rolled), the op table `gpu_bench
# ksplit`, the default table (on an H200 also PyTorch's step and the prefill table), then the
# whole harness on the defaults until the deadline.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s28b.sh
#   DEADLINE=480 bash .gpu-round/run-round-s28b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=480
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_KSPLIT=1 PD_GPU_TEST_SMALL=1 st kks 60 $G/bin/test_gpu_kernels; cases kks
grep -E "decode_i4ksplit" $L/kks.log
PD_GPU_TEST_KSPLIT=1 PD_GPU_TEST_SMALL=1 st kks_mc 100 compute-sanitizer --tool memcheck $G/bin/test_gpu_kernels; cases kks_mc
export GPU_BENCH_DECODE_ONLY=int4 GPU_BENCH_DECODE_BATCHES="1 2 3 4 8"
for r in 1 2; do # alternating: defaults, K-split off, wide blocks, rolled reloads, both, f16 rows
  st d_def$r 40 $G/bin/gpu_bench decode; tab d_def$r
  PD_CUDA_INT4_KSPLIT=0 st d_off$r 40 $G/bin/gpu_bench decode; tab d_off$r
  PD_CUDA_INT4_KSPLIT_WIDE=1 st d_wide$r 40 $G/bin/gpu_bench decode; tab d_wide$r
  PD_CUDA_INT4_KSPLIT_ROLL=1 st d_roll$r 40 $G/bin/gpu_bench decode; tab d_roll$r
  PD_CUDA_INT4_KSPLIT_WIDE=1 PD_CUDA_INT4_KSPLIT_ROLL=1 st d_wr$r 40 $G/bin/gpu_bench decode; tab d_wr$r
  PD_CUDA_KS_ACT=1 st d_ksact$r 40 $G/bin/gpu_bench decode; tab d_ksact$r
done
export GPU_BENCH_DECODE_BATCHES="1 2"
PD_CUDA_INT4_KSPLIT=15 st d_all 30 $G/bin/gpu_bench decode; tab d_all
PD_CUDA_INT4_KSPLIT=15 PD_CUDA_INT4_KSPLIT_WIDE=1 PD_CUDA_INT4_KSPLIT_ROLL=1 st d_all_wr 30 $G/bin/gpu_bench decode; tab d_all_wr
unset GPU_BENCH_DECODE_ONLY
st ksplit 60 $G/bin/gpu_bench ksplit; tab ksplit
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 45 $G/bin/gpu_bench decode; tab decode
unset GPU_BENCH_DECODE_BATCHES
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in *H200*)
  st baseline 45 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
  st prefill 60 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
  st baseline_prefill 60 python3 $G/torch_prefill_baseline.py; tail -12 $L/baseline_prefill.log ;;
esac
st kernels 300 $G/bin/test_gpu_kernels; cases kernels; grep -c PASS $L/kernels.log
round_end
