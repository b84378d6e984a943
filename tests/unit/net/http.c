/* Tests common/http.c: a server on an ephemeral port runs its loop on a second thread; the test
 * talks to it over plain blocking sockets so every byte (pipelining, bad requests, disconnects) is
 * under its control. Checks GET/POST/JSON, 404/405/413/431/400, chunked SSE, keep-alive and
 * pipelining, HTTP/1.0, the close callback on disconnect and on server destroy, and that the loop
 * closes cleanly (uv_loop_close() == 0). Two more servers on the same loop have short limits: T
 * (idle / header / body timeouts of 300 ms) and L (4 connections at most); the tests wait for the
 * server's close (EOF) or its 408 / 503, never for a fixed time. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "http.h"

/* ==== the server thread ==== */

static struct {
    uv_loop_t loop;
    uv_async_t stop;
    pd_http_server_t *srv;
    pd_http_server_t *tsrv, *lsrv; /* short timeouts; connection limit */
    int tport, lport;
    uv_timer_t slow; /* answers /slow later */
    pd_http_request_t *slow_req;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int port;    /* 0 until listening, -1 on failure */
    int loop_rc; /* uv_loop_close() result */
    atomic_int close_calls;
    atomic_int end_status; /* what pd_http_stream_end returned in the close callback */
} S;

static void h_hello(pd_http_request_t *req, void *user)
{
    char body[256];
    const char *t = pd_http_request_header(req, "x-TEST");
    (void)user;
    snprintf(body, sizeof body, "hello %s %s %s", pd_http_request_path(req),
             pd_http_request_query(req), t ? t : "-");
    pd_http_respond(req, 200, "text/plain", body, strlen(body));
}

static void h_echo(pd_http_request_t *req, void *user)
{
    json_t *j;
    size_t len;
    (void)user;
    if (pd_http_request_json(req, &j) != PD_OK) {
        pd_http_respond_error(req, PD_ERR_FORMAT, "body is not json");
        return;
    }
    pd_http_request_body(req, &len);
    pd_http_respond_json(req, 200, json_pack("{s:o, s:I}", "got", j, "len", (json_int_t)len));
}

static void h_tag(pd_http_request_t *req, void *user)
{
    pd_http_respond(req, 200, "text/plain", user, strlen(user));
}

static void h_sse(pd_http_request_t *req, void *user)
{
    (void)user;
    assert_int_equal(pd_http_stream_begin(req, 200, "text/event-stream"), PD_OK);
    for (int i = 0; i < 3; i++) {
        char ev[32];
        snprintf(ev, sizeof ev, "{\"i\":%d}", i);
        assert_int_equal(pd_http_stream_sse(req, ev), PD_OK);
    }
    assert_int_equal(pd_http_stream_write(req, "raw", 3), PD_OK);
    assert_int_equal(pd_http_stream_write(req, "", 0), PD_OK);
    assert_int_equal(pd_http_respond(req, 200, NULL, "x", 1), PD_ERR_INVALID); /* streaming */
    assert_int_equal(pd_http_stream_end(req), PD_OK);
}

static void on_client_gone(pd_http_request_t *req, void *arg)
{
    (void)arg;
    assert_true(pd_http_request_gone(req));
    assert_int_equal(pd_http_stream_sse(req, "{}"), PD_ERR_CANCELLED);
    atomic_store(&S.end_status, pd_http_stream_end(req));
    atomic_fetch_add(&S.close_calls, 1);
}

/* Starts a stream and leaves it open until the client goes away. */
static void h_hang(pd_http_request_t *req, void *user)
{
    (void)user;
    pd_http_request_set_close_cb(req, on_client_gone, NULL);
    pd_http_stream_begin(req, 200, "text/event-stream");
    pd_http_stream_sse(req, "{\"first\":true}");
}

static void on_slow_timer(uv_timer_t *t)
{
    (void)t;
    pd_http_respond(S.slow_req, 200, "text/plain", "slow", 4);
    S.slow_req = NULL;
}

/* Answers after 3 idle timeouts of T: the time a handler holds a request does not count. */
static void h_slow(pd_http_request_t *req, void *user)
{
    (void)user;
    S.slow_req = req;
    uv_timer_start(&S.slow, on_slow_timer, 900, 0);
}

