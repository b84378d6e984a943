/* kv: paged KV write, FP8 export, header stamps and the batched tag check (see kv.h). */
#include "kutil.cuh"
#include "kv.h"
#include "kv_digest.h"

/* ==== kernels ==== */

/* Stores one (token, head) vector src (D) f32 — one warp — at element offset base of data
 * (page side of fmt l.fmt); fp8 writes its scale to *scale. */
static __device__ void kv__store(uint8_t *data, float *scale, size_t base, const float *src,
                                 const kv_layout_t &l, int lane)
{
    const int D = l.head_dim;
    if (l.fmt == PD_KV_F32) {
        for (int d = lane; d < D; d += 32)
            ((float *)data)[base + d] = src[d];
    } else if (l.fmt == PD_KV_BF16) {
        for (int d = lane; d < D; d += 32)
            ((uint16_t *)data)[base + d] = kutil_f32_to_bf16(src[d]);
    } else {
        float amax = 0.0f;
        for (int d = lane; d < D; d += 32)
            amax = fmaxf(amax, fabsf(src[d]));
        amax = kutil_warp_max(amax);
        const float s = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / s;
        for (int d = lane; d < D; d += 32)
            data[base + d] = kutil_f32_to_fp8(src[d] * inv);
        if (lane == 0)
            *scale = s;
    }
}

/* grid (n, 2 sides), block 32 * n_kv_heads (<= 1024; warp per head): arena pages,
 * k, v (n, n_kv_heads, head_dim) f32, slots (n) int32 (< 0: row skipped) */
static __global__ void kv__write(uint8_t *arena, kv_layout_t l, int layer, const float *k,
                                 const float *v, const int32_t *slots)
{
    const int i = blockIdx.x, side = blockIdx.y, h = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int H = l.n_kv_heads, D = l.head_dim;
    const int32_t slot = slots[i], page = slot / l.page_tokens, tok = slot % l.page_tokens;
    if (slot < 0) /* a padded row (graph buckets): writes nothing */
        return;
    uint8_t *p = arena + (size_t)page * l.page_bytes;
    const float *src = (side ? v : k) + ((size_t)i * H + h) * D;
    uint8_t *data = p + kutil_kv_data_off(l, layer, side);
    float *scales = l.fmt == PD_KV_FP8 ? (float *)(p + kutil_kv_scale_off(l, layer, side)) : NULL;
    kv__store(data, scales ? scales + (size_t)tok * H + h : NULL, ((size_t)tok * H + h) * D, src, l,
              lane);
}

/* The decode step's RoPE + KV write in one launch: rotate-half RoPE (as elementwise__rope, the
 * same arithmetic: results bit-identical) on q and k in place, then k (rotated) and v into the
 * pages as kv__write. grid (n), block 32 * max(n_kv_heads, 4) (<= 1024): q (n, n_heads, D) f32,
 * k, v (n, n_kv_heads, D) f32, pos (n) int32, inv_freq (D / 2) f32, arena pages (layout l),
 * slots (n) int32 (< 0: no KV write for that row; q and k are still rotated). */
