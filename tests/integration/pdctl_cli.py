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

    # ---- quantized checkpoints (issue 3) ----
    q4 = os.path.join(tmp, "q4")
    rc, out, err = run(["quantize", "--model", LLAMA, "--format", "int4", "--out", q4])
    ok = rc == 0 and json.loads(out)["format"] == "int4"
    cfg = json.load(open(os.path.join(q4, "config.json")))
    ok = ok and cfg["quantization_config"]["format"] == "int4"
    # the checkpoint read back gives exactly what quantizing at load gives
    la, lb = os.path.join(tmp, "a.bin"), os.path.join(tmp, "b.bin")
    ra = run(["generate", "--model", q4, "--prompt", "First Citizen:", "--max-tokens", "8", "--json",
              "--logits-out", la])
    rb = run(["generate", "--model", LLAMA, "--weights", "int4", "--prompt", "First Citizen:",
              "--max-tokens", "8", "--json", "--logits-out", lb])
    ok = ok and ra[0] == 0 and rb[0] == 0 and ra[1] == rb[1] and open(la, "rb").read() == open(lb, "rb").read()
    print(f"{'ok ' if ok else 'FAIL'} quantize int4, read back == quantize at load (ids and logits)")
    if not ok:
        failures.append("quantize roundtrip")
    expect_error("quantized checkpoint, other format", ["generate", "--model", q4, "--weights", "fp8",
                                                        "--prompt", "x", "--max-tokens", "1"], ["int4"])
    # a quantized checkpoint with a scale tensor missing
    def drop_scales(h, data):
        name = "model.layers.0.mlp.down_proj.scales"
        b, e = h[name]["data_offsets"]
        del h[name]
        for k, v in h.items():
            if k != "__metadata__" and v["data_offsets"][0] >= e:
                v["data_offsets"] = [v["data_offsets"][0] - (e - b), v["data_offsets"][1] - (e - b)]
        return h, data[:b] + data[e:]
    raw_q = open(os.path.join(q4, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw_q[:8])[0]
    h = json.loads(raw_q[8:8 + n])
    h, data = drop_scales(h, raw_q[8 + n:])
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    qbad = os.path.join(tmp, "qbad")
    shutil.copytree(q4, qbad)
    open(os.path.join(qbad, "model.safetensors"), "wb").write(struct.pack("<Q", len(hb)) + hb + data)
    expect_error("quantized checkpoint missing a scale tensor",
                 ["generate", "--model", qbad, "--prompt", "x", "--max-tokens", "1"],
                 ["model.layers.0.mlp.down_proj.scales"])
    # K not a multiple of 128: a model whose intermediate size is 1000
    odd = model_copy(tmp, "odd", lambda t: t)
    os.remove(os.path.join(odd, "model.safetensors"))
    def shrink(h, data):
        out, parts, off = {}, [], 0
        for k, v in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
            if k == "__metadata__":
                out[k] = v
                continue
            b, e = v["data_offsets"]
            blob = data[b:e]
            shape = list(v["shape"])
            if k.endswith("down_proj.weight"):  # (512, 1024) -> (512, 1000)
                rows = [blob[r * 2048:r * 2048 + 2000] for r in range(512)]
                blob, shape = b"".join(rows), [512, 1000]
            elif k.endswith(("gate_proj.weight", "up_proj.weight")):
                blob, shape = blob[:1000 * 1024], [1000, 512]
            out[k] = {"dtype": v["dtype"], "shape": shape, "data_offsets": [off, off + len(blob)]}
            parts.append(blob)
            off += len(blob)
        return out, b"".join(parts)
    open(os.path.join(odd, "model.safetensors"), "wb").write(rewrite_header(shrink))
    with open(os.path.join(odd, "config.json")) as f:
        c = json.load(f)
    c["intermediate_size"] = 1000
    json.dump(c, open(os.path.join(odd, "config.json"), "w"))
    expect_error("int4 with K not a multiple of 128",
                 ["quantize", "--model", odd, "--format", "int4", "--out", os.path.join(tmp, "q-odd")],
                 ["down_proj", "128"])
    expect_error("unknown quantize format", ["quantize", "--model", LLAMA, "--format", "int3", "--out",
                                             os.path.join(tmp, "q3")], ["int3"])
    rc, out, err = run(["kv-plan", "--model", LLAMA, "--budget", "64MiB", "--json"])
    plan = json.loads(out) if rc == 0 else []
    ok = rc == 0 and [p["kv"] for p in plan] == ["bf16", "fp8"] and plan[0]["bytes_per_token"] == 4096 \
        and plan[1]["bytes_per_token"] == 2112 and plan[1]["pages"] > plan[0]["pages"]
    print(f"{'ok ' if ok else 'FAIL'} kv-plan: bytes per token (scales included), pages, tokens")
    if not ok:
        failures.append("kv-plan")
    # MLA (issue 15): one latent of kv_lora_rank + qk_rope_head_dim values per token and layer;
    # Kimi K2's shape is 61 layers x 576 values (config.json as published, trimmed to what
    # kv-plan reads), the tiny-dsv3 fixture 4 x 160
    with tempfile.TemporaryDirectory() as kimi_tmp:
        kimi = os.path.join(kimi_tmp, "kimi-k2")
        os.mkdir(kimi)
        json.dump({"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
                   "intermediate_size": 18432, "kv_lora_rank": 512,
                   "max_position_embeddings": 131072, "moe_intermediate_size": 2048,
                   "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1,
                   "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61,
                   "num_key_value_heads": 64, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                   "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "first_k_dense_replace": 1,
                   "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0,
                                    "mscale": 1.0, "mscale_all_dim": 1.0,
                                    "original_max_position_embeddings": 4096, "type": "yarn"},
                   "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "topk_group": 1,
                   "v_head_dim": 128, "vocab_size": 163840}, open(os.path.join(kimi, "config.json"), "w"))
        rc, out, err = run(["kv-plan", "--model", kimi, "--budget", "64GiB", "--json"])
        plan = json.loads(out) if rc == 0 else []
        ok = rc == 0 and [p["bytes_per_token"] for p in plan] == [61 * 576 * 2, 61 * (576 + 4)]
        rc, out, err = run(["kv-plan", "--model", os.path.join(MODELS, "tiny-dsv3"), "--budget",
                            "64MiB", "--json"])
        plan = json.loads(out) if rc == 0 else []
        ok = ok and rc == 0 and [p["bytes_per_token"] for p in plan] == [4 * 160 * 2, 4 * 164]
    print(f"{'ok ' if ok else 'FAIL'} kv-plan: MLA latent bytes per token (Kimi K2 61 x 576)")
    if not ok:
        failures.append("kv-plan mla")
    expect_error("kv budget too small for one page", ["kv-plan", "--model", LLAMA, "--budget", "1000"],
                 ["holds no page"])
    expect_error("engine kv budget too small", ["generate", "--model", LLAMA, "--kv-budget", "1KiB",
                                                "--prompt", "x", "--max-tokens", "1"], ["holds"])

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
