/* Tests the in-process communicator of common/backend/tp_comm.c with one thread per rank (in the
 * ThreadSanitizer pass too: no model): collectives give every rank the same sums and gathers;
 * tp_comm_abort by a rank that never reaches a collective releases the ranks waiting in it with
 * PD_ERR_TP_ABORTED (without it this test hangs and meson's timeout fails it), later calls fail
 * the same way until tp_comm_reset, after which the group sums correctly again. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "tp_comm.h"

#define SIZE 3
#define N 1000

typedef struct {
    tp_comm_t *c;
    int fail;          /* this rank's own op fails before the second collective: it aborts */
    pd_status_t st[3]; /* first reduce, second reduce, a third call after the abort */
    float buf[N];
} rank_t;

static void *rank_main(void *arg)
{
    rank_t *r = arg;
    const int me = tp_comm_rank(r->c);
    for (int i = 0; i < N; i++)
        r->buf[i] = (float)(me + 1) * (float)i;
    r->st[0] = tp_comm_all_reduce_sum(r->c, r->buf, N);
    if (r->fail) {
        r->st[1] = tp_comm_abort(r->c); /* never enters the second collective */
        r->st[2] = PD_OK;
        return NULL;
    }
    r->st[1] = tp_comm_all_reduce_sum(r->c, r->buf, N);
    r->st[2] = tp_comm_barrier(r->c);
    return NULL;
}

static void run(rank_t *ranks, void *(*fn)(void *))
{
    pthread_t th[SIZE];
    for (int r = 0; r < SIZE; r++)
        assert_int_equal(pthread_create(&th[r], NULL, fn, &ranks[r]), 0);
    for (int r = 0; r < SIZE; r++)
        pthread_join(th[r], NULL);
}

static void *rank_again(void *arg)
{
    rank_t *r = arg;
    for (int i = 0; i < N; i++)
        r->buf[i] = 1.0f;
    r->st[0] = tp_comm_all_reduce_sum(r->c, r->buf, N);
    return NULL;
}

static void test_abort_and_reset(void **s)
{
    tp_comm_t *comms[SIZE];
    rank_t ranks[SIZE] = {{0}};
    (void)s;
    assert_int_equal(tp_comm_fake_create(SIZE, comms), PD_OK);
    for (int r = 0; r < SIZE; r++) {
        ranks[r].c = comms[r];
        ranks[r].fail = r == 1;
    }
    run(ranks, rank_main);
    for (int r = 0; r < SIZE; r++) {
        assert_int_equal(ranks[r].st[0], PD_OK);
        /* the first sum, 6 * i, on every rank; the aborted second one wrote nothing */
        for (int i = 0; i < N; i++)
            assert_true(ranks[r].buf[i] == 6.0f * (float)i);
    }
    assert_int_equal(ranks[1].st[1], PD_OK); /* the abort itself */
    for (int r = 0; r < SIZE; r += 2) {
        assert_int_equal(ranks[r].st[1], PD_ERR_TP_ABORTED); /* released from the wait */
        assert_int_equal(ranks[r].st[2], PD_ERR_TP_ABORTED); /* and every call after */
    }
    assert_int_equal(tp_comm_reset(comms[0]), PD_OK); /* every rank has returned */
    run(ranks, rank_again);
    for (int r = 0; r < SIZE; r++) {
        assert_int_equal(ranks[r].st[0], PD_OK);
        for (int i = 0; i < N; i++)
            assert_true(ranks[r].buf[i] == (float)SIZE);
    }
    for (int r = 0; r < SIZE; r++)
        tp_comm_destroy(comms[r]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abort_and_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
