/* Tests the engine's logits processing, logprobs and parallel samples (common/engine/engine.c) on
 * tiny-llama: every token a sequence samples with penalties, logit bias and min_tokens is the
 * argmax of the reference processing (sampler_logits_process_ref) applied by hand to the logits
 * of the same context (engine_score); logprobs match log_softmax of those logits; engine_prefill's
 * n samples draw what n single-sample prefills with the derived seeds draw; a KV copy decodes
 * exactly like the original; nothing leaks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

#define MAXT 16

typedef struct {
    engine_t *e;
    int32_t out[MAXT];
    sampler_logprobs_t lp[MAXT];
    int n, has_lp;
    engine_finish_t finish;
} col_t;

static void on_token(void *arg, uint64_t id, int32_t tok, engine_finish_t f, pd_status_t st)
{
    col_t *c = arg;
    (void)id;
    if (tok < 0) {
        assert_int_equal(st, PD_OK);
        c->finish = f;
        return;
    }
    const sampler_logprobs_t *lp = engine_token_logprobs(c->e);
    if (lp) {
        c->lp[c->n] = *lp;
        c->has_lp++;
    }
    c->out[c->n++] = tok;
}

static engine_t *open_engine(void)
{
    char dir[2048];
    engine_params_t p;
    engine_t *e;
    snprintf(dir, sizeof dir, "%s/tiny-llama", getenv("PD_MODELS_DIR"));
    engine_params_default(&p);
    p.model_dir = dir;
    p.prefill_chunk = 8;
    assert_int_equal(engine_create(&p, &e), PD_OK);
    return e;
}

static const int32_t prompt[] = {0, 654, 1134, 272, 783, 570, 339, 595, 1763, 821, 1989, 714};
#define NP 12

/* The logits after ctx (n tokens). */
static void logits_after(engine_t *e, const int32_t *ctx, int n, float *out)
{
    double nll;
    assert_int_equal(engine_score(e, ctx, n, n, NULL, &nll, out), PD_OK);
}

/* Greedy with presence, frequency and repetition penalties, a logit bias and min_tokens (EOS
 * pushed up by the bias, so only min_tokens keeps it away): each token is the argmax of the
 * reference processing of the same context's logits. */
static void test_penalties_match_reference(void **st)
{
    engine_t *e = open_engine();
    const hf_config_t *cfg = &engine_model(e)->cfg;
    const int V = cfg->vocab_size, eos = cfg->eos_token_ids[0];
    int32_t bias_ids[2] = {eos, 1134};
    float bias_vals[2] = {30.0f, 4.0f};
    engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0},
                              .max_tokens = 10,
                              .presence_penalty = 0.5f,
                              .frequency_penalty = 1.5f,
                              .repetition_penalty = 1.3f,
                              .bias_ids = bias_ids,
                              .bias_vals = bias_vals,
                              .n_bias = 2,
                              .min_tokens = 6,
                              .logprobs = true,
                              .top_logprobs = 5};
    col_t c = {.e = e};
    uint64_t id;
    (void)st;
    assert_true(cfg->n_eos > 0);
    assert_int_equal(engine_seq_add(e, prompt, NP, &gp, on_token, &c, &id), PD_OK);
    assert_int_equal(engine_run(e), PD_OK);
    /* EOS was masked for 6 tokens, then the bias of +30 makes it the argmax: token 7 is EOS */
    assert_int_equal(c.n, 7);
    assert_int_equal(c.out[6], eos);
    assert_int_equal(c.finish, ENGINE_FINISH_STOP);
    assert_int_equal(c.has_lp, 7);

    int32_t ctx[NP + MAXT];
    float *l = malloc((size_t)V * 4), *raw = malloc((size_t)V * 4);
    int32_t *counts = calloc((size_t)V, 4), ent[4 * (NP + MAXT + 2)];
    float fb[NP + MAXT + 2], pen[3] = {0.5f, 1.5f, 1.3f};
    memcpy(ctx, prompt, sizeof prompt);
    for (int k = 0; k < c.n; k++) {
        logits_after(e, ctx, NP + k, raw);
        memcpy(l, raw, (size_t)V * 4);
        /* entries: prompt tokens and generated tokens once each, the bias, the mask */
        int n_ent = 0;
        for (int t = 0; t < V; t++) {
            int in_p = 0;
            for (int i = 0; i < NP; i++)
                in_p |= prompt[i] == t;
            int is_bias = t == eos || t == 1134;
            int masked = k < 6 && t == eos;
            if (!in_p && !counts[t] && !is_bias && !masked)
                continue;
            ent[4 * n_ent] = 0;
            ent[4 * n_ent + 1] = t;
            ent[4 * n_ent + 2] = counts[t];
            ent[4 * n_ent + 3] =
                (in_p ? SAMPLER_ENT_IN_PROMPT : 0) | (masked ? SAMPLER_ENT_MASKED : 0);
            fb[n_ent] = t == eos ? 30.0f : t == 1134 ? 4.0f : 0.0f;
            n_ent++;
        }
        sampler_logits_process_ref(l, 1, V, ent, fb, n_ent, pen);
        assert_int_equal(c.out[k], sampler_argmax(l, V));
        /* raw logprobs: before any processing */
        sampler_logprobs_t ref;
        sampler_logprobs(raw, V, c.out[k], 5, &ref);
        assert_int_equal(c.lp[k].token, c.out[k]);
        assert_true(fabsf(c.lp[k].logprob - ref.logprob) < 1e-3f);
        assert_int_equal(c.lp[k].n_top, 5);
        for (int i = 0; i < 5; i++) {
            assert_int_equal(c.lp[k].top_ids[i], ref.top_ids[i]);
            assert_true(fabsf(c.lp[k].top_logprobs[i] - ref.top_logprobs[i]) < 1e-3f);
        }
        counts[c.out[k]]++;
        ctx[NP + k] = c.out[k];
    }
    /* the penalties changed something: plain greedy differs */
    engine_gen_params_t plain = {.sampling = {0, 0, 1.0f, 0}, .max_tokens = 7, .ignore_eos = true};
    col_t p = {.e = e};
    assert_int_equal(engine_seq_add(e, prompt, NP, &plain, on_token, &p, &id), PD_OK);
    assert_int_equal(engine_run(e), PD_OK);
    assert_int_equal(p.has_lp, 0);
    assert_true(memcmp(p.out, c.out, 7 * sizeof(int32_t)) != 0);
    assert_int_equal(kv_pool_used_pages(engine_pool(e)), 0);
    free(l);
    free(raw);
    free(counts);
    engine_destroy(e);
}

