/* tests/bench/gpu_bench: CUDA backend timings on a Llama-3-8B-shaped problem (hidden 4096,
 * 32 / 8 heads, head_dim 128, FFN 14336, vocab 128256, 32 layers).
 *   1. per op: median time over repeats (CUDA events on the backend's stream), the bytes or
 *      FLOPs it must move or do, and the share of the floor (copy ~4.2 TB/s, FP8 dense GEMM
 *      ~1.36 PFLOP/s, BF16 ~0.79 PFLOP/s);
 *   2. whole decode steps (model_forward, random weights) at batch 1, 3, 16 and 64 (or
 *      GPU_BENCH_DECODE_BATCHES="1 8 64"), context 1024, the LM head bf16 (or GPU_BENCH_LM_HEAD=
 *      fp8 | int4, for the prefill table too),
 *      for INT4 weights + FP8 KV and FP8 weights + BF16 KV, with and without the logits
 *      download, eager (MODEL_GRAPHS_OFF) and replayed from CUDA graphs (MODEL_GRAPHS_ON); the
 *      graph logits are compared with the same padded plan run op by op (MODEL_GRAPHS_EAGER:
 *      must be bit-identical, else exit 1) and with the plain eager step (max |diff|);
 *      and the whole step with sampling on the device inside the graph (model_forward_sample:
 *      greedy, and temperature 0.8 + top-p 0.95), only the token ids downloaded;
 *   3. prefill of 8192 tokens (one sequence) for FP8 + BF16 KV and INT4 + BF16 KV; for FP8 also
 *      16 prompts of 512 tokens in one batch, the 8192 tokens as 16 chunks of 512 that attend
 *      to the earlier pages (the sum of the 16 steps), and one 32768-token prompt.
 * Per-op also times flash attention (kernels/attention_flash.h) against the SIMT kernel
 * (attention_run) on prefill shapes, one layer: 8192 causal, 16 x 512 varlen, a 512-row chunk at
 * the end of 8192 tokens; and the BF16 GEMM in both modes (one bf16 GEMM, hi + lo split).
 * attn: decode attention alone (tensor-core kernel against the SIMT kernels, B 1..64, ctx 1k..32k).
 * attnprof: one launch each of fp8 / bf16 at B 64 ctx 1k and B 1 ctx 32k (for ncu).
 * attnsplit: decode attention at B 16 / 64 for several split targets (bench_attn_split; not part
 * of all).
 * attnbf: the bf16-KV decode attention in each variant of attention_tc_bf16 (bench_attn_bf16; not
 * part of all).
 * moe: the Qwen3-30B-A3B decode table (bench_moe; not part of all).
 * ctxscale: whole decode steps (graph, no logits) at batch 1 / 64 and context 1k / 8k / 32k.
 * family: GLM-4.5-Air and DeepSeek-V3 shapes with PD_BENCH_FAMILY_LAYERS layers (default 2: one
 * dense, one MoE; random weights, tests/support/model_random.h), decode B 1 / 64 at context 1024
 * (INT4 + FP8 KV; FP8 + BF16 KV, DeepSeek-V3 in its published FP8 128x128 block format) and a
 * prefill of PD_BENCH_FAMILY_PREFILL tokens (default 2048; 0: none); decode eager and with
 * graphs (session 16: the family's MoE steps are captured, FP8 block-scaled experts excepted);
 * GPU_BENCH_FAMILY_PROF=1: a kernel-time profile (stepprof) of the INT4 decode steps instead.
 * gemm: the prefill FP8 GEMM at n 8192 (output type, accumulation, cuBLASLt candidates);
 * prefops: one prefill layer (n 8192) op by op (both not part of all).
 * stepprof: kernel time per whole step from CUPTI activity records (bench_stepprof; not part of
 * all).
 * sample: the sampling and logprobs ops alone, both sampler paths (bench_sample; not part of all).
 * w8wg: the FP8 wgmma + TMA GEMM against the FP8 routes before it (bench_w8wg; not part of all).
 * ksplit: the FP8 K-split mma GEMV against the FP8 op at n 1..8 (bench_ksplit; not part of all).
 * Usage: gpu_bench [ops] [decode] [prefill] [flash] [int4] [attn] [attnprof] [attnsplit] [attnbf]
 * [elementwise] [moe] [wgemv] [xgemv] [family] [ctxscale] [gemm] [prefops] [stepprof] [w4wg]
 * [w8wg] [ksplit] [qkvgroup] [sample] [all] (default all; wgemv, xgemv (bench_xgemv), family,
 * ctxscale, moe, gemm, prefops, stepprof, attnsplit, w4wg, w8wg, ksplit, qkvgroup, sample: not part
 * of all; flash: only
 * the 8192 causal flash attention and the FP8 8192 x 14336 x 4096 GEMM, for ncu; int4: the INT4
 * paths table of ops alone). Needs a CUDA device (exits 77 without).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "attention_flash.h"
#include "backend.h"
#include "backend_cuda.h"
#include "dtype.h"
#include "elementwise.h"
#include "kv_pool.h"
#include "clock.h"
#include "log.h"
#include "matmul.h"
#include "sample.h"
#include "model.h"
#include "model_random.h"
#include "hf_config.h"
#include "stepprof.h"

#define COPY_BW 4.2e12
#define FP8_FLOPS 1.36e15
#define BF16_FLOPS 0.79e15

static pd_backend_t *be;
static pd_backend_t *be_split; /* PD_CUDA_BF16_GEMM=split (hi + lo BF16 GEMMs) */
static int graph_fail;         /* a graph capture failed or a replay differed from its eager plan */
/* stepprof: run_forward_s records its timed calls as steps (stepprof.h); the caller ends the
 * window. prof_fail: stepprof_begin failed (exit 1). */
static bool prof_steps;
static int prof_fail;
static cudaStream_t stream;
static cudaStream_t stream_split;
static pd_backend_t *be_old; /* PD_CUDA_XGEMV=0 (the session-4 routing), for bench_xgemv */
static cudaStream_t stream_old;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    float f = (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
    return f == 0.0f ? 0.25f : f;
}

static void ok(pd_status_t st, const char *what)
{
    if (st != PD_OK) {
        fprintf(stderr, "gpu_bench: %s: %s\n", what, pd_status_str(st));
        exit(1);
    }
}

static void *dev_random_f32(size_t n, float scale)
{
    float *h = malloc(n * 4);
    void *d;
    for (size_t i = 0; i < n; i++)
        h[i] = rnd() * scale;
    ok(be->ops->alloc(be, n * 4, &d), "alloc");
    ok(be->ops->upload(be, d, h, n * 4), "upload");
    free(h);
    return d;
}

/* a device copy of n 4-byte elements (int32 or f32) */
static void *dev_copy4(const void *h, size_t n)
{
    void *d;
    ok(be->ops->alloc(be, n * 4, &d), "alloc");
    ok(be->ops->upload(be, d, h, n * 4), "upload");
    return d;
}

static void *dev_i32(const int32_t *h, size_t n)
{
    return dev_copy4(h, n);
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* median ms of fn over reps (after 3 warm-ups), timed with events on the backend stream */
typedef void (*op_fn)(void *arg);
/* when set, time_op writes this buffer (l2_flush_bytes, more than the 50 MB L2) before each
 * timed repeat, so that weights do not stay in L2 from one repeat to the next */
static void *l2_flush;
static size_t l2_flush_bytes;

static int time_warm = 3; /* warm-up launches of time_op (attnprof: 0, one launch per case) */
/* the read-only L2 flush of bench_xgemv: a GEMV over a 128 MB BF16 weight (n 1) */
static pd_weight_t *l2_rd_w;
static float *l2_rd_out, *l2_rd_x;

static float time_op(op_fn fn, void *arg, int reps)
{
    cudaEvent_t a, b;
    float ts[64];
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < time_warm; i++)
        fn(arg);
    ok(be->ops->sync(be), "warm-up");
    for (int i = 0; i < reps; i++) {
        if (l2_rd_w) /* read-only flush: L2 left holding clean lines of another buffer */
            be->ops->matmul(be, l2_rd_out, l2_rd_x, l2_rd_w, 1);
        else if (l2_flush)
            cudaMemsetAsync(l2_flush, i & 0xff, l2_flush_bytes, stream);
        cudaEventRecord(a, stream);
        fn(arg);
        cudaEventRecord(b, stream);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ts[i], a, b);
    }
    ok(be->ops->sync(be), "timed ops");
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    qsort(ts, (size_t)reps, sizeof ts[0], cmp_f);
    return ts[reps / 2];
}

/* The heading and separator of the tables row() prints rows of. */
static void row_header(void)
{
    printf("| %-12s | %-34s | %9s | %8s | %9s | %6s |\n", "op", "shape", "time us", "GB/s",
           "TFLOP/s", "floor");
    printf("|---|---|---|---|---|---|\n");
}

static void row(const char *op, const char *shape, float ms, double bytes, double flops,
                double floor_flops)
{
    double s = ms * 1e-3, bw = bytes / s, fl = flops / s;
    double t_floor = bytes / COPY_BW > flops / floor_flops ? bytes / COPY_BW : flops / floor_flops;
    printf("| %-12s | %-34s | %9.3f | %8.0f | %9.1f | %5.1f%% |\n", op, shape, ms * 1e3, bw / 1e9,
           fl / 1e12, 100.0 * t_floor / s);
}

/* ==== per-op ==== */

typedef struct {
    float *out, *x;
    pd_weight_t *w;
    int n;
} mm_arg_t;
static void run_mm(void *p)
{
    mm_arg_t *a = p;
    be->ops->matmul(be, a->out, a->x, a->w, a->n);
}

static void bench_matmul(pd_wfmt_t fmt, int n, int64_t N, int64_t K)
{
    uint16_t *src = malloc((size_t)(N * K) * 2);
    pd_weight_t host, w;
    char shape[64];
    for (int64_t i = 0; i < N * K; i++)
        src[i] = pd_f32_to_bf16(rnd() * 0.02f);
    ok(model_quantize_bf16(src, N, K, fmt, &host), "quantize");
    free(src);
    ok(backend_weight_upload(be, &host, &w), "weight upload");
    mm_arg_t a = {NULL, dev_random_f32((size_t)n * K, 1.0f), &w, n};
    ok(be->ops->alloc(be, (size_t)n * N * 4, (void **)&a.out), "alloc");
    float ms = time_op(run_mm, &a, 20);
    double bytes = (double)(quant_data_bytes(fmt, N, K) + quant_scales_bytes(fmt, N, K) +
                            quant_zeros_bytes(fmt, N, K)) +
                   (double)n * K * 4 + (double)n * N * 4;
    snprintf(shape, sizeof shape, "%s n %d N %lld K %lld", pd_wfmt_name(fmt), n, (long long)N,
             (long long)K);
    row("matmul", shape, ms, bytes, 2.0 * n * N * K, fmt == PD_WFMT_FP8 ? FP8_FLOPS : BF16_FLOPS);
    model_host_weight_free(&host);
    backend_weight_free(be, &w);
    be->ops->free(be, a.x);
    be->ops->free(be, a.out);
}

typedef struct {
    float *out, *q;
    void *arena;
    kv_layout_t *l;
    pd_attn_batch_t *b;
} att_arg_t;
static void run_att(void *p)
{
    att_arg_t *a = p;
    be->ops->attention(be, a->out, a->q, a->arena, a->l, 0, a->b, 32);
}

/* Fills every slot of every layer of arena (n_pages pages) with random K/V through kv_write, or
 * for a latent layout (n_sides 1, MLA) with random latents of rank r through latent_write. */
static void arena_fill_latent(void *arena, const kv_layout_t *l, int n_pages, int r)
{
    const int chunk = 4096, row = l->n_kv_heads * l->head_dim;
    float *k = dev_random_f32((size_t)chunk * row, 2.0f),
          *v = dev_random_f32((size_t)chunk * row, 2.0f);
    int32_t *h = malloc((size_t)chunk * 4), *d;
    ok(be->ops->alloc(be, (size_t)chunk * 4, (void **)&d), "alloc");
    for (int s0 = 0; s0 < n_pages * l->page_tokens; s0 += chunk) {
        int n = n_pages * l->page_tokens - s0 < chunk ? n_pages * l->page_tokens - s0 : chunk;
        for (int i = 0; i < n; i++)
            h[i] = s0 + i;
        ok(be->ops->upload(be, d, h, (size_t)n * 4), "upload");
        for (int layer = 0; layer < l->n_layers; layer++) {
            if (l->n_sides == 1)
                be->ops->latent_write(be, arena, l, layer, k, v, d, n, r);
            else
                be->ops->kv_write(be, arena, l, layer, k, v, d, n);
        }
        ok(be->ops->sync(be), "arena fill");
    }
    free(h);
    be->ops->free(be, d);
    be->ops->free(be, k);
    be->ops->free(be, v);
}

static void arena_fill(void *arena, const kv_layout_t *l, int n_pages)
{
    arena_fill_latent(arena, l, n_pages, 0);
}

static const char *attn_tag = ""; /* appended to bench_attention_on's shape (attnbf) */

/* Decode attention, one layer, 32 / 8 heads, hd 128, page 16: B rows at context ctx; tc: the
 * tensor-core kernel (1, the default) or the SIMT kernels (0). Bytes: the K / V rows and fp8
 * scales the step must read. */
static void bench_attention_on(pd_kvfmt_t fmt, int B, int ctx, int tc)
{
    kv_layout_t l;
    char shape[64];
    kv_layout_init(&l, 1, 8, 128, 16, fmt);
    int ppseq = (ctx + 15) / 16, n_pages = B * ppseq;
    void *arena;
    ok(be->ops->alloc(be, (size_t)n_pages * l.page_bytes, &arena), "arena");
    arena_fill(arena, &l, n_pages);
    int32_t *qs = malloc(((size_t)B + 1) * 4), *cl = malloc((size_t)B * 4),
            *bt = malloc((size_t)B * ppseq * 4);
    for (int s = 0; s <= B; s++)
        qs[s] = s;
    for (int s = 0; s < B; s++) {
        cl[s] = ctx;
        for (int i = 0; i < ppseq; i++)
            bt[s * ppseq + i] = s * ppseq + i;
    }
    pd_attn_batch_t b = {B,
                         ppseq,
                         dev_i32(qs, (size_t)B + 1),
                         dev_i32(cl, (size_t)B),
                         dev_i32(bt, (size_t)B * ppseq),
                         B,
                         ctx};
    att_arg_t a = {NULL, dev_random_f32((size_t)B * 32 * 128, 1.0f), arena, &l, &b};
    ok(be->ops->alloc(be, (size_t)B * 32 * 128 * 4, (void **)&a.out), "alloc");
    attention_decode_tc = tc;
    float ms = time_op(run_att, &a, time_warm ? 20 : 1);
    attention_decode_tc = 1;
    double bytes = (double)B * ctx * 2 * (l.side_bytes + l.scale_bytes) / l.page_tokens;
    snprintf(shape, sizeof shape, "%s kv B %d ctx %d%s%s", pd_kvfmt_name(fmt), B, ctx,
             tc ? "" : " simt", attn_tag);
    row("attention", shape, ms, bytes, 4.0 * B * 32 * ctx * 128, BF16_FLOPS);
    be->ops->free(be, arena);
    be->ops->free(be, a.q);
    be->ops->free(be, a.out);
    be->ops->free(be, (void *)b.q_start);
    be->ops->free(be, (void *)b.ctx_len);
    be->ops->free(be, (void *)b.block_tables);
    free(qs);
    free(cl);
    free(bt);
}

static void bench_attention(pd_kvfmt_t fmt, int B, int ctx)
{
    bench_attention_on(fmt, B, ctx, 1);
}

/* `gpu_bench attn`: the decode attention table (tensor-core kernel and the SIMT kernels it
 * replaced; the time includes the split merge where there is one). */
static void bench_attn_decode(void)
{
    printf(
        "\ndecode attention, one layer, 32 / 8 heads, hd 128, page 16 (floor: bytes / 4.2 TB/s)\n");
    row_header();
    const pd_kvfmt_t fs[] = {PD_KV_FP8, PD_KV_BF16};
    const int cfg[][2] = {{64, 1024}, {1, 32768}, {1, 1024},  {16, 1024}, {64, 8192},
                          {1, 8192},  {8, 1024},  {32, 1024}, {5, 8192}};
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 9; c++)
            for (int tc = 1; tc >= 0; tc--) {
                static char tag[16];
                snprintf(tag, sizeof tag, " s%d", attention_splits(cfg[c][0], 8, cfg[c][1], fs[f]));
                attn_tag = tag;
                bench_attention_on(fs[f], cfg[c][0], cfg[c][1], tc);
            }
    attn_tag = "";
    fflush(stdout);
}

/* `gpu_bench attnsplit`: the tensor-core decode attention at batch 16 / 64 with the context split
 * for several block targets (attention_target_blocks; GPU_BENCH_ATTN_TARGETS, default "0 1024
 * 1536 2048 3072", 0 = the built-in 528), to see whether more splits fill the SMs better (bf16
 * KV in variants 0 / 2 of attention_tc_bf16 fits 3 blocks per SM: 512 blocks at batch 64 are 1.3
 * waves of 396; the default variant 1 fits 4). */
static void bench_attn_split(void)
{
    const char *env = getenv("GPU_BENCH_ATTN_TARGETS");
    const char *list = env ? env : "0 1024 1536 2048 3072";
    const int keep = attention_target_blocks;
    printf("\ndecode attention by split target, one layer, 32 / 8 heads, hd 128, page 16\n");
    row_header();
    const pd_kvfmt_t fs[] = {PD_KV_BF16, PD_KV_FP8};
    const int cfg[][2] = {{64, 1024}, {16, 1024}, {64, 8192}};
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 3; c++) {
            const char *p = list;
            char *end;
            for (long t = strtol(p, &end, 10); end != p; p = end, t = strtol(p, &end, 10)) {
                attention_target_blocks = (int)t;
                printf("target %ld: %d splits\n", t,
                       attention_splits(cfg[c][0], 8, cfg[c][1], fs[f]));
                bench_attention_on(fs[f], cfg[c][0], cfg[c][1], 1);
            }
            attention_target_blocks = keep;
        }
    fflush(stdout);
}

