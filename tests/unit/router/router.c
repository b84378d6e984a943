/* Tests router/router.c (the core) with its gRPC front end (router_grpc.c) and no HTTP front end,
 * against in-process fake prefill and decode nodes (pd_grpc_server) on ephemeral ports, with the
 * tiny-llama tokenizer and config (PD_MODELS_DIR):
 * - the router's grpc.health.v1 status follows the core's serving state (both nodes up, then the
 *   decode node not serving);
 * - a gRPC Generate streams prefill's first token plus the decode node's tokens, and the core
 *   counts it in pdserve_router_requests_total{outcome="ok"}, with HTTP off (before the core
 *   owned the metrics they lived in the HTTP front end: nothing was counted without it);
 * - a client that cancels a Generate: the decode stream is cancelled on the node and the core
 *   counts the request as outcome="cancelled";
 * - a rejected request (max_tokens 0) is not counted; requests_active returns to 0;
 * - values from clients are range-checked before any narrowing (issue 13), over gRPC and the HTTP
 *   front end: max_tokens past the context (2^31 - 1 used to abort the router, 2^32 + 1 became
 *   1, 2^31 became negative), token ids past 32 bits, top_k, n, request_id length;
 * - values from nodes: a first token / decode token outside the vocabulary and a reservation too
 *   small for the prompt fail that request with INTERNAL;
 * - a NUL byte in a text prompt (gRPC text, HTTP "\u0000") is tokenized, not a cut prompt;
 * - a request_id that names a running request is refused with ALREADY_EXISTS;
 * - an allocation failure on a request path fails that request (RESOURCE_EXHAUSTED / 503) and the
 *   router keeps serving (malloc, calloc and realloc are wrapped at link time: --wrap);
 * - with a fake clock (router_set_clock; no sleeps): a prefill node that missed its reservation's
 *   lease (RESOURCE_EXHAUSTED) makes the router release that reservation and reserve again, and
 *   the request completes; the same answer after the request's deadline fails it without a retry;
 *   Reserve or Prefill answering DEADLINE_EXCEEDED before the clock says the deadline passed ends
 *   the request with DEADLINE_EXCEEDED and takes no node out of service; a request waiting for
 *   KV pages (Reserve: no free kv pages) ends with DEADLINE_EXCEEDED once its deadline passes on
 *   the clock.
 * Ends with every handle closed (uv_loop_close() == 0; run under -Dsanitize=true for leaks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "clock.h"
#include "cluster_config.h"
#include "grpc_client.h"
#include "grpc_health.h"
#include "grpc_server.h"
#include "health.pb-c.h"
#include "pdserve.pb-c.h"
#include "router.h"
#include "router_grpc.h"
#include "router_http.h"
#include "tokenizer.h"

static uv_loop_t loop;

/* ==== allocations that fail on demand (linked with --wrap=malloc,calloc,realloc) ==== */

static size_t fail_size; /* the next allocation of exactly this many bytes fails (0: none) */
static int n_failed;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);

static int fail_now(size_t n)
{
    if (fail_size == 0 || n != fail_size)
        return 0;
    fail_size = 0;
    n_failed++;
    return 1;
}

void *__wrap_malloc(size_t n)
{
    return fail_now(n) ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return fail_now(n * size) ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    return fail_now(n) ? NULL : __real_realloc(p, n);
}

/* ==== fake nodes ==== */

typedef struct {
    pd_grpc_server_t *srv;
    pd_grpc_health_t *health;
    int port;
} fake_node_t;

static fake_node_t prefill, decode;
static pd_grpc_call_t *held_decode; /* a Decode call kept open ("hold" requests) */
static int decode_cancels, releases;
static int32_t nul_id = -1;     /* the token of byte 0, streamed to "nulout" requests */
static int32_t prefill_ids[64]; /* the last Prefill's prompt (its first 64 ids) */
static size_t n_prefill_ids;
static int prefill_top_k, n_prefills, n_reserves;

/* The router's clock (router_set_clock): the test moves it. */
static int64_t fake_now = 5000000;

static int64_t fake_clock(void *arg)
{
    (void)arg;
    return fake_now;
}

static void fake_stats(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    Pdserve__V1__NodeStats s = PDSERVE__V1__NODE_STATS__INIT;
    (void)req;
    (void)user;
    s.pages_total = 64;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &s.base), NULL);
}

/* Answers first token 100 ("badtok" requests: 5000, outside the vocabulary of 2048). */
static void fake_prefill(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    const Pdserve__V1__PrefillRequest *req = (const Pdserve__V1__PrefillRequest *)msg;
    Pdserve__V1__PrefillReply rep = PDSERVE__V1__PREFILL_REPLY__INIT;
    (void)user;
    n_prefills++;
    if ((strcmp(req->request_id, "leasemiss") == 0 && n_prefills == 1) ||
        strcmp(req->request_id, "leaselate") == 0) {
        if (strcmp(req->request_id, "leaselate") == 0)
            fake_now += 3600 * 1000; /* the request's deadline passed meanwhile */
        pd_grpc_call_finish_status(call, PD_ERR_RESOURCE,
                                   "prefill0: kv lease ended before the pages were written");
        return;
    }
    if (strcmp(req->request_id, "prelate") == 0) {
        pd_grpc_call_finish_status(call, PD_ERR_DEADLINE, "deadline exceeded");
        return;
    }
    n_prefill_ids = req->n_token_ids;
    memcpy(prefill_ids, req->token_ids,
           (req->n_token_ids < 64 ? req->n_token_ids : 64) * sizeof *prefill_ids);
    prefill_top_k = req->sampling ? req->sampling->top_k : -1;
    rep.first_token = strcmp(req->request_id, "badtok") == 0 ? 5000 : 100;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
}

