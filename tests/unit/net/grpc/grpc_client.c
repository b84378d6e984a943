/* Tests common/pd_grpc_client.c against common/pd_grpc_server.c on one loop over loopback TCP:
 * unary, health Watch updates, cancel before and after the request is on the wire, destroy with
 * calls in flight and from inside a done callback, GOAWAY draining then UNAVAILABLE, and a clean
 * loop close. TLS (pd_grpc_client_set_tls) through the server's TLS terminator (tls_proxy.h) with a
 * self-signed certificate made here (OpenSSL, P-256, SAN IP:127.0.0.1 and DNS:localhost): unary
 * and a 1 MiB echo (many TLS records each way), then a CA the certificate does not chain to, a
 * name it does not carry, plaintext on the TLS port (UNAVAILABLE, each with its reason) and a CA
 * file that cannot be read (PD_ERR_IO). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include "grpc_client.h"
#include "grpc_health.h"
#include "grpc_server.h"
#include "health.pb-c.h"
#include "testsvc.pb-c.h"
#include "tls_proxy.h"

static uv_loop_t loop;
static pd_grpc_server_t *srv;
static pd_grpc_health_t *health;
static pd_grpc_client_t *cli;
static int port;
static pd_grpc_call_t *held;
static int server_cancels;

typedef struct {
    int done, code, n_msgs, last_status;
    char msg[128];
    int destroy_client; /* destroy the client from the done callback */
    int reset_client;   /* reset the client from the done callback */
} res_t;

static void on_cancel(pd_grpc_call_t *call, void *arg)
{
    (void)arg;
    server_cancels++;
    pd_grpc_call_finish(call, PD_GRPC_CANCELLED, NULL);
    held = NULL;
}

static void h_unary(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    const Pdtest__EchoRequest *r = (const void *)req;
    Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
    (void)user;
    if (strcmp(r->text, "hold") == 0) {
        held = call;
        pd_grpc_call_set_cancel_cb(call, on_cancel, NULL);
        return;
    }
    rep.text = r->text;
    pd_grpc_call_send(call, &rep.base);
    pd_grpc_call_finish(call, 0, NULL);
}

static const pd_grpc_method_fn handlers[4] = {h_unary, NULL, NULL, NULL};

static void on_unary(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    res_t *r = arg;
    r->done = 1;
    r->code = code;
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    if (r->reset_client)
        pd_grpc_client_reset(cli, "reset from a done callback");
    if (r->destroy_client) {
        pd_grpc_client_destroy(cli);
        cli = NULL;
    }
}

static void on_health(void *arg, ProtobufCMessage *m)
{
    res_t *r = arg;
    r->n_msgs++;
    r->last_status = ((Grpc__Health__V1__HealthCheckResponse *)m)->status;
    protobuf_c_message_free_unpacked(m, NULL);
}

static void on_done(void *arg, int code, const char *msg)
{
    on_unary(arg, code, msg, NULL);
}

static void run_until(const int *flag)
{
    for (int i = 0; i < 100000 && !*flag; i++)
        uv_run(&loop, UV_RUN_ONCE);
    assert_true(*flag);
}

static int setup(void **state)
{
    (void)state;
    held = NULL;
    server_cancels = 0;
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(pd_grpc_server_create(&loop, NULL, &srv), PD_OK);
    assert_int_equal(pd_grpc_server_add_service(srv, &pdtest__echo__descriptor, handlers, NULL),
                     PD_OK);
    assert_int_equal(pd_grpc_health_create(srv, &health), PD_OK);
    assert_int_equal(pd_grpc_server_listen(srv, "127.0.0.1", 0, &port), PD_OK);
    assert_int_equal(pd_grpc_client_create(&loop, "localhost", port, &cli), PD_OK);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pd_grpc_client_destroy(cli);
    pd_grpc_server_destroy(srv);
    pd_grpc_health_destroy(health);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    return 0;
}

