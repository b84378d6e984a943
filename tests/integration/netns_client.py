"""The gRPC client of the network-namespace tests, run inside the client namespace
(`ip netns exec NS /usr/bin/python3 netns_client.py STUBS_DIR ROUTER_ADDR REQUESTS_JSON`).
REQUESTS_JSON: a list of {"token_ids": [...], "max_tokens": N, "timeout": seconds}. Runs them all
in parallel; prints "started" (flushed) once each has its first message or has ended, then one JSON
line: per request {"code", "details", "ids", "elapsed", "finish_reason"}."""
import json
import sys
import threading
import time

sys.path.insert(0, sys.argv[1])
import grpc  # noqa: E402
import pdserve_pb2 as pb  # noqa: E402
import pdserve_pb2_grpc as pb_grpc  # noqa: E402


def main():
    addr, reqs = sys.argv[2], json.loads(sys.argv[3])
    ch = grpc.insecure_channel(addr)
    stub = pb_grpc.InferenceStub(ch)
    out = [None] * len(reqs)
    first = [threading.Event() for _ in reqs]

    def one(i):
        q = reqs[i]
        r = {"code": "OK", "details": "", "ids": [], "finish_reason": ""}
        t0 = time.time()
        try:
            call = stub.Generate(pb.GenerateRequest(
                token_ids=q["token_ids"],
                sampling=pb.SamplingParams(max_tokens=q["max_tokens"], ignore_eos=True)),
                timeout=q["timeout"])
            for m in call:
                first[i].set()
                r["ids"].extend(m.token_ids)
                if m.finish_reason:
                    r["finish_reason"] = m.finish_reason
        except grpc.RpcError as e:
            r["code"], r["details"] = e.code().name, e.details() or ""
        r["elapsed"] = time.time() - t0
        first[i].set()
        out[i] = r
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in ts:
        t.start()
    for e in first:
        e.wait()
    print("started", flush=True)
    for t in ts:
        t.join()
    print(json.dumps(out), flush=True)
    ch.close()


if __name__ == "__main__":
    main()
