#include "grpc_health.h"

#include <stdlib.h>
#include <string.h>

#include "health.pb-c.h"
#include "log.h"

typedef struct {
    char *service;
    int status;
} pd_grpc_health__entry_t;

typedef struct pd_grpc_health__watch {
    struct pd_grpc_health__watch *prev, *next;
    pd_grpc_health_t *h;
    pd_grpc_call_t *call;
    char *service;
    int sent; /* last status sent, -1 = none */
} pd_grpc_health__watch_t;

struct pd_grpc_health {
    pd_grpc_health__entry_t *entries;
    size_t n_entries;
    pd_grpc_health__watch_t *watches;
    pd_grpc_method_fn handlers[2];
};

static pd_grpc_health__entry_t *pd_grpc_health__find(const pd_grpc_health_t *h, const char *service)
{
    for (size_t i = 0; i < h->n_entries; i++)
        if (strcmp(h->entries[i].service, service) == 0)
            return &h->entries[i];
    return NULL;
}

int pd_grpc_health_get(const pd_grpc_health_t *h, const char *service)
{
    const pd_grpc_health__entry_t *e = pd_grpc_health__find(h, service);
    return e ? e->status : PD_GRPC_HEALTH_SERVICE_UNKNOWN;
}

static void pd_grpc_health__check(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
    pd_grpc_health__entry_t *e = pd_grpc_health__find(user, r->service);
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    pd_status_t st;

    if (!e) {
        pd_grpc_call_finish(call, PD_GRPC_NOT_FOUND, "unknown service");
        return;
    }
    resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)e->status;
    st = pd_grpc_call_send(call, &resp.base);
    pd_grpc_call_finish_status(call, st, NULL);
}

static void pd_grpc_health__watch_free(pd_grpc_health__watch_t *w)
{
    pd_grpc_health_t *h = w->h;

    if (w->prev)
        w->prev->next = w->next;
    else
        h->watches = w->next;
    if (w->next)
        w->next->prev = w->prev;
    free(w->service);
    free(w);
}

/* Sends the current status when it differs from the last one sent. */
static void pd_grpc_health__watch_update(pd_grpc_health__watch_t *w)
{
    int status = pd_grpc_health_get(w->h, w->service);
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    pd_status_t st;

    if (status == w->sent)
        return;
    resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    st = pd_grpc_call_send(w->call, &resp.base);
    if (st == PD_OK) {
        w->sent = status;
    } else if (st != PD_AGAIN) { /* PD_AGAIN: the writable callback retries */
        pd_grpc_call_finish_status(w->call, st, NULL);
        pd_grpc_health__watch_free(w);
    }
}

static void pd_grpc_health__watch_writable(pd_grpc_call_t *call, void *arg)
{
    (void)call;
    pd_grpc_health__watch_update(arg);
}

static void pd_grpc_health__watch_cancel(pd_grpc_call_t *call, void *arg)
{
    pd_grpc_call_finish(call, PD_GRPC_CANCELLED, NULL);
    pd_grpc_health__watch_free(arg);
}

static void pd_grpc_health__watch(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
    pd_grpc_health_t *h = user;
    pd_grpc_health__watch_t *w = calloc(1, sizeof *w);

    if (!w || !(w->service = strdup(r->service))) {
        free(w);
        pd_grpc_call_finish(call, PD_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    w->h = h;
    w->call = call;
    w->sent = -1;
    w->next = h->watches;
    if (h->watches)
        h->watches->prev = w;
    h->watches = w;
    pd_grpc_call_set_cancel_cb(call, pd_grpc_health__watch_cancel, w);
    pd_grpc_call_set_writable_cb(call, pd_grpc_health__watch_writable, w);
    pd_grpc_health__watch_update(w);
}

pd_status_t pd_grpc_health_create(pd_grpc_server_t *srv, pd_grpc_health_t **h_p)
{
    pd_grpc_health_t *h = calloc(1, sizeof *h);
    pd_status_t st;

    if (!h) {
        pd_log_error("grpc health: out of memory");
        return PD_ERR_NOMEM;
    }
    h->handlers[0] = pd_grpc_health__check;
    h->handlers[1] = pd_grpc_health__watch;
    PD_ASSERT(grpc__health__v1__health__descriptor.n_methods == 2);
    PD_ASSERT(strcmp(grpc__health__v1__health__descriptor.methods[0].name, "Check") == 0);
    st = pd_grpc_health_set(h, "", PD_GRPC_HEALTH_SERVING);
    if (st != PD_OK)
        goto err_free_h;
    st = pd_grpc_server_add_service(srv, &grpc__health__v1__health__descriptor, h->handlers, h);
    if (st != PD_OK)
        goto err_free_entries;
    *h_p = h;
    return PD_OK;

err_free_entries:
    free(h->entries[0].service);
    free(h->entries);
err_free_h:
    free(h);
    return st;
}

pd_status_t pd_grpc_health_set(pd_grpc_health_t *h, const char *service, int status)
{
    pd_grpc_health__entry_t *e = pd_grpc_health__find(h, service);

    if (status < PD_GRPC_HEALTH_UNKNOWN || status > PD_GRPC_HEALTH_NOT_SERVING) {
        pd_log_error("grpc health: %s: bad status %d", service, status);
        return PD_ERR_INVALID;
    }
    if (!e) {
        pd_grpc_health__entry_t *ne = realloc(h->entries, (h->n_entries + 1) * sizeof *ne);
        char *name = strdup(service);
        if (ne)
            h->entries = ne;
        if (!ne || !name) {
            free(name);
            pd_log_error("grpc health: out of memory adding %s", service);
            return PD_ERR_NOMEM;
        }
        e = &h->entries[h->n_entries++];
        e->service = name;
    } else if (e->status == status) {
        return PD_OK;
    }
    e->status = status;
    for (pd_grpc_health__watch_t *w = h->watches, *next; w; w = next) {
        next = w->next;
        if (strcmp(w->service, service) == 0)
            pd_grpc_health__watch_update(w);
    }
    return PD_OK;
}

void pd_grpc_health_destroy(pd_grpc_health_t *h)
{
    if (!h)
        return;
    while (h->watches) {
        pd_grpc_call_finish(h->watches->call, PD_GRPC_UNAVAILABLE, "server shutting down");
        pd_grpc_health__watch_free(h->watches);
    }
    for (size_t i = 0; i < h->n_entries; i++)
        free(h->entries[i].service);
    free(h->entries);
    free(h);
}
