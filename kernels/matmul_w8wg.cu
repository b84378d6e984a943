/* matmul_w8wg: the FP8 W8A8 GEMM of the decode batches (n = 1 .. MATMUL_W8WG_MAX_N tokens) on
 * Hopper's warpgroup tensor-core instruction (wgmma, sm_90a) with both operands in shared memory,
 * fed by the tensor memory accelerator (TMA). matmul.h declares it.
 *
 * Why: at batch 64 the FP8 decode step ran its GEMMs on cuBLASLt at 0.8-2.1 TB/s (session 8,
 * one H200: o 4096 x 4096 ~20 us, down 4096 x 14336 36.6 us, gate_up 28672 x 4096 55.9 us),
 * while at n 64 an FP8 GEMM is a weight stream: 64 tokens x 2 flops per weight byte is ~1/30 of
 * the tensor rate per byte of copy bandwidth. This kernel keeps the weight stream going at a
 * deep ring of TMA copies and lets the tensor cores take what arrives.
 *
 * Numerics: those of the FP8 routes before it (matmul_fp8_mma, cuBLASLt outer-vector scales):
 * xq (n, K) e4m3 and xs (n) per-token scales from matmul_quant_act_fp8, W (N, K) e4m3 with
 * per-row scales ws, out = (sum_k xq w) * xs[t] * ws[r]. The e4m3 products are exact; the
 * tensor cores add them in a fixed-point sum of limited width, so every 128 columns (4 wgmma
 * k32 steps, started from a zero accumulator) the partial sum is added into an f32 accumulator
 * in registers: the promotion cuBLASLt's default (not "fast accumulation") FP8 mode does too.
 * K splits are summed in a fixed order: the result is deterministic.
 *
 * The block (384 threads): warps 0-7 are two consumer warpgroups, warps 8-11 the producer
 * warpgroup (only lane 0 of warp 8 works). A block takes R = 128 MT weight rows (consumer
 * warpgroup c: the m64 tiles c MT .. c MT + MT - 1) and NB tokens (one wgmma n-NB tile, NB 16
 * or 64; grid x runs over the token tiles) over its split of K, in stages of 128 columns. A
 * stage holds the R x 128-byte weight box and the NB x 128-byte activation box, both copied by
 * one 2-D TMA each (cp.async.bulk.tensor, 128-byte swizzle: the layout wgmma's K-major
 * descriptors read; rows past N or n arrive as zeros) and completing on the stage's "full"
 * mbarrier. Consumers wait on "full", issue 4 k32 steps x MT wgmma m64nNBk32 e4m3 (A = weights,
 * B = activations, both by descriptor), wait for them (wgmma.wait_group 0), arrive on the
 * stage's "empty" mbarrier (which the producer waits on before it refills the stage) and add
 * the stage's sums into their f32 accumulators.
 *
 * Epilogue: each block leaves its (NB x R) sums in shared memory (the ring is free then). With
 * S K splits the launch has clusters of (1, 1, S) blocks; after a cluster barrier block z of the
 * cluster adds rows [z R / S, (z + 1) R / S) of all S blocks' sums, read through distributed
 * shared memory in rank order, and writes them scaled; a second barrier keeps every block's
 * shared memory alive until the others have read it. So no scratch in global memory and no
 * second launch. The stores run along rows: coalesced. */
#include <cuda.h> /* CUtensorMap (the type only: the encoder comes through the runtime) */
#include <cuda_runtime.h>
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kutil.cuh"
#include "matmul.h"
#include "mma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define W8WG__ON 1
#else
#define W8WG__ON 0
#endif

#define W8WG__THREADS 384      /* 2 consumer warpgroups + the producer warpgroup */
#define W8WG__RING (210 << 10) /* shared-memory bytes for the stages */
#define W8WG__MAX_S 8 /* cluster size: K splits (session 22: 8, the sums no longer chained) */
static_assert(W8WG__MAX_S <= KUTIL_CLUSTER_MAX, "one cluster sums the splits");

template <int MT, int NB> struct w8wg__cfg {
    static constexpr int R = 128 * MT;         /* weight rows per block */
    static constexpr int WB = R * 128;         /* bytes of a stage's weight box */
    static constexpr int STAGE = WB + NB * 128; /* + the activation box; a multiple of 1024 */
    static constexpr int NS = W8WG__RING / STAGE;
    static constexpr int RP = R + 4; /* f32 pitch of a token's row of sums in the epilogue */
    static constexpr int SMEM = NS * STAGE + 1024 /* alignment */ + 16 * NS /* barriers */;
    static_assert(STAGE % 1024 == 0, "stages stay 1024-aligned (the 128-byte swizzle)");
    static_assert(NB * RP * 4 <= NS * STAGE, "the epilogue's sums fit in the ring");
    static_assert(SMEM <= 227 * 1024, "shared memory of one block");
};

