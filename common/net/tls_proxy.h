/* tls_proxy: TLS for a plaintext server of this process. It listens on the public address,
 * completes the TLS handshake (OpenSSL; certificate and key from PEM files; ALPN offers exactly one
 * protocol: "h2" for gRPC, which clients require, or "http/1.1"), and relays the decrypted bytes
 * of each connection to the plaintext server on its loopback address and back, encrypted. The
 * plaintext servers (http.h, grpc_server.h) stay as they are and listen on 127.0.0.1 only.
 *
 * Each direction holds at most PD_TLS_PROXY_BUFFER bytes waiting to be written before it stops
 * reading the other side. A client that fails the handshake is closed (counted). When one side
 * closes, what is queued for the other is written, then both are closed.
 *
 * Loop thread only. destroy closes the listener and every connection; run the loop afterwards.
 */
#ifndef PD_TLS_PROXY_H
#define PD_TLS_PROXY_H

#include <stdint.h>

#include <uv.h>

#include "status.h"

#define PD_TLS_PROXY_BUFFER (4u << 20)

typedef struct pd_tls_proxy pd_tls_proxy_t;

typedef struct {
    const char *cert_file; /* PEM: the certificate (chain) */
    const char *key_file;  /* PEM: its private key */
    const char *alpn;      /* "h2" or "http/1.1" */
} pd_tls_params_t;

typedef struct {
    uint64_t connections;        /* accepted */
    uint64_t handshake_failures; /* closed before or during the handshake */
} pd_tls_proxy_stats_t;

/* Loads the certificate and key (PD_ERR_IO / PD_ERR_FORMAT, logged with the file), binds
 * host:port (0: ephemeral; PD_ERR_UNAVAILABLE in use, PD_ERR_IO) and relays to
 * backend_host:backend_port. Nothing is left open on failure. */
pd_status_t pd_tls_proxy_create(uv_loop_t *loop, const pd_tls_params_t *params, const char *host,
                                int port, const char *backend_host, int backend_port,
                                pd_tls_proxy_t **px_p);

/* The port it listens on. */
int pd_tls_proxy_port(const pd_tls_proxy_t *px);

void pd_tls_proxy_stats(const pd_tls_proxy_t *px, pd_tls_proxy_stats_t *stats_p);

/* Accepts NULL. */
void pd_tls_proxy_destroy(pd_tls_proxy_t *px);

#endif
