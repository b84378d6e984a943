#include "grpc_server.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nghttp2/nghttp2.h>

#include "conn_limit.h"
#include "log.h"

#define PD_GRPC_SERVER__WRITE_LIMIT (1u << 20)  /* pending socket bytes before output pauses */
#define PD_GRPC_SERVER__WRITE_CHUNK (64u << 10) /* bytes gathered per uv_write */
#define PD_GRPC_SERVER__MD_LIMIT (16u << 10)    /* metadata bytes kept per call */
#define PD_GRPC_SERVER__WINDOW (1 << 20)        /* stream and connection receive window */
#define PD_GRPC_SERVER__CTRL_BURST 100.0        /* PING/SETTINGS/PRIORITY/empty DATA in a burst */
#define PD_GRPC_SERVER__CTRL_RATE 10.0          /* ... and per second on average */
#define PD_GRPC_SERVER__GRACE_MS 5000           /* a closing connection's writes and PING ack */
static const uint8_t pd_grpc_server__idle_ping[8] = {'p', 'd', '-', 'i', 'd', 'l', 'e', 0};

typedef struct {
    const ProtobufCServiceDescriptor *desc;
    const pd_grpc_method_fn *handlers;
    void *user;
} pd_grpc_server__svc_t;

struct pd_grpc_call {
    pd_grpc_server_t *srv;        /* NULL once detached by pd_grpc_server_destroy */
    pd_grpc_server__conn_t *conn; /* NULL once the connection is gone */
    pd_grpc_call_t *prev, *next;  /* srv->calls */
    int32_t stream_id;
    unsigned stream_ref : 1;  /* the HTTP/2 stream is open */
    unsigned handler_ref : 1; /* a handler holds the call (until finish) */
    unsigned dispatched : 1, cancelled : 1, status_set : 1, headers_sent : 1;
    unsigned remote_closed : 1, data_deferred : 1, bad_headers : 1, is_post : 1;
    unsigned want_writable : 1, writable_pending : 1, cancel_fired : 1;
    /* request */
    char *path, *content_type;
    int64_t deadline_at; /* uv_now() ms, or -1 */
    pd_grpc_wire_md_list_t md; /* custom request metadata */
    pd_grpc_wire_deframer_t df;
    int n_msgs;
    ProtobufCMessage *req;
    const ProtobufCMessageDescriptor *in_desc;
    pd_grpc_method_fn fn;
    void *user;
    uv_timer_t *timer;
    uint64_t started_at; /* uv_now() of the request's first HEADERS */
    /* response */
    uint8_t *sbuf; /* (scap) framed response bytes; [soff, slen) still to send */
    size_t slen, soff, scap;
    int status_code;
    char *status_msg; /* percent-encoded, or NULL */
    void (*cancel_cb)(pd_grpc_call_t *, void *);
    void *cancel_arg;
    void (*writable_cb)(pd_grpc_call_t *, void *);
    void *writable_arg;
};

struct pd_grpc_server__conn {
    pd_grpc_server_t *srv;
    pd_grpc_server__conn_t *prev, *next;
    uv_tcp_t tcp;
    int fake;
    void (*out)(void *arg, const uint8_t *data, size_t len);
    void *out_arg;
    nghttp2_session *ng;
    size_t write_pending;
    unsigned in_recv : 1, flushing : 1, closing : 1, reading : 1, writable_pending : 1;
    unsigned idle_notice : 1, idle_goaway : 1, flooded : 1;
    uint32_t n_streams;  /* open streams with a call */
    uint64_t idle_since; /* uv_now() when n_streams became 0 */
    uint64_t close_by;   /* uv_now() after which a closing connection is cut; 0: none */
    double ctrl_tokens;  /* control-frame budget */
    uint64_t ctrl_at;    /* uv_now() of its last refill */
};

struct pd_grpc_server {
    uv_loop_t *loop;
    pd_grpc_server_params_t params;
    pd_grpc_server__svc_t *svcs;
    size_t n_svcs;
    pd_grpc_auth_fn auth; /* checked before every call is dispatched (pd_grpc_server_set_auth) */
    void *auth_arg;
    uv_tcp_t listener;
    int listening, shutting_down, destroyed;
    int pending_closes; /* handles whose close callback has not run */
    pd_grpc_server__conn_t *conns;
    pd_grpc_call_t *calls;
    uint64_t n_calls, n_conns;
    conn_limit_t limit;
    uv_timer_t sweep; /* idle connections and late requests; unreferenced */
    int sweep_open;
    uint64_t idle_closed, flood_closed, request_timeouts;
};

typedef struct {
    uv_write_t req;
    pd_grpc_server__conn_t *conn;
    size_t len;
    uint8_t data[];
} pd_grpc_server__write_t;

static int pd_grpc_server__flush(pd_grpc_server__conn_t *conn, int run_cbs);
static void pd_grpc_server__conn_close(pd_grpc_server__conn_t *conn);

/* ==== calls ==== */

static void pd_grpc_server__timer_closed(uv_handle_t *h)
{
    free(h);
}

static void pd_grpc_server__call_free(pd_grpc_call_t *call)
{
    pd_grpc_server_t *srv = call->srv;

    if (srv) {
        if (call->prev)
            call->prev->next = call->next;
        else
            srv->calls = call->next;
        if (call->next)
            call->next->prev = call->prev;
        srv->n_calls--;
    }
    if (call->timer) {
        uv_timer_stop(call->timer);
        uv_close((uv_handle_t *)call->timer, pd_grpc_server__timer_closed);
    }
    pd_grpc_wire_md_deinit(&call->md);
    free(call->path);
    free(call->content_type);
    pd_grpc_wire_deframer_deinit(&call->df);
    if (call->req)
        protobuf_c_message_free_unpacked(call->req, NULL);
    free(call->sbuf);
    free(call->status_msg);
    free(call);
}

static void pd_grpc_server__call_maybe_free(pd_grpc_call_t *call)
{
    if (!call->stream_ref && !call->handler_ref)
        pd_grpc_server__call_free(call);
}

/* Marks the call cancelled and runs its cancel callback when a handler holds it. The call may be
 * freed on return (the callback may finish it): touch nothing afterwards. */
