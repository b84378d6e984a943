#!/usr/bin/env bash
# Session 9's second round: the W4A8 INT4 prefill with the fused ops making the 1x128-block
# activations (act_quant; q / k / v quantized once, the gate_up product as bf16 into the blk
# SiLU-mul): the new harness cases at fixture shapes and under memcheck, the ppl gate (INT4
# variants run the new path at the ppl windows), the prefill table and its kernel profile, and the
# same-run PyTorch prefill step.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s9b.sh
#   DEADLINE=540 bash .gpu-round/run-round-s9b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SMALL=1 st ksmall 60 $G/bin/test_gpu_kernels; cases ksmall; grep -E "blk" $L/ksmall.log | grep -v PASS | head -20; grep -c "blk.*PASS" $L/ksmall.log
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st ppl 70 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st prefill 90 $G/bin/gpu_bench prefill; grep -E "^\||prefill|int4_gemm" $L/prefill.log | head -24
GPU_BENCH_STEPPROF=prefill st stepprof_prefill 90 $G/bin/gpu_bench stepprof; tab stepprof_prefill | head -60
st baseline_prefill 120 python3 $G/torch_prefill_baseline.py; tail -20 $L/baseline_prefill.log
round_end
