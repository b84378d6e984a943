/* backend: the compute ops table. The model's forward pass is written once against it; the CPU
 * backend (backend_cpu.c) is the plain C reference, the CUDA backend (kernels/) plugs in behind
 * the same table and is tested op by op against the CPU one.
 *
 * Buffers are backend memory (`void *` from ops->alloc): host memory for the CPU backend, device
 * memory for CUDA. Activations are f32 (the fused ops also hand FP8 activations, pd_act_fp8_t, to
 * the FP8 matmul). Shapes are given in the comments, row-major.
 * Index arrays (ids, positions, slots, block tables) are backend memory too, uploaded by the
 * caller. Ops run in order on the backend's single stream; `sync` waits for them. An op (void,
 * like a kernel launch) that fails — the CPU backend out of memory for its scratch, a failed CUDA
 * launch — reports at the next `sync` or `download`, which return its error (PD_ERR_NOMEM,
 * PD_ERR_CUDA) once; the outputs of the ops in between are garbage and must be dropped (the
 * engine fails the batch's requests and goes on). One thread (the node's compute thread) uses a
 * backend.
 */
#ifndef PD_BACKEND_H
#define PD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv_layout.h"
#include "kv_tracker.h"
#include "quant.h"
#include "status.h"

typedef struct pd_backend pd_backend_t;

typedef enum {
    PD_OP_EMBED = 0,
    PD_OP_RMSNORM,
    PD_OP_ADD,
    PD_OP_MATMUL,
    PD_OP_ROPE,
    PD_OP_SILU_MUL,
    PD_OP_KV_WRITE,
    PD_OP_ATTENTION,
    PD_OP_MOE_ROUTE,
    PD_OP_MOE_EXPERTS,
    PD_OP_KV_STAMP,
    PD_OP_KV_CHECK,
    PD_OP_KV_EXPORT,
    PD_OP_LOGITS_PROCESS,
    /* GLM-4.5 / DeepSeek-V3 (optional table entries below) */
    PD_OP_BIAS_ADD,
    PD_OP_ROPE_PARTIAL,
    PD_OP_MOE_ROUTE_GROUPED,
    PD_OP_HEAD_MATMUL,
    PD_OP_LATENT_WRITE,
    PD_OP_LATENT_ATTENTION,
    PD_OP__COUNT
} pd_op_t;

/* Sequences of one attention call. Token rows of sequence s are q rows
 * [q_start[s], q_start[s+1]); their positions are ctx_len[s] - (q_start[s+1] - q_start[s]) ...
 * ctx_len[s] - 1 (causal: each row sees positions <= its own). block_tables is
 * (n_seqs, max_pages) int32 page ids. All arrays are backend memory. */
typedef struct {
    int n_seqs;
    int max_pages;
    const int32_t *q_start;      /* (n_seqs + 1) */
    const int32_t *ctx_len;      /* (n_seqs) */
    const int32_t *block_tables; /* (n_seqs, max_pages) */
    /* host-side hints for backends that size launches on the host (CUDA); 0 = unknown (the
     * backend then reads q_start[n_seqs] back): the number of q rows (q_start[n_seqs]) and an
     * upper bound of ctx_len[] */
    int n_rows;
    int max_ctx;
} pd_attn_batch_t;

/* FP8 activations for an FP8 (W8A8) matmul: row i of x (n, k) quantized as quant_fp8_vec does it,
 * x[i] ~ q[i] * scale[i] (the activation side of the FP8 matmul). blk: instead each 128-column
 * block of each row quantized as quant_fp8_vec does it, with its own scale, in the backend's
 * layout (the activations of the CUDA backend's W4A8 INT4 GEMM, kernels/matmul.h's blk layout):
 * q then holds up to n rounded up to 16 rows of k bytes, scale up to that many rows times k / 128
 * floats. Backend memory. */
typedef struct {
    uint8_t *q;   /* (n, k) fp8 e4m3 */
    float *scale; /* (n) f32 */
    bool blk;     /* 1x128 blocks (only where act_quant asked for them) */
    /* instead the backend's f16 activation image (PD_ACT_F16WG, only where act_quant asked for
     * it): q holds PD_ACT_WG_ROWS(n) * k f16 in the backend's layout, scale (n) multipliers */
    bool wg;
    /* instead the backend's plain f16 activations (PD_ACT_F16, only where act_quant asked for
     * them): q holds n * k f16 in the backend's layout, scale (n) multipliers */
    bool f16;
} pd_act_fp8_t;

