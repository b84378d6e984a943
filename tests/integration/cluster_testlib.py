"""Helpers shared by the real-cluster tests (test_router_generate.py, test_cluster_*.py): checks,
Generate calls that collect a whole stream, node Stats, the single-process pdctl pipeline and
the reference fixtures. Run with /usr/bin/python3 (grpcio); argv[1] of the tests is pdctl."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cluster  # noqa: E402

import grpc  # noqa: E402

if len(sys.argv) > 1 and os.path.exists(sys.argv[1]):
    os.environ["PDCTL"] = os.path.abspath(sys.argv[1])
PDCTL = cluster.pdctl_path()
MODELS = os.path.join(cluster.SOURCE_DIR, "deploy", "models")
TEMPLATE_1 = os.path.join(cluster.SOURCE_DIR, "deploy", "local.yaml")
TEMPLATE_4 = os.path.join(cluster.SOURCE_DIR, "deploy", "local-2p2d.yaml")
pb, pb_grpc, health_pb, health_grpc = cluster.gen_stubs()
failures = []
T0 = time.time()


def check(name, ok, detail=""):
    print("%s %s%s" % ("ok  " if ok else "FAIL", name, "" if ok else ": " + str(detail)[-2000:]),
          flush=True)
    if not ok:
        failures.append(name)
    return ok


def finish():
    """Prints the summary and exits 1 if a check failed."""
    print("%d failure(s) in %.1f s%s" % (len(failures), time.time() - T0,
                                          (": " + ", ".join(failures)) if failures else ""))
    sys.exit(1 if failures else 0)


class TestBinaries:
    """Environment that makes `pdctl up` start test builds (tests/support) in place of node
    binaries: a temporary $PDSERVE_BIN_DIR holding links named for the binaries they replace
    ({"prefill-node": "prefill-node-faults"}); pdctl finds the others next to itself. extra:
    more environment (PDSERVE_FAULT=...)."""

    def __init__(self, links, **extra):
        build = os.path.dirname(os.path.dirname(os.path.abspath(PDCTL)))
        self.dir = tempfile.mkdtemp(prefix="pd-test-bin-")
        for name, test_build in links.items():
            exe = os.path.join(build, "tests", "support", test_build)
            if not os.access(exe, os.X_OK):
                raise RuntimeError("%s not built" % exe)
            os.symlink(exe, os.path.join(self.dir, name))
        self.env = {"PDSERVE_BIN_DIR": self.dir}
        self.env.update(extra)

    def __enter__(self):
        return self.env

    def __exit__(self, *exc):
        shutil.rmtree(self.dir, ignore_errors=True)


def model_dir(name):
    return os.path.join(MODELS, name)


def reference(name):
    with open(os.path.join(model_dir(name), "reference.json")) as f:
        return json.load(f)


def model_template(template, model, tmp_dir, lease_ms=None):
    """template with its model line set to deploy/models/MODEL (and transport.lease_ms set):
    a copy in tmp_dir."""
    with open(template) as f:
        text = f.read()
    lines = []
    for ln in text.splitlines():
        if ln.startswith("model:"):
            ln = "model: %s" % model_dir(model)
        elif lease_ms is not None and ln.strip().startswith("lease_ms:"):
            ln = "  lease_ms: %d" % lease_ms
        lines.append(ln)
    out = os.path.join(tmp_dir, "%s-%s-%s" % (model, lease_ms, os.path.basename(template)))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return out


def all_nodes(template, **keys):
    """Overrides {node: keys} for every prefill/decode node of template."""
    _, nodes = cluster.rewrite_config(open(template).read(), os.path.dirname(template))
    return {n["name"]: dict(keys) for n in nodes if n.get("role") in ("prefill", "decode")}


def channel(addr):
    return grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20)])


class Result:
    def __init__(self):
        self.ids, self.text, self.msgs = [], "", 0
        self.finish_reason, self.usage, self.request_id = "", None, ""
        self.code, self.details = grpc.StatusCode.OK, ""
        self.first_s = None
        self.end = None  # time.time() when the stream ended


def sampling(max_tokens, **kw):
    return pb.SamplingParams(max_tokens=max_tokens, **kw)


def generate(stub, timeout=120, on_msg=None, **req):
    """Runs one Generate to its end; returns a Result (code/details on a gRPC error)."""
    r = Result()
    t0 = time.time()
    call = stub.Generate(pb.GenerateRequest(**req), timeout=timeout)
    try:
        for m in call:
            r.msgs += 1
            if r.first_s is None:
                r.first_s = time.time() - t0
            r.ids.extend(m.token_ids)
            r.text += m.text
            if m.request_id:
                r.request_id = m.request_id
            if m.finish_reason:
                r.finish_reason = m.finish_reason
                r.usage = (m.usage.prompt_tokens, m.usage.completion_tokens)
            if on_msg:
                on_msg(call, r)
    except grpc.RpcError as e:
        r.code, r.details = e.code(), e.details() or ""
    r.end = time.time()
    return r


def run_parallel(fns):
    """Runs the callables in threads; returns their results in order."""
    out = [None] * len(fns)

    def one(i):
        try:
            out[i] = fns[i]()
        except Exception as e:  # reported by the caller's checks
            out[i] = e
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def node_addr(node):
    return "%s:%s" % (node.get("host", "127.0.0.1"), node["port"])


def stats(node, timeout=5):
    """NodeStats of a prefill or decode node (dict from cluster.nodes)."""
    ch = channel(node_addr(node))
    try:
        stub = (pb_grpc.DecodeStub if node["role"] == "decode" else pb_grpc.PrefillStub)(ch)
        return stub.Stats(pb.StatsRequest(), timeout=timeout)
    finally:
        ch.close()


def wait_pages_free(c, timeout=15):
    """Polls Stats of every node until pages_used is 0 everywhere; returns {node: pages_used}."""
    end = time.time() + timeout
    while True:
        used = {}
        for n in c.nodes:
            if n["role"] in ("prefill", "decode"):
                try:
                    used[n["name"]] = stats(n).pages_used
                except grpc.RpcError as e:
                    used[n["name"]] = "error %s" % e.code()
        if all(v == 0 for v in used.values()) or time.time() > end:
            return used
        time.sleep(0.25)


def pdctl_local(model, prompt, max_tokens=48, weights="bf16", kv="bf16", prefill_weights=None,
                prefill_kv=None, extra=()):
    """The single-process pipeline (`pdctl generate --model`): returns its JSON dict."""
    args = [PDCTL, "generate", "--model", model_dir(model), "--prompt", prompt, "--max-tokens",
            str(max_tokens), "--weights", weights, "--kv", kv, "--json", "--ignore-eos"]
    if prefill_weights:
        args += ["--prefill-weights", prefill_weights, "--prefill-kv", prefill_kv]
    p = subprocess.run(args + list(extra), capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(args), p.stderr))
    return json.loads(p.stdout)


def node_metrics(node, timeout=10):
    """The Prometheus text of a node's (or the router's, node = {"http": host:port}) /metrics."""
    import urllib.request
    addr = node.get("http") or "%s:%s" % (node.get("host", "127.0.0.1"), node["http_port"])
    with urllib.request.urlopen("http://%s/metrics" % addr, timeout=timeout) as r:
        return r.read().decode()


def metric_value(text, name, **labels):
    """The value of the series name{labels...} (labels: a subset) in Prometheus text, or None."""
    import re
    for m in re.finditer(r"^%s(\{[^}]*\})? (\S+)$" % re.escape(name), text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(got.get(k) == str(v) for k, v in labels.items()):
            return float(m.group(2))
    return None
