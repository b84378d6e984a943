/* matmul_w4wg: the INT4 GEMM of the decode batches (n = 1 .. MATMUL_W4WG_MAX_N tokens) on
 * Hopper's warpgroup tensor-core instruction (wgmma, sm_90a), for tiled INT4 weights (matmul.h's
 * tiled layout, made at upload). matmul.h declares it; issue 11 asks for an INT4 tensor-core GEMM
 * for n 9..256 within 1.3x of the FP8 GEMM, and the batch-64 decode step is mostly this GEMM.
 *
 * Numerics: those of matmul_int4_mma (matmul.cu): the weights dequantized in registers to
 * w' = (q - z) * (s * 2^4) in f16 (q - z exact, one rounding for the product), the activations
 * x * 2^-e per token rounded to f16, products accumulated in f32, the epilogue multiplying
 * 2^(e - 4) back. Only the summation order differs.
 *
 * Why wgmma: the mma.sync kernels issue one m16n8k16 per 8 tokens x 16 rows and run issue /
 * latency bound at n 64 (docs/performance.md, session 6 / 8 ncu: 4.75 cycles per issue, 36% SM).
 * One wgmma m64n64k16 does the work of 32 of them, with the same dequantized A fragments (the
 * register A operand of wgmma is, per warp, the mma.sync m16n8k16 A fragment of its 16 rows),
 * so the dequantization of a 64-row x 16-column weight tile is shared by 64 tokens per
 * instruction.
 *
 * The block (384 threads): warps 0-7 are two consumer warpgroups (232 registers each thread,
 * setmaxnreg), warps 8-11 the producer warpgroup (40; only its first lane works). A block
 * takes R = 128 MT weight rows (consumer warpgroup c: the m64 tiles c MT .. c MT + MT - 1) and
 * 64 NT tokens (token tiles of 64: one wgmma n64 each) over its split of K, in stages of GPS
 * groups of 128 columns. The producer's lane 0 copies each stage with 1-D bulk copies (TMA,
 * cp.async.bulk) that complete on the stage's "full" mbarrier: per 32-row block the tiled data
 * (2048 bytes per group), scales (64) and zeros (32) runs, contiguous across groups in the tiled
 * layout; per token tile the activation image (16 KiB per group, below). Consumers wait on
 * "full", each warp reads its rows' 16-byte weight pieces from shared memory, dequantizes them
 * (mma.cuh's mma_nib_qz: 9 instructions per 8 weights, then the scale) into A fragments, issues
 * 8 k16 steps x NT wgmma with B (the activations) read from shared memory by descriptor, and
 * after the stage's last wgmma has completed (wgmma.wait_group 0) arrives on the stage's "empty"
 * mbarrier, which the producer waits on before it refills the stage. Within a stage two A
 * buffers alternate (wait_group 1), so a warp dequantizes the next tile while its previous
 * wgmma runs; across stages the other warpgroup keeps the tensor cores busy.
 *
 * The activation image (matmul_quant_act_f16wg writes it): token tiles of 64 rows (rows past n
 * zeros), per (tile, group) 16384 bytes = 2 column blocks of 64 rows x 128 bytes (64 f16), the
 * 16-byte chunk c of row r stored at chunk c ^ (r % 8) (the 128-byte swizzle wgmma's K-major
 * descriptors read). Column block cb holds k16 steps 4 cb .. 4 cb + 3, 32 bytes each; slot k
 * (0..15) of step s holds the group's column P(s, k) = 32 (k % 8 / 2) + 8 (s / 2) + 2 (s % 2) +
 * k / 8 + 4 (k % 2), the column that mma_nib_qz puts at A fragment slot k of step s for the
 * lane (k % 8 / 2) that loaded it (the tiled layout: lane tq holds columns 32 tq .. 32 tq + 31).
 *
 * K splits (grid z): either each split writes its scaled sums to scratch and a second launch adds
 * them in split order (matmul__w4wg_sum_group), or (cluster = true, session 22) the S <=
 * KUTIL_CLUSTER_MAX splits of a tile run as one thread-block cluster of (1, 1, S) blocks: after
 * the K loop each block leaves its (tokens x R) sums in its shared memory (the ring is free
 * then), a cluster barrier, then block z adds tokens [z nt / S, (z + 1) nt / S) of the tile
 * over all S blocks through distributed shared memory in rank order (kutil_cluster_sum4: the
 * same sum, in the same order, as the second launch) and stores whole 16-byte runs of rows; a
 * second barrier keeps every block's shared memory alive until the others have read it. No
 * scratch, no second launch, no partial sums through L2.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "kutil.cuh"
#include "matmul.h"
#include "mma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define W4WG__ON 1
#else
#define W4WG__ON 0
#endif

#define W4WG__THREADS 384          /* 2 consumer warpgroups + the producer warpgroup */
#define W4WG__TILE_B MMA_WG_TILE_B /* activation image bytes per (64-token tile, group) */
#define W4WG__BLK_B 2144           /* weight bytes per (32-row block, group): data, scales, zeros */
static_assert(MATMUL_W4WG_MAX_CLUSTER == KUTIL_CLUSTER_MAX, "a cluster sums the K splits");

