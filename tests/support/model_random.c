/* model_random: a decoder with random weights of a given shape (benchmarks, tests): dense
 * (Llama), Qwen3-MoE, or GLM-4.5 / DeepSeek-V3, built through the same quantization and upload
 * path as model_load. See model.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "log.h"
#include "model.h"
#include "model_impl.h"
#include "model_random.h"

typedef struct {
    uint64_t s;
} model_random__rng_t;

static float model_random__f32(model_random__rng_t *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (float)((r->s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* Host bf16 (n, k) uniform in [-scale, scale). */
static uint16_t *model_random__bf16(model_random__rng_t *r, int64_t n, int64_t k, float scale)
{
    uint16_t *p = malloc((size_t)(n * k) * 2);
    if (!p)
        return NULL;
    for (int64_t i = 0; i < n * k; i++)
        p[i] = pd_f32_to_bf16(model_random__f32(r) * scale);
    return p;
}

/* A backend copy of host bf16 data (n elements). */
static pd_status_t model_random__upload_bf16(pd_backend_t *be, const uint16_t *src, size_t n,
                                             uint16_t **dst_p)
{
    void *d;
    pd_status_t st = be->ops->alloc(be, n * 2, &d);
    if (st != PD_OK)
        return st;
    if ((st = be->ops->upload(be, d, src, n * 2)) != PD_OK) {
        be->ops->free(be, d);
        return st;
    }
    *dst_p = d;
    return PD_OK;
}

/* One random host weight (n, k) in fmt; every layer shares its values (uploaded per layer). */
static pd_status_t model_random__weight(model_random__rng_t *r, int64_t n, int64_t k, pd_wfmt_t fmt,
                                        pd_weight_t *w_p)
{
    uint16_t *src = model_random__bf16(r, n, k, 1.0f / sqrtf((float)k));
    pd_status_t st;
    if (!src)
        return PD_ERR_NOMEM;
    st = model_quantize_bf16(src, n, k, fmt, w_p);
    free(src);
    return st;
}

