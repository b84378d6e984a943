#include "cluster_config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>
#include <yaml.h>

#include "hf_config.h"
#include "log.h"

/* ==== enum spellings ==== */

static const char *const cluster_config__roles[] = {"prefill", "decode", NULL};
static const char *const cluster_config__backends[] = {"cpu", "cuda", NULL};
static const char *const cluster_config__trackers[] = {"tagged", "noop", NULL};
static const char *const cluster_config__bools[] = {"false", "true", NULL};
static const char *const cluster_config__prefill_policies[] = {"round_robin", "least_load", NULL};
static const char *const cluster_config__decode_policies[] = {"least_kv", NULL};

static const char *cluster_config__name(const char *const *names, int v)
{
    for (int i = 0; names[i]; i++)
        if (i == v)
            return names[i];
    return "?";
}

const char *cluster_config_role_str(cluster_role_t v)
{
    return cluster_config__name(cluster_config__roles, (int)v);
}
const char *cluster_config_backend_str(cluster_backend_t v)
{
    return cluster_config__name(cluster_config__backends, (int)v);
}
const char *cluster_config_tracker_str(cluster_tracker_t v)
{
    return cluster_config__name(cluster_config__trackers, (int)v);
}
const char *cluster_config_prefill_policy_str(cluster_prefill_policy_t v)
{
    return cluster_config__name(cluster_config__prefill_policies, (int)v);
}
const char *cluster_config_decode_policy_str(cluster_decode_policy_t v)
{
    return cluster_config__name(cluster_config__decode_policies, (int)v);
}

/* ==== error reporting ==== */

/* Where an error is: a YAML mark, or nothing (overrides: the message starts with ctx->source). */
typedef struct {
    int set;
    size_t line, col; /* 0-based, as libyaml reports them */
} cluster_config__mark_t;

typedef struct {
    const char *source; /* file name, or "--set" for overrides */
    char *err;
    size_t err_len;
} cluster_config__ctx_t;

__attribute__((format(printf, 4, 5))) static pd_status_t
cluster_config__fail(cluster_config__ctx_t *c, const cluster_config__mark_t *m, const char *path,
                     const char *fmt, ...)
{
    char msg[768], line[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m && m->set)
        snprintf(line, sizeof line, "%s:%zu:%zu: %s%s%s", c->source, m->line + 1, m->col + 1,
                 path ? path : "", path ? ": " : "", msg);
    else
        snprintf(line, sizeof line, "%s %s%s%s", c->source, path ? path : "", path ? ": " : "",
                 msg);
    pd_log_error("%s", line);
    if (c->err && c->err_len)
        snprintf(c->err, c->err_len, "%s", line);
    return PD_ERR_FORMAT;
}

static cluster_config__mark_t cluster_config__mark(const yaml_node_t *n)
{
    cluster_config__mark_t m = {1, n->start_mark.line, n->start_mark.column};
    return m;
}

/* ==== field tables ==== */

typedef enum { F_STR, F_INT, F_INT64, F_BYTES, F_ENUM, F_HOSTPORT } cluster_config__ftype_t;

typedef struct {
    const char *key;
    cluster_config__ftype_t type;
    size_t off;  /* F_HOSTPORT: host; others: the value */
    size_t off2; /* F_HOSTPORT: port */
    size_t size; /* F_STR, F_HOSTPORT: capacity of the string */
    int64_t min, max;
    const char *const *names; /* F_ENUM */
    int required;
} cluster_config__field_t;

#define NODE_F(k, t, member, mn, mx, nm, req)                                                      \
    {                                                                                              \
        k, t, offsetof(cluster_node_t, member), 0, sizeof(((cluster_node_t *)0)->member), mn, mx,  \
            nm, req                                                                                \
    }

enum {
    NF_NAME = 0,
    NF_ROLE,
    NF_HOST,
    NF_PORT,
    NF_UCX_PORT,
    NF_HTTP_PORT,
    NF_BACKEND,
    NF_DEVICE,
    NF_WEIGHTS,
    NF_KV,
    NF_PAGE_TOKENS,
    NF_KV_BUDGET,
    NF_MAX_BATCH,
    NF_PREFILL_CHUNK,
    NF_TRACKER,
    NF_THREADS,
    NF_TP,
    NF_BACKEND_OPTIONS,
    NF_TEMPLATE,
    NF__COUNT
};

