#!/usr/bin/env bash
# run-flash-s6.sh: the one device call of session 6's helper "flash" (issue 12, the Hopper flash
# attention variants 6 / 7 of kernels/attention_flash.cu). Run from the device tree root with the
# bundle (tests/gpu/build-bundle.sh, or only test_gpu_kernels + gpu_bench) in $F:
#   F=.gpu-flash DEADLINE=170 bash .gpu-flash/run-flash-s6.sh
# Steps: the flash harness cases, the same under compute-sanitizer memcheck at fixture shapes,
# gpu_bench flash prefill (every flash variant, old v5 and new v6 / v7 in one binary; the
# whole prompt with the default variant), the same-call PyTorch SDPA / prefill
# (torch_prefill_baseline.py), ncu of v7 and v5 (mangled names), then gpu_bench prefill with
# PD_CUDA_FLASH_VARIANT=7 while the deadline allows. Logs under $OUT/logs.
set -uo pipefail
F=${F:-.gpu-flash}
tar -C "$F" -xJf "$F/bundle.tar.xz"
export G=$PWD/$F/b OUT=${OUT:-/tmp/out}/logs
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
DL=${DEADLINE:-170}
left() { echo $((DL - SECONDS)); }
# the harness first, under its own short deadline (a hung kernel costs 40 s, not the call)
DEADLINE=40 bash "$G/run-on-gpu.sh" flashcases memflash
DEADLINE=$((DL - 50 - SECONDS)) BENCH="flash prefill" bash "$G/run-on-gpu.sh" bench baseline-prefill
ncu1() { # mangled-name infix, label
    [ "$(left)" -gt 30 ] || { echo "=== ncu $2: skipped (deadline)" | tee -a "$OUT/summary.log"; return; }
    echo "=== ncu $2" | tee -a "$OUT/summary.log"
    timeout $(( $(left) - 25 )) ncu --clock-control none --kernel-name-base mangled \
        --kernel-name "regex:fwg__kernel$1" --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        "$G/bin/gpu_bench" flash > "$OUT/ncu-$2.log" 2>&1
    echo "=== ncu $2: rc $?" | tee -a "$OUT/summary.log"
}
ncu1 ILi3ELi2E v7
if [ "$(left)" -gt 15 ]; then
    echo "=== prefill v7" | tee -a "$OUT/summary.log"
    PD_CUDA_FLASH_VARIANT=7 timeout $(( $(left) - 5 )) "$G/bin/gpu_bench" prefill > "$OUT/prefill-v7.log" 2>&1
    echo "=== prefill v7: rc $?" | tee -a "$OUT/summary.log"
fi
ncu1 ILi3ELi0E v5
