/* pd_grpc_server: a gRPC server (unary and server-streaming methods) over HTTP/2 cleartext with
 * prior knowledge, on one libuv loop, using nghttp2 for HTTP/2 and protobuf-c for messages.
 *
 * Ownership: the server owns its listener, connections and calls. A handler receives a call and
 * the request; from then on the handler side holds the call until it calls pd_grpc_call_finish()
 * exactly once (also after a cancel: finish then only releases). The call memory and the request
 * stay valid until that finish, even when the peer is gone, the deadline passed, or the server was
 * destroyed; sending on such a call returns PD_ERR_CANCELLED. The cancel callback runs at most
 * once, when the client resets the stream, the connection closes, the deadline passes or the
 * server is destroyed, and only while the handler still holds the call.
 *
 * Memory bounds: a request message is at most max_recv_msg_size; at most max_concurrent_streams
 * calls per connection; pd_grpc_call_send() queues at most one message beyond send_high_watermark
 * per call, then returns PD_AGAIN until the writable callback runs; a connection stops producing
 * output while more than 1 MiB of its writes are pending on the socket.
 *
 * Idle and abusive peers: a connection without streams for idle_timeout_ms is sent GOAWAY (a
 * shutdown notice and a PING first, so that no stream the client starts meanwhile is lost) and
 * closed; a stream whose request (headers, message, end of stream) has not arrived within
 * request_timeout_ms ends with DEADLINE_EXCEEDED; at most max_connections are open (lowered to
 * leave file descriptors for the rest of the process, conn_limit.h), a connection past it is
 * closed at accept. Floods end the connection with GOAWAY(ENHANCE_YOUR_CALM): more than 100
 * PING / SETTINGS / PRIORITY / empty DATA frames in a burst or 10 a second on average, RST_STREAM
 * beyond nghttp2's rate limit (1000 burst, 33 a second), more than 32 entries in one SETTINGS
 * frame, 8 CONTINUATIONs, or 100 PING / SETTINGS acks the peer does not read.
 *
 * Threads: every function here runs on the loop thread only. Other threads hand results back with
 * loop_post() (loop.h). Handlers run on the loop thread and must not block.
 */
#ifndef PD_GRPC_SERVER_H
#define PD_GRPC_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>
#include <uv.h>

#include "grpc_wire.h"
#include "status.h"

typedef struct pd_grpc_server pd_grpc_server_t;
typedef struct pd_grpc_call pd_grpc_call_t;

typedef struct {
    size_t max_recv_msg_size;        /* largest request message; 0 = 4 MiB */
    uint32_t max_concurrent_streams; /* per connection; 0 = 100 */
    size_t send_high_watermark;      /* per-call queued response bytes; 0 = 256 KiB */
    uint32_t idle_timeout_ms;        /* connection without streams; 0 = 60 s */
    uint32_t request_timeout_ms;     /* request headers + message + end of stream; 0 = 30 s */
    size_t max_connections;          /* open connections; 0 = 1024 (then capped, conn_limit.h) */
} pd_grpc_server_params_t;

typedef struct {
    uint64_t active_calls;         /* calls allocated (including ones held only by handlers) */
    uint64_t connections;          /* open connections */
    uint64_t buffered_bytes;       /* response bytes queued in calls plus socket writes pending */
    uint64_t max_connections;      /* the effective limit */
    uint64_t rejected_connections; /* closed at accept: over the limit */
    uint64_t accept_errors;        /* failed accepts (EMFILE, ...) */
    uint64_t idle_closed;          /* connections sent GOAWAY for being idle */
    uint64_t flood_closed;         /* connections ended for a frame flood */
    uint64_t request_timeouts;     /* streams whose request did not arrive in time */
} pd_grpc_server_stats_t;

/* A method handler: req is the decoded request (owned by the call, valid until finish). */
typedef void (*pd_grpc_method_fn)(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user);

/* Creates a server on loop; params may be NULL for defaults. Returns PD_OK or PD_ERR_NOMEM;
 * nothing is allocated on failure. */
pd_status_t pd_grpc_server_create(uv_loop_t *loop, const pd_grpc_server_params_t *params,
                                  pd_grpc_server_t **srv_p);

/* Credentials check, run for every call whose method exists, before its handler: returns 0 to
 * let it through, or a gRPC status (UNAUTHENTICATED, PERMISSION_DENIED) that ends the call with
 * *why_p (or a generic message). Request metadata is readable (pd_grpc_call_metadata). */
typedef int (*pd_grpc_auth_fn)(const pd_grpc_call_t *call, const char *path, void *arg,
                               const char **why_p);

/* Sets (fn NULL: removes) the server's credentials check. */
void pd_grpc_server_set_auth(pd_grpc_server_t *srv, pd_grpc_auth_fn fn, void *arg);

/* Registers desc's methods at /<desc->name>/<method>; handlers[i] serves desc->methods[i] (a NULL
 * entry answers UNIMPLEMENTED). desc and handlers must outlive the server. Returns PD_OK,
 * PD_ERR_NOMEM, or PD_ERR_INVALID when a service of that name is already registered. */
pd_status_t pd_grpc_server_add_service(pd_grpc_server_t *srv,
                                       const ProtobufCServiceDescriptor *desc,
                                       const pd_grpc_method_fn *handlers, void *user);

