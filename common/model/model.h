/* model: a decoder-only transformer (LlamaForCausalLM, Qwen3MoeForCausalLM, Glm4MoeForCausalLM,
 * DeepseekV3ForCausalLM; the last two in model_family.c) loaded from a Hugging Face directory
 * (config.json + safetensors) onto a backend, and its forward pass over a paged KV cache, written
 * once against the backend ops table.
 *
 * Weights are kept in the requested format: bf16 (as stored), fp8 (e4m3, per-row scale) or int4
 * (g128 asymmetric), quantized at load from a BF16 checkpoint or read as-is from a checkpoint
 * written by `pdctl quantize` (config.json quantization_config). Embeddings, norms and MoE router
 * weights stay BF16; the LM head has its own format (default bf16). gate and up are fused into
 * one (2 f, d) matrix at load.
 *
 * A model is read-only after load and may be shared by several contexts (model_ctx_t), each owned
 * by one thread.
 *
 * Tensor parallelism (TP): a model loaded with a communicator of size > 1 holds rank r's shards
 * (tp_shard.h): q/k/v by heads, gate_up by FFN rows (every MoE expert too; the router stays
 * whole), o_proj and down_proj by columns, the LM head by vocab rows. The forward pass all-reduces
 * after o_proj and after down_proj / the MoE experts, and all-gathers the logits; every rank runs
 * the same batches in the same order, each on its own thread and backend, with a KV pool whose
 * layout has the rank's KV heads (tp_kv_layout). Without a communicator (TP 1) nothing changes.
 */
#ifndef PD_MODEL_H
#define PD_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "hf_config.h"
#include "kv_pool.h"
#include "quant.h"
#include "sampler.h"
#include "status.h"
#include "tp_comm.h"

typedef struct {
    uint16_t *attn_norm, *mlp_norm; /* (d) bf16 */
    uint16_t *q_norm, *k_norm;      /* (head_dim) bf16, Qwen3 only */
    pd_weight_t q, k, v;            /* (q_dim, d), (kv_dim, d), (kv_dim, d) (this rank's) */
    pd_weight_t o;                  /* (d, q_dim) */
    bool moe;
    pd_weight_t gate_up, down;      /* dense MLP: (2 f, d), (d, f); f = ffn (this rank's) */
    pd_weight_t router;             /* MoE: (n_experts, d) bf16, whole on every rank */
    pd_weight_t *exp_gate_up;       /* MoE: (n_experts) of (2 fm, d); fm = moe_ffn */
    pd_weight_t *exp_down;          /* MoE: (n_experts) of (d, fm) */
    /* GLM-4.5 / DeepSeek-V3 (model_family.c); NULL / empty otherwise */
    float *q_bias, *k_bias, *v_bias; /* (q_dim), (kv_dim), (kv_dim) f32: attention_bias */
    float *router_bias;              /* (n_experts) f32: e_score_correction_bias */
    pd_weight_t sh_gate_up, sh_down; /* shared experts: (2 fs, d), (d, fs); fs = n_shared * fm */
    /* MLA: q through q_a (qr, d), q_a_norm (qr), then q (H (nope + rope), qr) = q_b_proj, or
     * q_proj (k = d) without q LoRA; kv_a_proj_with_mqa split by rows into kv_a (r, d) and
     * kv_pe (rope, d); kv_a_norm (r) */
    pd_weight_t q_a, kv_a, kv_pe;
    uint16_t *q_a_norm, *kv_a_norm;
    uint16_t *w_uk_t; /* (H, r, nope) bf16: kv_b_proj's K rows of each head, transposed */
    uint16_t *w_uv;   /* (H, v, r) bf16: kv_b_proj's V rows of each head */
} model_layer_t;

