# The PyTorch reference for `gpu_bench moe` (tests/bench/gpu_bench.c, bench_moe): one decode step
# of a Qwen3-30B-A3B-shaped model (hidden 2048, 32 / 4 heads of 128 with q/k RMSNorm, 128
# experts of FFN 768, top 8 renormalized, vocab 151936; PD_BENCH_MOE_LAYERS of its 48 layers,
# default 16 as gpu_bench), random weights, BF16 KV cache at context 1024, batch 1 and 64, the
# next token picked on the GPU (argmax). Run on the GPU machine, same session as gpu_bench moe:
#
#     python3 tests/bench/torch_moe_baseline.py            # prints one JSON object at the end
#
# What a user would pick in plain PyTorch, each timed where it works (a failure is recorded as
# "<variant>_B<b>_err" and the others go on):
#   bf16_grouped_graph  experts through torch._grouped_mm (bf16, device-side group offsets: sort
#                       the (token, slot) pairs by expert, bincount, cumsum), the whole step in one
#                       CUDA graph (median of CUDA-event times over replays);
#   fp8_grouped_graph   the same with torch._scaled_grouped_mm (fp8 e4m3, row-wise scales;
#                       PyTorch >= 2.8 on Hopper), in one CUDA graph;
#   int4_loop_eager     transformers-style loop over the experts in use with tinygemm INT4
#                       (_weight_int4pack_mm): the routing goes to the host every layer, so no
#                       graph; wall clock per step (median);
#   bf16_loop_eager     the same loop with bf16 weights.
# Compare with gpu_bench moe's "graph ms (whole step ...)" column (pdserve also samples on the
# device there, and downloads only the ids).
import json, os, time
import torch
import torch.nn.functional as F

dev = "cuda"
torch.manual_seed(0)
L = int(os.environ.get("PD_BENCH_MOE_LAYERS", "16"))
H, NH, NKV, HD, E, TOPK, FM, V = 2048, 32, 4, 128, 128, 8, 768, 151936
CTX, S = 1024, 1536
eps = 1e-6


