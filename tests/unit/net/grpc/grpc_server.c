/* Tests common/pd_grpc_server.c with raw HTTP/2 bytes: an nghttp2 client session talks to the
 * server through an in-memory connection (pd_grpc_server__fake_open). Malformed requests each get
 * the right status while other calls on the same connection keep working; cancel, deadline,
 * shutdown and destroy paths release everything (uv_loop_close() == 0; run under -Dsanitize=true
 * for leaks). Limits with short params: an idle connection gets a shutdown notice, a PING and the
 * final GOAWAY (a stream the client began before it saw the notice still completes), a late request
 * ends with DEADLINE_EXCEEDED, PING / SETTINGS floods end the connection with ENHANCE_YOUR_CALM. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <nghttp2/nghttp2.h>

#include "grpc_server.h"
#include "testsvc.pb-c.h"

typedef struct {
    int32_t id;
    const uint8_t *body; /* request body bytes sent as DATA */
    size_t body_len, body_off;
    int http_status, grpc_status;
    char grpc_message[256];
    size_t data_len;
    int closed;
    uint32_t rst;
} stream_t;

static uv_loop_t loop;
static pd_grpc_server_t *srv;
static pd_grpc_server__conn_t *conn;
static nghttp2_session *cli;
static stream_t streams[32];
static int n_streams, goaway_seen, conn_gone;
static uint32_t goaway_error;
static int32_t goaway_last_id;
static int hold_output; /* srv_out keeps the server's bytes in held_out instead of delivering */
static uint8_t held_out[1 << 16];
static size_t held_len;
static pd_grpc_call_t *held;
static int cancels;

/* ==== the service: Unary echoes, "hold" keeps the call; Stream sends count replies ==== */

static void on_cancel(pd_grpc_call_t *call, void *arg)
{
    (void)call;
    (void)arg;
    cancels++;
}

static void h_unary(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    const Pdtest__EchoRequest *r = (const void *)req;
    Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
    (void)user;

    if (strcmp(r->text, "hold") == 0) {
        held = call;
        pd_grpc_call_set_cancel_cb(call, on_cancel, NULL);
        return;
    }
    rep.text = r->text;
    assert_int_equal(pd_grpc_call_send(call, &rep.base), PD_OK);
    assert_int_equal(pd_grpc_call_finish(call, r->error_code, r->error_message), PD_OK);
}

static void h_stream(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    const Pdtest__StreamRequest *r = (const void *)req;
    (void)user;
    for (int i = 0; i < r->count; i++) {
        Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
        rep.seq = i;
        assert_int_equal(pd_grpc_call_send(call, &rep.base), PD_OK);
    }
    pd_grpc_call_finish(call, 0, NULL);
}

static const pd_grpc_method_fn handlers[4] = {h_unary, h_stream, NULL, NULL};

/* ==== the raw client ==== */

static stream_t *find(int32_t id)
{
    for (int i = 0; i < n_streams; i++)
        if (streams[i].id == id)
            return &streams[i];
    return NULL;
}

static int c_on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
                       size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                       void *u)
{
    stream_t *st = find(f->hd.stream_id);
    char v[256];
    (void)s;
    (void)flags;
    (void)u;
    snprintf(v, sizeof v, "%.*s", (int)valuelen, value);
    if (!st)
        return 0;
    if (namelen == 7 && memcmp(name, ":status", 7) == 0)
        st->http_status = atoi(v);
    else if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0)
        st->grpc_status = atoi(v);
    else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0)
        snprintf(st->grpc_message, sizeof st->grpc_message, "%s", v);
    return 0;
}

static int c_on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *d, size_t n,
                     void *u)
{
    stream_t *st = find(id);
    (void)s;
    (void)flags;
    (void)d;
    (void)u;
    if (st)
        st->data_len += n;
    return 0;
}

static int c_on_close(nghttp2_session *s, int32_t id, uint32_t err, void *u)
{
    stream_t *st = find(id);
    (void)s;
    (void)u;
    if (st) {
        st->closed = 1;
        st->rst = err;
    }
    return 0;
}

static int c_on_frame(nghttp2_session *s, const nghttp2_frame *f, void *u)
{
    (void)s;
    (void)u;
    if (f->hd.type == NGHTTP2_GOAWAY) {
        goaway_seen++;
        goaway_error = f->goaway.error_code;
        goaway_last_id = f->goaway.last_stream_id;
    }
    return 0;
}

