#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "log.h"
#include "safetensors.h"
#include "model_impl.h"
#include "tp_shard.h"

/* ==== host weights ==== */

void model_host_weight_free(pd_weight_t *w)
{
    free(w->data);
    free(w->scales);
    free(w->zeros);
    w->data = w->scales = w->zeros = NULL;
}

static pd_status_t model__alloc_host(pd_wfmt_t fmt, int64_t n, int64_t k, pd_weight_t *w)
{
    size_t nd = quant_data_bytes(fmt, n, k), ns = quant_scales_bytes(fmt, n, k),
           nz = quant_zeros_bytes(fmt, n, k);
    memset(w, 0, sizeof *w);
    w->fmt = fmt;
    w->n = n;
    w->k = k;
    w->data = malloc(nd ? nd : 1);
    w->scales = ns ? malloc(ns) : NULL;
    w->zeros = nz ? malloc(nz) : NULL;
    if (!w->data || (ns && !w->scales) || (nz && !w->zeros)) {
        model_host_weight_free(w);
        return PD_ERR_NOMEM;
    }
    return PD_OK;
}

pd_status_t model_quantize_bf16(const uint16_t *src, int64_t n, int64_t k, pd_wfmt_t fmt,
                                pd_weight_t *w_p)
{
    pd_weight_t w;
    pd_status_t st;
    float *rows;
    const int64_t chunk = 256;

    if (fmt == PD_WFMT_INT4 && k % QUANT_INT4_GROUP != 0)
        return PD_ERR_INVALID;
    if ((st = model__alloc_host(fmt, n, k, &w)) != PD_OK)
        return st;
    if (fmt == PD_WFMT_BF16) {
        memcpy(w.data, src, (size_t)(n * k * 2));
        *w_p = w;
        return PD_OK;
    }
    rows = malloc((size_t)(chunk * k) * sizeof *rows);
    if (!rows) {
        model_host_weight_free(&w);
        return PD_ERR_NOMEM;
    }
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
        int64_t nr = n - r0 < chunk ? n - r0 : chunk;
        for (int64_t i = 0; i < nr * k; i++)
            rows[i] = pd_bf16_to_f32(src[r0 * k + i]);
        if (fmt == PD_WFMT_F32)
            memcpy((float *)w.data + r0 * k, rows, (size_t)(nr * k) * 4);
        else if (fmt == PD_WFMT_FP8)
            quant_fp8_rows((uint8_t *)w.data + r0 * k, (float *)w.scales + r0, rows, nr, k);
        else if (fmt == PD_WFMT_FP8_BLOCK) /* chunk is a multiple of the 128-row block */
            quant_fp8_block_rows((uint8_t *)w.data + r0 * k,
                                 (float *)w.scales + r0 / QUANT_FP8_BLOCK * quant_fp8_blocks(k),
                                 rows, nr, k);
        else
            quant_int4_rows((uint8_t *)w.data + r0 * k / 2,
                            (uint16_t *)w.scales + r0 * (k / QUANT_INT4_GROUP),
                            (uint8_t *)w.zeros + r0 * (k / QUANT_INT4_GROUP), rows, nr, k);
    }
    free(rows);
    *w_p = w;
    return PD_OK;
}

/* Converts host weight src (any format) into fmt, 256 rows at a time through f32 (never a whole
 * BF16 copy): e.g. a published fp8 block-scaled weight into int4. */
