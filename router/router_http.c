#include "router_http.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "chat_template.h"
#include "clock.h"
#include "http.h"
#include "log.h"

struct router_http {
    router_t *core;
    pd_http_server_t *srv;
    int port;
};

/* ==== probes, metrics, models ==== */

static void router_http__metrics(pd_http_request_t *req, void *user)
{
    router_http_t *api = user;
    char *text;
    size_t len;
    if (metrics_render(router_metrics(api->core), &text, &len) != PD_OK) {
        pd_http_respond_error(req, PD_ERR_NOMEM, "metrics");
        return;
    }
    pd_http_respond(req, 200, "text/plain; version=0.0.4", text, len);
    free(text);
}

static void router_http__live(pd_http_request_t *req, void *user)
{
    (void)user;
    pd_http_respond_json(req, 200, json_pack("{s:s}", "status", "alive"));
}

static void router_http__ready(pd_http_request_t *req, void *user)
{
    router_http_t *api = user;
    json_t *nodes = json_array();
    for (int i = 0; i < router_node_count(api->core); i++) {
        router_node_info_t n;
        router_node_info(api->core, i, &n);
        json_array_append_new(nodes,
                              json_pack("{s:s,s:s,s:b,s:i,s:i}", "name", n.node->name, "role",
                                        cluster_config_role_str(n.node->role), "serving", n.serving,
                                        "kv_pages_used", (int)n.pages_used, "kv_pages_total",
                                        (int)n.pages_total));
    }
    int ok = router_serving(api->core);
    pd_http_respond_json(
        req, ok ? 200 : 503,
        json_pack("{s:s,s:o}", "status", ok ? "ready" : "not ready", "nodes", nodes));
}

