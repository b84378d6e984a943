/* elementwise: embed, rmsnorm, add, rope, silu_mul (see elementwise.h). */
#include "elementwise.h"
#include "kutil.cuh"

/* ==== kernels ==== */

/* grid (n), block 256: out (n, d) f32, table (vocab, d) bf16, ids (n) int32 */
static __global__ void elementwise__embed(float *out, const uint16_t *table, const int32_t *ids,
                                          int d)
{
    const size_t row = blockIdx.x;
    const uint16_t *src = table + (size_t)ids[row] * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        out[row * d + j] = kutil_bf16_to_f32(src[j]);
}

/* grid (n), block 256: out (n, d) f32, x (n, d) f32, w (d) bf16 */
static __global__ void elementwise__rmsnorm(float *out, const float *x, const uint16_t *w, int d,
                                            float eps)
{
    __shared__ float red[32];
    const float *xi = x + (size_t)blockIdx.x * d;
    float *oi = out + (size_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        ss += xi[j] * xi[j];
    ss = kutil_block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        oi[j] = (xi[j] * inv) * kutil_bf16_to_f32(w[j]);
}

/* x (n) f32 += y (n) f32 */
static __global__ void elementwise__add(float *x, const float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

/* grid (n), block 128: x (n, n_heads, head_dim) f32 in place, pos (n) int32,
 * inv_freq (head_dim / 2) f32 */
static __global__ void elementwise__rope(float *x, const int32_t *pos, const float *inv_freq,
                                         int n_heads, int head_dim)
{
    const int half = head_dim / 2;
    const float p = (float)pos[blockIdx.x];
    float *row = x + (size_t)blockIdx.x * n_heads * head_dim;
    for (int i = threadIdx.x; i < n_heads * half; i += blockDim.x) {
        const int h = i / half, j = i % half;
        float s, c;
        const float ang = p * inv_freq[j];
        c = cosf(ang);
        s = sinf(ang);
        float *v = row + (size_t)h * head_dim;
        const float a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = b * c + a * s;
    }
}

/* out (n, f) f32, gu (n, 2f) f32 */
static __global__ void elementwise__silu_mul(float *out, const float *gu, int n, int f)
{
    const size_t total = (size_t)n * f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / f, j = i % f;
        const float g = gu[r * 2 * f + j], u = gu[r * 2 * f + f + j];
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

/* ==== launchers ==== */

static unsigned elementwise__grid(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 1 ? 1 : g > 65535 * 8 ? 65535 * 8 : g);
}

extern "C" pd_status_t elementwise_embed(float *out, const uint16_t *table, const int32_t *ids,
                                         int n, int d, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && d > 0, "embed");
    if (n == 0)
        return PD_OK;
    elementwise__embed<<<n, 256, 0, stream>>>(out, table, ids, d);
    return KUTIL_LAUNCHED("embed");
}

extern "C" pd_status_t elementwise_rmsnorm(float *out, const float *x, const uint16_t *w, int n,
                                           int d, float eps, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && d > 0, "rmsnorm");
    if (n == 0)
        return PD_OK;
    elementwise__rmsnorm<<<n, d <= 128 ? 128 : 256, 0, stream>>>(out, x, w, d, eps);
    return KUTIL_LAUNCHED("rmsnorm");
}

extern "C" pd_status_t elementwise_add(float *x, const float *y, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return PD_OK;
    elementwise__add<<<elementwise__grid(n, 256), 256, 0, stream>>>(x, y, n);
    return KUTIL_LAUNCHED("add");
}

extern "C" pd_status_t elementwise_rope(float *x, const int32_t *pos, const float *inv_freq, int n,
                                        int n_heads, int head_dim, cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0, "rope");
    if (n == 0)
        return PD_OK;
    elementwise__rope<<<n, 128, 0, stream>>>(x, pos, inv_freq, n_heads, head_dim);
    return KUTIL_LAUNCHED("rope");
}

extern "C" pd_status_t elementwise_silu_mul(float *out, const float *gu, int n, int f,
                                            cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && f > 0, "silu_mul");
    if (n == 0)
        return PD_OK;
    elementwise__silu_mul<<<elementwise__grid((size_t)n * f, 256), 256, 0, stream>>>(out, gu, n, f);
    return KUTIL_LAUNCHED("silu_mul");
}
