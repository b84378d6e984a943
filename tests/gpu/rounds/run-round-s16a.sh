#!/usr/bin/env bash
# Session 16, call 1 (carry .gpu-round and .gpu-models/glm-dsv3.tar.xz, not llama-moe: both
# archives and the bundle are over 64 MiB):
#  - the GLM-4.5 / DeepSeek-V3 MoE decode steps in graphs (model_ctx_create now registers the
#    family's experts with moe_prepare): the family harness cases with case_family_graphs (graph
#    == padded eager plan bit for bit, host-grouped experts within 3e-2 of row rms), greedy ids
#    and ppl against transformers on tiny-glm / tiny-dsv3 (the eager path now groups on the
#    device too), gpu_bench family with its new graph column;
#  - session 15's open question (call s15e, never run): is the slice GEMV's 60% of DRAM
#    bandwidth its stream or its launch? The plan sweep on a 114688 x 4096 INT4 weight (4x
#    gate_up's rows; GPU_BENCH_XGEMV_BIG=1) next to gate_up's.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s16a.sh
#   DEADLINE=290 bash .gpu-round/run-round-s16a.sh   (carry .gpu-round, .gpu-models/glm-dsv3.tar.xz)
set -uo pipefail
ROUND_DEADLINE=290
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
fx="tiny-glm tiny-dsv3"
# the correctness steps together (they leave the GPU mostly idle), then the timings alone
# (background jobs: their rc is read back from st's "=== NAME: rc R" lines in $L/NAME.st)
PD_GPU_TEST_FAMILY=1 st kfam 90 $G/bin/test_gpu_kernels > $L/kfam.st &
st greedy 80 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --only $fx --jobs 6 > $L/greedy.st &
st ppl 80 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only $fx --jobs 4 > $L/ppl.st &
wait
for s in kfam greedy ppl; do cat $L/$s.st; grep -qE "^=== $s: rc 0," $L/$s.st || rc=1; done
cases kfam; grep -E "family_graphs" $L/kfam.log; tail -8 $L/greedy.log; tail -8 $L/ppl.log
PD_BENCH_FAMILY_PREFILL=0 st family 70 $G/bin/gpu_bench family; tab family
for b in 0 1; do GPU_BENCH_XGEMV_BIG=$b GPU_BENCH_XGEMV_SHAPES=1 st sweep_b$b 45 $G/bin/gpu_bench xgemv; for n in 1 4; do echo "n $n:"; grep -E "^int4 [0-9]+ x 4096 n $n:" $L/sweep_b$b.log | tr ' ' '\n' | grep -E '=' | sort -t= -k2 -n | head -5 | tr '\n' ' '; echo; done; grep -E "^\| (int4|fp8) .* \| [14] \|" $L/sweep_b$b.log | cut -d'|' -f2-12; done
round_end
