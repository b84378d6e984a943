#include "prefill_node.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "compute.h"
#include "grpc_health.h"
#include "grpc_server.h"
#include "health.pb-c.h"
#include "kv_cuda_ipc.h"
#include "kv_path.h"
#include "kv_tracker.h"
#include "kv_transport.h"
#include "clock.h"
#include "log.h"
#include "tp_kv.h"
#include "node.h"
#include "node_sampling.h"
#include "node_control.h"
#include "pdserve.pb-c.h"

/* A decode node we write to: one endpoint and its unpacked keys. */
typedef struct peer {
    char host[256];
    int port;
    kv_transport_ep_t *ep;
    void *rkey_bytes;
    size_t rkey_len;
    kv_transport_rkey_t *rkey;
    struct peer *next;
} peer_t;

/* Compute thread: what this node knows about writing to one decode node (host:port) without
 * UCX: its CUDA IPC handle, mapped once, and the path last logged. */
typedef struct ipc_peer {
    char key[300]; /* "host:port" of the decode node's UCX listener */
    uint8_t blob[KV_CUDA_IPC_BLOB_BYTES];
    kv_cuda_ipc_map_t *map; /* NULL: not opened, or the open failed (failed set) */
    int failed;
    int logged; /* kv_path_t + 1 of the last log line */
    struct ipc_peer *next;
} ipc_peer_t;

/* One Prefill call. Freed when the call is answered and every transport callback has run. */
typedef struct pjob {
    struct prefill_node *pn;
    pd_grpc_call_t *call;
    int32_t *tokens;
    int n_tokens;
    engine_gen_params_t gp;
    kv_layout_t dst_layout;
    kv_page_ref_t *dst_pages;
    int n_dst_pages;
    uint64_t seq_id;
    peer_t *peer;
    uint64_t base;
    int refs;          /* the job itself + transport operations in flight */
    pd_status_t error; /* first transport error */
    int32_t first;
    void *gp_store;          /* the arrays of gp (node_sampling_params) */
    int n_samples;           /* first tokens to sample (PrefillRequest.n_samples) */
    int32_t *firsts;         /* (n_samples) */
    sampler_logprobs_t *lps; /* (n_samples + n_tokens) when logprobs are asked, else NULL */
    pd_status_t prefill_status;
    int64_t write_deadline_ms; /* no put is posted after this: the reservation's lease ends */
    uint8_t **staging;
    int n_staging;
    uint8_t token[NODE_TOKEN_BYTES]; /* the reservation's token (KvDestination.token) */
    atomic_int cancelled; /* the client went away or its deadline passed (set on the loop thread,
                             read by the compute thread at each chunk) */
    int aborted;          /* the KV-done sent is the "writer stopped" one */
    uint64_t checksum;    /* the KV-done checksum chain over the pages put so far */
    uint64_t direct_sum;  /* cuda-ipc: the same chain, kept by the compute thread (pages on GPU) */
    uint64_t slice_sums[NODE_KV_DONE_SLICES_MAX]; /* a destination of TP > 1: one chain per
                                                     destination rank's slice (KvDone) */
    char peer_key[300];                           /* "host:port" of the decode node (ipc_peer_t.key) */
    uint8_t ipc_blob[KV_CUDA_IPC_BLOB_BYTES]; /* KvDestination.cuda_ipc, if has_ipc */
    int has_ipc;
    /* set by the compute thread before the first page (read by the loop thread after
     * prefill__done): the path, and for cuda-ipc the mapped pool */
    kv_path_t path;
    int direct;
    kv_cuda_ipc_map_t *ipc;
    double put_start_s; /* the first put (pdserve_node_kv_transfer_seconds) */
    /* compute thread: per-layer export (KV_OVERLAP_LAYER) */
    int layered;      /* this job's pages leave per layer through the transfer stream */
    int ids_ready;    /* destination ids, tags and the source pages' check are done */
    pd_status_t lerr; /* the per-layer export's first failure (posted with the next pages) */
    int32_t *h_src;   /* (n_dst_pages) the source pages' ids, host staging */
    /* backend memory, freed after the job's xfer_sync: ids (2 * n_dst_pages: destination, then
     * source int32), tags (n_dst_pages), the packed converted pages (n_dst_pages pages) */
    int32_t *x_ids;
    kv_tag_t *x_tags;
    uint8_t *x_pages;
    double t_start_s;  /* the compute started (pdserve_node_prefill_compute_seconds) */
    double t_layers_s; /* the last layer computed (pdserve_node_kv_tail_seconds) */
} pjob_t;

/* When a prompt's pages leave (PDSERVE_KV_OVERLAP). */
typedef enum {
    KV_OVERLAP_NONE = 0, /* "0": after the whole prompt is computed (to measure the others) */
    KV_OVERLAP_CHUNK,    /* "chunk" (default; "1"): after each prefill chunk, in line on the
                          * compute thread, while the loop thread hashes and puts the previous
                          * chunk's pages */
    KV_OVERLAP_LAYER,    /* "layer" (where the backend has a transfer stream): layer L of a
                          * chunk's pages is converted and written on the transfer stream while
                          * layer L + 1 computes; the host copy (checksum, staged puts) follows
                          * the chunk. Not the default: on one H200 it did not shorten TTFT (the
                          * KV-done checksum after the last layer dominates, docs/benchmarks.md)
                          * and was slower on the staged path */
} kv_overlap_t;

struct prefill_node {
    /* control server, ops endpoint, stats, transport, clock; nc.draining: no new Prefill calls */
    node_control_t nc;
    compute_t *comp;
    peer_t *peers;
    int queued; /* calls waiting or running (loop thread) */
    int no_ipc; /* PDSERVE_KV_CUDA_IPC=0: never write over CUDA IPC (benchmarks, debugging) */
    kv_overlap_t overlap;  /* PDSERVE_KV_OVERLAP; LAYER falls back to CHUNK per job */
    ipc_peer_t *ipc_peers; /* compute thread */
};