/* The counters of T and L. */
static void h_stats(pd_http_request_t *req, void *user)
{
    pd_http_server_stats_t t, l;
    (void)user;
    pd_http_server_stats(S.tsrv, &t);
    pd_http_server_stats(S.lsrv, &l);
    pd_http_respond_json(
        req, 200,
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "t_idle", (json_int_t)t.idle_closed, "t_408",
                  (json_int_t)t.timed_out, "l_open", (json_int_t)l.connections, "l_max",
                  (json_int_t)l.max_connections, "l_rejected", (json_int_t)l.rejected_connections,
                  "l_idle", (json_int_t)l.idle_closed));
}

static void on_stop(uv_async_t *a)
{
    pd_http_server_destroy(S.srv);
    pd_http_server_destroy(S.tsrv);
    pd_http_server_destroy(S.lsrv);
    uv_close((uv_handle_t *)&S.slow, NULL);
    uv_close((uv_handle_t *)a, NULL);
}

static void *server_main(void *arg)
{
    pd_http_server_params_t params = {.max_body = 1024, .max_headers = 4096};
    pd_http_server_params_t tparams = {
        .idle_timeout_ms = 300, .header_timeout_ms = 300, .body_timeout_ms = 300};
    pd_http_server_params_t lparams = {.max_connections = 4, .idle_timeout_ms = 2000};
    int port = -1;
    (void)arg;

    uv_loop_init(&S.loop);
    uv_async_init(&S.loop, &S.stop, on_stop);
    uv_timer_init(&S.loop, &S.slow);
    if (pd_http_server_create(&S.loop, &tparams, &S.tsrv) != PD_OK ||
        pd_http_server_route(S.tsrv, NULL, "/hello", h_hello, NULL) != PD_OK ||
        pd_http_server_route(S.tsrv, "POST", "/echo", h_echo, NULL) != PD_OK ||
        pd_http_server_route(S.tsrv, "GET", "/slow", h_slow, NULL) != PD_OK ||
        pd_http_server_listen(S.tsrv, "127.0.0.1", 0, &S.tport) != PD_OK ||
        pd_http_server_create(&S.loop, &lparams, &S.lsrv) != PD_OK ||
        pd_http_server_route(S.lsrv, NULL, "/hello", h_hello, NULL) != PD_OK ||
        pd_http_server_listen(S.lsrv, "127.0.0.1", 0, &S.lport) != PD_OK)
        S.tport = -1;
    if (pd_http_server_create(&S.loop, &params, &S.srv) == PD_OK &&
        pd_http_server_route(S.srv, "GET", "/hello", h_hello, NULL) == PD_OK &&
        pd_http_server_route(S.srv, "POST", "/echo", h_echo, NULL) == PD_OK &&
        pd_http_server_route(S.srv, "POST", "/post-only", h_echo, NULL) == PD_OK &&
        pd_http_server_route(S.srv, "GET", "/sse", h_sse, NULL) == PD_OK &&
        pd_http_server_route(S.srv, "GET", "/hang", h_hang, NULL) == PD_OK &&
        pd_http_server_route(S.srv, "GET", "/stats", h_stats, NULL) == PD_OK && S.tport > 0 &&
        pd_http_server_route(S.srv, NULL, "/api", h_tag, "api") == PD_OK &&
        pd_http_server_route(S.srv, "*", "/api/v2", h_tag, "old") == PD_OK &&
        pd_http_server_route(S.srv, "*", "/api/v2", h_tag, "v2") == PD_OK) /* replaces */
        pd_http_server_listen(S.srv, "127.0.0.1", 0, &port);
    pthread_mutex_lock(&S.mu);
    S.port = port > 0 ? port : -1;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
    uv_run(&S.loop, UV_RUN_DEFAULT);
    S.loop_rc = uv_loop_close(&S.loop);
    return NULL;
}

static int setup(void **state)
{
    (void)state;
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    pthread_create(&S.thread, NULL, server_main, NULL);
    pthread_mutex_lock(&S.mu);
    while (S.port == 0)
        pthread_cond_wait(&S.cv, &S.mu);
    pthread_mutex_unlock(&S.mu);
    return S.port > 0 ? 0 : -1;
}

