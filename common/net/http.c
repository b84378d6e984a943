#include "http.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <llhttp.h>

#include "conn_limit.h"
#include "log.h"

#define PD_HTTP__DEFAULT_MAX_BODY (1u << 20)
#define PD_HTTP__DEFAULT_MAX_HEADERS (64u << 10)
#define PD_HTTP__DEFAULT_IDLE_MS 60000
#define PD_HTTP__DEFAULT_HEADER_MS 10000
#define PD_HTTP__DEFAULT_BODY_MS 30000

typedef struct {
    char *p;
    size_t len, cap;
} pd_http__str_t;

typedef struct {
    pd_http__str_t name, value;
} pd_http__header_t;

typedef struct {
    char *method; /* NULL: any */
    char *prefix;
    size_t plen;
    pd_http_handler_fn fn;
    void *user;
} pd_http__route_t;

typedef struct pd_http__conn pd_http__conn_t;

struct pd_http_server {
    uv_loop_t *loop;
    pd_http_server_params_t params;
    uv_tcp_t listener;
    int listener_open; /* uv_tcp_init done, not yet closed */
    int destroyed;
    pd_http__route_t *routes;
    size_t n_routes;
    pd_http_auth_fn auth; /* checked before every route (pd_http_server_set_auth) */
    void *auth_arg;
    pd_http__conn_t *conns; /* open handles */
    conn_limit_t limit;
    uv_timer_t sweep; /* checks the connections' timeouts; unreferenced */
    int sweep_open;   /* uv_timer_init done, not yet closed */
    uint64_t idle_closed, timed_out;
};

typedef enum {
    PD_HTTP__PARSING = 0, /* headers/body still arriving */
    PD_HTTP__HANDLING,    /* handed to the handler */
    PD_HTTP__STREAMING,   /* pd_http_stream_begin sent */
} pd_http__state_t;

struct pd_http_request {
    pd_http__conn_t *conn;
    pd_http__state_t state;
    int gone;
    int keep_alive;
    int http10;
    char method[24];
    pd_http__str_t url;
    char *path, *query; /* split copies of url */
    pd_http__header_t *headers;
    size_t n_headers, cap_headers;
    int last_was_value;
    pd_http__str_t body;
    pd_http_close_fn close_fn;
    void *close_arg;
};

struct pd_http__conn {
    uv_tcp_t tcp;
    uv_shutdown_t shutdown;
    pd_http_server_t *srv; /* NULL once the handle is closed */
    pd_http__conn_t *prev, *next;
    llhttp_t parser;
    pd_http__str_t in;      /* received, not yet parsed */
    pd_http_request_t *cur; /* being parsed or handled */
    size_t header_bytes;    /* of the message being parsed */
    int error_status;       /* 413/431 decided in a parser callback */
    int closing;            /* uv_close or uv_shutdown started */
    int closed;             /* handle closed */
    int reading;
    int in_process;
    int in_body;       /* the current request's headers are complete */
    uint64_t phase_at; /* uv_now when the current wait began (idle, headers, body, close) */
};

typedef struct {
    uv_write_t w;
    pd_http__conn_t *conn;
    size_t len;
    char data[];
} pd_http__write_t;

static void pd_http__process(pd_http__conn_t *c);
static void pd_http__conn_close(pd_http__conn_t *c, int graceful);
static void pd_http__start_reading(pd_http__conn_t *c);

/* ==== small helpers ==== */

static int pd_http__str_append(pd_http__str_t *s, const char *data, size_t len)
{
    if (s->len + len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < s->len + len + 1)
            cap *= 2;
        char *p = realloc(s->p, cap);
        if (!p)
            return -1;
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->len, data, len);
    s->len += len;
    s->p[s->len] = 0;
    return 0;
}

const char *pd_http_status_reason(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 413:
        return "Content Too Large";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 499:
        return "Client Closed Request";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 507:
        return "Insufficient Storage";
    default:
        return "Unknown";
    }
}

static void pd_http__request_free(pd_http_request_t *req)
{
    if (!req)
        return;
    for (size_t i = 0; i < req->n_headers; i++) {
        free(req->headers[i].name.p);
        free(req->headers[i].value.p);
    }
    free(req->headers);
    free(req->url.p);
    free(req->path);
    free(req->query);
    free(req->body.p);
    free(req);
}

static void pd_http__conn_free(pd_http__conn_t *c)
{
    pd_http__request_free(c->cur);
    free(c->in.p);
    free(c);
}

