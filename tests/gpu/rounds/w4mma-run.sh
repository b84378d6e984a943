#!/usr/bin/env bash
# w4mma-run.sh G OUT: the session-6 "w4mma" device round (matmul_int4_mma2, issue 11) in one call:
# its harness cases under compute-sanitizer memcheck (fixture shapes) and at the 8B shapes, the
# `gpu_bench w4mma` table, `gpu_bench decode` at batch 16 / 64 with the old routing and with
# PD_CUDA_INT4_MMA2=1, and ncu of the mma2 / mma / fp8 kernels at n 64 on the 28672 x 4096
# gate_up. G: the unpacked bundle (bin/, lib/); logs go to OUT/*.log.
G=$1
O=$2
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t() {
    local name=$1 lim=$2
    shift 2
    local t0=$SECONDS
    timeout "$lim" "$@" >"$O/$name.log" 2>&1
    echo "rc $? in $((SECONDS - t0)) s" >>"$O/$name.log"
    echo "$name: $(tail -1 "$O/$name.log")"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv >"$O/gpu.log" 2>&1
PD_GPU_TEST_MMA2=1 PD_GPU_TEST_SMALL=1 PD_TEST_SEED=1 t memcheck 40 \
    compute-sanitizer --tool memcheck --error-exitcode 3 "$G/bin/test_gpu_kernels"
PD_GPU_TEST_MMA2=1 PD_TEST_SEED=1 t harness 60 "$G/bin/test_gpu_kernels"
t w4mma 45 "$G/bin/gpu_bench" w4mma
GPU_BENCH_DECODE_BATCHES="16 64" t decode-old 40 "$G/bin/gpu_bench" decode
PD_CUDA_INT4_MMA2=1 GPU_BENCH_DECODE_BATCHES="16 64" t decode-new 40 "$G/bin/gpu_bench" decode
GPU_BENCH_INT4_SHAPES=1 GPU_BENCH_W4MMA_N=64 GPU_BENCH_W4MMA_ONCE=1 t ncu 45 ncu --clock-control none \
    --kernel-name-base demangled --kernel-name "regex:int4_mma_cp|fp8_mma_cp" --launch-count 3 \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section ComputeWorkloadAnalysis "$G/bin/gpu_bench" w4mma
