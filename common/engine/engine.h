/* engine: a model, its paged KV pool and a continuous-batching scheduler on one backend.
 *
 * Sequences are added with engine_seq_add() and advance with engine_step(): each step takes
 * prompt chunks of new sequences (chunked prefill, at most prefill_chunk tokens per step in
 * total) and one token of every running sequence, runs the tag tracker's batched check, one
 * forward pass, and samples. Pages are allocated on demand; when they run out, the newest
 * sequence is preempted (its pages freed, its tokens recomputed later) so older ones progress.
 * Each produced token and the end of each sequence are reported through the sequence's
 * callback, from inside engine_step().
 *
 * The same engine serves pdctl (one process), the router's in-process mode, and the compute
 * thread of prefill and decode nodes. One thread owns an engine.
 */
#ifndef PD_ENGINE_H
#define PD_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "kv_pool.h"
#include "kv_tracker.h"
#include "model.h"
#include "sampler.h"
#include "status.h"

typedef struct {
    const char *model_dir;
    const char *backend;       /* "cpu" | "cuda" */
    char backend_options[256]; /* "key=value,..." for backend_set_options; "": none */
    int device, threads;
    pd_wfmt_t wfmt, lm_head_fmt;
    pd_kvfmt_t kvfmt;
    int page_tokens;   /* default 16 */
    int64_t kv_budget; /* bytes of KV pages; 0: enough for max_batch full contexts, capped */
    int max_batch;     /* running sequences at most */
    int prefill_chunk; /* prompt tokens per step at most */
    kv_tracker_kind_t tracker;
    bool progress;
    /* When pages run out: false (one process) frees the newest sequence's pages and recomputes
     * its tokens later; true (decode node) ends it with ENGINE_FINISH_PREEMPTED so the router
     * re-prefills it elsewhere. */
    bool evict_on_preempt;
    /* tensor-parallel ranks (0 or 1: none): the model's heads, KV heads, FFN and vocab split tp
     * ways, one backend (CUDA: devices device .. device + tp - 1) and thread per rank, one page
     * pool whose pages each rank holds its KV heads of (engine_tp.h) */
    int tp;
    /* test builds only (tests/support/tp_comm_faults.h; NULL in production): called on the
     * owner thread once the ranks' communicators exist; may replace comms (tp) with wrappers */
    void (*tp_comm_wrap)(void *arg, struct tp_comm **comms, int size);
    void *tp_comm_wrap_arg;
} engine_params_t;

/* Fills p with defaults (cpu, bf16 weights and KV, 16-token pages, tagged tracker, ...). */
void engine_params_default(engine_params_t *p);

typedef enum {
    ENGINE_FINISH_NONE = 0,
    ENGINE_FINISH_STOP,      /* EOS or a stop token */
    ENGINE_FINISH_LENGTH,    /* max_tokens or the context length */
    ENGINE_FINISH_ABORT,     /* aborted, or failed (status says why) */
    ENGINE_FINISH_PREEMPTED, /* evicted for pages (evict_on_preempt), status PD_NO_PAGES */
} engine_finish_t;

const char *engine_finish_str(engine_finish_t f);

/* Called for each new token (token >= 0, finish NONE) and once at the end (token -1, finish set,
 * status PD_OK or the error that ended it, e.g. PD_ERR_KV_INTEGRITY). */
typedef void (*engine_token_fn)(void *arg, uint64_t seq_id, int32_t token, engine_finish_t finish,
                                pd_status_t status);

typedef struct {
    sampler_params_t sampling;
    int max_tokens;
    bool ignore_eos;
    const int32_t *stop_ids; /* extra stop tokens (copied) */
    int n_stop_ids;
    int n_generated; /* tokens of this request generated before (sampler position); they are
                        the last n_generated of the tokens given, the rest is the prompt */
    /* logits processing before sampling (vLLM semantics, sampler_logits_process_ref), run by the
     * backend's logits_process op; all zero: off */
    float presence_penalty, frequency_penalty; /* OpenAI: -2..2, on generated tokens */
    float repetition_penalty;                  /* > 0; 0 or 1: off; prompt and generated */
    const int32_t *bias_ids;                   /* logit_bias: n_bias token ids (copied) ... */
    const float *bias_vals;                    /* ... and what is added to their logits */
    int n_bias;
    int min_tokens; /* EOS (unless ignore_eos) and stop_ids cannot be sampled before this many
                       tokens of the request (n_generated included) */
    /* logprobs of each sampled token (engine_token_logprobs) with top_logprobs alternatives */
    bool logprobs;
    int top_logprobs; /* 0..SAMPLER_MAX_TOP_LOGPROBS */
    /* engine_prefill only: first tokens of n_samples samples (0: 1), sample i drawn with seed
     * sampler_seed_for(sampling.seed, i); prompt_logprobs: the logprob of every prompt token
     * after the first (logits of every prompt row: the LM head runs over the whole prompt) */
    int n_samples;
    bool prompt_logprobs;
    /* which sample of a request this is (n > 1): it draws with seed
     * sampler_seed_for(sampling.seed, sample_index); engine_prefill's sample i is sample_index + i
     */
    uint32_t sample_index;
} engine_gen_params_t;