pd_status_t model_create_random(const hf_config_t *cfg, pd_wfmt_t wfmt, pd_wfmt_t lm_head_fmt,
                                pd_backend_t *be, uint64_t seed, model_t **m_p)
{
    model_random__rng_t r = {seed ? seed : 1};
    const int64_t d = cfg->hidden_size, f = cfg->intermediate_size, V = cfg->vocab_size;
    pd_weight_t hq = {0}, hk = {0}, hv = {0}, ho = {0}, hgu = {0}, hdown = {0}, hlm = {0};
    uint16_t *norm = NULL, *table = NULL;
    float inv_freq[512];
    pd_status_t st = PD_OK;
    model_t *m;

    const bool moe = cfg->num_experts > 0;
    const int E = moe ? cfg->num_experts : 0;
    const int64_t fm = cfg->moe_intermediate_size;
    /* MoE: MODEL_RANDOM_EXPERT_SETS distinct expert matrices (host quantization is slow), each
     * expert its own device copy of one of them (the memory traffic of distinct experts) */
    enum { MODEL_RANDOM_EXPERT_SETS = 4 };
    pd_weight_t hegu[MODEL_RANDOM_EXPERT_SETS] = {{0}}, hedn[MODEL_RANDOM_EXPERT_SETS] = {{0}},
                hrouter = {0};
    uint16_t *qknorm = NULL;
    if (cfg->head_dim / 2 > 512 || cfg->num_hidden_layers < 1 ||
        (moe && (strcmp(cfg->architecture, "Qwen3MoeForCausalLM") != 0 || fm <= 0 ||
                 cfg->num_experts_per_tok <= 0 || cfg->num_experts_per_tok > E))) {
        pd_log_error("model_random: dense models or Qwen3-MoE, head_dim <= 1024");
        return PD_ERR_UNSUPPORTED;
    }
    if (!(m = calloc(1, sizeof *m)))
        return PD_ERR_NOMEM;
    m->cfg = *cfg;
    m->wfmt = wfmt;
    m->lm_head_fmt = lm_head_fmt;
    m->be = be;
    m->q_dim = cfg->num_attention_heads * cfg->head_dim;
    m->kv_dim = cfg->num_key_value_heads * cfg->head_dim;
    m->n_heads = cfg->num_attention_heads;
    m->n_kv_heads = cfg->num_key_value_heads;
    m->ffn = cfg->intermediate_size;
    m->moe_ffn = cfg->moe_intermediate_size;
    m->vocab_local = cfg->vocab_size;
    m->tp_size = 1;
    if (!(m->layers = calloc((size_t)cfg->num_hidden_layers, sizeof *m->layers))) {
        st = PD_ERR_NOMEM;
        goto err_destroy;
    }
#define TRY(x)                                                                                     \
    if ((st = (x)) != PD_OK)                                                                       \
    goto err_free_host
    TRY(model_random__weight(&r, m->q_dim, d, wfmt, &hq));
    TRY(model_random__weight(&r, m->kv_dim, d, wfmt, &hk));
    TRY(model_random__weight(&r, m->kv_dim, d, wfmt, &hv));
    TRY(model_random__weight(&r, d, m->q_dim, wfmt, &ho));
    if (!moe) {
        TRY(model_random__weight(&r, 2 * f, d, wfmt, &hgu));
        TRY(model_random__weight(&r, d, f, wfmt, &hdown));
    } else {
        for (int i = 0; i < MODEL_RANDOM_EXPERT_SETS; i++) {
            TRY(model_random__weight(&r, 2 * fm, d, wfmt, &hegu[i]));
            TRY(model_random__weight(&r, d, fm, wfmt, &hedn[i]));
        }
        TRY(model_random__weight(&r, E, d, PD_WFMT_BF16, &hrouter));
        if (!(qknorm = malloc((size_t)cfg->head_dim * 2))) {
            st = PD_ERR_NOMEM;
            goto err_free_host;
        }
        for (int64_t i = 0; i < cfg->head_dim; i++)
            qknorm[i] = pd_f32_to_bf16(1.0f + 0.1f * model_random__f32(&r));
    }
    TRY(model_random__weight(&r, V, d, lm_head_fmt, &hlm));
    norm = malloc((size_t)d * 2);
    table = model_random__bf16(&r, V, d, 1.0f);
    if (!norm || !table) {
        st = PD_ERR_NOMEM;
        goto err_free_host;
    }
    for (int64_t i = 0; i < d; i++)
        norm[i] = pd_f32_to_bf16(1.0f + 0.1f * model_random__f32(&r));
    TRY(model_random__upload_bf16(be, table, (size_t)(V * d), &m->embed));
    TRY(model_random__upload_bf16(be, norm, (size_t)d, &m->final_norm));
    TRY(backend_weight_upload(be, &hlm, &m->lm_head));
    for (int i = 0; i < cfg->num_hidden_layers; i++) {
        model_layer_t *L = &m->layers[i];
        TRY(model_random__upload_bf16(be, norm, (size_t)d, &L->attn_norm));
        TRY(model_random__upload_bf16(be, norm, (size_t)d, &L->mlp_norm));
        TRY(backend_weight_upload(be, &hq, &L->q));
        TRY(backend_weight_upload(be, &hk, &L->k));
        TRY(backend_weight_upload(be, &hv, &L->v));
        TRY(backend_weight_upload(be, &ho, &L->o));
        if (!moe) {
            TRY(backend_weight_upload(be, &hgu, &L->gate_up));
            TRY(backend_weight_upload(be, &hdown, &L->down));
            continue;
        }
        L->moe = true;
        TRY(model_random__upload_bf16(be, qknorm, (size_t)cfg->head_dim, &L->q_norm));
        TRY(model_random__upload_bf16(be, qknorm, (size_t)cfg->head_dim, &L->k_norm));
        TRY(backend_weight_upload(be, &hrouter, &L->router));
        L->exp_gate_up = calloc((size_t)E, sizeof *L->exp_gate_up);
        L->exp_down = calloc((size_t)E, sizeof *L->exp_down);
        if (!L->exp_gate_up || !L->exp_down) {
            st = PD_ERR_NOMEM;
            goto err_free_host;
        }
        for (int e = 0; e < E; e++) {
            TRY(backend_weight_upload(be, &hegu[e % MODEL_RANDOM_EXPERT_SETS], &L->exp_gate_up[e]));
            TRY(backend_weight_upload(be, &hedn[e % MODEL_RANDOM_EXPERT_SETS], &L->exp_down[e]));
        }
    }
#undef TRY
    for (int j = 0; j < cfg->head_dim / 2; j++)
        inv_freq[j] = (float)(1.0 / pow(cfg->rope_theta > 0 ? cfg->rope_theta : 10000.0,
                                        (double)(2 * j) / cfg->head_dim));
    if ((st = be->ops->alloc(be, (size_t)cfg->head_dim / 2 * 4, (void **)&m->inv_freq)) != PD_OK ||
        (st = be->ops->upload(be, m->inv_freq, inv_freq, (size_t)cfg->head_dim / 2 * 4)) != PD_OK)
        goto err_free_host;
    m->weight_bytes =
        (size_t)cfg->num_hidden_layers *
            (quant_data_bytes(wfmt, m->q_dim, d) * 2 + quant_data_bytes(wfmt, m->kv_dim, d) * 2 +
             (moe ? (size_t)E *
                            (quant_data_bytes(wfmt, 2 * fm, d) + quant_data_bytes(wfmt, d, fm)) +
                        (size_t)(E * d) * 2
                  : quant_data_bytes(wfmt, 2 * f, d) + quant_data_bytes(wfmt, d, f))) +
        quant_data_bytes(lm_head_fmt, V, d) + (size_t)(V * d) * 2;
    st = be->ops->sync(be);
err_free_host:
    model_host_weight_free(&hq);
    model_host_weight_free(&hk);
    model_host_weight_free(&hv);
    model_host_weight_free(&ho);
    model_host_weight_free(&hgu);
    model_host_weight_free(&hdown);
    model_host_weight_free(&hlm);
    for (int i = 0; i < MODEL_RANDOM_EXPERT_SETS; i++) {
        model_host_weight_free(&hegu[i]);
        model_host_weight_free(&hedn[i]);
    }
    model_host_weight_free(&hrouter);
    free(qknorm);
    free(norm);
    free(table);
    if (st == PD_OK) {
        *m_p = m;
        return PD_OK;
    }
err_destroy:
    model_destroy(m);
    return st;
}

