#include "metrics.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

typedef enum { METRICS__COUNTER, METRICS__GAUGE, METRICS__HISTOGRAM } metrics__type_t;

/* Doubles are kept as their bit patterns in atomic 64-bit words. */
struct metrics_counter {
    _Atomic uint64_t bits;
};

struct metrics_gauge {
    _Atomic uint64_t bits;
};

struct metrics_histogram {
    const double *bounds; /* (n_bounds) owned by the family */
    size_t n_bounds;
    _Atomic uint64_t sum_bits;
    _Atomic uint64_t counts[]; /* (n_bounds + 1) per bucket, not cumulative; last is +Inf */
};

typedef struct {
    char *labels; /* rendered: k="v",k2="v2" (empty string for none) */
    void *obj;    /* metrics_counter_t / metrics_gauge_t / metrics_histogram_t */
} metrics__series_t;

typedef struct metrics__family {
    char *name, *help;
    metrics__type_t type;
    double *bounds; /* histograms: (n_bounds) */
    size_t n_bounds;
    metrics__series_t *series; /* (n_series) */
    size_t n_series, cap_series;
    struct metrics__family *next;
} metrics__family_t;

struct metrics {
    pthread_mutex_t lock;
    metrics__family_t *first, *last;
};

/* ==== atomic doubles ==== */

static double metrics__load(const _Atomic uint64_t *a)
{
    uint64_t u = atomic_load_explicit((_Atomic uint64_t *)a, memory_order_relaxed);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static void metrics__store(_Atomic uint64_t *a, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    atomic_store_explicit(a, u, memory_order_relaxed);
}

static void metrics__add(_Atomic uint64_t *a, double v)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed), nu;
    double d;
    do {
        memcpy(&d, &old, sizeof d);
        d += v;
        memcpy(&nu, &d, sizeof nu);
    } while (!atomic_compare_exchange_weak_explicit(a, &old, nu, memory_order_relaxed,
                                                    memory_order_relaxed));
}

void metrics_counter_inc(metrics_counter_t *c)
{
    metrics__add(&c->bits, 1.0);
}

void metrics_counter_add(metrics_counter_t *c, double v)
{
    if (v > 0)
        metrics__add(&c->bits, v);
}

double metrics_counter_value(const metrics_counter_t *c)
{
    return metrics__load(&c->bits);
}

void metrics_gauge_set(metrics_gauge_t *g, double v)
{
    metrics__store(&g->bits, v);
}

void metrics_gauge_add(metrics_gauge_t *g, double v)
{
    metrics__add(&g->bits, v);
}

double metrics_gauge_value(const metrics_gauge_t *g)
{
    return metrics__load(&g->bits);
}

void metrics_histogram_observe(metrics_histogram_t *h, double v)
{
    size_t i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    atomic_fetch_add_explicit(&h->counts[i], 1, memory_order_relaxed);
    metrics__add(&h->sum_bits, v);
}

/* ==== registry ==== */

pd_status_t metrics_create(metrics_t **m_p)
{
    metrics_t *m = calloc(1, sizeof *m);
    if (!m) {
        pd_log_error("metrics: out of memory for the registry");
        return PD_ERR_NOMEM;
    }
    pthread_mutex_init(&m->lock, NULL);
    *m_p = m;
    return PD_OK;
}

static void metrics__family_free(metrics__family_t *f)
{
    for (size_t i = 0; i < f->n_series; i++) {
        free(f->series[i].labels);
        free(f->series[i].obj);
    }
    free(f->series);
    free(f->bounds);
    free(f->name);
    free(f->help);
    free(f);
}

