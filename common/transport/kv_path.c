/* kv_path: the transfer path choice (see kv_path.h). */
#include "kv_path.h"

kv_path_t kv_path_select(const kv_path_offer_t *o, const char **why_p)
{
    const char *why = "";
    kv_path_t p;
    if (!o->src_gpu && !o->dst_gpu) {
        p = KV_PATH_UCX_HOST;
        why = "both pools in host memory";
    } else if (o->src_gpu && o->dst_gpu && o->ipc_offered && o->ipc_same_host &&
               o->ipc_opened != 0) {
        p = KV_PATH_CUDA_IPC;
    } else if (o->src_gpu && o->dst_gpu && o->src_ucx_cuda && o->dst_ucx_cuda) {
        p = KV_PATH_UCX_CUDA;
        why = !o->ipc_offered     ? "no cuda ipc handle offered"
              : !o->ipc_same_host ? "decode node on another host"
                                  : "cuda ipc handle did not open";
    } else {
        p = KV_PATH_UCX_STAGED;
        why = !(o->src_gpu && o->dst_gpu) ? "one pool in host memory"
              : !o->ipc_offered           ? "no cuda ipc handle offered and ucx has no cuda memory"
              : !o->ipc_same_host         ? "decode node on another host and ucx has no cuda memory"
                                  : "cuda ipc handle did not open and ucx has no cuda memory";
    }
    if (why_p)
        *why_p = why;
    return p;
}

const char *kv_path_name(kv_path_t p)
{
    static const char *const names[KV_PATH_COUNT] = {"cuda-ipc", "ucx-cuda", "ucx-staged",
                                                     "ucx-host"};
    return p >= 0 && p < KV_PATH_COUNT ? names[p] : "unknown";
}