static void start_unary(const char *text, int64_t timeout_ms, res_t *r, pd_grpc_client_call_t **c)
{
    Pdtest__EchoRequest req = PDTEST__ECHO_REQUEST__INIT;
    req.text = (char *)text;
    assert_int_equal(pd_grpc_client_unary(cli, "/pdtest.Echo/Unary", &req.base,
                                          &pdtest__echo_reply__descriptor, timeout_ms, on_unary, r,
                                          c),
                     PD_OK);
}

static void test_unary_and_health_watch(void **state)
{
    res_t a = {0}, w = {0};
    Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    pd_grpc_client_call_t *wc;
    (void)state;

    start_unary("x", 5000, &a, NULL);
    run_until(&a.done);
    assert_int_equal(a.code, 0);
    hreq.service = "svc";
    pd_grpc_client_stream(cli, "/grpc.health.v1.Health/Watch", &hreq.base,
                          &grpc__health__v1__health_check_response__descriptor, 0, on_health,
                          on_done, &w, &wc);
    while (w.n_msgs < 1)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(w.last_status, PD_GRPC_HEALTH_SERVICE_UNKNOWN);
    assert_int_equal(pd_grpc_health_set(health, "svc", PD_GRPC_HEALTH_NOT_SERVING), PD_OK);
    assert_int_equal(pd_grpc_health_set(health, "svc", PD_GRPC_HEALTH_NOT_SERVING),
                     PD_OK); /* no-op */
    assert_int_equal(pd_grpc_health_set(health, "svc", 7), PD_ERR_INVALID);
    while (w.n_msgs < 2)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(w.last_status, PD_GRPC_HEALTH_NOT_SERVING);
    assert_int_equal(pd_grpc_health_get(health, "svc"), PD_GRPC_HEALTH_NOT_SERVING);
    pd_grpc_client_call_cancel(wc);
    run_until(&w.done);
    assert_int_equal(w.code, PD_GRPC_CANCELLED);
    assert_int_equal(w.n_msgs, 2);
}

static void test_cancel_paths(void **state)
{
    res_t a = {0}, b = {0};
    pd_grpc_client_call_t *ca, *cb;
    (void)state;

    /* cancelled before it reaches the wire */
    start_unary("x", 0, &a, &ca);
    pd_grpc_client_call_cancel(ca);
    run_until(&a.done);
    assert_int_equal(a.code, PD_GRPC_CANCELLED);
    /* cancelled while the server holds it: the server's cancel callback runs */
    start_unary("hold", 0, &b, &cb);
    while (!held)
        uv_run(&loop, UV_RUN_ONCE);
    pd_grpc_client_call_cancel(cb);
    pd_grpc_client_call_cancel(cb); /* second cancel: no effect */
    run_until(&b.done);
    assert_int_equal(b.code, PD_GRPC_CANCELLED);
    while (server_cancels == 0)
        uv_run(&loop, UV_RUN_ONCE);
    assert_null(held);
}

static void test_deadline(void **state)
{
    res_t a = {0};
    (void)state;

    start_unary("hold", 50, &a, NULL);
    run_until(&a.done);
    assert_int_equal(a.code, PD_GRPC_DEADLINE_EXCEEDED);
    while (server_cancels == 0)
        uv_run(&loop, UV_RUN_ONCE);
}

static void test_destroy_with_calls_in_flight(void **state)
{
    res_t a = {0}, b = {0}, c = {0};
    (void)state;

    start_unary("x", 0, &a, NULL);
    run_until(&a.done); /* connected */
    memset(&a, 0, sizeof a);
    start_unary("hold", 0, &a, NULL);
    while (!held)
        uv_run(&loop, UV_RUN_ONCE);
    start_unary("x", 0, &b, NULL); /* not yet on the wire */
    pd_grpc_client_destroy(cli);
    cli = NULL;
    assert_true(a.done && b.done);
    assert_int_equal(a.code, PD_GRPC_CANCELLED);
    assert_int_equal(b.code, PD_GRPC_CANCELLED);
    while (server_cancels == 0) /* the server sees the connection go */
        uv_run(&loop, UV_RUN_ONCE);
    /* destroy from inside a done callback */
    assert_int_equal(pd_grpc_client_create(&loop, "127.0.0.1", port, &cli), PD_OK);
    c.destroy_client = 1;
    start_unary("x", 0, &c, NULL);
    run_until(&c.done);
    assert_int_equal(c.code, 0);
    assert_null(cli);
}

