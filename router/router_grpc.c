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

#define BYTES_DESC_MAX_FIELDS 16
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
    /* n > 1, logprobs or echo: the output goes through the buffer's bytes as records (rec_t), each
     * run of one sample's records one message (router_grpc__send_records) */
    int records;
    int n, open, echo, failed;
    uint32_t last_index; /* the sample that finished last: the final message is its */
    uint8_t *started;    /* (n) a sample's first output was queued (echo goes with it) */
    router_req_t **qs;   /* (n) the samples seen running (a cancel goes to any of them) */
    size_t sent_records; /* records of the queued batch already sent (before a PD_AGAIN) */
    int32_t *prompt_ids; /* echo: the prompt, its text and (prompt_logprobs) logprobs */
    int n_prompt;
    router_logprob_t *prompt_lp;
    char *prompt_text;
    size_t prompt_text_len;
} gen_t;

/* One record of a sample's output: header, then the logprob (has_lp), then text_len bytes. */
typedef struct {
    uint32_t index;
    int32_t token; /* -1: text only */
    uint32_t text_len;
    uint8_t has_lp, echo, finish; /* echo: the prompt goes in this message; finish: text is the
                                     finish reason of the sample */
    uint8_t pad;
} rec_t;

static void gen__free(gen_t *g)
{
    free(g->started);
    free(g->qs);
    free(g->prompt_ids);
    free(g->prompt_lp);
    free(g->prompt_text);
    free(g);
}

/* Logprob messages for lp (n) with token texts, in one allocation *store_p; NULL when n is 0. */
static Pdserve__V1__TokenLogprob **
router_grpc__lp_msgs(const router_t *core, const router_logprob_t *lp, size_t n, void **store_p)
{
    enum { TXT = 96 };
    size_t tops = 0;
    *store_p = NULL;
    if (n == 0)
        return NULL;
    for (size_t i = 0; i < n; i++)
        tops += (size_t)lp[i].n_top;
    uint8_t *st = calloc(1, n * (sizeof(void *) + sizeof(Pdserve__V1__TokenLogprob) + TXT) +
                                tops * (sizeof(void *) + sizeof(Pdserve__V1__TopLogprob) + TXT));
    if (!st)
        return NULL;
    Pdserve__V1__TokenLogprob **msgs = (Pdserve__V1__TokenLogprob **)st;
    Pdserve__V1__TopLogprob **tptr = (Pdserve__V1__TopLogprob **)(msgs + n);
    Pdserve__V1__TokenLogprob *tl = (Pdserve__V1__TokenLogprob *)(tptr + tops);
    Pdserve__V1__TopLogprob *tp = (Pdserve__V1__TopLogprob *)(tl + n);
    char *txt = (char *)(tp + tops);
    for (size_t i = 0; i < n; i++) {
        Pdserve__V1__TokenLogprob init = PDSERVE__V1__TOKEN_LOGPROB__INIT;
        tl[i] = init;
        tl[i].token_id = lp[i].token;
        tl[i].logprob = lp[i].logprob;
        router_token_text(core, lp[i].token, txt, TXT);
        tl[i].text = txt;
        txt += TXT;
        tl[i].n_top = (size_t)lp[i].n_top;
        tl[i].top = tptr;
        for (int k = 0; k < lp[i].n_top; k++) {
            Pdserve__V1__TopLogprob tinit = PDSERVE__V1__TOP_LOGPROB__INIT;
            *tp = tinit;
            tp->token_id = lp[i].top_ids[k];
            tp->logprob = lp[i].top_logprobs[k];
            router_token_text(core, lp[i].top_ids[k], txt, TXT);
            tp->text = txt;
            txt += TXT;
            *tptr++ = tp++;
        }
        msgs[i] = &tl[i];
    }
    *store_p = st;
    return msgs;
}

