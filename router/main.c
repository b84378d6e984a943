/* router: the front of a pdserve cluster (see router.h).
 *   router --config FILE [--set router.KEY=VALUE ...] [--log-level debug|info|warn|error]
 * (flags: common/base/args.h) */
#include <signal.h>
#include <string.h>

#include <uv.h>

#include "args.h"
#include "drain.h"
#include "cluster_config.h"
#include "log.h"
#include "notify.h"
#include "router.h"
#include "router_grpc.h"
#include "router_http.h"
#include "router_auth.h"
#include "tls_proxy.h"

/* SIGTERM / SIGINT: drain (common/base/drain.h): no new requests, running ones finish (at most
 * router.request_timeout_ms, which no request may outlive), then stop; again: stop at once. */
static void on_drain(void *core)
{
    router_drain(core);
}

static int on_busy(void *core)
{
    return router_busy(core);
}

int main(int argc, char **argv)
{
    pd_args_t args;
    cluster_config_t *cfg = NULL;
    router_t *core = NULL;
    router_grpc_t *grpc = NULL;
    router_http_t *http = NULL;
    router_auth_t *auth = NULL;
    pd_tls_proxy_t *tls_grpc = NULL, *tls_http = NULL;
    uv_loop_t loop;
    pd_drain_t drain;
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    if (pd_args_parse(argc, argv, false, &args) != PD_OK)
        return 2;
    if (cluster_config_load_args(&args, "router", &cfg) != PD_OK)
        return 1;
    uv_loop_init(&loop);
    /* with TLS the servers listen on loopback behind TLS proxies on the public addresses */
    const cluster_router_t *rc_ = &cfg->router;
    int tls = rc_->tls_cert[0] && rc_->tls_key[0];
    if (!tls != !(rc_->tls_cert[0] || rc_->tls_key[0])) {
        pd_log_error("%s: router.tls_cert and router.tls_key go together", cfg->source);
        goto out;
    }
    if (router_create(&loop, cfg, &core) != PD_OK ||
        router_auth_create(core, rc_, &auth) != PD_OK ||
        router_grpc_create(core, &loop,
                           !tls                ? rc_->listen_host
                           : rc_->control_port ? rc_->control_host
                                               : "127.0.0.1",
                           !tls ? rc_->listen_port : rc_->control_port, &grpc) != PD_OK ||
        (rc_->http_port > 0 && router_http_create(core, &loop, tls ? "127.0.0.1" : rc_->http_host,
                                                  tls ? 0 : rc_->http_port, &http) != PD_OK))
        goto out;
    router_auth_attach(auth, router_grpc_server(grpc), http ? router_http_server(http) : NULL);
    if (tls) {
        pd_tls_params_t h2 = {rc_->tls_cert, rc_->tls_key, "h2"};
        pd_tls_params_t h1 = {rc_->tls_cert, rc_->tls_key, "http/1.1"};
        const char *plain = !rc_->control_port || strcmp(rc_->control_host, "0.0.0.0") == 0
                                ? "127.0.0.1"
                                : rc_->control_host;
        if (pd_tls_proxy_create(&loop, &h2, rc_->listen_host, rc_->listen_port, plain,
                                router_grpc_port(grpc), &tls_grpc) != PD_OK ||
            (http && pd_tls_proxy_create(&loop, &h1, rc_->http_host, rc_->http_port, "127.0.0.1",
                                         router_http_port(http), &tls_http) != PD_OK))
            goto out;
        pd_log_info("router: TLS on %s:%d (gRPC, h2)%s%s:%d", rc_->listen_host, rc_->listen_port,
                    http ? " and https://" : "", http ? rc_->http_host : "",
                    http ? rc_->http_port : 0);
    }
    if (pd_drain_init(&drain, &loop, cfg->router.request_timeout_ms, on_drain, on_busy, core) !=
        PD_OK)
        goto out;
    /* systemd Type=notify: the router is ready once it listens (nodes come and go behind it) */
    pd_notify_ready("listening");
    uv_run(&loop, UV_RUN_DEFAULT);
    pd_drain_deinit(&drain);
    rc = 0;
out:
    router_stop(core); /* requests in flight end with UNAVAILABLE while the front ends are up */
    pd_tls_proxy_destroy(tls_http);
    pd_tls_proxy_destroy(tls_grpc);
    router_http_destroy(http);
    router_grpc_destroy(grpc);
    router_auth_destroy(auth);
    router_destroy(core);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0)
        pd_log_warn("loop still has handles at exit");
    if (rc == 0)
        pd_log_info("stopped");
    cluster_config_destroy(cfg);
    return rc;
}
