#!/usr/bin/env bash
# Session 11, call 2: matmul_w4wg, matmul_quant_act_f16wg and matmul_sum_parts PDL-launched (the
# w4wg producer copies its first stages' weights before griddepcontrol.wait, so they stream while
# the kernels before it finish); call 1's "groups across stages" variant of w4wg dropped (no gain).
# The w4wg harness cases and memcheck, `gpu_bench w4wg`, the decode steps at batch 1 / 16 / 32 /
# 64 with pdl on and off (PD_CUDA_PDL=0), stepprof of the four Llama decode steps, the PyTorch
# baseline, the accuracy gates.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s11b.sh
#   DEADLINE=420 bash .gpu-round/run-round-s11b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=420
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_W4WG=1 st kw4wg 90 $G/bin/test_gpu_kernels; cases kw4wg
PD_GPU_TEST_W4WG=1 PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st w4wg 120 $G/bin/gpu_bench w4wg; tab w4wg
GPU_BENCH_DECODE_BATCHES="1 16 32 64" st decode 80 $G/bin/gpu_bench decode; tab decode
PD_CUDA_PDL=0 GPU_BENCH_DECODE_BATCHES="1 64" st decode_nopdl 60 $G/bin/gpu_bench decode; tab decode_nopdl
GPU_BENCH_STEPPROF=decode st stepprof 90 $G/bin/gpu_bench stepprof; tab stepprof
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
round_end
