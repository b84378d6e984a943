/* model_random: a decoder with random weights of a given shape (benchmarks, tests): dense
 * (Llama) or Qwen3-MoE, built through the same quantization and upload path as model_load. See
 * model.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "log.h"
#include "model.h"
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
