/* cluster_config: the cluster YAML file (model, router, transport, nodes), read with libyaml.
 *
 * A cluster_config_t is a plain tree of structs with fixed-size strings and enums, allocated by
 * cluster_config_load/parse and released by cluster_config_destroy; it owns everything it points
 * to. Every error names the file, line and column of the offending YAML node and the key path:
 *   "deploy/local.yaml:12:7: nodes.decode0.kv: unknown value 'fp16' (expected bf16, fp8)"
 * The message is logged once (pd_log_error) where it is found; cluster_config_parse also copies it
 * into an optional caller buffer so tests and the ops tool can show it without scraping stderr.
 * Unknown keys, duplicate keys, duplicate node names and two endpoints on one host:port are
 * errors. Node defaults depend on the role (prefill: fp8 weights, bf16 kv; decode: int4 weights,
 * fp8 kv). The model path is resolved against the YAML file's directory unless absolute.
 *
 * No global state: any thread may call these functions on distinct configs; a config is not
 * synchronized, so overrides must finish before other threads read it.
 */
#ifndef PD_CLUSTER_CONFIG_H
#define PD_CLUSTER_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "args.h"
#include "dtype.h"
#include "status.h"

#define CLUSTER_NAME_MAX 64
#define CLUSTER_HOST_MAX 256
#define CLUSTER_BACKEND_OPTIONS_MAX 256
#define CLUSTER_PATH_MAX 4096

typedef enum { CLUSTER_ROLE_PREFILL = 0, CLUSTER_ROLE_DECODE } cluster_role_t;
typedef enum { CLUSTER_BACKEND_CPU = 0, CLUSTER_BACKEND_CUDA } cluster_backend_t;
typedef enum { CLUSTER_TRACKER_TAGGED = 0, CLUSTER_TRACKER_NOOP } cluster_tracker_t;
typedef enum {
    CLUSTER_PREFILL_ROUND_ROBIN = 0,
    CLUSTER_PREFILL_LEAST_LOAD
} cluster_prefill_policy_t;
typedef enum { CLUSTER_DECODE_LEAST_KV = 0 } cluster_decode_policy_t;

typedef struct {
    char name[CLUSTER_NAME_MAX]; /* unique in the file */
    cluster_role_t role;
    char host[CLUSTER_HOST_MAX];
    int port;      /* control gRPC, 1..65535 */
    int ucx_port;  /* decode: UCX listener, 1..65535; prefill: 0 */
    int http_port; /* /health /metrics on the node; 0 = none */
    cluster_backend_t backend;
    int device; /* GPU ordinal (cuda backend) */
    pd_wfmt_t weights;
    pd_kvfmt_t kv;
    int page_tokens;   /* tokens per KV page, power of two */
    int64_t kv_budget; /* bytes of KV pool */
    int max_batch;
    int prefill_chunk; /* tokens per prefill chunk */
    cluster_tracker_t tracker;
    int threads; /* CPU backend threads, 0 = all cores */
    int tp; /* tensor-parallel ranks (1..16: KvDone carries one checksum per slice): one thread and
               backend per rank (CUDA: GPUs device .. device + tp - 1, NCCL); must divide the
               model's attention and KV heads (checked at load when the model's config.json can be
               read) */
    /* "key=value,..." for backend_set_options (CUDA: kernels/backend_cuda.h) */
    char backend_options[CLUSTER_BACKEND_OPTIONS_MAX];
    int template_; /* "template: true": settings for nodes that join (--join, --join-name: the
                      replicas of a Kubernetes Deployment); the router does not use the entry */
} cluster_node_t;

typedef struct {
    char listen_host[CLUSTER_HOST_MAX]; /* gRPC */
    int listen_port;
    char http_host[CLUSTER_HOST_MAX]; /* OpenAI HTTP + /health /live /ready /metrics */
    int http_port;
    cluster_prefill_policy_t prefill_policy;
    cluster_decode_policy_t decode_policy;
    int64_t request_timeout_ms;
    int max_queue;
    /* network limits of both listeners; 0 (unset): the servers' defaults (http.h, grpc_server.h) */
    int64_t idle_timeout_ms;   /* HTTP: no request; gRPC: no stream (60 s) */
    int64_t header_timeout_ms; /* HTTP request line + headers (10 s) */
    int64_t body_timeout_ms;   /* HTTP body; gRPC: the whole request (30 s) */
    int max_connections;       /* per listener (1024, capped by RLIMIT_NOFILE) */
    int max_streams;           /* gRPC concurrent streams per connection (100) */
    /* with TLS: where the plaintext gRPC server listens for the cluster's own clients (nodes'
     * --join, pdctl drain / nodes), e.g. an internal address; unset: 127.0.0.1, ephemeral */
    char control_host[CLUSTER_HOST_MAX];
    int control_port;
    /* TLS on both public listeners when both are set (PEM files; tls_proxy.h) */
    char tls_cert[CLUSTER_PATH_MAX];
    char tls_key[CLUSTER_PATH_MAX];
    /* credentials (router_auth.h): API keys for Inference and /v1 (one per line), the ops token
     * for pdserve.v1.Cluster and /metrics; "" : that part is open */
    char api_keys_file[CLUSTER_PATH_MAX];
    char ops_token_file[CLUSTER_PATH_MAX];
} cluster_router_t;

