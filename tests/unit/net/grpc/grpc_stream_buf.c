/* Tests common/net/grpc/grpc_stream_buf.c: a server-streaming call (pdtest.Echo/Stream) whose
 * handler hands its call to a stream buffer, with a raw nghttp2 client on an in-memory connection
 * (pd_grpc_server__fake_open) that controls how fast it reads (its own HTTP/2 window updates).
 * Output reaches the client in order, coalesced while the client does not read; the final message
 * and status follow the output; a client that cancels before or after the end (output still
 * queued) releases the call. Each test ends with no call held (server stats) and
 * uv_loop_close() == 0; run under -Dsanitize=true for leaks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <nghttp2/nghttp2.h>

#include "grpc_server.h"
#include "grpc_stream_buf.h"
#include "testsvc.pb-c.h"

static uv_loop_t loop;
static pd_grpc_server_t *srv;
static pd_grpc_server__conn_t *conn;
static nghttp2_session *cli;
static int32_t sid;
static uint8_t *rx; /* DATA bytes the client received on the stream */
static size_t rx_len, rx_consumed;
static int closed, grpc_status;
static uint32_t rst;
static char grpc_message[256];

/* the owner's side */
static pd_grpc_stream_buf_t *sb;
static int n_sends, n_again, n_final_again, n_released, n_cancelled, end_in_cancel;

/* ==== the owner: output is EchoReply{text, payload = the int32 ids}; final is seq -1 ==== */

static pd_status_t send_output(pd_grpc_call_t *call, const int32_t *ids, size_t n_ids,
                               const char *text, size_t text_len, void *arg)
{
    Pdtest__EchoReply m = PDTEST__ECHO_REPLY__INIT;
    (void)arg;
    assert_int_equal(strlen(text), text_len);
    m.text = (char *)text;
    m.payload.data = (uint8_t *)ids;
    m.payload.len = n_ids * sizeof *ids;
    pd_status_t st = pd_grpc_call_send(call, &m.base);
    n_sends++;
    n_again += st == PD_AGAIN;
    return st;
}

static pd_status_t send_final(pd_grpc_call_t *call, void *arg)
{
    Pdtest__EchoReply m = PDTEST__ECHO_REPLY__INIT;
    (void)arg;
    m.text = "final";
    m.seq = -1;
    pd_status_t st = pd_grpc_call_send(call, &m.base);
    n_final_again += st == PD_AGAIN;
    return st;
}

static void on_released(void *arg)
{
    assert_ptr_equal(arg, &sb);
    sb = NULL;
    n_released++;
}

static void on_cancelled(void *arg)
{
    assert_ptr_equal(arg, &sb);
    n_cancelled++;
    if (end_in_cancel) /* the router's way: end at once */
        pd_grpc_stream_buf_end(sb, PD_ERR_CANCELLED, NULL);
}

static const pd_grpc_stream_buf_ops_t ops = {send_output, send_final, on_cancelled, on_released};

static void h_stream(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    (void)req;
    (void)user;
    assert_null(sb);
    assert_int_equal(pd_grpc_stream_buf_create(call, &ops, &sb, &sb), PD_OK);
}

static const pd_grpc_method_fn handlers[4] = {NULL, h_stream, NULL, NULL};

/* ==== the raw client ==== */

static int c_on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
                       size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                       void *u)
{
    char v[256];
    (void)s;
    (void)flags;
    (void)u;
    if (f->hd.stream_id != sid)
        return 0;
    snprintf(v, sizeof v, "%.*s", (int)valuelen, value);
    if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0)
        grpc_status = atoi(v);
    else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0)
        snprintf(grpc_message, sizeof grpc_message, "%s", v);
    return 0;
}

static int c_on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *d, size_t n,
                     void *u)
{
    (void)s;
    (void)flags;
    (void)u;
    if (id != sid)
        return 0;
    rx = realloc(rx, rx_len + n);
    assert_non_null(rx);
    memcpy(rx + rx_len, d, n);
    rx_len += n;
    return 0;
}

