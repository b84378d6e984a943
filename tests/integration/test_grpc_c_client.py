"""The C gRPC client (tests/integration/grpc_test_client) against a python3-grpcio server, against
nothing (UNAVAILABLE), and against the C server (C <-> C)."""
import os
import subprocess
import sys
import threading
import time
import unittest
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402

import grpc_testlib as lib  # noqa: E402

pb, pbg, hpb, hpbg = lib.gen_stubs()


class Echo(pbg.EchoServicer):
    def __init__(self):
        self.lock = threading.Lock()
        self.cancels = 0
        self.last_deadline_ms = -1
        self.last_md = ""

    def _note(self, context):
        rem = context.time_remaining()
        md = dict(context.invocation_metadata())
        with self.lock:
            self.last_deadline_ms = int(rem * 1000) if rem is not None else -1
            self.last_md = md.get("x-test", "")

    def _watch_cancel(self, context):
        state = {"done": False}

        def cb():
            if not state["done"]:
                with self.lock:
                    self.cancels += 1
        context.add_callback(cb)
        return state

    def Unary(self, request, context):
        self._note(context)
        state = self._watch_cancel(context)
        end = time.time() + request.sleep_ms / 1000.0
        while time.time() < end and context.is_active():
            time.sleep(0.01)
        state["done"] = True
        if request.error_code:
            context.abort(grpc.StatusCode(tuple(
                c for c in grpc.StatusCode if c.value[0] == request.error_code)[0].value),
                request.error_message)
        return pb.EchoReply(text=request.text, payload=request.payload)

    def Stream(self, request, context):
        self._note(context)
        state = self._watch_cancel(context)
        time.sleep(request.sleep_ms / 1000.0)
        for i in range(request.count):
            if not context.is_active():
                return
            if request.delay_ms and i:
                time.sleep(request.delay_ms / 1000.0)
            yield pb.EchoReply(seq=i, text="stream", payload=b"p" * request.payload_size)
        state["done"] = True
        if request.error_code:
            code = [c for c in grpc.StatusCode if c.value[0] == request.error_code][0]
            context.abort(code, request.error_message)

    def Stats(self, request, context):
        with self.lock:
            return pb.StatsReply(cancels=self.cancels, last_deadline_ms=self.last_deadline_ms,
                                 last_metadata=self.last_md)


class Health(hpbg.HealthServicer):
    def Check(self, request, context):
        if request.service == "":
            return hpb.HealthCheckResponse(status=hpb.HealthCheckResponse.SERVING)
        context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")


def run_client(port, scenario, timeout=60):
    p = subprocess.run([lib.CLIENT_BIN, str(port), scenario], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr


class PythonServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.echo = Echo()
        cls.server = grpc.server(futures.ThreadPoolExecutor(max_workers=100),
                                 maximum_concurrent_rpcs=200)
        pbg.add_EchoServicer_to_server(cls.echo, cls.server)
        hpbg.add_HealthServicer_to_server(Health(), cls.server)
        cls.port = cls.server.add_insecure_port("127.0.0.1:0")
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(0)

    def scenario(self, name):
        rc, out = run_client(self.port, name)
        self.assertEqual(rc, 0, out)
        self.assertIn("ok " + name, out)

    def test_unary(self):
        self.scenario("unary")

    def test_stream(self):
        self.scenario("stream")

    def test_deadline(self):
        self.scenario("deadline")

    def test_cancel(self):
        self.scenario("cancel")

    def test_error(self):
        self.scenario("error")

    def test_health(self):
        self.scenario("health")

    def test_metadata(self):
        self.scenario("metadata")

    def test_many(self):
        self.scenario("many")


class NothingListensTest(unittest.TestCase):
    def test_unavailable(self):
        rc, out = run_client(lib.free_port(), "unavailable")
        self.assertEqual(rc, 0, out)


class CServerTest(unittest.TestCase):
    def test_all_against_c_server(self):
        server = lib.CServer()
        try:
            rc, out = run_client(server.port, "all", timeout=120)
            self.assertEqual(rc, 0, out)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
