/* Tests the tensor-parallel engine (common/engine/engine_tp.c and the TP paths of engine.c:
 * engine_params_t.tp, engine_export_pages into wire pages, engine_import_pages) on the CPU with
 * the in-process communicator, as the cluster's formats use it (prefill FP8 weights + BF16 KV,
 * decode INT4 weights + FP8 KV, KV re-sliced by head on the way):
 *   - the in-process pipeline prefill TP p -> decode TP d for (p, d) in {1, 2}^2 gives greedy ids
 *     equal to TP 1 -> TP 1 (tiny-llama; tiny-moe with BF16 decode weights: its INT4 experts do
 *     not split two ways, and FP8 at TP 2 quantizes activations per shard, tp_shard.h, which
 *     moves a late greedy token of one prompt);
 *   - a wire page whose rank-1 slice carries a wrong stamp fails its sequence at the next step
 *     (the check runs over every rank's slice before attention), counted once;
 *   - one checksum per slice (engine_import_pages_checked, the decode node's KV-done check): a
 *     byte changed in one rank's slice fails that import with PD_ERR_KV_INTEGRITY, names exactly
 *     that rank, and the next request, its slices intact, imports and decodes as before;
 *   - a rank whose op fails in the middle of a forward (tp_comm_faults: its collective fails
 *     while the other rank waits in it) does not hang the engine: the batch's requests end with
 *     PD_ERR_TP_ABORTED, the pages are free, and the next requests on the same engine give the
 *     clean run's ids (decode TP 2 in a step, prefill TP 2 in a prompt);
 *   - a TP size the KV heads do not split into is refused at create (PD_ERR_INVALID).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine.h"
#include "pipeline.h"
#include "tp_comm_faults.h"
#include "tp_kv.h"

#define N_GEN 24
#define N_CASES 3
/* Under ASan/UBSan (meson -Dsanitize=true defines PD_TEST_SANITIZED) the pipelines run ~20x
 * slower: every check runs on RUN_CASES prompts and RUN_GEN tokens (the same assertions). */
#ifdef PD_TEST_SANITIZED
#define RUN_CASES 1
#define RUN_GEN 8
#else
#define RUN_CASES N_CASES
#define RUN_GEN N_GEN
#endif

static engine_t *open_engine_faults(const char *model, pd_wfmt_t w, pd_kvfmt_t kv, int tp,
                                    tp_comm_faults_t *f)
{
    char dir[2048];
    engine_params_t p;
    engine_t *e = NULL;
    snprintf(dir, sizeof dir, "%s/%s", getenv("PD_MODELS_DIR"), model);
    engine_params_default(&p);
    p.model_dir = dir;
    p.wfmt = w;
    p.kvfmt = kv;
    p.kv_budget = 2 << 20;
    p.tp = tp;
    p.threads = 1;
    if (f) {
        p.tp_comm_wrap = tp_comm_faults_wrap;
        p.tp_comm_wrap_arg = f;
    }
    assert_int_equal(engine_create(&p, &e), PD_OK);
    assert_int_equal(engine_tp(e), tp);
    return e;
}

static engine_t *open_engine(const char *model, pd_wfmt_t w, pd_kvfmt_t kv, int tp)
{
    return open_engine_faults(model, w, kv, tp, NULL);
}

/* tiny-llama engines the tests share (loading them is most of the time under ASan): prefill FP8 +
 * BF16 KV and decode INT4 + FP8 KV, at TP 1 and TP 2; the TP 2 ones behind a fault wrapper that
 * stays disarmed (at 0) until a test arms it */
static struct {
    engine_t *p1, *d1, *p2, *d2;
    tp_comm_faults_t fp2, fd2;
} sh;

static int group_setup(void **s)
{
    (void)s;
    sh.p1 = open_engine("tiny-llama", PD_WFMT_FP8, PD_KV_BF16, 1);
    sh.d1 = open_engine("tiny-llama", PD_WFMT_INT4, PD_KV_FP8, 1);
    sh.fp2.rank = sh.fd2.rank = 1;
    sh.p2 = open_engine_faults("tiny-llama", PD_WFMT_FP8, PD_KV_BF16, 2, &sh.fp2);
    sh.d2 = open_engine_faults("tiny-llama", PD_WFMT_INT4, PD_KV_FP8, 2, &sh.fd2);
    return 0;
}

