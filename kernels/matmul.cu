/* matmul: GEMV kernels for every weight format, activation quantization and splitting, the FP8
 * epilogue, INT4 dequantization, and the cuBLAS / cuBLASLt GEMM calls (see matmul.h). */
#include <cublasLt.h>
#include <cublas_v2.h>

#include "kutil.cuh"
#include "matmul.h"

/* ==== kernels ==== */

/* grid (n), block 256: xq (n, k) fp8 (or NULL), xf (n, k) f32 = the fp8 values decoded, unscaled
 * (or NULL), xs (n) f32, x (n, k) f32 */
static __global__ void matmul__quant_act_fp8(uint8_t *xq, float *xf, float *xs, const float *x,
                                             int64_t k)
{
    __shared__ float red[32];
    const float *xi = x + blockIdx.x * k;
    float amax = 0.0f;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x)
        amax = fmaxf(amax, fabsf(xi[j]));
    amax = kutil_block_max(amax, red);
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    const float inv = 1.0f / scale;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
        const uint8_t q = kutil_f32_to_fp8(xi[j] * inv);
        if (xq)
            xq[blockIdx.x * k + j] = q;
        if (xf)
            xf[blockIdx.x * k + j] = kutil_fp8_to_f32(q);
    }
    if (threadIdx.x == 0)
        xs[blockIdx.x] = scale;
}

/* hi, lo (total) bf16, x (total) f32 */
static __global__ void matmul__split_bf16(uint16_t *hi, uint16_t *lo, const float *x, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        const uint16_t h = kutil_f32_to_bf16(v);
        hi[i] = h;
        if (lo)
            lo[i] = kutil_f32_to_bf16(v - kutil_bf16_to_f32(h));
    }
}

enum { MATMUL__BF16 = 0, MATMUL__FP8, MATMUL__INT4, MATMUL__F32 };

/* GEMV tiling: a warp computes MATMUL__ROWS output rows; each lane reads 8 consecutive weights
 * of each row per step (4 bytes int4, 8 fp8, 16 bf16, 32 f32), so that the activations it loads
 * (two float4, shared by the rows) stay few per weight byte. */
#define MATMUL__ROWS 4
#define MATMUL__E 8

/* Bytes of one row of W (n, K) in FMT. */
template <int FMT> static __device__ __forceinline__ size_t matmul__row_bytes(int64_t K)
{
    return FMT == MATMUL__BF16   ? K * 2
           : FMT == MATMUL__FP8  ? K
           : FMT == MATMUL__INT4 ? K / 2
                                 : K * 4;
}

/* Loads and decodes weights [e0, e0 + 8) of a row starting at wrow into w (8) f32: bf16 and f32
 * exactly; fp8 times 2^-120 (its bits placed in an f32: sign to bit 31, exponent and mantissa to
 * bits 20..26, subnormals included; the caller multiplies 2^120 back); int4 as q - z, computed as
 * (2^23 + q) - (2^23 + z) (the caller applies the group scale). */
template <int FMT>
static __device__ __forceinline__ void matmul__load_w(float *w, const uint8_t *wrow, int64_t e0,
                                                      float zf)
{
    if (FMT == MATMUL__BF16) {
        const uint4 raw = __ldg((const uint4 *)(wrow + e0 * 2));
        const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = __uint_as_float(u[i] << 16);
            w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    } else if (FMT == MATMUL__FP8) {
        const uint2 raw = __ldg((const uint2 *)(wrow + e0));
        const uint32_t u[2] = {raw.x, raw.y};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t b = u[i / 4] >> (8 * (i % 4));
            w[i] = __uint_as_float(((b & 0x7fu) << 20) | ((b & 0x80u) << 24));
        }
    } else if (FMT == MATMUL__INT4) {
        const uint32_t u = __ldg((const uint32_t *)(wrow + e0 / 2));
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i] = __uint_as_float(((u >> (4 * i)) & 15u) | 0x4b000000u) - zf;
    } else {
        const float4 a = __ldg((const float4 *)(wrow + e0 * 4)),
                     c = __ldg((const float4 *)(wrow + e0 * 4 + 16));
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = c.x, w[5] = c.y, w[6] = c.z,
        w[7] = c.w;
    }
}

