#!/usr/bin/env bash
# Session 14, call 1: the decode layer's small ops folded into the slice GEMV (backend.h
# matmul_fused): add + RMSNorm in the prologue of q / k / v and gate_up, SiLU·mul in gate_up's
# epilogue (gate and up tiles paired in one block), the residual adds in the o and down
# epilogues. PD_CUDA_GEMV_FUSE=0: the plain ops; =1 without the SiLU·mul epilogue; =3 SiLU·mul
# in down's prologue instead (session 11's slower idea); default 2. The fused harness cases at
# full size and under memcheck, decode at batch 1 / 2 / 4 / 64 at 2 and 0 (1 and 3 at batch 1 /
# 4), batch 1 with fewer attention splits (GPU_BENCH_ATTN_TARGET 8 / 32 / 64: 1 / 4 / 8 splits
# at 1k instead of 16, the first without a merge launch), stepprof, the PyTorch decode baseline.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s14a.sh
#   DEADLINE=540 bash .gpu-round/run-round-s14a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_FUSED=1 st kfused 60 $G/bin/test_gpu_kernels; cases kfused; grep -E "mm fused|decode_fuse" $L/kfused.log | head -40
PD_GPU_TEST_FUSED=1 PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
GPU_BENCH_DECODE_BATCHES="1 2 4 64" st decode 60 $G/bin/gpu_bench decode; tab decode
PD_CUDA_GEMV_FUSE=0 GPU_BENCH_DECODE_BATCHES="1 2 4 64" st decode_nofuse 60 $G/bin/gpu_bench decode; tab decode_nofuse
for f in 1 3; do PD_CUDA_GEMV_FUSE=$f GPU_BENCH_DECODE_BATCHES="1 4" st decode_fuse$f 40 $G/bin/gpu_bench decode; tab decode_fuse$f; done
for t in 8 32 64; do GPU_BENCH_ATTN_TARGET=$t GPU_BENCH_DECODE_BATCHES="1" st decode_t$t 30 $G/bin/gpu_bench decode; tab decode_t$t; done
GPU_BENCH_STEPPROF=decode st stepprof 90 $G/bin/gpu_bench stepprof; tab stepprof
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
round_end