static int group_teardown(void **s)
{
    (void)s;
    engine_destroy(sh.p1);
    engine_destroy(sh.d1);
    engine_destroy(sh.p2);
    engine_destroy(sh.d2);
    return 0;
}

typedef struct {
    int32_t ids[N_GEN];
    int n;
} out_t;

static void on_token(void *arg, uint64_t id, int32_t tok, engine_finish_t f, pd_status_t st)
{
    out_t *o = arg;
    (void)id;
    (void)f;
    assert_int_equal(st, PD_OK);
    if (tok >= 0 && o->n < N_GEN)
        o->ids[o->n++] = tok;
}

static int load_prompts(const char *model, int32_t ids[N_CASES][64], int *n)
{
    char path[4096];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/%s/reference.json", getenv("PD_MODELS_DIR"), model);
    json_t *ref = json_load_file(path, 0, &jerr), *cases = json_object_get(ref, "cases");
    assert_non_null(ref);
    int k = 0;
    for (size_t c = 0; c < json_array_size(cases) && k < N_CASES; c++) {
        json_t *in = json_object_get(json_array_get(cases, c), "input_ids");
        if (json_array_size(in) < 12 || json_array_size(in) > 64)
            continue; /* prompts over a page, so pages of every kind travel */
        n[k] = (int)json_array_size(in);
        for (int i = 0; i < n[k]; i++)
            ids[k][i] = (int32_t)json_integer_value(json_array_get(in, (size_t)i));
        k++;
    }
    json_decref(ref);
    return k;
}

static void run_pipeline(engine_t *p, engine_t *d, const int32_t *prompt, int n, out_t *o)
{
    engine_gen_params_t gp = {
        .sampling = {0, 0, 1.0f, 0}, .max_tokens = RUN_GEN, .ignore_eos = true};
    memset(o, 0, sizeof *o);
    assert_int_equal(pipeline_add(p, d, prompt, n, &gp, on_token, o), PD_OK);
    assert_int_equal(engine_run(d), PD_OK);
    assert_int_equal(o->n, RUN_GEN);
    assert_int_equal(kv_pool_used_pages(engine_pool(d)), 0);
    assert_int_equal(kv_pool_used_pages(engine_pool(p)), 0);
}

static void check_model(const char *model, pd_wfmt_t dw, int shared)
{
    int32_t prompts[N_CASES][64];
    int lens[N_CASES];
    const int loaded = load_prompts(model, prompts, lens);
    const int n_cases = loaded < RUN_CASES ? loaded : RUN_CASES;
    out_t want[N_CASES], got;
    engine_t *pe[3] = {NULL}, *de[3] = {NULL};
    assert_true(n_cases > 0);
    for (int tp = 1; tp <= 2; tp++) {
        pe[tp] =
            shared ? (tp == 1 ? sh.p1 : sh.p2) : open_engine(model, PD_WFMT_FP8, PD_KV_BF16, tp);
        de[tp] = shared ? (tp == 1 ? sh.d1 : sh.d2) : open_engine(model, dw, PD_KV_FP8, tp);
    }
    for (int c = 0; c < n_cases; c++)
        run_pipeline(pe[1], de[1], prompts[c], lens[c], &want[c]);
    for (int p = 1; p <= 2; p++)
        for (int d = 1; d <= 2; d++)
            for (int c = 0; c < n_cases; c++) {
                run_pipeline(pe[p], de[d], prompts[c], lens[c], &got);
                int same = memcmp(got.ids, want[c].ids, sizeof got.ids) == 0;
                printf("# %s prefill tp %d -> decode tp %d, case %d: %s\n", model, p, d, c,
                       same ? "same ids as tp 1 -> tp 1" : "DIFFERENT ids");
                assert_memory_equal(got.ids, want[c].ids, sizeof got.ids);
            }
    for (int tp = 1; shared == 0 && tp <= 2; tp++) {
        engine_destroy(pe[tp]);
        engine_destroy(de[tp]);
    }
}

static void test_llama(void **s)
{
    (void)s;
    check_model("tiny-llama", PD_WFMT_INT4, 1);
}

static void test_moe(void **s)
{
    (void)s;
    check_model("tiny-moe", PD_WFMT_BF16, 0);
}

typedef struct {
    int tokens;
    pd_status_t end;
} fail_t;

