/* elementwise: launchers for the row-wise and element-wise ops of the backend table (embed,
 * rmsnorm, add, rope, silu_mul, and the fused add_rmsnorm / silu_mul_fp8 with the FP8 activation
 * quantization). Pointers are device memory; activations f32. Each launcher
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

/* Fused ops (backend.h add_rmsnorm, silu_mul_fp8): the results of the plain ops above, with the
 * fp8 quantization of matmul_quant_act_fp8 (kernels/matmul.h) on top.
 * y != NULL: x (n, d) f32 += y (n, d) f32. Then out (n, d) f32 = x / rms(x) * w (d) bf16 (out may
 * be NULL, never x) and, q != NULL: q (n, d) fp8 e4m3, qs (n) f32 = out quantized per row
 * (scale = max |out row| / 448); blk (d % 128 == 0): q / qs in 1x128 blocks instead, in
 * matmul.h's blk layout (MATMUL_ACT_BLK_ROWS(n) rows, as matmul_quant_act_fp8_blk makes of out:
 * the same bytes). */
pd_status_t elementwise_add_rmsnorm(float *x, const float *y, float *out, const uint16_t *w,
                                    uint8_t *q, float *qs, int n, int d, float eps, bool blk,
                                    cudaStream_t stream);

/* add_rmsnorm with, instead of fp8, the f16 activation image of the wgmma INT4 GEMM (matmul.h
 * matmul_w4wg: xw matmul_w4wg_act_bytes(n, d) bytes, mult (n) f32), the bytes
 * matmul_quant_act_f16wg makes of out; d % 128 == 0. Session 12: one launch less before each
 * INT4 GEMM of the decode batches (n 25..256). */
pd_status_t elementwise_add_rmsnorm_f16wg(float *x, const float *y, float *out, const uint16_t *w,
                                          uint16_t *xw, float *mult, int n, int d, float eps,
                                          cudaStream_t stream);

/* out (n, f) f32 = silu(gu[:, :f]) * gu[:, f:] (out may be NULL), gu (n, 2f) f32, and xw / mult
 * its wgmma activation image as elementwise_add_rmsnorm_f16wg; f % 128 == 0. */
pd_status_t elementwise_silu_mul_f16wg(float *out, const float *gu, uint16_t *xw, float *mult,
                                       int n, int f, cudaStream_t stream);

/* The same two with, instead of the image, the INT4 K-split GEMV's f16 activations (matmul.h
 * matmul_quant_act_f16's layout and bytes for out: xh n * d (or f) f16, mult (n) f32; act_quant's
 * PD_ACT_F16, session 28): one matmul_quant_act_f16 launch less before each K-split GEMV. */
pd_status_t elementwise_add_rmsnorm_f16(float *x, const float *y, float *out, const uint16_t *w,
                                        uint16_t *xh, float *mult, int n, int d, float eps,
                                        cudaStream_t stream);
pd_status_t elementwise_silu_mul_f16(float *out, const float *gu, uint16_t *xh, float *mult, int n,
                                     int f, cudaStream_t stream);

/* 1 (default): elementwise_silu_mul_f16wg (and _f16) keeps the row in shared memory where it
 * fits; 0: it computes the values again for the image (the path of longer rows; a switch for the
 * harness, the same bytes either way) */
extern int elementwise_silu_f16wg_smem;

/* silu_mul_fp8 in 1x128 blocks (the W4A8 INT4 GEMM's activations): out (n, f) f32 =
 * silu(gu[:, :f]) * gu[:, f:] (may be NULL; only with an f32 gu) and q / qs its quantization in
 * matmul.h's blk layout, the bytes matmul_quant_act_fp8_blk makes of out; gu (n, 2f) f32, or
 * gu16 (n, 2f) bf16 (exactly widened; one of the two NULL); f % 128 == 0. */
pd_status_t elementwise_silu_mul_fp8_blk(float *out, const float *gu, const uint16_t *gu16,
                                         uint8_t *q, float *qs, int n, int f, cudaStream_t stream);

/* out (n, f) f32 = silu(gu[:, :f]) * gu[:, f:] (out may be NULL), gu (n, 2f) f32; q (n, f) fp8
 * e4m3, qs (n) f32 = out quantized per row (both required). */
pd_status_t elementwise_silu_mul_fp8(float *out, const float *gu, uint8_t *q, float *qs, int n,
                                     int f, cudaStream_t stream);

/* q (n, f) fp8 e4m3, qs (n) f32 = silu(gu[:, :f]) * gu[:, f:] quantized per row as
 * elementwise_silu_mul_fp8 does, for a bf16 gu (n, 2f) (the prefill gate_up GEMM's bf16 output:
 * backend.h matmul_silu_fp8): the same kernel on the exactly widened values. */
pd_status_t elementwise_silu_mul_fp8_bf16(const uint16_t *gu, uint8_t *q, float *qs, int n, int f,
                                          cudaStream_t stream);

/* out (n) f32 = q (n) fp8 e4m3 decoded (unscaled): the GEMV's activation form. */
pd_status_t elementwise_fp8_to_f32(float *out, const uint8_t *q, size_t n, cudaStream_t stream);

/* 1: the fused kernels take their any-length path (rows re-read from memory) for every shape; a
 * process-wide switch for the harness (both paths must agree bit for bit). Default 0. */
extern int elementwise_force_generic;

/* Threads per row block of elementwise_silu_mul_fp8_bf16 at most: 512 (default) or 1024 (fewer
 * float4 registers per thread); a process-wide switch for benchmarks (same results either way). */
extern int elementwise_silu_bf16_threads;

/* 1: elementwise_silu_mul_fp8_bf16 takes session 5's kernel (8-byte loads, the f32 kernel's
 * template) instead of the 16-byte one (f % 8 == 0, f <= 32768); a process-wide switch for the
 * harness and benchmarks (same bytes either way). Default 0. */
extern int elementwise_silu_bf16_v1;

/* 1: the 16-byte kernel computes silu with __expf / __fdividef (a few f32 ulps from the exact
 * kernel; then not the same bytes as session 5's); a process-wide switch for the harness and
 * benchmarks. Default 0. */
extern int elementwise_silu_bf16_fast;

#ifdef __cplusplus
}
#endif

#endif
