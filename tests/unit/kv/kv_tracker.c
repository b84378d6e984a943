/* Tests common/kv_tracker.c: the batched check catches every injected fault (page reused while
 * its owner holds it, stale write with an old stamp, corrupt block-table entry), fails only the
 * victim, and never fires without a fault. A randomized run mixes alloc/append/free/abort with
 * faults and compares the check's verdicts with the ground truth. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "kv_pool.h"
#include "kv_pool_faults.h"
#include "kv_tracker.h"
#include "log.h"

typedef struct {
    pd_backend_t *be;
    kv_tracker_t *t;
    kv_pool_t *pool;
    void *arena;
    kv_layout_t l;
} fx_t;

static void fx_init(fx_t *f, kv_tracker_kind_t kind, int n_pages)
{
    kv_pool_params_t p;
    assert_int_equal(backend_cpu_create(1, &f->be), PD_OK);
    assert_int_equal(kv_tracker_create(kind, n_pages, &f->t), PD_OK);
    kv_layout_init(&f->l, 1, 1, 8, 4, PD_KV_BF16);
    p.layout = f->l;
    p.n_pages = n_pages;
    p.tracker = f->t;
    p.quarantine_ms = 0;
    assert_int_equal(kv_pool_create(&p, &f->pool), PD_OK);
    f->arena = calloc((size_t)n_pages, f->l.page_bytes);
}

static void fx_deinit(fx_t *f)
{
    assert_int_equal(kv_pool_used_pages(f->pool), 0);
    kv_pool_destroy(f->pool);
    kv_tracker_destroy(f->t);
    free(f->arena);
    backend_destroy(f->be);
}

/* grows seq to n tokens and stamps its new pages, as the engine's local writer does */
static pd_status_t grow(fx_t *f, kv_seq_t *s, int n)
{
    int before = s->n_pages;
    pd_status_t st = kv_seq_reserve(f->pool, s, n);
    kv_tag_io_t io = backend_tag_io(f->be);
    if (st == PD_OK) {
        kv_tracker_stamp(f->t, &io, f->arena, &f->l, s->pages + before, s->n_pages - before);
        s->n_tokens = n;
    }
    return st;
}

static int check(fx_t *f, kv_seq_t **seqs, int n, pd_status_t *st)
{
    int32_t ntok[64];
    kv_tag_io_t io = backend_tag_io(f->be);
    for (int i = 0; i < n; i++)
        ntok[i] = seqs[i]->n_tokens;
    return kv_tracker_check(f->t, &io, f->arena, &f->l, (const kv_seq_t *const *)seqs, ntok, NULL,
                            n, st);
}

static void stale_write(fx_t *f, int32_t page, kv_tag_t stamp)
{
    memcpy((uint8_t *)f->arena + (size_t)page * f->l.page_bytes, &stamp, sizeof stamp);
}

static void test_faults(void **state)
{
    fx_t f;
    kv_seq_t a, b, c, *all[3] = {&a, &b, &c};
    pd_status_t st[3];
    kv_page_ref_t thief;
    (void)state;
    fx_init(&f, KV_TRACKER_TAGGED, 16);
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    assert_int_equal(grow(&f, &a, 9), PD_OK);
    assert_int_equal(grow(&f, &b, 9), PD_OK);
    assert_int_equal(grow(&f, &c, 9), PD_OK);
    assert_int_equal(check(&f, all, 3, st), 0);

    /* 1. b's page 1 is handed to someone else while b still holds it */
    assert_int_equal(kv_pool_faults_steal_page(f.pool, b.pages[1].page, &thief), PD_OK);
    assert_int_equal(check(&f, all, 3, st), 1);
    assert_int_equal(st[0], PD_OK);
    assert_int_equal(st[1], PD_ERR_KV_INTEGRITY);
    assert_int_equal(st[2], PD_OK);
    kv_seq_release(f.pool, &b); /* b aborted: the stolen page stays with the thief */
    assert_int_equal(kv_pool_page_free(f.pool, thief), PD_OK);
    assert_int_equal(grow(&f, &b, 5), PD_OK);

    /* 2. a late write of a previous owner lands on c's page 2 with its old stamp */
    stale_write(&f, c.pages[2].page, c.pages[2].tag - 1);
    assert_int_equal(check(&f, all, 3, st), 1);
    assert_int_equal(st[2], PD_ERR_KV_INTEGRITY);
    assert_int_equal(st[0], PD_OK);
    assert_int_equal(st[1], PD_OK);
    kv_seq_release(f.pool, &c);
    assert_int_equal(grow(&f, &c, 3), PD_OK);

    /* 3. a's block table entry 0 is corrupted to point at b's page */
    kv_page_ref_t orig = a.pages[0];
    a.pages[0].page = b.pages[0].page;
    assert_int_equal(check(&f, all, 3, st), 1);
    assert_int_equal(st[0], PD_ERR_KV_INTEGRITY);
    /* an entry pointing outside the pool is reported, never followed */
    a.pages[0].page = 1 << 20;
    assert_int_equal(check(&f, all, 3, st), 1);
    a.pages[0] = orig;
    assert_int_equal(check(&f, all, 3, st), 0);

    const kv_tracker_t *t = f.t;
    assert_int_equal(t->failures, 4);
    for (int i = 0; i < 3; i++) {
        kv_seq_release(f.pool, all[i]);
        kv_seq_deinit(all[i]);
    }
    fx_deinit(&f);
}