static void pd_grpc_server__call_cancel(pd_grpc_call_t *call)
{
    if (call->cancelled)
        return;
    call->cancelled = 1;
    call->slen = call->soff = 0;
    call->want_writable = call->writable_pending = 0;
    if (call->handler_ref && call->cancel_cb && !call->cancel_fired) {
        call->cancel_fired = 1;
        call->cancel_cb(call, call->cancel_arg);
        return;
    }
    pd_grpc_server__call_maybe_free(call);
}

static int pd_grpc_server__trailer_nv(pd_grpc_call_t *call, nghttp2_nv *nv, char *code_buf)
{
    int n = 0;

    snprintf(code_buf, 12, "%d", call->status_code);
    nv[n++] = (nghttp2_nv){(uint8_t *)"grpc-status", (uint8_t *)code_buf, 11, strlen(code_buf),
                           NGHTTP2_NV_FLAG_NONE};
    if (call->status_msg && call->status_msg[0])
        nv[n++] = (nghttp2_nv){(uint8_t *)"grpc-message", (uint8_t *)call->status_msg, 12,
                               strlen(call->status_msg), NGHTTP2_NV_FLAG_NONE};
    return n;
}

#define PD_GRPC_SERVER__NV(k, v)                                                                   \
    (nghttp2_nv)                                                                                   \
    {                                                                                              \
        (uint8_t *)(k), (uint8_t *)(v), sizeof(k) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE             \
    }

static ssize_t pd_grpc_server__data_read(nghttp2_session *ng, int32_t stream_id, uint8_t *buf,
                                         size_t length, uint32_t *data_flags,
                                         nghttp2_data_source *source, void *user_data)
{
    pd_grpc_call_t *call = source->ptr;
    pd_grpc_server__conn_t *conn = user_data;
    size_t n = call->slen - call->soff;
    size_t hw = conn->srv->params.send_high_watermark;

    if (n > length)
        n = length;
    memcpy(buf, call->sbuf + call->soff, n);
    call->soff += n;
    if (call->soff == call->slen)
        call->soff = call->slen = 0;
    if (call->want_writable && call->slen - call->soff <= hw / 2) {
        call->want_writable = 0;
        call->writable_pending = 1;
        conn->writable_pending = 1;
    }
    if (call->slen == 0 && call->status_set) {
        nghttp2_nv nv[2];
        char code[12];
        int nnv = pd_grpc_server__trailer_nv(call, nv, code);
        int rv;
        *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        rv = nghttp2_submit_trailer(ng, stream_id, nv, (size_t)nnv);
        if (rv != 0) {
            pd_log_error("grpc server: stream %d: submit trailer: %s", stream_id,
                         nghttp2_strerror(rv));
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        }
        return (ssize_t)n;
    }
    if (n == 0) {
        call->data_deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    }
    return (ssize_t)n;
}

static pd_status_t pd_grpc_server__submit_headers(pd_grpc_call_t *call)
{
    nghttp2_nv nv[] = {PD_GRPC_SERVER__NV(":status", "200"),
                       PD_GRPC_SERVER__NV("content-type", "application/grpc")};
    nghttp2_data_provider prd = {.source.ptr = call, .read_callback = pd_grpc_server__data_read};
    int rv = nghttp2_submit_response(call->conn->ng, call->stream_id, nv, 2, &prd);

    if (rv != 0) {
        pd_log_error("grpc server: stream %d: submit response: %s", call->stream_id,
                     nghttp2_strerror(rv));
        return PD_ERR_INTERNAL;
    }
    call->headers_sent = 1;
    return PD_OK;
}

/* Decides the call's final status and queues the trailers (after queued data), or a
 * trailers-only response with http_status when no headers went out yet. */
static void pd_grpc_server__call_end(pd_grpc_call_t *call, int http_status, int code,
                                     const char *msg)
{
    if (call->status_set)
        return;
    call->status_set = 1;
    call->status_code = code;
    call->status_msg = msg && msg[0] ? pd_grpc_wire_pct_encode(msg) : NULL;
    if (!call->stream_ref || !call->conn || call->conn->closing)
        return;
    if (!call->headers_sent) {
        nghttp2_nv nv[4];
        char status[8], codebuf[12];
        snprintf(status, sizeof status, "%d", http_status);
        nv[0] = PD_GRPC_SERVER__NV(":status", status);
        nv[1] = PD_GRPC_SERVER__NV("content-type", "application/grpc");
        int n = 2 + pd_grpc_server__trailer_nv(call, nv + 2, codebuf);
        int rv = nghttp2_submit_response(call->conn->ng, call->stream_id, nv, (size_t)n, NULL);
        if (rv != 0)
            pd_log_error("grpc server: stream %d: submit trailers-only: %s", call->stream_id,
                         nghttp2_strerror(rv));
        call->headers_sent = 1;
    } else if (call->data_deferred) {
        call->data_deferred = 0;
        nghttp2_session_resume_data(call->conn->ng, call->stream_id);
    }
}

static void pd_grpc_server__deadline(uv_timer_t *t)
{
    pd_grpc_call_t *call = t->data;
    pd_grpc_server__conn_t *conn = call->conn;

    if (call->status_set && !call->handler_ref)
        return;
    pd_log_debug("grpc server: stream %d %s: deadline exceeded", call->stream_id,
                 call->path ? call->path : "");
    call->slen = call->soff = 0;
    pd_grpc_server__call_end(call, 200, PD_GRPC_DEADLINE_EXCEEDED, "deadline exceeded");
    pd_grpc_server__call_cancel(call); /* stream_ref is set, so call survives a finish in the cb */
    if (conn)
        pd_grpc_server__flush(conn, 1);
}

