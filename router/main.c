/* router: the front of a pdserve cluster (see router.h).
 *   router --config FILE [--set router.KEY=VALUE ...] [--log-level debug|info|warn|error]
 * (flags: common/base/args.h) */
#include <signal.h>

#include <uv.h>

#include "args.h"
#include "drain.h"
#include "cluster_config.h"
#include "log.h"
#include "notify.h"
#include "router.h"
#include "router_grpc.h"
#include "router_http.h"

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
    uv_loop_t loop;
    pd_drain_t drain;
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    if (pd_args_parse(argc, argv, false, &args) != PD_OK)
        return 2;
    if (cluster_config_load_args(&args, "router", &cfg) != PD_OK)
        return 1;
    uv_loop_init(&loop);
    if (router_create(&loop, cfg, &core) != PD_OK ||
        router_grpc_create(core, &loop, cfg->router.listen_host, cfg->router.listen_port, &grpc) !=
            PD_OK ||
        (cfg->router.http_port > 0 && router_http_create(core, &loop, cfg->router.http_host,
                                                         cfg->router.http_port, &http) != PD_OK))
        goto out;
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
    router_http_destroy(http);
    router_grpc_destroy(grpc);
    router_destroy(core);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0)
        pd_log_warn("loop still has handles at exit");
    if (rc == 0)
        pd_log_info("stopped");
    cluster_config_destroy(cfg);
    return rc;
}
