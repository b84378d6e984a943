#include "decode_faults.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kv_pool_faults.h"
#include "log.h"
#include "node.h"
#include "tp_comm_faults.h"

typedef enum {
    FAULT_REUSE,
    FAULT_STALE,
    FAULT_TABLE,
    FAULT_KVDONE_TRUNCATE,
    FAULT_KVDONE_MISMATCH,
    FAULT_KVDONE_TOKEN,
    FAULT_KVDONE_CHECKSUM,
    FAULT_KVDONE_DIRECT,
    FAULT_KVDONE_SLICE,
} fault_kind_t;

static const char *const fault_names[] = {
    [FAULT_REUSE] = "reuse",
    [FAULT_STALE] = "stale",
    [FAULT_TABLE] = "table",
    [FAULT_KVDONE_TRUNCATE] = "kvdone-truncate",
    [FAULT_KVDONE_MISMATCH] = "kvdone-mismatch",
    [FAULT_KVDONE_TOKEN] = "kvdone-token",       /* a writer that holds the wrong token */
    [FAULT_KVDONE_CHECKSUM] = "kvdone-checksum", /* the bytes that landed are not the ones sent */
    [FAULT_KVDONE_DIRECT] = "kvdone-direct", /* claims a CUDA IPC write this node never offered */
    [FAULT_KVDONE_SLICE] = "kvdone-slice",   /* tp > 1: the last rank's slice changed after it was
                                                sent (the other slices are intact) */
};

/* One fault per process: the environment does not change. */
static struct {
    fault_kind_t kind;
    const char *victim;
    atomic_int kv_done_seen;
} fault;

static void decode_faults__before_admit(void *arg, engine_t *e, const char *request_id,
                                        kv_seq_t *kv)
{
    kv_pool_t *pool = engine_pool(e);
    kv_page_ref_t thief;
    (void)arg;
    if (!strstr(request_id, fault.victim) || kv->n_pages == 0)
        return;
    pd_log_warn("request %s: injecting fault '%s'", request_id, fault_names[fault.kind]);
    if (fault.kind == FAULT_REUSE) {
        /* the page is handed to someone else while this sequence still holds it */
        if (kv_pool_faults_steal_page(pool, kv->pages[0].page, &thief) == PD_OK)
            (void)kv_pool_page_free(pool, thief);
    } else if (fault.kind == FAULT_STALE) {
        /* a late write of an earlier owner lands with its old stamp */
        pd_backend_t *be = engine_backend(e);
        kv_tag_t old = kv->pages[0].tag - 1;
        be->ops->kv_stamp(be, engine_arena(e), kv_pool_layout(pool), &kv->pages[0].page, &old, 1);
    } else {
        /* a block-table entry points at another page (the page it hid goes back to the pool) */
        kv_page_ref_t orig = kv->pages[0];
        kv->pages[0].page = (kv->pages[0].page + 1) % kv_pool_n_pages(pool);
        (void)kv_pool_page_free(pool, orig);
    }
}

static void decode_faults__on_kv_done(void *arg, uint8_t *buf, size_t cap, size_t *len_p,
                                      int *direct_p)
{
    node_kv_done_t m;
    (void)arg;
    if (atomic_fetch_add(&fault.kv_done_seen, 1) != 0 || *len_p == 0)
        return; /* the first message only */
    pd_log_warn("kv done of %zu bytes: injecting fault '%s'", *len_p, fault_names[fault.kind]);
    if (fault.kind == FAULT_KVDONE_TRUNCATE) {
        (*len_p)--;
    } else if (fault.kind == FAULT_KVDONE_DIRECT) {
        *direct_p = 1;
    } else if (node_kv_done_unpack(buf, *len_p, "fault", &m) == PD_OK) {
        if (fault.kind == FAULT_KVDONE_TOKEN)
            m.token[0] ^= 1;
        else if (fault.kind == FAULT_KVDONE_CHECKSUM)
            m.checksum ^= 1; /* as if one byte of a page had changed after it was sent */
        else if (fault.kind == FAULT_KVDONE_SLICE && m.n_slices > 1)
            m.slice_sums[m.n_slices - 1] ^= 1; /* one byte of the last rank's slice changed */
        else if (fault.kind == FAULT_KVDONE_SLICE)
            pd_log_error("kvdone-slice: the kv done has no slice checksums (a tp 1 node)");
        else
            m.n_tokens++;
        PD_ASSERT(node_kv_done_pack(&m, buf, cap, len_p) == PD_OK);
    }
}

pd_status_t decode_faults_hooks_from_env(decode_node_hooks_t *hooks_p)
{
    const char *kind = getenv("PDSERVE_FAULT"), *who = getenv("PDSERVE_FAULT_REQUEST");
    static tp_comm_faults_t tp_fault; /* lives as long as the process */
    size_t k;

    memset(hooks_p, 0, sizeof *hooks_p);
    if (!kind || !*kind)
        return PD_OK;
    if (sscanf(kind, "tp-rank:%d", &tp_fault.at) == 1 && tp_fault.at > 0) {
        /* a tp > 1 node: rank 1's collective number N fails in the middle of a forward */
        tp_fault.rank = 1;
        hooks_p->tp_comm_wrap = tp_comm_faults_wrap;
        hooks_p->tp_comm_arg = &tp_fault;
        return PD_OK;
    }
    for (k = 0; k < sizeof fault_names / sizeof fault_names[0]; k++)
        if (strcmp(kind, fault_names[k]) == 0)
            break;
    if (k == sizeof fault_names / sizeof fault_names[0]) {
        pd_log_error("PDSERVE_FAULT=%s: unknown fault (reuse, stale, table, kvdone-truncate, "
                     "kvdone-mismatch, kvdone-token, kvdone-checksum, kvdone-direct, kvdone-slice, "
                     "tp-rank:N)",
                     kind);
        return PD_ERR_INVALID;
    }
    fault.kind = (fault_kind_t)k;
    if (fault.kind >= FAULT_KVDONE_TRUNCATE) {
        hooks_p->on_kv_done = decode_faults__on_kv_done;
        return PD_OK;
    }
    if (!who || !*who) {
        pd_log_error("PDSERVE_FAULT=%s needs PDSERVE_FAULT_REQUEST (a request id substring)", kind);
        return PD_ERR_INVALID;
    }
    fault.victim = who;
    hooks_p->before_admit = decode_faults__before_admit;
    return PD_OK;
}
