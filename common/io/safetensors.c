#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define SAFETENSORS__MAX_HEADER ((uint64_t)100 << 20) /* 100 MB, as the reference implementation   \
                                                       */
#define SAFETENSORS__MAX_INDEX ((size_t)64 << 20)

typedef struct {
    char *path; /* label used in messages (the path as given, or the memory name) */
    void *map;  /* mmap'ed file, NULL for caller-owned memory */
    size_t map_len;
} safetensors__shard_t;

typedef struct {
    const char *name;
    size_t idx;
} safetensors__key_t;

struct safetensors {
    char *label; /* file, directory or memory name for messages about the whole view */
    safetensors__shard_t *shards;
    size_t n_shards;
    safetensors_tensor_t *tensors; /* names owned (malloc'ed) */
    size_t *tensor_shard;          /* (n_tensors) index into shards */
    size_t n_tensors, cap_tensors;
    safetensors__key_t *sorted; /* (n_tensors) by name */
    char **meta;                /* (2 * n_meta) key, value, ... owned */
    size_t n_meta;
};

/* ==== small helpers ==== */

static char *safetensors__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static int safetensors__cmp_key(const void *a, const void *b)
{
    return strcmp(((const safetensors__key_t *)a)->name, ((const safetensors__key_t *)b)->name);
}

static int safetensors__cmp_offset(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b; /* {begin, end, idx} */
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    if (x[1] != y[1])
        return x[1] < y[1] ? -1 : 1;
    return x[2] < y[2] ? -1 : x[2] > y[2];
}

static void safetensors__format_shape(char *buf, size_t size, int n_dims, const int64_t *shape)
{
    size_t off = 0;
    int n = snprintf(buf, size, "[");
    off = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < n_dims && off < size; i++) {
        n = snprintf(buf + off, size - off, "%s%" PRId64, i ? ", " : "", shape[i]);
        off += n > 0 ? (size_t)n : 0;
    }
    if (off < size)
        snprintf(buf + off, size - off, "]");
}

static safetensors_t *safetensors__alloc(const char *label)
{
    safetensors_t *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->label = safetensors__strdup(label);
    if (!st->label) {
        free(st);
        return NULL;
    }
    return st;
}

static pd_status_t safetensors__add_shard(safetensors_t *st, const char *path, void *map,
                                          size_t map_len)
{
    safetensors__shard_t *s = realloc(st->shards, (st->n_shards + 1) * sizeof *s);
    if (!s)
        return PD_ERR_NOMEM;
    st->shards = s;
    s[st->n_shards].path = safetensors__strdup(path);
    if (!s[st->n_shards].path)
        return PD_ERR_NOMEM;
    s[st->n_shards].map = map;
    s[st->n_shards].map_len = map_len;
    st->n_shards++;
    return PD_OK;
}

static pd_status_t safetensors__reserve(safetensors_t *st, size_t extra)
{
    size_t need = st->n_tensors + extra, cap = st->cap_tensors ? st->cap_tensors : 16;
    if (need <= st->cap_tensors && st->tensors)
        return PD_OK; /* an empty file still gets arrays: memcpy and qsort need non-NULL */
    while (cap < need)
        cap *= 2;
    safetensors_tensor_t *t = realloc(st->tensors, cap * sizeof *t);
    if (!t)
        return PD_ERR_NOMEM;
    st->tensors = t;
    size_t *sh = realloc(st->tensor_shard, cap * sizeof *sh);
    if (!sh)
        return PD_ERR_NOMEM;
    st->tensor_shard = sh;
    st->cap_tensors = cap;
    return PD_OK;
}

/* ==== header parsing ==== */

