/* elementwise: embed, rmsnorm, add, rope, silu_mul, add_rmsnorm, silu_mul_fp8 (elementwise.h). */
#include "elementwise.h"
#include "kutil.cuh"
#include "matmul.h" /* the blk layout (matmul_act_blk_at) */
#include "mma.cuh"  /* the wgmma GEMM's activation image (mma_act_f16wg_row) */

int elementwise_force_generic;
int elementwise_silu_bf16_threads = 512;
int elementwise_silu_bf16_v1;
int elementwise_silu_bf16_fast;

/* ==== kernels ==== */

/* grid (n), block 256: out (n, d) f32, table (vocab, d) bf16, ids (n) int32 */
static __global__ void elementwise__embed(float *out, const uint16_t *table, const int32_t *ids,
                                          int d)
{
    const size_t row = blockIdx.x;
    const uint16_t *src = table + (size_t)ids[row] * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        out[row * d + j] = kutil_bf16_to_f32(src[j]);
}

/* grid (n), block 256: out (n, d) f32, x (n, d) f32, w (d) bf16 */
static __global__ void elementwise__rmsnorm(float *out, const float *x, const uint16_t *w, int d,
                                            float eps)
{
    __shared__ float red[32];
    const float *xi = x + (size_t)blockIdx.x * d;
    float *oi = out + (size_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        ss += xi[j] * xi[j];
    ss = kutil_block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        oi[j] = (xi[j] * inv) * kutil_bf16_to_f32(w[j]);
}

/* x (n) f32 += y (n) f32 */
static __global__ void elementwise__add(float *x, const float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

/* grid (n, ceil(n_heads / ELEMENTWISE_ROPE_HEADS)), block 128: x (n, n_heads, head_dim) f32 in
 * place, pos (n) int32, inv_freq (head_dim / 2) f32. Block (row, y) rotates heads
 * [y * ELEMENTWISE_ROPE_HEADS, +ELEMENTWISE_ROPE_HEADS) of the row; each thread takes one
 * frequency j (one cos / sin) and every G-th of those heads (G = blockDim / half thread groups). */
#define ELEMENTWISE_ROPE_HEADS 8
static __global__ void elementwise__rope(float *x, const int32_t *pos, const float *inv_freq,
                                         int n_heads, int head_dim)
{
    const int half = head_dim / 2;
    const bool wide = (int)blockDim.x >= half; /* all frequencies at once, G groups of heads */
    const int G = wide ? (int)blockDim.x / half : 1, g = wide ? (int)threadIdx.x / half : 0;
    const int h0 = blockIdx.y * ELEMENTWISE_ROPE_HEADS,
              h1 = min(n_heads, h0 + ELEMENTWISE_ROPE_HEADS);
    if (g >= G)
        return;
    const float p = (float)pos[blockIdx.x];
    float *row = x + (size_t)blockIdx.x * n_heads * head_dim;
    for (int j = wide ? (int)threadIdx.x % half : (int)threadIdx.x; j < half;
         j += wide ? half : (int)blockDim.x) {
        const float ang = p * inv_freq[j];
        const float c = cosf(ang), s = sinf(ang);
        for (int h = h0 + g; h < h1; h += G) {
            float *v = row + (size_t)h * head_dim;
            const float a = v[j], b = v[j + half];
            v[j] = a * c - b * s;
            v[j + half] = b * c + a * s;
        }
    }
}

/* out (n, f) f32, gu (n, 2f) f32 */
static __global__ void elementwise__silu_mul(float *out, const float *gu, int n, int f)
{
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): everything after reads earlier kernels' data */
    kutil_pdl_trigger();
    const size_t total = (size_t)n * f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / f, j = i % f;
        const float g = gu[r * 2 * f + j], u = gu[r * 2 * f + f + j];
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

/* ---- fused ops: residual add + RMSNorm (+ fp8 quantization), SiLU-mul (+ fp8 quantization) ----
 * A row is one block. IT > 0: the row is held in registers, IT float4 per thread (row length a
 * multiple of 4, at most IT * 4 * blockDim.x); IT == 0: any row length, the row is read again from
 * global memory (L1 / L2) for each pass. The f32 values are computed with the same expressions as
 * the plain kernels above, and the quantization is matmul_quant_act_fp8's (scale = amax / 448,
 * q = fp8(v * (1 / scale))), so q is what the matmul would have made of out. */

/* Loads element group j (IT > 0: 4 floats at 4 j; IT == 0: 1 float at j) of a row. */
template <int IT> static __device__ __forceinline__ float4 elementwise__ld(const float *row, int j)
{
    if (IT > 0)
        return ((const float4 *)row)[j];
    return make_float4(row[j], 0.0f, 0.0f, 0.0f);
}

/* The same for a bf16 row (IT > 0: 4 bf16 at 4 j, one 8-byte load), widened to f32 exactly. */
template <int IT>
static __device__ __forceinline__ float4 elementwise__ld(const uint16_t *row, int j)
{
    if (IT > 0) {
        const uint2 u = ((const uint2 *)row)[j];
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                           __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
    }
    return make_float4(kutil_bf16_to_f32(row[j]), 0.0f, 0.0f, 0.0f);
}

template <int IT>
static __device__ __forceinline__ void elementwise__st(float *row, int j, float4 v)
{
    if (IT > 0)
        ((float4 *)row)[j] = v;
    else
        row[j] = v.x;
}

/* q (k) fp8 of group j = v * inv */
template <int IT>
static __device__ __forceinline__ void elementwise__st_fp8(uint8_t *row, int j, float4 v, float inv)
{
    if (IT > 0)
        ((uint32_t *)row)[j] = kutil_f32_to_fp8(v.x * inv) |
                               (uint32_t)kutil_f32_to_fp8(v.y * inv) << 8 |
                               (uint32_t)kutil_f32_to_fp8(v.z * inv) << 16 |
                               (uint32_t)kutil_f32_to_fp8(v.w * inv) << 24;
    else
        row[j] = kutil_f32_to_fp8(v.x * inv);
}

static __device__ __forceinline__ float elementwise__amax4(float4 v, int lanes)
{
    float a = fabsf(v.x);
    if (lanes > 1)
        a = fmaxf(fmaxf(a, fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    return a;
}

/* rmsnorm output of group j: (v * inv) * w */
template <int IT>
static __device__ __forceinline__ float4 elementwise__norm4(float4 v, const uint16_t *w, int j,
                                                            float inv)
{
    const int e = IT > 0 ? 4 * j : j;
    float4 o;
    o.x = (v.x * inv) * kutil_bf16_to_f32(w[e]);
    if (IT > 0) {
        o.y = (v.y * inv) * kutil_bf16_to_f32(w[e + 1]);
        o.z = (v.z * inv) * kutil_bf16_to_f32(w[e + 2]);
        o.w = (v.w * inv) * kutil_bf16_to_f32(w[e + 3]);
    }
    return o;
}

/* elementwise__norm4 with the weights already loaded (wf: group j's 4 weights, widened) */
static __device__ __forceinline__ float4 elementwise__norm4w(float4 v, float4 wf, float inv)
{
    float4 o;
    o.x = (v.x * inv) * wf.x;
    o.y = (v.y * inv) * wf.y;
    o.z = (v.z * inv) * wf.z;
    o.w = (v.w * inv) * wf.w;
    return o;
}

/* Row t >= n of q / qs (d columns) in matmul.h's blk layout of n rows: zeros, scale 1 (one block
 * of threads). */
static __device__ void elementwise__blk_pad_row(uint8_t *q, float *qs, int t, int n, int d)
{
    const int nkb = d / 128;
    for (int e = threadIdx.x; e < d / 4; e += blockDim.x)
        ((uint32_t *)(q + (size_t)t * d))[e] = 0u;
    for (int kb = threadIdx.x; kb < nkb; kb += blockDim.x)
        qs[matmul_act_blk_at(t, kb, n, nkb)] = 1.0f;
}

/* One warp's 128-column block kb of row t in the blk layout of n rows: o is the lane's 4 values
 * (columns 128 kb + 4 lane ..), quantized as matmul_quant_act_fp8_blk does (kutil_fp8_block_quant,
 * the same kernel helper: the same bytes). */
static __device__ __forceinline__ void elementwise__blk_store(uint8_t *q, float *qs, float4 o,
                                                              int t, int kb, int n, int d)
{
    const int lane = threadIdx.x & 31;
    const float sc =
        kutil_fp8_block_quant(o, (uint32_t *)(q + (size_t)t * d + (size_t)kb * 128 + lane * 4));
    if (lane == 0)
        qs[matmul_act_blk_at(t, kb, n, d / 128)] = sc;
}

/* grid (n; blk_n > 0: MATMUL_ACT_BLK_ROWS(blk_n)), block T (a multiple of 32): x (n, d) f32, the
 * residual stream: x += y when y != NULL; y (n, d) f32 or NULL; out (n, d) f32 = rmsnorm(x) * w,
 * or NULL; w (d) bf16; q (n, d) fp8 e4m3 and qs (n) f32 = out quantized per row, or NULL; blk_n
 * > 0 (the n rows, d % 128 == 0): q / qs in 1x128 blocks in matmul.h's blk layout instead, the
 * rows past n zeros (each warp's float4 groups of an IT > 0 row are one 128-column block: T and
 * d / 4 are multiples of 32). wg_n > 0: q / qs the wgmma GEMM's f16 image of out and its
 * multipliers instead (rows past wg_n zeros), or with plain the INT4 K-split GEMV's f16
 * activations (matmul_quant_act_f16's bytes, n rows: grid n); stage (IT > 0 only): dynamic
 * shared memory of d * 4 bytes keeps the normalized row for the image pass (session 22: it read
 * x and w again from L2, one more dependent trip). */
template <int IT>
static __global__ void elementwise__add_rmsnorm(float *x, const float *y, float *out,
                                                const uint16_t *w, uint8_t *q, float *qs, int d,
                                                float eps, int blk_n, int wg_n, int stage,
                                                int plain)
{
    __shared__ float red[32];
    extern __shared__ float4 elementwise__nrow[];
    const int ng = IT > 0 ? d / 4 : d, lanes = IT > 0 ? 4 : 1; /* element groups per row */
    /* the norm's weights are no earlier kernel's output: loaded before the PDL wait, so that
     * their trip to L2 overlaps the kernel before (session 12) */
    float4 wf[IT > 0 ? IT : 1];
#pragma unroll
    for (int it = 0; it < (IT > 0 ? IT : 1); it++) {
        const int j = threadIdx.x + it * blockDim.x;
        if (IT > 0 && j < ng)
            wf[it] = elementwise__ld<IT>(w, j);
    }
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): everything after reads earlier kernels' data */
    kutil_pdl_trigger();
    const size_t row = blockIdx.x;
    if (blk_n > 0 && (int)row >= blk_n) {
        elementwise__blk_pad_row(q, qs, (int)row, blk_n, d);
        return;
    }
    if (wg_n > 0 && (int)row >= wg_n) { /* the image's rows past n: zeros */
        mma_act_f16wg_row((uint4 *)q, (int)row, d, 1.0f, true, [](int64_t) { return 0.0f; },
                          threadIdx.x, blockDim.x);
        return;
    }
    float *xi = x + row * d;
    float4 r[IT > 0 ? IT : 1];
    float ss = 0.0f;
    if (IT > 0) {
        /* every load first, then the stores: interleaved, each group's loads waited for the
         * previous group's store to x (it may alias y), IT dependent trips to L2 (session 12:
         * 5.2 us of the batch-1 step's critical path per launch) */
        float4 b[IT > 0 ? IT : 1];
#pragma unroll
        for (int it = 0; it < IT; it++) {
            const int j = threadIdx.x + it * blockDim.x;
            if (j < ng) {
                r[it] = elementwise__ld<IT>(xi, j);
                if (y)
                    b[it] = elementwise__ld<IT>(y + row * d, j);
            }
        }
#pragma unroll
        for (int it = 0; it < IT; it++) {
            const int j = threadIdx.x + it * blockDim.x;
            if (j < ng) {
                float4 v = r[it];
                if (y) {
                    v.x += b[it].x, v.y += b[it].y, v.z += b[it].z, v.w += b[it].w;
                    elementwise__st<IT>(xi, j, v);
                }
                ss += v.x * v.x;
                ss += v.y * v.y + v.z * v.z + v.w * v.w;
                r[it] = v;
            }
        }
    } else {
        for (int j = threadIdx.x; j < ng; j += blockDim.x) {
            float4 v = elementwise__ld<IT>(xi, j);
            if (y) {
                const float4 b = elementwise__ld<IT>(y + row * d, j);
                v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
                elementwise__st<IT>(xi, j, v);
            }
            ss += v.x * v.x;
        }
    }
    ss = kutil_block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    float amax = 0.0f;
#pragma unroll
    for (int it = 0; it < (IT > 0 ? IT : 1); it++)
        for (int j = threadIdx.x + it * blockDim.x; j < ng; j += (IT > 0 ? ng : blockDim.x)) {
            const float4 o = IT > 0 ? elementwise__norm4w(r[it], wf[it], inv)
                                    : elementwise__norm4<IT>(elementwise__ld<IT>(xi, j), w, j, inv);
            if (out)
                elementwise__st<IT>(out + row * d, j, o);
            if (IT > 0 && stage)
                elementwise__nrow[j] = o;
            amax = fmaxf(amax, elementwise__amax4(o, lanes));
        }
    if (!q)
        return;
    if (wg_n > 0) { /* the wgmma GEMM's f16 image: matmul_quant_act_f16wg's bytes for out */
        amax = kutil_block_max(amax, red); /* its barriers publish this block's x and row stores */
        const int e = mma_act_exp(amax);
        const float *nr = (const float *)elementwise__nrow;
        auto val = [&](int64_t c) {
            return IT > 0 && stage ? nr[c] : (xi[c] * inv) * kutil_bf16_to_f32(w[c]);
        };
        if (plain)
            mma_act_f16_row((uint4 *)q, (int)row, d, ldexpf(1.0f, -e), val, threadIdx.x,
                            blockDim.x);
        else
            mma_act_f16wg_row((uint4 *)q, (int)row, d, ldexpf(1.0f, -e), false, val, threadIdx.x,
                              blockDim.x);
        if (threadIdx.x == 0)
            qs[row] = ldexpf(1.0f, e) / MMA_WSHIFT;
        return;
    }
    if (blk_n > 0) { /* 1x128 blocks: one warp per block */
        if (IT > 0) {
#pragma unroll
            for (int it = 0; it < (IT > 0 ? IT : 1); it++) {
                const int j = threadIdx.x + it * blockDim.x; /* warp-uniform: ng % 32 == 0 */
                if (j < ng)
                    elementwise__blk_store(q, qs, elementwise__norm4w(r[it], wf[it], inv), (int)row,
                                           j / 32, blk_n, d);
            }
        } else {
            for (int kb = threadIdx.x / 32; kb < d / 128; kb += blockDim.x / 32) {
                const int j = kb * 32 + (threadIdx.x & 31);
                elementwise__blk_store(q, qs,
                                       elementwise__norm4<1>(elementwise__ld<1>(xi, j), w, j, inv),
                                       (int)row, kb, blk_n, d);
            }
        }
        return;
    }
    amax = kutil_block_max(amax, red);
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, qinv = 1.0f / scale;
#pragma unroll
    for (int it = 0; it < (IT > 0 ? IT : 1); it++)
        for (int j = threadIdx.x + it * blockDim.x; j < ng; j += (IT > 0 ? ng : blockDim.x)) {
            const float4 o = IT > 0 ? elementwise__norm4w(r[it], wf[it], inv)
                                    : elementwise__norm4<IT>(elementwise__ld<IT>(xi, j), w, j, inv);
            elementwise__st_fp8<IT>(q + row * d, j, o, qinv);
        }
    if (threadIdx.x == 0)
        qs[row] = scale;
}

static __device__ __forceinline__ float elementwise__silu1(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

/* silu(g) * u of group j of a row; gu row (2f) f32 or bf16 (T) */
template <int IT, typename T>
static __device__ __forceinline__ float4 elementwise__silu4(const T *gu, int f, int j)
{
    const float4 g = elementwise__ld<IT>(gu, j), u = elementwise__ld<IT>(gu + f, j);
    float4 o;
    o.x = elementwise__silu1(g.x, u.x);
    if (IT > 0) {
        o.y = elementwise__silu1(g.y, u.y);
        o.z = elementwise__silu1(g.z, u.z);
        o.w = elementwise__silu1(g.w, u.w);
    }
    return o;
}

/* grid (n), block T: gu (n, 2f) f32 or bf16 (TI); out (n, f) f32 = silu(gu[:, :f]) *
 * gu[:, f:], or NULL; q (n, f) fp8 e4m3 and qs (n) f32 = out quantized per row (never NULL) */
template <int IT, typename TI>
static __global__ void elementwise__silu_mul_fp8(float *out, const TI *gu, uint8_t *q, float *qs,
                                                 int f)
{
    __shared__ float red[32];
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): everything after reads earlier kernels' data */
    kutil_pdl_trigger();
    const int ng = IT > 0 ? f / 4 : f, lanes = IT > 0 ? 4 : 1;
    const size_t row = blockIdx.x;
    const TI *gi = gu + row * 2 * f;
    float4 r[IT > 0 ? IT : 1];
    float amax = 0.0f;
    if constexpr (IT > 0) {
        /* every load first (2 IT independent trips to memory), then the products: out's stores
         * may alias gu, which kept the compiler from moving a group's loads above the group
         * before's store (session 25: 6.65 us on the FP8 batch-1 step's critical path for
         * 14336 columns, IT 8, one block: eight trips in a row) */
        float4 g[IT], u[IT];
#pragma unroll
        for (int it = 0; it < IT; it++) {
            const int j = threadIdx.x + it * blockDim.x;
            if (j < ng) {
                g[it] = elementwise__ld<IT>(gi, j);
                u[it] = elementwise__ld<IT>(gi + f, j);
            }
        }
#pragma unroll
        for (int it = 0; it < IT; it++) {
            const int j = threadIdx.x + it * blockDim.x;
            if (j < ng) {
                float4 o;
                o.x = elementwise__silu1(g[it].x, u[it].x);
                o.y = elementwise__silu1(g[it].y, u[it].y);
                o.z = elementwise__silu1(g[it].z, u[it].z);
                o.w = elementwise__silu1(g[it].w, u[it].w);
                if (out)
                    elementwise__st<IT>(out + row * f, j, o);
                amax = fmaxf(amax, elementwise__amax4(o, lanes));
                r[it] = o;
            }
        }
    } else {
        for (int j = threadIdx.x; j < ng; j += blockDim.x) {
            const float4 o = elementwise__silu4<IT>(gi, f, j);
            if (out)
                elementwise__st<IT>(out + row * f, j, o);
            amax = fmaxf(amax, elementwise__amax4(o, lanes));
        }
    }
    amax = kutil_block_max(amax, red);
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, qinv = 1.0f / scale;
#pragma unroll
    for (int it = 0; it < (IT > 0 ? IT : 1); it++)
        for (int j = threadIdx.x + it * blockDim.x; j < ng; j += (IT > 0 ? ng : blockDim.x))
            elementwise__st_fp8<IT>(q + row * f, j,
                                    IT > 0 ? r[it] : elementwise__silu4<IT>(gi, f, j), qinv);
    if (threadIdx.x == 0)
        qs[row] = scale;
}

/* grid (ceil(n / 64) * 64; plain: n), block T, dynamic shared memory f * 4 bytes (SMEM) or none:
 * gu (n, 2f) f32; out (n, f) f32 = silu(gu[:, :f]) * gu[:, f:] (the plain kernel's expression)
 * or NULL; xw / mult: the wgmma GEMM's f16 activation image of out and its multipliers, the bytes
 * matmul_quant_act_f16wg makes of out (rows past n zeros), or with plain the INT4 K-split GEMV's
 * f16 activations (matmul_quant_act_f16's bytes, n rows); f % 128 == 0. SMEM: the row's values
 * are kept in shared memory for the image pass; else computed again (rows longer than shared
 * memory holds). */
template <bool SMEM>
static __global__ void __launch_bounds__(1024)
    elementwise__silu_mul_f16wg(float *out, const float *gu, uint4 *xw, float *mult, int n, int f,
                                int plain)
{
    extern __shared__ float4 elementwise__srow[];
    __shared__ float red[32];
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): everything after reads earlier kernels' data */
    kutil_pdl_trigger();
    const int t = blockIdx.x;
    const float *gi = gu + (size_t)(t < n ? t : 0) * 2 * f;
    const float *sr = (const float *)elementwise__srow;
    auto val = [&](int64_t c) { return SMEM ? sr[c] : elementwise__silu1(gi[c], gi[f + c]); };
    if (t >= n) {
        mma_act_f16wg_row(xw, t, f, 1.0f, true, val, threadIdx.x, blockDim.x);
        return;
    }
    float amax = 0.0f;
    /* the first PF groups of this thread: every load first (independent trips to memory; the
     * loop below waited for each group's loads before the next group's, since out's stores
     * could alias gu), then the rest of long rows as before */
    constexpr int PF = 4;
    float4 g[PF], u[PF];
#pragma unroll
    for (int it = 0; it < PF; it++) {
        const int j = threadIdx.x + it * blockDim.x;
        if (j < f / 4) {
            g[it] = elementwise__ld<1>(gi, j);
            u[it] = elementwise__ld<1>(gi + f, j);
        }
    }
#pragma unroll
    for (int it = 0; it < PF; it++) {
        const int j = threadIdx.x + it * blockDim.x;
        if (j < f / 4) {
            float4 o;
            o.x = elementwise__silu1(g[it].x, u[it].x);
            o.y = elementwise__silu1(g[it].y, u[it].y);
            o.z = elementwise__silu1(g[it].z, u[it].z);
            o.w = elementwise__silu1(g[it].w, u[it].w);
            if (out)
                elementwise__st<1>(out + (size_t)t * f, j, o);
            if (SMEM)
                elementwise__srow[j] = o;
            amax = fmaxf(amax, elementwise__amax4(o, 4));
        }
    }
    for (int j = threadIdx.x + PF * blockDim.x; j < f / 4; j += blockDim.x) {
        const float4 o = elementwise__silu4<1>(gi, f, j);
        if (out)
            elementwise__st<1>(out + (size_t)t * f, j, o);
        if (SMEM)
            elementwise__srow[j] = o;
        amax = fmaxf(amax, elementwise__amax4(o, 4));
    }
    amax = kutil_block_max(amax, red); /* its barriers publish the shared row */
    const int e = mma_act_exp(amax);
    if (plain)
        mma_act_f16_row(xw, t, f, ldexpf(1.0f, -e), val, threadIdx.x, blockDim.x);
    else
        mma_act_f16wg_row(xw, t, f, ldexpf(1.0f, -e), false, val, threadIdx.x, blockDim.x);
    if (threadIdx.x == 0)
        mult[t] = ldexpf(1.0f, e) / MMA_WSHIFT;
}

/* grid (MATMUL_ACT_BLK_ROWS(n), ceil(f / 128 / 8)), block 256: warp w of block (t, b) takes the
 * 128-column block kb = 8 b + w of row t: out (n, f) f32 = silu(gu[:, :f]) * gu[:, f:] (the plain
 * kernel's expression) when out != NULL, and q / qs its 1x128-block quantization in matmul.h's
 * blk layout (rows n .. zeros, scale 1); gu (n, 2f) f32 or bf16 (TI); f % 128 == 0. */
template <typename TI>
static __global__ void elementwise__silu_mul_fp8_blk(float *out, const TI *gu, uint8_t *q,
                                                     float *qs, int n, int f)
{
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): everything after reads earlier kernels' data */
    kutil_pdl_trigger();
    const int t = blockIdx.x, kb = blockIdx.y * 8 + (threadIdx.x >> 5);
    if (kb >= f / 128)
        return;
    const int j = kb * 32 + (threadIdx.x & 31); /* the lane's float4 group */
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < n) {
        o = elementwise__silu4<1>(gu + (size_t)t * 2 * f, f, j);
        if (out)
            elementwise__st<1>(out + (size_t)t * f, j, o);
    }
    elementwise__blk_store(q, qs, o, t, kb, n, f);
}

