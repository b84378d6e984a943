/* kv_transport_ucx: the UCX implementation of kv_transport.
 *
 * One ucp context and one single-threaded worker per transport. The worker's event fd is
 * watched by a uv_poll handle; a wakeup (or a kick after posting work) progresses the worker
 * until ucp_worker_arm() reports it idle, so every UCX callback runs on the loop thread and
 * nothing busy-polls. Endpoints use peer error handling: a failure marks the endpoint failed at
 * once (UCX completes its requests with an error), the owner is told from the loop, and the ucp
 * endpoint is force-closed. ucs_status_t is converted to pd_status_t only in ucx_status().
 *
 * UCX 1.13 facts this relies on: a sockaddr connection needs a transport on the address's
 * device (tcp for 127.0.0.1); peer error handling restricts lanes to transports that support it
 * (tcp, RDMA; not posix/sysv/cma), hence params->no_peer_errors for same-host shared memory;
 * an am header must live until the send completes (no COPY_HEADER flag yet), so it is copied
 * into the operation. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <ucp/api/ucp.h>

#include "kv_transport.h"
#include "kv_transport_impl.h"
#include "log.h"

#define UCX_AM_MAX 64

typedef struct ucx_transport ucx_transport_t;

typedef struct {
    kv_transport_ep_t base;
    ucp_ep_h uep; /* NULL once close was started */
    int refs;     /* the ucp endpoint's life, the caller's handle (made endpoints) and
                   * queued failure notifications; freed at 0 */
} ucx_ep_t;

typedef struct ucx_mem {
    kv_transport_mem_t base;
    struct ucx_mem *next, *prev;
    ucp_mem_h memh;
} ucx_mem_t;

typedef struct {
    kv_transport_rkey_t base;
    ucp_rkey_h rkey;
} ucx_rkey_t;

typedef struct {
    ucx_transport_t *t;
    uint16_t id;
    kv_transport_am_fn fn;
    void *arg;
} ucx_am_slot_t;

struct ucx_transport {
    kv_transport_t base;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    uv_poll_t poll;
    int cuda;
    int closing_eps; /* ucp_ep_close_nbx requests not completed */
    ucx_mem_t *mems;
    ucx_am_slot_t am[UCX_AM_MAX];
};

/* One user operation: put, flush or am send (with its header copy). */
typedef struct {
    kv_transport__op_t base;
    ucx_ep_t *ep; /* holds a reference */
    uint8_t header[KV_TRANSPORT_AM_HEADER_MAX];
} ucx_op_t;

/* A rendezvous active message being received. */
typedef struct {
    ucx_am_slot_t *slot;
    ucp_ep_h reply_ep;
    size_t header_len;
    size_t len;
    uint8_t header[KV_TRANSPORT_AM_HEADER_MAX];
    uint8_t data[];
} ucx_rx_t;

static ucx_transport_t *ucx_of(kv_transport_t *t)
{
    return (ucx_transport_t *)t;
}

/* The one place ucs_status_t becomes pd_status_t. */
static pd_status_t ucx_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:
        return PD_OK;
    case UCS_INPROGRESS:
        return PD_INPROGRESS;
    case UCS_ERR_CANCELED:
        return PD_ERR_CANCELLED;
    case UCS_ERR_NO_MEMORY:
        return PD_ERR_NOMEM;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
        return PD_ERR_INVALID;
    case UCS_ERR_UNSUPPORTED:
        return PD_ERR_UNSUPPORTED;
    case UCS_ERR_BUSY:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_TIMED_OUT:
        return PD_ERR_UNAVAILABLE;
    default:
        return PD_ERR_TRANSPORT;
    }
}

/* ==== progress ==== */

static void ucx_progress(kv_transport_t *t)
{
    ucx_transport_t *u = ucx_of(t);
    ucs_status_t s;
    do {
        while (ucp_worker_progress(u->worker))
            ;
        s = ucp_worker_arm(u->worker);
    } while (s == UCS_ERR_BUSY);
    if (s != UCS_OK)
        pd_log_error("%s: ucp_worker_arm: %s", t->name, ucs_status_string(s));
}

