/* attention_flash: paged causal flash attention with mma.sync bf16 (see attention_flash.h). */
#include <cuda.h> /* CUtensorMap (the type only: the encoder comes through the runtime) */
#include <cuda_bf16.h>
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>

#include "attention_flash.h"
#include "kutil.cuh"
#include "mma.cuh" /* mma_bar_expect (variant 10's producer) */

#define FLASH__WARPS 4
#define FLASH__THREADS (32 * FLASH__WARPS)

/* ==== device helpers ==== */

static __device__ __forceinline__ uint32_t flash__smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronously; src_bytes 0 fills the 16 bytes with zeros. */
static __device__ __forceinline__ void flash__cp16(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
/* 4 bytes global -> shared, asynchronously; src_bytes 0 writes zeros. */
static __device__ __forceinline__ void flash__cp4(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
static __device__ __forceinline__ void flash__cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> static __device__ __forceinline__ void flash__cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Four 8x8 b16 matrices from shared memory (lane i gives the address of row i % 8 of matrix
 * i / 8); r[j] holds matrix j as an mma fragment (row lane / 4, columns 2 (lane % 4) + {0, 1}). */
static __device__ __forceinline__ void flash__ldm_x4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
/* As flash__ldm_x4, each matrix transposed. */
static __device__ __forceinline__ void flash__ldm_x4_t(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c (16x8 f32) += a (16x16 bf16, row) b (16x8 bf16, col) */
static __device__ __forceinline__ void flash__mma(float c[4], const uint32_t a[4], uint32_t b0,
                                                  uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x (MUFU; 2^-inf = 0) */
static __device__ __forceinline__ float flash__ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* two f32 -> packed bf16x2 (round to nearest even), x in the low half */
static __device__ __forceinline__ uint32_t flash__pack(float x, float y)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *(uint32_t *)&v;
}

/* Element offset of the 8-element chunk ch of row r in a tile of rows of D bf16: chunks are
 * XOR-swizzled by the row's low 3 bits, so the 8 rows an ldmatrix reads hit distinct banks. */
template <int D> static __device__ __forceinline__ int flash__off(int r, int ch)
{
    return r * D + ((ch ^ (r & 7)) << 3);
}

/* The shapes of one kernel variant: BN keys per K/V tile; QREG: this warp's Q fragments stay in
 * registers for the whole block (else they are read from shared memory for every tile: fewer
 * registers); MINB: blocks per SM the registers are budgeted for (__launch_bounds__); RG: groups
 * of 16 query rows per warp (each K/V fragment feeds RG MMAs), BM = 16 RG FLASH__WARPS query rows
 * per block. */
template <int D_, int FMT_, int BN_, bool QREG_, int MINB_, int RG_ = 1> struct flash__cfg {
    static constexpr int D = D_, FMT = FMT_, BN = BN_, MINB = MINB_, RG = RG_;
    static constexpr int BM = 16 * RG * FLASH__WARPS;
    static constexpr bool QREG = QREG_;
    static constexpr int CH = D / 8;    /* 16-byte bf16 chunks per row */
    static constexpr int TILE = BN * D; /* bf16 elements of one K or V tile */
    /* bf16 K/V tile buffers: bf16 KV keeps three (tile kt is read while kt + 1 and kt + 2 are in
     * flight: one barrier per tile); fp8 converts into one (raw tiles double buffered) */
    static constexpr int NBUF = FMT == PD_KV_FP8 ? 1 : 3;
    /* shared memory: Q (BM, D) bf16, NBUF x K and V (BN, D) bf16; fp8: 2 x raw K and V (BN, D)
     * fp8 and 2 x their scales (2, BN) f32 */
    static constexpr size_t SMEM = (size_t)(BM * D + 2 * NBUF * TILE) * 2 +
                                   (FMT == PD_KV_FP8 ? (size_t)2 * 2 * TILE + 2 * 2 * BN * 4 : 0);
};

/* Issues the copies of the K/V tile of keys [t0, t0 + BN) (positions in the sequence) of kv head
 * kvh: bf16 pages straight into ks, vs (BN, D) bf16 swizzled; fp8 pages into rk, rv (BN, D) fp8
 * and rsc (2, BN) f32 scales (K then V), unswizzled. Keys >= n_keys become zeros. The caller
 * commits and waits. */
template <class C>
static __device__ __forceinline__ void
flash__load_kv(__nv_bfloat16 *ks, __nv_bfloat16 *vs, uint8_t *rk, uint8_t *rv, float *rsc,
               const uint8_t *arena, const kv_layout_t &l, size_t koff, size_t voff, size_t ksoff,
               size_t vsoff, const int32_t *bt, int kvh, int t0, int n_keys)
{
    constexpr int D = C::D, BN = C::BN;
    const int tid = threadIdx.x, P = l.page_tokens, KVH = l.n_kv_heads;
    /* page of key t: a shift and a mask for power-of-two pages (every layout in use), not an
     * integer division per copy */
    const bool p2 = (P & (P - 1)) == 0;
    const int ps = __ffs(P) - 1;
    if constexpr (C::FMT == PD_KV_BF16) {
        constexpr int CH = D / 8, PER = BN * CH / FLASH__THREADS;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int idx = tid + i * FLASH__THREADS, r = idx / CH, ch = idx % CH, t = t0 + r;
            const bool valid = t < n_keys;
            const int tt = valid ? t : 0;
            const int pg = p2 ? tt >> ps : tt / P, pt = p2 ? tt & (P - 1) : tt % P;
            const uint8_t *page = arena + (size_t)bt[pg] * l.page_bytes;
            const size_t e = ((size_t)pt * KVH + kvh) * D + (size_t)ch * 8; /* element */
            const int so = flash__off<D>(r, ch);
            flash__cp16(flash__smem_addr(ks + so), valid ? page + koff + e * 2 : arena,
                        valid ? 16 : 0);
            flash__cp16(flash__smem_addr(vs + so), valid ? page + voff + e * 2 : arena,
                        valid ? 16 : 0);
        }
    } else {
        constexpr int CB = D / 16, PER = BN * CB / FLASH__THREADS; /* 16-byte fp8 chunks */
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int idx = tid + i * FLASH__THREADS, r = idx / CB, cb = idx % CB, t = t0 + r;
            const bool valid = t < n_keys;
            const int tt = valid ? t : 0;
            const int pg = p2 ? tt >> ps : tt / P, pt = p2 ? tt & (P - 1) : tt % P;
            const uint8_t *page = arena + (size_t)bt[pg] * l.page_bytes;
            const size_t e = ((size_t)pt * KVH + kvh) * D + (size_t)cb * 16;
            flash__cp16(flash__smem_addr(rk + r * D + cb * 16), valid ? page + koff + e : arena,
                        valid ? 16 : 0);
            flash__cp16(flash__smem_addr(rv + r * D + cb * 16), valid ? page + voff + e : arena,
                        valid ? 16 : 0);
        }
        for (int idx = tid; idx < 2 * BN; idx += FLASH__THREADS) {
            const int side = idx / BN, r = idx % BN, t = t0 + r;
            const bool valid = t < n_keys;
            const int tt = valid ? t : 0;
            const int pg = p2 ? tt >> ps : tt / P, pt = p2 ? tt & (P - 1) : tt % P;
            const uint8_t *page = arena + (size_t)bt[pg] * l.page_bytes;
            const size_t so = (side ? vsoff : ksoff) + ((size_t)pt * KVH + kvh) * 4;
            flash__cp4(flash__smem_addr(rsc + idx), valid ? page + so : arena, valid ? 4 : 0);
        }
    }
}

/* fp8: ks, vs (BN, D) bf16 swizzled = the staged raw tile rk, rv (BN, D) fp8 times its scales
 * rsc (2, BN) f32, rounded to bf16. */
template <class C>
static __device__ __forceinline__ void flash__convert(__nv_bfloat16 *ks, __nv_bfloat16 *vs,
                                                      const uint8_t *rk, const uint8_t *rv,
                                                      const float *rsc)
{
    constexpr int D = C::D, BN = C::BN, CH = D / 8, PER = BN * CH / FLASH__THREADS;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int idx = threadIdx.x + i * FLASH__THREADS, r = idx / CH, ch = idx % CH;
        const uint2 kb = *(const uint2 *)(rk + r * D + ch * 8);
        const uint2 vb = *(const uint2 *)(rv + r * D + ch * 8);
        const float ksc = rsc[r], vsc = rsc[BN + r];
        uint4 kw, vw;
        uint32_t *kp = &kw.x, *vp = &vw.x;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t kx = j < 2 ? kb.x : kb.y, vx = j < 2 ? vb.x : vb.y;
            const int sh = (j & 1) * 16;
            kp[j] = flash__pack(kutil_fp8_to_f32((uint8_t)(kx >> sh)) * ksc,
                                kutil_fp8_to_f32((uint8_t)(kx >> (sh + 8))) * ksc);
            vp[j] = flash__pack(kutil_fp8_to_f32((uint8_t)(vx >> sh)) * vsc,
                                kutil_fp8_to_f32((uint8_t)(vx >> (sh + 8))) * vsc);
        }
        const int so = flash__off<D>(r, ch);
        *(uint4 *)(ks + so) = kw;
        *(uint4 *)(vs + so) = vw;
    }
}

