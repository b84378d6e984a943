"""Start and stop a pdserve cluster for tests and benchmarks (run with /usr/bin/python3: Debian's
grpcio lives there; nothing else outside the standard library).

    from cluster import Cluster, gen_stubs
    with Cluster("deploy/local.yaml", overrides={"decode0": {"kv": "fp8"}}) as c:
        print(c.router_addr, c.nodes)            # "127.0.0.1:41234", [{"name": ..., ...}]
        pb, pb_grpc, health_pb, health_grpc = gen_stubs()

Cluster copies the YAML into a temp dir with every port replaced by a free one (free_port: a
port below the ephemeral range, reserved for this process), the model path made absolute and
per-node keys overridden, then runs
`pdctl up --detach --config TMP.yaml` with its state and logs in the temp dir. stop() (also run
by the context manager, atexit, and SIGTERM/SIGINT/SIGHUP) runs `pdctl down` and kills any pid
of the state file still alive. The YAML is edited line by line (no YAML library needed); it
expects the layout of deploy/*.yaml: top-level keys, "router:" with indented keys, and "nodes:"
as a list of "- name: X" blocks.
"""
import atexit
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SOURCE_DIR = os.path.abspath(os.environ.get(
    "PD_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")))
BUILD_DIR = os.path.abspath(os.environ.get("PD_BUILD_DIR", os.path.join(SOURCE_DIR, "build")))
PROTO_DIR = os.path.join(SOURCE_DIR, "proto")


def pdctl_path():
    """The pdctl of the build tree ($PDCTL overrides), else the one on PATH."""
    p = os.environ.get("PDCTL") or os.path.join(BUILD_DIR, "deploy", "pdctl")
    return p if os.path.exists(p) else (shutil.which("pdctl") or p)


_stubs = None


def gen_stubs(out_dir=None):
    """Generates python stubs for proto/pdserve.proto and proto/health.proto (once per process)
    with grpc_tools.protoc and imports them. Returns (pdserve_pb2, pdserve_pb2_grpc, health_pb2,
    health_pb2_grpc)."""
    global _stubs
    if _stubs:
        return _stubs
    out = out_dir or tempfile.mkdtemp(prefix="pd-stubs-")
    if not out_dir:
        atexit.register(shutil.rmtree, out, True)
    if not os.path.exists(os.path.join(out, "pdserve_pb2_grpc.py")):
        subprocess.check_call([sys.executable, "-m", "grpc_tools.protoc", "-I" + PROTO_DIR,
                               "--python_out=" + out, "--grpc_python_out=" + out,
                               os.path.join(PROTO_DIR, "pdserve.proto"),
                               os.path.join(PROTO_DIR, "health.proto")])
    if out not in sys.path:
        sys.path.insert(0, out)
    import health_pb2
    import health_pb2_grpc
    import pdserve_pb2
    import pdserve_pb2_grpc
    _stubs = (pdserve_pb2, pdserve_pb2_grpc, health_pb2, health_pb2_grpc)
    return _stubs


PORT_DIR = os.environ.get("PD_TEST_PORT_DIR", "/tmp/pd-test-ports")
_reserved = []