typedef struct {
    hf_config_t cfg;
    pd_wfmt_t wfmt, lm_head_fmt;
    pd_backend_t *be;     /* borrowed */
    uint16_t *embed;      /* (vocab, d) bf16 */
    uint16_t *final_norm; /* (d) bf16 */
    pd_weight_t lm_head;  /* (vocab_local, d): rows [tp_rank * vocab_local, ...) */
    float *inv_freq;      /* (head_dim / 2) f32 */
    model_layer_t *layers;
    /* this rank's share (the whole model at TP 1) */
    int n_heads, n_kv_heads; /* cfg's heads / tp_size */
    int q_dim, kv_dim;       /* n_heads * head_dim, n_kv_heads * head_dim */
    int ffn, moe_ffn;        /* intermediate_size, moe_intermediate_size / tp_size */
    int vocab_local;         /* vocab_size / tp_size */
    int tp_rank, tp_size;    /* 0, 1 without a communicator */
    tp_comm_t *comm;         /* borrowed; NULL at TP 1 */
    size_t weight_bytes;  /* bytes of weights in backend memory */
    /* GLM-4.5 / DeepSeek-V3 (model_family.c) */
    bool family;      /* the forward runs model_family_layers */
    float rope_scale; /* yarn attention factor on the rotated dims (1 otherwise) */
    float attn_scale; /* MLA softmax scale: qk_head_dim^-1/2 * yarn mscale^2 */
} model_t;

typedef struct {
    const char *dir;          /* Hugging Face model directory */
    pd_wfmt_t wfmt;           /* format of the linear layers */
    pd_wfmt_t lm_head_fmt;    /* format of the LM head (bf16 by default) */
    pd_backend_t *be;
    bool progress;            /* draw a progress bar on a terminal */
    tp_comm_t *comm;          /* tensor parallel: load rank comm->rank's shards (borrowed, must
                                 outlive the model); NULL = TP 1 */
} model_load_params_t;

/* Loads and (if asked) quantizes the model; with p->comm, only this rank's shards are uploaded.
 * Errors name the file and the tensor or field: PD_ERR_IO / PD_ERR_FORMAT / PD_ERR_NOT_FOUND /
 * PD_ERR_UNSUPPORTED / PD_ERR_INVALID (e.g. int4 with a K not a multiple of 128, or a TP size
 * the heads, KV heads, FFN, vocab or int4 groups do not split into: tp_shard_check) /
 * PD_ERR_NOMEM. Nothing is left allocated on failure. */
pd_status_t model_load(const model_load_params_t *p, model_t **m_p);
void model_destroy(model_t *m);

/* Converts a host BF16 matrix (n, k) into a host weight of format fmt (data/scales/zeros
 * malloc'd; free with model_host_weight_free). PD_ERR_INVALID for int4 with k % 128 != 0. */
pd_status_t model_quantize_bf16(const uint16_t *src, int64_t n, int64_t k, pd_wfmt_t fmt,
                                pd_weight_t *w_p);
void model_host_weight_free(pd_weight_t *w);

/* One forward pass: a batch of sequences, each contributing a run of new tokens. */
typedef struct {
    int n_tokens;
    const int32_t *tokens;    /* (n_tokens) host */
    int n_seqs;
    const int32_t *q_start;   /* (n_seqs + 1) host: rows of each sequence */
    const int32_t *ctx_len;   /* (n_seqs) host: tokens in context after this step */
    const kv_seq_t *const *seqs; /* (n_seqs) block tables holding ctx_len tokens */
    int n_logits;
    const int32_t *logit_rows; /* (n_logits) host: rows whose logits are wanted */
} model_batch_t;

typedef struct model_ctx model_ctx_t;

/* A forward context of m (scratch grows on use). Registers every MoE layer's experts with the
 * backend where it can (ops->moe_prepare; a layer it declines keeps the host-grouped path).
 * PD_ERR_NOMEM, or the backend's error from the registration (nothing left allocated). */
pd_status_t model_ctx_create(const model_t *m, model_ctx_t **ctx_p);
void model_ctx_destroy(model_ctx_t *ctx);

/* How decode-only batches run (one token per sequence, logits of every row in order or none).
 * MODEL_GRAPHS_ON pads the batch to a bucket of 1, 2, 4, ... MODEL_GRAPH_MAX_BATCH sequences
 * (padded rows: token 0, position 0, KV slot -1 so they write no KV, context 1 on page 0; their
 * logits are dropped) and block tables to a power-of-two page count (at least
 * MODEL_GRAPH_MIN_PAGES), and replays one graph captured per (bucket, pages, logits or not);
 * the first batch of a shape runs eagerly and is then captured. MODEL_GRAPHS_EAGER runs the same
 * padded plan op by op (bit-identical to ON; for checks). MODEL_GRAPHS_OFF runs every batch as
 * given. Other batches (prefill, mixed) always run as given. */
typedef enum {
    MODEL_GRAPHS_OFF = 0,
    MODEL_GRAPHS_ON,
    MODEL_GRAPHS_EAGER,
} model_graphs_t;

