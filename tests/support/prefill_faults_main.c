/* prefill-node-faults: prefill-node with a clock that jumps (a test build: never installed,
 * never deployed). PDSERVE_FAULT=prefill-late:N makes every N-th prefill job find, when the
 * compute thread picks it up, that an hour has passed: as if it had waited in the queue past
 * its reservation's lease. The node then does no work and answers RESOURCE_EXHAUSTED, and the
 * router reserves again. The cluster tests use it instead of a lease short enough for a slow
 * machine to miss (which a fast one never does).
 *   prefill-node-faults --config FILE --node NAME [--set KEY=VALUE ...] [--log-level LEVEL] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "node_main.h"
#include "prefill_node.h"

static pthread_t loop_thread;
static int every;                 /* N of prefill-late:N */
static atomic_int compute_reads;  /* clock reads off the loop thread: one per prefill job */
static _Atomic int64_t offset_ms; /* the jumps so far (the clock stays monotonic) */

static int64_t faults__clock(void *arg)
{
    (void)arg;
    if (!pthread_equal(pthread_self(), loop_thread) &&
        (atomic_fetch_add(&compute_reads, 1) + 1) % every == 0) {
        atomic_fetch_add(&offset_ms, 3600 * 1000);
        pd_log_warn("injecting fault prefill-late: this prefill waited an hour");
    }
    return pd_clock_ms() + atomic_load(&offset_ms);
}

static pd_status_t faults__create(uv_loop_t *loop, const cluster_config_t *cfg,
                                  const cluster_node_t *node, void **node_p)
{
    const char *kind = getenv("PDSERVE_FAULT");
    node_env_t env = {{NULL, NULL}, NULL};
    if (kind && sscanf(kind, "prefill-late:%d", &every) == 1 && every > 0) {
        loop_thread = pthread_self();
        env.clock.now_ms = faults__clock;
    } else if (kind && *kind) {
        pd_log_error("PDSERVE_FAULT=%s: prefill-node-faults knows prefill-late:N (N >= 1)", kind);
        return PD_ERR_INVALID;
    }
    return prefill_node_create(loop, cfg, node, &env, (prefill_node_t **)node_p);
}

static void faults__destroy(void *n)
{
    prefill_node_destroy(n);
}

static int faults__failed(const void *n)
{
    return n && prefill_node_failed(n);
}

static void faults__drain(void *n)
{
    prefill_node_drain(n);
}

static int faults__busy(void *n)
{
    return prefill_node_busy(n);
}

int main(int argc, char **argv)
{
    static const node_main_ops_t ops = {CLUSTER_ROLE_PREFILL, faults__create, faults__destroy,
                                        faults__failed,       faults__drain,  faults__busy};
    return node_main(argc, argv, &ops);
}
