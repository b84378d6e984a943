#include "node.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include <stdlib.h>
#include <time.h>

#include <jansson.h>

#include "health.pb-c.h"
#include "http.h"
#include "metrics.h"
#include "kv_digest.h"
#include "kv_tracker.h"
#include "kv_transport.h"
#include "grpc_wire.h"
#include "log.h"
#include "notify.h"
#include "tp_shard.h"

_Static_assert(NODE_KV_DONE_MAX <= KV_TRANSPORT_AM_HEADER_MAX, "a KvDone fits a transport header");

void node_engine_params(const cluster_config_t *cfg, const cluster_node_t *node, engine_params_t *p)
{
    engine_params_default(p);
    p->model_dir = cfg->model;
    p->backend = node->backend == CLUSTER_BACKEND_CUDA ? "cuda" : "cpu";
    p->device = node->device;
    p->threads = node->threads;
    snprintf(p->backend_options, sizeof p->backend_options, "%s", node->backend_options);
    p->wfmt = node->weights;
    p->kvfmt = node->kv;
    p->page_tokens = node->page_tokens;
    p->kv_budget = node->kv_budget;
    p->max_batch = node->max_batch;
    p->prefill_chunk = node->prefill_chunk;
    p->tracker = node->tracker == CLUSTER_TRACKER_NOOP ? KV_TRACKER_NOOP : KV_TRACKER_TAGGED;
    p->evict_on_preempt = node->role == CLUSTER_ROLE_DECODE;
    p->tp = node->tp;
}

pd_status_t node_check_tp(const cluster_config_t *cfg, const cluster_node_t *node)
{
    char path[CLUSTER_PATH_MAX + 16];
    hf_config_t hf;
    engine_params_t ep;
    pd_status_t st;
    if (node->tp <= 1)
        return PD_OK;
    node_engine_params(cfg, node, &ep);
    snprintf(path, sizeof path, "%s/config.json", cfg->model);
    if ((st = hf_config_load(path, &hf)) != PD_OK ||
        (st = tp_shard_check(&hf, ep.wfmt, ep.lm_head_fmt, node->tp)) != PD_OK) {
        pd_log_error("%s: node '%s': tp %d cannot run %s with %s weights (above)", cfg->source,
                     node->name, node->tp, cfg->model, pd_wfmt_name(ep.wfmt));
        return PD_ERR_INVALID;
    }
    return PD_OK;
}

void node_stats_init(node_stats_t *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
}

void node_stats_deinit(node_stats_t *s)
{
    pthread_mutex_destroy(&s->mu);
}

void node_stats_publish(node_stats_t *s, engine_t *e, uint32_t queued)
{
    kv_pool_t *pool = engine_pool(e);
    pthread_mutex_lock(&s->mu);
    s->active = (uint32_t)engine_active(e);
    s->queued = queued;
    s->pages_total = (uint32_t)kv_pool_n_pages(pool);
    s->pages_used = (uint32_t)kv_pool_used_pages(pool);
    s->integrity_failures = engine_tracker(e)->failures;
    /* the tracker also counts the decode node's checksum failures (they fail a sequence too) */
    s->integrity[NODE_INTEGRITY_TAG] =
        s->integrity_failures > s->integrity[NODE_INTEGRITY_CHECKSUM]
            ? s->integrity_failures - s->integrity[NODE_INTEGRITY_CHECKSUM]
            : 0;
    pthread_mutex_unlock(&s->mu);
}

void node_stats_integrity(node_stats_t *s, node_integrity_t kind)
{
    pthread_mutex_lock(&s->mu);
    s->integrity[kind]++;
    pthread_mutex_unlock(&s->mu);
}

void node_stats_kv_transfer(node_stats_t *s, uint64_t bytes, double seconds)
{
    pthread_mutex_lock(&s->mu);
    s->kv_transfers++;
    s->kv_bytes += bytes;
    s->kv_seconds += seconds > 0 ? seconds : 0;
    pthread_mutex_unlock(&s->mu);
}

