#!/usr/bin/env bash
# call 1 (helper gemv, session 5): matmul harness at fixture shapes, the slice-GEMV sweep, memcheck
# (run from the repository root on the device with .gpu-gemv/bundle.tar.xz carried; `run` was
# given `DEADLINE=140 bash .gpu-gemv/drive1.sh 2>&1 | tee $OUT/drive1.log`)
set -uo pipefail
F=$PWD/.gpu-gemv
tar -C $F -xJf $F/bundle.tar.xz || exit 9
G=$F/b
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
DL=${DEADLINE:-150}
st() { local name=$1 t=$2; shift 2; local left=$((DL - SECONDS)); [ $left -gt 5 ] || { echo "=== $name skipped"; return; }
  [ $t -lt $left ] || t=$left; echo "=== $name: $*"; local t0=$SECONDS
  timeout $t "$@" > $OUT/$name.log 2>&1; echo "=== $name: rc $?, $((SECONDS - t0)) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
PD_GPU_TEST_MATMUL=1 PD_GPU_TEST_SMALL=1 st ksmall 50 $G/bin/test_gpu_kernels
echo "PASS $(grep -c PASS $OUT/ksmall.log) FAIL $(grep -c FAIL $OUT/ksmall.log)"; grep "FAIL\|rror" $OUT/ksmall.log | head -20; grep "w[48]gemv" $OUT/ksmall.log | head -40; tail -3 $OUT/ksmall.log
st xgemv 70 $G/bin/gpu_bench xgemv
tail -34 $OUT/xgemv.log
PD_GPU_TEST_MATMUL=1 PD_GPU_TEST_SMALL=1 st memcheck 40 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels
echo "PASS $(grep -c PASS $OUT/memcheck.log) FAIL $(grep -c FAIL $OUT/memcheck.log)"; grep "FAIL\|ERROR SUMMARY\|Invalid" $OUT/memcheck.log | head; tail -3 $OUT/memcheck.log
