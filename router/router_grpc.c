#include "router_grpc.h"
#include "router_control.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_health.h"
#include "grpc_server.h"
#include "grpc_stream_buf.h"
#include "log.h"
#include "pdserve.pb-c.h"

/* ==== text that may hold NUL bytes ====
 * protobuf-c unpacks a string field into a NUL-terminated copy and keeps no length, and packs one
 * up to its first NUL, so a prompt holding a NUL byte would silently end there (and so would
 * generated text). The router unpacks GenerateRequest and TokenizeRequest, and packs the text of
 * GenerateResponse, with copies of their descriptors in which `text` is bytes in a field appended
 * to the generated struct (the generated `text` is unused); on the wire string and bytes are the
 * same. */
typedef struct {
    Pdserve__V1__GenerateRequest req;
    ProtobufCBinaryData text;
} gen_request_t;

typedef struct {
    Pdserve__V1__TokenizeRequest req;
    ProtobufCBinaryData text;
} tok_request_t;

typedef struct {
    Pdserve__V1__GenerateResponse resp;
    ProtobufCBinaryData text;
} gen_response_t;

#define BYTES_DESC_MAX_FIELDS 8
typedef struct {
    ProtobufCMessageDescriptor desc;
    ProtobufCFieldDescriptor fields[BYTES_DESC_MAX_FIELDS];
} bytes_desc_t;

struct router_grpc {
    router_t *core;
    pd_grpc_server_t *srv;
    pd_grpc_health_t *health;
    int port;
    int watching; /* the core's serving callback is ours */
    bytes_desc_t gen_desc, tok_desc, resp_desc;
    ProtobufCMethodDescriptor methods[4];
    ProtobufCServiceDescriptor service; /* pdserve.v1.Inference with the two copies */
};

/* b: a copy of src whose string field `field` is read as bytes at offset of a struct of
 * sizeof_message bytes (src's struct with the bytes appended). */
static void router_grpc__bytes_desc(bytes_desc_t *b, const ProtobufCMessageDescriptor *src,
                                    const char *field, size_t sizeof_message, size_t offset)
{
    int found = 0;
    PD_ASSERT(src->n_fields <= BYTES_DESC_MAX_FIELDS);
    b->desc = *src;
    memcpy(b->fields, src->fields, src->n_fields * sizeof *b->fields);
    for (unsigned i = 0; i < src->n_fields; i++) {
        ProtobufCFieldDescriptor *f = &b->fields[i];
        if (strcmp(f->name, field) != 0)
            continue;
        PD_ASSERT(f->type == PROTOBUF_C_TYPE_STRING && f->label == PROTOBUF_C_LABEL_NONE);
        f->type = PROTOBUF_C_TYPE_BYTES;
        f->offset = (unsigned)offset;
        f->default_value = NULL;
        found = 1;
    }
    PD_ASSERT(found);
    b->desc.fields = b->fields;
    b->desc.sizeof_message = sizeof_message;
    b->desc.message_init = NULL; /* protobuf-c zeroes the whole struct, the bytes too */
}

/* api->service: pdserve.v1.Inference, Generate and Tokenize unpacked with the copies. */
static void router_grpc__service_init(router_grpc_t *api)
{
    const ProtobufCServiceDescriptor *src = &pdserve__v1__inference__descriptor;
    PD_ASSERT(src->n_methods == 4);
    router_grpc__bytes_desc(&api->gen_desc, &pdserve__v1__generate_request__descriptor, "text",
                            sizeof(gen_request_t), offsetof(gen_request_t, text));
    router_grpc__bytes_desc(&api->tok_desc, &pdserve__v1__tokenize_request__descriptor, "text",
                            sizeof(tok_request_t), offsetof(tok_request_t, text));
    router_grpc__bytes_desc(&api->resp_desc, &pdserve__v1__generate_response__descriptor, "text",
                            sizeof(gen_response_t), offsetof(gen_response_t, text));
    memcpy(api->methods, src->methods, sizeof api->methods);
    for (int i = 0; i < 4; i++) {
        if (src->methods[i].input == &pdserve__v1__generate_request__descriptor)
            api->methods[i].input = &api->gen_desc.desc;
        else if (src->methods[i].input == &pdserve__v1__tokenize_request__descriptor)
            api->methods[i].input = &api->tok_desc.desc;
    }
    api->service = *src;
    api->service.methods = api->methods;
}

