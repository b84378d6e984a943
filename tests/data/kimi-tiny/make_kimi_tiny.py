#!/usr/bin/env python3
"""Writes tiktoken.model and tokenizer_config.json of kimi-tiny: a small tokenizer in the format
Kimi K2 publishes (moonshotai/Kimi-K2-*: tiktoken.model lines "<base64 token bytes> <rank>",
special tokens named by tokenizer_config.json's added_tokens_decoder at ids n_base ..
n_base + 257), for tests. The vocabulary: the 256 bytes (ranks 0..255, in byte order), then the
byte-level BPE tokens of deploy/models/tiny-llama/tokenizer.json in id order (decoded to bytes),
then a few CJK tokens (so the Han alternative of Kimi's pre-tokenizer matters) and tokens chosen to
test the merge rules ("xyz" only reachable as a whole piece; "bc" ranked before "ab").
Standard library only. Usage: make_kimi_tiny.py [OUT_DIR] (default: this directory)."""
import base64
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1] if len(sys.argv) > 1 else here
src = json.load(open(os.path.join(here, "../../../deploy/models/tiny-llama/tokenizer.json")))


def bytes_to_unicode():  # GPT-2's byte <-> stand-in character table
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


dec = bytes_to_unicode()
special = {a["content"] for a in src["added_tokens"]}
tokens = [bytes([b]) for b in range(256)]
seen = set(tokens)
for tok, _ in sorted(src["model"]["vocab"].items(), key=lambda kv: kv[1]):
    if tok in special:
        continue
    b = bytes(dec[c] for c in tok)
    if b not in seen:
        seen.add(b)
        tokens.append(b)
extra = ["\u4e2d".encode(), "\u4e2d\u6587".encode(), "\u4f60\u597d".encode(), "\u4e16\u754c".encode(),
         b"xyz", b"bc", b"ab", " \u4e2d".encode()]
extra.insert(0, "\u4e2d".encode()[:2])  # a partial character: merges inside a Han run
for b in extra:
    if b not in seen:
        seen.add(b)
        tokens.append(b)
with open(os.path.join(out, "tiktoken.model"), "w") as f:
    for rank, b in enumerate(tokens):
        f.write(f"{base64.b64encode(b).decode()} {rank}\n")
n = len(tokens)
names = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
         "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|im_middle|>"]
ids = [n, n + 1] + list(range(n + 2, n + 10))
cfg = {
    "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False,
                                      "rstrip": False, "single_word": False, "special": True}
                             for i, s in zip(ids, names)},
    "additional_special_tokens": names[2:],
    "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[EOS]",
    "unk_token": "[EOS]", "model_max_length": 1048576, "tokenizer_class": "TikTokenTokenizer",
    "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
}
json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
print(f"{n} ranks, specials at {n}..{n + 257}")