#if W8WG__ON
/* K-major operand in shared memory, 128-byte swizzle: leading byte offset 16 (unused), stride
 * 1024 bytes between 8-row core groups */
static __device__ __forceinline__ uint64_t w8wg__desc(uint32_t addr)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(16 >> 4) << 16) |
           ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
/* d (64 x NB f32, wgmma accumulator layout) = [d +] A (64 x 32 e4m3) B (32 x NB e4m3), both by
 * descriptor; acc 0: d is overwritten */
template <int NB>
static __device__ __forceinline__ void w8wg__mma(float (&d)[NB / 2], uint64_t da, uint64_t db,
                                                 int acc);
template <>
__device__ __forceinline__ void w8wg__mma<64>(float (&d)[32], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void w8wg__mma<16>(float (&d)[8], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(acc));
}
/* the 2-D box at (column c0, row c1) of the tensor map -> shared dst, completing on bar */
static __device__ __forceinline__ void w8wg__tma(uint32_t dst, const CUtensorMap *map, int c0,
                                                 int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
#endif /* W8WG__ON */

/* grid (ceil(n / NB), ceil(N / (128 MT)), S), block W8WG__THREADS, clusters of (1, 1, S) blocks
 * when S > 1, dynamic shared memory w8wg__cfg::SMEM. wmap: tensor map of W (N rows of K bytes,
 * box 128 x 128 MT), xmap: of xq (n rows of K bytes, box 128 x NB), both 128-byte swizzled;
 * ws (N), xs (n) f32 scales; out (n, N) f32; kps stages (128 columns) per split: split z takes
 * stages [z kps, min((z + 1) kps, K / 128)). */
template <int MT, int NB>
static __global__ void __launch_bounds__(W8WG__THREADS, 1)
    matmul__w8wg(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                 float *out, const float *xs, const float *ws, int n, int64_t N, int64_t K, int kps)
{
#if W8WG__ON
    using C = w8wg__cfg<MT, NB>;
    constexpr int NS = C::NS, R = C::R;
    extern __shared__ uint8_t w8wg__sm[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(w8wg__sm);
    const uint32_t sm0 = (raw + 1023u) & ~1023u;
    const uint32_t bars = sm0 + NS * C::STAGE; /* full[NS], then empty[NS] */
    float *red = (float *)(w8wg__sm + (sm0 - raw));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nk = (int)(K / 128), S = (int)gridDim.z, z = (int)blockIdx.z;
    const int kb = z * kps, ke = min(nk, kb + kps), nst = ke - kb;
    const int64_t row0 = (int64_t)blockIdx.y * R;
    const int t0 = (int)blockIdx.x * NB;
    if (threadIdx.x == 0)
        mma_ring_init(NS, bars);
    __syncthreads();

    if (warp >= 8) { /* the producer warpgroup: lane 0 of warp 8 copies */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp == 8 && lane == 0) {
            auto copy = [&](int i, bool w, bool a) {
                const int s = i % NS, c0 = (kb + i) * 128;
                const uint32_t full = bars + 8 * s, st = sm0 + s * C::STAGE;
                if (w) {
                    mma_bar_expect(full, (uint32_t)C::STAGE);
                    w8wg__tma(st, &wmap, c0, (int)row0, full);
                }
                if (a)
                    w8wg__tma(st + C::WB, &xmap, c0, t0, full);
            };
            /* the first stages' weights while the kernels before finish; xq after the PDL wait */
            mma_ring_produce(nst, NS, bars, copy);
        }
        __syncwarp();
        if (S > 1) { /* the consumers' two cluster barriers count every thread of the block */
            kutil_cluster_sync();
            kutil_cluster_sync();
        }
        return;
    }

    /* consumers: warpgroup cw, warp wq in it; its m64 tile m is the block's tile cw MT + m */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    kutil_pdl_wait(); /* xs and out belong to the kernels around (the producer waits for xq) */
    kutil_pdl_trigger();
    const int cw = warp >> 2, wq = warp & 3, gq = lane >> 2, tq = lane & 3;
    float acc[MT][NB / 2], part[MT][NB / 2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int e = 0; e < NB / 2; e++)
            acc[m][e] = part[m][e] = 0.0f;
    for (int i = 0; i < nst; i++) {
        const int s = i % NS;
        mma_bar_wait(bars + 8 * s, (uint32_t)((i / NS) & 1));
        const uint32_t st = sm0 + s * C::STAGE;
        mma_wg_fence();
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                w8wg__mma<NB>(part[m], w8wg__desc(st + (cw * MT + m) * 8192 + k * 32),
                              w8wg__desc(st + C::WB + k * 32), k);
        mma_wg_commit();
        mma_wg_wait<0>(); /* the stage's wgmma are done with its shared memory */
        __syncwarp();
        if (lane == 0)
            mma_bar_arrive(bars + 8 * (NS + s));
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int e = 0; e < NB / 2; e++)
                acc[m][e] += part[m][e];
    }

    /* the block's sums to shared memory: red[t][r], t < NB tokens, r < R rows of the block
     * (every stage's copies have landed and been read: the ring is free) */
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const int rb = (cw * MT + m) * 64 + 16 * wq + gq;
#pragma unroll
        for (int c8 = 0; c8 < NB / 8; c8++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    red[(8 * c8 + 2 * tq + e) * C::RP + rb + 8 * h] = acc[m][4 * c8 + 2 * h + e];
    }
    if (S > 1)
        kutil_cluster_sync();
    else
        asm volatile("bar.sync 1, 256;\n" ::: "memory");

    /* this block's share of the tile's rows: [r0, r1) of R, all S blocks' sums in rank order */
    const int r0 = z * R / S, r1 = (z + 1) * R / S, nr = r1 - r0;
    const int nt = min(NB, n - t0);
    for (int idx = threadIdx.x; idx < nt * nr; idx += 256) {
        const int t = idx / nr, r = r0 + idx % nr;
        const int64_t row = row0 + r;
        if (row >= N)
            continue;
        float v;
        if (S == 1) {
            v = red[t * C::RP + r];
        } else {
            v = kutil_cluster_sum(sm0 + (uint32_t)(t * C::RP + r) * 4u, S); /* red[t][r] */
        }
        out[(size_t)(t0 + t) * N + row] = v * xs[t0 + t] * ws[row];
    }
    if (S > 1)
        kutil_cluster_sync(); /* the others may still read this block's sums */
#else
    __trap(); /* not built for sm_90a: matmul_w8wg_usable() said no */
#endif
}

