/* moe: top-k router, gather and combine (see moe.h). */
#include "kutil.cuh"
#include "mma.cuh"
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


/* Exclusive prefix sums of v over the block (blockDim.x a multiple of 32, at most 1024) in thread
 * order; *total = the sum. red: 32 ints of shared memory. */
static __device__ __forceinline__ int moe__block_scan(int v, int *red, int *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        x += lane >= o ? y : 0;
    }
    __syncthreads(); /* red is free (a scan before may still be reading it) */
    if (lane == 31)
        red[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nw ? red[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            w += lane >= o ? y : 0;
        }
        red[lane] = w; /* inclusive over the warps */
    }
    __syncthreads();
    *total = red[nw - 1];
    return x - v + (warp > 0 ? red[warp - 1] : 0);
}

/* moe_group's kernel (moe.h): grid 1, block 1024, ids (m) int32; offsets, active (E + 1), perm,
 * inv (m) int32: the order of the host grouping. A slot's row is offsets[e] + the number of earlier slots of its expert e (slot order within an
 * expert, deterministic):
 *   1. warp 0 walks the slots 32 at a time: the lanes of one expert find each other
 *      (__match_any_sync), each takes its rank among them plus the expert's running count
 *      (shared memory), the lowest of them advances that count;
 *   2. the block scans the counts (offsets) and the has-rows flags (active) over the experts;
 *   3. every thread places its slots.
 * Session 8's kernel, a thread per expert scanning all m ids twice, took 41 us per layer at
 * Qwen3-30B batch 64 (m 512, 128 experts; docs/performance.md session 8, stepprof); this one
 * made that whole step 7.04 -> 6.49 ms (INT4) and 8.28 -> 7.69 ms (FP8; session 10). */
