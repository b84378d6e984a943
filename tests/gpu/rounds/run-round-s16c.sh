#!/usr/bin/env bash
# Session 16, call 3 (not run in session 16: no device time left): the tiled MLA attention kernel
# (family_mla_tile, PD_CUDA_MLA_TILE=1: 8 heads per block share 32-token tiles of latents in
# shared memory; built blind, off by default) checked and timed, and where the GLM-4.5-Air /
# DeepSeek-V3 INT4 decode steps' time goes now that they run in graphs.
#  - the family harness (every latent_attention case runs both kernels) and memcheck on it;
#  - gpu_bench family with the untiled and the tiled kernel (decode eager / graph);
#  - GPU_BENCH_FAMILY_PROF=1 gpu_bench family: stepprof of the 2-layer INT4 steps, batch 1 / 64,
#    both kernels.
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s16c.sh
#   DEADLINE=300 bash .gpu-round/run-round-s16c.sh   (carry .gpu-round, .gpu-models/glm-dsv3.tar.xz)
set -uo pipefail
ROUND_DEADLINE=300
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PD_GPU_TEST_FAMILY=1 st kfam 90 $G/bin/test_gpu_kernels; cases kfam; grep -E "latent_attn" $L/kfam.log
PD_GPU_TEST_FAMILY=1 PD_GPU_TEST_SMALL=1 st memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 $G/bin/test_gpu_kernels; cases memcheck
for t in 0 1; do PD_CUDA_MLA_TILE=$t PD_BENCH_FAMILY_PREFILL=0 st family_t$t 60 $G/bin/gpu_bench family; tab family_t$t; done
for t in 0 1; do PD_CUDA_MLA_TILE=$t GPU_BENCH_FAMILY_PROF=1 st famprof_t$t 60 $G/bin/gpu_bench family; tab famprof_t$t | head -60; done
round_end
