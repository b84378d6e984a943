/* attention: paged causal GQA attention with optional sequence splits (see attention.h). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention.h"
#include "kutil.cuh"

#define ATTENTION__WARPS 4
#define ATTENTION__MAX_GROUP 8

/* ==== kernels ==== */

/* Loads elements [lane * DL, lane * DL + DL) of one (token, head) vector starting at byte p
 * (kv dtype FMT) as f32; fp8 values are multiplied by scale. */
template <int FMT, int DL>
static __device__ __forceinline__ void attention__load(float *dst, const uint8_t *p, int lane,
                                                       float scale)
{
    if constexpr (FMT == PD_KV_F32) {
        const float *s = (const float *)p + lane * DL;
#pragma unroll
        for (int i = 0; i < DL; i += 2) {
            if constexpr (DL >= 4) {
                if (i % 4 == 0) {
                    const float4 v = *(const float4 *)(s + i);
                    dst[i] = v.x, dst[i + 1] = v.y, dst[i + 2] = v.z, dst[i + 3] = v.w;
                }
            } else {
                const float2 v = *(const float2 *)(s + i);
                dst[i] = v.x, dst[i + 1] = v.y;
            }
        }
    } else if constexpr (FMT == PD_KV_BF16) {
        const uint16_t *s = (const uint16_t *)p + lane * DL;
        uint32_t w[DL / 2];
        if constexpr (DL == 8) {
            const uint4 v = *(const uint4 *)s;
            w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
        } else if constexpr (DL == 4) {
            const uint2 v = *(const uint2 *)s;
            w[0] = v.x, w[1] = v.y;
        } else {
#pragma unroll
            for (int i = 0; i < DL / 2; i++)
                w[i] = ((const uint32_t *)s)[i];
        }
#pragma unroll
        for (int i = 0; i < DL / 2; i++) {
            dst[2 * i] = __uint_as_float(w[i] << 16);
            dst[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    } else {
        const uint8_t *s = p + lane * DL;
        uint8_t b[DL];
        if constexpr (DL == 8) {
            const uint2 v = *(const uint2 *)s;
            *(uint2 *)b = v;
        } else if constexpr (DL == 4) {
            *(uint32_t *)b = *(const uint32_t *)s;
        } else {
#pragma unroll
            for (int i = 0; i < DL; i++)
                b[i] = s[i];
        }
#pragma unroll
        for (int i = 0; i < DL; i++)
            dst[i] = kutil_fp8_to_f32(b[i]) * scale;
    }
}

/* grid (n_rows, n_kv_heads, n_splits), block 32 * ATTENTION__WARPS, dynamic shared memory
 * ATTENTION__WARPS * group * (head_dim + 2) f32.
 * out (n_rows, n_heads, D) f32 [n_splits == 1]; part (n_splits, n_rows, n_heads, D + 2) f32
 * [n_splits > 1: unnormalized o, then m, l]; q (n_rows, n_heads, D) f32; arena pages (layout l);
 * q_start (n_seqs + 1), ctx_len (n_seqs), block_tables (n_seqs, max_pages) int32. */
template <int FMT, int DL>
static __global__ void __launch_bounds__(32 * ATTENTION__WARPS)
    attention__kernel(float *out, float *part, const float *q, const uint8_t *arena, kv_layout_t l,
                      int layer, const int32_t *q_start, const int32_t *ctx_len,
                      const int32_t *block_tables, int n_seqs, int max_pages, int n_heads,
                      int chunk)
{
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): everything after reads earlier kernels' data */
    kutil_pdl_trigger();
    constexpr int D = DL * 32;
    extern __shared__ float attention__smem[];
    const int r = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z, n_rows = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int H = n_heads, G = n_heads / l.n_kv_heads, KVH = l.n_kv_heads, P = l.page_tokens;
    const float scale = 1.0f / sqrtf((float)D);

    /* the sequence of row r: first s with q_start[s + 1] > r */
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (q_start[mid + 1] > r)
            hi = mid;
        else
            lo = mid + 1;
    }
    const int s = lo;
    const int q_len = q_start[s + 1] - q_start[s];
    const int n_tok = ctx_len[s] - q_len + (r - q_start[s]) + 1;
    const int t_begin = sp * chunk, t_end = min(n_tok, t_begin + chunk);
    const int32_t *bt = block_tables + (size_t)s * max_pages;

    float qr[ATTENTION__MAX_GROUP][DL], acc[ATTENTION__MAX_GROUP][DL];
    float m[ATTENTION__MAX_GROUP], lsum[ATTENTION__MAX_GROUP];
#pragma unroll
    for (int g = 0; g < ATTENTION__MAX_GROUP; g++) {
        m[g] = -INFINITY;
        lsum[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < DL; i++) {
            acc[g][i] = 0.0f;
            qr[g][i] = g < G ? q[((size_t)r * H + kvh * G + g) * D + lane * DL + i] : 0.0f;
        }
    }

    const size_t koff = kutil_kv_data_off(l, layer, 0), voff = kutil_kv_data_off(l, layer, 1);
    const size_t ksoff = kutil_kv_scale_off(l, layer, 0), vsoff = kutil_kv_scale_off(l, layer, 1);
    for (int t = t_begin + warp; t < t_end; t += ATTENTION__WARPS) {
        const uint8_t *page = arena + (size_t)bt[t / P] * l.page_bytes;
        const int tok = t % P;
        const size_t e = ((size_t)tok * KVH + kvh) * D;
        float kx[DL], vx[DL], ks = 1.0f, vs = 1.0f;
        if (FMT == PD_KV_FP8) {
            ks = ((const float *)(page + ksoff))[tok * KVH + kvh];
            vs = ((const float *)(page + vsoff))[tok * KVH + kvh];
        }
        attention__load<FMT, DL>(kx, page + koff + e * l.elem_bytes, lane, ks);
        attention__load<FMT, DL>(vx, page + voff + e * l.elem_bytes, lane, vs);
#pragma unroll
        for (int g = 0; g < ATTENTION__MAX_GROUP; g++) {
            if (g >= G)
                break;
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < DL; i++)
                d += qr[g][i] * kx[i];
            d = kutil_warp_sum(d) * scale;
            const float mn = fmaxf(m[g], d), corr = expf(m[g] - mn), p = expf(d - mn);
            m[g] = mn;
            lsum[g] = lsum[g] * corr + p;
#pragma unroll
            for (int i = 0; i < DL; i++)
                acc[g][i] = acc[g][i] * corr + p * vx[i];
        }
    }

    /* merge the warps: smem (warps, G, D) acc, then (warps, G) m and l */
    float *s_acc = attention__smem, *s_m = s_acc + ATTENTION__WARPS * G * D,
          *s_l = s_m + ATTENTION__WARPS * G;
#pragma unroll
    for (int g = 0; g < ATTENTION__MAX_GROUP; g++) {
        if (g >= G)
            break;
#pragma unroll
        for (int i = 0; i < DL; i++)
            s_acc[(warp * G + g) * D + lane * DL + i] = acc[g][i];
        if (lane == 0) {
            s_m[warp * G + g] = m[g];
            s_l[warp * G + g] = lsum[g];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int g = idx / D, d = idx % D;
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int w = 0; w < ATTENTION__WARPS; w++)
            M = fmaxf(M, s_m[w * G + g]);
        if (M != -INFINITY)
            for (int w = 0; w < ATTENTION__WARPS; w++) {
                const float c = expf(s_m[w * G + g] - M);
                L += s_l[w * G + g] * c;
                O += s_acc[(w * G + g) * D + d] * c;
            }
        const int h = kvh * G + g;
        if (gridDim.z == 1) {
            out[((size_t)r * H + h) * D + d] = O / L;
        } else {
            float *pp = part + (((size_t)sp * n_rows + r) * H + h) * (D + 2);
            pp[d] = O;
            if (d == 0) {
                pp[D] = M;
                pp[D + 1] = L;
            }
        }
    }
}

/* head_dim 128, group <= 4: 8 lanes per token (16 dims each), 4 tokens per warp at a time and
 * two in flight per lane group, so reductions take 3 shuffles and more bytes are in flight. */
#define ATTENTION__SLOTS (ATTENTION__WARPS * 4)

