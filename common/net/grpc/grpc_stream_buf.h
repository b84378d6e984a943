/* pd_grpc_stream_buf: the output side of one server-streaming call under flow control, for a
 * producer that cannot wait (the decode loop, the router pipeline). The owner appends output as it
 * is produced (int32 items such as token ids, and bytes such as text); the buffer sends it at once
 * when the call accepts it, otherwise keeps it and sends everything queued by then as one message
 * when the call becomes writable. The owner ends the stream once; the final message and status go
 * out after everything before them, i.e. once the client has read the queued output.
 *
 * Ownership: the buffer takes over the call (its writable and cancel callbacks) from create until
 * it finishes it. It finishes the call exactly once: after pd_grpc_stream_buf_end, when the output
 * drained or the client went away (also when the client cancels after the end while output is
 * still queued). Then it frees itself and calls ops->released(arg): the owner's state (arg) must
 * stay valid until then, and may be freed inside released. A client that goes away before the end
 * makes the buffer drop its output and call ops->cancelled(arg); the owner must still call
 * pd_grpc_stream_buf_end (there or later), which then releases at once.
 *
 * Threads: the loop thread of the call's server only.
 */
#ifndef PD_GRPC_STREAM_BUF_H
#define PD_GRPC_STREAM_BUF_H

#include <stddef.h>
#include <stdint.h>

#include "grpc_server.h"
#include "status.h"

typedef struct pd_grpc_stream_buf pd_grpc_stream_buf_t;

typedef struct {
    /* Required. Packs ids (n_ids) and text (text_len bytes, NUL-terminated) into one response
     * message and sends it with pd_grpc_call_send; returns that status (PD_AGAIN: nothing went
     * out, the same output and what is appended meanwhile come again once writable). */
    pd_status_t (*send_output)(pd_grpc_call_t *call, const int32_t *ids, size_t n_ids,
                               const char *text, size_t text_len, void *arg);
    /* Sends the last message before an OK status (after all output) with pd_grpc_call_send and
     * returns its status (PD_AGAIN: asked again once writable). NULL: no final message. */
    pd_status_t (*send_final)(pd_grpc_call_t *call, void *arg);
    /* The client went away before the end: stop producing; call pd_grpc_stream_buf_end (may be
     * from inside this callback). NULL: nothing to do. */
    void (*cancelled)(void *arg);
    /* The call is finished and the buffer freed; the owner may free arg. NULL: nothing to do. */
    void (*released)(void *arg);
} pd_grpc_stream_buf_ops_t;

/* Creates a buffer on call (a server-streaming call its handler holds); ops must outlive it.
 * Returns PD_OK or PD_ERR_NOMEM (the call is untouched: the caller still finishes it). */
pd_status_t pd_grpc_stream_buf_create(pd_grpc_call_t *call, const pd_grpc_stream_buf_ops_t *ops,
                                      void *arg, pd_grpc_stream_buf_t **buf_p);

/* Appends output (ids: n_ids items; text: text_len bytes) and sends what the call accepts.
 * Returns PD_OK (sent or queued), PD_ERR_CANCELLED (the client is gone: dropped; when it went
 * away during this very send, this return is the only notice, ops->cancelled does not run),
 * PD_ERR_INVALID after the end, PD_ERR_NOMEM (nothing appended). Never frees buf. */
pd_status_t pd_grpc_stream_buf_append(pd_grpc_stream_buf_t *buf, const int32_t *ids, size_t n_ids,
                                      const char *text, size_t text_len);

/* Ends the stream, once: st PD_OK sends the final message (ops->send_final) and status OK after
 * the queued output; another st ends with that status and msg (NULL: pd_status_str) after the
 * queued output. Releases at once when nothing is queued or the client is gone, else when the
 * client reads or goes away: buf (and, through ops->released, maybe arg) may be freed on return. */
void pd_grpc_stream_buf_end(pd_grpc_stream_buf_t *buf, pd_status_t st, const char *msg);

/* Output items and bytes queued (not yet accepted by the call). */
void pd_grpc_stream_buf_queued(const pd_grpc_stream_buf_t *buf, size_t *n_ids_p,
                               size_t *text_len_p);

#endif
