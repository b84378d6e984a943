/* node_testlib: what the unit tests of the two nodes (tests/unit/node/decode_node.c,
 * prefill_node.c) share: a libuv loop, a fake clock the test advances by hand (no sleeps: the
 * nodes read every lease and deadline from it), a cluster config for tiny-llama on the CPU
 * backend with ports picked by the kernel, unary and streaming calls through pd_grpc_client, and
 * waiting for the compute thread's ticks. Header-only (static inline functions): each test is one
 * program. */
#ifndef PD_NODE_TESTLIB_H
#define PD_NODE_TESTLIB_H

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "clock.h"
#include "cluster_config.h"
#include "grpc_client.h"
#include "health.pb-c.h"
#include "kv_layout.h"
#include "node.h"
#include "node_control.h"
#include "pdserve.pb-c.h"

/* How long a test waits for an event (real time) before it fails: generous, as the model runs
 * much slower under the sanitizers; meson's timeout bounds the whole test anyway. */
#define WAIT_MS 600000

static uv_loop_t loop;
static pthread_t loop_thread;

/* ==== the fake clock ==== */

static _Atomic int64_t fake_now = 1000000; /* ms; starts far from 0 like a monotonic clock */
static atomic_int clock_reads_off_loop;    /* reads from other threads (the compute thread) */
static atomic_int clock_reads_on_loop;

/* Conditions a test arms before a call, met when the node reads the clock: */
static _Atomic int64_t jump_off_loop; /* added to the clock at the next off-loop read */
static int jump_on_loop_at;           /* loop read at which jump_on_loop is added (0: none) */
static int64_t jump_on_loop;
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static int hold_armed; /* the next off-loop read blocks until clock_release() */
static atomic_int held;

static inline int64_t fake_clock(void *arg)
{
    (void)arg;
    if (!pthread_equal(pthread_self(), loop_thread)) {
        atomic_fetch_add(&clock_reads_off_loop, 1);
        atomic_fetch_add(&fake_now, atomic_exchange(&jump_off_loop, 0));
        pthread_mutex_lock(&hold_mu);
        if (hold_armed) {
            atomic_store(&held, 1);
            while (hold_armed)
                pthread_cond_wait(&hold_cv, &hold_mu);
            atomic_store(&held, 0);
        }
        pthread_mutex_unlock(&hold_mu);
    } else if (atomic_fetch_add(&clock_reads_on_loop, 1) + 1 == jump_on_loop_at) {
        atomic_fetch_add(&fake_now, jump_on_loop);
        jump_on_loop_at = 0;
    }
    return atomic_load(&fake_now);
}

/* The compute thread's next clock read waits until clock_release(): a job held in its queue. */
static inline void clock_hold(void)
{
    pthread_mutex_lock(&hold_mu);
    hold_armed = 1;
    pthread_mutex_unlock(&hold_mu);
}

static inline void clock_release(void)
{
    pthread_mutex_lock(&hold_mu);
    hold_armed = 0;
    pthread_cond_broadcast(&hold_cv);
    pthread_mutex_unlock(&hold_mu);
}

/* The loop thread's n-th clock read from now on sees the clock ms later (a deadline passes
 * between two steps of one request). */
static inline void clock_jump_on_loop_read(int n, int64_t ms)
{
    jump_on_loop = ms;
    jump_on_loop_at = atomic_load(&clock_reads_on_loop) + n;
}

static inline void clock_advance(int64_t ms)
{
    atomic_fetch_add(&fake_now, ms);
}