/* The 16 elements [sl * 16, sl * 16 + 16) of one (token, head) vector, as loaded. */
template <int FMT> struct attention__raw {
    uint4 w[FMT == PD_KV_F32 ? 4 : FMT == PD_KV_BF16 ? 2 : 1];
};

template <int FMT>
static __device__ __forceinline__ void attention__raw_load(attention__raw<FMT> &r, const uint8_t *v,
                                                           int sl)
{
    const uint4 *p = (const uint4 *)(v + (size_t)sl * 16 *
                                             (FMT == PD_KV_F32    ? 4
                                              : FMT == PD_KV_BF16 ? 2
                                                                  : 1));
#pragma unroll
    for (int i = 0; i < (int)(sizeof r.w / sizeof r.w[0]); i++)
        r.w[i] = p[i];
}

template <int FMT>
static __device__ __forceinline__ void
attention__raw_decode(float *dst, const attention__raw<FMT> &r, float scale)
{
    const uint32_t *u = (const uint32_t *)r.w;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        if constexpr (FMT == PD_KV_F32)
            dst[i] = __uint_as_float(u[i]);
        else if constexpr (FMT == PD_KV_BF16)
            dst[i] = __uint_as_float(i % 2 ? u[i / 2] & 0xffff0000u : u[i / 2] << 16);
        else
            dst[i] = kutil_fp8_to_f32((uint8_t)(u[i / 4] >> (8 * (i % 4)))) * scale;
    }
}

/* As attention__kernel (same grid and outputs), for head_dim 128 and group G <= 4; dynamic shared
 * memory ATTENTION__SLOTS * G * (128 + 2) f32. */
template <int FMT, int G>
static __global__ void __launch_bounds__(32 * ATTENTION__WARPS)
    attention__kernel_d128(float *out, float *part, const float *q, const uint8_t *arena,
                           kv_layout_t l, int layer, const int32_t *q_start, const int32_t *ctx_len,
                           const int32_t *block_tables, int n_seqs, int max_pages, int n_heads,
                           int chunk)
{
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): everything after reads earlier kernels' data */
    kutil_pdl_trigger();
    constexpr int D = 128;
    extern __shared__ float attention__smem[];
    const int r = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z, n_rows = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane >> 3, sl = lane & 7;
    const int slot = warp * 4 + sub;
    const int H = n_heads, KVH = l.n_kv_heads, P = l.page_tokens;
    /* scores in log2 units: q pre-scaled by log2(e) / sqrt(D), exp2f below */
    const float scale = 1.4426950408889634f / sqrtf((float)D);

    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (q_start[mid + 1] > r)
            hi = mid;
        else
            lo = mid + 1;
    }
    const int s = lo;
    const int q_len = q_start[s + 1] - q_start[s];
    const int n_tok = ctx_len[s] - q_len + (r - q_start[s]) + 1;
    const int t_begin = sp * chunk, t_end = min(n_tok, t_begin + chunk);
    const int32_t *bt = block_tables + (size_t)s * max_pages;

    float qr[G][16], acc[G][16], m[G], lsum[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float4 *qp = (const float4 *)(q + ((size_t)r * H + kvh * G + g) * D + sl * 16);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 v = qp[i];
            qr[g][4 * i] = v.x * scale, qr[g][4 * i + 1] = v.y * scale;
            qr[g][4 * i + 2] = v.z * scale, qr[g][4 * i + 3] = v.w * scale;
        }
        m[g] = -INFINITY;
        lsum[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++)
            acc[g][i] = 0.0f;
    }

    const size_t koff = kutil_kv_data_off(l, layer, 0), voff = kutil_kv_data_off(l, layer, 1);
    const size_t ksoff = kutil_kv_scale_off(l, layer, 0), vsoff = kutil_kv_scale_off(l, layer, 1);
    /* w0 is uniform per warp: every lane runs the shuffles; invalid tokens are masked */
    for (int w0 = t_begin + warp * 4; w0 < t_end; w0 += 2 * ATTENTION__SLOTS) {
        attention__raw<FMT> kr[2], vr[2];
        float ks[2] = {1.0f, 1.0f}, vs[2] = {1.0f, 1.0f};
        bool valid[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int t = w0 + sub + j * ATTENTION__SLOTS;
            valid[j] = t < t_end;
            const int tt = valid[j] ? t : t_begin;
            const uint8_t *page = arena + (size_t)bt[tt / P] * l.page_bytes;
            const int tok = tt % P;
            const size_t e = ((size_t)tok * KVH + kvh) * D * l.elem_bytes;
            attention__raw_load<FMT>(kr[j], page + koff + e, sl);
            attention__raw_load<FMT>(vr[j], page + voff + e, sl);
            if (FMT == PD_KV_FP8) {
                ks[j] = ((const float *)(page + ksoff))[tok * KVH + kvh];
                vs[j] = ((const float *)(page + vsoff))[tok * KVH + kvh];
            }
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float kx[16], vx[16];
            attention__raw_decode<FMT>(kx, kr[j], ks[j]);
            attention__raw_decode<FMT>(vx, vr[j], vs[j]);
#pragma unroll
            for (int g = 0; g < G; g++) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < 16; i++)
                    d += qr[g][i] * kx[i];
                d += __shfl_xor_sync(0xffffffffu, d, 4);
                d += __shfl_xor_sync(0xffffffffu, d, 2);
                d += __shfl_xor_sync(0xffffffffu, d, 1);
                if (valid[j]) {
                    const float mn = fmaxf(m[g], d), corr = exp2f(m[g] - mn), p = exp2f(d - mn);
                    m[g] = mn;
                    lsum[g] = lsum[g] * corr + p;
#pragma unroll
                    for (int i = 0; i < 16; i++)
                        acc[g][i] = acc[g][i] * corr + p * vx[i];
                }
            }
        }
    }

    float *s_acc = attention__smem, *s_m = s_acc + ATTENTION__SLOTS * G * D,
          *s_l = s_m + ATTENTION__SLOTS * G;
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
        for (int i = 0; i < 16; i++)
            s_acc[(slot * G + g) * D + sl * 16 + i] = acc[g][i];
        if (sl == 0) {
            s_m[slot * G + g] = m[g];
            s_l[slot * G + g] = lsum[g];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int g = idx / D, d = idx % D;
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int w = 0; w < ATTENTION__SLOTS; w++)
            M = fmaxf(M, s_m[w * G + g]);
        if (M != -INFINITY)
            for (int w = 0; w < ATTENTION__SLOTS; w++) {
                const float c = exp2f(s_m[w * G + g] - M);
                L += s_l[w * G + g] * c;
                O += s_acc[(w * G + g) * D + d] * c;
            }
        const int h = kvh * G + g;
        if (gridDim.z == 1) {
            out[((size_t)r * H + h) * D + d] = O / L;
        } else {
            float *pp = part + (((size_t)sp * n_rows + r) * H + h) * (D + 2);
            pp[d] = O;
            if (d == 0) {
                pp[D] = M * 0.6931471805599453f; /* natural units for the merge */
                pp[D + 1] = L;
            }
        }
    }
}

/* Thread groups of the split merge (attention__merge): each sums every ATTENTION__MERGE_W-th split.
 */
#define ATTENTION__MERGE_W 4
#define ATTENTION__MERGE_PF 4 /* partial values per thread loaded up front */

/* grid (n_rows, n_heads), block ATTENTION__MERGE_W * D, dynamic shared memory (2 n_splits +
 * (ATTENTION__MERGE_W + 1) (D + 1)) floats: out (n_rows, n_heads, D) f32 = merge of part
 * (n_splits, n_rows, n_heads, D + 2) f32. The splits' (m, l) are staged in shared memory (a
 * thread per split), warp 0 takes their max M, each split's weight exp(m - M) (-1: an empty split,
 * skipped) replaces its m; then thread group w (D threads, one per dimension) sums the splits w,
 * w + W, ... in order and the W partial sums are added in group order: deterministic, with W
 * times the loads in flight of one thread per dimension (that kernel, before session 9: 21 us
 * under ncu for 66 splits at batch 1 / 32k; staging alone with one group: 29 us). */
