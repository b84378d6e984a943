#!/usr/bin/env bash
# Builds pdserve and runs every test (the README's second command). GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# meson finds the CUDA compiler on PATH only; the CUDA backend is built when nvcc is there
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
# PD_CUDA_ARCH=90a (CI sets it): compile the kernels for that list only instead of the default
# five GPU generations (-Dcuda-arch; ~3.5 fewer minutes on 2 cores)
[ -d build ] || meson setup build -Dwerror=true ${PD_CUDA_ARCH:+-Dcuda-arch=$PD_CUDA_ARCH}
ninja -C build
meson test -C build --print-errorlogs "$@"
