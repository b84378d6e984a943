/* kv_digest: the digest of a KV page's bytes, and the chain of page digests that a KV-done
 * message carries as its checksum.
 *
 * A page's digest is a sum of independently mixed 64-bit words, so it is computed the same way
 * by a GPU kernel (one block per page, any order of addition: the sum wraps modulo 2^64) and by
 * this plain C loop: the bytes never have to leave the GPU to be checked. Word j (little endian;
 * a last partial word is zero-padded) contributes m(w_j ^ (j * K1)), where m is a bijective
 * xorshift-multiply mixer, so a changed word always changes its term and a moved word lands on
 * another index's key; the page's digest is a final avalanche of the sum and the byte count.
 * This detects the transport faults and torn or stray writes the check is for (it is no
 * cryptographic MAC: the cluster token keeps strangers from writing pages).
 *
 * The checksum of pages 0..n-1 is the chain h_{i+1} = XXH3-64(digest_i, seed h_i), h_0 = seed:
 * chaining chunk by chunk gives the same value as chaining all pages at once.
 * Pure functions, any thread. */
#ifndef PD_KV_DIGEST_H
#define PD_KV_DIGEST_H

#include <stddef.h>
#include <stdint.h>

/* The term and final mix are shared with the CUDA kernel (kernels/kv.cu). */
#ifdef __CUDACC__
#define KV_DIGEST_FN static inline __host__ __device__
#else
#define KV_DIGEST_FN static inline
#endif

/* The mixer's constants (kernels/kv.cu uses the same). */
#define KV_DIGEST_K1 0x9E3779B97F4A7C15ull
#define KV_DIGEST_K2 0xBF58476D1CE4E5B9ull
#define KV_DIGEST_K3 0x94D049BB133111EBull

/* One word's term: m(w ^ (j * K1)). */
KV_DIGEST_FN uint64_t kv_digest_term(uint64_t w, uint64_t j)
{
    uint64_t x = w ^ (j * KV_DIGEST_K1);
    x ^= x >> 32;
    x *= KV_DIGEST_K2;
    x ^= x >> 29;
    return x;
}

/* The page digest from the wrapped sum of its terms and its length in bytes. */
KV_DIGEST_FN uint64_t kv_digest_final(uint64_t sum, uint64_t bytes)
{
    uint64_t x = sum ^ (bytes * KV_DIGEST_K3);
    x ^= x >> 31;
    x *= KV_DIGEST_K2;
    x ^= x >> 30;
    x *= KV_DIGEST_K3;
    x ^= x >> 31;
    return x;
}

/* The digest of bytes bytes at page (host memory). */
uint64_t kv_digest_page(const void *page, size_t bytes);

/* The chain over n page digests (host array), starting from seed; see above. */
uint64_t kv_digest_chain(uint64_t seed, const uint64_t *digests, int n);

/* kv_digest_chain over the digests of n regions of `bytes` bytes each (host memory), region i at
 * base + pages[i] * stride or, with pages NULL, at base + i * stride: whole pages (stride = bytes =
 * page_bytes) or one tensor-parallel slice of each page (tp_kv_slice_checksum). */
uint64_t kv_digest_pages(uint64_t seed, const uint8_t *base, const int32_t *pages, int n,
                         size_t stride, size_t bytes);

#endif
