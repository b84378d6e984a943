/* Tests decode-node/decode_node.c, the decode node's state machine, in one process: the node on
 * tiny-llama (CPU backend, FP8 KV) with a fake clock and the loopback transport
 * (tests/support), driven through its control port by a gRPC client and, as its KV writer, by a
 * second loopback transport that puts pages and sends KV-done like a prefill node. The clock is
 * advanced by hand: no test sleeps, each waits for a reply, a stream's end or the compute
 * thread's ticks.
 * - a reservation whose writer never comes is dropped when its lease ends, and its pages stay
 *   quarantined for quarantine_ms after that (issue 13: they were freed in the same tick);
 * - a KV-done after the lease (late) is dropped; the Decode that follows gets NOT_FOUND;
 * - a duplicate KV-done is dropped and the sequence decodes normally;
 * - a KV-done with a wrong reservation token is dropped, the right one is then accepted;
 * - a KV-done after the reservation was released (cancel) frees the quarantined pages at once;
 * - a KV-done whose checksum differs from the pages that landed fails the Decode with DATA_LOSS
 *   and counts an integrity failure;
 * - a Decode with a wrong token is refused (INVALID_ARGUMENT), the reservation stays;
 * - a Decode waiting for KV-done ends with DEADLINE_EXCEEDED when the lease ends;
 * - Reserve keeps the watermark free (RESOURCE_EXHAUSTED one page past it);
 * - two sequences that outgrow the pool: the newest is preempted (its stream says so), the other
 *   completes, and every page comes back;
 * - the CPU backend out of memory for an op's scratch (attention) in a decode step: that request
 *   fails with RESOURCE_EXHAUSTED and the node serves the next one (issue 13: it aborted; malloc
 *   is wrapped at link time, --wrap=malloc).
 * Each test ends with every page free; the last checks the loop closes (uv_loop_close() == 0). */
#include "node_testlib.h"

#include "decode_node.h"
#include "kv_transport_loopback.h"

/* ==== allocations that fail on demand (linked with --wrap=malloc) ==== */

static atomic_size_t fail_size; /* the next malloc of exactly this many bytes fails (0: none) */
static atomic_int n_failed;

void *__real_malloc(size_t n);

void *__wrap_malloc(size_t n)
{
    size_t want = n;
    if (n && atomic_compare_exchange_strong(&fail_size, &want, 0)) {
        atomic_fetch_add(&n_failed, 1);
        return NULL;
    }
    return __real_malloc(n);
}

#define QUARANTINE_MS 2000 /* kv_pool's default (the engine does not change it) */
#define LEASE_MS 1000

static cluster_config_t *cfg;
static kv_transport_t *dtr; /* the decode node's transport */
static kv_transport_t *wtr; /* the writer's (a prefill node's) */
static kv_transport_ep_t *wep;
static kv_transport_rkey_t *wrkey;
static decode_node_t *dn;
static pd_grpc_client_t *cli;
static int pages_total;

typedef struct {
    uint64_t seq_id;
    uint8_t token[NODE_TOKEN_BYTES];
    int n_tokens, n_pages;
    int32_t pages[256];
    kv_tag_t tags[256];
    size_t page_bytes;
} resv_t;

/* ==== calls to the node ==== */

static int reserve(uint32_t n_tokens, int64_t lease_ms, resv_t *r, unary_t *u_out)
{
    Pdserve__V1__ReserveRequest req = PDSERVE__V1__RESERVE_REQUEST__INIT;
    unary_t u;
    int code;
    req.n_tokens = n_tokens;
    req.max_tokens = 64;
    req.lease_ms = lease_ms;
    code = unary(cli, "/pdserve.v1.Decode/Reserve", &req.base,
                 &pdserve__v1__reserve_reply__descriptor, &u);
    if (code == 0) {
        const Pdserve__V1__KvDestination *d = ((Pdserve__V1__ReserveReply *)u.resp)->dest;
        assert_non_null(d);
        assert_int_equal(d->token.len, NODE_TOKEN_BYTES);
        assert_true(d->n_pages <= 256);
        memset(r, 0, sizeof *r);
        r->seq_id = d->seq_id;
        memcpy(r->token, d->token.data, NODE_TOKEN_BYTES);
        r->n_tokens = (int)n_tokens;
        r->n_pages = (int)d->n_pages;
        r->page_bytes = d->layout->page_bytes;
        for (size_t i = 0; i < d->n_pages; i++) {
            r->pages[i] = d->pages[i]->page;
            r->tags[i] = d->pages[i]->tag;
        }
        if (!wep) { /* the writer connects once, as a prefill node does per decode node */
            assert_int_equal(kv_transport_connect(wtr, d->ucx_host, (int)d->ucx_port, &wep), PD_OK);
            assert_int_equal(kv_transport_rkey_unpack(wep, d->rkey.data, d->rkey.len, &wrkey),
                             PD_OK);
        }
    }
    if (u_out)
        *u_out = u;
    else
        unary_free(&u);
    return code;
}

