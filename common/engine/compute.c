#include "compute.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "clock.h"
#include "log.h"
#include "loop.h"

typedef struct compute_job {
    compute_fn fn;
    void *arg;
    struct compute_job *next;
} compute_job_t;

struct compute {
    engine_params_t params;
    char model_dir[4096];
    loop_post_t *post;
    void (*ready)(void *arg, pd_status_t st);
    compute_fn tick;
    int tick_ms;
    void *arg;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    compute_job_t *head, *tail;
    int stop;
    int loaded; /* 1 loaded, -1 failed */
    pd_status_t load_status;
    engine_t *engine;
};

typedef struct {
    compute_t *c;
    pd_status_t st;
} ready_msg_t;

static void compute__ready_on_loop(void *p)
{
    ready_msg_t *m = p;
    m->c->ready(m->c->arg, m->st);
    free(m);
}

static void *compute__main(void *p)
{
    compute_t *c = p;
    pd_status_t st = engine_create(&c->params, &c->engine);
    ready_msg_t *m = malloc(sizeof *m);
    int64_t next_tick = pd_clock_ms() + c->tick_ms;

    pthread_mutex_lock(&c->mu);
    c->loaded = st == PD_OK ? 1 : -1;
    c->load_status = st;
    pthread_mutex_unlock(&c->mu);
    PD_ASSERT(m);
    m->c = c;
    m->st = st;
    compute_post(c, compute__ready_on_loop, m);
    if (st != PD_OK)
        return NULL;
    for (;;) {
        compute_job_t *jobs;
        pthread_mutex_lock(&c->mu);
        while (!c->stop && !c->head && engine_active(c->engine) == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (long)(c->tick_ms > 0 ? c->tick_ms : 100) * 1000000L;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
            if (c->tick && pd_clock_ms() >= next_tick)
                break;
        }
        if (c->stop) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        jobs = c->head;
        c->head = c->tail = NULL;
        pthread_mutex_unlock(&c->mu);
        while (jobs) {
            compute_job_t *j = jobs;
            jobs = j->next;
            j->fn(c, c->engine, j->arg);
            free(j);
        }
        if (c->tick && pd_clock_ms() >= next_tick) {
            c->tick(c, c->engine, c->arg);
            next_tick = pd_clock_ms() + c->tick_ms;
        }
        if (engine_active(c->engine) > 0) {
            pd_status_t s = engine_step(c->engine);
            if (s != PD_OK)
                pd_log_error("compute: engine step failed: %s", pd_status_str(s));
        }
    }
    return NULL;
}

pd_status_t compute_create(uv_loop_t *loop, const engine_params_t *p,
                           void (*ready)(void *arg, pd_status_t st), compute_fn tick, int tick_ms,
                           void *arg, compute_t **c_p)
{
    compute_t *c = calloc(1, sizeof *c);
    pd_status_t st;

    if (!c)
        return PD_ERR_NOMEM;
    c->params = *p;
    snprintf(c->model_dir, sizeof c->model_dir, "%s", p->model_dir);
    c->params.model_dir = c->model_dir;
    c->params.progress = false;
    c->ready = ready;
    c->tick = tick;
    c->tick_ms = tick_ms > 0 ? tick_ms : 100;
    c->arg = arg;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if ((st = loop_post_create(loop, &c->post)) != PD_OK) {
        free(c);
        return st;
    }
    if (pthread_create(&c->thread, NULL, compute__main, c) != 0) {
        loop_post_destroy(c->post);
        free(c);
        return PD_ERR_INTERNAL;
    }
    *c_p = c;
    return PD_OK;
}

void compute_destroy(compute_t *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    while (c->head) {
        compute_job_t *j = c->head;
        c->head = j->next;
        free(j);
    }
    engine_destroy(c->engine);
    loop_post_destroy(c->post);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

pd_status_t compute_submit(compute_t *c, compute_fn fn, void *arg)
{
    compute_job_t *j;
    pthread_mutex_lock(&c->mu);
    if (c->loaded != 1 || c->stop) {
        pthread_mutex_unlock(&c->mu);
        return PD_ERR_UNAVAILABLE;
    }
    pthread_mutex_unlock(&c->mu);
    j = malloc(sizeof *j);
    if (!j)
        return PD_ERR_NOMEM;
    j->fn = fn;
    j->arg = arg;
    j->next = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->tail)
        c->tail->next = j;
    else
        c->head = j;
    c->tail = j;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return PD_OK;
}

void compute_post(compute_t *c, void (*fn)(void *arg), void *arg)
{
    PD_ASSERT(loop_post(c->post, fn, arg) == PD_OK);
}

engine_t *compute_engine(compute_t *c)
{
    return c->engine;
}
