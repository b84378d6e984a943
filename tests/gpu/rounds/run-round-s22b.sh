#!/usr/bin/env bash
# Session 22's second call (little budget left): the decode step with the new defaults (w4wg
# clusters on), the FP8 step with matmul_w8wg routed only for weights of at most 4096 rows
# (PD_CUDA_W8WG=17 PD_CUDA_W8WG_ROWS=4096: o, down and the separate q / k / v, where gpu_bench
# w8wg measured it faster than cuBLASLt) against the default, the w8wg cases (6 / 8 splits, the
# decode tolerance), the whole kernel harness at fixture shapes (the full-size run of call s22a
# was cut at 220 s in the attention cases), memcheck of the w4wg cases.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s22b.sh
#   DEADLINE=380 bash .gpu-round/run-round-s22b.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=380
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
GPU_BENCH_DECODE_BATCHES="1 64" st decode 45 $G/bin/gpu_bench decode; tab decode
PD_CUDA_W8WG=17 PD_CUDA_W8WG_ROWS=4096 GPU_BENCH_DECODE_BATCHES="32 64" st decode_w8r 40 $G/bin/gpu_bench decode; tab decode_w8r
PD_GPU_TEST_W8WG=1 st kw8 40 $G/bin/test_gpu_kernels; cases kw8
PD_GPU_TEST_SMALL=1 st kernels 200 $G/bin/test_gpu_kernels; cases kernels
PD_GPU_TEST_W4WG=1 PD_GPU_TEST_SMALL=1 st mcw4 40 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases mcw4
round_end
