/* tp_comm_faults: see tp_comm_faults.h. */
#include "tp_comm_faults.h"

#include <stdlib.h>

#include "log.h"

typedef struct {
    tp_comm_t *inner;
    tp_comm_faults_t *f;
} wrap_t;

/* PD_OK, or the injected failure for this call */
static pd_status_t faults__count(tp_comm_t *c)
{
    wrap_t *w = c->impl;
    if (c->rank != w->f->rank || atomic_fetch_add(&w->f->calls, 1) + 1 != w->f->at)
        return PD_OK;
    atomic_store(&w->f->injected, 1);
    pd_log_warn("injecting fault tp-rank: rank %d's collective %d fails", c->rank, w->f->at);
    return PD_ERR_CUDA;
}

static pd_status_t faults_all_reduce_sum(tp_comm_t *c, float *buf, size_t n)
{
    pd_status_t st = faults__count(c);
    return st != PD_OK ? st : tp_comm_all_reduce_sum(((wrap_t *)c->impl)->inner, buf, n);
}

static pd_status_t faults_all_gather(tp_comm_t *c, float *out, const float *in, size_t n)
{
    pd_status_t st = faults__count(c);
    return st != PD_OK ? st : tp_comm_all_gather(((wrap_t *)c->impl)->inner, out, in, n);
}

static pd_status_t faults_barrier(tp_comm_t *c)
{
    pd_status_t st = faults__count(c);
    return st != PD_OK ? st : tp_comm_barrier(((wrap_t *)c->impl)->inner);
}

static pd_status_t faults_abort(tp_comm_t *c)
{
    return tp_comm_abort(((wrap_t *)c->impl)->inner);
}

static pd_status_t faults_reset(tp_comm_t *c)
{
    return tp_comm_reset(((wrap_t *)c->impl)->inner);
}

static void faults_destroy(tp_comm_t *c)
{
    wrap_t *w = c->impl;
    tp_comm_destroy(w->inner);
    free(w);
    free(c);
}

static const tp_comm_ops_t faults_ops = {
    .name = "faults",
    .all_reduce_sum = faults_all_reduce_sum,
    .all_gather = faults_all_gather,
    .barrier = faults_barrier,
    .abort = faults_abort,
    .reset = faults_reset,
    .destroy = faults_destroy,
};

void tp_comm_faults_wrap(void *arg, tp_comm_t **comms, int size)
{
    tp_comm_t *out[64];
    if (size > 64)
        return;
    for (int r = 0; r < size; r++) {
        tp_comm_t *c = calloc(1, sizeof *c);
        wrap_t *w = calloc(1, sizeof *w);
        if (!c || !w) {
            pd_log_error("tp faults: out of memory: communicators left unwrapped");
            free(c);
            free(w);
            while (r-- > 0) {
                free(out[r]->impl);
                free(out[r]);
            }
            return;
        }
        *w = (wrap_t){comms[r], arg};
        *c = (tp_comm_t){&faults_ops, comms[r]->rank, comms[r]->size, w};
        out[r] = c;
    }
    for (int r = 0; r < size; r++)
        comms[r] = out[r];
}
