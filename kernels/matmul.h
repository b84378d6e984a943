/* matmul: the pieces of out (n, N) f32 = x (n, K) f32 @ W^T for the three weight formats of
 * common/quant.h (plus f32), composed by the CUDA backend:
 *   - small n (decode): matmul_gemv reads W once at full bandwidth, f32 arithmetic; on the
 *     tensor cores (mma.sync), INT4: matmul_wgemv (n <= 8, activation quantization inside) and
 *     matmul_int4_mma (n <= 256), FP8: matmul_fp8_mma;
 *   - BF16 (and INT4 dequantized to BF16) at larger n: x is split into bf16 hi + lo parts and two
 *     cuBLAS bf16 GEMMs accumulate in f32 (close to f32 accuracy on the tensor cores);
 *   - FP8 W8A8: x quantized per token to fp8 (matmul_quant_act_fp8), then one cuBLASLt fp8 GEMM
 *     applying the per-token and per-row scales itself (matmul_gemm_fp8_scaled, outer-vector
 *     scale mode); where that mode is missing, a GEMM with unit scales into f32 and then
 *     out[t, r] *= xs[t] * ws[r] (matmul_fp8_scale).
 * Pointers are device memory. Launchers check shapes (PD_ERR_INVALID), enqueue on `stream`,
 * return the launch status (PD_ERR_CUDA) and allocate nothing: workspaces come from the caller.
 * A cuBLAS handle must already be bound to `stream` by the caller.
 */
#ifndef PD_KERNELS_MATMUL_H
#define PD_KERNELS_MATMUL_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest n matmul_gemv takes. */
#define MATMUL_GEMV_MAX_N 64

/* xq (n, k) fp8 e4m3, xs (n) f32 = per-row quantization of x (n, k) f32 (as quant_fp8_vec);
 * xf (n, k) f32 = the same fp8 values decoded (unscaled), for matmul_gemv. xq or xf may be NULL. */
pd_status_t matmul_quant_act_fp8(uint8_t *xq, float *xf, float *xs, const float *x, int n,
                                 int64_t k, cudaStream_t stream);

/* hi (n, k) bf16 = bf16(x), lo (n, k) bf16 = bf16(x - hi) (skipped when lo is NULL), x (n, k)
 * f32. */
pd_status_t matmul_split_bf16(uint16_t *hi, uint16_t *lo, const float *x, int n, int64_t k,
                              cudaStream_t stream);

/* out (n, w->n) f32 = x (n, w->k) f32 @ W^T for n <= MATMUL_GEMV_MAX_N, any weight format. For
 * FP8, x is the xf output of matmul_quant_act_fp8 and xs (n) f32 its scales (NULL otherwise).
 * Needs w->k a multiple of 8 (bf16, f32), 16 (fp8) or 128 (int4). int4_tiled: an INT4 w is in
 * the tiled layout (below). */
pd_status_t matmul_gemv(float *out, const float *x, const float *xs, const pd_weight_t *w, int n,
                        bool int4_tiled, cudaStream_t stream);

/* INT4 tensor-core GEMM (mma.sync, weights dequantized in registers; tiled weights (below) are
 * streamed through shared memory by cp.async, plain row-major ones (N % 32 != 0) go straight
 * into registers), for n = 1 .. MATMUL_INT4_MMA_MAX_N:
 *   1. matmul_quant_act_f16: xh (n, k) f16 = x scaled per token by a power of two, in the
 *      kernel's permuted column order; mult (n) f32 the epilogue multipliers;
 *   2. matmul_int4_mma_plan: the block size (warps) and K splits for the shape on n_sm SMs;
 *   3. matmul_int4_mma: out (n, w->n) f32 = x @ W^T; with splits > 1 it needs part, scratch of
 *      matmul_int4_mma_part_floats(n, w->n, splits) f32, and sums it into out (second launch).
 * Needs w->k % 128 == 0 (INT4) and a group scale <= ~270 (f16 range of (q - z) * s * 16). */
#define MATMUL_INT4_MMA_MAX_N 256

/* xh (n, k) f16 bits (permuted, see matmul.cu), mult (n) f32, x (n, k) f32; k % 128 == 0. */
pd_status_t matmul_quant_act_f16(uint16_t *xh, float *mult, const float *x, int n, int64_t k,
                                 cudaStream_t stream);
