#include "router.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <jansson.h>

#include "clock.h"
#include "grpc_client.h"
#include "health.pb-c.h"
#include "log.h"
#include "pdserve.pb-c.h"

#define SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define POLL_MS 500
#define RETRY_MS 20
/* Reservations one request may lose at Decode (NOT_FOUND: the lease ended before its KV pages
 * arrived) before the router gives up and returns the error. */
#define ROUTER_MAX_LOST 3
/* Health polls in a row without an answer (each waits POLL_MS * 2) after which the router drops
 * its connections to the node: a peer behind a cut link or a hung host never resets them, and its
 * calls (decode streams) would otherwise hang until their deadlines. They end with UNAVAILABLE. */
#define LOST_POLLS 3
#define ROUTER_TIMEOUT_MAX_MS ((int64_t)1 << 40) /* ~35 years: no overflow of now + timeout */

typedef struct rnode {
    struct router *router;
    const cluster_node_t *node;
    pd_grpc_client_t *client;
    pd_grpc_client_call_t *poll_call;
    int healthy;
    int poll_failures;     /* health polls in a row that got no answer */
    int draining;          /* pdctl drain: no new work; running requests finish */
    int drain_known;       /* draining is this router's word (pdctl drain / undrain, or learnt
                              from the node's Stats since it started); 0: ask the node */
    int left;              /* deregistered: no new work, not polled; may register again */
    cluster_node_t *owned; /* a node that joined at run time: its entry (node points here) */
    uint32_t pages_used, pages_total, active, reserved_est;
    uint64_t integrity_failures;
    int inflight;
    uint32_t tp; /* from its Stats (0: not yet) */
} rnode_t;

struct router_req {
    struct router *r;
    char request_id[96];
    const router_sink_t *sink; /* NULL once finished or cancelled */
    void *sink_arg;
    int32_t *tokens; /* (cap) prompt, then generated */
    int n_prompt, n_tokens, cap, n_generated, max_tokens;
    float temperature, top_p;
    int top_k;
    uint64_t seed;
    int ignore_eos;
    char **stop;
    int n_stop;
    size_t max_stop;
    tokenizer_stream_t *detok;
    char *text; /* generated text; [0, sent_len) went to the client */
    size_t text_len, text_cap, sent_len;
    int64_t start_ms, first_token_ms, deadline_ms;
    int64_t last_token_ms; /* for the inter-token latency histogram */
    rnode_t *dnode, *pnode;
    Pdserve__V1__ReserveReply *resv; /* held reservation (until Decode starts) */
    pd_grpc_client_call_t *ccall;    /* the control call in flight */
    uint64_t tried;                  /* nodes tried for the current step (bit per node) */
    int decoding, preempted, n_preemptions, finished, orphan;
    int n_lost; /* reservations the decode node no longer held at Decode (rreq_decode_done) */
    uv_timer_t timer;
    int timer_open, timer_active;
    /* OpenAI / vLLM parameters */
    int index;             /* which sample of its request */
    struct rgroup *group;  /* the request's samples when n > 1, else NULL */
    int n_prefill_samples; /* first tokens the next Prefill samples (the leader's first: n) */
    int waiting;           /* a sample > 0 waiting for the leader's prefill */
    int logprobs, top_logprobs, prompt_logprobs;
    float presence_penalty, frequency_penalty, repetition_penalty;
    Pdserve__V1__LogitBias *bias, **bias_ptrs; /* (n_bias) */
    size_t n_bias;
    int min_tokens;
    int32_t *stop_ids; /* (n_stop_ids) */
    int n_stop_ids;
    router_logprob_t *prompt_lp; /* (n_prompt - 1) prompt logprobs, owned by q or its group */
    /* the decode node's reservation this sample decodes from (set by rreq_decode / the leader) */
    uint64_t d_seq_id;
    uint8_t d_token[32];
    size_t d_token_len;
    uint32_t d_n_samples; /* Decode calls sharing it (0: 1) */
    struct router_req *next, *prev;
};

/* The samples of a request with n > 1: sample 0 (the leader) reserves and prefills for all;
 * each sample then decodes on its own. Freed with its last sample. */
typedef struct rgroup {
    int n, live;
    router_logprob_t *prompt_lp;
    router_req_t *child[];
} rgroup_t;

/* The request counters and histograms of the router's metrics. */
typedef struct {
    metrics_counter_t *ok, *failed, *cancelled, *rejected, *tokens, *prompt_tokens, *preemptions;
    metrics_histogram_t *ttft, *e2e, *itl;
} router_counters_t;

struct router {
    uv_loop_t *loop;
    const cluster_config_t *cfg;
    pd_clock_t clock; /* deadlines and latencies (tests: a fake one); {NULL}: monotonic */
    hf_config_t model;
    char model_name[256];
    tokenizer_t *tok;
    char *chat_template; /* tokenizer_config.json chat_template, NULL if none */
    char bos_token[64], eos_token[64];
    rnode_t *nodes;
    int n_nodes, rr; /* rr: the next prefill node to try first (round_robin) */
    int rr_decode;   /* the next decode node to try first among equally loaded ones */

    int serving;
    void (*serving_cb)(void *arg, int serving);
    void *serving_arg;
    struct {
        void (*fn)(void *arg, metrics_t *m);
        void *arg;
    } sources[ROUTER_MAX_SOURCES];
    metrics_t *metrics;
    router_counters_t cnt;
    uv_timer_t poll;
    int poll_open, stopping;
    int draining;     /* SIGTERM: no new requests, running ones finish */
    char bearer[264]; /* "Bearer CLUSTER_TOKEN" for the nodes' control ports, "" : none */
    router_req_t *reqs;
    int n_reqs;
    uint64_t next_id;
};

static void rreq_reserve(router_req_t *q);
static void rreq_prefill(router_req_t *q);
static void rreq_decode(router_req_t *q);
static void rreq_maybe_free(router_req_t *q);

/* Adds the cluster token to a call to a node just started (transport.cluster_token_file). */
static void router__auth(const router_t *r, pd_grpc_client_call_t *call)
{
    if (r->bearer[0] && call)
        (void)pd_grpc_client_call_add_metadata(call, "authorization", r->bearer);
}

/* ==== node table and health polling ==== */

/* Requests of this router that use node n now: a decode node from its reservation to the end of
 * the stream, a prefill node while its Prefill call runs. */
static int router__node_running(const router_t *r, const rnode_t *n)
{
    int k = n->inflight; /* prefill calls */
    for (const router_req_t *q = r->reqs; q; q = q->next)
        k += !q->finished && q->dnode == n && n->node->role == CLUSTER_ROLE_DECODE;
    return k;
}

/* A node that may take new work: serving, not drained, not gone. */
static int router__usable(const rnode_t *n)
{
    return n->healthy && !n->draining && !n->left;
}

/* Recomputes the serving state (a prefill and a decode node up) and tells the watcher. */
static void router__update_serving(router_t *r)
{
    int p = 0, d = 0;
    for (int i = 0; i < r->n_nodes; i++) {
        if (!router__usable(&r->nodes[i]))
            continue;
        if (r->nodes[i].node->role == CLUSTER_ROLE_PREFILL)
            p++;
        else
            d++;
    }
    int serving = p > 0 && d > 0 && !r->draining;
    if (serving == r->serving)
        return;
    r->serving = serving;
    if (r->serving_cb)
        r->serving_cb(r->serving_arg, serving);
}

static void router__node_down(router_t *r, rnode_t *n, const char *why)
{
    if (n->healthy)
        pd_log_warn("node %s taken out: %s", n->node->name, why);
    n->healthy = 0;
    router__update_serving(r);
}

static void router__stats_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    rnode_t *n = arg;
    (void)msg;
    n->poll_call = NULL;
    if (code == 0 && resp) {
        const Pdserve__V1__NodeStats *s = (const Pdserve__V1__NodeStats *)resp;
        n->pages_used = s->pages_used;
        n->pages_total = s->pages_total;
        n->active = s->active;
        n->integrity_failures = s->integrity_failures;
        n->tp = s->tp;
        n->reserved_est = 0;
        if (!n->drain_known) { /* first word since this router started: the node remembers */
            n->drain_known = 1;
            if (s->operator_drain && !n->draining) {
                pd_log_info("node %s: drained before this router started (pdctl drain): kept "
                            "drained",
                            n->node->name);
                n->draining = 1;
                router__update_serving(n->router);
            }
        }
    }
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
}

static void router__health_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    rnode_t *n = arg;
    router_t *r = n->router;
    int serving = code == 0 && resp &&
                  ((const Grpc__Health__V1__HealthCheckResponse *)resp)->status == SERVING;
    n->poll_call = NULL;
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    if (code == 0)
        n->poll_failures = 0;
    else if (++n->poll_failures % LOST_POLLS == 0 && !r->stopping) {
        char why[160];
        snprintf(why, sizeof why, "node %s stopped answering (%s)", n->node->name,
                 msg && *msg ? msg : pd_grpc_wire_code_name(code));
        pd_log_warn("%s: dropping its connections", why);
        pd_grpc_client_reset(n->client, why); /* its calls end with UNAVAILABLE */
    }
    if (serving != n->healthy) {
        if (serving)
            pd_log_info("node %s is serving", n->node->name);
        else
            pd_log_warn("node %s is not serving (%s)", n->node->name,
                        code ? pd_grpc_wire_code_name(code) : "NOT_SERVING");
        n->healthy = serving;
        router__update_serving(r);
    }
    if (!serving || r->stopping)
        return;
    Pdserve__V1__StatsRequest req = PDSERVE__V1__STATS_REQUEST__INIT;
    req.drain = !n->drain_known ? 0 : n->draining ? 2 : 1; /* the node shows it, and keeps it */
    const char *path = n->node->role == CLUSTER_ROLE_DECODE ? "/pdserve.v1.Decode/Stats"
                                                            : "/pdserve.v1.Prefill/Stats";
    if (pd_grpc_client_unary(n->client, path, &req.base, &pdserve__v1__node_stats__descriptor,
                             POLL_MS * 2, router__stats_done, n, &n->poll_call) != PD_OK)
        n->poll_call = NULL;
    router__auth(r, n->poll_call);
}