pd_status_t model__convert(const pd_weight_t *src, pd_wfmt_t fmt, pd_weight_t *w_p)
{
    const int64_t n = src->n, k = src->k, chunk = 256;
    pd_weight_t w;
    pd_status_t st;
    float *rows;

    if (fmt == PD_WFMT_INT4 && k % QUANT_INT4_GROUP != 0)
        return PD_ERR_INVALID;
    if ((st = model__alloc_host(fmt, n, k, &w)) != PD_OK)
        return st;
    if (!(rows = malloc((size_t)(chunk * k) * sizeof *rows))) {
        model_host_weight_free(&w);
        return PD_ERR_NOMEM;
    }
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
        int64_t nr = n - r0 < chunk ? n - r0 : chunk;
        for (int64_t r = 0; r < nr; r++)
            quant_dequant_row(rows + r * k, src, r0 + r);
        if (fmt == PD_WFMT_F32)
            memcpy((float *)w.data + r0 * k, rows, (size_t)(nr * k) * 4);
        else if (fmt == PD_WFMT_BF16)
            for (int64_t i = 0; i < nr * k; i++)
                ((uint16_t *)w.data)[r0 * k + i] = pd_f32_to_bf16(rows[i]);
        else if (fmt == PD_WFMT_FP8)
            quant_fp8_rows((uint8_t *)w.data + r0 * k, (float *)w.scales + r0, rows, nr, k);
        else if (fmt == PD_WFMT_FP8_BLOCK)
            quant_fp8_block_rows((uint8_t *)w.data + r0 * k,
                                 (float *)w.scales + r0 / QUANT_FP8_BLOCK * quant_fp8_blocks(k),
                                 rows, nr, k);
        else
            quant_int4_rows((uint8_t *)w.data + r0 * k / 2,
                            (uint16_t *)w.scales + r0 * (k / QUANT_INT4_GROUP),
                            (uint8_t *)w.zeros + r0 * (k / QUANT_INT4_GROUP), rows, nr, k);
    }
    free(rows);
    *w_p = w;
    return PD_OK;
}

/* A weight of a published fp8 checkpoint (DeepSeek-V3, Kimi K2): base.weight (n, k) e4m3 and
 * base.weight_scale_inv (ceil(n / 128), ceil(k / 128)) f32 (bf16 accepted), w = q * scale_inv.
 * fmt fp8 (or fp8-block) keeps it as stored (PD_WFMT_FP8_BLOCK); another format converts it
 * row-chunk by row-chunk. */
static pd_status_t model__read_fp8_block(const safetensors_t *st, const char *base, int64_t n,
                                         int64_t k, pd_wfmt_t fmt, pd_weight_t *w_p)
{
    char name[300];
    const safetensors_tensor_t *t, *ts;
    int64_t shape[2] = {n, k}, sshape[2] = {quant_fp8_blocks(n), quant_fp8_blocks(k)};
    pd_weight_t w;
    pd_status_t rc;

    snprintf(name, sizeof name, "%s.weight", base);
    if ((rc = safetensors_get(st, name, PD_DTYPE_F8_E4M3, 2, shape, &t)) != PD_OK)
        return rc;
    snprintf(name, sizeof name, "%s.weight_scale_inv", base);
    ts = safetensors_find(st, name);
    if ((rc = safetensors_get(st, name,
                              ts && ts->dtype == PD_DTYPE_BF16 ? PD_DTYPE_BF16 : PD_DTYPE_F32, 2,
                              sshape, &ts)) != PD_OK)
        return rc;
    if ((rc = model__alloc_host(PD_WFMT_FP8_BLOCK, n, k, &w)) != PD_OK)
        return rc;
    memcpy(w.data, t->data, t->nbytes);
    for (int64_t i = 0; i < sshape[0] * sshape[1]; i++)
        ((float *)w.scales)[i] = ts->dtype == PD_DTYPE_F32
                                     ? ((const float *)ts->data)[i]
                                     : pd_bf16_to_f32(((const uint16_t *)ts->data)[i]);
    if (fmt == PD_WFMT_FP8 || fmt == PD_WFMT_FP8_BLOCK) {
        *w_p = w;
        return PD_OK;
    }
    rc = model__convert(&w, fmt, w_p);
    model_host_weight_free(&w);
    if (rc == PD_ERR_INVALID)
        pd_log_error("%s: %s weights need K (%lld) to be a multiple of %d", base, pd_wfmt_name(fmt),
                     (long long)k, QUANT_INT4_GROUP);
    return rc;
}

/* Reads weight `base` (e.g. "model.layers.0.mlp.down_proj") of shape (n, k) in format fmt:
 * as stored when the checkpoint already holds that format, quantized from BF16 otherwise. */
