/* decode-node: a decode node of a pdserve cluster (see decode_node.h).
 *   decode-node --config FILE --node NAME [--set KEY=VALUE ...] [--log-level LEVEL] */
#include "node_main.h"
#include "decode_node.h"

static pd_status_t decode__create(uv_loop_t *loop, const cluster_config_t *cfg,
                                  const cluster_node_t *node, void **node_p)
{
    return decode_node_create(loop, cfg, node, NULL, NULL, (decode_node_t **)node_p);
}

static void decode__destroy(void *n)
{
    decode_node_destroy(n);
}

static int decode__failed(const void *n)
{
    return n && decode_node_failed(n);
}

static void decode__drain(void *n)
{
    decode_node_drain(n);
}

static int decode__busy(void *n)
{
    return decode_node_busy(n);
}

int main(int argc, char **argv)
{
    static const node_main_ops_t ops = {CLUSTER_ROLE_DECODE, decode__create, decode__destroy,
                                        decode__failed, decode__drain, decode__busy};
    return node_main(argc, argv, &ops);
}