static void router__poll(uv_timer_t *t)
{
    router_t *r = t->data;
    for (int i = 0; i < r->n_nodes; i++) {
        rnode_t *n = &r->nodes[i];
        Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        if (n->poll_call || n->left)
            continue;
        req.service = "";
        if (pd_grpc_client_unary(n->client, "/grpc.health.v1.Health/Check", &req.base,
                                 &grpc__health__v1__health_check_response__descriptor, POLL_MS * 2,
                                 router__health_done, n, &n->poll_call) != PD_OK)
            n->poll_call = NULL;
    }
}

/* ==== request pipeline ==== */

static int64_t rreq_remaining_ms(const router_req_t *q)
{
    int64_t left = q->deadline_ms - pd_clock_now_ms(&q->r->clock);
    return left > 1 ? left : 1;
}

static void rgroup_unref(rgroup_t *g)
{
    if (--g->live > 0)
        return;
    free(g->prompt_lp);
    free(g);
}

/* A node's TokenLogprob (checked: ids in the vocabulary, at most 20 alternatives) into *out.
 * Returns 0, or -1 when it does not fit. */
static int router__logprob(const router_t *r, const Pdserve__V1__TokenLogprob *m,
                           router_logprob_t *out)
{
    if (!m || m->token_id < 0 || m->token_id >= r->model.vocab_size ||
        m->n_top > ROUTER_MAX_TOP_LOGPROBS)
        return -1;
    out->token = m->token_id;
    out->logprob = m->logprob;
    out->n_top = (int)m->n_top;
    for (size_t k = 0; k < m->n_top; k++) {
        if (!m->top[k] || m->top[k]->token_id < 0 || m->top[k]->token_id >= r->model.vocab_size)
            return -1;
        out->top_ids[k] = m->top[k]->token_id;
        out->top_logprobs[k] = m->top[k]->logprob;
    }
    return 0;
}

/* n TokenLogprobs into a malloc'd array (NULL when n is 0, a message does not fit, or out of
 * memory). */
static router_logprob_t *router__logprobs(const router_t *r, Pdserve__V1__TokenLogprob **m,
                                          size_t n)
{
    router_logprob_t *lp = n ? malloc(n * sizeof *lp) : NULL;
    for (size_t i = 0; lp && i < n; i++) {
        if (router__logprob(r, m[i], &lp[i]) != 0) {
            free(lp);
            return NULL;
        }
    }
    return lp;
}

/* Counts a finished request's finish reason (stop, length, abort, error, cancelled). */
static void router__observe_reason(router_t *r, const char *reason)
{
    const char *labels[] = {"reason", reason, NULL};
    metrics_counter_t *c;
    if (metrics_counter_register(r->metrics, "pdserve_router_finish_reason_total",
                                 "finished requests by finish reason", labels, &c) == PD_OK)
        metrics_counter_inc(c);
}

static void router__observe(router_t *r, const router_req_t *q, pd_status_t st)
{
    router_counters_t *c = &r->cnt;
    metrics_counter_inc(st == PD_OK ? c->ok : st == PD_ERR_CANCELLED ? c->cancelled : c->failed);
    metrics_counter_add(c->tokens, q->n_generated);
    if (q->index == 0) /* the samples of one request share its prompt */
        metrics_counter_add(c->prompt_tokens, q->n_prompt);
    metrics_counter_add(c->preemptions, q->n_preemptions);
    if (q->first_token_ms)
        metrics_histogram_observe(c->ttft, (double)(q->first_token_ms - q->start_ms) / 1000.0);
    metrics_histogram_observe(c->e2e,
                              (double)(pd_clock_now_ms(&q->r->clock) - q->start_ms) / 1000.0);
}

void router_request_finish(router_req_t *q, const char *reason, pd_status_t st, const char *msg)
{
    if (q->finished)
        return;
    q->finished = 1;
    if (q->text_len > q->sent_len && st == PD_OK) { /* text held back for stop strings */
        q->sink->delta(q, q->sink_arg, NULL, 0, q->text + q->sent_len, q->text_len - q->sent_len,
                       NULL);
        q->sent_len = q->text_len;
    }
    router__observe(q->r, q, st);
    router__observe_reason(q->r, st == PD_OK ? (reason ? reason : "stop") : "error");
    rgroup_t *g = q->group;
    const int cascade = g && q->n_prefill_samples > 1;
    if (cascade)
        g->live++;
    q->sink->finish(q, q->sink_arg, reason, st, msg);
    q->sink = NULL;
    if (cascade) {
        /* the leader ended before its prefill answered: the samples waiting on it end too
         * (after the leader's finish, in which a front end may cancel them all) */
        for (int i = 1; i < g->n; i++)
            if (g->child[i] && !g->child[i]->finished && g->child[i]->waiting)
                router_request_finish(g->child[i], reason, st, msg);
        rgroup_unref(g);
    }
    if (q->ccall && q->decoding) /* a decode stream still running: RST_STREAM frees its pages */
        pd_grpc_client_call_cancel(q->ccall);
    rreq_maybe_free(q); /* reserve / prefill calls finish first, then the pages are released */
}

static void rreq_release_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    (void)arg;
    (void)code;
    (void)msg;
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
}

/* Drops reservation seq_id on decode node n (nobody will decode from it). */
static void router__release(router_t *r, rnode_t *n, uint64_t seq_id)
{
    Pdserve__V1__ReleaseRequest req = PDSERVE__V1__RELEASE_REQUEST__INIT;
    if (!n || r->stopping)
        return;
    req.seq_id = seq_id;
    pd_grpc_client_call_t *call = NULL;
    if (pd_grpc_client_unary(n->client, "/pdserve.v1.Decode/Release", &req.base,
                             &pdserve__v1__release_reply__descriptor, 5000, rreq_release_done, NULL,
                             &call) == PD_OK)
        router__auth(r, call);
}

/* Drops the reservation on the decode node (the request will not be decoded there). */
static void rreq_release(router_req_t *q)
{
    if (!q->resv || !q->dnode)
        return;
    router__release(q->r, q->dnode, q->resv->dest->seq_id);
    protobuf_c_message_free_unpacked(&q->resv->base, NULL);
    q->resv = NULL;
}

static void rreq_free_orphan(router_req_t *q)
{
    tokenizer_stream_destroy(q->detok);
    for (int i = 0; i < q->n_stop; i++)
        free(q->stop[i]);
    free(q->stop);
    free(q->tokens);
    free(q->text);
    if (q->resv)
        protobuf_c_message_free_unpacked(&q->resv->base, NULL);
    free(q->bias);
    free(q->bias_ptrs);
    free(q->stop_ids);
    if (q->group) {
        q->group->child[q->index] = NULL;
        rgroup_unref(q->group);
    } else {
        free(q->prompt_lp);
    }
    free(q);
}

static void rreq_timer_closed(uv_handle_t *h)
{
    router_req_t *q = h->data;
    q->timer_open = 0;
    if (q->orphan)
        rreq_free_orphan(q);
    else
        rreq_maybe_free(q);
}

static void rreq_maybe_free(router_req_t *q)
{
    if (!q->finished || q->ccall || q->timer_active)
        return;
    if (q->timer_open) {
        if (!uv_is_closing((uv_handle_t *)&q->timer))
            uv_close((uv_handle_t *)&q->timer, rreq_timer_closed);
        return;
    }
    rreq_release(q);
    router_t *r = q->r;
    if (q->prev)
        q->prev->next = q->next;
    else
        r->reqs = q->next;
    if (q->next)
        q->next->prev = q->prev;
    r->n_reqs--;
    rreq_free_orphan(q);
}

/* The first occurrence of needle (nlen >= 1 bytes) in hay[0, len), or NULL. Generated text may
 * hold NUL bytes, so no strstr. */
static const char *rreq_find(const char *hay, size_t len, const char *needle, size_t nlen)
{
    return len >= nlen ? memmem(hay, len, needle, nlen) : NULL;
}

/* Appends one generated token's text; returns PD_OK or PD_ERR_NOMEM (q unchanged). */
static pd_status_t rreq_append_text(router_req_t *q, const char *delta, size_t dlen)
{
    if (q->text_len + dlen + 1 > q->text_cap) {
        size_t cap = (q->text_len + dlen + 1) * 2;
        char *text = realloc(q->text, cap);
        if (!text)
            return PD_ERR_NOMEM;
        q->text = text;
        q->text_cap = cap;
    }
    memcpy(q->text + q->text_len, delta, dlen);
    q->text_len += dlen;
    q->text[q->text_len] = 0;
    return PD_OK;
}

/* Appends generated tokens (from a node: checked here): EOS / length / stop strings end the
 * request, and so do a token outside the vocabulary (PD_ERR_PROTOCOL) or an allocation failure
 * (PD_ERR_NOMEM). Returns 1 if it ended. */
