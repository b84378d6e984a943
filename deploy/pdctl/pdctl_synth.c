/* pdctl synth: a Hugging Face model directory of a published architecture with seeded random
 * weights, so real-size models can be served and benchmarked without downloads.
 *
 * Writes config.json (the published shape of the architecture; --layers, --hidden and --experts
 * shrink it, --context sets max_position_embeddings), BF16 safetensors shards of at most 4 GiB with
 * model.safetensors.index.json, and the fixtures' tokenizer (tiny-llama's byte-level BPE) with its
 * vocabulary padded to the model's vocab_size by unreachable "<|synth_pad_N|>" entries, so every id
 * the model can emit decodes.
 *
 * Weights: each tensor is filled from its own stream (splitmix64 seeded by --seed and the tensor
 * name, so a tensor does not depend on the others or on the shard layout), uniform with the
 * standard deviation a forward pass needs to stay finite: 1 for the embeddings (RMSNorm follows),
 * 1/sqrt(fan_in) for projections, further divided by sqrt(2 * layers) for the two that write the
 * residual stream (o_proj, down_proj), 1 for norms. Tensors are generated and written in 4 MiB
 * blocks: an 8B model (16 GB) never sits in memory.
 *
 * Token ids: config.json keeps bos/eos of the fixtures' tokenizer (0 and 1), not the published
 * 128000/151643, because that is the tokenizer the directory carries.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "dtype.h"
#include "pdctl.h"

#ifndef PDCTL_MODELS_DIR
#define PDCTL_MODELS_DIR "deploy/models"
#endif

#define SYNTH_SHARD_MIB 4096         /* default shard size, as the Hugging Face writers use */
#define SYNTH_BLOCK_ELEMS (2u << 20) /* 4 MiB of bf16 per write */

typedef struct {
    const char *name;     /* --arch */
    const char *hf_class; /* architectures[0] */
    const char *model_type;
    int loads; /* 0: the family does not load yet: refused with a message */
    int hidden, inter, layers, heads, kv_heads, head_dim, vocab, max_pos;
    double rope_theta, rms_eps;
    int qk_norm;                   /* Qwen3: q_norm / k_norm per head */
    int experts, top_k, moe_inter; /* 0 experts: dense MLP */
} synth_arch_t;

/* Published shapes (config.json of each model on the Hugging Face hub). GLM-4.5 and DeepSeek-V3
 * are listed so the names are known; they are refused until their families load (issue 15),
 * and need their own tensor lists below (MLA, shared experts, dense first layers). */
static const synth_arch_t synth_arches[] = {
    {"llama-3-8b", "LlamaForCausalLM", "llama", 1, 4096, 14336, 32, 32, 8, 128, 128256, 8192,
     500000.0, 1e-5, 0, 0, 0, 0},
    {"llama-3-70b", "LlamaForCausalLM", "llama", 1, 8192, 28672, 80, 64, 8, 128, 128256, 8192,
     500000.0, 1e-5, 0, 0, 0, 0},
    {"qwen3-30b-a3b", "Qwen3MoeForCausalLM", "qwen3_moe", 1, 2048, 6144, 48, 32, 4, 128, 151936,
     40960, 1000000.0, 1e-6, 1, 128, 8, 768},
    {"glm-4.5", "Glm4MoeForCausalLM", "glm4_moe", 0, 5120, 12288, 92, 96, 8, 128, 151552, 131072,
     1000000.0, 1e-5, 1, 160, 8, 1536},
    {"deepseek-v3", "DeepseekV3ForCausalLM", "deepseek_v3", 0, 7168, 18432, 61, 128, 128, 192,
     129280, 163840, 10000.0, 1e-6, 0, 256, 8, 2048},
};

/* ==== tensor list ==== */

typedef struct {
    char name[96];
    int n_dims;
    int64_t shape[2];
    float std; /* 0 with one_fill: constant 1 (norm weights) */
    int ones;
    uint64_t offset; /* within its shard's data area */
    int shard;
} synth_tensor_t;

