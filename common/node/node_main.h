/* node_main: the main() of prefill-node and decode-node (they differ only in the node object):
 *   NAME --config FILE --node NODE [--set KEY=VALUE ...] [--log-level debug|info|warn|error]
 * Loads the cluster file, applies overrides, checks that NODE has the binary's role, exports
 * transport.ucx_tls as UCX_TLS (unless already set), runs the node on a libuv loop, and returns
 * the exit status. SIGTERM / SIGINT drain: the node stops taking new work (health NOT_SERVING)
 * and the process exits once its running requests are done, or after router.request_timeout_ms
 * (no request may run longer); a second signal stops at once. The binary passes its node as
 * ops, so this module knows nothing of either node.
 */
#ifndef PD_NODE_MAIN_H
#define PD_NODE_MAIN_H

#include <uv.h>

#include "cluster_config.h"

typedef struct {
    cluster_role_t role;
    /* starts the node on loop (its control server, compute thread); PD_OK or an error (logged) */
    pd_status_t (*create)(uv_loop_t *loop, const cluster_config_t *cfg, const cluster_node_t *node,
                          void **node_p);
    /* stops and frees it; accepts NULL */
    void (*destroy)(void *node);
    /* nonzero when the node failed (loading the model): the process exits 1 */
    int (*failed)(const void *node);
    /* stop taking new work; running requests go on */
    void (*drain)(void *node);
    /* requests still running (0: the process may exit) */
    int (*busy)(void *node);
} node_main_ops_t;

int node_main(int argc, char **argv, const node_main_ops_t *ops);

#endif