/* `gpu_bench attnbf`: the bf16-KV tensor-core decode attention in each variant of
 * attention_tc_bf16 (v0: 4 warps, 3 blocks per SM, Q / P in 3 bf16 parts; v1: 3 warps, 4 per SM;
 * v2: 2 parts; v3: both), the variants alternating per shape; splits as attention_splits picks
 * them for the variant. */
static void bench_attn_bf16(void)
{
    const int keep = attention_tc_bf16;
    printf("\nbf16-KV decode attention by variant (attention_tc_bf16), one layer, 32 / 8 heads, hd "
           "128, page 16\n");
    row_header();
    const int cfg[][2] = {{64, 1024}, {32, 1024}, {16, 1024}, {1, 1024},
                          {1, 32768}, {64, 8192}, {1, 8192}};
    static char tag[4][24];
    for (int c = 0; c < 7; c++)
        for (int v = 0; v < 4; v++) {
            attention_tc_bf16 = v;
            snprintf(tag[v], sizeof tag[v], " v%d s%d", v,
                     attention_splits(cfg[c][0], 8, cfg[c][1], PD_KV_BF16));
            attn_tag = tag[v];
            bench_attention_on(PD_KV_BF16, cfg[c][0], cfg[c][1], 1);
        }
    attn_tag = "";
    attention_tc_bf16 = keep;
    fflush(stdout);
}

typedef struct {
    float *out, *q, *scratch;
    void *arena;
    kv_layout_t *l;
    pd_attn_batch_t *b;
    int simt, splits, max_ctx;
} fa_arg_t;
static void run_fa(void *p)
{
    fa_arg_t *a = p;
    pd_status_t st = a->simt ? attention_run(a->out, a->scratch, a->q, a->arena, a->l, 0, a->b,
                                             a->b->n_rows, 32, a->max_ctx, a->splits, stream)
                             : attention_flash_run(a->out, a->q, a->arena, a->l, 0, a->b,
                                                   a->b->n_rows, 32, stream);
    ok(st, "attention launch");
}

/* Prefill attention, one layer, 32 / 8 heads, hd 128: B sequences of q_len new rows at the end
 * of ctx tokens each; flash and (reps_simt > 0) the SIMT kernel. FLOPs: the causal ones (4 D per
 * (row, key, head) pair seen). */
static void bench_flash(pd_kvfmt_t fmt, int B, int q_len, int ctx, int reps_simt)
{
    kv_layout_t l;
    char shape[64];
    kv_layout_init(&l, 1, 8, 128, 16, fmt);
    int ppseq = (ctx + 15) / 16, n_pages = B * ppseq, n_rows = B * q_len;
    void *arena;
    ok(be->ops->alloc(be, (size_t)n_pages * l.page_bytes, &arena), "arena");
    arena_fill(arena, &l, n_pages);
    int32_t *qs = malloc(((size_t)B + 1) * 4), *cl = malloc((size_t)B * 4),
            *bt = malloc((size_t)B * ppseq * 4);
    for (int s = 0; s <= B; s++)
        qs[s] = s * q_len;
    for (int s = 0; s < B; s++) {
        cl[s] = ctx;
        for (int i = 0; i < ppseq; i++)
            bt[s * ppseq + i] = s * ppseq + i;
    }
    pd_attn_batch_t b = {B,
                         ppseq,
                         dev_i32(qs, (size_t)B + 1),
                         dev_i32(cl, (size_t)B),
                         dev_i32(bt, (size_t)B * ppseq),
                         n_rows,
                         ctx};
    fa_arg_t a = {NULL, dev_random_f32((size_t)n_rows * 32 * 128, 1.0f), NULL, arena, &l, &b, 0, 1,
                  ctx};
    ok(be->ops->alloc(be, (size_t)n_rows * 32 * 128 * 4, (void **)&a.out), "alloc");
    double pairs = 0.0; /* (row, key) pairs */
    for (int r = 0; r < q_len; r++)
        pairs += ctx - q_len + r + 1;
    pairs *= B;
    const double flops = 4.0 * 32 * 128 * pairs;
    const double bytes = (double)n_rows * 32 * 128 * 8 + (double)B * ctx * 2 * l.side_bytes / 16;
    /* every flash variant (kernels/attention_flash.cu), then the one the environment names */
    const char *keep = getenv("PD_CUDA_FLASH_VARIANT");
    char keep_v[16] = "";
    if (keep)
        snprintf(keep_v, sizeof keep_v, "%s", keep);
    /* run variants 0..N-1 (default 13), or those of PD_GPU_FLASH_LIST ("5 10 12") */
    const char *nv_env = getenv("PD_GPU_FLASH_VARIANTS"), *list = getenv("PD_GPU_FLASH_LIST");
    const int nv = nv_env && atoi(nv_env) > 0 && atoi(nv_env) < 13 ? atoi(nv_env) : 13;
    for (int v = 0; v < nv; v++) {
        if (list && *list) {
            char pad[80], key[16];
            snprintf(pad, sizeof pad, " %.60s ", list);
            snprintf(key, sizeof key, " %d ", v);
            if (!strstr(pad, key))
                continue;
        }
        char vs[16];
        snprintf(vs, sizeof vs, "%d", v);
        setenv("PD_CUDA_FLASH_VARIANT", vs, 1);
        float ms = time_op(run_fa, &a, 10);
        snprintf(shape, sizeof shape, "flash v%d %s B %d q %d ctx %d", v, pd_kvfmt_name(fmt), B,
                 q_len, ctx);
        row("attention", shape, ms, bytes, flops, BF16_FLOPS);
    }
    if (keep)
        setenv("PD_CUDA_FLASH_VARIANT", keep_v, 1);
    else
        unsetenv("PD_CUDA_FLASH_VARIANT");
    float ms;
    if (reps_simt > 0) {
        a.simt = 1;
        a.splits = attention_splits(n_rows, 8, ctx, fmt);
        size_t nf = attention_scratch_floats(n_rows, 32, 128, a.splits);
        if (nf) {
            ok(be->ops->alloc(be, nf * 4, (void **)&a.scratch), "alloc");
            ok(be->ops->memset(be, a.scratch, 0, nf * 4), "memset"); /* its split counters */
        }
        ms = time_op(run_fa, &a, reps_simt);
        snprintf(shape, sizeof shape, "simt %s B %d q %d ctx %d", pd_kvfmt_name(fmt), B, q_len,
                 ctx);
        row("attention", shape, ms, bytes, flops, BF16_FLOPS);
        if (a.scratch)
            be->ops->free(be, a.scratch);
    }
    be->ops->free(be, arena);
    be->ops->free(be, a.q);
    be->ops->free(be, a.out);
    be->ops->free(be, (void *)b.q_start);
    be->ops->free(be, (void *)b.ctx_len);
    be->ops->free(be, (void *)b.block_tables);
    free(qs);
    free(cl);
    free(bt);
}

typedef struct {
    int op, n;
    float *x, *y, *gu, *xs;
    uint8_t *xq;
    uint16_t *w;
    int32_t *pos, *slots;
    float *inv;
    void *arena;
    kv_layout_t *l;
} ew_arg_t;
static void run_ew(void *p)
{
    ew_arg_t *a = p;
    switch (a->op) {
    case 0:
        be->ops->rmsnorm(be, a->y, a->x, a->w, a->n, 4096, 1e-5f);
        break;
    case 1:
        be->ops->add(be, a->x, a->y, (size_t)a->n * 4096);
        break;
    case 2:
        be->ops->rope(be, a->x, a->pos, a->inv, a->n, 32, 128);
        break;
    case 3:
        be->ops->silu_mul(be, a->y, a->gu, a->n, 14336);
        break;
    case 4:
        be->ops->kv_write(be, a->arena, a->l, 0, a->x, a->y, a->slots, a->n);
        break;
    case 5: { /* fused: residual add + rmsnorm + fp8 quantization (what the FP8 qkv GEMMs read) */
        pd_act_fp8_t q = {a->xq, a->xs, false, false, false};
        be->ops->add_rmsnorm(be, a->x, a->y, NULL, a->w, a->n, 4096, 1e-5f, &q);
        break;
    }
    case 6: /* the same, unfused: add, rmsnorm, and the quantization of each of q, k, v */
        be->ops->add(be, a->x, a->y, (size_t)a->n * 4096);
        be->ops->rmsnorm(be, a->y + (size_t)a->n * 4096, a->x, a->w, a->n, 4096, 1e-5f);
        for (int i = 0; i < 3; i++)
            ok(matmul_quant_act_fp8(a->xq, NULL, a->xs, a->y + (size_t)a->n * 4096, a->n, 4096,
                                    stream),
               "quant");
        break;
    case 7: { /* fused: silu_mul + fp8 quantization (what the FP8 down GEMM reads) */
        pd_act_fp8_t q = {a->xq, a->xs, false, false, false};
        be->ops->silu_mul_fp8(be, NULL, a->gu, a->n, 14336, &q);
        break;
    }
    default: /* the same, unfused */
        be->ops->silu_mul(be, a->y, a->gu, a->n, 14336);
        ok(matmul_quant_act_fp8(a->xq, NULL, a->xs, a->y, a->n, 14336, stream), "quant");
    }
}

static void bench_elementwise(int n)
{
    static const char *names[] = {"rmsnorm",         "add",          "rope q",
                                  "silu_mul",        "kv_write fp8", "add_rmsnorm fp8",
                                  "(unfused, x3 q)", "silu_mul_fp8", "(unfused)"};
    kv_layout_t l;
    kv_layout_init(&l, 1, 8, 128, 16, PD_KV_FP8);
    ew_arg_t a = {0};
    a.n = n;
    a.x = dev_random_f32((size_t)n * 4096, 1.0f);
    a.y = dev_random_f32((size_t)n * 14336, 1.0f);
    a.gu = dev_random_f32((size_t)n * 2 * 14336, 1.0f);
    a.xs = dev_random_f32((size_t)n, 1.0f);
    ok(be->ops->alloc(be, (size_t)n * 14336, (void **)&a.xq), "alloc");
    a.inv = dev_random_f32(64, 0.5f);
    uint16_t hw[4096];
    int32_t *hp = malloc((size_t)n * 4);
    for (int i = 0; i < 4096; i++)
        hw[i] = pd_f32_to_bf16(1.0f + rnd() * 0.1f);
    for (int i = 0; i < n; i++)
        hp[i] = i;
    ok(be->ops->alloc(be, sizeof hw, (void **)&a.w), "alloc");
    ok(be->ops->upload(be, a.w, hw, sizeof hw), "upload");
    a.pos = dev_i32(hp, (size_t)n);
    a.slots = a.pos;
    ok(be->ops->alloc(be, ((size_t)n / 16 + 1) * l.page_bytes, &a.arena), "alloc");
    a.l = &l;
    /* bytes: the fused ops' own traffic (the unfused rows are timed against the same bytes) */
    const double bytes[] = {(double)n * 4096 * 8,
                            (double)n * 4096 * 12,
                            (double)n * 4096 * 8,
                            (double)n * 14336 * 12,
                            (double)n * 1024 * (8 + 2) + n * 64.0,
                            (double)n * 4096 * 13,
                            (double)n * 4096 * 13,
                            (double)n * 14336 * 9,
                            (double)n * 14336 * 9};
    for (int op = 0; op < 9; op++) {
        if (op >= 5 && (!be->ops->add_rmsnorm || !be->ops->silu_mul_fp8))
            break;
        char shape[64];
        a.op = op;
        float ms = time_op(run_ew, &a, 20);
        snprintf(shape, sizeof shape, "n %d", n);
        row(names[op], shape, ms, bytes[op], 0.0, BF16_FLOPS);
    }
    be->ops->free(be, a.x);
    be->ops->free(be, a.y);
    be->ops->free(be, a.gu);
    be->ops->free(be, a.xs);
    be->ops->free(be, a.xq);
    be->ops->free(be, a.inv);
    be->ops->free(be, a.w);
    be->ops->free(be, a.pos);
    be->ops->free(be, a.arena);
    free(hp);
}

/* INT4 and FP8 kernel paths side by side (issue 11): the f32 GEMVs (matmul_gemv), the
 * tensor-core kernels with the separate activation quantization (matmul_quant_act_* +
 * matmul_int4_mma / matmul_fp8_mma with their plans), the INT4 weight-streaming GEMV with the
 * quantization inside (matmul_wgemv, n <= 8), and the backend op (default routing). A 256 MB
 * memset before every timed repeat evicts the weights from L2 (it leaves dirty lines that the
 * timed op may have to write back: every column pays that alike). */
typedef struct {
    int mode; /* 0 gemv, 1 quant + mma, 2 op, 3 wgemv, 4 w4gemv / w8gemv (FP8: xh holds the
               * fp8 activations and mult their scales, quantized before timing), 5 quant +
               * matmul_int4_mma2, 6 quant + matmul_w4wg (depth = cfg), 7 FP8 quant +
               * matmul_w8wg (warps = 128-row units per block), 8 FP8 quant +
               * matmul_fp8_ksplit (depth = its load batch), 9 INT4 quant +
               * matmul_int4_ksplit (depth = its load batch) */
    float *out, *x, *part, *xf, *mult;
    uint16_t *xh;
    pd_weight_t *w;
    int n, warps, splits, depth, blocks;
    bool cluster; /* mode 6: the K splits added inside clusters (matmul_w4wg's cluster) */
} i4_arg_t;
static void run_i4(void *p)
{
    i4_arg_t *a = p;
    const bool fp8 = a->w->fmt == PD_WFMT_FP8;
    if (a->mode == 0) {
        if (fp8)
            ok(matmul_quant_act_fp8(NULL, a->xf, a->mult, a->x, a->n, a->w->k, stream), "q");
        ok(matmul_gemv(a->out, fp8 ? a->xf : a->x, fp8 ? a->mult : NULL, a->w, a->n,
                       !fp8 && a->w->n % 32 == 0, stream),
           "gemv");
    } else if (a->mode == 1 && fp8) {
        ok(matmul_quant_act_fp8((uint8_t *)a->xh, NULL, a->mult, a->x, a->n, a->w->k, stream),
           "quant fp8");
        ok(matmul_fp8_mma(a->out, a->part, (uint8_t *)a->xh, a->mult, a->w, a->n, a->warps,
                          a->splits, stream),
           "fp8 mma");
    } else if (a->mode == 1) {
        ok(matmul_quant_act_f16(a->xh, a->mult, a->x, a->n, a->w->k, stream), "quant f16");
        ok(matmul_int4_mma(a->out, a->part, a->xh, a->mult, a->w, a->n, a->warps, a->splits,
                           a->w->n % 32 == 0, stream),
           "int4 mma");
    } else if (a->mode == 5) { /* matmul_int4_mma2, depth = token tiles per block */
        ok(matmul_quant_act_f16(a->xh, a->mult, a->x, a->n, a->w->k, stream), "quant f16");
        ok(matmul_int4_mma2(a->out, a->part, a->xh, a->mult, a->w, a->n, a->depth, a->warps,
                            a->splits, stream),
           "int4 mma2");
    } else if (a->mode == 6) {
        ok(matmul_quant_act_f16wg(a->xh, a->mult, a->x, a->n, a->w->k, stream), "quant f16wg");
        ok(matmul_w4wg(a->out, a->part, a->xh, a->mult, a->w, a->n, a->depth, a->splits, a->cluster,
                       stream),
           "w4wg");
    } else if (a->mode == 7) { /* FP8: quant + matmul_w8wg (warps = rows / 128) */
        ok(matmul_quant_act_fp8((uint8_t *)a->xh, NULL, a->mult, a->x, a->n, a->w->k, stream),
           "quant fp8");
        ok(matmul_w8wg(a->out, (const uint8_t *)a->xh, a->mult, a->w, a->n, a->warps, a->splits,
                       stream),
           "w8wg");
    } else if (a->mode == 8) { /* FP8: quant + matmul_fp8_ksplit (depth = batch) */
        ok(matmul_quant_act_fp8((uint8_t *)a->xh, NULL, a->mult, a->x, a->n, a->w->k, stream),
           "quant fp8");
        ok(matmul_fp8_ksplit(a->out, (const uint8_t *)a->xh, a->mult, a->w, a->n, a->depth,
                             stream),
           "fp8 ksplit");
    } else if (a->mode == 9) { /* INT4: quant + matmul_int4_ksplit (depth = batch) */
        ok(matmul_quant_act_f16(a->xh, a->mult, a->x, a->n, a->w->k, stream), "quant f16");
        ok(matmul_int4_ksplit(a->out, a->xh, a->mult, a->w, a->n, a->depth, stream),
           "int4 ksplit");
    } else if (a->mode == 4 && fp8) {
        ok(matmul_w8gemv(a->out, (const uint8_t *)a->xh, a->mult, a->w, a->n, a->warps, a->splits,
                         a->depth, a->blocks, stream),
           "w8gemv");
    } else if (a->mode == 4) {
        ok(matmul_w4gemv(a->out, a->x, a->w, a->n, a->warps, a->splits, a->depth, a->blocks,
                         stream),
           "w4gemv");
    } else if (a->mode == 3) {
        ok(matmul_wgemv(a->out, a->x, a->w, a->n, a->warps, a->splits, a->depth, stream), "wgemv");
    } else
        be->ops->matmul(be, a->out, a->x, a->w, a->n);
}

/* gate_up, down, qkv, o of Llama-3-8B (`gpu_bench xgemv` with GPU_BENCH_XGEMV_BIG=1 replaces
 * the first with 4x gate_up's rows, 235 MB of INT4: the streaming rate with the per-launch
 * ramp and tail amortized) */
static int64_t i4_shapes[4][2] = {{28672, 4096}, {4096, 14336}, {6144, 4096}, {4096, 4096}};

