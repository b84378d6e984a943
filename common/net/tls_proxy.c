#include "tls_proxy.h"

#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "log.h"

#define PD_TLS_PROXY__CHUNK (16u << 10)

typedef struct pd_tls_proxy__conn pd_tls_proxy__conn_t;

struct pd_tls_proxy {
    uv_loop_t *loop;
    SSL_CTX *ctx;
    unsigned char alpn[32]; /* wire format: length byte, then the name */
    size_t alpn_len;
    int h2; /* the protocol is h2: a client that does not offer it fails the handshake */
    uv_tcp_t listener;
    int listener_open, port, destroyed, pending_closes;
    struct sockaddr_storage backend;
    pd_tls_proxy__conn_t *conns;
    pd_tls_proxy_stats_t stats;
};

/* one side of a connection */
typedef struct {
    uv_tcp_t tcp;
    size_t queued; /* bytes written, not yet confirmed */
    int reading;   /* uv_read_start is on */
    int eof;       /* read end or error */
    int shut;      /* uv_shutdown started */
} pd_tls_proxy__side_t;

struct pd_tls_proxy__conn {
    pd_tls_proxy_t *px;
    pd_tls_proxy__side_t client, backend;
    uv_connect_t connect_req;
    uv_shutdown_t shut_client, shut_backend;
    SSL *ssl;
    BIO *rbio, *wbio; /* ciphertext in from the client, out to the client */
    int handshaken, connected, closing, open_handles;
    char *early; /* plaintext for the backend before it connected */
    size_t early_len;
    pd_tls_proxy__conn_t *prev, *next;
};

typedef struct {
    uv_write_t req;
    pd_tls_proxy__conn_t *pc;
    pd_tls_proxy__side_t *side;
    size_t len;
    char data[];
} pd_tls_proxy__write_t;

static void pd_tls_proxy__close(pd_tls_proxy__conn_t *pc);
static void pd_tls_proxy__update_reading(pd_tls_proxy__conn_t *pc);

/* ==== lifetime ==== */

static void pd_tls_proxy__maybe_free_px(pd_tls_proxy_t *px)
{
    if (px->destroyed && px->pending_closes == 0 && !px->conns) {
        SSL_CTX_free(px->ctx);
        free(px);
    }
}

static void pd_tls_proxy__handle_closed(uv_handle_t *h)
{
    pd_tls_proxy__conn_t *pc = h->data;
    pd_tls_proxy_t *px = pc->px;
    if (--pc->open_handles > 0)
        return;
    if (pc->prev)
        pc->prev->next = pc->next;
    else
        px->conns = pc->next;
    if (pc->next)
        pc->next->prev = pc->prev;
    SSL_free(pc->ssl); /* frees the BIOs */
    free(pc->early);
    free(pc);
    pd_tls_proxy__maybe_free_px(px);
}

static void pd_tls_proxy__close(pd_tls_proxy__conn_t *pc)
{
    if (pc->closing)
        return;
    pc->closing = 1;
    uv_close((uv_handle_t *)&pc->client.tcp, pd_tls_proxy__handle_closed);
    uv_close((uv_handle_t *)&pc->backend.tcp, pd_tls_proxy__handle_closed);
}

static void pd_tls_proxy__shut_done(uv_shutdown_t *req, int status)
{
    (void)status;
    pd_tls_proxy__close(req->data);
}

/* One side ended: the other gets what is queued for it, then both close. */
static void pd_tls_proxy__end(pd_tls_proxy__conn_t *pc, pd_tls_proxy__side_t *to)
{
    uv_shutdown_t *req = to == &pc->client ? &pc->shut_client : &pc->shut_backend;
    if (pc->closing || to->shut)
        return;
    if (to == &pc->backend && !pc->connected) {
        pd_tls_proxy__close(pc);
        return;
    }
    to->shut = 1;
    req->data = pc;
    if (uv_shutdown(req, (uv_stream_t *)&to->tcp, pd_tls_proxy__shut_done) != 0)
        pd_tls_proxy__close(pc);
}

/* ==== writes ==== */

static void pd_tls_proxy__write_done(uv_write_t *req, int status)
{
    pd_tls_proxy__write_t *w = (pd_tls_proxy__write_t *)req;
    pd_tls_proxy__conn_t *pc = w->pc;
    w->side->queued -= w->len;
    free(w);
    if (status < 0) {
        pd_tls_proxy__close(pc);
        return;
    }
    pd_tls_proxy__update_reading(pc);
}