void node_stats_prefill(node_stats_t *s, double compute_s, double tail_s)
{
    pthread_mutex_lock(&s->mu);
    s->prefill_timed++;
    s->prefill_compute_seconds += compute_s > 0 ? compute_s : 0;
    s->kv_tail_seconds += tail_s > 0 ? tail_s : 0;
    pthread_mutex_unlock(&s->mu);
}

const char *node_stats_drain_str(const node_stats_t *s)
{
    if (!s->operator_drain)
        return "none";
    return s->active == 0 && s->queued == 0 ? "drained" : "draining";
}

void node_stats_fill(node_stats_t *s, const cluster_node_t *node, Pdserve__V1__NodeStats *m)
{
    pthread_mutex_lock(&s->mu);
    m->active = s->active;
    m->queued = s->queued;
    m->pages_total = s->pages_total;
    m->pages_used = s->pages_used;
    m->integrity_failures = s->integrity_failures;
    m->tokens = s->tokens;
    m->requests = s->requests;
    m->operator_drain = s->operator_drain != 0;
    pthread_mutex_unlock(&s->mu);
    m->node = (char *)node->name;
    m->role = (char *)cluster_config_role_str(node->role);
    m->weights = (char *)pd_wfmt_name(node->weights);
    m->kv = (char *)pd_kvfmt_name(node->kv);
    m->tp = (uint32_t)node->tp;
}

/* The process's cluster token (node_cluster_token_load), "" when the ports are open. */
static char node__token[256];

pd_status_t node_cluster_token_load(const cluster_config_t *cfg)
{
    node__token[0] = 0;
    if (!cfg->transport.cluster_token_file[0])
        return PD_OK;
    return cluster_config_read_token(cfg->transport.cluster_token_file, node__token,
                                     sizeof node__token);
}

/* Every method but grpc.health.v1 wants "authorization: Bearer TOKEN". */
static int node__auth(const pd_grpc_call_t *call, const char *path, void *arg, const char **why_p)
{
    const char *v = pd_grpc_call_metadata(call, "authorization");
    (void)arg;
    if (strncmp(path, "/grpc.health.v1.", 16) == 0)
        return 0;
    if (v && strncmp(v, "Bearer ", 7) == 0) {
        const char *t = v + 7;
        size_t lt = strlen(t), lk = strlen(node__token), n = lt > lk ? lt : lk;
        unsigned diff = (unsigned)(lt ^ lk);
        for (size_t i = 0; i < n; i++) /* constant time */
            diff |= (unsigned)((i < lt ? (unsigned char)t[i] : 0) ^
                               (i < lk ? (unsigned char)node__token[i] : 0));
        if (!diff)
            return 0;
    }
    pd_log_warn("%s: refused: %s cluster token", path, v ? "wrong" : "no");
    *why_p = "this node wants the cluster token (authorization: Bearer TOKEN)";
    return PD_GRPC_UNAUTHENTICATED;
}

pd_status_t node_serve(uv_loop_t *loop, const cluster_node_t *node,
                       const ProtobufCServiceDescriptor *desc, const pd_grpc_method_fn *handlers,
                       void *user, pd_grpc_server_t **srv_p, pd_grpc_health_t **health_p,
                       int *port_p)
{
    pd_grpc_server_t *srv = NULL;
    pd_grpc_health_t *health = NULL;
    pd_status_t st;

    if ((st = pd_grpc_server_create(loop, NULL, &srv)) != PD_OK)
        return st;
    if ((st = pd_grpc_server_add_service(srv, desc, handlers, user)) != PD_OK ||
        (st = pd_grpc_health_create(srv, &health)) != PD_OK)
        goto err;
    node_set_serving(health, desc, 0);
    if (node__token[0])
        pd_grpc_server_set_auth(srv, node__auth, NULL);
    if ((st = pd_grpc_server_listen(srv, node->host, node->port, port_p)) != PD_OK)
        goto err;
    *srv_p = srv;
    *health_p = health;
    return PD_OK;
err:
    pd_grpc_server_destroy(srv);
    pd_grpc_health_destroy(health);
    return st;
}

