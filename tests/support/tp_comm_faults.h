/* tp_comm_faults: a tensor-parallel communicator that fails on purpose, for tests only (never
 * linked into a deployed binary). tp_comm_faults_wrap() is an engine_params_t.tp_comm_wrap: it
 * wraps every rank's communicator; rank `rank`'s collective number `at` (counting that rank's
 * collectives from 1) returns PD_ERR_CUDA without entering the collective, as when one of that
 * rank's GPU ops fails in the middle of a forward, while the other ranks wait in it. Once per
 * arming: `at` 0 is disarmed; a test may set `at` (to calls + k) and clear `injected` between
 * engine jobs to arm it again.
 * Each injection logs "injecting fault tp-rank". The counters may be read by any thread. */
#ifndef PD_TP_COMM_FAULTS_H
#define PD_TP_COMM_FAULTS_H

#include <stdatomic.h>

#include "tp_comm.h"

typedef struct {
    int rank, at;        /* set by the test */
    atomic_int calls;    /* collectives rank `rank` has called */
    atomic_int injected; /* 1 once the fault has been injected */
} tp_comm_faults_t;

/* arg: a tp_comm_faults_t that outlives the engine. Replaces comms (size) with wrappers that own
 * the originals (tp_comm_destroy on a wrapper destroys both). On allocation failure the
 * communicators stay as they were (logged). */
void tp_comm_faults_wrap(void *arg, tp_comm_t **comms, int size);

#endif
