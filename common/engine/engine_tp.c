/* engine_tp: the ranks of a tensor-parallel engine and their threads (see engine_tp.h). */
#include "engine_tp.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

struct engine_tp {
    int size;
    engine_rank_t *ranks; /* (size) */
    pthread_t *th;        /* (size) th[0] unused: rank 0 is the caller */
    int started;          /* rank threads running */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;  /* bumped per job */
    int parallel;  /* this job: all ranks at once, or turn by turn */
    int turn;      /* sequential job: the rank whose turn it is */
    int remaining; /* ranks > 0 not done with this job */
    int quit;
    int aborted; /* this job: a rank failed and aborted the group's collectives */
    engine_tp_fn fn;
    void *arg;
};

/* Runs fn on rank r. In a parallel job, a rank whose own work fails aborts the communicator, so
 * that the ranks waiting for it in a collective return (PD_ERR_TP_ABORTED) instead of waiting for
 * ever. */
static pd_status_t engine_tp__call(engine_tp_t *t, engine_rank_t *r, engine_tp_fn fn, void *arg,
                                   int parallel)
{
    pd_status_t st = fn(r, arg);
    if (st != PD_OK && st != PD_ERR_TP_ABORTED && parallel == ENGINE_TP_COLLECTIVES && r->comm) {
        pd_log_error("tp rank %d failed: %s; aborting the other ranks' collectives", r->rank,
                     pd_status_str(st));
        pthread_mutex_lock(&t->mu);
        t->aborted = 1;
        pthread_mutex_unlock(&t->mu);
        if (tp_comm_abort(r->comm) != PD_OK)
            pd_log_error("tp rank %d: the %s communicator cannot abort: the other ranks may wait",
                         r->rank, r->comm->ops->name);
    }
    return st;
}

typedef struct {
    engine_tp_t *t;
    int rank;
} engine_tp__start_t;

