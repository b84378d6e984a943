/* pdctl commands that talk to a running cluster: up, down, health, generate --router, models.
 *
 * gRPC calls run on a private libuv loop per batch (pdctl__rpc_run): every call of a batch is in
 * flight at once, so probing N nodes takes one timeout, not N. Processes and the state file are
 * handled by pdctl_proc and pdctl_state; host names by pdctl_host.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "cluster_config.h"
#include "grpc_client.h"
#include "grpc_wire.h"
#include "grpc_health.h"
#include "health.pb-c.h"
#include "clock.h"
#include "log.h"
#include "pdctl.h"
#include "pdctl_host.h"
#include "pdctl_proc.h"
#include "pdctl_state.h"
#include "pdserve.pb-c.h"
#include "tp_shard.h"

#define PDCTL_HEALTH_PATH "/grpc.health.v1.Health/Check"

/* ==== small helpers ==== */

static void pdctl__sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL); /* a signal ends it early: the caller checks its flags */
}

/* Parses a decimal integer in [lo, hi]; prints "pdctl CMD: NAME: ..." and returns -1 if bad. */
static int pdctl__long(const char *cmd, const char *name, const char *v, long lo, long hi,
                       long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *v == 0 || *end || x < lo || x > hi) {
        fprintf(stderr, "pdctl %s: %s: '%s' is not an integer in %ld..%ld\n", cmd, name, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* Resolves a config path to an absolute path (realpath); prints a message on failure. */
static int pdctl__config_abs(const char *cmd, const char *path, char *out)
{
    if (!realpath(path, out)) {
        fprintf(stderr, "pdctl %s: --config %s: %s\n", cmd, path, strerror(errno));
        return -1;
    }
    return 0;
}

/* mkdir -p; returns 0 or -1 (message printed). */
static int pdctl__mkdirs(const char *dir)
{
    char buf[CLUSTER_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "pdctl up: cannot create %s: %s\n", buf, strerror(errno));
                return -1;
            }
            *p = c;
            if (!c)
                return 0;
        }
    }
}

/* ==== gRPC calls in batches ==== */

typedef struct {
    /* in */
    const char *host;
    int port;
    const char *path;
    const ProtobufCMessage *req;
    const ProtobufCMessageDescriptor *desc;
    int64_t timeout_ms;
    const pdctl_tls_t *tls; /* NULL: h2c */
    const char *bearer;     /* "Bearer ..." to send; NULL: the nodes' cluster token */
    /* out */
    int done, code;
    char msg[256];
    ProtobufCMessage *resp; /* when code == 0; freed by pdctl__rpc_free */
} pdctl_rpc_t;

static void pdctl__rpc_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    pdctl_rpc_t *r = arg;
    r->done = 1;
    r->code = code;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    r->resp = resp;
}

/* Runs the n unary calls concurrently to completion (each ends by its own deadline). A call that
 * cannot start ends with INTERNAL. */
static void pdctl__rpc_run(pdctl_rpc_t *rpcs, size_t n)
{
    uv_loop_t loop;
    pd_grpc_client_t **cl = calloc(n ? n : 1, sizeof *cl);
    size_t pending = 0;
    char bearer[520];

    pdctl_bearer("PDSERVE_CLUSTER_TOKEN", bearer, sizeof bearer);

    PD_ASSERT(cl && uv_loop_init(&loop) == 0);
    for (size_t i = 0; i < n; i++) {
        pdctl_rpc_t *r = &rpcs[i];
        if (r->done)
            continue; /* skipped by the caller */
        pd_status_t st = pd_grpc_client_create(&loop, r->host, r->port, &cl[i]);
        pd_grpc_client_call_t *call = NULL;
        if (st == PD_OK && r->tls && pdctl_tls_apply("rpc", r->tls, cl[i]) != 0)
            st = PD_ERR_IO;
        if (st == PD_OK)
            st = pd_grpc_client_unary(cl[i], r->path, r->req, r->desc, r->timeout_ms,
                                      pdctl__rpc_done, r, &call);
        if (st == PD_OK && r->bearer && r->bearer[0])
            (void)pd_grpc_client_call_add_metadata(call, "authorization", r->bearer);
        else if (st == PD_OK && !r->bearer && bearer[0]) /* the nodes' cluster token (Stats) */
            (void)pd_grpc_client_call_add_metadata(call, "authorization", bearer);
        if (st != PD_OK) {
            r->done = 1;
            r->code = PD_GRPC_INTERNAL;
            snprintf(r->msg, sizeof r->msg, "cannot start call: %s", pd_status_str(st));
        }
    }
    for (;;) {
        pending = 0;
        for (size_t i = 0; i < n; i++)
            pending += !rpcs[i].done;
        if (!pending)
            break;
        uv_run(&loop, UV_RUN_ONCE);
    }
    for (size_t i = 0; i < n; i++)
        pd_grpc_client_destroy(cl[i]);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0)
        pd_log_warn("rpc batch: loop still has handles at close");
    free(cl);
}

static void pdctl__rpc_free(pdctl_rpc_t *r)
{
    if (r->resp)
        protobuf_c_message_free_unpacked(r->resp, NULL);
    r->resp = NULL;
}

/* ==== probing nodes (health + stats) ==== */

typedef struct {
    char name[CLUSTER_NAME_MAX];
    char role[16];               /* "router", "prefill", "decode"; "-" unknown (--addr) */
    char host[CLUSTER_HOST_MAX]; /* where to connect */
    int port;
    char addr[CLUSTER_HOST_MAX + 16];
    const char *service;    /* full service name checked first; NULL: "" only */
    const pdctl_tls_t *tls; /* the router's listen port with TLS; NULL: h2c */
    /* results */
    const char *status; /* SERVING, NOT_SERVING, UNREACHABLE, TIMEOUT, ... */
    int serving;
    char detail[320]; /* the gRPC error behind a non-SERVING status, "" when none */
    int has_stats;
    Pdserve__V1__NodeStats stats; /* strings not kept */
    char weights[16], kv[16];
} pdctl_target_t;

