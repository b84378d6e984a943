#!/usr/bin/env bash
# run2.sh: the h-cuda2 GPU round (graph decode bench, kernel harness, greedy end to end, memcheck)
# from the repository root with the bundle unpacked at .gpu/b2. Logs in $OUT. Stops starting
# steps after DEADLINE seconds.
set -uo pipefail
G=$PWD/.gpu/b2
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$G/ucx PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
DEADLINE=${DEADLINE:-330}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
step() { # name timeout cmd...
    local name=$1 t=$2; shift 2
    local left=$((DEADLINE - SECONDS))
    [ $left -gt 10 ] || { echo "=== $name: skipped (deadline)" | tee -a "$OUT/summary.log"; return; }
    [ $t -lt $left ] || t=$left
    echo "=== $name: $*" | tee -a "$OUT/summary.log"
    local t0=$SECONDS
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1
    echo "=== $name: rc $?, $((SECONDS - t0)) s" | tee -a "$OUT/summary.log"
    tail -40 "$OUT/$name.log"
}
step bench 150 "$G/bin/gpu_bench" decode
step kernels 150 "$G/bin/test_gpu_kernels"
step greedy 120 python3 "$G/check_reference.py" greedy --pdctl "$G/bin/pdctl" --models deploy/models --kv f32 bf16
PD_GPU_TEST_SMALL=1 step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 "$G/bin/test_gpu_kernels"
cat "$OUT/summary.log"
