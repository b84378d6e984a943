#include "router_auth.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "clock.h"
#include "grpc_wire.h"
#include "log.h"

#define ROUTER_AUTH_MAX_KEYS 256
#define ROUTER_AUTH_KEY_MAX 255

enum { NEED_NONE = 0, NEED_API = 1, NEED_OPS = 2 };

struct router_auth {
    router_t *core;
    char *keys[ROUTER_AUTH_MAX_KEYS]; /* API keys */
    int n_keys;
    char *ops;               /* the ops token, NULL: none */
    uint64_t failures[2][3]; /* [grpc, http][need] */
    int64_t last_log_ms;
    uint64_t unlogged;
};

/* Constant time in the length of the longer string. */
static int router_auth__equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), n = la > lb ? la : lb;
    unsigned diff = (unsigned)(la ^ lb);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned)((i < la ? (unsigned char)a[i] : 0) ^ (i < lb ? (unsigned char)b[i] : 0));
    return diff == 0;
}

/* The token of an "Authorization: Bearer TOKEN" value, or NULL. */
static const char *router_auth__bearer(const char *v)
{
    if (!v || strncasecmp(v, "bearer ", 7) != 0)
        return NULL;
    v += 7;
    while (*v == ' ')
        v++;
    return *v ? v : NULL;
}

static int router_auth__check(router_auth_t *a, int need, const char *token)
{
    if (need == NEED_NONE)
        return 1;
    if (need == NEED_OPS)
        return !a->ops || (token && router_auth__equal(token, a->ops));
    if (!a->n_keys)
        return 1;
    int ok = 0;
    for (int i = 0; i < a->n_keys; i++) /* no early exit: the time does not tell which key */
        ok |= token && router_auth__equal(token, a->keys[i]);
    return ok;
}

static void router_auth__fail(router_auth_t *a, int api, int need, const char *what,
                              const char *token)
{
    int64_t now = pd_clock_ms();
    a->failures[api][need]++;
    if (now - a->last_log_ms < 1000) {
        a->unlogged++;
        return;
    }
    pd_log_warn("auth: %s %s: %s credentials (%s)%s", api ? "http" : "grpc", what,
                token ? "wrong" : "missing", need == NEED_OPS ? "ops token" : "api key",
                a->unlogged ? "; more refused since the last message" : "");
    a->last_log_ms = now;
    a->unlogged = 0;
}

static int router_auth__grpc(const pd_grpc_call_t *call, const char *path, void *arg,
                             const char **why_p)
{
    router_auth_t *a = arg;
    int need = strncmp(path, "/grpc.health.v1.", 16) == 0       ? NEED_NONE
               : strncmp(path, "/pdserve.v1.Cluster/", 20) == 0 ? NEED_OPS
                                                                : NEED_API;
    const char *token = router_auth__bearer(pd_grpc_call_metadata(call, "authorization"));
    if (router_auth__check(a, need, token))
        return 0;
    router_auth__fail(a, 0, need, path, token);
    *why_p = need == NEED_OPS ? "this method needs the ops token (authorization: Bearer TOKEN)"
                              : "missing or invalid API key (authorization: Bearer KEY)";
    return PD_GRPC_UNAUTHENTICATED;
}

static int router_auth__http(const pd_http_request_t *req, void *arg, const char **why_p)
{
    router_auth_t *a = arg;
    const char *path = pd_http_request_path(req);
    int need =
        strcmp(path, "/live") == 0 || strcmp(path, "/ready") == 0 || strcmp(path, "/health") == 0
            ? NEED_NONE
        : strcmp(path, "/metrics") == 0 ? NEED_OPS
                                        : NEED_API;
    const char *token = router_auth__bearer(pd_http_request_header(req, "authorization"));
    if (router_auth__check(a, need, token))
        return 0;
    router_auth__fail(a, 1, need, path, token);
    *why_p = need == NEED_OPS ? "this endpoint needs the ops token (Authorization: Bearer TOKEN)"
                              : "missing or invalid API key (Authorization: Bearer KEY)";
    return 401;
}