static const char *pdctl__health_name(int status)
{
    switch (status) {
    case PD_GRPC_HEALTH_SERVING:
        return "SERVING";
    case PD_GRPC_HEALTH_NOT_SERVING:
        return "NOT_SERVING";
    case PD_GRPC_HEALTH_SERVICE_UNKNOWN:
        return "SERVICE_UNKNOWN";
    default:
        return "UNKNOWN";
    }
}

/* Maps a finished health Check to the target's status. */
static void pdctl__target_health(pdctl_target_t *t, const pdctl_rpc_t *r)
{
    t->serving = 0;
    t->detail[0] = 0;
    if (r->code == PD_GRPC_OK) {
        int s = ((Grpc__Health__V1__HealthCheckResponse *)r->resp)->status;
        t->status = pdctl__health_name(s);
        t->serving = s == PD_GRPC_HEALTH_SERVING;
        return;
    }
    switch (r->code) {
    case PD_GRPC_UNAVAILABLE:
        t->status = "UNREACHABLE";
        break;
    case PD_GRPC_DEADLINE_EXCEEDED:
        t->status = "TIMEOUT";
        break;
    case PD_GRPC_NOT_FOUND:
        t->status = "SERVICE_UNKNOWN";
        break;
    case PD_GRPC_UNIMPLEMENTED:
        t->status = "NO_HEALTH_SERVICE";
        break;
    default:
        t->status = pd_grpc_wire_code_name(r->code);
    }
    snprintf(t->detail, sizeof t->detail, "%s%s%s", pd_grpc_wire_code_name(r->code),
             r->msg[0] ? ": " : "", r->msg);
}

static void pdctl__target_stats(pdctl_target_t *t, const pdctl_rpc_t *r)
{
    const Pdserve__V1__NodeStats *s = (const void *)r->resp;
    if (r->code != PD_GRPC_OK || t->has_stats)
        return;
    t->has_stats = 1;
    t->stats = *s;
    t->stats.node = t->stats.role = t->stats.weights = t->stats.kv = NULL;
    snprintf(t->weights, sizeof t->weights, "%s", s->weights ? s->weights : "");
    snprintf(t->kv, sizeof t->kv, "%s", s->kv ? s->kv : "");
    if (strcmp(t->role, "-") == 0 && s->role && *s->role)
        snprintf(t->role, sizeof t->role, "%s", s->role);
}

/* Checks the health of the n targets (the full service name, falling back to "" when the server
 * does not know it) and, with want_stats, asks prefill/decode nodes (and role-less targets: both)
 * for their Stats. All calls of a round run at once. */
static void pdctl__probe(pdctl_target_t *ts, size_t n, int64_t timeout_ms, int want_stats)
{
    Grpc__Health__V1__HealthCheckRequest hreq[1] = {GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT};
    Pdserve__V1__StatsRequest sreq = PDSERVE__V1__STATS_REQUEST__INIT;
    pdctl_rpc_t *r = calloc(3 * n + 1, sizeof *r);
    size_t nr = 0;

    PD_ASSERT(r);
    hreq[0].service = (char *)"";
    for (size_t i = 0; i < n; i++) {
        pdctl_target_t *t = &ts[i];
        t->has_stats = 0;
        r[nr++] = (pdctl_rpc_t){.host = t->host,
                                .port = t->port,
                                .path = PDCTL_HEALTH_PATH,
                                .req = &hreq[0].base,
                                .desc = &grpc__health__v1__health_check_response__descriptor,
                                .timeout_ms = timeout_ms,
                                .tls = t->tls};
        if (t->service) {
            /* one request message per service name: the batch shares none */
            Grpc__Health__V1__HealthCheckRequest *q = malloc(sizeof *q);
            PD_ASSERT(q);
            grpc__health__v1__health_check_request__init(q);
            q->service = (char *)t->service;
            r[nr - 1].req = &q->base;
        }
        int pre = want_stats && (strcmp(t->role, "prefill") == 0 || strcmp(t->role, "-") == 0);
        int dec = want_stats && (strcmp(t->role, "decode") == 0 || strcmp(t->role, "-") == 0);
        r[nr++] = (pdctl_rpc_t){.host = pre ? t->host : NULL,
                                .port = t->port,
                                .path = "/pdserve.v1.Prefill/Stats",
                                .req = &sreq.base,
                                .desc = &pdserve__v1__node_stats__descriptor,
                                .timeout_ms = timeout_ms};
        r[nr++] = (pdctl_rpc_t){.host = dec ? t->host : NULL,
                                .port = t->port,
                                .path = "/pdserve.v1.Decode/Stats",
                                .req = &sreq.base,
                                .desc = &pdserve__v1__node_stats__descriptor,
                                .timeout_ms = timeout_ms};
        if (!pre)
            r[nr - 2].done = 1, r[nr - 2].code = -1;
        if (!dec)
            r[nr - 1].done = 1, r[nr - 1].code = -1;
    }
    /* the batch runner takes contiguous calls; skipped ones are already done */
    pdctl__rpc_run(r, nr);
    for (size_t i = 0; i < n; i++) {
        pdctl_rpc_t *h = &r[3 * i];
        if (h->code == PD_GRPC_NOT_FOUND && ts[i].service) {
            /* the server does not name this service: ask about the whole server */
            pdctl_rpc_t again = *h;
            again.req = &hreq[0].base;
            again.done = 0;
            again.msg[0] = 0;
            again.resp = NULL;
            pdctl__rpc_run(&again, 1);
            pdctl__target_health(&ts[i], &again);
            pdctl__rpc_free(&again);
        } else
            pdctl__target_health(&ts[i], h);
        pdctl__target_stats(&ts[i], &r[3 * i + 1]);
        pdctl__target_stats(&ts[i], &r[3 * i + 2]);
        if (ts[i].service)
            free((void *)h->req);
        for (int k = 0; k < 3; k++)
            pdctl__rpc_free(&r[3 * i + k]);
    }
    free(r);
}

static const char *pdctl__service_of(const char *role)
{
    if (strcmp(role, "prefill") == 0)
        return "pdserve.v1.Prefill";
    if (strcmp(role, "decode") == 0)
        return "pdserve.v1.Decode";
    if (strcmp(role, "router") == 0)
        return "pdserve.v1.Inference";
    return NULL;
}

