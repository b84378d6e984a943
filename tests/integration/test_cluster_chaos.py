"""Bounded chaos on deploy/local-2p2d.yaml (2 prefill, 2 decode nodes; router.request_timeout_ms
20 s): for PD_CHAOS_S seconds (default 60) client threads send Generate requests (random prompts
and lengths, some cancelled by the client part way) while a chaos thread, driven by one seeded
random generator, kills nodes with SIGKILL and restarts them (only while another node of the
same role is SERVING: the cluster keeps serving), and drops connections to the router (an HTTP/2 or HTTP/1 request cut off half way,
then a TCP reset; an HTTP stream reset after its first bytes). Then every dead node is restarted
and the load stops. Checked:
- every request ended within its deadline (20 s + 5 s of slack) with a documented status: OK with
  exactly the asked number of tokens, CANCELLED only when the client cancelled it, UNAVAILABLE,
  DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED; never DATA_LOSS, INTERNAL or anything else;
- after the chaos every node serves again, a final batch of requests all succeeds, and every
  node's pages return to free (pdserve_node_kv_pages_used on its /metrics, after the leases and
  quarantine of the writers that died run out);
- no node reported an integrity failure; no process logged an assertion or sanitizer report;
- memory is flat: the RSS of the processes that lived through it all (the router, and the nodes
  never killed: one, chosen by the seed, is spared on purpose) grew by less than 25% + 24 MiB
  between the end of the warm-up and the end.
The seed is printed first; PD_CHAOS_SEED=N reproduces the same sequence of actions (timing on a
loaded machine still varies). Run with /usr/bin/python3; argv[1] is pdctl."""
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from cluster_testlib import (TEMPLATE_4, channel, check, cluster, finish, health_grpc, health_pb,
                             node_addr, pb, pb_grpc, sampling, stats)
import grpc

SEED = int(os.environ.get("PD_CHAOS_SEED") or random.SystemRandom().randrange(1, 1 << 31))
DURATION_S = float(os.environ.get("PD_CHAOS_S") or 60)
TIMEOUT_MS = 20000
SLACK_S = 5.0
CLIENTS = 6
C = grpc.StatusCode
ALLOWED = {C.OK, C.UNAVAILABLE, C.DEADLINE_EXCEEDED, C.RESOURCE_EXHAUSTED}

print("chaos seed %d (reproduce: PD_CHAOS_SEED=%d), %.0f s" % (SEED, SEED, DURATION_S),
      flush=True)


def alive(pid):
    """Whether pid runs (a zombie has closed its sockets already)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            m = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
            return int(m.group(1)) if m else None
    except OSError:
        return None


def proc_pids(c):
    """{name: pid} from the cluster's state file."""
    out = {}
    for name in os.listdir(c.tmp):
        if name.endswith(".state"):
            with open(os.path.join(c.tmp, name)) as f:
                for line in f:
                    parts = line.rstrip("\n").split("\t")
                    if parts[0] == "proc" and len(parts) >= 5:
                        out[parts[1]] = int(parts[4])
    return out


def serving(node):
    """Whether the node's grpc.health.v1 says SERVING (a restarted node loads first)."""
    ch = channel(node_addr(node))
    try:
        r = health_grpc.HealthStub(ch).Check(health_pb.HealthCheckRequest(service=""), timeout=2)
        return r.status == health_pb.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False
    finally:
        ch.close()