/* ---- the activation image ---- */

/* grid (ceil(n / 64) * 64), block up to 1024 (matmul_quant_act_f16wg's choice): row t of the
 * image (zeros past n) and mult[t] (t < n) = 2^e / MMA_WSHIFT, x (n, K) f32, K % 128 == 0. */
static __global__ void __launch_bounds__(1024)
    matmul__quant_act_f16wg(uint4 *xw, float *mult, const float *x, int n, int64_t K)
{
    __shared__ float red[32];
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): x, xw and mult belong to the kernels around */
    kutil_pdl_trigger();
    const int t = blockIdx.x;
    const float *xi = x + (size_t)(t < n ? t : 0) * K;
    auto val = [&](int64_t col) { return __ldg(xi + col); };
    if (t >= n) {
        mma_act_f16wg_row(xw, t, K, 1.0f, true, val, threadIdx.x, blockDim.x);
        return;
    }
    const float amax = kutil_block_max(mma_act_amax(xi, K, threadIdx.x, blockDim.x), red);
    const int e = mma_act_exp(amax);
    mma_act_f16wg_row(xw, t, K, ldexpf(1.0f, -e), false, val, threadIdx.x, blockDim.x);
    if (threadIdx.x == 0)
        mult[t] = ldexpf(1.0f, e) / MMA_WSHIFT;
}

/* ---- the GEMM ---- */

/* bytes of one stage: the activation tiles first (1024-aligned for the swizzle), then per 32-row
 * block its data, then all scales, then all zeros */
template <int MT, int NT, int GPS> struct w4wg__cfg {
    static constexpr int R = 128 * MT, BLKS = R / 32;
    static constexpr int ACT = NT * GPS * W4WG__TILE_B;
    static constexpr int DATA = ACT, SC = DATA + BLKS * GPS * 2048, ZR = SC + BLKS * GPS * 64;
    static constexpr int STAGE = (ZR + BLKS * GPS * 32 + 1023) / 1024 * 1024;
    static constexpr int RP = R + 4; /* f32 pitch of a token's row of sums (cluster epilogue) */
    static_assert(64 * NT * RP * 4 <= 3 * STAGE, "the cluster epilogue's sums fit in the ring");
};

/* The weights of one launch (matmul_w4wg_group): up to MATMUL_GROUP_MAX of the same K, their
 * row blocks side by side along grid y. Segment i: tiled INT4 wd / wsc / wz of N[i] rows, the
 * grid's row blocks [rb[i - 1], rb[i]) (rb[-1] = 0), results to out[i] with leading dimension
 * ld[i] (S == 1: the output, ld = N[i]; S > 1: the partial sums (S, n, sum N) at the segment's
 * column offset, ld = sum N; split z at + z n ld). */
struct w4wg__segs {
    const uint8_t *wd[MATMUL_GROUP_MAX];
    const uint16_t *wsc[MATMUL_GROUP_MAX];
    const uint8_t *wz[MATMUL_GROUP_MAX];
    float *out[MATMUL_GROUP_MAX];
    int64_t N[MATMUL_GROUP_MAX], ld[MATMUL_GROUP_MAX];
    int rb[MATMUL_GROUP_MAX];
};

/* a[i] for a segment index i < MATMUL_GROUP_MAX (3): selects between constant indices, so the
 * kernel parameter stays in parameter space (a reference to it would make a local copy) */
#define W4WG__PICK(a, i) ((i) == 0 ? (a)[0] : (i) == 1 ? (a)[1] : (a)[2])

