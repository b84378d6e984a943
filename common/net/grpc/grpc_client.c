#include "grpc_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "log.h"

#define PD_GRPC_CLIENT__WRITE_CHUNK (64u << 10)
#define PD_GRPC_CLIENT__WINDOW (4 << 20)

typedef struct pd_grpc_client__conn pd_grpc_client__conn_t;

struct pd_grpc_client_call {
    pd_grpc_client_t *c;
    pd_grpc_client__conn_t *conn;       /* NULL when not on a connection */
    pd_grpc_client_call_t *prev, *next; /* c->calls */
    pd_grpc_client_call_t *done_next;   /* c->done_head queue */
    int32_t stream_id;                  /* 0 = not submitted */
    unsigned stream_open : 1, finished : 1, delivered : 1, queued : 1, unary : 1;
    char *path;
    uint8_t *req; /* (req_len) framed request */
    size_t req_len, req_off;
    pd_grpc_wire_md_list_t md; /* custom request metadata */
    const ProtobufCMessageDescriptor *resp_desc;
    pd_grpc_client_unary_cb unary_cb;
    pd_grpc_client_msg_cb msg_cb;
    pd_grpc_client_done_cb done_cb;
    void *arg;
    int64_t deadline_at; /* uv_now ms, -1 none */
    uv_timer_t *timer;
    pd_grpc_wire_deframer_t df;
    ProtobufCMessage *resp;
    int n_msgs;
    int http_status, grpc_status; /* grpc_status -1: none received */
    char *grpc_message;           /* decoded, from the response */
    int final_code;
    char *final_msg;
};

struct pd_grpc_client__conn {
    pd_grpc_client_t *c;
    pd_grpc_client__conn_t *prev, *next;
    uv_getaddrinfo_t gai;
    uv_connect_t connect_req;
    uv_tcp_t tcp;
    nghttp2_session *ng;
    int ready;
    unsigned resolving : 1, tcp_init : 1, in_recv : 1, flushing : 1, closing : 1, goaway : 1;
    size_t write_pending;
    /* TLS (pd_grpc_client_set_tls): the session and its memory BIOs (network -> rbio -> ssl ->
     * nghttp2, nghttp2 -> ssl -> wbio -> network); ready once the handshake chose h2 */
    SSL *ssl;
    BIO *rbio, *wbio;
};

struct pd_grpc_client {
    uv_loop_t *loop;
    char *host;
    int port;
    size_t max_recv;
    uv_timer_t kick; /* zero-delay: submits pending calls, delivers done callbacks */
    pd_grpc_client__conn_t *cur;
    pd_grpc_client__conn_t *conns;
    pd_grpc_client_call_t *calls;
    pd_grpc_client_call_t *done_head, *done_tail;
    pd_grpc_client_call_t *delivering_call; /* whose done callback runs now (on_kick frees it) */
    int destroyed, pending_closes, delivering;
    SSL_CTX *tls;   /* NULL: h2c */
    char *tls_name; /* SNI and the name (or IP address) the certificate must carry */
};

static void pd_grpc_client__free(pd_grpc_client_t *c)
{
    SSL_CTX_free(c->tls);
    free(c->tls_name);
    free(c->host);
    free(c);
}

typedef struct {
    uv_write_t req;
    pd_grpc_client__conn_t *conn;
    size_t len;
    uint8_t data[];
} pd_grpc_client__write_t;

static void pd_grpc_client__flush(pd_grpc_client__conn_t *conn);
static void pd_grpc_client__conn_close(pd_grpc_client__conn_t *conn, const char *why);
static void pd_grpc_client__write_done(uv_write_t *req, int status);
static void pd_grpc_client__kick(pd_grpc_client_t *c);

/* ==== calls ==== */

static void pd_grpc_client__timer_closed(uv_handle_t *h)
{
    free(h);
}

static void pd_grpc_client__call_free(pd_grpc_client_call_t *call)
{
    pd_grpc_client_t *c = call->c;

    if (call->prev)
        call->prev->next = call->next;
    else
        c->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    if (call->timer) {
        uv_timer_stop(call->timer);
        uv_close((uv_handle_t *)call->timer, pd_grpc_client__timer_closed);
    }
    pd_grpc_wire_md_deinit(&call->md);
    free(call->path);
    free(call->req);
    pd_grpc_wire_deframer_deinit(&call->df);
    if (call->resp)
        protobuf_c_message_free_unpacked(call->resp, NULL);
    free(call->grpc_message);
    free(call->final_msg);
    free(call);
}

/* Decides the final status (first decision wins) and queues the done callback. */
static void pd_grpc_client__call_finish(pd_grpc_client_call_t *call, int code, const char *msg)
{
    pd_grpc_client_t *c = call->c;

    if (call->finished)
        return;
    call->finished = 1;
    call->final_code = code;
    call->final_msg = strdup(msg ? msg : "");
    if (call->timer)
        uv_timer_stop(call->timer);
    call->queued = 1;
    call->done_next = NULL;
    if (c->done_tail)
        c->done_tail->done_next = call;
    else
        c->done_head = call;
    c->done_tail = call;
    pd_grpc_client__kick(c);
}

