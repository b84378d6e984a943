/* sample: GPU token sampling (see sample.h). */
#include <stdlib.h>

#include "kutil.cuh"

extern "C" {
#include "sample.h"
}

#define SAMPLE__THREADS 1024

/* ==== kernels ==== */

/* float -> uint32 with the same order (NaN sorts above +inf; logits have none) */
static __device__ __forceinline__ uint32_t sample__key(float f)
{
    const uint32_t b = __float_as_uint(f);
    return b ^ ((uint32_t)((int32_t)b >> 31) | 0x80000000u);
}

/* (key desc, id asc): true when a goes before b */
static __device__ __forceinline__ bool sample__before(uint32_t ka, int32_t ia, uint32_t kb,
                                                      int32_t ib)
{
    return ka != kb ? ka > kb : ia < ib;
}

/* Block-wide sum of an int (every thread gets it). red: 32 ints of shared memory. */
static __device__ int sample__block_sum(int v, int *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? red[lane] : 0;
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Block-wide maximum of a uint32 (every thread gets it). red: 32 ints of shared memory. */
static __device__ uint32_t sample__block_umax(uint32_t v, int *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o; o >>= 1)
        v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0)
        red[warp] = (int)v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? (uint32_t)red[lane] : 0u;
    for (int o = 16; o; o >>= 1)
        v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Exclusive prefix sum over the lanes of a warp (lane 0 gets 0). */
template <typename V> static __device__ __forceinline__ V sample__warp_exscan(V v)
{
    const int lane = threadIdx.x & 31;
    V incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const V t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += t;
    }
    const V ex = __shfl_up_sync(0xffffffffu, incl, 1);
    return lane ? ex : (V)0;
}

/* Exclusive prefix sum of an int over the block in thread order. red: 32 ints of shared memory. */
static __device__ int sample__block_exscan(int v, int *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ex = sample__warp_exscan(v);
    __syncthreads();
    if (lane == 31)
        red[warp] = ex + v;
    __syncthreads();
    const int w = lane < (int)(blockDim.x >> 5) ? red[lane] : 0;
    const int wex = sample__warp_exscan(w);
    return __shfl_sync(0xffffffffu, wex, warp) + ex;
}

/* f(value, index) for every element of the row x (vocab floats), each once, spread over the
 * block's threads; 16-byte loads, four in flight per thread, where x is 16-byte aligned (the
 * logits stay in L2 between the LM head and the sampler: the loop is bound by the loads in flight,
 * not by the bytes) */
template <typename F>
static __device__ __forceinline__ void sample__row(const float *x, int vocab, F f)
{
    const int tid = threadIdx.x, nt = blockDim.x;
    if (((uintptr_t)x & 15) != 0) {
        for (int i = tid; i < vocab; i += nt)
            f(x[i], i);
        return;
    }
    const float4 *x4 = (const float4 *)x;
    const int n4 = vocab >> 2;
    int i = tid;
    for (; i + 3 * nt < n4; i += 4 * nt) {
        float4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            v[j] = x4[i + j * nt];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int b = 4 * (i + j * nt);
            f(v[j].x, b);
            f(v[j].y, b + 1);
            f(v[j].z, b + 2);
            f(v[j].w, b + 3);
        }
    }
    for (; i < n4; i += nt) {
        const float4 v = x4[i];
        f(v.x, 4 * i);
        f(v.y, 4 * i + 1);
        f(v.z, 4 * i + 2);
        f(v.w, 4 * i + 3);
    }
    for (int k = 4 * n4 + tid; k < vocab; k += nt)
        f(x[k], k);
}

/* Buckets of the K-th largest key's search (sample__kth_key: 2 per thread of a 1024-thread block). */
#define SAMPLE__BITS 11
#define SAMPLE__BINS (1 << SAMPLE__BITS)

/* Bitonic sort of keys / ids [0, sz) (sz a power of two) by (key desc, id asc), in shared
 * memory; every thread of the block calls it. */