void node_set_serving(pd_grpc_health_t *health, const ProtobufCServiceDescriptor *desc, int serving)
{
    int v = serving ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                    : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    pd_grpc_health_set(health, "", v);
    pd_grpc_health_set(health, desc->name, v);
    if (serving) /* systemd Type=notify: READY=1 the first time */
        pd_notify_ready("serving");
    else
        pd_notify_status("not serving");
}

/* ==== KV done ==== */

/* Why m cannot be a KvDone, or NULL when it can. */
static const char *node__kv_done_bad(const node_kv_done_t *m)
{
    if (m->seq_id == 0)
        return "seq_id 0";
    if (m->first_token < 0)
        return "negative first_token";
    if (m->n_tokens == 0 || m->n_tokens > INT32_MAX)
        return "n_tokens out of range";
    if (m->n_pages == 0 || m->n_pages > m->n_tokens)
        return "n_pages out of range";
    if (m->n_slices < 0 || m->n_slices == 1 || m->n_slices > NODE_KV_DONE_SLICES_MAX)
        return "slice checksums: not 0 or 2..16";
    return NULL;
}

pd_status_t node_token_new(uint8_t token_out[NODE_TOKEN_BYTES])
{
    size_t got = 0;
    while (got < NODE_TOKEN_BYTES) {
        ssize_t n = getrandom(token_out + got, NODE_TOKEN_BYTES - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            pd_log_error("getrandom: %s", strerror(errno));
            return PD_ERR_IO;
        }
        got += (size_t)n;
    }
    return PD_OK;
}

uint64_t node_pages_checksum(uint64_t seed, const uint8_t *base, const int32_t *pages, int n_pages,
                             size_t page_bytes)
{
    return kv_digest_pages(seed, base, pages, n_pages, page_bytes, page_bytes);
}

pd_status_t node_pages_checksum_be(pd_backend_t *be, uint64_t seed, const void *base,
                                   const int32_t *pages, int n_pages, size_t page_bytes,
                                   uint64_t *sum_p)
{
    uint64_t *d = malloc((size_t)(n_pages > 0 ? n_pages : 1) * sizeof *d);
    pd_status_t st;
    if (!d)
        return PD_ERR_NOMEM;
    st = be->ops->page_digest(be, d, base, page_bytes, pages, n_pages);
    if (st == PD_OK)
        *sum_p = kv_digest_chain(seed, d, n_pages);
    else
        pd_log_error("kv checksum of %d pages on the %s backend: %s", n_pages, be->ops->name,
                     pd_status_str(st));
    free(d);
    return st;
}

pd_status_t node_kv_done_pack(const node_kv_done_t *m, uint8_t *buf, size_t cap, size_t *len_p)
{
    Pdserve__V1__KvDone pb = PDSERVE__V1__KV_DONE__INIT;
    const char *bad = node__kv_done_bad(m);
    size_t len;

    if (bad) {
        pd_log_error("kv done for seq %llu: %s", (unsigned long long)m->seq_id, bad);
        return PD_ERR_INVALID;
    }
    pb.seq_id = m->seq_id;
    pb.first_token = m->first_token;
    pb.n_tokens = m->n_tokens;
    pb.n_pages = m->n_pages;
    pb.aborted = m->aborted != 0;
    pb.checksum = m->checksum;
    pb.n_slice_checksums = (size_t)m->n_slices;
    pb.slice_checksums = (uint64_t *)m->slice_sums;
    pb.token.data = (uint8_t *)m->token;
    pb.token.len = NODE_TOKEN_BYTES;
    len = pdserve__v1__kv_done__get_packed_size(&pb);
    if (len > cap || len > NODE_KV_DONE_MAX) {
        pd_log_error("kv done for seq %llu: %zu bytes do not fit %zu",
                     (unsigned long long)m->seq_id, len, cap);
        return PD_ERR_INVALID;
    }
    *len_p = pdserve__v1__kv_done__pack(&pb, buf);
    return PD_OK;
}