static void ucx_on_poll(uv_poll_t *h, int status, int events)
{
    (void)events;
    kv_transport_t *t = h->data;
    if (status < 0)
        pd_log_warn("%s: worker fd poll: %s", t->name, uv_strerror(status));
    ucx_progress(t);
}

/* ==== endpoints ==== */

static void ucx_ep_unref(ucx_ep_t *ep)
{
    if (--ep->refs == 0)
        free(ep);
}

static void ucx_on_ep_closed(void *req, ucs_status_t s, void *user_data)
{
    ucx_ep_t *ep = user_data;
    ucx_transport_t *u = ucx_of(ep->base.t);
    if (s != UCS_OK && s != UCS_ERR_CANCELED)
        pd_log_debug("%s: ep close: %s", u->base.name, ucs_status_string(s));
    ucp_request_free(req);
    u->closing_eps--;
    ucx_ep_unref(ep);
}

/* Force-closes the ucp endpoint (pending requests complete with an error) and drops the
 * reference it held once the close has completed. */
static void ucx_ep_uclose(ucx_ep_t *ep)
{
    ucx_transport_t *u = ucx_of(ep->base.t);
    if (!ep->uep)
        return;
    ucp_request_param_t p = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = ucx_on_ep_closed,
        .user_data = ep,
    };
    ucp_ep_h uep = ep->uep;
    ep->uep = NULL;
    ucs_status_ptr_t req = ucp_ep_close_nbx(uep, &p);
    if (UCS_PTR_IS_PTR(req)) {
        u->closing_eps++;
        kv_transport__kick(&u->base);
        return;
    }
    if (UCS_PTR_IS_ERR(req))
        pd_log_debug("%s: ep close: %s", u->base.name, ucs_status_string(UCS_PTR_STATUS(req)));
    ucx_ep_unref(ep);
}

static void ucx_ep_notify_run(kv_transport__op_t *base)
{
    ucx_op_t *op = (ucx_op_t *)base;
    ucx_ep_t *ep = op->ep;
    if (!ep->base.closing) {
        kv_transport__ep_notify(&ep->base, op->base.st);
        if (ep->base.accepted) {
            ep->base.closing = 1;
            kv_transport__ep_unlink(&ep->base);
        }
        ucx_ep_uclose(ep);
    }
    ucx_ep_unref(ep);
    free(op);
}

static void ucx_on_ep_error(void *arg, ucp_ep_h uep, ucs_status_t s)
{
    ucx_ep_t *ep = arg;
    (void)uep;
    if (ep->base.failed)
        return;
    ep->base.failed = 1;
    pd_log_info("%s: endpoint %p failed: %s", ep->base.t->name, (void *)ep, ucs_status_string(s));
    ucx_op_t *op = calloc(1, sizeof *op);
    if (!op) {
        pd_log_error("%s: endpoint %p failed, owner not told: out of memory", ep->base.t->name,
                     (void *)ep);
        return;
    }
    op->base.run = ucx_ep_notify_run;
    op->base.st = ucx_status(s) == PD_ERR_TRANSPORT ? PD_ERR_TRANSPORT : PD_ERR_UNAVAILABLE;
    op->ep = ep;
    ep->refs++;
    kv_transport__defer(ep->base.t, &op->base);
}

static ucp_err_handling_mode_t ucx_err_mode(kv_transport_t *t)
{
    return t->no_peer_errors ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
}

static ucx_ep_t *ucx_ep_new(ucx_transport_t *u)
{
    ucx_ep_t *ep = calloc(1, sizeof *ep);
    if (!ep) {
        pd_log_error("%s: endpoint: out of memory", u->base.name);
        return NULL;
    }
    ep->refs = 1;
    return ep;
}

