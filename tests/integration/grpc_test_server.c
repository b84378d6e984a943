/* grpc_test_server: serves pdtest.Echo and grpc.health.v1.Health for the interop tests.
 *
 *   grpc_test_server [--port N] [--max-recv BYTES] [--watermark BYTES]
 *
 * Prints "PORT <n>" on stdout once listening (port 0 = ephemeral). SIGTERM/SIGINT destroy the
 * server and close the loop; the exit status is nonzero when uv_loop_close() fails (a leak).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "echo_service.h"
#include "grpc_health.h"
#include "grpc_server.h"
#include "log.h"

static pd_grpc_server_t *srv;
static pd_grpc_health_t *health;
static echo_service_t *echo;
static uv_signal_t sig_term, sig_int;

static void on_signal(uv_signal_t *s, int signum)
{
    (void)s;
    pd_log_info("test server: signal %d, stopping", signum);
    pd_grpc_server_destroy(srv);
    srv = NULL;
    pd_grpc_health_destroy(health);
    health = NULL;
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
}

int main(int argc, char **argv)
{
    pd_grpc_server_params_t params = {0};
    uv_loop_t *loop = uv_default_loop();
    int port = 0, bound = 0, rc;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--port") == 0)
            port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--max-recv") == 0)
            params.max_recv_msg_size = (size_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--watermark") == 0)
            params.send_high_watermark = (size_t)atol(argv[i + 1]);
    }
    signal(SIGPIPE, SIG_IGN);
    if (pd_grpc_server_create(loop, &params, &srv) != PD_OK ||
        pd_grpc_health_create(srv, &health) != PD_OK ||
        echo_service_create(loop, srv, health, &echo) != PD_OK ||
        pd_grpc_server_listen(srv, "127.0.0.1", port, &bound) != PD_OK)
        return 1;
    uv_signal_init(loop, &sig_term);
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_init(loop, &sig_int);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    printf("PORT %d\n", bound);
    fflush(stdout);
    uv_run(loop, UV_RUN_DEFAULT);
    echo_service_destroy(echo);
    rc = uv_loop_close(loop);
    if (rc != 0) {
        pd_log_error("test server: uv_loop_close: %s", uv_strerror(rc));
        return 2;
    }
    pd_log_info("test server: clean exit");
    return 0;
}