/* Parses one tensor entry into *t (name not set). */
static pd_status_t safetensors__parse_entry(const char *file, const char *name, json_t *v,
                                            safetensors_tensor_t *t, uint64_t *begin_p,
                                            uint64_t *end_p)
{
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *offs = json_object_get(v, "data_offsets");
    uint64_t elems = 1, bytes, begin, end;
    size_t i;

    if (!json_is_object(v)) {
        pd_log_error("%s: tensor %s: entry is not an object", file, name);
        return PD_ERR_FORMAT;
    }
    if (!json_is_string(dt)) {
        pd_log_error("%s: tensor %s: dtype missing or not a string", file, name);
        return PD_ERR_FORMAT;
    }
    if (pd_dtype_parse(json_string_value(dt), &t->dtype) != 0) {
        pd_log_error("%s: tensor %s: unknown dtype \"%s\"", file, name, json_string_value(dt));
        return PD_ERR_FORMAT;
    }
    if (!json_is_array(shape)) {
        pd_log_error("%s: tensor %s: shape missing or not a list", file, name);
        return PD_ERR_FORMAT;
    }
    if (json_array_size(shape) > SAFETENSORS_MAX_DIMS) {
        pd_log_error("%s: tensor %s: shape has %zu dims, at most %d supported", file, name,
                     json_array_size(shape), SAFETENSORS_MAX_DIMS);
        return PD_ERR_FORMAT;
    }
    t->n_dims = (int)json_array_size(shape);
    for (i = 0; i < json_array_size(shape); i++) {
        json_t *e = json_array_get(shape, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0) {
            pd_log_error("%s: tensor %s: shape[%zu] is not a non-negative integer", file, name, i);
            return PD_ERR_FORMAT;
        }
        t->shape[i] = json_integer_value(e);
        if (__builtin_mul_overflow(elems, (uint64_t)t->shape[i], &elems)) {
            pd_log_error("%s: tensor %s: shape element count overflows", file, name);
            return PD_ERR_FORMAT;
        }
    }
    for (; i < SAFETENSORS_MAX_DIMS; i++)
        t->shape[i] = 0;
    if (__builtin_mul_overflow(elems, (uint64_t)pd_dtype_size(t->dtype), &bytes) ||
        bytes > SIZE_MAX) {
        pd_log_error("%s: tensor %s: shape byte size overflows", file, name);
        return PD_ERR_FORMAT;
    }
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)) ||
        json_integer_value(json_array_get(offs, 0)) < 0 ||
        json_integer_value(json_array_get(offs, 1)) < 0) {
        pd_log_error("%s: tensor %s: data_offsets is not [begin, end] of non-negative integers",
                     file, name);
        return PD_ERR_FORMAT;
    }
    begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
    end = (uint64_t)json_integer_value(json_array_get(offs, 1));
    if (begin > end) {
        pd_log_error("%s: tensor %s: data_offsets begin %" PRIu64 " > end %" PRIu64, file, name,
                     begin, end);
        return PD_ERR_FORMAT;
    }
    if (end - begin != bytes) {
        char sh[160];
        safetensors__format_shape(sh, sizeof sh, t->n_dims, t->shape);
        pd_log_error("%s: tensor %s: data_offsets span %" PRIu64 " bytes != %" PRIu64
                     " for %s shape %s",
                     file, name, end - begin, bytes, pd_dtype_name(t->dtype), sh);
        return PD_ERR_FORMAT;
    }
    t->nbytes = (size_t)bytes;
    *begin_p = begin;
    *end_p = end;
    return PD_OK;
}

