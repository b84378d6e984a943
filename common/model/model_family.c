/* GLM-4.5 and DeepSeek-V3 / Kimi K2: weights and forward (see model_family.h). */
#include "model_family.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "log.h"
#include "tp_shard.h"

bool model_family_arch(const hf_config_t *cfg)
{
    return cfg->arch == HF_ARCH_GLM4_MOE || cfg->arch == HF_ARCH_DEEPSEEK_V3;
}

pd_status_t model_family_check(const model_t *m)
{
    const pd_backend_ops_t *o = m->be->ops;
    static const pd_op_t ops[] = {PD_OP_BIAS_ADD,    PD_OP_ROPE_PARTIAL, PD_OP_MOE_ROUTE_GROUPED,
                                  PD_OP_HEAD_MATMUL, PD_OP_LATENT_WRITE, PD_OP_LATENT_ATTENTION};
    bool have = o->bias_add && o->rope_partial && o->moe_route_grouped && o->head_matmul &&
                o->latent_write && o->latent_attention;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0] && have; i++)
        have = o->supports_op(m->be, ops[i], m->wfmt);
    if (!have) {
        pd_log_error("%s: backend %s has no kernels for this architecture yet (GLM-4.5 / "
                     "DeepSeek-V3 ops); run it on the cpu backend",
                     m->cfg.architecture, o->name);
        return PD_ERR_UNSUPPORTED;
    }
    if (m->tp_size > 1 && hf_config_is_mla(&m->cfg)) {
        /* MLA under TP: heads split (q_b_proj rows, W_UK / W_UV, o_proj columns), the latent
         * (q_a_proj, kv_a_proj_with_mqa) replicated; o_proj's K is heads * v_head_dim */
        const hf_config_t *c = &m->cfg;
        const int hv = c->num_attention_heads / m->tp_size * c->v_head_dim;
        if (c->num_attention_heads % m->tp_size != 0 ||
            (m->wfmt == PD_WFMT_INT4 && hv % QUANT_INT4_GROUP != 0)) {
            pd_log_error("tp %d: %d attention heads (o_proj shards of %d columns) do not split "
                         "for MLA",
                         m->tp_size, c->num_attention_heads, hv);
            return PD_ERR_INVALID;
        }
    }
    return PD_OK;
}

/* ==== loading ==== */

#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((st = (x)) != PD_OK)                                                                   \
            return st;                                                                             \
    } while (0)

/* A vector tensor (bf16 or f32) of n values, uploaded as f32. */
static pd_status_t fam__f32vec(loader_t *ld, const char *name, int64_t n, float **dst_p)
{
    const safetensors_tensor_t *t = safetensors_find(ld->st, name);
    int64_t shape[1] = {n};
    pd_backend_t *be = ld->m->be;
    float *h;
    void *p;
    pd_status_t st;

    if ((st = safetensors_get(ld->st, name,
                              t && t->dtype == PD_DTYPE_F32 ? PD_DTYPE_F32 : PD_DTYPE_BF16, 1,
                              shape, &t)) != PD_OK)
        return st;
    if (!(h = malloc((size_t)n * 4)))
        return PD_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++)
        h[i] = t->dtype == PD_DTYPE_F32 ? ((const float *)t->data)[i]
                                        : pd_bf16_to_f32(((const uint16_t *)t->data)[i]);
    if ((st = be->ops->alloc(be, (size_t)n * 4, &p)) == PD_OK &&
        (st = be->ops->upload(be, p, h, (size_t)n * 4)) != PD_OK)
        be->ops->free(be, p);
    free(h);
    if (st == PD_OK) {
        ld->m->weight_bytes += (size_t)n * 4;
        *dst_p = p;
    }
    return st;
}

/* This rank's share of a vector of n values (bias of a head-split projection: values
 * [rank n / size, (rank + 1) n / size)), uploaded as f32. */
