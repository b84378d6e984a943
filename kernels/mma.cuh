/* mma: the tensor-core building blocks that the weight kernels of matmul.cu and the grouped
 * expert kernels of moe.cu share (device code only, included by both .cu files): the tiled INT4
 * layout's addressing, the mma.sync wrappers (f16 m16n8k16, e4m3 m16n8k32 with an Ampere
 * fallback), the exact INT4 (q - z) -> f16 conversion, one INT4 group (128 columns) of a warp's
 * 32 weight rows against 8 C staged tokens, and the 16-byte cp.async copy. Everything is static:
 * each including translation unit gets its own copy; nothing here owns memory. */
#ifndef PD_KERNELS_MMA_CUH
#define PD_KERNELS_MMA_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "kutil.cuh"

/* INT4 tiled layout (the CUDA backend's layout of INT4 weights with N % 32 == 0, made once at
 * upload by matmul_int4_tile): rows in blocks of 32, K in groups of 128; tile (b, g) is the 2048
 * bytes at (b * ng + g) * 2048 of data, and its 16-byte piece p = 32 rh + lane (rh = 0..3) holds
 * row 32 b + 8 rh + lane / 4, bytes [(lane % 4) * 16, +16) of that row's 64 bytes of group g:
 * each of a warp's four loads per group reads 512 contiguous bytes, and a warp streams one
 * contiguous run of 32 * K / 2 bytes. scales / zeros: entry (b * ng + g) * 32 + row % 32. */
static __device__ __forceinline__ size_t mma_tiled_piece(int64_t row, int64_t g, int q, int64_t ng)
{
    return (((size_t)(row / 32) * ng + g) * 128 + (size_t)((row % 32) / 8) * 32 +
            (size_t)(row % 8) * 4 + q) *
           16;
}
static __device__ __forceinline__ size_t mma_tiled_sz(int64_t row, int64_t g, int64_t ng)
{
    return ((size_t)(row / 32) * ng + g) * 32 + (size_t)(row % 32);
}

#define MMA_WSHIFT 16.0f /* 2^4: f16 weight pre-scale (range: group scale s <= ~270) */

/* The f16 activations of the INT4 mma GEMMs (matmul_quant_act_f16, moe__gmm3's staging): a row
 * x (K f32, K % 128 == 0) times 2^-e, e = mma_act_exp(amax of the row), so that every value is in
 * (-1, 1), rounded to f16 in the order mma_int4_group reads; the epilogue multiplies
 * 2^e / MMA_WSHIFT back. */

/* max |x| over float4s j = j0, j0 + step, ... of row xi (the caller reduces across threads) */
static __device__ __forceinline__ float mma_act_amax(const float *xi, int64_t K, int j0, int step)
{
    float amax = 0.0f;
    for (int64_t j = j0; j < K / 4; j += step) {
        const float4 a = __ldg((const float4 *)xi + j);
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))));
    }
    return amax;
}

/* e with amax * 2^-e < 1 (0 for a zero, infinite or NaN amax) */
static __device__ __forceinline__ int mma_act_exp(float amax)
{
    int e = 0;
    if (amax > 0.0f && amax <= 3.0e38f)
        frexpf(amax, &e);
    return e;
}

/* The activation image of the wgmma INT4 GEMM (matmul_w4wg.cu's header describes the layout:
 * token tiles of 64 rows, MMA_WG_TILE_B bytes per (tile, group of 128 columns), permuted and
 * swizzled). mma_act_f16wg_row: the threads of a block (tid of nth) write row t of an image of K
 * columns, f16 of val(col) * inv (inv = 2^-e, e = mma_act_exp(max |val|) over the row);
 * val_zero true: zeros (rows past n). matmul__quant_act_f16wg, the fused RMSNorm and SiLU·mul
 * kernels (elementwise.cu) share it, so their images are the same bytes for the same values. */
