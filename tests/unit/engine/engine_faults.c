/* Tests the integrity path of common/engine.c: a fault injected into one running sequence
 * (reused page, stale write, corrupt block-table entry) ends that sequence with
 * PD_ERR_KV_INTEGRITY while its neighbours produce exactly the tokens of a clean run; a pool too
 * small for all sequences preempts and still completes every one; abort frees pages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "kv_pool_faults.h"
#include "log.h"

typedef struct {
    int32_t out[64];
    int n;
    int done;
    engine_finish_t finish;
    pd_status_t status;
} col_t;

static void on_token(void *arg, uint64_t id, int32_t tok, engine_finish_t f, pd_status_t st)
{
    col_t *c = arg;
    (void)id;
    if (tok >= 0) {
        if (c->n < 64)
            c->out[c->n++] = tok;
        return;
    }
    c->done++;
    c->finish = f;
    c->status = st;
}

static engine_t *open_engine(int64_t budget)
{
    char dir[2048];
    engine_params_t p;
    engine_t *e;
    snprintf(dir, sizeof dir, "%s/tiny-llama", getenv("PD_MODELS_DIR"));
    engine_params_default(&p);
    p.model_dir = dir;
    p.kv_budget = budget;
    p.prefill_chunk = 8; /* several steps of chunked prefill too */
    assert_int_equal(engine_create(&p, &e), PD_OK);
    return e;
}

static const int32_t prompts[3][12] = {
    {0, 654, 1134, 272, 783, 570, 339, 595, 1763, 821, 1989, 714},
    {0, 17, 29, 300, 654, 1134, 272, 783, 570},
    {0, 1989, 714, 15, 691, 328, 635, 17}};
static const int lens[3] = {12, 9, 8};

static void add_all(engine_t *e, col_t *cols, uint64_t *ids, int max_tokens)
{
    for (int i = 0; i < 3; i++) {
        engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0},
                                  .max_tokens = max_tokens,
                                  .ignore_eos = true,
                                  .stop_ids = NULL,
                                  .n_stop_ids = 0,
                                  .n_generated = 0};
        memset(&cols[i], 0, sizeof cols[i]);
        assert_int_equal(engine_seq_add(e, prompts[i], lens[i], &gp, on_token, &cols[i], &ids[i]),
                         PD_OK);
    }
}

/* kind 0: page reused under the victim; 1: stale write; 2: corrupt block-table entry */
static void run_fault(int kind)
{
    engine_t *e = open_engine(0);
    col_t clean[3], cols[3];
    uint64_t ids[3];
    kv_page_ref_t thief = {0, 0, 0}, orig = {0, 0, 0};
    kv_seq_t *kv;

    add_all(e, clean, ids, 40);
    assert_int_equal(engine_run(e), PD_OK);
    add_all(e, cols, ids, 40);
    /* run until the victim has written into its second page */
    for (int s = 0; s < 100; s++) {
        assert_int_equal(engine_step(e), PD_OK);
        kv = engine_debug_seq_kv(e, ids[1]);
        assert_non_null(kv);
        if (kv->n_tokens > 20)
            break;
    }
    assert_true(kv->n_pages >= 2 && kv->n_tokens > 20);
    if (kind == 0) {
        assert_int_equal(kv_pool_faults_steal_page(engine_pool(e), kv->pages[0].page, &thief),
                         PD_OK);
    } else if (kind == 1) {
        pd_backend_t *be = engine_backend(e);
        kv_tag_t old = kv->pages[1].tag - 1;
        be->ops->kv_stamp(be, engine_arena(e), kv_pool_layout(engine_pool(e)), &kv->pages[1].page,
                          &old, 1);
    } else {
        orig = kv->pages[0];
        kv->pages[0].page = engine_debug_seq_kv(e, ids[0])->pages[0].page;
    }
    assert_int_equal(engine_run(e), PD_OK);
    assert_int_equal(cols[1].done, 1);
    assert_int_equal(cols[1].finish, ENGINE_FINISH_ABORT);
    assert_int_equal(cols[1].status, PD_ERR_KV_INTEGRITY);
    for (int i = 0; i < 3; i += 2) {
        assert_int_equal(cols[i].status, PD_OK);
        assert_int_equal(cols[i].n, 40);
        assert_memory_equal(cols[i].out, clean[i].out, 40 * sizeof(int32_t));
    }
    assert_int_equal(engine_tracker(e)->failures, 1);
    /* what the victim could not free: the thief's page, or the page its corrupt entry hid */
    if (kind == 0)
        assert_int_equal(kv_pool_page_free(engine_pool(e), thief), PD_OK);
    if (kind == 2)
        assert_int_equal(kv_pool_page_free(engine_pool(e), orig), PD_OK);
    assert_int_equal(kv_pool_used_pages(engine_pool(e)), 0);
    engine_destroy(e);
}