#if W4WG__ON
static __device__ __forceinline__ uint64_t w4wg__desc(uint32_t addr)
{
    /* K-major, 128-byte swizzle: leading byte offset 16 (unused), stride 1024 (8 rows) */
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(16 >> 4) << 16) |
           ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
/* d (64 x 64 f32, wgmma accumulator layout) += A (64 x 16 f16, registers: per warp the mma.sync
 * m16n8k16 A fragment of its 16 rows) B (16 x 64 f16, shared memory, K-major) */
static __device__ __forceinline__ void w4wg__mma(float (&d)[32], const uint32_t (&a)[4],
                                                 uint64_t db)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, "
        "%36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
/* the registers stay live (and unmoved) up to here: an async wgmma may still read them */
static __device__ __forceinline__ void w4wg__keep(uint32_t (&a)[8][4])
{
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int k = 0; k < 4; k++)
            asm volatile("" : "+r"(a[i][k])::"memory");
}

/* A fragments of the 8 k16 steps of one group for a warp's 16 rows (h 0: row gq, 1: row gq + 8):
 * q[h] the lane's 16 bytes of the row (tiled piece), s[h] bf16 scale bits, z[h] zero point;
 * the operations of mma_int4_group (mma.cuh), the same values */
static __device__ __forceinline__ void w4wg__dequant(uint32_t (&A)[8][4], const uint4 (&q)[2],
                                                     const uint32_t (&s)[2], const uint32_t (&z)[2])
{
    uint32_t sc[2], zl[2], zh[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t s16 = (uint32_t)__half_as_ushort(
            __float2half_rn(kutil_bf16_to_f32((uint16_t)s[h]) * MMA_WSHIFT));
        sc[h] = s16 * 0x10001u;
        zl[h] = mma_zl(z[h]);
        zh[h] = mma_zh(z[h]);
    }
#pragma unroll
    for (int w = 0; w < 4; w++) {
        uint32_t a[2][4];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t u = w == 0 ? q[h].x : w == 1 ? q[h].y : w == 2 ? q[h].z : q[h].w;
            mma_nib_qz(a[h], u, zl[h], zh[h]);
#pragma unroll
            for (int j = 0; j < 4; j++)
                a[h][j] = mma_hmul2(a[h][j], sc[h]);
        }
        A[2 * w][0] = a[0][0], A[2 * w][1] = a[1][0], A[2 * w][2] = a[0][1], A[2 * w][3] = a[1][1];
        A[2 * w + 1][0] = a[0][2], A[2 * w + 1][1] = a[1][2], A[2 * w + 1][2] = a[0][3],
                  A[2 * w + 1][3] = a[1][3];
    }
}
#endif /* W4WG__ON */

/* grid (ceil(n / (64 NT)), the segments' row blocks of 128 MT, S), block W4WG__THREADS, dynamic
 * shared memory NS * STAGE + 1024 (alignment) + 16 NS (barriers). sg: the weights (tiled INT4
 * data, bf16 scales, zeros; N % 32 == 0, K % 128 == 0) and where their results go (w4wg__segs);
 * xw the activation image, mult (n) f32; gps groups per split (split z: groups
 * [z gps, min((z + 1) gps, K / 128))). cl: the launch has clusters of (1, 1, S) blocks that sum
 * the splits into the outputs (16-byte aligned; sg.out / sg.ld as for S == 1). */