static void router_auth__metrics(void *arg, metrics_t *m)
{
    router_auth_t *a = arg;
    static const char *apis[] = {"grpc", "http"}, *needs[] = {"none", "api_key", "ops_token"};
    for (int api = 0; api < 2; api++)
        for (int need = NEED_API; need <= NEED_OPS; need++) {
            const char *labels[] = {"api", apis[api], "need", needs[need], NULL};
            metrics_counter_put_total(m, "pdserve_router_auth_failures_total",
                                      "requests refused for missing or wrong credentials", labels,
                                      a->failures[api][need]);
        }
}

/* Reads the non-empty, non-comment lines of path into out (at most max); returns how many, or -1
 * (logged). */
static int router_auth__read(const char *path, char **out, int max)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    if (!f) {
        pd_log_error("%s: cannot read", path);
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        char *s = line, *e;
        while (isspace((unsigned char)*s))
            s++;
        e = s + strlen(s);
        while (e > s && isspace((unsigned char)e[-1]))
            *--e = 0;
        if (!*s || *s == '#')
            continue;
        if (e - s > ROUTER_AUTH_KEY_MAX || strpbrk(s, " \t") || n == max) {
            pd_log_error("%s: a key has spaces, is longer than %d bytes, or there are more than %d",
                         path, ROUTER_AUTH_KEY_MAX, max);
            goto fail;
        }
        if (!(out[n] = strdup(s)))
            goto fail;
        n++;
    }
    fclose(f);
    if (n == 0) {
        pd_log_error("%s: no key in the file", path);
        return -1;
    }
    return n;
fail:
    fclose(f);
    while (n > 0)
        free(out[--n]);
    return -1;
}

pd_status_t router_auth_create(router_t *core, const cluster_router_t *rc, router_auth_t **a_p)
{
    router_auth_t *a;
    char *ops[1];

    if (!rc->api_keys_file[0] && !rc->ops_token_file[0]) {
        *a_p = NULL;
        return PD_OK;
    }
    if (!(a = calloc(1, sizeof *a)))
        return PD_ERR_NOMEM;
    a->core = core;
    a->last_log_ms = -1000000;
    if (rc->api_keys_file[0] &&
        (a->n_keys = router_auth__read(rc->api_keys_file, a->keys, ROUTER_AUTH_MAX_KEYS)) < 0) {
        a->n_keys = 0;
        router_auth_destroy(a);
        return PD_ERR_FORMAT;
    }
    if (rc->ops_token_file[0]) {
        if (router_auth__read(rc->ops_token_file, ops, 1) != 1) {
            router_auth_destroy(a);
            return PD_ERR_FORMAT;
        }
        a->ops = ops[0];
    }
    if (a->n_keys && !a->ops)
        pd_log_warn("auth: API keys set but no router.ops_token_file: pdserve.v1.Cluster (drain, "
                    "node registration) and /metrics are open");
    (void)router_add_metrics_source(core, router_auth__metrics, a);
    pd_log_info("auth: %d API key(s), ops token %s", a->n_keys, a->ops ? "set" : "not set");
    *a_p = a;
    return PD_OK;
}

void router_auth_attach(router_auth_t *a, pd_grpc_server_t *grpc, pd_http_server_t *http)
{
    if (!a)
        return;
    if (grpc)
        pd_grpc_server_set_auth(grpc, router_auth__grpc, a);
    if (http)
        pd_http_server_set_auth(http, router_auth__http, a);
}

void router_auth_destroy(router_auth_t *a)
{
    if (!a)
        return;
    router_remove_metrics_source(a->core, router_auth__metrics, a);
    for (int i = 0; i < a->n_keys; i++)
        free(a->keys[i]);
    free(a->ops);
    free(a);
}
