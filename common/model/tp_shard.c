/* tp_shard: tensor-parallel weight shards (see tp_shard.h). */
#include "tp_shard.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

/* a host weight of (n, k) in fmt, parts malloc'd (as model_host_weight_free expects) */
static pd_status_t tp_shard__alloc(pd_wfmt_t fmt, int64_t n, int64_t k, pd_weight_t *w)
{
    size_t nd = quant_data_bytes(fmt, n, k), ns = quant_scales_bytes(fmt, n, k),
           nz = quant_zeros_bytes(fmt, n, k);
    memset(w, 0, sizeof *w);
    w->fmt = fmt;
    w->n = n;
    w->k = k;
    w->data = malloc(nd ? nd : 1);
    w->scales = ns ? malloc(ns) : NULL;
    w->zeros = nz ? malloc(nz) : NULL;
    if (!w->data || (ns && !w->scales) || (nz && !w->zeros)) {
        free(w->data);
        free(w->scales);
        free(w->zeros);
        return PD_ERR_NOMEM;
    }
    return PD_OK;
}

/* Copies `rows` rows starting at src row r0 of a part whose row is `row_bytes` long, taking
 * bytes [b0, b0 + nb) of each row, to dst (rows, nb) packed. */
static void tp_shard__copy2d(void *dst, const void *src, int64_t r0, int64_t rows, size_t row_bytes,
                             size_t b0, size_t nb)
{
    for (int64_t r = 0; r < rows; r++)
        memcpy((uint8_t *)dst + (size_t)r * nb,
               (const uint8_t *)src + (size_t)(r0 + r) * row_bytes + b0, nb);
}

pd_status_t tp_shard_rows(const pd_weight_t *w, int64_t row0, int64_t n_rows, pd_weight_t *out_p)
{
    if (w->fmt == PD_WFMT_FP8_BLOCK) /* rows would cut 128-row scale blocks */
        return PD_ERR_INVALID;
    pd_weight_t o;
    pd_status_t st;
    if (row0 < 0 || n_rows < 0 || row0 + n_rows > w->n)
        return PD_ERR_INVALID;
    if ((st = tp_shard__alloc(w->fmt, n_rows, w->k, &o)) != PD_OK)
        return st;
    /* every part is row-major with a fixed number of bytes per row */
    size_t db = quant_data_bytes(w->fmt, 1, w->k), sb = quant_scales_bytes(w->fmt, 1, w->k),
           zb = quant_zeros_bytes(w->fmt, 1, w->k);
    tp_shard__copy2d(o.data, w->data, row0, n_rows, db, 0, db);
    if (sb)
        tp_shard__copy2d(o.scales, w->scales, row0, n_rows, sb, 0, sb);
    if (zb)
        tp_shard__copy2d(o.zeros, w->zeros, row0, n_rows, zb, 0, zb);
    *out_p = o;
    return PD_OK;
}

pd_status_t tp_shard_cols(const pd_weight_t *w, int64_t col0, int64_t n_cols, pd_weight_t *out_p)
{
    pd_weight_t o;
    pd_status_t st;
    const int64_t G = QUANT_INT4_GROUP;
    if (col0 < 0 || n_cols < 0 || col0 + n_cols > w->k || w->fmt == PD_WFMT_FP8_BLOCK)
        return PD_ERR_INVALID;
    if (w->fmt == PD_WFMT_INT4 && (col0 % G != 0 || n_cols % G != 0))
        return PD_ERR_INVALID;
    if ((st = tp_shard__alloc(w->fmt, w->n, n_cols, &o)) != PD_OK)
        return st;
    switch (w->fmt) {
    case PD_WFMT_BF16:
    case PD_WFMT_F32:
    case PD_WFMT_FP8: {
        size_t es = quant_data_bytes(w->fmt, 1, 1);
        tp_shard__copy2d(o.data, w->data, 0, w->n, (size_t)w->k * es, (size_t)col0 * es,
                         (size_t)n_cols * es);
        if (w->fmt == PD_WFMT_FP8) /* per-row scales stay as they are (see the header) */
            memcpy(o.scales, w->scales, quant_scales_bytes(w->fmt, w->n, w->k));
        break;
    }
    case PD_WFMT_INT4: {
        size_t gs = quant_scales_bytes(w->fmt, 1, G), gz = quant_zeros_bytes(w->fmt, 1, G);
        tp_shard__copy2d(o.data, w->data, 0, w->n, (size_t)w->k / 2, (size_t)col0 / 2,
                         (size_t)n_cols / 2);
        tp_shard__copy2d(o.scales, w->scales, 0, w->n, (size_t)(w->k / G) * gs,
                         (size_t)(col0 / G) * gs, (size_t)(n_cols / G) * gs);
        tp_shard__copy2d(o.zeros, w->zeros, 0, w->n, (size_t)(w->k / G) * gz,
                         (size_t)(col0 / G) * gz, (size_t)(n_cols / G) * gz);
        break;
    }
    case PD_WFMT_FP8_BLOCK: /* refused above */
        break;
    }
    *out_p = o;
    return PD_OK;
}

