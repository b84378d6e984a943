#!/usr/bin/env python3
"""check_layers.py ROOT: fails on an #include that runs against the module order of
docs/ARCHITECTURE.md, or on an include cycle between files.

Every C/CUDA file of common/, kernels/, router/, prefill-node/, decode-node/ and deploy/pdctl/
belongs to a module (its folder). An #include "x.h" is resolved to the folder holding x.h (the
tree includes headers by name; each module's meson.build exports its own folder). A module may
include its own headers and those of the modules listed for it below; anything else is an upward
(or sideways) edge and fails. Generated protobuf headers (*.pb-c.h) count as the module "proto".
"""
import os
import re
import sys
from collections import defaultdict

# module -> modules it may include (besides itself). Keep in step with docs/ARCHITECTURE.md.
ALLOWED = {
    "common/base": set(),
    "common/io": {"common/base"},
    "common/text": {"common/base"},
    "common/kv": {"common/base"},
    "common/backend": {"common/kv", "common/base", "kernels"},
    "kernels": {"common/backend", "common/kv", "common/base"},
    "common/model": {"common/backend", "common/kv", "common/io", "common/base"},
    "common/engine": {"common/model", "common/backend", "common/kv", "common/io",
                      "common/base"},
    "common/net": {"common/net/grpc", "common/base", "proto"},
    "common/net/grpc": {"common/base", "proto"},
    "common/transport": {"common/base"},
    "common/node": {"common/engine", "common/model", "common/backend", "common/kv",
                    "common/net", "common/net/grpc", "common/transport", "common/io",
                    "common/base", "proto"},
    "router": {"common/net", "common/net/grpc", "common/text", "common/io", "common/base",
               "proto"},
    "prefill-node": {"common/node", "common/engine", "common/model", "common/backend",
                     "common/kv", "common/net", "common/net/grpc", "common/transport",
                     "common/io", "common/base", "proto"},
    "decode-node": {"common/node", "common/engine", "common/model", "common/backend",
                    "common/kv", "common/net", "common/net/grpc", "common/transport",
                    "common/io", "common/base", "proto"},
    "deploy/pdctl": {"common/engine", "common/model", "common/backend", "common/kv",
                     "common/net", "common/net/grpc", "common/text", "common/io",
                     "common/base", "proto"},
}
EXTS = (".c", ".h", ".cu", ".cuh")
INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def unit(name):
    """x.c, x.h and x's private header x_impl.h are one unit for cycle detection."""
    stem = os.path.splitext(name)[0]
    for suffix in ("_impl", "_internal"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return stem


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    where = {}  # header name -> module
    files = []  # (module, path)
    for mod in ALLOWED:
        d = os.path.join(root, mod)
        if not os.path.isdir(d):
            print(f"missing module folder {mod}")
            return 1
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            if os.path.isfile(p) and name.endswith(EXTS):
                files.append((mod, p))
                if name.endswith((".h", ".cuh")):
                    if name in where:
                        print(f"header name {name} in both {where[name]} and {mod}")
                        return 1
                    where[name] = mod
    # files not in a known module (a new folder must be added above and to ARCHITECTURE.md)
    for top in ("common",):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            rel = os.path.relpath(dirpath, root)
            if any(n.endswith(EXTS) for n in names) and rel not in ALLOWED:
                print(f"{rel}: a source folder that is not a module of ARCHITECTURE.md")
                return 1
    bad = 0
    edges = defaultdict(set)  # file-level, for cycles
    folder_edges = defaultdict(set)
    for mod, p in files:
        text = open(p, encoding="utf-8", errors="replace").read()
        for inc in INC.findall(text):
            base = os.path.basename(inc)
            if base.endswith(".pb-c.h"):
                target = "proto"
            elif base in where:
                target = where[base]
            else:
                print(f"{os.path.relpath(p, root)}: #include \"{inc}\": no such header in any module")
                bad += 1
                continue
            if target != mod:
                folder_edges[mod].add(target)
                if target not in ALLOWED[mod]:
                    print(f"{os.path.relpath(p, root)}: #include \"{inc}\" ({target}) runs "
                          f"against the module order ({mod} may include: "
                          f"{', '.join(sorted(ALLOWED[mod])) or 'nothing'})")
                    bad += 1
            stem = unit(os.path.basename(p))
            tstem = unit(base)
            if tstem != stem and not base.endswith(".pb-c.h"):
                edges[(mod, stem)].add((target, tstem))
    # include cycles between modules of one folder (file stems: x.c and x.h are one node)
    state = {}

    def dfs(n, stack):
        state[n] = 1
        stack.append(n)
        for m in edges.get(n, ()):
            if state.get(m) == 1:
                cyc = stack[stack.index(m):] + [m]
                print("include cycle: " + " -> ".join(f"{a}/{b}" for a, b in cyc))
                return True
            if state.get(m) is None and dfs(m, stack):
                return True
        stack.pop()
        state[n] = 2
        return False

    for n in list(edges):
        if state.get(n) is None and dfs(n, []):
            bad += 1
            break
    print("module edges:")
    for mod in ALLOWED:
        print(f"  {mod} -> {', '.join(sorted(folder_edges[mod])) or '-'}")
    print(f"{len(files)} files, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