/* grid (ceil(n / NT), ceil(N / (8 * MATMUL__ROWS))), block 256 (8 warps).
 * out (n, N) f32; x (n, K) f32 (FP8: the fp8-quantized activations decoded, unscaled), xs (n) f32
 * activation scales (FP8 only); wd: W data in FMT's layout, wsc: fp8 (N) f32 / int4 (N, K/128)
 * bf16 scales, wz: int4 (N, K/128) zeros. */
template <int FMT, int NT>
static __global__ void __launch_bounds__(256)
    matmul__gemv(float *out, const float *x, const float *xs, const uint8_t *wd, const void *wsc,
                 const uint8_t *wz, int n, int64_t N, int64_t K)
{
    constexpr int R = MATMUL__ROWS, E = MATMUL__E;
    const int lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.y * 8 + (threadIdx.x >> 5)) * R;
    const int t0 = blockIdx.x * NT;
    if (r0 >= N)
        return;
    const size_t rb = matmul__row_bytes<FMT>(K);
    const int64_t ng = K / 128;
    int64_t rr[R];
#pragma unroll
    for (int j = 0; j < R; j++)
        rr[j] = r0 + j < N ? r0 + j : N - 1; /* rows past N compute a copy, never stored */
    float acc[R][NT];
#pragma unroll
    for (int j = 0; j < R; j++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[j][t] = 0.0f;

#pragma unroll 2
    for (int64_t e0 = (int64_t)lane * E; e0 < K; e0 += 32 * E) {
        float w[R][E], gs[R];
#pragma unroll
        for (int j = 0; j < R; j++) {
            float zf = 0.0f;
            gs[j] = 1.0f;
            if (FMT == MATMUL__INT4) {
                gs[j] = kutil_bf16_to_f32(((const uint16_t *)wsc)[rr[j] * ng + e0 / 128]);
                zf = 8388608.0f + (float)wz[rr[j] * ng + e0 / 128];
            }
            matmul__load_w<FMT>(w[j], wd + rr[j] * rb, e0, zf);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t0 + t >= n)
                break;
            const float4 *xv = (const float4 *)(x + (size_t)(t0 + t) * K + e0);
            const float4 xa = __ldg(xv), xb = __ldg(xv + 1);
#pragma unroll
            for (int j = 0; j < R; j++) {
                const float a = xa.x * w[j][0] + xa.y * w[j][1] + xa.z * w[j][2] + xa.w * w[j][3] +
                                xb.x * w[j][4] + xb.y * w[j][5] + xb.z * w[j][6] + xb.w * w[j][7];
                acc[j][t] += FMT == MATMUL__INT4 ? a * gs[j] : a;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < R; j++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = kutil_warp_sum(acc[j][t]);
            if (lane == 0 && t0 + t < n && r0 + j < N) {
                if (FMT == MATMUL__FP8) /* 2^120 undoes the raw placement of the weight bits */
                    out[(size_t)(t0 + t) * N + r0 + j] =
                        v * 0x1p120f * xs[t0 + t] * ((const float *)wsc)[r0 + j];
                else
                    out[(size_t)(t0 + t) * N + r0 + j] = v;
            }
        }
}

/* INT4 GEMV: each lane reads 32 weights (16 bytes, one group) of a row per step; the activations
 * are staged per 4096-column chunk in shared memory, swizzled at 16-byte granularity (chunk
 * c stored at c ^ ((c >> 3) & 7)) so that lanes reading 128 bytes apart hit distinct banks. */
#define MATMUL__KC 4096

static __device__ __forceinline__ int matmul__swz(int c)
{
    return c ^ ((c >> 3) & 7);
}

/* grid (ceil(n / NT), ceil(N / (8 * MATMUL__ROWS))), block 256, dynamic shared memory
 * NT * MATMUL__KC f32. out (n, N) f32; x (n, K) f32; wd (N, K/2) int4 pairs, wsc (N, K/128) bf16,
 * wz (N, K/128) uint8. */
template <int NT>
static __global__ void __launch_bounds__(256)
    matmul__gemv_int4(float *out, const float *x, const uint8_t *wd, const uint16_t *wsc,
                      const uint8_t *wz, int n, int64_t N, int64_t K)
{
    constexpr int R = MATMUL__ROWS;
    extern __shared__ float4 matmul__xs[]; /* (NT, MATMUL__KC / 4) float4, swizzled */
    const int lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.y * 8 + (threadIdx.x >> 5)) * R;
    const int t0 = blockIdx.x * NT, ntok = min(NT, n - t0);
    const int64_t ng = K / 128;
    int64_t rr[R];
#pragma unroll
    for (int j = 0; j < R; j++)
        rr[j] = r0 + j < N ? r0 + j : N - 1;
    float acc[R][NT];
#pragma unroll
    for (int j = 0; j < R; j++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[j][t] = 0.0f;

    for (int64_t c0 = 0; c0 < K; c0 += MATMUL__KC) {
        const int kc4 = (int)min((int64_t)MATMUL__KC, K - c0) / 4;
        __syncthreads();
        for (int i = threadIdx.x; i < NT * kc4; i += blockDim.x) {
            const int t = i / kc4, c = i % kc4;
            matmul__xs[t * (MATMUL__KC / 4) + matmul__swz(c)] =
                t < ntok ? __ldg((const float4 *)(x + (size_t)(t0 + t) * K + c0) + c)
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        __syncthreads();
        if (r0 >= N)
            continue;
        for (int e = lane * 32; e < kc4 * 4; e += 32 * 32) {
            const int64_t ek = c0 + e;
            uint4 raw[R];
            float gs[R], zf[R];
#pragma unroll
            for (int j = 0; j < R; j++) {
                raw[j] = __ldg((const uint4 *)(wd + rr[j] * (K / 2) + ek / 2));
                gs[j] = kutil_bf16_to_f32(wsc[rr[j] * ng + ek / 128]);
                zf[j] = 8388608.0f + (float)wz[rr[j] * ng + ek / 128];
            }
            float part[R][NT];
#pragma unroll
            for (int j = 0; j < R; j++)
#pragma unroll
                for (int t = 0; t < NT; t++)
                    part[j][t] = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) { /* elements 4i .. 4i + 3 of the 32 */
                float4 xv[NT];
#pragma unroll
                for (int t = 0; t < NT; t++)
                    xv[t] = matmul__xs[t * (MATMUL__KC / 4) + matmul__swz(e / 4 + i)];
#pragma unroll
                for (int j = 0; j < R; j++) {
                    const uint32_t word = i < 2   ? raw[j].x
                                          : i < 4 ? raw[j].y
                                          : i < 6 ? raw[j].z
                                                  : raw[j].w;
                    const uint32_t h = word >> (16 * (i & 1));
                    float w[4];
#pragma unroll
                    for (int m = 0; m < 4; m++)
                        w[m] = __uint_as_float(((h >> (4 * m)) & 15u) | 0x4b000000u) - zf[j];
#pragma unroll
                    for (int t = 0; t < NT; t++)
                        part[j][t] +=
                            xv[t].x * w[0] + xv[t].y * w[1] + xv[t].z * w[2] + xv[t].w * w[3];
                }
            }
#pragma unroll
            for (int j = 0; j < R; j++)
#pragma unroll
                for (int t = 0; t < NT; t++)
                    acc[j][t] += part[j][t] * gs[j];
        }
    }
    if (r0 >= N)
        return;
#pragma unroll
    for (int j = 0; j < R; j++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = kutil_warp_sum(acc[j][t]);
            if (lane == 0 && t < ntok && r0 + j < N)
                out[(size_t)(t0 + t) * N + r0 + j] = v;
        }
}

/* grid-stride over 16-byte chunks of (N, K/2): dst (N, K) bf16, q (N, K/2) int4 pairs, scales
 * (N, K/128) bf16, zeros (N, K/128) uint8. A chunk (32 weights) lies inside one group. */
static __global__ void matmul__int4_to_bf16(uint4 *dst, const uint4 *q, const uint16_t *scales,
                                            const uint8_t *zeros, int64_t N, int64_t K)
{
    const size_t total = (size_t)N * K / 32;
    const int64_t ng = K / 128;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int64_t r = i / (K / 32), g = (i % (K / 32)) * 32 / 128;
        const float s = kutil_bf16_to_f32(scales[r * ng + g]);
        const int z = zeros[r * ng + g];
        const uint4 raw = q[i];
        const uint32_t word[4] = {raw.x, raw.y, raw.z, raw.w};
        uint32_t o[16];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t b = word[j / 4] >> (8 * (j % 4));
            const float a = (float)((int)(b & 15u) - z) * s,
                        c = (float)((int)((b >> 4) & 15u) - z) * s;
            o[j] = (uint32_t)kutil_f32_to_bf16(a) | ((uint32_t)kutil_f32_to_bf16(c) << 16);
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            dst[i * 4 + j] = make_uint4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
    }
}