pd_status_t node_kv_done_unpack(const void *buf, size_t len, const char *who, node_kv_done_t *m_p)
{
    Pdserve__V1__KvDone *pb;
    node_kv_done_t m;
    const char *bad;

    if (len > NODE_KV_DONE_MAX) {
        pd_log_error("%s: kv done of %zu bytes (at most %d): dropped", who, len, NODE_KV_DONE_MAX);
        return PD_ERR_FORMAT;
    }
    pb = pdserve__v1__kv_done__unpack(NULL, len, len ? buf : (const uint8_t *)"");
    if (!pb) {
        pd_log_error("%s: kv done of %zu bytes: malformed or truncated: dropped", who, len);
        return PD_ERR_FORMAT;
    }
    m.seq_id = pb->seq_id;
    m.first_token = pb->first_token;
    m.n_tokens = pb->n_tokens;
    m.n_pages = pb->n_pages;
    m.aborted = pb->aborted;
    m.checksum = pb->checksum;
    bad = NULL;
    m.n_slices = 0;
    if (pb->token.len != NODE_TOKEN_BYTES)
        bad = "token missing or not 16 bytes";
    else
        memcpy(m.token, pb->token.data, NODE_TOKEN_BYTES);
    if (!bad && (pb->n_slice_checksums == 1 || pb->n_slice_checksums > NODE_KV_DONE_SLICES_MAX))
        bad = "slice checksums: not 0 or 2..16";
    else if (!bad) {
        m.n_slices = (int)pb->n_slice_checksums;
        if (m.n_slices > 0)
            memcpy(m.slice_sums, pb->slice_checksums, (size_t)m.n_slices * sizeof(uint64_t));
    }
    pdserve__v1__kv_done__free_unpacked(pb, NULL);
    if (bad || (bad = node__kv_done_bad(&m))) {
        pd_log_error("%s: kv done for seq %llu: %s: dropped", who, (unsigned long long)m.seq_id,
                     bad);
        return PD_ERR_FORMAT;
    }
    *m_p = m;
    return PD_OK;
}

/* ==== the ops endpoint ==== */

struct node_http {
    const cluster_node_t *node;
    const pd_grpc_health_t *health;
    const pd_grpc_server_t *grpc; /* the control server (its listener counters) */
    node_stats_t *stats;
    pd_http_server_t *srv;
    metrics_t *metrics;
};

static int node_http__serving(const node_http_t *h)
{
    return pd_grpc_health_get(h->health, "") == PD_GRPC_HEALTH_SERVING;
}

static void node_http__live(pd_http_request_t *req, void *user)
{
    (void)user;
    pd_http_respond_json(req, 200, json_pack("{s:s}", "status", "alive"));
}

static void node_http__ready(pd_http_request_t *req, void *user)
{
    node_http_t *h = user;
    node_stats_t st;
    int serving = node_http__serving(h);
    pthread_mutex_lock(&h->stats->mu);
    st = *h->stats;
    pthread_mutex_unlock(&h->stats->mu);
    pd_http_respond_json(
        req, serving ? 200 : 503,
        json_pack("{s:s,s:s,s:s,s:i,s:i,s:I,s:I,s:s,s:i,s:s}", "status",
                  serving ? "ready" : "not ready", "node", h->node->name, "role",
                  cluster_config_role_str(h->node->role), "active", (int)st.active, "waiting",
                  (int)st.queued, "kv_pages_used", (json_int_t)st.pages_used, "kv_pages_capacity",
                  (json_int_t)st.pages_total, "kv_path", st.kv_path[0] ? st.kv_path : "none", "tp",
                  h->node->tp, "drain", node_stats_drain_str(&st)));
}

