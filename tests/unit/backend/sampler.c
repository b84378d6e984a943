/* Tests common/sampler.c: greedy, same seed -> same tokens, top-k / top-p restrict the support,
 * temperature sharpens, bad parameters are refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "sampler.h"

#define V 50

static void make_logits(float *l)
{
    for (int i = 0; i < V; i++)
        l[i] = (float)((i * 37) % V) / 10.0f; /* distinct values; argmax at i with i*37%V == 49 */
}

static void test_greedy(void **s)
{
    float l[V];
    sampler_t sm;
    sampler_params_t p = {0.0f, 0, 1.0f, 1};
    (void)s;
    make_logits(l);
    assert_int_equal(sampler_init(&sm, &p, V), PD_OK);
    int32_t g = sampler_sample(&sm, l);
    assert_int_equal(g, sampler_argmax(l, V));
    assert_true(l[g] == 4.9f);
    sampler_deinit(&sm);
}

static void test_seed(void **s)
{
    float l[V];
    sampler_t a, b, c;
    sampler_params_t p = {1.0f, 0, 1.0f, 7}, q = {1.0f, 0, 1.0f, 8};
    int same = 1, diff = 0;
    (void)s;
    make_logits(l);
    sampler_init(&a, &p, V);
    sampler_init(&b, &p, V);
    sampler_init(&c, &q, V);
    for (int i = 0; i < 200; i++) {
        int32_t x = sampler_sample(&a, l), y = sampler_sample(&b, l), z = sampler_sample(&c, l);
        same &= x == y;
        diff |= x != z;
    }
    assert_true(same);
    assert_true(diff);
    sampler_deinit(&a);
    sampler_deinit(&b);
    sampler_deinit(&c);
}

static void test_top_k_top_p(void **s)
{
    float l[V];
    sampler_t k3, p_small;
    sampler_params_t pk = {1.0f, 3, 1.0f, 3}, pp = {1.0f, 0, 0.05f, 3};
    int seen[V] = {0};
    (void)s;
    make_logits(l);
    sampler_init(&k3, &pk, V);
    sampler_init(&p_small, &pp, V);
    for (int i = 0; i < 2000; i++)
        seen[sampler_sample(&k3, l)]++;
    int distinct = 0;
    for (int i = 0; i < V; i++) {
        if (seen[i]) {
            distinct++;
            assert_true(l[i] >= 4.7f); /* only the three largest */
        }
    }
    assert_int_equal(distinct, 3);
    /* the top token alone holds more than 5% of the mass: top_p 0.05 is greedy */
    for (int i = 0; i < 100; i++)
        assert_int_equal(sampler_sample(&p_small, l), sampler_argmax(l, V));
    sampler_deinit(&k3);
    sampler_deinit(&p_small);
}

static void test_bad_params(void **s)
{
    sampler_t sm;
    sampler_params_t a = {-1.0f, 0, 1.0f, 0}, b = {1.0f, -2, 1.0f, 0}, c = {1.0f, 0, 1.5f, 0},
                     d = {NAN, 0, 1.0f, 0};
    (void)s;
    assert_int_equal(sampler_init(&sm, &a, V), PD_ERR_INVALID);
    assert_int_equal(sampler_init(&sm, &b, V), PD_ERR_INVALID);
    assert_int_equal(sampler_init(&sm, &c, V), PD_ERR_INVALID);
    assert_int_equal(sampler_init(&sm, &d, V), PD_ERR_INVALID);
}

/* The logits-processing reference by hand: each rule on its own logit, and their order. */
static void test_logits_process(void **st)
{
    /* two rows of 6 */
    float l[12] = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f, -1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    const int32_t ent[] = {
        0, 0, 0, SAMPLER_ENT_IN_PROMPT, /* repetition 2 on a positive logit: 2 / 2 = 1 */
        0, 1, 1, 0,                     /* generated once, negative: -2 * 2 - 0.5 - 0.25 */
        0, 2, 3, 0,                     /* generated 3 times: 1 / 2 - 1.5 - 0.25 = -1.25 */
        0, 4, 0, SAMPLER_ENT_MASKED,    /* min_tokens: -inf */
        1, 3, 0, 0,                     /* bias only, no penalties in row 1 */
        1, 5, 2, SAMPLER_ENT_IN_PROMPT, /* row 1: frequency 0: no change but the bias */
    };
    const float bias[] = {0.0f, 0.0f, 0.0f, 0.0f, 5.0f, -1.0f};
    const float pen[] = {0.25f, 0.5f, 2.0f, 0.0f, 0.0f, 1.0f};
    (void)st;
    sampler_logits_process_ref(l, 2, 6, ent, bias, 6, pen);
    assert_true(l[0] == 1.0f);
    assert_true(l[1] == -4.75f);
    assert_true(l[2] == -1.25f);
    assert_true(l[3] == 0.5f); /* no entry: unchanged */
    assert_true(isinf(l[4]) && l[4] < 0);
    assert_true(l[5] == -1.0f);
    assert_true(l[9] == 6.0f);
    assert_true(l[11] == 0.0f);
    assert_true(l[6] == 1.0f);
}

/* logprobs: the chosen token's log-softmax, the top alternatives sorted (ties: lower id). */
static void test_logprobs(void **st)
{
    float l[8] = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f, 0.0f, -7.0f, 1.0f};
    sampler_logprobs_t lp;
    double sum = 0.0;
    (void)st;
    for (int i = 0; i < 8; i++)
        sum += exp((double)l[i]);
    sampler_logprobs(l, 8, 4, 3, &lp);
    assert_int_equal(lp.token, 4);
    assert_true(fabs(lp.logprob - (2.0 - log(sum))) < 1e-5);
    assert_int_equal(lp.n_top, 3);
    assert_int_equal(lp.top_ids[0], 1);
    assert_int_equal(lp.top_ids[1], 3);
    assert_int_equal(lp.top_ids[2], 4);
    assert_true(fabs(lp.top_logprobs[0] - (3.0 - log(sum))) < 1e-5);
    assert_true(lp.top_logprobs[2] == lp.logprob);
    sampler_logprobs(l, 8, 6, 50, &lp); /* clamped to the vocabulary */
    assert_int_equal(lp.n_top, 8);
    assert_int_equal(lp.top_ids[7], 6);
    for (int i = 1; i < 8; i++)
        assert_true(lp.top_logprobs[i] <= lp.top_logprobs[i - 1]);
    sampler_logprobs(l, 8, 0, 0, &lp);
    assert_int_equal(lp.n_top, 0);
}

static void test_seed_for(void **st)
{
    (void)st;
    assert_true(sampler_seed_for(42, 0) == 42);
    assert_true(sampler_seed_for(42, 1) != 42);
    assert_true(sampler_seed_for(42, 1) != sampler_seed_for(42, 2));
    assert_true(sampler_seed_for(42, 1) != sampler_seed_for(43, 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),         cmocka_unit_test(test_seed),
        cmocka_unit_test(test_top_k_top_p),    cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_logits_process), cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_seed_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
