#include "hf_config.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define HF_CONFIG__MAX_FILE ((size_t)16 << 20)

static const struct {
    const char *name;
    hf_arch_t arch;
} hf_config_archs[] = {
    {"LlamaForCausalLM", HF_ARCH_LLAMA},
    {"Qwen3MoeForCausalLM", HF_ARCH_QWEN3_MOE},
    {"Glm4MoeForCausalLM", HF_ARCH_GLM4_MOE},
    {"DeepseekV3ForCausalLM", HF_ARCH_DEEPSEEK_V3},
};
#define HF_CONFIG__SUPPORTED                                                                       \
    "LlamaForCausalLM, Qwen3MoeForCausalLM, Glm4MoeForCausalLM, DeepseekV3ForCausalLM"

/* ==== typed field readers: each logs its own error ==== */

static const char *hf_config__type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "a list";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* Absent or null: *out = def, or PD_ERR_FORMAT when required. Else an integer in [min, INT_MAX]. */
static pd_status_t hf_config__int(const char *src, const json_t *obj, const char *pre,
                                  const char *key, bool required, int def, int min, int *out)
{
    json_t *v = json_object_get(obj, key);
    json_int_t x;

    if (!v || json_is_null(v)) {
        if (required) {
            pd_log_error("%s: missing required field %s%s", src, pre, key);
            return PD_ERR_FORMAT;
        }
        *out = def;
        return PD_OK;
    }
    if (!json_is_integer(v)) {
        pd_log_error("%s: %s%s: expected an integer, got %s", src, pre, key, hf_config__type(v));
        return PD_ERR_FORMAT;
    }
    x = json_integer_value(v);
    if (x < min || x > INT_MAX) {
        pd_log_error("%s: %s%s: %lld out of range (must be >= %d)", src, pre, key, (long long)x,
                     min);
        return PD_ERR_FORMAT;
    }
    *out = (int)x;
    return PD_OK;
}

/* As hf_config__int for a number (integer or real) that must be finite and > 0. */
static pd_status_t hf_config__pos_num(const char *src, const json_t *obj, const char *pre,
                                      const char *key, bool required, double def, double *out)
{
    json_t *v = json_object_get(obj, key);
    double x;

    if (!v || json_is_null(v)) {
        if (required) {
            pd_log_error("%s: missing required field %s%s", src, pre, key);
            return PD_ERR_FORMAT;
        }
        *out = def;
        return PD_OK;
    }
    if (!json_is_number(v)) {
        pd_log_error("%s: %s%s: expected a number, got %s", src, pre, key, hf_config__type(v));
        return PD_ERR_FORMAT;
    }
    x = json_number_value(v);
    if (!isfinite(x) || x <= 0) {
        pd_log_error("%s: %s%s: %g must be a positive number", src, pre, key, x);
        return PD_ERR_FORMAT;
    }
    *out = x;
    return PD_OK;
}

static pd_status_t hf_config__bool(const char *src, const json_t *obj, const char *pre,
                                   const char *key, bool def, bool *out)
{
    json_t *v = json_object_get(obj, key);

    if (!v || json_is_null(v)) {
        *out = def;
        return PD_OK;
    }
    if (!json_is_boolean(v)) {
        pd_log_error("%s: %s%s: expected a boolean, got %s", src, pre, key, hf_config__type(v));
        return PD_ERR_FORMAT;
    }
    *out = json_is_true(v);
    return PD_OK;
}

/* Absent or null: out = "" (PD_ERR_FORMAT when required). Else a string shorter than size. */
static pd_status_t hf_config__str(const char *src, const json_t *obj, const char *pre,
                                  const char *key, bool required, char *out, size_t size)
{
    json_t *v = json_object_get(obj, key);

    if (!v || json_is_null(v)) {
        if (required) {
            pd_log_error("%s: missing required field %s%s", src, pre, key);
            return PD_ERR_FORMAT;
        }
        out[0] = 0;
        return PD_OK;
    }
    if (!json_is_string(v)) {
        pd_log_error("%s: %s%s: expected a string, got %s", src, pre, key, hf_config__type(v));
        return PD_ERR_FORMAT;
    }
    if (json_string_length(v) >= size || strlen(json_string_value(v)) != json_string_length(v)) {
        pd_log_error("%s: %s%s: \"%.40s\" longer than %zu characters or contains NUL", src, pre,
                     key, json_string_value(v), size - 1);
        return PD_ERR_FORMAT;
    }
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return PD_OK;
}

