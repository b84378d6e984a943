/* kv_path: which way a prefill node's KV pages travel to one decode node, and why.
 *
 * Three ways, best first:
 *   cuda-ipc    same host, both pools on GPUs: the decode node exports its device pool with a
 *               CUDA IPC handle (kv_cuda_ipc), the prefill node maps it once per peer and copies
 *               pages GPU -> GPU (same device or a peer copy over NVLink/PCIe), no host memory;
 *   ucx-cuda    both UCX contexts report CUDA memory (a UCX built with CUDA): device pages are
 *               registered and put with memory type CUDA (cuda_ipc / GPUDirect RDMA inside UCX);
 *   ucx-staged  pages pass through host memory on the way (GPU -> host on the writer, a host
 *               landing zone -> GPU on the reader) over whatever UCX has (TCP, shared memory);
 *   ucx-host    both pools are in host memory (CPU backends): UCX writes them directly.
 * kv_path_select() is a pure function of what each side offers; it keeps the choice in one place
 * so both nodes, the logs and the metrics agree, and so the unit test covers every combination.
 * Any thread.
 */
#ifndef PD_KV_PATH_H
#define PD_KV_PATH_H

typedef enum {
    KV_PATH_CUDA_IPC = 0,
    KV_PATH_UCX_CUDA,
    KV_PATH_UCX_STAGED,
    KV_PATH_UCX_HOST,
    KV_PATH_COUNT
} kv_path_t;

typedef struct {
    int src_gpu;       /* the writer's pages are in GPU memory */
    int dst_gpu;       /* the reader's pool is in GPU memory */
    int ipc_offered;   /* the reader sent a CUDA IPC handle of its pool */
    int ipc_same_host; /* ... made on this host (same boot id) */
    int ipc_opened;    /* ... and cudaIpcOpenMemHandle succeeded here (-1: not tried yet) */
    int src_ucx_cuda;  /* the writer's UCX reports CUDA memory support */
    int dst_ucx_cuda;  /* the reader registered its device pool with UCX as CUDA memory */
} kv_path_offer_t;

/* The path to use for o, and in *why_p (if not NULL) a static phrase for the log line saying why
 * a better path was not taken ("" for cuda-ipc). With ipc_opened == -1 the answer is cuda-ipc
 * whenever the handle may be tried: call again with the result of the open. */
kv_path_t kv_path_select(const kv_path_offer_t *o, const char **why_p);

/* "cuda-ipc", "ucx-cuda", "ucx-staged", "ucx-host" (metrics label values and logs). */
const char *kv_path_name(kv_path_t p);

#endif