def metrics_pages_used(node):
    """pdserve_node_kv_pages_used from the node's /metrics, or None when it does not answer."""
    url = "http://%s:%s/metrics" % (node.get("host", "127.0.0.1"), node["http_port"])
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            text = r.read().decode()
    except OSError:
        return None
    m = re.search(r"^pdserve_node_kv_pages_used\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


class Chaos:
    def __init__(self, c):
        self.c = c
        self.rng = random.Random(SEED)
        self.nodes = {n["name"]: n for n in c.nodes if n["role"] in ("prefill", "decode")}
        self.pids = {k: v for k, v in proc_pids(c).items() if k in self.nodes}
        self.procs = {}     # restarted nodes: name -> Popen (pdctl down does not know them)
        self.dead = set()
        self.killed = set()  # every node killed at least once (not a survivor)
        self.actions = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        build = os.path.dirname(os.path.dirname(os.path.abspath(cluster.pdctl_path())))
        self.bins = {"prefill": os.path.join(build, "prefill-node", "prefill-node"),
                     "decode": os.path.join(build, "decode-node", "decode-node")}
        self.restart_logs = []
        # one node (seeded choice) is never killed: its memory is measured with the router's
        self.witness = self.rng.choice(sorted(self.nodes))

    def log(self, what):
        line = "%6.1f s  %s" % (time.time() - T0, what)
        self.actions.append(line)
        print("chaos " + line, flush=True)

    def kill(self):
        alive = [n for n in sorted(self.nodes) if n not in self.dead]
        name = self.rng.choice([n for n in alive if n != self.witness])
        # another node of its role must be serving (not still loading after a restart): the
        # cluster keeps serving something
        if not any(serving(self.nodes[m]) for m in alive
                   if m != name and self.nodes[m]["role"] == self.nodes[name]["role"]):
            self.log("no kill of %s: no other %s node serving" % (name, self.nodes[name]["role"]))
            return
        os.kill(self.pids[name], signal.SIGKILL)
        self.dead.add(name)
        self.killed.add(name)
        self.log("kill -9 %s (pid %d)" % (name, self.pids[name]))

    def restart(self, name):
        end = time.time() + 10  # its ports are free once the killed process is gone
        while alive(self.pids[name]) and time.time() < end:
            time.sleep(0.05)
        log = open(os.path.join(self.c.tmp, "%s-restart-%d.log" % (name, len(self.restart_logs))),
                   "w")
        self.restart_logs.append(log.name)
        p = subprocess.Popen([self.bins[self.nodes[name]["role"]], "--config", self.c.config,
                              "--node", name], stdout=log, stderr=subprocess.STDOUT,
                             env=self.c.env)
        log.close()
        try:
            self.procs[name].wait(0)
        except (KeyError, subprocess.TimeoutExpired):
            pass
        self.procs[name] = p
        self.pids[name] = p.pid
        self.dead.discard(name)
        self.log("restart %s (pid %d)" % (name, p.pid))

    def drop_grpc(self):
        """An HTTP/2 connection to the router that stops half way through a request, then RST."""
        host, port = self.c.router_addr.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" +
                  b"\x00\x00\x40\x01\x04\x00\x00\x00\x01" + bytes(self.rng.randrange(1, 40)))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
        self.log("dropped a half-sent gRPC request")

    def drop_http(self):
        """An OpenAI streaming request whose connection is reset after the first bytes (or a
        POST cut off in its body)."""
        host, port = self.c.router_http.rsplit(":", 1)
        body = ('{"prompt": [0, %d, %d, %d], "max_tokens": 24, "stream": true, '
                '"ignore_eos": true}' % tuple(self.rng.randrange(2, 2000) for _ in range(3)))
        req = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode()
        s = socket.create_connection((host, int(port)), timeout=10)
        if self.rng.random() < 0.5:
            s.sendall(req[:len(req) - self.rng.randrange(1, 20)])  # body cut off
            what = "a POST cut off in its body"
        else:
            s.sendall(req)
            try:
                s.recv(256)  # the stream started
            except OSError:
                pass
            what = "a streaming completion after its first bytes"
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
        self.log("reset " + what)

    def run(self):
        end = time.time() + DURATION_S
        while not self.stop.is_set() and time.time() < end:
            self.stop.wait(self.rng.uniform(1.0, 4.0))
            r = self.rng.random()
            try:
                if self.dead and r < 0.45:
                    self.restart(self.rng.choice(sorted(self.dead)))
                elif r < 0.7:
                    self.kill()
                elif r < 0.85:
                    self.drop_grpc()
                else:
                    self.drop_http()
            except OSError as e:
                self.log("action failed: %s" % e)
        for name in sorted(self.dead):
            self.restart(name)

    def cleanup(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


class Load:
    """Client threads sending Generate requests until stopped; each result recorded."""

    def __init__(self, c, seed):
        self.c = c
        self.seed = seed
        self.stop = threading.Event()
        self.results = []
        self.lock = threading.Lock()

    def one(self, stub, rng):
        plen = rng.choice([3, 8, 17, 40, 90, 180])
        max_tokens = rng.randrange(4, 33)
        cancel_at = rng.randrange(1, max_tokens) if rng.random() < 0.1 else None
        req = pb.GenerateRequest(token_ids=[0] + [rng.randrange(2, 2000) for _ in range(plen)],
                                 sampling=sampling(max_tokens, ignore_eos=True))
        rec = {"max_tokens": max_tokens, "cancelled": False, "n": 0, "code": C.OK,
               "finish": "", "t0": time.time()}
        call = stub.Generate(req, timeout=2 * TIMEOUT_MS / 1000.0)
        try:
            for m in call:
                rec["n"] += len(m.token_ids)
                if m.finish_reason:
                    rec["finish"] = m.finish_reason
                if cancel_at is not None and rec["n"] >= cancel_at and not rec["finish"]:
                    rec["cancelled"] = True
                    call.cancel()
        except grpc.RpcError as e:
            rec["code"], rec["details"] = e.code(), e.details() or ""
        rec["t1"] = time.time()
        with self.lock:
            self.results.append(rec)

    def worker(self, i):
        rng = random.Random(self.seed * 1000 + i)
        ch = channel(self.c.router_addr)
        stub = pb_grpc.InferenceStub(ch)
        while not self.stop.is_set():
            self.one(stub, rng)
            if self.results[-1]["code"] == C.UNAVAILABLE:
                self.stop.wait(0.2)  # a client backs off a little before it tries again
        ch.close()

    def start(self):
        self.threads = [threading.Thread(target=self.worker, args=(i,)) for i in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def bad_result(r):
    """Why r breaks the contract, or None."""
    took = r["t1"] - r["t0"]
    if took > TIMEOUT_MS / 1000.0 + SLACK_S:
        return "took %.1f s" % took
    if r["code"] == C.CANCELLED:
        return None if r["cancelled"] else "CANCELLED without a client cancel"
    if r["code"] not in ALLOWED:
        return "status %s: %s" % (r["code"], r.get("details", ""))
    if r["code"] == C.OK and not r["cancelled"] and \
            (r["n"] != r["max_tokens"] or r["finish"] != "length"):
        return "OK with %d of %d tokens, finish %r" % (r["n"], r["max_tokens"], r["finish"])
    return None


T0 = time.time()


def main():
    with cluster.Cluster(TEMPLATE_4, router_overrides={"request_timeout_ms": TIMEOUT_MS}) as c:
        chaos = Chaos(c)
        router_pid = proc_pids(c)["router"]
        load = Load(c, SEED)
        try:
            load.start()
            end = time.time() + 60
            while len(load.results) < 3 * CLIENTS and time.time() < end:
                time.sleep(0.2)
            check("warm-up", len(load.results) >= 3 * CLIENTS, len(load.results))
            rss0 = {"router": rss_kib(router_pid)}
            rss0.update({n: rss_kib(p) for n, p in chaos.pids.items()})
            n_warm = len(load.results)
            ct = threading.Thread(target=chaos.run)
            ct.start()
            ct.join()
            # every node is back: wait until all serve, then a few seconds more of load
            h = c.wait_serving(timeout=90)
            if not check("all-nodes-serving-again", h.returncode == 0, h.stdout + h.stderr):
                for path in chaos.restart_logs[-4:]:
                    print("info %s:\n%s" % (path, open(path, errors="replace").read()[-1500:]))
            t_back = time.time()
            while time.time() - t_back < 5:
                time.sleep(0.2)
            load.join()
            res = load.results
            bad = [(b, r) for r in res for b in [bad_result(r)] if b]
            counts = {}
            for r in res:
                k = "CANCELLED(client)" if r["cancelled"] else r["code"].name
                counts[k] = counts.get(k, 0) + 1
            print("info %d requests (%d during the warm-up): %s" % (len(res), n_warm, counts),
                  flush=True)
            why = {}
            for r in res:
                if r["code"] != C.OK:
                    k = re.sub(r"\d+", "N", r.get("details", ""))[:90]
                    why[k] = why.get(k, 0) + 1
            for k, v in sorted(why.items(), key=lambda kv: -kv[1])[:8]:
                print("info   %4d x %s" % (v, k), flush=True)
            check("requests-documented-status-in-time", not bad,
                  "%d bad (seed %d): %s" % (len(bad), SEED, bad[:5]))
            check("some-requests-ok", counts.get("OK", 0) >= len(res) // 5, counts)
            check("chaos-acted", any("kill" in a for a in chaos.actions), chaos.actions)
            # a final batch: all succeed on the restored cluster
            stub = pb_grpc.InferenceStub(channel(c.router_addr))
            fin = []
            for i in range(8):
                call = stub.Generate(pb.GenerateRequest(
                    token_ids=[0, 5 + i, 77, 300], sampling=sampling(8, ignore_eos=True)),
                    timeout=TIMEOUT_MS / 1000.0)
                try:
                    fin.append(sum(len(m.token_ids) for m in call))
                except grpc.RpcError as e:
                    fin.append(e.code())
            check("final-requests-ok", fin == [8] * 8, fin)
            # pages back to free on every node (dead writers' leases and quarantine run out)
            end = time.time() + 40
            while True:
                used = {n: metrics_pages_used(nd) for n, nd in chaos.nodes.items()}
                if all(v == 0 for v in used.values()) or time.time() > end:
                    break
                time.sleep(0.5)
            check("pages-free-on-metrics", all(v == 0 for v in used.values()), used)
            integ = {n: stats(nd).integrity_failures for n, nd in chaos.nodes.items()}
            check("no-integrity-failures", all(v == 0 for v in integ.values()), integ)
            # memory of the processes that lived through it all
            survivors = ["router"] + [n for n in sorted(chaos.nodes) if n not in chaos.killed]
            rss1 = {"router": rss_kib(router_pid)}
            rss1.update({n: rss_kib(chaos.pids[n]) for n in survivors if n != "router"})
            grew = {n: (rss0[n], rss1[n]) for n in survivors
                    if rss0.get(n) and rss1.get(n) and rss1[n] > rss0[n] * 1.25 + 24 * 1024}
            print("info rss KiB warm-up -> end: %s" % {n: (rss0.get(n), rss1.get(n))
                                                       for n in survivors}, flush=True)
            check("survivors-alive", all(rss1.get(n) for n in survivors), rss1)
            check("memory-flat", not grew, grew)
        finally:
            load.stop.set()
            chaos.stop.set()
            logs = c.log("router") + "".join(c.log(n) for n in chaos.nodes)
            for path in chaos.restart_logs:
                try:
                    logs += open(path, errors="replace").read()
                except OSError:
                    pass
            c.stop()
            chaos.cleanup()
        check("no-assertions", "assertion failed" not in logs and "Sanitizer" not in logs,
              [ln for ln in logs.splitlines() if "assertion" in ln or "Sanitizer" in ln][:5])
    print("chaos seed %d" % SEED, flush=True)
    finish()


if __name__ == "__main__":
    main()