/* ==== sections ==== */

static pd_status_t hf_config__arch(const char *src, const json_t *root, hf_config_t *c)
{
    json_t *a = json_object_get(root, "architectures");
    const char *name;

    if (!a || json_is_null(a)) {
        pd_log_error("%s: missing required field architectures", src);
        return PD_ERR_FORMAT;
    }
    if (!json_is_array(a) || json_array_size(a) == 0 || !json_is_string(json_array_get(a, 0))) {
        pd_log_error("%s: architectures: expected a non-empty list of strings", src);
        return PD_ERR_FORMAT;
    }
    name = json_string_value(json_array_get(a, 0));
    for (size_t i = 0; i < sizeof hf_config_archs / sizeof hf_config_archs[0]; i++) {
        if (strcmp(name, hf_config_archs[i].name) == 0) {
            c->arch = hf_config_archs[i].arch;
            snprintf(c->architecture, sizeof c->architecture, "%s", name);
            return PD_OK;
        }
    }
    pd_log_error("%s: architectures: unsupported architecture \"%.100s\" (supported: %s)", src,
                 name, HF_CONFIG__SUPPORTED);
    return PD_ERR_UNSUPPORTED;
}

static pd_status_t hf_config__sizes(const char *src, const json_t *root, hf_config_t *c)
{
    pd_status_t rc;

    if ((rc = hf_config__int(src, root, "", "hidden_size", true, 0, 1, &c->hidden_size)) ||
        (rc = hf_config__int(src, root, "", "intermediate_size", true, 0, 1,
                             &c->intermediate_size)) ||
        (rc = hf_config__int(src, root, "", "num_hidden_layers", true, 0, 1,
                             &c->num_hidden_layers)) ||
        (rc = hf_config__int(src, root, "", "num_attention_heads", true, 0, 1,
                             &c->num_attention_heads)) ||
        (rc = hf_config__int(src, root, "", "num_key_value_heads", false, c->num_attention_heads, 1,
                             &c->num_key_value_heads)) ||
        (rc = hf_config__int(src, root, "", "head_dim", false, 0, 1, &c->head_dim)) ||
        (rc = hf_config__int(src, root, "", "vocab_size", true, 0, 1, &c->vocab_size)) ||
        (rc = hf_config__int(src, root, "", "max_position_embeddings", true, 0, 1,
                             &c->max_position_embeddings)) ||
        (rc = hf_config__pos_num(src, root, "", "rms_norm_eps", true, 0, &c->rms_norm_eps)) ||
        (rc = hf_config__bool(src, root, "", "tie_word_embeddings", false,
                              &c->tie_word_embeddings)) ||
        (rc = hf_config__bool(src, root, "", "attention_bias", false, &c->attention_bias)) ||
        (rc = hf_config__bool(src, root, "", "mlp_bias", false, &c->mlp_bias)) ||
        (rc = hf_config__str(src, root, "", "model_type", false, c->model_type,
                             sizeof c->model_type)))
        return rc;
    if (c->num_hidden_layers > HF_MAX_LAYERS) {
        pd_log_error("%s: num_hidden_layers: %d layers, at most %d supported", src,
                     c->num_hidden_layers, HF_MAX_LAYERS);
        return PD_ERR_UNSUPPORTED;
    }
    if (c->num_attention_heads % c->num_key_value_heads != 0) {
        pd_log_error("%s: num_attention_heads: %d is not a multiple of num_key_value_heads %d", src,
                     c->num_attention_heads, c->num_key_value_heads);
        return PD_ERR_FORMAT;
    }
    if (c->head_dim == 0) {
        if (c->hidden_size % c->num_attention_heads != 0) {
            pd_log_error("%s: head_dim: absent and hidden_size %d is not a multiple of "
                         "num_attention_heads %d",
                         src, c->hidden_size, c->num_attention_heads);
            return PD_ERR_FORMAT;
        }
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    if (c->head_dim % 2 != 0) {
        pd_log_error("%s: head_dim: %d is odd (rotary embeddings need pairs)", src, c->head_dim);
        return PD_ERR_FORMAT;
    }
    return PD_OK;
}

/* yarn (DeepSeek-V3, Kimi K2): factor (default max_position_embeddings /
 * original_max_position_embeddings, as transformers does), original_max_position_embeddings
 * (default max_position_embeddings), beta_fast 32, beta_slow 1, mscale and mscale_all_dim (0 when
 * absent). */
static pd_status_t hf_config__yarn(const char *src, const json_t *rp, const char *pre,
                                   hf_config_t *c)
{
    pd_status_t rc;
    json_t *ms = json_object_get(rp, "mscale"), *msa = json_object_get(rp, "mscale_all_dim");

    c->rope_type = HF_ROPE_YARN;
    if ((rc = hf_config__int(src, rp, pre, "original_max_position_embeddings", false,
                             c->max_position_embeddings, 1, &c->rope_original_max_position)) ||
        (rc = hf_config__pos_num(src, rp, pre, "factor", false,
                                 (double)c->max_position_embeddings /
                                     (double)c->rope_original_max_position,
                                 &c->rope_factor)) ||
        (rc = hf_config__pos_num(src, rp, pre, "beta_fast", false, 32, &c->rope_beta_fast)) ||
        (rc = hf_config__pos_num(src, rp, pre, "beta_slow", false, 1, &c->rope_beta_slow)))
        return rc;
    /* mscale 0 is meaningful (off), so these are read as non-negative numbers */
    if ((ms && !json_is_null(ms) && json_number_value(ms) != 0 &&
         (rc = hf_config__pos_num(src, rp, pre, "mscale", false, 0, &c->rope_mscale))) ||
        (msa && !json_is_null(msa) && json_number_value(msa) != 0 &&
         (rc = hf_config__pos_num(src, rp, pre, "mscale_all_dim", false, 0,
                                  &c->rope_mscale_all_dim))))
        return rc;
    /* beta_fast == beta_slow is valid (Kimi K2 ships 1.0 and 1.0): the ramp degenerates */
    return PD_OK;
}

/* rope_theta and the rope type, from rope_parameters (transformers 5) or rope_theta/rope_scaling.
 */
static pd_status_t hf_config__rope(const char *src, const json_t *root, hf_config_t *c)
{
    json_t *params = json_object_get(root, "rope_parameters");
    json_t *scaling = json_object_get(root, "rope_scaling"), *rp = NULL, *type;
    double theta_top = 0, theta_params = 0;
    pd_status_t rc;

    if (params && !json_is_null(params) && !json_is_object(params)) {
        pd_log_error("%s: rope_parameters: expected an object, got %s", src,
                     hf_config__type(params));
        return PD_ERR_FORMAT;
    }
    if (scaling && !json_is_null(scaling) && !json_is_object(scaling)) {
        pd_log_error("%s: rope_scaling: expected an object, got %s", src, hf_config__type(scaling));
        return PD_ERR_FORMAT;
    }
    if ((rc = hf_config__pos_num(src, root, "", "rope_theta", false, 0, &theta_top)))
        return rc;
    if (json_is_object(params) && (rc = hf_config__pos_num(src, params, "rope_parameters.",
                                                           "rope_theta", false, 0, &theta_params)))
        return rc;
    if (theta_top > 0 && theta_params > 0 && theta_top != theta_params)
        pd_log_warn("%s: rope_theta %g and rope_parameters.rope_theta %g differ; using the latter",
                    src, theta_top, theta_params);
    c->rope_theta = theta_params > 0 ? theta_params : theta_top > 0 ? theta_top : 10000.0;
    double partial = 0;
    if (json_is_object(params) &&
        (rc = hf_config__pos_num(src, params, "rope_parameters.", "partial_rotary_factor", false, 0,
                                 &partial)))
        return rc;
    if (partial == 0 &&
        (rc = hf_config__pos_num(src, root, "", "partial_rotary_factor", false, 1.0, &partial)))
        return rc;
    if (partial > 1.0) {
        pd_log_error("%s: partial_rotary_factor: %g exceeds 1", src, partial);
        return PD_ERR_FORMAT;
    }
    c->rotary_dim = (int)(c->head_dim * partial);
    if (c->rotary_dim < 2 || c->rotary_dim % 2) {
        pd_log_error("%s: partial_rotary_factor: %g of head_dim %d is not an even number of dims",
                     src, partial, c->head_dim);
        return PD_ERR_FORMAT;
    }
    if ((rc = hf_config__bool(src, root, "", "rope_interleave", false, &c->rope_interleave)))
        return rc;

    /* the rope type: rope_parameters when it names one, else rope_scaling */
    if (json_is_object(params) &&
        (json_object_get(params, "rope_type") || json_object_get(params, "type")))
        rp = params;
    else if (json_is_object(scaling))
        rp = scaling;
    c->rope_type = HF_ROPE_DEFAULT;
    if (!rp)
        return PD_OK;
    const char *field = rp == params ? "rope_parameters" : "rope_scaling";
    const char *pre = rp == params ? "rope_parameters." : "rope_scaling.";
    type = json_object_get(rp, "rope_type");
    if (!type)
        type = json_object_get(rp, "type");
    if (!json_is_string(type)) {
        pd_log_error("%s: %s.rope_type: missing or not a string", src, field);
        return PD_ERR_FORMAT;
    }
    if (strcmp(json_string_value(type), "default") == 0)
        return PD_OK;
    if (strcmp(json_string_value(type), "yarn") == 0 && c->arch == HF_ARCH_DEEPSEEK_V3)
        return hf_config__yarn(src, rp, pre, c);
    if (strcmp(json_string_value(type), "llama3") != 0) {
        pd_log_error("%s: %s.rope_type: unsupported rope type \"%.40s\" (supported: default, "
                     "llama3; yarn for DeepseekV3ForCausalLM)",
                     src, field, json_string_value(type));
        return PD_ERR_UNSUPPORTED;
    }
    c->rope_type = HF_ROPE_LLAMA3;
    if ((rc = hf_config__pos_num(src, rp, pre, "factor", true, 0, &c->rope_factor)) ||
        (rc = hf_config__pos_num(src, rp, pre, "low_freq_factor", true, 0,
                                 &c->rope_low_freq_factor)) ||
        (rc = hf_config__pos_num(src, rp, pre, "high_freq_factor", true, 0,
                                 &c->rope_high_freq_factor)) ||
        (rc = hf_config__int(src, rp, pre, "original_max_position_embeddings", true, 0, 1,
                             &c->rope_original_max_position)))
        return rc;
    if (c->rope_high_freq_factor <= c->rope_low_freq_factor) {
        pd_log_error("%s: %s.high_freq_factor: %g must exceed low_freq_factor %g", src, field,
                     c->rope_high_freq_factor, c->rope_low_freq_factor);
        return PD_ERR_FORMAT;
    }
    return PD_OK;
}

static pd_status_t hf_config__tokens(const char *src, const json_t *root, hf_config_t *c)
{
    json_t *eos = json_object_get(root, "eos_token_id");
    pd_status_t rc;

    if ((rc = hf_config__int(src, root, "", "bos_token_id", false, -1, 0, &c->bos_token_id)))
        return rc;
    if (c->bos_token_id >= c->vocab_size) {
        pd_log_error("%s: bos_token_id: %d not below vocab_size %d", src, c->bos_token_id,
                     c->vocab_size);
        return PD_ERR_FORMAT;
    }
    c->n_eos = 0;
    if (!eos || json_is_null(eos))
        return PD_OK;
    if (json_is_integer(eos)) {
        if ((rc =
                 hf_config__int(src, root, "", "eos_token_id", false, -1, 0, &c->eos_token_ids[0])))
            return rc;
        c->n_eos = 1;
    } else if (json_is_array(eos)) {
        if (json_array_size(eos) > HF_MAX_EOS) {
            pd_log_error("%s: eos_token_id: %zu ids, at most %d supported", src,
                         json_array_size(eos), HF_MAX_EOS);
            return PD_ERR_FORMAT;
        }
        for (size_t i = 0; i < json_array_size(eos); i++) {
            json_t *e = json_array_get(eos, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > INT_MAX) {
                pd_log_error("%s: eos_token_id[%zu]: expected a non-negative integer", src, i);
                return PD_ERR_FORMAT;
            }
            c->eos_token_ids[c->n_eos++] = (int)json_integer_value(e);
        }
    } else {
        pd_log_error("%s: eos_token_id: expected an integer or a list, got %s", src,
                     hf_config__type(eos));
        return PD_ERR_FORMAT;
    }
    for (int i = 0; i < c->n_eos; i++) {
        if (c->eos_token_ids[i] >= c->vocab_size) {
            pd_log_error("%s: eos_token_id: %d not below vocab_size %d", src, c->eos_token_ids[i],
                         c->vocab_size);
            return PD_ERR_FORMAT;
        }
    }
    return PD_OK;
}

static pd_status_t hf_config__moe(const char *src, const json_t *root, hf_config_t *c)
{
    const char *experts_key =
        json_object_get(root, "num_local_experts") ? "num_local_experts" : "num_experts";
    json_t *only = json_object_get(root, "mlp_only_layers");
    pd_status_t rc;

    if ((rc = hf_config__int(src, root, "", experts_key, true, 0, 1, &c->num_experts)) ||
        (rc = hf_config__int(src, root, "", "num_experts_per_tok", true, 0, 1,
                             &c->num_experts_per_tok)) ||
        (rc = hf_config__int(src, root, "", "moe_intermediate_size", true, 0, 1,
                             &c->moe_intermediate_size)) ||
        (rc = hf_config__int(src, root, "", "decoder_sparse_step", false, 1, 1,
                             &c->decoder_sparse_step)) ||
        (rc = hf_config__bool(src, root, "", "norm_topk_prob", false, &c->norm_topk_prob)))
        return rc;
    if (c->num_experts_per_tok > c->num_experts) {
        pd_log_error("%s: num_experts_per_tok: %d exceeds %s %d", src, c->num_experts_per_tok,
                     experts_key, c->num_experts);
        return PD_ERR_FORMAT;
    }
    if (!only || json_is_null(only))
        return PD_OK;
    if (!json_is_array(only)) {
        pd_log_error("%s: mlp_only_layers: expected a list, got %s", src, hf_config__type(only));
        return PD_ERR_FORMAT;
    }
    for (size_t i = 0; i < json_array_size(only); i++) {
        json_t *e = json_array_get(only, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) >= c->num_hidden_layers) {
            pd_log_error("%s: mlp_only_layers[%zu]: expected a layer index in [0, %d)", src, i,
                         c->num_hidden_layers);
            return PD_ERR_FORMAT;
        }
        c->mlp_only[json_integer_value(e)] = true;
    }
    return PD_OK;
}

