/* node: what the prefill and decode nodes share: engine parameters from the cluster file, the
 * stats snapshot the compute thread publishes and the loop thread serves (Stats rpc, /metrics),
 * and the KV-done message a prefill node sends a decode node over the transport.
 */
#ifndef PD_NODE_H
#define PD_NODE_H

#include <pthread.h>
#include <stdint.h>

#include "cluster_config.h"
#include "engine.h"
#include "grpc_health.h"
#include "grpc_server.h"
#include "kv_path.h"
#include "pdserve.pb-c.h"

/* Fills p from the cluster file's entry for node (model, backend, formats, budget, ...). */
void node_engine_params(const cluster_config_t *cfg, const cluster_node_t *node,
                        engine_params_t *p);

/* Checks before a node starts that its entry's tp can split the model (config.json in
 * cfg->model) with its weight format (tp_shard_check: heads, KV heads, FFN, vocab, int4 groups).
 * PD_OK for tp 1; PD_ERR_INVALID (logged, naming the node and what does not split). */
pd_status_t node_check_tp(const cluster_config_t *cfg, const cluster_node_t *node);

/* Kinds of KV integrity failure (pdserve_node_kv_integrity_failures_total{kind}): a page's tag
 * check before attention, the KV-done checksum over what landed, a KV-done presenting another
 * reservation's token, a KV-done whose tokens / pages differ from what was reserved. */
typedef enum {
    NODE_INTEGRITY_TAG = 0,
    NODE_INTEGRITY_CHECKSUM,
    NODE_INTEGRITY_TOKEN,
    NODE_INTEGRITY_SIZE,
    NODE_INTEGRITY__COUNT
} node_integrity_t;

/* Counters published by the compute thread, read by the loop thread. */
typedef struct {
    pthread_mutex_t mu;
    uint32_t active, queued, pages_total, pages_used;
    uint64_t integrity_failures, tokens, requests;
    /* KV transfer (kv_path.h): the path this node last used (prefill) or offers (decode), for
     * /health, and pages written per path (prefill; indexed by kv_path_t) for /metrics */
    char kv_path[16];
    uint64_t kv_pages_by_path[KV_PATH_COUNT];
    /* integrity failures by kind; TAG is derived at publish (tracker failures less CHECKSUM) */
    uint64_t integrity[NODE_INTEGRITY__COUNT];
    /* KV transfers that completed: prefill side, first put to the KV-done sent; decode side,
     * reservation to the KV-done accepted (node_stats_kv_transfer) */
    uint64_t kv_transfers, kv_bytes;
    double kv_seconds;
    /* prefill side (node_stats_prefill): prompts timed, seconds from the start of their compute
     * to the end of their last layer, and from there to the KV-done sent (the transfer's tail) */
    uint64_t prefill_timed;
    double prefill_compute_seconds, kv_tail_seconds;
    /* loop thread: the operator's drain as the router last told it (StatsRequest.drain,
     * node_control_operator_drain): no new work comes; 0 serving */
    int operator_drain;
} node_stats_t;

/* Any thread: counts one integrity failure of kind. */
void node_stats_integrity(node_stats_t *s, node_integrity_t kind);
/* Any thread: counts one completed KV transfer of bytes that took seconds. */
void node_stats_kv_transfer(node_stats_t *s, uint64_t bytes, double seconds);
/* Any thread: counts one prompt whose compute took compute_s and whose KV-done left tail_s after
 * its last layer computed. */
void node_stats_prefill(node_stats_t *s, double compute_s, double tail_s);

void node_stats_init(node_stats_t *s);
void node_stats_deinit(node_stats_t *s);
/* Compute thread: refreshes the pool and tracker numbers from e. */
void node_stats_publish(node_stats_t *s, engine_t *e, uint32_t queued);
/* The operator's drain of a copy of the stats: "none", "draining" (requests still run) or
 * "drained" (none: the node may be stopped). */
const char *node_stats_drain_str(const node_stats_t *s);
/* Loop thread: fills a NodeStats message. */
void node_stats_fill(node_stats_t *s, const cluster_node_t *node, Pdserve__V1__NodeStats *m);

/* KV done (active message NODE_AM_KV_DONE, header = a packed pdserve.v1.KvDone): the prefill
 * node has written and flushed every page of reservation seq_id. The decode node trusts nothing
 * in it before node_kv_done_unpack() has checked it, and then checks it against the reservation.
 * Pack and unpack keep no state (any thread). */
#define NODE_AM_KV_DONE 1
/* The same message when the pages were written straight into the decode node's GPU pool with
 * CUDA IPC (KvDestination.cuda_ipc), not into its host landing zone. A separate id, not a field,
 * so that a cut message can never turn one into the other. */
#define NODE_AM_KV_DONE_DIRECT 2
/* Largest KvDone a receiver accepts (a transport header holds up to KV_TRANSPORT_AM_HEADER_MAX). */
#define NODE_KV_DONE_MAX 256
/* Bytes of a reservation token (KvDestination.token: unguessable, from getrandom). */
#define NODE_TOKEN_BYTES 16
/* Most slice checksums a KvDone carries (a decode node of TP up to 16; the message must fit
 * NODE_KV_DONE_MAX). */
