/* node_main: the main() of prefill-node and decode-node (they differ only in role):
 *   NAME --config FILE --node NODE [--set KEY=VALUE ...] [--log-level debug|info|warn|error]
 * Loads the cluster file, applies overrides, exports transport.ucx_tls as UCX_TLS (unless already
 * set), runs the node on a libuv loop until SIGINT/SIGTERM, and returns the exit status.
 */
#ifndef PD_NODE_MAIN_H
#define PD_NODE_MAIN_H

#include "cluster_config.h"

int node_main(int argc, char **argv, cluster_role_t role);

#endif