static void pdctl__target_set(pdctl_target_t *t, const char *name, const char *role,
                              const char *host, int port)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->role, sizeof t->role, "%s", role);
    snprintf(t->host, sizeof t->host, "%s", pdctl_host_connect_name(host));
    t->port = port;
    pdctl_host_format_addr(t->addr, sizeof t->addr, host, port);
    t->service = pdctl__service_of(role);
    t->status = "UNKNOWN";
}

/* The router first, then the nodes in file order. Returns the count (cfg->n_nodes + 1). */
static pdctl_target_t *pdctl__targets_of(const cluster_config_t *cfg, size_t *n_p)
{
    pdctl_target_t *ts = calloc(cfg->n_nodes + 1, sizeof *ts);
    PD_ASSERT(ts);
    pdctl__target_set(&ts[0], "router", "router", cfg->router.listen_host, cfg->router.listen_port);
    for (size_t i = 0; i < cfg->n_nodes; i++) {
        const cluster_node_t *nd = &cfg->nodes[i];
        pdctl__target_set(&ts[i + 1], nd->name, cluster_config_role_str(nd->role), nd->host,
                          nd->port);
    }
    *n_p = cfg->n_nodes + 1;
    return ts;
}

/* ==== health ==== */

static void pdctl__health_print(const pdctl_target_t *ts, size_t n)
{
    printf("%-12s %-8s %-22s %-17s %6s %6s %13s %9s %3s\n", "NODE", "ROLE", "ADDRESS", "STATUS",
           "ACTIVE", "QUEUED", "KV_PAGES", "INTEGRITY", "TP");
    for (size_t i = 0; i < n; i++) {
        const pdctl_target_t *t = &ts[i];
        char active[16] = "-", queued[16] = "-", pages[32] = "-", integ[24] = "-", tp[16] = "-";
        if (t->has_stats) {
            snprintf(active, sizeof active, "%u", t->stats.active);
            snprintf(queued, sizeof queued, "%u", t->stats.queued);
            snprintf(pages, sizeof pages, "%u/%u", t->stats.pages_used, t->stats.pages_total);
            snprintf(integ, sizeof integ, "%llu", (unsigned long long)t->stats.integrity_failures);
            snprintf(tp, sizeof tp, "%u", t->stats.tp ? t->stats.tp : 1);
        }
        printf("%-12s %-8s %-22s %-17s %6s %6s %13s %9s %3s\n", t->name, t->role, t->addr,
               t->status, active, queued, pages, integ, tp);
    }
    for (size_t i = 0; i < n; i++)
        if (ts[i].detail[0])
            printf("%s (%s): %s\n", ts[i].name, ts[i].addr, ts[i].detail);
}

static void pdctl__health_json(const pdctl_target_t *ts, size_t n, int all_ok)
{
    json_t *arr = json_array(), *root;
    for (size_t i = 0; i < n; i++) {
        const pdctl_target_t *t = &ts[i];
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:b}", "node", t->name, "role", t->role,
                              "address", t->addr, "status", t->status, "serving", t->serving);
        json_object_set_new(o, "error", t->detail[0] ? json_string(t->detail) : json_null());
        if (t->has_stats)
            json_object_set_new(
                o, "stats",
                json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:I, s:b}", "active",
                          (json_int_t)t->stats.active, "queued", (json_int_t)t->stats.queued,
                          "pages_total", (json_int_t)t->stats.pages_total, "pages_used",
                          (json_int_t)t->stats.pages_used, "integrity_failures",
                          (json_int_t)t->stats.integrity_failures, "tokens",
                          (json_int_t)t->stats.tokens, "requests", (json_int_t)t->stats.requests,
                          "weights", t->weights, "kv", t->kv, "tp",
                          (json_int_t)(t->stats.tp ? t->stats.tp : 1), "operator_drain",
                          (int)t->stats.operator_drain));
        else
            json_object_set_new(o, "stats", json_null());
        json_array_append_new(arr, o);
    }
    root = json_pack("{s:b, s:o}", "ok", all_ok, "nodes", arr);
    char *s = json_dumps(root, JSON_INDENT(2));
    printf("%s\n", s);
    free(s);
    json_decref(root);
}