typedef struct {
    synth_tensor_t *t;
    int n, cap;
} synth_list_t;

static int synth__add(synth_list_t *l, const char *name, int64_t rows, int64_t cols, float std)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 256;
        synth_tensor_t *t = realloc(l->t, (size_t)cap * sizeof *t);
        if (!t)
            return -1;
        l->t = t;
        l->cap = cap;
    }
    synth_tensor_t *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->std = std;
    t->ones = std == 0.0f;
    return 0;
}

static int64_t synth__elems(const synth_tensor_t *t)
{
    return t->n_dims == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
}

/* The checkpoint's tensors in the order the Hugging Face writers use. */
static int synth__tensors(const synth_arch_t *a, synth_list_t *l)
{
    const int H = a->hidden, D = a->head_dim, L = a->layers;
    const float res = 1.0f / sqrtf(2.0f * (float)L);
    char p[32], n[96];
    int rc = synth__add(l, "model.embed_tokens.weight", a->vocab, H, 1.0f);
    for (int i = 0; i < L && rc == 0; i++) {
        snprintf(p, sizeof p, "model.layers.%d", i);
#define ADD(suffix, r, c, s)                                                                       \
    do {                                                                                           \
        snprintf(n, sizeof n, "%s.%s", p, suffix);                                                 \
        rc = rc ? rc : synth__add(l, n, r, c, s);                                                  \
    } while (0)
        ADD("input_layernorm.weight", H, 0, 0.0f);
        ADD("self_attn.q_proj.weight", (int64_t)a->heads * D, H, 1.0f / sqrtf((float)H));
        ADD("self_attn.k_proj.weight", (int64_t)a->kv_heads * D, H, 1.0f / sqrtf((float)H));
        ADD("self_attn.v_proj.weight", (int64_t)a->kv_heads * D, H, 1.0f / sqrtf((float)H));
        ADD("self_attn.o_proj.weight", H, (int64_t)a->heads * D,
            res / sqrtf((float)(a->heads * D)));
        if (a->qk_norm) {
            ADD("self_attn.q_norm.weight", D, 0, 0.0f);
            ADD("self_attn.k_norm.weight", D, 0, 0.0f);
        }
        ADD("post_attention_layernorm.weight", H, 0, 0.0f);
        if (a->experts == 0) {
            ADD("mlp.gate_proj.weight", a->inter, H, 1.0f / sqrtf((float)H));
            ADD("mlp.up_proj.weight", a->inter, H, 1.0f / sqrtf((float)H));
            ADD("mlp.down_proj.weight", H, a->inter, res / sqrtf((float)a->inter));
        } else {
            char e[48];
            ADD("mlp.gate.weight", a->experts, H, 1.0f / sqrtf((float)H));
            for (int x = 0; x < a->experts; x++) {
                snprintf(e, sizeof e, "mlp.experts.%d.gate_proj.weight", x);
                ADD(e, a->moe_inter, H, 1.0f / sqrtf((float)H));
                snprintf(e, sizeof e, "mlp.experts.%d.up_proj.weight", x);
                ADD(e, a->moe_inter, H, 1.0f / sqrtf((float)H));
                snprintf(e, sizeof e, "mlp.experts.%d.down_proj.weight", x);
                ADD(e, H, a->moe_inter, res / sqrtf((float)a->moe_inter));
            }
        }
#undef ADD
    }
    rc = rc ? rc : synth__add(l, "model.norm.weight", H, 0, 0.0f);
    rc = rc ? rc : synth__add(l, "lm_head.weight", a->vocab, H, 1.0f / sqrtf((float)H));
    return rc;
}

/* ==== weights ==== */

static uint64_t synth__splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t synth__name_seed(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (; *name; name++)
        h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
    return h;
}

