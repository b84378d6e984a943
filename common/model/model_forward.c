/* model_forward: the forward pass over the backend ops table (see model.h), and the graph path
 * for decode-only batches (bucketed, captured once per shape, replayed). Under tensor parallelism
 * the same code runs on every rank over its shards, with three collectives: all-reduce after
 * o_proj, after down_proj / the MoE experts, and an all-gather of the logits (no graphs then). */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "model.h"
#include "model_family.h"
#include "tp_comm.h"

/* one captured decode step: the forward, and either the logits left for download (logits) or
 * the sampling of model_forward_sample (sample: ents entries of logits processing, 0 none; lp:
 * logprobs) */
typedef struct {
    int batch, pages;
    bool logits, sample, lp;
    int ents;
    const void *arena; /* captured pointers: the arena and the context's buffers */
    void *graph;
} model_graph_t;

#define MODEL_GRAPH_CACHE 64

struct model_ctx {
    const model_t *m;
    pd_backend_t *be;
    int cap_tokens, cap_seqs, cap_bt, cap_logits;
    /* activations (backend memory), sized for cap_tokens rows */
    float *x, *h, *q, *k, *v, *attn, *tmp, *gu, *act, *rlogits, *mw, *lrows, *logits;
    int32_t *mids;
    /* FP8 activations made by the fused ops for the FP8 matmuls (fwd__norm, fwd__silu):
     * (cap_tokens, max(hidden, ffn)) fp8 and (cap_tokens) scales */
    uint8_t *aq;
    float *as;
    /* index arrays (backend memory) and their host staging */
    int32_t *d_tokens, *d_pos, *d_slots, *d_qstart, *d_ctx, *d_bt;
    int32_t *h_pos, *h_slots, *h_bt;
    float *glogits; /* (tp_size, n_logits, vocab_local): gathered logits, TP > 1 only */
    float *flogits; /* (n_logits, vocab): glogits in row order for device sampling, TP > 1 */
    /* device sampling (model_forward_sample), sized for cap_logits rows: per-row parameters,
     * the tokens, the logprobs (n, 1 + SAMPLER_MAX_TOP_LOGPROBS) ids / values; their host
     * staging in one block (hs); processing entries (cap_ent) and the processed copy of the
     * logits (plogits, cap_plogits rows) grow on demand */
    float *d_temp, *d_topp, *d_u, *d_pen, *d_lpv;
    int32_t *d_topk, *d_ntop, *d_stok, *d_lpi;
    void *hs;
    float *h_temp, *h_topp, *h_u, *h_pen, *h_lpv;
    int32_t *h_topk, *h_ntop, *h_lpi;
    int32_t *d_ent, *h_ent;
    float *d_bias, *h_bias;
    int cap_ent;
    float *plogits;
    int cap_plogits;
    model_family_scratch_t *fam; /* GLM-4.5 / DeepSeek-V3 only (model_family.h) */
    model_layer_fn layer_fn;     /* model_ctx_set_layer_hook */
    void *layer_arg;
    /* every MoE layer's experts registered with the backend (ops->moe_prepare): its
     * moe_experts needs no host, so MoE steps can be captured too */
    bool moe_dev;
    /* graph path: mode, captured steps, host staging of the padded index arrays */
    model_graphs_t graphs;
    model_graph_t cache[MODEL_GRAPH_CACHE];
    int n_graphs;
    int32_t g_tok[MODEL_GRAPH_MAX_BATCH], g_qs[MODEL_GRAPH_MAX_BATCH + 1],
        g_ctx[MODEL_GRAPH_MAX_BATCH];
};

/* Frees every captured graph (they point into buffers about to move). */
static void ctx__drop_graphs(model_ctx_t *c)
{
    for (int i = 0; i < c->n_graphs; i++)
        c->be->ops->graph_free(c->be, c->cache[i].graph);
    c->n_graphs = 0;
}

static void ctx__free_bufs(model_ctx_t *c)
{
    ctx__drop_graphs(c);
    void **bufs[] = {
        (void **)&c->x,       (void **)&c->h,        (void **)&c->q,        (void **)&c->k,
        (void **)&c->v,       (void **)&c->attn,     (void **)&c->tmp,      (void **)&c->gu,
        (void **)&c->act,     (void **)&c->rlogits,  (void **)&c->mw,       (void **)&c->mids,
        (void **)&c->aq,      (void **)&c->as,       (void **)&c->lrows,    (void **)&c->logits,
        (void **)&c->glogits, (void **)&c->flogits,  (void **)&c->d_temp,   (void **)&c->d_topp,
        (void **)&c->d_u,     (void **)&c->d_pen,    (void **)&c->d_lpv,    (void **)&c->d_topk,
        (void **)&c->d_ntop,  (void **)&c->d_stok,   (void **)&c->d_lpi,    (void **)&c->d_ent,
        (void **)&c->d_bias,  (void **)&c->plogits,  (void **)&c->d_tokens, (void **)&c->d_pos,
        (void **)&c->d_slots, (void **)&c->d_qstart, (void **)&c->d_ctx,    (void **)&c->d_bt};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i])
            c->be->ops->free(c->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    model_family_scratch_free(&c->fam, c->be);
    free(c->h_pos);
    free(c->h_slots);
    free(c->h_bt);
    free(c->hs);
    free(c->h_ent);
    free(c->h_bias);
    c->h_pos = c->h_slots = c->h_bt = NULL;
    c->hs = NULL;
    c->h_ent = NULL;
    c->h_bias = NULL;
    c->cap_tokens = c->cap_seqs = c->cap_bt = c->cap_logits = c->cap_ent = c->cap_plogits = 0;
}

static pd_status_t ctx__alloc(model_ctx_t *c, void **p, size_t bytes)
{
    return c->be->ops->alloc(c->be, bytes, p);
}

