/* decode_faults: the decode node's test hooks (decode_node_hooks_t), built only into the
 * decode-node-faults test executable. The fault comes from the environment, which only this
 * test build reads:
 *   PDSERVE_FAULT=reuse|stale|table  with PDSERVE_FAULT_REQUEST=<request id substring>: damage
 *     that request's pages the way a bookkeeping bug would, just before it joins the batch
 *     (reuse: its first page is handed out again; stale: its first page carries an earlier
 *     owner's stamp; table: its block table points at another page). The tag check must fail it.
 *   PDSERVE_FAULT=kvdone-truncate|kvdone-mismatch: the first KV-done message the node receives
 *     loses its last byte (it no longer decodes), or claims one token more than was reserved.
 *     The node must drop it, fail only that request, and keep serving.
 *   PDSERVE_FAULT=kvdone-token|kvdone-checksum|kvdone-direct|kvdone-slice: the first KV-done
 *     carries a wrong reservation token, a checksum the pages do not match, a CUDA IPC claim, or
 *     (a tp > 1 node) a last rank's slice checksum its slice does not match.
 *   PDSERVE_FAULT=tp-rank:N (a tp > 1 node): rank 1's N-th collective fails while rank 0 waits in
 *     it (tp_comm_faults.h), once. The step's requests must fail, the node keep serving.
 * Each injection logs "injecting fault '<kind>'". Hooks run on the threads decode_node.h names.
 */
#ifndef PD_DECODE_FAULTS_H
#define PD_DECODE_FAULTS_H

#include "decode_node.h"

/* Fills hooks from PDSERVE_FAULT / PDSERVE_FAULT_REQUEST (no fault set: all NULL). Returns
 * PD_ERR_INVALID (logged) for an unknown fault. */
pd_status_t decode_faults_hooks_from_env(decode_node_hooks_t *hooks_p);

#endif
