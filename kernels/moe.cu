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

/* grid 1, block 1024, shared ids (m) int32: offsets, active (E + 1), perm, inv (m); ids (m).
 * Thread e counts and places expert e's slots in slot order (a scan of the shared ids): the
 * order of the host grouping, and deterministic. */
static __global__ void __launch_bounds__(1024)
    moe__group(int32_t *offsets, int32_t *perm, int32_t *inv, int32_t *active, const int32_t *ids,
               int m, int n_experts)
{
    __shared__ int32_t sid[MOE_GROUP_MAX_M];
    __shared__ int32_t cnt[MOE_MAX_EXPERTS + 1];
    __shared__ int32_t off[MOE_MAX_EXPERTS + 1];
    const int tid = threadIdx.x;
    for (int i = tid; i < m; i += blockDim.x)
        sid[i] = ids[i];
    __syncthreads();
    for (int e = tid; e < n_experts; e += blockDim.x) {
        int c = 0;
        for (int i = 0; i < m; i++)
            c += sid[i] == e;
        cnt[e] = c;
    }
    __syncthreads();
    if (tid == 0) { /* n_experts <= 1024: a serial scan is a few microseconds at most */
        int o = 0, a = 0;
        for (int e = 0; e < n_experts; e++) {
            off[e] = o;
            offsets[e] = o;
            o += cnt[e];
            if (cnt[e] > 0)
                active[a++] = e;
        }
        off[n_experts] = o;
        offsets[n_experts] = o;
        active[n_experts] = a;
    }
    __syncthreads();
    for (int e = tid; e < n_experts; e += blockDim.x) {
        int p = off[e];
        for (int i = 0; i < m && p < off[e + 1]; i++)
            if (sid[i] == e) {
                perm[p] = i;
                inv[i] = p;
                p++;
            }
    }
}

/* The CUDA backend's tiled INT4 layout (kernels/matmul.cu, matmul__tiled_piece / _sz; the
 * harness case moe_gmm int4 checks the two agree): byte offset of the 16-byte piece q of row
 * `row`, group g; the scale / zero entry of (row, g). */
static __device__ __forceinline__ size_t moe__tiled_piece(int64_t row, int64_t g, int q, int64_t ng)
{
    return (((size_t)(row / 32) * ng + g) * 128 + (size_t)((row % 32) / 8) * 32 +
            (size_t)(row % 8) * 4 + q) *
           16;
}
static __device__ __forceinline__ size_t moe__tiled_sz(int64_t row, int64_t g, int64_t ng)
{
    return ((size_t)(row / 32) * ng + g) * 32 + (size_t)(row % 32);
}

/* Weights per lane per step of moe__gmm: one 16-byte load of the weight row */
template <int FMT> struct moe__cw {
    static constexpr int n = FMT == PD_WFMT_INT4 ? 32 : FMT == PD_WFMT_FP8 ? 16 : 8;
};

/* Weights k0 .. k0 + CW - 1 of row r of w (one 16-byte load) as f32: bf16 as is, fp8 unscaled,
 * int4 (q - z) * s. k0 % CW == 0 (an INT4 chunk lies inside one group of 128). */
template <int FMT>
static __device__ __forceinline__ void moe__wchunk(float *wv, const moe_wtab_t &w, int64_t r,
                                                   int64_t k0, int64_t K, bool tiled)
{
    if (FMT == PD_WFMT_BF16) {
        const uint4 raw = __ldg((const uint4 *)((const uint16_t *)w.data + r * K + k0));
        const uint32_t word[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            wv[2 * j] = __uint_as_float(word[j] << 16);
            wv[2 * j + 1] = __uint_as_float(word[j] & 0xffff0000u);
        }
    } else if (FMT == PD_WFMT_FP8) {
        const uint4 raw = __ldg((const uint4 *)((const uint8_t *)w.data + r * K + k0));
        const uint32_t word[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < 16; j++)
            wv[j] = kutil_fp8_to_f32((uint8_t)(word[j / 4] >> (8 * (j % 4))));
    } else { /* INT4 g128: 32 weights = 16 bytes, a quarter of the row's bytes of group g */
        const int64_t ng = K / 128, g = k0 / 128;
        const int q = (int)(k0 % 128) / 32;
        size_t sz, at;
        if (tiled) {
            sz = moe__tiled_sz(r, g, ng);
            at = moe__tiled_piece(r, g, q, ng);
        } else {
            sz = (size_t)(r * ng + g);
            at = (size_t)(r * (K / 2) + k0 / 2);
        }
        const uint4 raw = __ldg((const uint4 *)((const uint8_t *)w.data + at));
        const uint32_t word[4] = {raw.x, raw.y, raw.z, raw.w};
        const float s = kutil_bf16_to_f32(((const uint16_t *)w.scales)[sz]);
        const int z = ((const uint8_t *)w.zeros)[sz];
#pragma unroll
        for (int j = 0; j < 32; j++)
            wv[j] = (float)((int)((word[j / 8] >> (4 * (j % 8))) & 15u) - z) * s;
    }
}

#define MOE__GMM_WARPS 8 /* output rows per block, one warp each */
#define MOE__GMM_T 8     /* grouped rows per pass over the weights */