static void test_goaway_then_unavailable(void **state)
{
    res_t a = {0}, b = {0};
    Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
    (void)state;

    start_unary("hold", 0, &a, NULL);
    while (!held)
        uv_run(&loop, UV_RUN_ONCE);
    pd_grpc_server_shutdown(srv);
    for (int i = 0; i < 20; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    assert_false(a.done);
    rep.text = "drained";
    assert_int_equal(pd_grpc_call_send(held, &rep.base), PD_OK);
    assert_int_equal(pd_grpc_call_finish(held, 0, NULL), PD_OK);
    held = NULL;
    run_until(&a.done);
    assert_int_equal(a.code, 0);
    /* the server stopped listening: a new call gets UNAVAILABLE */
    start_unary("x", 5000, &b, NULL);
    run_until(&b.done);
    assert_int_equal(b.code, PD_GRPC_UNAVAILABLE);
}

/* reset: a call the server holds (a peer that stopped answering) ends with UNAVAILABLE at once,
 * the server sees the connection go, and the next call succeeds on a fresh connection */
static void test_reset(void **state)
{
    res_t a = {0}, b = {0};
    (void)state;

    start_unary("hold", 0, &a, NULL);
    while (!held)
        uv_run(&loop, UV_RUN_ONCE);
    pd_grpc_client_reset(cli, "peer stopped answering");
    assert_false(a.done); /* the done callback runs from the loop */
    run_until(&a.done);
    assert_int_equal(a.code, PD_GRPC_UNAVAILABLE);
    assert_string_equal(a.msg, "peer stopped answering");
    while (server_cancels == 0)
        uv_run(&loop, UV_RUN_ONCE);
    pd_grpc_client_reset(cli, NULL); /* no connection: no effect */
    start_unary("again", 5000, &b, NULL);
    run_until(&b.done);
    assert_int_equal(b.code, 0);
    /* from the done callback of a call on the connection being dropped (the router resets a
     * node's client from its health poll's callback): the call is freed once, after it returns */
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    server_cancels = 0;
    a.reset_client = 1;
    start_unary("hold", 50, &a, NULL);
    run_until(&a.done);
    assert_int_equal(a.code, PD_GRPC_DEADLINE_EXCEEDED);
    start_unary("after", 5000, &b, NULL);
    run_until(&b.done);
    assert_int_equal(b.code, 0);
}

/* ==== TLS ==== */

/* A self-signed P-256 certificate for 127.0.0.1 / localhost (a CA too) and its key, as PEM files
 * cert_path, key_path. */
static void make_cert(const char *cert_path, const char *key_path, const char *cn)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    X509V3_CTX v3;
    assert_non_null(k);
    assert_non_null(x);
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, k);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, name);
    X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
    const char *exts[][2] = {{"subjectAltName", "IP:127.0.0.1,DNS:localhost"},
                             {"basicConstraints", "critical,CA:TRUE"}};
    for (int i = 0; i < 2; i++) {
        X509_EXTENSION *e = X509V3_EXT_conf(NULL, &v3, exts[i][0], exts[i][1]);
        assert_non_null(e);
        X509_add_ext(x, e, -1);
        X509_EXTENSION_free(e);
    }
    assert_true(X509_sign(x, k, EVP_sha256()) > 0);
    FILE *f = fopen(cert_path, "w");
    assert_non_null(f);
    PEM_write_X509(f, x);
    fclose(f);
    f = fopen(key_path, "w");
    assert_non_null(f);
    PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL);
    fclose(f);
    X509_free(x);
    EVP_PKEY_free(k);
}

