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
 * - a rejected request (max_tokens 0) is not counted; requests_active returns to 0.
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

static uv_loop_t loop;

/* ==== fake nodes ==== */

typedef struct {
    pd_grpc_server_t *srv;
    pd_grpc_health_t *health;
    int port;
} fake_node_t;

static fake_node_t prefill, decode;
static pd_grpc_call_t *held_decode; /* a Decode call kept open ("hold" requests) */
static int decode_cancels, releases;

static void fake_stats(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    Pdserve__V1__NodeStats s = PDSERVE__V1__NODE_STATS__INIT;
    (void)req;
    (void)user;
    s.pages_total = 64;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &s.base), NULL);
}

static void fake_prefill(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    Pdserve__V1__PrefillReply rep = PDSERVE__V1__PREFILL_REPLY__INIT;
    (void)req;
    (void)user;
    rep.first_token = 100;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
}

static void fake_reserve(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    Pdserve__V1__ReserveReply rep = PDSERVE__V1__RESERVE_REPLY__INIT;
    Pdserve__V1__KvDestination dest = PDSERVE__V1__KV_DESTINATION__INIT;
    (void)req;
    (void)user;
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

/* Streams tokens 101, 102 then a final event; a "hold" request gets 101 and stays open. */
static void fake_decode(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    const Pdserve__V1__DecodeRequest *req = (const Pdserve__V1__DecodeRequest *)msg;
    Pdserve__V1__DecodeEvent ev = PDSERVE__V1__DECODE_EVENT__INIT;
    int32_t ids[2] = {101, 102};
    (void)user;
    assert_int_equal(req->seq_id, 42);
    ev.token_ids = ids;
    if (strcmp(req->request_id, "hold") == 0) {
        ev.n_token_ids = 1;
        assert_int_equal(pd_grpc_call_send(call, &ev.base), PD_OK);
        held_decode = call;
        pd_grpc_call_set_cancel_cb(call, fake_decode_cancelled, NULL);
        return;
    }
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
    (void)msg;
    g->code = code;
    g->done = 1;
}

static void generate(gen_result_t *g, const char *request_id, int max_tokens)
{
    Pdserve__V1__GenerateRequest req = PDSERVE__V1__GENERATE_REQUEST__INIT;
    Pdserve__V1__SamplingParams sp = PDSERVE__V1__SAMPLING_PARAMS__INIT;
    int32_t ids[3] = {0, 50, 60};
    memset(g, 0, sizeof *g);
    sp.max_tokens = (uint32_t)max_tokens;
    sp.ignore_eos = 1;
    req.sampling = &sp;
    req.token_ids = ids;
    req.n_token_ids = 3;
    req.request_id = (char *)request_id;
    assert_int_equal(pd_grpc_client_stream(cli, "/pdserve.v1.Inference/Generate", &req.base,
                                           &pdserve__v1__generate_response__descriptor, 10000,
                                           gen_msg, gen_done, g, &g->call),
                     PD_OK);
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

static void teardown_cluster(void)
{
    pd_grpc_client_destroy(cli);
    router_stop(core);
    router_grpc_destroy(api);
    router_destroy(core);
    fake_stop(&prefill);
    fake_stop(&decode);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    cluster_config_destroy(cfg);
}

/* ==== tests ==== */

static void test_grpc_requests_counted_without_http(void **state)
{
    gen_result_t g, bad, held;
    int serving = 0;
    (void)state;
    setup_cluster();

    /* health follows the core: NOT_SERVING until both nodes answered their health checks */
    assert_int_equal(router_health(), PD_GRPC_HEALTH_NOT_SERVING);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grpc_requests_counted_without_http),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