static void ucx_on_conn_request(ucp_conn_request_h req, void *arg)
{
    ucx_transport_t *u = arg;
    ucx_ep_t *ep = ucx_ep_new(u);
    if (!ep) {
        ucp_listener_reject(u->listener, req);
        return;
    }
    ucp_ep_params_t p = {
        .field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .conn_request = req,
        .err_mode = ucx_err_mode(&u->base),
        .err_handler = {.cb = ucx_on_ep_error, .arg = ep},
    };
    ucs_status_t s = ucp_ep_create(u->worker, &p, &ep->uep);
    if (s != UCS_OK) {
        pd_log_error("%s: accept: ucp_ep_create: %s", u->base.name, ucs_status_string(s));
        free(ep);
        return;
    }
    ep->base.accepted = 1;
    kv_transport__ep_link(&u->base, &ep->base);
    pd_log_debug("%s: accepted endpoint %p", u->base.name, (void *)ep);
}

static pd_status_t ucx_sockaddr(const char *host, int port, struct sockaddr_storage *ss,
                                socklen_t *len_p)
{
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    memset(ss, 0, sizeof *ss);
    if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        *len_p = sizeof *in4;
        return PD_OK;
    }
    if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        *len_p = sizeof *in6;
        return PD_OK;
    }
    return PD_ERR_INVALID;
}

static pd_status_t ucx_connect(kv_transport_t *t, const char *host, int port,
                               kv_transport_ep_t **ep_p)
{
    ucx_transport_t *u = ucx_of(t);
    struct sockaddr_storage ss;
    socklen_t ss_len;
    if (ucx_sockaddr(host, port, &ss, &ss_len) != PD_OK) {
        pd_log_error("%s: connect: %s is not a numeric address", t->name, host);
        return PD_ERR_INVALID;
    }
    ucx_ep_t *ep = ucx_ep_new(u);
    if (!ep)
        return PD_ERR_NOMEM;
    ucp_ep_params_t p = {
        .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
        .sockaddr = {.addr = (const struct sockaddr *)&ss, .addrlen = ss_len},
        .err_mode = ucx_err_mode(&u->base),
        .err_handler = {.cb = ucx_on_ep_error, .arg = ep},
    };
    ucs_status_t s = ucp_ep_create(u->worker, &p, &ep->uep);
    if (s != UCS_OK) {
        pd_log_error("%s: connect %s:%d: ucp_ep_create: %s", t->name, host, port,
                     ucs_status_string(s));
        free(ep);
        return ucx_status(s) == PD_ERR_TRANSPORT ? PD_ERR_UNAVAILABLE : ucx_status(s);
    }
    ep->refs++; /* the caller's handle, dropped by ep_close */
    kv_transport__ep_link(t, &ep->base);
    kv_transport__kick(t);
    *ep_p = &ep->base;
    return PD_OK;
}

static void ucx_ep_print(kv_transport_ep_t *base, FILE *f)
{
    ucx_ep_t *ep = (ucx_ep_t *)base;
    if (ep->uep)
        ucp_ep_print_info(ep->uep, f);
}

static void ucx_ep_close(kv_transport_ep_t *base)
{
    ucx_ep_t *ep = (ucx_ep_t *)base;
    ucx_ep_uclose(ep);
    ucx_ep_unref(ep); /* the caller's handle */
}

/* ==== listener and active messages ==== */

