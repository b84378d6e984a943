/* kv_transport_loopback: in-process memcpy transport for unit tests.
 *
 * Listening transports sit in a process-global registry keyed by port (host is ignored); a
 * connect makes a pair of endpoints. Every operation is queued on the source transport and
 * executed from its loop in FIFO order, so "flush, then message" ordering holds and a peer
 * destroyed before the queue runs makes pending operations fail. All loopback transports of a
 * process must be used from one thread. */
#include <stdlib.h>
#include <string.h>

#include "kv_transport.h"
#include "kv_transport_loopback.h"
#include "kv_transport_impl.h"
#include "log.h"

#define LB_AM_MAX 64
#define LB_PORT_FIRST 20000

typedef struct lb_transport lb_transport_t;
typedef struct lb_mem lb_mem_t;

typedef struct {
    kv_transport_ep_t base;
    kv_transport_ep_t *peer; /* NULL once either side is gone */
} lb_ep_t;

struct lb_mem {
    kv_transport_mem_t base;
    lb_mem_t *next;
    uint64_t id;
};

typedef struct {
    kv_transport_rkey_t base;
    uint64_t mem_id;
} lb_rkey_t;

struct lb_transport {
    kv_transport_t base;
    lb_transport_t *reg_next;
    int port;
    lb_mem_t *mems;
    kv_transport_am_fn am[LB_AM_MAX];
    void *am_arg[LB_AM_MAX];
};

typedef enum { LB_OP_PUT, LB_OP_FLUSH, LB_OP_AM, LB_OP_NOTIFY, LB_OP_FREE_EP } lb_op_kind_t;

typedef struct {
    kv_transport__op_t base;
    lb_op_kind_t kind;
    kv_transport_ep_t *ep;
    const void *local; /* put source or am data */
    size_t len;
    uint64_t remote_addr;
    uint64_t mem_id;
    uint16_t am_id;
    size_t header_len;
    uint8_t header[KV_TRANSPORT_AM_HEADER_MAX];
} lb_op_t;

static lb_transport_t *lb_registry;
static uint64_t lb_next_mem_id = 1;

static lb_transport_t *lb_of(kv_transport_t *t)
{
    return (lb_transport_t *)t;
}

static lb_transport_t *lb_find(int port)
{
    for (lb_transport_t *l = lb_registry; l; l = l->reg_next)
        if (l->port == port)
            return l;
    return NULL;
}

/* ==== queued operations ==== */

static pd_status_t lb_do_put(lb_op_t *op, kv_transport_ep_t *peer)
{
    lb_transport_t *dst = lb_of(peer->t);
    for (lb_mem_t *m = dst->mems; m; m = m->next) {
        if (m->id != op->mem_id)
            continue;
        uint64_t base = (uint64_t)(uintptr_t)m->base.base;
        if (op->remote_addr < base || op->remote_addr - base > m->base.len - op->len)
            break;
        memcpy((void *)(uintptr_t)op->remote_addr, op->local, op->len);
        return PD_OK;
    }
    pd_log_error("%s: put: remote key %llu not registered at the peer", op->ep->t->name,
                 (unsigned long long)op->mem_id);
    return PD_ERR_TRANSPORT;
}

static void lb_do_am(lb_op_t *op, kv_transport_ep_t *peer)
{
    lb_transport_t *dst = lb_of(peer->t);
    if (!dst->am[op->am_id]) {
        pd_log_warn("%s: am %u: no handler, dropped", peer->t->name, op->am_id);
        return;
    }
    dst->am[op->am_id](dst->am_arg[op->am_id], op->header, op->header_len, op->local, op->len,
                       peer);
}

static void lb_op_run(kv_transport__op_t *base)
{
    lb_op_t *op = (lb_op_t *)base;
    kv_transport_ep_t *ep = op->ep;
    kv_transport_ep_t *peer = ((lb_ep_t *)ep)->peer;
    pd_status_t st = PD_OK;

    if (op->kind == LB_OP_NOTIFY) {
        kv_transport__ep_notify(ep, PD_ERR_UNAVAILABLE);
        if (ep->accepted) {
            kv_transport__ep_unlink(ep);
            free(ep);
        }
        free(op);
        return;
    }
    if (op->kind == LB_OP_FREE_EP) {
        free(ep);
        free(op);
        return;
    }
    if (ep->closing || ep->t->destroying)
        st = PD_ERR_CANCELLED;
    else if (!peer)
        st = PD_ERR_UNAVAILABLE;
    else if (op->kind == LB_OP_PUT)
        st = lb_do_put(op, peer);
    else if (op->kind == LB_OP_AM)
        lb_do_am(op, peer);
    op->base.cb(op->base.arg, st);
    free(op);
}

