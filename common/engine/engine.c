#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_tp.h"
#include "log.h"
#include "tp_kv.h"
#include "tp_shard.h"

typedef struct engine_seq {
    uint64_t id;
    int32_t *tokens; /* prompt then generated, (cap) */
    int n_tokens, cap, n_prompt, n_generated;
    int n_computed; /* tokens whose KV is in the pages */
    kv_seq_t kv;
    sampler_t sampler;
    engine_gen_params_t gp;
    int32_t *stop_ids;
    engine_token_fn cb;
    void *arg;
    bool evicted; /* pages taken for an older sequence (evict_on_preempt) */
    /* logits processing (see engine__needs_process); NULL / 0 when the request has none */
    int32_t *counts;    /* (vocab) occurrences among generated tokens (penalties) */
    uint8_t *in_prompt; /* (vocab) occurs in the prompt (repetition penalty) */
    int32_t *seen;      /* (n_seen) tokens with counts > 0 or in_prompt, each once */
    int n_seen, seen_cap;
    int32_t *bias_ids;       /* (n_bias) */
    float *bias_vals;        /* (n_bias) */
    int n_before;            /* tokens of the request generated before this engine got it */
    sampler_logprobs_t lp;   /* the last sampled token's, when gp.logprobs */
    struct engine_seq *next; /* in order of arrival */
} engine_seq_t;

struct engine {
    engine_params_t p;
    pd_backend_t *be;
    engine_layer_fn layer_fn; /* engine_set_prefill_layer_hook */
    void *layer_arg;
    kv_tag_io_t tag_io; /* the tracker's stamp / check on be */
    model_t *m;
    model_ctx_t *ctx;
    kv_tracker_t *tracker;
    kv_pool_t *pool;
    void *arena;
    kv_layout_t layout;
    uint64_t next_id;
    engine_seq_t *seqs; /* active, oldest first */
    int n_active;
    /* step scratch (host) */
    int cap;
    int32_t *b_tokens, *b_qstart, *b_ctx, *b_rows, *b_ntok;
    engine_seq_t **b_seqs;
    const kv_seq_t **b_kv;
    const float **b_raw;
    uint64_t *b_ids;
    pd_status_t *b_status;
    /* sampling on the backend (model_forward_sample): the rows' sequences, parameters, draws,
     * logprobs requests (n_top, -1 none), and what comes back (tokens, logprobs) */
    engine_seq_t **b_pick;
    float *b_temp, *b_topp, *b_u;
    int32_t *b_topk, *b_ntop, *b_out;
    sampler_logprobs_t *b_lp;
    float *logits;
    int logits_cap;
    /* logits processing (engine__pick): host staging and its backend copies */
    int32_t *slot;                  /* (vocab) entry of a token in the row being built, -1 */
    int32_t *p_ent;                 /* (p_ent_cap, 4) */
    float *p_bias, *p_pen, *p_rows; /* (p_ent_cap), (p_pen_cap, 3), (p_rows_cap, vocab) */
    int p_ent_cap, p_pen_cap, p_rows_cap, p_dent_cap;
    /* backend memory for engine__pick: d_ent, d_bias (p_dent_cap entries), d_pen, d_rows
     * (p_rows_cap rows) */
    void *d_ent, *d_bias, *d_pen, *d_rows;
    const sampler_logprobs_t *cur_lp; /* inside a token callback */
    /* tensor parallel (p.tp > 1): the ranks; be, tag_io, m, ctx and arena above are rank 0's,
     * layout the rank layout (every rank's) */
    engine_tp_t *tp;
};

const char *engine_finish_str(engine_finish_t f)
{
    static const char *const names[] = {"", "stop", "length", "abort", "preempted"};
    return (unsigned)f < 5 ? names[f] : "";
}

void engine_params_default(engine_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->backend = "cpu";
    p->wfmt = PD_WFMT_BF16;
    p->lm_head_fmt = PD_WFMT_BF16;
    p->kvfmt = PD_KV_BF16;
    p->page_tokens = 16;
    p->max_batch = 64;
    p->prefill_chunk = 512;
    p->tracker = KV_TRACKER_TAGGED;
}

/* ==== tensor parallel ranks (engine_tp.h) ==== */

static pd_status_t engine__tp_load(engine_rank_t *r, void *arg)
{
    const engine_params_t *p = arg;
    model_load_params_t mp = {
        p->model_dir, p->wfmt, p->lm_head_fmt, r->be, p->progress && r->rank == 0, r->comm};
    return model_load(&mp, &r->m);
}

static pd_status_t engine__tp_arena(engine_rank_t *r, void *arg)
{
    const size_t bytes = *(const size_t *)arg;
    pd_status_t st;
    if ((st = r->be->ops->alloc(r->be, bytes, &r->arena)) != PD_OK ||
        (st = r->be->ops->memset(r->be, r->arena, 0, bytes)) != PD_OK)
        return st;
    return model_ctx_create(r->m, &r->ctx);
}

/* Starts the ranks and loads each one's shards; e->be, tag_io and m become rank 0's. */
static pd_status_t engine__tp_create(engine_t *e)
{
    const engine_params_t *p = &e->p;
    char path[4096];
    hf_config_t cfg;
    pd_status_t st;
    /* what does not split is refused once, here, before any rank starts */
    snprintf(path, sizeof path, "%s/config.json", p->model_dir);
    if ((st = hf_config_load(path, &cfg)) != PD_OK ||
        (st = tp_shard_check(&cfg, p->wfmt, p->lm_head_fmt, p->tp)) != PD_OK)
        return st;
    if ((st = engine_tp_create(p->tp, p->backend, p->device, p->threads, p->backend_options,
                               p->tp_comm_wrap, p->tp_comm_wrap_arg, &e->tp)) != PD_OK)
        return st;
    engine_rank_t *r0 = engine_tp_rank(e->tp, 0);
    e->be = r0->be;
    e->tag_io = r0->tag_io;
    if ((st = engine_tp_run(e->tp, engine__tp_load, (void *)p, ENGINE_TP_COLLECTIVES)) != PD_OK)
        return st; /* logged by model_load */
    e->m = r0->m;
    pd_log_info("tp %d: %d ranks, one %s backend%s each, %s communicator", p->tp, p->tp, p->backend,
                strcmp(p->backend, "cpu") == 0 ? " and thread" : " (gpu) and thread",
                strcmp(p->backend, "cpu") == 0 ? "in-process" : "nccl");
    return PD_OK;
}

typedef struct {
    const model_batch_t *b;
    const kv_layout_t *l;
    float *logits; /* rank 0's output */
    size_t n;      /* floats of logits */
} engine__fwd_t;

static pd_status_t engine__tp_forward(engine_rank_t *r, void *arg)
{
    engine__fwd_t *f = arg;
    /* every rank gets the gathered logits; rank 0's are the engine's */
    return model_forward(r->ctx, r->arena, f->l, f->b, r->rank > 0 ? r->logits : f->logits);
}

/* model_forward on every rank (all at once: the collectives need them all). */
static pd_status_t engine__forward(engine_t *e, const model_batch_t *b, float *logits)
{
    if (!e->tp)
        return model_forward(e->ctx, e->arena, &e->layout, b, logits);
    engine__fwd_t f = {b, &e->layout, logits, (size_t)b->n_logits * (size_t)e->m->cfg.vocab_size};
    for (int i = 1; i < engine_tp_size(e->tp); i++) { /* before any rank enters a collective */
        engine_rank_t *r = engine_tp_rank(e->tp, i);
        if (r->logits_cap < f.n || !r->logits) {
            float *l = realloc(r->logits, (f.n ? f.n : 1) * sizeof *l);
            if (!l)
                return PD_ERR_NOMEM;
            r->logits = l;
            r->logits_cap = f.n;
        }
    }
    return engine_tp_run(e->tp, engine__tp_forward, &f, ENGINE_TP_COLLECTIVES);
}

typedef struct {
    engine_t *e;
    const kv_page_ref_t *refs;
    int n;
} engine__stamp_t;

static pd_status_t engine__tp_stamp(engine_rank_t *r, void *arg)
{
    engine__stamp_t *a = arg;
    kv_tracker_stamp(a->e->tracker, &r->tag_io, r->arena, &a->e->layout, a->refs, a->n);
    return PD_OK;
}

/* Stamps pages refs (n) with their tags in every rank's arena (ranks in turn: one tracker). */
static void engine__stamp(engine_t *e, const kv_page_ref_t *refs, int n)
{
    if (!e->tp) {
        kv_tracker_stamp(e->tracker, &e->tag_io, e->arena, &e->layout, refs, n);
        return;
    }
    engine__stamp_t a = {e, refs, n};
    (void)engine_tp_run(e->tp, engine__tp_stamp, &a, ENGINE_TP_SEQUENTIAL);
}

typedef struct {
    engine_t *e;
    const kv_seq_t *const *seqs;
    const int32_t *n_tokens;
    const uint64_t *ids;
    int n;
    pd_status_t *status_out; /* merged: the first failure of any rank */
    pd_status_t *one;        /* (n) scratch: this rank's */
    int err;                 /* a negative return of the check */
} engine__check_t;

