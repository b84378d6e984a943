/* kv_cuda_ipc with the CUDA runtime (see kv_cuda_ipc.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "kv_cuda_ipc.h"
#include "kv_cuda_ipc_impl.h"
#include "log.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == 64, "cudaIpcMemHandle_t is 64 bytes");

struct kv_cuda_ipc_map {
    void *base;
    size_t len;
    char what[96];
};

int kv_cuda_ipc_built(void)
{
    return 1;
}

pd_status_t kv_cuda_ipc_export(int device, void *dev_base, size_t len,
                               uint8_t blob_out[KV_CUDA_IPC_BLOB_BYTES])
{
    kv_cuda_ipc__blob_t b;
    cudaIpcMemHandle_t h;
    struct cudaDeviceProp prop;
    cudaError_t e;
    int dev;

    memset(&b, 0, sizeof b);
    if (kv_cuda_ipc__boot_id(b.boot_id) != PD_OK) {
        pd_log_error("cuda ipc: no boot id in /proc: handles cannot be matched to a host");
        return PD_ERR_IO;
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess ||
        (e = cudaIpcGetMemHandle(&h, dev_base)) != cudaSuccess) {
        pd_log_error("cuda ipc: export of %p+%zu: %s", dev_base, len, cudaGetErrorString(e));
        cudaGetLastError();
        return PD_ERR_CUDA;
    }
    b.magic = KV_CUDA_IPC__MAGIC;
    b.version = 1;
    b.pid = (uint32_t)getpid();
    b.device = dev;
    memcpy(b.uuid, &prop.uuid, sizeof b.uuid);
    b.len = len;
    memcpy(b.handle, &h, sizeof h);
    memcpy(blob_out, &b, sizeof b);
    return PD_OK;
}

pd_status_t kv_cuda_ipc_open(const void *blob, size_t len, kv_cuda_ipc_map_t **m_p)
{
    kv_cuda_ipc__blob_t b;
    cudaIpcMemHandle_t h;
    const char *why;
    int dev = -1, peer_dev = -1, n = 0;
    cudaError_t e;

    if (!kv_cuda_ipc__parse(blob, len, &b, &why)) {
        pd_log_error("cuda ipc: %s", why);
        return PD_ERR_FORMAT;
    }
    if (!kv_cuda_ipc_same_host(blob, len, &why))
        return PD_ERR_UNAVAILABLE;
    kv_cuda_ipc_map_t *m = calloc(1, sizeof *m);
    if (!m)
        return PD_ERR_NOMEM;
    memcpy(&h, b.handle, sizeof h);
    cudaGetDevice(&dev);
    /* the exporter's device ordinal is its process's; find ours by UUID for the log line */
    cudaGetDeviceCount(&n);
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, i) == cudaSuccess &&
            memcmp(&prop.uuid, b.uuid, sizeof b.uuid) == 0)
            peer_dev = i;
    }
    e = cudaIpcOpenMemHandle(&m->base, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        pd_log_error("cuda ipc: open of pid %u's pool (device %d here): %s", b.pid, peer_dev,
                     cudaGetErrorString(e));
        cudaGetLastError();
        free(m);
        return PD_ERR_CUDA;
    }
    m->len = (size_t)b.len;
    snprintf(m->what, sizeof m->what, "device %d -> device %d (%s)", dev, peer_dev,
             peer_dev == dev ? "same device"
             : peer_dev < 0  ? "device not visible here"
                             : "peer copy");
    *m_p = m;
    return PD_OK;
}

void *kv_cuda_ipc_base(const kv_cuda_ipc_map_t *m)
{
    return m->base;
}

size_t kv_cuda_ipc_len(const kv_cuda_ipc_map_t *m)
{
    return m->len;
}

const char *kv_cuda_ipc_describe(const kv_cuda_ipc_map_t *m)
{
    return m->what;
}

void kv_cuda_ipc_close(kv_cuda_ipc_map_t *m)
{
    if (!m)
        return;
    cudaError_t e = cudaIpcCloseMemHandle(m->base);
    if (e != cudaSuccess)
        pd_log_warn("cuda ipc: close: %s", cudaGetErrorString(e));
    free(m);
}