pd_status_t pd_grpc_call_send(pd_grpc_call_t *call, const ProtobufCMessage *msg)
{
    size_t len, need, hw;

    if (!call->handler_ref || call->status_set)
        return call->cancelled ? PD_ERR_CANCELLED : PD_ERR_INVALID;
    if (call->cancelled || !call->stream_ref || !call->conn || call->conn->closing)
        return PD_ERR_CANCELLED;
    hw = call->conn->srv->params.send_high_watermark;
    if (call->slen - call->soff >= hw) {
        call->want_writable = 1;
        return PD_AGAIN;
    }
    len = protobuf_c_message_get_packed_size(msg);
    if (len > UINT32_MAX) {
        pd_log_error("grpc server: %s: response of %zu bytes too large", call->path, len);
        return PD_ERR_INVALID;
    }
    if (call->soff > 0) {
        memmove(call->sbuf, call->sbuf + call->soff, call->slen - call->soff);
        call->slen -= call->soff;
        call->soff = 0;
    }
    need = call->slen + PD_GRPC_WIRE_HDR_LEN + len;
    if (need > call->scap) {
        size_t cap = call->scap ? call->scap : 1024;
        while (cap < need)
            cap *= 2;
        uint8_t *nb = realloc(call->sbuf, cap);
        if (!nb) {
            pd_log_error("grpc server: %s: out of memory queueing %zu bytes", call->path, len);
            return PD_ERR_NOMEM;
        }
        call->sbuf = nb;
        call->scap = cap;
    }
    pd_grpc_wire_prefix(call->sbuf + call->slen, (uint32_t)len);
    protobuf_c_message_pack(msg, call->sbuf + call->slen + PD_GRPC_WIRE_HDR_LEN);
    call->slen = need;
    if (!call->headers_sent) {
        pd_status_t st = pd_grpc_server__submit_headers(call);
        if (st != PD_OK) {
            call->slen -= PD_GRPC_WIRE_HDR_LEN + len;
            return st;
        }
    } else if (call->data_deferred) {
        call->data_deferred = 0;
        nghttp2_session_resume_data(call->conn->ng, call->stream_id);
    }
    pd_grpc_server__flush(call->conn, 0);
    return PD_OK;
}

pd_status_t pd_grpc_call_finish(pd_grpc_call_t *call, int grpc_code, const char *message)
{
    pd_grpc_server__conn_t *conn = call->conn;

    PD_ASSERT(call->handler_ref);
    call->handler_ref = 0;
    if (call->cancelled || !call->stream_ref || !conn) {
        pd_grpc_server__call_maybe_free(call);
        return PD_ERR_CANCELLED;
    }
    if (grpc_code < 0 || grpc_code > 16)
        grpc_code = PD_GRPC_UNKNOWN;
    pd_grpc_server__call_end(call, 200, grpc_code, message);
    pd_grpc_server__flush(conn, 0);
    return PD_OK;
}

pd_status_t pd_grpc_call_finish_status(pd_grpc_call_t *call, pd_status_t st, const char *message)
{
    return pd_grpc_call_finish(call, pd_status_grpc_code(st),
                               message ? message : (st == PD_OK ? NULL : pd_status_str(st)));
}

void pd_grpc_call_set_cancel_cb(pd_grpc_call_t *call, void (*fn)(pd_grpc_call_t *call, void *arg),
                                void *arg)
{
    call->cancel_cb = fn;
    call->cancel_arg = arg;
}

void pd_grpc_call_set_writable_cb(pd_grpc_call_t *call, void (*fn)(pd_grpc_call_t *call, void *arg),
                                  void *arg)
{
    call->writable_cb = fn;
    call->writable_arg = arg;
}

int64_t pd_grpc_call_deadline_ms(const pd_grpc_call_t *call)
{
    int64_t left;

    if (call->deadline_at < 0)
        return -1;
    left = call->deadline_at - (int64_t)uv_now(call->timer->loop);
    return left > 0 ? left : 0;
}

const char *pd_grpc_call_metadata(const pd_grpc_call_t *call, const char *key)
{
    return pd_grpc_wire_md_get(&call->md, key);
}

int pd_grpc_call_is_cancelled(const pd_grpc_call_t *call)
{
    return call->cancelled;
}

const char *pd_grpc_call_path(const pd_grpc_call_t *call)
{
    return call->path ? call->path : "";
}

/* ==== request processing (nghttp2 callbacks) ==== */

static pd_grpc_call_t *pd_grpc_server__stream_call(pd_grpc_server__conn_t *conn, int32_t stream_id)
{
    return nghttp2_session_get_stream_user_data(conn->ng, stream_id);
}