static pd_status_t engine__tp_check(engine_rank_t *r, void *arg)
{
    engine__check_t *a = arg;
    int bad = kv_tracker_check(a->e->tracker, &r->tag_io, r->arena, &a->e->layout, a->seqs,
                               a->n_tokens, a->ids, a->n, a->one);
    if (bad < 0) {
        a->err = bad;
        return PD_OK;
    }
    for (int i = 0; i < a->n; i++)
        if (a->status_out[i] == PD_OK && a->one[i] != PD_OK) {
            a->status_out[i] = a->one[i];
            if (r->rank > 0)
                pd_log_error("seq %llu: kv integrity check failed in tp rank %d's slice",
                             (unsigned long long)(a->ids ? a->ids[i] : (uint64_t)i), r->rank);
        }
    return PD_OK;
}

/* kv_tracker_check over every rank's slice of the pages (each rank its own arena, in turn): a
 * sequence fails when any slice fails; counted once. Returns as kv_tracker_check. */
static int engine__check(engine_t *e, const kv_seq_t *const *seqs, const int32_t *n_tokens,
                         const uint64_t *ids, int n, pd_status_t *status_out)
{
    if (!e->tp)
        return kv_tracker_check(e->tracker, &e->tag_io, e->arena, &e->layout, seqs, n_tokens, ids,
                                n, status_out);
    pd_status_t *one = malloc((n > 0 ? (size_t)n : 1) * sizeof *one);
    if (!one)
        return PD_ERR_NOMEM;
    const uint64_t failures = e->tracker->failures;
    engine__check_t a = {e, seqs, n_tokens, ids, n, status_out, one, 0};
    for (int i = 0; i < n; i++)
        status_out[i] = PD_OK;
    (void)engine_tp_run(e->tp, engine__tp_check, &a, ENGINE_TP_SEQUENTIAL);
    free(one);
    if (a.err < 0)
        return a.err;
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += status_out[i] != PD_OK;
    e->tracker->failures = failures + (uint64_t)bad; /* a sequence, not a slice, fails */
    return bad;
}

int engine_tp(const engine_t *e)
{
    return e->tp ? engine_tp_size(e->tp) : 1;
}

void engine_kv_wire_layout(const engine_t *e, kv_layout_t *l_p)
{
    kv_layout_t l = e->layout;
    if (e->tp) {
        l.n_slices = engine_tp_size(e->tp);
        l.page_bytes *= (size_t)l.n_slices;
    }
    *l_p = l;
}

pd_status_t engine_create(const engine_params_t *p, engine_t **e_p)
{
    engine_t *e = calloc(1, sizeof *e);
    model_load_params_t mp;
    kv_pool_params_t pp;
    int64_t n_pages;
    pd_status_t st;

    if (!e)
        return PD_ERR_NOMEM;
    e->p = *p;
    if (e->p.page_tokens <= 0)
        e->p.page_tokens = 16;
    if (e->p.max_batch <= 0)
        e->p.max_batch = 64;
    if (e->p.prefill_chunk <= 0)
        e->p.prefill_chunk = 512;
    if (p->tp > 1) {
        if ((st = engine__tp_create(e)) != PD_OK)
            goto err;
    } else {
        if ((st = backend_create(p->backend, p->device, p->threads, &e->be)) != PD_OK)
            goto err;
        if ((st = backend_set_options(e->be, p->backend_options)) != PD_OK)
            goto err;
        e->tag_io = backend_tag_io(e->be);
        mp = (model_load_params_t){p->model_dir, p->wfmt, p->lm_head_fmt, e->be, p->progress, NULL};
        if ((st = model_load(&mp, &e->m)) != PD_OK)
            goto err;
    }
    int kv_heads, kv_dim, kv_sides;
    hf_config_kv_shape(&e->m->cfg, &kv_heads, &kv_dim, &kv_sides);
    kv_layout_init_sides(&e->layout, e->m->cfg.num_hidden_layers, kv_heads, kv_dim, kv_sides,
                         e->p.page_tokens, p->kvfmt);
    if (e->tp && (st = tp_kv_layout(&e->layout, p->tp, &e->layout)) != PD_OK)
        goto err;
    if (p->kv_budget > 0) {
        n_pages = p->kv_budget / (int64_t)e->layout.page_bytes;
    } else {
        int64_t per_seq =
            (e->m->cfg.max_position_embeddings + e->p.page_tokens - 1) / e->p.page_tokens;
        n_pages = per_seq * 4; /* default: four full contexts */
    }
    if (n_pages < 1 || n_pages > INT32_MAX / 2) {
        pd_log_error("kv budget %lld bytes holds %lld pages of %zu bytes: need at least one",
                     (long long)p->kv_budget, (long long)n_pages, e->layout.page_bytes);
        st = PD_ERR_INVALID;
        goto err;
    }
    if ((st = kv_tracker_create(p->tracker, (int32_t)n_pages, &e->tracker)) != PD_OK)
        goto err;
    pp = (kv_pool_params_t){e->layout, (int32_t)n_pages, e->tracker, 0};
    if ((st = kv_pool_create(&pp, &e->pool)) != PD_OK)
        goto err;
    if (e->tp) {
        size_t bytes = (size_t)n_pages * e->layout.page_bytes;
        if ((st = engine_tp_run(e->tp, engine__tp_arena, &bytes, ENGINE_TP_PARALLEL)) != PD_OK)
            goto err;
        e->arena = engine_tp_rank(e->tp, 0)->arena;
        e->ctx = engine_tp_rank(e->tp, 0)->ctx;
    } else {
        if ((st = e->be->ops->alloc(e->be, (size_t)n_pages * e->layout.page_bytes, &e->arena)))
            goto err;
        if ((st = e->be->ops->memset(e->be, e->arena, 0, (size_t)n_pages * e->layout.page_bytes)))
            goto err;
        if ((st = model_ctx_create(e->m, &e->ctx)) != PD_OK)
            goto err;
    }
    e->next_id = 1;
    *e_p = e;
    return PD_OK;
err:
    engine_destroy(e);
    return st;
}

static void engine__seq_free(engine_t *e, engine_seq_t *s)
{
    kv_seq_release(e->pool, &s->kv);
    kv_seq_deinit(&s->kv);
    sampler_deinit(&s->sampler);
    free(s->tokens);
    free(s->stop_ids);
    free(s->counts);
    free(s->in_prompt);
    free(s->seen);
    free(s->bias_ids);
    free(s->bias_vals);
    free(s);
}

static void engine__proc_free(engine_t *e)
{
    void *d[] = {e->d_ent, e->d_bias, e->d_pen, e->d_rows};
    for (int i = 0; i < 4; i++)
        if (d[i])
            e->be->ops->free(e->be, d[i]);
    e->d_ent = e->d_bias = e->d_pen = e->d_rows = NULL;
    free(e->p_ent);
    free(e->p_bias);
    free(e->p_pen);
    free(e->p_rows);
    e->p_ent = NULL;
    e->p_bias = e->p_pen = e->p_rows = NULL;
    e->p_ent_cap = e->p_pen_cap = e->p_rows_cap = e->p_dent_cap = 0;
}

void engine_destroy(engine_t *e)
{
    if (!e)
        return;
    while (e->seqs) {
        engine_seq_t *s = e->seqs;
        e->seqs = s->next;
        engine__seq_free(e, s);
    }
    engine__proc_free(e);
    free(e->slot);
    if (e->tp) { /* the ranks own the contexts, arenas, models and backends */
        engine_tp_destroy(e->tp);
    } else {
        model_ctx_destroy(e->ctx);
        if (e->arena)
            e->be->ops->free(e->be, e->arena);
        model_destroy(e->m);
        backend_destroy(e->be);
    }
    kv_pool_destroy(e->pool);
    kv_tracker_destroy(e->tracker);
    free(e->b_tokens);
    free(e->b_qstart);
    free(e->b_ctx);
    free(e->b_rows);
    free(e->b_ntok);
    free(e->b_seqs);
    free(e->b_kv);
    free(e->b_raw);
    free(e->b_ids);
    free(e->b_status);
    free(e->b_pick);
    free(e->b_temp);
    free(e->b_topp);
    free(e->b_u);
    free(e->b_topk);
    free(e->b_ntop);
    free(e->b_out);
    free(e->b_lp);
    free(e->logits);
    free(e);
}

const model_t *engine_model(const engine_t *e)
{
    return e->m;
}
kv_pool_t *engine_pool(engine_t *e)
{
    return e->pool;
}
void *engine_arena(engine_t *e)
{
    return e->arena;
}
pd_backend_t *engine_backend(engine_t *e)
{
    return e->be;
}
kv_tracker_t *engine_tracker(engine_t *e)
{
    return e->tracker;
}
int engine_active(const engine_t *e)
{
    return e->n_active;
}

const sampler_logprobs_t *engine_token_logprobs(const engine_t *e)
{
    return e->cur_lp;
}

kv_seq_t *engine_debug_seq_kv(engine_t *e, uint64_t seq_id)
{
    for (engine_seq_t *s = e->seqs; s; s = s->next)
        if (s->id == seq_id)
            return &s->kv;
    return NULL;
}

