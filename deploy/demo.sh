#!/usr/bin/env bash
# The README's first command: installs the dependencies (apt), builds, starts the local cluster
# (deploy/local.yaml: one router, one prefill node, one decode node, the built-in tiny-llama
# model), serves a request over gRPC and one over the OpenAI HTTP API, shows the health table,
# and stops the cluster. KEEP=1 leaves the cluster running (stop it with
# `build/deploy/pdctl down --config deploy/local.yaml`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
[ -d build ] || meson setup build
ninja -C build
pdctl=build/deploy/pdctl
$pdctl up --config deploy/local.yaml --detach
[ "${KEEP:-0}" = 1 ] || trap '$pdctl down --config deploy/local.yaml' EXIT
$pdctl health --config deploy/local.yaml
echo; echo "== gRPC Generate (pdserve.v1.Inference) through router -> prefill -> UCX -> decode:"
$pdctl generate --router 127.0.0.1:50050 --max-tokens 48 \
    --prompt "First Citizen:
Before we proceed any further, hear me speak."
echo; echo "== OpenAI /v1/completions:"
if command -v curl >/dev/null; then
    curl -s http://127.0.0.1:50051/v1/completions \
        -d '{"prompt": "ROMEO:", "max_tokens": 24, "temperature": 0}'
    echo
fi
