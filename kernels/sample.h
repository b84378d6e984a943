/* sample: next-token sampling on the GPU, one block per row of logits (a greedy row split
 * across blocks when sample_run has a scratch), with the semantics of
 * common/sampler.c (sampler_pick): greedy (temperature 0 or top-k 1: the largest logit, lowest id
 * on ties); else temperature, top-k, softmax, top-p, one draw u given by the caller. Candidates
 * are the SAMPLE_MAX_CAND largest logits: top_k 0 (off) and top_k > SAMPLE_MAX_CAND sample from
 * those only (the CPU reference from the whole vocabulary); ties at the k-th logit beyond that
 * many candidates are broken arbitrarily. expf on the device may differ from glibc's by an ulp,
 * so a draw within rounding of a bucket edge can pick the neighbouring token. Pointers are device
 * memory; the launcher checks shapes (PD_ERR_INVALID), enqueues on `stream`, allocates nothing.
 */
#ifndef PD_KERNELS_SAMPLE_H
#define PD_KERNELS_SAMPLE_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SAMPLE_MAX_CAND 2048

/* 1 (default): sample_run splits greedy rows across blocks where it has a scratch; 0: one block
 * per row (a process-wide switch for the harness: the same tokens either way) */
extern int sample_split;

/* 1 (the default since session 21): a sampled row finds its K-th largest logit by bucket
 * refinement (three histogram passes) and sums on a warp, and sample_logprobs_run finds its
 * alternatives the same way (about 5 passes over the row instead of 1 + n_top); 0: the
 * bisection, one thread's sums, one pass per alternative. Session 21, one H100 (`gpu_bench
 * sample`, vocabulary 128256, batch 1): T 0.8 top-p 0.95 893 -> 106 us, top-k 50 717 -> 54 us,
 * logprobs with 20 alternatives 1193 -> 172 us; the INT4 batch-1 step with T 0.8 top-p 0.95 3.68
 * -> 2.89 ms (greedy 2.81). Harness: every sampling and logprobs case both ways (cases_sample),
 * 48 cases, and 24 under memcheck with 0 errors. -1 (start): the launchers read
 * PD_CUDA_SAMPLE_BUCKET (0: off) once. */
extern int sample_bucket;

/* Rows whose greedy pick sample_run splits across blocks at most (its scratch's size). */
#define SAMPLE_SPLIT_MAX_ROWS 1024
/* bytes of sample_run's scratch (zeroed once by the caller; every launch leaves it zeroed) */
#define SAMPLE_SCRATCH_BYTES (SAMPLE_SPLIT_MAX_ROWS * 12)

/* tokens (n) int32 = sample of logits (n, vocab) f32 with per-row temperature (n) f32, top_k (n)
 * int32, top_p (n) f32 and u (n) f32 in [0, 1). scratch: SAMPLE_SCRATCH_BYTES of device memory
 * zeroed before the first launch, or NULL: with it (n <= SAMPLE_SPLIT_MAX_ROWS) a greedy row's
 * argmax is split across several blocks (session 12: one block scanned a 128k-vocab row in
 * 52 us, the batch-1 decode step's third-largest kernel); without it one block per row. A
 * scratch is one stream's: two launches must not use it at the same time. */
pd_status_t sample_run(int32_t *tokens, const float *logits, int n, int vocab,
                       const float *temperature, const int32_t *top_k, const float *top_p,
                       const float *u, void *scratch, cudaStream_t stream);

/* The logprobs of sampler_logprobs (backend.h, ops->logprobs): for each row i with n_top[i] >= 0,
 * ids (n, 1 + SAMPLE_LP_TOP) int32 and vals (n, 1 + SAMPLE_LP_TOP) f32 get the token tokens[i]
 * and its logprob under log_softmax(logits (n, vocab) f32), then min(n_top[i], SAMPLE_LP_TOP,
 * vocab) alternatives (descending, ties by lower id) and theirs. The normalizer is summed in
 * double as the reference does (in another order: equal to the reference's f32 result but for
 * rare last-ulp differences); the alternatives' ids are exact. Other rows and slots untouched.
 * tokens, n_top (n) int32. */
#define SAMPLE_LP_TOP 20
pd_status_t sample_logprobs_run(int32_t *ids, float *vals, const float *logits,
                                const int32_t *tokens, const int32_t *n_top, int n, int vocab,
                                cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