/* The published FP8 layout (DeepSeek-V3, Kimi K2): e4m3 weights with a weight_scale_inv per
 * weight_block_size block; activations quantized dynamically (we run them in f32). */
/* GLM-4.5 and DeepSeek-V3: MoE from n_routed_experts after first_k_dense_replace dense layers,
 * grouped sigmoid routing, shared experts; MLA sizes for DeepSeek-V3. */
static pd_status_t hf_config__family(const char *src, const json_t *root, hf_config_t *c)
{
    char scoring[32], topk_method[32];
    int freq;
    pd_status_t rc;

    if ((rc = hf_config__int(src, root, "", "n_routed_experts", true, 0, 1, &c->num_experts)) ||
        (rc = hf_config__int(src, root, "", "num_experts_per_tok", true, 0, 1,
                             &c->num_experts_per_tok)) ||
        (rc = hf_config__int(src, root, "", "moe_intermediate_size", true, 0, 1,
                             &c->moe_intermediate_size)) ||
        (rc = hf_config__int(src, root, "", "first_k_dense_replace", false, 0, 0,
                             &c->first_k_dense_replace)) ||
        (rc = hf_config__int(src, root, "", "n_shared_experts", false, 0, 0,
                             &c->n_shared_experts)) ||
        (rc = hf_config__int(src, root, "", "n_group", false, 1, 1, &c->n_group)) ||
        (rc = hf_config__int(src, root, "", "topk_group", false, 1, 1, &c->topk_group)) ||
        (rc = hf_config__int(src, root, "", "moe_layer_freq", false, 1, 1, &freq)) ||
        (rc = hf_config__pos_num(src, root, "", "routed_scaling_factor", false, 1.0,
                                 &c->routed_scaling_factor)) ||
        (rc = hf_config__bool(src, root, "", "norm_topk_prob", false, &c->norm_topk_prob)) ||
        (rc = hf_config__bool(src, root, "", "use_qk_norm", false, &c->use_qk_norm)) ||
        (rc = hf_config__str(src, root, "", "scoring_func", false, scoring, sizeof scoring)) ||
        (rc = hf_config__str(src, root, "", "topk_method", false, topk_method, sizeof topk_method)))
        return rc;
    c->decoder_sparse_step = 1;
    c->moe_sigmoid = true;
    if (scoring[0] && strcmp(scoring, "sigmoid") != 0) {
        pd_log_error("%s: scoring_func: unsupported \"%s\" (supported: sigmoid)", src, scoring);
        return PD_ERR_UNSUPPORTED;
    }
    if (topk_method[0] && strcmp(topk_method, "noaux_tc") != 0) {
        pd_log_error("%s: topk_method: unsupported \"%s\" (supported: noaux_tc)", src, topk_method);
        return PD_ERR_UNSUPPORTED;
    }
    if (freq != 1) {
        pd_log_error("%s: moe_layer_freq: %d unsupported (supported: 1)", src, freq);
        return PD_ERR_UNSUPPORTED;
    }
    if (c->num_experts_per_tok > c->num_experts || c->num_experts % c->n_group != 0 ||
        c->topk_group > c->n_group ||
        c->num_experts_per_tok > c->topk_group * (c->num_experts / c->n_group)) {
        pd_log_error("%s: num_experts_per_tok %d, n_routed_experts %d, n_group %d, topk_group %d: "
                     "experts must split into the groups and the chosen groups hold the top-k",
                     src, c->num_experts_per_tok, c->num_experts, c->n_group, c->topk_group);
        return PD_ERR_FORMAT;
    }
    if (c->n_group > 1 && c->num_experts / c->n_group < 2) {
        pd_log_error("%s: n_group: %d groups of %d experts (need at least 2 per group)", src,
                     c->n_group, c->num_experts / c->n_group);
        return PD_ERR_FORMAT;
    }
    for (int i = 0; i < c->first_k_dense_replace && i < c->num_hidden_layers; i++)
        c->mlp_only[i] = true;
    if (c->arch != HF_ARCH_DEEPSEEK_V3)
        return PD_OK;
    if ((rc = hf_config__int(src, root, "", "q_lora_rank", false, 0, 0, &c->q_lora_rank)) ||
        (rc = hf_config__int(src, root, "", "kv_lora_rank", true, 0, 1, &c->kv_lora_rank)) ||
        (rc =
             hf_config__int(src, root, "", "qk_nope_head_dim", true, 0, 1, &c->qk_nope_head_dim)) ||
        (rc =
             hf_config__int(src, root, "", "qk_rope_head_dim", true, 0, 2, &c->qk_rope_head_dim)) ||
        (rc = hf_config__int(src, root, "", "v_head_dim", true, 0, 1, &c->v_head_dim)))
        return rc;
    if (c->qk_rope_head_dim % 2) {
        pd_log_error("%s: qk_rope_head_dim: %d is odd (rotary embeddings need pairs)", src,
                     c->qk_rope_head_dim);
        return PD_ERR_FORMAT;
    }
    if (c->kv_lora_rank + c->qk_rope_head_dim > 4096 ||
        c->qk_nope_head_dim + c->qk_rope_head_dim > 4096 || c->v_head_dim > 4096) {
        pd_log_error("%s: kv_lora_rank %d / head dims too large (at most 4096)", src,
                     c->kv_lora_rank);
        return PD_ERR_UNSUPPORTED;
    }
    c->rotary_dim = c->qk_rope_head_dim;
    return PD_OK;
}