static pd_status_t fam__f32vec_shard(loader_t *ld, const char *name, int64_t n, float **dst_p)
{
    const model_t *m = ld->m;
    pd_backend_t *be = m->be;
    float *whole = NULL;
    pd_status_t st;
    if (m->tp_size == 1)
        return fam__f32vec(ld, name, n, dst_p);
    if ((st = fam__f32vec(ld, name, n, &whole)) != PD_OK)
        return st;
    const int64_t nl = n / m->tp_size;
    void *p = NULL;
    if ((st = be->ops->alloc(be, (size_t)nl * 4, &p)) == PD_OK) {
        if ((st = be->ops->copy(be, p, whole + (size_t)m->tp_rank * (size_t)nl, (size_t)nl * 4)) ==
            PD_OK)
            st = be->ops->sync(be);
        if (st != PD_OK)
            be->ops->free(be, p);
    }
    be->ops->free(be, whole);
    if (st == PD_OK) {
        ld->m->weight_bytes -= (size_t)(n - nl) * 4;
        *dst_p = p;
    }
    return st;
}

/* Host weight of rows [r0, r0 + nr) of src (any format; for fp8-block r0 and nr must be on
 * 128-row block boundaries, or nr reach the end). */
static pd_status_t fam__rows(const pd_weight_t *src, int64_t r0, int64_t nr, pd_weight_t *dst_p)
{
    const int64_t k = src->k;
    pd_weight_t w = {src->fmt, nr, k, NULL, NULL, NULL};
    const size_t nd = quant_data_bytes(src->fmt, nr, k), ns = quant_scales_bytes(src->fmt, nr, k),
                 nz = quant_zeros_bytes(src->fmt, nr, k);
    /* the byte offsets of row r0: scales of the block format are per 128 rows */
    const size_t od = quant_data_bytes(src->fmt, r0, k),
                 os = src->fmt == PD_WFMT_FP8_BLOCK
                          ? (size_t)(r0 / QUANT_FP8_BLOCK * quant_fp8_blocks(k) * 4)
                          : quant_scales_bytes(src->fmt, r0, k),
                 oz = quant_zeros_bytes(src->fmt, r0, k);

    PD_ASSERT(src->fmt != PD_WFMT_FP8_BLOCK || r0 % QUANT_FP8_BLOCK == 0);
    w.data = malloc(nd ? nd : 1);
    w.scales = ns ? malloc(ns) : NULL;
    w.zeros = nz ? malloc(nz) : NULL;
    if (!w.data || (ns && !w.scales) || (nz && !w.zeros)) {
        model_host_weight_free(&w);
        return PD_ERR_NOMEM;
    }
    memcpy(w.data, (const uint8_t *)src->data + od, nd);
    if (ns)
        memcpy(w.scales, (const uint8_t *)src->scales + os, ns);
    if (nz)
        memcpy(w.zeros, (const uint8_t *)src->zeros + oz, nz);
    *dst_p = w;
    return PD_OK;
}

/* The format a checkpoint stores weight `base` in (pdserve int4 / fp8, or bf16). */
static pd_wfmt_t fam__stored_fmt(const safetensors_t *st, const char *base)
{
    char name[300];
    const safetensors_tensor_t *t;
    snprintf(name, sizeof name, "%s.qweight", base);
    if (safetensors_find(st, name))
        return PD_WFMT_INT4;
    snprintf(name, sizeof name, "%s.weight", base);
    t = safetensors_find(st, name);
    return t && t->dtype == PD_DTYPE_F8_E4M3 ? PD_WFMT_FP8 : PD_WFMT_BF16;
}

/* The format weight `base` of k columns is kept in: the model's, except int4 for a K that is not
 * a multiple of 128 (e.g. q_b_proj of a q_lora_rank that is not; the published models' 1536 is),
 * which becomes fp8. */
static pd_wfmt_t fam__fmt(const loader_t *ld, const char *base, int64_t k)
{
    if (ld->m->wfmt == PD_WFMT_INT4 && k % QUANT_INT4_GROUP != 0 &&
        fam__stored_fmt(ld->st, base) != PD_WFMT_INT4) {
        pd_log_info("%s: K %lld is not a multiple of %d; fp8 instead of int4", base, (long long)k,
                    QUANT_INT4_GROUP);
        return PD_WFMT_FP8;
    }
    return ld->m->wfmt;
}

/* Splits the (n, k) weight `base` by rows into [0, n0) and [n0, n), uploaded. A block-scaled
 * fp8 weight cut inside a 128-row block is re-quantized per row (fp8, one scale per row). */
