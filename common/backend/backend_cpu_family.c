/* CPU reference of the GLM-4.5 / DeepSeek-V3 ops (see backend_cpu_family.h, backend.h). Like the
 * rest of the CPU backend, every output element is computed by one thread in a fixed order, so
 * results do not depend on the number of threads. */
#include "backend_cpu_family.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "log.h"
#include "quant.h"

void backend_cpu__bias_add(pd_backend_t *be, float *x, const float *bias, int n, int d)
{
    (void)be;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++)
            x[(size_t)i * d + j] += bias[j];
}

void backend_cpu__rope_partial(pd_backend_t *be, float *x, const int32_t *pos,
                               const float *inv_freq, int n, int n_heads, int head_dim, int rot_dim,
                               bool interleave, float scale)
{
    const int half = rot_dim / 2;
    (void)be;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < half; j++) {
            float ang = (float)pos[i] * inv_freq[j];
            float c = cosf(ang) * scale, s = sinf(ang) * scale;
            int ia = interleave ? 2 * j : j, ib = interleave ? 2 * j + 1 : j + half;
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((size_t)i * n_heads + h) * head_dim;
                float a = v[ia], b = v[ib];
                v[ia] = a * c - b * s;
                v[ib] = b * c + a * s;
            }
        }
    }
}

/* the index of the largest v[e] among e with allowed[e] and not yet taken (ties: lower id) */
static int cpu__argmax(const float *v, const bool *taken, int n)
{
    int best = -1;
    for (int e = 0; e < n; e++)
        if (!taken[e] && (best < 0 || v[e] > v[best]))
            best = e;
    return best;
}

void backend_cpu__moe_route_grouped(pd_backend_t *be, int32_t *ids, float *weights,
                                    const float *logits, const float *bias, int n, int n_experts,
                                    int k, int n_group, int topk_group, bool norm, float scale)
{
    const int per = n_experts / n_group;
    float *s = malloc((size_t)n_experts * sizeof *s), *choice = malloc((size_t)n_experts * 4);
    float *gscore = malloc((size_t)n_group * sizeof *gscore);
    bool *taken = malloc((size_t)(n_experts > n_group ? n_experts : n_group));
    bool *gkeep = malloc((size_t)n_group);
    (void)be;
    PD_ASSERT(s && choice && gscore && taken && gkeep);
    for (int i = 0; i < n; i++) {
        const float *lg = logits + (size_t)i * n_experts;
        for (int e = 0; e < n_experts; e++) {
            s[e] = 1.0f / (1.0f + expf(-lg[e]));
            choice[e] = s[e] + bias[e];
        }
        /* group score: the sum of the group's two best choice scores (one when per == 1) */
        for (int g = 0; g < n_group; g++) {
            const float *c = choice + (size_t)g * per;
            int b0 = 0, b1 = -1;
            for (int e = 1; e < per; e++)
                if (c[e] > c[b0])
                    b0 = e;
            for (int e = 0; e < per; e++)
                if (e != b0 && (b1 < 0 || c[e] > c[b1]))
                    b1 = e;
            gscore[g] = c[b0] + (b1 >= 0 ? c[b1] : 0.0f);
        }
        memset(taken, 0, (size_t)n_group);
        memset(gkeep, 0, (size_t)n_group);
        for (int t = 0; t < topk_group; t++) {
            int g = cpu__argmax(gscore, taken, n_group);
            taken[g] = true;
            gkeep[g] = true;
        }
        for (int e = 0; e < n_experts; e++)
            if (!gkeep[e / per])
                choice[e] = 0.0f; /* transformers: masked_fill(~mask, 0.0) */
        memset(taken, 0, (size_t)n_experts);
        float sum = 0.0f;
        for (int j = 0; j < k; j++) {
            int e = cpu__argmax(choice, taken, n_experts);
            taken[e] = true;
            ids[(size_t)i * k + j] = e;
            weights[(size_t)i * k + j] = s[e];
            sum += s[e];
        }
        for (int j = 0; j < k; j++) {
            float w = weights[(size_t)i * k + j];
            if (norm)
                w /= sum + 1e-20f;
            weights[(size_t)i * k + j] = w * scale;
        }
    }
    free(s);
    free(choice);
    free(gscore);
    free(taken);
    free(gkeep);
}