static pd_status_t hf_config__quant_fp8_block(const char *src, const json_t *q, hf_config_t *c)
{
    json_t *bs = json_object_get(q, "weight_block_size");
    char fmt[16];
    pd_status_t rc;

    if ((rc = hf_config__str(src, q, "quantization_config.", "fmt", false, fmt, sizeof fmt)))
        return rc;
    if (fmt[0] && strcmp(fmt, "e4m3") != 0) {
        pd_log_error("%s: quantization_config.fmt: unsupported \"%s\" (supported: e4m3)", src, fmt);
        return PD_ERR_UNSUPPORTED;
    }
    if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(json_array_get(bs, 0)) ||
        !json_is_integer(json_array_get(bs, 1)) || json_integer_value(json_array_get(bs, 0)) < 1 ||
        json_integer_value(json_array_get(bs, 0)) > 65536 ||
        json_integer_value(json_array_get(bs, 1)) < 1 ||
        json_integer_value(json_array_get(bs, 1)) > 65536) {
        pd_log_error("%s: quantization_config.weight_block_size: expected [block_n, block_k] "
                     "(positive integers)",
                     src);
        return PD_ERR_FORMAT;
    }
    strcpy(c->quant_format, "fp8_block");
    strcpy(c->quant_lm_head, "bf16");
    c->quant_block_n = (int)json_integer_value(json_array_get(bs, 0));
    c->quant_block_k = (int)json_integer_value(json_array_get(bs, 1));
    return PD_OK;
}

