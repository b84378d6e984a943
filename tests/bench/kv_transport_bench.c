/* kv_transport_bench: put throughput of the UCX transport between two processes on 127.0.0.1.
 *
 *   kv_transport_bench [--mode tcp|shm|both] [--size BYTES] [--total-mb MB] [--window N]
 *
 * The target is this executable re-run with "--target FD": it registers a 64 MiB region and
 * sends "port, packed key" over FD. The source keeps WINDOW puts of SIZE bytes in flight,
 * cycling through the region, until TOTAL bytes are written, then flushes; the figure is bytes
 * over the time from the first put to the flush completion (MB = 10^6 bytes).
 * Modes: tcp (UCX_TLS=tcp,self) and shm (UCX_TLS=posix,sysv,cma,self,tcp, or $PD_BENCH_SHM_TLS,
 * without peer error handling, which is what lets UCX 1.13 pick cma for RMA; tcp is there for
 * the sockaddr connection). shm runs are bimodal on a loaded 2-core machine: ~1.1 GB/s, or
 * 60-120 MB/s with the source spinning in ucp_worker_arm() (BUSY, read() on its event fds). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_transport.h"
#include "clock.h"
#include "log.h"

#define REGION (64u << 20)

static void on_ctrl(uv_poll_t *h, int status, int events)
{
    char c;
    (void)status;
    (void)events;
    if (read(*(int *)h->data, &c, 1) <= 0)
        uv_stop(h->loop); /* the transport's handles would keep the loop running */
}

static int target_main(int fd)
{
    uv_loop_t loop;
    uv_poll_t ctrl;
    kv_transport_t *t;
    kv_transport_mem_t *mem;
    void *key;
    size_t key_len;
    int port;
    kv_transport_params_t p = {.name = "target",
                               .no_peer_errors = getenv("PD_KV_NO_PEER_ERRORS") != NULL};
    uint8_t *region =
        mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uv_loop_init(&loop);
    if (region == MAP_FAILED || kv_transport_ucx_create(&loop, &p, &t) != PD_OK ||
        kv_transport_listen(t, "127.0.0.1", 0, &port) != PD_OK ||
        kv_transport_mem_register(t, region, REGION, &mem) != PD_OK ||
        kv_transport_mem_pack(mem, &key, &key_len) != PD_OK)
        return 1;
    uint32_t hdr[2] = {(uint32_t)port, (uint32_t)key_len};
    if (write(fd, hdr, sizeof hdr) != sizeof hdr || write(fd, key, key_len) != (ssize_t)key_len)
        return 1;
    free(key);
    uv_poll_init(&loop, &ctrl, fd);
    ctrl.data = &fd;
    uv_poll_start(&ctrl, UV_READABLE | UV_DISCONNECT, on_ctrl);
    uv_run(&loop, UV_RUN_DEFAULT); /* until the source closes fd */
    uv_poll_stop(&ctrl);
    uv_close((uv_handle_t *)&ctrl, NULL);
    kv_transport_mem_deregister(mem);
    kv_transport_destroy(t);
    uv_run(&loop, UV_RUN_DEFAULT);
    return uv_loop_close(&loop) == 0 ? 0 : 2;
}

typedef struct {
    kv_transport_ep_t *ep;
    kv_transport_rkey_t *r;
    const uint8_t *buf;
    size_t size;
    uint64_t posted, completed, total, errors;
    int flushed;
    pd_status_t flush_st;
} bench_t;

static void on_flush(void *arg, pd_status_t st)
{
    bench_t *b = arg;
    b->flushed = 1;
    b->flush_st = st;
}

static void post_one(bench_t *b);

static void on_put(void *arg, pd_status_t st)
{
    bench_t *b = arg;
    b->completed++;
    b->errors += st != PD_OK;
    if (b->posted < b->total)
        post_one(b);
    else if (b->completed == b->total && kv_transport_flush(b->ep, on_flush, b) != PD_OK)
        b->flushed = -1;
}

static void post_one(bench_t *b)
{
    uint64_t off = (b->posted * b->size) % (REGION - REGION % b->size);
    b->posted++;
    if (kv_transport_put(b->ep, b->buf, b->size, kv_transport_rkey_base(b->r) + off, b->r,
                         on_put, b) != PD_OK) {
        b->errors++;
        b->completed++;
    }
}