void matmul_int4_mma_plan(int n, int64_t N, int64_t K, int n_sm, int *warps_p, int *splits_p);
size_t matmul_int4_mma_part_floats(int n, int64_t N, int splits);
/* out (n, w->n) f32; part (splits, n, w->n) f32 scratch (NULL when splits == 1); xh, mult from
 * matmul_quant_act_f16; warps 1..8 per block, splits >= 1 (every split non-empty). */
pd_status_t matmul_int4_mma(float *out, float *part, const uint16_t *xh, const float *mult,
                            const pd_weight_t *w, int n, int warps, int splits, bool tiled,
                            cudaStream_t stream);

/* The same INT4 GEMM with two blocks of up to 8 warps per SM (session 6, issue 11): activation
 * stages of 2 groups and 2 weight groups in flight per warp (half the shared memory of
 * matmul_int4_mma), `tiles` n8 token tiles per block (1, 2, 4 or 8; a block of 8 warps takes 256
 * rows x 8 tiles tokens), tiled weights only (w->n % 32 == 0). Inputs, part and splits as for
 * matmul_int4_mma (part: matmul_int4_mma_part_floats(n, w->n, splits) f32).
 * matmul_int4_mma2_plan picks tiles, warps and splits for the shape on n_sm SMs. */
void matmul_int4_mma2_plan(int n, int64_t N, int64_t K, int n_sm, int *tiles_p, int *warps_p,
                           int *splits_p);
pd_status_t matmul_int4_mma2(float *out, float *part, const uint16_t *xh, const float *mult,
                             const pd_weight_t *w, int n, int tiles, int warps, int splits,
                             cudaStream_t stream);

/* FP8 W8A8 on mma.sync m16n8k32 e4m3 for n = 1 .. MATMUL_INT4_MMA_MAX_N: out (n, w->n) f32 =
 * (xq @ W^T) * xs[t] * ws[r], xq (n, k) fp8 and xs (n) f32 from matmul_quant_act_fp8 (the same
 * values the cuBLASLt path uses). Needs w->k % 64 == 0. Plan and part as for the INT4 GEMM
 * (matmul_fp8_mma_plan; part: matmul_int4_mma_part_floats(n, w->n, splits) f32).
 * matmul_fp8_cluster (session 22; 0 by default until measured; the CUDA backend sets it from
 * PD_CUDA_FP8_CLUSTER=1 at creation; read by the plan and the launch alike): on devices of
 * compute capability 9.0 and up, up to 8 splits run as one thread-block cluster that adds them
 * in distributed shared memory (part unused, may be NULL; one launch; the same bits as the
 * partial sums' second launch) and the plan weighs splits by that cost. */
extern int matmul_fp8_cluster;
/* 1 (default since session 25): matmul_gemv on FP8 weights reads 16 bytes of a row per lane and
 * load (matmul__gemv_fp8w); 0: 8 (matmul__gemv). The same products, summed in another order. The
 * CUDA backend sets it from PD_CUDA_GEMV_WIDE=0|1 at creation; read at each launch. Measured on
 * one H100 (call s25d, two alternating pairs): the FP8 batch-1 step 4.58 -> 4.56 and 4.59 -> 4.55
 * ms (gate_up's GEMV); not yet on an H200. */
extern int matmul_gemv_fp8_wide;

/* FP8 K-split mma GEMV (session 26; kernels/matmul.cu "FP8 K-split mma GEMV"): out (n, w->n) f32
 * = (xq (n, w->k) fp8 e4m3, per-token scales xs (n)) @ W^T, times W's per-row scales, for n 1 ..
 * MATMUL_FP8_KSPLIT_MAX_N, in one launch: a block of 8 warps per 16 rows, K split among its
 * warps, their sums added in a fixed order (deterministic). Needs w FP8 with w->k % 64 == 0 and
 * xq 16-byte aligned. batch: 64-column blocks each lane loads per round trip (4 or 8). */
#define MATMUL_FP8_KSPLIT_MAX_N 8
/* Where the CUDA backend routes FP8 matmuls of decode batches to matmul_fp8_ksplit: bit 0 n 1
 * with at most 8192 rows (instead of the FP8 mma kernel), bit 1 n 1 with more (instead of the f32
 * GEMV: gate_up), bit 2 n 2 .. 8 (instead of the FP8 mma kernel), bit 3 the attention block's
 * q, k, v as one matmul_fp8_ksplit_group launch where all three take it; 15 (the default since
 * session 26: on one H100 the FP8 batch-1 step 4.56 -> 3.60 ms, batch 8 6.01 -> 4.81; 0 restores
 * the routes before it). Set from PD_CUDA_FP8_KSPLIT=MASK at backend creation, read at each
 * matmul; batch from PD_CUDA_FP8_KSPLIT_U=4|8 (default 4: 80 registers, 3 blocks per SM; 8 takes
 * 128, 2, and measured slower: 3.85 ms). */
