#!/usr/bin/env bash
# The next session's first round (prepared in session 8, whose device time ran out): the harness
# at fixture shapes with session 8's last edit (the W4A8 default route's tolerance in case_matmul,
# never run), memcheck, then the full-size harness, which no round has finished since
# int4_gemm=fp8 and moe_gmm3 became the defaults (session 8's full run stopped at its 240 s limit
# with no failure but the int4_gemm=fp8 cases fixed since).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s9.sh
#   DEADLINE=540 bash .gpu-round/run-round-s9.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=540
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_SMALL=1 st ksmall 60 $G/bin/test_gpu_kernels; cases ksmall; grep -E -A1 "int4_gemm=fp8|default GEMM" $L/ksmall.log
PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
st kernels 380 $G/bin/test_gpu_kernels; cases kernels
round_end
