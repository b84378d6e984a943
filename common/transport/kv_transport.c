/* kv_transport: the generic layer (argument and state checks, key framing, deferred queue) over
 * the implementation's ops table. See kv_transport_impl.h. */
#include "kv_transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_transport_impl.h"
#include "log.h"

#define KV_TRANSPORT__KEY_MAGIC 0x564b4450u /* "PDKV" */
#define KV_TRANSPORT__KEY_HDR 24            /* magic u32, impl_len u32, base u64, len u64 */

/* ==== deferred queue ==== */

static void kv_transport__on_idle(uv_idle_t *h)
{
    kv_transport_t *t = h->data;
    kv_transport__op_t *op = t->q_head;

    /* Only the batch queued so far: work queued by these ops waits for the next pass. */
    t->q_head = t->q_tail = NULL;
    while (op) {
        kv_transport__op_t *next = op->next;
        if (op->run) {
            op->run(op);
        } else {
            op->cb(op->arg, op->st);
            free(op);
        }
        op = next;
    }
    if (t->kicked && !t->destroying) {
        t->kicked = 0;
        t->ops->progress(t);
    }
    if (!t->q_head && !t->kicked)
        uv_idle_stop(&t->idle);
}

void kv_transport__defer(kv_transport_t *t, kv_transport__op_t *op)
{
    op->next = NULL;
    if (t->q_tail)
        t->q_tail->next = op;
    else
        t->q_head = op;
    t->q_tail = op;
    if (!t->destroying)
        uv_idle_start(&t->idle, kv_transport__on_idle);
}

pd_status_t kv_transport__defer_done(kv_transport_t *t, kv_transport_done_fn cb, void *arg,
                                     pd_status_t st)
{
    kv_transport__op_t *op = calloc(1, sizeof *op);
    if (!op) {
        pd_log_error("%s: deferred completion: out of memory", t->name);
        return PD_ERR_NOMEM;
    }
    op->cb = cb;
    op->arg = arg;
    op->st = st;
    kv_transport__defer(t, op);
    return PD_OK;
}

void kv_transport__kick(kv_transport_t *t)
{
    if (!t->ops->progress || t->destroying)
        return;
    t->kicked = 1;
    uv_idle_start(&t->idle, kv_transport__on_idle);
}

void kv_transport__drain(kv_transport_t *t)
{
    while (t->q_head)
        kv_transport__on_idle(&t->idle);
}

/* ==== base objects ==== */

static void kv_transport__on_close(uv_handle_t *h)
{
    kv_transport_t *t = h->data;
    if (--t->open_handles == 0)
        t->ops->free(t);
}

void kv_transport__close_handle(kv_transport_t *t, uv_handle_t *h)
{
    h->data = t;
    uv_close(h, kv_transport__on_close);
}

pd_status_t kv_transport__init(kv_transport_t *t, const kv_transport_ops_t *ops, uv_loop_t *loop,
                               const kv_transport_params_t *params)
{
    const char *name = params && params->name ? params->name : "kv";
    int rc = uv_idle_init(loop, &t->idle);
    if (rc < 0) {
        pd_log_error("%s: uv_idle_init: %s", name, uv_strerror(rc));
        return PD_ERR_IO;
    }
    t->idle.data = t;
    t->open_handles = 1;
    t->ops = ops;
    t->loop = loop;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ep_error = params ? params->ep_error : NULL;
    t->ep_error_arg = params ? params->ep_error_arg : NULL;
    t->no_peer_errors = params ? params->no_peer_errors : 0;
    return PD_OK;
}

void kv_transport__ep_link(kv_transport_t *t, kv_transport_ep_t *ep)
{
    ep->t = t;
    ep->prev = NULL;
    ep->next = t->eps;
    if (t->eps)
        t->eps->prev = ep;
    t->eps = ep;
}

void kv_transport__ep_unlink(kv_transport_ep_t *ep)
{
    if (ep->prev)
        ep->prev->next = ep->next;
    else if (ep->t->eps == ep)
        ep->t->eps = ep->next;
    if (ep->next)
        ep->next->prev = ep->prev;
    ep->next = ep->prev = NULL;
}

void kv_transport__ep_notify(kv_transport_ep_t *ep, pd_status_t st)
{
    PD_ASSERT(ep->failed);
    if (ep->t->ep_error && !ep->closing)
        ep->t->ep_error(ep->t->ep_error_arg, ep, st);
}

/* ==== public: transport ==== */

void kv_transport_destroy(kv_transport_t *t)
{
    if (!t)
        return;
    t->destroying = 1;
    t->ops->destroy(t);
    kv_transport__drain(t);
    uv_idle_stop(&t->idle);
    kv_transport__close_handle(t, (uv_handle_t *)&t->idle);
}

int kv_transport_query_cuda(kv_transport_t *t)
{
    return t->ops->query_cuda(t);
}

pd_status_t kv_transport_listen(kv_transport_t *t, const char *host, int port, int *port_p)
{
    if (!host || port < 0 || port > 65535) {
        pd_log_error("%s: listen: bad address %s:%d", t->name, host ? host : "(null)", port);
        return PD_ERR_INVALID;
    }
    return t->ops->listen(t, host, port, port_p);
}

