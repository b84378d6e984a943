/* Tests common/safetensors.c: the real fixtures, write/read roundtrip, sharded checkpoints, and
 * one crafted buffer per validation rule, each checking its specific status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "safetensors.h"

/* ==== helpers ==== */

/* A buffer of the 8-byte length hlen, the header text, then data_len bytes 0..255 repeating. */
static uint8_t *make_raw(uint64_t hlen, const char *header, size_t data_len, size_t *len_p)
{
    size_t n = strlen(header), len = 8 + n + data_len;
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, n);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + n + i] = (uint8_t)i;
    *len_p = len;
    return buf;
}

static uint8_t *make_buf(const char *header, size_t data_len, size_t *len_p)
{
    return make_raw(strlen(header), header, data_len, len_p);
}

/* Opens header + data_len bytes from memory and returns the status (closing on success). */
static pd_status_t open_header(const char *header, size_t data_len)
{
    size_t len;
    uint8_t *buf = make_buf(header, data_len, &len);
    safetensors_t *st = (safetensors_t *)0x1;
    pd_status_t rc = safetensors_open_memory(buf, len, "crafted", &st);
    if (rc == PD_OK)
        safetensors_close(st);
    else
        assert_ptr_equal(st, (safetensors_t *)0x1); /* output untouched on failure */
    free(buf);
    return rc;
}

static char *models_path(const char *rel)
{
    const char *dir = getenv("PD_MODELS_DIR");
    char *p;
    assert_non_null(dir);
    p = malloc(strlen(dir) + strlen(rel) + 2);
    assert_non_null(p);
    sprintf(p, "%s/%s", dir, rel);
    return p;
}

static char tmpdir[] = "/tmp/pd_st_test_XXXXXX";

static int setup_tmp(void **state)
{
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state)
{
    char cmd[128];
    (void)state;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd);
}

static char *tmp_path(const char *sub, const char *name)
{
    char *p = malloc(strlen(tmpdir) + strlen(sub) + strlen(name) + 3);
    assert_non_null(p);
    sprintf(p, "%s/%s%s%s", tmpdir, sub, sub[0] ? "/" : "", name);
    return p;
}

static uint16_t bf16_at(const safetensors_tensor_t *t, size_t i)
{
    uint16_t v;
    memcpy(&v, (const uint8_t *)t->data + 2 * i, 2);
    return v;
}

/* ==== fixtures ==== */

static void check_fixture(const char *model, size_t count, uint16_t embed0, uint16_t norm0)
{
    char *dir = models_path(model);
    safetensors_t *st = NULL;
    const safetensors_tensor_t *t;
    static const int64_t embed_shape[] = {2048, 512}, wrong[] = {1024};

    assert_int_equal(safetensors_open_model(dir, &st), PD_OK);
    assert_int_equal(safetensors_count(st), count);
    assert_string_equal(safetensors_metadata(st, "format"), "pt");
    assert_null(safetensors_metadata(st, "nope"));

    assert_int_equal(
        safetensors_get(st, "model.embed_tokens.weight", PD_DTYPE_BF16, 2, embed_shape, &t), PD_OK);
    assert_int_equal(t->nbytes, 2048 * 512 * 2);
    assert_int_equal(bf16_at(t, 0), embed0);
    t = safetensors_find(st, "model.norm.weight");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->shape[0], 512);
    assert_int_equal(bf16_at(t, 0), norm0);

    /* expected-vs-found errors */
    assert_int_equal(safetensors_get(st, "model.norm.weight", PD_DTYPE_BF16, 1, wrong, &t),
                     PD_ERR_FORMAT);
    assert_int_equal(safetensors_get(st, "model.norm.weight", PD_DTYPE_F32, 1, embed_shape + 1, &t),
                     PD_ERR_FORMAT);
    assert_int_equal(safetensors_get(st, "model.norm.weight", PD_DTYPE_BF16, 2, embed_shape, &t),
                     PD_ERR_FORMAT);
    assert_int_equal(safetensors_get(st, "model.nope", PD_DTYPE_BF16, 1, wrong, &t),
                     PD_ERR_NOT_FOUND);

    /* every tensor is findable, in data order, inside the file */
    const uint8_t *prev_end = NULL;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const safetensors_tensor_t *a = safetensors_at(st, i);
        assert_ptr_equal(safetensors_find(st, a->name), a);
        if (prev_end)
            assert_ptr_equal(a->data, prev_end);
        prev_end = (const uint8_t *)a->data + a->nbytes;
    }
    assert_null(safetensors_at(st, safetensors_count(st)));
    safetensors_close(st);

    /* the same file through safetensors_open */
    char *file = models_path(model);
    file = realloc(file, strlen(file) + sizeof "/model.safetensors");
    strcat(file, "/model.safetensors");
    assert_int_equal(safetensors_open(file, &st), PD_OK);
    assert_int_equal(safetensors_count(st), count);
    safetensors_close(st);
    free(file);
    free(dir);
}

