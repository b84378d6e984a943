#!/usr/bin/python3
"""gRPC load generator for pdserve's router (pdserve.v1.Inference/Generate), for /usr/bin/python3
with grpcio (Debian's python3-grpcio and python3-grpc-tools).

    loadgen.py --router 127.0.0.1:50050 --concurrency 8 --requests 64 --prompt-len 256 \
               --output-len 64 [--text] [--seed 0] [--json]
    loadgen.py --config-template deploy/local.yaml ...   # starts a cluster itself (cluster.py)

Each of C worker threads sends requests back to back until N were sent. Prompts are random token
ids drawn from a seed (sent as token_ids), or with --text random words (sent as text, so the
router tokenizes). ignore_eos is set so every output has exactly --output-len tokens. Measures
per request the time to first token (TTFT) and the gaps between streamed tokens (inter-token
latency, ITL: a message carrying k tokens counts as k gaps of gap/k), and prints requests,
completed, failed, output tokens, wall time, throughput, TTFT and ITL p50/p99.
"""
import argparse
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cluster  # noqa: E402

import grpc  # noqa: E402

WORDS = ("the king queen lord love death night day sword crown heart blood fair sweet good "
         "noble gentle brother sister father mother speak hear come go make").split()


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def make_prompts(n, prompt_len, seed, vocab, text):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if text:
            out.append(" ".join(rng.choice(WORDS) for _ in range(prompt_len)))
        else:
            out.append([rng.randrange(1, vocab) for _ in range(prompt_len)])
    return out


def run(router, concurrency, n_requests, prompt_len, output_len, seed=0, text=False,
        vocab=None, timeout_s=600.0, temperature=0.0):
    """Runs the load; returns the result dict (see main for the keys)."""
    pb, pb_grpc, _, _ = cluster.gen_stubs()
    channel = grpc.insecure_channel(router, options=[("grpc.max_receive_message_length",
                                                      64 << 20)])
    stub = pb_grpc.InferenceStub(channel)
    if vocab is None:
        try:
            vocab = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=10).vocab_size or 32000
        except grpc.RpcError:
            vocab = 32000
    prompts = make_prompts(n_requests, prompt_len, seed, vocab, text)
    lock = threading.Lock()
    next_i = [0]
    ttft, itl, errors = [], [], {}
    totals = {"completed": 0, "failed": 0, "tokens": 0, "prompt_tokens": 0}

    def one(i):
        sp = pb.SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=temperature,
                               seed=seed + i)
        if text:
            req = pb.GenerateRequest(request_id="lg-%d" % i, text=prompts[i], sampling=sp)
        else:
            req = pb.GenerateRequest(request_id="lg-%d" % i, token_ids=prompts[i], sampling=sp)
        t0 = time.perf_counter()
        last, first, n_tok, my_itl, usage = t0, None, 0, [], None
        try:
            for msg in stub.Generate(req, timeout=timeout_s):
                now = time.perf_counter()
                k = len(msg.token_ids)
                if k:
                    if first is None:
                        first = now - t0
                        if k > 1:
                            my_itl.extend([0.0] * (k - 1))
                    else:
                        my_itl.extend([(now - last) / k] * k)
                    last = now
                    n_tok += k
                if msg.HasField("usage"):
                    usage = msg.usage
            with lock:
                totals["completed"] += 1
                totals["tokens"] += n_tok
                if usage:
                    totals["prompt_tokens"] += usage.prompt_tokens
                if first is not None:
                    ttft.append(first * 1000.0)
                itl.extend(x * 1000.0 for x in my_itl)
                if n_tok != output_len:
                    errors["short output (%d != %d tokens)" % (n_tok, output_len)] = \
                        errors.get("short output (%d != %d tokens)" % (n_tok, output_len), 0) + 1
        except grpc.RpcError as e:
            key = "%s: %s" % (e.code().name, e.details())
            with lock:
                totals["failed"] += 1
                totals["tokens"] += n_tok
                errors[key] = errors.get(key, 0) + 1

    def worker():
        while True:
            with lock:
                i = next_i[0]
                if i >= n_requests:
                    return
                next_i[0] += 1
            one(i)

    t_start = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    channel.close()
    return {
        "router": router,
        "concurrency": concurrency,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "requests": n_requests,
        "completed": totals["completed"],
        "failed": totals["failed"],
        "prompt_tokens": totals["prompt_tokens"],
        "output_tokens": totals["tokens"],
        "wall_s": wall,
        "throughput_tok_s": totals["tokens"] / wall if wall > 0 else 0.0,
        "requests_per_s": totals["completed"] / wall if wall > 0 else 0.0,
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_p99": percentile(ttft, 99),
        "itl_ms_p50": percentile(itl, 50),
        "itl_ms_p99": percentile(itl, 99),
        "errors": errors,
    }


def print_table(r):
    rows = [
        ("requests", "%d" % r["requests"]),
        ("completed", "%d" % r["completed"]),
        ("failed", "%d" % r["failed"]),
        ("output tokens", "%d" % r["output_tokens"]),
        ("wall time", "%.2f s" % r["wall_s"]),
        ("throughput", "%.1f tok/s (%.2f req/s)" % (r["throughput_tok_s"], r["requests_per_s"])),
        ("TTFT p50 / p99", "%.1f / %.1f ms" % (r["ttft_ms_p50"], r["ttft_ms_p99"])),
        ("ITL p50 / p99", "%.2f / %.2f ms" % (r["itl_ms_p50"], r["itl_ms_p99"])),
    ]
    print("loadgen: %s, concurrency %d, prompt %d, output %d tokens" %
          (r["router"], r["concurrency"], r["prompt_len"], r["output_len"]))
    for k, v in rows:
        print("  %-16s %s" % (k, v))
    for k, v in sorted(r["errors"].items()):
        print("  error x%d: %s" % (v, k))


def main(argv=None):
    ap = argparse.ArgumentParser(description="pdserve gRPC load generator")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--router", help="HOST:PORT of a running router")
    g.add_argument("--config-template", help="start a cluster from this YAML (cluster.py) first")
    ap.add_argument("--set", action="append", default=[],
                    help="NODE.KEY=VALUE override for --config-template (e.g. decode0.kv=bf16)")
    ap.add_argument("--concurrency", "-c", type=int, default=4)
    ap.add_argument("--requests", "-n", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--text", action="store_true", help="send random words as text")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=None,
                    help="token id range (default: GetModelInfo's vocab_size)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per-request deadline")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.concurrency < 1 or a.requests < 1 or a.prompt_len < 1 or a.output_len < 1:
        ap.error("--concurrency, --requests, --prompt-len and --output-len must be >= 1")
    c = None
    try:
        router = a.router
        if a.config_template:
            ov = {}
            for s in a.set:
                k, v = s.split("=", 1)
                n, key = k.split(".", 1)
                ov.setdefault(n, {})[key] = v
            c = cluster.Cluster(a.config_template, overrides=ov)
            router = c.router_addr
        r = run(router, a.concurrency, a.requests, a.prompt_len, a.output_len, a.seed, a.text,
                a.vocab, a.timeout_s, a.temperature)
    finally:
        if c:
            c.stop()
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        print_table(r)
    return 0 if r["failed"] == 0 and r["completed"] == r["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
