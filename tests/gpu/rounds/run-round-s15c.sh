#!/usr/bin/env bash
# Session 15, call 3: matmul_w4gemv's K slices interleaved by group (PD_CUDA_W4ILV=1: a block's
# warps read adjacent 2 KiB steps of the tile at a time, instead of each its own contiguous
# quarter-tile run; call s15b's ncu showed the step waiting on weights issued two steps before,
# at 60% of DRAM bandwidth, while the bf16 lm_head GEMV streams at 91% on the same card),
# crossed with the in-place register buffers (PD_CUDA_W4PIPE). Harness (xgemv, fused with the
# fixed decode_fuse expectation, memcheck) with ILV on, `gpu_bench xgemv` at the plans and decode
# at batch 1 / 2 / 4 for the four combinations, ncu of gate_up n 1 with ILV on, ppl and greedy
# with ILV on, the gate_up plan sweep with ILV on.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s15c.sh
#   DEADLINE=420 bash .gpu-round/run-round-s15c.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=420
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
export PD_CUDA_W4ILV=1
PD_GPU_TEST_XGEMV=1 st kxgemv 60 $G/bin/test_gpu_kernels; cases kxgemv
PD_GPU_TEST_FUSED=1 st kfused 60 $G/bin/test_gpu_kernels; cases kfused
PD_GPU_TEST_XGEMV=1 PD_GPU_TEST_SMALL=1 st memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
for c in "0 0" "1 0" "0 1" "1 1"; do set -- $c
  PD_CUDA_W4ILV=$1 PD_CUDA_W4PIPE=$2 GPU_BENCH_XGEMV_NOSWEEP=1 st xgemv_i$1p$2 30 $G/bin/gpu_bench xgemv; grep -E "^\| int4 .* \| [124] \|" $L/xgemv_i$1p$2.log
done
for c in "0 0" "1 0" "0 1" "1 1"; do set -- $c
  PD_CUDA_W4ILV=$1 PD_CUDA_W4PIPE=$2 GPU_BENCH_DECODE_BATCHES="1 2 4" st decode_i$1p$2 40 $G/bin/gpu_bench decode; tab decode_i$1p$2 | grep int4
done
st ncuilv 40 ncu --clock-control none --kernel-name regex:w4gemv --launch-skip 5 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section LaunchStats env GPU_BENCH_XGEMV_NOSWEEP=1 GPU_BENCH_XGEMV_SHAPES=1 $G/bin/gpu_bench xgemv; grep -E "w4gemv<|Duration|DRAM Through|Warp Cycles Per Issued|SM Active" $L/ncuilv.log | head -8
st ppl 40 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama --jobs 4; tail -6 $L/ppl.log
st greedy 40 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
GPU_BENCH_XGEMV_SHAPES=1 st sweep 60 $G/bin/gpu_bench xgemv; grep -E "^int4 28672 x 4096 n 1:" $L/sweep.log | tr ' ' '\n' | grep -E '=' | sort -t= -k2 -n | head -8
round_end