#define MMA_WG_TILE_B 16384
template <typename F>
static __device__ __forceinline__ void mma_act_f16wg_row(uint4 *xw, int t, int64_t K, float inv,
                                                         bool val_zero, F val, int tid, int nth)
{
    const int tt = t / 64, r = t % 64;
    const int64_t ng = K / 128;
    uint4 *base = xw + (size_t)tt * ng * (MMA_WG_TILE_B / 16);
    for (int64_t d = tid; d < K / 8; d += nth) {
        /* chunk d: group g, column block cb, chunk c = steps 4 cb + c / 2, slots 8 (c % 2) .. */
        const int64_t g = d / 16;
        const int cb = (int)(d % 16) / 8, c = (int)(d % 8);
        const int s = 4 * cb + c / 2, hi = c % 2;
        const int64_t col = g * 128 + 8 * (s / 2) + 2 * (s % 2) + hi;
        uint4 o = make_uint4(0u, 0u, 0u, 0u);
        if (!val_zero) {
            uint32_t h[4];
#pragma unroll
            for (int j = 0; j < 4; j++) { /* slots m = 2 j (tq j, e 0) and 2 j + 1 (e 1) */
                const float lo = val(col + 32 * j) * inv, up = val(col + 32 * j + 4) * inv;
                h[j] = (uint32_t)__half_as_ushort(__float2half_rn(lo)) |
                       ((uint32_t)__half_as_ushort(__float2half_rn(up)) << 16);
            }
            o = make_uint4(h[0], h[1], h[2], h[3]);
        }
        base[g * (MMA_WG_TILE_B / 16) + cb * 512 + r * 8 + (c ^ (r % 8))] = o;
    }
}

/* Destination chunk d (8 halves, 16 bytes) of the permuted f16 row: group G = d / 16, position
 * p = w * 4 + tq holds source chunk tq * 4 + w of the group, its halves in the order
 * k0 k4 k1 k5 k2 k6 k3 k7; inv = 2^-e. mma_act_f16_col: the chunk's first source column c0 (its
 * halves are c0 + j and c0 + 4 + j, j = 0..3); mma_act_f16_pack: the chunk of those values. */
static __device__ __forceinline__ int64_t mma_act_f16_col(int64_t d)
{
    const int p = (int)(d % 16), w = p / 4, tq = p % 4;
    return d / 16 * 128 + tq * 32 + w * 8;
}
static __device__ __forceinline__ uint4 mma_act_f16_pack(const float (&lo)[4], const float (&hi)[4],
                                                         float inv)
{
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        o[j] = (uint32_t)__half_as_ushort(__float2half_rn(lo[j] * inv)) |
               ((uint32_t)__half_as_ushort(__float2half_rn(hi[j] * inv)) << 16);
    return make_uint4(o[0], o[1], o[2], o[3]);
}
static __device__ __forceinline__ uint4 mma_act_f16_chunk(const float *xi, int64_t d, float inv)
{
    const float4 *src = (const float4 *)(xi + mma_act_f16_col(d));
    const float4 a = __ldg(src), b = __ldg(src + 1);
    const float lo[4] = {a.x, a.y, a.z, a.w}, hi[4] = {b.x, b.y, b.z, b.w};
    return mma_act_f16_pack(lo, hi, inv);
}

/* Row t of the plain f16 activations (matmul_quant_act_f16's layout and bytes, n rows, no
 * padding) from val(col), by the threads of a block (tid of nth); inv = 2^-e as there. The fused
 * RMSNorm and SiLU·mul kernels write it for the INT4 K-split GEMV (act_quant's PD_ACT_F16,
 * session 28): mma_act_f16_chunk's columns and packing. */
template <typename F>
static __device__ __forceinline__ void mma_act_f16_row(uint4 *xh, int t, int64_t K, float inv,
                                                       F val, int tid, int nth)
{
    for (int64_t d = tid; d < K / 8; d += nth) {
        const int64_t c0 = mma_act_f16_col(d);
        float lo[4], hi[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            lo[j] = val(c0 + j);
            hi[j] = val(c0 + 4 + j);
        }
        xh[(size_t)t * (size_t)(K / 8) + d] = mma_act_f16_pack(lo, hi, inv);
    }
}

/* One group (128 columns) of a lane's weights: rows (r = m-tile 0/1, h = +0/+8). */
typedef struct {
    uint4 q[2][2];    /* 32 nibbles of the row */
    uint32_t s[2][2]; /* bf16 scale bits */
    uint32_t z[2][2]; /* zero point */
} mma_wgrp_t;

