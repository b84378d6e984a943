#!/usr/bin/env python3
"""The seed's experiments (issue 17) against pdserve clusters serving one model, with the standard
library only (the load goes through the router's OpenAI API, SSE streamed), so it runs under any
python3 (the GPU machine's has no grpc tools). Writes raw JSON, then docs/benchmarks.md with
tables and PNG plots (matplotlib; --plot-only JSON redoes the plots and tables elsewhere).

    seed_bench.py --model DIR --out DIR [--backend cuda|cpu] [--experiments a,b,...] [--small]
                  [--bin-dir BUILD/BINS] [--gpus N] [--doc docs/benchmarks.md]
    seed_bench.py --plot-only DIR/results.json --doc docs/benchmarks.md

Experiments (names for --experiments; default: all):
  fp8_kv        1. same decode KV budget, FP8 vs BF16 KV: largest concurrency that fits, peak tok/s
  int4_decode   2. INT4 vs FP8 decode weights at concurrency 1, 8, 16, 32, 64: tok/s and ITL
  int4_prefill  3. INT4 vs FP8 prefill weights: prefill tok/s and TTFT
  tracker       4. tagged vs noop tracker, long prompts: throughput, ITL p50/p99, 3 runs each
  colocated     5. both nodes on one GPU vs split over two (needs --gpus 2)
  kv_transfer   6. KV path (cuda-ipc, ucx-staged): TTFT at 1k, 8k, 32k-token prompts
  overlap       per-layer KV export (PDSERVE_KV_OVERLAP=layer: layer L's pages leave while layer
                L + 1 computes) vs none (pages leave after the whole prompt), CUDA IPC and staged,
                1k / 8k / 32k-token prompts in one chunk; with the prefill node's own split of
                TTFT (compute to the last layer, then the transfer's tail to KV-done): also
                experiment 6's rows
  overlap_chunked  the same at 512-token chunks: layer vs chunk (pages leave after each chunk)
--small shrinks every experiment (fewer requests, shorter outputs, one run) for a quick look.
--deadline-s S: no new cluster is started once fewer than 25 s of S are left (results are saved
after every point, so a cut run keeps what it measured).
"""
import argparse
import json
import math
import os
import random
import statistics
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # a bundle keeps cluster.py beside
import cluster  # noqa: E402

ALL = ["fp8_kv", "int4_decode", "int4_prefill", "tracker", "colocated", "kv_transfer", "overlap",
       "overlap_chunked"]
T0 = time.time()
DEADLINE = [None]  # absolute time.time(); None: none
SAVE = [lambda: None]  # writes results.json (after every point)


def time_left():
    return float("inf") if DEADLINE[0] is None else DEADLINE[0] - time.time()


class OutOfTime(Exception):
    pass


def need(seconds=25):
    if time_left() < seconds:
        raise OutOfTime("deadline: %.0f s left" % time_left())


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# ==== load over the OpenAI API ====

def one_request(http, ids, max_tokens, timeout):
    """Streams one completion; returns (ttft_s, [gap_s...], n_tokens, error)."""
    body = json.dumps({"prompt": ids, "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True}).encode()
    req = urllib.request.Request("http://%s/v1/completions" % http, body,
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, last, gaps, n = None, None, [], 0
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                msg = json.loads(line[6:])
                if "error" in msg:
                    return None, [], n, str(msg["error"])[:200]
                if not msg.get("choices"):
                    continue
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
                n += 1
    except Exception as e:  # noqa: BLE001  a failed request is counted, not fatal
        return None, [], n, str(e)[:200]
    if first is None:
        return None, [], 0, "no tokens"
    return first - t0, gaps, n, None


def load(http, concurrency, n_requests, prompt_len, output_len, vocab, seed=0, timeout=600):
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, vocab) for _ in range(prompt_len)] for _ in range(n_requests)]
    lock = threading.Lock()
    res = {"ttft": [], "itl": [], "tokens": 0, "failed": 0, "errors": []}
    nxt = [0]

    def worker():
        while True:
            with lock:
                if nxt[0] >= n_requests:
                    return
                i = nxt[0]
                nxt[0] += 1
            ttft, gaps, n, err = one_request(http, prompts[i], output_len, timeout)
            with lock:
                if err:
                    res["failed"] += 1
                    res["errors"].append(err)
                else:
                    res["ttft"].append(ttft)
                    res["itl"].extend(gaps)
                    res["tokens"] += n
    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "requests": n_requests, "prompt_len": prompt_len,
            "output_len": output_len, "failed": res["failed"], "errors": res["errors"][:3],
            "wall_s": wall, "tok_s": res["tokens"] / wall,
            "ttft_ms_p50": pct(res["ttft"], 50) * 1e3, "ttft_ms_p99": pct(res["ttft"], 99) * 1e3,
            "itl_ms_p50": pct(res["itl"], 50) * 1e3, "itl_ms_p99": pct(res["itl"], 99) * 1e3}


