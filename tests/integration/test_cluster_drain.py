"""SIGTERM drains (issue 13): on the first SIGTERM a process stops taking new work (health
NOT_SERVING, new requests UNAVAILABLE), lets running requests finish, then exits 0; a second
SIGTERM stops it at once, and a decode node stopped with live Decode streams exits cleanly (the
streams end with UNAVAILABLE; the node does not touch its freed compute thread).
Run by meson with /usr/bin/python3; argv[1] is pdctl."""
import os
import signal
import tempfile
import threading
import time

from cluster_testlib import (TEMPLATE_1, all_nodes, channel, check, cluster, finish, generate,
                             model_template, pb_grpc, reference, sampling, stats)
import grpc

OK, UNAV = grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE


def pids_by_name(c):
    """{node name: pid} from the state file (the router is "router")."""
    out = {}
    for name in os.listdir(c.tmp):
        if name.endswith(".state"):
            for line in open(os.path.join(c.tmp, name)):
                parts = line.rstrip("\n").split("\t")
                if parts[0] == "proc" and len(parts) >= 5:
                    out[parts[1]] = int(parts[4])
    return out


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of pdctl's detached child still answers kill(0): look at its state
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def wait_gone(pid, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def wait_log(c, name, text, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        if text in c.log(name):
            return True
        time.sleep(0.02)
    return False


def wait_tokens(box, n, timeout=120):
    end = time.time() + timeout
    while time.time() < end and box["seen"] < n:
        time.sleep(0.02)
    return box["seen"] >= n


def start(tmp):
    tpl = model_template(TEMPLATE_1, "tiny-llama", tmp)
    return cluster.Cluster(tpl, overrides=all_nodes(tpl, weights="bf16", kv="bf16"), keep_dir=True)


def long_request(stub, box, n_tokens):
    ref = reference("tiny-llama")

    def on_msg(call, r):
        box["seen"] = len(r.ids)
    box["r"] = generate(stub, timeout=300, on_msg=on_msg, token_ids=ref["cases"][0]["input_ids"],
                        sampling=sampling(n_tokens, ignore_eos=True))


def test_drain():
    tmp = tempfile.mkdtemp(prefix="pd-test-drain-")
    c = start(tmp)
    try:
        stub = pb_grpc.InferenceStub(channel(c.router_addr))
        pids = pids_by_name(c)
        box = {"seen": 0}
        th = threading.Thread(target=long_request, args=(stub, box, 300))
        th.start()
        check("drain-request-running", wait_tokens(box, 5), box)
        os.kill(pids["router"], signal.SIGTERM)
        check("drain-router-draining", wait_log(c, "router", "draining"))
        # new work is refused while the running request goes on
        r2 = generate(stub, timeout=30, token_ids=[0, 654, 1134],
                      sampling=sampling(4, ignore_eos=True))
        check("drain-new-request-refused", r2.code == UNAV and "draining" in r2.details,
              (r2.code, r2.details))
        for name in ("prefill0", "decode0"):
            os.kill(pids[name], signal.SIGTERM)
        th.join(300)
        r = box.get("r")
        check("drain-running-request-finished", r is not None and r.code == OK and
              len(r.ids) == 300, r and (r.code, r.details, len(r.ids)))
        for name in ("router", "prefill0", "decode0"):
            check("drain-%s-exited" % name, wait_gone(pids[name], 60))
            log = c.log(name)
            check("drain-%s-drained" % name, "drained: stopping" in log, log[-1500:])
    finally:
        c.stop()


def test_second_signal():
    tmp = tempfile.mkdtemp(prefix="pd-test-drain2-")
    c = start(tmp)
    try:
        stub = pb_grpc.InferenceStub(channel(c.router_addr))
        pids = pids_by_name(c)
        box = {"seen": 0}
        th = threading.Thread(target=long_request, args=(stub, box, 2000))
        th.start()
        check("stop-request-running", wait_tokens(box, 5), box)
        dpid = pids["decode0"]
        os.kill(dpid, signal.SIGTERM)
        # the second signal once the first was handled (two pending SIGTERMs may merge into one):
        # stop now, with the stream live
        check("stop-decode-draining", wait_log(c, "decode0", "draining"))
        os.kill(dpid, signal.SIGTERM)
        check("stop-decode-exited", wait_gone(dpid, 30))
        th.join(120)
        r = box.get("r")
        check("stop-stream-ended-unavailable", r is not None and r.code == UNAV,
              r and (r.code, r.details, len(r.ids)))
        log = c.log("decode0")
        check("stop-decode-clean", "stopping now" in log and "stopped" in log and
              "AddressSanitizer" not in log and "Segmentation" not in log, log[-2000:])
    finally:
        c.stop()


def main():
    test_drain()
    test_second_signal()
    finish()


if __name__ == "__main__":
    main()