typedef struct {
    float *out;
    const float *x;
    const uint16_t *w;
    int n, n_heads, nout, kin, x_stride;
} head_mm_job_t;

/* tasks: (head, output row) pairs; each converts its weight row once for every token */
static void cpu__head_mm_rows(void *arg, size_t t0, size_t t1)
{
    const head_mm_job_t *j = arg;
    float *row = malloc((size_t)j->kin * sizeof *row);
    PD_ASSERT(row);
    for (size_t t = t0; t < t1; t++) {
        int h = (int)(t / (size_t)j->nout), o = (int)(t % (size_t)j->nout);
        const uint16_t *wr = j->w + ((size_t)h * j->nout + o) * j->kin;
        for (int q = 0; q < j->kin; q++)
            row[q] = pd_bf16_to_f32(wr[q]);
        for (int i = 0; i < j->n; i++) {
            const float *xi = j->x + ((size_t)i * j->n_heads + h) * j->x_stride;
            float acc = 0.0f;
            for (int q = 0; q < j->kin; q++)
                acc += xi[q] * row[q];
            j->out[((size_t)i * j->n_heads + h) * j->nout + o] = acc;
        }
    }
    free(row);
}

void backend_cpu__head_matmul(pd_backend_t *be, float *out, const float *x, const uint16_t *w,
                              int n, int n_heads, int nout, int kin, int x_stride)
{
    head_mm_job_t j = {out, x, w, n, n_heads, nout, kin, x_stride};
    PD_ASSERT(x_stride >= kin);
    threadpool_for(backend_cpu__pool(be), (size_t)n_heads * (size_t)nout, cpu__head_mm_rows, &j);
}

/* ==== the MLA latent cache ==== */

void backend_cpu__latent_write(pd_backend_t *be, void *arena, const kv_layout_t *l, int layer,
                               const float *c, const float *kpe, const int32_t *slots, int n, int r)
{
    const int D = l->head_dim, rope = D - r;
    float *tmp = malloc((size_t)D * sizeof *tmp);
    (void)be;
    PD_ASSERT(tmp && l->n_sides == 1 && l->n_kv_heads == 1);
    for (int i = 0; i < n; i++) {
        if (slots[i] < 0)
            continue;
        int32_t page = slots[i] / l->page_tokens, tok = slots[i] % l->page_tokens;
        uint8_t *p = (uint8_t *)arena + (size_t)page * l->page_bytes;
        uint8_t *data = p + kv_layout_data_off(l, layer, 0);
        memcpy(tmp, c + (size_t)i * r, (size_t)r * 4);
        memcpy(tmp + r, kpe + (size_t)i * rope, (size_t)rope * 4);
        if (l->fmt == PD_KV_F32) {
            memcpy((float *)data + (size_t)tok * D, tmp, (size_t)D * 4);
        } else if (l->fmt == PD_KV_BF16) {
            for (int d = 0; d < D; d++)
                ((uint16_t *)data)[(size_t)tok * D + d] = pd_f32_to_bf16(tmp[d]);
        } else {
            float *scales = (float *)(p + kv_layout_scale_off(l, layer, 0));
            scales[tok] = quant_fp8_vec(data + (size_t)tok * D, tmp, D);
        }
    }
    free(tmp);
}

/* one token's latent (head_dim) as f32 */
static void cpu__latent_load(const kv_layout_t *l, const uint8_t *page, int layer, int tok,
                             float *dst)
{
    const int D = l->head_dim;
    const uint8_t *data = page + kv_layout_data_off(l, layer, 0);
    if (l->fmt == PD_KV_F32) {
        memcpy(dst, (const float *)data + (size_t)tok * D, (size_t)D * 4);
    } else if (l->fmt == PD_KV_BF16) {
        for (int d = 0; d < D; d++)
            dst[d] = pd_bf16_to_f32(((const uint16_t *)data)[(size_t)tok * D + d]);
    } else {
        float s = ((const float *)(page + kv_layout_scale_off(l, layer, 0)))[tok];
        for (int d = 0; d < D; d++)
            dst[d] = pd_fp8_to_f32(data[(size_t)tok * D + d]) * s;
    }
}