/* stop_token_ids end a sequence; min_tokens holds them off. */
static void test_stop_ids_min_tokens(void **st)
{
    engine_t *e = open_engine();
    engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0}, .max_tokens = 8, .ignore_eos = true};
    col_t a = {.e = e}, b = {.e = e}, c = {.e = e};
    uint64_t id;
    (void)st;
    assert_int_equal(engine_seq_add(e, prompt, NP, &gp, on_token, &a, &id), PD_OK);
    assert_int_equal(engine_run(e), PD_OK);
    assert_int_equal(a.n, 8);
    /* the third greedy token as a stop id: the sequence stops there */
    int32_t stop = a.out[2];
    int first = 0;
    while (a.out[first] != stop)
        first++;
    gp.stop_ids = &stop;
    gp.n_stop_ids = 1;
    assert_int_equal(engine_seq_add(e, prompt, NP, &gp, on_token, &b, &id), PD_OK);
    assert_int_equal(engine_run(e), PD_OK);
    assert_int_equal(b.n, first + 1);
    assert_int_equal(b.finish, ENGINE_FINISH_STOP);
    /* min_tokens past it: the stop id cannot be sampled before 5 tokens */
    gp.min_tokens = 5;
    assert_int_equal(engine_seq_add(e, prompt, NP, &gp, on_token, &c, &id), PD_OK);
    assert_int_equal(engine_run(e), PD_OK);
    assert_true(c.n >= 5);
    for (int i = 0; i < 4; i++)
        assert_int_not_equal(c.out[i], stop);
    engine_destroy(e);
}

/* n samples in one prefill: sample i is the single-sample prefill with seed sampler_seed_for;
 * prompt logprobs score each prompt token; a KV copy decodes like the original. */
