"""Issue 13: floods of idle and half-open connections against a real router (no nodes needed).

The router runs with RLIMIT_NOFILE 256 (soft and hard) and short timeouts (--set
router.idle_timeout_ms=3000, header_timeout_ms=2000); max_connections is left unset, so each
listener's limit comes from the descriptor limit: (256 - 128) / 2 = 64. Before the limits, 300
idle HTTP connections used up the router's descriptors and its gRPC port stopped answering.

- HTTP flood: 40 half-open requests (a request line, no end of headers) and 300 idle
  connections. While they are held, a gRPC health Check answers; the half-open ones get 408, the
  ones past the limit a 503, every one is closed by the router; then GET /live answers 200.
- gRPC flood: 300 idle TCP connections to the gRPC port. While they are held, GET /live answers;
  every one is closed by the router (past the limit at once, the others after the idle timeout);
  then a gRPC health Check answers again.
- The router logs its lowered limit once, "connection limit reached" at most twice per flood
  (never once per connection), and exits 0 on SIGTERM.
Run by meson with /usr/bin/python3; argv[1] is pdctl (unused; the router comes from the build)."""
import os
import resource
import select
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from cluster_testlib import check, finish, health_grpc, health_pb
import cluster
import grpc

TMP = tempfile.mkdtemp(prefix="pd-test-netlimits-")
ROUTER = os.path.join(cluster.BUILD_DIR, "router", "router")
MODELS = os.environ.get("PD_MODELS_DIR", os.path.join(cluster.SOURCE_DIR, "deploy", "models"))
NOFILE = 256
LIMIT = (NOFILE - 128) // 2


def raise_own_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4096) if hard != resource.RLIM_INFINITY else 4096
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def start_router():
    ports = []
    for _ in range(5):
        ports.append(cluster.free_port(ports))
    cfg = os.path.join(TMP, "cluster.yaml")
    with open(cfg, "w") as f:
        f.write("model: %s/tiny-llama\n"
                "router:\n  listen: 127.0.0.1:%d\n  http: 127.0.0.1:%d\n"
                "nodes:\n"
                "  - {name: prefill0, role: prefill, host: 127.0.0.1, port: %d}\n"
                "  - {name: decode0, role: decode, host: 127.0.0.1, port: %d, ucx_port: %d}\n"
                % (MODELS, ports[0], ports[1], ports[2], ports[3], ports[4]))
    log = open(os.path.join(TMP, "router.log"), "w")

    def limit_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    p = subprocess.Popen([ROUTER, "--config", cfg, "--set", "router.idle_timeout_ms=3000",
                          "--set", "router.header_timeout_ms=2000"],
                         stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit_fds)
    return p, ports[0], ports[1]


def router_log():
    with open(os.path.join(TMP, "router.log")) as f:
        return f.read()


def http_get(port, path, timeout=5):
    """(status, body) of GET path, or (None, error text)."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path),
                                    timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except Exception as e:  # noqa: BLE001 - any failure is a result here
        return None, repr(e)


def wait_live(port, proc, timeout=30):
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        if http_get(port, "/live", timeout=1)[0] == 200:
            return True
        time.sleep(0.05)
    return False


def grpc_health(port, timeout=5):
    """The router's health status (NOT_SERVING without nodes is an answer), or the error."""
    with grpc.insecure_channel("127.0.0.1:%d" % port) as ch:
        try:
            r = health_grpc.HealthStub(ch).Check(health_pb.HealthCheckRequest(service=""),
                                                 timeout=timeout)
            return True, r.status
        except grpc.RpcError as e:
            return False, "%s %s" % (e.code(), e.details())


def open_conns(port, n, first=b""):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if first:
            s.sendall(first)
        s.setblocking(False)
        socks.append(s)
    return socks


def drain_until_closed(socks, timeout):
    """Reads every socket until the router closes it. Returns ({socket: bytes read}, open left)."""
    got = {s: b"" for s in socks}
    live = set(socks)
    end = time.time() + timeout
    while live and time.time() < end:
        r, _, _ = select.select(list(live), [], [], 0.2)
        for s in r:
            try:
                d = s.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                d = b""
            except BlockingIOError:
                continue
            if d:
                got[s] += d
            else:
                live.discard(s)
    return got, len(live)


def status_of(data):
    return int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else None


