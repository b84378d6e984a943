#!/usr/bin/env bash
# Session 6, helper "decode" (issue 11): one device call. Run from the repository root on the
# device with .gpu-decode/ (bundle.tar.xz: test_gpu_kernels, gpu_bench, libs, run-on-gpu.sh,
# torch_decode_baseline.py) and .gpu-models/llama-moe.tar.xz carried:
#   DEADLINE=175 bash .gpu-decode/run-decode-s6.sh
# Steps: the harness at fixture shapes (ksmall, with the decode_pdl cases: whole decode step with
# pdl on / off / eager bit for bit), compute-sanitizer memcheck on the decode_pdl and slice-GEMV
# cases, gpu_bench decode with pdl on (batches 1 3 16 64) and off (1 3), the old planner
# (PD_CUDA_W4PLAN=model, pdl off, batch 1: the session-5 state), the PyTorch step, the GEMV sweep
# (gpu_bench xgemv), racecheck / synccheck on decode_pdl if time is left. Logs: $OUT/r.tgz.
set -uo pipefail
F=$PWD/.gpu-decode
tar -C $F -xJf $F/bundle.tar.xz || exit 9
[ -f .gpu-models/llama-moe.tar.xz ] && tar -xJf .gpu-models/llama-moe.tar.xz
G=$F/b
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
export PD_MODELS_DIR=$PWD/deploy/models
L=$OUT/logs; mkdir -p $L
DL=${DEADLINE:-175}
st() { local name=$1 t=$2; shift 2; local left=$((DL - SECONDS)); [ $left -gt 6 ] || { echo "=== $name skipped (deadline)"; return; }
  [ $t -lt $left ] || t=$left; echo "=== $name: $*"; local t0=$SECONDS
  timeout $t "$@" > $L/$name.log 2>&1; echo "=== $name: rc $?, $((SECONDS - t0)) s"; }
res() { echo "  PASS $(grep -c PASS $L/$1.log) FAIL $(grep -c FAIL $L/$1.log)"; grep "FAIL\|ERROR SUMMARY\|cases,\|decode_pdl" $L/$1.log | head -12; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_PDL=1 st pdl 30 $G/bin/test_gpu_kernels; res pdl
PD_GPU_TEST_PDL=1 st memcheck_pdl 40 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; res memcheck_pdl
PD_GPU_TEST_XGEMV=1 PD_GPU_TEST_SMALL=1 st memcheck_x 25 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; res memcheck_x
PD_GPU_TEST_SMALL=1 st ksmall 30 $G/bin/test_gpu_kernels; res ksmall
PD_CUDA_PDL=1 GPU_BENCH_DECODE_BATCHES="1 3 16 64" st decode_on 60 $G/bin/gpu_bench decode; grep "^| " $L/decode_on.log
PD_CUDA_PDL=0 GPU_BENCH_DECODE_BATCHES="1 3" st decode_off 45 $G/bin/gpu_bench decode; grep "^| " $L/decode_off.log
st baseline 40 python3 $G/torch_decode_baseline.py; grep "decode_" $L/baseline.log | tail -12
PD_CUDA_PDL=0 PD_CUDA_W4PLAN=model GPU_BENCH_DECODE_BATCHES="1" st decode_s5 35 $G/bin/gpu_bench decode; grep "^| " $L/decode_s5.log
PD_CUDA_PDL=1 PD_CUDA_W4PLAN=model GPU_BENCH_DECODE_BATCHES="1" st decode_s5pdl 35 $G/bin/gpu_bench decode; grep "^| " $L/decode_s5pdl.log
st xgemv 25 $G/bin/gpu_bench xgemv; grep "^| " $L/xgemv.log | tail -40
PD_GPU_TEST_PDL=1 st racecheck 40 compute-sanitizer --tool racecheck --error-exitcode 3 $G/bin/test_gpu_kernels; res racecheck
PD_GPU_TEST_PDL=1 st synccheck 40 compute-sanitizer --tool synccheck --error-exitcode 3 $G/bin/test_gpu_kernels; res synccheck
tar -C $OUT -czf $OUT/r.tgz logs && rm -rf $L