/* host weights of shape s in INT4 and FP8 (same bf16 source), uploaded (INT4 tiled) */
static void i4_weights(int s, pd_weight_t *h4, pd_weight_t *h8, pd_weight_t *w4, pd_weight_t *w8,
                       double wb[2])
{
    const int64_t N = i4_shapes[s][0], K = i4_shapes[s][1];
    uint16_t *src = malloc((size_t)(N * K) * 2);
    for (int64_t i = 0; i < N * K; i++)
        src[i] = pd_f32_to_bf16(rnd() * 0.02f);
    ok(model_quantize_bf16(src, N, K, PD_WFMT_INT4, h4), "quantize");
    ok(model_quantize_bf16(src, N, K, PD_WFMT_FP8, h8), "quantize");
    free(src);
    ok(backend_weight_upload(be, h4, w4), "weight upload");
    ok(backend_weight_upload(be, h8, w8), "weight upload");
    for (int f = 0; f < 2; f++) {
        const pd_wfmt_t fmt = f ? PD_WFMT_FP8 : PD_WFMT_INT4;
        wb[f] = (double)(quant_data_bytes(fmt, N, K) + quant_scales_bytes(fmt, N, K) +
                         quant_zeros_bytes(fmt, N, K));
    }
}

/* frees what i4_weights made */
static void i4_weights_free(pd_weight_t *h4, pd_weight_t *h8, pd_weight_t *w4, pd_weight_t *w8)
{
    model_host_weight_free(h4);
    model_host_weight_free(h8);
    backend_weight_free(be, w4);
    backend_weight_free(be, w8);
}

static void i4_alloc(i4_arg_t *a, int n, int64_t N, int64_t K)
{
    a->n = n;
    a->x = dev_random_f32((size_t)n * K, 1.0f);
    ok(be->ops->alloc(be, (size_t)n * N * 4, (void **)&a->out), "alloc");
    ok(be->ops->alloc(be, (size_t)n * K * 4 + 64, (void **)&a->xf), "alloc");
    const size_t xhb = (size_t)n * K * 2 > matmul_w4wg_act_bytes(n, K)
                           ? (size_t)n * K * 2
                           : matmul_w4wg_act_bytes(n, K);
    ok(be->ops->alloc(be, xhb + 64, (void **)&a->xh), "alloc");
    ok(be->ops->alloc(be, (size_t)n * 4 + 64, (void **)&a->mult), "alloc");
    ok(be->ops->alloc(be, (size_t)16 * n * N * 4 + 64, (void **)&a->part), "alloc");
}

static void i4_free(i4_arg_t *a)
{
    be->ops->free(be, a->x);
    be->ops->free(be, a->out);
    be->ops->free(be, a->xf);
    be->ops->free(be, a->xh);
    be->ops->free(be, a->mult);
    be->ops->free(be, a->part);
}

static void bench_int4_paths(void)
{
    const int ns[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    l2_flush_bytes = (size_t)256 << 20;
    ok(be->ops->alloc(be, l2_flush_bytes, &l2_flush), "alloc");
    printf("\n### INT4 / FP8 paths (us, L2 flushed before each repeat; GB/s = weight bytes incl. "
           "scales and zeros / op time)\n\n");
    printf("| N x K | n | int4 gemv | int4 q+mma (W, S) | int4 wgemv (W, S, D) | int4 op | int4 op "
           "GB/s | fp8 gemv | fp8 q+mma (W, S) | fp8 op | fp8 op GB/s | int4 op / fp8 op |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    /* GPU_BENCH_INT4_SHAPES=k: the first k shapes only (for ncu) */
    const char *lim = getenv("GPU_BENCH_INT4_SHAPES");
    const int nshape = lim && atoi(lim) > 0 && atoi(lim) < 4 ? atoi(lim) : 4;
    for (int s = 0; s < nshape; s++) {
        const int64_t N = i4_shapes[s][0], K = i4_shapes[s][1];
        pd_weight_t h4, h8, w4, w8;
        double wb[2];
        i4_weights(s, &h4, &h8, &w4, &w8, wb);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            const int n = ns[i];
            if (s == 3 && n > 8)
                break;
            float t[2][4]; /* [int4, fp8][gemv, q + mma, op, wgemv] */
            int pw[2], ps[2], gw[2] = {0, 0}, gs[2] = {0, 0}, gd[2] = {0, 0};
            i4_arg_t a = {0};
            i4_alloc(&a, n, N, K);
            for (int f = 0; f < 2; f++) {
                a.w = f ? &w8 : &w4;
                t[f][0] = t[f][3] = -1.0f;
                if (n <= MATMUL_GEMV_MAX_N) {
                    a.mode = 0;
                    t[f][0] = time_op(run_i4, &a, 20);
                }
                if (n <= MATMUL_WGEMV_MAX_N && !f) {
                    matmul_wgemv_plan(n, N, K, n_sm, &a.warps, &a.splits, &a.depth);
                    gw[f] = a.warps, gs[f] = a.splits, gd[f] = a.depth;
                    a.mode = 3;
                    t[f][3] = time_op(run_i4, &a, 20);
                }
                if (f)
                    matmul_fp8_mma_plan(n, N, K, n_sm, &a.warps, &a.splits);
                else
                    matmul_int4_mma_plan(n, N, K, n_sm, &a.warps, &a.splits);
                pw[f] = a.warps;
                ps[f] = a.splits;
                a.mode = 1;
                t[f][1] = time_op(run_i4, &a, 20);
                a.mode = 2;
                t[f][2] = time_op(run_i4, &a, 20);
            }
            char g[2][32], v[2][48];
            for (int f = 0; f < 2; f++) {
                if (t[f][0] > 0.0f)
                    snprintf(g[f], sizeof g[f], "%.1f", t[f][0] * 1e3);
                else
                    snprintf(g[f], sizeof g[f], "-");
                if (t[f][3] > 0.0f)
                    snprintf(v[f], sizeof v[f], "%.1f (%d, %d, %d)", t[f][3] * 1e3, gw[f], gs[f],
                             gd[f]);
                else
                    snprintf(v[f], sizeof v[f], "-");
            }
            printf(
                "| %lld x %lld | %d | %s | %.1f (%d, %d) | %s | %.1f | %.0f | %s | %.1f (%d, %d) "
                "| %.1f | %.0f | %.2f |\n",
                (long long)N, (long long)K, n, g[0], t[0][1] * 1e3, pw[0], ps[0], v[0],
                t[0][2] * 1e3, wb[0] / (t[0][2] * 1e-3) / 1e9, g[1], t[1][1] * 1e3, pw[1], ps[1],
                t[1][2] * 1e3, wb[1] / (t[1][2] * 1e-3) / 1e9, t[0][2] / t[1][2]);
            fflush(stdout);
            i4_free(&a);
        }
        i4_weights_free(&h4, &h8, &w4, &w8);
    }
    be->ops->free(be, l2_flush);
    l2_flush = NULL;
}

/* matmul_int4_mma2 (two blocks per SM, session 6) against matmul_int4_mma and the FP8 paths at
 * n 16..256 on the four 8B shapes (us, L2 flushed as in bench_int4_paths): int4 mma / mma2 with
 * their plans (activation quantization included), the best forced mma2 plan (tiles, warps,
 * splits), fp8 q+mma with its plan, the fp8 op (default routing), and the weight floor (INT4
 * bytes at 4.8 TB/s). `gpu_bench w4mma` (not part of all). */
static void bench_int4_mma2(void)
{
    const int ns[] = {16, 32, 64, 128, 256};
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    l2_flush_bytes = (size_t)256 << 20;
    ok(be->ops->alloc(be, l2_flush_bytes, &l2_flush), "alloc");
    printf("\n### INT4 mma2 vs mma vs FP8 (us, L2 flushed before each repeat)\n\n");
    printf("| N x K | n | int4 mma (W, S) | int4 mma2 (C, W, S) | best mma2 (C, W, S) | fp8 q+mma "
           "(W, S) | fp8 op | mma2 / fp8 op | mma2 / fp8 q+mma | floor us | floor / mma2 |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    /* GPU_BENCH_INT4_SHAPES=k: the first k shapes; GPU_BENCH_W4MMA_N=n: that n alone (ncu) */
    const char *lim = getenv("GPU_BENCH_INT4_SHAPES"), *only = getenv("GPU_BENCH_W4MMA_N");
    const int nshape = lim && atoi(lim) > 0 && atoi(lim) < 4 ? atoi(lim) : 4;
    for (int s = 0; s < nshape; s++) {
        const int64_t N = i4_shapes[s][0], K = i4_shapes[s][1];
        pd_weight_t h4, h8, w4, w8;
        double wb[2];
        i4_weights(s, &h4, &h8, &w4, &w8, wb);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            const int n = ns[i];
            if (only && atoi(only) != n)
                continue;
            i4_arg_t a = {0};
            i4_alloc(&a, n, N, K);
            int pw, ps, fw, fs, c2, w2, s2, bc = 0, bw = 0, bs = 0;
            if (getenv("GPU_BENCH_W4MMA_ONCE")) { /* one launch of each kernel (for ncu) */
                a.w = &w4;
                a.mode = 1;
                matmul_int4_mma_plan(n, N, K, n_sm, &a.warps, &a.splits);
                run_i4(&a);
                a.mode = 5;
                matmul_int4_mma2_plan(n, N, K, n_sm, &a.depth, &a.warps, &a.splits);
                run_i4(&a);
                a.w = &w8;
                a.mode = 1;
                matmul_fp8_mma_plan(n, N, K, n_sm, &a.warps, &a.splits);
                run_i4(&a);
                ok(be->ops->sync(be), "sync");
                i4_free(&a);
                continue;
            }
            a.w = &w4;
            a.mode = 1;
            matmul_int4_mma_plan(n, N, K, n_sm, &pw, &ps);
            a.warps = pw, a.splits = ps;
            const float t_old = time_op(run_i4, &a, 20);
            matmul_int4_mma2_plan(n, N, K, n_sm, &c2, &w2, &s2);
            a.mode = 5, a.depth = c2, a.warps = w2, a.splits = s2;
            const float t_new = time_op(run_i4, &a, 20);
            float best = 1e30f;
            for (int c = n >= 64 ? 2 : 1; c <= 8 && 8 * c <= n; c *= 2)
                for (int wv = 4; wv <= 8; wv += 4)
                    for (int sp = 1; sp <= 4; sp *= 2) {
                        if ((sp - 1) * ((K / 128 + sp - 1) / sp) >= K / 128)
                            continue;
                        a.depth = c, a.warps = wv, a.splits = sp;
                        const float t = time_op(run_i4, &a, 10);
                        if (t < best)
                            best = t, bc = c, bw = wv, bs = sp;
                    }
            a.w = &w8;
            a.mode = 1;
            matmul_fp8_mma_plan(n, N, K, n_sm, &fw, &fs);
            a.warps = fw, a.splits = fs;
            const float t_f8 = time_op(run_i4, &a, 20);
            a.mode = 2;
            const float t_f8op = time_op(run_i4, &a, 20);
            const double floor_us = wb[0] / 4.8e12 * 1e6;
            printf("| %lld x %lld | %d | %.1f (%d, %d) | %.1f (%d, %d, %d) | %.1f (%d, %d, %d) | "
                   "%.1f (%d, %d) | %.1f | %.2f | %.2f | %.1f | %.0f%% |\n",
                   (long long)N, (long long)K, n, t_old * 1e3, pw, ps, t_new * 1e3, c2, w2, s2,
                   best * 1e3, bc, bw, bs, t_f8 * 1e3, fw, fs, t_f8op * 1e3, t_new / t_f8op,
                   t_new / t_f8, floor_us, 100.0 * floor_us / (t_new * 1e3));
            fflush(stdout);
            i4_free(&a);
        }
        i4_weights_free(&h4, &h8, &w4, &w8);
    }
    be->ops->free(be, l2_flush);
    l2_flush = NULL;
}

/* The fastest forced matmul_w4wg plan for a (mode 6, its weight and n set; a->cluster: the K
 * splits added inside clusters, 1..MATMUL_W4WG_MAX_CLUSTER of them, else 1, 2, 4, 8, 16 by a
 * second launch): its time (s, as time_op), configuration *cfg_p and splits *splits_p. A
 * configuration whose token tiles would take more than two passes over the weights is skipped. */
static float w4wg_sweep(i4_arg_t *a, int64_t K, bool cluster, int *cfg_p, int *splits_p)
{
    float best = 1e30f;
    *cfg_p = *splits_p = 0;
    for (int c = 0; c < 3; c++) {
        if ((c == 0 ? 64 : c == 1 ? 128 : 256) < a->n / 2 && c < 2)
            continue;
        for (int sp = 1; sp <= (cluster ? MATMUL_W4WG_MAX_CLUSTER : 16);
             sp = cluster ? sp + 1 : 2 * sp) {
            if (sp > K / 128 || (sp - 1) * ((K / 128 + sp - 1) / sp) >= K / 128)
                continue;
            a->cluster = cluster, a->depth = c, a->splits = sp;
            const float t = time_op(run_i4, a, 10);
            if (t < best)
                best = t, *cfg_p = c, *splits_p = sp;
        }
    }
    return best;
}

/* matmul_w4wg (wgmma, session 10) against matmul_int4_mma and the FP8 op at n 16..256 on the
 * four 8B shapes (us, L2 flushed as in bench_int4_paths, activation quantization included): int4
 * mma with its plan, w4wg with its plan (cfg, S), the best forced w4wg plan, the same two with
 * the K splits added inside clusters (session 22; forced S 1..8), the fp8 op (default routing),
 * the backend's INT4 op, and the weight floor (INT4 bytes at 4.8 TB/s) against the faster plan.
 * `gpu_bench w4wg` (not part of all); GPU_BENCH_W4MMA_N=n: that n alone; GPU_BENCH_W4MMA_ONCE=1:
 * one launch of w4wg's plan, of its cluster plan and of int4 mma's (for ncu). */
static void bench_w4wg(void)
{
    const int ns[] = {16, 32, 48, 64, 96, 128, 192, 256};
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    if (!matmul_w4wg_usable()) {
        fprintf(stderr, "w4wg: not usable here (needs an sm_90a build on a compute capability 9.0 "
                        "GPU)\n");
        exit(1);
    }
    l2_flush_bytes = (size_t)256 << 20;
    ok(be->ops->alloc(be, l2_flush_bytes, &l2_flush), "alloc");
    printf("\n### INT4 wgmma GEMM (w4wg) vs mma vs FP8 (us, L2 flushed before each repeat)\n\n");
    printf(
        "| N x K | n | int4 mma (W, S) | w4wg (cfg, S) | best w4wg (cfg, S) | cluster (cfg, S) | "
        "best cluster (cfg, S) | fp8 op | int4 op | cluster / w4wg | w4wg / fp8 op | floor us "
        "| floor / faster plan |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const char *only = getenv("GPU_BENCH_W4MMA_N");
    for (int s = 0; s < 4; s++) {
        const int64_t N = i4_shapes[s][0], K = i4_shapes[s][1];
        pd_weight_t h4, h8, w4, w8;
        double wb[2];
        i4_weights(s, &h4, &h8, &w4, &w8, wb);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            const int n = ns[i];
            if (only && atoi(only) != n)
                continue;
            i4_arg_t a = {0};
            i4_alloc(&a, n, N, K);
            a.w = &w4;
            int pw, ps, cfg, ws, ccfg, cs;
            matmul_int4_mma_plan(n, N, K, n_sm, &pw, &ps);
            matmul_w4wg_plan(n, N, K, n_sm, false, &cfg, &ws);
            matmul_w4wg_plan(n, N, K, n_sm, true, &ccfg, &cs);
            if (getenv("GPU_BENCH_W4MMA_ONCE")) {
                a.mode = 6, a.depth = cfg, a.splits = ws;
                run_i4(&a);
                a.cluster = true, a.depth = ccfg, a.splits = cs;
                run_i4(&a);
                a.cluster = false;
                a.mode = 1, a.warps = pw, a.splits = ps;
                run_i4(&a);
                ok(be->ops->sync(be), "sync");
                i4_free(&a);
                continue;
            }
            a.mode = 1, a.warps = pw, a.splits = ps;
            const float t_old = time_op(run_i4, &a, 20);
            a.mode = 6, a.depth = cfg, a.splits = ws;
            const float t_wg = time_op(run_i4, &a, 20);
            int bc, bs, cbc, cbs;
            const float best = w4wg_sweep(&a, K, false, &bc, &bs);
            a.cluster = true, a.depth = ccfg, a.splits = cs;
            const float t_cl = time_op(run_i4, &a, 20);
            const float cbest = w4wg_sweep(&a, K, true, &cbc, &cbs);
            a.cluster = false;
            a.mode = 2;
            const float t_op = time_op(run_i4, &a, 20);
            a.w = &w8;
            const float t_f8op = time_op(run_i4, &a, 20);
            const double floor_us = wb[0] / 4.8e12 * 1e6;
            const float t_fast = t_cl < t_wg ? t_cl : t_wg;
            printf("| %lld x %lld | %d | %.1f (%d, %d) | %.1f (%d, %d) | %.1f (%d, %d) | %.1f (%d, "
                   "%d) | %.1f (%d, %d) | %.1f | %.1f | %.2f | %.2f | %.1f | %.0f%% |\n",
                   (long long)N, (long long)K, n, t_old * 1e3, pw, ps, t_wg * 1e3, cfg, ws,
                   best * 1e3, bc, bs, t_cl * 1e3, ccfg, cs, cbest * 1e3, cbc, cbs, t_f8op * 1e3,
                   t_op * 1e3, t_cl / t_wg, t_wg / t_f8op, floor_us,
                   100.0 * floor_us / (t_fast * 1e3));
            fflush(stdout);
            i4_free(&a);
        }
        i4_weights_free(&h4, &h8, &w4, &w8);
    }
    be->ops->free(be, l2_flush);
    l2_flush = NULL;
}

/* matmul_w8wg (FP8 wgmma + TMA, session 21) against the FP8 op with option w8wg off (the routing
 * before it: GEMV / mma kernel at n <= 8, cuBLASLt above) and the INT4 op at n 1..64 on the four
 * 8B shapes (us, L2 flushed as in bench_int4_paths, activation quantization included): w8wg with
 * its plan (rows / 128, S), the best forced plan, w8wg's rate (FP8 weight + scale bytes / time),
 * and the INT4 op.
 * `gpu_bench w8wg` (not part of all); GPU_BENCH_W8WG_N=n: that n alone; GPU_BENCH_W8WG_ONCE=1:
 * one launch of w8wg's plan and one of the FP8 op per shape (for ncu). */
static void bench_w8wg(void)
{
    const int ns[] = {1, 4, 8, 16, 32, 64};
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    if (!matmul_w8wg_usable()) {
        fprintf(stderr, "w8wg: not usable here (needs an sm_90a build on a compute capability 9.0 "
                        "GPU)\n");
        exit(1);
    }
    /* the FP8 op column without w8wg (the default since session 24 routes o and down there) */
    ok(backend_set_options(be, "w8wg=off"), "w8wg=off");
    l2_flush_bytes = (size_t)256 << 20;
    ok(be->ops->alloc(be, l2_flush_bytes, &l2_flush), "alloc");
    printf("\n### FP8 wgmma GEMM (w8wg) vs the FP8 op (us, L2 flushed before each repeat)\n\n");
    printf("| N x K | n | fp8 op | w8wg (rows/128, S) | best w8wg (rows/128, S) | w8wg TB/s | "
           "w8wg / fp8 op | int4 op | int4 op / w8wg |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    const char *only = getenv("GPU_BENCH_W8WG_N");
    for (int s = 0; s < 4; s++) {
        const int64_t N = i4_shapes[s][0], K = i4_shapes[s][1];
        pd_weight_t h4, h8, w4, w8;
        double wb[2];
        i4_weights(s, &h4, &h8, &w4, &w8, wb);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            const int n = ns[i];
            if (only && atoi(only) != n)
                continue;
            i4_arg_t a = {0};
            i4_alloc(&a, n, N, K);
            a.w = &w8;
            int mt, ws;
            matmul_w8wg_plan(n, N, K, n_sm, &mt, &ws);
            if (getenv("GPU_BENCH_W8WG_ONCE")) {
                a.mode = 7, a.warps = mt, a.splits = ws;
                run_i4(&a);
                a.mode = 2;
                run_i4(&a);
                ok(be->ops->sync(be), "sync");
                i4_free(&a);
                continue;
            }
            a.mode = 2;
            const float t_op = time_op(run_i4, &a, 20);
            a.mode = 7, a.warps = mt, a.splits = ws;
            const float t_wg = time_op(run_i4, &a, 20);
            float best = 1e30f;
            int bm = 0, bs = 0;
            for (int m = 1; m <= 2; m++)
                for (int sp = 1; sp <= 8; sp++) { /* matmul_w8wg takes up to 8 (session 22) */
                    if ((sp - 1) * ((K / 128 + sp - 1) / sp) >= K / 128)
                        continue;
                    a.warps = m, a.splits = sp;
                    const float t = time_op(run_i4, &a, 10);
                    if (t < best)
                        best = t, bm = m, bs = sp;
                }
            a.mode = 2;
            a.w = &w4;
            const float t_i4 = time_op(run_i4, &a, 20);
            printf("| %lld x %lld | %d | %.1f | %.1f (%d, %d) | %.1f (%d, %d) | %.2f | %.2f | %.1f | "
                   "%.2f |\n",
                   (long long)N, (long long)K, n, t_op * 1e3, t_wg * 1e3, mt, ws, best * 1e3, bm,
                   bs, wb[1] / (t_wg * 1e-3) / 1e12, t_wg / t_op, t_i4 * 1e3, t_i4 / t_wg);
            fflush(stdout);
            i4_free(&a);
        }
        i4_weights_free(&h4, &h8, &w4, &w8);
    }
    be->ops->free(be, l2_flush);
    l2_flush = NULL;
    /* the default again, for the benchmarks after it */
    ok(backend_set_options(be, "w8wg=" BACKEND_CUDA_W8WG_DEFAULT), "w8wg default");
}

/* `gpu_bench ksplit` (session 26): the FP8 K-split mma GEMV (matmul_fp8_ksplit, both load
 * batches) against the FP8 op at decode sizes n 1..8 (run with PD_CUDA_FP8_KSPLIT=0 for the
 * routes before it: the FP8 mma kernel with its K splits and partial-sum launch, the f32 GEMV for
 * gate_up at n 1), and the INT4 K-split GEMV (matmul_int4_ksplit, batches 2 / 4, and 2 in 16-warp
 * blocks (matmul_int4_ksplit_wide forced) or with the rolled reloads (matmul_int4_ksplit_roll))
 * against the INT4 op (its default route: the slice GEMV
 * at n <= 2, the K-split at n 3..8 since session 28), each with its per-token quantization, L2 flushed before every repeat (so the weights come from DRAM and the
 * PDL overlap of a step is absent). TB/s: the weight bytes over the ksplit time. */
static void bench_ksplit(void)
{
    const int ns[] = {1, 2, 4, 8};
    const int64_t extra[2] = {1024, 4096}; /* k / v */
    l2_flush_bytes = (size_t)256 << 20;
    ok(be->ops->alloc(be, l2_flush_bytes, &l2_flush), "alloc");
    printf("\n### FP8 K-split mma GEMV (matmul_fp8_ksplit) vs the FP8 op (us, L2 flushed before "
           "each repeat)\n\n");
    printf("| N x K | n | fp8 op | ksplit u4 | ksplit u8 | u4 TB/s | u4 / op | int4 op | int4 "
           "ksplit u2 | u4 | u2 wide | u2 roll | u2 TB/s | u2 / op |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const int64_t keep[2] = {i4_shapes[3][0], i4_shapes[3][1]};
    for (int s = 0; s < 5; s++) {
        if (s == 4) { /* k / v: 1024 x 4096 in the o slot */
            i4_shapes[3][0] = extra[0];
            i4_shapes[3][1] = extra[1];
        }
        const int si = s == 4 ? 3 : s;
        const int64_t N = i4_shapes[si][0], K = i4_shapes[si][1];
        pd_weight_t h4, h8, w4, w8;
        double wb[2];
        i4_weights(si, &h4, &h8, &w4, &w8, wb);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            const int n = ns[i];
            i4_arg_t a = {0};
            i4_alloc(&a, n, N, K);
            a.w = &w8;
            a.mode = 2;
            const float t_op = time_op(run_i4, &a, 20);
            a.mode = 8, a.depth = 4;
            const float t4 = time_op(run_i4, &a, 20);
            a.depth = 8;
            const float t8 = time_op(run_i4, &a, 20);
            a.w = &w4; /* INT4 (tiled): the op's default route, then the K-split GEMV */
            a.mode = 2;
            const float i_op = time_op(run_i4, &a, 20);
            a.mode = 9, a.depth = 2;
            const float i2 = time_op(run_i4, &a, 20);
            a.depth = 4;
            const float i4 = time_op(run_i4, &a, 20);
            /* u2 in 16-warp blocks (forced), then with the rolled reloads */
            const int ww = matmul_int4_ksplit_wide, wr = matmul_int4_ksplit_roll;
            matmul_int4_ksplit_wide = 1 << 30;
            a.depth = 2;
            const float iw = time_op(run_i4, &a, 20);
            matmul_int4_ksplit_wide = 0;
            matmul_int4_ksplit_roll = 1;
            const float ir = time_op(run_i4, &a, 20);
            matmul_int4_ksplit_wide = ww;
            matmul_int4_ksplit_roll = wr;
            printf("| %lld x %lld | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f | %.1f | %.1f | "
                   "%.1f | %.1f | %.2f | %.2f |\n",
                   (long long)N, (long long)K, n, t_op * 1e3, t4 * 1e3, t8 * 1e3,
                   wb[1] / (t4 * 1e-3) / 1e12, t4 / t_op, i_op * 1e3, i2 * 1e3, i4 * 1e3,
                   iw * 1e3, ir * 1e3, wb[0] / (i2 * 1e-3) / 1e12, i2 / i_op);
            fflush(stdout);
            i4_free(&a);
        }
        i4_weights_free(&h4, &h8, &w4, &w8);
    }
    i4_shapes[3][0] = keep[0];
    i4_shapes[3][1] = keep[1];
    be->ops->free(be, l2_flush);
    l2_flush = NULL;
}

/* `gpu_bench qkvgroup` (session 11): the Llama-3-8B attention block's q, k, v INT4 projections
 * (4096, 1024, 1024 rows x 4096) as three matmul calls against one matmul_group call (the
 * grouped slice GEMV / wgmma GEMM), per token count, L2 flushed before each repeat; floor = the
 * three weights' INT4 bytes (data, scales, zeros) at 4.8 TB/s. */
typedef struct {
    float *outs[3];
    const float *x;
    const pd_weight_t *ws[3];
    int n;
    bool group;
} qkvg_arg_t;

static void run_qkvg(void *p)
{
    qkvg_arg_t *a = p;
    if (a->group)
        be->ops->matmul_group(be, a->outs, a->x, a->ws, 3, a->n);
    else
        for (int i = 0; i < 3; i++)
            be->ops->matmul(be, a->outs[i], a->x, a->ws[i], a->n);
}

static void bench_qkvgroup(void)
{
    const int ns[] = {1, 2, 4, 8, 16, 32, 48, 64, 128};
    const int64_t Ns[3] = {4096, 1024, 1024}, K = 4096;
    pd_weight_t h[3], w[3];
    double bytes = 0.0;
    if (!be->ops->matmul_group) {
        fprintf(stderr, "qkvgroup: the backend has no matmul_group op (option fused=off?)\n");
        exit(1);
    }
    for (int i = 0; i < 3; i++) {
        uint16_t *src = malloc((size_t)(Ns[i] * K) * 2);
        for (int64_t j = 0; j < Ns[i] * K; j++)
            src[j] = pd_f32_to_bf16(rnd() * 0.02f);
        ok(model_quantize_bf16(src, Ns[i], K, PD_WFMT_INT4, &h[i]), "quantize");
        free(src);
        ok(backend_weight_upload(be, &h[i], &w[i]), "weight upload");
        bytes += (double)(quant_data_bytes(PD_WFMT_INT4, Ns[i], K) +
                          quant_scales_bytes(PD_WFMT_INT4, Ns[i], K) +
                          quant_zeros_bytes(PD_WFMT_INT4, Ns[i], K));
    }
    l2_flush_bytes = (size_t)256 << 20;
    ok(be->ops->alloc(be, l2_flush_bytes, &l2_flush), "alloc");
    printf("\n### Llama-3-8B q, k, v (INT4, 4096 + 1024 + 1024 rows x 4096): three matmul calls vs "
           "one matmul_group (us, L2 flushed before each repeat)\n\n");
    printf("| n | three matmul | matmul_group | group / three | floor us | floor / group |\n");
    printf("|---|---|---|---|---|---|\n");
    const double floor_us = bytes / 4.8e12 * 1e6;
    for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
        qkvg_arg_t a = {.n = ns[j]};
        a.x = dev_random_f32((size_t)a.n * K, 1.0f);
        for (int i = 0; i < 3; i++) {
            ok(be->ops->alloc(be, (size_t)a.n * Ns[i] * 4, (void **)&a.outs[i]), "alloc");
            a.ws[i] = &w[i];
        }
        a.group = false;
        const float t3 = time_op(run_qkvg, &a, 30);
        a.group = true;
        const float tg = time_op(run_qkvg, &a, 30);
        printf("| %d | %.1f | %.1f | %.2f | %.1f | %.0f%% |\n", a.n, t3 * 1e3, tg * 1e3, tg / t3,
               floor_us, 100.0 * floor_us / (tg * 1e3));
        fflush(stdout);
        for (int i = 0; i < 3; i++)
            be->ops->free(be, a.outs[i]);
        be->ops->free(be, (void *)a.x);
    }
    for (int i = 0; i < 3; i++) {
        model_host_weight_free(&h[i]);
        backend_weight_free(be, &w[i]);
    }
    be->ops->free(be, l2_flush);
    l2_flush = NULL;
}