pd_status_t tp_shard_heads(const pd_weight_t *w, int n_heads, int head_dim, int rank, int size,
                           pd_weight_t *out_p)
{
    if (size < 1 || rank < 0 || rank >= size || n_heads % size != 0 ||
        w->n != (int64_t)n_heads * head_dim) {
        pd_log_error("tp %d: %d heads of %d (weight %lld rows) do not split %d ways", size, n_heads,
                     head_dim, (long long)w->n, size);
        return PD_ERR_INVALID;
    }
    int64_t hs = n_heads / size;
    return tp_shard_rows(w, rank * hs * head_dim, hs * head_dim, out_p);
}

pd_status_t tp_shard_column(const pd_weight_t *w, int rank, int size, pd_weight_t *out_p)
{
    if (size < 1 || rank < 0 || rank >= size || w->n % size != 0) {
        pd_log_error("tp %d: %lld rows do not split %d ways", size, (long long)w->n, size);
        return PD_ERR_INVALID;
    }
    return tp_shard_rows(w, rank * (w->n / size), w->n / size, out_p);
}

pd_status_t tp_shard_gate_up(const pd_weight_t *w, int rank, int size, pd_weight_t *out_p)
{
    pd_weight_t g = {0}, u = {0}, o;
    pd_status_t st;
    int64_t f = w->n / 2;
    if (size < 1 || rank < 0 || rank >= size || w->n % 2 != 0 || f % size != 0) {
        pd_log_error("tp %d: gate_up of %lld rows does not split %d ways", size, (long long)w->n,
                     size);
        return PD_ERR_INVALID;
    }
    int64_t fs = f / size;
    if ((st = tp_shard_rows(w, rank * fs, fs, &g)) != PD_OK)
        return st;
    if ((st = tp_shard_rows(w, f + rank * fs, fs, &u)) != PD_OK)
        goto err_free_g;
    if ((st = tp_shard__alloc(w->fmt, 2 * fs, w->k, &o)) != PD_OK)
        goto err_free_u;
    size_t db = quant_data_bytes(w->fmt, fs, w->k), sb = quant_scales_bytes(w->fmt, fs, w->k),
           zb = quant_zeros_bytes(w->fmt, fs, w->k);
    memcpy(o.data, g.data, db);
    memcpy((uint8_t *)o.data + db, u.data, db);
    if (sb) {
        memcpy(o.scales, g.scales, sb);
        memcpy((uint8_t *)o.scales + sb, u.scales, sb);
    }
    if (zb) {
        memcpy(o.zeros, g.zeros, zb);
        memcpy((uint8_t *)o.zeros + zb, u.zeros, zb);
    }
    *out_p = o;
err_free_u:
    free(u.data);
    free(u.scales);
    free(u.zeros);
err_free_g:
    free(g.data);
    free(g.scales);
    free(g.zeros);
    return st;
}

pd_status_t tp_shard_row(const pd_weight_t *w, int rank, int size, pd_weight_t *out_p)
{
    if (size < 1 || rank < 0 || rank >= size || w->k % size != 0 ||
        (w->fmt == PD_WFMT_INT4 && (w->k / size) % QUANT_INT4_GROUP != 0)) {
        pd_log_error("tp %d: %lld %s columns do not split %d ways%s", size, (long long)w->k,
                     pd_wfmt_name(w->fmt), size,
                     w->fmt == PD_WFMT_INT4 ? " on int4 group (128) boundaries" : "");
        return PD_ERR_INVALID;
    }
    return tp_shard_cols(w, rank * (w->k / size), w->k / size, out_p);
}

/* one dimension of tp_shard_check: n must divide by size (and, when g > 0, n / size by g) */
static bool tp_shard__splits(int size, int n, int g, const char *what)
{
    if (n % size == 0 && (g == 0 || (n / size) % g == 0))
        return true;
    if (n % size != 0)
        pd_log_error("tp %d: %d %s do not split %d ways", size, n, what, size);
    else
        pd_log_error("tp %d: %s shards of %d columns cut int4 groups of %d", size, what, n / size,
                     g);
    return false;
}

pd_status_t tp_shard_check(const hf_config_t *cfg, pd_wfmt_t wfmt, pd_wfmt_t lm_head_fmt, int size)
{
    int g = wfmt == PD_WFMT_INT4 ? QUANT_INT4_GROUP : 0;
    bool dense = false;
    (void)lm_head_fmt; /* the LM head is column-parallel: rows only, any format */
    if (size < 1) {
        pd_log_error("tp %d: size must be at least 1", size);
        return PD_ERR_INVALID;
    }
    if (size > 1 && (wfmt == PD_WFMT_FP8_BLOCK || !strcmp(cfg->quant_format, "fp8_block"))) {
        pd_log_error("tp %d: fp8 block-scaled weights cannot be sharded yet", size);
        return PD_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < cfg->num_hidden_layers; i++)
        dense |= !hf_config_layer_is_moe(cfg, i);
    if (!tp_shard__splits(size, cfg->num_attention_heads, 0, "attention heads") ||
        !tp_shard__splits(size, cfg->num_key_value_heads, 0, "kv heads") ||
        !tp_shard__splits(size, cfg->num_attention_heads * cfg->head_dim, g, "o_proj") ||
        (dense && !tp_shard__splits(size, cfg->intermediate_size, g, "ffn rows (down_proj)")) ||
        (cfg->num_experts > 0 && !tp_shard__splits(size, cfg->moe_intermediate_size, g,
                                                   "moe ffn rows (expert down_proj)")) ||
        !tp_shard__splits(size, cfg->vocab_size, 0, "vocab rows"))
        return PD_ERR_INVALID;
    return PD_OK;
}
