"""Issue 14: the OpenAI / vLLM parameters through a real router / prefill / decode cluster
(deploy/local.yaml with tiny-llama, BF16 weights and KV on both roles), over HTTP (completions and
chat shapes) and gRPC:

- penalties, logit_bias, min_tokens, stop_token_ids: the cluster's tokens equal the single-process
  `pdctl generate` with the same parameters (the prefill node samples the first token, the decode
  node the rest: both apply them); EOS pushed up by a bias waits for min_tokens; a stop token id
  ends the request (its text not returned) but not before min_tokens.
- logprobs: completions (tokens / token_logprobs / top_logprobs / text_offset) and chat
  (content[].token / logprob / bytes / top_logprobs); equal to pdctl's; raw (the alternatives of
  the first position are the same at temperature 0 and 1.5); gRPC carries one per token.
- echo: the prompt first; with logprobs the prompt tokens' (the first null); streamed too.
- n: n choices from one prefill (the prefill node counts one request), equal to `pdctl generate
  --n` (one prefill, KV copies, in one process), sample 0 of n equals the n = 1 request with the
  same seed, HTTP and gRPC agree sample by sample; best_of == n accepted.
- 400 / INVALID_ARGUMENT for what stays unsupported (best_of > n, tools, ...) and for values out
  of range, naming the parameter; no KV page is left behind on any node.
Run by meson with /usr/bin/python3; argv[1] is pdctl."""
import json
import os
import subprocess
import tempfile
import urllib.error
import urllib.request

from cluster_testlib import (PDCTL, TEMPLATE_1, all_nodes, channel, check, cluster, finish,
                             generate, model_dir, model_template, pb, pb_grpc, pdctl_local,
                             stats, wait_pages_free)
import grpc

TMP = tempfile.mkdtemp(prefix="pd-test-openai-")
PROMPT = "ROMEO: But soft, what light through yonder window breaks?"