static void test_noop_checks_nothing(void **state)
{
    fx_t f;
    kv_seq_t a, *all[1] = {&a};
    pd_status_t st[1];
    kv_page_ref_t thief;
    (void)state;
    fx_init(&f, KV_TRACKER_NOOP, 4);
    kv_seq_init(&a);
    assert_int_equal(grow(&f, &a, 8), PD_OK);
    assert_int_equal(kv_pool_faults_steal_page(f.pool, a.pages[0].page, &thief), PD_OK);
    assert_int_equal(check(&f, all, 1, st), 0); /* no tags, no check */
    assert_int_equal(st[0], PD_OK);
    /* ... but the pool still knows the page changed owner: a's release leaves it to the thief */
    kv_seq_release(f.pool, &a);
    assert_int_equal(kv_pool_used_pages(f.pool), 1);
    assert_int_equal(kv_pool_page_free(f.pool, thief), PD_OK);
    kv_seq_deinit(&a);
    fx_deinit(&f);
}

/* Random mixed workload with random faults; the check must flag exactly the victims. */
static void test_randomized(void **state)
{
    enum { N_SEQ = 24, N_PAGES = 96, STEPS = 20000 };
    fx_t f;
    kv_seq_t seqs[N_SEQ];
    bool live[N_SEQ] = {0}, victim[N_SEQ] = {0};
    kv_page_ref_t stolen[N_SEQ];
    bool has_stolen[N_SEQ] = {0};
    kv_page_ref_t lost[N_SEQ]; /* the page a corrupted entry replaced */
    bool has_lost[N_SEQ] = {0};
    long n_faults = 0, n_caught = 0, n_checks = 0;
    (void)state;
    pd_log_set_level(PD_LOG_WARN - 1); /* the injected failures log errors: keep output short */
    srand(12345);
    fx_init(&f, KV_TRACKER_TAGGED, N_PAGES);
    for (int i = 0; i < N_SEQ; i++)
        kv_seq_init(&seqs[i]);
    for (int step = 0; step < STEPS; step++) {
        int i = rand() % N_SEQ, op = rand() % 100;
        kv_seq_t *s = &seqs[i];
        if (!live[i]) {
            if (grow(&f, s, 1 + rand() % 40) == PD_OK)
                live[i] = true;
        } else if (op < 50) {
            (void)grow(&f, s, s->n_tokens + 1 + rand() % 8); /* append; may hit the pool limit */
        } else if (op < 60 || (op < 70 && victim[i])) {
            /* finish or abort: release; the victims' foreign pages stay with their owners */
            kv_seq_release(f.pool, s);
            if (has_stolen[i])
                assert_int_equal(kv_pool_page_free(f.pool, stolen[i]), PD_OK);
            if (has_lost[i])
                assert_int_equal(kv_pool_page_free(f.pool, lost[i]), PD_OK);
            live[i] = victim[i] = has_stolen[i] = has_lost[i] = false;
        } else if (op < 64 && !victim[i] && s->n_pages > 0) {
            int k = rand() % 3, pi = rand() % s->n_pages;
            if (pi * f.l.page_tokens >= s->n_tokens)
                continue; /* the check covers written tokens only */
            if (k == 0) {
                assert_int_equal(kv_pool_faults_steal_page(f.pool, s->pages[pi].page, &stolen[i]),
                                 PD_OK);
                has_stolen[i] = true;
            } else if (k == 1) {
                stale_write(&f, s->pages[pi].page, s->pages[pi].tag + 7);
            } else {
                int other = (s->pages[pi].page + 1 + rand() % (N_PAGES - 1)) % N_PAGES;
                lost[i] = s->pages[pi];
                has_lost[i] = true;
                s->pages[pi].page = other;
            }
            victim[i] = true;
            n_faults++;
        } else {
            /* an attention step over every live sequence */
            kv_seq_t *b[N_SEQ];
            int idx[N_SEQ], n = 0;
            pd_status_t st[N_SEQ];
            for (int j = 0; j < N_SEQ; j++)
                if (live[j]) {
                    idx[n] = j;
                    b[n++] = &seqs[j];
                }
            int bad = check(&f, b, n, st);
            n_checks++;
            int expect = 0;
            for (int j = 0; j < n; j++) {
                bool flagged = st[j] != PD_OK;
                if (flagged != victim[idx[j]])
                    fail_msg("step %d: seq %d flagged %d, victim %d", step, idx[j], flagged,
                             victim[idx[j]]);
                expect += victim[idx[j]];
                if (flagged)
                    n_caught++;
            }
            assert_int_equal(bad, expect);
        }
    }
    for (int i = 0; i < N_SEQ; i++) {
        kv_seq_release(f.pool, &seqs[i]);
        if (has_stolen[i])
            assert_int_equal(kv_pool_page_free(f.pool, stolen[i]), PD_OK);
        if (has_lost[i])
            assert_int_equal(kv_pool_page_free(f.pool, lost[i]), PD_OK);
        kv_seq_deinit(&seqs[i]);
    }
    printf("randomized: %d ops, %ld faults injected, %ld checks, %ld failures flagged, "
           "0 false positives, 0 misses\n",
           STEPS, n_faults, n_checks, n_caught);
    assert_true(n_faults > 50);
    fx_deinit(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_noop_checks_nothing),
        cmocka_unit_test(test_randomized),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
