/* pdctl quantize (write an FP8 or INT4 checkpoint) and pdctl kv-plan (what a KV budget holds). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "dtype.h"
#include "hf_config.h"
#include "log.h"
#include "model.h"
#include "pdctl.h"
#include "safetensors.h"

/* Linear layers that are quantized: attention and MLP / expert projections. Embeddings, norms,
 * the MoE router (mlp.gate) stay BF16; the LM head follows --lm-head. */
static bool quant__is_linear(const char *name)
{
    static const char *const suffixes[] = {".q_proj.weight",   ".k_proj.weight",
                                           ".v_proj.weight",   ".o_proj.weight",
                                           ".gate_proj.weight", ".up_proj.weight",
                                           ".down_proj.weight"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t m = strlen(suffixes[i]);
        if (n > m && strcmp(name + n - m, suffixes[i]) == 0)
            return true;
    }
    return false;
}

static int quant__copy_file(const char *src_dir, const char *dst_dir, const char *name)
{
    char src[4096], dst[4096], buf[65536];
    size_t n;
    snprintf(src, sizeof src, "%s/%s", src_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dst_dir, name);
    FILE *in = fopen(src, "rb"), *out;
    if (!in)
        return 0; /* optional file */
    out = fopen(dst, "wb");
    if (!out) {
        fprintf(stderr, "pdctl quantize: %s: %s\n", dst, strerror(errno));
        fclose(in);
        return -1;
    }
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, n, out);
    fclose(in);
    return fclose(out) == 0 ? 0 : -1;
}

static int quant__write_config(const char *src_dir, const char *dst_dir, const char *format,
                               const char *lm_head)
{
    char path[4096];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    json_t *cfg = json_load_file(path, 0, &jerr);
    if (!cfg) {
        fprintf(stderr, "pdctl quantize: %s:%d:%d: %s\n", path, jerr.line, jerr.column, jerr.text);
        return -1;
    }
    json_t *q = json_pack("{s:s,s:s,s:s}", "quant_method", "pdserve", "format", format,
                          "lm_head", lm_head);
    if (strcmp(format, "int4") == 0)
        json_object_set_new(q, "group_size", json_integer(QUANT_INT4_GROUP));
    json_object_set_new(cfg, "quantization_config", q);
    snprintf(path, sizeof path, "%s/config.json", dst_dir);
    int rc = json_dump_file(cfg, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(cfg);
    if (rc != 0)
        fprintf(stderr, "pdctl quantize: %s: cannot write\n", path);
    return rc;
}

typedef struct {
    safetensors_tensor_t *t;
    size_t n, cap;
    char **names;
    void **bufs;
    size_t n_bufs;
} quant_out_t;

static safetensors_tensor_t *quant__add(quant_out_t *o, const char *name, pd_dtype_t dt, int nd,
                                        const int64_t *shape, const void *data, size_t nbytes)
{
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 256;
        o->t = realloc(o->t, o->cap * sizeof *o->t);
        o->names = realloc(o->names, o->cap * sizeof *o->names);
        PD_ASSERT(o->t && o->names);
    }
    safetensors_tensor_t *t = &o->t[o->n];
    memset(t, 0, sizeof *t);
    o->names[o->n] = strdup(name);
    t->name = o->names[o->n];
    t->dtype = dt;
    t->n_dims = nd;
    memcpy(t->shape, shape, (size_t)nd * sizeof *shape);
    t->data = data;
    t->nbytes = nbytes;
    o->n++;
    return t;
}

static void quant__keep(quant_out_t *o, void *buf)
{
    o->bufs = realloc(o->bufs, (o->n_bufs + 1) * sizeof *o->bufs);
    PD_ASSERT(o->bufs);
    o->bufs[o->n_bufs++] = buf;
}

static void quant__free(quant_out_t *o)
{
    for (size_t i = 0; i < o->n; i++)
        free(o->names[i]);
    for (size_t i = 0; i < o->n_bufs; i++)
        free(o->bufs[i]);
    free(o->t);
    free(o->names);
    free(o->bufs);
}