static void pd_http__server_maybe_free(pd_http_server_t *srv)
{
    if (!srv->destroyed || srv->listener_open || srv->sweep_open || srv->conns)
        return;
    for (size_t i = 0; i < srv->n_routes; i++) {
        free(srv->routes[i].method);
        free(srv->routes[i].prefix);
    }
    free(srv->routes);
    free(srv);
}

/* ==== writing ==== */

static void pd_http__on_write(uv_write_t *w, int status)
{
    pd_http__write_t *wr = (pd_http__write_t *)w;
    pd_http__conn_t *c = wr->conn;

    free(wr);
    if (status < 0 && status != UV_ECANCELED) {
        pd_log_debug("http: write failed: %s", uv_strerror(status));
        pd_http__conn_close(c, 0);
    }
}

/* Queues a + b as one write. */
static pd_status_t pd_http__send(pd_http__conn_t *c, const char *a, size_t alen, const void *b,
                                 size_t blen, const char *c3, size_t clen)
{
    pd_http__write_t *wr;
    uv_buf_t buf;
    int rc;

    if (c->closing)
        return PD_ERR_CANCELLED;
    wr = malloc(sizeof *wr + alen + blen + clen);
    if (!wr) {
        pd_log_error("http: out of memory for a %zu-byte write", alen + blen + clen);
        return PD_ERR_NOMEM;
    }
    wr->conn = c;
    wr->len = alen + blen + clen;
    if (alen)
        memcpy(wr->data, a, alen);
    if (blen)
        memcpy(wr->data + alen, b, blen);
    if (clen)
        memcpy(wr->data + alen + blen, c3, clen);
    buf = uv_buf_init(wr->data, (unsigned)wr->len);
    rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &buf, 1, pd_http__on_write);
    if (rc < 0) {
        free(wr);
        pd_log_debug("http: write failed: %s", uv_strerror(rc));
        pd_http__conn_close(c, 0);
        return PD_ERR_TRANSPORT;
    }
    return PD_OK;
}

/* ==== connection lifetime ==== */

static void pd_http__on_closed(uv_handle_t *h)
{
    pd_http__conn_t *c = h->data;
    pd_http_server_t *srv = c->srv;

    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->srv = NULL;
    c->closed = 1;
    /* A request held by its handler keeps the connection's memory until it is finished. */
    if (!c->cur || c->cur->state == PD_HTTP__PARSING)
        pd_http__conn_free(c);
    pd_http__server_maybe_free(srv);
}

/* Closes the handle; libuv closes the socket now, so the connection stops counting now. */
static void pd_http__close_tcp(pd_http__conn_t *c)
{
    conn_limit_release(&c->srv->limit);
    uv_close((uv_handle_t *)&c->tcp, pd_http__on_closed);
}

static void pd_http__on_shutdown(uv_shutdown_t *s, int status)
{
    pd_http__conn_t *c = s->data;
    (void)status;
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        pd_http__close_tcp(c);
}

/* Closes the connection: graceful sends what is queued first (shutdown), otherwise at once. The
 * close callback of an unfinished request runs here. */
static void pd_http__conn_close(pd_http__conn_t *c, int graceful)
{
    pd_http_request_t *req = c->cur;

    if (c->closed)
        return;
    if (!c->closing) {
        c->closing = 1;
        c->phase_at = uv_now(c->srv->loop);
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
        if (!graceful ||
            uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, pd_http__on_shutdown) != 0)
            pd_http__close_tcp(c);
    } else if (!graceful && !uv_is_closing((uv_handle_t *)&c->tcp)) {
        pd_http__close_tcp(c); /* cancels a pending shutdown */
    }
    if (req && req->state != PD_HTTP__PARSING && !req->gone) {
        req->gone = 1;
        if (req->close_fn)
            req->close_fn(req, req->close_arg); /* may finish (free) req */
    }
}

/* Called when the handler finishes a request: frees it and moves on to the next one. */
static void pd_http__finish(pd_http_request_t *req)
{
    pd_http__conn_t *c = req->conn;
    int keep = req->keep_alive && !req->gone;

    PD_ASSERT(c->cur == req);
    c->cur = NULL;
    pd_http__request_free(req);
    if (c->closed) {
        pd_http__conn_free(c);
        return;
    }
    if (c->closing)
        return;
    if (!keep) {
        pd_http__conn_close(c, 1);
        return;
    }
    c->phase_at = uv_now(c->srv->loop); /* idle until the next request begins */
    pd_http__process(c);
}

/* ==== responses ==== */

static pd_status_t pd_http__check(pd_http_request_t *req, int streaming)
{
    if (streaming != (req->state == PD_HTTP__STREAMING)) {
        pd_log_error("http: %s %s: response call in the wrong state (%s)", req->method,
                     req->path ? req->path : "", streaming ? "not streaming" : "streaming");
        return PD_ERR_INVALID;
    }
    return PD_OK;
}