static int release(uint64_t seq_id, int *found_p)
{
    Pdserve__V1__ReleaseRequest req = PDSERVE__V1__RELEASE_REQUEST__INIT;
    unary_t u;
    int code;
    req.seq_id = seq_id;
    code = unary(cli, "/pdserve.v1.Decode/Release", &req.base,
                 &pdserve__v1__release_reply__descriptor, &u);
    if (code == 0 && found_p)
        *found_p = ((Pdserve__V1__ReleaseReply *)u.resp)->found;
    unary_free(&u);
    return code;
}

/* Every compute job submitted before this one has run (jobs run in order): a Release of an id
 * no reservation has. */
static void barrier(void)
{
    int found = -1;
    assert_int_equal(release(UINT64_MAX, &found), 0);
    assert_int_equal(found, 0);
}

/* The node's Stats as of the compute thread's next whole tick (it publishes them each tick). */
static Pdserve__V1__NodeStats dstats(void)
{
    wait_ticks(2);
    return node_stats(cli, "/pdserve.v1.Decode/Stats");
}

static uint32_t pages_used(void)
{
    return dstats().pages_used;
}

typedef struct {
    int done, code, n_tokens, preempted;
    char finish[32];
    pd_grpc_client_call_t *call;
} stream_t;

static void stream_msg(void *arg, ProtobufCMessage *msg)
{
    stream_t *s = arg;
    const Pdserve__V1__DecodeEvent *ev = (const Pdserve__V1__DecodeEvent *)msg;
    s->n_tokens += (int)ev->n_token_ids;
    if (ev->finish_reason && ev->finish_reason[0])
        snprintf(s->finish, sizeof s->finish, "%s", ev->finish_reason);
    s->preempted |= ev->preempted;
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void stream_done(void *arg, int code, const char *msg)
{
    stream_t *s = arg;
    (void)msg;
    s->code = code;
    s->done = 1;
}

/* Opens the Decode stream of r (prompt ids 1.., then first), max_new more tokens. */
static void decode_start(const resv_t *r, int32_t first, uint32_t max_new, const uint8_t *token,
                         stream_t *s)
{
    Pdserve__V1__DecodeRequest req = PDSERVE__V1__DECODE_REQUEST__INIT;
    Pdserve__V1__SamplingParams sp = PDSERVE__V1__SAMPLING_PARAMS__INIT;
    int32_t ids[4097];
    for (int i = 0; i < r->n_tokens; i++)
        ids[i] = 1 + i % 1000;
    ids[r->n_tokens] = first;
    sp.ignore_eos = 1;
    sp.max_tokens = max_new + 1;
    req.seq_id = r->seq_id;
    req.request_id = "t";
    req.token_ids = ids;
    req.n_token_ids = (size_t)r->n_tokens + 1;
    req.sampling = &sp;
    req.max_new_tokens = max_new;
    req.n_generated = 1;
    req.token.data = (uint8_t *)token;
    req.token.len = NODE_TOKEN_BYTES;
    memset(s, 0, sizeof *s);
    assert_int_equal(pd_grpc_client_stream(cli, "/pdserve.v1.Decode/Decode", &req.base,
                                           &pdserve__v1__decode_event__descriptor, WAIT_MS,
                                           stream_msg, stream_done, s, &s->call),
                     PD_OK);
}

/* ==== the writer ==== */

typedef struct {
    int done;
    pd_status_t st;
} op_t;

static void op_done(void *arg, pd_status_t st)
{
    op_t *o = arg;
    o->st = st;
    o->done = 1;
}

/* Puts r's pages (each header stamped with its tag, payload bytes fill) and flushes; returns
 * the KV-done checksum of what was sent. */
static uint64_t write_pages(const resv_t *r, uint8_t fill)
{
    const size_t pb = r->page_bytes;
    uint8_t *buf = malloc((size_t)r->n_pages * pb);
    uint64_t base = kv_transport_rkey_base(wrkey), sum;
    op_t ops[256], fl = {0, PD_OK};
    assert_non_null(buf);
    memset(buf, fill, (size_t)r->n_pages * pb);
    for (int i = 0; i < r->n_pages; i++) {
        uint8_t *p = buf + (size_t)i * pb;
        memset(p, 0, KV_PAGE_HEADER_BYTES);
        memcpy(p, &r->tags[i], sizeof r->tags[i]);
        memset(&ops[i], 0, sizeof ops[i]);
        assert_int_equal(kv_transport_put(wep, p, pb, base + (uint64_t)r->pages[i] * pb, wrkey,
                                          op_done, &ops[i]),
                         PD_OK);
    }
    assert_int_equal(kv_transport_flush(wep, op_done, &fl), PD_OK);
    run_until(&fl.done, WAIT_MS);
    assert_int_equal(fl.st, PD_OK);
    for (int i = 0; i < r->n_pages; i++)
        assert_int_equal(ops[i].st, PD_OK);
    sum = node_pages_checksum(0, buf, NULL, r->n_pages, pb);
    free(buf);
    return sum;
}

/* Sends KV-done for r and waits until the node has handled it. */
static void kv_done(const resv_t *r, int32_t first, uint64_t checksum, const uint8_t *token,
                    int aborted)
{
    node_kv_done_t m = {
        r->seq_id, first, (uint32_t)r->n_tokens, (uint32_t)r->n_pages, aborted, checksum, {0},
        0,         {0}};
    uint8_t buf[NODE_KV_DONE_MAX];
    size_t len;
    op_t o = {0, PD_OK};
    memcpy(m.token, token, NODE_TOKEN_BYTES);
    assert_int_equal(node_kv_done_pack(&m, buf, sizeof buf, &len), PD_OK);
    assert_int_equal(kv_transport_am_send(wep, NODE_AM_KV_DONE, buf, len, NULL, 0, op_done, &o),
                     PD_OK);
    run_until(&o.done, WAIT_MS);
    assert_int_equal(o.st, PD_OK);
    barrier();
}

/* ==== setup ==== */

static int setup(void **state)
{
    kv_transport_params_t tp = {0};
    node_env_t env = {{fake_clock, NULL}, NULL};
    (void)state;
    loop_thread = pthread_self();
    assert_int_equal(uv_loop_init(&loop), 0);
    cfg = test_config("3MiB", LEASE_MS);
    tp.name = "decode-test";
    assert_int_equal(kv_transport_loopback_create(&loop, &tp, &dtr), PD_OK);
    tp.name = "writer-test";
    assert_int_equal(kv_transport_loopback_create(&loop, &tp, &wtr), PD_OK);
    env.transport = dtr;
    assert_int_equal(
        decode_node_create(&loop, cfg, cluster_config_find_node(cfg, "decode0"), NULL, &env, &dn),
        PD_OK);
    assert_int_equal(pd_grpc_client_create(&loop, "127.0.0.1", decode_node_port(dn), &cli), PD_OK);
    wait_serving(cli, "pdserve.v1.Decode");
    pages_total = (int)dstats().pages_total;
    assert_true(pages_total >= 32);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pd_grpc_client_destroy(cli);
    kv_transport_ep_close(wep);
    decode_node_destroy(dn);
    kv_transport_destroy(wtr);
    kv_transport_destroy(dtr);
    uv_run(&loop, UV_RUN_NOWAIT);
    for (int i = 0; i < 100 && uv_loop_alive(&loop); i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(uv_loop_close(&loop), 0);
    cluster_config_destroy(cfg);
    return 0;
}

/* ==== tests ==== */

static void test_lease_then_quarantine(void **state)
{
    resv_t r;
    (void)state;
    assert_int_equal(reserve(40, LEASE_MS, &r, NULL), 0);
    assert_int_equal(r.n_pages, 3);
    assert_int_equal(pages_used(), 3);
    assert_int_equal(dstats().queued, 1);
    clock_advance(LEASE_MS + 1); /* the lease ends: the reservation goes */
    wait_ticks(3);
    assert_int_equal(dstats().queued, 0);
    /* its pages stay quarantined (a late writer lands there, not in a new owner's page) */
    assert_int_equal(pages_used(), 3);
    clock_advance(QUARANTINE_MS / 2);
    assert_int_equal(pages_used(), 3);
    clock_advance(QUARANTINE_MS / 2 + 1);
    assert_int_equal(pages_used(), 0);
}

static void test_late_kv_done(void **state)
{
    resv_t r;
    stream_t s;
    (void)state;
    assert_int_equal(reserve(20, LEASE_MS, &r, NULL), 0);
    clock_advance(LEASE_MS + 1);
    wait_ticks(3);
    assert_int_equal(dstats().queued, 0);
    kv_done(&r, 7, write_pages(&r, 0x11), r.token, 0); /* late: dropped */
    decode_start(&r, 7, 4, r.token, &s);
    run_until(&s.done, WAIT_MS);
    assert_int_equal(s.code, 5); /* NOT_FOUND */
    assert_int_equal(s.n_tokens, 0);
    clock_advance(QUARANTINE_MS + 1);
    assert_int_equal(pages_used(), 0);
}

static void test_duplicate_kv_done(void **state)
{
    resv_t r;
    stream_t s;
    uint64_t sum;
    (void)state;
    assert_int_equal(reserve(20, LEASE_MS, &r, NULL), 0);
    sum = write_pages(&r, 0x11);
    kv_done(&r, 9, sum, r.token, 0);
    kv_done(&r, 9, sum, r.token, 0); /* again: dropped */
    decode_start(&r, 9, 5, r.token, &s);
    run_until(&s.done, WAIT_MS);
    assert_int_equal(s.code, 0);
    assert_int_equal(s.n_tokens, 5);
    assert_string_equal(s.finish, "length");
    assert_int_equal(dstats().integrity_failures, 0);
    assert_int_equal(pages_used(), 0);
}

static void test_wrong_token_kv_done(void **state)
{
    resv_t r;
    stream_t s;
    uint8_t bad[NODE_TOKEN_BYTES];
    uint64_t sum;
    (void)state;
    assert_int_equal(reserve(20, LEASE_MS, &r, NULL), 0);
    sum = write_pages(&r, 0x11);
    memcpy(bad, r.token, sizeof bad);
    bad[3] ^= 1;
    kv_done(&r, 9, sum, bad, 0);     /* not this reservation's writer: touches nothing */
    kv_done(&r, 9, sum, bad, 1);     /* not even an abort */
    kv_done(&r, 9, sum, r.token, 0); /* the writer: accepted */
    decode_start(&r, 9, 3, r.token, &s);
    run_until(&s.done, WAIT_MS);
    assert_int_equal(s.code, 0);
    assert_int_equal(s.n_tokens, 3);
    assert_int_equal(pages_used(), 0);
}

static void test_kv_done_after_cancel(void **state)
{
    resv_t r;
    int found = 0;
    (void)state;
    assert_int_equal(reserve(40, LEASE_MS, &r, NULL), 0);
    assert_int_equal(release(r.seq_id, &found), 0); /* the request was cancelled */
    assert_int_equal(found, 1);
    assert_int_equal(pages_used(), 3);                 /* quarantined: the writer may still write */
    kv_done(&r, 9, write_pages(&r, 0x11), r.token, 1); /* the writer stops: freed at once */
    assert_int_equal(pages_used(), 0);                 /* no clock advance needed */
    assert_int_equal(dstats().queued, 0);
}

static void test_checksum_mismatch(void **state)
{
    resv_t r;
    stream_t s;
    uint64_t before = dstats().integrity_failures;
    (void)state;
    assert_int_equal(reserve(20, LEASE_MS, &r, NULL), 0);
    kv_done(&r, 9, write_pages(&r, 0x11) ^ 1, r.token, 0);
    decode_start(&r, 9, 3, r.token, &s);
    run_until(&s.done, WAIT_MS);
    assert_int_equal(s.code, 15); /* DATA_LOSS */
    assert_int_equal(dstats().integrity_failures, before + 1);
    clock_advance(LEASE_MS + QUARANTINE_MS + 1); /* quarantined pages: the lease and after */
    wait_ticks(2);
    assert_int_equal(pages_used(), 0);
}

static void test_decode_wrong_token_and_lease(void **state)
{
    resv_t r;
    stream_t s;
    uint8_t bad[NODE_TOKEN_BYTES] = {0};
    (void)state;
    assert_int_equal(reserve(20, LEASE_MS, &r, NULL), 0);
    decode_start(&r, 9, 3, bad, &s);
    run_until(&s.done, WAIT_MS);
    assert_int_equal(s.code, 3); /* INVALID_ARGUMENT; the reservation stays */
    assert_int_equal(dstats().queued, 1);
    decode_start(&r, 9, 3, r.token, &s); /* waits for KV-done, which never comes */
    barrier();
    clock_advance(LEASE_MS + 1);
    run_until(&s.done, WAIT_MS);
    assert_int_equal(s.code, 4); /* DEADLINE_EXCEEDED */
    clock_advance(QUARANTINE_MS + 1);
    assert_int_equal(pages_used(), 0);
}

static void test_watermark(void **state)
{
    resv_t r;
    unary_t u;
    int wm = pages_total / 16, ok_pages = pages_total - wm, found = 0;
    (void)state;
    assert_int_equal(pages_used(), 0);
    assert_int_not_equal(reserve((uint32_t)(ok_pages + 1) * 16, LEASE_MS, &r, &u), 0);
    assert_int_equal(u.code, 8); /* RESOURCE_EXHAUSTED */
    assert_non_null(strstr(u.details, "no free kv pages"));
    unary_free(&u);
    assert_int_equal(reserve((uint32_t)ok_pages * 16, LEASE_MS, &r, NULL), 0);
    assert_int_equal(r.n_pages, ok_pages);
    assert_int_equal(reserve(16, LEASE_MS, &r, &u), 8); /* nothing above the watermark left */
    unary_free(&u);
    barrier();
    assert_int_equal(release(r.seq_id, &found), 0);
    assert_int_equal(found, 1);
    assert_int_equal(pages_used(), ok_pages); /* released before its writer: quarantined */
    clock_advance(LEASE_MS + QUARANTINE_MS + 1);
    assert_int_equal(pages_used(), 0);
}

static void test_preemption(void **state)
{
    resv_t a, b;
    stream_t sa, sb;
    int wm = pages_total / 16, each = (pages_total - wm) / 2 - 1;
    (void)state;
    assert_true(wm >= 2);
    assert_int_equal(reserve((uint32_t)each * 16, LEASE_MS, &a, NULL), 0);
    assert_int_equal(reserve((uint32_t)each * 16, LEASE_MS, &b, NULL), 0);
    kv_done(&a, 9, write_pages(&a, 0x11), a.token, 0);
    kv_done(&b, 9, write_pages(&b, 0x11), b.token, 0);
    /* each grows by a page every 16 tokens: together they need more than the pool has */
    uint32_t grow = (uint32_t)(pages_total - 2 * each) * 16;
    decode_start(&a, 9, grow, a.token, &sa);
    run_until(&sa.n_tokens, WAIT_MS); /* a runs first: b is the newest */
    decode_start(&b, 9, grow, b.token, &sb);
    run_until(&sb.done, WAIT_MS);
    run_until(&sa.done, WAIT_MS);
    assert_int_equal(sa.code, 0);
    assert_int_equal(sa.n_tokens, (int)grow);
    assert_int_equal(sb.code, 0); /* told, not failed: the router prefills it again */
    assert_true(sb.preempted);
    assert_true(sb.n_tokens < (int)grow);
    assert_int_equal(pages_used(), 0);
}

static void test_backend_out_of_memory(void **state)
{
    resv_t r;
    stream_t s;
    (void)state;
    /* a 333-token prompt plus its first token: the first decode step attends over 334 positions,
     * and the CPU backend's attention keeps (334 + 1) * head_dim f32 of K per thread */
    assert_int_equal(reserve(333, LEASE_MS, &r, NULL), 0);
    kv_done(&r, 9, write_pages(&r, 0x11), r.token, 0);
    atomic_store(&n_failed, 0);
    atomic_store(&fail_size, (size_t)(334 + 1) * 128 * sizeof(float));
    decode_start(&r, 9, 4, r.token, &s);
    run_until(&s.done, WAIT_MS);
    assert_int_equal(atomic_load(&n_failed), 1);
    assert_int_equal(s.code, 8); /* RESOURCE_EXHAUSTED: that request only */
    assert_int_equal(pages_used(), 0);
    /* the node goes on serving */
    assert_int_equal(reserve(333, LEASE_MS, &r, NULL), 0);
    kv_done(&r, 9, write_pages(&r, 0x11), r.token, 0);
    decode_start(&r, 9, 4, r.token, &s);
    run_until(&s.done, WAIT_MS);
    assert_int_equal(s.code, 0);
    assert_int_equal(s.n_tokens, 4);
    assert_int_equal(pages_used(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lease_then_quarantine),
        cmocka_unit_test(test_late_kv_done),
        cmocka_unit_test(test_duplicate_kv_done),
        cmocka_unit_test(test_wrong_token_kv_done),
        cmocka_unit_test(test_kv_done_after_cancel),
        cmocka_unit_test(test_checksum_mismatch),
        cmocka_unit_test(test_decode_wrong_token_and_lease),
        cmocka_unit_test(test_watermark),
        cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_backend_out_of_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