static __device__ void sample__sort(uint32_t *keys, int32_t *ids, int sz)
{
    for (int size = 2; size <= sz; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < sz; i += blockDim.x) {
                const int j = i ^ stride;
                if (j > i) {
                    const bool up = (i & size) == 0;
                    const bool sw = up ? sample__before(keys[j], ids[j], keys[i], ids[i])
                                       : sample__before(keys[i], ids[i], keys[j], ids[j]);
                    if (sw) {
                        const uint32_t tk = keys[i];
                        const int32_t ti = ids[i];
                        keys[i] = keys[j];
                        ids[i] = ids[j];
                        keys[j] = tk;
                        ids[j] = ti;
                    }
                }
            }
            __syncthreads();
        }
}

/* float -> uint32 in the order of the float compare: as sample__key with -0 taken as +0 (the
 * reference's comparisons hold them equal and order them by id) */
static __device__ __forceinline__ uint32_t sample__nkey(float f)
{
    return sample__key(__fadd_rn(f, 0.0f));
}

/* The row's keys >= t (sample__nkey with NKEY, else sample__key) into keys / ids, in the order
 * the threads reach them, at most SAMPLE_MAX_CAND; the slots past them hold (0, INT32_MAX).
 * *n_cand (shared) counts them all, also those past the slots. Every thread of the block calls
 * it; they all see *n_cand when it returns. */
template <bool NKEY>
static __device__ void sample__gather(const float *x, int vocab, uint32_t t, uint32_t *keys,
                                      int32_t *ids, int *n_cand)
{
    if (threadIdx.x == 0)
        *n_cand = 0;
    for (int i = threadIdx.x; i < SAMPLE_MAX_CAND; i += blockDim.x) {
        keys[i] = 0;
        ids[i] = INT32_MAX;
    }
    __syncthreads();
    sample__row(x, vocab, [&](float v, int i) {
        const uint32_t k = NKEY ? sample__nkey(v) : sample__key(v);
        if (k >= t) {
            const int at = atomicAdd(n_cand, 1);
            if (at < SAMPLE_MAX_CAND) {
                keys[at] = k;
                ids[at] = i;
            }
        }
    });
    __syncthreads();
}

/* The K-th largest sample__nkey t of the row x (count(key > t) < K <= count(key >= t); 1 <= K <=
 * vocab) by bucket refinement (session 20): one pass finds the smallest and largest key; each next
 * pass counts the keys of the range [lo, hi] that still holds t into SAMPLE__BINS buckets of 2^sh
 * keys (a histogram in shared memory) and keeps the bucket where the count from the top reaches K:
 * 11 bits of the range per pass, so at most three passes until lo == hi == t (the bisection over
 * the key space takes 32). Every thread of the block calls it; blockDim.x divides SAMPLE__BINS
 * into at most 4 buckets per thread. hist: SAMPLE__BINS ints, red: 32 ints of shared memory. */
static __device__ uint32_t sample__kth_key(const float *x, int vocab, int K, int *hist, int *red)
{
    const int tid = threadIdx.x, per = SAMPLE__BINS / (int)blockDim.x;
    uint32_t kmax = 0, kmin = 0xffffffffu;
    sample__row(x, vocab, [&](float v, int) {
        const uint32_t k = sample__nkey(v);
        kmax = max(kmax, k);
        kmin = min(kmin, k);
    });
    kmax = sample__block_umax(kmax, red);
    kmin = ~sample__block_umax(~kmin, red);
    uint32_t lo = kmin, hi = K < vocab ? kmax : kmin; /* K = vocab: every key is a candidate */
    int above = 0;                                   /* count(key > hi); above < K <= count(>= lo) */
    while (lo < hi) {
        const uint32_t span = hi - lo; /* + 1 keys */
        const int sh = span < SAMPLE__BINS ? 0 : 32 - __clz((int)(span >> SAMPLE__BITS));
        /* (span >> sh) < SAMPLE__BINS: every key of [lo, hi] has a bucket */
        for (int i = tid; i < SAMPLE__BINS; i += blockDim.x)
            hist[i] = 0;
        __syncthreads();
        const uint32_t l0 = lo, h0 = hi;
        sample__row(x, vocab, [&](float v, int) {
            const uint32_t k = sample__nkey(v);
            if (k >= l0 && k <= h0)
                atomicAdd(&hist[(k - l0) >> sh], 1);
        });
        __syncthreads();
        /* the descending scan: thread tid holds buckets nb - 1 - per tid down to nb - per (tid +
         * 1); the block's exclusive scan gives the count above its first one */
        const int nb = (int)((h0 - l0) >> sh) + 1, b0 = nb - 1 - per * tid;
        int c[4], sum = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            c[j] = j < per && b0 - j >= 0 ? hist[b0 - j] : 0;
            sum += c[j];
        }
        int ex = above + sample__block_exscan(sum, red);
        __syncthreads(); /* every thread has read hist and red before lo / hi / above change */
        int b = -1, ab = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (c[j] > 0 && ex < K && K <= ex + c[j]) {
                b = b0 - j;
                ab = ex;
            }
            ex += c[j];
        }
        if (b >= 0) { /* exactly one thread */
            red[0] = (int)(l0 + ((uint32_t)b << sh));
            red[1] = (int)min(h0, l0 + ((uint32_t)b << sh) + ((1u << sh) - 1u));
            red[2] = ab;
        }
        __syncthreads();
        lo = (uint32_t)red[0];
        hi = (uint32_t)red[1];
        above = red[2];
        __syncthreads(); /* red is the reductions' scratch again */
    }
    return lo;
}