pd_status_t model__read_weight(const safetensors_t *st, const char *base, int64_t n, int64_t k,
                               pd_wfmt_t fmt, pd_weight_t *w_p)
{
    char name[256];
    const safetensors_tensor_t *t, *ts, *tz;
    int64_t shape[2] = {n, k};
    pd_weight_t w;
    pd_status_t rc;

    snprintf(name, sizeof name, "%s.qweight", base);
    if (safetensors_find(st, name)) { /* int4 checkpoint */
        int64_t sq[2] = {n, k / 2}, sg[2] = {n, k / QUANT_INT4_GROUP};
        if (fmt != PD_WFMT_INT4) {
            pd_log_error("%s: checkpoint holds int4 weights; %s weights cannot be made from them",
                         base, pd_wfmt_name(fmt));
            return PD_ERR_UNSUPPORTED;
        }
        if ((rc = safetensors_get(st, name, PD_DTYPE_U8, 2, sq, &t)) != PD_OK)
            return rc;
        snprintf(name, sizeof name, "%s.scales", base);
        if ((rc = safetensors_get(st, name, PD_DTYPE_BF16, 2, sg, &ts)) != PD_OK)
            return rc;
        snprintf(name, sizeof name, "%s.zeros", base);
        if ((rc = safetensors_get(st, name, PD_DTYPE_U8, 2, sg, &tz)) != PD_OK)
            return rc;
        if ((rc = model__alloc_host(fmt, n, k, &w)) != PD_OK)
            return rc;
        memcpy(w.data, t->data, t->nbytes);
        memcpy(w.scales, ts->data, ts->nbytes);
        memcpy(w.zeros, tz->data, tz->nbytes);
        *w_p = w;
        return PD_OK;
    }
    snprintf(name, sizeof name, "%s.weight_scale_inv", base);
    if (safetensors_find(st, name)) /* a published fp8 checkpoint: 128x128 block scales */
        return model__read_fp8_block(st, base, n, k, fmt, w_p);
    snprintf(name, sizeof name, "%s.weight", base);
    t = safetensors_find(st, name);
    if (t && t->dtype == PD_DTYPE_F8_E4M3) { /* fp8 checkpoint */
        int64_t s1[1] = {n};
        if (fmt != PD_WFMT_FP8) {
            pd_log_error("%s: checkpoint holds fp8 weights; %s weights cannot be made from them",
                         base, pd_wfmt_name(fmt));
            return PD_ERR_UNSUPPORTED;
        }
        if ((rc = safetensors_get(st, name, PD_DTYPE_F8_E4M3, 2, shape, &t)) != PD_OK)
            return rc;
        snprintf(name, sizeof name, "%s.weight_scale", base);
        if ((rc = safetensors_get(st, name, PD_DTYPE_F32, 1, s1, &ts)) != PD_OK)
            return rc;
        if ((rc = model__alloc_host(fmt, n, k, &w)) != PD_OK)
            return rc;
        memcpy(w.data, t->data, t->nbytes);
        memcpy(w.scales, ts->data, ts->nbytes);
        *w_p = w;
        return PD_OK;
    }
    if ((rc = safetensors_get(st, name, PD_DTYPE_BF16, 2, shape, &t)) != PD_OK)
        return rc;
    rc = model_quantize_bf16(t->data, n, k, fmt, w_p);
    if (rc == PD_ERR_INVALID)
        pd_log_error("%s: %s weights need K (%lld) to be a multiple of %d", name,
                     pd_wfmt_name(fmt), (long long)k, QUANT_INT4_GROUP);
    return rc;
}

/* Concatenates the rows of a and b (same format and k) into *out (host). */
pd_status_t model__concat_rows(const pd_weight_t *a, const pd_weight_t *b, pd_weight_t *out)
{
    pd_weight_t w;
    pd_status_t st = model__alloc_host(a->fmt, a->n + b->n, a->k, &w);
    size_t da = quant_data_bytes(a->fmt, a->n, a->k), sa = quant_scales_bytes(a->fmt, a->n, a->k),
           za = quant_zeros_bytes(a->fmt, a->n, a->k);
    if (st != PD_OK)
        return st;
    memcpy(w.data, a->data, da);
    memcpy((uint8_t *)w.data + da, b->data, quant_data_bytes(b->fmt, b->n, b->k));
    if (sa) {
        memcpy(w.scales, a->scales, sa);
        memcpy((uint8_t *)w.scales + sa, b->scales, quant_scales_bytes(b->fmt, b->n, b->k));
    }
    if (za) {
        memcpy(w.zeros, a->zeros, za);
        memcpy((uint8_t *)w.zeros + za, b->zeros, quant_zeros_bytes(b->fmt, b->n, b->k));
    }
    *out = w;
    return PD_OK;
}