/* ==== logits processing ==== */

/* Checks gp's logits-processing fields. PD_OK or PD_ERR_INVALID (logged). */
static pd_status_t engine__check_proc(const engine_gen_params_t *gp, int vocab)
{
    if (!isfinite(gp->presence_penalty) || !isfinite(gp->frequency_penalty) ||
        !isfinite(gp->repetition_penalty) || gp->repetition_penalty < 0.0f) {
        pd_log_error("request: penalties must be finite (repetition_penalty > 0)");
        return PD_ERR_INVALID;
    }
    if (gp->n_bias < 0 || (gp->n_bias > 0 && (!gp->bias_ids || !gp->bias_vals))) {
        pd_log_error("request: logit_bias of %d entries without ids or values", gp->n_bias);
        return PD_ERR_INVALID;
    }
    for (int i = 0; i < gp->n_bias; i++) {
        if (gp->bias_ids[i] < 0 || gp->bias_ids[i] >= vocab || !isfinite(gp->bias_vals[i])) {
            pd_log_error("request: logit_bias token %d (bias %g) outside the vocabulary of %d",
                         gp->bias_ids[i], gp->bias_vals[i], vocab);
            return PD_ERR_INVALID;
        }
    }
    if (gp->top_logprobs < 0 || gp->top_logprobs > SAMPLER_MAX_TOP_LOGPROBS || gp->min_tokens < 0 ||
        gp->n_samples < 0) {
        pd_log_error("request: top_logprobs %d (0..%d), min_tokens %d, n %d out of range",
                     gp->top_logprobs, SAMPLER_MAX_TOP_LOGPROBS, gp->min_tokens, gp->n_samples);
        return PD_ERR_INVALID;
    }
    return PD_OK;
}

static bool engine__penalized(const engine_gen_params_t *gp)
{
    return gp->presence_penalty != 0.0f || gp->frequency_penalty != 0.0f ||
           (gp->repetition_penalty != 0.0f && gp->repetition_penalty != 1.0f);
}

/* Notes token tok among s's generated tokens (penalties). */
static void engine__count(engine_seq_t *s, int32_t tok)
{
    if (!s->counts)
        return;
    if (s->counts[tok]++ == 0 && !(s->in_prompt && s->in_prompt[tok]))
        s->seen[s->n_seen++] = tok;
}

/* The processing state of s from gp (counts of the tokens generated before, the prompt set).
 * PD_OK or PD_ERR_NOMEM. */
static pd_status_t engine__proc_init(engine_seq_t *s, const engine_gen_params_t *gp, int vocab)
{
    if (gp->n_bias) {
        s->bias_ids = malloc((size_t)gp->n_bias * sizeof *s->bias_ids);
        s->bias_vals = malloc((size_t)gp->n_bias * sizeof *s->bias_vals);
        if (!s->bias_ids || !s->bias_vals)
            return PD_ERR_NOMEM;
        memcpy(s->bias_ids, gp->bias_ids, (size_t)gp->n_bias * sizeof *s->bias_ids);
        memcpy(s->bias_vals, gp->bias_vals, (size_t)gp->n_bias * sizeof *s->bias_vals);
    }
    s->gp.bias_ids = s->bias_ids;
    s->gp.bias_vals = s->bias_vals;
    if (!engine__penalized(gp))
        return PD_OK;
    const int before = s->n_before < s->n_tokens ? s->n_before : s->n_tokens - 1;
    const int n_prompt = s->n_tokens - before;
    bool rep = gp->repetition_penalty != 0.0f && gp->repetition_penalty != 1.0f;
    s->counts = calloc((size_t)vocab, sizeof *s->counts);
    s->in_prompt = rep ? calloc((size_t)vocab, 1) : NULL;
    s->seen_cap = vocab;
    s->seen = malloc((size_t)vocab * sizeof *s->seen);
    if (!s->counts || (rep && !s->in_prompt) || !s->seen)
        return PD_ERR_NOMEM;
    for (int i = 0; rep && i < n_prompt; i++) {
        if (!s->in_prompt[s->tokens[i]])
            s->seen[s->n_seen++] = s->tokens[i];
        s->in_prompt[s->tokens[i]] = 1;
    }
    for (int i = n_prompt; i < s->n_tokens; i++)
        engine__count(s, s->tokens[i]);
    return PD_OK;
}

/* Whether s's logits need the backend's processing now, and the ids masked by min_tokens. */
static bool engine__min_tokens_active(const engine_seq_t *s)
{
    return s->gp.min_tokens > 0 && s->n_before + s->n_generated < s->gp.min_tokens;
}

static bool engine__needs_process(const engine_seq_t *s)
{
    return s->counts || s->gp.n_bias > 0 || engine__min_tokens_active(s);
}

/* Grows the processing buffers for rows rows of logits and ents entries: the host staging
 * (penalties, entries) and, dev (engine__pick), the host rows and the backend copies. */
static pd_status_t engine__proc_reserve(engine_t *e, int rows, int ents, bool dev)
{
    const size_t vocab = (size_t)e->m->cfg.vocab_size;
    pd_backend_t *be = e->be;
    pd_status_t st;

    if (!e->slot) {
        if (!(e->slot = malloc(vocab * sizeof *e->slot)))
            return PD_ERR_NOMEM;
        for (size_t v = 0; v < vocab; v++)
            e->slot[v] = -1;
    }
    if (rows > e->p_pen_cap) {
        int cap = rows > 2 * e->p_pen_cap ? rows : 2 * e->p_pen_cap;
        float *pen = realloc(e->p_pen, (size_t)cap * 3 * sizeof *pen);
        if (!pen)
            return PD_ERR_NOMEM;
        e->p_pen = pen;
        e->p_pen_cap = cap;
    }
    if (dev && rows > e->p_rows_cap) {
        int cap = rows > 2 * e->p_rows_cap ? rows : 2 * e->p_rows_cap;
        if (cap > e->p_pen_cap) {
            float *pen = realloc(e->p_pen, (size_t)cap * 3 * sizeof *pen);
            if (!pen)
                return PD_ERR_NOMEM;
            e->p_pen = pen;
            e->p_pen_cap = cap;
        }
        float *pr = realloc(e->p_rows, (size_t)cap * vocab * sizeof *pr);
        if (!pr)
            return PD_ERR_NOMEM;
        e->p_rows = pr;
        if (e->d_pen)
            be->ops->free(be, e->d_pen);
        if (e->d_rows)
            be->ops->free(be, e->d_rows);
        e->d_pen = e->d_rows = NULL;
        if ((st = be->ops->alloc(be, (size_t)cap * 3 * sizeof(float), &e->d_pen)) != PD_OK ||
            (st = be->ops->alloc(be, (size_t)cap * vocab * sizeof(float), &e->d_rows)) != PD_OK) {
            engine__proc_free(e);
            return st;
        }
        e->p_rows_cap = cap;
    }
    if (ents > e->p_ent_cap) {
        int cap = ents > 2 * e->p_ent_cap ? ents : 2 * e->p_ent_cap;
        int32_t *ent = realloc(e->p_ent, (size_t)cap * 4 * sizeof *ent);
        if (!ent)
            return PD_ERR_NOMEM;
        e->p_ent = ent;
        float *bias = realloc(e->p_bias, (size_t)cap * sizeof *bias);
        if (!bias)
            return PD_ERR_NOMEM;
        e->p_bias = bias;
        e->p_ent_cap = cap;
    }
    if (dev && e->p_ent_cap > e->p_dent_cap) {
        if (e->d_ent)
            be->ops->free(be, e->d_ent);
        if (e->d_bias)
            be->ops->free(be, e->d_bias);
        e->d_ent = e->d_bias = NULL;
        if ((st = be->ops->alloc(be, (size_t)e->p_ent_cap * 4 * sizeof(int32_t), &e->d_ent)) !=
                PD_OK ||
            (st = be->ops->alloc(be, (size_t)e->p_ent_cap * sizeof(float), &e->d_bias)) != PD_OK) {
            engine__proc_free(e);
            return st;
        }
        e->p_dent_cap = e->p_ent_cap;
    }
    return PD_OK;
}

/* Adds (or finds) the entry of token tok in row; returns its index. */
static int engine__ent(engine_t *e, int *n_ent, int row, int32_t tok)
{
    int j = e->slot[tok];
    if (j >= 0)
        return j;
    j = (*n_ent)++;
    e->slot[tok] = j;
    e->p_ent[4 * j] = row;
    e->p_ent[4 * j + 1] = tok;
    e->p_ent[4 * j + 2] = 0;
    e->p_ent[4 * j + 3] = 0;
    e->p_bias[j] = 0.0f;
    return j;
}

