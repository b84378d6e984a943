"""Issue 5: the deploy/local.yaml formats (prefill FP8 weights + BF16 KV, decode INT4 weights +
FP8 KV, KV converted on the way): the cluster's output equals the single-process pipeline
(`pdctl generate --weights int4 --kv fp8 --prefill-weights fp8 --prefill-kv bf16`) token for
token, for every reference prompt of both fixtures, greedy, and for seeded sampling
(temperature 0.8, top_k / top_p off and on). Run with /usr/bin/python3; argv[1] is pdctl."""
import tempfile
import time

from cluster_testlib import (TEMPLATE_1, channel, check, cluster, finish, generate,
                             model_template, pb, pb_grpc, pdctl_local, reference, sampling,
                             wait_pages_free)
import grpc

TMP = tempfile.mkdtemp(prefix="pd-test-formats-")
MAX = 48
PIPE = dict(weights="int4", kv="fp8", prefill_weights="fp8", prefill_kv="bf16")
SAMPLED = [  # (name, case index, pdctl flags, SamplingParams keywords)
    ("t0.8-seed7", 0, ["--temperature", "0.8", "--seed", "7"], dict(temperature=0.8, seed=7)),
    ("t0.8-seed123-k20-p0.9", 3,
     ["--temperature", "0.8", "--seed", "123", "--top-k", "20", "--top-p", "0.9"],
     dict(temperature=0.8, seed=123, top_k=20, top_p=0.9)),
]


def run_model(model):
    ref = reference(model)
    tpl = model_template(TEMPLATE_1, model, TMP)
    with cluster.Cluster(tpl) as c:  # the template's formats, nothing overridden
        stub = pb_grpc.InferenceStub(channel(c.router_addr))
        mi = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=10)
        check("%s-formats" % model, (mi.prefill_weights, mi.prefill_kv, mi.decode_weights,
                                     mi.decode_kv) == ("fp8", "bf16", "int4", "fp8"), mi)
        for i, case in enumerate(ref["cases"]):
            want = pdctl_local(model, case["prompt"], MAX, **PIPE)
            for how, req in (("text", {"text": case["prompt"]}),
                             ("ids", {"token_ids": case["input_ids"]})):
                r = generate(stub, sampling=sampling(MAX, ignore_eos=True), **req)
                check("%s-greedy-case%d-%s" % (model, i, how),
                      r.code == grpc.StatusCode.OK and r.ids == want["output_ids"],
                      "%s %s\n got  %s\n want %s" % (r.code, r.details, r.ids,
                                                     want["output_ids"]))
        for name, i, flags, kw in SAMPLED:
            case = ref["cases"][i]
            want = pdctl_local(model, case["prompt"], MAX, extra=flags, **PIPE)
            greedy = pdctl_local(model, case["prompt"], MAX, **PIPE)
            r = generate(stub, text=case["prompt"], sampling=sampling(MAX, ignore_eos=True, **kw))
            check("%s-sampled-%s" % (model, name),
                  r.code == grpc.StatusCode.OK and r.ids == want["output_ids"],
                  "%s %s\n got  %s\n want %s" % (r.code, r.details, r.ids, want["output_ids"]))
            # the sampled run is really sampled (else the check above says nothing new)
            check("%s-sampled-%s-not-greedy" % (model, name),
                  want["output_ids"] != greedy["output_ids"])
            r2 = generate(stub, text=case["prompt"], sampling=sampling(MAX, ignore_eos=True, **kw))
            check("%s-sampled-%s-repeatable" % (model, name), r2.ids == r.ids)
        used = wait_pages_free(c)
        check("%s-pages-free" % model, all(v == 0 for v in used.values()), used)


def main():
    for model in ("tiny-llama", "tiny-moe"):
        t = time.time()
        run_model(model)
        print("info %s: %.1f s" % (model, time.time() - t), flush=True)
    finish()


if __name__ == "__main__":
    main()
