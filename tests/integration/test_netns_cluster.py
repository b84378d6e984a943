"""A cluster across network namespaces, as across hosts (netns.py): router, prefill0, prefill1,
decode0, decode1 and a client, each in its own namespace with an address of 10.213.0.0/24 on one
bridge, one cluster YAML naming those addresses, UCX over TCP between the namespaces, gRPC and HTTP
from the client namespace. Checks:
  - `pdctl health` (from the client namespace) lists every node SERVING at its address;
  - greedy ids over the cluster (pdctl generate --router, and parallel gRPC calls) equal the
    single-process pipeline (pdctl generate --model); the OpenAI HTTP API answers (curl);
  - a decode node killed (SIGKILL): the health table shows it down, requests still succeed on the
    other; restarted: SERVING again and used;
  - a link cut (`ip link set ... down` on decode0's cable) under load: every request ends OK or
    UNAVAILABLE within its deadline (nothing hangs), new requests succeed on decode1; the cable
    back: decode0 SERVING again;
  - every node's KV pages return to free; every namespace, veth and the bridge are gone at exit.
Root only: exits 77 (SKIP, with the reason) when not root; as root, a kernel that refuses
namespaces is a failure. Run by meson (suite netns) with /usr/bin/python3; argv[1] is pdctl."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

if os.geteuid() != 0:
    print("SKIP: network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN); running as uid %d"
          % os.geteuid())
    sys.exit(77)

from cluster_testlib import (check, cluster, finish, model_dir, pdctl_local,  # noqa: E402
                             reference)
from netns import NetnsCluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PDCTL = cluster.pdctl_path()
BIN = {"router": os.path.join(cluster.BUILD_DIR, "router", "router"),
       "prefill": os.path.join(cluster.BUILD_DIR, "prefill-node", "prefill-node"),
       "decode": os.path.join(cluster.BUILD_DIR, "decode-node", "decode-node")}
NODES = [("prefill0", "prefill"), ("prefill1", "prefill"), ("decode0", "decode"),
         ("decode1", "decode")]
MAX = 16


def write_config(net, path):
    """The cluster YAML: every address one of the namespaces' (ports may repeat across hosts)."""
    lines = ["model: %s" % model_dir("tiny-llama"),
             "router:",
             "  listen: %s:50050" % net.addr("router"),
             "  http: %s:50051" % net.addr("router"),
             "  prefill_policy: least_load",
             "  decode_policy: least_kv",
             "  request_timeout_ms: 60000",
             "transport:",
             "  ucx_tls: tcp",
             "  lease_ms: 5000",
             "nodes:"]
    for name, role in NODES:
        lines += ["  - name: %s" % name, "    role: %s" % role, "    host: %s" % net.addr(name),
                  "    port: 50060", "    http_port: 50061", "    threads: 1",
                  "    weights: bf16", "    kv: bf16"]
        if role == "decode":
            lines += ["    ucx_port: 50070", "    kv_budget: 64MiB"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def start(net, name, role, cfg):
    argv = [BIN[role], "--config", cfg]
    if role != "router":
        argv += ["--node", name]
    env = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS="n")
    return net.spawn(name, argv, env=env)


def health(net, cfg):
    """pdctl health --json from the client namespace: (rc, {node: entry})."""
    p = net.run("client", [PDCTL, "health", "--config", cfg, "--json", "--timeout-ms", "2000"])
    try:
        j = json.loads(p.stdout)
    except ValueError:
        return p.returncode, {}
    return p.returncode, {n["node"]: n for n in j["nodes"]}


def wait_health(net, cfg, want, timeout=120):
    """Polls until every node's serving flag is want[node] (missing: True); returns the table."""
    end = time.time() + timeout
    while True:
        rc, t = health(net, cfg)
        if t and all(t[n]["serving"] == want.get(n, True) for n in t) or time.time() > end:
            return t
        time.sleep(0.3)


def wait_router_sees(net, node, up=True, timeout=60):
    """Polls the router's own view (its /metrics: pdserve_node_up) until node is up (or down):
    pdctl health asks the nodes directly, and the router's health poll may be up to one poll
    period behind it. Returns whether it got there."""
    pat = re.compile(r'^pdserve_node_up\{[^}]*node="%s"[^}]*\} (\S+)$' % re.escape(node), re.M)
    end = time.time() + timeout
    while True:
        p = net.run("client", ["curl", "-sS", "--max-time", "5",
                               "http://%s:50051/metrics" % net.addr("router")])
        m = pat.search(p.stdout or "")
        if m and (float(m.group(1)) == 1.0) == up:
            return True
        if time.time() > end:
            return False
        time.sleep(0.1)


