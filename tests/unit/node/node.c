/* Tests common/node/node.c: the KV-done message between nodes (pdserve.v1.KvDone). What one node
 * packs the other unpacks unchanged; anything else a peer could send (empty, truncated at any
 * byte, garbage, the old raw C struct, wrong wire types, oversized, fields out of range) is
 * rejected with PD_ERR_FORMAT without touching the output, and random damage to a valid message
 * is either rejected or yields fields within their documented ranges. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "node.h"

#define TOK                                                                                        \
    {                                                                                              \
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16                                      \
    }
static const node_kv_done_t samples[] = {
    {1, 0, 1, 1, 0, 0, TOK, 0, {0}},
    {42, 1234, 300, 19, 0, 0x0123456789abcdefull, TOK, 0, {0}},
    {UINT64_MAX, INT32_MAX, INT32_MAX, INT32_MAX, 1, UINT64_MAX, TOK, 0, {0}},
    {7, 5, 16, 1, 1, 99, {0}, 0, {0}},
    /* a destination of TP 2 and of TP 16: one checksum per slice */
    {9, 3, 40, 3, 0, 0, TOK, 2, {0x1111222233334444ull, 0x5555666677778888ull}},
    {UINT64_MAX,
     INT32_MAX,
     INT32_MAX,
     INT32_MAX,
     1,
     0,
     TOK,
     NODE_KV_DONE_SLICES_MAX,
     {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, UINT64_MAX}},
};
#define N_SAMPLES (sizeof samples / sizeof samples[0])

static size_t pack(const node_kv_done_t *m, uint8_t *buf)
{
    size_t len = 0;
    assert_int_equal(node_kv_done_pack(m, buf, NODE_KV_DONE_MAX, &len), PD_OK);
    assert_true(len > 0 && len <= NODE_KV_DONE_MAX);
    return len;
}

/* The message must be rejected and the output left as it was. */
static void assert_rejected(const void *buf, size_t len)
{
    node_kv_done_t out, poison;
    memset(&poison, 0xa5, sizeof poison);
    out = poison;
    assert_int_equal(node_kv_done_unpack(buf, len, "test", &out), PD_ERR_FORMAT);
    assert_memory_equal(&out, &poison, sizeof out);
}

static void test_roundtrip(void **s)
{
    (void)s;
    for (size_t i = 0; i < N_SAMPLES; i++) {
        uint8_t buf[NODE_KV_DONE_MAX];
        node_kv_done_t out;
        size_t len = pack(&samples[i], buf);
        memset(&out, 0, sizeof out);
        assert_int_equal(node_kv_done_unpack(buf, len, "test", &out), PD_OK);
        assert_true(out.seq_id == samples[i].seq_id);
        assert_int_equal(out.first_token, samples[i].first_token);
        assert_int_equal(out.n_tokens, samples[i].n_tokens);
        assert_int_equal(out.n_pages, samples[i].n_pages);
        assert_true(out.checksum == samples[i].checksum);
        assert_int_equal(out.aborted, samples[i].aborted);
        assert_memory_equal(out.token, samples[i].token, NODE_TOKEN_BYTES);
        assert_int_equal(out.n_slices, samples[i].n_slices);
        if (out.n_slices)
            assert_memory_equal(out.slice_sums, samples[i].slice_sums,
                                (size_t)out.n_slices * sizeof(uint64_t));
    }
}

static void test_pack_refuses_out_of_range(void **s)
{
    static const node_kv_done_t bad[] = {
        {0, 1, 1, 1, 0, 0, TOK, 0, {0}},                           /* seq_id 0 */
        {1, -1, 1, 1, 0, 0, TOK, 0, {0}},                          /* negative first token */
        {1, 1, 0, 1, 0, 0, TOK, 0, {0}},                           /* no tokens */
        {1, 1, (uint32_t)INT32_MAX + 1, 1, 0, 0, TOK, 0, {0}},     /* tokens past int32 */
        {1, 1, 4, 0, 0, 0, TOK, 0, {0}},                           /* no pages */
        {1, 1, 4, 5, 0, 0, TOK, 0, {0}},                           /* more pages than tokens */
        {1, 1, 4, 1, 0, 0, TOK, 1, {0}},                           /* one slice: tp 1 has none */
        {1, 1, 4, 1, 0, 0, TOK, NODE_KV_DONE_SLICES_MAX + 1, {0}}, /* more than fit */
    };
    uint8_t buf[NODE_KV_DONE_MAX];
    size_t len = 12345;
    (void)s;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(node_kv_done_pack(&bad[i], buf, sizeof buf, &len), PD_ERR_INVALID);
        assert_int_equal(len, 12345);
    }
    assert_int_equal(node_kv_done_pack(&samples[1], buf, 3, &len), PD_ERR_INVALID); /* no room */
    assert_int_equal(len, 12345);
}

/* A message cut short anywhere (the transport delivered part of it) is never taken. */
static void test_every_truncation_rejected(void **s)
{
    (void)s;
    for (size_t i = 0; i < N_SAMPLES; i++) {
        uint8_t buf[NODE_KV_DONE_MAX];
        size_t len = pack(&samples[i], buf);
        for (size_t cut = 0; cut < len; cut++) {
            uint8_t *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any overread */
            assert_non_null(copy);
            memcpy(copy, buf, cut);
            assert_rejected(copy, cut);
            free(copy);
        }
    }
    assert_rejected(NULL, 0);
}

