/* Tests common/status.c: every status has a distinct name and message, and the mappings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "status.h"

static void test_mappings(void **state)
{
    (void)state;
    assert_int_equal(pd_status_grpc_code(PD_OK), 0);
    assert_int_equal(pd_status_grpc_code(PD_ERR_KV_INTEGRITY), 15);
    assert_int_equal(pd_status_grpc_code(PD_ERR_INVALID), 3);
    assert_int_equal(pd_status_grpc_code(PD_ERR_UNAVAILABLE), 14);
    assert_int_equal(pd_status_http_code(PD_ERR_NOT_FOUND), 404);
    assert_string_equal(pd_status_str(PD_ERR_KV_INTEGRITY), "kv integrity check failed");
    assert_string_equal(pd_status_name(PD_NO_PAGES), "PD_NO_PAGES");
    assert_string_equal(pd_status_str((pd_status_t)-999), "unknown status");
    assert_int_equal(pd_status_grpc_code((pd_status_t)-999), 2);
}

static void test_distinct(void **state)
{
    static const pd_status_t all[] = {
#define X(name, value, msg, grpc, http) name,
        PD_STATUS_LIST(X)
#undef X
    };
    (void)state;
    size_t n = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n; i++) {
        assert_true(PD_IS_ERR(all[i]) == (all[i] < 0));
        for (size_t j = i + 1; j < n; j++) {
            assert_int_not_equal(all[i], all[j]);
            assert_string_not_equal(pd_status_str(all[i]), pd_status_str(all[j]));
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mappings),
        cmocka_unit_test(test_distinct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