#define MODEL_GRAPH_MAX_BATCH 64
#define MODEL_GRAPH_MIN_PAGES 16

/* Sets the mode; returns the mode in effect: ON and EAGER need a backend with graph capture
 * (ops->graph_begin) and a dense model, or an MoE model whose experts the backend registered
 * at model_ctx_create (ops->moe_prepare: routing grouped on the device, no host readback;
 * Qwen3-MoE, GLM-4.5 and DeepSeek-V3 on CUDA, but not FP8 block-scaled experts), else OFF.
 * The default of a new context is ON where possible. */
model_graphs_t model_ctx_set_graphs(model_ctx_t *ctx, model_graphs_t mode);

/* The mode in effect (a capture that fails turns the context's graphs OFF, with a log line). */
model_graphs_t model_ctx_graphs(const model_ctx_t *ctx);

/* Called by model_forward while it enqueues a batch, right after layer `layer`'s K/V write is
 * enqueued (the backend may not have run it yet): a callee that reads those pages enqueues its
 * reads behind it (ops->xfer_kv_export). */
typedef void (*model_layer_fn)(void *arg, int layer);

/* Sets the hook (fn NULL clears it). Returns false, and sets nothing, when this context's forward
 * cannot call it: model families with their own layer loop (GLM-4.5, DeepSeek-V3) and TP > 1.
 * Graph replays (decode batches) never call it: set it only around prefill forwards. */
bool model_ctx_set_layer_hook(model_ctx_t *ctx, model_layer_fn fn, void *arg);

/* Runs the batch: writes its K/V into the pages (arena, layout l), and the logits of the rows
 * asked for into logits_out (n_logits, vocab) host f32 (the whole vocab on every TP rank).
 * l must hold m->n_kv_heads heads. Under TP every rank must call this with the same batch.
 * PD_ERR_NOMEM (scratch growth) leaves the KV of this batch partially written; the caller must
 * not use those tokens. A communicator error (PD_ERR_CUDA, PD_ERR_INVALID) likewise, and leaves
 * the group unusable. */
pd_status_t model_forward(model_ctx_t *ctx, void *arena, const kv_layout_t *l,
                          const model_batch_t *b, float *logits_out);

/* Sampling inside the step (model_forward_sample): per logit row i of the batch (host arrays).
 * The draws come from the caller's samplers (sampler_draw), so a seed gives the same tokens
 * whichever backend runs. */
typedef struct {
    const float *temperature; /* (n_logits) 0: greedy */
    const int32_t *top_k;     /* (n_logits) 0: off */
    const float *top_p;       /* (n_logits) 1: off */
    const float *u;           /* (n_logits) draws in [0, 1) */
    const int32_t *n_top;     /* (n_logits) logprobs: -1 none, else that many alternatives
                                 (0..SAMPLER_MAX_TOP_LOGPROBS); NULL: no row wants them */
    /* logits processing before the pick (backend op logits_process; entries' rows are logit
     * rows); n_ent 0: none */
    int n_ent;
    const int32_t *ent; /* (n_ent, 4) row, token, output count, flags */
    const float *bias;  /* (n_ent) */
    const float *pen;   /* (n_logits, 3) presence, frequency, repetition */
} model_sampling_t;

/* Whether model_forward_sample can run on ctx's backend (ops sample, logprobs, logits_process). */
bool model_ctx_can_sample(const model_ctx_t *ctx);

/* As model_forward, but the logits stay in backend memory: the backend processes them
 * (smp->ent), takes the logprobs of the raw rows that ask (smp->n_top), samples one token per
 * logit row with smp's parameters and draws (ops->sample), and only the tokens (n_logits) int32
 * (and lp_out (n_logits) for the rows with n_top >= 0; may be NULL when smp->n_top is) come back
 * to the host. Decode-only batches on the graph path run all of it inside the captured step.
 * Results: those of model_forward, then sampler_logits_process_ref, sampler_pick and
 * sampler_logprobs on the host (the CPU backend bit for bit; CUDA within kernels/sample.h).
 * Errors as model_forward, and PD_ERR_UNSUPPORTED when !model_ctx_can_sample. */
pd_status_t model_forward_sample(model_ctx_t *ctx, void *arena, const kv_layout_t *l,
                                 const model_batch_t *b, const model_sampling_t *smp,
                                 int32_t *tokens_out, sampler_logprobs_t *lp_out);

#endif
