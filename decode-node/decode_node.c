#include "decode_node.h"

#include <stdlib.h>
#include <string.h>

#include "compute.h"
#include "grpc_health.h"
#include "health.pb-c.h"
#include "grpc_server.h"
#include "grpc_stream_buf.h"
#include "kv_cuda_ipc.h"
#include "kv_path.h"
#include "kv_tracker.h"
#include "kv_transport.h"
#include "clock.h"
#include "log.h"
#include "node.h"
#include "node_sampling.h"
#include "node_control.h"
#include "pdserve.pb-c.h"

/* ==== state ==== */

/* A Decode rpc on the loop thread. Its stream buffer owns the call; the rpc is freed when the
 * buffer releases it (after the final event, once the client read everything or went away). */
typedef struct dreq {
    struct decode_node *dn;
    pd_grpc_stream_buf_t *out; /* tokens the client has not accepted yet (flow control) */
    uint64_t id;
    int cancel_sent; /* the compute thread was told the client is gone */
    engine_finish_t finish;
    pd_status_t status;
} dreq_t;

/* Compute-thread record of a Decode rpc. */
typedef struct ddec {
    dreq_t *req; /* loop object: only passed back through compute_post */
    char request_id[96];
    uint64_t req_id, res_id, seq_id;
    int admitted;
    int32_t *tokens;
    int n_tokens;
    engine_gen_params_t gp;
    void *gp_store;     /* gp's arrays (node_sampling_params) */
    uint32_t n_samples; /* Decode calls sharing the reservation (DecodeRequest.n_samples, >= 1) */
    uint8_t token[NODE_TOKEN_BYTES]; /* DecodeRequest.token: must be the reservation's */
    struct ddec *next;
    struct ddec *pnext; /* in its reservation's pending list */
} ddec_t;

/* Compute-thread record of a reservation. */
typedef struct dres {
    uint64_t id;
    kv_seq_t kv;
    int n_tokens;
    int kv_done;
    int32_t first_token; /* from KV-done: the Decode request's last token must equal it */
    pd_status_t error;   /* KV-done disagreed with the reservation: pages released, Decode fails */
    int64_t deadline_ms; /* lease: writer and then decoder must show up before this */
    double reserved_s;   /* when it was reserved (pdserve_node_kv_transfer_seconds) */
    uint8_t token[NODE_TOKEN_BYTES]; /* unguessable: KV-done and the Decode must present it */
    ddec_t *pending;                 /* Decodes arrived before KV-done (list through pnext) */
    /* parallel samples (n > 1): n_samples Decode calls share the prompt's KV; each but the last
     * admitted gets a copy of the pages (engine_kv_copy), the last takes them (0: not known yet) */
    uint32_t n_samples, n_taken;
    /* released (Release, or the request ended) before its writer's KV-done: the pages are
     * quarantined; these are their ids, freed at once when that KV-done (or an aborted one)
     * comes, else by the pool when the lease ends */
    int released;
    int32_t *wpages;
    int n_wpages;
    struct dres *next;
} dres_t;

struct decode_node {
    /* control server, ops endpoint, stats, transport, clock; nc.ready: layout, watermark and
     * transport key set, compute jobs may be submitted; nc.draining: no new reservations */
    node_control_t nc;
    compute_t *comp;
    kv_transport_mem_t *mem;
    void *rkey;
    size_t rkey_len;
    uint8_t *landing; /* host landing zone when the pool is GPU memory UCX cannot register */
    /* the GPU pool's CUDA IPC handle (KvDestination.cuda_ipc), when the pool is on a GPU and the
     * build has CUDA: same-host prefill nodes write into the pool directly */
    uint8_t ipc_blob[KV_CUDA_IPC_BLOB_BYTES];
    int ipc_ok;
    size_t arena_bytes;
    kv_layout_t layout;
    int ucx_port;
    int n_streams; /* live Decode streams (loop thread) */
    uint64_t next_req_id;
    /* compute thread only */
    dres_t *res;
    ddec_t *decs;
    uint64_t next_res_id;
    int32_t watermark;
    decode_node_hooks_t hooks; /* test builds only (decode-node-faults); all NULL in production */
};

/* ==== compute -> loop events ==== */

typedef struct {
    dreq_t *req;
    int32_t token; /* -1: final */
    engine_finish_t finish;
    pd_status_t status;
    int has_lp;
    sampler_logprobs_t lp; /* the token's, when its request asked for logprobs */
} devent_t;

/* The stream buffer's byte channel carries one sampler_logprobs_t record per token when the
 * request asked for logprobs (none otherwise): they go out as DecodeEvent.logprobs. */
static pd_status_t decode__send_tokens(pd_grpc_call_t *call, const int32_t *ids, size_t n_ids,
                                       const char *text, size_t text_len, void *arg)
{
    Pdserve__V1__DecodeEvent ev = PDSERVE__V1__DECODE_EVENT__INIT;
    sampler_logprobs_t *lps = NULL;
    void *store = NULL;
    pd_status_t st;
    (void)arg;
    ev.token_ids = (int32_t *)ids;
    ev.n_token_ids = n_ids;
    if (text_len > 0 && text_len == n_ids * sizeof *lps) {
        if (!(lps = malloc(text_len)))
            return PD_ERR_NOMEM;
        memcpy(lps, text, text_len); /* aligned copies of the records */
        if ((st = node_sampling_logprobs_msg(lps, n_ids, &ev.logprobs, &store)) != PD_OK) {
            free(lps);
            return st;
        }
        ev.n_logprobs = n_ids;
    }
    st = pd_grpc_call_send(call, &ev.base);
    free(store);
    free(lps);
    return st;
}

static pd_status_t decode__send_final(pd_grpc_call_t *call, void *arg)
{
    dreq_t *r = arg;
    Pdserve__V1__DecodeEvent ev = PDSERVE__V1__DECODE_EVENT__INIT;
    ev.finish_reason = (char *)engine_finish_str(r->finish);
    ev.preempted = r->finish == ENGINE_FINISH_PREEMPTED;
    return pd_grpc_call_send(call, &ev.base);
}

static void decode__call_cancelled(void *arg);

static void decode__call_released(void *arg)
{
    dreq_t *r = arg;
    r->dn->n_streams--;
    free(r);
}

static const pd_grpc_stream_buf_ops_t decode_stream_ops = {
    decode__send_tokens, decode__send_final, decode__call_cancelled, decode__call_released};

