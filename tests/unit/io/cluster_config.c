/* Tests common/cluster_config.c: the deploy/ examples load, defaults by role, every kind of error
 * names file:line:col and the key path, overrides validate like the file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster_config.h"
#include "log.h"

static const char *good = "model: models/tiny-llama\n"
                          "router:\n"
                          "  listen: 127.0.0.1:50050\n"
                          "  http: 127.0.0.1:50051\n"
                          "nodes:\n"
                          "  - name: p0\n"
                          "    role: prefill\n"
                          "    host: 127.0.0.1\n"
                          "    port: 50060\n"
                          "  - name: d0\n"
                          "    role: decode\n"
                          "    host: 127.0.0.1\n"
                          "    port: 50070\n"
                          "    ucx_port: 50071\n"
                          "    kv_budget: 2GiB\n"
                          "    backend_options: bf16_gemm=split,fused=off\n";

static void test_defaults(void **state)
{
    cluster_config_t *cfg = NULL;
    char err[256];
    (void)state;

    assert_int_equal(
        cluster_config_parse(good, strlen(good), "t.yaml", "/base", err, sizeof err, &cfg), PD_OK);
    assert_string_equal(err, "");
    assert_string_equal(cfg->model, "/base/models/tiny-llama");
    assert_string_equal(cfg->router.listen_host, "127.0.0.1");
    assert_int_equal(cfg->router.listen_port, 50050);
    assert_int_equal(cfg->router.http_port, 50051);
    assert_int_equal(cfg->router.prefill_policy, CLUSTER_PREFILL_ROUND_ROBIN);
    assert_int_equal(cfg->router.request_timeout_ms, 60000);
    assert_int_equal(cfg->router.max_queue, 1024);
    assert_int_equal(cfg->router.idle_timeout_ms, 0); /* unset: the servers' defaults */
    assert_int_equal(cfg->router.header_timeout_ms, 0);
    assert_int_equal(cfg->router.body_timeout_ms, 0);
    assert_int_equal(cfg->router.max_connections, 0);
    assert_int_equal(cfg->router.max_streams, 0);
    assert_int_equal(cfg->transport.lease_ms, 10000);
    assert_string_equal(cfg->transport.ucx_tls, "");
    assert_int_equal(cfg->n_nodes, 2);

    const cluster_node_t *p = cluster_config_find_node(cfg, "p0");
    const cluster_node_t *d = cluster_config_find_node(cfg, "d0");
    assert_non_null(p);
    assert_non_null(d);
    assert_null(cluster_config_find_node(cfg, "x"));
    assert_int_equal(p->role, CLUSTER_ROLE_PREFILL);
    assert_int_equal(p->weights, PD_WFMT_FP8);
    assert_int_equal(p->kv, PD_KV_BF16);
    assert_int_equal(d->weights, PD_WFMT_INT4);
    assert_int_equal(d->kv, PD_KV_FP8);
    assert_int_equal(p->page_tokens, 16);
    assert_int_equal(p->kv_budget, 64LL << 20);
    assert_int_equal(d->kv_budget, 2LL << 30);
    assert_int_equal(p->max_batch, 64);
    assert_int_equal(p->prefill_chunk, 512);
    assert_int_equal(p->tracker, CLUSTER_TRACKER_TAGGED);
    assert_int_equal(p->backend, CLUSTER_BACKEND_CPU);
    assert_int_equal(p->tp, 1);
    assert_int_equal(p->threads, 0);
    assert_string_equal(p->backend_options, "");
    assert_string_equal(d->backend_options, "bf16_gemm=split,fused=off");
    assert_int_equal(p->template_, 0);
    assert_string_equal(pd_kvfmt_name(d->kv), "fp8");
    assert_string_equal(pd_wfmt_name(d->weights), "int4");
    cluster_config_destroy(cfg);
    cluster_config_destroy(NULL);
}

static void test_bytes(void **state)
{
    int64_t b = -1;
    (void)state;
    assert_int_equal(cluster_config_parse_bytes("4096", &b), PD_OK);
    assert_int_equal(b, 4096);
    assert_int_equal(cluster_config_parse_bytes("512KiB", &b), PD_OK);
    assert_int_equal(b, 512 << 10);
    assert_int_equal(cluster_config_parse_bytes("3 GiB", &b), PD_OK);
    assert_int_equal(b, 3LL << 30);
    b = 7;
    assert_int_equal(cluster_config_parse_bytes("64MB", &b), PD_ERR_INVALID);
    assert_int_equal(cluster_config_parse_bytes("-1", &b), PD_ERR_INVALID);
    assert_int_equal(cluster_config_parse_bytes("99999999999TiB", &b), PD_ERR_INVALID);
    assert_int_equal(cluster_config_parse_bytes("", &b), PD_ERR_INVALID);
    assert_int_equal(b, 7);
}