#define NODE_KV_DONE_SLICES_MAX 16
typedef struct {
    uint64_t seq_id;     /* the decode node's reservation id, >= 1 */
    int32_t first_token; /* the token sampled after the prompt, >= 0 */
    uint32_t n_tokens;   /* tokens whose KV was written, 1..INT32_MAX */
    uint32_t n_pages;    /* pages written, 1..n_tokens */
    int aborted;         /* the writer stopped early (cancelled): it writes nothing more */
    uint64_t checksum;   /* over the pages' bytes as sent (node_pages_checksum); a destination
                            of TP 1 */
    uint8_t token[NODE_TOKEN_BYTES]; /* the reservation's token */
    /* a destination of TP d > 1: n_slices = d (2..NODE_KV_DONE_SLICES_MAX) checksums, slice r's
     * over rank r's slice of every page as sent (tp_kv_slice_checksum); 0 otherwise */
    int n_slices;
    uint64_t slice_sums[NODE_KV_DONE_SLICES_MAX];
} node_kv_done_t;

/* A fresh reservation token (getrandom). PD_ERR_IO when the kernel gives no randomness. */
pd_status_t node_token_new(uint8_t token_out[NODE_TOKEN_BYTES]);

/* The KV-done checksum (kv_digest.h: the chain of the pages' digests) over n_pages pages of
 * page_bytes each in host memory, page i at base + pages[i] * page_bytes (the decode node's pool)
 * or, with pages NULL, packed at base (the prefill node's staging). Chained by seed: checksum of
 * pages [0, k) is the seed of [k, n). */
uint64_t node_pages_checksum(uint64_t seed, const uint8_t *base, const int32_t *pages, int n_pages,
                             size_t page_bytes);

/* The same checksum over pages in be's memory (a GPU pool, or pages exported on the GPU): the
 * digests are computed by be (page_digest), only they come to the host. *sum_p written on
 * PD_OK; PD_ERR_NOMEM, or be's failure (logged) otherwise. */
pd_status_t node_pages_checksum_be(pd_backend_t *be, uint64_t seed, const void *base,
                                   const int32_t *pages, int n_pages, size_t page_bytes,
                                   uint64_t *sum_p);

/* Packs m as a pdserve.v1.KvDone into buf (cap bytes); *len_p: its length. PD_ERR_INVALID (logged)
 * when a field is out of the ranges above (the receiver would drop it) or cap is too small;
 * nothing is written to *len_p then. */
pd_status_t node_kv_done_pack(const node_kv_done_t *m, uint8_t *buf, size_t cap, size_t *len_p);

/* Decodes a KvDone received from another node and checks every field's range. Returns
 * PD_ERR_FORMAT (logged with who as context) for a message that is empty, truncated, malformed,
 * longer than NODE_KV_DONE_MAX or out of range; *m_p is written only on success. buf may be NULL
 * when len is 0. */
pd_status_t node_kv_done_unpack(const void *buf, size_t len, const char *who, node_kv_done_t *m_p);

/* Reads cfg's transport.cluster_token_file (none: PD_OK, the control port stays open) for
 * node_serve: then every method but grpc.health.v1 wants "authorization: Bearer TOKEN" (the
 * router sends it; a stray client gets UNAUTHENTICATED, logged). One token per process; main()
 * calls it before the node is created. PD_ERR_IO / PD_ERR_FORMAT (logged). */
pd_status_t node_cluster_token_load(const cluster_config_t *cfg);

/* Starts a node's control server on node->host:port: the service desc with handlers (user as
 * their argument) and grpc.health.v1.Health, NOT_SERVING for "" and desc's full name until
 * node_set_serving(). On error nothing is left running. PD_ERR_IO (port), PD_ERR_NOMEM. */
pd_status_t node_serve(uv_loop_t *loop, const cluster_node_t *node,
                       const ProtobufCServiceDescriptor *desc, const pd_grpc_method_fn *handlers,
                       void *user, pd_grpc_server_t **srv_p, pd_grpc_health_t **health_p,
                       int *port_p);

/* Marks the node (and desc's service) SERVING or NOT_SERVING in its health service (and tells
 * systemd: READY=1 the first time it serves, STATUS= after; notify.h). */
void node_set_serving(pd_grpc_health_t *health, const ProtobufCServiceDescriptor *desc,
                      int serving);

/* The node's ops endpoint on node->http_port (0: none): GET /live (the process answers),
 * /ready and /health (200 while health says SERVING, else 503; JSON with the node's counters),
 * /metrics (Prometheus text of stats: requests running / waiting, KV pages used / capacity,
 * integrity failures, tokens, requests; the pdserve_listener_* counters of the control server
 * grpc (may be NULL) and of this endpoint). Loop thread; health, grpc and stats are borrowed. */
typedef struct node_http node_http_t;

/* PD_OK with *h_p NULL when node->http_port is 0; PD_ERR_UNAVAILABLE / PD_ERR_IO (port) or
 * PD_ERR_NOMEM, nothing left open. */
pd_status_t node_http_create(uv_loop_t *loop, const cluster_node_t *node,
                             const pd_grpc_health_t *health, const pd_grpc_server_t *grpc,
                             node_stats_t *stats, node_http_t **h_p);
void node_http_destroy(node_http_t *h);

#endif
