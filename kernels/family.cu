/* family: the GLM-4.5 / DeepSeek-V3 ops (see family.h). */
#include "family.h"
#include "kutil.cuh"

/* ==== kernels ==== */

/* x (n, d) f32, bias (d) f32 */
static __global__ void family__bias_add(float *x, const float *bias, int n, int d)
{
    const size_t total = (size_t)n * d;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += bias[i % d];
}

/* grid (n), block 128: x (n, n_heads, head_dim) f32 in place, pos (n), inv_freq (rot_dim / 2) */
static __global__ void family__rope_partial(float *x, const int32_t *pos, const float *inv_freq,
                                            int n_heads, int head_dim, int rot_dim, bool interleave,
                                            float scale)
{
    const int half = rot_dim / 2;
    const float p = (float)pos[blockIdx.x];
    float *row = x + (size_t)blockIdx.x * n_heads * head_dim;
    for (int i = threadIdx.x; i < n_heads * half; i += blockDim.x) {
        const int h = i / half, j = i % half;
        const float ang = p * inv_freq[j];
        const float c = cosf(ang) * scale, s = sinf(ang) * scale;
        const int ia = interleave ? 2 * j : j, ib = interleave ? 2 * j + 1 : j + half;
        float *v = row + (size_t)h * head_dim;
        const float a = v[ia], b = v[ib];
        v[ia] = a * c - b * s;
        v[ib] = b * c + a * s;
    }
}

/* grid (n), block 32 (one warp per token; lane 0 decides, as the CPU reference does):
 * ids, weights (n, k); logits (n, E); bias (E) */
static __global__ void family__moe_route_grouped(int32_t *ids, float *weights, const float *logits,
                                                 const float *bias, int E, int k, int n_group,
                                                 int topk_group, bool norm, float scale)
{
    __shared__ float s[1024], choice[1024], gscore[64];
    __shared__ bool taken[1024], gkeep[64];
    const int i = blockIdx.x, per = E / n_group;
    const float *lg = logits + (size_t)i * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        s[e] = 1.0f / (1.0f + expf(-lg[e]));
        choice[e] = s[e] + bias[e];
        taken[e] = false;
    }
    __syncwarp();
    if (threadIdx.x != 0)
        return;
    for (int g = 0; g < n_group; g++) {
        const float *c = choice + g * per;
        int b0 = 0, b1 = -1;
        for (int e = 1; e < per; e++)
            if (c[e] > c[b0])
                b0 = e;
        for (int e = 0; e < per; e++)
            if (e != b0 && (b1 < 0 || c[e] > c[b1]))
                b1 = e;
        gscore[g] = c[b0] + (b1 >= 0 ? c[b1] : 0.0f);
        gkeep[g] = false;
    }
    for (int t = 0; t < topk_group; t++) {
        int best = -1;
        for (int g = 0; g < n_group; g++)
            if (!gkeep[g] && (best < 0 || gscore[g] > gscore[best]))
                best = g;
        gkeep[best] = true;
    }
    for (int e = 0; e < E; e++)
        if (!gkeep[e / per])
            choice[e] = 0.0f;
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || choice[e] > choice[best]))
                best = e;
        taken[best] = true;
        ids[(size_t)i * k + j] = best;
        weights[(size_t)i * k + j] = s[best];
        sum += s[best];
    }
    for (int j = 0; j < k; j++) {
        float w = weights[(size_t)i * k + j];
        if (norm)
            w /= sum + 1e-20f;
        weights[(size_t)i * k + j] = w * scale;
    }
}

/* one warp per output (i, h, o), 8 warps a block: out (n, H, nout), x (n, H, x_stride),
 * w (H, nout, kin) bf16 */