/* One unary call from a fresh client of 127.0.0.1:p with tls (NULL: h2c); its result in r. */
static void tls_call(int p, const pd_grpc_client_tls_t *tls, const char *text, res_t *r)
{
    pd_grpc_client_t *c;
    Pdtest__EchoRequest req = PDTEST__ECHO_REQUEST__INIT;
    req.text = (char *)text;
    memset(r, 0, sizeof *r);
    assert_int_equal(pd_grpc_client_create(&loop, "127.0.0.1", p, &c), PD_OK);
    pd_grpc_client_set_max_recv(c, 4u << 20);
    if (tls)
        assert_int_equal(pd_grpc_client_set_tls(c, tls), PD_OK);
    assert_int_equal(pd_grpc_client_unary(c, "/pdtest.Echo/Unary", &req.base,
                                          &pdtest__echo_reply__descriptor, 10000, on_unary, r,
                                          NULL),
                     PD_OK);
    run_until(&r->done);
    pd_grpc_client_destroy(c);
}

static void test_tls(void **state)
{
    char dir[] = "/tmp/pd-test-tls-client-XXXXXX", cert[128], key[128], other[128], okey[128];
    pd_tls_proxy_t *px;
    res_t r;
    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(cert, sizeof cert, "%s/cert.pem", dir);
    snprintf(key, sizeof key, "%s/key.pem", dir);
    snprintf(other, sizeof other, "%s/other.pem", dir);
    snprintf(okey, sizeof okey, "%s/other-key.pem", dir);
    make_cert(cert, key, "localhost");
    make_cert(other, okey, "localhost"); /* same names, another key: not the server's CA */
    pd_tls_params_t tp = {cert, key, "h2"};
    assert_int_equal(pd_tls_proxy_create(&loop, &tp, "127.0.0.1", 0, "127.0.0.1", port, &px),
                     PD_OK);
    const int tls_port = pd_tls_proxy_port(px);
    pd_grpc_client_tls_t ok = {cert, NULL}, by_name = {cert, "localhost"};
    tls_call(tls_port, &ok, "over tls", &r); /* verified as IP 127.0.0.1 */
    assert_int_equal(r.code, 0);
    tls_call(tls_port, &by_name, "by name", &r); /* SNI localhost, DNS name checked */
    assert_int_equal(r.code, 0);
    char *big = malloc((1u << 20) + 1);
    assert_non_null(big);
    memset(big, 'a', 1u << 20);
    big[1u << 20] = 0;
    tls_call(tls_port, &ok, big, &r);
    assert_int_equal(r.code, 0);
    free(big);
    pd_grpc_client_tls_t wrong_ca = {other, NULL}, wrong_name = {cert, "other.example"};
    tls_call(tls_port, &wrong_ca, "x", &r);
    printf("# another CA: %s\n", r.msg);
    assert_int_equal(r.code, PD_GRPC_UNAVAILABLE);
    assert_non_null(strstr(r.msg, "tls handshake with 127.0.0.1"));
    tls_call(tls_port, &wrong_name, "x", &r);
    printf("# a name the certificate lacks: %s\n", r.msg);
    assert_int_equal(r.code, PD_GRPC_UNAVAILABLE);
    assert_non_null(strstr(r.msg, "hostname mismatch"));
    tls_call(tls_port, NULL, "x", &r); /* h2c on the TLS port */
    assert_int_equal(r.code, PD_GRPC_UNAVAILABLE);
    tls_call(port, &ok, "x", &r); /* TLS to the plaintext server */
    printf("# tls to an h2c server: %s\n", r.msg);
    assert_int_equal(r.code, PD_GRPC_UNAVAILABLE);
    pd_grpc_client_t *c;
    pd_grpc_client_tls_t missing = {"/nonexistent/ca.pem", NULL};
    assert_int_equal(pd_grpc_client_create(&loop, "127.0.0.1", tls_port, &c), PD_OK);
    assert_int_equal(pd_grpc_client_set_tls(c, &missing), PD_ERR_IO);
    pd_grpc_client_destroy(c);
    pd_tls_proxy_stats_t ps;
    pd_tls_proxy_stats(px, &ps);
    assert_true(ps.handshake_failures >= 3);
    pd_tls_proxy_destroy(px);
    for (const char *f = cert; f; f = f == cert ? key : f == key ? other : f == other ? okey : NULL)
        unlink(f);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary_and_health_watch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_with_calls_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_goaway_then_unavailable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tls, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