static void pd_grpc_client__call_deliver(pd_grpc_client_call_t *call)
{
    const char *msg = call->final_msg ? call->final_msg : "";

    call->delivered = 1;
    if (call->unary) {
        ProtobufCMessage *resp = NULL;
        if (call->final_code == PD_GRPC_OK) {
            resp = call->resp;
            call->resp = NULL;
        }
        call->unary_cb(call->arg, call->final_code, msg, resp);
    } else {
        call->done_cb(call->arg, call->final_code, msg);
    }
}

/* Ends the stream of a finished call on the wire (RST_STREAM CANCEL) when it is still open. */
static void pd_grpc_client__call_reset(pd_grpc_client_call_t *call)
{
    if (call->stream_open && call->conn && call->conn->ng) {
        nghttp2_submit_rst_stream(call->conn->ng, NGHTTP2_FLAG_NONE, call->stream_id,
                                  NGHTTP2_CANCEL);
        pd_grpc_client__flush(call->conn);
    }
}

static void pd_grpc_client__deadline(uv_timer_t *t)
{
    pd_grpc_client_call_t *call = t->data;

    pd_grpc_client__call_finish(call, PD_GRPC_DEADLINE_EXCEEDED, "deadline exceeded");
    pd_grpc_client__call_reset(call);
}

void pd_grpc_client_call_cancel(pd_grpc_client_call_t *call)
{
    if (call->finished)
        return;
    pd_grpc_client__call_finish(call, PD_GRPC_CANCELLED, "cancelled");
    pd_grpc_client__call_reset(call);
}

/* The status of a call whose stream closed without a local decision. */
static void pd_grpc_client__call_closed(pd_grpc_client_call_t *call, uint32_t error_code)
{
    char msg[96];

    if (call->grpc_status >= 0) {
        if (call->grpc_status == PD_GRPC_OK && call->unary && !call->resp)
            pd_grpc_client__call_finish(call, PD_GRPC_INTERNAL, "no response message");
        else
            pd_grpc_client__call_finish(call, call->grpc_status,
                                        call->grpc_message ? call->grpc_message : "");
    } else if (call->http_status != 0 && call->http_status != 200) {
        snprintf(msg, sizeof msg, "http status %d", call->http_status);
        pd_grpc_client__call_finish(call, pd_grpc_wire_http_to_grpc(call->http_status), msg);
    } else if (error_code == NGHTTP2_REFUSED_STREAM) {
        pd_grpc_client__call_finish(call, PD_GRPC_UNAVAILABLE, "stream refused");
    } else if (error_code == NGHTTP2_CANCEL) {
        pd_grpc_client__call_finish(call, PD_GRPC_CANCELLED, "stream cancelled by server");
    } else if (error_code != NGHTTP2_NO_ERROR) {
        snprintf(msg, sizeof msg, "stream reset by server (http/2 error %u)", error_code);
        pd_grpc_client__call_finish(call, PD_GRPC_INTERNAL, msg);
    } else {
        pd_grpc_client__call_finish(call, PD_GRPC_INTERNAL, "missing grpc-status");
    }
}

/* ==== nghttp2 callbacks ==== */

