#include "grpc_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

void pd_grpc_wire_deframer_init(pd_grpc_wire_deframer_t *d, size_t max_msg)
{
    memset(d, 0, sizeof *d);
    d->max_msg = max_msg;
}

void pd_grpc_wire_deframer_deinit(pd_grpc_wire_deframer_t *d)
{
    if (!d)
        return;
    free(d->buf);
    d->buf = NULL;
    d->cap = d->got = d->want = d->hdr_got = 0;
    d->ready = 0;
}

static pd_status_t pd_grpc_wire__reserve(pd_grpc_wire_deframer_t *d, size_t need)
{
    size_t cap = d->cap ? d->cap : 256;
    uint8_t *nb;

    if (need <= d->cap)
        return PD_OK;
    while (cap < need)
        cap *= 2;
    if (cap > d->want)
        cap = d->want;
    nb = realloc(d->buf, cap);
    if (!nb)
        return PD_ERR_NOMEM;
    d->buf = nb;
    d->cap = cap;
    return PD_OK;
}

pd_status_t pd_grpc_wire_deframer_feed(pd_grpc_wire_deframer_t *d, const uint8_t *data, size_t len,
                                    size_t *used_p, const uint8_t **msg_p, size_t *msg_len_p)
{
    size_t used = 0;

    if (d->ready) {
        d->ready = 0;
        d->hdr_got = 0;
        d->got = d->want = 0;
    }
    while (used < len || (d->hdr_got == PD_GRPC_WIRE_HDR_LEN && d->got == d->want)) {
        if (d->hdr_got < PD_GRPC_WIRE_HDR_LEN) {
            d->hdr[d->hdr_got++] = data[used++];
            if (d->hdr_got < PD_GRPC_WIRE_HDR_LEN)
                continue;
            if (d->hdr[0] == 1)
                return PD_ERR_UNSUPPORTED;
            if (d->hdr[0] != 0)
                return PD_ERR_PROTOCOL;
            d->want = (size_t)d->hdr[1] << 24 | (size_t)d->hdr[2] << 16 | (size_t)d->hdr[3] << 8 |
                      d->hdr[4];
            if (d->want > d->max_msg)
                return PD_ERR_RESOURCE;
            d->got = 0;
            continue;
        }
        if (d->got < d->want) {
            size_t n = d->want - d->got;
            if (n > len - used)
                n = len - used;
            if (pd_grpc_wire__reserve(d, d->got + n) != PD_OK)
                return PD_ERR_NOMEM;
            memcpy(d->buf + d->got, data + used, n);
            d->got += n;
            used += n;
        }
        if (d->got == d->want) {
            d->ready = 1;
            *used_p = used;
            *msg_p = d->buf ? d->buf : (const uint8_t *)"";
            *msg_len_p = d->want;
            return PD_OK;
        }
    }
    *used_p = used;
    *msg_p = NULL;
    *msg_len_p = 0;
    return PD_OK;
}

int pd_grpc_wire_deframer_partial(const pd_grpc_wire_deframer_t *d)
{
    return !d->ready && d->hdr_got > 0;
}

void pd_grpc_wire_prefix(uint8_t out[PD_GRPC_WIRE_HDR_LEN], uint32_t len)
{
    out[0] = 0;
    out[1] = (uint8_t)(len >> 24);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 8);
    out[4] = (uint8_t)len;
}

pd_status_t pd_grpc_wire_timeout_parse(const char *s, size_t len, int64_t *ms_p)
{
    int64_t v = 0, ms;

    if (len < 2 || len > 9)
        return PD_ERR_FORMAT;
    for (size_t i = 0; i + 1 < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return PD_ERR_FORMAT;
        v = v * 10 + (s[i] - '0');
    }
    switch (s[len - 1]) {
    case 'H':
        ms = v * 3600 * 1000;
        break;
    case 'M':
        ms = v * 60 * 1000;
        break;
    case 'S':
        ms = v * 1000;
        break;
    case 'm':
        ms = v;
        break;
    case 'u':
        ms = (v + 999) / 1000;
        break;
    case 'n':
        ms = (v + 999999) / 1000000;
        break;
    default:
        return PD_ERR_FORMAT;
    }
    *ms_p = ms;
    return PD_OK;
}

