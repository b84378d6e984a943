/* kv_layout: what a KV page looks like and what a sequence's block table is, without the pool
 * that hands pages out. Backends, transports and the tracker read pages through these types.
 *
 *   page = [header 64 B: uint64 stamp (the page's tag), rest reserved]
 *          for each layer l: K (page_tokens, n_kv_heads, head_dim) kv dtype
 *                            V (page_tokens, n_kv_heads, head_dim) kv dtype
 *          fp8 only, for each layer l: K scales (page_tokens, n_kv_heads) f32
 *                                      V scales (page_tokens, n_kv_heads) f32
 *
 * A latent layout (n_sides 1, MLA: DeepSeek-V3 / Kimi K2) has no V: each layer holds one side,
 * (page_tokens, 1, kv_lora_rank + rope dims), and (fp8) one scale per token.
 *
 * Plain data; any thread.
 */
#ifndef PD_KV_LAYOUT_H
#define PD_KV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#define KV_PAGE_HEADER_BYTES 64

typedef struct {
    int n_layers, n_kv_heads, head_dim, page_tokens;
    int n_sides; /* 2: K and V; 1: the MLA latent only */
    pd_kvfmt_t fmt;
    size_t elem_bytes; /* 2 bf16, 1 fp8, 4 f32 */
    size_t side_bytes; /* one layer's K (or V): page_tokens * n_kv_heads * head_dim * elem */
    size_t
        scale_bytes;   /* one layer's K (or V) scales: page_tokens * n_kv_heads * 4 (fp8), else 0 */
    size_t page_bytes; /* whole page, header included, multiple of 64 */
    /* rank slices per page: 1, or (a page as it travels to a node of tensor-parallel size
     * n_slices, tp_kv_wire_layout) n_slices whole pages of this layout side by side, slice r at
     * r * page_bytes / n_slices, each with its own header; the offsets above are within a slice */
    int n_slices;
} kv_layout_t;

void kv_layout_init(kv_layout_t *l, int n_layers, int n_kv_heads, int head_dim, int page_tokens,
                    pd_kvfmt_t fmt);

/* As kv_layout_init with n_sides sides per layer (2: K and V; 1: an MLA latent of head_dim
 * values per token, n_kv_heads 1). */
void kv_layout_init_sides(kv_layout_t *l, int n_layers, int n_kv_heads, int head_dim, int n_sides,
                          int page_tokens, pd_kvfmt_t fmt);

/* Byte offsets inside a page; side 0 = K (or the latent), 1 = V. */
static inline size_t kv_layout_data_off(const kv_layout_t *l, int layer, int side)
{
    return KV_PAGE_HEADER_BYTES + ((size_t)layer * l->n_sides + (size_t)side) * l->side_bytes;
}
static inline size_t kv_layout_scale_off(const kv_layout_t *l, int layer, int side)
{
    return KV_PAGE_HEADER_BYTES + (size_t)l->n_layers * l->n_sides * l->side_bytes +
           ((size_t)layer * l->n_sides + (size_t)side) * l->scale_bytes;
}

/* KV bytes per token, scales included (headers excluded). */
double kv_layout_bytes_per_token(const kv_layout_t *l);

/* A page's integrity tag (kv_tracker): 64 bits, so the pool-wide counter never wraps in practice
 * (and when it does, tags still in any page's header are skipped). */
typedef uint64_t kv_tag_t;

/* A (page, tag) pair: what a sequence expects to find. gen is the owning pool's allocation
 * generation of the page (its owner check on free, whatever the tracker); it never leaves the
 * node (a ref built from another node's message has gen 0 and cannot free anything). */
typedef struct {
    int32_t page;
    kv_tag_t tag;
    uint32_t gen;
} kv_page_ref_t;

/* A sequence's block table. Caller-owned storage: kv_seq_init / kv_seq_deinit. */
typedef struct {
    int32_t n_tokens; /* tokens whose KV is (or will be, this step) in the pages */
    int32_t n_pages, cap;
    kv_page_ref_t *pages;
} kv_seq_t;

void kv_seq_init(kv_seq_t *seq);
/* Frees the block table storage (not the pages: call kv_seq_release first). */
void kv_seq_deinit(kv_seq_t *seq);

/* Appends an already allocated page ref (e.g. reserved by the router for a remote writer). */
pd_status_t kv_seq_push_page(kv_seq_t *seq, kv_page_ref_t ref);

/* Grows seq's table to hold need refs (internal to kv/). PD_ERR_NOMEM leaves it unchanged. */
pd_status_t kv_seq__grow(kv_seq_t *seq, int32_t need);

#endif