static int pd_tls_proxy__write(pd_tls_proxy__conn_t *pc, pd_tls_proxy__side_t *to, const void *data,
                               size_t len)
{
    pd_tls_proxy__write_t *w;
    uv_buf_t b;
    if (pc->closing || to->shut)
        return -1;
    if (!(w = malloc(sizeof *w + len))) {
        pd_tls_proxy__close(pc);
        return -1;
    }
    w->pc = pc;
    w->side = to;
    w->len = len;
    memcpy(w->data, data, len);
    b = uv_buf_init(w->data, (unsigned)len);
    to->queued += len;
    if (uv_write(&w->req, (uv_stream_t *)&to->tcp, &b, 1, pd_tls_proxy__write_done) != 0) {
        to->queued -= len;
        free(w);
        pd_tls_proxy__close(pc);
        return -1;
    }
    return 0;
}

/* Sends what OpenSSL has for the client. */
static int pd_tls_proxy__flush_tls(pd_tls_proxy__conn_t *pc)
{
    char buf[PD_TLS_PROXY__CHUNK];
    int n;
    while ((n = BIO_read(pc->wbio, buf, sizeof buf)) > 0)
        if (pd_tls_proxy__write(pc, &pc->client, buf, (size_t)n) < 0)
            return -1;
    return 0;
}

static void pd_tls_proxy__to_backend(pd_tls_proxy__conn_t *pc, const char *data, size_t len)
{
    if (pc->connected) {
        pd_tls_proxy__write(pc, &pc->backend, data, len);
        return;
    }
    char *e = realloc(pc->early, pc->early_len + len);
    if (!e) {
        pd_tls_proxy__close(pc);
        return;
    }
    memcpy(e + pc->early_len, data, len);
    pc->early = e;
    pc->early_len += len;
}

/* ==== reads ==== */

static void pd_tls_proxy__alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    buf->base = malloc(PD_TLS_PROXY__CHUNK);
    buf->len = buf->base ? PD_TLS_PROXY__CHUNK : 0;
}

/* Handshake, then decrypt what the client sent and pass it on. */
static void pd_tls_proxy__from_client_tls(pd_tls_proxy__conn_t *pc)
{
    char buf[PD_TLS_PROXY__CHUNK];
    int n;

    if (!pc->handshaken) {
        n = SSL_do_handshake(pc->ssl);
        if (pd_tls_proxy__flush_tls(pc) < 0)
            return;
        if (n != 1) {
            int err = SSL_get_error(pc->ssl, n);
            if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE)
                return;
            unsigned long e = ERR_get_error();
            pd_log_debug("tls: handshake failed: %s", e ? ERR_reason_error_string(e) : "closed");
            ERR_clear_error();
            pc->px->stats.handshake_failures++;
            pd_tls_proxy__end(pc, &pc->client); /* the alert, if any, goes out first */
            return;
        }
        pc->handshaken = 1;
        pd_tls_proxy__update_reading(pc); /* the backend may speak now */
    }
    while ((n = SSL_read(pc->ssl, buf, sizeof buf)) > 0)
        pd_tls_proxy__to_backend(pc, buf, (size_t)n);
    int err = SSL_get_error(pc->ssl, n);
    pd_tls_proxy__flush_tls(pc); /* session tickets, key updates */
    if (err == SSL_ERROR_ZERO_RETURN ||
        (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE)) {
        ERR_clear_error();
        pc->client.eof = 1;
        pd_tls_proxy__end(pc, &pc->backend);
    }
}

static void pd_tls_proxy__on_client_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    pd_tls_proxy__conn_t *pc = s->data;
    if (nread > 0 && !pc->closing) {
        BIO_write(pc->rbio, buf->base, (int)nread);
        pd_tls_proxy__from_client_tls(pc);
    } else if (nread < 0 && !pc->closing) {
        if (!pc->handshaken)
            pc->px->stats.handshake_failures++;
        pc->client.eof = 1;
        pd_tls_proxy__update_reading(pc);
        pd_tls_proxy__end(pc, &pc->backend);
    }
    free(buf->base);
}

static void pd_tls_proxy__on_backend_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    pd_tls_proxy__conn_t *pc = s->data;
    if (nread > 0 && !pc->closing) {
        if (SSL_write(pc->ssl, buf->base, (int)nread) <= 0) {
            ERR_clear_error();
            pd_tls_proxy__close(pc);
        } else
            pd_tls_proxy__flush_tls(pc);
    } else if (nread < 0 && !pc->closing) {
        pc->backend.eof = 1;
        pd_tls_proxy__update_reading(pc);
        SSL_shutdown(pc->ssl); /* close_notify */
        ERR_clear_error();
        if (pd_tls_proxy__flush_tls(pc) == 0)
            pd_tls_proxy__end(pc, &pc->client);
    }
    free(buf->base);
}

