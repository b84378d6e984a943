/* Tests engine_export_pages and engine_export_pages_dev (common/engine/engine.c), the writer's side of a KV transfer: clean
 * pages are converted and stamped with the destination's tags; a source page that fails its own
 * tag check (a stale write on the prefill side) is refused with PD_ERR_KV_INTEGRITY and nothing
 * is stamped, so corrupt KV never leaves the node carrying valid destination tags. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

static engine_t *open_engine(void)
{
    char dir[2048];
    engine_params_t p;
    engine_t *e;
    snprintf(dir, sizeof dir, "%s/tiny-llama", getenv("PD_MODELS_DIR"));
    engine_params_default(&p);
    p.model_dir = dir;
    p.kv_budget = 4 << 20;
    assert_int_equal(engine_create(&p, &e), PD_OK);
    return e;
}

static void test_export(void **state)
{
    static const int32_t prompt[40] = {0,    654, 1134, 272, 783, 570, 339,  595, 1763, 821,
                                       1989, 714, 17,   29,  300, 654, 1134, 272, 783,  570,
                                       0,    654, 1134, 272, 783, 570, 339,  595, 1763, 821,
                                       1989, 714, 17,   29,  300, 654, 1134, 272, 783,  570};
    engine_t *e = open_engine();
    const kv_layout_t *src_l = kv_pool_layout(engine_pool(e));
    engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0},
                              .max_tokens = 4,
                              .ignore_eos = true,
                              .stop_ids = NULL,
                              .n_stop_ids = 0,
                              .n_generated = 0};
    kv_layout_t dst_l;
    /* 64-bit destination tags: the high half must arrive too */
    kv_page_ref_t dst[3] = {
        {7, 1001 | 1ull << 40, 0}, {8, 1002 | 1ull << 40, 0}, {9, 1003 | 1ull << 40, 0}};
    kv_seq_t kv;
    int32_t first;
    kv_tag_t stamp;
    (void)state;

    assert_int_equal(engine_prefill(e, prompt, 40, &gp, NULL, NULL, &first, &kv, NULL), PD_OK);
    assert_int_equal(kv.n_pages, 3); /* 40 tokens, 16 per page */
    kv_layout_init(&dst_l, src_l->n_layers, src_l->n_kv_heads, src_l->head_dim, src_l->page_tokens,
                   PD_KV_FP8);
    uint8_t *out = malloc(3 * dst_l.page_bytes);
    assert_non_null(out);

    /* clean: every page converted and stamped with its destination tag */
    memset(out, 0xa5, 3 * dst_l.page_bytes);
    assert_int_equal(engine_export_pages(e, &kv, 0, 3, &dst_l, dst, out), PD_OK);
    for (int i = 0; i < 3; i++) {
        memcpy(&stamp, out + (size_t)i * dst_l.page_bytes, sizeof stamp);
        assert_true(stamp == dst[i].tag);
    }

    /* the device variant (here the CPU backend's memory) leaves the same bytes, stamps included */
    pd_backend_t *be = engine_backend(e);
    void *dev = NULL;
    uint8_t *back = malloc(3 * dst_l.page_bytes);
    assert_non_null(back);
    assert_int_equal(be->ops->alloc(be, 3 * dst_l.page_bytes, &dev), PD_OK);
    assert_int_equal(be->ops->memset(be, dev, 0x5a, 3 * dst_l.page_bytes), PD_OK);
    assert_int_equal(engine_export_pages_dev(e, &kv, 0, 3, &dst_l, dst, dev), PD_OK);
    assert_int_equal(be->ops->download(be, back, dev, 3 * dst_l.page_bytes), PD_OK);
    assert_memory_equal(back, out, 3 * dst_l.page_bytes);

    /* a stale write into the source's second page (its header carries another owner's stamp) */
    uint8_t *hdr = (uint8_t *)engine_arena(e) + (size_t)kv.pages[1].page * src_l->page_bytes;
    kv_tag_t saved, bogus = kv.pages[1].tag + (1ull << 32); /* differs only in the high half */
    memcpy(&saved, hdr, sizeof saved);
    memcpy(hdr, &bogus, sizeof bogus);
    memset(out, 0xa5, 3 * dst_l.page_bytes);
    assert_int_equal(engine_export_pages(e, &kv, 0, 3, &dst_l, dst, out), PD_ERR_KV_INTEGRITY);
    for (int i = 0; i < 3; i++) { /* no destination tag was stamped anywhere */
        memcpy(&stamp, out + (size_t)i * dst_l.page_bytes, sizeof stamp);
        assert_true(stamp != dst[i].tag);
    }
    assert_int_equal(be->ops->memset(be, dev, 0x5a, 3 * dst_l.page_bytes), PD_OK);
    assert_int_equal(engine_export_pages_dev(e, &kv, 0, 3, &dst_l, dst, dev), PD_ERR_KV_INTEGRITY);
    assert_int_equal(be->ops->download(be, back, dev, 3 * dst_l.page_bytes), PD_OK);
    for (int i = 0; i < 3; i++) { /* nothing enqueued: no stamp */
        memcpy(&stamp, back + (size_t)i * dst_l.page_bytes, sizeof stamp);
        assert_true(stamp != dst[i].tag);
    }
    be->ops->free(be, dev);
    free(back);
    /* the pages before the bad one alone are still fine */
    assert_int_equal(engine_export_pages(e, &kv, 0, 1, &dst_l, dst, out), PD_OK);
    memcpy(hdr, &saved, sizeof saved);
    assert_int_equal(engine_export_pages(e, &kv, 1, 2, &dst_l, dst + 1, out), PD_OK);

    free(out);
    kv_seq_release(engine_pool(e), &kv);
    kv_seq_deinit(&kv);
    assert_int_equal(kv_pool_used_pages(engine_pool(e)), 0);
    engine_destroy(e);
}

