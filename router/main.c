/* router: the front of a pdserve cluster (see router.h).
 *   router --config FILE [--set router.KEY=VALUE ...] [--log-level debug|info|warn|error]
 * (flags: common/base/args.h) */
#include <signal.h>

#include <uv.h>

#include "args.h"
#include "cluster_config.h"
#include "log.h"
#include "router.h"
#include "router_grpc.h"
#include "router_http.h"

static void on_signal(uv_signal_t *h, int signum)
{
    pd_log_info("signal %d: shutting down", signum);
    uv_stop(h->loop);
}

int main(int argc, char **argv)
{
    pd_args_t args;
    cluster_config_t *cfg = NULL;
    router_t *core = NULL;
    router_grpc_t *grpc = NULL;
    router_http_t *http = NULL;
    uv_loop_t loop;
    uv_signal_t s1, s2;
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
    uv_signal_init(&loop, &s1);
    uv_signal_init(&loop, &s2);
    uv_signal_start(&s1, on_signal, SIGINT);
    uv_signal_start(&s2, on_signal, SIGTERM);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&s1, NULL);
    uv_close((uv_handle_t *)&s2, NULL);
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
