#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include "log.h"

#define TOK_MAX_STEPS 16 /* normalizer / pre-tokenizer steps after flattening Sequences */

/* The pattern ByteLevel uses when use_regex is true and the file gives none (GPT-2's, as the
 * tokenizers library hard-codes it in pre_tokenizers/byte_level.rs). */
static const char tok_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ==== hash maps ==== */

/* string -> int32; keys point into strings owned elsewhere in the tokenizer */
typedef struct {
    const char *key; /* NULL: empty slot */
    uint32_t klen;
    uint32_t hash;
    int32_t val;
} strmap_slot_t;

typedef struct {
    strmap_slot_t *slots;
    size_t cap; /* power of two */
    size_t n;
} strmap_t;

/* (left id, right id) -> (rank, merged id) */
typedef struct {
    uint64_t key;
    int32_t rank; /* -1: empty slot */
    int32_t id;
} mergemap_slot_t;

typedef struct {
    mergemap_slot_t *slots;
    size_t cap;
    size_t n;
} mergemap_t;

static uint32_t hash_bytes(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static bool strmap_grow(strmap_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    strmap_slot_t *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return false;
    for (size_t i = 0; i < m->cap; i++) {
        strmap_slot_t *o = &m->slots[i];
        if (!o->key)
            continue;
        size_t j = o->hash & (cap - 1);
        while (slots[j].key)
            j = (j + 1) & (cap - 1);
        slots[j] = *o;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return true;
}

static int32_t strmap_get(const strmap_t *m, const char *key, size_t klen)
{
    if (!m->cap)
        return -1;
    uint32_t h = hash_bytes(key, klen);
    for (size_t j = h & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        const strmap_slot_t *s = &m->slots[j];
        if (!s->key)
            return -1;
        if (s->hash == h && s->klen == klen && memcmp(s->key, key, klen) == 0)
            return s->val;
    }
}

/* Inserts or overwrites; key must outlive the map. Returns false on allocation failure. */
static bool strmap_put(strmap_t *m, const char *key, size_t klen, int32_t val)
{
    if ((m->n + 1) * 2 > m->cap && !strmap_grow(m))
        return false;
    uint32_t h = hash_bytes(key, klen);
    size_t j = h & (m->cap - 1);
    for (;; j = (j + 1) & (m->cap - 1)) {
        strmap_slot_t *s = &m->slots[j];
        if (!s->key)
            break;
        if (s->hash == h && s->klen == klen && memcmp(s->key, key, klen) == 0) {
            s->val = val;
            return true;
        }
    }
    m->slots[j] = (strmap_slot_t){.key = key, .klen = (uint32_t)klen, .hash = h, .val = val};
    m->n++;
    return true;
}

static bool mergemap_grow(mergemap_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    mergemap_slot_t *slots = malloc(cap * sizeof *slots);
    if (!slots)
        return false;
    for (size_t i = 0; i < cap; i++)
        slots[i].rank = -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].rank < 0)
            continue;
        size_t j = hash_u64(m->slots[i].key) & (cap - 1);
        while (slots[j].rank >= 0)
            j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return true;
}

static const mergemap_slot_t *mergemap_get(const mergemap_t *m, int32_t a, int32_t b)
{
    if (!m->cap)
        return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t j = hash_u64(key) & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        const mergemap_slot_t *s = &m->slots[j];
        if (s->rank < 0)
            return NULL;
        if (s->key == key)
            return s;
    }
}

/* Later duplicates overwrite earlier ones, as the tokenizers library's HashMap collect does. */
static bool mergemap_put(mergemap_t *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    if ((m->n + 1) * 2 > m->cap && !mergemap_grow(m))
        return false;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t j = hash_u64(key) & (m->cap - 1);
    for (; m->slots[j].rank >= 0; j = (j + 1) & (m->cap - 1)) {
        if (m->slots[j].key == key)
            break;
    }
    if (m->slots[j].rank < 0)
        m->n++;
    m->slots[j] = (mergemap_slot_t){.key = key, .rank = rank, .id = id};
    return true;
}

/* ==== growable byte buffer ==== */

typedef struct {
    char *p;
    size_t n, cap;
} buf_t;

static bool buf_reserve(buf_t *b, size_t extra)
{
    if (b->n + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return false;
    b->p = p;
    b->cap = cap;
    return true;
}

static bool buf_append(buf_t *b, const void *s, size_t n)
{
    if (!buf_reserve(b, n))
        return false;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

/* ==== utf-8 ==== */

/* Looks at the sequence starting at s[0] (n >= 1 bytes). Returns its length when it is a valid
 * character; otherwise returns 0 and sets *bad to the length of the maximal invalid subpart (at
 * least 1) and *truncated when that subpart is a valid prefix cut off by the end of the input. */
static size_t utf8_next(const uint8_t *s, size_t n, size_t *bad, bool *truncated)
{
    uint8_t b0 = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;

    *truncated = false;
    if (b0 < 0x80)
        return 1;
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        need = 1;
    } else if (b0 >= 0xe0 && b0 <= 0xef) {
        need = 2;
        if (b0 == 0xe0)
            lo = 0xa0;
        else if (b0 == 0xed)
            hi = 0x9f;
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
        need = 3;
        if (b0 == 0xf0)
            lo = 0x90;
        else if (b0 == 0xf4)
            hi = 0x8f;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) {
            *bad = i;
            *truncated = true;
            return 0;
        }
        if (s[i] < lo || s[i] > hi) {
            *bad = i;
            return 0;
        }
        lo = 0x80;
        hi = 0xbf;
    }
    return need + 1;
}

bool tokenizer_utf8_valid(const char *text, size_t len, size_t *bad_offset_p)
{
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0, bad;
    bool trunc;

    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = utf8_next(s + i, len - i, &bad, &trunc);
        if (!l) {
            if (bad_offset_p)
                *bad_offset_p = i;
            return false;
        }
        i += l;
    }
    return true;
}

/* Appends s converted lossily to out (each maximal invalid subpart becomes U+FFFD). With hold, an
 * incomplete sequence at the end is not converted; *used_p gets the bytes consumed. */
static bool utf8_lossy_append(buf_t *out, const char *text, size_t len, bool hold, size_t *used_p)
{
    static const char fffd[] = "\xef\xbf\xbd";
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0, run = 0, bad;
    bool trunc;

    *used_p = 0;
    if (!buf_reserve(out, len))
        return false;
    out->p[out->n] = 0;
    if (len == 0)
        return true;
    while (i < len) {
        size_t l = s[i] < 0x80 ? 1 : utf8_next(s + i, len - i, &bad, &trunc);
        if (l) {
            i += l;
            continue;
        }
        if (!buf_append(out, s + run, i - run))
            return false;
        if (trunc && hold) {
            run = i;
            break;
        }
        if (!buf_append(out, fffd, 3))
            return false;
        i += bad;
        run = i;
    }
    if (i >= len) {
        if (!buf_append(out, s + run, len - run))
            return false;
        run = len;
    }
    *used_p = run;
    return true;
}

static bool is_rust_whitespace(int32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

static bool is_word_char(int32_t c)
{
    if (c == '_')
        return true;
    utf8proc_category_t cat = utf8proc_category(c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

/* Decodes the (valid) character at s[i]; returns its code point and its length in *l. */
static int32_t utf8_decode_at(const char *s, size_t len, size_t i, size_t *l)
{
    utf8proc_int32_t c = 0;
    utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &c);
    *l = r > 0 ? (size_t)r : 1;
    return r > 0 ? c : -1;
}

/* Start offset of the character that ends at s[end - 1] (s is valid UTF-8). */
static size_t utf8_prev(const char *s, size_t end)
{
    size_t i = end - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xc0) == 0x80)
        i--;
    return i;
}

static size_t utf8_char_len(uint8_t b)
{
    return b < 0x80 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
}

/* ==== the tokenizer object ==== */

typedef enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD } norm_kind_t;
typedef enum { PRE_SPLIT, PRE_BYTELEVEL } pre_kind_t;
typedef enum {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_PREV,
    SPLIT_MERGED_NEXT,
    SPLIT_CONTIGUOUS
} split_behavior_t;

typedef struct {
    pre_kind_t kind;
    pcre2_code *re; /* Split pattern, or the GPT-2 pattern for ByteLevel use_regex; may be NULL */
    split_behavior_t behavior;
    bool invert;
    bool add_prefix_space;
} pre_step_t;

typedef struct {
    char *content; /* as in the file */
    size_t len;
    char *match; /* what is searched for: content, normalized when the token is */
    size_t match_len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} added_token_t;

/* Added tokens searched in one pass, bucketed by first byte. */
typedef struct {
    uint32_t *idx;      /* (n) indexes into tok->added, grouped by first byte of match */
    size_t n;
    uint32_t start[257]; /* bucket b is idx[start[b] .. start[b + 1]) */
} added_set_t;

struct tokenizer {
    char *name;