/* INT4 matmul_wgemv over forced plans (warps, splits, depth) at n 1, 4, 8 on the four shapes: the
 * data for matmul_wgemv_plan (us, L2 flushed as in bench_int4_paths; GB/s of the best). */
static void bench_wgemv_sweep(void)
{
    const int ns[] = {1, 4, 8}, Ws[] = {4, 6, 7, 8}, Ss[] = {1, 2, 3, 4, 6, 8}, Ds[] = {4, 8, 16};
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    l2_flush_bytes = (size_t)256 << 20;
    ok(be->ops->alloc(be, l2_flush_bytes, &l2_flush), "alloc");
    printf(
        "\n### matmul_wgemv plans (us; W/S/D = warps, splits, depth; * = the planner's pick)\n\n");
    for (int s = 0; s < 4; s++) {
        const int64_t N = i4_shapes[s][0], K = i4_shapes[s][1];
        pd_weight_t h4, h8, w4, w8;
        double wb[2];
        i4_weights(s, &h4, &h8, &w4, &w8, wb);
        for (int f = 0; f < 1; f++) /* INT4 only (f 1 would be FP8) */
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
                i4_arg_t a = {0};
                const int n = ns[i];
                int pw, ps, pdp;
                i4_alloc(&a, n, N, K);
                a.w = f ? &w8 : &w4;
                a.mode = 3;
                matmul_wgemv_plan(n, N, K, n_sm, &pw, &ps, &pdp);
                printf("%s %lld x %lld n %d:", f ? "fp8" : "int4", (long long)N, (long long)K, n);
                float best = 1e30f;
                for (int wi = 0; wi < 4; wi++)
                    for (int si = 0; si < 6; si++)
                        for (int di = 0; di < 3; di++) {
                            const int nu = (int)(K / (f ? 64 : 128)), S = Ss[si];
                            const int ups = (nu + S - 1) / S;
                            if ((S - 1) * ups >= nu)
                                continue;
                            a.warps = Ws[wi], a.splits = S, a.depth = Ds[di];
                            /* skip plans over the shared memory limit (the launcher refuses) */
                            const size_t xb =
                                (size_t)n * (f ? ((size_t)ups * 64 + 127) / 128 * 128 + 64
                                               : (size_t)ups * 256 + 64);
                            if (xb + 192 + (size_t)Ws[wi] * Ds[di] * (f ? 2048 : 2176) > 231424)
                                continue;
                            const float ms = time_op(run_i4, &a, 10);
                            best = ms < best ? ms : best;
                            printf(" %d/%d/%d=%.1f%s", a.warps, S, a.depth, ms * 1e3,
                                   a.warps == pw && S == ps && a.depth == pdp ? "*" : "");
                        }
                a.warps = pw, a.splits = ps, a.depth = pdp;
                const float mp = time_op(run_i4, &a, 20);
                printf(" | plan %d/%d/%d %.1f us %.0f GB/s | best %.1f us %.0f GB/s\n", pw, ps, pdp,
                       mp * 1e3, wb[f] / (mp * 1e-3) / 1e9, best * 1e3,
                       wb[f] / (best * 1e-3) / 1e9);
                fflush(stdout);
                i4_free(&a);
            }
        i4_weights_free(&h4, &h8, &w4, &w8);
    }
    be->ops->free(be, l2_flush);
    l2_flush = NULL;
}

/* matmul_w4gemv (INT4) and matmul_w8gemv (FP8, kernel alone: the activations quantized before
 * timing) at n 1, 2, 4, 8 on the four Llama-3-8B shapes: plans (rows R, slices S, depth D,
 * blocks B: 0 one per tile, else B blocks per SM), then a table of the plan's pick, the best
 * plan and the backend op (default routing; FP8 with its activation quantization launch) against
 * the same op on the session-4 routing (PD_CUDA_XGEMV=0), TB/s = weight + scale (+ zero) bytes /
 * time, % of 4.8 TB/s. Before each repeat a GEMV over a 128 MB BF16 weight leaves L2 holding
 * clean lines of another buffer (a decode step's situation: the previous layers' weights); the
 * op columns are also given after the 256 MB memset of bench_int4_paths (L2 full of dirty
 * lines, which the timed op has to write back as it reads: the earlier tables' flush). */
