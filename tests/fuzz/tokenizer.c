/* Fuzz target for common/tokenizer.h: encodes the input with the tiny-llama tokenizer; valid UTF-8
 * must round-trip exactly through decode (special tokens kept), invalid UTF-8 must be refused; the
 * streaming decoder must agree with decode, also on arbitrary id sequences made from the input.
 * The tokenizer is found through PD_MODELS_DIR, else the fixture path compiled in.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

#ifndef PD_FUZZ_MODELS_DIR
#define PD_FUZZ_MODELS_DIR "deploy/models"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const tokenizer_t *fuzz_tokenizer(void)
{
    static tokenizer_t *tok;
    if (!tok) {
        const char *dir = getenv("PD_MODELS_DIR");
        char path[4096];
        snprintf(path, sizeof path, "%s/tiny-llama/tokenizer.json", dir ? dir : PD_FUZZ_MODELS_DIR);
        PD_ASSERT(tokenizer_load(path, &tok) == PD_OK);
    }
    return tok;
}

/* decode(ids) and the concatenated stream deltas must be the same text */
static void check_stream(const tokenizer_t *tok, const int32_t *ids, size_t n, bool skip,
                         const char *want, size_t want_len)
{
    tokenizer_stream_t *s;
    char *acc = malloc(want_len + 1), *delta;
    size_t acc_len = 0, len;

    PD_ASSERT(acc);
    PD_ASSERT(tokenizer_stream_create(tok, skip, &s) == PD_OK);
    for (size_t i = 0; i <= n; i++) {
        if (i < n)
            PD_ASSERT(tokenizer_stream_push(s, ids[i], &delta, &len) == PD_OK);
        else
            PD_ASSERT(tokenizer_stream_flush(s, &delta, &len) == PD_OK);
        PD_ASSERT(strlen(delta) == len || memchr(delta, 0, len));
        PD_ASSERT(acc_len + len <= want_len);
        memcpy(acc + acc_len, delta, len);
        acc_len += len;
        free(delta);
    }
    PD_ASSERT(acc_len == want_len && memcmp(acc, want, want_len) == 0);
    tokenizer_stream_destroy(s);
    free(acc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const tokenizer_t *tok = fuzz_tokenizer();
    const char *text = (const char *)data;
    int32_t *ids;
    size_t n, len, bad;
    char *out;

    bool valid = tokenizer_utf8_valid(text, size, &bad);
    pd_status_t st = tokenizer_encode(tok, text, size, false, &ids, &n);
    if (!valid) {
        PD_ASSERT(st == PD_ERR_INVALID && bad < size);
    } else {
        PD_ASSERT(st == PD_OK);
        for (size_t i = 0; i < n; i++)
            PD_ASSERT(tokenizer_id_to_token(tok, ids[i]) != NULL);
        PD_ASSERT(tokenizer_decode(tok, ids, n, false, &out, &len) == PD_OK);
        PD_ASSERT(len == size && memcmp(out, text, size) == 0);
        check_stream(tok, ids, n, false, out, len);
        free(out);
        PD_ASSERT(tokenizer_decode(tok, ids, n, true, &out, &len) == PD_OK);
        PD_ASSERT(len <= size);
        check_stream(tok, ids, n, true, out, len);
        free(out);
        free(ids);
    }

    /* arbitrary ids (two bytes each): decode and stream agree, output is valid UTF-8 */
    size_t nr = size / 2;
    int32_t *raw = malloc((nr + 1) * sizeof *raw);
    PD_ASSERT(raw);
    for (size_t i = 0; i < nr; i++)
        raw[i] = (int32_t)((data[2 * i] | data[2 * i + 1] << 8) % tokenizer_vocab_size(tok));
    for (int skip = 0; skip < 2; skip++) {
        PD_ASSERT(tokenizer_decode(tok, raw, nr, skip, &out, &len) == PD_OK);
        PD_ASSERT(tokenizer_utf8_valid(out, len, NULL));
        check_stream(tok, raw, nr, skip, out, len);
        free(out);
    }
    free(raw);
    return 0;
}