int pdctl_health(int argc, char **argv)
{
    const char *config = NULL;
    const char *addrs[64];
    size_t n_addrs = 0, n = 0;
    int json = 0, all_ok = 1;
    long timeout_ms = 3000;
    cluster_config_t *cfg = NULL;
    pdctl_target_t *ts;
    pdctl_tls_t tls;

    pdctl_tls_init(&tls);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "pdctl health: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (pdctl_tls_opt(&tls, a, v))
            continue;
        if (strcmp(a, "--config") == 0)
            config = v;
        else if (strcmp(a, "--addr") == 0 && n_addrs < 64)
            addrs[n_addrs++] = v;
        else if (strcmp(a, "--timeout-ms") == 0) {
            if (pdctl__long("health", a, v, 1, 3600000, &timeout_ms) < 0)
                return 2;
        } else {
            fprintf(stderr, "pdctl health: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!config == !n_addrs) {
        fprintf(stderr, "pdctl health: give --config FILE or --addr HOST:PORT\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (config) {
        if (cluster_config_load(config, &cfg) != PD_OK)
            return 2;                             /* logged with file:line:col */
        if (cfg->transport.cluster_token_file[0]) /* for the nodes' Stats */
            setenv("PDSERVE_CLUSTER_TOKEN_FILE", cfg->transport.cluster_token_file, 0);
        ts = pdctl__targets_of(cfg, &n);
        tls.on |= cfg->router.tls_cert[0] != 0;
        if (tls.on) /* the router's listen port (ts[0]); the nodes' control ports are h2c */
            ts[0].tls = &tls;
        cluster_config_destroy(cfg);
    } else {
        ts = calloc(n_addrs, sizeof *ts);
        PD_ASSERT(ts);
        for (size_t i = 0; i < n_addrs; i++) {
            char host[CLUSTER_HOST_MAX];
            int port;
            if (pdctl_host_parse_addr(addrs[i], host, sizeof host, &port) != PD_OK) {
                fprintf(stderr, "pdctl health: --addr '%s' is not HOST:PORT\n", addrs[i]);
                free(ts);
                return 2;
            }
            pdctl__target_set(&ts[i], addrs[i], "-", host, port);
        }
        n = n_addrs;
    }
    pdctl__probe(ts, n, timeout_ms, 1);
    for (size_t i = 0; i < n; i++)
        all_ok &= ts[i].serving;
    if (json)
        pdctl__health_json(ts, n, all_ok);
    else
        pdctl__health_print(ts, n);
    free(ts);
    return all_ok ? 0 : 1;
}

/* ==== up / down ==== */

static volatile sig_atomic_t pdctl__got_stop, pdctl__got_chld;

static void pdctl__on_signal(int sig)
{
    if (sig == SIGCHLD)
        pdctl__got_chld = 1;
    else
        pdctl__got_stop = sig;
}

static void pdctl__install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = pdctl__on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* Stops the routers first (no new requests reach the nodes), then every other process. */
static pd_status_t pdctl__stop_all(const pdctl_state_t *st, int grace_ms, int verbose)
{
    pd_status_t rc = PD_OK;
    for (int pass = 0; pass < 2; pass++) {
        pdctl_proc_t *sel = calloc(st->n_procs + 1, sizeof *sel);
        size_t k = 0;
        int killed = 0;
        PD_ASSERT(sel);
        for (size_t i = st->n_procs; i-- > 0;)
            if ((strcmp(st->procs[i].role, "router") == 0) == (pass == 0))
                sel[k++] = st->procs[i];
        for (size_t i = 0; i < k && verbose; i++)
            if (pdctl_proc_alive(&sel[i], NULL))
                fprintf(stderr, "stopping %s (pid %d)\n", sel[i].name, sel[i].pid);
        if (pdctl_proc_stop(sel, k, grace_ms, &killed) != PD_OK)
            rc = PD_ERR_INTERNAL;
        if (killed && verbose)
            fprintf(stderr, "%d process(es) did not exit within %d ms of SIGTERM: killed\n", killed,
                    grace_ms);
        free(sel);
    }
    return rc;
}

typedef struct {
    const char *cmd; /* "up" */
    const char *state_path;
    pdctl_state_t st;
    cluster_config_t *cfg;
    char config[CLUSTER_PATH_MAX];
    char log_dir[CLUSTER_PATH_MAX];
    double timeout_s;
    int grace_ms, detach;
} pdctl_up_t;

/* Starts one process for a node (or the router) and records it in the state file. */
static int pdctl__up_spawn(pdctl_up_t *u, const char *name, const char *role, const char *host,
                           int port)
{
    const char *subdir = strcmp(role, "router") == 0    ? "router"
                         : strcmp(role, "prefill") == 0 ? "prefill-node"
                                                        : "decode-node";
    char bin[CLUSTER_PATH_MAX];
    char *args[8];
    int na = 0;
    pdctl_proc_t p;

    if (pdctl_proc_find_binary(subdir, subdir, bin, sizeof bin) != PD_OK) {
        fprintf(stderr,
                "pdctl up: %s: cannot find the %s binary (looked in $PDSERVE_BIN_DIR, "
                "<pdctl dir>/../%s, <pdctl dir> and PATH)\n",
                name, subdir, subdir);
        return -1;
    }
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "%s", name);
    snprintf(p.role, sizeof p.role, "%s", role);
    pdctl_host_format_addr(p.addr, sizeof p.addr, host, port);
    if (snprintf(p.log, sizeof p.log, "%s/%s.log", u->log_dir, name) >= (int)sizeof p.log) {
        fprintf(stderr, "pdctl up: %s: log path too long\n", name);
        return -1;
    }
    args[na++] = bin;
    args[na++] = (char *)"--config";
    args[na++] = u->config;
    if (strcmp(role, "router") != 0) {
        args[na++] = (char *)"--node";
        args[na++] = (char *)name;
    }
    args[na] = NULL;
    if (pdctl_proc_spawn(args, !u->detach, &p) != PD_OK)
        return -1; /* logged */
    fprintf(stderr, "started %s (%s, pid %d), log %s\n", name, bin, p.pid, p.log);
    if (pdctl_state_add(&u->st, &p) != PD_OK) {
        pdctl_proc_stop(&p, 1, 0, NULL);
        fprintf(stderr, "pdctl up: out of memory\n");
        return -1;
    }
    if (pdctl_state_write(u->state_path, &u->st) != PD_OK)
        return -1;
    return 0;
}

/* Waits until procs [from, u->st.n_procs) answer health SERVING. Returns 0, or -1 after printing
 * why (a process exited, the deadline passed, a signal). */
static int pdctl__up_wait(pdctl_up_t *u, size_t from)
{
    size_t n = u->st.n_procs - from;
    pdctl_target_t *ts = calloc(n + 1, sizeof *ts);
    char *ready = calloc(n + 1, 1);
    double t0 = pd_clock_s();
    int rc = -1;

    PD_ASSERT(ts && ready);
    for (size_t i = 0; i < n; i++) {
        const pdctl_proc_t *p = &u->st.procs[from + i];
        char host[CLUSTER_HOST_MAX];
        int port = 0;
        PD_ASSERT(pdctl_host_parse_addr(p->addr, host, sizeof host, &port) == PD_OK);
        pdctl__target_set(&ts[i], p->name, p->role, host, port);
    }
    for (;;) {
        size_t left = 0;
        for (size_t i = 0; i < n; i++) {
            const pdctl_proc_t *p = &u->st.procs[from + i];
            int ws;
            if (!pdctl_proc_alive(p, &ws)) {
                char how[96];
                pdctl_proc_describe_exit(ws, how, sizeof how);
                fprintf(stderr,
                        "pdctl up: %s (pid %d) %s before it was serving; last lines of %s:\n",
                        p->name, p->pid, how, p->log);
                pdctl_proc_log_tail(p->log, 20, stderr);
                goto out;
            }
        }
        if (pdctl__got_stop) {
            fprintf(stderr, "pdctl up: interrupted while starting\n");
            goto out;
        }
        /* probe only the ones not ready yet */
        pdctl_target_t *pend = calloc(n + 1, sizeof *pend);
        size_t np = 0;
        PD_ASSERT(pend);
        for (size_t i = 0; i < n; i++)
            if (!ready[i])
                pend[np++] = ts[i];
        pdctl__probe(pend, np, 1000, 0);
        for (size_t i = 0, k = 0; i < n; i++) {
            if (ready[i])
                continue;
            ts[i] = pend[k++];
            if (ts[i].serving) {
                ready[i] = 1;
                fprintf(stderr, "%s is serving on %s (%.1f s)\n", ts[i].name, ts[i].addr,
                        pd_clock_s() - t0);
            } else
                left++;
        }
        free(pend);
        if (!left) {
            rc = 0;
            goto out;
        }
        if (pd_clock_s() - t0 > u->timeout_s) {
            for (size_t i = 0; i < n; i++) {
                const pdctl_proc_t *p = &u->st.procs[from + i];
                if (ready[i])
                    continue;
                fprintf(stderr,
                        "pdctl up: %s (pid %d, %s) not serving after %.0f s (health: %s%s%s); "
                        "last lines of %s:\n",
                        p->name, p->pid, p->addr, u->timeout_s, ts[i].status,
                        ts[i].detail[0] ? ", " : "", ts[i].detail, p->log);
                pdctl_proc_log_tail(p->log, 20, stderr);
            }
            goto out;
        }
        pdctl__sleep_ms(200);
    }
out:
    free(ts);
    free(ready);
    return rc;
}

static void pdctl__up_table(const pdctl_up_t *u)
{
    printf("%-12s %-8s %-22s %3s %8s  %s\n", "NODE", "ROLE", "ADDRESS", "TP", "PID", "LOG");
    for (size_t i = 0; i < u->st.n_procs; i++) {
        const pdctl_proc_t *p = &u->st.procs[i];
        const cluster_node_t *nd = cluster_config_find_node(u->cfg, p->name);
        char tp[16] = "-";
        if (nd && strcmp(p->role, "router") != 0)
            snprintf(tp, sizeof tp, "%d", nd->tp);
        printf("%-12s %-8s %-22s %3s %8d  %s\n", p->name, p->role, p->addr, tp, p->pid, p->log);
    }
    if (u->cfg->router.http_port > 0)
        printf("router http: http://%s:%d (OpenAI API, /health, /ready, /metrics)\n",
               u->cfg->router.http_host, u->cfg->router.http_port);
}

/* Before anything starts: every local node's tp must split the model with its weight format
 * (tp_shard_check), and tensor-parallel CUDA nodes on this host should not share GPUs (devices
 * device .. device + tp - 1: a warning, as two nodes on one GPU may be meant). Returns 0 or -1
 * after printing why. */
static int pdctl__up_check_tp(const cluster_config_t *cfg)
{
    char path[CLUSTER_PATH_MAX + 16];
    hf_config_t hf;
    int have_hf = -1;
    for (size_t i = 0; i < cfg->n_nodes; i++) {
        const cluster_node_t *a = &cfg->nodes[i];
        if (a->tp <= 1 || !pdctl_host_is_local(a->host))
            continue;
        if (have_hf < 0) {
            snprintf(path, sizeof path, "%s/config.json", cfg->model);
            have_hf = hf_config_load(path, &hf) == PD_OK;
        }
        if (!have_hf || tp_shard_check(&hf, a->weights, PD_WFMT_BF16, a->tp) != PD_OK) {
            fprintf(stderr, "pdctl up: %s: node %s: tp %d cannot run %s with %s weights (above)\n",
                    cfg->source, a->name, a->tp, cfg->model, pd_wfmt_name(a->weights));
            return -1;
        }
        for (size_t j = 0; a->backend == CLUSTER_BACKEND_CUDA && j < cfg->n_nodes; j++) {
            const cluster_node_t *b = &cfg->nodes[j];
            if (j == i || b->backend != CLUSTER_BACKEND_CUDA || strcmp(a->host, b->host) != 0 ||
                b->device + b->tp <= a->device || a->device + a->tp <= b->device)
                continue;
            fprintf(stderr,
                    "pdctl up: warning: %s (GPUs %d..%d) and %s (GPUs %d..%d) share a GPU\n",
                    a->name, a->device, a->device + a->tp - 1, b->name, b->device,
                    b->device + b->tp - 1);
        }
    }
    return 0;
}

/* Foreground: waits for a signal (stop everything) or child deaths (report, keep the others). */
static int pdctl__up_supervise(pdctl_up_t *u)
{
    sigset_t block, orig;
    size_t n_dead = 0;
    char *dead = calloc(u->st.n_procs + 1, 1);

    PD_ASSERT(dead);
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGCHLD);
    sigprocmask(SIG_BLOCK, &block, &orig);
    fprintf(stderr, "pdctl up: running in the foreground; Ctrl-C stops the cluster\n");
    for (;;) {
        while (!pdctl__got_stop && !pdctl__got_chld)
            sigsuspend(&orig);
        if (pdctl__got_chld) {
            pdctl__got_chld = 0;
            for (size_t i = 0; i < u->st.n_procs; i++) {
                const pdctl_proc_t *p = &u->st.procs[i];
                int ws;
                char how[96];
                if (dead[i] || pdctl_proc_alive(p, &ws))
                    continue;
                dead[i] = 1;
                n_dead++;
                pdctl_proc_describe_exit(ws, how, sizeof how);
                fprintf(stderr, "pdctl up: %s (pid %d) %s; last lines of %s:\n", p->name, p->pid,
                        how, p->log);
                pdctl_proc_log_tail(p->log, 20, stderr);
            }
            if (n_dead == u->st.n_procs) {
                fprintf(stderr, "pdctl up: every process has exited\n");
                free(dead);
                return 1;
            }
        }
        if (pdctl__got_stop) {
            fprintf(stderr, "pdctl up: %s: stopping the cluster\n",
                    strsignal((int)pdctl__got_stop));
            sigprocmask(SIG_SETMASK, &orig, NULL);
            free(dead);
            return pdctl__stop_all(&u->st, u->grace_ms, 1) == PD_OK ? 0 : 1;
        }
    }
}

