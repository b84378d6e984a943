/* The CPU backend: plain C reference implementations of every op (the oracle for the CUDA
 * kernels), parallelized over output rows with a thread pool. Every output element is computed
 * by one thread in a fixed order, so results do not depend on the number of threads. */
#include <pthread.h>
#include <stdatomic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_digest.h"
#include "backend.h"
#include "backend_cpu_family.h"
#include "dtype.h"
#include "log.h"
#include "sampler.h"
#include "threadpool.h"

typedef struct {
    threadpool_t *pool;
    float fp8_lut[256];
    /* The sticky error of the ops (void, like kernel launches): the first scratch allocation
     * that fails sets it (pool threads too), the op stops, and the next sync or download
     * returns it and clears it, as a CUDA stream reports a failed launch. Its outputs are then
     * garbage; index outputs (moe ids, sampled tokens) are zeroed so later ops stay in bounds. */
    atomic_int err;
    pd_status_t xfer_err; /* the transfer ops' first failure (xfer_sync returns it) */
} cpu_t;

static cpu_t *cpu__get(pd_backend_t *be)
{
    return be->impl;
}

threadpool_t *backend_cpu__pool(pd_backend_t *be)
{
    return cpu__get(be)->pool;
}

/* Scratch of an op: malloc, or NULL after setting the sticky error (logged once per error). The
 * error is the one field ops write, hence the cast for the helpers given a const cpu_t. */
static void *cpu__scratch(const cpu_t *c, size_t bytes, const char *op)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        int none = PD_OK;
        if (atomic_compare_exchange_strong(&((cpu_t *)c)->err, &none, PD_ERR_NOMEM))
            pd_log_error("cpu backend: %s: no memory for %zu bytes of scratch: the op fails", op,
                         bytes);
    }
    return p;
}

/* The sticky error, cleared (PD_OK when none). */
static pd_status_t cpu__take_error(cpu_t *c)
{
    return (pd_status_t)atomic_exchange(&c->err, PD_OK);
}

/* ==== memory ==== */

static pd_status_t cpu_alloc(pd_backend_t *be, size_t bytes, void **ptr_p)
{
    void *p;
    (void)be;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return PD_ERR_NOMEM;
    *ptr_p = p;
    return PD_OK;
}

static void cpu_free(pd_backend_t *be, void *ptr)
{
    (void)be;
    free(ptr);
}

static pd_status_t cpu_copy(pd_backend_t *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes)
        memmove(dst, src, bytes);
    return PD_OK;
}

static pd_status_t cpu_memset(pd_backend_t *be, void *dst, int value, size_t bytes)
{
    (void)be;
    memset(dst, value, bytes);
    return PD_OK;
}

static pd_status_t cpu_sync(pd_backend_t *be)
{
    return cpu__take_error(cpu__get(be));
}

/* A download waits for the ops before it: it reports their sticky error (and copies anyway). */
static pd_status_t cpu_download(pd_backend_t *be, void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memmove(dst, src, bytes);
    return cpu__take_error(cpu__get(be));
}

/* ==== elementwise ==== */

static void cpu_embed(pd_backend_t *be, float *out, const uint16_t *table, const int32_t *ids,
                      int n, int d)
{
    (void)be;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++)
            out[(size_t)i * d + j] = pd_bf16_to_f32(table[(size_t)ids[i] * d + j]);
}

static void cpu_rmsnorm(pd_backend_t *be, float *out, const float *x, const uint16_t *w, int n,
                        int d, float eps)
{
    (void)be;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * d;
        float *oi = out + (size_t)i * d;
        float ss = 0.0f;
        for (int j = 0; j < d; j++)
            ss += xi[j] * xi[j];
        float inv = 1.0f / sqrtf(ss / (float)d + eps);
        for (int j = 0; j < d; j++)
            oi[j] = (xi[j] * inv) * pd_bf16_to_f32(w[j]);
    }
}

static void cpu_add(pd_backend_t *be, float *x, const float *y, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

static void cpu_rope(pd_backend_t *be, float *x, const int32_t *pos, const float *inv_freq, int n,
                     int n_heads, int head_dim)
{
    const int half = head_dim / 2;
    (void)be;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < half; j++) {
            float ang = (float)pos[i] * inv_freq[j];
            float c = cosf(ang), s = sinf(ang);
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((size_t)i * n_heads + h) * head_dim;
                float a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = b * c + a * s;
            }
        }
    }
}

