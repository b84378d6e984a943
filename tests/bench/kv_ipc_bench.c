/* kv_ipc_bench: the GPU-direct KV path between two processes (CUDA IPC), as a test and a
 * benchmark, with the copies of the staged path beside it.
 *
 *   kv_ipc_bench [--pool-mb 2048] [--page-kb 1024] [--total-mb 8192] [--seed S] [--json]
 *
 * The reader (decode node's role, this process) cudaMallocs a pool, exports it with
 * kv_cuda_ipc_export and re-runs this executable as the writer ("--writer FD") with the blob on
 * FD. The writer maps it (kv_cuda_ipc_open), fills a source buffer on its GPU with seeded random
 * bytes, and copies pages into the pool in a shuffled page order (as reservations hand them out)
 * with cudaMemcpyAsync, one copy per page; the figure is bytes over the time from the first copy
 * to the stream's end (GB = 10^9 bytes). It then sends the page order and the KV-done checksum of
 * the pages as sent (common/kv/kv_digest.h: page digests computed on the GPU by the kv_digest
 * kernel, chained on the host, as the prefill node does); the reader computes it over its pool's
 * pages in that order the same way, as the decode node does, and checks it: a mismatch fails the
 * run (exit 1). The writer also times the two host copies of the staged path for the same bytes
 * (device -> pinned host, pinned host -> device); the network leg of that path is
 * kv_transport_bench's.
 *
 * Both processes may be on one GPU (an IPC mapping of the same device: a device-to-device copy
 * through the handle) or on two (a peer copy over NVLink/PCIe; CUDA_VISIBLE_DEVICES and
 * --writer-device pick them). Exits 77 (skip) without a CUDA device. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include "kv.h"
#include "kv_digest.h"

#include "clock.h"
#include "kv_cuda_ipc.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "kv_ipc_bench: %s: %s\n", #x, cudaGetErrorString(e_));                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct {
    size_t pool, page, total;
    uint64_t seed;
    int json, writer_device;
} opts_t;

static int full_io(int fd, void *buf, size_t n, int wr)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t k = wr ? write(fd, p, n) : read(fd, p, n);
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double seconds_of(cudaEvent_t a, cudaEvent_t b)
{
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms / 1e3;
}

/* ==== writer (the prefill node's role) ==== */

