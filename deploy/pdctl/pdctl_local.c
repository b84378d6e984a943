/* pdctl commands that run a model in this process: tokenize, generate, ppl. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "hf_config.h"
#include "log.h"
#include "pipeline.h"
#include "pdctl.h"
#include "tokenizer.h"

/* ==== shared option handling ==== */

int64_t pdctl_parse_bytes(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    if (*end == 0 || strcmp(end, "B") == 0)
        return (int64_t)v;
    if (strcmp(end, "KiB") == 0 || strcmp(end, "K") == 0)
        return (int64_t)(v * 1024);
    if (strcmp(end, "MiB") == 0 || strcmp(end, "M") == 0)
        return (int64_t)(v * 1024 * 1024);
    if (strcmp(end, "GiB") == 0 || strcmp(end, "G") == 0)
        return (int64_t)(v * 1024 * 1024 * 1024);
    return -1;
}

void pdctl_model_opts_init(pdctl_model_opts_t *o)
{
    memset(o, 0, sizeof *o);
    engine_params_default(&o->ep);
    o->ep.progress = true;
    o->weights = NULL; /* default: the checkpoint's format (bf16 unless quantized) */
    o->kv = "bf16";
    o->lm_head = NULL;
}

static int pdctl__int(const char *name, const char *v, int lo, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == 0 || *end || x < lo || x > 1 << 30) {
        fprintf(stderr, "pdctl: %s: '%s' is not an integer >= %d\n", name, v, lo);
        return -1;
    }
    *out = (int)x;
    return 1;
}

int pdctl_model_opt(pdctl_model_opts_t *o, const char *name, const char *value)
{
    if (strcmp(name, "--model") == 0)
        o->ep.model_dir = value;
    else if (strcmp(name, "--weights") == 0)
        o->weights = value;
    else if (strcmp(name, "--kv") == 0)
        o->kv = value;
    else if (strcmp(name, "--lm-head") == 0)
        o->lm_head = value;
    else if (strcmp(name, "--backend") == 0)
        o->ep.backend = value;
    else if (strcmp(name, "--threads") == 0)
        return pdctl__int(name, value, 0, &o->ep.threads);
    else if (strcmp(name, "--device") == 0)
        return pdctl__int(name, value, 0, &o->ep.device);
    else if (strcmp(name, "--page-tokens") == 0)
        return pdctl__int(name, value, 1, &o->ep.page_tokens);
    else if (strcmp(name, "--prefill-chunk") == 0)
        return pdctl__int(name, value, 1, &o->ep.prefill_chunk);
    else if (strcmp(name, "--kv-budget") == 0) {
        o->ep.kv_budget = pdctl_parse_bytes(value);
        if (o->ep.kv_budget < 0) {
            fprintf(stderr, "pdctl: --kv-budget: '%s' is not a size (e.g. 64MiB)\n", value);
            return -1;
        }
    } else if (strcmp(name, "--tracker") == 0) {
        if (kv_tracker_kind_parse(value, &o->ep.tracker) != 0) {
            fprintf(stderr, "pdctl: --tracker: unknown '%s' (expected tagged or noop)\n", value);
            return -1;
        }
    } else
        return 0;
    return 1;
}

int pdctl_model_opts_finish(pdctl_model_opts_t *o)
{
    if (!o->ep.model_dir) {
        fprintf(stderr, "pdctl: --model DIR is required\n");
        return -1;
    }
    if (!o->weights || !o->lm_head) {
        char path[4096];
        hf_config_t cfg;
        snprintf(path, sizeof path, "%s/config.json", o->ep.model_dir);
        if (hf_config_load(path, &cfg) != PD_OK)
            return -1;
        static char wbuf[16], lbuf[16];
        snprintf(wbuf, sizeof wbuf, "%s", cfg.quant_format[0] ? cfg.quant_format : "bf16");
        snprintf(lbuf, sizeof lbuf, "%s", cfg.quant_format[0] ? cfg.quant_lm_head : "bf16");
        if (!o->weights)
            o->weights = wbuf;
        if (!o->lm_head)
            o->lm_head = lbuf;
    }
    if (pd_wfmt_parse(o->weights, &o->ep.wfmt) != 0 || o->ep.wfmt == PD_WFMT_F32) {
        fprintf(stderr, "pdctl: --weights: unknown format '%s' (expected bf16, fp8 or int4)\n",
                o->weights);
        return -1;
    }
    if (pd_wfmt_parse(o->lm_head, &o->ep.lm_head_fmt) != 0) {
        fprintf(stderr, "pdctl: --lm-head: unknown format '%s' (expected bf16, fp8 or int4)\n",
                o->lm_head);
        return -1;
    }
    if (pd_kvfmt_parse(o->kv, &o->ep.kvfmt) != 0) {
        fprintf(stderr, "pdctl: --kv: unknown format '%s' (expected bf16, fp8 or f32)\n", o->kv);
        return -1;
    }
    return 0;
}

