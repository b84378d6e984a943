#include "node_control.h"

#include <string.h>

#include "log.h"
#include "notify.h"

static void node_control__set_serving(node_control_t *nc, int serving)
{
    node_set_serving(nc->health, nc->desc, serving);
}

pd_status_t node_control_init(node_control_t *nc, uv_loop_t *loop, const cluster_config_t *cfg,
                              const cluster_node_t *node, const ProtobufCServiceDescriptor *desc,
                              const pd_grpc_method_fn *handlers, void *user, const node_env_t *env)
{
    pd_status_t st;

    memset(nc, 0, sizeof *nc);
    nc->loop = loop;
    nc->cfg = cfg;
    nc->node = node;
    nc->desc = desc;
    node_stats_init(&nc->stats);
    if (env) {
        nc->clock = env->clock;
        nc->tr = env->transport;
    }
    if (!nc->tr) {
        kv_transport_params_t tp = {0};
        tp.name = node->name;
        if ((st = kv_transport_ucx_create(loop, &tp, &nc->tr)) != PD_OK)
            return st;
        nc->own_tr = 1;
    }
    if ((st = node_serve(loop, node, desc, handlers, user, &nc->srv, &nc->health, &nc->port)) !=
        PD_OK)
        return st;
    return node_http_create(loop, node, nc->health, nc->srv, &nc->stats, &nc->http);
}

int64_t node_control_now_ms(const node_control_t *nc)
{
    return pd_clock_now_ms(&nc->clock);
}

void node_control_ready(node_control_t *nc)
{
    nc->ready = 1;
    if (!nc->draining)
        node_control__set_serving(nc, 1);
}

void node_control_fail(node_control_t *nc, const char *what, pd_status_t st)
{
    pd_log_error("%s: %s: %s", nc->node->name, what, pd_status_str(st));
    nc->failed = 1;
    uv_stop(nc->loop);
}

void node_control_operator_drain(node_control_t *nc, uint32_t drain)
{
    node_stats_t st;
    char status[160];
    pthread_mutex_lock(&nc->stats.mu);
    if (drain == 1 || drain == 2)
        nc->stats.operator_drain = drain == 2;
    st = nc->stats;
    pthread_mutex_unlock(&nc->stats.mu);
    const char *now = node_stats_drain_str(&st);
    if (strcmp(now, nc->drain_told) == 0 || (!nc->drain_told[0] && !st.operator_drain)) {
        if (!nc->drain_told[0])
            snprintf(nc->drain_told, sizeof nc->drain_told, "%s", now);
        return;
    }
    snprintf(nc->drain_told, sizeof nc->drain_told, "%s", now);
    if (strcmp(now, "none") == 0)
        snprintf(status, sizeof status, "%s: serving (undrained)", nc->node->name);
    else if (strcmp(now, "draining") == 0)
        snprintf(status, sizeof status, "%s: draining (pdctl drain): no new work, %u running",
                 nc->node->name, st.active + st.queued);
    else
        snprintf(status, sizeof status, "%s: drained (pdctl drain): no requests; may be stopped",
                 nc->node->name);
    pd_log_info("%s", status);
    pd_notify_status(status);
}

int node_control_drain(node_control_t *nc)
{
    if (nc->draining)
        return 0;
    nc->draining = 1;
    if (nc->health)
        node_control__set_serving(nc, 0);
    return 1;
}

void node_control_shutdown(node_control_t *nc)
{
    if (nc->srv)
        pd_grpc_server_shutdown(nc->srv);
}

void node_control_deinit(node_control_t *nc)
{
    pd_grpc_server_destroy(nc->srv);
    nc->srv = NULL;
    node_http_destroy(nc->http);
    nc->http = NULL;
    pd_grpc_health_destroy(nc->health);
    nc->health = NULL;
    if (nc->own_tr)
        kv_transport_destroy(nc->tr);
    nc->tr = NULL;
    if (nc->loop)
        node_stats_deinit(&nc->stats);
    nc->loop = NULL;
}