static void bench_xgemv(void)
{
    const int ns[] = {1, 2, 4, 8}, Ss[] = {1, 2, 4, 8, 16}, Bs[] = {0, 1, 2, 3, 4};
    const int Rs[6] = {16, 16, 32, 16, 16, 32}, Ds[6] = {2, 4, 2, 4, 8, 2};
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    l2_flush_bytes = (size_t)256 << 20;
    ok(be->ops->alloc(be, l2_flush_bytes, &l2_flush), "alloc");
    pd_weight_t rh, rw;
    {
        const int64_t RN = 8192, RK = 8192;
        uint16_t *src = malloc((size_t)(RN * RK) * 2);
        for (int64_t i = 0; i < RN * RK; i++)
            src[i] = pd_f32_to_bf16(rnd() * 0.02f);
        ok(model_quantize_bf16(src, RN, RK, PD_WFMT_BF16, &rh), "flush weight");
        free(src);
        ok(backend_weight_upload(be, &rh, &rw), "flush weight upload");
        l2_rd_x = dev_random_f32((size_t)RK, 1.0f);
        ok(be->ops->alloc(be, (size_t)RN * 4, (void **)&l2_rd_out), "alloc");
        l2_rd_w = &rw;
    }
    char rows[32][320];
    int nrow = 0;
    /* GPU_BENCH_XGEMV_SHAPES=k: the first k shapes; GPU_BENCH_XGEMV_NOSWEEP=1: the plans only
     * (for ncu) */
    const char *lim = getenv("GPU_BENCH_XGEMV_SHAPES"), *nsw = getenv("GPU_BENCH_XGEMV_NOSWEEP");
    const int nshape = lim && atoi(lim) > 0 && atoi(lim) < 4 ? atoi(lim) : 4;
    const bool nosweep = nsw && atoi(nsw) > 0;
    if (getenv("GPU_BENCH_XGEMV_BIG") && atoi(getenv("GPU_BENCH_XGEMV_BIG")) > 0)
        i4_shapes[0][0] = 4 * 28672;
    printf("\n### matmul_w4gemv / matmul_w8gemv plans (us, clean-L2 flush; R/S/D/B = rows, "
           "slices, depth, blocks per SM (0: one per tile); * = the planner's pick)\n\n");
    for (int s = 0; s < nshape; s++) {
        const int64_t N = i4_shapes[s][0], K = i4_shapes[s][1];
        pd_weight_t h4, h8, w4, w8;
        double wb[2];
        i4_weights(s, &h4, &h8, &w4, &w8, wb);
        for (int f = 0; f < 2; f++)
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
                i4_arg_t a = {0};
                const int n = ns[i];
                int pr, ps, pd, pb;
                i4_alloc(&a, n, N, K);
                a.w = f ? &w8 : &w4;
                if (f)
                    ok(matmul_quant_act_fp8((uint8_t *)a.xh, NULL, a.mult, a.x, n, K, stream),
                       "quant fp8");
                (f ? matmul_w8gemv_plan : matmul_w4gemv_plan)(n, N, K, n_sm, &pr, &ps, &pd, &pb);
                printf("%s %lld x %lld n %d:", f ? "fp8" : "int4", (long long)N, (long long)K, n);
                float best = 1e30f;
                int br = 0, bs = 0, bd = 0, bb = 0;
                for (int c = f ? 3 : 0; !nosweep && c < (f ? 6 : 3); c++)
                    for (int si = 0; si < 5; si++)
                        for (int bi = 0; bi < 5; bi++) {
                            const int S = Ss[si], steps = (int)(K / (f ? 64 : 128));
                            const int per = (steps + S - 1) / S;
                            const int ntiles = (int)((N + Rs[c] - 1) / Rs[c]);
                            if ((S - 1) * per >= steps || Bs[bi] * S > 32)
                                continue;
                            if (!f && (matmul_w4gemv_smem(n, K, Rs[c], S) == 0 ||
                                       matmul_w4gemv_smem(n, K, Rs[c], S) > 231424))
                                continue;
                            a.mode = 4, a.warps = Rs[c], a.splits = S, a.depth = Ds[c];
                            a.blocks = Bs[bi] ? Bs[bi] * n_sm : 0;
                            if (a.blocks >= ntiles)
                                continue;
                            const float ms = time_op(run_i4, &a, 8);
                            if (ms < best)
                                best = ms, br = Rs[c], bs = S, bd = Ds[c], bb = a.blocks;
                            printf(" %d/%d/%d/%d=%.1f%s", Rs[c], S, Ds[c], Bs[bi], ms * 1e3,
                                   Rs[c] == pr && S == ps && Ds[c] == pd &&
                                           (a.blocks == pb || (a.blocks == 0 && pb >= ntiles))
                                       ? "*"
                                       : "");
                        }
                float mp = -1.0f;
                if (pr > 0) {
                    a.mode = 4, a.warps = pr, a.splits = ps, a.depth = pd, a.blocks = pb;
                    mp = time_op(run_i4, &a, 20);
                }
                a.mode = 2;
                const float mo = time_op(run_i4, &a, 20);
                float m4 = -1.0f, mod = -1.0f, m4d = -1.0f;
                pd_weight_t *keep_w = l2_rd_w;
                l2_rd_w = NULL; /* the memset flush */
                mod = time_op(run_i4, &a, 10);
                l2_rd_w = keep_w;
                if (be_old) { /* the same op on the session-4 routing */
                    pd_backend_t *keep = be;
                    cudaStream_t keep_s = stream;
                    be = be_old, stream = stream_old;
                    m4 = time_op(run_i4, &a, 20);
                    l2_rd_w = NULL;
                    m4d = time_op(run_i4, &a, 10);
                    l2_rd_w = keep_w;
                    be = keep, stream = keep_s;
                }
                /* the sweep's best, or "-" when it did not run (GPU_BENCH_XGEMV_NOSWEEP) */
                char bst[48], bstt[64], bsttb[16];
                const bool swept = best < 1e29f;
                snprintf(bst, sizeof bst, swept ? "%d/%d/%d/%d %.1f us" : "-", br, bs, bd, bb,
                         best * 1e3);
                snprintf(bstt, sizeof bstt, swept ? "%.1f (%d/%d/%d/%d)" : "-", best * 1e3, br, bs,
                         bd, bb);
                snprintf(bsttb, sizeof bsttb, swept ? "%.2f" : "-",
                         swept ? wb[f] / 1e12 * 1e3 / best : 0.0);
                printf(" | plan %d/%d/%d/%d %.1f us | best %s | op %.1f us | s4 "
                       "op %.1f us | memset flush: op %.1f s4 op %.1f us\n",
                       pr, ps, pd, pb, mp * 1e3, bst, mo * 1e3, m4 * 1e3, mod * 1e3, m4d * 1e3);
                fflush(stdout);
                const double tb = wb[f] / 1e12 * 1e3; /* TB/s at 1 ms */
                if (nrow < 32)
                    snprintf(rows[nrow++], sizeof rows[0],
                             "| %s | %lld x %lld | %d | %d/%d/%d/%d | %.1f | %.2f | %.0f%% | %s "
                             "| %s | %.1f | %.2f | %.1f | %.2f | %.2f | %.1f / "
                             "%.1f |",
                             f ? "fp8" : "int4", (long long)N, (long long)K, n, pr, ps, pd, pb,
                             mp * 1e3, mp > 0 ? tb / mp : 0.0, mp > 0 ? 100.0 * tb / mp / 4.8 : 0.0,
                             bstt, bsttb, mo * 1e3, tb / mo, m4 * 1e3, m4 > 0 ? tb / m4 : 0.0,
                             m4 > 0 ? mo / m4 : 0.0, mod * 1e3, m4d * 1e3);
                i4_free(&a);
            }
        i4_weights_free(&h4, &h8, &w4, &w8);
    }
    printf("\n| fmt | N x K | n | plan R/S/D/G | plan us | plan TB/s | of 4.8 | best us (R/S/D/G) "
           "| best TB/s | op us | op TB/s | s4 op us | s4 op TB/s | op / s4 op | memset flush: op "
           "/ s4 op us |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < nrow; i++)
        printf("%s\n", rows[i]);
    l2_rd_w = NULL;
    model_host_weight_free(&rh);
    backend_weight_free(be, &rw);
    be->ops->free(be, l2_rd_x);
    be->ops->free(be, l2_rd_out);
    be->ops->free(be, l2_flush);
    l2_flush = NULL;
}

static void bench_ops(void)
{
    printf("\n### per-op (Llama-3-8B shapes; floor = max(bytes / 4.2 TB/s, flops / peak))\n\n");
    printf("| %-12s | %-34s | %9s | %8s | %9s | %6s |\n", "op", "shape", "time us", "GB/s",
           "TFLOP/s", "floor");
    printf("|--------------|------------------------------------|-----------|----------|-----------"
           "|--------|\n");
    const pd_wfmt_t f3[] = {PD_WFMT_BF16, PD_WFMT_FP8, PD_WFMT_INT4};
    for (int f = 0; f < 3; f++) {
        bench_matmul(f3[f], 1, 28672, 4096);
        bench_matmul(f3[f], 1, 4096, 14336);
        bench_matmul(f3[f], 64, 28672, 4096);
    }
    bench_int4_paths();
    bench_matmul(PD_WFMT_FP8, 8192, 28672, 4096);
    bench_matmul(PD_WFMT_FP8, 8192, 14336, 4096);
    bench_matmul(PD_WFMT_FP8, 8192, 4096, 14336);
    bench_matmul(PD_WFMT_FP8, 8192, 6144, 4096);
    bench_matmul(PD_WFMT_BF16, 8192, 28672, 4096);
    bench_matmul(PD_WFMT_BF16, 8192, 14336, 4096);
    bench_matmul(PD_WFMT_INT4, 8192, 28672, 4096);
    { /* the BF16 accuracy mode on the split backend */
        pd_backend_t *keep = be;
        cudaStream_t keep_s = stream;
        be = be_split;
        stream = stream_split;
        printf("| (split mode below) | | | | | |\n");
        bench_matmul(PD_WFMT_BF16, 8192, 14336, 4096);
        be = keep;
        stream = keep_s;
    }
    bench_flash(PD_KV_BF16, 1, 8192, 8192, 3);
    bench_flash(PD_KV_FP8, 1, 8192, 8192, 0);
    bench_flash(PD_KV_BF16, 16, 512, 512, 3);
    bench_flash(PD_KV_BF16, 1, 512, 8192, 3);
    bench_flash(PD_KV_BF16, 1, 2048, 2048, 0);
    bench_flash(PD_KV_BF16, 1, 32768, 32768, 0);
    bench_attention(PD_KV_BF16, 1, 1024);
    bench_attention(PD_KV_FP8, 1, 1024);
    bench_attention(PD_KV_BF16, 64, 1024);
    bench_attention(PD_KV_FP8, 64, 1024);
    bench_elementwise(64);
    bench_elementwise(8192);
}

/* ==== prefill FP8 GEMMs and the prefill layer op by op (issue 12) ==== */

/* A random FP8 weight (N, K) on the GPU (host copy freed). */
static void fp8_weight(int64_t N, int64_t K, pd_weight_t *w)
{
    uint16_t *src = malloc((size_t)(N * K) * 2);
    pd_weight_t host;
    for (int64_t i = 0; i < N * K; i++)
        src[i] = pd_f32_to_bf16(rnd() * 0.02f);
    ok(model_quantize_bf16(src, N, K, PD_WFMT_FP8, &host), "quantize");
    free(src);
    ok(backend_weight_upload(be, &host, w), "weight upload");
    model_host_weight_free(&host);
}

/* fp8 activations (n, K) + scales of random f32 values (matmul_quant_act_fp8) */
static void fp8_act(int n, int64_t K, pd_act_fp8_t *q)
{
    float *x = dev_random_f32((size_t)n * K, 1.0f);
    ok(be->ops->alloc(be, (size_t)n * K, (void **)&q->q), "alloc");
    ok(be->ops->alloc(be, (size_t)n * 4, (void **)&q->scale), "alloc");
    ok(matmul_quant_act_fp8(q->q, NULL, q->scale, x, n, K, stream), "quant");
    ok(be->ops->sync(be), "quant");
    be->ops->free(be, x);
}

typedef struct {
    void *lt, *ws;
    size_t ws_bytes;
    void *out;
    pd_act_fp8_t x;
    pd_weight_t *w;
    int n;
    matmul_lt_opts_t o;
    pd_status_t st;
} lt_arg_t;
static void run_lt(void *p)
{
    lt_arg_t *a = p;
    pd_status_t st =
        matmul_gemm_fp8_rowwise(a->lt, a->ws, a->ws_bytes, a->out, a->x.q, a->x.scale, a->w->data,
                                a->w->scales, a->n, a->w->n, a->w->k, &a->o, stream);
    if (st != PD_OK)
        a->st = st;
}

/* `gpu_bench gemm`: the prefill FP8 GEMM (cuBLASLt, outer-vector per-token x per-row scales) at
 * n 8192 for the Llama-3-8B shapes: f32 / bf16 output x plain / fast accumulation x the first
 * MATMUL_LT_MAX_ALGOS heuristic candidates (us each; '-' where cuBLASLt has no such candidate),
 * and the best one's TFLOP/s and share of the 1.36 PF floor. The backend default is f32, plain,
 * candidate 0 (the first column of the first row of each shape). */
static void bench_gemm_sweep(void)
{
    static const int64_t shapes[][2] = {{6144, 4096},  {4096, 4096},  {1024, 4096},
                                        {28672, 4096}, {14336, 4096}, {4096, 14336}};
    static const char *names[] = {"qkv (one GEMM)", "q / o",         "k / v",
                                  "gate_up",        "gate (target)", "down"};
    const int n = 8192;
    lt_arg_t a = {0};
    if (!backend_cuda_lt(be, &a.lt, &a.ws, &a.ws_bytes))
        return;
    printf("\n### prefill FP8 GEMM, n %d, cuBLASLt outer-vector scales (us per candidate; best "
           "TF/s, %% of the 1.36 PF floor)\n\n",
           n);
    printf("| shape | N x K | out | accum |");
    for (int i = 0; i < MATMUL_LT_MAX_ALGOS; i++)
        printf(" c%d |", i);
    printf(" best TF/s | floor |\n|---|---|---|---|");
    for (int i = 0; i < MATMUL_LT_MAX_ALGOS; i++)
        printf("---|");
    printf("---|---|\n");
    fp8_act(n, 14336, &a.x);
    ok(be->ops->alloc(be, (size_t)n * 28672 * 4, &a.out), "alloc");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        pd_weight_t w;
        fp8_weight(shapes[s][0], shapes[s][1], &w);
        a.w = &w;
        a.n = n;
        const double flops = 2.0 * n * shapes[s][0] * shapes[s][1];
        for (int v = 0; v < 4; v++) {
            a.o.bf16 = v & 1;
            a.o.fast_accum = v >> 1;
            float best = 1e30f;
            printf("| %s | %lld x %lld | %s | %s |", names[s], (long long)shapes[s][0],
                   (long long)shapes[s][1], a.o.bf16 ? "bf16" : "f32",
                   a.o.fast_accum ? "fast" : "plain");
            for (int i = 0; i < MATMUL_LT_MAX_ALGOS; i++) {
                a.o.algo = i;
                a.st = PD_OK;
                run_lt(&a);
                ok(be->ops->sync(be), "gemm probe");
                if (a.st != PD_OK) {
                    printf(" - |");
                    continue;
                }
                float ms = time_op(run_lt, &a, 10);
                best = ms < best ? ms : best;
                printf(" %.0f |", ms * 1e3);
            }
            printf(" %.0f | %.1f%% |\n", flops / (best * 1e-3) / 1e12,
                   100.0 * flops / FP8_FLOPS / (best * 1e-3));
            fflush(stdout);
        }
        backend_weight_free(be, &w);
    }
    be->ops->free(be, a.out);
    be->ops->free(be, a.x.q);
    be->ops->free(be, a.x.scale);
}

typedef struct {
    int op, n;
    float *x, *res, *q, *k, *v, *attn, *tmp, *gu;
    pd_act_fp8_t a;
    pd_weight_t *wq, *wk, *wv, *wo, *wgu, *wd;
    uint16_t *nw;
    int32_t *pos;
    float *inv;
    void *arena;
    kv_layout_t *l;
    pd_attn_batch_t *b;
} pl_arg_t;
static void run_pl(void *p)
{
    pl_arg_t *a = p;
    const int n = a->n;
    switch (a->op) {
    case 0:
        be->ops->add_rmsnorm(be, a->x, a->res, NULL, a->nw, n, 4096, 1e-5f, &a->a);
        break;
    case 1:
        be->ops->matmul_fp8(be, a->q, &a->a, a->wq, n);
        break;
    case 2:
        be->ops->matmul_fp8(be, a->k, &a->a, a->wk, n);
        break;
    case 3:
        be->ops->matmul_fp8(be, a->v, &a->a, a->wv, n);
        break;
    case 4:
        be->ops->rope_kv_write(be, a->q, a->k, a->v, a->pos, a->inv, n, 32, a->arena, a->l, 0,
                               a->pos);
        break;
    case 5:
        be->ops->attention(be, a->attn, a->q, a->arena, a->l, 0, a->b, 32);
        break;
    case 6:
        be->ops->matmul(be, a->tmp, a->attn, a->wo, n);
        break;
    case 7:
        be->ops->add_rmsnorm(be, a->x, a->tmp, NULL, a->nw, n, 4096, 1e-5f, &a->a);
        break;
    case 8:
        be->ops->matmul_silu_fp8(be, &a->a, a->gu, &a->a, a->wgu, n);
        break;
    case 9:
        be->ops->matmul_fp8(be, a->tmp, &a->a, a->wd, n);
        break;
    case 10:
        be->ops->matmul_fp8(be, a->gu, &a->a, a->wgu, n);
        break;
    case 12: /* session 6: the bf16 silu kernel alone on row 8's bf16 product */
        elementwise_silu_mul_fp8_bf16((const uint16_t *)a->gu, a->a.q, a->a.scale, n, 14336,
                                      stream);
        break;
    case 13: /* session 6 (prefill2): rows 1-4 as one op (bf16 q / k / v if PD_CUDA_QKV_BF16=1) */
        be->ops->qkv_rope_write(be, a->q, a->k, a->v, &a->a, a->wq, a->wk, a->wv, a->pos, a->inv, n,
                                32, a->arena, a->l, 0, a->pos);
        break;
    default:
        be->ops->silu_mul_fp8(be, NULL, a->gu, n, 14336, &a->a);
        break;
    }
}

/* `gpu_bench prefops`: one Llama-3-8B layer of an 8192-token prefill op by op, in the model's
 * order (common/model/model_forward.c, FP8 weights, BF16 KV pages), each timed alone (median
 * of 10): the ops' share of the whole prefill. Rows 10-11 are what row 8 replaces (the gate_up
 * GEMM into f32 + silu_mul_fp8). bytes: each op's own reads + writes; flops: the GEMMs' and the
 * causal attention's. */