static void decode__event(void *arg)
{
    devent_t *ev = arg;
    dreq_t *r = ev->req;
    if (ev->token >= 0) {
        if (pd_grpc_stream_buf_append(r->out, &ev->token, 1,
                                      ev->has_lp ? (const char *)&ev->lp : "",
                                      ev->has_lp ? sizeof ev->lp : 0) == PD_ERR_CANCELLED)
            decode__call_cancelled(r); /* gone during this send: no callback comes */
    } else if (ev->status == PD_OK || ev->finish == ENGINE_FINISH_PREEMPTED) {
        r->finish = ev->finish;
        r->status = ev->status;
        pd_grpc_stream_buf_end(r->out, PD_OK, NULL); /* frees r once the client read it all */
    } else {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: %s", r->dn->nc.node->name, pd_status_str(ev->status));
        pd_grpc_stream_buf_end(r->out, ev->status, msg);
    }
    free(ev);
}

static void decode__post_event_lp(compute_t *c, dreq_t *r, int32_t token, engine_finish_t f,
                                  pd_status_t st, const sampler_logprobs_t *lp)
{
    devent_t *ev = malloc(sizeof *ev);
    PD_ASSERT(ev);
    ev->req = r;
    ev->token = token;
    ev->finish = f;
    ev->status = st;
    ev->has_lp = lp != NULL;
    if (lp)
        ev->lp = *lp;
    compute_post(c, decode__event, ev);
}

static void decode__post_event(compute_t *c, dreq_t *r, int32_t token, engine_finish_t f,
                               pd_status_t st)
{
    decode__post_event_lp(c, r, token, f, st, NULL);
}

/* ==== compute thread ==== */

typedef struct {
    decode_node_t *dn;
    compute_t *c;
} dctx_t;

static dres_t *decode__find_res(decode_node_t *dn, uint64_t id, dres_t ***link_p)
{
    dres_t **pp;
    for (pp = &dn->res; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            if (link_p)
                *link_p = pp;
            return *pp;
        }
    }
    return NULL;
}

static void decode__drop_res(decode_node_t *dn, engine_t *e, dres_t **link)
{
    dres_t *r = *link;
    *link = r->next;
    kv_seq_release(engine_pool(e), &r->kv); /* pages still being written are quarantined */
    kv_seq_deinit(&r->kv);
    free(r->wpages);
    free(r);
    (void)dn;
}

/* Release before the writer is done: quarantine the pages now, keep the record (and the page
 * ids) so the writer's KV-done can free them at once. Without memory for the ids, the pages wait
 * for the lease as before. */
static void decode__release_early(decode_node_t *dn, engine_t *e, dres_t **link)
{
    dres_t *r = *link;
    if (r->kv_done || r->released ||
        !(r->wpages = malloc((size_t)r->kv.n_pages * sizeof(int32_t)))) {
        if (!r->released)
            decode__drop_res(dn, e, link);
        return;
    }
    for (int32_t i = 0; i < r->kv.n_pages; i++)
        r->wpages[i] = r->kv.pages[i].page;
    r->n_wpages = r->kv.n_pages;
    kv_seq_release(engine_pool(e), &r->kv);
    r->released = 1;
}

