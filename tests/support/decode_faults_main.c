/* decode-node-faults: decode-node with the test hooks of decode_faults.h (faults chosen by
 * PDSERVE_FAULT / PDSERVE_FAULT_REQUEST). A test build: never installed, never deployed.
 *   decode-node-faults --config FILE --node NAME [--set KEY=VALUE ...] [--log-level LEVEL] */
#include "decode_faults.h"
#include "decode_node.h"
#include "node_main.h"

static decode_node_hooks_t hooks;

static pd_status_t faults__create(uv_loop_t *loop, const cluster_config_t *cfg,
                                  const cluster_node_t *node, void **node_p)
{
    pd_status_t st = decode_faults_hooks_from_env(&hooks);
    if (st != PD_OK)
        return st;
    return decode_node_create(loop, cfg, node, &hooks, NULL, (decode_node_t **)node_p);
}

static void faults__destroy(void *n)
{
    decode_node_destroy(n);
}

static int faults__failed(const void *n)
{
    return n && decode_node_failed(n);
}

static void faults__drain(void *n)
{
    decode_node_drain(n);
}

static int faults__busy(void *n)
{
    return decode_node_busy(n);
}

int main(int argc, char **argv)
{
    static const node_main_ops_t ops = {CLUSTER_ROLE_DECODE, faults__create, faults__destroy,
                                        faults__failed,      faults__drain,  faults__busy};
    return node_main(argc, argv, &ops);
}
