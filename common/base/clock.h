/* clock: the tree's one monotonic clock. Any thread may call it. */
#ifndef PD_CLOCK_H
#define PD_CLOCK_H

#include <stdint.h>

/* Milliseconds of CLOCK_MONOTONIC (not wall time: only differences mean anything). */
int64_t pd_clock_ms(void);

/* Seconds of CLOCK_MONOTONIC as a double, for benchmarks and progress lines. */
double pd_clock_s(void);

#endif
