"""deploy/systemd's units under `systemd-analyze verify` (package systemd, deploy/install-deps.sh;
without it this test fails, it never skips): each unit is copied with its /usr/local/bin binary
replaced by this build's (verify checks that ExecStart is executable) and must verify with no
message at all. The check can fail: a copy with a misspelt Type= and one naming a missing binary
must each draw a complaint. Instance units are verified as decode0 / prefill0. Run by meson with
/usr/bin/python3; argv[1] is pdctl."""
import os
import shutil
import subprocess
import sys
import tempfile

from cluster_testlib import check, finish

SRC = os.path.join(os.environ["PD_SOURCE_DIR"], "deploy", "systemd")
BUILD = os.environ["PD_BUILD_DIR"]
BINS = {"router": "router/router", "prefill-node": "prefill-node/prefill-node",
        "decode-node": "decode-node/decode-node"}
UNITS = {"pdserve-router.service": "pdserve-router.service",
         "pdserve-prefill@.service": "pdserve-prefill@prefill0.service",
         "pdserve-decode@.service": "pdserve-decode@decode0.service"}


def verify(path):
    p = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True,
                       timeout=60)
    return p.returncode, (p.stdout + p.stderr).strip()


def copy(tmp, src, dst, edit=None):
    with open(os.path.join(SRC, src)) as f:
        text = f.read()
    for name, rel in BINS.items():
        text = text.replace("/usr/local/bin/" + name + " ", os.path.join(BUILD, rel) + " ")
    if edit:
        text = edit(text)
    path = os.path.join(tmp, dst)
    with open(path, "w") as f:
        f.write(text)
    return path


def main():
    check("systemd-analyze-installed", shutil.which("systemd-analyze") is not None,
          "systemd-analyze not found: install the systemd package (deploy/install-deps.sh)")
    if not shutil.which("systemd-analyze"):
        finish()
        return
    tmp = tempfile.mkdtemp(prefix="pd-test-units-")
    try:
        for src, dst in UNITS.items():
            path = copy(tmp, src, dst)
            with open(path) as f:
                check("%s-uses-build-binary" % src, BUILD in f.read(), path)
            rc, out = verify(path)
            check("%s-verifies" % src, rc == 0 and out == "", "rc %d: %s" % (rc, out))
        bad = copy(tmp, "pdserve-router.service", "bad-type.service",
                   lambda t: t.replace("Type=notify", "Type=notifyy"))
        rc, out = verify(bad)
        check("misspelt-type-complained", "service type" in out.lower(), "rc %d: %s" % (rc, out))
        bad = copy(tmp, "pdserve-decode@.service", "pdserve-decode@missing.service",
                   lambda t: t.replace(os.path.join(BUILD, BINS["decode-node"]),
                                       os.path.join(tmp, "no-such-binary")))
        rc, out = verify(bad)
        check("missing-binary-complained", "not executable" in out, "rc %d: %s" % (rc, out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    sys.exit(main())