static void decode__unlink_dec(decode_node_t *dn, ddec_t *d)
{
    ddec_t **pp;
    for (pp = &dn->decs; *pp && *pp != d; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = d->next;
}

static void decode__free_dec(ddec_t *d)
{
    free(d->tokens);
    free(d->gp_store);
    free(d);
}

/* Forgets a Decode record (its final event has been posted). */
static void decode__drop_dec(decode_node_t *dn, ddec_t *d)
{
    decode__unlink_dec(dn, d);
    decode__free_dec(d);
}

/* Ends every Decode waiting on r's KV-done with st. */
static void decode__fail_pending(decode_node_t *dn, compute_t *c, dres_t *r, pd_status_t st)
{
    while (r->pending) {
        ddec_t *d = r->pending;
        r->pending = d->pnext;
        decode__post_event(c, d->req, -1, ENGINE_FINISH_ABORT, st);
        decode__drop_dec(dn, d);
    }
}

static compute_t *decode__compute(decode_node_t *dn)
{
    return dn->comp;
}

static void decode__on_token(void *arg, uint64_t seq_id, int32_t tok, engine_finish_t f,
                             pd_status_t st)
{
    ddec_t *d = arg;
    decode_node_t *dn = d->req->dn;
    (void)seq_id;
    if (tok >= 0) {
        pthread_mutex_lock(&dn->nc.stats.mu);
        dn->nc.stats.tokens++;
        pthread_mutex_unlock(&dn->nc.stats.mu);
        decode__post_event_lp(decode__compute(dn), d->req, tok, ENGINE_FINISH_NONE, PD_OK,
                              engine_token_logprobs(compute_engine(decode__compute(dn))));
        return;
    }
    decode__post_event(decode__compute(dn), d->req, -1, f, st);
    decode__drop_dec(dn, d);
}

/* Moves a reservation whose KV is done into the batch: the last of its n_samples Decodes takes
 * its pages (the reservation goes), the others a copy of them. */
static void decode__admit(decode_node_t *dn, engine_t *e, dres_t **link, ddec_t *d)
{
    dres_t *r = *link;
    const int last = r->n_taken + 1 >= (r->n_samples ? r->n_samples : 1);
    pd_status_t st;
    r->n_taken++;
    if (!last) {
        kv_seq_t view = r->kv, copy;
        view.n_tokens = r->n_tokens;
        kv_seq_init(&copy);
        if (d->n_tokens != r->n_tokens + 1) {
            pd_log_error("seq %llu: decode with %d tokens for a reservation of %d prompt tokens",
                         (unsigned long long)r->id, d->n_tokens, r->n_tokens);
            st = PD_ERR_INVALID;
        } else if ((st = engine_kv_copy(e, &view, r->n_tokens, &copy)) == PD_OK) {
            st = engine_seq_add_prefilled(e, d->tokens, d->n_tokens, r->n_tokens, &copy, &d->gp,
                                          decode__on_token, d, &d->seq_id);
            kv_seq_release(engine_pool(e), &copy); /* on error; empty after a move */
        }
        kv_seq_deinit(&copy);
        if (st != PD_OK) {
            /* no pages for a copy: like an eviction, the router re-prefills this sample */
            decode__post_event(dn->comp, d->req, -1,
                               st == PD_NO_PAGES ? ENGINE_FINISH_PREEMPTED : ENGINE_FINISH_ABORT,
                               st);
            decode__drop_dec(dn, d);
            return;
        }
        d->admitted = 1;
        pthread_mutex_lock(&dn->nc.stats.mu);
        dn->nc.stats.requests++;
        pthread_mutex_unlock(&dn->nc.stats.mu);
        return;
    }
    if (d->n_tokens != r->n_tokens + 1) {
        pd_log_error("seq %llu: decode with %d tokens for a reservation of %d prompt tokens",
                     (unsigned long long)r->id, d->n_tokens, r->n_tokens);
        st = PD_ERR_INVALID;
    } else if (r->n_samples <= 1 && d->tokens[d->n_tokens - 1] != r->first_token) {
        /* (a shared reservation's KV-done names one sample's first token only) */
        pd_log_error("request %s: seq %llu: decode's first token %d, the kv writer sampled %d",
                     d->request_id, (unsigned long long)r->id, d->tokens[d->n_tokens - 1],
                     r->first_token);
        st = PD_ERR_PROTOCOL;
    } else {
        if (dn->hooks.before_admit)
            dn->hooks.before_admit(dn->hooks.arg, e, d->request_id, &r->kv);
        st = engine_seq_add_prefilled(e, d->tokens, d->n_tokens, r->n_tokens, &r->kv, &d->gp,
                                      decode__on_token, d, &d->seq_id);
    }
    decode__drop_res(dn, e, link); /* its pages moved into the engine (or are freed on error) */
    if (st != PD_OK) {
        decode__post_event(dn->comp, d->req, -1, ENGINE_FINISH_ABORT, st);
        decode__drop_dec(dn, d);
        return;
    }
    d->admitted = 1;
    pthread_mutex_lock(&dn->nc.stats.mu);
    dn->nc.stats.requests++;
    pthread_mutex_unlock(&dn->nc.stats.mu);
}

typedef struct {
    decode_node_t *dn;
    pd_grpc_call_t *call;
    uint32_t n_tokens;
    int64_t lease_ms;
    /* result */
    pd_status_t st;
    uint64_t res_id;
    int n_pages;
    kv_page_ref_t *pages;
    uint8_t token[NODE_TOKEN_BYTES];
} reserve_job_t;

static void decode__reserve_reply(void *arg);

static void decode__reserve(compute_t *c, engine_t *e, void *arg)
{
    reserve_job_t *j = arg;
    decode_node_t *dn = j->dn;
    kv_pool_t *pool = engine_pool(e);
    int32_t need = kv_pool_pages_for(pool, (int32_t)j->n_tokens);
    dres_t *r;

    j->st = PD_OK;
    if (j->n_tokens == 0 || (int)j->n_tokens + 1 > engine_model(e)->cfg.max_position_embeddings) {
        j->st = j->n_tokens == 0 ? PD_ERR_INVALID : PD_ERR_TOO_LONG;
    } else if (kv_pool_free_pages(pool) - need < dn->watermark) {
        j->st = PD_NO_PAGES; /* keep a watermark so admitted sequences can grow */
    } else if (!(r = calloc(1, sizeof *r)) ||
               !(j->pages = malloc((size_t)need * sizeof *j->pages))) {
        free(r);
        j->st = PD_ERR_NOMEM;
    } else if ((j->st = node_token_new(r->token)) != PD_OK) {
        free(r);
        free(j->pages);
        j->pages = NULL;
    } else {
        int64_t deadline = node_control_now_ms(&dn->nc) + j->lease_ms;
        kv_seq_init(&r->kv);
        for (int32_t i = 0; i < need && j->st == PD_OK; i++) {
            kv_page_ref_t ref;
            /* cannot fail: the free pages were counted above, on this (the only) thread */
            PD_ASSERT(kv_pool_page_alloc_remote(pool, deadline, &ref) == PD_OK);
            if (kv_seq_push_page(&r->kv, ref) != PD_OK) {
                kv_pool_page_writer_done(pool, ref.page); /* never handed out: free at once */
                (void)kv_pool_page_free(pool, ref);
                j->st = PD_ERR_NOMEM;
                break;
            }
            j->pages[i] = ref;
        }
        if (j->st != PD_OK) { /* out of memory for the block table: give back what was taken */
            for (int32_t i = 0; i < r->kv.n_pages; i++)
                kv_pool_page_writer_done(pool, r->kv.pages[i].page);
            kv_seq_release(pool, &r->kv);
            kv_seq_deinit(&r->kv);
            free(r);
            free(j->pages);
            j->pages = NULL;
            compute_post(c, decode__reserve_reply, j);
            return;
        }
        r->id = ++dn->next_res_id;
        r->reserved_s = pd_clock_s();
        memcpy(j->token, r->token, NODE_TOKEN_BYTES);
        r->n_tokens = (int)j->n_tokens;
        r->deadline_ms = deadline;
        r->next = dn->res;
        dn->res = r;
        j->res_id = r->id;
        j->n_pages = need;
    }
    compute_post(c, decode__reserve_reply, j);
}

typedef struct {
    decode_node_t *dn;
    node_kv_done_t msg;
    int direct; /* NODE_AM_KV_DONE_DIRECT: written into the GPU pool with CUDA IPC */
} kvdone_job_t;

/* Constant-time comparison of reservation tokens. */
static int decode__token_eq(const uint8_t *a, const uint8_t *b)
{
    uint8_t diff = 0;
    for (int i = 0; i < NODE_TOKEN_BYTES; i++)
        diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

/* Recomputes the writer's checksum over what landed in r's pages: on the host for the host
 * landing zone and the CPU pool, on the GPU (page digests, 8 bytes a page to the host) for a GPU
 * pool that UCX or, direct, CUDA IPC wrote; ids (r->kv.n_pages) are the pages' ids. Logs a
 * mismatch. */
static int decode__checksum_ok(decode_node_t *dn, engine_t *e, const dres_t *r, const int32_t *ids,
                               uint64_t want, int direct)
{
    const size_t pb = dn->layout.page_bytes;
    pd_backend_t *be = engine_backend(e);
    uint64_t got = 0;
    if ((dn->landing && !direct) || strcmp(be->ops->name, "cpu") == 0) {
        const uint8_t *base = dn->landing ? dn->landing : (const uint8_t *)engine_arena(e);
        got = node_pages_checksum(0, base, ids, r->kv.n_pages, pb);
    } else if (node_pages_checksum_be(be, 0, engine_arena(e), ids, r->kv.n_pages, pb, &got) !=
               PD_OK) {
        return 0;
    }
    if (got != want)
        pd_log_error("seq %llu: kv checksum %016llx != %016llx sent: the pages changed in "
                     "flight; failed",
                     (unsigned long long)r->id, (unsigned long long)got, (unsigned long long)want);
    return got == want;
}

/* A KV-done that cannot be trusted: the reservation's pages are released (quarantined: the
 * writer may not be done) and its Decode, now or when it comes, fails with st. */
static void decode__kv_done_fail(decode_node_t *dn, compute_t *c, engine_t *e, dres_t **link,
                                 pd_status_t st)
{
    dres_t *r = *link;
    kv_seq_release(engine_pool(e), &r->kv);
    r->error = st;
    if (r->pending) {
        decode__fail_pending(dn, c, r, r->error);
        decode__drop_res(dn, e, link);
    }
}

static void decode__kv_done(compute_t *c, engine_t *e, void *arg)
{
    kvdone_job_t *j = arg;
    decode_node_t *dn = j->dn;
    dres_t **link, *r = decode__find_res(dn, j->msg.seq_id, &link);
    if (!r) {
        pd_log_warn("kv done for unknown reservation %llu (released or expired)",
                    (unsigned long long)j->msg.seq_id);
        free(j);
        return;
    }
    if (!decode__token_eq(r->token, j->msg.token)) {
        /* not the writer this reservation was handed to: touch nothing */
        pd_log_error("seq %llu: kv done with a wrong reservation token: dropped",
                     (unsigned long long)r->id);
        node_stats_integrity(&dn->nc.stats, NODE_INTEGRITY_TOKEN);
        free(j);
        return;
    }
    if (r->released) {
        /* its request ended first; now its writer is done too: the quarantined pages are free */
        for (int i = 0; i < r->n_wpages; i++)
            kv_pool_page_writer_done(engine_pool(e), r->wpages[i]);
        pd_log_info("seq %llu: writer done after release: %d pages freed",
                    (unsigned long long)r->id, r->n_wpages);
        decode__drop_res(dn, e, link);
        free(j);
        return;
    }
    if (r->kv_done || r->error) {
        pd_log_warn("seq %llu: kv done again: dropped", (unsigned long long)r->id);
        free(j);
        return;
    }
    if (j->msg.aborted) {
        /* the writer stopped (its request was cancelled) and will write nothing more: the pages
         * are free now, not when the lease ends */
        pd_log_info("seq %llu: writer stopped (cancelled): reservation freed",
                    (unsigned long long)r->id);
        for (int32_t i = 0; i < r->kv.n_pages; i++)
            kv_pool_page_writer_done(engine_pool(e), r->kv.pages[i].page);
        decode__fail_pending(dn, c, r, PD_ERR_CANCELLED);
        decode__drop_res(dn, e, link);
        free(j);
        return;
    }
    if (j->msg.n_tokens != (uint32_t)r->n_tokens || j->msg.n_pages != (uint32_t)r->kv.n_pages) {
        /* the writer wrote something else than was reserved: trust none of it. The pages stay
         * quarantined until their lease ends (the writer may not be done). */
        pd_log_error("seq %llu: kv done for %u tokens in %u pages, reserved %d in %d: failed",
                     (unsigned long long)r->id, j->msg.n_tokens, j->msg.n_pages, r->n_tokens,
                     r->kv.n_pages);
        node_stats_integrity(&dn->nc.stats, NODE_INTEGRITY_SIZE);
        decode__kv_done_fail(dn, c, e, link, PD_ERR_PROTOCOL);
        free(j);
        return;
    }
    if (j->direct && !dn->ipc_ok) {
        /* a direct write needs the handle this node never handed out: trust none of it */
        pd_log_error("seq %llu: kv done (direct) but this node exports no cuda ipc handle: failed",
                     (unsigned long long)r->id);
        decode__kv_done_fail(dn, c, e, link, PD_ERR_PROTOCOL);
        free(j);
        return;
    }
    const int tp = engine_tp(e);
    if (tp > 1 ? j->msg.n_slices != tp || j->direct : j->msg.n_slices != 0) {
        /* one checksum per rank's slice at tp > 1 (through the landing zone), one for the pages
         * at tp 1: anything else is not a writer of this layout */
        pd_log_error("seq %llu: kv done with %d slice checksums%s for a tp %d node: failed",
                     (unsigned long long)r->id, j->msg.n_slices, j->direct ? " (direct)" : "", tp);
        node_stats_integrity(&dn->nc.stats, NODE_INTEGRITY_SIZE);
        decode__kv_done_fail(dn, c, e, link, PD_ERR_PROTOCOL);
        free(j);
        return;
    }
    /* the reservation's page ids, for the checksum and the landing zone's import */
    int32_t *ids = malloc((size_t)r->kv.n_pages * sizeof *ids);
    if (!ids) {
        pd_log_error("seq %llu: no memory to check the kv pages", (unsigned long long)r->id);
        decode__kv_done_fail(dn, c, e, link, PD_ERR_NOMEM);
        free(j);
        return;
    }
    for (int32_t i = 0; i < r->kv.n_pages; i++)
        ids[i] = r->kv.pages[i].page;
    if (tp == 1 && !decode__checksum_ok(dn, e, r, ids, j->msg.checksum, j->direct)) {
        /* the bytes in the pages are not the bytes the writer sent (a late or torn write by a
         * former owner's writer, a transport fault): DATA_LOSS, counted */
        engine_tracker(e)->failures++;
        node_stats_integrity(&dn->nc.stats, NODE_INTEGRITY_CHECKSUM);
        decode__kv_done_fail(dn, c, e, link, PD_ERR_KV_INTEGRITY);
        free(ids);
        free(j);
        return;
    }
    if (dn->landing && !j->direct) {
        /* GPU pool or tensor parallel: the pages landed in host memory; move them (each rank its
         * slice) into the pool. At tp > 1 each rank first checks its own slice's checksum */
        pd_status_t ist = tp > 1
                              ? engine_import_pages_checked(e, dn->landing, 0, ids, r->kv.n_pages,
                                                            j->msg.slice_sums, r->id, NULL)
                              : engine_import_pages(e, dn->landing, 0, ids, r->kv.n_pages);
        free(ids);
        ids = NULL;
        if (ist == PD_ERR_KV_INTEGRITY) { /* a slice is not what its writer sent: DATA_LOSS */
            engine_tracker(e)->failures++;
            node_stats_integrity(&dn->nc.stats, NODE_INTEGRITY_CHECKSUM);
            decode__kv_done_fail(dn, c, e, link, PD_ERR_KV_INTEGRITY);
            free(j);
            return;
        }
        if (ist != PD_OK) {
            pd_log_error("seq %llu: kv pages not moved into the pool: %s",
                         (unsigned long long)r->id, pd_status_str(ist));
            decode__kv_done_fail(dn, c, e, link, ist);
            free(j);
            return;
        }
    }
    free(ids);
    for (int32_t i = 0; i < r->kv.n_pages; i++)
        kv_pool_page_writer_done(engine_pool(e), r->kv.pages[i].page);
    r->kv_done = 1;
    r->first_token = j->msg.first_token;
    node_stats_kv_transfer(&dn->nc.stats, (uint64_t)r->kv.n_pages * dn->layout.page_bytes,
                           pd_clock_s() - r->reserved_s);
    r->deadline_ms = node_control_now_ms(&dn->nc) + dn->nc.cfg->transport.lease_ms;
    ddec_t *wait = r->pending; /* the last admit may free r */
    r->pending = NULL;
    while (wait) {
        ddec_t *d = wait;
        wait = d->pnext;
        decode__admit(dn, e, link, d);
    }
    free(j);
}

typedef struct {
    decode_node_t *dn;
    ddec_t *d;
} start_job_t;

static void decode__start(compute_t *c, engine_t *e, void *arg)
{
    start_job_t *j = arg;
    decode_node_t *dn = j->dn;
    ddec_t *d = j->d;
    dres_t **link, *r = decode__find_res(dn, d->res_id, &link);
    free(j);
    if (r && !decode__token_eq(r->token, d->token)) {
        /* not the router this reservation was made for: refuse the call, keep the reservation */
        pd_log_error("request %s: decode for reservation %llu with a wrong token: refused",
                     d->request_id, (unsigned long long)d->res_id);
        decode__post_event(c, d->req, -1, ENGINE_FINISH_ABORT, PD_ERR_INVALID);
        decode__free_dec(d);
        return;
    }
    uint32_t waiting = 0;
    for (ddec_t *p = r ? r->pending : NULL; p; p = p->pnext)
        waiting++;
    if (r && !r->n_samples)
        r->n_samples = d->n_samples; /* the first Decode tells how many share the pages */
    if (!r || r->error || r->released || r->n_taken + waiting >= r->n_samples) {
        decode__post_event(c, d->req, -1, ENGINE_FINISH_ABORT,
                           r && r->error ? r->error : PD_ERR_NOT_FOUND);
        if (r && r->error)
            decode__drop_res(dn, e, link);
        decode__free_dec(d);
        return;
    }
    d->next = dn->decs;
    dn->decs = d;
    if (r->kv_done) {
        decode__admit(dn, e, link, d);
    } else {
        d->pnext = r->pending;
        r->pending = d;
    }
}

typedef struct {
    decode_node_t *dn;
    uint64_t req_id;
} cancel_job_t;

static void decode__cancel(compute_t *c, engine_t *e, void *arg)
{
    cancel_job_t *j = arg;
    decode_node_t *dn = j->dn;
    ddec_t *d;
    for (d = dn->decs; d && d->req_id != j->req_id; d = d->next)
        ;
    free(j);
    if (!d)
        return; /* already finished */
    if (d->admitted) {
        (void)engine_seq_abort(e, d->seq_id); /* the finish callback posts the final event */
        return;
    }
    dres_t **link, *r = decode__find_res(dn, d->res_id, &link);
    if (r) {
        ddec_t **pp;
        for (pp = &r->pending; *pp && *pp != d; pp = &(*pp)->pnext)
            ;
        if (*pp)
            *pp = d->pnext;
        /* one sharer fewer; the reservation goes with its last one */
        if (r->n_samples > 0)
            r->n_samples--;
        if (!r->pending && r->n_taken >= r->n_samples)
            decode__drop_res(dn, e, link);
    }
    decode__post_event(c, d->req, -1, ENGINE_FINISH_ABORT, PD_ERR_CANCELLED);
    decode__drop_dec(dn, d);
}

typedef struct {
    decode_node_t *dn;
    pd_grpc_call_t *call;
    uint64_t seq_id;
    int found;
} release_job_t;

static void decode__release_reply(void *arg)
{
    release_job_t *j = arg;
    Pdserve__V1__ReleaseReply rep = PDSERVE__V1__RELEASE_REPLY__INIT;
    rep.found = j->found;
    pd_grpc_call_finish_status(j->call, pd_grpc_call_send(j->call, &rep.base), NULL);
    free(j);
}

static void decode__release(compute_t *c, engine_t *e, void *arg)
{
    release_job_t *j = arg;
    decode_node_t *dn = j->dn;
    dres_t **link, *r = decode__find_res(dn, j->seq_id, &link);
    if (r) {
        decode__fail_pending(dn, c, r, PD_ERR_CANCELLED);
        decode__release_early(dn, e, link);
        j->found = 1;
    } else {
        for (ddec_t *d = dn->decs; d; d = d->next) {
            if (d->res_id == j->seq_id && d->admitted) {
                (void)engine_seq_abort(e, d->seq_id);
                j->found = 1;
                break;
            }
        }
    }
    compute_post(c, decode__release_reply, j);
}

static void decode__tick(compute_t *c, engine_t *e, void *arg)
{
    decode_node_t *dn = arg;
    int64_t now = node_control_now_ms(&dn->nc);
    dres_t **pp = &dn->res;
    uint32_t queued = 0;
    while (*pp) {
        dres_t *r = *pp;
        if (r->deadline_ms <= now && r->pending) {
            /* the Decode came, but the writer's KV-done never did (lost or dropped as malformed):
             * the writer is presumed gone, as for a lease without a Decode */
            pd_log_warn("request %s: seq %llu: lease ended before kv done; failed",
                        r->pending->request_id, (unsigned long long)r->id);
            decode__fail_pending(dn, c, r, PD_ERR_DEADLINE);
            decode__drop_res(dn, e, pp);
            continue;
        }
        if (r->deadline_ms <= now) {
            if (!r->released)
                pd_log_warn("reservation %llu: lease ended before %s; pages released",
                            (unsigned long long)r->id, r->kv_done ? "decode" : "kv done");
            decode__drop_res(dn, e, pp); /* released: its pages stay with the pool's quarantine */
            continue;
        }
        if (!r->released)
            queued++;
        pp = &r->next;
    }
    kv_pool_expire_leases(engine_pool(e), now);
    node_stats_publish(&dn->nc.stats, e, queued);
}

/* ==== loop thread: rpc handlers ==== */

static void decode__reserve_reply(void *arg)
{
    reserve_job_t *j = arg;
    decode_node_t *dn = j->dn;
    if (j->st != PD_OK) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: %s", dn->nc.node->name,
                 j->st == PD_NO_PAGES ? "no free kv pages" : pd_status_str(j->st));
        pd_grpc_call_finish_status(j->call, j->st, msg);
    } else {
        Pdserve__V1__ReserveReply rep = PDSERVE__V1__RESERVE_REPLY__INIT;
        Pdserve__V1__KvDestination dest = PDSERVE__V1__KV_DESTINATION__INIT;
        Pdserve__V1__KvLayout lay = PDSERVE__V1__KV_LAYOUT__INIT;
        Pdserve__V1__PageRef *refs = calloc((size_t)j->n_pages, sizeof *refs);
        Pdserve__V1__PageRef **prefs = calloc((size_t)j->n_pages, sizeof *prefs);
        if (!refs || !prefs) { /* the reservation expires with its lease */
            free(refs);
            free(prefs);
            pd_grpc_call_finish_status(j->call, PD_ERR_NOMEM, "decode node out of memory");
            free(j->pages);
            free(j);
            return;
        }
        for (int i = 0; i < j->n_pages; i++) {
            pdserve__v1__page_ref__init(&refs[i]);
            refs[i].page = j->pages[i].page;
            refs[i].tag = j->pages[i].tag;
            prefs[i] = &refs[i];
        }
        lay.n_layers = (uint32_t)dn->layout.n_layers;
        /* the model's KV heads; a page of a tp node is tp slices of n_kv_heads / tp heads */
        lay.n_kv_heads = (uint32_t)(dn->layout.n_kv_heads * dn->layout.n_slices);
        lay.tp = (uint32_t)dn->layout.n_slices;
        lay.head_dim = (uint32_t)dn->layout.head_dim;
        lay.page_tokens = (uint32_t)dn->layout.page_tokens;
        lay.kv_format = (char *)pd_kvfmt_name(dn->layout.fmt);
        lay.page_bytes = dn->layout.page_bytes;
        dest.node = (char *)dn->nc.node->name;
        dest.ucx_host = (char *)dn->nc.node->host;
        dest.ucx_port = (uint32_t)dn->ucx_port;
        dest.rkey.data = dn->rkey;
        dest.rkey.len = dn->rkey_len;
        if (dn->ipc_ok) {
            dest.cuda_ipc.data = dn->ipc_blob;
            dest.cuda_ipc.len = sizeof dn->ipc_blob;
        }
        dest.layout = &lay;
        dest.pages = prefs;
        dest.n_pages = (size_t)j->n_pages;
        dest.seq_id = j->res_id;
        dest.token.data = j->token;
        dest.token.len = NODE_TOKEN_BYTES;
        dest.lease_ms = j->lease_ms;
        rep.dest = &dest;
        pd_grpc_call_finish_status(j->call, pd_grpc_call_send(j->call, &rep.base), NULL);
        free(refs);
        free(prefs);
    }
    free(j->pages);
    free(j);
}

