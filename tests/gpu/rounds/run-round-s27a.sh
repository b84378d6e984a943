#!/usr/bin/env bash
# Session 27's second round (prepared, not run: the session's device budget went to failed
# starts; for session 28's first call). The INT4 K-split GEMV's route bits were split in session
# 27 (bit 0 n 1, bit 3 n 2..4, bit 2 n 5..8, bit 1 the q, k, v group) after s26c measured it
# slower than the slice GEMV at batch 1 and faster at batch 4; this round decides whether mask 14
# (n 2..8 with the group) becomes the default: the gates with PD_CUDA_INT4_KSPLIT=14 exported
# (they run pdctl, which reads it at backend creation), the K-split cases (route 15) and their
# memcheck, the INT4 step at batches 2 / 4 / 8 with masks 0 / 14 / 10 / 6 alternating and with
# the group scale after the products (PD_CUDA_INT4_KSPLIT_POST=1, session 27, also at batch 1), the
# default table against PyTorch (ideally on an H200: the status tables' card; the FP8 K-split
# default of session 26 has not run on one yet), the prefill table on an H200, the harness.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s27a.sh
#   DEADLINE=500 bash .gpu-round/run-round-s27a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=500
. "$(dirname "$0")/round-lib.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
export PD_CUDA_INT4_KSPLIT=14
gates_start 150
PD_GPU_TEST_KSPLIT=1 PD_GPU_TEST_SMALL=1 st kks 60 $G/bin/test_gpu_kernels; cases kks
PD_GPU_TEST_KSPLIT=1 PD_GPU_TEST_SMALL=1 st kks_mc 100 compute-sanitizer --tool memcheck $G/bin/test_gpu_kernels; cases kks_mc
gates_end
unset PD_CUDA_INT4_KSPLIT
export GPU_BENCH_DECODE_ONLY=int4 GPU_BENCH_DECODE_BATCHES="2 4 8"
st i0 40 $G/bin/gpu_bench decode; tab i0
PD_CUDA_INT4_KSPLIT=14 st i14 40 $G/bin/gpu_bench decode; tab i14
PD_CUDA_INT4_KSPLIT=10 st i10 40 $G/bin/gpu_bench decode; tab i10
PD_CUDA_INT4_KSPLIT=6 st i6 40 $G/bin/gpu_bench decode; tab i6
st i0b 40 $G/bin/gpu_bench decode; tab i0b
PD_CUDA_INT4_KSPLIT=14 PD_CUDA_INT4_KSPLIT_POST=1 st i14p 40 $G/bin/gpu_bench decode; tab i14p
PD_CUDA_INT4_KSPLIT=14 PD_CUDA_INT4_KSPLIT_U=4 st i14u4 40 $G/bin/gpu_bench decode; tab i14u4
PD_CUDA_INT4_KSPLIT=14 st i14b 40 $G/bin/gpu_bench decode; tab i14b
export GPU_BENCH_DECODE_BATCHES=1
st b0 30 $G/bin/gpu_bench decode; tab b0
PD_CUDA_INT4_KSPLIT=15 PD_CUDA_INT4_KSPLIT_POST=1 st b15p 30 $G/bin/gpu_bench decode; tab b15p
PD_CUDA_INT4_KSPLIT=15 st b15 30 $G/bin/gpu_bench decode; tab b15
unset GPU_BENCH_DECODE_ONLY
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 45 $G/bin/gpu_bench decode; tab decode
st baseline 45 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
unset GPU_BENCH_DECODE_BATCHES
case "$card" in *H200*)
  st prefill 60 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
  st baseline_prefill 60 python3 $G/torch_prefill_baseline.py; tail -12 $L/baseline_prefill.log ;;
esac
PD_CUDA_INT4_KSPLIT=14 st kernels 300 $G/bin/test_gpu_kernels; cases kernels
round_end