static const cluster_config__field_t cluster_config__node_fields[NF__COUNT] = {
    [NF_NAME] = NODE_F("name", F_STR, name, 0, 0, NULL, 1),
    [NF_ROLE] = NODE_F("role", F_ENUM, role, 0, 0, cluster_config__roles, 1),
    [NF_HOST] = NODE_F("host", F_STR, host, 0, 0, NULL, 1),
    [NF_PORT] = NODE_F("port", F_INT, port, 1, 65535, NULL, 1),
    [NF_UCX_PORT] = NODE_F("ucx_port", F_INT, ucx_port, 0, 65535, NULL, 0),
    [NF_HTTP_PORT] = NODE_F("http_port", F_INT, http_port, 0, 65535, NULL, 0),
    [NF_BACKEND] = NODE_F("backend", F_ENUM, backend, 0, 0, cluster_config__backends, 0),
    [NF_DEVICE] = NODE_F("device", F_INT, device, 0, 1023, NULL, 0),
    [NF_WEIGHTS] = NODE_F("weights", F_ENUM, weights, 0, 0, pd_wfmt_names, 0),
    [NF_KV] = NODE_F("kv", F_ENUM, kv, 0, 0, pd_kvfmt_names, 0),
    [NF_PAGE_TOKENS] = NODE_F("page_tokens", F_INT, page_tokens, 1, 1024, NULL, 0),
    [NF_KV_BUDGET] = NODE_F("kv_budget", F_BYTES, kv_budget, 1, INT64_MAX, NULL, 0),
    [NF_MAX_BATCH] = NODE_F("max_batch", F_INT, max_batch, 1, 65536, NULL, 0),
    [NF_PREFILL_CHUNK] = NODE_F("prefill_chunk", F_INT, prefill_chunk, 1, 1 << 20, NULL, 0),
    [NF_TRACKER] = NODE_F("tracker", F_ENUM, tracker, 0, 0, cluster_config__trackers, 0),
    [NF_THREADS] = NODE_F("threads", F_INT, threads, 0, 4096, NULL, 0),
    [NF_TP] = NODE_F("tp", F_INT, tp, 1, 16, NULL, 0), /* KvDone carries <= 16 slice checksums */
    [NF_BACKEND_OPTIONS] = NODE_F("backend_options", F_STR, backend_options, 0, 0, NULL, 0),
    [NF_TEMPLATE] = NODE_F("template", F_ENUM, template_, 0, 0, cluster_config__bools, 0),
};

#define ROUTER_F(k, t, member, mn, mx, nm, req)                                                    \
    {                                                                                              \
        k, t, offsetof(cluster_router_t, member), 0, sizeof(((cluster_router_t *)0)->member), mn,  \
            mx, nm, req                                                                            \
    }

enum {
    RF_LISTEN = 0,
    RF_HTTP,
    RF_PREFILL_POLICY,
    RF_DECODE_POLICY,
    RF_TIMEOUT,
    RF_QUEUE,
    RF_IDLE_TIMEOUT,
    RF_HEADER_TIMEOUT,
    RF_BODY_TIMEOUT,
    RF_MAX_CONNECTIONS,
    RF_MAX_STREAMS,
    RF_CONTROL,
    RF_TLS_CERT,
    RF_TLS_KEY,
    RF_API_KEYS_FILE,
    RF_OPS_TOKEN_FILE,
    RF__COUNT
};

static const cluster_config__field_t cluster_config__router_fields[RF__COUNT] = {
    [RF_LISTEN] = {"listen", F_HOSTPORT, offsetof(cluster_router_t, listen_host),
                   offsetof(cluster_router_t, listen_port), CLUSTER_HOST_MAX, 1, 65535, NULL, 1},
    [RF_HTTP] = {"http", F_HOSTPORT, offsetof(cluster_router_t, http_host),
                 offsetof(cluster_router_t, http_port), CLUSTER_HOST_MAX, 1, 65535, NULL, 1},
    [RF_PREFILL_POLICY] = ROUTER_F("prefill_policy", F_ENUM, prefill_policy, 0, 0,
                                   cluster_config__prefill_policies, 0),
    [RF_DECODE_POLICY] =
        ROUTER_F("decode_policy", F_ENUM, decode_policy, 0, 0, cluster_config__decode_policies, 0),
    [RF_TIMEOUT] =
        ROUTER_F("request_timeout_ms", F_INT64, request_timeout_ms, 1, 86400000, NULL, 0),
    [RF_QUEUE] = ROUTER_F("max_queue", F_INT, max_queue, 0, 1 << 24, NULL, 0),
    [RF_IDLE_TIMEOUT] = ROUTER_F("idle_timeout_ms", F_INT64, idle_timeout_ms, 1, 86400000, NULL, 0),
    [RF_HEADER_TIMEOUT] =
        ROUTER_F("header_timeout_ms", F_INT64, header_timeout_ms, 1, 86400000, NULL, 0),
    [RF_BODY_TIMEOUT] = ROUTER_F("body_timeout_ms", F_INT64, body_timeout_ms, 1, 86400000, NULL, 0),
    [RF_MAX_CONNECTIONS] = ROUTER_F("max_connections", F_INT, max_connections, 1, 1 << 20, NULL, 0),
    [RF_MAX_STREAMS] = ROUTER_F("max_streams", F_INT, max_streams, 1, 1 << 20, NULL, 0),
    [RF_CONTROL] = {"control", F_HOSTPORT, offsetof(cluster_router_t, control_host),
                    offsetof(cluster_router_t, control_port), CLUSTER_HOST_MAX, 1, 65535, NULL, 0},
    [RF_TLS_CERT] = ROUTER_F("tls_cert", F_STR, tls_cert, 0, 0, NULL, 0),
    [RF_TLS_KEY] = ROUTER_F("tls_key", F_STR, tls_key, 0, 0, NULL, 0),
    [RF_API_KEYS_FILE] = ROUTER_F("api_keys_file", F_STR, api_keys_file, 0, 0, NULL, 0),
    [RF_OPS_TOKEN_FILE] = ROUTER_F("ops_token_file", F_STR, ops_token_file, 0, 0, NULL, 0),
};

enum { TF_UCX_TLS = 0, TF_LEASE, TF_CLUSTER_TOKEN, TF__COUNT };