/* ==== Generate: a core request streaming into a flow-controlled call ==== */

/* A Generate call. Freed when its stream buffer releases the call. */
typedef struct {
    router_grpc_t *api;
    pd_grpc_stream_buf_t *out;
    router_req_t *q; /* NULL once the request ended (finished or cancelled) */
    char reason[16];
    uint32_t prompt_tokens, completion_tokens;
    char request_id[96];
} gen_t;

static pd_status_t router_grpc__send_output(pd_grpc_call_t *call, const int32_t *ids, size_t n_ids,
                                            const char *text, size_t text_len, void *arg)
{
    gen_t *g = arg;
    gen_response_t m = {PDSERVE__V1__GENERATE_RESPONSE__INIT, {0, NULL}};
    m.resp.base.descriptor = &g->api->resp_desc.desc; /* text: text_len bytes, NULs and all */
    m.resp.token_ids = (int32_t *)ids;
    m.resp.n_token_ids = n_ids;
    m.text.data = (uint8_t *)text;
    m.text.len = text_len;
    m.resp.request_id = g->request_id;
    return pd_grpc_call_send(call, &m.resp.base);
}

static pd_status_t router_grpc__send_final(pd_grpc_call_t *call, void *arg)
{
    gen_t *g = arg;
    Pdserve__V1__GenerateResponse m = PDSERVE__V1__GENERATE_RESPONSE__INIT;
    Pdserve__V1__Usage u = PDSERVE__V1__USAGE__INIT;
    u.prompt_tokens = g->prompt_tokens;
    u.completion_tokens = g->completion_tokens;
    m.finish_reason = g->reason;
    m.usage = &u;
    m.request_id = g->request_id;
    return pd_grpc_call_send(call, &m.base);
}

/* The client went away before the request ended: cancel it in the core, release the call. */
static void router_grpc__gen_cancelled(void *arg)
{
    gen_t *g = arg;
    router_req_t *q = g->q;
    g->q = NULL;
    if (q)
        router_request_cancel(q);
    pd_grpc_stream_buf_end(g->out, PD_ERR_CANCELLED, NULL); /* frees g */
}

static void router_grpc__gen_released(void *arg)
{
    free(arg);
}

static const pd_grpc_stream_buf_ops_t gen_ops = {router_grpc__send_output, router_grpc__send_final,
                                                 router_grpc__gen_cancelled,
                                                 router_grpc__gen_released};

static void router_grpc__delta(router_req_t *q, void *arg, const int32_t *ids, int n,
                               const char *text, size_t len)
{
    gen_t *g = arg;
    (void)q;
    /* PD_ERR_CANCELLED: the client went away during this send; the request ends on its own
     * (max_tokens, deadline) and its finish then releases the call */
    (void)pd_grpc_stream_buf_append(g->out, ids, (size_t)n, text, len);
}

static void router_grpc__finish(router_req_t *q, void *arg, const char *reason, pd_status_t st,
                                const char *msg)
{
    gen_t *g = arg;
    int prompt, completion;
    g->q = NULL;
    router_request_usage(q, &prompt, &completion);
    g->prompt_tokens = (uint32_t)prompt;
    g->completion_tokens = (uint32_t)completion;
    snprintf(g->reason, sizeof g->reason, "%s", reason ? reason : "");
    pd_grpc_stream_buf_end(g->out, st, msg); /* final message and status once the client read */
}

static const router_sink_t gen_sink = {router_grpc__delta, router_grpc__finish};