static void test_fixture_llama(void **state)
{
    (void)state;
    check_fixture("tiny-llama", 39, 0x3bc3, 0x3f95);
}

static void test_fixture_moe(void **state)
{
    safetensors_t *st;
    const safetensors_tensor_t *t;
    static const int64_t gate[] = {8, 512}, qn[] = {128};
    char *dir = models_path("tiny-moe");
    (void)state;

    check_fixture("tiny-moe", 135, 0x3cbd, 0x3f93);
    assert_int_equal(safetensors_open_model(dir, &st), PD_OK);
    assert_int_equal(
        safetensors_get(st, "model.layers.3.mlp.gate.weight", PD_DTYPE_BF16, 2, gate, &t), PD_OK);
    assert_int_equal(bf16_at(t, 0), 0xbd2d);
    assert_int_equal(
        safetensors_get(st, "model.layers.1.self_attn.q_norm.weight", PD_DTYPE_BF16, 1, qn, &t),
        PD_OK);
    assert_int_equal(bf16_at(t, 0), 0x3f88);
    safetensors_close(st);
    free(dir);
}

static void test_open_missing(void **state)
{
    safetensors_t *st = NULL;
    (void)state;
    assert_int_equal(safetensors_open("/nonexistent/model.safetensors", &st), PD_ERR_IO);
    assert_int_equal(safetensors_open_model("/nonexistent", &st), PD_ERR_IO);
    assert_null(st);
}

/* ==== crafted headers ==== */

static void test_valid_minimal(void **state)
{
    size_t len;
    safetensors_t *st;
    uint8_t *buf;
    const safetensors_tensor_t *t;
    (void)state;

    assert_int_equal(open_header("{}", 0), PD_OK);
    assert_int_equal(open_header("{}   ", 0), PD_OK); /* space padding */
    /* zero-size tensors share an offset; listed out of data order */
    buf = make_buf("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                   "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
                   "\"a\":{\"dtype\":\"U8\",\"shape\":[2,2],\"data_offsets\":[0,4]},"
                   "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[12,20]},"
                   "\"__metadata__\":{\"k\":\"v\"}}",
                   20, &len);
    assert_int_equal(safetensors_open_memory(buf, len, NULL, &st), PD_OK);
    assert_int_equal(safetensors_count(st), 4);
    assert_string_equal(safetensors_at(st, 0)->name, "a");
    assert_string_equal(safetensors_at(st, 3)->name, "s");
    assert_string_equal(safetensors_metadata(st, "k"), "v");
    t = safetensors_find(st, "b");
    assert_non_null(t);
    assert_int_equal(t->dtype, PD_DTYPE_F32);
    assert_int_equal(t->nbytes, 8);
    assert_ptr_equal(t->data, buf + len - 16);
    assert_int_equal(((const uint8_t *)t->data)[0], 4);
    t = safetensors_find(st, "s");
    assert_int_equal(t->n_dims, 0);
    assert_int_equal(t->nbytes, 8);
    assert_int_equal(safetensors_get(st, "s", PD_DTYPE_I64, 0, NULL, &t), PD_OK);
    assert_null(safetensors_find(st, "c"));
    safetensors_close(st);
    free(buf);
}

