#include "router_control.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

const char *router_control_state(const router_node_info_t *info)
{
    if (info->left)
        return "left";
    if (info->draining)
        return info->running == 0 && info->active == 0 ? "drained" : "draining";
    if (info->serving)
        return "serving";
    return info->joined && info->pages_total == 0 ? "joining" : "down";
}

/* Fills m from the node's entry; m's strings point into the router (valid until it changes). */
static void router_control__fill(const router_t *core, int i, Pdserve__V1__ClusterNode *m)
{
    router_node_info_t info;
    router_node_info(core, i, &info);
    m->name = (char *)info.node->name;
    m->role = (char *)cluster_config_role_str(info.node->role);
    m->host = (char *)info.node->host;
    m->port = (uint32_t)info.node->port;
    m->page_tokens = (uint32_t)info.node->page_tokens;
    m->tp = (uint32_t)info.tp;
    m->state = (char *)router_control_state(&info);
    m->running = (uint32_t)info.running;
    m->active = info.active;
    m->pages_used = info.pages_used;
    m->pages_total = info.pages_total;
    m->joined = info.joined;
    m->serving = info.serving;
}

static int router_control__index(const router_t *core, const char *name)
{
    for (int i = 0; i < router_node_count(core); i++) {
        router_node_info_t info;
        router_node_info(core, i, &info);
        if (strcmp(info.node->name, name) == 0)
            return i;
    }
    return -1;
}

/* Replies with the node's entry (after a change), or NOT_FOUND. */
static void router_control__reply_node(pd_grpc_call_t *call, router_t *core, const char *name,
                                       ProtobufCMessage *rep, Pdserve__V1__ClusterNode **slot)
{
    Pdserve__V1__ClusterNode m = PDSERVE__V1__CLUSTER_NODE__INIT;
    int i = router_control__index(core, name);
    if (i < 0) {
        pd_grpc_call_finish(call, PD_GRPC_NOT_FOUND, "no such node");
        return;
    }
    router_control__fill(core, i, &m);
    *slot = &m;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, rep), NULL);
}

static void router_control__register(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_t *core = user;
    const Pdserve__V1__RegisterRequest *req = (const Pdserve__V1__RegisterRequest *)msg;
    const Pdserve__V1__ClusterNode *n = req->node;
    const cluster_config_t *cfg = router_cluster_config(core);
    Pdserve__V1__RegisterReply rep = PDSERVE__V1__REGISTER_REPLY__INIT;
    cluster_node_t node;
    char err[192] = "";
    pd_status_t st;

    memset(&node, 0, sizeof node);
    if (!n || !n->name || !n->name[0] || strlen(n->name) >= sizeof node.name || !n->host ||
        !n->host[0] || strlen(n->host) >= sizeof node.host || n->port < 1 || n->port > 65535 ||
        !n->role || (strcmp(n->role, "prefill") != 0 && strcmp(n->role, "decode") != 0) ||
        (n->page_tokens & (n->page_tokens - 1)) != 0 || n->page_tokens > 4096 || n->tp > 64) {
        pd_grpc_call_finish(call, PD_GRPC_INVALID_ARGUMENT,
                            "node needs name, role (prefill|decode), host, port 1..65535, "
                            "page_tokens 0 or a power of two <= 4096 and tp 0..64");
        return;
    }
    snprintf(node.name, sizeof node.name, "%s", n->name);
    snprintf(node.host, sizeof node.host, "%s", n->host);
    node.port = (int)n->port;
    node.role = strcmp(n->role, "prefill") == 0 ? CLUSTER_ROLE_PREFILL : CLUSTER_ROLE_DECODE;
    node.page_tokens =
        n->page_tokens ? (int)n->page_tokens : (cfg->n_nodes ? cfg->nodes[0].page_tokens : 16);
    node.tp = n->tp ? (int)n->tp : 1;
    if ((st = router_node_register(core, &node, err, sizeof err)) != PD_OK) {
        pd_log_warn("register %s (%s:%u) refused: %s", node.name, node.host, n->port,
                    err[0] ? err : pd_status_str(st));
        pd_grpc_call_finish_status(call, st, err[0] ? err : NULL);
        return;
    }
    router_control__reply_node(call, core, node.name, &rep.base, &rep.node);
}

static void router_control__deregister(pd_grpc_call_t *call, const ProtobufCMessage *msg,
                                       void *user)
{
    router_t *core = user;
    const Pdserve__V1__DeregisterRequest *req = (const Pdserve__V1__DeregisterRequest *)msg;
    Pdserve__V1__DeregisterReply rep = PDSERVE__V1__DEREGISTER_REPLY__INIT;
    if (!req->name || router_node_deregister(core, req->name) != PD_OK) {
        pd_grpc_call_finish(call, PD_GRPC_NOT_FOUND, "no such node");
        return;
    }
    router_control__reply_node(call, core, req->name, &rep.base, &rep.node);
}

static void router_control__drain(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_t *core = user;
    const Pdserve__V1__DrainRequest *req = (const Pdserve__V1__DrainRequest *)msg;
    Pdserve__V1__DrainReply rep = PDSERVE__V1__DRAIN_REPLY__INIT;
    if (!req->name || router_node_drain(core, req->name, !req->undrain) != PD_OK) {
        pd_grpc_call_finish(call, PD_GRPC_NOT_FOUND, "no such node");
        return;
    }
    router_control__reply_node(call, core, req->name, &rep.base, &rep.node);
}

static void router_control__list(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_t *core = user;
    Pdserve__V1__ListNodesReply rep = PDSERVE__V1__LIST_NODES_REPLY__INIT;
    Pdserve__V1__ClusterNode ms[ROUTER_MAX_NODES], *ps[ROUTER_MAX_NODES];
    int n = router_node_count(core);
    (void)msg;
    for (int i = 0; i < n && i < ROUTER_MAX_NODES; i++) {
        pdserve__v1__cluster_node__init(&ms[i]);
        router_control__fill(core, i, &ms[i]);
        ps[i] = &ms[i];
    }
    rep.nodes = ps;
    rep.n_nodes = (size_t)(n < ROUTER_MAX_NODES ? n : ROUTER_MAX_NODES);
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
}

static const pd_grpc_method_fn router_control__handlers[4] = {
    router_control__register, router_control__deregister, router_control__drain,
    router_control__list};

pd_status_t router_control_add(router_t *core, pd_grpc_server_t *srv)
{
    PD_ASSERT(pdserve__v1__cluster__descriptor.n_methods == 4);
    return pd_grpc_server_add_service(srv, &pdserve__v1__cluster__descriptor,
                                      router_control__handlers, core);
}
