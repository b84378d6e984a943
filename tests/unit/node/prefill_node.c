/* Tests prefill-node/prefill_node.c, the prefill node's state machine, in one process: the node
 * on tiny-llama (CPU backend, prefill_chunk 16 = one page per chunk) with a fake clock and the
 * loopback transport, driven through its control port by a gRPC client; the destination is a
 * fake decode node: a loopback transport with a registered FP8 pool and a KV-done handler. The
 * clock is moved by hand at the node's own reads of it (node_testlib.h): no sleeps.
 * - a Prefill writes every destination page (stamped with its 64-bit tag) and sends one KV-done
 * whose token, counts and checksum match what landed, and answers with the first token;
 * - a Prefill queued past its reservation's write deadline (the lease less a quarter) does no
 *   work, writes nothing, sends no KV-done and answers RESOURCE_EXHAUSTED, which makes the
 *   router reserve again (the condition cluster_load used to need a slow machine for);
 * - a lease that ends between two chunks stops the puts at that chunk: the later pages stay
 *   untouched, no KV-done, RESOURCE_EXHAUSTED;
 * - a Prefill cancelled by its client while queued does no work and sends an aborted KV-done
 *   (the decode node frees the reservation at once);
 * - a destination whose layout is not this model's is refused (INVALID_ARGUMENT);
 * - a draining node refuses new Prefill calls (UNAVAILABLE).
 * Ends with the loop closed (uv_loop_close() == 0). */
#include "node_testlib.h"

#include "hf_config.h"
#include "kv_transport_loopback.h"
#include "prefill_node.h"

#define LEASE_MS 8000
#define N_PAGES 8

static cluster_config_t *cfg;
static kv_transport_t *ptr; /* the prefill node's transport */
static kv_transport_t *ttr; /* the fake decode node's */
static kv_transport_mem_t *tmem;
static void *trkey;
static size_t trkey_len;
static int tport;
static prefill_node_t *pn;
static pd_grpc_client_t *cli;
static kv_layout_t lay;
static uint8_t *pool; /* the fake decode node's pool: N_PAGES pages of lay */

/* KV-done messages the fake decode node received */
static int n_kv_done;
static node_kv_done_t last_kv_done;

static void on_kv_done(void *arg, const void *header, size_t header_len, const void *data,
                       size_t len, kv_transport_ep_t *from)
{
    (void)arg;
    (void)data;
    (void)len;
    (void)from;
    assert_int_equal(node_kv_done_unpack(header, header_len, "test", &last_kv_done), PD_OK);
    n_kv_done++;
}

