/* Built when pdserve is compiled without CUDA: no handles to export or open. */
#include "kv_cuda_ipc.h"
#include "kv_cuda_ipc_impl.h"

int kv_cuda_ipc_built(void)
{
    return 0;
}

pd_status_t kv_cuda_ipc_export(int device, void *dev_base, size_t len,
                               uint8_t blob_out[KV_CUDA_IPC_BLOB_BYTES])
{
    (void)device;
    (void)dev_base;
    (void)len;
    (void)blob_out;
    return PD_ERR_UNSUPPORTED;
}

pd_status_t kv_cuda_ipc_open(const void *blob, size_t len, kv_cuda_ipc_map_t **m_p)
{
    kv_cuda_ipc__blob_t b;
    (void)m_p;
    if (!kv_cuda_ipc__parse(blob, len, &b, NULL))
        return PD_ERR_FORMAT;
    return PD_ERR_UNSUPPORTED;
}

void *kv_cuda_ipc_base(const kv_cuda_ipc_map_t *m)
{
    (void)m;
    return NULL;
}

size_t kv_cuda_ipc_len(const kv_cuda_ipc_map_t *m)
{
    (void)m;
    return 0;
}

const char *kv_cuda_ipc_describe(const kv_cuda_ipc_map_t *m)
{
    (void)m;
    return "no cuda";
}

void kv_cuda_ipc_close(kv_cuda_ipc_map_t *m)
{
    (void)m;
}
