#!/usr/bin/env bash
# drive2.sh: confirmation round (fitted wgemv planner and routing): memcheck of the matmul cases
# (fixture shapes), then the decode step.
set -u
F=.gpu-gemv
tar -C $F -xJf $F/bundle.tar.xz
G=$PWD/$F/b
OUT=${OUT:-/tmp/gemv-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
PD_GPU_TEST_MATMUL=1 PD_GPU_TEST_SMALL=1 timeout 25 compute-sanitizer --tool memcheck \
    --error-exitcode 3 $G/bin/test_gpu_kernels > $OUT/memcheck.log 2>&1
echo "memcheck rc $?"; tail -n 3 $OUT/memcheck.log; grep -c PASS $OUT/memcheck.log; grep FAIL $OUT/memcheck.log
timeout 60 $G/bin/gpu_bench decode > $OUT/decode.log 2>&1
echo "decode rc $?"; cat $OUT/decode.log
