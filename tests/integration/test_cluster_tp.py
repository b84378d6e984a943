"""Issue 16: tensor-parallel nodes (`tp: N` in a node's entry) in a real cluster on the CPU (the
in-process communicator; one thread and backend per rank), deploy/local.yaml's formats (prefill
FP8 weights + BF16 KV, decode INT4 weights + FP8 KV):

- prefill tp 2 -> decode tp 1, tp 1 -> tp 2 and tp 2 -> tp 2 on tiny-llama: greedy ids equal the
  single-process pipeline (`pdctl generate`, TP 1) token for token; the KV travels as one stamped
  slice per decode rank, re-sliced by KV head; every page is free again afterwards; the nodes'
  Stats, `pdctl health --json`, `pdctl nodes --json` and the router's /health show each node's tp.
- tiny-moe, tp 2 -> tp 2 with BF16 decode weights (its INT4 experts do not split two ways, and FP8
  at TP 2 quantizes activations per shard: tp_shard.h): the same against the pipeline with those
  formats.
- one KV-done checksum per decode rank's slice: with the test build decode-node-faults
  (PDSERVE_FAULT=kvdone-slice) the first KV-done's last-rank slice checksum does not match its
  slice: exactly that request ends with DATA_LOSS, the decode node logs which rank's slice failed
  and counts it (integrity_failures, kind checksum), and the next requests give the pipeline's ids.
- a decode rank that fails in the middle of a collective (PDSERVE_FAULT=tp-rank:40: rank 1's
  40th collective fails while rank 0 waits in it): the request ends with INTERNAL ("tensor-parallel
  step aborted") within its deadline, and the node serves the next requests with the right ids.
- a tp that does not split the model is refused at start with a clear error: `pdctl up` (tp 4 with
  2 KV heads; before any process starts) and the decode-node binary itself (tiny-moe tp 2 with
  INT4 weights: its expert shards would cut INT4 groups), exit status nonzero, no serving.
Run with /usr/bin/python3; argv[1] is pdctl."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

from cluster_testlib import (PDCTL, TEMPLATE_1, channel, check, cluster, finish, generate,
                             metric_value, model_template, node_metrics, pb, pb_grpc, pdctl_local,
                             reference, sampling, stats, wait_pages_free)
import grpc

TMP = tempfile.mkdtemp(prefix="pd-test-tp-")
MAX = 32
N_CASES = 3
PIPE = dict(weights="int4", kv="fp8", prefill_weights="fp8", prefill_kv="bf16")


def cases(model):
    return reference(model)["cases"][:N_CASES]


def run(model, ptp, dtp, pipe, decode_weights=None):
    tpl = model_template(TEMPLATE_1, model, TMP)
    dec = {"tp": dtp, "threads": 1}
    if decode_weights:
        dec["weights"] = decode_weights
    name = "%s-p%d-d%d" % (model, ptp, dtp)
    t = time.time()
    with cluster.Cluster(tpl, overrides={"prefill0": {"tp": ptp, "threads": 1},
                                         "decode0": dec}) as c:
        print("info %s: up in %.1f s" % (name, time.time() - t), flush=True)
        stub = pb_grpc.InferenceStub(channel(c.router_addr))
        for i, case in enumerate(cases(model)):
            want = pdctl_local(model, case["prompt"], MAX, **pipe)["output_ids"]
            r = generate(stub, token_ids=case["input_ids"], sampling=sampling(MAX, ignore_eos=True))
            check("%s-greedy-case%d" % (name, i), r.code == grpc.StatusCode.OK and r.ids == want,
                  "%s %s\n got  %s\n want %s" % (r.code, r.details, r.ids, want))
        byname = {n["name"]: n for n in c.nodes}
        st = {k: stats(byname[k]) for k in ("prefill0", "decode0")}
        check("%s-stats-tp" % name, (st["prefill0"].tp, st["decode0"].tp) == (ptp, dtp),
              "%d %d" % (st["prefill0"].tp, st["decode0"].tp))
        h = c.pdctl("health", "--config", c.config, "--json", timeout=60)
        tps = {}
        try:
            tps = {n["node"]: (n["stats"] or {}).get("tp") for n in json.loads(h.stdout)["nodes"]}
        except ValueError:
            pass
        check("%s-pdctl-health-tp" % name, tps.get("prefill0") == ptp and tps.get("decode0") == dtp,
              h.stdout + h.stderr)
        p = c.pdctl("nodes", "--router", c.router_addr, "--json", timeout=60)
        try:
            listed = {n["node"]: n["tp"] for n in json.loads(p.stdout)}
        except (ValueError, KeyError, TypeError):
            listed = {}
        check("%s-pdctl-nodes-tp" % name, listed == {"prefill0": ptp, "decode0": dtp},
              p.stdout + p.stderr)
        with urllib.request.urlopen("http://%s/health" % c.router_http, timeout=10) as resp:
            health = {n["name"]: n.get("tp") for n in json.load(resp)["nodes"]}
        check("%s-router-health-tp" % name, health == {"prefill0": ptp, "decode0": dtp}, health)
        for node, tp in (("prefill0", ptp), ("decode0", dtp)):  # each node's ops endpoint
            url = "http://%s:%s/health" % (byname[node]["host"], byname[node]["http_port"])
            with urllib.request.urlopen(url, timeout=10) as resp:
                got = json.load(resp).get("tp")
            check("%s-%s-health-tp" % (name, node), got == tp, got)
        for node, tp in (("prefill0", ptp), ("decode0", dtp)):  # the engine runs the ranks
            ranks = "tp %d: %d ranks" % (tp, tp)
            check("%s-%s-ranks" % (name, node), (ranks in c.log(node)) == (tp > 1),
                  c.log(node)[-1500:])
        used = wait_pages_free(c)
        check("%s-pages-free" % name, all(v == 0 for v in used.values()), used)
    print("info %s: %.1f s" % (name, time.time() - t), flush=True)


def faulty_decode(fault):
    """A prefill tp 1 -> decode tp 2 cluster whose decode node is the test build
    decode-node-faults with PDSERVE_FAULT=fault; yields (cluster, stub)."""
    exe = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(PDCTL))), "tests",
                       "support", "decode-node-faults")
    check("%s-build" % fault, os.access(exe, os.X_OK), exe)
    bindir = tempfile.mkdtemp(prefix="pd-tp-faults-bin-")
    os.symlink(exe, os.path.join(bindir, "decode-node"))
    tpl = model_template(TEMPLATE_1, "tiny-llama", TMP)
    env = {"PDSERVE_BIN_DIR": bindir, "PDSERVE_FAULT": fault}
    return bindir, cluster.Cluster(tpl, overrides={"decode0": {"tp": 2, "threads": 1}}, env=env)


def serves_after(c, stub, name):
    for i, case in enumerate(cases("tiny-llama")):  # both ranks keep serving
        want = pdctl_local("tiny-llama", case["prompt"], MAX, **PIPE)["output_ids"]
        r = generate(stub, token_ids=case["input_ids"], sampling=sampling(MAX, ignore_eos=True))
        check("%s-after-case%d" % (name, i), r.code == grpc.StatusCode.OK and r.ids == want,
              "%s %s" % (r.code, r.details))
    used = wait_pages_free(c)
    check("%s-pages-free" % name, all(n == 0 for n in used.values()), used)


def rank_fault():
    """decode tp 2: rank 1's 40th collective (a few steps into the first request) fails while
    rank 0 waits in it: that request ends with INTERNAL "tensor-parallel step aborted", nothing
    hangs, the node keeps serving."""
    bindir, cl = faulty_decode("tp-rank:40")
    try:
        with cl as c:
            stub = pb_grpc.InferenceStub(channel(c.router_addr))
            t = time.time()
            v = generate(stub, timeout=60, token_ids=cases("tiny-llama")[0]["input_ids"],
                         sampling=sampling(MAX, ignore_eos=True))
            # the router reports a node-side failure as INTERNAL, with the node's message
            check("rank-fault-victim", v.code == grpc.StatusCode.INTERNAL and
                  "tensor-parallel step aborted" in v.details and time.time() - t < 30,
                  "%s %r after %.1f s" % (v.code, v.details, time.time() - t))
            log = c.log("decode0")
            check("rank-fault-injected", "injecting fault tp-rank" in log and
                  "tp rank 1 failed" in log, log[-2000:])
            serves_after(c, stub, "rank-fault")
    finally:
        shutil.rmtree(bindir, ignore_errors=True)


def slice_fault():
    """prefill tp 1 -> decode tp 2 (decode-node-faults, kvdone-slice): the first request's rank-1
    slice fails its checksum; only that request fails."""
    bindir, cl = faulty_decode("kvdone-slice")
    try:
        with cl as c:
            stub = pb_grpc.InferenceStub(channel(c.router_addr))
            cs = cases("tiny-llama")
            v = generate(stub, timeout=60, token_ids=cs[0]["input_ids"],
                         sampling=sampling(MAX, ignore_eos=True))
            check("slice-fault-victim", v.code == grpc.StatusCode.DATA_LOSS and
                  "kv integrity check failed" in v.details, "%s %r" % (v.code, v.details))
            log = c.log("decode0")
            check("slice-fault-injected", "injecting fault 'kvdone-slice'" in log, log[-2000:])
            check("slice-fault-rank-named", "tp rank 1's kv slice checksum" in log and
                  "tp rank 0's kv slice checksum" not in log, log[-2000:])
            byname = {n["name"]: n for n in c.nodes}
            end = time.time() + 10  # counters are published every compute tick
            while stats(byname["decode0"]).integrity_failures != 1 and time.time() < end:
                time.sleep(0.05)
            check("slice-fault-counted", stats(byname["decode0"]).integrity_failures == 1)
            text = node_metrics(byname["decode0"])
            check("slice-fault-kind", metric_value(
                text, "pdserve_node_kv_integrity_failures_total", kind="checksum") == 1.0,
                text[-2000:])
            serves_after(c, stub, "slice-fault")
    finally:
        shutil.rmtree(bindir, ignore_errors=True)


def refused_by_pdctl_up():
    tpl = model_template(TEMPLATE_1, "tiny-llama", TMP)
    c = cluster.Cluster(tpl, overrides={"decode0": {"tp": 4}}, start=False)
    p = c.pdctl("up", "--detach", "--config", c.config, "--log-dir", c.log_dir, "--timeout-s", "30",
                timeout=90)
    out = p.stdout + p.stderr
    check("bad-tp-pdctl-up-refused", p.returncode != 0, out)
    check("bad-tp-pdctl-up-message",
          "nodes.decode0.tp: 4 does not divide the model's 2 KV heads" in out and
          "started" not in out, out)


def refused_by_node():
    tpl = model_template(TEMPLATE_1, "tiny-moe", TMP)
    c = cluster.Cluster(tpl, overrides={"decode0": {"tp": 2}}, start=False)
    node = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(PDCTL))), "decode-node",
                        "decode-node")
    t = time.time()
    p = subprocess.run([node, "--config", c.config, "--node", "decode0"], capture_output=True,
                       text=True, timeout=60)
    out = p.stdout + p.stderr
    check("bad-tp-node-exits", p.returncode != 0 and time.time() - t < 30,
          "rc %d after %.1f s\n%s" % (p.returncode, time.time() - t, out))
    check("bad-tp-node-message",
          "node 'decode0': tp 2 cannot run" in out and "int4" in out and "SERVING" not in out, out)


def main():
    refused_by_pdctl_up()
    refused_by_node()
    slice_fault()
    rank_fault()
    for ptp, dtp in ((2, 1), (1, 2), (2, 2)):
        run("tiny-llama", ptp, dtp, PIPE)
    run("tiny-moe", 2, 2, dict(PIPE, weights="bf16"), decode_weights="bf16")
    finish()


if __name__ == "__main__":
    main()