static pd_status_t ucx_listen(kv_transport_t *t, const char *host, int port, int *port_p)
{
    ucx_transport_t *u = ucx_of(t);
    struct sockaddr_storage ss;
    socklen_t ss_len;
    if (u->listener) {
        pd_log_error("%s: listen %s:%d: already listening", t->name, host, port);
        return PD_ERR_INVALID;
    }
    if (ucx_sockaddr(host, port, &ss, &ss_len) != PD_OK) {
        pd_log_error("%s: listen: %s is not a numeric address", t->name, host);
        return PD_ERR_INVALID;
    }
    ucp_listener_params_t p = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = (const struct sockaddr *)&ss, .addrlen = ss_len},
        .conn_handler = {.cb = ucx_on_conn_request, .arg = u},
    };
    ucp_listener_h listener;
    ucs_status_t s = ucp_listener_create(u->worker, &p, &listener);
    if (s != UCS_OK) {
        pd_log_error("%s: listen %s:%d: %s", t->name, host, port, ucs_status_string(s));
        return ucx_status(s) == PD_ERR_INVALID ? PD_ERR_INVALID : PD_ERR_UNAVAILABLE;
    }
    ucp_listener_attr_t attr = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    s = ucp_listener_query(listener, &attr);
    if (s != UCS_OK) {
        pd_log_error("%s: listen %s:%d: query: %s", t->name, host, port, ucs_status_string(s));
        ucp_listener_destroy(listener);
        return PD_ERR_TRANSPORT;
    }
    u->listener = listener;
    if (attr.sockaddr.ss_family == AF_INET6)
        *port_p = ntohs(((struct sockaddr_in6 *)&attr.sockaddr)->sin6_port);
    else
        *port_p = ntohs(((struct sockaddr_in *)&attr.sockaddr)->sin_port);
    kv_transport__kick(t);
    return PD_OK;
}

static kv_transport_ep_t *ucx_ep_find(ucx_transport_t *u, ucp_ep_h uep)
{
    for (kv_transport_ep_t *ep = u->base.eps; ep; ep = ep->next)
        if (((ucx_ep_t *)ep)->uep == uep)
            return ep;
    return NULL;
}

static void ucx_on_rx_done(void *req, ucs_status_t s, size_t length, void *user_data)
{
    ucx_rx_t *rx = user_data;
    ucx_transport_t *u = rx->slot->t;
    if (s == UCS_OK && rx->slot->fn)
        rx->slot->fn(rx->slot->arg, rx->header, rx->header_len, rx->data, length,
                     ucx_ep_find(u, rx->reply_ep));
    else if (s != UCS_OK)
        pd_log_error("%s: am %u: receiving %zu bytes: %s", u->base.name, rx->slot->id, rx->len,
                     ucs_status_string(s));
    if (req)
        ucp_request_free(req);
    free(rx);
}

static ucs_status_t ucx_on_am(void *arg, const void *header, size_t header_len, void *data,
                              size_t len, const ucp_am_recv_param_t *param)
{
    ucx_am_slot_t *slot = arg;
    ucx_transport_t *u = slot->t;
    ucp_ep_h reply_ep =
        (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        if (slot->fn)
            slot->fn(slot->arg, header, header_len, data, len, ucx_ep_find(u, reply_ep));
        return UCS_OK;
    }
    if (header_len > KV_TRANSPORT_AM_HEADER_MAX)
        return UCS_ERR_MESSAGE_TRUNCATED;
    ucx_rx_t *rx = malloc(sizeof *rx + len);
    if (!rx) {
        pd_log_error("%s: am %u: %zu bytes: out of memory", u->base.name, slot->id, len);
        return UCS_ERR_NO_MEMORY;
    }
    rx->slot = slot;
    rx->reply_ep = reply_ep;
    rx->header_len = header_len;
    rx->len = len;
    if (header_len)
        memcpy(rx->header, header, header_len);
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = ucx_on_rx_done,
        .user_data = rx,
    };
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(u->worker, data, rx->data, len, &p);
    if (req == NULL)
        ucx_on_rx_done(NULL, UCS_OK, len, rx);
    else if (UCS_PTR_IS_ERR(req))
        ucx_on_rx_done(NULL, UCS_PTR_STATUS(req), len, rx);
    return UCS_INPROGRESS;
}

