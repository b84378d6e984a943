/* node_sampling: what a request's sampling looks like on both node binaries: the engine's
 * generation parameters from the control plane's SamplingParams (penalties, logit bias,
 * min_tokens, stop token ids, logprobs), and the engine's logprobs as TokenLogprob messages for
 * PrefillReply and DecodeEvent. Pure functions; any thread.
 */
#ifndef PD_NODE_SAMPLING_H
#define PD_NODE_SAMPLING_H

#include <stddef.h>

#include "engine.h"
#include "pdserve.pb-c.h"
#include "sampler.h"
#include "status.h"

/* Fills gp (zeroed first) from sp (NULL: greedy, no processing): sampling, ignore_eos and the
 * logits processing of SamplingParams; max_tokens, n_generated, n_samples and sample_index are
 * the caller's. The arrays gp points to live in *store_p (malloc'd, the caller frees it after
 * the engine copied them; NULL when there are none). The values are range-checked by the engine
 * (engine_seq_add / engine_prefill), not here. PD_OK or PD_ERR_NOMEM (*store_p NULL). */
pd_status_t node_sampling_params(const Pdserve__V1__SamplingParams *sp, engine_gen_params_t *gp,
                                 void **store_p);

/* n TokenLogprob messages for lp (n), in *msgs_p (an array of n pointers), all in one
 * allocation *store_p that the caller frees after packing. PD_OK or PD_ERR_NOMEM (nothing set). */
pd_status_t node_sampling_logprobs_msg(const sampler_logprobs_t *lp, size_t n,
                                       Pdserve__V1__TokenLogprob ***msgs_p, void **store_p);

#endif