static pd_status_t safetensors__parse_metadata(safetensors_t *st, const char *file, json_t *v)
{
    const char *key;
    json_t *val;

    if (!json_is_object(v)) {
        pd_log_error("%s: __metadata__ is not an object", file);
        return PD_ERR_FORMAT;
    }
    json_object_foreach(v, key, val)
    {
        if (!json_is_string(val)) {
            pd_log_error("%s: __metadata__: value of \"%s\" is not a string", file, key);
            return PD_ERR_FORMAT;
        }
        if (safetensors_metadata(st, key))
            continue; /* first shard wins */
        char **m = realloc(st->meta, (st->n_meta + 1) * 2 * sizeof *m);
        if (!m)
            return PD_ERR_NOMEM;
        st->meta = m;
        m[2 * st->n_meta] = safetensors__strdup(key);
        m[2 * st->n_meta + 1] = safetensors__strdup(json_string_value(val));
        st->n_meta++;
        if (!m[2 * st->n_meta - 2] || !m[2 * st->n_meta - 1])
            return PD_ERR_NOMEM;
    }
    return PD_OK;
}

/* Checks that the sorted spans tile [0, data_len) exactly. spans: (n, 3) {begin, end, idx}. */
static pd_status_t safetensors__check_tiling(const safetensors_t *st, const char *file,
                                             const uint64_t *spans, size_t n, uint64_t data_len)
{
    uint64_t pos = 0;
    size_t base = st->n_tensors;

    for (size_t i = 0; i < n; i++) {
        const char *name = st->tensors[base + spans[3 * i + 2]].name;
        if (spans[3 * i] > pos) {
            pd_log_error("%s: tensor %s: gap in data area, begins at %" PRIu64
                         " but previous data ends at %" PRIu64,
                         file, name, spans[3 * i], pos);
            return PD_ERR_FORMAT;
        }
        if (spans[3 * i] < pos) {
            pd_log_error("%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                         "] overlap the previous tensor (ends at %" PRIu64 ")",
                         file, name, spans[3 * i], spans[3 * i + 1], pos);
            return PD_ERR_FORMAT;
        }
        if (spans[3 * i + 1] > data_len) {
            pd_log_error("%s: tensor %s: truncated file, data ends at %" PRIu64
                         " but the data area has %" PRIu64 " bytes",
                         file, name, spans[3 * i + 1], data_len);
            return PD_ERR_FORMAT;
        }
        pos = spans[3 * i + 1];
    }
    if (pos != data_len) {
        pd_log_error("%s: data area has %" PRIu64 " bytes but tensors cover %" PRIu64
                     " (trailing bytes)",
                     file, data_len, pos);
        return PD_ERR_FORMAT;
    }
    return PD_OK;
}

/* Parses buf[0..len) as one safetensors file belonging to shard st->n_shards - 1 and appends its
 * tensors (in data order). On failure st->n_tensors is unchanged (names freed). */
