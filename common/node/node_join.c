#include "node_join.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_client.h"
#include "log.h"
#include "pdserve.pb-c.h"

#define NODE_JOIN_CALL_MS 1000

/* "Bearer TOKEN" from $PDSERVE_OPS_TOKEN or the file $PDSERVE_OPS_TOKEN_FILE (the router's
 * router.ops_token_file), or "" when neither is set. */
static void node_join__bearer(char *out, size_t cap)
{
    const char *env = getenv("PDSERVE_OPS_TOKEN"), *file = getenv("PDSERVE_OPS_TOKEN_FILE");
    char token[512] = "";
    out[0] = 0;
    if (env && *env)
        snprintf(token, sizeof token, "%s", env);
    else if (file && *file && cluster_config_read_token(file, token, sizeof token) != PD_OK)
        token[0] = 0; /* logged */
    if (token[0])
        snprintf(out, cap, "Bearer %s", token);
}

struct node_join {
    uv_loop_t *loop;
    cluster_node_t node;
    char router[CLUSTER_HOST_MAX + 8];
    char bearer[520]; /* "Bearer OPS_TOKEN" or "" */
    pd_grpc_client_t *client;
    pd_grpc_client_call_t *reg_call, *leave_call; /* RegisterNode, DeregisterNode in flight */
    uv_timer_t timer;
    int registered;   /* the last RegisterNode succeeded */
    int failures;     /* RegisterNode failures in a row (logged on the first) */
    int leaving;      /* node_join_leave ran */
    int destroyed;    /* node_join_destroy ran: free once the call and the timer are done */
    int timer_closed; /* the timer's close callback ran */
};

static void node_join__maybe_free(node_join_t *j)
{
    if (!j->destroyed || j->reg_call || j->leave_call || !j->timer_closed)
        return;
    pd_grpc_client_destroy(j->client);
    free(j);
}

static void node_join__timer_closed(uv_handle_t *h)
{
    node_join_t *j = h->data;
    j->timer_closed = 1;
    node_join__maybe_free(j);
}

static void node_join__register(uv_timer_t *t);

static void node_join__register_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    node_join_t *j = arg;
    j->reg_call = NULL;
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    if (j->destroyed || j->leaving) {
        node_join__maybe_free(j);
        return;
    }
    if (code == 0) {
        if (!j->registered)
            pd_log_info("%s: registered with the router at %s", j->node.name, j->router);
        j->registered = 1;
        j->failures = 0;
    } else {
        if (j->failures++ == 0 || j->registered)
            pd_log_warn("%s: cannot register with the router at %s: %s%s%s (retrying)",
                        j->node.name, j->router, pd_grpc_wire_code_name(code),
                        msg && *msg ? ": " : "", msg ? msg : "");
        j->registered = 0;
    }
    if (!j->leaving)
        uv_timer_start(&j->timer, node_join__register,
                       code == 0 ? NODE_JOIN_REFRESH_MS : NODE_JOIN_RETRY_MS, 0);
}

static void node_join__register(uv_timer_t *t)
{
    node_join_t *j = t->data;
    Pdserve__V1__RegisterRequest req = PDSERVE__V1__REGISTER_REQUEST__INIT;
    Pdserve__V1__ClusterNode n = PDSERVE__V1__CLUSTER_NODE__INIT;

    if (j->leaving || j->reg_call)
        return;
    n.name = j->node.name;
    n.role = (char *)cluster_config_role_str(j->node.role);
    n.host = j->node.host;
    n.port = (uint32_t)j->node.port;
    n.page_tokens = (uint32_t)j->node.page_tokens;
    n.tp = (uint32_t)j->node.tp;
    req.node = &n;
    if (pd_grpc_client_unary(j->client, "/pdserve.v1.Cluster/RegisterNode", &req.base,
                             &pdserve__v1__register_reply__descriptor, NODE_JOIN_CALL_MS,
                             node_join__register_done, j, &j->reg_call) != PD_OK) {
        j->reg_call = NULL;
        uv_timer_start(&j->timer, node_join__register, NODE_JOIN_RETRY_MS, 0);
        return;
    }
    if (j->bearer[0])
        (void)pd_grpc_client_call_add_metadata(j->reg_call, "authorization", j->bearer);
}