static ssize_t c_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                      nghttp2_data_source *src, void *u)
{
    stream_t *st = src->ptr;
    size_t n = st->body_len - st->body_off;
    (void)s;
    (void)id;
    (void)u;
    if (n > len)
        n = len;
    memcpy(buf, st->body + st->body_off, n);
    st->body_off += n;
    if (st->body_off == st->body_len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static void srv_out(void *arg, const uint8_t *data, size_t len)
{
    (void)arg;
    if (!data) { /* the server closed the connection */
        conn_gone = 1;
        return;
    }
    if (hold_output) {
        assert_true(held_len + len <= sizeof held_out);
        memcpy(held_out + held_len, data, len);
        held_len += len;
        return;
    }
    assert_true(nghttp2_session_mem_recv(cli, data, len) == (ssize_t)len);
}

/* Moves bytes both ways and runs due timers until nothing moves. */
static void pump(void)
{
    for (int idle = 0; idle < 2;) {
        const uint8_t *d;
        ssize_t n;
        int moved = 0;
        uv_run(&loop, UV_RUN_NOWAIT);
        while (!conn_gone && (n = nghttp2_session_mem_send(cli, &d)) > 0) {
            uint8_t *copy = malloc((size_t)n);
            memcpy(copy, d, (size_t)n);
            if (pd_grpc_server__fake_feed(conn, copy, (size_t)n) != PD_OK)
                conn_gone = 1; /* the server closed and freed it */
            free(copy);
            moved = 1;
        }
        idle = moved ? 0 : idle + 1;
    }
}

static void setup_conn_params(const pd_grpc_server_params_t *params);

static void setup_conn(size_t max_recv)
{
    pd_grpc_server_params_t p = {.max_recv_msg_size = max_recv};
    setup_conn_params(&p);
}

static void setup_conn_params(const pd_grpc_server_params_t *params)
{
    nghttp2_session_callbacks *cbs;
    pd_grpc_server_params_t p = *params;

    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(pd_grpc_server_create(&loop, &p, &srv), PD_OK);
    assert_int_equal(pd_grpc_server_add_service(srv, &pdtest__echo__descriptor, handlers, NULL),
                     PD_OK);
    assert_int_equal(pd_grpc_server_add_service(srv, &pdtest__echo__descriptor, handlers, NULL),
                     PD_ERR_INVALID);
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_header_callback(cbs, c_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, c_on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, c_on_close);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, c_on_frame);
    assert_int_equal(nghttp2_session_client_new(&cli, cbs, NULL), 0);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_submit_settings(cli, NGHTTP2_FLAG_NONE, NULL, 0);
    memset(streams, 0, sizeof streams);
    n_streams = goaway_seen = conn_gone = cancels = hold_output = 0;
    goaway_error = 0;
    goaway_last_id = -1;
    held_len = 0;
    held = NULL;
    assert_int_equal(pd_grpc_server__fake_open(srv, srv_out, NULL, &conn), PD_OK);
    pump();
}

static void teardown_conn(void)
{
    pd_grpc_server_destroy(srv);
    nghttp2_session_del(cli);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

#define NV(k, v)                                                                                   \
    {                                                                                              \
        (uint8_t *)(k), (uint8_t *)(v), strlen(k), strlen(v), NGHTTP2_NV_FLAG_NONE                 \
    }

/* Starts a request; body NULL sends END_STREAM with the headers. */
static stream_t *request_ex(const char *method, const char *path, const char *ctype,
                            const char *timeout, const uint8_t *body, size_t body_len)
{
    stream_t *st = &streams[n_streams++];
    nghttp2_nv nv[7] = {NV(":method", method),
                        NV(":scheme", "http"),
                        NV(":path", path),
                        NV(":authority", "test"),
                        NV("content-type", ctype),
                        NV("te", "trailers"),
                        NV("grpc-timeout", timeout ? timeout : "")};
    nghttp2_data_provider prd = {.source.ptr = st, .read_callback = c_body};

    st->grpc_status = -1;
    st->body = body;
    st->body_len = body_len;
    st->id = nghttp2_submit_request(cli, NULL, nv, timeout ? 7 : 6, body ? &prd : NULL, NULL);
    assert_true(st->id > 0);
    return st;
}

static stream_t *request(const char *path, const uint8_t *body, size_t body_len)
{
    return request_ex("POST", path, "application/grpc", NULL, body, body_len);
}

/* A framed EchoRequest{text} in out; returns its length. */
static size_t echo_body(uint8_t *out, const char *text)
{
    Pdtest__EchoRequest req = PDTEST__ECHO_REQUEST__INIT;
    size_t n;
    req.text = (char *)text;
    n = protobuf_c_message_pack(&req.base, out + 5);
    pd_grpc_wire_prefix(out, (uint32_t)n);
    return n + 5;
}

static void expect(const stream_t *st, int http, int grpc, const char *msg_part)
{
    if (!st->closed || st->http_status != http || st->grpc_status != grpc)
        fprintf(stderr, "stream %d: closed %d rst %u http %d grpc %d '%s'\n", st->id, st->closed,
                st->rst, st->http_status, st->grpc_status, st->grpc_message);
    assert_true(st->closed);
    assert_int_equal(st->http_status, http);
    assert_int_equal(st->grpc_status, grpc);
    if (msg_part && !strstr(st->grpc_message, msg_part)) {
        fprintf(stderr, "grpc-message '%s' lacks '%s'\n", st->grpc_message, msg_part);
        fail();
    }
}

/* ==== tests ==== */

static void test_good_calls(void **state)
{
    uint8_t body[64];
    size_t n = echo_body(body, "hi");
    (void)state;

    setup_conn(0);
    stream_t *a = request("/pdtest.Echo/Unary", body, n);
    Pdtest__StreamRequest sr = PDTEST__STREAM_REQUEST__INIT;
    uint8_t sbody[32];
    sr.count = 7;
    size_t sn = protobuf_c_message_pack(&sr.base, sbody + 5);
    pd_grpc_wire_prefix(sbody, (uint32_t)sn);
    stream_t *b = request("/pdtest.Echo/Stream", sbody, sn + 5);
    pump();
    expect(a, 200, 0, NULL);
    assert_int_equal(a->data_len, 5 + 4); /* EchoReply{text:"hi"} */
    expect(b, 200, 0, NULL);
    assert_int_equal(b->data_len, 7 * 5 + 6 * 2); /* seq 0 packs to 0 bytes, others 2 */
    teardown_conn();
}

static void test_malformed_requests(void **state)
{
    uint8_t good[64], buf[8][64];
    size_t gn = echo_body(good, "ok");
    stream_t *st[16], *ok[16];
    int k = 0;
    (void)state;

    setup_conn(1024);
    /* flag 2: invalid */
    memcpy(buf[0], good, gn);
    buf[0][0] = 2;
    st[k++] = request("/pdtest.Echo/Unary", buf[0], gn);
    /* flag 1: compressed */
    memcpy(buf[1], good, gn);
    buf[1][0] = 1;
    st[k++] = request("/pdtest.Echo/Unary", buf[1], gn);
    /* longer than declared: trailing bytes start a message that never completes */
    memcpy(buf[2], good, gn);
    memcpy(buf[2] + gn, "\x00\x00\x00\x00\x09zz", 7);
    st[k++] = request("/pdtest.Echo/Unary", buf[2], gn + 7);
    /* shorter than declared, then END_STREAM */
    st[k++] = request("/pdtest.Echo/Unary", good, gn - 1);
    /* garbage protobuf (field 1 length 100 with 2 bytes) */
    memcpy(buf[3], "\x00\x00\x00\x00\x04\x0a\x64xy", 9);
    st[k++] = request("/pdtest.Echo/Unary", buf[3], 9);
    /* wrong content-type */
    st[k++] = request_ex("POST", "/pdtest.Echo/Unary", "application/json", NULL, good, gn);
    /* larger than max_recv (1024) */
    memcpy(buf[4], "\x00\x00\x00\x08\x00", 5);
    st[k++] = request("/pdtest.Echo/Unary", buf[4], 5);
    /* no message at all */
    st[k++] = request("/pdtest.Echo/Unary", NULL, 0);
    /* unknown method / service / garbage path */
    st[k++] = request("/pdtest.Echo/Nope", good, gn);
    st[k++] = request("/nope.Svc/Unary", good, gn);
    st[k++] = request("/garbage", good, gn);
    /* GET */
    st[k++] = request_ex("GET", "/pdtest.Echo/Unary", "application/grpc", NULL, good, gn);
    /* bad grpc-timeout */
    st[k++] = request_ex("POST", "/pdtest.Echo/Unary", "application/grpc", "soon", good, gn);
    /* two messages (client streaming) */
    memcpy(buf[5], good, gn);
    memcpy(buf[5] + gn, good, gn);
    st[k++] = request("/pdtest.Echo/Unary", buf[5], 2 * gn);
    for (int i = 0; i < k; i++)
        ok[i] = request("/pdtest.Echo/Unary", good, gn); /* interleaved good calls */
    pump();
    int j = 0;
    expect(st[j++], 200, PD_GRPC_INTERNAL, "framing");
    expect(st[j++], 200, PD_GRPC_UNIMPLEMENTED, "compression");
    expect(st[j++], 200, PD_GRPC_INTERNAL, "truncated");
    expect(st[j++], 200, PD_GRPC_INTERNAL, "truncated");
    expect(st[j++], 200, PD_GRPC_INTERNAL, "parse");
    expect(st[j++], 415, PD_GRPC_INTERNAL, "content-type");
    expect(st[j++], 200, PD_GRPC_RESOURCE_EXHAUSTED, "larger than max");
    expect(st[j++], 200, PD_GRPC_INTERNAL, "missing");
    expect(st[j++], 200, PD_GRPC_UNIMPLEMENTED, "/pdtest.Echo/Nope");
    expect(st[j++], 200, PD_GRPC_UNIMPLEMENTED, NULL);
    expect(st[j++], 200, PD_GRPC_UNIMPLEMENTED, NULL);
    expect(st[j++], 405, PD_GRPC_INTERNAL, NULL);
    expect(st[j++], 200, PD_GRPC_INTERNAL, "grpc-timeout");
    expect(st[j++], 200, PD_GRPC_UNIMPLEMENTED, "client streaming");
    for (int i = 0; i < k; i++)
        expect(ok[i], 200, 0, NULL);
    /* and afterwards, on the same connection */
    stream_t *last = request("/pdtest.Echo/Unary", good, gn);
    pump();
    expect(last, 200, 0, NULL);
    teardown_conn();
}

static void test_error_message_encoding(void **state)
{
    Pdtest__EchoRequest req = PDTEST__ECHO_REQUEST__INIT;
    uint8_t body[128];
    (void)state;

    setup_conn(0);
    req.error_code = 9;
    req.error_message = "100% \xc3\xa4";
    size_t n = protobuf_c_message_pack(&req.base, body + 5);
    pd_grpc_wire_prefix(body, (uint32_t)n);
    stream_t *st = request("/pdtest.Echo/Unary", body, n + 5);
    pump();
    expect(st, 200, 9, NULL);
    assert_string_equal(st->grpc_message, "100%25 %C3%A4");
    teardown_conn();
}

static void test_client_reset_cancels(void **state)
{
    uint8_t body[64];
    size_t n = echo_body(body, "hold");
    Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
    (void)state;

    setup_conn(0);
    stream_t *st = request("/pdtest.Echo/Unary", body, n);
    pump();
    assert_non_null(held);
    assert_int_equal(pd_grpc_call_deadline_ms(held), -1);
    assert_string_equal(pd_grpc_call_metadata(held, "te"), "trailers");
    assert_null(pd_grpc_call_metadata(held, "x-none"));
    nghttp2_submit_rst_stream(cli, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
    pump();
    assert_int_equal(cancels, 1);
    assert_true(pd_grpc_call_is_cancelled(held));
    assert_int_equal(pd_grpc_call_send(held, &rep.base), PD_ERR_CANCELLED);
    assert_int_equal(pd_grpc_call_finish(held, 0, NULL), PD_ERR_CANCELLED);
    pd_grpc_server_stats_t s;
    pd_grpc_server_stats(srv, &s);
    assert_int_equal(s.active_calls, 0);
    teardown_conn();
}

static void test_deadline(void **state)
{
    uint8_t body[64];
    size_t n = echo_body(body, "hold");
    (void)state;

    setup_conn(0);
    stream_t *st = request_ex("POST", "/pdtest.Echo/Unary", "application/grpc", "30m", body, n);
    pump();
    assert_non_null(held);
    assert_true(pd_grpc_call_deadline_ms(held) <= 30);
    while (!st->closed) {
        uv_run(&loop, UV_RUN_ONCE);
        pump();
    }
    expect(st, 200, PD_GRPC_DEADLINE_EXCEEDED, "deadline");
    assert_int_equal(cancels, 1);
    assert_int_equal(pd_grpc_call_finish(held, 0, NULL), PD_ERR_CANCELLED);
    teardown_conn();
}

static void test_destroy_with_held_call(void **state)
{
    uint8_t body[64];
    size_t n = echo_body(body, "hold");
    Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
    (void)state;

    setup_conn(0);
    request("/pdtest.Echo/Unary", body, n);
    pump();
    assert_non_null(held);
    pd_grpc_server_destroy(srv); /* the call stays valid, detached */
    assert_int_equal(cancels, 1);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(pd_grpc_call_send(held, &rep.base), PD_ERR_CANCELLED);
    assert_int_equal(pd_grpc_call_finish(held, 0, NULL), PD_ERR_CANCELLED);
    nghttp2_session_del(cli);
    assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_shutdown_drains(void **state)
{
    uint8_t body[64];
    size_t n = echo_body(body, "hold");
    Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
    (void)state;

    setup_conn(0);
    stream_t *st = request("/pdtest.Echo/Unary", body, n);
    pump();
    pd_grpc_server_shutdown(srv);
    pd_grpc_server_shutdown(srv);
    pump();
    assert_true(goaway_seen);
    assert_false(st->closed);
    rep.text = "late";
    assert_int_equal(pd_grpc_call_send(held, &rep.base), PD_OK);
    assert_int_equal(pd_grpc_call_finish(held, 0, NULL), PD_OK);
    pump();
    expect(st, 200, 0, NULL);
    assert_int_equal(cancels, 0);
    nghttp2_submit_ping(cli, NGHTTP2_FLAG_NONE, NULL); /* nudges the server to notice it is done */
    pump();
    assert_true(conn_gone);
    teardown_conn();
}

static void test_garbage_connection(void **state)
{
    (void)state;
    setup_conn(0);
    assert_true(
        PD_IS_ERR(pd_grpc_server__fake_feed(conn, (const uint8_t *)"GET / HTTP/1.1\r\n\r\n", 18)));
    conn_gone = 1;
    teardown_conn();
}

/* The server's sweep timer does not keep the loop alive: a ticking timer does, while tests wait. */
static uv_timer_t tick;

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

static void tick_start(void)
{
    uv_timer_init(&loop, &tick);
    uv_timer_start(&tick, on_tick, 5, 5);
}

static void tick_stop(void)
{
    uv_close((uv_handle_t *)&tick, NULL);
}

/* Runs the loop (timers) and moves bytes until cond holds. */
#define RUN_UNTIL(cond)                                                                            \
    do {                                                                                           \
        while (!(cond)) {                                                                          \
            uv_run(&loop, UV_RUN_ONCE);                                                            \
            if (!conn_gone)                                                                        \
                pump();                                                                            \
        }                                                                                          \
    } while (0)

static void test_idle_timeout(void **state)
{
    pd_grpc_server_params_t p = {.idle_timeout_ms = 50};
    pd_grpc_server_stats_t s;
    uint8_t body[64];
    size_t n = echo_body(body, "late");
    (void)state;

    /* nothing on the connection: the shutdown notice and a PING; an nghttp2 client without
     * streams treats the notice as the end and does not answer the PING, so the server cuts the
     * connection after its grace time */
    setup_conn_params(&p);
    tick_start();
    RUN_UNTIL(conn_gone);
    assert_int_equal(goaway_seen, 1);
    assert_int_equal(goaway_error, NGHTTP2_NO_ERROR);
    assert_int_equal(goaway_last_id, INT32_MAX);
    pd_grpc_server_stats(srv, &s);
    assert_int_equal(s.idle_closed, 1);
    assert_int_equal(s.connections, 0);
    tick_stop();
    teardown_conn();

    /* a stream the client sends before it sees the notice is served; the PING's ack brings the
     * final GOAWAY (last stream: that one), then the connection closes once the stream is done */
    setup_conn_params(&p);
    tick_start();
    hold_output = 1;
    while (held_len == 0) /* the notice and the PING, held back */
        uv_run(&loop, UV_RUN_ONCE);
    stream_t *st = request("/pdtest.Echo/Unary", body, n);
    pump(); /* the request reaches the server after its notice */
    hold_output = 0;
    assert_true(nghttp2_session_mem_recv(cli, held_out, held_len) == (ssize_t)held_len);
    RUN_UNTIL(conn_gone);
    expect(st, 200, 0, NULL); /* a GOAWAY right away (last stream 0) would have refused it */
    assert_int_equal(goaway_last_id, INT32_MAX); /* the client ignores the final one: closing */
    tick_stop();
    teardown_conn();
}

static void test_busy_connection_not_idle(void **state)
{
    pd_grpc_server_params_t p = {.idle_timeout_ms = 30};
    uint8_t body[64];
    size_t n = echo_body(body, "hold");
    (void)state;

    setup_conn_params(&p);
    stream_t *st = request("/pdtest.Echo/Unary", body, n);
    pump();
    assert_non_null(held);
    /* ten idle timeouts with a call open: no GOAWAY (waiting for the absence of an event needs a
     * time; the loop's own timer measures it) */
    tick_start();
    uint64_t until = uv_now(&loop) + 300;
    while (uv_now(&loop) < until) {
        uv_run(&loop, UV_RUN_ONCE);
        pump();
    }
    assert_int_equal(goaway_seen, 0);
    assert_int_equal(pd_grpc_call_finish(held, 0, NULL), PD_OK);
    RUN_UNTIL(conn_gone);
    expect(st, 200, 0, NULL);
    assert_int_equal(goaway_seen, 1);
    tick_stop();
    teardown_conn();
}

static void test_request_timeout(void **state)
{
    pd_grpc_server_params_t p = {.request_timeout_ms = 40};
    nghttp2_nv nv[6] = {NV(":method", "POST"),
                        NV(":scheme", "http"),
                        NV(":path", "/pdtest.Echo/Unary"),
                        NV(":authority", "test"),
                        NV("content-type", "application/grpc"),
                        NV("te", "trailers")};
    pd_grpc_server_stats_t s;
    uint8_t body[64];
    size_t n = echo_body(body, "ok");
    (void)state;

    setup_conn_params(&p);
    tick_start();
    /* headers without END_STREAM, and no message ever */
    stream_t *late = &streams[n_streams++];
    late->grpc_status = -1;
    late->id = nghttp2_submit_headers(cli, NGHTTP2_FLAG_NONE, -1, NULL, nv, 6, NULL);
    assert_true(late->id > 0);
    RUN_UNTIL(late->closed);
    expect(late, 200, PD_GRPC_DEADLINE_EXCEEDED, "request not received within 40 ms");
    pd_grpc_server_stats(srv, &s);
    assert_int_equal(s.request_timeouts, 1);
    assert_int_equal(s.active_calls, 0);
    /* the connection still serves */
    stream_t *ok = request("/pdtest.Echo/Unary", body, n);
    pump();
    expect(ok, 200, 0, NULL);
    tick_stop();
    teardown_conn();
}

static void test_ping_flood(void **state)
{
    pd_grpc_server_stats_t s;
    (void)state;

    setup_conn(0);
    for (int i = 0; i < 50; i++) /* a burst within the budget */
        nghttp2_submit_ping(cli, NGHTTP2_FLAG_NONE, NULL);
    pump();
    assert_int_equal(goaway_seen, 0);
    for (int i = 0; i < 100; i++)
        nghttp2_submit_ping(cli, NGHTTP2_FLAG_NONE, NULL);
    pump();
    assert_true(goaway_seen);
    assert_int_equal(goaway_error, NGHTTP2_ENHANCE_YOUR_CALM);
    assert_true(conn_gone);
    pd_grpc_server_stats(srv, &s);
    assert_int_equal(s.flood_closed, 1);
    teardown_conn();

    /* SETTINGS count too */
    setup_conn(0);
    for (int i = 0; i < 150; i++)
        nghttp2_submit_settings(cli, NGHTTP2_FLAG_NONE, NULL, 0);
    pump();
    assert_int_equal(goaway_error, NGHTTP2_ENHANCE_YOUR_CALM);
    assert_true(conn_gone);
    teardown_conn();

    /* one SETTINGS frame with more than 32 entries */
    nghttp2_settings_entry iv[40];
    for (int i = 0; i < 40; i++)
        iv[i] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 65535};
    setup_conn(0);
    nghttp2_submit_settings(cli, NGHTTP2_FLAG_NONE, iv, 40);
    pump();
    assert_true(goaway_seen);
    assert_true(conn_gone);
    teardown_conn();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_calls),
        cmocka_unit_test(test_malformed_requests),
        cmocka_unit_test(test_error_message_encoding),
        cmocka_unit_test(test_client_reset_cancels),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_destroy_with_held_call),
        cmocka_unit_test(test_shutdown_drains),
        cmocka_unit_test(test_garbage_connection),
        cmocka_unit_test(test_idle_timeout),
        cmocka_unit_test(test_busy_connection_not_idle),
        cmocka_unit_test(test_request_timeout),
        cmocka_unit_test(test_ping_flood),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
