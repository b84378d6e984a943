/* tp_kv: KV layouts per TP rank and re-slicing between TP sizes (see tp_kv.h). */
#include "tp_kv.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kv_digest.h"
#include "log.h"

uint64_t tp_kv_slice_checksum(uint64_t seed, const uint8_t *base, const int32_t *pages, int n_pages,
                              const kv_layout_t *l, int slice)
{
    const size_t sb = tp_kv_slice_bytes(l);
    return kv_digest_pages(seed, base + (size_t)slice * sb, pages, n_pages, l->page_bytes, sb);
}

pd_status_t tp_kv_layout(const kv_layout_t *full, int size, kv_layout_t *l_p)
{
    if (size >= 1 && full->n_sides == 1) { /* an MLA latent: every rank holds all of it */
        *l_p = *full;
        return PD_OK;
    }
    if (size < 1 || full->n_kv_heads % size != 0) {
        pd_log_error("tp %d: %d kv heads do not split %d ways", size, full->n_kv_heads, size);
        return PD_ERR_INVALID;
    }
    kv_layout_init_sides(l_p, full->n_layers, full->n_kv_heads / size, full->head_dim,
                         full->n_sides, full->page_tokens, full->fmt);
    return PD_OK;
}

/* Copies heads [h0, h1) (global ids) of one page side: rows of (page_tokens, heads, unit bytes),
 * from a page part starting at global head s0 with sh heads, into one at d0 with dh heads. */
static void tp_kv__copy_heads(uint8_t *dst, int d0, int dh, const uint8_t *src, int s0, int sh,
                              int h0, int h1, int tokens, size_t unit)
{
    for (int t = 0; t < tokens; t++)
        memcpy(dst + ((size_t)t * dh + (size_t)(h0 - d0)) * unit,
               src + ((size_t)t * sh + (size_t)(h0 - s0)) * unit, (size_t)(h1 - h0) * unit);
}

pd_status_t tp_kv_reslice(void *dst, const kv_layout_t *dst_l, int dst_rank, int dst_size,
                          const void *src, const kv_layout_t *src_l, int src_rank, int src_size,
                          int n_pages)
{
    const int sh = src_l->n_kv_heads, dh = dst_l->n_kv_heads;
    const bool latent = src_l->n_sides == 1; /* replicated: every rank has every head */
    if (src_size < 1 || dst_size < 1 || src_rank < 0 || src_rank >= src_size || dst_rank < 0 ||
        dst_rank >= dst_size || n_pages < 0 || src_l->n_layers != dst_l->n_layers ||
        src_l->head_dim != dst_l->head_dim || src_l->page_tokens != dst_l->page_tokens ||
        src_l->fmt != dst_l->fmt || src_l->n_sides != dst_l->n_sides ||
        (latent ? sh != dh : (long)sh * src_size != (long)dh * dst_size)) {
        pd_log_error("tp kv reslice: rank %d/%d (%d heads) -> rank %d/%d (%d heads): layouts do "
                     "not match",
                     src_rank, src_size, sh, dst_rank, dst_size, dh);
        return PD_ERR_INVALID;
    }
    const int s0 = latent ? 0 : src_rank * sh, d0 = latent ? 0 : dst_rank * dh;
    const int h0 = s0 > d0 ? s0 : d0, h1 = s0 + sh < d0 + dh ? s0 + sh : d0 + dh;
    const size_t head_bytes = (size_t)src_l->head_dim * src_l->elem_bytes;
    if (h0 >= h1)
        return PD_OK;
    for (int p = 0; p < n_pages; p++) {
        uint8_t *dp = (uint8_t *)dst + (size_t)p * dst_l->page_bytes;
        const uint8_t *sp = (const uint8_t *)src + (size_t)p * src_l->page_bytes;
        for (int layer = 0; layer < src_l->n_layers; layer++)
            for (int side = 0; side < src_l->n_sides; side++) {
                tp_kv__copy_heads(dp + kv_layout_data_off(dst_l, layer, side), d0, dh,
                                  sp + kv_layout_data_off(src_l, layer, side), s0, sh, h0, h1,
                                  src_l->page_tokens, head_bytes);
                if (src_l->fmt == PD_KV_FP8)
                    tp_kv__copy_heads(dp + kv_layout_scale_off(dst_l, layer, side), d0, dh,
                                      sp + kv_layout_scale_off(src_l, layer, side), s0, sh, h0, h1,
                                      src_l->page_tokens, sizeof(float));
            }
    }
    return PD_OK;
}

pd_status_t tp_kv_wire_layout(const kv_layout_t *full, int size, kv_layout_t *l_p)
{
    kv_layout_t l;
    pd_status_t st = tp_kv_layout(full, size, &l);
    if (st != PD_OK)
        return st;
    l.n_slices = size;
    l.page_bytes *= (size_t)size;
    *l_p = l;
    return PD_OK;
}

pd_status_t tp_kv_wire_fill(void *dst, const kv_layout_t *dst_l, const void *src,
                            const kv_layout_t *src_l, int src_rank, int src_size, int n_pages)
{
    const int d = dst_l->n_slices > 0 ? dst_l->n_slices : 1;
    kv_layout_t slice = *dst_l;
    slice.n_slices = 1;
    slice.page_bytes = tp_kv_slice_bytes(dst_l);
    for (int p = 0; p < n_pages; p++)
        for (int q = 0; q < d; q++) {
            pd_status_t st = tp_kv_reslice(
                (uint8_t *)dst + (size_t)p * dst_l->page_bytes + (size_t)q * slice.page_bytes,
                &slice, q, d, (const uint8_t *)src + (size_t)p * src_l->page_bytes, src_l, src_rank,
                src_size, 1);
            if (st != PD_OK)
                return st;
        }
    return PD_OK;
}
