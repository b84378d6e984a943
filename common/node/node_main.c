#include "node_main.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "clock.h"
#include "log.h"

typedef struct {
    const node_main_ops_t *ops;
    void *node;
    uv_timer_t timer;
    int64_t deadline_ms, drain_ms;
    int draining;
} node_main__t;

static void node_main__check(uv_timer_t *t)
{
    node_main__t *m = t->data;
    int busy = m->ops->busy(m->node);
    if (busy == 0) {
        pd_log_info("drained: stopping");
        uv_stop(t->loop);
    } else if (pd_clock_ms() >= m->deadline_ms) {
        pd_log_warn("drain: %d requests still running after %lld ms: stopping anyway", busy,
                    (long long)m->drain_ms);
        uv_stop(t->loop);
    }
}

static void node_main__signal(uv_signal_t *h, int signum)
{
    node_main__t *m = h->data;
    if (m->draining || !m->node) {
        pd_log_info("signal %d: stopping now", signum);
        uv_stop(h->loop);
        return;
    }
    m->draining = 1;
    m->deadline_ms = pd_clock_ms() + m->drain_ms;
    pd_log_info("signal %d: draining (at most %lld ms; again to stop now)", signum,
                (long long)m->drain_ms);
    m->ops->drain(m->node);
    uv_timer_start(&m->timer, node_main__check, 0, 50);
}

int node_main(int argc, char **argv, const node_main_ops_t *ops)
{
    pd_args_t args;
    cluster_config_t *cfg = NULL;
    const cluster_node_t *node;
    uv_loop_t loop;
    uv_signal_t sigint, sigterm;
    node_main__t m;
    void *n = NULL;
    int rc = 1;

    memset(&m, 0, sizeof m);
    m.ops = ops;
    signal(SIGPIPE, SIG_IGN);
    if (pd_args_parse(argc, argv, true, &args) != PD_OK)
        return 2;
    if (cluster_config_load_args(&args, args.node, &cfg) != PD_OK)
        return 1;
    if (!(node = cluster_config_find_node(cfg, args.node))) {
        pd_log_error("%s: no node named '%s'", cfg->source, args.node);
        goto out;
    }
    if (node->role != ops->role) {
        pd_log_error("%s: node '%s' is a %s node, not a %s node", cfg->source, args.node,
                     cluster_config_role_str(node->role), cluster_config_role_str(ops->role));
        goto out;
    }
    if (cfg->transport.ucx_tls[0])
        setenv("UCX_TLS", cfg->transport.ucx_tls, 0);
    uv_loop_init(&loop);
    if (ops->create(&loop, cfg, node, &n) != PD_OK) {
        pd_log_error("%s: cannot start", args.node);
        uv_loop_close(&loop);
        goto out;
    }
    m.node = n;
    m.drain_ms = cfg->router.request_timeout_ms > 0 ? cfg->router.request_timeout_ms : 30000;
    uv_timer_init(&loop, &m.timer);
    m.timer.data = &m;
    uv_signal_init(&loop, &sigint);
    uv_signal_init(&loop, &sigterm);
    sigint.data = sigterm.data = &m;
    uv_signal_start(&sigint, node_main__signal, SIGINT);
    uv_signal_start(&sigterm, node_main__signal, SIGTERM);
    uv_run(&loop, UV_RUN_DEFAULT);
    rc = ops->failed(n) ? 1 : 0;
    uv_timer_stop(&m.timer);
    uv_close((uv_handle_t *)&m.timer, NULL);
    uv_signal_stop(&sigint);
    uv_signal_stop(&sigterm);
    uv_close((uv_handle_t *)&sigint, NULL);
    uv_close((uv_handle_t *)&sigterm, NULL);
    ops->destroy(n);
    uv_run(&loop, UV_RUN_DEFAULT); /* let closing handles and draining calls finish */
    if (uv_loop_close(&loop) != 0)
        pd_log_warn("loop still has handles at exit");
    pd_log_info("stopped");
out:
    cluster_config_destroy(cfg);
    return rc;
}
