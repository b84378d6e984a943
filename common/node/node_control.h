/* node_control: the part of a node that is the same for prefill and decode nodes: its control
 * gRPC server (the node's service plus grpc.health.v1), the ops endpoint on http_port
 * (node_http_*), the stats the compute thread publishes, the KV transport, and the node's life:
 * loading (NOT_SERVING), ready (SERVING), failed (the process exits 1), draining (NOT_SERVING
 * again, running requests finish). It also holds the node's two seams for tests: the clock every
 * lease and deadline is read from, and the transport (UCX in production, the in-process loopback
 * of tests/support in unit tests), both given by node_env_t.
 *
 * The node embeds a node_control_t (caller-owned storage: init / deinit). Loop thread, except
 * node_control_now_ms (any thread) and the stats (their mutex).
 */
#ifndef PD_NODE_CONTROL_H
#define PD_NODE_CONTROL_H

#include <uv.h>

#include "clock.h"
#include "cluster_config.h"
#include "grpc_health.h"
#include "grpc_server.h"
#include "kv_transport.h"
#include "node.h"

/* What a node takes from its environment. A zeroed node_env_t (or NULL) is production. */
typedef struct {
    pd_clock_t clock;          /* leases, deadlines, quarantine; {NULL}: the monotonic clock */
    kv_transport_t *transport; /* NULL: the node creates a UCX transport; else borrowed (tests) */
} node_env_t;

typedef struct {
    uv_loop_t *loop;
    const cluster_config_t *cfg;
    const cluster_node_t *node;
    const ProtobufCServiceDescriptor *desc; /* the node's service (Prefill or Decode) */
    pd_grpc_server_t *srv;
    pd_grpc_health_t *health;
    node_http_t *http; /* /live /ready /health /metrics; NULL when node->http_port is 0 */
    node_stats_t stats;
    kv_transport_t *tr;
    int own_tr; /* tr was created here (destroyed by deinit) */
    int port;   /* the bound control port */
    pd_clock_t clock;
    int ready;           /* the model is loaded and the node's own setup done */
    int failed;          /* loading failed: the process exits 1 */
    int draining;        /* SIGTERM: no new work; running requests finish */
    char drain_told[16]; /* the operator's drain last logged and told to systemd ("" none yet) */
} node_control_t;

/* Sets up nc for node: stats, the transport (env->transport or a new UCX one named for the
 * node), the control server on node->host:port serving desc through handlers (user as their
 * argument) and grpc.health.v1 (NOT_SERVING until node_control_ready), and the ops endpoint.
 * env may be NULL. On error (PD_ERR_IO / PD_ERR_UNAVAILABLE: a port, PD_ERR_TRANSPORT,
 * PD_ERR_NOMEM) nothing is left running; node_control_deinit may still be called. */
pd_status_t node_control_init(node_control_t *nc, uv_loop_t *loop, const cluster_config_t *cfg,
                              const cluster_node_t *node, const ProtobufCServiceDescriptor *desc,
                              const pd_grpc_method_fn *handlers, void *user, const node_env_t *env);

/* The node's clock (any thread). */
int64_t node_control_now_ms(const node_control_t *nc);

/* The model is loaded and the node set up: ready, and SERVING unless draining. */
void node_control_ready(node_control_t *nc);

/* Loading failed (what: logged with the status): the node is failed and the loop stops. */
void node_control_fail(node_control_t *nc, const char *what, pd_status_t st);

/* A Stats call's StatsRequest.drain (the router's view of pdctl drain: 0 unknown, 1 serving,
 * 2 drained): kept in the stats (NodeStats.operator_drain, /health "drain"). Each change of
 * none / draining / drained is logged and sent to systemd as STATUS= (not STOPPING=1: systemd
 * would take the service for stopping and kill it after TimeoutStopSec; the node keeps running
 * and may be undrained). */
void node_control_operator_drain(node_control_t *nc, uint32_t drain);

/* SIGTERM: NOT_SERVING, draining. Returns 1 the first time (the node logs what still runs), 0
 * when it was draining already. */
int node_control_drain(node_control_t *nc);

/* The first half of stopping: the control server sends GOAWAY and takes no new calls. The node
 * then stops its compute thread and frees its own state, then calls node_control_deinit. */
void node_control_shutdown(node_control_t *nc);

/* Closes the servers, the health service, an owned transport, the stats. Accepts a zeroed or
 * partly initialised nc. The node deregisters its transport memory and closes its endpoints
 * before. */
void node_control_deinit(node_control_t *nc);

#endif
