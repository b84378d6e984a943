/* pdctl commands for the router's pdserve.v1.Cluster service: drain / undrain a node, list the
 * router's nodes (the ones of its cluster file and those that joined) with their state. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <uv.h>

#include "clock.h"
#include "cluster_config.h"
#include "grpc_client.h"
#include "grpc_wire.h"
#include "pdctl.h"
#include "pdctl_host.h"
#include "pdserve.pb-c.h"

typedef struct {
    int done, code;
    char msg[256];
    ProtobufCMessage *resp;
} pdctl_members__call_t;

static void pdctl_members__done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    pdctl_members__call_t *c = arg;
    c->done = 1;
    c->code = code;
    snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "");
    c->resp = resp;
}

/* "Bearer TOKEN" from the environment variable var or the first line of the file ${var}_FILE, or
 * "" when neither is set. */
void pdctl_bearer(const char *var, char *out, size_t cap)
{
    char file_var[64], token[512] = "";
    const char *env = getenv(var), *file;
    snprintf(file_var, sizeof file_var, "%s_FILE", var);
    file = getenv(file_var);
    out[0] = 0;
    if (env && *env)
        snprintf(token, sizeof token, "%s", env);
    else if (file && *file && cluster_config_read_token(file, token, sizeof token) != PD_OK)
        token[0] = 0; /* logged */
    if (token[0])
        snprintf(out, cap, "Bearer %s", token);
}

void pdctl_tls_init(pdctl_tls_t *t)
{
    const char *ca = getenv("PDSERVE_TLS_CA"), *name = getenv("PDSERVE_TLS_SERVER_NAME");
    t->ca = ca && *ca ? ca : NULL;
    t->name = name && *name ? name : NULL;
    t->on = t->ca != NULL;
}

int pdctl_tls_opt(pdctl_tls_t *t, const char *name, const char *value)
{
    if (strcmp(name, "--tls-ca") == 0) {
        t->ca = value;
        t->on = 1;
        return 1;
    }
    if (strcmp(name, "--tls-server-name") == 0) {
        t->name = value;
        return 1;
    }
    return 0;
}

int pdctl_tls_apply(const char *cmd, const pdctl_tls_t *t, pd_grpc_client_t *c)
{
    pd_grpc_client_tls_t tls = {t->ca, t->name};
    if (!t->on)
        return 0;
    if (pd_grpc_client_set_tls(c, &tls) != PD_OK) {
        fprintf(stderr, "pdctl %s: --tls-ca %s: cannot be read as PEM CA certificates\n", cmd,
                t->ca ? t->ca : "(system default)");
        return -1;
    }
    return 0;
}

/* One unary call to the router at addr (with the ops token of $PDSERVE_OPS_TOKEN[_FILE]); the
 * response (code 0) belongs to the caller. */
static int pdctl_members__call(const char *addr, const pdctl_tls_t *tls, const char *path,
                               const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
                               long timeout_ms, pdctl_members__call_t *out)
{
    char host[CLUSTER_HOST_MAX];
    int port;
    uv_loop_t loop;
    pd_grpc_client_t *cl;
    pd_grpc_client_call_t *call = NULL;
    char bearer[520];

    memset(out, 0, sizeof *out);
    pdctl_bearer("PDSERVE_OPS_TOKEN", bearer, sizeof bearer);
    if (pdctl_host_parse_addr(addr, host, sizeof host, &port) != PD_OK) {
        snprintf(out->msg, sizeof out->msg, "'%s' is not HOST:PORT", addr);
        out->code = PD_GRPC_INVALID_ARGUMENT;
        return -1;
    }
    PD_ASSERT(uv_loop_init(&loop) == 0);
    if (pd_grpc_client_create(&loop, pdctl_host_connect_name(host), port, &cl) != PD_OK) {
        out->code = PD_GRPC_INTERNAL;
        snprintf(out->msg, sizeof out->msg, "out of memory");
        uv_loop_close(&loop);
        return -1;
    }
    if (pdctl_tls_apply("cluster", tls, cl) != 0) {
        out->code = PD_GRPC_INVALID_ARGUMENT;
        snprintf(out->msg, sizeof out->msg, "tls: bad CA file");
        out->done = 1;
    } else if (pd_grpc_client_unary(cl, path, req, desc, timeout_ms, pdctl_members__done, out,
                                    &call) != PD_OK) {
        out->code = PD_GRPC_INTERNAL;
        snprintf(out->msg, sizeof out->msg, "cannot start the call");
        out->done = 1;
    } else if (bearer[0])
        (void)pd_grpc_client_call_add_metadata(call, "authorization", bearer);
    while (!out->done)
        uv_run(&loop, UV_RUN_ONCE);
    pd_grpc_client_destroy(cl);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return out->code == 0 ? 0 : -1;
}