extern int matmul_fp8_ksplit_route;
extern int matmul_fp8_ksplit_batch;
pd_status_t matmul_fp8_ksplit(float *out, const uint8_t *xq, const float *xs,
                              const pd_weight_t *w, int n, int batch, cudaStream_t stream);
/* matmul_fp8_ksplit over count <= MATMUL_GROUP_MAX weights of the same K on the same
 * activations in one launch (their 16-row tiles side by side; each output as the weight's own
 * launch makes it, bit for bit): the attention block's q, k, v. */
pd_status_t matmul_fp8_ksplit_group(float *const *outs, const uint8_t *xq, const float *xs,
                                    const pd_weight_t *const *ws, int count, int n, int batch,
                                    cudaStream_t stream);

/* INT4 K-split mma GEMV (session 26, measured in session 27; kernels/matmul.cu "INT4 K-split
 * mma GEMV"): out (n, w->n) f32 = x @ W^T for tiled INT4 weights (w->n % 32 == 0, w->k % 128 ==
 * 0) and n 1 .. MATMUL_INT4_KSPLIT_MAX_N, from matmul_quant_act_f16's xh / mult (xh 16-byte
 * aligned): matmul_fp8_ksplit's arrangement (8 warps per 32-row block split K, weights loaded
 * before the PDL wait, one launch, the warps' sums added in a fixed order) with matmul_int4_mma's
 * products. batch: 128-column groups each lane loads per round trip (2 or 4). The group form
 * runs up to MATMUL_GROUP_MAX weights of one K side by side (each output bit for bit its own
 * launch's). */
#define MATMUL_INT4_KSPLIT_MAX_N 8
pd_status_t matmul_int4_ksplit(float *out, const uint16_t *xh, const float *mult,
                               const pd_weight_t *w, int n, int batch, cudaStream_t stream);
pd_status_t matmul_int4_ksplit_group(float *const *outs, const uint16_t *xh, const float *mult,
                                     const pd_weight_t *const *ws, int count, int n, int batch,
                                     cudaStream_t stream);
/* Where the CUDA backend routes tiled INT4 matmuls of decode batches to it: bit 0 n 1..2 (instead
 * of the slice GEMV), bit 3 n 3..4 (the slice GEMV), bit 2 n 5..8 (the cluster GEMV / the INT4
 * mma kernel), bit 1 the attention block's q, k, v as one launch where the bit of their n is on;
 * default 14 (session 28: n 3..8 with the q, k, v group; one H100, call s28a, whole step with the
 * scale after the products: batch 4 3.36 against 3.73 ms, batch 8 4.15 against 4.57; batch 2
 * 3.23 against 3.14 and batch 1 3.06 against 2.76 stay on the slice GEMV). From
 * PD_CUDA_INT4_KSPLIT=MASK at backend creation (0: nowhere), read at each matmul;
 * matmul_int4_ksplit_batch from PD_CUDA_INT4_KSPLIT_U=2|4 (default 2; 4 was slower). */
extern int matmul_int4_ksplit_route;
extern int matmul_int4_ksplit_batch;
/* 1 (default since session 28): matmul_int4_ksplit applies each group's scale after its products
 * in f32 (mma_int4_group's POST) instead of folding it into the f16 weights (fewer instructions
 * per weight; s28a: steps 2.6-4% faster at batches 2..8). From PD_CUDA_INT4_KSPLIT_POST=0|1 at
 * backend creation. */
extern int matmul_int4_ksplit_post;
/* matmul_int4_ksplit launches of at most this many 32-row blocks (at load batch 2) run 16 warps
 * per block instead of 8, so that shapes of few rows (the 8B shape's o and down: 128 blocks, one
 * per SM) keep twice the loads in flight (session 28, not yet measured); 0 (default): never. The
 * backend sets it to the device's SM count for PD_CUDA_INT4_KSPLIT_WIDE=1. */
extern int matmul_int4_ksplit_wide;
/* 1: matmul_int4_ksplit (load batch 2) loads each group's registers with the warp's next group
 * for that slot as soon as its products are issued (matmul.cu's ROLL; session 28, not yet
 * measured); 0 (default): all U groups at the start of each round trip. From
 * PD_CUDA_INT4_KSPLIT_ROLL=1 at backend creation. */