/* wrow / srow / zrow: the lane's pointers at group 0; wgs / sgs: their strides per group
 * (plain: 64 bytes / 1 entry; tiled: 2048 bytes / 32 entries). */
static __device__ __forceinline__ void mma_wgrp_load(mma_wgrp_t &g, const uint8_t *(&wrow)[2][2],
                                                     const uint16_t *(&srow)[2][2],
                                                     const uint8_t *(&zrow)[2][2], int grp, int wgs,
                                                     int sgs)
{
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            g.q[r][h] = __ldcs((const uint4 *)(wrow[r][h] + (size_t)grp * wgs));
            g.s[r][h] = __ldg(srow[r][h] + (size_t)grp * sgs);
            g.z[r][h] = __ldg(zrow[r][h] + (size_t)grp * sgs);
        }
}

/* The lane's (gq = lane / 4, tq = lane % 4) pointers at group 0 for mma_wgrp_load: rows
 * row0 + 16 r + 8 h + gq (r, h in 0..1) of INT4 weights wd (data), wsc (bf16 scales), wz (zeros),
 * plain or tiled (N % 32 == 0), and their strides per group. Rows past N read row N - 1 (tiled:
 * the last row block): computed, never stored. */
static __device__ __forceinline__ void
mma_wgrp_ptrs(const uint8_t *(&wrow)[2][2], const uint16_t *(&srow)[2][2],
              const uint8_t *(&zrow)[2][2], int *wgs, int *sgs, const uint8_t *wd,
              const uint16_t *wsc, const uint8_t *wz, int64_t row0, int64_t N, int64_t K, int lane,
              bool tiled)
{
    const int gq = lane >> 2, tq = lane & 3;
    const int64_t ng = K / 128;
    const int64_t blk = min(row0 / 32, N / 32 - 1);
    *wgs = tiled ? 2048 : 64;
    *sgs = tiled ? 32 : 1;
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int64_t row = row0 + 16 * r + 8 * h + gq;
            row = row < N ? row : N - 1;
            if (tiled) {
                wrow[r][h] = wd + ((size_t)blk * ng * 128 + (2 * r + h) * 32 + lane) * 16;
                srow[r][h] = wsc + (size_t)blk * ng * 32 + (2 * r + h) * 8 + gq;
                zrow[r][h] = wz + (size_t)blk * ng * 32 + (2 * r + h) * 8 + gq;
            } else {
                wrow[r][h] = wd + row * (K / 2) + tq * 16;
                srow[r][h] = wsc + row * ng;
                zrow[r][h] = wz + row * ng;
            }
        }
}

/* (a & m) | o in one lop3 */
static __device__ __forceinline__ uint32_t mma_lop3(uint32_t a, uint32_t m, uint32_t o)
{
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(a), "r"(m), "r"(o));
    return d;
}

/* q - z exactly in f16x2 for the four nibble pairs (j, j + 4), j = 0..3, of a word u of eight
 * nibbles (nibble m = bits 4m..4m+3): the magic-number conversion of FasterTransformer / Marlin.
 * Nibbles 0/4 and 2/6 (after u >> 8) are or-ed into the mantissa of f16 1024 (0x6400): 1024 + q,
 * minus zl = 1024 + z; nibbles 1/5 and 3/7 land 4 bits higher: 1024 + 16 q, times 1/16 plus
 * zh = -(64 + z). Every value is an integer below 2^11: all exact. 9 instructions per word
 * (a shift, 4 lop3, 2 sub, 2 fma) instead of 15 with a shift and mask per pair. z in [0, 15]. */
static __device__ __forceinline__ void mma_nib_qz(uint32_t (&h)[4], uint32_t u, uint32_t zl,
                                                  uint32_t zh)
{
    const uint32_t v = u >> 8;
    const uint32_t a0 = mma_lop3(u, 0x000f000fu, 0x64006400u);
    const uint32_t a1 = mma_lop3(u, 0x00f000f0u, 0x64006400u);
    const uint32_t a2 = mma_lop3(v, 0x000f000fu, 0x64006400u);
    const uint32_t a3 = mma_lop3(v, 0x00f000f0u, 0x64006400u);
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(h[0]) : "r"(a0), "r"(zl));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(h[1]) : "r"(a1), "r"(0x2c002c00u), "r"(zh));
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(h[2]) : "r"(a2), "r"(zl));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(h[3]) : "r"(a3), "r"(0x2c002c00u), "r"(zh));
}