static ssize_t pd_grpc_client__data_read(nghttp2_session *ng, int32_t stream_id, uint8_t *buf,
                                         size_t length, uint32_t *data_flags,
                                         nghttp2_data_source *source, void *user_data)
{
    pd_grpc_client_call_t *call = source->ptr;
    size_t n = call->req_len - call->req_off;
    (void)ng;
    (void)stream_id;
    (void)user_data;

    if (n > length)
        n = length;
    memcpy(buf, call->req + call->req_off, n);
    call->req_off += n;
    if (call->req_off == call->req_len)
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static int pd_grpc_client__on_header(nghttp2_session *ng, const nghttp2_frame *frame,
                                     const uint8_t *name, size_t namelen, const uint8_t *value,
                                     size_t valuelen, uint8_t flags, void *user_data)
{
    pd_grpc_client_call_t *call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    (void)flags;
    (void)user_data;

    if (!call || frame->hd.type != NGHTTP2_HEADERS)
        return 0;
#define IS(lit) (namelen == sizeof(lit) - 1 && memcmp(name, lit, namelen) == 0)
    if (IS(":status")) {
        call->http_status = 0;
        for (size_t i = 0; i < valuelen && i < 3; i++)
            call->http_status = call->http_status * 10 + (value[i] - '0');
    } else if (IS("grpc-status")) {
        int v = 0;
        for (size_t i = 0; i < valuelen && i < 3; i++)
            v = v * 10 + (value[i] >= '0' && value[i] <= '9' ? value[i] - '0' : 0);
        call->grpc_status = v;
    } else if (IS("grpc-message")) {
        free(call->grpc_message);
        call->grpc_message = pd_grpc_wire_pct_decode((const char *)value, valuelen);
    }
#undef IS
    return 0;
}

static int pd_grpc_client__on_data(nghttp2_session *ng, uint8_t flags, int32_t stream_id,
                                   const uint8_t *data, size_t len, void *user_data)
{
    pd_grpc_client_call_t *call = nghttp2_session_get_stream_user_data(ng, stream_id);
    (void)flags;
    (void)user_data;

    while (call && !call->finished && len > 0) {
        const uint8_t *msg;
        size_t used, mlen;
        pd_status_t st = pd_grpc_wire_deframer_feed(&call->df, data, len, &used, &msg, &mlen);
        if (st != PD_OK) {
            pd_grpc_client__call_finish(
                call, st == PD_ERR_RESOURCE ? PD_GRPC_RESOURCE_EXHAUSTED : PD_GRPC_INTERNAL,
                st == PD_ERR_RESOURCE ? "response message too large" : "invalid response framing");
            nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL);
            return 0;
        }
        data += used;
        len -= used;
        if (!msg)
            continue;
        ProtobufCMessage *m = protobuf_c_message_unpack(call->resp_desc, NULL, mlen, msg);
        if (!m || (call->unary && call->resp)) {
            if (m)
                protobuf_c_message_free_unpacked(m, NULL);
            pd_grpc_client__call_finish(call, PD_GRPC_INTERNAL,
                                        m ? "too many responses" : "failed to parse response");
            nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL);
            return 0;
        }
        call->n_msgs++;
        if (call->unary)
            call->resp = m;
        else
            call->msg_cb(call->arg, m);
    }
    return 0;
}

static int pd_grpc_client__on_stream_close(nghttp2_session *ng, int32_t stream_id,
                                           uint32_t error_code, void *user_data)
{
    pd_grpc_client_call_t *call = nghttp2_session_get_stream_user_data(ng, stream_id);
    (void)user_data;

    if (!call)
        return 0;
    nghttp2_session_set_stream_user_data(ng, stream_id, NULL);
    call->stream_open = 0;
    call->conn = NULL;
    pd_grpc_client__call_closed(call, error_code);
    if (call->delivered)
        pd_grpc_client__call_free(call);
    return 0;
}

static int pd_grpc_client__on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame,
                                         void *user_data)
{
    pd_grpc_client__conn_t *conn = user_data;
    (void)ng;

    if (frame->hd.type == NGHTTP2_GOAWAY) {
        conn->goaway = 1;
        if (conn->c->cur == conn)
            conn->c->cur = NULL; /* later calls open a new connection */
    }
    return 0;
}

/* ==== connections ==== */

static void pd_grpc_client__conn_closed(uv_handle_t *h)
{
    pd_grpc_client__conn_t *conn = h->data;
    pd_grpc_client_t *c = conn->c;

    SSL_free(conn->ssl); /* and its BIOs */
    free(conn);
    c->pending_closes--;
    if (c->destroyed && c->pending_closes == 0) {
        pd_grpc_client__free(c);
    }
}

/* Fails the connection's calls with UNAVAILABLE (why) and closes it. Not inside nghttp2
 * callbacks. */
static void pd_grpc_client__conn_close(pd_grpc_client__conn_t *conn, const char *why)
{
    pd_grpc_client_t *c = conn->c;

    if (conn->closing)
        return;
    conn->closing = 1;
    if (c->cur == conn)
        c->cur = NULL;
    if (conn->ng)
        nghttp2_session_del(conn->ng);
    conn->ng = NULL;
    for (pd_grpc_client_call_t *call = c->calls, *next; call; call = next) {
        next = call->next;
        if (call->conn != conn)
            continue;
        call->conn = NULL;
        call->stream_open = 0;
        pd_grpc_client__call_finish(call, PD_GRPC_UNAVAILABLE, why);
        if (call->delivered && call != c->delivering_call)
            pd_grpc_client__call_free(call);
    }
    if (conn->prev)
        conn->prev->next = conn->next;
    else
        c->conns = conn->next;
    if (conn->next)
        conn->next->prev = conn->prev;
    if (conn->resolving) {
        uv_cancel((uv_req_t *)&conn->gai); /* the callback sees closing and frees conn */
        return;
    }
    if (!conn->tcp_init) {
        SSL_free(conn->ssl);
        free(conn);
        return;
    }
    c->pending_closes++;
    uv_close((uv_handle_t *)&conn->tcp, pd_grpc_client__conn_closed);
}

static void pd_grpc_client__write_done(uv_write_t *req, int status)
{
    pd_grpc_client__write_t *w = (pd_grpc_client__write_t *)req;
    pd_grpc_client__conn_t *conn = w->conn;

    conn->write_pending -= w->len;
    free(w);
    if (conn->closing)
        return;
    if (status < 0) {
        pd_grpc_client__conn_close(conn, "connection lost (write failed)");
        return;
    }
    pd_grpc_client__flush(conn);
}

