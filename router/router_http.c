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

static void router_http__metrics_source(void *arg, metrics_t *m)
{
    router_http_t *api = arg;
    pd_http_server_stats_t st;
    pd_http_server_stats(api->srv, &st);
    router_metrics_listener(m, "http", st.connections, st.max_connections, st.rejected_connections,
                            st.accept_errors, st.idle_closed, st.timed_out, 0);
}

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
                              json_pack("{s:s,s:s,s:b,s:I,s:I,s:i}", "name", n.node->name, "role",
                                        cluster_config_role_str(n.node->role), "serving", n.serving,
                                        "kv_pages_used", (json_int_t)n.pages_used, "kv_pages_total",
                                        (json_int_t)n.pages_total, "tp", n.tp));
    }
    int ok = router_serving(api->core);
    pd_http_respond_json(
        req, ok ? 200 : 503,
        json_pack("{s:s,s:o}", "status", ok ? "ready" : "not ready", "nodes", nodes));
}

static void router_http__models(pd_http_request_t *req, void *user)
{
    router_http_t *api = user;
    const char *path = pd_http_request_path(req), *id = NULL;
    if (strncmp(path, "/v1/models/", 11) == 0 && path[11])
        id = path + 11;
    else if (strcmp(path, "/v1/models") != 0 && strcmp(path, "/v1/models/") != 0) {
        pd_http_respond_error(req, PD_ERR_NOT_FOUND, "no such path");
        return;
    }
    if (id && strcmp(id, router_model_name(api->core)) != 0) {
        char msg[300];
        snprintf(msg, sizeof msg, "The model `%.200s` does not exist.", id);
        pd_http_respond_error_code(req, 404, "model_not_found", msg);
        return;
    }
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", router_model_name(api->core), "object",
                          "model", "created", (json_int_t)0, "owned_by", "pdserve", "max_model_len",
                          router_model(api->core)->max_position_embeddings);
    pd_http_respond_json(req, 200, id ? m : json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

/* ==== completions ==== */

/* One choice (sample) of a completion request. */
typedef struct {
    char *text; /* non-streamed: the text so far */
    size_t len, cap;
    json_t *lp;         /* non-streamed with logprobs: completions {tokens, token_logprobs,
                           top_logprobs, text_offset} or chat [content entries] */
    size_t offset;      /* completions: text_offset of the next token */
    const char *finish; /* its finish reason once it ended */
    int started;        /* streamed: its first chunk went out (role / echo) */
} hchoice_t;

/* A completion request: its core request's output as SSE chunks or one JSON body. */
typedef struct {
    router_http_t *api;
    pd_http_request_t *req;
    router_req_t *q; /* NULL once the request ended */
    int stream, chat;
    int include_usage; /* stream_options.include_usage: a last chunk with the usage */
    int nomem;         /* the text did not fit in memory: the request fails */
    char id[128];
    json_int_t created;
    int n, open, failed;
    router_req_t **qs; /* (n) samples seen running (a cancel goes to any of them) */
    hchoice_t *ch;     /* (n) */
    int logprobs, top; /* logprobs asked for, with top alternatives */
    int echo;          /* completions: the prompt goes first */
    char *prompt_text; /* echo */
    size_t prompt_len;
    int prompt_tokens, completion_tokens;
} hsink_t;

static void hsink__free(hsink_t *h)
{
    for (int i = 0; h->ch && i < h->n; i++) {
        free(h->ch[i].text);
        json_decref(h->ch[i].lp);
    }
    free(h->ch);
    free(h->qs);
    free(h->prompt_text);
    free(h);
}

/* A JSON string of a token's text (valid UTF-8, vLLM's "bytes:\x.." for a partial character). */
static json_t *hsink__tok(hsink_t *h, int32_t id)
{
    char buf[128];
    size_t len = router_token_text(h->api->core, id, buf, sizeof buf);
    json_t *s = json_stringn(buf, len);
    return s ? s : json_string("");
}

/* The chat shape of one token's logprob: {token, logprob, bytes, top_logprobs}. */
static json_t *hsink__chat_entry(hsink_t *h, int32_t id, double logprob, int with_top,
                                 const router_logprob_t *lp)
{
    json_t *tok = hsink__tok(h, id), *bytes = json_array();
    const char *t = json_string_value(tok);
    for (size_t i = 0; t && i < json_string_length(tok); i++)
        json_array_append_new(bytes, json_integer((unsigned char)t[i]));
    json_t *e = json_pack("{s:o,s:f,s:o}", "token", tok, "logprob", logprob, "bytes", bytes);
    if (with_top) {
        json_t *top = json_array();
        for (int k = 0; lp && k < lp->n_top && k < h->top; k++)
            json_array_append_new(
                top, hsink__chat_entry(h, lp->top_ids[k], lp->top_logprobs[k], 0, NULL));
        json_object_set_new(e, "top_logprobs", top);
    }
    return e;
}

/* Appends one token's logprob to lp: completions (an object of four arrays; lp NULL for a prompt
 * token without one) or chat (an array). */
static void hsink__lp_add(hsink_t *h, hchoice_t *c, json_t *obj, int32_t id,
                          const router_logprob_t *lp)
{
    if (h->chat) {
        json_array_append_new(obj, hsink__chat_entry(h, id, lp->logprob, 1, lp));
        return;
    }
    json_t *tok = hsink__tok(h, id);
    size_t tlen = json_string_length(tok);
    json_array_append(json_object_get(obj, "tokens"), tok);
    json_array_append_new(json_object_get(obj, "token_logprobs"),
                          lp ? json_real(lp->logprob) : json_null());
    json_array_append_new(json_object_get(obj, "text_offset"), json_integer((json_int_t)c->offset));
    c->offset += tlen;
    if (!lp) {
        json_array_append_new(json_object_get(obj, "top_logprobs"), json_null());
        json_decref(tok);
        return;
    }
    /* vLLM: the sampled token and the top alternatives, by token text */
    json_t *top = json_object();
    for (int k = 0; k < lp->n_top && k < h->top; k++) {
        json_t *t = hsink__tok(h, lp->top_ids[k]);
        json_object_set_new(top, json_string_value(t), json_real(lp->top_logprobs[k]));
        json_decref(t);
    }
    if (!json_object_get(top, json_string_value(tok)))
        json_object_set_new(top, json_string_value(tok), json_real(lp->logprob));
    json_array_append_new(json_object_get(obj, "top_logprobs"), top);
    json_decref(tok);
}

static json_t *hsink__lp_new(const hsink_t *h)
{
    if (h->chat)
        return json_array();
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

/* The prompt's logprobs (echo): its first token has none (null), as in vLLM. */
static void hsink__lp_prompt(hsink_t *h, hchoice_t *c, json_t *obj, router_req_t *q)
{
    int n;
    const router_logprob_t *plp;
    const int32_t *ids = router_request_prompt(q, &n, &plp);
    for (int i = 0; i < n; i++)
        hsink__lp_add(h, c, obj, ids[i], i > 0 && plp ? &plp[i - 1] : NULL);
}

static json_t *hsink__chunk(hsink_t *h, int index, const char *text, size_t len, const char *finish,
                            json_t *lp)
{
    json_t *choice;
    hchoice_t *c = &h->ch[index];
    if (h->chat) {
        json_t *delta = json_object();
        if (!c->started)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (len || !finish)
            json_object_set_new(delta, "content", json_stringn(text, len));
        choice = json_pack("{s:i,s:o}", "index", index, "delta", delta);
        if (lp)
            json_object_set_new(choice, "logprobs", json_pack("{s:o}", "content", lp));
        else
            json_object_set_new(choice, "logprobs", json_null());
    } else {
        choice = json_pack("{s:i,s:s%,s:o}", "index", index, "text", text, len, "logprobs",
                           lp ? lp : json_null());
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    c->started = 1;
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

/* Appends text to a choice's buffer (non-streamed). */
static void hsink__append(hsink_t *h, hchoice_t *c, const char *text, size_t len)
{
    if (h->nomem)
        return;
    if (c->len + len + 1 > c->cap) {
        size_t cap = (c->len + len + 1) * 2;
        char *t = realloc(c->text, cap);
        if (!t) { /* this request fails at its finish; the router keeps serving */
            h->nomem = 1;
            return;
        }
        c->text = t;
        c->cap = cap;
    }
    if (len)
        memcpy(c->text + c->len, text, len);
    c->len += len;
    c->text[c->len] = 0;
}

static void hsink_delta(router_req_t *q, void *arg, const int32_t *ids, int n, const char *text,
                        size_t len, const router_logprob_t *lp)
{
    hsink_t *h = arg;
    const int index = router_request_index(q);
    hchoice_t *c = &h->ch[index];
    h->qs[index] = q;
    if (h->stream) {
        json_t *lpj = NULL;
        if (!c->started && h->echo) { /* the prompt (and its logprobs) first */
            json_t *plp = NULL;
            if (h->logprobs) {
                plp = hsink__lp_new(h);
                hsink__lp_prompt(h, c, plp, q);
            }
            hsink__sse(h, hsink__chunk(h, index, h->prompt_text ? h->prompt_text : "",
                                       h->prompt_len, NULL, plp));
        }
        if (h->logprobs && n > 0 && lp) {
            lpj = hsink__lp_new(h);
            for (int i = 0; i < n; i++)
                hsink__lp_add(h, c, lpj, ids[i], &lp[i]);
        }
        if (len || !c->started || lpj)
            hsink__sse(h, hsink__chunk(h, index, text, len, NULL, lpj));
        return;
    }
    if (!c->started) {
        c->started = 1;
        if (h->logprobs && !(c->lp = hsink__lp_new(h)))
            h->nomem = 1;
        if (h->echo) {
            hsink__append(h, c, h->prompt_text ? h->prompt_text : "", h->prompt_len);
            if (c->lp)
                hsink__lp_prompt(h, c, c->lp, q);
        }
    }
    for (int i = 0; c->lp && lp && i < n; i++)
        hsink__lp_add(h, c, c->lp, ids[i], &lp[i]);
    hsink__append(h, c, text, len);
}

/* The whole non-streamed response, once every choice ended. */
static void hsink__respond(hsink_t *h)
{
    json_t *choices = json_array();
    for (int i = 0; i < h->n; i++) {
        hchoice_t *c = &h->ch[i];
        json_t *lp = c->lp ? json_incref(c->lp) : NULL;
        json_t *choice =
            h->chat ? json_pack("{s:i,s:{s:s,s:s%},s:s}", "index", i, "message", "role",
                                "assistant", "content", c->text ? c->text : "", c->len,
                                "finish_reason", c->finish ? c->finish : "stop")
                    : json_pack("{s:i,s:s%,s:s}", "index", i, "text", c->text ? c->text : "",
                                c->len, "finish_reason", c->finish ? c->finish : "stop");
        if (h->chat)
            json_object_set_new(choice, "logprobs",
                                lp ? json_pack("{s:o}", "content", lp) : json_null());
        else
            json_object_set_new(choice, "logprobs", lp ? lp : json_null());
        json_array_append_new(choices, choice);
    }
    pd_http_respond_json(h->req, 200,
                         json_pack("{s:s,s:s,s:I,s:s,s:o,s:{s:i,s:i,s:i}}", "id", h->id, "object",
                                   h->chat ? "chat.completion" : "text_completion", "created",
                                   h->created, "model", router_model_name(h->api->core), "choices",
                                   choices, "usage", "prompt_tokens", h->prompt_tokens,
                                   "completion_tokens", h->completion_tokens, "total_tokens",
                                   h->prompt_tokens + h->completion_tokens));
}

/* A finish reason with static storage. */
static const char *hsink__reason(const char *reason)
{
    static const char *const known[] = {"stop", "length", "abort"};
    for (size_t i = 0; reason && i < 3; i++)
        if (strcmp(reason, known[i]) == 0)
            return known[i];
    return "stop";
}

static void hsink_finish(router_req_t *q, void *arg, const char *reason, pd_status_t st,
                         const char *msg)
{
    hsink_t *h = arg;
    int prompt, completion;
    const int index = router_request_index(q);
    router_request_usage(q, &prompt, &completion);
    h->prompt_tokens = prompt;
    h->completion_tokens += completion;
    h->qs[index] = NULL;
    if (h->failed)
        return; /* another choice failed: the response went out with its error */
    if (st != PD_OK) {
        /* one choice failed: the request fails, the other choices are cancelled */
        h->failed = 1;
        h->q = NULL;
        router_request_cancel(q);
    } else {
        h->ch[index].finish = hsink__reason(reason);
        if (h->stream)
            hsink__sse(h, hsink__chunk(h, index, "", 0, h->ch[index].finish, NULL));
        if (--h->open > 0)
            return;
    }
    h->q = NULL;
    pd_http_request_set_close_cb(h->req, NULL, NULL); /* h is freed below */
    if (h->stream) {
        if (st == PD_OK) {
            if (h->include_usage) { /* as the OpenAI spec has it: empty choices, the usage */
                json_t *c = hsink__chunk(h, 0, "", 0, NULL, NULL);
                json_object_set_new(c, "choices", json_array());
                json_object_set_new(c, "usage",
                                    json_pack("{s:i,s:i,s:i}", "prompt_tokens", h->prompt_tokens,
                                              "completion_tokens", h->completion_tokens,
                                              "total_tokens",
                                              h->prompt_tokens + h->completion_tokens));
                hsink__sse(h, c);
            }
        } else {
            /* the same error object as a non-streamed request gets (pd_http_error_json) */
            char *e = pd_http_error_json(st, msg);
            if (e)
                (void)pd_http_stream_sse(h->req, e);
            free(e);
        }
        (void)pd_http_stream_write(h->req, "data: [DONE]\n\n", 14);
        (void)pd_http_stream_end(h->req);
    } else if (st != PD_OK) {
        pd_http_respond_error(h->req, st, msg);
    } else if (h->nomem) {
        pd_http_respond_error(h->req, PD_ERR_NOMEM, "router out of memory for the output");
    } else {
        hsink__respond(h);
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
    for (int i = 0; q && i < h->n; i++) /* the first sample may have ended: any live one */
        if (h->qs[i]) {
            q = h->qs[i];
            break;
        }
    if (q)
        router_request_cancel(q); /* every sample */
    if (h->stream)
        (void)pd_http_stream_end(req);
    else
        (void)pd_http_respond_error(req, PD_ERR_CANCELLED, NULL);
    hsink__free(h);
}

/* Reads the integer field name of body into *v_p (left as is when absent or null). Returns 0,
 * or -1 with err set when it is not an integer. */
static int router_http__int(json_t *body, const char *name, json_int_t *v_p, int *given_p,
                            char *err, size_t err_len)
{
    json_t *v = json_object_get(body, name);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v)) {
        snprintf(err, err_len, "%s must be an integer", name);
        return -1;
    }
    *v_p = json_integer_value(v);
    if (given_p)
        *given_p = 1;
    return 0;
}

/* Reads the OpenAI sampling fields into in (numbers unnarrowed: the core checks their ranges);
 * returns 0 or -1 with err set. */
/* Parameters of the OpenAI API that pdserve does not implement: a 400 naming the parameter,
 * never silently ignored. A value that asks for nothing (null, false, 0, empty) passes. */
static int router_http__unsupported(json_t *body, char *err, size_t err_len)
{
    static const char *const names[] = {
        "tools",           "tool_choice",   "functions",           "function_call",
        "response_format", "suffix",        "parallel_tool_calls", "guided_json",
        "guided_regex",    "guided_choice", "guided_grammar",      "prompt_logprobs",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        json_t *v = json_object_get(body, names[i]);
        if (!v || json_is_null(v) || json_is_false(v) ||
            (json_is_number(v) && json_number_value(v) == 0) ||
            (json_is_object(v) && json_object_size(v) == 0) ||
            (json_is_array(v) && json_array_size(v) == 0) ||
            (!strcmp(names[i], "response_format") && json_is_object(v) &&
             json_is_string(json_object_get(v, "type")) &&
             !strcmp(json_string_value(json_object_get(v, "type")), "text")))
            continue;
        snprintf(err, err_len, "%s is not supported by this server", names[i]);
        return -1;
    }
    return 0;
}

/* Reads the number field name of body into *v_p (left as is when absent or null). Returns 0, or
 * -1 with err set when it is not a number. */
static int router_http__num(json_t *body, const char *name, float *v_p, char *err, size_t err_len)
{
    json_t *v = json_object_get(body, name);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v)) {
        snprintf(err, err_len, "%s must be a number", name);
        return -1;
    }
    *v_p = (float)json_number_value(v);
    return 0;
}

/* Reads the boolean field name of body into *v_p (0 when absent or null). */
static int router_http__bool(json_t *body, const char *name, int *v_p, char *err, size_t err_len)
{
    json_t *v = json_object_get(body, name);
    *v_p = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        snprintf(err, err_len, "%s must be a boolean", name);
        return -1;
    }
    *v_p = json_is_true(v);
    return 0;
}

