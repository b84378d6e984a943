/* router: the core of a pdserve cluster's front door, without any front end. It holds the node
 * table, polls the nodes, and drives each request through the cluster:
 *
 *   Reserve pages on a decode node (least KV usage; full -> next node, all full -> wait)
 *   -> Prefill on a prefill node (round robin / least load; a dead node -> the next one)
 *   -> first token to the client at once -> Decode stream from the decode node -> client.
 *
 * A decode node that runs out of pages evicts a sequence with `preempted`: the router re-runs
 * Reserve + Prefill with prompt + generated tokens and keeps streaming (the client sees delay).
 * Failures are explicit: a dead decode node ends its requests with UNAVAILABLE and is taken out
 * until its health check passes again; an integrity failure ends the request with DATA_LOSS; a
 * client cancel cancels the decode stream (pages freed) or releases the reservation. Nodes are
 * polled (grpc.health.v1 + Stats) every 500 ms.
 *
 * Front ends (router_grpc: pdserve.v1.Inference; router_http: the OpenAI API) are created on a
 * core and call it: they start requests with a sink that receives the output, and read what they
 * serve (model, tokenizer, serving state, nodes, metrics) from here. The core owns one metrics
 * object and counts every request that ends, whichever front end started it. It knows nothing of
 * its front ends.
 *
 * Loop thread only.
 */
#ifndef PD_ROUTER_H
#define PD_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "clock.h"
#include "cluster_config.h"
#include "hf_config.h"
#include "metrics.h"
#include "status.h"
#include "tokenizer.h"

typedef struct router router_t;
typedef struct router_req router_req_t;

/* The logprob of one token (raw log-softmax of the model's logits, computed where the token was
 * sampled) and its n_top most likely alternatives, most likely first. */
#define ROUTER_MAX_TOP_LOGPROBS 20
typedef struct {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[ROUTER_MAX_TOP_LOGPROBS];
    float top_logprobs[ROUTER_MAX_TOP_LOGPROBS];
} router_logprob_t;

/* Where a request's output goes (a gRPC stream, HTTP SSE or JSON); arg is the sink_arg given to
 * router_request_start. A request with n samples calls the sink for each sample's q
 * (router_request_index tells which). delta: new token ids and the text that became final, and
 * with logprobs asked for, lp (n entries, else NULL). finish: once per sample, reason ("stop",
 * "length", "abort") with st PD_OK, or an error st with msg; the sample is the core's again
 * afterwards (do not use q after finish returns). */
typedef struct {
    void (*delta)(router_req_t *q, void *arg, const int32_t *ids, int n, const char *text,
                  size_t len, const router_logprob_t *lp);
    void (*finish)(router_req_t *q, void *arg, const char *reason, pd_status_t st, const char *msg);
} router_sink_t;

/* A request as the front ends hand it over. Every number is checked by router_request_start in
 * 64-bit arithmetic before it is narrowed, so front ends pass what the client sent unchanged. */
#define ROUTER_REQUEST_ID_MAX 95   /* bytes of a client's request_id */
#define ROUTER_MAX_STOP 16         /* stop strings per request */
#define ROUTER_MAX_N 64            /* samples per request */
#define ROUTER_MAX_STOP_IDS 64     /* stop_token_ids per request */
#define ROUTER_MAX_LOGIT_BIAS 1024 /* logit_bias entries per request */
typedef struct {
    const char *request_id; /* NULL or "": req-N; else unique among running requests */
    const char *text;       /* prompt text of text_len bytes (may hold NUL bytes; BOS added), or */
    size_t text_len;
    const int32_t *token_ids; /* token ids, used as given */
    size_t n_token_ids;
    int64_t max_tokens;     /* >= 1, prompt + max_tokens <= the model's context */
    int max_tokens_default; /* nonzero: max_tokens is a default, cut to what fits the context */
    float temperature, top_p;
    int64_t top_k; /* >= 0; 0 and values >= the vocabulary: off */
    uint64_t seed;
    int ignore_eos;
    char *const *stop; /* at most ROUTER_MAX_STOP */
    size_t n_stop;
    int64_t timeout_ms; /* 0: router.request_timeout_ms; < 0: the deadline already passed */
    /* OpenAI / vLLM parameters (all zero: off), checked by router_request_start */
    int64_t n;                     /* samples sharing one prefill, 1..ROUTER_MAX_N; 0: 1 */
    int64_t best_of;               /* 0 or n (the best of more than n is not implemented) */
    int logprobs;                  /* each generated token's logprob ... */
    int64_t top_logprobs;          /* ... with 0..20 alternatives */
    int prompt_logprobs;           /* the prompt tokens' logprobs too (echo) */
    float presence_penalty;        /* -2..2 */
    float frequency_penalty;       /* -2..2 */
    float repetition_penalty;      /* > 0; 0: unset (1) */
    const int32_t *bias_ids;       /* logit_bias: token ids in the vocabulary ... */
    const float *bias_vals;        /* ... and biases in -100..100 */
    size_t n_bias;                 /* at most ROUTER_MAX_LOGIT_BIAS */
    int64_t min_tokens;            /* 0..max_tokens: EOS, stop ids and stop strings wait */
    const int32_t *stop_token_ids; /* tokens that end the request (at most ROUTER_MAX_STOP_IDS) */
    size_t n_stop_token_ids;
} router_request_t;

