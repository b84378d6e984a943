/* notify: the sd_notify messages (READY=1 once, STATUS, STOPPING=1, WATCHDOG=1 from the loop's
 * timer) as a service manager receives them, on a fake NOTIFY_SOCKET (a unix datagram socket). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "notify.h"

static int sock = -1;
static char path[108];

static int setup(void **state)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    (void)state;
    snprintf(path, sizeof path, "/tmp/pd-notify-test-%d.sock", (int)getpid());
    unlink(path);
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(sock >= 0);
    assert_int_equal(bind(sock, (struct sockaddr *)&a, sizeof a), 0);
    setenv("NOTIFY_SOCKET", path, 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    close(sock);
    unlink(path);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    return 0;
}

/* The next datagram, or "" when none is waiting. */
static const char *next_msg(void)
{
    static char buf[1024];
    ssize_t n = recv(sock, buf, sizeof buf - 1, MSG_DONTWAIT);
    buf[n > 0 ? n : 0] = 0;
    return buf;
}

static void test_ready_status_stopping(void **state)
{
    (void)state;
    assert_string_equal(next_msg(), "");
    pd_notify_ready("serving");
    assert_string_equal(next_msg(), "READY=1\nSTATUS=serving");
    pd_notify_status("not serving");
    assert_string_equal(next_msg(), "STATUS=not serving");
    pd_notify_ready("serving"); /* READY=1 only once per process */
    assert_string_equal(next_msg(), "STATUS=serving");
    pd_notify_stopping("draining");
    assert_string_equal(next_msg(), "STOPPING=1\nSTATUS=draining");
    assert_string_equal(next_msg(), "");
}

static void test_watchdog(void **state)
{
    uv_loop_t loop;
    pd_watchdog_t w;
    int pings = 0;
    (void)state;

    assert_int_equal(uv_loop_init(&loop), 0);
    /* no WatchdogSec: no timer running, nothing sent */
    assert_int_equal(pd_watchdog_init(&w, &loop), PD_OK);
    assert_false(w.active);
    pd_watchdog_deinit(&w);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_string_equal(next_msg(), "");
    /* WatchdogSec=40ms for this pid: WATCHDOG=1 every 20 ms while the loop runs */
    setenv("WATCHDOG_USEC", "40000", 1);
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    assert_int_equal(pd_watchdog_init(&w, &loop), PD_OK);
    assert_true(w.active);
    assert_int_equal(w.interval_us, 40000);
    for (int i = 0; i < 100000 && pings < 3; i++) {
        uv_run(&loop, UV_RUN_ONCE);
        const char *m;
        while (*(m = next_msg())) {
            assert_string_equal(m, "WATCHDOG=1");
            pings++;
        }
    }
    assert_true(pings >= 3);
    pd_watchdog_deinit(&w);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    /* a watchdog meant for another pid is not ours */
    setenv("WATCHDOG_PID", "1", 1);
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(pd_watchdog_init(&w, &loop), PD_OK);
    assert_false(w.active);
    pd_watchdog_deinit(&w);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ready_status_stopping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watchdog, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