/* The listener counters of the control server and of this endpoint (pdserve_listener_*, as
 * the router exports its own). */
static void node_http__listeners(node_http_t *h)
{
    const char *grpc_labels[] = {"node", h->node->name, "listener", "grpc", NULL};
    const char *http_labels[] = {"node", h->node->name, "listener", "http", NULL};
    pd_grpc_server_stats_t gs;
    pd_http_server_stats_t hs;
    metrics_listener_t l;
    if (h->grpc) {
        pd_grpc_server_stats(h->grpc, &gs);
        l = (metrics_listener_t){gs.connections,   gs.max_connections, gs.rejected_connections,
                                 gs.accept_errors, gs.idle_closed,     gs.request_timeouts,
                                 gs.flood_closed};
        metrics_listener_put(h->metrics, grpc_labels, &l);
    }
    pd_http_server_stats(h->srv, &hs);
    l = (metrics_listener_t){hs.connections,
                             hs.max_connections,
                             hs.rejected_connections,
                             hs.accept_errors,
                             hs.idle_closed,
                             hs.timed_out,
                             0};
    metrics_listener_put(h->metrics, http_labels, &l);
}

static void node_http__metrics(pd_http_request_t *req, void *user)
{
    node_http_t *h = user;
    const char *labels[] = {"node", h->node->name, "role", cluster_config_role_str(h->node->role),
                            NULL};
    node_stats_t st;
    char *text;
    size_t len;
    pthread_mutex_lock(&h->stats->mu);
    st = *h->stats;
    pthread_mutex_unlock(&h->stats->mu);
    metrics_gauge_put(h->metrics, "pdserve_node_up", "1 while the node serves", labels,
                      node_http__serving(h));
    metrics_gauge_put(h->metrics, "pdserve_node_requests_running", "sequences running on the node",
                      labels, st.active);
    metrics_gauge_put(h->metrics, "pdserve_node_requests_waiting",
                      "requests waiting on the node (reservations, queued prefills)", labels,
                      st.queued);
    metrics_gauge_put(h->metrics, "pdserve_node_kv_pages_used", "kv pages in use", labels,
                      st.pages_used);
    metrics_gauge_put(h->metrics, "pdserve_node_kv_pages_capacity", "kv pages of the node", labels,
                      st.pages_total);
    metrics_counter_put_total(h->metrics, "pdserve_node_integrity_failures_total",
                              "sequences failed by the kv integrity checks (tags, checksums)",
                              labels, st.integrity_failures);
    static const char *const kinds[NODE_INTEGRITY__COUNT] = {"tag", "checksum", "token", "size"};
    for (int k = 0; k < NODE_INTEGRITY__COUNT; k++) {
        const char *kl[] = {"node", h->node->name, "role", cluster_config_role_str(h->node->role),
                            "kind", kinds[k],      NULL};
        metrics_counter_put_total(h->metrics, "pdserve_node_kv_integrity_failures_total",
                                  "kv integrity failures by kind: page tag check, KV-done "
                                  "checksum, reservation token, KV-done size",
                                  kl, st.integrity[k]);
    }
    metrics_counter_put_total(h->metrics, "pdserve_node_kv_transfers_total",
                              "kv transfers completed (prefill: sent, decode: accepted)", labels,
                              st.kv_transfers);
    metrics_counter_put_total(h->metrics, "pdserve_node_kv_transfer_bytes_total",
                              "kv page bytes of the completed transfers", labels, st.kv_bytes);
    metrics_counter_t *secs;
    if (metrics_counter_register(h->metrics, "pdserve_node_kv_transfer_seconds_total",
                                 "seconds the completed kv transfers took (prefill: first put to "
                                 "KV-done sent; decode: reservation to KV-done accepted)",
                                 labels, &secs) == PD_OK &&
        st.kv_seconds > metrics_counter_value(secs))
        metrics_counter_add(secs, st.kv_seconds - metrics_counter_value(secs));
    if (st.prefill_timed) { /* prefill nodes: where a prompt's time goes */
        metrics_counter_put_total(h->metrics, "pdserve_node_prefill_timed_total",
                                  "prompts timed by the two counters below", labels,
                                  st.prefill_timed);
        static const char *const pn[2] = {"pdserve_node_prefill_compute_seconds_total",
                                          "pdserve_node_kv_tail_seconds_total"};
        static const char *const ph[2] = {
            "seconds from a prompt's compute start to the end of its last layer",
            "seconds from the end of a prompt's last layer to its KV-done sent"};
        const double pv[2] = {st.prefill_compute_seconds, st.kv_tail_seconds};
        for (int k = 0; k < 2; k++)
            if (metrics_counter_register(h->metrics, pn[k], ph[k], labels, &secs) == PD_OK &&
                pv[k] > metrics_counter_value(secs))
                metrics_counter_add(secs, pv[k] - metrics_counter_value(secs));
    }
    metrics_counter_put_total(h->metrics, "pdserve_node_tokens_total", "tokens processed", labels,
                              st.tokens);
    metrics_counter_put_total(h->metrics, "pdserve_node_requests_total", "requests served", labels,
                              st.requests);
    for (int p = 0; p < KV_PATH_COUNT; p++) {
        const char *pl[] = {"node", h->node->name,
                            "role", cluster_config_role_str(h->node->role),
                            "path", kv_path_name((kv_path_t)p),
                            NULL};
        metrics_counter_put_total(h->metrics, "pdserve_node_kv_pages_written_total",
                                  "kv pages written to decode nodes, by transfer path", pl,
                                  st.kv_pages_by_path[p]);
        metrics_gauge_put(h->metrics, "pdserve_node_kv_path",
                          "1 for the kv transfer path in use (prefill: last used; decode: best "
                          "offered)",
                          pl, strcmp(st.kv_path, kv_path_name((kv_path_t)p)) == 0);
    }
    node_http__listeners(h);
    if (metrics_render(h->metrics, &text, &len) != PD_OK) {
        pd_http_respond_error(req, PD_ERR_NOMEM, "metrics");
        return;
    }
    pd_http_respond(req, 200, "text/plain; version=0.0.4", text, len);
    free(text);
}

