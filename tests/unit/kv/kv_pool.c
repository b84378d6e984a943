/* Tests common/kv_pool.c: layout sizes, alloc/free, tags on reallocation, all-or-nothing reserve,
 * quarantine of pages with a remote write in flight, lease expiry, refusing foreign frees. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kv_pool.h"
#include "kv_tracker.h"

static void test_layout(void **s)
{
    kv_layout_t l;
    (void)s;
    kv_layout_init(&l, 4, 2, 128, 16, PD_KV_BF16);
    assert_int_equal(l.side_bytes, 16 * 2 * 128 * 2);
    assert_int_equal(l.page_bytes, 64 + 4 * 2 * 8192);
    assert_true(kv_layout_bytes_per_token(&l) == 4 * 2 * 2 * 128 * 2);
    kv_layout_init(&l, 4, 2, 128, 16, PD_KV_FP8);
    /* fp8: one byte per element plus one f32 scale per (token, head): 256 + 8 per layer side */
    assert_true(kv_layout_bytes_per_token(&l) == 4 * 2 * (2 * 128 + 2 * 4));
    assert_int_equal(l.page_bytes % 64, 0);
    assert_true(kv_layout_scale_off(&l, 3, 1) + l.scale_bytes <= l.page_bytes);
}

/* MLA (n_sides 1): one latent "head" of kv_lora_rank + rope values per token and layer; at
 * Kimi K2's size 61 layers x 576 values, fp8 with one scale per token */
static void test_layout_latent(void **s)
{
    kv_layout_t l;
    (void)s;
    kv_layout_init_sides(&l, 61, 1, 576, 1, 16, PD_KV_BF16);
    assert_int_equal(l.n_sides, 1);
    assert_true(kv_layout_bytes_per_token(&l) == 61 * 576 * 2);
    assert_int_equal(kv_layout_data_off(&l, 1, 0), 64 + l.side_bytes);
    assert_int_equal(l.page_bytes, (64 + 61 * 16 * 576 * 2 + 63) / 64 * 64);
    kv_layout_init_sides(&l, 61, 1, 576, 1, 16, PD_KV_FP8);
    assert_true(kv_layout_bytes_per_token(&l) == 61 * (576 + 4));
    assert_int_equal(kv_layout_scale_off(&l, 0, 0), 64 + 61 * l.side_bytes);
    assert_true(kv_layout_scale_off(&l, 60, 0) + l.scale_bytes <= l.page_bytes);
    /* kv_layout_init is the two-sided case */
    kv_layout_t a, b;
    kv_layout_init(&a, 4, 2, 128, 16, PD_KV_FP8);
    kv_layout_init_sides(&b, 4, 2, 128, 2, 16, PD_KV_FP8);
    assert_memory_equal(&a, &b, sizeof a);
}

static kv_pool_t *make_pool(kv_tracker_t **t, kv_tracker_kind_t kind, int n)
{
    kv_pool_params_t p;
    kv_pool_t *pool;
    assert_int_equal(kv_tracker_create(kind, n, t), PD_OK);
    kv_layout_init(&p.layout, 2, 2, 8, 16, PD_KV_BF16);
    p.n_pages = n;
    p.tracker = *t;
    p.quarantine_ms = 0;
    assert_int_equal(kv_pool_create(&p, &pool), PD_OK);
    return pool;
}

