/* kv_pool_faults: test-only damage to a kv_pool, the way a bookkeeping bug would do it, so that
 * tests can show the tag check catches it. Built against the pool's private state
 * (common/kv/kv_pool_impl.h); linked by tests and the decode-node-faults test build, never by the
 * production binaries. Same thread rules as the pool.
 */
#ifndef PD_KV_POOL_FAULTS_H
#define PD_KV_POOL_FAULTS_H

#include "kv_pool.h"

/* Hands out `page` again with a new tag behind its owner's back (as if it had been freed and
 * reallocated while still held). PD_ERR_INVALID when page is not in use; nothing changes then. */
pd_status_t kv_pool_faults_steal_page(kv_pool_t *pool, int32_t page, kv_page_ref_t *ref_p);

#endif
