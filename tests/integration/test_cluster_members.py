"""Membership and drain on a real 2P/2D cluster (deploy/local-2p2d.yaml on free ports):
  - `pdctl nodes` lists the router's nodes, all serving;
  - a third decode node started with `--join ROUTER --join-name decode2-r0` (its entry only in its
    own copy of the file) registers under that name, is health-checked, then takes work: with decode0 and decode1 drained every request
    lands on it and gives the reference ids; on SIGTERM it deregisters (state "left") and the
    cluster goes on without it;
  - `pdctl drain decode0` while a long request runs on it: no new request goes there, the running
    one finishes OK, and drain returns once the node is "drained"; `pdctl undrain` puts it back;
  - a rolling restart of every node (drain, SIGTERM, start again with --join, wait for the router
    to see it serving, undrain) under a steady load loses no request and changes no output.
Run by meson with /usr/bin/python3; argv[1] is pdctl."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from cluster_testlib import (TEMPLATE_4, all_nodes, channel, check, cluster, finish, generate,
                             model_template, pb_grpc, reference, sampling, stats, PDCTL)
import grpc

BIN = {"prefill": os.path.join(cluster.BUILD_DIR, "prefill-node", "prefill-node"),
       "decode": os.path.join(cluster.BUILD_DIR, "decode-node", "decode-node")}
N = 12


def pdctl(*args, timeout=120):
    return subprocess.run([PDCTL] + list(args), capture_output=True, text=True, timeout=timeout)


def nodes(router):
    p = pdctl("nodes", "--router", router, "--json")
    return {n["node"]: n for n in json.loads(p.stdout)} if p.returncode == 0 else {}


def wait_nodes(router, pred, timeout=120):
    end = time.time() + timeout
    while True:
        t = nodes(router)
        if (t and pred(t)) or time.time() > end:
            return t
        time.sleep(0.2)


def state_procs(c):
    """{name: pid} from the cluster's state file."""
    out = {}
    for name in os.listdir(c.tmp):
        if name.endswith(".state"):
            for line in open(os.path.join(c.tmp, name)):
                parts = line.rstrip("\n").split("\t")
                if parts[0] == "proc" and len(parts) >= 5:
                    out[parts[1]] = int(parts[4])
    return out


