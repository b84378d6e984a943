/* moe: mixture-of-experts pieces: the top-k softmax router, the grouping of the (token, slot)
 * pairs by expert on the device (moe_group: expert offsets, permutation, the list of experts in
 * use), the grouped expert matmul that reads those device-side offsets (moe_gmm: BF16, FP8 W8A8,
 * INT4 g128), and the row gather / weighted combine around them. Nothing here needs the host
 * between launches, so an MoE layer can be captured in a CUDA graph. Pointers are device memory.
 * Launchers check shapes (PD_ERR_INVALID), enqueue on `stream`, return the launch status,
 * allocate nothing.
 */
#ifndef PD_KERNELS_MOE_H
#define PD_KERNELS_MOE_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"
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

/* Most (token, slot) pairs moe_group takes (its ids live in shared memory). */
#define MOE_GROUP_MAX_M 4096
/* Most experts moe_group and moe_gmm take. */
#define MOE_MAX_EXPERTS 1024

/* Groups the m = n * k slots of ids (m) int32 (expert of slot i = token * k + j; every id in
 * [0, n_experts)) by expert, in slot order within an expert (the host grouping's order):
 * offsets (n_experts + 1) int32 = the first grouped row of each expert (offsets[E] = m);
 * perm (m) int32 grouped row -> slot; inv (m) int32 slot -> grouped row; active
 * (n_experts + 1) int32: active[0 .. a) the experts with rows, ascending, active[n_experts] = a.
 * One block; m <= MOE_GROUP_MAX_M, n_experts <= MOE_MAX_EXPERTS. */
pd_status_t moe_group(int32_t *offsets, int32_t *perm, int32_t *inv, int32_t *active,
                      const int32_t *ids, int m, int n_experts, cudaStream_t stream);

/* Per-expert weight pointers of a grouped matmul (a device array of n_experts). */
typedef struct {
    const void *data;   /* (N, K) bf16 | fp8 e4m3 | int4 pairs (N, K/2) */
    const void *scales; /* fp8: (N) f32; int4: (N, K/128) bf16; bf16: NULL */
    const void *zeros;  /* int4: (N, K/128) uint8; else NULL */
} moe_wtab_t;

/* out (m, N) f32: grouped row i of expert e (offsets[e] <= i < offsets[e + 1]) = x[i] @ W_e^T,
 * x (m, K) f32; for FP8 x holds the fp8 values decoded (matmul_quant_act_fp8's xf) and xs (m)
 * f32 their per-row scales: out = (xf @ Wq^T) * xs[i] * ws[r] (W8A8 as the CPU reference);
 * xs NULL otherwise. tab (n_experts) device; offsets / active from moe_group (the grid covers
 * max_active experts: min(n_experts, m) is always enough). int4_tiled: INT4 weights in the CUDA
 * backend's tiled layout (kernels/matmul.h; N % 32 == 0). K % 8 == 0 (FP8: K % 16, INT4:
 * K % 128). Each block reads its expert's weight rows once per 8 grouped rows (f32 arithmetic,
 * a warp per output row, 16-byte weight loads). */
pd_status_t moe_gmm(float *out, const float *x, const float *xs, const moe_wtab_t *tab,
                    pd_wfmt_t fmt, bool int4_tiled, const int32_t *offsets, const int32_t *active,
                    int n_experts, int max_active, int64_t N, int64_t K, cudaStream_t stream);

/* moe_gmm's contract, computed by a second kernel (PD_CUDA_MOE_GMM=2): each block stages up
 * to 8 of an expert's grouped rows of x in shared memory (8 * K f32) and reuses them over 64
 * weight rows, instead of re-reading x from L1 / L2 per weight chunk. K > 5120 (more than 160 KB
 * of shared memory) or more than the device's opt-in shared memory per block: moe_gmm itself. */
pd_status_t moe_gmm2(float *out, const float *x, const float *xs, const moe_wtab_t *tab,
                     pd_wfmt_t fmt, bool int4_tiled, const int32_t *offsets, const int32_t *active,
                     int n_experts, int max_active, int64_t N, int64_t K, cudaStream_t stream);

/* moe_gmm's contract on the tensor cores (PD_CUDA_MOE_GMM=3, moe__gmm3): FP8 with K % 64 == 0
 * on mma.sync e4m3 (exact products: xf holds fp8 values), INT4 on mma.sync f16 with the
 * weights dequantized in registers and the activations rounded to f16 after a power-of-two
 * scale per row (about 2^-11 relative per product, as matmul_int4_mma). m: the grouped rows in
 * all (n * k); above 16 rows per active expert on average a pass takes 32 rows instead of 8.
 * Anything else (BF16, another FP8 K, shared memory above the device's opt-in): moe_gmm2. */
pd_status_t moe_gmm3(float *out, const float *x, const float *xs, const moe_wtab_t *tab,
                     pd_wfmt_t fmt, bool int4_tiled, const int32_t *offsets, const int32_t *active,
                     int n_experts, int max_active, int m, int64_t N, int64_t K,
                     cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
