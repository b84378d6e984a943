#include "notify.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <systemd/sd-daemon.h>

#include "log.h"

static atomic_int notify__ready_sent;

static void notify__send(const char *what, const char *status)
{
    char msg[512];
    int rc;

    snprintf(msg, sizeof msg, "%s%sSTATUS=%s", what, what[0] ? "\n" : "", status ? status : "");
    rc = sd_notify(0, msg);
    if (rc < 0)
        pd_log_warn("sd_notify %s: %s", what[0] ? what : "STATUS", strerror(-rc));
}

void pd_notify_ready(const char *status)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&notify__ready_sent, &expected, 1))
        notify__send("READY=1", status);
    else
        notify__send("", status);
}

void pd_notify_stopping(const char *status)
{
    notify__send("STOPPING=1", status);
}

void pd_notify_status(const char *status)
{
    notify__send("", status);
}

static void notify__ping(uv_timer_t *t)
{
    (void)t;
    (void)sd_notify(0, "WATCHDOG=1");
}

pd_status_t pd_watchdog_init(pd_watchdog_t *w, uv_loop_t *loop)
{
    uint64_t usec = 0;

    memset(w, 0, sizeof *w);
    uv_timer_init(loop, &w->timer);
    w->timer.data = w;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        uint64_t every_ms = usec / 2000 ? usec / 2000 : 1;
        w->interval_us = usec;
        w->active = 1;
        uv_timer_start(&w->timer, notify__ping, 0, every_ms);
        pd_log_info("systemd watchdog: %llu ms, pinging every %llu ms",
                    (unsigned long long)(usec / 1000), (unsigned long long)every_ms);
    }
    return PD_OK;
}

void pd_watchdog_deinit(pd_watchdog_t *w)
{
    uv_timer_stop(&w->timer);
    w->active = 0;
    uv_close((uv_handle_t *)&w->timer, NULL);
}