pd_status_t pd_http_respond(pd_http_request_t *req, int status, const char *content_type,
                            const void *body, size_t len)
{
    char head[512];
    int n;
    pd_status_t st;

    if ((st = pd_http__check(req, 0)) != PD_OK)
        return st;
    if (req->gone) {
        pd_http__finish(req);
        return PD_ERR_CANCELLED;
    }
    n = snprintf(head, sizeof head,
                 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: %s\r\n"
                 "\r\n",
                 status, pd_http_status_reason(status), content_type ? content_type : "text/plain",
                 len, req->keep_alive ? "keep-alive" : "close");
    if (strcmp(req->method, "HEAD") == 0)
        len = 0;
    st = pd_http__send(req->conn, head, (size_t)n, body, len, NULL, 0);
    pd_http__finish(req);
    return st;
}

pd_status_t pd_http_respond_json(pd_http_request_t *req, int status, json_t *body)
{
    char *text;
    pd_status_t st;

    if (!body)
        return pd_http_respond_error(req, PD_ERR_INTERNAL, "no response body");
    text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) {
        pd_log_error("http: %s %s: out of memory serializing json", req->method, req->path);
        pd_http_respond_error(req, PD_ERR_NOMEM, NULL);
        return PD_ERR_NOMEM;
    }
    st = pd_http_respond(req, status, "application/json", text, strlen(text));
    free(text);
    return st;
}

/* Builds the OpenAI-style error body; NULL when out of memory. */
static char *pd_http__error_body(int status, const char *code, const char *message)
{
    const char *type = status == 429   ? "rate_limit_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    json_t *j =
        json_pack("{s:{s:s, s:s, s:s}}", "error", "message", message, "type", type, "code", code);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return text;
}

static void pd_http__status_code(pd_status_t st, char *out, size_t len)
{
    const char *name = pd_status_name(st);
    size_t i = 0;
    if (strncmp(name, "PD_", 3) == 0)
        name += 3;
    if (strncmp(name, "ERR_", 4) == 0)
        name += 4;
    for (; name[i] && i + 1 < len; i++)
        out[i] = (char)tolower((unsigned char)name[i]);
    out[i] = 0;
}

static pd_status_t pd_http__respond_error_status(pd_http_request_t *req, int status,
                                                 const char *code, const char *message)
{
    char *text = pd_http__error_body(status, code, message);
    pd_status_t st;

    if (!text) {
        static const char fallback[] = "{\"error\":{\"message\":\"out of memory\"}}";
        pd_http_respond(req, 500, "application/json", fallback, sizeof fallback - 1);
        return PD_ERR_NOMEM;
    }
    st = pd_http_respond(req, status, "application/json", text, strlen(text));
    free(text);
    return st;
}

char *pd_http_error_json(pd_status_t st, const char *message)
{
    char code[64];
    pd_http__status_code(st, code, sizeof code);
    return pd_http__error_body(pd_status_http_code(st), code, message ? message : pd_status_str(st));
}

pd_status_t pd_http_respond_error_code(pd_http_request_t *req, int status, const char *code,
                                       const char *message)
{
    return pd_http__respond_error_status(req, status, code, message);
}

pd_status_t pd_http_respond_error(pd_http_request_t *req, pd_status_t st, const char *message)
{
    char code[64];
    pd_http__status_code(st, code, sizeof code);
    return pd_http__respond_error_status(req, pd_status_http_code(st), code,
                                         message ? message : pd_status_str(st));
}

pd_status_t pd_http_stream_begin(pd_http_request_t *req, int status, const char *content_type)
{
    char head[512];
    int n;
    pd_status_t st;

    if ((st = pd_http__check(req, 0)) != PD_OK)
        return st;
    req->state = PD_HTTP__STREAMING;
    if (req->gone)
        return PD_ERR_CANCELLED;
    if (req->http10)
        req->keep_alive = 0;
    n = snprintf(head, sizeof head,
                 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%sCache-Control: no-cache\r\n"
                 "Connection: %s\r\n\r\n",
                 status, pd_http_status_reason(status), content_type ? content_type : "text/plain",
                 req->http10 ? "" : "Transfer-Encoding: chunked\r\n",
                 req->keep_alive ? "keep-alive" : "close");
    return pd_http__send(req->conn, head, (size_t)n, NULL, 0, NULL, 0);
}