/* The per-layer path (engine_set_prefill_layer_hook + ops->xfer_kv_export, as the prefill node
 * drives it): each chunk calls the hook once per layer, in order, with the pages it completes;
 * exporting layer by layer, scattered to destination pages, gives the bytes engine_export_pages
 * gives for the whole prompt, stamps included. */
typedef struct {
    engine_t *e;
    const kv_layout_t *dst_l;
    uint8_t *pool;      /* destination pool (the CPU backend's memory) */
    int32_t *dst_ids;   /* (n) destination page ids */
    kv_tag_t *tags;     /* (n) */
    int32_t src_ids[8]; /* the source pages' ids, filled at the first call */
    int calls, next_layer, next_first, chunks;
} layer_rec_t;

static void rec_layer(void *arg, const kv_seq_t *kv, int first, int n, int layer)
{
    layer_rec_t *r = arg;
    pd_backend_t *be = engine_backend(r->e);
    const kv_layout_t *src_l = kv_pool_layout(engine_pool(r->e));
    assert_int_equal(layer, r->next_layer); /* layers in order, every one */
    assert_int_equal(first, r->next_first);
    assert_true(n >= 1 && first + n <= kv->n_pages);
    for (int i = first; i < first + n; i++)
        r->src_ids[i] = kv->pages[i].page;
    be->ops->xfer_kv_export(be, r->pool, r->dst_l, r->dst_ids + first, r->tags + first,
                            engine_arena(r->e), src_l, r->src_ids + first, n, layer, 1);
    r->calls++;
    if (++r->next_layer == src_l->n_layers) { /* the chunk's last layer */
        r->next_layer = 0;
        r->next_first = first + n;
        r->chunks++;
    }
}

static void test_layer_hook(void **state)
{
    char dir[2048];
    engine_params_t p;
    engine_t *e;
    int32_t prompt[100];
    (void)state;
    for (int i = 0; i < 100; i++)
        prompt[i] = (int32_t)(3 + (i * 37) % 1900);
    snprintf(dir, sizeof dir, "%s/tiny-llama", getenv("PD_MODELS_DIR"));
    engine_params_default(&p);
    p.model_dir = dir;
    p.kv_budget = 4 << 20;
    p.prefill_chunk = 32; /* 100 tokens: chunks of 32, 32, 32, 4 tokens; 7 pages of 16 */
    assert_int_equal(engine_create(&p, &e), PD_OK);
    const kv_layout_t *src_l = kv_pool_layout(engine_pool(e));
    pd_backend_t *be = engine_backend(e);
    kv_layout_t dst_l;
    kv_layout_init(&dst_l, src_l->n_layers, src_l->n_kv_heads, src_l->head_dim, src_l->page_tokens,
                   PD_KV_FP8);
    int32_t dst_ids[7] = {11, 3, 4, 5, 0, 9, 7};
    kv_tag_t tags[7];
    for (int i = 0; i < 7; i++)
        tags[i] = 5000 + (uint64_t)i + (1ull << 36);
    layer_rec_t r = {e, &dst_l, NULL, dst_ids, tags, {0}, 0, 0, 0, 0};
    const size_t pool_bytes = 12 * dst_l.page_bytes;
    assert_int_equal(be->ops->alloc(be, pool_bytes, (void **)&r.pool), PD_OK);
    memset(r.pool, 0x5a, pool_bytes);
    engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0}, .max_tokens = 1, .ignore_eos = true};
    kv_seq_t kv;
    int32_t first;

    assert_true(engine_set_prefill_layer_hook(e, rec_layer, &r));
    assert_int_equal(engine_prefill(e, prompt, 100, &gp, NULL, NULL, &first, &kv, NULL), PD_OK);
    assert_true(engine_set_prefill_layer_hook(e, NULL, NULL));
    assert_int_equal(be->ops->xfer_sync(be), PD_OK);
    assert_int_equal(kv.n_pages, 7);
    /* chunks completing pages 0..1, 2..3, 4..5 and the last, partial one: 6 */
    assert_int_equal(r.chunks, 4);
    assert_int_equal(r.calls, 4 * src_l->n_layers);
    assert_int_equal(r.next_first, 7);

    kv_page_ref_t refs[7];
    for (int i = 0; i < 7; i++)
        refs[i] = (kv_page_ref_t){dst_ids[i], tags[i], 0};
    uint8_t *want = malloc(7 * dst_l.page_bytes);
    assert_non_null(want);
    assert_int_equal(engine_export_pages(e, &kv, 0, 7, &dst_l, refs, want), PD_OK);
    for (int i = 0; i < 7; i++)
        assert_memory_equal(r.pool + (size_t)dst_ids[i] * dst_l.page_bytes,
                            want + (size_t)i * dst_l.page_bytes, dst_l.page_bytes);
    /* pages no one wrote are untouched */
    for (size_t b = 0; b < dst_l.page_bytes; b++)
        assert_int_equal(r.pool[(size_t)1 * dst_l.page_bytes + b], 0x5a);

    /* with the hook cleared, no call */
    kv_seq_t kv2;
    r.calls = 0;
    assert_int_equal(engine_prefill(e, prompt, 40, &gp, NULL, NULL, &first, &kv2, NULL), PD_OK);
    assert_int_equal(r.calls, 0);
    kv_seq_release(engine_pool(e), &kv2);
    kv_seq_deinit(&kv2);

    free(want);
    be->ops->free(be, r.pool);
    kv_seq_release(engine_pool(e), &kv);
    kv_seq_deinit(&kv);
    engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_export),
                                       cmocka_unit_test(test_layer_hook)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