static int pd_grpc_server__on_begin_headers(nghttp2_session *ng, const nghttp2_frame *frame,
                                            void *user_data)
{
    pd_grpc_server__conn_t *conn = user_data;
    pd_grpc_server_t *srv = conn->srv;
    pd_grpc_call_t *call;

    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    call = calloc(1, sizeof *call);
    if (!call) {
        pd_log_error("grpc server: stream %d: out of memory", frame->hd.stream_id);
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    call->srv = srv;
    call->conn = conn;
    call->stream_id = frame->hd.stream_id;
    call->stream_ref = 1;
    call->deadline_at = -1;
    call->started_at = uv_now(srv->loop);
    conn->n_streams++;
    pd_grpc_wire_deframer_init(&call->df, srv->params.max_recv_msg_size);
    call->next = srv->calls;
    if (srv->calls)
        srv->calls->prev = call;
    srv->calls = call;
    srv->n_calls++;
    nghttp2_session_set_stream_user_data(ng, frame->hd.stream_id, call);
    return 0;
}

static char *pd_grpc_server__strndup(const uint8_t *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static int pd_grpc_server__on_header(nghttp2_session *ng, const nghttp2_frame *frame,
                                     const uint8_t *name, size_t namelen, const uint8_t *value,
                                     size_t valuelen, uint8_t flags, void *user_data)
{
    pd_grpc_server__conn_t *conn = user_data;
    pd_grpc_call_t *call = pd_grpc_server__stream_call(conn, frame->hd.stream_id);
    (void)ng;
    (void)flags;

    if (!call || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* trailers from the client carry nothing we use */
#define IS(lit) (namelen == sizeof(lit) - 1 && memcmp(name, lit, namelen) == 0)
    if (IS(":path")) {
        free(call->path);
        call->path = pd_grpc_server__strndup(value, valuelen);
    } else if (IS(":method")) {
        call->is_post = valuelen == 4 && memcmp(value, "POST", 4) == 0;
    } else if (IS("content-type")) {
        free(call->content_type);
        call->content_type = pd_grpc_server__strndup(value, valuelen);
    } else if (IS("grpc-timeout")) {
        int64_t ms;
        if (pd_grpc_wire_timeout_parse((const char *)value, valuelen, &ms) != PD_OK)
            call->bad_headers = 1;
        else
            call->deadline_at = (int64_t)uv_now(conn->srv->loop) + ms;
    } else if (namelen > 0 && name[0] != ':') {
        if (call->md.bytes + namelen + valuelen > PD_GRPC_SERVER__MD_LIMIT) {
            call->bad_headers = 1;
            return 0;
        }
        if (pd_grpc_wire_md_add(&call->md, (const char *)name, namelen, (const char *)value,
                                valuelen) != PD_OK)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
#undef IS
    return 0;
}

/* Finds the handler for call->path; returns 0 when none. */
static int pd_grpc_server__route(pd_grpc_call_t *call)
{
    pd_grpc_server_t *srv = call->srv;
    const char *p = call->path, *slash;

    if (!p || p[0] != '/' || !(slash = strchr(p + 1, '/')))
        return 0;
    for (size_t i = 0; i < srv->n_svcs; i++) {
        const ProtobufCServiceDescriptor *d = srv->svcs[i].desc;
        size_t nl = strlen(d->name);
        if ((size_t)(slash - p - 1) != nl || memcmp(p + 1, d->name, nl) != 0)
            continue;
        for (unsigned m = 0; m < d->n_methods; m++) {
            if (strcmp(slash + 1, d->methods[m].name) != 0)
                continue;
            if (!srv->svcs[i].handlers[m])
                return 0;
            call->fn = srv->svcs[i].handlers[m];
            call->user = srv->svcs[i].user;
            call->in_desc = d->methods[m].input;
            return 1;
        }
    }
    return 0;
}

static int pd_grpc_server__content_type_ok(const char *ct)
{
    return ct && strncmp(ct, "application/grpc", 16) == 0 &&
           (ct[16] == 0 || ct[16] == '+' || ct[16] == ';');
}

static void pd_grpc_server__on_request_headers(pd_grpc_call_t *call)
{
    pd_grpc_server__conn_t *conn = call->conn;

    if (!call->is_post) {
        pd_grpc_server__call_end(call, 405, PD_GRPC_INTERNAL, "method must be POST");
        return;
    }
    if (!pd_grpc_server__content_type_ok(call->content_type)) {
        pd_grpc_server__call_end(call, 415, PD_GRPC_INTERNAL, "invalid content-type");
        return;
    }
    if (call->bad_headers) {
        pd_grpc_server__call_end(call, 200, PD_GRPC_INTERNAL, "invalid grpc-timeout or metadata");
        return;
    }
    if (!pd_grpc_server__route(call)) {
        char msg[160];
        snprintf(msg, sizeof msg, "method %.120s not implemented", call->path ? call->path : "");
        pd_grpc_server__call_end(call, 200, PD_GRPC_UNIMPLEMENTED, msg);
        return;
    }
    if (conn->srv->auth) {
        const char *why = NULL;
        int code = conn->srv->auth(call, call->path, conn->srv->auth_arg, &why);
        if (code) {
            pd_grpc_server__call_end(call, 200, code, why ? why : "missing or invalid credentials");
            return;
        }
    }
    if (call->deadline_at >= 0) {
        int64_t left = call->deadline_at - (int64_t)uv_now(conn->srv->loop);
        call->timer = malloc(sizeof *call->timer);
        if (!call->timer) {
            pd_grpc_server__call_end(call, 200, PD_GRPC_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        uv_timer_init(conn->srv->loop, call->timer);
        call->timer->data = call;
        uv_timer_start(call->timer, pd_grpc_server__deadline, left > 0 ? (uint64_t)left : 0, 0);
    }
}

static void pd_grpc_server__on_request_end(pd_grpc_call_t *call)
{
    call->remote_closed = 1;
    if (call->status_set || call->dispatched)
        return;
    if (pd_grpc_wire_deframer_partial(&call->df)) {
        pd_grpc_server__call_end(call, 200, PD_GRPC_INTERNAL, "request message truncated");
        return;
    }
    if (call->n_msgs != 1 || !call->req) {
        pd_grpc_server__call_end(call, 200, PD_GRPC_INTERNAL, "missing request message");
        return;
    }
    call->dispatched = 1;
    call->handler_ref = 1;
    call->fn(call, call->req, call->user);
}

static int pd_grpc_server__on_data(nghttp2_session *ng, uint8_t flags, int32_t stream_id,
                                   const uint8_t *data, size_t len, void *user_data)
{
    pd_grpc_server__conn_t *conn = user_data;
    pd_grpc_call_t *call = pd_grpc_server__stream_call(conn, stream_id);
    (void)ng;
    (void)flags;

    while (call && !call->status_set && !call->dispatched && len > 0) {
        const uint8_t *msg;
        size_t used, mlen;
        pd_status_t st = pd_grpc_wire_deframer_feed(&call->df, data, len, &used, &msg, &mlen);
        if (st == PD_ERR_UNSUPPORTED) {
            pd_grpc_server__call_end(call, 200, PD_GRPC_UNIMPLEMENTED, "compression not supported");
        } else if (st == PD_ERR_RESOURCE) {
            char m[96];
            snprintf(m, sizeof m, "received message larger than max (%zu vs. %zu)", call->df.want,
                     call->df.max_msg);
            pd_grpc_server__call_end(call, 200, PD_GRPC_RESOURCE_EXHAUSTED, m);
        } else if (st != PD_OK) {
            pd_grpc_server__call_end(call, 200, PD_GRPC_INTERNAL, "invalid message framing");
        }
        if (st != PD_OK)
            return 0;
        data += used;
        len -= used;
        if (!msg)
            continue;
        if (++call->n_msgs > 1) {
            pd_grpc_server__call_end(call, 200, PD_GRPC_UNIMPLEMENTED,
                                     "client streaming is not supported");
            return 0;
        }
        call->req = protobuf_c_message_unpack(call->in_desc, NULL, mlen, msg);
        if (!call->req) {
            pd_log_debug("grpc server: %s: failed to parse request", call->path);
            pd_grpc_server__call_end(call, 200, PD_GRPC_INTERNAL,
                                     "failed to parse request message");
            return 0;
        }
    }
    return 0;
}

static int pd_grpc_server__is_ctrl_frame(const nghttp2_frame *frame)
{
    switch (frame->hd.type) {
    case NGHTTP2_PING:
    case NGHTTP2_SETTINGS:
        return !(frame->hd.flags & NGHTTP2_FLAG_ACK);
    case NGHTTP2_PRIORITY:
        return 1;
    case NGHTTP2_DATA:
        return frame->hd.length == 0 && !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM);
    default:
        return 0;
    }
}

/* Takes one control frame from the connection's token bucket; 0 when it is empty. */
static int pd_grpc_server__ctrl_budget(pd_grpc_server__conn_t *conn)
{
    uint64_t now = uv_now(conn->srv->loop);

    conn->ctrl_tokens += (double)(now - conn->ctrl_at) * PD_GRPC_SERVER__CTRL_RATE / 1000.0;
    if (conn->ctrl_tokens > PD_GRPC_SERVER__CTRL_BURST)
        conn->ctrl_tokens = PD_GRPC_SERVER__CTRL_BURST;
    conn->ctrl_at = now;
    if (conn->ctrl_tokens < 1.0)
        return 0;
    conn->ctrl_tokens -= 1.0;
    return 1;
}

static int pd_grpc_server__on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame,
                                         void *user_data)
{
    pd_grpc_server__conn_t *conn = user_data;
    pd_grpc_call_t *call;

    if (pd_grpc_server__is_ctrl_frame(frame) && !pd_grpc_server__ctrl_budget(conn)) {
        pd_log_debug("grpc server: control frame flood (type %u): ending the connection",
                     frame->hd.type);
        nghttp2_session_terminate_session(ng, NGHTTP2_ENHANCE_YOUR_CALM);
        return 0;
    }
    if (frame->hd.type == NGHTTP2_PING && (frame->hd.flags & NGHTTP2_FLAG_ACK) &&
        conn->idle_notice && !conn->idle_goaway &&
        memcmp(frame->ping.opaque_data, pd_grpc_server__idle_ping, 8) == 0) {
        /* every stream the client began before it saw the notice has arrived: the final GOAWAY */
        conn->idle_goaway = 1;
        nghttp2_submit_goaway(ng, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(ng),
                              NGHTTP2_NO_ERROR, NULL, 0);
        return 0;
    }
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    call = pd_grpc_server__stream_call(conn, frame->hd.stream_id);
    if (!call)
        return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST)
        pd_grpc_server__on_request_headers(call);
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
        pd_grpc_server__on_request_end(call);
    return 0;
}

static int pd_grpc_server__on_frame_send(nghttp2_session *ng, const nghttp2_frame *frame,
                                         void *user_data)
{
    pd_grpc_server__conn_t *conn = user_data;
    pd_grpc_call_t *call;

    if (frame->hd.type == NGHTTP2_GOAWAY && frame->goaway.error_code == NGHTTP2_ENHANCE_YOUR_CALM &&
        !conn->flooded) {
        conn->flooded = 1;
        conn->srv->flood_closed++;
        conn->close_by = uv_now(conn->srv->loop) + PD_GRPC_SERVER__GRACE_MS;
    }
    if (frame->hd.type != NGHTTP2_HEADERS || !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    call = pd_grpc_server__stream_call(conn, frame->hd.stream_id);
    /* The response is complete but the client is still sending: end the stream (gRPC spec). */
    if (call && !call->remote_closed)
        nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
    return 0;
}

static int pd_grpc_server__on_stream_close(nghttp2_session *ng, int32_t stream_id,
                                           uint32_t error_code, void *user_data)
{
    pd_grpc_server__conn_t *conn = user_data;
    pd_grpc_call_t *call = pd_grpc_server__stream_call(conn, stream_id);

    if (!call)
        return 0;
    nghttp2_session_set_stream_user_data(ng, stream_id, NULL);
    call->stream_ref = 0;
    call->conn = NULL;
    if (--conn->n_streams == 0)
        conn->idle_since = uv_now(conn->srv->loop);
    if (call->handler_ref && !call->status_set) {
        pd_log_debug("grpc server: stream %d %s: closed by peer (error %u)", stream_id, call->path,
                     error_code);
        pd_grpc_server__call_cancel(call);
        return 0;
    }
    pd_grpc_server__call_maybe_free(call);
    return 0;
}

/* ==== connections ==== */

static int pd_grpc_server__run_writable(pd_grpc_server__conn_t *conn)
{
    int ran = 0;
    pd_grpc_call_t *call;

    while (conn->writable_pending) {
        conn->writable_pending = 0;
        /* restart after each callback: it may have freed calls */
    again:
        for (call = conn->srv->calls; call; call = call->next) {
            if (call->conn != conn || !call->writable_pending)
                continue;
            call->writable_pending = 0;
            if (call->writable_cb && call->handler_ref && !call->status_set && !call->cancelled) {
                call->writable_cb(call, call->writable_arg);
                ran++;
                if (conn->closing)
                    return ran;
                goto again;
            }
        }
    }
    return ran;
}

static void pd_grpc_server__write_done(uv_write_t *req, int status)
{
    pd_grpc_server__write_t *w = (pd_grpc_server__write_t *)req;
    pd_grpc_server__conn_t *conn = w->conn;

    conn->write_pending -= w->len;
    free(w);
    if (conn->closing)
        return;
    if (status < 0) {
        pd_log_debug("grpc server: write: %s", uv_strerror(status));
        pd_grpc_server__conn_close(conn);
        return;
    }
    pd_grpc_server__flush(conn, 1);
}

static void pd_grpc_server__alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    buf->base = malloc(suggested);
    buf->len = buf->base ? suggested : 0;
}

static void pd_grpc_server__on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* Produces output until nghttp2 has nothing more or too much is pending on the socket; may run
 * writable callbacks (run_cbs) and closes the connection when the session is done. Never frees
 * conn when run_cbs is 0 (safe to call from call functions). Returns nonzero when conn is closing
 * (its memory may be gone once the loop runs; fake connections are freed already). */
static int pd_grpc_server__flush(pd_grpc_server__conn_t *conn, int run_cbs)
{
    if (conn->closing)
        return 1;
    if (conn->in_recv || conn->flushing)
        return 0;
    conn->flushing = 1;
    for (;;) {
        while (nghttp2_session_want_write(conn->ng) &&
               conn->write_pending < PD_GRPC_SERVER__WRITE_LIMIT) {
            pd_grpc_server__write_t *w = malloc(sizeof *w + PD_GRPC_SERVER__WRITE_CHUNK);
            if (!w)
                break;
            w->conn = conn;
            w->len = 0;
            while (w->len < PD_GRPC_SERVER__WRITE_CHUNK) {
                const uint8_t *data;
                ssize_t n = nghttp2_session_mem_send(conn->ng, &data);
                if (n < 0) {
                    pd_log_error("grpc server: session send: %s", nghttp2_strerror((int)n));
                    break;
                }
                if (n == 0)
                    break;
                if (w->len + (size_t)n > PD_GRPC_SERVER__WRITE_CHUNK) {
                    pd_grpc_server__write_t *nw = realloc(w, sizeof *w + w->len + (size_t)n);
                    if (!nw)
                        break; /* drops a frame: the session is broken, close below */
                    w = nw;
                }
                memcpy(w->data + w->len, data, (size_t)n);
                w->len += (size_t)n;
            }
            if (w->len == 0) {
                free(w);
                break;
            }
            if (conn->fake) {
                if (conn->out)
                    conn->out(conn->out_arg, w->data, w->len);
                free(w);
                continue;
            }
            uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
            int rc =
                uv_write(&w->req, (uv_stream_t *)&conn->tcp, &b, 1, pd_grpc_server__write_done);
            if (rc < 0) {
                pd_log_debug("grpc server: uv_write: %s", uv_strerror(rc));
                free(w);
                break;
            }
            conn->write_pending += w->len;
        }
        if (!run_cbs || !conn->writable_pending)
            break;
        conn->flushing = 0;
        pd_grpc_server__run_writable(conn);
        if (conn->closing)
            return 1;
        conn->flushing = 1;
    }
    conn->flushing = 0;
    if (!conn->fake) {
        /* back-pressure: stop reading while the peer does not read what we write */
        int over = conn->write_pending >= PD_GRPC_SERVER__WRITE_LIMIT;
        if (over && conn->reading) {
            uv_read_stop((uv_stream_t *)&conn->tcp);
            conn->reading = 0;
        } else if (!over && !conn->reading) {
            uv_read_start((uv_stream_t *)&conn->tcp, pd_grpc_server__alloc,
                          pd_grpc_server__on_read);
            conn->reading = 1;
        }
    }
    if (run_cbs && !nghttp2_session_want_read(conn->ng) && !nghttp2_session_want_write(conn->ng) &&
        conn->write_pending == 0) {
        pd_grpc_server__conn_close(conn);
        return 1;
    }
    return 0;
}

static pd_status_t pd_grpc_server__recv(pd_grpc_server__conn_t *conn, const uint8_t *data,
                                        size_t len)
{
    ssize_t rv;

    conn->in_recv = 1;
    rv = nghttp2_session_mem_recv(conn->ng, data, len);
    conn->in_recv = 0;
    if (rv < 0) {
        pd_log_debug("grpc server: session recv: %s", nghttp2_strerror((int)rv));
        if (rv == NGHTTP2_ERR_FLOODED && !conn->flooded)
            conn->srv->flood_closed++;
        pd_grpc_server__conn_close(conn);
        return PD_ERR_PROTOCOL;
    }
    if (pd_grpc_server__flush(conn, 1))
        return PD_ERR_TRANSPORT;
    return PD_OK;
}

static void pd_grpc_server__on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    pd_grpc_server__conn_t *conn = s->data;

    if (nread < 0) {
        if (nread != UV_EOF)
            pd_log_debug("grpc server: read: %s", uv_strerror((int)nread));
        free(buf->base);
        pd_grpc_server__conn_close(conn);
        return;
    }
    if (nread > 0)
        pd_grpc_server__recv(conn, (const uint8_t *)buf->base, (size_t)nread);
    free(buf->base);
}

static void pd_grpc_server__maybe_free(pd_grpc_server_t *srv)
{
    if (!srv->destroyed || srv->pending_closes > 0 || srv->sweep_open)
        return;
    for (pd_grpc_call_t *c = srv->calls, *next; c; c = next) {
        next = c->next;
        c->srv = NULL; /* detached: freed by its finish */
        c->prev = c->next = NULL;
    }
    free(srv->svcs);
    free(srv);
}

static void pd_grpc_server__conn_closed(uv_handle_t *h)
{
    pd_grpc_server__conn_t *conn = h->data;
    pd_grpc_server_t *srv = conn->srv;

    free(conn);
    srv->pending_closes--;
    pd_grpc_server__maybe_free(srv);
}

/* Drops the session and every stream: handler-held calls get their cancel callback. Not from
 * inside nghttp2 callbacks. */
static void pd_grpc_server__conn_close(pd_grpc_server__conn_t *conn)
{
    pd_grpc_server_t *srv = conn->srv;
    pd_grpc_call_t *call;

    if (conn->closing)
        return;
    conn->closing = 1;
    nghttp2_session_del(conn->ng);
    conn->ng = NULL;
    for (;;) {
        for (call = srv->calls; call && call->conn != conn; call = call->next)
            ;
        if (!call)
            break;
        call->conn = NULL;
        call->stream_ref = 0;
        if (call->handler_ref && !call->status_set)
            pd_grpc_server__call_cancel(call);
        else
            pd_grpc_server__call_maybe_free(call);
    }
    if (conn->prev)
        conn->prev->next = conn->next;
    else
        srv->conns = conn->next;
    if (conn->next)
        conn->next->prev = conn->prev;
    srv->n_conns--;
    if (conn->fake) {
        if (conn->out)
            conn->out(conn->out_arg, NULL, 0); /* tells the test the connection is gone */
        free(conn);
        return;
    }
    srv->pending_closes++;
    conn_limit_release(&srv->limit); /* libuv closes the socket now */
    uv_close((uv_handle_t *)&conn->tcp, pd_grpc_server__conn_closed);
}

static pd_status_t pd_grpc_server__session_new(pd_grpc_server__conn_t *conn)
{
    nghttp2_session_callbacks *cbs;
    nghttp2_option *opt;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, conn->srv->params.max_concurrent_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, PD_GRPC_SERVER__WINDOW},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 64u << 10},
    };
    int rv;

    if (nghttp2_session_callbacks_new(&cbs) != 0)
        return PD_ERR_NOMEM;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, pd_grpc_server__on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, pd_grpc_server__on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, pd_grpc_server__on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, pd_grpc_server__on_frame_recv);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, pd_grpc_server__on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, pd_grpc_server__on_stream_close);
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cbs);
        return PD_ERR_NOMEM;
    }
    nghttp2_option_set_max_settings(opt, 32);
    nghttp2_option_set_max_outbound_ack(opt, 100);
    nghttp2_option_set_stream_reset_rate_limit(opt, 1000, 33);
    nghttp2_option_set_max_continuations(opt, 8);
    rv = nghttp2_session_server_new2(&conn->ng, cbs, conn, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0) {
        pd_log_error("grpc server: session: %s", nghttp2_strerror(rv));
        return PD_ERR_NOMEM;
    }
    nghttp2_submit_settings(conn->ng, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]);
    nghttp2_session_set_local_window_size(conn->ng, NGHTTP2_FLAG_NONE, 0,
                                          16 * PD_GRPC_SERVER__WINDOW);
    return PD_OK;
}

