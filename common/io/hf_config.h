/* hf_config: the model hyperparameters of a Hugging Face config.json, validated.
 *
 * Supports the architectures pdserve can run (LlamaForCausalLM, Qwen3MoeForCausalLM) and accepts
 * both the transformers 4 spelling ("rope_theta", "rope_scaling") and the transformers 5 one
 * ("rope_parameters"). Every field is checked where it is read; an error names the source file and
 * the field. hf_config_t is a plain value the caller owns (no pointers inside), filled only on
 * success. Pure functions apart from logging and, for hf_config_load, reading the file; any thread.
 */
#ifndef PD_HF_CONFIG_H
#define PD_HF_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum { HF_ARCH_LLAMA = 0, HF_ARCH_QWEN3_MOE } hf_arch_t;

#define HF_MAX_EOS 8
#define HF_MAX_LAYERS 256

typedef struct {
    hf_arch_t arch;
    char architecture[64]; /* "LlamaForCausalLM" */
    char model_type[32];   /* "" when absent */
    int hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads;
    int head_dim; /* explicit, or hidden_size / num_attention_heads */
    int vocab_size, max_position_embeddings;
    double rms_norm_eps, rope_theta; /* rope_theta from "rope_theta" or transformers-5
                                        "rope_parameters": {"rope_theta"}; default 10000 */
    int rope_type; /* 0 default, 1 llama3 (rope_scaling / rope_parameters rope_type "llama3") */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor; /* llama3 only, else 0 */
    int rope_original_max_position;                                  /* llama3 only, else 0 */
    int bos_token_id;                                                /* -1 when absent/null */
    int eos_token_ids[HF_MAX_EOS];
    int n_eos; /* eos_token_id int or list; 0 when absent/null */
    bool tie_word_embeddings, attention_bias, mlp_bias;
    /* Qwen3-MoE (zero for dense) */
    int num_experts; /* "num_experts", or "num_local_experts" as transformers 5 writes it */
    int num_experts_per_tok, moe_intermediate_size, decoder_sparse_step;
    bool norm_topk_prob;
    bool mlp_only[HF_MAX_LAYERS]; /* from mlp_only_layers */
    /* pdserve quantized checkpoints: config.json "quantization_config": {"quant_method":
     * "pdserve", "format": "fp8"|"int4", "group_size": 128, "lm_head": "bf16"|"fp8"|"int4"} */
    char quant_format[16];  /* "" when not quantized */
    int quant_group_size;   /* 0 when absent (required for int4) */
    char quant_lm_head[16]; /* "bf16" when quantized and absent, "" when not quantized */
} hf_config_t;

/* Reads and validates the config.json at path. Returns PD_OK and fills *cfg_p; PD_ERR_IO when the
 * file cannot be read; otherwise as hf_config_parse. *cfg_p is untouched on failure. */
pd_status_t hf_config_load(const char *path, hf_config_t *cfg_p);

/* Parses and validates config.json text[0..len) (need not be NUL-terminated); source (NULL:
 * "config.json") names it in messages. Returns PD_OK and fills *cfg_p; PD_ERR_FORMAT for invalid
 * JSON (with line and column), a missing required field, a wrong type, a non-positive or
 * inconsistent value (e.g. num_attention_heads not a multiple of num_key_value_heads);
 * PD_ERR_UNSUPPORTED for an architecture, rope type or quantization method pdserve cannot run, or
 * more than HF_MAX_LAYERS layers. Each failure logs one error. *cfg_p is untouched on failure. */
pd_status_t hf_config_parse(const char *text, size_t len, const char *source, hf_config_t *cfg_p);

/* True when layer uses the sparse MoE block: num_experts > 0, layer not in mlp_only_layers, and
 * (layer + 1) % decoder_sparse_step == 0. False for dense models and layers out of range. */
bool hf_config_layer_is_moe(const hf_config_t *cfg, int layer);

/* The one end-of-generation test (engine, pipeline, router): tok is one of cfg's EOS ids (unless
 * ignore_eos) or one of stop_ids (n_stop_ids; may be NULL when 0). */
bool hf_config_is_stop(const hf_config_t *cfg, int32_t tok, bool ignore_eos,
                       const int32_t *stop_ids, int n_stop_ids);

#endif