static __global__ void kv__rope_write(float *q, float *k, const float *v, const int32_t *pos,
                                      const float *inv_freq, int n_heads, uint8_t *arena,
                                      kv_layout_t l, int layer, const int32_t *slots)
{
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): everything after reads earlier kernels' data */
    kutil_pdl_trigger();
    const int i = blockIdx.x, H = l.n_kv_heads, D = l.head_dim, half = D / 2;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float p = (float)pos[i];
    float *qr = q + (size_t)i * n_heads * D;
    for (int x = threadIdx.x; x < n_heads * half; x += blockDim.x) {
        const int h = x / half, j = x % half;
        const float ang = p * inv_freq[j];
        const float c = cosf(ang), s = sinf(ang);
        float *vv = qr + (size_t)h * D;
        const float a = vv[j], b = vv[j + half];
        vv[j] = a * c - b * s;
        vv[j + half] = b * c + a * s;
    }
    if (w >= H)
        return;
    /* warp w: kv head w; the rotated row goes back to k (kv__store reads it from there) */
    float *kr = k + ((size_t)i * H + w) * D;
    for (int j = lane; j < half; j += 32) {
        const float ang = p * inv_freq[j];
        const float c = cosf(ang), s = sinf(ang);
        const float a = kr[j], b = kr[j + half];
        kr[j] = a * c - b * s;
        kr[j + half] = b * c + a * s;
    }
    __syncwarp();
    const int32_t slot = slots[i];
    if (slot < 0)
        return;
    const int page = slot / l.page_tokens, tok = slot % l.page_tokens;
    uint8_t *pg = arena + (size_t)page * l.page_bytes;
    for (int side = 0; side < 2; side++) {
        const float *src = side ? v + ((size_t)i * H + w) * D : kr;
        float *scales =
            l.fmt == PD_KV_FP8 ? (float *)(pg + kutil_kv_scale_off(l, layer, side)) : NULL;
        kv__store(pg + kutil_kv_data_off(l, layer, side),
                  scales ? scales + (size_t)tok * H + w : NULL, ((size_t)tok * H + w) * D, src, l,
                  lane);
    }
}

/* kv__rope_write with one warp per (token, head) instead of one block per token (session 12: at
 * batch 1 the block rotated 32 q heads in 8 dependent load / store rounds per thread and then
 * re-read its k row for the store: 6.9 us on the step's critical path, 14 us at batch 64 on 64
 * SMs). grid (n, ceil((n_heads + n_kv_heads) / KV__RW_WARPS)), block 32 * KV__RW_WARPS: warp
 * slot hs < n_heads rotates q head hs, n_heads <= hs < n_heads + n_kv_heads rotates k head
 * hs - n_heads, writes it back to k and stores it and v's row into the pages. Lane pairs (j,
 * j + D / 2), j = lane + 32 i (i < PPL = ceil(D / 64)), all loaded before any store. The same
 * expressions as kv__rope_write / elementwise__rope / kv__store: bit-identical results. */
#define KV__RW_WARPS 8
template <int PPL>
static __device__ __forceinline__ void kv__store_pairs(uint8_t *data, float *scale, size_t base,
                                                       const float (&lo)[PPL], const float (&hi)[PPL],
                                                       const kv_layout_t &l, int lane)
{
    const int half = l.head_dim / 2;
    if (l.fmt == PD_KV_F32) {
#pragma unroll
        for (int i = 0; i < PPL; i++)
            if (lane + 32 * i < half) {
                ((float *)data)[base + lane + 32 * i] = lo[i];
                ((float *)data)[base + lane + 32 * i + half] = hi[i];
            }
    } else if (l.fmt == PD_KV_BF16) {
#pragma unroll
        for (int i = 0; i < PPL; i++)
            if (lane + 32 * i < half) {
                ((uint16_t *)data)[base + lane + 32 * i] = kutil_f32_to_bf16(lo[i]);
                ((uint16_t *)data)[base + lane + 32 * i + half] = kutil_f32_to_bf16(hi[i]);
            }
    } else {
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < PPL; i++)
            if (lane + 32 * i < half)
                amax = fmaxf(amax, fmaxf(fabsf(lo[i]), fabsf(hi[i])));
        amax = kutil_warp_max(amax);
        const float s = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / s;
#pragma unroll
        for (int i = 0; i < PPL; i++)
            if (lane + 32 * i < half) {
                data[base + lane + 32 * i] = kutil_f32_to_fp8(lo[i] * inv);
                data[base + lane + 32 * i + half] = kutil_f32_to_fp8(hi[i] * inv);
            }
        if (lane == 0)
            *scale = s;
    }
}

