#!/usr/bin/env python3
"""pdctl synth: the config.json of each architecture carries the published shape, the tokenizer
is padded to the model's vocabulary, the weights are seeded (same seed, same bytes; another seed,
other bytes; sharding does not change them), and a CPU forward of a shrunk 2-layer model gives
finite logits and greedy output that is not one token repeated. Run by meson test."""
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

PDCTL = sys.argv[1]
failures = []

# published config.json values (Meta-Llama-3-8B, Meta-Llama-3-70B, Qwen3-30B-A3B)
PUBLISHED = {
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                       vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                       rms_norm_eps=1e-5),
    "llama-3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                        num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                        vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                        rms_norm_eps=1e-5),
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          vocab_size=151936, max_position_embeddings=40960,
                          rope_theta=1000000.0, rms_norm_eps=1e-6, num_experts=128,
                          num_experts_per_tok=8, moe_intermediate_size=768),
}


def check(name, ok, detail=""):
    print(f"{'ok ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        failures.append(name)


def run(args):
    p = subprocess.run([PDCTL] + args, capture_output=True, timeout=600)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def digest(d):
    """sha256 over (name, bytes) of every tensor in name order, whatever the shard layout"""
    parts = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                hdr_len = struct.unpack("<Q", fh.read(8))[0]
                hdr = json.loads(fh.read(hdr_len))
                data = fh.read()
            for name, t in sorted(hdr.items()):
                if name != "__metadata__":
                    a, b = t["data_offsets"]
                    parts[name] = hashlib.sha256(data[a:b]).hexdigest()
    return hashlib.sha256(json.dumps(sorted(parts.items())).encode()).hexdigest()


with tempfile.TemporaryDirectory() as tmp:
    for arch, want in PUBLISHED.items():
        out = os.path.join(tmp, arch + "-cfg")
        rc, _, err = run(["synth", "--arch", arch, "--out", out, "--config-only"])
        check(f"{arch} config-only", rc == 0, err.strip()[-200:])
        if rc != 0:
            continue
        cfg = json.load(open(os.path.join(out, "config.json")))
        bad = {k: (cfg.get(k), v) for k, v in want.items() if cfg.get(k) != v}
        check(f"{arch} published values", not bad, str(bad))
        tok = json.load(open(os.path.join(out, "tokenizer.json")))
        ids = set(tok["model"]["vocab"].values()) | {a["id"] for a in tok["added_tokens"]}
        check(f"{arch} tokenizer padded", ids == set(range(want["vocab_size"])),
              f"{len(ids)} ids")

    out = os.path.join(tmp, "ctx")
    rc, _, err = run(["synth", "--arch", "llama-3-8b", "--out", out, "--config-only",
                      "--context", "33024"])
    check("--context sets max_position_embeddings", rc == 0 and json.load(
        open(os.path.join(out, "config.json")))["max_position_embeddings"] == 33024, err)
    rc, _, err = run(["synth", "--arch", "glm-4.5", "--out", os.path.join(tmp, "glm")])
    check("glm-4.5 refused until its family loads", rc == 2 and "does not load" in err, err)
    rc, _, err = run(["synth", "--arch", "llama-3-8b", "--out", os.path.join(tmp, "x"),
                      "--hidden", "100"])
    check("hidden not a multiple of head_dim refused", rc == 2 and "head_dim" in err, err)

    small = ["--layers", "2", "--hidden", "256"]
    runs = {}
    for arch, extra in (("llama-3-8b", []), ("qwen3-30b-a3b", ["--experts", "16"])):
        out = os.path.join(tmp, arch)
        rc, _, err = run(["synth", "--arch", arch, "--out", out, "--seed", "7"] + small + extra)
        check(f"{arch} synth", rc == 0, err.strip()[-200:])
        if rc != 0:
            continue
        cfg = json.load(open(os.path.join(out, "config.json")))
        check(f"{arch} shrunk", cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == 256 and
              cfg["intermediate_size"] % 128 == 0 and cfg.get("moe_intermediate_size", 128) % 128 == 0,
              str(cfg))
        # every weight format loads the shrunk model (INT4 needs K % 128 == 0)
        rc, so, err = run(["generate", "--model", out, "--prompt", "hi", "--max-tokens", "2",
                           "--weights", "int4"])
        check(f"{arch} loads as int4", rc == 0, err.strip()[-200:])
        logits = os.path.join(tmp, arch + ".logits")
        rc, so, err = run(["generate", "--model", out, "--prompt", "To be, or not to be",
                           "--max-tokens", "16", "--json", "--logits-out", logits])
        check(f"{arch} generate", rc == 0, err.strip()[-200:])
        if rc != 0:
            continue
        ids = json.loads(so.strip().splitlines()[-1])["output_ids"]
        raw = open(logits, "rb").read()
        lg = struct.unpack(f"<{len(raw) // 4}f", raw)
        finite = all(math.isfinite(x) for x in lg)
        mean = sum(lg) / len(lg)
        std = math.sqrt(sum((x - mean) ** 2 for x in lg) / len(lg))
        check(f"{arch} logits finite and spread", finite and len(lg) == cfg["vocab_size"]
              and 0.05 < std < 100, f"std={std:.3f}")
        check(f"{arch} greedy output not degenerate", len(set(ids)) >= 4, str(ids))
        runs[arch] = digest(out)

    # seeds: same seed same weights, other seed other weights, shards change nothing
    a = os.path.join(tmp, "s7-sharded")
    b = os.path.join(tmp, "s8")
    rc1, _, e1 = run(["synth", "--arch", "llama-3-8b", "--out", a, "--seed", "7",
                      "--shard-mib", "40"] + small)
    rc2, _, e2 = run(["synth", "--arch", "llama-3-8b", "--out", b, "--seed", "8"] + small)
    check("sharded and reseeded synth", rc1 == 0 and rc2 == 0, (e1 + e2)[-300:])
    if rc1 == 0 and rc2 == 0 and "llama-3-8b" in runs:
        shards = [f for f in os.listdir(a) if f.endswith(".safetensors")]
        check("shards and index", len(shards) > 1 and
              os.path.exists(os.path.join(a, "model.safetensors.index.json")), str(shards))
        check("same seed, same weights across shard layouts", digest(a) == runs["llama-3-8b"])
        check("other seed, other weights", digest(b) != runs["llama-3-8b"])
        rc, so, err = run(["generate", "--model", a, "--prompt", "hello", "--max-tokens", "4"])
        check("sharded checkpoint loads", rc == 0, err.strip()[-200:])

print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