extern int matmul_int4_ksplit_roll;
void matmul_fp8_mma_plan(int n, int64_t N, int64_t K, int n_sm, int *warps_p, int *splits_p);
pd_status_t matmul_fp8_mma(float *out, float *part, const uint8_t *xq, const float *xs,
                           const pd_weight_t *w, int n, int warps, int splits, cudaStream_t stream);
/* matmul_fp8_mma over a group of count <= MATMUL_GROUP_MAX weights of the same K on the same
 * activations (the attention block's q, k, v) in one launch, their row blocks side by side: each
 * outs[i] (n, ws[i]->n) f32 the bits matmul_fp8_mma gives for ws[i] alone with the same warps and
 * splits. Needs splits == 1, or matmul_fp8_cluster with splits <= 8 on compute capability 9.0+
 * (the sums inside the kernel): else PD_ERR_UNSUPPORTED, nothing enqueued (run them one by one).
 * Session 22; the CUDA backend's matmul_group_fp8 takes it with PD_CUDA_FP8_GROUP=1 (off until
 * measured). */
pd_status_t matmul_fp8_mma_group(float *const *outs, const uint8_t *xq, const float *xs,
                                 const pd_weight_t *const *ws, int count, int n, int warps,
                                 int splits, cudaStream_t stream);

/* INT4 weight-streaming GEMV on the tensor cores for n = 1 .. MATMUL_WGEMV_MAX_N (tiled layout:
 * w->n % 32 == 0, w->k % 128 == 0), the activation quantization inside the kernel (no separate
 * launch): out (n, w->n) f32 = x (n, w->k) f32 @ W^T, with f16 activations scaled per token and
 * K split by a power of two, the mma on q - z (exact in f16) and the group scales applied in f32.
 * Each warp keeps `depth` (4, 8 or 16) 2 KiB weight groups in flight. K splits (1 ..
 * MATMUL_WGEMV_MAX_SPLITS) run as one thread-block cluster per row block and are summed in
 * shared memory (one launch, no scratch; deterministic). matmul_wgemv_plan picks warps (2..8),
 * K splits and depth for n_sm SMs. Clusters need compute capability 9.0: before it, splits > 1
 * return PD_ERR_UNSUPPORTED (nothing enqueued). */
#define MATMUL_WGEMV_MAX_N 8
#define MATMUL_WGEMV_MAX_SPLITS 8
void matmul_wgemv_plan(int n, int64_t N, int64_t K, int n_sm, int *warps_p, int *splits_p,
                       int *depth_p);
pd_status_t matmul_wgemv(float *out, const float *x, const pd_weight_t *w, int n, int warps,
                         int splits, int depth, cudaStream_t stream);

/* The most weights one grouped launch takes (matmul_w4gemv_group, matmul_w4wg_group: the
 * attention block's q, k, v on the same activations). */
#define MATMUL_GROUP_MAX 3

/* Weight-streaming GEMVs for n = 1 .. MATMUL_XGEMV_MAX_N without clusters or scratch (matmul.cu
 * says how): the rows in tiles of `rows` (16 or 32); `blocks` blocks (a persistent grid; < 1 or
 * more than the tiles: one block per tile) of `slices` (1 .. 16) warps take the tiles
 * round-robin, warp s the s-th slice of K in each; the slices are summed in shared memory in
 * order (deterministic). Each warp keeps `depth` steps of weights in flight in registers.
 *   - matmul_w4gemv: INT4 tiled (w->n % 32 == 0, w->k % 128 == 0); out (n, w->n) f32 = x (n,
 *     w->k) f32 @ W^T, the activation quantization inside (per token and slice f16 x * 2^-e),
 *     depth 2 or 4 (rows 16) / 2 (rows 32) groups of 128 columns (4 for both with
 *     matmul_set_w4bulk). Shared memory
 *     matmul_w4gemv_smem(n, K, rows, slices) bytes (0: no such plan), at most ~226 KiB.
 *   - matmul_w8gemv: FP8 (w->k % 64 == 0); out (n, w->n) f32 = (xq @ W^T) * xs[t] * ws[r], xq
 *     (n, k) fp8 and xs (n) f32 from matmul_quant_act_fp8; depth 4 or 8 (rows 16) / 2 (rows
 *     32) chunks of 64 columns.
 * The plans pick rows, slices, depth and blocks for n_sm SMs (rows 0: none fits). */