static void bench_prefill_ops(void)
{
    static const char *names[] = {"add_rmsnorm fp8",   "matmul_fp8 q",    "matmul_fp8 k",
                                  "matmul_fp8 v",      "rope_kv_write",   "attention",
                                  "matmul o (+quant)", "add_rmsnorm fp8", "matmul_silu_fp8",
                                  "matmul_fp8 down",   "(gate_up f32)",   "(silu_mul_fp8 f32)"};
    const int n = 8192;
    if (!be->ops->matmul_silu_fp8 || !be->ops->rope_kv_write)
        return;
    kv_layout_t l;
    kv_layout_init(&l, 1, 8, 128, 16, PD_KV_BF16);
    pl_arg_t a = {0};
    pd_weight_t wq, wk, wv, wo, wgu, wd;
    fp8_weight(4096, 4096, &wq);
    fp8_weight(1024, 4096, &wk);
    fp8_weight(1024, 4096, &wv);
    fp8_weight(4096, 4096, &wo);
    fp8_weight(28672, 4096, &wgu);
    fp8_weight(4096, 14336, &wd);
    a.wq = &wq, a.wk = &wk, a.wv = &wv, a.wo = &wo, a.wgu = &wgu, a.wd = &wd;
    a.n = n;
    a.x = dev_random_f32((size_t)n * 4096, 1.0f);
    a.res = dev_random_f32((size_t)n * 4096, 0.1f);
    a.q = dev_random_f32((size_t)n * 4096, 1.0f);
    a.k = dev_random_f32((size_t)n * 1024, 1.0f);
    a.v = dev_random_f32((size_t)n * 1024, 1.0f);
    a.attn = dev_random_f32((size_t)n * 4096, 1.0f);
    a.tmp = dev_random_f32((size_t)n * 4096, 0.1f);
    a.gu = dev_random_f32((size_t)n * 28672, 1.0f);
    a.inv = dev_random_f32(64, 0.5f);
    fp8_act(n, 14336, &a.a);
    uint16_t hw[4096];
    for (int i = 0; i < 4096; i++)
        hw[i] = pd_f32_to_bf16(1.0f + rnd() * 0.1f);
    ok(be->ops->alloc(be, sizeof hw, (void **)&a.nw), "alloc");
    ok(be->ops->upload(be, a.nw, hw, sizeof hw), "upload");
    int32_t *hp = malloc((size_t)n * 4), *bt = malloc((size_t)(n / 16) * 4);
    for (int i = 0; i < n; i++)
        hp[i] = i;
    for (int i = 0; i < n / 16; i++)
        bt[i] = i;
    a.pos = dev_i32(hp, (size_t)n);
    ok(be->ops->alloc(be, (size_t)(n / 16) * l.page_bytes, &a.arena), "arena");
    a.l = &l;
    int32_t qs[2] = {0, n}, cl[1] = {n};
    pd_attn_batch_t b = {1, n / 16, dev_i32(qs, 2), dev_i32(cl, 1), dev_i32(bt, (size_t)n / 16),
                         n, n};
    a.b = &b;
    const double N8 = 8192.0, gf = 2.0 * N8; /* GEMM flops per weight element */
    const double bytes[] = {N8 * 4096 * (8 + 1) + N8 * 4,
                            N8 * 4096 + 4096.0 * 4096 + N8 * 4096 * 4,
                            N8 * 4096 + 1024.0 * 4096 + N8 * 1024 * 4,
                            N8 * 4096 + 1024.0 * 4096 + N8 * 1024 * 4,
                            N8 * (4096 + 1024) * 8 + N8 * 1024 * 4 + N8 * 2048 * 2,
                            N8 * 4096 * 8 + N8 * 2048 * 2,
                            N8 * 4096 * 5 + 4096.0 * 4096 + N8 * 4096 * 4,
                            N8 * 4096 * (12 + 1),
                            N8 * 4096 + 28672.0 * 4096 + N8 * 28672 * 2 * 2 + N8 * 14336,
                            N8 * 14336 + 4096.0 * 14336 + N8 * 4096 * 4,
                            N8 * 4096 + 28672.0 * 4096 + N8 * 28672 * 4,
                            N8 * 28672 * 4 + N8 * 14336};
    const double flops[] = {0,
                            gf * 4096 * 4096,
                            gf * 1024 * 4096,
                            gf * 1024 * 4096,
                            0,
                            4.0 * 32 * 128 * N8 * (N8 + 1) / 2,
                            gf * 4096 * 4096,
                            0,
                            gf * 28672 * 4096,
                            gf * 4096 * 14336,
                            gf * 28672 * 4096,
                            0};
    printf("\n### prefill layer op by op (n 8192, Llama-3-8B, FP8 weights, BF16 KV; floor = "
           "max(bytes / 4.2 TB/s, flops / peak: FP8 1.36 PF, attention BF16 0.79 PF))\n\n");
    row_header();
    double layer = 0.0;
    const char *th = getenv("PD_BENCH_SILU_THREADS");
    elementwise_silu_bf16_threads = th ? atoi(th) : 512;
    for (int op = 0; op < 12; op++) {
        a.op = op;
        float ms = time_op(run_pl, &a, 10);
        if (op < 10)
            layer += ms;
        row(names[op], op < 10 ? "n 8192" : "n 8192 (replaced)", ms, bytes[op], flops[op],
            op == 5 ? BF16_FLOPS : FP8_FLOPS);
    }
    printf("\nlayer sum (rows 0-9): %.3f ms; x 32 layers = %.1f ms\n", layer, layer * 32);
    elementwise_silu_bf16_threads = 1024; /* the bf16 silu kernel with 1024-thread rows */
    a.op = 8;
    row("matmul_silu_fp8", "n 8192 (silu 1024 threads)", time_op(run_pl, &a, 10), bytes[8],
        flops[8], FP8_FLOPS);
    elementwise_silu_bf16_threads = 512;
    { /* session 6: the bf16 silu kernel alone (on row 8's product), 16-byte kernel vs session
       * 5's (elementwise_silu_bf16_v1), and row 8 with session 5's kernel */
        const int keep = elementwise_silu_bf16_v1, keepf = elementwise_silu_bf16_fast;
        const double sb = N8 * 28672 * 2 + N8 * 14336 + N8 * 4;
        a.op = 8;
        time_op(run_pl, &a, 1);
        for (int v1 = 0; v1 < 2; v1++) {
            elementwise_silu_bf16_v1 = v1;
            a.op = 12;
            row("silu_mul_fp8 bf16 alone",
                v1 ? "n 8192 f 14336 (v1: session 5)" : "n 8192 f 14336 (16-byte)",
                time_op(run_pl, &a, 10), sb, 0, FP8_FLOPS);
        }
        elementwise_silu_bf16_v1 = 0;
        elementwise_silu_bf16_fast = 1;
        a.op = 12;
        row("silu_mul_fp8 bf16 alone", "n 8192 f 14336 (16-byte, fast)", time_op(run_pl, &a, 10),
            sb, 0, FP8_FLOPS);
        a.op = 8;
        row("matmul_silu_fp8", "n 8192 (16-byte silu, fast)", time_op(run_pl, &a, 10), bytes[8],
            flops[8], FP8_FLOPS);
        elementwise_silu_bf16_fast = 0;
        elementwise_silu_bf16_v1 = 1;
        a.op = 8;
        row("matmul_silu_fp8", "n 8192 (v1: session 5 silu)", time_op(run_pl, &a, 10), bytes[8],
            flops[8], FP8_FLOPS);
        elementwise_silu_bf16_v1 = keep;
        elementwise_silu_bf16_fast = keepf;
    }
    if (be->ops->qkv_rope_write) { /* session 6 (prefill2): q, k, v GEMMs + rope + KV in one op;
                                    * bytes as if bf16 products (x, weights, bf16 out + in, q f32,
                                    * pages); compare with rows 1-4 */
        const char *e = getenv("PD_CUDA_QKV_BF16");
        const bool on = e && (!strcmp(e, "1") || !strcmp(e, "on"));
        const double qb =
            N8 * 4096 + 6144.0 * 4096 + N8 * 6144 * 2 * 2 + N8 * 4096 * 4 + N8 * 2048 * 2;
        a.op = 13;
        row("qkv_rope_write", on ? "n 8192 (PD_CUDA_QKV_BF16=1)" : "n 8192 (f32: rows 1-4)",
            time_op(run_pl, &a, 10), qb, gf * 6144 * 4096, FP8_FLOPS);
    }
    fflush(stdout);
    pd_weight_t *ws[] = {&wq, &wk, &wv, &wo, &wgu, &wd};
    for (int i = 0; i < 6; i++)
        backend_weight_free(be, ws[i]);
    void *bufs[] = {a.x,
                    a.res,
                    a.q,
                    a.k,
                    a.v,
                    a.attn,
                    a.tmp,
                    a.gu,
                    a.inv,
                    a.a.q,
                    a.a.scale,
                    a.nw,
                    a.pos,
                    a.arena,
                    (void *)b.q_start,
                    (void *)b.ctx_len,
                    (void *)b.block_tables};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->ops->free(be, bufs[i]);
    free(hp);
    free(bt);
}

/* ==== whole model ==== */

static void llama8b(hf_config_t *c)
{
    memset(c, 0, sizeof *c);
    strcpy(c->architecture, "LlamaForCausalLM");
    c->hidden_size = 4096;
    c->intermediate_size = 14336;
    c->num_hidden_layers = 32;
    c->num_attention_heads = 32;
    c->num_key_value_heads = 8;
    c->head_dim = 128;
    c->vocab_size = 128256;
    c->max_position_embeddings = 131072;
    c->rms_norm_eps = 1e-5;
    c->rope_theta = 500000.0;
    c->bos_token_id = 128000;
}

/* B sequences with ctx tokens already in the cache; q_len new tokens each (decode: 1), run with
 * the context's graph mode `mode`. The cache and tokens depend only on B, ctx and q_len (the
 * generator is reseeded). Returns the median ms of model_forward over reps; keep (n_logits,
 * vocab), when not NULL, receives the logits of the last call. */
static float run_forward_s(model_t *m, pd_kvfmt_t kvfmt, int B, int ctx, int q_len, int n_logits,
                           int reps, model_graphs_t mode, float *keep, int sample);

static float run_forward(model_t *m, pd_kvfmt_t kvfmt, int B, int ctx, int q_len, int n_logits,
                         int reps, model_graphs_t mode, float *keep)
{
    return run_forward_s(m, kvfmt, B, ctx, q_len, n_logits, reps, mode, keep, 0);
}

/* As run_forward; sample 1 (greedy) or 2 (temperature 0.8, top-p 0.95): model_forward_sample
 * instead, the logit rows sampled on the device and only the token ids downloaded. */
static float run_forward_s(model_t *m, pd_kvfmt_t kvfmt, int B, int ctx, int q_len, int n_logits,
                           int reps, model_graphs_t mode, float *keep, int sample)
{
    rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(B * 131 + ctx * 7 + q_len);
    const hf_config_t *c = &m->cfg;
    kv_layout_t l;
    int kvh, kvd, sides; /* MLA: one latent "head" of kv_lora_rank + rope values, one side */
    hf_config_kv_shape(c, &kvh, &kvd, &sides);
    kv_layout_init_sides(&l, c->num_hidden_layers, kvh, kvd, sides, 16, kvfmt);
    int total = ctx + q_len, ppseq = (total + 15) / 16, n_pages = B * ppseq;
    void *arena;
    ok(be->ops->alloc(be, (size_t)n_pages * l.page_bytes, &arena), "arena");
    if (ctx > 0)
        arena_fill_latent(arena, &l, n_pages, c->kv_lora_rank);
    kv_seq_t *seqs = calloc((size_t)B, sizeof *seqs);
    const kv_seq_t **sp = calloc((size_t)B, sizeof *sp);
    int32_t *tokens = malloc((size_t)B * q_len * 4), *qs = malloc(((size_t)B + 1) * 4),
            *cl = malloc((size_t)B * 4), *lr = malloc((size_t)(n_logits > 0 ? n_logits : 1) * 4);
    for (int s = 0; s < B; s++) {
        seqs[s].pages = calloc((size_t)ppseq, sizeof(kv_page_ref_t));
        seqs[s].n_pages = seqs[s].cap = ppseq;
        seqs[s].n_tokens = total;
        for (int i = 0; i < ppseq; i++)
            seqs[s].pages[i].page = s * ppseq + i;
        sp[s] = &seqs[s];
        qs[s] = s * q_len;
        cl[s] = total;
    }
    qs[B] = B * q_len;
    for (int i = 0; i < B * q_len; i++)
        tokens[i] = (int32_t)((uint32_t)(rnd() * 60000.0f + 60000.0f) % (uint32_t)c->vocab_size);
    for (int i = 0; i < n_logits; i++)
        lr[i] = (i + 1) * q_len - 1;
    float *logits = malloc((size_t)(n_logits > 0 ? n_logits : 1) * c->vocab_size * 4);
    model_batch_t b = {B * q_len, tokens, B, qs, cl, sp, n_logits, lr};
    const int nl1 = n_logits > 0 ? n_logits : 1;
    float *st = malloc((size_t)nl1 * 4), *sp_ = malloc((size_t)nl1 * 4),
          *su = malloc((size_t)nl1 * 4);
    int32_t *sk = malloc((size_t)nl1 * 4), *sout = malloc((size_t)nl1 * 4);
    for (int i = 0; i < n_logits; i++) {
        st[i] = sample == 2 ? 0.8f : 0.0f;
        sp_[i] = sample == 2 ? 0.95f : 1.0f;
        sk[i] = 0;
        su[i] = (float)(i + 1) / (float)(n_logits + 2);
    }
    model_sampling_t smp = {st, sk, sp_, su, NULL, 0, NULL, NULL, NULL};
    model_ctx_t *ctxp;
    ok(model_ctx_create(m, &ctxp), "ctx");
    if (model_ctx_set_graphs(ctxp, mode) != mode) {
        fprintf(stderr, "graph mode %d not available\n", (int)mode);
        exit(1);
    }
    float ts[32];
    bool prof = false;
    for (int i = 0; i < reps + 2; i++) {
        /* recording starts before the first call (the graphs are captured and instantiated
         * there, which CUPTI may need to see); the steps are the timed calls (each ends in a
         * sync), the records before the first mark are dropped */
        if (prof_steps && i == 0) {
            prof = stepprof_begin() == 0;
            prof_fail |= !prof;
        }
        if (prof && i >= 2)
            stepprof_mark();
        double t0 = pd_clock_s();
        if (sample)
            ok(model_forward_sample(ctxp, arena, &l, &b, &smp, sout, NULL), "forward_sample");
        else
            ok(model_forward(ctxp, arena, &l, &b, logits), "forward");
        if (i >= 2)
            ts[i - 2] = (float)((pd_clock_s() - t0) * 1e3);
    }
    if (prof)
        stepprof_mark();
    qsort(ts, (size_t)reps, sizeof ts[0], cmp_f);
    if (model_ctx_graphs(ctxp) != mode) {
        fprintf(stderr, "graph mode %d fell back to eager (capture failed)\n", (int)mode);
        graph_fail = 1;
    }
    if (keep && n_logits > 0)
        memcpy(keep, logits, (size_t)n_logits * c->vocab_size * 4);
    model_ctx_destroy(ctxp);
    for (int s = 0; s < B; s++)
        free(seqs[s].pages);
    free(seqs);
    free(sp);
    free(tokens);
    free(qs);
    free(cl);
    free(lr);
    free(logits);
    free(st);
    free(sp_);
    free(su);
    free(sk);
    free(sout);
    be->ops->free(be, arena);
    return ts[reps / 2];
}