static int c_on_close(nghttp2_session *s, int32_t id, uint32_t err, void *u)
{
    (void)s;
    (void)u;
    if (id == sid) {
        closed = 1;
        rst = err;
    }
    return 0;
}

static void srv_out(void *arg, const uint8_t *data, size_t len)
{
    (void)arg;
    assert_true(nghttp2_session_mem_recv(cli, data, len) == (ssize_t)len);
}

/* Moves bytes both ways and runs due callbacks until nothing moves. */
static void pump(void)
{
    for (int idle = 0; idle < 2;) {
        const uint8_t *d;
        ssize_t n;
        int moved = 0;
        uv_run(&loop, UV_RUN_NOWAIT);
        while (conn && (n = nghttp2_session_mem_send(cli, &d)) > 0) {
            uint8_t *copy = malloc((size_t)n);
            memcpy(copy, d, (size_t)n);
            if (pd_grpc_server__fake_feed(conn, copy, (size_t)n) != PD_OK)
                conn = NULL;
            free(copy);
            moved = 1;
        }
        idle = moved ? 0 : idle + 1;
    }
}

/* The client reads what it received so far (window updates go out), then pumps. */
static void client_read(void)
{
    if (rx_len > rx_consumed && !closed) {
        assert_int_equal(nghttp2_session_consume(cli, sid, rx_len - rx_consumed), 0);
        rx_consumed = rx_len;
    }
    pump();
}

/* the request: one framed StreamRequest */
static uint8_t body[16];
static size_t body_len, body_off;