/* Reserves the prompt's pages (16 tokens each); a "badresv" request gets one page too few. */
static void fake_reserve(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    const Pdserve__V1__ReserveRequest *req = (const Pdserve__V1__ReserveRequest *)msg;
    Pdserve__V1__ReserveReply rep = PDSERVE__V1__RESERVE_REPLY__INIT;
    Pdserve__V1__KvDestination dest = PDSERVE__V1__KV_DESTINATION__INIT;
    Pdserve__V1__KvLayout layout = PDSERVE__V1__KV_LAYOUT__INIT;
    Pdserve__V1__PageRef refs[128], *prefs[128];
    size_t n = (req->n_tokens + 15) / 16;
    (void)user;
    assert_true(n <= 128);
    n_reserves++;
    if (strcmp(req->request_id, "resvlate") == 0) { /* the request's deadline, seen early */
        pd_grpc_call_finish_status(call, PD_ERR_DEADLINE, "deadline exceeded");
        return;
    }
    if (strcmp(req->request_id, "nopages") == 0) {
        pd_grpc_call_finish_status(call, PD_NO_PAGES, "decode0: no free kv pages");
        return;
    }
    if (strcmp(req->request_id, "badresv") == 0)
        n--;
    for (size_t i = 0; i < n; i++) {
        pdserve__v1__page_ref__init(&refs[i]);
        refs[i].page = (int32_t)i;
        refs[i].tag = 1;
        prefs[i] = &refs[i];
    }
    layout.page_tokens = 16;
    dest.layout = &layout;
    dest.pages = prefs;
    dest.n_pages = n;
    dest.seq_id = 42;
    rep.dest = &dest;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
}

static void fake_decode_cancelled(pd_grpc_call_t *call, void *arg)
{
    (void)arg;
    decode_cancels++;
    held_decode = NULL;
    pd_grpc_call_finish(call, 1, "cancelled");
}

/* Streams tokens 101, 102 then a final event; a "hold" request gets 101 and stays open; a
 * "baddec" request gets 101, -7; a "nulout" request nul_id, 102; "declost" gets NOT_FOUND (the
 * reservation is gone: its lease ended before the KV arrived) on its first Decode, "declost9" on
 * every one. */
static int n_decodes;
static void fake_decode(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    const Pdserve__V1__DecodeRequest *req = (const Pdserve__V1__DecodeRequest *)msg;
    Pdserve__V1__DecodeEvent ev = PDSERVE__V1__DECODE_EVENT__INIT;
    int32_t ids[2] = {101, 102};
    (void)user;
    assert_int_equal(req->seq_id, 42);
    n_decodes++;
    if ((strcmp(req->request_id, "declost") == 0 && n_decodes == 1) ||
        strcmp(req->request_id, "declost9") == 0) {
        pd_grpc_call_finish(call, PD_GRPC_NOT_FOUND, "not found");
        return;
    }
    ev.token_ids = ids;
    if (strcmp(req->request_id, "hold") == 0) {
        ev.n_token_ids = 1;
        assert_int_equal(pd_grpc_call_send(call, &ev.base), PD_OK);
        held_decode = call;
        pd_grpc_call_set_cancel_cb(call, fake_decode_cancelled, NULL);
        return;
    }
    if (strcmp(req->request_id, "baddec") == 0)
        ids[1] = -7; /* outside the vocabulary */
    if (strcmp(req->request_id, "nulout") == 0)
        ids[0] = nul_id;
    ev.n_token_ids = 2;
    assert_int_equal(pd_grpc_call_send(call, &ev.base), PD_OK);
    Pdserve__V1__DecodeEvent fin = PDSERVE__V1__DECODE_EVENT__INIT;
    fin.finish_reason = "length";
    assert_int_equal(pd_grpc_call_send(call, &fin.base), PD_OK);
    pd_grpc_call_finish(call, 0, NULL);
}

static void fake_release(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    Pdserve__V1__ReleaseReply rep = PDSERVE__V1__RELEASE_REPLY__INIT;
    (void)req;
    (void)user;
    releases++;
    rep.found = 1;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
}

static const pd_grpc_method_fn prefill_handlers[2] = {fake_prefill, fake_stats};
static const pd_grpc_method_fn decode_handlers[4] = {fake_reserve, fake_decode, fake_release,
                                                     fake_stats};

static void fake_start(fake_node_t *n, const ProtobufCServiceDescriptor *desc,
                       const pd_grpc_method_fn *handlers)
{
    assert_int_equal(pd_grpc_server_create(&loop, NULL, &n->srv), PD_OK);
    assert_int_equal(pd_grpc_server_add_service(n->srv, desc, handlers, NULL), PD_OK);
    assert_int_equal(pd_grpc_health_create(n->srv, &n->health), PD_OK);
    assert_int_equal(pd_grpc_server_listen(n->srv, "127.0.0.1", 0, &n->port), PD_OK);
}

static void fake_stop(fake_node_t *n)
{
    pd_grpc_server_shutdown(n->srv);
    pd_grpc_server_destroy(n->srv);
    pd_grpc_health_destroy(n->health);
}

/* ==== the router under test and a client ==== */

static cluster_config_t *cfg;
static router_t *core;
static router_grpc_t *api;
static router_http_t *http; /* NULL unless a test serves HTTP too */
static pd_grpc_client_t *cli;