/* ==== kernel ==== */

/* grid (n_heads, n_tiles) with n_tiles >= sum over sequences of ceil(q_len / BM), block
 * FLASH__THREADS, dynamic shared memory C::SMEM.
 * out (n_rows, n_heads, D) f32; q (n_rows, n_heads, D) f32; arena pages (layout l, bf16 or fp8);
 * q_start (n_seqs + 1), ctx_len (n_seqs), block_tables (n_seqs, max_pages) int32.
 * Block (h, y): query head h; the y-th tile in the order of the sequences, each sequence's tiles
 * last first (the causal tiles with the most keys start first). */
template <class C>
static __global__ void __launch_bounds__(FLASH__THREADS, C::MINB)
    flash__kernel(float *out, const float *q, const uint8_t *arena, kv_layout_t l, int layer,
                  const int32_t *q_start, const int32_t *ctx_len, const int32_t *block_tables,
                  int n_seqs, int max_pages, int n_heads)
{
    constexpr int D = C::D, BN = C::BN, BM = C::BM, RG = C::RG;
    constexpr int CH = D / 8, KS = D / 16, NT = BN / 8, DT = D / 8;
    constexpr int TILE = C::TILE;
    constexpr bool FP8 = C::FMT == PD_KV_FP8;
    extern __shared__ __align__(128) unsigned char flash__smem[];
    __nv_bfloat16 *qs = (__nv_bfloat16 *)flash__smem;
    __nv_bfloat16 *kbuf = qs + BM * D, *vbuf = kbuf + C::NBUF * TILE;
    uint8_t *rkbuf = (uint8_t *)(vbuf + C::NBUF * TILE), *rvbuf = rkbuf + 2 * TILE;
    float *rsbuf = (float *)(rvbuf + 2 * TILE); /* fp8 only: (2 buffers, 2 sides, BN) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
    const int h = blockIdx.x, H = n_heads, kvh = h / (n_heads / l.n_kv_heads);
    const unsigned full = 0xffffffffu;

    /* ---- which sequence and tile: a warp-wide scan of the tile counts ---- */
    const int target = blockIdx.y;
    int s = -1, j = 0, base = 0;
    for (int s0 = 0; s0 < n_seqs; s0 += 32) {
        const int si = s0 + lane;
        const int cnt = si < n_seqs ? (q_start[si + 1] - q_start[si] + BM - 1) / BM : 0;
        int inc = cnt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(full, inc, o);
            if (lane >= o)
                inc += v;
        }
        const int tot = __shfl_sync(full, inc, 31);
        if (target < base + tot) {
            const int L = __ffs(__ballot_sync(full, base + inc > target)) - 1;
            const int before = __shfl_sync(full, inc - cnt, L);
            const int cnt_l = __shfl_sync(full, cnt, L);
            s = s0 + L;
            j = cnt_l - 1 - (target - base - before); /* last tile first */
            break;
        }
        base += tot;
    }
    if (s < 0)
        return; /* the grid's spare tiles (uniform over the block) */

    const int q_len = q_start[s + 1] - q_start[s], row0 = q_start[s] + j * BM;
    const int qn = min(BM, q_len - j * BM);       /* valid rows of this tile */
    const int pos0 = ctx_len[s] - q_len + j * BM; /* position of the tile's row 0 */
    const int n_keys = pos0 + qn;                 /* keys the last valid row sees */
    const int n_kt = (n_keys + BN - 1) / BN;
    const int32_t *bt = block_tables + (size_t)s * max_pages;
    const size_t koff = kutil_kv_data_off(l, layer, 0), voff = kutil_kv_data_off(l, layer, 1);
    const size_t ksoff = kutil_kv_scale_off(l, layer, 0), vsoff = kutil_kv_scale_off(l, layer, 1);

    /* ---- first K/V tile in flight, then Q (f32 -> bf16, rows >= qn zero) ---- */
    flash__load_kv<C>(kbuf, vbuf, rkbuf, rvbuf, rsbuf, arena, l, koff, voff, ksoff, vsoff, bt, kvh,
                      0, n_keys);
    flash__cp_commit();
    if constexpr (!FP8) { /* bf16: tile 1 in flight too (an empty group when there is none) */
        if (n_kt > 1)
            flash__load_kv<C>(kbuf + TILE, vbuf + TILE, rkbuf, rvbuf, rsbuf, arena, l, koff, voff,
                              ksoff, vsoff, bt, kvh, BN, n_keys);
        flash__cp_commit();
    }
#pragma unroll
    for (int i = 0; i < BM * CH / FLASH__THREADS; i++) {
        const int idx = tid + i * FLASH__THREADS, r = idx / CH, ch = idx % CH;
        uint4 w = make_uint4(0, 0, 0, 0);
        if (r < qn) {
            const float4 *src = (const float4 *)(q + ((size_t)(row0 + r) * H + h) * D + ch * 8);
            const float4 a = src[0], b = src[1];
            w = make_uint4(flash__pack(a.x, a.y), flash__pack(a.z, a.w), flash__pack(b.x, b.y),
                           flash__pack(b.z, b.w));
        }
        *(uint4 *)(qs + flash__off<D>(r, ch)) = w;
    }
    __syncthreads();
    /* row group rg of this warp: block rows (warp * RG + rg) * 16 + [0, 16) */
    /* this warp's rows of Q as A fragments, one per (row group, 16 dims) (kept when QREG) */
    uint32_t qf[C::QREG ? RG : 1][C::QREG ? KS : 1][4];
    if constexpr (C::QREG) {
#pragma unroll
        for (int rg = 0; rg < RG; rg++)
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                const int r = (warp * RG + rg) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                          ch = kk * 2 + (lane >> 4);
                flash__ldm_x4(qf[rg][kk], flash__smem_addr(qs + flash__off<D>(r, ch)));
            }
    }

    /* this thread's rows: g and g + 8 of each of the warp's row groups (fragment rows) */
    const int g = lane >> 2, t4 = lane & 3;
    int pos[RG][2];
#pragma unroll
    for (int rg = 0; rg < RG; rg++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = (warp * RG + rg) * 16 + g + i * 8;
            pos[rg][i] = pos0 + min(r, qn - 1); /* padding rows repeat the last valid row */
        }
    const float sc = 1.4426950408889634f / sqrtf((float)D); /* log2(e) / sqrt(D) */
    /* m: running row maxima of the raw scores q.k; lsum: this thread's part of the row sums */
    float o[RG][DT][4], m[RG][2], lsum[RG][2];
