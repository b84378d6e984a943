#include "sampler.h"

#include <math.h>
#include <stdlib.h>

#include "log.h"

pd_status_t sampler_init(sampler_t *s, const sampler_params_t *p, int vocab)
{
    if (!(p->temperature >= 0.0f) || isinf(p->temperature)) {
        pd_log_error("sampling: temperature %g must be >= 0", p->temperature);
        return PD_ERR_INVALID;
    }
    if (p->top_k < 0) {
        pd_log_error("sampling: top_k %d must be >= 0", p->top_k);
        return PD_ERR_INVALID;
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        pd_log_error("sampling: top_p %g must be in (0, 1]", p->top_p);
        return PD_ERR_INVALID;
    }
    s->p = *p;
    s->vocab = vocab;
    s->state = p->seed ^ 0x9e3779b97f4a7c15ull;
    s->probs = NULL;
    s->idx = NULL;
    if (p->temperature > 0.0f) {
        s->probs = malloc((size_t)vocab * sizeof *s->probs);
        s->idx = malloc((size_t)vocab * sizeof *s->idx);
        if (!s->probs || !s->idx) {
            sampler_deinit(s);
            return PD_ERR_NOMEM;
        }
    }
    return PD_OK;
}

void sampler_deinit(sampler_t *s)
{
    free(s->probs);
    free(s->idx);
    s->probs = NULL;
    s->idx = NULL;
}

int32_t sampler_argmax(const float *logits, int vocab)
{
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* splitmix64 -> uniform float in [0, 1) */
static float sampler__uniform(sampler_t *s)
{
    uint64_t z = (s->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) / (float)(1u << 24);
}

void sampler_skip(sampler_t *s, uint64_t n)
{
    /* one draw adds the golden-ratio constant to the state (see sampler__uniform); greedy and
     * top-k 1 never draw */
    if (s->p.temperature > 0.0f && s->p.top_k != 1)
        s->state += n * 0x9e3779b97f4a7c15ull;
}

static int sampler__cmp(const void *a, const void *b, void *arg)
{
    const float *logits = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float lx = logits[x], ly = logits[y];
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return x < y ? -1 : 1;
}

int32_t sampler_pick(const sampler_params_t *p, const float *logits, int vocab, float u,
                     int32_t *idx, float *probs)
{
    int n = vocab;
    float mx, sum = 0.0f, acc = 0.0f;

    if (p->temperature == 0.0f || p->top_k == 1)
        return sampler_argmax(logits, n);
    for (int i = 0; i < n; i++)
        idx[i] = i;
    /* sort ids by logit (descending, ties by id); qsort is deterministic for a total order */
    qsort_r(idx, (size_t)n, sizeof *idx, sampler__cmp, (void *)logits);
    if (p->top_k > 0 && p->top_k < n)
        n = p->top_k;
    mx = logits[idx[0]] / p->temperature;
    for (int i = 0; i < n; i++) {
        probs[i] = expf(logits[idx[i]] / p->temperature - mx);
        sum += probs[i];
    }
    if (p->top_p < 1.0f) {
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += probs[i] / sum;
            if (acc >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0.0f;
        for (int i = 0; i < n; i++)
            sum += probs[i];
    }
    u *= sum;
    acc = 0.0f;
    for (int i = 0; i < n; i++) {
        acc += probs[i];
        if (u < acc)
            return idx[i];
    }
    return idx[n - 1];
}

float sampler_draw(sampler_t *s)
{
    if (s->p.temperature == 0.0f || s->p.top_k == 1)
        return 0.0f;
    return sampler__uniform(s);
}

int32_t sampler_sample(sampler_t *s, const float *logits)
{
    if (s->p.temperature == 0.0f || s->p.top_k == 1)
        return sampler_argmax(logits, s->vocab);
    return sampler_pick(&s->p, logits, s->vocab, sampler__uniform(s), s->idx, s->probs);
}

uint64_t sampler_seed_for(uint64_t seed, uint32_t index)
{
    if (index == 0)
        return seed;
    uint64_t z = seed + (uint64_t)index * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sampler_logprobs(const float *logits, int vocab, int32_t chosen, int n_top,
                      sampler_logprobs_t *out)
{
    double mx = logits[0], sum = 0.0;
    float lse;

    if (n_top < 0)
        n_top = 0;
    if (n_top > SAMPLER_MAX_TOP_LOGPROBS)
        n_top = SAMPLER_MAX_TOP_LOGPROBS;
    if (n_top > vocab)
        n_top = vocab;
    for (int v = 1; v < vocab; v++)
        mx = logits[v] > mx ? logits[v] : mx;
    for (int v = 0; v < vocab; v++)
        sum += exp((double)logits[v] - mx);
    lse = (float)(mx + log(sum));
    out->token = chosen;
    out->logprob = logits[chosen] - lse;
    out->n_top = n_top;
    /* insertion into a short sorted list: n_top <= 20, one pass over the vocabulary */
    int k = 0;
    for (int v = 0; v < vocab && n_top > 0; v++) {
        float x = logits[v];
        if (k == n_top && !(x > logits[out->top_ids[k - 1]]))
            continue;
        int at = k < n_top ? k++ : k - 1;
        while (at > 0 && x > logits[out->top_ids[at - 1]]) {
            out->top_ids[at] = out->top_ids[at - 1];
            at--;
        }
        out->top_ids[at] = v;
    }
    for (int i = 0; i < n_top; i++)
        out->top_logprobs[i] = logits[out->top_ids[i]] - lse;
}

void sampler_logits_process_ref(float *logits, int n, int vocab, const int32_t *ent,
                                const float *bias, int n_ent, const float *pen)
{
    for (int j = 0; j < n_ent; j++) {
        const int32_t row = ent[4 * j], tok = ent[4 * j + 1], count = ent[4 * j + 2],
                      flags = ent[4 * j + 3];
        if (row < 0 || row >= n || tok < 0 || tok >= vocab)
            continue;
        float *x = logits + (size_t)row * (size_t)vocab + tok;
        const float presence = pen[3 * row], frequency = pen[3 * row + 1],
                    repetition = pen[3 * row + 2];
        float v = *x;
        if (repetition != 1.0f && (count > 0 || (flags & SAMPLER_ENT_IN_PROMPT)))
            v = v > 0.0f ? v / repetition : v * repetition;
        v -= frequency * (float)count + presence * (count > 0 ? 1.0f : 0.0f);
        v += bias[j];
        if (flags & SAMPLER_ENT_MASKED)
            v = -INFINITY;
        *x = v;
    }
}
