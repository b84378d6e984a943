"""A short cluster run for sanitized builds (ASan + UBSan, ThreadSanitizer): router, one prefill
and one decode node of the build under test serve tiny-llama (BF16 weights, f32 KV) over gRPC and
HTTP, with parallel requests, a client cancel mid-stream and a deadline; then every page is free,
the cluster stops with SIGTERM, and no process's log holds a sanitizer report (AddressSanitizer,
LeakSanitizer, UBSan's "runtime error:", ThreadSanitizer). Also part of the normal `cluster`
suite, where it checks the same requests without sanitizers.
Run by meson with /usr/bin/python3; argv[1] is pdctl."""
import json
import os
import re
import tempfile
import threading
import urllib.request

from cluster_testlib import (TEMPLATE_1, all_nodes, channel, check, cluster, finish, generate,
                             model_template, pb, pb_grpc, reference, sampling, wait_pages_free)
import grpc

SANITIZER = re.compile(r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|"
                       r"WARNING: ThreadSanitizer|ThreadSanitizer: reported")


def main():
    tmp = tempfile.mkdtemp(prefix="pd-test-smoke-")
    ref = reference("tiny-llama")
    tpl = model_template(TEMPLATE_1, "tiny-llama", tmp)
    c = cluster.Cluster(tpl, overrides=all_nodes(tpl, weights="bf16", kv="f32"), keep_dir=True,
                        timeout_s=600)
    try:
        stub = pb_grpc.InferenceStub(channel(c.router_addr))
        n = 12
        cases = ref["cases"][:4]
        results = [None] * len(cases)

        def one(i):
            results[i] = generate(stub, timeout=300, token_ids=cases[i]["input_ids"],
                                  sampling=sampling(n, ignore_eos=True))
        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(cases))]
        for t in ts:
            t.start()
        # a client that goes away after its first token, and one whose deadline is too short
        cancelled = threading.Event()

        def on_msg(call, r):
            if not cancelled.is_set():
                cancelled.set()
                call.cancel()
        rc = generate(stub, timeout=300, on_msg=on_msg, token_ids=cases[0]["input_ids"],
                      sampling=sampling(200, ignore_eos=True))
        rd = generate(stub, timeout=0.05, token_ids=cases[1]["input_ids"],
                      sampling=sampling(200, ignore_eos=True))
        for t in ts:
            t.join()
        for i, r in enumerate(results):
            check("grpc-case%d" % i, r.code == grpc.StatusCode.OK and
                  r.ids == cases[i]["greedy_ids"][:n], "%s %s %s" % (r.code, r.details, r.ids))
        check("cancelled", rc.code == grpc.StatusCode.CANCELLED, rc.code)
        check("deadline", rd.code == grpc.StatusCode.DEADLINE_EXCEEDED, rd.code)
        if c.router_http:
            body = json.dumps({"model": "tiny-llama", "prompt": cases[2]["prompt"],
                               "max_tokens": 4}).encode()
            req = urllib.request.Request("http://%s/v1/completions" % c.router_http, data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as resp:
                j = json.loads(resp.read())
            check("http-completion", j["usage"]["completion_tokens"] == 4, j)
        used = wait_pages_free(c, timeout=60)
        check("pages-free", all(v == 0 for v in used.values()), used)
        # every node answers its ops endpoint on its http_port
        for n in c.nodes:
            if n.get("role") not in ("prefill", "decode") or not n.get("http_port"):
                continue
            base = "http://%s:%s" % (n.get("host", "127.0.0.1"), n["http_port"])
            with urllib.request.urlopen(base + "/live", timeout=30) as resp:
                check("%s-live" % n["name"], resp.status == 200)
            with urllib.request.urlopen(base + "/ready", timeout=30) as resp:
                j = json.loads(resp.read())
                check("%s-ready" % n["name"], resp.status == 200 and j["node"] == n["name"], j)
                # CPU pools on both sides: the KV path is ucx-host (kv_path.h), on both nodes
                check("%s-kv-path" % n["name"], j.get("kv_path") == "ucx-host", j)
            with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
                text = resp.read().decode()
                check("%s-metrics" % n["name"], resp.status == 200 and
                      'pdserve_node_kv_pages_capacity{node="%s"' % n["name"] in text and
                      "pdserve_node_integrity_failures_total" in text, text[:800])
                # the control server's and the ops endpoint's listener counters (issue 13):
                # the router holds a control connection, this request is an ops connection
                for lis in ("grpc", "http"):
                    m = re.search(r'^pdserve_listener_connections\{node="%s",listener="%s"\} '
                                  r'(\S+)$' % (n["name"], lis), text, re.M)
                    check("%s-metrics-listener-%s" % (n["name"], lis),
                          m is not None and float(m.group(1)) >= 1 and
                          'pdserve_listener_rejected_total{node="%s",listener="%s"}'
                          % (n["name"], lis) in text, text[:1500])
                m = re.search(r'pdserve_node_kv_pages_written_total\{[^}]*path="ucx-host"\} (\d+)',
                              text)
                written = int(m.group(1)) if m else -1
                # the prefill node counts the pages it wrote; the decode node writes none
                check("%s-kv-pages-written" % n["name"],
                      written > 0 if n.get("role") == "prefill" else written == 0, written)
    finally:
        c.stop()  # pdctl down: SIGTERM, the processes exit and print their sanitizer summaries
    reports = []
    log_dir = c.log_dir
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        text = open(os.path.join(log_dir, name), errors="replace").read()
        for m in SANITIZER.finditer(text):
            start = max(0, m.start() - 200)
            reports.append("%s: %s" % (name, text[start:m.start() + 1500]))
    check("no-sanitizer-reports", not reports, "\n".join(reports)[:6000])
    import shutil
    shutil.rmtree(c.tmp, True)
    finish()


if __name__ == "__main__":
    main()
