/* model_impl: the loader helpers model.c shares with model_family.c (internal to common/model).
 * All run on the loading thread; host weights are malloc'd, uploaded ones are backend memory. */
#ifndef PD_MODEL_IMPL_H
#define PD_MODEL_IMPL_H

#include "model.h"
#include "safetensors.h"

typedef struct {
    model_t *m;
    const safetensors_t *st;
} loader_t;

/* how a linear weight is cut under tensor parallelism (tp_shard.h) */
typedef enum {
    SPLIT_NONE,    /* replicated (MoE router) */
    SPLIT_Q_HEADS, /* column-parallel by attention heads */
    SPLIT_KV_HEADS,
    SPLIT_COLUMN,  /* column-parallel by rows (LM head by vocab) */
    SPLIT_GATE_UP, /* column-parallel, [gate_shard; up_shard] */
    SPLIT_ROW,     /* row-parallel by columns (o_proj, down_proj) */
} model_split_t;

/* Reads weight `base` (base.weight, or base.qweight/scales/zeros) of shape (n, k) into a host
 * weight of format fmt (as stored when the checkpoint holds fmt, quantized from BF16, or from
 * a published fp8 block-scaled checkpoint). Errors name the tensor. */
pd_status_t model__read_weight(const safetensors_t *st, const char *base, int64_t n, int64_t k,
                               pd_wfmt_t fmt, pd_weight_t *w_p);
/* src (any format) converted into fmt through f32, 256 rows at a time. PD_ERR_INVALID for int4
 * with k % 128 != 0; PD_ERR_NOMEM. */
pd_status_t model__convert(const pd_weight_t *src, pd_wfmt_t fmt, pd_weight_t *w_p);
/* rows of a then b (same format and k) into *out (host) */
pd_status_t model__concat_rows(const pd_weight_t *a, const pd_weight_t *b, pd_weight_t *out);
/* replaces *h by this rank's shard; *h is freed on failure */
pd_status_t model__shard(const model_t *m, model_split_t split, pd_weight_t *h);
/* uploads the host weight *host (freed either way) into *dst */
pd_status_t model__upload(loader_t *ld, pd_weight_t *host, pd_weight_t *dst);
/* read + shard + upload */
pd_status_t model__linear(loader_t *ld, const char *base, int64_t n, int64_t k, pd_wfmt_t fmt,
                          model_split_t split, pd_weight_t *dst);
/* prefix.gate_proj and prefix.up_proj fused into one (2 f, d) weight */
pd_status_t model__gate_up(loader_t *ld, const char *prefix, int64_t f, int64_t d,
                           pd_weight_t *dst);
/* a BF16 tensor of the given shape, uploaded as-is */
pd_status_t model__bf16(loader_t *ld, const char *name, int n_dims, const int64_t *shape,
                        uint16_t **dst_p);

/* ==== GLM-4.5 / DeepSeek-V3, defined in model_family.c (see model_family.h) ==== */

/* True for GLM-4.5 and DeepSeek-V3 (the architectures model_family.c runs). */
bool model_family_arch(const hf_config_t *cfg);

/* Checks that the backend has the ops and the model is TP 1: PD_ERR_UNSUPPORTED with one error
 * line naming what is missing. */
pd_status_t model_family_check(const model_t *m);

/* Loads layer i's weights (model_layer_t's family fields). Errors as model_load. */
pd_status_t model_family_layer_load(loader_t *ld, int i);

/* Frees what model_family_layer_load allocated (accepts a partly loaded layer). */
void model_family_layer_free(pd_backend_t *be, model_layer_t *L);

/* Replaces m->inv_freq by the family's (rotary_dim / 2 entries; yarn for DeepSeek-V3) and sets
 * m->rope_scale and m->attn_scale. PD_ERR_NOMEM leaves m->inv_freq NULL. */
pd_status_t model_family_rope(model_t *m);

#endif
