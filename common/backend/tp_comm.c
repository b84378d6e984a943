/* tp_comm: dispatch and the in-process fake communicator (see tp_comm.h). */
#include "tp_comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

pd_status_t tp_comm_all_reduce_sum(tp_comm_t *c, float *buf, size_t n)
{
    return c->ops->all_reduce_sum(c, buf, n);
}

pd_status_t tp_comm_all_gather(tp_comm_t *c, float *out, const float *in, size_t n)
{
    return c->ops->all_gather(c, out, in, n);
}

pd_status_t tp_comm_barrier(tp_comm_t *c)
{
    return c->ops->barrier(c);
}

pd_status_t tp_comm_abort(tp_comm_t *c)
{
    return c->ops->abort ? c->ops->abort(c) : PD_ERR_UNSUPPORTED;
}

pd_status_t tp_comm_reset(tp_comm_t *c)
{
    return c->ops->reset ? c->ops->reset(c) : PD_ERR_UNSUPPORTED;
}

void tp_comm_destroy(tp_comm_t *c)
{
    if (c)
        c->ops->destroy(c);
}

/* ==== fake: one group shared by `size` rank threads ==== */

typedef enum { FAKE_REDUCE, FAKE_GATHER, FAKE_BARRIER } fake_kind_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size, arrived, live;
    int aborted; /* tp_comm_abort: every collective returns PD_ERR_TP_ABORTED until reset */
    unsigned long generation; /* bumped when a collective completes */
    /* this collective's arguments, per rank */
    fake_kind_t kind;
    size_t n;
    float **out;         /* (size) */
    const float **in;    /* (size) */
    pd_status_t status;  /* PD_ERR_INVALID when ranks disagree on kind or n */
    pd_status_t *result; /* (size): the status of each rank's last collective, written by the
                            completer; a rank reads its own slot before it can enter the next
                            collective (g->status may already belong to that one) */
} fake_group_t;

/* Runs the collective once every rank has deposited its buffers; called by the last to arrive,
 * under the lock, while the others wait, so every buffer is still valid. */
static void fake__complete(fake_group_t *g)
{
    const size_t n = g->n;
    if (g->status != PD_OK)
        return;
    if (g->kind == FAKE_REDUCE) {
        for (size_t i = 0; i < n; i++) {
            float acc = g->in[0][i]; /* rank order: every rank gets the same bits */
            for (int r = 1; r < g->size; r++)
                acc += g->in[r][i];
            for (int r = 0; r < g->size; r++)
                g->out[r][i] = acc;
        }
    } else if (g->kind == FAKE_GATHER) {
        for (int dst = 0; dst < g->size; dst++)
            for (int src = 0; src < g->size; src++)
                memcpy(g->out[dst] + (size_t)src * n, g->in[src], n * sizeof(float));
    }
}

static pd_status_t fake__collective(tp_comm_t *c, fake_kind_t kind, float *out, const float *in,
                                    size_t n)
{
    fake_group_t *g = c->impl;
    pd_status_t st;

    pthread_mutex_lock(&g->mu);
    if (g->aborted) {
        pthread_mutex_unlock(&g->mu);
        return PD_ERR_TP_ABORTED;
    }
    if (g->arrived == 0) {
        g->kind = kind;
        g->n = n;
        g->status = PD_OK;
    } else if (g->kind != kind || g->n != n) {
        pd_log_error("tp fake rank %d: collective %d of %zu floats, others called %d of %zu",
                     c->rank, (int)kind, n, (int)g->kind, g->n);
        g->status = PD_ERR_INVALID;
    }
    g->out[c->rank] = out;
    g->in[c->rank] = in;
    if (++g->arrived == g->size) {
        fake__complete(g);
        for (int r = 0; r < g->size; r++)
            g->result[r] = g->status;
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    } else {
        unsigned long gen = g->generation;
        while (gen == g->generation && !g->aborted)
            pthread_cond_wait(&g->cv, &g->mu);
        if (gen == g->generation) { /* aborted: a rank will never arrive */
            pthread_mutex_unlock(&g->mu);
            return PD_ERR_TP_ABORTED;
        }
    }
    st = g->result[c->rank];
    pthread_mutex_unlock(&g->mu);
    return st;
}

static pd_status_t fake_all_reduce_sum(tp_comm_t *c, float *buf, size_t n)
{
    return fake__collective(c, FAKE_REDUCE, buf, buf, n);
}

static pd_status_t fake_all_gather(tp_comm_t *c, float *out, const float *in, size_t n)
{
    return fake__collective(c, FAKE_GATHER, out, in, n);
}

static pd_status_t fake_barrier(tp_comm_t *c)
{
    return fake__collective(c, FAKE_BARRIER, NULL, NULL, 0);
}

static pd_status_t fake_abort(tp_comm_t *c)
{
    fake_group_t *g = c->impl;
    pthread_mutex_lock(&g->mu);
    if (!g->aborted)
        pd_log_warn("tp fake rank %d: collectives aborted (%d of %d ranks were waiting)", c->rank,
                    g->arrived, g->size);
    g->aborted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return PD_OK;
}

static pd_status_t fake_reset(tp_comm_t *c)
{
    fake_group_t *g = c->impl;
    pthread_mutex_lock(&g->mu);
    g->aborted = 0;
    g->arrived = 0; /* the ranks that waited in the aborted collective have left it */
    g->status = PD_OK;
    pthread_mutex_unlock(&g->mu);
    return PD_OK;
}

static void fake__group_free(fake_group_t *g)
{
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->out);
    free(g->in);
    free(g->result);
    free(g);
}

static void fake_destroy(tp_comm_t *c)
{
    fake_group_t *g = c->impl;
    int last;
    pthread_mutex_lock(&g->mu);
    last = --g->live == 0;
    pthread_mutex_unlock(&g->mu);
    if (last)
        fake__group_free(g);
    free(c);
}

static const tp_comm_ops_t fake_ops = {
    .name = "fake",
    .all_reduce_sum = fake_all_reduce_sum,
    .all_gather = fake_all_gather,
    .barrier = fake_barrier,
    .abort = fake_abort,
    .reset = fake_reset,
    .destroy = fake_destroy,
};

pd_status_t tp_comm_fake_create(int size, tp_comm_t **ranks_p)
{
    fake_group_t *g;
    tp_comm_t **ranks;
    int r;

    if (size < 1)
        return PD_ERR_INVALID;
    g = calloc(1, sizeof *g);
    if (!g)
        return PD_ERR_NOMEM;
    g->size = size;
    g->out = calloc((size_t)size, sizeof *g->out);
    g->in = calloc((size_t)size, sizeof *g->in);
    g->result = calloc((size_t)size, sizeof *g->result);
    ranks = calloc((size_t)size, sizeof *ranks);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (!g->out || !g->in || !g->result || !ranks)
        goto err_free_group;
    for (r = 0; r < size; r++) {
        tp_comm_t *c = calloc(1, sizeof *c);
        if (!c)
            goto err_free_ranks;
        *c = (tp_comm_t){&fake_ops, r, size, g};
        ranks[r] = c;
    }
    g->live = size;
    memcpy(ranks_p, ranks, (size_t)size * sizeof *ranks);
    free(ranks);
    return PD_OK;
err_free_ranks:
    while (r-- > 0)
        free(ranks[r]);
err_free_group:
    free(ranks);
    fake__group_free(g);
    return PD_ERR_NOMEM;
}