pd_status_t pd_http_stream_write(pd_http_request_t *req, const void *data, size_t len)
{
    char size[32];
    int n;
    pd_status_t st;

    if ((st = pd_http__check(req, 1)) != PD_OK)
        return st;
    if (req->gone)
        return PD_ERR_CANCELLED;
    if (len == 0)
        return PD_OK;
    if (req->http10)
        return pd_http__send(req->conn, data, len, NULL, 0, NULL, 0);
    n = snprintf(size, sizeof size, "%zx\r\n", len);
    return pd_http__send(req->conn, size, (size_t)n, data, len, "\r\n", 2);
}

pd_status_t pd_http_stream_sse(pd_http_request_t *req, const char *json_text)
{
    size_t jl = strlen(json_text);
    char size[32];
    int n;
    pd_status_t st;

    if ((st = pd_http__check(req, 1)) != PD_OK)
        return st;
    if (req->gone)
        return PD_ERR_CANCELLED;
    if (req->http10)
        return pd_http__send(req->conn, "data: ", 6, json_text, jl, "\n\n", 2);
    /* one chunk: size, "data: ", json, "\n\n", CRLF */
    n = snprintf(size, sizeof size, "%zx\r\ndata: ", jl + 8);
    return pd_http__send(req->conn, size, (size_t)n, json_text, jl, "\n\n\r\n", 4);
}

pd_status_t pd_http_stream_end(pd_http_request_t *req)
{
    pd_status_t st;

    if ((st = pd_http__check(req, 1)) != PD_OK)
        return st;
    if (req->gone) {
        pd_http__finish(req);
        return PD_ERR_CANCELLED;
    }
    st = req->http10 ? PD_OK : pd_http__send(req->conn, "0\r\n\r\n", 5, NULL, 0, NULL, 0);
    pd_http__finish(req);
    return st;
}

/* ==== request accessors ==== */

const char *pd_http_request_method(const pd_http_request_t *req)
{
    return req->method;
}

const char *pd_http_request_path(const pd_http_request_t *req)
{
    return req->path;
}

const char *pd_http_request_query(const pd_http_request_t *req)
{
    return req->query;
}

const char *pd_http_request_header(const pd_http_request_t *req, const char *name)
{
    for (size_t i = 0; i < req->n_headers; i++)
        if (req->headers[i].name.p && strcasecmp(req->headers[i].name.p, name) == 0)
            return req->headers[i].value.p ? req->headers[i].value.p : "";
    return NULL;
}

const char *pd_http_request_body(const pd_http_request_t *req, size_t *len_p)
{
    if (len_p)
        *len_p = req->body.len;
    return req->body.p ? req->body.p : "";
}

pd_status_t pd_http_request_json(const pd_http_request_t *req, json_t **json_p)
{
    json_error_t e;
    json_t *j = json_loadb(req->body.p ? req->body.p : "", req->body.len, 0, &e);
    if (!j)
        return PD_ERR_FORMAT;
    *json_p = j;
    return PD_OK;
}

int pd_http_request_keep_alive(const pd_http_request_t *req)
{
    return req->keep_alive;
}

int pd_http_request_gone(const pd_http_request_t *req)
{
    return req->gone;
}

size_t pd_http_request_pending_bytes(const pd_http_request_t *req)
{
    if (req->gone || req->conn->closing)
        return 0;
    return uv_stream_get_write_queue_size((const uv_stream_t *)&req->conn->tcp);
}

void pd_http_request_set_close_cb(pd_http_request_t *req, pd_http_close_fn fn, void *arg)
{
    req->close_fn = fn;
    req->close_arg = arg;
}

/* ==== parsing ==== */

static int pd_http__count(pd_http__conn_t *c, size_t len)
{
    c->header_bytes += len;
    if (c->header_bytes > c->srv->params.max_headers) {
        c->error_status = 431;
        return -1;
    }
    return 0;
}

static int pd_http__on_message_begin(llhttp_t *p)
{
    pd_http__conn_t *c = p->data;
    PD_ASSERT(!c->cur);
    c->cur = calloc(1, sizeof *c->cur);
    if (!c->cur) {
        c->error_status = 500;
        return -1;
    }
    c->cur->conn = c;
    c->header_bytes = 0;
    c->in_body = 0;
    c->phase_at = uv_now(c->srv->loop);
    return 0;
}

static int pd_http__on_url(llhttp_t *p, const char *at, size_t len)
{
    pd_http__conn_t *c = p->data;
    if (pd_http__count(c, len))
        return -1;
    return pd_http__str_append(&c->cur->url, at, len) ? (c->error_status = 500, -1) : 0;
}