/* Builds row's entries for s (its penalties, bias and min_tokens masks) from entry *n_ent on. */
static void engine__row_entries(engine_t *e, const engine_seq_t *s, int row, int *n_ent)
{
    const int first = *n_ent;
    const hf_config_t *cfg = &e->m->cfg;
    const float rep = s->gp.repetition_penalty == 0.0f ? 1.0f : s->gp.repetition_penalty;
    e->p_pen[3 * row] = s->gp.presence_penalty;
    e->p_pen[3 * row + 1] = s->gp.frequency_penalty;
    e->p_pen[3 * row + 2] = rep;
    for (int i = 0; i < s->n_seen; i++) {
        int32_t t = s->seen[i];
        int j = engine__ent(e, n_ent, row, t);
        e->p_ent[4 * j + 2] = s->counts[t];
        if (s->in_prompt && s->in_prompt[t])
            e->p_ent[4 * j + 3] |= SAMPLER_ENT_IN_PROMPT;
    }
    for (int i = 0; i < s->gp.n_bias; i++)
        e->p_bias[engine__ent(e, n_ent, row, s->bias_ids[i])] += s->bias_vals[i];
    if (engine__min_tokens_active(s)) {
        for (int i = 0; !s->gp.ignore_eos && i < cfg->n_eos; i++)
            if (cfg->eos_token_ids[i] >= 0 && cfg->eos_token_ids[i] < cfg->vocab_size)
                e->p_ent[4 * engine__ent(e, n_ent, row, cfg->eos_token_ids[i]) + 3] |=
                    SAMPLER_ENT_MASKED;
        for (int i = 0; i < s->gp.n_stop_ids; i++)
            if (s->stop_ids[i] >= 0 && s->stop_ids[i] < cfg->vocab_size)
                e->p_ent[4 * engine__ent(e, n_ent, row, s->stop_ids[i]) + 3] |= SAMPLER_ENT_MASKED;
    }
    for (int j = first; j < *n_ent; j++)
        e->slot[e->p_ent[4 * j + 1]] = -1;
}

/* Samples the next token of each seqs[i] from raw[i] (vocab logits, host): the rows that need it
 * go through the backend's logits_process first; logprobs (when asked) come from the raw row.
 * tok_out (n). Returns PD_OK, PD_ERR_NOMEM or the backend's error. */
static pd_status_t engine__pick(engine_t *e, engine_seq_t *const *seqs, const float *const *raw,
                                int n, int32_t *tok_out)
{
    const int vocab = e->m->cfg.vocab_size;
    pd_backend_t *be = e->be;
    int rows = 0, ents = 0, n_ent = 0;
    pd_status_t st;

    for (int i = 0; i < n; i++) {
        const engine_seq_t *s = seqs[i];
        if (!engine__needs_process(s))
            continue;
        rows++;
        ents += s->n_seen + s->gp.n_bias + s->gp.n_stop_ids + HF_MAX_EOS;
    }
    if (rows > 0) {
        if ((st = engine__proc_reserve(e, rows, ents, true)) != PD_OK)
            return st;
        int r = 0;
        for (int i = 0; i < n; i++) {
            if (!engine__needs_process(seqs[i]))
                continue;
            memcpy(e->p_rows + (size_t)r * vocab, raw[i], (size_t)vocab * sizeof(float));
            engine__row_entries(e, seqs[i], r, &n_ent);
            r++;
        }
        if ((st = be->ops->upload(be, e->d_rows, e->p_rows, (size_t)rows * vocab * 4)) ||
            (n_ent && (st = be->ops->upload(be, e->d_ent, e->p_ent, (size_t)n_ent * 16))) ||
            (n_ent && (st = be->ops->upload(be, e->d_bias, e->p_bias, (size_t)n_ent * 4))) ||
            (st = be->ops->upload(be, e->d_pen, e->p_pen, (size_t)rows * 12)))
            return st;
        be->ops->logits_process(be, e->d_rows, rows, vocab, e->d_ent, e->d_bias, n_ent, e->d_pen);
        /* download syncs the stream: a failed kernel reports here */
        if ((st = be->ops->download(be, e->p_rows, e->d_rows, (size_t)rows * vocab * 4)))
            return st;
    }
    int r = 0;
    for (int i = 0; i < n; i++) {
        engine_seq_t *s = seqs[i];
        const float *row = engine__needs_process(s) ? e->p_rows + (size_t)r++ * vocab : raw[i];
        tok_out[i] = sampler_sample(&s->sampler, row);
        if (s->gp.logprobs)
            sampler_logprobs(raw[i], vocab, tok_out[i], s->gp.top_logprobs, &s->lp);
    }
    return PD_OK;
}

/* The sampling plan of model_forward_sample for seqs[0..n) (logit row i: seqs[i]) in the step
 * scratch: each row's parameters and its draw (sampler_draw: the generator advances as
 * sampler_sample would), its logprobs request, and the logits-processing entries of the rows
 * that need them (engine__row_entries). PD_OK or PD_ERR_NOMEM. */
static pd_status_t engine__plan(engine_t *e, engine_seq_t *const *seqs, int n,
                                model_sampling_t *smp)
{
    int ents = 0, n_ent = 0;
    bool proc = false, lp = false;
    pd_status_t st;

    for (int i = 0; i < n; i++) {
        const engine_seq_t *s = seqs[i];
        lp |= s->gp.logprobs;
        if (!engine__needs_process(s))
            continue;
        proc = true;
        ents += s->n_seen + s->gp.n_bias + s->gp.n_stop_ids + HF_MAX_EOS;
    }
    if (proc && (st = engine__proc_reserve(e, n, ents, false)) != PD_OK)
        return st;
    for (int i = 0; i < n; i++) {
        engine_seq_t *s = seqs[i];
        e->b_temp[i] = s->sampler.p.temperature;
        e->b_topk[i] = s->sampler.p.top_k;
        e->b_topp[i] = s->sampler.p.top_p;
        e->b_u[i] = sampler_draw(&s->sampler);
        e->b_ntop[i] = s->gp.logprobs ? s->gp.top_logprobs : -1;
        if (proc && engine__needs_process(s)) {
            engine__row_entries(e, s, i, &n_ent);
        } else if (proc) {
            e->p_pen[3 * i] = e->p_pen[3 * i + 1] = 0.0f;
            e->p_pen[3 * i + 2] = 1.0f;
        }
    }
    *smp = (model_sampling_t){e->b_temp, e->b_topk, e->b_topp, e->b_u,  lp ? e->b_ntop : NULL,
                              n_ent,     e->p_ent,  e->p_bias, e->p_pen};
    return PD_OK;
}

/* Reports token tok of s to its callback (with its logprobs). */
static void engine__report(engine_t *e, engine_seq_t *s, int32_t tok)
{
    if (!s->cb)
        return;
    e->cur_lp = s->gp.logprobs ? &s->lp : NULL;
    s->cb(s->arg, s->id, tok, ENGINE_FINISH_NONE, PD_OK);
    e->cur_lp = NULL;
}

static pd_status_t engine__seq_new(engine_t *e, const int32_t *tokens, int n_tokens,
                                   const engine_gen_params_t *gp, engine_token_fn cb, void *arg,
                                   engine_seq_t **s_p)
{
    const int ctx_len = e->m->cfg.max_position_embeddings, vocab = e->m->cfg.vocab_size;
    engine_seq_t *s;
    pd_status_t st;

    if (n_tokens <= 0) {
        pd_log_error("request: empty prompt");
        return PD_ERR_INVALID;
    }
    if (n_tokens + 1 > ctx_len) {
        pd_log_error("request: prompt of %d tokens leaves no room in the context of %d tokens",
                     n_tokens, ctx_len);
        return PD_ERR_TOO_LONG;
    }
    if (gp->max_tokens <= 0) {
        pd_log_error("request: max_tokens %d must be at least 1", gp->max_tokens);
        return PD_ERR_INVALID;
    }
    for (int i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0 || tokens[i] >= vocab) {
            pd_log_error("request: token id %d at %d outside the vocabulary of %d", tokens[i], i,
                         vocab);
            return PD_ERR_INVALID;
        }
    }
    if ((st = engine__check_proc(gp, vocab)) != PD_OK)
        return st;
    s = calloc(1, sizeof *s);
    if (!s)
        return PD_ERR_NOMEM;
    s->cap = n_tokens + (gp->max_tokens < ctx_len ? gp->max_tokens : ctx_len) + 1;
    s->tokens = malloc((size_t)s->cap * sizeof *s->tokens);
    s->stop_ids = gp->n_stop_ids ? malloc((size_t)gp->n_stop_ids * sizeof *s->stop_ids) : NULL;
    if (!s->tokens || (gp->n_stop_ids && !s->stop_ids)) {
        free(s->tokens);
        free(s->stop_ids);
        free(s);
        return PD_ERR_NOMEM;
    }
    sampler_params_t sp = gp->sampling;
    sp.seed = sampler_seed_for(sp.seed, gp->sample_index);
    if ((st = sampler_init(&s->sampler, &sp, vocab)) != PD_OK) {
        free(s->tokens);
        free(s->stop_ids);
        free(s);
        return st;
    }
    sampler_skip(&s->sampler, (uint64_t)(gp->n_generated > 0 ? gp->n_generated : 0));
    memcpy(s->tokens, tokens, (size_t)n_tokens * sizeof *tokens);
    if (gp->n_stop_ids)
        memcpy(s->stop_ids, gp->stop_ids, (size_t)gp->n_stop_ids * sizeof *s->stop_ids);
    s->n_tokens = s->n_prompt = n_tokens;
    s->gp = *gp;
    s->gp.stop_ids = s->stop_ids;
    s->n_before = gp->n_generated > 0 ? gp->n_generated : 0;
    if (engine__proc_init(s, gp, vocab) != PD_OK) {
        s->kv = (kv_seq_t){0};
        engine__seq_free(e, s);
        return PD_ERR_NOMEM;
    }
    s->cb = cb;
    s->arg = arg;
    s->id = e->next_id++;
    kv_seq_init(&s->kv);
    *s_p = s;
    return PD_OK;
}

