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

/* one captured decode step */
typedef struct {
    int batch, pages;
    bool logits;
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
    model_family_scratch_t *fam; /* GLM-4.5 / DeepSeek-V3 only (model_family.h) */
    model_layer_fn layer_fn;     /* model_ctx_set_layer_hook */
    void *layer_arg;
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
    void **bufs[] = {(void **)&c->x,     (void **)&c->h,      (void **)&c->q,
                     (void **)&c->k,     (void **)&c->v,      (void **)&c->attn,
                     (void **)&c->tmp,   (void **)&c->gu,     (void **)&c->act,
                     (void **)&c->rlogits, (void **)&c->mw,   (void **)&c->mids,
                     (void **)&c->aq,    (void **)&c->as,
                     (void **)&c->lrows, (void **)&c->logits, (void **)&c->glogits,
                     (void **)&c->d_tokens,
                     (void **)&c->d_pos, (void **)&c->d_slots, (void **)&c->d_qstart,
                     (void **)&c->d_ctx, (void **)&c->d_bt};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i])
            c->be->ops->free(c->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    model_family_scratch_free(&c->fam, c->be);
    free(c->h_pos);
    free(c->h_slots);
    free(c->h_bt);
    c->h_pos = c->h_slots = c->h_bt = NULL;
    c->cap_tokens = c->cap_seqs = c->cap_bt = c->cap_logits = 0;
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
    A(c->aq, N * (d > (size_t)f ? d : (size_t)f));
    A(c->as, N * 4);
    A(c->lrows, (size_t)nl * d * 4);
    A(c->logits, (size_t)nl * (size_t)c->m->vocab_local * 4);
    if (c->m->tp_size > 1)
        A(c->glogits, (size_t)nl * (size_t)cfg->vocab_size * 4);
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
    if (st == PD_OK && (!c->h_pos || !c->h_slots || !c->h_bt))
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
    model_ctx_set_graphs(c, MODEL_GRAPHS_ON);
    *ctx_p = c;
    return PD_OK;
}

