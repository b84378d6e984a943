# The PyTorch prefill baseline, alone (the prefill part of /work/shared/bench/
# torch_decode_baseline.py, same model and code: Llama-3-8B shape, random weights, FP8 _scaled_mm
# GEMMs with unit per-tensor scales, SDPA flash causal attention, bf16 activations), plus the
# pieces pdserve's per-op table compares with: SDPA alone (one layer: 8192 causal; 16 x 512), and
# _scaled_mm with per-token x per-row (rowwise) scales on 8192 x 14336 x 4096.
# Prints one JSON object. Usage: python3 torch_prefill_baseline.py
import json
import torch
import torch.nn.functional as F

dev = "cuda"
torch.manual_seed(0)
L, H, NH, NKV, HD, FF = 32, 4096, 32, 8, 128, 14336
one = torch.tensor(1.0, device=dev)
res = {}


def timed(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record(); fn(); en.record(); torch.cuda.synchronize(); ts.append(st.elapsed_time(en))
    ts.sort()
    return ts[len(ts) // 2]


def make_fp8(n, k):
    return (torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02).to(torch.float8_e4m3fn)


def lin(x, w):
    return torch._scaled_mm(x.to(torch.float8_e4m3fn), w.t(), scale_a=one, scale_b=one,
                            out_dtype=torch.bfloat16)


# ---- SDPA alone, one layer ----
for B, T in ((1, 8192), (16, 512), (1, 2048)):
    q = torch.randn(B, NH, T, HD, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, NKV, T, HD, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, NKV, T, HD, device=dev, dtype=torch.bfloat16)
    ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    flops = 4.0 * NH * HD * B * T * (T + 1) / 2
    res[f"sdpa_causal_B{B}_T{T}_us"] = round(ms * 1e3, 1)
    res[f"sdpa_causal_B{B}_T{T}_tflops"] = round(flops / ms / 1e9, 1)
    del q, k, v

# ---- FP8 GEMM with rowwise scales (per token x per output row), bf16 out ----
M, N, K = 8192, 14336, 4096
a = (torch.randn(M, K, device=dev) * 0.5).to(torch.float8_e4m3fn)
b = make_fp8(N, K)
sa = torch.rand(M, 1, device=dev) + 0.5
sb = torch.rand(1, N, device=dev) + 0.5
for name, out_dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
    try:
        ms = timed(lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype))
        res[f"scaled_mm_rowwise_{name}_8192x14336x4096_us"] = round(ms * 1e3, 1)
        res[f"scaled_mm_rowwise_{name}_tflops"] = round(2.0 * M * N * K / ms / 1e9, 1)
    except Exception as e:  # rowwise scales need a recent torch and sm_89+
        res[f"scaled_mm_rowwise_{name}_err"] = str(e)[:200]
del a, b

# ---- the prefill step (as torch_decode_baseline.py) ----
layers = [dict(qkv=make_fp8((NH + 2 * NKV) * HD, H), o=make_fp8(H, H), w13=make_fp8(2 * FF, H),
               w2=make_fp8(H, FF), n1=torch.ones(H, device=dev, dtype=torch.bfloat16),
               n2=torch.ones(H, device=dev, dtype=torch.bfloat16)) for _ in range(L)]
inv = 1.0 / (500000 ** (torch.arange(0, HD, 2, device=dev).float() / HD))


def rms(x, w):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w


T = 8192
x = torch.randn(T, H, device=dev, dtype=torch.bfloat16) * 0.1
posT = torch.arange(T, device=dev)
fT = posT.float()[:, None] * inv[None]
cT, sT = fT.cos().to(torch.bfloat16), fT.sin().to(torch.bfloat16)


def ropeT(t):
    t1, t2 = t[..., :HD // 2], t[..., HD // 2:]
    return torch.cat([t1 * cT - t2 * sT, t2 * cT + t1 * sT], -1)


def prefill():
    h = x
    for l in range(L):
        Ly = layers[l]; a = rms(h, Ly["n1"]); qkv = lin(a, Ly["qkv"])
        q = qkv[:, :NH * HD].view(T, NH, HD).transpose(0, 1)[None]
        k = qkv[:, NH * HD:(NH + NKV) * HD].view(T, NKV, HD).transpose(0, 1)[None]
        v = qkv[:, (NH + NKV) * HD:].view(T, NKV, HD).transpose(0, 1)[None]
        att = F.scaled_dot_product_attention(ropeT(q), ropeT(k), v, is_causal=True, enable_gqa=True)
        h = h + lin(att[0].transpose(0, 1).reshape(T, H), Ly["o"])
        a = rms(h, Ly["n2"]); gu = lin(a, Ly["w13"]); h = h + lin(F.silu(gu[:, :FF]) * gu[:, FF:], Ly["w2"])
    return h


ms = timed(prefill, reps=5)
res["prefill_fp8_8192_ms"] = round(ms, 2)
res["prefill_fp8_8192_tok_s"] = round(T * 1000 / ms)
print(json.dumps(res, indent=1))
