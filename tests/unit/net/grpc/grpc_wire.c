/* Tests common/pd_grpc_wire.c: deframing across arbitrary chunking and every error, grpc-timeout,
 * percent-encoding and the HTTP status mapping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "grpc_wire.h"

/* Feeds data in chunks of `chunk` bytes; collects message lengths and first bytes. */
static pd_status_t feed_all(pd_grpc_wire_deframer_t *d, const uint8_t *data, size_t len, size_t chunk,
                            size_t *lens, uint8_t *firsts, int *n)
{
    *n = 0;
    for (size_t off = 0; off < len;) {
        size_t c = len - off < chunk ? len - off : chunk;
        const uint8_t *p = data + off;
        off += c;
        while (c > 0) {
            size_t used, mlen;
            const uint8_t *msg;
            pd_status_t st = pd_grpc_wire_deframer_feed(d, p, c, &used, &msg, &mlen);
            if (st != PD_OK)
                return st;
            p += used;
            c -= used;
            if (msg) {
                lens[*n] = mlen;
                firsts[*n] = mlen ? msg[0] : 0;
                (*n)++;
            }
        }
    }
    return PD_OK;
}

static size_t put_msg(uint8_t *out, uint8_t flag, uint32_t len, uint8_t fill)
{
    pd_grpc_wire_prefix(out, len);
    out[0] = flag;
    memset(out + 5, fill, len);
    return 5 + len;
}

static void test_deframe_chunking(void **state)
{
    uint8_t buf[5 * 3 + 300 + 0 + 70000];
    size_t len = 0, lens[8];
    uint8_t firsts[8];
    int n;
    (void)state;

    len += put_msg(buf + len, 0, 300, 0xa1);
    len += put_msg(buf + len, 0, 0, 0);
    len += put_msg(buf + len, 0, 70000, 0xb2);
    static const size_t chunks[] = {1, 2, 3, 5, 7, 4096, sizeof buf};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        pd_grpc_wire_deframer_t d;
        pd_grpc_wire_deframer_init(&d, 1 << 20);
        assert_int_equal(feed_all(&d, buf, len, chunks[i], lens, firsts, &n), PD_OK);
        assert_int_equal(n, 3);
        assert_int_equal(lens[0], 300);
        assert_int_equal(firsts[0], 0xa1);
        assert_int_equal(lens[1], 0);
        assert_int_equal(lens[2], 70000);
        assert_int_equal(firsts[2], 0xb2);
        assert_false(pd_grpc_wire_deframer_partial(&d));
        pd_grpc_wire_deframer_deinit(&d);
    }
}

static void test_deframe_errors(void **state)
{
    uint8_t buf[64];
    size_t lens[4];
    uint8_t firsts[4];
    int n;
    pd_grpc_wire_deframer_t d;
    (void)state;

    /* compressed flag */
    put_msg(buf, 1, 3, 0);
    pd_grpc_wire_deframer_init(&d, 100);
    assert_int_equal(feed_all(&d, buf, 8, 1, lens, firsts, &n), PD_ERR_UNSUPPORTED);
    pd_grpc_wire_deframer_deinit(&d);
    /* bad flag */
    put_msg(buf, 0x80, 3, 0);
    pd_grpc_wire_deframer_init(&d, 100);
    assert_int_equal(feed_all(&d, buf, 8, 8, lens, firsts, &n), PD_ERR_PROTOCOL);
    pd_grpc_wire_deframer_deinit(&d);
    /* too long: rejected from the prefix alone */
    pd_grpc_wire_prefix(buf, 101);
    pd_grpc_wire_deframer_init(&d, 100);
    assert_int_equal(feed_all(&d, buf, 5, 5, lens, firsts, &n), PD_ERR_RESOURCE);
    pd_grpc_wire_deframer_deinit(&d);
    /* 4 GiB - 1 declared with a small limit */
    memset(buf, 0xff, 5);
    buf[0] = 0;
    pd_grpc_wire_deframer_init(&d, 4 << 20);
    assert_int_equal(feed_all(&d, buf, 5, 5, lens, firsts, &n), PD_ERR_RESOURCE);
    pd_grpc_wire_deframer_deinit(&d);
    /* truncated: partial prefix and partial payload */
    put_msg(buf, 0, 10, 1);
    for (size_t cut = 1; cut < 15; cut++) {
        pd_grpc_wire_deframer_init(&d, 100);
        assert_int_equal(feed_all(&d, buf, cut, 3, lens, firsts, &n), PD_OK);
        assert_int_equal(n, 0);
        assert_true(pd_grpc_wire_deframer_partial(&d));
        pd_grpc_wire_deframer_deinit(&d);
    }
    pd_grpc_wire_deframer_deinit(NULL);
}

