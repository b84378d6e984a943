#!/usr/bin/env bash
# run-on-gpu.sh [STEP...]: the whole GPU round on the device machine, from the repository root
# with the carried folder .gpu/ (bin/: pdctl router prefill-node decode-node test_gpu_kernels
# gpu_bench; lib/, ucx/ from
# collect-libs.sh; this script, check_reference.py, check_cluster.py, torch_decode_baseline.py,
# torch_prefill_baseline.py). Logs go to $OUT.
# Steps (default all but ncu, kattn, ksmall, attnbase, ncu-kernel): kernels memcheck greedy ppl
# cluster bench baseline baseline-prefill; on request: baseline-moe (torch_moe_baseline.py: the
# PyTorch step for `gpu_bench moe`), ncu (Nsight Compute on the flash attention
# kernel and the FP8 GEMM, from `gpu_bench flash`; NCU_FLASH_SKIP=N profiles the flash launch
# after N others), kattn / ksmall (the harness on attention cases / fixture shapes only),
# attnbase (PyTorch decode attention), ncu-kernel (NCU_KERNEL=REGEX over `gpu_bench $NCU_BENCH`,
# NCU_COUNT launches after NCU_SKIP), flashcases (the prefill attention cases alone) and memflash
# (those at fixture shapes under memcheck); ncu: NCU_FLASH_KERNEL=fwg__kernel the Hopper kernel,
# NCU_GEMM= (empty) skips the GEMM.
# BENCH="ops decode" limits the benchmark (default all). FIXTURES="tiny-glm tiny-dsv3" limits
# greedy / ppl (--only) and cluster (--fixtures; default tiny-llama tiny-moe) to those fixtures,
# which must be unpacked under deploy/models. DEADLINE=S: no step starts after S
# seconds and each step's timeout is cut to what is left (default: none). Every step runs under
# its timeout; the script exits 1 when any step failed or was skipped for the deadline.
# Build the bundle with tests/gpu/build-bundle.sh (it rebuilds every CUDA object: meson 1.0 gives
# nvcc no dependency file) and keep the sent tree under 64 MiB with tests/gpu/slim-tree.sh (drop,
# pack: the fixtures travel compressed in .gpu-models/).
set -uo pipefail
G=${G:-$PWD/.gpu}
OUT=${OUT:-/tmp/pdserve-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$G/ucx PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
steps=${*:-kernels memcheck greedy ppl cluster bench baseline baseline-prefill}
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
    timeout "$t" "$@" 2>&1 | tee "$OUT/$name.log"
    local r=${PIPESTATUS[0]}
    echo "=== $name: rc $r, $((SECONDS - t0)) s" | tee -a "$OUT/summary.log"
    [ "$r" = 0 ] || rc=1
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for s in $steps; do
    case $s in
    kernels) step kernels 360 "$G/bin/test_gpu_kernels" ;; # > 120 s on an H100 since session 17
    kattn) PD_GPU_TEST_ATTN=1 step kattn 120 "$G/bin/test_gpu_kernels" ;;
    ksmall) PD_GPU_TEST_SMALL=1 step ksmall 120 "$G/bin/test_gpu_kernels" ;;
    flashcases) PD_GPU_TEST_FLASH=1 step flashcases 120 "$G/bin/test_gpu_kernels" ;;
    memflash) PD_GPU_TEST_FLASH=1 PD_GPU_TEST_SMALL=1 step memflash 120 compute-sanitizer \
        --tool memcheck --error-exitcode 3 "$G/bin/test_gpu_kernels" ;;
    memcheck) PD_GPU_TEST_SMALL=1 step memcheck 240 compute-sanitizer --tool memcheck \
        --error-exitcode 3 "$G/bin/test_gpu_kernels" ;;
    greedy) step greedy 240 python3 "$G/check_reference.py" greedy --pdctl "$G/bin/pdctl" \
        --models deploy/models --kv f32 bf16 ${FIXTURES:+--only $FIXTURES} --jobs 4 ;;
    ppl) step ppl 300 python3 "$G/check_reference.py" ppl --pdctl "$G/bin/pdctl" \
        --models deploy/models --text tests/data/tinyshakespeare-val.txt \
        ${FIXTURES:+--only $FIXTURES} --jobs 4 ;;
    cluster) step cluster 400 python3 "$G/check_cluster.py" "$G/bin" --models deploy/models \
        ${FIXTURES:+--fixtures $FIXTURES} ;;
    bench) step bench 400 "$G/bin/gpu_bench" ${BENCH:-all} ;;
    baseline) step baseline 300 python3 "$G/torch_decode_baseline.py" ;;
    baseline-prefill) step baseline-prefill 200 python3 "$G/torch_prefill_baseline.py" ;;
    attnbase) step attnbase 60 python3 "$G/torch_attn_baseline.py" ;;
    ncu-kernel) step ncu-kernel 240 ncu --clock-control none --kernel-name-base demangled \
        --kernel-name "regex:${NCU_KERNEL:?NCU_KERNEL=REGEX}" --launch-skip "${NCU_SKIP:-0}" \
        --launch-count "${NCU_COUNT:-1}" --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        "$G/bin/gpu_bench" ${NCU_BENCH:-ops} ;;
    baseline-moe) step baseline-moe 400 python3 "$G/torch_moe_baseline.py" ;;
    ncu) step ncu 240 bash -c 'for ks in "$2 $1" ${3:+"$3"}; do
            set -- $ks
            ncu --clock-control none --kernel-name "regex:$1" --launch-skip "$2" --launch-count 1 \
                --section SpeedOfLight --section Occupancy --section LaunchStats \
                --section WarpStateStats --section MemoryWorkloadAnalysis \
                "$0/bin/gpu_bench" flash || exit 1; done' "$G" "${NCU_FLASH_SKIP:-2}" \
        "${NCU_FLASH_KERNEL:-flash__kernel}" "${NCU_GEMM-nvjet|gemm|xmma 2}" ;;
    *) echo "unknown step $s"; rc=2 ;;
    esac
done
exit $rc