static __global__ void family__head_matmul(float *out, const float *x, const uint16_t *w, int n,
                                           int H, int nout, int kin, int x_stride)
{
    const size_t task = (size_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (task >= (size_t)n * H * nout)
        return;
    const int o = (int)(task % nout), h = (int)(task / nout % H), i = (int)(task / nout / H);
    const float *xi = x + ((size_t)i * H + h) * x_stride;
    const uint16_t *wr = w + ((size_t)h * nout + o) * kin;
    float acc = 0.0f;
    for (int q = lane; q < kin; q += 32)
        acc += xi[q] * kutil_bf16_to_f32(wr[q]);
    acc = kutil_warp_sum(acc);
    if (lane == 0)
        out[((size_t)i * H + h) * nout + o] = acc;
}

/* grid (n), block 128: the latent of token i into its slot */
static __global__ void family__latent_write(uint8_t *arena, kv_layout_t l, int layer,
                                            const float *c, const float *kpe, const int32_t *slots,
                                            int r)
{
    __shared__ float red[32];
    const int i = blockIdx.x, D = l.head_dim, rope = D - r;
    const int32_t slot = slots[i];
    if (slot < 0)
        return;
    uint8_t *p = arena + (size_t)(slot / l.page_tokens) * l.page_bytes;
    const int tok = slot % l.page_tokens;
    uint8_t *data = p + kutil_kv_data_off(l, layer, 0);
    float amax = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        const float v = d < r ? c[(size_t)i * r + d] : kpe[(size_t)i * rope + d - r];
        amax = fmaxf(amax, fabsf(v));
    }
    if (l.fmt == PD_KV_FP8) /* uniform over the block */
        amax = kutil_block_max(amax, red);
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / s;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        const float v = d < r ? c[(size_t)i * r + d] : kpe[(size_t)i * rope + d - r];
        const size_t at = (size_t)tok * D + d;
        if (l.fmt == PD_KV_F32)
            ((float *)data)[at] = v;
        else if (l.fmt == PD_KV_BF16)
            ((uint16_t *)data)[at] = kutil_f32_to_bf16(v);
        else
            data[at] = kutil_f32_to_fp8(v * inv);
    }
    if (l.fmt == PD_KV_FP8 && threadIdx.x == 0)
        ((float *)(p + kutil_kv_scale_off(l, layer, 0)))[tok] = s;
}

/* latent element d of token tok of a page (f32) */
static __device__ __forceinline__ float family__lat(const uint8_t *page, const kv_layout_t &l,
                                                    int layer, int tok, int d, float s)
{
    const uint8_t *data = page + kutil_kv_data_off(l, layer, 0);
    const size_t at = (size_t)tok * l.head_dim + d;
    if (l.fmt == PD_KV_F32)
        return ((const float *)data)[at];
    if (l.fmt == PD_KV_BF16)
        return kutil_bf16_to_f32(((const uint16_t *)data)[at]);
    return kutil_fp8_to_f32(data[at]) * s;
}

#define FAMILY__ATT_THREADS 128
#define FAMILY__ATT_PER 8 /* r <= 8 * 128 */

/* grid (n_rows, H), block 128, smem head_dim floats: online softmax over the row's context */
static __global__ void family__latent_attention(float *out, const float *q_lat, const float *q_pe,
                                                const uint8_t *arena, kv_layout_t l, int layer,
                                                const int32_t *q_start, const int32_t *ctx_len,
                                                const int32_t *bt, int max_pages, int H, int r,
                                                int pe_stride, float scale)
{
    extern __shared__ float family__q[]; /* (head_dim) */
    __shared__ float red[32];
    const int row = blockIdx.x, h = blockIdx.y, D = l.head_dim, P = l.page_tokens;
    int s = 0;
    while (q_start[s + 1] <= row)
        s++;
    const int pos = ctx_len[s] - (q_start[s + 1] - q_start[s]) + (row - q_start[s]);
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        family__q[d] = d < r ? q_lat[((size_t)row * H + h) * r + d]
                             : q_pe[((size_t)row * H + h) * pe_stride + d - r];
    __syncthreads();
    float acc[FAMILY__ATT_PER], m = -INFINITY, lsum = 0.0f;
#pragma unroll
    for (int i = 0; i < FAMILY__ATT_PER; i++)
        acc[i] = 0.0f;
    for (int t = 0; t <= pos; t++) {
        const uint8_t *page = arena + (size_t)bt[(size_t)s * max_pages + t / P] * l.page_bytes;
        const int tok = t % P;
        const float ts = l.fmt == PD_KV_FP8
                             ? ((const float *)(page + kutil_kv_scale_off(l, layer, 0)))[tok]
                             : 1.0f;
        float part = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x)
            part += family__q[d] * family__lat(page, l, layer, tok, d, ts);
        const float score = kutil_block_sum(part, red) * scale;
        const float m_new = fmaxf(m, score), corr = expf(m - m_new), p = expf(score - m_new);
        lsum = lsum * corr + p;
#pragma unroll
        for (int i = 0; i < FAMILY__ATT_PER; i++) {
            const int d = threadIdx.x + i * blockDim.x;
            if (d < r)
                acc[i] = acc[i] * corr + p * family__lat(page, l, layer, tok, d, ts);
        }
        m = m_new;
    }