/* What matmul makes of its f32 activations for a weight (act_quant): nothing (F32), or fp8 per
 * row (FP8_ROW: FP8 weights) or in 1x128 blocks (FP8_BLK), or an f16 image (F16WG: the CUDA
 * backend's wgmma INT4 GEMM of the decode batches), or plain f16 rows (F16: the CUDA backend's
 * INT4 K-split GEMV of the small decode batches), that the fused ops can make instead. */
typedef enum {
    PD_ACT_F32 = 0,
    PD_ACT_FP8_ROW,
    PD_ACT_FP8_BLK,
    PD_ACT_F16WG,
    PD_ACT_F16,
} pd_act_t;

/* What matmul_fused makes its activations of (the op it folds into the matmul): x as it is
 * (NONE), rmsnorm(x) * w (RMSNORM), silu_mul(x) (SILU_MUL). */
typedef enum {
    PD_PRO_NONE = 0,
    PD_PRO_RMSNORM,
    PD_PRO_SILU_MUL,
} pd_pro_t;

/* What matmul_fused does with its product: stores it (NONE), adds it to the output (ACC: the
 * residual add), or stores silu_mul of it (SILU_MUL: the gate_up matmul's product (n, 2f) never
 * stored, its output (n, f)). */
typedef enum {
    PD_EPI_NONE = 0,
    PD_EPI_ACC,
    PD_EPI_SILU_MUL,
} pd_epi_t;

/* act_quant answers PD_ACT_F16WG only for n <= PD_ACT_WG_MAX_N rows; its image then takes
 * PD_ACT_WG_ROWS(n) * k * 2 bytes of q (the rows rounded up to 64); PD_ACT_F16 also only for n
 * <= PD_ACT_WG_MAX_N (n * k * 2 bytes) */
#define PD_ACT_WG_MAX_N 256
#define PD_ACT_WG_ROWS(n) (((n) + 63) / 64 * 64)