/* Runs the loop until *flag is set; fails after timeout_ms of real time. */
static inline void run_until(const int *flag, int64_t timeout_ms)
{
    int64_t end = pd_clock_ms() + timeout_ms;
    while (!*flag && pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    assert_true(*flag);
}

static inline void wake_cb(uv_timer_t *t)
{
    (void)t;
}

static inline void set_flag_cb(uv_timer_t *t)
{
    *(int *)t->data = 1;
}

/* Runs the loop until the compute thread has read the clock n more times (each tick reads it
 * once; the test submits no other work meanwhile): at least n - 1 whole ticks ran after this
 * call, all seeing the clock as it is now. */
static inline void wait_ticks(int n)
{
    int start = atomic_load(&clock_reads_off_loop);
    int64_t end = pd_clock_ms() + WAIT_MS;
    uv_timer_t t; /* the loop polls at 5 ms meanwhile: ticks do not post to it */
    uv_timer_init(&loop, &t);
    uv_timer_start(&t, wake_cb, 5, 5);
    while (atomic_load(&clock_reads_off_loop) - start < n && pd_clock_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_true(atomic_load(&clock_reads_off_loop) - start >= n);
}

/* ==== the cluster config ==== */

/* A config for tiny-llama (PD_MODELS_DIR) on the CPU backend with nodes prefill0 (FP8 weights,
 * BF16 KV) and decode0 (INT4 weights, FP8 KV), both with kv_budget (e.g. "3MiB"), their ports
 * picked by the kernel. */
static inline cluster_config_t *test_config(const char *kv_budget, int64_t lease_ms)
{
    char text[2048], err[256];
    cluster_config_t *cfg;
    snprintf(text, sizeof text,
             "model: %s/tiny-llama\n"
             "router:\n  listen: 127.0.0.1:2\n  http: 127.0.0.1:3\n"
             "transport:\n  lease_ms: %lld\n"
             "nodes:\n"
             "  - name: prefill0\n    role: prefill\n    host: 127.0.0.1\n    port: 4\n"
             "    backend: cpu\n    weights: fp8\n    kv: bf16\n    page_tokens: 16\n"
             "    kv_budget: %s\n    max_batch: 8\n    prefill_chunk: 16\n    threads: 1\n"
             "  - name: decode0\n    role: decode\n    host: 127.0.0.1\n    port: 5\n"
             "    ucx_port: 6\n    backend: cpu\n    weights: int4\n    kv: fp8\n"
             "    page_tokens: 16\n    kv_budget: %s\n    max_batch: 8\n    threads: 1\n",
             getenv("PD_MODELS_DIR"), (long long)lease_ms, kv_budget, kv_budget);
    if (cluster_config_parse(text, strlen(text), "test", NULL, err, sizeof err, &cfg) != PD_OK)
        fail_msg("config: %s", err);
    for (size_t i = 0; i < cfg->n_nodes; i++) {
        cfg->nodes[i].port = 0; /* the file wants real ports: the kernel picks them here */
        cfg->nodes[i].ucx_port = 0;
    }
    return cfg;
}

/* ==== calls ==== */

typedef struct {
    int done, code;
    char details[256];
    ProtobufCMessage *resp;
} unary_t;

static inline void unary_done(void *arg, int code, const char *msg, ProtobufCMessage *resp)
{
    unary_t *u = arg;
    u->code = code;
    snprintf(u->details, sizeof u->details, "%s", msg ? msg : "");
    u->resp = resp;
    u->done = 1;
}

/* Starts a unary call; the caller runs the loop until u->done and frees u->resp. */
static inline void unary_start(pd_grpc_client_t *cli, const char *path, const ProtobufCMessage *req,
                               const ProtobufCMessageDescriptor *resp_desc, unary_t *u)
{
    memset(u, 0, sizeof *u);
    assert_int_equal(pd_grpc_client_unary(cli, path, req, resp_desc, WAIT_MS, unary_done, u, NULL),
                     PD_OK);
}

/* A unary call run to its end; returns its gRPC code (the response, if any, in u->resp). */
static int unary(pd_grpc_client_t *cli, const char *path, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, unary_t *u)
{
    unary_start(cli, path, req, resp_desc, u);
    run_until(&u->done, WAIT_MS);
    return u->code;
}

static inline void unary_free(unary_t *u)
{
    if (u->resp)
        protobuf_c_message_free_unpacked(u->resp, NULL);
    u->resp = NULL;
}

/* A node's Stats (path: "/pdserve.v1.Decode/Stats" or "/pdserve.v1.Prefill/Stats"). */
static inline Pdserve__V1__NodeStats node_stats(pd_grpc_client_t *cli, const char *path)
{
    Pdserve__V1__StatsRequest req = PDSERVE__V1__STATS_REQUEST__INIT;
    Pdserve__V1__NodeStats s;
    unary_t u;
    assert_int_equal(unary(cli, path, &req.base, &pdserve__v1__node_stats__descriptor, &u), 0);
    s = *(Pdserve__V1__NodeStats *)u.resp;
    s.node = s.role = s.weights = s.kv = NULL; /* owned by u.resp */
    unary_free(&u);
    return s;
}

/* Waits until the node is SERVING: its Stats show a pool (decode) and its health says so. */
static inline void wait_serving(pd_grpc_client_t *cli, const char *service)
{
    int64_t end = pd_clock_ms() + WAIT_MS;
    for (;;) {
        Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        unary_t u;
        req.service = (char *)service;
        if (unary(cli, "/grpc.health.v1.Health/Check", &req.base,
                  &grpc__health__v1__health_check_response__descriptor, &u) == 0 &&
            ((Grpc__Health__V1__HealthCheckResponse *)u.resp)->status ==
                GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING) {
            unary_free(&u);
            return;
        }
        unary_free(&u);
        assert_true(pd_clock_ms() < end);
        uv_timer_t t; /* the model loads on the compute thread: poll every 20 ms */
        int fired = 0;
        uv_timer_init(&loop, &t);
        t.data = &fired;
        uv_timer_start(&t, set_flag_cb, 20, 0);
        run_until(&fired, 1000);
        uv_close((uv_handle_t *)&t, NULL);
        uv_run(&loop, UV_RUN_NOWAIT);
    }
}

#endif
