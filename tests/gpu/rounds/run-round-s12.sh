#!/usr/bin/env bash
# Session 12, call 1: where the decode step's time goes on the critical path (stepprof's new
# "critical" column: how far each kernel moved the step's end), the split-merge choices at batch 1
# (PD_CUDA_ATTN_FOLD=1: the last split block merges; GPU_BENCH_ATTN_TARGET: fewer splits), and the
# prefill status (no prefill change since session 9: `gpu_bench prefill`, its stepprof, PyTorch).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s12.sh
#   DEADLINE=480 bash .gpu-round/run-round-s12.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=480
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
GPU_BENCH_DECODE_BATCHES="1 64" st decode 60 $G/bin/gpu_bench decode; tab decode
PD_CUDA_ATTN_FOLD=1 GPU_BENCH_DECODE_BATCHES="1 64" st decode_fold 60 $G/bin/gpu_bench decode; tab decode_fold
GPU_BENCH_ATTN_TARGET=132 GPU_BENCH_DECODE_BATCHES="1" st decode_t132 40 $G/bin/gpu_bench decode; tab decode_t132
GPU_BENCH_ATTN_TARGET=264 GPU_BENCH_DECODE_BATCHES="1" st decode_t264 40 $G/bin/gpu_bench decode; tab decode_t264
GPU_BENCH_STEPPROF=decode st stepprof 90 $G/bin/gpu_bench stepprof; tab stepprof
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
st prefill 90 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
GPU_BENCH_STEPPROF=prefill st stepprof_prefill 90 $G/bin/gpu_bench stepprof; tab stepprof_prefill | head -60
st baseline_prefill 120 python3 $G/torch_prefill_baseline.py; tail -20 $L/baseline_prefill.log
round_end