/* One node as the router sees it (from its last poll). */
typedef struct {
    const cluster_node_t *node;
    int serving;
    uint32_t pages_used, pages_total;
    uint32_t active; /* sequences running on the node (its Stats) */
    int running;     /* this router's requests on it now */
    int draining;    /* router_node_drain: takes no new work */
    int left;        /* router_node_deregister: gone (until it registers again) */
    int joined;      /* registered at run time, not from the cluster file */
    int tp;          /* tensor-parallel ranks: its Stats' (the entry's until it answers) */
} router_node_info_t;

/* Nodes of the cluster file plus those that join: at most this many. */
#define ROUTER_MAX_NODES 64

/* Loads the model's config.json, tokenizer.json and tokenizer_config.json (chat template) and
 * starts polling cfg's nodes (cfg must outlive the router). Serves nothing by itself. Returns
 * PD_OK, PD_ERR_FORMAT / PD_ERR_IO (model files), PD_ERR_UNSUPPORTED (more than 64 nodes),
 * PD_ERR_NOMEM; nothing is left behind on failure. */
pd_status_t router_create(uv_loop_t *loop, const cluster_config_t *cfg, router_t **r_p);

/* Tests: the clock the core reads request deadlines and latencies from (a fake clock the test
 * advances; default: the monotonic clock). Before the first request. */
void router_set_clock(router_t *r, const pd_clock_t *clock);

/* Stops polling and ends every request in flight with UNAVAILABLE (through its sink); new
 * requests are refused. Idempotent; router_destroy does it too. Accepts NULL. */
void router_stop(router_t *r);

/* Stops (router_stop) and frees the core; destroy its front ends first. Run the loop afterwards
 * to close its handles. Accepts NULL. */
void router_destroy(router_t *r);

/* ==== requests ==== */

/* Validates and starts a request; output goes to sink (the first call comes from the loop, never
 * from inside this one). On failure returns, with a message in err, PD_ERR_INVALID (a value out
 * of range, named in the message), PD_ERR_EXISTS (request_id names a running request),
 * PD_ERR_RESOURCE (the router is full), PD_ERR_NOMEM, PD_ERR_DEADLINE (timeout_ms < 0) or
 * PD_ERR_UNAVAILABLE (stopped); nothing is started. */
pd_status_t router_request_start(router_t *r, const router_request_t *in, const router_sink_t *sink,
                                 void *sink_arg, router_req_t **q_p, char *err, size_t err_len);

/* The client went away: no more sink calls, the decode pages are freed, the request is
 * forgotten (and counted as cancelled). With n samples, every sample of q's request that has not
 * finished is cancelled. No-op on a request that already finished. */
void router_request_cancel(router_req_t *q);

/* Which sample of its request q is (0 .. n - 1). */
int router_request_index(const router_req_t *q);

/* The prompt's token ids (*n_p of them) and, when prompt_logprobs was asked for and the prefill
 * has answered, the logprobs of prompt tokens 1 .. n - 1 (*lp_p, *n_p - 1 entries; NULL before
 * or without). Valid until q's finish returns. */
const int32_t *router_request_prompt(const router_req_t *q, int *n_p,
                                     const router_logprob_t **lp_p);

/* The text of one token as the tokenizer decodes it alone (special tokens included), as valid
 * UTF-8 in buf (cap bytes, NUL-terminated, cut at cap): a piece that is not valid UTF-8 on its own
 * (part of a multi-byte character) reads "bytes:\\xe2\\x80" as in vLLM. Returns its length. */