/* TLS: writes what the session has put into wbio (records, handshake messages). 0 or -1 (out of
 * memory or the write failed to start). Never frees conn. */
static int pd_grpc_client__tls_send(pd_grpc_client__conn_t *conn)
{
    size_t n;
    while ((n = BIO_ctrl_pending(conn->wbio)) > 0) {
        pd_grpc_client__write_t *w = malloc(sizeof *w + n);
        if (!w)
            return -1;
        w->conn = conn;
        w->len = (size_t)BIO_read(conn->wbio, w->data, (int)n);
        uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
        if (uv_write(&w->req, (uv_stream_t *)&conn->tcp, &b, 1, pd_grpc_client__write_done) < 0) {
            free(w);
            return -1;
        }
        conn->write_pending += w->len;
    }
    return 0;
}

/* Writes what nghttp2 has to send. Never frees conn. */
static void pd_grpc_client__flush(pd_grpc_client__conn_t *conn)
{
    if (conn->in_recv || conn->flushing || conn->closing || !conn->ng)
        return;
    conn->flushing = 1;
    while (nghttp2_session_want_write(conn->ng)) {
        pd_grpc_client__write_t *w = malloc(sizeof *w + PD_GRPC_CLIENT__WRITE_CHUNK);
        if (!w)
            break;
        w->conn = conn;
        w->len = 0;
        while (w->len < PD_GRPC_CLIENT__WRITE_CHUNK) {
            const uint8_t *data;
            ssize_t n = nghttp2_session_mem_send(conn->ng, &data);
            if (n <= 0)
                break;
            if (w->len + (size_t)n > PD_GRPC_CLIENT__WRITE_CHUNK) {
                pd_grpc_client__write_t *nw = realloc(w, sizeof *w + w->len + (size_t)n);
                if (!nw)
                    break;
                w = nw;
            }
            memcpy(w->data + w->len, data, (size_t)n);
            w->len += (size_t)n;
        }
        if (w->len == 0) {
            free(w);
            break;
        }
        if (conn->ssl) { /* encrypt: the plaintext goes into ssl, the records come out of wbio */
            int ok = SSL_write(conn->ssl, w->data, (int)w->len) == (int)w->len;
            free(w);
            if (!ok || pd_grpc_client__tls_send(conn) != 0)
                break;
            continue;
        }
        uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
        if (uv_write(&w->req, (uv_stream_t *)&conn->tcp, &b, 1, pd_grpc_client__write_done) < 0) {
            free(w);
            break;
        }
        conn->write_pending += w->len;
    }
    conn->flushing = 0;
}

static void pd_grpc_client__alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    buf->base = malloc(suggested);
    buf->len = buf->base ? suggested : 0;
}

static pd_status_t pd_grpc_client__session_new(pd_grpc_client__conn_t *conn);

/* The OpenSSL error queue as one line (and cleared) */
static const char *pd_grpc_client__tls_err(char *buf, size_t cap)
{
    unsigned long e = ERR_get_error();
    if (!e)
        snprintf(buf, cap, "connection closed during the handshake");
    else
        ERR_error_string_n(e, buf, cap);
    ERR_clear_error();
    return buf;
}

/* TLS: encrypted bytes from the network. Drives the handshake (then checks ALPN h2 and starts
 * the HTTP/2 session), or decrypts into nghttp2. May close conn (never frees it). */
/* Feeds n bytes the server sent (plaintext h2) to the session. -1: a protocol error, the
 * connection is closed. */
static int pd_grpc_client__feed(pd_grpc_client__conn_t *conn, const uint8_t *data, size_t n)
{
    conn->in_recv = 1;
    ssize_t rv = n > 0 ? nghttp2_session_mem_recv(conn->ng, data, n) : 0;
    conn->in_recv = 0;
    if (rv < 0) {
        pd_log_warn("grpc client: %s:%d: session recv: %s", conn->c->host, conn->c->port,
                    nghttp2_strerror((int)rv));
        pd_grpc_client__conn_close(conn, "http/2 protocol error");
        return -1;
    }
    return 0;
}

/* After what was read is fed: send what the session has to say, close a finished session. */
static void pd_grpc_client__recv_done(pd_grpc_client__conn_t *conn)
{
    pd_grpc_client__flush(conn);
    if (!nghttp2_session_want_read(conn->ng) && !nghttp2_session_want_write(conn->ng) &&
        conn->write_pending == 0)
        pd_grpc_client__conn_close(conn, "connection closed (goaway)");
}

