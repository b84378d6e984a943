#!/usr/bin/env bash
# Session 6, the merged round (lead): one device call on merged main. Run from the repository
# root on the device with .gpu-round/ (bundle.tar.xz from tests/gpu/build-bundle.sh) and
# .gpu-models/llama-moe.tar.xz carried:
#   DEADLINE=400 bash .gpu-round/run-round-s6.sh
# Correctness first (the harness at fixture shapes, the same under compute-sanitizer memcheck,
# greedy ids against transformers, the CUDA cluster against the pipeline's ids), then the
# benchmarks with their same-call PyTorch baselines and the session's knobs (pdl off, the
# bf16 q / k / v prefill path, flash variant 8; gpu_bench moe prints moe_gmm2 beside moe_gmm), then the full-size harness with
# what time is left. Logs: $OUT/r.tgz; the summary is printed.
# (tests/gpu/round-lib.sh, which it sources, beside it in .gpu-round/: prepare-round.sh copies
# both.)
set -uo pipefail
ROUND_DEADLINE=400
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# flash variant 9 (ping-pong named barriers) has never run: its cases alone first, under a short
# timeout; if they fail or hang, the rest of the round runs variants 0..8 only
PD_GPU_TEST_FLASH=1 PD_GPU_TEST_SMALL=1 st flash9 40 $G/bin/test_gpu_kernels; cases flash9
grep -q "cases, 0 failed" $L/flash9.log || { echo "flash variants 0..8 only from here"; export PD_GPU_FLASH_VARIANTS=9; }
PD_GPU_TEST_SMALL=1 st ksmall 60 $G/bin/test_gpu_kernels; cases ksmall
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -12 $L/greedy.log
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
PD_CUDA_QKV_BF16=1 st ppl_qkv 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl_qkv.log
st cluster 120 python3 $G/check_cluster.py $G/bin --models deploy/models; tail -8 $L/cluster.log
GPU_BENCH_DECODE_BATCHES="1 3 16 64" st decode 80 $G/bin/gpu_bench decode; tab decode
PD_CUDA_PDL=0 GPU_BENCH_DECODE_BATCHES="1 64" st decode_nopdl 50 $G/bin/gpu_bench decode; tab decode_nopdl
st baseline 60 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
st prefill 60 $G/bin/gpu_bench prefill; tab prefill
PD_BENCH_PREFILL_QUICK=1 PD_CUDA_QKV_BF16=1 st prefill_qkv 25 $G/bin/gpu_bench prefill; tab prefill_qkv
PD_BENCH_PREFILL_QUICK=1 PD_CUDA_FLASH_VARIANT=8 st prefill_v8 25 $G/bin/gpu_bench prefill; tab prefill_v8
st baseline_prefill 30 python3 $G/torch_prefill_baseline.py; tail -15 $L/baseline_prefill.log
st flash 60 $G/bin/gpu_bench flash; tab flash
st moe 60 $G/bin/gpu_bench moe; tab moe
st baseline_moe 90 python3 $G/torch_moe_baseline.py; tail -15 $L/baseline_moe.log
st kernels 240 $G/bin/test_gpu_kernels; cases kernels
round_end
