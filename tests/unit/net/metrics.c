/* Tests common/metrics.c: exact exposition text, label escaping, idempotent registration, type
 * and name checks, and concurrent updates from several threads adding up exactly. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "metrics.h"

static void test_render(void **state)
{
    static const char *const l_ok[] = {"node", "decode0", "code", "200", NULL};
    static const char *const l_bad[] = {"node", "a\"b\\c\nd", NULL};
    static const double bounds[] = {0.005, 0.1, 1, 2.5};
    metrics_t *m = NULL;
    metrics_counter_t *c, *c2, *c3;
    metrics_gauge_t *g;
    metrics_histogram_t *h;
    char *text = NULL;
    size_t len = 0;
    (void)state;

    assert_int_equal(metrics_create(&m), PD_OK);
    assert_int_equal(
        metrics_counter_register(m, "pd_requests_total", "Requests\nhandled \\ all", l_ok, &c),
        PD_OK);
    assert_int_equal(metrics_counter_register(m, "pd_requests_total", "ignored", l_ok, &c2), PD_OK);
    assert_ptr_equal(c, c2);
    assert_int_equal(metrics_counter_register(m, "pd_requests_total", NULL, l_bad, &c3), PD_OK);
    assert_ptr_not_equal(c, c3);
    assert_int_equal(metrics_gauge_register(m, "pd_kv_pages_free", "Free pages", NULL, &g), PD_OK);
    assert_int_equal(metrics_histogram_register(m, "pd_ttft_seconds", "Time to first token", bounds,
                                                4, NULL, &h),
                     PD_OK);

    metrics_counter_inc(c);
    metrics_counter_add(c, 2.5);
    metrics_counter_add(c, -7); /* ignored */
    assert_true(metrics_counter_value(c) == 3.5);
    metrics_gauge_set(g, 100);
    metrics_gauge_add(g, -1);
    assert_true(metrics_gauge_value(g) == 99);
    metrics_histogram_observe(h, 0.001);
    metrics_histogram_observe(h, 0.1); /* le is inclusive */
    metrics_histogram_observe(h, 0.5);
    metrics_histogram_observe(h, 100);

    assert_int_equal(metrics_render(m, &text, &len), PD_OK);
    const char *want = "# HELP pd_requests_total Requests\\nhandled \\\\ all\n"
                       "# TYPE pd_requests_total counter\n"
                       "pd_requests_total{node=\"decode0\",code=\"200\"} 3.5\n"
                       "pd_requests_total{node=\"a\\\"b\\\\c\\nd\"} 0\n"
                       "# HELP pd_kv_pages_free Free pages\n"
                       "# TYPE pd_kv_pages_free gauge\n"
                       "pd_kv_pages_free 99\n"
                       "# HELP pd_ttft_seconds Time to first token\n"
                       "# TYPE pd_ttft_seconds histogram\n"
                       "pd_ttft_seconds_bucket{le=\"0.005\"} 1\n"
                       "pd_ttft_seconds_bucket{le=\"0.1\"} 2\n"
                       "pd_ttft_seconds_bucket{le=\"1\"} 3\n"
                       "pd_ttft_seconds_bucket{le=\"2.5\"} 3\n"
                       "pd_ttft_seconds_bucket{le=\"+Inf\"} 4\n"
                       "pd_ttft_seconds_sum 100.601\n"
                       "pd_ttft_seconds_count 4\n";
    assert_string_equal(text, want);
    assert_int_equal(len, strlen(want));
    free(text);
    metrics_destroy(m);
    metrics_destroy(NULL);
}

static void test_labelled_histogram(void **state)
{
    static const char *const l[] = {"node", "p0", NULL};
    static const double bounds[] = {1, 2};
    metrics_t *m = NULL;
    metrics_histogram_t *h;
    char *text;
    size_t len;
    (void)state;

    assert_int_equal(metrics_create(&m), PD_OK);
    assert_int_equal(metrics_histogram_register(m, "lat", "", bounds, 2, l, &h), PD_OK);
    metrics_histogram_observe(h, 1.5);
    assert_int_equal(metrics_render(m, &text, &len), PD_OK);
    assert_non_null(strstr(text, "lat_bucket{node=\"p0\",le=\"1\"} 0\n"
                                 "lat_bucket{node=\"p0\",le=\"2\"} 1\n"
                                 "lat_bucket{node=\"p0\",le=\"+Inf\"} 1\n"
                                 "lat_sum{node=\"p0\"} 1.5\n"
                                 "lat_count{node=\"p0\"} 1\n"));
    free(text);
    metrics_destroy(m);
}