static const cluster_config__field_t cluster_config__transport_fields[TF__COUNT] = {
    [TF_UCX_TLS] = {"ucx_tls", F_STR, offsetof(cluster_transport_t, ucx_tls), 0,
                    sizeof(((cluster_transport_t *)0)->ucx_tls), 0, 0, NULL, 0},
    [TF_LEASE] = {"lease_ms", F_INT64, offsetof(cluster_transport_t, lease_ms), 0, 0, 1, 3600000,
                  NULL, 0},
    [TF_CLUSTER_TOKEN] = {"cluster_token_file", F_STR,
                          offsetof(cluster_transport_t, cluster_token_file), 0,
                          sizeof(((cluster_transport_t *)0)->cluster_token_file), 0, 0, NULL, 0},
};

static int cluster_config__find_field(const cluster_config__field_t *fields, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (strcmp(fields[i].key, key) == 0)
            return i;
    return -1;
}

/* ==== scalar conversions ==== */

pd_status_t cluster_config_parse_bytes(const char *text, int64_t *bytes_p)
{
    static const struct {
        const char *suffix;
        int64_t mult;
    } units[] = {
        {"", 1},           {"B", 1}, {"KiB", 1LL << 10}, {"MiB", 1LL << 20}, {"GiB", 1LL << 30},
        {"TiB", 1LL << 40}};
    const char *p = text;
    char *end;
    unsigned long long v;

    if (!text || !isdigit((unsigned char)*p))
        return PD_ERR_INVALID;
    errno = 0;
    v = strtoull(p, &end, 10);
    if (errno || v > (unsigned long long)INT64_MAX)
        return PD_ERR_INVALID;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) != 0)
            continue;
        if (v > (unsigned long long)(INT64_MAX / units[i].mult))
            return PD_ERR_INVALID;
        *bytes_p = (int64_t)v * units[i].mult;
        return PD_OK;
    }
    return PD_ERR_INVALID;
}

static int cluster_config__parse_int(const char *s, int64_t *v_p)
{
    char *end;
    long long v;

    if (!*s || !(isdigit((unsigned char)s[0]) || s[0] == '-' || s[0] == '+'))
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || *end)
        return -1;
    *v_p = v;
    return 0;
}

static int cluster_config__valid_name(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.')
            return 0;
    return 1;
}

/* Writes value into the field of base; path and m locate errors. */
static pd_status_t cluster_config__set(cluster_config__ctx_t *c, const cluster_config__field_t *f,
                                       void *base, const char *value,
                                       const cluster_config__mark_t *m, const char *path)
{
    char *dst = (char *)base + f->off;
    int64_t v;

    switch (f->type) {
    case F_STR:
        if (strlen(value) >= f->size)
            return cluster_config__fail(c, m, path, "value too long (at most %zu bytes)",
                                        f->size - 1);
        if (f->required && !*value)
            return cluster_config__fail(c, m, path, "must not be empty");
        snprintf(dst, f->size, "%s", value);
        return PD_OK;
    case F_INT:
    case F_INT64:
        if (cluster_config__parse_int(value, &v) != 0)
            return cluster_config__fail(c, m, path, "'%s' is not an integer", value);
        if (v < f->min || v > f->max)
            return cluster_config__fail(c, m, path, "%lld out of range [%lld, %lld]", (long long)v,
                                        (long long)f->min, (long long)f->max);
        if (f->type == F_INT)
            *(int *)dst = (int)v;
        else
            *(int64_t *)dst = v;
        return PD_OK;
    case F_BYTES:
        if (cluster_config_parse_bytes(value, &v) != PD_OK)
            return cluster_config__fail(c, m, path,
                                        "'%s' is not a size (bytes, or with KiB/MiB/GiB)", value);
        if (v < f->min)
            return cluster_config__fail(c, m, path, "must be at least %lld bytes",
                                        (long long)f->min);
        *(int64_t *)dst = v;
        return PD_OK;
    case F_ENUM: {
        char expected[256] = "";
        for (int i = 0; f->names[i]; i++) {
            if (strcmp(f->names[i], value) == 0) {
                *(int *)dst = i;
                return PD_OK;
            }
            snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s%s",
                     i ? ", " : "", f->names[i]);
        }
        return cluster_config__fail(c, m, path, "unknown value '%s' (expected %s)", value,
                                    expected);
    }
    case F_HOSTPORT: {
        const char *colon = strrchr(value, ':');
        const char *host = value;
        size_t hlen;
        if (!colon)
            return cluster_config__fail(c, m, path, "'%s' is not host:port", value);
        hlen = (size_t)(colon - value);
        if (hlen >= 2 && host[0] == '[' && host[hlen - 1] == ']') { /* [::1]:80 */
            host++;
            hlen -= 2;
        }
        if (hlen == 0 || hlen >= f->size)
            return cluster_config__fail(c, m, path, "'%s' has an empty or too long host", value);
        if (cluster_config__parse_int(colon + 1, &v) != 0 || v < f->min || v > f->max)
            return cluster_config__fail(c, m, path, "'%s': port must be in [%lld, %lld]", value,
                                        (long long)f->min, (long long)f->max);
        memcpy(dst, host, hlen);
        dst[hlen] = 0;
        *(int *)((char *)base + f->off2) = (int)v;
        return PD_OK;
    }
    }
    PD_ASSERT(0);
}

/* ==== validation ==== */

typedef struct {
    cluster_config__mark_t node;             /* the node's mapping */
    cluster_config__mark_t field[NF__COUNT]; /* each value, when given */
} cluster_config__node_marks_t;

typedef struct {
    cluster_config__mark_t listen, http;
} cluster_config__router_marks_t;