static void test_bad_length(void **state)
{
    size_t len;
    uint8_t *buf;
    safetensors_t *st;
    (void)state;

    buf = make_buf("{}", 0, &len);
    for (size_t n = 0; n < 8; n++)
        assert_int_equal(safetensors_open_memory(buf, n, "short", &st), PD_ERR_FORMAT);
    free(buf);
    buf = make_raw(1000, "{}", 10, &len); /* header length larger than the file */
    assert_int_equal(safetensors_open_memory(buf, len, "big", &st), PD_ERR_FORMAT);
    free(buf);
    buf = make_raw((uint64_t)200 << 20, "{}", 0, &len); /* over the 100 MB bound */
    assert_int_equal(safetensors_open_memory(buf, len, "huge", &st), PD_ERR_FORMAT);
    free(buf);
    buf = make_raw(UINT64_MAX, "{}", 0, &len);
    assert_int_equal(safetensors_open_memory(buf, len, "max", &st), PD_ERR_FORMAT);
    free(buf);
}

#define T(entry) "{\"t\":" entry "}"

static void test_bad_json(void **state)
{
    (void)state;
    assert_int_equal(open_header("{", 0), PD_ERR_FORMAT);
    assert_int_equal(open_header("", 0), PD_ERR_FORMAT);
    assert_int_equal(open_header("[1,2]", 0), PD_ERR_FORMAT);
    assert_int_equal(open_header("\"x\"", 0), PD_ERR_FORMAT);
    assert_int_equal(open_header("{} x", 0), PD_ERR_FORMAT);
    /* duplicate keys */
    assert_int_equal(open_header("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                                 "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                                 2),
                     PD_ERR_FORMAT);
    /* entry and metadata types */
    assert_int_equal(open_header(T("1"), 0), PD_ERR_FORMAT);
    assert_int_equal(open_header("{\"__metadata__\":{\"k\":1}}", 0), PD_ERR_FORMAT);
    assert_int_equal(open_header("{\"__metadata__\":[]}", 0), PD_ERR_FORMAT);
}

static void test_bad_dtype(void **state)
{
    (void)state;
    assert_int_equal(open_header(T("{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}"), 1),
                     PD_ERR_FORMAT);
    assert_int_equal(open_header(T("{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,1]}"), 1),
                     PD_ERR_FORMAT);
    assert_int_equal(open_header(T("{\"shape\":[1],\"data_offsets\":[0,1]}"), 1), PD_ERR_FORMAT);
}

static void test_bad_shape(void **state)
{
    (void)state;
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}"), 1),
                     PD_ERR_FORMAT);
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"data_offsets\":[0,1]}"), 1), PD_ERR_FORMAT);
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}"), 1),
                     PD_ERR_FORMAT);
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}"), 1),
                     PD_ERR_FORMAT);
    assert_int_equal(
        open_header(T("{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}"), 1),
        PD_ERR_FORMAT);
    /* 8 dims are fine, 9 are too many */
    assert_int_equal(
        open_header(T("{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}"), 1),
        PD_OK);
    assert_int_equal(
        open_header(T("{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}"),
                    1),
        PD_ERR_FORMAT);
    /* element count and byte size overflow */
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
                                   "\"data_offsets\":[0,0]}"),
                                 0),
                     PD_ERR_FORMAT);
    assert_int_equal(open_header(T("{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                                   "\"data_offsets\":[0,0]}"),
                                 0),
                     PD_ERR_FORMAT);
}

