#!/usr/bin/env bash
# run-family.sh: the GLM-4.5 / DeepSeek-V3 round (issue 15) on the device machine in one short
# call, from the repository root with the carried bundle $G (bin/: test_gpu_kernels gpu_bench
# pdctl ...; this script, check_reference.py, check_cluster.py, bf16_kv_transformers.py,
# check_tiktoken.py, kimi-tiny/) and deploy/models/tiny-glm, tiny-dsv3 unpacked. Logs go to $OUT
# (8 files at most come back: summary (with the cluster's output) kfam memcheck greedy ppl bf16tf
# tiktoken bench).
# Phase 1 runs the correctness steps at once (they leave the GPU mostly idle): the family kernel
# cases (PD_GPU_TEST_FAMILY=1), compute-sanitizer memcheck on their fixture shapes, greedy (f32 and
# bf16 KV) and ppl for both fixtures, transformers' own bf16 KV numbers
# (bf16_kv_transformers.py) and tiktoken's ids for kimi-tiny (check_tiktoken.py). Phase 2 alone
# on the GPU: gpu_bench family (timings). Phase 3, if time is left: check_cluster.py --fixtures
# tiny-glm tiny-dsv3.
# DEADLINE=S (default 150): phase 1 steps get P1 seconds (default 70), later phases what is left.
# STEPS="kfam memcheck greedy ppl bf16tf tiktoken bench cluster" (the default) limits the round.
set -uo pipefail
G=${G:-$PWD/.gpu-fam/b}
OUT=${OUT:-/tmp/pdserve-gpu}
DEADLINE=${DEADLINE:-150}
P1=${P1:-70}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$G/ucx PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
S=$OUT/summary.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$S" 2>&1
fx="tiny-glm tiny-dsv3"
STEPS=${STEPS:-kfam memcheck greedy ppl bf16tf tiktoken bench cluster}
want() { [[ " $STEPS " == *" $1 "* ]]; }
rm -f /tmp/rc.*
bg() { # name timeout cmd...: in the background, log to $OUT/name.log, rc into /tmp/rc.name
    local name=$1 t=$2; shift 2
    want "$name" || return 0
    echo "=== $name (<= ${t}s): $*" >>"$S"
    (
        t0=$SECONDS
        timeout "$t" "$@" >"$OUT/$name.log" 2>&1
        r=$?
        echo "=== $name: rc $r, $((SECONDS - t0)) s" >>"$S"
        echo $r >/tmp/rc.$name
    ) &
}
PD_GPU_TEST_FAMILY=1 bg kfam "$P1" "$G/bin/test_gpu_kernels"
PD_GPU_TEST_FAMILY=1 PD_GPU_TEST_SMALL=1 bg memcheck "$P1" compute-sanitizer --tool memcheck \
    --error-exitcode 3 "$G/bin/test_gpu_kernels"
bg greedy "$P1" python3 "$G/check_reference.py" greedy --pdctl "$G/bin/pdctl" \
    --models deploy/models --kv f32 bf16 --only $fx --jobs 8
bg ppl "$P1" python3 "$G/check_reference.py" ppl --pdctl "$G/bin/pdctl" --models deploy/models \
    --text tests/data/tinyshakespeare-val.txt --only $fx --jobs 6
bg bf16tf "$P1" python3 "$G/bf16_kv_transformers.py" deploy/models $fx
bg tiktoken "$P1" python3 "$G/check_tiktoken.py" "$G/kimi-tiny"
wait
left=$((DEADLINE - SECONDS))
if ! want bench; then
    :
elif [ $left -gt 20 ]; then
    echo "=== bench (<= ${left}s)" >>"$S"
    t0=$SECONDS
    timeout $left "$G/bin/gpu_bench" family >"$OUT/bench.log" 2>&1
    r=$?
    echo "=== bench: rc $r, $((SECONDS - t0)) s" >>"$S"
    echo $r >/tmp/rc.bench
else
    echo "=== bench: skipped (deadline)" >>"$S"
fi
left=$((DEADLINE - SECONDS))
if ! want cluster; then
    :
elif [ $left -gt 60 ]; then
    echo "=== cluster (<= ${left}s)" >>"$S"
    t0=$SECONDS
    timeout $left python3 "$G/check_cluster.py" "$G/bin" --models deploy/models --fixtures $fx \
        >>"$S" 2>&1
    r=$?
    echo "=== cluster: rc $r, $((SECONDS - t0)) s" >>"$S"
    echo $r >/tmp/rc.cluster
else
    echo "=== cluster: skipped (deadline)" >>"$S"
fi
cat "$S"
grep -hE "FAIL|cases,|ERROR SUMMARY" "$OUT"/kfam.log "$OUT"/memcheck.log 2>/dev/null | tail -20
cat "$OUT"/greedy.log "$OUT"/ppl.log "$OUT"/bf16tf.log "$OUT"/tiktoken.log 2>/dev/null | tail -70
grep -E "^\||build" "$OUT"/bench.log 2>/dev/null
rc=0
for f in /tmp/rc.*; do [ "$(cat "$f")" = 0 ] || rc=1; done
exit $rc