/* Refuses to start over a running cluster; removes a stale state file. */
static int pdctl__up_check_existing(const char *state_path)
{
    pdctl_state_t old;
    pd_status_t st;
    int alive = 0;

    pdctl_state_init(&old);
    st = pdctl_state_read(state_path, &old);
    if (st == PD_ERR_NOT_FOUND)
        return 0;
    for (size_t i = 0; st == PD_OK && i < old.n_procs; i++)
        alive += pdctl_proc_alive(&old.procs[i], NULL);
    pdctl_state_deinit(&old);
    if (alive) {
        fprintf(stderr,
                "pdctl up: this cluster is already up (%d process(es) of %s are running); run "
                "pdctl down --config FILE first\n",
                alive, state_path);
        return -1;
    }
    pdctl_state_remove(state_path); /* stale or unreadable */
    return 0;
}

int pdctl_up(int argc, char **argv)
{
    pdctl_up_t u;
    const char *config = NULL, *log_dir = NULL;
    char state_path[CLUSTER_PATH_MAX];
    long timeout_s = 300, grace_s = 10;
    int rc = 1;
    size_t from;

    memset(&u, 0, sizeof u);
    u.cmd = "up";
    pdctl_state_init(&u.st);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--detach") == 0) {
            u.detach = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "pdctl up: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--config") == 0)
            config = v;
        else if (strcmp(a, "--log-dir") == 0)
            log_dir = v;
        else if (strcmp(a, "--timeout-s") == 0) {
            if (pdctl__long("up", a, v, 1, 86400, &timeout_s) < 0)
                return 2;
        } else if (strcmp(a, "--grace-s") == 0) {
            if (pdctl__long("up", a, v, 0, 3600, &grace_s) < 0)
                return 2;
        } else {
            fprintf(stderr, "pdctl up: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!config) {
        fprintf(stderr, "pdctl up: --config FILE is required\n");
        return 2;
    }
    if (pdctl__config_abs("up", config, u.config) < 0)
        return 2;
    if (cluster_config_load(u.config, &u.cfg) != PD_OK)
        return 2; /* logged with file:line:col */
    u.timeout_s = (double)timeout_s;
    u.grace_ms = (int)grace_s * 1000;
    u.state_path = state_path;
    snprintf(u.st.config, sizeof u.st.config, "%s", u.config);
    u.st.owner_pid = u.detach ? 0 : (int)getpid();
    if (pdctl_state_path(u.config, ".state", state_path, sizeof state_path) != PD_OK ||
        pdctl_state_path(u.config, ".logs", u.log_dir, sizeof u.log_dir) != PD_OK) {
        fprintf(stderr, "pdctl up: state directory path too long\n");
        goto out_cfg;
    }
    if (log_dir)
        snprintf(u.log_dir, sizeof u.log_dir, "%s", log_dir);
    if (pdctl__up_check_tp(u.cfg) < 0 || pdctl__up_check_existing(state_path) < 0 ||
        pdctl__mkdirs(u.log_dir) < 0)
        goto out_cfg;
    pdctl__install_signals();

    /* prefill and decode nodes first, then the router */
    for (size_t i = 0; i < u.cfg->n_nodes; i++) {
        const cluster_node_t *nd = &u.cfg->nodes[i];
        if (!pdctl_host_is_local(nd->host)) {
            fprintf(stderr, "skipping %s: host %s is not this machine\n", nd->name, nd->host);
            continue;
        }
        if (pdctl__up_spawn(&u, nd->name, cluster_config_role_str(nd->role), nd->host, nd->port) <
            0)
            goto err_stop;
    }
    if (pdctl__up_wait(&u, 0) < 0)
        goto err_stop;
    from = u.st.n_procs;
    if (pdctl_host_is_local(u.cfg->router.listen_host)) {
        if (pdctl__up_spawn(&u, "router", "router", u.cfg->router.listen_host,
                            u.cfg->router.listen_port) < 0 ||
            pdctl__up_wait(&u, from) < 0)
            goto err_stop;
    } else
        fprintf(stderr, "skipping the router: host %s is not this machine\n",
                u.cfg->router.listen_host);
    if (u.st.n_procs == 0) {
        fprintf(stderr, "pdctl up: no node of %s is placed on this machine\n", u.config);
        pdctl_state_remove(state_path);
        goto out_cfg;
    }
    pdctl__up_table(&u);
    printf("cluster up\n");
    fflush(stdout);
    if (u.detach) {
        printf("state: %s (stop with: pdctl down --config %s)\n", state_path, u.config);
        rc = 0;
        goto out_cfg;
    }
    rc = pdctl__up_supervise(&u);
    pdctl_state_remove(state_path);
    goto out_cfg;

err_stop:
    pdctl__stop_all(&u.st, u.grace_ms, 0);
    pdctl_state_remove(state_path);
    rc = pdctl__got_stop ? 130 : 1;
out_cfg:
    cluster_config_destroy(u.cfg);
    pdctl_state_deinit(&u.st);
    return rc;
}

