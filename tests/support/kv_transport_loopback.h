/* kv_transport_loopback: an in-process kv_transport (memcpy) for unit tests. Loopback transports
 * of one process find each other by port through a process-global registry and must share one
 * thread (test support: not part of the production libraries). */
#ifndef PD_KV_TRANSPORT_LOOPBACK_H
#define PD_KV_TRANSPORT_LOOPBACK_H

#include "kv_transport.h"

/* Creates an in-process loopback transport (memcpy; for tests). Returns PD_ERR_NOMEM or
 * PD_ERR_IO; nothing is left behind on failure. */
pd_status_t kv_transport_loopback_create(uv_loop_t *loop, const kv_transport_params_t *params,
                                         kv_transport_t **t_p);

#endif
