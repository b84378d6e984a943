"""The three binaries as systemd runs them (Type=notify, WatchdogSec, journald): router, prefill
and decode node of deploy/local.yaml (free ports), each started with NOTIFY_SOCKET pointing at a
fake service manager (a unix datagram socket this test reads), WATCHDOG_USEC set and
--log-format json. Checks: each sends READY=1 once it serves (a node: when its health says
SERVING; checked by asking its health service right after READY arrives), WATCHDOG=1 again and
again while it runs, STOPPING=1 on SIGTERM, then exits 0; every log line it writes is one JSON
object with ts, level, tag, msg. `pdctl drain decode0` (the router's Cluster service): the router
tells the node at its next Stats poll, the node sends STATUS= "decode0: drained (pdctl drain)"
and its /health says "drain": "drained"; the router restarted (SIGTERM, started again) learns it
back from the node (pdctl nodes: drained, no new work), and `pdctl undrain` brings STATUS=
"serving (undrained)" and "drain": "none". The unit files in deploy/systemd are checked for Type=notify,
WatchdogSec and the binaries' flags. Run by meson with /usr/bin/python3; argv[1] is pdctl."""
import json
import os
import urllib.request
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from cluster_testlib import (PDCTL, TEMPLATE_1, all_nodes, channel, check, cluster, finish,
                             health_grpc, health_pb, model_template)

BIN = {"router": os.path.join(cluster.BUILD_DIR, "router", "router"),
       "prefill": os.path.join(cluster.BUILD_DIR, "prefill-node", "prefill-node"),
       "decode": os.path.join(cluster.BUILD_DIR, "decode-node", "decode-node")}


class FakeManager:
    """A NOTIFY_SOCKET: collects (time, message) datagrams."""

    def __init__(self, path):
        self.path = path
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(path)
        self.s.settimeout(0.1)
        self.msgs = []

    def poll(self, until, timeout):
        """Reads datagrams until until(msgs) or timeout; returns until(msgs)."""
        end = time.time() + timeout
        while not until(self.msgs) and time.time() < end:
            try:
                self.msgs.append((time.time(), self.s.recv(4096).decode()))
            except socket.timeout:
                pass
        return until(self.msgs)

    def count(self, what):
        return sum(1 for _, m in self.msgs if what in m.split("\n"))


def health_status(host, port):
    ch = channel("%s:%s" % (host, port))
    try:
        return health_grpc.HealthStub(ch).Check(health_pb.HealthCheckRequest(service=""),
                                                timeout=5).status
    except Exception as e:  # reported by the check
        return str(e)
    finally:
        ch.close()


def check_units():
    d = os.path.join(cluster.SOURCE_DIR, "deploy", "systemd")
    for unit, binary in (("pdserve-router.service", "router"),
                         ("pdserve-prefill@.service", "prefill-node"),
                         ("pdserve-decode@.service", "decode-node")):
        path = os.path.join(d, unit)
        text = open(path).read() if os.path.exists(path) else ""
        check("unit-%s" % unit, "Type=notify" in text and "WatchdogSec=" in text and
              "NotifyAccess=main" in text and "/%s " % binary in text and
              "--log-format json" in text and "KillSignal=SIGTERM" in text and
              ("--node %i" in text) == (binary != "router"), text or "missing")


def node_drain(n):
    """The node's /health "drain" field (None when it has none)."""
    try:
        with urllib.request.urlopen("http://%s:%s/health" % (n["host"], n["http_port"]),
                                    timeout=10) as r:
            return json.load(r).get("drain")
    except Exception as e:  # a 503 is still a body
        try:
            return json.load(e).get("drain")
        except Exception:
            return repr(e)


def start(procs, n, cfg, tmp, suffix=""):
    role = n["role"]
    mgr = FakeManager(os.path.join(tmp, "%s%s.notify" % (n["name"], suffix)))
    env = dict(os.environ, NOTIFY_SOCKET=mgr.path, WATCHDOG_USEC="400000",
               UCX_WARN_UNUSED_ENV_VARS="n")
    argv = [BIN[role], "--config", cfg, "--log-format", "json"]
    if role != "router":
        argv += ["--node", n["name"]]
    log = os.path.join(tmp, n["name"] + suffix + ".log")
    with open(log, "wb") as lf:
        p = subprocess.Popen(argv, env=env, stdout=lf, stderr=subprocess.STDOUT)
    procs[n["name"]] = (p, mgr, n, log)


def pdctl_state(addr, node):
    p = subprocess.run([PDCTL, "nodes", "--router", addr, "--json"], capture_output=True,
                       text=True, timeout=60)
    try:
        return {x["node"]: x["state"] for x in json.loads(p.stdout)}.get(node)
    except (ValueError, KeyError, TypeError):
        return p.stdout + p.stderr


def status_has(mgr, what, timeout):
    return mgr.poll(lambda ms: any(ln.startswith("STATUS=") and what in ln
                                   for _, m in ms for ln in m.split("\n")), timeout)