template <int PPL>
static __global__ void __launch_bounds__(32 * KV__RW_WARPS)
    kv__rope_write_w(float *q, float *k, const float *v, const int32_t *pos,
                     const float *inv_freq, int n_heads, uint8_t *arena, kv_layout_t l, int layer,
                     const int32_t *slots)
{
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): everything after reads earlier kernels' data */
    kutil_pdl_trigger();
    const int i = blockIdx.x, H = l.n_kv_heads, D = l.head_dim, half = D / 2;
    const int hs = blockIdx.y * KV__RW_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (hs >= n_heads + H)
        return;
    const bool isk = hs >= n_heads;
    const int h = isk ? hs - n_heads : hs;
    float *row = isk ? k + ((size_t)i * H + h) * D : q + ((size_t)i * n_heads + h) * D;
    float a[PPL], b[PPL], vl[PPL], vh[PPL];
    const float *vr = v + ((size_t)i * H + h) * D;
    int32_t slot = -1;
#pragma unroll
    for (int t = 0; t < PPL; t++) {
        const int j = lane + 32 * t;
        a[t] = b[t] = vl[t] = vh[t] = 0.0f;
        if (j < half) {
            a[t] = row[j];
            b[t] = row[j + half];
            if (isk) {
                vl[t] = vr[j];
                vh[t] = vr[j + half];
            }
        }
    }
    if (isk)
        slot = slots[i];
    const float p = (float)pos[i];
#pragma unroll
    for (int t = 0; t < PPL; t++) {
        const int j = lane + 32 * t;
        if (j < half) {
            const float ang = p * inv_freq[j];
            const float c = cosf(ang), s = sinf(ang);
            const float x = a[t], y = b[t];
            a[t] = x * c - y * s;
            b[t] = y * c + x * s;
            row[j] = a[t];
            row[j + half] = b[t];
        }
    }
    if (!isk || slot < 0)
        return;
    const int page = slot / l.page_tokens, tok = slot % l.page_tokens;
    uint8_t *pg = arena + (size_t)page * l.page_bytes;
    for (int side = 0; side < 2; side++) {
        float *scales =
            l.fmt == PD_KV_FP8 ? (float *)(pg + kutil_kv_scale_off(l, layer, side)) : NULL;
        kv__store_pairs<PPL>(pg + kutil_kv_data_off(l, layer, side),
                             scales ? scales + (size_t)tok * H + h : NULL,
                             ((size_t)tok * H + h) * D, side ? vl : a, side ? vh : b, l, lane);
    }
}

/* an element of kv__rope_write_t's inputs as f32 (not static: only the bf16 one is used) */
__device__ __forceinline__ float kv__wide(float x)
{
    return x;
}
__device__ __forceinline__ float kv__wide(uint16_t x)
{
    return kutil_bf16_to_f32(x);
}

/* kv__rope_write for q, k, v of element type T (float or uint16_t bf16: the prefill GEMMs'
 * bf16 outputs, kv_rope_write_bf16): q_in rotated into q_out f32 (the layout flash attention
 * reads), k rotated and v widened to f32 in shared memory, then into the pages as kv__store.
 * The arithmetic is kv__rope_write's on the widened values. k and v are only read.
 * grid (n), block 32 * max(n_kv_heads, 4) (<= 1024), shared n_kv_heads * 2 * D f32:
 * q_in (n, n_heads, D) T, q_out (n, n_heads, D) f32 (not aliasing q_in), k, v
 * (n, n_kv_heads, D) T, pos (n) int32, inv_freq (D / 2) f32, slots (n) int32 (< 0: no write). */