/* ==== a blocking client ==== */

typedef struct {
    int fd;
    char buf[1 << 16];
    size_t len;
} client_t;

typedef struct {
    int status;
    char headers[4096]; /* lowercased header block */
    char body[1 << 15];
    size_t body_len;
} response_t;

static void cl_open_port(client_t *c, int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct timeval tv = {5, 0};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    c->len = 0;
    c->buf[0] = 0;
    assert_true(c->fd >= 0);
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(connect(c->fd, (struct sockaddr *)&a, sizeof a), 0);
}

static void cl_open(client_t *c)
{
    cl_open_port(c, S.port);
}

static void cl_send(client_t *c, const char *s, size_t len)
{
    assert_int_equal(send(c->fd, s, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* Reads more bytes; returns 0 on EOF or timeout. */
static size_t cl_fill(client_t *c)
{
    ssize_t n = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len - 1, 0);
    if (n <= 0)
        return 0;
    c->len += (size_t)n;
    c->buf[c->len] = 0;
    return (size_t)n;
}

static void cl_consume(client_t *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
    c->buf[c->len] = 0;
}

/* Reads one response; returns -1 on EOF before it is complete. */
static int cl_response(client_t *c, response_t *r)
{
    char *end;
    size_t hlen;

    c->buf[c->len] = 0;
    while (!(end = strstr(c->buf, "\r\n\r\n")))
        if (!cl_fill(c))
            return -1;
    hlen = (size_t)(end - c->buf) + 4;
    memset(r, 0, sizeof *r);
    snprintf(r->headers, sizeof r->headers, "%.*s", (int)hlen, c->buf);
    for (char *p = r->headers; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    r->status = atoi(c->buf + 9);
    cl_consume(c, hlen);
    if (r->status == 100)
        return cl_response(c, r);
    char *cl = strstr(r->headers, "content-length:");
    if (cl) {
        size_t n = strtoul(cl + 15, NULL, 10);
        while (c->len < n)
            if (!cl_fill(c))
                return -1;
        memcpy(r->body, c->buf, n);
        r->body_len = n;
        cl_consume(c, n);
        return 0;
    }
    if (strstr(r->headers, "transfer-encoding: chunked")) {
        for (;;) {
            char *crlf;
            while (!(crlf = strstr(c->buf, "\r\n")))
                if (!cl_fill(c))
                    return -1;
            size_t n = strtoul(c->buf, NULL, 16), skip = (size_t)(crlf - c->buf) + 2;
            while (c->len < skip + n + 2)
                if (!cl_fill(c))
                    return -1;
            assert_memory_equal(c->buf + skip + n, "\r\n", 2);
            memcpy(r->body + r->body_len, c->buf + skip, n);
            r->body_len += n;
            cl_consume(c, skip + n + 2);
            if (n == 0)
                return 0;
        }
    }
    while (cl_fill(c)) /* until close */
        ;
    memcpy(r->body, c->buf, c->len);
    r->body_len = c->len;
    cl_consume(c, c->len);
    return 0;
}

/* Expects the server to close the connection. */
static void cl_expect_eof(client_t *c)
{
    assert_int_equal(c->len, 0);
    assert_int_equal(cl_fill(c), 0);
}

/* Waits for the server to close: recv returns 0 (a timeout of SO_RCVTIMEO, 5 s, fails). */
static void cl_wait_eof(client_t *c)
{
    ssize_t n;
    while ((n = recv(c->fd, c->buf, sizeof c->buf - 1, 0)) > 0)
        ;
    if (n < 0)
        print_error("no close from the server: %s\n", strerror(errno));
    assert_int_equal(n, 0);
    c->len = 0;
}

static void request(const char *raw, response_t *r)
{
    client_t *c = malloc(sizeof *c);
    cl_open(c);
    cl_send(c, raw, strlen(raw));
    if (cl_response(c, r) != 0) {
        print_error("no complete response to: %s\n", raw);
        fail();
    }
    close(c->fd);
    free(c);
}

/* ==== tests ==== */

static response_t R;

static void test_get_post(void **state)
{
    (void)state;
    request("GET /hello?x=1&y=2 HTTP/1.1\r\nHost: t\r\nX-Test: v\r\n\r\n", &R);
    assert_int_equal(R.status, 200);
    assert_string_equal(R.body, "hello /hello x=1&y=2 v");
    assert_non_null(strstr(R.headers, "content-type: text/plain\r\n"));
    assert_non_null(strstr(R.headers, "connection: keep-alive\r\n"));

    request("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            "Content-Length: 15\r\n\r\n{\"a\":1,\"b\":[2]}",
            &R);
    assert_int_equal(R.status, 200);
    assert_string_equal(R.body, "{\"got\":{\"a\":1,\"b\":[2]},\"len\":15}");
    assert_non_null(strstr(R.headers, "content-type: application/json\r\n"));

    /* chunked request body */
    request("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            "3\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n",
            &R);
    assert_int_equal(R.status, 200);
    assert_string_equal(R.body, "{\"got\":[1,2],\"len\":5}");

    request("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\n{x}", &R);
    assert_int_equal(R.status, 400);
    assert_string_equal(R.body, "{\"error\":{\"message\":\"body is not json\",\"type\":"
                                "\"invalid_request_error\",\"code\":\"format\"}}");
}

static void test_routes(void **state)
{
    (void)state;
    request("GET /nope HTTP/1.1\r\nHost: t\r\n\r\n", &R);
    assert_int_equal(R.status, 404);
    assert_string_equal(R.body, "{\"error\":{\"message\":\"GET /nope: no such route\",\"type\":"
                                "\"invalid_request_error\",\"code\":\"not_found\"}}");
    request("GET /post-only HTTP/1.1\r\nHost: t\r\n\r\n", &R);
    assert_int_equal(R.status, 405);
    request("GET /api/v2/models HTTP/1.1\r\nHost: t\r\n\r\n", &R);
    assert_string_equal(R.body, "v2");
    request("DELETE /api/v1 HTTP/1.1\r\nHost: t\r\n\r\n", &R);
    assert_string_equal(R.body, "api");
    request("GET /api HTTP/1.1\r\nHost: t\r\n\r\n", &R);
    assert_string_equal(R.body, "api");
    request("GET /apix HTTP/1.1\r\nHost: t\r\n\r\n", &R);
    assert_int_equal(R.status, 404);
}

static void test_limits(void **state)
{
    client_t *c = malloc(sizeof *c);
    char big[8192];
    (void)state;

    /* declared body too large: answered before the body is sent, then closed */
    cl_open(c);
    const char *req = "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\n";
    cl_send(c, req, strlen(req));
    assert_int_equal(cl_response(c, &R), 0);
    assert_int_equal(R.status, 413);
    assert_non_null(strstr(R.headers, "connection: close\r\n"));
    assert_non_null(strstr(R.body, "\"code\":\"too_long\""));
    cl_expect_eof(c);
    close(c->fd);

    /* chunked body growing too large */
    cl_open(c);
    req = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    cl_send(c, req, strlen(req));
    memset(big, 'a', sizeof big);
    int n = snprintf(big, 16, "%x\r\n", 2000);
    big[n] = 'a';
    cl_send(c, big, (size_t)n + 2000);
    assert_int_equal(cl_response(c, &R), 0);
    assert_int_equal(R.status, 413);
    close(c->fd);

    /* headers too large */
    cl_open(c);
    n = snprintf(big, sizeof big, "GET /hello HTTP/1.1\r\nX-Big: ");
    memset(big + n, 'b', 5000);
    memcpy(big + n + 5000, "\r\n\r\n", 5);
    cl_send(c, big, strlen(big));
    assert_int_equal(cl_response(c, &R), 0);
    assert_int_equal(R.status, 431);
    close(c->fd);

    /* malformed */
    cl_open(c);
    req = "GET /hello HTTP/1.1\r\nHost t\r\n\r\n";
    cl_send(c, req, strlen(req));
    assert_int_equal(cl_response(c, &R), 0);
    assert_int_equal(R.status, 400);
    assert_non_null(strstr(R.headers, "connection: close\r\n"));
    cl_expect_eof(c);
    close(c->fd);
    free(c);
}

static void test_sse(void **state)
{
    (void)state;
    request("GET /sse HTTP/1.1\r\nHost: t\r\n\r\n", &R);
    assert_int_equal(R.status, 200);
    assert_non_null(strstr(R.headers, "transfer-encoding: chunked\r\n"));
    assert_non_null(strstr(R.headers, "content-type: text/event-stream\r\n"));
    assert_string_equal(R.body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\nraw");

    /* HTTP/1.0: raw body, closed at the end */
    request("GET /sse HTTP/1.0\r\n\r\n", &R);
    assert_int_equal(R.status, 200);
    assert_null(strstr(R.headers, "transfer-encoding"));
    assert_non_null(strstr(R.headers, "connection: close\r\n"));
    assert_string_equal(R.body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\nraw");
}

static void test_keep_alive(void **state)
{
    client_t *c = malloc(sizeof *c);
    (void)state;

    cl_open(c);
    const char *a = "GET /hello?n=1 HTTP/1.1\r\nHost: t\r\n\r\n";
    cl_send(c, a, strlen(a));
    assert_int_equal(cl_response(c, &R), 0);
    assert_string_equal(R.body, "hello /hello n=1 -");
    const char *b = "GET /hello?n=2 HTTP/1.1\r\nHost: t\r\n\r\n";
    cl_send(c, b, strlen(b));
    assert_int_equal(cl_response(c, &R), 0);
    assert_string_equal(R.body, "hello /hello n=2 -");

    /* pipelined: three requests in one write, answered in order, the last one closes */
    const char *p = "GET /sse HTTP/1.1\r\nHost: t\r\n\r\n"
                    "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n[]"
                    "GET /hello?n=3 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    cl_send(c, p, strlen(p));
    assert_int_equal(cl_response(c, &R), 0);
    assert_int_equal(R.status, 200);
    assert_non_null(strstr(R.body, "data: {\"i\":2}"));
    assert_int_equal(cl_response(c, &R), 0);
    assert_string_equal(R.body, "{\"got\":[],\"len\":2}");
    assert_int_equal(cl_response(c, &R), 0);
    assert_string_equal(R.body, "hello /hello n=3 -");
    assert_non_null(strstr(R.headers, "connection: close\r\n"));
    cl_expect_eof(c);
    close(c->fd);
    free(c);
}

static json_int_t server_stat(const char *key)
{
    json_t *j;
    json_int_t v;
    request("GET /stats HTTP/1.1\r\nHost: t\r\n\r\n", &R);
    assert_int_equal(R.status, 200);
    j = json_loads(R.body, 0, NULL);
    assert_non_null(j);
    v = json_integer_value(json_object_get(j, key));
    json_decref(j);
    return v;
}

static void test_idle_timeout(void **state)
{
    client_t *c = malloc(sizeof *c), *d = malloc(sizeof *d);
    (void)state;

    cl_open_port(c, S.tport); /* sends nothing */
    cl_open_port(d, S.tport); /* one request, then keeps the connection */
    const char *a = "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n";
    cl_send(d, a, strlen(a));
    assert_int_equal(cl_response(d, &R), 0);
    assert_int_equal(R.status, 200);
    assert_non_null(strstr(R.headers, "connection: keep-alive\r\n"));
    cl_wait_eof(c);
    cl_wait_eof(d);
    assert_int_equal(server_stat("t_idle"), 2);
    close(c->fd);
    close(d->fd);

    /* a handler holding the request three idle timeouts long: answered, not closed */
    cl_open_port(c, S.tport);
    const char *b = "GET /slow HTTP/1.1\r\nHost: t\r\n\r\n";
    cl_send(c, b, strlen(b));
    assert_int_equal(cl_response(c, &R), 0);
    assert_int_equal(R.status, 200);
    assert_string_equal(R.body, "slow");
    cl_wait_eof(c); /* and idle again afterwards */
    close(c->fd);
    free(c);
    free(d);
}

static void test_slow_request(void **state)
{
    client_t *c = malloc(sizeof *c);
    (void)state;

    /* headers never finish: 408 and close */
    cl_open_port(c, S.tport);
    const char *a = "GET /hello HTTP/1.1\r\nHost: t\r\nX-Slow: ";
    cl_send(c, a, strlen(a));
    assert_int_equal(cl_response(c, &R), 0);
    assert_int_equal(R.status, 408);
    assert_non_null(strstr(R.headers, "connection: close\r\n"));
    assert_non_null(strstr(R.body, "\"code\":\"timeout\""));
    assert_non_null(strstr(R.body, "headers not received within 300 ms"));
    cl_wait_eof(c);
    close(c->fd);

    /* the body stops short of its Content-Length: 408 and close */
    cl_open_port(c, S.tport);
    const char *b = "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n[1,";
    cl_send(c, b, strlen(b));
    assert_int_equal(cl_response(c, &R), 0);
    assert_int_equal(R.status, 408);
    assert_non_null(strstr(R.body, "body not received within 300 ms"));
    cl_wait_eof(c);
    close(c->fd);
    assert_int_equal(server_stat("t_408"), 2);
    free(c);
}

static void test_connection_limit(void **state)
{
    client_t *c[5];
    const char *a = "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n";
    (void)state;

    assert_int_equal(server_stat("l_max"), 4);
    for (int i = 0; i < 5; i++)
        c[i] = malloc(sizeof *c[i]);
    for (int i = 0; i < 4; i++) { /* the limit, each one accepted (answered) */
        cl_open_port(c[i], S.lport);
        cl_send(c[i], a, strlen(a));
        assert_int_equal(cl_response(c[i], &R), 0);
        assert_int_equal(R.status, 200);
    }
    assert_int_equal(server_stat("l_open"), 4);
    /* one more: 503 and closed at once; the other servers still answer */
    cl_open_port(c[4], S.lport);
    assert_int_equal(cl_response(c[4], &R), 0);
    assert_int_equal(R.status, 503);
    assert_non_null(strstr(R.body, "too many connections"));
    cl_wait_eof(c[4]);
    close(c[4]->fd);
    assert_int_equal(server_stat("l_rejected"), 1);
    /* the idle timeout frees the slots; then a new connection is served */
    for (int i = 0; i < 4; i++) {
        cl_wait_eof(c[i]);
        close(c[i]->fd);
    }
    cl_open_port(c[4], S.lport);
    cl_send(c[4], a, strlen(a));
    assert_int_equal(cl_response(c[4], &R), 0);
    assert_int_equal(R.status, 200);
    close(c[4]->fd);
    assert_int_equal(server_stat("l_idle"), 4);
    for (int i = 0; i < 5; i++)
        free(c[i]);
}

static void wait_close_calls(int n)
{
    for (int i = 0; i < 500 && atomic_load(&S.close_calls) < n; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&S.close_calls), n);
}

static void test_disconnect(void **state)
{
    client_t *c = malloc(sizeof *c);
    (void)state;

    cl_open(c);
    const char *a = "GET /hang HTTP/1.1\r\nHost: t\r\n\r\n";
    cl_send(c, a, strlen(a));
    while (!strstr(c->buf, "data: {\"first\":true}"))
        assert_true(cl_fill(c) > 0);
    assert_int_equal(atomic_load(&S.close_calls), 0);
    close(c->fd);
    wait_close_calls(1);
    assert_int_equal(atomic_load(&S.end_status), PD_ERR_CANCELLED);

    /* the server is destroyed while a request is open: its close callback runs too */
    cl_open(c);
    cl_send(c, a, strlen(a));
    while (!strstr(c->buf, "data: {\"first\":true}"))
        assert_true(cl_fill(c) > 0);
    uv_async_send(&S.stop);
    pthread_join(S.thread, NULL);
    assert_int_equal(atomic_load(&S.close_calls), 2);
    assert_int_equal(S.loop_rc, 0);
    close(c->fd);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_post),     cmocka_unit_test(test_routes),
        cmocka_unit_test(test_limits),       cmocka_unit_test(test_sse),
        cmocka_unit_test(test_keep_alive),   cmocka_unit_test(test_idle_timeout),
        cmocka_unit_test(test_slow_request), cmocka_unit_test(test_connection_limit),
        cmocka_unit_test(test_disconnect), /* last: stops */
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
