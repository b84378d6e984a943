/* grpc_test_client: runs one scenario of the C gRPC client against a pdtest.Echo server (the
 * python3-grpcio test server or the C one) and exits 0 when every check passed.
 *
 *   grpc_test_client PORT SCENARIO
 *
 * Scenarios: unary, stream, deadline, cancel, error, unavailable, health, metadata, reconnect,
 * many. Checks print "FAIL ..." lines; the loop must close cleanly (uv_loop_close() == 0).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_client.h"
#include "health.pb-c.h"
#include "log.h"
#include "testsvc.pb-c.h"

static int failures;
static uv_loop_t *loop;
static pd_grpc_client_t *client;
static int port;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                 \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

typedef struct {
    int done, code, n_msgs;
    char msg[256];
    ProtobufCMessage *resp;
    pd_grpc_client_call_t *call;
    int cancel_after; /* stream: cancel after this many messages (0 = never) */
    uint64_t done_at;
} result_t;

static void on_unary(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    result_t *r = arg;
    r->done = 1;
    r->code = code;
    r->done_at = uv_now(loop);
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    r->resp = resp;
}

static void on_msg(void *arg, ProtobufCMessage *m)
{
    result_t *r = arg;
    Pdtest__EchoReply *rep = (Pdtest__EchoReply *)m;
    CHECK(rep->seq == r->n_msgs, "seq %d, expected %d", rep->seq, r->n_msgs);
    r->n_msgs++;
    protobuf_c_message_free_unpacked(m, NULL);
    if (r->cancel_after && r->n_msgs == r->cancel_after)
        pd_grpc_client_call_cancel(r->call);
}

static void on_done(void *arg, int code, const char *msg)
{
    on_unary(arg, code, msg, NULL);
}

static void wait_done(result_t *r)
{
    while (!r->done)
        uv_run(loop, UV_RUN_ONCE);
}

static void unary(const char *path, const ProtobufCMessage *req,
                  const ProtobufCMessageDescriptor *desc, int64_t timeout_ms, result_t *r)
{
    memset(r, 0, sizeof *r);
    pd_status_t st = pd_grpc_client_unary(client, path, req, desc, timeout_ms, on_unary, r, &r->call);
    CHECK(st == PD_OK, "start %s: %s", path, pd_status_str(st));
    wait_done(r);
}

static void free_resp(result_t *r)
{
    if (r->resp)
        protobuf_c_message_free_unpacked(r->resp, NULL);
    r->resp = NULL;
}

static Pdtest__StatsReply *stats(result_t *r)
{
    Pdtest__StatsRequest req = PDTEST__STATS_REQUEST__INIT;
    unary("/pdtest.Echo/Stats", &req.base, &pdtest__stats_reply__descriptor, 5000, r);
    CHECK(r->code == 0 && r->resp, "stats: %d %s", r->code, r->msg);
    return (Pdtest__StatsReply *)r->resp;
}

static void s_unary(void)
{
    Pdtest__EchoRequest req = PDTEST__ECHO_REQUEST__INIT;
    uint8_t payload[100000];
    result_t r;

    memset(payload, 0x5a, sizeof payload);
    req.text = "hello";
    req.payload.data = payload;
    req.payload.len = sizeof payload;
    unary("/pdtest.Echo/Unary", &req.base, &pdtest__echo_reply__descriptor, 5000, &r);
    CHECK(r.code == 0, "code %d %s", r.code, r.msg);
    Pdtest__EchoReply *rep = (Pdtest__EchoReply *)r.resp;
    CHECK(rep && strcmp(rep->text, "hello") == 0, "text");
    CHECK(rep && rep->payload.len == sizeof payload &&
              memcmp(rep->payload.data, payload, sizeof payload) == 0,
          "payload");
    free_resp(&r);
    /* no deadline */
    unary("/pdtest.Echo/Unary", &req.base, &pdtest__echo_reply__descriptor, 0, &r);
    CHECK(r.code == 0, "code %d %s", r.code, r.msg);
    free_resp(&r);
    /* unknown method */
    unary("/pdtest.Echo/Nope", &req.base, &pdtest__echo_reply__descriptor, 5000, &r);
    CHECK(r.code == PD_GRPC_UNIMPLEMENTED, "unknown method: code %d %s", r.code, r.msg);
    free_resp(&r);
}