static pd_status_t ucx_set_am_handler(kv_transport_t *t, uint16_t id, kv_transport_am_fn fn,
                                      void *arg)
{
    ucx_transport_t *u = ucx_of(t);
    if (id >= UCX_AM_MAX) {
        pd_log_error("%s: am handler id %u >= %d", t->name, id, UCX_AM_MAX);
        return PD_ERR_INVALID;
    }
    ucx_am_slot_t *slot = &u->am[id];
    ucp_am_handler_param_t p = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = id,
        .cb = fn ? ucx_on_am : NULL,
        .arg = slot,
    };
    ucs_status_t s = ucp_worker_set_am_recv_handler(u->worker, &p);
    if (s != UCS_OK) {
        pd_log_error("%s: am handler %u: %s", t->name, id, ucs_status_string(s));
        return PD_ERR_TRANSPORT;
    }
    slot->t = u;
    slot->id = id;
    slot->fn = fn;
    slot->arg = arg;
    return PD_OK;
}

/* ==== memory ==== */

/* Maps base[0, len) with UCX; mem_type UCS_MEMORY_TYPE_CUDA for device memory (set explicitly
 * rather than left to UCX's pointer detection, which a CUDA-less UCX does not have). */
static pd_status_t ucx__mem_map(kv_transport_t *t, void *base, size_t len,
                                ucs_memory_type_t mem_type, kv_transport_mem_t **m_p)
{
    ucx_transport_t *u = ucx_of(t);
    ucx_mem_t *m = calloc(1, sizeof *m);
    if (!m) {
        pd_log_error("%s: mem register %p+%zu: out of memory", t->name, base, len);
        return PD_ERR_NOMEM;
    }
    ucp_mem_map_params_t p = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = base,
        .length = len,
        .memory_type = mem_type,
    };
    ucs_status_t s = ucp_mem_map(u->ctx, &p, &m->memh);
    if (s != UCS_OK) {
        pd_log_error("%s: mem register %p+%zu: %s", t->name, base, len, ucs_status_string(s));
        free(m);
        return s == UCS_ERR_NO_MEMORY ? PD_ERR_NOMEM : PD_ERR_TRANSPORT;
    }
    m->next = u->mems;
    if (u->mems)
        u->mems->prev = m;
    u->mems = m;
    *m_p = &m->base;
    return PD_OK;
}

static pd_status_t ucx_mem_register(kv_transport_t *t, void *base, size_t len,
                                    kv_transport_mem_t **m_p)
{
    return ucx__mem_map(t, base, len, UCS_MEMORY_TYPE_HOST, m_p);
}

static pd_status_t ucx_mem_register_cuda(kv_transport_t *t, void *base, size_t len,
                                         kv_transport_mem_t **m_p)
{
    return ucx__mem_map(t, base, len, UCS_MEMORY_TYPE_CUDA, m_p);
}

static pd_status_t ucx_mem_pack(kv_transport_mem_t *base, void **key_p, size_t *len_p)
{
    ucx_mem_t *m = (ucx_mem_t *)base;
    ucs_status_t s = ucp_rkey_pack(ucx_of(base->t)->ctx, m->memh, key_p, len_p);
    if (s != UCS_OK) {
        pd_log_error("%s: rkey pack: %s", base->t->name, ucs_status_string(s));
        return PD_ERR_TRANSPORT;
    }
    return PD_OK;
}

static void ucx_mem_release_key(kv_transport_mem_t *m, void *key)
{
    (void)m;
    ucp_rkey_buffer_release(key);
}

static void ucx_mem_free(ucx_transport_t *u, ucx_mem_t *m)
{
    if (m->prev)
        m->prev->next = m->next;
    else
        u->mems = m->next;
    if (m->next)
        m->next->prev = m->prev;
    ucs_status_t s = ucp_mem_unmap(u->ctx, m->memh);
    if (s != UCS_OK)
        pd_log_error("%s: mem deregister %p: %s", u->base.name, m->base.base, ucs_status_string(s));
    free(m);
}

static void ucx_mem_deregister(kv_transport_mem_t *m)
{
    ucx_mem_free(ucx_of(m->t), (ucx_mem_t *)m);
}