static void engine__link(engine_t *e, engine_seq_t *s)
{
    engine_seq_t **tail;
    for (tail = &e->seqs; *tail; tail = &(*tail)->next)
        ;
    *tail = s;
    e->n_active++;
}

pd_status_t engine_seq_add(engine_t *e, const int32_t *prompt, int n_prompt,
                           const engine_gen_params_t *gp, engine_token_fn cb, void *arg,
                           uint64_t *seq_id_p)
{
    engine_seq_t *s;
    pd_status_t st = engine__seq_new(e, prompt, n_prompt, gp, cb, arg, &s);
    if (st != PD_OK)
        return st;
    engine__link(e, s);
    *seq_id_p = s->id;
    return PD_OK;
}

pd_status_t engine_seq_add_prefilled(engine_t *e, const int32_t *tokens, int n_tokens,
                                     int n_computed, kv_seq_t *kv, const engine_gen_params_t *gp,
                                     engine_token_fn cb, void *arg, uint64_t *seq_id_p)
{
    engine_seq_t *s;
    pd_status_t st;

    if (n_computed <= 0 || n_computed >= n_tokens ||
        kv->n_pages < kv_pool_pages_for(e->pool, n_computed)) {
        pd_log_error("request: %d of %d tokens prefilled into %d pages: inconsistent", n_computed,
                     n_tokens, kv->n_pages);
        return PD_ERR_INVALID;
    }
    if ((st = engine__seq_new(e, tokens, n_tokens, gp, cb, arg, &s)) != PD_OK)
        return st;
    s->n_prompt = n_computed;
    s->n_computed = n_computed;
    s->kv = *kv;
    s->kv.n_tokens = n_computed;
    kv_seq_init(kv);
    engine__link(e, s);
    *seq_id_p = s->id;
    return PD_OK;
}

/* Unlinks s, reports its end and frees it. */
static void engine__finish(engine_t *e, engine_seq_t *s, engine_finish_t f, pd_status_t st)
{
    engine_seq_t **pp;
    for (pp = &e->seqs; *pp && *pp != s; pp = &(*pp)->next)
        ;
    PD_ASSERT(*pp == s);
    *pp = s->next;
    e->n_active--;
    if (s->cb)
        s->cb(s->arg, s->id, -1, f, st);
    engine__seq_free(e, s);
}

pd_status_t engine_seq_abort(engine_t *e, uint64_t seq_id)
{
    for (engine_seq_t *s = e->seqs; s; s = s->next) {
        if (s->id == seq_id) {
            engine__finish(e, s, ENGINE_FINISH_ABORT, PD_ERR_CANCELLED);
            return PD_OK;
        }
    }
    return PD_ERR_NOT_FOUND;
}

static pd_status_t engine__scratch(engine_t *e, int n_tokens, int n_seqs)
{
    int need = n_tokens > n_seqs ? n_tokens : n_seqs;
    if (need + 1 <= e->cap)
        return PD_OK;
    int cap = need + 1 > 2 * e->cap ? need + 1 : 2 * e->cap;
#define G(p) (p) = realloc((p), (size_t)cap * sizeof *(p))
    G(e->b_tokens);
    G(e->b_qstart);
    G(e->b_ctx);
    G(e->b_rows);
    G(e->b_ntok);
    G(e->b_seqs);
    G(e->b_kv);
    G(e->b_raw);
    G(e->b_ids);
    G(e->b_status);
    G(e->b_pick);
    G(e->b_temp);
    G(e->b_topp);
    G(e->b_u);
    G(e->b_topk);
    G(e->b_ntop);
    G(e->b_out);
    G(e->b_lp);
#undef G
    if (!e->b_tokens || !e->b_qstart || !e->b_ctx || !e->b_rows || !e->b_ntok || !e->b_seqs ||
        !e->b_kv || !e->b_raw || !e->b_ids || !e->b_status || !e->b_pick || !e->b_temp ||
        !e->b_topp || !e->b_u || !e->b_topk || !e->b_ntop || !e->b_out || !e->b_lp)
        return PD_ERR_NOMEM;
    e->cap = cap;
    return PD_OK;
}

static pd_status_t engine__logits(engine_t *e, int rows)
{
    size_t need = (size_t)rows * (size_t)e->m->cfg.vocab_size;
    if ((size_t)e->logits_cap >= need)
        return PD_OK;
    float *l = realloc(e->logits, need * sizeof *l);
    if (!l)
        return PD_ERR_NOMEM;
    e->logits = l;
    e->logits_cap = (int)need;
    return PD_OK;
}

/* Frees the pages of the newest sequence that holds any, other than keep; its tokens will be
 * recomputed. Returns false when there is none. */
static bool engine__preempt(engine_t *e, const engine_seq_t *keep)
{
    engine_seq_t *victim = NULL;
    for (engine_seq_t *s = e->seqs; s; s = s->next)
        if (s != keep && s->kv.n_pages > 0)
            victim = s;
    if (!victim)
        return false;
    kv_seq_release(e->pool, &victim->kv);
    victim->n_computed = 0;
    if (e->p.evict_on_preempt) {
        pd_log_info("seq %llu: evicted (kv pool full) after %d tokens",
                    (unsigned long long)victim->id, victim->n_tokens);
        victim->evicted = true; /* finished after this step's selection */
    } else {
        pd_log_info("seq %llu: preempted (kv pool full), its tokens will be recomputed",
                    (unsigned long long)victim->id);
    }
    return true;
}

/* Reserves pages so s can hold n tokens, preempting newer sequences if needed; stamps new pages
 * (this engine is their writer). */
static pd_status_t engine__reserve(engine_t *e, engine_seq_t *s, int n)
{
    int32_t before = s->kv.n_pages;
    pd_status_t st;
    while ((st = kv_seq_reserve(e->pool, &s->kv, n)) == PD_NO_PAGES)
        if (!engine__preempt(e, s))
            return PD_NO_PAGES;
    if (st != PD_OK)
        return st;
    engine__stamp(e, s->kv.pages + before, s->kv.n_pages - before);
    return PD_OK;
}

static bool engine__is_stop(const engine_t *e, const engine_seq_t *s, int32_t tok)
{
    return hf_config_is_stop(&e->m->cfg, tok, s->gp.ignore_eos, s->stop_ids, s->gp.n_stop_ids);
}

