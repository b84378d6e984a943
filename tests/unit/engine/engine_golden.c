/* Tests common/engine.c end to end against transformers itself (reference.json of each fixture):
 * input ids, the 48 greedy ids and the last-position logits. With f32 KV (the reference's own
 * precision) logits agree within 2e-3; with BF16 KV (rounding K/V to 8 bits of mantissa) within
 * 3e-2. Also: results do not depend on the number of threads, and same seed -> same tokens. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine.h"
#include "tokenizer.h"

typedef struct {
    int32_t out[64];
    int n;
    pd_status_t status;
} collect_t;

static void on_token(void *arg, uint64_t id, int32_t tok, engine_finish_t f, pd_status_t st)
{
    collect_t *c = arg;
    (void)id;
    (void)f;
    if (tok >= 0 && c->n < 64)
        c->out[c->n++] = tok;
    if (tok < 0)
        c->status = st;
}

static engine_t *open_engine(const char *dir, pd_kvfmt_t kv, int threads)
{
    engine_params_t p;
    engine_t *e;
    engine_params_default(&p);
    p.model_dir = dir;
    p.kvfmt = kv;
    p.threads = threads;
    assert_int_equal(engine_create(&p, &e), PD_OK);
    return e;
}

/* max_differ: greedy sequences allowed to differ from transformers' (BF16 KV rounding can turn a
 * near tie late in a 48-token run; with f32 KV none may) */
static void check_model_n(const char *name, pd_kvfmt_t kv, double tol, int max_differ)
{
    char dir[2048], path[4096];
    snprintf(dir, sizeof dir, "%s/%s", getenv("PD_MODELS_DIR"), name);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_error_t jerr;
    json_t *ref = json_load_file(path, 0, &jerr);
    assert_non_null(ref);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    tokenizer_t *tok;
    assert_int_equal(tokenizer_load(path, &tok), PD_OK);
    engine_t *e = open_engine(dir, kv, 0);
    const int vocab = engine_model(e)->cfg.vocab_size;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    json_t *cases = json_object_get(ref, "cases"), *c;
    size_t ci;
    int exact = 0;
    double worst = 0;

    json_array_foreach(cases, ci, c)
    {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        json_t *in = json_object_get(c, "input_ids"), *greedy = json_object_get(c, "greedy_ids");
        json_t *ll = json_object_get(c, "last_logits");
        int32_t *ids;
        size_t n;
        double nll;
        assert_int_equal(tokenizer_encode(tok, prompt, strlen(prompt), true, &ids, &n), PD_OK);
        assert_int_equal(n, json_array_size(in));
        for (size_t i = 0; i < n; i++)
            assert_int_equal(ids[i], json_integer_value(json_array_get(in, i)));
        assert_int_equal(engine_score(e, ids, (int)n, (int)n, NULL, &nll, logits), PD_OK);
        for (int v = 0; v < vocab; v++) {
            double d = fabs(logits[v] - json_real_value(json_array_get(ll, (size_t)v)));
            if (d > worst)
                worst = d;
        }
        engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0},
                                  .max_tokens = (int)json_array_size(greedy),
                                  .ignore_eos = true,
                                  .stop_ids = NULL,
                                  .n_stop_ids = 0,
                                  .n_generated = 0};
        collect_t col = {.n = 0};
        uint64_t id;
        assert_int_equal(engine_seq_add(e, ids, (int)n, &gp, on_token, &col, &id), PD_OK);
        assert_int_equal(engine_run(e), PD_OK);
        assert_int_equal(col.status, PD_OK);
        assert_int_equal(col.n, json_array_size(greedy));
        int same = 1;
        for (int i = 0; i < col.n; i++)
            same &= col.out[i] == json_integer_value(json_array_get(greedy, (size_t)i));
        exact += same;
        if (kv == PD_KV_F32 && !same)
            fail_msg("%s case %zu: greedy ids differ from transformers", name, ci);
        free(ids);
    }
    printf("%s kv=%s: %d/%zu greedy sequences identical, max |logit diff| %.3g (tol %.3g)\n", name,
           pd_kvfmt_name(kv), exact, json_array_size(cases), worst, tol);
    assert_true(worst <= tol);
    assert_true(exact >= (int)json_array_size(cases) - max_differ);
    assert_int_equal(kv_pool_used_pages(engine_pool(e)), 0);
    free(logits);
    engine_destroy(e);
    tokenizer_destroy(tok);
    json_decref(ref);
}

static void check_model(const char *name, pd_kvfmt_t kv, double tol)
{
    check_model_n(name, kv, tol, 1);
}