/* ==== loop thread: job lifetime ==== */

static void prefill__unref(pjob_t *j)
{
    if (--j->refs > 0)
        return;
    for (int i = 0; i < j->n_staging; i++)
        free(j->staging[i]);
    free(j->staging);
    free(j->h_src);
    free(j->tokens);
    free(j->dst_pages);
    free(j->gp_store);
    free(j->firsts);
    free(j->lps);
    free(j);
}

static void prefill__fail(pjob_t *j, pd_status_t st, const char *what)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s: %s: %s", j->pn->nc.node->name, what, pd_status_str(st));
    pd_grpc_call_finish_status(j->call, st, msg);
    j->pn->queued--;
    prefill__unref(j);
}

static void prefill__op_done(void *arg, pd_status_t st)
{
    pjob_t *j = arg;
    if (st != PD_OK && j->error == PD_OK)
        j->error = st;
    prefill__unref(j);
}

static void prefill__am_done(void *arg, pd_status_t st)
{
    pjob_t *j = arg;
    if (st != PD_OK) {
        prefill__fail(j, PD_ERR_UNAVAILABLE, "kv done message to the decode node failed");
        return;
    }
    if (j->aborted) { /* the decode node frees the reservation now */
        prefill__fail(j, PD_ERR_CANCELLED, "prefill cancelled");
        return;
    }
    Pdserve__V1__PrefillReply rep = PDSERVE__V1__PREFILL_REPLY__INIT;
    void *first_store = NULL, *prompt_store = NULL;
    node_stats_kv_transfer(&j->pn->nc.stats, (uint64_t)j->n_dst_pages * j->dst_layout.page_bytes,
                           j->put_start_s > 0.0 ? pd_clock_s() - j->put_start_s : 0.0);
    rep.first_token = j->first;
    rep.n_tokens = (uint32_t)j->n_tokens;
    rep.first_tokens = j->firsts;
    rep.n_first_tokens = (size_t)j->n_samples;
    pd_status_t lst = PD_OK;
    if (j->lps && j->gp.logprobs &&
        (lst = node_sampling_logprobs_msg(j->lps, (size_t)j->n_samples, &rep.first_logprobs,
                                          &first_store)) == PD_OK)
        rep.n_first_logprobs = (size_t)j->n_samples;
    if (lst == PD_OK && j->lps && j->gp.prompt_logprobs && j->n_tokens > 1 &&
        (lst = node_sampling_logprobs_msg(j->lps + j->n_samples, (size_t)j->n_tokens - 1,
                                          &rep.prompt_logprobs, &prompt_store)) == PD_OK)
        rep.n_prompt_logprobs = (size_t)j->n_tokens - 1;
    pd_grpc_call_finish_status(j->call, lst != PD_OK ? lst : pd_grpc_call_send(j->call, &rep.base),
                               NULL);
    free(first_store);
    free(prompt_store);
    j->pn->queued--;
    pthread_mutex_lock(&j->pn->nc.stats.mu);
    j->pn->nc.stats.requests++;
    j->pn->nc.stats.tokens += (uint64_t)j->n_tokens;
    pthread_mutex_unlock(&j->pn->nc.stats.mu);
    prefill__unref(j);
}

static void prefill__flush_done(void *arg, pd_status_t st)
{
    pjob_t *j = arg;
    node_kv_done_t msg = {j->seq_id,
                          j->first,
                          (uint32_t)j->n_tokens,
                          (uint32_t)j->n_dst_pages,
                          j->aborted,
                          j->checksum,
                          {0},
                          0,
                          {0}};
    uint8_t buf[NODE_KV_DONE_MAX];
    size_t len;
    if (st == PD_OK)
        st = j->error;
    if (st != PD_OK) {
        prefill__fail(j, PD_ERR_UNAVAILABLE, "kv transfer to the decode node failed");
        return;
    }
    memcpy(msg.token, j->token, NODE_TOKEN_BYTES);
    if (j->dst_layout.n_slices > 1) {
        msg.checksum = 0;
        msg.n_slices = j->dst_layout.n_slices;
        memcpy(msg.slice_sums, j->slice_sums, sizeof j->slice_sums);
    }
    if (!j->aborted && j->t_layers_s > 0.0)
        node_stats_prefill(&j->pn->nc.stats, j->t_layers_s - j->t_start_s,
                           pd_clock_s() - j->t_layers_s);
    if (node_kv_done_pack(&msg, buf, sizeof buf, &len) != PD_OK) {
        prefill__fail(j, PD_ERR_INTERNAL, "kv done message could not be packed");
        return;
    }
    st = kv_transport_am_send(j->peer->ep, j->direct ? NODE_AM_KV_DONE_DIRECT : NODE_AM_KV_DONE,
                              buf, len, NULL, 0, prefill__am_done, j);
    if (st != PD_OK)
        prefill__fail(j, PD_ERR_UNAVAILABLE, "kv done message to the decode node failed");
}

/* ==== compute -> loop messages ==== */

typedef struct put_msg {
    pjob_t *j;
    uint8_t *staging; /* NULL when st != PD_OK; direct: NULL (the pages are in place) */
    uint64_t sum;     /* direct: the checksum chain over these pages, from the chain's start */
    int first, n;
    pd_status_t st; /* the export's status: a failed export is never put */
} put_msg_t;

static void prefill__count_pages(prefill_node_t *pn, kv_path_t p, int n)
{
    pthread_mutex_lock(&pn->nc.stats.mu);
    pn->nc.stats.kv_pages_by_path[p] += (uint64_t)n;
    pthread_mutex_unlock(&pn->nc.stats.mu);
}

/* Chains the KV-done checksums over n more pages as sent (packed at pages): one over the whole
 * pages for a destination of TP 1, one per destination rank's slice above. */