/* Reads a side while the other has room (and, for the backend, once the handshake is done). */
static void pd_tls_proxy__update_reading(pd_tls_proxy__conn_t *pc)
{
    if (pc->closing)
        return;
    int c = !pc->client.eof && pc->backend.queued < PD_TLS_PROXY_BUFFER;
    int b = !pc->backend.eof && pc->connected && pc->handshaken &&
            pc->client.queued < PD_TLS_PROXY_BUFFER;
    if (c != pc->client.reading) {
        if (c)
            uv_read_start((uv_stream_t *)&pc->client.tcp, pd_tls_proxy__alloc,
                          pd_tls_proxy__on_client_read);
        else
            uv_read_stop((uv_stream_t *)&pc->client.tcp);
        pc->client.reading = c;
    }
    if (b != pc->backend.reading) {
        if (b)
            uv_read_start((uv_stream_t *)&pc->backend.tcp, pd_tls_proxy__alloc,
                          pd_tls_proxy__on_backend_read);
        else
            uv_read_stop((uv_stream_t *)&pc->backend.tcp);
        pc->backend.reading = b;
    }
}

static void pd_tls_proxy__on_connect(uv_connect_t *req, int status)
{
    pd_tls_proxy__conn_t *pc = req->data;
    if (pc->closing)
        return;
    if (status < 0) {
        pd_log_warn("tls: connect to the plaintext server: %s", uv_strerror(status));
        pd_tls_proxy__close(pc);
        return;
    }
    pc->connected = 1;
    if (pc->early_len) {
        pd_tls_proxy__write(pc, &pc->backend, pc->early, pc->early_len);
        free(pc->early);
        pc->early = NULL;
        pc->early_len = 0;
    }
    if (pc->client.eof)
        pd_tls_proxy__end(pc, &pc->backend);
    pd_tls_proxy__update_reading(pc);
}

static void pd_tls_proxy__on_accept(uv_stream_t *server, int status)
{
    pd_tls_proxy_t *px = server->data;
    pd_tls_proxy__conn_t *pc;

    if (status < 0 || px->destroyed)
        return;
    if (!(pc = calloc(1, sizeof *pc)))
        return;
    pc->px = px;
    uv_tcp_init(px->loop, &pc->client.tcp);
    uv_tcp_init(px->loop, &pc->backend.tcp);
    pc->client.tcp.data = pc->backend.tcp.data = pc;
    pc->open_handles = 2;
    pc->next = px->conns;
    if (px->conns)
        px->conns->prev = pc;
    px->conns = pc;
    if (uv_accept(server, (uv_stream_t *)&pc->client.tcp) != 0) {
        pd_tls_proxy__close(pc);
        return;
    }
    px->stats.connections++;
    uv_tcp_nodelay(&pc->client.tcp, 1);
    uv_tcp_nodelay(&pc->backend.tcp, 1);
    pc->ssl = SSL_new(px->ctx);
    pc->rbio = BIO_new(BIO_s_mem());
    pc->wbio = BIO_new(BIO_s_mem());
    if (!pc->ssl || !pc->rbio || !pc->wbio) { /* the BIOs belong to no SSL yet */
        BIO_free(pc->rbio);
        BIO_free(pc->wbio);
        pc->rbio = pc->wbio = NULL;
        pd_tls_proxy__close(pc);
        return;
    }
    SSL_set_bio(pc->ssl, pc->rbio, pc->wbio);
    SSL_set_accept_state(pc->ssl);
    pc->connect_req.data = pc;
    if (uv_tcp_connect(&pc->connect_req, &pc->backend.tcp, (struct sockaddr *)&px->backend,
                       pd_tls_proxy__on_connect) != 0) {
        pd_tls_proxy__close(pc);
        return;
    }
    pd_tls_proxy__update_reading(pc);
}

/* ==== setup ==== */

static int pd_tls_proxy__alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                                     const unsigned char *in, unsigned int inlen, void *arg)
{
    pd_tls_proxy_t *px = arg;
    unsigned char *sel;
    (void)ssl;
    if (SSL_select_next_proto(&sel, outlen, px->alpn, (unsigned)px->alpn_len, in, inlen) ==
        OPENSSL_NPN_NEGOTIATED) {
        *out = sel;
        return SSL_TLSEXT_ERR_OK;
    }
    /* gRPC needs h2; an HTTP/1.1 client may offer only other protocols (or none) */
    return px->h2 ? SSL_TLSEXT_ERR_ALERT_FATAL : SSL_TLSEXT_ERR_NOACK;
}