model_graphs_t model_ctx_set_graphs(model_ctx_t *c, model_graphs_t mode)
{
    bool can = c->be->ops->graph_begin != NULL;
    for (int i = 0; i < c->m->cfg.num_hidden_layers && can; i++)
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

/* Whether w runs as matmul_fp8 on the FP8 activations of the fused ops (backend.h). */
static bool fwd__fp8(const model_ctx_t *c, const pd_weight_t *w)
{
    return c->be->ops->matmul_fp8 && c->be->ops->add_rmsnorm && c->be->ops->silu_mul_fp8 &&
           w->fmt == PD_WFMT_FP8;
}

/* x += res (res != NULL: the residual the previous layer left pending), then c->h = rmsnorm(x) *
 * w; quant: the only readers are FP8 matmuls (fwd__fp8), so only the FP8 activations c->aq / c->as
 * are made (c->h is not written). One fused op where the backend has it. */
static void fwd__norm(model_ctx_t *c, const float *res, const uint16_t *w, int n, bool quant)
{
    pd_backend_t *be = c->be;
    const int d = c->m->cfg.hidden_size;
    const float eps = (float)c->m->cfg.rms_norm_eps;
    pd_act_fp8_t q = {c->aq, c->as};
    if (be->ops->add_rmsnorm) {
        be->ops->add_rmsnorm(be, c->x, res, quant ? NULL : c->h, w, n, d, eps, quant ? &q : NULL);
        return;
    }
    if (res)
        be->ops->add(be, c->x, res, (size_t)n * d);
    be->ops->rmsnorm(be, c->h, c->x, w, n, d, eps);
}

/* c->act = silu_mul(c->gu), or (quant, see fwd__norm) only its FP8 activations */
static void fwd__silu(model_ctx_t *c, int n, int f, bool quant)
{
    pd_act_fp8_t q = {c->aq, c->as};
    if (quant)
        c->be->ops->silu_mul_fp8(c->be, NULL, c->gu, n, f, &q);
    else
        c->be->ops->silu_mul(c->be, c->act, c->gu, n, f);
}

/* out = x @ w^T; quant: x's FP8 activations are in c->aq / c->as (fwd__norm, fwd__silu) */
static void fwd__mm(model_ctx_t *c, float *out, const float *x, bool quant, const pd_weight_t *w,
                    int n)
{
    pd_act_fp8_t q = {c->aq, c->as};
    if (quant)
        c->be->ops->matmul_fp8(c->be, out, &q, w, n);
    else
        c->be->ops->matmul(c->be, out, x, w, n);
}

/* Enqueues the whole step for n rows: embedding, layers, and (n_logits > 0) the final norm and
 * LM head over x rows logit_rows (NULL: rows 0 .. n_logits - 1) into c->logits. Index arrays are
 * already in c->d_*; nothing here waits for the device except the TP collectives. Returns PD_OK or
 * a collective's error. */
static pd_status_t ctx__enqueue(model_ctx_t *c, void *arena, const kv_layout_t *l, int n,
                                const pd_attn_batch_t *ab, int n_logits,
                                const int32_t *logit_rows)
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
        const bool qkv8 = fwd__fp8(c, &L->q) && fwd__fp8(c, &L->k) && fwd__fp8(c, &L->v);
        fwd__norm(c, res, L->attn_norm, n, qkv8);
        fwd__mm(c, c->q, c->h, qkv8, &L->q, n);
        fwd__mm(c, c->k, c->h, qkv8, &L->k, n);
        fwd__mm(c, c->v, c->h, qkv8, &L->v, n);
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
        if (c->layer_fn)
            c->layer_fn(c->layer_arg, li);
        o->attention(be, c->attn, c->q, arena, l, li, ab, H);
        o->matmul(be, c->tmp, c->attn, &L->o, n);
        if ((st = fwd__all_reduce(c, c->tmp, (size_t)n * d)) != PD_OK)
            return st;
        const bool gu8 = !L->moe && fwd__fp8(c, &L->gate_up);
        fwd__norm(c, c->tmp, L->mlp_norm, n, gu8);
        if (!L->moe) {
            int f = m->ffn;
            const bool down8 = fwd__fp8(c, &L->down);
            fwd__mm(c, c->gu, c->h, gu8, &L->gate_up, n);
            fwd__silu(c, n, f, down8);
            fwd__mm(c, c->tmp, c->act, down8, &L->down, n);
        } else {
            int E = cfg->num_experts, K = cfg->num_experts_per_tok;
            o->matmul(be, c->rlogits, c->h, &L->router, n);
            o->moe_route(be, c->mids, c->mw, c->rlogits, n, E, K, cfg->norm_topk_prob);
            o->moe_experts(be, c->tmp, c->h, c->mids, c->mw, L->exp_gate_up, L->exp_down, n, K,
                           d, m->moe_ffn);
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

/* A decode-only batch the graph path takes: one row per sequence, no more than the largest
 * bucket, logits of no rows or of every row in order. */
static bool ctx__graph_batch(const model_ctx_t *c, const model_batch_t *b)
{
    if (c->graphs == MODEL_GRAPHS_OFF || c->m->tp_size > 1 || b->n_seqs < 1 ||
        b->n_tokens != b->n_seqs ||
        b->n_seqs > MODEL_GRAPH_MAX_BATCH ||
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
                                      const model_batch_t *b, int max_pages, float *logits_out)
{
    pd_backend_t *be = c->be;
    const pd_backend_ops_t *o = be->ops;
    const int n = b->n_seqs, B = ctx__pow2(n, 1), P = ctx__pow2(max_pages, MODEL_GRAPH_MIN_PAGES);
    const bool want = b->n_logits > 0;
    pd_status_t st;

    if ((st = ctx__reserve(c, MODEL_GRAPH_MAX_BATCH, MODEL_GRAPH_MAX_BATCH,
                           MODEL_GRAPH_MAX_BATCH * P, MODEL_GRAPH_MAX_BATCH)) != PD_OK)
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
    const int nl = want ? B : 0;

    model_graph_t *g = NULL;
    for (int i = 0; i < c->n_graphs && !g; i++)
        if (c->cache[i].batch == B && c->cache[i].pages == P && c->cache[i].logits == want &&
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
        (void)ctx__enqueue(c, arena, l, B, &ab, nl, NULL); /* TP 1: no collectives */
        if (c->graphs == MODEL_GRAPHS_ON && c->n_graphs < MODEL_GRAPH_CACHE) {
            void *graph = NULL;
            /* the capture records the step without running it; the eager run above did it */
            if ((st = o->graph_begin(be)) == PD_OK) {
                (void)ctx__enqueue(c, arena, l, B, &ab, nl, NULL);
                st = o->graph_end(be, &graph);
            }
            if (st == PD_OK) {
                c->cache[c->n_graphs++] = (model_graph_t){B, P, want, arena, graph};
            } else {
                pd_log_error("model: decode step (batch %d, %d pages) cannot be captured: %s; "
                             "graphs off for this context",
                             B, P, pd_status_str(st));
                model_ctx_set_graphs(c, MODEL_GRAPHS_OFF);
            }
        }
    }
    if (want &&
        (st = o->download(be, logits_out, c->logits,
                          (size_t)n * (size_t)c->m->cfg.vocab_size * 4)) != PD_OK)
        return st;
    return o->sync(be);
}

pd_status_t model_forward(model_ctx_t *c, void *arena, const kv_layout_t *l,
                          const model_batch_t *b, float *logits_out)
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
        return ctx__forward_graph(c, arena, l, b, max_pages, logits_out);
    if ((st = ctx__reserve(c, n, b->n_seqs, b->n_seqs * max_pages, b->n_logits)) != PD_OK)
        return st;

    /* positions, KV slots and block tables */
    for (int s = 0; s < b->n_seqs; s++) {
        const kv_seq_t *seq = b->seqs[s];
        int q_len = b->q_start[s + 1] - b->q_start[s];
        for (int r = b->q_start[s]; r < b->q_start[s + 1]; r++) {
            int32_t pos = b->ctx_len[s] - q_len + (r - b->q_start[s]);
            c->h_pos[r] = pos;
            c->h_slots[r] = seq->pages[pos / l->page_tokens].page * l->page_tokens +
                            pos % l->page_tokens;
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
    if (b->n_logits > 0 && (st = fwd__logits(c, b->n_logits, logits_out)) != PD_OK)
        return st;
    return o->sync(be);
}
