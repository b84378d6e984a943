#include "args.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void args__usage(const char *prog, bool need_node)
{
    fprintf(stderr,
            "usage: %s --config FILE%s [--set KEY=VALUE ...] "
            "[--log-level debug|info|warn|error] [--log-format text|json]\n",
            prog, need_node ? " --node NAME [--join ROUTER_HOST:PORT [--join-name NAME]]" : "");
}

pd_status_t pd_args_log_level(const char *name, pd_log_level_t *level_p)
{
    static const struct {
        const char *name;
        pd_log_level_t level;
    } levels[] = {{"debug", PD_LOG_DEBUG}, {"info", PD_LOG_INFO}, {"warn", PD_LOG_WARN},
                  {"error", PD_LOG_ERROR}};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        if (strcmp(name, levels[i].name) == 0) {
            *level_p = levels[i].level;
            return PD_OK;
        }
    }
    return PD_ERR_INVALID;
}

pd_status_t pd_args_split_set(const char *set, char *key_buf, size_t key_cap, const char **value_p)
{
    const char *eq = strchr(set, '=');
    size_t n;

    if (!eq || eq == set)
        return PD_ERR_INVALID;
    n = (size_t)(eq - set);
    if (n + 1 > key_cap)
        return PD_ERR_INVALID;
    memcpy(key_buf, set, n);
    key_buf[n] = 0;
    *value_p = eq + 1;
    return PD_OK;
}

pd_status_t pd_args_parse(int argc, char **argv, bool need_node, pd_args_t *args_p)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"node", required_argument, NULL, 'n'},
        {"set", required_argument, NULL, 's'},
        {"log-level", required_argument, NULL, 'l'},
        {"join", required_argument, NULL, 'j'},
        {"join-name", required_argument, NULL, 'J'},
        {"log-format", required_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *prog = argc > 0 ? argv[0] : "pdserve";
    pd_args_t a;
    int c;

    memset(&a, 0, sizeof a);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            a.config = optarg;
            break;
        case 'n':
            if (!need_node) {
                fprintf(stderr, "%s: --node is not an option of this binary\n", prog);
                args__usage(prog, need_node);
                return PD_ERR_INVALID;
            }
            a.node = optarg;
            break;
        case 's': {
            char key[256];
            const char *value;
            if (a.n_sets == PD_ARGS_MAX_SETS) {
                fprintf(stderr, "%s: more than %d --set options\n", prog, PD_ARGS_MAX_SETS);
                return PD_ERR_INVALID;
            }
            if (pd_args_split_set(optarg, key, sizeof key, &value) != PD_OK) {
                fprintf(stderr, "%s: --set %s: expected KEY=VALUE\n", prog, optarg);
                return PD_ERR_INVALID;
            }
            a.sets[a.n_sets++] = optarg;
            break;
        }
        case 'l':
            if (pd_args_log_level(optarg, &a.log_level) != PD_OK) {
                fprintf(stderr, "%s: --log-level %s: expected debug, info, warn or error\n", prog,
                        optarg);
                return PD_ERR_INVALID;
            }
            a.have_log_level = true;
            break;
        case 'j':
            if (!need_node) {
                fprintf(stderr, "%s: --join is not an option of this binary\n", prog);
                args__usage(prog, need_node);
                return PD_ERR_INVALID;
            }
            a.join = optarg;
            break;
        case 'J':
            if (!need_node) {
                fprintf(stderr, "%s: --join-name is not an option of this binary\n", prog);
                return PD_ERR_INVALID;
            }
            a.join_name = optarg;
            break;
        case 'f':
            if (strcmp(optarg, "json") != 0 && strcmp(optarg, "text") != 0) {
                fprintf(stderr, "%s: --log-format %s: expected text or json\n", prog, optarg);
                return PD_ERR_INVALID;
            }
            a.log_json = strcmp(optarg, "json") == 0;
            break;
        case 'h':
            args__usage(prog, need_node);
            return PD_ERR_INVALID;
        default:
            if (optopt)
                fprintf(stderr, "%s: option '%s' needs a value\n", prog, argv[optind - 1]);
            else
                fprintf(stderr, "%s: unknown argument '%s'\n", prog, argv[optind - 1]);
            args__usage(prog, need_node);
            return PD_ERR_INVALID;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unknown argument '%s'\n", prog, argv[optind]);
        args__usage(prog, need_node);
        return PD_ERR_INVALID;
    }
    if (!a.config || (need_node && !a.node)) {
        args__usage(prog, need_node);
        return PD_ERR_INVALID;
    }
    *args_p = a;
    return PD_OK;
}
