/* router_grpc: pdserve.v1.Inference on the router (Generate, Abort, GetModelInfo, Tokenize). */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "router_internal.h"

/* A Generate call's sink state: output the client has not accepted yet (flow control). */
typedef struct {
    pd_grpc_call_t *call;
    rreq_t *q;
    int32_t *ids;
    int n_ids, cap_ids;
    char *text;
    size_t text_len, text_cap;
    int final_pending, done;
    char reason[16];
    uint32_t prompt_tokens, completion_tokens;
    char request_id[96];
} gsink_t;

static void gsink__free(gsink_t *g)
{
    free(g->ids);
    free(g->text);
    free(g);
}

static void gsink__send_final(gsink_t *g)
{
    Pdserve__V1__GenerateResponse m = PDSERVE__V1__GENERATE_RESPONSE__INIT;
    Pdserve__V1__Usage u = PDSERVE__V1__USAGE__INIT;
    u.prompt_tokens = g->prompt_tokens;
    u.completion_tokens = g->completion_tokens;
    m.finish_reason = g->reason;
    m.usage = &u;
    m.request_id = g->request_id;
    (void)pd_grpc_call_send(g->call, &m.base);
    pd_grpc_call_finish(g->call, 0, NULL);
    gsink__free(g);
}

static void gsink__writable(pd_grpc_call_t *call, void *arg);

/* Sends what is pending; returns 0 when all went out (or the call is gone). */
static int gsink__flush(gsink_t *g)
{
    Pdserve__V1__GenerateResponse m = PDSERVE__V1__GENERATE_RESPONSE__INIT;
    if (g->n_ids == 0 && g->text_len == 0)
        return 0;
    m.token_ids = g->ids;
    m.n_token_ids = (size_t)g->n_ids;
    m.text = g->text ? g->text : "";
    m.request_id = g->request_id;
    if (pd_grpc_call_send(g->call, &m.base) == PD_AGAIN) {
        pd_grpc_call_set_writable_cb(g->call, gsink__writable, g);
        return 1;
    }
    g->n_ids = 0;
    g->text_len = 0;
    if (g->text)
        g->text[0] = 0;
    return 0;
}

static void gsink__writable(pd_grpc_call_t *call, void *arg)
{
    gsink_t *g = arg;
    (void)call;
    if (gsink__flush(g) == 0 && g->final_pending)
        gsink__send_final(g);
}

static void gsink_delta(rreq_t *q, const int32_t *ids, int n, const char *text, size_t len)
{
    gsink_t *g = q->sink_arg;
    if (g->n_ids + n > g->cap_ids) {
        g->cap_ids = (g->n_ids + n) * 2 + 8;
        g->ids = realloc(g->ids, (size_t)g->cap_ids * sizeof *g->ids);
        PD_ASSERT(g->ids);
    }
    memcpy(g->ids + g->n_ids, ids, (size_t)n * sizeof *ids);
    g->n_ids += n;
    if (g->text_len + len + 1 > g->text_cap) {
        g->text_cap = (g->text_len + len + 1) * 2;
        g->text = realloc(g->text, g->text_cap);
        PD_ASSERT(g->text);
    }
    memcpy(g->text + g->text_len, text, len);
    g->text_len += len;
    g->text[g->text_len] = 0;
    (void)gsink__flush(g);
}

static void gsink_finish(rreq_t *q, const char *reason, pd_status_t st, const char *msg)
{
    gsink_t *g = q->sink_arg;
    g->q = NULL;
    router_observe(q->r, q, st);
    if (st != PD_OK) {
        pd_grpc_call_finish_status(g->call, st, msg);
        gsink__free(g);
        return;
    }
    snprintf(g->reason, sizeof g->reason, "%s", reason);
    g->prompt_tokens = (uint32_t)q->n_prompt;
    g->completion_tokens = (uint32_t)q->n_generated;
    if (gsink__flush(g) != 0) {
        g->final_pending = 1; /* sent once the client reads */
        return;
    }
    gsink__send_final(g);
}

static const rsink_t grpc_sink = {gsink_delta, gsink_finish};

