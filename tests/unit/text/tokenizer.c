/* Tests common/tokenizer.h: golden ids and text from transformers for both fixtures, and the
 * pipeline pieces (merges spellings, ignore_merges, added tokens, NFC, invalid UTF-8, streaming
 * decode, empty text, out-of-range ids) on small inline tokenizer.json files; tiktoken files as
 * Kimi K2 ships them (tests/data/kimi-tiny, ids checked against tiktoken by
 * tests/gpu/check_tiktoken.py) and malformed ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "tokenizer.h"

/* ==== helpers ==== */

static tokenizer_t *load_inline(const char *json)
{
    tokenizer_t *tok = NULL;
    assert_int_equal(tokenizer_load_buffer(json, strlen(json), "inline", &tok), PD_OK);
    assert_non_null(tok);
    return tok;
}

static void expect_ids(const tokenizer_t *tok, const char *text, bool add_special,
                       const int32_t *want, size_t n_want)
{
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(tokenizer_encode(tok, text, strlen(text), add_special, &ids, &n), PD_OK);
    if (n != n_want) {
        fprintf(stderr, "text '%s': got %zu ids:", text, n);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids[i], want[i]);
    free(ids);
}

static char *decode_str(const tokenizer_t *tok, const int32_t *ids, size_t n, bool skip)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(tokenizer_decode(tok, ids, n, skip, &text, &len), PD_OK);
    assert_int_equal(strlen(text), len);
    return text;
}

/* ==== golden cases from transformers ==== */

static size_t ids_from_json(const json_t *arr, int32_t **ids_p)
{
    size_t n = json_array_size(arr), i;
    json_t *v;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    assert_non_null(ids);
    json_array_foreach(arr, i, v) ids[i] = (int32_t)json_integer_value(v);
    *ids_p = ids;
    return n;
}

static void golden(const char *model)
{
    const char *dir = getenv("PD_MODELS_DIR");
    char path[4096];
    tokenizer_t *tok = NULL;
    json_error_t jerr;
    size_t i;
    json_t *c;

    assert_non_null(dir);
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir, model);
    assert_int_equal(tokenizer_load(path, &tok), PD_OK);
    snprintf(path, sizeof path, "%s/%s/reference.json", dir, model);
    json_t *ref = json_load_file(path, 0, &jerr);
    assert_non_null(ref);

    assert_int_equal(tokenizer_bos_id(tok), 0);
    assert_int_equal(tokenizer_vocab_size(tok), 2048);
    assert_true(tokenizer_is_special(tok, 0));
    assert_false(tokenizer_is_special(tok, 4));
    assert_string_equal(tokenizer_id_to_token(tok, 0), "<|begin_of_text|>");
    assert_int_equal(tokenizer_token_to_id(tok, "<|im_end|>"), 3);
    assert_int_equal(tokenizer_token_to_id(tok, "no such token"), -1);

    json_t *cases = json_object_get(ref, "tokenizer_cases");
    assert_true(json_array_size(cases) > 0);
    json_array_foreach(cases, i, c)
    {
        const char *text = json_string_value(json_object_get(c, "text"));
        int32_t *bos, *plain;
        size_t nb = ids_from_json(json_object_get(c, "ids_with_bos"), &bos);
        size_t np = ids_from_json(json_object_get(c, "ids_plain"), &plain);
        expect_ids(tok, text, true, bos, nb);
        expect_ids(tok, text, false, plain, np);
        char *dec = decode_str(tok, plain, np, true);
        assert_string_equal(dec, json_string_value(json_object_get(c, "decoded")));
        free(dec);
        /* without skipping, byte-level BPE gives the text back exactly */
        dec = decode_str(tok, plain, np, false);
        assert_string_equal(dec, text);
        free(dec);
        free(bos);
        free(plain);
    }
    cases = json_object_get(ref, "cases");
    assert_true(json_array_size(cases) > 0);
    json_array_foreach(cases, i, c)
    {
        int32_t *want;
        size_t n = ids_from_json(json_object_get(c, "input_ids"), &want);
        expect_ids(tok, json_string_value(json_object_get(c, "prompt")), true, want, n);
        free(want);
    }
    json_decref(ref);
    tokenizer_destroy(tok);
}

static void test_golden_tiny_llama(void **state)
{
    (void)state;
    golden("tiny-llama");
}