# ==== clusters ====

def cluster_yaml(path, a, prefill=None, decode=None, transport=None):
    p = {"backend": a.backend, "device": 0, "weights": "fp8", "kv": "bf16", "page_tokens": 16,
         "kv_budget": a.prefill_budget, "max_batch": 64, "prefill_chunk": a.chunk,
         "tracker": "tagged", "threads": 0}
    d = {"backend": a.backend, "device": 0, "weights": "int4", "kv": "fp8", "page_tokens": 16,
         "kv_budget": a.decode_budget, "max_batch": 64, "tracker": "tagged", "threads": 0}
    p.update(prefill or {})
    d.update(decode or {})
    lines = ["model: %s" % os.path.abspath(a.model), "router:", "  listen: 127.0.0.1:50050",
             "  http: 127.0.0.1:50051", "  prefill_policy: round_robin",
             "  decode_policy: least_kv", "  request_timeout_ms: 600000", "  max_queue: 4096",
             "transport:", '  ucx_tls: ""', "  lease_ms: %d" % (transport or {}).get("lease_ms",
                                                                                    120000),
             "nodes:", "  - name: prefill0", "    role: prefill", "    host: 127.0.0.1",
             "    port: 50060", "    http_port: 50061"]
    lines += ["    %s: %s" % kv for kv in p.items()]
    lines += ["  - name: decode0", "    role: decode", "    host: 127.0.0.1", "    port: 50070",
              "    ucx_port: 50071", "    http_port: 50072"]
    lines += ["    %s: %s" % kv for kv in d.items()]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


class Run:
    """One cluster for one configuration: start, load, read /health, stop."""

    def __init__(self, a, name, prefill=None, decode=None, env=None):
        self.a = a
        yaml = cluster_yaml(os.path.join(a.out, name + ".yaml"), a, prefill, decode)
        e = {"PDSERVE_BIN_DIR": a.bin_dir} if a.bin_dir else {}
        e.update(env or {})
        t0 = time.time()
        self.c = cluster.Cluster(yaml, env=e, timeout_s=900, keep_dir=False)
        self.start_s = time.time() - t0
        self.http = "127.0.0.1:%s" % self.c.router_http.rsplit(":", 1)[-1] \
            if self.c.router_http else None
        self.nodes = {n["name"]: n for n in self.c.nodes[1:]}

    def health(self, node):
        port = self.nodes[node]["http_port"]
        with urllib.request.urlopen("http://127.0.0.1:%s/health" % port, timeout=10) as r:
            return json.loads(r.read())

    def metrics(self, node):
        port = self.nodes[node]["http_port"]
        with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10) as r:
            return r.read().decode()

    def counters(self, node):
        """The node's /metrics counters and gauges by name (labels dropped)."""
        out = {}
        for line in self.metrics(node).splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, val = line.rsplit(" ", 1)
            try:
                out[name.split("{", 1)[0]] = float(val)
            except ValueError:
                pass
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.c.stop()
        return False


def vocab_of(model):
    return json.load(open(os.path.join(model, "config.json")))["vocab_size"]


def max_pos(model):
    return json.load(open(os.path.join(model, "config.json")))["max_position_embeddings"]


# ==== experiments ====

def exp_kv_transfer(a, R):
    # "8k" is 8192 - 64 so that a Llama-3 context (8192) holds prompt and output
    lens = [l for l in ([1024, 8128] if a.small else [1024, 8128, 32768])
            if l + 2 <= max_pos(a.model)]
    out = []
    for path, env in (("cuda-ipc", {}), ("ucx-staged", {"PDSERVE_KV_CUDA_IPC": "0"})):
        if a.backend == "cpu" and path == "cuda-ipc":
            continue
        with Run(a, "kv-" + path, env=env) as r:
            for n in lens:
                x = load(r.http, 1, 2 if a.small else 5, n, 2, R["vocab"], seed=n)
                x["path_seen"] = r.health("prefill0").get("kv_path")
                x["path"] = path if a.backend != "cpu" else "ucx-host"
                out.append(x)
                print("kv_transfer", path, n, "ttft p50 %.1f ms" % x["ttft_ms_p50"], flush=True)
    return out