static void s_stream(void)
{
    Pdtest__StreamRequest req = PDTEST__STREAM_REQUEST__INIT;
    result_t r = {0};

    req.count = 50;
    req.payload_size = 1000;
    pd_grpc_client_stream(client, "/pdtest.Echo/Stream", &req.base, &pdtest__echo_reply__descriptor,
                       10000, on_msg, on_done, &r, &r.call);
    wait_done(&r);
    CHECK(r.code == 0 && r.n_msgs == 50, "code %d n %d %s", r.code, r.n_msgs, r.msg);
    /* a stream that ends with an error after 3 messages */
    memset(&r, 0, sizeof r);
    req.count = 3;
    req.error_code = PD_GRPC_RESOURCE_EXHAUSTED;
    req.error_message = "out of pages";
    pd_grpc_client_stream(client, "/pdtest.Echo/Stream", &req.base, &pdtest__echo_reply__descriptor,
                       10000, on_msg, on_done, &r, &r.call);
    wait_done(&r);
    CHECK(r.code == PD_GRPC_RESOURCE_EXHAUSTED && r.n_msgs == 3 && strcmp(r.msg, "out of pages") == 0,
          "code %d n %d %s", r.code, r.n_msgs, r.msg);
}

static void s_deadline(void)
{
    Pdtest__EchoRequest req = PDTEST__ECHO_REQUEST__INIT;
    result_t r;
    uint64_t t0 = uv_now(loop);

    req.sleep_ms = 3000;
    unary("/pdtest.Echo/Unary", &req.base, &pdtest__echo_reply__descriptor, 300, &r);
    CHECK(r.code == PD_GRPC_DEADLINE_EXCEEDED, "code %d %s", r.code, r.msg);
    CHECK(r.done_at - t0 < 2000, "took %llu ms", (unsigned long long)(r.done_at - t0));
    free_resp(&r);
    /* the server saw a deadline of about 300 ms */
    Pdtest__StatsReply *s = stats(&r);
    CHECK(s && s->last_deadline_ms > 0 && s->last_deadline_ms <= 300, "server deadline %lld",
          s ? (long long)s->last_deadline_ms : -1LL);
    free_resp(&r);
}

static void s_cancel(void)
{
    Pdtest__StreamRequest req = PDTEST__STREAM_REQUEST__INIT;
    result_t r = {0}, rs;
    int64_t before;

    Pdtest__StatsReply *s = stats(&rs);
    before = s ? s->cancels : 0;
    free_resp(&rs);
    req.count = 1000;
    req.delay_ms = 20;
    r.cancel_after = 3;
    pd_grpc_client_stream(client, "/pdtest.Echo/Stream", &req.base, &pdtest__echo_reply__descriptor,
                       20000, on_msg, on_done, &r, &r.call);
    wait_done(&r);
    CHECK(r.code == PD_GRPC_CANCELLED && r.n_msgs == 3, "code %d n %d", r.code, r.n_msgs);
    /* the server observes the cancel */
    int64_t after = before;
    for (int i = 0; i < 100 && after == before; i++) {
        s = stats(&rs);
        after = s ? s->cancels : before;
        free_resp(&rs);
        if (after == before) {
            uv_sleep(20);
        }
    }
    CHECK(after == before + 1, "server cancels %lld -> %lld", (long long)before, (long long)after);
}

static void s_error(void)
{
    Pdtest__EchoRequest req = PDTEST__ECHO_REQUEST__INIT;
    const char *msg = "bad \xc3\xa4 100% \xe2\x9c\x93 \"q\"\nline2";
    result_t r;

    req.error_code = 9;
    req.error_message = (char *)msg;
    unary("/pdtest.Echo/Unary", &req.base, &pdtest__echo_reply__descriptor, 5000, &r);
    CHECK(r.code == 9, "code %d", r.code);
    CHECK(strcmp(r.msg, msg) == 0, "message '%s'", r.msg);
    CHECK(r.resp == NULL, "resp with error");
    free_resp(&r);
}