static void decode__rpc_reserve(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    decode_node_t *dn = user;
    const Pdserve__V1__ReserveRequest *req = (const Pdserve__V1__ReserveRequest *)msg;
    reserve_job_t *j;
    pd_status_t st;
    if (!dn->nc.ready || dn->nc.draining) {
        pd_grpc_call_finish_status(call, PD_ERR_UNAVAILABLE,
                                   dn->nc.draining ? "decode node draining"
                                                   : "decode node not ready");
        return;
    }
    if (!(j = calloc(1, sizeof *j))) {
        pd_grpc_call_finish_status(call, PD_ERR_NOMEM, NULL);
        return;
    }
    j->dn = dn;
    j->call = call;
    j->n_tokens = req->n_tokens;
    j->lease_ms = req->lease_ms > 0 ? req->lease_ms : dn->nc.cfg->transport.lease_ms;
    if ((st = compute_submit(dn->comp, decode__reserve, j)) != PD_OK) {
        free(j);
        pd_grpc_call_finish_status(call, st, "decode node not ready");
    }
}

/* The client went away before the final event: the compute thread drops the sequence (its
 * final event then ends the stream buffer, which releases the call). */
static void decode__call_cancelled(void *arg)
{
    dreq_t *r = arg;
    cancel_job_t *j;
    if (!r->dn->comp) { /* the node is going away: no final event will come */
        pd_grpc_stream_buf_end(r->out, PD_ERR_UNAVAILABLE, "decode node shutting down");
        return;
    }
    if (r->cancel_sent || !(j = malloc(sizeof *j)))
        return;
    r->cancel_sent = 1;
    j->dn = r->dn;
    j->req_id = r->id;
    if (compute_submit(r->dn->comp, decode__cancel, j) != PD_OK)
        free(j);
}

