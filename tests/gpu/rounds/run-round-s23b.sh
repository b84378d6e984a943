#!/usr/bin/env bash
# Session 23's first call (s23a, written in session 22, never ran: no machine came; its steps are
# here, after the new option l2_prefetch's). In order of need: option l2_prefetch's cases
# (prefetch_l2 bounds, the decode step on / off must give the same logits) and the decode step
# at batch 1 / 64 by default and with PD_CUDA_L2PF=16 / 8 / 32 (MiB of the next matmul's
# weights prefetched into L2 beside the small ops), and 32 shared by the next two ops
# (PD_CUDA_L2PF_DEPTH=2); then session 22's unmeasured FP8 work:
# matmul_fp8_mma's K splits in clusters and its q / k / v group (harness PD_GPU_TEST_FP8CL=1,
# decode with PD_CUDA_FP8_CLUSTER=1, + PD_CUDA_FP8_GROUP=1); the PyTorch baseline; batch 1 with
# 8 attention splits (GPU_BENCH_ATTN_TARGET=64); w8wg on the 4096-row weights only; memcheck of
# both case sets; stepprof with the prefetch on; the whole harness at full size with what is left.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s23b.sh
#   DEADLINE=560 bash .gpu-round/run-round-s23b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_L2PF=1 st kl2 40 $G/bin/test_gpu_kernels; cases kl2; grep -E "l2pf|prefetch" $L/kl2.log
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 40 $G/bin/gpu_bench decode; tab decode
for mb in 16 8 32; do PD_CUDA_L2PF=$mb st decode_pf$mb 40 $G/bin/gpu_bench decode; tab decode_pf$mb; done
PD_CUDA_L2PF=32 PD_CUDA_L2PF_DEPTH=2 st decode_pf32d2 40 $G/bin/gpu_bench decode; tab decode_pf32d2
PD_GPU_TEST_FP8CL=1 st kf8 60 $G/bin/test_gpu_kernels; cases kf8; grep -E "cluster" $L/kf8.log | head -30
PD_CUDA_FP8_CLUSTER=1 st decode_f8cl 40 $G/bin/gpu_bench decode; tab decode_f8cl
PD_CUDA_FP8_CLUSTER=1 PD_CUDA_FP8_GROUP=1 st decode_f8grp 40 $G/bin/gpu_bench decode; tab decode_f8grp
unset GPU_BENCH_DECODE_BATCHES
st baseline 40 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
# session 14 (H100): 8 attention splits at batch 1 / 1k 0.08 ms faster than the default 16
GPU_BENCH_DECODE_BATCHES="1" GPU_BENCH_ATTN_TARGET=64 st decode_t64 30 $G/bin/gpu_bench decode; tab decode_t64
GPU_BENCH_DECODE_BATCHES="1 64" PD_CUDA_W8WG=17 PD_CUDA_W8WG_ROWS=4096 st decode_w8r 40 $G/bin/gpu_bench decode; tab decode_w8r
PD_GPU_TEST_L2PF=1 PD_GPU_TEST_SMALL=1 st mcl2 40 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcl2
PD_GPU_TEST_FP8CL=1 PD_GPU_TEST_SMALL=1 st mcf8 40 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcf8
PD_CUDA_L2PF=16 GPU_BENCH_STEPPROF=decode st prof 60 $G/bin/gpu_bench stepprof; tab prof
st kernels 280 $G/bin/test_gpu_kernels; cases kernels
round_end