pd_status_t node_http_create(uv_loop_t *loop, const cluster_node_t *node,
                             const pd_grpc_health_t *health, const pd_grpc_server_t *grpc,
                             node_stats_t *stats, node_http_t **h_p)
{
    node_http_t *h;
    pd_status_t st;
    int port;

    if (node->http_port <= 0) {
        *h_p = NULL;
        return PD_OK;
    }
    if (!(h = calloc(1, sizeof *h)))
        return PD_ERR_NOMEM;
    h->node = node;
    h->health = health;
    h->grpc = grpc;
    h->stats = stats;
    if ((st = metrics_create(&h->metrics)) != PD_OK ||
        (st = pd_http_server_create(loop, NULL, &h->srv)) != PD_OK)
        goto err;
    if ((st = pd_http_server_route(h->srv, "GET", "/live", node_http__live, h)) != PD_OK ||
        (st = pd_http_server_route(h->srv, "GET", "/ready", node_http__ready, h)) != PD_OK ||
        (st = pd_http_server_route(h->srv, "GET", "/health", node_http__ready, h)) != PD_OK ||
        (st = pd_http_server_route(h->srv, "GET", "/metrics", node_http__metrics, h)) != PD_OK ||
        (st = pd_http_server_listen(h->srv, node->host, node->http_port, &port)) != PD_OK)
        goto err;
    pd_log_info("%s: ops endpoint on http://%s:%d (/live /ready /health /metrics)", node->name,
                node->host, port);
    *h_p = h;
    return PD_OK;
err:
    node_http_destroy(h);
    return st;
}

void node_http_destroy(node_http_t *h)
{
    if (!h)
        return;
    pd_http_server_destroy(h->srv);
    metrics_destroy(h->metrics);
    free(h);
}