def drain_cycle(procs, cfg, tmp):
    """pdctl drain: the node knows, tells systemd, and a restarted router keeps it."""
    _, dmgr, dnode, _ = procs["decode0"]
    rnode = procs["router"][2]
    addr = "%s:%s" % (rnode["host"], rnode["port"])
    p = subprocess.run([PDCTL, "drain", "decode0", "--router", addr, "--wait-s", "60"],
                       capture_output=True, text=True, timeout=90)
    check("pdctl-drain", p.returncode == 0 and "drained" in p.stdout, p.stdout + p.stderr)
    check("drain-status-to-systemd", status_has(dmgr, "decode0: drained (pdctl drain)", 15),
          dmgr.msgs[-5:])
    check("drain-in-node-health", node_drain(dnode) == "drained", node_drain(dnode))
    check("drain-not-stopping", dmgr.count("STOPPING=1") == 0, dmgr.msgs[-5:])
    p = subprocess.run([PDCTL, "health", "--config", cfg, "--json"], capture_output=True,
                       text=True, timeout=60)
    try:
        st = {x["node"]: x["stats"] for x in json.loads(p.stdout)["nodes"]}
    except (ValueError, KeyError, TypeError):
        st = {}
    check("drain-in-pdctl-health", (st.get("decode0") or {}).get("operator_drain") is True and
          (st.get("prefill0") or {}).get("operator_drain") is False, p.stdout + p.stderr)
    # the router restarts: it learns the drain back from the node
    rp = procs["router"][0]
    rp.send_signal(signal.SIGTERM)
    check("router-restart-exit-0", rp.wait(timeout=120) == 0)
    start(procs, rnode, cfg, tmp, "-2")
    _, rmgr, _, rlog = procs["router"]
    check("router-restart-ready",
          rmgr.poll(lambda ms: any("READY=1" in m.split("\n") for _, m in ms), 120))
    end, state = time.time() + 30, None
    while time.time() < end:
        state = pdctl_state(addr, "decode0")
        if state == "drained":
            break
        time.sleep(0.2)
    check("router-restart-keeps-drain", state == "drained", state)
    check("router-restart-logged", "drained before this router started" in
          open(rlog, errors="replace").read(), rlog)
    p = subprocess.run([PDCTL, "undrain", "decode0", "--router", addr], capture_output=True,
                       text=True, timeout=60)
    check("pdctl-undrain", p.returncode == 0, p.stdout + p.stderr)
    check("undrain-status-to-systemd", status_has(dmgr, "decode0: serving (undrained)", 15),
          dmgr.msgs[-5:])
    check("undrain-in-node-health", node_drain(dnode) == "none", node_drain(dnode))
    check("undrain-router", pdctl_state(addr, "decode0") == "serving",
          pdctl_state(addr, "decode0"))


def main():
    check_units()
    tmp = tempfile.mkdtemp(prefix="pd-test-notify-")
    tpl = model_template(TEMPLATE_1, "tiny-llama", tmp)
    with open(tpl) as f:
        text, nodes = cluster.rewrite_config(f.read(), os.path.dirname(tpl),
                                             all_nodes(tpl, weights="bf16", kv="f32"))
    cfg = os.path.join(tmp, "cluster.yaml")
    with open(cfg, "w") as f:
        f.write(text)
    procs = {}
    try:
        for n in nodes:
            start(procs, n, cfg, tmp)
        for name, (p, mgr, n, log) in procs.items():
            got = mgr.poll(lambda ms: any("READY=1" in m.split("\n") for _, m in ms), 300)
            check("%s-ready" % name, got, mgr.msgs)
            if got and n["role"] != "router":
                # READY=1 means the node answers SERVING now
                check("%s-serving-at-ready" % name, health_status(n["host"], n["port"]) == 1)
            elif got:
                check("router-listening-at-ready",
                      isinstance(health_status(n["host"], n["port"]), int))
        for name, (p, mgr, n, log) in procs.items():
            check("%s-watchdog" % name, mgr.poll(lambda ms: sum(
                "WATCHDOG=1" in m.split("\n") for _, m in ms) >= 3, 30), mgr.msgs[-5:])
            check("%s-ready-once" % name, mgr.count("READY=1") == 1, mgr.msgs)
        drain_cycle(procs, cfg, tmp)
        # SIGTERM: the router first (as pdctl down does), then the nodes
        for name in ["router"] + [k for k in procs if k != "router"]:
            p, mgr, n, log = procs[name]
            p.send_signal(signal.SIGTERM)
            check("%s-stopping" % name,
                  mgr.poll(lambda ms: any("STOPPING=1" in m.split("\n") for _, m in ms), 60),
                  mgr.msgs[-5:])
            check("%s-exit-0" % name, p.wait(timeout=120) == 0)
        for name, (p, mgr, n, log) in procs.items():
            lines = [ln for ln in open(log, errors="replace").read().splitlines() if ln.strip()]
            bad = []
            for ln in lines:
                if "UCX " in ln and not ln.startswith("{"):
                    continue  # UCX's own messages (its logger, not ours)
                try:
                    o = json.loads(ln)
                    if not all(k in o for k in ("ts", "level", "tag", "msg")):
                        bad.append(ln)
                except ValueError:
                    bad.append(ln)
            check("%s-json-log" % name, len(lines) >= 3 and not bad, (len(lines), bad[:3]))
    finally:
        for p, mgr, n, log in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    import cluster_testlib
    if cluster_testlib.failures:
        print("logs kept in %s" % tmp)
    else:
        shutil.rmtree(tmp, True)
    finish()


if __name__ == "__main__":
    main()
