#!/usr/bin/env python3
"""What bf16 KV costs in transformers itself, for the fixtures' reference cases (issue 15: the
bf16-KV gates of tiny-glm / tiny-dsv3 are looser than tiny-llama's; is that pdserve or the format?).

For each fixture (MODELS/NAME with reference.json), float32 eager transformers on the GPU, the 8
reference prompts, greedy 48 tokens (a manual loop over the cache; EOS ignored, as the reference):
  f32           as reference.json was made (checks the setup: ids equal, logits ~1e-5)
  bf16 kv       float32 compute, every key / value the cache stores rounded to bf16 (the cache
                layer's update is wrapped); for GLM-4.5 that is exactly pdserve's bf16 KV (K after
                the bias and partial RoPE, V); for DeepSeek-V3 transformers caches the expanded
                per-head K / V, not the latent
  bf16 latent   DeepSeek-V3 only: what pdserve's MLA pages hold rounded to bf16: c_kv (the
                kv_a_layernorm output) and k_pe (the rope part of kv_a_proj_with_mqa, rounded
                before RoPE where pdserve rounds after it)
  bf16 model    the whole model in bfloat16 (torch_dtype=bfloat16), what "running in bf16" means
                in transformers
Prints per mode: max |last-position logit - reference| over the cases, sequences whose 48 ids
equal the reference, and where the others part. Needs torch + transformers (the device machine
has them). Usage: bf16_kv_transformers.py MODELS [NAME...]"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

models = sys.argv[1]
names = sys.argv[2:] or ["tiny-glm", "tiny-dsv3"]
dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

ROUND_CACHE = [False]


def bf16(t):
    return t.to(torch.bfloat16).to(t.dtype)


def patch_cache():
    from transformers import cache_utils
    cls = getattr(cache_utils, "DynamicLayer", None)
    if cls is not None:
        orig = cls.update

        def update(self, key_states, value_states, *a, **k):
            if ROUND_CACHE[0]:
                key_states, value_states = bf16(key_states), bf16(value_states)
            return orig(self, key_states, value_states, *a, **k)
        cls.update = update
        return "DynamicLayer.update"
    cls = cache_utils.DynamicCache
    orig = cls.update

    def update(self, key_states, value_states, *a, **k):
        if ROUND_CACHE[0]:
            key_states, value_states = bf16(key_states), bf16(value_states)
        return orig(self, key_states, value_states, *a, **k)
    cls.update = update
    return "DynamicCache.update"


def latent_hooks(model, cfg):
    hs = []
    r = cfg.kv_lora_rank
    for layer in model.model.layers:
        att = layer.self_attn
        hs.append(att.kv_a_layernorm.register_forward_hook(lambda m, i, o: bf16(o)))

        def pe(m, i, o):
            o = o.clone()
            o[..., r:] = bf16(o[..., r:])
            return o
        hs.append(att.kv_a_proj_with_mqa.register_forward_hook(pe))
    return hs


@torch.no_grad()
def greedy(model, ids, n=48):
    x = torch.tensor([ids], device=dev)
    out = model(x, use_cache=True)
    past, logits = out.past_key_values, out.logits[0, -1].float()
    last = logits.cpu()
    got = []
    for _ in range(n):
        nxt = int(torch.argmax(logits))
        got.append(nxt)
        out = model(torch.tensor([[nxt]], device=dev), past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1].float()
    return got, last


print(f"transformers {transformers.__version__}, torch {torch.__version__}, {dev}; cache "
      f"rounding through {patch_cache()}")
print("| model | mode | max logit diff vs reference | identical 48-id sequences | parted at |")
print("|---|---|---|---|---|")
for name in names:
    d = os.path.join(models, name)
    ref = json.load(open(os.path.join(d, "reference.json")))
    m32 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                               attn_implementation="eager").to(dev).eval()
    modes = [("f32", m32, False, False), ("bf16 kv", m32, True, False)]
    if hasattr(m32.config, "kv_lora_rank"):
        modes.append(("bf16 latent", m32, False, True))
    modes.append(("bf16 model", None, False, False))
    for label, model, round_cache, latent in modes:
        if model is None:
            del m32
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16,
                                                         attn_implementation="eager").to(dev).eval()
        ROUND_CACHE[0] = round_cache
        hooks = latent_hooks(model, model.config) if latent else []
        worst, same, parts = 0.0, 0, []
        for c in ref["cases"]:
            got, last = greedy(model, c["input_ids"])
            worst = max(worst, float((last - torch.tensor(c["last_logits"])).abs().max()))
            if got == c["greedy_ids"]:
                same += 1
            else:
                parts.append(next(i for i, (a, b) in enumerate(zip(got, c["greedy_ids"]))
                                  if a != b))
        for h in hooks:
            h.remove()
        ROUND_CACHE[0] = False
        print(f"| {name} | {label} | {worst:.3e} | {same}/{len(ref['cases'])} | "
              f"{', '.join(map(str, parts)) or '-'} |", flush=True)