static void on_token_fail(void *arg, uint64_t id, int32_t tok, engine_finish_t f, pd_status_t st)
{
    fail_t *o = arg;
    (void)id;
    if (tok >= 0)
        o->tokens++;
    else if (f == ENGINE_FINISH_ABORT)
        o->end = st;
}

/* A slice of a wire page whose stamp is not the reservation's tag: the sequence fails before its
 * first attention step, though rank 0's slice is intact. */
static void test_slice_integrity(void **s)
{
    int32_t prompts[N_CASES][64];
    int lens[N_CASES];
    (void)s;
    assert_true(load_prompts("tiny-llama", prompts, lens) > 0);
    engine_t *p = sh.p1, *d = sh.d2;
    engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0}, .max_tokens = 4, .ignore_eos = true};
    kv_layout_t wl;
    kv_seq_t pkv, dkv;
    int32_t first, pages[8];
    engine_kv_wire_layout(d, &wl);
    assert_int_equal(wl.n_slices, 2);
    assert_int_equal(wl.page_bytes, 2 * kv_pool_layout(engine_pool(d))->page_bytes);
    assert_int_equal(wl.n_kv_heads, 1);
    const int n = lens[0];
    kv_seq_init(&dkv);
    assert_int_equal(kv_seq_reserve(engine_pool(d), &dkv, n), PD_OK);
    assert_int_equal(engine_prefill(p, prompts[0], n, &gp, NULL, NULL, &first, &pkv, NULL), PD_OK);
    uint8_t *wire = malloc((size_t)dkv.n_pages * wl.page_bytes);
    assert_non_null(wire);
    assert_int_equal(engine_export_pages(p, &pkv, 0, pkv.n_pages, &wl, dkv.pages, wire), PD_OK);
    for (int i = 0; i < dkv.n_pages; i++) {
        kv_tag_t t0, t1;
        memcpy(&t0, wire + (size_t)i * wl.page_bytes, sizeof t0);
        memcpy(&t1, wire + (size_t)i * wl.page_bytes + wl.page_bytes / 2, sizeof t1);
        assert_true(t0 == dkv.pages[i].tag && t1 == dkv.pages[i].tag); /* every slice stamped */
        pages[i] = dkv.pages[i].page;
    }
    /* the last page's rank-1 slice: a stale stamp */
    kv_tag_t bad = dkv.pages[dkv.n_pages - 1].tag + 7;
    memcpy(wire + (size_t)(dkv.n_pages - 1) * wl.page_bytes + wl.page_bytes / 2, &bad, sizeof bad);
    assert_int_equal(engine_import_pages(d, wire, 1, pages, dkv.n_pages), PD_OK);
    int32_t *toks = malloc(((size_t)n + 1) * sizeof *toks);
    memcpy(toks, prompts[0], (size_t)n * sizeof *toks);
    toks[n] = first;
    fail_t o = {0, PD_OK};
    uint64_t id;
    const uint64_t failures = engine_tracker(d)->failures;
    gp.n_generated = 1;
    assert_int_equal(engine_seq_add_prefilled(d, toks, n + 1, n, &dkv, &gp, on_token_fail, &o, &id),
                     PD_OK);
    assert_int_equal(engine_step(d), PD_OK);
    assert_int_equal(engine_active(d), 0);
    assert_int_equal(o.tokens, 0);
    assert_int_equal(o.end, PD_ERR_KV_INTEGRITY);
    assert_int_equal(engine_tracker(d)->failures, failures + 1);
    assert_int_equal(kv_pool_used_pages(engine_pool(d)), 0);
    free(toks);
    free(wire);
    kv_seq_release(engine_pool(p), &pkv);
    kv_seq_deinit(&pkv);
    kv_seq_deinit(&dkv);
}

/* Prefills prompt on p (TP 1) into a fresh reservation of d and exports it as wire pages of d's
 * layout: *wire_p (n pages), the reservation in dkv, the first token in *first_p. */
