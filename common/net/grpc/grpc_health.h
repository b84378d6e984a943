/* pd_grpc_health: the standard grpc.health.v1.Health service (Check and Watch) on a pd_grpc_server.
 *
 * The health object owns a table service name -> serving status ("" is the whole server, SERVING
 * from creation) and the Watch calls in progress. Check answers the status, or NOT_FOUND for a
 * name never set. Watch sends the current status (SERVICE_UNKNOWN for unknown names) and then
 * every change, until the client goes away. Loop thread only, like the server it serves.
 */
#ifndef PD_GRPC_HEALTH_H
#define PD_GRPC_HEALTH_H

#include "grpc_server.h"
#include "status.h"

/* Serving statuses (values of grpc.health.v1.HealthCheckResponse.ServingStatus). */
enum {
    PD_GRPC_HEALTH_UNKNOWN = 0,
    PD_GRPC_HEALTH_SERVING = 1,
    PD_GRPC_HEALTH_NOT_SERVING = 2,
    PD_GRPC_HEALTH_SERVICE_UNKNOWN = 3,
};

typedef struct pd_grpc_health pd_grpc_health_t;

/* Creates the service and registers it on srv; "" starts SERVING. Returns PD_OK, PD_ERR_NOMEM or
 * the status of pd_grpc_server_add_service (PD_ERR_INVALID when Health is registered already);
 * nothing is left registered or allocated on failure. */
pd_status_t pd_grpc_health_create(pd_grpc_server_t *srv, pd_grpc_health_t **h_p);

/* Sets the status of service ("" = the server) to status (PD_GRPC_HEALTH_SERVING, ...) and notifies
 * its watchers when it changed. Returns PD_OK, PD_ERR_INVALID (status out of 0..2) or
 * PD_ERR_NOMEM (table unchanged). */
pd_status_t pd_grpc_health_set(pd_grpc_health_t *h, const char *service, int status);

/* Returns the status of service, or PD_GRPC_HEALTH_SERVICE_UNKNOWN when never set. */
int pd_grpc_health_get(const pd_grpc_health_t *h, const char *service);

/* Ends every Watch with UNAVAILABLE and frees the object. Call it after pd_grpc_server_shutdown or
 * pd_grpc_server_destroy, so no new health call can arrive. Accepts NULL. */
void pd_grpc_health_destroy(pd_grpc_health_t *h);

#endif
