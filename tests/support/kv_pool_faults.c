#include "kv_pool_faults.h"

#include "kv_pool_impl.h"

pd_status_t kv_pool_faults_steal_page(kv_pool_t *pool, int32_t page, kv_page_ref_t *ref_p)
{
    if (page < 0 || page >= pool->n_pages || pool->state[page] != KV_POOL__PAGE_USED)
        return PD_ERR_INVALID;
    ref_p->page = page;
    ref_p->tag = pool->tracker->ops->on_alloc(pool->tracker, page);
    ref_p->gen = ++pool->gen[page]; /* the victim's ref no longer owns the page */
    return PD_OK;
}