static pd_status_t lb_queue(kv_transport_ep_t *ep, lb_op_kind_t kind, kv_transport_done_fn cb,
                            void *arg, lb_op_t **op_p)
{
    lb_op_t *op = calloc(1, sizeof *op);
    if (!op) {
        pd_log_error("%s: queue op %d: out of memory", ep->t->name, (int)kind);
        return PD_ERR_NOMEM;
    }
    op->base.run = lb_op_run;
    op->base.cb = cb;
    op->base.arg = arg;
    op->kind = kind;
    op->ep = ep;
    if (op_p)
        *op_p = op;
    kv_transport__defer(ep->t, &op->base);
    return PD_OK;
}

/* Cuts ep from its peer; the peer fails now and its owner hears of it from the peer's loop. */
static void lb_detach(kv_transport_ep_t *ep)
{
    lb_ep_t *lep = (lb_ep_t *)ep;
    kv_transport_ep_t *peer = lep->peer;
    if (!peer)
        return;
    lep->peer = NULL;
    ((lb_ep_t *)peer)->peer = NULL;
    peer->failed = 1;
    if (lb_queue(peer, LB_OP_NOTIFY, NULL, NULL, NULL) != PD_OK)
        pd_log_error("%s: peer of %s gone, owner not told", peer->t->name, ep->t->name);
}

/* ==== ops ==== */

static pd_status_t lb_listen(kv_transport_t *t, const char *host, int port, int *port_p)
{
    lb_transport_t *l = lb_of(t);
    (void)host;
    if (l->port) {
        pd_log_error("%s: listen: already listening on %d", t->name, l->port);
        return PD_ERR_INVALID;
    }
    if (port == 0)
        for (port = LB_PORT_FIRST; lb_find(port); port++)
            ;
    else if (lb_find(port)) {
        pd_log_error("%s: listen: port %d in use", t->name, port);
        return PD_ERR_UNAVAILABLE;
    }
    l->port = port;
    l->reg_next = lb_registry;
    lb_registry = l;
    *port_p = port;
    return PD_OK;
}

static pd_status_t lb_connect(kv_transport_t *t, const char *host, int port,
                              kv_transport_ep_t **ep_p)
{
    lb_transport_t *dst = lb_find(port);
    if (!dst) {
        pd_log_error("%s: connect %s:%d: nobody listens", t->name, host, port);
        return PD_ERR_UNAVAILABLE;
    }
    lb_ep_t *src_ep = calloc(1, sizeof *src_ep), *dst_ep = calloc(1, sizeof *dst_ep);
    if (!src_ep || !dst_ep) {
        pd_log_error("%s: connect %s:%d: out of memory", t->name, host, port);
        free(src_ep);
        free(dst_ep);
        return PD_ERR_NOMEM;
    }
    src_ep->peer = &dst_ep->base;
    dst_ep->peer = &src_ep->base;
    dst_ep->base.accepted = 1;
    kv_transport__ep_link(t, &src_ep->base);
    kv_transport__ep_link(&dst->base, &dst_ep->base);
    *ep_p = &src_ep->base;
    return PD_OK;
}

static void lb_ep_close(kv_transport_ep_t *ep)
{
    lb_detach(ep);
    /* Freed after the operations queued before the close have completed (cancelled). */
    if (lb_queue(ep, LB_OP_FREE_EP, NULL, NULL, NULL) != PD_OK)
        pd_log_error("%s: ep close: endpoint leaked", ep->t->name);
}

static void lb_ep_print(kv_transport_ep_t *ep, FILE *f)
{
    fprintf(f, "  loopback, peer %p\n", (void *)((lb_ep_t *)ep)->peer);
}

static pd_status_t lb_mem_register(kv_transport_t *t, void *base, size_t len,
                                   kv_transport_mem_t **m_p)
{
    lb_transport_t *l = lb_of(t);
    lb_mem_t *m = calloc(1, sizeof *m);
    if (!m) {
        pd_log_error("%s: mem register %p+%zu: out of memory", t->name, base, len);
        return PD_ERR_NOMEM;
    }
    m->id = lb_next_mem_id++;
    m->next = l->mems;
    l->mems = m;
    *m_p = &m->base;
    return PD_OK;
}

static pd_status_t lb_mem_pack(kv_transport_mem_t *m, void **key_p, size_t *len_p)
{
    *key_p = &((lb_mem_t *)m)->id;
    *len_p = sizeof(uint64_t);
    return PD_OK;
}

static void lb_mem_release_key(kv_transport_mem_t *m, void *key)
{
    (void)m;
    (void)key;
}

static void lb_mem_deregister(kv_transport_mem_t *mem)
{
    lb_transport_t *l = lb_of(mem->t);
    for (lb_mem_t **pp = &l->mems; *pp; pp = &(*pp)->next) {
        if (&(*pp)->base == mem) {
            *pp = (*pp)->next;
            free(mem);
            return;
        }
    }
    PD_ASSERT(!"mem not registered with this transport");
}