static void prefill__checksum(pjob_t *j, const uint8_t *pages, int n)
{
    const kv_layout_t *l = &j->dst_layout;
    if (l->n_slices <= 1) {
        j->checksum = node_pages_checksum(j->checksum, pages, NULL, n, l->page_bytes);
        return;
    }
    for (int s = 0; s < l->n_slices && s < NODE_KV_DONE_SLICES_MAX; s++)
        j->slice_sums[s] = tp_kv_slice_checksum(j->slice_sums[s], pages, NULL, n, l, s);
}

static void prefill__put(void *arg)
{
    put_msg_t *m = arg;
    pjob_t *j = m->j;
    const size_t pb = j->dst_layout.page_bytes;
    uint8_t **s = NULL;
    if (m->st == PD_OK && !j->direct &&
        !(s = realloc(j->staging, (size_t)(j->n_staging + 1) * sizeof *s)))
        m->st = PD_ERR_NOMEM;
    if (m->st != PD_OK) {
        if (j->error == PD_OK)
            j->error = m->st;
        free(m->staging);
        free(m);
        return;
    }
    prefill__count_pages(j->pn, j->path, m->n);
    if (j->direct) { /* already written GPU -> GPU; the compute thread chained the checksum
                      * (cuda-ipc only reaches TP 1 decode nodes: one chain, no slices) */
        j->checksum = m->sum;
        free(m);
        return;
    }
    j->staging = s;
    j->staging[j->n_staging++] = m->staging;
    if (j->put_start_s == 0.0)
        j->put_start_s = pd_clock_s();
    /* pages arrive in order (FIFO from the compute thread): the checksum the decode node will
     * recompute over what landed in its pool */
    prefill__checksum(j, m->staging, m->n);
    if (j->error == PD_OK && node_control_now_ms(&j->pn->nc) > j->write_deadline_ms)
        j->error = PD_ERR_RESOURCE; /* the decode node may hand these pages to others now */
    for (int i = 0; i < m->n && j->error == PD_OK; i++) {
        const kv_page_ref_t *r = &j->dst_pages[m->first + i];
        pd_status_t st =
            kv_transport_put(j->peer->ep, m->staging + (size_t)i * pb, pb,
                             j->base + (uint64_t)r->page * pb, j->peer->rkey, prefill__op_done, j);
        if (st != PD_OK)
            j->error = st;
        else
            j->refs++;
    }
    free(m);
}

static void prefill__done(void *arg)
{
    pjob_t *j = arg;
    pd_status_t st;
    if (j->prefill_status == PD_ERR_RESOURCE || j->error == PD_ERR_RESOURCE) {
        prefill__fail(j, PD_ERR_RESOURCE, "kv lease ended before the pages were written");
        return;
    }
    if (j->prefill_status == PD_ERR_CANCELLED && j->error == PD_OK) {
        /* stopped at a chunk boundary: flush what was posted, then tell the decode node the writer
         * is done for good (KvDone aborted), so it frees the reservation at once instead of
         * holding its pages until the lease ends */
        j->aborted = 1;
        if ((st = kv_transport_flush(j->peer->ep, prefill__flush_done, j)) != PD_OK)
            prefill__fail(j, PD_ERR_CANCELLED, "prefill cancelled");
        return;
    }
    if (j->prefill_status != PD_OK) {
        prefill__fail(j, j->prefill_status, "prefill failed");
        return;
    }
    if (j->error == PD_ERR_KV_INTEGRITY || j->error == PD_ERR_NOMEM || j->error == PD_ERR_CUDA) {
        prefill__fail(j, j->error, "kv export failed"); /* this node's fault: nothing was sent */
        return;
    }
    if (j->error != PD_OK) {
        prefill__fail(j, PD_ERR_UNAVAILABLE, "kv transfer to the decode node failed");
        return;
    }
    /* every put is posted (FIFO from the compute thread); flush, then send KV-done */
    if ((st = kv_transport_flush(j->peer->ep, prefill__flush_done, j)) != PD_OK)
        prefill__fail(j, PD_ERR_UNAVAILABLE, "kv transfer to the decode node failed");
}

/* The client of the Prefill call (the router) went away or the deadline passed: the compute
 * thread stops at the next chunk (j stays valid: the call is finished only by prefill__done). */
static void prefill__call_cancelled(pd_grpc_call_t *call, void *arg)
{
    pjob_t *j = arg;
    (void)call;
    atomic_store(&j->cancelled, 1);
}

/* ==== compute thread ==== */

/* The decode node's CUDA IPC mapping for j, opened once per peer and handle (a restarted decode
 * node sends a new handle: the old mapping is closed). NULL when it cannot be opened; a failed
 * handle is not tried again. */
static kv_cuda_ipc_map_t *prefill__ipc_map(prefill_node_t *pn, pjob_t *j, ipc_peer_t **peer_p)
{
    ipc_peer_t *p;
    for (p = pn->ipc_peers; p; p = p->next)
        if (strcmp(p->key, j->peer_key) == 0)
            break;
    if (!p) {
        if (!(p = calloc(1, sizeof *p)))
            return NULL;
        snprintf(p->key, sizeof p->key, "%s", j->peer_key);
        p->next = pn->ipc_peers;
        pn->ipc_peers = p;
    }
    *peer_p = p;
    if (!j->has_ipc)
        return NULL;
    if (memcmp(p->blob, j->ipc_blob, sizeof p->blob) != 0) {
        kv_cuda_ipc_close(p->map);
        p->map = NULL;
        p->failed = 0;
        memcpy(p->blob, j->ipc_blob, sizeof p->blob);
    }
    if (!p->map && !p->failed && kv_cuda_ipc_open(p->blob, sizeof p->blob, &p->map) != PD_OK) {
        p->map = NULL;
        p->failed = 1; /* logged by kv_cuda_ipc_open */
    }
    return p->map;
}

/* Picks j's path (kv_path.h) before its first page, logs it when it changes for that peer and
 * shows it in /health and /metrics. */