static int run_mode(const char *exe, const char *mode, size_t size, uint64_t total_bytes,
                    int window)
{
    int shm = strcmp(mode, "shm") == 0, sv[2], port, rc = 1;
    const char *shm_tls = getenv("PD_BENCH_SHM_TLS");
    setenv("UCX_TLS", shm ? (shm_tls ? shm_tls : "posix,sysv,cma,self,tcp") : "tcp,self", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    if (shm)
        setenv("PD_KV_NO_PEER_ERRORS", "1", 1);
    else
        unsetenv("PD_KV_NO_PEER_ERRORS");
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        char arg[16];
        close(sv[0]);
        snprintf(arg, sizeof arg, "%d", sv[1]);
        execl(exe, exe, "--target", arg, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    uint32_t hdr[2];
    if (read(sv[0], hdr, sizeof hdr) != sizeof hdr)
        return 1;
    port = (int)hdr[0];
    void *key = malloc(hdr[1]);
    if (read(sv[0], key, hdr[1]) != (ssize_t)hdr[1])
        return 1;

    uv_loop_t loop;
    kv_transport_t *t;
    kv_transport_params_t p = {.name = "source", .no_peer_errors = shm};
    bench_t b = {.size = size, .total = total_bytes / size};
    uint8_t *buf = malloc(size);
    memset(buf, 0x5a, size);
    b.buf = buf;
    uv_loop_init(&loop);
    if (kv_transport_ucx_create(&loop, &p, &t) != PD_OK ||
        kv_transport_connect(t, "127.0.0.1", port, &b.ep) != PD_OK ||
        kv_transport_rkey_unpack(b.ep, key, hdr[1], &b.r) != PD_OK)
        goto out;
    /* Warm-up: connection wireup and registration caches. */
    bench_t w = b;
    w.total = 64;
    for (int i = 0; i < window && w.posted < w.total; i++)
        post_one(&w);
    while (!w.flushed)
        uv_run(&loop, UV_RUN_ONCE);
    double t0 = pd_clock_s();
    for (int i = 0; i < window && b.posted < b.total; i++)
        post_one(&b);
    while (!b.flushed)
        uv_run(&loop, UV_RUN_ONCE);
    double dt = pd_clock_s() - t0;
    printf("%-3s  %6zu B puts  window %3d  %8.1f MiB in %6.3f s  %9.1f MB/s  %7.0f puts/s  "
           "errors %llu  flush %s\n",
           mode, size, window, (double)(b.total * size) / (1 << 20), dt,
           (double)(b.total * size) / dt / 1e6, (double)b.total / dt,
           (unsigned long long)b.errors, pd_status_name(b.flush_st));
    fflush(stdout);
    rc = b.errors || b.flush_st != PD_OK;
out:
    kv_transport_ep_close(b.ep);
    kv_transport_destroy(t);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    close(sv[0]);
    int status;
    waitpid(pid, &status, 0);
    free(key);
    free(buf);
    return rc;
}

int main(int argc, char **argv)
{
    const char *mode = "both";
    size_t size = 64 * 1024;
    uint64_t total_mb = 1024;
    int window = 64;
    if (argc == 3 && strcmp(argv[1], "--target") == 0)
        return target_main(atoi(argv[2]));
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--mode") == 0)
            mode = argv[i + 1];
        else if (strcmp(argv[i], "--size") == 0)
            size = strtoull(argv[i + 1], NULL, 0);
        else if (strcmp(argv[i], "--total-mb") == 0)
            total_mb = strtoull(argv[i + 1], NULL, 0);
        else if (strcmp(argv[i], "--window") == 0)
            window = atoi(argv[i + 1]);
    }
    if (size == 0 || size > REGION || window <= 0) {
        fprintf(stderr, "usage: %s [--mode tcp|shm|both] [--size B] [--total-mb MB] "
                        "[--window N]\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    pd_log_set_level(PD_LOG_WARN);
    char *exe = realpath("/proc/self/exe", NULL);
    int rc = 0;
    if (strcmp(mode, "tcp") == 0 || strcmp(mode, "both") == 0)
        rc |= run_mode(exe, "tcp", size, total_mb << 20, window);
    if (strcmp(mode, "shm") == 0 || strcmp(mode, "both") == 0)
        rc |= run_mode(exe, "shm", size, total_mb << 20, window);
    free(exe);
    return rc;
}