def wait_pages_free(net, cfg, timeout=60):
    end = time.time() + timeout
    while True:
        _, t = health(net, cfg)
        used = {n: (e["stats"] or {}).get("pages_used", "?") for n, e in t.items()
                if e["role"] in ("prefill", "decode")}
        if used and all(v == 0 for v in used.values()) or time.time() > end:
            return used
        time.sleep(0.3)


def remote_generate(net, router, prompt, n=MAX):
    p = net.run("client", [PDCTL, "generate", "--router", router, "--prompt", prompt,
                           "--max-tokens", str(n), "--ignore-eos", "--json"], timeout=120)
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else p.stderr)


def grpc_client(net, stubs, router, reqs):
    """Starts netns_client.py in the client namespace; returns the Popen (stdout piped)."""
    return net.popen("client", ["/usr/bin/python3", os.path.join(HERE, "netns_client.py"), stubs,
                                router, json.dumps(reqs)],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def client_results(p, timeout):
    """Waits for the client (at most timeout s) and parses its JSON line. Reads the pipes itself:
    communicate() would lose what a readline() already buffered."""
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return None, "client hung: " + p.stderr.read()[-2000:]
    out, err = p.stdout.read(), p.stderr.read()
    lines = out.strip().splitlines()
    try:
        return json.loads(lines[-1]), err
    except (ValueError, IndexError):
        return None, out + err


def main():
    tmp = tempfile.mkdtemp(prefix="pd-netns-")
    stubs = os.path.dirname(cluster.gen_stubs()[0].__file__)  # generated by cluster_testlib
    cases = reference("tiny-llama")["cases"]
    wants = [pdctl_local("tiny-llama", c["prompt"], MAX, weights="bf16", kv="bf16")
             for c in cases[:3]]
    net = NetnsCluster(["router"] + [n for n, _ in NODES] + ["client"], log_dir=tmp)
    try:
        net.setup()
    except (RuntimeError, OSError) as e:
        check("netns-setup", False, "running as root, yet the kernel refused: %s" % e)
        net.cleanup()
        finish()
    try:
        run_checks(net, tmp, stubs, cases, wants)
    finally:
        net.cleanup()
    left = net.leftovers()
    check("netns-cleanup", not left, left)
    if not cluster_testlib_failures():
        shutil.rmtree(tmp, True)
    else:
        print("logs kept in %s" % tmp)
    finish()


def cluster_testlib_failures():
    import cluster_testlib
    return cluster_testlib.failures


def run_checks(net, tmp, stubs, cases, wants):
    cfg = os.path.join(tmp, "cluster.yaml")
    write_config(net, cfg)
    router = "%s:50050" % net.addr("router")
    for name, role in NODES:
        start(net, name, role, cfg)
    start(net, "router", "router", cfg)

    # ---- health table, from the client namespace ----
    t = wait_health(net, cfg, {}, timeout=300)
    check("health-all-serving", t and all(e["serving"] for e in t.values()) and
          all(t[n]["address"].startswith(net.addr(n) + ":") for n, _ in NODES), t)
    p = net.run("client", [PDCTL, "health", "--config", cfg])
    check("health-table", p.returncode == 0 and
          all(("%s " % n) in p.stdout and net.addr(n) in p.stdout for n, _ in NODES) and
          p.stdout.count("SERVING") >= 5, p.stdout + p.stderr)

    # ---- greedy ids equal the single-process pipeline ----
    for i, w in enumerate(wants):
        rc, j = remote_generate(net, router, cases[i]["prompt"])
        check("pdctl-generate-case%d" % i, rc == 0 and j["output_ids"] == w["output_ids"],
              "%s vs %s" % (j, w["output_ids"]))
    reqs = [{"token_ids": w["input_ids"], "max_tokens": MAX, "timeout": 120} for w in wants] * 2
    res, err = client_results(grpc_client(net, stubs, router, reqs), 300)
    check("grpc-parallel", res is not None and
          all(r["code"] == "OK" and r["ids"] == wants[i % len(wants)]["output_ids"]
              for i, r in enumerate(res)), res or err)
    body = json.dumps({"model": "tiny-llama", "prompt": cases[0]["prompt"], "max_tokens": 5,
                       "ignore_eos": True})
    p = net.run("client", ["curl", "-sS", "--max-time", "60", "-H",
                           "Content-Type: application/json", "-d", body,
                           "http://%s:50051/v1/completions" % net.addr("router")])
    try:
        j = json.loads(p.stdout)
    except ValueError:
        j = {"raw": p.stdout + p.stderr}
    check("http-completions", j.get("usage", {}).get("completion_tokens") == 5, j)

    # ---- a decode node killed and restarted ----
    net.kill("decode1")
    t = wait_health(net, cfg, {"decode1": False}, timeout=30)
    check("killed-node-down", t and not t["decode1"]["serving"] and t["decode0"]["serving"], t)
    p = net.run("client", [PDCTL, "health", "--config", cfg])
    check("health-exit-1-with-node-down", p.returncode == 1 and "decode1" in p.stdout, p.stdout)
    for i in range(2):
        rc, j = remote_generate(net, router, cases[i]["prompt"])
        check("generate-with-decode1-dead-%d" % i,
              rc == 0 and j["output_ids"] == wants[i]["output_ids"], j)
    start(net, "decode1", "decode", cfg)
    t = wait_health(net, cfg, {}, timeout=300)
    check("restarted-node-serving", t and all(e["serving"] for e in t.values()), t)
    check("restarted-node-seen-by-router", wait_router_sees(net, "decode1"), "router /metrics")
    before = t["decode1"]["stats"]["requests"]
    for i in range(4):  # least_kv: with both empty, both nodes take requests
        remote_generate(net, router, cases[i % 3]["prompt"])
    _, t = health(net, cfg)
    check("restarted-node-used", t and t["decode1"]["stats"]["requests"] > before, t)

    # ---- a link cut under load ----
    deadline = 90  # the requests take a few seconds each: long enough to be cut mid-stream
    long_reqs = [{"token_ids": wants[i % 3]["input_ids"], "max_tokens": 300, "timeout": deadline}
                 for i in range(4)]
    t_start = time.time()
    cl = grpc_client(net, stubs, router, long_reqs)
    started = cl.stdout.readline().strip()
    t_cut = time.time()
    net.link("decode0", up=False)
    # every call ends by its deadline (from its start): the client must be done soon after
    res, err = client_results(cl, max(1, t_start + deadline + 30 - time.time()))
    check("cut-client-started", started == "started", started)
    check("cut-nothing-hangs", res is not None, err)
    if res is not None:
        codes = [r["code"] for r in res]
        check("cut-ok-or-unavailable", all(c in ("OK", "UNAVAILABLE") for c in codes),
              [(r["code"], r["details"]) for r in res])
        check("cut-within-deadline", all(r["elapsed"] < deadline for r in res),
              [r["elapsed"] for r in res])
        print("info link cut: %s, %s tokens, %s s (the client done %.1f s after the cut)"
              % (codes, [len(r["ids"]) for r in res], ["%.1f" % r["elapsed"] for r in res],
                 time.time() - t_cut))
    t = wait_health(net, cfg, {"decode0": False}, timeout=30)
    check("cut-node-down", t and not t["decode0"]["serving"], t)
    rc, j = remote_generate(net, router, cases[0]["prompt"])
    check("generate-during-cut", rc == 0 and j["output_ids"] == wants[0]["output_ids"], j)
    net.link("decode0", up=True)
    t = wait_health(net, cfg, {}, timeout=120)
    check("cut-node-back", t and all(e["serving"] for e in t.values()), t)
    check("cut-node-seen-by-router", wait_router_sees(net, "decode0"), "router /metrics")
    rc, j = remote_generate(net, router, cases[1]["prompt"])
    check("generate-after-cut", rc == 0 and j["output_ids"] == wants[1]["output_ids"], j)

    # ---- every page back ----
    used = wait_pages_free(net, cfg, timeout=60)
    check("pages-free", used and all(v == 0 for v in used.values()), used)
    for name in ["router"] + [n for n, _ in NODES]:
        p = net.procs.get(name)
        check("%s-alive" % name, p is not None and p.poll() is None,
              p and p.returncode)
    # SIGTERM: every process drains and exits 0
    for name in ["router"] + [n for n, _ in NODES]:
        rc = net.kill(name, sig=15, timeout=90)
        check("%s-sigterm-exit-0" % name, rc == 0, rc)


if __name__ == "__main__":
    main()