static __global__ void attention__merge(float *out, const float *part, int n_splits, int D)
{
    extern __shared__ float attention__ms[];
    float *mw = attention__ms, *ls = mw + n_splits, *po = ls + n_splits; /* po (W + 1, D + 1) */
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): everything after reads earlier kernels' data */
    kutil_pdl_trigger();
    const size_t n_rh = (size_t)gridDim.x * gridDim.y,
                 rh = (size_t)blockIdx.x * gridDim.y + blockIdx.y;
    const int d = threadIdx.x % D, w = threadIdx.x / D, nt = blockDim.x;
    /* the first ATTENTION__MERGE_PF of this thread's partial values, loaded with the (m, l)
     * staging below instead of after it (session 12: one trip to L2 less) */
    float pv[ATTENTION__MERGE_PF];
#pragma unroll
    for (int i = 0; i < ATTENTION__MERGE_PF; i++) {
        const int sp = w + i * ATTENTION__MERGE_W;
        pv[i] = sp < n_splits ? part[((size_t)sp * n_rh + rh) * (D + 2) + d] : 0.0f;
    }
    for (int sp = threadIdx.x; sp < n_splits; sp += nt) {
        const float *pp = part + ((size_t)sp * n_rh + rh) * (D + 2);
        mw[sp] = pp[D];
        ls[sp] = pp[D + 1];
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        float M = -INFINITY;
        for (int sp = threadIdx.x; sp < n_splits; sp += 32)
            M = fmaxf(M, mw[sp]);
        M = kutil_warp_max(M);
        if (threadIdx.x == 0)
            po[ATTENTION__MERGE_W * (D + 1) + D] = M;
    }
    __syncthreads();
    const float M = po[ATTENTION__MERGE_W * (D + 1) + D];
    __syncthreads(); /* every thread has M before the maxima become weights */
    for (int sp = threadIdx.x; sp < n_splits; sp += nt) {
        const float m = mw[sp];
        mw[sp] = m == -INFINITY ? -1.0f : expf(m - M);
    }
    __syncthreads();
    float L = 0.0f, O = 0.0f;
#pragma unroll
    for (int i = 0; i < ATTENTION__MERGE_PF; i++) {
        const int sp = w + i * ATTENTION__MERGE_W;
        if (sp < n_splits) {
            const float c = mw[sp];
            if (c >= 0.0f) {
                L += ls[sp] * c;
                O += pv[i] * c;
            }
        }
    }
#pragma unroll 4
    for (int sp = w + ATTENTION__MERGE_PF * ATTENTION__MERGE_W; sp < n_splits;
         sp += ATTENTION__MERGE_W) {
        const float v = part[((size_t)sp * n_rh + rh) * (D + 2) + d], c = mw[sp];
        if (c >= 0.0f) {
            L += ls[sp] * c;
            O += v * c;
        }
    }
    po[w * (D + 1) + d] = O;
    if (d == 0)
        po[w * (D + 1) + D] = L;
    __syncthreads();
    if (w != 0)
        return;
    O = po[d];
    L = po[D];
    for (int g = 1; g < ATTENTION__MERGE_W; g++) {
        O += po[g * (D + 1) + d];
        L += po[g * (D + 1) + D];
    }
    out[rh * D + d] = O / L;
}

/* Launches attention__merge (PDL) for n_rows x n_heads outputs of head_dim D. */
static pd_status_t attention__merge_launch(float *out, const float *part, int n_rows, int n_heads,
                                           int n_splits, int D, cudaStream_t stream)
{
    const size_t smem = (2 * (size_t)n_splits + (ATTENTION__MERGE_W + 1) * ((size_t)D + 1)) * 4;
    kutil_launch_pdl(attention__merge, dim3((unsigned)n_rows, (unsigned)n_heads),
                     dim3((unsigned)(ATTENTION__MERGE_W * D)), smem, stream, out, part, n_splits,
                     D);
    return KUTIL_LAUNCHED("attention merge");
}

/* ==== decode attention on the tensor cores (bf16 / fp8 KV, head_dim 64 / 128) ====
 *
 * One block = one query row, one KV head (all G <= 8 query heads of its GQA group), one split of
 * the row's context; NW warps (ATTN_TC__WARPS; 3 with TT 2), each taking every NW-th tile of 16
 * tokens of the split, TT of its tiles per step (1; 2 with attention_tc_pair). A warp streams its
 * tiles (K and V rows of 16 tokens, fp8: their scales) from the pages into its own shared-memory
 * ring with cp.async (STAGES tiles: F steps in flight while it computes one; 16-byte chunks
 * XOR-swizzled per row so that the fragment loads below are free of bank conflicts) and runs
 * both products on mma.sync m16n8k16 (Q's fragments are built once per block into shared
 * memory):
 *
 *   S (16 x 8 tokens) = Qparts (16 x D) K^T: the A rows are the query heads split into parts
 *     (fp8 KV: f16 hi in rows 0..7, lo in rows 8..15: 22 bits; bf16 KV: bf16 hi / mid in rows
 *     0..7 / 8..15 of one tile and lo in rows 0..7 of a second tile, accumulated into the same
 *     C: 24 bits), so S[h] + S[8 + h] is the f32-accurate dot product. Lane (h = lane / 4, c =
 *     lane % 4) reads its B fragments straight from 32 contiguous K bytes of token h: inside a
 *     k step the head dimensions are permuted (the same way for Q, built once), fp8 pairs
 *     become f16 pairs with one cvt.rn.f16x2.e4m3x2 (exact), bf16 needs no conversion. The
 *     per-(token, kv head) K scale multiplies the dot product once.
 *   O (16 x D) += Pparts (16 x 16 tokens) V: the S accumulator layout is the A layout of P (the
 *     usual flash-attention register reuse); P (fp8: times the V scale of its token) is split
 *     into parts like Q. V's B fragments pair two tokens of one dimension: a lane reads 16
 *     contiguous bytes of 4 token rows and pairs them with one prmt (the output dimensions are
 *     permuted: n tile j, column n is dimension (D / 8) n + j).
 *
 * Softmax in log2 units, online per tile of 16 tokens: one max over the lane quad (2 shuffles),
 * one exp2 per (token, head); fp8 keeps a second running max of s + log2(v scale) so that the
 * f16 P parts stay in (0, 1]. The warps merge through shared memory in a fixed order; splits
 * write (o, m, l) partials that attention__merge combines: deterministic. */

#define ATTN_TC__WARPS 4
#define ATTN_TC__TILE 16

/* TT: tiles per warp step (1, or 2 for fp8 KV: attention_tc_pair, session 17); BV: the bf16-KV
 * variant (attention_tc_bf16, session 25): bit 0 blocks of 3 warps, 4 per SM (batch 64 x 8 KV
 * heads one wave), bit 1 Q and P as two bf16 parts (hi, lo: 16 bits) instead of three */
template <int FMT, int D, int TT = 1, int BV = 0> struct attn_tc__cfg {
    static constexpr int ELEM = FMT == PD_KV_FP8 ? 1 : 2;
    static constexpr int ROW = D * ELEM; /* bytes of one (token, kv head) vector */
    static constexpr int RS = ROW;       /* its stride in shared memory */
    static constexpr int CPR = ROW / 16; /* 16-byte chunks per row; chunk c of token row t is
                                            stored at c ^ (t % CPR) (banks) */
    static constexpr int NCS = ATTN_TC__TILE * CPR / 32; /* chunks per lane per side and tile */
    static constexpr int SIDE = ATTN_TC__TILE * RS;      /* bytes of a tile's K (or V) */
    static constexpr int STAGE = 2 * SIDE + (FMT == PD_KV_FP8 ? 2 * ATTN_TC__TILE * 4 : 0);
    /* ring slots per warp: TT 1: fp8 3 (2 tiles in flight while one computes), bf16 2; TT 2: 4
     * (a step of 2 tiles in flight while one computes) */
    static constexpr int STAGES = TT == 2 ? 4 : FMT == PD_KV_FP8 ? 3 : 2;
    static constexpr int F = STAGES / TT - 1; /* steps in flight while one computes */
    static constexpr int KS = D / 16;         /* k steps of Q K^T */
    /* Q fragments of the block, shared by its warps: (KS, 32 lanes) uint4 [+ (KS, 32) uint2] */
    static constexpr bool P3 = FMT != PD_KV_FP8 && !(BV & 2); /* bf16 hi, mid, lo */
    static constexpr int QSMEM = KS * 32 * (P3 ? 24 : 16);
    /* warps per block: TT 2 takes 3 (4 blocks of 3 warps fit an SM's registers and shared memory,
     * so batch 64 x 8 KV heads stays one wave of 512 blocks on 132 SMs) */
    static constexpr int NW = TT == 2 || (BV & 1) ? 3 : ATTN_TC__WARPS;
    static constexpr int SMEM = QSMEM + NW * STAGES * STAGE;
    static constexpr int DT = D / 8;            /* n tiles of P V */
    static constexpr int KW = D / 4 * ELEM / 4; /* K words one lane reads per token */
    static constexpr int VW = D / 8 * ELEM / 4; /* V words one lane reads per token row */
    /* blocks per SM (registers; shared memory allows the same: fp8 hd 128 53.5 KB, bf16 70 KB;
     * TT 2, fp8 hd 128: 52.7 KB; BV 1, bf16 hd 128: 54 KB, BV 3: 52 KB) */
    static constexpr int MINB = FMT == PD_KV_FP8 || (BV & 1) ? 4 : 3;
    static_assert(32 % CPR == 0, "a lane's 16-byte chunks of a tile share one column");
    static_assert(TT == 1 || (TT == 2 && FMT == PD_KV_FP8), "two tiles per step: fp8 KV only");
    static_assert(BV == 0 || (FMT == PD_KV_BF16 && TT == 1), "the variants: bf16 KV only");
    static_assert(MINB * (SMEM + 1024) <= 228 * 1024, "MINB blocks fit an SM's shared memory");
};

