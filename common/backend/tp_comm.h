/* tp_comm: the tensor-parallel communicator, an ops table over the collectives a TP model forward
 * needs (all-reduce sum, all-gather, barrier) among the `size` ranks of one node.
 *
 * Implementations:
 *   fake  (tp_comm.c): in-process, for tests and CI. tp_comm_fake_create() makes `size` rank
 *         objects sharing one group; each rank is driven by its own thread (one thread per
 *         simulated rank, each running its own model forward) and a collective returns once every
 *         rank has entered it. Buffers are host memory (the CPU backend's).
 *   nccl  (kernels/tp_nccl.c, CUDA builds with NCCL only): one ncclComm_t per GPU of this process,
 *         collectives enqueued on each rank's stream; buffers are device memory. NVLink multicast
 *         (NVLS) must stay off: tp_comm_nccl_create() sets NCCL_NVLS_ENABLE=0 unless it is set.
 *
 * Every rank must call the same collectives in the same order with the same n (as with NCCL).
 * A rank whose own work fails between two collectives would leave the others waiting in the next
 * one for ever: it calls tp_comm_abort(), and every rank in or entering a collective of the group
 * returns PD_ERR_TP_ABORTED until tp_comm_reset() (once no rank is inside one).
 * Results are identical on every rank: the fake sums in rank order 0..size-1, so a sum does not
 * depend on which rank arrives last. A rank object is used by one thread (its rank's compute
 * thread); the group behind it is shared and locks internally. Buffers: backend memory.
 */
#ifndef PD_TP_COMM_H
#define PD_TP_COMM_H

#include <stddef.h>

#include "backend.h"
#include "status.h"

typedef struct tp_comm tp_comm_t;

typedef struct {
    const char *name;
    /* buf (n) f32 := sum over ranks of buf (n), the same on every rank */
    pd_status_t (*all_reduce_sum)(tp_comm_t *c, float *buf, size_t n);
    /* out (size, n) f32 := rank r's in (n) at out + r * n, on every rank (rank-major, as
     * ncclAllGather); out and in do not overlap */
    pd_status_t (*all_gather)(tp_comm_t *c, float *out, const float *in, size_t n);
    pd_status_t (*barrier)(tp_comm_t *c);
    /* optional (NULL: unsupported): see tp_comm_abort / tp_comm_reset */
    pd_status_t (*abort)(tp_comm_t *c);
    pd_status_t (*reset)(tp_comm_t *c);
    /* frees this rank's object (the group goes with the last rank destroyed) */
    void (*destroy)(tp_comm_t *c);
} tp_comm_ops_t;

struct tp_comm {
    const tp_comm_ops_t *ops;
    int rank, size;
    void *impl;
};

static inline int tp_comm_rank(const tp_comm_t *c)
{
    return c ? c->rank : 0;
}
static inline int tp_comm_size(const tp_comm_t *c)
{
    return c ? c->size : 1;
}

/* Sums buf (n) f32 over all ranks in place. The status of the implementation (PD_ERR_CUDA for
 * NCCL failures); on failure buf is undefined and the group unusable. */
pd_status_t tp_comm_all_reduce_sum(tp_comm_t *c, float *buf, size_t n);

/* Gathers every rank's in (n) f32 into out (size, n), rank-major. Failure as all_reduce_sum. */
pd_status_t tp_comm_all_gather(tp_comm_t *c, float *out, const float *in, size_t n);

/* Returns once every rank has entered the barrier. Failure as all_reduce_sum. */
pd_status_t tp_comm_barrier(tp_comm_t *c);

/* Aborts the group's collectives (any rank's thread, any time): every rank waiting in one, and
 * every later call, returns PD_ERR_TP_ABORTED. For a rank whose own op failed, so the others do
 * not wait for it. PD_ERR_UNSUPPORTED for an implementation without it (nccl: ncclCommAbort and a
 * new communicator are not wired in). */
pd_status_t tp_comm_abort(tp_comm_t *c);

/* Makes an aborted group usable again (PD_OK; also when it was not aborted). Only while no rank
 * is inside a collective (each rank's job has returned). PD_ERR_UNSUPPORTED as tp_comm_abort. */
pd_status_t tp_comm_reset(tp_comm_t *c);

/* Destroys one rank object; accepts NULL. */
void tp_comm_destroy(tp_comm_t *c);

/* Creates the in-process fake: ranks_p (size) receives one rank object per rank, all of one group;
 * destroy each with tp_comm_destroy. Each rank must run on its own thread (a collective blocks
 * until all ranks reach it). PD_ERR_INVALID for size < 1, PD_ERR_NOMEM (nothing allocated,
 * ranks_p untouched). */
pd_status_t tp_comm_fake_create(int size, tp_comm_t **ranks_p);

/* Creates one NCCL communicator per device of this process (ncclCommInitAll): ranks_p (size)
 * receives rank r on devices[r], its collectives enqueued on streams[r] (cudaStream_t, the
 * rank's backend stream). Sets NCCL_NVLS_ENABLE=0 unless the environment sets it.
 * PD_ERR_UNSUPPORTED when built without CUDA/NCCL; PD_ERR_CUDA when NCCL fails (logged, nothing
 * left allocated); PD_ERR_INVALID for size < 1. */
#ifdef HAVE_NCCL
pd_status_t tp_comm_nccl_create(int size, const int *devices, void *const *streams,
                                tp_comm_t **ranks_p);
#else
static inline pd_status_t tp_comm_nccl_create(int size, const int *devices, void *const *streams,
                                              tp_comm_t **ranks_p)
{
    (void)size;
    (void)devices;
    (void)streams;
    (void)ranks_p;
    return PD_ERR_UNSUPPORTED;
}
#endif

/* As tp_comm_nccl_create, with each rank's stream taken from its CUDA backend bes[r] (on
 * devices[r]); the calling thread's current device is left as it was. PD_ERR_INVALID when a
 * backend is not a CUDA one; PD_ERR_UNSUPPORTED without NCCL; else as tp_comm_nccl_create. */
#ifdef HAVE_NCCL
pd_status_t tp_comm_nccl_create_backends(int size, const int *devices, pd_backend_t *const *bes,
                                         tp_comm_t **ranks_p);
#else
static inline pd_status_t tp_comm_nccl_create_backends(int size, const int *devices,
                                                       pd_backend_t *const *bes,
                                                       tp_comm_t **ranks_p)
{
    (void)size;
    (void)devices;
    (void)bes;
    (void)ranks_p;
    return PD_ERR_UNSUPPORTED;
}
#endif

#endif
