/* clock: the tree's one monotonic clock. Any thread may call it. */
#ifndef PD_CLOCK_H
#define PD_CLOCK_H

#include <stdint.h>

/* Milliseconds of CLOCK_MONOTONIC (not wall time: only differences mean anything). */
int64_t pd_clock_ms(void);

/* A clock a test can replace (a fake clock it advances by hand). now_ms NULL: pd_clock_ms. The
 * function may be called from any thread; it must be monotonic. */
typedef struct {
    int64_t (*now_ms)(void *arg);
    void *arg;
} pd_clock_t;

/* Milliseconds of c (pd_clock_ms when c or c->now_ms is NULL). */
int64_t pd_clock_now_ms(const pd_clock_t *c);

/* Seconds of CLOCK_MONOTONIC as a double, for benchmarks and progress lines. */
double pd_clock_s(void);

#endif
