#include "kv_tracker.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Whether tag is some page's last tag (its header may still carry it). */
static bool tracker__in_use(const kv_tracker_t *t, kv_tag_t tag)
{
    for (int32_t p = 0; p < t->n_pages; p++)
        if (t->tags[p] == tag)
            return true;
    return false;
}

static kv_tag_t tracker__tagged_on_alloc(kv_tracker_t *t, int32_t page)
{
    /* One counter for the whole pool, so live pages never share a tag: a block-table entry
     * pointing at the wrong page is caught too. 0 is never a tag, so a zeroed (never written)
     * header never matches; KV_TAG_INVALID (~0) is never a tag either: the check uses it for a
     * block-table entry outside the pool. At 2^64 - 2 tags the counter does not wrap in
     * practice; if it does, a tag some page still has (live, or a stale stamp in a freed page)
     * is skipped (a scan of the pool per allocation from then on). */
    for (;;) {
        t->next_tag++;
        if (t->next_tag == KV_TAG_INVALID)
            t->wrapped = true;
        if (t->next_tag == 0 || t->next_tag == KV_TAG_INVALID)
            continue;
        if (t->wrapped && t->tags[page] != t->next_tag && tracker__in_use(t, t->next_tag))
            continue;
        if (t->wrapped && t->tags[page] == t->next_tag)
            continue; /* the page's own previous tag: a stale stamp there would match */
        break;
    }
    t->tags[page] = t->next_tag;
    return t->next_tag;
}

static kv_tag_t tracker__noop_on_alloc(kv_tracker_t *t, int32_t page)
{
    (void)t;
    (void)page;
    return 0;
}

static const kv_tracker_ops_t tracker_tagged_ops = {"tagged", tracker__tagged_on_alloc, true};
static const kv_tracker_ops_t tracker_noop_ops = {"noop", tracker__noop_on_alloc, false};

int kv_tracker_kind_parse(const char *name, kv_tracker_kind_t *kind_p)
{
    if (strcmp(name, "tagged") == 0)
        *kind_p = KV_TRACKER_TAGGED;
    else if (strcmp(name, "noop") == 0)
        *kind_p = KV_TRACKER_NOOP;
    else
        return -1;
    return 0;
}

pd_status_t kv_tracker_create(kv_tracker_kind_t kind, int32_t n_pages, kv_tracker_t **t_p)
{
    kv_tracker_t *t = calloc(1, sizeof *t);

    if (!t)
        return PD_ERR_NOMEM;
    t->n_pages = n_pages;
    if (kind == KV_TRACKER_TAGGED) {
        t->ops = &tracker_tagged_ops;
        t->tags = calloc((size_t)n_pages, sizeof *t->tags);
        if (!t->tags) {
            free(t);
            return PD_ERR_NOMEM;
        }
    } else {
        t->ops = &tracker_noop_ops;
    }
    *t_p = t;
    return PD_OK;
}

void kv_tracker_destroy(kv_tracker_t *t)
{
    if (!t)
        return;
    free(t->tags);
    free(t->pages);
    free(t->expected);
    free(t->current);
    free(t->found);
    free(t->bad);
    free(t);
}

static pd_status_t tracker__grow(kv_tracker_t *t, int32_t need)
{
    int32_t cap = t->scratch_cap ? t->scratch_cap : 256;
    if (need <= t->scratch_cap)
        return PD_OK;
    while (cap < need)
        cap *= 2;
    int32_t *pages = realloc(t->pages, (size_t)cap * sizeof *pages);
    if (pages)
        t->pages = pages;
    kv_tag_t *e = realloc(t->expected, (size_t)cap * sizeof *e);
    if (e)
        t->expected = e;
    kv_tag_t *c = realloc(t->current, (size_t)cap * sizeof *c);
    if (c)
        t->current = c;
    kv_tag_t *f = realloc(t->found, (size_t)cap * sizeof *f);
    if (f)
        t->found = f;
    uint8_t *b = realloc(t->bad, (size_t)cap);
    if (b)
        t->bad = b;
    if (!pages || !e || !c || !f || !b)
        return PD_ERR_NOMEM;
    t->scratch_cap = cap;
    return PD_OK;
}

int kv_tracker_check(kv_tracker_t *t, const kv_tag_io_t *io, const void *arena, const kv_layout_t *l,
                     const kv_seq_t *const *seqs, const int32_t *n_tokens, const uint64_t *seq_ids,
                     int n_seqs, pd_status_t *status_out)
{
    int32_t total = 0, k = 0;
    int failed = 0;

    if (!t->ops->enabled) {
        for (int s = 0; s < n_seqs; s++)
            status_out[s] = PD_OK;
        return 0;
    }
    for (int s = 0; s < n_seqs; s++)
        total += (n_tokens[s] + l->page_tokens - 1) / l->page_tokens;
    if (tracker__grow(t, total) != PD_OK)
        return PD_ERR_NOMEM;
    for (int s = 0; s < n_seqs; s++) {
        int32_t np = (n_tokens[s] + l->page_tokens - 1) / l->page_tokens;
        PD_ASSERT(np <= seqs[s]->n_pages);
        for (int32_t i = 0; i < np; i++, k++) {
            int32_t page = seqs[s]->pages[i].page;
            t->pages[k] = page;
            t->expected[k] = seqs[s]->pages[i].tag;
            /* a corrupt block table entry may point outside the pool: report, never index */
            t->current[k] = (page >= 0 && page < t->n_pages) ? t->tags[page] : KV_TAG_INVALID;
            if (page < 0 || page >= t->n_pages)
                t->pages[k] = 0;
        }
    }
    if (total > 0)
        io->check(io->ctx, t->bad, t->found, arena, l, t->pages, t->expected, t->current,
                          total);
    t->checks += (uint64_t)total;
    k = 0;
    for (int s = 0; s < n_seqs; s++) {
        int32_t np = (n_tokens[s] + l->page_tokens - 1) / l->page_tokens;
        status_out[s] = PD_OK;
        for (int32_t i = 0; i < np; i++, k++) {
            if (t->bad[k] && status_out[s] == PD_OK) {
                status_out[s] = PD_ERR_KV_INTEGRITY;
                pd_log_error("seq %llu: kv integrity check failed: page %d (block %d) expected "
                             "tag %llu, found %s %llu",
                             (unsigned long long)(seq_ids ? seq_ids[s] : (uint64_t)s),
                             seqs[s]->pages[i].page, i, (unsigned long long)t->expected[k],
                             t->bad[k] == 1 ? "tag" : "stamp",
                             (unsigned long long)(t->bad[k] == 1 ? t->current[k] : t->found[k]));
            }
        }
        if (status_out[s] != PD_OK) {
            failed++;
            t->failures++;
        }
    }
    return failed;
}

void kv_tracker_stamp(kv_tracker_t *t, const kv_tag_io_t *io, void *arena, const kv_layout_t *l,
                      const kv_page_ref_t *refs, int n)
{
    if (!t->ops->enabled || n == 0)
        return;
    if (tracker__grow(t, n) != PD_OK)
        return; /* a missing stamp is caught by the next check, never silently accepted */
    for (int i = 0; i < n; i++) {
        t->pages[i] = refs[i].page;
        t->expected[i] = refs[i].tag;
    }
    io->stamp(io->ctx, arena, l, t->pages, t->expected, n);
}