static pd_status_t fam__split(loader_t *ld, const char *base, int64_t n, int64_t n0, int64_t k,
                              pd_weight_t *a, pd_weight_t *b)
{
    pd_weight_t whole, ha, hb;
    pd_status_t st = model__read_weight(ld->st, base, n, k, fam__fmt(ld, base, k), &whole);

    if (st != PD_OK)
        return st;
    if (whole.fmt == PD_WFMT_FP8_BLOCK && n0 % QUANT_FP8_BLOCK != 0) {
        pd_weight_t rows;
        pd_log_info("%s: split at row %lld inside a 128-row scale block; per-row fp8", base,
                    (long long)n0);
        st = model__convert(&whole, PD_WFMT_FP8, &rows);
        model_host_weight_free(&whole);
        if (st != PD_OK)
            return st;
        whole = rows;
    }
    if ((st = fam__rows(&whole, 0, n0, &ha)) == PD_OK &&
        (st = fam__rows(&whole, n0, n - n0, &hb)) != PD_OK)
        model_host_weight_free(&ha);
    model_host_weight_free(&whole);
    if (st != PD_OK)
        return st;
    if ((st = model__upload(ld, &ha, a)) != PD_OK) {
        model_host_weight_free(&hb);
        return st;
    }
    return model__upload(ld, &hb, b);
}

/* kv_b_proj (H (nope + v), r) into the absorbed per-head matrices: w_uk_t (H, r, nope) and
 * w_uv (H, v, r), bf16 (exact for a BF16 checkpoint; a quantized one is dequantized). */
static pd_status_t fam__kv_b(loader_t *ld, const char *base, model_layer_t *L)
{
    const hf_config_t *c = &ld->m->cfg;
    const int64_t H = c->num_attention_heads, nope = c->qk_nope_head_dim, v = c->v_head_dim,
                  r = c->kv_lora_rank;
    pd_backend_t *be = ld->m->be;
    pd_weight_t w;
    /* TP: this rank's heads [h0, h0 + Hl) */
    const int64_t Hl = H / ld->m->tp_size, h0 = (int64_t)ld->m->tp_rank * Hl;
    float *row = malloc((size_t)r * sizeof *row);
    uint16_t *uk = malloc((size_t)(Hl * r * nope) * 2), *uv = malloc((size_t)(Hl * v * r) * 2);
    pd_status_t st = row && uk && uv ? PD_OK : PD_ERR_NOMEM;

    if (st == PD_OK)
        st = model__read_weight(ld->st, base, H * (nope + v), r, fam__stored_fmt(ld->st, base), &w);
    if (st == PD_OK) {
        for (int64_t h = 0; h < Hl; h++)
            for (int64_t i = 0; i < nope + v; i++) {
                quant_dequant_row(row, &w, (h0 + h) * (nope + v) + i);
                for (int64_t j = 0; j < r; j++) {
                    if (i < nope)
                        uk[(h * r + j) * nope + i] = pd_f32_to_bf16(row[j]);
                    else
                        uv[(h * v + (i - nope)) * r + j] = pd_f32_to_bf16(row[j]);
                }
            }
        model_host_weight_free(&w);
    }
    size_t nuk = (size_t)(Hl * r * nope) * 2, nuv = (size_t)(Hl * v * r) * 2;
    if (st == PD_OK && (st = be->ops->alloc(be, nuk, (void **)&L->w_uk_t)) == PD_OK)
        st = be->ops->upload(be, L->w_uk_t, uk, nuk);
    if (st == PD_OK && (st = be->ops->alloc(be, nuv, (void **)&L->w_uv)) == PD_OK)
        st = be->ops->upload(be, L->w_uv, uv, nuv);
    if (st == PD_OK)
        ld->m->weight_bytes += nuk + nuv;
    free(row);
    free(uk);
    free(uv);
    return st;
}