static __device__ __forceinline__ uint32_t attn_tc__saddr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* 16 bytes global -> shared, asynchronously; src_bytes 0 writes zeros. */
static __device__ __forceinline__ void attn_tc__cp16(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
static __device__ __forceinline__ void attn_tc__cp4(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
static __device__ __forceinline__ float attn_tc__ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
static __device__ __forceinline__ float attn_tc__lg2(float x)
{
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
/* four e4m3 bytes -> two f16x2: lo from bytes 0, 1 (byte 0 in the low half), hi from 2, 3 */
static __device__ __forceinline__ void attn_tc__e4m3x4(uint32_t w, uint32_t &lo, uint32_t &hi)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
#else /* Ampere (cuda-arch 80): no fp8 cvt instruction; the same exact values in software */
    const __half2_raw l = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffff), __NV_E4M3);
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
    lo = (uint32_t)l.x | ((uint32_t)l.y << 16);
    hi = (uint32_t)h.x | ((uint32_t)h.y << 16);
#endif
}
/* c (16x8 f32) += a (16x16, row) b (16x8, col); f16 (fp8 KV) or bf16 operands */
template <int FMT>
static __device__ __forceinline__ void attn_tc__mma(float c[4], uint32_t a0, uint32_t a1,
                                                    uint32_t a2, uint32_t a3, uint32_t b0,
                                                    uint32_t b1)
{
    if constexpr (FMT == PD_KV_FP8)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* x, y -> packed parts (x in the low halves): fp8 KV: f16 hi, lo; bf16 KV: bf16 hi, mid, lo
 * (P3) or hi, lo */
template <int FMT, bool P3 = FMT != PD_KV_FP8>
static __device__ __forceinline__ void attn_tc__split(float x, float y, uint32_t p[3])
{
    if constexpr (FMT != PD_KV_FP8 && !P3) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
        const __nv_bfloat162 lo = __floats2bfloat162_rn(x - __low2float(h), y - __high2float(h));
        p[0] = *(const uint32_t *)&h;
        p[1] = *(const uint32_t *)&lo;
        p[2] = 0;
    } else if constexpr (FMT == PD_KV_FP8) {
        const __half2 h = __floats2half2_rn(x, y);
        const __half2 lo = __floats2half2_rn(x - __low2float(h), y - __high2float(h));
        p[0] = *(const uint32_t *)&h;
        p[1] = *(const uint32_t *)&lo;
        p[2] = 0;
    } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
        const float rx = x - __low2float(h), ry = y - __high2float(h);
        const __nv_bfloat162 m = __floats2bfloat162_rn(rx, ry);
        const __nv_bfloat162 lo = __floats2bfloat162_rn(rx - __low2float(m), ry - __high2float(m));
        p[0] = *(const uint32_t *)&h;
        p[1] = *(const uint32_t *)&m;
        p[2] = *(const uint32_t *)&lo;
    }
}

/* grid (n_rows, n_kv_heads, n_splits), block 32 * ATTN_TC__WARPS, dynamic shared memory
 * attn_tc__cfg::SMEM bytes. Outputs as attention__kernel: out (n_rows, n_heads, D) f32
 * [n_splits == 1]; part (n_splits, n_rows, n_heads, D + 2) f32 [n_splits > 1]. q (n_rows,
 * n_heads, D) f32; arena pages (layout l, fmt FMT, head_dim D); q_start (n_seqs + 1), ctx_len
 * (n_seqs), block_tables (n_seqs, max_pages) int32; chunk: tokens per split, a multiple of
 * ATTN_TC__TILE; p_shift: log2(page_tokens) when a power of two, else -1. */