static pd_grpc_server__conn_t *pd_grpc_server__conn_new(pd_grpc_server_t *srv)
{
    pd_grpc_server__conn_t *conn = calloc(1, sizeof *conn);

    if (!conn)
        return NULL;
    conn->srv = srv;
    conn->idle_since = conn->ctrl_at = uv_now(srv->loop);
    conn->ctrl_tokens = PD_GRPC_SERVER__CTRL_BURST;
    if (pd_grpc_server__session_new(conn) != PD_OK) {
        free(conn);
        return NULL;
    }
    conn->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = conn;
    srv->conns = conn;
    srv->n_conns++;
    return conn;
}

static void pd_grpc_server__on_connection(uv_stream_t *listener, int status)
{
    pd_grpc_server_t *srv = listener->data;
    pd_grpc_server__conn_t *conn;
    int rc;

    if (!conn_limit_on_connection(&srv->limit, listener, status, NULL, 0))
        return;
    conn = pd_grpc_server__conn_new(srv);
    if (!conn) {
        pd_log_error("grpc server: out of memory accepting a connection");
        conn_limit_release(&srv->limit);
        return;
    }
    uv_tcp_init(srv->loop, &conn->tcp);
    conn->tcp.data = conn;
    rc = uv_accept(listener, (uv_stream_t *)&conn->tcp);
    if (rc < 0) {
        pd_log_error("grpc server: accept: %s", uv_strerror(rc));
        pd_grpc_server__conn_close(conn);
        return;
    }
    uv_tcp_nodelay(&conn->tcp, 1);
    if (srv->shutting_down)
        nghttp2_submit_goaway(conn->ng, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR, NULL, 0);
    pd_grpc_server__flush(conn, 1); /* starts reading */
}