/* The (n_heads * per_head, k) weight `base`, this rank's heads (TP; all of them at TP 1). */
static pd_status_t fam__linear_heads(loader_t *ld, const char *base, int n_heads, int per_head,
                                     int64_t k, pd_wfmt_t fmt, pd_weight_t *dst)
{
    const model_t *m = ld->m;
    pd_weight_t h, s;
    pd_status_t st = model__read_weight(ld->st, base, (int64_t)n_heads * per_head, k, fmt, &h);
    if (st != PD_OK || m->tp_size == 1)
        return st == PD_OK ? model__upload(ld, &h, dst) : st;
    if (h.fmt == PD_WFMT_FP8_BLOCK) { /* head rows need not fall on 128-row scale blocks */
        pd_weight_t rows;
        st = model__convert(&h, PD_WFMT_FP8, &rows);
        model_host_weight_free(&h);
        if (st != PD_OK)
            return st;
        h = rows;
    }
    st = tp_shard_heads(&h, n_heads, per_head, m->tp_rank, m->tp_size, &s);
    model_host_weight_free(&h);
    return st == PD_OK ? model__upload(ld, &s, dst) : st;
}

static pd_status_t fam__mla(loader_t *ld, const char *p, model_layer_t *L)
{
    model_t *m = ld->m;
    const hf_config_t *c = &m->cfg;
    const int64_t d = c->hidden_size, H = c->num_attention_heads, nope = c->qk_nope_head_dim,
                  rope = c->qk_rope_head_dim, r = c->kv_lora_rank, qr = c->q_lora_rank;
    char name[256];
    pd_status_t st;

    if (qr > 0) {
        int64_t vq[1] = {qr};
        snprintf(name, sizeof name, "%s.self_attn.q_a_proj", p);
        TRY(model__linear(ld, name, qr, d, m->wfmt, SPLIT_NONE, &L->q_a));
        snprintf(name, sizeof name, "%s.self_attn.q_a_layernorm.weight", p);
        TRY(model__bf16(ld, name, 1, vq, &L->q_a_norm));
        snprintf(name, sizeof name, "%s.self_attn.q_b_proj", p);
        TRY(fam__linear_heads(ld, name, (int)H, (int)(nope + rope), qr, fam__fmt(ld, name, qr),
                              &L->q));
    } else {
        snprintf(name, sizeof name, "%s.self_attn.q_proj", p);
        TRY(fam__linear_heads(ld, name, (int)H, (int)(nope + rope), d, m->wfmt, &L->q));
    }
    int64_t vr[1] = {r};
    snprintf(name, sizeof name, "%s.self_attn.kv_a_proj_with_mqa", p);
    TRY(fam__split(ld, name, r + rope, r, d, &L->kv_a, &L->kv_pe));
    snprintf(name, sizeof name, "%s.self_attn.kv_a_layernorm.weight", p);
    TRY(model__bf16(ld, name, 1, vr, &L->kv_a_norm));
    snprintf(name, sizeof name, "%s.self_attn.kv_b_proj", p);
    TRY(fam__kv_b(ld, name, L));
    snprintf(name, sizeof name, "%s.self_attn.o_proj", p);
    TRY(model__linear(ld, name, d, H * c->v_head_dim, m->wfmt, SPLIT_ROW, &L->o));
    return PD_OK;
}

static pd_status_t fam__gqa(loader_t *ld, const char *p, model_layer_t *L)
{
    model_t *m = ld->m;
    const hf_config_t *c = &m->cfg;
    const int64_t d = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim,
                  kvd = (int64_t)c->num_key_value_heads * c->head_dim;
    int64_t vh[1] = {c->head_dim};
    char name[256];
    pd_status_t st;

    /* TP: q / k / v by heads (their biases likewise), o_proj by columns (model.h) */
    snprintf(name, sizeof name, "%s.self_attn.q_proj", p);
    TRY(model__linear(ld, name, qd, d, m->wfmt, SPLIT_Q_HEADS, &L->q));
    snprintf(name, sizeof name, "%s.self_attn.k_proj", p);
    TRY(model__linear(ld, name, kvd, d, m->wfmt, SPLIT_KV_HEADS, &L->k));
    snprintf(name, sizeof name, "%s.self_attn.v_proj", p);
    TRY(model__linear(ld, name, kvd, d, m->wfmt, SPLIT_KV_HEADS, &L->v));
    snprintf(name, sizeof name, "%s.self_attn.o_proj", p);
    TRY(model__linear(ld, name, d, qd, m->wfmt, SPLIT_ROW, &L->o));
    if (c->attention_bias) {
        snprintf(name, sizeof name, "%s.self_attn.q_proj.bias", p);
        TRY(fam__f32vec_shard(ld, name, qd, &L->q_bias));
        snprintf(name, sizeof name, "%s.self_attn.k_proj.bias", p);
        TRY(fam__f32vec_shard(ld, name, kvd, &L->k_bias));
        snprintf(name, sizeof name, "%s.self_attn.v_proj.bias", p);
        TRY(fam__f32vec_shard(ld, name, kvd, &L->v_bias));
    }
    if (c->use_qk_norm) {
        snprintf(name, sizeof name, "%s.self_attn.q_norm.weight", p);
        TRY(model__bf16(ld, name, 1, vh, &L->q_norm));
        snprintf(name, sizeof name, "%s.self_attn.k_norm.weight", p);
        TRY(model__bf16(ld, name, 1, vh, &L->k_norm));
    }
    return PD_OK;
}

