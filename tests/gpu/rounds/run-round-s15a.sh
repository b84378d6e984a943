#!/usr/bin/env bash
# Session 15, call 1: where the batch-1 slice GEMV's cycles go, on the tree of session 14
# (09582ed: plain ops by default). Decode at batch 1 / 2 / 4 / 64 and at batch 1 with 8 / 4
# attention splits at 1k (GPU_BENCH_ATTN_TARGET 64 / 128: session 14's H100 found 8 splits
# 0.08 ms faster), stepprof, the SASS of matmul__w4gemv<2,2,0,0,0> (the gate_up / o / down
# GEMV) and ncu's per-instruction stall samples of gate_up n 1 at its plan, the PyTorch decode
# baseline.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s15a.sh
#   DEADLINE=420 bash .gpu-round/run-round-s15a.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=420
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
GPU_BENCH_DECODE_BATCHES="1 2 4 64" st decode 60 $G/bin/gpu_bench decode; tab decode
for t in 64 128; do GPU_BENCH_ATTN_TARGET=$t GPU_BENCH_DECODE_BATCHES="1" st decode_t$t 30 $G/bin/gpu_bench decode; tab decode_t$t; done
W4=_Z14matmul__w4gemvILi2ELi2ELb0ELb0ELb0EEv14matmul__w4segsPKfilii13matmul__w4pro
st sass 30 cuobjdump -sass -fun $W4 $G/bin/gpu_bench; grep -cE '^\s+/\*[0-9a-f]{4}\*/' $L/sass.log
st ncusrc 90 ncu --clock-control none --kernel-name regex:w4gemv --launch-skip 5 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters --section LaunchStats -f -o $L/w4src env GPU_BENCH_XGEMV_NOSWEEP=1 GPU_BENCH_XGEMV_SHAPES=1 $G/bin/gpu_bench xgemv
st ncupage 60 ncu -i $L/w4src.ncu-rep --page source --csv --print-source sass; wc -l $L/ncupage.log
st ncudet 60 ncu -i $L/w4src.ncu-rep --page details; grep -E "Duration|DRAM Through|Warp Cycles|Registers|Grid Size|stall" $L/ncudet.log | head -20
GPU_BENCH_STEPPROF=decode st stepprof 90 $G/bin/gpu_bench stepprof; tab stepprof
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
round_end