static tokenizer_t *pdctl__tokenizer(const char *model_dir)
{
    tokenizer_t *tok;
    if (tokenizer_load_dir(model_dir, &tok) != PD_OK) /* tokenizer.json, or tiktoken.model */
        return NULL;
    return tok;
}

/* ==== tokenize ==== */

int pdctl_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL;
    bool bos = true;
    tokenizer_t *tok;
    int32_t *ids;
    size_t n;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model = argv[++i];
        else if (strcmp(argv[i], "--no-bos") == 0)
            bos = false;
        else if (argv[i][0] == '-' && argv[i][1] == '-') {
            fprintf(stderr, "pdctl tokenize: unknown option '%s'\n", argv[i]);
            return 2;
        } else
            text = argv[i];
    }
    if (!model || !text) {
        fprintf(stderr, "usage: pdctl tokenize --model DIR [--no-bos] TEXT\n");
        return 2;
    }
    if (!(tok = pdctl__tokenizer(model)))
        return 1;
    if (tokenizer_encode(tok, text, strlen(text), bos, &ids, &n) != PD_OK) {
        tokenizer_destroy(tok);
        return 1;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, json_integer(ids[i]));
    json_t *o = json_pack("{s:o}", "ids", arr);
    char *s = json_dumps(o, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(o);
    free(ids);
    tokenizer_destroy(tok);
    return 0;
}

/* ==== generate ==== */

typedef struct {
    tokenizer_stream_t *stream;
    bool print;
    int32_t *out;
    int n_out, cap;
    engine_finish_t finish;
    pd_status_t status;
    engine_t **e_lp;        /* --logprobs: the engine whose token logprobs are kept */
    sampler_logprobs_t *lp; /* (cap) */
} gen_state_t;

#define PDCTL_MAX_IDS 64

static void pdctl__on_token(void *arg, uint64_t seq_id, int32_t token, engine_finish_t finish,
                            pd_status_t status)
{
    gen_state_t *g = arg;
    (void)seq_id;
    if (token < 0) {
        g->finish = finish;
        g->status = status;
        return;
    }
    if (g->n_out == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 64;
        g->out = realloc(g->out, (size_t)g->cap * sizeof *g->out);
        PD_ASSERT(g->out);
    }
    if (g->e_lp) {
        const sampler_logprobs_t *lp = engine_token_logprobs(*g->e_lp);
        g->lp = realloc(g->lp, (size_t)g->cap * sizeof *g->lp);
        PD_ASSERT(g->lp);
        if (lp)
            g->lp[g->n_out] = *lp;
        else /* the first token of the two-engine pipeline is the prefill engine's */
            memset(&g->lp[g->n_out], 0, sizeof *g->lp);
    }
    g->out[g->n_out++] = token;
    if (g->print) {
        char *delta;
        size_t len;
        if (tokenizer_stream_push(g->stream, token, &delta, &len) == PD_OK) {
            fwrite(delta, 1, len, stdout);
            fflush(stdout);
            free(delta);
        }
    }
}