static pd_status_t ucx_rkey_unpack(kv_transport_ep_t *base, const void *key, size_t len,
                                   kv_transport_rkey_t **r_p)
{
    ucx_ep_t *ep = (ucx_ep_t *)base;
    ucx_rkey_t *r = calloc(1, sizeof *r);
    if (!r) {
        pd_log_error("%s: rkey unpack: out of memory", base->t->name);
        return PD_ERR_NOMEM;
    }
    ucs_status_t s = ucp_ep_rkey_unpack(ep->uep, key, &r->rkey);
    if (s != UCS_OK) {
        pd_log_error("%s: rkey unpack (%zu bytes): %s", base->t->name, len, ucs_status_string(s));
        free(r);
        return s == UCS_ERR_NO_MEMORY ? PD_ERR_NOMEM : PD_ERR_FORMAT;
    }
    *r_p = &r->base;
    return PD_OK;
}

static void ucx_rkey_destroy(kv_transport_rkey_t *base)
{
    ucx_rkey_t *r = (ucx_rkey_t *)base;
    ucp_rkey_destroy(r->rkey);
    free(r);
}

/* ==== operations ==== */

/* Reports op's status and frees it. Only the caller's close or destroy (closing set) is a
 * cancel; UCX purges a failed endpoint's requests with UCS_ERR_CANCELED, sometimes before its
 * error handler runs, and those report the failure (PD_ERR_UNAVAILABLE). */
static void ucx_op_finish(ucx_op_t *op, pd_status_t st)
{
    ucx_ep_t *ep = op->ep;
    if (st == PD_ERR_CANCELLED && !ep->base.closing)
        st = PD_ERR_UNAVAILABLE;
    op->base.cb(op->base.arg, st);
    ucx_ep_unref(ep);
    free(op);
}

static void ucx_on_op_done(void *req, ucs_status_t s, void *user_data)
{
    ucx_op_finish(user_data, ucx_status(s));
    ucp_request_free(req);
}

static void ucx_op_run_deferred(kv_transport__op_t *op)
{
    ucx_op_finish((ucx_op_t *)op, op->st);
}

static ucx_op_t *ucx_op_new(kv_transport_ep_t *ep, kv_transport_done_fn cb, void *arg,
                            ucp_request_param_t *p)
{
    ucx_op_t *op = malloc(sizeof *op);
    if (!op) {
        pd_log_error("%s: operation: out of memory", ep->t->name);
        return NULL;
    }
    op->base.next = NULL;
    op->base.run = ucx_op_run_deferred;
    op->base.cb = cb;
    op->base.arg = arg;
    op->base.st = PD_OK;
    op->ep = (ucx_ep_t *)ep;
    op->ep->refs++;
    memset(p, 0, sizeof *p);
    p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p->cb.send = ucx_on_op_done;
    p->user_data = op;
    return op;
}

/* Completes the start of an operation: immediate completions are deferred to the loop. */
static pd_status_t ucx_op_started(kv_transport_ep_t *ep, ucx_op_t *op, ucs_status_ptr_t req,
                                  const char *what)
{
    if (UCS_PTR_IS_ERR(req)) {
        ucs_status_t s = UCS_PTR_STATUS(req);
        pd_log_error("%s: %s: %s", ep->t->name, what, ucs_status_string(s));
        ucx_ep_unref(op->ep);
        free(op);
        return ucx_status(s) == PD_OK ? PD_ERR_TRANSPORT : ucx_status(s);
    }
    if (req == NULL)
        kv_transport__defer(ep->t, &op->base);
    kv_transport__kick(ep->t);
    return PD_OK;
}

static pd_status_t ucx__put(kv_transport_ep_t *ep, const void *local, size_t len,
                            ucs_memory_type_t mem_type, uint64_t remote_addr,
                            kv_transport_rkey_t *r, kv_transport_done_fn cb, void *arg)
{
    ucp_request_param_t p;
    ucx_op_t *op = ucx_op_new(ep, cb, arg, &p);
    if (!op)
        return PD_ERR_NOMEM;
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE; /* the local buffer's, on every put */
    p.memory_type = mem_type;
    ucs_status_ptr_t req =
        ucp_put_nbx(((ucx_ep_t *)ep)->uep, local, len, remote_addr, ((ucx_rkey_t *)r)->rkey, &p);
    return ucx_op_started(ep, op, req, "put");
}