#pragma unroll
    for (int rg = 0; rg < RG; rg++) {
        m[rg][0] = m[rg][1] = -INFINITY;
        lsum[rg][0] = lsum[rg][1] = 0.0f;
#pragma unroll
        for (int d = 0; d < DT; d++)
            o[rg][d][0] = o[rg][d][1] = o[rg][d][2] = o[rg][d][3] = 0.0f;
    }

    for (int kt = 0; kt < n_kt; kt++) {
        const int buf = kt & 1, nb = buf ^ 1, b3 = kt % 3;
        if constexpr (FP8) {
            if (kt + 1 < n_kt) {
                flash__load_kv<C>(kbuf, vbuf, rkbuf + nb * TILE, rvbuf + nb * TILE,
                                  rsbuf + nb * 2 * BN, arena, l, koff, voff, ksoff, vsoff, bt, kvh,
                                  (kt + 1) * BN, n_keys);
                flash__cp_commit();
                flash__cp_wait<1>();
            } else {
                flash__cp_wait<0>();
            }
            __syncthreads();
            flash__convert<C>(kbuf, vbuf, rkbuf + buf * TILE, rvbuf + buf * TILE,
                              rsbuf + buf * 2 * BN);
            __syncthreads();
        } else {
            /* groups committed so far: tiles 0 .. kt + 1; all but the newest are complete */
            flash__cp_wait<1>();
            /* tile kt visible to all; every warp is done with tile kt - 1, whose buffer
             * ((kt + 2) % 3) takes tile kt + 2 now */
            __syncthreads();
            const int b2 = (kt + 2) % 3;
            if (kt + 2 < n_kt)
                flash__load_kv<C>(kbuf + b2 * TILE, vbuf + b2 * TILE, rkbuf, rvbuf, rsbuf, arena, l,
                                  koff, voff, ksoff, vsoff, bt, kvh, (kt + 2) * BN, n_keys);
            flash__cp_commit();
        }
        const __nv_bfloat16 *ks = kbuf + (FP8 ? 0 : b3 * TILE), *vs = vbuf + (FP8 ? 0 : b3 * TILE);

        /* S (16 RG rows x BN keys) = Q K^T, raw (unscaled) */
        float sacc[RG][NT][4];
#pragma unroll
        for (int rg = 0; rg < RG; rg++)
#pragma unroll
            for (int n = 0; n < NT; n++)
                sacc[rg][n][0] = sacc[rg][n][1] = sacc[rg][n][2] = sacc[rg][n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            uint32_t qa[RG][4];
#pragma unroll
            for (int rg = 0; rg < RG; rg++) {
                if constexpr (C::QREG) {
                    qa[rg][0] = qf[rg][kk][0], qa[rg][1] = qf[rg][kk][1];
                    qa[rg][2] = qf[rg][kk][2], qa[rg][3] = qf[rg][kk][3];
                } else {
                    const int r = (warp * RG + rg) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                              ch = kk * 2 + (lane >> 4);
                    flash__ldm_x4(qa[rg], flash__smem_addr(qs + flash__off<D>(r, ch)));
                }
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b[4];
                const int r = np * 16 + (lane & 7) + (lane >> 4) * 8,
                          ch = kk * 2 + ((lane >> 3) & 1);
                flash__ldm_x4(b, flash__smem_addr(ks + flash__off<D>(r, ch)));
#pragma unroll
                for (int rg = 0; rg < RG; rg++) {
                    flash__mma(sacc[rg][2 * np], qa[rg], b[0], b[1]);
                    flash__mma(sacc[rg][2 * np + 1], qa[rg], b[2], b[3]);
                }
            }
        }

        /* causal mask, online softmax (rows g, g + 8 of each group; a row's BN keys live in 4
         * lanes): p = 2^(s sc - m sc), one FFMA and one MUFU per score */
        const int key0 = kt * BN;
        uint32_t pa[RG][BN / 16][4]; /* P as A fragments, one per (row group, 16 keys) */
#pragma unroll
        for (int rg = 0; rg < RG; rg++) {
            float mx[2] = {-INFINITY, -INFINITY};
            if (key0 + BN - 1 > pos0) { /* a tile on the diagonal (or past n_keys) */
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (key0 + n * 8 + 2 * t4 + (e & 1) > pos[rg][e >> 1])
                            sacc[rg][n][e] = -INFINITY;
            }
#pragma unroll
            for (int n = 0; n < NT; n++) {
                mx[0] = fmaxf(mx[0], fmaxf(sacc[rg][n][0], sacc[rg][n][1]));
                mx[1] = fmaxf(mx[1], fmaxf(sacc[rg][n][2], sacc[rg][n][3]));
            }
            float corr[2], msc[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(full, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(full, mx[i], 2));
                const float mn = fmaxf(m[rg][i], mx[i]); /* finite: every row sees key 0 */
                /* exactly 1 where the row's maximum stays (most tiles past the first few) */
                corr[i] = mn == m[rg][i] ? 1.0f : flash__ex2((m[rg][i] - mn) * sc);
                m[rg][i] = mn;
                msc[i] = mn * sc;
            }
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const float p0 = flash__ex2(fmaf(sacc[rg][n][0], sc, -msc[0]));
                const float p1 = flash__ex2(fmaf(sacc[rg][n][1], sc, -msc[0]));
                const float p2 = flash__ex2(fmaf(sacc[rg][n][2], sc, -msc[1]));
                const float p3 = flash__ex2(fmaf(sacc[rg][n][3], sc, -msc[1]));
                rs[0] += p0 + p1;
                rs[1] += p2 + p3;
                pa[rg][n / 2][(n & 1) * 2] = flash__pack(p0, p1);
                pa[rg][n / 2][(n & 1) * 2 + 1] = flash__pack(p2, p3);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
                lsum[rg][i] = lsum[rg][i] * corr[i] + rs[i];
            /* rescale O only where some row of the warp's group has a new maximum: skipping a
             * multiplication by exactly 1 changes nothing (4 DT FMULs per thread per tile) */
            if (!__all_sync(full, corr[0] == 1.0f && corr[1] == 1.0f)) {
#pragma unroll
                for (int d = 0; d < DT; d++) {
                    o[rg][d][0] *= corr[0];
                    o[rg][d][1] *= corr[0];
                    o[rg][d][2] *= corr[1];
                    o[rg][d][3] *= corr[1];
                }
            }
        }

        /* O (16 RG rows x D) += P V */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                uint32_t b[4];
                const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                          ch = dp * 2 + (lane >> 4);
                flash__ldm_x4_t(b, flash__smem_addr(vs + flash__off<D>(r, ch)));
#pragma unroll
                for (int rg = 0; rg < RG; rg++) {
                    flash__mma(o[rg][2 * dp], pa[rg][kk], b[0], b[1]);
                    flash__mma(o[rg][2 * dp + 1], pa[rg][kk], b[2], b[3]);
                }
            }
        }
        if constexpr (FP8)
            __syncthreads(); /* the bf16 tile is converted into again next iteration */
    }

    /* ---- normalize and store the valid rows ---- */
#pragma unroll
    for (int rg = 0; rg < RG; rg++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float l2 = lsum[rg][i];
            l2 += __shfl_xor_sync(full, l2, 1);
            l2 += __shfl_xor_sync(full, l2, 2);
            const int r = (warp * RG + rg) * 16 + g + i * 8;
            if (r >= qn)
                continue;
            const float inv = 1.0f / l2;
            float *dst = out + ((size_t)(row0 + r) * H + h) * D + 2 * t4;
#pragma unroll
            for (int d = 0; d < DT; d++)
                *(float2 *)(dst + d * 8) =
                    make_float2(o[rg][d][2 * i] * inv, o[rg][d][2 * i + 1] * inv);
        }
}

/* ==== Hopper kernel: wgmma, a producer warpgroup, mbarrier pipeline (sm_90a only) ==== */

/* FlashAttention-3 style, for bf16 pages, head_dim 128 and an even GQA group: a block of 384
 * threads takes 64 query rows of one sequence for two query heads of one kv head (h0, h0 + 1).
 * Warpgroup 0 is the producer: it gathers each K/V tile of 128 keys from the sequence's pages
 * with cp.async into NS shared-memory stages (the 128-byte swizzled layout wgmma reads) and
 * signals each stage on an mbarrier ("full") once its copies have landed; warpgroups 1 and 2 are
 * consumers, one per query head: S (64 x 128) = Q K^T with wgmma (Q and K from shared memory),
 * causal mask on the diagonal tiles only, online softmax in f32 registers, P rounded to bf16 in
 * registers, O (64 x 128) += P V with wgmma (P from registers, V from shared memory), then an
 * "empty" mbarrier arrival frees the stage. Both heads share every K/V tile in shared memory.
 *
 * Shared memory (offsets from a 1024-byte aligned base; every tile is stored as two column
 * blocks of 64 bf16 (128 bytes) per row, the 16-byte chunk c of row r at chunk c ^ (r % 8):
 * wgmma's 128-byte swizzle): Q of consumer w (64 rows x 128 dims) at 16384 w; stage s: K (128
 * keys x 128 dims) at 32768 + 65536 s, V at 65536 + 65536 s; the mbarriers after the stages. */
#define FWG__THREADS 384
#define FWG__BM 64
#define FWG__BN 128
#define FWG__D 128
/* the variant the launcher picks where the Hopper kernel applies (4: 2 stages, 5: 3 stages) */
#define FWG__DEFAULT 5
#define FWG__SMEM(ns) ((size_t)32768 + (size_t)65536 * (ns) + 16 * (ns) + 1024)

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FWG__ON 1
#else
#define FWG__ON 0
#endif

