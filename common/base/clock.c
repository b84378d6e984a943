#include "clock.h"

#include <time.h>

int64_t pd_clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double pd_clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int64_t pd_clock_now_ms(const pd_clock_t *c)
{
    return c && c->now_ms ? c->now_ms(c->arg) : pd_clock_ms();
}
