#!/usr/bin/env python3
"""The cluster on the GPU (issue 6): deploy/local.yaml with the CUDA backend on both roles
(prefill and decode share the one GPU, each with its own KV budget) must give, for every reference
prompt of both fixtures, the same tokens as the single-process GPU run with the same formats
(prefill FP8 weights + BF16 KV -> FP8 KV -> decode INT4 weights). With BF16 weights and f32 KV on
both roles the tokens equal transformers' greedy ids. Standard library only.
Usage: check_cluster.py BIN_DIR [--models deploy/models] [--fixtures tiny-glm tiny-dsv3]
(--fixtures: the fixtures to serve, default tiny-llama tiny-moe)"""
import json
import os
import re
import subprocess
import sys
import tempfile

bin_dir = os.path.abspath(sys.argv[1])
models = os.path.abspath(sys.argv[sys.argv.index("--models") + 1] if "--models" in sys.argv
                         else "deploy/models")
fixtures = ["tiny-llama", "tiny-moe"]
if "--fixtures" in sys.argv:
    fixtures = []
    for arg in sys.argv[sys.argv.index("--fixtures") + 1:]:
        if arg.startswith("--"):
            break
        fixtures.append(arg)
pdctl = os.path.join(bin_dir, "pdctl")
failures = 0
# BF16 weights + f32 KV against float32 transformers: the CUDA backend's near-f32 GEMM mode
os.environ.setdefault("PD_CUDA_BF16_GEMM", "split")


def cluster_yaml(tmp, model, weights=None, kv=None):
    text = open("deploy/local.yaml").read()
    text = text.replace("model: models/tiny-llama", "model: " + os.path.join(models, model))
    text = text.replace("backend: cpu", "backend: cuda")
    for port in re.findall(r"5\d\d\d\d", text):  # move off the default ports
        text = text.replace(port, str(int(port) + 100))
    if weights:
        text = re.sub(r"weights: \w+", "weights: " + weights, text)
    if kv:
        text = re.sub(r"kv: \w+", "kv: " + kv, text)
    path = os.path.join(tmp, f"{model}-{weights}-{kv}.yaml")
    open(path, "w").write(text)
    return path


def run(args, env=None):
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    if p.returncode != 0:
        print("FAILED:", " ".join(args), p.stderr[-1500:])
    return p


with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, PDSERVE_STATE_DIR=tmp, PDSERVE_BIN_DIR=bin_dir)
    for model in fixtures:
        ref = json.load(open(os.path.join(models, model, "reference.json")))
        for weights, kv in ((None, None), ("bf16", "f32")):
            cfg = cluster_yaml(tmp, model, weights, kv)
            up = run([pdctl, "up", "--config", cfg, "--detach"], env)
            if up.returncode != 0:
                failures += 1
                log_dir = [d for d in os.listdir(tmp) if d.endswith(".logs")]
                for d in log_dir:
                    for f in os.listdir(os.path.join(tmp, d)):
                        print(f, open(os.path.join(tmp, d, f)).read()[-2000:])
                continue
            router = re.search(r"listen: (\S+)", open(cfg).read()).group(1)
            def one(case):
                got = run([pdctl, "generate", "--router", router, "--prompt", case["prompt"],
                           "--max-tokens", "48", "--ignore-eos", "--json"], env)
                ids = json.loads(got.stdout)["output_ids"] if got.returncode == 0 else None
                if weights == "bf16":
                    want = case["greedy_ids"]
                else:
                    single = run([pdctl, "generate", "--model", os.path.join(models, model),
                                  "--backend", "cuda", "--prefill-weights", "fp8", "--prefill-kv",
                                  "bf16", "--weights", "int4", "--kv", "fp8", "--prompt",
                                  case["prompt"], "--max-tokens", "48", "--ignore-eos", "--json"],
                                 env)
                    want = json.loads(single.stdout)["output_ids"] if single.returncode == 0 else []
                return ids == want
            # one request at a time: a batch of several would take other GEMM / INT4 kernel paths
            # (they depend on the row count) than the single-process run it is compared with
            same = sum(one(case) for case in ref["cases"])
            label = "bf16 weights + f32 kv vs transformers" if weights else \
                "default formats vs single-process GPU pipeline"
            print(f"{model}: cluster on GPU, {label}: {same}/{len(ref['cases'])} identical",
                  flush=True)
            failures += same != len(ref["cases"])
            health = run([pdctl, "health", "--config", cfg], env)
            print(health.stdout)
            run([pdctl, "down", "--config", cfg], env)
print(f"{failures} failures")
sys.exit(1 if failures else 0)