static void decode__rpc_decode(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    decode_node_t *dn = user;
    const Pdserve__V1__DecodeRequest *req = (const Pdserve__V1__DecodeRequest *)msg;
    dreq_t *r;
    ddec_t *d;
    start_job_t *j;
    pd_status_t st;

    if (!dn->nc.ready) { /* a Decode for an earlier reservation is accepted while draining */
        pd_grpc_call_finish_status(call, PD_ERR_UNAVAILABLE, "decode node not ready");
        return;
    }
    r = calloc(1, sizeof *r);
    d = calloc(1, sizeof *d);
    j = malloc(sizeof *j);
    if (!r || !d || !j || !(d->tokens = malloc((req->n_token_ids + 1) * sizeof *d->tokens)) ||
        pd_grpc_stream_buf_create(call, &decode_stream_ops, r, &r->out) != PD_OK) {
        free(r);
        if (d)
            free(d->tokens);
        free(d);
        free(j);
        pd_grpc_call_finish_status(call, PD_ERR_NOMEM, NULL);
        return;
    }
    r->dn = dn;
    r->id = ++dn->next_req_id;
    dn->n_streams++; /* until decode__call_released */
    d->req = r;
    d->req_id = r->id;
    d->res_id = req->seq_id;
    snprintf(d->request_id, sizeof d->request_id, "%s", req->request_id ? req->request_id : "");
    if (req->token.len == NODE_TOKEN_BYTES)
        memcpy(d->token, req->token.data, NODE_TOKEN_BYTES); /* else all zero: refused */
    memcpy(d->tokens, req->token_ids, req->n_token_ids * sizeof *d->tokens);
    d->n_tokens = (int)req->n_token_ids;
    if (node_sampling_params(req->sampling, &d->gp, &d->gp_store) != PD_OK) {
        free(d->tokens);
        free(d);
        free(j);
        pd_grpc_stream_buf_end(r->out, PD_ERR_NOMEM, NULL); /* frees r */
        return;
    }
    d->gp.prompt_logprobs = false; /* the prefill node's */
    d->gp.max_tokens = (int)req->max_new_tokens;
    d->gp.n_generated = (int)req->n_generated;
    d->gp.sample_index = req->sample_index;
    d->n_samples = req->n_samples > 1 ? (req->n_samples > 256 ? 256 : req->n_samples) : 1;
    j->dn = dn;
    j->d = d;
    if ((st = compute_submit(dn->comp, decode__start, j)) != PD_OK) {
        decode__free_dec(d);
        free(j);
        pd_grpc_stream_buf_end(r->out, st, "decode node not ready"); /* frees r */
    }
}