pd_status_t kv_transport_set_am_handler(kv_transport_t *t, uint16_t id, kv_transport_am_fn fn,
                                        void *arg)
{
    return t->ops->set_am_handler(t, id, fn, arg);
}

/* ==== public: memory ==== */

static pd_status_t kv_transport__mem_register(kv_transport_t *t, void *base, size_t len, int cuda,
                                              kv_transport_mem_t **m_p)
{
    if (!base || len == 0) {
        pd_log_error("%s: mem register: empty region %p+%zu", t->name, base, len);
        return PD_ERR_INVALID;
    }
    if (cuda && (!t->ops->mem_register_cuda || !t->ops->query_cuda(t))) {
        pd_log_error("%s: mem register %p+%zu: this transport cannot reach CUDA memory", t->name,
                     base, len);
        return PD_ERR_UNSUPPORTED;
    }
    kv_transport_mem_t *m;
    pd_status_t st =
        cuda ? t->ops->mem_register_cuda(t, base, len, &m) : t->ops->mem_register(t, base, len, &m);
    if (st != PD_OK)
        return st;
    m->t = t;
    m->base = base;
    m->len = len;
    *m_p = m;
    return PD_OK;
}

pd_status_t kv_transport_mem_register(kv_transport_t *t, void *base, size_t len,
                                      kv_transport_mem_t **m_p)
{
    return kv_transport__mem_register(t, base, len, 0, m_p);
}

pd_status_t kv_transport_mem_register_cuda(kv_transport_t *t, void *base, size_t len,
                                           kv_transport_mem_t **m_p)
{
    return kv_transport__mem_register(t, base, len, 1, m_p);
}

pd_status_t kv_transport_mem_pack(kv_transport_mem_t *m, void **rkey_p, size_t *len_p)
{
    void *key;
    size_t key_len;
    pd_status_t st = m->t->ops->mem_pack(m, &key, &key_len);
    if (st != PD_OK)
        return st;
    uint8_t *buf = malloc(KV_TRANSPORT__KEY_HDR + key_len);
    if (!buf) {
        pd_log_error("%s: mem pack: out of memory", m->t->name);
        m->t->ops->mem_release_key(m, key);
        return PD_ERR_NOMEM;
    }
    uint32_t magic = KV_TRANSPORT__KEY_MAGIC, klen = (uint32_t)key_len;
    uint64_t base = (uint64_t)(uintptr_t)m->base, len = m->len;
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &klen, 4);
    memcpy(buf + 8, &base, 8);
    memcpy(buf + 16, &len, 8);
    memcpy(buf + KV_TRANSPORT__KEY_HDR, key, key_len);
    m->t->ops->mem_release_key(m, key);
    *rkey_p = buf;
    *len_p = KV_TRANSPORT__KEY_HDR + key_len;
    return PD_OK;
}

void kv_transport_mem_deregister(kv_transport_mem_t *m)
{
    if (m)
        m->t->ops->mem_deregister(m);
}

/* ==== public: endpoints ==== */

pd_status_t kv_transport_connect(kv_transport_t *t, const char *host, int port,
                                 kv_transport_ep_t **ep_p)
{
    if (!host || port <= 0 || port > 65535) {
        pd_log_error("%s: connect: bad address %s:%d", t->name, host ? host : "(null)", port);
        return PD_ERR_INVALID;
    }
    return t->ops->connect(t, host, port, ep_p);
}

int kv_transport_ep_failed(const kv_transport_ep_t *ep)
{
    return ep->failed;
}

void kv_transport_ep_print(kv_transport_ep_t *ep, FILE *f)
{
    fprintf(f, "%s: %s endpoint %p%s%s\n", ep->t->name, ep->t->ops->kind, (void *)ep,
            ep->failed ? " failed" : "", ep->accepted ? " accepted" : "");
    if (!ep->closing && !ep->failed)
        ep->t->ops->ep_print(ep, f);
}

void kv_transport_ep_close(kv_transport_ep_t *ep)
{
    if (!ep)
        return;
    PD_ASSERT(!ep->accepted && !ep->closing);
    while (ep->rkeys)
        kv_transport_rkey_destroy(ep->rkeys);
    ep->closing = 1;
    kv_transport__ep_unlink(ep);
    ep->t->ops->ep_close(ep);
}

static pd_status_t kv_transport__ep_check(kv_transport_ep_t *ep, const char *what)
{
    if (ep->closing) {
        pd_log_error("%s: %s on a closed endpoint", ep->t->name, what);
        return PD_ERR_INVALID;
    }
    if (ep->failed) {
        pd_log_debug("%s: %s on a failed endpoint", ep->t->name, what);
        return PD_ERR_UNAVAILABLE;
    }
    return PD_OK;
}

