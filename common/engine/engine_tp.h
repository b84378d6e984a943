/* engine_tp: the ranks of a tensor-parallel engine (engine_params_t.tp > 1), internal to
 * common/engine.
 *
 * Rank r has its own backend (device + r for CUDA), its shards of the model (model_load with its
 * communicator: the in-process one on the CPU, NCCL on GPUs), a forward context and a KV arena in
 * the rank's layout (tp_kv_layout: n_kv_heads / tp heads). The engine keeps one page pool and one
 * tag tracker for all ranks: page ids and tags are the same in every rank's arena, each rank's
 * page holds that rank's heads and its own header stamp.
 *
 * Threads: rank 0 runs on the engine's owner thread (the compute thread), every other rank on a
 * thread of its own, started here, so a CUDA rank's work always runs on the thread that set its
 * device. engine_tp_run() hands one function to every rank and returns when all are done; the
 * owner thread is the only caller.
 */
#ifndef PD_ENGINE_TP_H
#define PD_ENGINE_TP_H

#include "backend.h"
#include "kv_layout.h"
#include "model.h"
#include "status.h"
#include "tp_comm.h"

typedef struct {
    int rank;
    pd_backend_t *be;
    kv_tag_io_t tag_io;
    model_t *m;
    model_ctx_t *ctx;
    void *arena; /* (n_pages, layout page_bytes): the rank's pages */
    tp_comm_t *comm;
    float *logits; /* (logits_cap) host scratch: ranks > 0 receive the gathered logits here */
    size_t logits_cap;
    pd_status_t st; /* the rank's result of the last engine_tp_run */
} engine_rank_t;

typedef struct engine_tp engine_tp_t;

/* What engine_tp_run hands each rank (on that rank's thread). Returns the rank's status. */
typedef pd_status_t (*engine_tp_fn)(engine_rank_t *r, void *arg);

/* Starts size - 1 rank threads (rank 0 is the caller's) and creates each rank's backend
 * (backend, device + rank, threads per rank, options) on its thread, then the communicator
 * (in-process for "cpu", NCCL for "cuda"), which wrap (a test's fault wrapper; NULL in production)
 * may replace. Nothing else (model, arena) is made here.
 * PD_ERR_INVALID (size < 2), PD_ERR_NOMEM, the backend's error or PD_ERR_UNSUPPORTED (CUDA without
 * NCCL); nothing is left running on failure. */
pd_status_t engine_tp_create(int size, const char *backend, int device, int threads,
                             const char *options,
                             void (*wrap)(void *arg, tp_comm_t **comms, int size), void *wrap_arg,
                             engine_tp_t **t_p);

/* engine_tp_run's modes */
#define ENGINE_TP_SEQUENTIAL 0  /* one rank after the other, in rank order (shares the tracker) */
#define ENGINE_TP_PARALLEL 1    /* all ranks at once, no collectives */
#define ENGINE_TP_COLLECTIVES 2 /* all ranks at once, with collectives (each needs every rank) */

/* Runs fn(rank, arg) for every rank, in parallel (ENGINE_TP_PARALLEL, ENGINE_TP_COLLECTIVES) or
 * one rank after the other (ENGINE_TP_SEQUENTIAL). Returns the first rank's error in rank order
 * (each rank's in ranks[r].st), PD_OK when all succeeded. In an ENGINE_TP_COLLECTIVES job a rank
 * that fails aborts the communicator (tp_comm_abort: the
 * ranks waiting for it in a collective return), the communicator is reset once every rank has
 * returned, and the job returns PD_ERR_TP_ABORTED: the caller fails what the job was for (the
 * batch's requests) and the ranks serve the next job. */
pd_status_t engine_tp_run(engine_tp_t *t, engine_tp_fn fn, void *arg, int parallel);

int engine_tp_size(const engine_tp_t *t);
engine_rank_t *engine_tp_rank(engine_tp_t *t, int r);

/* Destroys every rank's context, arena, model, backend (each on its thread), the communicator,
 * then the threads. Accepts NULL. */
void engine_tp_destroy(engine_tp_t *t);

#endif
