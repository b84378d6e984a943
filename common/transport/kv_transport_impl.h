/* kv_transport_impl: what a kv_transport implementation (ucx, loopback) plugs into.
 *
 * Private to common/kv_transport*.c. The generic layer (kv_transport.c) owns the base objects'
 * shared fields, checks arguments and endpoint state, frames the packed key (magic, base,
 * length, then the implementation's key bytes), tracks unpacked keys per endpoint, and runs a
 * FIFO of deferred operations from a uv_idle handle so that no callback runs inside the call
 * that started it. Implementations embed the base structs first and fill the ops table.
 * Everything runs on the loop thread.
 */
#ifndef PD_KV_TRANSPORT_IMPL_H
#define PD_KV_TRANSPORT_IMPL_H

#include "kv_transport.h"

typedef struct kv_transport__op kv_transport__op_t;

/* A deferred operation. run == NULL: call cb(arg, st) and free(op). Otherwise run(op) does the
 * work and is responsible for calling cb and freeing op. */
struct kv_transport__op {
    kv_transport__op_t *next;
    void (*run)(kv_transport__op_t *op);
    kv_transport_done_fn cb;
    void *arg;
    pd_status_t st;
};

struct kv_transport_mem {
    kv_transport_t *t;
    void *base;
    size_t len;
};

struct kv_transport_rkey {
    kv_transport_ep_t *ep;
    kv_transport_rkey_t *next, *prev; /* ep's list */
    uint64_t base;
    size_t len;
};

struct kv_transport_ep {
    kv_transport_t *t;
    kv_transport_ep_t *next, *prev; /* transport's list */
    kv_transport_rkey_t *rkeys;
    int failed;   /* peer gone: new operations are refused */
    int accepted; /* made by the listener, owned by the transport */
    int closing;
};

typedef struct {
    const char *kind;
    /* Releases everything the implementation holds except the base struct memory. */
    void (*destroy)(kv_transport_t *t);
    /* Frees the (implementation-sized) transport struct; called after handles closed. */
    void (*free)(kv_transport_t *t);
    int (*query_cuda)(kv_transport_t *t);
    void (*progress)(kv_transport_t *t); /* optional: run when kicked */
    pd_status_t (*listen)(kv_transport_t *t, const char *host, int port, int *port_p);
    pd_status_t (*mem_register)(kv_transport_t *t, void *base, size_t len,
                                kv_transport_mem_t **m_p);
    /* optional (NULL: no CUDA memory): as mem_register / put for device memory */
    pd_status_t (*mem_register_cuda)(kv_transport_t *t, void *base, size_t len,
                                     kv_transport_mem_t **m_p);
    pd_status_t (*put_cuda)(kv_transport_ep_t *ep, const void *local, size_t len,
                            uint64_t remote_addr, kv_transport_rkey_t *r, kv_transport_done_fn cb,
                            void *arg);
    pd_status_t (*mem_pack)(kv_transport_mem_t *m, void **key_p, size_t *len_p);
    void (*mem_release_key)(kv_transport_mem_t *m, void *key);
    void (*mem_deregister)(kv_transport_mem_t *m);
    pd_status_t (*set_am_handler)(kv_transport_t *t, uint16_t id, kv_transport_am_fn fn, void *arg);
    pd_status_t (*connect)(kv_transport_t *t, const char *host, int port, kv_transport_ep_t **ep_p);
    void (*ep_close)(kv_transport_ep_t *ep);
    void (*ep_print)(kv_transport_ep_t *ep, FILE *f);
    pd_status_t (*rkey_unpack)(kv_transport_ep_t *ep, const void *key, size_t len,
                               kv_transport_rkey_t **r_p);
    void (*rkey_destroy)(kv_transport_rkey_t *r);
    pd_status_t (*put)(kv_transport_ep_t *ep, const void *local, size_t len, uint64_t remote_addr,
                       kv_transport_rkey_t *r, kv_transport_done_fn cb, void *arg);
    pd_status_t (*flush)(kv_transport_ep_t *ep, kv_transport_done_fn cb, void *arg);
    pd_status_t (*am_send)(kv_transport_ep_t *ep, uint16_t id, const void *header,
                           size_t header_len, const void *data, size_t len, kv_transport_done_fn cb,
                           void *arg);
} kv_transport_ops_t;

struct kv_transport {
    const kv_transport_ops_t *ops;
    uv_loop_t *loop;
    char name[32];
    kv_transport_ep_error_fn ep_error;
    void *ep_error_arg;
    int no_peer_errors;
    kv_transport_ep_t *eps; /* every live endpoint, made or accepted */
    uv_idle_t idle;
    kv_transport__op_t *q_head, *q_tail;
    int kicked;
    int open_handles; /* uv handles not yet closed; the struct is freed at 0 */
    int destroying;
};

/* Initializes the base part of t (idle handle included). Returns PD_ERR_IO; t untouched
 * except for fields on failure. */
pd_status_t kv_transport__init(kv_transport_t *t, const kv_transport_ops_t *ops, uv_loop_t *loop,
                               const kv_transport_params_t *params);

/* Closes one uv handle owned by t (counted in open_handles); t is freed after the last one. */
void kv_transport__close_handle(kv_transport_t *t, uv_handle_t *h);

/* Queues op to run from the loop, in FIFO order. */
void kv_transport__defer(kv_transport_t *t, kv_transport__op_t *op);

/* Queues cb(arg, st) to run from the loop. Returns PD_ERR_NOMEM. */
pd_status_t kv_transport__defer_done(kv_transport_t *t, kv_transport_done_fn cb, void *arg,
                                     pd_status_t st);

/* Asks for ops->progress(t) to run from the loop. */
void kv_transport__kick(kv_transport_t *t);

/* Runs every queued op now (used at destroy). */
void kv_transport__drain(kv_transport_t *t);

/* Links ep into t's list / unlinks it. */
void kv_transport__ep_link(kv_transport_t *t, kv_transport_ep_t *ep);
void kv_transport__ep_unlink(kv_transport_ep_t *ep);

/* Tells ep's owner (params' ep_error) that ep failed; ep->failed must already be set (set it
 * as soon as the failure is known, notify from the loop, not from inside a user call). */
void kv_transport__ep_notify(kv_transport_ep_t *ep, pd_status_t st);

#endif
