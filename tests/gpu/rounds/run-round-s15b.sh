#!/usr/bin/env bash
# Session 15, call 2: matmul_w4gemv's register buffers used in place (PD_CUDA_W4PIPE=1, the new
# default: depth + 1 buffers, each refilled right after its step's arithmetic) against the loop
# before (=0: depth buffers copied out before their refill; call s15a's ncu found those copies
# waiting for the loads just issued, 35% of gate_up n 1's stall samples), and the prologue's x
# loads four per round trip. The xgemv and fused harness cases at full size and under memcheck,
# `gpu_bench xgemv` at the plans and decode at batch 1 / 2 / 4 / 64 both ways, ncu's stall
# samples and the SASS of the new gate_up GEMV, stepprof, ppl gate and greedy ids, the PyTorch
# decode baseline.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s15b.sh
#   DEADLINE=500 bash .gpu-round/run-round-s15b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=500
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_XGEMV=1 st kxgemv 60 $G/bin/test_gpu_kernels; cases kxgemv
PD_GPU_TEST_FUSED=1 st kfused 60 $G/bin/test_gpu_kernels; cases kfused
PD_GPU_TEST_XGEMV=1 PD_GPU_TEST_FUSED=1 PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
for p in 1 0; do PD_CUDA_W4PIPE=$p GPU_BENCH_DECODE_BATCHES="1 2 4 64" st decode_p$p 50 $G/bin/gpu_bench decode; tab decode_p$p; done
for p in 1 0; do PD_CUDA_W4PIPE=$p GPU_BENCH_XGEMV_NOSWEEP=1 st xgemv_p$p 50 $G/bin/gpu_bench xgemv; grep -E "^\| int4" $L/xgemv_p$p.log; done
W4=_Z14matmul__w4gemvILi2ELi2ELb0ELb0ELb0ELb1EEv14matmul__w4segsPKfilii13matmul__w4pro
st sass 30 cuobjdump -sass -fun $W4 $G/bin/gpu_bench; grep -cE '^\s+/\*[0-9a-f]{4}\*/' $L/sass.log
st ncusrc 60 ncu --clock-control none --kernel-name regex:w4gemv --launch-skip 5 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters --section LaunchStats -f -o $L/w4src env GPU_BENCH_XGEMV_NOSWEEP=1 GPU_BENCH_XGEMV_SHAPES=1 $G/bin/gpu_bench xgemv
st ncupage 40 ncu -i $L/w4src.ncu-rep --page source --csv --print-source sass; wc -l $L/ncupage.log
st ncudet 30 ncu -i $L/w4src.ncu-rep --page details; grep -E "w4gemv|Duration|DRAM Through|Warp Cycles|Registers|Grid Size|SM Active" $L/ncudet.log | head -12
GPU_BENCH_STEPPROF=decode st stepprof 60 $G/bin/gpu_bench stepprof; tab stepprof | head -40
st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4; tail -12 $L/ppl.log
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -7 $L/greedy.log
st baseline 70 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
round_end
