/* family: launchers for the ops GLM-4.5 and DeepSeek-V3 / Kimi K2 add to the backend table
 * (backend.h: bias_add, rope_partial, moe_route_grouped, head_matmul, latent_write,
 * latent_attention; the CPU reference is common/backend/backend_cpu_family.c). Pointers are
 * device memory; activations f32. Each launcher checks its shapes (PD_ERR_INVALID), enqueues on
 * `stream` and returns the launch status (PD_ERR_CUDA); nothing is allocated. These are plain
 * first kernels (one block or warp per output, no tensor cores): correct against the CPU
 * reference (tests/gpu/kernels.c), not tuned.
 */
#ifndef PD_KERNELS_FAMILY_H
#define PD_KERNELS_FAMILY_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "kv_layout.h"
#include "quant.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x (n, d) f32 += bias (d) f32 every row */
pd_status_t family_bias_add(float *x, const float *bias, int n, int d, cudaStream_t stream);

/* in place RoPE on the first rot_dim dims of each head of x (n, n_heads, head_dim) f32 at pos
 * (n) int32, inv_freq (rot_dim / 2) f32, rotated values times scale; interleave: pairs
 * (2j, 2j + 1), else halves */
pd_status_t family_rope_partial(float *x, const int32_t *pos, const float *inv_freq, int n,
                                int n_heads, int head_dim, int rot_dim, bool interleave,
                                float scale, cudaStream_t stream);

/* noaux_tc router: ids (n, k) int32, weights (n, k) f32 from logits (n, n_experts) f32 and bias
 * (n_experts) f32; n_experts <= 1024, n_group <= 64 */
pd_status_t family_moe_route_grouped(int32_t *ids, float *weights, const float *logits,
                                     const float *bias, int n, int n_experts, int k, int n_group,
                                     int topk_group, bool norm, float scale, cudaStream_t stream);

/* out (n, n_heads, nout) f32 = x (n, n_heads, x_stride)[..., :kin] f32 @ W_h^T,
 * w (n_heads, nout, kin) bf16 */
pd_status_t family_head_matmul(float *out, const float *x, const uint16_t *w, int n, int n_heads,
                               int nout, int kin, int x_stride, cudaStream_t stream);

/* latent [c (n, r) | kpe (n, rope)] f32 into side 0 of a latent layout at slots (n) int32
 * (negative: skipped; the others distinct: one block per token, in any order) */
pd_status_t family_latent_write(void *arena, const kv_layout_t *l, int layer, const float *c,
                                const float *kpe, const int32_t *slots, int n, int r,
                                cudaStream_t stream);

/* absorbed MLA attention: out (n_rows, n_heads, r) f32 from q_lat (n_rows, n_heads, r), q_pe
 * (n_rows, n_heads, pe_stride) over the latent pages; q_start (n_seqs + 1), ctx_len (n_seqs),
 * block_tables (n_seqs, max_pages) int32 as pd_attn_batch_t; r <= 1024. With family_mla_tile
 * set (the default since session 17; PD_CUDA_MLA_TILE=0 clears it) and r <= 512, the tiled
 * kernel: 8 heads per block share each 32-token tile of latents staged in shared memory. */
extern int family_mla_tile;
pd_status_t family_latent_attention(float *out, const float *q_lat, const float *q_pe,
                                    const void *arena, const kv_layout_t *l, int layer,
                                    const int32_t *q_start, const int32_t *ctx_len,
                                    const int32_t *block_tables, int n_seqs, int max_pages,
                                    int n_rows, int n_heads, int r, int pe_stride, float scale,
                                    cudaStream_t stream);

/* FP8 weights with 128x128 block scales (PD_WFMT_FP8_BLOCK, common/quant.h), f32 activations as
 * the CPU reference takes them:
 *   - family_fp8_block_gemv: out (n, w->n) f32 = x (n, w->k) f32 @ W^T for n <= 8, one pass over
 *     W (decode); needs w->k % 16 == 0. f32 arithmetic, each 16-column run's dot product scaled
 *     once (the CPU scales every weight: results differ by f32 rounding only);
 *   - family_fp8_block_to_bf16: dst (w->n, w->k) bf16 = the dequantized weight (one bf16
 *     rounding of fp8 * scale), for the BF16 tensor-core GEMM at larger n (prefill); needs
 *     w->k % 4 == 0. */
/* q / attention output heads of a GQA group part (backend_cuda.c, groups above the attention
 * kernels' limit): gather: dst (n, kvh gs, D) [i, k gs + j] = src (n, kvh G, D) [i, k G + g0 + j];
 * scatter (gather false): dst (n, kvh G, D) [i, k G + g0 + j] = src (n, kvh gs, D) [i, k gs + j];
 * j < gs, f32 */
pd_status_t family_heads_copy(float *dst, const float *src, int n, int kvh, int G, int g0, int gs,
                              int D, bool gather, cudaStream_t stream);

#define FAMILY_FP8_BLOCK_GEMV_MAX_N 8
pd_status_t family_fp8_block_gemv(float *out, const float *x, const pd_weight_t *w, int n,
                                  cudaStream_t stream);
pd_status_t family_fp8_block_to_bf16(uint16_t *dst, const pd_weight_t *w, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
