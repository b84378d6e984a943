#!/usr/bin/env bash
# Session 6, the merged round's second call (lead): moe_gmm2 made the default and the bf16 page
# check of rope_wr_bf16 widened for k rotations that cancel to ~0 (the first call failed 3 of
# 16.7 M elements at 8B n 8192). Run with .gpu-round/ and .gpu-models/llama-moe.tar.xz carried:
#   DEADLINE=300 bash .gpu-round/run-round-s6b.sh
set -uo pipefail
F=$PWD/.gpu-round
tar -C $F -xJf $F/bundle.tar.xz || exit 9
tar -xJf .gpu-models/llama-moe.tar.xz || exit 9
G=$F/b
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
export UCX_MODULE_DIR=$G/ucx PD_MODELS_DIR=$PWD/deploy/models
L=$OUT/logs; mkdir -p $L
DL=${DEADLINE:-300}
rc=0
st() { local name=$1 t=$2; shift 2; local left=$((DL - SECONDS))
  [ $left -gt 6 ] || { echo "=== $name skipped (deadline)"; rc=1; return; }
  [ $t -lt $left ] || t=$left; echo "=== $name: $*"; local t0=$SECONDS
  timeout $t "$@" > $L/$name.log 2>&1; local r=$?
  echo "=== $name: rc $r, $((SECONDS - t0)) s"; [ $r = 0 ] || rc=1; }
cases() { grep -E "cases,|ERROR SUMMARY|FAIL" $L/$1.log | head -12; }
PD_GPU_TEST_PREFILL=1 st prefill_cases 60 $G/bin/test_gpu_kernels; cases prefill_cases; grep rope_wr $L/prefill_cases.log | grep "8B bf16"
PD_GPU_TEST_MOE=1 st moe_cases 60 $G/bin/test_gpu_kernels; cases moe_cases
PD_GPU_TEST_MOE=1 PD_GPU_TEST_SMALL=1 st moe_memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases moe_memcheck
st greedy 60 python3 $G/check_reference.py greedy --pdctl $G/bin/pdctl --models deploy/models --kv f32 bf16 --jobs 4; tail -6 $L/greedy.log
st cluster 60 python3 $G/check_cluster.py $G/bin --models deploy/models; grep -i "identical\|failures" $L/cluster.log
st moe 60 $G/bin/gpu_bench moe; grep "^| " $L/moe.log
PD_GPU_FLASH_VARIANTS=6 st kernels 200 $G/bin/test_gpu_kernels; cases kernels
tar -C $OUT -czf $OUT/r.tgz logs && rm -rf $L
exit $rc
