#include "node_main.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "drain.h"
#include "log.h"
#include "node.h"
#include "node_join.h"

/* drain callbacks: the node is set once it exists (a signal while it starts stops at once) */
typedef struct {
    const node_main_ops_t *ops;
    void *node;
    node_join_t *join; /* --join: registered with a router */
} node_main__t;

static void node_main__drain(void *arg)
{
    node_main__t *m = arg;
    node_join_leave(m->join); /* the router sends no more work, then the node drains */
    m->ops->drain(m->node);
}

static int node_main__busy(void *arg)
{
    node_main__t *m = arg;
    return m->ops->busy(m->node);
}

int node_main(int argc, char **argv, const node_main_ops_t *ops)
{
    pd_args_t args;
    cluster_config_t *cfg = NULL;
    const cluster_node_t *node;
    uv_loop_t loop;
    pd_drain_t drain;
    node_main__t m;
    void *n = NULL;
    int rc = 1;

    memset(&m, 0, sizeof m);
    m.ops = ops;
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
    if (node_check_tp(cfg, node) != PD_OK) /* logged: refuse at start, not after loading */
        goto out;
    if (cfg->transport.ucx_tls[0])
        setenv("UCX_TLS", cfg->transport.ucx_tls, 0);
    if (node_cluster_token_load(cfg) != PD_OK) /* logged */
        goto out;
    uv_loop_init(&loop);
    if (ops->create(&loop, cfg, node, &n) != PD_OK) {
        pd_log_error("%s: cannot start", args.node);
        uv_loop_close(&loop);
        goto out;
    }
    m.node = n;
    if (args.join && node_join_create(&loop, args.join, node, args.join_name, &m.join) != PD_OK) {
        ops->destroy(n);
        uv_run(&loop, UV_RUN_DEFAULT);
        (void)uv_loop_close(&loop);
        goto out;
    }
    if (pd_drain_init(&drain, &loop, cfg->router.request_timeout_ms, node_main__drain,
                      node_main__busy, &m) != PD_OK) {
        node_join_destroy(m.join);
        ops->destroy(n);
        uv_run(&loop, UV_RUN_DEFAULT);
        (void)uv_loop_close(&loop);
        goto out;
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    rc = ops->failed(n) ? 1 : 0;
    pd_drain_deinit(&drain);
    node_join_destroy(m.join); /* a DeregisterNode in flight finishes in the run below */
    ops->destroy(n);
    uv_run(&loop, UV_RUN_DEFAULT); /* let closing handles and draining calls finish */
    if (uv_loop_close(&loop) != 0)
        pd_log_warn("loop still has handles at exit");
    pd_log_info("stopped");
out:
    cluster_config_destroy(cfg);
    return rc;
}