static __global__ void __launch_bounds__(1024)
    moe__group(int32_t *offsets, int32_t *perm, int32_t *inv, int32_t *active, const int32_t *ids,
               int m, int n_experts)
{
    __shared__ int32_t sid[MOE_GROUP_MAX_M];
    __shared__ int32_t pos[MOE_GROUP_MAX_M]; /* slot -> its rank within its expert */
    __shared__ int32_t run[MOE_MAX_EXPERTS]; /* the counts, then each expert's first row */
    __shared__ int red[32];
    const int tid = threadIdx.x, lane = tid & 31;
    for (int i = tid; i < m; i += blockDim.x)
        sid[i] = ids[i];
    for (int e = tid; e < n_experts; e += blockDim.x)
        run[e] = 0;
    __syncthreads();
    if (tid < 32)
        for (int c0 = 0; c0 < m; c0 += 32) {
            const int i = c0 + lane;
            const bool valid = i < m;
            const int e = valid ? sid[i] : -1 - lane; /* a pad lane matches only itself */
            const unsigned same = __match_any_sync(0xffffffffu, e);
            const int rank = __popc(same & ((1u << lane) - 1u));
            const int base = valid ? run[e] : 0;
            __syncwarp(); /* every lane has read the count before the lowest one advances it */
            if (valid) {
                pos[i] = base + rank;
                if (rank == 0)
                    run[e] = base + __popc(same);
            }
            __syncwarp();
        }
    __syncthreads();
    /* n_experts <= MOE_MAX_EXPERTS = blockDim.x: one expert per thread */
    const int e = tid, cnt = e < n_experts ? run[e] : 0;
    int total, n_active;
    const int first = moe__block_scan(cnt, red, &total);
    const int slot = moe__block_scan(cnt > 0 ? 1 : 0, red, &n_active);
    if (e < n_experts) {
        run[e] = first;
        offsets[e] = first;
        if (cnt > 0)
            active[slot] = e;
    }
    if (tid == 0) {
        offsets[n_experts] = total;
        active[n_experts] = n_active;
    }
    __syncthreads();
    for (int i = tid; i < m; i += blockDim.x) {
        const int p = run[sid[i]] + pos[i];
        perm[p] = i;
        inv[i] = p;
    }
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
            sz = mma_tiled_sz(r, g, ng);
            at = mma_tiled_piece(r, g, q, ng);
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

/* ---- moe__gmm2: the grouped rows of x staged in shared memory ----
 * moe__gmm re-reads x from L1 / L2 for every 16-byte weight chunk in every warp (about 16 bytes
 * of x per byte of FP8 weight). moe__gmm2 stages up to MOE__GMM2_T grouped rows of x (f32) into
 * shared memory once per block, then each warp streams MOE__GMM2_RW weight rows at a time with
 * 16-byte loads and reads x from shared memory; a block covers MOE__GMM2_ROWS output columns,
 * so the staged x serves 64 weight rows. Shared layout of one staged row: the float4 j of
 * weight chunk c (CW weights, c = k / CW) at j * (K / CW) + c, so that for a fixed j the 32
 * lanes (consecutive c) read consecutive float4s (no bank conflicts). */
#define MOE__GMM2_WARPS 8  /* warps per block */
#define MOE__GMM2_RW 4     /* weight rows a warp streams at once */
#define MOE__GMM2_PASSES 2 /* row groups per warp */
#define MOE__GMM2_ROWS (MOE__GMM2_WARPS * MOE__GMM2_RW * MOE__GMM2_PASSES) /* 64 per block */
#define MOE__GMM2_T 8                   /* grouped rows staged per pass */
#define MOE__GMM2_MAX_SMEM (160 * 1024) /* larger (or above the device opt-in): moe__gmm */

/* The 16-byte chunk of row r at k0 (moe__wchunk's addressing) and, for INT4, its group's scale
 * and zero. */
template <int FMT>
static __device__ __forceinline__ uint4 moe__wraw(float *s, int *z, const moe_wtab_t &w, int64_t r,
                                                  int64_t k0, int64_t K, bool tiled)
{
    if (FMT == PD_WFMT_BF16)
        return __ldg((const uint4 *)((const uint16_t *)w.data + r * K + k0));
    if (FMT == PD_WFMT_FP8)
        return __ldg((const uint4 *)((const uint8_t *)w.data + r * K + k0));
    const int64_t ng = K / 128, g = k0 / 128;
    const int q = (int)(k0 % 128) / 32;
    size_t sz, at;
    if (tiled) {
        sz = mma_tiled_sz(r, g, ng);
        at = mma_tiled_piece(r, g, q, ng);
    } else {
        sz = (size_t)(r * ng + g);
        at = (size_t)(r * (K / 2) + k0 / 2);
    }
    *s = kutil_bf16_to_f32(((const uint16_t *)w.scales)[sz]);
    *z = ((const uint8_t *)w.zeros)[sz];
    return __ldg((const uint4 *)((const uint8_t *)w.data + at));
}

/* Weights 4j .. 4j + 3 of a raw chunk as f32 (bf16 as is, fp8 unscaled, int4 (q - z) * s). */
template <int FMT>
static __device__ __forceinline__ void moe__w4(float *wv, const uint4 &raw, int j, float s, int z)
{
    const uint32_t word[4] = {raw.x, raw.y, raw.z, raw.w};
    if (FMT == PD_WFMT_BF16) { /* 8 per chunk: j in 0..1, two words each */
        const uint32_t a = word[2 * j], b = word[2 * j + 1];
        wv[0] = __uint_as_float(a << 16);
        wv[1] = __uint_as_float(a & 0xffff0000u);
        wv[2] = __uint_as_float(b << 16);
        wv[3] = __uint_as_float(b & 0xffff0000u);
    } else if (FMT == PD_WFMT_FP8) { /* 16 per chunk: word j */
#pragma unroll
        for (int i = 0; i < 4; i++)
            wv[i] = kutil_fp8_to_f32((uint8_t)(word[j] >> (8 * i)));
    } else { /* 32 per chunk: half of word j / 2 */
        const uint32_t v = word[j / 2] >> (16 * (j % 2));
#pragma unroll
        for (int i = 0; i < 4; i++)
            wv[i] = (float)((int)((v >> (4 * i)) & 15u) - z) * s;
    }
}

/* grid (ceil(N / MOE__GMM2_ROWS), max_active), block 32 * MOE__GMM2_WARPS, dynamic shared
 * MOE__GMM2_T * K f32: the same contract as moe__gmm (out (m, N) f32 = grouped rows of x @ W_e^T,
 * FP8: times xs[row] * ws[r]). Block (bx, y) computes columns bx * MOE__GMM2_ROWS .. + 63 of
 * expert active[y]'s grouped rows, MOE__GMM2_T rows at a time: stage them, then warp w takes
 * row groups (pass * WARPS + w) * RW .. + RW - 1; lane l takes chunks c = l, l + 32, ... */
template <int FMT>
static __global__ void __launch_bounds__(32 * MOE__GMM2_WARPS, 2)
    moe__gmm2(float *out, const float *x, const float *xs, const moe_wtab_t *tab, bool tiled,
              const int32_t *offsets, const int32_t *active, int n_experts, int64_t N, int64_t K)
{
    extern __shared__ float4 moe__sx[];
    constexpr int CW = moe__cw<FMT>::n, J = CW / 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if ((int)blockIdx.y >= active[n_experts])
        return; /* the whole block: no barrier is skipped by part of it */
    const int e = active[blockIdx.y];
    const int o0 = offsets[e], o1 = offsets[e + 1];
    const moe_wtab_t w = tab[e];
    const int K4 = (int)(K / 4), NC = (int)(K / CW); /* float4s per row, chunks per row */
    const int64_t rb = (int64_t)blockIdx.x * MOE__GMM2_ROWS;
    for (int t0 = o0; t0 < o1; t0 += MOE__GMM2_T) {
        const int nt = min(MOE__GMM2_T, o1 - t0);
        __syncthreads(); /* the previous rows are no longer read */
        const float4 *src = (const float4 *)(x + (size_t)t0 * K);
        for (int i = threadIdx.x; i < nt * K4; i += blockDim.x) {
            const int t = i / K4, q = i % K4; /* float4 q of row t: chunk q / J, part q % J */
            moe__sx[t * K4 + (q % J) * NC + q / J] = src[i];
        }
        __syncthreads();
#pragma unroll 1
        for (int pass = 0; pass < MOE__GMM2_PASSES; pass++) {
            const int64_t r0 = rb + (int64_t)(pass * MOE__GMM2_WARPS + warp) * MOE__GMM2_RW;
            if (r0 >= N)
                break;
            float acc[MOE__GMM2_RW][MOE__GMM2_T];
#pragma unroll
            for (int i = 0; i < MOE__GMM2_RW; i++)
#pragma unroll
                for (int t = 0; t < MOE__GMM2_T; t++)
                    acc[i][t] = 0.0f;
            for (int c = lane; c < NC; c += 32) {
                const int64_t k0 = (int64_t)c * CW;
                uint4 raw[MOE__GMM2_RW];
                float s[MOE__GMM2_RW];
                int z[MOE__GMM2_RW];
#pragma unroll
                for (int i = 0; i < MOE__GMM2_RW; i++) /* rows past N: row N - 1, not stored */
                    raw[i] = moe__wraw<FMT>(&s[i], &z[i], w, min(r0 + i, N - 1), k0, K, tiled);
#pragma unroll
                for (int j = 0; j < J; j++) {
                    float wv[MOE__GMM2_RW][4];
#pragma unroll
                    for (int i = 0; i < MOE__GMM2_RW; i++)
                        moe__w4<FMT>(wv[i], raw[i], j, s[i], z[i]);
#pragma unroll
                    for (int t = 0; t < MOE__GMM2_T; t++) {
                        if (t < nt) {
                            const float4 v = moe__sx[t * K4 + j * NC + c];
#pragma unroll
                            for (int i = 0; i < MOE__GMM2_RW; i++)
                                acc[i][t] += v.x * wv[i][0] + v.y * wv[i][1] + v.z * wv[i][2] +
                                             v.w * wv[i][3];
                        }
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < MOE__GMM2_RW; i++) {
                const int64_t r = r0 + i;
                const float ws = FMT == PD_WFMT_FP8 && r < N ? ((const float *)w.scales)[r] : 1.0f;
#pragma unroll
                for (int t = 0; t < MOE__GMM2_T; t++) {
                    if (t < nt) { /* nt is the same in the whole warp */
                        const float v = kutil_warp_sum(acc[i][t]);
                        if (lane == 0 && r < N)
                            out[(size_t)(t0 + t) * N + r] = xs ? v * xs[t0 + t] * ws : v;
                    }
                }
            }
        }
    }
}

/* ---- moe__gmm3: the staged rows on the tensor cores (mma.sync) ----
 * moe__gmm2 spends its time converting weights and issuing f32 FMAs (at decode batch 64 each
 * expert has ~4 rows: every weight converted serves 4 products). moe__gmm3 feeds the weights
 * straight from global memory into mma.sync registers, as the dense small-n kernels of matmul.cu
 * do (mma.cuh): a warp takes 32 weight rows (two m16 tiles) against 8 C staged rows (C n8
 * tiles) of its expert. FP8: m16n8k32 e4m3 on the raw weight bytes and the staged rows
 * converted back to e4m3 (exact: xf holds fp8 values); the epilogue applies xs[row] * ws[r].
 * INT4: m16n8k16 f16 with the weights (q - z) * s * 2^4 dequantized in registers (one rounding,
 * mma_int4_group) and the rows scaled per row by a power of two into (-1, 1) and rounded to f16
 * (as matmul_quant_act_f16, in the permuted order mma_int4_group reads); the epilogue multiplies
 * 2^(e - 4) back. Both accumulate in f32. BF16 weights stay on moe__gmm2. */
#define MOE__GMM3_WARPS 4                     /* warps per block, 32 weight rows each */
#define MOE__GMM3_ROWS (32 * MOE__GMM3_WARPS) /* output columns per block */
#define MOE__GMM3_U 4                         /* FP8: 64-column blocks loaded ahead per step */

/* Bytes per staged row: FP8 K e4m3, INT4 2 K f16, padded to 64 mod 128 (the 8 lanes of a
 * 16-byte shared-memory phase, two rows of 4 lanes each, hit distinct banks). */
static __host__ __device__ inline int64_t moe__gmm3_pitch(int fmt, int64_t K)
{
    const int64_t b = fmt == PD_WFMT_FP8 ? K : 2 * K;
    return (b + 127) / 128 * 128 + 64;
}

/* Stages grouped rows t0 .. t0 + nt - 1 of x into xsm (8 C rows of moe__gmm3_pitch bytes; rows
 * nt .. 8 C - 1 zero) and, for INT4, each row's epilogue multiplier into mult (8 C). Block-wide;
 * the caller syncs before and after. */
template <int FMT, int C>
static __device__ __forceinline__ void moe__gmm3_stage(uint8_t *xsm, float *mult, const float *x,
                                                       int t0, int nt, int64_t K, int64_t P)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (FMT == PD_WFMT_FP8) { /* 4 values -> one 32-bit word */
        const int W4 = (int)(K / 4);
        for (int i = threadIdx.x; i < 8 * C * W4; i += blockDim.x) {
            const int t = i / W4, q = i % W4;
            uint32_t v = 0;
            if (t < nt) {
                const float4 a = __ldg((const float4 *)(x + (size_t)(t0 + t) * K) + q);
                v = (uint32_t)kutil_f32_to_fp8(a.x) | ((uint32_t)kutil_f32_to_fp8(a.y) << 8) |
                    ((uint32_t)kutil_f32_to_fp8(a.z) << 16) |
                    ((uint32_t)kutil_f32_to_fp8(a.w) << 24);
            }
            *(uint32_t *)(xsm + (size_t)t * P + (size_t)q * 4) = v;
        }
    } else {
        /* INT4: a warp per row, in matmul_quant_act_f16's permuted f16 layout (mma.cuh) */
        for (int t = warp; t < 8 * C; t += blockDim.x / 32) {
            uint4 *dst = (uint4 *)(xsm + (size_t)t * P);
            if (t >= nt) {
                for (int64_t d = lane; d < K / 8; d += 32)
                    dst[d] = make_uint4(0u, 0u, 0u, 0u);
                if (lane == 0)
                    mult[t] = 0.0f;
                continue;
            }
            const float *xi = x + (size_t)(t0 + t) * K;
            const int e = mma_act_exp(kutil_warp_max(mma_act_amax(xi, K, lane, 32)));
            const float inv = ldexpf(1.0f, -e);
            for (int64_t d = lane; d < K / 8; d += 32)
                dst[d] = mma_act_f16_chunk(xi, d, inv);
            if (lane == 0)
                mult[t] = ldexpf(1.0f, e) / MMA_WSHIFT;
        }
    }
}

/* grid (ceil(N / MOE__GMM3_ROWS), max_active), block 32 * MOE__GMM3_WARPS, dynamic shared
 * memory 8 C * moe__gmm3_pitch(FMT, K) bytes (+ 8 C f32 for INT4): moe_gmm's contract for FP8
 * (K % 64 == 0) and INT4. Block (bx, y) computes columns bx * MOE__GMM3_ROWS .. + 127 of expert
 * active[y]'s grouped rows, 8 C rows per pass (stage, then every warp streams its 32 weight rows
 * over the whole K). Lane (gq, tq) of warp v holds rows row0 + 16 r + 8 h + gq (r, h in 0..1),
 * row0 = bx * MOE__GMM3_ROWS + 32 v; accumulator acc[r][c][2 h + i] is that row times staged
 * row 8 c + 2 tq + i (the mma.sync m16n8 D layout). Rows past N load row N - 1, never stored. */
template <int FMT, int C>
static __global__ void __launch_bounds__(32 * MOE__GMM3_WARPS)
    moe__gmm3(float *out, const float *x, const float *xs, const moe_wtab_t *tab, bool tiled,
              const int32_t *offsets, const int32_t *active, int n_experts, int64_t N, int64_t K)
{
    extern __shared__ __align__(16) uint8_t moe__sx3[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    if ((int)blockIdx.y >= active[n_experts])
        return; /* the whole block: no barrier is skipped by part of it */
    const int e = active[blockIdx.y];
    const int o0 = offsets[e], o1 = offsets[e + 1];
    const moe_wtab_t w = tab[e];
    const int64_t P = moe__gmm3_pitch(FMT, K);
    float *mult = (float *)(moe__sx3 + 8 * C * P);
    const int64_t row0 = (int64_t)blockIdx.x * MOE__GMM3_ROWS + warp * 32;
    const int ng = (int)(K / 128), nblk = (int)(K / 64);

    /* the lane's weight pointers at column 0 (FP8: bytes [tq * 16, +16) of each 64-column
     * block; INT4: mma_wgrp_ptrs, plain or tiled) */
    const uint8_t *wrow[2][2];
    const uint16_t *srow[2][2];
    const uint8_t *zrow[2][2];
    int wgs = 0, sgs = 0;
    float wsc[2][2] = {{1.0f, 1.0f}, {1.0f, 1.0f}}; /* FP8: the rows' scales */
    if (FMT == PD_WFMT_INT4)
        mma_wgrp_ptrs(wrow, srow, zrow, &wgs, &sgs, (const uint8_t *)w.data,
                      (const uint16_t *)w.scales, (const uint8_t *)w.zeros, row0, N, K, lane,
                      tiled);
    else
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int64_t row = row0 + 16 * r + 8 * h + gq;
                row = row < N ? row : N - 1;
                wrow[r][h] = (const uint8_t *)w.data + row * K + tq * 16;
                wsc[r][h] = ((const float *)w.scales)[row];
            }

    for (int t0 = o0; t0 < o1; t0 += 8 * C) {
        const int nt = min(8 * C, o1 - t0);
        __syncthreads(); /* the previous rows are no longer read */
        moe__gmm3_stage<FMT, C>(moe__sx3, mult, x, t0, nt, K, P);
        __syncthreads();
        float acc[2][C][4] = {};
        if (FMT == PD_WFMT_FP8) {
            for (int b0 = 0; b0 < nblk; b0 += MOE__GMM3_U) {
                uint4 q[MOE__GMM3_U][2][2];
#pragma unroll
                for (int u = 0; u < MOE__GMM3_U; u++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            q[u][r][h] =
                                b0 + u < nblk
                                    ? __ldg((const uint4 *)(wrow[r][h] + (size_t)(b0 + u) * 64))
                                    : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                for (int u = 0; u < MOE__GMM3_U; u++) {
                    if (b0 + u >= nblk)
                        break;
                    const uint8_t *xb = moe__sx3 + (size_t)(b0 + u) * 64 + tq * 16;
#pragma unroll
                    for (int c = 0; c < C; c++) {
                        const uint4 b = *(const uint4 *)(xb + (size_t)(c * 8 + gq) * P);
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            mma_fp8(acc[r][c], q[u][r][0].x, q[u][r][1].x, q[u][r][0].y,
                                    q[u][r][1].y, b.x, b.y);
                            mma_fp8(acc[r][c], q[u][r][0].z, q[u][r][1].z, q[u][r][0].w,
                                    q[u][r][1].w, b.z, b.w);
                        }
                    }
                }
            }
        } else { /* INT4: two groups in flight ahead of the one computed (matmul__int4_mma) */
            mma_wgrp_t ring0, ring1;
            mma_wgrp_load(ring0, wrow, srow, zrow, 0, wgs, sgs);
            if (ng > 1)
                mma_wgrp_load(ring1, wrow, srow, zrow, 1, wgs, sgs);
            for (int g = 0; g < ng; g += 2) {
                {
                    const mma_wgrp_t cur = ring0;
                    if (g + 2 < ng)
                        mma_wgrp_load(ring0, wrow, srow, zrow, g + 2, wgs, sgs);
                    mma_int4_group<C>(acc, cur, moe__sx3 + (size_t)g * 256, gq, tq, (int)P);
                }
                if (g + 1 < ng) {
                    const mma_wgrp_t cur = ring1;
                    if (g + 3 < ng)
                        mma_wgrp_load(ring1, wrow, srow, zrow, g + 3, wgs, sgs);
                    mma_int4_group<C>(acc, cur, moe__sx3 + (size_t)(g + 1) * 256, gq, tq, (int)P);
                }
            }
        }
#pragma unroll
        for (int c = 0; c < C; c++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int t = c * 8 + 2 * tq + i;
                if (t >= nt)
                    continue;
                const float m = FMT == PD_WFMT_FP8 ? xs[t0 + t] : mult[t];
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int64_t row = row0 + 16 * r + 8 * h + gq;
                        if (row < N)
                            out[(size_t)(t0 + t) * N + row] = acc[r][c][2 * h + i] * m * wsc[r][h];
                    }
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

/* The arguments moe_gmm and moe_gmm2 accept (moe.h). */
static bool moe__gmm_args_ok(const float *xs, pd_wfmt_t fmt, bool int4_tiled, int n_experts,
                             int max_active, int64_t N, int64_t K)
{
    return n_experts > 0 && n_experts <= MOE_MAX_EXPERTS && max_active >= 0 && N > 0 && K > 0 &&
           K % 8 == 0 && (fmt != PD_WFMT_FP8 || K % 16 == 0) &&
           (fmt != PD_WFMT_INT4 || K % 128 == 0) &&
           (fmt != PD_WFMT_INT4 || !int4_tiled || N % 32 == 0) &&
           (fmt == PD_WFMT_FP8) == (xs != NULL);
}

extern "C" pd_status_t moe_gmm(float *out, const float *x, const float *xs, const moe_wtab_t *tab,
                               pd_wfmt_t fmt, bool int4_tiled, const int32_t *offsets,
                               const int32_t *active, int n_experts, int max_active, int64_t N,
                               int64_t K, cudaStream_t stream)
{
    KUTIL_REQUIRE(moe__gmm_args_ok(xs, fmt, int4_tiled, n_experts, max_active, N, K), "moe_gmm");
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

/* Launches moe__gmm2<FMT> with smem bytes of dynamic shared memory; *fits false (nothing
 * launched) when smem is above the device's opt-in maximum. */
template <int FMT>
static pd_status_t moe__gmm2_launch(bool *fits, dim3 grid, size_t smem, float *out, const float *x,
                                    const float *xs, const moe_wtab_t *tab, bool tiled,
                                    const int32_t *offsets, const int32_t *active, int n_experts,
                                    int64_t N, int64_t K, cudaStream_t stream)
{
    static unsigned attr_set;
    pd_status_t st =
        kutil_allow_smem_optin((const void *)moe__gmm2<FMT>, smem, 0, &attr_set, fits,
                               "moe_gmm2 smem");
    if (st != PD_OK || !*fits)
        return st;
    moe__gmm2<FMT><<<grid, 32 * MOE__GMM2_WARPS, smem, stream>>>(out, x, xs, tab, tiled, offsets,
                                                                 active, n_experts, N, K);
    return KUTIL_LAUNCHED("moe_gmm2");
}

extern "C" pd_status_t moe_gmm2(float *out, const float *x, const float *xs, const moe_wtab_t *tab,
                                pd_wfmt_t fmt, bool int4_tiled, const int32_t *offsets,
                                const int32_t *active, int n_experts, int max_active, int64_t N,
                                int64_t K, cudaStream_t stream)
{
    KUTIL_REQUIRE(moe__gmm_args_ok(xs, fmt, int4_tiled, n_experts, max_active, N, K), "moe_gmm2");
    const size_t smem = (size_t)MOE__GMM2_T * (size_t)K * sizeof(float);
    if (max_active == 0)
        return PD_OK;
    const dim3 grid((unsigned)((N + MOE__GMM2_ROWS - 1) / MOE__GMM2_ROWS), (unsigned)max_active);
    bool fits = smem <= MOE__GMM2_MAX_SMEM;
    pd_status_t st = PD_OK;
    if (fits) {
        switch (fmt) {
        case PD_WFMT_BF16:
            st = moe__gmm2_launch<PD_WFMT_BF16>(&fits, grid, smem, out, x, xs, tab, int4_tiled,
                                                offsets, active, n_experts, N, K, stream);
            break;
        case PD_WFMT_FP8:
            st = moe__gmm2_launch<PD_WFMT_FP8>(&fits, grid, smem, out, x, xs, tab, int4_tiled,
                                               offsets, active, n_experts, N, K, stream);
            break;
        case PD_WFMT_INT4:
            st = moe__gmm2_launch<PD_WFMT_INT4>(&fits, grid, smem, out, x, xs, tab, int4_tiled,
                                                offsets, active, n_experts, N, K, stream);
            break;
        default:
            pd_log_error("moe_gmm2: %s weights are not supported", pd_wfmt_name(fmt));
            return PD_ERR_INVALID;
        }
    }
    if (st == PD_OK && !fits) /* a K row too long to stage on this device: the first kernel */
        st = moe_gmm(out, x, xs, tab, fmt, int4_tiled, offsets, active, n_experts, max_active, N, K,
                     stream);
    return st;
}

/* Launches moe__gmm3<FMT, C> (FMT FP8 or INT4); *fits false (nothing launched) when its shared
 * memory is above the device's opt-in maximum. */
template <int FMT, int C>
static pd_status_t moe__gmm3_launch(bool *fits, int max_active, float *out, const float *x,
                                    const float *xs, const moe_wtab_t *tab, bool tiled,
                                    const int32_t *offsets, const int32_t *active, int n_experts,
                                    int64_t N, int64_t K, cudaStream_t stream)
{
    static unsigned attr_set;
    const size_t smem = (size_t)(8 * C) * (size_t)moe__gmm3_pitch(FMT, K) +
                        (FMT == PD_WFMT_INT4 ? (size_t)(8 * C) * sizeof(float) : 0);
    pd_status_t st =
        kutil_allow_smem_optin((const void *)moe__gmm3<FMT, C>, smem, 0, &attr_set, fits,
                               "moe_gmm3 smem");
    if (st != PD_OK || !*fits)
        return st;
    const dim3 grid((unsigned)((N + MOE__GMM3_ROWS - 1) / MOE__GMM3_ROWS), (unsigned)max_active);
    moe__gmm3<FMT, C><<<grid, 32 * MOE__GMM3_WARPS, smem, stream>>>(out, x, xs, tab, tiled, offsets,
                                                                    active, n_experts, N, K);
    return KUTIL_LAUNCHED("moe_gmm3");
}

extern "C" pd_status_t moe_gmm3(float *out, const float *x, const float *xs, const moe_wtab_t *tab,
                                pd_wfmt_t fmt, bool int4_tiled, const int32_t *offsets,
                                const int32_t *active, int n_experts, int max_active, int m,
                                int64_t N, int64_t K, cudaStream_t stream)
{
    KUTIL_REQUIRE(moe__gmm_args_ok(xs, fmt, int4_tiled, n_experts, max_active, N, K) && m >= 0,
                  "moe_gmm3");
    if (max_active == 0)
        return PD_OK;
    /* 4 n8 tiles per pass when the experts average more than 16 rows (prefill), else 1 */
    const bool wide = max_active > 0 && m > 16 * max_active;
    bool fits = false;
    pd_status_t st = PD_OK;
    if (fmt == PD_WFMT_FP8 && K % 64 == 0)
        st = wide ? moe__gmm3_launch<PD_WFMT_FP8, 4>(&fits, max_active, out, x, xs, tab, int4_tiled,
                                                     offsets, active, n_experts, N, K, stream)
                  : moe__gmm3_launch<PD_WFMT_FP8, 1>(&fits, max_active, out, x, xs, tab, int4_tiled,
                                                     offsets, active, n_experts, N, K, stream);
    else if (fmt == PD_WFMT_INT4)
        st = wide
                 ? moe__gmm3_launch<PD_WFMT_INT4, 4>(&fits, max_active, out, x, xs, tab, int4_tiled,
                                                     offsets, active, n_experts, N, K, stream)
                 : moe__gmm3_launch<PD_WFMT_INT4, 1>(&fits, max_active, out, x, xs, tab, int4_tiled,
                                                     offsets, active, n_experts, N, K, stream);
    if (st == PD_OK && !fits) /* BF16, an FP8 K that is not a multiple of 64, or too large */
        st = moe_gmm2(out, x, xs, tab, fmt, int4_tiled, offsets, active, n_experts, max_active, N,
                      K, stream);
    return st;
}
