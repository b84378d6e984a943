#!/usr/bin/env bash
# Builds pdserve and runs every test (the README's second command). GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d build ] || meson setup build -Dwerror=true
ninja -C build
meson test -C build --print-errorlogs "$@"
