/* tests/gpu/kernels: every op of the backend table on the CUDA backend against the CPU backend
 * (the oracle), on fresh random inputs (seeded from the clock unless PD_TEST_SEED is set; never
 * zeros), with poisoned outputs (NaN / 0xff bytes), per-op tolerances, on the fixtures' shapes
 * (hidden 512, 4 heads / 2 KV heads, head_dim 128) and Llama-3-8B's (hidden 4096, 32 / 8 heads,
 * FFN 14336), and for the GLM-4.5 / DeepSeek-V3 ops the fixtures' and Kimi K2's shapes.
 * Prints one line per case: op, shape, max error, tolerance, PASS/FAIL.
 * PD_GPU_TEST_ATTN=1 runs only the decode attention and fused RoPE + KV write cases;
 * PD_GPU_TEST_FAMILY=1 only the GLM-4.5 / DeepSeek-V3 cases (family ops, FP8 block-scaled matmul;
 *   their decode steps in graphs on tiny-glm / tiny-dsv3: case_family_graphs);
 * PD_GPU_TEST_PREFILL=1 only the prefill FP8 MLP op (matmul_silu_fp8) and FP8 GEMM cases;
 * PD_GPU_TEST_MMA2=1 only the matmul_int4_mma2 cases;
 * PD_GPU_TEST_W4WG=1 only the matmul_w4wg (wgmma INT4 GEMM) cases and the grouped matmul ones
 * (matmul_group: matmul_w4gemv_group, matmul_w4wg_group);
 * PD_GPU_TEST_XGEMV=1 only the matmul_w4gemv / matmul_w8gemv cases and the default-routing
 * matmul cases that run on them;
 * PD_GPU_TEST_FUSED=1 only the matmul_fused cases (the slice GEMV with the decode layer's norm,
 * SiLU·mul and residual add folded in);
 * PD_GPU_TEST_SAMPLE=1 only the sampling and logprobs cases (sample_run, sample_logprobs_run);
 * PD_GPU_TEST_W8WG=1 only the matmul_w8wg (wgmma + TMA FP8 GEMM) cases.
 * PD_GPU_TEST_FP8CL=1 only matmul_fp8_mma's cases with its K splits added in clusters.
 * Exits 77 (meson: SKIP) when there is no CUDA device, 1 when a case fails.
 * Errors are max |gpu - cpu| / max |cpu| over the output, or a count of differing bytes / ids
 * where the two must agree exactly; flash attention (bf16 tensor cores) is checked per element
 * against each (row, head) vector's size (err_f32_vec) and in l2. BF16 GEMMs run on the default
 * backend (one bf16 GEMM) and on a second one with PD_CUDA_BF16_GEMM=split (hi + lo, near f32).
 * Whole-pipeline cases: model_forward_sample with graphs on tiny-llama (PD_MODELS_DIR, else
 * deploy/models) against the host sampler on the same step's logits; the grouped MoE path
 * (moe_prepare) per element and replayed from a CUDA graph.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "attention.h"
#include "backend.h"
#include "backend_cuda.h"
#include "dtype.h"
#include "elementwise.h"
#include "family.h"
#include "kv.h"
#include "kv_digest.h"
#include "kv_pool.h"
#include "log.h"
#include "matmul.h"
#include "model.h"
#include "moe.h"
#include "quant.h"
#include "sample.h"
#include "sampler.h"

static pd_backend_t *cpu, *gpu;
static pd_backend_t *gpu_split; /* a second CUDA backend with PD_CUDA_BF16_GEMM=split */
static uint64_t rng_state;
static int n_fail, n_cases;
static bool small_only; /* PD_GPU_TEST_SMALL=1: fixture shapes only (for compute-sanitizer) */

/* ==== helpers ==== */

static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* uniform in [-1, 1), never exactly 0 */
static float rng_float(void)
{
    float f = (float)((rng_next() >> 40) & 0xffffff) / 8388608.0f - 1.0f;
    return f == 0.0f ? 0.5f : f;
}

static void fill_f32(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rng_float() * scale;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    PD_ASSERT(p);
    return p;
}

/* A buffer on both backends. */
typedef struct {
    void *c, *g;
    size_t bytes;
} pair_t;

static void pair_ok(pd_status_t st)
{
    if (st != PD_OK) {
        fprintf(stderr, "kernels: backend call failed: %s\n", pd_status_str(st));
        exit(1);
    }
}

static pair_t pair_new(size_t bytes, const void *host)
{
    pair_t p = {NULL, NULL, bytes};
    pair_ok(cpu->ops->alloc(cpu, bytes, &p.c));
    pair_ok(gpu->ops->alloc(gpu, bytes, &p.g));
    if (host) {
        pair_ok(cpu->ops->upload(cpu, p.c, host, bytes));
        pair_ok(gpu->ops->upload(gpu, p.g, host, bytes));
    } else { /* poison */
        pair_ok(cpu->ops->memset(cpu, p.c, 0xff, bytes));
        pair_ok(gpu->ops->memset(gpu, p.g, 0xff, bytes));
    }
    return p;
}

static void pair_free(pair_t *p)
{
    cpu->ops->free(cpu, p->c);
    gpu->ops->free(gpu, p->g);
}

/* Downloads both sides (host copies, caller frees). */
static void pair_get(const pair_t *p, void **c_p, void **g_p)
{
    *c_p = xmalloc(p->bytes);
    *g_p = xmalloc(p->bytes);
    pair_ok(cpu->ops->sync(cpu));
    pair_ok(gpu->ops->sync(gpu));
    pair_ok(cpu->ops->download(cpu, *c_p, p->c, p->bytes));
    pair_ok(gpu->ops->download(gpu, *g_p, p->g, p->bytes));
}

/* max |g - c| / max |c| over n floats; NaN anywhere -> INFINITY */
static double err_f32(const pair_t *p, size_t n)
{
    float *c, *g;
    double num = 0.0, den = 0.0;
    pair_get(p, (void **)&c, (void **)&g);
    for (size_t i = 0; i < n; i++) {
        if (isnan(c[i]) || isnan(g[i])) {
            num = INFINITY;
            break;
        }
        num = fmax(num, fabs((double)g[i] - c[i]));
        den = fmax(den, fabs((double)c[i]));
    }
    free(c);
    free(g);
    return den > 0.0 ? num / den : num;
}

/* differing bytes */
static double err_bytes(const pair_t *p)
{
    uint8_t *c, *g;
    size_t bad = 0;
    pair_get(p, (void **)&c, (void **)&g);
    for (size_t i = 0; i < p->bytes; i++)
        bad += c[i] != g[i];
    free(c);
    free(g);
    return (double)bad;
}

/* ||g - c||_2 / ||c||_2 over n floats (for chained fp8 ops, where one activation rounding flip
 * shows up as a large element-wise error); NaN anywhere -> INFINITY */
static double err_f32_l2(const pair_t *p, size_t n)
{
    float *c, *g;
    double num = 0.0, den = 0.0;
    pair_get(p, (void **)&c, (void **)&g);
    for (size_t i = 0; i < n; i++) {
        if (isnan(c[i]) || isnan(g[i])) {
            num = INFINITY;
            break;
        }
        num += ((double)g[i] - c[i]) * ((double)g[i] - c[i]);
        den += (double)c[i] * c[i];
    }
    free(c);
    free(g);
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* Per-element error of n_vec vectors of len floats (attention: one vector per (row, head)):
 * max over elements of |g - c| / (|c| + rms(c over the element's vector)). An element may be
 * near zero, so each is measured against its own size plus its vector's typical size; NaN
 * anywhere -> INFINITY. */
static double err_f32_vec(const pair_t *p, size_t n_vec, size_t len)
{
    float *c, *g;
    double worst = 0.0;
    pair_get(p, (void **)&c, (void **)&g);
    for (size_t v = 0; v < n_vec && worst != INFINITY; v++) {
        const float *cv = c + v * len, *gv = g + v * len;
        double ss = 0.0;
        for (size_t i = 0; i < len; i++)
            ss += (double)cv[i] * cv[i];
        const double rms = sqrt(ss / (double)len) + 1e-30;
        for (size_t i = 0; i < len; i++) {
            if (isnan(cv[i]) || isnan(gv[i])) {
                worst = INFINITY;
                break;
            }
            worst = fmax(worst, fabs((double)gv[i] - cv[i]) / (fabs((double)cv[i]) + rms));
        }
    }
    free(c);
    free(g);
    return worst;
}

static void report(const char *op, const char *shape, double err, double tol)
{
    bool ok = err <= tol;
    n_cases++;
    n_fail += !ok;
    printf("%-12s %-44s %11.3e %9.1e  %s\n", op, shape, err, tol, ok ? "PASS" : "FAIL");
    fflush(stdout);
}

/* ==== cases ==== */

/* A random weight (N, K) (bf16 values rng_float() * 0.05 from the case's seed) quantized to fmt
 * and uploaded to the CPU backend (wc) and to the CUDA backend g (wg); the host copy in host
 * (model_host_weight_free). */
static void weight_host_new(pd_wfmt_t fmt, int64_t N, int64_t K, pd_backend_t *g, pd_weight_t *host,
                            pd_weight_t *wc, pd_weight_t *wg)
{
    uint16_t *src = xmalloc((size_t)(N * K) * 2);
    for (int64_t i = 0; i < N * K; i++)
        src[i] = pd_f32_to_bf16(rng_float() * 0.05f);
    pair_ok(model_quantize_bf16(src, N, K, fmt, host));
    free(src);
    pair_ok(backend_weight_upload(cpu, host, wc));
    pair_ok(backend_weight_upload(g, host, wg));
}

static void case_embed(int vocab, int d, int n)
{
    char shape[96];
    uint16_t *table = xmalloc((size_t)vocab * d * 2);
    int32_t *ids = xmalloc((size_t)n * 4);
    for (size_t i = 0; i < (size_t)vocab * d; i++)
        table[i] = pd_f32_to_bf16(rng_float());
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(rng_next() % (uint64_t)vocab);
    pair_t t = pair_new((size_t)vocab * d * 2, table), id = pair_new((size_t)n * 4, ids);
    pair_t out = pair_new((size_t)n * d * 4, NULL);
    cpu->ops->embed(cpu, out.c, t.c, id.c, n, d);
    gpu->ops->embed(gpu, out.g, t.g, id.g, n, d);
    snprintf(shape, sizeof shape, "vocab %d d %d n %d", vocab, d, n);
    report("embed", shape, err_f32(&out, (size_t)n * d), 0.0);
    pair_free(&t);
    pair_free(&id);
    pair_free(&out);
    free(table);
    free(ids);
}

static void case_rmsnorm(int n, int d, bool in_place)
{
    char shape[96];
    float *x = xmalloc((size_t)n * d * 4);
    uint16_t *w = xmalloc((size_t)d * 2);
    fill_f32(x, (size_t)n * d, 3.0f);
    for (int i = 0; i < d; i++)
        w[i] = pd_f32_to_bf16(rng_float() + 1.5f);
    pair_t px = pair_new((size_t)n * d * 4, x), pw = pair_new((size_t)d * 2, w);
    pair_t out = in_place ? px : pair_new((size_t)n * d * 4, NULL);
    cpu->ops->rmsnorm(cpu, out.c, px.c, pw.c, n, d, 1e-5f);
    gpu->ops->rmsnorm(gpu, out.g, px.g, pw.g, n, d, 1e-5f);
    snprintf(shape, sizeof shape, "n %d d %d%s", n, d, in_place ? " in place" : "");
    report("rmsnorm", shape, err_f32(&out, (size_t)n * d), 1e-5);
    if (!in_place)
        pair_free(&out);
    pair_free(&px);
    pair_free(&pw);
    free(x);
    free(w);
}

static void case_add(size_t n)
{
    char shape[96];
    float *x = xmalloc(n * 4), *y = xmalloc(n * 4);
    fill_f32(x, n, 2.0f);
    fill_f32(y, n, 2.0f);
    pair_t px = pair_new(n * 4, x), py = pair_new(n * 4, y);
    cpu->ops->add(cpu, px.c, py.c, n);
    gpu->ops->add(gpu, px.g, py.g, n);
    snprintf(shape, sizeof shape, "n %zu", n);
    report("add", shape, err_f32(&px, n), 0.0);
    pair_free(&px);
    pair_free(&py);
    free(x);
    free(y);
}

static void case_rope(int n, int heads, int hd, int max_pos)
{
    char shape[96];
    float *x = xmalloc((size_t)n * heads * hd * 4), *inv = xmalloc((size_t)hd / 2 * 4);
    int32_t *pos = xmalloc((size_t)n * 4);
    fill_f32(x, (size_t)n * heads * hd, 2.0f);
    for (int j = 0; j < hd / 2; j++)
        inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    for (int i = 0; i < n; i++)
        pos[i] = (int32_t)(rng_next() % (uint64_t)max_pos);
    pair_t px = pair_new((size_t)n * heads * hd * 4, x), pp = pair_new((size_t)n * 4, pos);
    pair_t pi = pair_new((size_t)hd / 2 * 4, inv);
    cpu->ops->rope(cpu, px.c, pp.c, pi.c, n, heads, hd);
    gpu->ops->rope(gpu, px.g, pp.g, pi.g, n, heads, hd);
    snprintf(shape, sizeof shape, "n %d heads %d hd %d pos<%d", n, heads, hd, max_pos);
    report("rope", shape, err_f32(&px, (size_t)n * heads * hd), 2e-5);
    pair_free(&px);
    pair_free(&pp);
    pair_free(&pi);
    free(x);
    free(inv);
    free(pos);
}

static void case_silu_mul(int n, int f)
{
    char shape[96];
    float *gu = xmalloc((size_t)n * 2 * f * 4);
    fill_f32(gu, (size_t)n * 2 * f, 6.0f);
    pair_t pg = pair_new((size_t)n * 2 * f * 4, gu), out = pair_new((size_t)n * f * 4, NULL);
    cpu->ops->silu_mul(cpu, out.c, pg.c, n, f);
    gpu->ops->silu_mul(gpu, out.g, pg.g, n, f);
    snprintf(shape, sizeof shape, "n %d f %d", n, f);
    report("silu_mul", shape, err_f32(&out, (size_t)n * f), 1e-6);
    pair_free(&pg);
    pair_free(&out);
    free(gu);
}

/* ---- fused ops (add_rmsnorm, silu_mul_fp8, matmul_fp8) ---- */

/* Checks fp8 activations (n rows of len) q / qs of both backends against each other, per element:
 * the decoded values q * s may differ by one fp8 step where the f32 values the two backends
 * quantized (equal to ~1e-6) straddle a rounding midpoint: |g - c| <= 2^-3 |c| + 2^-9 s (one
 * e4m3 step, or one subnormal step) on every element, at most 1e-3 of the bytes differing, and the
 * scales within 1e-5. Then (exact) the GPU's bytes against matmul_quant_act_fp8 applied on the
 * GPU to ref_g (n, len) f32 (what the unfused FP8 matmul makes of the same values), when given. */
static void check_act_fp8(const char *op, const char *shape, const pair_t *q, const pair_t *qs,
                          int n, int len, const float *ref_g)
{
    uint8_t *qc, *qg;
    float *sc, *sg;
    char what[128];
    pair_get(q, (void **)&qc, (void **)&qg);
    pair_get(qs, (void **)&sc, (void **)&sg);
    double worst = 0.0, sworst = 0.0;
    size_t ndiff = 0;
    for (int i = 0; i < n; i++) {
        sworst = fmax(sworst, isnan(sg[i]) ? INFINITY : fabs(sg[i] - sc[i]) / sc[i]);
        for (int j = 0; j < len; j++) {
            const size_t e = (size_t)i * len + j;
            const double c = pd_fp8_to_f32(qc[e]) * (double)sc[i];
            const double g = pd_fp8_to_f32(qg[e]) * (double)sg[i];
            const double bound = 0.125 * fabs(c) + 0x1p-9 * sc[i] + 1e-30;
            worst = fmax(worst, isnan(g) ? INFINITY : fabs(g - c) / bound);
            ndiff += qc[e] != qg[e];
        }
    }
    snprintf(what, sizeof what, "%s scales", shape);
    report(op, what, sworst, 1e-5);
    snprintf(what, sizeof what, "%s q per element", shape);
    report(op, what, worst, 1.0);
    snprintf(what, sizeof what, "%s q bytes != cpu", shape);
    report(op, what, (double)ndiff / ((double)n * len), 1e-3);
    if (ref_g) {
        void *b = NULL;
        const size_t qb = ((size_t)n * len + 255) / 256 * 256;
        pair_ok(gpu->ops->alloc(gpu, qb + (size_t)n * 4, &b));
        pair_ok(gpu->ops->memset(gpu, b, 0xff, qb + (size_t)n * 4));
        pair_ok(matmul_quant_act_fp8(b, NULL, (float *)((uint8_t *)b + qb), ref_g, n, len,
                                     backend_cuda_stream(gpu)));
        uint8_t *rq = xmalloc(qb + (size_t)n * 4);
        pair_ok(gpu->ops->sync(gpu));
        pair_ok(gpu->ops->download(gpu, rq, b, qb + (size_t)n * 4));
        size_t nd = memcmp(rq + qb, sg, (size_t)n * 4) != 0;
        for (size_t e = 0; e < (size_t)n * len; e++)
            nd += rq[e] != qg[e];
        snprintf(what, sizeof what, "%s == quant_act_fp8", shape);
        report(op, what, (double)nd, 0.0);
        free(rq);
        gpu->ops->free(gpu, b);
    }
    free(qc);
    free(qg);
    free(sc);
    free(sg);
}

/* add_rmsnorm at a fixed printed seed: x (n, d) += y (when add), out = rmsnorm(x) * w (when
 * with_out), q = fp8 of out (when quant). Outputs poisoned. Checks x (exact: one f32 add), out
 * per element (|g - c| <= 1e-5 |c| + 1e-6 rms: only the sum of squares is summed in another
 * order) and q (check_act_fp8). generic: the any-length kernel (elementwise_force_generic). */
static void case_add_rmsnorm(int n, int d, bool add, bool with_out, bool quant, bool generic,
                             uint64_t seed)
{
    char shape[96];
    const uint64_t saved = rng_state;
    rng_state = seed;
    float *x = xmalloc((size_t)n * d * 4), *y = xmalloc((size_t)n * d * 4);
    uint16_t *w = xmalloc((size_t)d * 2);
    fill_f32(x, (size_t)n * d, 3.0f);
    fill_f32(y, (size_t)n * d, 2.0f);
    for (int i = 0; i < n; i++) /* rows of different sizes */
        for (int j = 0; j < d; j++)
            x[(size_t)i * d + j] *= (float)(1 + i % 5);
    for (int i = 0; i < d; i++)
        w[i] = pd_f32_to_bf16(rng_float() + 1.5f);
    pair_t px = pair_new((size_t)n * d * 4, x), py = pair_new((size_t)n * d * 4, y);
    pair_t pw = pair_new((size_t)d * 2, w), out = pair_new((size_t)n * d * 4, NULL);
    pair_t q = pair_new((size_t)n * d, NULL), qs = pair_new((size_t)n * 4, NULL);
    pd_act_fp8_t qc = {q.c, qs.c, false, false, false}, qg = {q.g, qs.g, false, false, false};
    elementwise_force_generic = generic;
    cpu->ops->add_rmsnorm(cpu, px.c, add ? py.c : NULL, with_out ? out.c : NULL, pw.c, n, d, 1e-5f,
                          quant ? &qc : NULL);
    gpu->ops->add_rmsnorm(gpu, px.g, add ? py.g : NULL, with_out ? out.g : NULL, pw.g, n, d, 1e-5f,
                          quant ? &qg : NULL);
    pair_ok(gpu->ops->sync(gpu));
    elementwise_force_generic = 0;
    snprintf(shape, sizeof shape, "n %d d %d%s%s%s%s seed %llu", n, d, add ? " +y" : "",
             with_out ? " out" : "", quant ? " fp8" : "", generic ? " generic" : "",
             (unsigned long long)seed);
    report("add_rmsnorm", shape, err_f32(&px, (size_t)n * d), 0.0);
    if (with_out) {
        float *c, *g;
        pair_get(&out, (void **)&c, (void **)&g);
        double worst = 0.0;
        for (int i = 0; i < n; i++) {
            double rms = 0.0;
            for (int j = 0; j < d; j++)
                rms += (double)c[(size_t)i * d + j] * c[(size_t)i * d + j];
            rms = sqrt(rms / d);
            for (int j = 0; j < d; j++) {
                const size_t e = (size_t)i * d + j;
                const double bound = 1e-5 * fabs(c[e]) + 1e-6 * rms + 1e-30;
                worst = fmax(worst, isnan(g[e]) ? INFINITY : fabs((double)g[e] - c[e]) / bound);
            }
        }
        report("add_rmsnorm", "  out per element", worst, 1.0);
        free(c);
        free(g);
    }
    if (quant)
        check_act_fp8("add_rmsnorm", "  ", &q, &qs, n, d, with_out ? out.g : NULL);
    pair_free(&px);
    pair_free(&py);
    pair_free(&pw);
    pair_free(&out);
    pair_free(&q);
    pair_free(&qs);
    free(x);
    free(y);
    free(w);
    rng_state = saved;
}

/* silu_mul_fp8 at a fixed printed seed: out (when with_out) per element against the CPU
 * (|g - c| <= 1e-6 |c| + 1e-7 max|c|: expf may differ by an ulp), q by check_act_fp8. */
static void case_silu_mul_fp8(int n, int f, bool with_out, bool generic, uint64_t seed)
{
    char shape[96];
    const uint64_t saved = rng_state;
    rng_state = seed;
    float *gu = xmalloc((size_t)n * 2 * f * 4);
    fill_f32(gu, (size_t)n * 2 * f, 6.0f);
    pair_t pg = pair_new((size_t)n * 2 * f * 4, gu), out = pair_new((size_t)n * f * 4, NULL);
    pair_t q = pair_new((size_t)n * f, NULL), qs = pair_new((size_t)n * 4, NULL);
    pd_act_fp8_t qc = {q.c, qs.c, false, false, false}, qg = {q.g, qs.g, false, false, false};
    elementwise_force_generic = generic;
    cpu->ops->silu_mul_fp8(cpu, with_out ? out.c : NULL, pg.c, n, f, &qc);
    gpu->ops->silu_mul_fp8(gpu, with_out ? out.g : NULL, pg.g, n, f, &qg);
    pair_ok(gpu->ops->sync(gpu));
    elementwise_force_generic = 0;
    snprintf(shape, sizeof shape, "n %d f %d%s%s seed %llu", n, f, with_out ? " out" : "",
             generic ? " generic" : "", (unsigned long long)seed);
    if (with_out) {
        float *c, *g;
        pair_get(&out, (void **)&c, (void **)&g);
        double worst = 0.0, mx = 0.0;
        for (size_t e = 0; e < (size_t)n * f; e++)
            mx = fmax(mx, fabs(c[e]));
        for (size_t e = 0; e < (size_t)n * f; e++) {
            const double bound = 1e-6 * fabs(c[e]) + 1e-7 * mx + 1e-30;
            worst = fmax(worst, isnan(g[e]) ? INFINITY : fabs((double)g[e] - c[e]) / bound);
        }
        report("silu_mul_fp8", shape, worst, 1.0);
        free(c);
        free(g);
    }
    check_act_fp8("silu_mul_fp8", with_out ? "  " : shape, &q, &qs, n, f, with_out ? out.g : NULL);
    pair_free(&pg);
    pair_free(&out);
    pair_free(&q);
    pair_free(&qs);
    free(gu);
    rng_state = saved;
}

/* The SiLU·mul + FP8 cases (fixed seeds 211..): register kernels, the generic one, odd lengths,
 * with and without the f32 output; the 8B width (not small_only), at batch 1 too (the FP8
 * decode step's shape). */
static void cases_silu_mul_fp8(void)
{
    case_silu_mul_fp8(37, 1024, true, false, 211);
    case_silu_mul_fp8(37, 1024, true, true, 212);
    case_silu_mul_fp8(5, 300, true, false, 213);
    case_silu_mul_fp8(3, 1024, false, false, 214);
    if (small_only)
        return;
    case_silu_mul_fp8(64, 14336, true, false, 215);
    case_silu_mul_fp8(300, 14336, false, false, 216);
    case_silu_mul_fp8(64, 14336, true, true, 217);
    case_silu_mul_fp8(1, 14336, false, false, 218);
    case_silu_mul_fp8(1, 14336, true, false, 219);
}

/* matmul_fp8 (pre-quantized activations) at a fixed printed seed: x (n, K) f32 with tokens of
 * different magnitudes is quantized on the host (quant_fp8_vec) for the CPU and by
 * matmul_quant_act_fp8 on the GPU; checks (1) the GPU's matmul_fp8 against its own matmul on the
 * f32 x: bit-identical (the same kernels on the same fp8 values), (2) against the CPU backend's
 * matmul_fp8 per element: |g - c| <= 3e-4 sum_k |xq_k w_k| (f32 accumulation order, as
 * case_mma_gemm), (3) max |g - c| / max |c| <= 2e-3 as the FP8 matmul cases. */
static void case_matmul_fp8(int n, int64_t N, int64_t K, uint64_t seed, const char *what)
{
    char shape[128];
    const uint64_t saved = rng_state;
    rng_state = seed;
    pd_weight_t host, wc, wg;
    weight_host_new(PD_WFMT_FP8, N, K, gpu, &host, &wc, &wg);
    float *x = xmalloc((size_t)n * K * 4), *xs = xmalloc((size_t)n * 4);
    uint8_t *xq = xmalloc((size_t)n * K);
    fill_f32(x, (size_t)n * K, 1.0f);
    for (int t = 0; t < n; t++)
        for (int64_t k = 0; k < K; k++)
            x[(size_t)t * K + k] *= (float)(1 << (t % 9)) / 16.0f;
    for (int t = 0; t < n; t++)
        xs[t] = quant_fp8_vec(xq + (size_t)t * K, x + (size_t)t * K, K);
    pair_t px = pair_new((size_t)n * K * 4, x), pq = pair_new((size_t)n * K, xq);
    pair_t ps = pair_new((size_t)n * 4, xs);
    pair_t out = pair_new((size_t)n * N * 4, NULL), ref = pair_new((size_t)n * N * 4, NULL);
    /* GPU: quantize on the device into pq.g / ps.g (overwriting the host copy) */
    pair_ok(matmul_quant_act_fp8(pq.g, NULL, ps.g, px.g, n, K, backend_cuda_stream(gpu)));
    pd_act_fp8_t ac = {pq.c, ps.c, false, false, false}, ag = {pq.g, ps.g, false, false, false};
    cpu->ops->matmul_fp8(cpu, out.c, &ac, &wc, n);
    gpu->ops->matmul_fp8(gpu, out.g, &ag, &wg, n);
    gpu->ops->matmul(gpu, ref.g, px.g, &wg, n);
    pair_ok(gpu->ops->sync(gpu));
    float *g = xmalloc((size_t)n * N * 4), *c = xmalloc((size_t)n * N * 4),
          *r = xmalloc((size_t)n * N * 4), *wrow = xmalloc((size_t)K * 4);
    pair_ok(gpu->ops->download(gpu, g, out.g, (size_t)n * N * 4));
    pair_ok(gpu->ops->download(gpu, r, ref.g, (size_t)n * N * 4));
    pair_ok(cpu->ops->download(cpu, c, out.c, (size_t)n * N * 4));
    size_t nd = 0;
    for (size_t e = 0; e < (size_t)n * N; e++)
        nd += memcmp(&g[e], &r[e], 4) != 0;
    snprintf(shape, sizeof shape, "%s n %d N %lld K %lld seed %llu", what, n, (long long)N,
             (long long)K, (unsigned long long)seed);
    report("matmul_fp8", shape, (double)nd, 0.0);
    report("matmul_fp8", "  max err vs cpu", err_f32(&out, (size_t)n * N), 2e-3);
    int64_t stride = (int64_t)((double)n * N * K / 2e8) + 1;
    double worst = 0.0;
    for (int64_t row = 0; row < N; row += stride) {
        quant_dequant_row(wrow, &host, row);
        for (int t = 0; t < n; t++) {
            double bound = 0.0;
            for (int64_t k = 0; k < K; k++)
                bound += fabs((double)pd_fp8_to_f32(xq[(size_t)t * K + k]) * xs[t] * wrow[k]);
            const float v = g[(size_t)t * N + row];
            const double e = isnan(v)
                                 ? INFINITY
                                 : fabs(v - (double)c[(size_t)t * N + row]) / (3e-4 * bound + 1e-6);
            worst = e > worst ? e : worst;
        }
    }
    snprintf(shape, sizeof shape, "  per element (rows/%lld)", (long long)stride);
    report("matmul_fp8", shape, worst, 1.0);
    free(g);
    free(c);
    free(r);
    free(wrow);
    pair_free(&px);
    pair_free(&pq);
    pair_free(&ps);
    pair_free(&out);
    pair_free(&ref);
    free(x);
    free(xs);
    free(xq);
    model_host_weight_free(&host);
    backend_weight_free(cpu, &wc);
    backend_weight_free(gpu, &wg);
    rng_state = saved;
}

/* matmul_silu_fp8 (gate_up GEMM + silu·mul + fp8) at a fixed printed seed, FP8 gate_up weight
 * (2f, K), the same host-quantized activations (quant_fp8_vec) on both backends, outputs
 * poisoned; in_place: q written over x's own buffers (as the model calls it; x's buffer holds
 * n * max(K, f) bytes). Checks (1) the CPU op equals the plain CPU ops in sequence (matmul_fp8,
 * silu_mul_fp8) bit for bit; (2) the GPU's gate_up product, which the CUDA backend leaves in the
 * scratch gu (bf16 where it takes the cuBLASLt path: n > 8, 2f and K % 16 == 0; else f32),
 * against the CPU's f32 product per element as case_matmul_fp8 does: |g - c| <= 3e-4 sum_k
 * |xq_k w_k| (f32 summation order / the fp8 tensor cores' accumulation), + 2^-8 |c| for the
 * bf16 rounding; (3) the GPU's q against the CPU's silu_mul_fp8 of the GPU's own product
 * (widened to f32): check_act_fp8, each element within one fp8 step, scales 1e-5 (only expf
 * may differ). */
static void case_matmul_silu_fp8(int n, int f, int64_t K, bool in_place, uint64_t seed,
                                 const char *what)
{
    char shape[128];
    const uint64_t saved = rng_state;
    rng_state = seed;
    const int64_t N = 2 * (int64_t)f;
    const bool bf16 = n > 8 && N % 16 == 0 && K % 16 == 0; /* the GPU's cuBLASLt path */
    pd_weight_t host, wc, wg;
    weight_host_new(PD_WFMT_FP8, N, K, gpu, &host, &wc, &wg);
    const size_t xb = (size_t)n * (size_t)(in_place && f > K ? f : K);
    float *x = xmalloc((size_t)n * K * 4), *xs = xmalloc((size_t)n * 4);
    uint8_t *xq = xmalloc(xb);
    memset(xq, 0x7e, xb);
    fill_f32(x, (size_t)n * K, 1.0f);
    for (int t = 0; t < n; t++)
        for (int64_t k = 0; k < K; k++)
            x[(size_t)t * K + k] *= (float)(1 << (t % 9)) / 16.0f;
    for (int t = 0; t < n; t++)
        xs[t] = quant_fp8_vec(xq + (size_t)t * K, x + (size_t)t * K, K);
    pair_t pq = pair_new(xb, xq), ps = pair_new((size_t)n * 4, xs);
    pair_t gu = pair_new((size_t)n * N * 4, NULL), gur = pair_new((size_t)n * N * 4, NULL);
    pair_t q = pair_new((size_t)n * f, NULL), qs = pair_new((size_t)n * 4, NULL);
    pair_t q2 = pair_new((size_t)n * f, NULL), qs2 = pair_new((size_t)n * 4, NULL);
    pd_act_fp8_t xc = {pq.c, ps.c, false, false, false}, xg = {pq.g, ps.g, false, false, false};
    pd_act_fp8_t oc = {q.c, qs.c, false, false, false}, og = {q.g, qs.g, false, false, false},
                 oc2 = {q2.c, qs2.c, false, false, false};
    if (in_place)
        og = xg;
    /* CPU: the plain ops (the CPU op's reference; gur.c keeps the f32 product) */
    cpu->ops->matmul_fp8(cpu, gur.c, &xc, &wc, n);
    float *hc = xmalloc((size_t)n * N * 4), *hg = xmalloc((size_t)n * N * 4);
    pair_ok(cpu->ops->sync(cpu));
    pair_ok(cpu->ops->download(cpu, hc, gur.c, (size_t)n * N * 4));
    cpu->ops->silu_mul_fp8(cpu, NULL, gur.c, n, f, &oc2);
    cpu->ops->matmul_silu_fp8(cpu, &oc, gu.c, &xc, &wc, n);
    pair_ok(cpu->ops->sync(cpu));
    snprintf(shape, sizeof shape, "%s n %d f %d K %lld%s seed %llu", what, n, f, (long long)K,
             in_place ? " in place" : "", (unsigned long long)seed);
    { /* (1) CPU op == plain CPU ops */
        uint8_t *a = xmalloc((size_t)n * f), *b = xmalloc((size_t)n * f);
        float *sa = xmalloc((size_t)n * 4), *sb = xmalloc((size_t)n * 4);
        pair_ok(cpu->ops->download(cpu, a, q.c, (size_t)n * f));
        pair_ok(cpu->ops->download(cpu, b, q2.c, (size_t)n * f));
        pair_ok(cpu->ops->download(cpu, sa, qs.c, (size_t)n * 4));
        pair_ok(cpu->ops->download(cpu, sb, qs2.c, (size_t)n * 4));
        size_t nd = memcmp(sa, sb, (size_t)n * 4) != 0;
        for (size_t e = 0; e < (size_t)n * f; e++)
            nd += a[e] != b[e];
        report("matmul_silu", shape, (double)nd, 0.0);
        free(a);
        free(b);
        free(sa);
        free(sb);
    }
    gpu->ops->matmul_silu_fp8(gpu, &og, gu.g, &xg, &wg, n);
    pair_ok(gpu->ops->sync(gpu));
    { /* (2) the GPU's product (bf16 or f32 in the scratch) per element */
        if (bf16) {
            uint16_t *h16 = xmalloc((size_t)n * N * 2);
            pair_ok(gpu->ops->download(gpu, h16, gu.g, (size_t)n * N * 2));
            for (size_t e = 0; e < (size_t)n * N; e++)
                hg[e] = pd_bf16_to_f32(h16[e]);
            free(h16);
        } else {
            pair_ok(gpu->ops->download(gpu, hg, gu.g, (size_t)n * N * 4));
        }
        float *wrow = xmalloc((size_t)K * 4);
        int64_t stride = (int64_t)((double)n * N * K / 2e8) + 1;
        double worst = 0.0;
        for (int64_t r = 0; r < N; r += stride) {
            quant_dequant_row(wrow, &host, r);
            for (int t = 0; t < n; t++) {
                double sum = 0.0;
                for (int64_t k = 0; k < K; k++)
                    sum += fabs((double)pd_fp8_to_f32(xq[(size_t)t * K + k]) * xs[t] * wrow[k]);
                const double c = hc[(size_t)t * N + r], g = hg[(size_t)t * N + r];
                const double bound = 3e-4 * sum + (bf16 ? 0x1p-8 * fabs(c) : 0.0) + 1e-6;
                worst = fmax(worst, isnan(g) ? INFINITY : fabs(g - c) / bound);
            }
        }
        char pw[64];
        snprintf(pw, sizeof pw, "  %s product per element (rows/%lld)", bf16 ? "bf16" : "f32",
                 (long long)stride);
        report("matmul_silu", pw, worst, 1.0);
        free(wrow);
    }
    /* (3) q against the CPU's silu_mul_fp8 of the GPU's product */
    pair_ok(cpu->ops->upload(cpu, gur.c, hg, (size_t)n * N * 4));
    cpu->ops->silu_mul_fp8(cpu, NULL, gur.c, n, f, &oc);
    pair_ok(cpu->ops->sync(cpu));
    if (in_place) { /* the GPU's q / scales live in x's buffers: copy them into q.g / qs.g */
        uint8_t *t = xmalloc((size_t)n * f);
        float *ts = xmalloc((size_t)n * 4);
        pair_ok(gpu->ops->download(gpu, t, pq.g, (size_t)n * f));
        pair_ok(gpu->ops->download(gpu, ts, ps.g, (size_t)n * 4));
        pair_ok(gpu->ops->upload(gpu, q.g, t, (size_t)n * f));
        pair_ok(gpu->ops->upload(gpu, qs.g, ts, (size_t)n * 4));
        free(t);
        free(ts);
    }
    check_act_fp8("matmul_silu", "  q vs cpu silu(gpu product)", &q, &qs, n, f, NULL);
    free(hc);
    free(hg);
    pair_free(&pq);
    pair_free(&ps);
    pair_free(&gu);
    pair_free(&gur);
    pair_free(&q);
    pair_free(&qs);
    pair_free(&q2);
    pair_free(&qs2);
    free(x);
    free(xs);
    free(xq);
    model_host_weight_free(&host);
    backend_weight_free(cpu, &wc);
    backend_weight_free(gpu, &wg);
    rng_state = saved;
}

/* ---- W4A8 activations in 1x128 blocks (kernels/matmul.h's blk layout; session 9) ---- */

static void weight_new(pd_wfmt_t fmt, int64_t n, int64_t k, pd_weight_t *wc, pd_weight_t *wg);

/* Host reference of the blk layout of n rows of x (n, K) f32: q (MATMUL_ACT_BLK_ROWS(n), K), s
 * (rows * K / 128), each block by quant_fp8_vec, pad rows zeros with scale 1 (caller frees). */
static void blk_ref(const float *x, int n, int64_t K, uint8_t **q_p, float **s_p)
{
    const int rows = MATMUL_ACT_BLK_ROWS(n), nkb = (int)(K / 128);
    uint8_t *q = xmalloc((size_t)rows * K);
    float *sc = xmalloc((size_t)rows * nkb * 4);
    memset(q, 0, (size_t)rows * K);
    for (int t = 0; t < rows; t++)
        for (int kb = 0; kb < nkb; kb++)
            sc[matmul_act_blk_at(t, kb, n, nkb)] =
                t < n
                    ? quant_fp8_vec(q + (size_t)t * K + kb * 128, x + (size_t)t * K + kb * 128, 128)
                    : 1.0f;
    *q_p = q;
    *s_p = sc;
}

/* Compares GPU blk activations gq / gs (device) of n rows of K with the host reference rq / rs
 * (blk_ref of the CPU's f32 values, which the GPU's equal to ~1e-6): per element within one fp8
 * step as check_act_fp8 (|g - c| <= 2^-3 |c| + 2^-9 s), at most 1e-3 of the bytes differing,
 * scales within 1e-5, every pad byte 0 and pad scale 1 exactly. */
static void check_blk(const char *op, const char *shape, const void *gq, const void *gs, int n,
                      int64_t K, const uint8_t *rq, const float *rs)
{
    const int rows = MATMUL_ACT_BLK_ROWS(n), nkb = (int)(K / 128);
    uint8_t *q = xmalloc((size_t)rows * K);
    float *sc = xmalloc((size_t)rows * nkb * 4);
    char what[160];
    pair_ok(gpu->ops->sync(gpu));
    pair_ok(gpu->ops->download(gpu, q, gq, (size_t)rows * K));
    pair_ok(gpu->ops->download(gpu, sc, gs, (size_t)rows * nkb * 4));
    double worst = 0.0, sworst = 0.0;
    size_t ndiff = 0, pad_bad = 0;
    for (int t = 0; t < rows; t++)
        for (int kb = 0; kb < nkb; kb++) {
            const size_t si = matmul_act_blk_at(t, kb, n, nkb);
            const double cs = rs[si], g_s = sc[si];
            if (t >= n) {
                pad_bad += g_s != 1.0;
                for (int k = 0; k < 128; k++)
                    pad_bad += q[(size_t)t * K + kb * 128 + k] != 0;
                continue;
            }
            sworst = fmax(sworst, isnan(g_s) ? INFINITY : fabs(g_s - cs) / cs);
            for (int k = 0; k < 128; k++) {
                const size_t e = (size_t)t * K + kb * 128 + k;
                const double c = pd_fp8_to_f32(rq[e]) * cs, g = pd_fp8_to_f32(q[e]) * g_s;
                const double bound = 0.125 * fabs(c) + 0x1p-9 * cs + 1e-30;
                worst = fmax(worst, isnan(g) ? INFINITY : fabs(g - c) / bound);
                ndiff += rq[e] != q[e];
            }
        }
    snprintf(what, sizeof what, "%s blk scales", shape);
    report(op, what, sworst, 1e-5);
    snprintf(what, sizeof what, "%s blk q per element", shape);
    report(op, what, worst, 1.0);
    snprintf(what, sizeof what, "%s blk q bytes != cpu", shape);
    report(op, what, (double)ndiff / ((double)n * K), 1e-3);
    snprintf(what, sizeof what, "%s blk pad rows (zeros, scale 1) wrong", shape);
    report(op, what, (double)pad_bad, 0.0);
    free(q);
    free(sc);
}

/* Whether two device blk activations (n rows of K) are the same bytes, scales included. */
static size_t blk_diff(const void *aq, const void *as, const void *bq, const void *bs, int n,
                       int64_t K)
{
    const size_t qb = (size_t)MATMUL_ACT_BLK_ROWS(n) * K, sb = qb / 128 * 4;
    uint8_t *a = xmalloc(qb + sb), *b = xmalloc(qb + sb);
    pair_ok(gpu->ops->sync(gpu));
    pair_ok(gpu->ops->download(gpu, a, aq, qb));
    pair_ok(gpu->ops->download(gpu, a + qb, as, sb));
    pair_ok(gpu->ops->download(gpu, b, bq, qb));
    pair_ok(gpu->ops->download(gpu, b + qb, bs, sb));
    size_t nd = 0;
    for (size_t e = 0; e < qb + sb; e++)
        nd += a[e] != b[e];
    free(a);
    free(b);
    return nd;
}

/* Device blk buffers for n rows of K, poisoned. */
static void blk_alloc(int n, int64_t K, void **q_p, void **s_p)
{
    const size_t qb = (size_t)MATMUL_ACT_BLK_ROWS(n) * K;
    pair_ok(gpu->ops->alloc(gpu, qb, q_p));
    pair_ok(gpu->ops->alloc(gpu, qb / 128 * 4, s_p));
    pair_ok(gpu->ops->memset(gpu, *q_p, 0xff, qb));
    pair_ok(gpu->ops->memset(gpu, *s_p, 0xff, qb / 128 * 4));
}

/* add_rmsnorm with q->blk at a fixed printed seed (x += y, out and q): (1) q against blk_ref of
 * the CPU's out (check_blk); (2) bit for bit what matmul_quant_act_fp8_blk makes of the GPU's own
 * out; (3) the op without out (as the model calls it) gives the same bytes. generic: the
 * any-length kernel. Rows of different sizes, an all-zero block (row 0, block 0 of x + y). */
static void case_add_rmsnorm_blk(int n, int d, bool generic, uint64_t seed)
{
    char shape[96];
    const uint64_t saved = rng_state;
    rng_state = seed;
    float *x = xmalloc((size_t)n * d * 4), *y = xmalloc((size_t)n * d * 4);
    uint16_t *w = xmalloc((size_t)d * 2);
    fill_f32(x, (size_t)n * d, 3.0f);
    fill_f32(y, (size_t)n * d, 2.0f);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++)
            x[(size_t)i * d + j] *= (float)(1 + i % 5);
    for (int j = 0; j < 128; j++)
        x[j] = -y[j];
    for (int i = 0; i < d; i++)
        w[i] = pd_f32_to_bf16(rng_float() + 1.5f);
    pair_t px = pair_new((size_t)n * d * 4, x), py = pair_new((size_t)n * d * 4, y);
    pair_t pw = pair_new((size_t)d * 2, w), out = pair_new((size_t)n * d * 4, NULL);
    void *gq, *gs, *q2, *s2, *q3, *s3;
    blk_alloc(n, d, &gq, &gs);
    blk_alloc(n, d, &q2, &s2);
    blk_alloc(n, d, &q3, &s3);
    pd_act_fp8_t qg = {gq, gs, true, false, false}, qg3 = {q3, s3, true, false, false};
    elementwise_force_generic = generic;
    cpu->ops->add_rmsnorm(cpu, px.c, py.c, out.c, pw.c, n, d, 1e-5f, NULL);
    gpu->ops->add_rmsnorm(gpu, px.g, py.g, out.g, pw.g, n, d, 1e-5f, &qg);
    pair_ok(gpu->ops->sync(gpu));
    snprintf(shape, sizeof shape, "n %d d %d%s seed %llu", n, d, generic ? " generic" : "",
             (unsigned long long)seed);
    float *c, *g;
    pair_get(&out, (void **)&c, (void **)&g);
    uint8_t *rq;
    float *rs;
    blk_ref(c, n, d, &rq, &rs);
    check_blk("add_rmsnorm", shape, gq, gs, n, d, rq, rs);
    pair_ok(matmul_quant_act_fp8_blk(q2, s2, out.g, n, d, backend_cuda_stream(gpu)));
    report("add_rmsnorm", "  blk == quant_act_fp8_blk(out)", (double)blk_diff(gq, gs, q2, s2, n, d),
           0.0);
    /* without out and without y, on the x the first call left (x + y) */
    gpu->ops->add_rmsnorm(gpu, px.g, NULL, NULL, pw.g, n, d, 1e-5f, &qg3);
    report("add_rmsnorm", "  blk without out == with out", (double)blk_diff(gq, gs, q3, s3, n, d),
           0.0);
    elementwise_force_generic = 0;
    gpu->ops->free(gpu, gq);
    gpu->ops->free(gpu, gs);
    gpu->ops->free(gpu, q2);
    gpu->ops->free(gpu, s2);
    gpu->ops->free(gpu, q3);
    gpu->ops->free(gpu, s3);
    pair_free(&px);
    pair_free(&py);
    pair_free(&pw);
    pair_free(&out);
    free(c);
    free(g);
    free(rq);
    free(rs);
    free(x);
    free(y);
    free(w);
    rng_state = saved;
}

/* silu_mul_fp8 with q->blk at a fixed printed seed: (1) q against blk_ref of the CPU's silu_mul
 * (check_blk); (2) bit for bit matmul_quant_act_fp8_blk of the GPU's own out; (3) without out,
 * the same bytes; (4) the bf16-product kernel (elementwise_silu_mul_fp8_blk on gu16, the
 * prefill path) on a bf16 gu equals the f32 kernel on that gu widened, bit for bit. */
static void case_silu_mul_blk(int n, int f, uint64_t seed)
{
    char shape[96];
    const uint64_t saved = rng_state;
    rng_state = seed;
    const size_t ng = (size_t)n * 2 * f;
    float *gu = xmalloc(ng * 4);
    fill_f32(gu, ng, 6.0f);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < 2 * f; j++)
            gu[(size_t)t * 2 * f + j] *= (float)(1 << (t % 7)) / 8.0f;
    for (int j = 0; j < 128; j++) /* row 0, block 0: silu(0) * u = 0 */
        gu[j] = 0.0f;
    pair_t pg = pair_new(ng * 4, gu), out = pair_new((size_t)n * f * 4, NULL);
    void *gq, *gs, *q2, *s2, *q3, *s3;
    blk_alloc(n, f, &gq, &gs);
    blk_alloc(n, f, &q2, &s2);
    blk_alloc(n, f, &q3, &s3);
    pd_act_fp8_t qg = {gq, gs, true, false, false}, qg3 = {q3, s3, true, false, false};
    cudaStream_t st = backend_cuda_stream(gpu);
    cpu->ops->silu_mul(cpu, out.c, pg.c, n, f);
    gpu->ops->silu_mul_fp8(gpu, out.g, pg.g, n, f, &qg);
    pair_ok(gpu->ops->sync(gpu));
    snprintf(shape, sizeof shape, "n %d f %d seed %llu", n, f, (unsigned long long)seed);
    float *c, *g;
    pair_get(&out, (void **)&c, (void **)&g);
    uint8_t *rq;
    float *rs;
    blk_ref(c, n, f, &rq, &rs);
    check_blk("silu_mul_fp8", shape, gq, gs, n, f, rq, rs);
    pair_ok(matmul_quant_act_fp8_blk(q2, s2, out.g, n, f, st));
    report("silu_mul_fp8", "  blk == quant_act_fp8_blk(out)",
           (double)blk_diff(gq, gs, q2, s2, n, f), 0.0);
    gpu->ops->silu_mul_fp8(gpu, NULL, pg.g, n, f, &qg3);
    report("silu_mul_fp8", "  blk without out == with out", (double)blk_diff(gq, gs, q3, s3, n, f),
           0.0);
    /* (4) bf16 gu */
    uint16_t *g16 = xmalloc(ng * 2);
    for (size_t e = 0; e < ng; e++) {
        g16[e] = pd_f32_to_bf16(gu[e]);
        gu[e] = pd_bf16_to_f32(g16[e]);
    }
    void *d16;
    pair_ok(gpu->ops->alloc(gpu, ng * 2, &d16));
    pair_ok(gpu->ops->upload(gpu, d16, g16, ng * 2));
    pair_ok(gpu->ops->upload(gpu, pg.g, gu, ng * 4));
    pair_ok(elementwise_silu_mul_fp8_blk(NULL, NULL, d16, gq, gs, n, f, st));
    pair_ok(elementwise_silu_mul_fp8_blk(NULL, pg.g, NULL, q2, s2, n, f, st));
    report("silu_mul_fp8", "  blk bf16 gu == f32 gu widened",
           (double)blk_diff(gq, gs, q2, s2, n, f), 0.0);
    gpu->ops->free(gpu, d16);
    gpu->ops->free(gpu, gq);
    gpu->ops->free(gpu, gs);
    gpu->ops->free(gpu, q2);
    gpu->ops->free(gpu, s2);
    gpu->ops->free(gpu, q3);
    gpu->ops->free(gpu, s3);
    pair_free(&pg);
    pair_free(&out);
    free(c);
    free(g);
    free(g16);
    free(rq);
    free(rs);
    free(gu);
    rng_state = saved;
}

/* The W4A8 INT4 GEMM on pre-quantized activations at a fixed printed seed: act_quant answers
 * PD_ACT_FP8_BLK for the INT4 weight at n (n > 256), PD_ACT_F32 at n 200 (the mma kernels),
 * PD_ACT_FP8_ROW for an FP8 weight; matmul_fp8 on matmul_quant_act_fp8_blk's activations equals
 * matmul on the f32 x bit for bit (the same GEMM on the same bytes; case_matmul_int4_fp8 checks
 * that GEMM against a double reference). */
static void case_matmul_fp8_blk(int n, int64_t N, int64_t K, uint64_t seed, const char *what)
{
    char shape[128];
    const uint64_t saved = rng_state;
    rng_state = seed;
    pd_weight_t wc, wg, fc, fg;
    weight_new(PD_WFMT_INT4, N, K, &wc, &wg);
    weight_new(PD_WFMT_FP8, N, K, &fc, &fg);
    float *x = xmalloc((size_t)n * K * 4);
    fill_f32(x, (size_t)n * K, 1.0f);
    for (int t = 0; t < n; t++)
        for (int64_t k = 0; k < K; k++)
            x[(size_t)t * K + k] *= powf(10.0f, (float)(t % 5) - 2.0f);
    pair_t px = pair_new((size_t)n * K * 4, x), o1 = pair_new((size_t)n * N * 4, NULL),
           o2 = pair_new((size_t)n * N * 4, NULL);
    snprintf(shape, sizeof shape, "%s n %d N %lld K %lld seed %llu", what, n, (long long)N,
             (long long)K, (unsigned long long)seed);
    const pd_act_t a = gpu->ops->act_quant ? gpu->ops->act_quant(gpu, &wg, n) : PD_ACT_F32;
    const pd_act_t a200 = gpu->ops->act_quant ? gpu->ops->act_quant(gpu, &wg, 200) : PD_ACT_F32;
    const pd_act_t a8 = gpu->ops->act_quant ? gpu->ops->act_quant(gpu, &fg, n) : PD_ACT_F32;
    char w2[320];
    snprintf(w2, sizeof w2, "%s: act_quant INT4 n (%d) / n 200 (%d) / FP8 (%d) wrong", shape, a,
             a200, a8);
    /* n 200: below the W4A8 sizes; the wgmma GEMM's f16 image where it runs (session 12: sm_90a
     * and a tiled weight, N % 32 == 0 and K % 128 == 0) */
    const bool tiled = N % 32 == 0 && K % 128 == 0;
    const pd_act_t want200 = matmul_w4wg_usable() && tiled ? PD_ACT_F16WG : PD_ACT_F32;
    report("matmul_fp8", w2,
           (double)((a != PD_ACT_FP8_BLK) + (a200 != want200) + (a8 != PD_ACT_FP8_ROW)), 0.0);
    void *q, *sc;
    blk_alloc(n, K, &q, &sc);
    pd_act_fp8_t xa = {q, sc, true, false, false};
    pair_ok(matmul_quant_act_fp8_blk(q, sc, px.g, n, K, backend_cuda_stream(gpu)));
    gpu->ops->matmul_fp8(gpu, o1.g, &xa, &wg, n);
    gpu->ops->matmul(gpu, o2.g, px.g, &wg, n);
    pair_ok(gpu->ops->sync(gpu));
    float *g1 = xmalloc((size_t)n * N * 4), *g2 = xmalloc((size_t)n * N * 4);
    pair_ok(gpu->ops->download(gpu, g1, o1.g, (size_t)n * N * 4));
    pair_ok(gpu->ops->download(gpu, g2, o2.g, (size_t)n * N * 4));
    size_t nd = 0;
    for (size_t e = 0; e < (size_t)n * N; e++)
        nd += memcmp(&g1[e], &g2[e], 4) != 0 || isnan(g1[e]);
    snprintf(w2, sizeof w2, "%s: blk matmul_fp8 != matmul (elements)", shape);
    report("matmul_fp8", w2, (double)nd, 0.0);
    gpu->ops->free(gpu, q);
    gpu->ops->free(gpu, sc);
    backend_weight_free(cpu, &wc);
    backend_weight_free(gpu, &wg);
    backend_weight_free(cpu, &fc);
    backend_weight_free(gpu, &fg);
    pair_free(&px);
    pair_free(&o1);
    pair_free(&o2);
    free(x);
    free(g1);
    free(g2);
    rng_state = saved;
}

/* matmul_silu_fp8 on an INT4 gate_up weight (2f, K) with blk activations at a fixed printed seed,
 * q written over x's buffers (as the model calls it): (1) the GPU's bf16 gate_up product (left in
 * gu) against its f32 matmul of the same x per element, |g - c| <= 2^-8 |c| + 1e-5 max |c| (the
 * bf16 rounding; cuBLASLt may pick another kernel for bf16 out); (2) q bit for bit what
 * elementwise_silu_mul_fp8_blk makes of that bf16 product. */
static void case_matmul_silu_blk(int n, int f, int64_t K, uint64_t seed)
{
    char shape[128];
    const uint64_t saved = rng_state;
    rng_state = seed;
    const int64_t N = 2 * (int64_t)f;
    pd_weight_t wc, wg;
    weight_new(PD_WFMT_INT4, N, K, &wc, &wg);
    float *x = xmalloc((size_t)n * K * 4);
    fill_f32(x, (size_t)n * K, 1.0f);
    for (int t = 0; t < n; t++)
        for (int64_t k = 0; k < K; k++)
            x[(size_t)t * K + k] *= (float)(1 << (t % 9)) / 16.0f;
    pair_t px = pair_new((size_t)n * K * 4, x), gu = pair_new((size_t)n * N * 4, NULL),
           ref = pair_new((size_t)n * N * 4, NULL);
    const int64_t km = K > f ? K : f;
    void *q, *sc, *q2, *s2;
    blk_alloc(n, km, &q, &sc);
    blk_alloc(n, f, &q2, &s2);
    pd_act_fp8_t xa = {q, sc, true, false, false};
    cudaStream_t st = backend_cuda_stream(gpu);
    snprintf(shape, sizeof shape, "INT4 blk n %d f %d K %lld in place seed %llu", n, f,
             (long long)K, (unsigned long long)seed);
    pair_ok(matmul_quant_act_fp8_blk(q, sc, px.g, n, K, st));
    gpu->ops->matmul(gpu, ref.g, px.g, &wg, n);
    gpu->ops->matmul_silu_fp8(gpu, &xa, gu.g, &xa, &wg, n);
    pair_ok(gpu->ops->sync(gpu));
    float *c = xmalloc((size_t)n * N * 4);
    uint16_t *g16 = xmalloc((size_t)n * N * 2);
    pair_ok(gpu->ops->download(gpu, c, ref.g, (size_t)n * N * 4));
    pair_ok(gpu->ops->download(gpu, g16, gu.g, (size_t)n * N * 2));
    double mx = 0.0, worst = 0.0;
    for (size_t e = 0; e < (size_t)n * N; e++)
        mx = fmax(mx, fabs(c[e]));
    for (size_t e = 0; e < (size_t)n * N; e++) {
        const double g = pd_bf16_to_f32(g16[e]), bound = 0x1p-8 * fabs(c[e]) + 1e-5 * mx + 1e-30;
        worst = fmax(worst, isnan(g) ? INFINITY : fabs(g - c[e]) / bound);
    }
    char w2[320];
    snprintf(w2, sizeof w2, "%s: bf16 product per element", shape);
    report("matmul_silu", w2, worst, 1.0);
    pair_ok(elementwise_silu_mul_fp8_blk(NULL, NULL, gu.g, q2, s2, n, f, st));
    snprintf(w2, sizeof w2, "%s: q == silu_mul_fp8_blk(product)", shape);
    report("matmul_silu", w2, (double)blk_diff(q, sc, q2, s2, n, f), 0.0);
    gpu->ops->free(gpu, q);
    gpu->ops->free(gpu, sc);
    gpu->ops->free(gpu, q2);
    gpu->ops->free(gpu, s2);
    backend_weight_free(cpu, &wc);
    backend_weight_free(gpu, &wg);
    pair_free(&px);
    pair_free(&gu);
    pair_free(&ref);
    free(x);
    free(c);
    free(g16);
    rng_state = saved;
}

/* Session 6: elementwise_silu_mul_fp8_bf16 (the prefill bf16 gate_up product -> silu * up -> fp8
 * per row) at a fixed printed seed, random bf16 gu (n, 2f) with rows of different sizes and, when
 * zero_row, row 0 all zeros (scale 1). (1) The GPU's q / scales per element against the CPU's
 * silu_mul_fp8 of the widened f32 product (check_act_fp8: one fp8 step, scales 1e-5); (2) the
 * 16-byte kernel (default) and session 5's kernel (elementwise_silu_bf16_v1 = 1) give the same
 * bytes (the error is the number of differing q bytes + scales); fast: the 16-byte kernel with
 * elementwise_silu_bf16_fast = 1 (__expf / __fdividef), checked by (1) alone. */
static void case_silu_fp8_bf16(int n, int f, bool zero_row, bool fast, uint64_t seed,
                               const char *what)
{
    char shape[128];
    const uint64_t saved = rng_state;
    rng_state = seed;
    const size_t ne = (size_t)n * 2 * f;
    float *g32 = xmalloc(ne * 4);
    uint16_t *g16 = xmalloc(ne * 2);
    fill_f32(g32, ne, 6.0f);
    for (size_t e = 0; e < ne; e++) {
        const int r = (int)(e / (2 * (size_t)f));
        g16[e] = zero_row && r == 0 ? 0 : pd_f32_to_bf16(g32[e] * (float)(1 + r % 7));
        g32[e] = pd_bf16_to_f32(g16[e]);
    }
    pair_t p16 = pair_new(ne * 2, g16), p32 = pair_new(ne * 4, g32);
    pair_t q = pair_new((size_t)n * f, NULL), qs = pair_new((size_t)n * 4, NULL);
    pair_t q1 = pair_new((size_t)n * f, NULL), qs1 = pair_new((size_t)n * 4, NULL);
    pd_act_fp8_t qc = {q.c, qs.c, false, false, false};
    cpu->ops->silu_mul_fp8(cpu, NULL, p32.c, n, f, &qc);
    pair_ok(cpu->ops->sync(cpu));
    cudaStream_t st = backend_cuda_stream(gpu);
    elementwise_silu_bf16_fast = fast;
    pair_ok(elementwise_silu_mul_fp8_bf16(p16.g, q.g, qs.g, n, f, st));
    elementwise_silu_bf16_fast = 0;
    elementwise_silu_bf16_v1 = 1;
    pair_ok(elementwise_silu_mul_fp8_bf16(p16.g, q1.g, qs1.g, n, f, st));
    elementwise_silu_bf16_v1 = 0;
    pair_ok(gpu->ops->sync(gpu));
    snprintf(shape, sizeof shape, "%s n %d f %d%s%s seed %llu", what, n, f,
             zero_row ? " zero row" : "", fast ? " fast" : "", (unsigned long long)seed);
    check_act_fp8("silu_fp8_bf16", shape, &q, &qs, n, f, NULL);
    if (!fast) {
        uint8_t *a = xmalloc((size_t)n * f), *b = xmalloc((size_t)n * f);
        float *sa = xmalloc((size_t)n * 4), *sb = xmalloc((size_t)n * 4);
        pair_ok(gpu->ops->download(gpu, a, q.g, (size_t)n * f));
        pair_ok(gpu->ops->download(gpu, b, q1.g, (size_t)n * f));
        pair_ok(gpu->ops->download(gpu, sa, qs.g, (size_t)n * 4));
        pair_ok(gpu->ops->download(gpu, sb, qs1.g, (size_t)n * 4));
        size_t nd = 0;
        for (int i = 0; i < n; i++)
            nd += memcmp(&sa[i], &sb[i], 4) != 0;
        for (size_t e = 0; e < (size_t)n * f; e++)
            nd += a[e] != b[e];
        report("silu_fp8_bf16", "  16-byte kernel == session 5 kernel (bytes)", (double)nd, 0.0);
        free(a);
        free(b);
        free(sa);
        free(sb);
    }
    pair_free(&p16);
    pair_free(&p32);
    pair_free(&q);
    pair_free(&qs);
    pair_free(&q1);
    pair_free(&qs1);
    free(g32);
    free(g16);
    rng_state = saved;
}

/* Session 6 (helper prefill2): kv_rope_write_bf16 (kernels/kv.h; the bf16 q / k / v of the
 * prefill GEMMs with PD_CUDA_QKV_BF16=1) at a fixed printed seed against the CPU's rope, rope,
 * kv_write of the same bf16 values widened to f32 (random q, k, v rounded to bf16; random
 * positions < 32768; random arena; rows 2, 7, 12, ... have slot -1 and write nothing).
 * q (f32 out): per element |g - c| / (|c| + rms of its head vector) <= 2e-5 (the rope case's
 * bound; device vs host cosf / sinf). Pages: the error is the number of stored elements more
 * than one step of the page format apart (bf16: |g - c| > 2^-7 |c| + 1e-6 (|a| + |b|), a and b
 * the two inputs of a rotated k element (0 for v), since a rotation that cancels to ~0 may round
 * to codes of another sign or exponent on the two sides; fp8: the codes differ by more than 1 or
 * in sign; fp8 scales: relative 1e-5; f32: |g - c| > 1e-5 (|c| + 1)) plus the number of differing
 * bytes anywhere else in the arena (must be 0). */
static void case_rope_write_bf16(pd_kvfmt_t fmt, int heads, int kvh, int hd, int n, uint64_t seed,
                                 const char *what)
{
    char shape[128];
    kv_layout_t l;
    const uint64_t saved = rng_state;
    rng_state = seed;
    const int P = 16, n_pages = (n + P - 1) / P + 3, layer = 1;
    kv_layout_init(&l, 2, kvh, hd, P, fmt);
    const size_t qn = (size_t)n * heads * hd, kn = (size_t)n * kvh * hd;
    float *q = xmalloc(qn * 4), *k = xmalloc(kn * 4), *v = xmalloc(kn * 4);
    uint16_t *q16 = xmalloc(qn * 2), *k16 = xmalloc(kn * 2), *v16 = xmalloc(kn * 2);
    float *inv = xmalloc((size_t)hd / 2 * 4);
    int32_t *pos = xmalloc((size_t)n * 4), *slots = xmalloc((size_t)n * 4);
    fill_f32(q, qn, 2.0f);
    fill_f32(k, kn, 2.0f);
    fill_f32(v, kn, 2.0f);
    for (size_t e = 0; e < qn; e++)
        q[e] = pd_bf16_to_f32(q16[e] = pd_f32_to_bf16(q[e]));
    for (size_t e = 0; e < kn; e++) {
        k[e] = pd_bf16_to_f32(k16[e] = pd_f32_to_bf16(k[e]));
        v[e] = pd_bf16_to_f32(v16[e] = pd_f32_to_bf16(v[e]));
    }
    for (int j = 0; j < hd / 2; j++)
        inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    for (int i = 0; i < n; i++) {
        pos[i] = (int32_t)(rng_next() % 32768u);
        slots[i] = (int32_t)(n_pages * P - 1 - i); /* distinct, from the last page down */
    }
    for (int i = 2; i < n; i += 5)
        slots[i] = -1;
    const size_t ab = (size_t)n_pages * l.page_bytes;
    uint8_t *host = xmalloc(ab);
    for (size_t i = 0; i < ab; i++)
        host[i] = (uint8_t)rng_next();
    /* .c: the CPU reference on the f32 copies; .g: the bf16 kernel (q32.g is its q out) */
    pair_t a = pair_new(ab, host), pq = pair_new(qn * 4, q), pk = pair_new(kn * 4, k),
           pv = pair_new(kn * 4, v);
    pair_t pq16 = pair_new(qn * 2, q16), pk16 = pair_new(kn * 2, k16), pv16 = pair_new(kn * 2, v16);
    pair_t pp = pair_new((size_t)n * 4, pos), ps = pair_new((size_t)n * 4, slots);
    pair_t pi = pair_new((size_t)hd / 2 * 4, inv);
    cpu->ops->rope(cpu, pq.c, pp.c, pi.c, n, heads, hd);
    cpu->ops->rope(cpu, pk.c, pp.c, pi.c, n, kvh, hd);
    cpu->ops->kv_write(cpu, a.c, &l, layer, pk.c, pv.c, ps.c, n);
    pair_ok(gpu->ops->memset(gpu, pq.g, 0xff, qn * 4)); /* q out: poison */
    pair_ok(kv_rope_write_bf16(pq.g, pq16.g, pk16.g, pv16.g, pp.g, pi.g, n, heads, a.g, &l, layer,
                               ps.g, backend_cuda_stream(gpu)));
    snprintf(shape, sizeof shape, "%s %s h %d/%d hd %d n %d seed %llu: q", what, pd_kvfmt_name(fmt),
             heads, kvh, hd, n, (unsigned long long)seed);
    report("rope_wr_bf16", shape, err_f32_vec(&pq, (size_t)n * heads, (size_t)hd), 2e-5);
    uint8_t *ca, *ga;
    pair_get(&a, (void **)&ca, (void **)&ga);
    uint8_t *mask = calloc(ab, 1); /* 1: a stored element's bytes (checked by value) */
    if (!mask)
        exit(1);
    const int es = fmt == PD_KV_F32 ? 4 : fmt == PD_KV_BF16 ? 2 : 1;
    size_t bad = 0;
    for (int i = 0; i < n; i++) {
        if (slots[i] < 0)
            continue;
        const int page = slots[i] / P, tok = slots[i] % P;
        for (int side = 0; side < 2; side++) {
            const size_t doff = (size_t)page * l.page_bytes + KV_PAGE_HEADER_BYTES +
                                ((size_t)layer * l.n_sides + side) * l.side_bytes;
            const size_t soff = (size_t)page * l.page_bytes + KV_PAGE_HEADER_BYTES +
                                (size_t)l.n_layers * l.n_sides * l.side_bytes +
                                ((size_t)layer * l.n_sides + side) * l.scale_bytes;
            for (int h = 0; h < kvh; h++) {
                if (fmt == PD_KV_FP8) {
                    const size_t so = soff + ((size_t)tok * kvh + h) * 4;
                    float sc, sg;
                    memcpy(&sc, ca + so, 4);
                    memcpy(&sg, ga + so, 4);
                    bad += !(fabsf(sg - sc) <= 1e-5f * fabsf(sc));
                    memset(mask + so, 1, 4);
                }
                for (int d = 0; d < hd; d++) {
                    const size_t o = doff + (((size_t)tok * kvh + h) * hd + d) * es;
                    memset(mask + o, 1, (size_t)es);
                    if (fmt == PD_KV_F32) {
                        float c, g;
                        memcpy(&c, ca + o, 4);
                        memcpy(&g, ga + o, 4);
                        bad += !(fabsf(g - c) <= 1e-5f * (fabsf(c) + 1.0f));
                    } else if (fmt == PD_KV_BF16) {
                        /* within one bf16 step of the CPU's value or, for k, whose rotation can
                         * cancel to ~0 (where the two sides' sign and exponent may differ),
                         * within 1e-6 of the two inputs' magnitudes */
                        uint16_t c, g;
                        memcpy(&c, ca + o, 2);
                        memcpy(&g, ga + o, 2);
                        const float cf = pd_bf16_to_f32(c), gf = pd_bf16_to_f32(g);
                        const size_t kb = ((size_t)i * kvh + h) * hd;
                        const int dp = d < hd / 2 ? d + hd / 2 : d - hd / 2;
                        const float in = side == 0 ? fabsf(k[kb + d]) + fabsf(k[kb + dp]) : 0.0f;
                        bad += !(fabsf(gf - cf) <= 0x1p-7f * fabsf(cf) + 1e-6f * in);
                    } else {
                        const uint8_t c = ca[o], g = ga[o];
                        bad += ((c ^ g) >> 7 && ((c | g) & 0x7f)) ||
                               abs((int)(c & 0x7f) - (int)(g & 0x7f)) > 1;
                    }
                }
            }
        }
    }
    size_t other = 0;
    for (size_t b = 0; b < ab; b++)
        other += !mask[b] && ca[b] != ga[b];
    snprintf(shape, sizeof shape, "%s %s h %d/%d hd %d n %d: pages (elements > 1 step, bytes)",
             what, pd_kvfmt_name(fmt), heads, kvh, hd, n);
    report("rope_wr_bf16", shape, (double)(bad + other), 0.0);
    free(mask);
    free(ca);
    free(ga);
    pair_t *ps_all[] = {&a, &pq, &pk, &pv, &pq16, &pk16, &pv16, &pp, &ps, &pi};
    for (size_t i = 0; i < sizeof ps_all / sizeof *ps_all; i++)
        pair_free(ps_all[i]);
    free(q);
    free(k);
    free(v);
    free(q16);
    free(k16);
    free(v16);
    free(inv);
    free(pos);
    free(slots);
    free(host);
    rng_state = saved;
}

/* Session 6 (helper prefill2): the op qkv_rope_write on a CUDA backend created with
 * PD_CUDA_QKV_BF16=1 (bf16 GEMM outputs, kv_rope_write_bf16) against the CPU op (matmul_fp8 x3,
 * rope, rope, kv_write in f32) on the same FP8 weights and host-quantized activations, fixed
 * printed seed. Per element (err_f32_vec: |g - c| / (|c| + rms of the head vector)): q <= 2e-2
 * and the K / V pages (decoded) <= 2e-2 (the bf16 rounding of the products, 2^-9 of |a| + |b|
 * before the rotation, plus the FP8 GEMM's accumulation order and, for fp8 pages, one code step
 * near the vector's max relative to the rms: fp8 pages get 0.15). */
static void case_qkv_rope_op(pd_kvfmt_t fmt, int heads, int kvh, int hd, int n, int64_t K,
                             uint64_t seed, const char *what)
{
    char shape[128];
    kv_layout_t l;
    const uint64_t saved = rng_state;
    rng_state = seed;
    const char *keep = getenv("PD_CUDA_QKV_BF16");
    setenv("PD_CUDA_QKV_BF16", "1", 1);
    pd_backend_t *g2 = NULL;
    pair_ok(backend_cuda_create(0, &g2));
    unsetenv("PD_CUDA_QKV_BF16");
    if (keep)
        setenv("PD_CUDA_QKV_BF16", keep, 1);
    const int P = 16, n_pages = (n + P - 1) / P + 1;
    kv_layout_init(&l, 2, kvh, hd, P, fmt);
    const int64_t Nq = (int64_t)heads * hd, Nk = (int64_t)kvh * hd;
    pd_weight_t host[3], wc[3], wg[3];
    const int64_t Ns[3] = {Nq, Nk, Nk};
    for (int w = 0; w < 3; w++)
        weight_host_new(PD_WFMT_FP8, Ns[w], K, g2, &host[w], &wc[w], &wg[w]);
    float *x = xmalloc((size_t)n * K * 4), *xs = xmalloc((size_t)n * 4);
    uint8_t *xq = xmalloc((size_t)n * K);
    fill_f32(x, (size_t)n * K, 1.0f);
    for (int t = 0; t < n; t++)
        xs[t] = quant_fp8_vec(xq + (size_t)t * K, x + (size_t)t * K, K);
    float *inv = xmalloc((size_t)hd / 2 * 4);
    int32_t *pos = xmalloc((size_t)n * 4), *slots = xmalloc((size_t)n * 4);
    for (int j = 0; j < hd / 2; j++)
        inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        slots[i] = i;
    }
    pair_t pxq = pair_new((size_t)n * K, xq), pxs = pair_new((size_t)n * 4, xs);
    pair_t pq = pair_new((size_t)n * Nq * 4, NULL), pk = pair_new((size_t)n * Nk * 4, NULL),
           pv = pair_new((size_t)n * Nk * 4, NULL);
    pair_t pp = pair_new((size_t)n * 4, pos), ps = pair_new((size_t)n * 4, slots);
    pair_t pi = pair_new((size_t)hd / 2 * 4, inv);
    pair_t a = pair_new((size_t)n_pages * l.page_bytes, NULL);
    pair_ok(cpu->ops->memset(cpu, a.c, 0, a.bytes));
    pair_ok(gpu->ops->memset(gpu, a.g, 0, a.bytes));
    pair_ok(gpu->ops->sync(gpu));
    pd_act_fp8_t xc = {pxq.c, pxs.c, false, false, false}, xg = {pxq.g, pxs.g, false, false, false};
    cpu->ops->qkv_rope_write(cpu, pq.c, pk.c, pv.c, &xc, &wc[0], &wc[1], &wc[2], pp.c, pi.c, n,
                             heads, a.c, &l, 1, ps.c);
    g2->ops->qkv_rope_write(g2, pq.g, pk.g, pv.g, &xg, &wg[0], &wg[1], &wg[2], pp.g, pi.g, n, heads,
                            a.g, &l, 1, ps.g);
    pair_ok(g2->ops->sync(g2));
    snprintf(shape, sizeof shape, "%s %s h %d/%d hd %d n %d K %lld seed %llu: q", what,
             pd_kvfmt_name(fmt), heads, kvh, hd, n, (long long)K, (unsigned long long)seed);
    report("qkv_rope_op", shape, err_f32_vec(&pq, (size_t)n * heads, (size_t)hd), 2e-2);
    /* the pages: layer 1's k and v of every token, decoded to f32 on the host */
    uint8_t *ca, *ga;
    pair_get(&a, (void **)&ca, (void **)&ga);
    const size_t ne = (size_t)n * 2 * kvh * hd;
    float *dc = xmalloc(ne * 4), *dg = xmalloc(ne * 4);
    for (int i = 0; i < n; i++)
        for (int side = 0; side < 2; side++) {
            const int page = i / P, tok = i % P;
            const size_t doff = (size_t)page * l.page_bytes + KV_PAGE_HEADER_BYTES +
                                ((size_t)1 * l.n_sides + side) * l.side_bytes;
            const size_t soff = (size_t)page * l.page_bytes + KV_PAGE_HEADER_BYTES +
                                (size_t)l.n_layers * l.n_sides * l.side_bytes +
                                ((size_t)1 * l.n_sides + side) * l.scale_bytes;
            for (int h = 0; h < kvh; h++)
                for (int d = 0; d < hd; d++) {
                    const size_t e = (((size_t)i * 2 + side) * kvh + h) * hd + d;
                    const size_t el = ((size_t)tok * kvh + h) * hd + d;
                    for (int b = 0; b < 2; b++) {
                        const uint8_t *s = b ? ga : ca;
                        float val;
                        if (fmt == PD_KV_F32) {
                            memcpy(&val, s + doff + el * 4, 4);
                        } else if (fmt == PD_KV_BF16) {
                            uint16_t u;
                            memcpy(&u, s + doff + el * 2, 2);
                            val = pd_bf16_to_f32(u);
                        } else {
                            float sc;
                            memcpy(&sc, s + soff + ((size_t)tok * kvh + h) * 4, 4);
                            val = pd_fp8_to_f32(s[doff + el]) * sc;
                        }
                        (b ? dg : dc)[e] = val;
                    }
                }
        }
    pair_t pd = pair_new(ne * 4, NULL);
    pair_ok(cpu->ops->upload(cpu, pd.c, dc, ne * 4));
    pair_ok(gpu->ops->upload(gpu, pd.g, dg, ne * 4));
    snprintf(shape, sizeof shape, "%s %s h %d/%d hd %d n %d: k, v pages", what, pd_kvfmt_name(fmt),
             heads, kvh, hd, n);
    report("qkv_rope_op", shape, err_f32_vec(&pd, ne / (size_t)hd, (size_t)hd),
           fmt == PD_KV_FP8 ? 0.15 : 2e-2);
    pair_free(&pd);
    free(dc);
    free(dg);
    free(ca);
    free(ga);
    pair_t *all[] = {&pxq, &pxs, &pq, &pk, &pv, &pp, &ps, &pi, &a};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
    for (int w = 0; w < 3; w++) {
        model_host_weight_free(&host[w]);
        backend_weight_free(cpu, &wc[w]);
        backend_weight_free(g2, &wg[w]);
    }
    backend_destroy(g2);
    free(x);
    free(xs);
    free(xq);
    free(inv);
    free(pos);
    free(slots);
    rng_state = saved;
}

/* the bf16 q / k / v rope write's cases (seeds 261..; PD_GPU_TEST_PREFILL=1 runs them) */
static void cases_rope_write_bf16(void)
{
    const pd_kvfmt_t fs[3] = {PD_KV_BF16, PD_KV_FP8, PD_KV_F32};
    for (int f = 0; f < 3; f++) {
        case_rope_write_bf16(fs[f], 4, 2, 128, 512, 261 + (uint64_t)f, "fixture");
        case_rope_write_bf16(fs[f], 8, 8, 64, 37, 264 + (uint64_t)f, "fixture");
    }
    case_qkv_rope_op(PD_KV_BF16, 4, 2, 128, 64, 512, 281, "fixture");
    case_qkv_rope_op(PD_KV_FP8, 4, 2, 128, 64, 512, 282, "fixture");
    if (small_only)
        return;
    case_qkv_rope_op(PD_KV_BF16, 32, 8, 128, 512, 4096, 283, "8B");
    case_rope_write_bf16(PD_KV_BF16, 4, 2, 128, 8192, 267, "fixture");
    for (int f = 0; f < 2; f++) {
        case_rope_write_bf16(fs[f], 32, 8, 128, 512, 268 + (uint64_t)f, "8B");
        case_rope_write_bf16(fs[f], 32, 8, 128, 8192, 270 + (uint64_t)f, "8B");
    }
}

/* the prefill FP8 MLP op's cases (fixed seeds 231..; PD_GPU_TEST_PREFILL=1 runs them alone) */
static void cases_matmul_silu(void)
{
    case_matmul_silu_fp8(37, 1024, 512, false, 231, "fixture gemm");
    case_matmul_silu_fp8(37, 1024, 512, true, 232, "fixture gemm");
    case_matmul_silu_fp8(3, 1024, 512, true, 233, "fixture mma");
    case_matmul_silu_fp8(20, 300, 256, false, 234, "f32 (2f % 16)");
    case_matmul_silu_fp8(20, 1000, 256, false, 237, "f % 16");
    elementwise_force_generic = 1;
    case_matmul_silu_fp8(37, 1024, 512, false, 238, "generic");
    elementwise_force_generic = 0;
    if (!small_only) {
        case_matmul_silu_fp8(64, 14336, 4096, true, 235, "8B gemm");
        case_matmul_silu_fp8(128, 14336, 4096, false, 236, "8B gemm");
        case_matmul_silu_fp8(512, 2048, 4096, true, 239, "prefill gemm");
    }
    /* session 6: the 16-byte bf16 silu kernel (seeds 241..; threads x groups in the names) */
    case_silu_fp8_bf16(37, 1024, true, false, 241, "32 x 4");
    case_silu_fp8_bf16(7, 1000, false, false, 242, "32 x 4, tail");
    case_silu_fp8_bf16(9, 8, true, false, 243, "32 x 1, 1 group");
    case_silu_fp8_bf16(5, 14336, true, false, 244, "8B 256 x 7");
    case_silu_fp8_bf16(3, 32768, false, false, 245, "512 x 8");
    case_silu_fp8_bf16(3, 32776, false, false, 246, "f > 32768: session 5 kernel");
    case_silu_fp8_bf16(6, 1004, false, false, 247, "f % 8: session 5 kernel");
    case_silu_fp8_bf16(2, 2056, false, false, 248, "64 x 5, tail");
    case_silu_fp8_bf16(37, 1024, true, true, 249, "32 x 4");
    case_silu_fp8_bf16(7, 1000, false, true, 250, "32 x 4, tail");
    case_silu_fp8_bf16(5, 14336, true, true, 251, "8B 256 x 7");
}

/* Backend options (backend_set_options on a fresh CUDA backend): a valid list is taken and
 * fused=off / on takes the fused ops out of / back into the table; an unknown key, a bad value
 * and a list without '=' are refused (PD_ERR_INVALID). The error is the number of wrong answers. */
static void case_backend_options(void)
{
    pd_backend_t *b = NULL;
    int bad = 0;
    pair_ok(backend_cuda_create(0, &b));
    bad += backend_set_options(b, "bf16_gemm=split,flash=on,flash_variant=auto,fused=off") != PD_OK;
    bad += b->ops->add_rmsnorm != NULL || b->ops->matmul_fp8 != NULL;
    bad += backend_set_options(b, "fused=on,flash_variant=3,bf16_gemm=one") != PD_OK;
    bad += b->ops->add_rmsnorm == NULL || b->ops->silu_mul_fp8 == NULL;
    bad += backend_set_options(b, "no_such_option=1") != PD_ERR_INVALID;
    bad += backend_set_options(b, "flash_variant=5") != PD_OK;
    bad += backend_set_options(b, "flash_variant=7") != PD_ERR_INVALID;
    bad += backend_set_options(b, "flash=maybe") != PD_ERR_INVALID;
    bad += backend_set_options(b, "fused") != PD_ERR_INVALID;
    bad += backend_set_options(b, "fp8_accum=exact,fp8_accum=fast") != PD_OK;
    bad += backend_set_options(b, "fp8_accum=maybe") != PD_ERR_INVALID;
    bad += backend_set_options(b, "fused=off") != PD_OK || b->ops->matmul_silu_fp8 != NULL;
    bad += backend_set_options(b, "fused=on") != PD_OK || b->ops->matmul_silu_fp8 == NULL;
    bad += backend_set_options(b, "") != PD_OK || backend_set_options(b, NULL) != PD_OK;
    bad += backend_cuda_stream(b) == NULL;
    backend_destroy(b);
    report("options", "backend_set_options (wrong answers)", (double)bad, 0.0);
}

/* Random weight (n, k) in fmt on both backends; returns the host copy through host_p. */
static void weight_new(pd_wfmt_t fmt, int64_t n, int64_t k, pd_weight_t *wc, pd_weight_t *wg)
{
    pd_weight_t host;
    weight_host_new(fmt, n, k, gpu, &host, wc, wg);
    model_host_weight_free(&host);
}

/* split: run the GPU side on gpu_split (BF16 / INT4 GEMMs on the hi + lo split of x). */
static void case_matmul_on(pd_wfmt_t fmt, int n, int64_t N, int64_t K, const char *what, bool split)
{
    /* GEMMs: BF16 with one bf16 GEMM rounds x to bf16 (2^-9 relative per element: ~1.5e-3 of
     * max |out| at the largest elements, tol 5e-3); INT4 adds the bf16 rounding of the
     * dequantized weight; the split keeps x near f32 (BF16 2e-5: hi + lo hold 16 of x's 24 bits,
     * 2^-17 relative per product, before the f32 sums' rounding; session 20 measured 1.05e-5 at
     * 8B down, K 14336, on an H100; 1e-5 had passed there in the H200 rounds; INT4 only the weight
     * rounding) */
    static const double tol[] = {[PD_WFMT_BF16] = 5e-3,
                                 [PD_WFMT_FP8] = 2e-3,
                                 [PD_WFMT_INT4] = 6e-3,
                                 [PD_WFMT_F32] = 1e-5,
                                 [PD_WFMT_FP8_BLOCK] = 6e-3};
    static const double tol_split[] = {[PD_WFMT_BF16] = 2e-5,
                                       [PD_WFMT_FP8] = 2e-3,
                                       [PD_WFMT_INT4] = 4e-3,
                                       [PD_WFMT_F32] = 1e-5,
                                       [PD_WFMT_FP8_BLOCK] = 4e-3};
    pd_backend_t *g = split ? gpu_split : gpu;
    char shape[96];
    pd_weight_t wc, wg;
    float *x = xmalloc((size_t)n * K * 4);
    fill_f32(x, (size_t)n * K, 1.0f);
    weight_new(fmt, N, K, &wc, &wg);
    pair_t px = pair_new((size_t)n * K * 4, x), out = pair_new((size_t)n * N * 4, NULL);
    cpu->ops->matmul(cpu, out.c, px.c, &wc, n);
    g->ops->matmul(g, out.g, px.g, &wg, n);
    pair_ok(g->ops->sync(g));
    snprintf(shape, sizeof shape, "%s %s n %d N %lld K %lld%s", pd_wfmt_name(fmt), what, n,
             (long long)N, (long long)K, split ? " split" : "");
    /* GEMV paths (small n) compute in f32: tight; GEMMs as listed. INT4 weights with N % 32 == 0
     * (tiled at upload) run on the f16 tensor-core kernel at every n <= 256. FP8 block-scaled
     * weights: the f32 GEMV needs K % 16 == 0 (else dequantized to bf16 for the GEMM, as INT4);
     * it scales each 16-column partial sum once where the CPU scales every weight (2e-5). */
    const bool gemv = n <= 8 && fmt != PD_WFMT_FP8 && !(fmt == PD_WFMT_INT4 && N % 32 == 0) &&
                      !(fmt == PD_WFMT_FP8_BLOCK && K % 16 != 0);
    double t = gemv ? (fmt == PD_WFMT_FP8_BLOCK ? 2e-5 : 1e-5) : split ? tol_split[fmt] : tol[fmt];
    /* INT4 above the mma kernels' n with int4_gemm=fp8 (the default): e4m3 activations against
     * the CPU's f32 ones, each rounded by up to 2^-4 relative, ~2.5e-2 of max |out| measured;
     * case_matmul_int4_fp8 checks that route exactly against the same quantization */
    if (fmt == PD_WFMT_INT4 && n > MATMUL_INT4_MMA_MAX_N && !split) {
        const int was = backend_cuda_set_int4_fp8(gpu, 1); /* reads the setting; restored */
        backend_cuda_set_int4_fp8(gpu, was);
        if (was == 1)
            t = 5e-2;
    }
    report("matmul", shape, err_f32(&out, (size_t)n * N), t);
    backend_weight_free(cpu, &wc);
    backend_weight_free(gpu, &wg);
    pair_free(&px);
    pair_free(&out);
    free(x);
}

/* int4_gemm=fp8 (backend_cuda_set_int4_fp8; kernels/matmul.h, matmul_gemm_fp8_blk) at a fixed
 * printed seed, through the backend's matmul at prefill sizes: the INT4 weight as e4m3 q - z with
 * its group scales, the activations e4m3 in 1x128 blocks, cuBLASLt's VEC128 block scaling.
 * Reference in double on the host with the same activation quantization (quant_fp8_vec on each
 * 128-column block) and weights (quant_dequant_row): per element |g - ref| <= 1e-4 B + 1e-6,
 * B = sum_k |xq_k s w_k| (f32 sums of exact products; a wrong scale layout is off by O(B)). Also
 * fails when cuBLASLt has no VEC128 mode (the backend would fall back to bf16 silently). Tokens
 * of different magnitudes (1e-3 .. 1e2) and one all-zero block. */
static void case_matmul_int4_fp8(int n, int64_t N, int64_t K, uint64_t seed, const char *what)
{
    char shape[128];
    const uint64_t saved = rng_state;
    rng_state = seed;
    pd_weight_t wc, wg;
    weight_new(PD_WFMT_INT4, N, K, &wc, &wg);
    float *x = xmalloc((size_t)n * K * 4);
    fill_f32(x, (size_t)n * K, 1.0f);
    for (int t = 0; t < n; t++) {
        const float mag = powf(10.0f, (float)(t % 6) - 3.0f);
        for (int64_t k = 0; k < K; k++)
            x[(size_t)t * K + k] *= mag;
    }
    memset(x, 0, 128 * sizeof *x); /* token 0, block 0: s = 1, all e4m3 zeros */
    pair_t px = pair_new((size_t)n * K * 4, x), out = pair_new((size_t)n * N * 4, NULL);
    const int was = backend_cuda_set_int4_fp8(gpu, 1);
    void *lt = NULL, *lt_ws = NULL;
    size_t lt_ws_bytes = 0;
    const bool plan = backend_cuda_lt(gpu, &lt, &lt_ws, &lt_ws_bytes) &&
                      matmul_gemm_fp8_blk_ok(lt, lt_ws_bytes, n, N, K, false);
    pair_ok(gpu->ops->memset(gpu, out.g, 0xff, (size_t)n * N * 4));
    gpu->ops->matmul(gpu, out.g, px.g, &wg, n);
    pair_ok(gpu->ops->sync(gpu));
    backend_cuda_set_int4_fp8(gpu, was > 0 ? 1 : 0);
    float *g = xmalloc((size_t)n * N * 4);
    pair_ok(gpu->ops->download(gpu, g, out.g, (size_t)n * N * 4));
    /* the reference on sampled tokens (every one up to 32, else about 16): their quantized x,
     * then row by row the dequantized weight (host copy of the CPU backend's) */
    const int64_t ng = K / 128;
    const int stride = n <= 32 ? 1 : (n + 15) / 16, n_s = (n + stride - 1) / stride;
    double *xd = xmalloc((size_t)n_s * K * sizeof(double));
    float *wr = xmalloc((size_t)K * sizeof(float));
    uint8_t blk[128];
    for (int i = 0; i < n_s; i++)
        for (int64_t kb = 0; kb < ng; kb++) {
            const float sc = quant_fp8_vec(blk, x + ((size_t)i * stride * K + kb * 128), 128);
            for (int k = 0; k < 128; k++)
                xd[(size_t)i * K + kb * 128 + k] = (double)pd_fp8_to_f32(blk[k]) * (double)sc;
        }
    size_t bad = 0;
    double worst = 0.0;
    for (int64_t r = 0; r < N; r++) {
        quant_dequant_row(wr, &wc, r);
        for (int i = 0; i < n_s; i++) {
            double ref = 0.0, B = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double p = xd[(size_t)i * K + k] * (double)wr[k];
                ref += p;
                B += fabs(p);
            }
            const double d = fabs((double)g[(size_t)i * stride * N + r] - ref),
                         lim = 1e-4 * B + 1e-6;
            bad += !(d <= lim);
            worst = fmax(worst, B > 0 ? d / B : d);
        }
    }
    snprintf(shape, sizeof shape, "int4_gemm=fp8 %s n %d N %lld K %lld seed %llu (%s)", what, n,
             (long long)N, (long long)K, (unsigned long long)seed,
             !plan    ? "NO VEC128 GEMM for this shape: fell back to bf16"
             : n % 16 ? "VEC128 block scales, the last n % 16 rows padded to 16"
                      : "VEC128 block scales");
    report("matmul", shape, plan ? (double)bad : 1e9, 0.0);
    printf("    worst |g - ref| / sum |x w|: %.3g\n", worst);
    backend_weight_free(cpu, &wc);
    backend_weight_free(gpu, &wg);
    pair_free(&px);
    pair_free(&out);
    free(x);
    free(g);
    free(wr);
    free(xd);
    rng_state = saved;
}

static void case_matmul(pd_wfmt_t fmt, int n, int64_t N, int64_t K, const char *what)
{
    case_matmul_on(fmt, n, N, K, what, false);
}

/* A KV arena with n_pages pages whose every slot holds random K/V written through the CPU
 * backend, copied byte for byte to the GPU. */
static pair_t arena_new(const kv_layout_t *l, int n_pages)
{
    const int row = l->n_kv_heads * l->head_dim, n = l->page_tokens;
    size_t bytes = (size_t)n_pages * l->page_bytes;
    uint8_t *host = xmalloc(bytes);
    float *k = xmalloc((size_t)n * row * 4), *v = xmalloc((size_t)n * row * 4);
    int32_t *slots = xmalloc((size_t)n * 4);
    for (size_t i = 0; i < bytes; i++)
        host[i] = (uint8_t)rng_next();
    for (int p = 0; p < n_pages; p++) {
        for (int t = 0; t < n; t++)
            slots[t] = p * n + t;
        for (int layer = 0; layer < l->n_layers; layer++) {
            fill_f32(k, (size_t)n * row, 2.0f);
            fill_f32(v, (size_t)n * row, 2.0f);
            cpu->ops->kv_write(cpu, host, l, layer, k, v, slots, n);
        }
    }
    pair_t a = pair_new(bytes, host);
    free(host);
    free(k);
    free(v);
    free(slots);
    return a;
}

/* Tensor-core GEMMs of kernels/matmul.cu (matmul_int4_mma, matmul_fp8_mma, matmul_wgemv) at a
 * fixed, printed seed: through the backend op (warps == 0: the default routing and plan) or the
 * kernel itself with a forced plan (warps, splits; depth > 0: INT4 matmul_wgemv with that ring
 * depth, the activation quantization inside), or (warps < 0) the INT4 f32 GEMV on the tiled layout.
 * Checks (1) max |gpu - cpu| / max |cpu| over all of out against the CPU backend, and (2) per
 * element, on sampled rows, |gpu - ref| <= f * B + 1e-6, B = sum_k |x_k w_k| (w dequantized, in
 * double): INT4: ref the double dot product, f = 2e-3 (f16 activations and weights: one rounding of
 * 2^-11 each per product); FP8 (W8A8, the same activation rounding on both sides, up to a rounding
 * flip of x * (1 / s) against x / s): ref the CPU backend's element, f = 3e-4. Outputs start
 * poisoned (NaN). */
/* Per element, the worst |g - ref| / (f sum_k |x w| + 1e-6) over rows 0, stride, 2 stride, ... of
 * an (n, N) output g of x (n, K) f32 @ W^T, W the host weight dequantized row by row; ref the
 * double dot product, or c's element where c is given (a CPU result with the same
 * quantization); a NaN is INFINITY. */
static double gemm_worst_element(const float *g, const float *c, const float *x,
                                 const pd_weight_t *host, int n, int64_t N, int64_t K,
                                 int64_t stride, double f)
{
    float *wrow = xmalloc((size_t)K * 4);
    double worst = 0.0;
    for (int64_t r = 0; r < N; r += stride) {
        quant_dequant_row(wrow, host, r);
        for (int t = 0; t < n; t++) {
            double ref = 0.0, bound = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double p = (double)x[(size_t)t * K + k] * wrow[k];
                ref += p;
                bound += fabs(p);
            }
            if (c)
                ref = c[(size_t)t * N + r];
            const float v = g[(size_t)t * N + r];
            const double e = isnan(v) ? INFINITY : fabs(v - ref) / (f * bound + 1e-6);
            worst = e > worst ? e : worst;
        }
    }
    free(wrow);
    return worst;
}

static float mma_x_scale = 1.0f; /* every activation of case_mma_gemm_d times this */
/* case_mma_gemm_d through matmul_w4gemv / matmul_w8gemv: warps = rows, splits = slices, with
 * mma_xblocks blocks (0: one per tile) */
static bool mma_xgemv;
static int mma_xblocks;
/* case_mma_gemm_d through matmul_int4_mma2 with this many token tiles per block (0: not; -1: its
 * plan, warps and splits ignored) */
static int mma_tiles2;
static void cases_int4_mma2(void);
/* case_mma_gemm_d through matmul_w4wg: configuration mma_wg - 1 with `splits` (0: not; -1: its
 * plan, warps and splits ignored) */
static int mma_wg;
/* matmul_w4wg's K splits added inside thread-block clusters (its cluster argument) */
static bool mma_wg_cl;
static void cases_w4wg(void);
/* case_mma_gemm_d through matmul_w8wg (FP8): rows per block 128 `warps`, `splits` (0: not; -1:
 * its plan, warps and splits ignored) */
static int mma_w8;
static void cases_w8wg(void);
static void cases_fp8_cluster(void);
static void case_mma_gemm_d(pd_wfmt_t fmt, int n, int64_t N, int64_t K, int warps, int splits,
                            int depth, uint64_t seed, const char *what)
{
    char shape[96];
    const uint64_t saved = rng_state;
    const bool int4 = fmt == PD_WFMT_INT4;
    rng_state = seed;
    pd_weight_t host, wc, wg;
    weight_host_new(fmt, N, K, gpu, &host, &wc, &wg);
    float *x = xmalloc((size_t)n * K * 4);
    fill_f32(x, (size_t)n * K, 1.0f);
    for (int t = 0; t < n; t++) /* tokens of different magnitudes (per-token scaling) */
        for (int64_t k = 0; k < K; k++)
            x[(size_t)t * K + k] *= (float)(1 << (t % 9)) / 16.0f * mma_x_scale;
    pair_t px = pair_new((size_t)n * K * 4, x), out = pair_new((size_t)n * N * 4, NULL);
    cpu->ops->matmul(cpu, out.c, px.c, &wc, n);
    void *scratch = NULL;
    if (warps == 0) {
        gpu->ops->matmul(gpu, out.g, px.g, &wg, n);
    } else if (warps < 0) { /* the INT4 f32 GEMV on the weight as uploaded (tiled if N % 32 == 0) */
        pair_ok(matmul_gemv(out.g, px.g, NULL, &wg, n, N % 32 == 0, backend_cuda_stream(gpu)));
    } else {
        int tl = mma_tiles2; /* matmul_int4_mma2: tiles; -1: its plan (before the scratch) */
        int n_sm = 0;
        cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
        if (tl < 0 && int4)
            matmul_int4_mma2_plan(n, N, K, n_sm, &tl, &warps, &splits);
        int wcfg = mma_wg - 1; /* matmul_w4wg: configuration; its plan for mma_wg < 0 */
        if (mma_wg < 0 && int4)
            matmul_w4wg_plan(n, N, K, n_sm, mma_wg_cl, &wcfg, &splits);
        size_t hb = ((size_t)n * K * 2 + 255) / 256 * 256, mb = ((size_t)n * 4 + 255) / 256 * 256;
        if (mma_wg && int4)
            hb = (matmul_w4wg_act_bytes(n, K) + 255) / 256 * 256;
        size_t pf = matmul_int4_mma_part_floats(n, N, splits);
        pair_ok(gpu->ops->alloc(gpu, hb + mb + pf * 4, &scratch));
        pair_ok(gpu->ops->memset(gpu, scratch, 0xff, hb + mb + pf * 4));
        cudaStream_t st = backend_cuda_stream(gpu);
        uint8_t *b = scratch;
        float *mult = (float *)(b + hb), *part = pf ? (float *)(b + hb + mb) : NULL;
        if (mma_xgemv && int4) {
            pair_ok(matmul_w4gemv(out.g, px.g, &wg, n, warps, splits, depth, mma_xblocks, st));
        } else if (mma_xgemv) {
            pair_ok(matmul_quant_act_fp8(b, NULL, mult, px.g, n, K, st));
            pair_ok(matmul_w8gemv(out.g, b, mult, &wg, n, warps, splits, depth, mma_xblocks, st));
        } else if (mma_w8 != 0 && !int4) {
            if (mma_w8 < 0)
                matmul_w8wg_plan(n, N, K, n_sm, &warps, &splits);
            pair_ok(matmul_quant_act_fp8(b, NULL, mult, px.g, n, K, st));
            pair_ok(matmul_w8wg(out.g, b, mult, &wg, n, warps, splits, st));
        } else if (mma_wg != 0 && int4) {
            pair_ok(matmul_quant_act_f16wg((uint16_t *)b, mult, px.g, n, K, st));
            pair_ok(matmul_w4wg(out.g, mma_wg_cl ? NULL : part, (uint16_t *)b, mult, &wg, n, wcfg,
                                splits, mma_wg_cl, st));
            warps = wcfg; /* printed as w */
        } else if (mma_tiles2 != 0 && int4) {
            pair_ok(matmul_quant_act_f16((uint16_t *)b, mult, px.g, n, K, st));
            pair_ok(
                matmul_int4_mma2(out.g, part, (uint16_t *)b, mult, &wg, n, tl, warps, splits, st));
        } else if (depth > 0) {
            pair_ok(matmul_wgemv(out.g, px.g, &wg, n, warps, splits, depth, st));
        } else if (int4) {
            pair_ok(matmul_quant_act_f16((uint16_t *)b, mult, px.g, n, K, st));
            pair_ok(matmul_int4_mma(out.g, part, (uint16_t *)b, mult, &wg, n, warps, splits,
                                    N % 32 == 0 /* the backend tiles these at upload */, st));
        } else {
            pair_ok(matmul_quant_act_fp8(b, NULL, mult, px.g, n, K, st));
            pair_ok(matmul_fp8_mma(out.g, part, b, mult, &wg, n, warps, splits, st));
        }
    }
    char xb[40] = "";
    if (mma_xgemv)
        snprintf(xb, sizeof xb, " b%d", mma_xblocks);
    if (mma_tiles2 && int4 && warps > 0)
        snprintf(xb, sizeof xb, " mma2 t%d", mma_tiles2);
    if (mma_wg && int4 && warps >= 0)
        snprintf(xb, sizeof xb, " w4wg cfg%d%s", warps, mma_wg_cl ? " cluster" : "");
    if (mma_w8 && !int4 && warps > 0)
        snprintf(xb, sizeof xb, " w8wg mt%d", warps);
    else if (!int4 && !mma_xgemv && matmul_fp8_cluster)
        snprintf(xb, sizeof xb, " fp8 cluster");
    snprintf(shape, sizeof shape, "%s %s%s n %d N %lld K %lld w%d s%d d%d%s seed %llu",
             pd_wfmt_name(fmt), mma_xgemv ? (int4 ? "w4gemv " : "w8gemv ") : "", what, n,
             (long long)N, (long long)K, warps, splits, depth, xb, (unsigned long long)seed);
    report("mma gemm", shape, err_f32(&out, (size_t)n * N), warps < 0 ? 1e-5 : int4 ? 1e-3 : 2e-3);

    /* per element on sampled rows (about 2e8 multiply-adds) */
    float *g = xmalloc((size_t)n * N * 4), *c = xmalloc((size_t)n * N * 4);
    pair_ok(gpu->ops->sync(gpu));
    pair_ok(gpu->ops->download(gpu, g, out.g, (size_t)n * N * 4));
    pair_ok(cpu->ops->download(cpu, c, out.c, (size_t)n * N * 4));
    int64_t stride = (int64_t)((double)n * N * K / 2e8) + 1;
    const double worst =
        gemm_worst_element(g, int4 ? NULL : c, x, &host, n, N, K, stride, int4 ? 2e-3 : 3e-4);
    if (worst > 1.0) { /* a failing case: where its first differences sit (layout bugs) */
        double mx = 0.0;
        for (size_t i = 0; i < (size_t)n * N; i++)
            mx = fmax(mx, fabs((double)c[i]));
        int shown = 0;
        for (size_t i = 0; i < (size_t)n * N && shown < 8; i++)
            if (!(fabs((double)g[i] - c[i]) <= 1e-2 * mx)) {
                printf("    t %zu row %zu: gpu %.6g cpu %.6g\n", i / (size_t)N, i % (size_t)N,
                       (double)g[i], (double)c[i]);
                shown++;
            }
    }
    snprintf(shape, sizeof shape, "%s %s n %d rows/%lld per element", pd_wfmt_name(fmt), what, n,
             (long long)stride);
    report("mma gemm", shape, worst, 1.0);
    free(g);
    free(c);
    if (scratch)
        gpu->ops->free(gpu, scratch);
    pair_free(&px);
    pair_free(&out);
    free(x);
    model_host_weight_free(&host);
    backend_weight_free(cpu, &wc);
    backend_weight_free(gpu, &wg);
    rng_state = saved;
}

static void case_mma_gemm(pd_wfmt_t fmt, int n, int64_t N, int64_t K, int warps, int splits,
                          uint64_t seed, const char *what)
{
    case_mma_gemm_d(fmt, n, N, K, warps, splits, 0, seed, what);
}

/* Session 11: a group of count INT4 weights (rows Ns[i], the same K) on one x, as the attention
 * block's q, k, v: route 0 the backend op matmul_group (its own routing: the grouped slice GEMV
 * at n <= 4, the grouped wgmma GEMM at n 25..256, matmul per weight elsewhere), 1
 * matmul_w4gemv_group with the plan (a[0] rows, a[1] slices, a[2] depth, a[3] blocks), 2
 * matmul_w4wg_group with configuration a[0] and a[1] splits (both forced; a[0] < 0: their plans
 * for the summed rows). Every output starts poisoned (NaN) and every element of every output is
 * checked against the double dot product with the dequantized weight: |g - ref| <= 2e-3 sum |x
 * w| (case_mma_gemm_d's INT4 bound); the CPU backend's matmul per weight as a second, max-norm
 * check. Fixed seeds, printed. */
static void case_matmul_group(int n, const int64_t *Ns, int count, int64_t K, int route,
                              const int *a, uint64_t seed, const char *what)
{
    char shape[128];
    const uint64_t saved = rng_state;
    rng_state = seed;
    pd_weight_t host[MATMUL_GROUP_MAX], wc[MATMUL_GROUP_MAX], wg[MATMUL_GROUP_MAX];
    pair_t out[MATMUL_GROUP_MAX];
    float *outs_g[MATMUL_GROUP_MAX];
    const pd_weight_t *ws_g[MATMUL_GROUP_MAX];
    int64_t Nt = 0;
    for (int i = 0; i < count; i++) {
        weight_host_new(PD_WFMT_INT4, Ns[i], K, gpu, &host[i], &wc[i], &wg[i]);
        out[i] = pair_new((size_t)n * Ns[i] * 4, NULL);
        outs_g[i] = out[i].g;
        ws_g[i] = &wg[i];
        Nt += Ns[i];
    }
    float *x = xmalloc((size_t)n * K * 4);
    fill_f32(x, (size_t)n * K, 1.0f);
    for (int t = 0; t < n; t++) /* tokens of different magnitudes (per-token scaling) */
        for (int64_t k = 0; k < K; k++)
            x[(size_t)t * K + k] *= (float)(1 << (t % 9)) / 16.0f;
    pair_t px = pair_new((size_t)n * K * 4, x);
    for (int i = 0; i < count; i++)
        cpu->ops->matmul(cpu, out[i].c, px.c, &wc[i], n);
    void *scratch = NULL;
    int p[4] = {a[0], a[1], a[2], a[3]};
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    cudaStream_t st = backend_cuda_stream(gpu);
    if (route == 0) {
        PD_ASSERT(gpu->ops->matmul_group);
        gpu->ops->matmul_group(gpu, outs_g, px.g, ws_g, count, n);
    } else if (route == 1) {
        if (p[0] < 0)
            matmul_w4gemv_plan(n, Nt, K, n_sm, &p[0], &p[1], &p[2], &p[3]);
        pair_ok(matmul_w4gemv_group(outs_g, px.g, ws_g, count, n, p[0], p[1], p[2], p[3], st));
    } else {
        if (p[0] < 0)
            matmul_w4wg_plan(n, Nt, K, n_sm, mma_wg_cl, &p[0], &p[1]);
        const size_t hb = (matmul_w4wg_act_bytes(n, K) + 255) / 256 * 256,
                     mb = ((size_t)n * 4 + 255) / 256 * 256,
                     pf = matmul_int4_mma_part_floats(n, Nt, p[1]);
        pair_ok(gpu->ops->alloc(gpu, hb + mb + pf * 4, &scratch));
        pair_ok(gpu->ops->memset(gpu, scratch, 0xff, hb + mb + pf * 4));
        uint8_t *b = scratch;
        float *mult = (float *)(b + hb), *part = pf ? (float *)(b + hb + mb) : NULL;
        pair_ok(matmul_quant_act_f16wg((uint16_t *)b, mult, px.g, n, K, st));
        pair_ok(matmul_w4wg_group(outs_g, mma_wg_cl ? NULL : part, (uint16_t *)b, mult, ws_g, count,
                                  n, p[0], p[1], mma_wg_cl, st));
    }
    char nb[48] = "";
    for (int i = 0; i < count; i++)
        snprintf(nb + strlen(nb), sizeof nb - strlen(nb), "%s%lld", i ? "+" : "", (long long)Ns[i]);
    const char *rn = route == 0   ? "op"
                     : route == 1 ? "w4gemv"
                     : mma_wg_cl  ? "w4wg cluster"
                                  : "w4wg";
    double worst_c = 0.0, worst = 0.0;
    for (int i = 0; i < count; i++) {
        const double e = err_f32(&out[i], (size_t)n * Ns[i]);
        worst_c = e > worst_c ? e : worst_c;
        float *g = xmalloc((size_t)n * Ns[i] * 4);
        pair_ok(gpu->ops->sync(gpu));
        pair_ok(gpu->ops->download(gpu, g, out[i].g, (size_t)n * Ns[i] * 4));
        const double e2 = gemm_worst_element(g, NULL, x, &host[i], n, Ns[i], K, 1, 2e-3);
        worst = e2 > worst ? e2 : worst;
        free(g);
    }
    snprintf(shape, sizeof shape, "int4 %s %s n %d N %s K %lld p %d,%d,%d,%d seed %llu", rn, what,
             n, nb, (long long)K, p[0], p[1], p[2], p[3], (unsigned long long)seed);
    report("mm group", shape, worst_c, 1e-3);
    snprintf(shape, sizeof shape, "int4 %s %s n %d N %s per element", rn, what, n, nb);
    report("mm group", shape, worst, 1.0);
    if (scratch)
        gpu->ops->free(gpu, scratch);
    pair_free(&px);
    free(x);
    for (int i = 0; i < count; i++) {
        pair_free(&out[i]);
        model_host_weight_free(&host[i]);
        backend_weight_free(cpu, &wc[i]);
        backend_weight_free(gpu, &wg[i]);
    }
    rng_state = saved;
}

/* matmul_group (session 11): the grouped slice GEMV and the grouped wgmma GEMM forced (rows
 * splitting across the weights' boundaries, persistent grids over the tiles of several weights,
 * K splits with the grouped sum, unequal weights, one and two weights) and the backend op at the
 * sizes of each route and of neither (fixed seeds 501..); the Llama-3-8B q / k / v at full size
 * unless PD_GPU_TEST_SMALL. */
static void cases_matmul_group(void)
{
    const int64_t qkv[3] = {512, 128, 128}, odd[3] = {96, 256, 32}, two[2] = {288, 64};
    const int64_t q8b[3] = {4096, 1024, 1024};
    const int g1[4] = {16, 1, 2, 1}, g2[4] = {32, 3, 2, 5}, g3[4] = {16, 4, 4, 0},
              g4[4] = {32, 8, 2, 0}, plan[4] = {-1, 0, 0, 0};
    case_matmul_group(1, qkv, 3, 1024, 1, g1, 501, "forced");
    case_matmul_group(3, odd, 3, 640, 1, g2, 502, "forced");
    case_matmul_group(4, two, 2, 1280, 1, g3, 503, "forced");
    case_matmul_group(2, qkv, 3, 384, 1, g4, 504, "forced, empty slices");
    case_matmul_group(1, qkv, 1, 1024, 1, g2, 505, "one weight");
    if (matmul_w4wg_usable()) {
        const int w0[4] = {0, 1, 0, 0}, w1[4] = {0, 3, 0, 0}, w2[4] = {1, 2, 0, 0},
                  w3[4] = {2, 1, 0, 0}, w4[4] = {2, 4, 0, 0};
        case_matmul_group(64, qkv, 3, 1024, 2, w0, 511, "forced");
        case_matmul_group(40, odd, 3, 1280, 2, w1, 512, "forced, splits");
        case_matmul_group(100, two, 2, 640, 2, w2, 513, "forced, splits");
        case_matmul_group(129, qkv, 3, 768, 2, w3, 514, "forced");
        case_matmul_group(250, odd, 3, 1024, 2, w4, 515, "forced, splits");
        case_matmul_group(33, qkv, 3, 2048, 2, plan, 516, "plan");
        mma_wg_cl = true; /* the same splits added inside clusters (session 22) */
        case_matmul_group(40, odd, 3, 1280, 2, w1, 517, "forced, splits");
        case_matmul_group(100, two, 2, 640, 2, w2, 518, "forced, splits");
        case_matmul_group(250, odd, 3, 1024, 2, w4, 519, "forced, splits");
        case_matmul_group(33, qkv, 3, 2048, 2, plan, 520, "plan");
        if (!small_only)
            case_matmul_group(64, q8b, 3, 4096, 2, plan, 535, "8B qkv plan");
        mma_wg_cl = false;
    }
    case_matmul_group(1, qkv, 3, 1024, 0, plan, 521, "");
    case_matmul_group(4, odd, 3, 640, 0, plan, 522, "");
    case_matmul_group(16, qkv, 3, 1024, 0, plan, 523, "(per weight)");
    case_matmul_group(48, qkv, 3, 1024, 0, plan, 524, "");
    case_matmul_group(177, two, 2, 512, 0, plan, 525, "");
    if (!small_only) {
        case_matmul_group(1, q8b, 3, 4096, 0, plan, 531, "8B qkv");
        case_matmul_group(2, q8b, 3, 4096, 0, plan, 532, "8B qkv");
        case_matmul_group(64, q8b, 3, 4096, 0, plan, 533, "8B qkv");
        case_matmul_group(128, q8b, 3, 4096, 0, plan, 534, "8B qkv");
    }
}

/* bytes of device buffer a that differ from device buffer b (n bytes) */
static size_t dev_bytes_differ(const void *a, const void *b, size_t n)
{
    uint8_t *ha = xmalloc(n), *hb = xmalloc(n);
    pair_ok(gpu->ops->sync(gpu));
    pair_ok(gpu->ops->download(gpu, ha, a, n));
    pair_ok(gpu->ops->download(gpu, hb, b, n));
    size_t nd = 0;
    for (size_t i = 0; i < n; i++)
        nd += ha[i] != hb[i];
    free(ha);
    free(hb);
    return nd;
}

/* max |a - b| / max |b| of two device f32 buffers (n floats); NaN anywhere -> INFINITY */
static double dev_rel_err(const float *a, const float *b, size_t n)
{
    float *ha = xmalloc(n * 4), *hb = xmalloc(n * 4);
    pair_ok(gpu->ops->sync(gpu));
    pair_ok(gpu->ops->download(gpu, ha, a, n * 4));
    pair_ok(gpu->ops->download(gpu, hb, b, n * 4));
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ha[i]) || isnan(hb[i])) {
            num = INFINITY;
            break;
        }
        num = fmax(num, fabs((double)ha[i] - hb[i]));
        den = fmax(den, fabs((double)hb[i]));
    }
    free(ha);
    free(hb);
    return den > 0.0 ? num / den : num;
}

/* Session 14: the decode layer's small ops folded into the slice GEMV (backend.h matmul_fused,
 * matmul_w4gemv_fused) against the plain ops on the same backend, fixed printed seeds:
 *   - RMSNORM on q / k / v as one group: rmsnorm + matmul_group's values within 2e-4 of the
 *     output's scale (only 1 / rms may differ, in its last bit: the block adds the sum of
 *     squares in its own order), within 1e-3 of the CPU backend's rmsnorm + matmul, x unchanged;
 *   - NONE with acc (o): matmul + add's bytes; SILU_MUL with acc (down): silu_mul + matmul +
 *     add's bytes; RMSNORM with acc on gate_up within 2e-4 as above; the SiLU·mul epilogue on
 *     gate_up: matmul + silu_mul's bytes (NONE), within 2e-4 with RMSNORM;
 *   - forced plans (rows, slices, depth, blocks; both weight streams where sm_90) of RMSNORM,
 *     SILU and the SiLU·mul epilogue against matmul_w4gemv on the plain ops' activations at the
 *     same plan;
 *   - matmul_fused_ok (case_mm_fused_no): no at n 16 and for FP8, the SiLU·mul routes by level. */
static void case_mm_fused(int n, int d, int f, uint64_t seed)
{
    char shape[64], what[192];
    const uint64_t saved = rng_state;
    rng_state = seed;
    const int64_t Ns[3] = {d / 2, 128, 128}; /* tiled INT4: rows a multiple of 32 */
    pd_weight_t host[6], wc[6], wg[6];       /* q, k, v, o, gate_up, down */
    for (int i = 0; i < 3; i++)
        weight_host_new(PD_WFMT_INT4, Ns[i], d, gpu, &host[i], &wc[i], &wg[i]);
    weight_host_new(PD_WFMT_INT4, d, d, gpu, &host[3], &wc[3], &wg[3]);
    weight_host_new(PD_WFMT_INT4, 2 * (int64_t)f, d, gpu, &host[4], &wc[4], &wg[4]);
    weight_host_new(PD_WFMT_INT4, d, f, gpu, &host[5], &wc[5], &wg[5]);
    float *x = xmalloc((size_t)n * d * 4), *at = xmalloc((size_t)n * d * 4);
    float *gu = xmalloc((size_t)n * 2 * f * 4);
    uint16_t *nw = xmalloc((size_t)d * 2);
    fill_f32(x, (size_t)n * d, 3.0f);
    fill_f32(at, (size_t)n * d, 1.0f);
    fill_f32(gu, (size_t)n * 2 * f, 4.0f);
    for (int i = 0; i < n; i++) /* rows of different sizes */
        for (int j = 0; j < d; j++)
            x[(size_t)i * d + j] *= (float)(1 + i % 5);
    for (int i = 0; i < d; i++)
        nw[i] = pd_f32_to_bf16(rng_float() + 1.5f);
    pair_t px = pair_new((size_t)n * d * 4, x), pat = pair_new((size_t)n * d * 4, at);
    pair_t pgu = pair_new((size_t)n * 2 * f * 4, gu), pnw = pair_new((size_t)d * 2, nw);
    pair_t h = pair_new((size_t)n * d * 4, NULL), act = pair_new((size_t)n * f * 4, NULL);
    pair_t x1 = pair_new((size_t)n * d * 4, x), x2 = pair_new((size_t)n * d * 4, x);
    pair_t tmp = pair_new((size_t)n * d * 4, NULL);
    pair_t o1[3], o2[3], g1 = pair_new((size_t)n * 2 * f * 4, NULL),
                         g2 = pair_new((size_t)n * 2 * f * 4, NULL);
    float *p1[3], *p2[3], *pc[3];
    const pd_weight_t *ws[3] = {&wg[0], &wg[1], &wg[2]}, *wcs[3] = {&wc[0], &wc[1], &wc[2]};
    for (int i = 0; i < 3; i++) {
        o1[i] = pair_new((size_t)n * Ns[i] * 4, NULL);
        o2[i] = pair_new((size_t)n * Ns[i] * 4, NULL);
        p1[i] = o1[i].g;
        p2[i] = o2[i].g;
        pc[i] = o1[i].c;
    }
    const float eps = 1e-5f;
    snprintf(shape, sizeof shape, "n %d d %d f %d seed %llu", n, d, f, (unsigned long long)seed);

    size_t oks = 0;
    for (int i = 0; i < 6; i++)
        oks += gpu->ops->matmul_fused_ok(gpu, &wg[i], n, PD_PRO_NONE, PD_EPI_NONE);
    snprintf(what, sizeof what, "%s: matmul_fused_ok (INT4 x 6)", shape);
    report("mm fused", what, (double)(6 - oks), 0.0);
    if (oks != 6)
        goto done;

    /* RMSNORM, the q / k / v group */
    gpu->ops->matmul_fused(gpu, p1, px.g, PD_PRO_RMSNORM, pnw.g, eps, ws, 3, n, PD_EPI_NONE);
    gpu->ops->rmsnorm(gpu, h.g, px.g, pnw.g, n, d, eps);
    gpu->ops->matmul_group(gpu, p2, h.g, ws, 3, n);
    cpu->ops->rmsnorm(cpu, h.c, px.c, pnw.c, n, d, eps);
    for (int i = 0; i < 3; i++)
        cpu->ops->matmul(cpu, pc[i], h.c, wcs[i], n);
    double e = 0.0, ec = 0.0;
    for (int i = 0; i < 3; i++) {
        const double ei = dev_rel_err(p1[i], p2[i], (size_t)n * Ns[i]);
        const double eci = err_f32(&o1[i], (size_t)n * Ns[i]);
        e = ei > e ? ei : e;
        ec = eci > ec ? eci : ec;
    }
    snprintf(what, sizeof what, "%s: qkv rmsnorm == plain ops (GPU)", shape);
    report("mm fused", what, e, 2e-4);
    snprintf(what, sizeof what, "%s: qkv rmsnorm == CPU plain ops", shape);
    report("mm fused", what, ec, 1e-3);
    snprintf(what, sizeof what, "%s: x unchanged (bytes)", shape);
    report("mm fused", what, err_bytes(&px), 0.0);

    /* NONE + acc: x1 += at @ o^T against matmul, add */
    float *xo1 = x1.g, *xo2 = x2.g, *gq1 = g1.g;
    const pd_weight_t *wo = &wg[3], *wgu = &wg[4], *wdn = &wg[5];
    gpu->ops->matmul_fused(gpu, &xo1, pat.g, PD_PRO_NONE, NULL, 0.0f, &wo, 1, n, PD_EPI_ACC);
    gpu->ops->matmul(gpu, tmp.g, pat.g, wo, n);
    gpu->ops->add(gpu, x2.g, tmp.g, (size_t)n * d);
    snprintf(what, sizeof what, "%s: o acc == matmul + add (bytes)", shape);
    report("mm fused", what, (double)dev_bytes_differ(x1.g, x2.g, (size_t)n * d * 4), 0.0);

    /* RMSNORM on gate_up, plain and with acc (onto a copy of gu) */
    gpu->ops->matmul_fused(gpu, &gq1, x1.g, PD_PRO_RMSNORM, pnw.g, eps, &wgu, 1, n, PD_EPI_NONE);
    gpu->ops->rmsnorm(gpu, h.g, x2.g, pnw.g, n, d, eps);
    gpu->ops->matmul(gpu, g2.g, h.g, wgu, n);
    snprintf(what, sizeof what, "%s: gate_up rmsnorm == plain ops", shape);
    report("mm fused", what, dev_rel_err(g1.g, g2.g, (size_t)n * 2 * f), 2e-4);
    pair_ok(gpu->ops->copy(gpu, g1.g, pgu.g, (size_t)n * 2 * f * 4));
    gpu->ops->matmul_fused(gpu, &gq1, x1.g, PD_PRO_RMSNORM, pnw.g, eps, &wgu, 1, n, PD_EPI_ACC);
    pair_ok(gpu->ops->copy(gpu, g2.g, pgu.g, (size_t)n * 2 * f * 4));
    {
        pair_t t2 = pair_new((size_t)n * 2 * f * 4, NULL);
        gpu->ops->matmul(gpu, t2.g, h.g, wgu, n);
        gpu->ops->add(gpu, g2.g, t2.g, (size_t)n * 2 * f);
        pair_free(&t2);
    }
    snprintf(what, sizeof what, "%s: gate_up rmsnorm acc == plain ops", shape);
    report("mm fused", what, dev_rel_err(g1.g, g2.g, (size_t)n * 2 * f), 2e-4);

    /* SILU_MUL + acc: x1 += silu_mul(gu) @ down^T against silu_mul, matmul, add (x1 == x2 here) */
    gpu->ops->matmul_fused(gpu, &xo1, pgu.g, PD_PRO_SILU_MUL, NULL, 0.0f, &wdn, 1, n, PD_EPI_ACC);
    gpu->ops->silu_mul(gpu, act.g, pgu.g, n, f);
    gpu->ops->matmul(gpu, tmp.g, act.g, wdn, n);
    gpu->ops->add(gpu, xo2, tmp.g, (size_t)n * d);
    snprintf(what, sizeof what, "%s: down silu acc == plain ops (bytes)", shape);
    report("mm fused", what, (double)dev_bytes_differ(x1.g, x2.g, (size_t)n * d * 4), 0.0);

    /* the SiLU·mul epilogue on gate_up: on the plain norm's h (bytes of matmul + silu_mul) and
     * with the norm inside (within 2e-4) */
    {
        float *ao = act.g;
        pair_t a2 = pair_new((size_t)n * f * 4, NULL);
        gpu->ops->rmsnorm(gpu, h.g, px.g, pnw.g, n, d, eps);
        gpu->ops->matmul_fused(gpu, &ao, h.g, PD_PRO_NONE, NULL, 0.0f, &wgu, 1, n, PD_EPI_SILU_MUL);
        gpu->ops->matmul(gpu, g2.g, h.g, wgu, n);
        gpu->ops->silu_mul(gpu, a2.g, g2.g, n, f);
        snprintf(what, sizeof what, "%s: gate_up silu epilogue == plain ops (bytes)", shape);
        report("mm fused", what, (double)dev_bytes_differ(act.g, a2.g, (size_t)n * f * 4), 0.0);
        gpu->ops->matmul_fused(gpu, &ao, px.g, PD_PRO_RMSNORM, pnw.g, eps, &wgu, 1, n,
                               PD_EPI_SILU_MUL);
        snprintf(what, sizeof what, "%s: gate_up norm + silu epilogue == plain ops", shape);
        report("mm fused", what, dev_rel_err(act.g, a2.g, (size_t)n * f), 2e-4);
        pair_free(&a2);
    }

    /* forced plans of the kernel (both weight streams on sm_90+) */
    {
        static const int plans[][4] = {
            {16, 1, 2, 1}, {32, 3, 2, 3}, {16, 16, 4, 0}, {32, 8, 2, 5}, {16, 4, 4, 2}};
        int cc = 0;
        cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, 0);
        const int bulk0 = matmul_set_w4bulk(0);
        cudaStream_t st = backend_cuda_stream(gpu);
        double en = 0.0, es = 0.0, ee = 0.0;
        for (int bulk = cc >= 9; bulk >= 0; bulk--) {
            matmul_set_w4bulk(bulk);
            for (size_t k = 0; k < sizeof plans / sizeof plans[0]; k++) {
                const int *pl = plans[k];
                if (matmul_w4gemv_smem(n, d, pl[0], pl[1]) == 0 ||
                    matmul_w4gemv_smem(n, f, pl[0], pl[1]) == 0)
                    continue;
                const matmul_pro_t pn = {MATMUL_PRO_RMSNORM, 0, MATMUL_EPI_NONE, pnw.g, eps},
                                   ps = {MATMUL_PRO_SILU, 0, MATMUL_EPI_NONE, NULL, 0.0f};
                pair_ok(
                    matmul_w4gemv_fused(p1, px.g, &pn, ws, 3, n, pl[0], pl[1], pl[2], pl[3], st));
                gpu->ops->rmsnorm(gpu, h.g, px.g, pnw.g, n, d, eps);
                pair_ok(matmul_w4gemv_group(p2, h.g, ws, 3, n, pl[0], pl[1], pl[2], pl[3], st));
                for (int i = 0; i < 3; i++) {
                    const double ei = dev_rel_err(p1[i], p2[i], (size_t)n * Ns[i]);
                    en = ei > en ? ei : en;
                }
                pair_ok(matmul_w4gemv_fused(&xo1, pgu.g, &ps, &wdn, 1, n, pl[0], pl[1], pl[2],
                                            pl[3], st));
                gpu->ops->silu_mul(gpu, act.g, pgu.g, n, f);
                pair_ok(matmul_w4gemv(xo2, act.g, wdn, n, pl[0], pl[1], pl[2], pl[3], st));
                es += (double)dev_bytes_differ(xo1, xo2, (size_t)n * d * 4);
                if (2 * (int64_t)f % (2 * pl[0]) == 0) { /* the SiLU·mul epilogue */
                    const matmul_pro_t pe = {MATMUL_PRO_NONE, 0, MATMUL_EPI_SILU, NULL, 0.0f};
                    float *ao = act.g;
                    pair_ok(matmul_w4gemv_fused(&ao, h.g, &pe, &wgu, 1, n, pl[0], pl[1], pl[2],
                                                pl[3], st));
                    pair_ok(matmul_w4gemv(g2.g, h.g, wgu, n, pl[0], pl[1], pl[2], pl[3], st));
                    gpu->ops->silu_mul(gpu, g1.g, g2.g, n, f);
                    ee += (double)dev_bytes_differ(act.g, g1.g, (size_t)n * f * 4);
                }
            }
        }
        matmul_set_w4bulk(bulk0);
        snprintf(what, sizeof what, "%s: forced plans, rmsnorm == plain", shape);
        report("mm fused", what, en, 2e-4);
        snprintf(what, sizeof what, "%s: forced plans, silu == plain (bytes)", shape);
        report("mm fused", what, es, 0.0);
        snprintf(what, sizeof what, "%s: forced plans, silu epilogue == plain (bytes)", shape);
        report("mm fused", what, ee, 0.0);
    }

done:
    pair_free(&px);
    pair_free(&pat);
    pair_free(&pgu);
    pair_free(&pnw);
    pair_free(&h);
    pair_free(&act);
    pair_free(&x1);
    pair_free(&x2);
    pair_free(&tmp);
    pair_free(&g1);
    pair_free(&g2);
    for (int i = 0; i < 3; i++) {
        pair_free(&o1[i]);
        pair_free(&o2[i]);
    }
    for (int i = 0; i < 6; i++) {
        model_host_weight_free(&host[i]);
        backend_weight_free(cpu, &wc[i]);
        backend_weight_free(gpu, &wg[i]);
    }
    free(x);
    free(at);
    free(gu);
    free(nw);
    rng_state = saved;
}

/* matmul_fused's answers where it must say no: n 16 (the GEMM route) and an FP8 weight */
static void case_mm_fused_no(void)
{
    pd_weight_t host[2], wc[2], wg[2];
    weight_host_new(PD_WFMT_INT4, 256, 512, gpu, &host[0], &wc[0], &wg[0]);
    weight_host_new(PD_WFMT_FP8, 256, 512, gpu, &host[1], &wc[1], &wg[1]);
    const pd_pro_t nrm = PD_PRO_RMSNORM, slu = PD_PRO_SILU_MUL;
    const pd_epi_t st = PD_EPI_NONE, se = PD_EPI_SILU_MUL;
    double yes = (double)gpu->ops->matmul_fused_ok(gpu, &wg[0], 16, nrm, st) +
                 (double)gpu->ops->matmul_fused_ok(gpu, &wg[1], 1, nrm, st) +
                 (double)!gpu->ops->matmul_fused_ok(gpu, &wg[0], 1, nrm, st);
    /* the SiLU·mul epilogue at gemv_fuse 2 (the default), the prologue only at 3, neither at 1
     * (unless the environment pins the option) */
    if (!getenv("PD_CUDA_GEMV_FUSE")) {
        yes += (double)gpu->ops->matmul_fused_ok(gpu, &wg[0], 1, slu, st) +
               (double)!gpu->ops->matmul_fused_ok(gpu, &wg[0], 1, nrm, se);
        pair_ok(backend_set_options(gpu, "gemv_fuse=3"));
        yes += (double)!gpu->ops->matmul_fused_ok(gpu, &wg[0], 1, slu, st) +
               (double)gpu->ops->matmul_fused_ok(gpu, &wg[0], 1, nrm, se);
        pair_ok(backend_set_options(gpu, "gemv_fuse=1"));
        yes += (double)gpu->ops->matmul_fused_ok(gpu, &wg[0], 1, slu, st) +
               (double)gpu->ops->matmul_fused_ok(gpu, &wg[0], 1, nrm, se) +
               (double)!gpu->ops->matmul_fused_ok(gpu, &wg[0], 1, nrm, st);
        pair_ok(backend_set_options(gpu, "gemv_fuse=2"));
    }
    report("mm fused", "matmul_fused_ok: the routes and levels", yes, 0.0);
    for (int i = 0; i < 2; i++) {
        model_host_weight_free(&host[i]);
        backend_weight_free(cpu, &wc[i]);
        backend_weight_free(gpu, &wg[i]);
    }
}

static void cases_mm_fused(void)
{
    /* the fused GEMV is off by default (session 14: no faster): on for these cases; the plain
     * ops they compare with on the slice GEMV (PD_CUDA_INT4_KSPLIT would move them) */
    const int was_ks = matmul_int4_ksplit_route;
    matmul_int4_ksplit_route = 0;
    pair_ok(backend_set_options(gpu, "gemv_fuse=on"));
    case_mm_fused_no();
    case_mm_fused(1, 512, 768, 601);
    case_mm_fused(3, 640, 1280, 602);
    case_mm_fused(4, 1024, 384, 603);
    case_mm_fused(2, 384, 640, 604);
    if (!small_only) {
        case_mm_fused(1, 4096, 14336, 611);
        case_mm_fused(4, 4096, 14336, 612);
    }
    pair_ok(backend_set_options(gpu, "gemv_fuse=off"));
    matmul_int4_ksplit_route = was_ks;
}

/* Session 12: the wgmma INT4 GEMM's f16 activation image made by the fused ops (act_quant's
 * PD_ACT_F16WG) instead of a matmul_quant_act_f16wg launch per GEMM. Every check is byte
 * equality with the unfused path at a fixed printed seed (image rows past n included):
 * add_rmsnorm's image and multipliers == matmul_quant_act_f16wg of its f32 output (and x the
 * same); silu_mul_fp8's == that of silu_mul's output; then, where the wgmma GEMM runs (sm_90a),
 * act_quant answers PD_ACT_F16WG for tiled INT4 weights at n, and matmul_fp8 / matmul_group_fp8
 * / matmul_silu_fp8 on the images give matmul / matmul_group / matmul + silu_mul's bytes.
 * plain (session 28, act_quant's PD_ACT_F16 with backend_cuda_ks_act on): the same checks for the
 * INT4 K-split GEMV's plain f16 rows (n rows, matmul_quant_act_f16's bytes), its GEMVs at n 3..8
 * (matmul_int4_ksplit_route's default). */
static void case_act_f16wg(int n, int d, int f, uint64_t seed, bool plain)
{
    char shape[64], what[160];
    const uint64_t saved = rng_state;
    rng_state = seed;
    const char *op = plain ? "act f16" : "act f16wg";
    const int was_ks = backend_cuda_ks_act;
    backend_cuda_ks_act = plain;
    const size_t rows = plain ? (size_t)n : (size_t)PD_ACT_WG_ROWS(n),
                 imgb = rows * (size_t)(d > f ? d : f) * 2;
    float *x = xmalloc((size_t)n * d * 4), *y = xmalloc((size_t)n * d * 4);
    float *gu = xmalloc((size_t)n * 2 * f * 4);
    uint16_t *w = xmalloc((size_t)d * 2);
    fill_f32(x, (size_t)n * d, 3.0f);
    fill_f32(y, (size_t)n * d, 2.0f);
    fill_f32(gu, (size_t)n * 2 * f, 6.0f);
    for (int i = 0; i < n; i++) /* rows of different sizes */
        for (int j = 0; j < d; j++)
            x[(size_t)i * d + j] *= (float)(1 + i % 5);
    for (int i = 0; i < d; i++)
        w[i] = pd_f32_to_bf16(rng_float() + 1.5f);
    pair_t x1 = pair_new((size_t)n * d * 4, x), x2 = pair_new((size_t)n * d * 4, x);
    pair_t py = pair_new((size_t)n * d * 4, y), pw = pair_new((size_t)d * 2, w);
    pair_t pgu = pair_new((size_t)n * 2 * f * 4, gu);
    pair_t out = pair_new((size_t)n * (d > f ? d : f) * 4, NULL); /* norm, then silu output */
    pair_t img1 = pair_new(imgb, NULL), img2 = pair_new(imgb, NULL);
    pair_t m1 = pair_new((size_t)n * 4, NULL), m2 = pair_new((size_t)n * 4, NULL);
    cudaStream_t st = backend_cuda_stream(gpu);
    snprintf(shape, sizeof shape, "n %d d %d f %d seed %llu", n, d, f, (unsigned long long)seed);

    /* add_rmsnorm: unfused (f32 out, then the image of it) against the fused image */
    pd_act_fp8_t a2 = {img2.g, m2.g, false, !plain, plain};
    gpu->ops->add_rmsnorm(gpu, x1.g, py.g, out.g, pw.g, n, d, 1e-5f, NULL);
    pair_ok(plain ? matmul_quant_act_f16(img1.g, m1.g, out.g, n, d, st)
                  : matmul_quant_act_f16wg(img1.g, m1.g, out.g, n, d, st));
    gpu->ops->add_rmsnorm(gpu, x2.g, py.g, NULL, pw.g, n, d, 1e-5f, &a2);
    snprintf(what, sizeof what, "%s: norm image, mult, x == unfused (bytes)", shape);
    report(op, what,
           (double)(dev_bytes_differ(img1.g, img2.g, rows * (size_t)d * 2) +
                    dev_bytes_differ(m1.g, m2.g, (size_t)n * 4) +
                    dev_bytes_differ(x1.g, x2.g, (size_t)n * d * 4)),
           0.0);

    /* silu_mul: the same */
    pair_ok(gpu->ops->memset(gpu, img1.g, 0xff, imgb));
    pair_ok(gpu->ops->memset(gpu, img2.g, 0xff, imgb));
    gpu->ops->silu_mul(gpu, out.g, pgu.g, n, f);
    pair_ok(plain ? matmul_quant_act_f16(img1.g, m1.g, out.g, n, f, st)
                  : matmul_quant_act_f16wg(img1.g, m1.g, out.g, n, f, st));
    gpu->ops->silu_mul_fp8(gpu, NULL, pgu.g, n, f, &a2);
    snprintf(what, sizeof what, "%s: silu image, mult == unfused (bytes)", shape);
    report(op, what,
           (double)(dev_bytes_differ(img1.g, img2.g, rows * (size_t)f * 2) +
                    dev_bytes_differ(m1.g, m2.g, (size_t)n * 4)),
           0.0);
    pair_ok(gpu->ops->memset(gpu, img2.g, 0xff, imgb)); /* the path of rows too long to stage */
    elementwise_silu_f16wg_smem = 0;
    gpu->ops->silu_mul_fp8(gpu, NULL, pgu.g, n, f, &a2);
    elementwise_silu_f16wg_smem = 1;
    snprintf(what, sizeof what, "%s: silu image (not staged) == unfused (bytes)", shape);
    report(op, what,
           (double)(dev_bytes_differ(img1.g, img2.g, rows * (size_t)f * 2) +
                    dev_bytes_differ(m1.g, m2.g, (size_t)n * 4)),
           0.0);

    const bool gemms = plain ? n >= 3 && n <= MATMUL_INT4_KSPLIT_MAX_N && matmul_int4_ksplit_route
                             : matmul_w4wg_usable() && n >= 25; /* where the GEMMs run on them */
    if (gemms) {
        pd_weight_t host[4], wc[4], wg[4];
        const int64_t Ns[4] = {256, 128, 128, 2 * (int64_t)f}; /* q, k, v, gate_up */
        for (int i = 0; i < 4; i++)
            weight_host_new(PD_WFMT_INT4, Ns[i], d, gpu, &host[i], &wc[i], &wg[i]);
        size_t asks = 0;
        for (int i = 0; i < 4; i++)
            asks += gpu->ops->act_quant(gpu, &wg[i], n) == (plain ? PD_ACT_F16 : PD_ACT_F16WG);
        snprintf(what, sizeof what, "%s: act_quant asks for the image (weights of 4)", shape);
        report(op, what, (double)(4 - asks), 0.0);
        /* the image of x2's norm again (x1 / x2 hold the same x now: no y) */
        gpu->ops->add_rmsnorm(gpu, x1.g, NULL, out.g, pw.g, n, d, 1e-5f, NULL);
        gpu->ops->add_rmsnorm(gpu, x2.g, NULL, NULL, pw.g, n, d, 1e-5f, &a2);
        pair_t o1[3], o2[3];
        float *p1[3], *p2[3];
        const pd_weight_t *ws[3] = {&wg[0], &wg[1], &wg[2]};
        for (int i = 0; i < 3; i++) {
            o1[i] = pair_new((size_t)n * Ns[i] * 4, NULL);
            o2[i] = pair_new((size_t)n * Ns[i] * 4, NULL);
            p1[i] = o1[i].g;
            p2[i] = o2[i].g;
        }
        gpu->ops->matmul_group(gpu, p1, out.g, ws, 3, n);
        gpu->ops->matmul_group_fp8(gpu, p2, &a2, ws, 3, n);
        size_t nd = 0;
        for (int i = 0; i < 3; i++)
            nd += dev_bytes_differ(o1[i].g, o2[i].g, (size_t)n * Ns[i] * 4);
        snprintf(what, sizeof what, "%s: matmul_group_fp8 == matmul_group (bytes)", shape);
        report(op, what, (double)nd, 0.0);
        gpu->ops->matmul(gpu, o1[0].g, out.g, &wg[0], n);
        gpu->ops->matmul_fp8(gpu, o2[0].g, &a2, &wg[0], n);
        snprintf(what, sizeof what, "%s: matmul_fp8 == matmul (bytes)", shape);
        report(op, what, (double)dev_bytes_differ(o1[0].g, o2[0].g, (size_t)n * Ns[0] * 4),
               0.0);
        /* matmul_silu_fp8 (gate_up + SiLU·mul, image in and out) against matmul + silu_mul +
         * the image of its output */
        pair_t g1 = pair_new((size_t)n * 2 * f * 4, NULL),
               g2 = pair_new((size_t)n * 2 * f * 4, NULL);
        gpu->ops->matmul(gpu, g1.g, out.g, &wg[3], n);
        gpu->ops->silu_mul(gpu, out.g, g1.g, n, f);
        pair_ok(plain ? matmul_quant_act_f16(img1.g, m1.g, out.g, n, f, st)
                      : matmul_quant_act_f16wg(img1.g, m1.g, out.g, n, f, st));
        gpu->ops->matmul_silu_fp8(gpu, &a2, g2.g, &a2, &wg[3], n);
        snprintf(what, sizeof what, "%s: matmul_silu_fp8 image == unfused (bytes)", shape);
        report(op, what,
               (double)(dev_bytes_differ(img1.g, img2.g, rows * (size_t)f * 2) +
                        dev_bytes_differ(m1.g, m2.g, (size_t)n * 4)),
               0.0);
        pair_free(&g1);
        pair_free(&g2);
        for (int i = 0; i < 3; i++) {
            pair_free(&o1[i]);
            pair_free(&o2[i]);
        }
        for (int i = 0; i < 4; i++) {
            model_host_weight_free(&host[i]);
            backend_weight_free(cpu, &wc[i]);
            backend_weight_free(gpu, &wg[i]);
        }
    }
    pair_free(&x1);
    pair_free(&x2);
    pair_free(&py);
    pair_free(&pw);
    pair_free(&pgu);
    pair_free(&out);
    pair_free(&img1);
    pair_free(&img2);
    pair_free(&m1);
    pair_free(&m2);
    free(x);
    free(y);
    free(gu);
    free(w);
    backend_cuda_ks_act = was_ks;
    rng_state = saved;
}

static void cases_act_f16wg(void)
{
    case_act_f16wg(1, 512, 640, 601, false);   /* one row, 63 zero rows */
    case_act_f16wg(25, 384, 256, 602, false);  /* the smallest wgmma batch */
    case_act_f16wg(64, 1024, 768, 603, false); /* one full tile */
    case_act_f16wg(100, 640, 512, 604, false); /* two tiles, the second partial */
    if (!small_only)
        case_act_f16wg(64, 4096, 14336, 605, false); /* Llama-3-8B */
    /* the K-split GEMV's plain rows (session 28): writers only at n 1, the GEMVs at n 3..8 */
    case_act_f16wg(1, 512, 640, 611, true);
    case_act_f16wg(3, 384, 256, 612, true);
    case_act_f16wg(4, 1024, 768, 613, true);
    case_act_f16wg(8, 640, 512, 614, true);
    if (!small_only)
        case_act_f16wg(4, 4096, 14336, 615, true); /* Llama-3-8B */
}

static void case_kv_write(pd_kvfmt_t fmt, int kvh, int hd, int n)
{
    char shape[96];
    kv_layout_t l;
    kv_layout_init(&l, 2, kvh, hd, 16, fmt);
    const int n_pages = (n + 15) / 16 + 3, row = kvh * hd;
    pair_t a = arena_new(&l, n_pages);
    float *k = xmalloc((size_t)n * row * 4), *v = xmalloc((size_t)n * row * 4);
    int32_t *slots = xmalloc((size_t)n * 4), *perm = xmalloc((size_t)n_pages * 16 * 4);
    fill_f32(k, (size_t)n * row, 4.0f);
    fill_f32(v, (size_t)n * row, 4.0f);
    for (int i = 0; i < n_pages * 16; i++)
        perm[i] = i;
    for (int i = n_pages * 16 - 1; i > 0; i--) {
        int j = (int)(rng_next() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(slots, perm, (size_t)n * 4);
    for (int i = 3; i < n; i += 7) /* padded rows (graph buckets) write nothing */
        slots[i] = -1;
    pair_t pk = pair_new((size_t)n * row * 4, k), pv = pair_new((size_t)n * row * 4, v);
    pair_t ps = pair_new((size_t)n * 4, slots);
    cpu->ops->kv_write(cpu, a.c, &l, 1, pk.c, pv.c, ps.c, n);
    gpu->ops->kv_write(gpu, a.g, &l, 1, pk.g, pv.g, ps.g, n);
    snprintf(shape, sizeof shape, "%s kvh %d hd %d n %d (bytes differing)", pd_kvfmt_name(fmt), kvh,
             hd, n);
    report("kv_write", shape, err_bytes(&a), 0.0);
    pair_free(&a);
    pair_free(&pk);
    pair_free(&pv);
    pair_free(&ps);
    free(k);
    free(v);
    free(slots);
    free(perm);
}

/* The fused RoPE + KV write (be->ops->rope_kv_write, kernels/kv.h kv_rope_write) against the
 * CUDA backend's own rope, rope, kv_write on the same inputs: q, k and the whole arena must be
 * byte-identical (fixed printed seed; outputs start from the same random arena, rows with slot -1
 * write nothing); q also against the CPU backend (2e-5, as the rope case). */
static void case_rope_kv_write(pd_kvfmt_t fmt, int heads, int kvh, int hd, int n, uint64_t seed)
{
    char shape[128];
    kv_layout_t l;
    const uint64_t saved = rng_state;
    rng_state = seed;
    const int P = 16, n_pages = (n + P - 1) / P + 3;
    kv_layout_init(&l, 2, kvh, hd, P, fmt);
    const size_t qn = (size_t)n * heads * hd, kn = (size_t)n * kvh * hd;
    float *q = xmalloc(qn * 4), *k = xmalloc(kn * 4), *v = xmalloc(kn * 4);
    float *inv = xmalloc((size_t)hd / 2 * 4);
    int32_t *pos = xmalloc((size_t)n * 4), *slots = xmalloc((size_t)n * 4);
    fill_f32(q, qn, 2.0f);
    fill_f32(k, kn, 2.0f);
    fill_f32(v, kn, 2.0f);
    for (int j = 0; j < hd / 2; j++)
        inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    for (int i = 0; i < n; i++) {
        pos[i] = (int32_t)(rng_next() % 32768u);
        slots[i] = (int32_t)(n_pages * P - 1 - i); /* distinct, from the last page down */
    }
    for (int i = 2; i < n; i += 5)
        slots[i] = -1;
    uint8_t *host = xmalloc((size_t)n_pages * l.page_bytes);
    for (size_t i = 0; i < (size_t)n_pages * l.page_bytes; i++)
        host[i] = (uint8_t)rng_next();
    /* pair: .c = the unfused GPU path, .g = the fused op (both on the GPU); cq: the CPU */
    pair_t a = pair_new((size_t)n_pages * l.page_bytes, host);
    pair_t pq = pair_new(qn * 4, q), pk = pair_new(kn * 4, k), pv = pair_new(kn * 4, v);
    pair_t pp = pair_new((size_t)n * 4, pos), ps = pair_new((size_t)n * 4, slots);
    pair_t pi = pair_new((size_t)hd / 2 * 4, inv);
    void *uq, *uk, *ua;
    pair_ok(gpu->ops->alloc(gpu, qn * 4, &uq));
    pair_ok(gpu->ops->alloc(gpu, kn * 4, &uk));
    pair_ok(gpu->ops->alloc(gpu, a.bytes, &ua));
    pair_ok(gpu->ops->upload(gpu, uq, q, qn * 4));
    pair_ok(gpu->ops->upload(gpu, uk, k, kn * 4));
    pair_ok(gpu->ops->upload(gpu, ua, host, a.bytes));
    gpu->ops->rope(gpu, uq, pp.g, pi.g, n, heads, hd);
    gpu->ops->rope(gpu, uk, pp.g, pi.g, n, kvh, hd);
    gpu->ops->kv_write(gpu, ua, &l, 1, uk, pv.g, ps.g, n);
    gpu->ops->rope_kv_write(gpu, pq.g, pk.g, pv.g, pp.g, pi.g, n, heads, a.g, &l, 1, ps.g);
    cpu->ops->rope(cpu, pq.c, pp.c, pi.c, n, heads, hd);
    snprintf(shape, sizeof shape, "%s h %d/%d hd %d n %d seed %llu: q vs cpu", pd_kvfmt_name(fmt),
             heads, kvh, hd, n, (unsigned long long)seed);
    report("rope_kv_wr", shape, err_f32(&pq, qn), 2e-5);
    /* now the .c sides hold the unfused GPU results */
    pair_ok(gpu->ops->sync(gpu));
    float *tq = xmalloc(qn * 4), *tk = xmalloc(kn * 4);
    uint8_t *ta = xmalloc(a.bytes);
    pair_ok(gpu->ops->download(gpu, tq, uq, qn * 4));
    pair_ok(gpu->ops->download(gpu, tk, uk, kn * 4));
    pair_ok(gpu->ops->download(gpu, ta, ua, a.bytes));
    pair_ok(cpu->ops->upload(cpu, pq.c, tq, qn * 4));
    pair_ok(cpu->ops->upload(cpu, pk.c, tk, kn * 4));
    pair_ok(cpu->ops->upload(cpu, a.c, ta, a.bytes));
    snprintf(shape, sizeof shape, "%s h %d/%d hd %d n %d: q, k, arena vs unfused (bytes)",
             pd_kvfmt_name(fmt), heads, kvh, hd, n);
    report("rope_kv_wr", shape, err_bytes(&pq) + err_bytes(&pk) + err_bytes(&a), 0.0);
    gpu->ops->free(gpu, uq);
    gpu->ops->free(gpu, uk);
    gpu->ops->free(gpu, ua);
    pair_free(&a);
    pair_free(&pq);
    pair_free(&pk);
    pair_free(&pv);
    pair_free(&pp);
    pair_free(&ps);
    pair_free(&pi);
    free(q);
    free(k);
    free(v);
    free(inv);
    free(pos);
    free(slots);
    free(host);
    free(tq);
    free(tk);
    free(ta);
    rng_state = saved;
}

/* Poisons (0xff bytes: NaN in bf16, fp8 e4m3 and f32) tokens from..page_tokens-1 of page `page`
 * of layer `layer` on both backends: K, V and (fp8) their scales. A kernel that lets a token past
 * a sequence's context into a product shows up as NaN. */
static void arena_poison_tail(pair_t *a, const kv_layout_t *l, int layer, int page, int from)
{
    const size_t row = (size_t)l->n_kv_heads * l->head_dim * l->elem_bytes;
    for (int t = from; t < l->page_tokens; t++)
        for (int side = 0; side < 2; side++) {
            size_t off = (size_t)page * l->page_bytes + kv_layout_data_off(l, layer, side) +
                         (size_t)t * row;
            pair_ok(cpu->ops->memset(cpu, (uint8_t *)a->c + off, 0xff, row));
            pair_ok(gpu->ops->memset(gpu, (uint8_t *)a->g + off, 0xff, row));
            if (l->fmt == PD_KV_FP8) {
                const size_t sb = (size_t)l->n_kv_heads * 4;
                off = (size_t)page * l->page_bytes + kv_layout_scale_off(l, layer, side) +
                      (size_t)t * sb;
                pair_ok(cpu->ops->memset(cpu, (uint8_t *)a->c + off, 0xff, sb));
                pair_ok(gpu->ops->memset(gpu, (uint8_t *)a->g + off, 0xff, sb));
            }
        }
}

/* page size of the arenas of case_attention and case_attention_tc (16 unless a case sets it:
 * flash variants 10..12 copy whole pages with TMA, 128 / P per 128-key tile; the tensor-core
 * decode kernel reads a 16-token tile from one page when the page size is a multiple of 16, else
 * per token) */
static int attn_case_page = 16;

/* n_seqs sequences with q_len[s] new rows and ctx[s] tokens of context each. The K / V rows past
 * each sequence's context in its last page (layer 1, the one read) are poisoned on both backends
 * (0xff bytes: NaN in bf16 and fp8; fp8 scales too), as case_attention_tc: a kernel that reads
 * them into a product (0 x NaN) shows up as NaN. */
static void case_attention(pd_kvfmt_t fmt, int heads, int kvh, int hd, int n_seqs, const int *q_len,
                           const int *ctx, bool hints, const char *what)
{
    char shape[128];
    kv_layout_t l;
    const int P = attn_case_page;
    int max_pages = 1, total_pages = 0, n_rows = 0, max_ctx = 0;
    kv_layout_init(&l, 2, kvh, hd, P, fmt);
    for (int s = 0; s < n_seqs; s++) {
        int np = (ctx[s] + P - 1) / P;
        max_pages = np > max_pages ? np : max_pages;
        total_pages += np;
        n_rows += q_len[s];
        max_ctx = ctx[s] > max_ctx ? ctx[s] : max_ctx;
    }
    int n_pages = total_pages + 2;
    int32_t *perm = xmalloc((size_t)n_pages * 4), *bt = xmalloc((size_t)n_seqs * max_pages * 4);
    int32_t *qs = xmalloc(((size_t)n_seqs + 1) * 4);
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)(rng_next() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int used = 0;
    qs[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        int np = (ctx[s] + P - 1) / P;
        for (int i = 0; i < max_pages; i++)
            bt[s * max_pages + i] = i < np ? perm[used + i] : 0;
        used += np;
        qs[s + 1] = qs[s] + q_len[s];
    }
    pair_t a = arena_new(&l, n_pages);
    for (int s = 0; s < n_seqs; s++) { /* poison the last page's tokens past ctx[s] */
        const int np = (ctx[s] + P - 1) / P;
        arena_poison_tail(&a, &l, 1, bt[s * max_pages + np - 1], ctx[s] - (np - 1) * P);
    }
    size_t qn = (size_t)n_rows * heads * hd;
    float *q = xmalloc(qn * 4);
    fill_f32(q, qn, 2.0f);
    pair_t pq = pair_new(qn * 4, q), out = pair_new(qn * 4, NULL);
    pair_t pqs = pair_new(((size_t)n_seqs + 1) * 4, qs), pctx = pair_new((size_t)n_seqs * 4, ctx);
    pair_t pbt = pair_new((size_t)n_seqs * max_pages * 4, bt);
    pd_attn_batch_t bc = {n_seqs, max_pages, pqs.c, pctx.c, pbt.c, 0, 0};
    pd_attn_batch_t bg = {
        n_seqs, max_pages, pqs.g, pctx.g, pbt.g, hints ? n_rows : 0, hints ? max_ctx : 0};
    cpu->ops->attention(cpu, out.c, pq.c, a.c, &l, 1, &bc, heads);
    gpu->ops->attention(gpu, out.g, pq.g, a.g, &l, 1, &bg, heads);
    /* prefill-shaped batches (>= 16 rows per sequence, bf16 / fp8 KV, hd 64 / 128) run as flash
     * attention (kernels/attention_flash.h): Q and P are rounded to bf16 on the tensor cores (fp8
     * KV: K and V too), each a 2^-9 relative rounding that moves an output element by ~2e-3 of
     * its (row, head) vector's size, so the per-element error (err_f32_vec) gets 3e-2 (about 10
     * sigma over 10^7 elements) and the l2 error 6e-3; everything else runs in f32: 2e-5 */
    const bool flash = fmt != PD_KV_F32 && (hd == 64 || hd == 128) && n_rows >= 16 * n_seqs;
    snprintf(shape, sizeof shape, "%s %s h %d/%d hd %d rows %d ctx<=%d page %d%s",
             pd_kvfmt_name(fmt), what, heads, kvh, hd, n_rows, max_ctx, P, flash ? " flash" : "");
    if (flash) { /* every kernel variant (PD_CUDA_FLASH_VARIANT, read at each launch; 4..12,
                  * the Hopper kernel, run where it applies: sm_90, bf16, hd 128, even group;
                  * 10..12 also a page size of 8..128 dividing 128) */
        const char *nv_env = getenv("PD_GPU_FLASH_VARIANTS"); /* run variants 0..N-1 (default 13) */
        const int nv = nv_env && atoi(nv_env) > 0 && atoi(nv_env) < 13 ? atoi(nv_env) : 13;
        for (int v = 0; v < nv; v++) {
            char vs[16];
            snprintf(vs, sizeof vs, "%d", v);
            setenv("PD_CUDA_FLASH_VARIANT", vs, 1);
            pair_ok(gpu->ops->memset(gpu, out.g, 0xff, out.bytes)); /* poison again */
            gpu->ops->attention(gpu, out.g, pq.g, a.g, &l, 1, &bg, heads);
            snprintf(shape, sizeof shape, "%s %s h %d/%d hd %d rows %d ctx<=%d p %d flash v%d",
                     pd_kvfmt_name(fmt), what, heads, kvh, hd, n_rows, max_ctx, P, v);
            report("attention", shape, err_f32_vec(&out, (size_t)n_rows * heads, (size_t)hd), 3e-2);
            snprintf(shape, sizeof shape, "%s %s h %d/%d hd %d rows %d v%d (l2)",
                     pd_kvfmt_name(fmt), what, heads, kvh, hd, n_rows, v);
            report("attention", shape, err_f32_l2(&out, qn), 6e-3);
        }
        unsetenv("PD_CUDA_FLASH_VARIANT");
    } else {
        report("attention", shape, err_f32(&out, qn), 2e-5);
    }
    pair_free(&a);
    pair_free(&pq);
    pair_free(&out);
    pair_free(&pqs);
    pair_free(&pctx);
    pair_free(&pbt);
    free(perm);
    free(bt);
    free(qs);
    free(q);
}

/* Prefill shapes (flash attention for bf16 / fp8, every kernel variant: case_attention): varlen
 * batches whose rows sit at the end of longer contexts (chunked prefill, prefix hits), partial
 * 64-row tiles, one decode row inside a prefill batch, GQA groups 1, 2, 4 and 8, head_dim 64. */
static void cases_flash(pd_kvfmt_t fmt)
{
    const int vq[] = {100, 37, 256, 64, 1}, vc[] = {100, 500, 256, 1000, 77};
    case_attention(fmt, 4, 2, 128, 5, vq, vc, true, "varlen chunked");
    case_attention(fmt, 4, 2, 64, 5, vq, vc, false, "hd 64 varlen");
    case_attention(fmt, 4, 4, 128, 5, vq, vc, true, "group 1 varlen");
    const int lq[] = {130}, lc[] = {130};
    case_attention(fmt, 16, 2, 128, 1, lq, lc, true, "group 8 causal");
    /* pages of 32 and 8 tokens (TMA boxes of 4 / 16 pages per 128-key tile) */
    for (int pi = 0; pi < 2; pi++) {
        attn_case_page = pi ? 8 : 32;
        case_attention(fmt, 4, 2, 128, 5, vq, vc, true, "varlen chunked");
    }
    attn_case_page = 16;
    const int bq[] = {1024}, bc[] = {1024};
    if (!small_only)
        case_attention(fmt, 32, 8, 128, 1, bq, bc, true, "8B causal 1024");
    const int xq[] = {512, 300, 1, 129}, xc[] = {512, 812, 40, 193};
    if (!small_only)
        case_attention(fmt, 32, 8, 128, 4, xq, xc, true, "8B varlen");
}

/* case_attention_tc's GPU run once more on the same inputs under whatever switch the caller set
 * (the output poisoned first), checked against the CPU output in out as the case's first run is
 * and reported under `what`. */
static void attn_tc_again(pair_t *out, const pair_t *pq, const pair_t *a, const kv_layout_t *l,
                          const pd_attn_batch_t *bg, int heads, int n_rows, int hd,
                          const char *what)
{
    const size_t qn = (size_t)n_rows * heads * hd;
    pair_ok(gpu->ops->memset(gpu, out->g, 0xff, qn * 4));
    gpu->ops->attention(gpu, out->g, pq->g, a->g, l, 1, bg, heads);
    pair_ok(gpu->ops->sync(gpu));
    report("attention", what, err_f32(out, qn), 2e-5);
    report("attention", "  (per element, err_f32_vec)",
           err_f32_vec(out, (size_t)n_rows * heads, (size_t)hd), 1e-4);
}

/* The tensor-core decode attention (kernels/attention.cu, attention__tc_kernel) at a fixed,
 * printed seed: n_seqs sequences with q_len[s] rows at the end of ctx[s] tokens (page size 16, 2
 * layers, layer 1 read). The K / V rows and scales past each sequence's context in its last page
 * are poisoned (0xff bytes: NaN in bf16, fp8 e4m3 and f32) on both backends, so a masked token
 * that leaks shows up as NaN; the output starts poisoned too. tc = 0 runs the SIMT kernels
 * (attention_decode_tc = 0) on the same inputs. Checks (1) max |gpu - cpu| / max |cpu| <= 2e-5
 * (as the SIMT path) and (2) per element |gpu - cpu| / (|cpu| + rms of its (row, head) vector)
 * <= 1e-4 (err_f32_vec). The scores and P run on the tensor cores as f16 hi + lo parts (fp8 KV,
 * 22 bits) or bf16 hi + mid + lo (bf16 KV, 24 bits) with f32 accumulation: the expected error is
 * ~1e-6 of an element's vector. BF16 KV also runs the other variants of attention_tc_bf16
 * (3-warp blocks; hi + lo parts, 16 bits: ~1e-5 expected) on the same inputs. */
static void case_attention_tc(pd_kvfmt_t fmt, int heads, int kvh, int hd, int n_seqs,
                              const int *q_len, const int *ctx, bool hints, int tc, uint64_t seed,
                              const char *what)
{
    char shape[160];
    kv_layout_t l;
    const int P = attn_case_page;
    const uint64_t saved = rng_state;
    rng_state = seed;
    int max_pages = 1, total_pages = 0, n_rows = 0, max_ctx = 0;
    kv_layout_init(&l, 2, kvh, hd, P, fmt);
    for (int s = 0; s < n_seqs; s++) {
        int np = (ctx[s] + P - 1) / P;
        max_pages = np > max_pages ? np : max_pages;
        total_pages += np;
        n_rows += q_len[s];
        max_ctx = ctx[s] > max_ctx ? ctx[s] : max_ctx;
    }
    int n_pages = total_pages + 2;
    int32_t *perm = xmalloc((size_t)n_pages * 4), *bt = xmalloc((size_t)n_seqs * max_pages * 4);
    int32_t *qs = xmalloc(((size_t)n_seqs + 1) * 4);
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)(rng_next() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    pair_t a = arena_new(&l, n_pages);
    int used = 0;
    qs[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        int np = (ctx[s] + P - 1) / P;
        for (int i = 0; i < max_pages; i++)
            bt[s * max_pages + i] = i < np ? perm[used + i] : 0;
        used += np;
        qs[s + 1] = qs[s] + q_len[s];
        /* poison the tokens past ctx[s] in the last page (layer 1: K, V, and fp8 scales) */
        arena_poison_tail(&a, &l, 1, bt[s * max_pages + np - 1], ctx[s] - (np - 1) * P);
    }
    size_t qn = (size_t)n_rows * heads * hd;
    float *q = xmalloc(qn * 4);
    fill_f32(q, qn, 2.0f);
    pair_t pq = pair_new(qn * 4, q), out = pair_new(qn * 4, NULL);
    pair_t pqs = pair_new(((size_t)n_seqs + 1) * 4, qs), pctx = pair_new((size_t)n_seqs * 4, ctx);
    pair_t pbt = pair_new((size_t)n_seqs * max_pages * 4, bt);
    pd_attn_batch_t bc = {n_seqs, max_pages, pqs.c, pctx.c, pbt.c, 0, 0};
    pd_attn_batch_t bg = {
        n_seqs, max_pages, pqs.g, pctx.g, pbt.g, hints ? n_rows : 0, hints ? max_ctx : 0};
    cpu->ops->attention(cpu, out.c, pq.c, a.c, &l, 1, &bc, heads);
    attention_decode_tc = tc;
    gpu->ops->attention(gpu, out.g, pq.g, a.g, &l, 1, &bg, heads);
    pair_ok(gpu->ops->sync(gpu));
    attention_decode_tc = 1;
    snprintf(shape, sizeof shape,
             "%s %s%s h %d/%d hd %d B %d rows %d ctx<=%d page %d splits %d seed %llu",
             pd_kvfmt_name(fmt),
             !tc              ? "simt "
             : attention_fold ? "tc fold "
                              : "tc ",
             what, heads, kvh, hd, n_seqs, n_rows, max_ctx, P,
             attention_splits(n_rows, kvh, hints ? max_ctx : max_pages * P, fmt),
             (unsigned long long)seed);
    report("attention", shape, err_f32(&out, qn), 2e-5);
    report("attention", "  (per element, err_f32_vec)",
           err_f32_vec(&out, (size_t)n_rows * heads, (size_t)hd), 1e-4);
    if (tc && fmt == PD_KV_FP8 && hd == 128) { /* two tiles per warp step (attention_tc_pair) */
        const int pair_was = attention_tc_pair;
        attention_tc_pair = !pair_was;
        attn_tc_again(&out, &pq, &a, &l, &bg, heads, n_rows, hd,
                      pair_was ? "  (one tile per warp step)" : "  (two tiles per warp step)");
        attention_tc_pair = pair_was;
    }
    if (tc && fmt == PD_KV_BF16) { /* the other variants of attention_tc_bf16 (session 25) */
        const int v_was = attention_tc_bf16;
        static const char *const vname[4] = {"4 warps, 3 parts", "3 warps, 3 parts",
                                             "4 warps, 2 parts", "3 warps, 2 parts"};
        for (int v = 0; v < 4; v++) {
            if (v == v_was)
                continue;
            attention_tc_bf16 = v;
            /* the split count may change with the variant (attention_splits): the CPU output
             * is the same, the GPU run takes the variant's splits through the backend */
            char what2[80];
            snprintf(what2, sizeof what2, "  (bf16 variant %d: %s, splits %d)", v, vname[v],
                     attention_splits(n_rows, kvh, hints ? max_ctx : max_pages * P, fmt));
            attn_tc_again(&out, &pq, &a, &l, &bg, heads, n_rows, hd, what2);
        }
        attention_tc_bf16 = v_was;
    }
    pair_free(&a);
    pair_free(&pq);
    pair_free(&out);
    pair_free(&pqs);
    pair_free(&pctx);
    pair_free(&pbt);
    free(perm);
    free(bt);
    free(qs);
    free(q);
    rng_state = saved;
}

/* Decode attention cases (tensor-core kernel unless tc = 0): batch 1..64, contexts 1..32k (not
 * multiples of the page or split size), GQA groups 1 / 4 / 8, head_dim 64 / 128. */
static void cases_attention_tc(void)
{
    static int ones[64], c64[64], c64b[64];
    for (int i = 0; i < 64; i++) {
        ones[i] = 1;
        c64[i] = 1024 - (i % 7) * 3;    /* 1003 .. 1024 */
        c64b[i] = 1 + (i * 613) % 2047; /* 1 .. 2047 */
    }
    const pd_kvfmt_t fs[] = {PD_KV_FP8, PD_KV_BF16};
    const int fold_was = attention_fold;
    /* fold 1: split contexts merged inside the kernel (attention_fold), the same seeds */
    for (int fold = 0; fold < 2; fold++)
        for (int f = 0; f < 2; f++) {
            attention_fold = fold;
            const pd_kvfmt_t k = fs[f];
            const uint64_t sd = 201 + 20 * (uint64_t)f;
            const int c1[] = {1}, c5[] = {33, 1, 1000, 777, 64}, c3[] = {1, 17, 5000};
            const int c7[] = {1, 15, 16, 17, 300, 2999, 64};
            case_attention_tc(k, 4, 2, 128, 1, ones, c1, true, 1, sd, "ctx 1");
            case_attention_tc(k, 16, 2, 128, 5, ones, c5, true, 1, sd + 1, "group 8");
            case_attention_tc(k, 8, 8, 128, 3, ones, c3, true, 1, sd + 2, "group 1");
            case_attention_tc(k, 8, 2, 64, 7, ones, c7, true, 1, sd + 3, "hd 64");
            case_attention_tc(k, 8, 2, 64, 7, ones, c7, false, 1, sd + 4, "hd 64 no hints");
            const int mq[] = {2, 1, 5}, mc[] = {100, 50, 333};
            case_attention_tc(k, 4, 2, 128, 3, mq, mc, true, 1, sd + 5, "rows 2/1/5");
            case_attention_tc(k, 4, 2, 128, 5, ones, c5, true, 0, sd + 6, "group 2");
            /* pages of 8 tokens (a tile spans two pages: the per-token path) and of 32 (a tile
             * is half a page) */
            const int pages[] = {8, 32};
            for (int pi = 0; pi < 2; pi++) {
                attn_case_page = pages[pi];
                case_attention_tc(k, 16, 2, 128, 5, ones, c5, true, 1, sd + 14 + pi, "group 8");
                case_attention_tc(k, 8, 2, 64, 3, mq, mc, true, 1, sd + 16 + pi, "hd 64 rows");
            }
            attn_case_page = 16;
            if (small_only)
                continue;
            case_attention_tc(k, 32, 8, 128, 64, ones, c64, true, 1, sd + 7, "8B b64");
            case_attention_tc(k, 32, 8, 128, 64, ones, c64, true, 0, sd + 8, "8B b64");
            case_attention_tc(k, 32, 4, 64, 64, ones, c64b, true, 1, sd + 9, "hd 64 group 8 b64");
            case_attention_tc(k, 32, 8, 128, 16, ones, c64b, true, 1, sd + 10, "8B b16");
            const int l1[] = {32749}, l2[] = {32768}, l3[] = {8191, 20000};
            case_attention_tc(k, 32, 8, 128, 1, ones, l1, true, 1, sd + 11, "8B b1 32k");
            case_attention_tc(k, 32, 8, 128, 1, ones, l2, false, 1, sd + 12, "8B b1 32k no hints");
            case_attention_tc(k, 32, 8, 128, 2, ones, l3, true, 1, sd + 13, "8B b2");
        }
    attention_fold = fold_was;
}

static void case_moe_route(int n, int E, int k, bool norm)
{
    char shape[96];
    float *lg = xmalloc((size_t)n * E * 4);
    fill_f32(lg, (size_t)n * E, 4.0f);
    pair_t pl = pair_new((size_t)n * E * 4, lg), ids = pair_new((size_t)n * k * 4, NULL);
    pair_t w = pair_new((size_t)n * k * 4, NULL);
    cpu->ops->moe_route(cpu, ids.c, w.c, pl.c, n, E, k, norm);
    gpu->ops->moe_route(gpu, ids.g, w.g, pl.g, n, E, k, norm);
    snprintf(shape, sizeof shape, "n %d experts %d k %d%s (ids differing)", n, E, k,
             norm ? " norm" : "");
    report("moe_route", shape, err_bytes(&ids), 0.0);
    snprintf(shape, sizeof shape, "n %d experts %d k %d%s (weights)", n, E, k, norm ? " norm" : "");
    report("moe_route", shape, err_f32(&w, (size_t)n * k), 1e-5);
    pair_free(&pl);
    pair_free(&ids);
    pair_free(&w);
    free(lg);
}

/* moe_group against the host grouping (slots in order within an expert, as cuda__moe groups
 * them): offsets, perm, inv and the experts in use must agree exactly (count of differing
 * entries); ids skewed so that some experts get many slots and others none. */
static void case_moe_group(int m, int E)
{
    char shape[96];
    int32_t *ids = xmalloc((size_t)m * 4), *off = xmalloc(((size_t)E + 1) * 4),
            *act = xmalloc(((size_t)E + 1) * 4), *perm = xmalloc((size_t)m * 4),
            *inv = xmalloc((size_t)m * 4), *g = xmalloc(((size_t)2 * E + 2 + 2 * m) * 4);
    for (int i = 0; i < m; i++) /* half the slots on the first eighth of the experts */
        ids[i] = (int32_t)(rng_next() % (uint64_t)(i % 2 ? E : (E + 7) / 8));
    int o = 0, a = 0;
    for (int e = 0; e < E; e++) {
        off[e] = o;
        int c0 = o;
        for (int i = 0; i < m; i++)
            if (ids[i] == e) {
                perm[o] = i;
                inv[i] = o++;
            }
        if (o > c0)
            act[a++] = e;
    }
    off[E] = o;
    act[E] = a;
    int32_t *d;
    pair_ok(cudaMalloc((void **)&d, ((size_t)2 * E + 2 + 3 * m) * 4) == cudaSuccess ? PD_OK
                                                                                    : PD_ERR_CUDA);
    int32_t *d_off = d, *d_act = d + E + 1, *d_perm = d + 2 * E + 2, *d_inv = d_perm + m,
            *d_ids = d_inv + m;
    cudaMemset(d, 0xff, ((size_t)2 * E + 2 + 2 * m) * 4);
    cudaMemcpy(d_ids, ids, (size_t)m * 4, cudaMemcpyHostToDevice);
    pair_ok(moe_group(d_off, d_perm, d_inv, d_act, d_ids, m, E, 0));
    pair_ok(cudaMemcpy(g, d, ((size_t)2 * E + 2 + 2 * m) * 4, cudaMemcpyDeviceToHost) == cudaSuccess
                ? PD_OK
                : PD_ERR_CUDA);
    size_t bad = 0;
    for (int e = 0; e <= E; e++)
        bad += g[e] != off[e];
    bad += g[E + 1 + E] != act[E];
    for (int i = 0; i < a; i++)
        bad += g[E + 1 + i] != act[i];
    for (int i = 0; i < m; i++)
        bad += (g[2 * E + 2 + i] != perm[i]) + (g[2 * E + 2 + m + i] != inv[i]);
    snprintf(shape, sizeof shape, "m %d experts %d (%d in use; entries differing)", m, E, a);
    report("moe_group", shape, (double)bad, 0.0);
    cudaFree(d);
    free(ids);
    free(off);
    free(act);
    free(perm);
    free(inv);
    free(g);
}

/* max over elements of |gpu - cpu| / rms(cpu row), rows of d: a per-element check scaled by
 * the size of the row it sits in (the MoE output has no single K to scale by) */
static double err_row_rms(const pair_t *p, int n, int d)
{
    float *c, *g;
    double worst = 0.0;
    pair_get(p, (void **)&c, (void **)&g);
    for (int i = 0; i < n && worst < INFINITY; i++) {
        double ss = 0.0;
        for (int j = 0; j < d; j++)
            ss += (double)c[(size_t)i * d + j] * c[(size_t)i * d + j];
        const double rms = sqrt(ss / d) + 1e-30;
        for (int j = 0; j < d; j++) {
            const double a = c[(size_t)i * d + j], b = g[(size_t)i * d + j];
            if (isnan(a) || isnan(b)) {
                worst = INFINITY;
                break;
            }
            worst = fmax(worst, fabs(a - b) / rms);
        }
    }
    free(c);
    free(g);
    return worst;
}

/* The GPU's moe_experts into out (n, d) f32, which holds its eager result, captured in a graph
 * and replayed over a poisoned out: the number of floats that differ from the eager result (all
 * n * d when the capture fails); out holds the replay's result after. */
static size_t moe_graph_diff(float *out, const float *x, const int32_t *ids, const float *w,
                             const pd_weight_t *gu, const pd_weight_t *dn, int n, int k, int d,
                             int f)
{
    const size_t nf = (size_t)n * d;
    float *eager = xmalloc(nf * 4), *replay = xmalloc(nf * 4);
    pair_ok(gpu->ops->download(gpu, eager, out, nf * 4));
    void *graph = NULL;
    pair_ok(gpu->ops->graph_begin(gpu));
    gpu->ops->moe_experts(gpu, out, x, ids, w, gu, dn, n, k, d, f);
    size_t bad = nf;
    if (gpu->ops->graph_end(gpu, &graph) == PD_OK) {
        pair_ok(gpu->ops->memset(gpu, out, 0xff, nf * 4));
        pair_ok(gpu->ops->graph_launch(gpu, graph));
        pair_ok(gpu->ops->download(gpu, replay, out, nf * 4));
        bad = 0;
        for (size_t i = 0; i < nf; i++)
            bad += memcmp(&eager[i], &replay[i], 4) != 0;
        gpu->ops->graph_free(gpu, graph);
    }
    free(eager);
    free(replay);
    return bad;
}

/* The grouped device path of moe_experts (experts registered with moe_prepare: moe_group +
 * moe_gmm, f32 arithmetic on f32 activations) against the CPU backend, per element (row rms);
 * then the same call captured in a CUDA graph and replayed over poisoned output: bit-identical
 * to the eager call (differing floats). BF16 / INT4 on moe_gmm / moe_gmm2: f32 both sides, only
 * the summation order differs (1e-4); INT4 on moe_gmm3 (the default): f16 operands, 2e-3 as
 * case_moe_gmm2's; FP8: an activation's fp8 rounding may flip between the two (2^-4 of one input
 * of the second matmul), 3e-2. */
static void case_moe_grouped(pd_wfmt_t fmt, int n, int E, int k, int d, int f, const char *what)
{
    char shape[96];
    pd_weight_t *guc = xmalloc(sizeof(pd_weight_t) * E), *gug = xmalloc(sizeof(pd_weight_t) * E);
    pd_weight_t *dc = xmalloc(sizeof(pd_weight_t) * E), *dg = xmalloc(sizeof(pd_weight_t) * E);
    for (int e = 0; e < E; e++) {
        weight_new(fmt, 2 * f, d, &guc[e], &gug[e]);
        weight_new(fmt, d, f, &dc[e], &dg[e]);
    }
    pair_ok(gpu->ops->moe_prepare(gpu, gug, dg, E));
    float *x = xmalloc((size_t)n * d * 4), *lg = xmalloc((size_t)n * E * 4);
    int32_t *ids = xmalloc((size_t)n * k * 4);
    float *w = xmalloc((size_t)n * k * 4);
    fill_f32(x, (size_t)n * d, 2.0f);
    fill_f32(lg, (size_t)n * E, 4.0f);
    cpu->ops->moe_route(cpu, ids, w, lg, n, E, k, true);
    pair_t px = pair_new((size_t)n * d * 4, x), pi = pair_new((size_t)n * k * 4, ids);
    pair_t pw = pair_new((size_t)n * k * 4, w), out = pair_new((size_t)n * d * 4, NULL);
    cpu->ops->moe_experts(cpu, out.c, px.c, pi.c, pw.c, guc, dc, n, k, d, f);
    gpu->ops->moe_experts(gpu, out.g, px.g, pi.g, pw.g, gug, dg, n, k, d, f);
    snprintf(shape, sizeof shape, "%s %s n %d E %d k %d d %d f %d (row rms)", what,
             pd_wfmt_name(fmt), n, E, k, d, f);
    const int kern = backend_cuda_set_moe_gmm(gpu, 1); /* the backend's kernel, restored */
    backend_cuda_set_moe_gmm(gpu, kern);
    report("moe_grouped", shape, err_row_rms(&out, n, d),
           fmt == PD_WFMT_FP8                 ? 3e-2
           : fmt == PD_WFMT_INT4 && kern == 3 ? 2e-3
                                              : 1e-4);
    /* graph: capture, poison, replay; compare with the eager result */
    const size_t bad = moe_graph_diff(out.g, px.g, pi.g, pw.g, gug, dg, n, k, d, f);
    snprintf(shape, sizeof shape, "%s %s n %d graph replay (floats differing)", what,
             pd_wfmt_name(fmt), n);
    report("moe_grouped", shape, (double)bad, 0.0);
    for (int e = 0; e < E; e++) {
        backend_weight_free(cpu, &guc[e]);
        backend_weight_free(gpu, &gug[e]);
        backend_weight_free(cpu, &dc[e]);
        backend_weight_free(gpu, &dg[e]);
    }
    pair_free(&px);
    pair_free(&pi);
    pair_free(&pw);
    pair_free(&out);
    free(guc);
    free(gug);
    free(dc);
    free(dg);
    free(x);
    free(lg);
    free(ids);
    free(w);
}

/* The three grouped matmul kernels (moe_gmm, moe_gmm2, moe_gmm3: backend_cuda_set_moe_gmm 1..3)
 * through the grouped device path of moe_experts, against the CPU backend per element (row rms,
 * the tolerances of case_moe_grouped; moe_gmm3 INT4 2e-3: f16 operands), at a fixed printed seed
 * and fixed expert loads: loads[e] slots on expert e (0: empty; 1, 9, 40: one token, one staged
 * pass plus one row, five passes), filled slot column by column (no load above n, so a token never
 * meets an expert twice); then moe_gmm2 and moe_gmm3 each captured in a graph and replayed over
 * poisoned output: bit-identical to its eager call. */
static void case_moe_gmm2(pd_wfmt_t fmt, int n, int E, int k, int d, int f, const int *loads,
                          uint64_t seed, const char *what)
{
    char shape[128];
    rng_state = seed;
    pd_weight_t *guc = xmalloc(sizeof(pd_weight_t) * E), *gug = xmalloc(sizeof(pd_weight_t) * E);
    pd_weight_t *dc = xmalloc(sizeof(pd_weight_t) * E), *dg = xmalloc(sizeof(pd_weight_t) * E);
    for (int e = 0; e < E; e++) {
        weight_new(fmt, 2 * f, d, &guc[e], &gug[e]);
        weight_new(fmt, d, f, &dc[e], &dg[e]);
    }
    pair_ok(gpu->ops->moe_prepare(gpu, gug, dg, E));
    const size_t m = (size_t)n * k;
    float *x = xmalloc((size_t)n * d * 4), *w = xmalloc(m * 4);
    int32_t *ids = xmalloc(m * 4);
    size_t filled = 0;
    for (int e = 0; e < E; e++)
        for (int i = 0; i < loads[e] && filled < m; i++, filled++) {
            const size_t j = filled / (size_t)n, t = filled % (size_t)n; /* column j, token t */
            ids[t * k + j] = e;
        }
    if (filled != m) {
        fprintf(stderr, "case_moe_gmm2: loads do not add up to n * k = %zu\n", m);
        exit(1);
    }
    fill_f32(x, (size_t)n * d, 2.0f);
    for (size_t i = 0; i < m; i++)
        w[i] = 0.25f + 0.5f * (rng_float() + 1.0f) / 2.0f;
    pair_t px = pair_new((size_t)n * d * 4, x), pi = pair_new(m * 4, ids);
    pair_t pw = pair_new(m * 4, w), out = pair_new((size_t)n * d * 4, NULL);
    cpu->ops->moe_experts(cpu, out.c, px.c, pi.c, pw.c, guc, dc, n, k, d, f);
    int was = 0; /* the backend's kernel before this case, restored at its end */
    for (int kern = 1; kern <= 3; kern++) {
        /* moe_gmm3 INT4 rounds weights and activations to f16 (2^-11 each per product, as the
         * dense INT4 mma GEMM); the others compute in f32 */
        const double tol = fmt == PD_WFMT_FP8                 ? 3e-2
                           : kern == 3 && fmt == PD_WFMT_INT4 ? 2e-3
                                                              : 1e-4;
        const int prev = backend_cuda_set_moe_gmm(gpu, kern);
        was = kern == 1 ? prev : was;
        if (!prev) {
            fprintf(stderr, "case_moe_gmm2: backend_cuda_set_moe_gmm failed\n");
            exit(1);
        }
        pair_ok(gpu->ops->memset(gpu, out.g, 0xff, (size_t)n * d * 4));
        gpu->ops->moe_experts(gpu, out.g, px.g, pi.g, pw.g, gug, dg, n, k, d, f);
        snprintf(shape, sizeof shape, "%s %s gmm%d n %d E %d k %d d %d f %d seed %llu (row rms)",
                 what, pd_wfmt_name(fmt), kern, n, E, k, d, f, (unsigned long long)seed);
        report("moe_gmm", shape, err_row_rms(&out, n, d), tol);
        if (kern == 1)
            continue;
        /* moe_gmm2 / moe_gmm3 in a graph: capture, poison, replay; equal to its eager result */
        const size_t bad = moe_graph_diff(out.g, px.g, pi.g, pw.g, gug, dg, n, k, d, f);
        snprintf(shape, sizeof shape, "%s %s gmm%d n %d graph replay (floats differing)", what,
                 pd_wfmt_name(fmt), kern, n);
        report("moe_gmm", shape, (double)bad, 0.0);
    }
    backend_cuda_set_moe_gmm(gpu, was); /* the backend's choice again for the cases after */
    for (int e = 0; e < E; e++) {
        backend_weight_free(cpu, &guc[e]);
        backend_weight_free(gpu, &gug[e]);
        backend_weight_free(cpu, &dc[e]);
        backend_weight_free(gpu, &dg[e]);
    }
    pair_free(&px);
    pair_free(&pi);
    pair_free(&pw);
    pair_free(&out);
    free(guc);
    free(gug);
    free(dc);
    free(dg);
    free(x);
    free(ids);
    free(w);
}

static void case_moe_experts(pd_wfmt_t fmt, int n, int E, int k, int d, int f)
{
    char shape[96];
    pd_weight_t *guc = xmalloc(sizeof(pd_weight_t) * E), *gug = xmalloc(sizeof(pd_weight_t) * E);
    pd_weight_t *dc = xmalloc(sizeof(pd_weight_t) * E), *dg = xmalloc(sizeof(pd_weight_t) * E);
    for (int e = 0; e < E; e++) {
        weight_new(fmt, 2 * f, d, &guc[e], &gug[e]);
        weight_new(fmt, d, f, &dc[e], &dg[e]);
    }
    float *x = xmalloc((size_t)n * d * 4), *lg = xmalloc((size_t)n * E * 4);
    int32_t *ids = xmalloc((size_t)n * k * 4);
    float *w = xmalloc((size_t)n * k * 4);
    fill_f32(x, (size_t)n * d, 2.0f);
    fill_f32(lg, (size_t)n * E, 4.0f);
    cpu->ops->moe_route(cpu, ids, w, lg, n, E, k, true); /* host memory on the CPU backend */
    pair_t px = pair_new((size_t)n * d * 4, x), pi = pair_new((size_t)n * k * 4, ids);
    pair_t pw = pair_new((size_t)n * k * 4, w), out = pair_new((size_t)n * d * 4, NULL);
    cpu->ops->moe_experts(cpu, out.c, px.c, pi.c, pw.c, guc, dc, n, k, d, f);
    gpu->ops->moe_experts(gpu, out.g, px.g, pi.g, pw.g, gug, dg, n, k, d, f);
    snprintf(shape, sizeof shape, "%s n %d experts %d k %d d %d f %d%s", pd_wfmt_name(fmt), n, E, k,
             d, f, fmt != PD_WFMT_F32 ? " (l2)" : "");
    /* fp8: two W8A8 matmuls in a row; a rounding flip of an activation quantized to fp8 (one
     * ulp, up to 2^-3 relative) shows through the second, so the error is measured in l2. Over
     * 37 tokens x 2 experts a few such flips land in one run (3.5e-3 and 5e-3 were seen on
     * fresh seeds); a wrong kernel gives O(1). */
    /* bf16 / int4: the GEMMs round x to bf16 (one bf16 GEMM by default), ~1e-3 in l2 over two
     * chained matmuls; the split mode (gpu_split) keeps BF16 near f32: 1e-5 element-wise */
    if (fmt == PD_WFMT_FP8)
        report("moe_experts", shape, err_f32_l2(&out, (size_t)n * d), 1e-2);
    else
        report("moe_experts", shape, err_f32_l2(&out, (size_t)n * d), 5e-3);
    if (fmt == PD_WFMT_BF16) {
        gpu_split->ops->moe_experts(gpu_split, out.g, px.g, pi.g, pw.g, gug, dg, n, k, d, f);
        pair_ok(gpu_split->ops->sync(gpu_split));
        snprintf(shape, sizeof shape, "%s n %d experts %d k %d d %d f %d split", pd_wfmt_name(fmt),
                 n, E, k, d, f);
        report("moe_experts", shape, err_f32(&out, (size_t)n * d), 1e-5);
    }
    for (int e = 0; e < E; e++) {
        backend_weight_free(cpu, &guc[e]);
        backend_weight_free(gpu, &gug[e]);
        backend_weight_free(cpu, &dc[e]);
        backend_weight_free(gpu, &dg[e]);
    }
    pair_free(&px);
    pair_free(&pi);
    pair_free(&pw);
    pair_free(&out);
    free(guc);
    free(gug);
    free(dc);
    free(dg);
    free(x);
    free(lg);
    free(ids);
    free(w);
}

/* page_digest: the GPU's page digests equal the CPU reference (kv_digest_page) exactly, over
 * scattered pages of a real arena and packed; a flipped byte on the GPU changes that page's
 * digest (and only that one) */
static void case_page_digest(int n_pages, int n, pd_kvfmt_t fmt)
{
    char shape[96];
    kv_layout_t l;
    kv_layout_init(&l, 4, 2, 128, 16, fmt);
    pair_t a = arena_new(&l, n_pages);
    int32_t *pages = xmalloc((size_t)n * 4);
    uint64_t *dc = xmalloc((size_t)n * 8), *dg = xmalloc((size_t)n * 8);
    for (int i = 0; i < n; i++)
        pages[i] = (int32_t)(((uint64_t)i * 7919u + 3) % (uint64_t)n_pages);
    pd_status_t sc = cpu->ops->page_digest(cpu, dc, a.c, l.page_bytes, pages, n);
    memset(dg, 0xa5, (size_t)n * 8);
    pd_status_t sg = gpu->ops->page_digest(gpu, dg, a.g, l.page_bytes, pages, n);
    size_t bad = sc != PD_OK || sg != PD_OK;
    for (int i = 0; i < n; i++)
        bad += dc[i] != dg[i];
    snprintf(shape, sizeof shape, "%s pages %d n %d (digests differing)", pd_kvfmt_name(fmt),
             n_pages, n);
    report("page_digest", shape, (double)bad, 0.0);
    /* packed (pages NULL): the first n pages of the arena */
    sc = cpu->ops->page_digest(cpu, dc, a.c, l.page_bytes, NULL, n);
    memset(dg, 0xa5, (size_t)n * 8);
    sg = gpu->ops->page_digest(gpu, dg, a.g, l.page_bytes, NULL, n);
    bad = sc != PD_OK || sg != PD_OK;
    for (int i = 0; i < n; i++)
        bad += dc[i] != dg[i];
    snprintf(shape, sizeof shape, "%s packed n %d (digests differing)", pd_kvfmt_name(fmt), n);
    report("page_digest", shape, (double)bad, 0.0);
    /* one byte of page pages[n / 2] changed on the GPU: exactly that digest moves */
    uint8_t byte;
    uint8_t *at = (uint8_t *)a.g + (size_t)pages[n / 2] * l.page_bytes + l.page_bytes / 3;
    gpu->ops->download(gpu, &byte, at, 1);
    byte ^= 0x10;
    gpu->ops->upload(gpu, at, &byte, 1);
    sg = gpu->ops->page_digest(gpu, dc, a.g, l.page_bytes, pages, n);
    bad = sg != PD_OK;
    for (int i = 0; i < n; i++)
        bad += (dc[i] == kv_digest_page((const uint8_t *)a.c + (size_t)pages[i] * l.page_bytes,
                                        l.page_bytes)) != (i != n / 2);
    snprintf(shape, sizeof shape, "%s one byte flipped n %d (wrong verdicts)", pd_kvfmt_name(fmt),
             n);
    report("page_digest", shape, (double)bad, 0.0);
    pair_free(&a);
    free(pages);
    free(dc);
    free(dg);
}

static void case_kv_tags(int n_pages, int n)
{
    char shape[96];
    kv_layout_t l;
    kv_layout_init(&l, 2, 2, 128, 16, PD_KV_FP8);
    pair_t a = arena_new(&l, n_pages);
    int32_t *pages = xmalloc((size_t)n * 4);
    /* 64-bit tags with their high halves set: a kernel that kept 32 bits would differ */
    kv_tag_t *tags = xmalloc((size_t)n * 8), *exp = xmalloc((size_t)n * 8),
             *cur = xmalloc((size_t)n * 8);
    kv_tag_t *fc = xmalloc((size_t)n * 8), *fg = xmalloc((size_t)n * 8);
    uint8_t *bc = xmalloc((size_t)n), *bg = xmalloc((size_t)n);
    for (int i = 0; i < n; i++) { /* distinct pages */
        pages[i] = (int32_t)(((uint64_t)i * 7919u) % (uint64_t)n_pages);
        tags[i] = ((kv_tag_t)(uint32_t)rng_next() << 32 | (uint32_t)rng_next()) | 1ull << 40;
    }
    cpu->ops->kv_stamp(cpu, a.c, &l, pages, tags, n);
    gpu->ops->kv_stamp(gpu, a.g, &l, pages, tags, n);
    snprintf(shape, sizeof shape, "pages %d n %d (bytes differing)", n_pages, n);
    report("kv_stamp", shape, err_bytes(&a), 0.0);
    for (int i = 0; i < n; i++) {
        int kind = (int)(rng_next() % 3);
        exp[i] = kind == 2 ? tags[i] + (1ull << 32) : tags[i]; /* differs in the high half */
        cur[i] = kind == 1 ? exp[i] + 5 : exp[i];
    }
    memset(fg, 0xff, (size_t)n * 8);
    memset(bg, 0xff, (size_t)n);
    cpu->ops->kv_check(cpu, bc, fc, a.c, &l, pages, exp, cur, n);
    gpu->ops->kv_check(gpu, bg, fg, a.g, &l, pages, exp, cur, n);
    size_t bad = 0;
    for (int i = 0; i < n; i++)
        bad += bc[i] != bg[i] || fc[i] != fg[i];
    snprintf(shape, sizeof shape, "pages %d n %d (entries differing)", n_pages, n);
    report("kv_check", shape, (double)bad, 0.0);
    pair_free(&a);
    free(pages);
    free(tags);
    free(exp);
    free(cur);
    free(fc);
    free(fg);
    free(bc);
    free(bg);
}

/* The transfer stream's export (xfer_kv_export): layer by layer, in an order other than 0..L-1,
 * scattered to destination pages dst_ids with stamps tags, against the CPU's; destination pages
 * no one writes keep their poison. */
static void case_xfer_kv_export(int layers, int kvh, int hd, int n_pages, int n)
{
    char shape[112];
    kv_layout_t sl, dl;
    kv_layout_init(&sl, layers, kvh, hd, 16, PD_KV_BF16);
    kv_layout_init(&dl, layers, kvh, hd, 16, PD_KV_FP8);
    pair_t a = arena_new(&sl, n_pages);
    const int n_dst = 2 * n + 1;
    int32_t *ids = xmalloc((size_t)n * 2 * 4); /* destination ids, then source ids */
    kv_tag_t *tags = xmalloc((size_t)n * sizeof *tags);
    for (int i = 0; i < n; i++) {
        ids[i] = (int32_t)(2 * i + (i & 1)); /* distinct, with holes */
        ids[n + i] = (int32_t)(rng_next() % (uint64_t)n_pages);
        tags[i] = rng_next();
    }
    pair_t di = pair_new((size_t)n * 2 * 4, ids), dt = pair_new((size_t)n * sizeof *tags, tags);
    pair_t dst = pair_new((size_t)n_dst * dl.page_bytes, NULL);
    uint8_t *poison = xmalloc(dst.bytes);
    memset(poison, 0xc3, dst.bytes);
    pair_ok(cpu->ops->upload(cpu, dst.c, poison, dst.bytes));
    pair_ok(gpu->ops->upload(gpu, dst.g, poison, dst.bytes));
    free(poison);
    for (int k = 0; k < layers; k++) { /* layers last to first, then layer 0 (the header) */
        int layer = k == layers - 1 ? 0 : layers - 1 - k;
        cpu->ops->xfer_kv_export(cpu, dst.c, &dl, di.c, dt.c, a.c, &sl, (int32_t *)di.c + n, n,
                                 layer, 1);
        gpu->ops->xfer_kv_export(gpu, dst.g, &dl, di.g, dt.g, a.g, &sl, (int32_t *)di.g + n, n,
                                 layer, 1);
    }
    pair_ok(cpu->ops->xfer_sync(cpu));
    pair_ok(gpu->ops->xfer_sync(gpu));
    snprintf(shape, sizeof shape, "bf16->fp8 layers %d kvh %d hd %d pages %d scattered (bytes)",
             layers, kvh, hd, n);
    report("xfer_kv_export", shape, err_bytes(&dst), 0.0);
    /* and the packed form, all layers at once, against kv_export on the GPU itself */
    pair_t pk = pair_new((size_t)n * dl.page_bytes, NULL);
    void *zero = calloc(1, pk.bytes);
    pair_ok(cpu->ops->upload(cpu, pk.c, zero, pk.bytes));
    pair_ok(gpu->ops->upload(gpu, pk.g, zero, pk.bytes));
    free(zero);
    gpu->ops->kv_export(gpu, pk.g, &dl, a.g, &sl, ids + n, n);
    pair_ok(gpu->ops->sync(gpu));
    uint8_t *want = xmalloc(pk.bytes), *got = xmalloc(dst.bytes);
    pair_ok(gpu->ops->download(gpu, want, pk.g, pk.bytes));
    pair_ok(gpu->ops->download(gpu, got, dst.g, dst.bytes));
    size_t bad = 0;
    for (int i = 0; i < n; i++) {
        uint8_t *w = want + (size_t)i * dl.page_bytes, *g = got + (size_t)ids[i] * dl.page_bytes;
        bad += memcmp(g, &tags[i], sizeof tags[i]) != 0;
        for (size_t b = KV_PAGE_HEADER_BYTES; b < dl.page_bytes; b++)
            bad += w[b] != g[b];
    }
    snprintf(shape, sizeof shape, "layers %d pages %d: scattered per layer vs kv_export (bytes)",
             layers, n);
    report("xfer_kv_export", shape, (double)bad, 0.0);
    free(want);
    free(got);
    pair_free(&pk);
    pair_free(&a);
    pair_free(&dst);
    pair_free(&di);
    pair_free(&dt);
    free(ids);
    free(tags);
}

static void case_kv_export(pd_kvfmt_t src_fmt, int layers, int kvh, int hd, int n_pages, int n)
{
    char shape[96];
    kv_layout_t sl, dl;
    kv_layout_init(&sl, layers, kvh, hd, 16, src_fmt);
    kv_layout_init(&dl, layers, kvh, hd, 16, PD_KV_FP8);
    pair_t a = arena_new(&sl, n_pages);
    int32_t *pages = xmalloc((size_t)n * 4);
    for (int i = 0; i < n; i++)
        pages[i] = (int32_t)(rng_next() % (uint64_t)n_pages);
    pair_t dst = pair_new((size_t)n * dl.page_bytes, NULL);
    /* the bytes past the data and scales of a page are padding: start them equal */
    void *zero = calloc(1, dst.bytes);
    pair_ok(cpu->ops->upload(cpu, dst.c, zero, dst.bytes));
    pair_ok(gpu->ops->upload(gpu, dst.g, zero, dst.bytes));
    free(zero);
    cpu->ops->kv_export(cpu, dst.c, &dl, a.c, &sl, pages, n);
    gpu->ops->kv_export(gpu, dst.g, &dl, a.g, &sl, pages, n);
    snprintf(shape, sizeof shape, "%s->fp8 layers %d kvh %d hd %d pages %d (bytes)",
             pd_kvfmt_name(src_fmt), layers, kvh, hd, n);
    report("kv_export", shape, err_bytes(&dst), 0.0);
    pair_free(&a);
    pair_free(&dst);
    free(pages);
}

/* ==== main ==== */

/* Sampling: rows of random logits (scale), the same parameters and draws on both backends.
 * err = fraction of rows whose token differs: 0 for greedy; a sampled row may flip where the
 * draw falls within an ulp of a bucket edge (device expf vs glibc expf), so tol allows 2%. */
/* > 0: case_sample_rows and case_logprobs put the logits on levels (sample_levels_apply) */
static int sample_levels;

/* x (n values of random logits in [-scale, scale)) rounded to steps of scale / sample_levels:
 * thousands of ties at the top of a 128k row; sample_levels 1: {-scale, -0, +0}, the zeros'
 * signs alternating, so the largest are ties of -0 and +0 */
static void sample_levels_apply(float *x, size_t n, float scale)
{
    for (size_t i = 0; sample_levels > 0 && i < n; i++) {
        const float q = roundf(x[i] / scale * (float)sample_levels) * scale / (float)sample_levels;
        x[i] = sample_levels > 1 ? q : q < 0.0f ? -scale : (i & 1) ? 0.0f : -0.0f;
    }
}

static void case_sample_rows(int n, int vocab, float scale, float T, int top_k, float top_p,
                             double tol, bool mixed)
{
    char shape[112];
    float *x = xmalloc((size_t)n * vocab * 4), *tv = xmalloc((size_t)n * 4),
          *pv = xmalloc((size_t)n * 4), *uv = xmalloc((size_t)n * 4);
    int32_t *kv = xmalloc((size_t)n * 4);
    fill_f32(x, (size_t)n * vocab, scale);
    sample_levels_apply(x, (size_t)n * vocab, scale);
    for (int i = 0; i < n; i++) {
        const bool greedy = T == 0.0f || (mixed && i % 3 == 0);
        if (greedy) { /* ties at the maximum: the lower id wins (also across split slices) */
            float mx = x[(size_t)i * vocab];
            for (int j = 1; j < vocab; j++)
                mx = fmaxf(mx, x[(size_t)i * vocab + j]);
            x[(size_t)i * vocab + (i * 7919) % vocab] = mx;
            x[(size_t)i * vocab + (i * 7919 + 3) % vocab] = mx;
            x[(size_t)i * vocab + (i * 7919 + vocab / 2) % vocab] = mx;
        }
        tv[i] = greedy ? 0.0f : T;
        kv[i] = top_k;
        pv[i] = top_p;
        uv[i] = rng_float() * 0.5f + 0.5f * (float)i / (float)n; /* spread over [0, 1) */
    }
    pair_t px = pair_new((size_t)n * vocab * 4, x), pt = pair_new((size_t)n * 4, tv),
           pk = pair_new((size_t)n * 4, kv), pp = pair_new((size_t)n * 4, pv),
           pu = pair_new((size_t)n * 4, uv), po = pair_new((size_t)n * 4, NULL);
    cpu->ops->sample(cpu, po.c, px.c, n, vocab, pt.c, pk.c, pp.c, pu.c);
    gpu->ops->sample(gpu, po.g, px.g, n, vocab, pt.g, pk.g, pp.g, pu.g);
    int32_t *c, *g;
    pair_get(&po, (void **)&c, (void **)&g);
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += c[i] != g[i];
    free(c);
    free(g);
    snprintf(shape, sizeof shape, "n %d V %d T %g%s k %d p %g%s%s%s (rows differing)", n, vocab,
             T, mixed ? "/0" : "", top_k, top_p, sample_split ? "" : " unsplit",
             sample_levels > 0 ? " ties" : "", sample_bucket == 1 ? " bucket" : "");
    report("sample", shape, (double)bad / n, tol);
    pair_free(&px);
    pair_free(&pt);
    pair_free(&pk);
    pair_free(&pp);
    pair_free(&pu);
    pair_free(&po);
    free(x);
    free(tv);
    free(pv);
    free(uv);
    free(kv);
}

static void case_sample(int n, int vocab, float scale, float T, int top_k, float top_p, double tol)
{
    case_sample_rows(n, vocab, scale, T, top_k, top_p, tol, false);
}

/* logits_process: random unique (row, token) entries with counts, prompt / mask flags and
 * biases over random logits; per-row penalties (some rows with repetition 1). The kernel does the
 * reference's float operations in its order: compared bit for bit (differing logits). */
static void case_logits_process(int n, int vocab, int per_row)
{
    char shape[96];
    const int n_ent = n * per_row;
    float *x = xmalloc((size_t)n * vocab * 4), *bias = xmalloc((size_t)n_ent * 4),
          *pen = xmalloc((size_t)n * 12);
    int32_t *ent = xmalloc((size_t)n_ent * 16);
    uint8_t *used = xmalloc((size_t)vocab);
    fill_f32(x, (size_t)n * vocab, 8.0f);
    for (int i = 0; i < n; i++) {
        pen[3 * i] = rng_float() * 2.0f - 0.5f;
        pen[3 * i + 1] = rng_float() * 1.5f - 0.25f;
        pen[3 * i + 2] = i % 3 == 0 ? 1.0f : 1.0f + rng_float();
        memset(used, 0, (size_t)vocab);
        for (int k = 0; k < per_row; k++) {
            int j = i * per_row + k, tok;
            do
                tok = (int)(rng_next() % (uint64_t)vocab);
            while (used[tok]);
            used[tok] = 1;
            ent[4 * j] = i;
            ent[4 * j + 1] = tok;
            ent[4 * j + 2] = k % 4 == 0 ? 0 : (int32_t)(rng_next() % 9);
            ent[4 * j + 3] = (int32_t)(rng_next() % 4); /* in prompt, masked, both, none */
            bias[j] = k % 5 == 0 ? 0.0f : rng_float() * 20.0f - 10.0f;
        }
    }
    pair_t px = pair_new((size_t)n * vocab * 4, x), pe = pair_new((size_t)n_ent * 16, ent),
           pb = pair_new((size_t)n_ent * 4, bias), pp = pair_new((size_t)n * 12, pen);
    cpu->ops->logits_process(cpu, px.c, n, vocab, pe.c, pb.c, n_ent, pp.c);
    gpu->ops->logits_process(gpu, px.g, n, vocab, pe.g, pb.g, n_ent, pp.g);
    float *c, *g;
    pair_get(&px, (void **)&c, (void **)&g);
    size_t bad = 0, changed = 0;
    for (size_t i = 0; i < (size_t)n * vocab; i++) {
        bad += memcmp(&c[i], &g[i], 4) != 0;
        changed += memcmp(&c[i], &x[i], 4) != 0;
    }
    if (changed == 0) /* the reference changed nothing: the case tests nothing */
        bad = (size_t)n * vocab;
    free(c);
    free(g);
    snprintf(shape, sizeof shape, "n %d V %d entries/row %d (logits differing)", n, vocab, per_row);
    report("logits_process", shape, (double)bad / ((double)n * vocab), 0.0);
    pair_free(&px);
    pair_free(&pe);
    pair_free(&pb);
    pair_free(&pp);
    free(x);
    free(bias);
    free(pen);
    free(ent);
    free(used);
}

/* logprobs: random logits (some rows with ties at the top), random chosen tokens, n_top per
 * row from {-1 (row skipped), 0, 1, 5, 20, 25 (clamped to 20)}. Per element: ids and the
 * skipped rows' poison must agree exactly (a differing id counts as an infinite error); values
 * |gpu - cpu| / (1 + |cpu|) (the normalizer is summed in double in another order). */
static void case_logprobs(int n, int vocab, float scale)
{
    char shape[96];
    const int W = 1 + SAMPLER_MAX_TOP_LOGPROBS;
    static const int tops[] = {-1, 0, 1, 5, 20, 25};
    float *x = xmalloc((size_t)n * vocab * 4);
    int32_t *tok = xmalloc((size_t)n * 4), *nt = xmalloc((size_t)n * 4);
    fill_f32(x, (size_t)n * vocab, scale);
    sample_levels_apply(x, (size_t)n * vocab, scale);
    for (int i = 0; i < n; i++) {
        float *r = x + (size_t)i * vocab;
        tok[i] = (int32_t)(rng_next() % (uint64_t)vocab);
        nt[i] = tops[i % 6];
        if (i % 3 == 1) { /* ties: three entries equal to the row maximum, one equal to another */
            float mx = r[0];
            for (int j = 1; j < vocab; j++)
                mx = fmaxf(mx, r[j]);
            r[(i * 131) % vocab] = mx;
            r[(i * 131 + 7) % vocab] = mx;
            r[(i * 131 + 3) % vocab] = mx;
            r[(i * 17 + 1) % vocab] = r[(i * 17 + 2) % vocab];
        }
    }
    pair_t px = pair_new((size_t)n * vocab * 4, x), pt = pair_new((size_t)n * 4, tok),
           pn = pair_new((size_t)n * 4, nt), pi = pair_new((size_t)n * W * 4, NULL),
           pv = pair_new((size_t)n * W * 4, NULL);
    cpu->ops->logprobs(cpu, pi.c, pv.c, px.c, pt.c, pn.c, n, vocab);
    gpu->ops->logprobs(gpu, pi.g, pv.g, px.g, pt.g, pn.g, n, vocab);
    int32_t *ic, *ig;
    float *vc, *vg;
    pair_get(&pi, (void **)&ic, (void **)&ig);
    pair_get(&pv, (void **)&vc, (void **)&vg);
    double err = 0.0;
    for (size_t i = 0; i < (size_t)n * W; i++) {
        if (ic[i] != ig[i] || (isnan(vc[i]) != isnan(vg[i])) ||
            (isnan(vc[i]) && memcmp(&vc[i], &vg[i], 4) != 0)) {
            err = INFINITY;
            break;
        }
        if (!isnan(vc[i]))
            err = fmax(err, fabs((double)vg[i] - vc[i]) / (1.0 + fabs((double)vc[i])));
    }
    free(ic);
    free(ig);
    free(vc);
    free(vg);
    snprintf(shape, sizeof shape, "n %d V %d scale %g%s%s (ids exact)", n, vocab, scale,
             sample_levels > 0 ? " ties" : "", sample_bucket == 1 ? " bucket" : "");
    report("logprobs", shape, err, 1e-6);
    pair_free(&px);
    pair_free(&pt);
    pair_free(&pn);
    pair_free(&pi);
    pair_free(&pv);
    free(x);
    free(tok);
    free(nt);
}

/* n decode sequences of per_seq pages each (sequence s on pages s * per_seq ..), and *sp their
 * pointers as model_batch_t takes them (the whole-pipeline cases below); decode_seqs_free */
static kv_seq_t *decode_seqs_new(int n, int per_seq, const kv_seq_t ***sp)
{
    kv_seq_t *seqs = xmalloc((size_t)n * sizeof *seqs);
    *sp = xmalloc((size_t)n * sizeof **sp);
    for (int s = 0; s < n; s++) {
        kv_seq_init(&seqs[s]);
        for (int p = 0; p < per_seq; p++)
            kv_seq_push_page(&seqs[s], (kv_page_ref_t){s * per_seq + p, 0, 0});
        (*sp)[s] = &seqs[s];
    }
    return seqs;
}

static void decode_seqs_free(kv_seq_t *seqs, const kv_seq_t **sp, int n)
{
    for (int s = 0; s < n; s++)
        kv_seq_deinit(&seqs[s]);
    free(seqs);
    free(sp);
}

/* model_forward_sample on the GPU (tiny-llama from PD_MODELS_DIR, else deploy/models; BF16 weights,
 * BF16 KV), decode steps of n sequences with graphs on (the sampling captured in the step, padded
 * to the batch bucket, entries padded to their bucket), against model_forward's logits of the same
 * step (same graph mode: bit-identical forward) through the host reference
 * (sampler_logits_process_ref, sampler_pick, sampler_logprobs). err = fraction of rows whose token
 * differs (greedy rows must all agree; a sampled row may flip at a bucket edge, kernels/sample.h)
 * or INFINITY for a logprobs id that differs or a value off by more than 1e-6 * (1 + |ref|). */
static void case_forward_sample(int n, int steps)
{
    char shape[96], dir[2048];
    const char *models = getenv("PD_MODELS_DIR"); /* meson sets it; run-on-gpu.sh runs from the
                                                     repository root: deploy/models */
    model_t *m = NULL;
    model_ctx_t *ctx = NULL;
    snprintf(dir, sizeof dir, "%s/tiny-llama", models ? models : "deploy/models");
    model_load_params_t mp = {dir, PD_WFMT_BF16, PD_WFMT_BF16, gpu, false, NULL};
    pair_ok(model_load(&mp, &m));
    pair_ok(model_ctx_create(m, &ctx));
    const bool graphs = model_ctx_graphs(ctx) == MODEL_GRAPHS_ON;
    const int vocab = m->cfg.vocab_size, per_seq = 4, ctx0 = 20;
    kv_layout_t l;
    kv_layout_init(&l, m->cfg.num_hidden_layers, m->cfg.num_key_value_heads, m->cfg.head_dim, 16,
                   PD_KV_BF16);
    void *arena;
    pair_ok(gpu->ops->alloc(gpu, (size_t)n * per_seq * l.page_bytes, &arena));
    pair_ok(gpu->ops->memset(gpu, arena, 0, (size_t)n * per_seq * l.page_bytes));
    const kv_seq_t **sp = NULL;
    kv_seq_t *seqs = decode_seqs_new(n, per_seq, &sp);
    int32_t *toks = xmalloc((size_t)n * 4), *qs = xmalloc(((size_t)n + 1) * 4),
            *cl = xmalloc((size_t)n * 4), *rows = xmalloc((size_t)n * 4),
            *tk = xmalloc((size_t)n * 4), *ntop = xmalloc((size_t)n * 4),
            *out = xmalloc((size_t)n * 4), *ent = xmalloc((size_t)n * 8 * 16),
            *idx = xmalloc((size_t)vocab * 4);
    float *tmp = xmalloc((size_t)n * 4), *tp = xmalloc((size_t)n * 4), *u = xmalloc((size_t)n * 4),
          *pen = xmalloc((size_t)n * 12), *bias = xmalloc((size_t)n * 8 * 4),
          *lg = xmalloc((size_t)n * vocab * 4), *pl = xmalloc((size_t)n * vocab * 4),
          *probs = xmalloc((size_t)vocab * 4);
    sampler_logprobs_t *lp = xmalloc((size_t)n * sizeof *lp), ref;
    for (int s = 0; s < n; s++) {
        toks[s] = (int32_t)(1 + rng_next() % (uint64_t)(vocab - 1));
        cl[s] = ctx0 - (s % 5); /* the earlier positions hold zeros: fine for a comparison */
    }
    int bad = 0, greedy_bad = 0, rows_total = 0;
    double lp_err = 0.0;
    for (int step = 0; step < steps; step++) {
        int n_ent = 0;
        for (int s = 0; s < n; s++) {
            const int kind = (s + step) % 4;
            qs[s] = s;
            rows[s] = s;
            cl[s]++;
            tmp[s] = kind == 0 ? 0.0f : 0.6f + 0.5f * (rng_float() + 1.0f);
            tk[s] = kind == 2 ? 40 : 0;
            tp[s] = kind == 3 ? 0.85f : 1.0f;
            u[s] = kind == 0 ? 0.0f : 0.5f * (rng_float() + 1.0f) * 0.999f;
            ntop[s] = (s + step) % 3 == 0 ? -1 : (s + step) % 7;
            pen[3 * s] = s % 2 ? 0.4f : 0.0f;
            pen[3 * s + 1] = s % 2 ? 0.3f : 0.0f;
            pen[3 * s + 2] = s % 2 ? 1.2f : 1.0f;
            for (int j = 0; s % 2 && j < 8; j++, n_ent++) {
                ent[4 * n_ent] = s;
                ent[4 * n_ent + 1] = (int32_t)((s * 53 + step * 11 + j * 131) % vocab);
                ent[4 * n_ent + 2] = j % 3;
                ent[4 * n_ent + 3] =
                    (j % 4 == 0 ? SAMPLER_ENT_IN_PROMPT : 0) | (j == 7 ? SAMPLER_ENT_MASKED : 0);
                bias[n_ent] = j == 1 ? 3.0f : rng_float();
            }
        }
        qs[n] = n;
        model_batch_t b = {n, toks, n, qs, cl, sp, n, rows};
        pair_ok(model_forward(ctx, arena, &l, &b, lg));
        memcpy(pl, lg, (size_t)n * vocab * 4);
        sampler_logits_process_ref(pl, n, vocab, ent, bias, n_ent, pen);
        model_sampling_t smp = {tmp, tk, tp, u, ntop, n_ent, ent, bias, pen};
        pair_ok(model_forward_sample(ctx, arena, &l, &b, &smp, out, lp));
        for (int s = 0; s < n; s++) {
            sampler_params_t spp = {tmp[s], tk[s], tp[s], 0};
            const int32_t want =
                sampler_pick(&spp, pl + (size_t)s * vocab, vocab, u[s], idx, probs);
            rows_total++;
            bad += out[s] != want;
            greedy_bad += tmp[s] == 0.0f && out[s] != want;
            if (ntop[s] >= 0) {
                sampler_logprobs(lg + (size_t)s * vocab, vocab, out[s], ntop[s], &ref);
                if (lp[s].token != ref.token || lp[s].n_top != ref.n_top ||
                    memcmp(lp[s].top_ids, ref.top_ids, (size_t)ref.n_top * 4) != 0)
                    lp_err = INFINITY;
                lp_err = fmax(lp_err, fabs((double)lp[s].logprob - ref.logprob) /
                                          (1.0 + fabs((double)ref.logprob)));
                for (int j = 0; j < ref.n_top; j++)
                    lp_err =
                        fmax(lp_err, fabs((double)lp[s].top_logprobs[j] - ref.top_logprobs[j]) /
                                         (1.0 + fabs((double)ref.top_logprobs[j])));
            }
            toks[s] = out[s];
        }
    }
    double err = greedy_bad ? INFINITY : lp_err > 1e-6 ? INFINITY : (double)bad / rows_total;
    snprintf(shape, sizeof shape, "tiny-llama n %d steps %d graphs %s (rows differing)", n, steps,
             graphs && model_ctx_graphs(ctx) == MODEL_GRAPHS_ON ? "on" : "OFF");
    /* graphs must have stayed on: a capture that failed would test the eager path only */
    if (graphs && model_ctx_graphs(ctx) != MODEL_GRAPHS_ON)
        err = INFINITY;
    report("fwd_sample", shape, err, 0.05);
    decode_seqs_free(seqs, sp, n);
    free(toks);
    free(qs);
    free(cl);
    free(rows);
    free(tk);
    free(ntop);
    free(out);
    free(ent);
    free(idx);
    free(tmp);
    free(tp);
    free(u);
    free(pen);
    free(bias);
    free(lg);
    free(pl);
    free(probs);
    free(lp);
    gpu->ops->free(gpu, arena);
    model_ctx_destroy(ctx);
    model_destroy(m);
}

/* Programmatic dependent launch (option pdl, kernels/kutil.cuh) on the whole decode step:
 * tiny-llama (PD_MODELS_DIR, else deploy/models) with wfmt weights (INT4: matmul_w4gemv at n <= 4;
 * FP8: the FP8 mma; the BF16 LM head: the f32 GEMV) and kvfmt KV, `steps` decode steps of n
 * sequences from a zeroed arena, run three times: graphs on with pdl on, graphs on with pdl off,
 * and the padded eager plan (MODEL_GRAPHS_EAGER) with pdl on. The first step of a shape runs
 * eagerly and is captured, the later ones replay the graph. err = logits (n, vocab) f32 that
 * differ bit for bit from the pdl-off graph run, over all steps (must be 0). The switch is set
 * with matmul_set_pdl directly (PD_CUDA_PDL in the environment would pin the option). */
static void case_decode_pdl(pd_wfmt_t wfmt, pd_kvfmt_t kvfmt, int n, int steps)
{
    char shape[128], dir[2048];
    const char *models = getenv("PD_MODELS_DIR");
    model_t *m = NULL;
    snprintf(dir, sizeof dir, "%s/tiny-llama", models ? models : "deploy/models");
    model_load_params_t mp = {dir, wfmt, PD_WFMT_BF16, gpu, false, NULL};
    pair_ok(model_load(&mp, &m));
    const int vocab = m->cfg.vocab_size, per_seq = 4, ctx0 = 20;
    kv_layout_t l;
    kv_layout_init(&l, m->cfg.num_hidden_layers, m->cfg.num_key_value_heads, m->cfg.head_dim, 16,
                   kvfmt);
    void *arena;
    const size_t ab = (size_t)n * per_seq * l.page_bytes;
    pair_ok(gpu->ops->alloc(gpu, ab, &arena));
    const kv_seq_t **sp = NULL;
    kv_seq_t *seqs = decode_seqs_new(n, per_seq, &sp);
    int32_t *tok0 = xmalloc((size_t)n * 4), *toks = xmalloc((size_t)n * 4),
            *qs = xmalloc(((size_t)n + 1) * 4), *cl = xmalloc((size_t)n * 4),
            *rows = xmalloc((size_t)n * 4);
    const size_t per = (size_t)n * vocab;
    float *lg[3];
    for (int r = 0; r < 3; r++)
        lg[r] = xmalloc(per * steps * 4);
    for (int s = 0; s < n; s++) {
        tok0[s] = (int32_t)(1 + rng_next() % (uint64_t)(vocab - 1));
    }
    const int pdl_of[3] = {1, 0, 1};
    const model_graphs_t mode_of[3] = {MODEL_GRAPHS_ON, MODEL_GRAPHS_ON, MODEL_GRAPHS_EAGER};
    bool graphs_ok = true;
    for (int r = 0; r < 3; r++) {
        model_ctx_t *ctx = NULL;
        matmul_set_pdl(pdl_of[r]);
        pair_ok(model_ctx_create(m, &ctx));
        model_ctx_set_graphs(ctx, mode_of[r]);
        pair_ok(gpu->ops->memset(gpu, arena, 0, ab));
        memcpy(toks, tok0, (size_t)n * 4);
        for (int s = 0; s < n; s++)
            cl[s] = ctx0 - (s % 5);
        for (int step = 0; step < steps; step++) {
            for (int s = 0; s < n; s++) {
                qs[s] = s;
                rows[s] = s;
                cl[s]++;
            }
            qs[n] = n;
            model_batch_t b = {n, toks, n, qs, cl, sp, n, rows};
            float *o = lg[r] + per * step;
            pair_ok(model_forward(ctx, arena, &l, &b, o));
            for (int s = 0; s < n; s++) { /* greedy next token */
                int best = 0;
                for (int v = 1; v < vocab; v++)
                    best = o[(size_t)s * vocab + v] > o[(size_t)s * vocab + best] ? v : best;
                toks[s] = best;
            }
        }
        if (mode_of[r] == MODEL_GRAPHS_ON && model_ctx_graphs(ctx) != MODEL_GRAPHS_ON)
            graphs_ok = false;
        model_ctx_destroy(ctx);
    }
    matmul_set_pdl(1);
    backend_set_options(gpu, "pdl=on"); /* back to the backend's own setting (env wins) */
    size_t diff = 0;
    for (size_t i = 0; i < per * steps; i++)
        diff += memcmp(&lg[0][i], &lg[1][i], 4) != 0 || memcmp(&lg[2][i], &lg[1][i], 4) != 0;
    snprintf(shape, sizeof shape, "tiny-llama %s kv %s n %d steps %d pdl on/off/eager (differing)",
             wfmt == PD_WFMT_INT4 ? "int4" : "fp8", kvfmt == PD_KV_FP8 ? "fp8" : "bf16", n, steps);
    report("decode_pdl", shape, graphs_ok ? (double)diff : INFINITY, 0.0);
    decode_seqs_free(seqs, sp, n);
    free(tok0);
    free(toks);
    free(qs);
    free(cl);
    free(rows);
    for (int r = 0; r < 3; r++)
        free(lg[r]);
    gpu->ops->free(gpu, arena);
    model_destroy(m);
}

/* A tiny-llama decode rig for the whole-step A / B cases (case_decode_w8wg, case_decode_fuse):
 * the model with weights wfmt, a KV arena of kvfmt for n sequences of 4 pages, and token rows
 * toks (steps + 1, n): row 0 random, the later rows the greedy picks of the first run. */
typedef struct {
    model_t *m;
    kv_layout_t l;
    void *arena;
    size_t ab;
    kv_seq_t *seqs;
    const kv_seq_t **sp;
    int n, steps, vocab;
    int32_t *toks;
} decode_rig_t;

static void decode_rig_new(decode_rig_t *r, pd_wfmt_t wfmt, pd_kvfmt_t kvfmt, int n, int steps)
{
    char dir[2048];
    const char *models = getenv("PD_MODELS_DIR");
    snprintf(dir, sizeof dir, "%s/tiny-llama", models ? models : "deploy/models");
    memset(r, 0, sizeof *r);
    model_load_params_t mp = {dir, wfmt, PD_WFMT_BF16, gpu, false, NULL};
    pair_ok(model_load(&mp, &r->m));
    r->n = n, r->steps = steps, r->vocab = r->m->cfg.vocab_size;
    kv_layout_init(&r->l, r->m->cfg.num_hidden_layers, r->m->cfg.num_key_value_heads,
                   r->m->cfg.head_dim, 16, kvfmt);
    r->ab = (size_t)n * 4 * r->l.page_bytes;
    pair_ok(gpu->ops->alloc(gpu, r->ab, &r->arena));
    r->seqs = decode_seqs_new(n, 4, &r->sp);
    r->toks = xmalloc((size_t)n * (steps + 1) * 4);
    for (int s = 0; s < n; s++)
        r->toks[s] = (int32_t)(1 + rng_next() % (uint64_t)(r->vocab - 1));
}

/* One run: `steps` graph-captured decode steps from a zeroed arena (contexts 20 - s % 5 + step),
 * each step's logits (n, vocab) to lg + step n vocab; greedy: the run's picks become the next
 * rows of toks. Returns whether the context kept its graphs. */
static bool decode_rig_run(decode_rig_t *r, float *lg, bool greedy)
{
    const int n = r->n, vocab = r->vocab;
    int32_t *qs = xmalloc(((size_t)n + 1) * 4), *cl = xmalloc((size_t)n * 4),
            *rows = xmalloc((size_t)n * 4);
    model_ctx_t *ctx = NULL;
    pair_ok(model_ctx_create(r->m, &ctx));
    model_ctx_set_graphs(ctx, MODEL_GRAPHS_ON);
    pair_ok(gpu->ops->memset(gpu, r->arena, 0, r->ab));
    for (int s = 0; s < n; s++)
        cl[s] = 20 - (s % 5);
    for (int step = 0; step < r->steps; step++) {
        for (int s = 0; s < n; s++) {
            qs[s] = s;
            rows[s] = s;
            cl[s]++;
        }
        qs[n] = n;
        model_batch_t b = {n, r->toks + (size_t)step * n, n, qs, cl, r->sp, n, rows};
        float *o = lg + (size_t)n * vocab * step;
        pair_ok(model_forward(ctx, r->arena, &r->l, &b, o));
        for (int s = 0; greedy && s < n; s++) { /* greedy next token */
            int best = 0;
            for (int v = 1; v < vocab; v++)
                best = o[(size_t)s * vocab + v] > o[(size_t)s * vocab + best] ? v : best;
            r->toks[(size_t)(step + 1) * n + s] = best;
        }
    }
    const bool graphs = model_ctx_graphs(ctx) == MODEL_GRAPHS_ON;
    model_ctx_destroy(ctx);
    free(qs);
    free(cl);
    free(rows);
    return graphs;
}

static void decode_rig_free(decode_rig_t *r)
{
    decode_seqs_free(r->seqs, r->sp, r->n);
    free(r->toks);
    gpu->ops->free(gpu, r->arena);
    model_destroy(r->m);
}

/* max |lg[r] - lg[0]| / max |lg[0]| over r = 1..runs - 1 (INFINITY for a NaN) */
static double decode_rig_diff(float *const *lg, int runs, size_t count)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < count; i++)
        for (int r = 1; r < runs; r++) {
            if (isnan(lg[0][i]) || isnan(lg[r][i]))
                num = INFINITY;
            num = fmax(num, fabs((double)lg[r][i] - lg[0][i]));
            den = fmax(den, fabs((double)lg[0][i]));
        }
    return den > 0.0 ? num / den : num;
}

/* The rig's steps with backend option `off` set, then `on` (the first run's greedy tokens feed
 * both), and `keep` set after: max |on - off| / max |off| over every step's logits (the
 * decode_rig_diff of the two runs), INFINITY where an option was refused or a run fell back.
 * Options NULL: none set; instead (or as well) a process-wide switch of the kernels (knob not
 * NULL) at koff, then kon, its old value back after. */
static double decode_rig_ab(decode_rig_t *rig, const char *off, const char *on, const char *keep,
                            int *knob, int koff, int kon)
{
    const size_t per = (size_t)rig->n * rig->vocab * rig->steps;
    float *lg[2] = {xmalloc(per * 4), xmalloc(per * 4)};
    const int was = knob ? *knob : 0;
    bool ok = true;
    for (int r = 0; r < 2; r++) {
        if (off)
            ok = ok && backend_set_options(gpu, r ? on : off) == PD_OK;
        if (knob)
            *knob = r ? kon : koff;
        ok = decode_rig_run(rig, lg[r], r == 0) && ok;
    }
    if (knob)
        *knob = was;
    if (keep)
        pair_ok(backend_set_options(gpu, keep));
    const double e = ok ? decode_rig_diff(lg, 2, per) : INFINITY;
    free(lg[0]);
    free(lg[1]);
    return e;
}

/* Session 21: the FP8 decode step with matmul_w8wg (option w8wg) against the FP8 routes before
 * it: tiny-llama with FP8 weights and BF16 KV (hidden 512, intermediate 1024: every matmul
 * qualifies), `steps` graph-captured decode steps of n sequences, first with w8wg off (its greedy
 * tokens feed both runs), then on. err = max |on - off| / max |off| over every step's logits
 * (the same e4m3 values; the wgmma sums each 128-column block in the tensor core's FP8
 * accumulator, which keeps fewer bits than the f32 of the GEMV / mma routes: hence the promotion
 * every 128 columns), INFINITY where graphs fell back to eager or the option was refused. Session
 * 22's first run of these cases (one H100) measured 2.6e-3 .. 1.04e-2 over three runs, above
 * the 2e-3 first set here without a measurement; a layout bug gives O(1). */
static void case_decode_w8wg(int n, int steps)
{
    char shape[128];
    decode_rig_t rig;
    decode_rig_new(&rig, PD_WFMT_FP8, PD_KV_BF16, n, steps);
    const double e = decode_rig_ab(&rig, "w8wg=off", "w8wg=on", "w8wg=" BACKEND_CUDA_W8WG_DEFAULT,
                                   NULL, 0, 0);
    snprintf(shape, sizeof shape, "tiny-llama fp8 kv bf16 n %d steps %d w8wg on / off", n, steps);
    report("decode_w8wg", shape, e, 2e-2);
    decode_rig_free(&rig);
}

/* Session 14: the decode step with the small ops folded into the slice GEMVs (backend.h
 * matmul_fused, option gemv_fuse) against the plain ops: tiny-llama with INT4 weights and FP8 KV,
 * `steps` graph-captured decode steps of n sequences from a zeroed arena, first with gemv_fuse
 * off (its greedy tokens feed both runs), then on. err = max |on - off| / max |off| over every
 * step's logits (only 1 / rms of each norm may differ, in its last bit), INFINITY where the
 * backend would not take the model's weights (the fused path would not run) or graphs fell
 * back to eager. */
static void case_decode_fuse(int n, int steps)
{
    char shape[128];
    decode_rig_t rig;
    decode_rig_new(&rig, PD_WFMT_INT4, PD_KV_FP8, n, steps);
    const size_t per = (size_t)n * rig.vocab * steps;
    float *lg[4] = {xmalloc(per * 4), xmalloc(per * 4), xmalloc(per * 4), xmalloc(per * 4)};
    const int was_ks = matmul_int4_ksplit_route; /* plain: the slice GEMV, as the fused levels */
    matmul_int4_ksplit_route = 0;
    bool ok = gpu->ops->matmul_fused_ok != NULL;
    static const char *const opt[4] = {"gemv_fuse=off", "gemv_fuse=1", "gemv_fuse=2",
                                       "gemv_fuse=3"};
    for (int r = 0; r < 4; r++) { /* off, 1 (norms, adds), 2 (+ SiLU·mul epilogue), 3 */
        pair_ok(backend_set_options(gpu, opt[r]));
        /* the fused levels must take the fused path (asked after the option is set: off by
         * default, matmul_fused_ok says no) */
        ok = ok && (r == 0 || (gpu->ops->matmul_fused_ok(gpu, &rig.m->layers[0].q, n,
                                                         PD_PRO_RMSNORM, PD_EPI_NONE) &&
                               gpu->ops->matmul_fused_ok(gpu, &rig.m->layers[0].down, n,
                                                         PD_PRO_NONE, PD_EPI_ACC)));
        ok = decode_rig_run(&rig, lg[r], r == 0) && ok;
    }
    pair_ok(backend_set_options(gpu, "gemv_fuse=off")); /* the default */
    matmul_int4_ksplit_route = was_ks;
    snprintf(shape, sizeof shape, "tiny-llama int4 kv fp8 n %d steps %d fused 1, 2, 3 / plain", n,
             steps);
    report("decode_fuse", shape, ok ? decode_rig_diff(lg, 4, per) : INFINITY, 2e-3);
    for (int r = 0; r < 4; r++)
        free(lg[r]);
    decode_rig_free(&rig);
}

/* ==== GLM-4.5 / DeepSeek-V3 ops (kernels/family.cu) ==== */

static void case_bias_add(int n, int d)
{
    char shape[96];
    float *x = xmalloc((size_t)n * d * 4), *b = xmalloc((size_t)d * 4);
    fill_f32(x, (size_t)n * d, 2.0f);
    fill_f32(b, (size_t)d, 1.0f);
    pair_t px = pair_new((size_t)n * d * 4, x), pb = pair_new((size_t)d * 4, b);
    cpu->ops->bias_add(cpu, px.c, pb.c, n, d);
    gpu->ops->bias_add(gpu, px.g, pb.g, n, d);
    snprintf(shape, sizeof shape, "n %d d %d", n, d);
    report("bias_add", shape, err_f32(&px, (size_t)n * d), 0.0);
    pair_free(&px);
    pair_free(&pb);
    free(x);
    free(b);
}

/* rope on rot dims at offset off of each head of (n, heads, hd) (MLA: q + nope, hd nope+rope) */
static void case_rope_partial(int n, int heads, int hd, int off, int rot, bool inter, float scale)
{
    char shape[96];
    const size_t nx = (size_t)n * heads * hd;
    float *x = xmalloc(nx * 4), *inv = xmalloc((size_t)rot / 2 * 4);
    int32_t *pos = xmalloc((size_t)n * 4);
    fill_f32(x, nx, 2.0f);
    for (int j = 0; j < rot / 2; j++)
        inv[j] = (float)pow(10000.0, -2.0 * j / rot);
    for (int i = 0; i < n; i++)
        pos[i] = (int32_t)(rng_next() % 4096);
    pair_t px = pair_new(nx * 4, x), pp = pair_new((size_t)n * 4, pos);
    pair_t pi = pair_new((size_t)rot / 2 * 4, inv);
    cpu->ops->rope_partial(cpu, (float *)px.c + off, pp.c, pi.c, n, heads, hd, rot, inter, scale);
    gpu->ops->rope_partial(gpu, (float *)px.g + off, pp.g, pi.g, n, heads, hd, rot, inter, scale);
    snprintf(shape, sizeof shape, "n %d h %d hd %d rot %d@%d %s x%.3g", n, heads, hd, rot, off,
             inter ? "pairs" : "halves", scale);
    report("rope_partial", shape, err_f32(&px, nx - (size_t)off), 2e-5);
    pair_free(&px);
    pair_free(&pp);
    pair_free(&pi);
    free(x);
    free(inv);
    free(pos);
}

static void case_moe_route_grouped(int n, int E, int k, int ng, int tg)
{
    char shape[96];
    float *lg = xmalloc((size_t)n * E * 4), *bias = xmalloc((size_t)E * 4);
    fill_f32(lg, (size_t)n * E, 4.0f);
    fill_f32(bias, (size_t)E, 0.5f);
    pair_t pl = pair_new((size_t)n * E * 4, lg), pb = pair_new((size_t)E * 4, bias);
    pair_t ids = pair_new((size_t)n * k * 4, NULL), w = pair_new((size_t)n * k * 4, NULL);
    cpu->ops->moe_route_grouped(cpu, ids.c, w.c, pl.c, pb.c, n, E, k, ng, tg, true, 2.5f);
    gpu->ops->moe_route_grouped(gpu, ids.g, w.g, pl.g, pb.g, n, E, k, ng, tg, true, 2.5f);
    snprintf(shape, sizeof shape, "n %d experts %d k %d groups %d/%d (ids differing)", n, E, k, tg,
             ng);
    report("moe_route_g", shape, err_bytes(&ids), 0.0);
    snprintf(shape, sizeof shape, "n %d experts %d k %d groups %d/%d (weights)", n, E, k, tg, ng);
    report("moe_route_g", shape, err_f32(&w, (size_t)n * k), 1e-5);
    pair_free(&pl);
    pair_free(&pb);
    pair_free(&ids);
    pair_free(&w);
    free(lg);
    free(bias);
}

static void case_head_matmul(int n, int heads, int nout, int kin, int stride)
{
    char shape[96];
    const size_t nx = (size_t)n * heads * stride, nw = (size_t)heads * nout * kin;
    float *x = xmalloc(nx * 4);
    uint16_t *w = xmalloc(nw * 2);
    fill_f32(x, nx, 2.0f);
    for (size_t i = 0; i < nw; i++)
        w[i] = pd_f32_to_bf16(rng_float() * 0.1f);
    pair_t px = pair_new(nx * 4, x), pw = pair_new(nw * 2, w);
    pair_t out = pair_new((size_t)n * heads * nout * 4, NULL);
    cpu->ops->head_matmul(cpu, out.c, px.c, pw.c, n, heads, nout, kin, stride);
    gpu->ops->head_matmul(gpu, out.g, px.g, pw.g, n, heads, nout, kin, stride);
    snprintf(shape, sizeof shape, "n %d h %d out %d in %d stride %d", n, heads, nout, kin, stride);
    report("head_matmul", shape, err_f32(&out, (size_t)n * heads * nout), 2e-5);
    pair_free(&px);
    pair_free(&pw);
    pair_free(&out);
    free(x);
    free(w);
}

/* a latent arena (n_pages pages of layout l) filled through the CPU latent_write */
static pair_t latent_arena_new(const kv_layout_t *l, int n_pages, int r)
{
    const int D = l->head_dim, P = l->page_tokens;
    size_t bytes = (size_t)n_pages * l->page_bytes;
    uint8_t *host = xmalloc(bytes);
    float *c = xmalloc((size_t)P * r * 4), *kpe = xmalloc((size_t)P * (D - r) * 4);
    int32_t *slots = xmalloc((size_t)P * 4);
    for (size_t i = 0; i < bytes; i++)
        host[i] = (uint8_t)rng_next();
    for (int p = 0; p < n_pages; p++) {
        for (int t = 0; t < P; t++)
            slots[t] = p * P + t;
        for (int layer = 0; layer < l->n_layers; layer++) {
            fill_f32(c, (size_t)P * r, 2.0f);
            fill_f32(kpe, (size_t)P * (D - r), 2.0f);
            cpu->ops->latent_write(cpu, host, l, layer, c, kpe, slots, P, r);
        }
    }
    pair_t a = pair_new(bytes, host);
    free(host);
    free(c);
    free(kpe);
    free(slots);
    return a;
}

static size_t gcd_size(size_t a, size_t b)
{
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void case_latent_write(pd_kvfmt_t fmt, int r, int rope, int n)
{
    char shape[96];
    kv_layout_t l;
    kv_layout_init_sides(&l, 2, 1, r + rope, 1, 16, fmt);
    const int n_pages = (n + 15) / 16 + 3;
    pair_t a = latent_arena_new(&l, n_pages, r);
    float *c = xmalloc((size_t)n * r * 4), *kpe = xmalloc((size_t)n * rope * 4);
    int32_t *slots = xmalloc((size_t)n * 4);
    fill_f32(c, (size_t)n * r, 4.0f);
    fill_f32(kpe, (size_t)n * rope, 4.0f);
    /* distinct slots (the contract: one token per slot), scattered over pages and positions: a
     * stride coprime to the slot count. (A stride of 7 over 7 pages of 16 once wrote every slot
     * 4 times at n 64; the GPU's blocks race on a slot where the CPU's last write wins.) */
    const size_t total = (size_t)n_pages * 16;
    size_t step = 7;
    while (gcd_size(step, total) != 1)
        step += 2;
    for (int i = 0; i < n; i++)
        slots[i] = (int32_t)(((size_t)i * step + 5) % total);
    for (int i = 3; i < n; i += 7)
        slots[i] = -1;
    pair_t pc = pair_new((size_t)n * r * 4, c), pk = pair_new((size_t)n * rope * 4, kpe);
    pair_t ps = pair_new((size_t)n * 4, slots);
    cpu->ops->latent_write(cpu, a.c, &l, 1, pc.c, pk.c, ps.c, n, r);
    gpu->ops->latent_write(gpu, a.g, &l, 1, pc.g, pk.g, ps.g, n, r);
    snprintf(shape, sizeof shape, "%s r %d rope %d n %d (bytes differing)", pd_kvfmt_name(fmt), r,
             rope, n);
    report("latent_write", shape, err_bytes(&a), 0.0);
    pair_free(&a);
    pair_free(&pc);
    pair_free(&pk);
    pair_free(&ps);
    free(c);
    free(kpe);
    free(slots);
}

/* n_seqs sequences, q_len[s] rows and ctx[s] context each; q_pe read with stride pe_stride */
static void case_latent_attention(pd_kvfmt_t fmt, int heads, int r, int rope, int pe_stride,
                                  int n_seqs, const int *q_len, const int *ctx, const char *what)
{
    char shape[128];
    kv_layout_t l;
    const int P = 16;
    int max_pages = 1, total = 0, n_rows = 0, max_ctx = 0;
    kv_layout_init_sides(&l, 2, 1, r + rope, 1, P, fmt);
    for (int s = 0; s < n_seqs; s++) {
        int np = (ctx[s] + P - 1) / P;
        max_pages = np > max_pages ? np : max_pages;
        total += np;
        n_rows += q_len[s];
        max_ctx = ctx[s] > max_ctx ? ctx[s] : max_ctx;
    }
    int n_pages = total + 2, used = 0;
    int32_t *bt = xmalloc((size_t)n_seqs * max_pages * 4), *qs = xmalloc(((size_t)n_seqs + 1) * 4);
    qs[0] = 0;
    for (int s = 0; s < n_seqs; s++) { /* pages in reverse order: block tables matter */
        int np = (ctx[s] + P - 1) / P;
        for (int i = 0; i < max_pages; i++)
            bt[s * max_pages + i] = i < np ? n_pages - 1 - (used + i) : 0;
        used += np;
        qs[s + 1] = qs[s] + q_len[s];
    }
    pair_t a = latent_arena_new(&l, n_pages, r);
    const size_t nl = (size_t)n_rows * heads * r, np = (size_t)n_rows * heads * pe_stride;
    float *ql = xmalloc(nl * 4), *qp = xmalloc(np * 4);
    fill_f32(ql, nl, 0.2f);
    fill_f32(qp, np, 0.5f);
    pair_t pql = pair_new(nl * 4, ql), pqp = pair_new(np * 4, qp), out = pair_new(nl * 4, NULL);
    pair_t pqs = pair_new(((size_t)n_seqs + 1) * 4, qs), pctx = pair_new((size_t)n_seqs * 4, ctx);
    pair_t pbt = pair_new((size_t)n_seqs * max_pages * 4, bt);
    pd_attn_batch_t bc = {n_seqs, max_pages, pqs.c, pctx.c, pbt.c, 0, 0};
    pd_attn_batch_t bg = {n_seqs, max_pages, pqs.g, pctx.g, pbt.g, 0, 0};
    const float scale = 1.0f / sqrtf(192.0f);
    cpu->ops->latent_attention(cpu, out.c, pql.c, pqp.c, a.c, &l, 1, &bc, heads, r, pe_stride,
                               scale);
    gpu->ops->latent_attention(gpu, out.g, pql.g, pqp.g, a.g, &l, 1, &bg, heads, r, pe_stride,
                               scale);
    snprintf(shape, sizeof shape, "%s %s h %d r %d rope %d rows %d ctx<=%d", pd_kvfmt_name(fmt),
             what, heads, r, rope, n_rows, max_ctx);
    report("latent_attn", shape, err_f32_vec(&out, (size_t)n_rows * heads, (size_t)r), 1e-4);
    /* the tiled kernel (family_mla_tile: 8 heads per block, 32-token tiles in shared memory) on
     * the same inputs over a poisoned output, whichever the backend's default is */
    const int tile_was = family_mla_tile;
    family_mla_tile = !tile_was;
    pair_ok(gpu->ops->memset(gpu, out.g, 0xff, nl * 4));
    gpu->ops->latent_attention(gpu, out.g, pql.g, pqp.g, a.g, &l, 1, &bg, heads, r, pe_stride,
                               scale);
    family_mla_tile = tile_was;
    snprintf(shape, sizeof shape, "%s %s h %d r %d rope %d rows %d ctx<=%d %s", pd_kvfmt_name(fmt),
             what, heads, r, rope, n_rows, max_ctx, tile_was ? "untiled" : "tiled");
    report("latent_attn", shape, err_f32_vec(&out, (size_t)n_rows * heads, (size_t)r), 1e-4);
    pair_free(&a);
    pair_free(&pql);
    pair_free(&pqp);
    pair_free(&out);
    pair_free(&pqs);
    pair_free(&pctx);
    pair_free(&pbt);
    free(bt);
    free(qs);
    free(ql);
    free(qp);
}

/* FP8 weights with 128x128 block scales (DeepSeek-V3 / Kimi K2 checkpoints as published):
 * N and K not multiples of 128 (partial scale blocks), the GEMV (n <= 8, K % 16 == 0) and the
 * dequantize-to-bf16 GEMM (one bf16 GEMM and the hi + lo split) */
static void cases_fp8_block(void)
{
    const pd_wfmt_t f = PD_WFMT_FP8_BLOCK;
    case_matmul(f, 1, 160, 512, "dsv3 fixture kv_a gemv");
    case_matmul(f, 3, 200, 400, "odd N K gemv");
    case_matmul(f, 8, 768, 192, "fixture q_b gemv");
    case_matmul(f, 2, 300, 100, "K % 16 != 0 gemm");
    case_matmul(f, 37, 2048, 512, "fixture gemm");
    case_matmul_on(f, 37, 1000, 1040, "odd gemm", true);
    if (small_only)
        return;
    case_matmul(f, 1, 24576, 1536, "V3 q_b gemv");
    case_matmul(f, 8, 7168, 18432, "V3 down gemv");
    case_matmul(f, 64, 4096, 7168, "V3 expert gate_up gemm");
    case_matmul_on(f, 512, 7168, 2048, "V3 expert down", true);
}

/* Session 16: GLM-4.5 / DeepSeek-V3 decode steps with MoE layers in CUDA graphs. The family's
 * experts are registered with moe_prepare (model_ctx_create), so its MoE steps route and group on
 * the device and are captured. fixture (tiny-glm / tiny-dsv3 from PD_MODELS_DIR, else
 * deploy/models) with wfmt experts and kvfmt KV, `steps` decode steps of n sequences from a
 * zeroed arena, the same fixed tokens (seed printed) fed to three contexts: graphs on (the first
 * step of the shape runs eagerly and is captured, the later ones replay), the padded eager plan
 * (MODEL_GRAPHS_EAGER: bit-identical to the graph) and the host-grouped experts (backend option
 * moe_grouped=off: routing read back, experts one matmul each, graphs off). Reports: the graph run
 * must have had graphs on and kept them (else INFINITY) and equal the eager plan bit for bit
 * (differing floats, 0); the host-grouped run per element against the graph run, |a - b| /
 * rms(row of b), max over all logits (the grouped matmul rounds INT4 operands to f16 and
 * quantizes FP8 activations per grouped row: 3e-2; a wrong expert or weight gives O(1)). */
static void case_family_graphs(const char *fixture, pd_wfmt_t wfmt, pd_kvfmt_t kvfmt, int n,
                               int steps, uint64_t seed)
{
    char shape[160], dir[2048];
    const char *models = getenv("PD_MODELS_DIR");
    model_t *m = NULL;
    snprintf(dir, sizeof dir, "%s/%s", models ? models : "deploy/models", fixture);
    model_load_params_t mp = {dir, wfmt, PD_WFMT_BF16, gpu, false, NULL};
    pair_ok(model_load(&mp, &m));
    const int vocab = m->cfg.vocab_size, per_seq = 4, ctx0 = 20;
    int kvh, kvd, sides;
    hf_config_kv_shape(&m->cfg, &kvh, &kvd, &sides);
    kv_layout_t l;
    kv_layout_init_sides(&l, m->cfg.num_hidden_layers, kvh, kvd, sides, 16, kvfmt);
    void *arena;
    const size_t ab = (size_t)n * per_seq * l.page_bytes;
    pair_ok(gpu->ops->alloc(gpu, ab, &arena));
    const kv_seq_t **sp = NULL;
    kv_seq_t *seqs = decode_seqs_new(n, per_seq, &sp);
    int32_t *toks = xmalloc((size_t)n * steps * 4), *qs = xmalloc(((size_t)n + 1) * 4),
            *cl = xmalloc((size_t)n * 4), *rows = xmalloc((size_t)n * 4);
    const size_t per = (size_t)n * vocab;
    float *lg[3];
    for (int r = 0; r < 3; r++)
        lg[r] = xmalloc(per * steps * 4);
    rng_state = seed;
    for (int i = 0; i < n * steps; i++)
        toks[i] = (int32_t)(2 + rng_next() % (uint64_t)(vocab - 2));
    const model_graphs_t mode_of[3] = {MODEL_GRAPHS_ON, MODEL_GRAPHS_EAGER, MODEL_GRAPHS_OFF};
    bool graphs_ok = true;
    for (int r = 0; r < 3; r++) {
        model_ctx_t *ctx = NULL;
        if (r == 2)
            pair_ok(backend_set_options(gpu, "moe_grouped=off"));
        pair_ok(model_ctx_create(m, &ctx));
        const model_graphs_t got = model_ctx_set_graphs(ctx, mode_of[r]);
        if (r < 2 && got != mode_of[r])
            graphs_ok = false; /* the family's MoE layers were not registered */
        pair_ok(gpu->ops->memset(gpu, arena, 0, ab));
        for (int s = 0; s < n; s++)
            cl[s] = ctx0 - (s % 5);
        for (int step = 0; step < steps; step++) {
            for (int s = 0; s < n; s++) {
                qs[s] = s;
                rows[s] = s;
                cl[s]++;
            }
            qs[n] = n;
            model_batch_t b = {n, toks + (size_t)n * step, n, qs, cl, sp, n, rows};
            pair_ok(model_forward(ctx, arena, &l, &b, lg[r] + per * step));
        }
        if (r == 0 && model_ctx_graphs(ctx) != MODEL_GRAPHS_ON)
            graphs_ok = false; /* a capture failed: the steps ran eagerly */
        model_ctx_destroy(ctx);
        if (r == 2)
            pair_ok(backend_set_options(gpu, "moe_grouped=on"));
    }
    size_t diff = 0;
    double err = 0.0;
    for (size_t i = 0; i < per * steps; i++)
        diff += memcmp(&lg[0][i], &lg[1][i], 4) != 0;
    for (size_t row = 0; row < (size_t)n * steps; row++) {
        const float *a = lg[2] + row * vocab, *b = lg[0] + row * vocab;
        double ss = 0.0;
        for (int v = 0; v < vocab; v++)
            ss += (double)b[v] * b[v];
        const double rms = sqrt(ss / vocab) + 1e-30;
        for (int v = 0; v < vocab; v++) {
            const double e = fabs((double)a[v] - b[v]) / rms;
            err = isfinite(a[v]) && isfinite(b[v]) ? fmax(err, e) : INFINITY;
        }
    }
    snprintf(shape, sizeof shape, "%s %s kv %s n %d steps %d seed %llu graph vs eager (differing)",
             fixture, pd_wfmt_name(wfmt), pd_kvfmt_name(kvfmt), n, steps, (unsigned long long)seed);
    report("family_graphs", shape, graphs_ok ? (double)diff : INFINITY, 0.0);
    snprintf(shape, sizeof shape, "%s %s kv %s n %d host-grouped vs graph (max |d| / row rms)",
             fixture, pd_wfmt_name(wfmt), pd_kvfmt_name(kvfmt), n);
    report("family_graphs", shape, err, 3e-2);
    decode_seqs_free(seqs, sp, n);
    free(toks);
    free(qs);
    free(cl);
    free(rows);
    for (int r = 0; r < 3; r++)
        free(lg[r]);
    gpu->ops->free(gpu, arena);
    model_destroy(m);
}

/* case_family_graphs on both fixtures: INT4 and FP8 experts, batch 1 (the GEMV paths) and 5
 * (padded to the bucket of 8), BF16; the fixtures must be unpacked (run-family.sh and
 * run-round-s16a.sh carry them) */
static void cases_family_graphs(void)
{
    const char *fx[] = {"tiny-glm", "tiny-dsv3"};
    for (int i = 0; i < 2; i++) {
        case_family_graphs(fx[i], PD_WFMT_INT4, PD_KV_FP8, 1, 4, 1601 + (uint64_t)i);
        case_family_graphs(fx[i], PD_WFMT_INT4, PD_KV_FP8, 5, 4, 1603 + (uint64_t)i);
        case_family_graphs(fx[i], PD_WFMT_FP8, PD_KV_BF16, 5, 4, 1605 + (uint64_t)i);
        case_family_graphs(fx[i], PD_WFMT_BF16, PD_KV_BF16, 3, 3, 1607 + (uint64_t)i);
    }
}

static void cases_family(void)
{
    cases_fp8_block();
    /* GLM-4.5 / 4.5-Air attention: 96 / 8 heads, a GQA group of 12, above the decode kernels'
     * 8: the backend runs it in parts of 6 (gather, attend, scatter); prefill-shaped batches go
     * to flash attention, which takes any group */
    {
        const int gq[] = {1, 1, 1}, gc[] = {1, 17, 40}, pq1[] = {32}, pc1[] = {32};
        const pd_kvfmt_t gf[] = {PD_KV_BF16, PD_KV_FP8, PD_KV_F32};
        for (int f = 0; f < 3; f++)
            case_attention(gf[f], 12, 1, 128, 3, gq, gc, true, "group 12 parts");
        case_attention(PD_KV_BF16, 24, 2, 128, 3, gq, gc, false, "group 12 parts, no hints");
        case_attention(PD_KV_BF16, 12, 1, 128, 1, pq1, pc1, true, "group 12 prefill");
        if (!small_only) {
            const int q2[] = {1, 1}, c2[] = {300, 1024};
            case_attention(PD_KV_FP8, 96, 8, 128, 2, q2, c2, true, "GLM-4.5-Air decode");
            case_attention(PD_KV_BF16, 96, 8, 128, 2, q2, c2, true, "GLM-4.5-Air decode");
        }
    }
    case_bias_add(37, 512);
    case_rope_partial(37, 4, 128, 0, 64, false, 1.0f);  /* GLM: half of each head */
    case_rope_partial(37, 4, 96, 64, 32, true, 1.0f);   /* tiny-dsv3 q: rope after nope */
    case_rope_partial(37, 1, 32, 0, 32, true, 1.1386f); /* k_pe, a yarn factor */
    case_moe_route_grouped(37, 8, 2, 1, 1);             /* tiny-glm */
    case_moe_route_grouped(37, 8, 2, 2, 1);             /* tiny-dsv3 */
    case_head_matmul(37, 4, 128, 64, 96);               /* tiny-dsv3 q_nope -> latent */
    case_head_matmul(37, 4, 64, 128, 128);              /* latent -> v */
    const int q1[] = {1, 1, 1}, c1[] = {1, 17, 40}, qp[] = {23}, cp[] = {23};
    const pd_kvfmt_t kf[] = {PD_KV_F32, PD_KV_BF16, PD_KV_FP8};
    for (int f = 0; f < 3; f++) {
        case_latent_write(kf[f], 128, 32, 37);
        case_latent_attention(kf[f], 4, 128, 32, 96, 3, q1, c1, "decode");
        case_latent_attention(kf[f], 4, 128, 32, 96, 1, qp, cp, "prefill");
    }
    if (small_only)
        return;
    /* Kimi K2 / DeepSeek-V3 shapes: 64 / 128 heads, latent 512 + 64, 384 / 256 experts */
    case_rope_partial(8, 64, 192, 128, 64, true, 1.0f);
    case_moe_route_grouped(64, 384, 8, 1, 1);
    case_moe_route_grouped(64, 256, 8, 8, 4);
    case_head_matmul(8, 64, 512, 128, 192);
    case_head_matmul(8, 64, 128, 512, 512);
    const int qd[] = {1, 1}, cd[] = {300, 1024};
    case_latent_write(PD_KV_FP8, 512, 64, 64);
    case_latent_attention(PD_KV_FP8, 64, 512, 64, 192, 2, qd, cd, "Kimi decode");
    case_latent_attention(PD_KV_BF16, 128, 512, 64, 192, 2, qd, cd, "V3 decode");
}

/* matmul_w4gemv / matmul_w8gemv (PD_GPU_TEST_XGEMV=1: these alone, with the default-routing
 * Llama-3-8B cases, which run on them) */
static void cases_xgemv(bool with_defaults)
{
    const pd_wfmt_t i4 = PD_WFMT_INT4, f8 = PD_WFMT_FP8;
    /* matmul_w4gemv / matmul_w8gemv (n <= 8, K slices summed in the block): forced plans (rows,
     * slices, depth, blocks) of every instantiation; empty slices (K 384 in 8 INT4 / K 512 in 16
     * FP8 slices), uneven ones, FP8 rows past N (N 200, 1000), persistent grids of 1 .. 10
     * blocks over more tiles (both parities of the partial-sum slots, uneven tiles per block) */
    mma_xgemv = true;
    /* INT4 on both weight streams: the bulk-fed ring (sm_90+, matmul_set_w4bulk) and registers */
    int cc = 0;
    cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, 0);
    const int bulk0 = matmul_set_w4bulk(0);
    /* n, N, K, rows, slices, depth, blocks (0: one per tile), seed, activation scale, label */
    static const struct {
        int n;
        int64_t N, K;
        int rows, slices, depth, blocks;
        uint64_t seed;
        float xs;
        const char *what;
    } xg[] = {
        {1, 256, 1024, 16, 1, 2, 1, 181, 1.0f, ""},
        {3, 320, 640, 32, 2, 2, 3, 182, 1.0f, ""},
        {8, 512, 1024, 16, 4, 4, 0, 183, 1.0f, ""},
        {5, 96, 384, 16, 8, 2, 2, 184, 1.0f, "empty slices"},
        {2, 224, 1280, 32, 3, 2, 4, 185, 1.0f, ""},
        {8, 256, 4096, 16, 2, 4, 5, 186, 1.0f, "n 8"},
        {4, 512, 2048, 16, 16, 4, 7, 187, 1.0f, "16 slices"},
        {4, 256, 1024, 16, 2, 4, 3, 188, 65536.0f, "|x| ~ 2^16"},
        {3, 256, 1024, 32, 3, 2, 0, 189, 1.0f / 65536.0f, "|x| ~ 2^-16"},
    };
    for (int bulk = cc >= 9; bulk >= 0; bulk--) {
        matmul_set_w4bulk(bulk);
        for (size_t i = 0; i < sizeof xg / sizeof xg[0]; i++) {
            char w[64];
            snprintf(w, sizeof w, "%s%s%s", bulk ? "bulk" : "regs", *xg[i].what ? ", " : "",
                     xg[i].what);
            mma_x_scale = xg[i].xs;
            mma_xblocks = xg[i].blocks;
            case_mma_gemm_d(i4, xg[i].n, xg[i].N, xg[i].K, xg[i].rows, xg[i].slices, xg[i].depth,
                            xg[i].seed, w);
        }
        if (!small_only) { /* the gate_up plan of the table: 2 blocks of 8 warps per SM */
            mma_x_scale = 1.0f;
            mma_xblocks = 264;
            case_mma_gemm_d(i4, 2, 28672, 4096, 32, 8, 2, 200,
                            bulk ? "bulk, 8B gate_up, 264 blocks" : "regs, 8B gate_up, 264 blocks");
        }
    }
    matmul_set_w4bulk(bulk0);
    mma_x_scale = 1.0f;
    mma_xblocks = 4;
    case_mma_gemm_d(f8, 1, 200, 384, 16, 1, 4, 191, "rows past N");
    mma_xblocks = 0;
    case_mma_gemm_d(f8, 4, 320, 640, 32, 3, 2, 192, "");
    mma_xblocks = 10;
    case_mma_gemm_d(f8, 8, 1000, 1152, 16, 5, 8, 193, "rows past N");
    mma_xblocks = 1;
    case_mma_gemm_d(f8, 2, 96, 512, 32, 16, 2, 194, "empty slices");
    mma_xblocks = 3;
    case_mma_gemm_d(f8, 3, 512, 2048, 16, 4, 4, 195, "");
    if (!small_only) {
        mma_xblocks = 132;
        case_mma_gemm_d(i4, 1, 28672, 4096, 16, 2, 4, 196, "8B gate_up");
        mma_xblocks = 132;
        case_mma_gemm_d(i4, 7, 4096, 14336, 32, 8, 2, 197, "8B down");
        mma_xblocks = 132;
        case_mma_gemm_d(f8, 1, 28672, 4096, 16, 2, 8, 198, "8B gate_up");
        mma_xblocks = 264;
        case_mma_gemm_d(f8, 4, 4096, 14336, 32, 8, 2, 199, "8B down");
    }
    mma_xgemv = false;
    mma_xblocks = 0;
    if (with_defaults) {
        case_mma_gemm(i4, 2, 256, 1024, 0, 0, 160, "default");
        case_mma_gemm(f8, 6, 256, 1024, 0, 0, 161, "default");
        case_mma_gemm(f8, 1, 200, 384, 0, 0, 121, "odd N");
        case_mma_gemm(f8, 7, 1000, 640, 0, 0, 122, "n 7");
    }
    if (with_defaults && !small_only) {
        case_mma_gemm(i4, 8, 28672, 4096, 0, 0, 162, "default 8B gate_up");
        case_mma_gemm(i4, 2, 4096, 14336, 0, 0, 163, "default 8B down");
        case_mma_gemm(i4, 1, 6144, 4096, 0, 0, 164, "default 8B qkv");
        case_mma_gemm(f8, 4, 28672, 4096, 0, 0, 165, "default 8B gate_up");
        case_mma_gemm(f8, 1, 4096, 14336, 0, 0, 166, "default 8B down");
        case_mma_gemm(i4, 1, 28672, 4096, 0, 0, 176, "default 8B gate_up");
        case_mma_gemm(i4, 8, 4096, 14336, 0, 0, 177, "default 8B down (n 8: not w4gemv)");
    }
}

/* The matmul cases: every weight format through the backend op, the tensor-core GEMMs and the
 * INT4 GEMV with default and forced plans. */
static void cases_matmul(void)
{
    const pd_wfmt_t fmts[] = {PD_WFMT_BF16, PD_WFMT_FP8, PD_WFMT_INT4, PD_WFMT_F32};
    for (int f = 0; f < 4; f++) {
        case_matmul(fmts[f], 1, 1024, 512, "fixture qkv");
        case_matmul(fmts[f], 5, 2048, 1024, "fixture down");
        case_matmul(fmts[f], 37, 2048, 512, "fixture gate_up");
        case_matmul(fmts[f], 200, 2048, 512, "fixture lm_head");
        if (!small_only)
            case_matmul(fmts[f], 1, 4096, 4096, "8B o");
        if (!small_only)
            case_matmul(fmts[f], 1, 4096, 14336, "8B down");
        if (!small_only)
            case_matmul(fmts[f], 12, 1024, 4096, "8B k");
        if (!small_only)
            case_matmul(fmts[f], 64, 4096, 14336, "8B down");
        case_matmul(fmts[f], 3, 200, 384, "odd N");
    }
    /* the accuracy mode (hi + lo split) on the GEMM shapes */
    case_matmul_on(PD_WFMT_BF16, 37, 2048, 512, "fixture gate_up", true);
    case_matmul_on(PD_WFMT_BF16, 200, 2048, 512, "fixture lm_head", true);
    case_matmul_on(PD_WFMT_INT4, 37, 2048, 512, "fixture gate_up", true);
    if (!small_only)
        case_matmul_on(PD_WFMT_BF16, 64, 4096, 14336, "8B down", true);
    if (!small_only)
        case_matmul(PD_WFMT_FP8, 512, 14336, 4096, "8B gate");
    if (!small_only)
        case_matmul(PD_WFMT_FP8, 1, 28672, 4096, "8B gate_up");
    if (!small_only)
        case_matmul(PD_WFMT_INT4, 1, 28672, 4096, "8B gate_up");

    /* tensor-core GEMMs: default routing, then forced plans (small n, splits) */
    const pd_wfmt_t i4 = PD_WFMT_INT4, f8 = PD_WFMT_FP8;
    case_mma_gemm(i4, 20, 200, 384, 0, 0, 101, "odd N");
    case_mma_gemm(i4, 130, 1000, 640, 0, 0, 102, "3 token blocks");
    case_mma_gemm(i4, 9, 512, 1024, 0, 0, 103, "n 9");
    /* n > 256: tiled INT4 dequantized to bf16 (matmul_int4_to_bf16) for cuBLAS */
    {
        const int was = backend_cuda_set_int4_fp8(gpu, 0);
        case_matmul(PD_WFMT_INT4, 300, 512, 640, "tiled, bf16 GEMM");
        backend_cuda_set_int4_fp8(gpu, was);
    }
    case_matmul(PD_WFMT_INT4, 300, 512, 640, "tiled, default GEMM (int4_gemm=fp8)");
    /* int4_gemm=fp8: tiled (N % 32 == 0) and plain (N 528) weights, n not a multiple of 16 (the
     * split plan, where cuBLASLt needs one) and n 272 (n <= 256 runs the INT4 mma kernels); the 8B
     * gate_up at n 512 */
    case_matmul_int4_fp8(300, 512, 640, 161, "tiled");
    case_matmul_int4_fp8(257, 528, 384, 162, "plain");
    case_matmul_int4_fp8(272, 528, 384, 164, "plain, n a multiple of 16");
    if (!small_only)
        case_matmul_int4_fp8(512, 28672, 4096, 163, "8B gate_up");
    case_mma_gemm(i4, 3, 300, 640, 6, 3, 104, "forced");
    case_mma_gemm(i4, 8, 512, 512, 8, 2, 105, "forced");
    case_mma_gemm(i4, 1, 256, 1024, 7, 1, 106, "forced");
    case_mma_gemm(i4, 5, 256, 1024, -1, 0, 107, "gemv tiled");
    /* the register-fed INT4 kernel: the plain layout (N % 32 != 0) */
    case_mma_gemm(i4, 37, 520, 640, 0, 0, 108, "plain layout");
    case_mma_gemm(i4, 8, 1000, 512, 8, 2, 109, "plain layout");
    /* matmul_wgemv (INT4 tiled, n <= 8, quantization inside): forced plans; dead warps past N
     * (N 96 with 4 warps, N 320 with 3), every depth, splits */
    case_mma_gemm_d(i4, 1, 256, 1024, 2, 1, 4, 151, "wgemv");
    case_mma_gemm_d(i4, 3, 320, 640, 3, 2, 8, 152, "wgemv");
    case_mma_gemm_d(i4, 8, 512, 1024, 4, 3, 16, 153, "wgemv");
    case_mma_gemm_d(i4, 5, 96, 384, 4, 1, 4, 154, "wgemv dead warp");
    case_mma_gemm_d(i4, 2, 224, 1280, 7, 4, 8, 155, "wgemv");
    case_mma_gemm(i4, 2, 256, 1024, 0, 0, 160, "default (wgemv)");
    case_mma_gemm(f8, 6, 256, 1024, 0, 0, 161, "default");
    case_mma_gemm(f8, 1, 200, 384, 0, 0, 121, "odd N");
    case_mma_gemm(f8, 7, 1000, 640, 0, 0, 122, "n 7");
    case_mma_gemm(f8, 3, 300, 640, 6, 3, 123, "forced");
    case_mma_gemm(f8, 40, 1000, 1152, 8, 2, 124, "forced");
    case_mma_gemm(f8, 130, 520, 576, 7, 1, 125, "forced");
    if (!small_only) {
        case_mma_gemm(i4, 16, 4096, 4096, 0, 0, 111, "8B o");
        case_mma_gemm(i4, 17, 1024, 4096, 0, 0, 112, "8B k");
        case_mma_gemm(i4, 33, 28672, 4096, 0, 0, 113, "8B gate_up");
        case_mma_gemm(i4, 64, 28672, 4096, 0, 0, 114, "8B gate_up");
        case_mma_gemm(i4, 64, 4096, 14336, 0, 0, 115, "8B down");
        case_mma_gemm(i4, 256, 2048, 4096, 0, 0, 116, "n 256");
        case_mma_gemm(i4, 1, 28672, 4096, 7, 1, 117, "forced 8B gate_up");
        case_mma_gemm(i4, 4, 4096, 14336, 8, 8, 118, "forced 8B down");
        case_mma_gemm(i4, 1, 28672, 4096, -1, 0, 119, "gemv tiled 8B gate_up");
        case_mma_gemm(f8, 1, 28672, 4096, 0, 0, 131, "8B gate_up");
        case_mma_gemm(f8, 8, 4096, 14336, 0, 0, 132, "8B down");
        case_mma_gemm(f8, 64, 28672, 4096, 7, 1, 133, "forced 8B gate_up");
        case_mma_gemm(f8, 64, 4096, 14336, 6, 6, 134, "forced 8B down");
        case_mma_gemm(f8, 1, 28672, 4096, 7, 1, 135, "forced 8B gate_up");
        case_mma_gemm(f8, 2, 6144, 4096, 6, 4, 136, "forced 8B qkv");
        case_mma_gemm(i4, 8, 28672, 4096, 0, 0, 162, "default 8B gate_up");
        case_mma_gemm(i4, 2, 4096, 14336, 0, 0, 163, "default 8B down");
        case_mma_gemm(i4, 1, 6144, 4096, 0, 0, 164, "default 8B qkv");
        case_mma_gemm(f8, 4, 28672, 4096, 0, 0, 165, "default 8B gate_up");
        case_mma_gemm(f8, 1, 4096, 14336, 0, 0, 166, "default 8B down");
        case_mma_gemm_d(i4, 1, 28672, 4096, 4, 1, 16, 167, "wgemv 8B gate_up");
        case_mma_gemm_d(i4, 8, 4096, 14336, 4, 8, 16, 168, "wgemv 8B down");
    }
    /* activations past the f16 range (|x| up to 2^20) and tiny ones: the per-token power-of-two
     * scaling of both INT4 activation paths */
    mma_x_scale = 65536.0f;
    case_mma_gemm_d(i4, 4, 256, 1024, 4, 2, 4, 171, "wgemv |x| ~ 2^16");
    case_mma_gemm(i4, 12, 256, 1024, 4, 2, 172, "|x| ~ 2^16");
    mma_x_scale = 1.0f / 65536.0f;
    case_mma_gemm_d(i4, 3, 256, 1024, 8, 8, 8, 173, "wgemv |x| ~ 2^-16, 8 splits");
    mma_x_scale = 1.0f;
    /* matmul_wgemv at n 5 and 8 (forced: the backend routes them to the GEMM) */
    case_mma_gemm_d(i4, 5, 512, 2048, 4, 3, 4, 174, "wgemv n 5");
    case_mma_gemm_d(i4, 8, 384, 1024, 8, 1, 4, 175, "wgemv n 8");

    cases_xgemv(false);
    cases_int4_mma2();
    cases_w4wg();
    cases_w8wg();
    cases_fp8_cluster();
    cases_matmul_group();
    cases_act_f16wg();
    cases_mm_fused();
}

/* matmul_w8wg (session 21, FP8 wgmma + TMA): forced plans at fixture shapes (rows past N in the
 * last block, N not a multiple of 16, one stage, splits of unequal length, several passes over
 * the ring, two token tiles, the n-16 tile), its plan at the 8B shapes (fixed seeds 431..), and
 * the backend route (PD_CUDA_W8WG=1 on a second backend). */
static void cases_w8wg(void)
{
    const pd_wfmt_t f8 = PD_WFMT_FP8;
    if (!matmul_w8wg_usable()) {
        report("mma gemm", "matmul_w8wg usable (sm_90a build on a compute capability 9.0 device)",
               INFINITY, 0.0);
        return;
    }
    mma_w8 = 1;
    case_mma_gemm(f8, 17, 256, 1024, 2, 1, 431, "forced");
    case_mma_gemm(f8, 64, 288, 640, 2, 1, 432, "forced");
    case_mma_gemm(f8, 40, 512, 1280, 2, 3, 433, "forced");
    case_mma_gemm(f8, 5, 320, 640, 1, 2, 434, "forced");
    case_mma_gemm(f8, 100, 200, 2048, 1, 4, 435, "forced");
    case_mma_gemm(f8, 1, 96, 384, 2, 1, 436, "forced");
    case_mma_gemm(f8, 16, 128, 128, 1, 1, 437, "forced");
    case_mma_gemm(f8, 64, 512, 4096, 2, 2, 438, "forced");
    case_mma_gemm(f8, 33, 384, 3072, 1, 1, 439, "forced");
    case_mma_gemm(f8, 9, 1000, 1280, 2, 4, 440, "forced");
    case_mma_gemm(f8, 64, 512, 4096, 2, 8, 450, "forced, 8 splits");
    case_mma_gemm(f8, 20, 328, 1408, 1, 6, 471, "forced, 6 splits");
    mma_w8 = -1;
    case_mma_gemm(f8, 48, 1024, 2048, 1, 1, 441, "plan");
    if (!small_only) {
        case_mma_gemm(f8, 64, 28672, 4096, 1, 1, 442, "plan 8B gate_up");
        case_mma_gemm(f8, 64, 4096, 14336, 1, 1, 443, "plan 8B down");
        case_mma_gemm(f8, 64, 6144, 4096, 1, 1, 444, "plan 8B qkv");
        case_mma_gemm(f8, 64, 4096, 4096, 1, 1, 445, "plan 8B o");
        case_mma_gemm(f8, 16, 6144, 4096, 1, 1, 446, "plan 8B qkv");
        case_mma_gemm(f8, 1, 4096, 4096, 1, 1, 447, "plan 8B o");
    }
    mma_w8 = 0;
    /* the whole FP8 decode step (the fused ops' activations) with the option on and off */
    case_decode_w8wg(1, 3);
    case_decode_w8wg(9, 3);
    case_decode_w8wg(64, 2);
    /* the backend route (PD_CUDA_W8WG=1: every n up to 64) */
    setenv("PD_CUDA_W8WG", "1", 1);
    pd_backend_t *keep = gpu;
    if (backend_cuda_create(0, &gpu) == PD_OK) {
        case_mma_gemm(f8, 48, 1024, 2048, 0, 0, 448, "PD_CUDA_W8WG=1 op n 48");
        case_mma_gemm(f8, 3, 512, 1024, 0, 0, 449, "PD_CUDA_W8WG=1 op n 3");
        backend_destroy(gpu);
    } else {
        report("mma gemm", "PD_CUDA_W8WG=1 backend", INFINITY, 0.0);
    }
    gpu = keep;
    unsetenv("PD_CUDA_W8WG");
}

/* The whole INT4 / FP8-KV decode step (tiny-llama rig, n sequences, `steps` graph-captured
 * steps) with option w4wg_cluster off, then on: err = max |on - off| / max |off| over every
 * step's logits. The two plans may split K differently (f32 summation order only, each GEMM
 * within its cases' bounds), and the FP8 KV cache turns those last-bit differences into e4m3
 * rounding flips of single k / v values (3 mantissa bits): session 22 measured 1.4e-3 .. 3.2e-3
 * over three runs on an H100; a layout or merge bug gives O(1). */
static void case_decode_w4cl(int n, int steps)
{
    char shape[128];
    decode_rig_t rig;
    decode_rig_new(&rig, PD_WFMT_INT4, PD_KV_FP8, n, steps);
    const double e = decode_rig_ab(&rig, "w4wg_cluster=off", "w4wg_cluster=on",
                                   "w4wg_cluster=on" /* the default */, NULL, 0, 0);
    snprintf(shape, sizeof shape, "tiny-llama int4 kv fp8 n %d steps %d w4wg_cluster on / off", n,
             steps);
    report("decode_w4cl", shape, e, 1e-2);
    decode_rig_free(&rig);
}

/* A split GEMM of decode batches run twice on the same inputs (fixed seed), once with its
 * partial sums' second launch and once with its S K splits added inside clusters: the two outputs
 * must be the same bits (the same sums in the same order). INT4: matmul_w4wg with configuration
 * p (its epilogue multiplier is a power of two); FP8: matmul_fp8_mma with p warps, the switch
 * matmul_fp8_cluster (each block's scaled sums added in split order). err = the count of
 * differing bytes. */
static void case_cluster_same(pd_wfmt_t fmt, int n, int64_t N, int64_t K, int p, int S,
                              uint64_t seed)
{
    char shape[96];
    const uint64_t saved = rng_state;
    const bool int4 = fmt == PD_WFMT_INT4;
    rng_state = seed;
    pd_weight_t host, wc, wg;
    weight_host_new(fmt, N, K, gpu, &host, &wc, &wg);
    float *x = xmalloc((size_t)n * K * 4);
    fill_f32(x, (size_t)n * K, 1.0f);
    pair_t px = pair_new((size_t)n * K * 4, x), a = pair_new((size_t)n * N * 4, NULL),
           b = pair_new((size_t)n * N * 4, NULL);
    /* the activations (INT4: the f16 image; FP8: e4m3 rows), their multipliers, the partials */
    const size_t hb = ((int4 ? matmul_w4wg_act_bytes(n, K) : (size_t)n * K) + 255) / 256 * 256,
                 mb = ((size_t)n * 4 + 255) / 256 * 256, pf = matmul_int4_mma_part_floats(n, N, S);
    void *scratch = NULL;
    pair_ok(gpu->ops->alloc(gpu, hb + mb + pf * 4, &scratch));
    pair_ok(gpu->ops->memset(gpu, scratch, 0xff, hb + mb + pf * 4));
    uint8_t *sb = scratch;
    float *mult = (float *)(sb + hb), *part = (float *)(sb + hb + mb);
    cudaStream_t st = backend_cuda_stream(gpu);
    if (int4) {
        pair_ok(matmul_quant_act_f16wg((uint16_t *)sb, mult, px.g, n, K, st));
        pair_ok(matmul_w4wg(a.g, part, (uint16_t *)sb, mult, &wg, n, p, S, false, st));
        pair_ok(matmul_w4wg(b.g, NULL, (uint16_t *)sb, mult, &wg, n, p, S, true, st));
    } else {
        const int was = matmul_fp8_cluster;
        pair_ok(matmul_quant_act_fp8(sb, NULL, mult, px.g, n, K, st));
        matmul_fp8_cluster = 0;
        pair_ok(matmul_fp8_mma(a.g, part, sb, mult, &wg, n, p, S, st));
        matmul_fp8_cluster = 1;
        pair_ok(matmul_fp8_mma(b.g, NULL, sb, mult, &wg, n, p, S, st));
        matmul_fp8_cluster = was;
    }
    const size_t nd = dev_bytes_differ(a.g, b.g, (size_t)n * N * 4);
    snprintf(shape, sizeof shape, "%s n %d N %lld K %lld %s%d S %d cluster = parts seed %llu",
             int4 ? "int4 w4wg" : "fp8 mma", n, (long long)N, (long long)K, int4 ? "cfg " : "w", p,
             S, (unsigned long long)seed);
    report("mma gemm", shape, (double)nd, 0.0);
    gpu->ops->free(gpu, scratch);
    pair_free(&px);
    pair_free(&a);
    pair_free(&b);
    free(x);
    model_host_weight_free(&host);
    backend_weight_free(cpu, &wc);
    backend_weight_free(gpu, &wg);
    rng_state = saved;
}

/* matmul_fp8_mma_group over count FP8 weights (rows Ns[i], one K) with `warps` warps and S
 * splits (S > 1: with matmul_fp8_cluster) against matmul_fp8_mma per weight with the same plan
 * on the same activations (fixed seed): every output the same bits. err = the count of
 * differing bytes over the outputs. S 0: the same for the K-split GEMV
 * (matmul_fp8_ksplit_group against matmul_fp8_ksplit, load batch `warps`). */
static void case_fp8_mma_group(int n, const int64_t *Ns, int count, int64_t K, int warps, int S,
                               uint64_t seed)
{
    char shape[128], nb[48] = "";
    const uint64_t saved = rng_state;
    const int was = matmul_fp8_cluster;
    rng_state = seed;
    pd_weight_t host[MATMUL_GROUP_MAX], wc[MATMUL_GROUP_MAX], wg[MATMUL_GROUP_MAX];
    pair_t a[MATMUL_GROUP_MAX], b[MATMUL_GROUP_MAX];
    float *outs[MATMUL_GROUP_MAX];
    const pd_weight_t *ws[MATMUL_GROUP_MAX];
    for (int i = 0; i < count; i++) {
        weight_host_new(PD_WFMT_FP8, Ns[i], K, gpu, &host[i], &wc[i], &wg[i]);
        a[i] = pair_new((size_t)n * Ns[i] * 4, NULL);
        b[i] = pair_new((size_t)n * Ns[i] * 4, NULL);
        outs[i] = b[i].g;
        ws[i] = &wg[i];
        snprintf(nb + strlen(nb), sizeof nb - strlen(nb), "%s%lld", i ? "+" : "", (long long)Ns[i]);
    }
    float *x = xmalloc((size_t)n * K * 4);
    fill_f32(x, (size_t)n * K, 1.0f);
    pair_t px = pair_new((size_t)n * K * 4, x);
    const size_t qb = ((size_t)n * K + 255) / 256 * 256, mb = ((size_t)n * 4 + 255) / 256 * 256;
    void *scratch = NULL;
    pair_ok(gpu->ops->alloc(gpu, qb + mb, &scratch));
    uint8_t *sb = scratch;
    float *xs = (float *)(sb + qb);
    cudaStream_t st = backend_cuda_stream(gpu);
    pair_ok(matmul_quant_act_fp8(sb, NULL, xs, px.g, n, K, st));
    matmul_fp8_cluster = S > 1;
    for (int i = 0; i < count; i++)
        pair_ok(S ? matmul_fp8_mma(a[i].g, NULL, sb, xs, &wg[i], n, warps, S, st)
                  : matmul_fp8_ksplit(a[i].g, sb, xs, &wg[i], n, warps, st));
    pair_ok(S ? matmul_fp8_mma_group(outs, sb, xs, ws, count, n, warps, S, st)
              : matmul_fp8_ksplit_group(outs, sb, xs, ws, count, n, warps, st));
    matmul_fp8_cluster = was;
    size_t nd = 0;
    for (int i = 0; i < count; i++)
        nd += dev_bytes_differ(a[i].g, b[i].g, (size_t)n * Ns[i] * 4);
    snprintf(shape, sizeof shape, "fp8 %s group n %d N %s K %lld w%d S %d = one by one seed %llu",
             S ? "mma" : "ksplit", n, nb, (long long)K, warps, S, (unsigned long long)seed);
    report("mm group", shape, (double)nd, 0.0);
    gpu->ops->free(gpu, scratch);
    for (int i = 0; i < count; i++) {
        pair_free(&a[i]);
        pair_free(&b[i]);
        model_host_weight_free(&host[i]);
        backend_weight_free(cpu, &wc[i]);
        backend_weight_free(gpu, &wg[i]);
    }
    pair_free(&px);
    free(x);
    rng_state = saved;
}

/* The whole FP8 decode step (tiny-llama rig, FP8 weights, BF16 KV; matmul_fp8_cluster on in both
 * runs) with option fp8_group off, then on (q, k, v as one launch at n <= 8): err = max |on - off|
 * / max |off| over every step's logits. The group's plan is the one of the summed rows, so its
 * splits (and the f32 order of q / k / v's sums) may differ from the per-weight plans; BF16 KV
 * keeps such last-bit differences small. */
static void case_decode_f8grp(int n, int steps)
{
    char shape[128];
    decode_rig_t rig;
    decode_rig_new(&rig, PD_WFMT_FP8, PD_KV_BF16, n, steps);
    const int was = matmul_fp8_cluster;
    matmul_fp8_cluster = 1; /* both runs: the group needs it for its split plans */
    const double e =
        decode_rig_ab(&rig, "fp8_group=off", "fp8_group=on", "fp8_group=off" /* the default */,
                      NULL, 0, 0);
    matmul_fp8_cluster = was;
    snprintf(shape, sizeof shape, "tiny-llama fp8 kv bf16 n %d steps %d fp8_group on / off", n,
             steps);
    report("decode_f8grp", shape, e, 1e-3);
    decode_rig_free(&rig);
}

/* The FP8 f32 GEMV with 16-byte weight loads (matmul_gemv_fp8_wide, the default since session
 * 25), and two shapes with the 8-byte kernel it replaced, on shapes the backend routes to
 * matmul_gemv (n 1 above 8192 rows, K % 64 != 0 at n <= 8): odd K (a lane's last step partial),
 * rows past a block's, several token tiles; case_matmul_fp8's checks (the per-element bound
 * against the CPU and bit-equality with the f32-input route, which runs the same kernel). Fixed
 * seeds 251... */
static void cases_gemv_wide(void)
{
    const int was = matmul_gemv_fp8_wide, was_ks = matmul_fp8_ksplit_route;
    matmul_gemv_fp8_wide = 1;
    matmul_fp8_ksplit_route = 0; /* n 1 above 8192 rows: the K-split GEMV's since session 26 */
    case_matmul_fp8(3, 200, 400, 251, "gemv wide");
    case_matmul_fp8(1, 9000, 1040, 252, "gemv wide");
    case_matmul_fp8(5, 300, 208, 253, "gemv wide");
    case_matmul_fp8(8, 100, 16, 254, "gemv wide");
    if (!small_only) {
        case_matmul_fp8(1, 28672, 4096, 255, "gemv wide 8B gate_up");
        case_matmul_fp8(2, 4096, 14336 + 16, 256, "gemv wide");
    }
    matmul_gemv_fp8_wide = 0; /* the 8-byte kernel (PD_CUDA_GEMV_WIDE=0) */
    case_matmul_fp8(3, 200, 400, 257, "gemv narrow");
    case_matmul_fp8(1, 9000, 1040, 258, "gemv narrow");
    matmul_gemv_fp8_wide = was;
    matmul_fp8_ksplit_route = was_ks;
}

/* The FP8 K-split mma GEMV (matmul_fp8_ksplit, session 26) through the backend's routes
 * (matmul_fp8_ksplit_route 7: every FP8 matmul at n 1..8 with K % 64 == 0), at both load batches:
 * case_matmul_fp8's checks (the per-element bound against the CPU; bit-equality of the fp8-input
 * and f32-input routes, which both run it). Shapes: rows past the last 16-row tile, fewer
 * 64-column blocks than warps (K 64, 192), warps with unequal block counts and a partial last
 * batch (K 1088, 14400), 1..8 tokens (lanes of tokens past n load nothing), the 8B shapes. Fixed
 * seeds 261... */
static void cases_fp8_ksplit(void)
{
    const int was = matmul_fp8_ksplit_route, wb = matmul_fp8_ksplit_batch;
    matmul_fp8_ksplit_route = 7;
    for (int b = 4; b <= 8; b += 4) {
        matmul_fp8_ksplit_batch = b;
        const uint64_t s0 = b == 4 ? 261 : 281;
        const char *u = b == 4 ? "ksplit u4" : "ksplit u8";
        case_matmul_fp8(1, 200, 384, s0, u);
        case_matmul_fp8(3, 1000, 1024, s0 + 1, u);
        case_matmul_fp8(8, 37, 64, s0 + 2, u);
        case_matmul_fp8(2, 100, 192, s0 + 3, u);
        case_matmul_fp8(1, 9000, 1088, s0 + 4, u);
        case_matmul_fp8(5, 300, 14400, s0 + 5, u);
        case_matmul_fp8(7, 64, 4096, s0 + 6, u);
        if (!small_only) { /* the 8B shapes: q / o, k / v, down, gate_up, down at n 4 */
            case_matmul_fp8(1, 4096, 4096, s0 + 7, u);
            case_matmul_fp8(1, 1024, 4096, s0 + 8, u);
            case_matmul_fp8(1, 4096, 14336, s0 + 9, u);
            case_matmul_fp8(1, 28672, 4096, s0 + 10, u);
            case_matmul_fp8(4, 4096, 14336, s0 + 11, u);
        }
    }
    /* q, k, v in one launch (S 0: the K-split group, load batch 4 / 8) against one by one */
    const int64_t qkv[3] = {512, 128, 128}, odd[3] = {200, 37, 64}, q8b[3] = {4096, 1024, 1024};
    case_fp8_mma_group(1, qkv, 3, 512, 4, 0, 301);
    case_fp8_mma_group(5, odd, 3, 1088, 8, 0, 302);
    case_fp8_mma_group(8, odd, 2, 192, 4, 0, 303);
    if (!small_only)
        case_fp8_mma_group(1, q8b, 3, 4096, 4, 0, 304);
    matmul_fp8_ksplit_route = was;
    matmul_fp8_ksplit_batch = wb;
}

/* The INT4 K-split mma GEMV (matmul_int4_ksplit, session 26) through the backend's routes
 * (matmul_int4_ksplit_route 15: tiled INT4 at n 1..8, q, k, v as one launch), at both load
 * batches: the backend op against the double dot product per element (case_mma_gemm_d's INT4
 * bound) with K of 1 group, 3 (fewer groups than warps), 9 and 20 (unequal groups per warp, a
 * partial last batch), n 1..8; the op matmul_group per element (case_matmul_group route 0);
 * the 8B shapes; load batch 2 again with the group scale after the products
 * (matmul_int4_ksplit_post), and that once more in 16-warp blocks (matmul_int4_ksplit_wide),
 * with the rolled reloads (matmul_int4_ksplit_roll) and with both. Then the tiny-llama INT4 decode
 * step with the route on against off at n 1, 3, 4 and 8, the scale folded (post 0) and after the
 * products (post 1, the default since session 28), and at n 1 and 8 in 16-warp blocks and with
 * the rolled reloads. Fixed seeds 311... */
static void case_decode_i4ksplit(int n, int steps);
static void case_decode_ks_act(int n, int steps);
static void cases_int4_ksplit(void)
{
    const pd_wfmt_t i4 = PD_WFMT_INT4;
    const int was = matmul_int4_ksplit_route, wb = matmul_int4_ksplit_batch;
    const int wp = matmul_int4_ksplit_post;
    const int64_t qkv[3] = {512, 128, 128}, odd[3] = {96, 256, 32}, q8b[3] = {4096, 1024, 1024};
    const int none[4] = {0, 0, 0, 0};
    const int ww = matmul_int4_ksplit_wide, wr = matmul_int4_ksplit_roll;
    /* the variants: load batch, post, 16-warp blocks (matmul_int4_ksplit_wide), rolled reloads
     * (matmul_int4_ksplit_roll); their first seed and label */
    static const struct {
        int batch, post, wide, roll;
        uint64_t s0;
        const char *u;
    } var[] = {{2, 0, 0, 0, 311, "ksplit u2"},
               {4, 0, 0, 0, 331, "ksplit u4"},
               {2, 1, 0, 0, 361, "ksplit u2 post"},
               {2, 1, 1, 0, 381, "ksplit u2 post wide"},
               {2, 1, 0, 1, 401, "ksplit u2 post roll"},
               {2, 1, 1, 1, 421, "ksplit u2 post wide roll"}};
    matmul_int4_ksplit_route = 15;
    for (size_t v = 0; v < sizeof var / sizeof var[0]; v++) {
        matmul_int4_ksplit_batch = var[v].batch;
        matmul_int4_ksplit_post = var[v].post;
        matmul_int4_ksplit_wide = var[v].wide ? 1 << 30 : 0;
        matmul_int4_ksplit_roll = var[v].roll;
        const uint64_t s0 = var[v].s0;
        const char *u = var[v].u;
        case_mma_gemm(i4, 5, 320, 128, 0, 0, s0, u);
        case_mma_gemm(i4, 1, 96, 384, 0, 0, s0 + 1, u);
        case_mma_gemm(i4, 3, 256, 1152, 0, 0, s0 + 2, u);
        case_mma_gemm(i4, 8, 64, 2560, 0, 0, s0 + 3, u);
        case_matmul_group(1, qkv, 3, 512, 0, none, s0 + 4, u);
        case_matmul_group(4, odd, 3, 1152, 0, none, s0 + 5, u);
        if (!small_only) { /* the 8B shapes: down, gate_up, q / k / v */
            case_mma_gemm(i4, 1, 4096, 14336, 0, 0, s0 + 6, u);
            case_mma_gemm(i4, 1, 28672, 4096, 0, 0, s0 + 7, u);
            case_matmul_group(1, q8b, 3, 4096, 0, none, s0 + 8, u);
        }
    }
    matmul_int4_ksplit_route = was;
    matmul_int4_ksplit_batch = wb;
    matmul_int4_ksplit_wide = 0;
    matmul_int4_ksplit_roll = 0;
    for (int post = 0; post <= 1; post++) { /* the whole step, scale folded / after the products */
        matmul_int4_ksplit_post = post;
        case_decode_i4ksplit(1, 3);
        case_decode_i4ksplit(3, 2);
        case_decode_i4ksplit(4, 2);
        case_decode_i4ksplit(8, 2);
    }
    matmul_int4_ksplit_wide = 1 << 30; /* and every launch in 16-warp blocks */
    case_decode_i4ksplit(1, 3);
    case_decode_i4ksplit(8, 2);
    matmul_int4_ksplit_wide = 0;
    matmul_int4_ksplit_roll = 1; /* and with the rolled reloads */
    case_decode_i4ksplit(1, 3);
    case_decode_i4ksplit(8, 2);
    matmul_int4_ksplit_post = wp;
    matmul_int4_ksplit_wide = ww;
    matmul_int4_ksplit_roll = wr;
    case_decode_ks_act(4, 2); /* the fused ops' f16 rows (backend_cuda_ks_act) */
    case_decode_ks_act(8, 2);
}

/* The tiny-llama INT4 + FP8 KV decode step with the K-split GEMV's f16 rows made by the fused
 * add + RMSNorm and SiLU·mul (backend_cuda_ks_act 1, session 28) against their own
 * matmul_quant_act_f16 launches (0), the default routes: the same bytes into the same GEMVs, so
 * the logits are identical (gate 0). */
static void case_decode_ks_act(int n, int steps)
{
    char shape[128];
    decode_rig_t rig;
    decode_rig_new(&rig, PD_WFMT_INT4, PD_KV_FP8, n, steps);
    const double e = decode_rig_ab(&rig, NULL, NULL, NULL, &backend_cuda_ks_act, 0, 1);
    snprintf(shape, sizeof shape, "tiny-llama int4 kv fp8 n %d steps %d ks_act 1 / 0", n, steps);
    report("decode_ks_act", shape, e, 0.0);
    decode_rig_free(&rig);
}

/* The tiny-llama INT4 + FP8 KV decode step with the INT4 K-split GEMV on every route it takes
 * (matmul_int4_ksplit_route 15) against route 0 (the slice GEMV, its q, k, v group everywhere):
 * err = max |on - off| / max |off| over every step's logits. The same f16 products summed in
 * another order (and the activations' f16 rounding of the whole row instead of per slice): gate
 * 1e-2 as case_decode_w4cl's; a layout bug gives O(1). */
static void case_decode_i4ksplit(int n, int steps)
{
    char shape[128];
    decode_rig_t rig;
    decode_rig_new(&rig, PD_WFMT_INT4, PD_KV_FP8, n, steps);
    const double e = decode_rig_ab(&rig, NULL, NULL, NULL, &matmul_int4_ksplit_route, 0, 15);
    snprintf(shape, sizeof shape, "tiny-llama int4 kv fp8 n %d steps %d int4_ksplit 15%s%s%s / 0",
             n, steps, matmul_int4_ksplit_post ? " post" : "",
             matmul_int4_ksplit_wide ? " wide" : "", matmul_int4_ksplit_roll ? " roll" : "");
    report("decode_i4ksplit", shape, e, 1e-2);
    decode_rig_free(&rig);
}

/* The whole FP8 decode step (tiny-llama rig, FP8 weights, BF16 KV: hidden 512, intermediate
 * 1024, so every matmul at n <= 8 qualifies) with the K-split mma GEMV on every route it takes
 * (matmul_fp8_ksplit_route `route`: 7, or 15 with q, k, v as one launch) against the default routes (the FP8 mma kernel with its K splits,
 * the f32 GEMV): err = max |on - off| / max |off| over every step's logits, INFINITY where graphs
 * fell back. The same e4m3 products in the same tensor-core instruction, summed over K in another
 * order (per-warp chains, then warp order, against the split plan's): f32 rounding differences
 * that the rig amplifies as case_decode_w8wg's (gate 2e-2 as there); a layout bug gives O(1). */
static void case_decode_ksplit(int n, int steps, int route)
{
    char shape[128];
    decode_rig_t rig;
    decode_rig_new(&rig, PD_WFMT_FP8, PD_KV_BF16, n, steps);
    const double e = decode_rig_ab(&rig, NULL, NULL, NULL, &matmul_fp8_ksplit_route, 0, route);
    snprintf(shape, sizeof shape, "tiny-llama fp8 kv bf16 n %d steps %d fp8_ksplit %d / 0", n,
             steps, route);
    report("decode_ksplit", shape, e, 2e-2);
    decode_rig_free(&rig);
}

/* The whole FP8 decode step (tiny-llama rig, FP8 weights, BF16 KV) with the bf16-KV attention
 * variant v (attention_tc_bf16: 3-warp blocks and / or hi + lo parts) against variant 0: err =
 * max |v - 0| / max |0| over every step's logits, INFINITY where graphs fell back. The 3-warp
 * blocks alone change only the order the warps' partial sums merge in (gate 2e-3: a flipped
 * bf16 rounding of a later layer's K / V element, 2^-9 of it; measured 0 in session 25, where
 * each warp holds at most one of the rig's tiles). The two parts change each score by ~1e-5
 * relative, and the rig amplifies that like w8wg's accumulator differences (session 25, one
 * H100: 2.5e-4 at n 1, 1.5e-2 at n 64, with per-element attention errors of ~3e-6 on the kernel
 * cases): gate 2e-2 as case_decode_w8wg's; a layout bug gives O(1). */
static void case_decode_abf16(int v, int n, int steps)
{
    char shape[128];
    decode_rig_t rig;
    decode_rig_new(&rig, PD_WFMT_FP8, PD_KV_BF16, n, steps);
    const double e = decode_rig_ab(&rig, NULL, NULL, NULL, &attention_tc_bf16, 0, v);
    snprintf(shape, sizeof shape, "tiny-llama fp8 kv bf16 n %d steps %d attn_bf16 %d / 0", n, steps,
             v);
    report("decode_abf16", shape, e, (v & 2) ? 2e-2 : 2e-3);
    decode_rig_free(&rig);
}

/* matmul_fp8_mma with its K splits added inside clusters (matmul_fp8_cluster, session 22):
 * forced plans of 2..8 splits (rows past N, 6 / 7 / 8 warps, several token tiles, n 1..40), the
 * plan and the backend route at fixture and 8B shapes, and the same bits as the partial sums'
 * launch (fixed seeds 481..). Needs compute capability 9.0 (clusters): elsewhere one failing
 * line. */
static void cases_fp8_cluster(void)
{
    const pd_wfmt_t f8 = PD_WFMT_FP8;
    int cc = 0;
    cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, 0);
    if (cc < 9) {
        report("mma gemm", "fp8 cluster: a device of compute capability 9.0 or more", INFINITY,
               0.0);
        return;
    }
    /* the backend's FP8 route at n <= 8 is the K-split GEMV since session 26: these cases are
     * the FP8 mma kernel's (PD_CUDA_FP8_KSPLIT=0) */
    const int was_ks = matmul_fp8_ksplit_route;
    matmul_fp8_ksplit_route = 0;
    const int was = matmul_fp8_cluster;
    matmul_fp8_cluster = 1;
    case_mma_gemm(f8, 3, 300, 640, 6, 3, 481, "forced");
    case_mma_gemm(f8, 40, 1000, 1152, 8, 2, 482, "forced");
    case_mma_gemm(f8, 8, 512, 2048, 8, 8, 483, "forced");
    case_mma_gemm(f8, 1, 224, 1408, 7, 5, 484, "forced");
    case_mma_gemm(f8, 17, 256, 1024, 8, 4, 485, "forced");
    case_mma_gemm(f8, 1, 200, 384, 0, 0, 486, "op odd N");
    case_mma_gemm(f8, 6, 256, 1024, 0, 0, 487, "op");
    if (!small_only) {
        case_mma_gemm(f8, 1, 4096, 4096, 0, 0, 488, "op 8B o");
        case_mma_gemm(f8, 1, 4096, 14336, 0, 0, 489, "op 8B down");
        case_mma_gemm(f8, 2, 6144, 4096, 6, 4, 490, "forced 8B qkv");
        case_mma_gemm(f8, 8, 1024, 4096, 0, 0, 491, "op 8B k");
    }
    matmul_fp8_cluster = was;
    case_cluster_same(f8, 3, 300, 640, 6, 3, 492);
    case_cluster_same(f8, 8, 512, 2048, 8, 8, 493);
    case_cluster_same(f8, 40, 1000, 1152, 8, 2, 494);
    if (!small_only)
        case_cluster_same(f8, 1, 4096, 14336, 8, 8, 495);
    /* q, k, v as one launch (matmul_fp8_mma_group): rows past N in each segment, 2 / 3 weights,
     * one split and cluster splits; the whole step with option fp8_group */
    const int64_t qkv[3] = {512, 128, 128}, odd[3] = {96, 200, 32}, two[2] = {288, 64};
    const int64_t q8b[3] = {4096, 1024, 1024};
    case_fp8_mma_group(1, qkv, 3, 1024, 8, 1, 496);
    case_fp8_mma_group(3, odd, 3, 640, 6, 3, 497);
    case_fp8_mma_group(8, two, 2, 2048, 7, 8, 498);
    if (!small_only)
        case_fp8_mma_group(1, q8b, 3, 4096, 8, 4, 499);
    case_decode_f8grp(1, 3);
    case_decode_f8grp(4, 3);
    matmul_fp8_ksplit_route = was_ks;
}

/* matmul_w4wg (session 10, wgmma): each configuration forced at fixture shapes (rows past N in
 * the last block, a partial last stage, K splits, n not a multiple of 8, several token tiles per
 * grid), its plan at the 8B shapes (fixed seeds 401..), and the backend route (the default for
 * tiled INT4 at n >= 17 where usable). */
static void cases_w4wg(void)
{
    const pd_wfmt_t i4 = PD_WFMT_INT4;
    mma_wg = 1; /* cfg 0: 256 rows x 64 tokens, 2 groups per stage */
    case_mma_gemm(i4, 17, 256, 1024, 1, 1, 401, "forced");
    case_mma_gemm(i4, 64, 288, 640, 1, 2, 402, "forced");
    case_mma_gemm(i4, 40, 512, 1280, 1, 3, 403, "forced");
    case_mma_gemm(i4, 100, 256, 512, 1, 1, 404, "forced");
    case_mma_gemm(i4, 1, 96, 384, 1, 1, 405, "forced");
    mma_wg = 2; /* cfg 1: 128 x 128 */
    case_mma_gemm(i4, 65, 320, 640, 1, 1, 406, "forced");
    case_mma_gemm(i4, 128, 160, 1024, 1, 2, 407, "forced");
    mma_wg = 3; /* cfg 2: 128 x 256 */
    case_mma_gemm(i4, 129, 256, 768, 1, 1, 408, "forced");
    case_mma_gemm(i4, 256, 224, 1024, 1, 3, 409, "forced");
    case_mma_gemm(i4, 200, 96, 384, 1, 1, 410, "forced");
    mma_wg = -1;
    case_mma_gemm(i4, 48, 1024, 2048, 1, 1, 411, "plan");
    if (!small_only) {
        case_mma_gemm(i4, 64, 28672, 4096, 1, 1, 412, "plan 8B gate_up");
        case_mma_gemm(i4, 64, 4096, 14336, 1, 1, 413, "plan 8B down");
        case_mma_gemm(i4, 64, 6144, 4096, 1, 1, 414, "plan 8B qkv");
        case_mma_gemm(i4, 64, 4096, 4096, 1, 1, 415, "plan 8B o");
        case_mma_gemm(i4, 33, 6144, 4096, 1, 1, 416, "plan 8B qkv");
        case_mma_gemm(i4, 128, 4096, 4096, 1, 1, 417, "plan 8B o");
        case_mma_gemm(i4, 256, 4096, 14336, 1, 1, 418, "plan 8B down");
    }
    mma_wg = 0;
    /* activations past the f16 range: the per-token power-of-two scaling */
    mma_x_scale = 65536.0f;
    mma_wg = 1;
    case_mma_gemm(i4, 24, 256, 1024, 1, 2, 419, "|x| ~ 2^16");
    mma_wg = 0;
    mma_x_scale = 1.0f;
    /* the backend route (default for tiled INT4 at n 17..256) */
    case_mma_gemm(i4, 48, 1024, 2048, 0, 0, 420, "default op n 48");
    case_mma_gemm(i4, 177, 512, 1024, 0, 0, 421, "default op n 177");

    /* session 22: the K splits added inside thread-block clusters (2..8 blocks; rows past N,
     * several token tiles, n not a multiple of 8, unequal splits), its plan, the same bits as
     * the partial sums' second launch, and the whole decode step with option w4wg_cluster */
    mma_wg_cl = true;
    mma_wg = 1;
    case_mma_gemm(i4, 17, 256, 2048, 1, 8, 451, "forced");
    case_mma_gemm(i4, 64, 288, 640, 1, 2, 452, "forced");
    case_mma_gemm(i4, 40, 512, 1280, 1, 3, 453, "forced");
    case_mma_gemm(i4, 100, 256, 1664, 1, 5, 454, "forced");
    case_mma_gemm(i4, 3, 96, 896, 1, 7, 455, "forced");
    mma_wg = 2;
    case_mma_gemm(i4, 65, 320, 640, 1, 3, 456, "forced");
    case_mma_gemm(i4, 128, 160, 1024, 1, 4, 457, "forced");
    mma_wg = 3;
    case_mma_gemm(i4, 256, 224, 1024, 1, 3, 458, "forced");
    case_mma_gemm(i4, 200, 96, 384, 1, 2, 459, "forced");
    mma_wg = -1;
    case_mma_gemm(i4, 48, 1024, 2048, 1, 1, 460, "plan");
    if (!small_only) {
        case_mma_gemm(i4, 64, 28672, 4096, 1, 1, 461, "plan 8B gate_up");
        case_mma_gemm(i4, 64, 4096, 14336, 1, 1, 462, "plan 8B down");
        case_mma_gemm(i4, 64, 6144, 4096, 1, 1, 463, "plan 8B qkv");
        case_mma_gemm(i4, 64, 4096, 4096, 1, 1, 464, "plan 8B o");
        case_mma_gemm(i4, 256, 4096, 14336, 1, 1, 465, "plan 8B down");
    }
    mma_wg = 0;
    mma_wg_cl = false;
    case_cluster_same(i4, 64, 288, 2048, 0, 8, 466);
    case_cluster_same(i4, 100, 256, 1664, 0, 5, 467);
    case_cluster_same(i4, 130, 320, 1024, 1, 4, 468);
    case_cluster_same(i4, 256, 224, 1024, 2, 3, 469);
    if (!small_only)
        case_cluster_same(i4, 64, 4096, 14336, 0, 8, 470);
    case_decode_w4cl(32, 3);
    case_decode_w4cl(64, 2);
}

/* matmul_int4_mma2 (session 6): forced plans at fixture shapes (token tiles 1..8, 4 / 8 warps,
 * splits, rows past N in the last block, n not a multiple of 8) and its plan at the 8B shapes
 * (fixed seeds 301..). The split sizes need more than one sizing pass: the per-split partial
 * sums are checked with the rest. */
static void cases_int4_mma2(void)
{
    const pd_wfmt_t i4 = PD_WFMT_INT4;
    mma_tiles2 = 1;
    case_mma_gemm(i4, 9, 256, 1024, 8, 1, 301, "forced");
    mma_tiles2 = 2;
    case_mma_gemm(i4, 16, 320, 640, 4, 2, 302, "forced");
    case_mma_gemm(i4, 23, 288, 1280, 8, 3, 303, "forced");
    mma_tiles2 = 4;
    case_mma_gemm(i4, 33, 512, 1024, 8, 1, 304, "forced");
    case_mma_gemm(i4, 64, 224, 768, 4, 2, 305, "forced");
    mma_tiles2 = 8;
    case_mma_gemm(i4, 64, 512, 1024, 8, 1, 306, "forced");
    case_mma_gemm(i4, 130, 320, 640, 8, 2, 307, "forced");
    mma_tiles2 = -1;
    case_mma_gemm(i4, 40, 1024, 2048, 1, 1, 308, "plan");
    if (!small_only) {
        case_mma_gemm(i4, 9, 28672, 4096, 1, 1, 311, "plan 8B gate_up");
        case_mma_gemm(i4, 16, 6144, 4096, 1, 1, 312, "plan 8B qkv");
        case_mma_gemm(i4, 33, 4096, 14336, 1, 1, 313, "plan 8B down");
        case_mma_gemm(i4, 64, 28672, 4096, 1, 1, 314, "plan 8B gate_up");
        case_mma_gemm(i4, 64, 4096, 14336, 1, 1, 315, "plan 8B down");
        case_mma_gemm(i4, 128, 4096, 4096, 1, 1, 316, "plan 8B o");
        case_mma_gemm(i4, 256, 4096, 14336, 1, 1, 317, "plan 8B down");
        case_mma_gemm(i4, 256, 6144, 4096, 1, 1, 318, "plan 8B qkv");
        mma_tiles2 = 8;
        case_mma_gemm(i4, 64, 28672, 4096, 8, 2, 319, "forced 8B gate_up");
    }
    mma_tiles2 = 0;
    /* the backend route (PD_CUDA_INT4_MMA2=1 on a second backend) */
    setenv("PD_CUDA_INT4_MMA2", "1", 1);
    pd_backend_t *keep = gpu;
    if (backend_cuda_create(0, &gpu) == PD_OK) {
        case_mma_gemm(i4, 48, 1024, 2048, 0, 0, 320, "PD_CUDA_INT4_MMA2=1 op");
        backend_destroy(gpu);
    }
    gpu = keep;
    unsetenv("PD_CUDA_INT4_MMA2");
}

/* The MoE expert cases: experts through the backend, grouping, the grouped path (moe_gmm or
 * moe_gmm2, the backend's choice) and both grouped kernels side by side. */
static void cases_moe(void)
{
    case_moe_experts(PD_WFMT_BF16, 37, 8, 2, 512, 128);
    case_moe_experts(PD_WFMT_FP8, 37, 8, 2, 512, 128);
    case_moe_experts(PD_WFMT_INT4, 37, 8, 2, 512, 128);
    case_moe_experts(PD_WFMT_BF16, 1, 8, 2, 512, 128);
    /* the grouping, exact */
    case_moe_group(37 * 2, 8);
    case_moe_group(1 * 8, 128);
    case_moe_group(64 * 8, 128);
    case_moe_group(MOE_GROUP_MAX_M, 1024);
    case_moe_group(33, 1000); /* a partial last warp of slots, experts not a multiple of 32 */
    {
        const pd_wfmt_t mf[] = {PD_WFMT_BF16, PD_WFMT_FP8, PD_WFMT_INT4};
        for (int i = 0; i < 3; i++) {
            case_moe_grouped(mf[i], 37, 8, 2, 512, 128, "tiny-moe");
            case_moe_grouped(mf[i], 1, 8, 2, 512, 128, "tiny-moe");
            if (!small_only) /* Qwen3-30B-A3B's expert shape, 16 of its 128 experts */
                case_moe_grouped(mf[i], 64, 16, 8, 2048, 768, "qwen3-30b");
        }
    }
    {
        /* moe_gmm, moe_gmm2, moe_gmm3 at fixed seeds 301..: empty experts, loads 1, 9 and 40 */
        const pd_wfmt_t mf[] = {PD_WFMT_BF16, PD_WFMT_FP8, PD_WFMT_INT4};
        const int tiny[8] = {0, 1, 9, 40, 0, 46, 0, 0}; /* n 48, k 2 */
        const int qwen[16] = {0, 1, 9, 40, 0, 64, 64, 64, 64, 64, 64, 64, 14, 0, 0, 0}; /* 64 x 8 */
        const int qwen4[16] = {0, 1, 4, 4, 0, 4, 4, 4, 4, 4, 2, 1, 0, 0, 0, 0};         /* 4 x 8 */
        for (int i = 0; i < 3; i++) {
            case_moe_gmm2(mf[i], 48, 8, 2, 512, 128, tiny, 301 + (uint64_t)i, "tiny-moe");
            if (mf[i] != PD_WFMT_INT4) /* N 288 / 528: not multiples of 64 rows per block */
                case_moe_gmm2(mf[i], 48, 8, 2, 528, 144, tiny, 311 + (uint64_t)i, "ragged");
            if (!small_only) /* Qwen3-30B-A3B's expert shape: 64 KB of staged x for gate_up */
                case_moe_gmm2(mf[i], 64, 16, 8, 2048, 768, qwen, 321 + (uint64_t)i, "qwen3-30b");
            if (!small_only) /* the same at decode loads (moe_gmm3: one n8 tile per pass) */
                case_moe_gmm2(mf[i], 4, 16, 8, 2048, 768, qwen4, 331 + (uint64_t)i, "qwen3-30b");
        }
        /* moe_gmm3's edges: FP8 K 576 (64 mod 128: the other pitch rounding), N 320 / 576 (a
         * block's last warps past N), K 160 (not a multiple of 64: moe_gmm2 instead); INT4 odd
         * group counts (5 and 3: the second register ring idle at the end) */
        case_moe_gmm2(PD_WFMT_FP8, 48, 8, 2, 576, 160, tiny, 341, "edges");
        case_moe_gmm2(PD_WFMT_INT4, 48, 8, 2, 640, 384, tiny, 342, "edges");
        /* 4 experts for 96 rows (24 per expert on average: moe_gmm3 takes 32 rows per pass) */
        const int four[4] = {40, 9, 1, 46};
        case_moe_gmm2(PD_WFMT_FP8, 48, 4, 2, 512, 128, four, 343, "wide");
        case_moe_gmm2(PD_WFMT_INT4, 48, 4, 2, 512, 128, four, 344, "wide");
    }
}

/* The summary line; the backends destroyed; main's exit code (1 when a case failed). */
static int finish(void)
{
    printf("%d cases, %d failed\n", n_cases, n_fail);
    backend_destroy(gpu_split);
    backend_destroy(gpu);
    backend_destroy(cpu);
    return n_fail ? 1 : 0;
}

/* every sampling case, on the sampler path sample_bucket selects */
static void cases_sample_path(void)
{
    case_sample(37, 2048, 4.0f, 0.0f, 0, 1.0f, 0.0);
    case_sample(37, 2048, 4.0f, 0.7f, 1, 1.0f, 0.0);
    case_sample(37, 2048, 2.0f, 0.8f, 50, 1.0f, 0.02);
    case_sample(37, 2048, 2.0f, 1.0f, 0, 0.9f, 0.02);
    /* session 12: greedy rows split across blocks (31 slices of a 128k vocabulary at one row, 7
     * at five), twice in a row (the scratch re-zeroed by each launch), unsplit, and a batch of
     * greedy and sampled rows together */
    case_sample(1, 128256, 4.0f, 0.0f, 0, 1.0f, 0.0);
    case_sample(1, 128256, 4.0f, 0.0f, 0, 1.0f, 0.0);
    case_sample(5, 32000, 4.0f, 0.0f, 0, 1.0f, 0.0);
    sample_split = 0;
    case_sample(5, 32000, 4.0f, 0.0f, 0, 1.0f, 0.0);
    sample_split = 1;
    case_sample_rows(9, 32000, 2.0f, 0.8f, 50, 0.95f, 0.12, true);
    if (!small_only) {
        case_sample(64, 128256, 4.0f, 0.0f, 0, 1.0f, 0.0);
        case_sample(64, 128256, 2.0f, 0.8f, 40, 0.95f, 0.02);
        case_sample(64, 128256, 1.0f, 1.0f, 2048, 1.0f, 0.02);
        case_sample(64, 128256, 3.0f, 0.6f, 1000, 0.9f, 0.02);
        /* session 20: the K-th largest key by bucket refinement (three histogram passes). Top-k
         * off on a 128k row: K = 2048, the device's candidates; the reference samples the whole
         * row, so T is low enough that the mass past the 2048 largest is below float rounding.
         * A row length that is not a multiple of 4 (the rows unaligned: scalar loads), a
         * vocabulary below 2048 (every token a candidate), and logits on 8 levels per unit:
         * ~1000 ties at the top key, the K-th largest among them (t found when the range
         * closes on one key; all of them fit the 2048 slots, so the lowest ids win as on the
         * CPU). */
        case_sample(64, 128256, 4.0f, 0.005f, 0, 0.9f, 0.02);
        case_sample(64, 32003, 2.0f, 0.8f, 100, 0.95f, 0.02);
        case_sample(64, 1000, 2.0f, 1.0f, 0, 0.95f, 0.02);
        sample_levels = 32;
        case_sample(64, 128256, 4.0f, 1.0f, 50, 1.0f, 0.02);
        case_sample(64, 128256, 4.0f, 1.0f, 800, 0.8937f, 0.02); /* 714.96 of 800 equal */
        sample_levels = 0;
    }
    case_logprobs(37, 2048, 4.0f);
    case_logprobs(12, 5, 1.0f); /* vocab below n_top: clamped */
    if (!small_only)
        case_logprobs(64, 128256, 6.0f);
    /* session 20: ties at the n_top-th largest: ~1000 at the top of a 128k row (the bucket
     * path's 2048 slots hold them all), three quarters of a row of -0 and +0 (the reference
     * holds them equal: the lowest ids win whatever the sign; at 128k more than the slots, so
     * the bucket path falls back to the rounds) */
    sample_levels = 32;
    if (!small_only)
        case_logprobs(16, 128256, 4.0f);
    sample_levels = 1;
    case_logprobs(37, 2048, 4.0f);
    if (!small_only)
        case_logprobs(16, 128256, 4.0f);
    sample_levels = 0;
}

/* the sampling cases on both paths: the bisection (sample_bucket = 0, PD_CUDA_SAMPLE_BUCKET=0)
 * and session 20's bucket refinement (the default since session 21) */
static void cases_sample(void)
{
    const int was = sample_bucket;
    for (int b = 0; b <= 1; b++) {
        sample_bucket = b;
        cases_sample_path();
    }
    sample_bucket = was; /* -1: the default, read again at the next launch */
}

int main(void)
{
    const char *seed_env = getenv("PD_TEST_SEED");
    pd_status_t st;

    unsetenv("PD_CUDA_BF16_GEMM"); /* gpu: the defaults (one bf16 GEMM, flash attention) */
    unsetenv("PD_CUDA_FLASH");
    unsetenv("PD_CUDA_FLASH_VARIANT");
    unsetenv("PD_CUDA_FUSED");
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device visible: GPU tests skipped\n");
        return 77; /* meson: SKIP (CI machines have no GPU; .ci/run reports it as skipped) */
    }
    if ((st = backend_cuda_create(0, &gpu)) != PD_OK) {
        /* a device is there but the backend cannot start: that is a failure, not a skip */
        printf("%d CUDA device(s) visible but the CUDA backend does not start: %s\n", n_dev,
               pd_status_str(st));
        return 1;
    }
    setenv("PD_CUDA_BF16_GEMM", "split", 1);
    pair_ok(backend_cuda_create(0, &gpu_split));
    unsetenv("PD_CUDA_BF16_GEMM");
    pair_ok(backend_cpu_create(0, &cpu));
    rng_state = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL) * 2654435761u;
    if (!rng_state)
        rng_state = 1;
    small_only = getenv("PD_GPU_TEST_SMALL") && atoi(getenv("PD_GPU_TEST_SMALL"));
    printf("seed %llu (PD_TEST_SEED to repeat)%s\n", (unsigned long long)rng_state,
           small_only ? ", fixture shapes only" : "");
    printf("%-12s %-44s %11s %9s  %s\n", "op", "shape", "max err", "tol", "result");
    if (getenv("PD_GPU_TEST_XGEMV") && atoi(getenv("PD_GPU_TEST_XGEMV"))) {
        cases_xgemv(true);
        return finish();
    }
    if (getenv("PD_GPU_TEST_PDL") && atoi(getenv("PD_GPU_TEST_PDL"))) {
        /* the whole decode step with pdl on / off / eager alone (quick device rounds) */
        case_decode_pdl(PD_WFMT_INT4, PD_KV_FP8, 1, 4);
        case_decode_pdl(PD_WFMT_INT4, PD_KV_FP8, 3, 3);
        case_decode_pdl(PD_WFMT_FP8, PD_KV_BF16, 1, 4);
        return finish();
    }
    if (getenv("PD_GPU_TEST_MATMUL") && atoi(getenv("PD_GPU_TEST_MATMUL"))) {
        /* the matmul cases alone (quick device rounds on the weight kernels) */
        cases_matmul();
        return finish();
    }
    if (getenv("PD_GPU_TEST_PREFILL") && atoi(getenv("PD_GPU_TEST_PREFILL"))) {
        /* the prefill FP8 MLP op and FP8 GEMM cases alone (quick device rounds) */
        cases_matmul_silu();
        cases_rope_write_bf16();
        case_matmul_fp8(37, 2048, 512, 223, "fixture gemm");
        case_backend_options();
        if (!small_only) {
            case_matmul_fp8(512, 14336, 4096, 227, "8B gate gemm");
            case_matmul_fp8(512, 4096, 14336, 228, "8B down gemm");
        }
        return finish();
    }
    if (getenv("PD_GPU_TEST_MOE") && atoi(getenv("PD_GPU_TEST_MOE"))) {
        /* the MoE cases alone (quick device rounds; PD_GPU_TEST_SMALL=1 drops the Qwen shapes) */
        cases_moe();
        return finish();
    }
    if (getenv("PD_GPU_TEST_SAMPLE") && atoi(getenv("PD_GPU_TEST_SAMPLE"))) {
        cases_sample(); /* the sampling cases alone (quick device rounds) */
        return finish();
    }
    if (getenv("PD_GPU_TEST_W8WG") && atoi(getenv("PD_GPU_TEST_W8WG"))) {
        cases_w8wg(); /* the matmul_w8wg cases alone (quick device rounds) */
        return finish();
    }
    if (getenv("PD_GPU_TEST_FP8CL") && atoi(getenv("PD_GPU_TEST_FP8CL"))) {
        cases_fp8_cluster(); /* matmul_fp8_mma's cluster splits alone (quick device rounds) */
        return finish();
    }
    if (getenv("PD_GPU_TEST_W4WG") && atoi(getenv("PD_GPU_TEST_W4WG"))) {
        cases_w4wg(); /* the matmul_w4wg and grouped matmul cases alone (quick device rounds) */
        cases_matmul_group();
        cases_act_f16wg();
        return finish();
    }
    if (getenv("PD_GPU_TEST_FUSED") && atoi(getenv("PD_GPU_TEST_FUSED"))) {
        cases_mm_fused(); /* the slice GEMV with the small ops folded in (quick device rounds) */
        case_decode_fuse(1, 5);
        case_decode_fuse(3, 4);
        case_decode_fuse(4, 3);
        return finish();
    }
    if (getenv("PD_GPU_TEST_MMA2") && atoi(getenv("PD_GPU_TEST_MMA2"))) {
        /* the matmul_int4_mma2 cases alone (quick device rounds) */
        cases_int4_mma2();
        return finish();
    }
    if (getenv("PD_GPU_TEST_FLASH") && atoi(getenv("PD_GPU_TEST_FLASH"))) {
        /* the prefill (flash) attention cases alone (quick device rounds) */
        cases_flash(PD_KV_BF16);
        cases_flash(PD_KV_FP8);
        return finish();
    }
    if (getenv("PD_GPU_TEST_FAMILY") && atoi(getenv("PD_GPU_TEST_FAMILY"))) {
        /* the GLM-4.5 / DeepSeek-V3 cases alone (family ops, FP8 block-scaled matmul), and
         * their decode steps in graphs on the tiny-glm / tiny-dsv3 fixtures (only here: the
         * full run's rounds carry tiny-llama / tiny-moe) */
        cases_family();
        cases_family_graphs();
        return finish();
    }
    if (getenv("PD_GPU_TEST_KV") && atoi(getenv("PD_GPU_TEST_KV"))) {
        /* the KV export cases alone (quick device rounds of the transfer path) */
        case_kv_export(PD_KV_BF16, 4, 2, 128, 20, 7);
        case_kv_export(PD_KV_BF16, 32, 8, 128, 8, 3);
        case_xfer_kv_export(4, 2, 128, 20, 7);
        case_xfer_kv_export(32, 8, 128, 16, 6);
        case_page_digest(64, 40, PD_KV_FP8);
        case_page_digest(600, 512, PD_KV_BF16);
        return finish();
    }
    if (getenv("PD_GPU_TEST_GEMVW") && atoi(getenv("PD_GPU_TEST_GEMVW"))) {
        cases_gemv_wide(); /* the FP8 GEMV's 16-byte loads alone (quick device rounds) */
        return finish();
    }
    if (getenv("PD_GPU_TEST_KSPLIT") && atoi(getenv("PD_GPU_TEST_KSPLIT"))) {
        cases_fp8_ksplit(); /* the FP8 / INT4 K-split mma GEMVs alone (quick device rounds) */
        cases_int4_ksplit();
        cases_act_f16wg(); /* among them the K-split's f16 rows from the fused ops */
        case_decode_ksplit(1, 3, 7);
        case_decode_ksplit(1, 3, 15);
        case_decode_ksplit(8, 2, 15);
        return finish();
    }
    if (getenv("PD_GPU_TEST_SILU") && atoi(getenv("PD_GPU_TEST_SILU"))) {
        cases_silu_mul_fp8(); /* the SiLU·mul + FP8 quantization cases alone (quick rounds) */
        return finish();
    }
    if (getenv("PD_GPU_TEST_ATTN") && atoi(getenv("PD_GPU_TEST_ATTN"))) {
        /* the decode attention and fused RoPE + KV write cases alone (quick device rounds) */
        const pd_kvfmt_t fs[] = {PD_KV_BF16, PD_KV_FP8, PD_KV_F32};
        for (int f = 0; f < 3; f++)
            case_rope_kv_write(fs[f], 32, 8, 128, 64, 321 + (uint64_t)f);
        cases_attention_tc();
        for (int v = 1; v < 4; v++) {
            case_decode_abf16(v, 1, 3);
            case_decode_abf16(v, 64, 2);
        }
        return finish();
    }

    case_embed(2048, 512, 37);
    if (!small_only)
        case_embed(8192, 4096, 64);
    case_rmsnorm(37, 512, false);
    if (!small_only)
        case_rmsnorm(64, 4096, true);
    case_rmsnorm(37 * 4, 128, true); /* q-norm shape */
    case_add(37 * 512);
    if (!small_only)
        case_add((size_t)64 * 4096 + 3);
    case_rope(37, 4, 128, 2048);
    case_rope(5, 12, 64, 4096); /* heads not a multiple of the kernel's 8 per block, hd 64 */
    case_rope(3, 3, 512, 100);  /* half > block: the frequency loop */
    if (!small_only)
        case_rope(64, 32, 128, 8192);
    case_silu_mul(37, 1024);
    if (!small_only)
        case_silu_mul(64, 14336);

    case_backend_options();
    /* fused ops (fixed seeds 201..): register kernels, the any-length kernel, odd lengths */
    case_add_rmsnorm(37, 512, true, true, true, false, 201);
    case_add_rmsnorm(37, 512, true, true, true, true, 202);
    case_add_rmsnorm(37, 512, false, true, false, false, 203);
    case_add_rmsnorm(5, 300, true, true, true, false, 204); /* d % 4 != 0: any-length kernel */
    case_add_rmsnorm(3, 512, true, false, true, false, 205);
    cases_silu_mul_fp8();
    {
        const int was_ks = matmul_fp8_ksplit_route; /* the FP8 mma kernel (PD_CUDA_FP8_KSPLIT=0) */
        matmul_fp8_ksplit_route = 0;
        case_matmul_fp8(1, 200, 384, 221, "fixture mma");
        matmul_fp8_ksplit_route = was_ks;
    }
    case_matmul_fp8(3, 200, 400, 222, "gemv");
    case_matmul_fp8(37, 2048, 512, 223, "fixture gemm");
    cases_gemv_wide();
    cases_fp8_ksplit();
    case_decode_ksplit(1, 3, 7);
    case_decode_ksplit(1, 3, 15);
    case_decode_ksplit(8, 2, 15);
    cases_int4_ksplit();
    /* the W4A8 blk activations: n a multiple of 16, n % 16 != 0 (tail group), n < 16 */
    case_add_rmsnorm_blk(37, 512, false, 231);
    case_add_rmsnorm_blk(37, 512, true, 232);
    case_add_rmsnorm_blk(32, 1024, false, 233);
    case_add_rmsnorm_blk(5, 256, false, 234);
    case_silu_mul_blk(37, 1024, 235);
    case_silu_mul_blk(5, 384, 236);
    case_silu_mul_blk(48, 256, 237);
    case_matmul_fp8_blk(300, 512, 640, 238, "tiled");
    case_matmul_fp8_blk(272, 528, 384, 239, "plain");
    case_matmul_silu_blk(300, 256, 512, 240);
    case_matmul_silu_blk(264, 384, 256, 241);
    cases_matmul_silu();
    cases_rope_write_bf16();
    if (!small_only) {
        case_add_rmsnorm(64, 4096, true, true, true, false, 206);
        case_add_rmsnorm(300, 4096, true, false, true, false, 207);
        case_add_rmsnorm(2, 12288, true, true, true, false, 208); /* > 8192: any-length kernel */
        case_add_rmsnorm_blk(300, 4096, false, 242);
        case_add_rmsnorm_blk(2, 16384, false, 243); /* > 8192: any-length kernel */
        case_silu_mul_blk(300, 14336, 244);
        case_matmul_fp8_blk(513, 4096, 14336, 245, "8B down");
        case_matmul_silu_blk(512, 14336, 4096, 246);
        case_matmul_fp8(1, 28672, 4096, 224, "8B gate_up gemv");
        case_matmul_fp8(8, 4096, 14336, 225, "8B down mma");
        case_matmul_fp8(64, 6144, 4096, 226, "8B qkv gemm");
        case_matmul_fp8(512, 14336, 4096, 227, "8B gate gemm");
        case_matmul_fp8(512, 4096, 14336, 228, "8B down gemm");
    }

    cases_matmul();

    const pd_kvfmt_t kfs[] = {PD_KV_BF16, PD_KV_FP8, PD_KV_F32};
    for (int f = 0; f < 3; f++) {
        case_kv_write(kfs[f], 2, 128, 37);
        if (!small_only)
            case_kv_write(kfs[f], 8, 128, 64);
    }
    for (int f = 0; f < 3; f++) {
        case_rope_kv_write(kfs[f], 4, 2, 128, 37, 301 + (uint64_t)f);
        case_rope_kv_write(kfs[f], 8, 8, 64, 5, 311 + (uint64_t)f);
        /* session 12's warp-per-head kernel at its other pair counts: 4 per lane (head_dim
         * 256) and a half that is not a multiple of 32 (96: lanes 16..31 idle in the 2nd) */
        case_rope_kv_write(kfs[f], 4, 1, 256, 9, 331 + (uint64_t)f);
        case_rope_kv_write(kfs[f], 6, 3, 96, 7, 341 + (uint64_t)f);
        if (!small_only)
            case_rope_kv_write(kfs[f], 32, 8, 128, 64, 321 + (uint64_t)f);
    }
    for (int f = 0; f < 3; f++) {
        const int pq[] = {37, 64}, pc[] = {37, 100};
        case_attention(kfs[f], 4, 2, 128, 2, pq, pc, true, "prefill");
        const int dq[] = {1, 1, 1, 1, 1}, dc[] = {1, 17, 300, 64, 999};
        case_attention(kfs[f], 4, 2, 128, 5, dq, dc, f != 1, "decode");
        const int q1[] = {1}, c1[] = {1024};
        if (!small_only)
            case_attention(kfs[f], 32, 8, 128, 1, q1, c1, true, "8B decode b1");
        int q64[64], c64[64];
        for (int i = 0; i < 64; i++) {
            q64[i] = 1;
            c64[i] = 1024 - (i % 7) * 3;
        }
        if (!small_only)
            case_attention(kfs[f], 32, 8, 128, 64, q64, c64, true, "8B decode b64");
        /* the generic kernel: group 8, and head_dim 64 */
        case_attention(kfs[f], 16, 2, 128, 5, dq, dc, true, "group 8");
        case_attention(kfs[f], 4, 2, 64, 2, pq, pc, true, "hd 64 prefill");
        const int qm[] = {3, 1, 200}, cm[] = {50, 700, 200};
        if (!small_only)
            case_attention(kfs[f], 32, 8, 128, 3, qm, cm, true, "8B mixed");
        cases_flash(kfs[f]);
    }
    cases_attention_tc();
    case_decode_abf16(3, 4, 3); /* the bf16-KV attention variants in a whole step */
    case_moe_route(37, 8, 2, true);
    if (!small_only)
        case_moe_route(64, 128, 8, false);
    cases_moe();
    case_kv_tags(64, 40);
    case_page_digest(64, 40, PD_KV_FP8);
    case_page_digest(64, 33, PD_KV_F32);
    if (!small_only)
        case_kv_tags(5000, 4096);
    case_kv_export(PD_KV_BF16, 4, 2, 128, 20, 7);
    case_kv_export(PD_KV_F32, 4, 2, 128, 20, 7);
    if (!small_only)
        case_kv_export(PD_KV_BF16, 32, 8, 128, 8, 3);
    case_xfer_kv_export(4, 2, 128, 20, 7);
    if (!small_only)
        case_xfer_kv_export(32, 8, 128, 16, 6);

    cases_sample();
    case_logits_process(7, 2048, 300);
    if (!small_only)
        case_logits_process(64, 128256, 2000);
    case_forward_sample(5, 6);
    if (!small_only)
        case_forward_sample(64, 3);
    case_decode_pdl(PD_WFMT_INT4, PD_KV_FP8, 1, 4);
    case_decode_pdl(PD_WFMT_INT4, PD_KV_FP8, 3, 3);
    case_decode_pdl(PD_WFMT_FP8, PD_KV_BF16, 1, 4);
    case_decode_fuse(1, 5);
    case_decode_fuse(3, 4);
    cases_family();
    return finish();
}
