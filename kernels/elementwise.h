/* elementwise: launchers for the row-wise and element-wise ops of the backend table (embed,
 * rmsnorm, add, rope, silu_mul). Pointers are device memory; activations f32. Each launcher
 * checks its shapes (PD_ERR_INVALID), enqueues on `stream` and returns the launch status
 * (PD_ERR_CUDA); nothing is allocated. Any thread may call them with its own stream.
 */
#ifndef PD_KERNELS_ELEMENTWISE_H
#define PD_KERNELS_ELEMENTWISE_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (n, d) f32 = table (vocab, d) bf16 rows ids (n) int32. */
pd_status_t elementwise_embed(float *out, const uint16_t *table, const int32_t *ids, int n, int d,
                              cudaStream_t stream);

/* out (n, d) f32 = x (n, d) f32 / rms(x) * w (d) bf16; out may equal x. */
pd_status_t elementwise_rmsnorm(float *out, const float *x, const uint16_t *w, int n, int d,
                                float eps, cudaStream_t stream);

/* x (n) f32 += y (n) f32. */
pd_status_t elementwise_add(float *x, const float *y, size_t n, cudaStream_t stream);

/* In place rotate-half RoPE: x (n, n_heads, head_dim) f32 at pos (n) int32 with inv_freq
 * (head_dim / 2) f32. head_dim even. */
pd_status_t elementwise_rope(float *x, const int32_t *pos, const float *inv_freq, int n,
                             int n_heads, int head_dim, cudaStream_t stream);

/* out (n, f) f32 = silu(gu[:, :f]) * gu[:, f:], gu (n, 2f) f32. */
pd_status_t elementwise_silu_mul(float *out, const float *gu, int n, int f, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