#define MATMUL_XGEMV_MAX_N 8
#define MATMUL_XGEMV_MAX_SLICES 16
/* Programmatic dependent launch of the decode-path kernels (kernels/kutil.cuh, option pdl of the
 * backend): on != 0 launches them with the programmatic-stream-serialization attribute (sm_90+
 * only: the caller passes 0 below compute capability 9.0). Process-wide; read at launch (and so at
 * graph capture). matmul_w4gemv_plan uses a measured table for some shape classes
 * (PD_CUDA_W4PLAN=model: the cost model alone). */
void matmul_set_pdl(int on);
/* matmul_w4gemv's weight stream (process-wide, read at plan and launch; sm_90+ only: the caller
 * passes 0 below compute capability 9.0): on != 0 copies each warp's steps with bulk copies
 * (cp.async.bulk, lane 0) into a ring of 4 steps in shared memory, so more bytes are in flight
 * than registers hold (depth is then the ring's 4, and matmul_w4gemv_smem counts the ring);
 * 0: 16-byte loads straight into registers (depth 2 / 4). Weights whose data, scales or zeros
 * are not 16-byte aligned take the register path. Returns the switch as it was. */
int matmul_set_w4bulk(int on);
size_t matmul_w4gemv_smem(int n, int64_t K, int rows, int slices);
void matmul_w4gemv_plan(int n, int64_t N, int64_t K, int n_sm, int *rows_p, int *slices_p,
                        int *depth_p, int *blocks_p);
pd_status_t matmul_w4gemv(float *out, const float *x, const pd_weight_t *w, int n, int rows,
                          int slices, int depth, int blocks, cudaStream_t stream);
/* matmul_w4gemv over a group of count <= MATMUL_GROUP_MAX INT4 tiled weights of the same K on the
 * same x: outs[i] (n, ws[i]->n) f32 = x @ ws[i]^T, one launch whose row tiles run over the
 * weights one after the other (plan it as one weight of the summed rows). */
pd_status_t matmul_w4gemv_group(float *const *outs, const float *x, const pd_weight_t *const *ws,
                                int count, int n, int rows, int slices, int depth, int blocks,
                                cudaStream_t stream);
/* matmul_w4gemv_group with the decode layer's ops around it folded in (backend.h matmul_fused):
 * the activations are made of x by p->kind, in the GEMV's prologue:
 *   MATMUL_PRO_NONE: x (n, K) as it is;
 *   MATMUL_PRO_RMSNORM: rmsnorm(x) * nw, x (n, K) (unchanged), nw (K) bf16 (8-byte aligned),
 *     p->eps; add_rmsnorm's expressions, the row's sum of squares added in the block's own
 *     order (one block barrier), so the values may differ from add_rmsnorm's in the last bit of
 *     1 / rms;
 *   MATMUL_PRO_SILU: silu(x[:, :K]) * x[:, K:], x (n, 2K); silu_mul's expression (the same
 *     bits);
 * and p->acc != 0: outs[i] += the product (the residual add's x + y, the same bits), else =;
 * p->epi MATMUL_EPI_SILU (one weight of N rows, N % (2 rows) == 0, acc 0): outs[0] (n, N / 2)
 * = silu(product[:, :N/2]) * product[:, N/2:] with silu_mul's expression (the same bits as the
 * product, then silu_mul), the gate and up tiles of the same rows run in pairs by one block. No
 * output may overlap x (PD_ERR_INVALID). p NULL: matmul_w4gemv_group. */
enum { MATMUL_PRO_NONE = 0, MATMUL_PRO_RMSNORM = 1, MATMUL_PRO_SILU = 2 };
enum { MATMUL_EPI_NONE = 0, MATMUL_EPI_SILU = 1 };
typedef struct {
    int kind, acc, epi;
    const uint16_t *nw;
    float eps;
} matmul_pro_t;
pd_status_t matmul_w4gemv_fused(float *const *outs, const float *x, const matmul_pro_t *p,
                                const pd_weight_t *const *ws, int count, int n, int rows,
                                int slices, int depth, int blocks, cudaStream_t stream);
void matmul_w8gemv_plan(int n, int64_t N, int64_t K, int n_sm, int *rows_p, int *slices_p,
                        int *depth_p, int *blocks_p);
pd_status_t matmul_w8gemv(float *out, const uint8_t *xq, const float *xs, const pd_weight_t *w,
                          int n, int rows, int slices, int depth, int blocks, cudaStream_t stream);