template <int FMT, int D, int TT, int BV>
static __global__ void __launch_bounds__(32 * attn_tc__cfg<FMT, D, TT, BV>::NW,
                                         attn_tc__cfg<FMT, D, TT, BV>::MINB)
    attention__tc_kernel(float *out, float *part, int *cnt, const float *q, const uint8_t *arena,
                         kv_layout_t l, int layer, const int32_t *q_start, const int32_t *ctx_len,
                         const int32_t *block_tables, int n_seqs, int max_pages, int n_heads,
                         int chunk, int p_shift)
{
    using C = attn_tc__cfg<FMT, D, TT, BV>;
    constexpr int T = ATTN_TC__TILE, NW = C::NW;
    extern __shared__ __align__(16) uint8_t attn_tc__smem[];
    /* PDL-launched (kutil.cuh): q and the pages of this step's new rows come from the kernels
     * before, so the wait comes before they are read; the batch tables (uploaded before the
     * step) and the pages of earlier tokens (written by earlier steps) are read before it */
    const int r = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z, n_rows = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, qd = lane & 3; /* head (S, O rows) / token (K column), quad lane */
    const int H = n_heads, G = n_heads / l.n_kv_heads, KVH = l.n_kv_heads, P = l.page_tokens;

    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (q_start[mid + 1] > r)
            hi = mid;
        else
            lo = mid + 1;
    }
    const int s = lo;
    const int q_len = q_start[s + 1] - q_start[s];
    const int n_tok = ctx_len[s] - q_len + (r - q_start[s]) + 1;
    const int t_begin = sp * chunk, t_end = min(n_tok, t_begin + chunk);
    const int32_t *bt = block_tables + (size_t)s * max_pages;
    const int n_tiles = t_end > t_begin ? (t_end - t_begin + T - 1) / T : 0;
    const int my_n = n_tiles > warp ? (n_tiles - warp + NW - 1) / NW : 0;

    const size_t koff = kutil_kv_data_off(l, layer, 0), voff = kutil_kv_data_off(l, layer, 1);
    const size_t ksoff = kutil_kv_scale_off(l, layer, 0), vsoff = kutil_kv_scale_off(l, layer, 1);
    uint4 *sqa = (uint4 *)attn_tc__smem;
    uint2 *sqb = (uint2 *)(attn_tc__smem + C::KS * 32 * 16);
    uint8_t *ring = attn_tc__smem + C::QSMEM + (size_t)warp * C::STAGES * C::STAGE;

    /* tile `tile` of this split (16 tokens from t_begin + 16 tile) -> ring slot `slot`; tokens
     * past t_end are zero-filled (their loads read a valid token). When the page size is a
     * multiple of the tile (16-token pages and up: every tile lies in one page, since chunks
     * and t_begin are multiples of 16) the page is looked up once per tile and each chunk's
     * address is that page's base plus a per-lane constant (session 17: the general path below
     * costs ~230 PTX instructions per tile, a page-table load, a division and 64-bit products
     * per 16-byte chunk) */
    const bool one_page = P % T == 0;
    const int TOKB = KVH * C::ROW; /* bytes between tokens of one (page, side, layer) */
    /* the page (index into the row's block table) that holds token t */
    auto page_of = [&](int t) { return p_shift >= 0 ? t >> p_shift : t / P; };
    /* the page id of this warp's n-th tile (one_page; n < my_n) */
    auto page_id = [&](int n) { return bt[page_of(t_begin + (warp + n * NW) * T)]; };
    /* pid: the tile's page id (one_page), read ahead by the caller: ncu (session 17, H100, B 64
     * / 1k) put 23% of the stall samples on the page-table load inside this function when it
     * was read here, a trip to L2 in front of every tile's copies and compute */
    auto load = [&](int tile, int slot, int pid) {
        const uint32_t sa = attn_tc__saddr(ring + slot * C::STAGE);
        const int t0 = t_begin + tile * T;
        if (one_page) {
            const int pg = page_of(t0), last = t_end - 1 - t0;
            const uint8_t *pb = arena + (size_t)pid * l.page_bytes;
            const uint8_t *kb = pb + koff + ((size_t)(t0 - pg * P) * KVH + kvh) * C::ROW;
            const int ch = lane % C::CPR; /* 32 % CPR == 0: the same chunk for every i */
#pragma unroll
            for (int i = 0; i < C::NCS; i++) {
                const int tok = lane / C::CPR + i * (32 / C::CPR), ok = tok <= last;
                const int dst = tok * C::RS + ((ch ^ (tok % C::CPR)) << 4);
                const uint8_t *src = kb + (ok ? tok : last) * TOKB + ch * 16;
                attn_tc__cp16(sa + dst, src, ok ? 16 : 0);
                attn_tc__cp16(sa + C::SIDE + dst, src + (voff - koff), ok ? 16 : 0);
            }
            if constexpr (FMT == PD_KV_FP8) { /* lanes 0..15: K scales, 16..31: V scales */
                const int tok = lane & 15, ok = tok <= last;
                attn_tc__cp4(sa + 2 * C::SIDE + lane * 4,
                             pb + (lane < 16 ? ksoff : vsoff) +
                                 ((size_t)(t0 - pg * P + (ok ? tok : last)) * KVH + kvh) * 4,
                             ok ? 4 : 0);
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < C::NCS; i++) {
            const int cc = lane + 32 * i, tok = cc / C::CPR, ch = cc % C::CPR;
            const int t = t0 + tok, tc = t < t_end ? t : t_end - 1;
            const int pg = page_of(tc), ti = tc - pg * P;
            const size_t off =
                (size_t)bt[pg] * l.page_bytes + ((size_t)ti * KVH + kvh) * C::ROW + ch * 16;
            const int nb = t < t_end ? 16 : 0;
            const int dst = tok * C::RS + ((ch ^ (tok % C::CPR)) << 4);
            attn_tc__cp16(sa + dst, arena + koff + off, nb);
            attn_tc__cp16(sa + C::SIDE + dst, arena + voff + off, nb);
        }
        if constexpr (FMT == PD_KV_FP8) { /* lanes 0..15: K scales, 16..31: V scales */
            const int t = t0 + (lane & 15), tc = t < t_end ? t : t_end - 1;
            const int pg = page_of(tc), ti = tc - pg * P;
            const size_t off = (size_t)bt[pg] * l.page_bytes + (lane < 16 ? ksoff : vsoff) +
                               ((size_t)ti * KVH + kvh) * 4;
            attn_tc__cp4(sa + 2 * C::SIDE + lane * 4, arena + off, t < t_end ? 4 : 0);
        }
    };
    /* start the ring before the Q setup, so the loads are in flight meanwhile; the first tiles
     * that hold only earlier steps' tokens (before ctx_len - q_len: the kernel before, RoPE + KV
     * write, writes this step's) already before the PDL wait, so that their trip to memory
     * overlaps the kernel before (session 12: at batch 1 a warp's whole split is one tile) */
    const int old_end = ctx_len[s] - q_len;
    /* steps 0 .. F - 1 (TT tiles each) start here, one commit group per step */
    constexpr int F = C::F;
    int st0 = 0;
    for (; st0 < F * TT; st0++) {
        const int tile = warp + st0 * NW;
        if (st0 < my_n && min(t_end, t_begin + (tile + 1) * T) > old_end)
            break;
        if (st0 < my_n)
            load(tile, st0, one_page ? page_id(st0) : 0);
        if (st0 % TT == TT - 1)
            asm volatile("cp.async.commit_group;\n" ::);
    }
    kutil_pdl_wait();
    kutil_pdl_trigger();
    for (; st0 < F * TT; st0++) {
        if (st0 < my_n)
            load(warp + st0 * NW, st0, one_page ? page_id(st0) : 0);
        if (st0 % TT == TT - 1)
            asm volatile("cp.async.commit_group;\n" ::);
    }

    /* Q fragments: lane (g, qd) holds head g's dimensions qd D/4 + [0, D/4); k step ks uses
     * dims qd D/4 + 4 ks + {0, 1} (k = 2 qd + {0, 1}) and + {2, 3} (k = 2 qd + 8 + {0, 1}).
     * fp8 KV: q is scaled by 2^e per head into [2^14, 2^15) so that its f16 parts keep 22 bits;
     * qsc undoes it and carries log2(e) / sqrt(D). */
    float qsc = 1.4426950408889634f / sqrtf((float)D);
    {
        float qv[D / 4];
        const float4 *qp =
            (const float4 *)(q + ((size_t)r * H + kvh * G + (g < G ? g : 0)) * D + qd * (D / 4));
#pragma unroll
        for (int i = 0; i < D / 16; i++) {
            const float4 v = g < G ? qp[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            qv[4 * i] = v.x, qv[4 * i + 1] = v.y, qv[4 * i + 2] = v.z, qv[4 * i + 3] = v.w;
        }
        if constexpr (FMT == PD_KV_FP8) {
            float amax = 0.0f;
#pragma unroll
            for (int i = 0; i < D / 4; i++)
                amax = fmaxf(amax, fabsf(qv[i]));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
            if (amax > 0.0f) {
                int ex;
                frexpf(amax, &ex); /* amax in [2^(ex-1), 2^ex) */
                const float f = ldexpf(1.0f, 15 - ex);
#pragma unroll
                for (int i = 0; i < D / 4; i++)
                    qv[i] *= f;
                qsc = ldexpf(qsc, ex - 15);
            }
        }
#pragma unroll
        for (int k = 0; k < C::KS; k++) {
            uint32_t p01[3], p23[3];
            attn_tc__split<FMT, C::P3>(qv[4 * k], qv[4 * k + 1], p01);
            attn_tc__split<FMT, C::P3>(qv[4 * k + 2], qv[4 * k + 3], p23);
            if (warp == 0) { /* every warp computed the same fragments */
                sqa[k * 32 + lane] = make_uint4(p01[0], p01[1], p23[0], p23[1]);
                if constexpr (C::P3)
                    sqb[k * 32 + lane] = make_uint2(p01[2], p23[2]);
            }
        }
    }
    __syncthreads();

    float o[C::DT][4];
#pragma unroll
    for (int j = 0; j < C::DT; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m = -INFINITY, lsum = 0.0f, mv = -INFINITY;

    /* the page ids of the next step's tiles to load (one_page), read one step ahead */
    int pid_nx[TT];
#pragma unroll
    for (int u = 0; u < TT; u++) {
        const int n = F * TT + u;
        pid_nx[u] = one_page && n < my_n ? page_id(n) : 0;
    }
    const int n_steps = (my_n + TT - 1) / TT;
    for (int it = 0; it < n_steps; it++) {
        {
#pragma unroll
            for (int u = 0; u < TT; u++) {
                const int nx = (it + F) * TT + u;
                if (nx < my_n)
                    load(warp + nx * NW, nx % C::STAGES, pid_nx[u]);
            }
            asm volatile("cp.async.commit_group;\n" ::);
#pragma unroll
            for (int u = 0; u < TT; u++) {
                const int nx = (it + F + 1) * TT + u;
                if (one_page && nx < my_n)
                    pid_nx[u] = page_id(nx);
            }
        }
        asm volatile("cp.async.wait_group %0;\n" ::"n"(F));
        __syncwarp();

        /* S of each of the step's TT tiles: n tile j = tokens 8 j + [0, 8); this lane's B column
         * is token 8 j + g. TT 1: even and odd k steps accumulate into separate chains (two
         * dependent mma chains of KS / 2 instead of one of KS per n tile); TT 2: the two tiles'
         * chains are the independent work. A tile past the warp's last (n >= my_n: its slot was
         * not loaded) is skipped and fully masked. */
        constexpr int NCH = TT == 1 ? 2 : 1;
        float sc[TT][NCH][2][4];
#pragma unroll
        for (int u = 0; u < TT; u++) {
#pragma unroll
            for (int c = 0; c < NCH; c++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    sc[u][c][j][0] = sc[u][c][j][1] = sc[u][c][j][2] = sc[u][c][j][3] = 0.0f;
            const int n = it * TT + u;
            if (TT > 1 && n >= my_n)
                continue;
            const uint8_t *st = ring + (n % C::STAGES) * C::STAGE;
            uint32_t kw[2][C::KW];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int tok = 8 * j + g;
#pragma unroll
                for (int i = 0; i < C::KW / 4; i++) { /* this lane's chunks qd KW/4 + i */
                    const int ch = (qd * (C::KW / 4) + i) ^ (tok % C::CPR);
                    const uint4 v = *(const uint4 *)(st + tok * C::RS + (ch << 4));
                    kw[j][4 * i] = v.x, kw[j][4 * i + 1] = v.y;
                    kw[j][4 * i + 2] = v.z, kw[j][4 * i + 3] = v.w;
                }
            }
#pragma unroll
            for (int k = 0; k < C::KS; k++) {
                const uint4 a = sqa[k * 32 + lane];
                uint2 bq = make_uint2(0u, 0u);
                if constexpr (C::P3)
                    bq = sqb[k * 32 + lane];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    uint32_t b0, b1;
                    if constexpr (FMT == PD_KV_FP8)
                        attn_tc__e4m3x4(kw[j][k], b0, b1);
                    else
                        b0 = kw[j][2 * k], b1 = kw[j][2 * k + 1];
                    float *acc = sc[u][k % NCH][j];
                    attn_tc__mma<FMT>(acc, a.x, a.y, a.z, a.w, b0, b1);
                    if constexpr (C::P3)
                        attn_tc__mma<FMT>(acc, bq.x, 0u, bq.y, 0u, b0, b1);
                }
            }
        }
        /* this lane: head g, tokens 8 j + 2 qd + e of each tile */
        float sv[TT][2][2], pv[TT][2][2];
        float mt = -INFINITY, mvt = -INFINITY;
#pragma unroll
        for (int u = 0; u < TT; u++) {
            const int n = it * TT + u;
            const uint8_t *st = ring + (n % C::STAGES) * C::STAGE;
            const float *sks = (const float *)(st + 2 * C::SIDE), *svs = sks + T;
            const int t0 = t_begin + (warp + n * NW) * T;
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int tok = 8 * j + 2 * qd + e;
                    float x = sc[u][0][j][e] + sc[u][0][j][2 + e];
                    if constexpr (NCH > 1)
                        x += sc[u][1][j][e] + sc[u][1][j][2 + e];
                    x *= qsc;
                    const bool live = (TT == 1 || n < my_n) && t0 + tok < t_end;
                    if constexpr (FMT == PD_KV_FP8)
                        x = live ? x * sks[tok] : -INFINITY;
                    else if (!live)
                        x = -INFINITY;
                    sv[u][j][e] = x;
                    mt = fmaxf(mt, x);
                    if constexpr (FMT == PD_KV_FP8) {
                        pv[u][j][e] = live ? x + attn_tc__lg2(svs[tok]) : -INFINITY;
                        mvt = fmaxf(mvt, pv[u][j][e]);
                    }
                }
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float m_new = fmaxf(m, mt), ms = m_new == -INFINITY ? 0.0f : m_new;
        const float corr = attn_tc__ex2(m - ms);
        float ps = 0.0f;
#pragma unroll
        for (int u = 0; u < TT; u++)
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = attn_tc__ex2(sv[u][j][e] - ms);
                    ps += p;
                    if constexpr (FMT != PD_KV_FP8)
                        pv[u][j][e] = p;
                }
        lsum = lsum * corr + ps;
        m = m_new;
        float corr_o = corr;
        if constexpr (FMT == PD_KV_FP8) { /* P' = p * v scale, relative to 2^mv */
            mvt = fmaxf(mvt, __shfl_xor_sync(0xffffffffu, mvt, 1));
            mvt = fmaxf(mvt, __shfl_xor_sync(0xffffffffu, mvt, 2));
            const float mv_new = fmaxf(mv, mvt), mvs = mv_new == -INFINITY ? 0.0f : mv_new;
            corr_o = attn_tc__ex2(mv - mvs);
#pragma unroll
            for (int u = 0; u < TT; u++)
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        pv[u][j][e] = attn_tc__ex2(pv[u][j][e] - mvs);
            mv = mv_new;
        }
        if (__any_sync(0xffffffffu, corr_o != 1.0f)) /* the max moved for some head */
#pragma unroll
            for (int j = 0; j < C::DT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    o[j][i] *= corr_o;

#pragma unroll
        for (int u = 0; u < TT; u++) {
            const int n = it * TT + u;
            if (TT > 1 && n >= my_n) /* its V slot was not loaded: P is 0, but V may be NaN */
                continue;
            const uint8_t *st = ring + (n % C::STAGES) * C::STAGE;
            /* P as the A operand: k = tokens 2 qd + {0, 1} (n tile 0) and 8 + 2 qd + {0, 1} */
            uint32_t pa0[3], pa1[3];
            attn_tc__split<FMT, C::P3>(pv[u][0][0], pv[u][0][1], pa0);
            attn_tc__split<FMT, C::P3>(pv[u][1][0], pv[u][1][1], pa1);

            /* O: V rows 2 qd, 2 qd + 1, 2 qd + 8, 2 qd + 9, dims (D / 8) g + [0, D / 8) */
            uint32_t vw[4][C::VW];
#pragma unroll
            for (int rr = 0; rr < 4; rr++) {
                const int tok = 2 * qd + (rr & 1) + 8 * (rr >> 1);
                const uint8_t *vr = st + C::SIDE + tok * C::RS;
                const int b = g * C::VW * 4; /* byte of this lane's dims in the row, unswizzled */
                if constexpr (C::VW == 2) {
                    const int ch = (b >> 4) ^ (tok % C::CPR);
                    const uint2 v = *(const uint2 *)(vr + (ch << 4) + (b & 15));
                    vw[rr][0] = v.x, vw[rr][1] = v.y;
                } else {
#pragma unroll
                    for (int i = 0; i < C::VW / 4; i++) {
                        const int ch = ((b >> 4) + i) ^ (tok % C::CPR);
                        const uint4 v = *(const uint4 *)(vr + (ch << 4));
                        vw[rr][4 * i] = v.x, vw[rr][4 * i + 1] = v.y;
                        vw[rr][4 * i + 2] = v.z, vw[rr][4 * i + 3] = v.w;
                    }
                }
            }
            if constexpr (FMT == PD_KV_FP8) {
#pragma unroll
                for (int i = 0; i < C::VW; i++) { /* n tiles 4 i .. 4 i + 3 */
                    uint32_t b0[4], b1[4];
                    attn_tc__e4m3x4(__byte_perm(vw[0][i], vw[1][i], 0x5140), b0[0], b0[1]);
                    attn_tc__e4m3x4(__byte_perm(vw[0][i], vw[1][i], 0x7362), b0[2], b0[3]);
                    attn_tc__e4m3x4(__byte_perm(vw[2][i], vw[3][i], 0x5140), b1[0], b1[1]);
                    attn_tc__e4m3x4(__byte_perm(vw[2][i], vw[3][i], 0x7362), b1[2], b1[3]);
#pragma unroll
                    for (int w = 0; w < 4; w++)
                        attn_tc__mma<FMT>(o[4 * i + w], pa0[0], pa0[1], pa1[0], pa1[1], b0[w],
                                          b1[w]);
                }
            } else {
#pragma unroll
                for (int i = 0; i < C::VW; i++) { /* n tiles 2 i, 2 i + 1 */
#pragma unroll
                    for (int w = 0; w < 2; w++) {
                        const uint32_t sel = w ? 0x7632 : 0x5410;
                        const uint32_t b0 = __byte_perm(vw[0][i], vw[1][i], sel);
                        const uint32_t b1 = __byte_perm(vw[2][i], vw[3][i], sel);
                        attn_tc__mma<FMT>(o[2 * i + w], pa0[0], pa0[1], pa1[0], pa1[1], b0, b1);
                        if constexpr (C::P3)
                            attn_tc__mma<FMT>(o[2 * i + w], pa0[2], 0u, pa1[2], 0u, b0, b1);
                    }
                }
            }
        }
        __syncwarp(); /* the slots are refilled by the next step's loads */
    }
    asm volatile("cp.async.wait_group 0;\n" ::);

    /* this warp's (m, l, o) for head g: l summed over the quad; fp8: o relative to 2^m */
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    float f = 1.0f;
    if constexpr (FMT == PD_KV_FP8)
        f = m == -INFINITY ? 0.0f : attn_tc__ex2(mv - m);
    __syncthreads(); /* every warp is done with its ring: reuse the shared memory */
    float *s_acc = (float *)attn_tc__smem, *s_m = s_acc + NW * G * D, *s_l = s_m + NW * G;
    if (g < G) {
#pragma unroll
        for (int j = 0; j < C::DT; j++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                s_acc[(warp * G + g) * D + (D / 8) * (2 * qd + e) + j] =
                    (o[j][e] + o[j][2 + e]) * f;
        if (qd == 0) {
            s_m[warp * G + g] = m;
            s_l[warp * G + g] = lsum;
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int gg = idx / D, d = idx % D;
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int w = 0; w < NW; w++)
            M = fmaxf(M, s_m[w * G + gg]);
        if (M != -INFINITY)
            for (int w = 0; w < NW; w++) {
                const float c = attn_tc__ex2(s_m[w * G + gg] - M);
                L += s_l[w * G + gg] * c;
                O += s_acc[(w * G + gg) * D + d] * c;
            }
        const int h = kvh * G + gg;
        if (gridDim.z == 1) {
            out[((size_t)r * H + h) * D + d] = O / L;
        } else {
            float *pp = part + (((size_t)sp * n_rows + r) * H + h) * (D + 2);
            pp[d] = O;
            if (d == 0) {
                pp[D] = M * 0.6931471805599453f; /* natural units for the merge */
                pp[D + 1] = L;
            }
        }
    }
    if (gridDim.z == 1 || !cnt)
        return; /* no splits, or attention__merge merges them */
    /* the last of the row's splits to finish (for this KV head) merges them all, in split order
     * (the same sums whichever block is last: deterministic), and re-arms the counter for the
     * next launch; threadFenceReduction's pattern: each block's partials are visible before its
     * count, and read after the last count */
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(&cnt[r * KVH + kvh], 1) == (int)gridDim.z - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    const size_t stride = (size_t)n_rows * H * (D + 2);
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int gg = idx / D, d = idx % D, h = kvh * G + gg;
        const float *p0 = part + ((size_t)r * H + h) * (D + 2);
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int k = 0; k < (int)gridDim.z; k++)
            M = fmaxf(M, __ldcg(p0 + k * stride + D));
        for (int k = 0; k < (int)gridDim.z; k++) {
            const float *pp = p0 + k * stride, mk = __ldcg(pp + D);
            if (mk == -INFINITY)
                continue;
            const float c = expf(mk - M);
            L += __ldcg(pp + D + 1) * c;
            O += __ldcg(pp + d) * c;
        }
        out[((size_t)r * H + h) * D + d] = O / L;
    }
    if (threadIdx.x == 0)
        cnt[r * KVH + kvh] = 0;
}

