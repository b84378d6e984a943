/* compute: the compute thread of a node. It owns an engine, runs jobs submitted from the loop
 * thread between engine steps, steps the engine while sequences are active, and runs a periodic
 * tick (lease expiry). Results go back to the loop thread with compute_post (loop_post inside).
 *
 * Threads: compute_create / compute_destroy on the loop thread; compute_submit from any thread;
 * job functions and tick run on the compute thread and are the only code that touches the engine.
 */
#ifndef PD_COMPUTE_H
#define PD_COMPUTE_H

#include <uv.h>

#include "engine.h"
#include "status.h"

typedef struct compute compute_t;

typedef void (*compute_fn)(compute_t *c, engine_t *e, void *arg);

/* Starts the thread, which loads the engine; ready(arg, status) then runs on the loop thread.
 * tick(c, e, arg) runs on the compute thread about every tick_ms (NULL: none). */
pd_status_t compute_create(uv_loop_t *loop, const engine_params_t *p, void (*ready)(void *arg,
                           pd_status_t st), compute_fn tick, int tick_ms, void *arg,
                           compute_t **c_p);

/* Stops the thread after the job in progress and destroys the engine. Queued jobs are dropped
 * (their arg is not freed: owners must not have any queued at that point). NULL is allowed. */
void compute_destroy(compute_t *c);

/* The engine, for its immutable properties (model config, arena address, pool size) once ready
 * has been called with PD_OK; everything else only from compute-thread jobs. */
engine_t *compute_engine(compute_t *c);

/* Queues fn(c, engine, arg) for the compute thread. PD_ERR_NOMEM, PD_ERR_UNAVAILABLE (engine not
 * loaded or failed to load). */
pd_status_t compute_submit(compute_t *c, compute_fn fn, void *arg);

/* From the compute thread: runs fn(arg) on the loop thread (FIFO). Aborts on out of memory
 * (results must not be lost silently). */
void compute_post(compute_t *c, void (*fn)(void *arg), void *arg);

#endif
