/* hf_config: the model hyperparameters of a Hugging Face config.json, validated.
 *
 * Supports the architectures pdserve can run (LlamaForCausalLM, Qwen3MoeForCausalLM,
 * Glm4MoeForCausalLM, DeepseekV3ForCausalLM) and accepts both the transformers 4 spelling
 * ("rope_theta", "rope_scaling", as the published GLM-4.5 / DeepSeek-V3 / Kimi K2 config.json files
 * write it) and the transformers 5 one ("rope_parameters"). Every field is checked where it is
 * read; an error names the source file and the field. hf_config_t is a plain value the caller owns
 * (no pointers inside), filled only on success. Pure functions apart from logging and, for
 * hf_config_load, reading the file; any thread.
 */
#ifndef PD_HF_CONFIG_H
#define PD_HF_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum {
    HF_ARCH_LLAMA = 0,
    HF_ARCH_QWEN3_MOE,
    HF_ARCH_GLM4_MOE,    /* Glm4MoeForCausalLM (GLM-4.5 / 4.6 / 4.5-Air) */
    HF_ARCH_DEEPSEEK_V3, /* DeepseekV3ForCausalLM (DeepSeek-V3 / R1, Kimi K2): MLA */
} hf_arch_t;

/* rope types */
#define HF_ROPE_DEFAULT 0
#define HF_ROPE_LLAMA3 1
#define HF_ROPE_YARN 2

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
    int rope_type;      /* HF_ROPE_*: rope_scaling / rope_parameters rope_type "llama3" | "yarn" */
    double rope_factor; /* llama3 and yarn, else 0 */
    double rope_low_freq_factor, rope_high_freq_factor; /* llama3 only, else 0 */
    int rope_original_max_position;                     /* llama3 and yarn, else 0 */
    double rope_beta_fast, rope_beta_slow;              /* yarn: default 32, 1 */
    double rope_mscale, rope_mscale_all_dim;            /* yarn: default 0 (absent) */
    /* dims of each head that rotate: head_dim * partial_rotary_factor (rope_parameters or top
     * level, default 1), qk_rope_head_dim for DeepSeek-V3 */
    int rotary_dim;
    bool rope_interleave; /* rotate pairs (2i, 2i+1) instead of halves (DeepSeek-V3) */
    int bos_token_id;                                                /* -1 when absent/null */
    int eos_token_ids[HF_MAX_EOS];
    int n_eos; /* eos_token_id int or list; 0 when absent/null */
    bool tie_word_embeddings, attention_bias, mlp_bias;
    /* Qwen3-MoE (zero for dense) */
    int num_experts; /* "num_experts", or "num_local_experts" as transformers 5 writes it */
    int num_experts_per_tok, moe_intermediate_size, decoder_sparse_step;
    bool norm_topk_prob;
    bool mlp_only[HF_MAX_LAYERS]; /* from mlp_only_layers, or layers < first_k_dense_replace */
    /* GLM-4.5 / DeepSeek-V3 MoE: num_experts from n_routed_experts; sigmoid scores plus
     * e_score_correction_bias choose the experts (noaux_tc, limited to the topk_group best of
     * n_group groups), the plain sigmoid scores weight them, times routed_scaling_factor */
    int first_k_dense_replace, n_shared_experts, n_group, topk_group;
    double routed_scaling_factor; /* 1 when absent */
    bool moe_sigmoid;             /* scoring_func "sigmoid" (GLM-4.5, DeepSeek-V3) */
    bool use_qk_norm;             /* GLM-4.5: RMSNorm on q and k per head */
    /* DeepSeek-V3 Multi-head Latent Attention (zero otherwise); q_lora_rank 0: plain q_proj */
    int q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    /* pdserve quantized checkpoints: config.json "quantization_config": {"quant_method":
     * "pdserve", "format": "fp8"|"int4", "group_size": 128, "lm_head": "bf16"|"fp8"|"int4"} */
    char quant_format[16];  /* "" when not quantized */
    int quant_group_size;   /* 0 when absent (required for int4) */
    char quant_lm_head[16]; /* "bf16" when quantized and absent, "" when not quantized */
    /* published FP8 checkpoints (DeepSeek-V3, Kimi K2): "quantization_config": {"quant_method":
     * "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}: quant_format "fp8_block", weights
     * e4m3 with one f32 weight_scale_inv per (block_n, block_k) block */
    int quant_block_n, quant_block_k;
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

/* The shape of one layer's cached KV: n_kv_heads heads of head_dim, in n_sides sides (2: K and
 * V; 1 for MLA, whose pages hold one latent "head" of kv_lora_rank + qk_rope_head_dim values). */
void hf_config_kv_shape(const hf_config_t *cfg, int *n_kv_heads, int *head_dim, int *n_sides);

/* True for an architecture with Multi-head Latent Attention (DeepSeek-V3 / Kimi K2). */
bool hf_config_is_mla(const hf_config_t *cfg);

/* The one end-of-generation test (engine, pipeline, router): tok is one of cfg's EOS ids (unless
 * ignore_eos) or one of stop_ids (n_stop_ids; may be NULL when 0). */
bool hf_config_is_stop(const hf_config_t *cfg, int32_t tok, bool ignore_eos,
                       const int32_t *stop_ids, int n_stop_ids);

#endif