static void router_http__models(pd_http_request_t *req, void *user)
{
    router_http_t *api = user;
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", router_model_name(api->core), "object",
                          "model", "created", (json_int_t)0, "owned_by", "pdserve", "max_model_len",
                          router_model(api->core)->max_position_embeddings);
    pd_http_respond_json(req, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

/* ==== completions ==== */

/* A completion request: its core request's output as SSE chunks or one JSON body. */
typedef struct {
    router_http_t *api;
    pd_http_request_t *req;
    router_req_t *q; /* NULL once the request ended */
    int stream, chat, first;
    char id[128];
    json_int_t created;
    char *text;
    size_t len, cap;
} hsink_t;

static void hsink__free(hsink_t *h)
{
    free(h->text);
    free(h);
}

static json_t *hsink__chunk(hsink_t *h, const char *text, size_t len, const char *finish)
{
    json_t *choice;
    if (h->chat) {
        json_t *delta = json_object();
        if (h->first)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (len || !finish)
            json_object_set_new(delta, "content", json_stringn(text, len));
        choice = json_pack("{s:i,s:o}", "index", 0, "delta", delta);
    } else {
        choice = json_pack("{s:i,s:s%,s:n}", "index", 0, "text", text, len, "logprobs");
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    h->first = 0;
    return json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", h->id, "object",
                     h->chat ? "chat.completion.chunk" : "text_completion", "created", h->created,
                     "model", router_model_name(h->api->core), "choices", choice);
}

static void hsink__sse(hsink_t *h, json_t *obj)
{
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (s)
        (void)pd_http_stream_sse(h->req, s);
    free(s);
}

static void hsink_delta(router_req_t *q, void *arg, const int32_t *ids, int n, const char *text,
                        size_t len)
{
    hsink_t *h = arg;
    (void)q;
    (void)ids;
    (void)n;
    if (h->stream) {
        if (len || h->first)
            hsink__sse(h, hsink__chunk(h, text, len, NULL));
        return;
    }
    if (h->len + len + 1 > h->cap) {
        h->cap = (h->len + len + 1) * 2;
        h->text = realloc(h->text, h->cap);
        PD_ASSERT(h->text);
    }
    memcpy(h->text + h->len, text, len);
    h->len += len;
    h->text[h->len] = 0;
}

static void hsink_finish(router_req_t *q, void *arg, const char *reason, pd_status_t st,
                         const char *msg)
{
    hsink_t *h = arg;
    int prompt, completion;
    router_request_usage(q, &prompt, &completion);
    h->q = NULL;
    pd_http_request_set_close_cb(h->req, NULL, NULL); /* h is freed below */
    if (h->stream) {
        if (st == PD_OK) {
            json_t *c = hsink__chunk(h, "", 0, reason);
            json_object_set_new(c, "usage",
                                json_pack("{s:i,s:i,s:i}", "prompt_tokens", prompt,
                                          "completion_tokens", completion, "total_tokens",
                                          prompt + completion));
            hsink__sse(h, c);
        } else {
            json_t *err = json_pack("{s:{s:s,s:s,s:i}}", "error", "message", msg ? msg : "", "type",
                                    pd_status_name(st), "code", pd_status_http_code(st));
            hsink__sse(h, err);
        }
        (void)pd_http_stream_write(h->req, "data: [DONE]\n\n", 14);
        (void)pd_http_stream_end(h->req);
    } else if (st != PD_OK) {
        pd_http_respond_error(h->req, st, msg);
    } else {
        json_t *choice =
            h->chat
                ? json_pack("{s:i,s:{s:s,s:s%},s:s}", "index", 0, "message", "role", "assistant",
                            "content", h->text ? h->text : "", h->len, "finish_reason", reason)
                : json_pack("{s:i,s:s%,s:n,s:s}", "index", 0, "text", h->text ? h->text : "",
                            h->len, "logprobs", "finish_reason", reason);
        pd_http_respond_json(h->req, 200,
                             json_pack("{s:s,s:s,s:I,s:s,s:[o],s:{s:i,s:i,s:i}}", "id", h->id,
                                       "object", h->chat ? "chat.completion" : "text_completion",
                                       "created", h->created, "model",
                                       router_model_name(h->api->core), "choices", choice, "usage",
                                       "prompt_tokens", prompt, "completion_tokens", completion,
                                       "total_tokens", prompt + completion));
    }
    hsink__free(h);
}

static const router_sink_t http_sink = {hsink_delta, hsink_finish};

/* The client went away before the request ended: cancel it in the core and finish the HTTP
 * request (after a disconnect that only frees it). */
static void router_http__closed(pd_http_request_t *req, void *arg)
{
    hsink_t *h = arg;
    router_req_t *q = h->q;
    h->q = NULL;
    if (q)
        router_request_cancel(q);
    if (h->stream)
        (void)pd_http_stream_end(req);
    else
        (void)pd_http_respond_error(req, PD_ERR_CANCELLED, NULL);
    hsink__free(h);
}

/* Reads the OpenAI sampling fields into in; returns 0 or -1 with err set. */
static int router_http__sampling(json_t *body, router_request_t *in, char *err, size_t err_len)
{
    json_t *v;
    in->max_tokens = 16;
    in->temperature = 1.0f;
    in->top_p = 1.0f;
    if ((v = json_object_get(body, "max_tokens")) ||
        (v = json_object_get(body, "max_completion_tokens"))) {
        if (!json_is_integer(v)) {
            snprintf(err, err_len, "max_tokens must be an integer");
            return -1;
        }
        in->max_tokens = (int)json_integer_value(v);
    }
    if ((v = json_object_get(body, "temperature")) && !json_is_null(v)) {
        if (!json_is_number(v)) {
            snprintf(err, err_len, "temperature must be a number");
            return -1;
        }
        in->temperature = (float)json_number_value(v);
    }
    if ((v = json_object_get(body, "top_p")) && !json_is_null(v)) {
        if (!json_is_number(v)) {
            snprintf(err, err_len, "top_p must be a number");
            return -1;
        }
        in->top_p = (float)json_number_value(v);
        if (in->top_p <= 0.0f) {
            snprintf(err, err_len, "top_p must be in (0, 1]");
            return -1;
        }
    }
    if ((v = json_object_get(body, "top_k")) && json_is_integer(v))
        in->top_k = (int)json_integer_value(v);
    if ((v = json_object_get(body, "seed")) && json_is_integer(v))
        in->seed = (uint64_t)json_integer_value(v);
    if ((v = json_object_get(body, "ignore_eos")) && json_is_boolean(v))
        in->ignore_eos = json_is_true(v);
    return 0;
}

static void router_http__completion(pd_http_request_t *req, router_http_t *api, int chat)
{
    const char *chat_template, *bos, *eos;
    json_t *body = NULL, *v;
    router_request_t in = {0};
    char err[512], *prompt_buf = NULL;
    char *stops[16];
    int32_t *ids = NULL;
    hsink_t *h = NULL;
    pd_status_t st;

    if (pd_http_request_json(req, &body) != PD_OK || !json_is_object(body)) {
        pd_http_respond_error(req, PD_ERR_INVALID, "request body must be a JSON object");
        json_decref(body);
        return;
    }
    if (router_http__sampling(body, &in, err, sizeof err) != 0)
        goto bad;
    v = json_object_get(body, "stop");
    if (json_is_string(v)) {
        stops[0] = (char *)json_string_value(v);
        in.stop = stops;
        in.n_stop = 1;
    } else if (json_is_array(v)) {
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s)
        {
            if (!json_is_string(s) || in.n_stop == 16) {
                snprintf(err, sizeof err, "stop must be a string or at most 16 strings");
                goto bad;
            }
            stops[in.n_stop++] = (char *)json_string_value(s);
        }
        in.stop = stops;
    }
    if (chat) {
        json_t *msgs = json_object_get(body, "messages"), *m;
        size_t n = json_array_size(msgs), i;
        if (!json_is_array(msgs) || n == 0) {
            snprintf(err, sizeof err, "messages must be a non-empty array");
            goto bad;
        }
        chat_template = router_chat_template(api->core, &bos, &eos);
        if (!chat_template) {
            snprintf(err, sizeof err, "this model has no chat template; use /v1/completions");
            goto bad;
        }
        chat_message_t *cm = calloc(n, sizeof *cm);
        PD_ASSERT(cm);
        json_array_foreach(msgs, i, m)
        {
            cm[i].role = json_string_value(json_object_get(m, "role"));
            cm[i].content = json_string_value(json_object_get(m, "content"));
            if (!cm[i].role || !cm[i].content) {
                free(cm);
                snprintf(err, sizeof err, "messages[%zu] needs string role and content", i);
                goto bad;
            }
        }
        st = chat_template_render(chat_template, cm, n, true, bos, eos, &prompt_buf);
        free(cm);
        if (st != PD_OK) {
            snprintf(err, sizeof err, "the model's chat template could not be rendered");
            goto bad;
        }
        in.text = prompt_buf;
    } else {
        v = json_object_get(body, "prompt");
        if (json_is_string(v)) {
            in.text = json_string_value(v);
        } else if (json_is_array(v) && json_array_size(v) > 0 &&
                   json_is_integer(json_array_get(v, 0))) {
            size_t i;
            json_t *x;
            ids = malloc(json_array_size(v) * sizeof *ids);
            PD_ASSERT(ids);
            json_array_foreach(v, i, x)
            {
                if (!json_is_integer(x)) {
                    snprintf(err, sizeof err, "prompt: token ids must be integers");
                    goto bad;
                }
                ids[i] = (int32_t)json_integer_value(x);
            }
            in.token_ids = ids;
            in.n_token_ids = json_array_size(v);
        } else {
            snprintf(err, sizeof err, "prompt must be a string or an array of token ids");
            goto bad;
        }
    }
    h = calloc(1, sizeof *h);
    PD_ASSERT(h);
    h->api = api;
    h->req = req;
    h->chat = chat;
    h->first = 1;
    h->stream = json_is_true(json_object_get(body, "stream"));
    h->created = (json_int_t)time(NULL);
    st = router_request_start(api->core, &in, &http_sink, h, &h->q, err, sizeof err);
    if (st != PD_OK) {
        free(h);
        pd_http_respond_error(req, st, err);
        goto out;
    }
    snprintf(h->id, sizeof h->id, "%s-%s", chat ? "chatcmpl" : "cmpl", router_request_id(h->q));
    if (h->stream)
        (void)pd_http_stream_begin(req, 200, "text/event-stream");
    pd_http_request_set_close_cb(req, router_http__closed, h);
    goto out;
bad:
    pd_http_respond_error(req, PD_ERR_INVALID, err);
out:
    free(ids);
    free(prompt_buf);
    json_decref(body);
}