/* out (n, N) f32 *= xs (n) f32 [row] * ws (N) f32 [column] */
static __global__ void matmul__fp8_scale(float *out, const float *xs, const float *ws, int n,
                                         int64_t N)
{
    const size_t total = (size_t)n * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = out[i] * xs[i / N] * ws[i % N];
}

/* ==== launchers ==== */

static unsigned matmul__grid(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 1 ? 1 : g > 132 * 64 ? 132 * 64 : g);
}

extern "C" pd_status_t matmul_quant_act_fp8(uint8_t *xq, float *xf, float *xs, const float *x,
                                            int n, int64_t k, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && k > 0 && (xq || xf), "matmul_quant_act_fp8");
    if (n == 0)
        return PD_OK;
    matmul__quant_act_fp8<<<n, 256, 0, stream>>>(xq, xf, xs, x, k);
    return KUTIL_LAUNCHED("matmul_quant_act_fp8");
}

extern "C" pd_status_t matmul_split_bf16(uint16_t *hi, uint16_t *lo, const float *x, int n,
                                         int64_t k, cudaStream_t stream)
{
    const size_t total = (size_t)n * (size_t)k;
    KUTIL_REQUIRE(n >= 0 && k > 0, "matmul_split_bf16");
    if (total == 0)
        return PD_OK;
    matmul__split_bf16<<<matmul__grid(total, 256), 256, 0, stream>>>(hi, lo, x, total);
    return KUTIL_LAUNCHED("matmul_split_bf16");
}