static void cluster_config__node_defaults(cluster_node_t *n, const uint32_t set)
{
    if (!(set & (1u << NF_WEIGHTS)))
        n->weights = n->role == CLUSTER_ROLE_PREFILL ? PD_WFMT_FP8 : PD_WFMT_INT4;
    if (!(set & (1u << NF_KV)))
        n->kv = n->role == CLUSTER_ROLE_PREFILL ? PD_KV_BF16 : PD_KV_FP8;
}

static void cluster_config__node_init(cluster_node_t *n)
{
    memset(n, 0, sizeof *n);
    n->backend = CLUSTER_BACKEND_CPU;
    n->page_tokens = 16;
    n->kv_budget = 64LL << 20;
    n->max_batch = 64;
    n->prefill_chunk = 512;
    n->tracker = CLUSTER_TRACKER_TAGGED;
    n->tp = 1;
}

/* Checks the rules that involve more than one field of a node. */
static pd_status_t cluster_config__check_node(cluster_config__ctx_t *c, const cluster_node_t *n,
                                              const cluster_config__node_marks_t *m)
{
    char path[128];
    const cluster_config__mark_t *at;

    if ((n->page_tokens & (n->page_tokens - 1)) != 0) {
        snprintf(path, sizeof path, "nodes.%s.page_tokens", n->name);
        return cluster_config__fail(c, m ? &m->field[NF_PAGE_TOKENS] : NULL, path,
                                    "%d is not a power of two", n->page_tokens);
    }
    if (n->role == CLUSTER_ROLE_DECODE && n->ucx_port == 0) {
        snprintf(path, sizeof path, "nodes.%s.ucx_port", n->name);
        at = m ? (m->field[NF_UCX_PORT].set ? &m->field[NF_UCX_PORT] : &m->node) : NULL;
        return cluster_config__fail(c, at, path, "decode nodes need a ucx_port in [1, 65535]");
    }
    if (n->role == CLUSTER_ROLE_PREFILL && n->ucx_port != 0) {
        snprintf(path, sizeof path, "nodes.%s.ucx_port", n->name);
        return cluster_config__fail(
            c, m ? &m->field[NF_UCX_PORT] : NULL, path,
            "only decode nodes listen for ucx (must be 0 on prefill nodes)");
    }
    return PD_OK;
}

typedef struct {
    const char *host;
    int port;
    char path[128];
    const cluster_config__mark_t *mark;
} cluster_config__endpoint_t;

/* A node's tp against the model's heads (config.json in cfg->model, when it can be read here:
 * a router's host need not have the model; the node checks again at start, formats included). */
static pd_status_t cluster_config__check_tp(cluster_config__ctx_t *c, const cluster_config_t *cfg,
                                            const cluster_node_t *nd,
                                            const cluster_config__node_marks_t *m, hf_config_t *hf,
                                            int *hf_state)
{
    char path[CLUSTER_PATH_MAX + 16], key[128];
    if (nd->tp <= 1)
        return PD_OK;
    if (*hf_state == 0) { /* read once per file */
        snprintf(path, sizeof path, "%s/config.json", cfg->model);
        *hf_state = access(path, R_OK) == 0 && hf_config_load(path, hf) == PD_OK ? 1 : -1;
    }
    if (*hf_state < 0)
        return PD_OK;
    snprintf(key, sizeof key, "nodes.%s.tp", nd->name);
    const cluster_config__mark_t *at = m ? &m->field[NF_TP] : NULL;
    if (hf->num_attention_heads % nd->tp != 0)
        return cluster_config__fail(c, at, key,
                                    "%d does not divide the model's %d attention heads "
                                    "(num_attention_heads in %s/config.json)",
                                    nd->tp, hf->num_attention_heads, cfg->model);
    if (hf->num_key_value_heads % nd->tp != 0)
        return cluster_config__fail(c, at, key,
                                    "%d does not divide the model's %d KV heads "
                                    "(num_key_value_heads in %s/config.json): each rank holds "
                                    "whole KV heads",
                                    nd->tp, hf->num_key_value_heads, cfg->model);
    return PD_OK;
}

/* Checks the rules across nodes: unique names, unique host:port, one node of each role. */
static pd_status_t cluster_config__check_all(cluster_config__ctx_t *c, const cluster_config_t *cfg,
                                             const cluster_config__node_marks_t *nm,
                                             const cluster_config__router_marks_t *rm,
                                             const cluster_config__mark_t *top)
{
    size_t cap = 2 + 3 * cfg->n_nodes, n = 0;
    cluster_config__endpoint_t *ep = calloc(cap, sizeof *ep);
    pd_status_t st = PD_OK;
    int have[2] = {0, 0}, hf_state = 0;
    hf_config_t hf;

    if (!ep)
        return PD_ERR_NOMEM;
    ep[n++] = (cluster_config__endpoint_t){cfg->router.listen_host, cfg->router.listen_port,
                                           "router.listen", rm ? &rm->listen : NULL};
    ep[n++] = (cluster_config__endpoint_t){cfg->router.http_host, cfg->router.http_port,
                                           "router.http", rm ? &rm->http : NULL};
    for (size_t i = 0; i < cfg->n_nodes; i++) {
        const cluster_node_t *nd = &cfg->nodes[i];
        const cluster_config__node_marks_t *m = nm ? &nm[i] : NULL;
        have[nd->role] = 1;
        if ((st = cluster_config__check_tp(c, cfg, nd, m, &hf, &hf_state)) != PD_OK)
            goto out;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(cfg->nodes[j].name, nd->name) == 0) {
                char path[128];
                snprintf(path, sizeof path, "nodes[%zu].name", i);
                st = cluster_config__fail(c, m ? &m->field[NF_NAME] : NULL, path,
                                          "duplicate node name '%s'", nd->name);
                goto out;
            }
        }
        static const int port_fields[3] = {NF_PORT, NF_UCX_PORT, NF_HTTP_PORT};
        const int ports[3] = {nd->port, nd->ucx_port, nd->http_port};
        for (int k = 0; k < 3; k++) {
            if (ports[k] == 0)
                continue;
            ep[n].host = nd->host;
            ep[n].port = ports[k];
            snprintf(ep[n].path, sizeof ep[n].path, "nodes.%s.%s", nd->name,
                     cluster_config__node_fields[port_fields[k]].key);
            ep[n].mark = m ? &m->field[port_fields[k]] : NULL;
            n++;
        }
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++) {
            if (ep[i].port == ep[j].port && strcmp(ep[i].host, ep[j].host) == 0) {
                st = cluster_config__fail(c, ep[i].mark, ep[i].path,
                                          "duplicate address %s:%d (also %s)", ep[i].host,
                                          ep[i].port, ep[j].path);
                goto out;
            }
        }
    }
    if (!have[CLUSTER_ROLE_PREFILL] || !have[CLUSTER_ROLE_DECODE])
        st = cluster_config__fail(c, top, "nodes", "need at least one prefill and one decode node");