typedef struct {
    float *out;
    const float *q_lat, *q_pe;
    const uint8_t *arena;
    const kv_layout_t *l;
    int layer, n_heads, r, n_rows, pe_stride;
    float scale;
    const pd_attn_batch_t *b;
} latent_job_t;

/* tasks are query rows; all heads of a row read the same latent vectors (MQA-like) */
static void cpu__latent_rows(void *arg, size_t r0, size_t r1)
{
    const latent_job_t *j = arg;
    const kv_layout_t *l = j->l;
    const int D = l->head_dim, r = j->r, rope = D - r, P = l->page_tokens, H = j->n_heads;
    int max_ctx = 0;
    for (int s = 0; s < j->b->n_seqs; s++)
        if (j->b->ctx_len[s] > max_ctx)
            max_ctx = j->b->ctx_len[s];
    float *scores = malloc(((size_t)max_ctx + 1) * sizeof *scores);
    float *lat = malloc(((size_t)max_ctx + 1) * (size_t)D * sizeof *lat);
    PD_ASSERT(scores && lat);

    /* the latents of sequence cur_s loaded so far (tokens 0 .. have - 1): the next row of the
     * same sequence loads only the tokens past them (the pages do not change during the call) */
    int cur_s = -1;
    int32_t have = 0;
    for (size_t task = r0; task < r1; task++) {
        int32_t row = (int32_t)task;
        int s = 0;
        while (j->b->q_start[s + 1] <= row)
            s++;
        int32_t q_len = j->b->q_start[s + 1] - j->b->q_start[s];
        int32_t pos = j->b->ctx_len[s] - q_len + (row - j->b->q_start[s]);
        const int32_t *bt = j->b->block_tables + (size_t)s * j->b->max_pages;
        if (s != cur_s) {
            cur_s = s;
            have = 0;
        }
        for (int32_t t = have; t <= pos; t++)
            cpu__latent_load(l, j->arena + (size_t)bt[t / P] * l->page_bytes, j->layer, t % P,
                             lat + (size_t)t * D);
        if (pos + 1 > have)
            have = pos + 1;
        for (int h = 0; h < H; h++) {
            const float *ql = j->q_lat + ((size_t)row * H + h) * r;
            const float *qp = j->q_pe + ((size_t)row * H + h) * j->pe_stride;
            float *o = j->out + ((size_t)row * H + h) * r;
            float mx = -INFINITY, sum = 0.0f;
            for (int32_t t = 0; t <= pos; t++) {
                const float *c = lat + (size_t)t * D;
                float a = 0.0f, b = 0.0f;
                for (int d = 0; d < r; d++)
                    a += ql[d] * c[d];
                for (int d = 0; d < rope; d++)
                    b += qp[d] * c[r + d];
                scores[t] = (a + b) * j->scale;
                if (scores[t] > mx)
                    mx = scores[t];
            }
            for (int32_t t = 0; t <= pos; t++) {
                scores[t] = expf(scores[t] - mx);
                sum += scores[t];
            }
            memset(o, 0, (size_t)r * sizeof *o);
            for (int32_t t = 0; t <= pos; t++) {
                float p = scores[t] / sum;
                const float *c = lat + (size_t)t * D;
                for (int d = 0; d < r; d++)
                    o[d] += p * c[d];
            }
        }
    }
    free(scores);
    free(lat);
}

void backend_cpu__latent_attention(pd_backend_t *be, float *out, const float *q_lat,
                                   const float *q_pe, const void *arena, const kv_layout_t *l,
                                   int layer, const pd_attn_batch_t *batch, int n_heads, int r,
                                   int pe_stride, float scale)
{
    latent_job_t j = {
        out,       q_lat, q_pe, arena, l, layer, n_heads, r, batch->q_start[batch->n_seqs],
        pe_stride, scale, batch};
    PD_ASSERT(l->n_sides == 1 && l->n_kv_heads == 1 && r < l->head_dim &&
              pe_stride >= l->head_dim - r);
    threadpool_for(backend_cpu__pool(be), (size_t)j.n_rows, cpu__latent_rows, &j);
}
