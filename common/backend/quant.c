#include "quant.h"

#include <math.h>
#include <string.h>

#include "dtype.h"

size_t quant_data_bytes(pd_wfmt_t fmt, int64_t n, int64_t k)
{
    switch (fmt) {
    case PD_WFMT_BF16:
        return (size_t)(n * k * 2);
    case PD_WFMT_FP8:
        return (size_t)(n * k);
    case PD_WFMT_INT4:
        return (size_t)(n * k / 2);
    case PD_WFMT_F32:
        return (size_t)(n * k * 4);
    case PD_WFMT_FP8_BLOCK:
        return (size_t)(n * k);
    }
    return 0;
}

size_t quant_scales_bytes(pd_wfmt_t fmt, int64_t n, int64_t k)
{
    if (fmt == PD_WFMT_FP8)
        return (size_t)n * 4;
    if (fmt == PD_WFMT_INT4)
        return (size_t)(n * (k / QUANT_INT4_GROUP) * 2);
    if (fmt == PD_WFMT_FP8_BLOCK)
        return (size_t)(quant_fp8_blocks(n) * quant_fp8_blocks(k) * 4);
    return 0;
}

size_t quant_zeros_bytes(pd_wfmt_t fmt, int64_t n, int64_t k)
{
    return fmt == PD_WFMT_INT4 ? (size_t)(n * (k / QUANT_INT4_GROUP)) : 0;
}

float quant_fp8_vec(uint8_t *q_out, const float *x, int64_t len)
{
    float amax = 0.0f, scale, inv;
    for (int64_t i = 0; i < len; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax; /* fmaxf(amax, a) (a NaN is skipped), inlined */
    }
    scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    inv = 1.0f / scale;
    for (int64_t i = 0; i < len; i++)
        q_out[i] = pd_f32_to_fp8(x[i] * inv);
    return scale;
}

void quant_fp8_rows(uint8_t *q_out, float *scales_out, const float *w, int64_t n, int64_t k)
{
    for (int64_t r = 0; r < n; r++)
        scales_out[r] = quant_fp8_vec(q_out + r * k, w + r * k, k);
}

int64_t quant_fp8_blocks(int64_t len)
{
    return (len + QUANT_FP8_BLOCK - 1) / QUANT_FP8_BLOCK;
}

void quant_fp8_block_rows(uint8_t *q_out, float *scales_out, const float *w, int64_t n, int64_t k)
{
    const int64_t B = QUANT_FP8_BLOCK, kb = quant_fp8_blocks(k);
    for (int64_t bi = 0; bi * B < n; bi++)
        for (int64_t bj = 0; bj < kb; bj++) {
            const int64_t r1 = bi * B + B < n ? bi * B + B : n,
                          c1 = bj * B + B < k ? bj * B + B : k;
            float amax = 0.0f;
            for (int64_t r = bi * B; r < r1; r++)
                for (int64_t c = bj * B; c < c1; c++)
                    amax = fmaxf(amax, fabsf(w[r * k + c]));
            float s = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / s;
            scales_out[bi * kb + bj] = s;
            for (int64_t r = bi * B; r < r1; r++)
                for (int64_t c = bj * B; c < c1; c++)
                    q_out[r * k + c] = pd_f32_to_fp8(w[r * k + c] * inv);
        }
}

pd_status_t quant_int4_rows(uint8_t *q_out, uint16_t *scales_out, uint8_t *zeros_out,
                            const float *w, int64_t n, int64_t k)
{
    const int64_t G = QUANT_INT4_GROUP, ng = k / G;

    if (k % G != 0)
        return PD_ERR_INVALID;
    for (int64_t r = 0; r < n; r++) {
        const float *row = w + r * k;
        uint8_t *qrow = q_out + r * (k / 2);
        for (int64_t g = 0; g < ng; g++) {
            float mn = INFINITY, mx = -INFINITY, s, z;
            for (int64_t i = 0; i < G; i++) {
                mn = fminf(mn, row[g * G + i]);
                mx = fmaxf(mx, row[g * G + i]);
            }
            mn = fminf(mn, 0.0f); /* keep 0 representable */
            mx = fmaxf(mx, 0.0f);
            s = pd_bf16_to_f32(pd_f32_to_bf16((mx - mn) / 15.0f));
            if (s == 0.0f)
                s = 1.0f;
            z = fminf(fmaxf(nearbyintf(-mn / s), 0.0f), 15.0f);
            scales_out[r * ng + g] = pd_f32_to_bf16(s);
            zeros_out[r * ng + g] = (uint8_t)z;
            for (int64_t i = 0; i < G; i += 2) {
                float a = fminf(fmaxf(nearbyintf(row[g * G + i] / s) + z, 0.0f), 15.0f);
                float b = fminf(fmaxf(nearbyintf(row[g * G + i + 1] / s) + z, 0.0f), 15.0f);
                qrow[(g * G + i) / 2] = (uint8_t)((int)a | ((int)b << 4));
            }
        }
    }
    return PD_OK;
}

void quant_dequant_row(float *out, const pd_weight_t *w, int64_t r)
{
    const int64_t k = w->k;
    switch (w->fmt) {
    case PD_WFMT_F32:
        memcpy(out, (const float *)w->data + r * k, (size_t)k * 4);
        break;
    case PD_WFMT_BF16:
        for (int64_t i = 0; i < k; i++)
            out[i] = pd_bf16_to_f32(((const uint16_t *)w->data)[r * k + i]);
        break;
    case PD_WFMT_FP8: {
        float s = ((const float *)w->scales)[r];
        for (int64_t i = 0; i < k; i++)
            out[i] = pd_fp8_to_f32(((const uint8_t *)w->data)[r * k + i]) * s;
        break;
    }
    case PD_WFMT_FP8_BLOCK: {
        const float *s = (const float *)w->scales + (r / QUANT_FP8_BLOCK) * quant_fp8_blocks(k);
        for (int64_t i = 0; i < k; i++)
            out[i] = pd_fp8_to_f32(((const uint8_t *)w->data)[r * k + i]) * s[i / QUANT_FP8_BLOCK];
        break;
    }
    case PD_WFMT_INT4: {
        const int64_t ng = k / QUANT_INT4_GROUP;
        const uint8_t *q = (const uint8_t *)w->data + r * (k / 2);
        for (int64_t g = 0; g < ng; g++) {
            float s = pd_bf16_to_f32(((const uint16_t *)w->scales)[r * ng + g]);
            float z = (float)((const uint8_t *)w->zeros)[r * ng + g];
            const uint8_t *qg = q + g * (QUANT_INT4_GROUP / 2);
            float *o = out + g * QUANT_INT4_GROUP;
            for (int i = 0; i < QUANT_INT4_GROUP / 2; i++) {
                o[2 * i] = ((float)(qg[i] & 15) - z) * s;
                o[2 * i + 1] = ((float)(qg[i] >> 4) - z) * s;
            }
        }
        break;
    }
    }
}