    /* model: BPE */
    char **vocab;        /* (vocab_cap) token string by model id, NULL where absent */
    uint32_t *vocab_len; /* (vocab_cap) */
    size_t vocab_cap;
    strmap_t vocab_map;
    mergemap_t merges;
    bool ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;
    int32_t byte_ids[256]; /* <0xXX> tokens for byte_fallback, -1 absent */

    /* added tokens */
    added_token_t *added;
    size_t n_added;
    strmap_t added_map;
    added_set_t set_raw;  /* normalized == false: matched before normalization */
    added_set_t set_norm; /* normalized == true: matched after */

    /* by id over both */
    size_t vocab_size;
    const char **id_token;   /* (vocab_size) */
    uint8_t *id_special;     /* (vocab_size) */
    char **id_bytes;         /* (vocab_size) decoder output per id, NULL where absent */
    uint32_t *id_bytes_len;  /* (vocab_size) */

    norm_kind_t norm[TOK_MAX_STEPS];
    size_t n_norm;
    pre_step_t pre[TOK_MAX_STEPS];
    size_t n_pre;

    int32_t prefix[8], suffix[8]; /* post-processor ids around the sequence */
    size_t n_prefix, n_suffix;

    bool dec_bytelevel; /* else tokens joined with " " (no decoder) */

    char byte_chr[256][4]; /* ByteLevel: byte -> UTF-8 of its stand-in character */
    uint8_t byte_chr_len[256];
    int16_t chr_byte[324]; /* stand-in code point -> byte, -1 none */
};

static void bytelevel_tables(tokenizer_t *tok)
{
    int n = 0;
    for (int c = 0; c < 324; c++)
        tok->chr_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        int c;
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
            c = b;
        else
            c = 256 + n++;
        tok->chr_byte[c] = (int16_t)b;
        utf8proc_ssize_t l = utf8proc_encode_char(c, (utf8proc_uint8_t *)tok->byte_chr[b]);
        tok->byte_chr_len[b] = (uint8_t)l;
    }
}

/* ==== loading ==== */

static bool jbool(const json_t *o, const char *key, bool def)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static const char *jstr(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

static char *memdup0(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static pd_status_t regex_compile(const tokenizer_t *tok, const char *pat, size_t len, bool literal,
                                 pcre2_code **re_p)
{
    int err;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        pd_log_error("tokenizer %s: split pattern does not compile at offset %zu: %s", tok->name,
                     (size_t)off, (char *)msg);
        return PD_ERR_FORMAT;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter runs it if this fails */
    *re_p = re;
    return PD_OK;
}

static pd_status_t load_normalizer(tokenizer_t *tok, const json_t *n)
{
    if (!n || json_is_null(n))
        return PD_OK;
    const char *type = jstr(n, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers");
        size_t i;
        json_t *v;
        if (!json_is_array(list)) {
            pd_log_error("tokenizer %s: normalizer sequence without a normalizers list", tok->name);
            return PD_ERR_FORMAT;
        }
        json_array_foreach(list, i, v)
        {
            pd_status_t st = load_normalizer(tok, v);
            if (st)
                return st;
        }
        return PD_OK;
    }
    static const struct {
        const char *name;
        norm_kind_t kind;
    } kinds[] = {{"NFC", NORM_NFC}, {"NFD", NORM_NFD}, {"NFKC", NORM_NFKC}, {"NFKD", NORM_NFKD}};
    for (size_t k = 0; type && k < sizeof kinds / sizeof kinds[0]; k++) {
        if (strcmp(type, kinds[k].name) != 0)
            continue;
        if (tok->n_norm == TOK_MAX_STEPS) {
            pd_log_error("tokenizer %s: more than %d normalizers", tok->name, TOK_MAX_STEPS);
            return PD_ERR_UNSUPPORTED;
        }
        tok->norm[tok->n_norm++] = kinds[k].kind;
        return PD_OK;
    }
    pd_log_error("tokenizer %s: unsupported normalizer type '%s'", tok->name,
                 type ? type : "(none)");
    return PD_ERR_UNSUPPORTED;
}

static pd_status_t load_pre_tokenizer(tokenizer_t *tok, const json_t *p)
{
    if (!p || json_is_null(p))
        return PD_OK;
    const char *type = jstr(p, "type");
    pd_status_t st;

    if (type && strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *v;
        if (!json_is_array(list)) {
            pd_log_error("tokenizer %s: pre_tokenizer sequence without a pretokenizers list",
                         tok->name);
            return PD_ERR_FORMAT;
        }
        json_array_foreach(list, i, v)
        {
            if ((st = load_pre_tokenizer(tok, v)))
                return st;
        }
        return PD_OK;
    }
    if (!type || (strcmp(type, "Split") != 0 && strcmp(type, "ByteLevel") != 0)) {
        pd_log_error("tokenizer %s: unsupported pre_tokenizer type '%s'", tok->name,
                     type ? type : "(none)");
        return PD_ERR_UNSUPPORTED;
    }
    if (tok->n_pre == TOK_MAX_STEPS) {
        pd_log_error("tokenizer %s: more than %d pre_tokenizers", tok->name, TOK_MAX_STEPS);
        return PD_ERR_UNSUPPORTED;
    }
    pre_step_t *s = &tok->pre[tok->n_pre];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "ByteLevel") == 0) {
        s->kind = PRE_BYTELEVEL;
        s->add_prefix_space = jbool(p, "add_prefix_space", true);
        s->behavior = SPLIT_ISOLATED;
        if (jbool(p, "use_regex", true) &&
            (st = regex_compile(tok, tok_gpt2_pattern, strlen(tok_gpt2_pattern), false, &s->re)))
            return st;
        tok->n_pre++;
        return PD_OK;
    }

    static const struct {
        const char *name;
        split_behavior_t b;
    } behaviors[] = {{"Removed", SPLIT_REMOVED},
                     {"Isolated", SPLIT_ISOLATED},
                     {"MergedWithPrevious", SPLIT_MERGED_PREV},
                     {"MergedWithNext", SPLIT_MERGED_NEXT},
                     {"Contiguous", SPLIT_CONTIGUOUS}};
    const char *beh = jstr(p, "behavior");
    size_t k;
    for (k = 0; beh && k < sizeof behaviors / sizeof behaviors[0]; k++) {
        if (strcmp(beh, behaviors[k].name) == 0)
            break;
    }
    if (!beh || k == sizeof behaviors / sizeof behaviors[0]) {
        pd_log_error("tokenizer %s: unsupported split behavior '%s'", tok->name,
                     beh ? beh : "(none)");
        return PD_ERR_UNSUPPORTED;
    }
    s->kind = PRE_SPLIT;
    s->behavior = behaviors[k].b;
    s->invert = jbool(p, "invert", false);
    json_t *pat = json_object_get(p, "pattern");
    json_t *rx = json_object_get(pat, "Regex");
    json_t *lit = json_object_get(pat, "String");
    if (json_is_string(rx))
        st = regex_compile(tok, json_string_value(rx), json_string_length(rx), false, &s->re);
    else if (json_is_string(lit))
        st = regex_compile(tok, json_string_value(lit), json_string_length(lit), true, &s->re);
    else {
        pd_log_error("tokenizer %s: split pre_tokenizer without a Regex or String pattern",
                     tok->name);
        st = PD_ERR_FORMAT;
    }
    if (st)
        return st;
    tok->n_pre++;
    return PD_OK;
}

static pd_status_t load_vocab(tokenizer_t *tok, const json_t *vocab)
{
    const char *key;
    size_t klen;
    json_t *v;
    json_int_t max = -1;

    json_object_keylen_foreach((json_t *)vocab, key, klen, v)
    {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= INT32_MAX / 2) {
            pd_log_error("tokenizer %s: vocab entry '%s' has no valid id", tok->name, key);
            return PD_ERR_FORMAT;
        }
        if (id > max)
            max = id;
    }
    tok->vocab_cap = (size_t)(max + 1);
    tok->vocab = calloc(tok->vocab_cap + 1, sizeof *tok->vocab);
    tok->vocab_len = calloc(tok->vocab_cap + 1, sizeof *tok->vocab_len);
    if (!tok->vocab || !tok->vocab_len)
        goto err_nomem;
    json_object_keylen_foreach((json_t *)vocab, key, klen, v)
    {
        size_t id = (size_t)json_integer_value(v);
        if (tok->vocab[id]) /* two tokens with one id: the first keeps the id's string */
            continue;
        if (!(tok->vocab[id] = memdup0(key, klen)))
            goto err_nomem;
        tok->vocab_len[id] = (uint32_t)klen;
    }
    json_object_keylen_foreach((json_t *)vocab, key, klen, v)
    {
        size_t id = (size_t)json_integer_value(v);
        const char *k = tok->vocab_len[id] == klen && memcmp(tok->vocab[id], key, klen) == 0
                            ? tok->vocab[id]
                            : NULL;
        if (!k)
            continue; /* an alias: not findable by string; such files do not occur in practice */
        if (!strmap_put(&tok->vocab_map, k, klen, (int32_t)id))
            goto err_nomem;
    }
    return PD_OK;
