#!/usr/bin/python3
"""Load generator for pdserve's router. gRPC mode (pdserve.v1.Inference/Generate), for /usr/bin/python3
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

OpenAI mode (standard library only, any python3; what vLLM's benchmark_serving and SGLang's
bench_serving do): replays a trace against the router's /v1/completions, streamed (SSE):

    loadgen.py --api openai --http 127.0.0.1:50051 --num-requests 200 \
               --input-dist normal:1024,256 --output-dist uniform:64,512 --rate 8 \
               [--trace trace.jsonl] [--max-concurrency 64] [--slo-ttft-ms 500] \
               [--slo-tpot-ms 50] [--json]

Each request's input and output lengths come from --trace (JSON lines with input_len and
output_len, cycled) or from the distributions (fixed:N, uniform:LO,HI, normal:MEAN,SD,
lognormal:MEDIAN,SIGMA; clamped to >= 1); prompts are random token ids (sent as a list, so the
router does not tokenize), ignore_eos, temperature 0. Arrivals are Poisson at --rate requests/s
(exponential gaps drawn from --seed; inf: all at once), at most --max-concurrency in flight.
Reports, like benchmark_serving: requests completed / failed, duration, request, input and output
throughput, TTFT, TPOT (per request: (end - first token) / (output tokens - 1), the tokens from
the stream's usage chunk), ITL (every gap between streamed text chunks; a chunk may carry more
than one token's text, as the detokenizer holds back partial characters) and end-to-end latency
as mean / p50 / p90 / p95 / p99, and goodput: requests (and their output tokens) per second that
met every target given (TTFT <= --slo-ttft-ms, TPOT <= --slo-tpot-ms, E2E <= --slo-e2e-ms).
"""
import argparse
import json
import math
import os
import random
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # a bundle keeps cluster.py beside
import cluster  # noqa: E402

try:  # the gRPC mode only (Debian's python3-grpcio under /usr/bin/python3)
    import grpc  # noqa: E402
except ImportError:  # the OpenAI mode needs the standard library alone
    grpc = None

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


# ==== OpenAI mode: trace replay with Poisson arrivals ====

def parse_dist(spec):
    """'fixed:N' | 'uniform:LO,HI' | 'normal:MEAN,SD' | 'lognormal:MEDIAN,SIGMA' -> (kind, args)."""
    kind, _, rest = spec.partition(":")
    args = [float(x) for x in rest.split(",")] if rest else []
    want = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}
    if kind not in want or len(args) != want[kind]:
        raise ValueError("bad length distribution %r (fixed:N, uniform:LO,HI, normal:MEAN,SD, "
                         "lognormal:MEDIAN,SIGMA)" % spec)
    if kind == "uniform" and args[1] < args[0]:
        raise ValueError("uniform:LO,HI needs LO <= HI")
    return kind, args


def draw(rng, dist):
    kind, a = dist
    if kind == "fixed":
        v = a[0]
    elif kind == "uniform":
        v = rng.randint(int(a[0]), int(a[1]))
    elif kind == "normal":
        v = rng.gauss(a[0], a[1])
    else:
        v = a[0] * math.exp(rng.gauss(0.0, a[1]))
    return max(1, int(round(v)))


def make_trace(n, input_dist, output_dist, seed=0):
    """n (input_len, output_len) pairs drawn from the two distributions."""
    rng = random.Random(seed)
    i, o = parse_dist(input_dist), parse_dist(output_dist)
    return [(draw(rng, i), draw(rng, o)) for _ in range(n)]


