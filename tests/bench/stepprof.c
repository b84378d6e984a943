/* stepprof: a GPU step's kernels from CUPTI's activity records (see stepprof.h). */
#include "stepprof.h"

#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEPPROF_NAME 72         /* bytes of a shortened kernel name */
#define STEPPROF_BUF (16u << 20) /* bytes per CUPTI activity buffer */
#define STEPPROF_MAX_STEPS 64    /* marks per window (the rest are ignored) */
#define STEPPROF_ROWS 32         /* kernels printed per table; the rest summed in one row */

typedef struct {
    char name[STEPPROF_NAME];
    uint64_t start, end;
    uint64_t ext; /* how far it moved the step's last end (set by stepprof_end) */
} stepprof_rec_t;

/* the CUPTI entry points, from dlopen */
static struct {
    void *lib;
    CUptiResult (*register_cb)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*disable)(CUpti_ActivityKind);
    CUptiResult (*flush_all)(uint32_t);
    CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*timestamp)(uint64_t *);
    CUptiResult (*result_string)(CUptiResult, const char **);
} stepprof__api;

/* the open window: records (appended by CUPTI's buffer callback, maybe from its own thread) and
 * the host's marks */
static pthread_mutex_t stepprof__lock = PTHREAD_MUTEX_INITIALIZER;
static stepprof_rec_t *stepprof__recs;
static size_t stepprof__n, stepprof__cap;
static uint64_t stepprof__marks[STEPPROF_MAX_STEPS + 1];
static int stepprof__n_marks;
static int stepprof__open;

static const CUpti_ActivityKind stepprof__kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

/* Reads a decimal number at *p (advancing it); -1 when there is none. */
static long stepprof__num(const char **p)
{
    if (**p < '0' || **p > '9')
        return -1;
    long v = 0;
    while (**p >= '0' && **p <= '9')
        v = v * 10 + (*(*p)++ - '0');
    return v;
}

/* A readable form of an Itanium-mangled kernel name: the (last) identifier and its integer
 * template arguments, "_Z9moe__gmm3ILi2ELi1EEvPf..." -> "moe__gmm3<2,1>"; other template
 * arguments print as "?"; a name that is not mangled is copied. Truncated to n - 1 bytes. */
static void stepprof__short(const char *m, char *out, size_t n)
{
    const char *p = m;
    size_t o = 0;
#define PUT(ch)                                                                                    \
    do {                                                                                           \
        if (o + 1 < n)                                                                             \
            out[o++] = (ch);                                                                       \
    } while (0)
    if (strncmp(p, "_Z", 2) != 0) {
        snprintf(out, n, "%s", m);
        return;
    }
    p += 2;
    if (*p == 'L')
        p++;
    const int nested = *p == 'N';
    if (nested)
        p++;
    for (int first = 1;; first = 0) { /* identifiers: <len><chars>, joined by :: when nested */
        const long len = stepprof__num(&p);
        if (len <= 0 || (long)strnlen(p, (size_t)len) < len) {
            if (first) {
                snprintf(out, n, "%s", m);
                return;
            }
            break;
        }
        if (!first) {
            PUT(':');
            PUT(':');
        }
        for (long i = 0; i < len; i++)
            PUT(p[i]);
        p += len;
        if (!nested)
            break;
    }
    if (*p == 'I') { /* template arguments up to the matching E */
        p++;
        PUT('<');
        for (int k = 0; *p && *p != 'E'; k++) {
            if (k)
                PUT(',');
            if (*p == 'L' && p[1] && p[1] != 'Z') { /* L <type> [n] <digits> E */
                p += 2;
                if (*p == 'n') {
                    PUT('-');
                    p++;
                }
                const char *d = p;
                if (stepprof__num(&p) < 0 || *p != 'E') {
                    PUT('?');
                    break;
                }
                for (; d < p; d++)
                    PUT(*d);
                p++; /* its E */
            } else {
                PUT('?');
                break;
            }
        }
        PUT('>');
    }
    out[o] = '\0';
#undef PUT
}

static void stepprof__add(const char *name, uint64_t start, uint64_t end)
{
    pthread_mutex_lock(&stepprof__lock);
    if (stepprof__n == stepprof__cap) {
        const size_t cap = stepprof__cap ? 2 * stepprof__cap : 4096;
        stepprof_rec_t *r = realloc(stepprof__recs, cap * sizeof *r);
        if (!r) {
            pthread_mutex_unlock(&stepprof__lock);
            return; /* dropped: the table will show fewer launches */
        }
        stepprof__recs = r;
        stepprof__cap = cap;
    }
    stepprof_rec_t *r = &stepprof__recs[stepprof__n++];
    stepprof__short(name, r->name, sizeof r->name);
    r->start = start;
    r->end = end;
    r->ext = 0;
    pthread_mutex_unlock(&stepprof__lock);
}