/* grid (n), block T (a power of two, 32..1024, T * 8 * IT >= f), no shared memory but the
 * reduction's 32 floats: q (n, f) fp8 e4m3, qs (n) f32 = silu(gu[:, :f]) * gu[:, f:] quantized per
 * row, gu (n, 2f) bf16, f % 8 == 0 (session 6's bf16 kernel; the same values as
 * elementwise__silu_mul_fp8<IT, uint16_t>, bit for bit). Thread t takes the 8-element groups
 * j = t + i T (i < IT) of its row: it issues all 2 IT 16-byte loads (gate and up, streaming:
 * read once) before it uses any, keeps the IT x 8 products in registers across the block max
 * and writes 8 fp8 bytes per group (one 8-byte store). The old kernel loaded 4 bf16 (8 bytes)
 * per load, and its optional f32 store may alias gu, which (likely) kept the compiler from moving
 * a group's loads above the previous group's store. The fp8
 * conversion takes two values per instruction (cvt e4m3x2: the same bytes). FAST (option, not
 * the default): silu with __expf and __fdividef (a few f32 ulps from expf / IEEE division, no
 * division slow path; 0.5 ms per 8192 prompt, docs/performance.md session 6). */
static __device__ __forceinline__ float elementwise__silu1_fast(float g, float u)
{
    return __fdividef(g, 1.0f + __expf(-g)) * u; /* g << 0: __expf = inf, g * 0 = 0 */
}

