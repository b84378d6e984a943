/* router_grpc: the router's gRPC front end. It serves pdserve.v1.Inference (Generate, Abort,
 * GetModelInfo, Tokenize), pdserve.v1.Cluster (router_control.h) and grpc.health.v1.Health on its
 * own gRPC server, on top of a router core (router.h): Generate starts a core request whose output
 * streams back under flow control (pd_grpc_stream_buf); the health status ("" and
 * "pdserve.v1.Inference") follows the core's serving state. Text (Generate's and Tokenize's prompt,
 * the text Generate streams) is carried as bytes, NUL bytes included. A Generate whose request_id
 * names a running request: ALREADY_EXISTS.
 *
 * Loop thread only.
 */
#ifndef PD_ROUTER_GRPC_H
#define PD_ROUTER_GRPC_H

#include <uv.h>

#include "grpc_server.h"
#include "router.h"
#include "status.h"

typedef struct router_grpc router_grpc_t;

/* Serves core on host:port (port 0: an ephemeral port, see router_grpc_port). The core must
 * outlive the front end. Returns PD_OK, PD_ERR_IO / PD_ERR_INVALID (the address), PD_ERR_NOMEM;
 * nothing is left behind on failure. */
pd_status_t router_grpc_create(router_t *core, uv_loop_t *loop, const char *host, int port,
                               router_grpc_t **api_p);

/* The port it listens on. */
int router_grpc_port(const router_grpc_t *api);

/* Its gRPC server (for router_auth's check). */
pd_grpc_server_t *router_grpc_server(const router_grpc_t *api);

/* Stops serving: calls still open are cancelled (their requests cancelled in the core). Run the
 * loop afterwards to close the connections. Accepts NULL. */
void router_grpc_destroy(router_grpc_t *api);

#endif
