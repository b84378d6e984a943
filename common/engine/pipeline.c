#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

pd_status_t pipeline_copy_pages(engine_t *dst, const kv_seq_t *dst_kv, engine_t *src,
                                const kv_seq_t *src_kv, int first, int n_pages)
{
    kv_layout_t dl;
    engine_kv_wire_layout(dst, &dl); /* tensor parallel: one slice per rank of dst */
    uint8_t *host = malloc((size_t)n_pages * dl.page_bytes);
    int32_t *pages = malloc((size_t)(n_pages > 0 ? n_pages : 1) * sizeof *pages);
    pd_status_t st = PD_ERR_NOMEM;

    /* what a prefill node puts over UCX, placed page by page (headers carry the stamps) */
    if (!host || !pages)
        goto out;
    for (int i = 0; i < n_pages; i++)
        pages[i] = dst_kv->pages[first + i].page;
    st = engine_export_pages(src, src_kv, first, n_pages, &dl, dst_kv->pages + first, host);
    if (st == PD_OK)
        st = engine_import_pages(dst, host, 1, pages, n_pages);
out:
    free(pages);
    free(host);
    return st;
}

pd_status_t pipeline_add(engine_t *p, engine_t *d, const int32_t *prompt, int n,
                         const engine_gen_params_t *gp, engine_token_fn cb, void *arg)
{
    kv_seq_t pkv, dkv;
    int32_t first;
    uint64_t id;
    pd_status_t st;

    kv_seq_init(&dkv);
    if ((st = kv_seq_reserve(engine_pool(d), &dkv, n)) != PD_OK)
        return st;
    engine_gen_params_t pgp = *gp;
    pgp.n_samples = 1; /* one sample per pipeline_add */
    pgp.prompt_logprobs = false;
    if ((st = engine_prefill(p, prompt, n, &pgp, NULL, NULL, &first, &pkv, NULL)) != PD_OK)
        goto out;
    st = pipeline_copy_pages(d, &dkv, p, &pkv, 0, pkv.n_pages);
    kv_seq_release(engine_pool(p), &pkv);
    kv_seq_deinit(&pkv);
    if (st != PD_OK)
        goto out;
    /* the first token is the prefill node's; stop there if it ends the request */
    if (cb)
        cb(arg, 0, first, ENGINE_FINISH_NONE, PD_OK);
    bool eos = hf_config_is_stop(&engine_model(d)->cfg, first, gp->ignore_eos, gp->stop_ids,
                                 gp->n_stop_ids);
    if (eos || gp->max_tokens <= 1) {
        if (cb)
            cb(arg, 0, -1, eos ? ENGINE_FINISH_STOP : ENGINE_FINISH_LENGTH, PD_OK);
        goto out;
    }
    int32_t *tokens = malloc(((size_t)n + 1) * sizeof *tokens);
    if (!tokens) {
        st = PD_ERR_NOMEM;
        goto out;
    }
    memcpy(tokens, prompt, (size_t)n * sizeof *prompt);
    tokens[n] = first;
    engine_gen_params_t dgp = *gp;
    dgp.max_tokens = gp->max_tokens - 1;
    dgp.n_generated = gp->n_generated + 1;
    st = engine_seq_add_prefilled(d, tokens, n + 1, n, &dkv, &dgp, cb, arg, &id);
    free(tokens);
out:
    kv_seq_release(engine_pool(d), &dkv);
    kv_seq_deinit(&dkv);
    return st;
}