static __device__ __forceinline__ uint32_t elementwise__fp8x4(const float *v, float inv)
{
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0] * inv, v[1] * inv),
                                                 __NV_SATFINITE, __NV_E4M3),
                   hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2] * inv, v[3] * inv),
                                                 __NV_SATFINITE, __NV_E4M3);
    return lo | hi << 16;
}

template <int IT, bool FAST>
static __global__ void __launch_bounds__(512)
    elementwise__silu_mul_fp8_bf16x8(const uint16_t *__restrict__ gu, uint8_t *__restrict__ q,
                                     float *__restrict__ qs, int f)
{
    __shared__ float red[32];
    const int ng = f / 8;
    const size_t row = blockIdx.x;
    const uint4 *g4 = (const uint4 *)(gu + row * 2 * f),
                *u4 = (const uint4 *)(gu + row * 2 * f + f);
    uint4 rg[IT], ru[IT];
#pragma unroll
    for (int i = 0; i < IT; i++) {
        const int j = (int)threadIdx.x + i * (int)blockDim.x;
        if (j < ng) {
            rg[i] = __ldcs(g4 + j);
            ru[i] = __ldcs(u4 + j);
        } else {
            rg[i] = ru[i] = make_uint4(0u, 0u, 0u, 0u); /* silu(0) * 0 = 0: amax unchanged */
        }
    }
    float o[IT][8];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < IT; i++) {
        const uint32_t gw[4] = {rg[i].x, rg[i].y, rg[i].z, rg[i].w};
        const uint32_t uw[4] = {ru[i].x, ru[i].y, ru[i].z, ru[i].w};
#pragma unroll
        for (int e = 0; e < 4; e++) { /* bf16 -> f32 exactly: low half, then high half */
            const float g0 = __uint_as_float(gw[e] << 16), u0 = __uint_as_float(uw[e] << 16),
                        g1 = __uint_as_float(gw[e] & 0xffff0000u),
                        u1 = __uint_as_float(uw[e] & 0xffff0000u);
            o[i][2 * e] = FAST ? elementwise__silu1_fast(g0, u0) : elementwise__silu1(g0, u0);
            o[i][2 * e + 1] = FAST ? elementwise__silu1_fast(g1, u1) : elementwise__silu1(g1, u1);
            amax = fmaxf(amax, fmaxf(fabsf(o[i][2 * e]), fabsf(o[i][2 * e + 1])));
        }
    }
    amax = kutil_block_max(amax, red);
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, qinv = 1.0f / scale;
    uint2 *q2 = (uint2 *)(q + row * f);