static int pdctl__write_floats(const char *path, const float *v, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, sizeof *v, n, f) != n) {
        fprintf(stderr, "pdctl: %s: cannot write: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* n samples of one prompt as the cluster runs them: one prefill (on pe, else on e) samples every
 * first token; each sample decodes on e from a copy of the prompt's KV, the last from the KV
 * itself. Prints {"input_ids", "samples": [{"output_ids", "text", "finish_reason"}]} (json) or
 * each sample's text on a line. Returns 0 or 1. */
static int pdctl__generate_n(engine_t *pe, engine_t *e, tokenizer_t *tok, const int32_t *ids,
                             int n_ids, const engine_gen_params_t *gp, int n, bool json)
{
    const hf_config_t *cfg = &engine_model(e)->cfg;
    engine_gen_params_t pgp = *gp;
    int32_t *first = calloc((size_t)n, sizeof *first),
            *toks = malloc(((size_t)n_ids + 1) * sizeof *toks);
    gen_state_t *gs = calloc((size_t)n, sizeof *gs);
    kv_seq_t kv, dkv;
    int rc = 1;
    uint64_t id;

    kv_seq_init(&dkv);
    if (!first || !toks || !gs)
        goto out;
    pgp.n_samples = n;
    pgp.logprobs = false;
    if (engine_prefill(pe ? pe : e, ids, n_ids, &pgp, NULL, NULL, first, &kv, NULL) != PD_OK)
        goto out;
    if (pe) { /* the prefill engine's KV converted into e's pool, as a decode node receives it */
        pd_status_t st = kv_seq_reserve(engine_pool(e), &dkv, n_ids);
        if (st == PD_OK)
            st = pipeline_copy_pages(e, &dkv, pe, &kv, 0, kv.n_pages);
        kv_seq_release(engine_pool(pe), &kv);
        kv_seq_deinit(&kv);
        if (st != PD_OK)
            goto out;
    } else {
        dkv = kv;
    }
    dkv.n_tokens = n_ids;
    memcpy(toks, ids, (size_t)n_ids * sizeof *toks);
    for (int i = 0; i < n; i++) {
        gen_state_t *g = &gs[i];
        pdctl__on_token(g, 0, first[i], ENGINE_FINISH_NONE, PD_OK);
        bool stop = hf_config_is_stop(cfg, first[i], gp->ignore_eos, gp->stop_ids, gp->n_stop_ids);
        if (stop || gp->max_tokens <= 1) {
            g->finish = stop ? ENGINE_FINISH_STOP : ENGINE_FINISH_LENGTH;
            continue;
        }
        kv_seq_t use;
        kv_seq_init(&use);
        if (i < n - 1 && engine_kv_copy(e, &dkv, n_ids, &use) != PD_OK)
            goto out;
        engine_gen_params_t g1 = *gp;
        g1.max_tokens = gp->max_tokens - 1;
        g1.n_generated = 1;
        g1.sample_index = (uint32_t)i;
        toks[n_ids] = first[i];
        pd_status_t st = engine_seq_add_prefilled(
            e, toks, n_ids + 1, n_ids, i < n - 1 ? &use : &dkv, &g1, pdctl__on_token, g, &id);
        kv_seq_release(engine_pool(e), &use);
        kv_seq_deinit(&use);
        if (st != PD_OK)
            goto out;
    }
    if (engine_run(e) != PD_OK)
        goto out;
    json_t *samples = json_array(), *in = json_array();
    for (int i = 0; i < n_ids; i++)
        json_array_append_new(in, json_integer(ids[i]));
    for (int i = 0; i < n; i++) {
        char *text = NULL;
        size_t len = 0;
        json_t *o = json_array();
        for (int k = 0; k < gs[i].n_out; k++)
            json_array_append_new(o, json_integer(gs[i].out[k]));
        (void)tokenizer_decode(tok, gs[i].out, (size_t)gs[i].n_out, true, &text, &len);
        if (!json)
            printf("%.*s\n", (int)len, text ? text : "");
        json_array_append_new(samples,
                              json_pack("{s:o,s:s%,s:s}", "output_ids", o, "text", text ? text : "",
                                        len, "finish_reason", engine_finish_str(gs[i].finish)));
        free(text);
    }
    json_t *doc = json_pack("{s:o,s:o}", "input_ids", in, "samples", samples);
    if (json) {
        char *txt = json_dumps(doc, JSON_COMPACT);
        printf("%s\n", txt);
        free(txt);
    }
    json_decref(doc);
    rc = 0;
out:
    kv_seq_release(engine_pool(e), &dkv);
    kv_seq_deinit(&dkv);
    for (int i = 0; gs && i < n; i++) {
        free(gs[i].out);
        free(gs[i].lp);
    }
    free(gs);
    free(first);
    free(toks);
    return rc;
}

int pdctl_generate(int argc, char **argv)
{
    pdctl_model_opts_t mo;
    engine_gen_params_t gp = {.sampling = {0.0f, 0, 1.0f, 0}, .max_tokens = 16};
    const char *prompt = NULL, *logits_out = NULL, *pre_w = NULL, *pre_kv = NULL;
    engine_t *pe = NULL;
    bool json = false;
    int rc = 1;
    tokenizer_t *tok = NULL;
    engine_t *e = NULL;
    int32_t *ids = NULL;
    size_t n_ids;
    uint64_t seq;
    gen_state_t g = {0};
    float *logits = NULL;
    int32_t bias_ids[PDCTL_MAX_IDS], stop_ids[PDCTL_MAX_IDS];
    float bias_vals[PDCTL_MAX_IDS];
    int n_bias = 0, n_stop = 0, n_samples = 1;

    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--router") == 0)
            return pdctl_generate_router(argc, argv);
    pdctl_model_opts_init(&mo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r;
        if (strcmp(a, "--json") == 0) {
            json = true;
            continue;
        }
        if (strcmp(a, "--ignore-eos") == 0) {
            gp.ignore_eos = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "pdctl generate: %s needs a value\n", a);
            return 2;
        }
        i++;
        if ((r = pdctl_model_opt(&mo, a, v)) < 0)
            return 2;
        if (r > 0)
            continue;
        if (strcmp(a, "--prompt") == 0)
            prompt = v;
        else if (strcmp(a, "--max-tokens") == 0) {
            if (pdctl__int(a, v, 1, &gp.max_tokens) < 0)
                return 2;
        } else if (strcmp(a, "--temperature") == 0)
            gp.sampling.temperature = strtof(v, NULL);
        else if (strcmp(a, "--top-p") == 0)
            gp.sampling.top_p = strtof(v, NULL);
        else if (strcmp(a, "--top-k") == 0) {
            if (pdctl__int(a, v, 0, &gp.sampling.top_k) < 0)
                return 2;
        } else if (strcmp(a, "--seed") == 0)
            gp.sampling.seed = strtoull(v, NULL, 10);
        else if (strcmp(a, "--presence-penalty") == 0)
            gp.presence_penalty = strtof(v, NULL);
        else if (strcmp(a, "--frequency-penalty") == 0)
            gp.frequency_penalty = strtof(v, NULL);
        else if (strcmp(a, "--repetition-penalty") == 0)
            gp.repetition_penalty = strtof(v, NULL);
        else if (strcmp(a, "--min-tokens") == 0) {
            if (pdctl__int(a, v, 0, &gp.min_tokens) < 0)
                return 2;
        } else if (strcmp(a, "--logit-bias") == 0) { /* ID=BIAS, repeatable */
            char *end;
            long id = strtol(v, &end, 10);
            if (*end != '=' || n_bias == PDCTL_MAX_IDS) {
                fprintf(stderr, "pdctl generate: --logit-bias ID=BIAS (at most %d)\n",
                        PDCTL_MAX_IDS);
                return 2;
            }
            bias_ids[n_bias] = (int32_t)id;
            bias_vals[n_bias++] = strtof(end + 1, NULL);
        } else if (strcmp(a, "--stop-token-id") == 0) { /* repeatable */
            if (n_stop == PDCTL_MAX_IDS || pdctl__int(a, v, 0, &stop_ids[n_stop]) < 0)
                return 2;
            n_stop++;
        } else if (strcmp(a, "--n") == 0) { /* parallel samples sharing one prefill */
            if (pdctl__int(a, v, 1, &n_samples) < 0)
                return 2;
        } else if (strcmp(a, "--logprobs") == 0) { /* N alternatives (0..20), in --json */
            if (pdctl__int(a, v, 0, &gp.top_logprobs) < 0)
                return 2;
            gp.logprobs = true;
        } else if (strcmp(a, "--logits-out") == 0)
            logits_out = v;
        else if (strcmp(a, "--prefill-weights") == 0)
            pre_w = v;
        else if (strcmp(a, "--prefill-kv") == 0)
            pre_kv = v;
        else {
            fprintf(stderr, "pdctl generate: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (pdctl_model_opts_finish(&mo) != 0)
        return 2;
    gp.bias_ids = bias_ids;
    gp.bias_vals = bias_vals;
    gp.n_bias = n_bias;
    gp.stop_ids = stop_ids;
    gp.n_stop_ids = n_stop;
    g.e_lp = gp.logprobs ? &e : NULL;
    if (!prompt) {
        fprintf(stderr, "pdctl generate: --prompt TEXT is required\n");
        return 2;
    }
    if (prompt[0] == 0) {
        fprintf(stderr, "pdctl generate: --prompt: the prompt is empty\n");
        return 2;
    }
    if (!(tok = pdctl__tokenizer(mo.ep.model_dir)))
        goto out;
    if (tokenizer_encode(tok, prompt, strlen(prompt), true, &ids, &n_ids) != PD_OK)
        goto out;
    mo.ep.progress = !json;
    if (engine_create(&mo.ep, &e) != PD_OK)
        goto out;
    if (logits_out) {
        double nll;
        const model_t *m = engine_model(e);
        if ((int)n_ids > m->cfg.max_position_embeddings) {
            fprintf(stderr,
                    "pdctl generate: prompt of %zu tokens is longer than the context (%d)\n", n_ids,
                    m->cfg.max_position_embeddings);
            goto out;
        }
        logits = malloc((size_t)m->cfg.vocab_size * sizeof *logits);
        if (!logits || engine_score(e, ids, (int)n_ids, (int)n_ids, NULL, &nll, logits) != PD_OK)
            goto out;
        if (pdctl__write_floats(logits_out, logits, (size_t)m->cfg.vocab_size) != 0)
            goto out;
    }
    g.print = !json;
    if (tokenizer_stream_create(tok, true, &g.stream) != PD_OK)
        goto out;
    if (pre_w || pre_kv) {
        /* disaggregated formats in one process: prefill engine -> KV conversion -> this engine */
        engine_params_t pp = mo.ep;
        if (pd_wfmt_parse(pre_w ? pre_w : "fp8", &pp.wfmt) != 0 ||
            pd_kvfmt_parse(pre_kv ? pre_kv : "bf16", &pp.kvfmt) != 0) {
            fprintf(stderr, "pdctl generate: --prefill-weights / --prefill-kv: unknown format\n");
            goto out;
        }
        pp.progress = false;
        if (engine_create(&pp, &pe) != PD_OK)
            goto out;
        if (n_samples > 1) {
            rc = pdctl__generate_n(pe, e, tok, ids, (int)n_ids, &gp, n_samples, json);
            goto out;
        }
        if (pipeline_add(pe, e, ids, (int)n_ids, &gp, pdctl__on_token, &g) != PD_OK)
            goto out;
    } else if (n_samples > 1) {
        rc = pdctl__generate_n(NULL, e, tok, ids, (int)n_ids, &gp, n_samples, json);
        goto out;
    } else if (engine_seq_add(e, ids, (int)n_ids, &gp, pdctl__on_token, &g, &seq) != PD_OK) {
        goto out;
    }
    if (engine_run(e) != PD_OK)
        goto out;
    if (g.status != PD_OK) {
        fprintf(stderr, "pdctl generate: %s\n", pd_status_str(g.status));
        goto out;
    }
    if (json) {
        char *text;
        size_t len;
        if (tokenizer_decode(tok, g.out, (size_t)g.n_out, true, &text, &len) != PD_OK)
            goto out;
        json_t *in = json_array(), *outa = json_array();
        for (size_t i = 0; i < n_ids; i++)
            json_array_append_new(in, json_integer(ids[i]));
        for (int i = 0; i < g.n_out; i++)
            json_array_append_new(outa, json_integer(g.out[i]));
        json_t *o = json_pack("{s:o,s:o,s:s%,s:s}", "input_ids", in, "output_ids", outa, "text",
                              text, len, "finish_reason", engine_finish_str(g.finish));
        if (g.e_lp) { /* [[logprob, [[id, logprob], ...]], ...] per output token */
            json_t *lps = json_array();
            for (int i = 0; i < g.n_out; i++) {
                json_t *top = json_array();
                for (int k = 0; k < g.lp[i].n_top; k++)
                    json_array_append_new(top, json_pack("[i,f]", g.lp[i].top_ids[k],
                                                         (double)g.lp[i].top_logprobs[k]));
                json_array_append_new(lps, json_pack("[f,o]", (double)g.lp[i].logprob, top));
            }
            json_object_set_new(o, "logprobs", lps);
        }
        char *s = json_dumps(o, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(o);
        free(text);
    } else {
        char *delta;
        size_t len;
        if (tokenizer_stream_flush(g.stream, &delta, &len) == PD_OK) {
            fwrite(delta, 1, len, stdout);
            free(delta);
        }
        printf("\n");
    }
    rc = 0;
out:
    tokenizer_stream_destroy(g.stream);
    free(g.out);
    free(g.lp);
    free(logits);
    free(ids);
    engine_destroy(pe);
    engine_destroy(e);
    tokenizer_destroy(tok);
    return rc;
}

/* ==== ppl ==== */

static char *pdctl__read_file(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (!f) {
        fprintf(stderr, "pdctl: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = 0;
        *len_p = (size_t)n;
    } else {
        fprintf(stderr, "pdctl: %s: cannot read\n", path);
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

int pdctl_ppl(int argc, char **argv)
{
    pdctl_model_opts_t mo;
    const char *text_file = NULL;
    int window = 512, rc = 1;
    tokenizer_t *tok = NULL;
    engine_t *e = NULL;
    char *text = NULL;
    size_t len, n_ids;
    int32_t *ids = NULL, *input = NULL;
    double nll_total = 0.0;
    long targets = 0;

    pdctl_model_opts_init(&mo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r;
        if (!v) {
            fprintf(stderr, "pdctl ppl: %s needs a value\n", a);
            return 2;
        }
        i++;
        if ((r = pdctl_model_opt(&mo, a, v)) < 0)
            return 2;
        if (r > 0)
            continue;
        if (strcmp(a, "--text-file") == 0)
            text_file = v;
        else if (strcmp(a, "--window") == 0) {
            if (pdctl__int(a, v, 1, &window) < 0)
                return 2;
        } else {
            fprintf(stderr, "pdctl ppl: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (pdctl_model_opts_finish(&mo) != 0)
        return 2;
    if (!text_file) {
        fprintf(stderr, "pdctl ppl: --text-file F is required\n");
        return 2;
    }
    if (!(text = pdctl__read_file(text_file, &len)))
        goto out;
    if (!(tok = pdctl__tokenizer(mo.ep.model_dir)))
        goto out;
    if (tokenizer_encode(tok, text, len, false, &ids, &n_ids) != PD_OK)
        goto out;
    if (engine_create(&mo.ep, &e) != PD_OK)
        goto out;
    if (window + 1 > engine_model(e)->cfg.max_position_embeddings) {
        fprintf(stderr, "pdctl ppl: --window %d does not fit the context of %d tokens\n", window,
                engine_model(e)->cfg.max_position_embeddings);
        goto out;
    }
    input = malloc(((size_t)window + 1) * sizeof *input);
    if (!input)
        goto out;
    int32_t bos = tokenizer_bos_id(tok);
    if (bos < 0)
        bos = engine_model(e)->cfg.bos_token_id;
    size_t n_windows = (n_ids + (size_t)window - 1) / (size_t)window;
    for (size_t s = 0, w = 0; s < n_ids; s += (size_t)window, w++) {
        size_t ny = n_ids - (s + 1) < (size_t)window ? n_ids - (s + 1) : (size_t)window;
        double nll;
        if (s + 1 >= n_ids)
            break;
        input[0] = bos;
        memcpy(input + 1, ids + s, ny * sizeof *ids);
        pd_log_progress("perplexity", w, n_windows);
        if (engine_score(e, input, (int)ny + 1, 1, ids + s + 1, &nll, NULL) != PD_OK)
            goto out;
        nll_total += nll;
        targets += (long)ny;
    }
    pd_log_progress("perplexity", n_windows, n_windows);
    if (targets == 0) {
        fprintf(stderr, "pdctl ppl: %s: fewer than two tokens\n", text_file);
        goto out;
    }
    printf("{\"ppl\": %.6f, \"nll\": %.9f, \"targets\": %ld}\n", exp(nll_total / (double)targets),
           nll_total / (double)targets, targets);
    rc = 0;
out:
    free(input);
    free(ids);
    free(text);
    engine_destroy(e);
    tokenizer_destroy(tok);
    return rc;
}

/* ==== agree: teacher-forced top-1 agreement with transformers' greedy ids ==== */

int pdctl_agree(int argc, char **argv)
{
    pdctl_model_opts_t mo;
    const char *ref_path = NULL;
    engine_t *e = NULL;
    json_t *ref = NULL;
    json_error_t jerr;
    long agree = 0, total = 0, exact_cases = 0;
    int rc = 1;

    pdctl_model_opts_init(&mo);
    mo.ep.progress = false;
    for (int i = 1; i + 1 < argc; i += 2) {
        int r = pdctl_model_opt(&mo, argv[i], argv[i + 1]);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (strcmp(argv[i], "--reference") == 0)
            ref_path = argv[i + 1];
        else {
            fprintf(stderr, "pdctl agree: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (pdctl_model_opts_finish(&mo) != 0)
        return 2;
    if (!ref_path) {
        fprintf(stderr,
                "usage: pdctl agree --model DIR --reference reference.json [model options]\n");
        return 2;
    }
    if (!(ref = json_load_file(ref_path, 0, &jerr))) {
        fprintf(stderr, "pdctl agree: %s:%d:%d: %s\n", ref_path, jerr.line, jerr.column, jerr.text);
        return 1;
    }
    if (engine_create(&mo.ep, &e) != PD_OK)
        goto out;
    json_t *cases = json_object_get(ref, "cases"), *c;
    size_t ci;
    json_array_foreach(cases, ci, c)
    {
        json_t *in = json_object_get(c, "input_ids"), *gr = json_object_get(c, "greedy_ids");
        int ni = (int)json_array_size(in), ng = (int)json_array_size(gr), n = ni + ng - 1;
        int32_t *ids = malloc((size_t)n * sizeof *ids), *top = malloc((size_t)ng * sizeof *top);
        double nll;
        PD_ASSERT(ids && top);
        for (int i = 0; i < ni; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(in, (size_t)i));
        for (int i = 0; i < ng - 1; i++)
            ids[ni + i] = (int32_t)json_integer_value(json_array_get(gr, (size_t)i));
        pd_status_t st = engine_score_top1(e, ids, n, ni - 1, NULL, &nll, top);
        int same = 1;
        for (int i = 0; st == PD_OK && i < ng; i++) {
            int ok = top[i] == json_integer_value(json_array_get(gr, (size_t)i));
            agree += ok;
            same &= ok;
            total++;
        }
        exact_cases += same;
        free(ids);
        free(top);
        if (st != PD_OK)
            goto out;
    }
    printf("{\"agree\": %ld, \"total\": %ld, \"top1\": %.6f, \"cases_all_agree\": %ld, "
           "\"cases\": %zu}\n",
           agree, total, total ? (double)agree / (double)total : 0.0, exact_cases,
           json_array_size(cases));
    rc = 0;
out:
    engine_destroy(e);
    json_decref(ref);
    return rc;
}
