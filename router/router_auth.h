/* router_auth: credentials on the router's listeners, checked by the gRPC and HTTP servers before
 * a handler runs (pd_grpc_server_set_auth, pd_http_server_set_auth):
 *   - API keys (router.api_keys_file: one per line, '#' comments) for the public APIs: gRPC
 *     pdserve.v1.Inference and HTTP /v1/... — "Authorization: Bearer KEY", as OpenAI clients send
 * it;
 *   - the ops token (router.ops_token_file: its first line) for the operators' and nodes' side:
 *     gRPC pdserve.v1.Cluster (RegisterNode, Drain, ...; nodes send it from $PDSERVE_OPS_TOKEN or
 *     PDSERVE_OPS_TOKEN_FILE, pdctl likewise) and HTTP /metrics;
 *   - always open: grpc.health.v1 and /live /ready /health (probes).
 * A file left unset leaves its part open. Missing or wrong credentials: UNAUTHENTICATED / 401,
 * logged (at most once a second, with the count since) and counted in
 * pdserve_router_auth_failures_total{api, need}. Keys are compared in constant time.
 *
 * Loop thread only.
 */
#ifndef PD_ROUTER_AUTH_H
#define PD_ROUTER_AUTH_H

#include "cluster_config.h"
#include "grpc_server.h"
#include "http.h"
#include "router.h"
#include "status.h"

typedef struct router_auth router_auth_t;

/* Reads rc's api_keys_file and ops_token_file. PD_ERR_IO (unreadable), PD_ERR_FORMAT (no key in
 * the file, a key with spaces or over 255 bytes), PD_ERR_NOMEM; logged with the file name. With
 * neither file set, *a_p is NULL and PD_OK (nothing to check). */
pd_status_t router_auth_create(router_t *core, const cluster_router_t *rc, router_auth_t **a_p);

/* Installs the checks on the servers (either may be NULL). a may be NULL (no-op). */
void router_auth_attach(router_auth_t *a, pd_grpc_server_t *grpc, pd_http_server_t *http);

/* Accepts NULL. Detach first (destroy the servers). */
void router_auth_destroy(router_auth_t *a);

#endif
