"""tests/bench/loadgen.py's OpenAI mode: its statistics on hand-made results (percentiles, TPOT,
goodput under targets, the Poisson arrival process, the length distributions, traces), then one
trace replayed against a tiny-llama CPU cluster (deploy/local.yaml), whose report must add up
with what each request streamed. Standard library only (any python3)."""
import json
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
import cluster  # noqa: E402
import loadgen  # noqa: E402

TEMPLATE = os.path.join(HERE, "..", "..", "deploy", "local.yaml")
failures = []


def check(name, ok, detail=""):
    print("%s %s" % ("ok  " if ok else "FAIL", name))
    if not ok:
        print("     %s" % str(detail)[:2000])
        failures.append(name)


def close(a, b, tol=1e-9):
    return abs(a - b) <= tol * max(1.0, abs(b))


def res(ttft, e2e, n, in_len=10, ok=True):
    """A stream_completion result whose n - 1 gaps are evenly spread after the first token."""
    gaps = [(e2e - ttft) / (n - 1)] * (n - 1) if n > 1 else []
    return {"ok": ok, "error": None if ok else "boom", "ttft_s": ttft if ok else None,
            "itl_s": gaps if ok else [], "e2e_s": e2e, "output_tokens": n if ok else 0,
            "input_len": in_len}


def test_statistics():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    check("percentile-p50", loadgen.percentile(xs, 50) == 3.0)
    check("percentile-p90", close(loadgen.percentile(xs, 90), 4.6))  # 4 + 0.6 * (5 - 4)
    check("percentile-empty", math.isnan(loadgen.percentile([], 50)))
    # three good requests, one slow first token, one slow decode, one failure, over 2 s
    rs = [res(0.100, 1.000, 10), res(0.200, 2.000, 10), res(0.050, 0.500, 10),
          res(0.900, 1.800, 10), res(0.100, 3.700, 10), res(0, 1.0, 0, ok=False)]
    r = loadgen.summarize(rs, 2.0, slo_ttft_ms=500, slo_tpot_ms=250)
    check("summary-counts", r["requests"] == 6 and r["completed"] == 5 and r["failed"] == 1 and
          r["errors"] == {"boom": 1}, r)
    check("summary-throughput", close(r["request_throughput"], 2.5) and
          close(r["output_throughput"], 25.0) and close(r["input_throughput"], 25.0), r)
    # TPOTs: 0.1, 0.2, 0.05, 0.1, 0.4 s -> mean 0.17 s; TTFT mean (0.1+0.2+0.05+0.9+0.1)/5
    check("summary-tpot", close(r["tpot_ms"]["mean"], 170.0) and
          close(r["tpot_ms"]["p50"], 100.0), r["tpot_ms"])
    check("summary-ttft", close(r["ttft_ms"]["mean"], 270.0) and
          close(r["ttft_ms"]["p50"], 100.0), r["ttft_ms"])
    check("summary-itl-count", close(r["itl_ms"]["p50"], 100.0), r["itl_ms"])
    # good: the first three (the 4th misses TTFT 500 ms, the 5th TPOT 250 ms)
    check("goodput", r["good_requests"] == 3 and close(r["goodput_req_s"], 1.5) and
          close(r["goodput_tok_s"], 15.0), r)
    r2 = loadgen.summarize(rs, 2.0)
    check("goodput-no-target", r2["good_requests"] == 5, r2)
    r3 = loadgen.summarize(rs, 2.0, slo_e2e_ms=1000)
    check("goodput-e2e", r3["good_requests"] == 2, r3)  # e2e 1.0 and 0.5 s
    # arrivals: exponential gaps of mean 1 / rate, increasing, seeded
    a = loadgen.poisson_arrivals(20000, 50.0, seed=3)
    mean_gap = a[-1] / (len(a) - 1)
    check("poisson-mean", abs(mean_gap - 0.02) < 0.02 * 0.05, mean_gap)
    gaps = [y - x for x, y in zip(a, a[1:])]
    cv = math.sqrt(sum((g - mean_gap) ** 2 for g in gaps) / len(gaps)) / mean_gap
    check("poisson-cv", abs(cv - 1.0) < 0.05, cv)  # exponential: sd == mean
    check("poisson-seeded", a == loadgen.poisson_arrivals(20000, 50.0, seed=3) and
          a != loadgen.poisson_arrivals(20000, 50.0, seed=4))
    check("poisson-burst", loadgen.poisson_arrivals(4, float("inf")) == [0.0] * 4)
    # distributions and traces
    t = loadgen.make_trace(2000, "uniform:8,40", "normal:100,10", seed=1)
    check("trace-uniform", min(i for i, _ in t) >= 8 and max(i for i, _ in t) <= 40 and
          abs(sum(i for i, _ in t) / len(t) - 24) < 1.0, t[:5])
    check("trace-normal", abs(sum(o for _, o in t) / len(t) - 100) < 1.5, t[:5])
    check("trace-clamp", all(o >= 1 for _, o in loadgen.make_trace(200, "fixed:3",
                                                                   "normal:1,50", seed=2)))
    try:
        loadgen.parse_dist("zipf:1")
        check("dist-refused", False, "zipf accepted")
    except ValueError:
        check("dist-refused", True)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write('{"input_len": 12, "output_len": 3}\n\n{"input_len": 7, "output_len": 5}\n')
    try:
        check("trace-file", loadgen.load_trace(f.name, 5) == [(12, 3), (7, 5), (12, 3), (7, 5),
                                                              (12, 3)])
    finally:
        os.unlink(f.name)


def test_cluster():
    trace = loadgen.make_trace(8, "uniform:5,40", "uniform:2,6", seed=5)
    with cluster.Cluster(TEMPLATE) as c:
        vocab = json.load(open(os.path.join(os.path.dirname(TEMPLATE), "models", "tiny-llama",
                                            "config.json")))["vocab_size"]
        r = loadgen.run_openai(c.router_http, trace, rate=40.0, seed=5, max_concurrency=4,
                               vocab=vocab, timeout_s=120, slo_ttft_ms=60000, slo_tpot_ms=60000)
        want_out = sum(o for _, o in trace)
        check("cluster-completed", r["completed"] == 8 and r["failed"] == 0, r)
        check("cluster-tokens", r["output_tokens"] == want_out and
              r["input_tokens"] == sum(i for i, _ in trace), r)
        check("cluster-order", 0 < r["ttft_ms"]["p50"] <= r["e2e_ms"]["p50"] and
              r["ttft_ms"]["p50"] <= r["ttft_ms"]["p99"] and
              r["itl_ms"]["p50"] <= r["itl_ms"]["p99"], r)
        check("cluster-throughput", close(r["output_throughput"] * r["duration_s"], want_out), r)
        check("cluster-goodput-loose", r["good_requests"] == 8, r)
        # the same replay against a target no request can meet
        r2 = loadgen.run_openai(c.router_http, trace[:3], rate=float("inf"), seed=5, vocab=vocab,
                                timeout_s=120, slo_ttft_ms=0.001)
        check("cluster-goodput-strict", r2["completed"] == 3 and r2["good_requests"] == 0 and
              r2["goodput_req_s"] == 0.0, r2)


def main():
    test_statistics()
    test_cluster()
    if failures:
        print("FAILED: %s" % ", ".join(failures))
        return 1
    print("all loadgen checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