static void bench_model(bool decode, bool prefill)
{
    const bool quick =
        !decode && getenv("PD_BENCH_PREFILL_QUICK") && atoi(getenv("PD_BENCH_PREFILL_QUICK"));
    hf_config_t cfg;
    llama8b(&cfg);
    /* GPU_BENCH_LM_HEAD=fp8|int4: the LM head in that format (default bf16, as checkpoints and
     * the PyTorch baselines keep it; pdctl --lm-head chooses it for serving) */
    pd_wfmt_t lmf = PD_WFMT_BF16;
    const char *lme = getenv("GPU_BENCH_LM_HEAD");
    if (lme && *lme && pd_wfmt_parse(lme, &lmf) != 0) {
        fprintf(stderr, "gpu_bench: GPU_BENCH_LM_HEAD: unknown format '%s'\n", lme);
        exit(2);
    }
    struct {
        pd_wfmt_t w;
        pd_kvfmt_t kv;
        bool dec, pre;
    } confs[] = {{PD_WFMT_INT4, PD_KV_FP8, true, false},
                 {PD_WFMT_FP8, PD_KV_BF16, true, true},
                 {PD_WFMT_INT4, PD_KV_BF16, false, true}};
    if (decode) {
        printf("\n### decode step, Llama-3-8B shape, random weights, context 1024, LM head %s "
               "(model_forward, wall clock, median of 10)\n\n",
               pd_wfmt_name(lmf));
        printf("| weights | kv | batch | eager ms (logits to host) | eager ms (no logits) | "
               "graph ms (logits to host) | graph ms (no logits) | graph ms (whole step: device "
               "greedy, ids to host) | graph ms (whole step: device T 0.8 top-p 0.95, ids to "
               "host) | tok/s (graph, device sampling) | graph vs padded eager | graph vs eager "
               "max abs diff |\n");
        printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    }
    /* GPU_BENCH_DECODE_ONLY=int4 | fp8: the decode rows of those weights only (A / B rounds) */
    const char *only = getenv("GPU_BENCH_DECODE_ONLY");
    for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
        if (!((decode && confs[i].dec) || (prefill && confs[i].pre)))
            continue;
        if (only && *only && !prefill && strcmp(only, pd_wfmt_name(confs[i].w)))
            continue;
        model_t *m;
        double t0 = pd_clock_s();
        ok(model_create_random(&cfg, confs[i].w, lmf, be, 42, &m), "model");
        fprintf(stderr, "model %s: %.1f s to build, %.2f GB\n", pd_wfmt_name(confs[i].w),
                pd_clock_s() - t0, m->weight_bytes / 1e9);
        /* GPU_BENCH_DECODE_BATCHES="1 8 64": other batch sizes (at most 8, each 1..256) */
        int batches[8] = {1, 3, 16, 64}, nb = 4;
        const char *bl = getenv("GPU_BENCH_DECODE_BATCHES");
        if (bl && *bl) {
            nb = 0;
            for (char *e; nb < 8 && *bl; bl = e) {
                const long v = strtol(bl, &e, 10);
                if (e == bl)
                    break;
                if (v >= 1 && v <= 256)
                    batches[nb++] = (int)v;
            }
        }
        for (int bi = 0; decode && confs[i].dec && bi < nb; bi++) {
            const int B = batches[bi];
            const size_t nv = (size_t)B * cfg.vocab_size;
            float *le = malloc(nv * 4), *lp = malloc(nv * 4), *lg = malloc(nv * 4);
            float a = run_forward(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_OFF, le);
            float z = run_forward(m, confs[i].kv, B, 1024, 1, 0, 10, MODEL_GRAPHS_OFF, NULL);
            float ga = run_forward(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_ON, lg);
            float gz = run_forward(m, confs[i].kv, B, 1024, 1, 0, 10, MODEL_GRAPHS_ON, NULL);
            float gs1 = run_forward_s(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_ON, NULL, 1);
            float gs2 = run_forward_s(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_ON, NULL, 2);
            run_forward(m, confs[i].kv, B, 1024, 1, B, 1, MODEL_GRAPHS_EAGER, lp);
            double dmax = 0.0;
            size_t nbad = 0;
            for (size_t j = 0; j < nv; j++) {
                double dd = fabs((double)lg[j] - (double)le[j]);
                dmax = dd > dmax ? dd : dmax;
                nbad += memcmp(&lg[j], &lp[j], 4) != 0;
            }
            printf("| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %s | %.3g "
                   "|\n",
                   pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), B, a, z, ga, gz, gs1, gs2,
                   B * 1000.0 / gs2, nbad ? "DIFFERENT" : "bit-identical", dmax);
            fflush(stdout);
            if (nbad) {
                fprintf(stderr, "graph replay differs from the padded eager step in %zu logits\n",
                        nbad);
                graph_fail = 1;
            }
            free(le);
            free(lp);
            free(lg);
        }
        if (prefill && confs[i].pre) {
            float ms = run_forward(m, confs[i].kv, 1, 0, 8192, 1, 3, MODEL_GRAPHS_OFF, NULL);
            if (quick) { /* PD_BENCH_PREFILL_QUICK=1: the FP8 8192-token prompt alone */
                printf("\nprefill 8192 tokens, %s weights, %s kv: %.1f ms (quick)\n",
                       pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), ms);
                fflush(stdout);
                model_destroy(m);
                break;
            }
            printf("\nprefill 8192 tokens, %s weights, %s kv: %.1f ms (%.0f tok/s)\n",
                   pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), ms, 8192 * 1000.0 / ms);
            fflush(stdout);
            if (confs[i].w == PD_WFMT_FP8) {
                float b16 = run_forward(m, confs[i].kv, 16, 0, 512, 16, 3, MODEL_GRAPHS_OFF, NULL);
                printf("prefill 16 x 512 tokens in one batch, %s weights, %s kv: %.1f ms (%.2fx "
                       "the 8192-token prompt)\n",
                       pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), b16, b16 / ms);
                fflush(stdout);
                float chunked = 0.0f;
                for (int c = 0; c < 16; c++)
                    chunked +=
                        run_forward(m, confs[i].kv, 1, 512 * c, 512, 1, 3, MODEL_GRAPHS_OFF, NULL);
                printf("prefill 8192 tokens as 16 chunks of 512 (each attends to the earlier "
                       "pages), %s weights, %s kv: %.1f ms (%.2fx unchunked)\n",
                       pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), chunked, chunked / ms);
                fflush(stdout);
                float big = run_forward(m, confs[i].kv, 1, 0, 32768, 1, 1, MODEL_GRAPHS_OFF, NULL);
                printf("prefill 32768 tokens, %s weights, %s kv: %.1f ms (%.0f tok/s)\n",
                       pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), big,
                       32768 * 1000.0 / big);
                fflush(stdout);
            }
        }
        model_destroy(m);
    }
}

/* ==== MoE: Qwen3-30B-A3B shape ==== */

static void qwen3_30b_a3b(hf_config_t *c, int layers)
{
    memset(c, 0, sizeof *c);
    strcpy(c->architecture, "Qwen3MoeForCausalLM");
    c->hidden_size = 2048;
    c->intermediate_size = 6144;
    c->moe_intermediate_size = 768;
    c->num_experts = 128;
    c->num_experts_per_tok = 8;
    c->norm_topk_prob = true;
    c->decoder_sparse_step = 1;
    c->num_hidden_layers = layers;
    c->num_attention_heads = 32;
    c->num_key_value_heads = 4;
    c->head_dim = 128;
    c->vocab_size = 151936;
    c->max_position_embeddings = 40960;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 1000000.0;
    c->bos_token_id = 151643;
}

/* The Qwen3-30B-A3B shape with the benchmarks' layer count (PD_BENCH_MOE_LAYERS, default 16 of
 * its 48); returns that count. */
static int qwen3_30b_a3b_bench(hf_config_t *c)
{
    const char *env = getenv("PD_BENCH_MOE_LAYERS");
    const int layers = env && atoi(env) > 0 ? atoi(env) : 16;
    qwen3_30b_a3b(c, layers);
    return layers;
}

/* `gpu_bench moe`: decode steps of the Qwen3-30B-A3B shape (128 experts, top 8, expert FFN 768,
 * hidden 2048, 32 / 4 heads; PD_BENCH_MOE_LAYERS of its 48 layers, default 16: the step time
 * scales with layers, the LM head does not), random weights, context 1024, batch 1 and 64: the
 * experts grouped on the host (moe_grouped=off, eager: the path before), grouped on the device
 * (eager and graph), and the whole step with device sampling and ids-only download. The graph
 * logits must equal the padded eager plan's bit for bit (else exit 1). Further rows per batch
 * repeat the device-grouped columns with each other grouped matmul kernel (moe_gmm, moe_gmm2,
 * moe_gmm3: backend_cuda_set_moe_gmm). tests/bench/torch_moe_baseline.py times the same step in
 * PyTorch. */
static void bench_moe(void)
{
    hf_config_t cfg;
    const int layers = qwen3_30b_a3b_bench(&cfg);
    const struct {
        pd_wfmt_t w;
        pd_kvfmt_t kv;
    } confs[] = {{PD_WFMT_INT4, PD_KV_FP8}, {PD_WFMT_FP8, PD_KV_BF16}};
    printf("\n### decode step, Qwen3-30B-A3B shape (%d of 48 layers), random weights, context 1024 "
           "(wall clock, median of 10)\n\n",
           layers);
    printf("| weights | kv | batch | eager ms, experts grouped on the host (logits to host) | "
           "eager ms, grouped on the device (logits to host) | graph ms (logits to host) | graph "
           "ms (whole step: device T 0.8 top-p 0.95, ids to host) | tok/s (graph, device "
           "sampling) | graph vs padded eager |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
        model_t *m;
        double t0 = pd_clock_s();
        ok(model_create_random(&cfg, confs[i].w, PD_WFMT_BF16, be, 43, &m), "moe model");
        fprintf(stderr, "moe model %s: %.1f s to build, %.2f GB\n", pd_wfmt_name(confs[i].w),
                pd_clock_s() - t0, m->weight_bytes / 1e9);
        static const int batches[] = {1, 64};
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            const int B = batches[bi];
            const size_t nv = (size_t)B * cfg.vocab_size;
            float *lp = malloc(nv * 4), *lg = malloc(nv * 4);
            ok(be->ops->set_option(be, "moe_grouped", "off"), "moe_grouped=off");
            float host = run_forward(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_OFF, NULL);
            ok(be->ops->set_option(be, "moe_grouped", "on"), "moe_grouped=on");
            float dev = run_forward(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_OFF, NULL);
            float ga = run_forward(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_ON, lg);
            float gs = run_forward_s(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_ON, NULL, 2);
            run_forward(m, confs[i].kv, B, 1024, 1, B, 1, MODEL_GRAPHS_EAGER, lp);
            size_t nbad = 0;
            for (size_t j = 0; j < nv; j++)
                nbad += memcmp(&lg[j], &lp[j], 4) != 0;
            printf("| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %.0f | %s |\n",
                   pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), B, host, dev, ga, gs,
                   B * 1000.0 / gs, nbad ? "DIFFERENT" : "bit-identical");
            fflush(stdout);
            if (nbad) {
                fprintf(stderr,
                        "moe graph replay differs from the padded eager step in %zu "
                        "logits\n",
                        nbad);
                graph_fail = 1;
            }
            /* the same device-grouped step with each other grouped matmul kernel (moe_gmm,
             * moe_gmm2, moe_gmm3; the rows above ran the backend's default) */
            const int was = backend_cuda_set_moe_gmm(be, 1); /* the kernel of the rows above */
            ok(was ? PD_OK : PD_ERR_INVALID, "set_moe_gmm");
            static const char *const names[] = {"", "moe_gmm (session 5)", "moe_gmm2",
                                                "moe_gmm3 (tensor cores)"};
            for (int other = 1; other <= 3; other++) {
                if (other == was)
                    continue;
                backend_cuda_set_moe_gmm(be, other);
                dev = run_forward(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_OFF, NULL);
                ga = run_forward(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_ON, lg);
                gs = run_forward_s(m, confs[i].kv, B, 1024, 1, B, 10, MODEL_GRAPHS_ON, NULL, 2);
                run_forward(m, confs[i].kv, B, 1024, 1, B, 1, MODEL_GRAPHS_EAGER, lp);
                nbad = 0;
                for (size_t j = 0; j < nv; j++)
                    nbad += memcmp(&lg[j], &lp[j], 4) != 0;
                printf("| %s, %s | %s | %d | - | %.2f | %.2f | %.2f | %.0f | %s |\n",
                       pd_wfmt_name(confs[i].w), names[other], pd_kvfmt_name(confs[i].kv), B, dev,
                       ga, gs, B * 1000.0 / gs, nbad ? "DIFFERENT" : "bit-identical");
                fflush(stdout);
                if (nbad) {
                    fprintf(stderr,
                            "moe_gmm%d graph replay differs from the padded eager step in %zu "
                            "logits\n",
                            other, nbad);
                    graph_fail = 1;
                }
            }
            backend_cuda_set_moe_gmm(be, was);
            free(lp);
            free(lg);
        }
        model_destroy(m);
    }
}

/* Context scaling (issue 11): whole decode steps from CUDA graphs, no logits download, at batch 1
 * and 64 and context 1k, 8k and 32k, INT4 + FP8 KV and FP8 + BF16 KV. A case whose KV arena does
 * not fit in free device memory (less a 4 GB margin) is reported, not run. Floor: the bytes a
 * step must read (every weight but the embedding table, plus the KV of every sequence) at the
 * copy bandwidth. */
static void bench_ctxscale(void)
{
    hf_config_t cfg;
    llama8b(&cfg);
    const struct {
        pd_wfmt_t w;
        pd_kvfmt_t kv;
    } confs[] = {{PD_WFMT_INT4, PD_KV_FP8}, {PD_WFMT_FP8, PD_KV_BF16}};
    static const int batches[] = {1, 64}, ctxs[] = {1024, 8192, 32768};
    printf("\n### decode step vs context, Llama-3-8B shape, random weights (graph, no logits, "
           "median of 10)\n\n");
    printf("| weights | kv | batch | context | KV GB | ms | tok/s | floor ms | floor / ms |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
        model_t *m;
        ok(model_create_random(&cfg, confs[i].w, PD_WFMT_BF16, be, 42, &m), "model");
        const double wbytes =
            (double)m->weight_bytes - (double)cfg.vocab_size * cfg.hidden_size * 2;
        kv_layout_t l;
        kv_layout_init(&l, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 16,
                       confs[i].kv);
        for (size_t bi = 0; bi < 2; bi++)
            for (size_t ci = 0; ci < 3; ci++) {
                const int B = batches[bi], ctx = ctxs[ci];
                const double kv_bytes = (double)B * ((ctx + 1 + 15) / 16) * l.page_bytes;
                size_t free_b = 0, total_b = 0;
                cudaMemGetInfo(&free_b, &total_b);
                if (kv_bytes + 4e9 > (double)free_b) {
                    printf("| %s | %s | %d | %d | %.1f | does not fit (%.1f GB free) | | | |\n",
                           pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), B, ctx,
                           kv_bytes / 1e9, free_b / 1e9);
                    continue;
                }
                const float ms =
                    run_forward(m, confs[i].kv, B, ctx, 1, 0, 10, MODEL_GRAPHS_ON, NULL);
                const double floor_ms =
                    (wbytes + (double)B * ctx * l.page_bytes / 16) / COPY_BW * 1e3;
                printf("| %s | %s | %d | %d | %.1f | %.2f | %.0f | %.2f | %.0f%% |\n",
                       pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), B, ctx, kv_bytes / 1e9,
                       ms, B * 1000.0 / ms, floor_ms, 100.0 * floor_ms / ms);
                fflush(stdout);
            }
        model_destroy(m);
    }
}

/* ==== GLM-4.5-Air and DeepSeek-V3 shapes, fewer layers ==== */

/* The published config.json of each (Hugging Face hub: zai-org/GLM-4.5-Air,
 * deepseek-ai/DeepSeek-V3) with num_hidden_layers cut to %d; first_k_dense_replace 1 keeps one
 * dense layer and makes the rest MoE (the published 1 and 3). */
static const char *const fam_configs[2] = {
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", "
    "\"attention_bias\": true, \"first_k_dense_replace\": 1, \"head_dim\": 128, "
    "\"hidden_size\": 4096, \"intermediate_size\": 10944, \"max_position_embeddings\": 131072, "
    "\"moe_intermediate_size\": 1408, \"n_group\": 1, \"n_routed_experts\": 128, "
    "\"n_shared_experts\": 1, \"norm_topk_prob\": true, \"num_attention_heads\": 96, "
    "\"num_experts_per_tok\": 8, \"num_hidden_layers\": %d, \"num_key_value_heads\": 8, "
    "\"partial_rotary_factor\": 0.5, \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000, "
    "\"routed_scaling_factor\": 1.0, \"topk_group\": 1, \"use_qk_norm\": false, "
    "\"vocab_size\": 151552, \"bos_token_id\": 0, \"eos_token_id\": 1}",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", "
    "\"first_k_dense_replace\": 1, \"hidden_size\": 7168, \"intermediate_size\": 18432, "
    "\"kv_lora_rank\": 512, \"max_position_embeddings\": 163840, "
    "\"moe_intermediate_size\": 2048, \"n_group\": 8, \"n_routed_experts\": 256, "
    "\"n_shared_experts\": 1, \"norm_topk_prob\": true, \"num_attention_heads\": 128, "
    "\"num_experts_per_tok\": 8, \"num_hidden_layers\": %d, \"num_key_value_heads\": 128, "
    "\"q_lora_rank\": 1536, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, "
    "\"rms_norm_eps\": 1e-06, \"rope_theta\": 10000, \"rope_scaling\": {\"beta_fast\": 32, "
    "\"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, "
    "\"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, "
    "\"routed_scaling_factor\": 2.5, \"scoring_func\": \"sigmoid\", \"topk_group\": 4, "
    "\"topk_method\": \"noaux_tc\", \"v_head_dim\": 128, \"vocab_size\": 129280, "
    "\"bos_token_id\": 0, \"eos_token_id\": 1}"};

/* decode (context 1024, B 1 and 64, eager and with graphs: since session 16 the family's MoE
 * layers are registered with moe_prepare, so their steps are captured; FP8 block-scaled experts
 * are not, and their graph column says "off") and prefill (one prompt of pre tokens) of
 * GLM-4.5-Air and DeepSeek-V3 with `layers` layers, random weights */
static void bench_family(int layers, int pre)
{
    static const char *names[2] = {"GLM-4.5-Air", "DeepSeek-V3"};
    struct {
        int model;
        pd_wfmt_t w;
        pd_kvfmt_t kv;
        bool pre;
    } confs[] = {{0, PD_WFMT_INT4, PD_KV_FP8, false},
                 {1, PD_WFMT_FP8_BLOCK, PD_KV_BF16, true},
                 {0, PD_WFMT_FP8, PD_KV_BF16, true},
                 {1, PD_WFMT_INT4, PD_KV_FP8, false}};
    printf("\n### GLM-4.5-Air / DeepSeek-V3 shapes, %d layers (1 dense + %d MoE), random weights "
           "(model_forward, wall clock, median; graph: decode steps captured, eager: op by op)"
           "\n\n",
           layers, layers - 1);
    printf("| model | weights | kv | step | ms (eager) | ms (graph) | tok/s (best) | weights GB "
           "|\n|---|---|---|---|---|---|---|---|\n");
    const char *fprof = getenv("GPU_BENCH_FAMILY_PROF");
    const bool prof = fprof && atoi(fprof);
    for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
        char text[2048];
        hf_config_t cfg;
        model_t *m;
        if (prof && confs[i].w != PD_WFMT_INT4)
            continue;
        snprintf(text, sizeof text, fam_configs[confs[i].model], layers);
        ok(hf_config_parse(text, strlen(text), names[confs[i].model], &cfg), "family config");
        double t0 = pd_clock_s();
        ok(model_create_random_family(&cfg, confs[i].w, PD_WFMT_BF16, be, 42, &m), "model");
        fprintf(stderr, "%s %s: %.1f s to build, %.2f GB\n", names[confs[i].model],
                pd_wfmt_name(confs[i].w), pd_clock_s() - t0, m->weight_bytes / 1e9);
        static const int batches[] = {1, 64};
        /* GPU_BENCH_FAMILY_PROF=1: instead of the table row, where each INT4 decode step's time
         * goes (graph, device greedy, CUPTI: stepprof.h) */
        if (prof) {
            for (size_t bi = 0; bi < 2; bi++) {
                char title[160];
                const int B = batches[bi];
                prof_steps = true;
                const float ms =
                    run_forward_s(m, confs[i].kv, B, 1024, 1, B, 5, MODEL_GRAPHS_ON, NULL, 1);
                prof_steps = false;
                snprintf(title, sizeof title,
                         "%s (%d layers) decode, %s weights + %s KV, batch %d, context 1024, "
                         "graph, device greedy (wall clock median %.2f ms)",
                         names[confs[i].model], layers, pd_wfmt_name(confs[i].w),
                         pd_kvfmt_name(confs[i].kv), B, ms);
                stepprof_end(title, 0);
            }
            model_destroy(m);
            continue;
        }
        model_ctx_t *probe; /* graphs where the model's contexts can have them */
        ok(model_ctx_create(m, &probe), "ctx");
        const bool can = model_ctx_graphs(probe) == MODEL_GRAPHS_ON;
        model_ctx_destroy(probe);
        for (size_t bi = 0; bi < 2; bi++) {
            const int B = batches[bi];
            const float ms = run_forward(m, confs[i].kv, B, 1024, 1, B, 5, MODEL_GRAPHS_OFF, NULL);
            const float gms =
                can ? run_forward(m, confs[i].kv, B, 1024, 1, B, 5, MODEL_GRAPHS_ON, NULL) : 0.0f;
            char gcol[32];
            if (can)
                snprintf(gcol, sizeof gcol, "%.2f", gms);
            else
                snprintf(gcol, sizeof gcol, "off");
            const float best = can && gms < ms ? gms : ms;
            printf("| %s | %s | %s | decode B%d ctx 1024 (logits to host) | %.2f | %s | %.0f | "
                   "%.2f |\n",
                   names[confs[i].model], pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), B,
                   ms, gcol, B * 1000.0 / best, m->weight_bytes / 1e9);
            fflush(stdout);
        }
        if (confs[i].pre && pre > 0) {
            float ms = run_forward(m, confs[i].kv, 1, 0, pre, 1, 3, MODEL_GRAPHS_OFF, NULL);
            printf("| %s | %s | %s | prefill %d tokens | %.1f | – | %.0f | %.2f |\n",
                   names[confs[i].model], pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), pre,
                   ms, pre * 1000.0 / ms, m->weight_bytes / 1e9);
            fflush(stdout);
        }
        model_destroy(m);
    }
}