template <typename T>
static __global__ void kv__rope_write_t(float *q_out, const T *q_in, const T *k, const T *v,
                                        const int32_t *pos, const float *inv_freq, int n_heads,
                                        uint8_t *arena, kv_layout_t l, int layer,
                                        const int32_t *slots)
{
    extern __shared__ float kv__rw[]; /* (n_kv_heads, 2, D): rotated k, widened v */
    const int i = blockIdx.x, H = l.n_kv_heads, D = l.head_dim, half = D / 2;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float p = (float)pos[i];
    const T *qi = q_in + (size_t)i * n_heads * D;
    float *qo = q_out + (size_t)i * n_heads * D;
    for (int x = threadIdx.x; x < n_heads * half; x += blockDim.x) {
        const int h = x / half, j = x % half;
        const float ang = p * inv_freq[j];
        const float c = cosf(ang), s = sinf(ang);
        const float a = kv__wide(qi[(size_t)h * D + j]), b = kv__wide(qi[(size_t)h * D + j + half]);
        qo[(size_t)h * D + j] = a * c - b * s;
        qo[(size_t)h * D + j + half] = b * c + a * s;
    }
    if (w >= H)
        return;
    const T *kr = k + ((size_t)i * H + w) * D, *vr = v + ((size_t)i * H + w) * D;
    float *ks = kv__rw + (size_t)w * 2 * D, *vs = ks + D;
    for (int j = lane; j < half; j += 32) {
        const float ang = p * inv_freq[j];
        const float c = cosf(ang), s = sinf(ang);
        const float a = kv__wide(kr[j]), b = kv__wide(kr[j + half]);
        ks[j] = a * c - b * s;
        ks[j + half] = b * c + a * s;
    }
    for (int d = lane; d < D; d += 32)
        vs[d] = kv__wide(vr[d]);
    __syncwarp();
    const int32_t slot = slots[i];
    if (slot < 0)
        return;
    const int page = slot / l.page_tokens, tok = slot % l.page_tokens;
    uint8_t *pg = arena + (size_t)page * l.page_bytes;
    for (int side = 0; side < 2; side++) {
        float *scales =
            l.fmt == PD_KV_FP8 ? (float *)(pg + kutil_kv_scale_off(l, layer, side)) : NULL;
        kv__store(pg + kutil_kv_data_off(l, layer, side),
                  scales ? scales + (size_t)tok * H + w : NULL, ((size_t)tok * H + w) * D,
                  side ? vs : ks, l, lane);
    }
}

/* grid (n_pages, n_layers * n_sides, page_tokens), block 32 * n_kv_heads: layers
 * [layer0, layer0 + gridDim.y / n_sides) of arena (src_l) pages src_pages (n_pages) int32 into dst
 * (dst_l) at page dst_pages[p] (NULL: p); layer0 == 0 writes the header, its stamp tags[p] when
 * tags is not NULL */
