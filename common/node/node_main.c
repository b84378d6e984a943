#include "node_main.h"

#include <signal.h>
#include <stdlib.h>

#include "args.h"
#include "log.h"

static void node_main__signal(uv_signal_t *h, int signum)
{
    pd_log_info("signal %d: shutting down", signum);
    uv_stop(h->loop);
}

int node_main(int argc, char **argv, const node_main_ops_t *ops)
{
    pd_args_t args;
    cluster_config_t *cfg = NULL;
    const cluster_node_t *node;
    uv_loop_t loop;
    uv_signal_t sigint, sigterm;
    void *n = NULL;
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    if (pd_args_parse(argc, argv, true, &args) != PD_OK)
        return 2;
    if (cluster_config_load_args(&args, args.node, &cfg) != PD_OK)
        return 1;
    if (!(node = cluster_config_find_node(cfg, args.node))) {
        pd_log_error("%s: no node named '%s'", cfg->source, args.node);
        goto out;
    }
    if (node->role != ops->role) {
        pd_log_error("%s: node '%s' is a %s node, not a %s node", cfg->source, args.node,
                     cluster_config_role_str(node->role), cluster_config_role_str(ops->role));
        goto out;
    }
    if (cfg->transport.ucx_tls[0])
        setenv("UCX_TLS", cfg->transport.ucx_tls, 0);
    uv_loop_init(&loop);
    if (ops->create(&loop, cfg, node, &n) != PD_OK) {
        pd_log_error("%s: cannot start", args.node);
        uv_loop_close(&loop);
        goto out;
    }
    uv_signal_init(&loop, &sigint);
    uv_signal_init(&loop, &sigterm);
    uv_signal_start(&sigint, node_main__signal, SIGINT);
    uv_signal_start(&sigterm, node_main__signal, SIGTERM);
    uv_run(&loop, UV_RUN_DEFAULT);
    rc = ops->failed(n) ? 1 : 0;
    uv_signal_stop(&sigint);
    uv_signal_stop(&sigterm);
    uv_close((uv_handle_t *)&sigint, NULL);
    uv_close((uv_handle_t *)&sigterm, NULL);
    ops->destroy(n);
    uv_run(&loop, UV_RUN_DEFAULT); /* let closing handles and draining calls finish */
    if (uv_loop_close(&loop) != 0)
        pd_log_warn("loop still has handles at exit");
    pd_log_info("stopped");
out:
    cluster_config_destroy(cfg);
    return rc;
}
