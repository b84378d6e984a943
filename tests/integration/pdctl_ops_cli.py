#!/usr/bin/env python3
"""pdctl's cluster commands without any server (stdlib python only): health against nothing
listening (every node UNREACHABLE, table printed, exit 1), down when not up (exit 0), and bad
arguments (exit 2 with a message). argv[1] is pdctl. Run by meson test."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import SOURCE_DIR, rewrite_config  # noqa: E402  (stdlib-only part of cluster.py)

PDCTL = sys.argv[1]
failures = []


def run(*args, env=None):
    p = subprocess.run([PDCTL] + list(args), capture_output=True, text=True, timeout=60, env=env)
    return p.returncode, p.stdout, p.stderr


def check(name, ok, detail):
    print("%s %s" % ("ok  " if ok else "FAIL", name) + ("" if ok else ": " + detail))
    if not ok:
        failures.append(name)


tmp = tempfile.mkdtemp(prefix="pd-ops-cli-")
env = dict(os.environ, PDSERVE_STATE_DIR=tmp)
tpl = os.path.join(SOURCE_DIR, "deploy", "local-2p2d.yaml")
cfg = os.path.join(tmp, "c.yaml")
with open(tpl) as f:
    text, nodes = rewrite_config(f.read(), os.path.dirname(tpl))
with open(cfg, "w") as f:
    f.write(text)

rc, out, err = run("health", "--config", cfg, "--timeout-ms", "2000", env=env)
lines = out.splitlines()
check("health-unreachable", rc == 1 and lines[0].split()[:4] == ["NODE", "ROLE", "ADDRESS",
      "STATUS"] and all(n["name"] in out for n in nodes) and
      sum(ln.split()[3] == "UNREACHABLE" for ln in lines[1:6]) == 5, "rc=%d %s %s" % (rc, out, err))
rc, out, err = run("health", "--addr", "127.0.0.1:%s" % nodes[1]["port"], env=env)
check("health-addr-unreachable", rc == 1 and "UNREACHABLE" in out, out + err)
rc, out, err = run("down", "--config", cfg, env=env)
check("down-not-up", rc == 0 and "already down" in out, out + err)
for name, args, frag in [
        ("health-no-target", ["health"], "--config FILE or --addr"),
        ("health-bad-addr", ["health", "--addr", "nohost"], "not HOST:PORT"),
        ("health-bad-timeout", ["health", "--config", cfg, "--timeout-ms", "x"], "--timeout-ms"),
        ("up-no-config", ["up"], "--config FILE is required"),
        ("up-missing-file", ["up", "--config", os.path.join(tmp, "nope.yaml")], "nope.yaml"),
        ("up-bad-option", ["up", "--config", cfg, "--bogus", "1"], "unknown option"),
        ("down-missing-file", ["down", "--config", os.path.join(tmp, "nope.yaml")], "nope.yaml"),
        ("generate-bad-router", ["generate", "--router", "x", "--prompt", "a"], "not HOST:PORT"),
        ("generate-no-prompt", ["generate", "--router", "127.0.0.1:1"], "--prompt"),
        ("models-no-router", ["models"], "--router"),
]:
    rc, out, err = run(*args, env=env)
    check(name, rc == 2 and frag in err, "rc=%d %s" % (rc, err))
subprocess.run(["rm", "-rf", tmp])
print("FAILED: " + ", ".join(failures) if failures else "all pdctl ops cli checks passed")
sys.exit(1 if failures else 0)