/* ==== GLM-4.5 / DeepSeek-V3 (model_family.c's layers) ==== */

/* As model_random__bf16, but a tensor of more than 4M values repeats its first 4M (the
 * billion-value embeddings and LM heads of these shapes would take seconds to draw one by one;
 * a benchmark's timings do not depend on the values). */
#define MODEL_RANDOM__TILE ((int64_t)4 << 20)
static uint16_t *model_random__bf16_tiled(model_random__rng_t *r, int64_t n, int64_t k, float scale)
{
    const int64_t total = n * k;
    if (total <= MODEL_RANDOM__TILE)
        return model_random__bf16(r, n, k, scale);
    uint16_t *p = malloc((size_t)total * 2);
    if (!p)
        return NULL;
    for (int64_t i = 0; i < MODEL_RANDOM__TILE; i++)
        p[i] = pd_f32_to_bf16(model_random__f32(r) * scale);
    for (int64_t i = MODEL_RANDOM__TILE; i < total; i += MODEL_RANDOM__TILE)
        memcpy(p + i, p,
               (size_t)(total - i < MODEL_RANDOM__TILE ? total - i : MODEL_RANDOM__TILE) * 2);
    return p;
}

static pd_status_t model_random__weight_tiled(model_random__rng_t *r, int64_t n, int64_t k,
                                              pd_wfmt_t fmt, pd_weight_t *w_p)
{
    uint16_t *src = model_random__bf16_tiled(r, n, k, 1.0f / sqrtf((float)k));
    pd_status_t st;
    if (!src)
        return PD_ERR_NOMEM;
    st = model_quantize_bf16(src, n, k, fmt, w_p);
    free(src);
    return st;
}

/* A backend f32 vector of n values uniform in [-scale, scale). */
static pd_status_t model_random__f32vec(model_random__rng_t *r, pd_backend_t *be, int64_t n,
                                        float scale, float **dst_p)
{
    float *h = malloc((size_t)n * 4);
    void *d = NULL;
    pd_status_t st = h ? PD_OK : PD_ERR_NOMEM;
    for (int64_t i = 0; h && i < n; i++)
        h[i] = model_random__f32(r) * scale;
    if (st == PD_OK && (st = be->ops->alloc(be, (size_t)n * 4, &d)) == PD_OK &&
        (st = be->ops->upload(be, d, h, (size_t)n * 4)) != PD_OK)
        be->ops->free(be, d);
    free(h);
    if (st == PD_OK)
        *dst_p = d;
    return st;
}

/* One host weight per distinct shape and format of the model, uploaded into every layer / expert
 * that has it (a small cache: the shapes repeat). */
typedef struct {
    int64_t n, k;
    pd_wfmt_t fmt;
    pd_weight_t w;
} model_random__slot_t;

typedef struct {
    model_random__rng_t *r;
    pd_backend_t *be;
    model_random__slot_t slot[24];
    int n_slots;
    size_t bytes; /* weight bytes uploaded */
} model_random__cache_t;

/* int4 needs K % 128: other K's get fp8 (as model_family.c does for q_b_proj / down_proj) */
static pd_wfmt_t model_random__fmt(pd_wfmt_t fmt, int64_t k)
{
    return fmt == PD_WFMT_INT4 && k % QUANT_INT4_GROUP != 0 ? PD_WFMT_FP8 : fmt;
}

