#!/usr/bin/env bash
# Session 16, call 3: where the GLM-4.5-Air / DeepSeek-V3 INT4 decode steps' time goes now that
# they run in graphs (GPU_BENCH_FAMILY_PROF=1 gpu_bench family: stepprof of 2-layer models, batch
# 1 / 64, context 1024, device greedy).
#   bash tests/gpu/prepare-round.sh tests/gpu/rounds/run-round-s16c.sh
#   DEADLINE=150 bash .gpu-round/run-round-s16c.sh   (carry .gpu-round, .gpu-models/glm-dsv3.tar.xz)
set -uo pipefail
ROUND_DEADLINE=150
. "$(dirname "$0")/round-lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
GPU_BENCH_FAMILY_PROF=1 PD_BENCH_FAMILY_PREFILL=0 st famprof 120 $G/bin/gpu_bench family; tab famprof | head -120
round_end
