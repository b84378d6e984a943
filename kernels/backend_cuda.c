/* The CUDA backend: the ops table of common/backend.h on one GPU and one stream, built from the
 * launchers in kernels/. Memory is cudaMalloc'd; ops are enqueued on the stream and `sync` waits
 * for them. Ops return void in the table, so the first failure of a launch is kept (sticky) and
 * returned by the next `sync` (and logged where it happened). Scratch (activation copies for the
 * matmuls, attention split partials, INT4 dequantization, MoE rows, index uploads) is owned here
 * and grows on demand; growing it waits for the stream. One thread uses a backend.
 *
 * Options (set_option; backend_cuda.h lists them): bf16_gemm = one | split (BF16 and dequantized
 * INT4 GEMMs: one bf16 GEMM on bf16(x), or two on the hi + lo split for near-f32 accuracy),
 * flash = on | off, flash_variant = auto | 0..5, fused = on | off (add_rmsnorm / silu_mul_fp8 /
 * matmul_fp8 in the table), pdl = on | off (programmatic dependent launch of the decode-path
 * step, kernels/kutil.cuh; sm_90+). The environment (PD_CUDA_BF16_GEMM, PD_CUDA_FLASH,
 * PD_CUDA_FUSED, PD_CUDA_PDL, read at creation; PD_CUDA_FLASH_VARIANT, read per launch) overrides
 * them, for benchmarks.
 *
 * Graphs (graph_begin / graph_end / graph_launch): the stream is captured in thread-local mode
 * into a CUDA graph and instantiated. Scratch may not grow during a capture (that would need a
 * sync): the first failure is kept and graph_end reports it. Every scratch reallocation bumps
 * scratch_epoch; a graph captured under an older epoch refers to freed scratch, so graph_launch
 * refuses it with PD_AGAIN.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "attention_flash.h"
#include "backend_cuda.h"
#include "backend.h"
#include "family.h"
#include "elementwise.h"
#include "kv.h"
#include "log.h"
#include "matmul.h"
#include "moe.h"
#include "logits.h"
#include "sample.h"

/* n at or below which a matmul runs as GEMV (one pass over W) instead of a GEMM. INT4 runs on
 * the tensor-core kernels when the weight is tiled (n % 32 == 0: every Llama shape): the slice
 * GEMV matmul_w4gemv at n <= CUDA_XGEMV_MAX_N_INT4 (below; session 5), else the
 * weight-streaming GEMV with the activation quantization inside (matmul_wgemv; its K splits are
 * thread-block clusters: compute capability 9.0 and later only) at n <= CUDA_WGEMV_MAX_N, the GEMM
 * (matmul_int4_mma) up to MATMUL_INT4_MMA_MAX_N (untiled: above CUDA_GEMV_MAX_N_INT4); above
 * MATMUL_INT4_MMA_MAX_N (prefill) it is dequantized to bf16 for cuBLAS. matmul_wgemv (mma on q - z,
 * group scales in f32, K splits summed in one cluster since session 4) measured faster than
 * quantization + matmul_int4_mma at n 1..2 for K <= 8192, tied at n 4..8, and slower on the tall-K
 * down projection (4096 x 14336: 26.7 vs 24.4 us at n 1), where the GEMM's K splits through scratch
 * beat the cluster (docs/performance.md, 2026-12-01 session 4).
 */
#define CUDA_GEMV_MAX_N 8
#define CUDA_GEMV_MAX_N_INT4 8
/* INT4 (tiled) at or below this n runs on the slice GEMV matmul_w4gemv (no cluster, no scratch)
 * where its plan fits in shared memory. Measured 2026-12-01 session 5 (docs/performance.md, same
 * run, clean L2): faster than the session-4 routing (cluster wgemv / quantization + int4_mma) at
 * n 1..2 on every Llama-3-8B shape (down 17.1 vs 25.0 us, o 9.7 vs 13.2, qkv 12.4 vs 14.8,
 * gate_up 27.0 vs 26.2), about even at n 4, slower at n 8 (qkv / o 1.2x): n 5..8 keep the
 * session-4 routing. The FP8 slice GEMV matmul_w8gemv measured slower than the session-4 FP8
 * routing at every shape (gate_up n 1: 57.9 vs 40.9 us, its 64-byte row pieces per load; the f32
 * GEMV reads 256 contiguous bytes of a row per warp load) and runs only with PD_CUDA_XGEMV=all
 * (for measurements); PD_CUDA_XGEMV=0: no slice GEMV at all (the session-4 routing). */
#define CUDA_XGEMV_MAX_N_INT4 4
/* Tiled INT4 from this n up runs on the wgmma GEMM matmul_w4wg (session 10) where usable.
 * Its token tile is 64 wide, so its time barely changes from n 17 to 64, while matmul_int4_mma's
 * grows with n: measured 2026-12-02 session 10 (gpu_bench w4wg, one H200, clean L2) gate_up
 * 28672 x 4096 n 16: int4 mma 37.8 us, w4wg 43.0; n 32: 48.7 vs 43.8; the crossing, linear
 * between them, is near n 25. */
#define CUDA_W4WG_MIN_N 25

/* Default of option pdl (programmatic dependent launch of the decode-path GEMVs, sm_90+). */
#define CUDA_PDL_DEFAULT 1
/* matmul_w4gemv's weights through the bulk-copy ring (matmul_set_w4bulk) on sm_90+: off, since
 * session 13 measured the decode step slower with it (docs/performance.md, s12 round) */
#define CUDA_W4BULK_DEFAULT 0
#define CUDA_XGEMV_MAX_N_FP8 8
/* the largest n the FP8 wgmma GEMM (matmul_w8wg, option PD_CUDA_W8WG) takes: one token tile of
 * 64 re-reads no weights; above it cuBLASLt's larger tiles */
#define CUDA_W8WG_MAX_N 64
/* option w8wg's default (BACKEND_CUDA_W8WG_DEFAULT, backend_cuda.h: from n 17) only for weights
 * of at most this many rows (PD_CUDA_W8WG_ROWS): the shapes where matmul_w8wg beats cuBLASLt
 * (gpu_bench w8wg at n 64, session 22: o and down; it loses on gate_up and the fused q / k / v).
 * Session 24 measured the FP8 batch-64 step 8.58 -> 7.94 ms on an H200 with it
 * (docs/performance.md, s24 round); batch 1 does not use it. */
#define CUDA_W8WG_DEFAULT_ROWS 4096
#define CUDA_WGEMV_MAX_N 2
/* shapes whose W4A8 GEMM plan cuda__blk_plan remembers */
#define CUDA_BLK_PLANS 32
#define CUDA_WGEMV_MAX_K 8192
/* FP8 at or below this n (and K % 64 == 0) runs on the FP8 mma kernel (matmul_fp8_mma) instead of
 * the GEMV / cuBLASLt, except n == 1 with more than CUDA_FP8_GEMV_MIN_ROWS rows, where the f32
 * GEMV measured faster (docs/performance.md, issue 11: 28672 x 4096 n 1: 43 vs 48 us; n 2: 68 vs
 * 48 us). Since session 26 both only with PD_CUDA_FP8_KSPLIT=0 (or a mask without their bits):
 * by default every FP8 matmul at n 1..8 with K % 64 == 0 runs the K-split mma GEMV
 * (matmul_fp8_ksplit, cuda__fp8_ksplit), the attention block's q, k, v as one launch. */
#define CUDA_FP8_MMA_MAX_N 8
#define CUDA_FP8_GEMV_MIN_ROWS 8192
#define CUDA_LT_WS_BYTES ((size_t)32 << 20)
/* With option fp8_accum=fast, FP8 GEMMs (cuBLASLt) of at least this many rows use fast fp8
 * accumulation (prefill sizes, ~10% faster, but outside the FP8 matmul tolerance at K 4096 /
 * 14336: docs/performance.md, session 5); decode batches always keep the exact one */
#define CUDA_FP8_FAST_MIN_N 512
/* attention runs as flash attention (kernels/attention_flash.h, tensor cores) when the batch has
 * at least this many query rows per sequence on average (prefill, chunked prefill); decode-shaped
 * batches keep attention_run */
#define CUDA_FLASH_MIN_ROWS 16
/* the largest GQA group (query heads per KV head) attention_run takes (kernels/attention.cu's
 * ATTENTION__MAX_GROUP); a larger one (GLM-4.5 / 4.5-Air: 96 / 8 = 12) runs as several calls on
 * head subsets of the group (cuda__attention_parts) */
#define CUDA_ATTN_MAX_GROUP 8

typedef struct {
    void *p;
    size_t bytes;
} cuda_buf_t;

typedef struct {
    int device;
    int n_sm;     /* multiprocessors of the device */
    int cc_major; /* its compute capability (major): clusters (matmul_wgemv splits) need 9 */
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *lt_ws;     /* CUDA_LT_WS_BYTES */
    cuda_buf_t act;  /* matmul: quantized / split activations */
    cuda_buf_t wtmp; /* matmul: INT4 weight dequantized to bf16 */
    cuda_buf_t attn; /* attention split partials */
    cuda_buf_t idx;  /* host index arrays uploaded for kv_stamp / kv_check / kv_export */
    cuda_buf_t pin;  /* pinned host staging of kv_check (idle between calls: kv_check syncs) */
    cuda_buf_t moe;  /* MoE rows */
    cuda_buf_t grp;  /* attention with a GQA group above CUDA_ATTN_MAX_GROUP: q / out of a part */
    pd_status_t err; /* first failure since the last sync */
    void *blas_ws;   /* CUDA_LT_WS_BYTES: cuBLAS workspace (fixed, so that captures can use it) */
    bool capturing;  /* between graph_begin and graph_end */
    pd_status_t cap_err;    /* first failure inside the capture */
    uint64_t scratch_epoch; /* bumped whenever a scratch buffer moves */
    bool bf16_split;   /* BF16 GEMMs: hi + lo split of the activations (PD_CUDA_BF16_GEMM=split) */
    bool no_flash;     /* PD_CUDA_FLASH=0: attention_run for every batch */
    int flash_variant; /* flash_variant option: -1 auto, 0..5 (attention_flash.cu) */
    bool no_fused;     /* fused=off: the table without the fused ops (cuda_ops_plain) */
    int xgemv; /* PD_CUDA_XGEMV: 0 no slice GEMVs, 1 INT4 (default), 2 (=all) INT4 and FP8 */
    /* PD_CUDA_INT4_MMA2: 1 tiled INT4 at n 9..256 on matmul_int4_mma2 */
    int int4_mma2;
    /* tiled INT4 at n CUDA_W4WG_MIN_N..MATMUL_W4WG_MAX_N on the wgmma GEMM matmul_w4wg where it
     * is usable (sm_90a build, compute capability 9.0); PD_CUDA_INT4_WG=0: off */
    bool int4_wg;
    /* matmul_w4wg's K splits added inside thread-block clusters (one launch, no scratch) instead
     * of by a second launch over partial sums; option w4wg_cluster, PD_CUDA_W4WG_CLUSTER=0|1
     * (default on: session 22 measured the INT4 batch-64 step 6.43 -> 6.29 ms on an H100) */
    bool w4wg_cluster;
    /* FP8 at n w8wg_min_n..CUDA_W8WG_MAX_N on the wgmma + TMA GEMM matmul_w8wg where it is usable
     * (sm_90a build, compute capability 9.0); 0: off; option w8wg, PD_CUDA_W8WG=N (default
     * BACKEND_CUDA_W8WG_DEFAULT) */
    int w8wg_min_n;
    /* PD_CUDA_W8WG_ROWS=R: that route only for weights of at most R rows (default
     * CUDA_W8WG_DEFAULT_ROWS); 0: every weight */
    int64_t w8wg_max_rows;
    /* option fp8_group, PD_CUDA_FP8_GROUP=0|1 (session 22, off until measured): the q, k, v of
     * FP8 weights of one K at the FP8 mma kernel's sizes as one matmul_fp8_mma_group launch */
    bool fp8_group;
    void *sample_scratch; /* sample_run's (SAMPLE_SCRATCH_BYTES, kept zeroed by the kernel) */
    /* act_quant asks the fused ops for the wgmma GEMM's f16 image (PD_CUDA_WG_ACT=0: off) */
    bool wg_act;
    /* PD_CUDA_GEMV_FUSE / option gemv_fuse: matmul_fused for tiled INT4 at the slice GEMV's n:
     * 0 (default: session 14 measured every level slower or no faster, docs/performance.md)
     * off (matmul_fused_ok says no), 1 the norms and residual adds inside the GEMVs, 2 (on)
     * also SiLU·mul in gate_up's epilogue, 3 SiLU·mul in down's prologue instead (every block
     * recomputes its slice's SiLU: session 11 measured that slower) */
    int gemv_fuse;
    bool no_moe_grouped; /* moe_grouped=off: moe_prepare declines, experts grouped on the host */
    unsigned env_set;    /* CUDA__ENV_* bits: options fixed by the environment */
    int pdl; /* option pdl / PD_CUDA_PDL: programmatic dependent launch of the decode GEMVs */
    int fp8_scaled; /* FP8 GEMM with outer-vector scales: 0 untried, 1 works, -1 unsupported */
    /* prefill FP8 GEMMs: candidate (PD_CUDA_LT_ALGO); fast_accum: fast accumulation at
     * n >= CUDA_FP8_FAST_MIN_N (option fp8_accum, PD_CUDA_LT_FAST_ACCUM) */
    matmul_lt_opts_t lt_opts;
    /* PD_CUDA_GU_BF16=0: matmul_silu_fp8 keeps the f32 gate_up product */
    bool no_gu_bf16;
    /* PD_CUDA_QKV_BF16=1: qkv_rope_write's GEMMs write bf16 at prefill sizes (qkv16: q's bf16) */
    bool qkv_bf16;
    cuda_buf_t qkv16;
    /* int4_gemm (PD_CUDA_INT4_GEMM): INT4 GEMMs above the mma kernels' n on the FP8 tensor cores
     * with 1x128 block scales (1, the default since session 8), or dequantized to bf16 (0); a
     * shape cuBLASLt has no VEC128 GEMM for runs bf16 (int4_fp8_told: that was logged once) */
    int int4_fp8;
    bool int4_fp8_told;
    /* whether cuBLASLt has the W4A8 GEMMs of a shape (matmul_gemm_fp8_blk_ok asks its heuristic
     * twice: remembered for the last CUDA_BLK_PLANS shapes, replaced round robin) */
    struct {
        int n;
        int64_t N, K;
        bool bf16, ok;
    } blk_plans[CUDA_BLK_PLANS];
    int n_blk_plans, next_blk_plan;
    /* PD_CUDA_MOE_GMM: 1 moe_gmm, 2 moe_gmm2 (x staged in shared memory), 3 moe_gmm3 (tensor
     * cores; the default since session 8, BF16 weights run moe_gmm2) */
    int moe_gmm;
    cudaStream_t xstream; /* the KV transfer stream (xfer_*), created on first use */
    cudaEvent_t xevent;   /* recorded on stream, waited on by xstream */
    pd_status_t xerr;     /* the transfer stream's first failure since the last xfer_sync */
    int32_t *h_ids;       /* MoE host staging */
    int32_t *h_perm;
    size_t h_cap;
    struct cuda_moe_layer *moe_layers; /* registered MoE layers (moe_prepare) */
    int n_moe_layers, cap_moe_layers;
} cuda_t;

/* One MoE layer registered by moe_prepare: its expert arrays (the key, and a copy of their
 * pointers to notice a stale entry) and the device tables of the grouped matmul. */
typedef struct cuda_moe_layer {
    const pd_weight_t *gate_up, *down;
    int n_experts;
    pd_weight_t *copy; /* (2 * n_experts): gate_up then down, as registered */
    moe_wtab_t *d_tab; /* (2 * n_experts) device: gate_up's then down's */
} cuda_moe_layer_t;

static cuda_t *cuda__get(pd_backend_t *be)
{
    return be->impl;
}

static pd_status_t cuda__status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return PD_OK;
    pd_log_error("backend cuda: %s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? PD_ERR_NOMEM : PD_ERR_CUDA;
}

