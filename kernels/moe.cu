/* moe: top-k router, gather and combine (see moe.h). */
#include "kutil.cuh"
#include "moe.h"

/* ==== kernels ==== */

/* grid (ceil(n / 4)), block 128 (warp per token), shared 4 * n_experts f32:
 * ids, weights (n, k); logits (n, n_experts) f32 */
static __global__ void moe__route(int32_t *ids, float *weights, const float *logits, int n,
                                  int n_experts, int k, bool norm)
{
    extern __shared__ float moe__p[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.x * 4 + warp;
    if (t >= n)
        return;
    float *p = moe__p + (size_t)warp * n_experts;
    const float *lg = logits + (size_t)t * n_experts;
    float mx = -INFINITY, sum = 0.0f, tsum = 0.0f;
    for (int e = lane; e < n_experts; e += 32)
        mx = fmaxf(mx, lg[e]);
    mx = kutil_warp_max(mx);
    for (int e = lane; e < n_experts; e += 32) {
        p[e] = expf(lg[e] - mx);
        sum += p[e];
    }
    sum = kutil_warp_sum(sum);
    for (int e = lane; e < n_experts; e += 32)
        p[e] /= sum;
    __syncwarp();
    for (int j = 0; j < k; j++) {
        float bv = -1.0f;
        int bi = n_experts;
        for (int e = lane; e < n_experts; e += 32)
            if (p[e] > bv) { /* strictly greater: the lower id wins ties within a lane */
                bv = p[e];
                bi = e;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            ids[(size_t)t * k + j] = bi;
            weights[(size_t)t * k + j] = bv;
            p[bi] = -2.0f; /* taken */
        }
        tsum += bv;
        __syncwarp();
    }
    if (norm && lane < k)
        weights[(size_t)t * k + lane] /= tsum;
    if (norm)
        for (int j = 32 + lane; j < k; j += 32)
            weights[(size_t)t * k + j] /= tsum;
}

/* grid (m), block 128: xg (m, d), x (n, d) f32, perm (m) int32 */
static __global__ void moe__gather(float *xg, const float *x, const int32_t *perm, int k, int d)
{
    const float *src = x + (size_t)(perm[blockIdx.x] / k) * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        xg[(size_t)blockIdx.x * d + j] = src[j];
}

/* grid (n), block 128: out (n, d) f32; y (n * k, d) f32, inv (n * k) int32, weights (n, k) f32 */
static __global__ void moe__combine(float *out, const float *y, const int32_t *inv,
                                    const float *weights, int k, int d)
{
    const int t = blockIdx.x;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++)
            acc += weights[(size_t)t * k + j] * y[(size_t)inv[(size_t)t * k + j] * d + c];
        out[(size_t)t * d + c] = acc;
    }
}

/* ==== launchers ==== */

extern "C" pd_status_t moe_route(int32_t *ids, float *weights, const float *logits, int n,
                                 int n_experts, int k, bool norm, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && n_experts > 0 && n_experts <= 1024 && k > 0 && k <= n_experts,
                  "moe_route");
    if (n == 0)
        return PD_OK;
    moe__route<<<(n + 3) / 4, 128, 4 * (size_t)n_experts * sizeof(float), stream>>>(
        ids, weights, logits, n, n_experts, k, norm);
    return KUTIL_LAUNCHED("moe_route");
}

extern "C" pd_status_t moe_gather(float *xg, const float *x, const int32_t *perm, int m, int k,
                                  int d, cudaStream_t stream)
{
    KUTIL_REQUIRE(m >= 0 && k > 0 && d > 0, "moe_gather");
    if (m == 0)
        return PD_OK;
    moe__gather<<<m, 128, 0, stream>>>(xg, x, perm, k, d);
    return KUTIL_LAUNCHED("moe_gather");
}

extern "C" pd_status_t moe_combine(float *out, const float *y, const int32_t *inv,
                                   const float *weights, int n, int k, int d, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && k > 0 && d > 0, "moe_combine");
    if (n == 0)
        return PD_OK;
    moe__combine<<<n, 128, 0, stream>>>(out, y, inv, weights, k, d);
    return KUTIL_LAUNCHED("moe_combine");
}
