/* kv_cuda_ipc: a GPU page pool shared between processes of one host with CUDA IPC handles.
 *
 * The decode node exports its device pool once (kv_cuda_ipc_export: cudaIpcGetMemHandle of the
 * cudaMalloc'd region, plus the host's boot id, the pid and the device's UUID so a reader can
 * tell whether the handle can work here) and sends the blob in every reservation
 * (KvDestination.cuda_ipc). A prefill node opens it once per peer (kv_cuda_ipc_open:
 * cudaIpcOpenMemHandle with lazy peer access) and then writes pages with ordinary device copies
 * on its backend's stream: the mapped base is a device pointer in its address space (UVA), on the
 * same GPU or a peer GPU. Writes are complete when that stream is synchronized; the KV-done
 * message is sent after that.
 *
 * Built with CUDA (kv_cuda_ipc.c) or without (kv_cuda_ipc_stub.c: every call answers
 * PD_ERR_UNSUPPORTED). Export and open must run on the thread whose current device owns the
 * memory (a node's compute thread); the blob functions are pure.
 */
#ifndef PD_KV_CUDA_IPC_H
#define PD_KV_CUDA_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Bytes of an exported blob. */
#define KV_CUDA_IPC_BLOB_BYTES 160

typedef struct kv_cuda_ipc_map kv_cuda_ipc_map_t;

/* Whether this build has CUDA IPC (1) or not (0). */
int kv_cuda_ipc_built(void);

/* Writes the blob of dev_base[0, len) (the start of a cudaMalloc allocation on device, which
 * becomes the calling thread's current device) into blob_out (KV_CUDA_IPC_BLOB_BYTES). Returns
 * PD_ERR_UNSUPPORTED (no CUDA in this build), PD_ERR_CUDA (cudaIpcGetMemHandle refused: not
 * device memory, or not the start of an allocation) or PD_ERR_IO (no boot id); blob_out is
 * undefined on failure. */
pd_status_t kv_cuda_ipc_export(int device, void *dev_base, size_t len,
                               uint8_t blob_out[KV_CUDA_IPC_BLOB_BYTES]);

/* Whether blob (len bytes) is a well-formed export made on this host (same boot id): 1 yes,
 * 0 no (another host, or malformed: *why_p says which). Pure; needs no GPU. */
int kv_cuda_ipc_same_host(const void *blob, size_t len, const char **why_p);

/* Length of the region a blob describes (0 if malformed). */
size_t kv_cuda_ipc_blob_len(const void *blob, size_t len);

/* Maps blob's region into this process on the current device. Returns PD_ERR_FORMAT
 * (malformed), PD_ERR_UNAVAILABLE (another host), PD_ERR_UNSUPPORTED (no CUDA in this build),
 * PD_ERR_CUDA (cudaIpcOpenMemHandle failed: e.g. the exporting process is gone, or the GPUs
 * cannot reach each other), PD_ERR_NOMEM; nothing is mapped on failure. */
pd_status_t kv_cuda_ipc_open(const void *blob, size_t len, kv_cuda_ipc_map_t **m_p);

/* The mapped region: its base (a device pointer usable with cudaMemcpy* on this process) and
 * length. */
void *kv_cuda_ipc_base(const kv_cuda_ipc_map_t *m);
size_t kv_cuda_ipc_len(const kv_cuda_ipc_map_t *m);

/* "device 0 -> device 1 (peer copy)" / "device 0 -> device 0 (same device)" for the log line. */
const char *kv_cuda_ipc_describe(const kv_cuda_ipc_map_t *m);

/* Unmaps m (cudaIpcCloseMemHandle). Accepts NULL. */
void kv_cuda_ipc_close(kv_cuda_ipc_map_t *m);

#endif
