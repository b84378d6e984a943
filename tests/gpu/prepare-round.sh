#!/usr/bin/env bash
# prepare-round.sh ROUND_SCRIPT [BUILD_DIR] : everything a device round needs, in one command on
# this machine (no GPU): builds the CUDA bundle (tests/gpu/build-bundle.sh, every CUDA object
# rebuilt), packs the model fixtures (tests/gpu/slim-tree.sh pack), copies the bundle,
# ROUND_SCRIPT and tests/gpu/round-lib.sh (which it sources) into .gpu-round/ (ignored through
# .git/info/exclude) and drops the fixtures from the index (slim-tree.sh drop: the device tool
# refuses a tree above 64 MiB). Then:
#   run: command "DEADLINE=430 bash .gpu-round/$(basename ROUND_SCRIPT) check",
#        carry [".gpu-round", ".gpu-models/llama-moe.tar.xz"]
# and afterwards `bash tests/gpu/slim-tree.sh restore` (commit only named paths before that).
# BUNDLE_DROP="bin names": leave those binaries out of .gpu-round's bundle (room under the
# carry limit for an A / B binary, as session 25's call s25b needed).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: $0 ROUND_SCRIPT [BUILD_DIR]" >&2; exit 2; }
script=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
B=${2:-$root/build-cuda}
cd "$root"
ex=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$ex")"
grep -qx '/.gpu-round/' "$ex" 2>/dev/null || echo '/.gpu-round/' >>"$ex"
NINJA_JOBS=${NINJA_JOBS:-2} bash tests/gpu/build-bundle.sh "$B"
bash tests/gpu/slim-tree.sh pack
mkdir -p .gpu-round
cp .gpu/bundle.tar.xz "$script" tests/gpu/round-lib.sh .gpu-round/
if [ -n "${BUNDLE_DROP:-}" ]; then
    # BUNDLE_DROP="kv_ipc_bench decode-node ...": binaries the round does not run, left out of
    # its copy of the bundle (the device tool carries at most 64 MiB: room for an A / B binary)
    t=$(mktemp -d)
    tar -C "$t" -xJf .gpu/bundle.tar.xz
    for b in $BUNDLE_DROP; do rm -f "$t/b/bin/$b"; done
    tar -C "$t" -cf - b | xz -T0 -6 >.gpu-round/bundle.tar.xz
    rm -rf "$t"
fi
bash tests/gpu/slim-tree.sh drop
du -sh .gpu-round .gpu-models/llama-moe.tar.xz
