/* router_control: the router's pdserve.v1.Cluster service (membership and maintenance), added to
 * the gRPC server of the router's front end: Register / Deregister (nodes that join or leave a
 * running cluster), Drain (pdctl drain / undrain) and ListNodes (the router's node table with each
 * node's state). It calls the core's router_node_* functions (router.h).
 *
 * Loop thread only.
 */
#ifndef PD_ROUTER_CONTROL_H
#define PD_ROUTER_CONTROL_H

#include "grpc_server.h"
#include "pdserve.pb-c.h"
#include "router.h"
#include "status.h"

/* Adds the Cluster service for core to srv (before it listens). PD_OK or what
 * pd_grpc_server_add_service returns. */
pd_status_t router_control_add(router_t *core, pd_grpc_server_t *srv);

/* The state of node info as ClusterNode.state names it ("joining", "serving", "down", "draining",
 * "drained", "left"). */
const char *router_control_state(const router_node_info_t *info);

#endif