/* Sends one sample's run of records [p, end) as one message. */
static pd_status_t router_grpc__send_run(pd_grpc_call_t *call, gen_t *g, const uint8_t *p,
                                         const uint8_t *end)
{
    gen_response_t m = {PDSERVE__V1__GENERATE_RESPONSE__INIT, {0, NULL}};
    size_t n = 0, n_lp = 0, text_len = 0;
    int32_t ids[256];
    router_logprob_t *lps = malloc(256 * sizeof *lps);
    char *text = malloc((size_t)(end - p) + 1);
    char reason[16] = "";
    int echo = 0;
    rec_t h;
    pd_status_t st;
    if (!lps || !text) {
        free(lps);
        free(text);
        return PD_ERR_NOMEM;
    }
    memcpy(&h, p, sizeof h);
    m.resp.index = h.index;
    for (const uint8_t *q = p; q < end;) {
        memcpy(&h, q, sizeof h);
        q += sizeof h;
        if (h.has_lp) {
            memcpy(&lps[n_lp++], q, sizeof *lps);
            q += sizeof *lps;
        }
        if (h.finish) {
            snprintf(reason, sizeof reason, "%.*s", (int)h.text_len, (const char *)q);
        } else {
            memcpy(text + text_len, q, h.text_len);
            text_len += h.text_len;
        }
        q += h.text_len;
        if (h.token >= 0)
            ids[n++] = h.token;
        echo |= h.echo;
    }
    void *lp_store = NULL, *plp_store = NULL;
    m.resp.base.descriptor = &g->api->resp_desc.desc;
    m.resp.token_ids = ids;
    m.resp.n_token_ids = n;
    m.text.data = (uint8_t *)text;
    m.text.len = text_len;
    m.resp.request_id = g->request_id;
    m.resp.finish_reason = reason;
    if (n_lp == n && n_lp > 0) {
        m.resp.logprobs = router_grpc__lp_msgs(g->api->core, lps, n_lp, &lp_store);
        m.resp.n_logprobs = m.resp.logprobs ? n_lp : 0;
    }
    if (echo) {
        m.resp.prompt_token_ids = g->prompt_ids;
        m.resp.n_prompt_token_ids = (size_t)g->n_prompt;
        m.resp.prompt_text = g->prompt_text ? g->prompt_text : "";
        if (g->prompt_lp && g->n_prompt > 1) {
            m.resp.prompt_logprobs = router_grpc__lp_msgs(g->api->core, g->prompt_lp,
                                                          (size_t)g->n_prompt - 1, &plp_store);
            m.resp.n_prompt_logprobs = m.resp.prompt_logprobs ? (size_t)g->n_prompt - 1 : 0;
        }
    }
    st = pd_grpc_call_send(call, &m.resp.base);
    free(lp_store);
    free(plp_store);
    free(lps);
    free(text);
    return st;
}

/* The records queued (text, text_len bytes): each run of one sample's records (at most 256
 * tokens) goes out as one message; after a PD_AGAIN the runs already sent are skipped when the
 * buffer offers the same bytes again. */
static pd_status_t router_grpc__send_records(pd_grpc_call_t *call, gen_t *g, const char *text,
                                             size_t text_len)
{
    const uint8_t *p = (const uint8_t *)text, *end = p + text_len;
    size_t k = 0;
    while (p < end) {
        const uint8_t *run = p;
        rec_t h0, h;
        int tokens = 0;
        memcpy(&h0, p, sizeof h0);
        while (p < end) {
            memcpy(&h, p, sizeof h);
            if (h.index != h0.index || tokens == 256 || (p != run && (h.echo || h.finish)))
                break;
            tokens += h.token >= 0;
            p += sizeof h + (h.has_lp ? sizeof(router_logprob_t) : 0) + h.text_len;
            if (h.finish)
                break;
        }
        if (k++ < g->sent_records)
            continue;
        pd_status_t st = router_grpc__send_run(call, g, run, p);
        if (st == PD_AGAIN) {
            g->sent_records = k - 1;
            return PD_AGAIN;
        }
        if (st != PD_OK)
            return st;
    }
    g->sent_records = 0;
    return PD_OK;
}

static pd_status_t router_grpc__send_output(pd_grpc_call_t *call, const int32_t *ids, size_t n_ids,
                                            const char *text, size_t text_len, void *arg)
{
    gen_t *g = arg;
    if (g->records)
        return router_grpc__send_records(call, g, text, text_len);
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
    m.index = g->last_index;
    return pd_grpc_call_send(call, &m.base);
}

/* The client went away before the request ended: cancel it in the core, release the call. */
static void router_grpc__gen_cancelled(void *arg)
{
    gen_t *g = arg;
    router_req_t *q = g->q;
    g->q = NULL;
    for (int i = 0; q && g->qs && i < g->n; i++) /* the leader may have ended: any live sample */
        if (g->qs[i]) {
            q = g->qs[i];
            break;
        }
    if (q)
        router_request_cancel(q);                           /* every sample */
    pd_grpc_stream_buf_end(g->out, PD_ERR_CANCELLED, NULL); /* frees g */
}

static void router_grpc__gen_released(void *arg)
{
    gen__free(arg);
}

static const pd_grpc_stream_buf_ops_t gen_ops = {router_grpc__send_output, router_grpc__send_final,
                                                 router_grpc__gen_cancelled,
                                                 router_grpc__gen_released};

