"""python3-grpcio clients against the C gRPC server (tests/integration/grpc_test_server)."""
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402

import grpc_testlib as lib  # noqa: E402

pb, pbg, hpb, hpbg = lib.gen_stubs()


class CServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = lib.CServer()
        cls.channel = grpc.insecure_channel(cls.server.addr)
        cls.stub = pbg.EchoStub(cls.channel)
        cls.health = hpbg.HealthStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        # after everything the server still serves, then shuts down cleanly (loop closed)
        ch = grpc.insecure_channel(cls.server.addr)
        rep = pbg.EchoStub(ch).Unary(pb.EchoRequest(text="still here"), timeout=5)
        assert rep.text == "still here"
        ch.close()
        rc = cls.server.stop()
        assert rc == 0, "server exit status %d" % rc

    def stats(self):
        return self.stub.Stats(pb.StatsRequest(), timeout=5)

    def wait_cancels(self, before, n=1):
        ok = lib.wait_for(lambda: self.stats().cancels >= before + n)
        self.assertTrue(ok, "server saw %d cancels, expected %d" % (self.stats().cancels,
                                                                     before + n))

    def test_unary(self):
        rep = self.stub.Unary(pb.EchoRequest(text="hello", payload=b"\x00\xff" * 5000), timeout=5)
        self.assertEqual(rep.text, "hello")
        self.assertEqual(rep.payload, b"\x00\xff" * 5000)
        rep = self.stub.Unary(pb.EchoRequest(), timeout=5)  # empty message (0-length frame)
        self.assertEqual(rep.text, "")

    def test_unary_metadata_and_deadline_header(self):
        self.stub.Unary(pb.EchoRequest(text="x"), timeout=7, metadata=[("x-test", "abc")])
        st = self.stats()
        self.assertEqual(st.last_metadata, "abc")
        # grpc-core rounds its grpc-timeout up a little
        self.assertTrue(0 < st.last_deadline_ms <= 7100, st.last_deadline_ms)

    def test_stream(self):
        reps = list(self.stub.Stream(pb.StreamRequest(count=100, payload_size=3000), timeout=10))
        self.assertEqual([r.seq for r in reps], list(range(100)))
        self.assertTrue(all(len(r.payload) == 3000 for r in reps))

    def test_stream_zero_and_error_after_messages(self):
        self.assertEqual(list(self.stub.Stream(pb.StreamRequest(count=0), timeout=5)), [])
        it = self.stub.Stream(pb.StreamRequest(count=2, error_code=8, error_message="no pages"),
                              timeout=5)
        got = []
        with self.assertRaises(grpc.RpcError) as cm:
            for r in it:
                got.append(r.seq)
        self.assertEqual(got, [0, 1])
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertEqual(cm.exception.details(), "no pages")

    def test_deadline(self):
        before = self.stats().cancels
        t0 = time.time()
        with self.assertRaises(grpc.RpcError) as cm:
            self.stub.Unary(pb.EchoRequest(sleep_ms=5000), timeout=0.3)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertLess(time.time() - t0, 3)
        self.wait_cancels(before)  # the handler's cancel callback ran
        # a streaming call past its deadline
        before = self.stats().cancels
        with self.assertRaises(grpc.RpcError) as cm:
            for _ in self.stub.Stream(pb.StreamRequest(count=1000, delay_ms=50), timeout=0.4):
                pass
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.wait_cancels(before)

    def test_cancel_mid_stream(self):
        before = self.stats().cancels
        it = self.stub.Stream(pb.StreamRequest(count=1000, delay_ms=20), timeout=20)
        self.assertEqual(next(it).seq, 0)
        self.assertEqual(next(it).seq, 1)
        it.cancel()
        self.wait_cancels(before)
        self.assertTrue(lib.wait_for(lambda: self.stats().active_calls == 1))  # only Stats

    def test_concurrent_streams(self):
        n, errors = 64, []

        def run(i):
            try:
                reps = list(self.stub.Stream(pb.StreamRequest(count=30, payload_size=200 + i,
                                                              delay_ms=2), timeout=30))
                if [r.seq for r in reps] != list(range(30)) or \
                        any(len(r.payload) != 200 + i for r in reps):
                    errors.append("stream %d: bad replies" % i)
            except Exception as e:  # noqa: BLE001
                errors.append("stream %d: %r" % (i, e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])

    def test_max_message_size(self):
        with self.assertRaises(grpc.RpcError) as cm:
            self.stub.Unary(pb.EchoRequest(payload=b"x" * (5 << 20)), timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        # just under the limit works
        rep = self.stub.Unary(pb.EchoRequest(payload=b"y" * ((4 << 20) - 100)), timeout=10)
        self.assertEqual(len(rep.payload), (4 << 20) - 100)

    def test_unknown_method_and_service(self):
        for path in ("/pdtest.Echo/Nope", "/pdtest.Nope/Unary", "/bad"):
            call = self.channel.unary_unary(path, request_serializer=lambda x: x,
                                            response_deserializer=lambda x: x)
            with self.assertRaises(grpc.RpcError) as cm:
                call(b"", timeout=5)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNIMPLEMENTED, path)

    def test_garbage_request(self):
        call = self.channel.unary_unary("/pdtest.Echo/Unary", request_serializer=lambda x: x,
                                        response_deserializer=lambda x: x)
        with self.assertRaises(grpc.RpcError) as cm:
            call(b"\xff\xff\xff\xff", timeout=5)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INTERNAL)

    def test_error_message_roundtrip(self):
        msg = "échec: 100% \u2713 \"quoted\" \u65e5\u672c %41 \t end"
        with self.assertRaises(grpc.RpcError) as cm:
            self.stub.Unary(pb.EchoRequest(error_code=9, error_message=msg), timeout=5)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(cm.exception.details(), msg)

    def test_health_check_and_watch(self):
        H = hpb.HealthCheckResponse
        self.assertEqual(self.health.Check(hpb.HealthCheckRequest(), timeout=5).status, H.SERVING)
        with self.assertRaises(grpc.RpcError) as cm:
            self.health.Check(hpb.HealthCheckRequest(service="pd.Unknown"), timeout=5)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

        watch = self.health.Watch(hpb.HealthCheckRequest(service="pd.Watched"), timeout=20)
        self.assertEqual(next(watch).status, H.SERVICE_UNKNOWN)
        self.stub.SetHealth(pb.SetHealthRequest(service="pd.Watched", status=H.NOT_SERVING))
        self.assertEqual(next(watch).status, H.NOT_SERVING)
        self.stub.SetHealth(pb.SetHealthRequest(service="pd.Watched", status=H.SERVING))
        self.assertEqual(next(watch).status, H.SERVING)
        self.assertEqual(self.health.Check(hpb.HealthCheckRequest(service="pd.Watched"),
                                           timeout=5).status, H.SERVING)
        before = self.stats().active_calls
        watch.cancel()
        self.assertTrue(lib.wait_for(lambda: self.stats().active_calls == before - 1))

    def test_client_vanishes_mid_stream(self):
        before = self.stats().cancels
        code = ("import sys, os, grpc; sys.path.insert(0, %r); import testsvc_pb2 as p, "
                "testsvc_pb2_grpc as g; it = g.EchoStub(grpc.insecure_channel(%r)).Stream("
                "p.StreamRequest(count=100000, delay_ms=5)); next(it); next(it); os._exit(0)"
                % (sys.path[0], self.server.addr))
        subprocess.run([sys.executable, "-c", code], timeout=30, check=True)
        self.wait_cancels(before)

    def test_slow_reader_memory_bounded(self):
        """A grpcio client that stops reading a 400 MB stream: the server's queue stays small."""
        before = self.stats().cancels
        rss0 = self.server.rss_kib()
        ch = grpc.insecure_channel(self.server.addr)
        it = pbg.EchoStub(ch).Stream(pb.StreamRequest(count=4000, payload_size=100000),
                                     timeout=60)
        next(it)
        time.sleep(1.5)
        st = self.stats()
        self.assertLess(st.buffered_bytes, 2 << 20, st)
        self.assertLess(self.server.rss_kib() - rss0, 64 << 10)
        it.cancel()
        ch.close()
        self.wait_cancels(before)

    def test_raw_socket_never_reads(self):
        """A raw h2 client that sends a request then never reads: bounded, then vanishes."""
        before = self.stats().cancels
        s = socket.create_connection(("127.0.0.1", self.server.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

        def frame(ftype, flags, sid, payload):
            return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + \
                struct.pack(">I", sid) + payload

        def lit(name, value):  # HPACK literal without indexing, new name, no huffman
            return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value

        hdrs = lit(b":method", b"POST") + lit(b":scheme", b"http") + \
            lit(b":path", b"/pdtest.Echo/Stream") + lit(b":authority", b"x") + \
            lit(b"content-type", b"application/grpc") + lit(b"te", b"trailers")
        msg = pb.StreamRequest(count=100000, payload_size=50000).SerializeToString()
        # a 16 MB stream window, and a connection window to match, so flow control never stops
        # the server: only its own buffer limits do
        settings = frame(4, 0, 0, struct.pack(">HI", 4, (1 << 24)))
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings +
                  frame(8, 0, 0, struct.pack(">I", (1 << 30))) +
                  frame(1, 4, 1, hdrs) +
                  frame(0, 1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
        time.sleep(1.5)
        st = self.stats()
        self.assertLess(st.buffered_bytes, 2 << 20, st)
        s.close()
        self.wait_cancels(before)


if __name__ == "__main__":
    unittest.main(verbosity=2)