/* the two zero-point constants of mma_nib_qz for zero point z, both halves */
static __device__ __forceinline__ uint32_t mma_zl(uint32_t z)
{
    return (0x6400u | z) * 0x10001u; /* f16 1024 + z */
}
static __device__ __forceinline__ uint32_t mma_zh(uint32_t z)
{
    return (0xd400u + (z << 4)) * 0x10001u; /* f16 -(64 + z) */
}

/* f16x2 a * b */
static __device__ __forceinline__ uint32_t mma_hmul2(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

/* d (4) f32 += A (16 x 16 f16, row) * B (16 x 8 f16, col) */
static __device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* the C fragments of 2 m-tiles x C n-tiles set to 0 */
template <int C> static __device__ __forceinline__ void mma_acc_zero(float (&a)[2][C][4])
{
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int c = 0; c < C; c++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                a[r][c][i] = 0.0f;
}

/* One group for a warp: 2 m-tiles x C n-tiles x 8 k-steps of mma. xg: the group's 256 bytes of
 * token row 0 of the stage (the activations in matmul_quant_act_f16's order), rows pitch bytes
 * apart; bv false: token gq of the tile does not exist (its B column is zero). POST (the INT4
 * K-split GEMV's PD_CUDA_INT4_KSPLIT_POST, session 27): the group scale after the products
 * instead of in A: A = q - z, exact in f16, without the 4 mul.f16x2 per word; the group's 8 k
 * steps accumulate into fresh f32 tiles, added to acc times s * MMA_WSHIFT in f32 (the scale the
 * f16 path folds into A, so the caller's multiplier is the same). Its products are exact where
 * the f16 path rounds (q - z) s to f16 once: the two differ in the last bits. */
template <int C, bool POST = false>
static __device__ __forceinline__ void mma_int4_group(float (&acc)[2][C][4], const mma_wgrp_t &g,
                                                      const uint8_t *xg, int gq, int tq, int pitch,
                                                      bool bv = true)
{
    uint32_t sc[2][2], zl[2][2], zh[2][2];
    float sf[2][2];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            sf[r][h] = kutil_bf16_to_f32((uint16_t)g.s[r][h]) * MMA_WSHIFT;
            sc[r][h] = (uint32_t)__half_as_ushort(__float2half_rn(sf[r][h])) * 0x10001u;
            zl[r][h] = mma_zl(g.z[r][h]);
            zh[r][h] = mma_zh(g.z[r][h]);
        }
    float part[2][C][4]; /* POST: the group's own sums */
    mma_acc_zero<C>(part);
    float(&d)[2][C][4] = POST ? part : acc;
#pragma unroll
    for (int w = 0; w < 4; w++) { /* word w of each row: mma steps 2w, 2w + 1 */
        uint32_t a[2][2][4];      /* [r][h][j]: H[4 w + j] = (q - z) * s' (one rounding) */
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4 q4 = g.q[r][h];
                const uint32_t u = w == 0 ? q4.x : w == 1 ? q4.y : w == 2 ? q4.z : q4.w;
                mma_nib_qz(a[r][h], u, zl[r][h], zh[r][h]);
                if (!POST)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        a[r][h][j] = mma_hmul2(a[r][h][j], sc[r][h]);
            }
#pragma unroll
        for (int c = 0; c < C; c++) {
            const uint4 b =
                bv ? *(const uint4 *)(xg + (size_t)(c * 8 + gq) * pitch + (w * 4 + tq) * 16)
                   : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mma_f16(d[r][c], a[r][0][0], a[r][1][0], a[r][0][1], a[r][1][1], b.x, b.y);
                mma_f16(d[r][c], a[r][0][2], a[r][1][2], a[r][0][3], a[r][1][3], b.z, b.w);
            }
        }
    }
    /* POST: C fragment [0], [1] row gq (h 0), [2], [3] row gq + 8 (h 1) of m tile r */
#pragma unroll
    for (int r = 0; r < 2 && POST; r++)
#pragma unroll
        for (int c = 0; c < C; c++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[r][c][i] = fmaf(part[r][c][i], sf[r][i >> 1], acc[r][c][i]);
}

