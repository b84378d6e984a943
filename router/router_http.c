/* router_http: the router's HTTP port: the OpenAI API (/v1/completions, /v1/chat/completions
 * with SSE streaming, /v1/models), the probes ops tooling uses (/live: the process answers;
 * /ready and /health: at least one prefill and one decode node are serving) and /metrics
 * (Prometheus). Requests go through the same pipeline as gRPC Generate (router.c). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "chat_template.h"
#include "clock.h"
#include "log.h"
#include "router_internal.h"

/* ==== metrics ==== */

typedef struct {
    metrics_counter_t *ok, *failed, *tokens, *preemptions;
    metrics_histogram_t *ttft, *e2e;
} router_metrics_t;

static router_metrics_t rm;

void router_observe(router_t *r, const rreq_t *q, pd_status_t st)
{
    (void)r;
    if (!rm.ok)
        return;
    metrics_counter_inc(st == PD_OK ? rm.ok : rm.failed);
    metrics_counter_add(rm.tokens, q->n_generated);
    metrics_counter_add(rm.preemptions, q->n_preemptions);
    if (q->first_token_ms)
        metrics_histogram_observe(rm.ttft, (double)(q->first_token_ms - q->start_ms) / 1000.0);
    metrics_histogram_observe(rm.e2e, (double)(pd_clock_ms() - q->start_ms) / 1000.0);
}

static int router__ready(const router_t *r)
{
    int p = 0, d = 0;
    for (int i = 0; i < r->n_nodes; i++) {
        if (!r->nodes[i].healthy)
            continue;
        if (r->nodes[i].node->role == CLUSTER_ROLE_PREFILL)
            p++;
        else
            d++;
    }
    return p > 0 && d > 0;
}

static void router_http__metrics(pd_http_request_t *req, void *user)
{
    router_t *r = user;
    char *text;
    size_t len;
    for (int i = 0; i < r->n_nodes; i++) {
        const char *labels[] = {"node", r->nodes[i].node->name, "role",
                                cluster_config_role_str(r->nodes[i].node->role), NULL};
        metrics_gauge_t *g;
        if (metrics_gauge_register(r->metrics, "pdserve_node_up", "node health (1 serving)",
                                   labels, &g) == PD_OK)
            metrics_gauge_set(g, r->nodes[i].healthy);
        if (metrics_gauge_register(r->metrics, "pdserve_node_kv_pages_used",
                                   "kv pages in use on the node", labels, &g) == PD_OK)
            metrics_gauge_set(g, r->nodes[i].pages_used);
        if (metrics_gauge_register(r->metrics, "pdserve_node_kv_pages_total",
                                   "kv pages of the node", labels, &g) == PD_OK)
            metrics_gauge_set(g, r->nodes[i].pages_total);
        if (metrics_gauge_register(r->metrics, "pdserve_node_integrity_failures",
                                   "sequences failed by the kv tag check on the node", labels,
                                   &g) == PD_OK)
            metrics_gauge_set(g, (double)r->nodes[i].integrity_failures);
    }
    metrics_gauge_t *active;
    if (metrics_gauge_register(r->metrics, "pdserve_router_requests_active",
                               "requests in flight", NULL, &active) == PD_OK)
        metrics_gauge_set(active, r->n_reqs);
    if (metrics_render(r->metrics, &text, &len) != PD_OK) {
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
    router_t *r = user;
    json_t *nodes = json_array();
    for (int i = 0; i < r->n_nodes; i++)
        json_array_append_new(
            nodes, json_pack("{s:s,s:s,s:b,s:i,s:i}", "name", r->nodes[i].node->name, "role",
                             cluster_config_role_str(r->nodes[i].node->role), "serving",
                             r->nodes[i].healthy, "kv_pages_used", (int)r->nodes[i].pages_used,
                             "kv_pages_total", (int)r->nodes[i].pages_total));
    int ok = router__ready(r);
    pd_http_respond_json(req, ok ? 200 : 503,
                      json_pack("{s:s,s:o}", "status", ok ? "ready" : "not ready", "nodes", nodes));
}

static void router_http__models(pd_http_request_t *req, void *user)
{
    router_t *r = user;
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", r->model_name, "object", "model",
                          "created", (json_int_t)0, "owned_by", "pdserve", "max_model_len",
                          r->model.max_position_embeddings);
    pd_http_respond_json(req, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

/* ==== completions ==== */

typedef struct {
    pd_http_request_t *req;
    rreq_t *q;
    int stream, chat, first;
    char id[128];
    json_int_t created;
    char *text;
    size_t len, cap;
} hsink_t;

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
                     "model", h->q->r->model_name, "choices", choice);
}