static void test_prefill_samples_and_copy(void **st)
{
    engine_t *e = open_engine();
    const int V = engine_model(e)->cfg.vocab_size;
    engine_gen_params_t gp = {.sampling = {1.0f, 0, 1.0f, 1234},
                              .max_tokens = 6,
                              .ignore_eos = true,
                              .n_samples = 4,
                              .logprobs = true,
                              .top_logprobs = 2,
                              .prompt_logprobs = true};
    int32_t first[4], one;
    sampler_logprobs_t lp[4 + NP - 1];
    kv_seq_t kv, kv1;
    (void)st;
    assert_int_equal(engine_prefill(e, prompt, NP, &gp, NULL, NULL, first, &kv, lp), PD_OK);
    int distinct = 0;
    for (int i = 0; i < 4; i++) {
        engine_gen_params_t g1 = gp;
        g1.n_samples = 1;
        g1.prompt_logprobs = false;
        g1.sampling.seed = sampler_seed_for(1234, (uint32_t)i);
        assert_int_equal(engine_prefill(e, prompt, NP, &g1, NULL, NULL, &one, &kv1, NULL), PD_OK);
        assert_int_equal(one, first[i]);
        assert_int_equal(lp[i].token, first[i]);
        kv_seq_release(engine_pool(e), &kv1);
        kv_seq_deinit(&kv1);
        distinct += i > 0 && first[i] != first[0];
    }
    assert_true(distinct > 0); /* temperature 1 over tiny-llama: not all the same */
    float *l = malloc((size_t)V * 4);
    for (int j = 0; j + 1 < NP; j++) {
        sampler_logprobs_t ref;
        logits_after(e, prompt, j + 1, l);
        sampler_logprobs(l, V, prompt[j + 1], 2, &ref);
        assert_int_equal(lp[4 + j].token, prompt[j + 1]);
        assert_true(fabsf(lp[4 + j].logprob - ref.logprob) < 1e-3f);
        assert_int_equal(lp[4 + j].top_ids[0], ref.top_ids[0]);
    }
    free(l);
    /* fork: the copy and the original continue identically (greedy) */
    kv_seq_t copy;
    kv_seq_init(&copy);
    assert_int_equal(engine_kv_copy(e, &kv, NP, &copy), PD_OK);
    assert_int_equal(copy.n_pages, kv.n_pages);
    for (int i = 0; i < copy.n_pages; i++)
        assert_int_not_equal(copy.pages[i].page, kv.pages[i].page);
    int32_t toks[NP + 1];
    memcpy(toks, prompt, sizeof prompt);
    toks[NP] = first[0];
    engine_gen_params_t dg = {
        .sampling = {0, 0, 1.0f, 0}, .max_tokens = 5, .ignore_eos = true, .n_generated = 1};
    col_t a = {.e = e}, b = {.e = e};
    uint64_t id;
    assert_int_equal(engine_seq_add_prefilled(e, toks, NP + 1, NP, &kv, &dg, on_token, &a, &id),
                     PD_OK);
    assert_int_equal(engine_seq_add_prefilled(e, toks, NP + 1, NP, &copy, &dg, on_token, &b, &id),
                     PD_OK);
    assert_int_equal(engine_run(e), PD_OK);
    assert_int_equal(a.n, 5);
    assert_memory_equal(a.out, b.out, 5 * sizeof(int32_t));
    kv_seq_deinit(&kv);
    kv_seq_deinit(&copy);
    assert_int_equal(kv_pool_used_pages(engine_pool(e)), 0);
    engine_destroy(e);
}

static void test_bad_params(void **st)
{
    engine_t *e = open_engine();
    int32_t bad_id = 1 << 30;
    float bias = 1.0f;
    engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0}, .max_tokens = 4};
    uint64_t id;
    (void)st;
    gp.bias_ids = &bad_id;
    gp.bias_vals = &bias;
    gp.n_bias = 1;
    assert_int_equal(engine_seq_add(e, prompt, NP, &gp, NULL, NULL, &id), PD_ERR_INVALID);
    gp.n_bias = 0;
    gp.top_logprobs = 21;
    assert_int_equal(engine_seq_add(e, prompt, NP, &gp, NULL, NULL, &id), PD_ERR_INVALID);
    gp.top_logprobs = 0;
    gp.repetition_penalty = -1.0f;
    assert_int_equal(engine_seq_add(e, prompt, NP, &gp, NULL, NULL, &id), PD_ERR_INVALID);
    gp.repetition_penalty = 0.0f;
    gp.frequency_penalty = NAN;
    assert_int_equal(engine_seq_add(e, prompt, NP, &gp, NULL, NULL, &id), PD_ERR_INVALID);
    assert_int_equal(engine_active(e), 0);
    engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_penalties_match_reference),
        cmocka_unit_test(test_stop_ids_min_tokens),
        cmocka_unit_test(test_prefill_samples_and_copy),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
