"""A pdserve cluster spread over Linux network namespaces, as over hosts: each process (router,
prefill and decode nodes, and a client) in its own namespace with its own address, joined by veth
pairs on one bridge, so every byte between them (gRPC, UCX over TCP, HTTP) crosses a network
interface that a test can take down (`ip link set ... down`).

    with NetnsCluster(["router", "prefill0", "decode0", "client"]) as net:
        net.setup()                     # namespaces, bridge, addresses 10.213.0.1, .2, ...
        net.addr("decode0")             # "10.213.0.3"
        net.spawn("decode0", [binary, "--config", cfg, "--node", "decode0"])
        net.run("client", ["pdctl", "health", "--config", cfg])   # CompletedProcess
        net.link("decode0", up=False)   # cut decode0 off the bridge

Names are unique per run (a random id in every namespace, bridge and interface name), so runs of
several checkouts on one machine do not meet; the addresses are from 10.213.0.0/24 (a range no
real network here uses) and live only inside this run's namespaces, which reach each other only
through this run's bridge. cleanup() (also atexit, SIGTERM/SIGINT/SIGHUP and the context
manager) kills what spawn() started and deletes the namespaces, veth pairs and the bridge.
Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2's `ip`.
"""
import atexit
import os
import secrets
import signal
import subprocess
import time

SUBNET = "10.213.0"
IP = "/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else "ip"

_live = []


def _cleanup_all():
    for n in list(_live):
        n.cleanup()


def _on_signal(signum, frame):
    _cleanup_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_cleanup_all)
for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    try:
        signal.signal(_sig, _on_signal)
    except ValueError:  # not the main thread
        pass


def ip(*args, check=True):
    """Runs `ip ARGS`; raises RuntimeError with its stderr when check and it fails."""
    p = subprocess.run([IP] + list(args), capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), p.stderr.strip()))
    return p


class NetnsCluster:
    def __init__(self, names, log_dir="/tmp"):
        self.id = secrets.token_hex(3)
        self.names = list(names)
        self.ns = {n: "pd%s-%s" % (self.id, n) for n in self.names}
        self.host_if = {n: "pv%s%d" % (self.id, i) for i, n in enumerate(self.names)}
        self.ip = {n: "%s.%d" % (SUBNET, i + 1) for i, n in enumerate(self.names)}
        self.bridge = "pdb%s" % self.id
        self.log_dir = log_dir
        self.procs = {}  # name -> Popen
        self.made = []   # ("netns", name) / ("link", name), in creation order
        _live.append(self)

    def addr(self, name):
        return self.ip[name]

    def setup(self):
        """Creates the bridge, one namespace per name with eth0 = SUBNET.(i+1)/24 and lo up.
        Raises RuntimeError (what `ip` said) when the kernel refuses; what was made is left for
        cleanup()."""
        ip("link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        ip("link", "set", self.bridge, "up")
        for n in self.names:
            ns, hv, peer = self.ns[n], self.host_if[n], "pq%s%d" % (self.id, self.names.index(n))
            ip("netns", "add", ns)
            self.made.append(("netns", ns))
            ip("link", "add", hv, "type", "veth", "peer", "name", peer)
            self.made.append(("link", hv))
            ip("link", "set", hv, "master", self.bridge)
            ip("link", "set", hv, "up")
            ip("link", "set", peer, "netns", ns)
            ip("-n", ns, "link", "set", peer, "name", "eth0")
            ip("-n", ns, "addr", "add", self.ip[n] + "/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        return self

    def cmd(self, name, argv):
        return [IP, "netns", "exec", self.ns[name]] + list(argv)

    def spawn(self, name, argv, log=None, env=None):
        """Starts argv inside name's namespace (ip netns exec execs it: the pid is argv's), output
        to log (default LOG_DIR/NAME.log, appended). Returns the Popen."""
        log = log or os.path.join(self.log_dir, name + ".log")
        f = open(log, "ab")
        p = subprocess.Popen(self.cmd(name, argv), stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env)
        f.close()
        self.procs[name] = p
        return p

    def kill(self, name, sig=signal.SIGKILL, timeout=30):
        """Signals name's process and waits for it; returns its exit status (None if none)."""
        p = self.procs.get(name)
        if not p:
            return None
        if p.poll() is None:
            p.send_signal(sig)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait()

    def run(self, name, argv, timeout=120, **kw):
        """Runs argv inside name's namespace to its end; CompletedProcess (text)."""
        return subprocess.run(self.cmd(name, argv), capture_output=True, text=True,
                              timeout=timeout, **kw)

    def popen(self, name, argv, **kw):
        return subprocess.Popen(self.cmd(name, argv), **kw)

    def link(self, name, up):
        """Takes name's veth (bridge side) up or down: a cut cable, seen by nobody as a reset."""
        ip("link", "set", self.host_if[name], "up" if up else "down")

    def cleanup(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        self.procs = {}
        for kind, name in reversed(self.made):
            if kind == "netns":
                ip("netns", "del", name, check=False)
            else:
                ip("link", "del", name, check=False)
        self.made = []
        if self in _live:
            _live.remove(self)

    def leftovers(self):
        """Namespaces and links of this run that still exist (empty after cleanup)."""
        out = []
        ns = ip("netns", "list", check=False).stdout
        out += [n for n in self.ns.values() if n in ns.split()]
        links = ip("-o", "link", "show", check=False).stdout
        out += [n for n in list(self.host_if.values()) + [self.bridge]
                if (" %s:" % n) in links or (" %s@" % n) in links]
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()
        return False