def wait_exit(pid, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


class Load:
    """Requests in a loop from `threads` threads until stop(); each result checked against ref."""

    def __init__(self, stub, cases, threads=2):
        self.stub, self.cases, self.stop_ev = stub, cases, threading.Event()
        self.results, self.ts = [], []
        for k in range(threads):
            t = threading.Thread(target=self.run, args=(k,))
            t.start()
            self.ts.append(t)

    def run(self, k):
        i = k
        while not self.stop_ev.is_set():
            case = self.cases[i % len(self.cases)]
            r = generate(self.stub, timeout=120, token_ids=case["input_ids"],
                         sampling=sampling(N, ignore_eos=True))
            self.results.append((r.code, r.details, r.ids == case["greedy_ids"][:N]))
            i += 1

    def stop(self):
        self.stop_ev.set()
        for t in self.ts:
            t.join()
        return self.results


def main():
    tmp = tempfile.mkdtemp(prefix="pd-test-members-")
    ref = reference("tiny-llama")
    cases = ref["cases"]
    tpl = model_template(TEMPLATE_4, "tiny-llama", tmp)
    c = cluster.Cluster(tpl, overrides=all_nodes(tpl, weights="bf16", kv="f32"), timeout_s=600)
    procs = []
    try:
        router = c.router_addr
        stub = pb_grpc.InferenceStub(channel(router))
        byname = {n["name"]: n for n in c.nodes}
        t = wait_nodes(router, lambda t: all(n["serving"] for n in t.values()))
        check("nodes-all-serving", len(t) == 4 and
              all(n["state"] == "serving" and not n["joined"] for n in t.values()), t)
        p = pdctl("nodes", "--config", c.config)
        check("nodes-table", p.returncode == 0 and "decode1" in p.stdout and
              "serving" in p.stdout, p.stdout + p.stderr)

        # ---- a node joins ----
        extra_port, extra_ucx = cluster.free_port(), cluster.free_port()
        own = os.path.join(tmp, "decode2.yaml")
        with open(c.config) as f:
            text = f.read()
        text += ("  - name: decode2\n    role: decode\n    host: 127.0.0.1\n    port: %d\n"
                 "    ucx_port: %d\n    kv_budget: 64MiB\n    threads: 1\n    weights: bf16\n"
                 "    kv: f32\n" % (extra_port, extra_ucx))
        with open(own, "w") as f:
            f.write(text)
        log2 = open(os.path.join(tmp, "decode2.log"), "ab")
        # registered under its own name (--join-name: a replica of a template entry)
        d2 = subprocess.Popen([BIN["decode"], "--config", own, "--node", "decode2", "--join",
                               router, "--join-name", "decode2-r0"], stdout=log2,
                              stderr=subprocess.STDOUT)
        procs.append(d2)
        t = wait_nodes(router, lambda t: "decode2-r0" in t and t["decode2-r0"]["serving"])
        check("joined-node-serving", t.get("decode2-r0", {}).get("joined") and
              t["decode2-r0"]["state"] == "serving" and "decode2" not in t, t)
        for name in ("decode0", "decode1"):
            check("drain-%s-idle" % name,
                  pdctl("drain", name, "--router", router, "--wait-s", "60").returncode == 0)
        d2node = {"name": "decode2", "role": "decode", "host": "127.0.0.1", "port": extra_port}
        before = stats(d2node).requests
        ok = True
        for i in range(3):
            r = generate(stub, token_ids=cases[i]["input_ids"], sampling=sampling(N, ignore_eos=True))
            ok &= r.code == grpc.StatusCode.OK and r.ids == cases[i]["greedy_ids"][:N]
        check("joined-node-takes-work", ok and stats(d2node).requests == before + 3,
              (ok, before, stats(d2node).requests))
        for name in ("decode0", "decode1"):
            check("undrain-%s" % name,
                  pdctl("undrain", name, "--router", router).returncode == 0)
        d2.send_signal(signal.SIGTERM)
        check("joined-node-exit-0", d2.wait(timeout=120) == 0)
        t = nodes(router)
        check("joined-node-left", t.get("decode2-r0", {}).get("state") == "left", t)
        r = generate(stub, token_ids=cases[0]["input_ids"], sampling=sampling(N, ignore_eos=True))
        check("generate-after-leave", r.code == grpc.StatusCode.OK and
              r.ids == cases[0]["greedy_ids"][:N], (r.code, r.details))

        # ---- drain with a request running ----
        long_res = {}

        def long_req():
            long_res["r"] = generate(stub, timeout=300, token_ids=cases[1]["input_ids"],
                                     sampling=sampling(400, ignore_eos=True))
        th = threading.Thread(target=long_req)
        th.start()
        t = wait_nodes(router, lambda t: any(t[d]["running"] for d in ("decode0", "decode1")),
                       timeout=60)
        busy = [d for d in ("decode0", "decode1") if t.get(d, {}).get("running")]
        check("long-request-running", len(busy) == 1, t)
        victim = busy[0] if busy else "decode0"
        other = "decode1" if victim == "decode0" else "decode0"
        drain = subprocess.Popen([PDCTL, "drain", victim, "--router", router, "--wait-s", "300",
                                  "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        t = wait_nodes(router, lambda t: t[victim]["state"] in ("draining", "drained"), 30)
        check("draining-state", t[victim]["state"] == "draining", t)
        vnode = byname[victim]
        end = time.time() + 60  # the long request admitted on the victim (it counts then)
        while stats(vnode).active == 0 and time.time() < end and th.is_alive():
            time.sleep(0.05)
        before = stats(vnode).requests
        for i in range(2):
            r = generate(stub, token_ids=cases[i]["input_ids"], sampling=sampling(N, ignore_eos=True))
            check("generate-while-draining-%d" % i, r.code == grpc.StatusCode.OK and
                  r.ids == cases[i]["greedy_ids"][:N], (r.code, r.details))
        check("draining-node-gets-no-new-work", stats(vnode).requests == before,
              (before, stats(vnode).requests))
        out, err = drain.communicate(timeout=320)
        th.join()
        lr = long_res["r"]
        check("running-request-finished", lr.code == grpc.StatusCode.OK and
              lr.finish_reason == "length" and len(lr.ids) == 400, (lr.code, lr.details))
        check("drain-returns-drained", drain.returncode == 0 and
              json.loads(out)[0]["state"] == "drained", out + err)
        check("undrain", pdctl("undrain", victim, "--router", router).returncode == 0)
        t = nodes(router)
        check("undrained-serving", t[victim]["state"] == "serving", t)
        del other

        # ---- rolling restart under load ----
        load = Load(stub, cases[:4], threads=2)
        pids = state_procs(c)
        for name in ("prefill0", "prefill1", "decode0", "decode1"):
            role = byname[name]["role"]
            p = pdctl("drain", name, "--router", router, "--wait-s", "300")
            check("roll-drain-%s" % name, p.returncode == 0, p.stdout + p.stderr)
            os.kill(pids[name], signal.SIGTERM)
            check("roll-stopped-%s" % name, wait_exit(pids[name]))
            log = open(os.path.join(tmp, name + "-restarted.log"), "ab")
            np = subprocess.Popen([BIN[role], "--config", c.config, "--node", name, "--join",
                                   router], stdout=log, stderr=subprocess.STDOUT)
            procs.append(np)
            t = wait_nodes(router, lambda t: t[name]["serving"], timeout=300)
            check("roll-back-%s" % name, t.get(name, {}).get("serving"), t)
            p = pdctl("undrain", name, "--router", router)
            check("roll-undrain-%s" % name, p.returncode == 0, p.stdout + p.stderr)
            # the router uses it again before the next node goes
            time.sleep(0)  # (no fixed wait: the load keeps running)
        res = load.stop()
        bad = [r for r in res if r[0] != grpc.StatusCode.OK or not r[2]]
        check("rolling-restart-lost-nothing", res and not bad, (len(res), bad[:5]))
        print("info rolling restart: %d requests under load, %d failed" % (len(res), len(bad)))
        t = wait_nodes(router, lambda t: all(t[n]["state"] == "serving" for n in
                                             ("prefill0", "prefill1", "decode0", "decode1")))
        check("all-serving-after-roll", all(t[n]["state"] == "serving" for n in
                                            ("prefill0", "prefill1", "decode0", "decode1")), t)
        check("drain-unknown-node", pdctl("drain", "nope", "--router", router).returncode == 1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        c.stop()
    import cluster_testlib
    if cluster_testlib.failures:
        print("logs kept in %s" % tmp)
    else:
        shutil.rmtree(tmp, True)
    finish()


if __name__ == "__main__":
    main()