static void router__generate_cancelled(pd_grpc_call_t *call, void *arg)
{
    gsink_t *g = arg;
    if (g->q) {
        rreq_t *q = g->q;
        g->q = NULL;
        router_request_cancel(q);
        pd_grpc_call_finish(call, 1, "cancelled");
        gsink__free(g);
    } else if (g->final_pending) {
        pd_grpc_call_finish(call, 1, "cancelled");
        gsink__free(g);
    }
}

static void router__rpc_generate(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_t *r = user;
    const Pdserve__V1__GenerateRequest *req = (const Pdserve__V1__GenerateRequest *)msg;
    router_request_t in = {0};
    char err[512];
    gsink_t *g = calloc(1, sizeof *g);
    pd_status_t st;

    if (!g) {
        pd_grpc_call_finish_status(call, PD_ERR_NOMEM, NULL);
        return;
    }
    g->call = call;
    in.request_id = req->request_id;
    in.text = req->text;
    in.token_ids = req->token_ids;
    in.n_token_ids = req->n_token_ids;
    if (req->sampling) {
        in.max_tokens = (int)req->sampling->max_tokens;
        in.temperature = req->sampling->temperature;
        in.top_p = req->sampling->top_p;
        in.top_k = req->sampling->top_k;
        in.seed = req->sampling->seed;
        in.ignore_eos = req->sampling->ignore_eos;
        in.stop = req->sampling->stop;
        in.n_stop = req->sampling->n_stop;
    }
    int64_t left = pd_grpc_call_deadline_ms(call);
    in.timeout_ms = left > 0 ? left : 0;
    st = router_request_start(r, &in, &grpc_sink, g, &g->q, err, sizeof err);
    if (st != PD_OK) {
        gsink__free(g);
        pd_grpc_call_finish_status(call, st, err);
        return;
    }
    snprintf(g->request_id, sizeof g->request_id, "%s", g->q->request_id);
    pd_grpc_call_set_cancel_cb(call, router__generate_cancelled, g);
}

static void router__rpc_abort(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_t *r = user;
    const Pdserve__V1__AbortRequest *req = (const Pdserve__V1__AbortRequest *)msg;
    Pdserve__V1__AbortResponse rep = PDSERVE__V1__ABORT_RESPONSE__INIT;
    rreq_t *q = req->request_id ? router_request_find(r, req->request_id) : NULL;
    if (q) {
        rep.found = 1;
        rreq_finish(q, "abort", PD_OK, NULL);
    }
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
}

static void router__rpc_model_info(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_t *r = user;
    Pdserve__V1__ModelInfo m = PDSERVE__V1__MODEL_INFO__INIT;
    (void)msg;
    m.model_name = r->model_name;
    m.architecture = r->model.architecture;
    m.context_length = (uint32_t)r->model.max_position_embeddings;
    m.vocab_size = (uint32_t)r->model.vocab_size;
    m.prefill_weights = m.prefill_kv = m.decode_weights = m.decode_kv = "";
    for (int i = 0; i < r->n_nodes; i++) {
        const cluster_node_t *n = r->nodes[i].node;
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

static void router__rpc_tokenize(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_t *r = user;
    const Pdserve__V1__TokenizeRequest *req = (const Pdserve__V1__TokenizeRequest *)msg;
    Pdserve__V1__TokenizeResponse rep = PDSERVE__V1__TOKENIZE_RESPONSE__INIT;
    const char *text = req->text ? req->text : "";
    int32_t *ids;
    size_t n, bad;
    char err[128];
    if (!tokenizer_utf8_valid(text, strlen(text), &bad)) {
        snprintf(err, sizeof err, "text is not valid UTF-8 (byte %zu)", bad);
        pd_grpc_call_finish_status(call, PD_ERR_INVALID, err);
        return;
    }
    if (tokenizer_encode(r->tok, text, strlen(text), !req->no_special_tokens, &ids, &n) != PD_OK) {
        pd_grpc_call_finish_status(call, PD_ERR_INVALID, "text could not be tokenized");
        return;
    }
    rep.token_ids = ids;
    rep.n_token_ids = n;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
    free(ids);
}

static const pd_grpc_method_fn inference_handlers[4] = {router__rpc_generate, router__rpc_abort,
                                                      router__rpc_model_info, router__rpc_tokenize};

pd_status_t router_grpc_register(router_t *r)
{
    return pd_grpc_server_add_service(r->srv, &pdserve__v1__inference__descriptor, inference_handlers,
                                   r);
}