/* Grows scratch to hold n tokens, s sequences, bt block-table entries and nl logit rows. */
static pd_status_t ctx__reserve(model_ctx_t *c, int n, int s, int bt, int nl)
{
    const hf_config_t *cfg = &c->m->cfg;
    int f = cfg->intermediate_size > cfg->moe_intermediate_size ? cfg->intermediate_size
                                                                : cfg->moe_intermediate_size;
    size_t d = (size_t)cfg->hidden_size, qd = (size_t)c->m->q_dim, kvd = (size_t)c->m->kv_dim;
    size_t E = (size_t)(cfg->num_experts > 0 ? cfg->num_experts : 1);
    size_t K = (size_t)(cfg->num_experts_per_tok > 0 ? cfg->num_experts_per_tok : 1);
    pd_status_t st = PD_OK;

    if (n <= c->cap_tokens && s <= c->cap_seqs && bt <= c->cap_bt && nl <= c->cap_logits)
        return PD_OK;
    n = n > c->cap_tokens ? n : c->cap_tokens;
    s = s > c->cap_seqs ? s : c->cap_seqs;
    bt = bt > c->cap_bt ? bt : c->cap_bt;
    nl = nl > c->cap_logits ? nl : c->cap_logits;
    ctx__free_bufs(c);
    size_t N = (size_t)n;
#define A(ptr, bytes)                                                                              \
    if (st == PD_OK)                                                                               \
    st = ctx__alloc(c, (void **)&(ptr), (bytes))
    A(c->x, N * d * 4);
    A(c->h, N * d * 4);
    A(c->q, N * qd * 4);
    A(c->k, N * kvd * 4);
    A(c->v, N * kvd * 4);
    A(c->attn, N * qd * 4);
    A(c->tmp, N * d * 4);
    A(c->gu, N * 2 * (size_t)f * 4);
    A(c->act, N * (size_t)f * 4);
    A(c->rlogits, N * E * 4);
    A(c->mw, N * K * 4);
    A(c->mids, N * K * 4);
    /* FP8 activations per row, or in 1x128 blocks (backend.h pd_act_fp8_t: up to 16 rows more,
     * one scale per row and block), or the f16 image of up to PD_ACT_WG_MAX_N rows */
    const size_t dm = d > (size_t)f ? d : (size_t)f, nb = (N + 16) * ((dm + 127) / 128);
    const size_t wgb = 2 * (size_t)PD_ACT_WG_ROWS(N < PD_ACT_WG_MAX_N ? N : PD_ACT_WG_MAX_N) * dm;
    A(c->aq, (N + 16) * dm > wgb ? (N + 16) * dm : wgb);
    A(c->as, (nb > N ? nb : N) * 4);
    A(c->lrows, (size_t)nl * d * 4);
    A(c->logits, (size_t)nl * (size_t)c->m->vocab_local * 4);
    if (c->m->tp_size > 1) {
        A(c->glogits, (size_t)nl * (size_t)cfg->vocab_size * 4);
        A(c->flogits, (size_t)nl * (size_t)cfg->vocab_size * 4);
    }
    const size_t NL = (size_t)nl, LW = 1 + SAMPLER_MAX_TOP_LOGPROBS;
    A(c->d_temp, NL * 4);
    A(c->d_topp, NL * 4);
    A(c->d_u, NL * 4);
    A(c->d_pen, NL * 3 * 4);
    A(c->d_lpv, NL * LW * 4);
    A(c->d_topk, NL * 4);
    A(c->d_ntop, NL * 4);
    A(c->d_stok, NL * 4);
    A(c->d_lpi, NL * LW * 4);
    A(c->d_tokens, N * 4);
    A(c->d_pos, N * 4);
    A(c->d_slots, N * 4);
    A(c->d_qstart, ((size_t)s + 1) * 4);
    A(c->d_ctx, (size_t)s * 4);
    A(c->d_bt, (size_t)bt * 4);
#undef A
    c->h_pos = malloc(N * 4);
    c->h_slots = malloc(N * 4);
    c->h_bt = malloc((size_t)bt * 4);
    /* host staging of the sampling arrays: 8 + 2 * LW words per row */
    c->hs = malloc(NL * (8 + 2 * LW) * 4);
    if (c->hs) {
        float *f = c->hs;
        c->h_temp = f;
        c->h_topp = f + NL;
        c->h_u = f + 2 * NL;
        c->h_pen = f + 3 * NL; /* (NL, 3) */
        c->h_lpv = f + 6 * NL; /* (NL, LW) */
        c->h_topk = (int32_t *)(f + 6 * NL + NL * LW);
        c->h_ntop = c->h_topk + NL;
        c->h_lpi = c->h_ntop + NL; /* (NL, LW) */
    }
    if (st == PD_OK && (!c->h_pos || !c->h_slots || !c->h_bt || !c->hs))
        st = PD_ERR_NOMEM;
    if (st == PD_OK && c->m->family)
        st = model_family_reserve(&c->fam, c->m, n);
    if (st != PD_OK) {
        pd_log_error("model: cannot allocate scratch for %d tokens", n);
        ctx__free_bufs(c);
        return st;
    }
    c->cap_tokens = n;
    c->cap_seqs = s;
    c->cap_bt = bt;
    c->cap_logits = nl;
    return PD_OK;
}

pd_status_t model_ctx_create(const model_t *m, model_ctx_t **ctx_p)
{
    model_ctx_t *c = calloc(1, sizeof *c);
    if (!c)
        return PD_ERR_NOMEM;
    c->m = m;
    c->be = m->be;
    /* MoE layers (Qwen3-MoE, and the GLM-4.5 / DeepSeek-V3 family, whose grouped top-k routing
     * runs on the device too: ops->moe_route_grouped): the backend's grouped expert path, where
     * it has one; FP8 block-scaled experts (DeepSeek-V3's own checkpoints) stay host-grouped */
    bool any_moe = false;
    c->moe_dev = m->be->ops->moe_prepare != NULL;
    for (int i = 0; i < m->cfg.num_hidden_layers && c->moe_dev; i++) {
        const model_layer_t *L = &m->layers[i];
        if (!L->moe)
            continue;
        any_moe = true;
        pd_status_t st =
            m->be->ops->moe_prepare(m->be, L->exp_gate_up, L->exp_down, m->cfg.num_experts);
        if (st == PD_ERR_INVALID) {
            pd_log_info("model: layer %d: experts stay on the host-grouped path", i);
            c->moe_dev = false;
        } else if (st != PD_OK) {
            free(c);
            return st;
        }
    }
    c->moe_dev = c->moe_dev && any_moe;
    model_ctx_set_graphs(c, MODEL_GRAPHS_ON);
    *ctx_p = c;
    return PD_OK;
}

