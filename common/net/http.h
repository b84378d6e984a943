/* http: a small HTTP/1.1 server on a libuv loop, parsing with llhttp. It serves the router's
 * OpenAI API and every binary's /health, /live, /ready and /metrics.
 *
 * The server owns its connections and requests. A route maps a method and a path prefix to a
 * handler (the longest matching prefix wins; a prefix matches the whole path or a path that
 * continues with '/'); no matching path gives a 404 JSON error, a matching path with another
 * method 405, malformed HTTP 400 and a close, a body over max_body 413 and a close, request line
 * plus headers over max_headers 431 and a close. Keep-alive follows HTTP/1.1 rules; pipelined
 * requests are answered one at a time, in order (the next one is parsed after the current one is
 * finished).
 *
 * Slow and idle clients: a connection waiting for a request (new, or kept alive) is closed after
 * idle_timeout_ms; a request whose line and headers do not arrive within header_timeout_ms of its
 * first byte, or whose body does not arrive within body_timeout_ms of its headers, is answered 408
 * and closed; a close that cannot send its last bytes within header_timeout_ms is cut. The time a
 * handler holds a request does not count. At most max_connections are open (lowered to leave file
 * descriptors for the rest of the process, see conn_limit.h); past it a new connection gets a 503
 * and is closed at once.
 *
 * A handler gets the request when its body is complete and must finish it exactly once, now or
 * later from the loop thread: pd_http_respond, pd_http_respond_json, pd_http_respond_error, or
 * pd_http_stream_begin ... pd_http_stream_end. The request stays valid until then, even when the
 * client disconnects first: the close callback (pd_http_request_set_close_cb) is called once,
 * writes return PD_ERR_CANCELLED, and finishing only frees the request. Body, headers and path stay
 * valid for the request's lifetime.
 *
 * Loop thread only: every function here must be called on the thread running the loop (compute
 * threads hand results back with uv_async_send). pd_http_server_destroy closes the listener and
 * every connection; the loop must run afterwards so the close callbacks complete (uv_run until it
 * returns 0, then uv_loop_close() == 0). The server's memory is released once all its handles are
 * closed and every request handed to a handler has been finished.
 */
#ifndef PD_HTTP_H
#define PD_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "status.h"

typedef struct pd_http_server pd_http_server_t;
typedef struct pd_http_request pd_http_request_t;

/* Called on the loop thread with a complete request; see the finishing rule above. */
typedef void (*pd_http_handler_fn)(pd_http_request_t *req, void *user);

/* Called on the loop thread, at most once, when the client of an unfinished request goes away
 * (disconnect, reset, failed write, server destroyed). The handler should cancel its work and
 * finish the request (which then only frees it); it may do so inside this callback. */
typedef void (*pd_http_close_fn)(pd_http_request_t *req, void *arg);

typedef struct {
    size_t max_body;            /* bytes of request body; 0: 1 MiB */
    size_t max_headers;         /* bytes of request line + header fields; 0: 64 KiB */
    uint32_t idle_timeout_ms;   /* connection without a request; 0: 60 s */
    uint32_t header_timeout_ms; /* request line + headers, from the first byte; 0: 10 s */
    uint32_t body_timeout_ms;   /* body, from the end of the headers; 0: 30 s */
    size_t max_connections;     /* open connections; 0: 1024 (then capped, conn_limit.h) */
} pd_http_server_params_t;

typedef struct {
    uint64_t connections;          /* open now */
    uint64_t max_connections;      /* the effective limit */
    uint64_t rejected_connections; /* closed at accept: over the limit */
    uint64_t accept_errors;        /* failed accepts (EMFILE, ...) */
    uint64_t idle_closed;          /* closed by the idle timeout */
    uint64_t timed_out;            /* requests answered 408 (headers or body too slow) */
} pd_http_server_stats_t;

/* Creates a server on loop (params NULL: defaults). Returns PD_OK or PD_ERR_NOMEM; *srv_p is
 * written only on success. Nothing is opened until pd_http_server_listen. */
pd_status_t pd_http_server_create(uv_loop_t *loop, const pd_http_server_params_t *params,
                                  pd_http_server_t **srv_p);

/* Adds a route: method ("GET", "POST"; NULL or "*" for any) and a path prefix starting with '/'
 * ("/" alone matches everything). The same method and prefix twice replaces the handler.
 * Returns PD_OK, PD_ERR_INVALID (bad prefix), PD_ERR_NOMEM; on failure routes are unchanged. */
pd_status_t pd_http_server_route(pd_http_server_t *srv, const char *method, const char *path_prefix,
                                 pd_http_handler_fn fn, void *user);

/* Binds host (IPv4 or IPv6 literal) and port (0: ephemeral) and starts accepting. Returns PD_OK,
 * PD_ERR_INVALID (bad address, already listening), PD_ERR_UNAVAILABLE (address in use),
 * PD_ERR_IO (other socket errors, logged with the address); *bound_port_p (may be NULL) gets the
 * port actually bound, written only on success. On failure the server is not listening; destroy
 * it. */
pd_status_t pd_http_server_listen(pd_http_server_t *srv, const char *host, int port,
                                  int *bound_port_p);