/* `gpu_bench stepprof`: where the time of a whole step goes, kernel by kernel (CUPTI activity
 * records of 5 timed calls: stepprof.h): the Llama-3-8B decode step (graph, device greedy, ids to
 * the host) at batch 1 and 64, context 1024, INT4 + FP8 KV and FP8 + BF16 KV (floors: issue
 * 11's; GPU_BENCH_STEPPROF=decode: those alone), the INT4 and FP8 prefill of 8192 tokens (eager, 3
 * calls; GPU_BENCH_STEPPROF=prefill: those alone), and the Qwen3-30B-A3B decode step (16 layers) at
 * batch 1 and 64 with each grouped expert kernel (moe_gmm2, moe_gmm3). */
static void bench_stepprof(void)
{
    hf_config_t cfg;
    llama8b(&cfg);
    const struct {
        pd_wfmt_t w;
        pd_kvfmt_t kv;
        double floor_ms[2]; /* batch 1, 64 */
    } confs[] = {{PD_WFMT_INT4, PD_KV_FP8, {0.92, 2.2}}, {PD_WFMT_FP8, PD_KV_BF16, {2.0, 4.0}}};
    char title[160];
    /* GPU_BENCH_STEPPROF=prefill: the two prefill profiles alone; =decode: the four Llama
     * decode profiles alone */
    const char *only = getenv("GPU_BENCH_STEPPROF");
    const bool prefill_only = only && !strcmp(only, "prefill");
    const bool decode_only = only && !strcmp(only, "decode");
    printf("\n### stepprof: kernel time per step (CUPTI activity, programmatic dependent launch "
           "and graphs as in serving)\n");
    for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
        model_t *m;
        ok(model_create_random(&cfg, confs[i].w, PD_WFMT_BF16, be, 42, &m), "model");
        static const int batches[] = {1, 64};
        for (int bi = 0; bi < 2 && !prefill_only; bi++) {
            prof_steps = true;
            const float ms = run_forward_s(m, confs[i].kv, batches[bi], 1024, 1, batches[bi], 5,
                                           MODEL_GRAPHS_ON, NULL, 1);
            prof_steps = false;
            snprintf(title, sizeof title,
                     "Llama-3-8B decode, %s weights + %s KV, batch %d, context 1024, graph, device "
                     "greedy (wall clock median %.2f ms)",
                     pd_wfmt_name(confs[i].w), pd_kvfmt_name(confs[i].kv), batches[bi], ms);
            stepprof_end(title, confs[i].floor_ms[bi]);
        }
        if (!decode_only) { /* the prefill of 8192 tokens, BF16 KV (the INT4 model's too) */
            prof_steps = true;
            const float ms = run_forward(m, PD_KV_BF16, 1, 0, 8192, 1, 3, MODEL_GRAPHS_OFF, NULL);
            prof_steps = false;
            snprintf(title, sizeof title,
                     "Llama-3-8B prefill, 8192 tokens, %s weights + BF16 KV, eager (wall clock "
                     "median %.1f ms)",
                     pd_wfmt_name(confs[i].w), ms);
            stepprof_end(title, 0);
        }
        model_destroy(m);
    }
    if (prefill_only || decode_only)
        return;
    const int layers = qwen3_30b_a3b_bench(&cfg);
    const pd_wfmt_t mw[] = {PD_WFMT_INT4, PD_WFMT_FP8};
    const pd_kvfmt_t mkv[] = {PD_KV_FP8, PD_KV_BF16};
    for (int i = 0; i < 2; i++) {
        model_t *m;
        ok(model_create_random(&cfg, mw[i], PD_WFMT_BF16, be, 43, &m), "moe model");
        for (int kern = 2; kern <= 3; kern++) {
            const int was = backend_cuda_set_moe_gmm(be, kern);
            ok(was ? PD_OK : PD_ERR_INVALID, "set_moe_gmm");
            for (int B = 1; B <= 64; B *= 64) {
                prof_steps = true;
                const float ms =
                    run_forward_s(m, mkv[i], B, 1024, 1, B, 5, MODEL_GRAPHS_ON, NULL, 1);
                prof_steps = false;
                snprintf(title, sizeof title,
                         "Qwen3-30B-A3B decode (%d of 48 layers), %s weights + %s KV, moe_gmm%d, "
                         "batch %d, context 1024, graph, device greedy (wall clock median %.2f "
                         "ms)",
                         layers, pd_wfmt_name(mw[i]), pd_kvfmt_name(mkv[i]), kern, B, ms);
                stepprof_end(title, 0);
            }
            backend_cuda_set_moe_gmm(be, was);
        }
        model_destroy(m);
    }
}

/* `gpu_bench sample`: the sampling ops alone on 128k-logit rows (random logits, scale 4), batch 1
 * and 64, each on both sampler paths (kernels/sample.h sample_bucket: 0 the bisection and one
 * pass per logprobs alternative, 1 session 20's bucket refinement, the default since session
 * 21): greedy, T 0.8 + top-p 0.95
 * (top-k off: the 2048 largest are the candidates), T 1 + top-k 50, and the logprobs op with 20
 * alternatives. us per launch (median of 30, logits in L2 as after the LM head). Not part of
 * all. */
typedef struct {
    int32_t *tok;
    const float *logits, *t, *p, *u;
    const int32_t *k, *nt;
    int32_t *lid;
    float *lv;
    int n, vocab, lp;
} sample_arg_t;

static void run_sample(void *p)
{
    sample_arg_t *a = p;
    if (a->lp)
        be->ops->logprobs(be, a->lid, a->lv, a->logits, a->tok, a->nt, a->n, a->vocab);
    else
        be->ops->sample(be, a->tok, a->logits, a->n, a->vocab, a->t, a->k, a->p, a->u);
}

static void bench_sample(void)
{
    const int vocab = 128256, ns[] = {1, 64};
    static const struct {
        const char *name;
        float t, p;
        int k, lp;
    } modes[] = {{"greedy", 0.0f, 1.0f, 0, 0},
                 {"T 0.8, top-p 0.95", 0.8f, 0.95f, 0, 0},
                 {"T 1, top-k 50", 1.0f, 1.0f, 50, 0},
                 {"logprobs, 20 alternatives", 0.0f, 1.0f, 0, 1}};
    printf("\n### sampling ops, vocabulary %d, random logits (us per launch, median of 30)\n\n",
           vocab);
    printf("| batch | op | bisection (PD_CUDA_SAMPLE_BUCKET=0) | bucket (default) | bucket / "
           "bisection |\n");
    printf("|---|---|---|---|---|\n");
    const int was = sample_bucket;
    for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
        const int n = ns[b];
        float *hv = malloc((size_t)n * 4), *hu = malloc((size_t)n * 4);
        int32_t *hk = malloc((size_t)n * 4), *hn = malloc((size_t)n * 4);
        sample_arg_t a = {.n = n, .vocab = vocab};
        a.logits = dev_random_f32((size_t)n * vocab, 4.0f);
        ok(be->ops->alloc(be, (size_t)n * 4, (void **)&a.tok), "alloc");
        ok(be->ops->alloc(be, (size_t)n * (1 + SAMPLE_LP_TOP) * 4, (void **)&a.lid), "alloc");
        ok(be->ops->alloc(be, (size_t)n * (1 + SAMPLE_LP_TOP) * 4, (void **)&a.lv), "alloc");
        for (int i = 0; i < n; i++) {
            hu[i] = (float)(i + 1) / (float)(n + 2);
            hn[i] = SAMPLE_LP_TOP;
        }
        float *du = dev_copy4(hu, (size_t)n);
        a.u = du;
        a.nt = dev_i32(hn, (size_t)n);
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            for (int i = 0; i < n; i++) {
                hv[i] = modes[m].t;
                hk[i] = modes[m].k;
            }
            float *dt = dev_copy4(hv, (size_t)n);
            for (int i = 0; i < n; i++)
                hv[i] = modes[m].p;
            float *dp = dev_copy4(hv, (size_t)n);
            a.t = dt;
            a.p = dp;
            a.k = dev_i32(hk, (size_t)n);
            a.lp = modes[m].lp;
            float ms[2];
            for (int path = 0; path < 2; path++) {
                sample_bucket = path;
                ms[path] = time_op(run_sample, &a, 30);
            }
            printf("| %d | %s | %.1f | %.1f | %.2f |\n", n, modes[m].name, ms[0] * 1e3,
                   ms[1] * 1e3, ms[1] / ms[0]);
            fflush(stdout);
            be->ops->free(be, dt);
            be->ops->free(be, dp);
            be->ops->free(be, (void *)a.k);
        }
        be->ops->free(be, (void *)a.logits);
        be->ops->free(be, a.tok);
        be->ops->free(be, a.lid);
        be->ops->free(be, a.lv);
        be->ops->free(be, du);
        be->ops->free(be, (void *)a.nt);
        free(hv);
        free(hu);
        free(hk);
        free(hn);
    }
    sample_bucket = was;
}

int main(int argc, char **argv)
{
    bool ops = argc < 2, decode = argc < 2, prefill = argc < 2, flash = false, int4 = false,
         fused = false, sweep = false;
    bool gemm = false, prefops = false;
    bool attn = false, attnprof = false, attnsplit = false, attnbf = false, ctxscale = false,
         family = false, moe = false, xgemv = false, w4mma = false, stepprof = false, w4wg = false,
         w8wg = false, qkvgroup = false, sample = false, ksplit = false;
    for (int i = 1; i < argc; i++) {
        sample |= !strcmp(argv[i], "sample"); /* the sampling ops, both paths (not part of all) */
        /* matmul_int4_mma2 table (not part of all) */
        w4mma |= !strcmp(argv[i], "w4mma");
        w4wg |= !strcmp(argv[i], "w4wg");         /* matmul_w4wg table (not part of all) */
        w8wg |= !strcmp(argv[i], "w8wg");         /* matmul_w8wg table (not part of all) */
        qkvgroup |= !strcmp(argv[i], "qkvgroup"); /* q, k, v grouped (not part of all) */
        ksplit |= !strcmp(argv[i], "ksplit");     /* FP8 K-split GEMV table (not part of all) */
        stepprof |= !strcmp(argv[i], "stepprof"); /* kernel time per step (not part of all) */
        family |= !strcmp(argv[i], "family");     /* GLM-4.5-Air / DeepSeek-V3 (not part of all) */
        bool all = !strcmp(argv[i], "all");
        flash |= !strcmp(argv[i], "flash");
        int4 |= !strcmp(argv[i], "int4"); /* the INT4 paths table alone (also part of ops) */
        fused |= !strcmp(argv[i], "elementwise"); /* the elementwise table alone (part of ops) */
        sweep |= !strcmp(argv[i], "wgemv");       /* matmul_wgemv plans (not part of all) */
        xgemv |= !strcmp(argv[i], "xgemv"); /* matmul_w4gemv / w8gemv plans (not part of all) */
        attn |= !strcmp(argv[i], "attn");   /* the decode attention table alone */
        attnprof |= !strcmp(argv[i], "attnprof");   /* 4 single launches, for ncu */
        attnsplit |= !strcmp(argv[i], "attnsplit"); /* decode attention by split target */
        attnbf |= !strcmp(argv[i], "attnbf");       /* bf16-KV attention by variant */
        ctxscale |= !strcmp(argv[i], "ctxscale");   /* decode steps at 1k / 8k / 32k context */
        moe |= !strcmp(argv[i], "moe");   /* the Qwen3-30B-A3B decode table (not part of all) */
        gemm |= !strcmp(argv[i], "gemm"); /* prefill FP8 GEMM sweep (not part of all) */
        prefops |= !strcmp(argv[i], "prefops"); /* the prefill layer op by op (not part of all) */
        ops |= all || !strcmp(argv[i], "ops");
        decode |= all || !strcmp(argv[i], "decode");
        prefill |= all || !strcmp(argv[i], "prefill");
    }
    if (backend_cuda_create(0, &be) != PD_OK) {
        printf("no CUDA device: GPU benchmark skipped\n");
        return 77;
    }
    stream = backend_cuda_stream(be);
    /* attention_target_blocks for every table (A / B of the split policy; > 0 also turns off
     * the bf16 KV split at batch 64, kernels/attention.cu attention_splits) */
    if (getenv("GPU_BENCH_ATTN_TARGET"))
        attention_target_blocks = atoi(getenv("GPU_BENCH_ATTN_TARGET"));
    if (getenv("PD_BENCH_SILU_V1")) /* session 6: 1 = session 5's bf16 silu kernel ("before") */
        elementwise_silu_bf16_v1 = atoi(getenv("PD_BENCH_SILU_V1"));
    if (getenv("PD_BENCH_SILU_FAST")) /* 1 = the 16-byte kernel with __expf / __fdividef */
        elementwise_silu_bf16_fast = atoi(getenv("PD_BENCH_SILU_FAST"));
    const char *keep_env = getenv("PD_CUDA_BF16_GEMM");
    setenv("PD_CUDA_BF16_GEMM", "split", 1);
    ok(backend_cuda_create(0, &be_split), "split backend");
    if (keep_env)
        setenv("PD_CUDA_BF16_GEMM", keep_env, 1);
    else
        unsetenv("PD_CUDA_BF16_GEMM");
    stream_split = backend_cuda_stream(be_split);
    if (ops)
        bench_ops();
    else if (int4)
        bench_int4_paths();
    if (fused && !ops) {
        row_header();
        bench_elementwise(64);
        bench_elementwise(8192);
    }
    if (sweep)
        bench_wgemv_sweep();
    if (w4mma)
        bench_int4_mma2();
    if (w4wg)
        bench_w4wg();
    if (w8wg)
        bench_w8wg();
    if (qkvgroup)
        bench_qkvgroup();
    if (ksplit)
        bench_ksplit();
    if (sample)
        bench_sample();
    if (xgemv) {
        const char *kx = getenv("PD_CUDA_XGEMV");
        char keep_x[16] = "";
        if (kx)
            snprintf(keep_x, sizeof keep_x, "%s", kx);
        setenv("PD_CUDA_XGEMV", "0", 1);
        ok(backend_cuda_create(0, &be_old), "session-4 routing backend");
        if (kx)
            setenv("PD_CUDA_XGEMV", keep_x, 1);
        else
            unsetenv("PD_CUDA_XGEMV");
        stream_old = backend_cuda_stream(be_old);
        bench_xgemv();
        backend_destroy(be_old);
        be_old = NULL;
    }
    if (flash) { /* the prefill kernels alone (variants; for ncu) */
        row_header();
        bench_flash(PD_KV_BF16, 1, 8192, 8192, 0);
        bench_flash(PD_KV_FP8, 1, 8192, 8192, 0);
        bench_flash(PD_KV_BF16, 16, 512, 512, 0);
        bench_matmul(PD_WFMT_FP8, 8192, 14336, 4096);
    }
    if (gemm)
        bench_gemm_sweep();
    if (prefops)
        bench_prefill_ops();
    if (attn)
        bench_attn_decode();
    if (attnsplit)
        bench_attn_split();
    if (attnbf)
        bench_attn_bf16();
    if (attnprof) { /* one launch each of the tensor-core kernel, for ncu */
        time_warm = 0;
        bench_attention_on(PD_KV_FP8, 64, 1024, 1);
        bench_attention_on(PD_KV_FP8, 1, 32768, 1);
        bench_attention_on(PD_KV_BF16, 64, 1024, 1);
        bench_attention_on(PD_KV_BF16, 1, 32768, 1);
    }
    if (decode || prefill)
        bench_model(decode, prefill);
    if (ctxscale)
        bench_ctxscale();
    if (family) {
        const char *fl = getenv("PD_BENCH_FAMILY_LAYERS"), *fp = getenv("PD_BENCH_FAMILY_PREFILL");
        bench_family(fl ? atoi(fl) : 2, fp ? atoi(fp) : 2048);
    }
    if (moe)
        bench_moe();
    if (stepprof)
        bench_stepprof();
    backend_destroy(be_split);
    backend_destroy(be);
    if (prof_fail)
        fprintf(stderr, "stepprof: CUPTI could not record (see above)\n");
    return graph_fail || prof_fail;
}