static void test_invalid(void **state)
{
    static const char *const l_le[] = {"le", "1", NULL};
    static const char *const l_badkey[] = {"no-dash", "1", NULL};
    static const char *const l_odd[] = {"k", NULL};
    static const double bounds[] = {1, 2}, bad_bounds[] = {2, 1}, other[] = {1, 3};
    metrics_t *m = NULL;
    metrics_counter_t *c = (metrics_counter_t *)0x1;
    metrics_gauge_t *g = (metrics_gauge_t *)0x1;
    metrics_histogram_t *h = (metrics_histogram_t *)0x1, *h1;
    (void)state;

    assert_int_equal(metrics_create(&m), PD_OK);
    assert_int_equal(metrics_counter_register(m, "1abc", "", NULL, &c), PD_ERR_INVALID);
    assert_int_equal(metrics_counter_register(m, "a-b", "", NULL, &c), PD_ERR_INVALID);
    assert_int_equal(metrics_counter_register(m, "ok", "", l_badkey, &c), PD_ERR_INVALID);
    assert_int_equal(metrics_counter_register(m, "ok", "", l_odd, &c), PD_ERR_INVALID);
    assert_int_equal(metrics_histogram_register(m, "h", "", bounds, 2, l_le, &h), PD_ERR_INVALID);
    assert_int_equal(metrics_histogram_register(m, "h", "", bad_bounds, 2, NULL, &h),
                     PD_ERR_INVALID);
    assert_ptr_equal(c, (metrics_counter_t *)0x1);
    assert_ptr_equal(h, (metrics_histogram_t *)0x1);
    assert_int_equal(metrics_histogram_register(m, "h", "", bounds, 2, NULL, &h1), PD_OK);
    assert_int_equal(metrics_histogram_register(m, "h", "", other, 2, NULL, &h), PD_ERR_INVALID);
    assert_int_equal(metrics_gauge_register(m, "h", "", NULL, &g), PD_ERR_INVALID);
    assert_ptr_equal(g, (metrics_gauge_t *)0x1);
    metrics_destroy(m);
}

#define N_THREADS 4
#define N_ITERS 20000

struct worker {
    metrics_t *m;
    metrics_counter_t *c;
    metrics_histogram_t *h;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    static const double bounds[] = {10, 100};
    for (int i = 0; i < N_ITERS; i++) {
        metrics_counter_inc(w->c);
        metrics_histogram_observe(w->h, (double)(i % 200));
        if (i % 1000 == 0) { /* lazy registration races with updates */
            metrics_histogram_t *h;
            assert_int_equal(metrics_histogram_register(w->m, "v", "", bounds, 2, NULL, &h), PD_OK);
            assert_ptr_equal(h, w->h);
        }
    }
    return NULL;
}

static void test_threads(void **state)
{
    static const double bounds[] = {10, 100};
    pthread_t t[N_THREADS];
    struct worker w;
    char *text;
    size_t len;
    (void)state;

    assert_int_equal(metrics_create(&w.m), PD_OK);
    assert_int_equal(metrics_counter_register(w.m, "n", "", NULL, &w.c), PD_OK);
    assert_int_equal(metrics_histogram_register(w.m, "v", "", bounds, 2, NULL, &w.h), PD_OK);
    for (int i = 0; i < N_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, work, &w), 0);
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(t[i], NULL);
    assert_true(metrics_counter_value(w.c) == N_THREADS * N_ITERS);
    assert_int_equal(metrics_render(w.m, &text, &len), PD_OK);
    /* per thread: 0..199 repeated 100 times; <=10: 11 values, <=100: 101 values */
    assert_non_null(strstr(text, "v_bucket{le=\"10\"} 4400\n"));
    assert_non_null(strstr(text, "v_bucket{le=\"100\"} 40400\n"));
    assert_non_null(strstr(text, "v_count 80000\n"));
    assert_non_null(strstr(text, "v_sum 7960000\n"));
    free(text);
    metrics_destroy(w.m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_labelled_histogram),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