/* Keeps the first failure for the next sync. */
static void cuda__note(cuda_t *c, pd_status_t st)
{
    if (st != PD_OK && c->capturing && c->cap_err == PD_OK)
        c->cap_err = st;
    else if (st != PD_OK && c->err == PD_OK)
        c->err = st;
}

/* Makes the pinned host staging c->pin hold at least bytes (contents are not kept). */
static pd_status_t cuda__grow_pin(cuda_t *c, size_t bytes)
{
    pd_status_t st;
    if (bytes <= c->pin.bytes)
        return PD_OK;
    bytes = bytes + bytes / 4 + 256;
    if ((st = cuda__status(cudaStreamSynchronize(c->stream), "pinned staging sync")) != PD_OK)
        return st;
    if (c->pin.p)
        cudaFreeHost(c->pin.p);
    c->pin.p = NULL;
    c->pin.bytes = 0;
    if ((st = cuda__status(cudaMallocHost(&c->pin.p, bytes), "pinned staging alloc")) != PD_OK)
        return st;
    c->pin.bytes = bytes;
    return PD_OK;
}

/* Makes b hold at least bytes (contents are not kept). */
static pd_status_t cuda__grow(cuda_t *c, cuda_buf_t *b, size_t bytes)
{
    pd_status_t st;
    if (bytes <= b->bytes)
        return PD_OK;
    if (c->capturing) {
        pd_log_error("backend cuda: scratch growth to %zu bytes inside a graph capture", bytes);
        return PD_ERR_INTERNAL;
    }
    bytes = bytes + bytes / 4 + 256;
    c->scratch_epoch++;
    if ((st = cuda__status(cudaStreamSynchronize(c->stream), "scratch sync")) != PD_OK)
        return st;
    if (b->p)
        cudaFree(b->p);
    b->p = NULL;
    b->bytes = 0;
    if ((st = cuda__status(cudaMalloc(&b->p, bytes), "scratch alloc")) != PD_OK)
        return st;
    b->bytes = bytes;
    return PD_OK;
}

/* ==== memory ==== */

static pd_status_t cuda_alloc(pd_backend_t *be, size_t bytes, void **ptr_p)
{
    void *p = NULL;
    (void)be;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        cudaGetLastError();
        pd_log_error("backend cuda: cannot allocate %zu bytes: %s", bytes, cudaGetErrorString(e));
        return e == cudaErrorMemoryAllocation ? PD_ERR_NOMEM : PD_ERR_CUDA;
    }
    *ptr_p = p;
    return PD_OK;
}

static void cuda_free(pd_backend_t *be, void *ptr)
{
    (void)be;
    if (ptr)
        cudaFree(ptr);
}

static pd_status_t cuda_upload(pd_backend_t *be, void *dst, const void *src_host, size_t bytes)
{
    cuda_t *c = cuda__get(be);
    if (!bytes)
        return PD_OK;
    return cuda__status(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, c->stream),
                        "upload");
}

static pd_status_t cuda_download(pd_backend_t *be, void *dst_host, const void *src, size_t bytes)
{
    cuda_t *c = cuda__get(be);
    pd_status_t st;
    if (!bytes)
        return PD_OK;
    st = cuda__status(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, c->stream),
                      "download");
    if (st == PD_OK)
        st = cuda__status(cudaStreamSynchronize(c->stream), "download sync");
    return st;
}

static pd_status_t cuda_memset(pd_backend_t *be, void *dst, int value, size_t bytes)
{
    cuda_t *c = cuda__get(be);
    if (!bytes)
        return PD_OK;
    return cuda__status(cudaMemsetAsync(dst, value, bytes, c->stream), "memset");
}

static pd_status_t cuda_copy(pd_backend_t *be, void *dst, const void *src, size_t bytes)
{
    cuda_t *c = cuda__get(be);
    if (!bytes)
        return PD_OK;
    return cuda__status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream),
                        "copy");
}

static pd_status_t cuda_sync(pd_backend_t *be)
{
    cuda_t *c = cuda__get(be);
    pd_status_t st = cuda__status(cudaStreamSynchronize(c->stream), "sync");
    if (st == PD_OK)
        st = c->err;
    c->err = PD_OK;
    return st;
}

/* ==== elementwise ==== */

static void cuda_embed(pd_backend_t *be, float *out, const uint16_t *table, const int32_t *ids,
                       int n, int d)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, elementwise_embed(out, table, ids, n, d, c->stream));
}

static void cuda_rmsnorm(pd_backend_t *be, float *out, const float *x, const uint16_t *w, int n,
                         int d, float eps)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, elementwise_rmsnorm(out, x, w, n, d, eps, c->stream));
}

static void cuda_add(pd_backend_t *be, float *x, const float *y, size_t n)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, elementwise_add(x, y, n, c->stream));
}

static void cuda_rope(pd_backend_t *be, float *x, const int32_t *pos, const float *inv_freq, int n,
                      int n_heads, int head_dim)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, elementwise_rope(x, pos, inv_freq, n, n_heads, head_dim, c->stream));
}

static void cuda_silu_mul(pd_backend_t *be, float *out, const float *gu, int n, int f)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, elementwise_silu_mul(out, gu, n, f, c->stream));
}

/* ==== matmul ==== */

/* INT4 weights of this backend with n % 32 == 0 are in the tiled layout (cuda_weight_prepare). */
static bool cuda__int4_tiled(const pd_weight_t *w)
{
    return w->fmt == PD_WFMT_INT4 && w->n % 32 == 0 && w->k % 128 == 0;
}

/* GEMV over rows [0, n) in chunks of MATMUL_GEMV_MAX_N (the fallback for shapes no GEMM takes). */
static pd_status_t cuda__gemv_chunks(cuda_t *c, float *out, const float *x, const float *xs,
                                     const pd_weight_t *w, int n)
{
    pd_status_t st = PD_OK;
    for (int i = 0; i < n && st == PD_OK; i += MATMUL_GEMV_MAX_N) {
        int m = n - i < MATMUL_GEMV_MAX_N ? n - i : MATMUL_GEMV_MAX_N;
        st = matmul_gemv(out + (size_t)i * w->n, x + (size_t)i * w->k, xs ? xs + i : NULL, w, m,
                         cuda__int4_tiled(w), c->stream);
    }
    return st;
}

/* Tiles INT4 weights in place (kernels/matmul.h): the tensor-core kernel then streams each
 * warp's rows as one contiguous run. */
static pd_status_t cuda_weight_prepare(pd_backend_t *be, pd_weight_t *w)
{
    cuda_t *c = cuda__get(be);
    void *tmp = NULL;
    pd_status_t st;
    if (!cuda__int4_tiled(w))
        return PD_OK;
    size_t bytes = quant_data_bytes(w->fmt, w->n, w->k) + quant_scales_bytes(w->fmt, w->n, w->k) +
                   quant_zeros_bytes(w->fmt, w->n, w->k);
    if ((st = cuda__status(cudaMalloc(&tmp, bytes), "weight tiling")) != PD_OK)
        return st;
    st = matmul_int4_tile(w, tmp, c->stream);
    if (st == PD_OK)
        st = cuda__status(cudaStreamSynchronize(c->stream), "weight tiling");
    cudaFree(tmp);
    return st;
}

/* INT4 (tiled) at n <= CUDA_WGEMV_MAX_N: no scratch (K splits are summed inside the kernel). */
static pd_status_t cuda__matmul_wgemv(cuda_t *c, float *out, const float *x, const pd_weight_t *w,
                                      int n)
{
    int warps, splits, depth;
    matmul_wgemv_plan(n, w->n, w->k, c->n_sm, &warps, &splits, &depth);
    return matmul_wgemv(out, x, w, n, warps, splits, depth, c->stream);
}

/* The INT4 mma GEMMs' activations and scratch in c->act: x (n, K) as f16 rows xh with their
 * multipliers mult (matmul_quant_act_f16), then the split-K partial sums part (NULL when splits
 * need none). */
static pd_status_t cuda__int4_mma_act(cuda_t *c, const float *x, const pd_weight_t *w, int n,
                                      int splits, uint16_t **xh, float **mult, float **part)
{
    size_t hb = ((size_t)n * (size_t)w->k * 2 + 255) / 256 * 256,
           mb = ((size_t)n * 4 + 255) / 256 * 256;
    size_t pf = matmul_int4_mma_part_floats(n, w->n, splits);
    pd_status_t st = cuda__grow(c, &c->act, hb + mb + pf * 4);
    if (st != PD_OK)
        return st;
    *xh = c->act.p;
    *mult = (float *)((uint8_t *)c->act.p + hb);
    *part = pf ? (float *)((uint8_t *)c->act.p + hb + mb) : NULL;
    return matmul_quant_act_f16(*xh, *mult, x, n, w->k, c->stream);
}

/* Tiled INT4 at decode sizes on the K-split GEMV (matmul_int4_ksplit): where
 * matmul_int4_ksplit_route's bit for n says so (matmul.h: 1 n 1..2, 8 n 3..4, 4 n 5..8); group:
 * the q, k, v group, which also needs bit 1 */
static bool cuda__int4_ksplit(const pd_weight_t *w, int n, bool group)
{
    const int r = matmul_int4_ksplit_route;
    if (r == 0 || !cuda__int4_tiled(w) || n < 1 || n > MATMUL_INT4_KSPLIT_MAX_N)
        return false;
    const int bit = n <= 2 ? 1 : n <= CUDA_XGEMV_MAX_N_INT4 ? 8 : 4; /* n 1..2, 3..4, 5..8 */
    return (r & bit) != 0 && (!group || (r & 2) != 0);
}

/* backend_cuda.h: act_quant asks the fused ops for the K-split GEMV's f16 rows */
int backend_cuda_ks_act = 0;

/* matmul_int4_ksplit(_group) on x (n, K) f32: its f16 activations (cuda__int4_mma_act, no
 * partial sums) into the act scratch, then the one launch */
static pd_status_t cuda__int4_ksplit_run(cuda_t *c, float *const *outs, const float *x,
                                         const pd_weight_t *const *ws, int count, int n)
{
    uint16_t *xh;
    float *mult, *part;
    pd_status_t st = cuda__int4_mma_act(c, x, ws[0], n, 1, &xh, &mult, &part);
    if (st != PD_OK)
        return st;
    return matmul_int4_ksplit_group(outs, xh, mult, ws, count, n, matmul_int4_ksplit_batch,
                                    c->stream);
}

/* INT4 on the tensor cores: act scratch = xh (n, K) f16, mult (n) f32, partial sums. */
static pd_status_t cuda__matmul_int4_mma(cuda_t *c, float *out, const float *x,
                                         const pd_weight_t *w, int n)
{
    int warps, splits;
    uint16_t *xh;
    float *mult, *part;
    matmul_int4_mma_plan(n, w->n, w->k, c->n_sm, &warps, &splits);
    pd_status_t st = cuda__int4_mma_act(c, x, w, n, splits, &xh, &mult, &part);
    if (st != PD_OK)
        return st;
    return matmul_int4_mma(out, part, xh, mult, w, n, warps, splits, cuda__int4_tiled(w),
                           c->stream);
}

/* Whether cuda__matmul runs w at n on the wgmma GEMM (matmul_w4wg). */
static bool cuda__w4wg_route(const cuda_t *c, const pd_weight_t *w, int n)
{
    return c->int4_wg && cuda__int4_tiled(w) && n >= CUDA_W4WG_MIN_N && n <= MATMUL_W4WG_MAX_N;
}

/* FP8 on the wgmma + TMA GEMM (matmul_w8wg) */
static bool cuda__w8wg_route(const cuda_t *c, const pd_weight_t *w, int n)
{
    return c->w8wg_min_n > 0 && w->fmt == PD_WFMT_FP8 && n >= c->w8wg_min_n &&
           n <= CUDA_W8WG_MAX_N && w->k % 128 == 0 && ((uintptr_t)w->data & 15) == 0 &&
           (c->w8wg_max_rows <= 0 || w->n <= c->w8wg_max_rows);
}

/* x (n, K) f32 quantized per token (matmul_quant_act_fp8) into the act scratch: *xq (n, K) e4m3
 * (256-byte aligned), then *xs (n) f32 */
static pd_status_t cuda__quant_fp8_act(cuda_t *c, const float *x, int n, int64_t K, uint8_t **xq,
                                       float **xs)
{
    const size_t qb = ((size_t)n * (size_t)K + 255) / 256 * 256;
    pd_status_t st = cuda__grow(c, &c->act, qb + (size_t)n * 4);
    if (st != PD_OK)
        return st;
    *xq = c->act.p;
    *xs = (float *)((uint8_t *)c->act.p + qb);
    return matmul_quant_act_fp8(*xq, NULL, *xs, x, n, K, c->stream);
}

/* FP8 at decode sizes on the K-split mma GEMV (matmul_fp8_ksplit): where
 * matmul_fp8_ksplit_route's bits say so (matmul.h) */
static bool cuda__fp8_ksplit(const pd_weight_t *w, int n)
{
    const int r = matmul_fp8_ksplit_route;
    if (r == 0 || w->fmt != PD_WFMT_FP8 || w->k % 64 != 0 || n < 1 ||
        n > MATMUL_FP8_KSPLIT_MAX_N)
        return false;
    return n == 1 ? (r & (w->n <= CUDA_FP8_GEMV_MIN_ROWS ? 1 : 2)) != 0 : (r & 4) != 0;
}

/* matmul_w8wg on activations quantized per token (xq 16-byte aligned), with its plan */
static pd_status_t cuda__matmul_w8wg(cuda_t *c, float *out, const uint8_t *xq, const float *xs,
                                     const pd_weight_t *w, int n)
{
    int mt, splits;
    matmul_w8wg_plan(n, w->n, w->k, c->n_sm, &mt, &splits);
    return matmul_w8wg(out, xq, xs, w, n, mt, splits, c->stream);
}

/* Tiled INT4 on the wgmma GEMM (matmul_w4wg) for count weights of the same K on x (one: the
 * matmul route; more: matmul_group): act scratch = the activation image, mult (n) f32, the
 * partial sums. The plan is the one of a weight of the summed rows. xa != NULL (x unused): the
 * image and multipliers already made by a fused op (act_quant's PD_ACT_F16WG), no
 * matmul_quant_act_f16wg launch. */
static pd_status_t cuda__matmul_w4wg(cuda_t *c, float *const *outs, const float *x,
                                     const pd_act_fp8_t *xa, const pd_weight_t *const *ws,
                                     int count, int n)
{
    int cfg, splits;
    int64_t N = 0;
    bool cluster = c->w4wg_cluster; /* the outputs must be 16-byte aligned for it */
    for (int i = 0; i < count; i++) {
        N += ws[i]->n;
        cluster = cluster && ((uintptr_t)outs[i] & 15) == 0;
    }
    const int64_t K = ws[0]->k;
    matmul_w4wg_plan(n, N, K, c->n_sm, cluster, &cfg, &splits);
    const size_t hb = (matmul_w4wg_act_bytes(n, K) + 255) / 256 * 256,
                 mb = ((size_t)n * 4 + 255) / 256 * 256;
    const size_t pf = cluster ? 0 : matmul_int4_mma_part_floats(n, N, splits);
    pd_status_t st = cuda__grow(c, &c->act, hb + mb + pf * 4);
    if (st != PD_OK)
        return st;
    uint16_t *xw = c->act.p;
    float *mult = (float *)((uint8_t *)c->act.p + hb);
    float *part = pf ? (float *)((uint8_t *)c->act.p + hb + mb) : NULL;
    if (xa) {
        xw = (uint16_t *)xa->q;
        mult = xa->scale;
    } else if ((st = matmul_quant_act_f16wg(xw, mult, x, n, K, c->stream)) != PD_OK) {
        return st;
    }
    return matmul_w4wg_group(outs, part, xw, mult, ws, count, n, cfg, splits, cluster, c->stream);
}

/* Tiled INT4 at n 9..256 on matmul_int4_mma2 (two blocks per SM); scratch as above. */
static pd_status_t cuda__matmul_int4_mma2(cuda_t *c, float *out, const float *x,
                                          const pd_weight_t *w, int n)
{
    int tiles, warps, splits;
    uint16_t *xh;
    float *mult, *part;
    matmul_int4_mma2_plan(n, w->n, w->k, c->n_sm, &tiles, &warps, &splits);
    pd_status_t st = cuda__int4_mma_act(c, x, w, n, splits, &xh, &mult, &part);
    if (st != PD_OK)
        return st;
    return matmul_int4_mma2(out, part, xh, mult, w, n, tiles, warps, splits, c->stream);
}