static void test_golden_tiny_moe(void **state)
{
    (void)state;
    golden("tiny-moe");
}

/* ==== small inline tokenizers ==== */

/* vocab: a b c ab bc abc; merges a+b (rank 0), ab+c (rank 1), b+c (rank 2). No pre-tokenizer. */
#define MINI_VOCAB "{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4,\"abc\":5,\"<s>\":6,\"d\":7,\"cd\":8}"
#define MINI(merges, extra)                                                                        \
    "{\"added_tokens\":[{\"id\":6,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"  \
    "\"normalizer\":null,\"pre_tokenizer\":null,\"post_processor\":null,\"decoder\":null,"         \
    "\"model\":{\"type\":\"BPE\",\"vocab\":" MINI_VOCAB ",\"merges\":" merges extra "}}"

static void test_merges_spellings(void **state)
{
    (void)state;
    tokenizer_t *t1 = load_inline(MINI("[\"a b\",\"ab c\",\"b c\"]", ""));
    tokenizer_t *t2 = load_inline(MINI("[[\"a\",\"b\"],[\"ab\",\"c\"],[\"b\",\"c\"]]", ""));
    const int32_t abc[] = {5}, bcab[] = {4, 3}, cab[] = {2, 3};
    expect_ids(t1, "abc", false, abc, 1);
    expect_ids(t2, "abc", false, abc, 1);
    expect_ids(t1, "bcab", false, bcab, 2);
    expect_ids(t2, "bcab", false, bcab, 2);
    expect_ids(t2, "cab", false, cab, 2);
    tokenizer_destroy(t1);
    tokenizer_destroy(t2);

    /* rank decides, not position: with b+c first, "abc" -> a + bc */
    tokenizer_t *t3 = load_inline(MINI("[\"b c\",\"a b\",\"ab c\"]", ""));
    const int32_t a_bc[] = {0, 4};
    expect_ids(t3, "abc", false, a_bc, 2);
    tokenizer_destroy(t3);

    /* a merge naming a token outside the vocab is a format error */
    const char *bad = MINI("[\"a x\"]", "");
    tokenizer_t *tok = NULL;
    assert_int_equal(tokenizer_load_buffer(bad, strlen(bad), "bad", &tok), PD_ERR_FORMAT);
    assert_null(tok);
}

static void test_ignore_merges(void **state)
{
    (void)state;
    /* "cd" and "abc" are in the vocab; without ignore_merges only the merges can build them */
    tokenizer_t *plain = load_inline(MINI("[\"a b\"]", ",\"ignore_merges\":false"));
    tokenizer_t *ign = load_inline(MINI("[\"a b\"]", ",\"ignore_merges\":true"));
    const int32_t c_d[] = {2, 7}, cd[] = {8}, ab_c[] = {3, 2}, abc[] = {5};
    expect_ids(plain, "cd", false, c_d, 2);
    expect_ids(ign, "cd", false, cd, 1);
    expect_ids(plain, "abc", false, ab_c, 2);
    expect_ids(ign, "abc", false, abc, 1);
    tokenizer_destroy(plain);
    tokenizer_destroy(ign);
}

/* MINI plus a space token and added tokens with strip and single_word flags */
#define ADDED_JSON                                                                                 \
    "{\"added_tokens\":["                                                                          \
    "{\"id\":6,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"                        \
    "{\"id\":9,\"content\":\"[m]\",\"special\":false,\"lstrip\":true,\"rstrip\":true,"             \
    "\"normalized\":false},"                                                                       \
    "{\"id\":11,\"content\":\"bb\",\"special\":false,\"single_word\":true,\"normalized\":false},"  \
    "{\"id\":12,\"content\":\"<s><s>\",\"special\":true,\"normalized\":false}],"                   \
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\" \":10},"            \
    "\"merges\":[\"a b\"]}}"