static void cpu_silu_mul(pd_backend_t *be, float *out, const float *gu, int n, int f)
{
    (void)be;
    for (int i = 0; i < n; i++) {
        const float *g = gu + (size_t)i * 2 * f, *u = g + f;
        for (int j = 0; j < f; j++)
            out[(size_t)i * f + j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

/* ==== matmul ==== */

/* 8 f32 lanes (GCC / Clang vector extension): lane j sums the elements j mod 8, in order. The
 * build is ISO C (-std=c11), so no multiply-add is contracted: results are those of the scalar
 * loop "acc[j] += a[i + j] * b[i + j]", only kept in registers (the scalar form's accumulator
 * array lived on the stack: 4x slower). */
typedef float cpu__v8 __attribute__((vector_size(32)));

static cpu__v8 cpu__load8(const float *p)
{
    cpu__v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static float cpu__sum8(cpu__v8 a)
{
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

static float cpu__dot(const float *a, const float *b, int64_t k)
{
    cpu__v8 acc = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        acc += cpu__load8(a + i) * cpu__load8(b + i);
    for (; i < k; i++)
        acc[0] += a[i] * b[i];
    return cpu__sum8(acc);
}

/* Weight row r as f32 into buf (k); for fp8 without its row scale (applied after the dot). */
static void cpu__weight_row(const cpu_t *c, float *buf, const pd_weight_t *w, int64_t r)
{
    if (w->fmt == PD_WFMT_FP8) {
        const uint8_t *q = (const uint8_t *)w->data + r * w->k;
        for (int64_t i = 0; i < w->k; i++)
            buf[i] = c->fp8_lut[q[i]];
    } else {
        quant_dequant_row(buf, w, r);
    }
}

typedef struct {
    const cpu_t *c;
    float *out;
    const float *x; /* (n, k): f32 input, or for fp8 the dequantized-without-scale fp8 values */
    const float *xscale; /* fp8: (n) */
    const pd_weight_t *w;
    int n;
} matmul_job_t;

#define MM_ROWS 4

/* out[i][r] for 4 weight rows w (4, k) against one x (k); each output is summed exactly as
 * cpu__dot sums it, so tiling never changes a result. */
static void cpu__dot4(float *res, const float *x, const float *w, int64_t k)
{
    cpu__v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const cpu__v8 xv = cpu__load8(x + i);
        a0 += xv * cpu__load8(w + i);
        a1 += xv * cpu__load8(w + k + i);
        a2 += xv * cpu__load8(w + 2 * k + i);
        a3 += xv * cpu__load8(w + 3 * k + i);
    }
    for (; i < k; i++) {
        a0[0] += x[i] * w[i];
        a1[0] += x[i] * w[k + i];
        a2[0] += x[i] * w[2 * k + i];
        a3[0] += x[i] * w[3 * k + i];
    }
    res[0] = cpu__sum8(a0);
    res[1] = cpu__sum8(a1);
    res[2] = cpu__sum8(a2);
    res[3] = cpu__sum8(a3);
}

/* cpu__dot4 for two x rows at once (res0, res1): eight independent sums in flight instead of
 * four (the loop was bound by the add latency), each summed exactly as cpu__dot4 sums it. */
static void cpu__dot4x2(float *res0, float *res1, const float *x0, const float *x1,
                        const float *w, int64_t k)
{
    cpu__v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const cpu__v8 u = cpu__load8(x0 + i), v = cpu__load8(x1 + i);
        const cpu__v8 w0 = cpu__load8(w + i), w1 = cpu__load8(w + k + i),
                      w2 = cpu__load8(w + 2 * k + i), w3 = cpu__load8(w + 3 * k + i);
        a0 += u * w0;
        b0 += v * w0;
        a1 += u * w1;
        b1 += v * w1;
        a2 += u * w2;
        b2 += v * w2;
        a3 += u * w3;
        b3 += v * w3;
    }
    for (; i < k; i++) {
        a0[0] += x0[i] * w[i];
        a1[0] += x0[i] * w[k + i];
        a2[0] += x0[i] * w[2 * k + i];
        a3[0] += x0[i] * w[3 * k + i];
        b0[0] += x1[i] * w[i];
        b1[0] += x1[i] * w[k + i];
        b2[0] += x1[i] * w[2 * k + i];
        b3[0] += x1[i] * w[3 * k + i];
    }
    res0[0] = cpu__sum8(a0);
    res0[1] = cpu__sum8(a1);
    res0[2] = cpu__sum8(a2);
    res0[3] = cpu__sum8(a3);
    res1[0] = cpu__sum8(b0);
    res1[1] = cpu__sum8(b1);
    res1[2] = cpu__sum8(b2);
    res1[3] = cpu__sum8(b3);
}

/* 4-row blocks dequantized together (32 weight rows): each x row loaded is used against all of
 * them before the next, instead of against 4 (the loop was bound by streaming x) */
#define MM_GROUP 8

/* o[r0 .. r0 + nr) of token i from the sums res: times the fp8 activation and row scales */
static void cpu__out(const matmul_job_t *j, float *o, int i, int64_t r0, const float *res,
                     const float *ws, int64_t nr)
{
    for (int64_t r = 0; r < nr; r++)
        o[r0 + r] = j->xscale ? res[r] * j->xscale[i] * ws[r] : res[r];
}

/* out (n, N) for the 4-row blocks [b0, b1) of the weight (threadpool_for's chunk). Every output
 * is summed by cpu__dot4x2 / cpu__dot4 (full blocks) or cpu__dot (the last rows), all in the
 * same order, so neither the tiling nor the thread count changes a result. */
static void cpu__matmul_rows(void *arg, size_t b0, size_t b1)
{
    const matmul_job_t *j = arg;
    const int64_t k = j->w->k, N = j->w->n;
    float *buf = cpu__scratch(j->c, (size_t)(MM_GROUP * MM_ROWS * k) * sizeof *buf, "matmul");
    if (!buf)
        return;
    float ws[MM_GROUP * MM_ROWS];
    for (size_t g0 = b0; g0 < b1; g0 += MM_GROUP) {
        const size_t g1 = g0 + MM_GROUP < b1 ? g0 + MM_GROUP : b1;
        const int64_t r0 = (int64_t)g0 * MM_ROWS,
                      r1 = (int64_t)g1 * MM_ROWS < N ? (int64_t)g1 * MM_ROWS : N;
        for (int64_t r = r0; r < r1; r++) {
            cpu__weight_row(j->c, buf + (r - r0) * k, j->w, r);
            ws[r - r0] = j->w->fmt == PD_WFMT_FP8 ? ((const float *)j->w->scales)[r] : 1.0f;
        }
        int i = 0;
        for (; i + 2 <= j->n; i += 2) {
            const float *x0 = j->x + (size_t)i * k;
            float *o0 = j->out + (size_t)i * N;
            for (int64_t q = r0; q < r1; q += MM_ROWS) {
                const int64_t nr = r1 - q < MM_ROWS ? r1 - q : MM_ROWS;
                const float *wq = buf + (q - r0) * k;
                float res0[MM_ROWS], res1[MM_ROWS];
                if (nr == MM_ROWS) {
                    cpu__dot4x2(res0, res1, x0, x0 + k, wq, k);
                } else {
                    for (int64_t r = 0; r < nr; r++) {
                        res0[r] = cpu__dot(x0, wq + r * k, k);
                        res1[r] = cpu__dot(x0 + k, wq + r * k, k);
                    }
                }
                cpu__out(j, o0, i, q, res0, ws + (q - r0), nr);
                cpu__out(j, o0 + N, i + 1, q, res1, ws + (q - r0), nr);
            }
        }
        for (; i < j->n; i++) {
            const float *xi = j->x + (size_t)i * k;
            for (int64_t q = r0; q < r1; q += MM_ROWS) {
                const int64_t nr = r1 - q < MM_ROWS ? r1 - q : MM_ROWS;
                const float *wq = buf + (q - r0) * k;
                float res[MM_ROWS];
                if (nr == MM_ROWS) {
                    cpu__dot4(res, xi, wq, k);
                } else {
                    for (int64_t r = 0; r < nr; r++)
                        res[r] = cpu__dot(xi, wq + r * k, k);
                }
                cpu__out(j, j->out + (size_t)i * N, i, q, res, ws + (q - r0), nr);
            }
        }
    }
    free(buf);
}

/* Quantizes x (n, k) per row to fp8 and writes the fp8 values back as f32 (unscaled) into xq,
 * scales into xs. This is the activation side of the W8A8 FP8 matmul. */
static void cpu__quant_act_fp8(const cpu_t *c, float *xq, float *xs, const float *x, int n,
                               int64_t k)
{
    uint8_t *q = cpu__scratch(c, (size_t)k, "matmul fp8 activations");
    if (!q)
        return;
    for (int i = 0; i < n; i++) {
        xs[i] = quant_fp8_vec(q, x + (size_t)i * k, k);
        for (int64_t t = 0; t < k; t++)
            xq[(size_t)i * k + t] = c->fp8_lut[q[t]];
    }
    free(q);
}

static void cpu__matmul(const cpu_t *c, threadpool_t *pool, float *out, const float *x,
                        const pd_weight_t *w, int n)
{
    matmul_job_t j = {c, out, x, NULL, w, n};
    float *xq = NULL, *xs = NULL;

    if (w->fmt == PD_WFMT_FP8) {
        xq = cpu__scratch(c, (size_t)n * (size_t)w->k * sizeof *xq, "matmul");
        xs = xq ? cpu__scratch(c, (size_t)n * sizeof *xs, "matmul") : NULL;
        if (!xs) {
            free(xq);
            return;
        }
        cpu__quant_act_fp8(c, xq, xs, x, n, w->k);
        j.x = xq;
        j.xscale = xs;
    }
    threadpool_for(pool, (size_t)((w->n + MM_ROWS - 1) / MM_ROWS), cpu__matmul_rows, &j);
    free(xq);
    free(xs);
}

static void cpu_matmul(pd_backend_t *be, float *out, const float *x, const pd_weight_t *w, int n)
{
    cpu_t *c = cpu__get(be);
    cpu__matmul(c, c->pool, out, x, w, n);
}

/* ==== fused ops: the plain ops above in sequence (backend.h) ==== */

/* q->q (n, k) fp8, q->scale (n) = x (n, k) quantized per row (quant_fp8_vec) */
static void cpu__quant_rows(const pd_act_fp8_t *q, const float *x, int n, int64_t k)
{
    /* this backend has no act_quant: nothing asks it for 1x128 blocks or an f16 image */
    PD_ASSERT(!q->blk && !q->wg && !q->f16);
    for (int i = 0; i < n; i++)
        q->scale[i] = quant_fp8_vec(q->q + (size_t)i * k, x + (size_t)i * k, k);
}

static void cpu_add_rmsnorm(pd_backend_t *be, float *x, const float *y, float *out,
                            const uint16_t *w, int n, int d, float eps, const pd_act_fp8_t *q)
{
    float *o = out ? out : cpu__scratch(cpu__get(be), (size_t)n * d * sizeof *o, "add_rmsnorm");
    if (!o)
        return;
    if (y)
        cpu_add(be, x, y, (size_t)n * d);
    cpu_rmsnorm(be, o, x, w, n, d, eps);
    if (q)
        cpu__quant_rows(q, o, n, d);
    if (!out)
        free(o);
}

static void cpu_silu_mul_fp8(pd_backend_t *be, float *out, const float *gu, int n, int f,
                             const pd_act_fp8_t *q)
{
    float *o = out ? out : cpu__scratch(cpu__get(be), (size_t)n * f * sizeof *o, "silu_mul_fp8");
    if (!o)
        return;
    cpu_silu_mul(be, o, gu, n, f);
    if (q)
        cpu__quant_rows(q, o, n, f);
    if (!out)
        free(o);
}

static void cpu_matmul_fp8(pd_backend_t *be, float *out, const pd_act_fp8_t *x,
                           const pd_weight_t *w, int n)
{
    cpu_t *c = cpu__get(be);
    PD_ASSERT(w->fmt == PD_WFMT_FP8 && !x->blk && !x->wg && !x->f16);
    float *xq = cpu__scratch(c, (size_t)n * (size_t)w->k * sizeof *xq, "matmul_fp8");
    if (!xq)
        return;
    for (size_t i = 0; i < (size_t)n * (size_t)w->k; i++)
        xq[i] = c->fp8_lut[x->q[i]];
    matmul_job_t j = {c, out, xq, x->scale, w, n};
    threadpool_for(c->pool, (size_t)((w->n + MM_ROWS - 1) / MM_ROWS), cpu__matmul_rows, &j);
    free(xq);
}

/* backend.h matmul_silu_fp8: the plain ops in sequence (gu holds the f32 product) */
static void cpu_matmul_silu_fp8(pd_backend_t *be, const pd_act_fp8_t *q, float *gu,
                                const pd_act_fp8_t *x, const pd_weight_t *w, int n)
{
    cpu_matmul_fp8(be, gu, x, w, n);
    cpu_silu_mul_fp8(be, NULL, gu, n, (int)(w->n / 2), q);
}

/* ==== paged KV ==== */

/* fp8 e4m3 -> f32 for every byte; filled once (pthread_once) by the first backend_cpu_create:
 * several backends (tensor-parallel ranks, nodes in one test process) are created concurrently. */
static float cpu_fp8_table[256];
static pthread_once_t cpu_fp8_once = PTHREAD_ONCE_INIT;

static void cpu__fp8_table_init(void)
{
    for (int i = 0; i < 256; i++)
        cpu_fp8_table[i] = pd_fp8_to_f32((uint8_t)i);
}

static void cpu__kv_store(const kv_layout_t *l, uint8_t *page, int layer, int side, int tok,
                          const float *src /* (n_kv_heads, head_dim) */)
{
    const int H = l->n_kv_heads, D = l->head_dim;
    uint8_t *data = page + kv_layout_data_off(l, layer, side);
    for (int h = 0; h < H; h++) {
        const float *s = src + (size_t)h * D;
        size_t base = ((size_t)tok * H + h) * D;
        if (l->fmt == PD_KV_F32) {
            memcpy((float *)data + base, s, (size_t)D * 4);
        } else if (l->fmt == PD_KV_BF16) {
            for (int d = 0; d < D; d++)
                ((uint16_t *)data)[base + d] = pd_f32_to_bf16(s[d]);
        } else {
            float *scales = (float *)(page + kv_layout_scale_off(l, layer, side));
            scales[(size_t)tok * H + h] = quant_fp8_vec(data + base, s, D);
        }
    }
}

static void cpu_kv_write(pd_backend_t *be, void *arena, const kv_layout_t *l, int layer,
                         const float *k, const float *v, const int32_t *slots, int n)
{
    const size_t row = (size_t)l->n_kv_heads * l->head_dim;
    (void)be;
    PD_ASSERT(l->n_sides == 2); /* a latent layout is written by latent_write */
    for (int i = 0; i < n; i++) {
        if (slots[i] < 0)
            continue;
        int32_t page = slots[i] / l->page_tokens, tok = slots[i] % l->page_tokens;
        uint8_t *p = (uint8_t *)arena + (size_t)page * l->page_bytes;
        cpu__kv_store(l, p, layer, 0, tok, k + i * row);
        cpu__kv_store(l, p, layer, 1, tok, v + i * row);
    }
}

/* backend.h qkv_rope_write: the plain ops in sequence */
static void cpu_qkv_rope_write(pd_backend_t *be, float *q, float *k, float *v,
                               const pd_act_fp8_t *x, const pd_weight_t *wq, const pd_weight_t *wk,
                               const pd_weight_t *wv, const int32_t *pos, const float *inv_freq,
                               int n, int n_heads, void *arena, const kv_layout_t *l, int layer,
                               const int32_t *slots)
{
    cpu_matmul_fp8(be, q, x, wq, n);
    cpu_matmul_fp8(be, k, x, wk, n);
    cpu_matmul_fp8(be, v, x, wv, n);
    cpu_rope(be, q, pos, inv_freq, n, n_heads, l->head_dim);
    cpu_rope(be, k, pos, inv_freq, n, l->n_kv_heads, l->head_dim);
    cpu_kv_write(be, arena, l, layer, k, v, slots, n);
}

/* Reads one (token, head) vector of K or V as f32 into dst (head_dim). */
static void cpu__kv_load(const kv_layout_t *l, const uint8_t *page, int layer, int side, int tok,
                         int h, float *dst)
{
    const int H = l->n_kv_heads, D = l->head_dim;
    const uint8_t *data = page + kv_layout_data_off(l, layer, side);
    size_t base = ((size_t)tok * H + h) * D;
    if (l->fmt == PD_KV_F32) {
        memcpy(dst, (const float *)data + base, (size_t)D * 4);
    } else if (l->fmt == PD_KV_BF16) {
        for (int d = 0; d < D; d++)
            dst[d] = pd_bf16_to_f32(((const uint16_t *)data)[base + d]);
    } else {
        float s =
            ((const float *)(page + kv_layout_scale_off(l, layer, side)))[(size_t)tok * H + h];
        for (int d = 0; d < D; d++)
            dst[d] = cpu_fp8_table[data[base + d]] * s;
    }
}

typedef struct {
    const cpu_t *c;
    float *out;
    const float *q;
    const uint8_t *arena;
    const kv_layout_t *l;
    int layer, n_heads;
    const pd_attn_batch_t *b;
    int32_t n_rows;
} attn_job_t;

/* Tasks are numbered head-major (task = h * n_rows + row), so a thread's consecutive tasks share
 * a sequence and KV head: the K/V vectors of that (sequence, KV head) are converted to f32 once
 * into a per-thread cache and reused by every query row (the values are the same as converting
 * them per row, so results do not change). */
static void cpu__attn_rows(void *arg, size_t r0, size_t r1)
{
    const attn_job_t *j = arg;
    const kv_layout_t *l = j->l;
    const int D = l->head_dim, group = j->n_heads / l->n_kv_heads, P = l->page_tokens;
    const float scale = 1.0f / sqrtf((float)D);
    int max_ctx = 0, cache_s = -1, cache_kvh = -1, cached = 0;
    for (int s = 0; s < j->b->n_seqs; s++)
        if (j->b->ctx_len[s] > max_ctx)
            max_ctx = j->b->ctx_len[s];
    float *scores = cpu__scratch(j->c, ((size_t)max_ctx + 1) * sizeof *scores, "attention");
    float *kc = cpu__scratch(j->c, ((size_t)max_ctx + 1) * (size_t)D * sizeof *kc, "attention");
    float *vc = cpu__scratch(j->c, ((size_t)max_ctx + 1) * (size_t)D * sizeof *vc, "attention");
    if (!scores || !kc || !vc) {
        free(scores);
        free(kc);
        free(vc);
        return;
    }

    for (size_t task = r0; task < r1; task++) {
        int32_t row = (int32_t)(task % (size_t)j->n_rows);
        int h = (int)(task / (size_t)j->n_rows), kvh = h / group, s = 0;
        while (j->b->q_start[s + 1] <= row)
            s++;
        int32_t q_len = j->b->q_start[s + 1] - j->b->q_start[s];
        int32_t pos = j->b->ctx_len[s] - q_len + (row - j->b->q_start[s]);
        const int32_t *bt = j->b->block_tables + (size_t)s * j->b->max_pages;
        const float *q = j->q + ((size_t)row * j->n_heads + h) * D;
        float *o = j->out + ((size_t)row * j->n_heads + h) * D;
        float mx = -INFINITY, sum = 0.0f;

        if (s != cache_s || kvh != cache_kvh) {
            cache_s = s;
            cache_kvh = kvh;
            cached = 0;
        }
        for (; cached <= pos; cached++) {
            const uint8_t *page = j->arena + (size_t)bt[cached / P] * l->page_bytes;
            cpu__kv_load(l, page, j->layer, 0, cached % P, kvh, kc + (size_t)cached * D);
            cpu__kv_load(l, page, j->layer, 1, cached % P, kvh, vc + (size_t)cached * D);
        }
        for (int32_t t = 0; t <= pos; t++) {
            scores[t] = cpu__dot(q, kc + (size_t)t * D, D) * scale;
            if (scores[t] > mx)
                mx = scores[t];
        }
        for (int32_t t = 0; t <= pos; t++) {
            scores[t] = expf(scores[t] - mx);
            sum += scores[t];
        }
        memset(o, 0, (size_t)D * sizeof *o);
        for (int32_t t = 0; t <= pos; t++) {
            float p = scores[t] / sum;
            const float *v = vc + (size_t)t * D;
            for (int d = 0; d < D; d++)
                o[d] += p * v[d];
        }
    }
    free(scores);
    free(kc);
    free(vc);
}

static void cpu_attention(pd_backend_t *be, float *out, const float *q, const void *arena,
                          const kv_layout_t *l, int layer, const pd_attn_batch_t *batch,
                          int n_heads)
{
    cpu_t *c = cpu__get(be);
    attn_job_t j = {c, out, q, arena, l, layer, n_heads, batch, batch->q_start[batch->n_seqs]};
    threadpool_for(c->pool, (size_t)j.n_rows * (size_t)n_heads, cpu__attn_rows, &j);
}

static void cpu_kv_stamp(pd_backend_t *be, void *arena, const kv_layout_t *l, const int32_t *pages,
                         const kv_tag_t *tags, int n)
{
    (void)be;
    for (int i = 0; i < n; i++)
        memcpy((uint8_t *)arena + (size_t)pages[i] * l->page_bytes, &tags[i], sizeof tags[i]);
}

static pd_status_t cpu_page_digest(pd_backend_t *be, uint64_t *digests_out, const void *base,
                                   size_t page_bytes, const int32_t *pages, int n)
{
    const uint8_t *b = base;
    for (int i = 0; i < n; i++)
        digests_out[i] =
            kv_digest_page(b + (size_t)(pages ? pages[i] : i) * page_bytes, page_bytes);
    return cpu__take_error(cpu__get(be));
}

static void cpu_kv_check(pd_backend_t *be, uint8_t *bad_out, kv_tag_t *found_out, const void *arena,
                         const kv_layout_t *l, const int32_t *pages, const kv_tag_t *expected,
                         const kv_tag_t *current, int n)
{
    (void)be;
    for (int i = 0; i < n; i++) {
        kv_tag_t stamp;
        memcpy(&stamp, (const uint8_t *)arena + (size_t)pages[i] * l->page_bytes, sizeof stamp);
        found_out[i] = stamp;
        bad_out[i] = current[i] != expected[i] ? 1 : stamp != expected[i] ? 2 : 0;
    }
}

static void cpu_kv_export(pd_backend_t *be, void *dst, const kv_layout_t *dst_l, const void *arena,
                          const kv_layout_t *src_l, const int32_t *src_pages, int n_pages)
{
    const int H = src_l->n_kv_heads, D = src_l->head_dim;
    float *tmp = cpu__scratch(cpu__get(be), (size_t)H * D * sizeof *tmp, "kv_export");
    if (!tmp)
        return;
    for (int p = 0; p < n_pages; p++) {
        const uint8_t *sp = (const uint8_t *)arena + (size_t)src_pages[p] * src_l->page_bytes;
        uint8_t *dp = (uint8_t *)dst + (size_t)p * dst_l->page_bytes;
        memcpy(dp, sp, KV_PAGE_HEADER_BYTES);
        for (int layer = 0; layer < src_l->n_layers; layer++)
            for (int side = 0; side < src_l->n_sides; side++)
                for (int t = 0; t < src_l->page_tokens; t++) {
                    for (int h = 0; h < H; h++)
                        cpu__kv_load(src_l, sp, layer, side, t, h, tmp + (size_t)h * D);
                    cpu__kv_store(dst_l, dp, layer, side, t, tmp);
                }
    }
    free(tmp);
}

/* The transfer stream's ops: the CPU backend runs each op when it is called, so "behind the
 * compute stream" holds trivially and xfer_sync only reports. */
static void cpu_xfer_kv_export(pd_backend_t *be, void *dst, const kv_layout_t *dst_l,
                               const int32_t *dst_pages, const kv_tag_t *tags, const void *arena,
                               const kv_layout_t *src_l, const int32_t *src_pages, int n,
                               int layer0, int n_layers)
{
    cpu_t *c = cpu__get(be);
    const int H = src_l->n_kv_heads, D = src_l->head_dim;
    float *tmp = malloc((size_t)H * D * sizeof *tmp);
    if (!tmp) {
        if (c->xfer_err == PD_OK)
            c->xfer_err = PD_ERR_NOMEM;
        return;
    }
    for (int p = 0; p < n; p++) {
        const uint8_t *sp = (const uint8_t *)arena + (size_t)src_pages[p] * src_l->page_bytes;
        uint8_t *dp = (uint8_t *)dst + (size_t)(dst_pages ? dst_pages[p] : p) * dst_l->page_bytes;
        if (layer0 == 0) {
            const size_t used = KV_PAGE_HEADER_BYTES + (size_t)dst_l->n_layers * dst_l->n_sides *
                                                           (dst_l->side_bytes + dst_l->scale_bytes);
            memcpy(dp, sp, KV_PAGE_HEADER_BYTES);
            if (tags)
                memcpy(dp, &tags[p], sizeof tags[p]);
            memset(dp + used, 0, dst_l->page_bytes - used); /* the tail: defined bytes */
        }
        for (int layer = layer0; layer < layer0 + n_layers; layer++)
            for (int side = 0; side < src_l->n_sides; side++)
                for (int t = 0; t < src_l->page_tokens; t++) {
                    for (int h = 0; h < H; h++)
                        cpu__kv_load(src_l, sp, layer, side, t, h, tmp + (size_t)h * D);
                    cpu__kv_store(dst_l, dp, layer, side, t, tmp);
                }
    }
    free(tmp);
}

static void cpu_xfer_download(pd_backend_t *be, void *dst_host, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst_host, src, bytes);
}

static pd_status_t cpu_xfer_sync(pd_backend_t *be)
{
    cpu_t *c = cpu__get(be);
    pd_status_t st = c->xfer_err;
    c->xfer_err = PD_OK;
    return st;
}

/* ==== MoE ==== */

static void cpu_moe_route(pd_backend_t *be, int32_t *ids, float *weights, const float *logits,
                          int n, int n_experts, int k, bool norm)
{
    float *p = cpu__scratch(cpu__get(be), (size_t)n_experts * sizeof *p, "moe_route");
    if (!p) { /* the experts op indexes weights by these ids: keep them in range */
        memset(ids, 0, (size_t)n * (size_t)k * sizeof *ids);
        memset(weights, 0, (size_t)n * (size_t)k * sizeof *weights);
        return;
    }
    for (int i = 0; i < n; i++) {
        const float *lg = logits + (size_t)i * n_experts;
        float mx = -INFINITY, sum = 0.0f, tsum = 0.0f;
        for (int e = 0; e < n_experts; e++)
            mx = fmaxf(mx, lg[e]);
        for (int e = 0; e < n_experts; e++) {
            p[e] = expf(lg[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < n_experts; e++)
            p[e] /= sum;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < n_experts; e++) {
                bool taken = false;
                for (int t = 0; t < j; t++)
                    taken |= ids[(size_t)i * k + t] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            ids[(size_t)i * k + j] = best;
            weights[(size_t)i * k + j] = p[best];
            tsum += p[best];
        }
        if (norm)
            for (int j = 0; j < k; j++)
                weights[(size_t)i * k + j] /= tsum;
    }
    free(p);
}

/* out (n, d) = sum over the k slots s of each token t of weights[t, s] * down_e(silu_mul(
 * gate_up_e(x_t))), e = ids[t, s]. Grouped by expert: the rows routed to expert e are gathered
 * and multiplied as one matmul per projection (each weight row dequantized once per call, not
 * once per routed token; the matmul's threads split the weight rows), then every token sums its
 * slots in slot order. cpu__matmul sums each output the same way whatever its row count, so the
 * result is the per-token loop's bit for bit (before session 9: one n = 1 matmul per (token,
 * slot), one token per thread). */
static void cpu_moe_experts(pd_backend_t *be, float *out, const float *x, const int32_t *ids,
                            const float *weights, const pd_weight_t *gate_up,
                            const pd_weight_t *down, int n, int k, int d, int f)
{
    cpu_t *c = cpu__get(be);
    const size_t m = (size_t)n * (size_t)k;
    if (m == 0)
        return;
    int32_t *slots = cpu__scratch(c, m * sizeof *slots, "moe_experts");
    float *xg = slots ? cpu__scratch(c, m * (size_t)d * sizeof *xg, "moe_experts") : NULL;
    float *gu = xg ? cpu__scratch(c, m * 2 * (size_t)f * sizeof *gu, "moe_experts") : NULL;
    float *act = gu ? cpu__scratch(c, m * (size_t)f * sizeof *act, "moe_experts") : NULL;
    float *y = act ? cpu__scratch(c, m * (size_t)d * sizeof *y, "moe_experts") : NULL;
    if (!y)
        goto done;
    memset(y, 0, m * (size_t)d * sizeof *y); /* (a slot of no expert would add zeros) */
    /* each expert's slots in slot order; the slots' outputs y (m, d) in slot order */
    int e_max = 0;
    for (size_t i = 0; i < m; i++)
        e_max = ids[i] > e_max ? ids[i] : e_max;
    for (int e = 0; e <= e_max; e++) {
        size_t ne = 0;
        for (size_t i = 0; i < m; i++)
            if (ids[i] == e) {
                slots[ne] = (int32_t)i;
                memcpy(xg + ne * (size_t)d, x + (i / (size_t)k) * (size_t)d,
                       (size_t)d * sizeof *xg);
                ne++;
            }
        if (ne == 0)
            continue;
        cpu__matmul(c, c->pool, gu, xg, &gate_up[e], (int)ne);
        cpu_silu_mul(be, act, gu, (int)ne, f);
        cpu__matmul(c, c->pool, xg, act, &down[e], (int)ne); /* xg is free again: the output */
        for (size_t r = 0; r < ne; r++)
            memcpy(y + (size_t)slots[r] * (size_t)d, xg + r * (size_t)d, (size_t)d * sizeof *y);
    }
    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * (size_t)d;
        memset(o, 0, (size_t)d * sizeof *o);
        for (int s = 0; s < k; s++) {
            const float wt = weights[(size_t)t * k + s];
            const float *ys = y + ((size_t)t * k + s) * (size_t)d;
            for (int i = 0; i < d; i++)
                o[i] += wt * ys[i];
        }
    }
done:
    free(slots);
    free(xg);
    free(gu);
    free(act);
    free(y);
}

/* ==== table ==== */

static bool cpu_supports_op(pd_backend_t *be, pd_op_t op, int variant)
{
    (void)be;
    (void)variant;
    return op < PD_OP__COUNT;
}

static void cpu_destroy(pd_backend_t *be)
{
    cpu_t *c = cpu__get(be);
    threadpool_destroy(c->pool);
    free(c);
    free(be);
}

/* ==== sampling ==== */

static void cpu_sample(pd_backend_t *be, int32_t *tokens_out, const float *logits, int n, int vocab,
                       const float *temperature, const int32_t *top_k, const float *top_p,
                       const float *u)
{
    cpu_t *c = cpu__get(be);
    int32_t *idx = cpu__scratch(c, (size_t)vocab * sizeof *idx, "sample");
    float *probs = idx ? cpu__scratch(c, (size_t)vocab * sizeof *probs, "sample") : NULL;
    if (!probs) { /* tokens stay in the vocabulary; the next download reports the error */
        free(idx);
        memset(tokens_out, 0, (size_t)n * sizeof *tokens_out);
        return;
    }
    for (int i = 0; i < n; i++) {
        sampler_params_t p = {temperature[i], top_k[i], top_p[i], 0};
        tokens_out[i] = sampler_pick(&p, logits + (size_t)i * vocab, vocab, u[i], idx, probs);
    }
    free(idx);
    free(probs);
}

static void cpu_logprobs(pd_backend_t *be, int32_t *ids_out, float *vals_out, const float *logits,
                         const int32_t *tokens, const int32_t *n_top, int n, int vocab)
{
    const size_t w = 1 + SAMPLER_MAX_TOP_LOGPROBS;
    (void)be;
    for (int i = 0; i < n; i++) {
        sampler_logprobs_t lp;
        if (n_top[i] < 0)
            continue;
        sampler_logprobs(logits + (size_t)i * vocab, vocab, tokens[i], n_top[i], &lp);
        ids_out[i * w] = lp.token;
        vals_out[i * w] = lp.logprob;
        memcpy(ids_out + i * w + 1, lp.top_ids, (size_t)lp.n_top * sizeof *ids_out);
        memcpy(vals_out + i * w + 1, lp.top_logprobs, (size_t)lp.n_top * sizeof *vals_out);
    }
}

static void cpu_logits_process(pd_backend_t *be, float *logits, int n, int vocab,
                               const int32_t *ent, const float *bias, int n_ent, const float *pen)
{
    (void)be;
    sampler_logits_process_ref(logits, n, vocab, ent, bias, n_ent, pen);
}

static const pd_backend_ops_t cpu_ops = {
    .name = "cpu",
    .supports_op = cpu_supports_op,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_download,
    .memset = cpu_memset,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add = cpu_add,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .silu_mul = cpu_silu_mul,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .moe_route = cpu_moe_route,
    .moe_experts = cpu_moe_experts,
    .kv_stamp = cpu_kv_stamp,
    .kv_check = cpu_kv_check,
    .page_digest = cpu_page_digest,
    .kv_export = cpu_kv_export,
    .sample = cpu_sample,
    .logprobs = cpu_logprobs,
    .add_rmsnorm = cpu_add_rmsnorm,
    .silu_mul_fp8 = cpu_silu_mul_fp8,
    .matmul_fp8 = cpu_matmul_fp8,
    .matmul_silu_fp8 = cpu_matmul_silu_fp8,
    .qkv_rope_write = cpu_qkv_rope_write,
    .logits_process = cpu_logits_process,
    .bias_add = backend_cpu__bias_add,
    .rope_partial = backend_cpu__rope_partial,
    .moe_route_grouped = backend_cpu__moe_route_grouped,
    .head_matmul = backend_cpu__head_matmul,
    .latent_write = backend_cpu__latent_write,
    .latent_attention = backend_cpu__latent_attention,
    .xfer_kv_export = cpu_xfer_kv_export,
    .xfer_download = cpu_xfer_download,
    .xfer_sync = cpu_xfer_sync,
};

pd_status_t backend_cpu_create(int n_threads, pd_backend_t **be_p)
{
    pd_backend_t *be = calloc(1, sizeof *be);
    cpu_t *c = calloc(1, sizeof *c);
    pd_status_t st;

    if (!be || !c) {
        free(be);
        free(c);
        return PD_ERR_NOMEM;
    }
    st = threadpool_create(n_threads, &c->pool);
    if (st != PD_OK) {
        free(be);
        free(c);
        return st;
    }
    pthread_once(&cpu_fp8_once, cpu__fp8_table_init);
    memcpy(c->fp8_lut, cpu_fp8_table, sizeof c->fp8_lut);
    be->ops = &cpu_ops;
    be->impl = c;
    be->n_threads = threadpool_size(c->pool);
    *be_p = be;
    return PD_OK;
}