static void router_grpc__generate(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_grpc_t *api = user;
    const gen_request_t *wire = (const gen_request_t *)msg;
    const Pdserve__V1__GenerateRequest *req = &wire->req;
    router_request_t in = {0};
    char err[512];
    gen_t *g = calloc(1, sizeof *g);
    pd_status_t st;

    if (g)
        g->api = api;
    if (!g || pd_grpc_stream_buf_create(call, &gen_ops, g, &g->out) != PD_OK) {
        free(g);
        pd_grpc_call_finish_status(call, PD_ERR_NOMEM, "router out of memory for the call");
        return;
    }
    in.request_id = req->request_id;
    in.text = (const char *)wire->text.data;
    in.text_len = wire->text.len;
    in.token_ids = req->token_ids;
    in.n_token_ids = req->n_token_ids;
    if (req->sampling) {
        in.max_tokens = req->sampling->max_tokens;
        in.temperature = req->sampling->temperature;
        in.top_p = req->sampling->top_p;
        in.top_k = req->sampling->top_k;
        in.seed = req->sampling->seed;
        in.ignore_eos = req->sampling->ignore_eos;
        in.stop = req->sampling->stop;
        in.n_stop = req->sampling->n_stop;
    }
    int64_t left = pd_grpc_call_deadline_ms(call); /* -1: no deadline; 0: it passed */
    in.timeout_ms = left > 0 ? left : left == 0 ? -1 : 0;
    st = router_request_start(api->core, &in, &gen_sink, g, &g->q, err, sizeof err);
    if (st != PD_OK) {
        g->q = NULL;
        pd_grpc_stream_buf_end(g->out, st, err); /* frees g */
        return;
    }
    snprintf(g->request_id, sizeof g->request_id, "%s", router_request_id(g->q));
}

/* ==== unary methods ==== */

static void router_grpc__abort(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_grpc_t *api = user;
    const Pdserve__V1__AbortRequest *req = (const Pdserve__V1__AbortRequest *)msg;
    Pdserve__V1__AbortResponse rep = PDSERVE__V1__ABORT_RESPONSE__INIT;
    router_req_t *q = req->request_id ? router_request_find(api->core, req->request_id) : NULL;
    if (q) {
        rep.found = 1;
        router_request_finish(q, "abort", PD_OK, NULL);
    }
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
}

static void router_grpc__model_info(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_grpc_t *api = user;
    const hf_config_t *model = router_model(api->core);
    Pdserve__V1__ModelInfo m = PDSERVE__V1__MODEL_INFO__INIT;
    (void)msg;
    m.model_name = (char *)router_model_name(api->core);
    m.architecture = (char *)model->architecture;
    m.context_length = (uint32_t)model->max_position_embeddings;
    m.vocab_size = (uint32_t)model->vocab_size;
    m.prefill_weights = m.prefill_kv = m.decode_weights = m.decode_kv = "";
    for (int i = 0; i < router_node_count(api->core); i++) {
        router_node_info_t info;
        router_node_info(api->core, i, &info);
        const cluster_node_t *n = info.node;
        if (n->role == CLUSTER_ROLE_PREFILL && !m.prefill_weights[0]) {
            m.prefill_weights = (char *)pd_wfmt_name(n->weights);
            m.prefill_kv = (char *)pd_kvfmt_name(n->kv);
        } else if (n->role == CLUSTER_ROLE_DECODE && !m.decode_weights[0]) {
            m.decode_weights = (char *)pd_wfmt_name(n->weights);
            m.decode_kv = (char *)pd_kvfmt_name(n->kv);
            m.page_tokens = (uint32_t)n->page_tokens;
        }
    }
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &m.base), NULL);
}

static void router_grpc__tokenize(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_grpc_t *api = user;
    const tok_request_t *wire = (const tok_request_t *)msg;
    const Pdserve__V1__TokenizeRequest *req = &wire->req;
    Pdserve__V1__TokenizeResponse rep = PDSERVE__V1__TOKENIZE_RESPONSE__INIT;
    const char *text = wire->text.data ? (const char *)wire->text.data : "";
    size_t len = wire->text.len;
    int32_t *ids;
    size_t n, bad;
    char err[128];
    pd_status_t st;
    if (!tokenizer_utf8_valid(text, len, &bad)) {
        snprintf(err, sizeof err, "text is not valid UTF-8 (byte %zu)", bad);
        pd_grpc_call_finish_status(call, PD_ERR_INVALID, err);
        return;
    }
    if ((st = tokenizer_encode(router_tokenizer(api->core), text, len, !req->no_special_tokens,
                               &ids, &n)) != PD_OK) {
        pd_grpc_call_finish_status(call, st == PD_ERR_NOMEM ? st : PD_ERR_INVALID,
                                   "text could not be tokenized");
        return;
    }
    rep.token_ids = ids;
    rep.n_token_ids = n;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
    free(ids);
}