def post(c, path, body):
    """(status, parsed JSON or raw text) of a POST, error statuses included."""
    req = urllib.request.Request("http://%s%s" % (c.router_http, path),
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            st, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        st, text = e.code, e.read().decode()
    if body.get("stream") and st == 200:
        return st, [json.loads(ln[6:]) for ln in text.splitlines()
                    if ln.startswith("data: ") and ln != "data: [DONE]"]
    try:
        return st, json.loads(text)
    except ValueError:
        return st, text


def completion(c, **kw):
    body = dict({"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}, **kw)
    return post(c, "/v1/completions", body)


def grpc_ids(stub, **kw):
    """Token ids of a gRPC Generate of PROMPT with SamplingParams kw (max_tokens 12)."""
    kw.setdefault("max_tokens", 12)
    r = generate(stub, text=PROMPT, sampling=pb.SamplingParams(**kw))
    return r


def check_against_pdctl(c, stub):
    """Penalties / bias / min_tokens / stop ids: the cluster == the single-process engine."""
    base = pdctl_local("tiny-llama", PROMPT, 12)
    cases = {
        "frequency": ({"frequency_penalty": 1.5}, ["--frequency-penalty", "1.5"]),
        "presence": ({"presence_penalty": 1.8}, ["--presence-penalty", "1.8"]),
        "repetition": ({"repetition_penalty": 1.6}, ["--repetition-penalty", "1.6"]),
        "bias": ({"logit_bias": {str(base["output_ids"][1]): -100.0, "1134": 2.5}},
                 ["--logit-bias", "%d=-100" % base["output_ids"][1], "--logit-bias", "1134=2.5"]),
        "all": ({"frequency_penalty": 0.7, "presence_penalty": 0.4, "repetition_penalty": 1.2,
                 "logit_bias": {"1134": 1.5}},
                ["--frequency-penalty", "0.7", "--presence-penalty", "0.4",
                 "--repetition-penalty", "1.2", "--logit-bias", "1134=1.5"]),
    }
    for name, (http_kw, flags) in cases.items():
        want = pdctl_local("tiny-llama", PROMPT, 12, extra=flags + ["--logprobs", "0"])
        st, doc = completion(c, logprobs=0, **http_kw)
        got_text = doc["choices"][0]["text"] if st == 200 else doc
        check("pdctl-%s-http" % name, st == 200 and got_text == want["text"],
              (st, got_text, want["text"]))
        check("pdctl-%s-changes-output" % name, want["output_ids"] != base["output_ids"],
              (want["output_ids"], base["output_ids"]))
        gkw = {k: v for k, v in http_kw.items() if k != "logit_bias"}
        if "logit_bias" in http_kw:
            gkw["logit_bias"] = [pb.LogitBias(token_id=int(k), bias=v)
                                 for k, v in http_kw["logit_bias"].items()]
        r = grpc_ids(stub, ignore_eos=True, **gkw)
        check("pdctl-%s-grpc" % name, r.code == grpc.StatusCode.OK and
              r.ids == want["output_ids"], (r.code, r.details, r.ids, want["output_ids"]))
    # a bias of +100 on one token: every token is it
    r = grpc_ids(stub, ignore_eos=True, logit_bias=[pb.LogitBias(token_id=1134, bias=100)])
    check("bias-forces-token", r.ids == [1134] * 12, r.ids)
    # EOS pushed to the top, held off by min_tokens: exactly min_tokens + 1 tokens, then stop
    eos = json.load(open(os.path.join(model_dir("tiny-llama"), "config.json")))["eos_token_id"]
    st, doc = completion(c, ignore_eos=False, logit_bias={str(eos): 100}, min_tokens=5,
                         logprobs=0)
    toks = doc["choices"][0]["logprobs"]["tokens"] if st == 200 else doc
    check("min-tokens-eos", st == 200 and doc["usage"]["completion_tokens"] == 6 and
          doc["choices"][0]["finish_reason"] == "stop", (st, doc))
    p = subprocess.run([PDCTL, "generate", "--model", model_dir("tiny-llama"), "--prompt", PROMPT,
                        "--max-tokens", "12", "--weights", "bf16", "--kv", "bf16", "--json",
                        "--logit-bias", "%d=100" % eos, "--min-tokens", "5"],
                       capture_output=True, text=True, timeout=300)
    want = json.loads(p.stdout) if p.returncode == 0 else {"output_ids": p.stderr}
    r = grpc_ids(stub, logit_bias=[pb.LogitBias(token_id=eos, bias=100)], min_tokens=5)
    check("min-tokens-eos-grpc", len(r.ids) == 6 and r.ids[5] == eos and
          r.ids == want["output_ids"] and r.finish_reason == "stop", (r.ids, want, toks))
    # stop_token_ids: the 3rd greedy token ends the request (its text not returned) ...
    stop = base["output_ids"][2]
    first = base["output_ids"].index(stop)
    r = grpc_ids(stub, ignore_eos=True, stop_token_ids=[stop])
    check("stop-token-id-grpc", r.ids == base["output_ids"][:first + 1] and
          r.finish_reason == "stop", (r.ids, base["output_ids"], stop))
    st, doc = completion(c, stop_token_ids=[stop])
    check("stop-token-id-http", st == 200 and doc["choices"][0]["finish_reason"] == "stop" and
          doc["usage"]["completion_tokens"] == first + 1, (st, doc))
    # ... but not before min_tokens
    r = grpc_ids(stub, ignore_eos=True, stop_token_ids=[stop], min_tokens=first + 3)
    check("stop-token-id-min-tokens", len(r.ids) >= first + 3 and
          stop not in r.ids[:first + 2], r.ids)


def check_logprobs(c, stub):
    want = pdctl_local("tiny-llama", PROMPT, 12, extra=["--logprobs", "3"])
    st, doc = completion(c, logprobs=3)
    lp = doc["choices"][0]["logprobs"] if st == 200 else {}
    ok = st == 200 and len(lp.get("tokens", [])) == 12 and len(lp["token_logprobs"]) == 12
    check("logprobs-completions-shape", ok and len(lp["top_logprobs"]) == 12 and
          len(lp["text_offset"]) == 12 and lp["text_offset"] == sorted(lp["text_offset"]) and
          all(len(t) <= 4 for t in lp["top_logprobs"]), (st, doc))
    if ok:
        close = all(abs(a - b[0]) < 1e-3 for a, b in zip(lp["token_logprobs"],
                                                          want["logprobs"]))
        check("logprobs-equal-pdctl", close, (lp["token_logprobs"], want["logprobs"]))
        # greedy: the chosen token is the most likely one
        check("logprobs-greedy-is-top", all(abs(v - max(t.values())) < 1e-6 for v, t in
                                            zip(lp["token_logprobs"], lp["top_logprobs"])), lp)
    # raw logprobs: the first position's alternatives do not depend on the temperature
    _, hot = completion(c, logprobs=5, temperature=1.5, seed=3, max_tokens=1)
    _, cold = completion(c, logprobs=5, max_tokens=1)
    a = hot["choices"][0]["logprobs"]["top_logprobs"][0]
    b = cold["choices"][0]["logprobs"]["top_logprobs"][0]
    check("logprobs-raw", all(abs(a[k] - b[k]) < 1e-5 for k in a if k in b) and
          len(set(a) & set(b)) >= 5, (a, b))
    # chat shape
    st, doc = post(c, "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": "Who art thou?"}], "max_tokens": 6,
                    "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 2})
    content = doc["choices"][0]["logprobs"]["content"] if st == 200 else []
    check("logprobs-chat-shape", st == 200 and len(content) == 6 and
          all(set(e) == {"token", "logprob", "bytes", "top_logprobs"} and
              len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 and
              bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] for e in content),
          (st, doc))
    st, chunks = post(c, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "Who art thou?"}],
                       "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": True,
                       "top_logprobs": 2, "stream": True})
    streamed = [e for ch in chunks for e in ((ch["choices"][0].get("logprobs") or {})
                                             .get("content") or [])]
    check("logprobs-chat-stream", [e["logprob"] for e in streamed] ==
          [e["logprob"] for e in content], (streamed, content))
    # gRPC: one TokenLogprob per token, the same numbers
    r = generate(stub, text=PROMPT, sampling=pb.SamplingParams(max_tokens=12, ignore_eos=True,
                                                              logprobs=True, top_logprobs=3))
    msgs = []
    call = stub.Generate(pb.GenerateRequest(text=PROMPT, sampling=pb.SamplingParams(
        max_tokens=12, ignore_eos=True, logprobs=True, top_logprobs=3)), timeout=120)
    for m in call:
        msgs.append(m)
    glp = [x for m in msgs for x in m.logprobs]
    gids = [t for m in msgs for t in m.token_ids]
    check("logprobs-grpc", len(glp) == 12 and [x.token_id for x in glp] == gids and
          gids == r.ids and all(len(x.top) == 3 and x.top[0].token_id == x.token_id for x in glp)
          and ok and all(abs(x.logprob - v) < 1e-5 for x, v in zip(glp, lp["token_logprobs"])),
          (len(glp), gids, r.ids))
    st, doc = completion(c, logprobs=21)
    check("logprobs-21-400", st == 400 and "logprobs" in str(doc), (st, doc))
    st, doc = post(c, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                               "max_tokens": 1, "top_logprobs": 2})
    check("top-logprobs-needs-logprobs-400", st == 400 and "logprobs" in str(doc), (st, doc))