typedef struct {
    const char *router, *node;
    long timeout_ms, wait_s;
    int json;
    pdctl_tls_t tls;
} pdctl_members__opts_t;

/* --router HOST:PORT | --config FILE (its router.listen), NODE, --wait-s, --timeout-ms, --json.
 * need_node: one positional NODE. Returns 0, or 2 after printing the problem. */
static int pdctl_members__parse(const char *cmd, int argc, char **argv, int need_node,
                                pdctl_members__opts_t *o, char *router_buf, size_t router_cap)
{
    const char *config = NULL;
    memset(o, 0, sizeof *o);
    pdctl_tls_init(&o->tls);
    o->timeout_ms = 5000;
    o->wait_s = 600;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
            continue;
        }
        if (a[0] != '-') {
            if (!need_node || o->node) {
                fprintf(stderr, "pdctl %s: unexpected argument '%s'\n", cmd, a);
                return 2;
            }
            o->node = a;
            continue;
        }
        if (!v) {
            fprintf(stderr, "pdctl %s: %s needs a value\n", cmd, a);
            return 2;
        }
        i++;
        char *end;
        if (strcmp(a, "--router") == 0)
            o->router = v;
        else if (strcmp(a, "--config") == 0)
            config = v;
        else if (pdctl_tls_opt(&o->tls, a, v))
            continue;
        else if (strcmp(a, "--timeout-ms") == 0 || strcmp(a, "--wait-s") == 0) {
            long x = strtol(v, &end, 10);
            if (*end || end == v || x < 0 || x > 86400000) {
                fprintf(stderr, "pdctl %s: %s %s: expected a number\n", cmd, a, v);
                return 2;
            }
            if (a[2] == 't')
                o->timeout_ms = x ? x : 1;
            else
                o->wait_s = x;
        } else {
            fprintf(stderr, "pdctl %s: unknown option '%s'\n", cmd, a);
            return 2;
        }
    }
    if (!o->router == !config) {
        fprintf(stderr, "pdctl %s: give --router HOST:PORT or --config FILE\n", cmd);
        return 2;
    }
    if (config) {
        cluster_config_t *cfg;
        if (cluster_config_load(config, &cfg) != PD_OK)
            return 2; /* logged */
        pdctl_host_format_addr(router_buf, router_cap, cfg->router.listen_host,
                               cfg->router.listen_port);
        o->tls.on |= cfg->router.tls_cert[0] != 0; /* its listen port speaks TLS */
        cluster_config_destroy(cfg);
        o->router = router_buf;
    }
    if (need_node && !o->node) {
        fprintf(stderr, "pdctl %s: which node? (pdctl %s NODE --router HOST:PORT)\n", cmd, cmd);
        return 2;
    }
    return 0;
}

static json_t *pdctl_members__node_json(const Pdserve__V1__ClusterNode *n)
{
    return json_pack("{s:s, s:s, s:s, s:I, s:s, s:b, s:I, s:I, s:I, s:I, s:b, s:I}", "node",
                     n->name, "role", n->role, "host", n->host, "port", (json_int_t)n->port,
                     "state", n->state, "serving", n->serving, "running", (json_int_t)n->running,
                     "active", (json_int_t)n->active, "pages_used", (json_int_t)n->pages_used,
                     "pages_total", (json_int_t)n->pages_total, "joined", n->joined, "tp",
                     (json_int_t)(n->tp ? n->tp : 1));
}

