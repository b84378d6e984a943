#include "kv_layout.h"

#include <stdlib.h>
#include <string.h>

void kv_layout_init(kv_layout_t *l, int n_layers, int n_kv_heads, int head_dim, int page_tokens,
                    pd_kvfmt_t fmt)
{
    kv_layout_init_sides(l, n_layers, n_kv_heads, head_dim, 2, page_tokens, fmt);
}

void kv_layout_init_sides(kv_layout_t *l, int n_layers, int n_kv_heads, int head_dim, int n_sides,
                          int page_tokens, pd_kvfmt_t fmt)
{
    memset(l, 0, sizeof *l);
    l->n_sides = n_sides;
    l->n_layers = n_layers;
    l->n_kv_heads = n_kv_heads;
    l->head_dim = head_dim;
    l->page_tokens = page_tokens;
    l->fmt = fmt;
    l->elem_bytes = fmt == PD_KV_FP8 ? 1 : fmt == PD_KV_BF16 ? 2 : 4;
    l->side_bytes = (size_t)page_tokens * (size_t)n_kv_heads * (size_t)head_dim * l->elem_bytes;
    l->scale_bytes = fmt == PD_KV_FP8 ? (size_t)page_tokens * (size_t)n_kv_heads * 4 : 0;
    l->page_bytes = KV_PAGE_HEADER_BYTES +
                    (size_t)n_layers * (size_t)n_sides * (l->side_bytes + l->scale_bytes);
    l->page_bytes = (l->page_bytes + 63) & ~(size_t)63;
    l->n_slices = 1;
}

double kv_layout_bytes_per_token(const kv_layout_t *l)
{
    return (double)((size_t)l->n_layers * (size_t)l->n_sides * (l->side_bytes + l->scale_bytes)) /
           (double)l->page_tokens;
}

void kv_seq_init(kv_seq_t *seq)
{
    memset(seq, 0, sizeof *seq);
}

void kv_seq_deinit(kv_seq_t *seq)
{
    free(seq->pages);
    memset(seq, 0, sizeof *seq);
}

pd_status_t kv_seq__grow(kv_seq_t *seq, int32_t need)
{
    int32_t cap = seq->cap ? seq->cap : 8;
    kv_page_ref_t *p;
    if (need <= seq->cap)
        return PD_OK;
    while (cap < need)
        cap *= 2;
    p = realloc(seq->pages, (size_t)cap * sizeof *p);
    if (!p)
        return PD_ERR_NOMEM;
    seq->pages = p;
    seq->cap = cap;
    return PD_OK;
}

pd_status_t kv_seq_push_page(kv_seq_t *seq, kv_page_ref_t ref)
{
    if (kv_seq__grow(seq, seq->n_pages + 1) != PD_OK)
        return PD_ERR_NOMEM;
    seq->pages[seq->n_pages++] = ref;
    return PD_OK;
}