static void prefill__choose_path(prefill_node_t *pn, pjob_t *j, engine_t *e)
{
    kv_path_offer_t o = {0};
    const char *why;
    ipc_peer_t *peer = NULL;
    o.src_gpu = strcmp(engine_backend(e)->ops->name, "cpu") != 0;
    o.dst_gpu = j->has_ipc; /* a decode node offers a handle only for a GPU pool */
    o.ipc_offered = j->has_ipc && !pn->no_ipc;
    o.ipc_same_host = o.ipc_offered && kv_cuda_ipc_same_host(j->ipc_blob, sizeof j->ipc_blob, NULL);
    o.ipc_opened = -1;
    /* ucx-cuda is the decode node's choice (it registers its GPU pool with UCX); this side puts
     * from the host copy it checksums either way, so it counts as staged here */
    kv_path_t p = kv_path_select(&o, &why);
    if (p == KV_PATH_CUDA_IPC) {
        j->ipc = prefill__ipc_map(pn, j, &peer);
        if (!j->ipc) {
            o.ipc_opened = 0;
            p = kv_path_select(&o, &why);
        }
    } else {
        prefill__ipc_map(pn, j, &peer); /* for the log line's memory */
    }
    if (j->has_ipc && pn->no_ipc)
        why = "cuda ipc turned off (PDSERVE_KV_CUDA_IPC=0)";
    j->path = p;
    j->direct = p == KV_PATH_CUDA_IPC;
    if (peer && peer->logged != (int)p + 1) {
        peer->logged = (int)p + 1;
        if (j->direct)
            pd_log_info("%s: kv to %s: cuda-ipc, %s, no host staging", pn->nc.node->name,
                        j->peer_key, kv_cuda_ipc_describe(j->ipc));
        else
            pd_log_info("%s: kv to %s: %s (%s)", pn->nc.node->name, j->peer_key, kv_path_name(p),
                        why);
    }
    pthread_mutex_lock(&pn->nc.stats.mu);
    snprintf(pn->nc.stats.kv_path, sizeof pn->nc.stats.kv_path, "%s", kv_path_name(p));
    pthread_mutex_unlock(&pn->nc.stats.mu);
}

/* cuda-ipc: converts pages [first, first + n) of kv into the destination format in device
 * memory, copies them GPU -> GPU into the decode node's mapped pool, and extends j->direct_sum
 * (the KV-done checksum, compute thread only) with the digests of the pages as sent, computed on
 * the GPU (node_pages_checksum_be: 8 bytes a page come back, not the pages). The digest waits
 * for the copies: the pages have landed when it returns. */
static pd_status_t prefill__write_direct(pjob_t *j, engine_t *e, const kv_seq_t *kv, int first,
                                         int n)
{
    pd_backend_t *be = engine_backend(e);
    const size_t pb = j->dst_layout.page_bytes, len = kv_cuda_ipc_len(j->ipc);
    uint8_t *base = kv_cuda_ipc_base(j->ipc), *dev = NULL;
    pd_status_t st;

    if (node_control_now_ms(&j->pn->nc) > j->write_deadline_ms)
        return PD_ERR_RESOURCE; /* the decode node may hand these pages to others now */
    for (int i = 0; i < n; i++) {
        int32_t pg = j->dst_pages[first + i].page;
        if (pg < 0 || (size_t)pg >= len / pb) {
            pd_log_error("seq %llu: destination page %d outside the decode node's pool (%zu pages)",
                         (unsigned long long)j->seq_id, pg, len / pb);
            return PD_ERR_INVALID;
        }
    }
    if ((st = be->ops->alloc(be, (size_t)n * pb, (void **)&dev)) != PD_OK)
        goto out;
    if ((st = engine_export_pages_dev(e, kv, first, n, &j->dst_layout, j->dst_pages + first, dev)))
        goto out;
    for (int i = 0; i < n && st == PD_OK;) { /* one copy per run of consecutive pages */
        int32_t pg = j->dst_pages[first + i].page;
        int run = 1;
        while (i + run < n && j->dst_pages[first + i + run].page == pg + run)
            run++;
        st = be->ops->copy(be, base + (size_t)pg * pb, dev + (size_t)i * pb, (size_t)run * pb);
        i += run;
    }
    if (st == PD_OK)
        st = node_pages_checksum_be(be, j->direct_sum, dev, NULL, n, pb, &j->direct_sum);
    if (st != PD_OK)
        pd_log_error("seq %llu: cuda ipc write of pages %d..%d: %s", (unsigned long long)j->seq_id,
                     first, first + n - 1, pd_status_str(st));
out:
    if (dev)
        be->ops->free(be, dev);
    return st;
}

/* Exports pages [first, first + n) of kv in line (KV_OVERLAP_CHUNK / NONE) and posts them to the
 * loop thread (checksum, staged puts). */
static void prefill__export_now(pjob_t *j, engine_t *e, const kv_seq_t *kv, int first, int n)
{
    put_msg_t *m = malloc(sizeof *m);
    PD_ASSERT(m); /* a message back to the loop thread must not be lost (compute_post aborts too) */
    m->staging = NULL;
    if (j->direct)
        m->st = prefill__write_direct(j, e, kv, first, n);
    else if (!(m->staging = malloc((size_t)n * j->dst_layout.page_bytes)))
        m->st = PD_ERR_NOMEM;
    else
        m->st =
            engine_export_pages(e, kv, first, n, &j->dst_layout, j->dst_pages + first, m->staging);
    m->sum = j->direct_sum;
    if (m->st != PD_OK) {
        free(m->staging);
        m->staging = NULL;
    }
    m->j = j;
    m->first = first;
    m->n = n;
    compute_post(j->pn->comp, prefill__put, m);
}

/* KV_OVERLAP_LAYER, before the first layer's export: the source pages' own tag check (all of
 * the prompt's pages are reserved and stamped before its first chunk), the destination ids and
 * tags on the backend. */