template <int MT, int NT, int GPS, int NS>
static __global__ void __launch_bounds__(W4WG__THREADS, 1)
    matmul__w4wg(const w4wg__segs sg, const uint8_t *xw, const float *mult, int n, int64_t K,
                 int gps, int cl)
{
#if W4WG__ON
    /* this block's segment and its rows there */
    const int y = blockIdx.y;
    const int seg = y < sg.rb[0] ? 0 : y < sg.rb[1] ? 1 : 2;
    const uint8_t *wd = W4WG__PICK(sg.wd, seg), *wz = W4WG__PICK(sg.wz, seg);
    const uint16_t *wsc = W4WG__PICK(sg.wsc, seg);
    const int64_t N = W4WG__PICK(sg.N, seg), ld = W4WG__PICK(sg.ld, seg);
    using C = w4wg__cfg<MT, NT, GPS>;
    extern __shared__ uint8_t w4wg__sm[];
    const uint32_t sm0 = ((uint32_t)__cvta_generic_to_shared(w4wg__sm) + 1023u) & ~1023u;
    const uint32_t bars = sm0 + NS * C::STAGE; /* full[NS], then empty[NS] */
    uint8_t *smg = w4wg__sm + (sm0 - (uint32_t)__cvta_generic_to_shared(w4wg__sm));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int ng = (int)(K / 128), nblk = (int)(N / 32), n_img = (n + 63) / 64;
    const int gb = blockIdx.z * gps, ge = min(ng, gb + gps), nG = ge - gb;
    const int nst = (nG + GPS - 1) / GPS;
    const int64_t row0 = (int64_t)(y - (seg == 0 ? 0 : seg == 1 ? sg.rb[0] : sg.rb[1])) * C::R;
    const int tile0 = blockIdx.x * NT;
    if (threadIdx.x == 0)
        mma_ring_init(NS, bars);
    __syncthreads();

    if (warp >= 8) { /* the producer warpgroup: lane 0 of warp 8 copies, the rest idle */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp == 8 && lane == 0) {
            const int64_t blk0 = row0 / 32;
            const int nb = (int)min((int64_t)C::BLKS, (int64_t)nblk - blk0);
            const int nt = min(NT, n_img - tile0);
            /* stage i's copies: the weights (w) and / or the activations (a); the stage's "full"
             * barrier expects both when the weights are copied (they always go first) */
            auto copy = [&](int i, bool w, bool a) {
                const int s = i % NS, g0 = gb + i * GPS, gn = min(GPS, ge - g0);
                const uint32_t full = bars + 8 * s, st = sm0 + s * C::STAGE;
                if (w) {
                    mma_bar_expect(full,
                                   (uint32_t)(nt * gn * W4WG__TILE_B + nb * gn * W4WG__BLK_B));
                    for (int b = 0; b < nb; b++) {
                        const size_t tg = (size_t)(blk0 + b) * ng + g0;
                        mma_bulk(st + C::DATA + b * GPS * 2048, wd + tg * 2048,
                                 (uint32_t)(gn * 2048), full);
                        mma_bulk(st + C::SC + b * GPS * 64, (const uint8_t *)wsc + tg * 64,
                                 (uint32_t)(gn * 64), full);
                        mma_bulk(st + C::ZR + b * GPS * 32, wz + tg * 32, (uint32_t)(gn * 32),
                                 full);
                    }
                }
                if (a)
                    for (int j = 0; j < nt; j++)
                        mma_bulk(st + j * GPS * W4WG__TILE_B,
                                 xw + ((size_t)(tile0 + j) * ng + g0) * W4WG__TILE_B,
                                 (uint32_t)(gn * W4WG__TILE_B), full);
            };
            /* the first stages' weights while the kernels before finish; xw after the PDL wait */
            mma_ring_produce(nst, NS, bars, copy);
        }
        if (cl) { /* the consumers' two cluster barriers count every thread of the block */
            __syncwarp();
            kutil_cluster_sync();
            kutil_cluster_sync();
        }
        return;
    }

    /* consumers: warpgroup cw, warp wq in it; m64 tile mt of the warpgroup is the block's tile
     * cw MT + mt, this warp's 16 rows of it are 32-row block 2 (cw MT + mt) + wq / 2, half wq % 2
     */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    kutil_pdl_wait(); /* mult and out belong to the kernels around (the producer waits for xw) */
    kutil_pdl_trigger();
    const int cw = warp >> 2, wq = warp & 3, gq = lane >> 2, tq = lane & 3;
    float acc[MT][NT][32];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 32; e++)
                acc[m][j][e] = 0.0f;
    constexpr int NB = GPS * MT >= 2 ? 2 : 1; /* A buffers */
    uint32_t A[NB][8][4];
    for (int i = 0; i < nst; i++) {
        const int s = i % NS;
        mma_bar_wait(bars + 8 * s, (uint32_t)((i / NS) & 1));
        const int gn = min(GPS, nG - i * GPS);
        const uint8_t *st = smg + s * C::STAGE;
        const uint32_t sta = sm0 + s * C::STAGE;
#pragma unroll
        for (int gl = 0; gl < GPS; gl++) {
            if (gl >= gn)
                break;
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const int u = gl * MT + m, b = u % NB; /* A buffer */
                if (u >= NB) {
                    mma_wg_wait<NB - 1>(); /* the wgmma of use u - NB (buffer b) has completed */
                    w4wg__keep(A[b]);
                }
                const int bl = 2 * (cw * MT + m) + (wq >> 1), hr = wq & 1;
                const uint8_t *wp = st + C::DATA + (bl * GPS + gl) * 2048;
                uint4 q[2];
                uint32_t sv[2], zv[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int rr = 16 * hr + 8 * h + gq;
                    q[h] = *(const uint4 *)(wp + ((2 * hr + h) * 32 + lane) * 16);
                    sv[h] = *(const uint16_t *)(st + C::SC + (bl * GPS + gl) * 64 + rr * 2);
                    zv[h] = st[C::ZR + (bl * GPS + gl) * 32 + rr];
                }
                w4wg__dequant(A[b], q, sv, zv);
                mma_wg_fence();
#pragma unroll
                for (int k = 0; k < 8; k++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
                        w4wg__mma(acc[m][j], A[b][k],
                                  w4wg__desc(sta + (j * GPS + gl) * W4WG__TILE_B + (k >> 2) * 8192 +
                                             (k & 3) * 32));
                mma_wg_commit();
            }
        }
        mma_wg_wait<0>(); /* the stage's wgmma are done with its shared memory */
#pragma unroll
        for (int b = 0; b < NB; b++)
            w4wg__keep(A[b]);
        __syncwarp();
        if (lane == 0)
            mma_bar_arrive(bars + 8 * (NS + s));
    }
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 32; e++)
                asm volatile("" : "+f"(acc[m][j][e])::"memory");

    if (cl) { /* the splits' sums added across the cluster (the file's comment) */
        /* every consumer warp is done with the ring (the producer copies nothing more) */
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        float *red = (float *)smg; /* red[t][r]: token t < 64 NT of the tile, row r < R */
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const int rb = (cw * MT + m) * 64 + 16 * wq + gq;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int c8 = 0; c8 < 8; c8++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            red[(j * 64 + 8 * c8 + 2 * tq + e) * C::RP + rb + 8 * h] =
                                acc[m][j][4 * c8 + 2 * h + e];
        }
        kutil_cluster_sync();
        /* this block's tokens of the tile: [t0, t1) of its nt, every row, 4 rows per thread
         * step; rows past N come in whole runs of 32 (N % 32 == 0) */
        const int S = (int)gridDim.z, z = (int)blockIdx.z;
        const int nt = min(64 * NT, n - tile0 * 64), t0 = z * nt / S, t1 = (z + 1) * nt / S;
        const int R4 = C::R / 4;
        float *o = W4WG__PICK(sg.out, seg);
        for (int idx = threadIdx.x; idx < (t1 - t0) * R4; idx += 256) {
            const int t = t0 + idx / R4, r = 4 * (idx % R4);
            if (row0 + r >= N)
                continue;
            const float4 v = kutil_cluster_sum4(sm0 + (uint32_t)(t * C::RP + r) * 4u, S);
            const int tg = tile0 * 64 + t;
            const float mu = mult[tg];
            *(float4 *)(o + (size_t)tg * ld + row0 + r) =
                make_float4(v.x * mu, v.y * mu, v.z * mu, v.w * mu);
        }
        kutil_cluster_sync(); /* the others may still read this block's sums */
        return;
    }
    float *o = W4WG__PICK(sg.out, seg) + (size_t)blockIdx.z * n * ld;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const int64_t rb = row0 + (cw * MT + m) * 64 + 16 * wq + gq;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c8 = 0; c8 < 8; c8++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int t = (tile0 + j) * 64 + 8 * c8 + 2 * tq + e;
                    if (t >= n)
                        continue;
                    const float mu = mult[t];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int64_t row = rb + 8 * h;
                        if (row < N)
                            o[(size_t)t * ld + row] = acc[m][j][4 * c8 + 2 * h + e] * mu;
                    }
                }
    }