static void pd_grpc_client__tls_recv(pd_grpc_client__conn_t *conn, const uint8_t *data, size_t n)
{
    pd_grpc_client_t *c = conn->c;
    char why[400], err[256];
    uint8_t plain[16384];
    if (n > 0 && BIO_write(conn->rbio, data, (int)n) != (int)n) {
        pd_grpc_client__conn_close(conn, "out of memory");
        return;
    }
    if (!conn->ready) {
        int rc = SSL_do_handshake(conn->ssl);
        (void)pd_grpc_client__tls_send(conn);
        if (rc != 1) {
            int e = SSL_get_error(conn->ssl, rc);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
                return;
            long v = SSL_get_verify_result(conn->ssl);
            snprintf(why, sizeof why, "tls handshake with %s:%d (%s): %s", c->host, c->port,
                     c->tls_name,
                     v != X509_V_OK ? X509_verify_cert_error_string(v)
                                    : pd_grpc_client__tls_err(err, sizeof err));
            ERR_clear_error();
            pd_log_warn("grpc client: %s", why);
            pd_grpc_client__conn_close(conn, why);
            return;
        }
        const unsigned char *alpn = NULL;
        unsigned alpn_len = 0;
        SSL_get0_alpn_selected(conn->ssl, &alpn, &alpn_len);
        if (alpn_len != 2 || memcmp(alpn, "h2", 2) != 0) {
            snprintf(why, sizeof why, "tls to %s:%d: the server did not choose h2 (alpn)", c->host,
                     c->port);
            pd_log_warn("grpc client: %s", why);
            pd_grpc_client__conn_close(conn, why);
            return;
        }
        if (pd_grpc_client__session_new(conn) != PD_OK) {
            pd_grpc_client__conn_close(conn, "out of memory");
            return;
        }
        conn->ready = 1;
        pd_grpc_client__kick(c); /* submits the waiting calls */
    }
    for (;;) {
        int got = SSL_read(conn->ssl, plain, (int)sizeof plain);
        if (got <= 0) {
            int e = SSL_get_error(conn->ssl, got);
            if (e == SSL_ERROR_WANT_READ)
                break;
            if (e == SSL_ERROR_ZERO_RETURN) {
                pd_grpc_client__conn_close(conn, "connection closed by server");
                return;
            }
            snprintf(why, sizeof why, "tls: %s", pd_grpc_client__tls_err(err, sizeof err));
            pd_grpc_client__conn_close(conn, why);
            return;
        }
        if (pd_grpc_client__feed(conn, plain, (size_t)got) != 0)
            return;
    }
    pd_grpc_client__recv_done(conn);
}

static void pd_grpc_client__on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    pd_grpc_client__conn_t *conn = s->data;
    int rv;

    if (nread < 0) {
        free(buf->base);
        pd_grpc_client__conn_close(conn, "connection closed by server");
        return;
    }
    if (conn->ssl) {
        pd_grpc_client__tls_recv(conn, (const uint8_t *)buf->base, (size_t)nread);
        free(buf->base);
        return;
    }
    rv = pd_grpc_client__feed(conn, (const uint8_t *)buf->base, (size_t)nread);
    free(buf->base);
    if (rv == 0)
        pd_grpc_client__recv_done(conn);
}

static pd_status_t pd_grpc_client__session_new(pd_grpc_client__conn_t *conn)
{
    nghttp2_session_callbacks *cbs;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, PD_GRPC_CLIENT__WINDOW},
    };
    int rv;

    if (nghttp2_session_callbacks_new(&cbs) != 0)
        return PD_ERR_NOMEM;
    nghttp2_session_callbacks_set_on_header_callback(cbs, pd_grpc_client__on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, pd_grpc_client__on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, pd_grpc_client__on_stream_close);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, pd_grpc_client__on_frame_recv);
    rv = nghttp2_session_client_new(&conn->ng, cbs, conn);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0)
        return PD_ERR_NOMEM;
    nghttp2_submit_settings(conn->ng, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]);
    nghttp2_session_set_local_window_size(conn->ng, NGHTTP2_FLAG_NONE, 0,
                                          4 * PD_GRPC_CLIENT__WINDOW);
    return PD_OK;
}

/* TLS: a session on memory BIOs with SNI (names only) and the certificate's name or address to
 * check, and the ClientHello sent. */
static pd_status_t pd_grpc_client__tls_start(pd_grpc_client__conn_t *conn)
{
    pd_grpc_client_t *c = conn->c;
    unsigned char ip[16];
    const int is_ip =
        inet_pton(AF_INET, c->tls_name, ip) == 1 || inet_pton(AF_INET6, c->tls_name, ip) == 1;
    if (!(conn->ssl = SSL_new(c->tls)) || !(conn->rbio = BIO_new(BIO_s_mem())) ||
        !(conn->wbio = BIO_new(BIO_s_mem()))) {
        BIO_free(conn->rbio);
        conn->rbio = NULL;
        return PD_ERR_NOMEM;
    }
    SSL_set_bio(conn->ssl, conn->rbio, conn->wbio); /* the session owns them now */
    SSL_set_connect_state(conn->ssl);
    if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(conn->ssl), c->tls_name) != 1
              : (SSL_set_tlsext_host_name(conn->ssl, c->tls_name) != 1 ||
                 SSL_set1_host(conn->ssl, c->tls_name) != 1))
        return PD_ERR_NOMEM;
    int rc = SSL_do_handshake(conn->ssl);
    if (rc != 1 && SSL_get_error(conn->ssl, rc) != SSL_ERROR_WANT_READ)
        return PD_ERR_IO;
    return pd_grpc_client__tls_send(conn) == 0 ? PD_OK : PD_ERR_NOMEM;
}