model_graphs_t model_ctx_set_graphs(model_ctx_t *c, model_graphs_t mode)
{
    bool can = c->be->ops->graph_begin != NULL;
    for (int i = 0; i < c->m->cfg.num_hidden_layers && can && !c->moe_dev; i++)
        can = !c->m->layers[i].moe;
    ctx__drop_graphs(c);
    c->graphs = can ? mode : MODEL_GRAPHS_OFF;
    return c->graphs;
}

bool model_ctx_set_layer_hook(model_ctx_t *c, model_layer_fn fn, void *arg)
{
    if (fn && (c->m->family || c->m->tp_size > 1))
        return false;
    c->layer_fn = fn;
    c->layer_arg = arg;
    return true;
}

model_graphs_t model_ctx_graphs(const model_ctx_t *c)
{
    return c->graphs;
}

void model_ctx_destroy(model_ctx_t *ctx)
{
    if (!ctx)
        return;
    ctx__free_bufs(ctx);
    free(ctx);
}

/* TP: sums this rank's partial x (n) over the ranks (nothing at TP 1) */
static pd_status_t fwd__all_reduce(model_ctx_t *c, float *x, size_t n)
{
    return c->m->tp_size > 1 ? tp_comm_all_reduce_sum(c->m->comm, x, n) : PD_OK;
}

/* The LM head's logits (n_logits, vocab_local) of every rank into logits_out (n_logits, vocab). */
static pd_status_t fwd__logits(model_ctx_t *c, int n_logits, float *logits_out)
{
    pd_backend_t *be = c->be;
    const size_t vl = (size_t)c->m->vocab_local, nl = (size_t)n_logits;
    pd_status_t st;

    if (c->m->tp_size == 1)
        return be->ops->download(be, logits_out, c->logits, nl * vl * 4);
    if ((st = tp_comm_all_gather(c->m->comm, c->glogits, c->logits, nl * vl)) != PD_OK)
        return st;
    /* glogits is (rank, row, vocab_local); logits_out is (row, rank * vocab_local + v) */
    for (int r = 0; r < c->m->tp_size; r++)
        for (size_t i = 0; i < nl; i++)
            if ((st = be->ops->download(be, logits_out + i * vl * (size_t)c->m->tp_size + r * vl,
                                        c->glogits + ((size_t)r * nl + i) * vl, vl * 4)) != PD_OK)
                return st;
    return PD_OK;
}

/* How w's matmul on n rows takes its activations: PD_ACT_FP8_ROW / PD_ACT_FP8_BLK as matmul_fp8
 * on the FP8 activations the fused ops make (backend.h act_quant: FP8 weights per row, the CUDA
 * backend's W4A8 INT4 GEMMs in 1x128 blocks), PD_ACT_F32 as matmul on the f32 ones. */
static pd_act_t fwd__act(const model_ctx_t *c, const pd_weight_t *w, int n)
{
    const pd_backend_ops_t *o = c->be->ops;
    if (!o->matmul_fp8 || !o->add_rmsnorm || !o->silu_mul_fp8)
        return PD_ACT_F32;
    if (o->act_quant)
        return o->act_quant(c->be, w, n);
    return w->fmt == PD_WFMT_FP8 ? PD_ACT_FP8_ROW : PD_ACT_F32;
}

/* The FP8 activations c->aq / c->as in format a (not PD_ACT_F32) */
static pd_act_fp8_t fwd__aq(const model_ctx_t *c, pd_act_t a)
{
    pd_act_fp8_t q = {c->aq, c->as, a == PD_ACT_FP8_BLK, a == PD_ACT_F16WG, a == PD_ACT_F16};
    return q;
}

/* x += res (res != NULL: the residual the previous layer left pending), then c->h = rmsnorm(x) *
 * w; quant != PD_ACT_F32: the only readers are matmul_fp8 on activations in that format
 * (fwd__act), so only the FP8 activations c->aq / c->as are made (c->h is not written). One fused
 * op where the backend has it. */
static void fwd__norm(model_ctx_t *c, const float *res, const uint16_t *w, int n, pd_act_t quant)
{
    pd_backend_t *be = c->be;
    const int d = c->m->cfg.hidden_size;
    const float eps = (float)c->m->cfg.rms_norm_eps;
    pd_act_fp8_t q = fwd__aq(c, quant);
    if (be->ops->add_rmsnorm) {
        be->ops->add_rmsnorm(be, c->x, res, quant ? NULL : c->h, w, n, d, eps, quant ? &q : NULL);
        return;
    }
    if (res)
        be->ops->add(be, c->x, res, (size_t)n * d);
    be->ops->rmsnorm(be, c->h, c->x, w, n, d, eps);
}

/* c->act = silu_mul(c->gu), or (quant, see fwd__norm) only its FP8 activations */
static void fwd__silu(model_ctx_t *c, int n, int f, pd_act_t quant)
{
    pd_act_fp8_t q = fwd__aq(c, quant);
    if (quant)
        c->be->ops->silu_mul_fp8(c->be, NULL, c->gu, n, f, &q);
    else
        c->be->ops->silu_mul(c->be, c->act, c->gu, n, f);
}

/* out = x @ w^T; quant: x's FP8 activations in that format are in c->aq / c->as (fwd__norm,
 * fwd__silu) */
static void fwd__mm(model_ctx_t *c, float *out, const float *x, pd_act_t quant,
                    const pd_weight_t *w, int n)
{
    pd_act_fp8_t q = fwd__aq(c, quant);
    if (quant)
        c->be->ops->matmul_fp8(c->be, out, &q, w, n);
    else
        c->be->ops->matmul(c->be, out, x, w, n);
}