static const uint8_t token[NODE_TOKEN_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

typedef struct {
    Pdserve__V1__PrefillRequest req;
    Pdserve__V1__KvDestination dest;
    Pdserve__V1__KvLayout layout;
    Pdserve__V1__PageRef refs[N_PAGES];
    Pdserve__V1__PageRef *prefs[N_PAGES];
    int32_t ids[N_PAGES * 16];
} prefill_req_t;

/* A Prefill of n_tokens ids into the first pages of the pool (page i gets tag 0x100 + seq). */
static void prefill_req(prefill_req_t *p, int n_tokens, uint64_t seq)
{
    int n_pages = (n_tokens + 15) / 16;
    memset(p, 0, sizeof *p);
    pdserve__v1__prefill_request__init(&p->req);
    pdserve__v1__kv_destination__init(&p->dest);
    pdserve__v1__kv_layout__init(&p->layout);
    for (int i = 0; i < n_tokens; i++)
        p->ids[i] = i == 0 ? 0 : 3 + (i * 37) % 2000;
    for (int i = 0; i < n_pages; i++) {
        pdserve__v1__page_ref__init(&p->refs[i]);
        p->refs[i].page = i;
        p->refs[i].tag = 0x100 + seq * 16 + (uint64_t)i + (7ull << 40); /* 64-bit tags */
        p->prefs[i] = &p->refs[i];
    }
    p->layout.n_layers = (uint32_t)lay.n_layers;
    p->layout.n_kv_heads = (uint32_t)lay.n_kv_heads;
    p->layout.head_dim = (uint32_t)lay.head_dim;
    p->layout.page_tokens = (uint32_t)lay.page_tokens;
    p->layout.kv_format = "fp8";
    p->layout.page_bytes = lay.page_bytes;
    p->dest.node = "decode0";
    p->dest.ucx_host = "127.0.0.1";
    p->dest.ucx_port = (uint32_t)tport;
    p->dest.rkey.data = trkey;
    p->dest.rkey.len = trkey_len;
    p->dest.layout = &p->layout;
    p->dest.pages = p->prefs;
    p->dest.n_pages = (size_t)n_pages;
    p->dest.seq_id = seq;
    p->dest.token.data = (uint8_t *)token;
    p->dest.token.len = NODE_TOKEN_BYTES;
    p->dest.lease_ms = LEASE_MS;
    p->req.request_id = "t";
    p->req.token_ids = p->ids;
    p->req.n_token_ids = (size_t)n_tokens;
    p->req.dest = &p->dest;
}

static int prefill(prefill_req_t *p, unary_t *u)
{
    return unary(cli, "/pdserve.v1.Prefill/Prefill", &p->req.base,
                 &pdserve__v1__prefill_reply__descriptor, u);
}

static kv_tag_t page_stamp(int page)
{
    kv_tag_t tag;
    memcpy(&tag, pool + (size_t)page * lay.page_bytes, sizeof tag);
    return tag;
}

static int page_untouched(int page)
{
    const uint8_t *p = pool + (size_t)page * lay.page_bytes;
    for (size_t i = 0; i < lay.page_bytes; i++)
        if (p[i])
            return 0;
    return 1;
}

/* The node answers (a Stats round trip): every call and stream reset sent before this on the one
 * connection has been handled by the node's loop. */
static void node_sync(void)
{
    (void)node_stats(cli, "/pdserve.v1.Prefill/Stats");
}

/* ==== setup ==== */

static int setup(void **state)
{
    kv_transport_params_t tp = {0};
    node_env_t env = {{fake_clock, NULL}, NULL};
    hf_config_t hf;
    char path[2048];
    (void)state;
    loop_thread = pthread_self();
    assert_int_equal(uv_loop_init(&loop), 0);
    cfg = test_config("8MiB", LEASE_MS);
    snprintf(path, sizeof path, "%s/tiny-llama/config.json", getenv("PD_MODELS_DIR"));
    assert_int_equal(hf_config_load(path, &hf), PD_OK);
    kv_layout_init(&lay, hf.num_hidden_layers, hf.num_key_value_heads, hf.head_dim, 16, PD_KV_FP8);
    assert_non_null(pool = calloc(N_PAGES, lay.page_bytes));
    tp.name = "decode-fake";
    assert_int_equal(kv_transport_loopback_create(&loop, &tp, &ttr), PD_OK);
    assert_int_equal(kv_transport_listen(ttr, "127.0.0.1", 0, &tport), PD_OK);
    assert_int_equal(kv_transport_set_am_handler(ttr, NODE_AM_KV_DONE, on_kv_done, NULL), PD_OK);
    assert_int_equal(kv_transport_mem_register(ttr, pool, N_PAGES * lay.page_bytes, &tmem), PD_OK);
    assert_int_equal(kv_transport_mem_pack(tmem, &trkey, &trkey_len), PD_OK);
    tp.name = "prefill-test";
    assert_int_equal(kv_transport_loopback_create(&loop, &tp, &ptr), PD_OK);
    env.transport = ptr;
    assert_int_equal(
        prefill_node_create(&loop, cfg, cluster_config_find_node(cfg, "prefill0"), &env, &pn),
        PD_OK);
    assert_int_equal(pd_grpc_client_create(&loop, "127.0.0.1", prefill_node_port(pn), &cli), PD_OK);
    wait_serving(cli, "pdserve.v1.Prefill");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pd_grpc_client_destroy(cli);
    prefill_node_destroy(pn);
    kv_transport_destroy(ptr);
    free(trkey);
    kv_transport_mem_deregister(tmem);
    kv_transport_destroy(ttr);
    for (int i = 0; i < 100 && uv_loop_alive(&loop); i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(uv_loop_close(&loop), 0);
    cluster_config_destroy(cfg);
    free(pool);
    return 0;
}

static int reset(void **state)
{
    (void)state;
    memset(pool, 0, N_PAGES * lay.page_bytes);
    n_kv_done = 0;
    return 0;
}

/* ==== tests ==== */

static void test_prefill_writes_and_reports(void **state)
{
    prefill_req_t p;
    unary_t u;
    (void)state;
    prefill_req(&p, 60, 1); /* 4 chunks, 4 pages */
    assert_int_equal(prefill(&p, &u), 0);
    int32_t first = ((Pdserve__V1__PrefillReply *)u.resp)->first_token;
    assert_int_equal(((Pdserve__V1__PrefillReply *)u.resp)->n_tokens, 60);
    unary_free(&u);
    assert_int_equal(n_kv_done, 1);
    assert_int_equal(last_kv_done.seq_id, 1);
    assert_int_equal(last_kv_done.first_token, first);
    assert_int_equal(last_kv_done.n_tokens, 60);
    assert_int_equal(last_kv_done.n_pages, 4);
    assert_int_equal(last_kv_done.aborted, 0);
    assert_memory_equal(last_kv_done.token, token, NODE_TOKEN_BYTES);
    int32_t pages[4] = {0, 1, 2, 3};
    assert_true(last_kv_done.checksum == node_pages_checksum(0, pool, pages, 4, lay.page_bytes));
    for (int i = 0; i < 4; i++)
        assert_true(page_stamp(i) == p.refs[i].tag); /* all 64 bits, through proto and export */
    assert_true(page_untouched(4));
}

static void test_queued_past_lease(void **state)
{
    prefill_req_t p;
    unary_t u;
    (void)state;
    prefill_req(&p, 60, 2);
    atomic_store(&jump_off_loop, LEASE_MS); /* it waited in the queue the whole lease */
    assert_int_equal(prefill(&p, &u), 8);   /* RESOURCE_EXHAUSTED: the router reserves again */
    assert_non_null(strstr(u.details, "lease"));
    unary_free(&u);
    node_sync();
    assert_int_equal(n_kv_done, 0);
    for (int i = 0; i < N_PAGES; i++)
        assert_true(page_untouched(i));
}

static void test_lease_ends_between_chunks(void **state)
{
    prefill_req_t p;
    unary_t u;
    (void)state;
    const char *ov = getenv("PDSERVE_KV_OVERLAP");
    const bool none = ov && strcmp(ov, "none") == 0;
    prefill_req(&p, 60, 3);
    /* loop reads: 1 the call's write deadline, 2 the first chunk's puts, 3 the second's
     * (PDSERVE_KV_OVERLAP=none: 2 the puts of all pages, after the whole prompt) */
    clock_jump_on_loop_read(none ? 2 : 3, LEASE_MS);
    assert_int_equal(prefill(&p, &u), 8);
    unary_free(&u);
    node_sync();
    assert_int_equal(n_kv_done, 0);
    if (none) { /* the pages leave together, after the deadline */
        assert_true(page_untouched(0));
    } else {
        assert_true(page_stamp(0) == p.refs[0].tag); /* the first chunk's page was written */
    }
    for (int i = 1; i < N_PAGES; i++)
        assert_true(page_untouched(i)); /* nothing after the deadline */
}

static void test_cancel_while_queued(void **state)
{
    prefill_req_t p;
    unary_t u;
    pd_grpc_client_call_t *call;
    (void)state;
    prefill_req(&p, 60, 4);
    clock_hold(); /* the compute thread stops at its next clock read: the job waits */
    memset(&u, 0, sizeof u);
    assert_int_equal(pd_grpc_client_unary(cli, "/pdserve.v1.Prefill/Prefill", &p.req.base,
                                          &pdserve__v1__prefill_reply__descriptor, WAIT_MS,
                                          unary_done, &u, &call),
                     PD_OK);
    int64_t end = pd_clock_ms() + WAIT_MS;
    while (!atomic_load(&held) && pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_NOWAIT);
    assert_true(atomic_load(&held));
    pd_grpc_client_call_cancel(call); /* the router's client went away */
    run_until(&u.done, WAIT_MS);
    assert_int_equal(u.code, 1); /* CANCELLED */
    unary_free(&u);
    node_sync(); /* the node has seen the reset */
    clock_release();
    end = pd_clock_ms() + WAIT_MS;
    while (n_kv_done == 0 && pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(n_kv_done, 1); /* "the writer stopped": the reservation is freed now */
    assert_int_equal(last_kv_done.seq_id, 4);
    assert_int_equal(last_kv_done.aborted, 1);
    for (int i = 0; i < N_PAGES; i++)
        assert_true(page_untouched(i)); /* cancelled before any work */
}

static void test_layout_mismatch(void **state)
{
    prefill_req_t p;
    unary_t u;
    (void)state;
    prefill_req(&p, 20, 5);
    p.layout.head_dim = 64;
    assert_int_equal(prefill(&p, &u), 3); /* INVALID_ARGUMENT */
    unary_free(&u);
    node_sync();
    assert_int_equal(n_kv_done, 0);
}

static void test_drain_refuses(void **state)
{
    prefill_req_t p;
    unary_t u;
    (void)state;
    prefill_node_drain(pn);
    assert_int_equal(prefill_node_busy(pn), 0);
    prefill_req(&p, 20, 6);
    assert_int_equal(prefill(&p, &u), 14); /* UNAVAILABLE: the router tries another node */
    unary_free(&u);
    assert_int_equal(n_kv_done, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_prefill_writes_and_reports, reset),
        cmocka_unit_test_setup(test_queued_past_lease, reset),
        cmocka_unit_test_setup(test_lease_ends_between_chunks, reset),
        cmocka_unit_test_setup(test_cancel_while_queued, reset),
        cmocka_unit_test_setup(test_layout_mismatch, reset),
        cmocka_unit_test_setup(test_drain_refuses, reset),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