#if FWG__ON
static __device__ __forceinline__ void fwg__bar_init(uint32_t a, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
}
static __device__ __forceinline__ void fwg__bar_arrive(uint32_t a)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(a)
                 : "memory");
}
/* waits until the phase of parity `parity` of the mbarrier at a has completed */
static __device__ __forceinline__ void fwg__bar_wait(uint32_t a, uint32_t parity)
{
    asm volatile("{\n.reg .pred P1;\nFWG_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 "@P1 bra FWG_DONE;\nbra FWG_WAIT;\nFWG_DONE:\n}\n" ::"r"(a),
                 "r"(parity)
                 : "memory");
}
/* this thread's generic-proxy shared-memory writes (stores, landed cp.async copies) become
 * visible to the async proxy (wgmma) once a barrier orders them */
static __device__ __forceinline__ void fwg__fence_proxy()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* one arrival on the mbarrier at a once every cp.async this thread issued before has landed
 * (noinc: the arrival is one of the count the barrier was initialized with) */
static __device__ __forceinline__ void fwg__cp_arrive(uint32_t a)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(a) : "memory");
}
/* variant 10: box (64 dims, 1 kv head, P tokens, 1 layer-side, 1 page) at coordinates (d0, kvh,
 * tok, ls, page) of the tensor map over the KV arena -> shared dst (1024-byte aligned: the
 * 128-byte swizzle of the box's rows matches the layout wgmma reads), completing on mbarrier bar */
static __device__ __forceinline__ void fwg__tma(uint32_t dst, const CUtensorMap *map, int d0,
                                                int kvh, int tok, int ls, int page, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(d0), "r"(kvh), "r"(tok), "r"(ls), "r"(page), "r"(bar)
                 : "memory");
}
/* variant 10 (LVL bit 8): the TMA copies whole pages, so the last page's tokens past the
 * sequence's context (ctx_len cl, whatever an earlier sequence left there: NaN in the harness)
 * land in the stage too. S masks them (key > every row's position), but P = 0 times a NaN of V
 * is NaN, so before tile kt's products both consumer warpgroups (256 threads, ct = tid - 128)
 * zero those V rows; named barrier 5 orders the stores before either warpgroup's wgmma. Only
 * the tile that holds the tail of a copied page (its first token below n_keys) does this. */
template <int LVL>
static __device__ __forceinline__ void fwg__zero_tail(uint32_t vs, int kt, int cl, int n_keys,
                                                      int P, int ct)
{
    if (!(LVL & 8) || cl % P == 0)
        return;
    const int ps = (cl - 1) / P * P; /* first token of the last page */
    const int r0 = cl - kt * FWG__BN, r1 = ps + P - kt * FWG__BN;
    if (ps >= n_keys || r0 <= 0 || r0 >= FWG__BN)
        return;
    for (int i = ct; i < (r1 - r0) * 16; i += 256) {
        const int r = r0 + (i >> 4), c = i & 15;
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(
                         vs + (uint32_t)((c >> 3) * 16384 + r * 128 + ((c & 7) << 4))),
                     "r"(0)
                     : "memory");
    }
    fwg__fence_proxy();
    asm volatile("bar.sync 5, 256;\n" ::: "memory");
}
/* the accumulators are redefined here: no use of them moves above a wgmma wait */
static __device__ __forceinline__ void fwg__fence_acc(float (&d)[64])
{
#pragma unroll
    for (int i = 0; i < 64; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}
/* wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
 * byte offsets (PTX ISA, "Matrix Descriptor Format") */
static __device__ __forceinline__ uint64_t fwg__desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}
/* d (64 x 128 f32, wgmma accumulator layout) (+)= A B over k16: A (64 x 16 bf16) and B (16 x 128
 * bf16) in shared memory by descriptors; B K-major (tnspB 0) or N-major (1); acc 0 ignores d. */
template <int TB>
static __device__ __forceinline__ void fwg__mma_ss(float (&d)[64], uint64_t da, uint64_t db,
                                                   int acc)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "l"(da), "l"(db), "r"(acc), "n"(TB));
}

/* d (64 x 128 f32) += A B over k16: A (64 x 16 bf16) in registers (the mma.sync m16n8k16 A
 * fragment of each warp's 16 rows), B (16 x 128 bf16) in shared memory, N-major (tnspB 1). */
static __device__ __forceinline__ void fwg__mma_rs(float (&d)[64], const uint32_t (&a)[4],
                                                   uint64_t db)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* The sequence s and its tile j (BM rows each, last tile first) of grid row `target`, found by
 * a warp-wide scan of the tile counts (every lane gets the result); s = -1 past the last. */
static __device__ __forceinline__ void fwg__find_tile(const int32_t *q_start, int n_seqs, int BM,
                                                      int target, int &s, int &j)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    int base = 0;
    s = -1;
    j = 0;
    for (int s0 = 0; s0 < n_seqs; s0 += 32) {
        const int si = s0 + lane;
        const int cnt = si < n_seqs ? (q_start[si + 1] - q_start[si] + BM - 1) / BM : 0;
        int inc = cnt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(full, inc, o);
            if (lane >= o)
                inc += v;
        }
        const int tot = __shfl_sync(full, inc, 31);
        if (target < base + tot) {
            const int L = __ffs(__ballot_sync(full, base + inc > target)) - 1;
            const int before = __shfl_sync(full, inc - cnt, L);
            const int cnt_l = __shfl_sync(full, cnt, L);
            s = s0 + L;
            j = cnt_l - 1 - (target - base - before);
            return;
        }
        base += tot;
    }
}

/* The online-softmax step of one S tile (64 rows x 128 keys, wgmma accumulator layout: element
 * e of 8-key chunk n is row g + 8 (e / 2), key n * 8 + 2 t4 + e % 2): the causal mask where the
 * tile reaches past the block's first row (key0 + 127 > pos0), the new row maxima m (scaled by
 * sc = log2(e) / sqrt(D) in the exponent), corr = 2^(sc (m_old - m_new)) for O and the row sums,
 * sa replaced by P = 2^(sc s - sc m) in f32, rs = this thread's part of the row sums of P. */
