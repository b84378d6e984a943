/* tp_nccl: the NCCL communicator behind tp_comm.h's ops table (CUDA builds with NCCL only).
 *
 * One process drives all TP ranks of a node, one thread per GPU (as the fake does in tests):
 * ncclCommInitAll makes one communicator per device; each rank's collectives are enqueued on its
 * backend's stream (backend_cuda_stream), so they order with its kernels without host syncs.
 * Buffers are device memory of the rank's GPU. NVLink multicast (NVLS) is turned off
 * (NCCL_NVLS_ENABLE=0) unless the environment already says otherwise.
 */
#include <stdlib.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "log.h"
#include "backend_cuda.h"
#include "tp_comm.h"

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    float *one; /* (1) f32 device scratch for the barrier */
} nccl_rank_t;

/* converts an NCCL result once, here */
static pd_status_t tp_nccl__status(ncclResult_t r, const char *what, int rank)
{
    if (r == ncclSuccess)
        return PD_OK;
    pd_log_error("tp nccl rank %d: %s: %s", rank, what, ncclGetErrorString(r));
    return PD_ERR_CUDA;
}

static pd_status_t nccl_all_reduce_sum(tp_comm_t *c, float *buf, size_t n)
{
    nccl_rank_t *k = c->impl;
    return tp_nccl__status(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, k->comm, k->stream),
                           "all_reduce", c->rank);
}

static pd_status_t nccl_all_gather(tp_comm_t *c, float *out, const float *in, size_t n)
{
    nccl_rank_t *k = c->impl;
    return tp_nccl__status(ncclAllGather(in, out, n, ncclFloat, k->comm, k->stream), "all_gather",
                           c->rank);
}

static pd_status_t nccl_barrier(tp_comm_t *c)
{
    nccl_rank_t *k = c->impl;
    pd_status_t st =
        tp_nccl__status(ncclAllReduce(k->one, k->one, 1, ncclFloat, ncclSum, k->comm, k->stream),
                        "barrier", c->rank);
    if (st == PD_OK && cudaStreamSynchronize(k->stream) != cudaSuccess) {
        pd_log_error("tp nccl rank %d: barrier: stream sync failed", c->rank);
        st = PD_ERR_CUDA;
    }
    return st;
}

static void nccl_destroy(tp_comm_t *c)
{
    nccl_rank_t *k = c->impl;
    cudaSetDevice(k->device);
    cudaFree(k->one);
    ncclCommDestroy(k->comm);
    free(k);
    free(c);
}

static const tp_comm_ops_t nccl_ops = {
    .name = "nccl",
    .all_reduce_sum = nccl_all_reduce_sum,
    .all_gather = nccl_all_gather,
    .barrier = nccl_barrier,
    .destroy = nccl_destroy,
};

pd_status_t tp_comm_nccl_create(int size, const int *devices, void *const *streams,
                                tp_comm_t **ranks_p)
{
    ncclComm_t *comms;
    tp_comm_t **out;
    pd_status_t st = PD_ERR_NOMEM;
    int r;

    if (size < 1 || !devices || !streams)
        return PD_ERR_INVALID;
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* 0: keep a value the operator set */
    comms = calloc((size_t)size, sizeof *comms);
    out = calloc((size_t)size, sizeof *out);
    if (!comms || !out)
        goto err_free_arrays;
    if ((st = tp_nccl__status(ncclCommInitAll(comms, size, devices), "init", -1)) != PD_OK)
        goto err_free_arrays;
    for (r = 0; r < size; r++) {
        nccl_rank_t *k = calloc(1, sizeof *k);
        out[r] = calloc(1, sizeof *out[r]);
        if (!k || !out[r]) {
            free(k);
            st = PD_ERR_NOMEM;
            goto err_free_ranks;
        }
        k->comm = comms[r];
        k->stream = (cudaStream_t)streams[r];
        k->device = devices[r];
        if (cudaSetDevice(devices[r]) != cudaSuccess ||
            cudaMalloc((void **)&k->one, sizeof(float)) != cudaSuccess) {
            pd_log_error("tp nccl rank %d: cannot allocate on device %d", r, devices[r]);
            free(k);
            st = PD_ERR_CUDA;
            goto err_free_ranks;
        }
        *out[r] = (tp_comm_t){&nccl_ops, r, size, k};
    }
    for (r = 0; r < size; r++)
        ranks_p[r] = out[r];
    free(out);
    free(comms);
    return PD_OK;
err_free_ranks:
    for (int i = 0; i < size; i++) {
        if (out[i] && out[i]->impl) {
            nccl_rank_t *k = out[i]->impl;
            cudaSetDevice(k->device);
            cudaFree(k->one);
            free(k);
        }
        free(out[i]);
        ncclCommDestroy(comms[i]);
    }
err_free_arrays:
    free(out);
    free(comms);
    return st;
}

pd_status_t tp_comm_nccl_create_backends(int size, const int *devices, pd_backend_t *const *bes,
                                         tp_comm_t **ranks_p)
{
    void **streams = calloc(size > 0 ? (size_t)size : 1, sizeof *streams);
    int cur = 0;
    pd_status_t st;
    if (!streams)
        return PD_ERR_NOMEM;
    for (int r = 0; r < size; r++)
        if (!(streams[r] = backend_cuda_stream(bes[r]))) {
            pd_log_error("tp nccl rank %d: not a cuda backend", r);
            free(streams);
            return PD_ERR_INVALID;
        }
    cudaGetDevice(&cur);
    st = tp_comm_nccl_create(size, devices, (void *const *)streams, ranks_p);
    cudaSetDevice(cur); /* the caller's thread keeps its device (its rank's backend) */
    free(streams);
    return st;
}