#pragma unroll
    for (int i = 0; i < IT; i++) {
        const int j = (int)threadIdx.x + i * (int)blockDim.x;
        if (j < ng)
            q2[j] = make_uint2(elementwise__fp8x4(o[i], qinv), elementwise__fp8x4(o[i] + 4, qinv));
    }
    if (threadIdx.x == 0)
        qs[row] = scale;
}

/* out (n) f32 = fp8 e4m3 q (n) decoded */
static __global__ void elementwise__fp8_to_f32(float *out, const uint8_t *q, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = kutil_fp8_to_f32(q[i]);
}

/* ==== launchers ==== */

static unsigned elementwise__grid(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 1 ? 1 : g > 65535 * 8 ? 65535 * 8 : g);
}

extern "C" pd_status_t elementwise_embed(float *out, const uint16_t *table, const int32_t *ids,
                                         int n, int d, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && d > 0, "embed");
    if (n == 0)
        return PD_OK;
    elementwise__embed<<<n, 256, 0, stream>>>(out, table, ids, d);
    return KUTIL_LAUNCHED("embed");
}

extern "C" pd_status_t elementwise_rmsnorm(float *out, const float *x, const uint16_t *w, int n,
                                           int d, float eps, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && d > 0, "rmsnorm");
    if (n == 0)
        return PD_OK;
    elementwise__rmsnorm<<<n, d <= 128 ? 128 : 256, 0, stream>>>(out, x, w, d, eps);
    return KUTIL_LAUNCHED("rmsnorm");
}

