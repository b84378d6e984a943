#!/usr/bin/env python3
"""End-to-end checks of pdctl on a backend against the fixtures' reference.json.

  check_reference.py greedy --pdctl P --models DIR [--backend cuda] [--kv f32 bf16]
      every case: pdctl generate --json --ignore-eos --max-tokens 48 --logits-out F; the input
      ids and the 48 greedy ids must equal transformers', the last-position logits are compared
      (max abs difference printed). Sets PD_CUDA_BF16_GEMM=split (near-f32 BF16 GEMMs on CUDA)
      unless the environment has it.
  check_reference.py ppl --pdctl P --models DIR --text F [--backend cuda]
      pdctl ppl for bf16/bf16 and the default variants; each must stay within the accuracy gate
      relative to bf16/bf16 (fp8 KV +0.2%, fp8 weights +0.2%, int4 +0.5%, int4 + fp8 KV +0.5%).
Prints a table; exits 1 when a check fails.
"""
import argparse, json, os, struct, subprocess, sys, tempfile


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout


def greedy(a):
    # BF16 weights against float32 transformers: the CUDA backend's near-f32 GEMM mode (two bf16
    # GEMMs on the hi + lo split of the activations; the default is one bf16 GEMM)
    os.environ.setdefault("PD_CUDA_BF16_GEMM", "split")
    bad = 0
    print(f"| model | kv | cases | exact ids | max logit diff | result |")
    print(f"|---|---|---|---|---|---|")
    for m in sorted(os.listdir(a.models)):
        ref_path = os.path.join(a.models, m, "reference.json")
        if not os.path.exists(ref_path):
            continue
        ref = json.load(open(ref_path))
        for kv in a.kv:
            worst, exact = 0.0, 0
            for c in ref["cases"]:
                with tempfile.NamedTemporaryFile(suffix=".bin") as f:
                    out = run([a.pdctl, "generate", "--model", os.path.join(a.models, m),
                               "--prompt", c["prompt"], "--max-tokens", "48", "--json",
                               "--ignore-eos", "--logits-out", f.name, "--kv", kv,
                               "--backend", a.backend])
                    j = json.loads(out)
                    raw = open(f.name, "rb").read()
                lg = struct.unpack("<%df" % (len(raw) // 4), raw)[: len(c["last_logits"])]
                worst = max(worst, max(abs(x - y) for x, y in zip(lg, c["last_logits"])))
                same = j["output_ids"] == c["greedy_ids"] and j["input_ids"] == c["input_ids"]
                exact += same
                if not same:
                    print(f"  {m} kv {kv}: case {c['prompt'][:30]!r} differs", file=sys.stderr)
            n = len(ref["cases"])
            # the CPU engine's gates (tests/unit/engine/engine_golden.c): f32 KV gives every id and
            # logits within 2e-3; bf16 KV rounds K/V: one sequence of n may part after a near tie
            # (tiny-moe "Whitespace and tabs", token 38, on both backends), logits within 3e-2
            tol, need = (2e-3, n) if kv == "f32" else (3e-2, n - 1)
            ok = exact >= need and worst <= tol
            bad += not ok
            print(f"| {m} | {kv} | {n} | {exact} (need {need}) | {worst:.2e} (gate {tol:g}) "
                  f"| {'ok' if ok else 'FAIL'} |", flush=True)
    return bad


def ppl(a):
    variants = [("bf16", "bf16", None), ("bf16", "fp8", 0.002), ("fp8", "bf16", 0.002),
                ("int4", "bf16", 0.005), ("int4", "fp8", 0.005)]
    bad = 0
    print("| model | weights | kv | ppl | vs bf16/bf16 | gate | result |")
    print("|---|---|---|---|---|---|---|")
    for m in sorted(os.listdir(a.models)):
        if not os.path.exists(os.path.join(a.models, m, "reference.json")):
            continue
        base = None
        for w, kv, gate in variants:
            j = json.loads(run([a.pdctl, "ppl", "--model", os.path.join(a.models, m),
                                "--text-file", a.text, "--weights", w, "--kv", kv,
                                "--backend", a.backend]))
            if base is None:
                base = j["ppl"]
                print(f"| {m} | {w} | {kv} | {j['ppl']:.4f} | - | - | - |", flush=True)
                continue
            rel = j["ppl"] / base - 1.0
            ok = rel <= gate
            bad += not ok
            print(f"| {m} | {w} | {kv} | {j['ppl']:.4f} | {100 * rel:+.3f}% | +{100 * gate:.1f}% "
                  f"| {'PASS' if ok else 'FAIL'} |", flush=True)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["greedy", "ppl"])
    ap.add_argument("--pdctl", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--kv", nargs="+", default=["f32", "bf16"])
    ap.add_argument("--text")
    a = ap.parse_args()
    bad = greedy(a) if a.mode == "greedy" else ppl(a)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
