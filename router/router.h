/* router: the front of a pdserve cluster. It serves pdserve.v1.Inference (gRPC) and the OpenAI
 * HTTP API, tokenizes and validates requests, and drives each one through the cluster:
 *
 *   Reserve pages on a decode node (least KV usage; full -> next node, all full -> wait)
 *   -> Prefill on a prefill node (round robin / least load; a dead node -> the next one)
 *   -> first token to the client at once -> Decode stream from the decode node -> client.
 *
 * A decode node that runs out of pages evicts a sequence with `preempted`: the router re-runs
 * Reserve + Prefill with prompt + generated tokens and keeps streaming (the client sees delay).
 * Failures are explicit: a dead decode node ends its requests with UNAVAILABLE and is taken out
 * until its health check passes again; an integrity failure ends the request with DATA_LOSS; a
 * client cancel cancels the decode stream (pages freed) or releases the reservation. Nodes are
 * polled (grpc.health.v1 + Stats) every 500 ms.
 *
 * Loop thread only.
 */
#ifndef PD_ROUTER_H
#define PD_ROUTER_H

#include <uv.h>

#include "cluster_config.h"
#include "status.h"

typedef struct router router_t;

/* Loads the tokenizer and model config, binds the gRPC (router.listen) and HTTP (router.http)
 * ports and starts polling the nodes. PD_ERR_IO (port), PD_ERR_FORMAT (model files), ... */
pd_status_t router_create(uv_loop_t *loop, const cluster_config_t *cfg, router_t **r_p);

/* Stops serving; requests in flight end with UNAVAILABLE. */
void router_destroy(router_t *r);

#endif
