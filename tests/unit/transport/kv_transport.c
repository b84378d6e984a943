/* Tests common/kv_transport.c through the loopback implementation: put/flush/message ordering,
 * key checks, region bounds, peer loss, close and teardown (uv_loop_close() == 0 at the end). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv_transport.h"
#include "kv_transport_loopback.h"

#define REGION (64 * 1024)
#define PAGE 4096
#define AM_DONE 3
#define AM_ACK 4

typedef struct {
    uv_loop_t loop;
    kv_transport_t *src, *dst;
    kv_transport_mem_t *mem;
    kv_transport_ep_t *ep;
    kv_transport_rkey_t *rkey;
    uint8_t *region; /* (REGION) bytes, the target's registered pool */
    int port;
    /* event log: 'p' put done, 'f' flush done, 'a' am delivered, 'k' ack back, 'e' ep error */
    char events[64];
    int n_events;
    pd_status_t last_st[64];
    int data_seen_ok; /* the am handler found the put data in place */
    uint8_t expect[PAGE];
    kv_transport_ep_t *failed_ep;
} fx_t;

static void fx_event(fx_t *fx, char c, pd_status_t st)
{
    assert_true(fx->n_events < 63);
    fx->last_st[fx->n_events] = st;
    fx->events[fx->n_events++] = c;
    fx->events[fx->n_events] = 0;
}

static void on_put(void *arg, pd_status_t st)
{
    fx_event(arg, 'p', st);
}

static void on_flush(void *arg, pd_status_t st)
{
    fx_event(arg, 'f', st);
}

static void on_sent(void *arg, pd_status_t st)
{
    (void)arg;
    (void)st;
}

static void on_ack(void *arg, const void *header, size_t header_len, const void *data,
                   size_t len, kv_transport_ep_t *from)
{
    (void)header;
    (void)header_len;
    (void)data;
    (void)len;
    fx_t *fx = arg;
    assert_ptr_equal(from, fx->ep);
    fx_event(fx, 'k', PD_OK);
}

static void on_done_msg(void *arg, const void *header, size_t header_len, const void *data,
                        size_t len, kv_transport_ep_t *from)
{
    fx_t *fx = arg;
    uint32_t off;
    assert_int_equal(header_len, sizeof off);
    memcpy(&off, header, sizeof off);
    assert_int_equal(len, 5);
    assert_memory_equal(data, "hello", 5);
    fx->data_seen_ok = memcmp(fx->region + off, fx->expect, PAGE) == 0;
    fx_event(fx, 'a', PD_OK);
    assert_non_null(from);
    assert_int_equal(kv_transport_am_send(from, AM_ACK, NULL, 0, NULL, 0, on_sent, fx), PD_OK);
}

static void on_ep_error(void *arg, kv_transport_ep_t *ep, pd_status_t st)
{
    fx_t *fx = arg;
    if (ep == fx->ep) {
        fx->failed_ep = ep;
        fx_event(fx, 'e', st);
    }
}