static void export_wire(engine_t *p, engine_t *d, const int32_t *prompt, int n, kv_seq_t *dkv,
                        uint8_t **wire_p, int32_t *first_p)
{
    engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0}, .max_tokens = 4, .ignore_eos = true};
    kv_layout_t wl;
    kv_seq_t pkv;
    engine_kv_wire_layout(d, &wl);
    kv_seq_init(dkv);
    assert_int_equal(kv_seq_reserve(engine_pool(d), dkv, n), PD_OK);
    assert_int_equal(engine_prefill(p, prompt, n, &gp, NULL, NULL, first_p, &pkv, NULL), PD_OK);
    *wire_p = malloc((size_t)dkv->n_pages * wl.page_bytes);
    assert_non_null(*wire_p);
    assert_int_equal(engine_export_pages(p, &pkv, 0, pkv.n_pages, &wl, dkv->pages, *wire_p), PD_OK);
    kv_seq_release(engine_pool(p), &pkv);
    kv_seq_deinit(&pkv);
}

/* Each rank checks its own slice of what landed against the writer's per-slice checksums: a
 * changed byte in one slice fails exactly that import and names exactly that rank; the ranks and
 * the engine keep serving the next request. */
static void test_slice_checksums(void **s)
{
    int32_t prompts[N_CASES][64];
    int lens[N_CASES];
    (void)s;
    assert_true(load_prompts("tiny-llama", prompts, lens) >= 2);
    engine_t *p = sh.p1, *d = sh.d2;
    kv_layout_t wl;
    engine_kv_wire_layout(d, &wl);
    const size_t sb = tp_kv_slice_bytes(&wl);
    for (int victim = 0; victim < 2; victim++) {
        kv_seq_t dkv;
        uint8_t *wire;
        int32_t first, pages[8];
        uint64_t want[2];
        int bad[2] = {-1, -1};
        export_wire(p, d, prompts[0], lens[0], &dkv, &wire, &first);
        for (int r = 0; r < 2; r++) /* what the prefill node puts in KvDone.slice_checksums */
            want[r] = tp_kv_slice_checksum(0, wire, NULL, dkv.n_pages, &wl, r);
        assert_true(want[0] != want[1]);
        for (int i = 0; i < dkv.n_pages; i++)
            pages[i] = i;
        /* a byte of the victim's slice, past its header, changes after it was sent */
        wire[(size_t)(dkv.n_pages - 1) * wl.page_bytes + (size_t)victim * sb + sb / 2] ^= 0x40;
        assert_int_equal(engine_import_pages_checked(d, wire, 1, pages, dkv.n_pages, want, 77, bad),
                         PD_ERR_KV_INTEGRITY);
        printf("# slice of rank %d changed: ranks flagged {%d, %d}\n", victim, bad[0], bad[1]);
        assert_int_equal(bad[victim], 1);
        assert_int_equal(bad[1 - victim], 0);
        kv_seq_release(engine_pool(d), &dkv);
        kv_seq_deinit(&dkv);
        free(wire);
    }
    /* the next request, intact, imports (every rank's check passes) and decodes */
    kv_seq_t dkv;
    uint8_t *wire;
    int32_t first, pages[8];
    uint64_t want[2];
    int bad[2] = {-1, -1};
    const int n = lens[1];
    export_wire(p, d, prompts[1], n, &dkv, &wire, &first);
    for (int r = 0; r < 2; r++)
        want[r] = tp_kv_slice_checksum(0, wire, NULL, dkv.n_pages, &wl, r);
    for (int i = 0; i < dkv.n_pages; i++)
        pages[i] = dkv.pages[i].page;
    assert_int_equal(engine_import_pages_checked(d, wire, 1, pages, dkv.n_pages, want, 78, bad),
                     PD_OK);
    assert_true(bad[0] == 0 && bad[1] == 0);
    int32_t *toks = malloc(((size_t)n + 1) * sizeof *toks);
    memcpy(toks, prompts[1], (size_t)n * sizeof *toks);
    toks[n] = first;
    out_t o = {{0}, 0};
    uint64_t id;
    engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0}, .max_tokens = 4, .ignore_eos = true};
    gp.n_generated = 1;
    assert_int_equal(engine_seq_add_prefilled(d, toks, n + 1, n, &dkv, &gp, on_token, &o, &id),
                     PD_OK);
    assert_int_equal(engine_run(d), PD_OK);
    assert_int_equal(o.n, 4); /* max_tokens 4 decoded after the prefilled token */
    assert_int_equal(kv_pool_used_pages(engine_pool(d)), 0);
    free(toks);
    free(wire);
    kv_seq_deinit(&dkv);
}

