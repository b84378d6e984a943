/* kv_cuda_ipc_impl: the blob layout shared by kv_cuda_ipc.c and kv_cuda_ipc_cuda.c / _stub.c.
 * Private to common/transport. */
#ifndef PD_KV_CUDA_IPC_IMPL_H
#define PD_KV_CUDA_IPC_IMPL_H

#include <stdint.h>

#include "kv_cuda_ipc.h"

#define KV_CUDA_IPC__MAGIC 0x50494450u /* "PDIP" */
#define KV_CUDA_IPC__BOOT_ID 40

typedef struct {
    uint32_t magic, version;
    char boot_id[KV_CUDA_IPC__BOOT_ID]; /* /proc/sys/kernel/random/boot_id, NUL padded */
    uint32_t pid;
    int32_t device;
    uint8_t uuid[16];
    uint64_t len;
    uint8_t handle[64]; /* cudaIpcMemHandle_t */
    uint8_t zero[16];
} kv_cuda_ipc__blob_t;

_Static_assert(sizeof(kv_cuda_ipc__blob_t) == KV_CUDA_IPC_BLOB_BYTES, "blob layout");

/* This host's boot id. PD_ERR_IO when /proc does not have it. */
pd_status_t kv_cuda_ipc__boot_id(char out[KV_CUDA_IPC__BOOT_ID]);

/* Copies blob into *b and checks magic, version and size: 1 ok, 0 malformed (*why_p says). */
int kv_cuda_ipc__parse(const void *blob, size_t len, kv_cuda_ipc__blob_t *b, const char **why_p);

#endif
