/* pdctl_proc: the processes `pdctl up` launches and `pdctl down` stops. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "pdctl_proc.h"

static int pdctl_proc__is_exec(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

pd_status_t pdctl_proc_find_binary(const char *subdir, const char *name, char *out_p, size_t len)
{
    char exe[CLUSTER_PATH_MAX], cand[2 * CLUSTER_PATH_MAX];
    const char *env = getenv("PDSERVE_BIN_DIR"), *path;
    ssize_t n;

    if (env && *env) {
        snprintf(cand, sizeof cand, "%s/%s", env, name);
        if (pdctl_proc__is_exec(cand))
            goto found;
    }
    n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(cand, sizeof cand, "%s/../%s/%s", exe, subdir, name);
            if (pdctl_proc__is_exec(cand))
                goto found;
            snprintf(cand, sizeof cand, "%s/%s", exe, name);
            if (pdctl_proc__is_exec(cand))
                goto found;
        }
    }
    path = getenv("PATH");
    while (path && *path) {
        size_t dl = strcspn(path, ":");
        snprintf(cand, sizeof cand, "%.*s/%s", (int)(dl ? dl : 1), dl ? path : ".", name);
        if (pdctl_proc__is_exec(cand))
            goto found;
        path += dl + (path[dl] == ':');
    }
    return PD_ERR_NOT_FOUND;
found:
    if (strlen(cand) >= len)
        return PD_ERR_NOT_FOUND;
    snprintf(out_p, len, "%s", cand);
    return PD_OK;
}

/* Child side of spawn: never returns. Reports errno through err_fd when exec fails. */
static _Noreturn void pdctl_proc__child(char *const argv[], int log_fd, int err_fd,
                                        int die_with_parent, pid_t parent)
{
    int null_fd, e;

    setsid();
    if (die_with_parent) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127); /* the parent died before prctl */
    }
    null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0)
        dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    /* default dispositions and mask for the node (pdctl blocks and catches signals) */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    execv(argv[0], argv);
    e = errno;
    if (write(err_fd, &e, sizeof e) < 0) {
        /* nothing more to do */
    }
    _exit(127);
}

pd_status_t pdctl_proc_spawn(char *const argv[], int die_with_parent, pdctl_proc_t *p)
{
    int log_fd, pipe_fd[2], e = 0;
    pid_t pid, parent = getpid();
    ssize_t r;

    log_fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
        pd_log_error("%s: cannot open log %s: %s", p->name, p->log, strerror(errno));
        return PD_ERR_IO;
    }
    if (pipe2(pipe_fd, O_CLOEXEC) != 0) {
        pd_log_error("%s: pipe: %s", p->name, strerror(errno));
        goto err_close_log;
    }
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        pd_log_error("%s: fork: %s", p->name, strerror(errno));
        close(pipe_fd[0]);
        close(pipe_fd[1]);
        close(log_fd);
        return PD_ERR_INTERNAL;
    }
    if (pid == 0)
        pdctl_proc__child(argv, log_fd, pipe_fd[1], die_with_parent, parent);
    close(pipe_fd[1]);
    close(log_fd);
    do
        r = read(pipe_fd[0], &e, sizeof e);
    while (r < 0 && errno == EINTR);
    close(pipe_fd[0]);
    if (r == (ssize_t)sizeof e) {
        waitpid(pid, NULL, 0);
        pd_log_error("%s: cannot execute %s: %s", p->name, argv[0], strerror(e));
        return PD_ERR_IO;
    }
    p->pid = (int)pid;
    if (pdctl_proc_start_time(p->pid, &p->start_time) != PD_OK)
        p->start_time = 0; /* already gone: alive() reports it */
    return PD_OK;
err_close_log:
    close(log_fd);
    return PD_ERR_IO;
}

/* Reads field 3 (state) and field 22 (starttime) of /proc/PID/stat. */
static pd_status_t pdctl_proc__stat(int pid, char *state_p, unsigned long long *start_p)
{
    char path[64], buf[1024], *rp, *save = NULL, *tok;
    FILE *f;
    size_t n;
    int field = 2;

    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    f = fopen(path, "r");
    if (!f)
        return PD_ERR_NOT_FOUND;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    rp = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!rp)
        return PD_ERR_NOT_FOUND;
    for (tok = strtok_r(rp + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        field++;
        if (field == 3)
            *state_p = tok[0];
        if (field == 22) {
            *start_p = strtoull(tok, NULL, 10);
            return PD_OK;
        }
    }
    return PD_ERR_NOT_FOUND;
}