static void decode__rpc_release(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    decode_node_t *dn = user;
    const Pdserve__V1__ReleaseRequest *req = (const Pdserve__V1__ReleaseRequest *)msg;
    release_job_t *j;
    pd_status_t st;
    if (!dn->nc.ready) {
        pd_grpc_call_finish_status(call, PD_ERR_UNAVAILABLE, "decode node not ready");
        return;
    }
    if (!(j = calloc(1, sizeof *j))) {
        pd_grpc_call_finish_status(call, PD_ERR_NOMEM, NULL);
        return;
    }
    j->dn = dn;
    j->call = call;
    j->seq_id = req->seq_id;
    if ((st = compute_submit(dn->comp, decode__release, j)) != PD_OK) {
        free(j);
        pd_grpc_call_finish_status(call, st, "decode node not ready");
    }
}

static void decode__rpc_stats(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    decode_node_t *dn = user;
    Pdserve__V1__NodeStats m = PDSERVE__V1__NODE_STATS__INIT;
    node_control_operator_drain(&dn->nc, ((const Pdserve__V1__StatsRequest *)msg)->drain);
    node_stats_fill(&dn->nc.stats, dn->nc.node, &m);
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &m.base), NULL);
}

static const pd_grpc_method_fn decode_handlers[4] = {decode__rpc_reserve, decode__rpc_decode,
                                                     decode__rpc_release, decode__rpc_stats};

