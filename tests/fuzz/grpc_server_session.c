/* libFuzzer target for pd_grpc_server: raw bytes from a client go into a server session through an
 * in-memory connection (pd_grpc_server__fake_open), split at the positions byte 0 encodes. The
 * service answers at once (Unary), streams (Stream), or holds the call past the session's end
 * (Stats), so the cancel and detach paths run too. Every input ends with the server destroyed and
 * the loop closed: leaks and use-after-free show up under ASan. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_health.h"
#include "fuzz_verdict.h"
#include "grpc_server.h"
#include "testsvc.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static pd_grpc_call_t *held[16];
static int n_held;
static int n_handled; /* Echo handler invocations for this input: the verdict */

static void on_cancel(pd_grpc_call_t *call, void *arg)
{
    (void)arg;
    for (int i = 0; i < n_held; i++)
        if (held[i] == call) {
            held[i] = held[--n_held];
            pd_grpc_call_finish(call, 1, NULL);
            return;
        }
}

static void h_unary(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    n_handled++;
    const Pdtest__EchoRequest *r = (const void *)req;
    Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
    (void)user;
    rep.text = r->text;
    rep.payload = r->payload;
    pd_grpc_call_send(call, &rep.base);
    pd_grpc_call_finish(call, r->error_code & 15, r->error_message);
}

static void h_stream(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    n_handled++;
    const Pdtest__StreamRequest *r = (const void *)req;
    (void)user;
    for (int i = 0; i < (r->count & 63); i++) {
        Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
        rep.seq = i;
        if (pd_grpc_call_send(call, &rep.base) != PD_OK)
            break;
    }
    pd_grpc_call_finish(call, 0, NULL);
}

static void h_hold(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    n_handled++;
    (void)req;
    (void)user;
    if (n_held == 16) {
        pd_grpc_call_finish(call, 8, "full");
        return;
    }
    held[n_held++] = call;
    pd_grpc_call_set_cancel_cb(call, on_cancel, NULL);
}

static const pd_grpc_method_fn handlers[4] = {h_unary, h_stream, h_hold, NULL};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    uv_loop_t loop;
    pd_grpc_server_t *srv;
    pd_grpc_health_t *health;
    pd_grpc_server__conn_t *conn;
    pd_grpc_server_params_t params = {.max_recv_msg_size = 4096, .send_high_watermark = 1024};
    size_t split;

    if (size < 1)
        return 0;
    split = data[0];
    data++;
    size--;
    n_handled = 0;
    uv_loop_init(&loop);
    pd_grpc_server_create(&loop, &params, &srv);
    pd_grpc_server_add_service(srv, &pdtest__echo__descriptor, handlers, NULL);
    pd_grpc_health_create(srv, &health);
    pd_grpc_server__fake_open(srv, NULL, NULL, &conn);
    /* inputs need not repeat the client preface: prepend it when missing */
    int ok = 1;
    if (size < 24 || memcmp(data, preface, 24) != 0)
        ok = pd_grpc_server__fake_feed(conn, (const uint8_t *)preface, 24) == PD_OK;
    for (size_t off = 0; ok && off < size;) {
        size_t c = split ? (size_t)split * 7 : size;
        if (c > size - off)
            c = size - off;
        ok = pd_grpc_server__fake_feed(conn, data + off, c) == PD_OK;
        off += c;
        uv_run(&loop, UV_RUN_NOWAIT);
    }
    if (ok && (split & 1))
        pd_grpc_server__fake_close(conn);
    else if (ok)
        pd_grpc_server_shutdown(srv);
    pd_grpc_server_destroy(srv);
    pd_grpc_health_destroy(health);
    while (n_held > 0) /* calls detached by destroy that had no cancel (finished ones) */
        pd_grpc_call_finish(held[--n_held], 0, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0)
        abort();
    /* "echo": some call reached a pdtest.Echo handler; "no-echo": none did (bad content type,
     * too large, truncated, unknown method: the server answered with an error or reset; or the
     * input called only the health service) */
    fuzz_verdict = n_handled > 0 ? "echo" : "no-echo";
    return 0;
}