pd_status_t model_family_layer_load(loader_t *ld, int i)
{
    model_t *m = ld->m;
    const hf_config_t *c = &m->cfg;
    model_layer_t *L = &m->layers[i];
    const int64_t d = c->hidden_size;
    int64_t vd[1] = {d};
    char p[160], name[256];
    pd_status_t st;

    snprintf(p, sizeof p, "model.layers.%d", i);
    snprintf(name, sizeof name, "%s.input_layernorm.weight", p);
    TRY(model__bf16(ld, name, 1, vd, &L->attn_norm));
    snprintf(name, sizeof name, "%s.post_attention_layernorm.weight", p);
    TRY(model__bf16(ld, name, 1, vd, &L->mlp_norm));
    TRY(hf_config_is_mla(c) ? fam__mla(ld, p, L) : fam__gqa(ld, p, L));
    L->moe = hf_config_layer_is_moe(c, i);
    if (!L->moe) {
        snprintf(name, sizeof name, "%s.mlp", p);
        TRY(model__gate_up(ld, name, c->intermediate_size, d, &L->gate_up));
        snprintf(name, sizeof name, "%s.mlp.down_proj", p);
        /* GLM-4.5-Air's intermediate_size 10944 is not a multiple of 128: fp8 when int4 */
        TRY(model__linear(ld, name, d, c->intermediate_size,
                          fam__fmt(ld, name, c->intermediate_size), SPLIT_ROW, &L->down));
        return PD_OK;
    }
    snprintf(name, sizeof name, "%s.mlp.gate", p);
    TRY(model__linear(ld, name, c->num_experts, d, PD_WFMT_BF16, SPLIT_NONE, &L->router));
    snprintf(name, sizeof name, "%s.mlp.gate.e_score_correction_bias", p);
    TRY(fam__f32vec(ld, name, c->num_experts, &L->router_bias));
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
    if (c->n_shared_experts > 0) {
        int64_t fs = (int64_t)c->moe_intermediate_size * c->n_shared_experts;
        snprintf(name, sizeof name, "%s.mlp.shared_experts", p);
        TRY(model__gate_up(ld, name, fs, d, &L->sh_gate_up));
        snprintf(name, sizeof name, "%s.mlp.shared_experts.down_proj", p);
        TRY(model__linear(ld, name, d, fs, m->wfmt, SPLIT_ROW, &L->sh_down));
    }
#undef TRY
    return PD_OK;
}

void model_family_layer_free(pd_backend_t *be, model_layer_t *L)
{
    void *ptrs[] = {L->q_bias,   L->k_bias,    L->v_bias, L->router_bias,
                    L->q_a_norm, L->kv_a_norm, L->w_uk_t, L->w_uv};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i])
            be->ops->free(be, ptrs[i]);
    L->q_bias = L->k_bias = L->v_bias = L->router_bias = NULL;
    L->q_a_norm = L->kv_a_norm = L->w_uk_t = L->w_uv = NULL;
    backend_weight_free(be, &L->sh_gate_up);
    backend_weight_free(be, &L->sh_down);
    backend_weight_free(be, &L->q_a);
    backend_weight_free(be, &L->kv_a);
    backend_weight_free(be, &L->kv_pe);
}

/* ==== RoPE ==== */