/* Signals a foreground `pdctl up` that still owns the cluster, so it exits too. */
static void pdctl__down_owner(int owner)
{
    char path[64], comm[64] = "";
    FILE *f;
    if (owner <= 0 || owner == (int)getpid())
        return;
    snprintf(path, sizeof path, "/proc/%d/comm", owner);
    f = fopen(path, "r");
    if (!f)
        return;
    if (!fgets(comm, sizeof comm, f))
        comm[0] = 0;
    fclose(f);
    if (strncmp(comm, "pdctl", 5) == 0)
        kill(owner, SIGTERM);
}

int pdctl_down(int argc, char **argv)
{
    const char *config = NULL;
    char abs[CLUSTER_PATH_MAX], state_path[CLUSTER_PATH_MAX];
    long grace_s = 10;
    pdctl_state_t st;
    pd_status_t s;
    int alive = 0, rc = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "pdctl down: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--config") == 0)
            config = v;
        else if (strcmp(a, "--grace-s") == 0) {
            if (pdctl__long("down", a, v, 0, 3600, &grace_s) < 0)
                return 2;
        } else {
            fprintf(stderr, "pdctl down: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!config) {
        fprintf(stderr, "pdctl down: --config FILE is required\n");
        return 2;
    }
    if (pdctl__config_abs("down", config, abs) < 0)
        return 2;
    if (pdctl_state_path(abs, ".state", state_path, sizeof state_path) != PD_OK) {
        fprintf(stderr, "pdctl down: state directory path too long\n");
        return 2;
    }
    pdctl_state_init(&st);
    s = pdctl_state_read(state_path, &st);
    if (s == PD_ERR_NOT_FOUND) {
        printf("cluster already down (no state file %s)\n", state_path);
        return 0;
    }
    if (s != PD_OK) {
        fprintf(stderr, "pdctl down: unreadable state file %s: removing it\n", state_path);
        pdctl_state_remove(state_path);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    for (size_t i = 0; i < st.n_procs; i++)
        alive += pdctl_proc_alive(&st.procs[i], NULL);
    if (alive == 0)
        printf("cluster already down (no process of %s is running)\n", state_path);
    else if (pdctl__stop_all(&st, (int)grace_s * 1000, 1) != PD_OK)
        rc = 1;
    pdctl__down_owner(st.owner_pid);
    pdctl_state_remove(state_path);
    if (alive && rc == 0)
        printf("cluster down (%d process(es) stopped)\n", alive);
    pdctl_state_deinit(&st);
    return rc;
}

/* ==== generate --router, models ==== */

typedef struct {
    int json;
    int32_t *ids;
    size_t n_ids, cap_ids;
    char *text;
    size_t n_text;
    char finish[32], request_id[128];
    uint32_t prompt_tokens, completion_tokens;
    int done, code;
    char msg[512];
    pd_grpc_client_call_t *call;
    uv_signal_t sig;
} pdctl_gen_t;

static void pdctl__gen_msg(void *arg, ProtobufCMessage *m)
{
    pdctl_gen_t *g = arg;
    Pdserve__V1__GenerateResponse *r = (void *)m;
    if (g->n_ids + r->n_token_ids > g->cap_ids) {
        size_t cap = (g->cap_ids ? 2 * g->cap_ids : 256) + r->n_token_ids;
        int32_t *ni = realloc(g->ids, cap * sizeof *ni);
        PD_ASSERT(ni);
        g->ids = ni;
        g->cap_ids = cap;
    }
    if (r->n_token_ids) /* the last message may have none: token_ids is NULL then */
        memcpy(g->ids + g->n_ids, r->token_ids, r->n_token_ids * sizeof *g->ids);
    g->n_ids += r->n_token_ids;
    if (r->text && *r->text) {
        size_t l = strlen(r->text);
        char *nt = realloc(g->text, g->n_text + l + 1);
        PD_ASSERT(nt);
        g->text = nt;
        memcpy(g->text + g->n_text, r->text, l + 1);
        g->n_text += l;
        if (!g->json) {
            fwrite(r->text, 1, l, stdout);
            fflush(stdout);
        }
    }
    if (r->finish_reason && *r->finish_reason)
        snprintf(g->finish, sizeof g->finish, "%s", r->finish_reason);
    if (r->request_id && *r->request_id)
        snprintf(g->request_id, sizeof g->request_id, "%s", r->request_id);
    if (r->usage) {
        g->prompt_tokens = r->usage->prompt_tokens;
        g->completion_tokens = r->usage->completion_tokens;
    }
    protobuf_c_message_free_unpacked(m, NULL);
}

static void pdctl__gen_done(void *arg, int code, const char *msg)
{
    pdctl_gen_t *g = arg;
    g->done = 1;
    g->code = code;
    g->call = NULL;
    snprintf(g->msg, sizeof g->msg, "%s", msg ? msg : "");
    uv_close((uv_handle_t *)&g->sig, NULL);
}

static void pdctl__gen_on_sigint(uv_signal_t *h, int signum)
{
    pdctl_gen_t *g = h->data;
    (void)signum;
    if (g->call)
        pd_grpc_client_call_cancel(g->call);
}

/* Connects to --router and runs one call on a private loop; the caller fills what it needs. */
static int pdctl__router_client(const char *cmd, const char *router, const pdctl_tls_t *tls,
                                uv_loop_t *loop, pd_grpc_client_t **c_p)
{
    char host[CLUSTER_HOST_MAX];
    int port;
    if (pdctl_host_parse_addr(router, host, sizeof host, &port) != PD_OK) {
        fprintf(stderr, "pdctl %s: --router '%s' is not HOST:PORT\n", cmd, router);
        return -1;
    }
    PD_ASSERT(uv_loop_init(loop) == 0);
    if (pd_grpc_client_create(loop, pdctl_host_connect_name(host), port, c_p) != PD_OK) {
        fprintf(stderr, "pdctl %s: out of memory\n", cmd);
        uv_loop_close(loop);
        return -1;
    }
    pd_grpc_client_set_max_recv(*c_p, 64u << 20);
    if (pdctl_tls_apply(cmd, tls, *c_p) != 0) {
        pd_grpc_client_destroy(*c_p);
        uv_run(loop, UV_RUN_DEFAULT);
        uv_loop_close(loop);
        return -1;
    }
    return 0;
}

static void pdctl__router_close(uv_loop_t *loop, pd_grpc_client_t *c)
{
    pd_grpc_client_destroy(c);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
}

static void pdctl__gen_json(const pdctl_gen_t *g)
{
    json_t *ids = json_array(), *o;
    for (size_t i = 0; i < g->n_ids; i++)
        json_array_append_new(ids, json_integer(g->ids[i]));
    o = json_pack("{s:s, s:o, s:s, s:s, s:{s:I, s:I}}", "request_id", g->request_id, "output_ids",
                  ids, "text", g->text ? g->text : "", "finish_reason", g->finish, "usage",
                  "prompt_tokens", (json_int_t)g->prompt_tokens, "completion_tokens",
                  (json_int_t)g->completion_tokens);
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    printf("%s\n", s);
    free(s);
    json_decref(o);
}

int pdctl_generate_router(int argc, char **argv)
{
    Pdserve__V1__GenerateRequest req = PDSERVE__V1__GENERATE_REQUEST__INIT;
    Pdserve__V1__SamplingParams sp = PDSERVE__V1__SAMPLING_PARAMS__INIT;
    const char *router = NULL, *prompt = NULL;
    char *stops[64];
    long max_tokens = 16, timeout_ms = 0, top_k = 0;
    pdctl_gen_t g;
    uv_loop_t loop;
    pd_grpc_client_t *c;
    pdctl_tls_t tls;
    int rc = 1;

    pdctl_tls_init(&tls);
    memset(&g, 0, sizeof g);
    req.sampling = &sp;
    sp.stop = stops;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) {
            g.json = 1;
            continue;
        }
        if (strcmp(a, "--ignore-eos") == 0) {
            sp.ignore_eos = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "pdctl generate: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (pdctl_tls_opt(&tls, a, v))
            continue;
        if (strcmp(a, "--router") == 0)
            router = v;
        else if (strcmp(a, "--prompt") == 0)
            prompt = v;
        else if (strcmp(a, "--request-id") == 0)
            req.request_id = (char *)v;
        else if (strcmp(a, "--max-tokens") == 0) {
            if (pdctl__long("generate", a, v, 1, INT32_MAX, &max_tokens) < 0)
                return 2;
        } else if (strcmp(a, "--temperature") == 0)
            sp.temperature = strtof(v, NULL);
        else if (strcmp(a, "--top-p") == 0)
            sp.top_p = strtof(v, NULL);
        else if (strcmp(a, "--top-k") == 0) {
            if (pdctl__long("generate", a, v, 0, INT32_MAX, &top_k) < 0)
                return 2;
        } else if (strcmp(a, "--seed") == 0)
            sp.seed = strtoull(v, NULL, 10);
        else if (strcmp(a, "--stop") == 0) {
            if (sp.n_stop >= 64) {
                fprintf(stderr, "pdctl generate: at most 64 --stop strings\n");
                return 2;
            }
            stops[sp.n_stop++] = (char *)v;
        } else if (strcmp(a, "--timeout-ms") == 0) {
            if (pdctl__long("generate", a, v, 1, INT32_MAX, &timeout_ms) < 0)
                return 2;
        } else {
            fprintf(stderr, "pdctl generate: unknown option '%s' (with --router)\n", a);
            return 2;
        }
    }
    if (!prompt) {
        fprintf(stderr, "pdctl generate: --prompt TEXT is required\n");
        return 2;
    }
    sp.max_tokens = (uint32_t)max_tokens;
    sp.top_k = (int32_t)top_k;
    req.text = (char *)prompt;
    signal(SIGPIPE, SIG_IGN);
    if (pdctl__router_client("generate", router, &tls, &loop, &c) < 0)
        return 2;
    uv_signal_init(&loop, &g.sig);
    g.sig.data = &g;
    uv_signal_start(&g.sig, pdctl__gen_on_sigint, SIGINT);
    if (pd_grpc_client_stream(c, "/pdserve.v1.Inference/Generate", &req.base,
                              &pdserve__v1__generate_response__descriptor, timeout_ms,
                              pdctl__gen_msg, pdctl__gen_done, &g, &g.call) != PD_OK) {
        fprintf(stderr, "pdctl generate: cannot start the call\n");
        uv_close((uv_handle_t *)&g.sig, NULL);
        goto out;
    }
    char bearer[520]; /* the router's API key, when it wants one */
    pdctl_bearer("PDSERVE_API_KEY", bearer, sizeof bearer);
    if (bearer[0])
        (void)pd_grpc_client_call_add_metadata(g.call, "authorization", bearer);
    while (!g.done)
        uv_run(&loop, UV_RUN_ONCE);
    if (!g.json && g.n_text)
        printf("\n");
    if (g.code != PD_GRPC_OK) {
        fflush(stdout);
        fprintf(stderr, "pdctl generate: %s: %s\n", pd_grpc_wire_code_name(g.code),
                g.msg[0] ? g.msg : "(no message)");
        rc = g.code == PD_GRPC_CANCELLED ? 130 : 1;
        goto out;
    }
    if (g.json)
        pdctl__gen_json(&g);
    rc = 0;
out:
    pdctl__router_close(&loop, c);
    free(g.ids);
    free(g.text);
    return rc;
}

