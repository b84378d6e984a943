/* Tests common/loop.c: items posted from several threads all run on the loop thread, in per-thread
 * order, and the loop closes cleanly after loop_post_destroy. */
#include <stdint.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "loop.h"

enum { THREADS = 4, PER_THREAD = 2000 };

static loop_post_t *post;
static pthread_t loop_thread;
static int last_seen[THREADS];
static int ran, wrong_thread, out_of_order;

static void item(void *arg)
{
    intptr_t v = (intptr_t)arg;
    int t = (int)(v / PER_THREAD), i = (int)(v % PER_THREAD);

    if (!pthread_equal(pthread_self(), loop_thread))
        wrong_thread++;
    if (i != last_seen[t] + 1)
        out_of_order++;
    last_seen[t] = i;
    ran++;
}

static void *producer(void *arg)
{
    intptr_t t = (intptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++)
        assert_int_equal(loop_post(post, item, (void *)(t * PER_THREAD + i)), PD_OK);
    return NULL;
}

static void test_post(void **state)
{
    uv_loop_t loop;
    pthread_t th[THREADS];
    (void)state;

    for (int t = 0; t < THREADS; t++)
        last_seen[t] = -1;
    loop_thread = pthread_self();
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(loop_post_create(&loop, &post), PD_OK);
    for (intptr_t t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, producer, (void *)t);
    while (ran < THREADS * PER_THREAD)
        uv_run(&loop, UV_RUN_ONCE);
    for (int t = 0; t < THREADS; t++) /* posting threads stop before the destroy */
        pthread_join(th[t], NULL);
    loop_post_destroy(post);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(ran, THREADS * PER_THREAD);
    assert_int_equal(wrong_thread, 0);
    assert_int_equal(out_of_order, 0);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* Items queued when the loop stopped are run by the destroy, not dropped: a producer's message
 * (and the memory it hands over) is never lost (the decode node leaked its last token events). */
static void test_destroy_runs_queued(void **state)
{
    uv_loop_t loop;
    loop_post_t *p;
    (void)state;

    ran = 0;
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(loop_post_create(&loop, &p), PD_OK);
    loop_post(p, item, (void *)0);
    loop_post_destroy(p);
    assert_int_equal(ran, 1);
    loop_post_destroy(NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(ran, 1);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_post),
        cmocka_unit_test(test_destroy_runs_queued),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
