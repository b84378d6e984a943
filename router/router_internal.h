/* router_internal: the router's shared state, for router.c (pipeline), router_grpc.c (the
 * Inference service) and router_http.c (OpenAI HTTP API and probes). Loop thread only. */
#ifndef PD_ROUTER_INTERNAL_H
#define PD_ROUTER_INTERNAL_H

#include <stdint.h>

#include <uv.h>

#include "cluster_config.h"
#include "grpc_client.h"
#include "grpc_health.h"
#include "grpc_server.h"
#include "hf_config.h"
#include "http.h"
#include "metrics.h"
#include "pdserve.pb-c.h"
#include "router.h"
#include "tokenizer.h"

typedef struct rnode {
    struct router *router;
    const cluster_node_t *node;
    pd_grpc_client_t *client;
    pd_grpc_client_call_t *poll_call;
    int healthy;
    uint32_t pages_used, pages_total, active, reserved_est;
    uint64_t integrity_failures;
    int inflight;
} rnode_t;

typedef struct rreq rreq_t;

/* Where a request's output goes (gRPC stream, HTTP SSE or JSON). delta: new token ids and the
 * text that became final; finish: once, reason set on success or st/msg on error. */
typedef struct {
    void (*delta)(rreq_t *q, const int32_t *ids, int n, const char *text, size_t len);
    void (*finish)(rreq_t *q, const char *reason, pd_status_t st, const char *msg);
} rsink_t;

struct rreq {
    struct router *r;
    uint64_t id;
    char request_id[96];
    const rsink_t *sink;
    void *sink_arg;
    int32_t *tokens; /* prompt, then generated */
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
    rnode_t *dnode, *pnode;
    Pdserve__V1__ReserveReply *resv; /* held reservation (until Decode starts) */
    pd_grpc_client_call_t *ccall;       /* the control call in flight */
    uint64_t tried;                  /* nodes tried for the current step (bit per node) */
    int decoding, preempted, n_preemptions, finished, orphan;
    uv_timer_t timer;
    int timer_open, timer_active;
    struct rreq *next, *prev;
};

typedef struct router {
    uv_loop_t *loop;
    const cluster_config_t *cfg;
    hf_config_t model;
    char model_name[256];
    tokenizer_t *tok;
    rnode_t *nodes;
    int n_nodes, rr;
    pd_grpc_server_t *srv;
    pd_grpc_health_t *health;
    pd_http_server_t *http;
    metrics_t *metrics;
    char *chat_template; /* tokenizer_config.json chat_template, NULL if none */
    char bos_token[64], eos_token[64];
    uv_timer_t poll;
    int poll_open, stopping;
    rreq_t *reqs;
    int n_reqs;
    uint64_t next_id;
} router_t;

/* A request as the front ends hand it over. */
typedef struct {
    const char *request_id;
    const char *text;
    const int32_t *token_ids;
    size_t n_token_ids;
    int max_tokens;
    float temperature, top_p;
    int top_k;
    uint64_t seed;
    int ignore_eos;
    char *const *stop;
    size_t n_stop;
    int64_t timeout_ms; /* 0: router.request_timeout_ms */
} router_request_t;

/* Validates and starts a request. On a validation error returns PD_ERR_INVALID (or
 * PD_ERR_RESOURCE when the router is full) with a message in err; nothing is started. */
pd_status_t router_request_start(router_t *r, const router_request_t *in, const rsink_t *sink,
                                 void *sink_arg, rreq_t **q_p, char *err, size_t err_len);

/* The client went away: stop sending, free the decode pages, forget the request. */
void router_request_cancel(rreq_t *q);

/* Ends a request (see rsink_t). */
void rreq_finish(rreq_t *q, const char *reason, pd_status_t st, const char *msg);

rreq_t *router_request_find(router_t *r, const char *request_id);

void router_node_down(router_t *r, rnode_t *n, const char *why);

pd_status_t router_grpc_register(router_t *r);

/* Counts a finished request in the router's metrics (sinks call it from finish). */
void router_observe(router_t *r, const rreq_t *q, pd_status_t st);
pd_status_t router_http_start(router_t *r);
void router_http_stop(router_t *r);

#endif