/* Adds weight `name` (a "<base>.weight" BF16 (n, k) tensor) quantized to fmt. */
static pd_status_t quant__add_weight(quant_out_t *o, const safetensors_tensor_t *t, pd_wfmt_t fmt)
{
    char base[512], name[600];
    const int64_t n = t->shape[0], k = t->shape[1];
    pd_weight_t w;
    pd_status_t st;

    if (t->dtype != PD_DTYPE_BF16 || t->n_dims != 2) {
        pd_log_error("%s: expected a 2-d BF16 weight, found %s with %d dims", t->name,
                     pd_dtype_name(t->dtype), t->n_dims);
        return PD_ERR_FORMAT;
    }
    st = model_quantize_bf16(t->data, n, k, fmt, &w);
    if (st == PD_ERR_INVALID) {
        pd_log_error("%s: K = %lld is not a multiple of %d: cannot quantize to int4 g%d",
                     t->name, (long long)k, QUANT_INT4_GROUP, QUANT_INT4_GROUP);
        return st;
    }
    if (st != PD_OK)
        return st;
    quant__keep(o, w.data);
    quant__keep(o, w.scales);
    quant__keep(o, w.zeros);
    snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
    if (fmt == PD_WFMT_FP8) {
        int64_t s1[1] = {n};
        quant__add(o, t->name, PD_DTYPE_F8_E4M3, 2, t->shape, w.data, (size_t)(n * k));
        snprintf(name, sizeof name, "%s.weight_scale", base);
        quant__add(o, name, PD_DTYPE_F32, 1, s1, w.scales, (size_t)n * 4);
    } else {
        int64_t sq[2] = {n, k / 2}, sg[2] = {n, k / QUANT_INT4_GROUP};
        snprintf(name, sizeof name, "%s.qweight", base);
        quant__add(o, name, PD_DTYPE_U8, 2, sq, w.data, (size_t)(n * k / 2));
        snprintf(name, sizeof name, "%s.scales", base);
        quant__add(o, name, PD_DTYPE_BF16, 2, sg, w.scales, (size_t)(sg[0] * sg[1] * 2));
        snprintf(name, sizeof name, "%s.zeros", base);
        quant__add(o, name, PD_DTYPE_U8, 2, sg, w.zeros, (size_t)(sg[0] * sg[1]));
    }
    return PD_OK;
}

