/* kv_tracker: page-tag integrity tracking for the paged KV cache.
 *
 * Two implementations behind one ops table:
 *   tagged (default): every page allocation gets a new 64-bit tag from one pool-wide counter,
 *     unique among the tags of every page (live, quarantined or free: a stale stamp can still
 *     sit in a header), also after the counter wraps; kv_tracker_check() runs one batched pass over
 * every page every sequence of the step will read and compares (current tag, header stamp) with the
 * tag the sequence expects. A mismatch marks only that sequence PD_ERR_KV_INTEGRITY, logs "seq S:
 * page P tag expected E found F (stamp)" and counts it. noop: keeps no tags (all 0), stamps
 * nothing, checks nothing; zero cost. The check itself runs where the pages are (kv_tag_io_t: the
 * backend's kv_check / kv_stamp ops, see backend_tag_io), so on a GPU it is its own kernel; this
 * module only does the bookkeeping. One thread owns a tracker (the owner of the pool).
 */
#ifndef PD_KV_TRACKER_H
#define PD_KV_TRACKER_H

#include <stdbool.h>
#include <stdint.h>

#include "kv_layout.h"
#include "status.h"

/* Where the stamps and the batched check run (the pages' memory: host or GPU). ctx is the
 * backend; pages, expected, current, bad_out, found_out are host arrays (n). */
typedef struct {
    void *ctx;
    /* bad_out[i] = 1 if current[i] != expected[i], else 2 if the stamp in page pages[i]'s header
     * != expected[i], else 0; found_out[i] = that stamp */
    void (*check)(void *ctx, uint8_t *bad_out, kv_tag_t *found_out, const void *arena,
                  const kv_layout_t *l, const int32_t *pages, const kv_tag_t *expected,
                  const kv_tag_t *current, int n);
    /* writes tags (n) into the headers of pages (n) */
    void (*stamp)(void *ctx, void *arena, const kv_layout_t *l, const int32_t *pages,
                  const kv_tag_t *tags, int n);
} kv_tag_io_t;

/* Never handed out as a tag (nor is 0): stands for "no page" in the check (a block-table entry
 * outside the pool). */
#define KV_TAG_INVALID UINT64_MAX

typedef enum { KV_TRACKER_TAGGED = 0, KV_TRACKER_NOOP } kv_tracker_kind_t;

typedef struct kv_tracker kv_tracker_t;

typedef struct {
    const char *name;
    /* gives page a new tag and returns it */
    kv_tag_t (*on_alloc)(kv_tracker_t *t, int32_t page);
    /* whether stamps and checks are done at all */
    bool enabled;
} kv_tracker_ops_t;

struct kv_tracker {
    const kv_tracker_ops_t *ops;
    int32_t n_pages;
    kv_tag_t *tags;    /* (n_pages) current (last) tag per page; NULL for noop */
    kv_tag_t next_tag; /* last tag handed out (pool-wide counter) */
    bool wrapped;      /* the counter went past KV_TAG_INVALID: new tags skip those in tags[] */
    uint64_t failures; /* sequences failed by the check */
    uint64_t checks;   /* pages checked */
    /* scratch for the batched check, grown on demand */
    int32_t scratch_cap;
    int32_t *pages;
    kv_tag_t *expected, *current, *found;
    uint8_t *bad;
};

/* Parses "tagged" | "noop"; -1 if unknown. */
int kv_tracker_kind_parse(const char *name, kv_tracker_kind_t *kind_p);

/* Creates a tracker for n_pages pages. PD_ERR_NOMEM. */
pd_status_t kv_tracker_create(kv_tracker_kind_t kind, int32_t n_pages, kv_tracker_t **t_p);
void kv_tracker_destroy(kv_tracker_t *t);

static inline bool kv_tracker_enabled(const kv_tracker_t *t)
{
    return t->ops->enabled;
}

/* Current tag of page (0 for noop). */
static inline kv_tag_t kv_tracker_tag(const kv_tracker_t *t, int32_t page)
{
    return t->tags ? t->tags[page] : 0;
}

/* The batched check before an attention step. seqs (n_seqs); n_tokens[s] is how many tokens of
 * seqs[s] are already written (their pages are checked). Writes per-sequence PD_OK or
 * PD_ERR_KV_INTEGRITY into status_out (n_seqs) and returns the number of failed sequences, or a
 * negative status (PD_ERR_NOMEM) when the check could not run (status_out untouched). */
int kv_tracker_check(kv_tracker_t *t, const kv_tag_io_t *io, const void *arena,
                     const kv_layout_t *l, const kv_seq_t *const *seqs, const int32_t *n_tokens,
                     const uint64_t *seq_ids, int n_seqs, pd_status_t *status_out);

/* Stamps the given pages with their refs' tags (the local writer's stamp). No-op for noop. */
void kv_tracker_stamp(kv_tracker_t *t, const kv_tag_io_t *io, void *arena, const kv_layout_t *l,
                      const kv_page_ref_t *refs, int n);

#endif