extern "C" pd_status_t elementwise_add(float *x, const float *y, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return PD_OK;
    elementwise__add<<<elementwise__grid(n, 256), 256, 0, stream>>>(x, y, n);
    return KUTIL_LAUNCHED("add");
}

extern "C" pd_status_t elementwise_rope(float *x, const int32_t *pos, const float *inv_freq, int n,
                                        int n_heads, int head_dim, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0, "rope");
    if (n == 0)
        return PD_OK;
    const dim3 grid((unsigned)n,
                    (unsigned)((n_heads + ELEMENTWISE_ROPE_HEADS - 1) / ELEMENTWISE_ROPE_HEADS));
    elementwise__rope<<<grid, 128, 0, stream>>>(x, pos, inv_freq, n_heads, head_dim);
    return KUTIL_LAUNCHED("rope");
}

extern "C" pd_status_t elementwise_silu_mul(float *out, const float *gu, int n, int f,
                                            cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && f > 0, "silu_mul");
    if (n == 0)
        return PD_OK;
    kutil_launch_pdl(elementwise__silu_mul, dim3(elementwise__grid((size_t)n * f, 256)), dim3(256),
                     0, stream, out, gu, n, f);
    return KUTIL_LAUNCHED("silu_mul");
}

/* Threads per row block and registers per thread (IT float4; 0 = the any-length kernel) for a row
 * of len f32: len % 4 == 0 and len <= 8 * 4 * threads take the register kernel. */
