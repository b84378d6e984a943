/* pdctl_host: host names and addresses for the ops commands of pdctl.
 *
 * Decides whether a host named in the cluster file is this machine (so `pdctl up` starts the
 * nodes placed there), parses "HOST:PORT" / "[V6]:PORT" endpoints, and maps wildcard listen
 * addresses to the loopback address a client can connect to. No state; any thread.
 */
#ifndef PD_PDCTL_HOST_H
#define PD_PDCTL_HOST_H

#include <stddef.h>

#include "status.h"

/* Returns 1 when host names this machine: "localhost", a loopback or wildcard address (127.0.0.0/8,
 * ::1, 0.0.0.0, ::), this machine's host name (short or full), or an address of one of its
 * interfaces, or a name resolving to one of those; 0 otherwise (including names that do not
 * resolve). May do a DNS lookup for names that are none of the above. */
int pdctl_host_is_local(const char *host);

/* Parses "HOST:PORT" or "[V6ADDR]:PORT" (port 1..65535) into host (brackets removed) and port.
 * Returns PD_OK or PD_ERR_INVALID (no port, bad port, empty or too long host); nothing is
 * written on failure. Logs nothing: the caller names the option. */
pd_status_t pdctl_host_parse_addr(const char *addr, char *host_p, size_t host_len, int *port_p);

/* Returns the address a client should connect to for a server listening on host: "127.0.0.1" for
 * "0.0.0.0" and "", "::1" for "::", else host itself. */
const char *pdctl_host_connect_name(const char *host);

/* Formats host and port as "HOST:PORT" ("[V6]:PORT" when host contains ':') into out. */
void pdctl_host_format_addr(char *out, size_t len, const char *host, int port);

#endif