def check_echo(c, stub):
    st, doc = completion(c, echo=True, max_tokens=4)
    plain = completion(c, max_tokens=4)[1]["choices"][0]["text"]
    check("echo-text", st == 200 and doc["choices"][0]["text"] == PROMPT + plain, (st, doc))
    st, doc = completion(c, echo=True, max_tokens=4, logprobs=1)
    lp = doc["choices"][0]["logprobs"] if st == 200 else {}
    n_prompt = doc["usage"]["prompt_tokens"] if st == 200 else -1
    check("echo-logprobs", st == 200 and len(lp["tokens"]) == n_prompt + 4 and
          lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and
          all(isinstance(v, float) and v <= 0 for v in lp["token_logprobs"][1:]), (st, doc))
    st, chunks = completion(c, echo=True, max_tokens=4, stream=True)
    check("echo-stream", st == 200 and chunks[0]["choices"][0]["text"] == PROMPT and
          "".join(ch["choices"][0]["text"] for ch in chunks) == PROMPT + plain, chunks[:3])
    msgs = list(stub.Generate(pb.GenerateRequest(
        text=PROMPT, echo=True, sampling=pb.SamplingParams(max_tokens=4, ignore_eos=True,
                                                          logprobs=True, prompt_logprobs=True)),
        timeout=120))
    check("echo-grpc", msgs and msgs[0].prompt_text == PROMPT and
          len(msgs[0].prompt_token_ids) == n_prompt and
          len(msgs[0].prompt_logprobs) == n_prompt - 1 and
          [x.token_id for x in msgs[0].prompt_logprobs] == list(msgs[0].prompt_token_ids[1:]) and
          all(abs(x.logprob - v) < 1e-5 for x, v in zip(msgs[0].prompt_logprobs,
                                                        lp["token_logprobs"][1:])),
          msgs[:1])