/* The FP8 GEMM with outer-vector scales (matmul_gemm_fp8_rowwise) at n rows into out (f32, or
 * bf16 when bf16), with fast accumulation where the backend takes it for this n; a cuBLASLt
 * without fast accumulation for these types gets the plain GEMM. PD_ERR_UNSUPPORTED: no
 * outer-vector mode (or no bf16 output) here. */
static pd_status_t cuda__gemm_fp8_rowwise(cuda_t *c, void *out, bool bf16, const uint8_t *xq,
                                          const float *xs, const pd_weight_t *w, int n)
{
    matmul_lt_opts_t o = c->lt_opts;
    o.bf16 = bf16;
    o.fast_accum = c->lt_opts.fast_accum && n >= CUDA_FP8_FAST_MIN_N;
    pd_status_t st = matmul_gemm_fp8_rowwise(c->lt, c->lt_ws, CUDA_LT_WS_BYTES, out, xq, xs,
                                             w->data, w->scales, n, w->n, w->k, &o, c->stream);
    if (st == PD_ERR_UNSUPPORTED && o.fast_accum) {
        o.fast_accum = false;
        st = matmul_gemm_fp8_rowwise(c->lt, c->lt_ws, CUDA_LT_WS_BYTES, out, xq, xs, w->data,
                                     w->scales, n, w->n, w->k, &o, c->stream);
    }
    return st;
}

/* The slice GEMV's plan for w at n (rows 0: not this path). */
static void cuda__xgemv_plan(cuda_t *c, const pd_weight_t *w, int n, int p[4])
{
    p[0] = 0;
    if (cuda__int4_tiled(w) && c->xgemv >= 1 && n <= CUDA_XGEMV_MAX_N_INT4)
        matmul_w4gemv_plan(n, w->n, w->k, c->n_sm, &p[0], &p[1], &p[2], &p[3]);
    else if (w->fmt == PD_WFMT_FP8 && w->k % 64 == 0 && c->xgemv >= 2 && n <= CUDA_XGEMV_MAX_N_FP8)
        matmul_w8gemv_plan(n, w->n, w->k, c->n_sm, &p[0], &p[1], &p[2], &p[3]);
}

/* Whether cuBLASLt has the W4A8 GEMMs (matmul.h matmul_gemm_fp8_blk) for n tokens of an (N, K)
 * weight, out bf16 or f32 (remembered per shape). */
static bool cuda__blk_plan(cuda_t *c, int n, int64_t N, int64_t K, bool bf16)
{
    for (int i = 0; i < c->n_blk_plans; i++)
        if (c->blk_plans[i].n == n && c->blk_plans[i].N == N && c->blk_plans[i].K == K &&
            c->blk_plans[i].bf16 == bf16)
            return c->blk_plans[i].ok;
    const bool ok = matmul_gemm_fp8_blk_ok(c->lt, CUDA_LT_WS_BYTES, n, N, K, bf16);
    const int i = c->n_blk_plans < CUDA_BLK_PLANS ? c->n_blk_plans++ : c->next_blk_plan++;
    c->next_blk_plan %= CUDA_BLK_PLANS;
    c->blk_plans[i].n = n;
    c->blk_plans[i].N = N;
    c->blk_plans[i].K = K;
    c->blk_plans[i].bf16 = bf16;
    c->blk_plans[i].ok = ok;
    return ok;
}

/* Whether matmul runs the INT4 weight w at n tokens on the FP8 tensor cores (int4_gemm=fp8, W4A8
 * in 1x128 blocks): above the INT4 mma kernels' n (smaller n take the GEMV / mma kernels first,
 * cuda__matmul), not in the bf16 split accuracy mode (near-f32 activations), where cuBLASLt has
 * the GEMMs (else such a GEMM dequantizes to bf16; logged once). */
static bool cuda__int4_w4a8(cuda_t *c, const pd_weight_t *w, int n)
{
    if (w->fmt != PD_WFMT_INT4 || c->int4_fp8 <= 0 || c->bf16_split || n <= MATMUL_INT4_MMA_MAX_N ||
        w->k % 128 != 0)
        return false;
    if (cuda__blk_plan(c, n, w->n, w->k, false))
        return true;
    if (!c->int4_fp8_told) /* this shape only: the next may have one */
        pd_log_info("backend cuda: int4_gemm=fp8: cuBLASLt has no 1x128 block-scaled fp8 GEMM "
                    "for n %d N %lld K %lld; such INT4 GEMMs dequantize to bf16",
                    n, (long long)w->n, (long long)w->k);
    c->int4_fp8_told = true;
    return false;
}

/* The W4A8 GEMM on activations xq / xs already in matmul.h's blk layout (n tokens): the weight as
 * e4m3 q - z with its group scales (matmul_int4_to_fp8_blk) into wtmp, then cuBLASLt's VEC128
 * GEMMs (the tail group's output in wtmp after the weight); out (n, N) f32, or bf16 when bf16
 * (then cuda__blk_plan(.., true) must hold). */
static pd_status_t cuda__gemm_int4_blk(cuda_t *c, void *out, bool bf16, const uint8_t *xq,
                                       const float *xs, const pd_weight_t *w, int n)
{
    const int64_t N = w->n, K = w->k, nkb = K / 128;
    const size_t al = 256, wb = ((size_t)N * (size_t)K + al - 1) / al * al,
                 sb = ((size_t)N * (size_t)nkb * 4 + al - 1) / al * al,
                 tb = n % 16 ? 16 * (size_t)N * 4 : 0;
    pd_status_t st;
    if ((st = cuda__grow(c, &c->wtmp, wb + sb + tb)) != PD_OK)
        return st;
    uint8_t *wq = c->wtmp.p;
    float *ws = (float *)(wq + wb);
    if ((st = matmul_int4_to_fp8_blk(wq, ws, w, cuda__int4_tiled(w), c->stream)) != PD_OK)
        return st;
    return matmul_gemm_fp8_blk(c->lt, c->lt_ws, CUDA_LT_WS_BYTES, out, tb ? wq + wb + sb : NULL, xq,
                               xs, wq, ws, n, N, K, c->lt_opts.algo, bf16, c->stream);
}

/* INT4 at prefill sizes on the FP8 tensor cores from f32 activations (cuda__int4_w4a8 holds):
 * x into the blk layout in act (matmul_quant_act_fp8_blk), then cuda__gemm_int4_blk. The fused
 * ops make the blk activations themselves where the model asks act_quant (no pass here). */
static pd_status_t cuda__matmul_int4_fp8(cuda_t *c, float *out, const float *x,
                                         const pd_weight_t *w, int n)
{
    const int64_t K = w->k;
    const size_t rows = (size_t)MATMUL_ACT_BLK_ROWS(n), xb = (rows * (size_t)K + 255) / 256 * 256;
    pd_status_t st;
    if ((st = cuda__grow(c, &c->act, xb + rows * (size_t)(K / 128) * 4)) != PD_OK)
        return st;
    uint8_t *xq = c->act.p;
    float *xs = (float *)(xq + xb);
    if ((st = matmul_quant_act_fp8_blk(xq, xs, x, n, K, c->stream)) != PD_OK)
        return st;
    return cuda__gemm_int4_blk(c, out, false, xq, xs, w, n);
}

static pd_status_t cuda__matmul(cuda_t *c, float *out, const float *x, const pd_weight_t *w, int n)
{
    const int64_t N = w->n, K = w->k;
    pd_status_t st;
    int xp[4]; /* slice GEMV plan: rows, slices, depth, blocks */

    if (n <= 0)
        return PD_OK;
    if (cuda__int4_ksplit(w, n, false))
        return cuda__int4_ksplit_run(c, &out, x, &w, 1, n);
    cuda__xgemv_plan(c, w, n, xp);
    if (xp[0] > 0 && w->fmt == PD_WFMT_INT4)
        return matmul_w4gemv(out, x, w, n, xp[0], xp[1], xp[2], xp[3], c->stream);
    const bool w8wg = cuda__w8wg_route(c, w, n), ks = cuda__fp8_ksplit(w, n);
    if (w8wg || xp[0] > 0 || ks) { /* FP8: per-token quantization first */
        uint8_t *xq;
        float *xs;
        if ((st = cuda__quant_fp8_act(c, x, n, K, &xq, &xs)) != PD_OK)
            return st;
        if (w8wg) /* the wgmma GEMM (option w8wg) */
            return cuda__matmul_w8wg(c, out, xq, xs, w, n);
        if (xp[0] > 0)
            return matmul_w8gemv(out, xq, xs, w, n, xp[0], xp[1], xp[2], xp[3], c->stream);
        return matmul_fp8_ksplit(out, xq, xs, w, n, matmul_fp8_ksplit_batch, c->stream);
    }
    if (n <= CUDA_WGEMV_MAX_N && K <= CUDA_WGEMV_MAX_K && cuda__int4_tiled(w) && c->cc_major >= 9)
        return cuda__matmul_wgemv(c, out, x, w, n);
    if (w->fmt == PD_WFMT_FP8 && n <= CUDA_FP8_MMA_MAX_N && K % 64 == 0 &&
        (n >= 2 || N <= CUDA_FP8_GEMV_MIN_ROWS)) {
        int warps, splits;
        matmul_fp8_mma_plan(n, N, K, c->n_sm, &warps, &splits);
        size_t qb = ((size_t)n * (size_t)K + 255) / 256 * 256,
               sb = ((size_t)n * 4 + 255) / 256 * 256;
        size_t pf = matmul_int4_mma_part_floats(n, N, splits);
        if ((st = cuda__grow(c, &c->act, qb + sb + pf * 4)) != PD_OK)
            return st;
        float *xs = (float *)((uint8_t *)c->act.p + qb),
              *part = pf ? (float *)((uint8_t *)c->act.p + qb + sb) : NULL;
        if ((st = matmul_quant_act_fp8(c->act.p, NULL, xs, x, n, K, c->stream)) != PD_OK)
            return st;
        return matmul_fp8_mma(out, part, c->act.p, xs, w, n, warps, splits, c->stream);
    }
    if (w->fmt == PD_WFMT_FP8) {
        const bool gemm = n > CUDA_GEMV_MAX_N && K % 16 == 0 && N % 16 == 0;
        /* GEMM: fp8 bytes (n, K); GEMV: decoded f32 (n, K); then scales (n) */
        size_t qb = ((size_t)n * (size_t)K * (gemm ? 1 : 4) + 255) / 256 * 256;
        if ((st = cuda__grow(c, &c->act, qb + (size_t)n * 4)) != PD_OK)
            return st;
        float *xs = (float *)((uint8_t *)c->act.p + qb);
        if ((st = matmul_quant_act_fp8(gemm ? c->act.p : NULL, gemm ? NULL : c->act.p, xs, x, n, K,
                                       c->stream)) != PD_OK)
            return st;
        if (!gemm)
            return cuda__gemv_chunks(c, out, c->act.p, xs, w, n);
        if (c->fp8_scaled >= 0) {
            st = cuda__gemm_fp8_rowwise(c, out, false, c->act.p, xs, w, n);
            if (st != PD_ERR_UNSUPPORTED) {
                c->fp8_scaled = st == PD_OK ? 1 : c->fp8_scaled;
                return st;
            }
            pd_log_info("backend cuda: no outer-vector fp8 scales in cuBLASLt here: fp8 GEMMs "
                        "scale in a separate pass");
            c->fp8_scaled = -1;
        }
        if ((st = matmul_gemm_fp8(c->lt, c->lt_ws, CUDA_LT_WS_BYTES, out, c->act.p, w->data, n, N,
                                  K, c->stream)) != PD_OK)
            return st;
        return matmul_fp8_scale(out, xs, w->scales, n, N, c->stream);
    }
    if (cuda__w4wg_route(c, w, n))
        return cuda__matmul_w4wg(c, &out, x, NULL, &w, 1, n);
    if (c->int4_mma2 && cuda__int4_tiled(w) && n > 8 && n <= MATMUL_INT4_MMA_MAX_N)
        return cuda__matmul_int4_mma2(c, out, x, w, n);
    if (w->fmt == PD_WFMT_INT4 && (n > CUDA_GEMV_MAX_N_INT4 || cuda__int4_tiled(w)) &&
        n <= MATMUL_INT4_MMA_MAX_N)
        return cuda__matmul_int4_mma(c, out, x, w, n);
    /* FP8 with 128x128 block scales (DeepSeek-V3 / Kimi K2 checkpoints): the f32 GEMV at small
     * n; else dequantized to bf16 for the BF16 GEMM below (as INT4) */
    if (w->fmt == PD_WFMT_FP8_BLOCK && n <= FAMILY_FP8_BLOCK_GEMV_MAX_N && K % 16 == 0 &&
        ((uintptr_t)x & 15) == 0 && ((uintptr_t)w->data & 15) == 0)
        return family_fp8_block_gemv(out, x, w, n, c->stream);
    if (w->fmt == PD_WFMT_FP8_BLOCK && K % 4 != 0) {
        pd_log_error("backend cuda: fp8 block-scaled weight with K %lld (needs K %% 4 == 0)",
                     (long long)K);
        return PD_ERR_UNSUPPORTED;
    }
    if (w->fmt != PD_WFMT_FP8_BLOCK &&
        n <= (w->fmt == PD_WFMT_INT4 ? CUDA_GEMV_MAX_N_INT4 : CUDA_GEMV_MAX_N))
        return cuda__gemv_chunks(c, out, x, NULL, w, n);
    if (w->fmt == PD_WFMT_F32)
        return matmul_gemm_f32(c->blas, out, x, w->data, n, N, K, c->stream);
    if (cuda__int4_w4a8(c, w, n)) /* int4_gemm=fp8 */
        return cuda__matmul_int4_fp8(c, out, x, w, n);
    const uint16_t *wb = w->data;
    if (w->fmt == PD_WFMT_INT4 || w->fmt == PD_WFMT_FP8_BLOCK) {
        if ((st = cuda__grow(c, &c->wtmp, (size_t)N * (size_t)K * 2)) != PD_OK)
            return st;
        if ((st = w->fmt == PD_WFMT_INT4
                      ? matmul_int4_to_bf16(c->wtmp.p, w, cuda__int4_tiled(w), c->stream)
                      : family_fp8_block_to_bf16(c->wtmp.p, w, c->stream)) != PD_OK)
            return st;
        wb = c->wtmp.p;
    }
    /* one bf16 GEMM on bf16(x) by default; the hi + lo split (two GEMMs, near f32) on request */
    size_t half = ((size_t)n * (size_t)K * 2 + 255) / 256 * 256;
    if ((st = cuda__grow(c, &c->act, (c->bf16_split ? 2 : 1) * half)) != PD_OK)
        return st;
    uint16_t *hi = c->act.p, *lo = c->bf16_split ? (uint16_t *)((uint8_t *)c->act.p + half) : NULL;
    if ((st = matmul_split_bf16(hi, lo, x, n, K, c->stream)) != PD_OK)
        return st;
    return matmul_gemm_bf16(c->blas, out, hi, lo, wb, n, N, K, c->stream);
}

static void cuda_matmul(pd_backend_t *be, float *out, const float *x, const pd_weight_t *w, int n)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, cuda__matmul(c, out, x, w, n));
}

/* backend.h matmul_group: tiled INT4 weights of one K where cuda__matmul would run the slice
 * GEMV or the wgmma GEMM for a weight of their summed rows run as one grouped launch of that
 * kernel (its plan for the summed rows); anything else runs cuda__matmul per weight. */