static pd_status_t prefill__layer_setup(pjob_t *j, engine_t *e, const kv_seq_t *kv)
{
    pd_backend_t *be = engine_backend(e);
    const int N = j->n_dst_pages;
    const size_t pb = j->dst_layout.page_bytes;
    kv_tag_t *tags = NULL;
    int32_t *dst = NULL;
    pd_status_t st;

    if (kv->n_pages != N)
        return PD_ERR_INTERNAL;
    if ((st = engine_export_check(e, kv, 0, N)) != PD_OK)
        return st;
    if (j->direct) { /* every destination page inside the decode node's pool */
        const size_t pages = kv_cuda_ipc_len(j->ipc) / pb;
        for (int i = 0; i < N; i++)
            if (j->dst_pages[i].page < 0 || (size_t)j->dst_pages[i].page >= pages) {
                pd_log_error("seq %llu: destination page %d outside the decode node's pool "
                             "(%zu pages)",
                             (unsigned long long)j->seq_id, j->dst_pages[i].page, pages);
                return PD_ERR_INVALID;
            }
    }
    if ((st = be->ops->alloc(be, (size_t)N * 2 * sizeof(int32_t), (void **)&j->x_ids)) ||
        (st = be->ops->alloc(be, (size_t)N * sizeof(kv_tag_t), (void **)&j->x_tags)) ||
        (st = be->ops->alloc(be, (size_t)N * pb, (void **)&j->x_pages)))
        return st;
    if (!(j->h_src = malloc((size_t)N * sizeof *j->h_src)) ||
        !(dst = malloc((size_t)N * sizeof *dst)) || !(tags = malloc((size_t)N * sizeof *tags))) {
        st = PD_ERR_NOMEM;
        goto out;
    }
    for (int i = 0; i < N; i++) {
        dst[i] = j->dst_pages[i].page;
        tags[i] = j->dst_pages[i].tag;
        j->h_src[i] = kv->pages[i].page;
    }
    /* on the compute stream, before this layer's event: the transfer stream sees them */
    if ((st = be->ops->upload(be, j->x_ids, dst, (size_t)N * sizeof *dst)) != PD_OK ||
        (st = be->ops->upload(be, j->x_ids + N, j->h_src, (size_t)N * sizeof *j->h_src)) ||
        (st = be->ops->upload(be, j->x_tags, tags, (size_t)N * sizeof *tags)) != PD_OK)
        goto out;
out:
    free(dst);
    free(tags);
    return st;
}

/* engine_layer_fn (KV_OVERLAP_LAYER): layer `layer` of pages [first, first + n), behind its KV
 * write on the compute stream: converted into the packed copy (checksum, staged puts) and, over
 * CUDA IPC, straight into the decode node's pool. */
static void prefill__layer(void *arg, const kv_seq_t *kv, int first, int n, int layer)
{
    pjob_t *j = arg;
    engine_t *e = compute_engine(j->pn->comp);
    pd_backend_t *be = engine_backend(e);
    prefill_node_t *pn = j->pn;
    const kv_layout_t *src = kv_pool_layout(engine_pool(e));
    const size_t pb = j->dst_layout.page_bytes;
    const int N = j->n_dst_pages;

    if (j->lerr != PD_OK)
        return;
    if (layer == 0 && !j->ids_ready) {
        if ((j->lerr = prefill__layer_setup(j, e, kv)) != PD_OK)
            return;
        j->ids_ready = 1;
    }
    if (layer == 0 && j->direct && node_control_now_ms(&pn->nc) > j->write_deadline_ms) {
        j->lerr = PD_ERR_RESOURCE; /* the decode node may hand these pages to others now */
        return;
    }
    be->ops->xfer_kv_export(be, j->x_pages + (size_t)first * pb, &j->dst_layout, NULL,
                            j->x_tags + first, engine_arena(e), src, j->x_ids + N + first, n, layer,
                            1);
    if (j->direct)
        be->ops->xfer_kv_export(be, kv_cuda_ipc_base(j->ipc), &j->dst_layout, j->x_ids + first,
                                j->x_tags + first, engine_arena(e), src, j->x_ids + N + first, n,
                                layer, 1);
}

static int prefill__pages(void *arg, const kv_seq_t *kv, int first, int n)
{
    pjob_t *j = arg;
    compute_t *c = j->pn->comp;
    engine_t *e = compute_engine(c);
    pd_backend_t *be = engine_backend(e);
    put_msg_t *m;

    if (first + n == j->n_dst_pages) /* the last layer of the last chunk has run */
        j->t_layers_s = pd_clock_s();
    if (atomic_load(&j->cancelled))
        return 1; /* engine_prefill stops here with PD_ERR_CANCELLED */
    if (j->pn->overlap == KV_OVERLAP_NONE)
        return 0; /* prefill__run exports the whole prompt after it */
    if (!j->layered) {
        prefill__export_now(j, e, kv, first, n);
        return 0;
    }
    /* the chunk's layers are converted (and written) on the transfer stream: once the last one
     * is done, staged: fetch the packed copy for the checksum and the puts; cuda-ipc: the
     * checksum over the packed copy on the GPU */
    m = malloc(sizeof *m);
    PD_ASSERT(m);
    m->st = j->lerr;
    m->staging = NULL;
    if (m->st == PD_OK && !j->direct &&
        !(m->staging = malloc((size_t)n * j->dst_layout.page_bytes)))
        m->st = PD_ERR_NOMEM;
    if (m->st == PD_OK) {
        const size_t pb = j->dst_layout.page_bytes;
        if (!j->direct)
            be->ops->xfer_download(be, m->staging, j->x_pages + (size_t)first * pb, (size_t)n * pb);
        m->st = be->ops->xfer_sync(be);
        if (m->st == PD_OK && j->direct)
            m->st = node_pages_checksum_be(be, j->direct_sum, j->x_pages + (size_t)first * pb, NULL,
                                           n, pb, &j->direct_sum);
        if (m->st != PD_OK)
            pd_log_error("seq %llu: kv export of pages %d..%d: %s", (unsigned long long)j->seq_id,
                         first, first + n - 1, pd_status_str(m->st));
    }
    m->sum = j->direct_sum;
    if (m->st != PD_OK) {
        free(m->staging);
        m->staging = NULL;
        if (j->lerr == PD_OK)
            j->lerr = m->st; /* nothing more is exported for this job */
    }
    m->j = j;
    m->first = first;
    m->n = n;
    compute_post(c, prefill__put, m);
    return 0;
}

