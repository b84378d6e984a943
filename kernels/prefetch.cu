/* prefetch: L2 prefetch of device memory (see prefetch.h). */
#include "kutil.cuh"

extern "C" {
#include "prefetch.h"
}

#define PREFETCH__THREADS 256
#define PREFETCH__MAX_BLOCKS 16

/* the 16-byte aligned span of each region, as offsets past `base` of stripes */
struct prefetch__args {
    uintptr_t lo[PREFETCH_MAX_REGIONS];      /* first aligned byte */
    uint64_t len[PREFETCH_MAX_REGIONS];      /* aligned bytes (a multiple of 16) */
    int64_t first[PREFETCH_MAX_REGIONS + 1]; /* stripe index where region i starts; [n] total */
    int n;
    uint32_t chunk; /* bytes fetched per stripe (a multiple of 16, <= PREFETCH_STRIDE) */
};

/* grid (<= PREFETCH__MAX_BLOCKS), block PREFETCH__THREADS: thread i takes stripes i, i + T, ...
 * over all regions; a stripe fetches its first a.chunk bytes (fewer at a region's end). */
static __global__ void __launch_bounds__(PREFETCH__THREADS) prefetch__l2(prefetch__args a)
{
    const int64_t total = a.first[a.n], step = (int64_t)gridDim.x * blockDim.x;
    int r = 0;
    for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < total; s += step) {
        while (s >= a.first[r + 1])
            r++;
        const uint64_t off = (uint64_t)(s - a.first[r]) * PREFETCH_STRIDE;
        const uint64_t left = a.len[r] - off;
        const uint32_t bytes = left < a.chunk ? (uint32_t)left : a.chunk;
        const uintptr_t p = a.lo[r] + off;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes)
                     : "memory");
#else /* before Hopper: one line at a time */
        for (uint32_t b = 0; b < bytes; b += 128)
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + b));
#endif
    }
}

extern "C" pd_status_t prefetch_l2(const prefetch_regions_t *r, double frac, cudaStream_t stream)
{
    KUTIL_REQUIRE(r && r->n >= 0 && r->n <= PREFETCH_MAX_REGIONS, "prefetch_l2");
    if (!(frac > 0.0) || r->n == 0)
        return PD_OK;
    prefetch__args a = {};
    const double f = frac < 1.0 ? frac : 1.0;
    a.chunk = (uint32_t)((f * PREFETCH_STRIDE + 15.0) / 16.0) * 16u;
    if (a.chunk > PREFETCH_STRIDE)
        a.chunk = PREFETCH_STRIDE;
    int64_t stripes = 0;
    for (int i = 0; i < r->n; i++) {
        const uintptr_t p = (uintptr_t)r->p[i], lo = (p + 15) & ~(uintptr_t)15,
                        hi = (p + r->bytes[i]) & ~(uintptr_t)15;
        if (!r->p[i] || hi <= lo)
            continue;
        a.lo[a.n] = lo;
        a.len[a.n] = hi - lo;
        a.first[a.n] = stripes;
        stripes += (int64_t)((hi - lo + PREFETCH_STRIDE - 1) / PREFETCH_STRIDE);
        a.n++;
    }
    a.first[a.n] = stripes;
    if (stripes == 0)
        return PD_OK;
    int64_t blocks = (stripes + PREFETCH__THREADS - 1) / PREFETCH__THREADS;
    if (blocks > PREFETCH__MAX_BLOCKS)
        blocks = PREFETCH__MAX_BLOCKS;
    prefetch__l2<<<(unsigned)blocks, PREFETCH__THREADS, 0, stream>>>(a);
    return KUTIL_LAUNCHED("prefetch_l2");
}