template <int NT>
static void matmul__gemv_int4_launch(float *out, const float *x, const pd_weight_t *w, int n,
                                     cudaStream_t stream)
{
    static bool attr_set;
    const size_t smem = (size_t)NT * MATMUL__KC * sizeof(float);
    if (!attr_set) {
        cudaFuncSetAttribute(matmul__gemv_int4<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem);
        attr_set = true;
    }
    const dim3 grid((unsigned)((n + NT - 1) / NT),
                    (unsigned)((w->n + 8 * MATMUL__ROWS - 1) / (8 * MATMUL__ROWS)));
    matmul__gemv_int4<NT><<<grid, 256, smem, stream>>>(out, x, (const uint8_t *)w->data,
                                                       (const uint16_t *)w->scales,
                                                       (const uint8_t *)w->zeros, n, w->n, w->k);
}

template <int FMT>
static void matmul__gemv_launch(float *out, const float *x, const float *xs, const pd_weight_t *w,
                                int n, cudaStream_t stream)
{
    const int nt = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
    if (FMT == MATMUL__INT4) {
        if (nt == 1)
            matmul__gemv_int4_launch<1>(out, x, w, n, stream);
        else if (nt == 2)
            matmul__gemv_int4_launch<2>(out, x, w, n, stream);
        else if (nt == 4)
            matmul__gemv_int4_launch<4>(out, x, w, n, stream);
        else
            matmul__gemv_int4_launch<8>(out, x, w, n, stream);
        return;
    }
    const dim3 grid((unsigned)((n + nt - 1) / nt),
                    (unsigned)((w->n + 8 * MATMUL__ROWS - 1) / (8 * MATMUL__ROWS)));
    const uint8_t *wd = (const uint8_t *)w->data, *wz = (const uint8_t *)w->zeros;
    switch (nt) {
    case 1:
        matmul__gemv<FMT, 1>
            <<<grid, 256, 0, stream>>>(out, x, xs, wd, w->scales, wz, n, w->n, w->k);
        break;
    case 2:
        matmul__gemv<FMT, 2>
            <<<grid, 256, 0, stream>>>(out, x, xs, wd, w->scales, wz, n, w->n, w->k);
        break;
    case 4:
        matmul__gemv<FMT, 4>
            <<<grid, 256, 0, stream>>>(out, x, xs, wd, w->scales, wz, n, w->n, w->k);
        break;
    default:
        matmul__gemv<FMT, 8>
            <<<grid, 256, 0, stream>>>(out, x, xs, wd, w->scales, wz, n, w->n, w->k);
    }
}