def check_n(c, stub):
    prefills = stats(next(n for n in c.nodes if n["role"] == "prefill")).requests
    st, doc = completion(c, n=3, best_of=3, temperature=1.0, seed=11, max_tokens=10)
    texts = [ch["text"] for ch in sorted(doc["choices"], key=lambda x: x["index"])] \
        if st == 200 else []
    check("n-choices", st == 200 and [ch["index"] for ch in doc["choices"]] == [0, 1, 2] and
          len(set(texts)) > 1 and doc["usage"]["completion_tokens"] == 30, (st, doc))
    after = stats(next(n for n in c.nodes if n["role"] == "prefill")).requests
    check("n-one-prefill", after == prefills + 1, (prefills, after))
    # the single-process engine runs n the same way (one prefill, KV copies): the same samples
    want = pdctl_local("tiny-llama", PROMPT, 10, extra=["--n", "3", "--temperature", "1.0",
                                                        "--seed", "11"])
    check("n-equal-pdctl", [x["text"] for x in want["samples"]] == texts,
          ([x["text"] for x in want["samples"]], texts))
    _, one = completion(c, temperature=1.0, seed=11, max_tokens=10)
    check("n-sample0-is-n1", texts and one["choices"][0]["text"] == texts[0], (texts, one))
    # gRPC: the same samples, by index, with logprobs
    by_index = {}
    finished = {}
    for m in stub.Generate(pb.GenerateRequest(text=PROMPT, sampling=pb.SamplingParams(
            max_tokens=10, temperature=1.0, seed=11, ignore_eos=True, n=3, logprobs=True)),
            timeout=120):
        by_index.setdefault(m.index, []).append(m)
        if m.finish_reason:
            finished[m.index] = m.finish_reason
    gtexts = ["".join(m.text for m in by_index.get(i, [])) for i in range(3)]
    check("n-grpc", gtexts == texts and finished == {0: "length", 1: "length", 2: "length"} and
          all(sum(len(m.logprobs) for m in by_index[i]) ==
              sum(len(m.token_ids) for m in by_index[i]) == 10 for i in range(3)),
          (gtexts, texts, finished))
    # streamed: chunks carry their choice's index, each choice ends once
    st, chunks = completion(c, n=2, temperature=1.0, seed=11, max_tokens=10, stream=True,
                            stream_options={"include_usage": True})
    ends = [ch["choices"][0]["index"] for ch in chunks
            if ch["choices"] and ch["choices"][0]["finish_reason"]]
    stexts = ["".join(ch["choices"][0]["text"] for ch in chunks
                      if ch["choices"] and ch["choices"][0]["index"] == i) for i in range(2)]
    check("n-stream", st == 200 and sorted(ends) == [0, 1] and stexts == texts[:2] and
          chunks[-1]["usage"]["completion_tokens"] == 20, (ends, stexts, texts))
    # chat n
    st, doc = post(c, "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": "Speak."}], "n": 2,
                    "max_tokens": 5, "temperature": 1.0, "seed": 5, "ignore_eos": True})
    check("n-chat", st == 200 and len(doc["choices"]) == 2 and
          all(ch["message"]["role"] == "assistant" for ch in doc["choices"]), (st, doc))


