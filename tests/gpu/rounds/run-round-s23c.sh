#!/usr/bin/env bash
# Session 24's one call if only one comes (five starts failed before it): s23b (never ran) and
# s24a's gates in one, by need. While the harness checks option l2_prefetch (prefetch bounds, the
# decode step on / off gives the same logits) and session 22's FP8 clusters / q-k-v group
# (PD_GPU_TEST_FP8CL=1), the end-to-end gates run beside it (greedy ids against transformers with
# f32 / bf16 KV and the perplexity gate, tiny-llama and tiny-moe: not run since session 17 while
# the defaults changed). Then, alone on the GPU: the decode step at batch 1 / 64 by default, with
# PD_CUDA_L2PF=16 / 8 / 32 and 32 shared by two ops (PD_CUDA_L2PF_DEPTH=2), with
# PD_CUDA_FP8_CLUSTER=1 (+ PD_CUDA_FP8_GROUP=1); the PyTorch decode step; batch 1 with 8 attention
# splits; w8wg on the 4096-row weights only; the prefill table and its PyTorch step (issue 12,
# last measured in session 12); memcheck of both case sets; stepprof with the prefetch; the GPU
# cluster (pdctl up, KV over CUDA IPC); the whole harness with what is left.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s23c.sh
#   DEADLINE=560 bash .gpu-round/run-round-s23c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=560
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
fx="tiny-llama tiny-moe"
st greedy 150 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --only $fx --jobs 6 > $L/greedy.st &
st ppl 150 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only $fx --jobs 4 > $L/ppl.st &
PD_GPU_TEST_L2PF=1 st kl2 60 $G/bin/test_gpu_kernels; cases kl2; grep -E "l2pf|prefetch" $L/kl2.log | head -20
PD_GPU_TEST_FP8CL=1 st kf8 80 $G/bin/test_gpu_kernels; cases kf8; grep -E "cluster|group" $L/kf8.log | head -30
wait
for s in greedy ppl; do cat $L/$s.st; grep -qE "^=== $s: rc 0," $L/$s.st || rc=1; done
tail -8 $L/greedy.log; tail -8 $L/ppl.log
export GPU_BENCH_DECODE_BATCHES="1 64"
st decode 40 $G/bin/gpu_bench decode; tab decode
for mb in 16 8 32; do PD_CUDA_L2PF=$mb st decode_pf$mb 40 $G/bin/gpu_bench decode; tab decode_pf$mb; done
PD_CUDA_L2PF=32 PD_CUDA_L2PF_DEPTH=2 st decode_pf32d2 40 $G/bin/gpu_bench decode; tab decode_pf32d2
PD_CUDA_FP8_CLUSTER=1 st decode_f8cl 40 $G/bin/gpu_bench decode; tab decode_f8cl
PD_CUDA_FP8_CLUSTER=1 PD_CUDA_FP8_GROUP=1 st decode_f8grp 40 $G/bin/gpu_bench decode; tab decode_f8grp
unset GPU_BENCH_DECODE_BATCHES
st baseline 40 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
GPU_BENCH_DECODE_BATCHES="1" GPU_BENCH_ATTN_TARGET=64 st decode_t64 30 $G/bin/gpu_bench decode; tab decode_t64
GPU_BENCH_DECODE_BATCHES="1 64" PD_CUDA_W8WG=17 PD_CUDA_W8WG_ROWS=4096 st decode_w8r 40 $G/bin/gpu_bench decode; tab decode_w8r
st prefill 60 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
st baseline_prefill 60 python3 $G/torch_prefill_baseline.py; tail -12 $L/baseline_prefill.log
PD_GPU_TEST_L2PF=1 PD_GPU_TEST_SMALL=1 st mcl2 40 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcl2
PD_GPU_TEST_FP8CL=1 PD_GPU_TEST_SMALL=1 st mcf8 40 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcf8
PD_CUDA_L2PF=16 GPU_BENCH_STEPPROF=decode st prof 60 $G/bin/gpu_bench stepprof; tab prof
st cluster 90 python3 $G/check_cluster.py $G/bin --models deploy/models; tail -12 $L/cluster.log
st kernels 280 $G/bin/test_gpu_kernels; cases kernels
round_end