/* ==== launchers ==== */

/* splits: enough blocks for about ATTENTION__TARGET_BLOCKS (4 resident blocks of the tensor-core
 * kernel on each of an H200's 132 SMs), each at least ATTENTION__MIN_CHUNK tokens */
#define ATTENTION__MIN_CHUNK 64
#define ATTENTION__TARGET_BLOCKS (4 * 132)

int attention_decode_tc = 1;

int attention_tc_pair = 0;

int attention_target_blocks = 0;

int attention_tc_bf16 = ATTENTION_TC_BF16_DEFAULT;

extern "C" int attention_splits(int n_rows, int n_kv_heads, int max_ctx, pd_kvfmt_t fmt)
{
    const int blocks = n_rows * n_kv_heads, target = attention_target_blocks > 0
                                                         ? attention_target_blocks
                                                         : ATTENTION__TARGET_BLOCKS;
    if (max_ctx <= ATTENTION__MIN_CHUNK)
        return 1;
    /* 3/4 of the target already fills the SMs about once: a second split would only add a wave
     * and the merge (B 64 x 8 KV heads = 512 blocks; fp8 KV B 64 / 1k: 63 us, 73 with 2 splits,
     * 83 with 4; B 64 / 8k: the same with 1..6). Except bf16 KV in variant 0 or 2 of
     * attention_tc_bf16, whose blocks of 4 warps fit 3 per SM (shared memory), so 512 blocks are
     * 1.3 waves: contexts of >= 4k split into chunks of >= 2048 tokens, at most 4 (session 9,
     * gpu_bench attnsplit: B 64 / 8k 747 -> 627 us with 4; the whole B 64 step at 8k 30.37 ->
     * 27.23 ms; at 1k 2 splits gained 3 us in the kernel and lost 0.1 ms in the step to the
     * merges). The default variant 1 fits 4 blocks of 3 warps per SM: one wave, no split (session
     * 25, one H100: B 64 / 8k 818 us unsplit against variant 0's 828 with 4 splits) */
    if (4 * blocks >= 3 * target) {
        if (fmt != PD_KV_BF16 || (attention_tc_bf16 & 1) || attention_target_blocks > 0 ||
            max_ctx < 4096)
            return 1;
        const int by_len = (max_ctx + 2047) / 2048;
        return by_len < 4 ? by_len : 4;
    }
    /* the smallest count that reaches the target, even where it overshoots one wave (batch 16 x
     * 8 KV heads at 1k: 5 splits, 640 blocks). Session 25 measured the count with the fewest
     * waves x tiles per split instead (4 there; code in f413273, one H100): the kernel alone 9-15%
     * faster at batch 16 / 32, the decode steps at batch 8 / 16 / 32 no faster (FP8 batch 32
     * 7.10 -> 7.37 ms, two runs each, alternating), so it was removed */
    const int by_len = (max_ctx + ATTENTION__MIN_CHUNK - 1) / ATTENTION__MIN_CHUNK;
    const int splits = (target + blocks - 1) / blocks;
    return splits < by_len ? splits : by_len;
}