static __global__ void kv__export(uint8_t *dst, kv_layout_t dl, const int32_t *dst_pages,
                                  const kv_tag_t *tags, const uint8_t *arena, kv_layout_t sl,
                                  const int32_t *src_pages, int layer0)
{
    extern __shared__ float kv__buf[]; /* (n_kv_heads, head_dim) f32 */
    const int p = blockIdx.x, layer = layer0 + (int)blockIdx.y / sl.n_sides,
              side = blockIdx.y % sl.n_sides, t = blockIdx.z;
    const int h = threadIdx.x >> 5, lane = threadIdx.x & 31, H = sl.n_kv_heads, D = sl.head_dim;
    const uint8_t *sp = arena + (size_t)src_pages[p] * sl.page_bytes;
    uint8_t *dp = dst + (size_t)(dst_pages ? dst_pages[p] : p) * dl.page_bytes;
    if (layer0 == 0 && blockIdx.y == 0 && t == 0) {
        for (int b = threadIdx.x; b < KV_PAGE_HEADER_BYTES; b += blockDim.x)
            dp[b] = tags && b < (int)sizeof(kv_tag_t) ? ((const uint8_t *)&tags[p])[b] : sp[b];
        /* the page's tail past the data and scales: zeros, so that a page written layer by
         * layer has defined bytes everywhere (the KV-done checksum covers whole pages) */
        const size_t used = KV_PAGE_HEADER_BYTES +
                            (size_t)dl.n_layers * dl.n_sides * (dl.side_bytes + dl.scale_bytes);
        for (size_t b = used + threadIdx.x; b < dl.page_bytes; b += blockDim.x)
            dp[b] = 0;
    }
    const uint8_t *sd = sp + kutil_kv_data_off(sl, layer, side);
    const size_t base = ((size_t)t * H + h) * D;
    float *row = kv__buf + (size_t)h * D;
    for (int d = lane; d < D; d += 32) {
        if (sl.fmt == PD_KV_F32)
            row[d] = ((const float *)sd)[base + d];
        else if (sl.fmt == PD_KV_BF16)
            row[d] = kutil_bf16_to_f32(((const uint16_t *)sd)[base + d]);
        else
            row[d] = kutil_fp8_to_f32(sd[base + d]) *
                     ((const float *)(sp + kutil_kv_scale_off(sl, layer, side)))[t * H + h];
    }
    __syncwarp();
    float *scales =
        dl.fmt == PD_KV_FP8 ? (float *)(dp + kutil_kv_scale_off(dl, layer, side)) : NULL;
    kv__store(dp + kutil_kv_data_off(dl, layer, side), scales ? scales + (size_t)t * H + h : NULL,
              base, row, dl, lane);
}

/* arena pages, pages (n) int32, tags (n) uint64 (page headers are 64-byte aligned) */
static __global__ void kv__stamp(uint8_t *arena, size_t page_bytes, const int32_t *pages,
                                 const kv_tag_t *tags, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        *(kv_tag_t *)(arena + (size_t)pages[i] * page_bytes) = tags[i];
}

/* bad (n) uint8, found (n) uint64; pages (n) int32, expected, current (n) uint64 */
static __global__ void kv__check(uint8_t *bad, kv_tag_t *found, const uint8_t *arena,
                                 size_t page_bytes, const int32_t *pages, const kv_tag_t *expected,
                                 const kv_tag_t *current, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const kv_tag_t stamp = *(const kv_tag_t *)(arena + (size_t)pages[i] * page_bytes);
    found[i] = stamp;
    bad[i] = current[i] != expected[i] ? 1 : stamp != expected[i] ? 2 : 0;
}

/* One block of KV__DIGEST_THREADS per page: each thread sums the terms of words tid, tid + T, ...
 * (16-byte loads), then a wrapping sum over the block (kv_digest.h). */
#define KV__DIGEST_THREADS 256
static __global__ void kv__digest(uint64_t *digests, const uint8_t *base, size_t page_bytes,
                                  const int32_t *pages)
{
    __shared__ uint64_t part[KV__DIGEST_THREADS / 32];
    const int b = blockIdx.x;
    const uint8_t *p = base + (size_t)(pages ? pages[b] : b) * page_bytes;
    const size_t m = page_bytes / 8, m2 = m / 2;
    uint64_t sum = 0;
    for (size_t i = threadIdx.x; i < m2; i += KV__DIGEST_THREADS) {
        const ulonglong2 w = ((const ulonglong2 *)p)[i];
        sum += kv_digest_term(w.x, 2 * i) + kv_digest_term(w.y, 2 * i + 1);
    }
    if (threadIdx.x == 0 && (m & 1))
        sum += kv_digest_term(((const uint64_t *)p)[m - 1], m - 1);
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t t = 0;
        for (int w = 0; w < KV__DIGEST_THREADS / 32; w++)
            t += part[w];
        digests[b] = kv_digest_final(t, page_bytes);
    }
}

/* ==== launchers ==== */