extern "C" pd_status_t matmul_gemv(float *out, const float *x, const float *xs,
                                   const pd_weight_t *w, int n, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && n <= MATMUL_GEMV_MAX_N && w->n > 0 && w->k > 0, "matmul_gemv");
    KUTIL_REQUIRE(w->n / (8 * MATMUL__ROWS) < 65535, "matmul_gemv");
    if (n == 0)
        return PD_OK;
    switch (w->fmt) {
    case PD_WFMT_BF16:
        KUTIL_REQUIRE(w->k % 8 == 0, "matmul_gemv bf16");
        matmul__gemv_launch<MATMUL__BF16>(out, x, xs, w, n, stream);
        break;
    case PD_WFMT_FP8:
        KUTIL_REQUIRE(w->k % 16 == 0 && xs, "matmul_gemv fp8");
        matmul__gemv_launch<MATMUL__FP8>(out, x, xs, w, n, stream);
        break;
    case PD_WFMT_INT4:
        KUTIL_REQUIRE(w->k % 128 == 0, "matmul_gemv int4");
        matmul__gemv_launch<MATMUL__INT4>(out, x, xs, w, n, stream);
        break;
    case PD_WFMT_F32:
        KUTIL_REQUIRE(w->k % 8 == 0, "matmul_gemv f32");
        matmul__gemv_launch<MATMUL__F32>(out, x, xs, w, n, stream);
        break;
    default:
        return PD_ERR_INVALID;
    }
    return KUTIL_LAUNCHED("matmul_gemv");
}

extern "C" pd_status_t matmul_int4_to_bf16(uint16_t *dst, const pd_weight_t *w, cudaStream_t stream)
{
    KUTIL_REQUIRE(w->fmt == PD_WFMT_INT4 && w->k % 128 == 0 && w->n > 0, "matmul_int4_to_bf16");
    const size_t total = (size_t)w->n * (size_t)w->k / 32;
    matmul__int4_to_bf16<<<matmul__grid(total, 256), 256, 0, stream>>>(
        (uint4 *)dst, (const uint4 *)w->data, (const uint16_t *)w->scales,
        (const uint8_t *)w->zeros, w->n, w->k);
    return KUTIL_LAUNCHED("matmul_int4_to_bf16");
}

static pd_status_t matmul__blas_status(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return PD_OK;
    pd_log_error("%s: cublas status %d", what, (int)s);
    return PD_ERR_CUDA;
}

extern "C" pd_status_t matmul_gemm_bf16(void *blas, float *out, const uint16_t *hi,
                                        const uint16_t *lo, const uint16_t *w, int n, int64_t N,
                                        int64_t K, cudaStream_t stream)
{
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = (cublasHandle_t)blas;
    KUTIL_REQUIRE(n > 0 && N > 0 && K > 0 && N < INT32_MAX && K < INT32_MAX, "matmul_gemm_bf16");
    cublasSetStream(h, stream);
    /* column-major: out^T (N, n) = W (K, N)^T @ x^T (K, n) */
    cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, n, (int)K, &one, w,
                                    CUDA_R_16BF, (int)K, hi, CUDA_R_16BF, (int)K, &zero, out,
                                    CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s == CUBLAS_STATUS_SUCCESS && lo)
        s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, n, (int)K, &one, w, CUDA_R_16BF,
                         (int)K, lo, CUDA_R_16BF, (int)K, &one, out, CUDA_R_32F, (int)N,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return matmul__blas_status(s, "matmul_gemm_bf16");
}

