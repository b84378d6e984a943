/* log: leveled logging to stderr, one line per message, lowercase, with its context.
 *
 * The level comes from pd_log_set_level() or, at first use, the PD_LOG environment variable
 * (error, warn, info, debug; default info). Lines go to stderr as text or, with
 * pd_log_set_json, as JSON objects. Thread-safe: each message is written with one
 * fprintf call. pd_log_progress() draws a progress bar when stderr is a terminal and prints
 * nothing otherwise (so tests and CI logs stay clean).
 */
#ifndef PD_LOG_H
#define PD_LOG_H

#include <stddef.h>

typedef enum { PD_LOG_ERROR = 0, PD_LOG_WARN, PD_LOG_INFO, PD_LOG_DEBUG } pd_log_level_t;

/* Sets the lowest level that is printed. */
void pd_log_set_level(pd_log_level_t level);

/* json nonzero: each message is one JSON object on its line (--log-format json, for journald /
 * log shippers): {"ts":"2026-12-01T04:40:13.123Z","level":"info","tag":"decode0","msg":"..."}
 * (plus "src":"file.c:line" at debug). Set by main() before threads start. */
void pd_log_set_json(int json);

/* Sets a short tag (e.g. the node name) printed in front of every message; NULL clears it. */
void pd_log_set_tag(const char *tag);

/* Returns nonzero when messages of this level are printed. */
int pd_log_enabled(pd_log_level_t level);

void pd_log_write(pd_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define pd_log_error(...) pd_log_write(PD_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define pd_log_warn(...) pd_log_write(PD_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define pd_log_info(...) pd_log_write(PD_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define pd_log_debug(...) pd_log_write(PD_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

/* Shows "label [#####     ] done/total" on a terminal; a call with done == total ends the line. */
void pd_log_progress(const char *label, size_t done, size_t total);

#endif
