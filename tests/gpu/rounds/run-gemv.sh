#!/usr/bin/env bash
# drive.sh: the device round of helper "gemv" (session 4), from the repository root with
# .gpu-gemv/ carried (bundle.tar.xz from tests/gpu/build-bundle.sh of branch h-gemv).
# DEADLINE=S: no step starts after S seconds; each step's timeout is cut to what is left.
set -u
F=.gpu-gemv
tar -C $F -xJf $F/bundle.tar.xz
G=$PWD/$F/b
OUT=${OUT:-/tmp/gemv-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$G/ucx PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
S=$OUT/summary.log
step() { # name timeout cmd...
    local name=$1 t=$2; shift 2
    local left=$((${DEADLINE:-170} - SECONDS))
    if [ $left -le 8 ]; then echo "=== $name: skipped (deadline)" | tee -a $S; return; fi
    [ "$t" -lt $left ] || t=$left
    echo "=== $name: $*" | tee -a $S
    local t0=$SECONDS
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1
    echo "=== $name: rc $?, $((SECONDS - t0)) s" | tee -a $S
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a $S
step kernels 70 env PD_GPU_TEST_MATMUL=1 $G/bin/test_gpu_kernels
tail -n 4 $OUT/kernels.log; grep -c FAIL $OUT/kernels.log
step bench 80 $G/bin/gpu_bench int4 decode
step ncu 40 ncu --clock-control none --kernel-name regex:wgemv --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section InstructionStats \
    env GPU_BENCH_INT4_SHAPES=1 $G/bin/gpu_bench int4
step memcheck 40 env PD_GPU_TEST_MATMUL=1 PD_GPU_TEST_SMALL=1 compute-sanitizer --tool memcheck \
    --error-exitcode 3 $G/bin/test_gpu_kernels
tail -n 3 $OUT/memcheck.log
(tar -xJf .gpu-models/llama-moe.tar.xz || true)
step greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models \
    --kv f32 bf16
tail -n 6 $OUT/greedy.log
step sweep 30 $G/bin/gpu_bench wgemv
step ncu8 30 ncu --clock-control none --kernel-name regex:fp8_mma_cp --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    env GPU_BENCH_INT4_SHAPES=1 $G/bin/gpu_bench int4
cat $S