static void test_malformed_rejected(void **s)
{
    /* the raw C struct this message replaced: {seq_id 5, first_token 7, n_tokens 3}, little endian
     */
    static const uint8_t legacy[16] = {5, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 3, 0, 0, 0};
    /* seq_id sent as a length-delimited field */
    static const uint8_t wire_type[] = {0x0a, 0x01, 0x05, 0x10, 0x01, 0x18, 0x01, 0x20, 0x01};
    /* a varint that never ends */
    static const uint8_t endless[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    /* first_token -1 (int32 as a 10-byte varint) */
    static const uint8_t negative[] = {0x08, 0x01, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                       0xff, 0xff, 0xff, 0x01, 0x18, 0x01, 0x20, 0x01};
    /* n_pages 9 > n_tokens 8 */
    static const uint8_t pages[] = {0x08, 0x01, 0x18, 0x08, 0x20, 0x09};
    /* n_tokens 2^31 */
    static const uint8_t tokens[] = {0x08, 0x01, 0x18, 0x80, 0x80, 0x80, 0x80, 0x08, 0x20, 0x01};
    /* a length-delimited unknown field longer than the message */
    static const uint8_t overrun[] = {0x08, 0x01, 0x18, 0x01, 0x20, 0x01, 0x7a, 0x40, 0x00};
    /* one slice checksum (field 8, packed): a TP 1 destination has none, TP d > 1 has d */
    static const uint8_t one_slice[] = {0x08, 0x01, 0x18, 0x01, 0x20, 0x01, 0x42, 0x08, 1,  2, 3, 4,
                                        5,    6,    7,    8,    0x4a, 0x10, 1,    2,    3,  4, 5, 6,
                                        7,    8,    9,    10,   11,   12,   13,   14,   15, 16};
    uint8_t big[NODE_KV_DONE_MAX + 1];
    (void)s;
    assert_rejected(one_slice, sizeof one_slice);
    assert_rejected(legacy, sizeof legacy);
    assert_rejected(wire_type, sizeof wire_type);
    assert_rejected(endless, sizeof endless);
    assert_rejected(negative, sizeof negative);
    assert_rejected(pages, sizeof pages);
    assert_rejected(tokens, sizeof tokens);
    assert_rejected(overrun, sizeof overrun);
    /* too long: a valid message padded with an unknown bytes field up to NODE_KV_DONE_MAX + 1 */
    size_t len = pack(&samples[1], big);
    size_t pad = sizeof big - len - 3;
    assert_true(pad < 16384);
    big[len] = 0x7a; /* field 15, length-delimited */
    big[len + 1] = (uint8_t)(0x80 | (pad & 0x7f));
    big[len + 2] = (uint8_t)(pad >> 7);
    memset(big + len + 3, 0, pad);
    assert_rejected(big, sizeof big);
}

/* A newer sender may add fields: unknown ones are skipped, the known ones still checked. */
static void test_unknown_fields_accepted(void **s)
{
    uint8_t buf[NODE_KV_DONE_MAX];
    node_kv_done_t out;
    size_t len = pack(&samples[1], buf);
    (void)s;
    buf[len++] = 0x78; /* field 15, varint */
    buf[len++] = 0x2a;
    assert_int_equal(node_kv_done_unpack(buf, len, "test", &out), PD_OK);
    assert_true(out.seq_id == samples[1].seq_id && out.n_pages == samples[1].n_pages);
}

/* stderr to /dev/null and back: thousands of rejections are each logged once */
static int quiet_begin(void)
{
    int saved = dup(2), fd = open("/dev/null", O_WRONLY);
    assert_true(saved >= 0 && fd >= 0);
    fflush(stderr);
    dup2(fd, 2);
    close(fd);
    return saved;
}

static void quiet_end(int saved)
{
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
}

/* Random damage to valid messages: rejected, or every field within range. */
static void test_random_damage(void **s)
{
    unsigned seed = (unsigned)time(NULL);
    int accepted = 0, rejected = 0, n_bad = 0;
    node_kv_done_t bad;
    (void)s;
    printf("seed %u\n", seed);
    srand(seed);
    int saved = quiet_begin();
    for (int it = 0; it < 20000; it++) {
        uint8_t buf[NODE_KV_DONE_MAX];
        node_kv_done_t out;
        size_t len = pack(&samples[(size_t)rand() % N_SAMPLES], buf);
        int n_flips = 1 + rand() % 3;
        for (int f = 0; f < n_flips; f++)
            buf[(size_t)rand() % len] ^= (uint8_t)(1 + rand() % 255);
        if (rand() % 4 == 0)
            len = (size_t)rand() % (len + 1);
        if (node_kv_done_unpack(buf, len, "test", &out) != PD_OK) {
            rejected++;
            continue;
        }
        accepted++;
        if (out.seq_id < 1 || out.first_token < 0 || out.n_tokens < 1 || out.n_tokens > INT32_MAX ||
            out.n_pages < 1 || out.n_pages > out.n_tokens) {
            n_bad++;
            bad = out;
        }
    }
    quiet_end(saved);
    if (n_bad)
        printf("accepted out of range: seq %llu first %d tokens %u pages %u\n",
               (unsigned long long)bad.seq_id, bad.first_token, bad.n_tokens, bad.n_pages);
    assert_int_equal(n_bad, 0);
    printf("random damage: %d accepted within range, %d rejected\n", accepted, rejected);
    assert_true(rejected > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_pack_refuses_out_of_range),
        cmocka_unit_test(test_every_truncation_rejected),
        cmocka_unit_test(test_malformed_rejected),
        cmocka_unit_test(test_unknown_fields_accepted),
        cmocka_unit_test(test_random_damage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
