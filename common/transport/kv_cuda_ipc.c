/* kv_cuda_ipc: the blob (pure, built always). The CUDA calls are in kv_cuda_ipc_cuda.c, or
 * kv_cuda_ipc_stub.c without CUDA.
 *
 * Blob layout (little-endian, KV_CUDA_IPC_BLOB_BYTES):
 *   0 magic "PDIP" u32 | 4 version u32 | 8 boot id (36 chars, NUL padded to 40) |
 *   48 pid u32 | 52 device i32 | 56 device UUID (16) | 72 region length u64 |
 *   80 cudaIpcMemHandle_t (64) | 144 zero */
#include <stdio.h>
#include <string.h>

#include "kv_cuda_ipc.h"
#include "kv_cuda_ipc_impl.h"

pd_status_t kv_cuda_ipc__boot_id(char out[KV_CUDA_IPC__BOOT_ID])
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    memset(out, 0, KV_CUDA_IPC__BOOT_ID);
    if (!f)
        return PD_ERR_IO;
    size_t n = fread(out, 1, 36, f);
    fclose(f);
    return n == 36 ? PD_OK : PD_ERR_IO;
}

int kv_cuda_ipc__parse(const void *blob, size_t len, kv_cuda_ipc__blob_t *b, const char **why_p)
{
    const char *why = NULL;
    if (!blob || len != KV_CUDA_IPC_BLOB_BYTES)
        why = "not a cuda ipc handle (size)";
    else {
        memcpy(b, blob, sizeof *b);
        if (b->magic != KV_CUDA_IPC__MAGIC || b->version != 1)
            why = "not a cuda ipc handle (magic)";
        else if (b->len == 0 || b->boot_id[KV_CUDA_IPC__BOOT_ID - 1] != 0)
            why = "malformed cuda ipc handle";
    }
    if (why_p)
        *why_p = why;
    return why == NULL;
}

int kv_cuda_ipc_same_host(const void *blob, size_t len, const char **why_p)
{
    kv_cuda_ipc__blob_t b;
    char here[KV_CUDA_IPC__BOOT_ID];
    if (!kv_cuda_ipc__parse(blob, len, &b, why_p))
        return 0;
    if (kv_cuda_ipc__boot_id(here) != PD_OK || memcmp(here, b.boot_id, sizeof here) != 0) {
        if (why_p)
            *why_p = "decode node on another host";
        return 0;
    }
    if (why_p)
        *why_p = "";
    return 1;
}

size_t kv_cuda_ipc_blob_len(const void *blob, size_t len)
{
    kv_cuda_ipc__blob_t b;
    return kv_cuda_ipc__parse(blob, len, &b, NULL) ? (size_t)b.len : 0;
}