/* grid (n, G), block SAMPLE__THREADS: tokens (n) int32; logits (n, vocab) f32; per-row
 * parameters (n) each. A greedy row: block (row, y) takes the y-th of G slices of the vocabulary;
 * G > 1: the slices' bests meet in best[row] by atomicMax on (key << 32 | ~id) (largest key,
 * then lowest id: the order of the one-block scan, whatever order the blocks finish in) and the
 * last block of the row (cnt[row]) writes the token and re-zeroes both. Other rows: block y 0
 * only. Two blocks per SM (32 registers: the greedy slices are sized for two per SM; the sampled
 * path spills a few bytes for it). */
template <bool BUCKET>
static __global__ void __launch_bounds__(SAMPLE__THREADS, 2)
    sample__kernel(int32_t *tokens, const float *logits, int vocab, const float *temperature,
                   const int32_t *top_k, const float *top_p, const float *u,
                   unsigned long long *best, int *cnt)
{
    __shared__ uint32_t keys[SAMPLE_MAX_CAND];
    __shared__ int32_t ids[SAMPLE_MAX_CAND];
    __shared__ float probs[SAMPLE_MAX_CAND];
    __shared__ int hist[SAMPLE__BINS];
    __shared__ int red[32];
    __shared__ int n_cand;
    const int row = blockIdx.x, tid = threadIdx.x;
    const float *x = logits + (size_t)row * vocab;
    const float T = temperature[row];
    const int kk = top_k[row];

    if (T == 0.0f || kk == 1) { /* greedy: largest key, lowest id */
        const int G = gridDim.y, per = (vocab + G - 1) / G;
        const int v0 = (int)blockIdx.y * per, v1 = min(vocab, v0 + per);
        uint32_t bk = 0;
        int32_t bi = INT32_MAX;
        for (int i = v0 + tid; i < v1; i += blockDim.x) {
            const uint32_t k = sample__key(x[i]);
            if (sample__before(k, i, bk, bi)) {
                bk = k;
                bi = i;
            }
        }
        for (int o = 16; o; o >>= 1) {
            const uint32_t k2 = __shfl_xor_sync(0xffffffffu, bk, o);
            const int32_t i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (sample__before(k2, i2, bk, bi)) {
                bk = k2;
                bi = i2;
            }
        }
        if ((tid & 31) == 0) {
            keys[tid >> 5] = bk;
            ids[tid >> 5] = bi;
        }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < (int)(blockDim.x >> 5); w++)
                if (sample__before(keys[w], ids[w], bk, bi)) {
                    bk = keys[w];
                    bi = ids[w];
                }
            if (G == 1) {
                tokens[row] = bi;
                return;
            }
            atomicMax(&best[row], (unsigned long long)bk << 32 | (0xffffffffu - (uint32_t)bi));
            __threadfence();
            if (atomicAdd(&cnt[row], 1) == G - 1) { /* the row's last block */
                const unsigned long long b = atomicExch(&best[row], 0ull);
                tokens[row] = (int32_t)(0xffffffffu - (uint32_t)(b & 0xffffffffu));
                cnt[row] = 0;
            }
        }
        return;
    }
    if (blockIdx.y != 0)
        return;

    /* K candidates: t = the K-th largest key (count(key > t) < K <= count(key >= t)). BUCKET
     * (session 20, sample_bucket): by bucket refinement (sample__kth_key: at most 4 passes over
     * the row) instead of the bisection over the key space (32 passes, one block per row: ~0.9 ms
     * of a 2.5 ms batch-1 step with top-p on; 0.09 ms with BUCKET, one H100, call s20b). */
    const int K = min(kk > 0 ? kk : vocab, min(vocab, SAMPLE_MAX_CAND));
    uint32_t t;
    if constexpr (BUCKET) {
        t = sample__kth_key(x, vocab, K, hist, red);
    } else {
        /* the bisection over the key space (session 4): 32 passes over the row */
        uint32_t lo = 0, hi = 0xffffffffu; /* count(key >= lo) >= K always */
        while (lo < hi) {
            const uint32_t mid = (uint32_t)(((uint64_t)lo + hi + 1) >> 1);
            int c = 0;
            for (int i = tid; i < vocab; i += blockDim.x)
                c += sample__key(x[i]) >= mid;
            if (sample__block_sum(c, red) >= K)
                lo = mid;
            else
                hi = mid - 1;
        }
        t = lo;
    }
    sample__gather<BUCKET>(x, vocab, t, keys, ids, &n_cand);
    /* the first sz entries by (key desc, id asc): the smallest power of two that holds the
     * candidates (>= K) with BUCKET; the slots past them hold (0, INT32_MAX) and stay behind */
    int sz = 2;
    while (sz < (BUCKET ? min(n_cand, SAMPLE_MAX_CAND) : SAMPLE_MAX_CAND))
        sz <<= 1;
    sample__sort(keys, ids, sz);
    /* as sampler_pick: softmax of the K candidates, top-p, one draw. The probabilities in
     * parallel; the sums on thread 0 in the reference's order, or with BUCKET by warp 0, each lane
     * over a run of consecutive candidates (thread 0 alone takes three serial passes over up to
     * 2048 of them, ~2k dependent adds and divisions each). BUCKET's running sums are the
     * reference's but for rounding: a draw within an ulp of a bucket edge may pick the
     * neighbouring token (as expf's last ulp already may). */
    const float mx = x[ids[0]] / T;
    for (int i = tid; i < K; i += blockDim.x)
        probs[i] = expf(x[ids[i]] / T - mx);
    __syncthreads();
    if (!BUCKET && tid == 0) { /* session 4: the running sums in order on one thread */
        int n = K;
        float sum = 0.0f, acc = 0.0f;
        for (int i = 0; i < n; i++)
            sum += probs[i];
        if (top_p[row] < 1.0f) {
            int keep = n;
            for (int i = 0; i < n; i++) {
                acc += probs[i] / sum;
                if (acc >= top_p[row]) {
                    keep = i + 1;
                    break;
                }
            }
            n = keep;
            sum = 0.0f;
            for (int i = 0; i < n; i++)
                sum += probs[i];
        }
        const float v = u[row] * sum;
        int32_t tok = ids[n - 1];
        acc = 0.0f;
        for (int i = 0; i < n; i++) {
            acc += probs[i];
            if (v < acc) {
                tok = ids[i];
                break;
            }
        }
        tokens[row] = tok;
    }
    if (BUCKET && tid < 32) {
        const int lane = tid, L = (K + 31) / 32, a = min(K, lane * L), e = min(K, a + L);
        float ps = 0.0f;
        for (int i = a; i < e; i++)
            ps += probs[i];
        float pre = sample__warp_exscan(ps); /* sum of the runs before this lane's */
        const float sum = __shfl_sync(0xffffffffu, pre + ps, 31);
        int n = K;
        float nsum = sum;
        if (top_p[row] < 1.0f) { /* keep the first n whose running sum reaches top_p sum */
            const float want = top_p[row] * sum;
            int f = INT32_MAX;
            float acc = pre;
            for (int i = a; i < e; i++) {
                acc += probs[i];
                if (acc >= want) {
                    f = i;
                    break;
                }
            }
            const unsigned m = __ballot_sync(0xffffffffu, f != INT32_MAX);
            if (m)
                n = __shfl_sync(0xffffffffu, f, __ffs(m) - 1) + 1;
            float ks = 0.0f;
            for (int i = a; i < min(e, n); i++)
                ks += probs[i];
            pre = sample__warp_exscan(ks);
            nsum = __shfl_sync(0xffffffffu, pre + ks, 31);
        }
        const float v = u[row] * nsum;
        int f = INT32_MAX;
        float acc = pre;
        for (int i = a; i < min(e, n); i++) {
            acc += probs[i];
            if (v < acc) {
                f = i;
                break;
            }
        }
        const unsigned m = __ballot_sync(0xffffffffu, f != INT32_MAX);
        const int pick = m ? __shfl_sync(0xffffffffu, f, __ffs(m) - 1) : n - 1;
        if (lane == 0)
            tokens[row] = ids[pick];
    }
}