typedef struct engine engine_t;

/* Loads the model and sizes the pool. Errors as model_load, plus PD_ERR_INVALID for a budget that
 * holds no page. */
pd_status_t engine_create(const engine_params_t *p, engine_t **e_p);
void engine_destroy(engine_t *e);

const model_t *engine_model(const engine_t *e);
kv_pool_t *engine_pool(engine_t *e);
void *engine_arena(engine_t *e);
pd_backend_t *engine_backend(engine_t *e);

/* Adds a sequence with prompt ids (copied). PD_ERR_INVALID (empty prompt, id out of range, bad
 * sampling params), PD_ERR_TOO_LONG (prompt + 1 > context length). On success *seq_id_p is set and
 * the callback will be called from engine_step(). */
pd_status_t engine_seq_add(engine_t *e, const int32_t *prompt, int n_prompt,
                           const engine_gen_params_t *gp, engine_token_fn cb, void *arg,
                           uint64_t *seq_id_p);

/* Adds a sequence whose first n_computed tokens already have their KV in the pages of *kv (for
 * example written by a prefill node); tokens (n_tokens > n_computed) are copied, *kv is moved into
 * the engine (left empty). Decoding continues from token n_computed. Errors as engine_seq_add;
 * on error *kv is untouched. */
pd_status_t engine_seq_add_prefilled(engine_t *e, const int32_t *tokens, int n_tokens,
                                     int n_computed, kv_seq_t *kv, const engine_gen_params_t *gp,
                                     engine_token_fn cb, void *arg, uint64_t *seq_id_p);

/* Inside a token callback (token >= 0): the logprobs of that token (sampler_logprobs: raw
 * log-softmax and gp->top_logprobs alternatives), or NULL when its sequence did not ask for them
 * (gp->logprobs false) or outside a callback. */
const sampler_logprobs_t *engine_token_logprobs(const engine_t *e);

/* Copies the KV of the first n_tokens tokens of src (pages of this engine's pool) into new pages
 * stamped with their own tags, into *dst (empty on entry; caller releases it): to fork a
 * prompt's KV for parallel samples (n > 1). PD_NO_PAGES when the pool cannot hold them,
 * PD_ERR_INVALID when src holds fewer, or the backend's error; *dst stays empty on error. */
pd_status_t engine_kv_copy(engine_t *e, const kv_seq_t *src, int n_tokens, kv_seq_t *dst);

/* Called by engine_prefill after each chunk with the pages [first, first + n) of kv whose tokens
 * are all written (and at the end with the last, partial page). Returns 0 to go on, nonzero to
 * stop the prefill there (the request was cancelled): engine_prefill then returns
 * PD_ERR_CANCELLED and keeps nothing. */
typedef int (*engine_pages_fn)(void *arg, const kv_seq_t *kv, int first, int n);

/* Called by engine_prefill while it enqueues a chunk's forward, right after layer `layer`'s K/V
 * write (the backend may not have run it yet: a callee reading the pages enqueues its reads
 * behind it, ops->xfer_kv_export), with the pages [first, first + n) of kv that this chunk
 * completes (the range on_pages gets after the chunk; n >= 1). */
typedef void (*engine_layer_fn)(void *arg, const kv_seq_t *kv, int first, int n, int layer);

/* Sets the hook engine_prefill calls per layer (fn NULL: none). Returns false, setting nothing,
 * when the model's forward cannot call it (model_ctx_set_layer_hook: GLM-4.5 / DeepSeek-V3
 * families, TP > 1): the caller then exports after each chunk (on_pages). */
bool engine_set_prefill_layer_hook(engine_t *e, engine_layer_fn fn, void *arg);

/* Runs a prompt through the model in chunks of prefill_chunk tokens (a prefill node's job), keeps
 * its KV in *kv_out (caller releases with kv_seq_release(engine_pool(e), kv)), and samples the
 * first new token of each of max(gp->n_samples, 1) samples into first_p[i] with gp->sampling
 * (seed sampler_seed_for(seed, sample_index + i), advanced by gp->n_generated draws) after the
 * logits processing of gp. lp_out (NULL: none): with gp->logprobs, lp_out[i] gets sample i's first
 * token's logprobs; with gp->prompt_logprobs, lp_out[n_samples + j] those of prompt token j + 1
 * (j < n - 1). PD_NO_PAGES when the pool cannot hold the prompt; nothing stays allocated on
 * error. */
pd_status_t engine_prefill(engine_t *e, const int32_t *tokens, int n, const engine_gen_params_t *gp,
                           engine_pages_fn on_pages, void *arg, int32_t *first_p, kv_seq_t *kv_out,
                           sampler_logprobs_t *lp_out);

/* The writer's side of a KV transfer: checks the tags of pages [first, first + n) of kv (this
 * engine's pool), converts them into dst_l's format on the backend and copies them to host_out
 * (n * dst_l->page_bytes), each header stamped with the tag of dst_refs[i] (the destination pages'
 * tags). dst_l may be a wire layout (n_slices > 1: a tensor-parallel destination) and this engine
 * may run tp ranks: each rank exports its KV heads and they are re-sliced into the destination's
 * slices, every slice's header stamped. Returns PD_ERR_KV_INTEGRITY when a source page fails its
 * own tag check, PD_ERR_NOMEM, or the backend's error (PD_ERR_CUDA); on any error nothing is
 * stamped and host_out must not be sent (its contents are undefined). */