/* Whether layer L runs its matmuls with the small ops folded in (backend.h matmul_fused): the
 * backend takes all six of its dense weights at n (q, k, v and gate_up after a norm, o and down
 * on their inputs as they are), one rank (the residual add happens in the o and down matmuls,
 * before any all-reduce could). */
static bool fwd__fused(const model_ctx_t *c, const model_layer_t *L, int n)
{
    const pd_backend_ops_t *o = c->be->ops;
    pd_backend_t *be = c->be;
    const pd_pro_t nrm = PD_PRO_RMSNORM, as_is = PD_PRO_NONE;
    const pd_epi_t st = PD_EPI_NONE, acc = PD_EPI_ACC;
    return c->m->tp_size == 1 && !L->moe && o->matmul_fused && o->matmul_fused_ok &&
           o->matmul_fused_ok(be, &L->q, n, nrm, st) && o->matmul_fused_ok(be, &L->k, n, nrm, st) &&
           o->matmul_fused_ok(be, &L->v, n, nrm, st) &&
           o->matmul_fused_ok(be, &L->o, n, as_is, acc) &&
           o->matmul_fused_ok(be, &L->gate_up, n, nrm, st) &&
           o->matmul_fused_ok(be, &L->down, n, as_is, acc);
}

/* Enqueues the whole step for n rows: embedding, layers, and (n_logits > 0) the final norm and
 * LM head over x rows logit_rows (NULL: rows 0 .. n_logits - 1) into c->logits. Index arrays are
 * already in c->d_*; nothing here waits for the device except the TP collectives. Returns PD_OK or
 * a collective's error. */
static pd_status_t ctx__enqueue(model_ctx_t *c, void *arena, const kv_layout_t *l, int n,
                                const pd_attn_batch_t *ab, int n_logits, const int32_t *logit_rows)
{
    const model_t *m = c->m;
    const hf_config_t *cfg = &m->cfg;
    pd_backend_t *be = c->be;
    const pd_backend_ops_t *o = be->ops;
    const int d = cfg->hidden_size, H = m->n_heads, KVH = m->n_kv_heads, D = cfg->head_dim;
    const float eps = (float)cfg->rms_norm_eps;
    pd_status_t st;

    PD_ASSERT(m->family || l->n_kv_heads == KVH);
    o->embed(be, c->x, m->embed, c->d_tokens, n, d);
    const float *res = NULL; /* the layer output not yet added to x (fused into the next norm) */
    if (m->family) {
        model_family_bufs_t fb = {c->x,  c->h,   c->tmp,     c->q,  c->k,    c->v,     c->attn,
                                  c->gu, c->act, c->rlogits, c->mw, c->mids, c->d_pos, c->d_slots};
        if ((st = model_family_layers(c->fam, m, &fb, arena, l, n, ab)) != PD_OK)
            return st;
    }
    for (int li = 0; !m->family && li < cfg->num_hidden_layers; li++) {
        const model_layer_t *L = &m->layers[li];
        /* fused: the norms, SiLU·mul and residual adds inside the matmuls (fwd__fused); x then
         * holds the whole residual stream at the end of each layer */
        const bool fused = fwd__fused(c, L, n);
        /* q, k and v quantized once where all three take the same FP8 activations */
        const pd_act_t aq = fused ? PD_ACT_F32 : fwd__act(c, &L->q, n);
        const pd_act_t qkv8 =
            fwd__act(c, &L->k, n) == aq && fwd__act(c, &L->v, n) == aq ? aq : PD_ACT_F32;
        float *qkv_outs[3] = {c->q, c->k, c->v};
        const pd_weight_t *qkv_ws[3] = {&L->q, &L->k, &L->v};
        if (fused) {
            if (res) /* the previous layer ran plain: its output joins x first */
                o->add(be, c->x, res, (size_t)n * d);
            res = NULL;
            o->matmul_fused(be, qkv_outs, c->x, PD_PRO_RMSNORM, L->attn_norm, eps, qkv_ws, 3, n,
                            PD_EPI_NONE);
        } else {
            fwd__norm(c, res, L->attn_norm, n, qkv8);
        }
        if (!fused && qkv8 && qkv8 != PD_ACT_F16WG && qkv8 != PD_ACT_F16 && !L->q_norm &&
            o->qkv_rope_write) {
            /* one op: q, k, v GEMMs + rope + KV */
            pd_act_fp8_t q = fwd__aq(c, qkv8);
            o->qkv_rope_write(be, c->q, c->k, c->v, &q, &L->q, &L->k, &L->v, c->d_pos, m->inv_freq,
                              n, H, arena, l, li, c->d_slots);
        } else {
            if (fused) {
                /* q, k, v made above */
            } else if (!qkv8 && o->matmul_group) { /* q, k, v in one pass where the backend can */
                o->matmul_group(be, qkv_outs, c->h, qkv_ws, 3, n);
            } else if (qkv8 && o->matmul_group_fp8) { /* the same on the fused ops' activations */
                pd_act_fp8_t q = fwd__aq(c, qkv8);
                o->matmul_group_fp8(be, qkv_outs, &q, qkv_ws, 3, n);
            } else {
                fwd__mm(c, c->q, c->h, qkv8, &L->q, n);
                fwd__mm(c, c->k, c->h, qkv8, &L->k, n);
                fwd__mm(c, c->v, c->h, qkv8, &L->v, n);
            }
            if (L->q_norm) {
                o->rmsnorm(be, c->q, c->q, L->q_norm, n * H, D, eps);
                o->rmsnorm(be, c->k, c->k, L->k_norm, n * KVH, D, eps);
            }
            if (o->rope_kv_write) {
                o->rope_kv_write(be, c->q, c->k, c->v, c->d_pos, m->inv_freq, n, H, arena, l, li,
                                 c->d_slots);
            } else {
                o->rope(be, c->q, c->d_pos, m->inv_freq, n, H, D);
                o->rope(be, c->k, c->d_pos, m->inv_freq, n, KVH, D);
                o->kv_write(be, arena, l, li, c->k, c->v, c->d_slots, n);
            }
        }
        if (c->layer_fn)
            c->layer_fn(c->layer_arg, li);
        o->attention(be, c->attn, c->q, arena, l, li, ab, H);
        if (fused) { /* x += attn @ o^T; x += silu_mul(rmsnorm(x) @ gate_up^T) @ down^T */
            float *xo = c->x, *guo = c->gu, *ao = c->act;
            const pd_weight_t *wo = &L->o, *wgu = &L->gate_up, *wdn = &L->down;
            const pd_pro_t nrm = PD_PRO_RMSNORM;
            o->matmul_fused(be, &xo, c->attn, PD_PRO_NONE, NULL, 0.0f, &wo, 1, n, PD_EPI_ACC);
            if (o->matmul_fused_ok(be, wgu, n, nrm, PD_EPI_SILU_MUL)) { /* SiLU·mul in gate_up */
                o->matmul_fused(be, &ao, c->x, nrm, L->mlp_norm, eps, &wgu, 1, n, PD_EPI_SILU_MUL);
                o->matmul_fused(be, &xo, c->act, PD_PRO_NONE, NULL, 0.0f, &wdn, 1, n, PD_EPI_ACC);
            } else if (o->matmul_fused_ok(be, wdn, n, PD_PRO_SILU_MUL, PD_EPI_ACC)) { /* in down */
                o->matmul_fused(be, &guo, c->x, nrm, L->mlp_norm, eps, &wgu, 1, n, PD_EPI_NONE);
                o->matmul_fused(be, &xo, c->gu, PD_PRO_SILU_MUL, NULL, 0.0f, &wdn, 1, n,
                                PD_EPI_ACC);
            } else {
                o->matmul_fused(be, &guo, c->x, nrm, L->mlp_norm, eps, &wgu, 1, n, PD_EPI_NONE);
                o->silu_mul(be, c->act, c->gu, n, m->ffn);
                o->matmul_fused(be, &xo, c->act, PD_PRO_NONE, NULL, 0.0f, &wdn, 1, n, PD_EPI_ACC);
            }
            continue;
        }
        o->matmul(be, c->tmp, c->attn, &L->o, n);
        if ((st = fwd__all_reduce(c, c->tmp, (size_t)n * d)) != PD_OK)
            return st;
        const pd_act_t gu8 = L->moe ? PD_ACT_F32 : fwd__act(c, &L->gate_up, n);
        fwd__norm(c, c->tmp, L->mlp_norm, n, gu8);
        if (!L->moe) {
            int f = m->ffn;
            const pd_act_t down8 = fwd__act(c, &L->down, n);
            if (gu8 && down8 == gu8 && o->matmul_silu_fp8) { /* one op: gate_up + silu·mul + fp8 */
                pd_act_fp8_t q = fwd__aq(c, gu8);
                o->matmul_silu_fp8(be, &q, c->gu, &q, &L->gate_up, n);
            } else {
                fwd__mm(c, c->gu, c->h, gu8, &L->gate_up, n);
                fwd__silu(c, n, f, down8);
            }
            fwd__mm(c, c->tmp, c->act, down8, &L->down, n);
        } else {
            int E = cfg->num_experts, K = cfg->num_experts_per_tok;
            o->matmul(be, c->rlogits, c->h, &L->router, n);
            o->moe_route(be, c->mids, c->mw, c->rlogits, n, E, K, cfg->norm_topk_prob);
            o->moe_experts(be, c->tmp, c->h, c->mids, c->mw, L->exp_gate_up, L->exp_down, n, K, d,
                           m->moe_ffn);
        }
        if ((st = fwd__all_reduce(c, c->tmp, (size_t)n * d)) != PD_OK)
            return st;
        res = c->tmp;
    }
    if (res)
        o->add(be, c->x, res, (size_t)n * d);
    if (n_logits > 0) {
        if (!logit_rows)
            o->copy(be, c->lrows, c->x, (size_t)n_logits * d * 4);
        else
            for (int i = 0; i < n_logits; i++)
                o->copy(be, c->lrows + (size_t)i * d, c->x + (size_t)logit_rows[i] * d,
                        (size_t)d * 4);
        o->rmsnorm(be, c->lrows, c->lrows, m->final_norm, n_logits, d, eps);
        o->matmul(be, c->logits, c->lrows, &m->lm_head, n_logits);
    }
    return PD_OK;
}