static int pd_http__on_header_field(llhttp_t *p, const char *at, size_t len)
{
    pd_http__conn_t *c = p->data;
    pd_http_request_t *r = c->cur;

    if (pd_http__count(c, len))
        return -1;
    if (r->n_headers == 0 || r->last_was_value) {
        if (r->n_headers == r->cap_headers) {
            size_t cap = r->cap_headers ? r->cap_headers * 2 : 16;
            pd_http__header_t *h = realloc(r->headers, cap * sizeof *h);
            if (!h)
                return c->error_status = 500, -1;
            r->headers = h;
            r->cap_headers = cap;
        }
        memset(&r->headers[r->n_headers++], 0, sizeof r->headers[0]);
        r->last_was_value = 0;
    }
    return pd_http__str_append(&r->headers[r->n_headers - 1].name, at, len)
               ? (c->error_status = 500, -1)
               : 0;
}

static int pd_http__on_header_value(llhttp_t *p, const char *at, size_t len)
{
    pd_http__conn_t *c = p->data;
    pd_http_request_t *r = c->cur;

    if (pd_http__count(c, len))
        return -1;
    r->last_was_value = 1;
    return pd_http__str_append(&r->headers[r->n_headers - 1].value, at, len)
               ? (c->error_status = 500, -1)
               : 0;
}

static int pd_http__on_headers_complete(llhttp_t *p)
{
    pd_http__conn_t *c = p->data;
    pd_http_request_t *r = c->cur;
    const char *url = r->url.p ? r->url.p : "";
    const char *q = strchr(url, '?');
    const char *expect;

    snprintf(r->method, sizeof r->method, "%s", llhttp_method_name((llhttp_method_t)p->method));
    r->path = q ? strndup(url, (size_t)(q - url)) : strdup(url);
    r->query = strdup(q ? q + 1 : "");
    if (!r->path || !r->query)
        return c->error_status = 500, -1;
    if (p->content_length > c->srv->params.max_body && p->content_length != UINT64_MAX) {
        c->error_status = 413;
        return -1;
    }
    c->in_body = 1;
    c->phase_at = uv_now(c->srv->loop);
    expect = pd_http_request_header(r, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0 && p->http_major == 1 &&
        p->http_minor == 1)
        pd_http__send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, NULL, 0, NULL, 0);
    return 0;
}

static int pd_http__on_body(llhttp_t *p, const char *at, size_t len)
{
    pd_http__conn_t *c = p->data;
    pd_http_request_t *r = c->cur;

    if (r->body.len + len > c->srv->params.max_body) {
        c->error_status = 413;
        return -1;
    }
    return pd_http__str_append(&r->body, at, len) ? (c->error_status = 500, -1) : 0;
}

static int pd_http__on_message_complete(llhttp_t *p)
{
    pd_http__conn_t *c = p->data;
    pd_http_request_t *r = c->cur;

    r->keep_alive = llhttp_should_keep_alive(p);
    r->http10 = p->http_major == 1 && p->http_minor == 0;
    r->state = PD_HTTP__HANDLING;
    return HPE_PAUSED; /* one request at a time: resume when this one is finished */
}

static const llhttp_settings_t pd_http__settings = {
    .on_message_begin = pd_http__on_message_begin,
    .on_url = pd_http__on_url,
    .on_header_field = pd_http__on_header_field,
    .on_header_value = pd_http__on_header_value,
    .on_headers_complete = pd_http__on_headers_complete,
    .on_body = pd_http__on_body,
    .on_message_complete = pd_http__on_message_complete,
};

/* Whether prefix matches path: all of it, or up to a '/'. */
static int pd_http__prefix_match(const pd_http__route_t *rt, const char *path)
{
    if (strncmp(path, rt->prefix, rt->plen) != 0)
        return 0;
    return path[rt->plen] == 0 || path[rt->plen] == '/' || rt->prefix[rt->plen - 1] == '/';
}

static void pd_http__dispatch(pd_http__conn_t *c)
{
    pd_http_request_t *r = c->cur;
    const pd_http__route_t *best = NULL;
    int path_matched = 0;
    char msg[256];

    for (size_t i = 0; i < c->srv->n_routes; i++) {
        const pd_http__route_t *rt = &c->srv->routes[i];
        if (!pd_http__prefix_match(rt, r->path))
            continue;
        path_matched = 1;
        if (rt->method && strcmp(rt->method, r->method) != 0)
            continue;
        if (!best || rt->plen > best->plen)
            best = rt;
    }
    if (best && c->srv->auth) {
        const char *why = NULL;
        int status = c->srv->auth(r, c->srv->auth_arg, &why);
        if (status) {
            pd_http__respond_error_status(r, status, status == 401 ? "unauthorized" : "forbidden",
                                          why ? why : "missing or invalid credentials");
            return;
        }
    }
    if (best) {
        best->fn(r, best->user);
        return;
    }
    snprintf(msg, sizeof msg, "%s %.200s: %s", r->method, r->path,
             path_matched ? "method not allowed" : "no such route");
    if (path_matched)
        pd_http__respond_error_status(r, 405, "method_not_allowed", msg);
    else
        pd_http_respond_error(r, PD_ERR_NOT_FOUND, msg);
}