/* INT4 GEMM on Hopper's wgmma (kernels/matmul_w4wg.cu says how) for tiled INT4 weights (w->n %
 * 32 == 0, w->k % 128 == 0) and n = 1 .. MATMUL_W4WG_MAX_N, the numerics of matmul_int4_mma:
 *   1. matmul_quant_act_f16wg: xw = the f16 activation image (matmul_w4wg_act_bytes(n, K) bytes:
 *      n rounded up to 64 rows, swizzled for wgmma), mult (n) f32 the epilogue multipliers;
 *   2. matmul_w4wg_plan: the configuration cfg (0: 256 rows x 64 tokens per block, 1: 128 x
 *      128, 2: 128 x 256) and K splits for the shape on n_sm SMs, for either way of adding the
 *      splits (cluster below);
 *   3. matmul_w4wg: out (n, w->n) f32 = x @ W^T. With splits > 1 and cluster false it needs
 *      part, scratch of matmul_int4_mma_part_floats(n, w->n, splits) f32, and sums it into out
 *      (second launch); with cluster true (splits <= MATMUL_W4WG_MAX_CLUSTER, out 16-byte
 *      aligned, part unused) the splits of a tile run as one thread-block cluster and add their
 *      sums in distributed shared memory (one launch, no scratch; the same values).
 * matmul_w4wg_usable: built for sm_90a (cuda_arch lists 90a) and the current device is compute
 * capability 9.0; elsewhere matmul_w4wg returns PD_ERR_UNSUPPORTED (nothing enqueued). */
#define MATMUL_W4WG_MAX_N 256
#define MATMUL_W4WG_MAX_CLUSTER 8 /* the most K splits one cluster adds (the portable size) */
bool matmul_w4wg_usable(void);
size_t matmul_w4wg_act_bytes(int n, int64_t K);
pd_status_t matmul_quant_act_f16wg(uint16_t *xw, float *mult, const float *x, int n, int64_t K,
                                   cudaStream_t stream);
void matmul_w4wg_plan(int n, int64_t N, int64_t K, int n_sm, bool cluster, int *cfg_p,
                      int *splits_p);
pd_status_t matmul_w4wg(float *out, float *part, const uint16_t *xw, const float *mult,
                        const pd_weight_t *w, int n, int cfg, int splits, bool cluster,
                        cudaStream_t stream);
/* matmul_w4wg over a group of count <= MATMUL_GROUP_MAX weights of the same K on the same
 * activations (the attention block's q, k, v): outs[i] (n, ws[i]->n) f32 = x @ ws[i]^T in one
 * launch whose blocks take the weights' rows side by side (plan and part as for one weight of
 * the summed rows; with splits > 1 and cluster false a second launch sums the parts into the
 * outputs). */
pd_status_t matmul_w4wg_group(float *const *outs, float *part, const uint16_t *xw,
                              const float *mult, const pd_weight_t *const *ws, int count, int n,
                              int cfg, int splits, bool cluster, cudaStream_t stream);

/* FP8 W8A8 GEMM on Hopper's wgmma (kernels/matmul_w8wg.cu says how) for n = 1 ..
 * MATMUL_W8WG_MAX_N, both operands in shared memory through TMA: out (n, w->n) f32 = (xq @ W^T) *
 * xs[t] * ws[r], xq (n, k) fp8 and xs (n) f32 from matmul_quant_act_fp8 (the values every FP8
 * route uses), the e4m3 products summed on the tensor cores and promoted to f32 every 128
 * columns. Needs w->k % 128 == 0 and 16-byte aligned w->data and xq. K splits (1..8: a cluster
 * of that many blocks sums them in shared memory: no scratch, one launch); matmul_w8wg_plan picks
 * the rows per block (128 mt, mt 1 or 2) and 1..3 splits for n_sm SMs; PD_CUDA_W8WG_PLAN="mt,s"
 * forces one.
 * matmul_w8wg_usable: as matmul_w4wg_usable (sm_90a build, compute capability 9.0 device);
 * elsewhere matmul_w8wg returns PD_ERR_UNSUPPORTED (nothing enqueued). */
#define MATMUL_W8WG_MAX_N 256
bool matmul_w8wg_usable(void);
void matmul_w8wg_plan(int n, int64_t N, int64_t K, int n_sm, int *mt_p, int *splits_p);
pd_status_t matmul_w8wg(float *out, const uint8_t *xq, const float *xs, const pd_weight_t *w,
                        int n, int mt, int splits, cudaStream_t stream);