/* Writes tensor t's bf16 values to f in blocks; *done is advanced for the progress line. */
static int synth__write_tensor(FILE *f, const synth_tensor_t *t, uint64_t seed, uint16_t *buf,
                               uint64_t *done, uint64_t total)
{
    uint64_t s = synth__name_seed(seed, t->name);
    const float a = t->std * sqrtf(3.0f); /* uniform [-a, a] has standard deviation std */
    int64_t left = synth__elems(t);
    while (left > 0) {
        size_t n = left < SYNTH_BLOCK_ELEMS ? (size_t)left : SYNTH_BLOCK_ELEMS;
        for (size_t i = 0; i < n; i += 2) {
            uint64_t r = synth__splitmix(&s);
            float u0 = (float)(uint32_t)r * (1.0f / 4294967296.0f);
            float u1 = (float)(uint32_t)(r >> 32) * (1.0f / 4294967296.0f);
            buf[i] = t->ones ? pd_f32_to_bf16(1.0f) : pd_f32_to_bf16((2.0f * u0 - 1.0f) * a);
            if (i + 1 < n)
                buf[i + 1] =
                    t->ones ? pd_f32_to_bf16(1.0f) : pd_f32_to_bf16((2.0f * u1 - 1.0f) * a);
        }
        if (fwrite(buf, 2, n, f) != n)
            return -1;
        left -= (int64_t)n;
        uint64_t before = *done >> 30;
        *done += 2 * (uint64_t)n;
        if ((*done >> 30) != before || *done == total)
            fprintf(stderr, "\rpdctl synth: %.1f / %.1f GiB", (double)*done / (1 << 30),
                    (double)total / (1 << 30));
    }
    return 0;
}

/* Writes shard k (tensors with t->shard == k, offsets already set). */
static int synth__write_shard(const char *path, const synth_list_t *l, int k, uint64_t seed,
                              uint16_t *buf, uint64_t *done, uint64_t total)
{
    json_t *hdr = json_object(), *meta = json_object();
    char *text = NULL, tmp[4224];
    int rc = -1;
    FILE *f = NULL;

    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(hdr, "__metadata__", meta);
    for (int i = 0; i < l->n; i++) {
        const synth_tensor_t *t = &l->t[i];
        if (t->shard != k)
            continue;
        json_t *o = json_object(), *shape = json_array(), *off = json_array();
        for (int d = 0; d < t->n_dims; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(off, json_integer((json_int_t)t->offset));
        json_array_append_new(off, json_integer((json_int_t)(t->offset + 2 * synth__elems(t))));
        json_object_set_new(o, "dtype", json_string("BF16"));
        json_object_set_new(o, "shape", shape);
        json_object_set_new(o, "data_offsets", off);
        json_object_set_new(hdr, t->name, o);
    }
    text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text)
        goto out;
    size_t len = strlen(text), pad = (8 - len % 8) % 8;
    uint64_t hlen = len + pad;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "wb"))) {
        fprintf(stderr, "pdctl synth: %s: %s\n", tmp, strerror(errno));
        goto out;
    }
    if (fwrite(&hlen, 8, 1, f) != 1 || fwrite(text, 1, len, f) != len ||
        fwrite("        ", 1, pad, f) != pad)
        goto io;
    for (int i = 0; i < l->n; i++)
        if (l->t[i].shard == k && synth__write_tensor(f, &l->t[i], seed, buf, done, total))
            goto io;
    if (fclose(f) != 0) {
        f = NULL;
        goto io;
    }
    f = NULL;
    if (rename(tmp, path) != 0)
        goto io;
    rc = 0;
    goto out;
io:
    fprintf(stderr, "\npdctl synth: writing %s: %s\n", path, strerror(errno));
    if (f)
        fclose(f);
    remove(tmp);
out:
    free(text);
    json_decref(hdr);
    return rc;
}