typedef struct {
    const char *name;
    bool (*supports_op)(pd_backend_t *be, pd_op_t op, int variant /* pd_wfmt_t or pd_kvfmt_t */);
    void (*destroy)(pd_backend_t *be);

    /* memory: alloc returns PD_ERR_NOMEM when out of memory */
    pd_status_t (*alloc)(pd_backend_t *be, size_t bytes, void **ptr_p);
    void (*free)(pd_backend_t *be, void *ptr);
    pd_status_t (*upload)(pd_backend_t *be, void *dst, const void *src_host, size_t bytes);
    pd_status_t (*download)(pd_backend_t *be, void *dst_host, const void *src, size_t bytes);
    pd_status_t (*memset)(pd_backend_t *be, void *dst, int value, size_t bytes);
    /* device-to-device copy */
    pd_status_t (*copy)(pd_backend_t *be, void *dst, const void *src, size_t bytes);
    pd_status_t (*sync)(pd_backend_t *be);

    /* out (n, d) f32 = bf16 table (vocab, d) rows ids (n) int32 */
    void (*embed)(pd_backend_t *be, float *out, const uint16_t *table, const int32_t *ids, int n,
                  int d);
    /* out (n, d) = x (n, d) / rms(x) * w (d) bf16; out may equal x */
    void (*rmsnorm)(pd_backend_t *be, float *out, const float *x, const uint16_t *w, int n, int d,
                    float eps);
    /* x (n) += y (n) */
    void (*add)(pd_backend_t *be, float *x, const float *y, size_t n);
    /* out (n, w->n) f32 = x (n, w->k) f32 @ W^T. FP8: x is quantized per row to fp8 first. */
    void (*matmul)(pd_backend_t *be, float *out, const float *x, const pd_weight_t *w, int n);
    /* in place rotate-half RoPE on x (n, n_heads, head_dim) at positions pos (n) int32;
     * inv_freq (head_dim / 2) f32 */
    void (*rope)(pd_backend_t *be, float *x, const int32_t *pos, const float *inv_freq, int n,
                 int n_heads, int head_dim);
    /* out (n, f) = silu(gu[:, :f]) * gu[:, f:], gu (n, 2f) */
    void (*silu_mul)(pd_backend_t *be, float *out, const float *gu, int n, int f);
    /* writes k, v (n, n_kv_heads, head_dim) f32 into the arena at slots (n) int32
     * (slot = page * page_tokens + offset; a negative slot writes nothing: padded rows),
     * converting to the layout's dtype (fp8: per (token, head) scale) */
    void (*kv_write)(pd_backend_t *be, void *arena, const kv_layout_t *l, int layer, const float *k,
                     const float *v, const int32_t *slots, int n);
    /* out (n, n_heads, head_dim) = softmax(q k^T / sqrt(head_dim)) v over the paged cache,
     * q (n, n_heads, head_dim); GQA: head h reads kv head h / (n_heads / n_kv_heads) */
    void (*attention)(pd_backend_t *be, float *out, const float *q, const void *arena,
                      const kv_layout_t *l, int layer, const pd_attn_batch_t *batch, int n_heads);
    /* top-k softmax router: logits (n, n_experts) -> ids (n, k) int32, weights (n, k) f32;
     * softmax over all experts, take the k largest (ties: lower id), renormalize when norm */
    void (*moe_route)(pd_backend_t *be, int32_t *ids, float *weights, const float *logits, int n,
                      int n_experts, int k, bool norm);
    /* out (n, d) = sum_j weights[i, j] * down_e(silu_mul(gate_up_e(x_i))), e = ids[i, j];
     * gate_up[e] (2f, d), down[e] (d, f); scratch as returned by moe_scratch_bytes */
    void (*moe_experts)(pd_backend_t *be, float *out, const float *x, const int32_t *ids,
                        const float *weights, const pd_weight_t *gate_up, const pd_weight_t *down,
                        int n, int k, int d, int f);
    /* writes tags (n) into the headers of pages (n) (host arrays) */
    void (*kv_stamp)(pd_backend_t *be, void *arena, const kv_layout_t *l, const int32_t *pages,
                     const kv_tag_t *tags, int n);
    /* the integrity check: for each i, bad_out[i] = 1 if current[i] != expected[i], else 2 if the
     * stamp in page pages[i]'s header != expected[i], else 0; found_out[i] = that stamp.
     * pages, expected, current, bad_out, found_out are host arrays (n). */
    void (*kv_check)(pd_backend_t *be, uint8_t *bad_out, kv_tag_t *found_out, const void *arena,
                     const kv_layout_t *l, const int32_t *pages, const kv_tag_t *expected,
                     const kv_tag_t *current, int n);
    /* digests_out[i] = kv_digest_page (kv_digest.h) of page i of backend memory: at
     * base + pages[i] * page_bytes, or with pages NULL at base + i * page_bytes (packed);
     * pages and digests_out are host arrays (n); page_bytes a multiple of 16. Waits for what was
     * enqueued before it (not inside a capture). Returns the backend's first failure or its own;
     * digests_out is unspecified then. The KV-done checksum of pages in GPU memory, computed
     * where they are: only 8 bytes a page cross to the host. */
    pd_status_t (*page_digest)(pd_backend_t *be, uint64_t *digests_out, const void *base,
                               size_t page_bytes, const int32_t *pages, int n);
    /* converts n_pages pages src_pages (host int32) of arena (layout src_l, bf16 or f32) into
     * dst_l's format (fp8 with scales) at dst (backend memory, n_pages * dst_l->page_bytes,
     * packed in order); headers are copied */
    void (*kv_export)(pd_backend_t *be, void *dst, const kv_layout_t *dst_l, const void *arena,
                      const kv_layout_t *src_l, const int32_t *src_pages, int n_pages);
    /* the sampler's logits processing (penalties, logit bias, min_tokens masks) in place on
     * logits (n, vocab) f32: entries ent (n_ent, 4) int32 (row, token, output count, flags
     * SAMPLER_ENT_*), bias (n_ent) f32, pen (n, 3) f32 (presence, frequency, repetition per
     * row); each (row, token) at most once; semantics of sampler_logits_process_ref. All arrays
     * backend memory. */
    void (*logits_process)(pd_backend_t *be, float *logits, int n, int vocab, const int32_t *ent,
                           const float *bias, int n_ent, const float *pen);

    /* ---- optional capabilities: NULL where the backend lacks them ---- */

    /* -- GLM-4.5 and DeepSeek-V3 / Kimi K2 (model_family.c); a backend without them cannot run
     * those families (model_load says so) -- */

    /* x (n, d) += bias (d) f32, every row */
    void (*bias_add)(pd_backend_t *be, float *x, const float *bias, int n, int d);
    /* in place RoPE on the first rot_dim dims of each head of x (n, n_heads, head_dim) at
     * positions pos (n) int32, inv_freq (rot_dim / 2) f32; the rotated dims are multiplied by
     * scale (yarn's attention factor; 1 otherwise). interleave: pairs (2j, 2j + 1) turn by
     * inv_freq[j] (DeepSeek-V3's rope_interleave; transformers permutes to halves first, which
     * leaves every q.k product the same); else halves (j, j + rot_dim / 2), as rope does. */
    void (*rope_partial)(pd_backend_t *be, float *x, const int32_t *pos, const float *inv_freq,
                         int n, int n_heads, int head_dim, int rot_dim, bool interleave,
                         float scale);
    /* noaux_tc router (DeepSeek-V3, GLM-4.5): s = sigmoid(logits (n, n_experts)); the choice
     * uses s + bias (n_experts) f32: groups (n_group of n_experts / n_group) ranked by the sum
     * of their two best, the topk_group best groups kept (others' scores 0, as transformers
     * masks), then the k best experts (ties: lower id) -> ids (n, k) int32; weights (n, k) f32
     * are the plain s of those, divided by their sum (+1e-20) when norm, times scale */
    void (*moe_route_grouped)(pd_backend_t *be, int32_t *ids, float *weights, const float *logits,
                              const float *bias, int n, int n_experts, int k, int n_group,
                              int topk_group, bool norm, float scale);
    /* a matmul per head: out (n, n_heads, nout) = x[:, h, :kin] @ W_h^T for each head h, x
     * (n, n_heads, x_stride) with x_stride >= kin, w (n_heads, nout, kin) bf16 (MLA: q_nope
     * through W_UK^T, the latent output through W_UV) */
    void (*head_matmul)(pd_backend_t *be, float *out, const float *x, const uint16_t *w, int n,
                        int n_heads, int nout, int kin, int x_stride);
    /* writes the MLA latent of n tokens into side 0 of a latent layout (n_sides 1, one head of
     * head_dim = r + rope): [c (n, r) | kpe (n, rope)] f32 at slots (n) int32 (negative: no
     * write; the others distinct: tokens are written in parallel on a GPU), converted to the
     * layout's dtype (fp8: one scale per token) */
    void (*latent_write)(pd_backend_t *be, void *arena, const kv_layout_t *l, int layer,
                         const float *c, const float *kpe, const int32_t *slots, int n, int r);
    /* absorbed MLA attention over a latent layout: for row i, head h, context token t
     * (causal, as attention): score = (q_lat[i, h] . c_t + q_pe[i, h] . kpe_t) * scale,
     * out (n, n_heads, r) = softmax(score) . c; q_lat (n, n_heads, r), q_pe (n, n_heads,
     * pe_stride) of which the first rope = l->head_dim - r values are read */
    void (*latent_attention)(pd_backend_t *be, float *out, const float *q_lat, const float *q_pe,
                             const void *arena, const kv_layout_t *l, int layer,
                             const pd_attn_batch_t *batch, int n_heads, int r, int pe_stride,
                             float scale);

    /* Called by backend_weight_upload on the weight it just uploaded: the backend may rewrite
     * data / scales / zeros in place into its own layout (CUDA: INT4 weights with n % 32 == 0
     * are tiled for the tensor-core kernels, kernels/matmul.h). Device weights are then only
     * meant for this backend's ops. */
    pd_status_t (*weight_prepare)(pd_backend_t *be, pd_weight_t *w);

    /* Graph capture (CUDA graphs): the ops enqueued between graph_begin and graph_end are
     * recorded, not run; graph_launch replays them on the stream with the buffer contents of
     * that moment. Ops inside a capture must not need the host (no download, sync, scratch
     * growth): such an op makes graph_end fail. graph_end returns PD_ERR_CUDA / PD_ERR_INTERNAL
     * when the capture broke (nothing is left captured); graph_launch returns PD_AGAIN when the
     * backend's scratch moved since the capture (free the graph and capture again). */
    pd_status_t (*graph_begin)(pd_backend_t *be);
    pd_status_t (*graph_end)(pd_backend_t *be, void **graph_p);
    pd_status_t (*graph_launch)(pd_backend_t *be, void *graph);
    void (*graph_free)(pd_backend_t *be, void *graph);

    /* tokens_out (n) int32 = one token per row of logits (n, vocab) f32 as sampler_pick does with
     * temperature[i] (0: greedy), top_k[i] (0: off), top_p[i] (1: off) and the draw u[i] in
     * [0, 1) (sampler_draw). All arrays backend memory; logits unchanged. Backends may restrict
     * the candidates (CUDA: kernels/sample.h says how). */
    void (*sample)(pd_backend_t *be, int32_t *tokens_out, const float *logits, int n, int vocab,
                   const float *temperature, const int32_t *top_k, const float *top_p,
                   const float *u);
    /* The logprobs of sampler_logprobs on the device: for each row i with n_top[i] >= 0,
     * ids_out[i, 0] = tokens[i] and vals_out[i, 0] its logprob under log_softmax(logits[i]);
     * ids_out[i, 1 + j], vals_out[i, 1 + j] for j < min(n_top[i], SAMPLER_MAX_TOP_LOGPROBS,
     * vocab) the best alternatives (descending, ties by lower id) and theirs. Rows with
     * n_top[i] < 0 and the slots past the alternatives are left as they were. ids_out, vals_out
     * (n, 1 + SAMPLER_MAX_TOP_LOGPROBS) int32 / f32; logits (n, vocab) f32; tokens, n_top (n)
     * int32; all backend memory. NULL where the backend lacks it. */
    void (*logprobs)(pd_backend_t *be, int32_t *ids_out, float *vals_out, const float *logits,
                     const int32_t *tokens, const int32_t *n_top, int n, int vocab);

    /* Fused ops (fewer passes over the activations); each gives the results of the plain ops it
     * stands for, and the model uses the plain ops where they are NULL.
     * add_rmsnorm: y != NULL: x (n, d) += y (n, d) (add); then out (n, d) = rmsnorm(x) * w as
     * rmsnorm does (out != x; out may be NULL) and, q != NULL, q = that output quantized to fp8
     * per row (pd_act_fp8_t), i.e. what matmul would make of it for an FP8 weight. */
    void (*add_rmsnorm)(pd_backend_t *be, float *x, const float *y, float *out, const uint16_t *w,
                        int n, int d, float eps, const pd_act_fp8_t *q);
    /* out (n, f) = silu_mul(gu) (out may be NULL) and, q != NULL, q = out quantized to fp8 */
    void (*silu_mul_fp8)(pd_backend_t *be, float *out, const float *gu, int n, int f,
                         const pd_act_fp8_t *q);
    /* out (n, w->n) f32 = matmul of x for an FP8 weight w, with x given as its quantization
     * x (n, w->k) from the ops above: the same result as matmul on the f32 x; x->blk: for a
     * weight act_quant answers PD_ACT_FP8_BLK for at this n (INT4 on the CUDA backend) */
    void (*matmul_fp8)(pd_backend_t *be, float *out, const pd_act_fp8_t *x, const pd_weight_t *w,
                       int n);
    /* How matmul on n rows for weight w quantizes its activations (pd_act_t): the fused ops
     * above can make them instead (q->blk for PD_ACT_FP8_BLK), and matmul_fp8 then takes them.
     * NULL: PD_ACT_FP8_ROW for FP8 weights, PD_ACT_F32 for the others. */
    pd_act_t (*act_quant)(pd_backend_t *be, const pd_weight_t *w, int n);
    /* The MLP's first half on FP8 activations: gu = matmul_fp8(x, w) for the FP8 gate_up weight
     * w (w->n = 2f), then q = silu_mul_fp8's quantization of silu_mul(gu) (q may be x: x is
     * read first). x->blk / q->blk: where act_quant says PD_ACT_FP8_BLK for both weights (INT4). gu
     * (n, 2f) f32 is scratch, its contents unspecified after: the CUDA backend keeps the product
     * there as bf16 at prefill sizes (written by the GEMM's epilogue, read once), so q may then
     * differ from the plain ops by the bf16 rounding of gu (one fp8 step on some elements);
     * elsewhere the plain ops' result exactly. */
    void (*matmul_silu_fp8)(pd_backend_t *be, const pd_act_fp8_t *q, float *gu,
                            const pd_act_fp8_t *x, const pd_weight_t *w, int n);

    /* Registers the experts of one MoE layer, gate_up (n_experts) and down (n_experts) weights
     * of this backend (the arrays moe_experts will be given; they must stay valid until the
     * backend is destroyed or the layer is registered again), so that moe_experts can run from
     * device-side routing alone (CUDA: expert offsets on the device, one grouped matmul per
     * projection, no host readback: the layer can be captured in a graph). PD_ERR_NOMEM /
     * PD_ERR_CUDA / PD_ERR_INVALID (a format or shape the grouped path lacks: moe_experts then
     * keeps its other path). NULL: nothing to register. */
    pd_status_t (*moe_prepare)(pd_backend_t *be, const pd_weight_t *gate_up,
                               const pd_weight_t *down, int n_experts);

    /* Sets one backend option (CUDA: kernels/backend_cuda.h lists them); PD_ERR_INVALID for an
     * unknown key or value. */
    pd_status_t (*set_option)(pd_backend_t *be, const char *key, const char *value);

    /* outs[i] (n, ws[i]->n) f32 = x (n, K) f32 @ ws[i]^T for i < count (1 .. 3, weights of the
     * same K): the attention block's q, k, v projections on the same activations in one pass
     * where the backend can (CUDA: tiled INT4 at the GEMV and wgmma batch sizes, one launch over
     * the weights' rows: matmul's values up to the summation order of the grouped plan;
     * elsewhere matmul per weight). NULL: the model runs matmul per weight. */
    void (*matmul_group)(pd_backend_t *be, float *const *outs, const float *x,
                         const pd_weight_t *const *ws, int count, int n);
    /* matmul_group on activations the fused ops made in the format act_quant asked for (x as
     * matmul_fp8 takes it; the same for every weight): matmul_fp8 per weight, in one launch
     * where the backend can. NULL: the model runs matmul_fp8 per weight. */
    void (*matmul_group_fp8)(pd_backend_t *be, float *const *outs, const pd_act_fp8_t *x,
                             const pd_weight_t *const *ws, int count, int n);

    /* The decode layer's small ops folded into its matmuls (CUDA: tiled INT4 at the slice
     * GEMV's batch sizes: no add + RMSNorm or SiLU·mul launch, no separate residual add).
     * matmul_fused_ok: whether matmul_fused takes w at n with prologue pro and epilogue epi
     * (false: the model runs the plain ops).
     * matmul_fused: a @ ws[i]^T for i < count (1 .. 3 weights of the same K, each one
     * matmul_fused_ok said yes for at n), a made of x by pro: PD_PRO_NONE x (n, K);
     * PD_PRO_RMSNORM rmsnorm(x) * norm_w with eps (x (n, K), left unchanged); PD_PRO_SILU_MUL
     * silu_mul(x) (x (n, 2K)); the product by epi: PD_EPI_NONE outs[i] (n, ws[i]->n) = it;
     * PD_EPI_ACC outs[i] += it; PD_EPI_SILU_MUL (one weight) outs[0] (n, ws[0]->n / 2) =
     * silu_mul(it). No output overlaps x. The values are the plain ops' (rmsnorm, matmul, add,
     * silu_mul) up to the summation order of the norm's sum of squares (CUDA: the rest gives the
     * plain ops' bits). NULL: the model runs the plain ops. */
    bool (*matmul_fused_ok)(pd_backend_t *be, const pd_weight_t *w, int n, pd_pro_t pro,
                            pd_epi_t epi);
    void (*matmul_fused)(pd_backend_t *be, float *const *outs, const float *x, pd_pro_t pro,
                         const uint16_t *norm_w, float eps, const pd_weight_t *const *ws,
                         int count, int n, pd_epi_t epi);

    /* rope on q (n, n_heads, head_dim) and k (n, l->n_kv_heads, head_dim), then kv_write of k
     * and v at slots, in one launch; the same results as rope, rope, kv_write (CUDA:
     * bit-identical). NULL: the model runs the three ops. */
    void (*rope_kv_write)(pd_backend_t *be, float *q, float *k, const float *v, const int32_t *pos,
                          const float *inv_freq, int n, int n_heads, void *arena,
                          const kv_layout_t *l, int layer, const int32_t *slots);
    /* The attention block's start without q / k norms: q, k, v = x @ wq^T, wk^T, wv^T from the
     * FP8 activations x (n rows; q (n, n_heads, head_dim), k, v (n, l->n_kv_heads, head_dim)
     * f32), then rope_kv_write. The plain ops in sequence: matmul_fp8 three times, then rope on
     * q and k and kv_write (CPU: exactly those). CUDA with PD_CUDA_QKV_BF16=1 at prefill sizes
     * (the cuBLASLt GEMMs): the GEMMs write bf16 and kv_rope_write_bf16 reads it, so q and the
     * pages carry the bf16 rounding of the products, and k and v hold scratch afterwards.
     * NULL: the model runs the ops. */
    void (*qkv_rope_write)(pd_backend_t *be, float *q, float *k, float *v, const pd_act_fp8_t *x,
                           const pd_weight_t *wq, const pd_weight_t *wk, const pd_weight_t *wv,
                           const int32_t *pos, const float *inv_freq, int n, int n_heads,
                           void *arena, const kv_layout_t *l, int layer, const int32_t *slots);

    /* -- the KV transfer stream: a prefill node exports layer L's pages while layer L + 1
     * computes. NULL where the backend has none (the node then exports after each chunk). --
     * xfer_kv_export: enqueued on a second stream behind everything enqueued on the compute
     * stream so far (CPU: runs at once, the ops before it having run); converts layers
     * [layer0, layer0 + n_layers) of pages src_pages (n) of arena (src_l, as kv_export) into
     * dst_l's format, page i at dst + dst_pages[i] * dst_l->page_bytes (dst_pages NULL: at
     * dst + i * page_bytes, packed); layer0 == 0 also writes the 64-byte header, copied from
     * the source page with its stamp replaced by tags[i] when tags is not NULL, and zeros in
     * the page's bytes past its data and scales (if any), so a page written layer by layer is
     * defined everywhere. src_pages,
     * dst_pages (int32) and tags (uint64) are backend memory (n each) that must stay unchanged
     * until xfer_sync; dst may be another process's pool (CUDA IPC).
     * xfer_download: on that stream, dst_host (bytes) = src; dst_host is filled when xfer_sync
     * returns PD_OK.
     * xfer_sync: waits for the transfer stream; returns its first failure since the last
     * xfer_sync (once), after which what it wrote must not be sent. */
    void (*xfer_kv_export)(pd_backend_t *be, void *dst, const kv_layout_t *dst_l,
                           const int32_t *dst_pages, const kv_tag_t *tags, const void *arena,
                           const kv_layout_t *src_l, const int32_t *src_pages, int n, int layer0,
                           int n_layers);
    void (*xfer_download)(pd_backend_t *be, void *dst_host, const void *src, size_t bytes);
    pd_status_t (*xfer_sync)(pd_backend_t *be);
} pd_backend_ops_t;