err_nomem:
    pd_log_error("tokenizer %s: out of memory loading the vocabulary", tok->name);
    return PD_ERR_NOMEM;
}

static pd_status_t load_merges(tokenizer_t *tok, const json_t *merges)
{
    size_t i;
    json_t *m;
    buf_t joined = {0};
    pd_status_t st = PD_OK;

    json_array_foreach(merges, i, m)
    {
        const char *a, *b;
        size_t alen, blen;
        if (json_is_string(m)) { /* "a b" */
            a = json_string_value(m);
            const char *sp = memchr(a, ' ', json_string_length(m));
            if (!sp) {
                pd_log_error("tokenizer %s: merge %zu '%s' has no space", tok->name, i, a);
                st = PD_ERR_FORMAT;
                goto out;
            }
            alen = (size_t)(sp - a);
            b = sp + 1;
            blen = json_string_length(m) - alen - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            alen = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            blen = json_string_length(json_array_get(m, 1));
        } else {
            pd_log_error("tokenizer %s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]",
                         tok->name, i);
            st = PD_ERR_FORMAT;
            goto out;
        }
        int32_t ia = strmap_get(&tok->vocab_map, a, alen);
        int32_t ib = strmap_get(&tok->vocab_map, b, blen);
        joined.n = 0;
        if (!buf_append(&joined, a, alen) || !buf_append(&joined, b, blen)) {
            pd_log_error("tokenizer %s: out of memory loading merges", tok->name);
            st = PD_ERR_NOMEM;
            goto out;
        }
        int32_t ij = strmap_get(&tok->vocab_map, joined.p, joined.n);
        if (ia < 0 || ib < 0 || ij < 0) {
            pd_log_error("tokenizer %s: merge %zu '%.*s' + '%.*s' uses a token not in the vocab",
                         tok->name, i, (int)alen, a, (int)blen, b);
            st = PD_ERR_FORMAT;
            goto out;
        }
        if (!mergemap_put(&tok->merges, ia, ib, (int32_t)i, ij)) {
            pd_log_error("tokenizer %s: out of memory loading merges", tok->name);
            st = PD_ERR_NOMEM;
            goto out;
        }
    }
out:
    free(joined.p);
    return st;
}

static pd_status_t load_model(tokenizer_t *tok, const json_t *model)
{
    const char *type = jstr(model, "type");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    pd_status_t st;

    if (type && strcmp(type, "BPE") != 0) {
        pd_log_error("tokenizer %s: unsupported model type '%s'", tok->name, type);
        return PD_ERR_UNSUPPORTED;
    }
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        pd_log_error("tokenizer %s: model without a vocab object and a merges list", tok->name);
        return PD_ERR_FORMAT;
    }
    const char *cont = jstr(model, "continuing_subword_prefix");
    const char *eow = jstr(model, "end_of_word_suffix");
    if ((cont && *cont) || (eow && *eow)) {
        pd_log_error("tokenizer %s: bpe continuing_subword_prefix/end_of_word_suffix unsupported",
                     tok->name);
        return PD_ERR_UNSUPPORTED;
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0.0) {
        pd_log_error("tokenizer %s: bpe dropout unsupported", tok->name);
        return PD_ERR_UNSUPPORTED;
    }
    tok->ignore_merges = jbool(model, "ignore_merges", false);
    tok->byte_fallback = jbool(model, "byte_fallback", false);
    tok->fuse_unk = jbool(model, "fuse_unk", false);
    if ((st = load_vocab(tok, vocab)) || (st = load_merges(tok, merges)))
        return st;
    tok->unk_id = -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) {
        tok->unk_id = strmap_get(&tok->vocab_map, json_string_value(unk), json_string_length(unk));
        if (tok->unk_id < 0) {
            pd_log_error("tokenizer %s: unk_token '%s' not in the vocab", tok->name,
                         json_string_value(unk));
            return PD_ERR_FORMAT;
        }
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_ids[b] = strmap_get(&tok->vocab_map, name, 6);
    }
    return PD_OK;
}

/* Normalizes s per tok->norm into a malloc'd *out_p (NULL when nothing to do). */
static pd_status_t normalize(const tokenizer_t *tok, const char *s, size_t len, char **out_p,
                             size_t *out_len_p)
{
    char *cur = NULL;
    size_t cur_len = len;

    for (size_t k = 0; k < tok->n_norm; k++) {
        utf8proc_option_t opts = UTF8PROC_STABLE;
        switch (tok->norm[k]) {
        case NORM_NFC:
            opts |= UTF8PROC_COMPOSE;
            break;
        case NORM_NFD:
            opts |= UTF8PROC_DECOMPOSE;
            break;
        case NORM_NFKC:
            opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
            break;
        case NORM_NFKD:
            opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
            break;
        }
        utf8proc_uint8_t *out = NULL;
        const char *in = cur ? cur : s;
        utf8proc_ssize_t r = cur_len ? utf8proc_map((const utf8proc_uint8_t *)in,
                                                     (utf8proc_ssize_t)cur_len, &out, opts)
                                     : 0;
        if (r < 0) {
            pd_log_error("tokenizer %s: normalization failed: %s", tok->name,
                         utf8proc_errmsg(r));
            free(cur);
            return r == UTF8PROC_ERROR_NOMEM ? PD_ERR_NOMEM : PD_ERR_INVALID;
        }
        if (!out && !(out = malloc(1))) {
            free(cur);
            return PD_ERR_NOMEM;
        }
        free(cur);
        cur = (char *)out;
        cur_len = (size_t)r;
    }
    *out_p = cur;
    *out_len_p = cur_len;
    return PD_OK;
}

static int added_cmp_len_desc(const void *a, const void *b, void *ctx)
{
    const added_token_t *t = ctx;
    size_t la = t[*(const uint32_t *)a].match_len, lb = t[*(const uint32_t *)b].match_len;
    return la < lb ? 1 : la > lb ? -1 : 0;
}

static pd_status_t added_set_build(tokenizer_t *tok, added_set_t *set, bool normalized)
{
    size_t counts[256] = {0};
    for (size_t i = 0; i < tok->n_added; i++) {
        added_token_t *t = &tok->added[i];
        if (t->normalized == normalized && t->match_len)
            counts[(uint8_t)t->match[0]]++, set->n++;
    }
    set->idx = malloc((set->n + 1) * sizeof *set->idx);
    if (!set->idx)
        return PD_ERR_NOMEM;
    set->start[0] = 0;
    for (int b = 0; b < 256; b++)
        set->start[b + 1] = set->start[b] + (uint32_t)counts[b];
    uint32_t fill[256];
    memcpy(fill, set->start, sizeof fill);
    for (size_t i = 0; i < tok->n_added; i++) {
        added_token_t *t = &tok->added[i];
        if (t->normalized == normalized && t->match_len)
            set->idx[fill[(uint8_t)t->match[0]]++] = (uint32_t)i;
    }
    /* longest first within a bucket, so the first hit at a position is the longest */
    for (int b = 0; b < 256; b++)
        qsort_r(set->idx + set->start[b], set->start[b + 1] - set->start[b], sizeof(uint32_t),
                added_cmp_len_desc, tok->added);
    return PD_OK;
}

static pd_status_t load_added(tokenizer_t *tok, const json_t *list)
{
    size_t i;
    json_t *a;
    pd_status_t st;

    if (!list || json_is_null(list))
        return PD_OK;
    if (!json_is_array(list)) {
        pd_log_error("tokenizer %s: added_tokens is not a list", tok->name);
        return PD_ERR_FORMAT;
    }
    tok->added = calloc(json_array_size(list) + 1, sizeof *tok->added);
    if (!tok->added)
        return PD_ERR_NOMEM;
    json_array_foreach(list, i, a)
    {
        json_t *content = json_object_get(a, "content");
        json_t *id = json_object_get(a, "id");
        if (!json_is_string(content) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX / 2) {
            pd_log_error("tokenizer %s: added token %zu without content or a valid id", tok->name,
                         i);
            return PD_ERR_FORMAT;
        }
        added_token_t *t = &tok->added[tok->n_added++];
        t->len = json_string_length(content);
        if (!(t->content = memdup0(json_string_value(content), t->len)))
            return PD_ERR_NOMEM;
        t->id = (int32_t)json_integer_value(id);
        t->special = jbool(a, "special", false);
        t->lstrip = jbool(a, "lstrip", false);
        t->rstrip = jbool(a, "rstrip", false);
        t->single_word = jbool(a, "single_word", false);
        t->normalized = jbool(a, "normalized", !t->special);
        if (t->normalized && tok->n_norm) {
            if ((st = normalize(tok, t->content, t->len, &t->match, &t->match_len)))
                return st;
        } else {
            if (!(t->match = memdup0(t->content, t->len)))
                return PD_ERR_NOMEM;
            t->match_len = t->len;
        }
        if (!strmap_put(&tok->added_map, t->content, t->len, t->id))
            return PD_ERR_NOMEM;
    }
    if ((st = added_set_build(tok, &tok->set_raw, false)) ||
        (st = added_set_build(tok, &tok->set_norm, true)))
        return st;
    return PD_OK;
}