extern "C" pd_status_t matmul_gemm_f32(void *blas, float *out, const float *x, const float *w,
                                       int n, int64_t N, int64_t K, cudaStream_t stream)
{
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = (cublasHandle_t)blas;
    KUTIL_REQUIRE(n > 0 && N > 0 && K > 0 && N < INT32_MAX && K < INT32_MAX, "matmul_gemm_f32");
    cublasSetStream(h, stream);
    return matmul__blas_status(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, n, (int)K, &one, w,
                                           (int)K, x, (int)K, &zero, out, (int)N),
                               "matmul_gemm_f32");
}

extern "C" pd_status_t matmul_gemm_fp8(void *lt, void *ws, size_t ws_bytes, float *out,
                                       const uint8_t *xq, const uint8_t *w, int n, int64_t N,
                                       int64_t K, cudaStream_t stream)
{
    cublasLtHandle_t h = (cublasLtHandle_t)lt;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const float one = 1.0f, zero = 0.0f;
    int found = 0;
    cublasStatus_t s;

    KUTIL_REQUIRE(n > 0 && N > 0 && K > 0 && K % 16 == 0 && N % 16 == 0, "matmul_gemm_fp8");
    s = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)N, K);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)n, K);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)N, (uint64_t)n, N);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceCreate(&pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws_bytes, sizeof ws_bytes);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &heur, &found);
    if (s == CUBLAS_STATUS_SUCCESS && found == 0)
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(h, op, &one, w, la, xq, lb, &zero, out, lc, out, lc, &heur.algo, ws,
                           ws_bytes, stream);
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (op)
        cublasLtMatmulDescDestroy(op);
    return matmul__blas_status(s, "matmul_gemm_fp8");
}

extern "C" pd_status_t matmul_gemm_fp8_scaled(void *lt, void *ws, size_t ws_bytes, float *out,
                                              const uint8_t *xq, const float *xs, const uint8_t *w,
                                              const float *wscale, int n, int64_t N, int64_t K,
                                              cudaStream_t stream)
{
    cublasLtHandle_t h = (cublasLtHandle_t)lt;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    /* cuBLAS sees column-major D (N, n) = A^T (N, K) B (K, n): A = W with its N row scales,
     * B = the activations with their n token scales */
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const float one = 1.0f, zero = 0.0f;
    int found = 0;
    cublasStatus_t s;

    KUTIL_REQUIRE(n > 0 && N > 0 && K > 0 && K % 16 == 0 && N % 16 == 0, "matmul_gemm_fp8_scaled");
    s = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                           sizeof mode);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                                           sizeof mode);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wscale,
                                           sizeof wscale);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs,
                                           sizeof xs);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)N, K);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)n, K);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)N, (uint64_t)n, N);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceCreate(&pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws_bytes, sizeof ws_bytes);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &heur, &found);
    if (s == CUBLAS_STATUS_SUCCESS && found == 0)
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(h, op, &one, w, la, xq, lb, &zero, out, lc, out, lc, &heur.algo, ws,
                           ws_bytes, stream);
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (op)
        cublasLtMatmulDescDestroy(op);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE)
        return PD_ERR_UNSUPPORTED; /* this cuBLASLt or GPU has no outer-vector fp8 scaling */
    return matmul__blas_status(s, "matmul_gemm_fp8_scaled");
}

extern "C" pd_status_t matmul_fp8_scale(float *out, const float *xs, const float *ws, int n,
                                        int64_t N, cudaStream_t stream)
{
    const size_t total = (size_t)n * (size_t)N;
    KUTIL_REQUIRE(n >= 0 && N > 0, "matmul_fp8_scale");
    if (total == 0)
        return PD_OK;
    matmul__fp8_scale<<<matmul__grid(total, 256), 256, 0, stream>>>(out, xs, ws, n, N);
    return KUTIL_LAUNCHED("matmul_fp8_scale");
}