static void hsink__sse(hsink_t *h, json_t *obj)
{
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (s)
        (void)pd_http_stream_sse(h->req, s);
    free(s);
}

static void hsink_delta(rreq_t *q, const int32_t *ids, int n, const char *text, size_t len)
{
    hsink_t *h = q->sink_arg;
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

static void hsink_finish(rreq_t *q, const char *reason, pd_status_t st, const char *msg)
{
    hsink_t *h = q->sink_arg;
    pd_http_request_set_close_cb(h->req, NULL, NULL); /* h is freed below */
    router_observe(q->r, q, st);
    if (h->stream) {
        if (st == PD_OK) {
            json_t *c = hsink__chunk(h, "", 0, reason);
            json_object_set_new(c, "usage",
                                json_pack("{s:i,s:i,s:i}", "prompt_tokens", q->n_prompt,
                                          "completion_tokens", q->n_generated, "total_tokens",
                                          q->n_prompt + q->n_generated));
            hsink__sse(h, c);
        } else {
            json_t *err = json_pack("{s:{s:s,s:s,s:i}}", "error", "message", msg ? msg : "",
                                    "type", pd_status_name(st), "code",
                                    pd_status_http_code(st));
            hsink__sse(h, err);
        }
        (void)pd_http_stream_write(h->req, "data: [DONE]\n\n", 14);
        (void)pd_http_stream_end(h->req);
    } else if (st != PD_OK) {
        pd_http_respond_error(h->req, st, msg);
    } else {
        json_t *choice =
            h->chat ? json_pack("{s:i,s:{s:s,s:s%},s:s}", "index", 0, "message", "role",
                                "assistant", "content", h->text ? h->text : "", h->len,
                                "finish_reason", reason)
                    : json_pack("{s:i,s:s%,s:n,s:s}", "index", 0, "text", h->text ? h->text : "",
                                h->len, "logprobs", "finish_reason", reason);
        pd_http_respond_json(
            h->req, 200,
            json_pack("{s:s,s:s,s:I,s:s,s:[o],s:{s:i,s:i,s:i}}", "id", h->id, "object",
                      h->chat ? "chat.completion" : "text_completion", "created", h->created,
                      "model", q->r->model_name, "choices", choice, "usage", "prompt_tokens",
                      q->n_prompt, "completion_tokens", q->n_generated, "total_tokens",
                      q->n_prompt + q->n_generated));
    }
    free(h->text);
    free(h);
}

static const rsink_t http_sink = {hsink_delta, hsink_finish};

static void router_http__closed(pd_http_request_t *req, void *arg)
{
    hsink_t *h = arg;
    (void)req;
    if (h->q && !h->q->finished) {
        rreq_t *q = h->q;
        q->sink = NULL;
        router_request_cancel(q);
        free(h->text);
        free(h);
    }
}

/* Reads the OpenAI sampling fields into in; returns 0 or -1 with err set. */
static int router_http__sampling(json_t *body, router_request_t *in, char *err, size_t err_len)
{
    json_t *v;
    in->max_tokens = 16;
    in->temperature = 1.0f;
    in->top_p = 1.0f;
    if ((v = json_object_get(body, "max_tokens")) || (v = json_object_get(body, "max_completion_tokens"))) {
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

static void router_http__completion(pd_http_request_t *req, router_t *r, int chat)
{
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
        if (!r->chat_template) {
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
        st = chat_template_render(r->chat_template, cm, n, true, r->bos_token, r->eos_token,
                                  &prompt_buf);
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
    h->req = req;
    h->chat = chat;
    h->first = 1;
    h->stream = json_is_true(json_object_get(body, "stream"));
    h->created = (json_int_t)time(NULL);
    st = router_request_start(r, &in, &http_sink, h, &h->q, err, sizeof err);
    if (st != PD_OK) {
        free(h);
        pd_http_respond_error(req, st, err);
        goto out;
    }
    snprintf(h->id, sizeof h->id, "%s-%s", chat ? "chatcmpl" : "cmpl", h->q->request_id);
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

static void router__load_chat_template(router_t *r)
{
    char path[4200];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", r->cfg->model);
    json_t *tc = json_load_file(path, 0, &jerr);
    const char *t = json_string_value(json_object_get(tc, "chat_template"));
    const char *bos = json_string_value(json_object_get(tc, "bos_token"));
    const char *eos = json_string_value(json_object_get(tc, "eos_token"));
    if (t)
        r->chat_template = strdup(t);
    snprintf(r->bos_token, sizeof r->bos_token, "%s", bos ? bos : "");
    snprintf(r->eos_token, sizeof r->eos_token, "%s", eos ? eos : "");
    json_decref(tc);
}

pd_status_t router_http_start(router_t *r)
{
    pd_status_t st;
    int port;
    static const double ttft_b[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static const double e2e_b[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
    static const char *const ok_l[] = {"outcome", "ok", NULL}, *const bad_l[] = {"outcome", "error", NULL};

    router__load_chat_template(r);
    if ((st = metrics_create(&r->metrics)) != PD_OK)
        return st;
    metrics_counter_register(r->metrics, "pdserve_router_requests_total", "finished requests", ok_l,
                             &rm.ok);
    metrics_counter_register(r->metrics, "pdserve_router_requests_total", "finished requests",
                             bad_l, &rm.failed);
    metrics_counter_register(r->metrics, "pdserve_router_generated_tokens_total",
                             "tokens generated", NULL, &rm.tokens);
    metrics_counter_register(r->metrics, "pdserve_router_preemptions_total",
                             "requests re-prefilled after a decode node ran out of pages", NULL,
                             &rm.preemptions);
    metrics_histogram_register(r->metrics, "pdserve_router_ttft_seconds", "time to first token",
                               ttft_b, 12, NULL, &rm.ttft);
    metrics_histogram_register(r->metrics, "pdserve_router_request_seconds",
                               "request duration", e2e_b, 12, NULL, &rm.e2e);
    if ((st = pd_http_server_create(r->loop, NULL, &r->http)) != PD_OK)
        return st;
    pd_http_server_route(r->http, "GET", "/live", router_http__live, r);
    pd_http_server_route(r->http, "GET", "/ready", router_http__ready, r);
    pd_http_server_route(r->http, "GET", "/health", router_http__ready, r);
    pd_http_server_route(r->http, "GET", "/metrics", router_http__metrics, r);
    pd_http_server_route(r->http, "GET", "/v1/models", router_http__models, r);
    pd_http_server_route(r->http, "POST", "/v1/completions", router_http__completions, r);
    pd_http_server_route(r->http, "POST", "/v1/chat/completions", router_http__chat, r);
    if ((st = pd_http_server_listen(r->http, r->cfg->router.http_host, r->cfg->router.http_port,
                                 &port)) != PD_OK)
        return st;
    pd_log_info("router: OpenAI API and probes on http://%s:%d", r->cfg->router.http_host, port);
    return PD_OK;
}

void router_http_stop(router_t *r)
{
    pd_http_server_destroy(r->http);
    r->http = NULL;
    metrics_destroy(r->metrics);
    r->metrics = NULL;
    memset(&rm, 0, sizeof rm);
    free(r->chat_template);
    r->chat_template = NULL;
}