static void test_reuse(void **s)
{
    (void)s;
    run_fault(0);
}
static void test_stale_write(void **s)
{
    (void)s;
    run_fault(1);
}
static void test_corrupt_entry(void **s)
{
    (void)s;
    run_fault(2);
}

static void test_preemption(void **s)
{
    engine_t *big = open_engine(0);
    const kv_layout_t *l = kv_pool_layout(engine_pool(big));
    /* room for about one and a half sequences of 12 + 40 tokens */
    engine_t *small = open_engine((int64_t)l->page_bytes * 5);
    col_t ref[3], cols[3];
    uint64_t ids[3];
    (void)s;
    add_all(big, ref, ids, 40);
    assert_int_equal(engine_run(big), PD_OK);
    add_all(small, cols, ids, 40);
    assert_int_equal(engine_run(small), PD_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cols[i].status, PD_OK);
        assert_int_equal(cols[i].n, 40);
        assert_memory_equal(cols[i].out, ref[i].out, 40 * sizeof(int32_t));
    }
    assert_int_equal(kv_pool_used_pages(engine_pool(small)), 0);
    engine_destroy(big);
    engine_destroy(small);
}

static void test_abort(void **s)
{
    engine_t *e = open_engine(0);
    col_t cols[3];
    uint64_t ids[3];
    (void)s;
    add_all(e, cols, ids, 40);
    assert_int_equal(engine_step(e), PD_OK);
    assert_true(kv_pool_used_pages(engine_pool(e)) > 0);
    assert_int_equal(engine_seq_abort(e, ids[0]), PD_OK);
    assert_int_equal(engine_seq_abort(e, ids[0]), PD_ERR_NOT_FOUND);
    assert_int_equal(cols[0].status, PD_ERR_CANCELLED);
    assert_int_equal(engine_run(e), PD_OK);
    assert_int_equal(cols[1].n, 40);
    assert_int_equal(kv_pool_used_pages(engine_pool(e)), 0);
    engine_destroy(e);
}

static void test_bad_requests(void **s)
{
    engine_t *e = open_engine(0);
    engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0},
                              .max_tokens = 4,
                              .ignore_eos = false,
                              .stop_ids = NULL,
                              .n_stop_ids = 0,
                              .n_generated = 0};
    uint64_t id;
    int32_t bad[2] = {0, 99999}, *longp = calloc(4096, sizeof *longp);
    (void)s;
    assert_int_equal(engine_seq_add(e, bad, 0, &gp, NULL, NULL, &id), PD_ERR_INVALID);
    assert_int_equal(engine_seq_add(e, bad, 2, &gp, NULL, NULL, &id), PD_ERR_INVALID);
    assert_int_equal(engine_seq_add(e, longp, 2048, &gp, NULL, NULL, &id), PD_ERR_TOO_LONG);
    gp.max_tokens = 0;
    assert_int_equal(engine_seq_add(e, bad, 1, &gp, NULL, NULL, &id), PD_ERR_INVALID);
    gp.max_tokens = 4;
    gp.sampling.top_p = 0.0f;
    assert_int_equal(engine_seq_add(e, bad, 1, &gp, NULL, NULL, &id), PD_ERR_INVALID);
    assert_int_equal(engine_active(e), 0);
    free(longp);
    engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse),         cmocka_unit_test(test_stale_write),
        cmocka_unit_test(test_corrupt_entry), cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_abort),         cmocka_unit_test(test_bad_requests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
