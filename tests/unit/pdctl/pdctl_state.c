/* Tests deploy/pdctl_state.c (state file path, write/read round trip, malformed files, remove)
 * and the small modules it sits on: deploy/pdctl_host.c (local-host detection, HOST:PORT parsing)
 * and deploy/pdctl_proc.c (spawn into a log, liveness with start time, stop with SIGTERM then
 * SIGKILL, log tail). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pdctl_host.h"
#include "pdctl_proc.h"
#include "pdctl_state.h"

static char dir[256];

static int setup(void **s)
{
    (void)s;
    snprintf(dir, sizeof dir, "/tmp/pd-state-test-XXXXXX");
    assert_non_null(mkdtemp(dir));
    setenv("PDSERVE_STATE_DIR", dir, 1);
    return 0;
}

static int teardown(void **s)
{
    char cmd[300];
    (void)s;
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static void test_path(void **s)
{
    char a[512], b[512], c[512], small[16];
    (void)s;
    assert_int_equal(pdctl_state_path("/x/deploy/local.yaml", ".state", a, sizeof a), PD_OK);
    assert_int_equal(pdctl_state_path("/y/deploy/local.yaml", ".state", b, sizeof b), PD_OK);
    assert_int_equal(pdctl_state_path("/x/deploy/local.yaml", ".logs", c, sizeof c), PD_OK);
    assert_int_equal(strncmp(a, dir, strlen(dir)), 0);
    assert_non_null(strstr(a, "/pdserve-local-"));
    assert_string_not_equal(a, b); /* same base name, different directory */
    assert_int_equal(strlen(a) - strlen(".state"), strlen(c) - strlen(".logs"));
    assert_int_equal(strncmp(a, c, strlen(c) - strlen(".logs")), 0);
    strcpy(small, "untouched");
    assert_int_equal(pdctl_state_path("/x/local.yaml", ".state", small, sizeof small),
                     PD_ERR_TOO_LONG);
    assert_string_equal(small, "untouched");
    unsetenv("PDSERVE_STATE_DIR");
    setenv("XDG_RUNTIME_DIR", "/run/user/77", 1);
    assert_int_equal(pdctl_state_path("/x/local.yaml", ".state", a, sizeof a), PD_OK);
    assert_int_equal(strncmp(a, "/run/user/77/pdserve-local-", 27), 0);
    unsetenv("XDG_RUNTIME_DIR");
    assert_int_equal(pdctl_state_path("/x/local.yaml", ".state", a, sizeof a), PD_OK);
    assert_int_equal(strncmp(a, "/tmp/pdserve-local-", 19), 0);
    setenv("PDSERVE_STATE_DIR", dir, 1);
}