static pd_status_t cuda__matmul_group(cuda_t *c, float *const *outs, const float *x,
                                      const pd_weight_t *const *ws, int count, int n)
{
    pd_status_t st;
    bool grouped = count > 1 && count <= MATMUL_GROUP_MAX && n > 0;
    pd_weight_t sum = *ws[0]; /* the plan's stand-in: the summed rows */
    sum.n = 0;
    for (int i = 0; grouped && i < count; i++) {
        grouped = cuda__int4_tiled(ws[i]) && ws[i]->k == ws[0]->k;
        sum.n += ws[i]->n;
    }
    if (grouped) {
        bool ks = true; /* the INT4 K-split GEMV's group (matmul_int4_ksplit_route bit 1) */
        for (int i = 0; i < count; i++)
            ks = ks && cuda__int4_ksplit(ws[i], n, true);
        if (ks)
            return cuda__int4_ksplit_run(c, outs, x, ws, count, n);
        int xp[4];
        cuda__xgemv_plan(c, &sum, n, xp);
        if (xp[0] > 0)
            return matmul_w4gemv_group(outs, x, ws, count, n, xp[0], xp[1], xp[2], xp[3],
                                       c->stream);
        if (cuda__w4wg_route(c, &sum, n))
            return cuda__matmul_w4wg(c, outs, x, NULL, ws, count, n);
    }
    for (int i = 0; i < count; i++)
        if ((st = cuda__matmul(c, outs[i], x, ws[i], n)) != PD_OK)
            return st;
    return PD_OK;
}

static void cuda_matmul_group(pd_backend_t *be, float *const *outs, const float *x,
                              const pd_weight_t *const *ws, int count, int n)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, cuda__matmul_group(c, outs, x, ws, count, n));
}

/* backend.h matmul_fused_ok / matmul_fused: the slice GEMV with the norm, SiLU·mul or residual
 * add folded into its prologue / epilogue (matmul_w4gemv_fused) where cuda__matmul would run
 * the slice GEMV (tiled INT4 at n <= CUDA_XGEMV_MAX_N_INT4). A group runs the plan of its summed
 * rows, as cuda__matmul_group does. */
static bool cuda_matmul_fused_ok(pd_backend_t *be, const pd_weight_t *w, int n, pd_pro_t pro,
                                 pd_epi_t epi)
{
    cuda_t *c = cuda__get(be);
    int xp[4];
    if (!c->gemv_fuse || n < 1 || !cuda__int4_tiled(w) ||
        (pro == PD_PRO_SILU_MUL && c->gemv_fuse != 3) ||
        (epi == PD_EPI_SILU_MUL && c->gemv_fuse != 2))
        return false;
    cuda__xgemv_plan(c, w, n, xp);
    return xp[0] > 0 && (epi != PD_EPI_SILU_MUL || w->n % (2 * xp[0]) == 0);
}

static pd_status_t cuda__matmul_fused(cuda_t *c, float *const *outs, const float *x, pd_pro_t pro,
                                      const uint16_t *norm_w, float eps,
                                      const pd_weight_t *const *ws, int count, int n, pd_epi_t epi)
{
    const int kinds[3] = {MATMUL_PRO_NONE, MATMUL_PRO_RMSNORM, MATMUL_PRO_SILU};
    if (count < 1 || count > MATMUL_GROUP_MAX || (unsigned)pro > PD_PRO_SILU_MUL ||
        (unsigned)epi > PD_EPI_SILU_MUL || (epi == PD_EPI_SILU_MUL && count != 1))
        return PD_ERR_INVALID;
    pd_weight_t sum = *ws[0]; /* the plan's stand-in: the summed rows */
    sum.n = 0;
    for (int i = 0; i < count; i++) {
        if (!cuda__int4_tiled(ws[i]) || ws[i]->k != ws[0]->k) {
            pd_log_error("backend cuda: matmul_fused on a %s weight (matmul_fused_ok said no)",
                         pd_wfmt_name(ws[i]->fmt));
            return PD_ERR_INVALID;
        }
        sum.n += ws[i]->n;
    }
    int xp[4];
    cuda__xgemv_plan(c, &sum, n, xp);
    if (xp[0] <= 0) {
        pd_log_error("backend cuda: matmul_fused at n %d (matmul_fused_ok said no)", n);
        return PD_ERR_INVALID;
    }
    if (epi == PD_EPI_SILU_MUL && ws[0]->n % (2 * xp[0]) != 0) {
        pd_log_error("backend cuda: matmul_fused: SiLU·mul of %lld rows in tiles of %d",
                     (long long)ws[0]->n, xp[0]);
        return PD_ERR_INVALID;
    }
    const matmul_pro_t p = {kinds[pro], epi == PD_EPI_ACC,
                            epi == PD_EPI_SILU_MUL ? MATMUL_EPI_SILU : MATMUL_EPI_NONE, norm_w,
                            eps};
    return matmul_w4gemv_fused(outs, x, &p, ws, count, n, xp[0], xp[1], xp[2], xp[3], c->stream);
}

static void cuda_matmul_fused(pd_backend_t *be, float *const *outs, const float *x, pd_pro_t pro,
                              const uint16_t *norm_w, float eps, const pd_weight_t *const *ws,
                              int count, int n, pd_epi_t epi)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, cuda__matmul_fused(c, outs, x, pro, norm_w, eps, ws, count, n, epi));
}

/* FP8 matmul on activations the fused ops already quantized (backend.h matmul_fp8; xq (n, K)
 * fp8, xs (n) f32 as matmul_quant_act_fp8 makes them): cuda__matmul's FP8 routing without the
 * quantization launch. */
static pd_status_t cuda__matmul_fp8(cuda_t *c, float *out, const pd_act_fp8_t *x,
                                    const pd_weight_t *w, int n)
{
    const int64_t N = w->n, K = w->k;
    const uint8_t *xq = x->q;
    const float *xs = x->scale;
    pd_status_t st;

    if (n <= 0)
        return PD_OK;
    if (x->f16) { /* act_quant said PD_ACT_F16: the INT4 K-split GEMV on the fused op's rows */
        if (!cuda__int4_ksplit(w, n, false) || ((uintptr_t)xq & 15) != 0) {
            pd_log_error("backend cuda: matmul_fp8 with f16 activations on a %s weight at n %d "
                         "(act_quant did not ask for them)",
                         pd_wfmt_name(w->fmt), n);
            return PD_ERR_INVALID;
        }
        return matmul_int4_ksplit(out, (const uint16_t *)xq, xs, w, n, matmul_int4_ksplit_batch,
                                  c->stream);
    }
    if (x->wg) { /* act_quant said PD_ACT_F16WG: the wgmma INT4 GEMM on the fused op's image */
        if (!cuda__w4wg_route(c, w, n) || n > PD_ACT_WG_MAX_N) {
            pd_log_error("backend cuda: matmul_fp8 with an f16 image on a %s weight at n %d "
                         "(act_quant did not ask for it)",
                         pd_wfmt_name(w->fmt), n);
            return PD_ERR_INVALID;
        }
        return cuda__matmul_w4wg(c, &out, NULL, x, &w, 1, n);
    }
    if (x->blk) { /* act_quant said PD_ACT_FP8_BLK: the W4A8 INT4 GEMM */
        if (!cuda__int4_w4a8(c, w, n)) {
            pd_log_error("backend cuda: matmul_fp8 with 1x128-block activations on a %s weight "
                         "at n %d (act_quant did not ask for them)",
                         pd_wfmt_name(w->fmt), n);
            return PD_ERR_INVALID;
        }
        return cuda__gemm_int4_blk(c, out, false, xq, xs, w, n);
    }
    if (w->fmt != PD_WFMT_FP8) {
        pd_log_error("backend cuda: matmul_fp8 on a %s weight", pd_wfmt_name(w->fmt));
        return PD_ERR_INVALID;
    }
    if (cuda__w8wg_route(c, w, n) && ((uintptr_t)xq & 15) == 0)
        return cuda__matmul_w8wg(c, out, xq, xs, w, n);
    int xp[4];
    cuda__xgemv_plan(c, w, n, xp);
    if (xp[0] > 0)
        return matmul_w8gemv(out, xq, xs, w, n, xp[0], xp[1], xp[2], xp[3], c->stream);
    if (cuda__fp8_ksplit(w, n) && ((uintptr_t)xq & 15) == 0)
        return matmul_fp8_ksplit(out, xq, xs, w, n, matmul_fp8_ksplit_batch, c->stream);
    if (n <= CUDA_FP8_MMA_MAX_N && K % 64 == 0 && (n >= 2 || N <= CUDA_FP8_GEMV_MIN_ROWS)) {
        int warps, splits;
        matmul_fp8_mma_plan(n, N, K, c->n_sm, &warps, &splits);
        size_t pf = matmul_int4_mma_part_floats(n, N, splits);
        if (pf && (st = cuda__grow(c, &c->act, pf * 4)) != PD_OK)
            return st;
        return matmul_fp8_mma(out, pf ? c->act.p : NULL, xq, xs, w, n, warps, splits, c->stream);
    }
    if (n <= CUDA_GEMV_MAX_N || K % 16 != 0 || N % 16 != 0) { /* GEMV on the decoded fp8 values */
        if ((st = cuda__grow(c, &c->act, (size_t)n * (size_t)K * 4)) != PD_OK ||
            (st = elementwise_fp8_to_f32(c->act.p, xq, (size_t)n * (size_t)K, c->stream)) != PD_OK)
            return st;
        return cuda__gemv_chunks(c, out, c->act.p, xs, w, n);
    }
    if (c->fp8_scaled >= 0) {
        st = cuda__gemm_fp8_rowwise(c, out, false, xq, xs, w, n);
        if (st != PD_ERR_UNSUPPORTED) {
            c->fp8_scaled = st == PD_OK ? 1 : c->fp8_scaled;
            return st;
        }
        c->fp8_scaled = -1;
    }
    if ((st = matmul_gemm_fp8(c->lt, c->lt_ws, CUDA_LT_WS_BYTES, out, xq, w->data, n, N, K,
                              c->stream)) != PD_OK)
        return st;
    return matmul_fp8_scale(out, xs, w->scales, n, N, c->stream);
}

static void cuda_matmul_fp8(pd_backend_t *be, float *out, const pd_act_fp8_t *x,
                            const pd_weight_t *w, int n)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, cuda__matmul_fp8(c, out, x, w, n));
}

/* FP8 weights of one K that cuda__matmul_fp8 would each run on the K-split GEMV, as one
 * matmul_fp8_ksplit_group launch (matmul_fp8_ksplit_route bit 3); or on the FP8 mma kernel, as
 * one matmul_fp8_mma_group launch with the plan of their summed rows (fp8_group);
 * PD_ERR_UNSUPPORTED (nothing enqueued) where they would not or the plan's splits need the
 * partial sums' launch. */
static pd_status_t cuda__matmul_fp8_group(cuda_t *c, float *const *outs, const pd_act_fp8_t *x,
                                          const pd_weight_t *const *ws, int count, int n)
{
    if ((matmul_fp8_ksplit_route & 8) && !x->blk && !x->wg && !x->f16 && count >= 2 &&
        count <= MATMUL_GROUP_MAX && ((uintptr_t)x->q & 15) == 0) { /* the K-split GEMV's group */
        bool all = true;
        for (int i = 0; i < count; i++)
            all = all && cuda__fp8_ksplit(ws[i], n) && ws[i]->k == ws[0]->k;
        if (all)
            return matmul_fp8_ksplit_group(outs, x->q, x->scale, ws, count, n,
                                           matmul_fp8_ksplit_batch, c->stream);
    }
    if (!c->fp8_group || x->blk || x->wg || x->f16 || count < 2 || count > MATMUL_GROUP_MAX ||
        n < 1 || n > CUDA_FP8_MMA_MAX_N || ((uintptr_t)x->q & 15) != 0)
        return PD_ERR_UNSUPPORTED;
    int64_t Nt = 0;
    for (int i = 0; i < count; i++) {
        const pd_weight_t *w = ws[i];
        int xp[4];
        cuda__xgemv_plan(c, w, n, xp);
        if (w->fmt != PD_WFMT_FP8 || w->k != ws[0]->k || w->k % 64 != 0 || xp[0] > 0 ||
            cuda__w8wg_route(c, w, n) || (n < 2 && w->n > CUDA_FP8_GEMV_MIN_ROWS) ||
            cuda__fp8_ksplit(w, n))
            return PD_ERR_UNSUPPORTED;
        Nt += w->n;
    }
    int warps, splits;
    matmul_fp8_mma_plan(n, Nt, ws[0]->k, c->n_sm, &warps, &splits);
    return matmul_fp8_mma_group(outs, x->q, x->scale, ws, count, n, warps, splits, c->stream);
}

/* backend.h matmul_group_fp8: an f16 image (PD_ACT_F16WG) for tiled INT4 weights of one K runs
 * as one grouped wgmma launch (as cuda__matmul_group), plain f16 rows (PD_ACT_F16) as one INT4
 * K-split group launch where its route takes the group; FP8 weights at the FP8 mma kernel's sizes
 * as one grouped launch (fp8_group); anything else matmul_fp8 per weight. */
static pd_status_t cuda__matmul_group_fp8(cuda_t *c, float *const *outs, const pd_act_fp8_t *x,
                                          const pd_weight_t *const *ws, int count, int n)
{
    pd_status_t st;
    bool ks = x->f16 && count > 1 && count <= MATMUL_GROUP_MAX && ((uintptr_t)x->q & 15) == 0;
    for (int i = 0; ks && i < count; i++)
        ks = cuda__int4_ksplit(ws[i], n, true) && ws[i]->k == ws[0]->k;
    if (ks)
        return matmul_int4_ksplit_group(outs, (const uint16_t *)x->q, x->scale, ws, count, n,
                                        matmul_int4_ksplit_batch, c->stream);
    bool grouped = x->wg && count > 1 && count <= MATMUL_GROUP_MAX && n > 0;
    for (int i = 0; grouped && i < count; i++)
        grouped = cuda__w4wg_route(c, ws[i], n) && ws[i]->k == ws[0]->k;
    if (grouped)
        return cuda__matmul_w4wg(c, outs, NULL, x, ws, count, n);
    if ((st = cuda__matmul_fp8_group(c, outs, x, ws, count, n)) != PD_ERR_UNSUPPORTED)
        return st;
    for (int i = 0; i < count; i++)
        if ((st = cuda__matmul_fp8(c, outs[i], x, ws[i], n)) != PD_OK)
            return st;
    return PD_OK;
}

static void cuda_matmul_group_fp8(pd_backend_t *be, float *const *outs, const pd_act_fp8_t *x,
                                  const pd_weight_t *const *ws, int count, int n)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, cuda__matmul_group_fp8(c, outs, x, ws, count, n));
}

/* backend.h matmul_silu_fp8. Prefill sizes (the cuBLASLt GEMM with outer-vector scales): the
 * GEMM writes the gate_up product as bf16 into gu (half its f32 size) and
 * elementwise_silu_mul_fp8_bf16 reads it, instead of f32 written and read again (470 MB less
 * each way at n 8192, f 14336); elsewhere (small n, no outer-vector mode, PD_CUDA_GU_BF16=0)
 * matmul_fp8 + silu_mul_fp8 on the f32 product. */
static pd_status_t cuda__matmul_silu_fp8(cuda_t *c, const pd_act_fp8_t *q, float *gu,
                                         const pd_act_fp8_t *x, const pd_weight_t *w, int n)
{
    const int64_t N = w->n, K = w->k;
    const int f = (int)(N / 2);
    pd_status_t st;

    if (n <= 0)
        return PD_OK;
    if (x->blk && q->blk && !c->no_gu_bf16 && cuda__int4_w4a8(c, w, n) &&
        cuda__blk_plan(c, n, N, K, true)) { /* INT4 W4A8: the product as bf16, as FP8's below */
        if ((st = cuda__gemm_int4_blk(c, gu, true, x->q, x->scale, w, n)) != PD_OK)
            return st;
        return elementwise_silu_mul_fp8_blk(NULL, NULL, (const uint16_t *)gu, q->q, q->scale, n, f,
                                            c->stream);
    }
    if (w->fmt == PD_WFMT_FP8 && !c->no_gu_bf16 && c->fp8_scaled >= 0 && n > CUDA_GEMV_MAX_N &&
        n > CUDA_FP8_MMA_MAX_N && K % 16 == 0 && N % 16 == 0) {
        st = cuda__gemm_fp8_rowwise(c, gu, true, x->q, x->scale, w, n);
        if (st == PD_OK)
            return elementwise_silu_mul_fp8_bf16((const uint16_t *)gu, q->q, q->scale, n, f,
                                                 c->stream);
        if (st != PD_ERR_UNSUPPORTED)
            return st;
    }
    if ((st = cuda__matmul_fp8(c, gu, x, w, n)) != PD_OK)
        return st;
    if (q->wg)
        return elementwise_silu_mul_f16wg(NULL, gu, (uint16_t *)q->q, q->scale, n, f, c->stream);
    if (q->f16)
        return elementwise_silu_mul_f16(NULL, gu, (uint16_t *)q->q, q->scale, n, f, c->stream);
    return q->blk ? elementwise_silu_mul_fp8_blk(NULL, gu, NULL, q->q, q->scale, n, f, c->stream)
                  : elementwise_silu_mul_fp8(NULL, gu, q->q, q->scale, n, f, c->stream);
}