pd_status_t pdctl_proc_start_time(int pid, unsigned long long *start_p)
{
    char state;
    unsigned long long start;
    if (pdctl_proc__stat(pid, &state, &start) != PD_OK)
        return PD_ERR_NOT_FOUND;
    *start_p = start;
    return PD_OK;
}

int pdctl_proc_alive(const pdctl_proc_t *p, int *wstatus_p)
{
    char state = 0;
    unsigned long long start = 0;
    int ws;

    if (wstatus_p)
        *wstatus_p = -1;
    if (p->pid <= 0)
        return 0;
    if (waitpid(p->pid, &ws, WNOHANG) == p->pid) {
        if (wstatus_p)
            *wstatus_p = ws;
        return 0;
    }
    if (pdctl_proc__stat(p->pid, &state, &start) != PD_OK)
        return 0;
    if (state == 'Z' || state == 'X')
        return 0;
    return p->start_time == 0 || p->start_time == start;
}

static void pdctl_proc__sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Waits up to ms for every process flagged in live to exit; clears their flags. Returns how many
 * are still alive. */
static size_t pdctl_proc__wait(const pdctl_proc_t *procs, size_t n, char *live, int ms)
{
    size_t left;
    for (int waited = 0;; waited += 20) {
        left = 0;
        for (size_t i = 0; i < n; i++) {
            if (live[i] && !pdctl_proc_alive(&procs[i], NULL))
                live[i] = 0;
            left += live[i] != 0;
        }
        if (left == 0 || waited >= ms)
            return left;
        pdctl_proc__sleep_ms(20);
    }
}

pd_status_t pdctl_proc_stop(const pdctl_proc_t *procs, size_t n, int grace_ms, int *killed_p)
{
    char *live = calloc(n ? n : 1, 1);
    size_t left;
    int killed = 0;
    pd_status_t st = PD_OK;

    PD_ASSERT(live);
    for (size_t i = 0; i < n; i++) {
        live[i] = (char)pdctl_proc_alive(&procs[i], NULL);
        if (live[i] && kill(procs[i].pid, SIGTERM) != 0 && errno != ESRCH)
            pd_log_error("%s: kill(%d, SIGTERM): %s", procs[i].name, procs[i].pid, strerror(errno));
    }
    left = pdctl_proc__wait(procs, n, live, grace_ms);
    if (left > 0) {
        for (size_t i = 0; i < n; i++)
            if (live[i] && kill(procs[i].pid, SIGKILL) == 0)
                killed++;
        left = pdctl_proc__wait(procs, n, live, 2000);
        for (size_t i = 0; i < n && left; i++)
            if (live[i]) {
                pd_log_error("%s: pid %d survived SIGKILL", procs[i].name, procs[i].pid);
                st = PD_ERR_INTERNAL;
            }
    }
    free(live);
    if (killed_p)
        *killed_p = killed;
    return st;
}

void pdctl_proc_log_tail(const char *path, int max_lines, FILE *out)
{
    char buf[8192];
    FILE *f = fopen(path, "r");
    long size, from;
    size_t n;
    int lines = 0;
    char *start;

    if (!f) {
        fprintf(out, "  (no log at %s)\n", path);
        return;
    }
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    fseek(f, from, SEEK_SET);
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    while (n > 0 && buf[n - 1] == '\n')
        buf[--n] = 0;
    if (n == 0) {
        fprintf(out, "  (log is empty: %s)\n", path);
        return;
    }
    start = buf + n;
    while (start > buf) {
        if (start[-1] == '\n' && ++lines >= max_lines)
            break;
        start--;
    }
    while (*start) {
        size_t l = strcspn(start, "\n");
        fprintf(out, "  | %.*s\n", (int)l, start);
        start += l + (start[l] == '\n');
    }
}

void pdctl_proc_describe_exit(int wstatus, char *out, size_t len)
{
    if (wstatus < 0)
        snprintf(out, len, "exited");
    else if (WIFEXITED(wstatus))
        snprintf(out, len, "exited with status %d", WEXITSTATUS(wstatus));
    else if (WIFSIGNALED(wstatus))
        snprintf(out, len, "killed by signal %d (%s)", WTERMSIG(wstatus),
                 strsignal(WTERMSIG(wstatus)));
    else
        snprintf(out, len, "stopped (status 0x%x)", (unsigned)wstatus);
}