def _ephemeral_range():
    """The kernel's ephemeral port range (ports it hands to bind(0) and to outgoing connects)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _claim(port):
    """Creates PORT_DIR/<port> holding our pid, atomically (O_EXCL); a file whose pid is dead is
    stale and taken over. Returns True when the port is ours."""
    path = os.path.join(PORT_DIR, str(port))
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            try:
                with open(path) as f:
                    pid = int(f.read().strip() or "0")
            except (OSError, ValueError):
                return False  # being written by its owner right now
            if pid and _pid_alive(pid):
                return False
            try:
                os.unlink(path)
            except OSError:
                return False
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        _reserved.append(path)
        return True
    return False


def _release_all():
    for path in _reserved:
        try:
            os.unlink(path)
        except OSError:
            pass


atexit.register(_release_all)


def free_port(taken=()):
    """A TCP port on 127.0.0.1 that no other test of this machine holds: drawn from below the
    kernel's ephemeral range (bind(0) and outgoing connections never land there, so a port
    picked here cannot be taken by another process between this call and the server's bind),
    reserved for this process's lifetime by a file in PORT_DIR (shared by every test process,
    so two tests running at once never get the same port), and bindable now."""
    lo, _ = _ephemeral_range()
    first, last = (20000, lo - 1) if lo > 21000 else (lo - 1000, lo - 1)
    os.makedirs(PORT_DIR, exist_ok=True)
    try:
        os.chmod(PORT_DIR, 0o1777)
    except OSError:
        pass
    span = last - first + 1
    start = random.randrange(span)
    for i in range(span):
        port = first + (start + i) % span
        if port in taken or not _claim(port):
            continue
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue  # in use by something outside the tests; stays reserved, never retried
        finally:
            s.close()
    raise RuntimeError("no free port in %d..%d" % (first, last))


_PORT_KEYS = ("port", "http_port", "ucx_port")
_ADDR_KEYS = ("listen", "http")


def rewrite_config(text, base_dir, overrides=None, router_overrides=None, ports=None):
    """Returns (new_text, nodes): every port replaced by a free one, the model path absolute
    (relative paths resolve against base_dir), node keys set from overrides {node: {key: value}}
    and router keys from router_overrides. nodes is a list of dicts (name, role, host, port and
    the other scalar keys as strings) plus the router as {"name": "router", ...}."""
    overrides = {k: dict(v) for k, v in (overrides or {}).items()}
    router_overrides = dict(router_overrides or {})
    taken = set(ports or ())
    out, nodes = [], []
    section, node = None, None

    def new_port():
        p = free_port(taken)
        taken.add(p)
        return p

    def flush_node():
        if node is not None:
            for k, v in overrides.pop(node["name"], {}).items():
                out.append("    %s: %s" % (k, v))
                node[k] = str(v)

    for raw in text.splitlines():
        line = raw.rstrip()
        m_top = re.match(r"^([A-Za-z_]+):\s*(.*?)\s*(#.*)?$", line)
        if m_top:
            if section == "nodes":
                flush_node()
                node = None
            if section == "router":
                for k, v in router_overrides.items():
                    out.append("  %s: %s" % (k, v))
                router_overrides = {}
            section = m_top.group(1)
            if section == "model":
                model = m_top.group(2).strip("'\"")
                if not os.path.isabs(model):
                    model = os.path.normpath(os.path.join(base_dir, model))
                line = "model: %s" % model
            out.append(line)
            continue
        m_item = re.match(r"^(\s*)-\s+name:\s*(\S+)", line)
        if section == "nodes" and m_item:
            flush_node()
            node = {"name": m_item.group(2).strip("'\"")}
            nodes.append(node)
            out.append(line)
            continue
        m_kv = re.match(r"^(\s+)([A-Za-z_]+):\s*(.*?)\s*(#.*)?$", line)
        if m_kv:
            ind, key, val = m_kv.group(1), m_kv.group(2), m_kv.group(3)
            if section == "router":
                if key in router_overrides:
                    val = str(router_overrides.pop(key))
                if key in _ADDR_KEYS and ":" in val:
                    val = "%s:%d" % (val.rsplit(":", 1)[0], new_port())
                line = "%s%s: %s" % (ind, key, val)
            elif section == "nodes" and node is not None:
                if key in overrides.get(node["name"], {}):
                    val = str(overrides[node["name"]].pop(key))
                elif key in _PORT_KEYS and val not in ("", "0"):
                    val = str(new_port())
                node[key] = val.strip("'\"")
                line = "%s%s: %s" % (ind, key, val)
        out.append(line)
    if section == "nodes":
        flush_node()
    if section == "router":
        for k, v in router_overrides.items():
            out.append("  %s: %s" % (k, v))
    left = {k: v for k, v in overrides.items() if v}
    if left:
        raise ValueError("overrides for unknown nodes: %s" % ", ".join(sorted(left)))
    text = "\n".join(out) + "\n"
    m = re.search(r"^router:\n((?:[ \t]+.*\n?)*)", text, re.M)
    router = {"name": "router", "role": "router"}
    for k, v in re.findall(r"^\s+([A-Za-z_]+):\s*(\S+)", m.group(1) if m else "", re.M):
        router[k] = v
    if "listen" in router:
        router["host"], router["port"] = router["listen"].rsplit(":", 1)
    return text, [router] + nodes


_live = []


def _stop_all():
    for c in list(_live):
        c.stop()


def _on_signal(signum, frame):
    _stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_stop_all)
for _sig in (signal.SIGTERM, signal.SIGHUP):
    try:
        if signal.getsignal(_sig) in (signal.SIG_DFL, None):
            signal.signal(_sig, _on_signal)
    except ValueError:  # not the main thread
        pass


class Cluster:
    """A cluster started from a config template by `pdctl up --detach`; see the module doc."""

    def __init__(self, template=None, overrides=None, router_overrides=None, start=True,
                 timeout_s=300, env=None, keep_dir=False):
        template = template or os.path.join(SOURCE_DIR, "deploy", "local.yaml")
        self.tmp = tempfile.mkdtemp(prefix="pd-cluster-")
        self.keep_dir = keep_dir
        self.config = os.path.join(self.tmp, os.path.basename(template))
        with open(template) as f:
            text, self.nodes = rewrite_config(f.read(), os.path.dirname(os.path.abspath(template)),
                                              overrides, router_overrides)
        with open(self.config, "w") as f:
            f.write(text)
        router = self.nodes[0]
        self.router_addr = "%s:%s" % (router.get("host", "127.0.0.1"), router.get("port"))
        self.router_http = router.get("http")
        self.timeout_s = timeout_s
        self.env = dict(os.environ)
        self.env["PDSERVE_STATE_DIR"] = self.tmp
        self.env.update(env or {})
        self.log_dir = os.path.join(self.tmp, "logs")
        self.up_output = ""
        self.running = False
        if start:
            self.start()

    def pdctl(self, *args, timeout=None, check=False):
        """Runs pdctl with this cluster's environment; returns CompletedProcess (text)."""
        p = subprocess.run([pdctl_path()] + list(args), env=self.env, capture_output=True,
                           text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError("pdctl %s failed (rc %d):\n%s%s" % (" ".join(args), p.returncode,
                                                                  p.stdout, p.stderr))
        return p

    def start(self):
        _live.append(self)
        self.running = True
        p = self.pdctl("up", "--detach", "--config", self.config, "--log-dir", self.log_dir,
                       "--timeout-s", str(self.timeout_s), timeout=self.timeout_s + 60)
        self.up_output = p.stdout + p.stderr
        if p.returncode != 0:
            self.stop()
            raise RuntimeError("pdctl up failed (rc %d):\n%s" % (p.returncode, self.up_output))
        return self

    def state_pids(self):
        """Pids recorded in the state file (empty when there is none)."""
        pids = []
        for name in os.listdir(self.tmp):
            if name.endswith(".state"):
                with open(os.path.join(self.tmp, name)) as f:
                    for line in f:
                        parts = line.rstrip("\n").split("\t")
                        if parts[0] == "proc" and len(parts) >= 5:
                            pids.append(int(parts[4]))
        return pids

    def log(self, node):
        """The log text of a node ("router" for the router)."""
        try:
            with open(os.path.join(self.log_dir, node + ".log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        """pdctl down, then SIGKILL to any recorded pid still alive; removes the temp dir."""
        if not self.running:
            return
        self.running = False
        pids = self.state_pids()
        try:
            self.pdctl("down", "--config", self.config, "--grace-s", "10", timeout=60)
        except Exception as e:  # keep going: the pids below still die
            print("cluster: pdctl down failed: %s" % e, file=sys.stderr)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self in _live:
            _live.remove(self)
        if not self.keep_dir:
            shutil.rmtree(self.tmp, True)

    def wait_serving(self, timeout=30):
        """Polls `pdctl health` until every node is SERVING; returns its output."""
        end = time.time() + timeout
        while True:
            p = self.pdctl("health", "--config", self.config, "--timeout-ms", "2000")
            if p.returncode == 0 or time.time() > end:
                return p
            time.sleep(0.2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


if __name__ == "__main__":
    # python3 cluster.py TEMPLATE: starts a cluster, prints the router address, waits for Ctrl-C.
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("template", nargs="?")
    ap.add_argument("--set", action="append", default=[], help="NODE.KEY=VALUE")
    a = ap.parse_args()
    ov = {}
    for s in a.set:
        k, v = s.split("=", 1)
        n, key = k.split(".", 1)
        ov.setdefault(n, {})[key] = v
    signal.signal(signal.SIGINT, _on_signal)
    with Cluster(a.template, overrides=ov) as c:
        print(c.up_output, end="")
        print("router %s  config %s" % (c.router_addr, c.config), flush=True)
        while True:
            time.sleep(3600)
