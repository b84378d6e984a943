#!/usr/bin/env bash
# Session 11, call 7: the harness after its weight helper was shared (weight_host_new: five cases
# drew their random weights with the same code): every case at fixture shapes, under memcheck,
# and the w4wg / grouped cases at full size.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s11g.sh
#   DEADLINE=150 bash .gpu-round/run-round-s11g.sh   (carry .gpu-round, .gpu-models/llama-moe.tar.xz)
set -uo pipefail
ROUND_DEADLINE=150
. "$(dirname "$0")/round-lib.sh"
PD_GPU_TEST_SMALL=1 st ksmall 60 $G/bin/test_gpu_kernels; cases ksmall
PD_GPU_TEST_SMALL=1 st memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
PD_GPU_TEST_W4WG=1 st kw4wg 60 $G/bin/test_gpu_kernels; cases kw4wg
round_end