static void prefill__run(compute_t *c, engine_t *e, void *arg)
{
    pjob_t *j = arg;
    pd_backend_t *be = engine_backend(e);
    kv_seq_t kv;
    if (node_control_now_ms(&j->pn->nc) >
        j->write_deadline_ms) { /* queued too long: skip the work */
        j->prefill_status = PD_ERR_RESOURCE;
        compute_post(c, prefill__done, j);
        return;
    }
    if (atomic_load(&j->cancelled)) { /* cancelled while queued: skip the work */
        j->prefill_status = PD_ERR_CANCELLED;
        compute_post(c, prefill__done, j);
        return;
    }
    j->t_start_s = pd_clock_s();
    prefill__choose_path(j->pn, j, e);
    j->layered = j->pn->overlap == KV_OVERLAP_LAYER && be->ops->xfer_kv_export &&
                 engine_set_prefill_layer_hook(e, prefill__layer, j);
    j->prefill_status = engine_prefill(e, j->tokens, j->n_tokens, &j->gp, prefill__pages, j,
                                       j->firsts, &kv, j->lps);
    if (j->layered) {
        engine_set_prefill_layer_hook(e, NULL, NULL);
        if (be->ops->xfer_sync(be) != PD_OK && j->prefill_status == PD_OK)
            j->prefill_status = PD_ERR_CUDA; /* not seen by a chunk: a cancelled prompt's */
        if (j->x_ids)
            be->ops->free(be, j->x_ids);
        if (j->x_tags)
            be->ops->free(be, j->x_tags);
        if (j->x_pages)
            be->ops->free(be, j->x_pages);
        j->x_ids = NULL;
        j->x_tags = NULL;
        j->x_pages = NULL;
    }
    j->first = j->firsts[0];
    if (j->prefill_status == PD_OK) {
        if (j->pn->overlap == KV_OVERLAP_NONE)
            prefill__export_now(j, e, &kv, 0, kv.n_pages);
        kv_seq_release(engine_pool(e), &kv);
        kv_seq_deinit(&kv);
    }
    compute_post(c, prefill__done, j);
}

static void prefill__tick(compute_t *c, engine_t *e, void *arg)
{
    prefill_node_t *pn = arg;
    (void)c;
    node_stats_publish(&pn->nc.stats, e, 0);
}

/* ==== loop thread: rpcs ==== */

static peer_t *prefill__peer(prefill_node_t *pn, const Pdserve__V1__KvDestination *d,
                             pd_status_t *st_p)
{
    peer_t *p, **pp;
    for (pp = &pn->peers; (p = *pp); pp = &p->next) {
        if (strcmp(p->host, d->ucx_host) == 0 && p->port == (int)d->ucx_port) {
            if (kv_transport_ep_failed(p->ep)) { /* the decode node restarted: reconnect */
                *pp = p->next;
                kv_transport_rkey_destroy(p->rkey);
                kv_transport_ep_close(p->ep);
                free(p->rkey_bytes);
                free(p);
                break;
            }
            if (p->rkey_len != d->rkey.len || memcmp(p->rkey_bytes, d->rkey.data, p->rkey_len)) {
                kv_transport_rkey_t *r;
                uint8_t *bytes = malloc(d->rkey.len ? d->rkey.len : 1);
                if (!bytes) {
                    *st_p = PD_ERR_NOMEM;
                    return NULL;
                }
                if ((*st_p = kv_transport_rkey_unpack(p->ep, d->rkey.data, d->rkey.len, &r))) {
                    free(bytes);
                    return NULL;
                }
                kv_transport_rkey_destroy(p->rkey);
                free(p->rkey_bytes);
                p->rkey = r;
                p->rkey_bytes = bytes;
                memcpy(p->rkey_bytes, d->rkey.data, d->rkey.len);
                p->rkey_len = d->rkey.len;
            }
            return p;
        }
    }
    p = calloc(1, sizeof *p);
    if (!p) {
        *st_p = PD_ERR_NOMEM;
        return NULL;
    }
    snprintf(p->host, sizeof p->host, "%s", d->ucx_host);
    p->port = (int)d->ucx_port;
    if ((*st_p = kv_transport_connect(pn->nc.tr, p->host, p->port, &p->ep)) != PD_OK ||
        (*st_p = kv_transport_rkey_unpack(p->ep, d->rkey.data, d->rkey.len, &p->rkey)) != PD_OK) {
        kv_transport_ep_close(p->ep);
        free(p);
        return NULL;
    }
    if (!(p->rkey_bytes = malloc(d->rkey.len ? d->rkey.len : 1))) {
        kv_transport_rkey_destroy(p->rkey);
        kv_transport_ep_close(p->ep);
        free(p);
        *st_p = PD_ERR_NOMEM;
        return NULL;
    }
    memcpy(p->rkey_bytes, d->rkey.data, d->rkey.len);
    p->rkey_len = d->rkey.len;
    p->next = pn->peers;
    pn->peers = p;
    return p;
}