/* ---- launcher and plan ---- */

/* map over a (rows, K) byte matrix at p (row pitch K), boxes of 128 columns x box_rows rows,
 * 128-byte swizzle, zeros out of bounds */
static pd_status_t w8wg__map(CUtensorMap *map, const void *p, int64_t rows, int64_t K,
                             int box_rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 encode = kutil_tmap_encoder();
    if (!encode)
        return kutil_status(cudaErrorNotSupported, "matmul_w8wg tensor map encoder");
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)K};
    const cuuint32_t box[2] = {128, (cuuint32_t)box_rows};
    const cuuint32_t es[2] = {1, 1};
    memset(map, 0, sizeof *map);
    const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)p, dims, strides, box,
                              es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return kutil_status(cudaErrorInvalidValue, "matmul_w8wg tensor map");
    return PD_OK;
}

template <int MT, int NB>
static pd_status_t w8wg__launch(float *out, const uint8_t *xq, const float *xs,
                                const pd_weight_t *w, int n, int S, int kps, cudaStream_t stream)
{
    using C = w8wg__cfg<MT, NB>;
    static unsigned attr; /* per device (kutil_allow_smem) */
    pd_status_t st =
        kutil_allow_smem((const void *)matmul__w8wg<MT, NB>, C::SMEM, &attr, "matmul_w8wg smem");
    if (st != PD_OK)
        return st;
    CUtensorMap wmap, xmap;
    if ((st = w8wg__map(&wmap, w->data, w->n, w->k, C::R)) != PD_OK ||
        (st = w8wg__map(&xmap, xq, n, w->k, NB)) != PD_OK)
        return st;
    const dim3 grid((unsigned)((n + NB - 1) / NB), (unsigned)((w->n + C::R - 1) / C::R),
                    (unsigned)S);
    const cudaError_t e = kutil_launch_pdl_cluster(
        matmul__w8wg<MT, NB>, grid, dim3(W8WG__THREADS), (size_t)C::SMEM, stream, (unsigned)S, wmap,
        xmap, out, xs, (const float *)w->scales, n, w->n, w->k, kps);
    if (e != cudaSuccess)
        return kutil_status(e, "matmul_w8wg");
    return KUTIL_LAUNCHED("matmul_w8wg");
}