def test_http_flood(grpc_port, http_port):
    half = open_conns(http_port, 40, b"GET /live HTTP/1.1\r\nHost: x\r\n")
    idle = open_conns(http_port, 300)
    t0 = time.time()
    ok, st = grpc_health(grpc_port)
    check("http-flood: grpc answers while %d http connections are held" % (len(half) + len(idle)),
          ok, st)
    check("http-flood: grpc answered before the idle timeout", time.time() - t0 < 3.0,
          time.time() - t0)
    got, left = drain_until_closed(half + idle, 15)
    check("http-flood: the router closed every connection", left == 0, "%d still open" % left)
    half_408 = sum(1 for s in half if status_of(got[s]) == 408)
    check("http-flood: half-open requests answered 408", half_408 == len(half),
          [got[s][:40] for s in half if status_of(got[s]) != 408][:3])
    n503 = sum(1 for s in idle if status_of(got[s]) == 503)
    n_silent = sum(1 for s in idle if got[s] == b"")
    check("http-flood: connections past the limit got 503", n503 >= len(idle) - LIMIT,
          "%d of %d got 503" % (n503, len(idle)))
    check("http-flood: idle connections closed without an answer", n503 + n_silent == len(idle),
          [got[s][:40] for s in idle if got[s] and status_of(got[s]) != 503][:3])
    for s in half + idle:
        s.close()
    code, body = http_get(http_port, "/live")
    check("http-flood: /live answers afterwards", code == 200, (code, body))


def test_grpc_flood(grpc_port, http_port):
    idle = open_conns(grpc_port, 300)
    code, body = http_get(http_port, "/live")
    check("grpc-flood: /live answers while 300 grpc connections are held", code == 200,
          (code, body))
    _, left = drain_until_closed(idle, 20)
    check("grpc-flood: the router closed every connection", left == 0, "%d still open" % left)
    for s in idle:
        s.close()
    ok, st = grpc_health(grpc_port)
    check("grpc-flood: grpc answers afterwards", ok, st)


def main():
    raise_own_nofile()
    check("router binary built", os.path.exists(ROUTER), ROUTER)
    p, grpc_port, http_port = start_router()
    try:
        if not check("router is live", wait_live(http_port, p), router_log()):
            finish()
        test_http_flood(grpc_port, http_port)
        test_grpc_flood(grpc_port, http_port)
        log = router_log()
        check("router logged its lowered limit",
              "http: at most %d connections (RLIMIT_NOFILE %d" % (LIMIT, NOFILE) in log and
              "grpc server: at most %d connections (RLIMIT_NOFILE %d" % (LIMIT, NOFILE) in log,
              log[-2000:])
        for name in ("http", "grpc server"):
            n = log.count("%s: connection limit reached" % name)
            check("%s: rejections logged once per burst (%d lines)" % (name, n), 1 <= n <= 2,
                  log[-2000:])
        # the listeners' counters are on /metrics (Prometheus text)
        code, body = http_get(http_port, "/metrics")
        text = body.decode() if isinstance(body, bytes) else body

        def value(name, listener):
            for line in text.splitlines():
                if line.startswith('%s{listener="%s"}' % (name, listener)):
                    return float(line.split()[-1])
            return None
        got = {k: value(k, l) for k, l in (("pdserve_listener_rejected_total", "http"),
                                           ("pdserve_listener_timeouts_total", "http"),
                                           ("pdserve_listener_rejected_total", "grpc"),
                                           ("pdserve_listener_idle_closed_total", "grpc"),
                                           ("pdserve_listener_connections_max", "http"))}
        check("metrics: listener counters exported", code == 200 and
              got[("pdserve_listener_rejected_total")] is not None and
              all(v is not None for v in got.values()), got)
        check("metrics: http rejections and 408s counted",
              (value("pdserve_listener_rejected_total", "http") or 0) > 0 and
              (value("pdserve_listener_timeouts_total", "http") or 0) > 0, text[-3000:])
        check("metrics: grpc rejections and idle closes counted",
              (value("pdserve_listener_rejected_total", "grpc") or 0) > 0 and
              (value("pdserve_listener_idle_closed_total", "grpc") or 0) > 0, text[-3000:])
        check("metrics: the limit", value("pdserve_listener_connections_max", "http") == LIMIT,
              value("pdserve_listener_connections_max", "http"))
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
    check("router exits 0 on SIGTERM", rc == 0, router_log()[-2000:])
    finish()


if __name__ == "__main__":
    main()
