#!/usr/bin/env bash
# seed_bench.sh: the seed's experiments on the GPU machine, one command (issue 17).
#
#   G=DIR OUT=DIR [SMALL=1] [EXPERIMENTS=a,b] [ARCH=llama-3-8b LAYERS=4] [DEADLINE=S] \
#       bash tests/bench/seed_bench.sh
#
# From the repository root (deploy/models/tiny-llama gives the tokenizer), with G holding bin/
# (pdctl router prefill-node decode-node kv_ipc_bench kv_transport_bench, a CUDA build), lib/ and
# ucx/ (tools/collect-libs.sh), seed_bench.py, cluster.py and check_cluster.py. Steps:
#   kvcheck   test_gpu_kernels with PD_GPU_TEST_KV=1: the KV export kernels (whole pages, and the
#             transfer stream's per-layer, scattered form) against the CPU reference
#   ipc       kv_ipc_bench: the CUDA IPC path between two processes (the reader checks the
#             XXH3 chain of the pages as sent; same GPU when one is lent: a device-to-device copy
#             through the handle, not a cross-GPU peer copy) and the staged path's host copies
#   tcp       kv_transport_bench --mode tcp: the staged path's network leg (UCX over TCP loopback)
#   cluster   check_cluster.py: the fixtures through a CUDA cluster (both nodes on GPU 0, so KV
#             goes over CUDA IPC) give the single-process tokens
#   synth     pdctl synth --arch $ARCH --layers $LAYERS --context $CONTEXT
#   bench     seed_bench.py (all experiments, or $EXPERIMENTS; SMALL=1: --small; DEADLINE: the
#             time left, so it stops starting clusters in time) → $OUT/bench/results.json and,
#             where python3 has matplotlib, $OUT/benchmarks.md and PNGs (else render them
#             elsewhere: seed_bench.py --plot-only results.json --doc docs/benchmarks.md)
# TOKENIZER_FROM: a directory with the fixtures' tokenizer.json (default deploy/models/tiny-llama).
# Logs and results go to $OUT; exits 1 when a step failed or the deadline skipped it.
set -uo pipefail
G=${G:-$PWD/.gpu}
OUT=${OUT:-/tmp/pdserve-seed}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$G/ucx PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
export PDSERVE_BIN_DIR=$G/bin PDCTL=$G/bin/pdctl
ARCH=${ARCH:-llama-3-8b}
LAYERS=${LAYERS:-4}
CONTEXT=${CONTEXT:-33024} # max_position_embeddings: room for the 32k-token prompts of experiment 6
MODEL=${MODEL_DIR:-/tmp/pdserve-synth-$ARCH-$LAYERS-$CONTEXT}
steps=${STEPS:-kvcheck ipc tcp cluster synth bench}
TOKENIZER_FROM=${TOKENIZER_FROM:-deploy/models/tiny-llama}
rc=0
step() { # name timeout cmd...
    local name=$1 t=$2; shift 2
    if [ -n "${DEADLINE:-}" ]; then
        local left=$((DEADLINE - SECONDS))
        if [ $left -le 10 ]; then
            echo "=== $name: skipped (deadline)" | tee -a "$OUT/summary.log"
            rc=1
            return
        fi
        [ "$t" -lt $left ] || t=$left
    fi
    echo "=== $name: $*" | tee -a "$OUT/summary.log"
    local t0=$SECONDS
    timeout "$t" "$@" 2>&1 | tee "$OUT/$name.log"
    local r=${PIPESTATUS[0]}
    echo "=== $name: rc $r, $((SECONDS - t0)) s" | tee -a "$OUT/summary.log"
    [ "$r" = 0 ] || rc=1
}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
ngpu=$(nvidia-smi -L | wc -l)
echo "$gpu x $ngpu" | tee "$OUT/gpu.txt"
for s in $steps; do
    case $s in
    kvcheck) PD_GPU_TEST_KV=1 step kvcheck 60 "$G/bin/test_gpu_kernels" ;;
    ipc) step ipc 120 bash -c "'$G/bin/kv_ipc_bench' --pool-mb 2048 --page-kb 1024 \
            --total-mb 8192 --json > '$OUT/ipc.jsonl' && cat '$OUT/ipc.jsonl' &&
            '$G/bin/kv_ipc_bench' --pool-mb 512 --page-kb 64 --total-mb 2048 --json \
            >> '$OUT/ipc.jsonl' && tail -1 '$OUT/ipc.jsonl'" ;;
    tcp) step tcp 120 "$G/bin/kv_transport_bench" --mode tcp --size 1048576 --total-mb 1024 ;;
    cluster) step cluster 300 python3 "$G/check_cluster.py" "$G/bin" --models deploy/models ;;
    synth) [ -f "$MODEL/config.json" ] || step synth 300 "$G/bin/pdctl" synth --arch "$ARCH" \
            --layers "$LAYERS" --context "$CONTEXT" --out "$MODEL" \
            --tokenizer-from "$TOKENIZER_FROM" ;;
    bench)
        python3 - "$OUT" <<'PY'
import json, re, sys
out = sys.argv[1]
r = {}
try:
    for line in open(out + "/ipc.jsonl"):
        x = json.loads(line)
        k = "%d KiB pages" % (x["page_bytes"] >> 10)
        r["cuda ipc, one copy per %s page (%s, reader check %s)" % (k, x["what"], "ok" if x["verified"] else "FAILED")] = "%.1f" % x["ipc_gbs"]
        r["writer checksum: page digests on the GPU of %.2f GB, 8 bytes a page to the host" % (x["checksum_bytes"] / 1e9)] = "%.2f" % (x["checksum_bytes"] / 1e9 / (x["checksum_ms"] / 1e3))
        r["staged leg: device -> pinned host, bulk copies of %.1f GB" % (x["bytes"] / 1e9)] = "%.1f" % x["staged_d2h_gbs"]
        r["staged leg: pinned host -> device, bulk copies of %.1f GB" % (x["bytes"] / 1e9)] = "%.1f" % x["staged_h2d_gbs"]
    m = re.search(r"([0-9.]+) MB/s", open(out + "/tcp.log").read())
    if m:
        r["staged: UCX put over TCP loopback, 1 MiB puts"] = "%.2f" % (float(m.group(1)) / 1e3)
except OSError:
    pass
json.dump(r, open(out + "/paths.json", "w"), indent=1)
PY
        extra=()
        [ -n "${SMALL:-}" ] && extra+=(--small)
        [ -n "${EXPERIMENTS:-}" ] && extra+=(--experiments "$EXPERIMENTS")
        [ -n "${DEADLINE:-}" ] && extra+=(--deadline-s $((DEADLINE - SECONDS - 5)))
        [ -n "${DECODE_OUT:-}" ] && extra+=(--decode-out "$DECODE_OUT")
        step bench "${BENCH_TIMEOUT:-3600}" python3 "$G/seed_bench.py" --model "$MODEL" \
            --out "$OUT/bench" --backend cuda --gpus "$ngpu" --gpu-name "$gpu" \
            --ipc-bench "$OUT/paths.json" --doc "$OUT/benchmarks.md" "${extra[@]}" ;;
    *) echo "unknown step $s"; rc=2 ;;
    esac
done
exit $rc
