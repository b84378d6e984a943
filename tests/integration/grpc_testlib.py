"""Helpers for the gRPC interop tests (run with /usr/bin/python3: Debian's grpcio lives there).

Generates python stubs for tests/support/testsvc.proto and proto/health.proto into a temp dir, starts the
C test server on an ephemeral port, and makes sure every process started here dies with the test.
"""
import atexit
import os
import subprocess
import sys
import tempfile
import time

SOURCE_DIR = os.environ.get("PD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD_DIR = os.environ.get("PD_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
PROTO_DIR = os.path.join(SOURCE_DIR, "proto")
TEST_PROTO_DIR = os.path.join(SOURCE_DIR, "tests", "support")
SERVER_BIN = os.path.join(BUILD_DIR, "tests", "integration", "grpc_test_server")
CLIENT_BIN = os.path.join(BUILD_DIR, "tests", "integration", "grpc_test_client")

_procs = []


def _kill_all():
    for p in _procs:
        if p.poll() is None:
            p.kill()
            p.wait()


atexit.register(_kill_all)


def gen_stubs():
    """Generates and imports the stubs; returns (testsvc_pb2, testsvc_pb2_grpc, health_pb2,
    health_pb2_grpc)."""
    out = tempfile.mkdtemp(prefix="pd-grpc-stubs-")
    atexit.register(lambda: subprocess.run(["rm", "-rf", out]))
    subprocess.check_call([sys.executable, "-m", "grpc_tools.protoc", "-I" + PROTO_DIR, "-I" + TEST_PROTO_DIR,
                           "--python_out=" + out, "--grpc_python_out=" + out,
                           os.path.join(TEST_PROTO_DIR, "testsvc.proto"),
                           os.path.join(PROTO_DIR, "health.proto")])
    sys.path.insert(0, out)
    import health_pb2
    import health_pb2_grpc
    import testsvc_pb2
    import testsvc_pb2_grpc
    return testsvc_pb2, testsvc_pb2_grpc, health_pb2, health_pb2_grpc


def spawn(args, **kw):
    p = subprocess.Popen(args, **kw)
    _procs.append(p)
    return p


class CServer:
    """The C test server on an ephemeral port."""

    def __init__(self, *extra):
        self.proc = spawn([SERVER_BIN, "--port", "0", *extra], stdout=subprocess.PIPE,
                          stderr=None, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError("test server did not start: %r" % line)
        self.port = int(line.split()[1])
        self.addr = "127.0.0.1:%d" % self.port

    def rss_kib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1

    def stop(self, timeout=10):
        """SIGTERM; returns the exit status (0 = clean shutdown, loop closed)."""
        self.proc.terminate()
        return self.proc.wait(timeout)


def wait_for(pred, timeout=10.0, step=0.02):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def free_port():
    """A port reserved for this test process (cluster.free_port: below the ephemeral range)."""
    import cluster
    return cluster.free_port()