static void elementwise__row_plan(int len, int max_threads, int *threads_p, int *it_p)
{
    int t = 32;
    while (t < max_threads && t * 4 < len)
        t *= 2;
    int it = (len + 4 * t - 1) / (4 * t);
    *threads_p = t;
    *it_p = len % 4 != 0 ? 0 : it <= 1 ? 1 : it <= 2 ? 2 : it <= 4 ? 4 : it <= 8 ? 8 : 0;
    if (*it_p == 0)
        *threads_p = max_threads;
}

extern "C" pd_status_t elementwise_add_rmsnorm(float *x, const float *y, float *out,
                                               const uint16_t *w, uint8_t *q, float *qs, int n,
                                               int d, float eps, bool blk, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && d > 0 && (q == NULL) == (qs == NULL) && out != x &&
                      (!blk || (q && d % 128 == 0)),
                  "add_rmsnorm");
    if (n == 0)
        return PD_OK;
    int t, it;
    elementwise__row_plan(d, 256, &t, &it);
    if (elementwise_force_generic)
        it = 0, t = 256;
    /* the kernel of the row plan, launched PDL (kutil.cuh: it waits first) */
    void (*k)(float *, const float *, float *, const uint16_t *, uint8_t *, float *, int, float,
              int, int, int, int) = it == 1   ? elementwise__add_rmsnorm<1>
                               : it == 2 ? elementwise__add_rmsnorm<2>
                               : it == 4 ? elementwise__add_rmsnorm<4>
                               : it == 8 ? elementwise__add_rmsnorm<8>
                                         : elementwise__add_rmsnorm<0>;
    const int rows = blk ? MATMUL_ACT_BLK_ROWS(n) : n;
    kutil_launch_pdl(k, dim3(rows), dim3(t), 0, stream, x, y, out, w, q, qs, d, eps, blk ? n : 0, 0,
                     0, 0);
    return KUTIL_LAUNCHED("add_rmsnorm");
}