static void CUPTIAPI stepprof__buf_request(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = aligned_alloc(8, STEPPROF_BUF);
    *size = *buf ? STEPPROF_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI stepprof__buf_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                        size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    while (stepprof__api.next_record(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
            stepprof__add(k->name ? k->name : "(kernel)", k->start, k->end);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *c = (const CUpti_ActivityMemcpy6 *)rec;
            const char *what = c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH   ? "memcpy DtoH"
                               : c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD ? "memcpy HtoD"
                               : c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "memcpy DtoD"
                                                                                : "memcpy";
            stepprof__add(what, c->start, c->end);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *s = (const CUpti_ActivityMemset4 *)rec;
            stepprof__add("memset", s->start, s->end);
        }
    }
    free(buf);
}

static int stepprof__check(CUptiResult r, const char *what)
{
    if (r == CUPTI_SUCCESS)
        return 0;
    const char *s = NULL;
    if (stepprof__api.result_string)
        stepprof__api.result_string(r, &s);
    fprintf(stderr, "stepprof: %s: %s (%d)\n", what, s ? s : "CUPTI error", (int)r);
    return -1;
}

/* dlopen libcupti and look up the entry points; 0 or -1 (printed) */
static int stepprof__load(void)
{
    static const char *const paths[] = {
        "libcupti.so.13", "libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
        "/usr/local/cuda/lib64/libcupti.so.13", "/usr/local/cuda/lib/libcupti.so.13"};
    if (stepprof__api.lib)
        return 0;
    void *lib = NULL;
    for (size_t i = 0; !lib && i < sizeof paths / sizeof paths[0]; i++)
        lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "stepprof: cannot load libcupti (%s)\n", dlerror());
        return -1;
    }
#define SYM(field, name)                                                                           \
    do {                                                                                           \
        *(void **)&stepprof__api.field = dlsym(lib, name);                                         \
        if (!stepprof__api.field) {                                                                \
            fprintf(stderr, "stepprof: libcupti has no %s\n", name);                               \
            dlclose(lib);                                                                          \
            memset(&stepprof__api, 0, sizeof stepprof__api);                                       \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)
    SYM(register_cb, "cuptiActivityRegisterCallbacks");
    SYM(enable, "cuptiActivityEnable");
    SYM(disable, "cuptiActivityDisable");
    SYM(flush_all, "cuptiActivityFlushAll");
    SYM(next_record, "cuptiActivityGetNextRecord");
    SYM(timestamp, "cuptiGetTimestamp");
    SYM(result_string, "cuptiGetResultString");
#undef SYM
    stepprof__api.lib = lib;
    if (stepprof__check(stepprof__api.register_cb(stepprof__buf_request, stepprof__buf_done),
                        "cuptiActivityRegisterCallbacks") != 0)
        return -1;
    return 0;
}

int stepprof_begin(void)
{
    if (stepprof__open) {
        fprintf(stderr, "stepprof: a window is already open\n");
        return -1;
    }
    if (stepprof__load() != 0)
        return -1;
    for (size_t i = 0; i < sizeof stepprof__kinds / sizeof stepprof__kinds[0]; i++)
        if (stepprof__check(stepprof__api.enable(stepprof__kinds[i]), "cuptiActivityEnable") != 0)
            return -1;
    stepprof__n = 0;
    stepprof__n_marks = 0;
    stepprof__open = 1;
    return 0;
}

void stepprof_mark(void)
{
    uint64_t t = 0;
    if (!stepprof__open || stepprof__n_marks > STEPPROF_MAX_STEPS)
        return;
    if (stepprof__check(stepprof__api.timestamp(&t), "cuptiGetTimestamp") == 0)
        stepprof__marks[stepprof__n_marks++] = t;
}

typedef struct {
    const char *name;
    double launches, us, ext_us;
} stepprof_row_t;

