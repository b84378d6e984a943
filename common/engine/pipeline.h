/* pipeline: disaggregated prefill/decode inside one process: a prefill engine (e.g. FP8 weights,
 * BF16 KV) runs the prompt and samples the first token, its KV pages are converted into a decode
 * engine's format (e.g. FP8 KV) and written into pages reserved there with new tags, and the decode
 * engine (e.g. INT4 weights) continues. It is the same sequence of numbers as the cluster (which
 * does the copy over UCX), so `pdctl generate` with --prefill-weights/--prefill-kv reproduces a
 * cluster run token for token. One thread owns both engines.
 */
#ifndef PD_PIPELINE_H
#define PD_PIPELINE_H

#include "engine.h"

/* Copies pages [first, first + n_pages) of src (in engine src's pool) into the pages of dst (in
 * engine dst's pool), converting the KV format, and stamps them with dst's tags. Errors as
 * engine_export_pages, or the upload's; dst's pages are then not to be used. */
pd_status_t pipeline_copy_pages(engine_t *dst, const kv_seq_t *dst_kv, engine_t *src,
                                const kv_seq_t *src_kv, int first, int n_pages);

/* Prefills prompt on p, moves the KV to d and adds the sequence to d (cb as engine_seq_add,
 * called for the first token too). Run d with engine_run(). Errors as engine_prefill /
 * engine_seq_add; PD_NO_PAGES when d cannot hold the prompt. */
pd_status_t pipeline_add(engine_t *p, engine_t *d, const int32_t *prompt, int n,
                         const engine_gen_params_t *gp, engine_token_fn cb, void *arg);

#endif