/* elementwise_add_rmsnorm_f16wg (plain false: the image, grid n rounded up to 64) and
 * elementwise_add_rmsnorm_f16 (plain true: grid n) */
static pd_status_t elementwise__add_rmsnorm_f16(float *x, const float *y, float *out,
                                                const uint16_t *w, uint16_t *xw, float *mult,
                                                int n, int d, float eps, bool plain,
                                                cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && d > 0 && d % 128 == 0 && xw && mult && out != x &&
                      ((uintptr_t)xw & 15) == 0,
                  plain ? "add_rmsnorm_f16" : "add_rmsnorm_f16wg");
    if (n == 0)
        return PD_OK;
    int t, it;
    elementwise__row_plan(d, 256, &t, &it);
    if (elementwise_force_generic)
        it = 0, t = 256;
    void (*k)(float *, const float *, float *, const uint16_t *, uint8_t *, float *, int, float,
              int, int, int, int) = it == 1   ? elementwise__add_rmsnorm<1>
                               : it == 2 ? elementwise__add_rmsnorm<2>
                               : it == 4 ? elementwise__add_rmsnorm<4>
                               : it == 8 ? elementwise__add_rmsnorm<8>
                                         : elementwise__add_rmsnorm<0>;
    /* the normalized row in shared memory for the image pass where it fits the default 48 KB
     * (beside the 128-byte reduction array); PD_CUDA_NORM_STAGE=0: read again from L2 (A / B) */
    static int no_stage = -1;
    if (no_stage < 0) {
        const char *e = getenv("PD_CUDA_NORM_STAGE");
        no_stage = e && !strcmp(e, "0");
    }
    const int stage = it > 0 && !no_stage && (size_t)d * 4 <= 46 * 1024;
    kutil_launch_pdl(k, dim3((unsigned)(plain ? n : (n + 63) / 64 * 64)), dim3(t),
                     stage ? (size_t)d * 4 : 0, stream, x, y, out, w, (uint8_t *)xw, mult, d, eps,
                     0, n, stage, plain ? 1 : 0);
    return KUTIL_LAUNCHED(plain ? "add_rmsnorm_f16" : "add_rmsnorm_f16wg");
}

extern "C" pd_status_t elementwise_add_rmsnorm_f16wg(float *x, const float *y, float *out,
                                                     const uint16_t *w, uint16_t *xw, float *mult,
                                                     int n, int d, float eps, cudaStream_t stream)
{
    return elementwise__add_rmsnorm_f16(x, y, out, w, xw, mult, n, d, eps, false, stream);
}

extern "C" pd_status_t elementwise_add_rmsnorm_f16(float *x, const float *y, float *out,
                                                   const uint16_t *w, uint16_t *xh, float *mult,
                                                   int n, int d, float eps, cudaStream_t stream)
{
    return elementwise__add_rmsnorm_f16(x, y, out, w, xh, mult, n, d, eps, true, stream);
}

extern "C" {
int elementwise_silu_f16wg_smem = 1;
}

/* elementwise_silu_mul_f16wg (plain false: the image, grid n rounded up to 64) and
 * elementwise_silu_mul_f16 (plain true: grid n) */
static pd_status_t elementwise__silu_mul_f16(float *out, const float *gu, uint16_t *xw,
                                             float *mult, int n, int f, bool plain,
                                             cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && f > 0 && f % 128 == 0 && xw && mult && ((uintptr_t)xw & 15) == 0,
                  plain ? "silu_mul_f16" : "silu_mul_f16wg");
    if (n == 0)
        return PD_OK;
    const unsigned threads = f >= 8192 ? 1024u : 512u; /* as matmul_quant_act_f16wg */
    const dim3 grid((unsigned)(plain ? n : (n + 63) / 64 * 64));
    const size_t smem = (size_t)f * 4;
    /* the row in shared memory where the current device's opt-in allows, beside the kernel's
     * 1 KB static reduction array (kutil_allow_smem_optin: the attribute is per device) */
    static unsigned attr_set;
    bool in_smem = false;
    if (elementwise_silu_f16wg_smem &&
        kutil_allow_smem_optin((const void *)elementwise__silu_mul_f16wg<true>, smem, 1024,
                               &attr_set, &in_smem, "silu_mul_f16wg smem") != PD_OK) {
        (void)cudaGetLastError(); /* not this launch's error: the row goes to global memory */
        in_smem = false;
    }
    if (in_smem)
        kutil_launch_pdl(elementwise__silu_mul_f16wg<true>, grid, dim3(threads), smem, stream, out,
                         gu, (uint4 *)xw, mult, n, f, plain ? 1 : 0);
    else
        kutil_launch_pdl(elementwise__silu_mul_f16wg<false>, grid, dim3(threads), 0, stream, out,
                         gu, (uint4 *)xw, mult, n, f, plain ? 1 : 0);
    return KUTIL_LAUNCHED(plain ? "silu_mul_f16" : "silu_mul_f16wg");
}

extern "C" pd_status_t elementwise_silu_mul_f16wg(float *out, const float *gu, uint16_t *xw,
                                                  float *mult, int n, int f, cudaStream_t stream)
{
    return elementwise__silu_mul_f16(out, gu, xw, mult, n, f, false, stream);
}

extern "C" pd_status_t elementwise_silu_mul_f16(float *out, const float *gu, uint16_t *xh,
                                                float *mult, int n, int f, cudaStream_t stream)
{
    return elementwise__silu_mul_f16(out, gu, xh, mult, n, f, true, stream);
}

