#!/usr/bin/env bash
# Session 15, call 4: matmul_w4gemv at 24 warps per SM (PD_CUDA_W4OCC=1: the depth-2 register
# kernels of 8 warps compiled for 3 blocks per SM, 80 registers; rows 32 spills 428 bytes,
# rows 16 40) against today's 16 (calls s15b / s15c: neither the in-place buffers nor the
# interleaved slices moved the step; the kernel waits on weights issued two steps before, and
# the plan sweeps never ran more than 16 warps per SM). Harness and memcheck with it on, the
# gate_up plan sweep (now with 3 blocks per SM) and the plans both ways, decode at batch 1 / 2 /
# 4 both ways.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s15d.sh
#   DEADLINE=300 bash .gpu-round/run-round-s15d.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=300
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_CUDA_W4OCC=1 PD_GPU_TEST_XGEMV=1 st kxgemv 60 $G/bin/test_gpu_kernels; cases kxgemv
PD_CUDA_W4OCC=1 PD_GPU_TEST_XGEMV=1 PD_GPU_TEST_SMALL=1 st memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
for o in 1 0; do PD_CUDA_W4OCC=$o GPU_BENCH_XGEMV_SHAPES=1 st sweep_o$o 40 $G/bin/gpu_bench xgemv; for n in 1 2 4; do echo "n $n:"; grep -E "^int4 28672 x 4096 n $n:" $L/sweep_o$o.log | tr ' ' '\n' | grep -E '=' | sort -t= -k2 -n | head -6 | tr '\n' ' '; echo; done; done
for o in 1 0; do PD_CUDA_W4OCC=$o GPU_BENCH_XGEMV_NOSWEEP=1 st xgemv_o$o 30 $G/bin/gpu_bench xgemv; grep -E "^\| int4 .* \| [124] \|" $L/xgemv_o$o.log | cut -d'|' -f2-7; done
for o in 1 0; do PD_CUDA_W4OCC=$o GPU_BENCH_DECODE_BATCHES="1 2 4" st decode_o$o 40 $G/bin/gpu_bench decode; tab decode_o$o | grep int4; done
round_end
