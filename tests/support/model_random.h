/* model_random: a model with random weights, for benchmarks and tests that need no checkpoint
 * (test support: not part of the production libraries). */
#ifndef PD_MODEL_RANDOM_H
#define PD_MODEL_RANDOM_H

#include "model.h"

/* Builds a model of cfg's shape (LlamaForCausalLM, or Qwen3MoeForCausalLM: q/k norm, a BF16
 * router, num_experts experts of moe_intermediate_size in every layer) with random weights on
 * be: weights of one shape share their values across layers (experts cycle through 4 value
 * sets, each expert its own copy); embeddings and norms bf16; seed fixes the values. For
 * benchmarks and tests that need no checkpoint. PD_ERR_UNSUPPORTED for other MoE configs,
 * PD_ERR_NOMEM / PD_ERR_CUDA from the backend; nothing is left allocated on failure. */
pd_status_t model_create_random(const hf_config_t *cfg, pd_wfmt_t wfmt, pd_wfmt_t lm_head_fmt,
                                pd_backend_t *be, uint64_t seed, model_t **m_p);

/* Builds a GLM-4.5 (Glm4MoeForCausalLM) or DeepSeek-V3 / Kimi K2 (DeepseekV3ForCausalLM) model
 * of cfg's shape (model_family.c's layers: dense layers before first_k_dense_replace, MoE with
 * shared experts and the noaux_tc router, GQA with biases or MLA with the absorbed W_UK / W_UV)
 * with random weights; one value set per weight shape, shared by every layer and expert; int4
 * weights whose K is not a multiple of 128 are fp8 (as model_load does for this family); a tensor
 * of more than 4M values repeats its first 4M (building a real-size shape takes seconds).
 * PD_ERR_UNSUPPORTED for other architectures. */
pd_status_t model_create_random_family(const hf_config_t *cfg, pd_wfmt_t wfmt,
                                       pd_wfmt_t lm_head_fmt, pd_backend_t *be, uint64_t seed,
                                       model_t **m_p);

#endif