static int rreq_emit(router_req_t *q, const int32_t *ids, size_t n, const char *from_node,
                     const router_logprob_t *lps)
{
    router_t *r = q->r;
    for (size_t k = 0; k < n && !q->finished; k++) {
        int32_t tok = ids[k];
        char *delta = NULL, msg[160];
        size_t dlen = 0;
        bool eos = false;
        if (tok < 0 || tok >= r->model.vocab_size) {
            snprintf(msg, sizeof msg, "%s sent token id %d, outside the vocabulary (0..%d)",
                     from_node, tok, r->model.vocab_size - 1);
            pd_log_error("request %s: %s", q->request_id, msg);
            router_request_finish(q, NULL, PD_ERR_INTERNAL, msg);
            break;
        }
        if (q->n_tokens == q->cap) { /* cap holds prompt + max_tokens: a node sent too many */
            router_request_finish(q, "length", PD_OK, NULL);
            break;
        }
        /* min_tokens: EOS, stop ids and stop strings count only from then on (vLLM) */
        const int may_stop = q->n_generated + 1 >= q->min_tokens;
        int stop_id = 0;
        for (int i = 0; may_stop && i < q->n_stop_ids; i++)
            stop_id |= tok == q->stop_ids[i];
        /* a stop token's text is not returned (vLLM), its id and logprob are */
        pd_status_t st = stop_id ? PD_OK : tokenizer_stream_push(q->detok, tok, &delta, &dlen);
        if (st == PD_OK && dlen > 0)
            st = rreq_append_text(q, delta, dlen);
        else if (st == PD_ERR_INVALID) /* an id the tokenizer lacks (padded vocabulary): no text */
            st = PD_OK;
        free(delta);
        if (st != PD_OK) {
            router_request_finish(q, NULL, PD_ERR_NOMEM, "router out of memory for the output");
            break;
        }
        q->tokens[q->n_tokens++] = tok;
        q->n_generated++;
        int64_t now = pd_clock_now_ms(&q->r->clock);
        if (q->last_token_ms) /* tokens of one batch from the node arrive together: 0 s */
            metrics_histogram_observe(r->cnt.itl, (double)(now - q->last_token_ms) / 1000.0);
        q->last_token_ms = now;
        eos = may_stop && (stop_id || hf_config_is_stop(&r->model, tok, q->ignore_eos, NULL, 0));
        /* stop strings: cut the text where the first one starts */
        size_t send_to = q->text_len,
               from = q->sent_len > q->max_stop ? q->sent_len - q->max_stop : 0;
        int stopped = 0;
        for (int i = 0; may_stop && i < q->n_stop; i++) {
            const char *hit = q->text ? rreq_find(q->text + from, q->text_len - from, q->stop[i],
                                                  strlen(q->stop[i]))
                                      : NULL;
            if (hit && (size_t)(hit - q->text) < send_to) {
                send_to = (size_t)(hit - q->text);
                stopped = 1;
            }
        }
        if (!stopped && q->max_stop > 0) /* hold back what could start a stop string */
            send_to = q->text_len >= q->max_stop - 1 ? q->text_len - (q->max_stop - 1) : 0;
        if (send_to < q->sent_len)
            send_to = q->sent_len;
        q->sink->delta(q, q->sink_arg, &tok, 1, q->text + q->sent_len, send_to - q->sent_len,
                       lps ? &lps[k] : NULL);
        q->sent_len = send_to;
        if (stopped) {
            q->text_len = send_to; /* the stop string and what follows are not returned */
            router_request_finish(q, "stop", PD_OK, NULL);
        } else if (eos) {
            router_request_finish(q, "stop", PD_OK, NULL);
        } else if (q->n_generated >= q->max_tokens) {
            router_request_finish(q, "length", PD_OK, NULL);
        } else if (q->n_tokens >= r->model.max_position_embeddings) {
            router_request_finish(q, "length", PD_OK, NULL);
        }
    }
    return q->finished;
}

static void rreq_retry_timer(uv_timer_t *t)
{
    router_req_t *q = t->data;
    q->timer_active = 0;
    if (q->finished) {
        rreq_maybe_free(q);
        return;
    }
    rreq_reserve(q);
}

static void rreq_retry_later(router_req_t *q)
{
    if (!q->timer_open) {
        uv_timer_init(q->r->loop, &q->timer);
        q->timer.data = q;
        q->timer_open = 1;
    }
    q->timer_active = 1;
    uv_timer_start(&q->timer, rreq_retry_timer, RETRY_MS, 0);
}

/* The usable decode node with the smallest share of its pages in use or reserved (least_kv);
 * among equal shares the one after the last pick (round robin), so that idle nodes all take work
 * (the first node would otherwise win every tie: sequential requests on an idle cluster all went
 * to decode0). */
static rnode_t *router__pick_decode(router_t *r, const router_req_t *q)
{
    rnode_t *best = NULL;
    double best_use = 2.0;
    int best_i = -1;
    for (int k = 0; k < r->n_nodes; k++) {
        const int i = (r->rr_decode + k) % r->n_nodes;
        rnode_t *n = &r->nodes[i];
        if (n->node->role != CLUSTER_ROLE_DECODE || !router__usable(n) || (q->tried & (1ull << i)))
            continue;
        double use =
            n->pages_total ? (double)(n->pages_used + n->reserved_est) / n->pages_total : 1.0;
        if (!best || use < best_use) {
            best = n;
            best_use = use;
            best_i = i;
        }
    }
    if (best)
        r->rr_decode = best_i + 1;
    return best;
}

static rnode_t *router__pick_prefill(router_t *r, const router_req_t *q)
{
    rnode_t *best = NULL;
    for (int k = 0; k < r->n_nodes; k++) {
        int i = (r->rr + k) % r->n_nodes;
        rnode_t *n = &r->nodes[i];
        if (n->node->role != CLUSTER_ROLE_PREFILL || !router__usable(n) || (q->tried & (1ull << i)))
            continue;
        if (r->cfg->router.prefill_policy == CLUSTER_PREFILL_ROUND_ROBIN) {
            r->rr = i + 1;
            return n;
        }
        if (!best || n->inflight < best->inflight)
            best = n;
    }
    return best;
}

/* Checks a decode node's reservation for q's prompt (64-bit, before it reaches a prefill node).
 * Returns 0 or -1 with err set. */
static int rreq_check_resv(const router_req_t *q, const Pdserve__V1__KvDestination *d, char *err,
                           size_t err_len)
{
    int64_t pt = d->layout && d->layout->page_tokens ? (int64_t)d->layout->page_tokens
                                                     : (int64_t)q->dnode->node->page_tokens;
    int64_t need = (q->n_tokens + pt - 1) / pt,
            most = (q->r->model.max_position_embeddings + pt - 1) / pt;
    if (d->seq_id != 0 && (int64_t)d->n_pages >= need && (int64_t)d->n_pages <= most)
        return 0;
    snprintf(err, err_len,
             "decode node %s: reservation %llu of %zu pages of %lld tokens for %d tokens is "
             "invalid",
             q->dnode->node->name, (unsigned long long)d->seq_id, d->n_pages, (long long)pt,
             q->n_tokens);
    return -1;
}

static void rreq_reserve_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    router_req_t *q = arg;
    router_t *r = q->r;
    q->ccall = NULL;
    if (q->finished) {
        if (code == 0 && resp) { /* cancelled meanwhile: give the pages back */
            q->resv = (Pdserve__V1__ReserveReply *)resp;
            resp = NULL;
        }
        if (resp)
            protobuf_c_message_free_unpacked(resp, NULL);
        rreq_maybe_free(q);
        return;
    }
    if (code == 0 && resp && ((Pdserve__V1__ReserveReply *)resp)->dest) {
        char err[256];
        q->resv = (Pdserve__V1__ReserveReply *)resp;
        if (rreq_check_resv(q, q->resv->dest, err, sizeof err) != 0) {
            pd_log_error("request %s: %s", q->request_id, err);
            rreq_release(q);
            router_request_finish(q, NULL, PD_ERR_INTERNAL, err);
            return;
        }
        q->tried = 0;
        rreq_prefill(q);
        return;
    }
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    if (code == PD_GRPC_DEADLINE_EXCEEDED) {
        /* the call's timeout is the request's remaining time (rreq_remaining_ms), so this is the
         * request's deadline, not a sign that the node is down. The client's timer runs on the
         * loop's cached time, which lags the router's clock: the router's clock may still say
         * "before the deadline" here, and must not send this request (or a node) elsewhere. */
        router_request_finish(q, NULL, PD_ERR_DEADLINE,
                              "deadline exceeded while reserving kv pages");
        return;
    }
    if (code == PD_GRPC_RESOURCE_EXHAUSTED || code == PD_GRPC_UNAVAILABLE) {
        if (code != PD_GRPC_RESOURCE_EXHAUSTED)
            router__node_down(r, q->dnode, msg ? msg : "reserve failed");
        q->tried |= 1ull << (q->dnode - r->nodes);
        rreq_reserve(q);
        return;
    }
    router_request_finish(q, NULL, pd_grpc_wire_code_to_status(code), msg ? msg : "reserve failed");
}

static void rreq_reserve(router_req_t *q)
{
    router_t *r = q->r;
    Pdserve__V1__ReserveRequest req = PDSERVE__V1__RESERVE_REQUEST__INIT;
    rnode_t *n;

    if (pd_clock_now_ms(&q->r->clock) >= q->deadline_ms) {
        router_request_finish(q, NULL, PD_ERR_DEADLINE,
                              "deadline exceeded while waiting for kv pages");
        return;
    }
    if (!(n = router__pick_decode(r, q))) {
        int any = 0;
        for (int i = 0; i < r->n_nodes; i++)
            any |= r->nodes[i].node->role == CLUSTER_ROLE_DECODE && router__usable(&r->nodes[i]);
        if (!any) {
            router_request_finish(q, NULL, PD_ERR_UNAVAILABLE, "no decode node is available");
            return;
        }
        q->tried = 0; /* every decode node is full: queue and try again shortly */
        rreq_retry_later(q);
        return;
    }
    q->dnode = n;
    /* count the pages now, not on the reply: a burst must not all pick the same node */
    n->reserved_est += (uint32_t)((q->n_tokens + n->node->page_tokens - 1) / n->node->page_tokens);
    req.request_id = q->request_id;
    req.n_tokens = (uint32_t)q->n_tokens;
    req.max_tokens = (uint32_t)(q->max_tokens - q->n_generated);
    req.lease_ms = r->cfg->transport.lease_ms;
    if (pd_grpc_client_unary(n->client, "/pdserve.v1.Decode/Reserve", &req.base,
                             &pdserve__v1__reserve_reply__descriptor, rreq_remaining_ms(q),
                             rreq_reserve_done, q, &q->ccall) != PD_OK) {
        q->ccall = NULL;
        router_request_finish(q, NULL, PD_ERR_NOMEM, "reserve failed");
        return;
    }
    router__auth(r, q->ccall);
}

static void rreq_fill_sampling(const router_req_t *q, Pdserve__V1__SamplingParams *sp)
{
    sp->max_tokens = (uint32_t)q->max_tokens;
    sp->temperature = q->temperature;
    sp->top_p = q->top_p;
    sp->top_k = q->top_k;
    sp->seed = q->seed;
    sp->ignore_eos = q->ignore_eos;
    sp->logprobs = q->logprobs;
    sp->top_logprobs = (uint32_t)q->top_logprobs;
    sp->presence_penalty = q->presence_penalty;
    sp->frequency_penalty = q->frequency_penalty;
    sp->repetition_penalty = q->repetition_penalty;
    sp->logit_bias = q->bias_ptrs;
    sp->n_logit_bias = q->n_bias;
    sp->min_tokens = (uint32_t)q->min_tokens;
    sp->stop_token_ids = q->stop_ids;
    sp->n_stop_token_ids = (size_t)q->n_stop_ids;
}