/* ==== transport ==== */

static void decode__kv_done_msg(decode_node_t *dn, const void *header, size_t header_len,
                                int direct)
{
    uint8_t buf[NODE_KV_DONE_MAX];
    node_kv_done_t m;
    kvdone_job_t *j;
    if (dn->hooks.on_kv_done && header_len <= sizeof buf) {
        memcpy(buf, header, header_len);
        dn->hooks.on_kv_done(dn->hooks.arg, buf, sizeof buf, &header_len, &direct);
        header = buf;
    }
    if (node_kv_done_unpack(header, header_len, dn->nc.node->name, &m) != PD_OK)
        return; /* logged; the reservation's lease ends it */
    if (!(j = malloc(sizeof *j))) {
        pd_log_error("%s: kv done for seq %llu: out of memory: dropped", dn->nc.node->name,
                     (unsigned long long)m.seq_id);
        return;
    }
    j->dn = dn;
    j->msg = m;
    j->direct = direct;
    if (compute_submit(dn->comp, decode__kv_done, j) != PD_OK)
        free(j);
}

static void decode__am_kv_done(void *arg, const void *header, size_t header_len, const void *data,
                               size_t len, kv_transport_ep_t *from)
{
    (void)data;
    (void)len;
    (void)from;
    decode__kv_done_msg(arg, header, header_len, 0);
}

static void decode__am_kv_done_direct(void *arg, const void *header, size_t header_len,
                                      const void *data, size_t len, kv_transport_ep_t *from)
{
    (void)data;
    (void)len;
    (void)from;
    decode__kv_done_msg(arg, header, header_len, 1);
}

/* A GPU pool: export it with a CUDA IPC handle for prefill nodes on this host, and say which
 * path this node offers (log line, /health kv_path, pdserve_node_kv_path). */
static void decode__offer_ipc(decode_node_t *dn, engine_t *e)
{
    engine_params_t ep;
    kv_path_offer_t o = {0};
    const char *why;
    int gpu = strcmp(engine_backend(e)->ops->name, "cpu") != 0;
    node_engine_params(dn->nc.cfg, dn->nc.node, &ep);
    if (gpu && kv_cuda_ipc_built() && engine_tp(e) == 1) { /* tp: pages land in host memory */
        pd_status_t st =
            kv_cuda_ipc_export(ep.device, engine_arena(e), dn->arena_bytes, dn->ipc_blob);
        dn->ipc_ok = st == PD_OK;
        if (st != PD_OK)
            pd_log_warn("%s: kv pool not exported over cuda ipc (%s): same-host prefill nodes "
                        "use ucx",
                        dn->nc.node->name, pd_status_str(st));
    }
    /* the best path a same-host GPU writer can take into this node */
    o.src_gpu = 1;
    o.dst_gpu = gpu;
    o.ipc_offered = o.ipc_same_host = o.ipc_opened = dn->ipc_ok;
    o.src_ucx_cuda = o.dst_ucx_cuda = gpu && kv_transport_query_cuda(dn->nc.tr);
    kv_path_t p = gpu ? kv_path_select(&o, &why) : KV_PATH_UCX_HOST;
    pthread_mutex_lock(&dn->nc.stats.mu);
    snprintf(dn->nc.stats.kv_path, sizeof dn->nc.stats.kv_path, "%s", kv_path_name(p));
    pthread_mutex_unlock(&dn->nc.stats.mu);
    pd_log_info("%s: kv transport: offers %s (%s pool%s)", dn->nc.node->name, kv_path_name(p),
                gpu ? "gpu" : "host",
                dn->ipc_ok    ? "; cuda ipc handle exported, other hosts use ucx"
                : dn->landing ? "; ucx into a host landing zone"
                : gpu         ? "; ucx into gpu memory"
                              : "");
}

