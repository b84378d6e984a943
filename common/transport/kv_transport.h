/* kv_transport: one-sided writes of KV pages from a prefill node into a decode node's page pool.
 *
 * A target (decode node) listens, registers its page pool with kv_transport_mem_register() and
 * sends the packed key (kv_transport_mem_pack(): region base, length and the transport's remote
 * key in one opaque blob) to the source over the control plane. A source (prefill node) connects,
 * unpacks the key once per peer and region, writes pages with kv_transport_put(), waits for
 * kv_transport_flush(), then sends a completion message with kv_transport_am_send(), which the
 * target receives through the handler set with kv_transport_set_am_handler(). A message sent
 * after a flush has completed is seen by the target after the flushed data.
 *
 * Implementations sit behind an ops table (kv_transport_impl.h): UCX (kv_transport_ucx_create)
 * here, and an in-process memcpy loopback for unit tests in tests/support/kv_transport_loopback.h.
 *
 * Ownership: the transport owns its endpoints' connections, registrations and unpacked keys.
 * Endpoints made by kv_transport_connect() belong to the caller until kv_transport_ep_close().
 * Endpoints accepted by a listener belong to the transport; they are valid until the transport
 * is destroyed or, after a failure, until the params' ep_error callback for them returns.
 * Buffers passed to put/am_send belong to the caller and must stay valid until the callback.
 *
 * Threads: everything, including every callback, runs on the thread of the loop passed at
 * create. Callbacks never run inside the call that started the operation. Operations that
 * return an error never call their callback; operations that return PD_OK call it exactly once.
 * Peer failure: the endpoint is marked failed, every pending operation on it completes with
 * PD_ERR_UNAVAILABLE (or PD_ERR_TRANSPORT), later calls on it return PD_ERR_UNAVAILABLE.
 */
#ifndef PD_KV_TRANSPORT_H
#define PD_KV_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <uv.h>

#include "status.h"

typedef struct kv_transport kv_transport_t;
typedef struct kv_transport_ep kv_transport_ep_t;
typedef struct kv_transport_mem kv_transport_mem_t;
typedef struct kv_transport_rkey kv_transport_rkey_t;

/* Completion of a put, flush or am_send: st is PD_OK, PD_ERR_UNAVAILABLE (peer gone),
 * PD_ERR_CANCELLED (endpoint closed or transport destroyed first) or PD_ERR_TRANSPORT. */
typedef void (*kv_transport_done_fn)(void *arg, pd_status_t st);

/* An active message arrived. header and data are valid only during the call. from is the
 * endpoint it came on (replies may be sent on it); NULL if the transport cannot tell. */
typedef void (*kv_transport_am_fn)(void *arg, const void *header, size_t header_len,
                                   const void *data, size_t len, kv_transport_ep_t *from);

/* An endpoint failed (peer gone, connection lost). For an accepted endpoint this is the last
 * moment it may be used; it is freed when the callback returns. */
typedef void (*kv_transport_ep_error_fn)(void *arg, kv_transport_ep_t *ep, pd_status_t st);

typedef struct {
    const char *name;                  /* log context ("prefill-0"); NULL: "kv" */
    kv_transport_ep_error_fn ep_error; /* optional */
    void *ep_error_arg;
    /* 0 (default): endpoints detect peer failure, so UCX only uses transports that can (tcp,
     * RDMA). 1: any transport, shared memory included (UCX 1.13's posix/sysv/cma cannot report
     * a dead peer), and a dead peer may then go unnoticed: same-host benchmarks only. */
    int no_peer_errors;
} kv_transport_params_t;

/* Largest header accepted by kv_transport_am_send(). */
#define KV_TRANSPORT_AM_HEADER_MAX 256

/* Creates a UCX transport (RMA, active messages, sockaddr connections) whose worker is
 * progressed from loop. Returns PD_ERR_TRANSPORT when UCX cannot be initialized, PD_ERR_NOMEM,
 * PD_ERR_IO when the loop rejects the worker's event fd; nothing is left behind on failure. */
pd_status_t kv_transport_ucx_create(uv_loop_t *loop, const kv_transport_params_t *params,
                                    kv_transport_t **t_p);

/* Force-closes every endpoint (pending operations complete with PD_ERR_CANCELLED, called from
 * here), releases registrations the caller left and closes the uv handles. The memory is freed
 * by the handles' close callbacks: run the loop once more before uv_loop_close(). Accepts NULL. */
void kv_transport_destroy(kv_transport_t *t);

/* Whether memory registered with kv_transport_mem_register() may be CUDA device memory (UCX
 * built with CUDA). When 0, callers stage GPU pages through pinned host buffers. */
int kv_transport_query_cuda(kv_transport_t *t);

/* ==== target side ==== */

/* Accepts connections on host:port (port 0: ephemeral) and writes the bound port to *port_p.
 * Returns PD_ERR_INVALID (bad host, already listening), PD_ERR_UNAVAILABLE (port in use) or
 * PD_ERR_TRANSPORT; the transport is left not listening on failure. */
pd_status_t kv_transport_listen(kv_transport_t *t, const char *host, int port, int *port_p);

/* Registers base[0, len) for remote writes. Returns PD_ERR_INVALID (NULL/empty), PD_ERR_NOMEM or
 * PD_ERR_TRANSPORT; nothing is registered on failure. */