def check_refusals(c, stub):
    for bad, name in (({"best_of": 3, "n": 2}, "best_of"), ({"n": 0}, "n"), ({"n": 65}, "n"),
                      ({"tools": [{"type": "function"}]}, "tools"),
                      ({"response_format": {"type": "json_object"}}, "response_format"),
                      ({"frequency_penalty": 2.5}, "frequency_penalty"),
                      ({"repetition_penalty": 0}, "repetition_penalty"),
                      ({"repetition_penalty": -1}, "repetition_penalty"),
                      ({"logit_bias": {"abc": 1}}, "logit_bias"),
                      ({"logit_bias": {"5": 101}}, "logit_bias"),
                      ({"logit_bias": {"99999": 1}}, "logit_bias"),
                      ({"stop_token_ids": [99999]}, "stop_token_ids"),
                      ({"stop_token_ids": "x"}, "stop_token_ids"),
                      ({"min_tokens": 20, "max_tokens": 4}, "min_tokens"),
                      ({"echo": "yes"}, "echo"), ({"logprobs": True}, "logprobs")):
        st, doc = completion(c, **bad)
        check("400-%s-%s" % (name, json.dumps(bad)), st == 400 and name in
              doc["error"]["message"], (st, doc))
    st, doc = post(c, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                               "max_tokens": 1, "echo": True})
    check("400-chat-echo", st == 400 and "echo" in doc["error"]["message"], (st, doc))
    r = grpc_ids(stub, n=2, best_of=2, temperature=1.0, seed=4, max_tokens=3, ignore_eos=True)
    check("grpc-best-of-equal-n", r.code == grpc.StatusCode.OK and len(r.ids) == 6,
          (r.code, r.details, r.ids))
    for kw, name in (({"n": 2, "best_of": 3}, "best_of"), ({"logprobs": True,
                                                            "top_logprobs": 21}, "logprobs"),
                     ({"min_tokens": 20}, "min_tokens"),
                     ({"logit_bias": [pb.LogitBias(token_id=-1, bias=1)]}, "logit_bias")):
        r = grpc_ids(stub, **kw)
        check("grpc-invalid-%s" % name, r.code == grpc.StatusCode.INVALID_ARGUMENT and
              name in r.details, (r.code, r.details))


def main():
    tpl = model_template(TEMPLATE_1, "tiny-llama", TMP)
    with cluster.Cluster(tpl, overrides=all_nodes(tpl, weights="bf16", kv="bf16"),
                         keep_dir=bool(os.environ.get("PD_KEEP_LOGS"))) as c:
        print("info logs in %s" % c.log_dir, flush=True)
        stub = pb_grpc.InferenceStub(channel(c.router_addr))
        check_against_pdctl(c, stub)
        check_logprobs(c, stub)
        check_echo(c, stub)
        check_n(c, stub)
        check_refusals(c, stub)
        used = wait_pages_free(c)
        check("pages-free", all(v == 0 for v in used.values()), used)
    finish()


if __name__ == "__main__":
    main()
