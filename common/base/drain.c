#include "drain.h"

#include <signal.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "notify.h"

static void drain__check(uv_timer_t *t)
{
    pd_drain_t *d = t->data;
    int busy = d->busy(d->arg);
    if (busy == 0) {
        pd_log_info("drained: stopping");
        uv_stop(t->loop);
    } else if (pd_clock_ms() >= d->deadline_ms) {
        pd_log_warn("drain: %d requests still running after %lld ms: stopping anyway", busy,
                    (long long)d->drain_ms);
        uv_stop(t->loop);
    }
}

static void drain__signal(uv_signal_t *h, int signum)
{
    pd_drain_t *d = h->data;
    if (d->draining || !d->drain || !d->busy) {
        pd_log_info("signal %d: stopping now", signum);
        pd_notify_stopping("stopping");
        uv_stop(h->loop);
        return;
    }
    d->draining = 1;
    d->deadline_ms = pd_clock_ms() + d->drain_ms;
    pd_notify_stopping("draining");
    pd_log_info("signal %d: draining (at most %lld ms; again to stop now)", signum,
                (long long)d->drain_ms);
    d->drain(d->arg);
    uv_timer_start(&d->timer, drain__check, 0, 50);
}

pd_status_t pd_drain_init(pd_drain_t *d, uv_loop_t *loop, int64_t drain_ms,
                          void (*drain)(void *arg), int (*busy)(void *arg), void *arg)
{
    int rc;
    memset(d, 0, sizeof *d);
    d->drain = drain;
    d->busy = busy;
    d->arg = arg;
    d->drain_ms = drain_ms > 0 ? drain_ms : 30000;
    uv_timer_init(loop, &d->timer);
    (void)pd_watchdog_init(&d->watchdog, loop);
    uv_signal_init(loop, &d->sigint);
    uv_signal_init(loop, &d->sigterm);
    d->timer.data = d->sigint.data = d->sigterm.data = d;
    if ((rc = uv_signal_start(&d->sigint, drain__signal, SIGINT)) < 0 ||
        (rc = uv_signal_start(&d->sigterm, drain__signal, SIGTERM)) < 0) {
        pd_log_error("signal handlers: %s", uv_strerror(rc));
        pd_drain_deinit(d);
        return PD_ERR_IO;
    }
    return PD_OK;
}

void pd_drain_deinit(pd_drain_t *d)
{
    uv_timer_stop(&d->timer);
    pd_watchdog_deinit(&d->watchdog);
    uv_signal_stop(&d->sigint);
    uv_signal_stop(&d->sigterm);
    uv_close((uv_handle_t *)&d->timer, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
}
