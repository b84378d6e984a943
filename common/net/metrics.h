/* metrics: a small Prometheus registry (counters, gauges, fixed-bucket histograms) and its text
 * exposition format, served at /metrics by every binary.
 *
 * A metric family is a name with a help text and a type; each distinct set of label values is a
 * series with its own handle. The registry owns families, series and handles; handles stay valid
 * until metrics_destroy. Registering the same name and labels again returns the same handle, so
 * modules may register lazily. Registration and rendering take the registry's mutex; updates
 * (inc/add/set/observe) are lock-free C11 atomics and may be called from any thread. A render that
 * runs during updates sees each value atomically, not the set of them as one snapshot.
 *
 * Labels are given as a NULL-terminated list of key, value strings:
 *   static const char *const labels[] = {"node", "decode0", "reason", "tag", NULL};
 */
#ifndef PD_METRICS_H
#define PD_METRICS_H

#include <stddef.h>

#include <stdint.h>

#include "status.h"

typedef struct metrics metrics_t;
typedef struct metrics_counter metrics_counter_t;
typedef struct metrics_gauge metrics_gauge_t;
typedef struct metrics_histogram metrics_histogram_t;

/* Creates an empty registry. Returns PD_OK or PD_ERR_NOMEM; *m_p is written only on success. */
pd_status_t metrics_create(metrics_t **m_p);

/* Frees the registry and every handle it gave out; NULL is accepted. No update may run
 * concurrently. */
void metrics_destroy(metrics_t *m);

/* Registers (or finds) the counter series name{labels}. name must match [a-zA-Z_:][a-zA-Z0-9_:]*,
 * label keys [a-zA-Z_][a-zA-Z0-9_]*; help is used by the first registration of the name.
 * Returns PD_OK, PD_ERR_INVALID (bad name or label, or the name exists with another type),
 * PD_ERR_NOMEM; on failure the registry is unchanged and *c_p untouched. */
pd_status_t metrics_counter_register(metrics_t *m, const char *name, const char *help,
                                     const char *const *labels, metrics_counter_t **c_p);

/* Adds 1 / v (v >= 0; negative values are ignored) to a counter. Any thread. */
void metrics_counter_inc(metrics_counter_t *c);
void metrics_counter_add(metrics_counter_t *c, double v);

/* Returns the counter's current value. */
double metrics_counter_value(const metrics_counter_t *c);

/* Registers (or finds) a gauge series; same rules and return codes as metrics_counter_register. */
pd_status_t metrics_gauge_register(metrics_t *m, const char *name, const char *help,
                                   const char *const *labels, metrics_gauge_t **g_p);

/* Sets / adds to (v may be negative) a gauge. Any thread. */
void metrics_gauge_set(metrics_gauge_t *g, double v);
void metrics_gauge_add(metrics_gauge_t *g, double v);

/* Returns the gauge's current value. */
double metrics_gauge_value(const metrics_gauge_t *g);

/* For numbers another part of the program keeps (a server's stats, a node's published counters):
 * registers (or finds) the series and sets a gauge to v, or moves a counter up to total (never
 * down: a smaller total is ignored). Registration errors are ignored (the series is missing
 * from the next render). */
void metrics_gauge_put(metrics_t *m, const char *name, const char *help, const char *const *labels,
                       double v);
void metrics_counter_put_total(metrics_t *m, const char *name, const char *help,
                               const char *const *labels, uint64_t total);

/* A listener's connection counters (an HTTP or gRPC server's stats). */
typedef struct {
    uint64_t connections;     /* open now */
    uint64_t max_connections; /* the effective limit */
    uint64_t rejected;        /* closed at accept: over the limit */
    uint64_t accept_errors;   /* failed accepts (EMFILE, ...) */
    uint64_t idle_closed;     /* closed by the idle timeout */
    uint64_t timed_out;       /* requests too slow to arrive (HTTP 408, gRPC DEADLINE_EXCEEDED) */
    uint64_t flood_closed;    /* ended for a frame flood (gRPC) */
} metrics_listener_t;

/* Puts l as the pdserve_listener_* series with labels (which should name the listener:
 * {"listener", "grpc", ...}). Same rules as metrics_gauge_put. */
void metrics_listener_put(metrics_t *m, const char *const *labels, const metrics_listener_t *l);

/* Registers (or finds) a histogram series with the upper bounds bounds[n_bounds] (finite,
 * strictly increasing; +Inf is implied). Every series of one name must use the same bounds, and
 * "le" is not allowed as a label key. Same return codes as metrics_counter_register. */
pd_status_t metrics_histogram_register(metrics_t *m, const char *name, const char *help,
                                       const double *bounds, size_t n_bounds,
                                       const char *const *labels, metrics_histogram_t **h_p);

/* Counts v in the first bucket whose bound is >= v and adds it to the sum. Any thread. */
void metrics_histogram_observe(metrics_histogram_t *h, double v);

/* Renders every family in registration order in the Prometheus text format 0.0.4 (# HELP,
 * # TYPE, name{labels} value; histograms as _bucket{le="..."} cumulative, _sum, _count).
 * *text_p is NUL-terminated, malloc'd and owned by the caller (free()). Returns PD_OK or
 * PD_ERR_NOMEM; outputs are written only on success. */
pd_status_t metrics_render(metrics_t *m, char **text_p, size_t *len_p);

#endif
