/* Tests common/transport/kv_path.c (which way KV pages go, for every combination of what the two
 * nodes offer) and the pure part of kv_cuda_ipc.c (the handle blob: well-formed, this host or
 * another, truncated). The CUDA calls themselves run in tests/gpu (two processes on one GPU). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kv_cuda_ipc.h"
#include "kv_cuda_ipc_impl.h"
#include "kv_path.h"

/* Every combination of the seven inputs: the choice follows the rules of kv_path.h. */
static void test_select_all(void **state)
{
    (void)state;
    int seen[KV_PATH_COUNT] = {0};
    for (int bits = 0; bits < 256; bits++) {
        kv_path_offer_t o = {
            .src_gpu = bits & 1,
            .dst_gpu = (bits >> 1) & 1,
            .ipc_offered = (bits >> 2) & 1,
            .ipc_same_host = (bits >> 3) & 1,
            .ipc_opened = (bits >> 4) & 1 ? ((bits >> 7) & 1 ? -1 : 1) : 0,
            .src_ucx_cuda = (bits >> 5) & 1,
            .dst_ucx_cuda = (bits >> 6) & 1,
        };
        const char *why = NULL;
        kv_path_t p = kv_path_select(&o, &why);
        kv_path_t want;
        if (!o.src_gpu && !o.dst_gpu)
            want = KV_PATH_UCX_HOST;
        else if (o.src_gpu && o.dst_gpu && o.ipc_offered && o.ipc_same_host && o.ipc_opened)
            want = KV_PATH_CUDA_IPC;
        else if (o.src_gpu && o.dst_gpu && o.src_ucx_cuda && o.dst_ucx_cuda)
            want = KV_PATH_UCX_CUDA;
        else
            want = KV_PATH_UCX_STAGED;
        if (p != want)
            print_error("bits 0x%02x: %s, want %s\n", bits, kv_path_name(p), kv_path_name(want));
        assert_int_equal(p, want);
        assert_non_null(why);
        assert_true(p == KV_PATH_CUDA_IPC ? why[0] == 0 : why[0] != 0);
        seen[p]++;
    }
    for (int p = 0; p < KV_PATH_COUNT; p++)
        assert_true(seen[p] > 0);
}

static void test_select_reasons(void **state)
{
    (void)state;
    const char *why;
    kv_path_offer_t o = {.src_gpu = 1, .dst_gpu = 1, .ipc_offered = 1, .ipc_same_host = 0};
    assert_int_equal(kv_path_select(&o, &why), KV_PATH_UCX_STAGED);
    assert_non_null(strstr(why, "another host"));
    o.ipc_same_host = 1;
    o.ipc_opened = 0;
    assert_int_equal(kv_path_select(&o, &why), KV_PATH_UCX_STAGED);
    assert_non_null(strstr(why, "did not open"));
    o.src_ucx_cuda = o.dst_ucx_cuda = 1;
    assert_int_equal(kv_path_select(&o, &why), KV_PATH_UCX_CUDA);
    o.dst_gpu = 0;
    assert_int_equal(kv_path_select(&o, &why), KV_PATH_UCX_STAGED);
    assert_non_null(strstr(why, "host memory"));
    assert_string_equal(kv_path_name(KV_PATH_CUDA_IPC), "cuda-ipc");
    assert_string_equal(kv_path_name(KV_PATH_UCX_CUDA), "ucx-cuda");
    assert_string_equal(kv_path_name(KV_PATH_UCX_STAGED), "ucx-staged");
    assert_string_equal(kv_path_name(KV_PATH_UCX_HOST), "ucx-host");
    assert_string_equal(kv_path_name(KV_PATH_COUNT), "unknown");
}

static void blob_here(kv_cuda_ipc__blob_t *b)
{
    memset(b, 0, sizeof *b);
    b->magic = KV_CUDA_IPC__MAGIC;
    b->version = 1;
    assert_int_equal(kv_cuda_ipc__boot_id(b->boot_id), PD_OK);
    b->len = 1 << 20;
}

static void test_blob(void **state)
{
    (void)state;
    kv_cuda_ipc__blob_t b;
    const char *why;
    blob_here(&b);
    assert_true(kv_cuda_ipc_same_host(&b, sizeof b, &why));
    assert_int_equal(kv_cuda_ipc_blob_len(&b, sizeof b), 1 << 20);
    /* another host: another boot id */
    b.boot_id[0] = b.boot_id[0] == '0' ? '1' : '0';
    assert_false(kv_cuda_ipc_same_host(&b, sizeof b, &why));
    assert_non_null(strstr(why, "another host"));
    /* truncated, wrong magic, empty region, unterminated boot id */
    blob_here(&b);
    assert_false(kv_cuda_ipc_same_host(&b, sizeof b - 1, &why));
    assert_int_equal(kv_cuda_ipc_blob_len(&b, sizeof b - 1), 0);
    assert_false(kv_cuda_ipc_same_host(NULL, 0, &why));
    b.magic ^= 1;
    assert_false(kv_cuda_ipc_same_host(&b, sizeof b, &why));
    blob_here(&b);
    b.len = 0;
    assert_false(kv_cuda_ipc_same_host(&b, sizeof b, &why));
    blob_here(&b);
    memset(b.boot_id, 'a', sizeof b.boot_id);
    assert_false(kv_cuda_ipc_same_host(&b, sizeof b, &why));
    /* a malformed blob never reaches the CUDA runtime */
    kv_cuda_ipc_map_t *m = NULL;
    assert_int_equal(kv_cuda_ipc_open(&b, sizeof b, &m), PD_ERR_FORMAT);
    assert_null(m);
}

static void test_built(void **state)
{
    (void)state;
    uint8_t blob[KV_CUDA_IPC_BLOB_BYTES];
    static uint8_t host[4096];
    /* host memory is never exportable: without CUDA unsupported, with CUDA refused by the driver */
    pd_status_t st = kv_cuda_ipc_export(0, host, sizeof host, blob);
    assert_int_equal(st, kv_cuda_ipc_built() ? PD_ERR_CUDA : PD_ERR_UNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_select_all),
        cmocka_unit_test(test_select_reasons),
        cmocka_unit_test(test_blob),
        cmocka_unit_test(test_built),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