pd_status_t engine_export_pages(engine_t *e, const kv_seq_t *kv, int first, int n,
                                const kv_layout_t *dst_l, const kv_page_ref_t *dst_refs,
                                uint8_t *host_out);

/* The writer's own check of pages [first, first + n) of kv before anything of them leaves (as
 * engine_export_pages does it): PD_ERR_KV_INTEGRITY when a page fails its tag check (logged),
 * PD_ERR_NOMEM. Syncs the backend. */
pd_status_t engine_export_check(engine_t *e, const kv_seq_t *kv, int first, int n);

/* As engine_export_pages, but leaves the converted, stamped pages in this engine's backend memory
 * at dev_out (n * dst_l->page_bytes, from the backend's alloc): for writers that move them
 * GPU -> GPU. TP 1 on both sides only (PD_ERR_UNSUPPORTED otherwise). The work is enqueued on
 * the backend's stream; a kernel's failure shows at the next
 * sync or download, after which dev_out must not be sent. Returns PD_ERR_KV_INTEGRITY (a source
 * page fails its own tag check: nothing enqueued) or PD_ERR_NOMEM. */
pd_status_t engine_export_pages_dev(engine_t *e, const kv_seq_t *kv, int first, int n,
                                    const kv_layout_t *dst_l, const kv_page_ref_t *dst_refs,
                                    void *dev_out);

/* Ends a sequence now (callback with ENGINE_FINISH_ABORT, PD_ERR_CANCELLED); its pages are freed.
 * PD_ERR_NOT_FOUND if unknown or already finished. */
pd_status_t engine_seq_abort(engine_t *e, uint64_t seq_id);

/* Number of sequences not yet finished. */
int engine_active(const engine_t *e);

/* Runs one step (see above). Returns PD_OK, or an error of the backend (all sequences of the
 * step are then ended with it). */
pd_status_t engine_step(engine_t *e);

/* Runs steps until no sequence is active. */
pd_status_t engine_run(engine_t *e);

/* Runs input (n tokens, one causal window, n <= context length) and scores rows first_row..n-1:
 * the logits after input[r] score targets[r - first_row]. Writes the total negative log
 * likelihood (natural log) to *nll_p. logits_last (vocab), if not NULL, receives the logits after
 * the last token. PD_NO_PAGES if the pool cannot hold n tokens; nothing stays allocated. */
pd_status_t engine_score(engine_t *e, const int32_t *input, int n, int first_row,
                         const int32_t *targets, double *nll_p, float *logits_last);

/* As engine_score, and writes the argmax token of each scored row into argmax_out
 * (n - first_row) (teacher-forced top-1 predictions). */
pd_status_t engine_score_top1(engine_t *e, const int32_t *input, int n, int first_row,
                              const int32_t *targets, double *nll_p, int32_t *argmax_out);

/* Tensor parallelism: the number of ranks (1 without). */
int engine_tp(const engine_t *e);

/* The layout of this engine's pages as other nodes write them (tp_kv_wire_layout): the pool's
 * layout at TP 1, else tp rank slices per page. */
void engine_kv_wire_layout(const engine_t *e, kv_layout_t *l_p);

/* The reader's side of a KV transfer through host memory: copies the wire pages
 * (engine_kv_wire_layout) of pages (n) into the engine's pages, each rank its slice, stamps
 * included. Page pages[i] is read at wire + i * wire page bytes when packed (a staging buffer),
 * else at wire + pages[i] * wire page bytes (a landing zone laid out like the pool). The backend's
 * error (PD_ERR_CUDA); the pages must then not be used. */
pd_status_t engine_import_pages(engine_t *e, const uint8_t *wire, int packed, const int32_t *pages,
                                int n);

/* engine_import_pages where each rank first checks its own slice of the wire pages against
 * want (engine_tp entries: the KV-done's slice checksums, tp_kv_slice_checksum over the pages in
 * this order), all ranks at once. A rank whose slice differs imports nothing of it and logs
 * "seq SEQ: tp rank R's kv slice checksum ..."; bad_p (engine_tp entries, may be NULL) gets 1 for
 * each such rank, 0 for the others. Returns PD_ERR_KV_INTEGRITY when any slice differs (the
 * pages must then not be used), else as engine_import_pages. */
pd_status_t engine_import_pages_checked(engine_t *e, const uint8_t *wire, int packed,
                                        const int32_t *pages, int n, const uint64_t *want,
                                        uint64_t seq, int *bad_p);

/* Fault injection for tests: counters and hooks of the tracker. */
kv_tracker_t *engine_tracker(engine_t *e);

/* Finds the kv_seq_t of a running sequence (tests and fault injection), NULL if none. */
kv_seq_t *engine_debug_seq_kv(engine_t *e, uint64_t seq_id);

#endif
