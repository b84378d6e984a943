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
    if (level == PD_LOG_DEBUG)
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