/* Answers a request the parser rejected and closes the connection after the answer. */
static void pd_http__reject(pd_http__conn_t *c, int status, const char *reason)
{
    char *text;
    char head[256];
    int n;
    const char *code = status == 413   ? "too_long"
                       : status == 431 ? "too_long"
                       : status == 408 ? "timeout"
                                       : "format";

    pd_log_debug("http: rejecting a request with %d: %s", status, reason);
    text = pd_http__error_body(status, status == 500 ? "internal" : code, reason);
    n = snprintf(head, sizeof head,
                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n",
                 status, pd_http_status_reason(status), text ? strlen(text) : 0);
    pd_http__send(c, head, (size_t)n, text, text ? strlen(text) : 0, NULL, 0);
    free(text);
    pd_http__request_free(c->cur);
    c->cur = NULL;
    pd_http__conn_close(c, 1);
}

/* Parses buffered input until a request is handed out, the buffer is empty, or an error. */
static void pd_http__process(pd_http__conn_t *c)
{
    if (c->in_process)
        return;
    c->in_process = 1;
    while (!c->closing && !(c->cur && c->cur->state != PD_HTTP__PARSING) && c->in.len > 0) {
        llhttp_errno_t err;
        size_t used;

        if (llhttp_get_errno(&c->parser) == HPE_PAUSED)
            llhttp_resume(&c->parser);
        err = llhttp_execute(&c->parser, c->in.p, c->in.len);
        if (err == HPE_OK) {
            used = c->in.len;
        } else if (err == HPE_PAUSED) {
            used = (size_t)(llhttp_get_error_pos(&c->parser) - c->in.p);
        } else {
            int status = c->error_status ? c->error_status : 400;
            pd_http__reject(c, status,
                            status == 413   ? "request body too large"
                            : status == 431 ? "request headers too large"
                            : status == 500 ? "out of memory"
                                            : llhttp_get_error_reason(&c->parser));
            break;
        }
        memmove(c->in.p, c->in.p + used, c->in.len - used);
        c->in.len -= used;
        if (err == HPE_PAUSED)
            pd_http__dispatch(c); /* may finish synchronously; the loop then goes on */
    }
    c->in_process = 0;
    if (!c->closing && !c->reading && c->in.len < c->srv->params.max_body) {
        pd_http__start_reading(c); /* reading was stopped while pipelined input piled up */
    }
}

/* ==== accepting and reading ==== */

static void pd_http__alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    pd_http__conn_t *c = h->data;
    (void)suggested;
    if (c->in.cap - c->in.len < 16384) {
        size_t cap = c->in.cap ? c->in.cap * 2 : 16384;
        char *p = realloc(c->in.p, cap);
        if (!p) {
            *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
            return;
        }
        c->in.p = p;
        c->in.cap = cap;
    }
    *buf = uv_buf_init(c->in.p + c->in.len, (unsigned)(c->in.cap - c->in.len - 1));
}

static void pd_http__on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    pd_http__conn_t *c = s->data;
    (void)buf;

    if (nread < 0) {
        if (nread != UV_EOF)
            pd_log_debug("http: read failed: %s", uv_strerror((int)nread));
        pd_http__conn_close(c, 0);
        return;
    }
    c->in.len += (size_t)nread;
    if (c->cur && c->cur->state != PD_HTTP__PARSING) {
        /* Pipelined data while a request is handled: keep it, and stop reading when it piles up
         * (reading continues to notice a disconnect as long as it does not). */
        if (c->in.len > c->srv->params.max_body + c->srv->params.max_headers) {
            uv_read_stop(s);
            c->reading = 0;
        }
        return;
    }
    pd_http__process(c);
}

static void pd_http__start_reading(pd_http__conn_t *c)
{
    if (uv_read_start((uv_stream_t *)&c->tcp, pd_http__alloc, pd_http__on_read) == 0)
        c->reading = 1;
}