static pd_status_t post_special_ids(tokenizer_t *tok, const json_t *specials, const char *name,
                                    int32_t *ids, size_t *n)
{
    json_t *ent = json_object_get(specials, name);
    json_t *list = json_object_get(ent, "ids");
    size_t i;
    json_t *v;
    if (!json_is_array(list)) {
        pd_log_error("tokenizer %s: template special token '%s' has no ids", tok->name, name);
        return PD_ERR_FORMAT;
    }
    json_array_foreach(list, i, v)
    {
        if (*n == 8 || !json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= INT32_MAX / 2) {
            pd_log_error("tokenizer %s: template special token '%s' has bad or too many ids",
                         tok->name, name);
            return PD_ERR_FORMAT;
        }
        ids[(*n)++] = (int32_t)json_integer_value(v);
    }
    return PD_OK;
}

static pd_status_t post_wrap(tokenizer_t *tok, const int32_t *pre, size_t npre, const int32_t *suf,
                             size_t nsuf)
{
    if (tok->n_prefix + npre > 8 || tok->n_suffix + nsuf > 8) {
        pd_log_error("tokenizer %s: post_processor adds too many tokens", tok->name);
        return PD_ERR_UNSUPPORTED;
    }
    memmove(tok->prefix + npre, tok->prefix, tok->n_prefix * sizeof(int32_t));
    memcpy(tok->prefix, pre, npre * sizeof(int32_t));
    tok->n_prefix += npre;
    memcpy(tok->suffix + tok->n_suffix, suf, nsuf * sizeof(int32_t));
    tok->n_suffix += nsuf;
    return PD_OK;
}

static pd_status_t load_post(tokenizer_t *tok, const json_t *p)
{
    if (!p || json_is_null(p))
        return PD_OK;
    const char *type = jstr(p, "type");
    size_t i;
    json_t *v;
    pd_status_t st;

    if (type && strcmp(type, "ByteLevel") == 0)
        return PD_OK;
    if (type && strcmp(type, "Sequence") == 0) {
        json_array_foreach(json_object_get(p, "processors"), i, v)
        {
            if ((st = load_post(tok, v)))
                return st;
        }
        return PD_OK;
    }
    if (type && (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0)) {
        json_t *cls = json_array_get(json_object_get(p, "cls"), 1);
        json_t *sep = json_array_get(json_object_get(p, "sep"), 1);
        if (!json_is_integer(cls) || !json_is_integer(sep)) {
            pd_log_error("tokenizer %s: %s without cls/sep ids", tok->name, type);
            return PD_ERR_FORMAT;
        }
        int32_t c = (int32_t)json_integer_value(cls), s = (int32_t)json_integer_value(sep);
        return post_wrap(tok, &c, 1, &s, 1);
    }
    if (type && strcmp(type, "TemplateProcessing") == 0) {
        int32_t pre[8], suf[8];
        size_t npre = 0, nsuf = 0;
        bool seen_a = false;
        json_t *specials = json_object_get(p, "special_tokens");
        json_array_foreach(json_object_get(p, "single"), i, v)
        {
            json_t *sp = json_object_get(v, "SpecialToken");
            json_t *seq = json_object_get(v, "Sequence");
            if (sp && json_is_string(json_object_get(sp, "id"))) {
                if ((st = post_special_ids(tok, specials, jstr(sp, "id"), seen_a ? suf : pre,
                                           seen_a ? &nsuf : &npre)))
                    return st;
            } else if (seq && !seen_a && jstr(seq, "id") && strcmp(jstr(seq, "id"), "A") == 0) {
                seen_a = true;
            } else {
                pd_log_error("tokenizer %s: template item %zu of single is not understood",
                             tok->name, i);
                return PD_ERR_FORMAT;
            }
        }
        if (!seen_a) {
            pd_log_error("tokenizer %s: template single has no sequence A", tok->name);
            return PD_ERR_FORMAT;
        }
        return post_wrap(tok, pre, npre, suf, nsuf);
    }
    pd_log_error("tokenizer %s: unsupported post_processor type '%s'", tok->name,
                 type ? type : "(none)");
    return PD_ERR_UNSUPPORTED;
}

static pd_status_t load_decoder(tokenizer_t *tok, const json_t *d)
{
    if (!d || json_is_null(d))
        return PD_OK;
    const char *type = jstr(d, "type");
    if (type && strcmp(type, "ByteLevel") == 0) {
        tok->dec_bytelevel = true;
        return PD_OK;
    }
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(d, "decoders"), i, v)
        {
            pd_status_t st = load_decoder(tok, v);
            if (st)
                return st;
        }
        return PD_OK;
    }
    pd_log_error("tokenizer %s: unsupported decoder type '%s'", tok->name, type ? type : "(none)");
    return PD_ERR_UNSUPPORTED;
}

/* The decoder's bytes for token t: ByteLevel maps each stand-in character back to its byte; a token
 * with any other character (or no ByteLevel decoder) gives its own UTF-8. */
static char *token_bytes(const tokenizer_t *tok, const char *t, size_t len, uint32_t *n_p)
{
    char *p = malloc(len + 1);
    size_t n = 0;
    bool mapped = tok->dec_bytelevel;

    if (!p)
        return NULL;
    for (size_t j = 0; mapped && j < len;) {
        size_t l;
        int32_t c = utf8_decode_at(t, len, j, &l);
        if (c < 0 || c >= 324 || tok->chr_byte[c] < 0)
            mapped = false;
        else
            p[n++] = (char)tok->chr_byte[c];
        j += l;
    }
    if (!mapped) {
        memcpy(p, t, len);
        n = len;
    }
    p[n] = 0;
    *n_p = (uint32_t)n;
    return p;
}

/* Per id: token string, special flag and decoder output bytes. */
static pd_status_t build_id_tables(tokenizer_t *tok)
{
    size_t n = tok->vocab_cap;
    for (size_t i = 0; i < tok->n_added; i++)
        if ((size_t)tok->added[i].id + 1 > n)
            n = (size_t)tok->added[i].id + 1;
    tok->vocab_size = n;
    tok->id_token = calloc(n + 1, sizeof *tok->id_token);
    tok->id_special = calloc(n + 1, 1);
    tok->id_bytes = calloc(n + 1, sizeof *tok->id_bytes);
    tok->id_bytes_len = calloc(n + 1, sizeof *tok->id_bytes_len);
    if (!tok->id_token || !tok->id_special || !tok->id_bytes || !tok->id_bytes_len)
        return PD_ERR_NOMEM;
    for (size_t i = 0; i < tok->vocab_cap; i++) {
        if (!tok->vocab[i])
            continue;
        tok->id_token[i] = tok->vocab[i];
        tok->id_bytes[i] = token_bytes(tok, tok->vocab[i], tok->vocab_len[i], &tok->id_bytes_len[i]);
        if (!tok->id_bytes[i])
            return PD_ERR_NOMEM;
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        const added_token_t *t = &tok->added[i];
        tok->id_token[t->id] = t->content;
        tok->id_special[t->id] = t->special;
        free(tok->id_bytes[t->id]);
        tok->id_bytes[t->id] = token_bytes(tok, t->content, t->len, &tok->id_bytes_len[t->id]);
        if (!tok->id_bytes[t->id])
            return PD_ERR_NOMEM;
    }
    return PD_OK;
}

pd_status_t tokenizer_load_buffer(const char *json, size_t len, const char *name,
                                  tokenizer_t **tok_p)
{
    json_error_t jerr;
    pd_status_t st;
    tokenizer_t *tok;
    json_t *root;

    if (!name)
        name = "(buffer)";
    root = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
    if (!root) {
        pd_log_error("tokenizer %s: json error at line %d column %d: %s", name, jerr.line,
                     jerr.column, jerr.text);
        return PD_ERR_FORMAT;
    }
    if (!json_is_object(root)) {
        pd_log_error("tokenizer %s: top level is not an object", name);
        st = PD_ERR_FORMAT;
        goto err_free_root;
    }
    tok = calloc(1, sizeof *tok);
    if (!tok || !(tok->name = strdup(name))) {
        pd_log_error("tokenizer %s: out of memory", name);
        free(tok);
        st = PD_ERR_NOMEM;
        goto err_free_root;
    }
    bytelevel_tables(tok);
    if ((st = load_normalizer(tok, json_object_get(root, "normalizer"))) ||
        (st = load_pre_tokenizer(tok, json_object_get(root, "pre_tokenizer"))) ||
        (st = load_model(tok, json_object_get(root, "model"))) ||
        (st = load_added(tok, json_object_get(root, "added_tokens"))) ||
        (st = load_post(tok, json_object_get(root, "post_processor"))) ||
        (st = load_decoder(tok, json_object_get(root, "decoder"))) ||
        (st = build_id_tables(tok)))
        goto err_destroy;
    for (size_t i = 0; i < tok->n_prefix + tok->n_suffix; i++) {
        int32_t id = i < tok->n_prefix ? tok->prefix[i] : tok->suffix[i - tok->n_prefix];
        if ((size_t)id >= tok->vocab_size || !tok->id_token[id]) {
            pd_log_error("tokenizer %s: post_processor id %d is not a token", name, (int)id);
            st = PD_ERR_FORMAT;
            goto err_destroy;
        }
    }
    json_decref(root);
    *tok_p = tok;
    return PD_OK;

err_destroy:
    if (st == PD_ERR_NOMEM)
        pd_log_error("tokenizer %s: out of memory", name);
    tokenizer_destroy(tok);
err_free_root:
    json_decref(root);
    return st;
}

