#!/usr/bin/python3
"""Cluster benchmark (issue 5): throughput, TTFT and inter-token latency p50/p99 for
deploy/local.yaml and deploy/local-2p2d.yaml with the `tagged` tracker and with `noop`, RUNS runs
each (alternating, a fresh cluster per run), and the tag-check overhead with its spread.
Usage: /usr/bin/python3 tests/bench/cluster_bench.py [--runs 3] [-c 16] [-n 64] [--prompt-len 256]
       [--output-len 64] [--configs deploy/local.yaml deploy/local-2p2d.yaml]"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
import loadgen  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("-c", "--concurrency", type=int, default=16)
ap.add_argument("-n", "--requests", type=int, default=64)
ap.add_argument("--prompt-len", type=int, default=256)
ap.add_argument("--output-len", type=int, default=64)
ap.add_argument("--configs", nargs="+", default=["deploy/local.yaml", "deploy/local-2p2d.yaml"])
a = ap.parse_args()

print(f"cluster_bench: {a.requests} requests, concurrency {a.concurrency}, prompt {a.prompt_len}, "
      f"output {a.output_len} tokens (ignore_eos), {a.runs} runs per row, CPU backend\n")
print("| config | tracker | throughput tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | failed |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
summary = {}
for cfg in a.configs:
    names = [l.split(":", 1)[1].strip() for l in open(cfg) if l.strip().startswith("- name:")]
    res = {"tagged": [], "noop": []}
    for run in range(a.runs):
        for tracker in ("tagged", "noop") if run % 2 == 0 else ("noop", "tagged"):
            ov = {n: {"tracker": tracker} for n in names}
            with cluster.Cluster(cfg, overrides=ov) as c:
                r = loadgen.run(c.router_addr, a.concurrency, a.requests, a.prompt_len,
                                a.output_len, seed=run)
            res[tracker].append(r)
    for tracker in ("tagged", "noop"):
        rs = res[tracker]
        m = lambda k: statistics.mean(x[k] for x in rs)  # noqa: E731
        print(f"| {os.path.basename(cfg)} | {tracker} | {m('throughput_tok_s'):.1f} "
              f"± {statistics.pstdev(x['throughput_tok_s'] for x in rs):.1f} | "
              f"{m('ttft_ms_p50'):.1f} | {m('ttft_ms_p99'):.1f} | {m('itl_ms_p50'):.2f} | "
              f"{m('itl_ms_p99'):.2f} | {sum(x['failed'] for x in rs)} |", flush=True)
    t = [x["throughput_tok_s"] for x in res["tagged"]]
    n = [x["throughput_tok_s"] for x in res["noop"]]
    d = [(b - x) / b * 100 for x, b in zip(t, n)]
    summary[cfg] = (statistics.mean(d), statistics.pstdev(d))
print()
for cfg, (mean, sd) in summary.items():
    print(f"tag-check overhead on {os.path.basename(cfg)}: {mean:+.2f}% throughput "
          f"(spread ± {sd:.2f}% over paired runs; positive = tagged slower)")