static void pd_grpc_client__on_connect(uv_connect_t *req, int status)
{
    pd_grpc_client__conn_t *conn = req->data;
    char why[128];

    if (conn->closing)
        return;
    if (status < 0) {
        snprintf(why, sizeof why, "connect to %s:%d: %s", conn->c->host, conn->c->port,
                 uv_strerror(status));
        pd_log_debug("grpc client: %s", why);
        pd_grpc_client__conn_close(conn, why);
        return;
    }
    uv_tcp_nodelay(&conn->tcp, 1);
    if (conn->c->tls) {
        if (pd_grpc_client__tls_start(conn) != PD_OK) {
            pd_grpc_client__conn_close(conn, "tls: cannot start a session");
            return;
        }
        uv_read_start((uv_stream_t *)&conn->tcp, pd_grpc_client__alloc, pd_grpc_client__on_read);
        return; /* ready when the handshake is done (pd_grpc_client__tls_recv) */
    }
    if (pd_grpc_client__session_new(conn) != PD_OK) {
        pd_grpc_client__conn_close(conn, "out of memory");
        return;
    }
    uv_read_start((uv_stream_t *)&conn->tcp, pd_grpc_client__alloc, pd_grpc_client__on_read);
    conn->ready = 1;
    pd_grpc_client__kick(conn->c); /* submits the waiting calls */
}

static void pd_grpc_client__on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    pd_grpc_client__conn_t *conn = req->data;
    pd_grpc_client_t *c = conn->c;
    char why[128];
    int rc;

    conn->resolving = 0;
    if (conn->closing) { /* closed while resolving: conn_close left the memory to us */
        uv_freeaddrinfo(res);
        free(conn);
        return;
    }
    if (status < 0) {
        snprintf(why, sizeof why, "resolve %s: %s", c->host, uv_strerror(status));
        pd_log_debug("grpc client: %s", why);
        pd_grpc_client__conn_close(conn, why);
        return;
    }
    uv_tcp_init(c->loop, &conn->tcp);
    conn->tcp.data = conn;
    conn->tcp_init = 1;
    conn->connect_req.data = conn;
    rc = uv_tcp_connect(&conn->connect_req, &conn->tcp, res->ai_addr, pd_grpc_client__on_connect);
    uv_freeaddrinfo(res);
    if (rc < 0) {
        snprintf(why, sizeof why, "connect to %s:%d: %s", c->host, c->port, uv_strerror(rc));
        pd_grpc_client__conn_close(conn, why);
    }
}

/* Returns the connection new calls go to, starting one when there is none, or NULL. */
static pd_grpc_client__conn_t *pd_grpc_client__conn_get(pd_grpc_client_t *c)
{
    pd_grpc_client__conn_t *conn;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    char port[16];
    int rc;

    if (c->cur)
        return c->cur;
    conn = calloc(1, sizeof *conn);
    if (!conn)
        return NULL;
    conn->c = c;
    conn->gai.data = conn;
    snprintf(port, sizeof port, "%d", c->port);
    rc = uv_getaddrinfo(c->loop, &conn->gai, pd_grpc_client__on_resolved, c->host, port, &hints);
    if (rc < 0) {
        pd_log_error("grpc client: resolve %s: %s", c->host, uv_strerror(rc));
        free(conn);
        return NULL;
    }
    conn->resolving = 1;
    conn->next = c->conns;
    if (c->conns)
        c->conns->prev = conn;
    c->conns = conn;
    c->cur = conn;
    return conn;
}

/* ==== submission and delivery ==== */

static void pd_grpc_client__submit(pd_grpc_client_call_t *call)
{
    pd_grpc_client__conn_t *conn = call->conn;
    pd_grpc_client_t *c = call->c;
    char authority[300], timeout[16];
    nghttp2_nv nv[8 + 32];
    size_t n = 0;
    int32_t id;
#define NV(k, v, vl)                                                                               \
    (nghttp2_nv){(uint8_t *)(k), (uint8_t *)(v), strlen(k), (vl), NGHTTP2_NV_FLAG_NONE}

    snprintf(authority, sizeof authority, "%s:%d", c->host, c->port);
    nv[n++] = NV(":method", "POST", 4);
    nv[n++] = c->tls ? NV(":scheme", "https", 5) : NV(":scheme", "http", 4);
    nv[n++] = NV(":path", call->path, strlen(call->path));
    nv[n++] = NV(":authority", authority, strlen(authority));
    nv[n++] = NV("content-type", "application/grpc", 16);
    nv[n++] = NV("te", "trailers", 8);
    nv[n++] = NV("user-agent", "pdserve-grpc-c/0.1", 18);
    if (call->deadline_at >= 0) {
        pd_grpc_wire_timeout_format(timeout, sizeof timeout,
                                    call->deadline_at - (int64_t)uv_now(c->loop));
        nv[n++] = NV("grpc-timeout", timeout, strlen(timeout));
    }
    for (size_t i = 0; i < call->md.n && n < sizeof nv / sizeof nv[0]; i++)
        nv[n++] =
            NV(call->md.items[i].key, call->md.items[i].value, strlen(call->md.items[i].value));
#undef NV
    nghttp2_data_provider prd = {.source.ptr = call, .read_callback = pd_grpc_client__data_read};
    id = nghttp2_submit_request(conn->ng, NULL, nv, n, &prd, call);
    if (id < 0) {
        pd_log_warn("grpc client: %s: submit: %s", call->path, nghttp2_strerror(id));
        call->conn = NULL;
        pd_grpc_client__call_finish(call, PD_GRPC_UNAVAILABLE, "cannot start stream");
        return;
    }
    call->stream_id = id;
    call->stream_open = 1;
}

