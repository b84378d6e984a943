/* router_http: the router's HTTP front end on top of a router core (router.h): the OpenAI API
 * (/v1/completions, /v1/chat/completions with SSE streaming, /v1/models), the probes ops tooling
 * uses (/live: the process answers; /ready and /health: the core is serving, i.e. at least one
 * prefill and one decode node are) and /metrics (the core's metrics, Prometheus text).
 * Bodies are parsed with "\u0000" allowed: a completion prompt may hold NUL bytes (chat messages
 * and stop strings may not: 400). JSON numbers reach the core unnarrowed; a value out of range is a
 * 400 naming it, an allocation failure a 503 for that request only.
 *
 * Loop thread only.
 */
#ifndef PD_ROUTER_HTTP_H
#define PD_ROUTER_HTTP_H

#include <uv.h>

#include "http.h"
#include "router.h"
#include "status.h"

typedef struct router_http router_http_t;

/* Serves core on host:port (port 0: an ephemeral port, see router_http_port). The core must
 * outlive the front end. Returns PD_OK, PD_ERR_IO / PD_ERR_INVALID (the address), PD_ERR_NOMEM;
 * nothing is left behind on failure. */
pd_status_t router_http_create(router_t *core, uv_loop_t *loop, const char *host, int port,
                               router_http_t **api_p);

/* The port it listens on. */
int router_http_port(const router_http_t *api);

/* Its HTTP server (for router_auth's check). */
pd_http_server_t *router_http_server(const router_http_t *api);

/* Stops serving: requests still open are cancelled in the core. Accepts NULL. */
void router_http_destroy(router_http_t *api);

#endif