static pd_status_t hf_config__quant(const char *src, const json_t *root, hf_config_t *c)
{
    json_t *q = json_object_get(root, "quantization_config");
    char method[32];
    pd_status_t rc;

    if (!q || json_is_null(q))
        return PD_OK;
    if (!json_is_object(q)) {
        pd_log_error("%s: quantization_config: expected an object, got %s", src,
                     hf_config__type(q));
        return PD_ERR_FORMAT;
    }
    if ((rc = hf_config__str(src, q, "quantization_config.", "quant_method", true, method,
                             sizeof method)))
        return rc;
    if (strcmp(method, "fp8") == 0)
        return hf_config__quant_fp8_block(src, q, c);
    if (strcmp(method, "pdserve") != 0) {
        pd_log_error("%s: quantization_config.quant_method: unsupported method \"%s\" "
                     "(supported: pdserve, fp8)",
                     src, method);
        return PD_ERR_UNSUPPORTED;
    }
    if ((rc = hf_config__str(src, q, "quantization_config.", "format", true, c->quant_format,
                             sizeof c->quant_format)) ||
        (rc = hf_config__int(src, q, "quantization_config.", "group_size", false, 0, 1,
                             &c->quant_group_size)) ||
        (rc = hf_config__str(src, q, "quantization_config.", "lm_head", false, c->quant_lm_head,
                             sizeof c->quant_lm_head)))
        return rc;
    if (strcmp(c->quant_format, "fp8") != 0 && strcmp(c->quant_format, "int4") != 0) {
        pd_log_error("%s: quantization_config.format: unsupported format \"%s\" (supported: fp8, "
                     "int4)",
                     src, c->quant_format);
        return PD_ERR_UNSUPPORTED;
    }
    if (strcmp(c->quant_format, "int4") == 0 && c->quant_group_size == 0) {
        pd_log_error("%s: quantization_config.group_size: required for format int4", src);
        return PD_ERR_FORMAT;
    }
    if (!c->quant_lm_head[0])
        strcpy(c->quant_lm_head, "bf16");
    if (strcmp(c->quant_lm_head, "bf16") != 0 && strcmp(c->quant_lm_head, "fp8") != 0 &&
        strcmp(c->quant_lm_head, "int4") != 0) {
        pd_log_error("%s: quantization_config.lm_head: unsupported \"%s\" (supported: bf16, fp8, "
                     "int4)",
                     src, c->quant_lm_head);
        return PD_ERR_UNSUPPORTED;
    }
    return PD_OK;
}