extern "C" pd_status_t kv_write(void *arena, const kv_layout_t *l, int layer, const float *k,
                                const float *v, const int32_t *slots, int n, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && layer >= 0 && layer < l->n_layers, "kv_write");
    KUTIL_REQUIRE(l->n_kv_heads > 0 && l->n_kv_heads <= 32 && l->head_dim > 0, "kv_write");
    if (n == 0)
        return PD_OK;
    kv__write<<<dim3(n, 2), 32 * l->n_kv_heads, 0, stream>>>((uint8_t *)arena, *l, layer, k, v,
                                                             slots);
    return KUTIL_LAUNCHED("kv_write");
}

/* 1: kv__rope_write_w (the default); 0: the block-per-token kernel (A / B measurements) */
extern "C" {
int kv_rope_write_warps = 1;
}

extern "C" pd_status_t kv_rope_write(float *q, float *k, const float *v, const int32_t *pos,
                                     const float *inv_freq, int n, int n_heads, void *arena,
                                     const kv_layout_t *l, int layer, const int32_t *slots,
                                     cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && layer >= 0 && layer < l->n_layers && n_heads > 0, "kv_rope_write");
    KUTIL_REQUIRE(l->n_kv_heads > 0 && l->n_kv_heads <= 32 && l->head_dim > 0 &&
                      l->head_dim % 2 == 0,
                  "kv_rope_write");
    if (n == 0)
        return PD_OK;
    const int ppl = (l->head_dim / 2 + 31) / 32;
    const dim3 grid((unsigned)n, (unsigned)((n_heads + l->n_kv_heads + KV__RW_WARPS - 1) /
                                            KV__RW_WARPS));
    if (ppl <= 4 && kv_rope_write_warps) { /* a warp per (token, head); head_dim <= 256 */
        if (ppl == 1)
            kutil_launch_pdl(kv__rope_write_w<1>, grid, dim3(32 * KV__RW_WARPS), 0, stream, q, k,
                             v, pos, inv_freq, n_heads, (uint8_t *)arena, *l, layer, slots);
        else if (ppl == 2)
            kutil_launch_pdl(kv__rope_write_w<2>, grid, dim3(32 * KV__RW_WARPS), 0, stream, q, k,
                             v, pos, inv_freq, n_heads, (uint8_t *)arena, *l, layer, slots);
        else
            kutil_launch_pdl(kv__rope_write_w<4>, grid, dim3(32 * KV__RW_WARPS), 0, stream, q, k,
                             v, pos, inv_freq, n_heads, (uint8_t *)arena, *l, layer, slots);
        return KUTIL_LAUNCHED("kv_rope_write");
    }
    const int warps = l->n_kv_heads > 4 ? l->n_kv_heads : 4;
    kutil_launch_pdl(kv__rope_write, dim3(n), dim3(32 * warps), 0, stream, q, k, v, pos, inv_freq,
                     n_heads, (uint8_t *)arena, *l, layer, slots);
    return KUTIL_LAUNCHED("kv_rope_write");
}

extern "C" pd_status_t kv_rope_write_bf16(float *q_out, const uint16_t *q, const uint16_t *k,
                                          const uint16_t *v, const int32_t *pos,
                                          const float *inv_freq, int n, int n_heads, void *arena,
                                          const kv_layout_t *l, int layer, const int32_t *slots,
                                          cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && layer >= 0 && layer < l->n_layers && n_heads > 0, "kv_rope_write_bf16");
    KUTIL_REQUIRE(l->n_kv_heads > 0 && l->n_kv_heads <= 32 && l->head_dim > 0 &&
                      l->head_dim % 2 == 0 && l->n_kv_heads * 2 * l->head_dim * 4 <= 48 * 1024,
                  "kv_rope_write_bf16");
    if (n == 0)
        return PD_OK;
    const int warps = l->n_kv_heads > 4 ? l->n_kv_heads : 4;
    const size_t smem = (size_t)l->n_kv_heads * 2 * l->head_dim * sizeof(float);
    kv__rope_write_t<uint16_t><<<n, 32 * warps, smem, stream>>>(
        q_out, q, k, v, pos, inv_freq, n_heads, (uint8_t *)arena, *l, layer, slots);
    return KUTIL_LAUNCHED("kv_rope_write_bf16");
}