pd_status_t engine_step(engine_t *e)
{
    const int vocab = e->m->cfg.vocab_size, ctx_max = e->m->cfg.max_position_embeddings;
    int n_seqs = 0, n_tok = 0, n_rows = 0, budget = e->p.prefill_chunk, total = 0;
    pd_status_t st;
    engine_seq_t *s, *next;

    for (s = e->seqs; s; s = s->next)
        total += s->n_tokens - s->n_computed;
    if ((st = engine__scratch(e, total, e->n_active)) != PD_OK)
        return st;
    /* choose work: every sequence in arrival order; prompts limited by the chunk budget */
    for (s = e->seqs; s && n_seqs < e->p.max_batch; s = next) {
        next = s->next;
        int todo = s->n_tokens - s->n_computed;
        if (s->evicted)
            continue;
        if (todo > 1 && budget <= 0)
            continue;
        if (todo > 1 && todo > budget)
            todo = budget;
        if (todo <= 0)
            continue;
        st = engine__reserve(e, s, s->n_computed + todo);
        if (st == PD_NO_PAGES) {
            if (n_seqs == 0 && s->kv.n_pages == 0 && kv_pool_used_pages(e->pool) == 0) {
                pd_log_error("seq %llu: %d tokens do not fit the kv pool of %d pages",
                             (unsigned long long)s->id, s->n_computed + todo,
                             kv_pool_n_pages(e->pool));
                engine__finish(e, s, ENGINE_FINISH_ABORT, PD_ERR_RESOURCE);
            }
            break; /* the rest waits for pages */
        }
        if (st != PD_OK)
            return st;
        if (todo > 1)
            budget -= todo;
        e->b_seqs[n_seqs] = s;
        e->b_kv[n_seqs] = &s->kv;
        e->b_ids[n_seqs] = s->id;
        e->b_ntok[n_seqs] = s->n_computed; /* tokens already written: their pages are checked */
        e->b_qstart[n_seqs] = n_tok;
        memcpy(e->b_tokens + n_tok, s->tokens + s->n_computed, (size_t)todo * 4);
        n_tok += todo;
        e->b_ctx[n_seqs] = s->n_computed + todo;
        n_seqs++;
    }
    for (s = e->seqs; s; s = next) {
        next = s->next;
        if (s->evicted)
            engine__finish(e, s, ENGINE_FINISH_PREEMPTED, PD_NO_PAGES);
    }
    if (n_seqs == 0)
        return PD_OK;
    /* a preemption inside the loop may have emptied a sequence chosen earlier: drop those */
    int w = 0;
    n_tok = 0;
    for (int i = 0; i < n_seqs; i++) {
        s = e->b_seqs[i];
        int todo = e->b_ctx[i] - e->b_ntok[i];
        bool gone = true;
        for (engine_seq_t *t = e->seqs; t; t = t->next)
            gone &= t != s;
        if (gone || s->kv.n_pages < kv_pool_pages_for(e->pool, e->b_ctx[i]) ||
            s->n_computed != e->b_ntok[i])
            continue;
        memmove(e->b_tokens + n_tok, e->b_tokens + e->b_qstart[i], (size_t)todo * 4);
        e->b_seqs[w] = s;
        e->b_kv[w] = &s->kv;
        e->b_ids[w] = s->id;
        e->b_ntok[w] = e->b_ntok[i];
        e->b_ctx[w] = e->b_ctx[i];
        e->b_qstart[w] = n_tok;
        n_tok += todo;
        w++;
    }
    n_seqs = w;
    /* the integrity check, one batched pass, before attention */
    int bad = engine__check(e, e->b_kv, e->b_ntok, e->b_ids, n_seqs, e->b_status);
    if (bad < 0)
        return (pd_status_t)bad;
    if (bad > 0) {
        w = 0;
        n_tok = 0;
        for (int i = 0; i < n_seqs; i++) {
            s = e->b_seqs[i];
            int todo = e->b_ctx[i] - e->b_ntok[i];
            if (e->b_status[i] != PD_OK) {
                engine__finish(e, s, ENGINE_FINISH_ABORT, e->b_status[i]);
                continue;
            }
            memmove(e->b_tokens + n_tok, e->b_tokens + e->b_qstart[i], (size_t)todo * 4);
            e->b_seqs[w] = s;
            e->b_kv[w] = &s->kv;
            e->b_ntok[w] = e->b_ntok[i];
            e->b_ctx[w] = e->b_ctx[i];
            e->b_qstart[w] = n_tok;
            n_tok += todo;
            w++;
        }
        n_seqs = w;
        if (n_seqs == 0)
            return PD_OK;
    }
    e->b_qstart[n_seqs] = n_tok;
    /* logits for sequences whose last known token is in this step; they are sampled on the
     * backend inside the step (model_forward_sample) where it can, else here from the logits */
    const bool dev = !e->tp && model_ctx_can_sample(e->ctx); /* TP: ranks, host sampling */
    engine_seq_t **pick = e->b_pick;
    for (int i = 0; i < n_seqs; i++)
        if (e->b_ctx[i] == e->b_seqs[i]->n_tokens) {
            pick[n_rows] = e->b_seqs[i];
            e->b_rows[n_rows++] = e->b_qstart[i + 1] - 1;
        }
    model_sampling_t smp;
    model_batch_t b = {n_tok,    e->b_tokens, n_seqs, e->b_qstart,
                       e->b_ctx, e->b_kv,     n_rows, e->b_rows};
    if (dev) {
        if ((st = engine__plan(e, pick, n_rows, &smp)) == PD_OK)
            st = model_forward_sample(e->ctx, e->arena, &e->layout, &b, &smp, e->b_out, e->b_lp);
    } else if ((st = engine__logits(e, n_rows)) == PD_OK) {
        st = engine__forward(e, &b, e->logits);
    }
    if (st != PD_OK) {
        for (int i = 0; i < n_seqs; i++)
            engine__finish(e, e->b_seqs[i], ENGINE_FINISH_ABORT, st);
        return st;
    }
    for (int i = 0; i < n_seqs; i++) {
        s = e->b_seqs[i];
        s->n_computed = e->b_ctx[i];
        s->kv.n_tokens = s->n_computed;
    }
    const int r = n_rows;
    if (dev) {
        for (int i = 0; i < r; i++)
            if (pick[i]->gp.logprobs)
                pick[i]->lp = e->b_lp[i];
    } else {
        const float **raw = e->b_raw;
        for (int i = 0; i < r; i++)
            raw[i] = e->logits + (size_t)i * vocab;
        if ((st = engine__pick(e, pick, raw, r, e->b_out)) != PD_OK) {
            for (int i = 0; i < r; i++)
                engine__finish(e, pick[i], ENGINE_FINISH_ABORT, st);
            return st;
        }
    }
    for (int i = 0; i < r; i++) {
        s = pick[i];
        int32_t tok = e->b_out[i];
        s->tokens[s->n_tokens++] = tok;
        s->n_generated++;
        engine__count(s, tok);
        bool stop = engine__is_stop(e, s, tok);
        engine__report(e, s, tok);
        if (stop)
            engine__finish(e, s, ENGINE_FINISH_STOP, PD_OK);
        else if (s->n_generated >= s->gp.max_tokens || s->n_tokens >= ctx_max)
            engine__finish(e, s, ENGINE_FINISH_LENGTH, PD_OK);
    }
    return PD_OK;
}

pd_status_t engine_run(engine_t *e)
{
    while (e->n_active > 0) {
        pd_status_t st = engine_step(e);
        if (st != PD_OK)
            return st;
    }
    return PD_OK;
}

static pd_status_t engine__score(engine_t *e, const int32_t *input, int n, int first_row,
                                 const int32_t *targets, double *nll_p, float *logits_last,
                                 int32_t *argmax_out)
{
    const int vocab = e->m->cfg.vocab_size, chunk = e->p.prefill_chunk;
    kv_seq_t kv;
    const kv_seq_t *kvp = &kv;
    double nll = 0.0;
    pd_status_t st;

    if (n <= 0 || n > e->m->cfg.max_position_embeddings)
        return PD_ERR_TOO_LONG;
    kv_seq_init(&kv);
    if ((st = kv_seq_reserve(e->pool, &kv, n)) != PD_OK)
        goto out;
    engine__stamp(e, kv.pages, kv.n_pages);
    if ((st = engine__scratch(e, chunk, 1)) != PD_OK || (st = engine__logits(e, chunk)) != PD_OK)
        goto out;
    for (int s0 = 0; s0 < n; s0 += chunk) {
        int len = n - s0 < chunk ? n - s0 : chunk;
        int32_t qs[2] = {0, len}, ctx = s0 + len;
        for (int i = 0; i < len; i++)
            e->b_rows[i] = i;
        model_batch_t b = {len, input + s0, 1, qs, &ctx, &kvp, len, e->b_rows};
        if ((st = engine__forward(e, &b, e->logits)) != PD_OK)
            goto out;
        for (int i = 0; i < len; i++) {
            int row = s0 + i;
            const float *lg = e->logits + (size_t)i * vocab;
            if (row == n - 1 && logits_last)
                memcpy(logits_last, lg, (size_t)vocab * sizeof *lg);
            if (row < first_row)
                continue;
            if (argmax_out)
                argmax_out[row - first_row] = sampler_argmax(lg, vocab);
            if (!targets)
                continue;
            double mx = lg[0], sum = 0.0;
            for (int v = 1; v < vocab; v++)
                mx = lg[v] > mx ? lg[v] : mx;
            for (int v = 0; v < vocab; v++)
                sum += exp((double)lg[v] - mx);
            nll -= (double)lg[targets[row - first_row]] - mx - log(sum);
        }
    }
    *nll_p = nll;
out:
    kv_seq_release(e->pool, &kv);
    kv_seq_deinit(&kv);
    return st;
}

pd_status_t engine_score(engine_t *e, const int32_t *input, int n, int first_row,
                         const int32_t *targets, double *nll_p, float *logits_last)
{
    return engine__score(e, input, n, first_row, targets, nll_p, logits_last, NULL);
}

pd_status_t engine_score_top1(engine_t *e, const int32_t *input, int n, int first_row,
                              const int32_t *targets, double *nll_p, int32_t *argmax_out)
{
    return engine__score(e, input, n, first_row, targets, nll_p, NULL, argmax_out);
}

/* One chunk's per-layer hook: the pages it completes. */
typedef struct {
    engine_t *e;
    const kv_seq_t *kv;
    int first, n;
} engine_layer_call_t;

static void engine__layer_tramp(void *arg, int layer)
{
    engine_layer_call_t *lc = arg;
    lc->e->layer_fn(lc->e->layer_arg, lc->kv, lc->first, lc->n, layer);
}

bool engine_set_prefill_layer_hook(engine_t *e, engine_layer_fn fn, void *arg)
{
    if (fn) { /* ask the model now, so the caller knows before its first prefill */
        if (!model_ctx_set_layer_hook(e->ctx, engine__layer_tramp, NULL))
            return false;
        model_ctx_set_layer_hook(e->ctx, NULL, NULL);
    }
    e->layer_fn = fn;
    e->layer_arg = arg;
    return true;
}