def load_trace(path, n=None):
    """(input_len, output_len) pairs from JSON lines {"input_len": I, "output_len": O}, cycled
    to n entries when n is given."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                x = json.loads(line)
                rows.append((max(1, int(x["input_len"])), max(1, int(x["output_len"]))))
    if not rows:
        raise ValueError("%s: empty trace" % path)
    return rows if n is None else [rows[k % len(rows)] for k in range(n)]


def poisson_arrivals(n, rate, seed=0):
    """Arrival offsets (s) of n requests: cumulative exponential gaps of mean 1 / rate (rate inf
    or <= 0: all at 0)."""
    if not rate or rate <= 0 or math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed ^ 0x5EED)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def stream_completion(http, prompt_ids, max_tokens, timeout_s=600.0, model=None):
    """One streamed /v1/completions request. Returns a dict: ok, error, ttft_s, itl_s (list of
    gaps), e2e_s, output_tokens."""
    body = {"prompt": prompt_ids, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    req = urllib.request.Request("http://%s/v1/completions" % http, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = last = None
    itl, chunks, usage, err = [], 0, None, None
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            for line in r:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                msg = json.loads(line[6:])
                if "error" in msg:
                    err = str(msg["error"])[:200]
                    break
                if msg.get("usage"):
                    usage = msg["usage"]
                ch = msg.get("choices") or []
                if not ch or not ch[0].get("text"):
                    continue  # the usage chunk, the finish_reason chunk
                # a chunk carries the text of one token or more (the detokenizer holds back
                # partial characters): as benchmark_serving does, ITL is the gap between chunks
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    itl.append(now - last)
                last = now
                chunks += 1
    except Exception as e:  # noqa: BLE001  a failed request is counted, not fatal
        err = str(e)[:200]
    end = time.perf_counter()
    if err is None and first is None:
        err = "no tokens"
    n = usage.get("completion_tokens", chunks) if usage else chunks
    return {"ok": err is None, "error": err, "ttft_s": None if first is None else first - t0,
            "itl_s": itl, "e2e_s": end - t0, "output_tokens": n, "chunks": chunks}


def stats_ms(xs_s):
    """mean / p50 / p90 / p95 / p99 in ms of a list of seconds (NaN when empty)."""
    ms = [x * 1e3 for x in xs_s]
    return {"mean": sum(ms) / len(ms) if ms else float("nan"),
            "p50": percentile(ms, 50), "p90": percentile(ms, 90), "p95": percentile(ms, 95),
            "p99": percentile(ms, 99)}


def tpot_s(r):
    """Time per output token after the first: (e2e - ttft) / (n - 1); None for n < 2."""
    if not r["ok"] or r["output_tokens"] < 2:
        return None
    return (r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1)


def summarize(results, duration_s, slo_ttft_ms=None, slo_tpot_ms=None, slo_e2e_ms=None):
    """The report of a run: results are stream_completion dicts with input_len added."""
    ok = [r for r in results if r["ok"]]
    tpots = [t for t in (tpot_s(r) for r in ok) if t is not None]

    def good(r):
        if slo_ttft_ms is not None and r["ttft_s"] * 1e3 > slo_ttft_ms:
            return False
        t = tpot_s(r)
        if slo_tpot_ms is not None and t is not None and t * 1e3 > slo_tpot_ms:
            return False
        return slo_e2e_ms is None or r["e2e_s"] * 1e3 <= slo_e2e_ms
    g = [r for r in ok if good(r)]
    d = duration_s if duration_s > 0 else float("nan")
    out_tok = sum(r["output_tokens"] for r in ok)
    errors = {}
    for r in results:
        if not r["ok"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    return {
        "requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "input_tokens": sum(r["input_len"] for r in ok), "output_tokens": out_tok,
        "request_throughput": len(ok) / d,
        "input_throughput": sum(r["input_len"] for r in ok) / d,
        "output_throughput": out_tok / d,
        "ttft_ms": stats_ms([r["ttft_s"] for r in ok]),
        "tpot_ms": stats_ms(tpots),
        "itl_ms": stats_ms([x for r in ok for x in r["itl_s"]]),
        "e2e_ms": stats_ms([r["e2e_s"] for r in ok]),
        "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms, "e2e_ms": slo_e2e_ms},
        "good_requests": len(g),
        "goodput_req_s": len(g) / d,
        "goodput_tok_s": sum(r["output_tokens"] for r in g) / d,
        "errors": errors,
    }


def run_openai(http, trace, rate=float("inf"), seed=0, max_concurrency=None, vocab=32000,
               timeout_s=600.0, slo_ttft_ms=None, slo_tpot_ms=None, slo_e2e_ms=None,
               model=None):
    """Replays trace [(input_len, output_len)] with Poisson arrivals at rate against
    http (HOST:PORT of the router's OpenAI API); returns summarize()'s report."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, vocab) for _ in range(i)] for i, _ in trace]
    arrivals = poisson_arrivals(len(trace), rate, seed)
    sem = threading.Semaphore(max_concurrency) if max_concurrency else None
    results = [None] * len(trace)

    def one(k):
        try:
            r = stream_completion(http, prompts[k], trace[k][1], timeout_s, model)
        finally:
            if sem:
                sem.release()
        r["input_len"] = trace[k][0]
        results[k] = r
    threads = []
    t0 = time.perf_counter()
    for k, at in enumerate(arrivals):
        wait = t0 + at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)  # the arrival process itself, not a wait for a result
        if sem:
            sem.acquire()
        t = threading.Thread(target=one, args=(k,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    rep = summarize(results, time.perf_counter() - t0, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms)
    rep.update({"http": http, "rate": rate, "max_concurrency": max_concurrency, "seed": seed})
    return rep


def print_openai(r):
    print("loadgen (openai): %s, %d requests at %s req/s%s" % (
        r["http"], r["requests"], r["rate"],
        ", at most %d in flight" % r["max_concurrency"] if r["max_concurrency"] else ""))
    print("  %-24s %d / %d failed" % ("completed", r["completed"], r["failed"]))
    print("  %-24s %.2f s" % ("duration", r["duration_s"]))
    print("  %-24s %.2f req/s, %.1f input tok/s, %.1f output tok/s" % (
        "throughput", r["request_throughput"], r["input_throughput"], r["output_throughput"]))
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        x = r[k]
        print("  %-24s mean %.2f  p50 %.2f  p90 %.2f  p95 %.2f  p99 %.2f" % (
            k.replace("_ms", " (ms)"), x["mean"], x["p50"], x["p90"], x["p95"], x["p99"]))
    slo = ", ".join("%s <= %g" % (k, v) for k, v in r["slo"].items() if v is not None)
    print("  %-24s %d good requests: %.2f req/s, %.1f tok/s (%s)" % (
        "goodput", r["good_requests"], r["goodput_req_s"], r["goodput_tok_s"], slo or "no target"))
    for k, v in sorted(r["errors"].items()):
        print("  error x%d: %s" % (v, k))


def main(argv=None):
    ap = argparse.ArgumentParser(description="pdserve load generator (gRPC, or OpenAI trace "
                                 "replay)")
    ap.add_argument("--api", choices=["grpc", "openai"], default="grpc")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--router", help="HOST:PORT of a running router")
    g.add_argument("--http", help="openai: HOST:PORT of a running router's OpenAI API")
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
    o = ap.add_argument_group("openai mode")
    o.add_argument("--num-requests", type=int, default=100)
    o.add_argument("--trace", help="JSON lines of input_len / output_len (cycled)")
    o.add_argument("--input-dist", default="fixed:256", help="fixed:N | uniform:LO,HI | "
                   "normal:MEAN,SD | lognormal:MEDIAN,SIGMA")
    o.add_argument("--output-dist", default="fixed:64")
    o.add_argument("--rate", type=float, default=float("inf"), help="Poisson arrivals, req/s")
    o.add_argument("--max-concurrency", type=int)
    o.add_argument("--slo-ttft-ms", type=float)
    o.add_argument("--slo-tpot-ms", type=float)
    o.add_argument("--slo-e2e-ms", type=float)
    o.add_argument("--model", help="the model name sent (default: none)")
    a = ap.parse_args(argv)
    if a.api == "openai":
        return main_openai(ap, a)
    if grpc is None:
        ap.error("--api grpc needs grpcio (run with /usr/bin/python3)")
    if a.http:
        ap.error("--http is for --api openai")
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


def main_openai(ap, a):
    if a.router:
        ap.error("--api openai takes --http HOST:PORT (the router's OpenAI API)")
    if a.num_requests < 1 or (a.max_concurrency is not None and a.max_concurrency < 1):
        ap.error("--num-requests and --max-concurrency must be >= 1")
    try:
        trace = load_trace(a.trace, a.num_requests) if a.trace else make_trace(
            a.num_requests, a.input_dist, a.output_dist, a.seed)
    except (OSError, ValueError, KeyError) as e:
        ap.error(str(e))
    c = None
    try:
        http = a.http
        if a.config_template:
            ov = {}
            for s in a.set:
                k, v = s.split("=", 1)
                n, key = k.split(".", 1)
                ov.setdefault(n, {})[key] = v
            c = cluster.Cluster(a.config_template, overrides=ov)
            http = c.router_http
        vocab = a.vocab or 32000
        r = run_openai(http, trace, a.rate, a.seed, a.max_concurrency, vocab, a.timeout_s,
                       a.slo_ttft_ms, a.slo_tpot_ms, a.slo_e2e_ms, a.model)
    finally:
        if c:
            c.stop()
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        print_openai(r)
    return 0 if r["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