static __device__ __forceinline__ void fwg__softmax(float (&sa)[64], int key0, int pos0,
                                                    const int (&pos)[2], int t4, float (&m)[2],
                                                    float sc, float (&corr)[2], float (&rs)[2])
{
    const unsigned full = 0xffffffffu;
    if (key0 + FWG__BN - 1 > pos0) {
#pragma unroll
        for (int n = 0; n < 16; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (key0 + n * 8 + 2 * t4 + (e & 1) > pos[e >> 1])
                    sa[n * 4 + e] = -INFINITY;
    }
    float mx[2] = {-INFINITY, -INFINITY}, msc[2];
#pragma unroll
    for (int n = 0; n < 16; n++) {
        mx[0] = fmaxf(mx[0], fmaxf(sa[n * 4], sa[n * 4 + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(sa[n * 4 + 2], sa[n * 4 + 3]));
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(full, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(full, mx[i], 2));
        const float mn = fmaxf(m[i], mx[i]); /* finite: every row sees key 0 in tile 0 */
        corr[i] = mn == m[i] ? 1.0f : flash__ex2((m[i] - mn) * sc);
        m[i] = mn;
        msc[i] = mn * sc;
        rs[i] = 0.0f;
    }
#pragma unroll
    for (int n = 0; n < 16; n++) {
        sa[n * 4] = flash__ex2(fmaf(sa[n * 4], sc, -msc[0]));
        sa[n * 4 + 1] = flash__ex2(fmaf(sa[n * 4 + 1], sc, -msc[0]));
        sa[n * 4 + 2] = flash__ex2(fmaf(sa[n * 4 + 2], sc, -msc[1]));
        sa[n * 4 + 3] = flash__ex2(fmaf(sa[n * 4 + 3], sc, -msc[1]));
        rs[0] += sa[n * 4] + sa[n * 4 + 1];
        rs[1] += sa[n * 4 + 2] + sa[n * 4 + 3];
    }
}

/* the A-fragment registers stay live (and unmoved) up to here: an async wgmma reads them */
static __device__ __forceinline__ void fwg__fence_pa(uint32_t (&pa)[8][4])
{
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int k = 0; k < 4; k++)
            asm volatile("" : "+r"(pa[i][k])::"memory");
}

/* variant 9's ping-pong of the consumer warpgroups (no-ops without LVL bit 2): wait for this
 * warpgroup's turn to issue wgmma (named barrier 3 + cw), and after the issue hand the turn to
 * the other warpgroup (barrier 3 + 1 - cw), except warpgroup 1's last issue (nobody waits). */
template <int LVL> static __device__ __forceinline__ void fwg__pp_wait(int cw)
{
    if (LVL & 4)
        asm volatile("bar.sync %0, 256;\n" ::"r"(3 + cw) : "memory");
}
template <int LVL> static __device__ __forceinline__ void fwg__pp_done(int cw, bool last)
{
    if ((LVL & 4) && !(last && cw == 1))
        asm volatile("bar.arrive %0, 256;\n" ::"r"(4 - cw) : "memory");
}

#endif /* FWG__ON */

/* grid (n_heads / 2, n_tiles) with n_tiles >= sum over sequences of ceil(q_len / 64), block
 * FWG__THREADS, dynamic shared memory FWG__SMEM(NS). Arguments as flash__kernel; bf16 pages,
 * head_dim 128, (n_heads / n_kv_heads) even. Compiled for sm_90a only (elsewhere it traps: the
 * launcher never starts it there). */
template <int NS, int LVL>
static __global__ void __launch_bounds__(FWG__THREADS, 1)
    fwg__kernel(float *out, const float *q, const uint8_t *arena, kv_layout_t l, int layer,
                const int32_t *q_start, const int32_t *ctx_len, const int32_t *block_tables,
                int n_seqs, int max_pages, int n_heads, const __grid_constant__ CUtensorMap kvmap)
{
#if FWG__ON
    constexpr int D = FWG__D, BM = FWG__BM, BN = FWG__BN;
    extern __shared__ __align__(1024) unsigned char fwg__smem[];
    const uint32_t raw = flash__smem_addr(fwg__smem);
    const uint32_t sbase = (raw + 1023u) & ~1023u;
    const uint32_t kv0 = sbase + 32768u, bars = sbase + 32768u + 65536u * NS;
    /* full[s] at bars + 8 s, empty[s] at bars + 8 (NS + s) */
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int H = n_heads, KVH = l.n_kv_heads, h0 = 2 * blockIdx.x, kvh = h0 / (H / KVH);

    int s, j;
    fwg__find_tile(q_start, n_seqs, BM, blockIdx.y, s, j);
    if (s < 0)
        return; /* the grid's spare tiles (uniform over the block) */
    const int q_len = q_start[s + 1] - q_start[s], row0 = q_start[s] + j * BM;
    const int qn = min(BM, q_len - j * BM);       /* valid rows of this tile */
    const int pos0 = ctx_len[s] - q_len + j * BM; /* position of the tile's row 0 */
    const int n_keys = pos0 + qn;                 /* keys the last valid row sees */
    const int n_kt = (n_keys + BN - 1) / BN;
    const int cl = ctx_len[s]; /* the sequence's context (variant 10's tail, fwg__zero_tail) */

    if (tid == 0) {
        for (int i = 0; i < NS; i++) {
            fwg__bar_init(bars + 8 * i, LVL & 8 ? 1 : 128); /* the producer's threads */
            fwg__bar_init(bars + 8 * (NS + i), 2 * 128); /* both consumers' threads */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0 && (LVL & 8)) {
        /* ---- producer of variant 10: thread 0 alone copies each tile with TMA, one box per
         * (page, 64-dim column block, side): BN / P pages of P tokens, whole pages (the tail
         * past the context is zeroed by the consumers, fwg__zero_tail); a page that starts at or
         * past n_keys is not read: its box is asked at token P, out of bounds, which TMA fills
         * with zeros. The stage's "full" barrier (count 1) completes when this thread's
         * expect_tx arrival and all the boxes' bytes (64 KiB) have landed. ---- */
        if (LVL & 2) /* as the other producer: the consumers take the registers */
            asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
        if (tid != 0)
            return;
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&kvmap) : "memory");
        const int32_t *bt = block_tables + (size_t)s * max_pages;
        const int P = l.page_tokens, ppt = BN / P;
        for (int kt = 0; kt < n_kt; kt++) {
            const int st = kt % NS;
            if (kt >= NS) /* the consumers are done with tile kt - NS */
                fwg__bar_wait(bars + 8 * (NS + st), (uint32_t)((kt / NS - 1) & 1));
            const uint32_t full = bars + 8 * st, kd = kv0 + 65536u * st;
            mma_bar_expect(full, 65536u);
            for (int i = 0; i < ppt; i++) {
                const int t0 = kt * BN + i * P;
                const bool live = t0 < n_keys;
                const int pid = live ? bt[t0 / P] : 0, tok = live ? 0 : P;
                const uint32_t d = kd + (uint32_t)(i * P * 128);
                for (int c = 0; c < 2; c++) {
                    fwg__tma(d + 16384u * c, &kvmap, 64 * c, kvh, tok, 2 * layer, pid, full);
                    fwg__tma(d + 32768u + 16384u * c, &kvmap, 64 * c, kvh, tok, 2 * layer + 1,
                             pid, full);
                }
            }
        }
        return;
    }
    if (wg == 0) {
        /* ---- producer: thread t copies 16-byte chunk t % 16 of keys t / 16 + 8 i, i < 16, of
         * every tile (K and V); those rows share their swizzle (row % 8 = t / 16) ---- */
        const int ch = tid & 15, rb = tid >> 4;
        const uint32_t soff = (uint32_t)((ch >> 3) * 16384 + rb * 128 + (((ch & 7) ^ rb) << 4));
        const int32_t *bt = block_tables + (size_t)s * max_pages;
        const size_t koff = kutil_kv_data_off(l, layer, 0) + (size_t)ch * 16,
                     voff = kutil_kv_data_off(l, layer, 1) + (size_t)ch * 16;
        const int P = l.page_tokens;
        const bool p2 = (P & (P - 1)) == 0;
        const int ps = __ffs(P) - 1;
        if (LVL & 2) /* the consumers take the registers (setmaxnreg.inc below) */
            asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
        if (LVL & 1) {
            /* variants 6 / 7: the tile's 16 page ids are read first (independent loads, issued
             * before the wait for a free stage), and each thread's copies arrive on the stage's
             * "full" barrier by themselves when they land (cp.async.mbarrier.arrive.noinc): the
             * producer runs up to NS tiles ahead without waiting on its own copies */
            for (int kt = 0; kt < n_kt; kt++) {
                const int st = kt % NS;
                int pid[16];
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const int t = kt * BN + rb + 8 * i, tt = t < n_keys ? t : 0;
                    pid[i] = __ldg(bt + (p2 ? tt >> ps : tt / P));
                }
                if (kt >= NS)
                    fwg__bar_wait(bars + 8 * (NS + st), (uint32_t)((kt / NS - 1) & 1));
                const uint32_t kd = kv0 + 65536u * st + soff;
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const int t = kt * BN + rb + 8 * i;
                    const bool valid = t < n_keys;
                    const int pt = p2 ? t & (P - 1) : t % P;
                    const uint8_t *page = arena + (size_t)pid[i] * l.page_bytes;
                    const size_t e = ((size_t)pt * KVH + kvh) * D * 2; /* bytes */
                    flash__cp16(kd + 1024u * i, valid ? page + koff + e : arena, valid ? 16 : 0);
                    flash__cp16(kd + 32768u + 1024u * i, valid ? page + voff + e : arena,
                                valid ? 16 : 0);
                }
                fwg__cp_arrive(bars + 8 * st);
            }
            flash__cp_wait<0>();
        } else {
            for (int kt = 0; kt < n_kt; kt++) {
                const int st = kt % NS;
                if (kt >= NS) /* the consumers are done with tile kt - NS */
                    fwg__bar_wait(bars + 8 * (NS + st), (uint32_t)((kt / NS - 1) & 1));
                const uint32_t kd = kv0 + 65536u * st + soff;
#pragma unroll 4
                for (int i = 0; i < 16; i++) {
                    const int t = kt * BN + rb + 8 * i;
                    const bool valid = t < n_keys;
                    const int tt = valid ? t : 0;
                    const int pg = p2 ? tt >> ps : tt / P, pt = p2 ? tt & (P - 1) : tt % P;
                    const uint8_t *page = arena + (size_t)bt[pg] * l.page_bytes;
                    const size_t e = ((size_t)pt * KVH + kvh) * D * 2; /* bytes */
                    flash__cp16(kd + 1024u * i, valid ? page + koff + e : arena, valid ? 16 : 0);
                    flash__cp16(kd + 32768u + 1024u * i, valid ? page + voff + e : arena,
                                valid ? 16 : 0);
                }
                flash__cp_commit();
                if (kt > 0) { /* tile kt - 1 has landed: publish it */
                    flash__cp_wait<1>();
                    fwg__fence_proxy();
                    fwg__bar_arrive(bars + 8 * ((kt - 1) % NS));
                }
            }
            flash__cp_wait<0>();
            fwg__fence_proxy();
            fwg__bar_arrive(bars + 8 * ((n_kt - 1) % NS));
        }
        return;
    }

    /* ---- consumer warpgroup cw: query head h0 + cw ---- */
    if (LVL & 2)
        asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    const int cw = wg - 1, h = h0 + cw, wt = tid & 127, w4 = wt >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const unsigned full = 0xffffffffu;
    const uint32_t qsm = sbase + 16384u * cw;
    /* Q (64 rows, f32 -> bf16; rows >= qn zero) into its swizzled tile */
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int idx = wt + 128 * i, r = idx >> 4, c = idx & 15;
        uint4 w = make_uint4(0, 0, 0, 0);
        if (r < qn) {
            const float4 *src = (const float4 *)(q + ((size_t)(row0 + r) * H + h) * D + c * 8);
            const float4 a = src[0], b = src[1];
            w = make_uint4(flash__pack(a.x, a.y), flash__pack(a.z, a.w), flash__pack(b.x, b.y),
                           flash__pack(b.z, b.w));
        }
        const uint32_t so =
            qsm + (uint32_t)((c >> 3) * 8192 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(so), "r"(w.x), "r"(w.y),
                     "r"(w.z), "r"(w.w)
                     : "memory");
    }
    fwg__fence_proxy();
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cw) : "memory");

    /* this thread's rows: w4 * 16 + g and + 8 of the warpgroup's 64 */
    int pos[2];
