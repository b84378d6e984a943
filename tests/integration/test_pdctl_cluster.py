"""pdctl up / down / health / generate --router / models, cluster.py and tests/bench/loadgen.py,
against fake_node.py standing in for the three server binaries (PDSERVE_BIN_DIR). Run by meson
test with /usr/bin/python3; argv[1] is pdctl."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
import cluster  # noqa: E402

PDCTL = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else cluster.pdctl_path()
os.environ["PDCTL"] = PDCTL
TEMPLATE_1 = os.path.join(cluster.SOURCE_DIR, "deploy", "local.yaml")
TEMPLATE_4 = os.path.join(cluster.SOURCE_DIR, "deploy", "local-2p2d.yaml")
failures = []


def check(name, ok, detail=""):
    print("%s %s%s" % ("ok  " if ok else "FAIL", name, "" if ok else ": " + detail[-1500:]),
          flush=True)
    if not ok:
        failures.append(name)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def setup_fakes():
    tmp = tempfile.mkdtemp(prefix="pd-fake-bin-")
    stubs = os.path.join(tmp, "stubs")
    os.makedirs(stubs)
    cluster.gen_stubs(stubs)
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir)
    for name, role in (("router", "router"), ("prefill-node", "prefill"),
                       ("decode-node", "decode")):
        p = os.path.join(bindir, name)
        with open(p, "w") as f:
            f.write('#!/bin/sh\nexec /usr/bin/python3 %s %s "$@"\n'
                    % (os.path.join(HERE, "fake_node.py"), role))
        os.chmod(p, 0o755)
    os.environ["PDSERVE_BIN_DIR"] = bindir
    os.environ["FAKE_NODE_STUBS"] = stubs
    os.environ["FAKE_NODE_LOAD_S"] = "0.5"
    return tmp


def test_nothing_listening():
    c = cluster.Cluster(TEMPLATE_4, start=False)
    p = c.pdctl("health", "--config", c.config, "--timeout-ms", "2000")
    lines = p.stdout.splitlines()
    check("health-down-rc", p.returncode == 1, p.stdout + p.stderr)
    check("health-down-table", lines and lines[0].startswith("NODE") and
          sum("UNREACHABLE" in ln for ln in lines[1:6]) == 5, p.stdout)
    p = c.pdctl("health", "--config", c.config, "--json", "--timeout-ms", "2000")
    j = json.loads(p.stdout)
    check("health-down-json", p.returncode == 1 and not j["ok"] and len(j["nodes"]) == 5 and
          all(n["status"] == "UNREACHABLE" for n in j["nodes"]), p.stdout)
    p = c.pdctl("down", "--config", c.config)
    check("down-when-not-up", p.returncode == 0 and "already down" in p.stdout,
          p.stdout + p.stderr)
    p = c.pdctl("generate", "--router", c.router_addr, "--prompt", "x", "--max-tokens", "2")
    check("generate-unavailable", p.returncode == 1 and "UNAVAILABLE" in p.stderr, p.stderr)
    c.stop()


def test_up_down():
    with cluster.Cluster(TEMPLATE_4) as c:
        check("up-table", "cluster up" in c.up_output and all(
            n["name"] in c.up_output for n in c.nodes), c.up_output)
        pids = c.state_pids()
        check("up-pids", len(pids) == 5 and all(alive(p) for p in pids), str(pids))
        p = c.pdctl("health", "--config", c.config)
        check("health-up", p.returncode == 0 and p.stdout.count("SERVING") == 5 and
              "17/4096" in p.stdout, p.stdout + p.stderr)
        node = c.nodes[1]
        p = c.pdctl("health", "--addr", "%s:%s" % (node["host"], node["port"]), "--json")
        j = json.loads(p.stdout)
        check("health-addr", p.returncode == 0 and j["nodes"][0]["role"] == "prefill" and
              j["nodes"][0]["stats"]["pages_total"] == 4096, p.stdout)
        p = c.pdctl("generate", "--router", c.router_addr, "--prompt", "hello", "--max-tokens",
                    "4", "--json", "--ignore-eos", "--stop", "zz", "--seed", "3")
        j = json.loads(p.stdout or "{}")
        check("generate-json", p.returncode == 0 and j.get("output_ids") == [104, 101, 108, 108]
              and j.get("finish_reason") == "length" and
              j.get("usage", {}).get("completion_tokens") == 4, p.stdout + p.stderr)
        p = c.pdctl("generate", "--router", c.router_addr, "--prompt", "hello", "--max-tokens",
                    "3")
        check("generate-stream", p.returncode == 0 and len(p.stdout.strip()) == 3, p.stdout)
        p = c.pdctl("models", "--router", c.router_addr)
        check("models", p.returncode == 0 and json.loads(p.stdout)["decode_kv"] == "fp8",
              p.stdout + p.stderr)
        p = c.pdctl("up", "--detach", "--config", c.config)
        check("up-twice-refused", p.returncode == 1 and "already up" in p.stderr, p.stderr)
        # a node going away shows in health
        os.kill(pids[2], signal.SIGKILL)
        time.sleep(0.3)
        p = c.pdctl("health", "--config", c.config)
        check("health-one-down", p.returncode == 1 and "UNREACHABLE" in p.stdout, p.stdout)
        p = c.pdctl("down", "--config", c.config)
        check("down", p.returncode == 0 and "cluster down" in p.stdout, p.stdout + p.stderr)
        check("down-pids-gone", not any(alive(x) for x in pids), str(pids))
        check("down-state-removed", c.state_pids() == [], "")
        check("down-clean-exit", "shutting down" in c.log("router"), c.log("router"))


def test_up_failure():
    os.environ["FAKE_NODE_FAIL"] = "decode0"
    try:
        c = cluster.Cluster(TEMPLATE_1, start=False)
        p = c.pdctl("up", "--detach", "--config", c.config, "--log-dir", c.log_dir, timeout=120)
        check("up-fail-rc", p.returncode == 1, p.stderr)
        check("up-fail-names-node", "decode0" in p.stderr and "exited with status 3" in p.stderr
              and "injected failure" in p.stderr, p.stderr)
        check("up-fail-no-state", c.state_pids() == [], "")
        c.stop()
    finally:
        del os.environ["FAKE_NODE_FAIL"]
    os.environ["FAKE_NODE_HANG"] = "prefill0"
    try:
        c = cluster.Cluster(TEMPLATE_1, start=False)
        p = c.pdctl("up", "--detach", "--config", c.config, "--timeout-s", "2", timeout=120)
        check("up-timeout", p.returncode == 1 and "prefill0" in p.stderr and
              "not serving after 2 s" in p.stderr and "NOT_SERVING" in p.stderr, p.stderr)
        c.stop()
    finally:
        del os.environ["FAKE_NODE_HANG"]


def test_foreground():
    c = cluster.Cluster(TEMPLATE_1, start=False)
    proc = subprocess.Popen([PDCTL, "up", "--config", c.config, "--grace-s", "5"], env=c.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = ""
        end = time.time() + 60
        while "cluster up" not in out and time.time() < end and proc.poll() is None:
            out += proc.stdout.readline()
        check("fg-up", "cluster up" in out, out)
        pids = c.state_pids()
        os.kill(pids[0], signal.SIGKILL)  # prefill0 dies: reported, the rest keep running
        time.sleep(1.0)
        check("fg-keeps-running", proc.poll() is None and alive(pids[1]) and alive(pids[2]),
              str(pids))
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(30)
        err = proc.stderr.read()
        check("fg-stop", rc == 0 and not any(alive(x) for x in pids), "rc=%s %s" % (rc, err))
        check("fg-reported-death", "prefill0" in err and "killed by signal 9" in err, err)
        check("fg-state-removed", c.state_pids() == [], "")
    finally:
        if proc.poll() is None:
            proc.kill()
        c.stop()


def test_loadgen():
    import loadgen
    r = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "..", "bench", "loadgen.py"),
                        "--config-template", TEMPLATE_1, "--concurrency", "3", "--requests", "9",
                        "--prompt-len", "5", "--output-len", "6", "--json"],
                       capture_output=True, text=True, timeout=120)
    try:
        j = json.loads(r.stdout)
    except ValueError:
        j = {}
    check("loadgen-config-template", r.returncode == 0 and j.get("completed") == 9 and
          j.get("output_tokens") == 54 and j.get("ttft_ms_p50", 0) > 0, r.stdout + r.stderr)
    with cluster.Cluster(TEMPLATE_1) as c:
        res = loadgen.run(c.router_addr, 2, 4, 3, 5, text=True)
        check("loadgen-run", res["completed"] == 4 and res["output_tokens"] == 20 and
              res["itl_ms_p99"] >= res["itl_ms_p50"], json.dumps(res))


def main():
    tmp = setup_fakes()
    try:
        test_nothing_listening()
        test_up_down()
        test_up_failure()
        test_foreground()
        test_loadgen()
    finally:
        subprocess.run(["rm", "-rf", tmp])
    if failures:
        print("FAILED: %s" % ", ".join(failures))
        return 1
    print("all pdctl cluster checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