static void test_added_tokens(void **state)
{
    (void)state;
    tokenizer_t *tok = load_inline(ADDED_JSON);
    const int32_t mid[] = {3, 6, 2, 6, 0}, longest[] = {12, 6, 0};
    const int32_t strip[] = {0, 9, 1}, word[] = {0, 10, 11, 10, 2}, notword[] = {3, 1};
    expect_ids(tok, "ab<s>c<s>a", false, mid, 5);
    expect_ids(tok, "<s><s><s>a", false, longest, 3); /* longest match first */
    expect_ids(tok, "a  [m]  b", false, strip, 3);    /* lstrip/rstrip eat the spaces */
    expect_ids(tok, "a bb c", false, word, 5);
    expect_ids(tok, "abb", false, notword, 2); /* bb inside a word is not the added token */
    assert_true(tokenizer_is_special(tok, 6));
    assert_false(tokenizer_is_special(tok, 9));
    assert_int_equal(tokenizer_vocab_size(tok), 13);
    assert_int_equal(tokenizer_bos_id(tok), -1);
    /* no decoder: tokens joined with spaces; skip_special drops <s> but keeps [m] */
    char *text = decode_str(tok, mid, 5, true);
    assert_string_equal(text, "ab c a");
    free(text);
    text = decode_str(tok, strip, 3, false);
    assert_string_equal(text, "a [m] b");
    free(text);
    tokenizer_destroy(tok);
}

static void test_special_in_text_fixture(void **state)
{
    (void)state;
    char path[4096];
    tokenizer_t *tok = NULL;
    int32_t *a, *b, *all;
    size_t na, nb, n;
    snprintf(path, sizeof path, "%s/tiny-llama/tokenizer.json", getenv("PD_MODELS_DIR"));
    assert_int_equal(tokenizer_load(path, &tok), PD_OK);
    assert_int_equal(tokenizer_encode(tok, "Hello there", 11, false, &a, &na), PD_OK);
    assert_int_equal(tokenizer_encode(tok, "\nhow", 4, false, &b, &nb), PD_OK);
    const char *text = "<|im_start|>Hello there<|im_end|>\nhow<|end_of_text|>";
    assert_int_equal(tokenizer_encode(tok, text, strlen(text), true, &all, &n), PD_OK);
    assert_int_equal(n, 1 + 1 + na + 1 + nb + 1);
    assert_int_equal(all[0], 0);
    assert_int_equal(all[1], 2);
    assert_memory_equal(all + 2, a, na * sizeof *a);
    assert_int_equal(all[2 + na], 3);
    assert_memory_equal(all + 3 + na, b, nb * sizeof *b);
    assert_int_equal(all[n - 1], 1);
    char *dec = decode_str(tok, all, n, true);
    assert_string_equal(dec, "Hello there\nhow");
    free(dec);
    dec = decode_str(tok, all, n, false);
    assert_string_equal(dec, "<|begin_of_text|><|im_start|>Hello there<|im_end|>\nhow<|end_of_text|>");
    free(dec);
    free(a);
    free(b);
    free(all);
    tokenizer_destroy(tok);
}

/* "é" precomposed is one token; "e" + U+0301 only become it through NFC */
#define NFC_JSON(norm)                                                                             \
    "{\"normalizer\":" norm ",\"model\":{\"type\":\"BPE\",\"vocab\":"                              \
    "{\"e\":0,\"\xcc\x81\":1,\"\xc3\xa9\":2,\"x\":3},\"merges\":[]}}"

static void test_nfc(void **state)
{
    (void)state;
    tokenizer_t *none = load_inline(NFC_JSON("null"));
    tokenizer_t *nfc = load_inline(NFC_JSON("{\"type\":\"NFC\"}"));
    tokenizer_t *seq = load_inline(NFC_JSON("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]}"));
    const int32_t raw[] = {3, 0, 1}, composed[] = {3, 2};
    expect_ids(none, "xe\xcc\x81", false, raw, 3);
    expect_ids(nfc, "xe\xcc\x81", false, composed, 2);
    expect_ids(seq, "xe\xcc\x81", false, composed, 2);
    expect_ids(nfc, "x\xc3\xa9", false, composed, 2);
    tokenizer_destroy(none);
    tokenizer_destroy(nfc);
    tokenizer_destroy(seq);

    const char *bad = NFC_JSON("{\"type\":\"Precompiled\"}");
    tokenizer_t *tok = NULL;
    assert_int_equal(tokenizer_load_buffer(bad, strlen(bad), "bad", &tok), PD_ERR_UNSUPPORTED);
    assert_null(tok);
}