static void test_llama_f32(void **s)
{
    (void)s;
    check_model("tiny-llama", PD_KV_F32, 2e-3);
}
static void test_moe_f32(void **s)
{
    (void)s;
    check_model("tiny-moe", PD_KV_F32, 2e-3);
}
static void test_llama_bf16(void **s)
{
    (void)s;
    check_model("tiny-llama", PD_KV_BF16, 3e-2);
}
static void test_moe_bf16(void **s)
{
    (void)s;
    check_model("tiny-moe", PD_KV_BF16, 3e-2);
}

static void test_glm_f32(void **s)
{
    (void)s;
    check_model("tiny-glm", PD_KV_F32, 2e-3);
}
static void test_dsv3_f32(void **s)
{
    (void)s;
    check_model("tiny-dsv3", PD_KV_F32, 2e-3);
}
static void test_glm_bf16(void **s)
{
    (void)s;
    /* measured 0.031; transformers itself with its cache rounded to bf16: 0.031 (docs/accuracy.md:
     * the biased K is larger than tiny-llama's, one bf16 rounding moves the scores more) */
    check_model("tiny-glm", PD_KV_BF16, 4e-2);
}
static void test_dsv3_bf16(void **s)
{
    (void)s;
    /* measured 0.015, 6/8 identical; transformers with a bf16 cache parts the same two cases at
     * the same tokens (6 and 34), where the f32 top two logprobs are 0.0004 / 0.0024 apart
     * (docs/accuracy.md) */
    check_model_n("tiny-dsv3", PD_KV_BF16, 3e-2, 2);
}

static const int32_t batch_prompts[3][6] = {
    {0, 654, 1134, 272, 783, 570}, {0, 17, 29, 300}, {0, 1989, 714, 15, 691}};
static const int batch_lens[3] = {6, 4, 5};

/* Runs prompt `only` (or all three when only < 0) as one continuous batch into cols[i]. */
static void run_batch_sel(engine_t *e, float temperature, uint64_t seed, int only, collect_t *cols)
{
    const int32_t(*prompts)[6] = batch_prompts;
    const int *lens = batch_lens;
    for (int i = 0; i < 3; i++) {
        if (only >= 0 && i != only)
            continue;
        engine_gen_params_t gp = {.sampling = {temperature, 40, 0.95f, seed + (uint64_t)i},
                                  .max_tokens = 20,
                                  .ignore_eos = true,
                                  .stop_ids = NULL,
                                  .n_stop_ids = 0,
                                  .n_generated = 0};
        uint64_t id;
        memset(&cols[i], 0, sizeof cols[i]);
        assert_int_equal(engine_seq_add(e, prompts[i], lens[i], &gp, on_token, &cols[i], &id),
                         PD_OK);
    }
    assert_int_equal(engine_run(e), PD_OK);
}

static void run_batch(engine_t *e, float temperature, uint64_t seed, collect_t *cols)
{
    run_batch_sel(e, temperature, seed, -1, cols);
}

/* Prompt i alone, greedy. */
static void run_batch_one(engine_t *e, int i, collect_t *cols)
{
    run_batch_sel(e, 0.0f, 0, i, cols);
}

static void test_threads_and_seed(void **s)
{
    char dir[4096];
    collect_t a[3], b[3], c[3], g[3];
    (void)s;
    snprintf(dir, sizeof dir, "%s/tiny-moe", getenv("PD_MODELS_DIR"));
    engine_t *e1 = open_engine(dir, PD_KV_BF16, 1), *e2 = open_engine(dir, PD_KV_BF16, 2);
    run_batch(e1, 0.8f, 42, a);
    run_batch(e2, 0.8f, 42, b);
    run_batch(e2, 0.8f, 43, c);
    run_batch(e2, 0.0f, 0, g);
    int differs = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(a[i].n, 20);
        assert_memory_equal(a[i].out, b[i].out, 20 * sizeof(int32_t)); /* threads: identical */
        differs |= memcmp(a[i].out, c[i].out, 20 * sizeof(int32_t)) != 0;
    }
    assert_true(differs); /* another seed, other tokens */
    /* the greedy batch gives each prompt exactly the tokens it gets alone: batching (other rows,
     * other contexts in the step) never changes a sequence's arithmetic on the CPU backend */
    for (int i = 0; i < 3; i++) {
        collect_t alone[3];
        run_batch_one(e1, i, alone);
        assert_int_equal(g[i].n, 20);
        assert_int_equal(alone[i].n, 20);
        assert_memory_equal(g[i].out, alone[i].out, 20 * sizeof(int32_t));
    }
    engine_destroy(e1);
    engine_destroy(e2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_f32),        cmocka_unit_test(test_moe_f32),
        cmocka_unit_test(test_llama_bf16),       cmocka_unit_test(test_moe_bf16),
        cmocka_unit_test(test_threads_and_seed), cmocka_unit_test(test_glm_f32),
        cmocka_unit_test(test_dsv3_f32),         cmocka_unit_test(test_glm_bf16),
        cmocka_unit_test(test_dsv3_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
