/* moe: mixture-of-experts pieces: the top-k softmax router, and the row gather / weighted
 * combine around per-expert matmuls (the CUDA backend groups the (token, slot) pairs by expert
 * on the host and runs each expert's rows as one batch). Pointers are device memory. Launchers
 * check shapes (PD_ERR_INVALID), enqueue on `stream`, return the launch status, allocate nothing.
 */
#ifndef PD_KERNELS_MOE_H
#define PD_KERNELS_MOE_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ids (n, k) int32, weights (n, k) f32 = top k of softmax(logits (n, n_experts) f32), ties to
 * the lower id, renormalized to sum 1 when norm. n_experts <= 1024, k <= n_experts. */
pd_status_t moe_route(int32_t *ids, float *weights, const float *logits, int n, int n_experts,
                      int k, bool norm, cudaStream_t stream);

/* xg (m, d) f32: row i = x[perm[i] / k] of x (n, d) f32; perm (m) int32 slot ids (token * k + j).
 */
pd_status_t moe_gather(float *xg, const float *x, const int32_t *perm, int m, int k, int d,
                       cudaStream_t stream);

/* out (n, d) f32 = sum_j weights[t, j] * y[inv[t * k + j]], y (n * k, d) f32 expert outputs in
 * grouped order, inv (n * k) int32, weights (n, k) f32. Sums in j order (deterministic). */
pd_status_t moe_combine(float *out, const float *y, const int32_t *inv, const float *weights, int n,
                        int k, int d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
