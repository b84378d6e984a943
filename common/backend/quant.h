/* quant: weight and KV quantization formats and their plain C reference (the oracle for kernels).
 *
 * Weights are stored as W (n, k): n output features, k input features, y = x W^T.
 *   BF16: data (n, k) uint16 bf16.
 *   FP8:  data (n, k) uint8 fp8 e4m3; scales (n) f32, one per output row:
 *         scale = max|w_row| / 448, q = fp8(w / scale) (round to nearest even, saturating).
 *         Activations are quantized per token the same way at matmul time (W8A8).
 *   INT4: data (n, k/2) uint8, row-major; byte j of a row holds k = 2j in its low nibble and
 *         k = 2j + 1 in its high nibble, so a warp reading a row reads contiguous bytes.
 *         scales (n, k/128) bf16 and zeros (n, k/128) uint8 in [0, 15], one per group of 128
 *         along k (asymmetric RTN): s = bf16((max - min) / 15), z = clamp(round(-min / s), 0, 15),
 *         q = clamp(round(w / s) + z, 0, 15), w ~ (q - z) * s. k must be a multiple of 128.
 * KV FP8: one f32 scale per (token, KV head): scale = max|x| / 448 over head_dim (1 when all 0).
 * Pure functions, any thread.
 */
#ifndef PD_QUANT_H
#define PD_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#define QUANT_INT4_GROUP 128

/* A weight matrix in one of the formats above. Pointers are backend memory (host for the CPU
 * backend). The struct does not own them unless its creator says so. */
typedef struct {
    pd_wfmt_t fmt;
    int64_t n, k;
    void *data;   /* see the formats above */
    void *scales; /* fp8: (n) f32; int4: (n, k/128) bf16; else NULL */
    void *zeros;  /* int4: (n, k/128) uint8; else NULL */
} pd_weight_t;

/* Bytes of each part of a weight of this format and shape. */
size_t quant_data_bytes(pd_wfmt_t fmt, int64_t n, int64_t k);
size_t quant_scales_bytes(pd_wfmt_t fmt, int64_t n, int64_t k);
size_t quant_zeros_bytes(pd_wfmt_t fmt, int64_t n, int64_t k);

/* Quantizes row-major f32 rows w (n, k) into FP8 e4m3 data (n, k) and scales (n). */
void quant_fp8_rows(uint8_t *q_out, float *scales_out, const float *w, int64_t n, int64_t k);

/* Quantizes one vector x (len) to FP8 with one scale; returns the scale (max|x|/448, 1 if 0). */
float quant_fp8_vec(uint8_t *q_out, const float *x, int64_t len);

/* Quantizes f32 rows w (n, k) into INT4 g128 (data (n, k/2), scales (n, k/128) bf16, zeros
 * (n, k/128)). PD_ERR_INVALID when k is not a multiple of 128 (nothing written). */
pd_status_t quant_int4_rows(uint8_t *q_out, uint16_t *scales_out, uint8_t *zeros_out,
                            const float *w, int64_t n, int64_t k);

/* Dequantizes row r of a host weight into out (k) f32 (any format). */
void quant_dequant_row(float *out, const pd_weight_t *w, int64_t r);

#endif