static void pdctl_members__print(const Pdserve__V1__ClusterNode *const *ns, size_t n, int json)
{
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, pdctl_members__node_json(ns[i]));
        char *s = json_dumps(arr, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(arr);
        return;
    }
    printf("%-12s %-8s %-22s %-9s %7s %6s %13s %-6s %s\n", "NODE", "ROLE", "ADDRESS", "STATE",
           "RUNNING", "ACTIVE", "KV_PAGES", "JOINED", "TP");
    for (size_t i = 0; i < n; i++) {
        char addr[96], pages[32];
        pdctl_host_format_addr(addr, sizeof addr, ns[i]->host, (int)ns[i]->port);
        snprintf(pages, sizeof pages, "%u/%u", ns[i]->pages_used, ns[i]->pages_total);
        printf("%-12s %-8s %-22s %-9s %7u %6u %13s %-6s %u\n", ns[i]->name, ns[i]->role, addr,
               ns[i]->state, ns[i]->running, ns[i]->active, pages, ns[i]->joined ? "yes" : "no",
               ns[i]->tp ? ns[i]->tp : 1);
    }
}

int pdctl_nodes(int argc, char **argv)
{
    pdctl_members__opts_t o;
    char router[CLUSTER_HOST_MAX + 16];
    Pdserve__V1__ListNodesRequest req = PDSERVE__V1__LIST_NODES_REQUEST__INIT;
    pdctl_members__call_t c;
    int rc;

    if ((rc = pdctl_members__parse("nodes", argc, argv, 0, &o, router, sizeof router)) != 0)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    if (pdctl_members__call(o.router, &o.tls, "/pdserve.v1.Cluster/ListNodes", &req.base,
                            &pdserve__v1__list_nodes_reply__descriptor, o.timeout_ms, &c) < 0) {
        fprintf(stderr, "pdctl nodes: %s: %s\n", pd_grpc_wire_code_name(c.code), c.msg);
        return 1;
    }
    const Pdserve__V1__ListNodesReply *rep = (const void *)c.resp;
    pdctl_members__print((const Pdserve__V1__ClusterNode *const *)rep->nodes, rep->n_nodes, o.json);
    protobuf_c_message_free_unpacked(c.resp, NULL);
    return 0;
}

/* drain / undrain NODE; drain then waits (up to --wait-s, 0: not at all) for "drained". */
static int pdctl_members__drain(const char *cmd, int argc, char **argv, int undrain)
{
    pdctl_members__opts_t o;
    char router[CLUSTER_HOST_MAX + 16];
    Pdserve__V1__DrainRequest req = PDSERVE__V1__DRAIN_REQUEST__INIT;
    pdctl_members__call_t c;
    double t0 = pd_clock_s();
    int rc;

    if ((rc = pdctl_members__parse(cmd, argc, argv, 1, &o, router, sizeof router)) != 0)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    req.name = (char *)o.node;
    req.undrain = undrain;
    for (int first = 1;; first = 0) {
        /* Drain is idempotent: each call answers the node's state now */
        if (pdctl_members__call(o.router, &o.tls, "/pdserve.v1.Cluster/Drain", &req.base,
                                &pdserve__v1__drain_reply__descriptor, o.timeout_ms, &c) < 0) {
            fprintf(stderr, "pdctl %s: %s: %s: %s\n", cmd, o.node, pd_grpc_wire_code_name(c.code),
                    c.msg);
            return 1;
        }
        const Pdserve__V1__ClusterNode *n = ((const Pdserve__V1__DrainReply *)c.resp)->node;
        int drained = n && strcmp(n->state, "drained") == 0;
        if (first && !o.json && !undrain && !drained && o.wait_s)
            fprintf(stderr, "%s: draining (%u request(s) running)\n", o.node, n ? n->running : 0);
        if (undrain || drained || !o.wait_s || pd_clock_s() - t0 > (double)o.wait_s) {
            int ok = undrain || drained || !o.wait_s;
            if (n)
                pdctl_members__print(&n, 1, o.json);
            if (!ok)
                fprintf(stderr, "pdctl drain: %s not drained after %ld s (%u running)\n", o.node,
                        o.wait_s, n ? n->running : 0);
            protobuf_c_message_free_unpacked(c.resp, NULL);
            return ok ? 0 : 1;
        }
        protobuf_c_message_free_unpacked(c.resp, NULL);
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int pdctl_drain(int argc, char **argv)
{
    return pdctl_members__drain("drain", argc, argv, 0);
}

int pdctl_undrain(int argc, char **argv)
{
    return pdctl_members__drain("undrain", argc, argv, 1);
}