pd_status_t tokenizer_load(const char *path, tokenizer_t **tok_p)
{
    FILE *f = fopen(path, "rb");
    char *data;
    long size;
    pd_status_t st;

    if (!f) {
        pd_log_error("tokenizer %s: cannot open: %s", path, strerror(errno));
        return PD_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        pd_log_error("tokenizer %s: cannot seek: %s", path, strerror(errno));
        st = PD_ERR_IO;
        goto err_close;
    }
    if (!(data = malloc((size_t)size + 1))) {
        pd_log_error("tokenizer %s: out of memory reading %ld bytes", path, size);
        st = PD_ERR_NOMEM;
        goto err_close;
    }
    if (fread(data, 1, (size_t)size, f) != (size_t)size) {
        pd_log_error("tokenizer %s: short read", path);
        st = PD_ERR_IO;
        goto err_free_data;
    }
    st = tokenizer_load_buffer(data, (size_t)size, path, tok_p);
err_free_data:
    free(data);
err_close:
    fclose(f);
    return st;
}

/* ==== tiktoken files (Kimi K2) ==== */

/* TikTokenTokenizer.pat_str of Kimi K2's tokenization_kimi.py in PCRE2 syntax: the Rust regex
 * class intersections [X&&[^\p{Han}]] become (?:(?!\p{Han})[X]); the alternatives are otherwise
 * as published (Han runs first, then o200k-style words, numbers, punctuation, whitespace). */
static const char tok_kimi_pattern[] =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])*"
    "(?:(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])+"
    "(?:(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

/* tokenization_kimi.py: num_reserved_special_tokens (256) + 2 ids after the base vocabulary */
#define TOK_TIKTOKEN_SPECIALS 258