static void test_alloc_tags(void **s)
{
    kv_tracker_t *t;
    kv_pool_t *pool = make_pool(&t, KV_TRACKER_TAGGED, 4);
    kv_page_ref_t a, b, c;
    (void)s;
    assert_int_equal(kv_pool_page_alloc(pool, &a), PD_OK);
    assert_int_not_equal(a.tag, 0);
    assert_int_equal(kv_pool_page_free(pool, a), PD_OK);
    /* double free refused */
    assert_int_equal(kv_pool_page_free(pool, a), PD_ERR_KV_INTEGRITY);
    assert_int_equal(kv_pool_page_alloc(pool, &b), PD_OK);
    assert_int_equal(b.page, a.page);   /* same page back ... */
    assert_int_not_equal(b.tag, a.tag); /* ... with a new tag */
    /* the old owner cannot free the new owner's page */
    assert_int_equal(kv_pool_page_free(pool, a), PD_ERR_KV_INTEGRITY);
    assert_int_equal(kv_pool_used_pages(pool), 1);
    assert_int_equal(kv_pool_page_free(pool, b), PD_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(kv_pool_page_alloc(pool, &c), PD_OK);
    assert_int_equal(kv_pool_page_alloc(pool, &c), PD_NO_PAGES);
    kv_pool_destroy(pool);
    kv_tracker_destroy(t);
}

static void test_reserve(void **s)
{
    kv_tracker_t *t;
    kv_pool_t *pool = make_pool(&t, KV_TRACKER_TAGGED, 5);
    kv_seq_t a, b;
    (void)s;
    kv_seq_init(&a);
    kv_seq_init(&b);
    assert_int_equal(kv_pool_pages_for(pool, 33), 3);
    assert_int_equal(kv_seq_reserve(pool, &a, 33), PD_OK);
    assert_int_equal(a.n_pages, 3);
    assert_int_equal(kv_seq_reserve(pool, &a, 48), PD_OK); /* still 3 pages */
    assert_int_equal(a.n_pages, 3);
    /* b needs 3, only 2 free: nothing taken */
    assert_int_equal(kv_seq_reserve(pool, &b, 40), PD_NO_PAGES);
    assert_int_equal(b.n_pages, 0);
    assert_int_equal(kv_pool_free_pages(pool), 2);
    kv_seq_release(pool, &a);
    assert_int_equal(kv_pool_free_pages(pool), 5);
    assert_int_equal(kv_seq_reserve(pool, &b, 40), PD_OK);
    kv_seq_release(pool, &b);
    kv_seq_deinit(&a);
    kv_seq_deinit(&b);
    kv_pool_destroy(pool);
    kv_tracker_destroy(t);
}

static void test_remote_quarantine(void **s)
{
    kv_tracker_t *t;
    kv_pool_t *pool = make_pool(&t, KV_TRACKER_TAGGED, 2);
    kv_page_ref_t a, b, c;
    (void)s;
    assert_int_equal(kv_pool_page_alloc_remote(pool, 1000, &a), PD_OK);
    assert_int_equal(kv_pool_page_alloc_remote(pool, 5000, &b), PD_OK);
    /* request aborted while the writes may be in flight: pages are not reusable yet */
    assert_int_equal(kv_pool_page_free(pool, a), PD_OK);
    assert_int_equal(kv_pool_page_free(pool, b), PD_OK);
    assert_int_equal(kv_pool_page_alloc(pool, &c), PD_NO_PAGES);
    /* the writer of b confirms it is done: b comes back */
    kv_pool_page_writer_done(pool, b.page);
    assert_int_equal(kv_pool_free_pages(pool), 1);
    /* a's writer never answers: its lease expires at 1000, and the quarantine (2000 ms by
     * default) counts from the first scan that saw the page (999) */
    assert_int_equal(kv_pool_expire_leases(pool, 999), 0);
    assert_int_equal(kv_pool_expire_leases(pool, 1000), 0);
    assert_int_equal(kv_pool_expire_leases(pool, 2998), 0);
    assert_int_equal(kv_pool_expire_leases(pool, 2999), 1);
    assert_int_equal(kv_pool_free_pages(pool), 2);
    /* writer done before free: the page frees at once */
    assert_int_equal(kv_pool_page_alloc_remote(pool, 1000, &c), PD_OK);
    kv_pool_page_writer_done(pool, c.page);
    assert_int_equal(kv_pool_page_free(pool, c), PD_OK);
    assert_int_equal(kv_pool_free_pages(pool), 2);
    kv_pool_destroy(pool);
    kv_tracker_destroy(t);
}

/* A reservation whose lease already ran out when it is dropped (the decode node's tick frees it
 * and scans in the same pass) still spends the quarantine: a late writer lands in a quarantined
 * page, not in the next owner's. */
static void test_expired_lease_quarantine(void **s)
{
    kv_tracker_t *t;
    kv_pool_t *pool = make_pool(&t, KV_TRACKER_TAGGED, 1);
    kv_page_ref_t a, b;
    (void)s;
    assert_int_equal(kv_pool_page_alloc_remote(pool, 1000, &a), PD_OK);
    assert_int_equal(kv_pool_page_free(pool, a), PD_OK); /* at 5000: lease long gone */
    assert_int_equal(kv_pool_expire_leases(pool, 5000), 0);
    assert_int_equal(kv_pool_page_alloc(pool, &b), PD_NO_PAGES);
    assert_int_equal(kv_pool_expire_leases(pool, 6999), 0);
    assert_int_equal(kv_pool_expire_leases(pool, 7000), 1);
    assert_int_equal(kv_pool_page_alloc(pool, &b), PD_OK);
    kv_pool_destroy(pool);
    kv_tracker_destroy(t);
}

/* Tags skip 0 and KV_TAG_INVALID when the counter wraps. */
static void test_tag_wrap(void **s)
{
    kv_tracker_t *t;
    kv_pool_t *pool = make_pool(&t, KV_TRACKER_TAGGED, 1);
    kv_page_ref_t a;
    (void)s;
    t->next_tag = KV_TAG_INVALID - 2;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(kv_pool_page_alloc(pool, &a), PD_OK);
        assert_int_not_equal(a.tag, 0);
        assert_int_not_equal(a.tag, KV_TAG_INVALID);
        assert_int_equal(kv_pool_page_free(pool, a), PD_OK);
    }
    assert_true(a.tag == 3); /* 2^64 - 2, (2^64 - 1 and 0 skipped) 1, 2, 3 */
    kv_pool_destroy(pool);
    kv_tracker_destroy(t);
}

