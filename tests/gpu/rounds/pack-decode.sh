#!/usr/bin/env bash
# pack-decode.sh BUILD_DIR: the two binaries of tests/gpu/rounds/run-decode-s6.sh (test_gpu_kernels,
# gpu_bench) with their libraries and the PyTorch step into .gpu/bundle.tar.xz (helper "decode",
# session 6; build them first: ninja -C BUILD_DIR tests/test_gpu_kernels tests/gpu_bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$root/build-cuda}
D=$(mktemp -d)/b
mkdir -p "$D/bin"
cp "$B/tests/test_gpu_kernels" "$B/tests/gpu_bench" "$D/bin/"
"$root/../shared/tools/collect-libs.sh" "$D" "$D"/bin/*
cp "$root/tests/gpu/run-on-gpu.sh" "$root/../shared/bench/torch_decode_baseline.py" "$D/"
mkdir -p "$root/.gpu"
tar -C "$(dirname "$D")" -cJf "$root/.gpu/bundle.tar.xz" b
rm -rf "$(dirname "$D")"