static void test_roundtrip(void **s)
{
    char path[512];
    pdctl_state_t st, rd;
    pdctl_proc_t p = {0};
    (void)s;
    assert_int_equal(pdctl_state_path("/c/with space.yaml", ".state", path, sizeof path), PD_OK);
    pdctl_state_init(&st);
    pdctl_state_init(&rd);
    assert_int_equal(pdctl_state_read(path, &rd), PD_ERR_NOT_FOUND);
    snprintf(st.config, sizeof st.config, "/c/with space.yaml");
    st.owner_pid = 4242;
    for (int i = 0; i < 3; i++) {
        snprintf(p.name, sizeof p.name, "node%d", i);
        snprintf(p.role, sizeof p.role, "%s", i == 2 ? "router" : "decode");
        snprintf(p.addr, sizeof p.addr, "[::1]:%d", 5000 + i);
        p.pid = 100 + i;
        p.start_time = 123456789012ull + (unsigned)i;
        snprintf(p.log, sizeof p.log, "/logs/a b/node%d.log", i);
        assert_int_equal(pdctl_state_add(&st, &p), PD_OK);
    }
    assert_int_equal(pdctl_state_write(path, &st), PD_OK);
    assert_int_equal(pdctl_state_read(path, &rd), PD_OK);
    assert_string_equal(rd.config, st.config);
    assert_int_equal(rd.owner_pid, 4242);
    assert_int_equal(rd.n_procs, 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(rd.procs[i].name, st.procs[i].name);
        assert_string_equal(rd.procs[i].role, st.procs[i].role);
        assert_string_equal(rd.procs[i].addr, st.procs[i].addr);
        assert_string_equal(rd.procs[i].log, st.procs[i].log);
        assert_int_equal(rd.procs[i].pid, st.procs[i].pid);
        assert_true(rd.procs[i].start_time == st.procs[i].start_time);
    }
    /* reading again replaces, never appends */
    assert_int_equal(pdctl_state_read(path, &rd), PD_OK);
    assert_int_equal(rd.n_procs, 3);
    assert_int_equal(pdctl_state_remove(path), PD_OK);
    assert_int_equal(pdctl_state_remove(path), PD_ERR_NOT_FOUND);
    assert_int_equal(pdctl_state_read(path, &rd), PD_ERR_NOT_FOUND);
    assert_int_equal(rd.n_procs, 0);
    pdctl_state_deinit(&st);
    pdctl_state_deinit(&rd);
    pdctl_state_deinit(NULL);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_malformed(void **s)
{
    static const char *bad[] = {
        "",
        "not a state file\nconfig\t/x\n",
        "pdserve-state 1\n",                                       /* no config */
        "pdserve-state 1\nconfig\t/x\nproc\ta\tb\tc\t12\n",        /* too few fields */
        "pdserve-state 1\nconfig\t/x\nproc\ta\tb\tc\t-3\t1\t/l\n", /* bad pid */
        "pdserve-state 1\nconfig\t/x\nproc\ta\tb\tc\t3\tx\t/l\n",  /* bad start time */
        "pdserve-state 1\nconfig\t/x\nowner\tme\n",                /* bad owner */
        "pdserve-state 1\nconfig\t/x\nsurprise\n",                 /* unknown line */
    };
    char path[512];
    pdctl_state_t st;
    pdctl_proc_t p = {.pid = 1};
    (void)s;
    snprintf(path, sizeof path, "%s/bad.state", dir);
    pdctl_state_init(&st);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(pdctl_state_add(&st, &p), PD_OK); /* read must drop it */
        write_file(path, bad[i]);
        assert_int_equal(pdctl_state_read(path, &st), PD_ERR_FORMAT);
        assert_int_equal(st.n_procs, 0);
        assert_null(st.procs);
    }
    pdctl_state_deinit(&st);
}

static void test_host(void **s)
{
    char host[64], name[256];
    int port = 0;
    (void)s;
    assert_true(pdctl_host_is_local("127.0.0.1"));
    assert_true(pdctl_host_is_local("127.1.2.3"));
    assert_true(pdctl_host_is_local("localhost"));
    assert_true(pdctl_host_is_local("LOCALHOST"));
    assert_true(pdctl_host_is_local("::1"));
    assert_true(pdctl_host_is_local("0.0.0.0"));
    assert_true(pdctl_host_is_local("::"));
    assert_int_equal(gethostname(name, sizeof name), 0);
    assert_true(pdctl_host_is_local(name));
    assert_false(pdctl_host_is_local("192.0.2.1")); /* TEST-NET-1, never an interface */
    assert_false(pdctl_host_is_local("2001:db8::1"));
    assert_false(pdctl_host_is_local("no-such-host.invalid"));

    assert_int_equal(pdctl_host_parse_addr("127.0.0.1:50050", host, sizeof host, &port), PD_OK);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 50050);
    assert_int_equal(pdctl_host_parse_addr("[::1]:7", host, sizeof host, &port), PD_OK);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 7);
    port = -5;
    static const char *bad[] = {"host", "host:",  ":80",     "h:0",  "h:65536",
                                "h:8x", "::1:80", "[::1]80", "[::1]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(pdctl_host_parse_addr(bad[i], host, sizeof host, &port), PD_ERR_INVALID);
    assert_int_equal(port, -5);
    assert_string_equal(pdctl_host_connect_name("0.0.0.0"), "127.0.0.1");
    assert_string_equal(pdctl_host_connect_name("::"), "::1");
    assert_string_equal(pdctl_host_connect_name("10.0.0.2"), "10.0.0.2");
    pdctl_host_format_addr(host, sizeof host, "::1", 9);
    assert_string_equal(host, "[::1]:9");
}