static const pd_grpc_method_fn inference_handlers[4] = {
    router_grpc__generate, router_grpc__abort, router_grpc__model_info, router_grpc__tokenize};

/* ==== health and lifetime ==== */

static void router_grpc__serving(void *arg, int serving)
{
    router_grpc_t *api = arg;
    int st = serving ? PD_GRPC_HEALTH_SERVING : PD_GRPC_HEALTH_NOT_SERVING;
    pd_grpc_health_set(api->health, "", st);
    pd_grpc_health_set(api->health, "pdserve.v1.Inference", st);
}

static void router_grpc__metrics_source(void *arg, metrics_t *m)
{
    router_grpc_t *api = arg;
    pd_grpc_server_stats_t st;
    pd_grpc_server_stats(api->srv, &st);
    router_metrics_listener(m, "grpc", st.connections, st.max_connections,
                            st.rejected_connections, st.accept_errors, st.idle_closed,
                            st.request_timeouts, st.flood_closed);
}

pd_status_t router_grpc_create(router_t *core, uv_loop_t *loop, const char *host, int port,
                               router_grpc_t **api_p)
{
    router_grpc_t *api = calloc(1, sizeof *api);
    pd_status_t st;

    if (!api)
        return PD_ERR_NOMEM;
    api->core = core;
    router_grpc__service_init(api);
    const cluster_router_t *rc = &router_cluster_config(core)->router; /* 0: server defaults */
    pd_grpc_server_params_t params = {
        .max_concurrent_streams = (uint32_t)rc->max_streams,
        .idle_timeout_ms = (uint32_t)rc->idle_timeout_ms,
        .request_timeout_ms = (uint32_t)rc->body_timeout_ms,
        .max_connections = (size_t)rc->max_connections,
    };
    if ((st = pd_grpc_server_create(loop, &params, &api->srv)) != PD_OK)
        goto err;
    if ((st = pd_grpc_server_add_service(api->srv, &api->service, inference_handlers, api)) !=
        PD_OK)
        goto err;
    if ((st = router_control_add(core, api->srv)) != PD_OK) /* pdserve.v1.Cluster */
        goto err;
    if ((st = pd_grpc_health_create(api->srv, &api->health)) != PD_OK)
        goto err;
    router_grpc__serving(api, router_serving(core));
    if ((st = pd_grpc_server_listen(api->srv, host, port, &api->port)) != PD_OK)
        goto err;
    router_set_serving_cb(core, router_grpc__serving, api);
    (void)router_add_metrics_source(core, router_grpc__metrics_source, api);
    api->watching = 1;
    pd_log_info("router: serving %s on %s:%d (gRPC)", router_model_name(core), host, api->port);
    *api_p = api;
    return PD_OK;
err:
    router_grpc_destroy(api);
    return st;
}

int router_grpc_port(const router_grpc_t *api)
{
    return api->port;
}

pd_grpc_server_t *router_grpc_server(const router_grpc_t *api)
{
    return api->srv;
}

void router_grpc_destroy(router_grpc_t *api)
{
    if (!api)
        return;
    router_remove_metrics_source(api->core, router_grpc__metrics_source, api);
    if (api->watching)
        router_set_serving_cb(api->core, NULL, NULL);
    if (api->srv)
        pd_grpc_server_shutdown(api->srv);
    pd_grpc_server_destroy(api->srv); /* open Generate calls: cancelled, their requests too */
    pd_grpc_health_destroy(api->health);
    free(api);
}