/* ==== timeouts ==== */

/* Ends the first stream whose request is late; returns 0 when there is none. */
static int pd_grpc_server__end_late_request(pd_grpc_server_t *srv, uint64_t now)
{
    uint32_t limit = srv->params.request_timeout_ms;
    char msg[80];

    for (pd_grpc_call_t *call = srv->calls; call; call = call->next) {
        pd_grpc_server__conn_t *conn = call->conn;
        if (!conn || conn->closing || call->dispatched || call->status_set ||
            now - call->started_at < limit)
            continue;
        snprintf(msg, sizeof msg, "request not received within %u ms", limit);
        srv->request_timeouts++;
        pd_grpc_server__call_end(call, 200, PD_GRPC_DEADLINE_EXCEEDED, msg);
        pd_grpc_server__flush(conn, 1); /* may free calls: the caller starts over */
        return 1;
    }
    return 0;
}

static void pd_grpc_server__on_sweep(uv_timer_t *t)
{
    pd_grpc_server_t *srv = t->data;
    uint64_t now = uv_now(srv->loop);

    while (pd_grpc_server__end_late_request(srv, now))
        ;
    for (pd_grpc_server__conn_t *conn = srv->conns, *next; conn; conn = next) {
        next = conn->next;
        if (conn->closing)
            continue;
        if (conn->close_by && now >= conn->close_by && (conn->flooded || conn->n_streams == 0)) {
            pd_log_debug("grpc server: cutting a connection that did not finish closing");
            pd_grpc_server__conn_close(conn);
            continue;
        }
        if (conn->idle_notice || conn->n_streams > 0 || srv->shutting_down ||
            now - conn->idle_since < srv->params.idle_timeout_ms)
            continue;
        conn->idle_notice = 1;
        srv->idle_closed++;
        conn->close_by = now + (srv->params.idle_timeout_ms < PD_GRPC_SERVER__GRACE_MS
                                    ? srv->params.idle_timeout_ms
                                    : PD_GRPC_SERVER__GRACE_MS);
        nghttp2_submit_shutdown_notice(conn->ng);
        nghttp2_submit_ping(conn->ng, NGHTTP2_FLAG_NONE, pd_grpc_server__idle_ping);
        pd_grpc_server__flush(conn, 1); /* may close (and free) conn */
    }
}

