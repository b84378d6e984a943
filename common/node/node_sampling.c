#include "node_sampling.h"

#include <stdlib.h>
#include <string.h>

pd_status_t node_sampling_params(const Pdserve__V1__SamplingParams *sp, engine_gen_params_t *gp,
                                 void **store_p)
{
    memset(gp, 0, sizeof *gp);
    *store_p = NULL;
    gp->sampling.top_p = 1.0f;
    if (!sp)
        return PD_OK;
    gp->sampling.temperature = sp->temperature;
    gp->sampling.top_k = sp->top_k;
    gp->sampling.top_p = sp->top_p > 0 ? sp->top_p : 1.0f;
    gp->sampling.seed = sp->seed;
    gp->ignore_eos = sp->ignore_eos;
    gp->presence_penalty = sp->presence_penalty;
    gp->frequency_penalty = sp->frequency_penalty;
    gp->repetition_penalty = sp->repetition_penalty;
    gp->min_tokens = sp->min_tokens > (uint32_t)INT32_MAX ? INT32_MAX : (int)sp->min_tokens;
    gp->logprobs = sp->logprobs;
    /* out of range stays out of range (the engine refuses it), without overflowing an int */
    gp->top_logprobs = sp->top_logprobs > 1000 ? 1000 : (int)sp->top_logprobs;
    gp->prompt_logprobs = sp->prompt_logprobs;
    size_t nb = sp->n_logit_bias, ns = sp->n_stop_token_ids;
    if (nb == 0 && ns == 0)
        return PD_OK;
    if (nb > (size_t)INT32_MAX / 16 || ns > (size_t)INT32_MAX / 16)
        return PD_ERR_NOMEM;
    uint8_t *store = malloc(nb * (sizeof(int32_t) + sizeof(float)) + ns * sizeof(int32_t));
    if (!store)
        return PD_ERR_NOMEM;
    int32_t *ids = (int32_t *)store, *stop = ids + nb;
    float *vals = (float *)(stop + ns);
    for (size_t i = 0; i < nb; i++) {
        const Pdserve__V1__LogitBias *b = sp->logit_bias[i];
        ids[i] = b ? b->token_id : -1; /* -1: refused by the engine */
        vals[i] = b ? b->bias : 0.0f;
    }
    if (ns)
        memcpy(stop, sp->stop_token_ids, ns * sizeof *stop);
    gp->bias_ids = ids;
    gp->bias_vals = vals;
    gp->n_bias = (int)nb;
    gp->stop_ids = stop;
    gp->n_stop_ids = (int)ns;
    *store_p = store;
    return PD_OK;
}

pd_status_t node_sampling_logprobs_msg(const sampler_logprobs_t *lp, size_t n,
                                       Pdserve__V1__TokenLogprob ***msgs_p, void **store_p)
{
    size_t tops = 0;
    for (size_t i = 0; i < n; i++)
        tops += (size_t)lp[i].n_top;
    uint8_t *store = malloc(n * (sizeof(void *) + sizeof(Pdserve__V1__TokenLogprob)) +
                            tops * (sizeof(void *) + sizeof(Pdserve__V1__TopLogprob)) + 1);
    if (!store)
        return PD_ERR_NOMEM;
    Pdserve__V1__TokenLogprob **msgs = (Pdserve__V1__TokenLogprob **)store;
    Pdserve__V1__TopLogprob **top_ptrs = (Pdserve__V1__TopLogprob **)(msgs + n);
    Pdserve__V1__TokenLogprob *tl = (Pdserve__V1__TokenLogprob *)(top_ptrs + tops);
    Pdserve__V1__TopLogprob *tp = (Pdserve__V1__TopLogprob *)(tl + n);
    for (size_t i = 0; i < n; i++) {
        Pdserve__V1__TokenLogprob init = PDSERVE__V1__TOKEN_LOGPROB__INIT;
        tl[i] = init;
        tl[i].token_id = lp[i].token;
        tl[i].logprob = lp[i].logprob;
        tl[i].n_top = (size_t)lp[i].n_top;
        tl[i].top = top_ptrs;
        for (int k = 0; k < lp[i].n_top; k++) {
            Pdserve__V1__TopLogprob tinit = PDSERVE__V1__TOP_LOGPROB__INIT;
            *tp = tinit;
            tp->token_id = lp[i].top_ids[k];
            tp->logprob = lp[i].top_logprobs[k];
            *top_ptrs++ = tp++;
        }
        msgs[i] = &tl[i];
    }
    *msgs_p = msgs;
    *store_p = store;
    return PD_OK;
}