#else
    __trap(); /* not built for sm_90a: matmul_w4wg_usable() said no */
#endif
}

/* ---- launchers ---- */

extern "C" bool matmul_w4wg_usable(void)
{
#ifdef PD_CUDA_HAVE_SM90A
    return kutil_device_cc() == 90;
#else
    return false;
#endif
}

extern "C" size_t matmul_w4wg_act_bytes(int n, int64_t K)
{
    return (size_t)((n + 63) / 64) * 64 * (size_t)K * 2;
}

extern "C" pd_status_t matmul_quant_act_f16wg(uint16_t *xw, float *mult, const float *x, int n,
                                              int64_t K, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && K > 0 && K % 128 == 0 && ((uintptr_t)xw & 15) == 0,
                  "matmul_quant_act_f16wg");
    if (n == 0)
        return PD_OK;
    /* one block per row: its two passes over the row (amax, then the conversion) are serial
     * loops of K / (4 threads) and K / (8 threads) loads; more threads for long rows (session
     * 11: K 14336 with 256 threads was 14 + 7 dependent steps per thread) */
    static int env_threads = -1; /* PD_CUDA_F16WG_THREADS=N: N threads (A / B measurements) */
    if (env_threads < 0) {
        const char *e = getenv("PD_CUDA_F16WG_THREADS");
        const int v = e ? atoi(e) : 0;
        env_threads = v >= 32 && v <= 1024 && v % 32 == 0 ? v : 0;
    }
    const unsigned threads = env_threads ? (unsigned)env_threads : K >= 8192 ? 1024u : 512u;
    kutil_launch_pdl(matmul__quant_act_f16wg, dim3((unsigned)((n + 63) / 64 * 64)), dim3(threads),
                     0, stream, (uint4 *)xw, mult, x, n, K);
    return KUTIL_LAUNCHED("matmul_quant_act_f16wg");
}