/* ==== sampling on the backend (model_forward_sample) ==== */

bool model_ctx_can_sample(const model_ctx_t *c)
{
    const pd_backend_ops_t *o = c->be->ops;
    return o->sample && o->logprobs && o->logits_process;
}

/* Grows the processing entries to ents and the processed copy of the logits to rows rows; a
 * buffer that moves drops the captured graphs (they hold its address). PD_ERR_NOMEM. */
static pd_status_t ctx__reserve_sample(model_ctx_t *c, int ents, int rows)
{
    pd_backend_t *be = c->be;
    pd_status_t st = PD_OK;

    if (ents > c->cap_ent) {
        ctx__drop_graphs(c);
        if (c->d_ent)
            be->ops->free(be, c->d_ent);
        if (c->d_bias)
            be->ops->free(be, c->d_bias);
        c->d_ent = NULL;
        c->d_bias = NULL;
        free(c->h_ent);
        free(c->h_bias);
        c->cap_ent = 0;
        c->h_ent = malloc((size_t)ents * 16);
        c->h_bias = malloc((size_t)ents * 4);
        if (!c->h_ent || !c->h_bias)
            st = PD_ERR_NOMEM;
        if (st == PD_OK)
            st = be->ops->alloc(be, (size_t)ents * 16, (void **)&c->d_ent);
        if (st == PD_OK)
            st = be->ops->alloc(be, (size_t)ents * 4, (void **)&c->d_bias);
        if (st != PD_OK) {
            pd_log_error("model: cannot allocate %d logits-processing entries", ents);
            return st;
        }
        c->cap_ent = ents;
    }
    if (rows > c->cap_plogits) {
        ctx__drop_graphs(c);
        if (c->plogits)
            be->ops->free(be, c->plogits);
        c->plogits = NULL;
        c->cap_plogits = 0;
        if ((st = be->ops->alloc(be, (size_t)rows * (size_t)c->m->cfg.vocab_size * 4,
                                 (void **)&c->plogits)) != PD_OK) {
            pd_log_error("model: cannot allocate processed logits for %d rows", rows);
            return st;
        }
        c->cap_plogits = rows;
    }
    return PD_OK;
}