static int writer_main(int fd, const opts_t *o)
{
    uint8_t blob[KV_CUDA_IPC_BLOB_BYTES];
    kv_cuda_ipc_map_t *m;
    const size_t n_pages = o->pool / o->page, n_src = o->total / o->page;
    uint64_t s = o->seed;
    cudaStream_t st;
    cudaEvent_t e0, e1, e2, e3, e4;

    CK(cudaSetDevice(o->writer_device));
    if (full_io(fd, blob, sizeof blob, 0) != 0)
        return 1;
    if (kv_cuda_ipc_open(blob, sizeof blob, &m) != PD_OK)
        return 1;
    uint8_t *dst = kv_cuda_ipc_base(m), *src, *pinned;
    /* the source: at most as many distinct pages as the pool holds, reused cyclically */
    size_t src_pages = n_src < n_pages ? n_src : n_pages;
    uint8_t *host = malloc(src_pages * o->page);
    int32_t *order = malloc(n_src * sizeof *order);
    if (!host || !order)
        return 1;
    for (size_t i = 0; i < src_pages * o->page / 8; i++)
        ((uint64_t *)host)[i] = splitmix(&s);
    for (size_t i = 0; i < n_src; i++) /* a shuffled page order, as a pool hands pages out */
        order[i] = (int32_t)(i % n_pages);
    for (size_t i = n_src - 1; i > 0 && n_src <= n_pages; i--) {
        size_t k = splitmix(&s) % (i + 1);
        int32_t t = order[i];
        order[i] = order[k];
        order[k] = t;
    }
    CK(cudaMalloc((void **)&src, src_pages * o->page));
    CK(cudaMallocHost((void **)&pinned, src_pages * o->page));
    CK(cudaMemcpy(src, host, src_pages * o->page, cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    CK(cudaEventCreate(&e3));
    CK(cudaEventCreate(&e4));
    /* warm-up (lazy peer enable, first-touch) then the timed pass */
    CK(cudaMemcpyAsync(dst, src, o->page, cudaMemcpyDeviceToDevice, st));
    CK(cudaStreamSynchronize(st));
    CK(cudaEventRecord(e0, st));
    for (size_t i = 0; i < n_src; i++)
        CK(cudaMemcpyAsync(dst + (size_t)order[i] * o->page, src + (i % src_pages) * o->page,
                           o->page, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(e1, st));
    /* the staged path's host copies of the same bytes, in one large copy each (its best case) */
    for (size_t done = 0; done < o->total; done += src_pages * o->page) {
        size_t b = o->total - done < src_pages * o->page ? o->total - done : src_pages * o->page;
        CK(cudaMemcpyAsync(pinned, src, b, cudaMemcpyDeviceToHost, st));
    }
    CK(cudaEventRecord(e2, st));
    for (size_t done = 0; done < o->total; done += src_pages * o->page) {
        size_t b = o->total - done < src_pages * o->page ? o->total - done : src_pages * o->page;
        CK(cudaMemcpyAsync(src, pinned, b, cudaMemcpyHostToDevice, st));
    }
    CK(cudaEventRecord(e3, st));
    /* the checksum as the prefill node computes it: page digests on the GPU, 8 bytes a page to
     * the host, chained there (node_pages_checksum_be) */
    CK(cudaStreamSynchronize(st)); /* the staged copies above are not part of it */
    double t_ck = pd_clock_s();
    size_t last = n_src < n_pages ? n_src : n_pages; /* pages whose final content is checked */
    int32_t *ids = malloc(last * sizeof *ids), *d_ids = NULL;
    uint64_t *dg = malloc(last * sizeof *dg), *d_dg = NULL;
    if (!ids || !dg)
        return 1;
    for (size_t i = n_src - last; i < n_src; i++)
        ids[i - (n_src - last)] = (int32_t)(i % src_pages);
    CK(cudaMalloc((void **)&d_ids, last * sizeof *d_ids));
    CK(cudaMalloc((void **)&d_dg, last * sizeof *d_dg));
    CK(cudaMemcpyAsync(d_ids, ids, last * sizeof *ids, cudaMemcpyHostToDevice, st));
    if (kv_digest(d_dg, src, o->page, d_ids, (int)last, st) != PD_OK)
        return 1;
    CK(cudaMemcpyAsync(dg, d_dg, last * sizeof *dg, cudaMemcpyDeviceToHost, st));
    CK(cudaEventRecord(e4, st));
    CK(cudaStreamSynchronize(st));
    uint64_t sum = kv_digest_chain(0, dg, (int)last);
    free(ids);
    free(dg);
    CK(cudaFree(d_ids));
    CK(cudaFree(d_dg));
    double ck_s = pd_clock_s() - t_ck;
    double ipc_s = seconds_of(e0, e1), d2h_s = seconds_of(e1, e2), h2d_s = seconds_of(e2, e3);
    /* to the reader: how many pages to check, their order, the chain */
    uint64_t hdr[2] = {last, sum};
    if (full_io(fd, hdr, sizeof hdr, 1) ||
        full_io(fd, order + (n_src - last), last * sizeof *order, 1))
        return 1;
    char ok = 0;
    if (full_io(fd, &ok, 1, 0) != 0)
        return 1;
    double gb = (double)o->total / 1e9;
    if (o->json)
        printf("{\"path\":\"cuda-ipc\",\"what\":\"%s\",\"page_bytes\":%zu,\"bytes\":%zu,"
               "\"ipc_gbs\":%.2f,\"staged_d2h_gbs\":%.2f,\"staged_h2d_gbs\":%.2f,"
               "\"checksum_ms\":%.2f,\"checksum_bytes\":%zu,\"verified\":%s}\n",
               kv_cuda_ipc_describe(m), o->page, o->total, gb / ipc_s, gb / d2h_s, gb / h2d_s,
               ck_s * 1e3, last * o->page, ok ? "true" : "false");
    else
        printf("kv_ipc_bench: %s, %zu-byte pages, %.2f GB: cuda ipc %.1f GB/s; staged copies "
               "d2h %.1f GB/s, h2d %.1f GB/s; checksum of %zu pages %.1f ms; reader check %s\n",
               kv_cuda_ipc_describe(m), o->page, gb, gb / ipc_s, gb / d2h_s, gb / h2d_s, last,
               ck_s * 1e3, ok ? "ok" : "MISMATCH");
    fflush(stdout);
    kv_cuda_ipc_close(m);
    return ok ? 0 : 1;
}

/* ==== reader (the decode node's role) ==== */

int main(int argc, char **argv)
{
    opts_t o = {2048ull << 20, 1024ull << 10, 8192ull << 20, 1, 0, 0};
    int writer_fd = -1, n_dev = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "0";
        if (strcmp(a, "--json") == 0) {
            o.json = 1;
            continue;
        }
        i++;
        if (strcmp(a, "--pool-mb") == 0)
            o.pool = strtoull(v, NULL, 10) << 20;
        else if (strcmp(a, "--page-kb") == 0)
            o.page = strtoull(v, NULL, 10) << 10;
        else if (strcmp(a, "--total-mb") == 0)
            o.total = strtoull(v, NULL, 10) << 20;
        else if (strcmp(a, "--seed") == 0)
            o.seed = strtoull(v, NULL, 10);
        else if (strcmp(a, "--writer-device") == 0)
            o.writer_device = atoi(v);
        else if (strcmp(a, "--writer") == 0)
            writer_fd = atoi(v);
        else {
            fprintf(stderr, "usage: kv_ipc_bench [--pool-mb N] [--page-kb N] [--total-mb N] "
                            "[--seed S] [--writer-device D] [--json]\n");
            return 2;
        }
    }
    if (o.page == 0 || o.pool < o.page || o.total < o.page) {
        fprintf(stderr, "kv_ipc_bench: need page <= pool and page <= total\n");
        return 2;
    }
    if (writer_fd >= 0)
        return writer_main(writer_fd, &o);
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "kv_ipc_bench: no CUDA device: skipped\n");
        return 77;
    }
    fprintf(stderr, "kv_ipc_bench: seed %" PRIu64 "\n", o.seed);
    /* the writer is a fresh process (exec), so the fork happens before its CUDA use */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 1;
    uint8_t *pool;
    uint8_t blob[KV_CUDA_IPC_BLOB_BYTES];
    CK(cudaSetDevice(0));
    CK(cudaMalloc((void **)&pool, o.pool));
    CK(cudaMemset(pool, 0, o.pool));
    if (kv_cuda_ipc_export(0, pool, o.pool, blob) != PD_OK)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        char fd[16], *exe = realpath("/proc/self/exe", NULL);
        char sz[3][32], dev[16], seed[32];
        close(sv[0]);
        snprintf(fd, sizeof fd, "%d", sv[1]);
        snprintf(sz[0], sizeof sz[0], "%zu", o.pool >> 20);
        snprintf(sz[1], sizeof sz[1], "%zu", o.page >> 10);
        snprintf(sz[2], sizeof sz[2], "%zu", o.total >> 20);
        snprintf(dev, sizeof dev, "%d", o.writer_device);
        snprintf(seed, sizeof seed, "%" PRIu64, o.seed);
        execl(exe, exe, "--writer", fd, "--pool-mb", sz[0], "--page-kb", sz[1], "--total-mb", sz[2],
              "--writer-device", dev, "--seed", seed, o.json ? "--json" : NULL, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    uint64_t hdr[2];
    int rc = 1;
    if (full_io(sv[0], blob, sizeof blob, 1) == 0 && full_io(sv[0], hdr, sizeof hdr, 0) == 0) {
        int32_t *order = malloc(hdr[0] * sizeof *order), *d_order = NULL;
        uint64_t *dg = malloc(hdr[0] * sizeof *dg), *d_dg = NULL;
        uint64_t sum = 0;
        if (order && dg && full_io(sv[0], order, hdr[0] * sizeof *order, 0) == 0) {
            CK(cudaMalloc((void **)&d_order, hdr[0] * sizeof *d_order));
            CK(cudaMalloc((void **)&d_dg, hdr[0] * sizeof *d_dg));
            CK(cudaMemcpy(d_order, order, hdr[0] * sizeof *order, cudaMemcpyHostToDevice));
            if (kv_digest(d_dg, pool, o.page, d_order, (int)hdr[0], 0) != PD_OK)
                return 1;
            CK(cudaMemcpy(dg, d_dg, hdr[0] * sizeof *dg, cudaMemcpyDeviceToHost));
            sum = kv_digest_chain(0, dg, (int)hdr[0]);
            char ok = sum == hdr[1];
            if (!ok)
                fprintf(stderr,
                        "kv_ipc_bench: reader checksum %016" PRIx64 " != writer's %016" PRIx64 "\n",
                        sum, hdr[1]);
            rc = full_io(sv[0], &ok, 1, 1) == 0 && ok ? 0 : 1;
        }
        free(order);
        free(dg);
        cudaFree(d_order);
        cudaFree(d_dg);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        rc = 1;
    cudaFree(pool);
    return rc;
}
