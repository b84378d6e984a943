/* kv_pool_impl: the pool's state, for kv_pool.c and for test code that must break the pool's
 * invariants on purpose (tests/support/kv_pool_faults.c). Nothing else includes it: the public
 * API (kv_pool.h) has no entry point that corrupts a pool.
 */
#ifndef PD_KV_POOL_IMPL_H
#define PD_KV_POOL_IMPL_H

#include "kv_pool.h"
#include "kv_tracker.h"

enum { KV_POOL__PAGE_FREE = 0, KV_POOL__PAGE_USED, KV_POOL__PAGE_QUARANTINE };

struct kv_pool {
    kv_layout_t layout;
    int32_t n_pages;
    kv_tracker_t *tracker;
    int32_t *free_list; /* stack of free page ids */
    int32_t n_free;
    uint8_t *state;          /* (n_pages) KV_POOL__PAGE_* */
    uint8_t *remote_pending; /* (n_pages) a remote write may be in flight */
    int64_t *lease_deadline; /* (n_pages) ms */
    int64_t *quarantine_since; /* (n_pages) ms the expiry scan first saw it quarantined; -1 not yet */
    uint32_t *gen;             /* (n_pages) allocation generation (owner check on free) */
    int64_t quarantine_ms;
    int32_t n_quarantined;
};

#endif