#pragma unroll
    for (int i = 0; i < FAMILY__ATT_PER; i++) {
        const int d = threadIdx.x + i * blockDim.x;
        if (d < r)
            out[((size_t)row * H + h) * r + d] = acc[i] / lsum;
    }
}

/* The tiled MLA decode / prefill kernel (session 16; family_mla_tile, the default since session 17:
 * on one H100, 2-layer DeepSeek-V3 decode steps 1.7-2.3x faster than with family__latent_attention,
 * docs/performance.md s17): grid (n_rows, ceil(H / FAMILY__TILE_HG)), block 32 FAMILY__TILE_HG, one
 * warp per query head of the block's group. The row's context is walked in tiles of 32 tokens; each
 * tile's latents [c | k_pe] (D = head_dim values per token, converted to f32 once) are staged in
 * shared memory by the whole block and read by all its heads, where family__latent_attention reads
 * them once per head and reduces across the block per token. In a tile, lane j scores token j (its
 * dot product with the warp's q over D), the warp takes the tile's max and sum by shuffles (online
 * softmax), and each lane accumulates the output dimensions lane + 32 i (< r) from the staged
 * latents. Shared memory: (HG D + 32 (D + 1)) f32 (row pitch D + 1: lane j's row starts in bank j).
 * r <= 32 FAMILY__TILE_ACC. */
#define FAMILY__TILE_HG 8
#define FAMILY__TILE_T 32
#define FAMILY__TILE_ACC 16 /* r <= 512 */
int family_mla_tile = 1;

static __global__ void __launch_bounds__(32 * FAMILY__TILE_HG)
    family__latent_attention_tile(float *out, const float *q_lat, const float *q_pe,
                                  const uint8_t *arena, kv_layout_t l, int layer,
                                  const int32_t *q_start, const int32_t *ctx_len, const int32_t *bt,
                                  int max_pages, int H, int r, int pe_stride, float scale)
{
    extern __shared__ float family__tsm[];
    const int row = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y * FAMILY__TILE_HG + warp, D = l.head_dim, P = l.page_tokens;
    const int DP = D + 1;
    float *sq = family__tsm, *sk = family__tsm + FAMILY__TILE_HG * D;
    int s = 0;
    while (q_start[s + 1] <= row)
        s++;
    const int pos = ctx_len[s] - (q_start[s + 1] - q_start[s]) + (row - q_start[s]);
    const bool active = h < H;
    for (int d = lane; d < D; d += 32)
        sq[warp * D + d] = !active ? 0.0f
                           : d < r ? q_lat[((size_t)row * H + h) * r + d]
                                   : q_pe[((size_t)row * H + h) * pe_stride + d - r];
    float acc[FAMILY__TILE_ACC], m = -INFINITY, lsum = 0.0f;
#pragma unroll
    for (int i = 0; i < FAMILY__TILE_ACC; i++)
        acc[i] = 0.0f;
    for (int t0 = 0; t0 <= pos; t0 += FAMILY__TILE_T) {
        const int nt = min(FAMILY__TILE_T, pos + 1 - t0);
        __syncthreads(); /* the previous tile is consumed (and sq written, the first time) */
        for (int j = warp; j < nt; j += FAMILY__TILE_HG) { /* warp w stages tokens w, w + HG.. */
            const int t = t0 + j, tok = t % P;
            const uint8_t *page = arena + (size_t)bt[(size_t)s * max_pages + t / P] * l.page_bytes;
            const float ts = l.fmt == PD_KV_FP8
                                 ? ((const float *)(page + kutil_kv_scale_off(l, layer, 0)))[tok]
                                 : 1.0f;
            for (int d = lane; d < D; d += 32)
                sk[j * DP + d] = family__lat(page, l, layer, tok, d, ts);
        }
        __syncthreads();
        if (!active)
            continue; /* the block's barriers above are still reached every tile */
        float score = -INFINITY;
        if (lane < nt) {
            const float *kr = sk + lane * DP, *qr = sq + warp * D;
            float dot = 0.0f;
            for (int d = 0; d < D; d++)
                dot = fmaf(qr[d], kr[d], dot);
            score = dot * scale;
        }
        const float m_new = fmaxf(m, kutil_warp_max(score)), corr = expf(m - m_new);
        const float p = lane < nt ? expf(score - m_new) : 0.0f;
        lsum = lsum * corr + kutil_warp_sum(p);
#pragma unroll
        for (int i = 0; i < FAMILY__TILE_ACC; i++)
            acc[i] *= corr;
        for (int j = 0; j < nt; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const float *kr = sk + j * DP;
#pragma unroll
            for (int i = 0; i < FAMILY__TILE_ACC; i++) {
                const int d = lane + 32 * i;
                if (d < r)
                    acc[i] = fmaf(pj, kr[d], acc[i]);
            }
        }
        m = m_new;
    }
    if (!active)
        return;
#pragma unroll
    for (int i = 0; i < FAMILY__TILE_ACC; i++) {
        const int d = lane + 32 * i;
        if (d < r)
            out[((size_t)row * H + h) * r + d] = acc[i] / lsum;
    }
}

