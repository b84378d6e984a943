/* drain: how a server process stops. SIGTERM / SIGINT start a drain: drain(arg) tells the
 * process to take no new work, then the loop is stopped once busy(arg) reports 0 or after
 * drain_ms (no request may run longer); a second signal stops the loop at once. The caller
 * (main) owns the object: init before uv_run, deinit after it returns, both on the loop thread.
 * The messages the tests wait for are "drained: stopping" and "stopping now". Under systemd
 * (notify.h) a signal also sends STOPPING=1, and the object runs the watchdog pinger for the
 * loop it was given (WatchdogSec), since it lives exactly as long as the process serves.
 */
#ifndef PD_DRAIN_H
#define PD_DRAIN_H

#include <stdint.h>

#include <uv.h>

#include "notify.h"
#include "status.h"

typedef struct {
    void (*drain)(void *arg); /* stop taking new work */
    int (*busy)(void *arg);   /* requests still running */
    void *arg;
    int64_t drain_ms, deadline_ms;
    int draining;
    uv_signal_t sigint, sigterm;
    uv_timer_t timer;
    pd_watchdog_t watchdog;
} pd_drain_t;

/* Installs the SIGINT / SIGTERM handlers on loop. drain and busy may be NULL (then a signal stops
 * the loop at once). PD_ERR_IO when libuv refuses (nothing left installed). */
pd_status_t pd_drain_init(pd_drain_t *d, uv_loop_t *loop, int64_t drain_ms,
                          void (*drain)(void *arg), int (*busy)(void *arg), void *arg);

/* Removes the handlers and closes the handles (run the loop once more to finish the close). */
void pd_drain_deinit(pd_drain_t *d);

#endif