pd_status_t engine_prefill(engine_t *e, const int32_t *tokens, int n, const engine_gen_params_t *gp,
                           engine_pages_fn on_pages, void *arg, int32_t *first_p, kv_seq_t *kv_out,
                           sampler_logprobs_t *lp_out)
{
    const int chunk = e->p.prefill_chunk, P = e->p.page_tokens, vocab = e->m->cfg.vocab_size;
    const int n_samples = gp->n_samples > 1 ? gp->n_samples : 1;
    const bool plp = gp->prompt_logprobs && lp_out;
    engine_seq_t **probes = calloc((size_t)n_samples, sizeof *probes);
    const float **raw = malloc((size_t)n_samples * sizeof *raw);
    kv_seq_t kv;
    const kv_seq_t *kvp = &kv;
    int done_pages = 0, last_row = 0;
    pd_status_t st = PD_OK;

    kv_seq_init(&kv);
    if (!probes || !raw) {
        st = PD_ERR_NOMEM;
        goto err;
    }
    /* validation as for any sequence (prompt length, ids, sampling); one probe per sample holds
     * its sampler and logits-processing state */
    for (int i = 0; i < n_samples; i++) {
        engine_gen_params_t g = *gp;
        g.sample_index = gp->sample_index + (uint32_t)i;
        if ((st = engine__seq_new(e, tokens, n, &g, NULL, NULL, &probes[i])) != PD_OK)
            goto err;
    }
    if ((st = kv_seq_reserve(e->pool, &kv, n)) != PD_OK)
        goto err;
    engine__stamp(e, kv.pages, kv.n_pages);
    /* the first tokens are sampled on the backend (model_forward_sample: n_samples logit rows,
     * all the prompt's last) unless every prompt row's logits come to the host anyway */
    const bool dev = !plp && !e->tp && model_ctx_can_sample(e->ctx);
    if ((st = engine__scratch(e, chunk > n_samples ? chunk : n_samples, 1)) != PD_OK ||
        (!dev && (st = engine__logits(e, plp ? chunk : 1)) != PD_OK))
        goto err;
    for (int s0 = 0; s0 < n; s0 += chunk) {
        int len = n - s0 < chunk ? n - s0 : chunk;
        int32_t qs[2] = {0, len}, ctx = s0 + len, row = len - 1;
        const bool last = s0 + len == n;
        model_batch_t b = {len, tokens + s0, 1, qs, &ctx, &kvp, last ? 1 : 0, &row};
        if (plp) { /* every row's logits: row i scores token s0 + i + 1 */
            for (int i = 0; i < len; i++)
                e->b_rows[i] = i;
            b.n_logits = len;
            b.logit_rows = e->b_rows;
        }
        int full = last ? kv.n_pages : ctx / P;
        engine_layer_call_t lc = {e, &kv, done_pages, full - done_pages};
        const bool hook = e->layer_fn && !e->tp && full > done_pages && /* rank 0 only: TP 1 */
                          model_ctx_set_layer_hook(e->ctx, engine__layer_tramp, &lc);
        kv.n_tokens = ctx;
        if (dev && last) {
            model_sampling_t smp;
            for (int i = 0; i < n_samples; i++)
                e->b_rows[i] = row;
            b.n_logits = n_samples;
            b.logit_rows = e->b_rows;
            if ((st = engine__plan(e, probes, n_samples, &smp)) == PD_OK)
                st = model_forward_sample(e->ctx, e->arena, &e->layout, &b, &smp, first_p, e->b_lp);
            for (int i = 0; st == PD_OK && i < n_samples; i++)
                if (probes[i]->gp.logprobs)
                    probes[i]->lp = e->b_lp[i];
        } else {
            st = engine__forward(e, &b, dev ? NULL : e->logits);
        }
        if (hook)
            model_ctx_set_layer_hook(e->ctx, NULL, NULL);
        if (st != PD_OK) {
            goto err;
        }
        for (int i = 0; plp && i < len; i++)
            if (s0 + i + 1 < n)
                sampler_logprobs(e->logits + (size_t)i * vocab, vocab, tokens[s0 + i + 1],
                                 gp->top_logprobs, &lp_out[n_samples + s0 + i]);
        last_row = plp ? len - 1 : 0;
        if (on_pages && full > done_pages && on_pages(arg, &kv, done_pages, full - done_pages)) {
            st = PD_ERR_CANCELLED; /* the caller stops at this chunk boundary */
            goto err;
        }
        done_pages = full;
    }
    for (int i = 0; !dev && i < n_samples; i++)
        raw[i] = e->logits + (size_t)last_row * vocab;
    if (!dev && (st = engine__pick(e, probes, raw, n_samples, first_p)) != PD_OK)
        goto err;
    for (int i = 0; lp_out && gp->logprobs && i < n_samples; i++)
        lp_out[i] = probes[i]->lp;
    *kv_out = kv;
    goto out;
err:
    kv_seq_release(e->pool, &kv);
    kv_seq_deinit(&kv);
out:
    for (int i = 0; probes && i < n_samples; i++)
        if (probes[i])
            engine__seq_free(e, probes[i]);
    free(probes);
    free(raw);
    return st;
}

/* The writer checks its own pages [first, first + n) of kv first: a bookkeeping bug on this side
 * must not be stamped with the destination's valid tags. Fills pages_out with their ids. */
static pd_status_t engine__export_check(engine_t *e, const kv_seq_t *kv, int first, int n,
                                        int32_t *pages_out)
{
    kv_seq_t view = (kv_seq_t){n * e->layout.page_tokens, n, n, kv->pages + first};
    int32_t ntok = view.n_tokens;
    const kv_seq_t *one[1] = {&view};
    pd_status_t check;
    if (engine__check(e, one, &ntok, NULL, 1, &check) < 0)
        return PD_ERR_NOMEM;
    if (check != PD_OK) {
        pd_log_error("kv export: pages %d..%d fail their own tag check: not sent", first,
                     first + n - 1);
        return check;
    }
    for (int i = 0; i < n; i++)
        pages_out[i] = kv->pages[first + i].page;
    return PD_OK;
}

typedef struct {
    const kv_layout_t *l;
    const kv_seq_t *src, *dst;
} engine__copy_t;

/* Copies the pages of src into those of dst (as many as dst holds) in r's arena. */
static pd_status_t engine__copy_pages(engine_rank_t *r, void *arg)
{
    const engine__copy_t *a = arg;
    const size_t pb = a->l->page_bytes;
    for (int i = 0; i < a->dst->n_pages; i++) {
        pd_status_t st =
            r->be->ops->copy(r->be, (uint8_t *)r->arena + (size_t)a->dst->pages[i].page * pb,
                             (const uint8_t *)r->arena + (size_t)a->src->pages[i].page * pb, pb);
        if (st != PD_OK)
            return st;
    }
    return PD_OK;
}

pd_status_t engine_export_check(engine_t *e, const kv_seq_t *kv, int first, int n)
{
    int32_t *pages = malloc((size_t)(n > 0 ? n : 1) * sizeof *pages);
    pd_status_t st;
    if (!pages)
        return PD_ERR_NOMEM;
    st = engine__export_check(e, kv, first, n, pages);
    free(pages);
    return st;
}

pd_status_t engine_kv_copy(engine_t *e, const kv_seq_t *src, int n_tokens, kv_seq_t *dst)
{
    pd_status_t st;
    kv_seq_t kv;

    if (n_tokens <= 0 || src->n_tokens < n_tokens) {
        pd_log_error("kv copy: %d tokens of a sequence holding %d", n_tokens, src->n_tokens);
        return PD_ERR_INVALID;
    }
    kv_seq_init(&kv);
    if ((st = kv_seq_reserve(e->pool, &kv, n_tokens)) != PD_OK) {
        kv_seq_deinit(&kv);
        return st;
    }
    engine__copy_t a = {&e->layout, src, &kv};
    engine_rank_t r0 = {.rank = 0, .be = e->be, .arena = e->arena};
    st = e->tp ? engine_tp_run(e->tp, engine__copy_pages, &a, ENGINE_TP_PARALLEL)
               : engine__copy_pages(&r0, &a);
    if (st != PD_OK) {
        kv_seq_release(e->pool, &kv);
        kv_seq_deinit(&kv);
        return st;
    }
    /* the copies carry the source's stamps: stamp them with their own tags */
    engine__stamp(e, kv.pages, kv.n_pages);
    kv.n_tokens = n_tokens;
    *dst = kv;
    return PD_OK;
}

typedef struct {
    const kv_layout_t *src_l; /* this engine's rank layout in the destination's format */
    const kv_layout_t *own_l; /* this engine's rank layout (its pool's format) */
    const int32_t *pages;     /* (n) source pages */
    int n;
    uint8_t **host; /* (tp) each rank's pages as exported, (n, src_l page bytes) */
} engine__export_t;

static pd_status_t engine__tp_export(engine_rank_t *r, void *arg)
{
    const engine__export_t *a = arg;
    const size_t bytes = (size_t)a->n * a->src_l->page_bytes;
    void *dev = NULL;
    pd_status_t st;
    if ((st = r->be->ops->alloc(r->be, bytes, &dev)) != PD_OK)
        return st;
    r->be->ops->kv_export(r->be, dev, a->src_l, r->arena, a->own_l, a->pages, a->n);
    st = r->be->ops->download(r->be, a->host[r->rank], dev, bytes);
    r->be->ops->free(r->be, dev);
    return st;
}