/* ==== public ==== */

pd_status_t hf_config_parse(const char *text, size_t len, const char *source, hf_config_t *cfg_p)
{
    const char *src = source ? source : "config.json";
    hf_config_t *c = calloc(1, sizeof *c);
    json_error_t jerr;
    json_t *root;
    pd_status_t rc;

    if (!c)
        return PD_ERR_NOMEM;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        pd_log_error("%s:%d:%d: invalid json: %s", src, jerr.line, jerr.column, jerr.text);
        rc = PD_ERR_FORMAT;
        goto err_free_cfg;
    }
    if (!json_is_object(root)) {
        pd_log_error("%s: top level is %s, expected an object", src, hf_config__type(root));
        rc = PD_ERR_FORMAT;
        goto err_free_json;
    }
    if ((rc = hf_config__arch(src, root, c)) || (rc = hf_config__sizes(src, root, c)) ||
        (rc = hf_config__rope(src, root, c)) || (rc = hf_config__tokens(src, root, c)) ||
        (c->arch == HF_ARCH_QWEN3_MOE && (rc = hf_config__moe(src, root, c))) ||
        ((c->arch == HF_ARCH_GLM4_MOE || c->arch == HF_ARCH_DEEPSEEK_V3) &&
         (rc = hf_config__family(src, root, c))) ||
        (rc = hf_config__quant(src, root, c)))
        goto err_free_json;
    json_decref(root);
    *cfg_p = *c;
    free(c);
    return PD_OK;