/* ==== FP8 with 128x128 block scales (DeepSeek-V3 / Kimi K2 weight_scale_inv) ==== */

/* 8 warps a block, one weight row a warp: out (NT, N) f32 = x (NT, K) f32 @ W^T, W (N, K) e4m3
 * with scales (ceil(N / 128), kb) f32. Lane l reads 16 weight bytes at K offset 16 (l + 32 i): a
 * 16-byte run never crosses a 128-column scale block (K % 16 == 0), so each run's dot product is
 * taken unscaled and scaled once. */
template <int NT>
static __global__ void family__fp8b_gemv(float *out, const float *x, const uint8_t *w,
                                         const float *scales, int64_t N, int64_t K, int64_t kb)
{
    const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= N)
        return;
    const uint8_t *wr = w + r * K;
    const float *sr = scales + (r / 128) * kb;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    for (int64_t k0 = (int64_t)lane * 16; k0 < K; k0 += 32 * 16) {
        const uint4 raw = *(const uint4 *)(wr + k0);
        const uint32_t wd[4] = {raw.x, raw.y, raw.z, raw.w};
        float wf[16];
#pragma unroll
        for (int q = 0; q < 16; q++)
            wf[q] = kutil_fp8_to_f32((uint8_t)(wd[q >> 2] >> (8 * (q & 3))));
        const float s = sr[k0 / 128];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *xv = (const float4 *)(x + (size_t)t * K + k0);
            float part = 0.0f;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float4 v = xv[q];
                part += v.x * wf[4 * q] + v.y * wf[4 * q + 1] + v.z * wf[4 * q + 2] +
                        v.w * wf[4 * q + 3];
            }
            acc[t] += part * s;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = kutil_warp_sum(acc[t]);
        if (lane == 0)
            out[(size_t)t * N + r] = v;
    }
}

/* dst (N, K) bf16 = bf16(fp8(w) * scale of its block), 4 values a thread (K % 4 == 0) */
static __global__ void family__fp8b_to_bf16(uint16_t *dst, const uint8_t *w, const float *scales,
                                            int64_t N, int64_t K, int64_t kb)
{
    const size_t quads = (size_t)N * (size_t)K / 4;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < quads;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t e = i * 4;
        const int64_t r = (int64_t)(e / (size_t)K), c = (int64_t)(e % (size_t)K);
        const float s = scales[(r / 128) * kb + c / 128];
        const uint32_t q = ((const uint32_t *)w)[i];
        uint2 o;
        o.x = (uint32_t)kutil_f32_to_bf16(kutil_fp8_to_f32((uint8_t)q) * s) |
              ((uint32_t)kutil_f32_to_bf16(kutil_fp8_to_f32((uint8_t)(q >> 8)) * s) << 16);
        o.y = (uint32_t)kutil_f32_to_bf16(kutil_fp8_to_f32((uint8_t)(q >> 16)) * s) |
              ((uint32_t)kutil_f32_to_bf16(kutil_fp8_to_f32((uint8_t)(q >> 24)) * s) << 16);
        ((uint2 *)dst)[i] = o;
    }
}

/* dst / src as family_heads_copy says, one element a thread */
static __global__ void family__heads_copy(float *dst, const float *src, int n, int kvh, int G,
                                          int g0, int gs, int D, bool gather)
{
    const size_t total = (size_t)n * kvh * gs * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const int d = (int)(e % D);
        const size_t hs = e / D; /* (i, k, j) over (n, kvh, gs) */
        const int j = (int)(hs % gs), k = (int)(hs / gs % kvh);
        const size_t i = hs / gs / kvh;
        const size_t part = e, whole = ((i * kvh + k) * G + g0 + j) * D + d;
        if (gather)
            dst[part] = src[whole];
        else
            dst[whole] = src[part];
    }
}