/* Credentials check, run for every request that matches a route, before its handler: returns 0
 * to let it through, or 401 / 403 to answer that (JSON error with *why_p, or a generic message)
 * without calling the handler. Headers are readable (pd_http_request_header). */
typedef int (*pd_http_auth_fn)(const pd_http_request_t *req, void *arg, const char **why_p);

/* Sets (fn NULL: removes) the server's credentials check. */
void pd_http_server_set_auth(pd_http_server_t *srv, pd_http_auth_fn fn, void *arg);

/* Writes the server's counters. */
void pd_http_server_stats(const pd_http_server_t *srv, pd_http_server_stats_t *stats_p);

/* Stops accepting, closes every connection (close callbacks of unfinished requests run now) and
 * releases the server once the loop has closed its handles; NULL is accepted. */
void pd_http_server_destroy(pd_http_server_t *srv);

/* ==== requests ==== */

/* "GET", "POST", ... */
const char *pd_http_request_method(const pd_http_request_t *req);

/* The path of the request target, without the query ("/v1/completions"); not percent-decoded. */
const char *pd_http_request_path(const pd_http_request_t *req);

/* The query after '?', without it; "" when there is none. */
const char *pd_http_request_query(const pd_http_request_t *req);

/* Returns the value of the first header called name (case-insensitive), or NULL. */
const char *pd_http_request_header(const pd_http_request_t *req, const char *name);

/* Returns the body (NUL-terminated for convenience, may hold NULs) and its length in *len_p. */
const char *pd_http_request_body(const pd_http_request_t *req, size_t *len_p);

/* Parses the body as JSON. Returns PD_OK or PD_ERR_FORMAT (not JSON; nothing logged, the caller
 * decides what a bad body is); *json_p (a new reference) is written only on success. */
pd_status_t pd_http_request_json(const pd_http_request_t *req, json_t **json_p);

/* Nonzero when the connection stays open after this request. */
int pd_http_request_keep_alive(const pd_http_request_t *req);

/* Nonzero once the client has gone away. */
int pd_http_request_gone(const pd_http_request_t *req);

/* Bytes written to the socket's queue and not yet sent (for back-pressure while streaming). */
size_t pd_http_request_pending_bytes(const pd_http_request_t *req);

/* Sets (fn NULL: clears) the callback told when the client goes away before the request is
 * finished. Setting it after the client has gone does not call it. */
void pd_http_request_set_close_cb(pd_http_request_t *req, pd_http_close_fn fn, void *arg);

/* ==== responses: each finishes the request (it must not be used afterwards) ==== */

/* Sends a complete response with Content-Length. Returns PD_OK, PD_ERR_CANCELLED (client gone),
 * PD_ERR_INVALID (the request was streaming: it is not finished then), PD_ERR_NOMEM or
 * PD_ERR_TRANSPORT (the connection is closed). */
pd_status_t pd_http_respond(pd_http_request_t *req, int status, const char *content_type,
                            const void *body, size_t len);

/* Sends body (steals the reference; NULL sends a 500 error) as application/json. Same returns. */
pd_status_t pd_http_respond_json(pd_http_request_t *req, int status, json_t *body);

/* Sends {"error": {"message": message, "type": ..., "code": ...}} with the HTTP status
 * pd_status_http_code(st); type is "invalid_request_error" (4xx), "rate_limit_error" (429) or
 * "server_error" (5xx), code is the status name in lowercase without PD_/ERR_ ("not_found").
 * message NULL: pd_status_str(st). Same returns. */
/* The OpenAI-style error object pd_http_respond_error sends for st, as malloc'd JSON text (for
 * an error inside a stream: the same shape); NULL when out of memory. */
char *pd_http_error_json(pd_status_t st, const char *message);

/* An OpenAI-style error with an explicit HTTP status and code ("model_not_found"). */
pd_status_t pd_http_respond_error_code(pd_http_request_t *req, int status, const char *code,
                                       const char *message);

pd_status_t pd_http_respond_error(pd_http_request_t *req, pd_status_t st, const char *message);

/* Sends the status line and headers of a streamed response (chunked transfer encoding; for an
 * HTTP/1.0 client the body is raw and the connection closes at the end). Does not finish the
 * request. Returns PD_OK, PD_ERR_CANCELLED, PD_ERR_INVALID (already begun), PD_ERR_NOMEM,
 * PD_ERR_TRANSPORT. */
pd_status_t pd_http_stream_begin(pd_http_request_t *req, int status, const char *content_type);

/* Sends len bytes as one chunk (len 0 sends nothing). Returns as pd_http_stream_begin;
 * PD_ERR_INVALID when the stream has not begun. */
pd_status_t pd_http_stream_write(pd_http_request_t *req, const void *data, size_t len);

/* Sends one server-sent event "data: <json_text>\n\n". Returns as pd_http_stream_write. */
pd_status_t pd_http_stream_sse(pd_http_request_t *req, const char *json_text);

/* Ends the stream (the last chunk) and finishes the request; after a disconnect it only frees.
 * Returns PD_OK, PD_ERR_CANCELLED, PD_ERR_INVALID (not streaming: the request is not finished),
 * PD_ERR_TRANSPORT. */
pd_status_t pd_http_stream_end(pd_http_request_t *req);

/* Returns the reason phrase of an HTTP status ("Not Found"), "Unknown" for others. */
const char *pd_http_status_reason(int status);

#endif
