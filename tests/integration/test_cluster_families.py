"""Issue 15: the cluster serves GLM-4.5 (tiny-glm) and DeepSeek-V3 / Kimi K2 with MLA (tiny-dsv3)
end to end with the deploy/local.yaml formats (prefill FP8 weights + BF16 KV, decode INT4
weights + FP8 KV; for MLA the KV is the compressed latent, converted to FP8 with one scale per
token on the way, with page tags and the transfer as for the other families). The cluster's
output equals the single-process pipeline (`pdctl generate --weights int4 --kv fp8
--prefill-weights fp8 --prefill-kv bf16`) token for token on every reference prompt, greedy,
and for one seeded sampled request; every page is free afterwards. Run with /usr/bin/python3;
argv[1] is pdctl."""
import tempfile
import time

from cluster_testlib import (TEMPLATE_1, channel, check, cluster, finish, generate,
                             model_template, pb, pb_grpc, pdctl_local, reference, sampling,
                             wait_pages_free)
import grpc

TMP = tempfile.mkdtemp(prefix="pd-test-families-")
MAX = 48
PIPE = dict(weights="int4", kv="fp8", prefill_weights="fp8", prefill_kv="bf16")


def run_model(model):
    ref = reference(model)
    tpl = model_template(TEMPLATE_1, model, TMP)
    with cluster.Cluster(tpl) as c:
        stub = pb_grpc.InferenceStub(channel(c.router_addr))
        mi = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=10)
        check("%s-formats" % model, (mi.prefill_weights, mi.prefill_kv, mi.decode_weights,
                                     mi.decode_kv) == ("fp8", "bf16", "int4", "fp8"), mi)
        for i, case in enumerate(ref["cases"]):
            want = pdctl_local(model, case["prompt"], MAX, **PIPE)
            reqs = [("text", {"text": case["prompt"]})]
            if i == 0:
                reqs.append(("ids", {"token_ids": case["input_ids"]}))
            for how, req in reqs:
                r = generate(stub, sampling=sampling(MAX, ignore_eos=True), **req)
                check("%s-greedy-case%d-%s" % (model, i, how),
                      r.code == grpc.StatusCode.OK and r.ids == want["output_ids"] and
                      len(r.ids) == MAX,
                      "%s %s\n got  %s\n want %s" % (r.code, r.details, r.ids,
                                                     want["output_ids"]))
        flags = ["--temperature", "0.8", "--seed", "7"]
        case = ref["cases"][2]
        want = pdctl_local(model, case["prompt"], MAX, extra=flags, **PIPE)
        r = generate(stub, text=case["prompt"],
                     sampling=sampling(MAX, ignore_eos=True, temperature=0.8, seed=7))
        check("%s-sampled" % model, r.code == grpc.StatusCode.OK and r.ids == want["output_ids"],
              "%s %s\n got  %s\n want %s" % (r.code, r.details, r.ids, want["output_ids"]))
        used = wait_pages_free(c)
        check("%s-pages-free" % model, all(v == 0 for v in used.values()), used)


def main():
    for model in ("tiny-glm", "tiny-dsv3"):
        t = time.time()
        run_model(model)
        print("info %s: %.1f s" % (model, time.time() - t), flush=True)
    finish()


if __name__ == "__main__":
    main()