static void prefill__rpc_prefill(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    prefill_node_t *pn = user;
    const Pdserve__V1__PrefillRequest *req = (const Pdserve__V1__PrefillRequest *)msg;
    const Pdserve__V1__KvDestination *d = req->dest;
    engine_t *e = pn->nc.ready ? compute_engine(pn->comp) : NULL;
    pjob_t *j;
    pd_status_t st = PD_OK;
    char why[200];

    if (!e || pn->nc.draining) {
        pd_grpc_call_finish_status(call, PD_ERR_UNAVAILABLE,
                                   pn->nc.draining ? "prefill node draining"
                                                   : "prefill node not ready");
        return;
    }
    const kv_layout_t *src = kv_pool_layout(engine_pool(e));
    if (!d || !d->layout || d->seq_id == 0 || req->n_token_ids == 0) {
        pd_grpc_call_finish_status(call, PD_ERR_INVALID,
                                   "prefill: tokens and a destination needed");
        return;
    }
    if (d->token.len != NODE_TOKEN_BYTES || d->lease_ms < 0 || d->lease_ms > 86400000) {
        pd_grpc_call_finish_status(call, PD_ERR_INVALID,
                                   "prefill: destination needs its 16-byte reservation token and "
                                   "a lease of 0..86400000 ms");
        return;
    }
    pd_kvfmt_t dfmt;
    /* this engine's pages hold n_kv_heads / tp heads per rank; the destination names the model's
     * KV heads and how many slices (its tp) a page travels as */
    const uint32_t dtp = d->layout->tp ? d->layout->tp : 1;
    if (pd_kvfmt_parse(d->layout->kv_format, &dfmt) != 0 ||
        (int)d->layout->n_layers != src->n_layers ||
        (int)d->layout->n_kv_heads != src->n_kv_heads * engine_tp(e) ||
        dtp > NODE_KV_DONE_SLICES_MAX || d->layout->n_kv_heads % dtp != 0 ||
        (int)d->layout->head_dim != src->head_dim ||
        (int)d->layout->page_tokens != src->page_tokens) {
        snprintf(why, sizeof why,
                 "prefill: destination kv layout does not match this model "
                 "(%u layers, %u kv heads in %u slices, %u head dim, %u page tokens, %s)",
                 d->layout->n_layers, d->layout->n_kv_heads, dtp, d->layout->head_dim,
                 d->layout->page_tokens, d->layout->kv_format);
        pd_grpc_call_finish_status(call, PD_ERR_INVALID, why);
        return;
    }
    if ((int)d->n_pages != kv_pool_pages_for(engine_pool(e), (int32_t)req->n_token_ids)) {
        pd_grpc_call_finish_status(call, PD_ERR_INVALID, "prefill: page count does not fit prompt");
        return;
    }
    j = calloc(1, sizeof *j);
    if (!j || !(j->tokens = malloc(req->n_token_ids * sizeof *j->tokens)) ||
        !(j->dst_pages = malloc(d->n_pages * sizeof *j->dst_pages))) {
        if (j)
            free(j->tokens);
        free(j);
        pd_grpc_call_finish_status(call, PD_ERR_NOMEM, NULL);
        return;
    }
    j->pn = pn;
    j->call = call;
    j->refs = 1;
    memcpy(j->token, d->token.data, NODE_TOKEN_BYTES);
    /* the decode node reserved the pages just before this call for the request's lease
     * (KvDestination.lease_ms; the cluster's transport.lease_ms when absent) and reuses them
     * once it ends: post puts only in its first three quarters, the last covers the reserve ->
     * prefill hop and the puts in flight */
    int64_t lease = d->lease_ms > 0 ? d->lease_ms : pn->nc.cfg->transport.lease_ms;
    j->write_deadline_ms = node_control_now_ms(&j->pn->nc) + lease - lease / 4;
    memcpy(j->tokens, req->token_ids, req->n_token_ids * sizeof *j->tokens);
    j->n_tokens = (int)req->n_token_ids;
    if (node_sampling_params(req->sampling, &j->gp, &j->gp_store) != PD_OK) {
        free(j->tokens);
        free(j->dst_pages);
        free(j);
        pd_grpc_call_finish_status(call, PD_ERR_NOMEM, NULL);
        return;
    }
    j->gp.max_tokens = 1;
    j->gp.n_generated = (int)req->n_generated;
    j->gp.sample_index = req->sample_index;
    /* samples beyond the router's limit are refused by it; bound the allocation here too */
    j->n_samples = req->n_samples > 1 ? (req->n_samples > 256 ? 256 : (int)req->n_samples) : 1;
    j->gp.n_samples = j->n_samples;
    kv_layout_t dfull;
    kv_layout_init_sides(&dfull, src->n_layers, (int)d->layout->n_kv_heads, src->head_dim,
                         src->n_sides, src->page_tokens, dfmt); /* n_sides 1: MLA latent */
    if (tp_kv_wire_layout(&dfull, (int)dtp, &j->dst_layout) != PD_OK ||
        j->dst_layout.page_bytes != d->layout->page_bytes) {
        free(j->tokens);
        free(j->dst_pages);
        free(j->gp_store);
        free(j);
        pd_grpc_call_finish_status(call, PD_ERR_INVALID, "prefill: destination page size differs");
        return;
    }
    for (size_t i = 0; i < d->n_pages; i++) {
        j->dst_pages[i].page = d->pages[i]->page;
        j->dst_pages[i].tag = d->pages[i]->tag;
    }
    j->n_dst_pages = (int)d->n_pages;
    j->seq_id = d->seq_id;
    snprintf(j->peer_key, sizeof j->peer_key, "%s:%u", d->ucx_host, d->ucx_port);
    /* (tensor-parallel pages go through host memory: no cuda ipc) */
    if (d->cuda_ipc.len == KV_CUDA_IPC_BLOB_BYTES && engine_tp(e) == 1 && dtp == 1) {
        memcpy(j->ipc_blob, d->cuda_ipc.data, KV_CUDA_IPC_BLOB_BYTES);
        j->has_ipc = 1;
    }
    j->peer = prefill__peer(pn, d, &st);
    if (!j->peer) {
        free(j->tokens);
        free(j->dst_pages);
        free(j->gp_store);
        free(j);
        snprintf(why, sizeof why, "%s: cannot reach decode node %s at %s:%u: %s", pn->nc.node->name,
                 d->node, d->ucx_host, d->ucx_port, pd_status_str(st));
        pd_grpc_call_finish_status(call, PD_ERR_UNAVAILABLE, why);
        return;
    }
    j->base = kv_transport_rkey_base(j->peer->rkey);
    j->firsts = calloc((size_t)j->n_samples, sizeof *j->firsts);
    if (j->gp.logprobs || j->gp.prompt_logprobs)
        j->lps = malloc(((size_t)j->n_samples + (size_t)j->n_tokens) * sizeof *j->lps);
    if (!j->firsts || ((j->gp.logprobs || j->gp.prompt_logprobs) && !j->lps)) {
        prefill__unref(j);
        pd_grpc_call_finish_status(call, PD_ERR_NOMEM, NULL);
        return;
    }
    pn->queued++;
    pd_grpc_call_set_cancel_cb(call, prefill__call_cancelled, j);
    if ((st = compute_submit(pn->comp, prefill__run, j)) != PD_OK) {
        pn->queued--;
        free(j->tokens);
        free(j->dst_pages);
        free(j->gp_store);
        free(j->firsts);
        free(j->lps);
        free(j);
        pd_grpc_call_finish_status(call, st, "prefill node not ready");
    }
}