/* grid (ceil(N / MOE__GMM_WARPS), max_active), block 32 * MOE__GMM_WARPS: out (m, N) f32;
 * x (m, K) f32; xs (m) f32 or NULL; tab (E); offsets, active (E + 1) int32 (moe_group). Warp w
 * of block (bx, y) computes output column r = bx * MOE__GMM_WARPS + w of expert active[y]'s
 * rows, MOE__GMM_T rows per pass; each lane takes CW consecutive k (one 16-byte weight load) per
 * step of 32 * CW. */
template <int FMT>
static __global__ void __launch_bounds__(32 * MOE__GMM_WARPS)
    moe__gmm(float *out, const float *x, const float *xs, const moe_wtab_t *tab, bool tiled,
             const int32_t *offsets, const int32_t *active, int n_experts, int64_t N, int64_t K)
{
    constexpr int CW = moe__cw<FMT>::n;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if ((int)blockIdx.y >= active[n_experts])
        return;
    const int e = active[blockIdx.y];
    const int64_t r = (int64_t)blockIdx.x * MOE__GMM_WARPS + warp;
    if (r >= N)
        return;
    const int o0 = offsets[e], o1 = offsets[e + 1];
    const moe_wtab_t w = tab[e];
    const float ws = FMT == PD_WFMT_FP8 ? ((const float *)w.scales)[r] : 1.0f;
    for (int t0 = o0; t0 < o1; t0 += MOE__GMM_T) {
        const int nt = min(MOE__GMM_T, o1 - t0);
        float acc[MOE__GMM_T];
#pragma unroll
        for (int t = 0; t < MOE__GMM_T; t++)
            acc[t] = 0.0f;
#pragma unroll 2
        for (int64_t k0 = (int64_t)lane * CW; k0 < K; k0 += 32 * CW) {
            float wv[CW];
            moe__wchunk<FMT>(wv, w, r, k0, K, tiled);
#pragma unroll
            for (int t = 0; t < MOE__GMM_T; t++) {
                if (t < nt) {
                    const float4 *xp = (const float4 *)(x + (size_t)(t0 + t) * K + k0);
                    float a = 0.0f;
#pragma unroll
                    for (int j = 0; j < CW / 4; j++) {
                        const float4 v = xp[j];
                        a += v.x * wv[4 * j] + v.y * wv[4 * j + 1] + v.z * wv[4 * j + 2] +
                             v.w * wv[4 * j + 3];
                    }
                    acc[t] += a;
                }
            }
        }
#pragma unroll
        for (int t = 0; t < MOE__GMM_T; t++) {
            const float v = kutil_warp_sum(acc[t]);
            if (lane == 0 && t < nt)
                out[(size_t)(t0 + t) * N + r] = xs ? v * xs[t0 + t] * ws : v;
        }
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

extern "C" pd_status_t moe_group(int32_t *offsets, int32_t *perm, int32_t *inv, int32_t *active,
                                 const int32_t *ids, int m, int n_experts, cudaStream_t stream)
{
    KUTIL_REQUIRE(m >= 0 && m <= MOE_GROUP_MAX_M && n_experts > 0 && n_experts <= MOE_MAX_EXPERTS,
                  "moe_group");
    moe__group<<<1, 1024, 0, stream>>>(offsets, perm, inv, active, ids, m, n_experts);
    return KUTIL_LAUNCHED("moe_group");
}

extern "C" pd_status_t moe_gmm(float *out, const float *x, const float *xs, const moe_wtab_t *tab,
                               pd_wfmt_t fmt, bool int4_tiled, const int32_t *offsets,
                               const int32_t *active, int n_experts, int max_active, int64_t N,
                               int64_t K, cudaStream_t stream)
{
    KUTIL_REQUIRE(n_experts > 0 && n_experts <= MOE_MAX_EXPERTS && max_active >= 0 && N > 0 &&
                      K > 0 && K % 8 == 0 && (fmt != PD_WFMT_FP8 || K % 16 == 0) &&
                      (fmt != PD_WFMT_INT4 || K % 128 == 0) &&
                      (fmt != PD_WFMT_INT4 || !int4_tiled || N % 32 == 0) &&
                      (fmt == PD_WFMT_FP8) == (xs != NULL),
                  "moe_gmm");
    if (max_active == 0)
        return PD_OK;
    const dim3 grid((unsigned)((N + MOE__GMM_WARPS - 1) / MOE__GMM_WARPS), (unsigned)max_active);
    const int threads = 32 * MOE__GMM_WARPS;
    switch (fmt) {
    case PD_WFMT_BF16:
        moe__gmm<PD_WFMT_BF16><<<grid, threads, 0, stream>>>(out, x, xs, tab, int4_tiled, offsets,
                                                             active, n_experts, N, K);
        break;
    case PD_WFMT_FP8:
        moe__gmm<PD_WFMT_FP8><<<grid, threads, 0, stream>>>(out, x, xs, tab, int4_tiled, offsets,
                                                            active, n_experts, N, K);
        break;
    case PD_WFMT_INT4:
        moe__gmm<PD_WFMT_INT4><<<grid, threads, 0, stream>>>(out, x, xs, tab, int4_tiled, offsets,
                                                             active, n_experts, N, K);
        break;
    default:
        pd_log_error("moe_gmm: %s weights are not supported", pd_wfmt_name(fmt));
        return PD_ERR_INVALID;
    }
    return KUTIL_LAUNCHED("moe_gmm");
}
