#!/usr/bin/env python3
"""The accuracy gate (issues 2 and 3). For each fixture named on the command line:
- `pdctl ppl` with BF16 weights and f32 KV (transformers' own precision) is within 0.01% of
  reference.json's eval.val_ppl_fp32, and with BF16 KV (the baseline below) within 0.05%;
- relative to BF16 weights + BF16 KV: FP8 KV <= +0.2%, FP8 weights <= +0.2%, INT4 weights <= +0.5%,
  INT4 weights + FP8 KV <= +0.5%;
- teacher-forced top-1 agreement with transformers' greedy ids is reported for every variant.
Usage: accuracy.py PDCTL MODEL_NAME... [--doc FILE] [--backend cpu|cuda]
With --doc the table is written as markdown (docs/accuracy.md)."""
import datetime
import json
import os
import subprocess
import sys
import time

args = sys.argv[1:]
doc = None
backend = "cpu"
if "--doc" in args:
    i = args.index("--doc")
    doc = args[i + 1]
    del args[i:i + 2]
if "--backend" in args:
    i = args.index("--backend")
    backend = args[i + 1]
    del args[i:i + 2]
pdctl, names = args[0], args[1:]
models = os.environ.get("PD_MODELS_DIR", os.path.join(os.path.dirname(__file__), "../../deploy/models"))
data = os.environ.get("PD_DATA_DIR", os.path.join(os.path.dirname(__file__), "../data"))
text = os.path.join(data, "tinyshakespeare-val.txt")

# (label, weights, kv, gate relative to bf16/bf16 in percent or None)
VARIANTS = [
    ("bf16 weights, f32 kv (reference precision)", "bf16", "f32", None),
    ("bf16 weights, bf16 kv (baseline)", "bf16", "bf16", None),
    ("bf16 weights, fp8 kv", "bf16", "fp8", 0.2),
    ("fp8 weights, bf16 kv (prefill default)", "fp8", "bf16", 0.2),
    ("int4 weights, bf16 kv", "int4", "bf16", 0.5),
    ("int4 weights, fp8 kv (decode default)", "int4", "fp8", 0.5),
]


def pdctl_json(argv):
    p = subprocess.run([pdctl] + argv + ["--backend", backend], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"pdctl {' '.join(argv)} failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


failures = []
rows = []
for name in names:
    mdir = os.path.join(models, name)
    ref = json.load(open(os.path.join(mdir, "reference.json")))
    want = ref["eval"]["val_ppl_fp32"]
    base = None
    for label, w, kv, gate in VARIANTS:
        t0 = time.time()
        r = pdctl_json(["ppl", "--model", mdir, "--text-file", text, "--weights", w, "--kv", kv])
        a = pdctl_json(["agree", "--model", mdir, "--reference", os.path.join(mdir, "reference.json"),
                        "--weights", w, "--kv", kv])
        ppl = r["ppl"]
        if kv == "bf16" and w == "bf16":
            base = ppl
        verdict = ""
        if kv == "f32":
            rel = (ppl - want) / want * 100
            ok = abs(rel) <= 0.01 and r["targets"] == ref["eval"]["val_tokens"]
            verdict = f"{rel:+.4f}% vs transformers fp32 {want:.4f} (gate 0.01%)"
        elif base == ppl:
            # the baseline itself is gated against transformers: BF16 KV rounding moves the
            # perplexity by a few thousandths of a percent on both fixtures, 0.05% leaves room
            rel = (ppl - want) / want * 100
            ok = abs(rel) <= 0.05
            verdict = f"{rel:+.4f}% vs transformers fp32 {want:.4f} (gate 0.05%)"
        else:
            rel = (ppl - base) / base * 100
            ok = gate is None or rel <= gate
            verdict = f"{rel:+.3f}% vs bf16/bf16" + (f" (gate +{gate}%)" if gate else "")
        rows.append((name, label, ppl, verdict, a["top1"], a["cases_all_agree"], a["cases"], ok))
        print(f"{'ok ' if ok else 'FAIL'} {name:10s} {label:45s} ppl {ppl:9.4f}  {verdict}  "
              f"top-1 {a['top1']*100:.1f}% ({time.time()-t0:.0f}s)", flush=True)
        if not ok:
            failures.append(f"{name} {label}")

if doc:
    with open(doc, "w") as f:
        f.write("# Accuracy\n\n")
        f.write(f"Measured {datetime.date.today()} on the {backend.upper()} backend with\n\n")
        f.write(f"    python3 tests/integration/accuracy.py build/deploy/pdctl {' '.join(names)} "
                f"--doc docs/accuracy.md\n\n")
        f.write("Held-out perplexity on `tests/data/tinyshakespeare-val.txt` (39,704 targets, the "
                "protocol of DESIGN.md), and teacher-forced top-1 agreement with transformers' 48 greedy "
                "ids of each of the 8 reference cases (384 positions per fixture). Quantization is "
                "round-to-nearest at load; FP8 is e4m3 with one scale per output row (activations "
                "per token); INT4 is g128 asymmetric; FP8 KV has one scale per (token, KV head). "
                "The gate runs in CI (`meson test accuracy-*`).\n\n")
        f.write("| model | weights / KV | perplexity | vs baseline | top-1 agreement | cases fully agreeing |\n")
        f.write("|---|---|---:|---|---:|---:|\n")
        for name, label, ppl, verdict, top1, allc, nc, ok in rows:
            f.write(f"| {name} | {label} | {ppl:.4f} | {verdict}{'' if ok else ' **FAIL**'} | "
                    f"{top1*100:.1f}% | {allc}/{nc} |\n")
        f.write("\nReference points (PyTorch fake quantization, DESIGN.md): tiny-llama 85.048 -> INT4 "
                "85.078, FP8 KV 85.049, both 85.065; tiny-moe 72.710 -> INT4 72.792, FP8 KV 72.765, "
                "both 72.807.\n")
print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