static int stepprof__by_start(const void *a, const void *b)
{
    const stepprof_rec_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static int stepprof__by_name(const void *a, const void *b)
{
    return strcmp(((const stepprof_rec_t *)a)->name, ((const stepprof_rec_t *)b)->name);
}

static int stepprof__by_us(const void *a, const void *b)
{
    const stepprof_row_t *x = a, *y = b;
    return x->us > y->us ? -1 : x->us < y->us;
}

void stepprof_end(const char *title, double floor_ms)
{
    if (!stepprof__open)
        return;
    stepprof__check(stepprof__api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED),
                    "cuptiActivityFlushAll");
    for (size_t i = 0; i < sizeof stepprof__kinds / sizeof stepprof__kinds[0]; i++)
        stepprof__check(stepprof__api.disable(stepprof__kinds[i]), "cuptiActivityDisable");
    stepprof__open = 0;
    pthread_mutex_lock(&stepprof__lock);
    const int steps = stepprof__n_marks - 1;
    printf("\n#### stepprof: %s\n\n", title);
    if (steps < 1 || stepprof__n == 0) {
        printf("(no steps recorded: %d marks, %zu records)\n", stepprof__n_marks, stepprof__n);
        pthread_mutex_unlock(&stepprof__lock);
        return;
    }
    /* per step: wall, busy (union of intervals), summed kernel time */
    qsort(stepprof__recs, stepprof__n, sizeof *stepprof__recs, stepprof__by_start);
    double wall = 0, busy = 0, sum = 0, launches = 0;
    size_t in_steps = 0, i = 0;
    while (i < stepprof__n && stepprof__recs[i].start < stepprof__marks[0])
        i++;
    for (int s = 0; s < steps; s++) {
        const uint64_t lo = stepprof__marks[s], hi = stepprof__marks[s + 1];
        uint64_t first = 0, last = 0, cur_a = 0, cur_b = 0, u = 0;
        size_t k = 0;
        for (; i < stepprof__n && stepprof__recs[i].start < hi; i++, k++) {
            stepprof_rec_t *r = &stepprof__recs[i];
            const uint64_t e = r->end > r->start ? r->end : r->start;
            /* the critical-path share: the part of [start, end] past every earlier end (under
             * PDL a kernel starts while the one before runs and waits; this is what it adds) */
            const uint64_t from = k == 0 ? r->start : (last > r->start ? last : r->start);
            r->ext = e > from ? e - from : 0;
            if (k == 0) {
                first = r->start;
                cur_a = r->start;
                cur_b = e;
            } else if (r->start > cur_b) { /* a gap: close the busy interval */
                u += cur_b - cur_a;
                cur_a = r->start;
                cur_b = e;
            } else if (e > cur_b) {
                cur_b = e;
            }
            last = e > last ? e : last;
            sum += (double)(e - r->start);
        }
        (void)lo;
        if (k) {
            u += cur_b - cur_a;
            wall += (double)(last - first);
            busy += (double)u;
        }
        launches += (double)k;
        in_steps += k;
    }
    const double ns = 1e3 * steps; /* ns per us, times steps: per-step us */
    printf("%d steps; per step: wall %.1f us (first start to last end), busy %.1f us (%.0f%%), "
           "idle inside the step %.1f us, kernels summed %.1f us (overlap %.1f us), %.1f "
           "launches",
           steps, wall / ns, busy / ns, wall > 0 ? 100.0 * busy / wall : 0.0, (wall - busy) / ns,
           sum / ns, (sum - busy) / ns, launches / steps);
    if (floor_ms > 0 && wall > 0)
        printf("; floor %.3f ms = %.0f%% of the wall", floor_ms,
               100.0 * floor_ms * 1e3 / (wall / ns));
    printf("\n\n");
    /* per kernel name, over the records inside the steps */
    size_t a = 0;
    while (a < stepprof__n && stepprof__recs[a].start < stepprof__marks[0])
        a++;
    stepprof_rec_t *win = stepprof__recs + a;
    qsort(win, in_steps, sizeof *win, stepprof__by_name);
    stepprof_row_t *rows = calloc(in_steps ? in_steps : 1, sizeof *rows);
    size_t nr = 0;
    for (size_t j = 0; rows && j < in_steps; j++) {
        if (nr == 0 || strcmp(rows[nr - 1].name, win[j].name) != 0)
            rows[nr++] = (stepprof_row_t){win[j].name, 0, 0, 0};
        const uint64_t e = win[j].end > win[j].start ? win[j].end : win[j].start;
        rows[nr - 1].ext_us += (double)win[j].ext / 1e3;
        rows[nr - 1].launches += 1;
        rows[nr - 1].us += (double)(e - win[j].start) / 1e3;
    }
    qsort(rows, nr, sizeof *rows, stepprof__by_us);
    printf("\"critical\": the time each kernel moved the step's last end (launch order; under PDL "
           "a kernel starts early and waits, so its own time overlaps the one before); the "
           "column sums to busy.\n\n");
    printf("| kernel | launches / step | us / step | %% of busy | us / launch | critical us / step "
           "| critical us / launch |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    double rest_us = 0, rest_n = 0, rest_ext = 0;
    for (size_t j = 0; j < nr; j++) {
        if (j >= STEPPROF_ROWS) {
            rest_us += rows[j].us;
            rest_n += rows[j].launches;
            rest_ext += rows[j].ext_us;
            continue;
        }
        printf("| `%s` | %.1f | %.1f | %.1f | %.2f | %.1f | %.2f |\n", rows[j].name,
               rows[j].launches / steps, rows[j].us / steps,
               busy > 0 ? 100.0 * rows[j].us * 1e3 / busy : 0.0, rows[j].us / rows[j].launches,
               rows[j].ext_us / steps, rows[j].ext_us / rows[j].launches);
    }
    if (nr > STEPPROF_ROWS)
        printf("| (%zu more kernels) | %.1f | %.1f | %.1f | | %.1f | |\n", nr - STEPPROF_ROWS,
               rest_n / steps, rest_us / steps, busy > 0 ? 100.0 * rest_us * 1e3 / busy : 0.0,
               rest_ext / steps);
    fflush(stdout);
    free(rows);
    stepprof__n = 0;
    stepprof__n_marks = 0;
    pthread_mutex_unlock(&stepprof__lock);
}