static __device__ __forceinline__ void mma_cp_async16(void *smem, const void *gmem, int bytes)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}

/* d (4) f32 += A (16 x 32 e4m3, row) * B (32 x 8 e4m3, col) */
static __device__ __forceinline__ void mma_fp8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    /* Ampere (no fp8 mma, cuda-arch 80): the same product as two f16 m16n8k16 mmas on the values
     * converted exactly to f16. Real k 4t + {0, 1} of a word -> f16 k 2t + {0, 1}, 4t + {2, 3} ->
     * 2t + 8 + {0, 1}, the same for A and B (any K order works when both operands use it). */
    uint32_t h[6][2];
    const uint32_t w[6] = {a0, a1, a2, a3, b0, b1};
#pragma unroll
    for (int i = 0; i < 6; i++) {
        __half2_raw lo =
            __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] & 0xffff), __NV_E4M3);
        __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] >> 16), __NV_E4M3);
        h[i][0] = (uint32_t)lo.x | ((uint32_t)lo.y << 16);
        h[i][1] = (uint32_t)hi.x | ((uint32_t)hi.y << 16);
    }
#pragma unroll
    for (int k = 0; k < 2; k++) /* k 0: words a0, a1, b0 (real k 0..15); 1: a2, a3, b1 */
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(h[2 * k][0]), "r"(h[2 * k + 1][0]), "r"(h[2 * k][1]), "r"(h[2 * k + 1][1]),
              "r"(h[4 + k][0]), "r"(h[4 + k][1]));
#endif
}

/* ---- mbarriers and bulk copies (sm_90+: the wgmma GEMM's ring, the slice GEMV's bulk-fed steps)
 * ---- */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
static __device__ __forceinline__ void mma_bar_init(uint32_t a, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
}
static __device__ __forceinline__ void mma_bar_arrive(uint32_t a)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
}
static __device__ __forceinline__ void mma_bar_expect(uint32_t a, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mma_bar_wait(uint32_t a, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}
/* warpgroup tensor-core instruction (wgmma) ordering, shared by the Hopper kernels: the fence
 * before a warpgroup's first wgmma (after its registers or shared memory were written), the
 * commit of the issued wgmma as one group, and the wait until at most N groups are pending */
static __device__ __forceinline__ void mma_wg_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void mma_wg_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void mma_wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* The barriers of a ring of NS stages at bars (16 NS bytes, 8-aligned): "full" s (one arrival:
 * the producer's expect_tx) at bars + 8 s, "empty" s (one arrival per consumer warp: two
 * warpgroups) at bars + 8 (NS + s). One thread calls it; the block synchronizes after. */
static __device__ __forceinline__ void mma_ring_init(int NS, uint32_t bars)
{
    for (int s = 0; s < NS; s++) {
        mma_bar_init(bars + 8 * s, 1);
        mma_bar_init(bars + 8 * (NS + s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* The single producer thread of a ring of NS stages (matmul_w4wg, matmul_w8wg): copy(i, w, a)
 * issues stage i's copies, w the constant weights (with the stage's expect_tx on its "full"
 * barrier), a the activations that the kernels before this one write. PDL (kutil.cuh): the first
 * min(nst, NS) stages' weights are copied before the wait, their activations after it; stage i >=
 * NS first waits until the consumers have handed back its slot's previous use (the "empty"
 * barrier at bars + 8 (NS + i % NS), phase i / NS - 1). */
template <typename F>
static __device__ __forceinline__ void mma_ring_produce(int nst, int NS, uint32_t bars, F copy)
{
    const int pre = min(nst, NS);
    for (int i = 0; i < pre; i++)
        copy(i, true, false);
    kutil_pdl_wait();
    kutil_pdl_trigger();
    for (int i = 0; i < pre; i++)
        copy(i, false, true);
    for (int i = NS; i < nst; i++) {
        mma_bar_wait(bars + 8 * (NS + i % NS), (uint32_t)((i / NS - 1) & 1));
        copy(i, true, true);
    }
}
/* bytes (a multiple of 16; src and dst 16-byte aligned) from global src to shared dst, completing
 * on the mbarrier at bar */
static __device__ __forceinline__ void mma_bulk(uint32_t dst, const void *src, uint32_t bytes,
                                                uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
#endif

#endif