static pd_status_t ucx_put(kv_transport_ep_t *ep, const void *local, size_t len,
                           uint64_t remote_addr, kv_transport_rkey_t *r, kv_transport_done_fn cb,
                           void *arg)
{
    return ucx__put(ep, local, len, UCS_MEMORY_TYPE_HOST, remote_addr, r, cb, arg);
}

static pd_status_t ucx_put_cuda(kv_transport_ep_t *ep, const void *local, size_t len,
                                uint64_t remote_addr, kv_transport_rkey_t *r,
                                kv_transport_done_fn cb, void *arg)
{
    return ucx__put(ep, local, len, UCS_MEMORY_TYPE_CUDA, remote_addr, r, cb, arg);
}

static pd_status_t ucx_flush(kv_transport_ep_t *ep, kv_transport_done_fn cb, void *arg)
{
    ucp_request_param_t p;
    ucx_op_t *op = ucx_op_new(ep, cb, arg, &p);
    if (!op)
        return PD_ERR_NOMEM;
    ucs_status_ptr_t req = ucp_ep_flush_nbx(((ucx_ep_t *)ep)->uep, &p);
    return ucx_op_started(ep, op, req, "flush");
}

static pd_status_t ucx_am_send(kv_transport_ep_t *ep, uint16_t id, const void *header,
                               size_t header_len, const void *data, size_t len,
                               kv_transport_done_fn cb, void *arg)
{
    ucp_request_param_t p;
    ucx_op_t *op = ucx_op_new(ep, cb, arg, &p);
    if (!op)
        return PD_ERR_NOMEM;
    if (header_len)
        memcpy(op->header, header, header_len);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t req =
        ucp_am_send_nbx(((ucx_ep_t *)ep)->uep, id, op->header, header_len, data, len, &p);
    return ucx_op_started(ep, op, req, "am send");
}

/* ==== transport ==== */

static int ucx_query_cuda(kv_transport_t *t)
{
    return ucx_of(t)->cuda;
}

static void ucx_destroy(kv_transport_t *t)
{
    ucx_transport_t *u = ucx_of(t);
    while (t->eps) {
        ucx_ep_t *ep = (ucx_ep_t *)t->eps;
        while (ep->base.rkeys)
            kv_transport_rkey_destroy(ep->base.rkeys);
        int caller_owned = !ep->base.accepted;
        ep->base.closing = 1;
        kv_transport__ep_unlink(&ep->base);
        ucx_ep_uclose(ep); /* may free an accepted ep */
        if (caller_owned)
            ucx_ep_unref(ep); /* the caller's handle, invalid from now on */
    }
    if (u->listener) {
        ucp_listener_destroy(u->listener);
        u->listener = NULL;
    }
    while (u->closing_eps > 0)
        ucp_worker_progress(u->worker);
    if (u->mems)
        pd_log_warn("%s: destroy: registrations left, released", t->name);
    while (u->mems)
        ucx_mem_free(u, u->mems);
    kv_transport__close_handle(t, (uv_handle_t *)&u->poll); /* stops polling the fd now */
    ucp_worker_destroy(u->worker);
    ucp_cleanup(u->ctx);
}

static void ucx_free(kv_transport_t *t)
{
    free(t);
}

static const kv_transport_ops_t ucx_ops = {
    .kind = "ucx",
    .destroy = ucx_destroy,
    .free = ucx_free,
    .query_cuda = ucx_query_cuda,
    .progress = ucx_progress,
    .listen = ucx_listen,
    .mem_register = ucx_mem_register,
    .mem_register_cuda = ucx_mem_register_cuda,
    .mem_pack = ucx_mem_pack,
    .mem_release_key = ucx_mem_release_key,
    .mem_deregister = ucx_mem_deregister,
    .set_am_handler = ucx_set_am_handler,
    .connect = ucx_connect,
    .ep_close = ucx_ep_close,
    .ep_print = ucx_ep_print,
    .rkey_unpack = ucx_rkey_unpack,
    .rkey_destroy = ucx_rkey_destroy,
    .put = ucx_put,
    .put_cuda = ucx_put_cuda,
    .flush = ucx_flush,
    .am_send = ucx_am_send,
};