/* out (total) f32 = the sum of part (splits, total) f32 over the splits, in order. */
pd_status_t matmul_sum_parts(float *out, const float *part, int splits, size_t total,
                             cudaStream_t stream);

/* dst (w->n, w->k) bf16 = the INT4 g128 weight w dequantized ((q - z) * s, rounded to bf16);
 * tiled: w is in the tiled layout (below). */
pd_status_t matmul_int4_to_bf16(uint16_t *dst, const pd_weight_t *w, bool tiled,
                                cudaStream_t stream);

/* The tiled INT4 layout (matmul.cu says it byte by byte): for w->n % 32 == 0, rows in blocks of
 * 32 and K in groups of 128, each (block, group) 2048 contiguous bytes in the order the
 * tensor-core kernel's lanes load them; scales and zeros likewise per (block, group). The CUDA
 * backend tiles every INT4 weight with n % 32 == 0 at upload (weight_prepare). matmul_int4_tile
 * rewrites w in place, through tmp (device, quant_data_bytes + quant_scales_bytes +
 * quant_zeros_bytes of w). */
pd_status_t matmul_int4_tile(pd_weight_t *w, void *tmp, cudaStream_t stream);

/* out (n, N) f32 = (hi + lo) (n, K) bf16 @ W^T, W (N, K) bf16, via cublasGemmEx on `blas`
 * (a cublasHandle_t). lo may be NULL (one GEMM on hi only). */
pd_status_t matmul_gemm_bf16(void *blas, float *out, const uint16_t *hi, const uint16_t *lo,
                             const uint16_t *w, int n, int64_t N, int64_t K, cudaStream_t stream);

/* out (n, N) f32 = x (n, K) f32 @ W^T, W (N, K) f32 (cublasSgemm on `blas`). */
pd_status_t matmul_gemm_f32(void *blas, float *out, const float *x, const float *w, int n,
                            int64_t N, int64_t K, cudaStream_t stream);

/* out (n, N) f32 = xq (n, K) fp8 @ W^T, W (N, K) fp8, unit scales, through cuBLASLt (`lt`, a
 * cublasLtHandle_t) with workspace ws (ws_bytes, device). Needs K % 16 == 0 and N % 16 == 0. */
pd_status_t matmul_gemm_fp8(void *lt, void *ws, size_t ws_bytes, float *out, const uint8_t *xq,
                            const uint8_t *w, int n, int64_t N, int64_t K, cudaStream_t stream);

/* out (n, N) f32 = (xq (n, K) fp8 * xs (n) f32 per token) @ (W (N, K) fp8 * wscale (N) f32 per
 * row)^T in one cuBLASLt GEMM: both scale vectors applied by cuBLASLt's outer-vector scale mode
 * (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), no separate pass. PD_ERR_UNSUPPORTED (nothing
 * enqueued, nothing logged) where this cuBLASLt or GPU lacks that mode for these types: use
 * matmul_gemm_fp8 + matmul_fp8_scale then. Needs K % 16 == 0 and N % 16 == 0. */
pd_status_t matmul_gemm_fp8_scaled(void *lt, void *ws, size_t ws_bytes, float *out,
                                   const uint8_t *xq, const float *xs, const uint8_t *w,
                                   const float *wscale, int n, int64_t N, int64_t K,
                                   cudaStream_t stream);

/* Prefill FP8 GEMM options (matmul_gemm_fp8_rowwise). bf16: out is bf16 (n, N) instead of f32
 * (the cast happens in cuBLASLt's epilogue, after the scales); fast_accum: cuBLASLt's
 * CUBLASLT_MATMUL_DESC_FAST_ACCUM (fp8 products accumulated without the periodic promotion to
 * f32: faster, less exact); algo: the index among cuBLASLt's heuristic candidates (0 = its first
 * choice, < MATMUL_LT_MAX_ALGOS). */
#define MATMUL_LT_MAX_ALGOS 8
typedef struct {
    bool bf16, fast_accum;
    int algo;
} matmul_lt_opts_t;

/* As matmul_gemm_fp8_scaled (which is this with {f32, no fast accumulation, algo 0}): out (n, N)
 * f32 or bf16 (o->bf16) = (xq * xs per token) @ (W * wscale per row)^T, scales applied by
 * cuBLASLt's outer-vector scale mode. PD_ERR_UNSUPPORTED (nothing enqueued, nothing logged) where
 * the mode, the output type or the o->algo-th candidate is missing. K % 16 == 0, N % 16 == 0. */