static void router_http__completions(pd_http_request_t *req, void *user)
{
    router_http__completion(req, user, 0);
}

static void router_http__chat(pd_http_request_t *req, void *user)
{
    router_http__completion(req, user, 1);
}

/* ==== lifetime ==== */

pd_status_t router_http_create(router_t *core, uv_loop_t *loop, const char *host, int port,
                               router_http_t **api_p)
{
    router_http_t *api = calloc(1, sizeof *api);
    pd_status_t st;

    if (!api)
        return PD_ERR_NOMEM;
    api->core = core;
    const cluster_router_t *rc = &router_cluster_config(core)->router; /* 0: server defaults */
    pd_http_server_params_t params = {
        .idle_timeout_ms = (uint32_t)rc->idle_timeout_ms,
        .header_timeout_ms = (uint32_t)rc->header_timeout_ms,
        .body_timeout_ms = (uint32_t)rc->body_timeout_ms,
        .max_connections = (size_t)rc->max_connections,
    };
    if ((st = pd_http_server_create(loop, &params, &api->srv)) != PD_OK)
        goto err;
    pd_http_server_route(api->srv, "GET", "/live", router_http__live, api);
    pd_http_server_route(api->srv, "GET", "/ready", router_http__ready, api);
    pd_http_server_route(api->srv, "GET", "/health", router_http__ready, api);
    pd_http_server_route(api->srv, "GET", "/metrics", router_http__metrics, api);
    pd_http_server_route(api->srv, "GET", "/v1/models", router_http__models, api);
    pd_http_server_route(api->srv, "POST", "/v1/completions", router_http__completions, api);
    pd_http_server_route(api->srv, "POST", "/v1/chat/completions", router_http__chat, api);
    if ((st = pd_http_server_listen(api->srv, host, port, &api->port)) != PD_OK)
        goto err;
    pd_log_info("router: OpenAI API and probes on http://%s:%d", host, api->port);
    *api_p = api;
    return PD_OK;
err:
    router_http_destroy(api);
    return st;
}

int router_http_port(const router_http_t *api)
{
    return api->port;
}

void router_http_destroy(router_http_t *api)
{
    if (!api)
        return;
    pd_http_server_destroy(api->srv); /* open requests: their close callbacks cancel them */
    free(api);
}
