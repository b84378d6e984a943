#include "node_main.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "decode_node.h"
#include "log.h"
#include "prefill_node.h"

static void node_main__signal(uv_signal_t *h, int signum)
{
    pd_log_info("signal %d: shutting down", signum);
    uv_stop(h->loop);
}

static void node_main__usage(const char *prog)
{
    fprintf(stderr, "usage: %s --config FILE --node NAME [--set KEY=VALUE ...]\n", prog);
}

int node_main(int argc, char **argv, cluster_role_t role)
{
    const char *config = NULL, *name = NULL;
    cluster_config_t *cfg = NULL;
    const cluster_node_t *node;
    uv_loop_t loop;
    uv_signal_t sigint, sigterm;
    decode_node_t *dn = NULL;
    prefill_node_t *pn = NULL;
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            config = argv[++i];
        else if (strcmp(argv[i], "--node") == 0 && i + 1 < argc)
            name = argv[++i];
        else if ((strcmp(argv[i], "--set") == 0 || strcmp(argv[i], "--log-level") == 0) &&
                 i + 1 < argc)
            i++; /* applied below, once the file is loaded */
        else {
            fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], argv[i]);
            node_main__usage(argv[0]);
            return 2;
        }
    }
    if (!config || !name) {
        node_main__usage(argv[0]);
        return 2;
    }
    pd_log_set_tag(name);
    if (cluster_config_load(config, &cfg) != PD_OK)
        return 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--log-level") == 0) {
            const char *l = argv[i + 1];
            pd_log_set_level(strcmp(l, "debug") == 0  ? PD_LOG_DEBUG
                             : strcmp(l, "warn") == 0 ? PD_LOG_WARN
                             : strcmp(l, "error") == 0 ? PD_LOG_ERROR
                                                       : PD_LOG_INFO);
        }
        if (strcmp(argv[i], "--set") != 0)
            continue;
        char kv[512], *eq;
        snprintf(kv, sizeof kv, "%s", argv[i + 1]);
        if (!(eq = strchr(kv, '='))) {
            fprintf(stderr, "%s: --set %s: expected KEY=VALUE\n", argv[0], argv[i + 1]);
            goto out;
        }
        *eq = 0;
        if (cluster_config_override(cfg, name, kv, eq + 1) != PD_OK)
            goto out;
    }
    if (!(node = cluster_config_find_node(cfg, name))) {
        pd_log_error("%s: no node named '%s'", cfg->source, name);
        goto out;
    }
    if (node->role != role) {
        pd_log_error("%s: node '%s' is a %s node, not a %s node", cfg->source, name,
                     cluster_config_role_str(node->role), cluster_config_role_str(role));
        goto out;
    }
    if (cfg->transport.ucx_tls[0])
        setenv("UCX_TLS", cfg->transport.ucx_tls, 0);
    uv_loop_init(&loop);
    if (role == CLUSTER_ROLE_DECODE ? decode_node_create(&loop, cfg, node, &dn) != PD_OK
                                    : prefill_node_create(&loop, cfg, node, &pn) != PD_OK) {
        pd_log_error("%s: cannot start", name);
        uv_loop_close(&loop);
        goto out;
    }
    uv_signal_init(&loop, &sigint);
    uv_signal_init(&loop, &sigterm);
    uv_signal_start(&sigint, node_main__signal, SIGINT);
    uv_signal_start(&sigterm, node_main__signal, SIGTERM);
    uv_run(&loop, UV_RUN_DEFAULT);
    rc = (dn && decode_node_failed(dn)) || (pn && prefill_node_failed(pn)) ? 1 : 0;
    uv_signal_stop(&sigint);
    uv_signal_stop(&sigterm);
    uv_close((uv_handle_t *)&sigint, NULL);
    uv_close((uv_handle_t *)&sigterm, NULL);
    decode_node_destroy(dn);
    prefill_node_destroy(pn);
    uv_run(&loop, UV_RUN_DEFAULT); /* let closing handles and draining calls finish */
    if (uv_loop_close(&loop) != 0)
        pd_log_warn("loop still has handles at exit");
    pd_log_info("stopped");
out:
    cluster_config_destroy(cfg);
    return rc;
}