static void test_timeout(void **state)
{
    static const struct {
        const char *s;
        int64_t ms;
    } ok[] = {
        {"1H", 3600000}, {"2M", 120000}, {"3S", 3000}, {"100m", 100}, {"1u", 1},
        {"1000u", 1},    {"1001u", 2},   {"1n", 1},    {"0m", 0},     {"99999999S", 99999999000LL}};
    static const char *bad[] = {"", "m", "1", "1x", "-1m", "123456789m", "1.5S", " 1S"};
    int64_t ms;
    char out[16];
    (void)state;

    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(pd_grpc_wire_timeout_parse(ok[i].s, strlen(ok[i].s), &ms), PD_OK);
        assert_int_equal(ms, ok[i].ms);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(pd_grpc_wire_timeout_parse(bad[i], strlen(bad[i]), &ms), PD_ERR_FORMAT);
    static const int64_t vals[] = {0, 1, 999, 99999999, 100000000, 5000000000000LL};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        pd_grpc_wire_timeout_format(out, sizeof out, vals[i]);
        assert_true(strlen(out) <= 9);
        assert_int_equal(pd_grpc_wire_timeout_parse(out, strlen(out), &ms), PD_OK);
        assert_true(ms <= vals[i] && ms >= vals[i] - vals[i] / 1000 - 60000);
    }
}

static void test_percent(void **state)
{
    const char *s = "a b%c\xc3\xa4\n\x7f~";
    char *e = pd_grpc_wire_pct_encode(s), *d;
    (void)state;

    assert_string_equal(e, "a b%25c%C3%A4%0A%7F~");
    d = pd_grpc_wire_pct_decode(e, strlen(e));
    assert_string_equal(d, s);
    free(e);
    free(d);
    d = pd_grpc_wire_pct_decode("bad %zz %4", 10); /* malformed escapes stay literal */
    assert_string_equal(d, "bad %zz %4");
    free(d);
    assert_int_equal(pd_grpc_wire_http_to_grpc(404), PD_GRPC_UNIMPLEMENTED);
    assert_int_equal(pd_grpc_wire_http_to_grpc(503), PD_GRPC_UNAVAILABLE);
    assert_int_equal(pd_grpc_wire_http_to_grpc(415), PD_GRPC_UNKNOWN);
}

static void test_metadata(void **state)
{
    pd_grpc_wire_md_list_t l = {0};
    (void)state;

    assert_null(pd_grpc_wire_md_get(&l, "x"));
    assert_int_equal(pd_grpc_wire_md_add(&l, "authorization-xyz", 13, "Bearer k", 8), PD_OK);
    assert_int_equal(pd_grpc_wire_md_add(&l, "x-b", 3, "", 0), PD_OK);
    assert_int_equal(pd_grpc_wire_md_add(&l, "authorization", 13, "second", 6), PD_OK);
    assert_int_equal(l.n, 3);
    assert_int_equal(l.bytes, 13 + 8 + 3 + 0 + 13 + 6);
    assert_string_equal(pd_grpc_wire_md_get(&l, "authorization"), "Bearer k"); /* first wins */
    assert_string_equal(pd_grpc_wire_md_get(&l, "x-b"), "");
    assert_null(pd_grpc_wire_md_get(&l, "x-c"));
    pd_grpc_wire_md_deinit(&l);
    assert_int_equal(l.n, 0);
    assert_null(pd_grpc_wire_md_get(&l, "x-b"));
    pd_grpc_wire_md_deinit(&l); /* twice is fine */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deframe_chunking),
        cmocka_unit_test(test_deframe_errors),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_percent),
        cmocka_unit_test(test_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
