/* Tests common/kv/kv_digest.c: the page digest's definition (a known answer that the CUDA kernel
 * and any other implementation must reproduce), its sensitivity to every kind of change the
 * KV-done check exists for, and chaining by chunks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv_digest.h"

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
}

/* The definition written out word by word, independent of kv_digest_page's loop. */
static uint64_t digest_by_definition(const uint8_t *p, size_t bytes)
{
    uint64_t sum = 0;
    for (size_t j = 0; j * 8 < bytes; j++) {
        uint64_t w = 0;
        for (size_t b = 0; b < 8 && j * 8 + b < bytes; b++)
            w |= (uint64_t)p[j * 8 + b] << (8 * b);
        sum += kv_digest_term(w, j);
    }
    return kv_digest_final(sum, bytes);
}

static void test_known_answer(void **s)
{
    (void)s;
    uint8_t page[64];
    for (int i = 0; i < 64; i++)
        page[i] = (uint8_t)i;
    /* pinned: changing the definition breaks every node of an older version (and the GPU
     * kernel, which tests/gpu/kernels.c checks against this function) */
    assert_true(kv_digest_page(page, 64) == digest_by_definition(page, 64));
    assert_true(kv_digest_page(page, 64) == 0x3672d5274e0fea84ull);
    assert_true(kv_digest_page(page, 0) == kv_digest_final(0, 0));
}

static void test_matches_definition(void **s)
{
    (void)s;
    size_t sizes[] = {1, 7, 8, 9, 63, 64, 65, 4096 + 3, 135232};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        uint8_t *p = malloc(sizes[k]);
        assert_non_null(p);
        fill(p, sizes[k], (uint32_t)k);
        assert_true(kv_digest_page(p, sizes[k]) == digest_by_definition(p, sizes[k]));
        free(p);
    }
}

/* every single-bit flip, a swap of two words, a zeroed tail, a length change: all detected */
static void test_sensitivity(void **s)
{
    (void)s;
    enum { N = 1024 };
    uint8_t *p = malloc(N), *q = malloc(N);
    assert_non_null(p);
    assert_non_null(q);
    fill(p, N, 7);
    const uint64_t d = kv_digest_page(p, N);
    for (int bit = 0; bit < N * 8; bit++) {
        memcpy(q, p, N);
        q[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_true(kv_digest_page(q, N) != d);
    }
    memcpy(q, p, N);
    uint8_t t[8];
    memcpy(t, q + 16, 8);
    memcpy(q + 16, q + 800, 8);
    memcpy(q + 800, t, 8);
    assert_true(kv_digest_page(q, N) != d);
    memcpy(q, p, N);
    memset(q + N / 2, 0, N / 2);
    assert_true(kv_digest_page(q, N) != d);
    assert_true(kv_digest_page(p, N - 8) != d);
    /* a page of zeros and one of ones differ from each other and from the random page */
    memset(q, 0, N);
    uint64_t z = kv_digest_page(q, N);
    memset(q, 0xff, N);
    assert_true(kv_digest_page(q, N) != z);
    assert_true(z != d);
    free(p);
    free(q);
}

/* the chain over pages equals the chain over their digests, chunk boundaries do not matter, and
 * the order of pages does */
static void test_chain(void **s)
{
    (void)s;
    enum { PB = 320, NP = 9 };
    uint8_t *pool = malloc(PB * 16);
    assert_non_null(pool);
    fill(pool, PB * 16, 3);
    int32_t pages[NP] = {3, 0, 15, 7, 8, 2, 11, 4, 9};
    uint64_t dg[NP];
    for (int i = 0; i < NP; i++)
        dg[i] = kv_digest_page(pool + (size_t)pages[i] * PB, PB);
    const uint64_t all = kv_digest_pages(42, pool, pages, NP, PB, PB);
    assert_true(all == kv_digest_chain(42, dg, NP));
    uint64_t h = kv_digest_chain(42, dg, 4);
    h = kv_digest_chain(h, dg + 4, 1);
    h = kv_digest_chain(h, dg + 5, NP - 5);
    assert_true(h == all);
    uint64_t sw = dg[1];
    dg[1] = dg[2];
    dg[2] = sw;
    assert_true(kv_digest_chain(42, dg, NP) != all);
    assert_true(kv_digest_chain(43, dg, 0) == 43);
    /* packed pages (pages NULL) */
    uint8_t *packed = malloc(PB * NP);
    assert_non_null(packed);
    for (int i = 0; i < NP; i++)
        memcpy(packed + (size_t)i * PB, pool + (size_t)pages[i] * PB, PB);
    assert_true(kv_digest_pages(42, packed, NULL, NP, PB, PB) == all);
    /* regions narrower than their stride (a tensor-parallel slice of each page) */
    h = 42;
    for (int i = 0; i < NP; i++) {
        uint64_t d = kv_digest_page(pool + (size_t)pages[i] * PB + 96, 64);
        h = kv_digest_chain(h, &d, 1);
    }
    assert_true(kv_digest_pages(42, pool + 96, pages, NP, PB, 64) == h);
    assert_true(h != all);
    free(packed);
    free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answer),
        cmocka_unit_test(test_matches_definition),
        cmocka_unit_test(test_sensitivity),
        cmocka_unit_test(test_chain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