static int b64_val(uint8_t c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard padded base64 of s[0..n) (as Python's base64.b64decode takes it) into out (at least
 * n * 3 / 4 + 3 bytes); returns the byte count, -1 when s is not base64. */
static long b64_decode(const char *s, size_t n, uint8_t *out)
{
    uint32_t acc = 0;
    int bits = 0;
    long o = 0;
    if (n % 4 != 0)
        return -1;
    for (int pad = 0; pad < 2 && n && s[n - 1] == '='; pad++)
        n--;
    for (size_t i = 0; i < n; i++) {
        int v = b64_val((uint8_t)s[i]);
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    return o;
}

/* The byte-level spelling of bytes b[0..n) (the alphabet the BPE tables are keyed in). */
static char *tt_spell(const tokenizer_t *tok, const uint8_t *b, size_t n, uint32_t *len_p)
{
    char *p = malloc(n * 2 + 1);
    size_t k = 0;
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        memcpy(p + k, tok->byte_chr[b[i]], tok->byte_chr_len[b[i]]);
        k += tok->byte_chr_len[b[i]];
    }
    p[k] = 0;
    *len_p = (uint32_t)k;
    return p;
}

/* Vocabulary and merges from the tiktoken file: token = its rank; every split of a token into two
 * tokens is a merge of the token's rank, so the BPE loop merges the pair whose concatenation has
 * the lowest rank, leftmost first: tiktoken's byte_pair_merge. ignore_merges: a piece that is a
 * token is that token (tiktoken's encoder lookup before merging). */
static pd_status_t tt_load_ranks(tokenizer_t *tok, const char *text, size_t len)
{
    size_t n_lines = 0;
    long max_rank = -1;
    uint8_t **raw = NULL;
    uint32_t *raw_len = NULL;
    uint8_t *dec = NULL;
    pd_status_t st = PD_ERR_NOMEM;

    for (size_t i = 0; i < len; i++)
        n_lines += text[i] == '\n';
    n_lines++;
    for (size_t i = 0, line = 1; i < len; line++) { /* pass 1: ranks */
        const char *e = memchr(text + i, '\n', len - i), *l = text + i;
        size_t ll = e ? (size_t)(e - l) : len - i;
        i += ll + 1;
        while (ll && (l[ll - 1] == '\r' || l[ll - 1] == ' '))
            ll--;
        if (!ll)
            continue;
        const char *sp = memchr(l, ' ', ll);
        char *end;
        long r = sp ? strtol(sp + 1, &end, 10) : -1;
        if (!sp || r < 0 || r >= INT32_MAX / 4 || end != l + ll) {
            pd_log_error("tokenizer %s: line %zu is not \"<base64 token> <rank>\"", tok->name,
                         line);
            return PD_ERR_FORMAT;
        }
        max_rank = r > max_rank ? r : max_rank;
    }
    if (max_rank < 255) {
        pd_log_error("tokenizer %s: fewer than 256 ranks (every byte must be a token)", tok->name);
        return PD_ERR_FORMAT;
    }
    tok->vocab_cap = (size_t)max_rank + 1;
    tok->vocab = calloc(tok->vocab_cap + 1, sizeof *tok->vocab);
    tok->vocab_len = calloc(tok->vocab_cap + 1, sizeof *tok->vocab_len);
    raw = calloc(tok->vocab_cap + 1, sizeof *raw);
    raw_len = calloc(tok->vocab_cap + 1, sizeof *raw_len);
    if (!tok->vocab || !tok->vocab_len || !raw || !raw_len)
        goto out;
    for (size_t i = 0, line = 1; i < len; line++) { /* pass 2: tokens */
        const char *e = memchr(text + i, '\n', len - i), *l = text + i;
        size_t ll = e ? (size_t)(e - l) : len - i;
        i += ll + 1;
        while (ll && (l[ll - 1] == '\r' || l[ll - 1] == ' '))
            ll--;
        if (!ll)
            continue;
        const char *sp = memchr(l, ' ', ll);
        size_t r = (size_t)strtol(sp + 1, NULL, 10), bl = (size_t)(sp - l);
        if (!(dec = malloc(bl * 3 / 4 + 4)))
            goto out;
        long nb = b64_decode(l, bl, dec);
        if (nb <= 0 || raw[r]) {
            pd_log_error("tokenizer %s: line %zu: %s", tok->name, line,
                         nb <= 0 ? "token is not base64 (or empty)" : "rank given twice");
            st = PD_ERR_FORMAT;
            goto out;
        }
        raw[r] = dec;
        raw_len[r] = (uint32_t)nb;
        dec = NULL;
        if (!(tok->vocab[r] = tt_spell(tok, raw[r], (size_t)nb, &tok->vocab_len[r])))
            goto out;
        if (strmap_get(&tok->vocab_map, tok->vocab[r], tok->vocab_len[r]) >= 0) {
            pd_log_error("tokenizer %s: line %zu: token given twice", tok->name, line);
            st = PD_ERR_FORMAT;
            goto out;
        }
        if (!strmap_put(&tok->vocab_map, tok->vocab[r], tok->vocab_len[r], (int32_t)r))
            goto out;
    }
    for (int b = 0; b < 256; b++)
        if (strmap_get(&tok->vocab_map, tok->byte_chr[b], tok->byte_chr_len[b]) < 0) {
            pd_log_error("tokenizer %s: byte 0x%02x is not a token", tok->name, b);
            st = PD_ERR_FORMAT;
            goto out;
        }
    for (size_t t = 0; t < tok->vocab_cap; t++) { /* merges: every two-token split */
        if (!raw[t] || raw_len[t] < 2)
            continue;
        const char *v = tok->vocab[t];
        size_t off = 0; /* byte-level spelling offset of split k */
        for (uint32_t k = 1; k < raw_len[t]; k++) {
            off += tok->byte_chr_len[raw[t][k - 1]];
            int32_t a = strmap_get(&tok->vocab_map, v, off);
            int32_t b = a >= 0 ? strmap_get(&tok->vocab_map, v + off, tok->vocab_len[t] - off) : -1;
            if (b >= 0 && !mergemap_put(&tok->merges, a, b, (int32_t)t, (int32_t)t))
                goto out;
        }
    }
    tok->ignore_merges = true;
    tok->unk_id = -1;
    for (int b = 0; b < 256; b++)
        tok->byte_ids[b] = -1;
    st = PD_OK;
out:
    if (st == PD_ERR_NOMEM)
        pd_log_error("tokenizer %s: out of memory loading ranks", tok->name);
    for (size_t i = 0; raw && i < tok->vocab_cap; i++)
        free(raw[i]);
    free(raw);
    free(raw_len);
    free(dec);
    return st;
}

/* Special tokens: ids n_base .. n_base + 257, named by added_tokens_decoder of
 * tokenizer_config.json (config may be NULL), else <|reserved_token_ID|> (tokenization_kimi.py);
 * all special, matched in text (tiktoken's allowed_special="all"). */
static pd_status_t tt_load_specials(tokenizer_t *tok, const json_t *config)
{
    const size_t n_base = tok->vocab_cap;
    json_t *dec = json_object_get(config, "added_tokens_decoder");
    pd_status_t st;

    if (!(tok->added = calloc(TOK_TIKTOKEN_SPECIALS + 1, sizeof *tok->added)))
        return PD_ERR_NOMEM;
    for (size_t i = 0; i < TOK_TIKTOKEN_SPECIALS; i++) {
        char key[32], name[48];
        const size_t id = n_base + i;
        snprintf(key, sizeof key, "%zu", id);
        json_t *ent = json_object_get(dec, key);
        const char *content = jstr(ent, "content");
        if (!content) {
            snprintf(name, sizeof name, "<|reserved_token_%zu|>", id);
            content = name;
        }
        added_token_t *t = &tok->added[tok->n_added++];
        t->len = strlen(content);
        if (!(t->content = memdup0(content, t->len)) || !(t->match = memdup0(content, t->len)))
            return PD_ERR_NOMEM;
        t->match_len = t->len;
        t->id = (int32_t)id;
        t->special = true;
        if (!strmap_put(&tok->added_map, t->content, t->len, t->id))
            return PD_ERR_NOMEM;
    }
    if ((st = added_set_build(tok, &tok->set_raw, false)) ||
        (st = added_set_build(tok, &tok->set_norm, true)))
        return st;
    return PD_OK;
}

pd_status_t tokenizer_load_tiktoken_buffer(const char *model, size_t model_len, const char *config,
                                           size_t config_len, const char *name, tokenizer_t **tok_p)
{
    json_t *cfg = NULL;
    json_error_t jerr;
    tokenizer_t *tok;
    pd_status_t st;

    if (!name)
        name = "(tiktoken buffer)";
    if (config && !(cfg = json_loadb(config, config_len, 0, &jerr))) {
        pd_log_error("tokenizer %s: tokenizer_config.json error at line %d column %d: %s", name,
                     jerr.line, jerr.column, jerr.text);
        return PD_ERR_FORMAT;
    }
    tok = calloc(1, sizeof *tok);
    if (!tok || !(tok->name = strdup(name))) {
        free(tok);
        json_decref(cfg);
        return PD_ERR_NOMEM;
    }
    bytelevel_tables(tok);
    /* pre-tokenizer: the Kimi split (isolated pieces), then the byte-level alphabet */
    tok->pre[0] = (pre_step_t){.kind = PRE_SPLIT, .behavior = SPLIT_ISOLATED};
    tok->pre[1] = (pre_step_t){.kind = PRE_BYTELEVEL, .behavior = SPLIT_ISOLATED};
    tok->n_pre = 2;
    tok->dec_bytelevel = true;
    if ((st = regex_compile(tok, tok_kimi_pattern, strlen(tok_kimi_pattern), false,
                            &tok->pre[0].re)) ||
        (st = tt_load_ranks(tok, model, model_len)) || (st = tt_load_specials(tok, cfg)) ||
        (st = build_id_tables(tok))) {
        if (st == PD_ERR_NOMEM)
            pd_log_error("tokenizer %s: out of memory", name);
        tokenizer_destroy(tok);
        json_decref(cfg);
        return st;
    }
    json_decref(cfg);
    *tok_p = tok;
    return PD_OK;
}

/* The whole file at path into a malloc'd buffer (NUL-terminated). */
static pd_status_t tok_read_file(const char *path, char **data_p, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    char *data = NULL;
    long size;
    pd_status_t st = PD_OK;

    if (!f) {
        pd_log_error("tokenizer %s: cannot open: %s", path, strerror(errno));
        return PD_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        st = PD_ERR_IO;
    else if (!(data = malloc((size_t)size + 1)))
        st = PD_ERR_NOMEM;
    else if (fread(data, 1, (size_t)size, f) != (size_t)size)
        st = PD_ERR_IO;
    fclose(f);
    if (st != PD_OK) {
        pd_log_error("tokenizer %s: cannot read (%s)", path, pd_status_str(st));
        free(data);
        return st;
    }
    data[size] = 0;
    *data_p = data;
    *len_p = (size_t)size;
    return PD_OK;
}

pd_status_t tokenizer_load_tiktoken(const char *model_path, const char *config_path,
                                    tokenizer_t **tok_p)
{
    char *model = NULL, *config = NULL;
    size_t ml = 0, cl = 0;
    pd_status_t st = tok_read_file(model_path, &model, &ml);
    if (st == PD_OK && config_path)
        st = tok_read_file(config_path, &config, &cl);
    if (st == PD_OK)
        st = tokenizer_load_tiktoken_buffer(model, ml, config, cl, model_path, tok_p);
    free(model);
    free(config);
    return st;
}

pd_status_t tokenizer_load_dir(const char *dir, tokenizer_t **tok_p)
{
    char path[4096], cfg[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, F_OK) == 0)
        return tokenizer_load(path, tok_p);
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    if (access(path, F_OK) != 0) {
        pd_log_error("tokenizer %s: neither tokenizer.json nor tiktoken.model", dir);
        return PD_ERR_IO;
    }
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    return tokenizer_load_tiktoken(path, access(cfg, F_OK) == 0 ? cfg : NULL, tok_p);
}

void tokenizer_destroy(tokenizer_t *tok)
{
    if (!tok)
        return;
    for (size_t i = 0; i < tok->vocab_cap; i++)
        free(tok->vocab[i]);
    free(tok->vocab);
    free(tok->vocab_len);
    free(tok->vocab_map.slots);
    free(tok->merges.slots);
    for (size_t i = 0; i < tok->n_added; i++) {
        free(tok->added[i].content);
        free(tok->added[i].match);
    }
    free(tok->added);
    free(tok->added_map.slots);
    free(tok->set_raw.idx);
    free(tok->set_norm.idx);
    if (tok->id_bytes)
        for (size_t i = 0; i < tok->vocab_size; i++)
            free(tok->id_bytes[i]);
    free(tok->id_bytes);
    free(tok->id_bytes_len);
    free(tok->id_token);
    free(tok->id_special);
    for (size_t i = 0; i < tok->n_pre; i++)
        pcre2_code_free(tok->pre[i].re);
    free(tok->name);
    free(tok);
}

/* ==== encoding ==== */

typedef struct {
    size_t start, end;
    bool match;
} span_t;

typedef struct {
    span_t *spans;
    size_t n, cap;
    buf_t raw, mapped;
} level_t;

typedef struct {
    int32_t id;
    int32_t prev, next; /* -1: none */
    bool live;
} sym_t;

typedef struct {
    int32_t rank, pos, id;
} merge_ent_t;

typedef struct {
    const tokenizer_t *tok;
    int32_t *ids;
    size_t n, cap;
    level_t lvl[TOK_MAX_STEPS];
    pcre2_match_data *md;
    sym_t *syms;
    size_t syms_cap;
    merge_ent_t *heap;
    size_t heap_n, heap_cap;
} enc_t;

static pd_status_t enc_push(enc_t *e, int32_t id)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 64;
        int32_t *p = realloc(e->ids, cap * sizeof *p);
        if (!p)
            return PD_ERR_NOMEM;
        e->ids = p;
        e->cap = cap;
    }
    e->ids[e->n++] = id;
    return PD_OK;
}

static bool merge_less(const merge_ent_t *a, const merge_ent_t *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static bool heap_push(enc_t *e, int32_t rank, int32_t pos, int32_t id)
{
    if (e->heap_n == e->heap_cap) {
        size_t cap = e->heap_cap ? e->heap_cap * 2 : 64;
        merge_ent_t *h = realloc(e->heap, cap * sizeof *h);
        if (!h)
            return false;
        e->heap = h;
        e->heap_cap = cap;
    }
    size_t i = e->heap_n++;
    merge_ent_t v = {rank, pos, id};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&v, &e->heap[p]))
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = v;
    return true;
}

static merge_ent_t heap_pop(enc_t *e)
{
    merge_ent_t top = e->heap[0], v = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && merge_less(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!merge_less(&e->heap[c], &v))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n)
        e->heap[i] = v;
    return top;
}

static bool sym_add(enc_t *e, size_t *n, int32_t id)
{
    if (*n == e->syms_cap) {
        size_t cap = e->syms_cap ? e->syms_cap * 2 : 64;
        sym_t *s = realloc(e->syms, cap * sizeof *s);
        if (!s)
            return false;
        e->syms = s;
        e->syms_cap = cap;
    }
    e->syms[*n] = (sym_t){.id = id, .prev = (int32_t)*n - 1, .next = (int32_t)*n + 1, .live = true};
    (*n)++;
    return true;
}

