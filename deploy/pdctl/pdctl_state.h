/* pdctl_state: the state file of a cluster started by `pdctl up`.
 *
 * One file per cluster config, named from the config's absolute path, in $PDSERVE_STATE_DIR,
 * else $XDG_RUNTIME_DIR, else /tmp: "pdserve-<config base name>-<16 hex digits>.state". It
 * records the config path, the pid of a foreground `pdctl up` (0 when detached) and every process
 * launched (pdctl_proc_t), one tab-separated line each, so `pdctl down` can stop them from another
 * shell. The default log directory sits next to it ("...-<hash>.logs"). Files are written to a
 * temporary name and renamed, so a reader never sees half a file. A pdctl_state_t is caller-owned
 * storage (init/deinit); it owns its procs array. No global state; any thread.
 */
#ifndef PD_PDCTL_STATE_H
#define PD_PDCTL_STATE_H

#include <stddef.h>

#include "pdctl_proc.h"
#include "status.h"

typedef struct {
    char config[CLUSTER_PATH_MAX]; /* absolute path of the cluster file */
    int owner_pid;                 /* the foreground `pdctl up`, 0 when detached */
    pdctl_proc_t *procs;           /* (n_procs) in start order */
    size_t n_procs;
} pdctl_state_t;

/* Prepares empty caller-owned storage. */
void pdctl_state_init(pdctl_state_t *st);

/* Frees the procs array; st may be initialized again. Accepts NULL. */
void pdctl_state_deinit(pdctl_state_t *st);

/* Appends a copy of p. Returns PD_OK or PD_ERR_NOMEM (st unchanged). */
pd_status_t pdctl_state_add(pdctl_state_t *st, const pdctl_proc_t *p);

/* Writes the path of the state file of config_abs (an absolute path) with the given suffix
 * (".state", ".logs") to out_p. Returns PD_OK or PD_ERR_TOO_LONG (out_p untouched). */
pd_status_t pdctl_state_path(const char *config_abs, const char *suffix, char *out_p, size_t len);

/* Writes st to path atomically (temporary file + rename). Returns PD_OK or PD_ERR_IO (logged
 * with the path; no temporary file is left behind). */
pd_status_t pdctl_state_write(const char *path, const pdctl_state_t *st);

/* Reads the state file at path into st_p (initialized by the caller; previous procs are
 * dropped). Returns PD_OK; PD_ERR_NOT_FOUND when there is no file (nothing logged);
 * PD_ERR_FORMAT (a malformed line, logged with path:line) or PD_ERR_IO (logged) or
 * PD_ERR_NOMEM, leaving st_p empty. */
pd_status_t pdctl_state_read(const char *path, pdctl_state_t *st_p);

/* Removes the state file at path. Returns PD_OK, PD_ERR_NOT_FOUND (no file; nothing logged) or
 * PD_ERR_IO (logged). */
pd_status_t pdctl_state_remove(const char *path);

#endif
