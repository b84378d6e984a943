/* args: the command line the three server binaries share, parsed once with getopt_long:
 *   BINARY --config FILE [--node NAME [--join ROUTER_HOST:PORT [--join-name NAME]]]
 *          [--set KEY=VALUE ...]
 *          [--log-level debug|info|warn|error] [--log-format text|json]
 * The parsed struct points into argv (no copies); --set may repeat (at most PD_ARGS_MAX_SETS).
 * Called by main() only, before any thread starts.
 */
#ifndef PD_ARGS_H
#define PD_ARGS_H

#include <stdbool.h>

#include "log.h"
#include "status.h"

#define PD_ARGS_MAX_SETS 64

typedef struct {
    const char *config;               /* --config FILE (required) */
    const char *node;                 /* --node NAME (required when need_node) */
    const char *sets[PD_ARGS_MAX_SETS]; /* --set KEY=VALUE, in order */
    int n_sets;
    bool have_log_level;
    pd_log_level_t log_level;         /* --log-level */
    const char *join;                 /* --join ROUTER_HOST:PORT (nodes): register with it */
    const char *join_name;            /* --join-name: the name to register (default --node) */
    bool log_json;                    /* --log-format json: one JSON object per log line */
} pd_args_t;

/* Parses argv into *args_p. need_node: --node is required (the nodes) or refused (the router).
 * On a bad command line prints the problem and the usage line to stderr and returns
 * PD_ERR_INVALID (*args_p untouched). */
pd_status_t pd_args_parse(int argc, char **argv, bool need_node, pd_args_t *args_p);

/* Parses a --log-level value ("debug", "info", "warn", "error"). PD_ERR_INVALID otherwise. */
pd_status_t pd_args_log_level(const char *name, pd_log_level_t *level_p);

/* Splits "KEY=VALUE" into key (copied into key_buf, NUL-terminated) and a pointer to VALUE inside
 * set. PD_ERR_INVALID when there is no '=' or the key does not fit. */
pd_status_t pd_args_split_set(const char *set, char *key_buf, size_t key_cap, const char **value_p);

#endif
