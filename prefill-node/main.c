/* prefill-node: a prefill node of a pdserve cluster (see prefill_node.h).
 *   prefill-node --config FILE --node NAME [--set KEY=VALUE ...] [--log-level LEVEL] */
#include "node_main.h"
#include "prefill_node.h"

static pd_status_t prefill__create(uv_loop_t *loop, const cluster_config_t *cfg,
                                   const cluster_node_t *node, void **node_p)
{
    return prefill_node_create(loop, cfg, node, NULL, (prefill_node_t **)node_p);
}

static void prefill__destroy(void *n)
{
    prefill_node_destroy(n);
}

static int prefill__failed(const void *n)
{
    return n && prefill_node_failed(n);
}

static void prefill__drain(void *n)
{
    prefill_node_drain(n);
}

static int prefill__busy(void *n)
{
    return prefill_node_busy(n);
}

int main(int argc, char **argv)
{
    static const node_main_ops_t ops = {CLUSTER_ROLE_PREFILL, prefill__create, prefill__destroy,
                                        prefill__failed, prefill__drain, prefill__busy};
    return node_main(argc, argv, &ops);
}
