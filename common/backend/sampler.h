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

#endif