static void prefill__rpc_stats(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    prefill_node_t *pn = user;
    Pdserve__V1__NodeStats m = PDSERVE__V1__NODE_STATS__INIT;
    node_control_operator_drain(&pn->nc, ((const Pdserve__V1__StatsRequest *)msg)->drain);
    node_stats_fill(&pn->nc.stats, pn->nc.node, &m);
    m.queued = (uint32_t)pn->queued;
    m.active = (uint32_t)pn->queued;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &m.base), NULL);
}

static const pd_grpc_method_fn prefill_handlers[2] = {prefill__rpc_prefill, prefill__rpc_stats};

static void prefill__ready(void *arg, pd_status_t st)
{
    prefill_node_t *pn = arg;
    if (st != PD_OK) {
        node_control_fail(&pn->nc, "model load failed", st);
        return;
    }
    node_control_ready(&pn->nc);
    pd_log_info("%s: serving (%s weights, %s kv)", pn->nc.node->name,
                pd_wfmt_name(pn->nc.node->weights), pd_kvfmt_name(pn->nc.node->kv));
}

pd_status_t prefill_node_create(uv_loop_t *loop, const cluster_config_t *cfg,
                                const cluster_node_t *node, const node_env_t *env,
                                prefill_node_t **pn_p)
{
    prefill_node_t *pn = calloc(1, sizeof *pn);
    engine_params_t ep;
    pd_status_t st;

    if (!pn)
        return PD_ERR_NOMEM;
    if ((st = node_control_init(&pn->nc, loop, cfg, node, &pdserve__v1__prefill__descriptor,
                                prefill_handlers, pn, env)) != PD_OK)
        goto err;
    const char *ipc_env = getenv("PDSERVE_KV_CUDA_IPC");
    pn->no_ipc = ipc_env && strcmp(ipc_env, "0") == 0;
    const char *ov_env = getenv("PDSERVE_KV_OVERLAP");
    pn->overlap = KV_OVERLAP_CHUNK;
    if (ov_env && (!strcmp(ov_env, "0") || !strcmp(ov_env, "none") || !strcmp(ov_env, "off")))
        pn->overlap = KV_OVERLAP_NONE;
    else if (ov_env && !strcmp(ov_env, "layer"))
        pn->overlap = KV_OVERLAP_LAYER;
    else if (ov_env && *ov_env && strcmp(ov_env, "1") && strcmp(ov_env, "chunk")) {
        pd_log_error("%s: PDSERVE_KV_OVERLAP=%s: expected chunk (1), layer or none (0)", node->name,
                     ov_env);
        st = PD_ERR_INVALID;
        goto err;
    }
    if (pn->no_ipc || pn->overlap != KV_OVERLAP_CHUNK)
        pd_log_info("%s: kv transfer:%s%s", node->name, pn->no_ipc ? " cuda ipc off" : "",
                    pn->overlap == KV_OVERLAP_NONE
                        ? " overlap off (pages leave after the whole prompt)"
                    : pn->overlap == KV_OVERLAP_LAYER ? " pages leave per layer (transfer stream)"
                                                      : "");
    node_engine_params(cfg, node, &ep);
    if ((st = compute_create(loop, &ep, prefill__ready, prefill__tick, 200, pn, &pn->comp)))
        goto err;
    pd_log_info("%s: loading %s on %s (control %s:%d)", node->name, cfg->model, ep.backend,
                node->host, pn->nc.port);
    *pn_p = pn;
    return PD_OK;
err:
    prefill_node_destroy(pn);
    return st;
}

int prefill_node_failed(const prefill_node_t *pn)
{
    return pn->nc.failed;
}

int prefill_node_port(const prefill_node_t *pn)
{
    return pn->nc.port;
}

void prefill_node_drain(prefill_node_t *pn)
{
    if (node_control_drain(&pn->nc))
        pd_log_info("%s: draining: no new prefills; %d running", pn->nc.node->name, pn->queued);
}

int prefill_node_busy(const prefill_node_t *pn)
{
    return pn->queued;
}

void prefill_node_destroy(prefill_node_t *pn)
{
    if (!pn)
        return;
    node_control_shutdown(&pn->nc);
    compute_destroy(pn->comp);
    pd_grpc_server_destroy(pn->nc.srv); /* cancels the calls while the node still exists */
    pn->nc.srv = NULL;
    while (pn->peers) {
        peer_t *p = pn->peers;
        pn->peers = p->next;
        kv_transport_rkey_destroy(p->rkey);
        kv_transport_ep_close(p->ep);
        free(p->rkey_bytes);
        free(p);
    }
    while (pn->ipc_peers) { /* the compute thread is gone: its mappings go now */
        ipc_peer_t *p = pn->ipc_peers;
        pn->ipc_peers = p->next;
        kv_cuda_ipc_close(p->map);
        free(p);
    }
    node_control_deinit(&pn->nc);
    free(pn);
}