static pd_status_t safetensors__parse(safetensors_t *st, const char *file, const uint8_t *buf,
                                      size_t len)
{
    uint64_t hlen = 0, data_len, *spans = NULL;
    json_error_t jerr;
    json_t *root, *v;
    const char *key;
    size_t n = 0, base = st->n_tensors, shard = st->n_shards - 1;
    safetensors_tensor_t *tmp = NULL;
    pd_status_t rc;

    if (len < 8) {
        pd_log_error("%s: file too short (%zu bytes, need at least 8 for the header length)", file,
                     len);
        return PD_ERR_FORMAT;
    }
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (hlen > SAFETENSORS__MAX_HEADER) {
        pd_log_error("%s: header length %" PRIu64 " exceeds the 100 MB bound", file, hlen);
        return PD_ERR_FORMAT;
    }
    if (hlen > len - 8) {
        pd_log_error("%s: header length %" PRIu64 " larger than the file (%zu bytes after the "
                     "length)",
                     file, hlen, len - 8);
        return PD_ERR_FORMAT;
    }
    data_len = len - 8 - hlen;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        pd_log_error("%s: header is not valid json: %s (at byte %d)", file, jerr.text,
                     jerr.position);
        return PD_ERR_FORMAT;
    }
    if (!json_is_object(root)) {
        pd_log_error("%s: header is not a json object", file);
        rc = PD_ERR_FORMAT;
        goto err_free_json;
    }
    rc = safetensors__reserve(st, json_object_size(root));
    if (rc)
        goto err_free_json;
    spans = malloc((json_object_size(root) + 1) * 3 * sizeof *spans);
    if (!spans) {
        rc = PD_ERR_NOMEM;
        goto err_free_json;
    }
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) {
            rc = safetensors__parse_metadata(st, file, v);
            if (rc)
                goto err_free_names;
            continue;
        }
        safetensors_tensor_t *t = &st->tensors[base + n];
        rc = safetensors__parse_entry(file, key, v, t, &spans[3 * n], &spans[3 * n + 1]);
        if (rc)
            goto err_free_names;
        t->name = safetensors__strdup(key);
        if (!t->name) {
            rc = PD_ERR_NOMEM;
            goto err_free_names;
        }
        spans[3 * n + 2] = n;
        n++;
    }
    qsort(spans, n, 3 * sizeof *spans, safetensors__cmp_offset);
    rc = safetensors__check_tiling(st, file, spans, n, data_len);
    if (rc)
        goto err_free_names;
    /* reorder into data order and point into the buffer */
    tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!tmp) {
        rc = PD_ERR_NOMEM;
        goto err_free_names;
    }
    for (size_t i = 0; i < n; i++) {
        tmp[i] = st->tensors[base + spans[3 * i + 2]];
        tmp[i].data = buf + 8 + hlen + spans[3 * i];
    }
    memcpy(st->tensors + base, tmp, n * sizeof *tmp);
    for (size_t i = 0; i < n; i++)
        st->tensor_shard[base + i] = shard;
    st->n_tensors += n;
    free(tmp);
    free(spans);
    json_decref(root);
    return PD_OK;

err_free_names:
    for (size_t i = 0; i < n; i++)
        free((char *)st->tensors[base + i].name);
    free(spans);
err_free_json:
    json_decref(root);
    return rc;
}

/* Builds the name index; a name in two shards is an error. */
static pd_status_t safetensors__finish(safetensors_t *st)
{
    st->sorted = malloc((st->n_tensors ? st->n_tensors : 1) * sizeof *st->sorted);
    if (!st->sorted)
        return PD_ERR_NOMEM;
    for (size_t i = 0; i < st->n_tensors; i++) {
        st->sorted[i].name = st->tensors[i].name;
        st->sorted[i].idx = i;
    }
    qsort(st->sorted, st->n_tensors, sizeof *st->sorted, safetensors__cmp_key);
    for (size_t i = 1; i < st->n_tensors; i++) {
        if (strcmp(st->sorted[i - 1].name, st->sorted[i].name) == 0) {
            size_t a = st->sorted[i - 1].idx, b = st->sorted[i].idx;
            pd_log_error("%s: tensor %s: present in two shards, %s and %s", st->label,
                         st->sorted[i].name, st->shards[st->tensor_shard[a]].path,
                         st->shards[st->tensor_shard[b]].path);
            return PD_ERR_FORMAT;
        }
    }
    return PD_OK;
}

/* ==== opening ==== */

/* Maps path as a new shard of st and parses it. */
static pd_status_t safetensors__map_file(safetensors_t *st, const char *path)
{
    struct stat sb;
    void *map = NULL;
    size_t len;
    pd_status_t rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        pd_log_error("%s: cannot open: %s", path, strerror(errno));
        return PD_ERR_IO;
    }
    if (fstat(fd, &sb) != 0) {
        pd_log_error("%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return PD_ERR_IO;
    }
    if (!S_ISREG(sb.st_mode)) {
        pd_log_error("%s: not a regular file", path);
        close(fd);
        return PD_ERR_IO;
    }
    len = (size_t)sb.st_size;
    if (len >= 8) { /* shorter files are reported by the parser */
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            pd_log_error("%s: cannot mmap %zu bytes: %s", path, len, strerror(errno));
            close(fd);
            return PD_ERR_IO;
        }
    }
    close(fd);
    rc = safetensors__add_shard(st, path, map, len);
    if (rc) {
        if (map)
            munmap(map, len);
        return rc;
    }
    return safetensors__parse(st, path, map, map ? len : (size_t)sb.st_size);
}

