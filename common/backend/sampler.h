/* sampler: picks the next token from logits: greedy (temperature 0), or temperature + top-k +
 * top-p with a seeded generator, so the same seed gives the same tokens.
 *
 * Order: temperature scaling, top-k (k largest; ties by lower id), softmax, top-p (smallest
 * prefix of the sorted distribution whose mass reaches p), then one draw. Caller-owned storage
 * (sampler_init / sampler_deinit); one thread uses a sampler.
 */
#ifndef PD_SAMPLER_H
#define PD_SAMPLER_H

#include <stdint.h>

#include "status.h"

typedef struct {
    float temperature; /* 0: greedy */
    int top_k;         /* 0: off */
    float top_p;       /* 1: off; in (0, 1] */
    uint64_t seed;
} sampler_params_t;

typedef struct {
    sampler_params_t p;
    uint64_t state;
    int vocab;
    float *probs;
    int32_t *idx;
} sampler_t;

/* Validates params (temperature >= 0, top_k >= 0, 0 < top_p <= 1): PD_ERR_INVALID with a
 * message naming the field; PD_ERR_NOMEM. */
pd_status_t sampler_init(sampler_t *s, const sampler_params_t *p, int vocab);
void sampler_deinit(sampler_t *s);

/* Returns the sampled token id; logits (vocab) are not modified. */
int32_t sampler_sample(sampler_t *s, const float *logits);

/* The draw sampler_sample would make next (uniform in [0, 1); 0 without a draw for greedy and
 * top-k 1), advancing the generator: for sampling elsewhere (ops->sample on a GPU). */
float sampler_draw(sampler_t *s);

/* The token sampler_sample returns for logits (vocab) under p when its draw is u; idx (vocab)
 * int32 and probs (vocab) f32 are caller scratch. Pure: the reference for ops->sample. */
int32_t sampler_pick(const sampler_params_t *p, const float *logits, int vocab, float u,
                     int32_t *idx, float *probs);

/* Advances the generator as if n tokens had been sampled (a request continued on another node
 * draws what a single process would have drawn). */
void sampler_skip(sampler_t *s, uint64_t n);

/* Index of the largest logit (lowest index on ties). */
int32_t sampler_argmax(const float *logits, int vocab);

/* The seed of sample `index` of a request with n > 1 samples (index 0: seed itself), so the
 * prefill node that samples every first token and the decode node that continues sample `index`
 * draw the same sequence. */
uint64_t sampler_seed_for(uint64_t seed, uint32_t index);

/* ==== logits processing and logprobs ==== */

/* Most alternatives per token (OpenAI's top_logprobs limit). */
#define SAMPLER_MAX_TOP_LOGPROBS 20

/* The log-probability of a chosen token and of the n_top most likely tokens (descending, ties by
 * lower id) under log_softmax(logits): the model's raw distribution, before penalties, logit bias
 * and temperature (vLLM's default "raw logprobs"). */
typedef struct {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[SAMPLER_MAX_TOP_LOGPROBS];
    float top_logprobs[SAMPLER_MAX_TOP_LOGPROBS];
} sampler_logprobs_t;

/* Fills *out for token chosen from logits (vocab) f32 with the n_top (0..SAMPLER_MAX_TOP_LOGPROBS,
 * clamped) best alternatives. */
void sampler_logprobs(const float *logits, int vocab, int32_t chosen, int n_top,
                      sampler_logprobs_t *out);

/* Flags of a logits-processing entry (backend op logits_process). */
#define SAMPLER_ENT_IN_PROMPT 1 /* the token occurs in the prompt (repetition penalty) */
#define SAMPLER_ENT_MASKED 2    /* the token may not be sampled now (min_tokens): -inf */

/* The reference of the backend op logits_process: logits (n, vocab) f32 in place; entry j
 * (ent (n_ent, 4) int32: row, token, output count, flags) changes logits[row, token] once, with
 * row's penalties pen (n, 3) f32 (presence, frequency, repetition) and bias[j]:
 *   repetition != 1 and (count > 0 or in prompt): x = x > 0 ? x / repetition : x * repetition
 *   x -= frequency * count + presence * (count > 0);  x += bias[j];  masked: x = -inf
 * (vLLM's order: repetition, frequency, presence; logit bias; min_tokens). A (row, token) pair
 * appears at most once. */
void sampler_logits_process_ref(float *logits, int n, int vocab, const int32_t *ent,
                                const float *bias, int n_ent, const float *pen);

#endif
