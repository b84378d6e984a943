#!/usr/bin/env bash
# call 2 (helper gemv, session 5): slice-GEMV cases + memcheck, per-op sweep, decode (new and
# session-4 routing) with the PyTorch step, ncu on the new kernels, an INT4 / FP8 tiny-llama e2e
# (run from the repository root on the device with .gpu-gemv/bundle.tar.xz and
# .gpu-models/llama-moe.tar.xz carried; `run` was given
# `DEADLINE=285 bash .gpu-gemv/drive2.sh 2>&1 | tee $OUT/drive2.out`)
set -uo pipefail
F=$PWD/.gpu-gemv
tar -C $F -xJf $F/bundle.tar.xz || exit 9
G=$F/b
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
DL=${DEADLINE:-290}
st() { local name=$1 t=$2; shift 2; local left=$((DL - SECONDS)); [ $left -gt 8 ] || { echo "=== $name skipped (deadline)"; return; }
  [ $t -lt $left ] || t=$left; echo "=== $name: $*"; local t0=$SECONDS
  timeout $t "$@" > $OUT/$name.log 2>&1; echo "=== $name: rc $?, $((SECONDS - t0)) s"; }
res() { echo "  PASS $(grep -c PASS $OUT/$1.log) FAIL $(grep -c FAIL $OUT/$1.log)"; grep "FAIL\|ERROR SUMMARY\|cases," $OUT/$1.log | head -8; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_XGEMV=1 PD_GPU_TEST_SMALL=1 st xsmall 30 $G/bin/test_gpu_kernels; res xsmall
PD_GPU_TEST_MATMUL=1 PD_GPU_TEST_SMALL=1 st memcheck 40 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; res memcheck
st xgemv 70 $G/bin/gpu_bench xgemv; grep "^| " $OUT/xgemv.log | tail -33
GPU_BENCH_DECODE_BATCHES="1 8 64" st decode 100 $G/bin/gpu_bench decode; grep "^| " $OUT/decode.log
st baseline 110 python3 $G/torch_decode_baseline.py; grep "decode_" $OUT/baseline.log | tail -12
st xfull 60 env PD_GPU_TEST_XGEMV=1 $G/bin/test_gpu_kernels; res xfull
PD_CUDA_XGEMV=0 GPU_BENCH_DECODE_BATCHES="1 8" st decode_s4 70 $G/bin/gpu_bench decode; grep "^| " $OUT/decode_s4.log
for k in w4gemv w8gemv; do
  GPU_BENCH_XGEMV_SHAPES=1 GPU_BENCH_XGEMV_NOSWEEP=1 st ncu_$k 40 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:matmul__$k" --launch-skip 5 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis $G/bin/gpu_bench xgemv
  grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issued Ipc|Block Size|Grid Size|Dynamic Shared" $OUT/ncu_$k.log | head -14
done
if [ -f .gpu-models/llama-moe.tar.xz ] && [ $((DL - SECONDS)) -gt 20 ]; then
  tar -xJf .gpu-models/llama-moe.tar.xz
  for w in int4 fp8; do for x in 1 0; do
    PD_CUDA_XGEMV=$x timeout 20 $G/bin/pdctl generate --model deploy/models/tiny-llama --prompt "The history of the city begins" --max-tokens 48 --json --ignore-eos --kv bf16 --weights $w --backend cuda > $OUT/e2e_${w}_$x.json 2>/dev/null
    echo "e2e $w xgemv=$x: $(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['output_ids'])" $OUT/e2e_${w}_$x.json 2>&1 | cut -c1-400)"
  done; done > $OUT/e2e.log
  cat $OUT/e2e.log; rm -f $OUT/e2e_*.json
fi
for f in $OUT/*.log; do echo "======== $(basename $f)"; cat $f; done > $OUT/all.txt && rm -f $OUT/*.log
