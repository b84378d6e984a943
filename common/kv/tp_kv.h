/* tp_kv: the paged KV cache under tensor parallelism. Rank r of `size` ranks holds KV heads
 * [r * n_kv_heads / size, (r + 1) * n_kv_heads / size) in its own pool, whose layout is the full
 * layout with n_kv_heads / size heads (kv_pool.h's page format otherwise unchanged).
 *
 * When prefill and decode nodes run different TP sizes (prefill TP 2 -> decode TP 1, or the
 * reverse), each destination page is assembled from the source ranks whose head ranges overlap
 * its own: tp_kv_reslice() copies that overlap, per layer, K and V (and fp8 scales).
 * Host memory (pages staged through host buffers, as the UCX transport does without CUDA
 * transports). Pure functions, any thread.
 *
 * Between nodes a page of a TP-d decode node travels as a wire page (tp_kv_wire_layout): the d
 * rank slices of the page side by side, slice r a whole page of rank r's layout with its own
 * header, so every slice carries the destination page's tag and the decode node's ranks each
 * check their own slice before every attention step. A TP-p prefill node fills it from its p
 * ranks with tp_kv_wire_fill().
 */
#ifndef PD_TP_KV_H
#define PD_TP_KV_H

#include "kv_pool.h"
#include "status.h"

/* *l_p := the layout of one rank of `size` for the full (TP 1) layout `full`: n_kv_heads / size
 * heads, the rest unchanged; a one-sided layout (the MLA latent of DeepSeek-V3 / Kimi K2, which
 * every rank computes and reads whole) is replicated: *l_p = *full. PD_ERR_INVALID (logged, *l_p
 * untouched) when size < 1 or the KV heads do not split evenly (e.g. 2 KV heads and TP 4: K / V
 * heads are never replicated). */
pd_status_t tp_kv_layout(const kv_layout_t *full, int size, kv_layout_t *l_p);

/* Copies the KV heads that rank src_rank of a TP-src_size layout (src_l) and rank dst_rank of a
 * TP-dst_size layout (dst_l) have in common, for n_pages pages: src (n_pages, src_l->page_bytes)
 * packed, into dst (n_pages, dst_l->page_bytes) packed; every layer, K and V, every token slot,
 * and the per-(token, head) scales for fp8. Heads dst owns that src lacks, and page headers
 * (dst's stamp is its own), are left as they are; no overlap copies nothing. The layouts must
 * agree on layers, head_dim, page_tokens and format and be the src_size / dst_size splits of one
 * KV head count (one-sided latent layouts: the same, replicated, so the whole page is copied).
 * PD_ERR_INVALID otherwise (logged; nothing written). */
pd_status_t tp_kv_reslice(void *dst, const kv_layout_t *dst_l, int dst_rank, int dst_size,
                          const void *src, const kv_layout_t *src_l, int src_rank, int src_size,
                          int n_pages);

/* *l_p := the wire layout of a page for a node of TP `size` whose full (TP 1) layout is `full`:
 * the rank layout (tp_kv_layout) with n_slices = size and page_bytes = size * the rank's page
 * bytes. size 1 gives full itself. PD_ERR_INVALID (logged, *l_p untouched) as tp_kv_layout. */
pd_status_t tp_kv_wire_layout(const kv_layout_t *full, int size, kv_layout_t *l_p);

/* Bytes of one rank slice of a wire page of layout l (l->page_bytes for n_slices 1). */
static inline size_t tp_kv_slice_bytes(const kv_layout_t *l)
{
    return l->page_bytes / (size_t)(l->n_slices > 0 ? l->n_slices : 1);
}

/* The KV-done checksum of one destination rank's slice (KvDone.slice_checksums): the chain of
 * page digests (kv_digest.h) over slice `slice` (tp_kv_slice_bytes) of n_pages wire pages of layout l, page i at
 * base + (pages ? pages[i] : i) * l->page_bytes. Chained like node_pages_checksum: the checksum
 * of pages [0, k) is the seed of [k, n). Any thread. */
uint64_t tp_kv_slice_checksum(uint64_t seed, const uint8_t *base, const int32_t *pages, int n_pages,
                              const kv_layout_t *l, int slice);

/* Copies what rank src_rank of a TP-src_size writer holds of n_pages pages, src (n_pages,
 * src_l->page_bytes) packed in src_l (that rank's layout, already in the destination's format),
 * into every slice of the wire pages dst (n_pages, dst_l->page_bytes) of wire layout dst_l that
 * shares KV heads with it (tp_kv_reslice per slice). Headers are left as they are. Called once per
 * source rank, the wire pages are complete. PD_ERR_INVALID as tp_kv_reslice (nothing written). */
pd_status_t tp_kv_wire_fill(void *dst, const kv_layout_t *dst_l, const void *src,
                            const kv_layout_t *src_l, int src_rank, int src_size, int n_pages);

#endif