extern "C" bool matmul_w8wg_usable(void)
{
    return matmul_w4wg_usable(); /* the same build (sm_90a) and device (compute capability 9.0) */
}

/* rows per block 128 mt and K splits s for n tokens: the most SMs busy in the last wave, then
 * fewer splits (a cluster costs scheduling and barriers), then 256 rows (the activations are read
 * once per block: fewer blocks read them fewer times). A split keeps >= 2 stages. At most 3
 * splits: session 21 (one H100, n 64) measured clusters of 4 slower than of 3 on down (54.4
 * against 44.1 us) and o (31.7 against 21.5); the forced sweep picked these plans at n 64 on all
 * four 8B shapes. */
#define W8WG__PLAN_MAX_S 3

/* every one of s splits of nk stages gets a stage (matmul_w8wg's precondition) */
static bool w8wg__splits_ok(int64_t nk, int s)
{
    return (s - 1) * ((nk + s - 1) / s) < nk;
}

extern "C" void matmul_w8wg_plan(int n, int64_t N, int64_t K, int n_sm, int *mt_p, int *splits_p)
{
    const char *e = getenv("PD_CUDA_W8WG_PLAN"); /* "mt,s": a forced plan (measurements) */
    int fm = 0, fs = 0;
    if (e && sscanf(e, "%d,%d", &fm, &fs) == 2 && (fm == 1 || fm == 2) && fs >= 1 &&
        fs <= W8WG__MAX_S && w8wg__splits_ok(K / 128, fs)) {
        *mt_p = fm;
        *splits_p = fs;
        return;
    }
    const int64_t nk = K / 128, tt = (n + 63) / 64;
    double best = -1e9;
    int bm = 2, bs = 1;
    for (int mt = 2; mt >= 1; mt--)
        for (int s = 1; s <= W8WG__PLAN_MAX_S; s++) {
            if (s > 1 && (nk / s < 2 || !w8wg__splits_ok(nk, s)))
                break;
            const int64_t blocks = tt * ((N + 128 * mt - 1) / (128 * mt)) * s;
            const int64_t waves = (blocks + n_sm - 1) / n_sm;
            const double fill = (double)blocks / (double)(waves * n_sm);
            const double score = fill - 0.08 * (s - 1) - (mt == 1 ? 0.03 : 0.0);
            if (score > best + 1e-9) {
                best = score;
                bm = mt;
                bs = s;
            }
        }
    *mt_p = bm;
    *splits_p = bs;
}

extern "C" pd_status_t matmul_w8wg(float *out, const uint8_t *xq, const float *xs,
                                   const pd_weight_t *w, int n, int mt, int splits,
                                   cudaStream_t stream)
{
    KUTIL_REQUIRE(w->fmt == PD_WFMT_FP8 && w->k % 128 == 0 && w->n > 0 && w->scales,
                  "matmul_w8wg");
    KUTIL_REQUIRE(n >= 0 && n <= MATMUL_W8WG_MAX_N && (mt == 1 || mt == 2) && splits >= 1 &&
                      splits <= W8WG__MAX_S,
                  "matmul_w8wg");
    KUTIL_REQUIRE(((uintptr_t)w->data & 15) == 0 && ((uintptr_t)xq & 15) == 0, "matmul_w8wg");
    if (n == 0)
        return PD_OK;
    if (!matmul_w8wg_usable())
        return PD_ERR_UNSUPPORTED;
    const int nk = (int)(w->k / 128), kps = (nk + splits - 1) / splits;
    KUTIL_REQUIRE(w8wg__splits_ok(nk, splits), "matmul_w8wg splits");
    KUTIL_REQUIRE((w->n + 128 * mt - 1) / (128 * mt) < 65535, "matmul_w8wg");
    const bool small = n <= 16;
    if (mt == 2)
        return small ? w8wg__launch<2, 16>(out, xq, xs, w, n, splits, kps, stream)
                     : w8wg__launch<2, 64>(out, xq, xs, w, n, splits, kps, stream);
    return small ? w8wg__launch<1, 16>(out, xq, xs, w, n, splits, kps, stream)
                 : w8wg__launch<1, 64>(out, xq, xs, w, n, splits, kps, stream);
}