static void test_bad_offsets(void **state)
{
    (void)state;
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}"), 1),
                     PD_ERR_FORMAT);
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}"), 1),
                     PD_ERR_FORMAT);
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}"), 1),
                     PD_ERR_FORMAT);
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}"), 1),
                     PD_ERR_FORMAT);
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,0]}"), 1),
                     PD_ERR_FORMAT); /* begin > end */
    /* span != product(shape) * element size */
    assert_int_equal(open_header(T("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}"), 4),
                     PD_ERR_FORMAT);
}

static void test_bad_tiling(void **state)
{
    (void)state;
    /* gap before the first tensor */
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}"), 8),
                     PD_ERR_FORMAT);
    /* gap between tensors */
    assert_int_equal(open_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                                 "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
                                 12),
                     PD_ERR_FORMAT);
    /* overlap */
    assert_int_equal(open_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                                 "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
                                 12),
                     PD_ERR_FORMAT);
    /* identical spans */
    assert_int_equal(open_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                                 "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                                 4),
                     PD_ERR_FORMAT);
    /* truncated file: data area shorter than the last end */
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}"), 7),
                     PD_ERR_FORMAT);
    /* trailing bytes after the last tensor */
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}"), 9),
                     PD_ERR_FORMAT);
    assert_int_equal(open_header("{}", 1), PD_ERR_FORMAT);
    /* exact tiling is fine */
    assert_int_equal(open_header(T("{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}"), 8),
                     PD_OK);
}

/* ==== writing ==== */

