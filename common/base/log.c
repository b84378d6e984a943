#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The level is read by every thread and may be set at any time: an atomic, initialised from
 * PD_LOG exactly once (pthread_once) unless pd_log_set_level came first. */
static _Atomic int log_level = -1;
static char log_tag[32]; /* set by main() before threads start */
static int log_json;     /* likewise */
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log__init(void)
{
    const char *env = getenv("PD_LOG");
    int level = PD_LOG_INFO, unset = -1;

    if (env && strcmp(env, "error") == 0)
        level = PD_LOG_ERROR;
    else if (env && strcmp(env, "warn") == 0)
        level = PD_LOG_WARN;
    else if (env && strcmp(env, "debug") == 0)
        level = PD_LOG_DEBUG;
    atomic_compare_exchange_strong(&log_level, &unset, level);
}

static int log__level(void)
{
    pthread_once(&log_once, log__init);
    return atomic_load_explicit(&log_level, memory_order_relaxed);
}

void pd_log_set_level(pd_log_level_t level)
{
    pthread_once(&log_once, log__init);
    atomic_store(&log_level, (int)level);
}

void pd_log_set_json(int json)
{
    log_json = json;
}

/* Appends s to out (cap bytes, NUL-terminated, cut if need be) as the inside of a JSON string. */
static size_t log__json_str(char *out, size_t cap, size_t n, const char *s)
{
    for (; *s && n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
        } else
            out[n++] = (char)c;
    }
    out[n] = 0;
    return n;
}

static void log__write_json(const char *level, const struct tm *tm, long ms, const char *msg,
                            const char *src, int line)
{
    char out[3072];
    size_t n = (size_t)snprintf(out, sizeof out,
                                "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\","
                                "\"tag\":\"",
                                tm->tm_year + 1900, tm->tm_mon + 1, tm->tm_mday, tm->tm_hour,
                                tm->tm_min, tm->tm_sec, ms, level);
    n = log__json_str(out, sizeof out, n, log_tag);
    n += (size_t)snprintf(out + n, sizeof out - n, "\",\"msg\":\"");
    n = log__json_str(out, sizeof out, n, msg);
    if (src)
        n += (size_t)snprintf(out + n, sizeof out - n, "\",\"src\":\"%s:%d", src, line);
    fprintf(stderr, "%s\"}\n", out);
}

void pd_log_set_tag(const char *tag)
{
    snprintf(log_tag, sizeof log_tag, "%s", tag ? tag : "");
}

int pd_log_enabled(pd_log_level_t level)
{
    return (int)level <= log__level();
}

void pd_log_write(pd_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    char msg[1024];
    va_list ap;
    struct timespec ts;
    struct tm tm;

    if (!pd_log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (log_json)
        log__write_json(names[level], &tm, ts.tv_nsec / 1000000, msg,
                        level == PD_LOG_DEBUG ? base : NULL, line);
    else if (level == PD_LOG_DEBUG)
        fprintf(stderr, "%02d:%02d:%02d.%03ld %s%s%s: %s (%s:%d)\n", tm.tm_hour, tm.tm_min,
                tm.tm_sec, ts.tv_nsec / 1000000, log_tag, log_tag[0] ? " " : "", names[level], msg,
                base, line);
    else
        fprintf(stderr, "%02d:%02d:%02d.%03ld %s%s%s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, log_tag, log_tag[0] ? " " : "", names[level], msg);
}

void pd_log_progress(const char *label, size_t done, size_t total)
{
    char bar[31];
    size_t fill;

    if (!isatty(STDERR_FILENO) || total == 0)
        return;
    fill = done * 30 / total;
    memset(bar, '#', fill);
    memset(bar + fill, ' ', 30 - fill);
    bar[30] = 0;
    fprintf(stderr, "\r%s [%s] %zu/%zu", label, bar, done, total);
    if (done >= total)
        fputc('\n', stderr);
    fflush(stderr);
}
