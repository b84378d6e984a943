/* model_family: the GLM-4.5 (Glm4MoeForCausalLM) and DeepSeek-V3 / Kimi K2
 * (DeepseekV3ForCausalLM) parts of the model: their layer weights and their forward, as new code
 * paths beside the Llama / Qwen3-MoE ones (model.c and model_forward.c call in here when
 * model_t.family is set).
 *
 * GLM-4.5: q/k/v biases, optional q/k RMSNorm (use_qk_norm), RoPE on the first
 * partial_rotary_factor of each head, dense layers before first_k_dense_replace, then MoE with
 * shared experts and the noaux_tc sigmoid router (bias chooses, plain scores weigh, times
 * routed_scaling_factor).
 * DeepSeek-V3: the same MoE with group-limited routing, and Multi-head Latent Attention: the KV
 * pages hold the compressed latent [c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)] per token
 * (a latent layout, kv_layout_init_sides with one side); attention runs in the absorbed form:
 * q_nope through W_UK^T against c_kv, plus q_pe . k_pe, softmax, the output through W_UV and
 * o_proj, for prefill and decode alike (so a prefill node and a decode node agree on the pages).
 *
 * Needs the backend's optional family ops (backend.h). Tensor parallelism as model.h describes it:
 * GLM-4.5's q/k/v and their biases by heads; MLA's q_b_proj (or q_proj), W_UK / W_UV by heads,
 * with q_a_proj, kv_a_proj_with_mqa and the latent cache replicated on every rank (tp_kv_layout
 * keeps a one-sided layout whole); o_proj and every down_proj by columns; gate_up of the dense MLP,
 * each expert and the shared experts by rows; the router whole. Same threading as model.h.
 */
#ifndef PD_MODEL_FAMILY_H
#define PD_MODEL_FAMILY_H

#include "model.h"
#include "model_impl.h"

/* model_family_arch, _check, _layer_load, _layer_free and _rope, which model.c calls, are
 * declared in model_impl.h (model.c may not include this header: the include would close a
 * cycle) and defined in model_family.c. */

/* The context's activation buffers the family forward uses (model_forward.c's scratch, sized
 * for the batch): x, h, tmp (n, d); q, k, v, attn (n, q_dim / kv_dim); gu (n, 2 f); act (n, f);
 * rlogits (n, n_experts); mw, mids (n, k). */
typedef struct {
    float *x, *h, *tmp, *q, *k, *v, *attn, *gu, *act, *rlogits, *mw;
    int32_t *mids, *d_pos, *d_slots;
} model_family_bufs_t;

/* Scratch only the family forward needs (MLA and shared experts), owned by a model context. */
typedef struct model_family_scratch model_family_scratch_t;

/* Grows *s to n rows (allocating it on first use). PD_ERR_NOMEM leaves *s as it was. */
pd_status_t model_family_reserve(model_family_scratch_t **s, const model_t *m, int n);
void model_family_scratch_free(model_family_scratch_t **s, pd_backend_t *be);

/* Enqueues every layer for n rows on x (embedded), writing the layers' KV (or latent) into
 * arena (layout l: this rank's KV heads under TP) at the slots in b->d_slots; x ends as the last
 * layer's output. Under TP the o_proj and MLP outputs are all-reduced; returns the communicator's
 * status (PD_OK at TP 1). */
pd_status_t model_family_layers(model_family_scratch_t *s, const model_t *m,
                                const model_family_bufs_t *b, void *arena, const kv_layout_t *l,
                                int n, const pd_attn_batch_t *ab);

#endif