/* Runs the loop until *flag is set (the router polls every 500 ms, so the loop never idles). */
static void run_until(const int *flag, int64_t timeout_ms)
{
    int64_t end = pd_clock_ms() + timeout_ms;
    while (!*flag && pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    assert_true(*flag);
}

typedef struct {
    int done, code, n_tokens, n_msgs;
    char finish_reason[16];
    char details[512];
    pd_grpc_client_call_t *call;
} gen_result_t;

static void gen_msg(void *arg, ProtobufCMessage *msg)
{
    gen_result_t *g = arg;
    const Pdserve__V1__GenerateResponse *m = (const Pdserve__V1__GenerateResponse *)msg;
    g->n_msgs++;
    g->n_tokens += (int)m->n_token_ids;
    if (m->finish_reason && m->finish_reason[0])
        snprintf(g->finish_reason, sizeof g->finish_reason, "%s", m->finish_reason);
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void gen_done(void *arg, int code, const char *msg)
{
    gen_result_t *g = arg;
    g->code = code;
    snprintf(g->details, sizeof g->details, "%s", msg ? msg : "");
    g->done = 1;
}

/* A Generate of req (sampling max_tokens, ignore_eos set here). */
static void generate_req(gen_result_t *g, Pdserve__V1__GenerateRequest *req, uint32_t max_tokens)
{
    Pdserve__V1__SamplingParams sp = PDSERVE__V1__SAMPLING_PARAMS__INIT;
    memset(g, 0, sizeof *g);
    sp.max_tokens = max_tokens;
    sp.ignore_eos = 1;
    if (!req->sampling)
        req->sampling = &sp;
    else
        req->sampling->max_tokens = max_tokens;
    assert_int_equal(pd_grpc_client_stream(cli, "/pdserve.v1.Inference/Generate", &req->base,
                                           &pdserve__v1__generate_response__descriptor, 10000,
                                           gen_msg, gen_done, g, &g->call),
                     PD_OK);
}

/* A Generate of the 3-token prompt {0, 50, 60}. */
static void generate(gen_result_t *g, const char *request_id, uint32_t max_tokens)
{
    Pdserve__V1__GenerateRequest req = PDSERVE__V1__GENERATE_REQUEST__INIT;
    int32_t ids[3] = {0, 50, 60};
    req.token_ids = ids;
    req.n_token_ids = 3;
    req.request_id = (char *)request_id;
    generate_req(g, &req, max_tokens);
}

/* generate() run to its end; returns the gRPC status code. */
static int generate_wait(gen_result_t *g, const char *request_id, uint32_t max_tokens)
{
    generate(g, request_id, max_tokens);
    run_until(&g->done, 10000);
    return g->code;
}

typedef struct {
    int done, code, status;
} health_result_t;

static void health_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    health_result_t *h = arg;
    (void)msg;
    h->code = code;
    if (resp) {
        h->status = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    h->done = 1;
}

/* The router's own grpc.health.v1 status for "pdserve.v1.Inference". */
static int router_health(void)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    health_result_t h = {0};
    req.service = "pdserve.v1.Inference";
    assert_int_equal(pd_grpc_client_unary(cli, "/grpc.health.v1.Health/Check", &req.base,
                                          &grpc__health__v1__health_check_response__descriptor,
                                          5000, health_done, &h, NULL),
                     PD_OK);
    run_until(&h.done, 10000);
    assert_int_equal(h.code, 0);
    return h.status;
}

/* The value of one series in the core's metrics (-1 when absent). */
static double metric(const char *series)
{
    char *text, *p, needle[256];
    size_t len;
    double v = -1;
    snprintf(needle, sizeof needle, "\n%s ", series);
    assert_int_equal(metrics_render(router_metrics(core), &text, &len), PD_OK);
    if ((p = strstr(text, needle)))
        v = strtod(p + strlen(needle), NULL);
    free(text);
    return v;
}

static void setup_cluster(void)
{
    char yaml[1024], err[256], *models = getenv("PD_MODELS_DIR");
    assert_non_null(models);
    assert_int_equal(uv_loop_init(&loop), 0);
    fake_start(&prefill, &pdserve__v1__prefill__descriptor, prefill_handlers);
    fake_start(&decode, &pdserve__v1__decode__descriptor, decode_handlers);
    /* router.listen / router.http are required by the file; this test serves gRPC on port 0 and
     * no HTTP at all */
    snprintf(yaml, sizeof yaml,
             "model: %s/tiny-llama\n"
             "router:\n  listen: 127.0.0.1:1\n  http: 127.0.0.1:2\n"
             "nodes:\n"
             "  - {name: prefill0, role: prefill, host: 127.0.0.1, port: %d}\n"
             "  - {name: decode0, role: decode, host: 127.0.0.1, port: %d, ucx_port: 3}\n",
             models, prefill.port, decode.port);
    assert_int_equal(cluster_config_parse(yaml, strlen(yaml), "test", NULL, err, sizeof err, &cfg),
                     PD_OK);
    assert_int_equal(router_create(&loop, cfg, &core), PD_OK);
    assert_int_equal(router_grpc_create(core, &loop, "127.0.0.1", 0, &api), PD_OK);
    assert_int_equal(pd_grpc_client_create(&loop, "127.0.0.1", router_grpc_port(api), &cli), PD_OK);
}

/* setup_cluster with the HTTP front end on an ephemeral port too, serving once both nodes are. */
static void setup_cluster_http(void)
{
    int serving = 0;
    setup_cluster();
    assert_int_equal(router_http_create(core, &loop, "127.0.0.1", 0, &http), PD_OK);
    int64_t end = pd_clock_ms() + 10000;
    while (!(serving = router_serving(core)) && pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    assert_true(serving);
}

static void teardown_cluster(void)
{
    pd_grpc_client_destroy(cli);
    router_stop(core);
    router_http_destroy(http);
    http = NULL;
    router_grpc_destroy(api);
    router_destroy(core);
    fake_stop(&prefill);
    fake_stop(&decode);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    cluster_config_destroy(cfg);
}

/* ==== an HTTP client on the loop (one request, Connection: close) ==== */

typedef struct {
    uv_tcp_t tcp;
    uv_connect_t conn;
    uv_write_t wr;
    char *req;
    size_t req_len;
    char buf[65536];
    size_t len;
    int done, closed, status;
    const char *body; /* into buf, after the headers */
} http_result_t;

static void http_closed(uv_handle_t *h)
{
    ((http_result_t *)h->data)->closed = 1;
}

static void http_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    http_result_t *r = h->data;
    (void)hint;
    *b = uv_buf_init(r->buf + r->len, (unsigned)(sizeof r->buf - 1 - r->len));
}

static void http_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    http_result_t *r = s->data;
    (void)b;
    if (n > 0) {
        r->len += (size_t)n;
        return;
    }
    if (n == 0)
        return;
    r->buf[r->len] = 0;
    const char *sep = strstr(r->buf, "\r\n\r\n");
    r->body = sep ? sep + 4 : "";
    if (strncmp(r->buf, "HTTP/1.1 ", 9) == 0)
        r->status = atoi(r->buf + 9);
    r->done = 1;
    uv_close((uv_handle_t *)&r->tcp, http_closed);
}