/* ==== loading onto the backend ==== */

/* Replaces the host weight *h by this rank's shard (nothing to do at TP 1). On failure *h is
 * freed. */
pd_status_t model__shard(const model_t *m, model_split_t split, pd_weight_t *h)
{
    const hf_config_t *c = &m->cfg;
    const int r = m->tp_rank, n = m->tp_size;
    pd_weight_t s;
    pd_status_t st = PD_OK;

    if (n == 1 || split == SPLIT_NONE)
        return PD_OK;
    switch (split) {
    case SPLIT_Q_HEADS:
        st = tp_shard_heads(h, c->num_attention_heads, c->head_dim, r, n, &s);
        break;
    case SPLIT_KV_HEADS:
        st = tp_shard_heads(h, c->num_key_value_heads, c->head_dim, r, n, &s);
        break;
    case SPLIT_COLUMN:
        st = tp_shard_column(h, r, n, &s);
        break;
    case SPLIT_GATE_UP:
        st = tp_shard_gate_up(h, r, n, &s);
        break;
    case SPLIT_ROW:
        st = tp_shard_row(h, r, n, &s);
        break;
    case SPLIT_NONE:
        break;
    }
    model_host_weight_free(h);
    if (st == PD_OK)
        *h = s;
    return st;
}

pd_status_t model__upload(loader_t *ld, pd_weight_t *host, pd_weight_t *dst)
{
    pd_status_t st = backend_weight_upload(ld->m->be, host, dst);
    if (st == PD_OK)
        ld->m->weight_bytes += quant_data_bytes(host->fmt, host->n, host->k) +
                               quant_scales_bytes(host->fmt, host->n, host->k) +
                               quant_zeros_bytes(host->fmt, host->n, host->k);
    model_host_weight_free(host);
    return st;
}

/* reads the whole (n, k) weight `base`, keeps this rank's shard */
pd_status_t model__linear(loader_t *ld, const char *base, int64_t n, int64_t k, pd_wfmt_t fmt,
                          model_split_t split, pd_weight_t *dst)
{
    pd_weight_t h;
    pd_status_t st = model__read_weight(ld->st, base, n, k, fmt, &h);
    if (st != PD_OK)
        return st;
    if ((st = model__shard(ld->m, split, &h)) != PD_OK)
        return st;
    return model__upload(ld, &h, dst);
}

/* gate_proj and up_proj of `prefix` fused into one (2 f, d) weight */
pd_status_t model__gate_up(loader_t *ld, const char *prefix, int64_t f, int64_t d, pd_weight_t *dst)
{
    char name[256];
    pd_weight_t g, u, gu;
    pd_status_t st;

    snprintf(name, sizeof name, "%s.gate_proj", prefix);
    if ((st = model__read_weight(ld->st, name, f, d, ld->m->wfmt, &g)) != PD_OK)
        return st;
    snprintf(name, sizeof name, "%s.up_proj", prefix);
    if ((st = model__read_weight(ld->st, name, f, d, ld->m->wfmt, &u)) != PD_OK) {
        model_host_weight_free(&g);
        return st;
    }
    if (g.fmt != u.fmt || (g.fmt == PD_WFMT_FP8_BLOCK && f % QUANT_FP8_BLOCK != 0)) {
        /* mixed formats (one of them block-scaled fp8), or 128-row scale blocks the fused
         * matrix would not keep: both as per-row fp8 */
        pd_weight_t g8, u8;
        st = model__convert(&g, PD_WFMT_FP8, &g8);
        if (st == PD_OK && (st = model__convert(&u, PD_WFMT_FP8, &u8)) != PD_OK)
            model_host_weight_free(&g8);
        model_host_weight_free(&g);
        model_host_weight_free(&u);
        if (st != PD_OK)
            return st;
        g = g8;
        u = u8;
    }
    st = model__concat_rows(&g, &u, &gu);
    model_host_weight_free(&g);
    model_host_weight_free(&u);
    if (st != PD_OK)
        return st;
    if ((st = model__shard(ld->m, SPLIT_GATE_UP, &gu)) != PD_OK)
        return st;
    return model__upload(ld, &gu, dst);
}