/* Listens on host:port (port 0 picks an ephemeral port) and writes the bound port. Returns PD_OK,
 * PD_ERR_INVALID (bad address, already listening) or PD_ERR_IO (bind/listen failed, logged); on
 * failure the server is not listening
 * (and, after PD_ERR_IO, cannot listen again: destroy it). */
pd_status_t pd_grpc_server_listen(pd_grpc_server_t *srv, const char *host, int port,
                                  int *bound_port_p);

/* Graceful stop: closes the listener, sends GOAWAY on every connection, lets in-flight calls
 * finish, then closes each connection when it has no calls left. Idempotent. */
void pd_grpc_server_shutdown(pd_grpc_server_t *srv);

/* Closes everything now: calls still held by handlers get their cancel callback and stay valid
 * (detached) until their finish. The memory is freed once the loop processes the closes; run the
 * loop afterwards. Not from inside a handler. Accepts NULL. */
void pd_grpc_server_destroy(pd_grpc_server_t *srv);

/* Writes current counters. */
void pd_grpc_server_stats(const pd_grpc_server_t *srv, pd_grpc_server_stats_t *stats_p);

/* ==== calls (loop thread; valid from the handler invocation until pd_grpc_call_finish) ==== */

/* Queues one response message (sends response headers first if needed). Returns PD_OK;
 * PD_AGAIN when the call already buffers send_high_watermark bytes (nothing queued: wait for the
 * writable callback); PD_ERR_CANCELLED when the call was cancelled or its peer is gone;
 * PD_ERR_INVALID after finish; PD_ERR_NOMEM / PD_ERR_INTERNAL (nothing queued). */
pd_status_t pd_grpc_call_send(pd_grpc_call_t *call, const ProtobufCMessage *msg);

/* Ends the call with a gRPC status (code 0..16) and an optional message (UTF-8, sent
 * percent-encoded), after the queued messages drain; a call that sent nothing gets a
 * trailers-only response. Releases the handler's hold: call must not be used afterwards.
 * Returns PD_OK, or PD_ERR_CANCELLED when the call was already cancelled (released all the
 * same). */
pd_status_t pd_grpc_call_finish(pd_grpc_call_t *call, int grpc_code, const char *message);

/* Same as pd_grpc_call_finish with pd_status_grpc_code(st) and message (or pd_status_str(st)). */
pd_status_t pd_grpc_call_finish_status(pd_grpc_call_t *call, pd_status_t st, const char *message);

/* Sets fn(call, arg), run once if the call is cancelled while the handler holds it. Inside fn
 * the call is still valid; the handler must still finish it (now or later). */
void pd_grpc_call_set_cancel_cb(pd_grpc_call_t *call, void (*fn)(pd_grpc_call_t *call, void *arg),
                                void *arg);

/* Sets fn(call, arg), run once each time after pd_grpc_call_send returned PD_AGAIN, when the send
 * buffer drained below half the watermark. */
void pd_grpc_call_set_writable_cb(pd_grpc_call_t *call, void (*fn)(pd_grpc_call_t *call, void *arg),
                                  void *arg);

/* Returns the milliseconds left until the call's deadline (0 when passed), or -1 when the client
 * sent no grpc-timeout. */
int64_t pd_grpc_call_deadline_ms(const pd_grpc_call_t *call);

/* Returns the value of request metadata key (lowercase), or NULL. Valid until finish. */
const char *pd_grpc_call_metadata(const pd_grpc_call_t *call, const char *key);

/* Returns nonzero once the call was cancelled (peer reset/gone, deadline, server destroyed). */
int pd_grpc_call_is_cancelled(const pd_grpc_call_t *call);

/* Returns the :path of the call ("/pkg.Service/Method"). */
const char *pd_grpc_call_path(const pd_grpc_call_t *call);

/* ==== in-memory connections, for tests and fuzzing ==== */

/* Opens a connection that is not a socket: bytes from the client go in through
 * pd_grpc_server__fake_feed; bytes the server writes go to out(arg, data, len) (NULL drops them).
 * When the server closes the connection (on its own, or in fake_feed), out(arg, NULL, 0) is called
 * once before the connection is freed; not on fake_close.
 * Returns PD_OK or PD_ERR_NOMEM. The connection closes with the server or with fake_close. */
typedef struct pd_grpc_server__conn pd_grpc_server__conn_t;
pd_status_t pd_grpc_server__fake_open(pd_grpc_server_t *srv,
                                      void (*out)(void *arg, const uint8_t *data, size_t len),
                                      void *arg, pd_grpc_server__conn_t **conn_p);

/* Feeds client bytes and runs the session. Returns PD_OK; PD_ERR_PROTOCOL when the session
 * failed, PD_ERR_TRANSPORT when it ended (GOAWAY done): the connection is then closed and freed,
 * do not use it again. */
pd_status_t pd_grpc_server__fake_feed(pd_grpc_server__conn_t *conn, const uint8_t *data,
                                      size_t len);

/* Closes a fake connection as if the peer vanished. Accepts NULL. */
void pd_grpc_server__fake_close(pd_grpc_server__conn_t *conn);

#endif