/* The entry count a step with n_ent processing entries runs with: 0, or a power of two (at
 * least 64) so that graphs are captured for few sizes; the padding entries have row -1. */
static int ctx__ents(int n_ent)
{
    int e = 64;
    if (n_ent <= 0)
        return 0;
    while (e < n_ent)
        e *= 2;
    return e;
}

/* Stages smp's rows (n, padded to B: greedy, no logprobs, no penalties) and its entries (padded
 * to ents with row -1) and uploads them. Scratch holds B rows and ents entries. */
static pd_status_t ctx__stage_sample(model_ctx_t *c, const model_sampling_t *smp, int n, int B,
                                     int ents)
{
    pd_backend_t *be = c->be;
    const pd_backend_ops_t *o = be->ops;
    const size_t R = (size_t)B;
    pd_status_t st;

    for (int i = 0; i < B; i++) {
        const bool real = i < n;
        c->h_temp[i] = real ? smp->temperature[i] : 0.0f;
        c->h_topk[i] = real ? smp->top_k[i] : 0;
        c->h_topp[i] = real ? smp->top_p[i] : 1.0f;
        c->h_u[i] = real ? smp->u[i] : 0.0f;
        c->h_ntop[i] = real && smp->n_top ? smp->n_top[i] : -1;
        for (int j = 0; j < 3; j++)
            c->h_pen[3 * i + j] = real && smp->n_ent > 0 ? smp->pen[3 * i + j] : (j == 2);
    }
    if ((st = o->upload(be, c->d_temp, c->h_temp, R * 4)) != PD_OK ||
        (st = o->upload(be, c->d_topk, c->h_topk, R * 4)) != PD_OK ||
        (st = o->upload(be, c->d_topp, c->h_topp, R * 4)) != PD_OK ||
        (st = o->upload(be, c->d_u, c->h_u, R * 4)) != PD_OK ||
        (st = o->upload(be, c->d_ntop, c->h_ntop, R * 4)) != PD_OK)
        return st;
    if (ents == 0)
        return PD_OK;
    memcpy(c->h_ent, smp->ent, (size_t)smp->n_ent * 16);
    memcpy(c->h_bias, smp->bias, (size_t)smp->n_ent * 4);
    for (int j = smp->n_ent; j < ents; j++) {
        c->h_ent[4 * j] = -1;
        c->h_ent[4 * j + 1] = c->h_ent[4 * j + 2] = c->h_ent[4 * j + 3] = 0;
        c->h_bias[j] = 0.0f;
    }
    if ((st = o->upload(be, c->d_pen, c->h_pen, R * 12)) != PD_OK ||
        (st = o->upload(be, c->d_ent, c->h_ent, (size_t)ents * 16)) != PD_OK ||
        (st = o->upload(be, c->d_bias, c->h_bias, (size_t)ents * 4)) != PD_OK)
        return st;
    return PD_OK;
}

/* Enqueues the sampling of the nl logit rows in c->logits (TP > 1: gathered into c->flogits
 * first): the processing of ents entries (on the copy c->plogits when lp, so the logprobs read
 * the raw rows), the pick into c->d_stok, and (lp) the logprobs into c->d_lpi / c->d_lpv.
 * Returns PD_OK or the all-gather's error. */
static pd_status_t ctx__enqueue_sample(model_ctx_t *c, int nl, int ents, bool lp)
{
    pd_backend_t *be = c->be;
    const pd_backend_ops_t *o = be->ops;
    const int V = c->m->cfg.vocab_size;
    float *raw = c->logits, *x;
    pd_status_t st;

    if (c->m->tp_size > 1) { /* glogits (rank, row, vocab_local) -> flogits (row, vocab) */
        const size_t vl = (size_t)c->m->vocab_local, n = (size_t)nl;
        if ((st = tp_comm_all_gather(c->m->comm, c->glogits, c->logits, n * vl)) != PD_OK)
            return st;
        for (int r = 0; r < c->m->tp_size; r++)
            for (size_t i = 0; i < n; i++)
                o->copy(be, c->flogits + i * (size_t)V + (size_t)r * vl,
                        c->glogits + ((size_t)r * n + i) * vl, vl * 4);
        raw = c->flogits;
    }
    x = raw;
    if (ents > 0) {
        if (lp) {
            o->copy(be, c->plogits, raw, (size_t)nl * (size_t)V * 4);
            x = c->plogits;
        }
        o->logits_process(be, x, nl, V, c->d_ent, c->d_bias, ents, c->d_pen);
    }
    o->sample(be, c->d_stok, x, nl, V, c->d_temp, c->d_topk, c->d_topp, c->d_u);
    if (lp)
        o->logprobs(be, c->d_lpi, c->d_lpv, raw, c->d_stok, c->d_ntop, nl, V);
    return PD_OK;
}

/* Downloads the tokens of n rows into tokens_out and (lp) the logprobs of the rows that asked
 * into lp_out. */
