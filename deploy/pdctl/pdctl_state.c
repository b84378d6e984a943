/* pdctl_state: the state file of a cluster started by `pdctl up`. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "pdctl_state.h"

#define PDCTL_STATE_MAGIC "pdserve-state 1"

void pdctl_state_init(pdctl_state_t *st)
{
    memset(st, 0, sizeof *st);
}

void pdctl_state_deinit(pdctl_state_t *st)
{
    if (!st)
        return;
    free(st->procs);
    pdctl_state_init(st);
}

pd_status_t pdctl_state_add(pdctl_state_t *st, const pdctl_proc_t *p)
{
    pdctl_proc_t *np = realloc(st->procs, (st->n_procs + 1) * sizeof *np);
    if (!np)
        return PD_ERR_NOMEM;
    st->procs = np;
    st->procs[st->n_procs++] = *p;
    return PD_OK;
}

pd_status_t pdctl_state_path(const char *config_abs, const char *suffix, char *out_p, size_t len)
{
    const char *dir = getenv("PDSERVE_STATE_DIR"), *base, *dot;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 of the absolute path */
    char stem[128];
    int n;

    if (!dir || !*dir)
        dir = getenv("XDG_RUNTIME_DIR");
    if (!dir || !*dir)
        dir = "/tmp";
    for (const char *c = config_abs; *c; c++)
        h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    base = strrchr(config_abs, '/');
    base = base ? base + 1 : config_abs;
    dot = strrchr(base, '.');
    n = (int)(dot && dot != base ? (size_t)(dot - base) : strlen(base));
    if (n > 64)
        n = 64;
    snprintf(stem, sizeof stem, "%.*s", n, base);
    for (char *c = stem; *c; c++)
        if (*c == '\t' || *c == ' ' || *c == '/')
            *c = '_';
    n = snprintf(NULL, 0, "%s/pdserve-%s-%016llx%s", dir, stem, (unsigned long long)h, suffix);
    if (n < 0 || (size_t)n >= len)
        return PD_ERR_TOO_LONG;
    snprintf(out_p, len, "%s/pdserve-%s-%016llx%s", dir, stem, (unsigned long long)h, suffix);
    return PD_OK;
}

pd_status_t pdctl_state_write(const char *path, const pdctl_state_t *st)
{
    char tmp[CLUSTER_PATH_MAX + 32];
    FILE *f;

    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    f = fopen(tmp, "w");
    if (!f) {
        pd_log_error("state file %s: %s", tmp, strerror(errno));
        return PD_ERR_IO;
    }
    fprintf(f, "%s\nconfig\t%s\nowner\t%d\n", PDCTL_STATE_MAGIC, st->config, st->owner_pid);
    for (size_t i = 0; i < st->n_procs; i++) {
        const pdctl_proc_t *p = &st->procs[i];
        fprintf(f, "proc\t%s\t%s\t%s\t%d\t%llu\t%s\n", p->name, p->role, p->addr, p->pid,
                p->start_time, p->log);
    }
    if (ferror(f) | fclose(f)) {
        pd_log_error("state file %s: write failed", tmp);
        goto err_unlink;
    }
    if (rename(tmp, path) != 0) {
        pd_log_error("state file %s: rename: %s", path, strerror(errno));
        goto err_unlink;
    }
    return PD_OK;
err_unlink:
    unlink(tmp);
    return PD_ERR_IO;
}

/* Copies the next tab-separated field of *s into out (len bytes); 0 when missing or too long. */
static int pdctl_state__field(char **s, char *out, size_t len, int last)
{
    char *f = *s;
    size_t n;
    if (!f)
        return 0;
    n = last ? strlen(f) : strcspn(f, "\t");
    if ((!last && f[n] != '\t') || n >= len)
        return 0;
    memcpy(out, f, n);
    out[n] = 0;
    *s = last ? NULL : f + n + 1;
    return 1;
}

/* Parses one "proc" line (after "proc\t"). */
static int pdctl_state__proc(char *s, pdctl_proc_t *p)
{
    char pid[32], start[32], *end;
    long v;

    memset(p, 0, sizeof *p);
    if (!pdctl_state__field(&s, p->name, sizeof p->name, 0) ||
        !pdctl_state__field(&s, p->role, sizeof p->role, 0) ||
        !pdctl_state__field(&s, p->addr, sizeof p->addr, 0) ||
        !pdctl_state__field(&s, pid, sizeof pid, 0) ||
        !pdctl_state__field(&s, start, sizeof start, 0) ||
        !pdctl_state__field(&s, p->log, sizeof p->log, 1))
        return 0;
    v = strtol(pid, &end, 10);
    if (*end || v <= 0 || v > INT32_MAX)
        return 0;
    p->pid = (int)v;
    p->start_time = strtoull(start, &end, 10);
    return *end == 0 && *start;
}

pd_status_t pdctl_state_read(const char *path, pdctl_state_t *st_p)
{
    char line[2 * CLUSTER_PATH_MAX + 512];
    FILE *f = fopen(path, "r");
    int lineno = 0, have_config = 0;
    pd_status_t st = PD_OK;

    pdctl_state_deinit(st_p);
    if (!f) {
        if (errno == ENOENT)
            return PD_ERR_NOT_FOUND;
        pd_log_error("state file %s: %s", path, strerror(errno));
        return PD_ERR_IO;
    }
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        lineno++;
        if (n && line[n - 1] == '\n')
            line[--n] = 0;
        else if (!feof(f))
            goto bad;
        if (lineno == 1) {
            if (strcmp(line, PDCTL_STATE_MAGIC) != 0)
                goto bad;
        } else if (strncmp(line, "config\t", 7) == 0) {
            if (n - 7 >= sizeof st_p->config)
                goto bad;
            memcpy(st_p->config, line + 7, n - 6);
            have_config = 1;
        } else if (strncmp(line, "owner\t", 6) == 0) {
            char *end;
            long v = strtol(line + 6, &end, 10);
            if (*end || v < 0 || v > INT32_MAX)
                goto bad;
            st_p->owner_pid = (int)v;
        } else if (strncmp(line, "proc\t", 5) == 0) {
            pdctl_proc_t p;
            if (!pdctl_state__proc(line + 5, &p))
                goto bad;
            if ((st = pdctl_state_add(st_p, &p)) != PD_OK)
                goto err;
        } else if (n > 0)
            goto bad;
    }
    if (lineno == 0 || !have_config) {
        lineno++;
        goto bad;
    }
    fclose(f);
    return PD_OK;
bad:
    pd_log_error("state file %s:%d: malformed line", path, lineno);
    st = PD_ERR_FORMAT;
err:
    fclose(f);
    pdctl_state_deinit(st_p);
    return st;
}

pd_status_t pdctl_state_remove(const char *path)
{
    if (unlink(path) == 0)
        return PD_OK;
    if (errno == ENOENT)
        return PD_ERR_NOT_FOUND;
    pd_log_error("state file %s: %s", path, strerror(errno));
    return PD_ERR_IO;
}