static bool bpe_try_pair(enc_t *e, int32_t pos)
{
    const sym_t *s = &e->syms[pos];
    if (s->next < 0)
        return true;
    const mergemap_slot_t *m = mergemap_get(&e->tok->merges, s->id, e->syms[s->next].id);
    return !m || heap_push(e, m->rank, pos, m->id);
}

/* BPE over one pre-token (a string in the model's alphabet): the merge loop of the tokenizers
 * library (Word::merge_all): lowest rank first, leftmost among equals. */
static pd_status_t bpe_word(enc_t *e, const char *s, size_t len)
{
    const tokenizer_t *tok = e->tok;
    size_t n = 0;
    int32_t unk_pending = 0; /* fuse_unk: an unk symbol is open */

    if (tok->ignore_merges) {
        int32_t id = strmap_get(&tok->vocab_map, s, len);
        if (id >= 0)
            return enc_push(e, id);
    }
    for (size_t i = 0; i < len;) {
        size_t l = utf8_char_len((uint8_t)s[i]);
        if (l > len - i)
            l = len - i;
        int32_t id = strmap_get(&tok->vocab_map, s + i, l);
        if (id >= 0) {
            if (!sym_add(e, &n, id))
                return PD_ERR_NOMEM;
            unk_pending = 0;
        } else {
            bool done = false;
            if (tok->byte_fallback) {
                size_t k;
                for (k = 0; k < l && tok->byte_ids[(uint8_t)s[i + k]] >= 0; k++)
                    ;
                if (k == l) {
                    for (k = 0; k < l; k++)
                        if (!sym_add(e, &n, tok->byte_ids[(uint8_t)s[i + k]]))
                            return PD_ERR_NOMEM;
                    done = true;
                    unk_pending = 0;
                }
            }
            if (!done && tok->unk_id >= 0 && !(tok->fuse_unk && unk_pending)) {
                if (!sym_add(e, &n, tok->unk_id))
                    return PD_ERR_NOMEM;
                unk_pending = 1;
            }
        }
        i += l;
    }
    if (!n)
        return PD_OK;
    e->syms[n - 1].next = -1;
    e->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (!bpe_try_pair(e, (int32_t)i))
            return PD_ERR_NOMEM;
    while (e->heap_n) {
        merge_ent_t top = heap_pop(e);
        sym_t *cur = &e->syms[top.pos];
        if (!cur->live || cur->next < 0)
            continue;
        sym_t *right = &e->syms[cur->next];
        const mergemap_slot_t *m = mergemap_get(&tok->merges, cur->id, right->id);
        if (!m || m->id != top.id)
            continue;
        cur->id = top.id;
        right->live = false;
        cur->next = right->next;
        if (right->next >= 0)
            e->syms[right->next].prev = top.pos;
        if (cur->prev >= 0 && !bpe_try_pair(e, cur->prev))
            return PD_ERR_NOMEM;
        if (!bpe_try_pair(e, top.pos))
            return PD_ERR_NOMEM;
    }
    for (int32_t i = 0; i >= 0; i = e->syms[i].next) {
        pd_status_t st = enc_push(e, e->syms[i].id);
        if (st)
            return st;
    }
    return PD_OK;
}

static bool span_add(level_t *L, size_t start, size_t end, bool match)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 64;
        span_t *s = realloc(L->spans, cap * sizeof *s);
        if (!s)
            return false;
        L->spans = s;
        L->cap = cap;
    }
    L->spans[L->n++] = (span_t){start, end, match};
    return true;
}

/* Fills L->spans with the regex matches and the gaps between them, covering s. */
static pd_status_t regex_spans(enc_t *e, const pcre2_code *re, level_t *L, const char *s,
                               size_t len)
{
    size_t pos = 0, prev = 0;
    L->n = 0;
    while (pos <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            pd_log_error("tokenizer %s: split pattern failed on %zu bytes at offset %zu: %s",
                         e->tok->name, len, pos, (char *)msg);
            return rc == PCRE2_ERROR_NOMEMORY ? PD_ERR_NOMEM : PD_ERR_RESOURCE;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms || ms < prev) /* \K games: treat as the end of matching */
            break;
        if (ms > prev && !span_add(L, prev, ms, false))
            return PD_ERR_NOMEM;
        if (me > ms && !span_add(L, ms, me, true))
            return PD_ERR_NOMEM;
        prev = me;
        if (me == ms) {
            if (me >= len)
                break;
            pos = me + utf8_char_len((uint8_t)s[me]);
        } else {
            pos = me;
        }
    }
    if (prev < len && !span_add(L, prev, len, false))
        return PD_ERR_NOMEM;
    return PD_OK;
}

/* Rewrites L->spans per the split behavior into the pieces to keep (match marks a removed one). */
static void spans_apply(level_t *L, split_behavior_t b, bool invert)
{
    size_t o = 0;
    if (invert)
        for (size_t i = 0; i < L->n; i++)
            L->spans[i].match = !L->spans[i].match;
    switch (b) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < L->n; i++)
            L->spans[i].match = false;
        return;
    case SPLIT_REMOVED:
        return;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < L->n; i++) {
            if (o > 0 && L->spans[o - 1].match == L->spans[i].match)
                L->spans[o - 1].end = L->spans[i].end;
            else
                L->spans[o++] = L->spans[i];
        }
        break;
    case SPLIT_MERGED_PREV: {
        bool prev_match = false;
        for (size_t i = 0; i < L->n; i++) {
            bool m = L->spans[i].match;
            if (m && !prev_match && o > 0)
                L->spans[o - 1].end = L->spans[i].end;
            else
                L->spans[o++] = L->spans[i];
            prev_match = m;
        }
        break;
    }
    case SPLIT_MERGED_NEXT: {
        bool prev_match = false;
        size_t w = L->n; /* compacted from the back */
        for (size_t i = L->n; i-- > 0;) {
            bool m = L->spans[i].match;
            if (m && !prev_match && w < L->n)
                L->spans[w].start = L->spans[i].start;
            else
                L->spans[--w] = L->spans[i];
            prev_match = m;
        }
        memmove(L->spans, L->spans + w, (L->n - w) * sizeof *L->spans);
        o = L->n - w;
        break;
    }
    }
    L->n = o;
    for (size_t i = 0; i < L->n; i++)
        L->spans[i].match = false;
}

static pd_status_t pretok_run(enc_t *e, size_t level, const char *s, size_t len);

static pd_status_t bytelevel_map(enc_t *e, size_t level, const char *s, size_t len)
{
    const tokenizer_t *tok = e->tok;
    buf_t *m = &e->lvl[level].mapped;
    m->n = 0;
    if (!buf_reserve(m, len * 2))
        return PD_ERR_NOMEM;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)s[i];
        memcpy(m->p + m->n, tok->byte_chr[b], tok->byte_chr_len[b]);
        m->n += tok->byte_chr_len[b];
    }
    return pretok_run(e, level + 1, m->p, m->n);
}

/* Runs pre-tokenizer step `level` and the later ones on s, then BPE on each piece. */
static pd_status_t pretok_run(enc_t *e, size_t level, const char *s, size_t len)
{
    const tokenizer_t *tok = e->tok;
    pd_status_t st;

    if (len == 0)
        return PD_OK;
    if (level == tok->n_pre)
        return bpe_word(e, s, len);
    const pre_step_t *step = &tok->pre[level];
    level_t *L = &e->lvl[level];
    if (step->kind == PRE_BYTELEVEL && step->add_prefix_space && s[0] != ' ') {
        L->raw.n = 0;
        if (!buf_append(&L->raw, " ", 1) || !buf_append(&L->raw, s, len))
            return PD_ERR_NOMEM;
        s = L->raw.p;
        len = L->raw.n;
    }
    if (!step->re)
        return bytelevel_map(e, level, s, len);
    if ((st = regex_spans(e, step->re, L, s, len)))
        return st;
    spans_apply(L, step->behavior, step->invert);
    for (size_t i = 0; i < L->n; i++) {
        const char *p = s + L->spans[i].start;
        size_t n = L->spans[i].end - L->spans[i].start;
        st = step->kind == PRE_BYTELEVEL ? bytelevel_map(e, level, p, n)
                                         : pretok_run(e, level + 1, p, n);
        if (st)
            return st;
    }
    return PD_OK;
}

typedef pd_status_t (*piece_fn_t)(enc_t *e, const char *s, size_t len);

/* Splits s on the added tokens of set (leftmost, then longest; lstrip/rstrip/single_word as the
 * tokenizers library's AddedVocabulary::find_matches), pushing their ids and passing the text
 * between them to piece. */