static void http_written(uv_write_t *w, int status)
{
    assert_int_equal(status, 0);
    assert_int_equal(uv_read_start(w->handle, http_alloc, http_read), 0);
}

static void http_connected(uv_connect_t *c, int status)
{
    http_result_t *r = c->handle->data;
    assert_int_equal(status, 0);
    uv_buf_t b = uv_buf_init(r->req, (unsigned)r->req_len);
    assert_int_equal(uv_write(&r->wr, c->handle, &b, 1, http_written), 0);
}

/* POSTs body (body_len bytes) to path on the router's HTTP port; returns the status code and
 * leaves the response body in r->body. */
static int http_post(http_result_t *r, const char *path, const char *body, size_t body_len)
{
    struct sockaddr_in addr;
    char head[256];
    memset(r, 0, sizeof *r);
    int hl = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      path, body_len);
    r->req_len = (size_t)hl + body_len;
    r->req = malloc(r->req_len);
    assert_non_null(r->req);
    memcpy(r->req, head, (size_t)hl);
    memcpy(r->req + hl, body, body_len);
    assert_int_equal(uv_ip4_addr("127.0.0.1", router_http_port(http), &addr), 0);
    assert_int_equal(uv_tcp_init(&loop, &r->tcp), 0);
    r->tcp.data = r;
    assert_int_equal(uv_tcp_connect(&r->conn, &r->tcp, (struct sockaddr *)&addr, http_connected),
                     0);
    run_until(&r->done, 10000);
    run_until(&r->closed, 10000);
    free(r->req);
    return r->status;
}

static int http_post_str(http_result_t *r, const char *path, const char *body)
{
    return http_post(r, path, body, strlen(body));
}

/* ==== tests ==== */