size_t router_token_text(const router_t *r, int32_t id, char *buf, size_t cap);

/* Ends a running request: reason with st PD_OK (text held back for stop strings goes out
 * first), or an error; the sink's finish runs once. No-op when already finished. */
void router_request_finish(router_req_t *q, const char *reason, pd_status_t st, const char *msg);

/* The running request called request_id, or NULL. */
router_req_t *router_request_find(router_t *r, const char *request_id);

/* The request's id (given or req-N). */
const char *router_request_id(const router_req_t *q);

/* Prompt tokens and tokens generated so far. */
void router_request_usage(const router_req_t *q, int *prompt_tokens_p, int *completion_tokens_p);

/* ==== what the front ends serve ==== */

/* Nonzero while at least one prefill and one decode node are serving. */
int router_serving(const router_t *r);

/* SIGTERM: serving turns 0 (health NOT_SERVING, /ready 503) and new requests are refused with
 * UNAVAILABLE ("router draining"); requests already running go on to their end. */
void router_drain(router_t *r);

/* Requests in flight (0 once a drain is complete). */
int router_busy(const router_t *r);

/* Sets fn(arg, serving), run each time router_serving changes (one watcher; NULL clears). */
void router_set_serving_cb(router_t *r, void (*fn)(void *arg, int serving), void *arg);

/* The router's metrics (request counters and histograms, node gauges refreshed now from the last
 * poll, requests in flight), for rendering; owned by the core. */
metrics_t *router_metrics(router_t *r);

/* A front end's own counters (its listener's connections, rejections, timeouts): fn(arg, m)
 * refreshes them in m just before each render of router_metrics. At most ROUTER_MAX_SOURCES;
 * PD_ERR_RESOURCE past that. remove accepts a source never added. Loop thread. */
#define ROUTER_MAX_SOURCES 4
pd_status_t router_add_metrics_source(router_t *r, void (*fn)(void *arg, metrics_t *m), void *arg);
void router_remove_metrics_source(router_t *r, void (*fn)(void *arg, metrics_t *m), void *arg);

/* Helpers for sources: the listener gauges and counters of one front end (label listener=name),
 * from cumulative numbers (counters move by the difference since the last render). */
void router_metrics_listener(metrics_t *m, const char *name, uint64_t connections,
                             uint64_t max_connections, uint64_t rejected, uint64_t accept_errors,
                             uint64_t idle_closed, uint64_t timed_out, uint64_t flood_closed);

/* The cluster config the router was created with. */
const cluster_config_t *router_cluster_config(const router_t *r);

/* The model's name (the model folder's last component), config and tokenizer. */
const char *router_model_name(const router_t *r);
const hf_config_t *router_model(const router_t *r);
const tokenizer_t *router_tokenizer(const router_t *r);

/* The model's chat template (NULL when it has none) and its BOS / EOS token text ("" if none). */
const char *router_chat_template(const router_t *r, const char **bos_p, const char **eos_p);

/* Nodes, in config order, then those that joined in the order they came. */
int router_node_count(const router_t *r);
void router_node_info(const router_t *r, int i, router_node_info_t *info_p);

/* ==== membership and maintenance (router_control) ==== */

/* A node joins (or says it is still there): node is copied. A new node takes work once its health
 * check passes (the poll); a known one (same name, address and role) is kept as it is, or comes
 * back after a deregister. PD_ERR_EXISTS (the name is taken by another role or address, message in
 * err), PD_ERR_RESOURCE (ROUTER_MAX_NODES), PD_ERR_UNAVAILABLE (stopping), PD_ERR_NOMEM; nothing
 * changes on failure. */
pd_status_t router_node_register(router_t *r, const cluster_node_t *node, char *err,
                                 size_t err_len);

/* The node leaves: no new work, no polls; its running requests go on to their end. A later
 * register brings it back. PD_ERR_NOT_FOUND for an unknown name. */
pd_status_t router_node_deregister(router_t *r, const char *name);

/* drain 1: no new work goes to the node, its running requests finish (router_node_info: running
 * reaches 0, and active once the node's Stats say so); drain 0 (undrain): it takes work again once
 * serving. The flag outlives a restart of the node. PD_ERR_NOT_FOUND for an unknown name. */
pd_status_t router_node_drain(router_t *r, const char *name, int drain);

#endif