static pd_status_t added_split(enc_t *e, const added_set_t *set, const char *s, size_t len,
                               piece_fn_t piece)
{
    const tokenizer_t *tok = e->tok;
    size_t done = 0, i = 0;
    pd_status_t st;

    if (!set->n)
        return piece(e, s, len);
    while (i < len) {
        uint8_t b = (uint8_t)s[i];
        const added_token_t *hit = NULL;
        for (uint32_t k = set->start[b]; k < set->start[b + 1]; k++) {
            const added_token_t *t = &tok->added[set->idx[k]];
            if (t->match_len <= len - i && memcmp(s + i, t->match, t->match_len) == 0) {
                hit = t;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, stop = i + hit->match_len, l;
        i = stop;
        if (hit->single_word) {
            bool left_ok = start == 0 || !is_word_char(utf8_decode_at(s, len, utf8_prev(s, start), &l));
            bool right_ok = stop == len || !is_word_char(utf8_decode_at(s, len, stop, &l));
            if (!left_ok || !right_ok)
                continue;
        }
        if (hit->lstrip) {
            size_t ns = start;
            while (ns > done) {
                size_t p = utf8_prev(s, ns);
                if (!is_rust_whitespace(utf8_decode_at(s, len, p, &l)))
                    break;
                ns = p;
            }
            start = ns;
        }
        if (hit->rstrip) {
            while (stop < len && is_rust_whitespace(utf8_decode_at(s, len, stop, &l)))
                stop += l;
            i = stop;
        }
        if (start > done && (st = piece(e, s + done, start - done)))
            return st;
        if ((st = enc_push(e, hit->id)))
            return st;
        done = stop;
    }
    if (done < len)
        return piece(e, s + done, len - done);
    return PD_OK;
}

static pd_status_t piece_pretok(enc_t *e, const char *s, size_t len)
{
    return pretok_run(e, 0, s, len);
}

static pd_status_t piece_normalize(enc_t *e, const char *s, size_t len)
{
    char *norm = NULL;
    size_t nlen = len;
    pd_status_t st;

    if (e->tok->n_norm && (st = normalize(e->tok, s, len, &norm, &nlen)))
        return st;
    st = added_split(e, &e->tok->set_norm, norm ? norm : s, nlen, piece_pretok);
    free(norm);
    return st;
}

pd_status_t tokenizer_encode(const tokenizer_t *tok, const char *text, size_t len, bool add_special,
                             int32_t **ids_p, size_t *n_p)
{
    enc_t e = {.tok = tok};
    size_t bad;
    pd_status_t st = PD_OK;

    if (!tokenizer_utf8_valid(text, len, &bad)) {
        pd_log_error("tokenizer %s: invalid utf-8 at byte offset %zu of %zu", tok->name, bad,
                     len);
        return PD_ERR_INVALID;
    }
    if (!(e.md = pcre2_match_data_create(1, NULL)))
        st = PD_ERR_NOMEM;
    for (size_t i = 0; !st && add_special && i < tok->n_prefix; i++)
        st = enc_push(&e, tok->prefix[i]);
    if (!st)
        st = added_split(&e, &tok->set_raw, text, len, piece_normalize);
    for (size_t i = 0; !st && add_special && i < tok->n_suffix; i++)
        st = enc_push(&e, tok->suffix[i]);
    if (!st && !e.ids && !(e.ids = malloc(sizeof *e.ids)))
        st = PD_ERR_NOMEM;
    for (size_t k = 0; k < TOK_MAX_STEPS; k++) {
        free(e.lvl[k].spans);
        free(e.lvl[k].raw.p);
        free(e.lvl[k].mapped.p);
    }
    free(e.syms);
    free(e.heap);
    pcre2_match_data_free(e.md);
    if (st) {
        if (st == PD_ERR_NOMEM)
            pd_log_error("tokenizer %s: out of memory encoding %zu bytes", tok->name, len);
        free(e.ids);
        return st;
    }
    *ids_p = e.ids;
    *n_p = e.n;
    return PD_OK;
}

/* ==== decoding ==== */

static bool id_valid(const tokenizer_t *tok, int32_t id)
{
    return id >= 0 && (size_t)id < tok->vocab_size && tok->id_token[id];
}

/* Appends the decoder's bytes for id (nothing for a skipped special token). */
static bool decode_append(const tokenizer_t *tok, buf_t *b, int32_t id, bool skip_special,
                          bool *first)
{
    if (skip_special && tok->id_special[id])
        return true;
    if (!tok->dec_bytelevel && !*first && !buf_append(b, " ", 1))
        return false;
    *first = false;
    return buf_append(b, tok->id_bytes[id], tok->id_bytes_len[id]);
}

pd_status_t tokenizer_decode(const tokenizer_t *tok, const int32_t *ids, size_t n,
                             bool skip_special, char **text_p, size_t *len_p)
{
    buf_t raw = {0}, out = {0};
    bool first = true;
    size_t used;
    pd_status_t st = PD_ERR_NOMEM;

    for (size_t i = 0; i < n; i++) {
        if (!id_valid(tok, ids[i])) {
            pd_log_error("tokenizer %s: decode: id %d at position %zu is not in the vocabulary",
                         tok->name, (int)ids[i], i);
            st = PD_ERR_INVALID;
            goto err_free;
        }
        if (!decode_append(tok, &raw, ids[i], skip_special, &first))
            goto err_nomem;
    }
    if (!buf_reserve(&out, 0) || !utf8_lossy_append(&out, raw.p, raw.n, false, &used))
        goto err_nomem;
    free(raw.p);
    *text_p = out.p;
    *len_p = out.n;
    return PD_OK;
err_nomem:
    pd_log_error("tokenizer %s: out of memory decoding %zu ids", tok->name, n);
err_free:
    free(raw.p);
    free(out.p);
    return st;
}

size_t tokenizer_vocab_size(const tokenizer_t *tok)
{
    return tok->vocab_size;
}

int32_t tokenizer_token_to_id(const tokenizer_t *tok, const char *token)
{
    size_t len = strlen(token);
    int32_t id = strmap_get(&tok->added_map, token, len);
    return id >= 0 ? id : strmap_get(&tok->vocab_map, token, len);
}

const char *tokenizer_id_to_token(const tokenizer_t *tok, int32_t id)
{
    return id_valid(tok, id) ? tok->id_token[id] : NULL;
}

bool tokenizer_is_special(const tokenizer_t *tok, int32_t id)
{
    return id_valid(tok, id) && tok->id_special[id];
}

int32_t tokenizer_bos_id(const tokenizer_t *tok)
{
    return tok->n_prefix ? tok->prefix[0] : -1;
}

/* ==== streaming decode ==== */

struct tokenizer_stream {
    const tokenizer_t *tok;
    bool skip_special;
    bool first;  /* no token emitted yet (the null decoder joins with spaces) */
    buf_t held;  /* bytes of an incomplete UTF-8 sequence */
};

pd_status_t tokenizer_stream_create(const tokenizer_t *tok, bool skip_special,
                                    tokenizer_stream_t **s_p)
{
    tokenizer_stream_t *s = calloc(1, sizeof *s);
    if (!s) {
        pd_log_error("tokenizer %s: out of memory creating a stream", tok->name);
        return PD_ERR_NOMEM;
    }
    s->tok = tok;
    s->skip_special = skip_special;
    s->first = true;
    *s_p = s;
    return PD_OK;
}

void tokenizer_stream_destroy(tokenizer_stream_t *s)
{
    if (!s)
        return;
    free(s->held.p);
    free(s);
}

pd_status_t tokenizer_stream_push(tokenizer_stream_t *s, int32_t id, char **delta_p,
                                  size_t *len_p)
{
    const tokenizer_t *tok = s->tok;
    buf_t raw = {0}, out = {0};
    bool first = s->first;
    size_t used;

    if (!id_valid(tok, id)) {
        pd_log_error("tokenizer %s: stream: id %d is not in the vocabulary", tok->name, (int)id);
        return PD_ERR_INVALID;
    }
    if (!buf_append(&raw, s->held.p, s->held.n) ||
        !decode_append(tok, &raw, id, s->skip_special, &first) || !buf_reserve(&out, 0) ||
        !utf8_lossy_append(&out, raw.p, raw.n, true, &used)) {
        pd_log_error("tokenizer %s: out of memory in stream push", tok->name);
        free(raw.p);
        free(out.p);
        return PD_ERR_NOMEM;
    }
    /* raw.n - used < 4, and held has room for what it held plus a token's bytes */
    memmove(raw.p, raw.p + used, raw.n - used);
    raw.n -= used;
    free(s->held.p);
    s->held = raw;
    s->first = first;
    *delta_p = out.p;
    *len_p = out.n;
    return PD_OK;
}

pd_status_t tokenizer_stream_flush(tokenizer_stream_t *s, char **delta_p, size_t *len_p)
{
    buf_t out = {0};
    size_t used;
    if (!buf_reserve(&out, 0) || !utf8_lossy_append(&out, s->held.p, s->held.n, false, &used)) {
        pd_log_error("tokenizer %s: out of memory in stream flush", s->tok->name);
        free(out.p);
        return PD_ERR_NOMEM;
    }
    s->held.n = 0;
    s->first = true;
    *delta_p = out.p;
    *len_p = out.n;
    return PD_OK;
}