static void cuda_matmul_silu_fp8(pd_backend_t *be, const pd_act_fp8_t *q, float *gu,
                                 const pd_act_fp8_t *x, const pd_weight_t *w, int n)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, cuda__matmul_silu_fp8(c, q, gu, x, w, n));
}

static void cuda_add_rmsnorm(pd_backend_t *be, float *x, const float *y, float *out,
                             const uint16_t *w, int n, int d, float eps, const pd_act_fp8_t *q)
{
    cuda_t *c = cuda__get(be);
    if (q && q->wg) {
        cuda__note(c, elementwise_add_rmsnorm_f16wg(x, y, out, w, (uint16_t *)q->q, q->scale, n, d,
                                                    eps, c->stream));
        return;
    }
    if (q && q->f16) {
        cuda__note(c, elementwise_add_rmsnorm_f16(x, y, out, w, (uint16_t *)q->q, q->scale, n, d,
                                                  eps, c->stream));
        return;
    }
    cuda__note(c, elementwise_add_rmsnorm(x, y, out, w, q ? q->q : NULL, q ? q->scale : NULL, n, d,
                                          eps, q && q->blk, c->stream));
}

static void cuda_silu_mul_fp8(pd_backend_t *be, float *out, const float *gu, int n, int f,
                              const pd_act_fp8_t *q)
{
    cuda_t *c = cuda__get(be);
    if (!q) { /* plain silu_mul */
        cuda__note(c, out ? elementwise_silu_mul(out, gu, n, f, c->stream) : PD_OK);
        return;
    }
    if (q->wg) {
        cuda__note(
            c, elementwise_silu_mul_f16wg(out, gu, (uint16_t *)q->q, q->scale, n, f, c->stream));
        return;
    }
    if (q->f16) {
        cuda__note(c,
                   elementwise_silu_mul_f16(out, gu, (uint16_t *)q->q, q->scale, n, f, c->stream));
        return;
    }
    cuda__note(c, q->blk
                      ? elementwise_silu_mul_fp8_blk(out, gu, NULL, q->q, q->scale, n, f, c->stream)
                      : elementwise_silu_mul_fp8(out, gu, q->q, q->scale, n, f, c->stream));
}

/* backend.h act_quant: FP8 weights per row; tiled INT4 as plain f16 rows where matmul would run
 * the INT4 K-split GEMV and backend_cuda_ks_act is on (the fused RMSNorm / SiLU·mul write them:
 * one matmul_quant_act_f16 launch less per GEMV); as the f16 image where matmul would run the
 * wgmma GEMM (the fused RMSNorm / SiLU·mul write it: one matmul_quant_act_f16wg launch less per
 * GEMM; PD_CUDA_WG_ACT=0 turns it off); INT4 in 1x128 blocks where matmul would run the W4A8
 * GEMM (cuda__int4_w4a8); the rest f32. */
static pd_act_t cuda_act_quant(pd_backend_t *be, const pd_weight_t *w, int n)
{
    cuda_t *c = cuda__get(be);
    if (w->fmt == PD_WFMT_FP8)
        return PD_ACT_FP8_ROW;
    if (backend_cuda_ks_act && n <= PD_ACT_WG_MAX_N && cuda__int4_ksplit(w, n, false))
        return PD_ACT_F16;
    if (c->wg_act && n <= PD_ACT_WG_MAX_N && cuda__w4wg_route(c, w, n))
        return PD_ACT_F16WG;
    return cuda__int4_w4a8(c, w, n) ? PD_ACT_FP8_BLK : PD_ACT_F32;
}

/* ==== paged KV ==== */

static void cuda_kv_write(pd_backend_t *be, void *arena, const kv_layout_t *l, int layer,
                          const float *k, const float *v, const int32_t *slots, int n)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, kv_write(arena, l, layer, k, v, slots, n, c->stream));
}

static void cuda_rope_kv_write(pd_backend_t *be, float *q, float *k, const float *v,
                               const int32_t *pos, const float *inv_freq, int n, int n_heads,
                               void *arena, const kv_layout_t *l, int layer, const int32_t *slots)
{
    cuda_t *c = cuda__get(be);
    cuda__note(
        c, kv_rope_write(q, k, v, pos, inv_freq, n, n_heads, arena, l, layer, slots, c->stream));
}

/* backend.h qkv_rope_write. With PD_CUDA_QKV_BF16=1 at prefill sizes (the cuBLASLt GEMM with
 * outer-vector scales for all three weights, as matmul_silu_fp8's bf16 path): q's GEMM writes
 * bf16 into the qkv16 scratch, k's and v's into the first half of their own f32 buffers, and
 * kv_rope_write_bf16 rotates q into the f32 q (what attention reads) and writes the pages (the
 * f32 q, k, v products are never written: 2 bytes per element less each way). Elsewhere (and
 * by default): matmul_fp8 three times, then kv_rope_write. */
static bool cuda__qkv_bf16_ok(const cuda_t *c, const pd_weight_t *w, int n)
{
    return w->fmt == PD_WFMT_FP8 && c->fp8_scaled >= 0 && n > CUDA_GEMV_MAX_N &&
           n > CUDA_FP8_MMA_MAX_N && w->k % 16 == 0 && w->n % 16 == 0;
}

static pd_status_t cuda__qkv_rope_write(cuda_t *c, float *q, float *k, float *v,
                                        const pd_act_fp8_t *x, const pd_weight_t *wq,
                                        const pd_weight_t *wk, const pd_weight_t *wv,
                                        const int32_t *pos, const float *inv_freq, int n,
                                        int n_heads, void *arena, const kv_layout_t *l, int layer,
                                        const int32_t *slots)
{
    pd_status_t st;
    if (n <= 0)
        return PD_OK;
    if (c->qkv_bf16 && cuda__qkv_bf16_ok(c, wq, n) && cuda__qkv_bf16_ok(c, wk, n) &&
        cuda__qkv_bf16_ok(c, wv, n) && l->n_kv_heads * l->head_dim <= 6144) {
        if ((st = cuda__grow(c, &c->qkv16, (size_t)n * (size_t)wq->n * 2)) != PD_OK)
            return st;
        st = cuda__gemm_fp8_rowwise(c, c->qkv16.p, true, x->q, x->scale, wq, n);
        if (st == PD_OK)
            st = cuda__gemm_fp8_rowwise(c, k, true, x->q, x->scale, wk, n);
        if (st == PD_OK)
            st = cuda__gemm_fp8_rowwise(c, v, true, x->q, x->scale, wv, n);
        if (st == PD_OK)
            return kv_rope_write_bf16(q, (const uint16_t *)c->qkv16.p, (const uint16_t *)k,
                                      (const uint16_t *)v, pos, inv_freq, n, n_heads, arena, l,
                                      layer, slots, c->stream);
        if (st != PD_ERR_UNSUPPORTED)
            return st;
    }
    float *const outs[3] = {q, k, v};
    const pd_weight_t *const ws[3] = {wq, wk, wv};
    st = cuda__matmul_fp8_group(c, outs, x, ws, 3, n); /* one launch (fp8_group) */
    if (st == PD_ERR_UNSUPPORTED) {
        st = PD_OK;
        for (int i = 0; i < 3 && st == PD_OK; i++)
            st = cuda__matmul_fp8(c, outs[i], x, ws[i], n);
    }
    if (st != PD_OK)
        return st;
    return kv_rope_write(q, k, v, pos, inv_freq, n, n_heads, arena, l, layer, slots, c->stream);
}

static void cuda_qkv_rope_write(pd_backend_t *be, float *q, float *k, float *v,
                                const pd_act_fp8_t *x, const pd_weight_t *wq, const pd_weight_t *wk,
                                const pd_weight_t *wv, const int32_t *pos, const float *inv_freq,
                                int n, int n_heads, void *arena, const kv_layout_t *l, int layer,
                                const int32_t *slots)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, cuda__qkv_rope_write(c, q, k, v, x, wq, wk, wv, pos, inv_freq, n, n_heads, arena,
                                       l, layer, slots));
}

static pd_status_t cuda__attention_parts(cuda_t *c, float *out, const float *q, const void *arena,
                                         const kv_layout_t *l, int layer, const pd_attn_batch_t *b,
                                         int n_rows, int n_heads);

static pd_status_t cuda__attention(cuda_t *c, float *out, const float *q, const void *arena,
                                   const kv_layout_t *l, int layer, const pd_attn_batch_t *b,
                                   int n_heads)
{
    int n_rows = b->n_rows, max_ctx = b->max_ctx;
    pd_status_t st;

    if (n_rows <= 0) {
        if (c->capturing) {
            pd_log_error("backend cuda: attention without a row count inside a graph capture");
            return PD_ERR_INTERNAL;
        }
        if ((st = cuda__status(cudaMemcpyAsync(&n_rows, b->q_start + b->n_seqs, 4,
                                               cudaMemcpyDeviceToHost, c->stream),
                               "attention rows")) != PD_OK ||
            (st = cuda__status(cudaStreamSynchronize(c->stream), "attention rows")) != PD_OK)
            return st;
    }
    if (n_rows >= CUDA_FLASH_MIN_ROWS * b->n_seqs && !c->no_flash &&
        attention_flash_supports(l, n_heads))
        return attention_flash_run_variant(out, q, arena, l, layer, b, n_rows, n_heads,
                                           c->flash_variant, c->stream);
    if (l->n_kv_heads > 0 && n_heads % l->n_kv_heads == 0 &&
        n_heads / l->n_kv_heads > CUDA_ATTN_MAX_GROUP)
        return cuda__attention_parts(c, out, q, arena, l, layer, b, n_rows, n_heads);
    if (max_ctx <= 0)
        max_ctx = b->max_pages * l->page_tokens;
    int splits = attention_splits(n_rows, l->n_kv_heads, max_ctx, l->fmt);
    size_t nf = attention_scratch_floats(n_rows, n_heads, l->head_dim, splits);
    const size_t had = c->attn.bytes;
    if (nf && (st = cuda__grow(c, &c->attn, nf * sizeof(float))) != PD_OK)
        return st;
    if (c->attn.bytes != had && /* new memory: its split counters start at zero (attention.h) */
        (st = cuda__status(cudaMemsetAsync(c->attn.p, 0, ATTENTION_SCRATCH_COUNTERS * 4, c->stream),
                           "attention counters")) != PD_OK)
        return st;
    return attention_run(out, c->attn.p, q, arena, l, layer, b, n_rows, n_heads, max_ctx, splits,
                         c->stream);
}

/* Attention for a GQA group G above CUDA_ATTN_MAX_GROUP outside flash attention: the group is cut
 * into parts of gs heads (the fewest parts that divide G, each at most CUDA_ATTN_MAX_GROUP); per
 * part, the q heads [k G + p gs, + gs) of every KV head k are gathered into (n_rows, KVH gs, D),
 * attended with group gs and scattered back into out. Each (row, head) output is what one call
 * would give: a head's softmax depends only on its own query and its KV head. */
static pd_status_t cuda__attention_parts(cuda_t *c, float *out, const float *q, const void *arena,
                                         const kv_layout_t *l, int layer, const pd_attn_batch_t *b,
                                         int n_rows, int n_heads)
{
    const int KVH = l->n_kv_heads, G = n_heads / KVH, D = l->head_dim;
    int parts = (G + CUDA_ATTN_MAX_GROUP - 1) / CUDA_ATTN_MAX_GROUP;
    while (G % parts)
        parts++;
    const int gs = G / parts;
    const size_t half = ((size_t)n_rows * KVH * gs * D * 4 + 255) / 256 * 256;
    pd_attn_batch_t bp = *b;
    pd_status_t st;

    if (n_rows == 0)
        return PD_OK;
    if ((st = cuda__grow(c, &c->grp, 2 * half)) != PD_OK)
        return st;
    float *qp = c->grp.p, *op = (float *)((uint8_t *)c->grp.p + half);
    bp.n_rows = n_rows;
    for (int p = 0; p < parts && st == PD_OK; p++) {
        if ((st = family_heads_copy(qp, q, n_rows, KVH, G, p * gs, gs, D, true, c->stream)) ==
                PD_OK &&
            (st = cuda__attention(c, op, qp, arena, l, layer, &bp, KVH * gs)) == PD_OK)
            st = family_heads_copy(out, op, n_rows, KVH, G, p * gs, gs, D, false, c->stream);
    }
    return st;
}

static void cuda_attention(pd_backend_t *be, float *out, const float *q, const void *arena,
                           const kv_layout_t *l, int layer, const pd_attn_batch_t *batch,
                           int n_heads)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, cuda__attention(c, out, q, arena, l, layer, batch, n_heads));
}

/* Bytes of one slot of the idx scratch for n elements of up to 8 bytes. */
static size_t cuda__idx_slot(int n)
{
    return ((size_t)n * 8 + 255) / 256 * 256;
}

/* Uploads n_arrays host arrays of n elements (elem[i] bytes each: int32 ids, 64-bit tags) into
 * slots of the idx scratch (two more slots are left for results); *dev_p[i] set. */
static pd_status_t cuda__upload_idx(cuda_t *c, int n, int n_arrays, const void *const *host,
                                    const size_t *elem, void **dev_p)
{
    size_t each = cuda__idx_slot(n);
    pd_status_t st = cuda__grow(c, &c->idx, each * (size_t)(n_arrays + 2));
    for (int i = 0; i < n_arrays && st == PD_OK; i++) {
        dev_p[i] = (uint8_t *)c->idx.p + each * (size_t)i;
        st = cuda__status(cudaMemcpyAsync(dev_p[i], host[i], (size_t)n * elem[i],
                                          cudaMemcpyHostToDevice, c->stream),
                          "index upload");
    }
    return st;
}

static void cuda_kv_stamp(pd_backend_t *be, void *arena, const kv_layout_t *l, const int32_t *pages,
                          const kv_tag_t *tags, int n)
{
    cuda_t *c = cuda__get(be);
    const void *host[2] = {pages, tags};
    const size_t elem[2] = {sizeof *pages, sizeof *tags};
    void *dev[2];
    pd_status_t st;
    if (n <= 0)
        return;
    st = cuda__upload_idx(c, n, 2, host, elem, dev);
    if (st == PD_OK)
        st = kv_stamp(arena, l, dev[0], dev[1], n, c->stream);
    cuda__note(c, st);
}