/* GPT-2 style: ByteLevel pre-tokenizer with its own regex and a prefix space; a String Split */
static void test_bytelevel_regex(void **state)
{
    (void)state;
    tokenizer_t *tok = load_inline(
        "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true},"
        "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":"
        "{\"\xc4\xa0\":0,\"h\":1,\"i\":2,\"\xc4\xa0h\":3,\"hi\":4,\"\xc4\xa0hi\":5,\"!\":6},"
        "\"merges\":[\"\xc4\xa0 h\",\"\xc4\xa0h i\",\"h i\"]}}");
    const int32_t want[] = {5, 5, 6};
    expect_ids(tok, "hi hi!", false, want, 3);
    char *text = decode_str(tok, want, 3, false);
    assert_string_equal(text, " hi hi!");
    free(text);
    tokenizer_destroy(tok);

    tok = load_inline("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\".\"},"
                      "\"behavior\":\"Removed\",\"invert\":false},"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
                      "\"merges\":[\"a b\"]}}");
    const int32_t split[] = {0, 1, 2}; /* "." is literal, removed, and splits the words */
    expect_ids(tok, "a.b.ab", false, split, 3);
    tokenizer_destroy(tok);
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t len, off;
    } bad[] = {
        {"ab\xff" "cd", 5, 2},      {"\xc0\x80", 2, 0},         {"x\xed\xa0\x80", 4, 1},
        {"xy\xe2\x82", 4, 2},       {"\xf4\x90\x80\x80", 4, 0}, {"ok\x80", 3, 2},
        {"\xe2\x82\xac\xc3", 4, 3},
    };
    tokenizer_t *tok = load_inline(MINI("[\"a b\"]", ""));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t off = 999;
        int32_t *ids = (int32_t *)0x1;
        size_t n = 77;
        assert_false(tokenizer_utf8_valid(bad[i].s, bad[i].len, &off));
        assert_int_equal(off, bad[i].off);
        assert_int_equal(tokenizer_encode(tok, bad[i].s, bad[i].len, true, &ids, &n),
                         PD_ERR_INVALID);
        assert_ptr_equal(ids, (int32_t *)0x1); /* outputs untouched on failure */
        assert_int_equal(n, 77);
    }
    assert_true(tokenizer_utf8_valid("\xe2\x82\xac \xf0\x9f\x99\x82 \xf4\x8f\xbf\xbf", 13, NULL));
    assert_true(tokenizer_utf8_valid("a\0b", 3, NULL));
    tokenizer_destroy(tok);
}

static tokenizer_t *load_fixture(void)
{
    char path[4096];
    tokenizer_t *tok = NULL;
    snprintf(path, sizeof path, "%s/tiny-llama/tokenizer.json", getenv("PD_MODELS_DIR"));
    assert_int_equal(tokenizer_load(path, &tok), PD_OK);
    return tok;
}

static void test_stream_multibyte(void **state)
{
    (void)state;
    tokenizer_t *tok = load_fixture();
    tokenizer_stream_t *s = NULL;
    int32_t *ids;
    size_t n, len;
    char *delta, *text;
    const char *emoji = "a\xf0\x9f\x99\x82"; /* a🙂: the emoji is not in this tiny vocab */

    assert_int_equal(tokenizer_encode(tok, emoji, strlen(emoji), false, &ids, &n), PD_OK);
    assert_true(n >= 3); /* the emoji's four bytes take more than one token */
    assert_int_equal(tokenizer_stream_create(tok, true, &s), PD_OK);
    char got[64] = "";
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(tokenizer_stream_push(s, ids[i], &delta, &len), PD_OK);
        assert_int_equal(strlen(delta), len);
        if (i > 0 && i + 1 < n)
            assert_int_equal(len, 0); /* held back: the emoji is incomplete */
        strcat(got, delta);
        free(delta);
    }
    assert_string_equal(got, emoji);
    assert_int_equal(tokenizer_stream_flush(s, &delta, &len), PD_OK);
    assert_int_equal(len, 0);
    free(delta);

    /* an incomplete sequence: decode shows U+FFFD, the stream holds it until flush */
    text = decode_str(tok, ids, n - 1, false);
    assert_string_equal(text, "a\xef\xbf\xbd");
    free(text);
    for (size_t i = 0; i + 1 < n; i++) {
        assert_int_equal(tokenizer_stream_push(s, ids[i], &delta, &len), PD_OK);
        free(delta);
    }
    assert_int_equal(tokenizer_stream_flush(s, &delta, &len), PD_OK);
    assert_string_equal(delta, "\xef\xbf\xbd");
    free(delta);
    assert_int_equal(tokenizer_stream_push(s, 5000, &delta, &len), PD_ERR_INVALID);
    tokenizer_stream_destroy(s);
    tokenizer_stream_destroy(NULL);
    free(ids);

    /* the stream's deltas add up to decode() over a longer text with special tokens */
    const char *long_text = "<|begin_of_text|>Ünïcödé — “quotes” and émojis 🙂 日本語\n\n";
    assert_int_equal(tokenizer_encode(tok, long_text, strlen(long_text), true, &ids, &n), PD_OK);
    for (int skip = 0; skip < 2; skip++) {
        char acc[256] = "";
        assert_int_equal(tokenizer_stream_create(tok, skip, &s), PD_OK);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(tokenizer_stream_push(s, ids[i], &delta, &len), PD_OK);
            strcat(acc, delta);
            free(delta);
        }
        assert_int_equal(tokenizer_stream_flush(s, &delta, &len), PD_OK);
        strcat(acc, delta);
        free(delta);
        text = decode_str(tok, ids, n, skip);
        assert_string_equal(acc, text);
        free(text);
        tokenizer_stream_destroy(s);
    }
    free(ids);
    tokenizer_destroy(tok);
}

