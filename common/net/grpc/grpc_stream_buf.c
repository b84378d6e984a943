#include "grpc_stream_buf.h"

#include <stdlib.h>
#include <string.h>

struct pd_grpc_stream_buf {
    pd_grpc_call_t *call;
    const pd_grpc_stream_buf_ops_t *ops;
    void *arg;
    int32_t *ids; /* (cap_ids) queued items */
    size_t n_ids, cap_ids;
    char *text; /* (text_cap) queued bytes, NUL-terminated */
    size_t text_len, text_cap;
    int busy;      /* inside a send: a cancel callback only marks, the outer frame settles */
    int cancelled; /* the client is gone: output is dropped */
    int told;      /* ops->cancelled ran (or append reported the cancel) */
    int ended;
    int final_sent;
    pd_status_t end_st;
    char *end_msg;
};

static void pd_grpc_stream_buf__drop(pd_grpc_stream_buf_t *buf)
{
    buf->n_ids = 0;
    buf->text_len = 0;
    if (buf->text)
        buf->text[0] = 0;
}

/* Sends what is queued as one message. Returns 1 when the call did not take it (the writable
 * callback comes), 0 when nothing is left queued (sent, dropped on an error, or client gone). */
static int pd_grpc_stream_buf__flush(pd_grpc_stream_buf_t *buf)
{
    pd_status_t st;

    if (!buf->cancelled && buf->n_ids == 0 && buf->text_len == 0)
        return 0;
    if (!buf->cancelled) {
        buf->busy++;
        st = buf->ops->send_output(buf->call, buf->ids, buf->n_ids, buf->text ? buf->text : "",
                                   buf->text_len, buf->arg);
        buf->busy--;
        if (st == PD_AGAIN && !buf->cancelled)
            return 1;
    }
    pd_grpc_stream_buf__drop(buf); /* sent, or the call is gone */
    return 0;
}

/* Sends the final message before an OK status. Returns 1 when the call did not take it yet. */
static int pd_grpc_stream_buf__send_final(pd_grpc_stream_buf_t *buf)
{
    pd_status_t st;

    if (buf->cancelled || buf->final_sent || buf->end_st != PD_OK || !buf->ops->send_final)
        return 0;
    buf->busy++;
    st = buf->ops->send_final(buf->call, buf->arg);
    buf->busy--;
    if (st == PD_AGAIN && !buf->cancelled)
        return 1; /* the last output filled the call's buffer: once writable */
    buf->final_sent = 1;
    return 0;
}

/* Finishes the call, frees buf and tells the owner. */
static void pd_grpc_stream_buf__release(pd_grpc_stream_buf_t *buf)
{
    void (*released)(void *arg) = buf->ops->released;
    void *arg = buf->arg;

    if (buf->end_st == PD_OK)
        (void)pd_grpc_call_finish(buf->call, 0, NULL);
    else
        (void)pd_grpc_call_finish_status(buf->call, buf->end_st, buf->end_msg);
    free(buf->ids);
    free(buf->text);
    free(buf->end_msg);
    free(buf);
    if (released)
        released(arg);
}

/* After an event: releases once ended and drained (or the client is gone), or tells the owner of
 * a cancel. buf may be freed on return. */
static void pd_grpc_stream_buf__settle(pd_grpc_stream_buf_t *buf)
{
    if (buf->busy)
        return;
    if (buf->ended) {
        if (pd_grpc_stream_buf__flush(buf) == 0 && pd_grpc_stream_buf__send_final(buf) == 0)
            pd_grpc_stream_buf__release(buf);
        return;
    }
    if (buf->cancelled && !buf->told) {
        buf->told = 1;
        if (buf->ops->cancelled)
            buf->ops->cancelled(buf->arg); /* may end (and free) buf */
    }
}

static void pd_grpc_stream_buf__writable(pd_grpc_call_t *call, void *arg)
{
    pd_grpc_stream_buf_t *buf = arg;
    (void)call;
    if (!buf->ended)
        (void)pd_grpc_stream_buf__flush(buf);
    pd_grpc_stream_buf__settle(buf);
}

static void pd_grpc_stream_buf__cancelled(pd_grpc_call_t *call, void *arg)
{
    pd_grpc_stream_buf_t *buf = arg;
    (void)call;
    buf->cancelled = 1;
    pd_grpc_stream_buf__drop(buf);
    pd_grpc_stream_buf__settle(buf);
}

pd_status_t pd_grpc_stream_buf_create(pd_grpc_call_t *call, const pd_grpc_stream_buf_ops_t *ops,
                                      void *arg, pd_grpc_stream_buf_t **buf_p)
{
    pd_grpc_stream_buf_t *buf = calloc(1, sizeof *buf);

    if (!buf)
        return PD_ERR_NOMEM;
    buf->call = call;
    buf->ops = ops;
    buf->arg = arg;
    buf->cancelled = buf->told = pd_grpc_call_is_cancelled(call);
    pd_grpc_call_set_writable_cb(call, pd_grpc_stream_buf__writable, buf);
    pd_grpc_call_set_cancel_cb(call, pd_grpc_stream_buf__cancelled, buf);
    *buf_p = buf;
    return PD_OK;
}

pd_status_t pd_grpc_stream_buf_append(pd_grpc_stream_buf_t *buf, const int32_t *ids, size_t n_ids,
                                      const char *text, size_t text_len)
{
    if (buf->ended)
        return PD_ERR_INVALID;
    if (buf->cancelled)
        return PD_ERR_CANCELLED;
    if (buf->n_ids + n_ids > buf->cap_ids) {
        size_t cap = (buf->n_ids + n_ids) * 2 + 8;
        int32_t *p = realloc(buf->ids, cap * sizeof *p);
        if (!p)
            return PD_ERR_NOMEM;
        buf->ids = p;
        buf->cap_ids = cap;
    }
    if (buf->text_len + text_len + 1 > buf->text_cap) {
        size_t cap = (buf->text_len + text_len + 1) * 2;
        char *p = realloc(buf->text, cap);
        if (!p)
            return PD_ERR_NOMEM;
        buf->text = p;
        buf->text_cap = cap;
    }
    if (n_ids)
        memcpy(buf->ids + buf->n_ids, ids, n_ids * sizeof *ids);
    buf->n_ids += n_ids;
    if (text_len)
        memcpy(buf->text + buf->text_len, text, text_len);
    buf->text_len += text_len;
    buf->text[buf->text_len] = 0;
    (void)pd_grpc_stream_buf__flush(buf);
    if (buf->cancelled) { /* gone during the send: reported here, not through ops->cancelled */
        buf->told = 1;
        return PD_ERR_CANCELLED;
    }
    return PD_OK;
}

void pd_grpc_stream_buf_end(pd_grpc_stream_buf_t *buf, pd_status_t st, const char *msg)
{
    PD_ASSERT(!buf->ended && !buf->busy);
    buf->ended = 1;
    buf->end_st = st;
    buf->end_msg = msg ? strdup(msg) : NULL; /* NULL on failure: the status name goes out */
    pd_grpc_stream_buf__settle(buf);
}

void pd_grpc_stream_buf_queued(const pd_grpc_stream_buf_t *buf, size_t *n_ids_p, size_t *text_len_p)
{
    *n_ids_p = buf->n_ids;
    *text_len_p = buf->text_len;
}
