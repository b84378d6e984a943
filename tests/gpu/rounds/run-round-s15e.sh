#!/usr/bin/env bash
# Session 15, call 5: is the slice GEMV's 60% of DRAM bandwidth its stream or its launch? The
# plan sweep and the plans on a 114688 x 4096 INT4 weight (4x gate_up's rows, 235 MB;
# GPU_BENCH_XGEMV_BIG=1) next to gate_up's, same call; ncu of the big one at its plan.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s15e.sh
#   DEADLINE=200 bash .gpu-round/run-round-s15e.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=200
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for b in 0 1; do GPU_BENCH_XGEMV_BIG=$b GPU_BENCH_XGEMV_SHAPES=1 st sweep_b$b 60 $G/bin/gpu_bench xgemv; for n in 1 4; do echo "n $n:"; grep -E "^int4 [0-9]+ x 4096 n $n:" $L/sweep_b$b.log | tr ' ' '\n' | grep -E '=' | sort -t= -k2 -n | head -5 | tr '\n' ' '; echo; done; grep -E "^\| (int4|fp8) .* \| [14] \|" $L/sweep_b$b.log | cut -d'|' -f2-12; done
GPU_BENCH_XGEMV_BIG=1 st ncubig 40 ncu --clock-control none --kernel-name regex:w4gemv --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section LaunchStats env GPU_BENCH_XGEMV_NOSWEEP=1 GPU_BENCH_XGEMV_SHAPES=1 $G/bin/gpu_bench xgemv; grep -E "w4gemv<|Duration|DRAM Through|Warp Cycles Per Issued|SM Active|Elapsed Cycles|Grid Size" $L/ncubig.log | head -8
round_end