/* Waits (up to 10 s) until the file at path contains text: the event, not a fixed sleep. */
static int wait_for_text(const char *path, const char *text)
{
    for (int i = 0; i < 1000; i++) {
        char buf[4096];
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = 0;
        if (strstr(buf, text))
            return 1;
        usleep(10 * 1000);
    }
    return 0;
}

static void test_proc(void **s)
{
    pdctl_proc_t p[2];
    char *sleep_argv[] = {(char *)"/bin/sh", (char *)"-c",
                          (char *)"echo line1; echo line2; exec sleep 30", NULL};
    /* ignores SIGTERM: needs SIGKILL */
    char *stubborn_argv[] = {(char *)"/bin/sh", (char *)"-c",
                             (char *)"trap '' TERM; echo ready; while :; do sleep 1; done", NULL};
    char *missing_argv[] = {(char *)"/nonexistent/binary", NULL};
    int killed = -1, ws;
    char bin[4096], how[96];
    FILE *tail;
    char buf[512];
    size_t n;
    (void)s;

    memset(p, 0, sizeof p);
    for (int i = 0; i < 2; i++) {
        snprintf(p[i].name, sizeof p[i].name, "p%d", i);
        snprintf(p[i].log, sizeof p[i].log, "%s/p%d.log", dir, i);
    }
    assert_int_equal(pdctl_proc_spawn(missing_argv, 1, &p[0]), PD_ERR_IO);
    assert_int_equal(p[0].pid, 0);
    assert_int_equal(pdctl_proc_spawn(sleep_argv, 1, &p[0]), PD_OK);
    assert_int_equal(pdctl_proc_spawn(stubborn_argv, 1, &p[1]), PD_OK);
    assert_true(p[0].pid > 0 && p[0].start_time > 0);
    assert_true(pdctl_proc_alive(&p[0], NULL));
    /* a different start time means the pid was reused: not ours */
    pdctl_proc_t reused = p[0];
    reused.start_time++;
    assert_false(pdctl_proc_alive(&reused, NULL));
    /* the shells have written their lines (the stubborn one after installing its trap) */
    assert_true(wait_for_text(p[0].log, "line2"));
    assert_true(wait_for_text(p[1].log, "ready"));
    assert_int_equal(pdctl_proc_stop(p, 2, 300, &killed), PD_OK);
    assert_int_equal(killed, 1);
    assert_false(pdctl_proc_alive(&p[0], NULL));
    assert_false(pdctl_proc_alive(&p[1], &ws));
    /* stopping dead processes is a no-op */
    assert_int_equal(pdctl_proc_stop(p, 2, 10, &killed), PD_OK);
    assert_int_equal(killed, 0);

    tail = tmpfile();
    assert_non_null(tail);
    pdctl_proc_log_tail(p[0].log, 1, tail);
    rewind(tail);
    n = fread(buf, 1, sizeof buf - 1, tail);
    buf[n] = 0;
    assert_string_equal(buf, "  | line2\n");
    fclose(tail);

    pdctl_proc_describe_exit(9, how, sizeof how);
    assert_non_null(strstr(how, "killed by signal 9"));
    pdctl_proc_describe_exit(3 << 8, how, sizeof how);
    assert_string_equal(how, "exited with status 3");

    setenv("PDSERVE_BIN_DIR", "/bin", 1);
    assert_int_equal(pdctl_proc_find_binary("x", "sh", bin, sizeof bin), PD_OK);
    assert_string_equal(bin, "/bin/sh");
    unsetenv("PDSERVE_BIN_DIR");
    assert_int_equal(pdctl_proc_find_binary("x", "no-such-pdserve-binary", bin, sizeof bin),
                     PD_ERR_NOT_FOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path),      cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_malformed), cmocka_unit_test(test_host),
        cmocka_unit_test(test_proc),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
