/* pdctl: the command-line tool. Each command is a function taking argc/argv (argv[0] is the
 * command name) and returning the process exit status. */
#ifndef PD_PDCTL_H
#define PD_PDCTL_H

#include "engine.h"

int pdctl_tokenize(int argc, char **argv);
int pdctl_generate(int argc, char **argv);
int pdctl_ppl(int argc, char **argv);
int pdctl_quantize(int argc, char **argv);
int pdctl_agree(int argc, char **argv);
int pdctl_kv_plan(int argc, char **argv);
/* pdctl synth (pdctl_synth.c). */
int pdctl_synth(int argc, char **argv);

/* Cluster commands (pdctl_cluster.c). */
int pdctl_up(int argc, char **argv);
int pdctl_down(int argc, char **argv);
int pdctl_health(int argc, char **argv);
int pdctl_models(int argc, char **argv);
/* pdctl_members.c: the router's pdserve.v1.Cluster service */
int pdctl_nodes(int argc, char **argv);
int pdctl_drain(int argc, char **argv);
int pdctl_undrain(int argc, char **argv);
/* "Bearer TOKEN" from $var or the token file $var_FILE (cluster_config_read_token); "" when
 * neither is set. */
void pdctl_bearer(const char *var, char *out, size_t cap);
/* TLS to the router (its public gRPC port with router.tls_cert / tls_key): on with --tls-ca FILE
 * (or $PDSERVE_TLS_CA), or when the cluster file (--config) gives the router a certificate; the
 * server certificate is verified against that CA file (none given: the system's CAs) and the name
 * --tls-server-name NAME / $PDSERVE_TLS_SERVER_NAME (default: the router's host), ALPN h2. */
typedef struct {
    int on;
    const char *ca, *name;
} pdctl_tls_t;
/* From the environment. */
void pdctl_tls_init(pdctl_tls_t *t);
/* --tls-ca, --tls-server-name: returns 1 when name is one of them, else 0. */
int pdctl_tls_opt(pdctl_tls_t *t, const char *name, const char *value);
/* Makes c a TLS client when t->on; 0, or -1 (message printed, with cmd) when the CA cannot be
 * read. */
struct pd_grpc_client;
int pdctl_tls_apply(const char *cmd, const pdctl_tls_t *t, struct pd_grpc_client *c);

/* pdctl generate --router HOST:PORT ...: pdctl_generate hands over to it when --router is given. */
int pdctl_generate_router(int argc, char **argv);

/* Shared option handling for commands that load a model. */
typedef struct {
    engine_params_t ep;
    const char *weights, *kv, *lm_head;
} pdctl_model_opts_t;

void pdctl_model_opts_init(pdctl_model_opts_t *o);
/* Handles one model option (--model, --weights, --kv, --lm-head, --backend, --threads,
 * --kv-budget, --page-tokens, --tracker, --device); returns 1 if it was one, 0 if not, -1 on a
 * bad value (message printed). */
int pdctl_model_opt(pdctl_model_opts_t *o, const char *name, const char *value);
/* Validates and fills o->ep; returns 0 or -1 (message printed). */
int pdctl_model_opts_finish(pdctl_model_opts_t *o);

/* Parses "123", "64MiB", "2GiB", "512KiB"; -1 on error. */
int64_t pdctl_parse_bytes(const char *s);

#endif