static pd_status_t model_random__put(model_random__cache_t *c, int64_t n, int64_t k, pd_wfmt_t fmt,
                                     pd_weight_t *dst)
{
    pd_status_t st;
    int i;
    fmt = model_random__fmt(fmt, k);
    for (i = 0; i < c->n_slots; i++)
        if (c->slot[i].n == n && c->slot[i].k == k && c->slot[i].fmt == fmt)
            break;
    if (i == c->n_slots) {
        if (c->n_slots == (int)(sizeof c->slot / sizeof c->slot[0]))
            return PD_ERR_NOMEM;
        if ((st = model_random__weight_tiled(c->r, n, k, fmt, &c->slot[i].w)) != PD_OK)
            return st;
        c->slot[i].n = n;
        c->slot[i].k = k;
        c->slot[i].fmt = fmt;
        c->n_slots++;
    }
    if ((st = backend_weight_upload(c->be, &c->slot[i].w, dst)) == PD_OK)
        c->bytes += quant_data_bytes(fmt, n, k) + quant_scales_bytes(fmt, n, k) +
                    quant_zeros_bytes(fmt, n, k);
    return st;
}

pd_status_t model_create_random_family(const hf_config_t *cfg, pd_wfmt_t wfmt,
                                       pd_wfmt_t lm_head_fmt, pd_backend_t *be, uint64_t seed,
                                       model_t **m_p)
{
    model_random__rng_t r = {seed ? seed : 1};
    model_random__cache_t wc = {&r, be, {{0}}, 0, 0};
    const int64_t d = cfg->hidden_size, V = cfg->vocab_size, H = cfg->num_attention_heads;
    const int64_t E = cfg->num_experts, fm = cfg->moe_intermediate_size;
    const int64_t fs = fm * cfg->n_shared_experts;
    const bool mla = hf_config_is_mla(cfg);
    uint16_t *norm = NULL, *table = NULL, *uk = NULL, *uv = NULL;
    pd_status_t st = PD_OK;
    model_t *m;

    if (!model_family_arch(cfg) || cfg->num_hidden_layers < 1 || d > 16384) {
        pd_log_error("model_random: family models are GLM-4.5 / DeepSeek-V3 configs");
        return PD_ERR_UNSUPPORTED;
    }
    if (!(m = calloc(1, sizeof *m)))
        return PD_ERR_NOMEM;
    m->cfg = *cfg;
    m->wfmt = wfmt;
    m->lm_head_fmt = lm_head_fmt;
    m->be = be;
    m->family = true;
    m->q_dim = cfg->num_attention_heads * cfg->head_dim;
    m->kv_dim = cfg->num_key_value_heads * cfg->head_dim;
    m->n_heads = cfg->num_attention_heads;
    m->n_kv_heads = cfg->num_key_value_heads;
    m->ffn = cfg->intermediate_size;
    m->moe_ffn = cfg->moe_intermediate_size;
    m->vocab_local = cfg->vocab_size;
    m->tp_size = 1;
    if (!(m->layers = calloc((size_t)cfg->num_hidden_layers, sizeof *m->layers))) {
        st = PD_ERR_NOMEM;
        goto out;
    }
#define TRY(x)                                                                                     \
    if ((st = (x)) != PD_OK)                                                                       \
    goto out
    /* norm weights of every length used: d, q_lora_rank, kv_lora_rank, head_dim */
    int64_t nn = d;
    const int64_t lens[3] = {cfg->q_lora_rank, cfg->kv_lora_rank, cfg->head_dim};
    for (int i = 0; i < 3; i++)
        nn = lens[i] > nn ? lens[i] : nn;
    norm = malloc((size_t)nn * 2);
    table = model_random__bf16_tiled(&r, V, d, 1.0f);
    if (!norm || !table) {
        st = PD_ERR_NOMEM;
        goto out;
    }
    for (int64_t i = 0; i < nn; i++)
        norm[i] = pd_f32_to_bf16(1.0f + 0.1f * model_random__f32(&r));
    TRY(model_random__upload_bf16(be, table, (size_t)(V * d), &m->embed));
    TRY(model_random__upload_bf16(be, norm, (size_t)d, &m->final_norm));
    TRY(model_random__put(&wc, V, d, lm_head_fmt, &m->lm_head));
    if (mla) {
        const int64_t rk = cfg->kv_lora_rank, nope = cfg->qk_nope_head_dim, v = cfg->v_head_dim;
        uk = model_random__bf16_tiled(&r, H * rk, nope, 1.0f / sqrtf((float)nope));
        uv = model_random__bf16_tiled(&r, H * v, rk, 1.0f / sqrtf((float)rk));
        if (!uk || !uv) {
            st = PD_ERR_NOMEM;
            goto out;
        }
    }
    for (int i = 0; i < cfg->num_hidden_layers; i++) {
        model_layer_t *L = &m->layers[i];
        TRY(model_random__upload_bf16(be, norm, (size_t)d, &L->attn_norm));
        TRY(model_random__upload_bf16(be, norm, (size_t)d, &L->mlp_norm));
        if (mla) {
            const int64_t rk = cfg->kv_lora_rank, rope = cfg->qk_rope_head_dim,
                          qk = cfg->qk_nope_head_dim + rope, v = cfg->v_head_dim,
                          qr = cfg->q_lora_rank;
            if (qr > 0) {
                TRY(model_random__put(&wc, qr, d, wfmt, &L->q_a));
                TRY(model_random__upload_bf16(be, norm, (size_t)qr, &L->q_a_norm));
                TRY(model_random__put(&wc, H * qk, qr, wfmt, &L->q));
            } else {
                TRY(model_random__put(&wc, H * qk, d, wfmt, &L->q));
            }
            TRY(model_random__put(&wc, rk, d, wfmt, &L->kv_a));
            TRY(model_random__put(&wc, rope, d, wfmt, &L->kv_pe));
            TRY(model_random__upload_bf16(be, norm, (size_t)rk, &L->kv_a_norm));
            TRY(model_random__upload_bf16(be, uk, (size_t)(H * rk * cfg->qk_nope_head_dim),
                                          &L->w_uk_t));
            TRY(model_random__upload_bf16(be, uv, (size_t)(H * v * rk), &L->w_uv));
            TRY(model_random__put(&wc, d, H * v, wfmt, &L->o));
        } else {
            TRY(model_random__put(&wc, m->q_dim, d, wfmt, &L->q));
            TRY(model_random__put(&wc, m->kv_dim, d, wfmt, &L->k));
            TRY(model_random__put(&wc, m->kv_dim, d, wfmt, &L->v));
            TRY(model_random__put(&wc, d, m->q_dim, wfmt, &L->o));
            if (cfg->attention_bias) {
                TRY(model_random__f32vec(&r, be, m->q_dim, 0.1f, &L->q_bias));
                TRY(model_random__f32vec(&r, be, m->kv_dim, 0.1f, &L->k_bias));
                TRY(model_random__f32vec(&r, be, m->kv_dim, 0.1f, &L->v_bias));
            }
            if (cfg->use_qk_norm) {
                TRY(model_random__upload_bf16(be, norm, (size_t)cfg->head_dim, &L->q_norm));
                TRY(model_random__upload_bf16(be, norm, (size_t)cfg->head_dim, &L->k_norm));
            }
        }
        L->moe = hf_config_layer_is_moe(cfg, i);
        if (!L->moe) {
            TRY(model_random__put(&wc, 2 * (int64_t)cfg->intermediate_size, d, wfmt, &L->gate_up));
            TRY(model_random__put(&wc, d, cfg->intermediate_size, wfmt, &L->down));
            continue;
        }
        TRY(model_random__put(&wc, E, d, PD_WFMT_BF16, &L->router));
        TRY(model_random__f32vec(&r, be, E, 0.01f, &L->router_bias));
        L->exp_gate_up = calloc((size_t)E, sizeof *L->exp_gate_up);
        L->exp_down = calloc((size_t)E, sizeof *L->exp_down);
        if (!L->exp_gate_up || !L->exp_down) {
            st = PD_ERR_NOMEM;
            goto out;
        }
        for (int64_t e = 0; e < E; e++) {
            TRY(model_random__put(&wc, 2 * fm, d, wfmt, &L->exp_gate_up[e]));
            TRY(model_random__put(&wc, d, fm, wfmt, &L->exp_down[e]));
        }
        if (fs > 0) {
            TRY(model_random__put(&wc, 2 * fs, d, wfmt, &L->sh_gate_up));
            TRY(model_random__put(&wc, d, fs, wfmt, &L->sh_down));
        }
    }
#undef TRY
    m->weight_bytes = wc.bytes + (size_t)(V * d) * 2;
    if ((st = model_family_rope(m)) == PD_OK)
        st = be->ops->sync(be);
out:
    for (int i = 0; i < wc.n_slots; i++)
        model_host_weight_free(&wc.slot[i].w);
    free(norm);
    free(table);
    free(uk);
    free(uv);
    if (st == PD_OK) {
        *m_p = m;
        return PD_OK;
    }
    model_destroy(m);
    return st;
}