/* Queues one record (see rec_t). */
static void router_grpc__rec(gen_t *g, uint32_t index, int32_t token, const router_logprob_t *lp,
                             const char *text, size_t len, int echo, int finish)
{
    rec_t h = {index, token, (uint32_t)len, lp != NULL, (uint8_t)echo, (uint8_t)finish, 0};
    size_t total = sizeof h + (lp ? sizeof *lp : 0) + len;
    char *buf = malloc(total);
    if (!buf)
        return; /* the output is cut; the request goes on */
    memcpy(buf, &h, sizeof h);
    if (lp)
        memcpy(buf + sizeof h, lp, sizeof *lp);
    if (len)
        memcpy(buf + sizeof h + (lp ? sizeof *lp : 0), text, len);
    (void)pd_grpc_stream_buf_append(g->out, NULL, 0, buf, total);
    free(buf);
}

static void router_grpc__delta(router_req_t *q, void *arg, const int32_t *ids, int n,
                               const char *text, size_t len, const router_logprob_t *lp)
{
    gen_t *g = arg;
    if (!g->records) {
        /* PD_ERR_CANCELLED: the client went away during this send; the request ends on its own
         * (max_tokens, deadline) and its finish then releases the call */
        (void)pd_grpc_stream_buf_append(g->out, ids, (size_t)n, text, len);
        return;
    }
    const uint32_t index = (uint32_t)router_request_index(q);
    int echo = 0;
    g->qs[index] = q;
    if (!g->started[index]) {
        g->started[index] = 1;
        if (g->echo && !g->prompt_ids) { /* the prompt, once (its logprobs are known by now) */
            const router_logprob_t *plp;
            const int32_t *p = router_request_prompt(q, &g->n_prompt, &plp);
            g->prompt_ids = malloc((size_t)g->n_prompt * sizeof *g->prompt_ids);
            if (g->prompt_ids)
                memcpy(g->prompt_ids, p, (size_t)g->n_prompt * sizeof *p);
            if (!g->prompt_text) /* token ids given: their text, as vLLM decodes them */
                (void)tokenizer_decode(router_tokenizer(g->api->core), p, (size_t)g->n_prompt, true,
                                       &g->prompt_text, &g->prompt_text_len);
            if (plp && g->n_prompt > 1 &&
                (g->prompt_lp = malloc(((size_t)g->n_prompt - 1) * sizeof *plp)))
                memcpy(g->prompt_lp, plp, ((size_t)g->n_prompt - 1) * sizeof *plp);
        }
        echo = g->echo;
    }
    if (n == 0) {
        router_grpc__rec(g, index, -1, NULL, text, len, echo, 0);
        return;
    }
    for (int i = 0; i < n; i++) /* the text goes with the last token */
        router_grpc__rec(g, index, ids[i], lp ? &lp[i] : NULL, i == n - 1 ? text : "",
                         i == n - 1 ? len : 0, echo && i == 0, 0);
}

static void router_grpc__finish(router_req_t *q, void *arg, const char *reason, pd_status_t st,
                                const char *msg)
{
    gen_t *g = arg;
    int prompt, completion;
    router_request_usage(q, &prompt, &completion);
    g->prompt_tokens = (uint32_t)prompt;
    g->completion_tokens += (uint32_t)completion;
    if (g->qs)
        g->qs[router_request_index(q)] = NULL;
    if (g->failed) /* another sample failed: the call ended with its error */
        return;
    if (st != PD_OK) {
        /* one sample failed: the call ends with its error, the other samples are cancelled */
        g->failed = 1;
        g->q = NULL;
        router_request_cancel(q);
        pd_grpc_stream_buf_end(g->out, st, msg);
        return;
    }
    if (--g->open > 0) { /* another sample goes on: this one's end is a message of its own */
        router_grpc__rec(g, (uint32_t)router_request_index(q), -1, NULL, reason ? reason : "",
                         reason ? strlen(reason) : 0, 0, 1);
        return;
    }
    g->q = NULL;
    g->last_index = (uint32_t)router_request_index(q);
    snprintf(g->reason, sizeof g->reason, "%s", reason ? reason : "");
    pd_grpc_stream_buf_end(g->out, st, msg); /* final message and status once the client read */
}

static const router_sink_t gen_sink = {router_grpc__delta, router_grpc__finish};

/* The OpenAI / vLLM fields of req's SamplingParams into in (logit_bias into malloc'd arrays the
 * caller frees after router_request_start). PD_OK or PD_ERR_INVALID / PD_ERR_NOMEM with err. */