/* Replaces the first occurrence of from in good with to and parses; expects an error containing
 * want. */
static void expect_error(const char *from, const char *to, const char *want)
{
    char text[4096], err[512];
    const char *at = strstr(good, from);
    cluster_config_t *cfg = (cluster_config_t *)0x1;

    assert_non_null(at);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good), good, to, at + strlen(from));
    assert_int_equal(
        cluster_config_parse(text, strlen(text), "bad.yaml", NULL, err, sizeof err, &cfg),
        PD_ERR_FORMAT);
    assert_ptr_equal(cfg, (cluster_config_t *)0x1); /* untouched on failure */
    if (!strstr(err, want)) {
        print_error("got: %s\nwant: %s\n", err, want);
        fail();
    }
}

/* tp against the model's heads (tiny-llama: 4 attention heads, 2 KV heads), with the position of
 * the tp key; without a readable config.json (a router's host) only the node checks it */
static void test_tp(void **state)
{
    char text[4096], err[512];
    cluster_config_t *cfg = NULL;
    const char *at = strstr(good, "    kv_budget: 2GiB\n");
    (void)state;
    static const struct {
        const char *model, *tp, *want;
    } cases[] = {
        {"tiny-llama", "2", NULL},
        {"tiny-llama", "4",
         "bad.yaml:15:9: nodes.d0.tp: 4 does not divide the model's 2 KV heads "
         "(num_key_value_heads"},
        {"tiny-llama", "3",
         "bad.yaml:15:9: nodes.d0.tp: 3 does not divide the model's 4 attention "
         "heads"},
        {"no-such-model", "4", NULL},
        {"no-such-model", "16", NULL},
        /* a KvDone carries at most 16 slice checksums */
        {"no-such-model", "17", "bad.yaml:15:9: nodes.d0.tp"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "model: %s/%s\n%.*s    tp: %s\n%s", getenv("PD_MODELS_DIR"),
                 cases[i].model, (int)(at - strchr(good, '\n') - 1), strchr(good, '\n') + 1,
                 cases[i].tp, at);
        cfg = NULL;
        pd_status_t st =
            cluster_config_parse(text, strlen(text), "bad.yaml", NULL, err, sizeof err, &cfg);
        if (!cases[i].want) {
            assert_int_equal(st, PD_OK);
            assert_int_equal(cluster_config_find_node(cfg, "d0")->tp, atoi(cases[i].tp));
            cluster_config_destroy(cfg);
            continue;
        }
        assert_int_equal(st, PD_ERR_FORMAT);
        if (!strstr(err, cases[i].want)) {
            print_error("got: %s\nwant: %s\n", err, cases[i].want);
            fail();
        }
    }
}

/* template: true|false (an entry for nodes that join); anything else names the choices */
static void test_template(void **state)
{
    cluster_config_t *cfg = NULL;
    char err[256], text[1024];
    (void)state;

    snprintf(text, sizeof text, "%s    template: true\n", good);
    assert_int_equal(
        cluster_config_parse(text, strlen(text), "t.yaml", "/base", err, sizeof err, &cfg), PD_OK);
    assert_int_equal(cluster_config_find_node(cfg, "d0")->template_, 1);
    assert_int_equal(cluster_config_find_node(cfg, "p0")->template_, 0);
    cluster_config_destroy(cfg);
    snprintf(text, sizeof text, "%s    template: yes\n", good);
    assert_int_equal(
        cluster_config_parse(text, strlen(text), "t.yaml", "/base", err, sizeof err, &cfg),
        PD_ERR_FORMAT);
    assert_non_null(strstr(err, "nodes.d0.template: unknown value 'yes' (expected false, true)"));
}