pd_status_t kv_transport_mem_register(kv_transport_t *t, void *base, size_t len,
                                      kv_transport_mem_t **m_p);

/* As kv_transport_mem_register for CUDA device memory (registered with memory type CUDA).
 * Returns PD_ERR_UNSUPPORTED unless kv_transport_query_cuda(t); otherwise as above. */
pd_status_t kv_transport_mem_register_cuda(kv_transport_t *t, void *base, size_t len,
                                           kv_transport_mem_t **m_p);

/* Packs the key a source needs to write into m (base, length and the remote key) into a buffer
 * the caller frees with free(). Returns PD_ERR_NOMEM or PD_ERR_TRANSPORT. */
pd_status_t kv_transport_mem_pack(kv_transport_mem_t *m, void **rkey_p, size_t *len_p);

/* Unregisters m. Writes still arriving into it are the caller's bug. Accepts NULL. */
void kv_transport_mem_deregister(kv_transport_mem_t *m);

/* Sets (fn != NULL) or clears the handler for active message id. Returns PD_ERR_INVALID
 * (id out of range) or PD_ERR_TRANSPORT; the previous handler stays on failure. */
pd_status_t kv_transport_set_am_handler(kv_transport_t *t, uint16_t id, kv_transport_am_fn fn,
                                        void *arg);

/* ==== source side ==== */

/* Starts connecting to host:port and returns the endpoint at once; operations may be queued on
 * it right away. A refused or lost connection fails the endpoint (see the header paragraph).
 * Returns PD_ERR_INVALID (bad host/port), PD_ERR_NOMEM or PD_ERR_UNAVAILABLE (no such peer). */
pd_status_t kv_transport_connect(kv_transport_t *t, const char *host, int port,
                                 kv_transport_ep_t **ep_p);

/* Whether ep has failed (peer gone). */
int kv_transport_ep_failed(const kv_transport_ep_t *ep);

/* Writes a description of ep (the transports it uses, once connected) to f; for logs and
 * tests. */
void kv_transport_ep_print(kv_transport_ep_t *ep, FILE *f);

/* Force-closes ep: pending operations complete with PD_ERR_CANCELLED or PD_ERR_UNAVAILABLE
 * (possibly before this returns), its unpacked keys are destroyed and ep is invalid afterwards.
 * Accepts NULL. Only for endpoints made by kv_transport_connect(). */
void kv_transport_ep_close(kv_transport_ep_t *ep);

/* Unpacks a key made by kv_transport_mem_pack() for use on ep; keep it for the life of the
 * peer's registration. Returns PD_ERR_FORMAT (not a key), PD_ERR_UNAVAILABLE (ep failed),
 * PD_ERR_NOMEM or PD_ERR_TRANSPORT; nothing is left on failure. */
pd_status_t kv_transport_rkey_unpack(kv_transport_ep_t *ep, const void *rkey, size_t len,
                                     kv_transport_rkey_t **r_p);

/* Destroys r (also done by kv_transport_ep_close). Accepts NULL. */
void kv_transport_rkey_destroy(kv_transport_rkey_t *r);

/* Remote region described by r: its base address and length. */
uint64_t kv_transport_rkey_base(const kv_transport_rkey_t *r);
size_t kv_transport_rkey_len(const kv_transport_rkey_t *r);

/* Writes local[0, len) (host memory, valid until cb) to remote_addr, which with len must lie in
 * r's region. cb(arg, st) reports local completion; remote visibility needs a flush.
 * Returns PD_ERR_INVALID (outside the region, r not of ep), PD_ERR_UNAVAILABLE (ep failed),
 * PD_ERR_NOMEM or PD_ERR_TRANSPORT. */
pd_status_t kv_transport_put(kv_transport_ep_t *ep, const void *local, size_t len,
                             uint64_t remote_addr, kv_transport_rkey_t *r, kv_transport_done_fn cb,
                             void *arg);

/* As kv_transport_put with local in CUDA device memory (the put says so: memory type CUDA).
 * Returns PD_ERR_UNSUPPORTED unless the transport reports CUDA memory; otherwise as above. */
pd_status_t kv_transport_put_cuda(kv_transport_ep_t *ep, const void *local, size_t len,
                                  uint64_t remote_addr, kv_transport_rkey_t *r,
                                  kv_transport_done_fn cb, void *arg);

/* cb(arg, st) runs when every put started on ep before this call is visible at the target.
 * Returns PD_ERR_UNAVAILABLE (ep failed), PD_ERR_NOMEM or PD_ERR_TRANSPORT. */
pd_status_t kv_transport_flush(kv_transport_ep_t *ep, kv_transport_done_fn cb, void *arg);

/* Sends active message id with header (copied; at most KV_TRANSPORT_AM_HEADER_MAX bytes) and
 * data (valid until cb). Returns PD_ERR_INVALID, PD_ERR_UNAVAILABLE (ep failed), PD_ERR_NOMEM
 * or PD_ERR_TRANSPORT. */
pd_status_t kv_transport_am_send(kv_transport_ep_t *ep, uint16_t id, const void *header,
                                 size_t header_len, const void *data, size_t len,
                                 kv_transport_done_fn cb, void *arg);

#endif