/* The dynamic shared memory of a configuration's kernel, allowed on the current device once; < 0
 * if it cannot be (the error is reported by the caller's KUTIL_LAUNCHED) */
template <int MT, int NT, int GPS, int NS> static int w4wg__smem(void)
{
    using C = w4wg__cfg<MT, NT, GPS>;
    const int smem = NS * C::STAGE + 1024 + 16 * NS;
    static unsigned attr; /* per device (kutil_allow_smem) */
    if (kutil_allow_smem((const void *)matmul__w4wg<MT, NT, GPS, NS>, smem, &attr, "w4wg smem") !=
        PD_OK)
        return -1;
    return smem;
}

/* Blocks of a configuration's kernel in clusters of S that the current device runs at once
 * (kutil_cluster_wave); 0 if unknown. */
template <int MT, int NT, int GPS, int NS> static int w4wg__clusters(int S)
{
    const int smem = w4wg__smem<MT, NT, GPS, NS>();
    return smem < 0 ? 0
                    : kutil_cluster_wave((const void *)matmul__w4wg<MT, NT, GPS, NS>, W4WG__THREADS,
                                         (size_t)smem, S);
}

/* The configurations (matmul.h: cfg): 0 = MT 2, NT 1 (256 rows x 64 tokens, 2 groups per
 * stage, 3 stages), 1 = MT 1, NT 2 (128 x 128, 1 group, 4 stages), 2 = MT 1, NT 4 (128 x 256,
 * 1 group, 3 stages). */
#define W4WG__CONFIGS(X)                                                                           \
    X(0, 2, 1, 2, 3)                                                                               \
    X(1, 1, 2, 1, 4)                                                                               \
    X(2, 1, 4, 1, 3)

/* blocks of configuration cfg in clusters of S (> 1) that run at once (one wave), remembered per
 * process (the devices of one process are of one kind); 0 if unknown */
static int w4wg__cluster_wave(int cfg, int S)
{
    static int wave[3][MATMUL_W4WG_MAX_CLUSTER + 1]; /* kutil_memo */
    if (cfg < 0 || cfg > 2 || S < 2 || S > MATMUL_W4WG_MAX_CLUSTER)
        return 0;
    return kutil_memo(&wave[cfg][S], [cfg, S]() {
        int c = 0;
#define W4WG__ASK(id, MT, NT, GPS, NS)                                                             \
    if (cfg == id)                                                                                 \
        c = w4wg__clusters<MT, NT, GPS, NS>(S);
        W4WG__CONFIGS(W4WG__ASK)
#undef W4WG__ASK
        return c;
    });
}