/* The leader's prefill answered for every sample: each sample emits its first token; those that
 * go on decode from the one reservation (its pages copied on the decode node for all but the
 * last), which is released when none goes on. Consumes rep. */
static void rreq_distribute(router_req_t *q, Pdserve__V1__PrefillReply *rep)
{
    router_t *r = q->r;
    rgroup_t *g = q->group;
    const int n = q->n_prefill_samples;
    router_logprob_t *lps = NULL;
    char name[64];

    if (rep->n_first_tokens != (size_t)n ||
        (q->logprobs &&
         (rep->n_first_logprobs != (size_t)n ||
          !(lps = router__logprobs(r, rep->first_logprobs, rep->n_first_logprobs))))) {
        char msg[160];
        snprintf(msg, sizeof msg, "prefill node %s answered %zu first tokens for %d samples",
                 q->pnode->node->name, rep->n_first_tokens, n);
        pd_log_error("request %s: %s", q->request_id, msg);
        protobuf_c_message_free_unpacked(&rep->base, NULL);
        router_request_finish(q, NULL, PD_ERR_INTERNAL, msg); /* its samples too */
        return;
    }
    Pdserve__V1__ReserveReply *resv = q->resv; /* the samples' now: not released with q */
    rnode_t *dnode = q->dnode;
    q->resv = NULL;
    snprintf(name, sizeof name, "%s", q->pnode->node->name);
    g->live++; /* samples may be freed below */
    for (int i = 0; i < n; i++) {
        router_req_t *c = g->child[i];
        if (!c || c->finished)
            continue;
        c->waiting = 0;
        c->n_prefill_samples = 1; /* a re-prefill (after a preemption) is its own */
        c->dnode = dnode;
        c->first_token_ms = q->first_token_ms;
        c->d_seq_id = resv->dest->seq_id;
        c->d_token_len = resv->dest->token.len <= sizeof c->d_token ? resv->dest->token.len : 0;
        if (c->d_token_len)
            memcpy(c->d_token, resv->dest->token.data, c->d_token_len);
    }
    uint32_t going = 0;
    for (int i = 0; i < n; i++) {
        router_req_t *c = g->child[i];
        if (c && !c->finished &&
            !rreq_emit(c, &rep->first_tokens[i], 1, name, lps ? &lps[i] : NULL))
            going++;
    }
    if (going == 0)
        router__release(r, dnode, resv->dest->seq_id);
    for (int i = 0; i < n && going > 0; i++) {
        router_req_t *c = g->child[i];
        if (!c || c->finished)
            continue;
        c->d_n_samples = going;
        rreq_decode(c);
    }
    free(lps);
    protobuf_c_message_free_unpacked(&resv->base, NULL);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    rgroup_unref(g);
}

static void rreq_prefill_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    router_req_t *q = arg;
    router_t *r = q->r;
    q->ccall = NULL;
    q->pnode->inflight--;
    if (q->finished) {
        if (resp)
            protobuf_c_message_free_unpacked(resp, NULL);
        rreq_maybe_free(q); /* releases the reservation */
        return;
    }
    if (code == 0 && resp) {
        Pdserve__V1__PrefillReply *rep = (Pdserve__V1__PrefillReply *)resp;
        int32_t first = rep->first_token;
        router_logprob_t lp;
        int have_lp = q->logprobs && rep->n_first_logprobs >= 1 &&
                      router__logprob(r, rep->first_logprobs[0], &lp) == 0;
        if (q->first_token_ms == 0)
            q->first_token_ms = pd_clock_now_ms(&q->r->clock);
        if (q->prompt_logprobs && !q->prompt_lp && q->n_prompt > 1 &&
            rep->n_prompt_logprobs == (size_t)q->n_prompt - 1) {
            router_logprob_t *plp =
                router__logprobs(r, rep->prompt_logprobs, rep->n_prompt_logprobs);
            if (q->group) {
                q->group->prompt_lp = plp;
                for (int i = 0; i < q->group->n; i++)
                    if (q->group->child[i])
                        q->group->child[i]->prompt_lp = plp;
            } else {
                q->prompt_lp = plp;
            }
        }
        if (q->n_prefill_samples > 1) {
            rreq_distribute(q, rep);
            return;
        }
        protobuf_c_message_free_unpacked(resp, NULL);
        if (rreq_emit(q, &first, 1, q->pnode->node->name, have_lp ? &lp : NULL))
            return; /* finished: maybe_free releases the reservation */
        rreq_decode(q);
        return;
    }
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    if (code == PD_GRPC_RESOURCE_EXHAUSTED && pd_clock_now_ms(&q->r->clock) < q->deadline_ms) {
        /* the prefill node was too busy to write before the reservation's lease ended: both
         * nodes are fine, take a fresh reservation */
        pd_log_info("request %s: %s; reserving again", q->request_id, msg ? msg : "lease ended");
        rreq_release(q);
        rreq_reserve(q);
        return;
    }
    if (code == PD_GRPC_DEADLINE_EXCEEDED) {
        /* the request's deadline (the call's timeout is its remaining time; see
         * rreq_reserve_done): no retry, and the prefill node is not marked down for it */
        router_request_finish(q, NULL, PD_ERR_DEADLINE, "deadline exceeded in prefill");
        return;
    }
    if (code == PD_GRPC_UNAVAILABLE && pd_clock_now_ms(&q->r->clock) < q->deadline_ms) {
        /* the prefill node died or the transfer failed: the reservation's pages may have been
         * partly written, so take a fresh one and retry on another prefill node */
        if (msg && strstr(msg, "decode node"))
            router__node_down(r, q->dnode, msg);
        else
            router__node_down(r, q->pnode, msg ? msg : "prefill failed");
        rreq_release(q);
        rreq_reserve(q);
        return;
    }
    router_request_finish(q, NULL, pd_grpc_wire_code_to_status(code), msg ? msg : "prefill failed");
}

static void rreq_prefill(router_req_t *q)
{
    router_t *r = q->r;
    Pdserve__V1__PrefillRequest req = PDSERVE__V1__PREFILL_REQUEST__INIT;
    Pdserve__V1__SamplingParams sp = PDSERVE__V1__SAMPLING_PARAMS__INIT;
    rnode_t *n = router__pick_prefill(r, q);
    if (!n) {
        router_request_finish(q, NULL, PD_ERR_UNAVAILABLE, "no prefill node is available");
        return;
    }
    q->pnode = n;
    rreq_fill_sampling(q, &sp);
    req.request_id = q->request_id;
    req.token_ids = q->tokens;
    req.n_token_ids = (size_t)q->n_tokens;
    req.sampling = &sp;
    req.dest = q->resv->dest;
    req.n_generated = (uint32_t)q->n_generated;
    req.n_samples = (uint32_t)q->n_prefill_samples;
    req.sample_index = (uint32_t)q->index;
    sp.prompt_logprobs = q->prompt_logprobs && !q->prompt_lp; /* once, for the first prefill */
    n->inflight++;
    if (pd_grpc_client_unary(n->client, "/pdserve.v1.Prefill/Prefill", &req.base,
                             &pdserve__v1__prefill_reply__descriptor, rreq_remaining_ms(q),
                             rreq_prefill_done, q, &q->ccall) != PD_OK) {
        n->inflight--;
        q->ccall = NULL;
        router_request_finish(q, NULL, PD_ERR_NOMEM, "prefill failed");
        return;
    }
    router__auth(r, q->ccall);
}