static void test_grpc_requests_counted_without_http(void **state)
{
    gen_result_t g, bad, held;
    int serving = 0;
    (void)state;
    setup_cluster();

    /* health follows the core: NOT_SERVING until both nodes answered their health checks (the
     * loop runs while the health request is in flight, so the nodes may have answered by the
     * time it is served: SERVING is right only then; a CI run under tsan saw that race) */
    const int h0 = router_health();
    assert_true(h0 == PD_GRPC_HEALTH_NOT_SERVING ||
                (h0 == PD_GRPC_HEALTH_SERVING && router_serving(core)));
    int64_t end = pd_clock_ms() + 10000;
    while (!(serving = router_serving(core)) && pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    assert_true(serving);
    assert_int_equal(router_health(), PD_GRPC_HEALTH_SERVING);
    assert_true(metric("pdserve_router_requests_total{outcome=\"ok\"}") == 0);

    /* a Generate: prefill's first token, then the decode node's two */
    generate(&g, "one", 3);
    run_until(&g.done, 10000);
    assert_int_equal(g.code, 0);
    assert_int_equal(g.n_tokens, 3);
    assert_string_equal(g.finish_reason, "length");
    assert_true(metric("pdserve_router_requests_total{outcome=\"ok\"}") == 1);
    assert_true(metric("pdserve_router_generated_tokens_total") == 3);
    assert_true(metric("pdserve_router_request_seconds_count") == 1);

    /* rejected before it started: an error status, nothing counted */
    generate(&bad, "bad", 0);
    run_until(&bad.done, 10000);
    assert_int_equal(bad.code, PD_GRPC_INVALID_ARGUMENT);
    assert_true(metric("pdserve_router_requests_total{outcome=\"error\"}") == 0);

    /* the client cancels while the decode node streams: the node sees the cancel, the core
     * counts the request as cancelled */
    generate(&held, "hold", 100);
    end = pd_clock_ms() + 10000;
    while (held.n_tokens < 2 && pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(held.n_tokens, 2); /* the first token and the decode node's 101 */
    assert_true(metric("pdserve_router_requests_active") == 1);
    pd_grpc_client_call_cancel(held.call);
    run_until(&held.done, 10000);
    assert_int_equal(held.code, PD_GRPC_CANCELLED);
    run_until(&decode_cancels, 10000);
    assert_null(held_decode);
    end = pd_clock_ms() + 10000;
    while (metric("pdserve_router_requests_total{outcome=\"cancelled\"}") != 1 &&
           pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    assert_true(metric("pdserve_router_requests_total{outcome=\"cancelled\"}") == 1);
    assert_true(metric("pdserve_router_requests_total{outcome=\"ok\"}") == 1);
    assert_true(metric("pdserve_router_requests_active") == 0);
    assert_int_equal(releases, 0); /* pages were the decode node's: no Release */

    /* the decode node stops serving: so does the router (next poll) */
    assert_int_equal(pd_grpc_health_set(decode.health, "", PD_GRPC_HEALTH_NOT_SERVING), PD_OK);
    end = pd_clock_ms() + 10000;
    while ((serving = router_serving(core)) && pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    assert_false(serving);
    assert_int_equal(router_health(), PD_GRPC_HEALTH_NOT_SERVING);

    teardown_cluster();
}

/* ==== issue 13: values from clients and nodes, NUL bytes, request ids, allocation failures ==== */

typedef struct {
    int done, code, found;
} abort_result_t;

static void abort_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    abort_result_t *a = arg;
    (void)msg;
    a->code = code;
    if (resp) {
        a->found = ((Pdserve__V1__AbortResponse *)resp)->found;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    a->done = 1;
}

/* Abort(request_id): whether a running request was found. */
static int abort_request(const char *request_id)
{
    Pdserve__V1__AbortRequest req = PDSERVE__V1__ABORT_REQUEST__INIT;
    abort_result_t a = {0};
    req.request_id = (char *)request_id;
    assert_int_equal(pd_grpc_client_unary(cli, "/pdserve.v1.Inference/Abort", &req.base,
                                          &pdserve__v1__abort_response__descriptor, 5000,
                                          abort_done, &a, NULL),
                     PD_OK);
    run_until(&a.done, 10000);
    assert_int_equal(a.code, 0);
    return a.found;
}

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (!strstr((hay), (needle)))                                                              \
            fail_msg("\"%s\" does not contain \"%s\"", (hay), (needle));                           \
    } while (0)

static void test_client_numbers_checked(void **state)
{
    static const char *const too_many[] = {"2147483647", "2147483648", "4294967297",
                                           "9223372036854775807", "2046"};
    gen_result_t g;
    http_result_t h;
    char body[16384], want[64];
    (void)state;
    setup_cluster_http();

    /* gRPC: 2^31 - 1 used to overflow n + max_tokens + 1 and abort the router; 2^31 and more
     * were negative counts */
    assert_int_equal(generate_wait(&g, "big", 2147483647u), PD_GRPC_INVALID_ARGUMENT);
    assert_contains(g.details, "max_tokens 2147483647: prompt 3 + max_tokens exceeds the context "
                               "of 2048 tokens");
    assert_int_equal(generate_wait(&g, "big", 2147483648u), PD_GRPC_INVALID_ARGUMENT);
    assert_contains(g.details, "max_tokens 2147483648:");
    assert_int_equal(generate_wait(&g, "big", 4294967295u), PD_GRPC_INVALID_ARGUMENT);
    assert_contains(g.details, "max_tokens 4294967295:");
    /* prompt + max_tokens must fit the context: 3 + 2045 does, 3 + 2046 does not */
    assert_int_equal(generate_wait(&g, "big", 2046), PD_GRPC_INVALID_ARGUMENT);
    assert_contains(g.details, "at most 2045");
    assert_int_equal(generate_wait(&g, "fits", 2045), 0);
    assert_int_equal(g.n_tokens, 3);

    /* HTTP: the JSON number is checked whole (2^32 + 1 used to become 1 token) */
    for (size_t i = 0; i < sizeof too_many / sizeof too_many[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\": [0, 50, 60], \"max_tokens\": %s}", too_many[i]);
        assert_int_equal(http_post_str(&h, "/v1/completions", body), 400);
        snprintf(want, sizeof want, "max_tokens %s: prompt 3", too_many[i]);
        assert_contains(h.body, want);
    }
    assert_int_equal(
        http_post_str(&h, "/v1/completions", "{\"prompt\": [0, 50], \"max_tokens\": 0}"), 400);
    assert_int_equal(
        http_post_str(&h, "/v1/completions", "{\"prompt\": [0, 50], \"max_tokens\": -4294967295}"),
        400);
    assert_contains(h.body, "-4294967295");
    /* token ids are checked whole too (2^32 + 50 used to become 50) */
    assert_int_equal(
        http_post_str(&h, "/v1/completions", "{\"prompt\": [0, 4294967346], \"max_tokens\": 2}"),
        400);
    assert_contains(h.body, "token_ids[1] = 4294967346 is outside the vocabulary (0..2047)");
    /* top_k: 2^32 + 1 used to become 1 (greedy); past the vocabulary it means all tokens (off) */
    n_prefills = 0;
    assert_int_equal(
        http_post_str(&h, "/v1/completions",
                      "{\"prompt\": [0, 50], \"max_tokens\": 2, \"top_k\": 4294967297}"),
        200);
    assert_int_equal(n_prefills, 1);
    assert_int_equal(prefill_top_k, 0);
    assert_int_equal(http_post_str(&h, "/v1/completions",
                                   "{\"prompt\": [0, 50], \"max_tokens\": 2, \"top_k\": 40}"),
                     200);
    assert_int_equal(prefill_top_k, 40);
    assert_int_equal(http_post_str(&h, "/v1/completions",
                                   "{\"prompt\": [0, 50], \"max_tokens\": 2, \"top_k\": -1}"),
                     200); /* -1: off, as in vLLM */
    assert_int_equal(prefill_top_k, 0);
    assert_int_equal(http_post_str(&h, "/v1/completions",
                                   "{\"prompt\": [0, 50], \"max_tokens\": 2, \"top_k\": -2}"),
                     400);
    assert_contains(h.body, "top_k");
    assert_int_equal(http_post_str(&h, "/v1/completions",
                                   "{\"prompt\": [0, 50], \"max_tokens\": 2, \"top_k\": \"3\"}"),
                     400);
    /* n: 1..64 samples */
    assert_int_equal(
        http_post_str(&h, "/v1/completions", "{\"prompt\": [0, 50], \"max_tokens\": 2, \"n\": 65}"),
        400);
    assert_contains(h.body, "n must be in 1..64");
    /* a prefill node that answers one first token for n = 2 samples: the request fails (both
     * samples, one response), the router goes on (the leader's failure used to reach a front end
     * already freed by the waiting sample's) */
    assert_int_equal(
        http_post_str(&h, "/v1/completions",
                      "{\"prompt\": [0, 50], \"max_tokens\": 2, \"n\": 2, \"stream\": false}"),
        500);
    assert_contains(h.body, "answered 0 first tokens for 2 samples");
    /* without max_tokens the default (16) is cut to what fits: a prompt of 2040 ids */
    int len = snprintf(body, sizeof body, "{\"prompt\": [0");
    for (int i = 1; i < 2040; i++)
        len += snprintf(body + len, sizeof body - (size_t)len, ",5");
    snprintf(body + len, sizeof body - (size_t)len, "]}");
    assert_int_equal(http_post_str(&h, "/v1/completions", body), 200);
    /* a request_id longer than 95 bytes (it used to be cut, so long ids collided) */
    memset(want, 'x', 63);
    snprintf(body, sizeof body, "%s%s", want, want);
    body[96] = 0;
    assert_int_equal(generate_wait(&g, body, 2), PD_GRPC_INVALID_ARGUMENT);
    assert_contains(g.details, "request_id");
    body[95] = 0;
    assert_int_equal(generate_wait(&g, body, 2), 0);

    /* the router still serves */
    assert_int_equal(generate_wait(&g, "after", 3), 0);
    assert_int_equal(g.n_tokens, 3);
    teardown_cluster();
}

static void test_node_numbers_checked(void **state)
{
    gen_result_t g;
    (void)state;
    setup_cluster_http();
    releases = 0;

    /* a first token outside the vocabulary (5000 of 2048) fails the request */
    assert_int_equal(generate_wait(&g, "badtok", 5), PD_GRPC_INTERNAL);
    assert_contains(g.details, "token id 5000, outside the vocabulary");
    assert_int_equal(g.n_tokens, 0);
    /* so does a decode token outside it (-7), after the good ones */
    assert_int_equal(generate_wait(&g, "baddec", 5), PD_GRPC_INTERNAL);
    assert_contains(g.details, "token id -7");
    /* a reservation of fewer pages than the prompt needs: failed before any prefill, released */
    n_prefills = 0;
    int32_t ids[40] = {0};
    Pdserve__V1__GenerateRequest req = PDSERVE__V1__GENERATE_REQUEST__INIT;
    req.token_ids = ids;
    req.n_token_ids = 40;
    req.request_id = "badresv";
    generate_req(&g, &req, 4);
    run_until(&g.done, 10000);
    assert_int_equal(g.code, PD_GRPC_INTERNAL);
    assert_contains(g.details, "reservation 42 of 2 pages of 16 tokens for 40 tokens");
    assert_int_equal(n_prefills, 0);
    run_until(&releases, 10000);

    assert_int_equal(generate_wait(&g, "after", 3), 0);
    assert_int_equal(g.n_tokens, 3);
    teardown_cluster();
}

typedef struct {
    int done, code;
    int32_t ids[64];
    size_t n;
} tok_result_t;

static void tok_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    tok_result_t *t = arg;
    (void)msg;
    t->code = code;
    if (resp) {
        const Pdserve__V1__TokenizeResponse *r = (const Pdserve__V1__TokenizeResponse *)resp;
        t->n = r->n_token_ids;
        memcpy(t->ids, r->token_ids, (t->n < 64 ? t->n : 64) * sizeof *t->ids);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    t->done = 1;
}

/* GenerateResponse with its text read as bytes (protobuf-c's string type ends at a NUL). */
typedef struct {
    Pdserve__V1__GenerateResponse resp;
    ProtobufCBinaryData text;
} resp_bytes_t;

static ProtobufCMessageDescriptor resp_bytes_desc;
static ProtobufCFieldDescriptor resp_bytes_fields[16];

static void resp_bytes_init(void)
{
    const ProtobufCMessageDescriptor *src = &pdserve__v1__generate_response__descriptor;
    assert_true(src->n_fields <= 16);
    resp_bytes_desc = *src;
    memcpy(resp_bytes_fields, src->fields, src->n_fields * sizeof *resp_bytes_fields);
    for (unsigned i = 0; i < src->n_fields; i++) {
        if (strcmp(resp_bytes_fields[i].name, "text") != 0)
            continue;
        resp_bytes_fields[i].type = PROTOBUF_C_TYPE_BYTES;
        resp_bytes_fields[i].offset = offsetof(resp_bytes_t, text);
        resp_bytes_fields[i].default_value = NULL;
    }
    resp_bytes_desc.fields = resp_bytes_fields;
    resp_bytes_desc.sizeof_message = sizeof(resp_bytes_t);
    resp_bytes_desc.message_init = NULL;
}

typedef struct {
    int done, code;
    char text[256];
    size_t len;
} text_result_t;

static void text_msg(void *arg, ProtobufCMessage *msg)
{
    text_result_t *t = arg;
    const resp_bytes_t *m = (const resp_bytes_t *)msg;
    assert_true(t->len + m->text.len <= sizeof t->text);
    if (m->text.len)
        memcpy(t->text + t->len, m->text.data, m->text.len);
    t->len += m->text.len;
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void text_done(void *arg, int code, const char *msg)
{
    text_result_t *t = arg;
    (void)msg;
    t->code = code;
    t->done = 1;
}

static void test_nul_byte_in_prompt(void **state)
{
    static const char text[] = "ab\0cd";           /* 5 bytes */
    uint8_t field[6] = {5, 'a', 'b', 0, 'c', 'd'}; /* the text field's length and bytes */
    ProtobufCMessageUnknownField uf = {2, PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED, sizeof field,
                                       field};
    int32_t *want, *cut;
    size_t n_want, n_cut;
    gen_result_t g;
    http_result_t h;
    (void)state;
    setup_cluster_http();
    assert_int_equal(tokenizer_encode(router_tokenizer(core), text, 5, true, &want, &n_want),
                     PD_OK);
    assert_int_equal(tokenizer_encode(router_tokenizer(core), text, 2, true, &cut, &n_cut), PD_OK);
    assert_true(n_want > n_cut); /* the NUL and "cd" are tokens of their own */
    assert_true(n_want <= 64);

    /* gRPC: protobuf-c's string type ends at the NUL; the text is sent as raw field 2 because
     * protobuf-c would cut it on this side too */
    Pdserve__V1__GenerateRequest req = PDSERVE__V1__GENERATE_REQUEST__INIT;
    req.base.n_unknown_fields = 1;
    req.base.unknown_fields = &uf;
    req.request_id = "nul";
    n_prefills = 0;
    generate_req(&g, &req, 2);
    run_until(&g.done, 10000);
    assert_int_equal(g.code, 0);
    assert_int_equal(n_prefills, 1);
    assert_int_equal(n_prefill_ids, n_want);
    assert_memory_equal(prefill_ids, want, n_want * sizeof *want);

    /* gRPC Tokenize: the same ids */
    Pdserve__V1__TokenizeRequest treq = PDSERVE__V1__TOKENIZE_REQUEST__INIT;
    tok_result_t t = {0};
    uf.tag = 1;
    treq.base.n_unknown_fields = 1;
    treq.base.unknown_fields = &uf;
    assert_int_equal(pd_grpc_client_unary(cli, "/pdserve.v1.Inference/Tokenize", &treq.base,
                                          &pdserve__v1__tokenize_response__descriptor, 5000,
                                          tok_done, &t, NULL),
                     PD_OK);
    run_until(&t.done, 10000);
    assert_int_equal(t.code, 0);
    assert_int_equal(t.n, n_want);
    assert_memory_equal(t.ids, want, n_want * sizeof *want);

    /* HTTP: "\u0000" in a completion prompt is a byte of the prompt */
    n_prefills = 0;
    assert_int_equal(
        http_post_str(&h, "/v1/completions", "{\"prompt\": \"ab\\u0000cd\", \"max_tokens\": 2}"),
        200);
    assert_int_equal(n_prefills, 1);
    assert_int_equal(n_prefill_ids, n_want);
    assert_memory_equal(prefill_ids, want, n_want * sizeof *want);
    /* generated text holding a NUL byte streams whole over gRPC (protobuf-c cut it at the NUL) */
    int32_t *nul, out[3] = {100, 0, 102};
    size_t n_nul;
    char *want_text;
    size_t want_len;
    assert_int_equal(tokenizer_encode(router_tokenizer(core), "", 1, false, &nul, &n_nul), PD_OK);
    assert_int_equal(n_nul, 1);
    nul_id = out[1] = nul[0];
    free(nul);
    assert_int_equal(tokenizer_decode(router_tokenizer(core), out, 3, true, &want_text, &want_len),
                     PD_OK);
    assert_non_null(memchr(want_text, 0, want_len));
    resp_bytes_init();
    text_result_t tr = {0};
    int32_t three[3] = {0, 50, 60};
    Pdserve__V1__GenerateRequest oreq = PDSERVE__V1__GENERATE_REQUEST__INIT;
    Pdserve__V1__SamplingParams osp = PDSERVE__V1__SAMPLING_PARAMS__INIT;
    osp.max_tokens = 3;
    osp.ignore_eos = 1;
    oreq.sampling = &osp;
    oreq.token_ids = three;
    oreq.n_token_ids = 3;
    oreq.request_id = "nulout";
    assert_int_equal(pd_grpc_client_stream(cli, "/pdserve.v1.Inference/Generate", &oreq.base,
                                           &resp_bytes_desc, 10000, text_msg, text_done, &tr, NULL),
                     PD_OK);
    run_until(&tr.done, 10000);
    assert_int_equal(tr.code, 0);
    assert_int_equal(tr.len, want_len);
    assert_memory_equal(tr.text, want_text, want_len);
    free(want_text);

    /* ... and refused where it cannot be carried: chat messages (the template takes C strings),
     * stop strings */
    assert_int_equal(http_post_str(&h, "/v1/chat/completions",
                                   "{\"messages\": [{\"role\": \"user\", \"content\": "
                                   "\"ab\\u0000cd\"}], \"max_tokens\": 2}"),
                     400);
    assert_contains(h.body, "NUL");
    assert_int_equal(
        http_post_str(&h, "/v1/completions",
                      "{\"prompt\": \"ab\", \"max_tokens\": 2, \"stop\": \"x\\u0000\"}"),
        400);
    assert_contains(h.body, "NUL");
    free(want);
    free(cut);
    teardown_cluster();
}

static void test_duplicate_request_id(void **state)
{
    gen_result_t held, dup, g;
    (void)state;
    setup_cluster_http();
    decode_cancels = 0;

    generate(&held, "hold", 100);
    int64_t end = pd_clock_ms() + 10000;
    while (held.n_tokens < 2 && pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(held.n_tokens, 2);
    /* a second request with the running one's id is refused; the first runs on */
    assert_int_equal(generate_wait(&dup, "hold", 5), PD_GRPC_ALREADY_EXISTS);
    assert_contains(dup.details, "request_id hold is already running");
    assert_false(held.done);
    assert_non_null(held_decode);
    /* Abort stops the first */
    assert_true(abort_request("hold"));
    run_until(&held.done, 10000);
    assert_int_equal(held.code, 0);
    assert_string_equal(held.finish_reason, "abort");
    run_until(&decode_cancels, 10000);
    /* an id is free again once its request ended; ids the router makes skip the clients' */
    assert_int_equal(generate_wait(&g, "one", 3), 0);
    assert_int_equal(generate_wait(&g, "one", 3), 0);
    assert_false(abort_request("hold"));
    teardown_cluster();
}

static void test_allocation_failure(void **state)
{
    gen_result_t g;
    http_result_t h;
    char body[4096];
    (void)state;
    setup_cluster_http();

    /* the token buffer of a request: (3 + 1000 + 1) int32 */
    n_failed = 0;
    fail_size = (3 + 1000 + 1) * sizeof(int32_t);
    assert_int_equal(generate_wait(&g, "nomem", 1000), PD_GRPC_RESOURCE_EXHAUSTED);
    assert_int_equal(n_failed, 1);
    assert_contains(g.details, "out of memory");
    /* HTTP: the prompt's 777 token ids */
    int len = snprintf(body, sizeof body, "{\"max_tokens\": 2, \"prompt\": [0");
    for (int i = 1; i < 777; i++)
        len += snprintf(body + len, sizeof body - (size_t)len, ",5");
    snprintf(body + len, sizeof body - (size_t)len, "]}");
    fail_size = 777 * sizeof(int32_t);
    assert_int_equal(http_post_str(&h, "/v1/completions", body), 503);
    assert_int_equal(n_failed, 2);
    assert_contains(h.body, "out of memory");
    fail_size = 0;

    /* the router keeps serving both */
    assert_int_equal(generate_wait(&g, "nomem", 1000), 0);
    assert_int_equal(g.n_tokens, 3);
    assert_int_equal(http_post_str(&h, "/v1/completions", body), 200);
    assert_true(metric("pdserve_router_requests_active") == 0);
    teardown_cluster();
}

static void test_fake_clock_leases_and_deadlines(void **state)
{
    gen_result_t g;
    pd_clock_t clock = {fake_clock, NULL};
    (void)state;
    setup_cluster_http();
    router_set_clock(core, &clock);

    /* the prefill node missed the lease: release, reserve again, complete */
    n_prefills = n_reserves = releases = 0;
    assert_int_equal(generate_wait(&g, "leasemiss", 3), 0);
    assert_int_equal(g.n_tokens, 3);
    assert_int_equal(n_prefills, 2);
    assert_int_equal(n_reserves, 2);
    run_until(&releases, 10000); /* the first reservation is given back */
    assert_int_equal(releases, 1);

    /* the same answer after the request's deadline: no retry */
    n_prefills = n_reserves = 0;
    assert_int_equal(generate_wait(&g, "leaselate", 3), PD_GRPC_RESOURCE_EXHAUSTED);
    assert_int_equal(n_prefills, 1);
    assert_int_equal(n_reserves, 1);

    /* DEADLINE_EXCEEDED from Reserve or Prefill while the router's clock still says "before the
     * deadline" (the client's timer runs on the loop's cached time, behind the clock): the
     * request ends with DEADLINE_EXCEEDED, and neither node is marked down for it (the CI's
     * ThreadSanitizer cluster run once got UNAVAILABLE, "no decode node is available", here) */
    n_prefills = n_reserves = 0;
    assert_int_equal(generate_wait(&g, "resvlate", 3), PD_GRPC_DEADLINE_EXCEEDED);
    assert_int_equal(n_reserves, 1);
    assert_int_equal(n_prefills, 0);
    assert_int_equal(generate_wait(&g, "afterresv", 3), 0);
    assert_int_equal(g.n_tokens, 3);
    n_prefills = n_reserves = releases = 0;
    assert_int_equal(generate_wait(&g, "prelate", 3), PD_GRPC_DEADLINE_EXCEEDED);
    assert_int_equal(n_prefills, 1);
    assert_int_equal(n_reserves, 1);
    run_until(&releases, 10000); /* its reservation is given back */
    assert_int_equal(releases, 1);
    assert_int_equal(generate_wait(&g, "afterpre", 3), 0);
    assert_int_equal(g.n_tokens, 3);

    /* the decode node no longer holds the reservation at Decode (NOT_FOUND: its lease ended
     * before the KV arrived, seen after a network cut healed): reserve and prefill again */
    n_prefills = n_reserves = n_decodes = 0;
    assert_int_equal(generate_wait(&g, "declost", 3), 0);
    assert_int_equal(g.n_tokens, 3);
    assert_int_equal(n_decodes, 2);
    assert_int_equal(n_reserves, 2);
    assert_int_equal(n_prefills, 2);
    /* ... but not without end: after 3 lost reservations the error reaches the client (each
     * prefill emits a token, so max_tokens 10 keeps the request from ending by length first) */
    n_prefills = n_reserves = n_decodes = 0;
    assert_int_equal(generate_wait(&g, "declost9", 10), PD_GRPC_NOT_FOUND);
    assert_int_equal(n_decodes, 4);
    assert_int_equal(n_reserves, 4);

    /* waiting for pages: retried until the deadline passes on the router's clock */
    n_reserves = 0;
    generate(&g, "nopages", 3);
    int64_t end = pd_clock_ms() + 10000;
    while (n_reserves < 2 && pd_clock_ms() < end) /* it retries while the clock stands */
        uv_run(&loop, UV_RUN_ONCE);
    assert_true(n_reserves >= 2);
    assert_false(g.done);
    fake_now += cfg->router.request_timeout_ms + 1;
    run_until(&g.done, 10000);
    assert_int_equal(g.code, PD_GRPC_DEADLINE_EXCEEDED);
    assert_contains(g.details, "waiting for kv pages");
    assert_true(metric("pdserve_router_requests_active") == 0);
    teardown_cluster();
}

/* argv[1]: run only the tests whose names match it (cmocka's filter: '*' wildcards). */
int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grpc_requests_counted_without_http),
        cmocka_unit_test(test_client_numbers_checked),
        cmocka_unit_test(test_node_numbers_checked),
        cmocka_unit_test(test_nul_byte_in_prompt),
        cmocka_unit_test(test_duplicate_request_id),
        cmocka_unit_test(test_allocation_failure),
        cmocka_unit_test(test_fake_clock_leases_and_deadlines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