static void pd_http__on_connection(uv_stream_t *server, int status)
{
    static const char busy[] =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        "Content-Length: 88\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
        "{\"error\":{\"message\":\"too many connections\",\"type\":\"server_error\","
        "\"code\":\"unavailable\"}}\n";
    pd_http_server_t *srv = server->data;
    pd_http__conn_t *c;

    if (!conn_limit_on_connection(&srv->limit, server, status, busy, sizeof busy - 1))
        return;
    c = calloc(1, sizeof *c);
    if (!c) {
        pd_log_error("http: out of memory for a connection");
        conn_limit_release(&srv->limit);
        return;
    }
    c->srv = srv;
    c->phase_at = uv_now(srv->loop);
    uv_tcp_init(srv->loop, &c->tcp);
    c->tcp.data = c;
    c->shutdown.data = c;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        c->closing = 1;
        pd_http__close_tcp(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    llhttp_init(&c->parser, HTTP_REQUEST, &pd_http__settings);
    c->parser.data = c;
    pd_http__start_reading(c);
}

/* ==== timeouts ==== */

/* Closes or answers 408 to every connection past its current wait. */
static void pd_http__on_sweep(uv_timer_t *t)
{
    pd_http_server_t *srv = t->data;
    const pd_http_server_params_t *p = &srv->params;
    uint64_t now = uv_now(srv->loop);
    char msg[96];

    for (pd_http__conn_t *c = srv->conns, *next; c; c = next) {
        uint64_t waited = now - c->phase_at;
        next = c->next;
        if (c->closed)
            continue;
        if (c->closing) {
            if (waited >= p->header_timeout_ms && !uv_is_closing((uv_handle_t *)&c->tcp))
                pd_http__conn_close(c, 0); /* the peer does not read its last bytes */
        } else if (!c->cur) {
            if (waited >= p->idle_timeout_ms) {
                srv->idle_closed++;
                pd_http__conn_close(c, 0);
            }
        } else if (c->cur->state == PD_HTTP__PARSING) {
            uint32_t limit = c->in_body ? p->body_timeout_ms : p->header_timeout_ms;
            if (waited < limit)
                continue;
            snprintf(msg, sizeof msg, "request %s not received within %u ms",
                     c->in_body ? "body" : "headers", limit);
            srv->timed_out++;
            pd_http__reject(c, 408, msg);
        }
    }
}

static void pd_http__sweep_start(pd_http_server_t *srv)
{
    const pd_http_server_params_t *p = &srv->params;
    uint32_t every = p->idle_timeout_ms;

    if (p->header_timeout_ms < every)
        every = p->header_timeout_ms;
    if (p->body_timeout_ms < every)
        every = p->body_timeout_ms;
    every /= 8; /* a timeout fires at most an eighth late */
    every = every < 5 ? 5 : every > 1000 ? 1000 : every;
    if (!srv->sweep_open) {
        uv_timer_init(srv->loop, &srv->sweep);
        srv->sweep.data = srv;
        srv->sweep_open = 1;
        uv_unref((uv_handle_t *)&srv->sweep); /* never keeps the loop alive by itself */
    }
    uv_timer_start(&srv->sweep, pd_http__on_sweep, every, every);
}

static void pd_http__on_sweep_closed(uv_handle_t *h)
{
    pd_http_server_t *srv = h->data;
    srv->sweep_open = 0;
    pd_http__server_maybe_free(srv);
}

void pd_http_server_set_auth(pd_http_server_t *srv, pd_http_auth_fn fn, void *arg)
{
    srv->auth = fn;
    srv->auth_arg = arg;
}

void pd_http_server_stats(const pd_http_server_t *srv, pd_http_server_stats_t *stats_p)
{
    *stats_p = (pd_http_server_stats_t){
        .connections = srv->limit.open,
        .max_connections = srv->limit.max,
        .rejected_connections = srv->limit.rejected,
        .accept_errors = srv->limit.accept_errors,
        .idle_closed = srv->idle_closed,
        .timed_out = srv->timed_out,
    };
}

/* ==== server ==== */

pd_status_t pd_http_server_create(uv_loop_t *loop, const pd_http_server_params_t *params,
                                  pd_http_server_t **srv_p)
{
    pd_http_server_t *srv = calloc(1, sizeof *srv);

    if (!srv) {
        pd_log_error("http: out of memory for the server");
        return PD_ERR_NOMEM;
    }
    srv->loop = loop;
    if (params)
        srv->params = *params;
    if (!srv->params.max_body)
        srv->params.max_body = PD_HTTP__DEFAULT_MAX_BODY;
    if (!srv->params.max_headers)
        srv->params.max_headers = PD_HTTP__DEFAULT_MAX_HEADERS;
    if (!srv->params.idle_timeout_ms)
        srv->params.idle_timeout_ms = PD_HTTP__DEFAULT_IDLE_MS;
    if (!srv->params.header_timeout_ms)
        srv->params.header_timeout_ms = PD_HTTP__DEFAULT_HEADER_MS;
    if (!srv->params.body_timeout_ms)
        srv->params.body_timeout_ms = PD_HTTP__DEFAULT_BODY_MS;
    conn_limit_init(&srv->limit, "http", srv->params.max_connections);
    srv->params.max_connections = srv->limit.max;
    *srv_p = srv;
    return PD_OK;
}

pd_status_t pd_http_server_route(pd_http_server_t *srv, const char *method, const char *path_prefix,
                                 pd_http_handler_fn fn, void *user)
{
    pd_http__route_t rt = {0};

    if (!path_prefix || path_prefix[0] != '/' || !fn) {
        pd_log_error("http: route '%s': the prefix must start with '/' and have a handler",
                     path_prefix ? path_prefix : "(null)");
        return PD_ERR_INVALID;
    }
    if (method && strcmp(method, "*") == 0)
        method = NULL;
    for (size_t i = 0; i < srv->n_routes; i++) {
        pd_http__route_t *o = &srv->routes[i];
        if (strcmp(o->prefix, path_prefix) == 0 &&
            (o->method == method || (o->method && method && strcmp(o->method, method) == 0))) {
            o->fn = fn;
            o->user = user;
            return PD_OK;
        }
    }
    rt.prefix = strdup(path_prefix);
    rt.method = method ? strdup(method) : NULL;
    rt.plen = strlen(path_prefix);
    rt.fn = fn;
    rt.user = user;
    pd_http__route_t *routes = realloc(srv->routes, (srv->n_routes + 1) * sizeof *routes);
    if (!rt.prefix || (method && !rt.method) || !routes) {
        if (routes)
            srv->routes = routes;
        free(rt.prefix);
        free(rt.method);
        pd_log_error("http: out of memory adding route %s", path_prefix);
        return PD_ERR_NOMEM;
    }
    srv->routes = routes;
    srv->routes[srv->n_routes++] = rt;
    return PD_OK;
}

static void pd_http__on_listener_closed(uv_handle_t *h)
{
    pd_http_server_t *srv = h->data;
    srv->listener_open = 0;
    pd_http__server_maybe_free(srv);
}

pd_status_t pd_http_server_listen(pd_http_server_t *srv, const char *host, int port,
                                  int *bound_port_p)
{
    struct sockaddr_storage addr;
    struct sockaddr_storage bound;
    int len = sizeof bound, rc;
    const char *what;

    if (srv->listener_open) {
        pd_log_error("http: listen %s:%d: already listening", host, port);
        return PD_ERR_INVALID;
    }
    if (port < 0 || port > 65535 ||
        (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) != 0 &&
         uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr) != 0)) {
        pd_log_error("http: listen %s:%d: not an ip address and port", host, port);
        return PD_ERR_INVALID;
    }
    uv_tcp_init(srv->loop, &srv->listener);
    srv->listener.data = srv;
    srv->listener_open = 1;
    what = "bind";
    rc = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0) {
        what = "listen";
        rc = uv_listen((uv_stream_t *)&srv->listener, 256, pd_http__on_connection);
    }
    if (rc == 0) {
        what = "getsockname";
        rc = uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&bound, &len);
    }
    if (rc != 0) {
        pd_log_error("http: %s %s:%d: %s", what, host, port, uv_strerror(rc));
        uv_close((uv_handle_t *)&srv->listener, pd_http__on_listener_closed);
        return rc == UV_EADDRINUSE ? PD_ERR_UNAVAILABLE : PD_ERR_IO;
    }
    pd_http__sweep_start(srv);
    if (bound_port_p)
        *bound_port_p =
            ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                              : ((struct sockaddr_in *)&bound)->sin_port);
    return PD_OK;
}

void pd_http_server_destroy(pd_http_server_t *srv)
{
    if (!srv)
        return;
    srv->destroyed = 1;
    if (srv->listener_open && !uv_is_closing((uv_handle_t *)&srv->listener))
        uv_close((uv_handle_t *)&srv->listener, pd_http__on_listener_closed);
    if (srv->sweep_open && !uv_is_closing((uv_handle_t *)&srv->sweep))
        uv_close((uv_handle_t *)&srv->sweep, pd_http__on_sweep_closed);
    for (pd_http__conn_t *c = srv->conns, *next; c; c = next) {
        next = c->next;
        pd_http__conn_close(c, 0);
    }
    pd_http__server_maybe_free(srv);
}