/* yarn's mscale (transformers' get_mscale / yarn_get_mscale) */
static double fam__mscale(double scale, double mscale)
{
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* transformers' _compute_yarn_parameters for dim rotary dims (inv_freq (dim / 2)) */
static double fam__yarn(const hf_config_t *c, int dim, float *inv_freq)
{
    const double base = c->rope_theta, factor = c->rope_factor;
    const double omax = c->rope_original_max_position;
    double low = floor(dim * log(omax / (c->rope_beta_fast * 2 * M_PI)) / (2 * log(base)));
    double high = ceil(dim * log(omax / (c->rope_beta_slow * 2 * M_PI)) / (2 * log(base)));
    low = low > 0 ? low : 0;
    high = high < dim - 1 ? high : dim - 1;
    if (low == high)
        high += 0.001;
    for (int j = 0; j < dim / 2; j++) {
        float pos_freq = powf((float)base, (float)(2 * j) / (float)dim);
        float extra = 1.0f / pos_freq, inter = 1.0f / ((float)factor * pos_freq);
        float ramp = (float)(((double)j - low) / (high - low));
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float extra_factor = 1.0f - ramp;
        inv_freq[j] = inter * (1.0f - extra_factor) + extra * extra_factor;
    }
    if (c->rope_mscale > 0 && c->rope_mscale_all_dim > 0)
        return fam__mscale(factor, c->rope_mscale) / fam__mscale(factor, c->rope_mscale_all_dim);
    return fam__mscale(factor, 1.0);
}

pd_status_t model_family_rope(model_t *m)
{
    const hf_config_t *c = &m->cfg;
    const int dim = c->rotary_dim;
    float inv_freq[2048];
    pd_status_t st;

    PD_ASSERT(dim / 2 <= 2048);
    m->rope_scale = 1.0f;
    if (c->rope_type == HF_ROPE_YARN) {
        m->rope_scale = (float)fam__yarn(c, dim, inv_freq);
    } else {
        for (int j = 0; j < dim / 2; j++)
            inv_freq[j] = (float)(1.0 / pow(c->rope_theta, (double)(2 * j) / (double)dim));
    }
    if (hf_config_is_mla(c)) {
        double s = 1.0 / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim));
        if (c->rope_type == HF_ROPE_YARN && c->rope_mscale_all_dim > 0) {
            double ms = fam__mscale(c->rope_factor, c->rope_mscale_all_dim);
            s *= ms * ms;
        }
        m->attn_scale = (float)s;
    } else {
        m->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    }
    if (m->inv_freq)
        m->be->ops->free(m->be, m->inv_freq);
    m->inv_freq = NULL;
    if ((st = m->be->ops->alloc(m->be, (size_t)dim / 2 * 4, (void **)&m->inv_freq)) != PD_OK)
        return st;
    return m->be->ops->upload(m->be, m->inv_freq, inv_freq, (size_t)dim / 2 * 4);
}

/* ==== forward ==== */

struct model_family_scratch {
    int cap;
    /* MLA (n rows): qa (qr), q (H (nope + rope)), ckv (r), kpe (rope), qlat, olat (H r),
     * att (H v); shared experts: sgu (2 fs), sact (fs), sout (d) */
    float *qa, *q, *ckv, *kpe, *qlat, *olat, *att, *sgu, *sact, *sout;
};

void model_family_scratch_free(model_family_scratch_t **sp, pd_backend_t *be)
{
    model_family_scratch_t *s = *sp;
    if (!s)
        return;
    float **bufs[] = {&s->qa,   &s->q,   &s->ckv, &s->kpe,  &s->qlat,
                      &s->olat, &s->att, &s->sgu, &s->sact, &s->sout};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (*bufs[i])
            be->ops->free(be, *bufs[i]);
    free(s);
    *sp = NULL;
}