int pdctl_models(int argc, char **argv)
{
    Pdserve__V1__ModelInfoRequest req = PDSERVE__V1__MODEL_INFO_REQUEST__INIT;
    const char *router = NULL;
    long timeout_ms = 5000;
    pdctl_rpc_t r;
    char host[CLUSTER_HOST_MAX];
    int port, rc = 1;
    pdctl_tls_t tls;

    pdctl_tls_init(&tls);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "pdctl models: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (pdctl_tls_opt(&tls, a, v))
            continue;
        if (strcmp(a, "--router") == 0)
            router = v;
        else if (strcmp(a, "--timeout-ms") == 0) {
            if (pdctl__long("models", a, v, 1, INT32_MAX, &timeout_ms) < 0)
                return 2;
        } else {
            fprintf(stderr, "pdctl models: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!router || pdctl_host_parse_addr(router, host, sizeof host, &port) != PD_OK) {
        fprintf(stderr, "pdctl models: --router HOST:PORT is required\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    memset(&r, 0, sizeof r);
    r.host = pdctl_host_connect_name(host);
    r.port = port;
    r.path = "/pdserve.v1.Inference/GetModelInfo";
    r.req = &req.base;
    r.desc = &pdserve__v1__model_info__descriptor;
    r.timeout_ms = timeout_ms;
    r.tls = &tls;
    char api_key[520]; /* the router's API key, when it wants one */
    pdctl_bearer("PDSERVE_API_KEY", api_key, sizeof api_key);
    r.bearer = api_key;
    pdctl__rpc_run(&r, 1);
    if (r.code != PD_GRPC_OK) {
        fprintf(stderr, "pdctl models: %s: %s\n", pd_grpc_wire_code_name(r.code),
                r.msg[0] ? r.msg : "(no message)");
        return 1;
    }
    const Pdserve__V1__ModelInfo *m = (const void *)r.resp;
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:I, s:s, s:s, s:s, s:s, s:I}", "model_name", m->model_name,
                  "architecture", m->architecture, "context_length", (json_int_t)m->context_length,
                  "vocab_size", (json_int_t)m->vocab_size, "prefill_weights", m->prefill_weights,
                  "prefill_kv", m->prefill_kv, "decode_weights", m->decode_weights, "decode_kv",
                  m->decode_kv, "page_tokens", (json_int_t)m->page_tokens);
    if (o) {
        char *s = json_dumps(o, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(o);
        rc = 0;
    }
    pdctl__rpc_free(&r);
    return rc;
}