void metrics_destroy(metrics_t *m)
{
    if (!m)
        return;
    for (metrics__family_t *f = m->first, *next; f; f = next) {
        next = f->next;
        metrics__family_free(f);
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static int metrics__valid_name(const char *s, int colon)
{
    if (!s || !(isalpha((unsigned char)*s) || *s == '_' || (colon && *s == ':')))
        return 0;
    for (s++; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_' || (colon && *s == ':')))
            return 0;
    return 1;
}

/* Appends s to a growing buffer; returns -1 when out of memory. */
typedef struct {
    char *p;
    size_t len, cap;
} metrics__buf_t;

__attribute__((format(printf, 2, 3))) static int metrics__printf(metrics__buf_t *b, const char *fmt,
                                                                 ...)
{
    va_list ap;
    int n;

    for (;;) {
        va_start(ap, fmt);
        n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return -1;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return 0;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
}

/* Appends s with the given characters escaped (\\, \n, and \" when quote). */
static int metrics__escaped(metrics__buf_t *b, const char *s, int quote)
{
    for (; *s; s++) {
        int r;
        if (*s == '\\')
            r = metrics__printf(b, "\\\\");
        else if (*s == '\n')
            r = metrics__printf(b, "\\n");
        else if (quote && *s == '"')
            r = metrics__printf(b, "\\\"");
        else
            r = metrics__printf(b, "%c", *s);
        if (r)
            return r;
    }
    return 0;
}

/* Renders labels into a malloc'd k="v",... string; returns PD_ERR_INVALID on a bad key. */
static pd_status_t metrics__labels(const char *name, const char *const *labels, int histogram,
                                   char **out_p)
{
    metrics__buf_t b = {0};

    if (metrics__printf(&b, "%s", ""))
        goto err_nomem;
    for (size_t i = 0; labels && labels[i]; i += 2) {
        if (!labels[i + 1] || !metrics__valid_name(labels[i], 0) ||
            strncmp(labels[i], "__", 2) == 0 || (histogram && strcmp(labels[i], "le") == 0)) {
            pd_log_error("metrics: %s: bad label '%s'", name, labels[i]);
            free(b.p);
            return PD_ERR_INVALID;
        }
        if (metrics__printf(&b, "%s%s=\"", i ? "," : "", labels[i]) ||
            metrics__escaped(&b, labels[i + 1], 1) || metrics__printf(&b, "\""))
            goto err_nomem;
    }
    *out_p = b.p;
    return PD_OK;

err_nomem:
    pd_log_error("metrics: %s: out of memory for labels", name);
    free(b.p);
    return PD_ERR_NOMEM;
}

/* Finds or creates the family; bounds only for histograms. Called with the lock held. */
static pd_status_t metrics__family(metrics_t *m, const char *name, const char *help,
                                   metrics__type_t type, const double *bounds, size_t n_bounds,
                                   metrics__family_t **f_p)
{
    metrics__family_t *f;

    for (f = m->first; f; f = f->next) {
        if (strcmp(f->name, name) != 0)
            continue;
        if (f->type != type) {
            pd_log_error("metrics: %s: registered before with another type", name);
            return PD_ERR_INVALID;
        }
        if (type == METRICS__HISTOGRAM &&
            (f->n_bounds != n_bounds || memcmp(f->bounds, bounds, n_bounds * sizeof *bounds))) {
            pd_log_error("metrics: %s: registered before with other buckets", name);
            return PD_ERR_INVALID;
        }
        *f_p = f;
        return PD_OK;
    }
    f = calloc(1, sizeof *f);
    if (!f)
        goto err_nomem;
    f->type = type;
    f->name = strdup(name);
    f->help = strdup(help ? help : "");
    if (!f->name || !f->help)
        goto err_free_family;
    if (type == METRICS__HISTOGRAM) {
        f->bounds = malloc((n_bounds ? n_bounds : 1) * sizeof *bounds);
        if (!f->bounds)
            goto err_free_family;
        memcpy(f->bounds, bounds, n_bounds * sizeof *bounds);
        f->n_bounds = n_bounds;
    }
    if (m->last)
        m->last->next = f;
    else
        m->first = f;
    m->last = f;
    *f_p = f;
    return PD_OK;

err_free_family:
    metrics__family_free(f);
err_nomem:
    pd_log_error("metrics: %s: out of memory", name);
    return PD_ERR_NOMEM;
}

static pd_status_t metrics__register(metrics_t *m, const char *name, const char *help,
                                     metrics__type_t type, const double *bounds, size_t n_bounds,
                                     const char *const *labels, void **obj_p)
{
    metrics__family_t *f;
    char *text = NULL;
    void *obj = NULL;
    pd_status_t st;

    if (!metrics__valid_name(name, 1)) {
        pd_log_error("metrics: bad metric name '%s'", name ? name : "(null)");
        return PD_ERR_INVALID;
    }
    if (type == METRICS__HISTOGRAM) {
        for (size_t i = 0; i < n_bounds; i++) {
            if (!isfinite(bounds[i]) || (i && bounds[i] <= bounds[i - 1])) {
                pd_log_error("metrics: %s: bucket bounds must be finite and increasing", name);
                return PD_ERR_INVALID;
            }
        }
    }
    if ((st = metrics__labels(name, labels, type == METRICS__HISTOGRAM, &text)) != PD_OK)
        return st;
    pthread_mutex_lock(&m->lock);
    if ((st = metrics__family(m, name, help, type, bounds, n_bounds, &f)) != PD_OK)
        goto out;
    for (size_t i = 0; i < f->n_series; i++) {
        if (strcmp(f->series[i].labels, text) == 0) {
            *obj_p = f->series[i].obj;
            goto out; /* st == PD_OK */
        }
    }
    if (f->n_series == f->cap_series) {
        size_t cap = f->cap_series ? f->cap_series * 2 : 4;
        metrics__series_t *s = realloc(f->series, cap * sizeof *s);
        if (!s)
            goto err_nomem;
        f->series = s;
        f->cap_series = cap;
    }
    if (type == METRICS__HISTOGRAM) {
        metrics_histogram_t *h = calloc(1, sizeof *h + (n_bounds + 1) * sizeof h->counts[0]);
        if (!h)
            goto err_nomem;
        h->bounds = f->bounds;
        h->n_bounds = f->n_bounds;
        obj = h;
    } else {
        obj = calloc(1, sizeof(metrics_counter_t));
        if (!obj)
            goto err_nomem;
    }
    f->series[f->n_series++] = (metrics__series_t){text, obj};
    text = NULL;
    *obj_p = obj;
    goto out;

err_nomem:
    pd_log_error("metrics: %s: out of memory for a series", name);
    st = PD_ERR_NOMEM;
out:
    pthread_mutex_unlock(&m->lock);
    free(text);
    return st;
}

pd_status_t metrics_counter_register(metrics_t *m, const char *name, const char *help,
                                     const char *const *labels, metrics_counter_t **c_p)
{
    return metrics__register(m, name, help, METRICS__COUNTER, NULL, 0, labels, (void **)c_p);
}

pd_status_t metrics_gauge_register(metrics_t *m, const char *name, const char *help,
                                   const char *const *labels, metrics_gauge_t **g_p)
{
    return metrics__register(m, name, help, METRICS__GAUGE, NULL, 0, labels, (void **)g_p);
}

pd_status_t metrics_histogram_register(metrics_t *m, const char *name, const char *help,
                                       const double *bounds, size_t n_bounds,
                                       const char *const *labels, metrics_histogram_t **h_p)
{
    return metrics__register(m, name, help, METRICS__HISTOGRAM, bounds, n_bounds, labels,
                             (void **)h_p);
}

/* ==== rendering ==== */

/* Formats v the way Prometheus reads it: shortest round-trip decimal, +Inf, -Inf, NaN. */
static void metrics__fmt(char *out, size_t len, double v)
{
    if (isnan(v)) {
        snprintf(out, len, "NaN");
    } else if (isinf(v)) {
        snprintf(out, len, v > 0 ? "+Inf" : "-Inf");
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(out, len, "%.*g", prec, v);
            if (strtod(out, NULL) == v)
                break;
        }
    }
}

static int metrics__series(metrics__buf_t *b, const metrics__family_t *f,
                           const metrics__series_t *s)
{
    const char *lb = s->labels;
    char num[64];

    if (f->type != METRICS__HISTOGRAM) {
        metrics__fmt(num, sizeof num, metrics__load(&((metrics_counter_t *)s->obj)->bits));
        return metrics__printf(b, "%s%s%s%s %s\n", f->name, *lb ? "{" : "", lb, *lb ? "}" : "",
                               num);
    }
    const metrics_histogram_t *h = s->obj;
    uint64_t cum = 0;
    for (size_t i = 0; i <= h->n_bounds; i++) {
        cum += atomic_load_explicit((_Atomic uint64_t *)&h->counts[i], memory_order_relaxed);
        if (i < h->n_bounds)
            metrics__fmt(num, sizeof num, h->bounds[i]);
        else
            snprintf(num, sizeof num, "+Inf");
        if (metrics__printf(b, "%s_bucket{%s%sle=\"%s\"} %llu\n", f->name, lb, *lb ? "," : "", num,
                            (unsigned long long)cum))
            return -1;
    }
    metrics__fmt(num, sizeof num, metrics__load(&h->sum_bits));
    return metrics__printf(b, "%s_sum%s%s%s %s\n%s_count%s%s%s %llu\n", f->name, *lb ? "{" : "", lb,
                           *lb ? "}" : "", num, f->name, *lb ? "{" : "", lb, *lb ? "}" : "",
                           (unsigned long long)cum);
}

pd_status_t metrics_render(metrics_t *m, char **text_p, size_t *len_p)
{
    static const char *types[] = {"counter", "gauge", "histogram"};
    metrics__buf_t b = {0};

    pthread_mutex_lock(&m->lock);
    if (metrics__printf(&b, "%s", ""))
        goto err_nomem;
    for (const metrics__family_t *f = m->first; f; f = f->next) {
        if (metrics__printf(&b, "# HELP %s ", f->name) || metrics__escaped(&b, f->help, 0) ||
            metrics__printf(&b, "\n# TYPE %s %s\n", f->name, types[f->type]))
            goto err_nomem;
        for (size_t i = 0; i < f->n_series; i++)
            if (metrics__series(&b, f, &f->series[i]))
                goto err_nomem;
    }
    pthread_mutex_unlock(&m->lock);
    *text_p = b.p;
    *len_p = b.len;
    return PD_OK;

err_nomem:
    pthread_mutex_unlock(&m->lock);
    pd_log_error("metrics: out of memory rendering");
    free(b.p);
    return PD_ERR_NOMEM;
}

void metrics_gauge_put(metrics_t *m, const char *name, const char *help, const char *const *labels,
                       double v)
{
    metrics_gauge_t *g;
    if (metrics_gauge_register(m, name, help, labels, &g) == PD_OK)
        metrics_gauge_set(g, v);
}

void metrics_counter_put_total(metrics_t *m, const char *name, const char *help,
                               const char *const *labels, uint64_t total)
{
    metrics_counter_t *c;
    if (metrics_counter_register(m, name, help, labels, &c) == PD_OK) {
        double now = metrics_counter_value(c);
        if ((double)total > now)
            metrics_counter_add(c, (double)total - now);
    }
}

void metrics_listener_put(metrics_t *m, const char *const *labels, const metrics_listener_t *l)
{
    metrics_gauge_put(m, "pdserve_listener_connections", "open client connections", labels,
                      (double)l->connections);
    metrics_gauge_put(m, "pdserve_listener_connections_max",
                      "connection limit (max_connections, capped by RLIMIT_NOFILE)", labels,
                      (double)l->max_connections);
    metrics_counter_put_total(m, "pdserve_listener_rejected_total",
                              "connections closed at accept: over the limit", labels, l->rejected);
    metrics_counter_put_total(m, "pdserve_listener_accept_errors_total",
                              "failed accepts (EMFILE, ...)", labels, l->accept_errors);
    metrics_counter_put_total(m, "pdserve_listener_idle_closed_total",
                              "connections closed by the idle timeout", labels, l->idle_closed);
    metrics_counter_put_total(m, "pdserve_listener_timeouts_total",
                              "requests too slow to arrive (HTTP 408, gRPC DEADLINE_EXCEEDED)",
                              labels, l->timed_out);
    metrics_counter_put_total(m, "pdserve_listener_flood_closed_total",
                              "connections ended for a frame flood (gRPC)", labels,
                              l->flood_closed);
}