/* engine_export_pages when this engine runs tp ranks or dst_l is a wire layout: each rank
 * converts its KV heads into dst_l's format, the host copies are re-sliced into dst_l's slices
 * (tp_kv_wire_fill), every slice's header stamped. */
static pd_status_t engine__export_tp(engine_t *e, const int32_t *pages, int n,
                                     const kv_layout_t *dst_l, const kv_page_ref_t *dst_refs,
                                     uint8_t *host_out)
{
    const int p = engine_tp(e), d = dst_l->n_slices > 0 ? dst_l->n_slices : 1;
    const size_t slice = tp_kv_slice_bytes(dst_l);
    kv_layout_t src_l;
    pd_status_t st = PD_ERR_NOMEM;
    /* this engine's rank layout, in the destination's KV format */
    kv_layout_init_sides(&src_l, e->layout.n_layers, e->layout.n_kv_heads, e->layout.head_dim,
                         e->layout.n_sides, e->layout.page_tokens, dst_l->fmt);
    if (dst_l->n_kv_heads * d != e->layout.n_kv_heads * p || dst_l->n_layers != src_l.n_layers ||
        dst_l->head_dim != src_l.head_dim || dst_l->page_tokens != src_l.page_tokens ||
        dst_l->n_sides != src_l.n_sides) {
        pd_log_error("kv export: tp %d pages (%d kv heads each) do not fit tp %d pages of %d kv "
                     "heads",
                     p, e->layout.n_kv_heads, d, dst_l->n_kv_heads);
        return PD_ERR_INVALID;
    }
    uint8_t **host = calloc((size_t)p, sizeof *host);
    if (!host)
        return PD_ERR_NOMEM;
    for (int r = 0; r < p; r++)
        if (!(host[r] = malloc((size_t)n * src_l.page_bytes)))
            goto out;
    engine__export_t a = {&src_l, &e->layout, pages, n, host};
    if (e->tp) {
        st = engine_tp_run(e->tp, engine__tp_export, &a, ENGINE_TP_PARALLEL);
    } else {
        engine_rank_t r0 = {.rank = 0, .be = e->be, .arena = e->arena};
        st = engine__tp_export(&r0, &a);
    }
    if (st != PD_OK) {
        pd_log_error("kv export: %d pages: %s", n, pd_status_str(st));
        goto out;
    }
    for (int r = 0; r < p && st == PD_OK; r++)
        st = tp_kv_wire_fill(host_out, dst_l, host[r], &src_l, r, p, n);
    for (int i = 0; st == PD_OK && i < n; i++) /* each slice: the tag the destination handed out */
        for (int q = 0; q < d; q++)
            memcpy(host_out + (size_t)i * dst_l->page_bytes + (size_t)q * slice, &dst_refs[i].tag,
                   sizeof dst_refs[i].tag);
out:
    for (int r = 0; r < p; r++)
        free(host[r]);
    free(host);
    return st;
}

pd_status_t engine_export_pages(engine_t *e, const kv_seq_t *kv, int first, int n,
                                const kv_layout_t *dst_l, const kv_page_ref_t *dst_refs,
                                uint8_t *host_out)
{
    pd_backend_t *be = e->be;
    const size_t pb = dst_l->page_bytes;
    int32_t *pages = malloc((size_t)n * sizeof *pages);
    pd_status_t st;
    void *dev = NULL;

    if (!pages)
        return PD_ERR_NOMEM;
    if ((st = engine__export_check(e, kv, first, n, pages)) != PD_OK)
        goto out;
    if (e->tp || dst_l->n_slices > 1) {
        st = engine__export_tp(e, pages, n, dst_l, dst_refs, host_out);
        goto out;
    }
    if ((st = be->ops->alloc(be, (size_t)n * pb, &dev)) != PD_OK)
        goto out;
    be->ops->kv_export(be, dev, dst_l, e->arena, &e->layout, pages, n);
    /* download syncs the stream: a failed conversion kernel reports here */
    if ((st = be->ops->download(be, host_out, dev, (size_t)n * pb)) != PD_OK) {
        pd_log_error("kv export: pages %d..%d: %s", first, first + n - 1, pd_status_str(st));
        goto out;
    }
    for (int i = 0; i < n; i++) /* the writer's stamp: the tag the destination handed out */
        memcpy(host_out + (size_t)i * pb, &dst_refs[i].tag, sizeof dst_refs[i].tag);
out:
    if (dev)
        be->ops->free(be, dev);
    free(pages);
    return st;
}

pd_status_t engine_export_pages_dev(engine_t *e, const kv_seq_t *kv, int first, int n,
                                    const kv_layout_t *dst_l, const kv_page_ref_t *dst_refs,
                                    void *dev_out)
{
    pd_backend_t *be = e->be;
    int32_t *pages = malloc((size_t)n * 2 * sizeof *pages);
    kv_tag_t *tags = malloc((size_t)n * sizeof *tags);
    pd_status_t st = PD_ERR_NOMEM;

    if (!pages || !tags)
        goto out;
    if (e->tp || dst_l->n_slices > 1) {
        pd_log_error("kv export: tensor-parallel pages go through host memory, not GPU -> GPU");
        st = PD_ERR_UNSUPPORTED;
        goto out;
    }
    if ((st = engine__export_check(e, kv, first, n, pages)) != PD_OK)
        goto out;
    be->ops->kv_export(be, dev_out, dst_l, e->arena, &e->layout, pages, n);
    for (int i = 0; i < n; i++) { /* the writer's stamp: the tag the destination handed out */
        pages[n + i] = i;
        tags[i] = dst_refs[i].tag;
    }
    be->ops->kv_stamp(be, dev_out, dst_l, pages + n, tags, n);
out:
    free(pages);
    free(tags);
    return st;
}

typedef struct {
    const kv_layout_t *l; /* the engine's rank layout */
    const uint8_t *wire;  /* wire pages: page pages[i] at (packed ? i : pages[i]) * wire_pb */
    size_t wire_pb;
    int packed;
    const int32_t *pages;
    int n;
    const uint64_t *want; /* (tp) slice checksums to check first, or NULL */
    uint64_t seq;
    int *bad; /* (tp) with want: 1 where the rank's slice differs */
} engine__import_t;

static pd_status_t engine__tp_import(engine_rank_t *r, void *arg)
{
    const engine__import_t *a = arg;
    const size_t pb = a->l->page_bytes;
    if (a->want) { /* this rank's slice, as it landed, against what the writer sent */
        kv_layout_t wl = *a->l;
        wl.page_bytes = a->wire_pb;
        wl.n_slices = (int)(a->wire_pb / pb);
        uint64_t h = 0;
        for (int i = 0; i < a->n; i++) {
            const int32_t at = a->packed ? i : a->pages[i];
            h = tp_kv_slice_checksum(h, a->wire, &at, 1, &wl, r->rank);
        }
        a->bad[r->rank] = h != a->want[r->rank];
        if (a->bad[r->rank]) {
            pd_log_error("seq %llu: tp rank %d's kv slice checksum %016llx != %016llx sent: the "
                         "slice changed in flight; failed",
                         (unsigned long long)a->seq, r->rank, (unsigned long long)h,
                         (unsigned long long)a->want[r->rank]);
            return PD_ERR_KV_INTEGRITY;
        }
    }
    for (int i = 0; i < a->n; i++) {
        pd_status_t st = r->be->ops->upload(
            r->be, (uint8_t *)r->arena + (size_t)a->pages[i] * pb,
            a->wire + (size_t)(a->packed ? i : a->pages[i]) * a->wire_pb + (size_t)r->rank * pb,
            pb);
        if (st != PD_OK)
            return st;
    }
    return PD_OK;
}

pd_status_t engine_import_pages(engine_t *e, const uint8_t *wire, int packed, const int32_t *pages,
                                int n)
{
    engine__import_t a = {&e->layout, wire,  e->layout.page_bytes * (size_t)engine_tp(e),
                          packed,     pages, n,
                          NULL,       0,     NULL};
    if (e->tp)
        return engine_tp_run(e->tp, engine__tp_import, &a, ENGINE_TP_PARALLEL);
    engine_rank_t r0 = {.rank = 0, .be = e->be, .arena = e->arena};
    return engine__tp_import(&r0, &a);
}

pd_status_t engine_import_pages_checked(engine_t *e, const uint8_t *wire, int packed,
                                        const int32_t *pages, int n, const uint64_t *want,
                                        uint64_t seq, int *bad_p)
{
    const int tp = engine_tp(e);
    int bad[64] = {0};
    engine__import_t a = {
        &e->layout, wire, e->layout.page_bytes * (size_t)tp, packed, pages, n, want, seq, bad};
    pd_status_t st;
    if (e->tp) {
        st = engine_tp_run(e->tp, engine__tp_import, &a, ENGINE_TP_PARALLEL);
    } else {
        engine_rank_t r0 = {.rank = 0, .be = e->be, .arena = e->arena};
        st = engine__tp_import(&r0, &a);
    }
    int any = 0;
    for (int r = 0; r < tp; r++)
        any |= bad[r];
    if (bad_p)
        memcpy(bad_p, bad, (size_t)tp * sizeof *bad);
    return any ? PD_ERR_KV_INTEGRITY : st;
}