int attention_fold = 0;

extern "C" size_t attention_scratch_floats(int n_rows, int n_heads, int head_dim, int n_splits)
{
    return n_splits <= 1
               ? 0
               : ATTENTION_SCRATCH_COUNTERS + (size_t)n_splits * n_rows * n_heads * (head_dim + 2);
}

template <int FMT>
static void attention__launch(dim3 grid, size_t smem, cudaStream_t stream, float *out, float *part,
                              const float *q, const void *arena, const kv_layout_t *l, int layer,
                              const pd_attn_batch_t *b, int n_heads, int chunk)
{
    const uint8_t *a = (const uint8_t *)arena;
#define ATTENTION__GO(DL)                                                                          \
    kutil_launch_pdl(attention__kernel<FMT, DL>, dim3(grid), dim3(32 * ATTENTION__WARPS), smem,    \
                     stream, out, part, q, a, *l, layer, b->q_start, b->ctx_len, b->block_tables,  \
                     b->n_seqs, b->max_pages, n_heads, chunk)
    switch (l->head_dim) {
    case 64:
        ATTENTION__GO(2);
        break;
    case 128:
        ATTENTION__GO(4);
        break;
    default:
        ATTENTION__GO(8);
    }
#undef ATTENTION__GO
}

template <int FMT>
static void attention__launch_d128(dim3 grid, size_t smem, cudaStream_t stream, float *out,
                                   float *part, const float *q, const void *arena,
                                   const kv_layout_t *l, int layer, const pd_attn_batch_t *b,
                                   int n_heads, int chunk, int G)
{
    const uint8_t *a = (const uint8_t *)arena;
#define ATTENTION__GO2(GG)                                                                         \
    kutil_launch_pdl(attention__kernel_d128<FMT, GG>, dim3(grid), dim3(32 * ATTENTION__WARPS),     \
                     smem, stream, out, part, q, a, *l, layer, b->q_start, b->ctx_len,             \
                     b->block_tables, b->n_seqs, b->max_pages, n_heads, chunk)
    if (G == 1)
        ATTENTION__GO2(1);
    else if (G == 2)
        ATTENTION__GO2(2);
    else
        ATTENTION__GO2(4);
#undef ATTENTION__GO2
}