extern "C" pd_status_t kv_export(void *dst, const kv_layout_t *dst_l, const void *arena,
                                 const kv_layout_t *src_l, const int32_t *src_pages, int n_pages,
                                 cudaStream_t stream)
{
    return kv_export_layers(dst, dst_l, NULL, NULL, arena, src_l, src_pages, n_pages, 0,
                            src_l->n_layers, stream);
}

extern "C" pd_status_t kv_export_layers(void *dst, const kv_layout_t *dst_l,
                                        const int32_t *dst_pages, const kv_tag_t *tags,
                                        const void *arena, const kv_layout_t *src_l,
                                        const int32_t *src_pages, int n_pages, int layer0,
                                        int n_layers, cudaStream_t stream)
{
    KUTIL_REQUIRE(n_pages >= 0 && n_pages < 65536 * 1024, "kv_export");
    KUTIL_REQUIRE(dst_l->n_layers == src_l->n_layers && dst_l->n_kv_heads == src_l->n_kv_heads &&
                      dst_l->head_dim == src_l->head_dim &&
                      dst_l->page_tokens == src_l->page_tokens && src_l->n_kv_heads <= 32 &&
                      dst_l->n_sides == src_l->n_sides,
                  "kv_export");
    KUTIL_REQUIRE(layer0 >= 0 && n_layers >= 0 && layer0 + n_layers <= src_l->n_layers,
                  "kv_export");
    if (n_pages == 0 || n_layers == 0)
        return PD_OK;
    const size_t smem = (size_t)src_l->n_kv_heads * src_l->head_dim * sizeof(float);
    KUTIL_REQUIRE(smem <= 48 * 1024 && n_layers * src_l->n_sides < 65536 &&
                      src_l->page_tokens < 65536,
                  "kv_export");
    kv__export<<<dim3(n_pages, n_layers * src_l->n_sides, src_l->page_tokens),
                 32 * src_l->n_kv_heads, smem, stream>>>(
        (uint8_t *)dst, *dst_l, dst_pages, tags, (const uint8_t *)arena, *src_l, src_pages, layer0);
    return KUTIL_LAUNCHED("kv_export");
}

extern "C" pd_status_t kv_stamp(void *arena, const kv_layout_t *l, const int32_t *pages,
                                const kv_tag_t *tags, int n, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0, "kv_stamp");
    if (n == 0)
        return PD_OK;
    kv__stamp<<<(n + 255) / 256, 256, 0, stream>>>((uint8_t *)arena, l->page_bytes, pages, tags, n);
    return KUTIL_LAUNCHED("kv_stamp");
}

extern "C" pd_status_t kv_check(uint8_t *bad, kv_tag_t *found, const void *arena,
                                const kv_layout_t *l, const int32_t *pages,
                                const kv_tag_t *expected, const kv_tag_t *current, int n,
                                cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0, "kv_check");
    if (n == 0)
        return PD_OK;
    kv__check<<<(n + 255) / 256, 256, 0, stream>>>(bad, found, (const uint8_t *)arena,
                                                   l->page_bytes, pages, expected, current, n);
    return KUTIL_LAUNCHED("kv_check");
}

extern "C" pd_status_t kv_digest(uint64_t *digests, const void *base, size_t page_bytes,
                                 const int32_t *pages, int n, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && page_bytes % 16 == 0 && ((uintptr_t)base & 15) == 0, "kv_digest");
    if (n == 0)
        return PD_OK;
    kv__digest<<<n, KV__DIGEST_THREADS, 0, stream>>>(digests, (const uint8_t *)base, page_bytes,
                                                     pages);
    return KUTIL_LAUNCHED("kv_digest");
}