static void test_empty_and_range(void **state)
{
    (void)state;
    tokenizer_t *tok = load_fixture();
    int32_t *ids = NULL;
    size_t n = 99, len = 99;
    char *text = NULL;

    assert_int_equal(tokenizer_encode(tok, "", 0, false, &ids, &n), PD_OK);
    assert_non_null(ids);
    assert_int_equal(n, 0);
    free(ids);
    assert_int_equal(tokenizer_encode(tok, NULL, 0, true, &ids, &n), PD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 0);
    free(ids);
    assert_int_equal(tokenizer_decode(tok, NULL, 0, true, &text, &len), PD_OK);
    assert_string_equal(text, "");
    assert_int_equal(len, 0);
    free(text);

    const int32_t bad1[] = {5, 2048}, bad2[] = {-1}, ok[] = {2047};
    text = (char *)0x1;
    assert_int_equal(tokenizer_decode(tok, bad1, 2, false, &text, &len), PD_ERR_INVALID);
    assert_int_equal(tokenizer_decode(tok, bad2, 1, false, &text, &len), PD_ERR_INVALID);
    assert_ptr_equal(text, (char *)0x1);
    assert_int_equal(tokenizer_decode(tok, ok, 1, false, &text, &len), PD_OK);
    free(text);
    assert_null(tokenizer_id_to_token(tok, 2048));
    assert_null(tokenizer_id_to_token(tok, -5));
    assert_false(tokenizer_is_special(tok, -1));
    assert_false(tokenizer_is_special(tok, 1 << 30));
    tokenizer_destroy(tok);
    tokenizer_destroy(NULL);

    tok = NULL;
    assert_int_equal(tokenizer_load("/nonexistent/tokenizer.json", &tok), PD_ERR_IO);
    assert_int_equal(tokenizer_load_buffer("{\"model\":", 9, NULL, &tok), PD_ERR_FORMAT);
    assert_null(tok);
}

/* ==== tiktoken files (Kimi K2) ==== */

/* tests/data/kimi-tiny: a tiktoken.model + tokenizer_config.json in Kimi K2's published format
 * (make_kimi_tiny.py); golden.json holds texts and their ids, which tests/gpu/check_tiktoken.py
 * checks against tiktoken itself with Kimi's pat_str and special tokens. */