/* (value desc, id asc) on the floats themselves, as sampler_logprobs compares them */
static __device__ __forceinline__ bool sample__fbefore(float a, int32_t ia, float b, int32_t ib)
{
    return a > b || (a == b && ia < ib);
}

/* grid (n), block SAMPLE__LP_THREADS: ids, vals (n, 1 + SAMPLE_LP_TOP); logits (n, vocab) f32;
 * tokens, n_top (n) int32. One block per row: the max, the normalizer (double, as the
 * reference), then the alternatives one round each: the best entry after the previous one (a
 * pass over the row per alternative). BUCKET (session 20, sample_bucket): the n_top-th largest
 * key by bucket refinement (sample__kth_key), the keys at or above it gathered and sorted: about
 * 5 passes instead of 1 + n_top; more ties at that key than SAMPLE_MAX_CAND slots fall back to
 * the rounds. */
#define SAMPLE__LP_THREADS 512
template <bool BUCKET>
static __global__ void __launch_bounds__(SAMPLE__LP_THREADS)
    sample__logprobs(int32_t *ids, float *vals, const float *logits, int vocab,
                     const int32_t *tokens, const int32_t *n_top)
{
    __shared__ float rv[32];
    __shared__ int32_t ri[32];
    __shared__ double rd[32];
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nw = (int)(blockDim.x >> 5);
    int nt = n_top[row];
    if (nt < 0)
        return;
    nt = min(min(nt, SAMPLE_LP_TOP), vocab);
    const float *x = logits + (size_t)row * vocab;
    int32_t *oi = ids + (size_t)row * (1 + SAMPLE_LP_TOP);
    float *ov = vals + (size_t)row * (1 + SAMPLE_LP_TOP);

    float mx = -INFINITY;
    for (int i = tid; i < vocab; i += blockDim.x)
        mx = fmaxf(mx, x[i]);
    mx = kutil_warp_max(mx);
    if (lane == 0)
        rv[warp] = mx;
    __syncthreads();
    mx = rv[0];
    for (int w = 1; w < nw; w++)
        mx = fmaxf(mx, rv[w]);
    double sum = 0.0;
    for (int i = tid; i < vocab; i += blockDim.x)
        sum += exp((double)x[i] - (double)mx);
    for (int o = 16; o; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0)
        rd[warp] = sum;
    __syncthreads();
    sum = 0.0;
    for (int w = 0; w < nw; w++)
        sum += rd[w];
    const float lse = (float)((double)mx + log(sum));
    if (tid == 0) {
        oi[0] = tokens[row];
        ov[0] = __fsub_rn(x[tokens[row]], lse);
    }

    if constexpr (BUCKET) {
        __shared__ uint32_t keys[SAMPLE_MAX_CAND];
        __shared__ int32_t cids[SAMPLE_MAX_CAND];
        __shared__ int hist[SAMPLE__BINS];
        __shared__ int n_cand;
        if (nt > 0) {
            const uint32_t t = sample__kth_key(x, vocab, nt, hist, ri);
            sample__gather<true>(x, vocab, t, keys, cids, &n_cand);
            if (n_cand <= SAMPLE_MAX_CAND) { /* every key >= t is here: the order is exact */
                int sz = 2;
                while (sz < n_cand)
                    sz <<= 1;
                sample__sort(keys, cids, sz);
                for (int j = tid; j < nt; j += blockDim.x) {
                    oi[1 + j] = cids[j];
                    ov[1 + j] = __fsub_rn(x[cids[j]], lse);
                }
                return;
            }
            __syncthreads(); /* ri (kth_key's scratch) before the rounds use it */
        }
    }

    float pv = INFINITY; /* the previous pick (none yet: everything comes after it) */
    int32_t pi = -1;
    for (int j = 0; j < nt; j++) {
        float bv = -INFINITY;
        int32_t bi = INT32_MAX;
        for (int i = tid; i < vocab; i += blockDim.x) {
            const float v = x[i];
            if ((j == 0 || sample__fbefore(pv, pi, v, i)) &&
                (bi == INT32_MAX || sample__fbefore(v, i, bv, bi))) {
                bv = v;
                bi = i;
            }
        }
        for (int o = 16; o; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            const int32_t i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (i2 != INT32_MAX && (bi == INT32_MAX || sample__fbefore(v2, i2, bv, bi))) {
                bv = v2;
                bi = i2;
            }
        }
        __syncthreads(); /* the previous round's readers of rv / ri are done */
        if (lane == 0) {
            rv[warp] = bv;
            ri[warp] = bi;
        }
        __syncthreads();
        bv = rv[0];
        bi = ri[0];
        for (int w = 1; w < nw; w++)
            if (ri[w] != INT32_MAX && (bi == INT32_MAX || sample__fbefore(rv[w], ri[w], bv, bi))) {
                bv = rv[w];
                bi = ri[w];
            }
        if (tid == 0) {
            oi[1 + j] = bi;
            ov[1 + j] = __fsub_rn(bv, lse);
        }
        pv = bv;
        pi = bi;
    }
}

