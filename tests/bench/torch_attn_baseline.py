# Same-run PyTorch reference for one layer of decode attention (Llama-3-8B shape: 32 / 8 heads,
# head_dim 128, BF16 KV; PyTorch has no FP8-KV attention): F.scaled_dot_product_attention with
# enable_gqa on contiguous (B, 8, ctx, 128) caches (no pages), one query row per sequence,
# replayed from a CUDA graph; median of 50. Prints one JSON object (us and GB/s per case).
import json, torch
import torch.nn.functional as F
dev = "cuda"; torch.manual_seed(0)
NH, NKV, HD = 32, 8, 128
def bench_graph(fn, iters=50):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): fn()
    for _ in range(5): g.replay()
    torch.cuda.synchronize()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        st.record(); g.replay(); en.record(); torch.cuda.synchronize(); ts.append(st.elapsed_time(en))
    ts.sort(); return ts[len(ts) // 2]
res = {}
for B, ctx in ((64, 1024), (1, 32768), (1, 1024), (16, 1024), (64, 8192), (1, 8192)):
    q = torch.randn(B, NH, 1, HD, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, NKV, ctx, HD, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, NKV, ctx, HD, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    def step():
        out.copy_(F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    try:
        ms = bench_graph(step)
        byts = 2 * B * NKV * ctx * HD * 2
        res[f"sdpa_bf16_B{B}_ctx{ctx}_us"] = round(ms * 1e3, 1)
        res[f"sdpa_bf16_B{B}_ctx{ctx}_GBps"] = round(byts / (ms * 1e-3) / 1e9)
    except Exception as e:
        res[f"sdpa_bf16_B{B}_ctx{ctx}_err"] = str(e)[:200]
    del q, k, v, out; torch.cuda.empty_cache()
print(json.dumps(res, indent=1))