static void pd_tls_proxy__listener_closed(uv_handle_t *h)
{
    pd_tls_proxy_t *px = h->data;
    px->pending_closes--;
    pd_tls_proxy__maybe_free_px(px);
}

pd_status_t pd_tls_proxy_create(uv_loop_t *loop, const pd_tls_params_t *params, const char *host,
                                int port, const char *backend_host, int backend_port,
                                pd_tls_proxy_t **px_p)
{
    pd_tls_proxy_t *px;
    struct sockaddr_storage addr;
    int rc, len = (int)sizeof addr;
    size_t alen = strlen(params->alpn);

    if (alen == 0 || alen > 30)
        return PD_ERR_INVALID;
    if (!(px = calloc(1, sizeof *px)))
        return PD_ERR_NOMEM;
    px->loop = loop;
    px->alpn[0] = (unsigned char)alen;
    memcpy(px->alpn + 1, params->alpn, alen);
    px->alpn_len = alen + 1;
    px->h2 = strcmp(params->alpn, "h2") == 0;
    if (!(px->ctx = SSL_CTX_new(TLS_server_method()))) {
        free(px);
        return PD_ERR_NOMEM;
    }
    SSL_CTX_set_min_proto_version(px->ctx, TLS1_2_VERSION);
    if (SSL_CTX_use_certificate_chain_file(px->ctx, params->cert_file) != 1) {
        pd_log_error("tls: %s: cannot load the certificate (%s)", params->cert_file,
                     ERR_reason_error_string(ERR_get_error()));
        goto err_format;
    }
    if (SSL_CTX_use_PrivateKey_file(px->ctx, params->key_file, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(px->ctx) != 1) {
        pd_log_error("tls: %s: cannot load the key, or it does not match %s (%s)", params->key_file,
                     params->cert_file, ERR_reason_error_string(ERR_get_error()));
        goto err_format;
    }
    SSL_CTX_set_alpn_select_cb(px->ctx, pd_tls_proxy__alpn_select, px);
    if (uv_ip4_addr(backend_host, backend_port, (struct sockaddr_in *)&px->backend) != 0 &&
        uv_ip6_addr(backend_host, backend_port, (struct sockaddr_in6 *)&px->backend) != 0) {
        SSL_CTX_free(px->ctx);
        free(px);
        return PD_ERR_INVALID;
    }
    memset(&addr, 0, sizeof addr);
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr) != 0) {
        pd_log_error("tls: listen %s:%d: not an IP address", host, port);
        SSL_CTX_free(px->ctx);
        free(px);
        return PD_ERR_INVALID;
    }
    uv_tcp_init(loop, &px->listener);
    px->listener.data = px;
    px->listener_open = 1;
    if ((rc = uv_tcp_bind(&px->listener, (struct sockaddr *)&addr, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&px->listener, 511, pd_tls_proxy__on_accept)) != 0) {
        pd_log_error("tls: listen %s:%d: %s", host, port, uv_strerror(rc));
        pd_tls_proxy_destroy(px);
        return rc == UV_EADDRINUSE ? PD_ERR_UNAVAILABLE : PD_ERR_IO;
    }
    uv_tcp_getsockname(&px->listener, (struct sockaddr *)&addr, &len);
    px->port = ntohs(addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&addr)->sin6_port
                                                : ((struct sockaddr_in *)&addr)->sin_port);
    *px_p = px;
    return PD_OK;
err_format:
    ERR_clear_error();
    SSL_CTX_free(px->ctx);
    free(px);
    return PD_ERR_FORMAT;
}

int pd_tls_proxy_port(const pd_tls_proxy_t *px)
{
    return px->port;
}

void pd_tls_proxy_stats(const pd_tls_proxy_t *px, pd_tls_proxy_stats_t *stats_p)
{
    *stats_p = px->stats;
}

void pd_tls_proxy_destroy(pd_tls_proxy_t *px)
{
    if (!px)
        return;
    px->destroyed = 1;
    for (pd_tls_proxy__conn_t *pc = px->conns; pc; pc = pc->next)
        pd_tls_proxy__close(pc);
    if (px->listener_open) {
        px->listener_open = 0;
        px->pending_closes++;
        uv_close((uv_handle_t *)&px->listener, pd_tls_proxy__listener_closed);
    }
    pd_tls_proxy__maybe_free_px(px);
}