static pd_status_t ucx_context_init(ucx_transport_t *u)
{
    ucp_config_t *config;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s != UCS_OK) {
        pd_log_error("%s: ucp_config_read: %s", u->base.name, ucs_status_string(s));
        return PD_ERR_TRANSPORT;
    }
    ucp_params_t p = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
    };
    s = ucp_init(&p, config, &u->ctx);
    ucp_config_release(config);
    if (s != UCS_OK) {
        pd_log_error("%s: ucp_init: %s", u->base.name, ucs_status_string(s));
        return PD_ERR_TRANSPORT;
    }
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    s = ucp_context_query(u->ctx, &attr);
    if (s == UCS_OK)
        u->cuda = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    else
        pd_log_warn("%s: ucp_context_query: %s", u->base.name, ucs_status_string(s));
    return PD_OK;
}

static pd_status_t ucx_worker_init(ucx_transport_t *u, int *efd_p)
{
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    ucs_status_t s = ucp_worker_create(u->ctx, &wp, &u->worker);
    if (s != UCS_OK) {
        pd_log_error("%s: ucp_worker_create: %s", u->base.name, ucs_status_string(s));
        return PD_ERR_TRANSPORT;
    }
    s = ucp_worker_get_efd(u->worker, efd_p);
    if (s != UCS_OK) {
        pd_log_error("%s: ucp_worker_get_efd: %s", u->base.name, ucs_status_string(s));
        ucp_worker_destroy(u->worker);
        return PD_ERR_TRANSPORT;
    }
    return PD_OK;
}

static void ucx_on_early_close(uv_handle_t *h)
{
    free(h->data);
}

pd_status_t kv_transport_ucx_create(uv_loop_t *loop, const kv_transport_params_t *params,
                                    kv_transport_t **t_p)
{
    int efd, rc;
    pd_status_t st;
    ucx_transport_t *u = calloc(1, sizeof *u);
    if (!u) {
        pd_log_error("ucx create: out of memory");
        return PD_ERR_NOMEM;
    }
    snprintf(u->base.name, sizeof u->base.name, "%s", params && params->name ? params->name : "kv");
    st = ucx_context_init(u);
    if (st != PD_OK)
        goto err_free;
    st = ucx_worker_init(u, &efd);
    if (st != PD_OK)
        goto err_cleanup_ctx;
    rc = uv_poll_init(loop, &u->poll, efd);
    if (rc < 0) {
        pd_log_error("%s: uv_poll_init(worker fd %d): %s", u->base.name, efd, uv_strerror(rc));
        st = PD_ERR_IO;
        goto err_destroy_worker;
    }
    /* From here the poll handle is open: failures close it and free from its callback. */
    st = kv_transport__init(&u->base, &ucx_ops, loop, params);
    if (st != PD_OK) {
        u->poll.data = u;
        uv_close((uv_handle_t *)&u->poll, ucx_on_early_close);
        ucp_worker_destroy(u->worker);
        ucp_cleanup(u->ctx);
        return st;
    }
    u->base.open_handles++; /* the poll handle */
    u->poll.data = u;
    rc = uv_poll_start(&u->poll, UV_READABLE, ucx_on_poll);
    if (rc < 0) {
        pd_log_error("%s: uv_poll_start(worker fd %d): %s", u->base.name, efd, uv_strerror(rc));
        kv_transport_destroy(&u->base);
        return PD_ERR_IO;
    }
    kv_transport__kick(&u->base);
    *t_p = &u->base;
    return PD_OK;

err_destroy_worker:
    ucp_worker_destroy(u->worker);
err_cleanup_ctx:
    ucp_cleanup(u->ctx);
err_free:
    free(u);
    return st;
}