def overlap_point(r, a, R, n, reps, path, mode, chunk):
    """One prompt length on a running cluster: TTFT from the client, and the prefill node's
    split of it (pdserve_node_prefill_compute_seconds / kv_tail_seconds)."""
    load(r.http, 1, 1, n, 2, R["vocab"], seed=n + 99)  # warm-up (scratch growth, first mapping)
    m0 = r.counters("prefill0")
    x = load(r.http, 1, reps, n, 2, R["vocab"], seed=n)
    m1 = r.counters("prefill0")
    d = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in (
        "pdserve_node_prefill_timed_total", "pdserve_node_prefill_compute_seconds_total",
        "pdserve_node_kv_tail_seconds_total", "pdserve_node_kv_transfer_bytes_total")}
    k = d["pdserve_node_prefill_timed_total"] or float("nan")
    x.update({"path": path, "mode": mode, "chunk": chunk,
              "path_seen": r.health("prefill0").get("kv_path"),
              "compute_ms": d["pdserve_node_prefill_compute_seconds_total"] / k * 1e3,
              "tail_ms": d["pdserve_node_kv_tail_seconds_total"] / k * 1e3,
              "kv_mb": d["pdserve_node_kv_transfer_bytes_total"] / k / 1e6})
    x["tail_share"] = x["tail_ms"] / x["ttft_ms_p50"]
    return x


def overlap_runs(a, R, name, configs, lens):
    out = R["experiments"].setdefault(name, [])
    reps = 2 if a.small else 4
    for path, mode, chunk in configs:
        if a.backend == "cpu" and path == "cuda-ipc":
            continue
        need()
        env = {"PDSERVE_KV_OVERLAP": mode}
        if path != "cuda-ipc":
            env["PDSERVE_KV_CUDA_IPC"] = "0"
        with Run(a, "ov-%s-%s-%d" % (path, mode, chunk), prefill={"prefill_chunk": chunk},
                 env=env) as r:
            for n in lens:
                if n + 4 > max_pos(a.model) or time_left() < 8:
                    continue
                x = overlap_point(r, a, R, n, reps, path, mode, chunk)
                out.append(x)
                SAVE[0]()
                print("%s %s %s chunk %d: %d tokens ttft p50 %.1f ms, compute %.1f ms, tail %.1f "
                      "ms (%.0f%%), %.1f MB" % (name, path, mode, chunk, n, x["ttft_ms_p50"],
                                                x["compute_ms"], x["tail_ms"],
                                                100 * x["tail_share"], x["kv_mb"]), flush=True)
    return out


def exp_overlap(a, R):
    lens = [1024, 8192] if a.small else [8192, 1024, 32768]
    big = max(lens)
    return overlap_runs(a, R, "overlap", [("cuda-ipc", "layer", big), ("cuda-ipc", "none", big),
                                          ("ucx-staged", "layer", big),
                                          ("ucx-staged", "none", big)], lens)


def exp_overlap_chunked(a, R):
    return overlap_runs(a, R, "overlap_chunked", [("cuda-ipc", "layer", 512),
                                                  ("cuda-ipc", "chunk", 512),
                                                  ("ucx-staged", "layer", 512),
                                                  ("ucx-staged", "chunk", 512)], [8192])