static void test_errors(void **state)
{
    (void)state;
    /* unknown value: the value's line and column */
    expect_error("    ucx_port: 50071\n", "    ucx_port: 50071\n    kv: fp16\n",
                 "bad.yaml:15:9: nodes.d0.kv: unknown value 'fp16' (expected bf16, fp8, f32)");
    /* unknown key: the key's position */
    expect_error("    ucx_port: 50071\n", "    ucx_port: 50071\n    kv_format: fp8\n",
                 "bad.yaml:15:5: nodes.d0.kv_format: unknown key");
    expect_error("router:\n", "routr:\n", "bad.yaml:2:1: routr: unknown key");
    expect_error("  http: 127.0.0.1:50051\n", "  http: 127.0.0.1:50051\n  colour: red\n",
                 "bad.yaml:5:3: router.colour: unknown key");
    /* duplicate node names, duplicate endpoints */
    expect_error("name: d0", "name: p0", "bad.yaml:10:11: nodes[1].name: duplicate node name 'p0'");
    expect_error("port: 50070", "port: 50060",
                 "bad.yaml:13:11: nodes.d0.port: duplicate address 127.0.0.1:50060 (also "
                 "nodes.p0.port)");
    expect_error("ucx_port: 50071", "ucx_port: 50051",
                 "bad.yaml:14:15: nodes.d0.ucx_port: duplicate address 127.0.0.1:50051 (also "
                 "router.http)");
    /* required fields */
    expect_error("    host: 127.0.0.1\n    port: 50060\n", "    port: 50060\n",
                 "bad.yaml:6:5: nodes.p0.host: required key is missing");
    expect_error("  listen: 127.0.0.1:50050\n", "", "bad.yaml:3:3: router.listen: required key");
    expect_error("model: models/tiny-llama\n", "", "bad.yaml:1:1: model: required key is missing");
    expect_error("    ucx_port: 50071\n", "",
                 "bad.yaml:10:5: nodes.d0.ucx_port: decode nodes need a ucx_port");
    /* types and ranges */
    expect_error("port: 50060", "port: 0",
                 "bad.yaml:9:11: nodes.p0.port: 0 out of range [1, 65535]");
    expect_error("port: 50060", "port: 5x", "bad.yaml:9:11: nodes.p0.port: '5x' is not an integer");
    expect_error("kv_budget: 2GiB", "kv_budget: 2GB", "bad.yaml:15:16: nodes.d0.kv_budget: '2GB'");
    expect_error("  listen: 127.0.0.1:50050", "  listen: 127.0.0.1",
                 "bad.yaml:3:11: router.listen: '127.0.0.1' is not host:port");
    expect_error("    port: 50060\n", "    port: 50060\n    page_tokens: 24\n",
                 "bad.yaml:10:18: nodes.p0.page_tokens: 24 is not a power of two");
    expect_error("    port: 50060\n", "    port: 50060\n    ucx_port: 50099\n",
                 "bad.yaml:10:15: nodes.p0.ucx_port: only decode nodes listen for ucx");
    expect_error("    port: 50060\n", "    port: 50060\n    port: 50061\n",
                 "bad.yaml:10:5: nodes.p0: duplicate key 'port'");
    expect_error("  - name: p0\n", "  - name: p 0\n", "bad.yaml:6:11: nodes[0].name: 'p 0'");
    expect_error("role: decode", "role: both",
                 "bad.yaml:11:11: nodes.d0.role: unknown value 'both' (expected prefill, decode)");
    expect_error("    host: 127.0.0.1\n    port: 50060\n",
                 "    host: [127.0.0.1]\n    port: 50060\n",
                 "bad.yaml:8:11: nodes.p0.host: expected a scalar, found a list");
    /* only decode nodes */
    expect_error("role: prefill", "role: decode\n    ucx_port: 50069",
                 "nodes: need at least one prefill and one decode node");
    /* yaml syntax */
    expect_error("router:\n", "router: [\n", "bad.yaml:");
    expect_error("router:\n  listen", "router:\n    listen:\n  x", "bad.yaml:");
}

static void test_empty(void **state)
{
    cluster_config_t *cfg = NULL;
    char err[256];
    (void)state;
    assert_int_equal(cluster_config_parse("", 0, NULL, NULL, err, sizeof err, &cfg), PD_ERR_FORMAT);
    assert_string_equal(err, "<config>:1:1: empty document");
    assert_int_equal(cluster_config_parse("- 1\n", 4, "l.yaml", NULL, err, sizeof err, &cfg),
                     PD_ERR_FORMAT);
    assert_string_equal(err, "l.yaml:1:1: (top level): expected a mapping, found a list");
    assert_null(cfg);
}

