/* attention: paged causal GQA attention with optional sequence splits (see attention.h). */
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

/* grid (n_rows, n_heads), block D: out (n_rows, n_heads, D) f32 = merge of part (n_splits,
 * n_rows, n_heads, D + 2) f32 */
static __global__ void attention__merge(float *out, const float *part, int n_splits, int D)
{
    const size_t n_rh = (size_t)gridDim.x * gridDim.y,
                 rh = (size_t)blockIdx.x * gridDim.y + blockIdx.y;
    const int d = threadIdx.x;
    float M = -INFINITY, L = 0.0f, O = 0.0f;
    for (int sp = 0; sp < n_splits; sp++)
        M = fmaxf(M, part[((size_t)sp * n_rh + rh) * (D + 2) + D]);
    for (int sp = 0; sp < n_splits; sp++) {
        const float *pp = part + ((size_t)sp * n_rh + rh) * (D + 2);
        if (pp[D] == -INFINITY)
            continue;
        const float c = expf(pp[D] - M);
        L += pp[D + 1] * c;
        O += pp[d] * c;
    }
    out[rh * D + d] = O / L;
}

/* ==== launchers ==== */

#define ATTENTION__MIN_CHUNK 32

extern "C" int attention_splits(int n_rows, int n_kv_heads, int max_ctx)
{
    const int blocks = n_rows * n_kv_heads, target = 2 * 132;
    if (blocks >= target || max_ctx <= ATTENTION__MIN_CHUNK)
        return 1;
    int splits = (target + blocks - 1) / blocks;
    const int by_len = (max_ctx + ATTENTION__MIN_CHUNK - 1) / ATTENTION__MIN_CHUNK;
    return splits < by_len ? splits : by_len;
}

extern "C" size_t attention_scratch_floats(int n_rows, int n_heads, int head_dim, int n_splits)
{
    return n_splits <= 1 ? 0 : (size_t)n_splits * n_rows * n_heads * (head_dim + 2);
}

template <int FMT>
static void attention__launch(dim3 grid, size_t smem, cudaStream_t stream, float *out, float *part,
                              const float *q, const void *arena, const kv_layout_t *l, int layer,
                              const pd_attn_batch_t *b, int n_heads, int chunk)
{
    const uint8_t *a = (const uint8_t *)arena;
#define ATTENTION__GO(DL)                                                                          \
    attention__kernel<FMT, DL><<<grid, 32 * ATTENTION__WARPS, smem, stream>>>(                     \
        out, part, q, a, *l, layer, b->q_start, b->ctx_len, b->block_tables, b->n_seqs,            \
        b->max_pages, n_heads, chunk)
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
    attention__kernel_d128<FMT, GG><<<grid, 32 * ATTENTION__WARPS, smem, stream>>>(                \
        out, part, q, a, *l, layer, b->q_start, b->ctx_len, b->block_tables, b->n_seqs,            \
        b->max_pages, n_heads, chunk)
    if (G == 1)
        ATTENTION__GO2(1);
    else if (G == 2)
        ATTENTION__GO2(2);
    else
        ATTENTION__GO2(4);
#undef ATTENTION__GO2
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
    const int G = n_heads / l->n_kv_heads;
    const int chunk =
        n_splits == 1 ? (max_ctx > 0 ? max_ctx : 1) : (max_ctx + n_splits - 1) / n_splits;
    const dim3 grid((unsigned)n_rows, (unsigned)l->n_kv_heads, (unsigned)n_splits);
    if (D == 128 && (G == 1 || G == 2 || G == 4)) {
        const size_t smem2 = (size_t)ATTENTION__SLOTS * G * (D + 2) * sizeof(float);
        switch (l->fmt) {
        case PD_KV_BF16:
            attention__launch_d128<PD_KV_BF16>(grid, smem2, stream, out, scratch, q, arena, l,
                                               layer, batch, n_heads, chunk, G);
            break;
        case PD_KV_FP8:
            attention__launch_d128<PD_KV_FP8>(grid, smem2, stream, out, scratch, q, arena, l, layer,
                                              batch, n_heads, chunk, G);
            break;
        default:
            attention__launch_d128<PD_KV_F32>(grid, smem2, stream, out, scratch, q, arena, l, layer,
                                              batch, n_heads, chunk, G);
        }
    } else {
        const size_t smem = (size_t)ATTENTION__WARPS * G * (D + 2) * sizeof(float);
        switch (l->fmt) {
        case PD_KV_BF16:
            attention__launch<PD_KV_BF16>(grid, smem, stream, out, scratch, q, arena, l, layer,
                                          batch, n_heads, chunk);
            break;
        case PD_KV_FP8:
            attention__launch<PD_KV_FP8>(grid, smem, stream, out, scratch, q, arena, l, layer,
                                         batch, n_heads, chunk);
            break;
        default:
            attention__launch<PD_KV_F32>(grid, smem, stream, out, scratch, q, arena, l, layer,
                                         batch, n_heads, chunk);
        }
    }
    pd_status_t st = KUTIL_LAUNCHED("attention");
    if (st != PD_OK || n_splits == 1)
        return st;
    attention__merge<<<dim3((unsigned)n_rows, (unsigned)n_heads), D, 0, stream>>>(out, scratch,
                                                                                  n_splits, D);
    return KUTIL_LAUNCHED("attention merge");
}