/* Arrays the OpenAI / vLLM fields point into (freed by the caller). */
typedef struct {
    int32_t *bias_ids, *stop_ids;
    float *bias_vals;
} http_params_t;

/* The OpenAI / vLLM parameters beyond the basic sampling: n, best_of, logprobs (completions: an
 * integer; chat: a boolean with top_logprobs), echo (completions), penalties, logit_bias,
 * min_tokens, stop_token_ids. Returns 0 or -1 with err set; *echo_p set. */
static int router_http__openai(json_t *body, router_request_t *in, int chat, http_params_t *hp,
                               int *echo_p, char *err, size_t err_len)
{
    json_int_t best_of = 0, min_tokens = 0, top = 0;
    json_t *v;
    *echo_p = 0;
    if (router_http__int(body, "best_of", &best_of, NULL, err, err_len) != 0 ||
        router_http__int(body, "min_tokens", &min_tokens, NULL, err, err_len) != 0 ||
        router_http__num(body, "presence_penalty", &in->presence_penalty, err, err_len) != 0 ||
        router_http__num(body, "frequency_penalty", &in->frequency_penalty, err, err_len) != 0 ||
        router_http__num(body, "repetition_penalty", &in->repetition_penalty, err, err_len) != 0)
        return -1;
    v = json_object_get(body, "repetition_penalty");
    if (v && !json_is_null(v) && !(in->repetition_penalty > 0.0f)) {
        snprintf(err, err_len, "repetition_penalty must be > 0 (1: off)");
        return -1;
    }
    in->best_of = best_of;
    in->min_tokens = min_tokens;
    v = json_object_get(body, "logprobs");
    if (chat) {
        if (router_http__bool(body, "logprobs", &in->logprobs, err, err_len) != 0 ||
            router_http__int(body, "top_logprobs", &top, NULL, err, err_len) != 0)
            return -1;
        if (top != 0 && !in->logprobs) {
            snprintf(err, err_len, "top_logprobs needs logprobs: true");
            return -1;
        }
        in->top_logprobs = top;
        if (json_object_get(body, "echo") && !json_is_null(json_object_get(body, "echo")) &&
            !json_is_false(json_object_get(body, "echo"))) {
            snprintf(err, err_len, "echo is supported by /v1/completions only");
            return -1;
        }
    } else {
        if (v && !json_is_null(v)) {
            if (!json_is_integer(v)) {
                snprintf(err, err_len, "logprobs must be an integer (0..%d alternatives)",
                         ROUTER_MAX_TOP_LOGPROBS);
                return -1;
            }
            in->logprobs = 1;
            in->top_logprobs = json_integer_value(v);
        }
        if (json_object_get(body, "top_logprobs") &&
            !json_is_null(json_object_get(body, "top_logprobs"))) {
            snprintf(err, err_len, "top_logprobs is a chat parameter; completions use logprobs");
            return -1;
        }
        if (router_http__bool(body, "echo", echo_p, err, err_len) != 0)
            return -1;
        in->prompt_logprobs = *echo_p && in->logprobs;
    }
    if ((v = json_object_get(body, "logit_bias")) && !json_is_null(v)) {
        const char *key;
        json_t *x;
        size_t i = 0;
        if (!json_is_object(v)) {
            snprintf(err, err_len, "logit_bias must be an object of token id -> bias");
            return -1;
        }
        size_t n = json_object_size(v);
        if (n > ROUTER_MAX_LOGIT_BIAS) {
            snprintf(err, err_len, "logit_bias: at most %d entries", ROUTER_MAX_LOGIT_BIAS);
            return -1;
        }
        hp->bias_ids = malloc((n ? n : 1) * sizeof *hp->bias_ids);
        hp->bias_vals = malloc((n ? n : 1) * sizeof *hp->bias_vals);
        if (!hp->bias_ids || !hp->bias_vals) {
            snprintf(err, err_len, "out of memory for logit_bias");
            return -1;
        }
        json_object_foreach(v, key, x)
        {
            char *end;
            long long id = strtoll(key, &end, 10);
            if (!key[0] || *end || id < 0 || id > INT32_MAX || !json_is_number(x)) {
                snprintf(err, err_len,
                         "logit_bias: keys must be token ids and values numbers (got '%.40s')",
                         key);
                return -1;
            }
            hp->bias_ids[i] = (int32_t)id;
            hp->bias_vals[i++] = (float)json_number_value(x);
        }
        in->bias_ids = hp->bias_ids;
        in->bias_vals = hp->bias_vals;
        in->n_bias = i;
    }
    if ((v = json_object_get(body, "stop_token_ids")) && !json_is_null(v)) {
        size_t i, n = json_array_size(v);
        json_t *x;
        if (!json_is_array(v) || n > ROUTER_MAX_STOP_IDS) {
            snprintf(err, err_len, "stop_token_ids must be an array of at most %d token ids",
                     ROUTER_MAX_STOP_IDS);
            return -1;
        }
        if (!(hp->stop_ids = malloc((n ? n : 1) * sizeof *hp->stop_ids))) {
            snprintf(err, err_len, "out of memory for stop_token_ids");
            return -1;
        }
        json_array_foreach(v, i, x)
        {
            if (!json_is_integer(x) || json_integer_value(x) < INT32_MIN ||
                json_integer_value(x) > INT32_MAX) {
                snprintf(err, err_len, "stop_token_ids must be token ids");
                return -1;
            }
            hp->stop_ids[i] = (int32_t)json_integer_value(x);
        }
        in->stop_token_ids = hp->stop_ids;
        in->n_stop_token_ids = n;
    }
    return 0;
}