static void test_roundtrip(void **state)
{
    float w[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[3] = {0x3f80, 0x4000, 0xbf80};
    int64_t i64 = -7;
    safetensors_tensor_t in[] = {
        {.name = "w",
         .dtype = PD_DTYPE_F32,
         .n_dims = 2,
         .shape = {2, 3},
         .data = w,
         .nbytes = sizeof w},
        {.name = "empty", .dtype = PD_DTYPE_BF16, .n_dims = 2, .shape = {0, 4}, .nbytes = 0},
        {.name = "h",
         .dtype = PD_DTYPE_BF16,
         .n_dims = 1,
         .shape = {3},
         .data = h,
         .nbytes = sizeof h},
        {.name = "scalar", .dtype = PD_DTYPE_I64, .n_dims = 0, .data = &i64, .nbytes = 8},
    };
    const char *meta[] = {"format", "pt", "note", "q\"uote"};
    char *path = tmp_path("", "rt.safetensors"), *tmp = tmp_path("", "rt.safetensors.tmp");
    safetensors_t *st;
    const safetensors_tensor_t *t;
    (void)state;

    assert_int_equal(safetensors_write(path, in, 4, meta, 2), PD_OK);
    assert_int_not_equal(access(tmp, F_OK), 0);
    assert_int_equal(safetensors_open(path, &st), PD_OK);
    assert_int_equal(safetensors_count(st), 4);
    for (size_t i = 0; i < 4; i++) {
        t = safetensors_at(st, i);
        assert_string_equal(t->name, in[i].name); /* written in the given order */
        assert_int_equal(t->dtype, in[i].dtype);
        assert_int_equal(t->n_dims, in[i].n_dims);
        for (int d = 0; d < t->n_dims; d++)
            assert_int_equal(t->shape[d], in[i].shape[d]);
        assert_int_equal(t->nbytes, in[i].nbytes);
        if (t->nbytes)
            assert_memory_equal(t->data, in[i].data, t->nbytes);
    }
    /* data area starts 8-byte aligned in the file (and so in the page-aligned mapping) */
    assert_int_equal((uintptr_t)safetensors_at(st, 0)->data % 8, 0);
    assert_string_equal(safetensors_metadata(st, "format"), "pt");
    assert_string_equal(safetensors_metadata(st, "note"), "q\"uote");
    safetensors_close(st);

    /* no metadata, no tensors */
    assert_int_equal(safetensors_write(path, NULL, 0, NULL, 0), PD_OK);
    assert_int_equal(safetensors_open(path, &st), PD_OK);
    assert_int_equal(safetensors_count(st), 0);
    assert_null(safetensors_metadata(st, "format"));
    safetensors_close(st);
    free(path);
    free(tmp);
}

static void test_write_invalid(void **state)
{
    float w[2] = {1, 2};
    safetensors_tensor_t t[2] = {
        {.name = "a", .dtype = PD_DTYPE_F32, .n_dims = 1, .shape = {2}, .data = w, .nbytes = 8},
        {.name = "a", .dtype = PD_DTYPE_F32, .n_dims = 1, .shape = {2}, .data = w, .nbytes = 8},
    };
    char *path = tmp_path("", "bad.safetensors"), *tmp = tmp_path("", "bad.safetensors.tmp");
    const char *meta[] = {"k", NULL};
    (void)state;

    assert_int_equal(safetensors_write(path, t, 2, NULL, 0), PD_ERR_INVALID); /* duplicate */
    t[1].name = "__metadata__";
    assert_int_equal(safetensors_write(path, t, 2, NULL, 0), PD_ERR_INVALID);
    t[1].name = "";
    assert_int_equal(safetensors_write(path, t, 2, NULL, 0), PD_ERR_INVALID);
    t[1].name = "b";
    t[1].nbytes = 4; /* does not match the shape */
    assert_int_equal(safetensors_write(path, t, 2, NULL, 0), PD_ERR_INVALID);
    t[1].nbytes = 8;
    t[1].n_dims = 9;
    assert_int_equal(safetensors_write(path, t, 2, NULL, 0), PD_ERR_INVALID);
    t[1].n_dims = 1;
    t[1].shape[0] = -2;
    assert_int_equal(safetensors_write(path, t, 2, NULL, 0), PD_ERR_INVALID);
    t[1].shape[0] = 2;
    assert_int_equal(safetensors_write(path, t, 2, meta, 1), PD_ERR_INVALID);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_not_equal(access(tmp, F_OK), 0);
    assert_int_equal(safetensors_write("/nonexistent/x.safetensors", t, 2, NULL, 0), PD_ERR_IO);
    free(path);
    free(tmp);
}

/* ==== sharded ==== */

static const char *shard1 = "model-00001-of-00002.safetensors";
static const char *shard2 = "model-00002-of-00002.safetensors";

/* Writes dir/{shard1: a b, shard2: c (+ d when dup_a: "a" again)} and an index with weight_map. */
static char *make_sharded(const char *sub, bool dup_a, const char *weight_map)
{
    static const uint8_t a[4] = {1, 2, 3, 4}, b[2] = {5, 6}, c[8] = {7, 8, 9, 10, 11, 12, 13, 14};
    safetensors_tensor_t t1[] = {
        {.name = "a", .dtype = PD_DTYPE_U8, .n_dims = 2, .shape = {2, 2}, .data = a, .nbytes = 4},
        {.name = "b", .dtype = PD_DTYPE_I16, .n_dims = 1, .shape = {1}, .data = b, .nbytes = 2},
    };
    safetensors_tensor_t t2[] = {
        {.name = "c", .dtype = PD_DTYPE_F64, .n_dims = 1, .shape = {1}, .data = c, .nbytes = 8},
        {.name = "a", .dtype = PD_DTYPE_U8, .n_dims = 2, .shape = {2, 2}, .data = a, .nbytes = 4},
    };
    const char *meta[] = {"format", "pt"};
    char *dir = tmp_path("", sub), *p;
    FILE *f;

    assert_int_equal(mkdir(dir, 0700), 0);
    p = tmp_path(sub, shard1);
    assert_int_equal(safetensors_write(p, t1, 2, meta, 1), PD_OK);
    free(p);
    p = tmp_path(sub, shard2);
    assert_int_equal(safetensors_write(p, t2, dup_a ? 2 : 1, NULL, 0), PD_OK);
    free(p);
    p = tmp_path(sub, "model.safetensors.index.json");
    f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"metadata\": {\"total_size\": 14}, \"weight_map\": %s}\n", weight_map);
    fclose(f);
    free(p);
    return dir;
}