static ssize_t c_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                      nghttp2_data_source *src, void *u)
{
    size_t n = body_len - body_off;
    (void)s;
    (void)id;
    (void)src;
    (void)u;
    if (n > len)
        n = len;
    memcpy(buf, body + body_off, n);
    body_off += n;
    if (body_off == body_len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

#define NV(k, v)                                                                                   \
    {                                                                                              \
        (uint8_t *)(k), (uint8_t *)(v), strlen(k), strlen(v), NGHTTP2_NV_FLAG_NONE                 \
    }

/* A server with a small per-call send watermark and a client whose stream window is window
 * bytes and who reads only when told (client_read); starts one Stream call. */
static void setup(int32_t window)
{
    nghttp2_session_callbacks *cbs;
    nghttp2_option *opt;
    pd_grpc_server_params_t p = {.send_high_watermark = 64};
    nghttp2_settings_entry set = {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)window};
    Pdtest__StreamRequest req = PDTEST__STREAM_REQUEST__INIT;
    nghttp2_nv nv[6] = {NV(":method", "POST"),
                        NV(":scheme", "http"),
                        NV(":path", "/pdtest.Echo/Stream"),
                        NV(":authority", "test"),
                        NV("content-type", "application/grpc"),
                        NV("te", "trailers")};
    nghttp2_data_provider prd = {.read_callback = c_body};

    rx = NULL;
    rx_len = rx_consumed = 0;
    closed = rst = 0;
    grpc_status = -1;
    grpc_message[0] = 0;
    sb = NULL;
    n_sends = n_again = n_final_again = n_released = n_cancelled = end_in_cancel = 0;
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(pd_grpc_server_create(&loop, &p, &srv), PD_OK);
    assert_int_equal(pd_grpc_server_add_service(srv, &pdtest__echo__descriptor, handlers, NULL),
                     PD_OK);
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_header_callback(cbs, c_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, c_on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, c_on_close);
    nghttp2_option_new(&opt);
    nghttp2_option_set_no_auto_window_update(opt, 1);
    assert_int_equal(nghttp2_session_client_new2(&cli, cbs, NULL, opt), 0);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_submit_settings(cli, NGHTTP2_FLAG_NONE, &set, 1);
    assert_int_equal(pd_grpc_server__fake_open(srv, srv_out, NULL, &conn), PD_OK);
    body_len = protobuf_c_message_pack(&req.base, body + 5) + 5;
    pd_grpc_wire_prefix(body, (uint32_t)(body_len - 5));
    body_off = 0;
    sid = nghttp2_submit_request(cli, NULL, nv, 6, &prd, NULL);
    assert_true(sid > 0);
    pump();
    assert_non_null(sb); /* the handler ran */
}

/* No call held, no cancel or release missed; closes everything. */
static void teardown(void)
{
    pd_grpc_server_stats_t s;
    pd_grpc_server_stats(srv, &s);
    assert_int_equal(s.active_calls, 0);
    pd_grpc_server_destroy(srv);
    nghttp2_session_del(cli);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    free(rx);
}

/* The messages the client received: their text concatenated, their ids, and how many; the last
 * one's seq in *last_seq. */
static int parse(char *text, size_t text_cap, int32_t *ids, size_t *n_ids, int *last_seq)
{
    size_t off = 0, tl = 0;
    int n = 0;
    *n_ids = 0;
    *last_seq = 0;
    text[0] = 0;
    while (off + 5 <= rx_len) {
        uint32_t len = (uint32_t)rx[off + 1] << 24 | (uint32_t)rx[off + 2] << 16 |
                       (uint32_t)rx[off + 3] << 8 | rx[off + 4];
        assert_true(off + 5 + len <= rx_len);
        Pdtest__EchoReply *m = pdtest__echo_reply__unpack(NULL, len, rx + off + 5);
        assert_non_null(m);
        if (m->seq != -1) {
            size_t l = strlen(m->text);
            assert_true(tl + l < text_cap);
            memcpy(text + tl, m->text, l + 1);
            tl += l;
            memcpy(ids + *n_ids, m->payload.data, m->payload.len);
            *n_ids += m->payload.len / sizeof *ids;
        }
        *last_seq = m->seq;
        pdtest__echo_reply__free_unpacked(m, NULL);
        off += 5 + len;
        n++;
    }
    assert_int_equal(off, rx_len);
    return n;
}

/* Appends n pieces ("t000", "t001", ... with id i) while the client does not read. */
static void produce(int n)
{
    for (int i = 0; i < n; i++) {
        char t[8];
        int32_t id = i;
        snprintf(t, sizeof t, "t%03d", i);
        assert_int_equal(pd_grpc_stream_buf_append(sb, &id, 1, t, 4), PD_OK);
        pump();
    }
}

static void expect_all(int n, int final_seq)
{
    char text[4096], want[4096];
    int32_t ids[1024];
    size_t n_ids;
    int last;
    int msgs = parse(text, sizeof text, ids, &n_ids, &last);
    want[0] = 0;
    for (int i = 0; i < n; i++)
        snprintf(want + 4 * i, sizeof want - 4 * (size_t)i, "t%03d", i);
    assert_string_equal(text, want);
    assert_int_equal(n_ids, n);
    for (int i = 0; i < n; i++)
        assert_int_equal(ids[i], i);
    assert_int_equal(last, final_seq);
    assert_true(msgs <= n + 1);
}

/* ==== tests ==== */

static void test_fast_client(void **state)
{
    (void)state;
    setup(65535);
    produce(5);
    assert_int_equal(n_again, 0);
    pd_grpc_stream_buf_end(sb, PD_OK, NULL);
    assert_int_equal(n_released, 1); /* nothing queued: released at once */
    pump();
    assert_true(closed);
    assert_int_equal(grpc_status, 0);
    expect_all(5, -1);
    assert_int_equal(n_cancelled, 0);
    teardown();
}

static void test_slow_client_coalesces(void **state)
{
    size_t qi, qt;
    (void)state;
    setup(16);
    produce(100);
    assert_true(n_again > 0);
    pd_grpc_stream_buf_queued(sb, &qi, &qt);
    assert_true(qi > 1 && qt == 4 * qi); /* several pieces wait as one message */
    pd_grpc_stream_buf_end(sb, PD_OK, NULL);
    assert_int_equal(n_released, 0); /* the final waits for the client */
    assert_false(closed);
    for (int i = 0; i < 10000 && !closed; i++)
        client_read();
    assert_true(closed);
    assert_int_equal(rst, 0);
    assert_int_equal(grpc_status, 0);
    assert_int_equal(n_released, 1);
    expect_all(100, -1);
    assert_true(n_sends < 100 + n_again); /* queued pieces went out together */
    /* the last queued output filled the call's send buffer, so the final message had to wait
     * for the writable callback too (both earlier copies of this logic dropped it there) */
    assert_true(n_final_again > 0);
    teardown();
}

static void test_error_after_output(void **state)
{
    (void)state;
    setup(16);
    produce(40);
    pd_grpc_stream_buf_end(sb, PD_ERR_UNAVAILABLE, "decode node gone");
    assert_int_equal(n_released, 0);
    for (int i = 0; i < 10000 && !closed; i++)
        client_read();
    assert_true(closed);
    assert_int_equal(grpc_status, 14);
    assert_string_equal(grpc_message, "decode node gone");
    assert_int_equal(n_released, 1);
    expect_all(40, 0); /* all output, no final message */
    teardown();
}

/* The decode node's leak: the last event came while output was queued, then the client
 * cancelled. The call must be released without an end from the owner. */
static void test_cancel_after_end_with_output_queued(void **state)
{
    size_t qi, qt;
    (void)state;
    setup(16);
    produce(60);
    pd_grpc_stream_buf_queued(sb, &qi, &qt);
    assert_true(qi > 0);
    pd_grpc_stream_buf_end(sb, PD_OK, NULL);
    assert_int_equal(n_released, 0);
    assert_int_equal(nghttp2_submit_rst_stream(cli, NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL), 0);
    pump();
    assert_int_equal(n_released, 1);
    assert_int_equal(n_cancelled, 0); /* already ended: the owner is not asked again */
    teardown();                       /* active_calls == 0 */
}

/* Cancel before the end: the owner hears of it, appends are refused, its end releases. */
static void test_cancel_before_end(void **state)
{
    int32_t id = 7;
    (void)state;
    setup(16);
    produce(60);
    assert_int_equal(nghttp2_submit_rst_stream(cli, NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL), 0);
    pump();
    assert_int_equal(n_cancelled, 1);
    assert_int_equal(n_released, 0); /* the owner still ends it (the decode node: later) */
    assert_int_equal(pd_grpc_stream_buf_append(sb, &id, 1, "x", 1), PD_ERR_CANCELLED);
    pd_grpc_stream_buf_end(sb, PD_OK, NULL);
    assert_int_equal(n_released, 1);
    teardown();
}

/* Cancel before the end, the owner ends inside the callback (the router's Generate). */
static void test_cancel_end_in_callback(void **state)
{
    (void)state;
    setup(65535);
    produce(3);
    end_in_cancel = 1;
    assert_int_equal(nghttp2_submit_rst_stream(cli, NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL), 0);
    pump();
    assert_int_equal(n_cancelled, 1);
    assert_int_equal(n_released, 1);
    teardown();
}

/* The server goes away while the final waits for a slow client: released. */
static void test_server_destroyed_while_final_waits(void **state)
{
    (void)state;
    setup(16);
    produce(60);
    pd_grpc_stream_buf_end(sb, PD_OK, NULL);
    assert_int_equal(n_released, 0);
    pd_grpc_server_destroy(srv);
    conn = NULL;
    assert_int_equal(n_released, 1);
    nghttp2_session_del(cli);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    free(rx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_client),
        cmocka_unit_test(test_slow_client_coalesces),
        cmocka_unit_test(test_error_after_output),
        cmocka_unit_test(test_cancel_after_end_with_output_queued),
        cmocka_unit_test(test_cancel_before_end),
        cmocka_unit_test(test_cancel_end_in_callback),
        cmocka_unit_test(test_server_destroyed_while_final_waits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