/* a BF16 vector or matrix copied as-is */
pd_status_t model__bf16(loader_t *ld, const char *name, int n_dims, const int64_t *shape,
                        uint16_t **dst_p)
{
    const safetensors_tensor_t *t;
    pd_backend_t *be = ld->m->be;
    void *p;
    pd_status_t st = safetensors_get(ld->st, name, PD_DTYPE_BF16, n_dims, shape, &t);
    if (st != PD_OK)
        return st;
    if ((st = be->ops->alloc(be, t->nbytes, &p)) != PD_OK)
        return st;
    if ((st = be->ops->upload(be, p, t->data, t->nbytes)) != PD_OK) {
        be->ops->free(be, p);
        return st;
    }
    ld->m->weight_bytes += t->nbytes;
    *dst_p = p;
    return PD_OK;
}

static pd_status_t model__layer(loader_t *ld, int i)
{
    model_t *m = ld->m;
    const hf_config_t *c = &m->cfg;
    model_layer_t *L = &m->layers[i];
    const int64_t d = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim,
                  kvd = (int64_t)c->num_key_value_heads * c->head_dim;
    int64_t vd[1] = {d}, vh[1] = {c->head_dim};
    char p[160], name[256];
    pd_status_t st;

#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((st = (x)) != PD_OK)                                                                   \
            return st;                                                                             \
    } while (0)
    if (m->family)
        return model_family_layer_load(ld, i);
    snprintf(p, sizeof p, "model.layers.%d", i);
    snprintf(name, sizeof name, "%s.input_layernorm.weight", p);
    TRY(model__bf16(ld, name, 1, vd, &L->attn_norm));
    snprintf(name, sizeof name, "%s.post_attention_layernorm.weight", p);
    TRY(model__bf16(ld, name, 1, vd, &L->mlp_norm));
    snprintf(name, sizeof name, "%s.self_attn.q_proj", p);
    TRY(model__linear(ld, name, qd, d, m->wfmt, SPLIT_Q_HEADS, &L->q));
    snprintf(name, sizeof name, "%s.self_attn.k_proj", p);
    TRY(model__linear(ld, name, kvd, d, m->wfmt, SPLIT_KV_HEADS, &L->k));
    snprintf(name, sizeof name, "%s.self_attn.v_proj", p);
    TRY(model__linear(ld, name, kvd, d, m->wfmt, SPLIT_KV_HEADS, &L->v));
    snprintf(name, sizeof name, "%s.self_attn.o_proj", p);
    TRY(model__linear(ld, name, d, qd, m->wfmt, SPLIT_ROW, &L->o));
    if (c->arch == HF_ARCH_QWEN3_MOE) {
        snprintf(name, sizeof name, "%s.self_attn.q_norm.weight", p);
        TRY(model__bf16(ld, name, 1, vh, &L->q_norm));
        snprintf(name, sizeof name, "%s.self_attn.k_norm.weight", p);
        TRY(model__bf16(ld, name, 1, vh, &L->k_norm));
    }
    L->moe = hf_config_layer_is_moe(c, i);
    if (!L->moe) {
        snprintf(name, sizeof name, "%s.mlp", p);
        TRY(model__gate_up(ld, name, c->intermediate_size, d, &L->gate_up));
        snprintf(name, sizeof name, "%s.mlp.down_proj", p);
        TRY(model__linear(ld, name, d, c->intermediate_size, m->wfmt, SPLIT_ROW, &L->down));
        return PD_OK;
    }
    snprintf(name, sizeof name, "%s.mlp.gate", p);
    TRY(model__linear(ld, name, c->num_experts, d, PD_WFMT_BF16, SPLIT_NONE, &L->router));
    L->exp_gate_up = calloc((size_t)c->num_experts, sizeof *L->exp_gate_up);
    L->exp_down = calloc((size_t)c->num_experts, sizeof *L->exp_down);
    if (!L->exp_gate_up || !L->exp_down)
        return PD_ERR_NOMEM;
    for (int e = 0; e < c->num_experts; e++) {
        snprintf(name, sizeof name, "%s.mlp.experts.%d", p, e);
        TRY(model__gate_up(ld, name, c->moe_intermediate_size, d, &L->exp_gate_up[e]));
        snprintf(name, sizeof name, "%s.mlp.experts.%d.down_proj", p, e);
        TRY(model__linear(ld, name, d, c->moe_intermediate_size, m->wfmt, SPLIT_ROW,
                          &L->exp_down[e]));
    }
