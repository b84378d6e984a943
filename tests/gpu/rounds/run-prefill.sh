#!/usr/bin/env bash
# helper "prefill" (session 5) device calls: bash .gpu-prefill/run.sh STEP... from the repository root
# with the bundle of tests/gpu/build-bundle.sh in .gpu-prefill/ (DL = seconds budget; logs in $OUT).
F=${F:-.gpu-prefill}
tar -C $F -xJf $F/bundle.tar.xz || exit 1
G=$PWD/$F/b
OUT=${OUT:-/tmp/out}
mkdir -p $OUT
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
export PYTHONUNBUFFERED=1 UCX_MODULE_DIR=$G/ucx
DL=${DL:-250}
LOG=$OUT/all.log
st() { # name timeout cmd...
    local name=$1 t=$2; shift 2
    local left=$((DL - SECONDS))
    if [ $left -le 8 ]; then echo "=== $name: skipped (deadline)" | tee -a $LOG; return; fi
    [ "$t" -lt $left ] || t=$left
    echo "=== $name: $* (<= $t s)" | tee -a $LOG
    local t0=$SECONDS
    timeout $t "$@" 2>&1 | tee -a $LOG
    echo "=== $name: rc ${PIPESTATUS[0]}, $((SECONDS - t0)) s" | tee -a $LOG
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a $LOG
for s in "$@"; do
    case $s in
    cases) PD_GPU_TEST_PREFILL=1 st cases 90 $G/bin/test_gpu_kernels ;;
    cases0) PD_CUDA_LT_FAST_ACCUM=0 PD_GPU_TEST_PREFILL=1 st cases-exact 90 $G/bin/test_gpu_kernels ;;
    prefops) st prefops 60 $G/bin/gpu_bench prefops ;;
    exact) PD_CUDA_LT_FAST_ACCUM=0 PD_BENCH_PREFILL_QUICK=1 st exact 40 $G/bin/gpu_bench prefill ;;
    before2) PD_CUDA_LT_FAST_ACCUM=0 PD_CUDA_GU_BF16=0 PD_BENCH_PREFILL_QUICK=1 st before 40 $G/bin/gpu_bench prefill ;;
    memcheck) PD_GPU_TEST_PREFILL=1 PD_GPU_TEST_SMALL=1 st memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels ;;
    sweep) st sweep 90 $G/bin/gpu_bench gemm prefops ;;
    prefill) st prefill 90 $G/bin/gpu_bench prefill ;;
    before) PD_CUDA_GU_BF16=0 PD_BENCH_PREFILL_QUICK=1 st before 40 $G/bin/gpu_bench prefill ;;
    fast) PD_CUDA_LT_FAST_ACCUM=1 PD_BENCH_PREFILL_QUICK=1 st fast 40 $G/bin/gpu_bench prefill ;;
    quick) PD_BENCH_PREFILL_QUICK=1 st quick 40 $G/bin/gpu_bench prefill ;;
    baseline) st baseline 60 python3 $G/torch_prefill_baseline.py ;;
    models) tar -xJf .gpu-models/llama-moe.tar.xz ;;
    ppl) st ppl 60 python3 $G/check_reference.py ppl --pdctl $G/bin/pdctl --models deploy/models --text tests/data/tinyshakespeare-val.txt --only tiny-llama tiny-moe --jobs 4 ;;
    greedy) st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --only tiny-llama tiny-moe --jobs 4 ;;
    ncu) st ncu 60 ncu --clock-control none --kernel-name regex:nvjet --launch-skip ${NCU_SKIP:-52} --launch-count 2 --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis $G/bin/gpu_bench prefops ;;
    # session 6: the whole 8192 FP8 prompt with session 5's bf16 silu kernel (same binary), and
    # ncu of the 16-byte silu kernel (its first launch in prefops: row 8)
    before6) PD_BENCH_SILU_V1=1 PD_BENCH_PREFILL_QUICK=1 st before6 40 $G/bin/gpu_bench prefill ;;
    fast6) PD_BENCH_SILU_FAST=1 PD_BENCH_PREFILL_QUICK=1 st fast6 40 $G/bin/gpu_bench prefill ;;
    small) PD_GPU_TEST_PREFILL=1 PD_GPU_TEST_SMALL=1 st small 40 $G/bin/test_gpu_kernels ;;
    ncu6) st ncu6 40 ncu --clock-control none --kernel-name regex:silu_mul_fp8 --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis $G/bin/gpu_bench prefops ;;
    *) echo "unknown step $s" | tee -a $LOG ;;
    esac
done
grep -E "^=== .*rc|cases, .*failed|ERROR SUMMARY|^prefill|layer sum|FAIL" $LOG > $OUT/summary.log
cat $OUT/summary.log
