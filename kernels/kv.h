/* kv: the paged KV cache kernels (layout in common/kv_pool.h): writing new K/V rows into pages
 * (bf16 / f32 / fp8 with per (token, head) scales), converting pages to FP8 for export, and the
 * page-header stamps of the integrity check. Pointers are device memory, the arena holds
 * n_pages * l->page_bytes bytes. Launchers check shapes (PD_ERR_INVALID), enqueue on `stream`,
 * return the launch status (PD_ERR_CUDA), allocate nothing.
 */
#ifndef PD_KERNELS_KV_H
#define PD_KERNELS_KV_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kv_pool.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes k, v (n, n_kv_heads, head_dim) f32 at slots (n) int32 (page * page_tokens + offset) of
 * `layer`, converting to l->fmt (fp8: scale = max|x| / 448 per (token, head)). */
pd_status_t kv_write(void *arena, const kv_layout_t *l, int layer, const float *k, const float *v,
                     const int32_t *slots, int n, cudaStream_t stream);

/* The decode step's RoPE + KV write in one launch: rotate-half RoPE at positions pos (n) int32
 * with inv_freq (head_dim / 2) f32 on q (n, n_heads, head_dim) and k (n, n_kv_heads, head_dim)
 * f32 in place, then kv_write of the rotated k and v (n, n_kv_heads, head_dim) f32 at slots (n)
 * int32 (< 0: not written). Bit-identical to elementwise_rope on q and k followed by kv_write. */
pd_status_t kv_rope_write(float *q, float *k, const float *v, const int32_t *pos,
                          const float *inv_freq, int n, int n_heads, void *arena,
                          const kv_layout_t *l, int layer, const int32_t *slots,
                          cudaStream_t stream);
/* 1 (default): kv_rope_write runs a warp per (token, head) (head_dim <= 256); 0: one block per
 * token, session 3's kernel (PD_CUDA_ROPE_WARPS=0; A / B measurements) */
extern int kv_rope_write_warps;

/* kv_rope_write on bf16 q, k, v (the prefill FP8 GEMMs' bf16 outputs): q (n, n_heads, head_dim)
 * bf16 rotated into q_out f32 (same shape, must not alias q), k rotated and v (n, n_kv_heads,
 * head_dim) bf16 written at slots (n) int32 (< 0: not written); k and v are only read. The same
 * arithmetic as kv_rope_write on the widened values (f32 copies of the bf16 inputs).
 * n_kv_heads * head_dim <= 6144 (its shared memory: 8 bytes per element). */
pd_status_t kv_rope_write_bf16(float *q_out, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, const int32_t *pos, const float *inv_freq, int n,
                               int n_heads, void *arena, const kv_layout_t *l, int layer,
                               const int32_t *slots, cudaStream_t stream);

/* dst (n_pages, dst_l->page_bytes), packed in order = pages src_pages (n_pages) int32 of arena
 * (layout src_l: bf16 or f32) converted to dst_l (fp8 with scales; same model shape); the 64-byte
 * headers are copied. */
pd_status_t kv_export(void *dst, const kv_layout_t *dst_l, const void *arena,
                      const kv_layout_t *src_l, const int32_t *src_pages, int n_pages,
                      cudaStream_t stream);

/* As kv_export for layers [layer0, layer0 + n_layers) only: page p goes to
 * dst + dst_pages[p] * dst_l->page_bytes (dst_pages NULL: packed, p); layer0 == 0 writes the
 * header, its stamp tags[p] (uint64, device memory) when tags is not NULL. dst_pages, tags and
 * src_pages are device memory (n_pages). dst may be a peer's memory (CUDA IPC). */
pd_status_t kv_export_layers(void *dst, const kv_layout_t *dst_l, const int32_t *dst_pages,
                             const kv_tag_t *tags, const void *arena, const kv_layout_t *src_l,
                             const int32_t *src_pages, int n_pages, int layer0, int n_layers,
                             cudaStream_t stream);

/* Writes tags (n) uint64 into the header stamp of pages (n) int32. */
pd_status_t kv_stamp(void *arena, const kv_layout_t *l, const int32_t *pages, const kv_tag_t *tags,
                     int n, cudaStream_t stream);

/* The batched integrity check: found (n) uint64 = stamp of page pages[i]; bad (n) uint8 = 1 if
 * current[i] != expected[i], else 2 if the stamp != expected[i], else 0. */
pd_status_t kv_check(uint8_t *bad, kv_tag_t *found, const void *arena, const kv_layout_t *l,
                     const int32_t *pages, const kv_tag_t *expected, const kv_tag_t *current, int n,
                     cudaStream_t stream);

/* digests (n) uint64 = kv_digest_page (common/kv/kv_digest.h) of n pages of page_bytes each:
 * page i at base + pages[i] * page_bytes, or with pages NULL at base + i * page_bytes (packed).
 * base is 16-byte aligned and page_bytes a multiple of 16 (PD_ERR_INVALID otherwise); pages (int32)
 * and digests are device memory. One block per page; the sum wraps, so the result does not depend
 * on the order. */
pd_status_t kv_digest(uint64_t *digests, const void *base, size_t page_bytes, const int32_t *pages,
                      int n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
