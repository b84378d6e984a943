#include "conn_limit.h"

#include <inttypes.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "log.h"
#include "status.h"

size_t conn_limit_for_fds(size_t configured, uint64_t nofile)
{
    uint64_t share;

    if (configured == 0)
        configured = CONN_LIMIT_DEFAULT;
    share =
        nofile > CONN_LIMIT_FD_RESERVE ? (nofile - CONN_LIMIT_FD_RESERVE) / CONN_LIMIT_FD_SHARE : 0;
    if (share < 1)
        share = 1;
    return (uint64_t)configured < share ? configured : (size_t)share;
}

void conn_limit_init(conn_limit_t *l, const char *name, size_t configured)
{
    struct rlimit rl;
    uint64_t nofile = UINT64_MAX;

    *l = (conn_limit_t){.name = name};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        nofile = (uint64_t)rl.rlim_cur;
    l->max = conn_limit_for_fds(configured, nofile);
    if (l->max < (configured ? configured : CONN_LIMIT_DEFAULT))
        pd_log_info("%s: at most %zu connections (RLIMIT_NOFILE %" PRIu64
                    ", %d kept for the rest of the process, shared by %d listeners)",
                    name, l->max, nofile, CONN_LIMIT_FD_RESERVE, CONN_LIMIT_FD_SHARE);
}

/* Logs the rejections and errors since the last line, at most once per CONN_LIMIT_LOG_MS. */
static void conn_limit__report(conn_limit_t *l, uv_loop_t *loop, const char *why)
{
    uint64_t now = uv_now(loop);

    l->unreported++;
    if (l->logged_at && now - l->logged_at < CONN_LIMIT_LOG_MS)
        return;
    pd_log_warn("%s: %s: %" PRIu64 " connection(s) closed at accept since the last report "
                "(%zu open, limit %zu; %" PRIu64 " over the limit and %" PRIu64
                " failed accepts in all)",
                l->name, why, l->unreported, l->open, l->max, l->rejected, l->accept_errors);
    l->unreported = 0;
    l->logged_at = now ? now : 1;
}

static void conn_limit__closed(uv_handle_t *h)
{
    free(h);
}

int conn_limit_on_connection(conn_limit_t *l, uv_stream_t *listener, int status, const char *reply,
                             size_t reply_len)
{
    uv_tcp_t *t;

    if (status < 0) {
        l->accept_errors++;
        conn_limit__report(l, listener->loop, uv_strerror(status));
        return 0;
    }
    if (l->open < l->max) {
        l->open++;
        return 1;
    }
    /* Accept (libuv stops watching the listener until the pending connection is taken) and close.
     */
    t = malloc(sizeof *t);
    if (!t) {
        pd_log_error("%s: out of memory closing a connection over the limit", l->name);
        return 0;
    }
    uv_tcp_init(listener->loop, t);
    if (uv_accept(listener, (uv_stream_t *)t) == 0 && reply_len > 0) {
        uv_buf_t b = uv_buf_init((char *)reply, (unsigned)reply_len);
        (void)uv_try_write((uv_stream_t *)t, &b, 1); /* best effort: the socket buffer is empty */
    }
    uv_close((uv_handle_t *)t, conn_limit__closed);
    l->rejected++;
    conn_limit__report(l, listener->loop, "connection limit reached");
    return 0;
}

void conn_limit_release(conn_limit_t *l)
{
    PD_ASSERT(l->open > 0);
    l->open--;
}