static void decode__ready(void *arg, pd_status_t st)
{
    decode_node_t *dn = arg;
    engine_t *e;
    void *region;
    if (st != PD_OK) {
        node_control_fail(&dn->nc, "model load failed", st);
        return;
    }
    e = compute_engine(dn->comp);
    engine_kv_wire_layout(e, &dn->layout); /* the pool's layout; tp: one slice per rank */
    dn->arena_bytes = (size_t)kv_pool_n_pages(engine_pool(e)) * dn->layout.page_bytes;
    dn->watermark = kv_pool_n_pages(engine_pool(e)) / 16;
    region = engine_arena(e);
    if (engine_tp(e) > 1) {
        /* tensor parallel: each rank's pages are its own memory (its GPU); writers fill wire pages
         * (every rank's slice) here, and KV-done moves each slice to its rank */
        if (!(dn->landing = calloc(1, dn->arena_bytes))) {
            pd_log_error("%s: no host memory for a %zu-byte landing zone", dn->nc.node->name,
                         dn->arena_bytes);
            node_control_fail(&dn->nc, "landing zone", PD_ERR_NOMEM);
            return;
        }
        region = dn->landing;
        pd_log_info("%s: tp %d: pages land in host memory, one slice per rank", dn->nc.node->name,
                    engine_tp(e));
    } else if (strcmp(engine_backend(e)->ops->name, "cpu") != 0 &&
               !kv_transport_query_cuda(dn->nc.tr)) {
        if (!(dn->landing = calloc(1, dn->arena_bytes))) {
            pd_log_error("%s: no host memory for a %zu-byte landing zone", dn->nc.node->name,
                         dn->arena_bytes);
            node_control_fail(&dn->nc, "landing zone", PD_ERR_NOMEM);
            return;
        }
        region = dn->landing;
        pd_log_info("%s: transport cannot reach GPU memory: pages land in host memory first",
                    dn->nc.node->name);
    }
    /* device memory is registered as such (memory type CUDA), never left to UCX to guess */
    pd_status_t rst =
        region == engine_arena(e) && strcmp(engine_backend(e)->ops->name, "cpu")
            ? kv_transport_mem_register_cuda(dn->nc.tr, region, dn->arena_bytes, &dn->mem)
            : kv_transport_mem_register(dn->nc.tr, region, dn->arena_bytes, &dn->mem);
    if (rst == PD_OK)
        rst = kv_transport_mem_pack(dn->mem, &dn->rkey, &dn->rkey_len);
    if (rst != PD_OK) {
        node_control_fail(&dn->nc, "kv pool registration", rst);
        return;
    }
    decode__offer_ipc(dn, e);
    /* Stats answered before the compute thread's first tick must show the pool, not 0 pages
     * (which the router's least_kv policy reads as a full node) */
    pthread_mutex_lock(&dn->nc.stats.mu);
    dn->nc.stats.pages_total = (uint32_t)kv_pool_n_pages(engine_pool(e));
    pthread_mutex_unlock(&dn->nc.stats.mu);
    node_control_ready(&dn->nc); /* from here on, compute jobs see the layout, watermark, key */
    pd_log_info("%s: serving (%s weights, %s kv, %d pages of %zu bytes, ucx port %d)",
                dn->nc.node->name, pd_wfmt_name(dn->nc.node->weights),
                pd_kvfmt_name(dn->nc.node->kv), kv_pool_n_pages(engine_pool(e)),
                dn->layout.page_bytes, dn->ucx_port);
}

pd_status_t decode_node_create(uv_loop_t *loop, const cluster_config_t *cfg,
                               const cluster_node_t *node, const decode_node_hooks_t *hooks,
                               const node_env_t *env, decode_node_t **dn_p)
{
    decode_node_t *dn = calloc(1, sizeof *dn);
    engine_params_t ep;
    pd_status_t st;

    if (!dn)
        return PD_ERR_NOMEM;
    if (hooks)
        dn->hooks = *hooks;
    if ((st = node_control_init(&dn->nc, loop, cfg, node, &pdserve__v1__decode__descriptor,
                                decode_handlers, dn, env)) != PD_OK)
        goto err;
    if ((st = kv_transport_listen(dn->nc.tr, node->host, node->ucx_port, &dn->ucx_port)) != PD_OK) {
        /* UCX 1.13 cannot set SO_REUSEADDR: after a restart the port can sit in TIME_WAIT for a
         * minute. Prefill nodes learn the address from each reservation, so any port will do. */
        pd_log_warn("%s: ucx port %d busy (TIME_WAIT after a restart?): using an ephemeral port",
                    node->name, node->ucx_port);
        if ((st = kv_transport_listen(dn->nc.tr, node->host, 0, &dn->ucx_port)) != PD_OK)
            goto err;
    }
    if ((st = kv_transport_set_am_handler(dn->nc.tr, NODE_AM_KV_DONE, decode__am_kv_done, dn)) ||
        (st = kv_transport_set_am_handler(dn->nc.tr, NODE_AM_KV_DONE_DIRECT,
                                          decode__am_kv_done_direct, dn)))
        goto err;
    node_engine_params(cfg, node, &ep);
    ep.tp_comm_wrap = dn->hooks.tp_comm_wrap;
    ep.tp_comm_wrap_arg = dn->hooks.tp_comm_arg;
    if ((st = compute_create(loop, &ep, decode__ready, decode__tick, 100, dn, &dn->comp)))
        goto err;
    pd_log_info("%s: loading %s on %s (control %s:%d)", node->name, cfg->model, ep.backend,
                node->host, dn->nc.port);
    *dn_p = dn;
    return PD_OK;
err:
    decode_node_destroy(dn);
    return st;
}

int decode_node_failed(const decode_node_t *dn)
{
    return dn->nc.failed;
}

int decode_node_port(const decode_node_t *dn)
{
    return dn->nc.port;
}

void decode_node_drain(decode_node_t *dn)
{
    if (node_control_drain(&dn->nc))
        pd_log_info("%s: draining: no new reservations; %d streams running", dn->nc.node->name,
                    dn->n_streams);
}

int decode_node_busy(decode_node_t *dn)
{
    uint32_t waiting, active;
    pthread_mutex_lock(&dn->nc.stats.mu); /* published by the compute thread every tick */
    waiting = dn->nc.stats.queued;
    active = dn->nc.stats.active;
    pthread_mutex_unlock(&dn->nc.stats.mu);
    return dn->n_streams + (int)waiting + (int)active;
}

void decode_node_destroy(decode_node_t *dn)
{
    if (!dn)
        return;
    node_control_shutdown(&dn->nc);
    compute_destroy(dn->comp); /* queued events for calls are dropped with the server */
    dn->comp = NULL;           /* Decode calls cancelled below end without their final event */
    pd_grpc_server_destroy(dn->nc.srv); /* cancels the calls while the node still exists */
    dn->nc.srv = NULL;
    free(dn->rkey);
    kv_transport_mem_deregister(dn->mem);
    free(dn->landing);
    /* reservation records belong to the compute thread, which is gone */
    while (dn->res) {
        dres_t *r = dn->res;
        dn->res = r->next;
        kv_seq_deinit(&r->kv);
        free(r->wpages); /* released before its writer was done */
        free(r);
    }
    while (dn->decs) {
        ddec_t *d = dn->decs;
        dn->decs = d->next;
        decode__free_dec(d);
    }
    node_control_deinit(&dn->nc);
    free(dn);
}
