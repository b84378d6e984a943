/* echo_service: the pdtest.Echo test service (proto/testsvc.proto), shared by the C test server
 * binary and the in-process tests. It counts handler invocations and cancel callbacks, and reports
 * the server's buffered bytes through Stats. Loop thread only.
 */
#ifndef PD_ECHO_SERVICE_H
#define PD_ECHO_SERVICE_H

#include <stdint.h>

#include "grpc_health.h"
#include "grpc_server.h"

typedef struct echo_service echo_service_t;

/* Registers pdtest.Echo on srv; health may be NULL (SetHealth then answers UNIMPLEMENTED).
 * Returns PD_OK or the failure of allocation / registration. */
pd_status_t echo_service_create(uv_loop_t *loop, pd_grpc_server_t *srv, pd_grpc_health_t *health,
                                echo_service_t **es_p);

/* Cancel callbacks seen so far. */
int64_t echo_service_cancels(const echo_service_t *es);

/* Frees the object; call after pd_grpc_server_destroy (calls in progress were cancelled by it and
 * their states free themselves when the loop runs). Accepts NULL. */
void echo_service_destroy(echo_service_t *es);

#endif