template <int MT, int NT, int GPS, int NS>
static void w4wg__launch(float *const *outs, float *part, const uint16_t *xw, const float *mult,
                         const pd_weight_t *const *ws, int count, int n, int splits, int gps,
                         bool cl, cudaStream_t stream)
{
    using C = w4wg__cfg<MT, NT, GPS>;
    w4wg__segs sg = {};
    int64_t off = 0, Nt = 0;
    for (int i = 0; i < count; i++)
        Nt += ws[i]->n;
    for (int i = 0; i < MATMUL_GROUP_MAX; i++) {
        const pd_weight_t *w = ws[i < count ? i : count - 1];
        sg.wd[i] = (const uint8_t *)w->data;
        sg.wsc[i] = (const uint16_t *)w->scales;
        sg.wz[i] = (const uint8_t *)w->zeros;
        sg.N[i] = w->n;
        const bool direct = splits == 1 || cl; /* the kernel writes the outputs */
        sg.out[i] = direct ? outs[i < count ? i : count - 1] : part + off;
        sg.ld[i] = direct ? w->n : Nt;
        sg.rb[i] = (i > 0 ? sg.rb[i - 1] : 0) + (i < count ? (int)((w->n + C::R - 1) / C::R) : 0);
        off += i < count ? w->n : 0;
    }
    const int smem = w4wg__smem<MT, NT, GPS, NS>();
    if (smem < 0)
        return; /* the caller's KUTIL_LAUNCHED reports the error */
    const dim3 grid((unsigned)((n + 64 * NT - 1) / (64 * NT)), (unsigned)sg.rb[count - 1],
                    (unsigned)splits);
    kutil_launch_pdl_cluster(matmul__w4wg<MT, NT, GPS, NS>, grid, dim3(W4WG__THREADS), (size_t)smem,
                             stream, cl ? (unsigned)splits : 1u, sg, (const uint8_t *)xw, mult, n,
                             ws[0]->k, gps, cl ? 1 : 0);
}

static int w4wg__rows(int cfg)
{
    return cfg == 0 ? 256 : 128;
}
static int w4wg__tokens(int cfg)
{
    return cfg == 0 ? 64 : cfg == 1 ? 128 : 256;
}

/* The split count for cfg at (n, N, K) on n_sm SMs: the fewest waves of blocks times the groups
 * each block walks (plus a fixed cost of ~3 groups per block: fill and epilogue), and the cost of
 * adding the splits in the same units (one group ~0.5 us): without clusters the partial sums'
 * extra launch and pass, (S + 1) n N f32 at ~3 TB/s; with them (S <= MATMUL_W4WG_MAX_CLUSTER)
 * the two cluster barriers and the reads through distributed shared memory (~1 us), a wave then
 * holding only the clusters that fit the GPCs (cudaOccupancyMaxActiveClusters). */
extern "C" void matmul_w4wg_plan(int n, int64_t N, int64_t K, int n_sm, bool cluster, int *cfg_p,
                                 int *splits_p)
{
    const int cfg = n <= 64 ? 0 : n <= 128 ? 1 : 2;
    const int64_t ng = K / 128;
    const int64_t blocks = (N + w4wg__rows(cfg) - 1) / w4wg__rows(cfg) *
                           ((n + w4wg__tokens(cfg) - 1) / w4wg__tokens(cfg));
    const double grp_us = cfg == 0 ? 0.6 : cfg == 1 ? 0.6 : 1.1;
    const int max_s = cluster ? MATMUL_W4WG_MAX_CLUSTER : 16;
    double best = 1e30;
    int bs = 1;
    for (int S = 1; S <= max_s && S <= ng; S++) {
        const int64_t gps = (ng + S - 1) / S;
        if (!kutil_splits_full(ng, S))
            continue;
        int64_t wave = n_sm > 0 ? n_sm : 1;
        if (cluster && S > 1) {
            wave = w4wg__cluster_wave(cfg, S);
            if (wave <= 0)
                continue;
        }
        const int64_t waves = (blocks * S + wave - 1) / wave;
        double t = (double)waves * (double)(gps + 3) * grp_us;
        if (S > 1)
            t += cluster ? 1.0 : 3.0 + (double)(S + 1) * n * N * 4 / 3e12 * 1e6;
        if (t < best - 1e-9)
            best = t, bs = S;
    }
    *cfg_p = cfg;
    *splits_p = bs;
}

/* Where matmul__w4wg_sum_group puts the sums: segment i's outputs out[i] (n, N[i]), its columns
 * [off[i], off[i] + N[i]) of the partial sums (entries past the group: off = the total, never
 * chosen). */
struct w4wg__sums {
    float *out[MATMUL_GROUP_MAX];
    int64_t N[MATMUL_GROUP_MAX], off[MATMUL_GROUP_MAX];
};