template <typename TI>
static void elementwise__silu_mul_fp8_launch(float *out, const TI *gu, uint8_t *q, float *qs, int n,
                                             int f, int t, int it, cudaStream_t stream)
{
    void (*k)(float *, const TI *, uint8_t *, float *, int) =
        it == 1   ? elementwise__silu_mul_fp8<1, TI>
        : it == 2 ? elementwise__silu_mul_fp8<2, TI>
        : it == 4 ? elementwise__silu_mul_fp8<4, TI>
        : it == 8 ? elementwise__silu_mul_fp8<8, TI>
                  : elementwise__silu_mul_fp8<0, TI>;
    kutil_launch_pdl(k, dim3(n), dim3(t), 0, stream, out, gu, q, qs, f); /* PDL: waits first */
}

extern "C" pd_status_t elementwise_silu_mul_fp8(float *out, const float *gu, uint8_t *q, float *qs,
                                                int n, int f, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && f > 0 && q && qs, "silu_mul_fp8");
    if (n == 0)
        return PD_OK;
    int t, it;
    elementwise__row_plan(f, 512, &t, &it);
    if (elementwise_force_generic)
        it = 0, t = 512;
    elementwise__silu_mul_fp8_launch(out, gu, q, qs, n, f, t, it, stream);
    return KUTIL_LAUNCHED("silu_mul_fp8");
}

template <bool FAST>
static void elementwise__silu_x8_launch(const uint16_t *gu, uint8_t *q, float *qs, int n, int f,
                                        int t, int its, cudaStream_t stream)
{
    switch (its) {
    case 1:
        elementwise__silu_mul_fp8_bf16x8<1, FAST><<<n, t, 0, stream>>>(gu, q, qs, f);
        break;
    case 2:
        elementwise__silu_mul_fp8_bf16x8<2, FAST><<<n, t, 0, stream>>>(gu, q, qs, f);
        break;
    case 3:
        elementwise__silu_mul_fp8_bf16x8<3, FAST><<<n, t, 0, stream>>>(gu, q, qs, f);
        break;
    case 4:
        elementwise__silu_mul_fp8_bf16x8<4, FAST><<<n, t, 0, stream>>>(gu, q, qs, f);
        break;
    case 5:
        elementwise__silu_mul_fp8_bf16x8<5, FAST><<<n, t, 0, stream>>>(gu, q, qs, f);
        break;
    case 6:
        elementwise__silu_mul_fp8_bf16x8<6, FAST><<<n, t, 0, stream>>>(gu, q, qs, f);
        break;
    case 7:
        elementwise__silu_mul_fp8_bf16x8<7, FAST><<<n, t, 0, stream>>>(gu, q, qs, f);
        break;
    default:
        elementwise__silu_mul_fp8_bf16x8<8, FAST><<<n, t, 0, stream>>>(gu, q, qs, f);
        break;
    }
}

extern "C" pd_status_t elementwise_silu_mul_fp8_bf16(const uint16_t *gu, uint8_t *q, float *qs,
                                                     int n, int f, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && f > 0 && q && qs && gu, "silu_mul_fp8_bf16");
    if (n == 0)
        return PD_OK;
    int t, it;
    if (!elementwise_silu_bf16_v1 && !elementwise_force_generic && f % 8 == 0 && f <= 8 * 8 * 512) {
        /* the 16-byte kernel: the fewest threads (>= 32) with at most 8 groups of 8 each */
        const int ng = f / 8;
        t = 32;
        while (t < 512 && (ng + t - 1) / t > 8)
            t *= 2;
        const int its = (ng + t - 1) / t;
        if (elementwise_silu_bf16_fast)
            elementwise__silu_x8_launch<true>(gu, q, qs, n, f, t, its, stream);
        else
            elementwise__silu_x8_launch<false>(gu, q, qs, n, f, t, its, stream);
        return KUTIL_LAUNCHED("silu_mul_fp8_bf16");
    }
    elementwise__row_plan(f, elementwise_silu_bf16_threads == 1024 ? 1024 : 512, &t, &it);
    if (elementwise_force_generic)
        it = 0, t = 512;
    elementwise__silu_mul_fp8_launch((float *)NULL, gu, q, qs, n, f, t, it, stream);
    return KUTIL_LAUNCHED("silu_mul_fp8_bf16");
}

extern "C" pd_status_t elementwise_silu_mul_fp8_blk(float *out, const float *gu,
                                                    const uint16_t *gu16, uint8_t *q, float *qs,
                                                    int n, int f, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && f > 0 && f % 128 == 0 && q && qs && (gu == NULL) != (gu16 == NULL) &&
                      (!out || gu),
                  "silu_mul_fp8_blk");
    if (n == 0)
        return PD_OK;
    const dim3 grid((unsigned)MATMUL_ACT_BLK_ROWS(n), (unsigned)((f / 128 + 7) / 8));
    if (gu)
        kutil_launch_pdl(elementwise__silu_mul_fp8_blk<float>, grid, dim3(256), 0, stream, out, gu,
                         q, qs, n, f);
    else
        kutil_launch_pdl(elementwise__silu_mul_fp8_blk<uint16_t>, grid, dim3(256), 0, stream,
                         (float *)NULL, gu16, q, qs, n, f);
    return KUTIL_LAUNCHED("silu_mul_fp8_blk");
}

extern "C" pd_status_t elementwise_fp8_to_f32(float *out, const uint8_t *q, size_t n,
                                              cudaStream_t stream)
{
    if (n == 0)
        return PD_OK;
    elementwise__fp8_to_f32<<<elementwise__grid(n, 256), 256, 0, stream>>>(out, q, n);
    return KUTIL_LAUNCHED("fp8_to_f32");
}