def bench_graph(fn, iters=30):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        st.record(); g.replay(); en.record(); torch.cuda.synchronize()
        ts.append(st.elapsed_time(en))
    ts.sort()
    return ts[len(ts) // 2]


def bench_eager(fn, iters=10):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter(); fn(); torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


inv = 1.0 / (1000000.0 ** (torch.arange(0, HD, 2, device=dev).float() / HD))


def rope(x, pos):  # x (B, h, 1, HD)
    f = pos.float()[:, None] * inv[None]
    c, s = f.cos()[None, None].to(x.dtype), f.sin()[None, None].to(x.dtype)
    x1, x2 = x[..., :HD // 2], x[..., HD // 2:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def bf16(n, k):
    return torch.randn(n, k, device=dev, dtype=torch.bfloat16) * (k ** -0.5)


# attention weights and the rest in bf16 for every variant (the experts are what differs)
layers = []
for _ in range(L):
    layers.append(dict(qkv=bf16((NH + 2 * NKV) * HD, H), o=bf16(H, NH * HD), gate=bf16(E, H),
                       n1=torch.ones(H, device=dev, dtype=torch.bfloat16),
                       n2=torch.ones(H, device=dev, dtype=torch.bfloat16),
                       qn=torch.ones(HD, device=dev, dtype=torch.bfloat16),
                       kn=torch.ones(HD, device=dev, dtype=torch.bfloat16)))
emb = torch.randn(V, H, device=dev, dtype=torch.bfloat16) * 0.02
head = bf16(V, H)
fnorm = torch.ones(H, device=dev, dtype=torch.bfloat16)


def route(a, Ly):
    p = torch.softmax((a @ Ly["gate"].t()).float(), -1)
    w, ids = torch.topk(p, TOPK, -1)
    return (w / w.sum(-1, keepdim=True)).to(a.dtype), ids


def make_experts(kind):
    """one layer's experts: (E, 2 FM, H) and (E, H, FM) in the variant's format"""
    if kind in ("bf16_grouped_graph", "bf16_loop_eager"):
        gu = torch.randn(E, 2 * FM, H, device=dev, dtype=torch.bfloat16) * (H ** -0.5)
        dn = torch.randn(E, H, FM, device=dev, dtype=torch.bfloat16) * (FM ** -0.5)
        if kind == "bf16_grouped_graph":  # _grouped_mm wants (G, K, N)
            return dict(gu=gu.transpose(1, 2), dn=dn.transpose(1, 2))
        return dict(gu=gu, dn=dn)
    if kind == "fp8_grouped_graph":
        gu = (torch.randn(E, 2 * FM, H, device=dev) * 8).to(torch.float8_e4m3fn)
        dn = (torch.randn(E, H, FM, device=dev) * 8).to(torch.float8_e4m3fn)
        return dict(gu=gu.transpose(1, 2), dn=dn.transpose(1, 2),
                    gus=torch.full((E, 2 * FM), 1.0 / (8 * H ** 0.5), device=dev),
                    dns=torch.full((E, H), 1.0 / (8 * FM ** 0.5), device=dev))
    # int4: tinygemm packed, one matrix per expert
    def pack(n, k):
        q = torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.uint8)
        return (torch.ops.aten._convert_weight_to_int4pack(q, 8),
                torch.rand(k // 128, n, 2, device=dev, dtype=torch.bfloat16) * 0.01)
    return dict(gu=[pack(2 * FM, H) for _ in range(E)], dn=[pack(H, FM) for _ in range(E)])


def fp8_rows(x):
    s = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (x.float() / s).to(torch.float8_e4m3fn), s.squeeze(-1)


def moe_grouped(a, Ly, X, kind):
    B = a.shape[0]
    w, ids = route(a, Ly)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    cnt = torch.zeros(E, device=dev, dtype=torch.int32).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))  # bincount syncs; this is capturable
    offs = torch.cumsum(cnt, 0, dtype=torch.int32)
    xs = a[order // TOPK]
    if kind == "bf16_grouped_graph":
        gu = torch._grouped_mm(xs, X["gu"], offs=offs, out_dtype=torch.bfloat16)
        act = F.silu(gu[:, :FM]) * gu[:, FM:]
        y = torch._grouped_mm(act, X["dn"], offs=offs, out_dtype=torch.bfloat16)
    else:
        q, s = fp8_rows(xs)
        gu = torch._scaled_grouped_mm(q, X["gu"], s, X["gus"], offs=offs, out_dtype=torch.bfloat16)
        act = F.silu(gu[:, :FM]) * gu[:, FM:]
        q2, s2 = fp8_rows(act)
        y = torch._scaled_grouped_mm(q2, X["dn"], s2, X["dns"], offs=offs, out_dtype=torch.bfloat16)
    out = torch.zeros(B * TOPK, H, device=dev, dtype=y.dtype)
    out[order] = y
    return (out.view(B, TOPK, H) * w[..., None]).sum(1)


def moe_loop(a, Ly, X, kind):
    w, ids = route(a, Ly)
    out = torch.zeros_like(a)
    for e in torch.unique(ids).tolist():  # the host readback of the routing
        tok, slot = torch.where(ids == e)
        xe = a[tok]
        if kind == "int4_loop_eager":
            gu = torch.ops.aten._weight_int4pack_mm(xe, X["gu"][e][0], 128, X["gu"][e][1])
            act = F.silu(gu[:, :FM]) * gu[:, FM:]
            y = torch.ops.aten._weight_int4pack_mm(act, X["dn"][e][0], 128, X["dn"][e][1])
        else:
            gu = xe @ X["gu"][e].t()
            act = F.silu(gu[:, :FM]) * gu[:, FM:]
            y = act @ X["dn"][e].t()
        out.index_add_(0, tok, y * w[tok, slot][:, None])
    return out


res = {"layers": L}
for kind in ("bf16_grouped_graph", "fp8_grouped_graph", "int4_loop_eager", "bf16_loop_eager"):
    try:
        experts = [make_experts(kind) for _ in range(L)]
    except Exception as e:  # out of memory or a missing op: the next variant
        res[f"{kind}_err"] = str(e)[:300]
        print(kind, res, flush=True)
        continue
    for B in (1, 64):
        kc = [torch.randn(B, NKV, S, HD, device=dev, dtype=torch.bfloat16) for _ in range(L)]
        vc = [torch.randn(B, NKV, S, HD, device=dev, dtype=torch.bfloat16) for _ in range(L)]
        tok = torch.zeros(B, dtype=torch.long, device=dev)
        pos = torch.tensor([CTX], device=dev)
        mask = torch.arange(S, device=dev)[None, None, None, :] <= pos[:, None, None, None]
        nxt = torch.empty(B, dtype=torch.long, device=dev)

        def step():
            h = emb[tok]
            for l in range(L):
                Ly = layers[l]
                a = rms(h, Ly["n1"])
                qkv = a @ Ly["qkv"].t()
                q = rms(qkv[:, :NH * HD].view(B, NH, 1, HD), Ly["qn"])
                k = rms(qkv[:, NH * HD:(NH + NKV) * HD].view(B, NKV, 1, HD), Ly["kn"])
                v = qkv[:, (NH + NKV) * HD:].view(B, NKV, 1, HD)
                q, k = rope(q, pos), rope(k, pos)
                kc[l].index_copy_(2, pos, k)
                vc[l].index_copy_(2, pos, v)
                att = F.scaled_dot_product_attention(q, kc[l], vc[l], attn_mask=mask, enable_gqa=True)
                h = h + att.reshape(B, NH * HD) @ Ly["o"].t()
                a = rms(h, Ly["n2"])
                if "grouped" in kind:
                    h = h + moe_grouped(a, Ly, experts[l], kind)
                else:
                    h = h + moe_loop(a, Ly, experts[l], kind)
            nxt.copy_((rms(h, fnorm) @ head.t()).argmax(-1))

        try:
            ms = bench_graph(step) if "graph" in kind else bench_eager(step)
            res[f"{kind}_B{B}_ms"] = round(ms, 3)
            res[f"{kind}_B{B}_tok_s"] = round(B * 1000 / ms, 1)
        except Exception as e:
            res[f"{kind}_B{B}_err"] = str(e)[:300]
        print(kind, B, res, flush=True)
        del kc, vc
    del experts
    torch.cuda.empty_cache()
print(json.dumps(res, indent=1))