static void rreq_decode_msg(void *arg, ProtobufCMessage *msg)
{
    router_req_t *q = arg;
    const Pdserve__V1__DecodeEvent *ev = (const Pdserve__V1__DecodeEvent *)msg;
    if (!q->finished) {
        if (ev->preempted) {
            q->preempted = 1;
        } else if (ev->n_token_ids) {
            router_logprob_t *lps = q->logprobs && ev->n_logprobs == ev->n_token_ids
                                        ? router__logprobs(q->r, ev->logprobs, ev->n_logprobs)
                                        : NULL;
            rreq_emit(q, ev->token_ids, ev->n_token_ids, q->dnode->node->name, lps);
            free(lps);
        }
    }
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void rreq_decode_done(void *arg, int code, const char *msg)
{
    router_req_t *q = arg;
    router_t *r = q->r;
    q->ccall = NULL;
    q->decoding = 0;
    if (q->finished) {
        rreq_maybe_free(q);
        return;
    }
    if (q->preempted) {
        /* evicted for pages: prefill prompt + generated again, elsewhere if need be */
        q->preempted = 0;
        q->n_preemptions++;
        pd_log_info("request %s: preempted on %s after %d tokens; re-prefilling", q->request_id,
                    q->dnode->node->name, q->n_generated);
        rreq_reserve(q);
        return;
    }
    if (code == 0) {
        /* the decode node ended it (EOS, max tokens or context) without our emit seeing it */
        router_request_finish(q, q->n_generated >= q->max_tokens ? "length" : "stop", PD_OK, NULL);
        return;
    }
    if (code == PD_GRPC_NOT_FOUND && q->n_lost < ROUTER_MAX_LOST &&
        pd_clock_now_ms(&r->clock) < q->deadline_ms) {
        /* the decode node no longer holds the reservation: its lease ended before the KV pages
         * arrived (seen after a network cut healed: the prefill node's transfer waited on an
         * endpoint that had died) and it released the pages. Nothing of the request is left
         * there: prefill prompt + generated again, as after a preemption. */
        q->n_lost++;
        pd_log_warn("request %s: reservation lost on %s (%s); re-prefilling", q->request_id,
                    q->dnode->node->name, msg ? msg : "not found");
        rreq_reserve(q);
        return;
    }
    if (code == PD_GRPC_UNAVAILABLE)
        router__node_down(r, q->dnode, msg ? msg : "decode stream failed");
    char buf[256];
    snprintf(buf, sizeof buf, "%s (decode node %s)", msg ? msg : pd_grpc_wire_code_name(code),
             q->dnode->node->name);
    router_request_finish(q, NULL, pd_grpc_wire_code_to_status(code), buf);
}

static void rreq_decode(router_req_t *q)
{
    Pdserve__V1__DecodeRequest req = PDSERVE__V1__DECODE_REQUEST__INIT;
    Pdserve__V1__SamplingParams sp = PDSERVE__V1__SAMPLING_PARAMS__INIT;
    rreq_fill_sampling(q, &sp);
    if (q->resv) { /* the reservation's token: the decode node checks it */
        q->d_seq_id = q->resv->dest->seq_id;
        q->d_token_len =
            q->resv->dest->token.len <= sizeof q->d_token ? q->resv->dest->token.len : 0;
        if (q->d_token_len)
            memcpy(q->d_token, q->resv->dest->token.data, q->d_token_len);
        protobuf_c_message_free_unpacked(&q->resv->base, NULL);
        q->resv = NULL;
    }
    req.token.data = q->d_token;
    req.token.len = q->d_token_len;
    req.seq_id = q->d_seq_id;
    req.sample_index = (uint32_t)q->index;
    req.n_samples = q->d_n_samples ? q->d_n_samples : 1;
    q->d_n_samples = 0; /* a later Decode (after a preemption) has its own reservation */
    req.request_id = q->request_id;
    req.token_ids = q->tokens;
    req.n_token_ids = (size_t)q->n_tokens;
    req.sampling = &sp;
    req.max_new_tokens = (uint32_t)(q->max_tokens - q->n_generated);
    req.n_generated = (uint32_t)q->n_generated;
    /* from here the decode node owns the pages: no Release, a cancel of the stream frees them */
    q->decoding = 1;
    if (pd_grpc_client_stream(q->dnode->client, "/pdserve.v1.Decode/Decode", &req.base,
                              &pdserve__v1__decode_event__descriptor, rreq_remaining_ms(q),
                              rreq_decode_msg, rreq_decode_done, q, &q->ccall) != PD_OK) {
        q->ccall = NULL;
        q->decoding = 0;
        router_request_finish(q, NULL, PD_ERR_NOMEM, "decode failed");
        return;
    }
    router__auth(q->r, q->ccall);
}

/* ==== requests (the front ends' entry points) ==== */

/* Checks the OpenAI / vLLM parameters of a request (64-bit, before any narrowing); the vocabulary
 * checks are router__check_ids'. Returns PD_OK or PD_ERR_INVALID with err set. */
static pd_status_t router__check_openai(const router_request_t *in, char *err, size_t err_len)
{
    const int64_t n = in->n ? in->n : 1;
    if (n < 1 || n > ROUTER_MAX_N) {
        snprintf(err, err_len, "n must be in 1..%d (got %lld)", ROUTER_MAX_N, (long long)in->n);
        return PD_ERR_INVALID;
    }
    if (in->best_of != 0 && in->best_of < n) {
        snprintf(err, err_len, "best_of %lld must be at least n %lld", (long long)in->best_of,
                 (long long)n);
        return PD_ERR_INVALID;
    }
    if (in->best_of > n) {
        snprintf(err, err_len,
                 "best_of %lld > n %lld is not supported by this server (best_of == n is)",
                 (long long)in->best_of, (long long)n);
        return PD_ERR_INVALID;
    }
    if (in->top_logprobs < 0 || in->top_logprobs > ROUTER_MAX_TOP_LOGPROBS) {
        snprintf(err, err_len, "top_logprobs must be in 0..%d (got %lld)", ROUTER_MAX_TOP_LOGPROBS,
                 (long long)in->top_logprobs);
        return PD_ERR_INVALID;
    }
    if (!(in->presence_penalty >= -2.0f && in->presence_penalty <= 2.0f) ||
        !(in->frequency_penalty >= -2.0f && in->frequency_penalty <= 2.0f)) {
        snprintf(err, err_len, "presence_penalty and frequency_penalty must be in [-2, 2]");
        return PD_ERR_INVALID;
    }
    if (!(in->repetition_penalty >= 0.0f) || !isfinite(in->repetition_penalty) ||
        (in->repetition_penalty == 0.0f && signbit(in->repetition_penalty))) {
        snprintf(err, err_len, "repetition_penalty must be a finite number > 0");
        return PD_ERR_INVALID;
    }
    if (in->n_bias > ROUTER_MAX_LOGIT_BIAS) {
        snprintf(err, err_len, "logit_bias: at most %d entries (got %zu)", ROUTER_MAX_LOGIT_BIAS,
                 in->n_bias);
        return PD_ERR_INVALID;
    }
    for (size_t i = 0; i < in->n_bias; i++) {
        if (!(in->bias_vals[i] >= -100.0f && in->bias_vals[i] <= 100.0f)) {
            snprintf(err, err_len, "logit_bias: the bias of token %d must be in [-100, 100]",
                     in->bias_ids[i]);
            return PD_ERR_INVALID;
        }
    }
    if (in->min_tokens < 0 || in->min_tokens > in->max_tokens) {
        snprintf(err, err_len, "min_tokens %lld must be in 0..max_tokens (%lld)",
                 (long long)in->min_tokens, (long long)in->max_tokens);
        return PD_ERR_INVALID;
    }
    if (in->n_stop_token_ids > ROUTER_MAX_STOP_IDS) {
        snprintf(err, err_len, "stop_token_ids: at most %d (got %zu)", ROUTER_MAX_STOP_IDS,
                 in->n_stop_token_ids);
        return PD_ERR_INVALID;
    }
    return PD_OK;
}

/* Token ids of logit_bias and stop_token_ids in the vocabulary. PD_OK or PD_ERR_INVALID. */
static pd_status_t router__check_ids(const router_t *r, const router_request_t *in, char *err,
                                     size_t err_len)
{
    const int32_t vocab = r->model.vocab_size;
    for (size_t i = 0; i < in->n_bias; i++) {
        if (in->bias_ids[i] < 0 || in->bias_ids[i] >= vocab) {
            snprintf(err, err_len, "logit_bias: token %d is outside the vocabulary (0..%d)",
                     in->bias_ids[i], vocab - 1);
            return PD_ERR_INVALID;
        }
    }
    for (size_t i = 0; i < in->n_stop_token_ids; i++) {
        if (in->stop_token_ids[i] < 0 || in->stop_token_ids[i] >= vocab) {
            snprintf(err, err_len, "stop_token_ids: %d is outside the vocabulary (0..%d)",
                     in->stop_token_ids[i], vocab - 1);
            return PD_ERR_INVALID;
        }
    }
    return PD_OK;
}

/* Copies the OpenAI / vLLM parameters of in into q. PD_OK or PD_ERR_NOMEM. */
static pd_status_t rreq_copy_openai(router_req_t *q, const router_request_t *in)
{
    q->logprobs = in->logprobs != 0;
    q->top_logprobs = (int)in->top_logprobs;
    q->prompt_logprobs = in->prompt_logprobs != 0;
    q->presence_penalty = in->presence_penalty;
    q->frequency_penalty = in->frequency_penalty;
    q->repetition_penalty = in->repetition_penalty;
    q->min_tokens = (int)in->min_tokens;
    if (in->n_bias) {
        q->bias = calloc(in->n_bias, sizeof *q->bias);
        q->bias_ptrs = calloc(in->n_bias, sizeof *q->bias_ptrs);
        if (!q->bias || !q->bias_ptrs)
            return PD_ERR_NOMEM;
        for (size_t i = 0; i < in->n_bias; i++) {
            Pdserve__V1__LogitBias init = PDSERVE__V1__LOGIT_BIAS__INIT;
            q->bias[i] = init;
            q->bias[i].token_id = in->bias_ids[i];
            q->bias[i].bias = in->bias_vals[i];
            q->bias_ptrs[i] = &q->bias[i];
        }
        q->n_bias = in->n_bias;
    }
    if (in->n_stop_token_ids) {
        if (!(q->stop_ids = malloc(in->n_stop_token_ids * sizeof *q->stop_ids)))
            return PD_ERR_NOMEM;
        memcpy(q->stop_ids, in->stop_token_ids, in->n_stop_token_ids * sizeof *q->stop_ids);
        q->n_stop_ids = (int)in->n_stop_token_ids;
    }
    return PD_OK;
}

/* Checks the numbers of a request (64-bit, before any narrowing) that do not need its tokens.
 * Returns PD_OK or PD_ERR_INVALID with err set. */
static pd_status_t router__check_request(const router_request_t *in, char *err, size_t err_len)
{
    if (in->request_id && strlen(in->request_id) > ROUTER_REQUEST_ID_MAX) {
        snprintf(err, err_len, "request_id is longer than %d bytes", ROUTER_REQUEST_ID_MAX);
        return PD_ERR_INVALID;
    }
    if (in->max_tokens < 1) {
        snprintf(err, err_len, "max_tokens must be at least 1 (got %lld)",
                 (long long)in->max_tokens);
        return PD_ERR_INVALID;
    }
    if (!(in->temperature >= 0.0f) || !isfinite(in->temperature)) {
        snprintf(err, err_len, "sampling: temperature must be a finite number >= 0");
        return PD_ERR_INVALID;
    }
    if (!(in->top_p >= 0.0f && in->top_p <= 1.0f)) {
        snprintf(err, err_len, "sampling: top_p must be in (0, 1] (0: unset)");
        return PD_ERR_INVALID;
    }
    if (in->top_k < 0) {
        snprintf(err, err_len, "sampling: top_k must be >= 0 (got %lld)", (long long)in->top_k);
        return PD_ERR_INVALID;
    }
    if (in->n_stop > ROUTER_MAX_STOP) {
        snprintf(err, err_len, "at most %d stop strings (got %zu)", ROUTER_MAX_STOP, in->n_stop);
        return PD_ERR_INVALID;
    }
    if (in->n_token_ids == 0 && in->text_len == 0) {
        snprintf(err, err_len, "the prompt is empty (give text or token_ids)");
        return PD_ERR_INVALID;
    }
    return router__check_openai(in, err, err_len);
}

/* The prompt's token ids into a malloc'd *ids_p (*n_p of them). Returns PD_OK, PD_ERR_INVALID
 * with err set, or PD_ERR_NOMEM. */
static pd_status_t router__prompt(const router_t *r, const router_request_t *in, int32_t **ids_p,
                                  size_t *n_p, char *err, size_t err_len)
{
    const hf_config_t *m = &r->model;
    pd_status_t st;
    size_t bad;

    if (in->n_token_ids > 0) {
        if (in->n_token_ids > (size_t)m->max_position_embeddings) {
            *ids_p = NULL;
            *n_p = in->n_token_ids; /* too long: the caller names the limit */
            return PD_OK;
        }
        int32_t *ids = malloc(in->n_token_ids * sizeof *ids);
        if (!ids) {
            snprintf(err, err_len, "out of memory for the prompt");
            return PD_ERR_NOMEM;
        }
        for (size_t i = 0; i < in->n_token_ids; i++) {
            if (in->token_ids[i] < 0 || in->token_ids[i] >= m->vocab_size) {
                snprintf(err, err_len, "token_ids[%zu] = %d is outside the vocabulary (0..%d)", i,
                         in->token_ids[i], m->vocab_size - 1);
                free(ids);
                return PD_ERR_INVALID;
            }
            ids[i] = in->token_ids[i];
        }
        *ids_p = ids;
        *n_p = in->n_token_ids;
        return PD_OK;
    }
    if (!tokenizer_utf8_valid(in->text, in->text_len, &bad)) {
        snprintf(err, err_len, "text is not valid UTF-8 (byte %zu)", bad);
        return PD_ERR_INVALID;
    }
    if ((st = tokenizer_encode(r->tok, in->text, in->text_len, true, ids_p, n_p)) != PD_OK) {
        snprintf(err, err_len, "text could not be tokenized: %s", pd_status_str(st));
        return st == PD_ERR_NOMEM ? st : PD_ERR_INVALID;
    }
    return PD_OK;
}

/* Copies the stop strings into q. Returns PD_OK or PD_ERR_NOMEM. */
static pd_status_t rreq_copy_stop(router_req_t *q, const router_request_t *in)
{
    if (!in->n_stop)
        return PD_OK;
    if (!(q->stop = calloc(in->n_stop, sizeof *q->stop)))
        return PD_ERR_NOMEM;
    for (size_t i = 0; i < in->n_stop; i++) {
        if (!in->stop[i] || !in->stop[i][0])
            continue;
        if (!(q->stop[q->n_stop] = strdup(in->stop[i])))
            return PD_ERR_NOMEM;
        size_t l = strlen(in->stop[i]);
        if (l > q->max_stop)
            q->max_stop = l;
        q->n_stop++;
    }
    return PD_OK;
}

/* Sets q->request_id: the client's (unique among running requests) or a fresh req-N. Returns
 * PD_OK or PD_ERR_EXISTS with err set. */
static pd_status_t rreq_name(router_t *r, router_req_t *q, const char *given, char *err,
                             size_t err_len)
{
    if (given && given[0]) {
        if (router_request_find(r, given)) {
            snprintf(err, err_len, "request_id %s is already running", given);
            return PD_ERR_EXISTS;
        }
        snprintf(q->request_id, sizeof q->request_id, "%s", given);
        return PD_OK;
    }
    do /* a client may have taken req-N for itself */
        snprintf(q->request_id, sizeof q->request_id, "req-%llu", (unsigned long long)++r->next_id);
    while (router_request_find(r, q->request_id));
    return PD_OK;
}

/* Sample index of leader q's request: a copy of q waiting for q's prefill. NULL: no memory. */
static router_req_t *rreq_clone(const router_req_t *q, const router_request_t *in, int index)
{
    router_req_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->r = q->r;
    memcpy(c->request_id, q->request_id, sizeof c->request_id);
    c->sink = q->sink;
    c->sink_arg = q->sink_arg;
    c->cap = q->cap;
    c->n_prompt = c->n_tokens = q->n_prompt;
    c->max_tokens = q->max_tokens;
    c->temperature = q->temperature;
    c->top_p = q->top_p;
    c->top_k = q->top_k;
    c->seed = q->seed; /* the nodes derive sample index's seed from it */
    c->ignore_eos = q->ignore_eos;
    c->start_ms = q->start_ms;
    c->deadline_ms = q->deadline_ms;
    c->index = index;
    c->waiting = 1;
    c->n_prefill_samples = 1;
    if (!(c->tokens = malloc((size_t)c->cap * sizeof *c->tokens)) ||
        rreq_copy_stop(c, in) != PD_OK || rreq_copy_openai(c, in) != PD_OK ||
        tokenizer_stream_create(c->r->tok, true, &c->detok) != PD_OK) {
        rreq_free_orphan(c);
        return NULL;
    }
    memcpy(c->tokens, q->tokens, (size_t)q->n_prompt * sizeof *c->tokens);
    return c;
}

/* Makes leader q the first of n samples (its group, n - 1 waiting copies). PD_OK or PD_ERR_NOMEM
 * (q unchanged). */
static pd_status_t rreq_make_samples(router_req_t *q, const router_request_t *in, int n)
{
    rgroup_t *g = calloc(1, sizeof *g + (size_t)n * sizeof g->child[0]);
    if (!g)
        return PD_ERR_NOMEM;
    g->n = n;
    g->child[0] = q;
    for (int i = 1; i < n; i++) {
        if (!(g->child[i] = rreq_clone(q, in, i))) {
            while (--i > 0)
                rreq_free_orphan(g->child[i]);
            free(g);
            return PD_ERR_NOMEM;
        }
    }
    for (int i = 0; i < n; i++)
        g->child[i]->group = g;
    g->live = n;
    q->n_prefill_samples = n;
    return PD_OK;
}

static pd_status_t router__request_start(router_t *r, const router_request_t *in,
                                         const router_sink_t *sink, void *sink_arg,
                                         router_req_t **q_p, char *err, size_t err_len)
{
    const int64_t ctx = r->model.max_position_embeddings;
    int32_t *ids = NULL;
    size_t n = 0;
    int64_t max_tokens = in->max_tokens, timeout;
    pd_status_t st;
    router_req_t *q;

    if (r->stopping || r->draining) {
        snprintf(err, err_len, "router %s", r->stopping ? "shutting down" : "draining");
        return PD_ERR_UNAVAILABLE;
    }
    if (in->timeout_ms < 0) {
        snprintf(err, err_len, "the deadline passed before the request started");
        return PD_ERR_DEADLINE;
    }
    if ((st = router__check_request(in, err, err_len)) != PD_OK)
        return st;
    if ((st = router__prompt(r, in, &ids, &n, err, err_len)) != PD_OK)
        return st;
    if ((int64_t)n + 1 > ctx) {
        snprintf(err, err_len,
                 "prompt of %zu tokens is too long: the context holds %lld tokens, so prompts may "
                 "have at most %lld",
                 n, (long long)ctx, (long long)ctx - 1);
        free(ids);
        return PD_ERR_INVALID;
    }
    if (in->max_tokens_default && max_tokens > ctx - (int64_t)n)
        max_tokens = ctx - (int64_t)n;
    if (max_tokens > ctx - (int64_t)n) {
        snprintf(err, err_len,
                 "max_tokens %lld: prompt %zu + max_tokens exceeds the context of %lld tokens "
                 "(max_tokens may be at most %lld here)",
                 (long long)max_tokens, n, (long long)ctx, (long long)(ctx - (int64_t)n));
        free(ids);
        return PD_ERR_INVALID;
    }
    if ((st = router__check_ids(r, in, err, err_len)) != PD_OK) {
        free(ids);
        return st;
    }
    const int n_samples = in->n > 1 ? (int)in->n : 1;
    if (r->n_reqs + n_samples > r->cfg->router.max_queue) {
        snprintf(err, err_len, "router is at its limit of %d requests", r->cfg->router.max_queue);
        free(ids);
        return PD_ERR_RESOURCE;
    }
    q = calloc(1, sizeof *q);
    if (!q) {
        free(ids);
        snprintf(err, err_len, "out of memory for the request");
        return PD_ERR_NOMEM;
    }
    q->r = r;
    if ((st = rreq_name(r, q, in->request_id, err, err_len)) != PD_OK) {
        free(ids);
        free(q);
        return st;
    }
    /* n + max_tokens <= ctx: every token the request can hold, and one spare */
    q->cap = (int)n + (int)max_tokens + 1;
    int32_t *tokens = realloc(ids, (size_t)q->cap * sizeof *tokens);
    if (!tokens) {
        snprintf(err, err_len, "out of memory for %d tokens", q->cap);
        free(ids);
        free(q);
        return PD_ERR_NOMEM;
    }
    q->tokens = tokens;
    q->n_prompt = q->n_tokens = (int)n;
    q->max_tokens = (int)max_tokens;
    q->temperature = in->temperature;
    q->top_p = in->top_p > 0 ? in->top_p : 1.0f;
    q->top_k = in->top_k < r->model.vocab_size ? (int)in->top_k : 0; /* all tokens: off */
    q->seed = in->seed;
    if (q->seed == 0 && in->temperature > 0.0f) {
        /* no seed: a fresh one per request (sampled text differs between requests, as with
         * vLLM / SGLang); the seed is not needed for greedy decoding */
        uint64_t fresh = 0;
        while (fresh == 0 && getrandom(&fresh, sizeof fresh, 0) != (ssize_t)sizeof fresh)
            fresh = (uint64_t)pd_clock_ms() * 6364136223846793005ull + (uint64_t)r->n_reqs;
        q->seed = fresh;
    }
    q->ignore_eos = in->ignore_eos;
    if (rreq_copy_stop(q, in) != PD_OK ||
        tokenizer_stream_create(r->tok, true, &q->detok) != PD_OK ||
        rreq_copy_openai(q, in) != PD_OK) {
        rreq_free_orphan(q);
        snprintf(err, err_len, "out of memory for the request");
        return PD_ERR_NOMEM;
    }
    q->sink = sink;
    q->sink_arg = sink_arg;
    q->start_ms = pd_clock_now_ms(&q->r->clock);
    timeout = in->timeout_ms > 0 ? in->timeout_ms : r->cfg->router.request_timeout_ms;
    if (timeout > ROUTER_TIMEOUT_MAX_MS)
        timeout = ROUTER_TIMEOUT_MAX_MS;
    q->deadline_ms = q->start_ms + timeout;
    q->n_prefill_samples = 1;
    if (n_samples > 1 && rreq_make_samples(q, in, n_samples) != PD_OK) {
        rreq_free_orphan(q);
        snprintf(err, err_len, "out of memory for %d samples", n_samples);
        return PD_ERR_NOMEM;
    }
    for (int i = n_samples - 1; i >= 0; i--) {
        router_req_t *c = q->group ? q->group->child[i] : q;
        c->next = r->reqs;
        if (r->reqs)
            r->reqs->prev = c;
        r->reqs = c;
        r->n_reqs++;
    }
    *q_p = q;
    /* start from the loop, never inside this call: the sink may not be ready for a finish yet */
    uv_timer_init(r->loop, &q->timer);
    q->timer.data = q;
    q->timer_open = 1;
    q->timer_active = 1;
    uv_timer_start(&q->timer, rreq_retry_timer, 0, 0);
    return PD_OK;
}

pd_status_t router_request_start(router_t *r, const router_request_t *in, const router_sink_t *sink,
                                 void *sink_arg, router_req_t **q_p, char *err, size_t err_len)
{
    pd_status_t st = router__request_start(r, in, sink, sink_arg, q_p, err, err_len);
    if (st != PD_OK) /* refused before it started (bad input, full, draining): counted too */
        metrics_counter_inc(r->cnt.rejected);
    return st;
}

static void rreq_cancel(router_req_t *q);

void router_request_cancel(router_req_t *q)
{
    rgroup_t *g = q->group;
    if (!g) {
        rreq_cancel(q);
        return;
    }
    g->live++; /* samples are freed as they are cancelled */
    for (int i = 0; i < g->n; i++)
        if (g->child[i])
            rreq_cancel(g->child[i]);
    rgroup_unref(g);
}

int router_request_index(const router_req_t *q)
{
    return q->index;
}

const int32_t *router_request_prompt(const router_req_t *q, int *n_p, const router_logprob_t **lp_p)
{
    *n_p = q->n_prompt;
    *lp_p = q->prompt_lp;
    return q->tokens;
}

size_t router_token_text(const router_t *r, int32_t id, char *buf, size_t cap)
{
    char *text = NULL;
    size_t len = 0, out = 0, bad;
    if (cap == 0)
        return 0;
    buf[0] = 0;
    if (tokenizer_decode(r->tok, &id, 1, false, &text, &len) != PD_OK)
        return 0;
    if (tokenizer_utf8_valid(text, len, &bad) && memchr(text, 0, len) == NULL) {
        out = len < cap - 1 ? len : cap - 1;
        while (out > 0 && out < len && ((unsigned char)text[out] & 0xc0) == 0x80)
            out--; /* cut at a character boundary */
        memcpy(buf, text, out);
    } else {
        out = (size_t)snprintf(buf, cap, "bytes:");
        for (size_t i = 0; i < len && out + 5 < cap; i++)
            out += (size_t)snprintf(buf + out, cap - out, "\\x%02x", (unsigned char)text[i]);
    }
    buf[out] = 0;
    free(text);
    return out;
}

static void rreq_cancel(router_req_t *q)
{
    if (q->finished)
        return;
    q->sink = NULL; /* the client is gone: nothing more to send */
    q->finished = 1;
    router__observe(q->r, q, PD_ERR_CANCELLED);
    router__observe_reason(q->r, "cancelled");
    /* a decode stream: its pages are freed there; a prefill (the reservation is held): the
     * prefill node stops at its next chunk and tells the decode node its writer is done, the
     * reservation is released when the call ends (rreq_maybe_free) */
    if (q->ccall && (q->decoding || q->resv))
        pd_grpc_client_call_cancel(q->ccall);
    rreq_maybe_free(q);
}

router_req_t *router_request_find(router_t *r, const char *request_id)
{
    for (router_req_t *q = r->reqs; q; q = q->next)
        if (strcmp(q->request_id, request_id) == 0 && !q->finished)
            return q;
    return NULL;
}

const char *router_request_id(const router_req_t *q)
{
    return q->request_id;
}

void router_request_usage(const router_req_t *q, int *prompt_tokens_p, int *completion_tokens_p)
{
    *prompt_tokens_p = q->n_prompt;
    *completion_tokens_p = q->n_generated;
}

/* ==== what the front ends serve ==== */

int router_serving(const router_t *r)
{
    return r->serving;
}

void router_drain(router_t *r)
{
    if (r->draining)
        return;
    r->draining = 1;
    pd_log_info("router: draining: no new requests; %d running", r->n_reqs);
    router__update_serving(r); /* NOT_SERVING: load balancers stop sending */
}

int router_busy(const router_t *r)
{
    return r->n_reqs;
}

void router_set_serving_cb(router_t *r, void (*fn)(void *arg, int serving), void *arg)
{
    r->serving_cb = fn;
    r->serving_arg = arg;
}

metrics_t *router_metrics(router_t *r)
{
    for (int i = 0; i < r->n_nodes; i++) {
        const rnode_t *n = &r->nodes[i];
        const char *labels[] = {"node", n->node->name, "role",
                                cluster_config_role_str(n->node->role), NULL};
        metrics_gauge_t *g;
        if (metrics_gauge_register(r->metrics, "pdserve_node_up", "node health (1 serving)", labels,
                                   &g) == PD_OK)
            metrics_gauge_set(g, n->healthy);
        if (metrics_gauge_register(r->metrics, "pdserve_node_kv_pages_used",
                                   "kv pages in use on the node", labels, &g) == PD_OK)
            metrics_gauge_set(g, n->pages_used);
        if (metrics_gauge_register(r->metrics, "pdserve_node_kv_pages_capacity",
                                   "kv pages of the node", labels, &g) == PD_OK)
            metrics_gauge_set(g, n->pages_total);
        metrics_counter_put_total(r->metrics, "pdserve_node_integrity_failures_total",
                                  "sequences failed by the kv integrity checks on the node (tags, "
                                  "checksums)",
                                  labels, n->integrity_failures);
    }
    metrics_gauge_t *active;
    if (metrics_gauge_register(r->metrics, "pdserve_router_requests_active", "requests in flight",
                               NULL, &active) == PD_OK)
        metrics_gauge_set(active, r->n_reqs);
    int waiting = 0; /* not yet at a node: reserving, or waiting to retry */
    for (const router_req_t *q = r->reqs; q; q = q->next)
        waiting += !q->finished && !q->decoding && !q->ccall;
    metrics_gauge_t *queue;
    if (metrics_gauge_register(r->metrics, "pdserve_router_requests_waiting",
                               "requests in flight waiting for a node (pages or a retry)", NULL,
                               &queue) == PD_OK)
        metrics_gauge_set(queue, waiting);
    for (int i = 0; i < ROUTER_MAX_SOURCES; i++)
        if (r->sources[i].fn)
            r->sources[i].fn(r->sources[i].arg, r->metrics);
    return r->metrics;
}

pd_status_t router_add_metrics_source(router_t *r, void (*fn)(void *arg, metrics_t *m), void *arg)
{
    for (int i = 0; i < ROUTER_MAX_SOURCES; i++) {
        if (!r->sources[i].fn) {
            r->sources[i].fn = fn;
            r->sources[i].arg = arg;
            return PD_OK;
        }
    }
    return PD_ERR_RESOURCE;
}

void router_remove_metrics_source(router_t *r, void (*fn)(void *arg, metrics_t *m), void *arg)
{
    for (int i = 0; i < ROUTER_MAX_SOURCES; i++)
        if (r->sources[i].fn == fn && r->sources[i].arg == arg)
            r->sources[i].fn = NULL;
}

void router_metrics_listener(metrics_t *m, const char *name, uint64_t connections,
                             uint64_t max_connections, uint64_t rejected, uint64_t accept_errors,
                             uint64_t idle_closed, uint64_t timed_out, uint64_t flood_closed)
{
    const char *labels[] = {"listener", name, NULL};
    metrics_listener_t l = {connections, max_connections, rejected,    accept_errors,
                            idle_closed, timed_out,       flood_closed};
    metrics_listener_put(m, labels, &l);
}

const cluster_config_t *router_cluster_config(const router_t *r)
{
    return r->cfg;
}

const char *router_model_name(const router_t *r)
{
    return r->model_name;
}

const hf_config_t *router_model(const router_t *r)
{
    return &r->model;
}

const tokenizer_t *router_tokenizer(const router_t *r)
{
    return r->tok;
}

const char *router_chat_template(const router_t *r, const char **bos_p, const char **eos_p)
{
    *bos_p = r->bos_token;
    *eos_p = r->eos_token;
    return r->chat_template;
}

int router_node_count(const router_t *r)
{
    return r->n_nodes;
}

void router_node_info(const router_t *r, int i, router_node_info_t *info_p)
{
    PD_ASSERT(i >= 0 && i < r->n_nodes);
    info_p->node = r->nodes[i].node;
    info_p->serving = r->nodes[i].healthy;
    info_p->pages_used = r->nodes[i].pages_used;
    info_p->pages_total = r->nodes[i].pages_total;
    info_p->active = r->nodes[i].active;
    info_p->running = router__node_running(r, &r->nodes[i]);
    info_p->draining = r->nodes[i].draining;
    info_p->left = r->nodes[i].left;
    info_p->joined = r->nodes[i].owned != NULL;
    info_p->tp = r->nodes[i].tp ? (int)r->nodes[i].tp : r->nodes[i].node->tp;
}

/* ==== membership and maintenance ==== */

static rnode_t *router__node_find(router_t *r, const char *name)
{
    for (int i = 0; i < r->n_nodes; i++)
        if (strcmp(r->nodes[i].node->name, name) == 0)
            return &r->nodes[i];
    return NULL;
}

pd_status_t router_node_register(router_t *r, const cluster_node_t *node, char *err, size_t err_len)
{
    rnode_t *n = router__node_find(r, node->name);
    cluster_node_t *copy;
    pd_grpc_client_t *client;

    if (r->stopping) {
        snprintf(err, err_len, "router shutting down");
        return PD_ERR_UNAVAILABLE;
    }
    if (n && n->node->role != node->role) {
        snprintf(err, err_len, "node %s is a %s node", node->name,
                 cluster_config_role_str(n->node->role));
        return PD_ERR_EXISTS;
    }
    if (n && strcmp(n->node->host, node->host) == 0 && n->node->port == node->port) {
        if (n->left)
            pd_log_info("node %s joins again at %s:%d", node->name, node->host, node->port);
        n->left = 0; /* known: the health poll decides when it takes work */
        return PD_OK;
    }
    if (n && (!n->left || router__node_running(r, n) || n->poll_call)) {
        snprintf(err, err_len, "node %s is at %s:%d", node->name, n->node->host, n->node->port);
        return PD_ERR_EXISTS;
    }
    if (!n && r->n_nodes == ROUTER_MAX_NODES) {
        snprintf(err, err_len, "the router has %d nodes", ROUTER_MAX_NODES);
        return PD_ERR_RESOURCE;
    }
    if (!(copy = malloc(sizeof *copy)))
        return PD_ERR_NOMEM;
    *copy = *node;
    if (pd_grpc_client_create(r->loop, copy->host, copy->port, &client) != PD_OK) {
        free(copy);
        return PD_ERR_NOMEM;
    }
    if (n) { /* a node that left comes back at a new address */
        pd_grpc_client_destroy(n->client);
        free(n->owned);
    } else {
        n = &r->nodes[r->n_nodes++];
        memset(n, 0, sizeof *n);
        n->router = r;
    }
    n->client = client;
    n->owned = copy;
    n->node = copy;
    n->healthy = 0; /* until its health check passes */
    n->left = 0;
    n->poll_failures = 0;
    pd_log_info("node %s (%s) joins at %s:%d; in use once its health check passes", copy->name,
                cluster_config_role_str(copy->role), copy->host, copy->port);
    return PD_OK;
}

pd_status_t router_node_deregister(router_t *r, const char *name)
{
    rnode_t *n = router__node_find(r, name);
    if (!n)
        return PD_ERR_NOT_FOUND;
    if (!n->left)
        pd_log_info("node %s leaves (%d request(s) still on it finish)", name,
                    router__node_running(r, n));
    n->left = 1;
    n->healthy = 0;
    router__update_serving(r);
    return PD_OK;
}

pd_status_t router_node_drain(router_t *r, const char *name, int drain)
{
    rnode_t *n = router__node_find(r, name);
    if (!n)
        return PD_ERR_NOT_FOUND;
    if (n->draining != !!drain)
        pd_log_info("node %s: %s (%d request(s) on it)", name, drain ? "draining" : "undrained",
                    router__node_running(r, n));
    n->draining = !!drain;
    n->drain_known = 1;
    router__update_serving(r);
    return PD_OK;
}

/* ==== lifetime ==== */

static void router__load_chat_template(router_t *r)
{
    char path[4200];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", r->cfg->model);
    json_t *tc = json_load_file(path, 0, &jerr);
    const char *t = json_string_value(json_object_get(tc, "chat_template"));
    const char *bos = json_string_value(json_object_get(tc, "bos_token"));
    const char *eos = json_string_value(json_object_get(tc, "eos_token"));
    if (t)
        r->chat_template = strdup(t);
    snprintf(r->bos_token, sizeof r->bos_token, "%s", bos ? bos : "");
    snprintf(r->eos_token, sizeof r->eos_token, "%s", eos ? eos : "");
    json_decref(tc);
}

static pd_status_t router__metrics_create(router_t *r)
{
    static const double ttft_b[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static const double e2e_b[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
    static const double itl_b[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04,
                                   0.06,  0.08,   0.1,   0.25, 0.5,  1};
    static const char *const ok_l[] = {"outcome", "ok", NULL};
    static const char *const bad_l[] = {"outcome", "error", NULL};
    static const char *const cancel_l[] = {"outcome", "cancelled", NULL};
    static const char *const rej_l[] = {"outcome", "rejected", NULL};
    router_counters_t *c = &r->cnt;
    pd_status_t st;

    if ((st = metrics_create(&r->metrics)) != PD_OK)
        return st;
    if ((st = metrics_counter_register(r->metrics, "pdserve_router_requests_total",
                                       "finished requests", ok_l, &c->ok)) != PD_OK ||
        (st = metrics_counter_register(r->metrics, "pdserve_router_requests_total",
                                       "finished requests", bad_l, &c->failed)) != PD_OK ||
        (st = metrics_counter_register(r->metrics, "pdserve_router_requests_total",
                                       "finished requests", cancel_l, &c->cancelled)) != PD_OK ||
        (st = metrics_counter_register(r->metrics, "pdserve_router_requests_total",
                                       "finished requests", rej_l, &c->rejected)) != PD_OK ||
        (st = metrics_counter_register(r->metrics, "pdserve_router_generated_tokens_total",
                                       "tokens generated", NULL, &c->tokens)) != PD_OK ||
        (st = metrics_counter_register(r->metrics, "pdserve_router_preemptions_total",
                                       "requests re-prefilled after a decode node ran out of pages",
                                       NULL, &c->preemptions)) != PD_OK ||
        (st = metrics_histogram_register(r->metrics, "pdserve_router_ttft_seconds",
                                         "time to first token", ttft_b, 12, NULL, &c->ttft)) !=
            PD_OK ||
        (st = metrics_histogram_register(r->metrics, "pdserve_router_request_seconds",
                                         "request duration", e2e_b, 12, NULL, &c->e2e)) != PD_OK ||
        (st = metrics_histogram_register(r->metrics, "pdserve_router_itl_seconds",
                                         "inter-token latency (time between two tokens of a "
                                         "request, as the router receives them)",
                                         itl_b, 12, NULL, &c->itl)) != PD_OK ||
        (st = metrics_counter_register(r->metrics, "pdserve_router_prompt_tokens_total",
                                       "prompt tokens of finished requests", NULL,
                                       &c->prompt_tokens)) != PD_OK)
        return st;
    return PD_OK;
}

pd_status_t router_create(uv_loop_t *loop, const cluster_config_t *cfg, router_t **r_p)
{
    router_t *r = calloc(1, sizeof *r);
    char path[4200];
    pd_status_t st;

    if (!r)
        return PD_ERR_NOMEM;
    r->loop = loop;
    r->cfg = cfg;
    snprintf(path, sizeof path, "%s/config.json", cfg->model);
    if ((st = hf_config_load(path, &r->model)) != PD_OK)
        goto err;
    if ((st = tokenizer_load_dir(cfg->model, &r->tok)) != PD_OK) /* tokenizer.json or tiktoken */
        goto err;
    router__load_chat_template(r);
    const char *slash = strrchr(cfg->model, '/');
    snprintf(r->model_name, sizeof r->model_name, "%.255s",
             slash && slash[1] ? slash + 1 : cfg->model);
    if ((st = router__metrics_create(r)) != PD_OK)
        goto err;
    if (cfg->transport.cluster_token_file[0]) {
        char token[256];
        if ((st = cluster_config_read_token(cfg->transport.cluster_token_file, token,
                                            sizeof token)) != PD_OK)
            goto err;
        snprintf(r->bearer, sizeof r->bearer, "Bearer %s", token);
    }
    r->n_nodes = 0;
    for (size_t i = 0; i < cfg->n_nodes; i++)
        r->n_nodes += !cfg->nodes[i].template_; /* templates: for nodes that join */
    if (r->n_nodes > ROUTER_MAX_NODES) {
        pd_log_error("%s: at most %d nodes per router", cfg->source, ROUTER_MAX_NODES);
        st = PD_ERR_UNSUPPORTED;
        goto err;
    }
    /* room for nodes that join later: requests hold pointers into the table, it never moves */
    r->nodes = calloc(ROUTER_MAX_NODES, sizeof *r->nodes);
    if (!r->nodes) {
        st = PD_ERR_NOMEM;
        goto err;
    }
    for (size_t k = 0, i = 0; k < cfg->n_nodes; k++) {
        if (cfg->nodes[k].template_)
            continue;
        r->nodes[i].router = r;
        r->nodes[i].node = &cfg->nodes[k];
        if ((st = pd_grpc_client_create(loop, cfg->nodes[k].host, cfg->nodes[k].port,
                                        &r->nodes[i].client)) != PD_OK)
            goto err;
        i++;
    }
    uv_timer_init(loop, &r->poll);
    r->poll.data = r;
    r->poll_open = 1;
    uv_timer_start(&r->poll, router__poll, 0, POLL_MS);
    *r_p = r;
    return PD_OK;
err:
    router_destroy(r);
    return st;
}

void router_set_clock(router_t *r, const pd_clock_t *clock)
{
    r->clock = *clock;
}

void router_stop(router_t *r)
{
    if (!r || r->stopping)
        return;
    r->stopping = 1;
    if (r->poll_open)
        uv_timer_stop(&r->poll);
    /* end every request; the node clients' destruction (router_destroy) runs their callbacks */
    for (router_req_t *q = r->reqs; q; q = q->next) {
        if (!q->finished)
            router_request_finish(q, NULL, PD_ERR_UNAVAILABLE, "router shutting down");
        if (q->timer_active) {
            uv_timer_stop(&q->timer);
            q->timer_active = 0;
        }
    }
}

static void router__poll_closed(uv_handle_t *h)
{
    free(h->data);
}

void router_destroy(router_t *r)
{
    if (!r)
        return;
    router_stop(r);
    for (int i = 0; r->nodes && i < r->n_nodes; i++) {
        pd_grpc_client_destroy(r->nodes[i].client);
        r->nodes[i].client = NULL;
    }
    while (r->reqs) { /* left: requests whose retry timer is closing */
        router_req_t *q = r->reqs;
        r->reqs = q->next;
        q->orphan = 1;
        if (!q->timer_open || uv_is_closing((uv_handle_t *)&q->timer)) {
            if (!q->timer_open)
                rreq_free_orphan(q);
            continue;
        }
        uv_close((uv_handle_t *)&q->timer, rreq_timer_closed);
    }
    for (int i = 0; r->nodes && i < r->n_nodes; i++)
        free(r->nodes[i].owned);
    free(r->nodes);
    metrics_destroy(r->metrics);
    free(r->chat_template);
    tokenizer_destroy(r->tok);
    if (r->poll_open) /* r holds the timer: freed once the loop closed it */
        uv_close((uv_handle_t *)&r->poll, router__poll_closed);
    else
        free(r);
}
