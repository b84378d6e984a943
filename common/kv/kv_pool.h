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

#include "kv_layout.h"
#include "status.h"

typedef struct kv_pool kv_pool_t;
struct kv_tracker;

typedef struct {
    kv_layout_t layout;
    int32_t n_pages;
    struct kv_tracker *tracker; /* borrowed; tags come from it */
    /* how long a page freed while its remote write may be in flight stays quarantined at least,
     * counted from the first kv_pool_expire_leases() after the free, even when its lease has
     * already run out (a late writer lands in a quarantined page, not in a new owner's); 0 = 2000 */
    int64_t quarantine_ms;
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

/* Releases a page held with ref; a page whose remote write may be in flight is quarantined.
 * Returns PD_ERR_KV_INTEGRITY (and frees nothing) when the page is not allocated or was
 * reallocated since ref was handed out (ref.gen, checked with any tracker; with the tagged
 * tracker the tag must match too): it belongs to someone else. */
pd_status_t kv_pool_page_free(kv_pool_t *pool, kv_page_ref_t ref);

/* Returns to the free list the quarantined pages whose lease ended at or before now_ms and whose
 * quarantine (params.quarantine_ms from the first call that saw them) is over; returns how many. */
int32_t kv_pool_expire_leases(kv_pool_t *pool, int64_t now_ms);

/* Pages needed to hold n_tokens. */
int32_t kv_pool_pages_for(const kv_pool_t *pool, int32_t n_tokens);

/* Makes seq hold enough pages for n_tokens tokens (allocating on demand). All or nothing:
 * PD_NO_PAGES leaves seq unchanged; PD_ERR_NOMEM likewise. */
pd_status_t kv_seq_reserve(kv_pool_t *pool, kv_seq_t *seq, int32_t n_tokens);

/* Frees every page of seq and empties it. */
void kv_seq_release(kv_pool_t *pool, kv_seq_t *seq);

#endif