static int router_http__sampling(json_t *body, router_request_t *in, int chat, int64_t context,
                                 char *err, size_t err_len)
{
    json_t *v;
    json_int_t max_tokens = 16, top_k = 0, seed = 0, n = 1;
    int given = 0;
    in->temperature = 1.0f;
    in->top_p = 1.0f;
    if (router_http__int(body, "max_tokens", &max_tokens, &given, err, err_len) != 0 ||
        (!given &&
         router_http__int(body, "max_completion_tokens", &max_tokens, &given, err, err_len) != 0) ||
        router_http__int(body, "top_k", &top_k, NULL, err, err_len) != 0 ||
        router_http__int(body, "seed", &seed, NULL, err, err_len) != 0 ||
        router_http__int(body, "n", &n, NULL, err, err_len) != 0)
        return -1;
    if (router_http__unsupported(body, err, err_len) != 0)
        return -1;
    if (chat && !given)
        max_tokens = context; /* chat: the rest of the context, as vLLM does */
    in->max_tokens = max_tokens;
    in->max_tokens_default = !given;     /* completions 16, chat the context: cut to what fits */
    in->top_k = top_k == -1 ? 0 : top_k; /* -1: off, as in vLLM */
    in->seed = (uint64_t)seed;           /* any 64-bit integer, two's complement */
    in->n = n;                           /* the core checks 1..ROUTER_MAX_N */
    if (n < 1) {
        snprintf(err, err_len, "n must be at least 1 (got %lld)", (long long)n);
        return -1;
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
        if (!(in->top_p > 0.0f)) {
            snprintf(err, err_len, "top_p must be in (0, 1]");
            return -1;
        }
    }
    if ((v = json_object_get(body, "ignore_eos")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            snprintf(err, err_len, "ignore_eos must be a boolean");
            return -1;
        }
        in->ignore_eos = json_is_true(v);
    }
    return 0;
}