static void *engine_tp__main(void *arg)
{
    engine_tp__start_t *s = arg;
    engine_tp_t *t = s->t;
    const int r = s->rank;
    uint64_t seen = 0;
    free(s);
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->quit && (t->gen == seen || (!t->parallel && t->turn != r)))
            pthread_cond_wait(&t->go, &t->mu);
        if (t->quit)
            break;
        seen = t->gen;
        engine_tp_fn fn = t->fn;
        void *fa = t->arg;
        pthread_mutex_unlock(&t->mu);
        t->ranks[r].st = engine_tp__call(t, &t->ranks[r], fn, fa, t->parallel);
        pthread_mutex_lock(&t->mu);
        t->turn = r + 1;
        t->remaining--;
        pthread_cond_broadcast(&t->go); /* the next rank's turn */
        pthread_cond_broadcast(&t->done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

pd_status_t engine_tp_run(engine_tp_t *t, engine_tp_fn fn, void *arg, int parallel)
{
    pthread_mutex_lock(&t->mu);
    t->fn = fn;
    t->arg = arg;
    t->parallel = parallel;
    t->aborted = 0;
    t->turn = 1;
    t->remaining = t->size - 1;
    if (parallel) {
        t->gen++;
        pthread_cond_broadcast(&t->go);
        pthread_mutex_unlock(&t->mu);
        t->ranks[0].st = engine_tp__call(t, &t->ranks[0], fn, arg, parallel);
        pthread_mutex_lock(&t->mu);
    } else {
        pthread_mutex_unlock(&t->mu);
        t->ranks[0].st = fn(&t->ranks[0], arg);
        pthread_mutex_lock(&t->mu);
        t->gen++;
        pthread_cond_broadcast(&t->go);
    }
    while (t->remaining > 0)
        pthread_cond_wait(&t->done, &t->mu);
    const int aborted = t->aborted;
    pthread_mutex_unlock(&t->mu);
    if (aborted) {
        /* every rank has left its collective: the group can serve the next job */
        if (tp_comm_reset(t->ranks[0].comm) != PD_OK)
            pd_log_error("tp: the communicator cannot be reset after a failed rank");
        return PD_ERR_TP_ABORTED;
    }
    for (int r = 0; r < t->size; r++)
        if (t->ranks[r].st != PD_OK)
            return t->ranks[r].st;
    return PD_OK;
}

int engine_tp_size(const engine_tp_t *t)
{
    return t ? t->size : 1;
}

engine_rank_t *engine_tp_rank(engine_tp_t *t, int r)
{
    return &t->ranks[r];
}

typedef struct {
    const char *backend, *options;
    int device, threads;
} engine_tp__be_args_t;

static pd_status_t engine_tp__backend(engine_rank_t *r, void *arg)
{
    const engine_tp__be_args_t *a = arg;
    pd_status_t st = backend_create(a->backend, a->device + r->rank, a->threads, &r->be);
    if (st == PD_OK && (st = backend_set_options(r->be, a->options)) == PD_OK)
        r->tag_io = backend_tag_io(r->be);
    if (st != PD_OK)
        pd_log_error("tp rank %d: %s backend on device %d: %s", r->rank, a->backend,
                     a->device + r->rank, pd_status_str(st));
    return st;
}

pd_status_t engine_tp_create(int size, const char *backend, int device, int threads,
                             const char *options,
                             void (*wrap)(void *arg, tp_comm_t **comms, int size), void *wrap_arg,
                             engine_tp_t **t_p)
{
    engine_tp_t *t;
    pd_status_t st;
    if (size < 2 || size > 64)
        return PD_ERR_INVALID;
    if (!(t = calloc(1, sizeof *t)))
        return PD_ERR_NOMEM;
    t->size = size;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    t->ranks = calloc((size_t)size, sizeof *t->ranks);
    t->th = calloc((size_t)size, sizeof *t->th);
    if (!t->ranks || !t->th) {
        st = PD_ERR_NOMEM;
        goto err;
    }
    for (int r = 0; r < size; r++)
        t->ranks[r].rank = r;
    for (int r = 1; r < size; r++) {
        engine_tp__start_t *s = malloc(sizeof *s);
        if (!s || (*s = (engine_tp__start_t){t, r},
                   pthread_create(&t->th[r], NULL, engine_tp__main, s)) != 0) {
            free(s);
            pd_log_error("tp: cannot start the thread of rank %d", r);
            st = PD_ERR_NOMEM;
            goto err;
        }
        t->started = r;
    }
    /* CPU ranks share the cores: each rank's pool gets its part (0: all cores, split) */
    if (strcmp(backend, "cpu") == 0) {
        int cores = threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores / size > 0 ? cores / size : 1;
    }
    engine_tp__be_args_t a = {backend, options ? options : "", device, threads};
    if ((st = engine_tp_run(t, engine_tp__backend, &a, ENGINE_TP_PARALLEL)) != PD_OK)
        goto err;
    tp_comm_t **comms = calloc((size_t)size, sizeof *comms);
    if (!comms) {
        st = PD_ERR_NOMEM;
        goto err;
    }
    if (strcmp(backend, "cpu") == 0) {
        st = tp_comm_fake_create(size, comms);
    } else {
        int *devs = calloc((size_t)size, sizeof *devs);
        pd_backend_t **bes = calloc((size_t)size, sizeof *bes);
        st = PD_ERR_NOMEM;
        if (devs && bes) {
            for (int r = 0; r < size; r++) {
                devs[r] = device + r;
                bes[r] = t->ranks[r].be;
            }
            st = tp_comm_nccl_create_backends(size, devs, bes, comms);
        }
        free(devs);
        free(bes);
        if (st == PD_ERR_UNSUPPORTED)
            pd_log_error("tp %d on %s: this build has no NCCL", size, backend);
    }
    if (st == PD_OK && wrap)
        wrap(wrap_arg, comms, size);
    if (st == PD_OK)
        for (int r = 0; r < size; r++)
            t->ranks[r].comm = comms[r];
    free(comms);
    if (st != PD_OK)
        goto err;
    *t_p = t;
    return PD_OK;
err:
    engine_tp_destroy(t);
    return st;
}

static pd_status_t engine_tp__teardown(engine_rank_t *r, void *arg)
{
    (void)arg;
    model_ctx_destroy(r->ctx);
    r->ctx = NULL;
    if (r->arena)
        r->be->ops->free(r->be, r->arena);
    r->arena = NULL;
    model_destroy(r->m);
    r->m = NULL;
    free(r->logits);
    r->logits = NULL;
    return PD_OK;
}

static pd_status_t engine_tp__backend_destroy(engine_rank_t *r, void *arg)
{
    (void)arg;
    if (r->be)
        backend_destroy(r->be);
    r->be = NULL;
    return PD_OK;
}

void engine_tp_destroy(engine_tp_t *t)
{
    if (!t)
        return;
    /* backends exist only once every rank thread runs (engine_tp_create) */
    const int all = t->ranks && t->th && t->started == t->size - 1;
    if (all)
        (void)engine_tp_run(t, engine_tp__teardown, NULL, ENGINE_TP_PARALLEL);
    for (int r = 0; t->ranks && r < t->size; r++) /* models and contexts are gone: no collective */
        tp_comm_destroy(t->ranks[r].comm);
    if (all)
        (void)engine_tp_run(t, engine_tp__backend_destroy, NULL, ENGINE_TP_PARALLEL);
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (int r = 1; r <= t->started; r++)
        pthread_join(t->th[r], NULL);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    free(t->ranks);
    free(t->th);
    free(t);
}