/* Runs fn with stderr captured into buf. */
static pd_status_t with_stderr(char *buf, size_t len, pd_status_t (*fn)(void *), void *arg)
{
    FILE *tmp = tmpfile();
    int saved = dup(2);
    pd_status_t st;
    size_t got;

    assert_non_null(tmp);
    fflush(stderr);
    dup2(fileno(tmp), 2);
    st = fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    got = fread(buf, 1, len - 1, tmp);
    buf[got] = 0;
    fclose(tmp);
    return st;
}

struct ov {
    cluster_config_t *cfg;
    const char *node, *key, *value;
};

static pd_status_t run_override(void *arg)
{
    struct ov *o = arg;
    return cluster_config_override(o->cfg, o->node, o->key, o->value);
}

static void test_override(void **state)
{
    cluster_config_t *cfg = NULL;
    char log[2048];
    (void)state;

    assert_int_equal(cluster_config_parse(good, strlen(good), "t.yaml", NULL, NULL, 0, &cfg),
                     PD_OK);
    assert_int_equal(cluster_config_override(cfg, "d0", "kv", "bf16"), PD_OK);
    assert_int_equal(cluster_config_find_node(cfg, "d0")->kv, PD_KV_BF16);
    assert_int_equal(cluster_config_override(cfg, "p0", "kv_budget", "1GiB"), PD_OK);
    assert_int_equal(cluster_config_find_node(cfg, "p0")->kv_budget, 1LL << 30);
    assert_int_equal(cluster_config_override(cfg, NULL, "router.prefill_policy", "least_load"),
                     PD_OK);
    assert_int_equal(cfg->router.prefill_policy, CLUSTER_PREFILL_LEAST_LOAD);
    assert_int_equal(cluster_config_override(cfg, NULL, "transport.ucx_tls", "tcp,self"), PD_OK);
    assert_string_equal(cfg->transport.ucx_tls, "tcp,self");

    struct ov o = {cfg, "d0", "kv", "fp16"};
    assert_int_equal(with_stderr(log, sizeof log, run_override, &o), PD_ERR_INVALID);
    assert_non_null(
        strstr(log, "--set nodes.d0.kv: unknown value 'fp16' (expected bf16, fp8, f32)"));
    assert_int_equal(cluster_config_find_node(cfg, "d0")->kv, PD_KV_BF16); /* unchanged */

    o = (struct ov){cfg, "d0", "port", "50060"}; /* collides with p0 */
    assert_int_equal(with_stderr(log, sizeof log, run_override, &o), PD_ERR_INVALID);
    assert_non_null(strstr(log, "nodes.d0.port: duplicate address 127.0.0.1:50060"));
    assert_int_equal(cluster_config_find_node(cfg, "d0")->port, 50070);

    o = (struct ov){cfg, NULL, "router.http", "127.0.0.1:50070"};
    assert_int_equal(with_stderr(log, sizeof log, run_override, &o), PD_ERR_INVALID);
    assert_int_equal(cfg->router.http_port, 50051);

    o = (struct ov){cfg, "nope", "kv", "fp8"};
    assert_int_equal(with_stderr(log, sizeof log, run_override, &o), PD_ERR_NOT_FOUND);
    o = (struct ov){cfg, "p0", "colour", "red"};
    assert_int_equal(with_stderr(log, sizeof log, run_override, &o), PD_ERR_INVALID);
    assert_non_null(strstr(log, "--set nodes.p0.colour: unknown key"));
    o = (struct ov){cfg, "p0", "role", "decode"};
    assert_int_equal(with_stderr(log, sizeof log, run_override, &o), PD_ERR_INVALID);
    o = (struct ov){cfg, NULL, "router.nope", "1"};
    assert_int_equal(with_stderr(log, sizeof log, run_override, &o), PD_ERR_INVALID);

    /* network limits */
    assert_int_equal(cluster_config_override(cfg, NULL, "router.idle_timeout_ms", "500"), PD_OK);
    assert_int_equal(cluster_config_override(cfg, NULL, "router.header_timeout_ms", "400"), PD_OK);
    assert_int_equal(cluster_config_override(cfg, NULL, "router.body_timeout_ms", "300"), PD_OK);
    assert_int_equal(cluster_config_override(cfg, NULL, "router.max_connections", "64"), PD_OK);
    assert_int_equal(cluster_config_override(cfg, NULL, "router.max_streams", "8"), PD_OK);
    assert_int_equal(cfg->router.idle_timeout_ms, 500);
    assert_int_equal(cfg->router.header_timeout_ms, 400);
    assert_int_equal(cfg->router.body_timeout_ms, 300);
    assert_int_equal(cfg->router.max_connections, 64);
    assert_int_equal(cfg->router.max_streams, 8);
    o = (struct ov){cfg, NULL, "router.max_connections", "0"};
    assert_int_equal(with_stderr(log, sizeof log, run_override, &o), PD_ERR_INVALID);
    assert_int_equal(cfg->router.max_connections, 64);
    o = (struct ov){cfg, NULL, "router.idle_timeout_ms", "-1"};
    assert_int_equal(with_stderr(log, sizeof log, run_override, &o), PD_ERR_INVALID);
    cluster_config_destroy(cfg);
}

