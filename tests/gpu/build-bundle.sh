#!/usr/bin/env bash
# build-bundle.sh [BUILD_DIR] : builds the CUDA tree here and packs what tests/gpu/run-on-gpu.sh
# needs on the GPU machine into .gpu/bundle.tar.xz (git-ignored; pass `carry: [".gpu"]` to the
# device tool and start the command with `tar -C .gpu -xJf .gpu/bundle.tar.xz && G=$PWD/.gpu/b
# bash .gpu/b/run-on-gpu.sh STEPS`).
#
# Every CUDA object is rebuilt: Debian 12's meson (1.0) gives nvcc no dependency file, so ninja
# does not rebuild a .cu when a header it includes changes (a struct such as kv_layout_t then has
# two layouts in one binary). An incremental bundle of 2026-12-01 ran attention kernels compiled
# against an older kv_layout_t and failed every bf16 / fp8 attention case on the GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$root/build-cuda}
export PATH=/usr/local/cuda/bin:$PATH
# the H200 only (-Dcuda-arch=90a): the default five architectures would take ~3x the compile time
[ -f "$B/build.ninja" ] || meson setup "$B" "$root" -Dwerror=true -Dcuda-arch=${PD_CUDA_ARCH:-90a}
# KEEP_CU=1: keep the CUDA objects (only when no header that a .cu includes changed since they
# were built: a changed .cu itself is rebuilt by ninja)
[ -n "${KEEP_CU:-}" ] || find "$B" -name '*.cu.o' -delete
ninja -j"${NINJA_JOBS:-2}" -C "$B" router/router prefill-node/prefill-node decode-node/decode-node deploy/pdctl \
    tests/test_gpu_kernels tests/gpu_bench tests/kv_ipc_bench tests/kv_transport_bench
D=$(mktemp -d)/b
mkdir -p "$D/bin"
cp "$B/router/router" "$B/prefill-node/prefill-node" "$B/decode-node/decode-node" \
    "$B/deploy/pdctl" "$B/tests/test_gpu_kernels" "$B/tests/gpu_bench" "$B/tests/kv_ipc_bench" \
    "$B/tests/kv_transport_bench" "$D/bin/"
"$root/../shared/tools/collect-libs.sh" "$D" "$D"/bin/*
# gpu_bench stepprof loads libcupti at run time (tests/bench/stepprof.c): this machine's (CUDA
# 13.0, as there), in case the GPU machine's is not on the loader's path
for c in /usr/local/cuda/lib64/libcupti.so.13 /usr/local/cuda/lib/libcupti.so.13 \
    /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13; do
    [ -f "$c" ] && { cp -L "$c" "$D/lib/"; break; }
done
cp "$root"/tests/gpu/run-on-gpu.sh "$root"/tests/gpu/run-family.sh \
    "$root"/tests/gpu/check_reference.py "$root"/tests/gpu/bf16_kv_transformers.py \
    "$root"/tests/gpu/check_tiktoken.py \
    "$root"/tests/gpu/check_cluster.py "$root"/tests/bench/torch_prefill_baseline.py \
    "$root"/tests/bench/torch_attn_baseline.py "$root"/tests/bench/torch_moe_baseline.py \
    "$root"/tests/bench/seed_bench.py \
    "$root"/tests/bench/seed_bench.sh "$root"/tests/bench/loadgen.py \
    "$root"/tests/integration/cluster.py "$D/"
cp "$root/../shared/bench/torch_decode_baseline.py" "$D/"
cp -r "$root/tests/data/kimi-tiny" "$D/"
mkdir -p "$root/.gpu"
tar -C "$(dirname "$D")" -cJf "$root/.gpu/bundle.tar.xz" b
rm -rf "$(dirname "$D")"
ls -la "$root/.gpu/bundle.tar.xz"
