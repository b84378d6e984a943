/* pd_grpc_client: a gRPC client (unary and server-streaming calls) over HTTP/2 cleartext with prior
 * knowledge, or over TLS (OpenSSL, ALPN h2, the server's certificate verified against a CA file
 * and its name) after pd_grpc_client_set_tls, on one libuv loop, using nghttp2 and protobuf-c.
 *
 * A client targets one host:port. It connects on the first call, multiplexes calls on one
 * connection, and opens a new connection for later calls after a failure or a GOAWAY. When the
 * connection fails or drops, every call on it ends with UNAVAILABLE.
 *
 * Ownership: the client owns its calls. A call handle is valid from its start until its done
 * callback returns; the done callback runs exactly once per started call, always from a loop
 * callback of its own (never inside pd_grpc_client_* functions except pd_grpc_client_destroy), so
 * it may start calls, cancel others or destroy the client. Response messages handed to callbacks
 * belong to the callback (free with protobuf_c_message_free_unpacked(msg, NULL)).
 *
 * Threads: loop thread only.
 */
#ifndef PD_GRPC_CLIENT_H
#define PD_GRPC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>
#include <uv.h>

#include "grpc_wire.h"
#include "status.h"

typedef struct pd_grpc_client pd_grpc_client_t;
typedef struct pd_grpc_client_call pd_grpc_client_call_t;

/* Unary completion: resp is the response when grpc_code is 0 (else NULL), owned by the callback;
 * grpc_message is "" when none (valid during the callback). */
typedef void (*pd_grpc_client_unary_cb)(void *arg, int grpc_code, const char *grpc_message,
                                        ProtobufCMessage *resp);
/* One streamed response, owned by the callback. Must not destroy the client (cancel is fine). */
typedef void (*pd_grpc_client_msg_cb)(void *arg, ProtobufCMessage *msg);
/* Stream completion: grpc_message is "" when none (valid during the callback). */
typedef void (*pd_grpc_client_done_cb)(void *arg, int grpc_code, const char *grpc_message);

/* Creates a client for host (a name or numeric address) and port; connects lazily. Returns PD_OK
 * or PD_ERR_NOMEM; nothing is allocated on failure. */
pd_status_t pd_grpc_client_create(uv_loop_t *loop, const char *host, int port,
                                  pd_grpc_client_t **c_p);

typedef struct {
    const char *ca_file;     /* PEM: the CAs the server's certificate must chain to; NULL or "":
                                OpenSSL's default paths (the system's CAs) */
    const char *server_name; /* sent as SNI (a DNS name) and required in the certificate (a name,
                                or an IP address in its subjectAltName); NULL or "": the host */
} pd_grpc_client_tls_t;

/* Makes the client's connections TLS 1.2+ (before its first call): a connection is used only
 * once the handshake has verified the certificate and the server chose "h2"; otherwise its calls
 * end with UNAVAILABLE naming the reason. PD_ERR_IO (logged) when the CA file cannot be read,
 * PD_ERR_NOMEM; the client is left as it was on failure. */
pd_status_t pd_grpc_client_set_tls(pd_grpc_client_t *c, const pd_grpc_client_tls_t *tls);

/* Sets the largest accepted response message (default 4 MiB; larger -> RESOURCE_EXHAUSTED). */
void pd_grpc_client_set_max_recv(pd_grpc_client_t *c, size_t bytes);

/* Starts a unary call of path ("/pkg.Service/Method") with req; the response is decoded with
 * resp_desc. timeout_ms > 0 sets a deadline (sent as grpc-timeout; DEADLINE_EXCEEDED locally
 * when it passes), <= 0 none. cb runs once. Writes the handle to *call_p when call_p is not NULL.
 * Returns PD_OK; PD_ERR_NOMEM / PD_ERR_INVALID (message too large) with nothing started and cb
 * never run. */
pd_status_t pd_grpc_client_unary(pd_grpc_client_t *c, const char *path, const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                                 pd_grpc_client_unary_cb cb, void *arg,
                                 pd_grpc_client_call_t **call_p);

/* Starts a server-streaming call: on_message runs per response, then on_done once. Same
 * arguments and returns as pd_grpc_client_unary. */
pd_status_t pd_grpc_client_stream(pd_grpc_client_t *c, const char *path,
                                  const ProtobufCMessage *req,
                                  const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                                  pd_grpc_client_msg_cb on_message, pd_grpc_client_done_cb on_done,
                                  void *arg, pd_grpc_client_call_t **call_p);

/* Adds request metadata (lowercase key, ASCII value) to a call started in this loop iteration
 * (before the loop runs again). Returns PD_OK, PD_ERR_NOMEM, or PD_ERR_INVALID when the request
 * was already sent. */
pd_status_t pd_grpc_client_call_add_metadata(pd_grpc_client_call_t *call, const char *key,
                                             const char *value);

/* Cancels a call whose done callback has not run: sends RST_STREAM(CANCEL) when it is on the
 * wire, and the done callback runs later with CANCELLED. No effect when the call already ended
 * (its done callback is queued). */
void pd_grpc_client_call_cancel(pd_grpc_client_call_t *call);

/* Drops the client's connections, as after a failure: every call on them ends (later, from the
 * loop) with UNAVAILABLE (why), and the next call opens a fresh connection. For a peer that stopped
 * answering without closing (a cut link, a hung host): its calls would otherwise wait for their
 * deadlines and TCP's retransmission backoff. Calls not yet on a connection are kept. Not from
 * inside an on_message callback. */
void pd_grpc_client_reset(pd_grpc_client_t *c, const char *why);

/* Ends every call (done callbacks run now, with CANCELLED), closes the connections, and frees the
 * client once the loop processes the closes. Not from inside an on_message callback. Accepts
 * NULL. */
void pd_grpc_client_destroy(pd_grpc_client_t *c);

#endif