pd_status_t kv_transport_rkey_unpack(kv_transport_ep_t *ep, const void *rkey, size_t len,
                                     kv_transport_rkey_t **r_p)
{
    pd_status_t st = kv_transport__ep_check(ep, "rkey unpack");
    if (st != PD_OK)
        return st;
    uint32_t magic = 0, klen = 0;
    uint64_t base = 0, rlen = 0;
    if (rkey && len >= KV_TRANSPORT__KEY_HDR) {
        memcpy(&magic, rkey, 4);
        memcpy(&klen, (const uint8_t *)rkey + 4, 4);
        memcpy(&base, (const uint8_t *)rkey + 8, 8);
        memcpy(&rlen, (const uint8_t *)rkey + 16, 8);
    }
    if (magic != KV_TRANSPORT__KEY_MAGIC || klen != len - KV_TRANSPORT__KEY_HDR || rlen == 0 ||
        base + rlen < base) {
        pd_log_error("%s: rkey unpack: not a packed key (%zu bytes)", ep->t->name, len);
        return PD_ERR_FORMAT;
    }
    kv_transport_rkey_t *r;
    st = ep->t->ops->rkey_unpack(ep, (const uint8_t *)rkey + KV_TRANSPORT__KEY_HDR, klen, &r);
    if (st != PD_OK)
        return st;
    r->ep = ep;
    r->base = base;
    r->len = (size_t)rlen;
    r->prev = NULL;
    r->next = ep->rkeys;
    if (ep->rkeys)
        ep->rkeys->prev = r;
    ep->rkeys = r;
    *r_p = r;
    return PD_OK;
}

void kv_transport_rkey_destroy(kv_transport_rkey_t *r)
{
    if (!r)
        return;
    if (r->prev)
        r->prev->next = r->next;
    else
        r->ep->rkeys = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->ep->t->ops->rkey_destroy(r);
}

uint64_t kv_transport_rkey_base(const kv_transport_rkey_t *r)
{
    return r->base;
}

size_t kv_transport_rkey_len(const kv_transport_rkey_t *r)
{
    return r->len;
}

/* ==== public: operations ==== */

static pd_status_t kv_transport__put(kv_transport_ep_t *ep, const void *local, size_t len, int cuda,
                                     uint64_t remote_addr, kv_transport_rkey_t *r,
                                     kv_transport_done_fn cb, void *arg)
{
    pd_status_t st = kv_transport__ep_check(ep, "put");
    if (st != PD_OK)
        return st;
    if (cuda && (!ep->t->ops->put_cuda || !ep->t->ops->query_cuda(ep->t))) {
        pd_log_error("%s: put: this transport cannot read CUDA memory", ep->t->name);
        return PD_ERR_UNSUPPORTED;
    }
    if (!r || r->ep != ep || !cb || (!local && len)) {
        pd_log_error("%s: put: key %p does not belong to endpoint %p", ep->t->name, (void *)r,
                     (void *)ep);
        return PD_ERR_INVALID;
    }
    if (remote_addr < r->base || len > r->len || remote_addr - r->base > r->len - len) {
        pd_log_error("%s: put: [0x%llx, +%zu) outside region [0x%llx, +%zu)", ep->t->name,
                     (unsigned long long)remote_addr, len, (unsigned long long)r->base, r->len);
        return PD_ERR_INVALID;
    }
    return cuda ? ep->t->ops->put_cuda(ep, local, len, remote_addr, r, cb, arg)
                : ep->t->ops->put(ep, local, len, remote_addr, r, cb, arg);
}

pd_status_t kv_transport_put(kv_transport_ep_t *ep, const void *local, size_t len,
                             uint64_t remote_addr, kv_transport_rkey_t *r, kv_transport_done_fn cb,
                             void *arg)
{
    return kv_transport__put(ep, local, len, 0, remote_addr, r, cb, arg);
}

pd_status_t kv_transport_put_cuda(kv_transport_ep_t *ep, const void *local, size_t len,
                                  uint64_t remote_addr, kv_transport_rkey_t *r,
                                  kv_transport_done_fn cb, void *arg)
{
    return kv_transport__put(ep, local, len, 1, remote_addr, r, cb, arg);
}

pd_status_t kv_transport_flush(kv_transport_ep_t *ep, kv_transport_done_fn cb, void *arg)
{
    pd_status_t st = kv_transport__ep_check(ep, "flush");
    if (st != PD_OK)
        return st;
    PD_ASSERT(cb);
    return ep->t->ops->flush(ep, cb, arg);
}

pd_status_t kv_transport_am_send(kv_transport_ep_t *ep, uint16_t id, const void *header,
                                 size_t header_len, const void *data, size_t len,
                                 kv_transport_done_fn cb, void *arg)
{
    pd_status_t st = kv_transport__ep_check(ep, "am send");
    if (st != PD_OK)
        return st;
    if (header_len > KV_TRANSPORT_AM_HEADER_MAX || (!header && header_len) || (!data && len) ||
        !cb) {
        pd_log_error("%s: am send %u: bad arguments (header %zu bytes)", ep->t->name, id,
                     header_len);
        return PD_ERR_INVALID;
    }
    return ep->t->ops->am_send(ep, id, header, header_len, data, len, cb, arg);
}
