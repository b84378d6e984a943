#!/usr/bin/env python3
"""Bad input to pdctl: each case must exit nonzero with one clear message naming the file or
field, and never crash. Also checks tokenize/generate output shapes. Run by meson test."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

PDCTL = sys.argv[1]
MODELS = os.environ["PD_MODELS_DIR"]
LLAMA = os.path.join(MODELS, "tiny-llama")
failures = []


def run(args, input_bytes=None):
    p = subprocess.run([PDCTL] + args, capture_output=True, timeout=120)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def expect_error(name, args, fragments):
    rc, out, err = run(args)
    ok = rc > 0 and all(f in err for f in fragments)
    if rc < 0 or rc >= 128:
        ok = False
    print(f"{'ok ' if ok else 'FAIL'} {name}: rc={rc} stderr={err.strip()[-200:]!r}")
    if not ok:
        failures.append(name)


def model_copy(tmp, name, mutate_config=None, st_bytes=None):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    for f in ("tokenizer.json", "config.json"):
        shutil.copy(os.path.join(LLAMA, f), d)
    if mutate_config:
        with open(os.path.join(d, "config.json")) as f:
            text = f.read()
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(mutate_config(text))
    st = os.path.join(d, "model.safetensors")
    if st_bytes is None:
        os.symlink(os.path.join(LLAMA, "model.safetensors"), st)
    else:
        with open(st, "wb") as f:
            f.write(st_bytes)
    return d


def rewrite_header(edit):
    """The fixture's safetensors with its header edited (tensors keep their data)."""
    raw = open(os.path.join(LLAMA, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    h, data = edit(h, data)
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + data


def drop_norm(h, data):
    # remove model.norm.weight and its bytes, shifting later offsets
    b, e = h["model.norm.weight"]["data_offsets"]
    del h["model.norm.weight"]
    for k, v in h.items():
        if k != "__metadata__" and v["data_offsets"][0] >= e:
            v["data_offsets"] = [v["data_offsets"][0] - (e - b), v["data_offsets"][1] - (e - b)]
    return h, data[:b] + data[e:]


def wrong_dtype(h, data):
    h["model.norm.weight"]["dtype"] = "F16"
    return h, data


def wrong_shape(h, data):
    h["model.norm.weight"]["shape"] = [256, 2]
    return h, data


with tempfile.TemporaryDirectory() as tmp:
    raw = open(os.path.join(LLAMA, "model.safetensors"), "rb").read()
    gen = ["generate", "--prompt", "hello", "--max-tokens", "2", "--model"]
    expect_error("truncated safetensors", gen + [model_copy(tmp, "trunc", st_bytes=raw[:len(raw) // 2])],
                 ["model.safetensors"])
    expect_error("corrupt header", gen + [model_copy(tmp, "corrupt", st_bytes=raw[:8] + b"{not json" + raw[17:])],
                 ["model.safetensors"])
    expect_error("missing tensor", gen + [model_copy(tmp, "missing", st_bytes=rewrite_header(drop_norm))],
                 ["model.norm.weight"])
    expect_error("wrong dtype", gen + [model_copy(tmp, "dtype", st_bytes=rewrite_header(wrong_dtype))],
                 ["model.norm.weight"])
    expect_error("wrong shape", gen + [model_copy(tmp, "shape", st_bytes=rewrite_header(wrong_shape))],
                 ["model.norm.weight"])
    expect_error("unknown architecture",
                 gen + [model_copy(tmp, "arch", lambda t: t.replace("LlamaForCausalLM", "MambaForCausalLM"))],
                 ["MambaForCausalLM"])
    expect_error("invalid json", gen + [model_copy(tmp, "json", lambda t: t[: len(t) // 2])],
                 ["config.json"])
    expect_error("missing model dir", gen + [os.path.join(tmp, "nope")], ["nope"])
    expect_error("prompt longer than the context",
                 ["generate", "--model", LLAMA, "--max-tokens", "2", "--prompt", "First Citizen " * 1200],
                 ["context"])
    expect_error("invalid utf-8", ["generate", "--model", LLAMA, "--max-tokens", "2", "--prompt",
                                   os.fsdecode(b"bad \xff\xfe text")], ["utf-8"])
    expect_error("empty prompt", ["generate", "--model", LLAMA, "--max-tokens", "2", "--prompt", ""],
                 ["empty"])
    expect_error("max-tokens 0", ["generate", "--model", LLAMA, "--max-tokens", "0", "--prompt", "x"],
                 ["--max-tokens"])
    expect_error("unknown weight format", ["generate", "--model", LLAMA, "--weights", "q3", "--prompt", "x"],
                 ["q3"])
    expect_error("unknown command", ["frobnicate"], ["frobnicate"])

    rc, out, err = run(["tokenize", "--model", LLAMA, "First Citizen:"])
    ok = rc == 0 and json.loads(out)["ids"][0] == 0
    rc2, out2, _ = run(["tokenize", "--model", LLAMA, "--no-bos", "First Citizen:"])
    ok = ok and rc2 == 0 and json.loads(out2)["ids"] == json.loads(out)["ids"][1:]
    print(f"{'ok ' if ok else 'FAIL'} tokenize with and without BOS")
    if not ok:
        failures.append("tokenize")
    logits = os.path.join(tmp, "logits.bin")
    rc, out, err = run(["generate", "--model", LLAMA, "--prompt", "First Citizen:", "--max-tokens", "5",
                        "--json", "--logits-out", logits, "--temperature", "0.8", "--seed", "3"])
    j = json.loads(out) if rc == 0 else {}
    ok = rc == 0 and len(j.get("output_ids", [])) <= 5 and os.path.getsize(logits) == 2048 * 4
    rc2, out2, _ = run(["generate", "--model", LLAMA, "--prompt", "First Citizen:", "--max-tokens", "5",
                        "--json", "--temperature", "0.8", "--seed", "3"])
    ok = ok and rc2 == 0 and json.loads(out2)["output_ids"] == j["output_ids"]
    print(f"{'ok ' if ok else 'FAIL'} generate --json --logits-out, seeded sampling repeats")
    if not ok:
        failures.append("generate")

print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
