/* tests common/base/args.c: the server binaries' one command-line parser. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "args.h"

static pd_status_t parse(bool need_node, pd_args_t *a, ...)
{
    char *argv[32];
    int argc = 0;
    va_list ap;
    va_start(ap, a);
    argv[argc++] = "prog";
    for (char *s; (s = va_arg(ap, char *));)
        argv[argc++] = s;
    va_end(ap);
    argv[argc] = NULL;
    return pd_args_parse(argc, argv, need_node, a);
}

static void test_node_flags(void **state)
{
    (void)state;
    pd_args_t a;
    assert_int_equal(parse(true, &a, "--config", "c.yaml", "--node", "d0", "--set", "kv=fp8",
                           "--set=budget_mib=64", "--log-level", "error", NULL),
                     PD_OK);
    assert_string_equal(a.config, "c.yaml");
    assert_string_equal(a.node, "d0");
    assert_int_equal(a.n_sets, 2);
    assert_string_equal(a.sets[0], "kv=fp8");
    assert_string_equal(a.sets[1], "budget_mib=64");
    assert_true(a.have_log_level);
    /* "error" means errors only (the router's old parser mapped it to info) */
    assert_int_equal(a.log_level, PD_LOG_ERROR);
    assert_null(a.join);
    assert_null(a.join_name);
    assert_false(a.log_json);
    /* joining a router under another name, JSON logs */
    assert_int_equal(parse(true, &a, "--config", "c.yaml", "--node", "prefill", "--join",
                           "10.0.0.1:50050", "--join-name", "prefill-7f9c", "--log-format", "json",
                           NULL),
                     PD_OK);
    assert_string_equal(a.join, "10.0.0.1:50050");
    assert_string_equal(a.join_name, "prefill-7f9c");
    assert_true(a.log_json);
    assert_int_equal(parse(false, &a, "--config", "r.yaml", "--log-format", "text", NULL), PD_OK);
    assert_false(a.log_json);
}

static void test_bad_lines(void **state)
{
    (void)state;
    pd_args_t a;
    memset(&a, 0x5a, sizeof a);
    assert_int_equal(parse(true, &a, "--config", "c.yaml", NULL), PD_ERR_INVALID); /* no --node */
    assert_int_equal(parse(false, &a, "--config", "c.yaml", "--node", "x", NULL), PD_ERR_INVALID);
    assert_int_equal(parse(false, &a, "--config", "c.yaml", "--set", "novalue", NULL),
                     PD_ERR_INVALID);
    assert_int_equal(parse(false, &a, "--config", "c.yaml", "--log-level", "loud", NULL),
                     PD_ERR_INVALID);
    assert_int_equal(parse(false, &a, "--config", "c.yaml", "extra", NULL), PD_ERR_INVALID);
    /* --join / --join-name are the nodes'; --log-format is text or json */
    assert_int_equal(parse(false, &a, "--config", "c.yaml", "--join", "r:1", NULL), PD_ERR_INVALID);
    assert_int_equal(parse(false, &a, "--config", "c.yaml", "--join-name", "x", NULL),
                     PD_ERR_INVALID);
    assert_int_equal(parse(false, &a, "--config", "c.yaml", "--log-format", "xml", NULL),
                     PD_ERR_INVALID);
    assert_int_equal(parse(false, &a, "--bogus", NULL), PD_ERR_INVALID);
    assert_int_equal(parse(false, &a, "--config", NULL), PD_ERR_INVALID);
    /* failures leave the output untouched */
    assert_int_equal(a.n_sets, 0x5a5a5a5a);
    assert_int_equal(parse(false, &a, "--config", "r.yaml", NULL), PD_OK);
    assert_null(a.node);
    assert_false(a.have_log_level);
}

static void test_split_set(void **state)
{
    (void)state;
    char key[8];
    const char *v;
    assert_int_equal(pd_args_split_set("a.b=c=d", key, sizeof key, &v), PD_OK);
    assert_string_equal(key, "a.b");
    assert_string_equal(v, "c=d");
    assert_int_equal(pd_args_split_set("=x", key, sizeof key, &v), PD_ERR_INVALID);
    assert_int_equal(pd_args_split_set("muchtoolongkey=1", key, sizeof key, &v), PD_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_flags),
        cmocka_unit_test(test_bad_lines),
        cmocka_unit_test(test_split_set),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
