/* tp_shard: cuts host weights into tensor-parallel shards (Megatron-style), for rank `rank` of
 * `size` ranks. Weights are W (n out, k in), y = x W^T, in any pd_weight_t format (quant.h).
 *
 *   column-parallel (split n, the output rows): q/k/v by heads, fused gate_up by FFN rows keeping
 *       the [gate_shard; up_shard] layout, the LM head by vocab rows (logits then all-gathered).
 *       Each row keeps its own scale (fp8) / group scales and zeros (int4): the shard is exactly
 *       the rows of the full quantized weight.
 *   row-parallel (split k, the input columns): o_proj and down_proj; partial outputs all-reduced.
 *       INT4: the cut must fall on 128-column group boundaries (groups are never split).
 *       FP8: each shard keeps the full row's scale (still valid: the scale bounds the whole row).
 *       Numerics differ from TP 1 in one place: the W8A8 matmul quantizes the activation per
 *       row of *its shard* (scale = max|x_shard| / 448), not of the whole row, so each shard's
 *       activation scale is at most the full-row scale (finer, never coarser), and the partial
 *       sums are added in f32 by the all-reduce. Results are close to TP 1, not identical.
 *
 * Shards are new host allocations (data / scales / zeros malloc'd; free with
 * model_host_weight_free). Pure functions, any thread.
 */
#ifndef PD_TP_SHARD_H
#define PD_TP_SHARD_H

#include <stdint.h>

#include "hf_config.h"
#include "quant.h"
#include "status.h"

/* Copies rows [row0, row0 + n_rows) of host weight w into *out_p. PD_ERR_INVALID when the range
 * is outside w, PD_ERR_NOMEM; *out_p untouched on failure. */
pd_status_t tp_shard_rows(const pd_weight_t *w, int64_t row0, int64_t n_rows, pd_weight_t *out_p);

/* Copies columns [col0, col0 + n_cols) of host weight w into *out_p (all rows). PD_ERR_INVALID
 * when the range is outside w or, for int4, col0 or n_cols is not a multiple of 128 (a group
 * would be cut); PD_ERR_NOMEM. *out_p untouched on failure. */
pd_status_t tp_shard_cols(const pd_weight_t *w, int64_t col0, int64_t n_cols, pd_weight_t *out_p);

/* Column-parallel shard by heads: w is (n_heads * head_dim, k); rank gets heads
 * [rank * n_heads / size, (rank + 1) * n_heads / size). Sharding Q and KV heads with the same
 * (rank, size) keeps GQA groups together when both counts divide by size.
 * PD_ERR_INVALID when n_heads % size != 0 or w->n != n_heads * head_dim (logged). */
pd_status_t tp_shard_heads(const pd_weight_t *w, int n_heads, int head_dim, int rank, int size,
                           pd_weight_t *out_p);

/* Column-parallel shard of a plain matrix (e.g. the LM head by vocab rows): rows
 * [rank * n / size, (rank + 1) * n / size). PD_ERR_INVALID when n % size != 0 (logged). */
pd_status_t tp_shard_column(const pd_weight_t *w, int rank, int size, pd_weight_t *out_p);

/* Column-parallel shard of a fused gate_up (2 f, k) = [gate (f, k); up (f, k)]: the result is
 * (2 f / size, k) = [gate rows of the rank; up rows of the rank], the layout silu_mul expects.
 * PD_ERR_INVALID when w->n is odd or f % size != 0 (logged). */
pd_status_t tp_shard_gate_up(const pd_weight_t *w, int rank, int size, pd_weight_t *out_p);

/* Row-parallel shard: columns [rank * k / size, (rank + 1) * k / size). PD_ERR_INVALID when
 * k % size != 0, or for int4 when k / size is not a multiple of 128 (logged). */
pd_status_t tp_shard_row(const pd_weight_t *w, int rank, int size, pd_weight_t *out_p);

/* Checks that a model of config cfg with linear weights in wfmt (and LM head in lm_head_fmt) can
 * be split `size` ways: attention heads, KV heads, FFN / MoE FFN rows and the vocab divide by
 * size, and int4 row-parallel cuts fall on group boundaries. PD_ERR_INVALID with one logged line
 * naming the first dimension that does not split (e.g. "tp 4: 2 kv heads do not split 4 ways"). */
pd_status_t tp_shard_check(const hf_config_t *cfg, pd_wfmt_t wfmt, pd_wfmt_t lm_head_fmt, int size);

#endif