static pd_status_t ctx__fetch_sample(model_ctx_t *c, const model_sampling_t *smp, int n, bool lp,
                                     int32_t *tokens_out, sampler_logprobs_t *lp_out)
{
    pd_backend_t *be = c->be;
    const size_t LW = 1 + SAMPLER_MAX_TOP_LOGPROBS;
    const int V = c->m->cfg.vocab_size;
    pd_status_t st;

    if ((st = be->ops->download(be, tokens_out, c->d_stok, (size_t)n * 4)) != PD_OK)
        return st;
    if (!lp)
        return PD_OK;
    if ((st = be->ops->download(be, c->h_lpi, c->d_lpi, (size_t)n * LW * 4)) != PD_OK ||
        (st = be->ops->download(be, c->h_lpv, c->d_lpv, (size_t)n * LW * 4)) != PD_OK)
        return st;
    for (int i = 0; i < n; i++) {
        int nt = smp->n_top[i];
        if (nt < 0)
            continue;
        nt = nt > SAMPLER_MAX_TOP_LOGPROBS ? SAMPLER_MAX_TOP_LOGPROBS : nt;
        nt = nt > V ? V : nt;
        sampler_logprobs_t *d = &lp_out[i];
        d->token = c->h_lpi[i * LW];
        d->logprob = c->h_lpv[i * LW];
        d->n_top = nt;
        memcpy(d->top_ids, c->h_lpi + i * LW + 1, (size_t)nt * 4);
        memcpy(d->top_logprobs, c->h_lpv + i * LW + 1, (size_t)nt * 4);
    }
    return PD_OK;
}

/* Whether any of the n rows of smp asks for logprobs. */
static bool ctx__wants_lp(const model_sampling_t *smp, int n)
{
    for (int i = 0; smp && smp->n_top && i < n; i++)
        if (smp->n_top[i] >= 0)
            return true;
    return false;
}

/* A decode-only batch the graph path takes: one row per sequence, no more than the largest
 * bucket, logits of no rows or of every row in order. */
static bool ctx__graph_batch(const model_ctx_t *c, const model_batch_t *b)
{
    if (c->graphs == MODEL_GRAPHS_OFF || c->m->tp_size > 1 || b->n_seqs < 1 ||
        b->n_tokens != b->n_seqs || b->n_seqs > MODEL_GRAPH_MAX_BATCH ||
        (b->n_logits != 0 && b->n_logits != b->n_seqs))
        return false;
    for (int s = 0; s <= b->n_seqs; s++)
        if (b->q_start[s] != s)
            return false;
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] != i)
            return false;
    return true;
}

static int ctx__pow2(int x, int lo)
{
    int p = lo;
    while (p < x)
        p *= 2;
    return p;
}

/* The graph path (see model.h): pads the batch to (bucket B, P pages), uploads the index arrays,
 * then replays the captured step, or runs it and captures it. */
static pd_status_t ctx__forward_graph(model_ctx_t *c, void *arena, const kv_layout_t *l,
                                      const model_batch_t *b, int max_pages, float *logits_out,
                                      const model_sampling_t *smp, int32_t *tokens_out,
                                      sampler_logprobs_t *lp_out)
{
    pd_backend_t *be = c->be;
    const pd_backend_ops_t *o = be->ops;
    const int n = b->n_seqs, B = ctx__pow2(n, 1), P = ctx__pow2(max_pages, MODEL_GRAPH_MIN_PAGES);
    const bool sample = smp && b->n_logits > 0, want = b->n_logits > 0 && !sample;
    const bool lp = sample && ctx__wants_lp(smp, n);
    const int ents = sample ? ctx__ents(smp->n_ent) : 0;
    pd_status_t st;

    if ((st = ctx__reserve(c, MODEL_GRAPH_MAX_BATCH, MODEL_GRAPH_MAX_BATCH,
                           MODEL_GRAPH_MAX_BATCH * P, MODEL_GRAPH_MAX_BATCH)) != PD_OK ||
        (sample &&
         (st = ctx__reserve_sample(c, ents, ents && lp ? MODEL_GRAPH_MAX_BATCH : 0)) != PD_OK) ||
        (sample && (st = ctx__stage_sample(c, smp, n, B, ents)) != PD_OK))
        return st;
    for (int s = 0; s < B; s++) {
        c->g_qs[s] = s;
        for (int i = 0; i < P; i++)
            c->h_bt[s * P + i] = 0;
        if (s >= n) { /* padding: token 0 at position 0 on page 0, writes no KV */
            c->g_tok[s] = 0;
            c->g_ctx[s] = 1;
            c->h_pos[s] = 0;
            c->h_slots[s] = -1;
            continue;
        }
        const kv_seq_t *seq = b->seqs[s];
        int32_t pos = b->ctx_len[s] - 1;
        c->g_tok[s] = b->tokens[s];
        c->g_ctx[s] = b->ctx_len[s];
        c->h_pos[s] = pos;
        c->h_slots[s] =
            seq->pages[pos / l->page_tokens].page * l->page_tokens + pos % l->page_tokens;
        for (int i = 0; i < seq->n_pages && i < P; i++)
            c->h_bt[s * P + i] = seq->pages[i].page;
    }
    c->g_qs[B] = B;
    o->upload(be, c->d_tokens, c->g_tok, (size_t)B * 4);
    o->upload(be, c->d_pos, c->h_pos, (size_t)B * 4);
    o->upload(be, c->d_slots, c->h_slots, (size_t)B * 4);
    o->upload(be, c->d_qstart, c->g_qs, ((size_t)B + 1) * 4);
    o->upload(be, c->d_ctx, c->g_ctx, (size_t)B * 4);
    o->upload(be, c->d_bt, c->h_bt, (size_t)B * P * 4);
    pd_attn_batch_t ab = {B, P, c->d_qstart, c->d_ctx, c->d_bt, B, P * l->page_tokens};
    const int nl = want || sample ? B : 0;

    model_graph_t *g = NULL;
    for (int i = 0; i < c->n_graphs && !g; i++)
        if (c->cache[i].batch == B && c->cache[i].pages == P && c->cache[i].logits == want &&
            c->cache[i].sample == sample && c->cache[i].lp == lp && c->cache[i].ents == ents &&
            c->cache[i].arena == arena)
            g = &c->cache[i];
    if (g && c->graphs == MODEL_GRAPHS_ON) {
        st = o->graph_launch(be, g->graph);
        if (st == PD_AGAIN) { /* backend scratch moved: capture again below */
            o->graph_free(be, g->graph);
            *g = c->cache[--c->n_graphs];
            g = NULL;
        } else if (st != PD_OK) {
            return st;
        }
    }
    if (!g) {
        /* TP 1: no collectives */
        (void)ctx__enqueue(c, arena, l, B, &ab, nl, NULL);
        if (sample)
            (void)ctx__enqueue_sample(c, B, ents, lp);
        if (c->graphs == MODEL_GRAPHS_ON && c->n_graphs < MODEL_GRAPH_CACHE) {
            void *graph = NULL;
            /* the capture records the step without running it; the eager run above did it */
            if ((st = o->graph_begin(be)) == PD_OK) {
                (void)ctx__enqueue(c, arena, l, B, &ab, nl, NULL);
                if (sample)
                    (void)ctx__enqueue_sample(c, B, ents, lp);
                st = o->graph_end(be, &graph);
            }
            if (st == PD_OK) {
                c->cache[c->n_graphs++] =
                    (model_graph_t){B, P, want, sample, lp, ents, arena, graph};
            } else {
                pd_log_error("model: decode step (batch %d, %d pages) cannot be captured: %s; "
                             "graphs off for this context",
                             B, P, pd_status_str(st));
                model_ctx_set_graphs(c, MODEL_GRAPHS_OFF);
            }
        }
    }
    if (want && (st = o->download(be, logits_out, c->logits,
                                  (size_t)n * (size_t)c->m->cfg.vocab_size * 4)) != PD_OK)
        return st;
    if (sample && (st = ctx__fetch_sample(c, smp, n, lp, tokens_out, lp_out)) != PD_OK)
        return st;
    return o->sync(be);
}