static void pd_grpc_client__on_kick(uv_timer_t *t)
{
    pd_grpc_client_t *c = t->data;

    /* submit calls waiting for a ready connection */
    for (pd_grpc_client_call_t *call = c->calls; call; call = call->next)
        if (!call->finished && !call->stream_open && call->conn && call->conn->ready &&
            !call->conn->closing)
            pd_grpc_client__submit(call);
    for (pd_grpc_client__conn_t *conn = c->conns; conn; conn = conn->next)
        if (conn->ready)
            pd_grpc_client__flush(conn);
    /* deliver done callbacks; a callback may destroy the client */
    c->delivering = 1;
    while (c->done_head && !c->destroyed) {
        pd_grpc_client_call_t *call = c->done_head;
        c->done_head = call->done_next;
        if (!c->done_head)
            c->done_tail = NULL;
        call->queued = 0;
        c->delivering_call = call;
        pd_grpc_client__call_deliver(call);
        c->delivering_call = NULL;
        if (c->destroyed)
            break; /* pd_grpc_client_destroy freed every call */
        if (!call->stream_open)
            pd_grpc_client__call_free(call);
    }
    if (c->destroyed) {
        c->pending_closes--;
        if (c->pending_closes == 0) {
            pd_grpc_client__free(c);
        }
        return;
    }
    c->delivering = 0;
}

static void pd_grpc_client__kick(pd_grpc_client_t *c)
{
    if (!c->destroyed)
        uv_timer_start(&c->kick, pd_grpc_client__on_kick, 0, 0);
}

static pd_status_t pd_grpc_client__start(pd_grpc_client_t *c, const char *path,
                                         const ProtobufCMessage *req,
                                         const ProtobufCMessageDescriptor *resp_desc,
                                         int64_t timeout_ms, pd_grpc_client_call_t **call_p)
{
    pd_grpc_client_call_t *call = calloc(1, sizeof *call);
    size_t len = protobuf_c_message_get_packed_size(req);

    if (len > UINT32_MAX) {
        free(call);
        pd_log_error("grpc client: %s: request of %zu bytes too large", path, len);
        return PD_ERR_INVALID;
    }
    if (!call || !(call->path = strdup(path)) || !(call->req = malloc(PD_GRPC_WIRE_HDR_LEN + len)))
        goto err_free_call;
    call->c = c;
    call->req_len = PD_GRPC_WIRE_HDR_LEN + len;
    pd_grpc_wire_prefix(call->req, (uint32_t)len);
    protobuf_c_message_pack(req, call->req + PD_GRPC_WIRE_HDR_LEN);
    call->resp_desc = resp_desc;
    call->grpc_status = -1;
    call->deadline_at = -1;
    pd_grpc_wire_deframer_init(&call->df, c->max_recv);
    if (timeout_ms > 0) {
        call->timer = malloc(sizeof *call->timer);
        if (!call->timer)
            goto err_free_call;
        call->deadline_at = (int64_t)uv_now(c->loop) + timeout_ms;
        uv_timer_init(c->loop, call->timer);
        call->timer->data = call;
        uv_timer_start(call->timer, pd_grpc_client__deadline, (uint64_t)timeout_ms, 0);
    }
    call->next = c->calls;
    if (c->calls)
        c->calls->prev = call;
    c->calls = call;
    call->conn = pd_grpc_client__conn_get(c);
    if (!call->conn)
        pd_grpc_client__call_finish(call, PD_GRPC_UNAVAILABLE, "cannot start connection");
    pd_grpc_client__kick(c);
    *call_p = call;
    return PD_OK;

err_free_call:
    pd_log_error("grpc client: %s: out of memory", path);
    if (call) {
        free(call->path);
        free(call->req);
        free(call);
    }
    return PD_ERR_NOMEM;
}

