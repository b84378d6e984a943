/* decode_node: a decode node. It serves pdserve.v1.Decode and grpc.health.v1.Health on its control
 * port, owns an engine (INT4 weights and FP8 KV by default) on a compute thread, and registers the
 * engine's KV page pool with the KV transport so prefill nodes write pages straight into it.
 *
 * Request life: Reserve allocates pages for the prompt (new tags, lease for the remote writer) and
 * answers with the pages, the pool's transport key and address. The prefill node writes the pages
 * (stamped with those tags), flushes, and sends KV-done (NODE_AM_KV_DONE). Decode (a stream) admits
 * the sequence into the continuous batch once its KV is done and streams tokens; cancel, finish,
 * abort or an integrity failure free its pages. Release drops a reservation that will not be
 * decoded; reservations whose writer or decoder never shows up are dropped when their lease ends.
 * When pages run out the newest sequence is evicted and told `preempted` so the router re-prefills
 * it. The tag tracker checks every page of the batch before each attention step.
 *
 * Loop thread: create, destroy and every callback; the engine only on the compute thread.
 */
#ifndef PD_DECODE_NODE_H
#define PD_DECODE_NODE_H

#include <uv.h>

#include "cluster_config.h"
#include "engine.h"
#include "node_control.h"
#include "status.h"

typedef struct decode_node decode_node_t;

/* Test hooks: what a test build of the decode node (tests/support/decode_faults.c, linked into
 * decode-node-faults) runs at fixed points to damage state the way a bookkeeping bug or a bad peer
 * would, so that tests can show the node catches it. The decode-node binary passes none. Any hook
 * may be NULL. */
typedef struct {
    void *arg;
    /* Compute thread: a sequence whose KV has arrived is about to join the batch (before its
     * first tag check). May damage kv (its pages in e's pool, their stamps, its block table). */
    void (*before_admit)(void *arg, engine_t *e, const char *request_id, kv_seq_t *kv);
    /* Loop thread: a KV-done message arrived and is about to be decoded. May rewrite it in place:
     * buf (cap bytes) holds *len_p bytes; *direct_p is 1 when it came as NODE_AM_KV_DONE_DIRECT
     * (pages written into the GPU pool over CUDA IPC) and may be changed too. */
    void (*on_kv_done)(void *arg, uint8_t *buf, size_t cap, size_t *len_p, int *direct_p);
    /* Compute thread, at engine start: engine_params_t.tp_comm_wrap for a tp > 1 node (wraps the
     * ranks' communicators, e.g. to fail one rank's collective) */
    void (*tp_comm_wrap)(void *arg, struct tp_comm **comms, int size);
    void *tp_comm_arg;
} decode_node_hooks_t;

/* Starts serving (health NOT_SERVING until the model is loaded, then SERVING). hooks: NULL in
 * production (copied otherwise). env: NULL in production; unit tests pass a fake clock (leases,
 * quarantine, lease ends before KV-done) and the loopback transport. Errors: the control or
 * transport port cannot be bound (PD_ERR_IO / PD_ERR_TRANSPORT), PD_ERR_NOMEM. */
pd_status_t decode_node_create(uv_loop_t *loop, const cluster_config_t *cfg,
                               const cluster_node_t *node, const decode_node_hooks_t *hooks,
                               const node_env_t *env, decode_node_t **dn_p);

/* The bound control port (node->port, or the ephemeral port picked for 0). */
int decode_node_port(const decode_node_t *dn);

/* Stops serving (GOAWAY, calls end), stops the compute thread and frees everything. */
void decode_node_destroy(decode_node_t *dn);

/* SIGTERM: health NOT_SERVING, Reserve answers UNAVAILABLE ("draining"); Decode streams of
 * earlier reservations are still accepted and run to their end. Loop thread. */
void decode_node_drain(decode_node_t *dn);

/* Work still in flight: live Decode streams plus reservations and sequences the compute thread
 * reported at its last tick (<= 100 ms old). 0: the node may stop. Loop thread. */
int decode_node_busy(decode_node_t *dn);

/* Whether loading the model failed (the process should exit nonzero). */
int decode_node_failed(const decode_node_t *dn);

#endif