/* cnt: the split counters of the in-kernel merge (NULL: attention__merge merges) */
template <int FMT, int D, int TT = 1, int BV = 0>
static pd_status_t attention__tc_launch(dim3 grid, cudaStream_t stream, float *out, float *part,
                                        int *cnt, const float *q, const void *arena,
                                        const kv_layout_t *l, int layer, const pd_attn_batch_t *b,
                                        int n_heads, int chunk)
{
    using C = attn_tc__cfg<FMT, D, TT, BV>;
    static unsigned attr_set; /* per device (kutil_allow_smem) */
    pd_status_t st = kutil_allow_smem((const void *)attention__tc_kernel<FMT, D, TT, BV>,
                                      (int)C::SMEM, &attr_set, "attention smem");
    if (st != PD_OK)
        return st;
    const int P = l->page_tokens;
    const int p_shift = (P & (P - 1)) == 0 ? __builtin_ctz((unsigned)P) : -1;
    kutil_launch_pdl(attention__tc_kernel<FMT, D, TT, BV>, grid, dim3(32 * C::NW), C::SMEM, stream,
                     out, part, cnt, q, (const uint8_t *)arena, *l, layer, b->q_start, b->ctx_len,
                     b->block_tables, b->n_seqs, b->max_pages, n_heads, chunk, p_shift);
    return KUTIL_LAUNCHED("attention");
}

/* bf16 KV on the tensor-core kernel: head_dim D (64 / 128), variant v (attention_tc_bf16) */
static pd_status_t attention__tc_bf16(int D, int v, dim3 grid, cudaStream_t stream, float *out,
                                      float *part, int *cnt, const float *q, const void *arena,
                                      const kv_layout_t *l, int layer, const pd_attn_batch_t *b,
                                      int n_heads, int chunk)
{
#define ATTENTION__BF(DD, V)                                                                       \
    attention__tc_launch<PD_KV_BF16, DD, 1, V>(grid, stream, out, part, cnt, q, arena, l, layer,   \
                                               b, n_heads, chunk)
    if (D == 128)
        return v == 1   ? ATTENTION__BF(128, 1)
               : v == 2 ? ATTENTION__BF(128, 2)
               : v == 3 ? ATTENTION__BF(128, 3)
                        : ATTENTION__BF(128, 0);
    return v == 1   ? ATTENTION__BF(64, 1)
           : v == 2 ? ATTENTION__BF(64, 2)
           : v == 3 ? ATTENTION__BF(64, 3)
                    : ATTENTION__BF(64, 0);
#undef ATTENTION__BF
}

extern "C" pd_status_t attention_run(float *out, float *scratch, const float *q, const void *arena,
                                     const kv_layout_t *l, int layer, const pd_attn_batch_t *batch,
                                     int n_rows, int n_heads, int max_ctx, int n_splits,
                                     cudaStream_t stream)
{
    const int D = l->head_dim;
    KUTIL_REQUIRE(D == 64 || D == 128 || D == 256, "attention");
    KUTIL_REQUIRE(n_heads > 0 && n_heads % l->n_kv_heads == 0 &&
                      n_heads / l->n_kv_heads <= ATTENTION__MAX_GROUP,
                  "attention");
    KUTIL_REQUIRE(n_rows >= 0 && batch->n_seqs > 0 && n_splits >= 1 && max_ctx >= 0, "attention");
    KUTIL_REQUIRE(n_splits == 1 || scratch, "attention");
    if (n_rows == 0)
        return PD_OK;
    /* scratch: the split counters, then the partials (attention_scratch_floats) */
    float *part = n_splits > 1 ? scratch + ATTENTION_SCRATCH_COUNTERS : NULL;
    const int G = n_heads / l->n_kv_heads;
    if (attention_decode_tc && (l->fmt == PD_KV_BF16 || l->fmt == PD_KV_FP8) &&
        (D == 64 || D == 128)) {
        /* the tensor-core kernel: split boundaries on tiles of ATTN_TC__TILE tokens */
        int chunk =
            n_splits == 1 ? (max_ctx > 0 ? max_ctx : 1) : (max_ctx + n_splits - 1) / n_splits;
        if (n_splits > 1)
            chunk = (chunk + ATTN_TC__TILE - 1) / ATTN_TC__TILE * ATTN_TC__TILE;
        const dim3 grid((unsigned)n_rows, (unsigned)l->n_kv_heads, (unsigned)n_splits);
        /* the in-kernel merge (attention_fold) needs a counter per (row, KV head) */
        int *cnt = attention_fold && n_splits > 1 &&
                           (size_t)n_rows * l->n_kv_heads <= ATTENTION_SCRATCH_COUNTERS
                       ? (int *)scratch
                       : NULL;
        pd_status_t st;
        if (l->fmt == PD_KV_FP8 && D == 128 && attention_tc_pair)
            st = attention__tc_launch<PD_KV_FP8, 128, 2>(grid, stream, out, part, cnt, q, arena, l,
                                                         layer, batch, n_heads, chunk);
        else if (l->fmt == PD_KV_FP8)
            st = D == 128
                     ? attention__tc_launch<PD_KV_FP8, 128>(grid, stream, out, part, cnt, q, arena,
                                                            l, layer, batch, n_heads, chunk)
                     : attention__tc_launch<PD_KV_FP8, 64>(grid, stream, out, part, cnt, q, arena,
                                                           l, layer, batch, n_heads, chunk);
        else
            st = attention__tc_bf16(D, attention_tc_bf16 & 3, grid, stream, out, part, cnt, q,
                                    arena, l, layer, batch, n_heads, chunk);
        if (st != PD_OK || n_splits == 1 || cnt)
            return st;
        return attention__merge_launch(out, part, n_rows, n_heads, n_splits, D, stream);
    }
    const int chunk =
        n_splits == 1 ? (max_ctx > 0 ? max_ctx : 1) : (max_ctx + n_splits - 1) / n_splits;
    const dim3 grid((unsigned)n_rows, (unsigned)l->n_kv_heads, (unsigned)n_splits);
    if (D == 128 && (G == 1 || G == 2 || G == 4)) {
        const size_t smem2 = (size_t)ATTENTION__SLOTS * G * (D + 2) * sizeof(float);
        switch (l->fmt) {
        case PD_KV_BF16:
            attention__launch_d128<PD_KV_BF16>(grid, smem2, stream, out, part, q, arena, l, layer,
                                               batch, n_heads, chunk, G);
            break;
        case PD_KV_FP8:
            attention__launch_d128<PD_KV_FP8>(grid, smem2, stream, out, part, q, arena, l, layer,
                                              batch, n_heads, chunk, G);
            break;
        default:
            attention__launch_d128<PD_KV_F32>(grid, smem2, stream, out, part, q, arena, l, layer,
                                              batch, n_heads, chunk, G);
        }
    } else {
        const size_t smem = (size_t)ATTENTION__WARPS * G * (D + 2) * sizeof(float);
        switch (l->fmt) {
        case PD_KV_BF16:
            attention__launch<PD_KV_BF16>(grid, smem, stream, out, part, q, arena, l, layer, batch,
                                          n_heads, chunk);
            break;
        case PD_KV_FP8:
            attention__launch<PD_KV_FP8>(grid, smem, stream, out, part, q, arena, l, layer, batch,
                                         n_heads, chunk);
            break;
        default:
            attention__launch<PD_KV_F32>(grid, smem, stream, out, part, q, arena, l, layer, batch,
                                         n_heads, chunk);
        }
    }
    pd_status_t st = KUTIL_LAUNCHED("attention");
    if (st != PD_OK || n_splits == 1)
        return st;
    return attention__merge_launch(out, part, n_rows, n_heads, n_splits, D, stream);
}