static void test_tiktoken_golden(void **state)
{
    (void)state;
    const char *data = getenv("PD_DATA_DIR");
    char dir[4096], path[4200];
    tokenizer_t *tok = NULL;
    json_error_t jerr;
    size_t i;
    json_t *g;

    assert_non_null(data);
    snprintf(dir, sizeof dir, "%s/kimi-tiny", data);
    assert_int_equal(tokenizer_load_dir(dir, &tok), PD_OK);
    /* 2052 ranks, then the 258 special ids of tokenization_kimi.py */
    assert_int_equal(tokenizer_vocab_size(tok), 2052 + 258);
    assert_int_equal(tokenizer_bos_id(tok), -1);
    assert_int_equal(tokenizer_token_to_id(tok, "[BOS]"), 2052);
    assert_int_equal(tokenizer_token_to_id(tok, "<|im_end|>"), 2054);
    assert_string_equal(tokenizer_id_to_token(tok, 2100), "<|reserved_token_2100|>");
    assert_string_equal(tokenizer_id_to_token(tok, 2309), "<|reserved_token_2309|>");
    assert_null(tokenizer_id_to_token(tok, 2310));
    assert_true(tokenizer_is_special(tok, 2054));
    assert_false(tokenizer_is_special(tok, 65));
    assert_string_equal(tokenizer_id_to_token(tok, 65), "A"); /* rank = id, byte-level spelling */

    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_t *cases = json_load_file(path, 0, &jerr);
    assert_true(json_array_size(cases) >= 20);
    json_array_foreach(cases, i, g)
    {
        const char *text = json_string_value(json_object_get(g, "text"));
        int32_t *want;
        size_t n = ids_from_json(json_object_get(g, "ids"), &want);
        expect_ids(tok, text, false, want, n);
        expect_ids(tok, text, true, want, n); /* no BOS: TikTokenTokenizer adds none */
        char *dec = decode_str(tok, want, n, false);
        assert_string_equal(dec, text);
        free(dec);
        free(want);
    }
    /* what the rules give on this vocabulary: a Han run is its own piece and whole-piece tokens
     * win ("xyz" has no two-token split), merges go lowest rank first */
    expect_ids(tok, "xyz", false, (const int32_t[]){2049}, 1);
    expect_ids(tok, "中文abc", false, (const int32_t[]){2046, 902, 99}, 3);
    expect_ids(tok, "<|im_end|>xyz", false, (const int32_t[]){2054, 2049}, 2);
    char *dec = decode_str(tok, (const int32_t[]){2054, 2049}, 2, true);
    assert_string_equal(dec, "xyz");
    free(dec);
    json_decref(cases);
    tokenizer_destroy(tok);
}

static void test_tiktoken_malformed(void **state)
{
    (void)state;
    /* the 256 bytes, then one merged token "ab" (rank 256) */
    char model[8192];
    size_t n = 0;
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int b = 0; b < 256; b++)
        n += (size_t)snprintf(model + n, sizeof model - n, "%c%c== %d\n", b64[b >> 2],
                              b64[(b & 3) << 4], b);
    tokenizer_t *tok = NULL;
    const char *ab = "YWI= 256\n";
    char good[8300];
    snprintf(good, sizeof good, "%s%s", model, ab);
    assert_int_equal(tokenizer_load_tiktoken_buffer(good, strlen(good), NULL, 0, "t", &tok), PD_OK);
    expect_ids(tok, "abab", false, (const int32_t[]){256, 256}, 2);
    assert_string_equal(tokenizer_id_to_token(tok, 257), "<|reserved_token_257|>");
    tokenizer_destroy(tok);
    tok = NULL;
    static const char *const bad[] = {
        "YWI= 256\n", /* bytes missing */
        "YWI 256\n",  /* appended below the bytes: not base64 (length) */
        "Y@I= 256\n", /* not base64 */
        "YWI=\n",     /* no rank */
        "YWI= 255\n", /* rank given twice */
        "YQ== 256\n", /* token given twice ("a") */
        "YWI= -3\n",  /* negative rank */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[8300];
        if (i == 0)
            snprintf(buf, sizeof buf, "%s", bad[i]);
        else
            snprintf(buf, sizeof buf, "%s%s", model, bad[i]);
        assert_int_equal(tokenizer_load_tiktoken_buffer(buf, strlen(buf), NULL, 0, "t", &tok),
                         PD_ERR_FORMAT);
        assert_null(tok);
    }
    assert_int_equal(tokenizer_load_tiktoken_buffer(good, strlen(good), "{", 1, "t", &tok),
                     PD_ERR_FORMAT);
    assert_int_equal(tokenizer_load_dir("/nonexistent", &tok), PD_ERR_IO);
    assert_null(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_tiny_llama),
        cmocka_unit_test(test_golden_tiny_moe),
        cmocka_unit_test(test_merges_spellings),
        cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_special_in_text_fixture),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_bytelevel_regex),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_stream_multibyte),
        cmocka_unit_test(test_empty_and_range),
        cmocka_unit_test(test_tiktoken_golden),
        cmocka_unit_test(test_tiktoken_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
