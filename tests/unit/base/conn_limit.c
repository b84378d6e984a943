/* Tests common/base/conn_limit.c: the limit derived from the descriptor limit, and a listener
 * past its limit: the extra connection is accepted, sent the reply and closed at once (the client
 * reads it and then EOF), counted, and the listener keeps accepting once a slot is released;
 * the loop closes cleanly. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "conn_limit.h"

static void test_for_fds(void **state)
{
    (void)state;
    assert_int_equal(conn_limit_for_fds(0, UINT64_MAX), CONN_LIMIT_DEFAULT);
    assert_int_equal(conn_limit_for_fds(10, UINT64_MAX), 10);
    assert_int_equal(conn_limit_for_fds(0, 1024), (1024 - CONN_LIMIT_FD_RESERVE) / 2);
    assert_int_equal(conn_limit_for_fds(100, 1024), 100);
    assert_int_equal(conn_limit_for_fds(5000, 1u << 20), 5000);
    assert_int_equal(conn_limit_for_fds(0, 64), 1); /* never 0 */
    assert_int_equal(conn_limit_for_fds(0, 0), 1);
}

static struct {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_tcp_t conns[2];
    int n_conns;
    conn_limit_t lim;
} L;

static void on_conn(uv_stream_t *s, int status)
{
    if (!conn_limit_on_connection(&L.lim, s, status, "busy\n", 5))
        return;
    uv_tcp_init(&L.loop, &L.conns[L.n_conns]);
    assert_int_equal(uv_accept(s, (uv_stream_t *)&L.conns[L.n_conns]), 0);
    L.n_conns++;
}

static int client(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void test_past_the_limit(void **state)
{
    struct sockaddr_in a;
    struct sockaddr_storage ss;
    int len = sizeof ss, fd[3];
    char buf[16];
    (void)state;

    uv_loop_init(&L.loop);
    conn_limit_init(&L.lim, "test", 1);
    assert_int_equal(L.lim.max, 1);
    uv_tcp_init(&L.loop, &L.listener);
    uv_ip4_addr("127.0.0.1", 0, &a);
    assert_int_equal(uv_tcp_bind(&L.listener, (const struct sockaddr *)&a, 0), 0);
    assert_int_equal(uv_listen((uv_stream_t *)&L.listener, 8, on_conn), 0);
    uv_tcp_getsockname(&L.listener, (struct sockaddr *)&ss, &len);
    int port = ntohs(((struct sockaddr_in *)&ss)->sin_port);

    fd[0] = client(port);
    while (L.n_conns < 1)
        uv_run(&L.loop, UV_RUN_ONCE);
    fd[1] = client(port);
    while (L.lim.rejected < 1)
        uv_run(&L.loop, UV_RUN_ONCE);
    uv_run(&L.loop, UV_RUN_NOWAIT); /* the close */
    assert_int_equal(recv(fd[1], buf, sizeof buf, 0), 5);
    assert_memory_equal(buf, "busy\n", 5);
    assert_int_equal(recv(fd[1], buf, sizeof buf, 0), 0); /* closed */
    assert_int_equal(L.lim.open, 1);
    /* a slot frees: the next connection is accepted */
    conn_limit_release(&L.lim);
    uv_close((uv_handle_t *)&L.conns[0], NULL);
    fd[2] = client(port);
    while (L.n_conns < 2)
        uv_run(&L.loop, UV_RUN_ONCE);
    assert_int_equal(L.lim.rejected, 1);
    assert_int_equal(L.lim.open, 1);
    uv_close((uv_handle_t *)&L.conns[1], NULL);
    uv_close((uv_handle_t *)&L.listener, NULL);
    uv_run(&L.loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&L.loop), 0);
    for (int i = 0; i < 3; i++)
        close(fd[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_for_fds),
        cmocka_unit_test(test_past_the_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