pd_status_t pd_grpc_client_unary(pd_grpc_client_t *c, const char *path, const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                                 pd_grpc_client_unary_cb cb, void *arg,
                                 pd_grpc_client_call_t **call_p)
{
    pd_grpc_client_call_t *call;
    pd_status_t st = pd_grpc_client__start(c, path, req, resp_desc, timeout_ms, &call);

    if (st != PD_OK)
        return st;
    call->unary = 1;
    call->unary_cb = cb;
    call->arg = arg;
    if (call_p)
        *call_p = call;
    return PD_OK;
}

pd_status_t pd_grpc_client_stream(pd_grpc_client_t *c, const char *path,
                                  const ProtobufCMessage *req,
                                  const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                                  pd_grpc_client_msg_cb on_message, pd_grpc_client_done_cb on_done,
                                  void *arg, pd_grpc_client_call_t **call_p)
{
    pd_grpc_client_call_t *call;
    pd_status_t st = pd_grpc_client__start(c, path, req, resp_desc, timeout_ms, &call);

    if (st != PD_OK)
        return st;
    call->msg_cb = on_message;
    call->done_cb = on_done;
    call->arg = arg;
    if (call_p)
        *call_p = call;
    return PD_OK;
}

pd_status_t pd_grpc_client_call_add_metadata(pd_grpc_client_call_t *call, const char *key,
                                             const char *value)
{
    if (call->stream_id != 0 || call->finished)
        return PD_ERR_INVALID;
    return pd_grpc_wire_md_add(&call->md, key, strlen(key), value, strlen(value));
}

/* ==== client ==== */

pd_status_t pd_grpc_client_create(uv_loop_t *loop, const char *host, int port,
                                  pd_grpc_client_t **c_p)
{
    pd_grpc_client_t *c = calloc(1, sizeof *c);

    if (!c || !(c->host = strdup(host))) {
        free(c);
        pd_log_error("grpc client: out of memory");
        return PD_ERR_NOMEM;
    }
    c->loop = loop;
    c->port = port;
    c->max_recv = 4u << 20;
    uv_timer_init(loop, &c->kick);
    c->kick.data = c;
    *c_p = c;
    return PD_OK;
}

pd_status_t pd_grpc_client_set_tls(pd_grpc_client_t *c, const pd_grpc_client_tls_t *tls)
{
    static const unsigned char alpn[] = {2, 'h', '2'};
    const char *name = tls->server_name && *tls->server_name ? tls->server_name : c->host;
    char err[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    char *dup = strdup(name);
    if (!ctx || !dup) {
        SSL_CTX_free(ctx);
        free(dup);
        pd_log_error("grpc client: tls: out of memory");
        return PD_ERR_NOMEM;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    int loaded = tls->ca_file && *tls->ca_file
                     ? SSL_CTX_load_verify_locations(ctx, tls->ca_file, NULL)
                     : SSL_CTX_set_default_verify_paths(ctx);
    if (loaded != 1 || SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn) != 0) {
        ERR_error_string_n(ERR_get_error(), err, sizeof err);
        ERR_clear_error();
        pd_log_error("grpc client: tls: CA file %s: %s",
                     tls->ca_file && *tls->ca_file ? tls->ca_file : "(system default)", err);
        SSL_CTX_free(ctx);
        free(dup);
        return PD_ERR_IO;
    }
    SSL_CTX_free(c->tls);
    free(c->tls_name);
    c->tls = ctx;
    c->tls_name = dup;
    return PD_OK;
}

void pd_grpc_client_set_max_recv(pd_grpc_client_t *c, size_t bytes)
{
    c->max_recv = bytes;
}

void pd_grpc_client_reset(pd_grpc_client_t *c, const char *why)
{
    while (c->conns)
        pd_grpc_client__conn_close(c->conns, why ? why : "connection reset");
}

static void pd_grpc_client__kick_closed(uv_handle_t *h)
{
    pd_grpc_client_t *c = h->data;

    c->pending_closes--;
    if (c->pending_closes == 0) {
        pd_grpc_client__free(c);
    }
}

void pd_grpc_client_destroy(pd_grpc_client_t *c)
{
    if (!c)
        return;
    for (pd_grpc_client_call_t *call = c->calls; call; call = call->next)
        pd_grpc_client__call_finish(call, PD_GRPC_CANCELLED, "client destroyed");
    while (c->conns)
        pd_grpc_client__conn_close(c->conns, "client destroyed");
    /* deliver everything queued, then free every call */
    while (c->done_head) {
        pd_grpc_client_call_t *call = c->done_head;
        c->done_head = call->done_next;
        call->queued = 0;
        if (!call->delivered)
            pd_grpc_client__call_deliver(call);
    }
    c->done_tail = NULL;
    while (c->calls)
        pd_grpc_client__call_free(c->calls);
    c->destroyed = 1;
    c->pending_closes++;
    uv_timer_stop(&c->kick);
    uv_close((uv_handle_t *)&c->kick, pd_grpc_client__kick_closed);
    if (c->delivering)
        c->pending_closes++; /* released by the delivery loop we are inside of */
}