pd_status_t node_join_create(uv_loop_t *loop, const char *router_addr, const cluster_node_t *node,
                             const char *name, node_join_t **j_p)
{
    const char *colon = strrchr(router_addr, ':');
    char host[CLUSTER_HOST_MAX];
    char *end;
    long port;
    node_join_t *j;

    port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == router_addr || (size_t)(colon - router_addr) >= sizeof host || *end ||
        port < 1 || port > 65535) {
        pd_log_error("--join %s: expected ROUTER_HOST:PORT", router_addr);
        return PD_ERR_INVALID;
    }
    if (name && (!*name || strlen(name) >= sizeof node->name)) {
        pd_log_error("--join-name '%s': 1 to %zu characters", name, sizeof node->name - 1);
        return PD_ERR_INVALID;
    }
    memcpy(host, router_addr, (size_t)(colon - router_addr));
    host[colon - router_addr] = 0;
    if (host[0] == '[' && host[strlen(host) - 1] == ']') { /* [v6]:port */
        memmove(host, host + 1, strlen(host) - 2);
        host[strlen(host) - 2] = 0;
    }
    if (!(j = calloc(1, sizeof *j)))
        return PD_ERR_NOMEM;
    j->loop = loop;
    j->node = *node;
    if (name)
        snprintf(j->node.name, sizeof j->node.name, "%s", name);
    snprintf(j->router, sizeof j->router, "%s", router_addr);
    node_join__bearer(j->bearer, sizeof j->bearer);
    if (pd_grpc_client_create(loop, host, (int)port, &j->client) != PD_OK) {
        free(j);
        return PD_ERR_NOMEM;
    }
    const char *ca = getenv("PDSERVE_TLS_CA"), *sni = getenv("PDSERVE_TLS_SERVER_NAME");
    if (ca && *ca) { /* the router's TLS port: verified against that CA, ALPN h2 */
        pd_grpc_client_tls_t tls = {ca, sni};
        pd_status_t st = pd_grpc_client_set_tls(j->client, &tls);
        if (st != PD_OK) { /* logged */
            pd_grpc_client_destroy(j->client);
            free(j);
            return st;
        }
        pd_log_info("join %s: tls, certificate verified against %s", router_addr, ca);
    }
    uv_timer_init(loop, &j->timer);
    j->timer.data = j;
    uv_timer_start(&j->timer, node_join__register, 0, 0);
    *j_p = j;
    return PD_OK;
}

static void node_join__leave_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    node_join_t *j = arg;
    j->leave_call = NULL;
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    if (code == 0)
        pd_log_info("%s: deregistered from the router at %s", j->node.name, j->router);
    else
        pd_log_warn("%s: deregister from the router at %s: %s%s%s", j->node.name, j->router,
                    pd_grpc_wire_code_name(code), msg && *msg ? ": " : "", msg ? msg : "");
    node_join__maybe_free(j);
}

void node_join_leave(node_join_t *j)
{
    Pdserve__V1__DeregisterRequest req = PDSERVE__V1__DEREGISTER_REQUEST__INIT;

    if (!j || j->leaving)
        return;
    j->leaving = 1;
    uv_timer_stop(&j->timer);
    if (j->reg_call) /* a RegisterNode in flight: its answer no longer matters */
        pd_grpc_client_call_cancel(j->reg_call);
    req.name = j->node.name;
    if (pd_grpc_client_unary(j->client, "/pdserve.v1.Cluster/DeregisterNode", &req.base,
                             &pdserve__v1__deregister_reply__descriptor, NODE_JOIN_CALL_MS,
                             node_join__leave_done, j, &j->leave_call) != PD_OK)
        j->leave_call = NULL;
    else if (j->bearer[0])
        (void)pd_grpc_client_call_add_metadata(j->leave_call, "authorization", j->bearer);
}

void node_join_destroy(node_join_t *j)
{
    if (!j)
        return;
    j->destroyed = 1;
    j->leaving = 1;
    uv_timer_stop(&j->timer);
    uv_close((uv_handle_t *)&j->timer, node_join__timer_closed);
}