typedef struct {
    int32_t ids[N_GEN];
    int n;
    int ended;
    pd_status_t end;
} gen_t;

static void on_gen(void *arg, uint64_t id, int32_t tok, engine_finish_t f, pd_status_t st)
{
    gen_t *o = arg;
    (void)id;
    if (tok >= 0 && o->n < N_GEN)
        o->ids[o->n++] = tok;
    if (f != ENGINE_FINISH_NONE) {
        o->ended = 1;
        o->end = st;
    }
}

/* One rank's collective fails in the middle of a forward, while the other waits in it: without
 * the abort this test hangs (meson's timeout fails it). */
#define AFTER (RUN_CASES < 2 ? 1 : 2) /* requests checked after the failure */

static void check_rank_failure(int prefill_tp, int decode_tp, int at, int32_t prompts[N_CASES][64],
                               const int *lens, const out_t *want)
{
    engine_t *p = prefill_tp > 1 ? sh.p2 : sh.p1, *d = decode_tp > 1 ? sh.d2 : sh.d1;
    tp_comm_faults_t *f = prefill_tp > 1 ? &sh.fp2 : &sh.fd2;
    atomic_store(&f->injected, 0);
    f->at = atomic_load(&f->calls) + at; /* armed: that rank's at-th collective from now */
    engine_gen_params_t gp = {
        .sampling = {0, 0, 1.0f, 0}, .max_tokens = RUN_GEN, .ignore_eos = true};
    gen_t v = {{0}, 0, 0, PD_OK};
    pd_status_t st = pipeline_add(p, d, prompts[0], lens[0], &gp, on_gen, &v);
    if (prefill_tp > 1) { /* the prompt's forward fails: nothing reaches the decode engine */
        assert_int_equal(st, PD_ERR_TP_ABORTED);
    } else {
        assert_int_equal(st, PD_OK);
        assert_int_equal(engine_run(d), PD_ERR_TP_ABORTED); /* the step that failed */
        assert_true(engine_run(d) == PD_OK);
        assert_true(v.ended);
        assert_int_equal(v.end, PD_ERR_TP_ABORTED);
        assert_true(v.n < RUN_GEN);
    }
    assert_int_equal(atomic_load(&f->injected), 1);
    printf("# prefill tp %d -> decode tp %d, rank 1's collective %d failed: request ended with "
           "'%s' after %d tokens\n",
           prefill_tp, decode_tp, at, pd_status_str(PD_ERR_TP_ABORTED), v.n);
    assert_int_equal(engine_active(d), 0);
    assert_int_equal(kv_pool_used_pages(engine_pool(d)), 0);
    assert_int_equal(kv_pool_used_pages(engine_pool(p)), 0);
    /* the same engines serve the next requests, every rank in step again */
    for (int c = 0; c < AFTER; c++) {
        out_t got;
        run_pipeline(p, d, prompts[c], lens[c], &got);
        assert_memory_equal(got.ids, want[c].ids, sizeof got.ids);
    }
}

static void test_rank_failure(void **s)
{
    int32_t prompts[N_CASES][64];
    int lens[N_CASES];
    out_t want[AFTER];
    (void)s;
    assert_true(load_prompts("tiny-llama", prompts, lens) >= AFTER);
    for (int c = 0; c < AFTER; c++) /* the clean run */
        run_pipeline(sh.p1, sh.d1, prompts[c], lens[c], &want[c]);
    check_rank_failure(1, 2, 12, prompts, lens, want); /* the second or third decode step */
    check_rank_failure(2, 1, 3, prompts, lens, want);  /* in the prompt's forward */
}

/* 2 KV heads do not split 4 ways */
static void test_refused(void **s)
{
    char dir[2048];
    engine_params_t p;
    engine_t *e = NULL;
    (void)s;
    snprintf(dir, sizeof dir, "%s/tiny-llama", getenv("PD_MODELS_DIR"));
    engine_params_default(&p);
    p.model_dir = dir;
    p.kv_budget = 2 << 20;
    p.tp = 4;
    p.threads = 1;
    assert_int_equal(engine_create(&p, &e), PD_ERR_INVALID);
    assert_null(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused),         cmocka_unit_test(test_slice_integrity),
        cmocka_unit_test(test_slice_checksums), cmocka_unit_test(test_rank_failure),
        cmocka_unit_test(test_llama),           cmocka_unit_test(test_moe),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