pd_status_t safetensors_open(const char *path, safetensors_t **st_p)
{
    safetensors_t *st = safetensors__alloc(path);
    pd_status_t rc;

    if (!st)
        return PD_ERR_NOMEM;
    rc = safetensors__map_file(st, path);
    if (rc == PD_OK)
        rc = safetensors__finish(st);
    if (rc) {
        safetensors_close(st);
        return rc;
    }
    *st_p = st;
    return PD_OK;
}

pd_status_t safetensors_open_memory(const void *buf, size_t len, const char *name,
                                    safetensors_t **st_p)
{
    const char *label = name ? name : "<memory>";
    safetensors_t *st = safetensors__alloc(label);
    pd_status_t rc;

    if (!st)
        return PD_ERR_NOMEM;
    rc = safetensors__add_shard(st, label, NULL, 0);
    if (rc == PD_OK)
        rc = safetensors__parse(st, label, buf, len);
    if (rc == PD_OK)
        rc = safetensors__finish(st);
    if (rc) {
        safetensors_close(st);
        return rc;
    }
    *st_p = st;
    return PD_OK;
}

/* Reads a whole small file into a NUL-terminated buffer. */
static pd_status_t safetensors__read_text(const char *path, char **buf_p, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long size;

    if (!f) {
        pd_log_error("%s: cannot open: %s", path, strerror(errno));
        return PD_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        pd_log_error("%s: cannot read: %s", path, strerror(errno));
        fclose(f);
        return PD_ERR_IO;
    }
    if ((size_t)size > SAFETENSORS__MAX_INDEX) {
        pd_log_error("%s: %ld bytes, larger than the %zu byte bound", path, size,
                     SAFETENSORS__MAX_INDEX);
        fclose(f);
        return PD_ERR_FORMAT;
    }
    buf = malloc((size_t)size + 1);
    if (!buf) {
        fclose(f);
        return PD_ERR_NOMEM;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        pd_log_error("%s: short read", path);
        free(buf);
        fclose(f);
        return PD_ERR_IO;
    }
    fclose(f);
    buf[size] = 0;
    *buf_p = buf;
    *len_p = (size_t)size;
    return PD_OK;
}

/* Opens every shard named in the index's weight_map and checks the map against them. */
static pd_status_t safetensors__open_index(safetensors_t *st, const char *dir, const char *index)
{
    json_error_t jerr;
    json_t *root, *wmap, *v;
    const char *key;
    char *text, *path = NULL;
    size_t len;
    pd_status_t rc = safetensors__read_text(index, &text, &len);

    if (rc)
        return rc;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) {
        pd_log_error("%s:%d:%d: invalid json: %s", index, jerr.line, jerr.column, jerr.text);
        return PD_ERR_FORMAT;
    }
    wmap = json_object_get(root, "weight_map");
    if (!json_is_object(wmap) || json_object_size(wmap) == 0) {
        pd_log_error("%s: weight_map missing, empty or not an object", index);
        rc = PD_ERR_FORMAT;
        goto err_free_json;
    }
    path = malloc(strlen(dir) + 1 + 4096 + 1);
    if (!path) {
        rc = PD_ERR_NOMEM;
        goto err_free_json;
    }
    /* open each distinct shard once, in order of first mention */
    json_object_foreach(wmap, key, v)
    {
        const char *file = json_string_value(v);
        bool seen = false;
        if (!json_is_string(v) || !file[0] || strchr(file, '/') || strlen(file) > 4096) {
            pd_log_error("%s: weight_map: shard of %s is not a plain file name", index, key);
            rc = PD_ERR_FORMAT;
            goto err_free_path;
        }
        sprintf(path, "%s/%s", dir, file);
        for (size_t i = 0; i < st->n_shards && !seen; i++)
            seen = strcmp(st->shards[i].path, path) == 0;
        if (seen)
            continue;
        rc = safetensors__map_file(st, path);
        if (rc)
            goto err_free_path;
    }
    rc = safetensors__finish(st);
    if (rc)
        goto err_free_path;
    json_object_foreach(wmap, key, v)
    {
        const safetensors_tensor_t *t = safetensors_find(st, key);
        sprintf(path, "%s/%s", dir, json_string_value(v));
        if (!t) {
            pd_log_error("%s: tensor %s: listed in the index but not found in shard %s", index, key,
                         path);
            rc = PD_ERR_NOT_FOUND;
            goto err_free_path;
        }
        const char *got = st->shards[st->tensor_shard[t - st->tensors]].path;
        if (strcmp(got, path) != 0) {
            pd_log_error("%s: tensor %s: index says shard %s but it is in %s", index, key, path,
                         got);
            rc = PD_ERR_FORMAT;
            goto err_free_path;
        }
    }
    if (st->n_tensors != json_object_size(wmap)) {
        for (size_t i = 0; i < st->n_tensors; i++)
            if (!json_object_get(wmap, st->tensors[i].name))
                pd_log_warn("%s: tensor %s in shard %s is not listed in the index", index,
                            st->tensors[i].name, st->shards[st->tensor_shard[i]].path);
    }
    rc = PD_OK;