/* ==== config and tokenizer ==== */

static int synth__write_json(const char *dir, const char *file, json_t *j)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (rc != 0)
        fprintf(stderr, "pdctl synth: cannot write %s\n", path);
    json_decref(j);
    return rc;
}

static int synth__config(const char *dir, const synth_arch_t *a, const char *arch_name)
{
    json_t *c = json_object(), *rope = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", a->hf_class));
    json_object_set_new(c, "model_type", json_string(a->model_type));
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "bos_token_id", json_integer(0));
    json_object_set_new(c, "eos_token_id", json_integer(1));
    json_object_set_new(c, "dtype", json_string("bfloat16"));
    json_object_set_new(c, "head_dim", json_integer(a->head_dim));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(a->hidden));
    json_object_set_new(c, "intermediate_size", json_integer(a->inter));
    json_object_set_new(c, "max_position_embeddings", json_integer(a->max_pos));
    json_object_set_new(c, "num_attention_heads", json_integer(a->heads));
    json_object_set_new(c, "num_hidden_layers", json_integer(a->layers));
    json_object_set_new(c, "num_key_value_heads", json_integer(a->kv_heads));
    json_object_set_new(c, "rms_norm_eps", json_real(a->rms_eps));
    json_object_set_new(rope, "rope_theta", json_real(a->rope_theta));
    json_object_set_new(rope, "rope_type", json_string("default"));
    json_object_set_new(c, "rope_parameters", rope);
    json_object_set_new(c, "rope_theta", json_real(a->rope_theta));
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "vocab_size", json_integer(a->vocab));
    if (a->experts) {
        json_object_set_new(c, "decoder_sparse_step", json_integer(1));
        json_object_set_new(c, "mlp_only_layers", json_array());
        json_object_set_new(c, "moe_intermediate_size", json_integer(a->moe_inter));
        json_object_set_new(c, "norm_topk_prob", json_true());
        json_object_set_new(c, "num_experts", json_integer(a->experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(a->top_k));
    }
    json_object_set_new(
        c, "pdserve_synth",
        json_pack("{s:s,s:s}", "arch", arch_name, "note", "seeded random weights (pdctl synth)"));
    return synth__write_json(dir, "config.json", c);
}

/* Copies the fixtures' tokenizer.json, padding model.vocab up to vocab ids. */
static int synth__tokenizer(const char *dir, const char *from, int vocab)
{
    char path[4096];
    json_error_t err;
    snprintf(path, sizeof path, "%s/tokenizer.json", from);
    json_t *tok = json_load_file(path, 0, &err);
    if (!tok) {
        fprintf(stderr, "pdctl synth: %s:%d: %s\n", path, err.line, err.text);
        return -1;
    }
    json_t *v = json_object_get(json_object_get(tok, "model"), "vocab");
    if (!json_is_object(v)) {
        fprintf(stderr, "pdctl synth: %s: no model.vocab object\n", path);
        json_decref(tok);
        return -1;
    }
    int have = 0;
    const char *k;
    json_t *id;
    json_object_foreach(v, k, id)
    {
        if (json_integer_value(id) + 1 > have)
            have = (int)json_integer_value(id) + 1;
    }
    json_t *added = json_object_get(tok, "added_tokens");
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a)
    {
        int x = (int)json_integer_value(json_object_get(a, "id"));
        have = x + 1 > have ? x + 1 : have;
    }
    if (have > vocab) {
        fprintf(stderr, "pdctl synth: tokenizer has %d ids, more than the model's %d\n", have,
                vocab);
        json_decref(tok);
        return -1;
    }
    for (int x = have; x < vocab; x++) {
        char name[40];
        snprintf(name, sizeof name, "<|synth_pad_%d|>", x);
        json_object_set_new(v, name, json_integer(x));
    }
    int rc = synth__write_json(dir, "tokenizer.json", tok);
    for (const char *f = "tokenizer_config.json"; f && rc == 0;
         f = strcmp(f, "tokenizer_config.json") == 0 ? "generation_config.json" : NULL) {
        snprintf(path, sizeof path, "%s/%s", from, f);
        json_t *j = json_load_file(path, 0, &err);
        if (j)
            rc = synth__write_json(dir, f, j);
    }
    return rc;
}