static void s_unavailable(void)
{
    Pdtest__EchoRequest req = PDTEST__ECHO_REQUEST__INIT;
    result_t r, r2 = {0};

    /* two calls pending on the same failing connection: both get UNAVAILABLE */
    pd_grpc_client_unary(client, "/pdtest.Echo/Unary", &req.base, &pdtest__echo_reply__descriptor,
                      5000, on_unary, &r2, NULL);
    unary("/pdtest.Echo/Unary", &req.base, &pdtest__echo_reply__descriptor, 5000, &r);
    wait_done(&r2);
    CHECK(r.code == PD_GRPC_UNAVAILABLE, "code %d %s", r.code, r.msg);
    CHECK(r2.code == PD_GRPC_UNAVAILABLE, "code %d %s", r2.code, r2.msg);
    free_resp(&r);
    /* and again: the client reconnects (and fails again) */
    unary("/pdtest.Echo/Unary", &req.base, &pdtest__echo_reply__descriptor, 5000, &r);
    CHECK(r.code == PD_GRPC_UNAVAILABLE, "code %d %s", r.code, r.msg);
    free_resp(&r);
}

static void s_health(void)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    result_t r;

    unary("/grpc.health.v1.Health/Check", &req.base,
          &grpc__health__v1__health_check_response__descriptor, 5000, &r);
    CHECK(r.code == 0, "code %d %s", r.code, r.msg);
    CHECK(r.resp && ((Grpc__Health__V1__HealthCheckResponse *)r.resp)->status ==
                        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING,
          "status");
    free_resp(&r);
    req.service = "no.such.Service";
    unary("/grpc.health.v1.Health/Check", &req.base,
          &grpc__health__v1__health_check_response__descriptor, 5000, &r);
    CHECK(r.code == PD_GRPC_NOT_FOUND, "unknown service: code %d %s", r.code, r.msg);
    free_resp(&r);
}

static void s_metadata(void)
{
    Pdtest__EchoRequest req = PDTEST__ECHO_REQUEST__INIT;
    result_t r = {0};
    pd_grpc_client_call_t *call;

    pd_grpc_client_unary(client, "/pdtest.Echo/Unary", &req.base, &pdtest__echo_reply__descriptor,
                      5000, on_unary, &r, &call);
    CHECK(pd_grpc_client_call_add_metadata(call, "x-test", "md-value-1") == PD_OK, "add md");
    wait_done(&r);
    CHECK(r.code == 0, "code %d", r.code);
    free_resp(&r);
    Pdtest__StatsReply *s = stats(&r);
    CHECK(s && strcmp(s->last_metadata, "md-value-1") == 0, "md '%s'", s ? s->last_metadata : "");
    free_resp(&r);
}

static void s_many(void)
{
    enum { N = 64 };
    Pdtest__StreamRequest req = PDTEST__STREAM_REQUEST__INIT;
    static result_t rs[N];

    req.count = 20;
    req.payload_size = 100;
    req.delay_ms = 1;
    for (int i = 0; i < N; i++)
        pd_grpc_client_stream(client, "/pdtest.Echo/Stream", &req.base,
                           &pdtest__echo_reply__descriptor, 20000, on_msg, on_done, &rs[i], NULL);
    for (int i = 0; i < N; i++) {
        wait_done(&rs[i]);
        CHECK(rs[i].code == 0 && rs[i].n_msgs == 20, "stream %d: code %d n %d", i, rs[i].code,
              rs[i].n_msgs);
    }
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {
        {"unary", s_unary},   {"stream", s_stream},     {"deadline", s_deadline},
        {"cancel", s_cancel}, {"error", s_error},       {"unavailable", s_unavailable},
        {"health", s_health}, {"metadata", s_metadata}, {"many", s_many},
    };
    int rc, found = 0;

    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT SCENARIO|all\n", argv[0]);
        return 2;
    }
    port = atoi(argv[1]);
    loop = uv_default_loop();
    if (pd_grpc_client_create(loop, "127.0.0.1", port, &client) != PD_OK)
        return 2;
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
        if (strcmp(argv[2], scenarios[i].name) != 0 &&
            (strcmp(argv[2], "all") != 0 || strcmp(scenarios[i].name, "unavailable") == 0))
            continue;
        found = 1;
        int before = failures;
        scenarios[i].fn();
        printf("%s %s\n", failures == before ? "ok" : "FAILED", scenarios[i].name);
    }
    CHECK(found, "unknown scenario %s", argv[2]);
    pd_grpc_client_destroy(client);
    uv_run(loop, UV_RUN_DEFAULT);
    rc = uv_loop_close(loop);
    CHECK(rc == 0, "uv_loop_close: %s", uv_strerror(rc));
    fflush(stdout);
    return failures ? 1 : 0;
}
