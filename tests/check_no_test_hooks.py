#!/usr/bin/env python3
"""check_no_test_hooks.py --clean BIN... --hooked BIN...: the production binaries (--clean) carry
no test hook: no fault-injection environment variable, no pool-corrupting function, none of
tests/support's fault code. The test build (--hooked) must read PDSERVE_FAULT, so the check can
fail."""
import sys

MARKERS = [b"PDSERVE_FAULT", b"steal_page", b"kv_pool_faults", b"decode_faults"]


def main():
    mode, files, fails = None, {"--clean": [], "--hooked": []}, 0
    for a in sys.argv[1:]:
        if a in files:
            mode = a
        elif mode:
            files[mode].append(a)
    if not files["--clean"] or not files["--hooked"]:
        print(__doc__)
        return 2
    for path in files["--clean"] + files["--hooked"]:
        with open(path, "rb") as f:
            data = f.read()
        found = [m.decode() for m in MARKERS if m in data]
        clean = path in files["--clean"]
        ok = not found if clean else "PDSERVE_FAULT" in found  # symbols may be stripped
        print("%s %s: %s" % ("ok  " if ok else "FAIL", path,
                             ("test hooks: " + ", ".join(found)) if found else "no test hooks"))
        fails += not ok
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