/* ==== launchers ==== */

extern "C" pd_status_t family_bias_add(float *x, const float *bias, int n, int d,
                                       cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && d > 0, "bias_add");
    if (n == 0)
        return PD_OK;
    size_t blocks = ((size_t)n * d + 255) / 256;
    family__bias_add<<<(unsigned)(blocks > 65535 * 8 ? 65535 * 8 : blocks), 256, 0, stream>>>(
        x, bias, n, d);
    return KUTIL_LAUNCHED("bias_add");
}

extern "C" pd_status_t family_rope_partial(float *x, const int32_t *pos, const float *inv_freq,
                                           int n, int n_heads, int head_dim, int rot_dim,
                                           bool interleave, float scale, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && n_heads > 0 && rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_dim,
                  "rope_partial");
    if (n == 0)
        return PD_OK;
    family__rope_partial<<<n, 128, 0, stream>>>(x, pos, inv_freq, n_heads, head_dim, rot_dim,
                                                interleave, scale);
    return KUTIL_LAUNCHED("rope_partial");
}

extern "C" pd_status_t family_moe_route_grouped(int32_t *ids, float *weights, const float *logits,
                                                const float *bias, int n, int n_experts, int k,
                                                int n_group, int topk_group, bool norm, float scale,
                                                cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && n_experts > 0 && n_experts <= 1024 && n_group > 0 && n_group <= 64 &&
                      n_experts % n_group == 0 && topk_group >= 1 && topk_group <= n_group &&
                      k >= 1 && k <= topk_group * (n_experts / n_group),
                  "moe_route_grouped");
    if (n == 0)
        return PD_OK;
    family__moe_route_grouped<<<n, 32, 0, stream>>>(ids, weights, logits, bias, n_experts, k,
                                                    n_group, topk_group, norm, scale);
    return KUTIL_LAUNCHED("moe_route_grouped");
}

extern "C" pd_status_t family_head_matmul(float *out, const float *x, const uint16_t *w, int n,
                                          int n_heads, int nout, int kin, int x_stride,
                                          cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && n_heads > 0 && nout > 0 && kin > 0 && x_stride >= kin, "head_matmul");
    const size_t tasks = (size_t)n * n_heads * nout, blocks = (tasks + 7) / 8;
    KUTIL_REQUIRE(blocks < (1u << 31), "head_matmul");
    if (n == 0)
        return PD_OK;
    family__head_matmul<<<(unsigned)blocks, 256, 0, stream>>>(out, x, w, n, n_heads, nout, kin,
                                                              x_stride);
    return KUTIL_LAUNCHED("head_matmul");
}

extern "C" pd_status_t family_latent_write(void *arena, const kv_layout_t *l, int layer,
                                           const float *c, const float *kpe, const int32_t *slots,
                                           int n, int r, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && layer >= 0 && layer < l->n_layers && l->n_sides == 1 &&
                      l->n_kv_heads == 1 && r > 0 && r < l->head_dim,
                  "latent_write");
    if (n == 0)
        return PD_OK;
    family__latent_write<<<n, 128, 0, stream>>>((uint8_t *)arena, *l, layer, c, kpe, slots, r);
    return KUTIL_LAUNCHED("latent_write");
}

