#include "backend.h"

#include <string.h>

#include "log.h"

pd_status_t backend_create(const char *name, int device, int n_threads, pd_backend_t **be_p)
{
    if (strcmp(name, "cpu") == 0)
        return backend_cpu_create(n_threads, be_p);
    if (strcmp(name, "cuda") == 0)
        return backend_cuda_create(device, be_p);
    pd_log_error("backend '%s': unknown (expected cpu or cuda)", name);
    return PD_ERR_INVALID;
}

pd_status_t backend_set_options(pd_backend_t *be, const char *opts)
{
    char buf[256];
    pd_status_t st = PD_OK;
    if (!opts || !*opts)
        return PD_OK;
    if (strlen(opts) >= sizeof buf || !be->ops->set_option) {
        pd_log_error("backend %s: cannot take options '%s'", be->ops->name, opts);
        return PD_ERR_INVALID;
    }
    strcpy(buf, opts);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv && st == PD_OK;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            pd_log_error("backend %s: option '%s' is not key=value", be->ops->name, kv);
            return PD_ERR_INVALID;
        }
        *eq = '\0';
        st = be->ops->set_option(be, kv, eq + 1);
    }
    return st;
}

void backend_destroy(pd_backend_t *be)
{
    if (be)
        be->ops->destroy(be);
}

pd_status_t backend_weight_upload(pd_backend_t *be, const pd_weight_t *host, pd_weight_t *dst_p)
{
    pd_weight_t w = *host;
    size_t nd = quant_data_bytes(host->fmt, host->n, host->k);
    size_t ns = quant_scales_bytes(host->fmt, host->n, host->k);
    size_t nz = quant_zeros_bytes(host->fmt, host->n, host->k);
    pd_status_t st;

    w.data = w.scales = w.zeros = NULL;
    if ((st = be->ops->alloc(be, nd, &w.data)) != PD_OK)
        goto err;
    if ((st = be->ops->upload(be, w.data, host->data, nd)) != PD_OK)
        goto err;
    if (ns) {
        if ((st = be->ops->alloc(be, ns, &w.scales)) != PD_OK)
            goto err;
        if ((st = be->ops->upload(be, w.scales, host->scales, ns)) != PD_OK)
            goto err;
    }
    if (nz) {
        if ((st = be->ops->alloc(be, nz, &w.zeros)) != PD_OK)
            goto err;
        if ((st = be->ops->upload(be, w.zeros, host->zeros, nz)) != PD_OK)
            goto err;
    }
    if (be->ops->weight_prepare && (st = be->ops->weight_prepare(be, &w)) != PD_OK)
        goto err;
    *dst_p = w;
    return PD_OK;
err:
    backend_weight_free(be, &w);
    return st;
}

void backend_weight_free(pd_backend_t *be, pd_weight_t *w)
{
    if (w->data)
        be->ops->free(be, w->data);
    if (w->scales)
        be->ops->free(be, w->scales);
    if (w->zeros)
        be->ops->free(be, w->zeros);
    w->data = w->scales = w->zeros = NULL;
}

static void backend__tag_check(void *ctx, uint8_t *bad_out, kv_tag_t *found_out, const void *arena,
                               const kv_layout_t *l, const int32_t *pages, const kv_tag_t *expected,
                               const kv_tag_t *current, int n)
{
    pd_backend_t *be = ctx;
    be->ops->kv_check(be, bad_out, found_out, arena, l, pages, expected, current, n);
}

static void backend__tag_stamp(void *ctx, void *arena, const kv_layout_t *l, const int32_t *pages,
                               const kv_tag_t *tags, int n)
{
    pd_backend_t *be = ctx;
    be->ops->kv_stamp(be, arena, l, pages, tags, n);
}

kv_tag_io_t backend_tag_io(pd_backend_t *be)
{
    kv_tag_io_t io = {be, backend__tag_check, backend__tag_stamp};
    return io;
}
