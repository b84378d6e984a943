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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seed),
        cmocka_unit_test(test_top_k_top_p),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