extern "C" pd_status_t family_latent_attention(float *out, const float *q_lat, const float *q_pe,
                                               const void *arena, const kv_layout_t *l, int layer,
                                               const int32_t *q_start, const int32_t *ctx_len,
                                               const int32_t *block_tables, int n_seqs,
                                               int max_pages, int n_rows, int n_heads, int r,
                                               int pe_stride, float scale, cudaStream_t stream)
{
    KUTIL_REQUIRE(n_rows >= 0 && n_seqs > 0 && n_heads > 0 && n_heads < 65536 && l->n_sides == 1 &&
                      l->n_kv_heads == 1 && r > 0 && r < l->head_dim &&
                      r <= FAMILY__ATT_PER * FAMILY__ATT_THREADS && pe_stride >= l->head_dim - r &&
                      l->head_dim * 4 <= 48 * 1024,
                  "latent_attention");
    if (n_rows == 0)
        return PD_OK;
    const size_t tsm =
        ((size_t)FAMILY__TILE_HG * l->head_dim + (size_t)FAMILY__TILE_T * (l->head_dim + 1)) * 4;
    if (family_mla_tile && r <= 32 * FAMILY__TILE_ACC && tsm <= 96 * 1024) {
        static unsigned attr; /* per device (kutil_allow_smem) */
        if (kutil_allow_smem((const void *)family__latent_attention_tile, 96 * 1024, &attr,
                             "latent_attention smem") != PD_OK)
            return PD_ERR_CUDA; /* logged */
        family__latent_attention_tile<<<
            dim3((unsigned)n_rows, (unsigned)((n_heads + FAMILY__TILE_HG - 1) / FAMILY__TILE_HG)),
            32 * FAMILY__TILE_HG, tsm, stream>>>(out, q_lat, q_pe, (const uint8_t *)arena, *l,
                                                 layer, q_start, ctx_len, block_tables, max_pages,
                                                 n_heads, r, pe_stride, scale);
        return KUTIL_LAUNCHED("latent_attention (tiled)");
    }
    family__latent_attention<<<dim3(n_rows, n_heads), FAMILY__ATT_THREADS,
                               (size_t)l->head_dim * sizeof(float), stream>>>(
        out, q_lat, q_pe, (const uint8_t *)arena, *l, layer, q_start, ctx_len, block_tables,
        max_pages, n_heads, r, pe_stride, scale);
    return KUTIL_LAUNCHED("latent_attention");
}

extern "C" pd_status_t family_fp8_block_gemv(float *out, const float *x, const pd_weight_t *w,
                                             int n, cudaStream_t stream)
{
    const int64_t N = w->n, K = w->k;
    KUTIL_REQUIRE(w->fmt == PD_WFMT_FP8_BLOCK && n >= 0 && n <= FAMILY_FP8_BLOCK_GEMV_MAX_N &&
                      N > 0 && K > 0 && K % 16 == 0 && (N + 7) / 8 < (1ll << 31),
                  "fp8_block_gemv");
    if (n == 0)
        return PD_OK;
    const unsigned blocks = (unsigned)((N + 7) / 8);
    const int64_t kb = (K + QUANT_FP8_BLOCK - 1) / QUANT_FP8_BLOCK;
    const uint8_t *wd = (const uint8_t *)w->data;
    const float *ws = (const float *)w->scales;
    switch (n) {
#define FAMILY__GEMV_CASE(T)                                                                       \
    case T:                                                                                        \
        family__fp8b_gemv<T><<<blocks, 256, 0, stream>>>(out, x, wd, ws, N, K, kb);                \
        break;
        FAMILY__GEMV_CASE(1)
        FAMILY__GEMV_CASE(2)
        FAMILY__GEMV_CASE(3)
        FAMILY__GEMV_CASE(4)
        FAMILY__GEMV_CASE(5)
        FAMILY__GEMV_CASE(6)
        FAMILY__GEMV_CASE(7)
        FAMILY__GEMV_CASE(8)
#undef FAMILY__GEMV_CASE
    }
    return KUTIL_LAUNCHED("fp8_block_gemv");
}

extern "C" pd_status_t family_fp8_block_to_bf16(uint16_t *dst, const pd_weight_t *w,
                                                cudaStream_t stream)
{
    KUTIL_REQUIRE(w->fmt == PD_WFMT_FP8_BLOCK && w->n > 0 && w->k > 0 && w->k % 4 == 0,
                  "fp8_block_to_bf16");
    const size_t quads = (size_t)w->n * (size_t)w->k / 4, blocks = (quads + 255) / 256;
    family__fp8b_to_bf16<<<(unsigned)(blocks < 65535 * 16 ? blocks : 65535 * 16), 256, 0, stream>>>(
        dst, (const uint8_t *)w->data, (const float *)w->scales, w->n, w->k,
        (w->k + QUANT_FP8_BLOCK - 1) / QUANT_FP8_BLOCK);
    return KUTIL_LAUNCHED("fp8_block_to_bf16");
}

extern "C" pd_status_t family_heads_copy(float *dst, const float *src, int n, int kvh, int G,
                                         int g0, int gs, int D, bool gather, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && kvh > 0 && gs > 0 && g0 >= 0 && g0 + gs <= G && D > 0, "heads_copy");
    const size_t total = (size_t)n * kvh * gs * D, blocks = (total + 255) / 256;
    if (total == 0)
        return PD_OK;
    family__heads_copy<<<(unsigned)(blocks < 65535 * 16 ? blocks : 65535 * 16), 256, 0, stream>>>(
        dst, src, n, kvh, G, g0, gs, D, gather);
    return KUTIL_LAUNCHED("heads_copy");
}
