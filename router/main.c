/* router: the front of a pdserve cluster (see common/router.h).
 *   router --config FILE [--set router.KEY=VALUE ...] [--log-level debug|info|warn|error] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "cluster_config.h"
#include "log.h"
#include "router.h"

static void on_signal(uv_signal_t *h, int signum)
{
    pd_log_info("signal %d: shutting down", signum);
    uv_stop(h->loop);
}

int main(int argc, char **argv)
{
    const char *config = NULL;
    cluster_config_t *cfg = NULL;
    router_t *r = NULL;
    uv_loop_t loop;
    uv_signal_t s1, s2;
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    pd_log_set_tag("router");
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            config = argv[++i];
        else if ((strcmp(argv[i], "--set") == 0 || strcmp(argv[i], "--log-level") == 0) &&
                 i + 1 < argc)
            i++;
        else {
            fprintf(stderr, "usage: router --config FILE [--set router.KEY=VALUE ...]\n");
            return 2;
        }
    }
    if (!config) {
        fprintf(stderr, "usage: router --config FILE [--set router.KEY=VALUE ...]\n");
        return 2;
    }
    if (cluster_config_load(config, &cfg) != PD_OK)
        return 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--log-level") == 0)
            pd_log_set_level(strcmp(argv[i + 1], "debug") == 0 ? PD_LOG_DEBUG
                             : strcmp(argv[i + 1], "warn") == 0 ? PD_LOG_WARN
                                                                : PD_LOG_INFO);
        if (strcmp(argv[i], "--set") != 0)
            continue;
        char kv[512], *eq;
        snprintf(kv, sizeof kv, "%s", argv[i + 1]);
        if (!(eq = strchr(kv, '='))) {
            fprintf(stderr, "router: --set %s: expected KEY=VALUE\n", argv[i + 1]);
            goto out;
        }
        *eq = 0;
        if (cluster_config_override(cfg, NULL, kv, eq + 1) != PD_OK)
            goto out;
    }
    uv_loop_init(&loop);
    if (router_create(&loop, cfg, &r) != PD_OK) {
        uv_loop_close(&loop);
        goto out;
    }
    uv_signal_init(&loop, &s1);
    uv_signal_init(&loop, &s2);
    uv_signal_start(&s1, on_signal, SIGINT);
    uv_signal_start(&s2, on_signal, SIGTERM);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&s1, NULL);
    uv_close((uv_handle_t *)&s2, NULL);
    router_destroy(r);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0)
        pd_log_warn("loop still has handles at exit");
    pd_log_info("stopped");
    rc = 0;
out:
    cluster_config_destroy(cfg);
    return rc;
}