static void cuda_kv_check(pd_backend_t *be, uint8_t *bad_out, kv_tag_t *found_out,
                          const void *arena, const kv_layout_t *l, const int32_t *pages,
                          const kv_tag_t *expected, const kv_tag_t *current, int n)
{
    cuda_t *c = cuda__get(be);
    pd_status_t st;
    if (n <= 0)
        return;
    /* once per decode step, on its critical path: the three inputs go up in one copy and the two
     * results come down in one, both through pinned memory, laid out as the idx slots: pages,
     * expected, current, then found (n) 64-bit tags and bad (n) uint8 */
    const size_t each = cuda__idx_slot(n);
    st = cuda__grow(c, &c->idx, each * 5);
    if (st == PD_OK)
        st = cuda__grow_pin(c, each * 5);
    uint8_t *h = c->pin.p, *d = c->idx.p;
    if (st == PD_OK) {
        memcpy(h, pages, (size_t)n * sizeof *pages);
        memcpy(h + each, expected, (size_t)n * sizeof *expected);
        memcpy(h + 2 * each, current, (size_t)n * sizeof *current);
        st = cuda__status(cudaMemcpyAsync(d, h, 3 * each, cudaMemcpyHostToDevice, c->stream),
                          "kv_check upload");
    }
    if (st == PD_OK)
        st = kv_check(d + 4 * each, (kv_tag_t *)(d + 3 * each), arena, l, (const int32_t *)d,
                      (const kv_tag_t *)(d + each), (const kv_tag_t *)(d + 2 * each), n, c->stream);
    if (st == PD_OK)
        st = cuda__status(cudaMemcpyAsync(h + 3 * each, d + 3 * each, each + (size_t)n,
                                          cudaMemcpyDeviceToHost, c->stream),
                          "kv_check download");
    if (st == PD_OK)
        st = cuda__status(cudaStreamSynchronize(c->stream), "kv_check sync");
    if (st == PD_OK) {
        memcpy(found_out, h + 3 * each, (size_t)n * sizeof *found_out);
        memcpy(bad_out, h + 4 * each, (size_t)n);
    } else { /* the caller reads the results: report every page as bad */
        memset(bad_out, 2, (size_t)n);
        memset(found_out, 0, (size_t)n * sizeof *found_out);
    }
    cuda__note(c, st);
}

static pd_status_t cuda_page_digest(pd_backend_t *be, uint64_t *digests_out, const void *base,
                                    size_t page_bytes, const int32_t *pages, int n)
{
    cuda_t *c = cuda__get(be);
    const void *host[1] = {pages};
    const size_t elem[1] = {sizeof *pages};
    void *dev[1] = {NULL};
    pd_status_t st = c->err;
    c->err = PD_OK;
    if (st != PD_OK || n <= 0)
        return st;
    /* the digests go in the slot after the page ids */
    st = pages ? cuda__upload_idx(c, n, 1, host, elem, dev)
               : cuda__grow(c, &c->idx, cuda__idx_slot(n) * 3);
    uint64_t *d_out = (uint64_t *)((uint8_t *)c->idx.p + cuda__idx_slot(n));
    if (st == PD_OK)
        st = kv_digest(d_out, base, page_bytes, dev[0], n, c->stream);
    if (st == PD_OK)
        st = cuda__status(cudaMemcpyAsync(digests_out, d_out, (size_t)n * sizeof *digests_out,
                                          cudaMemcpyDeviceToHost, c->stream),
                          "page_digest download");
    if (st == PD_OK)
        st = cuda__status(cudaStreamSynchronize(c->stream), "page_digest sync");
    return st;
}

static void cuda_kv_export(pd_backend_t *be, void *dst, const kv_layout_t *dst_l, const void *arena,
                           const kv_layout_t *src_l, const int32_t *src_pages, int n_pages)
{
    cuda_t *c = cuda__get(be);
    const void *host[1] = {src_pages};
    const size_t elem[1] = {sizeof *src_pages};
    void *dev[1];
    pd_status_t st;
    if (n_pages <= 0)
        return;
    st = cuda__upload_idx(c, n_pages, 1, host, elem, dev);
    if (st == PD_OK)
        st = kv_export(dst, dst_l, arena, src_l, dev[0], n_pages, c->stream);
    cuda__note(c, st);
}

/* ==== the KV transfer stream ==== */

/* The transfer stream, behind everything enqueued on the compute stream so far. */
static pd_status_t cuda__xfer_behind(cuda_t *c)
{
    pd_status_t st = PD_OK;
    if (c->capturing) {
        pd_log_error("backend cuda: transfer stream inside a graph capture");
        return PD_ERR_INTERNAL;
    }
    if (!c->xstream &&
        (st = cuda__status(cudaStreamCreateWithFlags(&c->xstream, cudaStreamNonBlocking),
                           "transfer stream")) != PD_OK)
        return st;
    if (!c->xevent &&
        (st = cuda__status(cudaEventCreateWithFlags(&c->xevent, cudaEventDisableTiming),
                           "transfer event")) != PD_OK)
        return st;
    if ((st = cuda__status(cudaEventRecord(c->xevent, c->stream), "transfer event")) != PD_OK)
        return st;
    return cuda__status(cudaStreamWaitEvent(c->xstream, c->xevent, 0), "transfer wait");
}

static void cuda_xfer_kv_export(pd_backend_t *be, void *dst, const kv_layout_t *dst_l,
                                const int32_t *dst_pages, const kv_tag_t *tags, const void *arena,
                                const kv_layout_t *src_l, const int32_t *src_pages, int n,
                                int layer0, int n_layers)
{
    cuda_t *c = cuda__get(be);
    pd_status_t st;
    if (n <= 0 || n_layers <= 0)
        return;
    if ((st = cuda__xfer_behind(c)) == PD_OK)
        st = kv_export_layers(dst, dst_l, dst_pages, tags, arena, src_l, src_pages, n, layer0,
                              n_layers, c->xstream);
    if (st != PD_OK && c->xerr == PD_OK)
        c->xerr = st;
}

static void cuda_xfer_download(pd_backend_t *be, void *dst_host, const void *src, size_t bytes)
{
    cuda_t *c = cuda__get(be);
    pd_status_t st;
    if (bytes == 0)
        return;
    if ((st = cuda__xfer_behind(c)) == PD_OK)
        st = cuda__status(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, c->xstream),
                          "transfer download");
    if (st != PD_OK && c->xerr == PD_OK)
        c->xerr = st;
}

static pd_status_t cuda_xfer_sync(pd_backend_t *be)
{
    cuda_t *c = cuda__get(be);
    pd_status_t st =
        c->xstream ? cuda__status(cudaStreamSynchronize(c->xstream), "transfer sync") : PD_OK;
    if (st == PD_OK)
        st = c->xerr;
    c->xerr = PD_OK;
    return st;
}

/* ==== GLM-4.5 / DeepSeek-V3 (kernels/family.h) ==== */

static void cuda_bias_add(pd_backend_t *be, float *x, const float *bias, int n, int d)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, family_bias_add(x, bias, n, d, c->stream));
}

static void cuda_rope_partial(pd_backend_t *be, float *x, const int32_t *pos, const float *inv_freq,
                              int n, int n_heads, int head_dim, int rot_dim, bool interleave,
                              float scale)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, family_rope_partial(x, pos, inv_freq, n, n_heads, head_dim, rot_dim, interleave,
                                      scale, c->stream));
}

static void cuda_moe_route_grouped(pd_backend_t *be, int32_t *ids, float *weights,
                                   const float *logits, const float *bias, int n, int n_experts,
                                   int k, int n_group, int topk_group, bool norm, float scale)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, family_moe_route_grouped(ids, weights, logits, bias, n, n_experts, k, n_group,
                                           topk_group, norm, scale, c->stream));
}

static void cuda_head_matmul(pd_backend_t *be, float *out, const float *x, const uint16_t *w, int n,
                             int n_heads, int nout, int kin, int x_stride)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, family_head_matmul(out, x, w, n, n_heads, nout, kin, x_stride, c->stream));
}

static void cuda_latent_write(pd_backend_t *be, void *arena, const kv_layout_t *l, int layer,
                              const float *cl, const float *kpe, const int32_t *slots, int n, int r)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, family_latent_write(arena, l, layer, cl, kpe, slots, n, r, c->stream));
}

static void cuda_latent_attention(pd_backend_t *be, float *out, const float *q_lat,
                                  const float *q_pe, const void *arena, const kv_layout_t *l,
                                  int layer, const pd_attn_batch_t *b, int n_heads, int r,
                                  int pe_stride, float scale)
{
    cuda_t *c = cuda__get(be);
    int n_rows = b->n_rows;
    pd_status_t st = PD_OK;

    if (n_rows <= 0) { /* as cuda__attention: read the row count back (not inside a capture) */
        if (c->capturing) {
            pd_log_error("backend cuda: latent attention without a row count inside a capture");
            st = PD_ERR_INTERNAL;
        } else if ((st = cuda__status(cudaMemcpyAsync(&n_rows, b->q_start + b->n_seqs, 4,
                                                      cudaMemcpyDeviceToHost, c->stream),
                                      "latent attention rows")) == PD_OK) {
            st = cuda__status(cudaStreamSynchronize(c->stream), "latent attention rows");
        }
    }
    if (st == PD_OK)
        st = family_latent_attention(out, q_lat, q_pe, arena, l, layer, b->q_start, b->ctx_len,
                                     b->block_tables, b->n_seqs, b->max_pages, n_rows, n_heads, r,
                                     pe_stride, scale, c->stream);
    cuda__note(c, st);
}

/* ==== MoE ==== */

static void cuda_moe_route(pd_backend_t *be, int32_t *ids, float *weights, const float *logits,
                           int n, int n_experts, int k, bool norm)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, moe_route(ids, weights, logits, n, n_experts, k, norm, c->stream));
}

/* ==== MoE on the device: registered layers, grouped matmuls ==== */

static void cuda__moe_layers_free(cuda_t *c)
{
    for (int i = 0; i < c->n_moe_layers; i++) {
        free(c->moe_layers[i].copy);
        if (c->moe_layers[i].d_tab)
            cudaFree(c->moe_layers[i].d_tab);
    }
    free(c->moe_layers);
    c->moe_layers = NULL;
    c->n_moe_layers = c->cap_moe_layers = 0;
}

/* The registered layer of (gate_up, down) whose pointers are still those registered, or NULL. */
static const cuda_moe_layer_t *cuda__moe_layer(const cuda_t *c, const pd_weight_t *gate_up,
                                               const pd_weight_t *down)
{
    for (int i = 0; i < c->n_moe_layers; i++) {
        const cuda_moe_layer_t *L = &c->moe_layers[i];
        const size_t E = (size_t)L->n_experts;
        if (L->gate_up == gate_up && L->down == down &&
            memcmp(L->copy, gate_up, E * sizeof *gate_up) == 0 &&
            memcmp(L->copy + E, down, E * sizeof *down) == 0)
            return L;
    }
    return NULL;
}

/* Whether the grouped path takes these weights: one format of moe_gmm for all, shapes it needs. */
static bool cuda__moe_gmm_ok(const pd_weight_t *w, int n_experts)
{
    for (int e = 0; e < n_experts; e++) {
        const pd_weight_t *x = &w[e];
        if (x->fmt != w[0].fmt || x->n != w[0].n || x->k != w[0].k ||
            !(x->fmt == PD_WFMT_BF16 || x->fmt == PD_WFMT_FP8 || x->fmt == PD_WFMT_INT4) ||
            x->k % 8 != 0 || (x->fmt == PD_WFMT_FP8 && x->k % 16 != 0) ||
            (x->fmt == PD_WFMT_INT4 && x->k % 128 != 0))
            return false;
    }
    return true;
}

static pd_status_t cuda_moe_prepare(pd_backend_t *be, const pd_weight_t *gate_up,
                                    const pd_weight_t *down, int n_experts)
{
    cuda_t *c = cuda__get(be);
    cuda_moe_layer_t *L = NULL;
    pd_status_t st;

    if (c->no_moe_grouped || n_experts <= 0 || n_experts > MOE_MAX_EXPERTS ||
        !cuda__moe_gmm_ok(gate_up, n_experts) || !cuda__moe_gmm_ok(down, n_experts))
        return PD_ERR_INVALID;
    if (c->capturing) {
        pd_log_error("backend cuda: moe_prepare inside a graph capture");
        return PD_ERR_INTERNAL;
    }
    for (int i = 0; i < c->n_moe_layers && !L; i++)
        if (c->moe_layers[i].gate_up == gate_up)
            L = &c->moe_layers[i];
    if (!L) {
        if (c->n_moe_layers == c->cap_moe_layers) {
            int cap = c->cap_moe_layers ? 2 * c->cap_moe_layers : 16;
            cuda_moe_layer_t *ls = realloc(c->moe_layers, (size_t)cap * sizeof *ls);
            if (!ls)
                return PD_ERR_NOMEM;
            c->moe_layers = ls;
            c->cap_moe_layers = cap;
        }
        L = &c->moe_layers[c->n_moe_layers++];
        memset(L, 0, sizeof *L);
    }
    const size_t E = (size_t)n_experts;
    free(L->copy);
    if (L->d_tab)
        cudaFree(L->d_tab);
    L->d_tab = NULL;
    L->gate_up = gate_up;
    L->down = down;
    L->n_experts = n_experts;
    L->copy = malloc(2 * E * sizeof *L->copy);
    moe_wtab_t *h = malloc(2 * E * sizeof *h);
    if (!L->copy || !h) {
        free(h);
        L->n_experts = 0; /* matches nothing */
        return PD_ERR_NOMEM;
    }
    memcpy(L->copy, gate_up, E * sizeof *gate_up);
    memcpy(L->copy + E, down, E * sizeof *down);
    for (size_t e = 0; e < 2 * E; e++)
        h[e] = (moe_wtab_t){L->copy[e].data, L->copy[e].scales, L->copy[e].zeros};
    st = cuda__status(cudaMalloc((void **)&L->d_tab, 2 * E * sizeof *h), "moe tables");
    if (st == PD_OK)
        st = cuda__status(cudaMemcpy(L->d_tab, h, 2 * E * sizeof *h, cudaMemcpyHostToDevice),
                          "moe tables");
    free(h);
    if (st != PD_OK)
        L->n_experts = 0;
    return st;
}

/* The grouped expert matmul the backend is set to (c->moe_gmm: 1 moe_gmm, 2 moe_gmm2, 3
 * moe_gmm3; moe.h), m grouped rows in all. */
static pd_status_t cuda__gmm(cuda_t *c, float *out, const float *x, const float *xs,
                             const moe_wtab_t *tab, pd_wfmt_t fmt, bool tiled,
                             const int32_t *offsets, const int32_t *active, int n_experts,
                             int max_active, int m, int64_t N, int64_t K)
{
    if (c->moe_gmm == 3)
        return moe_gmm3(out, x, xs, tab, fmt, tiled, offsets, active, n_experts, max_active, m, N,
                        K, c->stream);
    return (c->moe_gmm == 2 ? moe_gmm2 : moe_gmm)(out, x, xs, tab, fmt, tiled, offsets, active,
                                                  n_experts, max_active, N, K, c->stream);
}

/* The grouped path of moe_experts (a registered layer, m = n * k <= MOE_GROUP_MAX_M): routing
 * grouped on the device (moe_group), the rows gathered, gate_up for all experts in one grouped
 * matmul, silu_mul, down likewise, the weighted combine. No host readback: capturable. FP8
 * weights get their activations quantized per row first (matmul_quant_act_fp8, as the CPU's W8A8
 * matmul). */