pd_status_t matmul_gemm_fp8_rowwise(void *lt, void *ws, size_t ws_bytes, void *out,
                                    const uint8_t *xq, const float *xs, const uint8_t *w,
                                    const float *wscale, int n, int64_t N, int64_t K,
                                    const matmul_lt_opts_t *o, cudaStream_t stream);

/* INT4 GEMMs on the FP8 tensor cores (W4A8 in 1x128 blocks; the CUDA backend's INT4 prefill
 * path, int4_gemm=fp8): the weight becomes wq = q - z in e4m3 (exact) with the group scales as
 * f32 block scales, the activations e4m3 with one f32 scale per token and 128-column block, and
 * cuBLASLt multiplies with both operands in its VEC128 scale mode (Hopper, cuBLAS 12.9+), which
 * applies the scales to each block's partial sums in f32.
 * cuBLASLt's VEC128 scales are outer-dimension-major: a (K / 128, rows) array, the rows
 * contiguous. Where it has GEMMs for multiples of 16 tokens only (measured: most shapes), n
 * tokens run as two GEMMs, so the activations have the "blk layout" of n tokens:
 *   - n % 16 == 0: one group of n rows;
 *   - else a main group of m = n - n % 16 rows (none when n < 16) and a tail group of 16 rows,
 *     the last 16 - n % 16 of them zeros (scale 1);
 *   xq: MATMUL_ACT_BLK_ROWS(n) rows of K e4m3 (the groups one after the other, i.e. row t at
 *   t * K); xs: the main group's (K / 128, m) scales, then the tail's (K / 128, 16): the scale
 *   of row t, block kb at matmul_act_blk_at(t, kb, n, K / 128).
 *   matmul_int4_to_fp8_blk: wq (w->n, w->k) e4m3, ws (w->k / 128, w->n) f32 from the INT4 g128
 *     weight w (tiled: the tiled layout);
 *   matmul_quant_act_fp8_blk: x (n, K) f32 into the blk layout, each 128-column block of each
 *     token as quant_fp8_vec quantizes a vector: xq = e4m3(x * (1 / s)), s = amax / 448 (1 for
 *     an all-zero block); K % 128 == 0;
 *   matmul_gemm_fp8_blk: out (n, N) f32, or bf16 when bf16, = (xq * xs) @ (wq * ws)^T with the
 *     activations in the blk layout; tail (16, N) of out's type is the tail group's output
 *     (scratch; its first n % 16 rows are then copied to out), unused when n % 16 == 0; algo as
 *     matmul_lt_opts_t's; PD_ERR_UNSUPPORTED (nothing enqueued, nothing logged) where cuBLASLt
 *     lacks the mode;
 *   matmul_gemm_fp8_blk_ok: whether cuBLASLt has the GEMMs matmul_gemm_fp8_blk needs for
 *     (n, N, K, bf16) (asks its heuristic only; nothing enqueued). */
#define MATMUL_ACT_BLK_ROWS(n) ((n) % 16 ? (n) / 16 * 16 + 16 : (n))
#ifdef __CUDACC__
__host__ __device__
#endif
    static inline size_t
    matmul_act_blk_at(int t, int kb, int n, int nkb)
{
    const int m = n / 16 * 16; /* n % 16 == 0: m = n, every row in the main group */
    return t < m ? (size_t)kb * (size_t)m + (size_t)t
                 : (size_t)nkb * (size_t)m + (size_t)kb * 16 + (size_t)(t - m);
}
pd_status_t matmul_int4_to_fp8_blk(uint8_t *wq, float *ws, const pd_weight_t *w, bool tiled,
                                   cudaStream_t stream);
pd_status_t matmul_quant_act_fp8_blk(uint8_t *xq, float *xs, const float *x, int n, int64_t K,
                                     cudaStream_t stream);
pd_status_t matmul_gemm_fp8_blk(void *lt, void *ws, size_t ws_bytes, void *out, void *tail,
                                const uint8_t *xq, const float *xs, const uint8_t *wq,
                                const float *wsc, int n, int64_t N, int64_t K, int algo, bool bf16,
                                cudaStream_t stream);
bool matmul_gemm_fp8_blk_ok(void *lt, size_t ws_bytes, int n, int64_t N, int64_t K, bool bf16);

/* out (n, N) f32: out[t, r] = out[t, r] * xs[t] * ws[r]; xs (n) f32, ws (N) f32. */
pd_status_t matmul_fp8_scale(float *out, const float *xs, const float *ws, int n, int64_t N,
                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