/* ==== launchers ==== */

/* 1 (default): greedy rows split across blocks where sample_run has a scratch; 0: one block per
 * row (the harness runs both) */
extern "C" {
int sample_split = 1;
int sample_bucket = -1;
}

/* sample_bucket, read from PD_CUDA_SAMPLE_BUCKET (0: off; on otherwise, the default since
 * session 21) the first time it is -1 */
static bool sample__bucket_on(void)
{
    if (sample_bucket < 0) {
        const char *e = getenv("PD_CUDA_SAMPLE_BUCKET");
        sample_bucket = !(e && *e && atoi(e) == 0);
    }
    return sample_bucket != 0;
}

extern "C" pd_status_t sample_run(int32_t *tokens, const float *logits, int n, int vocab,
                                  const float *temperature, const int32_t *top_k,
                                  const float *top_p, const float *u, void *scratch,
                                  cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && vocab > 0, "sample");
    if (n == 0)
        return PD_OK;
    /* greedy slices per row: about two blocks per SM of an H200 over the batch, each at least
     * 4 elements per thread */
    int G = 1;
    if (scratch && n <= SAMPLE_SPLIT_MAX_ROWS && sample_split) {
        G = 264 / n;
        G = G < 32 ? G : 32;
        while (G > 1 && vocab / G < 4 * SAMPLE__THREADS)
            G--;
        G = G > 1 ? G : 1;
    }
    unsigned long long *best = (unsigned long long *)scratch;
    int *cnt = scratch ? (int *)(best + SAMPLE_SPLIT_MAX_ROWS) : NULL;
    if (sample__bucket_on())
        sample__kernel<true><<<dim3((unsigned)n, (unsigned)G), SAMPLE__THREADS, 0, stream>>>(
            tokens, logits, vocab, temperature, top_k, top_p, u, best, cnt);
    else
        sample__kernel<false><<<dim3((unsigned)n, (unsigned)G), SAMPLE__THREADS, 0, stream>>>(
            tokens, logits, vocab, temperature, top_k, top_p, u, best, cnt);
    return KUTIL_LAUNCHED("sample");
}

extern "C" pd_status_t sample_logprobs_run(int32_t *ids, float *vals, const float *logits,
                                           const int32_t *tokens, const int32_t *n_top, int n,
                                           int vocab, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && vocab > 0, "sample_logprobs");
    if (n == 0)
        return PD_OK;
    if (sample__bucket_on())
        sample__logprobs<true>
            <<<n, SAMPLE__LP_THREADS, 0, stream>>>(ids, vals, logits, vocab, tokens, n_top);
    else
        sample__logprobs<false>
            <<<n, SAMPLE__LP_THREADS, 0, stream>>>(ids, vals, logits, vocab, tokens, n_top);
    return KUTIL_LAUNCHED("sample_logprobs");
}