/* ==== command ==== */

static int synth__usage(void)
{
    fprintf(stderr,
            "usage: pdctl synth --arch NAME --out DIR [--layers N] [--seed S] "
            "[--hidden H] [--experts E] [--context N] [--shard-mib M] [--tokenizer-from DIR] "
            "[--config-only]\n"
            "architectures:");
    for (size_t i = 0; i < sizeof synth_arches / sizeof synth_arches[0]; i++)
        fprintf(stderr, " %s%s", synth_arches[i].name, synth_arches[i].loads ? "" : " (not yet)");
    fprintf(stderr, "\n");
    return 2;
}

int pdctl_synth(int argc, char **argv)
{
    const char *arch = NULL, *out = NULL, *from = PDCTL_MODELS_DIR "/tiny-llama";
    long layers = 0, hidden = 0, experts = 0, context = 0, shard_mib = SYNTH_SHARD_MIB;
    int config_only = 0;
    unsigned long long seed = 0;
    synth_arch_t a;
    synth_list_t l = {0};
    int rc = 1;

    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (strcmp(o, "--config-only") == 0) {
            config_only = 1;
            continue;
        }
        if (!v)
            return synth__usage();
        i++;
        if (strcmp(o, "--arch") == 0)
            arch = v;
        else if (strcmp(o, "--out") == 0)
            out = v;
        else if (strcmp(o, "--tokenizer-from") == 0)
            from = v;
        else if (strcmp(o, "--seed") == 0)
            seed = strtoull(v, &end, 10);
        else if (strcmp(o, "--layers") == 0)
            layers = strtol(v, &end, 10);
        else if (strcmp(o, "--hidden") == 0)
            hidden = strtol(v, &end, 10);
        else if (strcmp(o, "--shard-mib") == 0)
            shard_mib = strtol(v, &end, 10);
        else if (strcmp(o, "--context") == 0)
            context = strtol(v, &end, 10);
        else if (strcmp(o, "--experts") == 0)
            experts = strtol(v, &end, 10);
        else
            return synth__usage();
        if (end && *end) {
            fprintf(stderr, "pdctl synth: %s: not a number: %s\n", o, v);
            return 2;
        }
    }
    if (!arch || !out)
        return synth__usage();
    const synth_arch_t *found = NULL;
    for (size_t i = 0; i < sizeof synth_arches / sizeof synth_arches[0]; i++)
        if (strcmp(synth_arches[i].name, arch) == 0)
            found = &synth_arches[i];
    if (!found) {
        fprintf(stderr, "pdctl synth: unknown architecture '%s'\n", arch);
        return synth__usage();
    }
    if (!found->loads) {
        fprintf(stderr,
                "pdctl synth: %s (%s): pdserve does not load this family yet, so there "
                "is no checkpoint layout to write\n",
                arch, found->hf_class);
        return 2;
    }
    a = *found;
    if (layers < 0 || layers > a.layers || hidden < 0 || experts < 0 || shard_mib < 1 ||
        (experts && (!a.experts || experts < a.top_k || experts > a.experts))) {
        fprintf(stderr,
                "pdctl synth: --layers 1..%d, --experts %d..%d (MoE only), --shard-mib >= 1\n",
                a.layers, a.top_k, a.experts);
        return 2;
    }
    if (context < 0 || context > (1 << 20)) {
        fprintf(stderr, "pdctl synth: --context 1..%d\n", 1 << 20);
        return 2;
    }
    if (context) /* e.g. 32768 for 32k-token prompts on a Llama-3 shape (published: 8192) */
        a.max_pos = (int)context;
    if (layers)
        a.layers = (int)layers;
    if (experts)
        a.experts = (int)experts;
    if (hidden) {
        /* shrink for tests: same head_dim, heads and MLP widths in proportion */
        if (hidden % a.head_dim || hidden > a.hidden) {
            fprintf(stderr, "pdctl synth: --hidden must be a multiple of head_dim %d, at most %d\n",
                    a.head_dim, a.hidden);
            return 2;
        }
        int heads = (int)(hidden / a.head_dim);
        int kv = (int)((int64_t)a.kv_heads * heads / a.heads);
        kv = kv < 1 ? 1 : kv;
        while (heads % kv)
            kv--;
        /* MLP widths in proportion, rounded up to 128 so INT4 (groups of 128 along K) loads */
        a.inter = (int)(((int64_t)a.inter * hidden / a.hidden + 127) / 128 * 128);
        a.moe_inter = (int)(((int64_t)a.moe_inter * hidden / a.hidden + 127) / 128 * 128);
        a.hidden = (int)hidden;
        a.heads = heads;
        a.kv_heads = kv;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "pdctl synth: %s: %s\n", out, strerror(errno));
        return 1;
    }
    if (config_only) {
        rc = synth__config(out, &a, arch) != 0 || synth__tokenizer(out, from, a.vocab) != 0;
        if (rc == 0)
            printf("%s\n", out);
        return rc;
    }
    if (synth__tensors(&a, &l) != 0) {
        fprintf(stderr, "pdctl synth: out of memory\n");
        goto out;
    }
    /* shards of at most SYNTH_SHARD_BYTES (a larger tensor gets one of its own) */
    uint64_t total = 0, in_shard = 0;
    int n_shards = 1;
    for (int i = 0; i < l.n; i++) {
        uint64_t b = 2 * (uint64_t)synth__elems(&l.t[i]);
        if (in_shard > 0 && in_shard + b > ((uint64_t)shard_mib << 20)) {
            n_shards++;
            in_shard = 0;
        }
        l.t[i].shard = n_shards - 1;
        l.t[i].offset = in_shard;
        in_shard += b;
        total += b;
    }
    fprintf(stderr,
            "pdctl synth: %s: %d layers, hidden %d, %d heads (%d kv), vocab %d%s: %d "
            "tensors, %.2f GiB in %d shard%s\n",
            arch, a.layers, a.hidden, a.heads, a.kv_heads, a.vocab, a.experts ? ", MoE" : "", l.n,
            (double)total / (1 << 30), n_shards, n_shards > 1 ? "s" : "");
    uint16_t *buf = malloc(SYNTH_BLOCK_ELEMS * sizeof *buf);
    json_t *map = json_object();
    uint64_t done = 0;
    if (!buf || !map) {
        free(buf);
        json_decref(map);
        goto out;
    }
    for (int k = 0; k < n_shards; k++) {
        char file[64], path[4200];
        if (n_shards == 1)
            snprintf(file, sizeof file, "model.safetensors");
        else
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", out, file);
        if (synth__write_shard(path, &l, k, seed, buf, &done, total) != 0) {
            free(buf);
            json_decref(map);
            goto out;
        }
        for (int i = 0; i < l.n; i++)
            if (l.t[i].shard == k)
                json_object_set_new(map, l.t[i].name, json_string(file));
    }
    fprintf(stderr, "\n");
    free(buf);
    if (n_shards > 1) {
        json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total,
                                "weight_map", map);
        if (synth__write_json(out, "model.safetensors.index.json", idx) != 0)
            goto out;
    } else {
        json_decref(map);
    }
    if (synth__config(out, &a, arch) != 0 || synth__tokenizer(out, from, a.vocab) != 0)
        goto out;
    printf("%s\n", out);
    rc = 0;
out:
    free(l.t);
    return rc;
}
