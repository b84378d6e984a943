#!/usr/bin/env python3
"""tests/data/kimi-tiny against tiktoken itself (run where tiktoken is installed: the device
machine): builds the encoding exactly as Kimi K2's tokenization_kimi.py TikTokenTokenizer does
(load_tiktoken_bpe of tiktoken.model, special tokens at n_base .. n_base + 257 named by
tokenizer_config.json's added_tokens_decoder, else <|reserved_token_ID|>, its pat_str), encodes
every text of golden.json with allowed_special="all" and checks that the ids equal the golden ids
(which tests/unit/text/tokenizer.c checks pdserve's tokenizer against) and decode back.
Usage: check_tiktoken.py DIR. Exits 1 on a mismatch."""
import base64
import json
import os
import sys

import tiktoken

d = sys.argv[1]
path = os.path.join(d, "tiktoken.model")
try:
    from tiktoken.load import load_tiktoken_bpe
    ranks = load_tiktoken_bpe(path)
except Exception as e:  # an old tiktoken without local paths: the same parse by hand
    print(f"load_tiktoken_bpe failed ({e}); parsing by hand")
    ranks = {base64.b64decode(t): int(r) for t, r in
             (ln.split() for ln in open(path, "rb").read().splitlines() if ln)}
cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
names = {int(k): v["content"] for k, v in cfg.get("added_tokens_decoder", {}).items()}
n = len(ranks)
specials = {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + 256 + 2)}
# TikTokenTokenizer.pat_str of tokenization_kimi.py (moonshotai/Kimi-K2-Instruct)
pat_str = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
enc = tiktoken.Encoding(name="kimi-tiny", pat_str=pat_str, mergeable_ranks=ranks,
                        special_tokens=specials)
bad = 0
golden = json.load(open(os.path.join(d, "golden.json")))
for g in golden:
    ids = enc.encode(g["text"], allowed_special="all")
    ok = ids == g["ids"] and enc.decode(ids) == g["text"]
    bad += not ok
    if not ok:
        print(f"DIFFER {g['text']!r}:\n  tiktoken {ids}\n  golden   {g['ids']}")
print(f"tiktoken {tiktoken.__version__}: {len(golden) - bad}/{len(golden)} texts encode to the "
      f"golden ids ({n} ranks, {len(specials)} specials)")
sys.exit(1 if bad else 0)