static int fx_setup(void **state)
{
    fx_t *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    kv_transport_params_t ps = {.name = "src", .ep_error = on_ep_error, .ep_error_arg = fx};
    kv_transport_params_t pd = {.name = "dst"};
    assert_int_equal(kv_transport_loopback_create(&fx->loop, &ps, &fx->src), PD_OK);
    assert_int_equal(kv_transport_loopback_create(&fx->loop, &pd, &fx->dst), PD_OK);
    assert_int_equal(kv_transport_listen(fx->dst, "127.0.0.1", 0, &fx->port), PD_OK);
    assert_true(fx->port > 0);
    fx->region = calloc(1, REGION);
    assert_non_null(fx->region);
    assert_int_equal(kv_transport_mem_register(fx->dst, fx->region, REGION, &fx->mem), PD_OK);
    assert_int_equal(kv_transport_set_am_handler(fx->dst, AM_DONE, on_done_msg, fx), PD_OK);
    assert_int_equal(kv_transport_set_am_handler(fx->src, AM_ACK, on_ack, fx), PD_OK);
    assert_int_equal(kv_transport_connect(fx->src, "127.0.0.1", fx->port, &fx->ep), PD_OK);
    void *key;
    size_t key_len;
    assert_int_equal(kv_transport_mem_pack(fx->mem, &key, &key_len), PD_OK);
    assert_int_equal(kv_transport_rkey_unpack(fx->ep, key, key_len, &fx->rkey), PD_OK);
    free(key);
    assert_int_equal(kv_transport_rkey_base(fx->rkey), (uint64_t)(uintptr_t)fx->region);
    assert_int_equal(kv_transport_rkey_len(fx->rkey), REGION);
    for (size_t i = 0; i < PAGE; i++)
        fx->expect[i] = (uint8_t)(rand() | 1);
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *fx = *state;
    kv_transport_ep_close(fx->ep);
    kv_transport_mem_deregister(fx->mem);
    kv_transport_destroy(fx->src);
    kv_transport_destroy(fx->dst);
    assert_int_equal(uv_run(&fx->loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
    free(fx->region);
    free(fx);
    return 0;
}

static uint64_t fx_addr(fx_t *fx, size_t off)
{
    return (uint64_t)(uintptr_t)(fx->region + off);
}

/* put, put, flush -> message sent from the flush callback sees the data; reply comes back. */
static void on_flush_then_send(void *arg, pd_status_t st)
{
    fx_t *fx = arg;
    fx_event(fx, 'f', st);
    uint32_t off = 2 * PAGE;
    assert_int_equal(kv_transport_am_send(fx->ep, AM_DONE, &off, sizeof off, "hello", 5, on_sent,
                                          fx),
                     PD_OK);
}

static void test_put_flush_am_order(void **state)
{
    fx_t *fx = *state;
    assert_int_equal(kv_transport_put(fx->ep, fx->expect, PAGE, fx_addr(fx, 2 * PAGE), fx->rkey,
                                      on_put, fx),
                     PD_OK);
    assert_int_equal(kv_transport_put(fx->ep, fx->expect, 100, fx_addr(fx, REGION - 100),
                                      fx->rkey, on_put, fx),
                     PD_OK);
    assert_int_equal(kv_transport_flush(fx->ep, on_flush_then_send, fx), PD_OK);
    /* Callbacks never run inside the call that started the operation. */
    assert_int_equal(fx->n_events, 0);
    assert_true(fx->region[2 * PAGE] == 0);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_string_equal(fx->events, "ppfak");
    for (int i = 0; i < fx->n_events; i++)
        assert_int_equal(fx->last_st[i], PD_OK);
    assert_true(fx->data_seen_ok);
    assert_memory_equal(fx->region + REGION - 100, fx->expect, 100);
    assert_int_equal(kv_transport_query_cuda(fx->src), 0);
}

static void test_bad_rkey(void **state)
{
    fx_t *fx = *state;
    kv_transport_rkey_t *r = NULL;
    uint8_t junk[40];
    memset(junk, 0xa5, sizeof junk);
    assert_int_equal(kv_transport_rkey_unpack(fx->ep, junk, sizeof junk, &r), PD_ERR_FORMAT);
    assert_int_equal(kv_transport_rkey_unpack(fx->ep, NULL, 0, &r), PD_ERR_FORMAT);
    void *key;
    size_t key_len;
    assert_int_equal(kv_transport_mem_pack(fx->mem, &key, &key_len), PD_OK);
    assert_int_equal(kv_transport_rkey_unpack(fx->ep, key, key_len - 1, &r), PD_ERR_FORMAT);
    ((uint8_t *)key)[0] ^= 0xff; /* magic */
    assert_int_equal(kv_transport_rkey_unpack(fx->ep, key, key_len, &r), PD_ERR_FORMAT);
    free(key);
    assert_null(r);
    /* A key of another endpoint is refused. */
    kv_transport_ep_t *ep2;
    kv_transport_rkey_t *r2;
    assert_int_equal(kv_transport_connect(fx->src, "127.0.0.1", fx->port, &ep2), PD_OK);
    assert_int_equal(kv_transport_mem_pack(fx->mem, &key, &key_len), PD_OK);
    assert_int_equal(kv_transport_rkey_unpack(ep2, key, key_len, &r2), PD_OK);
    free(key);
    assert_int_equal(kv_transport_put(fx->ep, fx->expect, 8, fx_addr(fx, 0), r2, on_put, fx),
                     PD_ERR_INVALID);
    kv_transport_ep_close(ep2); /* destroys r2 */
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_int_equal(fx->n_events, 0);
}

static void test_put_outside_region(void **state)
{
    fx_t *fx = *state;
    uint64_t base = fx_addr(fx, 0);
    assert_int_equal(kv_transport_put(fx->ep, fx->expect, 8, base - 1, fx->rkey, on_put, fx),
                     PD_ERR_INVALID);
    assert_int_equal(
        kv_transport_put(fx->ep, fx->expect, 8, base + REGION - 7, fx->rkey, on_put, fx),
        PD_ERR_INVALID);
    assert_int_equal(kv_transport_put(fx->ep, fx->expect, 8, base + REGION, fx->rkey, on_put, fx),
                     PD_ERR_INVALID);
    uint8_t *big = calloc(1, REGION + 1);
    assert_int_equal(kv_transport_put(fx->ep, big, REGION + 1, base, fx->rkey, on_put, fx),
                     PD_ERR_INVALID);
    /* Wrap-around of remote_addr + len. */
    assert_int_equal(
        kv_transport_put(fx->ep, big, (size_t)-1 - 2, base + 8, fx->rkey, on_put, fx),
        PD_ERR_INVALID);
    /* The exact region is fine. */
    assert_int_equal(kv_transport_put(fx->ep, big, REGION, base, fx->rkey, on_put, fx), PD_OK);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    free(big);
    assert_string_equal(fx->events, "p");
    assert_int_equal(fx->last_st[0], PD_OK);
}

static void test_region_deregistered(void **state)
{
    fx_t *fx = *state;
    kv_transport_mem_deregister(fx->mem);
    fx->mem = NULL;
    assert_int_equal(kv_transport_put(fx->ep, fx->expect, 8, fx_addr(fx, 0), fx->rkey, on_put,
                                      fx),
                     PD_OK);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_string_equal(fx->events, "p");
    assert_int_equal(fx->last_st[0], PD_ERR_TRANSPORT);
}

static void test_peer_gone(void **state)
{
    fx_t *fx = *state;
    for (int i = 0; i < 4; i++)
        assert_int_equal(kv_transport_put(fx->ep, fx->expect, PAGE, fx_addr(fx, i * PAGE),
                                          fx->rkey, on_put, fx),
                         PD_OK);
    assert_int_equal(kv_transport_flush(fx->ep, on_flush, fx), PD_OK);
    kv_transport_mem_deregister(fx->mem);
    fx->mem = NULL;
    kv_transport_destroy(fx->dst);
    fx->dst = NULL;
    assert_true(kv_transport_ep_failed(fx->ep));
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_string_equal(fx->events, "ppppfe");
    for (int i = 0; i < fx->n_events; i++)
        assert_int_equal(fx->last_st[i], PD_ERR_UNAVAILABLE);
    assert_ptr_equal(fx->failed_ep, fx->ep);
    assert_true(fx->region[0] == 0);
    /* Later calls are refused at once. */
    assert_int_equal(kv_transport_put(fx->ep, fx->expect, 8, fx_addr(fx, 0), fx->rkey, on_put,
                                      fx),
                     PD_ERR_UNAVAILABLE);
    assert_int_equal(kv_transport_flush(fx->ep, on_flush, fx), PD_ERR_UNAVAILABLE);
    assert_int_equal(kv_transport_am_send(fx->ep, AM_DONE, NULL, 0, NULL, 0, on_sent, fx),
                     PD_ERR_UNAVAILABLE);
    /* Nobody listens there any more; another peer still works. */
    kv_transport_ep_t *ep2;
    assert_int_equal(kv_transport_connect(fx->src, "127.0.0.1", fx->port, &ep2),
                     PD_ERR_UNAVAILABLE);
    kv_transport_params_t pd = {.name = "dst2"};
    assert_int_equal(kv_transport_loopback_create(&fx->loop, &pd, &fx->dst), PD_OK);
    int port2;
    assert_int_equal(kv_transport_listen(fx->dst, "127.0.0.1", 0, &port2), PD_OK);
    assert_int_equal(kv_transport_mem_register(fx->dst, fx->region, REGION, &fx->mem), PD_OK);
    assert_int_equal(kv_transport_connect(fx->src, "127.0.0.1", port2, &ep2), PD_OK);
    void *key;
    size_t key_len;
    kv_transport_rkey_t *r2;
    assert_int_equal(kv_transport_mem_pack(fx->mem, &key, &key_len), PD_OK);
    assert_int_equal(kv_transport_rkey_unpack(ep2, key, key_len, &r2), PD_OK);
    free(key);
    fx->n_events = 0;
    assert_int_equal(kv_transport_put(ep2, fx->expect, PAGE, fx_addr(fx, PAGE), r2, on_put, fx),
                     PD_OK);
    assert_int_equal(kv_transport_flush(ep2, on_flush, fx), PD_OK);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_string_equal(fx->events, "pf");
    assert_int_equal(fx->last_st[0], PD_OK);
    assert_int_equal(fx->last_st[1], PD_OK);
    assert_memory_equal(fx->region + PAGE, fx->expect, PAGE);
    kv_transport_ep_close(ep2);
}

static void test_close_cancels(void **state)
{
    fx_t *fx = *state;
    assert_int_equal(kv_transport_put(fx->ep, fx->expect, PAGE, fx_addr(fx, 0), fx->rkey, on_put,
                                      fx),
                     PD_OK);
    assert_int_equal(kv_transport_flush(fx->ep, on_flush, fx), PD_OK);
    kv_transport_ep_close(fx->ep);
    fx->ep = NULL;
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_string_equal(fx->events, "pf"); /* no 'e': a closed endpoint is not reported */
    assert_int_equal(fx->last_st[0], PD_ERR_CANCELLED);
    assert_int_equal(fx->last_st[1], PD_ERR_CANCELLED);
    assert_true(fx->region[0] == 0);
}

static void test_destroy_cancels(void **state)
{
    fx_t *fx = *state;
    assert_int_equal(kv_transport_put(fx->ep, fx->expect, PAGE, fx_addr(fx, 0), fx->rkey, on_put,
                                      fx),
                     PD_OK);
    kv_transport_destroy(fx->src); /* completes the put with CANCELLED, frees ep */
    fx->src = NULL;
    fx->ep = NULL;
    assert_string_equal(fx->events, "p");
    assert_int_equal(fx->last_st[0], PD_ERR_CANCELLED);
}

static void test_listen_errors(void **state)
{
    fx_t *fx = *state;
    kv_transport_t *t;
    int port;
    assert_int_equal(kv_transport_listen(fx->dst, "127.0.0.1", 0, &port), PD_ERR_INVALID);
    assert_int_equal(kv_transport_loopback_create(&fx->loop, NULL, &t), PD_OK);
    assert_int_equal(kv_transport_listen(t, "127.0.0.1", fx->port, &port), PD_ERR_UNAVAILABLE);
    assert_int_equal(kv_transport_listen(t, "127.0.0.1", 70000, &port), PD_ERR_INVALID);
    kv_transport_ep_t *ep;
    assert_int_equal(kv_transport_connect(t, "127.0.0.1", 0, &ep), PD_ERR_INVALID);
    assert_int_equal(kv_transport_set_am_handler(t, 1000, on_ack, NULL), PD_ERR_INVALID);
    uint8_t b[8];
    kv_transport_mem_t *m;
    assert_int_equal(kv_transport_mem_register(t, b, 0, &m), PD_ERR_INVALID);
    uint8_t hdr[KV_TRANSPORT_AM_HEADER_MAX + 1] = {0};
    assert_int_equal(kv_transport_am_send(fx->ep, AM_DONE, hdr, sizeof hdr, NULL, 0, on_sent, fx),
                     PD_ERR_INVALID);
    kv_transport_destroy(t);
    kv_transport_destroy(NULL);
    kv_transport_ep_close(NULL);
    kv_transport_mem_deregister(NULL);
    kv_transport_rkey_destroy(NULL);
}

/* A transport without CUDA memory (loopback; Debian's UCX) refuses device registrations and
 * device puts instead of treating a device pointer as host memory. */
static void test_cuda_refused(void **state)
{
    fx_t *fx = *state;
    kv_transport_mem_t *m = NULL;
    assert_int_equal(kv_transport_query_cuda(fx->dst), 0);
    assert_int_equal(kv_transport_mem_register_cuda(fx->dst, fx->region, PAGE, &m),
                     PD_ERR_UNSUPPORTED);
    assert_null(m);
    assert_int_equal(kv_transport_put_cuda(fx->ep, fx->expect, PAGE, fx_addr(fx, 0), fx->rkey,
                                           on_put, fx),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(fx->n_events, 0);
}

int main(void)
{
    srand(1234);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_flush_am_order, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_bad_rkey, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_put_outside_region, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_region_deregistered, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_peer_gone, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_close_cancels, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_destroy_cancels, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_listen_errors, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cuda_refused, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