typedef struct {
    char ucx_tls[CLUSTER_HOST_MAX]; /* exported as UCX_TLS when not empty */
    int64_t lease_ms;               /* how long a reserved page may wait for its writer */
    /* the cluster token (its first line): the router sends it to the nodes' control ports
     * ("authorization: Bearer TOKEN"), which refuse every other method call; "" : open */
    char cluster_token_file[CLUSTER_PATH_MAX];
} cluster_transport_t;

typedef struct {
    char source[CLUSTER_PATH_MAX]; /* file name used in messages */
    char model[CLUSTER_PATH_MAX];  /* resolved model directory */
    cluster_router_t router;
    cluster_transport_t transport;
    cluster_node_t *nodes; /* (n_nodes) in file order */
    size_t n_nodes;
} cluster_config_t;

/* Reads and validates the cluster file at path; the model path is resolved against the file's
 * directory. Returns PD_OK, PD_ERR_IO (unreadable file), PD_ERR_FORMAT (YAML syntax or a
 * validation error, logged with file:line:col), PD_ERR_NOMEM. *cfg_p is written only on success. */
pd_status_t cluster_config_load(const char *path, cluster_config_t **cfg_p);

/* Parses len bytes of YAML text. name is the file name used in messages (NULL: "<config>");
 * base_dir resolves a relative model path (NULL: left as written). When err is not NULL, the error
 * message (the same line that is logged) is copied there, truncated to err_len; it is set to ""
 * on success. Returns PD_OK, PD_ERR_FORMAT, PD_ERR_NOMEM; *cfg_p is written only on success. */
pd_status_t cluster_config_parse(const char *text, size_t len, const char *name,
                                 const char *base_dir, char *err, size_t err_len,
                                 cluster_config_t **cfg_p);

/* Returns the node called name, or NULL. */
const cluster_node_t *cluster_config_find_node(const cluster_config_t *cfg, const char *name);

/* Applies one command-line override (--set key=value) with the same validation and messages as
 * the file ("--set nodes.decode0.kv: unknown value 'fp16' (expected bf16, fp8)"). With node_name
 * set, key is a node key ("kv", "kv_budget", ...; not "name" or "role"); with node_name NULL,
 * key is a dotted top-level key ("model", "router.http", "transport.lease_ms"). The whole config
 * is revalidated (duplicate endpoints). Returns PD_OK, PD_ERR_NOT_FOUND (no such node),
 * PD_ERR_INVALID (bad key or value); on failure cfg is unchanged. */
pd_status_t cluster_config_override(cluster_config_t *cfg, const char *node_name, const char *key,
                                    const char *value);

/* Releases cfg; NULL is accepted. */
/* Reads a token file: its first non-empty line, trimmed, into out (cap bytes). PD_ERR_IO
 * (unreadable), PD_ERR_FORMAT (empty, spaces inside, longer than cap - 1); logged with path. */
pd_status_t cluster_config_read_token(const char *path, char *out, size_t cap);

void cluster_config_destroy(cluster_config_t *cfg);

/* Spellings used in the file ("prefill", "int4", "least_kv", ...); "?" for out-of-range values. */
const char *cluster_config_role_str(cluster_role_t v);
const char *cluster_config_backend_str(cluster_backend_t v);
const char *cluster_config_tracker_str(cluster_tracker_t v);
const char *cluster_config_prefill_policy_str(cluster_prefill_policy_t v);
const char *cluster_config_decode_policy_str(cluster_decode_policy_t v);

/* Parses "64MiB", "1GiB", "512KiB", "4096" into bytes. Returns PD_OK or PD_ERR_INVALID (bad
 * syntax, zero is allowed, overflow); *bytes_p is written only on success. */
pd_status_t cluster_config_parse_bytes(const char *text, int64_t *bytes_p);

/* What a server binary's main() does with its command line: loads args->config, applies every
 * --set in order (for args->node when given, else router./cluster keys), and sets the log level
 * and tag (args->node, else tag). Errors are logged with file:line:col; PD_ERR_* and *cfg_p
 * untouched. */
pd_status_t cluster_config_load_args(const pd_args_t *args, const char *tag,
                                     cluster_config_t **cfg_p);

#endif
