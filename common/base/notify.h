/* notify: telling a service manager how the process is doing, through libsystemd's sd_notify
 * (the NOTIFY_SOCKET protocol; a no-op when the process was not started by systemd with
 * Type=notify, i.e. NOTIFY_SOCKET is unset):
 *   READY=1     once, when the process serves (a node: its health says SERVING; the router: its
 *               listeners are up), with STATUS= text;
 *   STOPPING=1  when it starts to drain (SIGTERM, common/base/drain);
 *   WATCHDOG=1  every half WatchdogSec from a libuv timer (pd_watchdog_*), so a loop that hangs
 *               stops the pings and systemd restarts the process.
 * The functions may be called from any thread (sd_notify opens a socket per call).
 */
#ifndef PD_NOTIFY_H
#define PD_NOTIFY_H

#include <stdint.h>

#include <uv.h>

#include "status.h"

/* READY=1 and STATUS=status the first time; STATUS=status only on later calls. */
void pd_notify_ready(const char *status);

/* STOPPING=1 and STATUS=status. */
void pd_notify_stopping(const char *status);

/* STATUS=status. */
void pd_notify_status(const char *status);

/* The watchdog pinger: WATCHDOG=1 every half of the interval systemd asks for (WATCHDOG_USEC for
 * this pid); nothing when no watchdog is set. init/deinit on the loop thread. */
typedef struct {
    uv_timer_t timer;
    int active;
    uint64_t interval_us; /* systemd's WatchdogSec in microseconds, 0: none */
} pd_watchdog_t;

/* Starts pinging when systemd set a watchdog for this process. PD_OK (also when none is set). */
pd_status_t pd_watchdog_init(pd_watchdog_t *w, uv_loop_t *loop);

/* Stops and closes the timer (run the loop once more to finish the close). */
void pd_watchdog_deinit(pd_watchdog_t *w);

#endif