int pdctl_quantize(int argc, char **argv)
{
    const char *model = NULL, *format = NULL, *out_dir = NULL, *lm_head = "bf16";
    pd_wfmt_t fmt, lm_fmt;
    safetensors_t *st = NULL;
    quant_out_t o = {0};
    hf_config_t cfg;
    char path[4096];
    int rc = 1;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model = argv[i + 1];
        else if (strcmp(argv[i], "--format") == 0)
            format = argv[i + 1];
        else if (strcmp(argv[i], "--out") == 0)
            out_dir = argv[i + 1];
        else if (strcmp(argv[i], "--lm-head") == 0)
            lm_head = argv[i + 1];
        else {
            fprintf(stderr, "pdctl quantize: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!model || !format || !out_dir || argc % 2 == 0) {
        fprintf(stderr, "usage: pdctl quantize --model DIR --format int4|fp8 --out DIR2 "
                        "[--lm-head bf16|fp8|int4]\n");
        return 2;
    }
    if (pd_wfmt_parse(format, &fmt) != 0 || (fmt != PD_WFMT_FP8 && fmt != PD_WFMT_INT4)) {
        fprintf(stderr, "pdctl quantize: --format: unknown format '%s' (expected int4 or fp8)\n",
                format);
        return 2;
    }
    if (pd_wfmt_parse(lm_head, &lm_fmt) != 0 || lm_fmt == PD_WFMT_F32) {
        fprintf(stderr, "pdctl quantize: --lm-head: unknown format '%s' (expected bf16, fp8 or "
                        "int4)\n",
                lm_head);
        return 2;
    }
    snprintf(path, sizeof path, "%s/config.json", model);
    if (hf_config_load(path, &cfg) != PD_OK)
        return 1;
    if (cfg.quant_format[0]) {
        fprintf(stderr, "pdctl quantize: %s is already quantized (%s); start from the BF16 "
                        "checkpoint\n",
                model, cfg.quant_format);
        return 1;
    }
    if (safetensors_open_model(model, &st) != PD_OK)
        return 1;
    size_t n = safetensors_count(st);
    for (size_t i = 0; i < n; i++) {
        const safetensors_tensor_t *t = safetensors_at(st, i);
        pd_status_t s = PD_OK;
        pd_log_progress("quantizing", i, n);
        if (quant__is_linear(t->name))
            s = quant__add_weight(&o, t, fmt);
        else if (strcmp(t->name, "lm_head.weight") == 0 && lm_fmt != PD_WFMT_BF16)
            s = quant__add_weight(&o, t, lm_fmt);
        else
            quant__add(&o, t->name, t->dtype, t->n_dims, t->shape, t->data, t->nbytes);
        if (s != PD_OK)
            goto out;
    }
    pd_log_progress("quantizing", n, n);
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "pdctl quantize: %s: %s\n", out_dir, strerror(errno));
        goto out;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    const char *meta[] = {"format", "pt", "pdserve_quant", format};
    if (safetensors_write(path, o.t, o.n, meta, 2) != PD_OK)
        goto out;
    if (quant__write_config(model, out_dir, format, lm_head) != 0)
        goto out;
    static const char *const extra[] = {"tokenizer.json", "tiktoken.model",
                                        "tokenizer_config.json", "generation_config.json",
                                        "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if (quant__copy_file(model, out_dir, extra[i]) != 0)
            goto out;
    struct stat sb;
    if (stat(path, &sb) == 0)
        printf("{\"out\": \"%s\", \"format\": \"%s\", \"tensors\": %zu, \"bytes\": %lld}\n", out_dir,
               format, o.n, (long long)sb.st_size);
    rc = 0;
out:
    quant__free(&o);
    safetensors_close(st);
    return rc;
}

int pdctl_kv_plan(int argc, char **argv)
{
    const char *model = NULL, *budget_s = NULL;
    int page_tokens = 16;
    bool json = false;
    hf_config_t cfg;
    char path[4096];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model = argv[++i];
        else if (strcmp(argv[i], "--budget") == 0 && i + 1 < argc)
            budget_s = argv[++i];
        else if (strcmp(argv[i], "--page-tokens") == 0 && i + 1 < argc)
            page_tokens = atoi(argv[++i]);
        else {
            fprintf(stderr, "pdctl kv-plan: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!model || !budget_s) {
        fprintf(stderr, "usage: pdctl kv-plan --model DIR --budget BYTES [--page-tokens N] "
                        "[--json]\n");
        return 2;
    }
    int64_t budget = pdctl_parse_bytes(budget_s);
    if (budget < 0) {
        fprintf(stderr, "pdctl kv-plan: --budget: '%s' is not a size (e.g. 8GiB)\n", budget_s);
        return 2;
    }
    if (page_tokens < 1) {
        fprintf(stderr, "pdctl kv-plan: --page-tokens must be at least 1\n");
        return 2;
    }
    snprintf(path, sizeof path, "%s/config.json", model);
    if (hf_config_load(path, &cfg) != PD_OK)
        return 1;
    static const pd_kvfmt_t fmts[] = {PD_KV_BF16, PD_KV_FP8};
    json_t *rows = json_array();
    int64_t min_pages = -1;
    if (!json)
        printf("%-6s %16s %12s %12s %14s\n", "kv", "bytes/token", "page bytes", "pages",
               "tokens");
    for (size_t i = 0; i < 2; i++) {
        kv_layout_t l;
        int kv_heads, kv_dim, kv_sides; /* MLA: one latent of kv_lora_rank + rope dims */
        hf_config_kv_shape(&cfg, &kv_heads, &kv_dim, &kv_sides);
        kv_layout_init_sides(&l, cfg.num_hidden_layers, kv_heads, kv_dim, kv_sides, page_tokens,
                             fmts[i]);
        int64_t pages = budget / (int64_t)l.page_bytes;
        if (min_pages < 0 || pages < min_pages)
            min_pages = pages;
        if (json)
            json_array_append_new(
                rows, json_pack("{s:s,s:f,s:I,s:I,s:I}", "kv", pd_kvfmt_name(fmts[i]),
                                "bytes_per_token", kv_layout_bytes_per_token(&l), "page_bytes",
                                (json_int_t)l.page_bytes, "pages", (json_int_t)pages, "tokens",
                                (json_int_t)(pages * page_tokens)));
        else
            printf("%-6s %16.1f %12zu %12lld %14lld\n", pd_kvfmt_name(fmts[i]),
                   kv_layout_bytes_per_token(&l), l.page_bytes, (long long)pages,
                   (long long)(pages * page_tokens));
    }
    if (json) {
        char *s = json_dumps(rows, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
    }
    json_decref(rows);
    if (min_pages < 1) {
        fprintf(stderr, "pdctl kv-plan: a budget of %lld bytes holds no page for %s\n",
                (long long)budget, model);
        return 1;
    }
    return 0;
}