/* The string value of v, or NULL when v is not a string or holds a NUL byte ("\u0000"). */
static const char *router_http__cstr(json_t *v)
{
    const char *s = json_string_value(v);
    return s && strlen(s) == json_string_length(v) ? s : NULL;
}

/* The prompt as token ids (a JSON array of integers) into a malloc'd *ids_p, each checked against
 * the vocabulary as a 64-bit value. Returns PD_OK, PD_ERR_INVALID or PD_ERR_NOMEM with err set. */
static pd_status_t router_http__prompt_ids(router_http_t *api, json_t *v, int32_t **ids_p,
                                           size_t *n_p, char *err, size_t err_len)
{
    json_int_t vocab = router_model(api->core)->vocab_size;
    size_t n = json_array_size(v), i;
    json_t *x;
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) {
        snprintf(err, err_len, "out of memory for %zu prompt tokens", n);
        return PD_ERR_NOMEM;
    }
    json_array_foreach(v, i, x)
    {
        if (!json_is_integer(x)) {
            snprintf(err, err_len, "prompt: token ids must be integers");
            free(ids);
            return PD_ERR_INVALID;
        }
        json_int_t id = json_integer_value(x);
        if (id < 0 || id >= vocab) {
            snprintf(err, err_len, "token_ids[%zu] = %lld is outside the vocabulary (0..%lld)", i,
                     (long long)id, (long long)vocab - 1);
            free(ids);
            return PD_ERR_INVALID;
        }
        ids[i] = (int32_t)id;
    }
    *ids_p = ids;
    *n_p = n;
    return PD_OK;
}