static pd_status_t cuda__moe_grouped(cuda_t *c, const cuda_moe_layer_t *L, float *out,
                                     const float *x, const int32_t *ids, const float *weights,
                                     int n, int k, int d, int f)
{
    const size_t m = (size_t)n * k, E = (size_t)L->n_experts, kmax = (size_t)(d > f ? d : f);
    const pd_weight_t *gu_w = &L->copy[0], *dn_w = &L->copy[E];
    const bool fp8 = gu_w->fmt == PD_WFMT_FP8;
    const int max_active = (int)(m < E ? m : E);
    pd_status_t st;

    if (gu_w->n != 2 * (int64_t)f || gu_w->k != d || dn_w->n != d || dn_w->k != f) {
        pd_log_error("backend cuda: moe_experts: weights (%lld, %lld) / (%lld, %lld) for d %d f %d",
                     (long long)gu_w->n, (long long)gu_w->k, (long long)dn_w->n, (long long)dn_w->k,
                     d, f);
        return PD_ERR_INVALID;
    }
    /* scratch: offsets, active (E + 1 each), perm, inv (m each) int32; xg (m, d), gu (m, 2f),
     * act (m, f), y (m, d), xf (m, max(d, f)), xs (m) f32 */
#define CUDA__AL(b) (((b) + 255) / 256 * 256)
    const size_t o_off = 0, o_act_ids = o_off + CUDA__AL((E + 1) * 4),
                 o_perm = o_act_ids + CUDA__AL((E + 1) * 4), o_inv = o_perm + CUDA__AL(m * 4),
                 o_xg = o_inv + CUDA__AL(m * 4), o_gu = o_xg + CUDA__AL(m * d * 4),
                 o_a = o_gu + CUDA__AL(m * 2 * f * 4), o_y = o_a + CUDA__AL(m * f * 4),
                 o_xf = o_y + CUDA__AL(m * d * 4), o_xs = o_xf + CUDA__AL(m * kmax * 4),
                 total = o_xs + CUDA__AL(m * 4);
#undef CUDA__AL
    if ((st = cuda__grow(c, &c->moe, total)) != PD_OK)
        return st;
    uint8_t *base = c->moe.p;
    int32_t *offsets = (int32_t *)(base + o_off), *active = (int32_t *)(base + o_act_ids),
            *perm = (int32_t *)(base + o_perm), *inv = (int32_t *)(base + o_inv);
    float *xg = (float *)(base + o_xg), *gu = (float *)(base + o_gu), *act = (float *)(base + o_a),
          *y = (float *)(base + o_y), *xf = (float *)(base + o_xf), *xs = (float *)(base + o_xs);
    const bool t_gu = gu_w->fmt == PD_WFMT_INT4 && cuda__int4_tiled(gu_w),
               t_dn = dn_w->fmt == PD_WFMT_INT4 && cuda__int4_tiled(dn_w);
    if ((st = moe_group(offsets, perm, inv, active, ids, (int)m, (int)E, c->stream)) != PD_OK ||
        (st = moe_gather(xg, x, perm, (int)m, k, d, c->stream)) != PD_OK)
        return st;
    if (fp8 && (st = matmul_quant_act_fp8(NULL, xf, xs, xg, (int)m, d, c->stream)) != PD_OK)
        return st;
    if ((st = cuda__gmm(c, gu, fp8 ? xf : xg, fp8 ? xs : NULL, L->d_tab, gu_w->fmt, t_gu, offsets,
                        active, (int)E, max_active, (int)m, 2 * (int64_t)f, d)) != PD_OK ||
        (st = elementwise_silu_mul(act, gu, (int)m, f, c->stream)) != PD_OK)
        return st;
    const bool fp8d = dn_w->fmt == PD_WFMT_FP8;
    if (fp8d && (st = matmul_quant_act_fp8(NULL, xf, xs, act, (int)m, f, c->stream)) != PD_OK)
        return st;
    if ((st = cuda__gmm(c, y, fp8d ? xf : act, fp8d ? xs : NULL, L->d_tab + E, dn_w->fmt, t_dn,
                        offsets, active, (int)E, max_active, (int)m, d, f)) != PD_OK)
        return st;
    return moe_combine(out, y, inv, weights, n, k, d, c->stream);
}

/* moe_experts: the grouped device path for a registered layer (cuda__moe_grouped); otherwise
 * groups the (token, slot) pairs by expert on the host, then per expert: gather its rows,
 * gate_up, silu_mul, down into the grouped output; finally the weighted combine. */
static pd_status_t cuda__moe(cuda_t *c, float *out, const float *x, const int32_t *ids,
                             const float *weights, const pd_weight_t *gate_up,
                             const pd_weight_t *down, int n, int k, int d, int f)
{
    const size_t m = (size_t)n * k;
    int n_experts = 0;
    pd_status_t st;

    if (n <= 0)
        return PD_OK;
    const cuda_moe_layer_t *L =
        m <= MOE_GROUP_MAX_M && !c->no_moe_grouped ? cuda__moe_layer(c, gate_up, down) : NULL;
    if (L && L->d_tab)
        return cuda__moe_grouped(c, L, out, x, ids, weights, n, k, d, f);
    if (c->capturing) { /* routing is read back to the host */
        pd_log_error("backend cuda: moe_experts cannot be captured in a graph");
        return PD_ERR_UNSUPPORTED;
    }
    if (m > c->h_cap) {
        free(c->h_ids);
        free(c->h_perm);
        c->h_ids = malloc(m * 4);
        c->h_perm = malloc(m * 8);
        c->h_cap = c->h_ids && c->h_perm ? m : 0;
        if (!c->h_cap)
            return PD_ERR_NOMEM;
    }
    if ((st = cuda__status(cudaMemcpyAsync(c->h_ids, ids, m * 4, cudaMemcpyDeviceToHost, c->stream),
                           "moe ids")) != PD_OK ||
        (st = cuda__status(cudaStreamSynchronize(c->stream), "moe ids")) != PD_OK)
        return st;
    for (size_t i = 0; i < m; i++)
        n_experts = c->h_ids[i] + 1 > n_experts ? c->h_ids[i] + 1 : n_experts;
    /* perm (m): slots grouped by expert; inv (m): slot -> grouped row */
    int32_t *perm = c->h_perm, *inv = c->h_perm + m;
    size_t pos = 0;
    for (int e = 0; e < n_experts; e++)
        for (size_t i = 0; i < m; i++)
            if (c->h_ids[i] == e) {
                inv[i] = (int32_t)pos;
                perm[pos++] = (int32_t)i;
            }
    /* device scratch: perm+inv (2m int32), xg (m, d), gu (m, 2f), act (m, f), y (m, d) */
    size_t o_idx = 0, o_xg = (m * 8 + 255) / 256 * 256, o_gu = o_xg + m * d * 4,
           o_act = o_gu + m * 2 * f * 4, o_y = o_act + m * f * 4, total = o_y + m * d * 4;
    if ((st = cuda__grow(c, &c->moe, total)) != PD_OK)
        return st;
    uint8_t *base = c->moe.p;
    int32_t *d_perm = (int32_t *)(base + o_idx), *d_inv = d_perm + m;
    float *xg = (float *)(base + o_xg), *gu = (float *)(base + o_gu),
          *act = (float *)(base + o_act), *y = (float *)(base + o_y);
    if ((st = cuda__status(cudaMemcpyAsync(d_perm, perm, m * 8, cudaMemcpyHostToDevice, c->stream),
                           "moe perm")) != PD_OK)
        return st;
    if ((st = moe_gather(xg, x, d_perm, (int)m, k, d, c->stream)) != PD_OK)
        return st;
    size_t row = 0;
    for (int e = 0; e < n_experts; e++) {
        int cnt = 0;
        while (row + cnt < m && c->h_ids[perm[row + cnt]] == e)
            cnt++;
        if (!cnt)
            continue;
        if ((st = cuda__matmul(c, gu + row * 2 * f, xg + row * d, &gate_up[e], cnt)) != PD_OK ||
            (st = elementwise_silu_mul(act + row * f, gu + row * 2 * f, cnt, f, c->stream)) !=
                PD_OK ||
            (st = cuda__matmul(c, y + row * d, act + row * f, &down[e], cnt)) != PD_OK)
            return st;
        row += cnt;
    }
    return moe_combine(out, y, d_inv, weights, n, k, d, c->stream);
}

static void cuda_moe_experts(pd_backend_t *be, float *out, const float *x, const int32_t *ids,
                             const float *weights, const pd_weight_t *gate_up,
                             const pd_weight_t *down, int n, int k, int d, int f)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, cuda__moe(c, out, x, ids, weights, gate_up, down, n, k, d, f));
}

/* ==== sampling ==== */

static void cuda_sample(pd_backend_t *be, int32_t *tokens_out, const float *logits, int n,
                        int vocab, const float *temperature, const int32_t *top_k,
                        const float *top_p, const float *u)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, sample_run(tokens_out, logits, n, vocab, temperature, top_k, top_p, u,
                             c->sample_scratch, c->stream));
}

static void cuda_logprobs(pd_backend_t *be, int32_t *ids_out, float *vals_out, const float *logits,
                          const int32_t *tokens, const int32_t *n_top, int n, int vocab)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c,
               sample_logprobs_run(ids_out, vals_out, logits, tokens, n_top, n, vocab, c->stream));
}

static void cuda_logits_process(pd_backend_t *be, float *logits, int n, int vocab,
                                const int32_t *ent, const float *bias, int n_ent, const float *pen)
{
    cuda_t *c = cuda__get(be);
    cuda__note(c, logits_process_run(logits, n, vocab, ent, bias, n_ent, pen, c->stream));
}

/* ==== graphs ==== */

typedef struct {
    cudaGraphExec_t exec;
    uint64_t epoch; /* scratch_epoch at capture */
} cuda_graph_t;

static pd_status_t cuda_graph_begin(pd_backend_t *be)
{
    cuda_t *c = cuda__get(be);
    PD_ASSERT(!c->capturing);
    pd_status_t st = cuda__status(
        cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "graph begin");
    if (st == PD_OK) {
        c->capturing = true;
        c->cap_err = PD_OK;
    }
    return st;
}

static pd_status_t cuda_graph_end(pd_backend_t *be, void **graph_p)
{
    cuda_t *c = cuda__get(be);
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cuda_graph_t *h;
    PD_ASSERT(c->capturing);
    c->capturing = false;
    pd_status_t st = cuda__status(cudaStreamEndCapture(c->stream, &g), "graph end");
    if (st == PD_OK && c->cap_err != PD_OK)
        st = c->cap_err;
    if (st == PD_OK)
        st = cuda__status(cudaGraphInstantiate(&exec, g, 0), "graph instantiate");
    if (g)
        cudaGraphDestroy(g);
    cudaGetLastError(); /* a broken capture leaves a sticky-free error behind */
    if (st != PD_OK)
        goto err_exec;
    if (!(h = malloc(sizeof *h))) {
        st = PD_ERR_NOMEM;
        goto err_exec;
    }
    h->exec = exec;
    h->epoch = c->scratch_epoch;
    *graph_p = h;
    return PD_OK;
err_exec:
    if (exec)
        cudaGraphExecDestroy(exec);
    return st;
}

static pd_status_t cuda_graph_launch(pd_backend_t *be, void *graph)
{
    cuda_t *c = cuda__get(be);
    cuda_graph_t *h = graph;
    if (h->epoch != c->scratch_epoch)
        return PD_AGAIN;
    return cuda__status(cudaGraphLaunch(h->exec, c->stream), "graph launch");
}

static void cuda_graph_free(pd_backend_t *be, void *graph)
{
    cuda_graph_t *h = graph;
    (void)be;
    if (!h)
        return;
    cudaGraphExecDestroy(h->exec);
    free(h);
}

/* ==== table ==== */

static bool cuda_supports_op(pd_backend_t *be, pd_op_t op, int variant)
{
    (void)be;
    (void)variant;
    return op < PD_OP__COUNT;
}

static void cuda__free_buf(cuda_buf_t *b)
{
    if (b->p)
        cudaFree(b->p);
    b->p = NULL;
    b->bytes = 0;
}

static void cuda_destroy(pd_backend_t *be)
{
    cuda_t *c;
    if (!be)
        return;
    c = cuda__get(be);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    cuda__free_buf(&c->act);
    cuda__free_buf(&c->wtmp);
    cuda__free_buf(&c->attn);
    cuda__free_buf(&c->qkv16);
    cuda__free_buf(&c->idx);
    if (c->pin.p)
        cudaFreeHost(c->pin.p);
    cuda__free_buf(&c->moe);
    cuda__free_buf(&c->grp);
    if (c->lt_ws)
        cudaFree(c->lt_ws);
    if (c->blas_ws)
        cudaFree(c->blas_ws);
    if (c->sample_scratch)
        cudaFree(c->sample_scratch);
    if (c->lt)
        cublasLtDestroy(c->lt);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->xstream) {
        cudaStreamSynchronize(c->xstream);
        cudaStreamDestroy(c->xstream);
    }
    if (c->xevent)
        cudaEventDestroy(c->xevent);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c->h_ids);
    free(c->h_perm);
    cuda__moe_layers_free(c);
    free(c);
    free(be);
}

static pd_status_t cuda_set_option(pd_backend_t *be, const char *key, const char *value);

static const pd_backend_ops_t cuda_ops = {
    .name = "cuda",
    .supports_op = cuda_supports_op,
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .memset = cuda_memset,
    .copy = cuda_copy,
    .sync = cuda_sync,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .add = cuda_add,
    .matmul = cuda_matmul,
    .rope = cuda_rope,
    .silu_mul = cuda_silu_mul,
    .kv_write = cuda_kv_write,
    .attention = cuda_attention,
    .moe_route = cuda_moe_route,
    .moe_experts = cuda_moe_experts,
    .moe_prepare = cuda_moe_prepare,
    .kv_stamp = cuda_kv_stamp,
    .kv_check = cuda_kv_check,
    .page_digest = cuda_page_digest,
    .kv_export = cuda_kv_export,
    .xfer_kv_export = cuda_xfer_kv_export,
    .xfer_download = cuda_xfer_download,
    .xfer_sync = cuda_xfer_sync,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .weight_prepare = cuda_weight_prepare,
    .sample = cuda_sample,
    .logprobs = cuda_logprobs,
    .add_rmsnorm = cuda_add_rmsnorm,
    .silu_mul_fp8 = cuda_silu_mul_fp8,
    .matmul_silu_fp8 = cuda_matmul_silu_fp8,
    .matmul_fp8 = cuda_matmul_fp8,
    .act_quant = cuda_act_quant,
    .set_option = cuda_set_option,
    .rope_kv_write = cuda_rope_kv_write,
    .matmul_group = cuda_matmul_group,
    .matmul_group_fp8 = cuda_matmul_group_fp8,
    .matmul_fused_ok = cuda_matmul_fused_ok,
    .matmul_fused = cuda_matmul_fused,
    .qkv_rope_write = cuda_qkv_rope_write,
    .logits_process = cuda_logits_process,
    .bias_add = cuda_bias_add,
    .rope_partial = cuda_rope_partial,
    .moe_route_grouped = cuda_moe_route_grouped,
    .head_matmul = cuda_head_matmul,
    .latent_write = cuda_latent_write,
    .latent_attention = cuda_latent_attention,
};

/* cuda_ops without the fused ops (option fused=off), made once */
static pd_backend_ops_t cuda_ops_plain;
static pthread_once_t cuda_ops_plain_once = PTHREAD_ONCE_INIT;

static void cuda__ops_plain_init(void)
{
    cuda_ops_plain = cuda_ops;
    cuda_ops_plain.add_rmsnorm = NULL;
    cuda_ops_plain.silu_mul_fp8 = NULL;
    cuda_ops_plain.matmul_fp8 = NULL;
    cuda_ops_plain.act_quant = NULL;
    cuda_ops_plain.matmul_silu_fp8 = NULL;
    cuda_ops_plain.qkv_rope_write = NULL;
    cuda_ops_plain.matmul_group = NULL;
    cuda_ops_plain.matmul_group_fp8 = NULL;
    cuda_ops_plain.matmul_fused_ok = NULL;
    cuda_ops_plain.matmul_fused = NULL;
}

enum { CUDA__ENV_BF16 = 1, CUDA__ENV_FLASH = 2, CUDA__ENV_FUSED = 4, CUDA__ENV_ACCUM = 8 };
enum { CUDA__ENV_PDL = 16, CUDA__ENV_INT4 = 32, CUDA__ENV_GEMV_FUSE = 64, CUDA__ENV_W8WG = 128 };
enum { CUDA__ENV_W4CL = 256, CUDA__ENV_F8GRP = 512 };

/* on / off (also 1 / 0); -1 for anything else */
static int cuda__onoff(const char *v)
{
    return !strcmp(v, "on") || !strcmp(v, "1") ? 1 : !strcmp(v, "off") || !strcmp(v, "0") ? 0 : -1;
}

static void cuda__set_fused(pd_backend_t *be, bool on)
{
    cuda_t *c = cuda__get(be);
    pthread_once(&cuda_ops_plain_once, cuda__ops_plain_init);
    c->no_fused = !on;
    be->ops = on ? &cuda_ops : &cuda_ops_plain;
}

/* Option pdl: programmatic dependent launch (kernels/kutil.cuh) only on compute capability 9.0+
 * (below, every launch stays plain). The switch is process-wide (matmul_set_pdl): the backend
 * created or set last decides, which is fine for one backend per process (and for the tests,
 * which set it on the one backend they measure). */
static void cuda__set_pdl(cuda_t *c, int on)
{
    c->pdl = on && c->cc_major >= 9;
    matmul_set_pdl(c->pdl);
}