err_free_json:
    json_decref(root);
err_free_cfg:
    free(c);
    return rc;
}

pd_status_t hf_config_load(const char *path, hf_config_t *cfg_p)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    size_t len;
    long size;
    pd_status_t rc;

    if (!f) {
        pd_log_error("%s: cannot open: %s", path, strerror(errno));
        return PD_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        pd_log_error("%s: cannot read: %s", path, strerror(errno));
        rc = PD_ERR_IO;
        goto err_close;
    }
    if ((size_t)size > HF_CONFIG__MAX_FILE) {
        pd_log_error("%s: %ld bytes, larger than the %zu byte bound", path, size,
                     HF_CONFIG__MAX_FILE);
        rc = PD_ERR_FORMAT;
        goto err_close;
    }
    buf = malloc((size_t)size + 1);
    if (!buf) {
        rc = PD_ERR_NOMEM;
        goto err_close;
    }
    len = fread(buf, 1, (size_t)size, f);
    if (len != (size_t)size) {
        pd_log_error("%s: short read (%zu of %ld bytes)", path, len, size);
        rc = PD_ERR_IO;
        goto err_free_buf;
    }
    rc = hf_config_parse(buf, len, path, cfg_p);
err_free_buf:
    free(buf);
err_close:
    fclose(f);
    return rc;
}