/* The chat prompt rendered by the model's template into a malloc'd *prompt_p. Returns PD_OK,
 * PD_ERR_INVALID or PD_ERR_NOMEM with err set. */
static pd_status_t router_http__chat_prompt(router_http_t *api, json_t *body, char **prompt_p,
                                            char *err, size_t err_len)
{
    const char *chat_template, *bos, *eos;
    json_t *msgs = json_object_get(body, "messages"), *m;
    size_t n = json_array_size(msgs), i;
    pd_status_t st;

    if (!json_is_array(msgs) || n == 0) {
        snprintf(err, err_len, "messages must be a non-empty array");
        return PD_ERR_INVALID;
    }
    chat_template = router_chat_template(api->core, &bos, &eos);
    if (!chat_template) {
        snprintf(err, err_len, "this model has no chat template; use /v1/completions");
        return PD_ERR_INVALID;
    }
    chat_message_t *cm = calloc(n, sizeof *cm);
    if (!cm) {
        snprintf(err, err_len, "out of memory for %zu messages", n);
        return PD_ERR_NOMEM;
    }
    json_array_foreach(msgs, i, m)
    {
        cm[i].role = router_http__cstr(json_object_get(m, "role"));
        cm[i].content = router_http__cstr(json_object_get(m, "content"));
        if (!cm[i].role || !cm[i].content) {
            free(cm);
            snprintf(err, err_len,
                     "messages[%zu] needs string role and content (without NUL bytes)", i);
            return PD_ERR_INVALID;
        }
        if (strcmp(cm[i].role, "system") && strcmp(cm[i].role, "user") &&
            strcmp(cm[i].role, "assistant") && strcmp(cm[i].role, "developer")) {
            snprintf(err, err_len,
                     "messages[%zu].role '%.40s': expected system, user, assistant "
                     "or developer",
                     i, cm[i].role);
            free(cm);
            return PD_ERR_INVALID;
        }
    }
    st = chat_template_render(chat_template, cm, n, true, bos, eos, prompt_p);
    free(cm);
    if (st != PD_OK) {
        snprintf(err, err_len, "the model's chat template could not be rendered");
        return st == PD_ERR_NOMEM ? st : PD_ERR_INVALID;
    }
    return PD_OK;
}

