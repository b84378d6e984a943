#include "threadpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"

struct threadpool {
    int n_threads;
    pthread_t *threads;
    struct threadpool_worker {
        struct threadpool *pool;
        int idx;
    } *workers;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    unsigned generation; /* bumped for every threadpool_for call */
    int pending;         /* workers still running the current generation */
    int stop;
    threadpool_fn fn;
    void *arg;
    size_t n;
};

static void threadpool__chunk(const threadpool_t *pool, int idx, size_t *b, size_t *e)
{
    size_t per = (pool->n + (size_t)pool->n_threads - 1) / (size_t)pool->n_threads;
    *b = per * (size_t)idx;
    *e = *b + per;
    if (*b > pool->n)
        *b = pool->n;
    if (*e > pool->n)
        *e = pool->n;
}

static void *threadpool__worker(void *p)
{
    struct threadpool_worker *w = p;
    threadpool_t *pool = w->pool;
    unsigned seen = 0;
    int idx = w->idx;

    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop && pool->generation == seen)
            pthread_cond_wait(&pool->work_cv, &pool->mu);
        if (pool->stop)
            break;
        seen = pool->generation;
        pthread_mutex_unlock(&pool->mu);
        size_t b, e;
        threadpool__chunk(pool, idx, &b, &e);
        if (b < e)
            pool->fn(pool->arg, b, e);
        pthread_mutex_lock(&pool->mu);
        if (--pool->pending == 0)
            pthread_cond_signal(&pool->done_cv);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

pd_status_t threadpool_create(int n_threads, threadpool_t **pool_p)
{
    threadpool_t *pool = calloc(1, sizeof *pool);
    int i;

    if (!pool)
        return PD_ERR_NOMEM;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    pool->n_threads = n_threads;
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
    if (!pool->threads || !pool->workers) {
        free(pool->threads);
        free(pool->workers);
        free(pool);
        return PD_ERR_NOMEM;
    }
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->work_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    for (i = 1; i < n_threads; i++) {
        pool->workers[i].pool = pool;
        pool->workers[i].idx = i;
        if (pthread_create(&pool->threads[i], NULL, threadpool__worker, &pool->workers[i]) != 0) {
            pd_log_error("threadpool: cannot start thread %d of %d", i, n_threads);
            pool->n_threads = i;
            threadpool_destroy(pool);
            return PD_ERR_INTERNAL;
        }
    }
    *pool_p = pool;
    return PD_OK;
}

void threadpool_destroy(threadpool_t *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->work_cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n_threads; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->work_cv);
    pthread_cond_destroy(&pool->done_cv);
    free(pool->threads);
    free(pool->workers);
    free(pool);
}

int threadpool_size(const threadpool_t *pool)
{
    return pool ? pool->n_threads : 1;
}

void threadpool_for(threadpool_t *pool, size_t n, threadpool_fn fn, void *arg)
{
    size_t b, e;

    if (n == 0)
        return;
    if (!pool || pool->n_threads == 1 || n == 1) {
        fn(arg, 0, n);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    pool->pending = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->work_cv);
    pthread_mutex_unlock(&pool->mu);

    threadpool__chunk(pool, 0, &b, &e);
    if (b < e)
        fn(arg, b, e);

    pthread_mutex_lock(&pool->mu);
    while (pool->pending > 0)
        pthread_cond_wait(&pool->done_cv, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}