#undef TRY
    return PD_OK;
}

static void model__inv_freq(const hf_config_t *c, float *out)
{
    const int half = c->head_dim / 2;
    for (int j = 0; j < half; j++) {
        double f = 1.0 / pow(c->rope_theta, (double)(2 * j) / (double)c->head_dim);
        if (c->rope_type == 1) { /* llama3 frequency scaling */
            double lo_wl = c->rope_original_max_position / c->rope_low_freq_factor;
            double hi_wl = c->rope_original_max_position / c->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > lo_wl) {
                f = f / c->rope_factor;
            } else if (wl >= hi_wl) {
                double smooth = (c->rope_original_max_position / wl - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        out[j] = (float)f;
    }
}

pd_status_t model_load(const model_load_params_t *p, model_t **m_p)
{
    char path[4096];
    model_t *m = calloc(1, sizeof *m);
    safetensors_t *st = NULL;
    loader_t ld;
    pd_status_t rc;
    int64_t emb[2], vd[1];
    float inv_freq[512];

    if (!m)
        return PD_ERR_NOMEM;
    m->be = p->be;
    m->wfmt = p->wfmt;
    m->lm_head_fmt = p->lm_head_fmt;
    snprintf(path, sizeof path, "%s/config.json", p->dir);
    if ((rc = hf_config_load(path, &m->cfg)) != PD_OK)
        goto err;
    m->family = model_family_arch(&m->cfg);
    if (!m->be->ops->supports_op(m->be, PD_OP_MATMUL, m->wfmt) ||
        (m->wfmt == PD_WFMT_FP8 && strcmp(m->cfg.quant_format, "fp8_block") == 0 &&
         !m->be->ops->supports_op(m->be, PD_OP_MATMUL, PD_WFMT_FP8_BLOCK))) {
        pd_log_error("%s: backend %s cannot multiply %s weights%s", path, m->be->ops->name,
                     pd_wfmt_name(m->wfmt),
                     m->wfmt == PD_WFMT_FP8 ? " (fp8 with 128x128 block scales)" : "");
        rc = PD_ERR_UNSUPPORTED;
        goto err;
    }
    if ((m->cfg.attention_bias && !m->family) || m->cfg.mlp_bias) {
        pd_log_error("%s: attention_bias / mlp_bias models are not supported", path);
        rc = PD_ERR_UNSUPPORTED;
        goto err;
    }
    if (m->cfg.head_dim > 1024 || m->cfg.head_dim % 2) {
        pd_log_error("%s: head_dim %d not supported (even, at most 1024)", path, m->cfg.head_dim);
        rc = PD_ERR_UNSUPPORTED;
        goto err;
    }
    m->comm = p->comm;
    m->tp_rank = tp_comm_rank(p->comm);
    m->tp_size = tp_comm_size(p->comm);
    if (m->tp_size > 1 && (rc = tp_shard_check(&m->cfg, m->wfmt, m->lm_head_fmt, m->tp_size)))
        goto err;
    m->n_heads = m->cfg.num_attention_heads / m->tp_size;
    m->n_kv_heads = m->cfg.num_key_value_heads / m->tp_size;
    m->q_dim = m->n_heads * m->cfg.head_dim;
    m->kv_dim = m->n_kv_heads * m->cfg.head_dim;
    m->ffn = m->cfg.intermediate_size / m->tp_size;
    m->moe_ffn = m->cfg.moe_intermediate_size / m->tp_size;
    m->vocab_local = m->cfg.vocab_size / m->tp_size;
    if (m->family && (rc = model_family_check(m)) != PD_OK)
        goto err;
    if ((rc = safetensors_open_model(p->dir, &st)) != PD_OK)
        goto err;
    ld.m = m;
    ld.st = st;
    m->layers = calloc((size_t)m->cfg.num_hidden_layers, sizeof *m->layers);
    if (!m->layers) {
        rc = PD_ERR_NOMEM;
        goto err;
    }
    emb[0] = m->cfg.vocab_size;
    emb[1] = m->cfg.hidden_size;
    vd[0] = m->cfg.hidden_size;
    if ((rc = model__bf16(&ld, "model.embed_tokens.weight", 2, emb, &m->embed)) != PD_OK)
        goto err;
    if ((rc = model__bf16(&ld, "model.norm.weight", 1, vd, &m->final_norm)) != PD_OK)
        goto err;
    if (!safetensors_find(st, "lm_head.weight") && !safetensors_find(st, "lm_head.qweight") &&
        m->cfg.tie_word_embeddings)
        rc = model__linear(&ld, "model.embed_tokens", emb[0], emb[1], m->lm_head_fmt, SPLIT_COLUMN,
                           &m->lm_head);
    else
        rc = model__linear(&ld, "lm_head", emb[0], emb[1], m->lm_head_fmt, SPLIT_COLUMN,
                           &m->lm_head);
    if (rc != PD_OK)
        goto err;
    for (int i = 0; i < m->cfg.num_hidden_layers; i++) {
        if (p->progress)
            pd_log_progress("loading weights", (size_t)i, (size_t)m->cfg.num_hidden_layers);
        if ((rc = model__layer(&ld, i)) != PD_OK)
            goto err;
    }
    if (p->progress)
        pd_log_progress("loading weights", (size_t)m->cfg.num_hidden_layers,
                        (size_t)m->cfg.num_hidden_layers);
    model__inv_freq(&m->cfg, inv_freq);
    if ((rc = m->be->ops->alloc(m->be, (size_t)m->cfg.head_dim / 2 * 4, (void **)&m->inv_freq)))
        goto err;
    if ((rc = m->be->ops->upload(m->be, m->inv_freq, inv_freq, (size_t)m->cfg.head_dim / 2 * 4)))
        goto err;
    if (m->family && (rc = model_family_rope(m)) != PD_OK)
        goto err;
    safetensors_close(st);
    *m_p = m;
    return PD_OK;
err:
    safetensors_close(st);
    model_destroy(m);
    return rc;
}

static void model__free_ptr(pd_backend_t *be, void *p)
{
    if (p)
        be->ops->free(be, p);
}

void model_destroy(model_t *m)
{
    pd_backend_t *be;
    if (!m)
        return;
    be = m->be;
    model__free_ptr(be, m->embed);
    model__free_ptr(be, m->final_norm);
    model__free_ptr(be, m->inv_freq);
    backend_weight_free(be, &m->lm_head);
    for (int i = 0; m->layers && i < m->cfg.num_hidden_layers; i++) {
        model_layer_t *L = &m->layers[i];
        model__free_ptr(be, L->attn_norm);
        model__free_ptr(be, L->mlp_norm);
        model__free_ptr(be, L->q_norm);
        model__free_ptr(be, L->k_norm);
        backend_weight_free(be, &L->q);
        backend_weight_free(be, &L->k);
        backend_weight_free(be, &L->v);
        backend_weight_free(be, &L->o);
        backend_weight_free(be, &L->gate_up);
        backend_weight_free(be, &L->down);
        backend_weight_free(be, &L->router);
        for (int e = 0; e < m->cfg.num_experts; e++) {
            if (L->exp_gate_up)
                backend_weight_free(be, &L->exp_gate_up[e]);
            if (L->exp_down)
                backend_weight_free(be, &L->exp_down[e]);
        }
        free(L->exp_gate_up);
        free(L->exp_down);
        model_family_layer_free(be, L);
    }
    free(m->layers);
    free(m);
}
