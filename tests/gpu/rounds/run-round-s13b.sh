#!/usr/bin/env bash
# Session 13, call 3 (the last device minutes): `gpu_bench xgemv`'s plan sweep on gate_up 28672 x
# 4096 for both weight streams of matmul_w4gemv (PD_CUDA_W4BULK=1 / 0): does the bulk ring, with
# its 87 registers, win at a plan of more warps per SM than the register stream can hold?
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s13b.sh
#   DEADLINE=150 bash .gpu-round/run-round-s13b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=150
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_CUDA_W4BULK=1 GPU_BENCH_XGEMV_SHAPES=1 st sweep_bulk 65 $G/bin/gpu_bench xgemv; grep -E "^int4 " $L/sweep_bulk.log
PD_CUDA_W4BULK=0 GPU_BENCH_XGEMV_SHAPES=1 st sweep_regs 65 $G/bin/gpu_bench xgemv; grep -E "^int4 " $L/sweep_regs.log
round_end
