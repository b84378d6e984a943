#include "kv_pool.h"
#include "kv_pool_impl.h"

#include <stdlib.h>
#include <string.h>

#include "kv_tracker.h"
#include "log.h"

pd_status_t kv_pool_create(const kv_pool_params_t *params, kv_pool_t **pool_p)
{
    kv_pool_t *pool;
    int32_t n = params->n_pages;

    if (n < 1) {
        pd_log_error("kv pool: %d pages: the budget holds no page", n);
        return PD_ERR_INVALID;
    }
    pool = calloc(1, sizeof *pool);
    if (!pool)
        return PD_ERR_NOMEM;
    pool->layout = params->layout;
    pool->n_pages = n;
    pool->tracker = params->tracker;
    pool->free_list = malloc((size_t)n * sizeof *pool->free_list);
    pool->state = calloc((size_t)n, 1);
    pool->remote_pending = calloc((size_t)n, 1);
    pool->lease_deadline = calloc((size_t)n, sizeof *pool->lease_deadline);
    pool->quarantine_since = calloc((size_t)n, sizeof *pool->quarantine_since);
    pool->gen = calloc((size_t)n, sizeof *pool->gen);
    pool->quarantine_ms = params->quarantine_ms > 0 ? params->quarantine_ms : 2000;
    if (!pool->free_list || !pool->state || !pool->remote_pending || !pool->lease_deadline ||
        !pool->quarantine_since || !pool->gen) {
        kv_pool_destroy(pool);
        return PD_ERR_NOMEM;
    }
    /* pop order 0, 1, 2, ...: lowest pages first */
    for (int32_t i = 0; i < n; i++)
        pool->free_list[i] = n - 1 - i;
    pool->n_free = n;
    *pool_p = pool;
    return PD_OK;
}

void kv_pool_destroy(kv_pool_t *pool)
{
    if (!pool)
        return;
    free(pool->free_list);
    free(pool->state);
    free(pool->remote_pending);
    free(pool->quarantine_since);
    free(pool->gen);
    free(pool->lease_deadline);
    free(pool);
}

const kv_layout_t *kv_pool_layout(const kv_pool_t *pool)
{
    return &pool->layout;
}

struct kv_tracker *kv_pool_tracker(const kv_pool_t *pool)
{
    return pool->tracker;
}

int32_t kv_pool_n_pages(const kv_pool_t *pool)
{
    return pool->n_pages;
}

int32_t kv_pool_free_pages(const kv_pool_t *pool)
{
    return pool->n_free;
}

int32_t kv_pool_used_pages(const kv_pool_t *pool)
{
    return pool->n_pages - pool->n_free;
}

int32_t kv_pool_pages_for(const kv_pool_t *pool, int32_t n_tokens)
{
    return (n_tokens + pool->layout.page_tokens - 1) / pool->layout.page_tokens;
}

pd_status_t kv_pool_page_alloc(kv_pool_t *pool, kv_page_ref_t *ref_p)
{
    int32_t page;

    if (pool->n_free == 0)
        return PD_NO_PAGES;
    page = pool->free_list[--pool->n_free];
    PD_ASSERT(pool->state[page] == KV_POOL__PAGE_FREE);
    pool->state[page] = KV_POOL__PAGE_USED;
    pool->remote_pending[page] = 0;
    ref_p->page = page;
    ref_p->tag = pool->tracker->ops->on_alloc(pool->tracker, page);
    ref_p->gen = ++pool->gen[page];
    return PD_OK;
}

pd_status_t kv_pool_page_alloc_remote(kv_pool_t *pool, int64_t lease_deadline_ms,
                                      kv_page_ref_t *ref_p)
{
    pd_status_t st = kv_pool_page_alloc(pool, ref_p);
    if (st == PD_OK) {
        pool->remote_pending[ref_p->page] = 1;
        pool->lease_deadline[ref_p->page] = lease_deadline_ms;
    }
    return st;
}

static void pool__push_free(kv_pool_t *pool, int32_t page)
{
    pool->state[page] = KV_POOL__PAGE_FREE;
    pool->remote_pending[page] = 0;
    pool->free_list[pool->n_free++] = page;
}

void kv_pool_page_writer_done(kv_pool_t *pool, int32_t page)
{
    PD_ASSERT(page >= 0 && page < pool->n_pages);
    pool->remote_pending[page] = 0;
    if (pool->state[page] == KV_POOL__PAGE_QUARANTINE) {
        pool->n_quarantined--;
        pool__push_free(pool, page);
    }
}

pd_status_t kv_pool_page_free(kv_pool_t *pool, kv_page_ref_t ref)
{
    if (ref.page < 0 || ref.page >= pool->n_pages || pool->state[ref.page] != KV_POOL__PAGE_USED ||
        pool->gen[ref.page] != ref.gen ||
        (kv_tracker_enabled(pool->tracker) && kv_tracker_tag(pool->tracker, ref.page) != ref.tag)) {
        pd_log_warn("kv pool: page %d tag %llu is not held by this owner: not freed", ref.page,
                    (unsigned long long)ref.tag);
        return PD_ERR_KV_INTEGRITY;
    }
    if (pool->remote_pending[ref.page]) {
        pool->state[ref.page] = KV_POOL__PAGE_QUARANTINE;
        pool->quarantine_since[ref.page] = -1;
        pool->n_quarantined++;
        return PD_OK;
    }
    pool__push_free(pool, ref.page);
    return PD_OK;
}

int32_t kv_pool_expire_leases(kv_pool_t *pool, int64_t now_ms)
{
    int32_t n = 0, first = -1;
    if (pool->n_quarantined == 0)
        return 0;
    for (int32_t p = 0; p < pool->n_pages; p++) {
        if (pool->state[p] != KV_POOL__PAGE_QUARANTINE)
            continue;
        if (pool->quarantine_since[p] < 0)
            pool->quarantine_since[p] = now_ms;
        if (pool->lease_deadline[p] <= now_ms &&
            now_ms - pool->quarantine_since[p] >= pool->quarantine_ms) {
            pool->n_quarantined--;
            pool__push_free(pool, p);
            if (n++ == 0)
                first = p;
        }
    }
    if (n > 0) /* one line per scan, not per page */
        pd_log_warn("kv pool: %d quarantined pages (first %d) reused: writer lease expired", n,
                    first);
    return n;
}

pd_status_t kv_seq_reserve(kv_pool_t *pool, kv_seq_t *seq, int32_t n_tokens)
{
    int32_t need = kv_pool_pages_for(pool, n_tokens), add = need - seq->n_pages;

    if (add <= 0)
        return PD_OK;
    if (add > pool->n_free)
        return PD_NO_PAGES;
    if (kv_seq__grow(seq, need) != PD_OK)
        return PD_ERR_NOMEM;
    for (int32_t i = 0; i < add; i++) {
        pd_status_t st = kv_pool_page_alloc(pool, &seq->pages[seq->n_pages]);
        PD_ASSERT(st == PD_OK);
        seq->n_pages++;
    }
    return PD_OK;
}

void kv_seq_release(kv_pool_t *pool, kv_seq_t *seq)
{
    /* a page no longer ours stays with its owner */
    for (int32_t i = 0; i < seq->n_pages; i++)
        (void)kv_pool_page_free(pool, seq->pages[i]);
    seq->n_pages = 0;
    seq->n_tokens = 0;
}
