#!/usr/bin/env bash
# run-attn.sh [STEP...]: the decode-attention round (issue 11, session 3) on the device machine,
# from the repository root with the carried folder $G (bin/: test_gpu_kernels gpu_bench pdctl;
# lib/, ucx/ from collect-libs.sh; this script, check_reference.py, torch_decode_baseline.py,
# torch_attn_baseline.py). Logs go to $OUT. Steps: kernels (kattn: the attention cases alone,
# ksmall: fixture shapes) attn ncu memcheck greedy decode
# baseline attnbase. DEADLINE=S: no step starts after S seconds, timeouts are cut to what is left.
set -uo pipefail
G=${G:-$PWD/.gpu-attn/b}
OUT=${OUT:-/tmp/pdserve-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$G/ucx PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
rc=0
step() { # name timeout cmd...
    local name=$1 t=$2; shift 2
    if [ -n "${DEADLINE:-}" ]; then
        local left=$((DEADLINE - SECONDS))
        if [ $left -le 10 ]; then
            echo "=== $name: skipped (deadline)" | tee -a "$OUT/summary.log"
            rc=1
            return
        fi
        [ "$t" -lt $left ] || t=$left
    fi
    echo "=== $name: $*" | tee -a "$OUT/summary.log"
    local t0=$SECONDS
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1
    local r=$?
    echo "=== $name: rc $r, $((SECONDS - t0)) s" | tee -a "$OUT/summary.log"
    [ "$r" = 0 ] || rc=1
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for s in "$@"; do
    case $s in
    kernels) step kernels 200 "$G/bin/test_gpu_kernels" ;;
    kattn) PD_GPU_TEST_ATTN=1 step kattn 100 "$G/bin/test_gpu_kernels" ;;
    ksmall) PD_GPU_TEST_SMALL=1 step ksmall 100 "$G/bin/test_gpu_kernels" ;;
    attn) step attn 120 "$G/bin/gpu_bench" attn ;;
    ncu) step ncu 120 ncu --clock-control none --kernel-name "regex:attention__tc_kernel" \
        --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis "$G/bin/gpu_bench" attnprof ;;
    memcheck) PD_GPU_TEST_SMALL=1 step memcheck 200 compute-sanitizer --tool memcheck \
        --error-exitcode 3 "$G/bin/test_gpu_kernels" ;;
    greedy) step greedy 200 python3 "$G/check_reference.py" greedy --pdctl "$G/bin/pdctl" \
        --models deploy/models --kv f32 bf16 ;;
    decode) step decode 200 "$G/bin/gpu_bench" decode ;;
    baseline) step baseline 200 python3 "$G/torch_decode_baseline.py" ;;
    attnbase) step attnbase 60 python3 "$G/torch_attn_baseline.py" ;;
    *) echo "unknown step $s"; rc=2 ;;
    esac
done
grep -E "FAIL|cases,|ERROR SUMMARY" "$OUT"/k*.log "$OUT"/memcheck.log 2>/dev/null | tail -20
exit $rc
