/* kv_digest: see kv_digest.h. */
#include "kv_digest.h"

#include <string.h>
#include <xxhash.h>

uint64_t kv_digest_page(const void *page, size_t bytes)
{
    const uint8_t *p = page;
    const size_t m = bytes / 8;
    uint64_t sum = 0;
    for (size_t j = 0; j < m; j++) { /* vectorizes (AVX2 where the build has it) */
        uint64_t w;
        memcpy(&w, p + 8 * j, 8);
        sum += kv_digest_term(w, j);
    }
    if (bytes % 8) {
        uint64_t w = 0;
        memcpy(&w, p + 8 * m, bytes % 8);
        sum += kv_digest_term(w, m);
    }
    return kv_digest_final(sum, bytes);
}

uint64_t kv_digest_chain(uint64_t seed, const uint64_t *digests, int n)
{
    uint64_t h = seed;
    for (int i = 0; i < n; i++)
        h = XXH3_64bits_withSeed(&digests[i], sizeof digests[i], h);
    return h;
}

uint64_t kv_digest_pages(uint64_t seed, const uint8_t *base, const int32_t *pages, int n,
                         size_t stride, size_t bytes)
{
    uint64_t h = seed;
    for (int i = 0; i < n; i++) {
        uint64_t d = kv_digest_page(base + (size_t)(pages ? pages[i] : i) * stride, bytes);
        h = kv_digest_chain(h, &d, 1);
    }
    return h;
}
