/* logits: the sampler's logits processing on the GPU (penalties, logit bias, min_tokens masks),
 * with the semantics of sampler_logits_process_ref (common/backend/sampler.h): one thread per
 * entry, each (row, token) pair at most once, so no two threads touch the same logit and the
 * result is bit-identical to the CPU reference (same float operations in the same order).
 * Pointers are device memory; the launcher checks shapes (PD_ERR_INVALID), enqueues on `stream`,
 * allocates nothing.
 */
#ifndef PD_KERNELS_LOGITS_H
#define PD_KERNELS_LOGITS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* logits (n, vocab) f32 in place; ent (n_ent, 4) int32 (row, token, output count, flags),
 * bias (n_ent) f32, pen (n, 3) f32 (presence, frequency, repetition). n_ent 0 enqueues
 * nothing. */
pd_status_t logits_process_run(float *logits, int n, int vocab, const int32_t *ent,
                               const float *bias, int n_ent, const float *pen, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
