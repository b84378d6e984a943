/* node_join: a node started with --join ROUTER_HOST:PORT registers itself with that router's
 * pdserve.v1.Cluster service (RegisterNode: name, role, host:port of its control server, page
 * size), then again every NODE_JOIN_REFRESH_MS (so a router that restarted learns it back; a
 * router that is down is retried every NODE_JOIN_RETRY_MS). The router health-checks the node
 * before it sends it work. On drain, node_join_leave() stops that and sends DeregisterNode once.
 * The node's own entry (role, formats, budget) comes from its cluster file as usual; the router's
 * file need not name it. When the router wants the ops token (router_auth.h), the calls carry
 * "authorization: Bearer TOKEN" from $PDSERVE_OPS_TOKEN or the file $PDSERVE_OPS_TOKEN_FILE.
 * With $PDSERVE_TLS_CA set (a PEM CA file) the node speaks TLS to the router (its public port with
 * router.tls_cert), verifying the certificate against that CA and the name
 * $PDSERVE_TLS_SERVER_NAME (default: the host of ROUTER_HOST:PORT), ALPN h2.
 *
 * Loop thread only; main() owns the object.
 */
#ifndef PD_NODE_JOIN_H
#define PD_NODE_JOIN_H

#include <uv.h>

#include "cluster_config.h"
#include "status.h"

#define NODE_JOIN_REFRESH_MS 5000
#define NODE_JOIN_RETRY_MS 1000

typedef struct node_join node_join_t;

/* Starts registering node (copied) with the router at router_addr ("HOST:PORT"), under name (NULL:
 * node->name; the replicas of one template entry each give their own, e.g. the pod name).
 * PD_ERR_INVALID (logged) for an address that is not HOST:PORT or a name too long,
 * PD_ERR_IO (logged) when $PDSERVE_TLS_CA cannot be read, PD_ERR_NOMEM; nothing started on
 * failure. */
pd_status_t node_join_create(uv_loop_t *loop, const char *router_addr, const cluster_node_t *node,
                             const char *name, node_join_t **j_p);

/* The node drains: no more registrations; DeregisterNode is sent once (best effort). */
void node_join_leave(node_join_t *j);

/* Stops; a DeregisterNode still in flight is let finish (at most 1 s) while the caller runs the
 * loop to close its handles. Accepts NULL. */
void node_join_destroy(node_join_t *j);

#endif