static void pd_grpc_server__sweep_start(pd_grpc_server_t *srv)
{
    uint32_t every = srv->params.idle_timeout_ms < srv->params.request_timeout_ms
                         ? srv->params.idle_timeout_ms
                         : srv->params.request_timeout_ms;

    every /= 8; /* a timeout fires at most an eighth late */
    every = every < 5 ? 5 : every > 1000 ? 1000 : every;
    uv_timer_init(srv->loop, &srv->sweep);
    srv->sweep.data = srv;
    srv->sweep_open = 1;
    uv_unref((uv_handle_t *)&srv->sweep); /* never keeps the loop alive by itself */
    uv_timer_start(&srv->sweep, pd_grpc_server__on_sweep, every, every);
}

static void pd_grpc_server__sweep_closed(uv_handle_t *h)
{
    pd_grpc_server_t *srv = h->data;

    srv->sweep_open = 0;
    pd_grpc_server__maybe_free(srv);
}

/* ==== server ==== */

pd_status_t pd_grpc_server_create(uv_loop_t *loop, const pd_grpc_server_params_t *params,
                                  pd_grpc_server_t **srv_p)
{
    pd_grpc_server_t *srv = calloc(1, sizeof *srv);

    if (!srv) {
        pd_log_error("grpc server: out of memory");
        return PD_ERR_NOMEM;
    }
    srv->loop = loop;
    if (params)
        srv->params = *params;
    if (!srv->params.max_recv_msg_size)
        srv->params.max_recv_msg_size = 4u << 20;
    if (!srv->params.max_concurrent_streams)
        srv->params.max_concurrent_streams = 100;
    if (!srv->params.send_high_watermark)
        srv->params.send_high_watermark = 256u << 10;
    if (!srv->params.idle_timeout_ms)
        srv->params.idle_timeout_ms = 60000;
    if (!srv->params.request_timeout_ms)
        srv->params.request_timeout_ms = 30000;
    conn_limit_init(&srv->limit, "grpc server", srv->params.max_connections);
    srv->params.max_connections = srv->limit.max;
    pd_grpc_server__sweep_start(srv);
    *srv_p = srv;
    return PD_OK;
}