/* grid-stride over the (n, Nt) elements of the partial sums part (S, n, Nt): out[i] (n, N[i]) =
 * their sum over the splits in order, segment i at columns [off[i], off[i] + N[i]) */
static __global__ void matmul__w4wg_sum_group(const w4wg__sums sg, const float *part, int S, int n,
                                              int64_t Nt)
{
    kutil_pdl_wait(); /* PDL-launched (kutil.cuh): part and the outputs belong to the kernels */
    kutil_pdl_trigger();
    const size_t total = (size_t)n * (size_t)Nt;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const int64_t t = (int64_t)(e / (size_t)Nt), col = (int64_t)(e % (size_t)Nt);
        float v = part[e];
        for (int z = 1; z < S; z++)
            v += part[(size_t)z * total + e];
        const int i = col < sg.off[1] ? 0 : col < sg.off[2] ? 1 : 2;
        W4WG__PICK(sg.out, i)[t * W4WG__PICK(sg.N, i) + (col - W4WG__PICK(sg.off, i))] = v;
    }
}

extern "C" pd_status_t matmul_w4wg_group(float *const *outs, float *part, const uint16_t *xw,
                                         const float *mult, const pd_weight_t *const *ws, int count,
                                         int n, int cfg, int splits, bool cluster,
                                         cudaStream_t stream)
{
    KUTIL_REQUIRE(count >= 1 && count <= MATMUL_GROUP_MAX && outs && ws, "matmul_w4wg");
    int64_t Nt = 0;
    for (int i = 0; i < count; i++) {
        const pd_weight_t *w = ws[i];
        KUTIL_REQUIRE(w->fmt == PD_WFMT_INT4 && w->k == ws[0]->k && w->k % 128 == 0 && w->n > 0 &&
                          w->n % 32 == 0 && outs[i] && (!cluster || ((uintptr_t)outs[i] & 15) == 0),
                      "matmul_w4wg");
        Nt += w->n;
    }
    KUTIL_REQUIRE(n >= 0 && n <= MATMUL_W4WG_MAX_N && cfg >= 0 && cfg <= 2 && splits >= 1 &&
                      (cluster ? splits <= MATMUL_W4WG_MAX_CLUSTER : splits == 1 || part),
                  "matmul_w4wg");
    if (!matmul_w4wg_usable())
        return PD_ERR_UNSUPPORTED;
    if (n == 0)
        return PD_OK;
    const int ng = (int)(ws[0]->k / 128), gps = (ng + splits - 1) / splits;
    KUTIL_REQUIRE(kutil_splits_full(ng, splits), "matmul_w4wg splits");
    const bool cl = cluster && splits > 1;
#define W4WG__LAUNCH(id, MT, NT, GPS, NS)                                                          \
    if (cfg == id)                                                                                 \
        w4wg__launch<MT, NT, GPS, NS>(outs, part, xw, mult, ws, count, n, splits, gps, cl, stream);
    W4WG__CONFIGS(W4WG__LAUNCH)
#undef W4WG__LAUNCH
    pd_status_t st = KUTIL_LAUNCHED("matmul_w4wg");
    if (st != PD_OK || splits == 1 || cl)
        return st;
    if (count == 1)
        return matmul_sum_parts(outs[0], part, splits, (size_t)n * (size_t)Nt, stream);
    w4wg__sums sg = {};
    int64_t off = 0;
    for (int i = 0; i < MATMUL_GROUP_MAX; i++) {
        const int j = i < count ? i : count - 1;
        sg.out[i] = outs[j];
        sg.N[i] = ws[j]->n;
        sg.off[i] = i < count ? off : Nt;
        off += i < count ? ws[i]->n : 0;
    }
    const size_t total = (size_t)n * (size_t)Nt;
    const unsigned blocks = (unsigned)((total + 255) / 256 < 1024 ? (total + 255) / 256 : 1024);
    kutil_launch_pdl(matmul__w4wg_sum_group, dim3(blocks), dim3(256), 0, stream, sg,
                     (const float *)part, splits, n, Nt);
    return KUTIL_LAUNCHED("matmul_w4wg sum");
}

extern "C" pd_status_t matmul_w4wg(float *out, float *part, const uint16_t *xw, const float *mult,
                                   const pd_weight_t *w, int n, int cfg, int splits, bool cluster,
                                   cudaStream_t stream)
{
    return matmul_w4wg_group(&out, part, xw, mult, &w, 1, n, cfg, splits, cluster, stream);
}