static pd_status_t lb_set_am_handler(kv_transport_t *t, uint16_t id, kv_transport_am_fn fn,
                                     void *arg)
{
    lb_transport_t *l = lb_of(t);
    if (id >= LB_AM_MAX) {
        pd_log_error("%s: am handler id %u >= %d", t->name, id, LB_AM_MAX);
        return PD_ERR_INVALID;
    }
    l->am[id] = fn;
    l->am_arg[id] = arg;
    return PD_OK;
}

static pd_status_t lb_rkey_unpack(kv_transport_ep_t *ep, const void *key, size_t len,
                                  kv_transport_rkey_t **r_p)
{
    if (len != sizeof(uint64_t)) {
        pd_log_error("%s: rkey unpack: %zu key bytes, loopback keys have 8", ep->t->name, len);
        return PD_ERR_FORMAT;
    }
    lb_rkey_t *r = calloc(1, sizeof *r);
    if (!r) {
        pd_log_error("%s: rkey unpack: out of memory", ep->t->name);
        return PD_ERR_NOMEM;
    }
    memcpy(&r->mem_id, key, sizeof r->mem_id);
    *r_p = &r->base;
    return PD_OK;
}

static void lb_rkey_destroy(kv_transport_rkey_t *r)
{
    free(r);
}

static pd_status_t lb_put(kv_transport_ep_t *ep, const void *local, size_t len,
                          uint64_t remote_addr, kv_transport_rkey_t *r, kv_transport_done_fn cb,
                          void *arg)
{
    lb_op_t *op;
    pd_status_t st = lb_queue(ep, LB_OP_PUT, cb, arg, &op);
    if (st != PD_OK)
        return st;
    op->local = local;
    op->len = len;
    op->remote_addr = remote_addr;
    op->mem_id = ((lb_rkey_t *)r)->mem_id;
    return PD_OK;
}

static pd_status_t lb_flush(kv_transport_ep_t *ep, kv_transport_done_fn cb, void *arg)
{
    return lb_queue(ep, LB_OP_FLUSH, cb, arg, NULL);
}

static pd_status_t lb_am_send(kv_transport_ep_t *ep, uint16_t id, const void *header,
                              size_t header_len, const void *data, size_t len,
                              kv_transport_done_fn cb, void *arg)
{
    if (id >= LB_AM_MAX) {
        pd_log_error("%s: am send: id %u >= %d", ep->t->name, id, LB_AM_MAX);
        return PD_ERR_INVALID;
    }
    lb_op_t *op;
    pd_status_t st = lb_queue(ep, LB_OP_AM, cb, arg, &op);
    if (st != PD_OK)
        return st;
    op->am_id = id;
    op->local = data;
    op->len = len;
    op->header_len = header_len;
    if (header_len)
        memcpy(op->header, header, header_len);
    return PD_OK;
}

static int lb_query_cuda(kv_transport_t *t)
{
    (void)t;
    return 0;
}

static void lb_destroy(kv_transport_t *t)
{
    lb_transport_t *l = lb_of(t);
    for (lb_transport_t **pp = &lb_registry; *pp; pp = &(*pp)->reg_next) {
        if (*pp == l) {
            *pp = l->reg_next;
            break;
        }
    }
    for (kv_transport_ep_t *ep = t->eps; ep; ep = ep->next) {
        lb_detach(ep);
        ep->closing = 1;
    }
    if (l->mems)
        pd_log_warn("%s: destroy: registrations left, released", t->name);
    while (l->mems) {
        lb_mem_t *m = l->mems;
        l->mems = m->next;
        free(m);
    }
}

static void lb_free(kv_transport_t *t)
{
    while (t->eps) {
        kv_transport_ep_t *ep = t->eps;
        kv_transport__ep_unlink(ep);
        while (ep->rkeys)
            kv_transport_rkey_destroy(ep->rkeys);
        free(ep);
    }
    free(t);
}

static const kv_transport_ops_t lb_ops = {
    .kind = "loopback",
    .destroy = lb_destroy,
    .free = lb_free,
    .query_cuda = lb_query_cuda,
    .listen = lb_listen,
    .mem_register = lb_mem_register,
    .mem_pack = lb_mem_pack,
    .mem_release_key = lb_mem_release_key,
    .mem_deregister = lb_mem_deregister,
    .set_am_handler = lb_set_am_handler,
    .connect = lb_connect,
    .ep_close = lb_ep_close,
    .ep_print = lb_ep_print,
    .rkey_unpack = lb_rkey_unpack,
    .rkey_destroy = lb_rkey_destroy,
    .put = lb_put,
    .flush = lb_flush,
    .am_send = lb_am_send,
};

pd_status_t kv_transport_loopback_create(uv_loop_t *loop, const kv_transport_params_t *params,
                                         kv_transport_t **t_p)
{
    lb_transport_t *l = calloc(1, sizeof *l);
    if (!l) {
        pd_log_error("loopback create: out of memory");
        return PD_ERR_NOMEM;
    }
    pd_status_t st = kv_transport__init(&l->base, &lb_ops, loop, params);
    if (st != PD_OK) {
        free(l);
        return st;
    }
    *t_p = &l->base;
    return PD_OK;
}
