/* pdctl_proc: the processes `pdctl up` launches and `pdctl down` stops.
 *
 * A pdctl_proc_t records one launched node process: its node name and role, the endpoint it
 * serves, its pid with the kernel's start time (so a reused pid is never signalled), and its log
 * file. Launching redirects the child's stdout and stderr to the log, detaches it from the
 * terminal (its own session) and, when asked, makes the kernel send it SIGTERM when pdctl dies.
 * Stopping sends SIGTERM, waits a grace period, then SIGKILL. Single-threaded use (fork, signals).
 */
#ifndef PD_PDCTL_PROC_H
#define PD_PDCTL_PROC_H

#include <stddef.h>
#include <stdio.h>

#include "cluster_config.h"
#include "status.h"

typedef struct {
    char name[CLUSTER_NAME_MAX];      /* node name, or "router" */
    char role[16];                    /* "prefill", "decode", "router" */
    char addr[CLUSTER_HOST_MAX + 16]; /* the gRPC endpoint it serves, "HOST:PORT" */
    int pid;
    unsigned long long start_time; /* /proc/PID/stat starttime (clock ticks); 0 = unknown */
    char log[CLUSTER_PATH_MAX];    /* stdout + stderr of the process */
} pdctl_proc_t;

/* Finds the executable name of a pdserve binary: $PDSERVE_BIN_DIR/name, then (build tree) the
 * directory of pdctl's executable /../subdir/name, then that directory itself (installed side
 * by side), then PATH. Writes the path to out_p (len bytes). Returns PD_OK or PD_ERR_NOT_FOUND
 * (out_p untouched; nothing logged, the caller says which node needed it). */
pd_status_t pdctl_proc_find_binary(const char *subdir, const char *name, char *out_p, size_t len);

/* Starts argv[0] (a path) with argv, stdin from /dev/null and stdout + stderr appended to
 * p->log, in a new session; with die_with_parent the child gets SIGTERM when pdctl exits.
 * Fills p->pid and p->start_time. Returns PD_OK; PD_ERR_IO when the log cannot be opened or the
 * exec fails (logged with the path and errno; no process is left running); PD_ERR_INTERNAL when
 * fork fails. */
pd_status_t pdctl_proc_spawn(char *const argv[], int die_with_parent, pdctl_proc_t *p);

/* Reads the start time of pid from /proc. Returns PD_OK or PD_ERR_NOT_FOUND (no such process);
 * *start_p is written only on success. */
pd_status_t pdctl_proc_start_time(int pid, unsigned long long *start_p);

/* Returns 1 when p's process is running (not a zombie; the same start time when p->start_time is
 * known), 0 otherwise. Reaps p when it is a child of this process and has exited, writing its
 * wait status to *wstatus_p when wstatus_p is not NULL (-1 when not known). */
int pdctl_proc_alive(const pdctl_proc_t *p, int *wstatus_p);

/* Stops the n processes of procs that are still alive: SIGTERM to all, up to grace_ms for them
 * to exit, then SIGKILL to the rest and up to 2 s more. Dead or reused pids are skipped. Writes
 * how many needed SIGKILL to *killed_p when not NULL. Returns PD_OK when all are gone,
 * PD_ERR_INTERNAL when some survive SIGKILL (each logged with its pid). */
pd_status_t pdctl_proc_stop(const pdctl_proc_t *procs, size_t n, int grace_ms, int *killed_p);

/* Prints the last max_lines lines of the file at path to out, each prefixed with "  | ".
 * Prints "  (log is empty)" or "  (no log at PATH)" when there is nothing to show. */
void pdctl_proc_log_tail(const char *path, int max_lines, FILE *out);

/* Describes a wait status ("exited with status 3", "killed by signal 9 (Killed)") into out. */
void pdctl_proc_describe_exit(int wstatus, char *out, size_t len);

#endif