err_free_path:
    free(path);
err_free_json:
    json_decref(root);
    return rc;
}

pd_status_t safetensors_open_model(const char *dir, safetensors_t **st_p)
{
    size_t n = strlen(dir) + sizeof "/model.safetensors.index.json";
    char *index = malloc(n), *single = malloc(n);
    safetensors_t *st = NULL;
    pd_status_t rc = PD_ERR_NOMEM;

    if (!index || !single)
        goto err_free_names;
    snprintf(index, n, "%s/model.safetensors.index.json", dir);
    snprintf(single, n, "%s/model.safetensors", dir);
    if (access(index, F_OK) == 0) {
        st = safetensors__alloc(index);
        if (!st)
            goto err_free_names;
        rc = safetensors__open_index(st, dir, index);
    } else {
        st = safetensors__alloc(single);
        if (!st)
            goto err_free_names;
        rc = safetensors__map_file(st, single);
        if (rc == PD_OK)
            rc = safetensors__finish(st);
    }
    if (rc)
        goto err_close;
    free(index);
    free(single);
    *st_p = st;
    return PD_OK;

err_close:
    safetensors_close(st);
err_free_names:
    free(index);
    free(single);
    return rc;
}

void safetensors_close(safetensors_t *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n_tensors; i++)
        free((char *)st->tensors[i].name);
    for (size_t i = 0; i < st->n_shards; i++) {
        if (st->shards[i].map && munmap(st->shards[i].map, st->shards[i].map_len) != 0)
            pd_log_error("%s: munmap: %s", st->shards[i].path, strerror(errno));
        free(st->shards[i].path);
    }
    for (size_t i = 0; i < 2 * st->n_meta; i++)
        free(st->meta[i]);
    free(st->meta);
    free(st->sorted);
    free(st->tensor_shard);
    free(st->tensors);
    free(st->shards);
    free(st->label);
    free(st);
}

/* ==== lookup ==== */

size_t safetensors_count(const safetensors_t *st)
{
    return st->n_tensors;
}

const safetensors_tensor_t *safetensors_at(const safetensors_t *st, size_t i)
{
    return i < st->n_tensors ? &st->tensors[i] : NULL;
}

const safetensors_tensor_t *safetensors_find(const safetensors_t *st, const char *name)
{
    safetensors__key_t key = {name, 0}, *hit;

    if (!name || !st->sorted)
        return NULL;
    hit = bsearch(&key, st->sorted, st->n_tensors, sizeof key, safetensors__cmp_key);
    return hit ? &st->tensors[hit->idx] : NULL;
}

