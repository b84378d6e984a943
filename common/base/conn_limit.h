/* conn_limit: how many connections one listener (HTTP or gRPC server) may hold, and what happens to
 * the ones past it. The limit leaves file descriptors for the rest of the process: a flood of idle
 * connections on one port must not stop the others (or the outgoing connections) from working.
 *
 * A server embeds one conn_limit_t per listener, calls conn_limit_on_connection from its libuv
 * connection callback and conn_limit_release when a counted connection's handle is closed. Past
 * the limit a connection is accepted and closed at once (after an optional short reply written
 * without waiting), so the listener neither stalls nor spins; these and failed accepts (EMFILE)
 * are counted and logged at most once per CONN_LIMIT_LOG_MS, the first one of a burst at once.
 *
 * Loop thread only; no global state.
 */
#ifndef PD_CONN_LIMIT_H
#define PD_CONN_LIMIT_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#define CONN_LIMIT_DEFAULT 1024   /* connections per listener when none is configured */
#define CONN_LIMIT_FD_RESERVE 128 /* descriptors kept for everything but the listeners */
#define CONN_LIMIT_FD_SHARE 2     /* listeners a process is assumed to have (router: gRPC + HTTP) */
#define CONN_LIMIT_LOG_MS 10000   /* at most one log line per listener per this many ms */

typedef struct {
    const char *name;       /* log prefix ("http", "grpc server"); not owned */
    size_t max;             /* the effective limit */
    size_t open;            /* counted connections whose handle is not closed yet */
    uint64_t rejected;      /* closed at accept because of the limit, since init */
    uint64_t accept_errors; /* failed accepts (EMFILE, ...), since init */
    uint64_t unreported;    /* rejections and errors not logged yet */
    uint64_t logged_at;     /* uv_now of the last log line; 0: none yet */
} conn_limit_t;

/* The limit for configured (0: CONN_LIMIT_DEFAULT) when the process may open nofile descriptors:
 * min(configured, (nofile - CONN_LIMIT_FD_RESERVE) / CONN_LIMIT_FD_SHARE), at least 1. */
size_t conn_limit_for_fds(size_t configured, uint64_t nofile);

/* Sets up l for a listener called name with conn_limit_for_fds(configured, RLIMIT_NOFILE soft
 * limit); logs (info) when the limit had to be lowered. */
void conn_limit_init(conn_limit_t *l, const char *name, size_t configured);

/* To call from a uv_connection_cb with its status. Returns 1 when the caller should accept the
 * connection (it is counted in l->open: call conn_limit_release once its handle is closed);
 * 0 when there is nothing to accept (status < 0) or the connection was over the limit (then it
 * was accepted, sent reply when reply_len > 0, and closed). */
int conn_limit_on_connection(conn_limit_t *l, uv_stream_t *listener, int status, const char *reply,
                             size_t reply_len);

/* A connection counted by conn_limit_on_connection is gone. */
void conn_limit_release(conn_limit_t *l);

#endif
