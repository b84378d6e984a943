/* kv_pool: the paged KV cache's bookkeeping: page layout, free list, per-page integrity tags,
 * and per-sequence block tables.
 *
 * The pages themselves live in one contiguous arena owned by the caller (backend memory: host
 * for the CPU backend, GPU for CUDA), so that a transport can register the whole pool once. Each
 * page holds every layer's K and V for page_tokens consecutive tokens of one sequence:
 *
 *   page = [header 64 B: uint32 stamp, rest reserved]
 *          for each layer l: K (page_tokens, n_kv_heads, head_dim) kv dtype
 *                            V (page_tokens, n_kv_heads, head_dim) kv dtype
 *          fp8 only, for each layer l: K scales (page_tokens, n_kv_heads) f32
 *                                      V scales (page_tokens, n_kv_heads) f32
 *
 * Integrity: every allocation gives the page a new tag (kv_tracker decides how: `tagged` bumps a
 * counter, `noop` keeps none). A sequence records the (page, tag) pairs it expects; whoever writes
 * a page stamps its header with that tag; kv_tracker_check() compares both before attention.
 *
 * A page reserved for a remote writer (kv_pool_page_alloc_remote) that is freed while the write
 * may still be in flight is quarantined, not reused, until kv_pool_page_writer_done() or its lease
 * expires (kv_pool_expire_leases()).
 *
 * One thread owns a pool (the node's compute or loop thread); nothing here locks.
 */
#ifndef PD_KV_POOL_H
#define PD_KV_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum { PD_KV_BF16 = 0, PD_KV_FP8, PD_KV_F32 } pd_kvfmt_t;

/* Parses "bf16" | "fp8" | "f32"; -1 if unknown. */
int kv_fmt_parse(const char *name, pd_kvfmt_t *fmt_p);
const char *kv_fmt_name(pd_kvfmt_t fmt);

#define KV_PAGE_HEADER_BYTES 64

typedef struct {
    int n_layers, n_kv_heads, head_dim, page_tokens;
    pd_kvfmt_t fmt;
    size_t elem_bytes;  /* 2 bf16, 1 fp8, 4 f32 */
    size_t side_bytes;  /* one layer's K (or V): page_tokens * n_kv_heads * head_dim * elem */
    size_t scale_bytes; /* one layer's K (or V) scales: page_tokens * n_kv_heads * 4 (fp8), else 0 */
    size_t page_bytes;  /* whole page, header included, multiple of 64 */
} kv_layout_t;

void kv_layout_init(kv_layout_t *l, int n_layers, int n_kv_heads, int head_dim, int page_tokens,
                    pd_kvfmt_t fmt);

/* Byte offsets inside a page; side 0 = K, 1 = V. */
static inline size_t kv_layout_data_off(const kv_layout_t *l, int layer, int side)
{
    return KV_PAGE_HEADER_BYTES + ((size_t)layer * 2 + (size_t)side) * l->side_bytes;
}
static inline size_t kv_layout_scale_off(const kv_layout_t *l, int layer, int side)
{
    return KV_PAGE_HEADER_BYTES + (size_t)l->n_layers * 2 * l->side_bytes +
           ((size_t)layer * 2 + (size_t)side) * l->scale_bytes;
}

/* KV bytes per token, scales included (headers excluded). */
double kv_layout_bytes_per_token(const kv_layout_t *l);

/* A (page, tag) pair: what a sequence expects to find. */
typedef struct {
    int32_t page;
    uint32_t tag;
} kv_page_ref_t;

typedef struct kv_pool kv_pool_t;
struct kv_tracker;

typedef struct {
    kv_layout_t layout;
    int32_t n_pages;
    struct kv_tracker *tracker; /* borrowed; tags come from it */
} kv_pool_params_t;

/* Creates the bookkeeping for n_pages pages. PD_ERR_INVALID for n_pages < 1. */
pd_status_t kv_pool_create(const kv_pool_params_t *params, kv_pool_t **pool_p);
void kv_pool_destroy(kv_pool_t *pool);

const kv_layout_t *kv_pool_layout(const kv_pool_t *pool);
struct kv_tracker *kv_pool_tracker(const kv_pool_t *pool);
int32_t kv_pool_n_pages(const kv_pool_t *pool);
int32_t kv_pool_free_pages(const kv_pool_t *pool);
/* Pages in use (allocated or quarantined). */
int32_t kv_pool_used_pages(const kv_pool_t *pool);

/* Takes a free page and gives it a new tag. PD_NO_PAGES when none is free (nothing changes). */
pd_status_t kv_pool_page_alloc(kv_pool_t *pool, kv_page_ref_t *ref_p);

/* As kv_pool_page_alloc, for a page a remote writer will fill: until kv_pool_page_writer_done(),
 * freeing it quarantines it. lease_deadline_ms: monotonic ms after which the writer is presumed
 * dead. */
pd_status_t kv_pool_page_alloc_remote(kv_pool_t *pool, int64_t lease_deadline_ms,
                                      kv_page_ref_t *ref_p);

/* The remote writer of page is known to be done (flushed, or confirmed gone). */
void kv_pool_page_writer_done(kv_pool_t *pool, int32_t page);

/* Releases a page held with tag; a page whose remote write may be in flight is quarantined.
 * Returns PD_ERR_KV_INTEGRITY (and frees nothing) when the page is not allocated or, with the
 * tagged tracker, now carries another tag: it was reallocated and belongs to someone else. */
pd_status_t kv_pool_page_free(kv_pool_t *pool, kv_page_ref_t ref);

/* Returns quarantined pages whose lease ended before now_ms to the free list; returns how many. */
int32_t kv_pool_expire_leases(kv_pool_t *pool, int64_t now_ms);

/* A sequence's block table. Caller-owned storage: kv_seq_init / kv_seq_deinit. */
typedef struct {
    int32_t n_tokens; /* tokens whose KV is (or will be, this step) in the pages */
    int32_t n_pages, cap;
    kv_page_ref_t *pages;
} kv_seq_t;

void kv_seq_init(kv_seq_t *seq);
/* Frees the block table storage (not the pages: call kv_seq_release first). */
void kv_seq_deinit(kv_seq_t *seq);

/* Pages needed to hold n_tokens. */
int32_t kv_pool_pages_for(const kv_pool_t *pool, int32_t n_tokens);

/* Makes seq hold enough pages for n_tokens tokens (allocating on demand). All or nothing:
 * PD_NO_PAGES leaves seq unchanged; PD_ERR_NOMEM likewise. */
pd_status_t kv_seq_reserve(kv_pool_t *pool, kv_seq_t *seq, int32_t n_tokens);

/* Appends an already allocated page ref (e.g. reserved by the router for a remote writer). */
pd_status_t kv_seq_push_page(kv_seq_t *seq, kv_page_ref_t ref);

/* Frees every page of seq and empties it. */
void kv_seq_release(kv_pool_t *pool, kv_seq_t *seq);

/* Fault injection (tests only; compiled in, does nothing unless called). */
/* Frees `page` behind its owner's back and hands it out again with a new tag. */
pd_status_t kv_pool_debug_steal_page(kv_pool_t *pool, int32_t page, kv_page_ref_t *ref_p);

#endif