pd_status_t model_family_reserve(model_family_scratch_t **sp, const model_t *m, int n)
{
    const hf_config_t *c = &m->cfg;
    pd_backend_t *be = m->be;
    const size_t N = (size_t)n, H = (size_t)c->num_attention_heads, r = (size_t)c->kv_lora_rank;
    const size_t fs = (size_t)c->moe_intermediate_size * (size_t)c->n_shared_experts;
    model_family_scratch_t *s;
    pd_status_t st = PD_OK;

    if (*sp && (*sp)->cap >= n)
        return PD_OK;
    if (!(s = calloc(1, sizeof *s)))
        return PD_ERR_NOMEM;
#define A(ptr, count)                                                                              \
    if (st == PD_OK && (count) > 0)                                                                \
    st = be->ops->alloc(be, N * (count)*4, (void **)&(ptr))
    A(s->qa, (size_t)c->q_lora_rank);
    A(s->q, H * (size_t)(c->qk_nope_head_dim + c->qk_rope_head_dim));
    A(s->ckv, r);
    A(s->kpe, (size_t)c->qk_rope_head_dim);
    A(s->qlat, H * r);
    A(s->olat, H * r);
    A(s->att, H * (size_t)c->v_head_dim);
    A(s->sgu, 2 * fs);
    A(s->sact, fs);
    A(s->sout, (size_t)c->hidden_size);
#undef A
    if (st != PD_OK) {
        model_family_scratch_free(&s, be);
        pd_log_error("model: cannot allocate family scratch for %d tokens", n);
        return st;
    }
    s->cap = n;
    model_family_scratch_free(sp, be);
    *sp = s;
    return PD_OK;
}

/* GQA attention with biases, optional q/k norm and partial RoPE (GLM-4.5): into b->attn */
static void fam__gqa_forward(const model_t *m, const model_layer_t *L, const model_family_bufs_t *b,
                             void *arena, const kv_layout_t *l, int li, int n,
                             const pd_attn_batch_t *ab)
{
    const hf_config_t *c = &m->cfg;
    pd_backend_t *be = m->be;
    const pd_backend_ops_t *o = be->ops;
    const int H = m->n_heads, KVH = m->n_kv_heads, D = c->head_dim; /* this rank's heads */
    const float eps = (float)c->rms_norm_eps;

    o->matmul(be, b->q, b->h, &L->q, n);
    o->matmul(be, b->k, b->h, &L->k, n);
    o->matmul(be, b->v, b->h, &L->v, n);
    if (L->q_bias) {
        o->bias_add(be, b->q, L->q_bias, n, H * D);
        o->bias_add(be, b->k, L->k_bias, n, KVH * D);
        o->bias_add(be, b->v, L->v_bias, n, KVH * D);
    }
    if (L->q_norm) {
        o->rmsnorm(be, b->q, b->q, L->q_norm, n * H, D, eps);
        o->rmsnorm(be, b->k, b->k, L->k_norm, n * KVH, D, eps);
    }
    o->rope_partial(be, b->q, b->d_pos, m->inv_freq, n, H, D, c->rotary_dim, c->rope_interleave,
                    m->rope_scale);
    o->rope_partial(be, b->k, b->d_pos, m->inv_freq, n, KVH, D, c->rotary_dim, c->rope_interleave,
                    m->rope_scale);
    o->kv_write(be, arena, l, li, b->k, b->v, b->d_slots, n);
    o->attention(be, b->attn, b->q, arena, l, li, ab, H);
}

/* Multi-head Latent Attention, absorbed (DeepSeek-V3): into s->att (n, H, v) */
static void fam__mla_forward(model_family_scratch_t *s, const model_t *m, const model_layer_t *L,
                             const model_family_bufs_t *b, void *arena, const kv_layout_t *l,
                             int li, int n, const pd_attn_batch_t *ab)
{
    const hf_config_t *c = &m->cfg;
    pd_backend_t *be = m->be;
    const pd_backend_ops_t *o = be->ops;
    const int H = m->n_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim,
              r = c->kv_lora_rank, qk = nope + rope; /* H: this rank's heads */
    const float eps = (float)c->rms_norm_eps;
    const float *qsrc = b->h;

    if (c->q_lora_rank > 0) {
        o->matmul(be, s->qa, b->h, &L->q_a, n);
        o->rmsnorm(be, s->qa, s->qa, L->q_a_norm, n, c->q_lora_rank, eps);
        qsrc = s->qa;
    }
    o->matmul(be, s->q, qsrc, &L->q, n); /* (n, H, [nope | rope]) */
    o->matmul(be, s->ckv, b->h, &L->kv_a, n);
    o->rmsnorm(be, s->ckv, s->ckv, L->kv_a_norm, n, r, eps);
    o->matmul(be, s->kpe, b->h, &L->kv_pe, n);
    o->rope_partial(be, s->q + nope, b->d_pos, m->inv_freq, n, H, qk, rope, c->rope_interleave,
                    m->rope_scale);
    o->rope_partial(be, s->kpe, b->d_pos, m->inv_freq, n, 1, rope, rope, c->rope_interleave,
                    m->rope_scale);
    o->latent_write(be, arena, l, li, s->ckv, s->kpe, b->d_slots, n, r);
    o->head_matmul(be, s->qlat, s->q, L->w_uk_t, n, H, r, nope, qk);
    o->latent_attention(be, s->olat, s->qlat, s->q + nope, arena, l, li, ab, H, r, qk,
                        m->attn_scale);
    o->head_matmul(be, s->att, s->olat, L->w_uv, n, H, c->v_head_dim, r, r);
}