struct pd_backend {
    const pd_backend_ops_t *ops;
    void *impl;
    int n_threads;
};

/* CPU backend with n_threads threads (0: all cores). Results do not depend on n_threads. */
pd_status_t backend_cpu_create(int n_threads, pd_backend_t **be_p);

/* CUDA backend on device `device`; PD_ERR_UNSUPPORTED when built without CUDA or no GPU. */
pd_status_t backend_cuda_create(int device, pd_backend_t **be_p);

/* Creates by name ("cpu" | "cuda"). */
pd_status_t backend_create(const char *name, int device, int n_threads, pd_backend_t **be_p);

void backend_destroy(pd_backend_t *be);

/* Applies "key=value[,key=value...]" (a node's backend_options) through ops->set_option. NULL or
 * "": nothing. PD_ERR_INVALID for a malformed list, an unknown option, or options for a backend
 * that takes none. */
pd_status_t backend_set_options(pd_backend_t *be, const char *opts);

/* Uploads a host weight (any format) into backend memory; *dst_p owns three allocations. */
/* The tag tracker's stamp / check on this backend's memory (be->ops->kv_stamp / kv_check). */
kv_tag_io_t backend_tag_io(pd_backend_t *be);

pd_status_t backend_weight_upload(pd_backend_t *be, const pd_weight_t *host, pd_weight_t *dst_p);
void backend_weight_free(pd_backend_t *be, pd_weight_t *w);

#endif