out:
    free(ep);
    return st;
}

/* ==== YAML walking ==== */

typedef struct {
    cluster_config__ctx_t ctx;
    yaml_document_t doc;
    cluster_config_t *cfg;
    cluster_config__node_marks_t *node_marks; /* (n_nodes) */
    cluster_config__router_marks_t router_marks;
    cluster_config__mark_t nodes_mark;
} cluster_config__parse_t;

static const char *cluster_config__ytype(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_SCALAR_NODE:
        return "a scalar";
    case YAML_SEQUENCE_NODE:
        return "a list";
    case YAML_MAPPING_NODE:
        return "a mapping";
    default:
        return "empty";
    }
}

static pd_status_t cluster_config__expect(cluster_config__parse_t *p, const yaml_node_t *n,
                                          yaml_node_type_t type, const char *path)
{
    static const char *names[] = {"", "a scalar", "a list", "a mapping"};
    cluster_config__mark_t m = cluster_config__mark(n);
    if (n->type != type)
        return cluster_config__fail(&p->ctx, &m, path, "expected %s, found %s", names[type],
                                    cluster_config__ytype(n));
    return PD_OK;
}

/* Fails on a key that appears twice in one mapping; keys must be scalars. */
static pd_status_t cluster_config__check_keys(cluster_config__parse_t *p, const yaml_node_t *map,
                                              const char *path)
{
    for (yaml_node_pair_t *a = map->data.mapping.pairs.start; a < map->data.mapping.pairs.top;
         a++) {
        yaml_node_t *k = yaml_document_get_node(&p->doc, a->key);
        cluster_config__mark_t m = cluster_config__mark(k);
        if (k->type != YAML_SCALAR_NODE)
            return cluster_config__fail(&p->ctx, &m, path, "keys must be scalars");
        for (yaml_node_pair_t *b = map->data.mapping.pairs.start; b < a; b++) {
            yaml_node_t *kb = yaml_document_get_node(&p->doc, b->key);
            if (kb->type == YAML_SCALAR_NODE &&
                strcmp((char *)kb->data.scalar.value, (char *)k->data.scalar.value) == 0)
                return cluster_config__fail(&p->ctx, &m, path, "duplicate key '%s'",
                                            (char *)k->data.scalar.value);
        }
    }
    return PD_OK;
}

/* Applies the scalar pairs of a mapping to fields; returns the mask of fields set. */
static pd_status_t cluster_config__apply_map(cluster_config__parse_t *p, const yaml_node_t *map,
                                             const cluster_config__field_t *fields, int n_fields,
                                             void *base, const char *prefix,
                                             cluster_config__mark_t *marks, uint32_t *set_p)
{
    uint32_t set = 0;
    pd_status_t st;
    char path[192];

    if ((st = cluster_config__check_keys(p, map, prefix)) != PD_OK)
        return st;
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *k = yaml_document_get_node(&p->doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(&p->doc, pr->value);
        const char *key = (const char *)k->data.scalar.value;
        int i = cluster_config__find_field(fields, n_fields, key);
        cluster_config__mark_t km = cluster_config__mark(k), vm = cluster_config__mark(v);

        snprintf(path, sizeof path, "%s.%s", prefix, key);
        if (i < 0)
            return cluster_config__fail(&p->ctx, &km, path, "unknown key");
        if ((st = cluster_config__expect(p, v, YAML_SCALAR_NODE, path)) != PD_OK)
            return st;
        if ((st = cluster_config__set(&p->ctx, &fields[i], base, (const char *)v->data.scalar.value,
                                      &vm, path)) != PD_OK)
            return st;
        if (marks)
            marks[i] = vm;
        set |= 1u << i;
    }
    for (int i = 0; i < n_fields; i++) {
        if (fields[i].required && !(set & (1u << i))) {
            cluster_config__mark_t mm = cluster_config__mark(map);
            snprintf(path, sizeof path, "%s.%s", prefix, fields[i].key);
            return cluster_config__fail(&p->ctx, &mm, path, "required key is missing");
        }
    }
    *set_p = set;
    return PD_OK;
}