static pd_status_t router_grpc__openai(const Pdserve__V1__GenerateRequest *req,
                                       router_request_t *in, int32_t **ids_p, float **vals_p,
                                       char *err, size_t err_len)
{
    const Pdserve__V1__SamplingParams *sp = req->sampling;
    in->n = sp->n;
    in->best_of = sp->best_of;
    in->logprobs = sp->logprobs;
    in->top_logprobs = sp->top_logprobs;
    in->prompt_logprobs = sp->prompt_logprobs;
    in->presence_penalty = sp->presence_penalty;
    in->frequency_penalty = sp->frequency_penalty;
    in->repetition_penalty = sp->repetition_penalty;
    in->min_tokens = sp->min_tokens;
    in->stop_token_ids = sp->stop_token_ids;
    in->n_stop_token_ids = sp->n_stop_token_ids;
    if (sp->top_logprobs > 0 && !sp->logprobs) {
        snprintf(err, err_len, "top_logprobs needs logprobs");
        return PD_ERR_INVALID;
    }
    if (sp->prompt_logprobs && !req->echo) {
        snprintf(err, err_len, "prompt_logprobs needs echo (the prompt goes back with them)");
        return PD_ERR_INVALID;
    }
    if (sp->n_logit_bias == 0)
        return PD_OK;
    if (sp->n_logit_bias > ROUTER_MAX_LOGIT_BIAS) {
        snprintf(err, err_len, "logit_bias: at most %d entries", ROUTER_MAX_LOGIT_BIAS);
        return PD_ERR_INVALID;
    }
    *ids_p = malloc(sp->n_logit_bias * sizeof **ids_p);
    *vals_p = malloc(sp->n_logit_bias * sizeof **vals_p);
    if (!*ids_p || !*vals_p) {
        snprintf(err, err_len, "router out of memory for logit_bias");
        return PD_ERR_NOMEM;
    }
    for (size_t i = 0; i < sp->n_logit_bias; i++) {
        (*ids_p)[i] = sp->logit_bias[i] ? sp->logit_bias[i]->token_id : -1;
        (*vals_p)[i] = sp->logit_bias[i] ? sp->logit_bias[i]->bias : 0.0f;
    }
    in->bias_ids = *ids_p;
    in->bias_vals = *vals_p;
    in->n_bias = sp->n_logit_bias;
    return PD_OK;
}

static void router_grpc__generate(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_grpc_t *api = user;
    const gen_request_t *wire = (const gen_request_t *)msg;
    const Pdserve__V1__GenerateRequest *req = &wire->req;
    router_request_t in = {0};
    char err[512];
    gen_t *g = calloc(1, sizeof *g);
    int32_t *bias_ids = NULL;
    float *bias_vals = NULL;
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
        if (router_grpc__openai(req, &in, &bias_ids, &bias_vals, err, sizeof err) != PD_OK) {
            pd_grpc_stream_buf_end(g->out, PD_ERR_INVALID, err); /* frees g */
            return;
        }
    }
    g->n = in.n > 1 && in.n <= ROUTER_MAX_N ? (int)in.n : 1;
    g->open = g->n;
    g->echo = req->echo;
    g->records = g->n > 1 || in.logprobs || g->echo;
    if (g->records && (!(g->started = calloc((size_t)g->n, 1)) ||
                       !(g->qs = calloc((size_t)g->n, sizeof *g->qs)))) {
        free(bias_ids);
        free(bias_vals);
        pd_grpc_stream_buf_end(g->out, PD_ERR_NOMEM, "router out of memory for the call");
        return;
    }
    if (g->echo && req->n_token_ids == 0 && wire->text.len > 0 &&
        (g->prompt_text = malloc(wire->text.len + 1))) {
        memcpy(g->prompt_text, wire->text.data, wire->text.len);
        g->prompt_text[wire->text.len] = 0;
        g->prompt_text_len = wire->text.len;
    }
    int64_t left = pd_grpc_call_deadline_ms(call); /* -1: no deadline; 0: it passed */
    in.timeout_ms = left > 0 ? left : left == 0 ? -1 : 0;
    st = router_request_start(api->core, &in, &gen_sink, g, &g->q, err, sizeof err);
    free(bias_ids);
    free(bias_vals);
    if (st != PD_OK) {
        g->q = NULL;
        pd_grpc_stream_buf_end(g->out, st, err); /* frees g */
        return;
    }
    snprintf(g->request_id, sizeof g->request_id, "%s", router_request_id(g->q));
    if (g->qs)
        g->qs[0] = g->q;
}

/* ==== unary methods ==== */

static void router_grpc__abort(pd_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    router_grpc_t *api = user;
    const Pdserve__V1__AbortRequest *req = (const Pdserve__V1__AbortRequest *)msg;
    Pdserve__V1__AbortResponse rep = PDSERVE__V1__ABORT_RESPONSE__INIT;
    router_req_t *q;
    /* every sample of the request (n > 1 shares one request_id) */
    while (req->request_id && (q = router_request_find(api->core, req->request_id))) {
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
    router_metrics_listener(m, "grpc", st.connections, st.max_connections, st.rejected_connections,
                            st.accept_errors, st.idle_closed, st.request_timeouts, st.flood_closed);
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
