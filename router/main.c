/* router: the front of a pdserve cluster (see router.h).
 *   router --config FILE [--set router.KEY=VALUE ...] [--log-level debug|info|warn|error]
 * (flags: common/base/args.h) */
#include <signal.h>

#include <uv.h>

#include "args.h"
#include "clock.h"
#include "cluster_config.h"
#include "log.h"
#include "router.h"
#include "router_grpc.h"
#include "router_http.h"

/* SIGTERM / SIGINT: drain (no new requests; running ones finish, at most
 * router.request_timeout_ms, which no request may outlive), then stop; a second signal stops
 * at once. */
typedef struct {
    router_t *core;
    uv_timer_t timer;
    int64_t deadline_ms, drain_ms;
    int draining;
} drain_t;

static void on_drain_check(uv_timer_t *t)
{
    drain_t *d = t->data;
    int busy = router_busy(d->core);
    if (busy == 0) {
        pd_log_info("router: drained: stopping");
        uv_stop(t->loop);
    } else if (pd_clock_ms() >= d->deadline_ms) {
        pd_log_warn("router: %d requests still running after %lld ms: stopping anyway", busy,
                    (long long)d->drain_ms);
        uv_stop(t->loop);
    }
}

static void on_signal(uv_signal_t *h, int signum)
{
    drain_t *d = h->data;
    if (d->draining) {
        pd_log_info("signal %d: stopping now", signum);
        uv_stop(h->loop);
        return;
    }
    d->draining = 1;
    d->deadline_ms = pd_clock_ms() + d->drain_ms;
    pd_log_info("signal %d: draining (at most %lld ms; again to stop now)", signum,
                (long long)d->drain_ms);
    router_drain(d->core);
    uv_timer_start(&d->timer, on_drain_check, 0, 50);
}

int main(int argc, char **argv)
{
    pd_args_t args;
    cluster_config_t *cfg = NULL;
    router_t *core = NULL;
    router_grpc_t *grpc = NULL;
    router_http_t *http = NULL;
    uv_loop_t loop;
    uv_signal_t s1, s2;
    drain_t drain = {0};
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    if (pd_args_parse(argc, argv, false, &args) != PD_OK)
        return 2;
    if (cluster_config_load_args(&args, "router", &cfg) != PD_OK)
        return 1;
    uv_loop_init(&loop);
    if (router_create(&loop, cfg, &core) != PD_OK ||
        router_grpc_create(core, &loop, cfg->router.listen_host, cfg->router.listen_port, &grpc) !=
            PD_OK ||
        (cfg->router.http_port > 0 && router_http_create(core, &loop, cfg->router.http_host,
                                                         cfg->router.http_port, &http) != PD_OK))
        goto out;
    drain.core = core;
    drain.drain_ms = cfg->router.request_timeout_ms > 0 ? cfg->router.request_timeout_ms : 30000;
    uv_timer_init(&loop, &drain.timer);
    drain.timer.data = &drain;
    uv_signal_init(&loop, &s1);
    uv_signal_init(&loop, &s2);
    s1.data = s2.data = &drain;
    uv_signal_start(&s1, on_signal, SIGINT);
    uv_signal_start(&s2, on_signal, SIGTERM);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&drain.timer, NULL);
    uv_close((uv_handle_t *)&s1, NULL);
    uv_close((uv_handle_t *)&s2, NULL);
    rc = 0;
out:
    router_stop(core); /* requests in flight end with UNAVAILABLE while the front ends are up */
    router_http_destroy(http);
    router_grpc_destroy(grpc);
    router_destroy(core);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0)
        pd_log_warn("loop still has handles at exit");
    if (rc == 0)
        pd_log_info("stopped");
    cluster_config_destroy(cfg);
    return rc;
}