static pd_status_t cluster_config__parse_node(cluster_config__parse_t *p, const yaml_node_t *map,
                                              size_t idx)
{
    cluster_node_t *n = &p->cfg->nodes[idx];
    cluster_config__node_marks_t *m = &p->node_marks[idx];
    char prefix[128];
    uint32_t set = 0;
    pd_status_t st;

    snprintf(prefix, sizeof prefix, "nodes[%zu]", idx);
    if ((st = cluster_config__expect(p, map, YAML_MAPPING_NODE, prefix)) != PD_OK)
        return st;
    /* Name the node in messages as soon as its name is known. */
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *k = yaml_document_get_node(&p->doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(&p->doc, pr->value);
        if (k->type == YAML_SCALAR_NODE && v->type == YAML_SCALAR_NODE &&
            strcmp((char *)k->data.scalar.value, "name") == 0) {
            cluster_config__mark_t vm = cluster_config__mark(v);
            const char *name = (const char *)v->data.scalar.value;
            if (!cluster_config__valid_name(name) || strlen(name) >= CLUSTER_NAME_MAX) {
                snprintf(prefix + strlen(prefix), sizeof prefix - strlen(prefix), ".name");
                return cluster_config__fail(
                    &p->ctx, &vm, prefix,
                    "'%s' is not a valid node name (1-%d of A-Z a-z 0-9 _ - .)", name,
                    CLUSTER_NAME_MAX - 1);
            }
            snprintf(prefix, sizeof prefix, "nodes.%s", name);
        }
    }
    cluster_config__node_init(n);
    m->node = cluster_config__mark(map);
    if ((st = cluster_config__apply_map(p, map, cluster_config__node_fields, NF__COUNT, n, prefix,
                                        m->field, &set)) != PD_OK)
        return st;
    cluster_config__node_defaults(n, set);
    return cluster_config__check_node(&p->ctx, n, m);
}

static pd_status_t cluster_config__parse_nodes(cluster_config__parse_t *p, const yaml_node_t *seq)
{
    size_t count = (size_t)(seq->data.sequence.items.top - seq->data.sequence.items.start);
    pd_status_t st;

    if ((st = cluster_config__expect(p, seq, YAML_SEQUENCE_NODE, "nodes")) != PD_OK)
        return st;
    p->nodes_mark = cluster_config__mark(seq);
    if (count == 0)
        return cluster_config__fail(&p->ctx, &p->nodes_mark, "nodes", "the list is empty");
    p->cfg->nodes = calloc(count, sizeof *p->cfg->nodes);
    p->node_marks = calloc(count, sizeof *p->node_marks);
    if (!p->cfg->nodes || !p->node_marks) {
        pd_log_error("%s: out of memory for %zu nodes", p->ctx.source, count);
        return PD_ERR_NOMEM;
    }
    p->cfg->n_nodes = count;
    for (size_t i = 0; i < count; i++) {
        yaml_node_t *item = yaml_document_get_node(&p->doc, seq->data.sequence.items.start[i]);
        if ((st = cluster_config__parse_node(p, item, i)) != PD_OK)
            return st;
    }
    return PD_OK;
}

static pd_status_t cluster_config__resolve_model(cluster_config__parse_t *p, const char *model,
                                                 const char *base_dir,
                                                 const cluster_config__mark_t *m)
{
    int w;
    if (!*model)
        return cluster_config__fail(&p->ctx, m, "model", "must not be empty");
    if (model[0] == '/' || !base_dir || !*base_dir)
        w = snprintf(p->cfg->model, sizeof p->cfg->model, "%s", model);
    else
        w = snprintf(p->cfg->model, sizeof p->cfg->model, "%s/%s", base_dir, model);
    if (w < 0 || (size_t)w >= sizeof p->cfg->model)
        return cluster_config__fail(&p->ctx, m, "model", "path too long");
    return PD_OK;
}

static pd_status_t cluster_config__parse_root(cluster_config__parse_t *p, const yaml_node_t *root,
                                              const char *base_dir)
{
    cluster_config_t *cfg = p->cfg;
    cluster_config__mark_t rm = cluster_config__mark(root);
    int have_model = 0, have_router = 0, have_nodes = 0;
    uint32_t set;
    pd_status_t st;

    if ((st = cluster_config__expect(p, root, YAML_MAPPING_NODE, "(top level)")) != PD_OK)
        return st;
    if ((st = cluster_config__check_keys(p, root, "(top level)")) != PD_OK)
        return st;
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *k = yaml_document_get_node(&p->doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(&p->doc, pr->value);
        const char *key = (const char *)k->data.scalar.value;
        cluster_config__mark_t km = cluster_config__mark(k), vm = cluster_config__mark(v);

        if (strcmp(key, "model") == 0) {
            if ((st = cluster_config__expect(p, v, YAML_SCALAR_NODE, "model")) != PD_OK ||
                (st = cluster_config__resolve_model(p, (const char *)v->data.scalar.value, base_dir,
                                                    &vm)) != PD_OK)
                return st;
            have_model = 1;
        } else if (strcmp(key, "router") == 0) {
            cluster_config__mark_t marks[RF__COUNT] = {{0}};
            if ((st = cluster_config__expect(p, v, YAML_MAPPING_NODE, "router")) != PD_OK ||
                (st = cluster_config__apply_map(p, v, cluster_config__router_fields, RF__COUNT,
                                                &cfg->router, "router", marks, &set)) != PD_OK)
                return st;
            p->router_marks.listen = marks[RF_LISTEN];
            p->router_marks.http = marks[RF_HTTP];
            have_router = 1;
        } else if (strcmp(key, "transport") == 0) {
            if ((st = cluster_config__expect(p, v, YAML_MAPPING_NODE, "transport")) != PD_OK ||
                (st = cluster_config__apply_map(p, v, cluster_config__transport_fields, TF__COUNT,
                                                &cfg->transport, "transport", NULL, &set)) != PD_OK)
                return st;
        } else if (strcmp(key, "nodes") == 0) {
            if ((st = cluster_config__parse_nodes(p, v)) != PD_OK)
                return st;
            have_nodes = 1;
        } else {
            return cluster_config__fail(&p->ctx, &km, key,
                                        "unknown key (expected model, router, transport, "
                                        "nodes)");
        }
    }
    if (!have_model)
        return cluster_config__fail(&p->ctx, &rm, "model", "required key is missing");
    if (!have_router)
        return cluster_config__fail(&p->ctx, &rm, "router", "required key is missing");
    if (!have_nodes)
        return cluster_config__fail(&p->ctx, &rm, "nodes", "required key is missing");
    return cluster_config__check_all(&p->ctx, cfg, p->node_marks, &p->router_marks, &p->nodes_mark);
}