/* The options of backend_cuda.h; an option whose environment variable is set keeps the
 * environment's value (logged). */
static pd_status_t cuda_set_option(pd_backend_t *be, const char *key, const char *value)
{
    cuda_t *c = cuda__get(be);
    const int b = cuda__onoff(value);
    unsigned bit = 0;
    bool ok = true;
    if (!strcmp(key, "bf16_gemm")) {
        ok = !strcmp(value, "one") || !strcmp(value, "split");
        bit = CUDA__ENV_BF16;
        if (ok && !(c->env_set & bit))
            c->bf16_split = !strcmp(value, "split");
    } else if (!strcmp(key, "flash")) {
        ok = b >= 0;
        bit = CUDA__ENV_FLASH;
        if (ok && !(c->env_set & bit))
            c->no_flash = !b;
    } else if (!strcmp(key, "fused")) {
        ok = b >= 0;
        bit = CUDA__ENV_FUSED;
        if (ok && !(c->env_set & bit))
            cuda__set_fused(be, b);
    } else if (!strcmp(key, "gemv_fuse")) {
        ok = b >= 0;
        bit = CUDA__ENV_GEMV_FUSE;
        const bool lv = !strcmp(value, "1") || !strcmp(value, "2") || !strcmp(value, "3");
        ok = ok || lv;
        if (ok && !(c->env_set & bit))
            c->gemv_fuse = lv ? value[0] - '0' : b ? 2 : 0;
    } else if (!strcmp(key, "fp8_accum")) {
        ok = !strcmp(value, "fast") || !strcmp(value, "exact");
        bit = CUDA__ENV_ACCUM;
        if (ok && !(c->env_set & bit))
            c->lt_opts.fast_accum = !strcmp(value, "fast");
    } else if (!strcmp(key, "int4_gemm")) {
        ok = !strcmp(value, "fp8") || !strcmp(value, "bf16");
        bit = CUDA__ENV_INT4;
        if (ok && !(c->env_set & bit))
            c->int4_fp8 = !strcmp(value, "fp8");
    } else if (!strcmp(key, "moe_grouped")) {
        ok = b >= 0;
        if (ok)
            c->no_moe_grouped = !b;
    } else if (!strcmp(key, "pdl")) {
        ok = b >= 0;
        bit = CUDA__ENV_PDL;
        if (ok && !(c->env_set & bit))
            cuda__set_pdl(c, b);
    } else if (!strcmp(key, "w8wg")) { /* off | on (every n <= CUDA_W8WG_MAX_N) | from n N */
        char *end = NULL;
        const long v = b >= 0 ? b : strtol(value, &end, 10);
        ok = b >= 0 || (end && *end == '\0' && end != value && v >= 0 && v <= CUDA_W8WG_MAX_N);
        bit = CUDA__ENV_W8WG;
        if (ok && !(c->env_set & bit))
            c->w8wg_min_n = v > 0 && matmul_w8wg_usable() ? (int)v : 0;
    } else if (!strcmp(key, "w4wg_cluster")) {
        ok = b >= 0;
        bit = CUDA__ENV_W4CL;
        if (ok && !(c->env_set & bit))
            c->w4wg_cluster = b;
    } else if (!strcmp(key, "fp8_group")) {
        ok = b >= 0;
        bit = CUDA__ENV_F8GRP;
        if (ok && !(c->env_set & bit))
            c->fp8_group = b;
    } else if (!strcmp(key, "flash_variant")) {
        char *end = NULL;
        long v = strcmp(value, "auto") ? strtol(value, &end, 10) : -1;
        ok = !end || (*end == '\0' && end != value && v >= 0 && v <= 5);
        if (ok)
            c->flash_variant = (int)v;
    } else {
        pd_log_error("backend cuda: unknown option '%s' (bf16_gemm, flash, flash_variant, fused, "
                     "gemv_fuse, fp8_accum, fp8_group, int4_gemm, moe_grouped, pdl, w4wg_cluster, "
                     "w8wg)",
                     key);
        return PD_ERR_INVALID;
    }
    if (!ok) {
        pd_log_error("backend cuda: option %s: bad value '%s'", key, value);
        return PD_ERR_INVALID;
    }
    if (c->env_set & bit)
        pd_log_info("backend cuda: option %s=%s: the environment's setting stays", key, value);
    return PD_OK;
}

void *backend_cuda_stream(pd_backend_t *be)
{
    return be && be->ops->destroy == cuda_destroy ? cuda__get(be)->stream : NULL;
}

int backend_cuda_set_moe_gmm(pd_backend_t *be, int kernel)
{
    if (!be || be->ops->destroy != cuda_destroy || kernel < 1 || kernel > 3)
        return 0;
    const int was = cuda__get(be)->moe_gmm;
    cuda__get(be)->moe_gmm = kernel;
    return was;
}

int backend_cuda_set_int4_fp8(pd_backend_t *be, int on)
{
    if (!be || be->ops->destroy != cuda_destroy)
        return -2;
    const int was = cuda__get(be)->int4_fp8;
    cuda__get(be)->int4_fp8 = on ? 1 : 0;
    return was;
}

bool backend_cuda_lt(pd_backend_t *be, void **lt_p, void **ws_p, size_t *ws_bytes_p)
{
    if (!be || be->ops->destroy != cuda_destroy)
        return false;
    cuda_t *c = cuda__get(be);
    *lt_p = c->lt;
    *ws_p = c->lt_ws;
    *ws_bytes_p = CUDA_LT_WS_BYTES;
    return true;
}

pd_status_t backend_cuda_create(int device, pd_backend_t **be_p)
{
    int count = 0;
    pd_backend_t *be;
    cuda_t *c;
    pd_status_t st;

    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        pd_log_error("backend cuda: no CUDA device");
        return PD_ERR_UNSUPPORTED;
    }
    if (device < 0 || device >= count) {
        pd_log_error("backend cuda: device %d out of range (%d devices)", device, count);
        return PD_ERR_INVALID;
    }
    be = calloc(1, sizeof *be);
    c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return PD_ERR_NOMEM;
    }
    be->ops = &cuda_ops;
    be->impl = c;
    be->n_threads = 1;
    c->device = device;
    c->flash_variant = -1;
    const char *env = getenv("PD_CUDA_BF16_GEMM");
    c->bf16_split = env && strcmp(env, "split") == 0;
    c->env_set |= env && *env ? CUDA__ENV_BF16 : 0;
    env = getenv("PD_CUDA_FLASH");
    c->no_flash = env && strcmp(env, "0") == 0;
    c->env_set |= env && *env ? CUDA__ENV_FLASH : 0;
    env = getenv("PD_CUDA_LT_ALGO"); /* benchmarks: the cuBLASLt candidate of prefill GEMMs */
    c->lt_opts.algo = env && atoi(env) > 0 && atoi(env) < MATMUL_LT_MAX_ALGOS ? atoi(env) : 0;
    env = getenv("PD_CUDA_LT_FAST_ACCUM");
    c->lt_opts.fast_accum = env && cuda__onoff(env) == 1;
    c->env_set |= env && *env ? CUDA__ENV_ACCUM : 0;
    env = getenv("PD_CUDA_GU_BF16");
    c->no_gu_bf16 = env && cuda__onoff(env) == 0;
    env = getenv("PD_CUDA_QKV_BF16");
    c->qkv_bf16 = env && cuda__onoff(env) == 1;
    env = getenv("PD_CUDA_XGEMV");
    c->xgemv = !env || !*env ? 1 : !strcmp(env, "0") ? 0 : !strcmp(env, "all") ? 2 : 1;
    env = getenv("PD_CUDA_INT4_MMA2");
    c->int4_mma2 = env && *env ? cuda__onoff(env) == 1 : 0;
    env = getenv("PD_CUDA_INT4_WG");
    c->int4_wg = (!env || !*env || cuda__onoff(env) != 0) && matmul_w4wg_usable();
    env = getenv("PD_CUDA_W8WG");
    c->w8wg_min_n = atoi(env && *env ? env : BACKEND_CUDA_W8WG_DEFAULT);
    if (c->w8wg_min_n < 0 || c->w8wg_min_n > CUDA_W8WG_MAX_N || !matmul_w8wg_usable())
        c->w8wg_min_n = 0;
    c->env_set |= env && *env ? CUDA__ENV_W8WG : 0;
    env = getenv("PD_CUDA_FP8_CLUSTER"); /* 1: matmul_fp8_mma's splits added in clusters */
    if (env && *env)
        matmul_fp8_cluster = cuda__onoff(env) == 1;
    env = getenv("PD_CUDA_FP8_KSPLIT"); /* the K-split mma GEMV's routes (matmul.h) */
    if (env && *env)
        matmul_fp8_ksplit_route = atoi(env) & 15;
    env = getenv("PD_CUDA_FP8_KSPLIT_U");
    if (env && *env)
        matmul_fp8_ksplit_batch = atoi(env) == 8 ? 8 : 4;
    env = getenv("PD_CUDA_INT4_KSPLIT"); /* the INT4 K-split GEMV's routes (matmul.h) */
    if (env && *env)
        matmul_int4_ksplit_route = atoi(env) & 15;
    env = getenv("PD_CUDA_INT4_KSPLIT_U");
    if (env && *env)
        matmul_int4_ksplit_batch = atoi(env) == 4 ? 4 : 2;
    env = getenv("PD_CUDA_INT4_KSPLIT_POST"); /* the group scale after the products (matmul.h) */
    if (env && *env)
        matmul_int4_ksplit_post = atoi(env) != 0;
    env = getenv("PD_CUDA_KS_ACT"); /* the K-split's f16 rows from the fused ops (backend_cuda.h) */
    if (env && *env)
        backend_cuda_ks_act = cuda__onoff(env) == 1;
    env = getenv("PD_CUDA_INT4_KSPLIT_ROLL"); /* each slot reloaded after its products (matmul.h) */
    if (env && *env)
        matmul_int4_ksplit_roll = cuda__onoff(env) == 1;
    env = getenv("PD_CUDA_FP8_GROUP");
    c->fp8_group = env && *env && cuda__onoff(env) == 1;
    c->env_set |= env && *env && cuda__onoff(env) >= 0 ? CUDA__ENV_F8GRP : 0;
    env = getenv("PD_CUDA_W8WG_ROWS");
    c->w8wg_max_rows = env && *env ? atoll(env) : CUDA_W8WG_DEFAULT_ROWS;
    env = getenv("PD_CUDA_W4WG_CLUSTER");
    c->w4wg_cluster = !env || !*env || cuda__onoff(env) != 0;
    c->env_set |= env && *env && cuda__onoff(env) >= 0 ? CUDA__ENV_W4CL : 0;
    env = getenv("PD_CUDA_WG_ACT");
    c->wg_act = !env || !*env || cuda__onoff(env) != 0;
    env = getenv("PD_CUDA_GEMV_FUSE");
    c->gemv_fuse = !env || !*env                                 ? 0
                   : (env[0] >= '1' && env[0] <= '3' && !env[1]) ? env[0] - '0'
                   : cuda__onoff(env) == 1                       ? 2
                                                                 : 0;
    c->env_set |= env && *env ? CUDA__ENV_GEMV_FUSE : 0;
    env = getenv("PD_CUDA_INT4_GEMM"); /* bf16: INT4 prefill GEMMs dequantized to bf16 */
    c->int4_fp8 = 1;
    if (env && *env) {
        c->int4_fp8 = !strcmp(env, "fp8");
        c->env_set |= CUDA__ENV_INT4;
    }
    env = getenv("PD_CUDA_ATTN_FOLD"); /* 1: split contexts merged inside the decode kernel */
    if (env && *env)
        attention_fold = cuda__onoff(env) == 1;
    env = getenv("PD_CUDA_ATTN_PAIR"); /* 1: two 16-token tiles per warp step (attention.h) */
    if (env && *env)
        attention_tc_pair = cuda__onoff(env) == 1;
    env = getenv("PD_CUDA_ATTN_BF16"); /* 0..3: the bf16-KV decode kernel's variant (attention.h) */
    if (env && env[0] >= '0' && env[0] <= '3' && !env[1])
        attention_tc_bf16 = env[0] - '0';
    env = getenv("PD_CUDA_GEMV_WIDE"); /* 0: the FP8 GEMV's 8-byte weight loads (matmul.h) */
    if (env && *env)
        matmul_gemv_fp8_wide = cuda__onoff(env) != 0;
    env = getenv("PD_CUDA_MLA_TILE"); /* 0: the untiled MLA attention kernel (family.h) */
    if (env && *env)
        family_mla_tile = cuda__onoff(env) == 1;
    env = getenv("PD_CUDA_SAMPLE_SPLIT"); /* 0: one block per greedy row (A / B) */
    if (env && *env)
        sample_split = cuda__onoff(env) != 0;
    env = getenv("PD_CUDA_ROPE_WARPS"); /* 0: the block-per-token RoPE + KV write (A / B) */
    if (env && *env)
        kv_rope_write_warps = cuda__onoff(env) != 0;
    env = getenv("PD_CUDA_MOE_GMM"); /* 1: the session-5 grouped MoE matmul, 2: SIMT moe_gmm2 */
    c->moe_gmm = env && !strcmp(env, "1") ? 1 : env && !strcmp(env, "2") ? 2 : 3;
    env = getenv("PD_CUDA_FUSED");
    if (env && *env) {
        cuda__set_fused(be, cuda__onoff(env) != 0);
        c->env_set |= CUDA__ENV_FUSED;
    }
    if ((st = cuda__status(cudaSetDevice(device), "set device")) != PD_OK)
        goto err_destroy;
    if ((st = cuda__status(cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device),
                           "device attribute")) != PD_OK)
        goto err_destroy;
    if ((st = cuda__status(
             cudaDeviceGetAttribute(&c->cc_major, cudaDevAttrComputeCapabilityMajor, device),
             "device attribute")) != PD_OK)
        goto err_destroy;
    /* the INT4 K-split's 16-warp blocks for launches of at most one row block per SM (matmul.h) */
    env = getenv("PD_CUDA_INT4_KSPLIT_WIDE");
    if (env && *env)
        matmul_int4_ksplit_wide = cuda__onoff(env) == 1 ? c->n_sm : 0;
    env = getenv("PD_CUDA_PDL");
    c->env_set |= env && *env ? CUDA__ENV_PDL : 0;
    cuda__set_pdl(c, env && *env ? cuda__onoff(env) != 0 : CUDA_PDL_DEFAULT);
    /* the slice GEMV's bulk-fed weight ring (sm_90+; PD_CUDA_W4BULK=0|1 for A / B) */
    env = getenv("PD_CUDA_W4BULK");
    matmul_set_w4bulk(c->cc_major >= 9 &&
                      (env && *env ? cuda__onoff(env) == 1 : CUDA_W4BULK_DEFAULT));
    if ((st = cuda__status(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                           "stream")) != PD_OK)
        goto err_destroy;
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS ||
        cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
        pd_log_error("backend cuda: cannot create the cuBLAS handles");
        st = PD_ERR_CUDA;
        goto err_destroy;
    }
    cublasSetStream(c->blas, c->stream);
    cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH); /* f32 GEMMs stay f32 (no TF32) */
    if ((st = cuda__status(cudaMalloc(&c->lt_ws, CUDA_LT_WS_BYTES), "workspace")) != PD_OK ||
        (st = cuda__status(cudaMalloc(&c->blas_ws, CUDA_LT_WS_BYTES), "workspace")) != PD_OK ||
        (st = cuda__status(cudaMalloc(&c->sample_scratch, SAMPLE_SCRATCH_BYTES), "workspace")) !=
            PD_OK ||
        (st = cuda__status(cudaMemset(c->sample_scratch, 0, SAMPLE_SCRATCH_BYTES), "workspace")) !=
            PD_OK)
        goto err_destroy;
    if (cublasSetWorkspace(c->blas, c->blas_ws, CUDA_LT_WS_BYTES) != CUBLAS_STATUS_SUCCESS) {
        pd_log_error("backend cuda: cannot set the cuBLAS workspace");
        st = PD_ERR_CUDA;
        goto err_destroy;
    }
    *be_p = be;
    return PD_OK;
err_destroy:
    cuda_destroy(be);
    return st;
}