static void check_model_dir(const cluster_config_t *cfg)
{
    char path[CLUSTER_PATH_MAX + 32];
    struct stat st;
    snprintf(path, sizeof path, "%s/config.json", cfg->model);
    assert_int_equal(stat(path, &st), 0);
}

static void test_deploy_files(void **state)
{
    const char *src = getenv("PD_SOURCE_DIR");
    char path[1024];
    cluster_config_t *cfg = NULL;
    (void)state;

    assert_non_null(src);
    snprintf(path, sizeof path, "%s/deploy/local.yaml", src);
    assert_int_equal(cluster_config_load(path, &cfg), PD_OK);
    assert_int_equal(cfg->n_nodes, 2);
    assert_int_equal(cluster_config_find_node(cfg, "decode0")->kv, PD_KV_FP8);
    assert_int_equal(cluster_config_find_node(cfg, "prefill0")->weights, PD_WFMT_FP8);
    check_model_dir(cfg);
    cluster_config_destroy(cfg);

    snprintf(path, sizeof path, "%s/deploy/local-2p2d.yaml", src);
    assert_int_equal(cluster_config_load(path, &cfg), PD_OK);
    assert_int_equal(cfg->n_nodes, 4);
    assert_int_equal(cfg->router.prefill_policy, CLUSTER_PREFILL_LEAST_LOAD);
    for (size_t i = 0; i < cfg->n_nodes; i++) {
        const cluster_node_t *n = &cfg->nodes[i];
        assert_true(n->port >= 50050 && n->port <= 50099);
        assert_true(n->role == CLUSTER_ROLE_PREFILL ? n->weights == PD_WFMT_FP8
                                                    : n->weights == PD_WFMT_INT4);
    }
    check_model_dir(cfg);
    cluster_config_destroy(cfg);
}

static pd_status_t run_load_missing(void *arg)
{
    cluster_config_t *cfg = NULL;
    pd_status_t st = cluster_config_load(arg, &cfg);
    assert_null(cfg);
    return st;
}

static void test_load_errors(void **state)
{
    char log[2048], path[] = "/tmp/pd_cluster_config_XXXXXX";
    const char *bad = "model: m\nrouter:\n  listen: 127.0.0.1:1\n  http: 127.0.0.1:2\n"
                      "nodes:\n  - name: a\n    role: prefill\n    host: h\n    port: 3\n"
                      "    weights: int8\n";
    int fd;
    (void)state;

    assert_int_equal(with_stderr(log, sizeof log, run_load_missing, "/nonexistent/x.yaml"),
                     PD_ERR_IO);
    assert_non_null(strstr(log, "/nonexistent/x.yaml: cannot open cluster config"));
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, bad, strlen(bad)), (ssize_t)strlen(bad));
    close(fd);
    assert_int_equal(with_stderr(log, sizeof log, run_load_missing, path), PD_ERR_FORMAT);
    char want[256];
    snprintf(want, sizeof want,
             "%s:10:14: nodes.a.weights: unknown value 'int8' (expected bf16, fp8, int4, f32, "
             "fp8-block)",
             path);
    if (!strstr(log, want)) {
        print_error("got: %s\nwant: %s\n", log, want);
        fail();
    }
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),     cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_tp),           cmocka_unit_test(test_errors),
        cmocka_unit_test(test_empty),        cmocka_unit_test(test_override),
        cmocka_unit_test(test_deploy_files), cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