static void cluster_config__config_init(cluster_config_t *cfg)
{
    cfg->router.prefill_policy = CLUSTER_PREFILL_ROUND_ROBIN;
    cfg->router.decode_policy = CLUSTER_DECODE_LEAST_KV;
    cfg->router.request_timeout_ms = 60000;
    cfg->router.max_queue = 1024;
    cfg->transport.lease_ms = 10000;
}

pd_status_t cluster_config_parse(const char *text, size_t len, const char *name,
                                 const char *base_dir, char *err, size_t err_len,
                                 cluster_config_t **cfg_p)
{
    cluster_config__parse_t p = {.ctx = {name ? name : "<config>", err, err_len}};
    yaml_parser_t parser;
    yaml_node_t *root;
    pd_status_t st;

    if (err && err_len)
        err[0] = 0;
    p.cfg = calloc(1, sizeof *p.cfg);
    if (!p.cfg) {
        pd_log_error("%s: out of memory", p.ctx.source);
        return PD_ERR_NOMEM;
    }
    snprintf(p.cfg->source, sizeof p.cfg->source, "%s", p.ctx.source);
    cluster_config__config_init(p.cfg);
    if (!yaml_parser_initialize(&parser)) {
        pd_log_error("%s: out of memory for the yaml parser", p.ctx.source);
        st = PD_ERR_NOMEM;
        goto err_free_cfg;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &p.doc)) {
        cluster_config__mark_t m = {1, parser.problem_mark.line, parser.problem_mark.column};
        st = cluster_config__fail(&p.ctx, &m, NULL, "yaml: %s%s%s",
                                  parser.problem ? parser.problem : "error",
                                  parser.context ? " " : "", parser.context ? parser.context : "");
        goto err_free_parser;
    }
    root = yaml_document_get_root_node(&p.doc);
    if (!root) {
        cluster_config__mark_t m = {1, 0, 0};
        st = cluster_config__fail(&p.ctx, &m, NULL, "empty document");
        goto err_free_doc;
    }
    if ((st = cluster_config__parse_root(&p, root, base_dir)) != PD_OK)
        goto err_free_doc;
    yaml_document_delete(&p.doc);
    yaml_parser_delete(&parser);
    free(p.node_marks);
    *cfg_p = p.cfg;
    return PD_OK;

err_free_doc:
    yaml_document_delete(&p.doc);
err_free_parser:
    yaml_parser_delete(&parser);
err_free_cfg:
    free(p.node_marks);
    cluster_config_destroy(p.cfg);
    return st;
}