#define WM(a, b, c)                                                                                \
    "{\"a\": \"model-0000" a "-of-00002.safetensors\", \"b\": \"model-0000" b                      \
    "-of-00002.safetensors\", \"c\": \"model-0000" c "-of-00002.safetensors\"}"

static void test_sharded(void **state)
{
    char *dir = make_sharded("ok", false, WM("1", "1", "2"));
    safetensors_t *st;
    const safetensors_tensor_t *t;
    static const int64_t shape_a[] = {2, 2};
    (void)state;

    assert_int_equal(safetensors_open_model(dir, &st), PD_OK);
    assert_int_equal(safetensors_count(st), 3);
    assert_int_equal(safetensors_get(st, "a", PD_DTYPE_U8, 2, shape_a, &t), PD_OK);
    assert_int_equal(((const uint8_t *)t->data)[3], 4);
    t = safetensors_find(st, "c");
    assert_non_null(t);
    assert_int_equal(t->dtype, PD_DTYPE_F64);
    assert_int_equal(((const uint8_t *)t->data)[0], 7);
    assert_string_equal(safetensors_at(st, 2)->name, "c"); /* shards in index order */
    assert_string_equal(safetensors_metadata(st, "format"), "pt");
    safetensors_close(st);
    free(dir);
}

static void test_sharded_bad(void **state)
{
    safetensors_t *st = NULL;
    char *dir;
    (void)state;

    /* index names a shard that does not exist */
    dir = make_sharded("missing", false, WM("1", "1", "3"));
    assert_int_equal(safetensors_open_model(dir, &st), PD_ERR_IO);
    free(dir);
    /* tensor listed in the index but absent from its shard */
    dir = make_sharded("absent", false,
                       "{\"a\": \"model-00001-of-00002.safetensors\", \"d\": "
                       "\"model-00002-of-00002.safetensors\"}");
    assert_int_equal(safetensors_open_model(dir, &st), PD_ERR_NOT_FOUND);
    free(dir);
    /* tensor in a different shard than the index says */
    dir = make_sharded("wrong", false, WM("2", "1", "2"));
    assert_int_equal(safetensors_open_model(dir, &st), PD_ERR_FORMAT);
    free(dir);
    /* same tensor in two shards */
    dir = make_sharded("dup", true, WM("1", "1", "2"));
    assert_int_equal(safetensors_open_model(dir, &st), PD_ERR_FORMAT);
    free(dir);
    /* malformed index */
    dir = make_sharded("badjson", false, "{\"a\": ");
    assert_int_equal(safetensors_open_model(dir, &st), PD_ERR_FORMAT);
    free(dir);
    dir = make_sharded("nomap", false, "[]");
    assert_int_equal(safetensors_open_model(dir, &st), PD_ERR_FORMAT);
    free(dir);
    dir = make_sharded("emptymap", false, "{}");
    assert_int_equal(safetensors_open_model(dir, &st), PD_ERR_FORMAT);
    free(dir);
    dir = make_sharded("escape", false, "{\"a\": \"../x.safetensors\"}");
    assert_int_equal(safetensors_open_model(dir, &st), PD_ERR_FORMAT);
    free(dir);
    assert_null(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_llama), cmocka_unit_test(test_fixture_moe),
        cmocka_unit_test(test_open_missing),  cmocka_unit_test(test_valid_minimal),
        cmocka_unit_test(test_bad_length),    cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_bad_dtype),     cmocka_unit_test(test_bad_shape),
        cmocka_unit_test(test_bad_offsets),   cmocka_unit_test(test_bad_tiling),
        cmocka_unit_test(test_roundtrip),     cmocka_unit_test(test_write_invalid),
        cmocka_unit_test(test_sharded),       cmocka_unit_test(test_sharded_bad),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
