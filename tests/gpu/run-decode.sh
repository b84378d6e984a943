#!/usr/bin/env bash
# run-decode.sh [STEP...]: the issue-11 GPU round (h-decode) from the repository root with the
# bundle unpacked at $G (default .gpu-decode/b; bin/: test_gpu_kernels gpu_bench pdctl, lib/, ucx/
# from collect-libs.sh, check_reference.py, torch_decode_baseline.py). Logs in $OUT. Steps
# (default all): kernels memcheck int4 wgemv ncu bench greedy baseline (wgemv: the plan sweep of
# matmul_wgemv; ncu: the INT4 / FP8 wgemv kernels at n 1 and the INT4 GEMM at n 64). Stops
# starting steps after DEADLINE seconds; every step has a timeout.
set -uo pipefail
G=${G:-$PWD/.gpu-decode/b}
OUT=${OUT:-/tmp/pdserve-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} UCX_MODULE_DIR=$G/ucx
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
DEADLINE=${DEADLINE:-330}
steps=${*:-kernels memcheck int4 wgemv ncu bench greedy baseline}
# at most 8 files come back from a run: the GPU line goes to summary.log, wgemv to int4.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$OUT/summary.log"
step() { # name timeout cmd...
    local name=$1 t=$2; shift 2
    local left=$((DEADLINE - SECONDS))
    [ $left -gt 10 ] || { echo "=== $name: skipped (deadline)" | tee -a "$OUT/summary.log"; return; }
    [ $t -lt $left ] || t=$left
    echo "=== $name: $*" | tee -a "$OUT/summary.log"
    local t0=$SECONDS
    timeout "$t" "$@" >> "$OUT/$name.log" 2>&1
    echo "=== $name: rc $?, $((SECONDS - t0)) s" | tee -a "$OUT/summary.log"
}
NCU="ncu --clock-control none --kernel-name-base demangled -c 1 --section SpeedOfLight
    --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy -k"
for s in $steps; do
    case $s in
    kernels) step kernels 200 "$G/bin/test_gpu_kernels" ;;
    memcheck) PD_GPU_TEST_SMALL=1 step memcheck 120 compute-sanitizer --tool memcheck \
        --error-exitcode 3 "$G/bin/test_gpu_kernels" ;;
    int4) step int4 120 "$G/bin/gpu_bench" int4 ;;
    wgemv) step int4 120 "$G/bin/gpu_bench" wgemv ;;
    ncu) for k in 'wgemv<.int.2' 'wgemv<.int.1' 'int4_mma_cp<.int.8>'; do
        GPU_BENCH_INT4_SHAPES=1 step ncu 90 $NCU "regex:$k" "$G/bin/gpu_bench" int4; done ;;
    bench) step bench 200 "$G/bin/gpu_bench" ${BENCH:-ops decode} ;;
    greedy) step greedy 120 python3 "$G/check_reference.py" greedy --pdctl "$G/bin/pdctl" \
        --models deploy/models --kv f32 bf16 ;;
    baseline) step baseline 150 python3 "$G/torch_decode_baseline.py" ;;
    *) echo "unknown step $s" ;;
    esac
done
cat "$OUT/summary.log"