pd_status_t cluster_config_load(const char *path, cluster_config_t **cfg_p)
{
    char dir[CLUSTER_PATH_MAX];
    const char *slash = strrchr(path, '/');
    FILE *f;
    char *text = NULL;
    size_t len = 0, cap = 0, got;
    pd_status_t st;

    f = fopen(path, "rb");
    if (!f) {
        pd_log_error("%s: cannot open cluster config: %s", path, strerror(errno));
        return PD_ERR_IO;
    }
    do {
        if (cap - len < 4096) {
            char *t = realloc(text, cap ? cap * 2 : 16384);
            if (!t) {
                pd_log_error("%s: out of memory reading the file", path);
                st = PD_ERR_NOMEM;
                goto err_close;
            }
            text = t;
            cap = cap ? cap * 2 : 16384;
        }
        got = fread(text + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    if (ferror(f)) {
        pd_log_error("%s: read error: %s", path, strerror(errno));
        st = PD_ERR_IO;
        goto err_close;
    }
    fclose(f);
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    st = cluster_config_parse(text, len, path, dir, NULL, 0, cfg_p);
    free(text);
    return st;

err_close:
    fclose(f);
    free(text);
    return st;
}

const cluster_node_t *cluster_config_find_node(const cluster_config_t *cfg, const char *name)
{
    for (size_t i = 0; cfg && name && i < cfg->n_nodes; i++)
        if (strcmp(cfg->nodes[i].name, name) == 0)
            return &cfg->nodes[i];
    return NULL;
}

/* ==== overrides ==== */

static pd_status_t cluster_config__override_node(cluster_config__ctx_t *c, cluster_node_t *tmp,
                                                 const char *key, const char *value)
{
    char path[192];
    int i = cluster_config__find_field(cluster_config__node_fields, NF__COUNT, key);
    pd_status_t st;

    snprintf(path, sizeof path, "nodes.%s.%s", tmp->name, key);
    if (i < 0)
        return cluster_config__fail(c, NULL, path, "unknown key");
    if (i == NF_NAME || i == NF_ROLE)
        return cluster_config__fail(c, NULL, path, "cannot be overridden");
    if ((st = cluster_config__set(c, &cluster_config__node_fields[i], tmp, value, NULL, path)) !=
        PD_OK)
        return st;
    return cluster_config__check_node(c, tmp, NULL);
}

static pd_status_t cluster_config__override_top(cluster_config__ctx_t *c, cluster_config_t *tmp,
                                                const char *key, const char *value)
{
    const char *dot = strchr(key, '.');
    int i;

    if (strcmp(key, "model") == 0) {
        if (!*value || strlen(value) >= sizeof tmp->model)
            return cluster_config__fail(c, NULL, key, "must be a path of 1-%zu bytes",
                                        sizeof tmp->model - 1);
        snprintf(tmp->model, sizeof tmp->model, "%s", value);
        return PD_OK;
    }
    if (dot && strncmp(key, "router.", 7) == 0 &&
        (i = cluster_config__find_field(cluster_config__router_fields, RF__COUNT, dot + 1)) >= 0)
        return cluster_config__set(c, &cluster_config__router_fields[i], &tmp->router, value, NULL,
                                   key);
    if (dot && strncmp(key, "transport.", 10) == 0 &&
        (i = cluster_config__find_field(cluster_config__transport_fields, TF__COUNT, dot + 1)) >= 0)
        return cluster_config__set(c, &cluster_config__transport_fields[i], &tmp->transport, value,
                                   NULL, key);
    return cluster_config__fail(c, NULL, key, "unknown key");
}

pd_status_t cluster_config_override(cluster_config_t *cfg, const char *node_name, const char *key,
                                    const char *value)
{
    cluster_config__ctx_t c = {"--set", NULL, 0};
    cluster_config_t tmp = *cfg;
    cluster_node_t node, old, *target;
    pd_status_t st;

    if (!key || !value)
        return cluster_config__fail(&c, NULL, NULL, "missing key or value");
    if (node_name) {
        const cluster_node_t *n = cluster_config_find_node(cfg, node_name);
        if (!n) {
            cluster_config__fail(&c, NULL, NULL, "%s=%s: no node named '%s'", key, value,
                                 node_name);
            return PD_ERR_NOT_FOUND;
        }
        target = &cfg->nodes[n - cfg->nodes];
        node = *target;
        if ((st = cluster_config__override_node(&c, &node, key, value)) != PD_OK)
            return PD_ERR_INVALID;
        /* Validate the whole config with the node replaced; put the old one back on failure. */
        old = *target;
        *target = node;
        st = cluster_config__check_all(&c, cfg, NULL, NULL, NULL);
        if (st != PD_OK)
            *target = old;
    } else {
        if ((st = cluster_config__override_top(&c, &tmp, key, value)) != PD_OK)
            return PD_ERR_INVALID;
        st = cluster_config__check_all(&c, &tmp, NULL, NULL, NULL);
        if (st == PD_OK)
            *cfg = tmp;
    }
    return st == PD_OK ? PD_OK : st == PD_ERR_NOMEM ? st : PD_ERR_INVALID;
}

pd_status_t cluster_config_read_token(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    pd_status_t st = PD_ERR_FORMAT;

    if (!f) {
        pd_log_error("%s: cannot read the token", path);
        return PD_ERR_IO;
    }
    while (fgets(line, sizeof line, f)) {
        char *s = line, *e;
        while (*s == ' ' || *s == '\t')
            s++;
        e = s + strcspn(s, "\r\n");
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        *e = 0;
        if (!*s || *s == '#')
            continue;
        if (strpbrk(s, " \t") || (size_t)(e - s) >= cap)
            break;
        memcpy(out, s, (size_t)(e - s) + 1);
        st = PD_OK;
        break;
    }
    fclose(f);
    if (st != PD_OK)
        pd_log_error("%s: no token (one line, no spaces, under %zu bytes)", path, cap);
    return st;
}

void cluster_config_destroy(cluster_config_t *cfg)
{
    if (!cfg)
        return;
    free(cfg->nodes);
    free(cfg);
}

pd_status_t cluster_config_load_args(const pd_args_t *args, const char *tag,
                                     cluster_config_t **cfg_p)
{
    cluster_config_t *cfg = NULL;
    pd_status_t st;

    pd_log_set_tag(args->node ? args->node : tag);
    pd_log_set_json(args->log_json);
    if (args->have_log_level)
        pd_log_set_level(args->log_level);
    if ((st = cluster_config_load(args->config, &cfg)) != PD_OK)
        return st;
    for (int i = 0; i < args->n_sets; i++) {
        char key[256];
        const char *value;
        if ((st = pd_args_split_set(args->sets[i], key, sizeof key, &value)) != PD_OK)
            pd_log_error("--set %s: expected KEY=VALUE", args->sets[i]);
        else
            st = cluster_config_override(cfg, args->node, key, value); /* logs its own error */
        if (st != PD_OK) {
            cluster_config_destroy(cfg);
            return st;
        }
    }
    *cfg_p = cfg;
    return PD_OK;
}