/* model_forward (smp NULL: logits to logits_out) and model_forward_sample (tokens_out, lp_out) */
static pd_status_t ctx__forward(model_ctx_t *c, void *arena, const kv_layout_t *l,
                                const model_batch_t *b, float *logits_out,
                                const model_sampling_t *smp, int32_t *tokens_out,
                                sampler_logprobs_t *lp_out)
{
    pd_backend_t *be = c->be;
    const pd_backend_ops_t *o = be->ops;
    const int n = b->n_tokens;
    int max_pages = 1;
    pd_status_t st;

    for (int s = 0; s < b->n_seqs; s++) {
        int np = (b->ctx_len[s] + l->page_tokens - 1) / l->page_tokens;
        PD_ASSERT(np <= b->seqs[s]->n_pages);
        if (np > max_pages)
            max_pages = np;
    }
    if (ctx__graph_batch(c, b))
        return ctx__forward_graph(c, arena, l, b, max_pages, logits_out, smp, tokens_out, lp_out);
    const bool sample = smp && b->n_logits > 0, lp = sample && ctx__wants_lp(smp, b->n_logits);
    const int ents = sample ? ctx__ents(smp->n_ent) : 0;
    if ((st = ctx__reserve(c, n, b->n_seqs, b->n_seqs * max_pages, b->n_logits)) != PD_OK ||
        (sample && (st = ctx__reserve_sample(c, ents, ents && lp ? b->n_logits : 0)) != PD_OK) ||
        (sample && (st = ctx__stage_sample(c, smp, b->n_logits, b->n_logits, ents)) != PD_OK))
        return st;

    /* positions, KV slots and block tables */
    for (int s = 0; s < b->n_seqs; s++) {
        const kv_seq_t *seq = b->seqs[s];
        int q_len = b->q_start[s + 1] - b->q_start[s];
        for (int r = b->q_start[s]; r < b->q_start[s + 1]; r++) {
            int32_t pos = b->ctx_len[s] - q_len + (r - b->q_start[s]);
            c->h_pos[r] = pos;
            c->h_slots[r] =
                seq->pages[pos / l->page_tokens].page * l->page_tokens + pos % l->page_tokens;
        }
        for (int i = 0; i < max_pages; i++)
            c->h_bt[s * max_pages + i] = i < seq->n_pages ? seq->pages[i].page : 0;
    }
    o->upload(be, c->d_tokens, b->tokens, (size_t)n * 4);
    o->upload(be, c->d_pos, c->h_pos, (size_t)n * 4);
    o->upload(be, c->d_slots, c->h_slots, (size_t)n * 4);
    o->upload(be, c->d_qstart, b->q_start, ((size_t)b->n_seqs + 1) * 4);
    o->upload(be, c->d_ctx, b->ctx_len, (size_t)b->n_seqs * 4);
    o->upload(be, c->d_bt, c->h_bt, (size_t)b->n_seqs * max_pages * 4);
    int max_ctx = 0;
    for (int s = 0; s < b->n_seqs; s++)
        max_ctx = b->ctx_len[s] > max_ctx ? b->ctx_len[s] : max_ctx;
    pd_attn_batch_t ab = {b->n_seqs, max_pages, c->d_qstart, c->d_ctx, c->d_bt, n, max_ctx};

    if ((st = ctx__enqueue(c, arena, l, n, &ab, b->n_logits, b->logit_rows)) != PD_OK)
        return st;
    if (sample) {
        if ((st = ctx__enqueue_sample(c, b->n_logits, ents, lp)) != PD_OK ||
            (st = ctx__fetch_sample(c, smp, b->n_logits, lp, tokens_out, lp_out)) != PD_OK)
            return st;
    } else if (b->n_logits > 0 && (st = fwd__logits(c, b->n_logits, logits_out)) != PD_OK) {
        return st;
    }
    return o->sync(be);
}

pd_status_t model_forward(model_ctx_t *c, void *arena, const kv_layout_t *l, const model_batch_t *b,
                          float *logits_out)
{
    return ctx__forward(c, arena, l, b, logits_out, NULL, NULL, NULL);
}

pd_status_t model_forward_sample(model_ctx_t *c, void *arena, const kv_layout_t *l,
                                 const model_batch_t *b, const model_sampling_t *smp,
                                 int32_t *tokens_out, sampler_logprobs_t *lp_out)
{
    if (!model_ctx_can_sample(c)) {
        pd_log_error("model: backend %s cannot sample on the device", c->be->ops->name);
        return PD_ERR_UNSUPPORTED;
    }
    return ctx__forward(c, arena, l, b, NULL, smp, tokens_out, lp_out);
}