void pd_grpc_server_set_auth(pd_grpc_server_t *srv, pd_grpc_auth_fn fn, void *arg)
{
    srv->auth = fn;
    srv->auth_arg = arg;
}

pd_status_t pd_grpc_server_add_service(pd_grpc_server_t *srv,
                                       const ProtobufCServiceDescriptor *desc,
                                       const pd_grpc_method_fn *handlers, void *user)
{
    pd_grpc_server__svc_t *svcs;

    for (size_t i = 0; i < srv->n_svcs; i++) {
        if (strcmp(srv->svcs[i].desc->name, desc->name) == 0) {
            pd_log_error("grpc server: service %s registered twice", desc->name);
            return PD_ERR_INVALID;
        }
    }
    svcs = realloc(srv->svcs, (srv->n_svcs + 1) * sizeof *svcs);
    if (!svcs) {
        pd_log_error("grpc server: out of memory adding %s", desc->name);
        return PD_ERR_NOMEM;
    }
    srv->svcs = svcs;
    svcs[srv->n_svcs++] = (pd_grpc_server__svc_t){desc, handlers, user};
    return PD_OK;
}

static void pd_grpc_server__listener_closed(uv_handle_t *h)
{
    pd_grpc_server_t *srv = h->data;

    srv->pending_closes--;
    pd_grpc_server__maybe_free(srv);
}

pd_status_t pd_grpc_server_listen(pd_grpc_server_t *srv, const char *host, int port,
                                  int *bound_port_p)
{
    struct sockaddr_storage ss;
    int namelen = sizeof ss, rc;

    if (srv->listening || srv->shutting_down) {
        pd_log_error("grpc server: already listening");
        return PD_ERR_INVALID;
    }
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0) {
        pd_log_error("grpc server: bad listen address %s (numeric ip expected)", host);
        return PD_ERR_INVALID;
    }
    uv_tcp_init(srv->loop, &srv->listener);
    srv->listener.data = srv;
    rc = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&srv->listener, 128, pd_grpc_server__on_connection);
    if (rc == 0)
        rc = uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&ss, &namelen);
    if (rc < 0) {
        pd_log_error("grpc server: listen on %s:%d: %s", host, port, uv_strerror(rc));
        srv->pending_closes++;
        uv_close((uv_handle_t *)&srv->listener, pd_grpc_server__listener_closed);
        return PD_ERR_IO;
    }
    srv->listening = 1;
    *bound_port_p = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
    return PD_OK;
}

static void pd_grpc_server__stop_listening(pd_grpc_server_t *srv)
{
    if (!srv->listening)
        return;
    srv->listening = 0;
    srv->pending_closes++;
    uv_close((uv_handle_t *)&srv->listener, pd_grpc_server__listener_closed);
}

void pd_grpc_server_shutdown(pd_grpc_server_t *srv)
{
    if (srv->shutting_down)
        return;
    srv->shutting_down = 1;
    pd_grpc_server__stop_listening(srv);
    for (pd_grpc_server__conn_t *conn = srv->conns, *next; conn; conn = next) {
        next = conn->next;
        nghttp2_submit_goaway(conn->ng, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(conn->ng), NGHTTP2_NO_ERROR,
                              NULL, 0);
        pd_grpc_server__flush(conn, 1); /* may close conn */
    }
}

void pd_grpc_server_destroy(pd_grpc_server_t *srv)
{
    if (!srv)
        return;
    srv->destroyed = 1;
    srv->shutting_down = 1;
    pd_grpc_server__stop_listening(srv);
    if (srv->sweep_open && !uv_is_closing((uv_handle_t *)&srv->sweep))
        uv_close((uv_handle_t *)&srv->sweep, pd_grpc_server__sweep_closed);
    while (srv->conns)
        pd_grpc_server__conn_close(srv->conns);
    pd_grpc_server__maybe_free(srv);
}

void pd_grpc_server_stats(const pd_grpc_server_t *srv, pd_grpc_server_stats_t *stats_p)
{
    pd_grpc_server_stats_t s = {
        .active_calls = srv->n_calls,
        .connections = srv->n_conns,
        .max_connections = srv->limit.max,
        .rejected_connections = srv->limit.rejected,
        .accept_errors = srv->limit.accept_errors,
        .idle_closed = srv->idle_closed,
        .flood_closed = srv->flood_closed,
        .request_timeouts = srv->request_timeouts,
    };

    for (const pd_grpc_call_t *c = srv->calls; c; c = c->next)
        s.buffered_bytes += c->slen - c->soff;
    for (const pd_grpc_server__conn_t *c = srv->conns; c; c = c->next)
        s.buffered_bytes += c->write_pending;
    *stats_p = s;
}

/* ==== in-memory connections ==== */

pd_status_t pd_grpc_server__fake_open(pd_grpc_server_t *srv,
                                      void (*out)(void *arg, const uint8_t *data, size_t len),
                                      void *arg, pd_grpc_server__conn_t **conn_p)
{
    pd_grpc_server__conn_t *conn = pd_grpc_server__conn_new(srv);

    if (!conn)
        return PD_ERR_NOMEM;
    conn->fake = 1;
    conn->out = out;
    conn->out_arg = arg;
    pd_grpc_server__flush(conn, 0);
    *conn_p = conn;
    return PD_OK;
}

pd_status_t pd_grpc_server__fake_feed(pd_grpc_server__conn_t *conn, const uint8_t *data, size_t len)
{
    return pd_grpc_server__recv(conn, data, len);
}

void pd_grpc_server__fake_close(pd_grpc_server__conn_t *conn)
{
    if (conn)
        pd_grpc_server__conn_close(conn);
}