void pd_grpc_wire_timeout_format(char *out, size_t out_len, int64_t ms)
{
    if (ms < 0)
        ms = 0;
    if (ms < 100000000)
        snprintf(out, out_len, "%lldm", (long long)ms);
    else if (ms / 1000 < 100000000)
        snprintf(out, out_len, "%lldS", (long long)(ms / 1000));
    else if (ms / 60000 < 100000000)
        snprintf(out, out_len, "%lldM", (long long)(ms / 60000));
    else
        snprintf(out, out_len, "99999999H");
}

char *pd_grpc_wire_pct_encode(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s);
    char *out = malloc(n * 3 + 1), *o = out;

    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c <= 0x7e && c != '%') {
            *o++ = (char)c;
        } else {
            *o++ = '%';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
    }
    *o = 0;
    return out;
}

static int pd_grpc_wire__hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

char *pd_grpc_wire_pct_decode(const char *s, size_t len)
{
    char *out = malloc(len + 1), *o = out;

    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        int hi, lo;
        if (s[i] == '%' && i + 2 < len && (hi = pd_grpc_wire__hexval(s[i + 1])) >= 0 &&
            (lo = pd_grpc_wire__hexval(s[i + 2])) >= 0) {
            *o++ = (char)(hi << 4 | lo);
            i += 2;
        } else {
            *o++ = s[i];
        }
    }
    *o = 0;
    return out;
}

int pd_grpc_wire_http_to_grpc(int http_status)
{
    switch (http_status) {
    case 400:
        return PD_GRPC_INTERNAL;
    case 401:
        return PD_GRPC_UNAUTHENTICATED;
    case 403:
        return PD_GRPC_PERMISSION_DENIED;
    case 404:
        return PD_GRPC_UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
        return PD_GRPC_UNAVAILABLE;
    default:
        return PD_GRPC_UNKNOWN;
    }
}

const char *pd_grpc_wire_code_name(int code)
{
    switch (code) {
#define PD_GRPC__NAME(name, value)                                                                 \
    case value:                                                                                    \
        return #name;
        PD_GRPC_CODE_LIST(PD_GRPC__NAME)
#undef PD_GRPC__NAME
    default:
        return "UNKNOWN";
    }
}

pd_status_t pd_grpc_wire_code_to_status(int code)
{
    switch (code) {
    case 0:
        return PD_OK;
    case 1:
        return PD_ERR_CANCELLED;
    case 3:
    case 11:
        return PD_ERR_INVALID;
    case 4:
        return PD_ERR_DEADLINE;
    case 5:
        return PD_ERR_NOT_FOUND;
    case 8:
        return PD_ERR_RESOURCE;
    case 12:
        return PD_ERR_UNSUPPORTED;
    case 14:
        return PD_ERR_UNAVAILABLE;
    case 15:
        return PD_ERR_KV_INTEGRITY;
    default:
        return PD_ERR_INTERNAL;
    }
}

/* ==== metadata ==== */

static char *pd_grpc_wire__strndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);

    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

pd_status_t pd_grpc_wire_md_add(pd_grpc_wire_md_list_t *l, const char *key, size_t key_len,
                                const char *value, size_t value_len)
{
    pd_grpc_wire_md_t *items = realloc(l->items, (l->n + 1) * sizeof *items);
    char *k, *v;

    if (!items)
        return PD_ERR_NOMEM;
    l->items = items;
    k = pd_grpc_wire__strndup(key, key_len);
    v = pd_grpc_wire__strndup(value, value_len);
    if (!k || !v) {
        free(k);
        free(v);
        return PD_ERR_NOMEM;
    }
    items[l->n].key = k;
    items[l->n].value = v;
    l->n++;
    l->bytes += key_len + value_len;
    return PD_OK;
}

const char *pd_grpc_wire_md_get(const pd_grpc_wire_md_list_t *l, const char *key)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->items[i].key, key) == 0)
            return l->items[i].value;
    return NULL;
}

void pd_grpc_wire_md_deinit(pd_grpc_wire_md_list_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->items[i].key);
        free(l->items[i].value);
    }
    free(l->items);
    l->items = NULL;
    l->n = l->bytes = 0;
}
