/* threadpool: a fixed set of worker threads that run parallel-for loops for the CPU backend.
 *
 * threadpool_for(pool, n, fn, arg) splits [0, n) into contiguous chunks, one per thread, and
 * returns when every chunk is done. Each index is handled by exactly one thread and the work of
 * one index never depends on the chunking, so results do not depend on the number of threads.
 * One caller at a time per pool (the compute thread that owns it).
 */
#ifndef PD_THREADPOOL_H
#define PD_THREADPOOL_H

#include <stddef.h>

#include "status.h"

typedef struct threadpool threadpool_t;

/* fn(arg, begin, end): handle indices [begin, end). */
typedef void (*threadpool_fn)(void *arg, size_t begin, size_t end);

/* Starts n_threads - 1 workers (the caller is the n-th); n_threads 0 means one per online CPU.
 * Returns PD_ERR_NOMEM or PD_ERR_INTERNAL (thread creation failed; nothing is left running). */
pd_status_t threadpool_create(int n_threads, threadpool_t **pool_p);

/* Stops and joins the workers. NULL is allowed. */
void threadpool_destroy(threadpool_t *pool);

/* Number of threads including the caller. */
int threadpool_size(const threadpool_t *pool);

/* Runs fn over [0, n) on all threads and waits. pool may be NULL (runs inline). */
void threadpool_for(threadpool_t *pool, size_t n, threadpool_fn fn, void *arg);

#endif