const char *safetensors_metadata(const safetensors_t *st, const char *key)
{
    for (size_t i = 0; i < st->n_meta; i++)
        if (st->meta[2 * i] && strcmp(st->meta[2 * i], key) == 0)
            return st->meta[2 * i + 1];
    return NULL;
}

pd_status_t safetensors_get(const safetensors_t *st, const char *name, pd_dtype_t dtype, int n_dims,
                            const int64_t *shape, const safetensors_tensor_t **t_p)
{
    const safetensors_tensor_t *t = safetensors_find(st, name);
    bool same;

    if (!t) {
        pd_log_error("%s: tensor %s: not found", st->label, name);
        return PD_ERR_NOT_FOUND;
    }
    const char *file = st->shards[st->tensor_shard[t - st->tensors]].path;
    if (t->dtype != dtype) {
        pd_log_error("%s: tensor %s: dtype %s != expected %s", file, name, pd_dtype_name(t->dtype),
                     pd_dtype_name(dtype));
        return PD_ERR_FORMAT;
    }
    same = t->n_dims == n_dims;
    for (int i = 0; same && i < n_dims; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char got[160], want[160];
        safetensors__format_shape(got, sizeof got, t->n_dims, t->shape);
        safetensors__format_shape(want, sizeof want,
                                  n_dims < 0                      ? 0
                                  : n_dims > SAFETENSORS_MAX_DIMS ? SAFETENSORS_MAX_DIMS
                                                                  : n_dims,
                                  shape);
        pd_log_error("%s: tensor %s: shape %s != expected %s", file, name, got, want);
        return PD_ERR_FORMAT;
    }
    *t_p = t;
    return PD_OK;
}

/* ==== writing ==== */

/* Builds the header JSON text (unpadded) into *text_p; PD_ERR_INVALID (logged) on a bad argument.
 */