bool hf_config_layer_is_moe(const hf_config_t *cfg, int layer)
{
    return cfg->num_experts > 0 && layer >= 0 && layer < cfg->num_hidden_layers &&
           layer < HF_MAX_LAYERS && !cfg->mlp_only[layer] && cfg->decoder_sparse_step > 0 &&
           (layer + 1) % cfg->decoder_sparse_step == 0;
}

bool hf_config_is_mla(const hf_config_t *cfg)
{
    return cfg->arch == HF_ARCH_DEEPSEEK_V3;
}

void hf_config_kv_shape(const hf_config_t *cfg, int *n_kv_heads, int *head_dim, int *n_sides)
{
    if (hf_config_is_mla(cfg)) {
        *n_kv_heads = 1;
        *head_dim = cfg->kv_lora_rank + cfg->qk_rope_head_dim;
        *n_sides = 1;
    } else {
        *n_kv_heads = cfg->num_key_value_heads;
        *head_dim = cfg->head_dim;
        *n_sides = 2;
    }
}

bool hf_config_is_stop(const hf_config_t *cfg, int32_t tok, bool ignore_eos,
                       const int32_t *stop_ids, int n_stop_ids)
{
    if (!ignore_eos)
        for (int i = 0; i < cfg->n_eos; i++)
            if (tok == cfg->eos_token_ids[i])
                return true;
    for (int i = 0; i < n_stop_ids; i++)
        if (tok == stop_ids[i])
            return true;
    return false;
}