/* Tags are 64-bit, and after the counter wraps a new tag skips every tag a page still has: a
 * live page's (two owners with one tag) and a freed page's last one (its header may still carry
 * it, a late writer's stamp). With 32-bit tags this wrapped after 2^32 allocations and handed
 * out live tags again. */
static void test_tag_wrap_unique(void **s)
{
    kv_tracker_t *t;
    kv_pool_t *pool = make_pool(&t, KV_TRACKER_TAGGED, 3);
    kv_page_ref_t live, stale, a;
    (void)s;
    assert_int_equal(sizeof live.tag, 8);
    t->next_tag = (1ull << 32) - 2; /* past 32 bits: no wrap there */
    assert_int_equal(kv_pool_page_alloc(pool, &a), PD_OK);
    assert_true(a.tag == (1ull << 32) - 1);
    assert_int_equal(kv_pool_page_alloc(pool, &stale), PD_OK);
    assert_true(stale.tag == 1ull << 32);
    assert_int_equal(kv_pool_page_free(pool, stale), PD_OK);
    assert_int_equal(kv_pool_page_free(pool, a), PD_OK);
    t->next_tag = 4;
    assert_int_equal(kv_pool_page_alloc(pool, &live), PD_OK); /* tag 5, held throughout */
    assert_true(live.tag == 5);
    t->next_tag = KV_TAG_INVALID - 1; /* the counter wraps at the next allocations */
    kv_tag_t last = 0;
    for (int i = 0; i < 12; i++) {
        assert_int_equal(kv_pool_page_alloc(pool, &a), PD_OK);
        assert_true(a.tag != 0 && a.tag != KV_TAG_INVALID);
        assert_true(a.tag != live.tag); /* never a live page's tag */
        assert_true(a.tag > last);
        last = a.tag;
        assert_int_equal(kv_pool_page_free(pool, a), PD_OK);
    }
    assert_true(last == 13); /* 1..13 with 5 skipped */
    kv_pool_destroy(pool);
    kv_tracker_destroy(t);
}

static void test_noop_tracker(void **s)
{
    kv_tracker_t *t;
    kv_pool_t *pool = make_pool(&t, KV_TRACKER_NOOP, 2);
    kv_page_ref_t a, b;
    (void)s;
    assert_false(kv_tracker_enabled(t));
    assert_int_equal(kv_pool_page_alloc(pool, &a), PD_OK);
    assert_int_equal(a.tag, 0);
    assert_int_equal(kv_pool_page_free(pool, a), PD_OK);
    /* noop skips tag work only: the pool still refuses a free by a former owner */
    assert_int_equal(kv_pool_page_alloc(pool, &b), PD_OK);
    assert_int_equal(b.page, a.page);
    assert_int_equal(kv_pool_page_free(pool, a), PD_ERR_KV_INTEGRITY);
    assert_int_equal(kv_pool_used_pages(pool), 1);
    assert_int_equal(kv_pool_page_free(pool, b), PD_OK);
    kv_pool_destroy(pool);
    kv_tracker_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_layout_latent),
        cmocka_unit_test(test_alloc_tags),
        cmocka_unit_test(test_reserve),
        cmocka_unit_test(test_remote_quarantine),
        cmocka_unit_test(test_expired_lease_quarantine),
        cmocka_unit_test(test_tag_wrap),
        cmocka_unit_test(test_tag_wrap_unique),
        cmocka_unit_test(test_noop_tracker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