/* the MLP block on b->h into b->tmp: dense, or routed experts plus shared experts */
static void fam__mlp(model_family_scratch_t *s, const model_t *m, const model_layer_t *L,
                     const model_family_bufs_t *b, int n)
{
    const hf_config_t *c = &m->cfg;
    pd_backend_t *be = m->be;
    const pd_backend_ops_t *o = be->ops;
    const int d = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;

    /* TP: this rank's FFN rows (m->ffn, m->moe_ffn); the partial sums are all-reduced after */
    if (!L->moe) {
        o->matmul(be, b->gu, b->h, &L->gate_up, n);
        o->silu_mul(be, b->act, b->gu, n, m->ffn);
        o->matmul(be, b->tmp, b->act, &L->down, n);
        return;
    }
    o->matmul(be, b->rlogits, b->h, &L->router, n);
    o->moe_route_grouped(be, b->mids, b->mw, b->rlogits, L->router_bias, n, E, K, c->n_group,
                         c->topk_group, c->norm_topk_prob, (float)c->routed_scaling_factor);
    o->moe_experts(be, b->tmp, b->h, b->mids, b->mw, L->exp_gate_up, L->exp_down, n, K, d,
                   m->moe_ffn);
    if (c->n_shared_experts > 0) {
        int fs = m->moe_ffn * c->n_shared_experts;
        o->matmul(be, s->sgu, b->h, &L->sh_gate_up, n);
        o->silu_mul(be, s->sact, s->sgu, n, fs);
        o->matmul(be, s->sout, s->sact, &L->sh_down, n);
        o->add(be, b->tmp, s->sout, (size_t)n * d);
    }
}

/* TP: sums this rank's partial x (n) over the ranks (nothing at TP 1) */
static pd_status_t fam__all_reduce(const model_t *m, float *x, size_t n)
{
    return m->tp_size > 1 ? tp_comm_all_reduce_sum(m->comm, x, n) : PD_OK;
}

pd_status_t model_family_layers(model_family_scratch_t *s, const model_t *m,
                                const model_family_bufs_t *b, void *arena, const kv_layout_t *l,
                                int n, const pd_attn_batch_t *ab)
{
    const hf_config_t *c = &m->cfg;
    pd_backend_t *be = m->be;
    const pd_backend_ops_t *o = be->ops;
    const int d = c->hidden_size;
    const float eps = (float)c->rms_norm_eps;
    const bool mla = hf_config_is_mla(c);

    pd_status_t st;
    PD_ASSERT(mla ? l->n_sides == 1 && l->head_dim == c->kv_lora_rank + c->qk_rope_head_dim
                  : l->n_sides == 2 && l->n_kv_heads == m->n_kv_heads);
    for (int li = 0; li < c->num_hidden_layers; li++) {
        const model_layer_t *L = &m->layers[li];
        o->rmsnorm(be, b->h, b->x, L->attn_norm, n, d, eps);
        if (mla)
            fam__mla_forward(s, m, L, b, arena, l, li, n, ab);
        else
            fam__gqa_forward(m, L, b, arena, l, li, n, ab);
        o->matmul(be, b->tmp, mla ? s->att : b->attn, &L->o, n);
        if ((st = fam__all_reduce(m, b->tmp, (size_t)n * d)) != PD_OK)
            return st;
        o->add(be, b->x, b->tmp, (size_t)n * d);
        o->rmsnorm(be, b->h, b->x, L->mlp_norm, n, d, eps);
        fam__mlp(s, m, L, b, n);
        if ((st = fam__all_reduce(m, b->tmp, (size_t)n * d)) != PD_OK)
            return st;
        o->add(be, b->x, b->tmp, (size_t)n * d);
    }
    return PD_OK;
}
