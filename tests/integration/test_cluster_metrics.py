"""Issue 14: the metrics of a running cluster (deploy/local.yaml, tiny-llama, CPU).

- `promtool check metrics` (Debian's prometheus package; deploy/install-deps.sh installs it)
  accepts the /metrics of the router and of every node: names, types, units, help. A missing
  promtool fails the test.
- After traffic (completions, an n = 2 request, a cancel, a 400), the KV transfer counters move on
  both sides (prefill: bytes sent; decode: bytes accepted, the same), with seconds and transfer
  counts, and the integrity failures are exported by kind (tag, checksum, token, size).
- deploy/grafana/pdserve.json is valid JSON, and every metric its panels query is exported by the
  router or a node.
Run by meson with /usr/bin/python3; argv[1] is pdctl."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request

from cluster_testlib import (TEMPLATE_1, channel, check, cluster, finish, generate, metric_value,
                             model_template, node_metrics, pb_grpc, sampling, wait_pages_free)

TMP = tempfile.mkdtemp(prefix="pd-test-metrics-")
DASHBOARD = os.path.join(cluster.SOURCE_DIR, "deploy", "grafana", "pdserve.json")


def post_status(c, body):
    req = urllib.request.Request("http://%s/v1/completions" % c.router_http,
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def traffic(c):
    stub = pb_grpc.InferenceStub(channel(c.router_addr))
    for _ in range(2):
        r = generate(stub, text="ROMEO:", sampling=sampling(8, ignore_eos=True))
        check("traffic-grpc", r.code.name == "OK" and len(r.ids) == 8, r.code)
    check("traffic-http", post_status(c, {"prompt": "JULIET:", "max_tokens": 6,
                                          "ignore_eos": True, "n": 2, "logprobs": 1}) == 200)
    check("traffic-400", post_status(c, {"prompt": "a", "max_tokens": 1, "tools": [1]}) == 400)

    def cancel(call, res):
        call.cancel()
    generate(stub, text="ROMEO:", sampling=sampling(500, ignore_eos=True), on_msg=cancel)
    used = wait_pages_free(c)
    check("traffic-pages-free", all(v == 0 for v in used.values()), used)


def promtool(name, text):
    path = shutil.which("promtool")
    if not check("promtool-installed", path is not None,
                 "promtool not found: apt-get install --no-install-recommends prometheus "
                 "(deploy/install-deps.sh)"):
        return
    p = subprocess.run([path, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=60)
    check("promtool-%s" % name, p.returncode == 0 and not p.stdout.strip() and
          not p.stderr.strip(), (p.returncode, p.stdout[-2000:], p.stderr[-2000:]))


def sample_names(text):
    return set(m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))


def main():
    tpl = model_template(TEMPLATE_1, "tiny-llama", TMP)
    with cluster.Cluster(tpl) as c:
        traffic(c)
        texts = {"router": node_metrics({"http": c.router_http})}
        for n in c.nodes:
            if n["role"] in ("prefill", "decode"):
                texts[n["name"]] = node_metrics(n)
        for name, text in texts.items():
            promtool(name, text)
        prefill = next(n["name"] for n in c.nodes if n["role"] == "prefill")
        decode = next(n["name"] for n in c.nodes if n["role"] == "decode")
        sent = metric_value(texts[prefill], "pdserve_node_kv_transfer_bytes_total")
        got = metric_value(texts[decode], "pdserve_node_kv_transfer_bytes_total")
        check("kv-bytes-both-sides", sent and sent > 0 and sent == got, (sent, got))
        for name in (prefill, decode):
            n_tr = metric_value(texts[name], "pdserve_node_kv_transfers_total")
            secs = metric_value(texts[name], "pdserve_node_kv_transfer_seconds_total")
            # 3 prefills (two gRPC, one n = 2) plus the cancelled one, which may end before a put
            check("kv-transfers-%s" % name, n_tr is not None and 3 <= n_tr <= 4 and
                  secs is not None and secs > 0, (n_tr, secs))
            kinds = {k: metric_value(texts[name], "pdserve_node_kv_integrity_failures_total",
                                     kind=k) for k in ("tag", "checksum", "token", "size")}
            check("integrity-kinds-%s" % name, kinds == {k: 0.0 for k in kinds}, kinds)
        exported = set().union(*(sample_names(t) for t in texts.values()))
        try:
            with open(DASHBOARD) as f:
                dash = json.load(f)
        except (OSError, ValueError) as e:
            check("dashboard-json", False, e)
            finish()
        exprs = [t["expr"] for p in dash.get("panels", []) for t in p.get("targets", [])]
        queried = set(m for e in exprs for m in re.findall(r"\b(pdserve_[a-z0-9_]+)\b", e))
        check("dashboard-panels", len(dash["panels"]) >= 8 and len(queried) >= 12,
              (len(dash["panels"]), queried))
        missing = sorted(queried - exported)
        check("dashboard-metrics-exported", not missing, missing)
        # the panels the issue asks for
        for what in ("pdserve_router_generated_tokens_total", "pdserve_router_ttft_seconds_bucket",
                     "pdserve_router_itl_seconds_bucket", "pdserve_node_kv_pages_used",
                     "pdserve_node_kv_integrity_failures_total",
                     "pdserve_node_kv_transfer_bytes_total"):
            check("dashboard-has-%s" % what, what in queried)
    finish()


if __name__ == "__main__":
    main()
