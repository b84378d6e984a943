/* prefill_node: a prefill node. It serves pdserve.v1.Prefill and grpc.health.v1.Health on its
 * control port and owns an engine (FP8 weights, BF16 KV by default) on a compute thread.
 *
 * A Prefill call carries the prompt and the destination the router reserved on a decode node
 * (pages with their tags, the pool's transport key and address). The node runs the prompt in
 * chunks; after each chunk the finished pages are converted to the destination's KV format (FP8
 * with per (token, head) scales), stamped with the destination tags and written with one put per
 * page while the next chunk computes. Then it flushes, sends KV-done (first token, token count) to
 * the decode node, and answers the router with the first token. No KV goes through gRPC.
 *
 * Loop thread: create, destroy and every callback; the engine only on the compute thread.
 */
#ifndef PD_PREFILL_NODE_H
#define PD_PREFILL_NODE_H

#include <uv.h>

#include "cluster_config.h"
#include "node_control.h"
#include "status.h"

typedef struct prefill_node prefill_node_t;

/* Starts serving (health NOT_SERVING until the model is loaded). env: NULL in production; unit
 * tests pass a fake clock (write deadlines) and the loopback transport. PD_ERR_IO (port),
 * PD_ERR_NOMEM, PD_ERR_TRANSPORT (UCX). */
pd_status_t prefill_node_create(uv_loop_t *loop, const cluster_config_t *cfg,
                                const cluster_node_t *node, const node_env_t *env,
                                prefill_node_t **pn_p);

/* The bound control port (node->port, or the ephemeral port picked for 0). */
int prefill_node_port(const prefill_node_t *pn);
void prefill_node_destroy(prefill_node_t *pn);
int prefill_node_failed(const prefill_node_t *pn);

/* SIGTERM: health NOT_SERVING, new Prefill calls answer UNAVAILABLE ("draining", the router
 * tries another prefill node); calls already running finish. Loop thread. */
void prefill_node_drain(prefill_node_t *pn);

/* Prefill calls still running or queued (0: the node may stop). Loop thread. */
int prefill_node_busy(const prefill_node_t *pn);

#endif
