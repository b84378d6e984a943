/* dtype: element types of tensors on disk and in memory, and scalar conversions on the CPU.
 *
 * BF16 is stored as uint16_t (the top half of an IEEE float32). FP8 e4m3 is the OCP "e4m3fn"
 * format (bias 7, no infinities, 0x7f/0xff are NaN, max finite 448), stored as uint8_t. The
 * conversions here are the reference every GPU kernel is checked against: float -> bf16 rounds to
 * nearest even; float -> fp8 e4m3 rounds to nearest even and saturates at +-448. Pure functions,
 * any thread.
 */
#ifndef PD_DTYPE_H
#define PD_DTYPE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    PD_DTYPE_F32 = 0,
    PD_DTYPE_F16,
    PD_DTYPE_BF16,
    PD_DTYPE_F8_E4M3,
    PD_DTYPE_F64,
    PD_DTYPE_I8,
    PD_DTYPE_U8,
    PD_DTYPE_I16,
    PD_DTYPE_I32,
    PD_DTYPE_I64,
    PD_DTYPE_BOOL,
    PD_DTYPE__COUNT
} pd_dtype_t;

/* Size of one element in bytes. */
/* Weight formats (the decode/prefill weight choice; see backend/quant.h for their layouts). */
typedef enum {
    PD_WFMT_BF16 = 0,
    PD_WFMT_FP8,
    PD_WFMT_INT4,
    PD_WFMT_F32,
    PD_WFMT_FP8_BLOCK, /* e4m3 with 128x128 block scales, as DeepSeek-V3 / Kimi K2 publish */
} pd_wfmt_t;
#define PD_WFMT_COUNT 5
/* KV page formats (see kv/kv_layout.h). */
typedef enum { PD_KV_BF16 = 0, PD_KV_FP8, PD_KV_F32 } pd_kvfmt_t;
#define PD_KV_COUNT 3

/* The one name table of each (indexed by the enum, NULL-terminated): "bf16" "fp8" "int4" "f32"
 * "fp8-block";
 * "bf16" "fp8" "f32". Config files, flags, metrics and logs all use these names. */
extern const char *const pd_wfmt_names[PD_WFMT_COUNT + 1];
extern const char *const pd_kvfmt_names[PD_KV_COUNT + 1];

/* Parse a name; -1 if unknown (*fmt_p untouched). */
int pd_wfmt_parse(const char *name, pd_wfmt_t *fmt_p);
int pd_kvfmt_parse(const char *name, pd_kvfmt_t *fmt_p);
/* The name, "?" for a value out of range. */
const char *pd_wfmt_name(pd_wfmt_t fmt);
const char *pd_kvfmt_name(pd_kvfmt_t fmt);

size_t pd_dtype_size(pd_dtype_t dt);

/* Safetensors spelling ("BF16", "F8_E4M3", ...). */
const char *pd_dtype_name(pd_dtype_t dt);

/* Parses a safetensors dtype string; returns 0 and writes *dt_p, or -1 when unknown. */
int pd_dtype_parse(const char *name, pd_dtype_t *dt_p);

static inline float pd_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t pd_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float pd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31)
        u = sign | 0x7f800000u | (man << 13);
    else
        u = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}

/* FP8 e4m3fn -> float (exact): a normal value's exponent and mantissa moved into the f32 bits
 * (the same floats as the ldexpf form it replaced, all 256 checked, session 8). */
static inline float pd_fp8_to_f32(uint8_t v)
{
    const uint32_t sign = (uint32_t)(v >> 7) << 31, exp = (v >> 3) & 0xfu, man = v & 7u;
    float f;
    if (exp == 0xf && man == 7)
        return NAN;
    if (exp == 0) {
        f = (float)man * 0x1p-9f; /* subnormal: man/8 * 2^-6 */
        return sign ? -f : f;
    }
    const uint32_t u = sign | ((exp + 120u) << 23) | (man << 20); /* 2^(exp - 7) * 1.man */
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float -> FP8 e4m3fn, round to nearest even, saturating at +-448; NaN -> 0x7f. On the f32 bits
 * (the normal range rounds the 23-bit mantissa to 3 bits, ties to even); the same byte as the
 * frexpf / ldexpf / nearbyintf form it replaced for every one of the 2^32 inputs (checked
 * exhaustively when it changed, session 8), ~4x faster. */
static inline uint8_t pd_f32_to_fp8(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint8_t sign = (u >> 31) ? 0x80 : 0;
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return 0x7f;
    if (a >= 0x43e00000u) /* >= 448 (and inf): saturate */
        return sign | 0x7e;
    if (a < 0x3c800000u) {
        /* below 2^-6: the subnormal grid, multiples of 2^-9 */
        const float q = nearbyintf(fabsf(f) * 512.0f); /* default rounding mode: nearest even */
        return sign | (uint8_t)q;                      /* q == 8 becomes the smallest normal */
    }
    int e = (int)(a >> 23) - 127; /* a = 1.m * 2^e, e in [-6, 8] */
    uint32_t m = (a >> 20) & 7u;
    const uint32_t rest = a & 0xfffffu; /* the 20 bits below the 3 kept */
    if (rest > 0x80000u || (rest == 0x80000u && (m & 1u))) {
        if (++m == 8) {
            m = 0;
            e++;
        }
    }
    if (e > 8)
        return sign | 0x7e;
    uint8_t out = (uint8_t)(((e + 7) << 3) | (int)m);
    if (out == 0x7f)
        out = 0x7e;
    return sign | out;
}

#endif