static pd_status_t safetensors__header(const char *path, const safetensors_tensor_t *tensors,
                                       size_t n, const char *const *meta, size_t n_meta_pairs,
                                       char **text_p)
{
    json_t *root = json_object(), *md;
    uint64_t off = 0;
    pd_status_t rc = PD_ERR_NOMEM;

    if (!root)
        return PD_ERR_NOMEM;
    if (n_meta_pairs) {
        md = json_object();
        if (!md || json_object_set_new(root, "__metadata__", md))
            goto err_free_json;
        for (size_t i = 0; i < n_meta_pairs; i++) {
            if (!meta[2 * i] || !meta[2 * i + 1]) {
                pd_log_error("%s: metadata pair %zu has a NULL key or value", path, i);
                rc = PD_ERR_INVALID;
                goto err_free_json;
            }
            if (json_object_set_new(md, meta[2 * i], json_string(meta[2 * i + 1]))) {
                pd_log_error("%s: metadata pair %zu (%s) is not valid utf-8", path, i, meta[2 * i]);
                rc = PD_ERR_INVALID;
                goto err_free_json;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        const safetensors_tensor_t *t = &tensors[i];
        uint64_t elems = 1, bytes;
        json_t *e, *shape;
        rc = PD_ERR_INVALID;
        if (!t->name || !t->name[0] || strcmp(t->name, "__metadata__") == 0 ||
            json_object_get(root, t->name)) {
            pd_log_error("%s: tensor %zu: name %s is empty, reserved or a duplicate", path, i,
                         t->name ? t->name : "(null)");
            goto err_free_json;
        }
        if ((unsigned)t->dtype >= PD_DTYPE__COUNT || t->n_dims < 0 ||
            t->n_dims > SAFETENSORS_MAX_DIMS) {
            pd_log_error("%s: tensor %s: bad dtype %d or n_dims %d", path, t->name, (int)t->dtype,
                         t->n_dims);
            goto err_free_json;
        }
        for (int d = 0; d < t->n_dims; d++) {
            if (t->shape[d] < 0 || __builtin_mul_overflow(elems, (uint64_t)t->shape[d], &elems)) {
                pd_log_error("%s: tensor %s: bad extent %" PRId64 " in dim %d", path, t->name,
                             t->shape[d], d);
                goto err_free_json;
            }
        }
        if (__builtin_mul_overflow(elems, (uint64_t)pd_dtype_size(t->dtype), &bytes) ||
            bytes != t->nbytes || (bytes && !t->data)) {
            pd_log_error("%s: tensor %s: nbytes %zu does not match its shape and dtype", path,
                         t->name, t->nbytes);
            goto err_free_json;
        }
        rc = PD_ERR_NOMEM;
        e = json_object();
        if (!e)
            goto err_free_json;
        if (json_object_set_new(root, t->name, e)) { /* set_new releases e on failure */
            pd_log_error("%s: tensor %zu: name is not valid utf-8", path, i);
            rc = PD_ERR_INVALID;
            goto err_free_json;
        }
        shape = json_array();
        if (!shape || json_object_set_new(e, "shape", shape))
            goto err_free_json;
        for (int d = 0; d < t->n_dims; d++)
            if (json_array_append_new(shape, json_integer(t->shape[d])))
                goto err_free_json;
        if (json_object_set_new(e, "dtype", json_string(pd_dtype_name(t->dtype))) ||
            json_object_set_new(e, "data_offsets",
                                json_pack("[II]", (json_int_t)off, (json_int_t)(off + bytes))))
            goto err_free_json;
        off += bytes;
    }
    *text_p = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    rc = *text_p ? PD_OK : PD_ERR_NOMEM;
err_free_json:
    json_decref(root);
    return rc;
}

pd_status_t safetensors_write(const char *path, const safetensors_tensor_t *tensors, size_t n,
                              const char *const *meta, size_t n_meta_pairs)
{
    char *text = NULL, *tmp;
    size_t hlen, pad;
    uint8_t lenbuf[8];
    FILE *f;
    pd_status_t rc;

    rc = safetensors__header(path, tensors, n, meta, n_meta_pairs, &text);
    if (rc)
        return rc;
    hlen = strlen(text);
    pad = (8 - (8 + hlen) % 8) % 8;
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (uint8_t)((uint64_t)(hlen + pad) >> (8 * i));
    tmp = malloc(strlen(path) + sizeof ".tmp");
    if (!tmp) {
        rc = PD_ERR_NOMEM;
        goto err_free_text;
    }
    sprintf(tmp, "%s.tmp", path);
    f = fopen(tmp, "wb");
    if (!f) {
        pd_log_error("%s: cannot create: %s", tmp, strerror(errno));
        rc = PD_ERR_IO;
        goto err_free_tmp;
    }
    bool ok = fwrite(lenbuf, 1, 8, f) == 8 && fwrite(text, 1, hlen, f) == hlen;
    for (size_t i = 0; ok && i < pad; i++)
        ok = fputc(' ', f) != EOF;
    for (size_t i = 0; ok && i < n; i++)
        ok = tensors[i].nbytes == 0 ||
             fwrite(tensors[i].data, 1, tensors[i].nbytes, f) == tensors[i].nbytes;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0)
        ok = false;
    if (!ok) {
        pd_log_error("%s: write failed: %s", tmp, strerror(errno));
        rc = PD_ERR_IO;
        goto err_unlink;
    }
    if (rename(tmp, path) != 0) {
        pd_log_error("%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        rc = PD_ERR_IO;
        goto err_unlink;
    }
    free(tmp);
    free(text);
    return PD_OK;

err_unlink:
    unlink(tmp);
err_free_tmp:
    free(tmp);
err_free_text:
    free(text);
    return rc;
}