static void router_http__completion(pd_http_request_t *req, router_http_t *api, int chat)
{
    json_t *body, *v;
    json_error_t jerr;
    router_request_t in = {0};
    char err[512], *prompt_buf = NULL;
    char *stops[ROUTER_MAX_STOP];
    int32_t *ids = NULL;
    size_t body_len;
    const char *body_text = pd_http_request_body(req, &body_len);
    hsink_t *h = NULL;
    http_params_t hp = {NULL, NULL, NULL};
    int echo = 0;
    pd_status_t st = PD_ERR_INVALID;

    /* "\u0000" is allowed: a prompt may hold NUL bytes (and other strings are checked) */
    body = json_loadb(body_text, body_len, JSON_ALLOW_NUL, &jerr);
    if (!json_is_object(body)) {
        pd_http_respond_error(req, PD_ERR_INVALID, "request body must be a JSON object");
        json_decref(body);
        return;
    }
    if (router_http__sampling(body, &in, chat, router_model(api->core)->max_position_embeddings,
                              err, sizeof err) != 0 ||
        router_http__openai(body, &in, chat, &hp, &echo, err, sizeof err) != 0)
        goto bad;
    v = json_object_get(body, "model");
    if (v && !json_is_null(v) &&
        (!json_is_string(v) || strcmp(json_string_value(v), router_model_name(api->core)) != 0)) {
        snprintf(err, sizeof err, "The model `%.200s` does not exist.",
                 json_is_string(v) ? json_string_value(v) : "(not a string)");
        pd_http_respond_error_code(req, 404, "model_not_found", err);
        json_decref(body);
        return;
    }
    if ((v = json_object_get(body, "stream")) && !json_is_null(v) && !json_is_boolean(v)) {
        snprintf(err, sizeof err, "stream must be a boolean");
        goto bad;
    }
    if ((v = json_object_get(body, "stream_options")) && !json_is_null(v) && !json_is_object(v)) {
        snprintf(err, sizeof err, "stream_options must be an object");
        goto bad;
    }
    if ((v = json_object_get(body, "stop")) && !json_is_null(v) && !json_is_string(v) &&
        !json_is_array(v)) {
        snprintf(err, sizeof err, "stop must be a string or an array of strings");
        goto bad;
    }
    v = json_object_get(body, "stop");
    if (json_is_string(v)) {
        stops[0] = (char *)router_http__cstr(v);
        in.stop = stops;
        in.n_stop = 1;
        if (!stops[0]) {
            snprintf(err, sizeof err, "stop strings must not hold NUL bytes");
            goto bad;
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s)
        {
            if (!json_is_string(s) || in.n_stop == ROUTER_MAX_STOP || !router_http__cstr(s)) {
                snprintf(err, sizeof err,
                         "stop must be a string or at most %d strings (without NUL bytes)",
                         ROUTER_MAX_STOP);
                goto bad;
            }
            stops[in.n_stop++] = (char *)router_http__cstr(s);
        }
        in.stop = stops;
    }
    if (chat) {
        if ((st = router_http__chat_prompt(api, body, &prompt_buf, err, sizeof err)) != PD_OK)
            goto bad;
        in.text = prompt_buf;
        in.text_len = strlen(prompt_buf);
    } else {
        v = json_object_get(body, "prompt");
        if (json_is_string(v)) {
            in.text = json_string_value(v);
            in.text_len = json_string_length(v);
        } else if (json_is_array(v) && json_array_size(v) > 0 &&
                   json_is_integer(json_array_get(v, 0))) {
            if ((st = router_http__prompt_ids(api, v, &ids, &in.n_token_ids, err, sizeof err)) !=
                PD_OK)
                goto bad;
            in.token_ids = ids;
        } else {
            st = PD_ERR_INVALID;
            snprintf(err, sizeof err, "prompt must be a string or an array of token ids");
            goto bad;
        }
    }
    if (!(h = calloc(1, sizeof *h))) {
        st = PD_ERR_NOMEM;
        snprintf(err, sizeof err, "router out of memory for the request");
        goto bad;
    }
    h->api = api;
    h->req = req;
    h->chat = chat;
    h->n = in.n >= 1 && in.n <= ROUTER_MAX_N ? (int)in.n : 1; /* else the core refuses it */
    h->open = h->n;
    h->logprobs = in.logprobs;
    h->top = (int)in.top_logprobs;
    h->echo = echo;
    if (!(h->ch = calloc((size_t)h->n, sizeof *h->ch)) ||
        !(h->qs = calloc((size_t)h->n, sizeof *h->qs))) {
        hsink__free(h);
        st = PD_ERR_NOMEM;
        snprintf(err, sizeof err, "router out of memory for the request");
        goto bad;
    }
    if (echo) { /* the prompt as given; token ids: their text (special tokens skipped) */
        if (in.text) {
            if ((h->prompt_text = malloc(in.text_len + 1))) {
                memcpy(h->prompt_text, in.text, in.text_len);
                h->prompt_text[in.text_len] = 0;
                h->prompt_len = in.text_len;
            }
        } else {
            (void)tokenizer_decode(router_tokenizer(api->core), in.token_ids, in.n_token_ids, true,
                                   &h->prompt_text, &h->prompt_len);
        }
    }
    h->stream = json_is_true(json_object_get(body, "stream"));
    h->include_usage =
        json_is_true(json_object_get(json_object_get(body, "stream_options"), "include_usage"));
    h->created = (json_int_t)time(NULL);
    st = router_request_start(api->core, &in, &http_sink, h, &h->q, err, sizeof err);
    if (st != PD_OK) {
        hsink__free(h);
        goto bad;
    }
    h->qs[0] = h->q;
    snprintf(h->id, sizeof h->id, "%s-%s", chat ? "chatcmpl" : "cmpl", router_request_id(h->q));
    if (h->stream)
        (void)pd_http_stream_begin(req, 200, "text/event-stream");
    pd_http_request_set_close_cb(req, router_http__closed, h);
    goto out;
bad:
    pd_http_respond_error(req, st, err);
out:
    free(hp.bias_ids);
    free(hp.bias_vals);
    free(hp.stop_ids);
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
    (void)router_add_metrics_source(core, router_http__metrics_source, api);
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

pd_http_server_t *router_http_server(const router_http_t *api)
{
    return api->srv;
}

void router_http_destroy(router_http_t *api)
{
    if (!api)
        return;
    router_remove_metrics_source(api->core, router_http__metrics_source, api);
    pd_http_server_destroy(api->srv); /* open requests: their close callbacks cancel them */
    free(api);
}