def exp_fp8_kv(a, R):
    out = R["experiments"].setdefault("fp8_kv", [])
    P, O = (1024, 64) if a.small else (2048, a.decode_out)
    for kv in ("bf16", "fp8"):
        need()
        # a budget whose FP8 concurrency stays under max_batch (the seed: 32 -> 64)
        with Run(a, "kv-" + kv, decode={"kv": kv, "max_batch": 256,
                                        "kv_budget": a.fp8_kv_budget}) as r:
            cap = r.health("decode0")["kv_pages_capacity"]
            per_seq = math.ceil((P + O) / 16)
            conc = max(1, min(256, cap // per_seq))
            x = load(r.http, conc, conc * (1 if a.small else 2), P, O, R["vocab"])
            x.update({"kv": kv, "pages": cap, "max_concurrency": conc})
            out.append(x)
            SAVE[0]()
            print("fp8_kv", kv, conc, "%.1f tok/s" % x["tok_s"], flush=True)
    return out


def exp_int4_decode(a, R):
    out = R["experiments"].setdefault("int4_decode", [])
    concs = [1, 8, 32] if a.small else [1, 8, 16, 32, 64]
    for w in ("fp8", "int4"):
        need()
        with Run(a, "dec-" + w, decode={"weights": w}) as r:
            load(r.http, 8, 8, 128, 4, R["vocab"], seed=7)  # warm-up: graph captures
            for c in concs:
                if time_left() < 6:
                    break
                x = load(r.http, c, c * (1 if a.small else 2), 128, a.decode_out, R["vocab"])
                x["weights"] = w
                out.append(x)
                SAVE[0]()
                print("int4_decode", w, c, "%.1f tok/s" % x["tok_s"], flush=True)
    return out


def exp_int4_prefill(a, R):
    out = R["experiments"].setdefault("int4_prefill", [])
    n = min(4096 if a.small else 8192, max_pos(a.model) - 64)
    for w in ("fp8", "int4"):
        with Run(a, "pre-" + w, prefill={"weights": w}) as r:
            x = load(r.http, 1, 2 if a.small else 4, n, 1, R["vocab"])
            x["weights"] = w
            x["prefill_tok_s"] = n / (x["ttft_ms_p50"] / 1e3)
            out.append(x)
            SAVE[0]()
            print("int4_prefill", w, "ttft %.1f ms" % x["ttft_ms_p50"], flush=True)
    return out


def exp_tracker(a, R):
    out = R["experiments"].setdefault("tracker", [])
    P, O, C, N = (2048, 64, 4, 8) if a.small else (8192, 1000, 8, 16)
    P = min(P, max_pos(a.model) - O - 1)
    runs = 1 if a.small else 3
    for i in range(runs):
        for t in (("tagged", "noop") if i % 2 == 0 else ("noop", "tagged")):
            with Run(a, "trk-" + t, prefill={"tracker": t}, decode={"tracker": t}) as r:
                x = load(r.http, C, N, P, O, R["vocab"], seed=i)
                x.update({"tracker": t, "run": i})
                out.append(x)
                SAVE[0]()
                print("tracker", t, i, "%.1f tok/s" % x["tok_s"], flush=True)
    return out


def exp_colocated(a, R):
    if a.gpus < 2:
        return [{"skipped": "needs 2 GPUs (both nodes on GPU 0 vs GPU 0 / GPU 1); %d lent" %
                 a.gpus}]
    out = []
    for name, dev in (("colocated", 0), ("split", 1)):
        with Run(a, name, decode={"device": dev}) as r:
            x = load(r.http, 8, 16, 2048, 128, R["vocab"])
            x["placement"] = name
            out.append(x)
    return out


EXPS = {"fp8_kv": exp_fp8_kv, "int4_decode": exp_int4_decode, "int4_prefill": exp_int4_prefill,
        "tracker": exp_tracker, "colocated": exp_colocated, "kv_transfer": exp_kv_transfer,
        "overlap": exp_overlap, "overlap_chunked": exp_overlap_chunked}


# ==== report ====

def fmt(v, d=1):
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else ("%.*f" % (d, v))


def tables(R):
    md = []
    meta = R["meta"]
    md.append("Model: %s (%s), backend %s, GPU: %s, date %s, command: `%s`.\n" % (
        meta["model_name"], meta["shape"], meta["backend"], meta["gpu"], meta["date"],
        meta["command"]))
    E = R["experiments"]
    if E.get("kv_transfer"):
        md.append("### 6. KV transfer path: TTFT by prompt length (1 request at a time)\n")
        md.append("| path | prompt tokens | TTFT p50 ms | TTFT p99 ms | path reported by the node |")
        md.append("|---|---:|---:|---:|---|")
        for x in E["kv_transfer"]:
            md.append("| %s | %d | %s | %s | %s |" % (x["path"], x["prompt_len"],
                                                     fmt(x["ttft_ms_p50"]), fmt(x["ttft_ms_p99"]),
                                                     x.get("path_seen")))
        by = {}
        for x in E["kv_transfer"]:
            by.setdefault(x["prompt_len"], {})[x["path"]] = x["ttft_ms_p50"]
        rows = [(n, v) for n, v in sorted(by.items()) if "cuda-ipc" in v and "ucx-staged" in v]
        if rows:
            md.append("\nShare of the staged TTFT that CUDA IPC removes: " + ", ".join(
                "%d tokens %.0f%%" % (n, 100 * (v["ucx-staged"] - v["cuda-ipc"]) / v["ucx-staged"])
                for n, v in rows) + ".\n")
    for name in ("overlap", "overlap_chunked"):
        if not E.get(name):
            continue
        md.append("\n### %s: per-layer KV streaming vs %s (issue 12 / issue 17 item 6)\n" % (
            "Whole prompt in one chunk" if name == "overlap" else "512-token chunks",
            "none" if name == "overlap" else "per-chunk export"))
        md.append("TTFT from the client (1 request at a time, p50 of %s); compute = the prefill "
                  "node's time to the end of the last layer; tail = from there to the KV-done "
                  "sent (what the transfer adds on the prefill side); share = tail / TTFT; "
                  "GB/s = KV bytes / tail.\n" % ("4" if not R["meta"].get("small") else "2"))
        md.append("| path | KV leaves | chunk | prompt tokens | KV MB | TTFT p50 ms | compute ms "
                  "| tail ms | tail share | GB/s over the tail |")
        md.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for x in sorted(E[name], key=lambda x: (x["path"], x["prompt_len"], x["mode"])):
            gbs = x["kv_mb"] / 1e3 / (x["tail_ms"] / 1e3) if x.get("tail_ms") else float("nan")
            md.append("| %s | %s | %d | %d | %s | %s | %s | %s | %s%% | %s |" % (
                x["path"], {"layer": "per layer", "none": "after the prompt",
                            "chunk": "after each chunk"}[x["mode"]], x["chunk"], x["prompt_len"],
                fmt(x["kv_mb"]), fmt(x["ttft_ms_p50"]), fmt(x["compute_ms"]), fmt(x["tail_ms"]),
                fmt(100 * x["tail_share"], 0), fmt(gbs, 2)))
        by = {}
        for x in E[name]:
            by.setdefault((x["path"], x["prompt_len"]), {})[x["mode"]] = x
        rows = []
        for (path, n), v in sorted(by.items()):
            base = v.get("none") or v.get("chunk")
            if "layer" in v and base:
                rows.append("%s %d tokens: TTFT %s → %s ms (%+.0f%%), tail %s → %s ms" % (
                    path, n, fmt(base["ttft_ms_p50"]), fmt(v["layer"]["ttft_ms_p50"]),
                    100 * (v["layer"]["ttft_ms_p50"] / base["ttft_ms_p50"] - 1),
                    fmt(base["tail_ms"]), fmt(v["layer"]["tail_ms"])))
        if rows:
            md.append("\nPer-layer streaming, same run: " + "; ".join(rows) + ".\n")
    if E.get("fp8_kv"):
        md.append("\n### 1. Same decode KV budget: FP8 vs BF16 KV (seed: 32 → 64, +41%)\n")
        md.append("| decode KV | pages | max concurrency | tok/s | ITL p50 ms | failed |")
        md.append("|---|---:|---:|---:|---:|---:|")
        for x in E["fp8_kv"]:
            md.append("| %s | %d | %d | %s | %s | %d |" % (x["kv"], x["pages"],
                                                          x["max_concurrency"], fmt(x["tok_s"]),
                                                          fmt(x["itl_ms_p50"], 2), x["failed"]))
    if E.get("int4_decode"):
        md.append("\n### 2. Decode weights INT4 vs FP8 (seed: +55% at 1, +16% at 64)\n")
        md.append("| weights | concurrency | tok/s | ITL p50 ms | ITL p99 ms |")
        md.append("|---|---:|---:|---:|---:|")
        for x in E["int4_decode"]:
            md.append("| %s | %d | %s | %s | %s |" % (x["weights"], x["concurrency"],
                                                     fmt(x["tok_s"]), fmt(x["itl_ms_p50"], 2),
                                                     fmt(x["itl_ms_p99"], 2)))
    if E.get("int4_prefill"):
        md.append("\n### 3. Prefill weights INT4 vs FP8 (seed: INT4 ~15% slower)\n")
        md.append("| weights | prompt tokens | TTFT p50 ms | prefill tok/s |")
        md.append("|---|---:|---:|---:|")
        for x in E["int4_prefill"]:
            md.append("| %s | %d | %s | %s |" % (x["weights"], x["prompt_len"],
                                                fmt(x["ttft_ms_p50"]), fmt(x["prefill_tok_s"])))
    if E.get("tracker"):
        md.append("\n### 4. Tagged vs noop tracker (seed: < 1% overhead)\n")
        md.append("| tracker | runs | tok/s (mean ± sd) | ITL p50 ms | ITL p99 ms |")
        md.append("|---|---:|---:|---:|---:|")
        for t in ("tagged", "noop"):
            xs = [x for x in E["tracker"] if x["tracker"] == t]
            if xs:
                tp = [x["tok_s"] for x in xs]
                md.append("| %s | %d | %s ± %s | %s | %s |" % (
                    t, len(xs), fmt(statistics.mean(tp)), fmt(statistics.pstdev(tp)),
                    fmt(statistics.mean(x["itl_ms_p50"] for x in xs), 2),
                    fmt(statistics.mean(x["itl_ms_p99"] for x in xs), 2)))
    if E.get("colocated"):
        md.append("\n### 5. Both nodes on one GPU vs split\n")
        for x in E["colocated"]:
            if "skipped" in x:
                md.append("Not measured: %s.\n" % x["skipped"])
            else:
                md.append("- %s: %s tok/s, TTFT p50 %s ms, ITL p50 %s ms" % (
                    x["placement"], fmt(x["tok_s"]), fmt(x["ttft_ms_p50"]),
                    fmt(x["itl_ms_p50"], 2)))
    if R.get("ipc_bench"):
        md.append("\n### KV path bandwidth (tests/bench/kv_ipc_bench, kv_transport_bench)\n")
        md.append("| measurement | GB/s |")
        md.append("|---|---:|")
        for k, v in R["ipc_bench"].items():
            md.append("| %s | %s |" % (k, v))
    return "\n".join(md) + "\n"


def plots(R, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    E = R["experiments"]

    def save(fig, name):
        p = os.path.join(out_dir, name)
        fig.savefig(p, dpi=110, bbox_inches="tight")
        plt.close(fig)
        made.append(name)
    if E.get("kv_transfer"):
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for path in sorted({x["path"] for x in E["kv_transfer"]}):
            xs = [x for x in E["kv_transfer"] if x["path"] == path]
            ax.plot([x["prompt_len"] for x in xs], [x["ttft_ms_p50"] for x in xs], "o-",
                    label=path)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("TTFT p50 (ms)")
        ax.legend()
        ax.set_title("KV transfer path")
        save(fig, "kv_transfer_ttft.png")
    if E.get("int4_decode"):
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for w in ("fp8", "int4"):
            xs = [x for x in E["int4_decode"] if x["weights"] == w]
            ax.plot([x["concurrency"] for x in xs], [x["tok_s"] for x in xs], "o-", label=w)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tok/s")
        ax.legend()
        ax.set_title("decode weights")
        save(fig, "int4_decode.png")
    if E.get("overlap"):
        fig, ax = plt.subplots(figsize=(6, 3.4))
        xs = [x for x in E["overlap"]]
        keys = sorted({(x["path"], x["mode"]) for x in xs})
        lens = sorted({x["prompt_len"] for x in xs})
        w = 0.8 / max(1, len(keys))
        for i, (path, mode) in enumerate(keys):
            for j, n in enumerate(lens):
                p = [x for x in xs if x["path"] == path and x["mode"] == mode
                     and x["prompt_len"] == n]
                if not p:
                    continue
                p = p[0]
                c = p["ttft_ms_p50"]
                ax.bar(j + i * w, p["compute_ms"], w, color="C%d" % i, alpha=0.45)
                ax.bar(j + i * w, p["tail_ms"], w, bottom=p["compute_ms"], color="C%d" % i,
                       hatch="//", label="%s, %s" % (path, mode) if j == 0 else None)
                ax.plot([j + i * w], [c], "k_", markersize=10)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(lens))])
        ax.set_xticklabels(["%dk" % (n // 1024) for n in lens])
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("ms (bar: compute + tail; dash: TTFT)")
        ax.legend(fontsize=7)
        ax.set_title("KV export per layer vs after the prompt")
        save(fig, "overlap_ttft.png")
    if "int4_decode" in E and E["int4_decode"]:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for wf in ("fp8", "int4"):
            xs = [x for x in E["int4_decode"] if x["weights"] == wf]
            ax.plot([x["concurrency"] for x in xs], [x["itl_ms_p50"] for x in xs], "o-",
                    label=wf)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("ITL p50 (ms)")
        ax.legend()
        ax.set_title("decode weights: ITL")
        save(fig, "int4_decode_itl.png")
    for name, key, lab in (("fp8_kv", "kv", "tok_s"), ("int4_prefill", "weights", "ttft_ms_p50")):
        if name in E and E[name]:
            fig, ax = plt.subplots(figsize=(4, 3))
            ax.bar([str(x[key]) for x in E[name]], [x[lab] for x in E[name]])
            ax.set_ylabel(lab)
            ax.set_title(name)
            save(fig, name + ".png")
    return made


def write_doc(R, json_path, doc):
    out_dir = os.path.dirname(os.path.abspath(json_path))
    made = plots(R, out_dir)
    rel = os.path.relpath(out_dir, os.path.dirname(os.path.abspath(doc)))
    text = "# pdserve benchmarks: the seed's experiments\n\n"
    text += "Written by `tests/bench/seed_bench.py`; raw numbers in `%s`.\n\n" % os.path.join(
        rel, os.path.basename(json_path))
    text += tables(R)
    for m in made:
        text += "\n![%s](%s)\n" % (m, os.path.join(rel, m))
    notes = os.path.join(out_dir, "notes.md")  # hand-written reading of the numbers, if any
    if os.path.exists(notes):
        text += "\n" + open(notes).read()
    with open(doc, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description="the seed's experiments on a pdserve cluster")
    ap.add_argument("--model")
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--experiments", default=",".join(ALL))
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--bin-dir", default=os.environ.get("PDSERVE_BIN_DIR"))
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--gpu-name", default="")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--prefill-budget", default="4GiB")
    ap.add_argument("--decode-budget", default="4GiB")
    ap.add_argument("--fp8-kv-budget", default="1GiB", help="decode KV budget of experiment 1")
    ap.add_argument("--ipc-bench", help="JSON lines of kv_ipc_bench / transport figures to add")
    ap.add_argument("--doc", default="docs/benchmarks.md")
    ap.add_argument("--decode-out", type=int, default=128,
                    help="output tokens per request of experiments 1 and 2")
    ap.add_argument("--deadline-s", type=float, help="seconds this run may take in all")
    ap.add_argument("--plot-only")
    a = ap.parse_args()
    if a.plot_only:
        R = json.load(open(a.plot_only))
        write_doc(R, a.plot_only, a.doc)
        return 0
    os.makedirs(a.out, exist_ok=True)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    R = {"meta": {"model_name": cfg.get("pdserve_synth", {}).get("arch", a.model),
                  "shape": "%d layers, hidden %d, %d/%d heads, vocab %d" % (
                      cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
                      cfg["num_key_value_heads"], cfg["vocab_size"]),
                  "backend": a.backend, "gpu": a.gpu_name or a.backend, "small": a.small,
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "command": " ".join(sys.argv)},
         "vocab": cfg["vocab_size"], "experiments": {}}
    if a.ipc_bench and os.path.exists(a.ipc_bench):
        R["ipc_bench"] = json.load(open(a.ipc_bench))
    json_path = os.path.join(a.out, "results.json")
    if a.deadline_s:
        DEADLINE[0] = T0 + a.deadline_s

    def save():
        with open(json_path, "w") as f:
            json.dump(R, f, indent=1)
    SAVE[0] = save
    rc = 0
    for name in a.experiments.split(","):
        t0 = time.time()
        try:
            R["experiments"][name] = EXPS[name](a, R)
        except OutOfTime as e:
            print("seed_bench: %s cut: %s" % (name, e), flush=True)
            R.setdefault("not_run", []).append("%s (cut by the deadline)" % name)
        except Exception as e:  # noqa: BLE001  one experiment failing keeps the others
            print("seed_bench: %s failed: %s" % (name, e), flush=True)
            R["experiments"][name + "_error"] = str(e)[-2000:]
            rc = 1
        print("seed_bench: %s took %.0f s" % (name, time.time() - t0), flush=True)
        with open(json_path, "w") as f:  # after every experiment: nothing lost on a timeout
            json.dump(R, f, indent=1)
    write_doc(R, json_path, a.doc)
    print(tables(R))
    return rc


if __name__ == "__main__":
    sys.exit(main())