#pragma unroll
    for (int i = 0; i < 2; i++)
        pos[i] = pos0 + min(w4 * 16 + g + 8 * i, qn - 1);   /* padding rows repeat the last */
    const float sc = 1.4426950408889634f / sqrtf((float)D); /* log2(e) / sqrt(D) */
    float o[64], m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 64; i++)
        o[i] = 0.0f;

    if (LVL & 2) {
        /* variants 7 / 8 / 9: S(kt) = Q K(kt)^T is issued together with O += P(kt - 1)
         * V(kt - 1), and the softmax of S(kt) runs while the PV product is still on the tensor
         * cores (FA3's intra-warpgroup overlap); P stays f32 in sacc until the PV product has
         * read the previous P's registers. Variant 9 (LVL bit 2) also orders the two consumer
         * warpgroups' issues (ping-pong): warpgroup cw issues only after named barrier 3 + cw
         * (256 threads: its own 128 wait, the other's 128 arrive after their issue), so one
         * warpgroup's softmax runs while the other's products run. Each warpgroup issues
         * n_kt + 1 times (the first S, n_kt - 1 loop steps, the last PV); warpgroup 1 arrives
         * once up front and skips its last arrival, so every barrier's counts match. */
        float sacc[64];
        uint32_t pa[8][4];
        float corr[2], rs[2];
        if ((LVL & 4) && cw == 1) /* warpgroup 0 issues first */
            asm volatile("bar.arrive 3, 256;\n" ::: "memory");
        fwg__bar_wait(bars, 0u);
        if (LVL & 1) /* the copies arrived by themselves (v7); v8's producer fenced them */
            fwg__fence_proxy();
        fwg__zero_tail<LVL>(kv0 + 32768u, 0, cl, n_keys, l.page_tokens, tid - 128);
        fwg__pp_wait<LVL>(cw);
        mma_wg_fence();
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
            fwg__mma_ss<0>(sacc, fwg__desc(qsm + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024),
                           fwg__desc(kv0 + (kk >> 2) * 16384 + (kk & 3) * 32, 16, 1024), kk > 0);
        mma_wg_commit();
        fwg__pp_done<LVL>(cw, false);
        mma_wg_wait<0>();
        fwg__fence_acc(sacc);
        fwg__softmax(sacc, 0, pos0, pos, t4, m, sc, corr, rs);
        lsum[0] = rs[0];
        lsum[1] = rs[1];
#pragma unroll
        for (int n = 0; n < 16; n++) {
            pa[n >> 1][(n & 1) * 2] = flash__pack(sacc[n * 4], sacc[n * 4 + 1]);
            pa[n >> 1][(n & 1) * 2 + 1] = flash__pack(sacc[n * 4 + 2], sacc[n * 4 + 3]);
        }
        for (int kt = 1; kt < n_kt; kt++) {
            const int st = kt % NS, sp = (kt - 1) % NS;
            const uint32_t ks = kv0 + 65536u * st, vp = kv0 + 65536u * sp + 32768u;
            fwg__bar_wait(bars + 8 * st, (uint32_t)((kt / NS) & 1));
            if (LVL & 1)
                fwg__fence_proxy();
            fwg__zero_tail<LVL>(ks + 32768u, kt, cl, n_keys, l.page_tokens, tid - 128);
            fwg__pp_wait<LVL>(cw);
            mma_wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
                fwg__mma_ss<0>(sacc, fwg__desc(qsm + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024),
                               fwg__desc(ks + (kk >> 2) * 16384 + (kk & 3) * 32, 16, 1024), kk > 0);
            mma_wg_commit();
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
                fwg__mma_rs(o, pa[kk], fwg__desc(vp + kk * 2048, 16384, 1024));
            mma_wg_commit();
            fwg__pp_done<LVL>(cw, false);
            mma_wg_wait<1>(); /* S(kt) is done; P(kt - 1) V(kt - 1) may still run */
            fwg__fence_acc(sacc);
            fwg__softmax(sacc, kt * BN, pos0, pos, t4, m, sc, corr, rs);
            mma_wg_wait<0>();
            fwg__fence_acc(o);
            fwg__fence_pa(pa);
            fwg__bar_arrive(bars + 8 * (NS + sp)); /* this thread is done with tile kt - 1 */
#pragma unroll
            for (int i = 0; i < 2; i++)
                lsum[i] = lsum[i] * corr[i] + rs[i];
            if (!__all_sync(full, corr[0] == 1.0f && corr[1] == 1.0f)) {
#pragma unroll
                for (int n = 0; n < 16; n++) {
                    o[n * 4] *= corr[0];
                    o[n * 4 + 1] *= corr[0];
                    o[n * 4 + 2] *= corr[1];
                    o[n * 4 + 3] *= corr[1];
                }
            }
#pragma unroll
            for (int n = 0; n < 16; n++) {
                pa[n >> 1][(n & 1) * 2] = flash__pack(sacc[n * 4], sacc[n * 4 + 1]);
                pa[n >> 1][(n & 1) * 2 + 1] = flash__pack(sacc[n * 4 + 2], sacc[n * 4 + 3]);
            }
        }
        {
            const int sp = (n_kt - 1) % NS;
            const uint32_t vp = kv0 + 65536u * sp + 32768u;
            fwg__pp_wait<LVL>(cw);
            mma_wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
                fwg__mma_rs(o, pa[kk], fwg__desc(vp + kk * 2048, 16384, 1024));
            mma_wg_commit();
            fwg__pp_done<LVL>(cw, true);
            mma_wg_wait<0>();
            fwg__fence_acc(o);
            fwg__fence_pa(pa);
            fwg__bar_arrive(bars + 8 * (NS + sp));
        }
    }
    for (int kt = 0; !(LVL & 2) && kt < n_kt; kt++) {
        const int st = kt % NS;
        const uint32_t ks = kv0 + 65536u * st, vs = ks + 32768u;
        fwg__bar_wait(bars + 8 * st, (uint32_t)((kt / NS) & 1));
        if (LVL & 1) /* the producer's copies arrived by themselves: no producer-side fence */
            fwg__fence_proxy();
        fwg__zero_tail<LVL>(vs, kt, cl, n_keys, l.page_tokens, tid - 128);

        /* S (64 x 128 keys) = Q K^T, raw: K-major A and B, k16 steps along the 128 dims (two
         * 64-dim column blocks, 32 bytes per step inside a swizzled row) */
        float sacc[64];
        mma_wg_fence();
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
            fwg__mma_ss<0>(sacc, fwg__desc(qsm + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024),
                           fwg__desc(ks + (kk >> 2) * 16384 + (kk & 3) * 32, 16, 1024), kk > 0);
        mma_wg_commit();
        mma_wg_wait<0>();
        fwg__fence_acc(sacc);

        /* causal mask (diagonal tiles), online softmax; element e of 8-key chunk n: row
         * g + 8 (e / 2), key n * 8 + 2 t4 + e % 2 */
        const int key0 = kt * BN;
        if (key0 + BN - 1 > pos0) {
#pragma unroll
            for (int n = 0; n < 16; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (key0 + n * 8 + 2 * t4 + (e & 1) > pos[e >> 1])
                        sacc[n * 4 + e] = -INFINITY;
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 16; n++) {
            mx[0] = fmaxf(mx[0], fmaxf(sacc[n * 4], sacc[n * 4 + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(sacc[n * 4 + 2], sacc[n * 4 + 3]));
        }
        float corr[2], msc[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(full, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(full, mx[i], 2));
            const float mn = fmaxf(m[i], mx[i]); /* finite: every row sees key 0 in tile 0 */
            corr[i] = mn == m[i] ? 1.0f : flash__ex2((m[i] - mn) * sc);
            m[i] = mn;
            msc[i] = mn * sc;
        }
        uint32_t pa[8][4]; /* P as wgmma A fragments, one per 16 keys */
#pragma unroll
        for (int n = 0; n < 16; n++) {
            const float p0 = flash__ex2(fmaf(sacc[n * 4], sc, -msc[0]));
            const float p1 = flash__ex2(fmaf(sacc[n * 4 + 1], sc, -msc[0]));
            const float p2 = flash__ex2(fmaf(sacc[n * 4 + 2], sc, -msc[1]));
            const float p3 = flash__ex2(fmaf(sacc[n * 4 + 3], sc, -msc[1]));
            rs[0] += p0 + p1;
            rs[1] += p2 + p3;
            pa[n >> 1][(n & 1) * 2] = flash__pack(p0, p1);
            pa[n >> 1][(n & 1) * 2 + 1] = flash__pack(p2, p3);
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
            lsum[i] = lsum[i] * corr[i] + rs[i];
        if (!__all_sync(full, corr[0] == 1.0f && corr[1] == 1.0f)) {
#pragma unroll
            for (int n = 0; n < 16; n++) {
                o[n * 4] *= corr[0];
                o[n * 4 + 1] *= corr[0];
                o[n * 4 + 2] *= corr[1];
                o[n * 4 + 3] *= corr[1];
            }
        }

        /* O += P V: V (128 keys x 128 dims) N-major, k16 steps of 16 keys (2048 bytes); the
         * two 64-dim column blocks 16384 bytes apart (leading byte offset) */
        mma_wg_fence();
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
            fwg__mma_rs(o, pa[kk], fwg__desc(vs + kk * 2048, 16384, 1024));
        mma_wg_commit();
        mma_wg_wait<0>();
        fwg__fence_acc(o);
        fwg__bar_arrive(bars + 8 * (NS + st)); /* this thread is done with the stage */
    }

    /* ---- normalize and store the valid rows ---- */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float l2 = lsum[i];
        l2 += __shfl_xor_sync(full, l2, 1);
        l2 += __shfl_xor_sync(full, l2, 2);
        const int r = w4 * 16 + g + 8 * i;
        if (r >= qn)
            continue;
        const float inv = 1.0f / l2;
        float *dst = out + ((size_t)(row0 + r) * H + h) * D + 2 * t4;
#pragma unroll
        for (int n = 0; n < 16; n++)
            *(float2 *)(dst + n * 8) =
                make_float2(o[n * 4 + 2 * i] * inv, o[n * 4 + 2 * i + 1] * inv);
    }
#else
    __trap(); /* not built for sm_90a: the launcher checks PD_CUDA_HAVE_SM90A first */
#endif
}

/* ==== launcher ==== */

extern "C" bool attention_flash_supports(const kv_layout_t *l, int n_heads)
{
    return (l->fmt == PD_KV_BF16 || l->fmt == PD_KV_FP8) &&
           (l->head_dim == 64 || l->head_dim == 128) && l->n_kv_heads > 0 && n_heads > 0 &&
           n_heads % l->n_kv_heads == 0;
}

template <class C>
static pd_status_t flash__launch(float *out, const float *q, const void *arena,
                                 const kv_layout_t *l, int layer, const pd_attn_batch_t *b,
                                 int n_rows, int n_heads, cudaStream_t stream)
{
    static unsigned attr_set; /* per device (kutil_allow_smem) */
    pd_status_t st = kutil_allow_smem((const void *)flash__kernel<C>, (int)C::SMEM, &attr_set,
                                      "attention_flash smem");
    if (st != PD_OK)
        return st;
    /* an upper bound of the tiles: every sequence adds at most one partial tile */
    const long tiles = (long)n_rows / C::BM + b->n_seqs;
    KUTIL_REQUIRE(tiles <= 65535, "attention_flash");
    flash__kernel<C><<<dim3((unsigned)n_heads, (unsigned)tiles), FLASH__THREADS, C::SMEM, stream>>>(
        out, q, (const uint8_t *)arena, *l, layer, b->q_start, b->ctx_len, b->block_tables,
        b->n_seqs, b->max_pages, n_heads);
    return KUTIL_LAUNCHED("attention_flash");
}

/* Whether the Hopper kernel (fwg__kernel) takes this batch on the current device: built for
 * sm_90a (meson's cuda_arch lists 90a: PD_CUDA_HAVE_SM90A), a compute capability 9.0 device,
 * bf16 pages, head_dim 128 and an even number of query heads per kv head. */
static bool fwg__usable(const kv_layout_t *l, int n_heads)
{
#ifdef PD_CUDA_HAVE_SM90A
    if (l->fmt != PD_KV_BF16 || l->head_dim != 128 || (n_heads / l->n_kv_heads) % 2 != 0)
        return false;
    return kutil_device_cc() == 90;
#else
    (void)l;
    (void)n_heads;
    return false;
#endif
}

/* variant 10's tensor map over the KV arena (bf16, 5 dimensions, innermost first): head dims
 * (D, contiguous), kv heads (stride D * 2 bytes), tokens of a page (KVH D 2), layer-sides
 * (side_bytes), pages (page_bytes), from the first page's data (after its header); boxes of 64
 * dims x 1 head x P tokens, 128-byte swizzle, zeros out of bounds. The driver's encoder is
 * reached through the runtime (no link to libcuda). */
static pd_status_t fwg__kvmap(CUtensorMap *map, const void *arena, const kv_layout_t *l)
{
    PFN_cuTensorMapEncodeTiled_v12000 encode = kutil_tmap_encoder();
    if (!encode)
        return kutil_status(cudaErrorNotSupported, "attention_flash tensor map encoder");
    const cuuint64_t D = (cuuint64_t)l->head_dim, KVH = (cuuint64_t)l->n_kv_heads;
    const cuuint64_t dims[5] = {D, KVH, (cuuint64_t)l->page_tokens,
                                (cuuint64_t)l->n_layers * (cuuint64_t)l->n_sides, 1ull << 30};
    const cuuint64_t strides[4] = {D * 2, KVH * D * 2, (cuuint64_t)l->side_bytes,
                                   (cuuint64_t)l->page_bytes};
    const cuuint32_t box[5] = {64, 1, (cuuint32_t)l->page_tokens, 1, 1};
    const cuuint32_t es[5] = {1, 1, 1, 1, 1};
    const CUresult r =
        encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5,
               (void *)((const uint8_t *)arena + KV_PAGE_HEADER_BYTES), dims, strides, box, es,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return kutil_status(cudaErrorInvalidValue, "attention_flash tensor map");
    return PD_OK;
}

/* variant 10 applies where whole pages tile a 128-key tile at 1024-byte boundaries */
static bool fwg__tma_usable(const kv_layout_t *l)
{
    const int P = l->page_tokens;
    return P >= 8 && FWG__BN % P == 0 && l->n_sides == 2 && l->page_bytes % 16 == 0;
}

template <int NS, int LVL>
static pd_status_t fwg__launch(float *out, const float *q, const void *arena, const kv_layout_t *l,
                               int layer, const pd_attn_batch_t *b, int n_rows, int n_heads,
                               cudaStream_t stream)
{
    static unsigned attr_set; /* per device (kutil_allow_smem) */
    pd_status_t st = kutil_allow_smem((const void *)fwg__kernel<NS, LVL>, (int)FWG__SMEM(NS),
                                      &attr_set, "attention_flash smem");
    if (st != PD_OK)
        return st;
    const long tiles = (long)n_rows / FWG__BM + b->n_seqs;
    KUTIL_REQUIRE(tiles <= 65535, "attention_flash");
    CUtensorMap map;
    memset(&map, 0, sizeof map);
    if (LVL & 8) {
        KUTIL_REQUIRE(fwg__tma_usable(l), "attention_flash variant 10 (page size)");
        st = fwg__kvmap(&map, arena, l);
        if (st != PD_OK)
            return st;
    }
    fwg__kernel<NS, LVL>
        <<<dim3((unsigned)(n_heads / 2), (unsigned)tiles), FWG__THREADS, FWG__SMEM(NS), stream>>>(
            out, q, (const uint8_t *)arena, *l, layer, b->q_start, b->ctx_len, b->block_tables,
            b->n_seqs, b->max_pages, n_heads, map);
    return KUTIL_LAUNCHED("attention_flash");
}

/* The variants (PD_CUDA_FLASH_VARIANT=0..9; when unset: FWG__DEFAULT where fwg__usable, else
 * flash__pick chooses 3 or 0):
 *   0: 64 query rows, 64-key tiles, Q in registers, 2 blocks per SM;
 *   1: 64 query rows, 32-key tiles, Q in registers, 3 blocks per SM;
 *   2: 64 query rows, 32-key tiles, Q read from shared memory per tile, 4 blocks per SM by
 *      registers (3 by shared memory since the third bf16 K/V buffer);
 *   3: 128 query rows (two row groups per warp share each K/V fragment), 32-key tiles, Q read
 *      from shared memory per tile, 2 blocks per SM;
 *   4: the Hopper kernel (fwg__kernel), 2 K/V stages; 5: the same, 3 stages; 6: 3 stages, the
 *      producer's page ids read ahead and its copies arriving on the mbarriers by themselves
 *      (cp.async.mbarrier.arrive.noinc); 7: 6 + the consumers' S(kt) issued with P(kt-1) V(kt-1)
 *      and the softmax overlapping that product, registers moved from the producer to the
 *      consumers (setmaxnreg 56 / 224). Where the Hopper kernel does not apply, 4..9 take the
 *      default choice. Measured on one H200 (docs/performance.md, session 6), 8192 causal: v5
 *      1375 us, v6 1484 us, v7 1496 us; 16 x 512: 205 / 207 / 205 us. So 5 stays the default and
 *      6 / 7 are reached only through PD_CUDA_FLASH_VARIANT (experiments).
 *   8: v5's producer (wait-then-signal copies) with v7's consumer (overlap + setmaxnreg), so the
 *      overlap is measured alone; 9: 8 + the two consumer warpgroups in ping-pong (named barriers
 *      3 / 4 order their wgmma issues). LVL of fwg__kernel<NS, LVL> is a bit mask: 1 = v6's
 *      producer, 2 = v7's consumer, 4 = ping-pong (with 2). 8 / 9: not measured yet.
 *   10: the TMA producer (LVL bit 8: one thread, fwg__kvmap's tensor map, the consumers zero the
 *      V rows past the context); 11: the same with 2 stages; 12: 10 + v8's consumer. Pages of
 *      8..128 tokens dividing 128 (fwg__tma_usable), else v5. Measured on one H100 (session 17,
 *      8192 causal): v5 1371 us, v10 1518, v11 1514, v12 1476; correct (the harness's poisoned
 *      tails), not routed. */

/* Measured on one H200 (docs/performance.md, 2026-12-01), one layer of Llama-3-8B: variant 3 is
 * the fastest where its 128-row blocks fill the GPU (8192 causal: 2.19 ms vs 2.72 ms for 0), but
 * a 512-row chunk has only 4 x 32 such blocks for 132 SMs and runs best as variant 0 (345 us vs
 * 384 us). So: 3 when the batch gives at least two waves of 128-row blocks (2 per SM), else 0. */
static int flash__pick(int n_rows, int n_heads)
{
    static int n_sm[32];
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < 32) {
        if (!n_sm[dev] &&
            cudaDeviceGetAttribute(&n_sm[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            n_sm[dev] = 0;
        if (n_sm[dev] > 0)
            sms = n_sm[dev];
    }
    return (long)(n_rows / 128) * n_heads >= 4L * sms ? 3 : 0;
}

template <int D, int FMT>
static pd_status_t flash__variant(int v, float *out, const float *q, const void *arena,
                                  const kv_layout_t *l, int layer, const pd_attn_batch_t *b,
                                  int n_rows, int n_heads, cudaStream_t stream)
{
    switch (v) {
    case 1:
        return flash__launch<flash__cfg<D, FMT, 32, true, 3>>(out, q, arena, l, layer, b, n_rows,
                                                              n_heads, stream);
    case 2:
        return flash__launch<flash__cfg<D, FMT, 32, false, 4>>(out, q, arena, l, layer, b, n_rows,
                                                               n_heads, stream);
    case 3:
        return flash__launch<flash__cfg<D, FMT, 32, false, 2, 2>>(out, q, arena, l, layer, b,
                                                                  n_rows, n_heads, stream);
    default:
        return flash__launch<flash__cfg<D, FMT, 64, true, 2>>(out, q, arena, l, layer, b, n_rows,
                                                              n_heads, stream);
    }
}

extern "C" pd_status_t attention_flash_run(float *out, const float *q, const void *arena,
                                           const kv_layout_t *l, int layer,
                                           const pd_attn_batch_t *batch, int n_rows, int n_heads,
                                           cudaStream_t stream)
{
    return attention_flash_run_variant(out, q, arena, l, layer, batch, n_rows, n_heads, -1, stream);
}

extern "C" pd_status_t attention_flash_run_variant(float *out, const float *q, const void *arena,
                                                   const kv_layout_t *l, int layer,
                                                   const pd_attn_batch_t *batch, int n_rows,
                                                   int n_heads, int variant, cudaStream_t stream)
{
    KUTIL_REQUIRE(attention_flash_supports(l, n_heads), "attention_flash");
    KUTIL_REQUIRE(n_rows >= 0 && batch->n_seqs > 0 && layer >= 0 && layer < l->n_layers,
                  "attention_flash");
    if (n_rows == 0)
        return PD_OK;
    const char *env = getenv("PD_CUDA_FLASH_VARIANT");
    int v = env                       ? atoi(env)
            : variant >= 0            ? variant
            : fwg__usable(l, n_heads) ? FWG__DEFAULT
                                      : flash__pick(n_rows, n_heads);
    if (v >= 10 && v <= 12 && fwg__usable(l, n_heads) && fwg__tma_usable(l))
        switch (v) { /* the TMA producer (session 17, not yet measured) */
        case 10:
            return fwg__launch<3, 8>(out, q, arena, l, layer, batch, n_rows, n_heads, stream);
        case 11:
            return fwg__launch<2, 8>(out, q, arena, l, layer, batch, n_rows, n_heads, stream);
        default: /* 12: + v8's consumer (S(kt) with P(kt - 1) V(kt - 1), setmaxnreg) */
            return fwg__launch<3, 10>(out, q, arena, l, layer, batch, n_rows, n_heads, stream);
        }
    if (v >= 10 && v <= 12)
        v = FWG__DEFAULT; /* the TMA producer does not apply: v5 where the Hopper kernel does */
    if (v >= 4 && v <= 9) { /* the Hopper kernel, where it applies; else the default choice */
        if (fwg__usable(l, n_heads))
            switch (v) {
            case 4:
                return fwg__launch<2, 0>(out, q, arena, l, layer, batch, n_rows, n_heads, stream);
            case 5:
                return fwg__launch<3, 0>(out, q, arena, l, layer, batch, n_rows, n_heads, stream);
            case 6:
                return fwg__launch<3, 1>(out, q, arena, l, layer, batch, n_rows, n_heads, stream);
            case 7:
                return fwg__launch<3, 3>(out, q, arena, l, layer, batch, n_rows, n_heads, stream);
            case 9:
                return fwg__launch<3, 6>(out, q, arena, l, layer, batch, n_rows, n_heads, stream);
            default: /* 8 */
                return fwg__launch<3, 2>(out, q, arena, l, layer, batch, n_rows, n_heads, stream);
            }
        v = flash__pick(n_rows, n_heads);
    }
    const bool fp8 = l->fmt == PD_KV_FP8;
    if (l->head_dim == 128)
        return fp8 ? flash__variant<128, PD_KV_FP8>(v, out, q, arena, l, layer, batch, n_rows,
                                                    n_heads, stream)
                   : flash__variant<128, PD_KV_BF16>(v, out, q, arena, l, layer, batch, n_rows,
                                                     n_heads, stream);
    return fp8 ? flash__variant<64, PD_KV_FP8>(v, out, q, arena, l, layer, batch, n_rows, n_heads,
                                               stream)
               : flash__variant<64, PD_KV_BF16>(v, out, q, arena, l, layer, batch, n_rows, n_heads,
                                                stream);
}
