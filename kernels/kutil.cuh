/* kutil: device helpers shared by the kernels of kernels/ (scalar conversions that match the CPU
 * reference in common/dtype.h bit for bit, warp reductions) and the one place where cudaError_t
 * becomes pd_status_t. Included by the .cu files of kernels/ only; not a C header.
 */
#ifndef PD_KUTIL_CUH
#define PD_KUTIL_CUH

#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kv_pool.h"
#include "log.h"
#include "status.h"
}

/* cudaError_t -> pd_status_t, logging the CUDA message with the launcher's name. */
static inline pd_status_t kutil_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return PD_OK;
    pd_log_error("%s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? PD_ERR_NOMEM : PD_ERR_CUDA;
}

/* Status of the launch just made (configuration errors; not the kernel's outcome). */
#define KUTIL_LAUNCHED(what) kutil_status(cudaGetLastError(), what)

/* The driver's tensor-map encoder (cuTensorMapEncodeTiled, for TMA boxes), reached through the
 * runtime (no link to libcuda), looked up once; NULL where the driver has none. Callers include
 * <cuda.h> and <cudaTypedefs.h> first (kutil.cuh itself needs neither). */
#ifdef CUDATYPEDEFS_H
static inline PFN_cuTensorMapEncodeTiled_v12000 kutil_tmap_encoder(void)
{
    static PFN_cuTensorMapEncodeTiled_v12000 encode;
    if (!encode) {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult qr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &qr) != cudaSuccess ||
            qr != cudaDriverEntryPointSuccess || !fn) {
            (void)cudaGetLastError();
            return NULL;
        }
        encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    return encode;
}
#endif

/* Shape precondition inside a launcher: logs and returns PD_ERR_INVALID. */
#define KUTIL_REQUIRE(cond, what)                                                                  \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            pd_log_error("%s: precondition failed: %s", what, #cond);                              \
            return PD_ERR_INVALID;                                                                 \
        }                                                                                          \
    } while (0)

/* Lets kernel fn use `bytes` of dynamic shared memory (cudaFuncAttributeMaxDynamicSharedMemorySize)
 * on the current device. The attribute is per device: *attr_set (a static of the launcher, one bit
 * per device 0..31) records where it is set, so a process that drives several GPUs (tensor
 * parallel, tp_nccl.c) sets it on each; devices 32 and above set it every launch. Two threads
 * racing on one device set it twice, which is harmless. */
static inline pd_status_t kutil_allow_smem(const void *fn, int bytes, unsigned *attr_set,
                                           const char *what)
{
    int dev = 0;
    pd_status_t st = kutil_status(cudaGetDevice(&dev), what);
    if (st != PD_OK)
        return st;
    const unsigned bit = dev < 32 ? 1u << dev : 0u;
    if (bit && (__atomic_load_n(attr_set, __ATOMIC_RELAXED) & bit))
        return PD_OK;
    st = kutil_status(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                      what);
    if (st == PD_OK && bit)
        __atomic_fetch_or(attr_set, bit, __ATOMIC_RELAXED);
    return st;
}

/* Whether s splits of n work units, ceil(n / s) each (the last takes the rest), leave no split
 * empty: the planners' test before they weigh a split count. */
static inline bool kutil_splits_full(int64_t n, int64_t s)
{
    return s <= 1 || (s - 1) * ((n + s - 1) / s) < n;
}

/* *slot remembers f() (a positive int; anything else: unknown): 0 not asked yet, -1 unknown.
 * Returns the value, 0 if unknown. Concurrent first callers may both ask (the same answer). */
template <typename F> static inline int kutil_memo(int *slot, F f)
{
    int v = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (v == 0) {
        const int r = f();
        v = r > 0 ? r : -1;
        __atomic_store_n(slot, v, __ATOMIC_RELAXED);
    }
    return v > 0 ? v : 0;
}

/* The current device's compute capability, major * 10 + minor (read once per device); 0 if it
 * cannot be read. */
static inline int kutil_device_cc(void)
{
    static int cc[32];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 32)
        return 0;
    return kutil_memo(&cc[dev], [dev]() {
        int ma = 0, mi = 0;
        if (cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
            return 0;
        return ma * 10 + mi;
    });
}

/* How many blocks of kernel fn (block threads, smem bytes of dynamic shared memory, already
 * allowed) in clusters of (1, 1, S) the current device runs at once: the clusters that fit its
 * GPCs (cudaOccupancyMaxActiveClusters) times S; 0 if unknown (below compute capability 9.0). */
static inline int kutil_cluster_wave(const void *fn, int threads, size_t smem, int S)
{
    if (kutil_device_cc() < 90 || S < 1)
        return 0;
    cudaLaunchConfig_t lc = {};
    cudaLaunchAttribute at[1];
    lc.gridDim = dim3(1, 1, (unsigned)S);
    lc.blockDim = dim3((unsigned)threads);
    lc.dynamicSmemBytes = smem;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = (unsigned)S;
    lc.attrs = at;
    lc.numAttrs = 1;
    int num = 0;
    if (cudaOccupancyMaxActiveClusters(&num, fn, &lc) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return num * S;
}

/* For a kernel whose shared memory may reach the device's limit: *fits false when smem bytes of
 * dynamic shared memory plus its reserve bytes of static shared memory are above the current
 * device's opt-in maximum (the caller launches something else); else true, and where they are
 * above the default 48 KB, fn is allowed the opt-in maximum less reserve (kutil_allow_smem). */
static inline pd_status_t kutil_allow_smem_optin(const void *fn, size_t smem, int reserve,
                                                 unsigned *attr_set, bool *fits, const char *what)
{
    *fits = true;
    if (smem + (size_t)reserve <= 48 * 1024)
        return PD_OK;
    int dev = 0, optin = 0;
    pd_status_t st = kutil_status(cudaGetDevice(&dev), what);
    if (st == PD_OK)
        st = kutil_status(
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), what);
    if (st != PD_OK)
        return st;
    if (smem + (size_t)reserve > (size_t)optin) {
        *fits = false;
        return PD_OK;
    }
    return kutil_allow_smem(fn, optin - reserve, attr_set, what);
}

static __device__ __forceinline__ float kutil_bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* float -> bf16, round to nearest even (as pd_f32_to_bf16). */
static __device__ __forceinline__ uint16_t kutil_f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* fp8 e4m3fn -> float (exact). */
static __device__ __forceinline__ float kutil_fp8_to_f32(uint8_t v)
{
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
    return __half2float(__half(h));
}

/* float -> fp8 e4m3fn, round to nearest even, saturating at +-448 (as pd_f32_to_fp8). */
static __device__ __forceinline__ uint8_t kutil_f32_to_fp8(float f)
{
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
}

static __device__ __forceinline__ float kutil_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float kutil_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* One warp's block of 128 values quantized as quant_fp8_vec quantizes a vector (the same f32
 * operations: s = amax / 448, 1 for an all-zero block; e4m3(v * (1 / s))): the lane's 4 values v
 * become 4 e4m3 bytes at *dst (byte j = v's component j); returns s. All 32 lanes call it. */
static __device__ __forceinline__ float kutil_fp8_block_quant(float4 v, uint32_t *dst)
{
    const float amax =
        kutil_warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    const float sc = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / sc;
    *dst = (uint32_t)kutil_f32_to_fp8(v.x * inv) | ((uint32_t)kutil_f32_to_fp8(v.y * inv) << 8) |
           ((uint32_t)kutil_f32_to_fp8(v.z * inv) << 16) |
           ((uint32_t)kutil_f32_to_fp8(v.w * inv) << 24);
    return sc;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
 * red: __shared__ float[32]. */
static __device__ __forceinline__ float kutil_block_sum(float v, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kutil_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return kutil_warp_sum(v);
}

static __device__ __forceinline__ float kutil_block_max(float v, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kutil_warp_max(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return kutil_warp_max(v);
}

/* Device twins of kv_layout_data_off / kv_layout_scale_off (common/kv_pool.h). */
static __device__ __forceinline__ size_t kutil_kv_data_off(const kv_layout_t &l, int layer,
                                                           int side)
{
    return KV_PAGE_HEADER_BYTES + ((size_t)layer * l.n_sides + (size_t)side) * l.side_bytes;
}
static __device__ __forceinline__ size_t kutil_kv_scale_off(const kv_layout_t &l, int layer,
                                                            int side)
{
    return KV_PAGE_HEADER_BYTES + (size_t)l.n_layers * l.n_sides * l.side_bytes +
           ((size_t)layer * l.n_sides + (size_t)side) * l.scale_bytes;
}

/* ---- thread-block clusters (sm_90+): blocks of a cluster read each other's shared memory; the
 * K splits of matmul_w4wg, matmul_w8wg and matmul_fp8_mma are added that way ---- */
#define KUTIL_CLUSTER_MAX 8 /* the portable cluster size: the most blocks one cluster adds */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
/* Every thread of every block of the cluster arrives (a block's threads that returned early do
 * not count: they must call it too); shared-memory writes before it are visible to the cluster's
 * blocks after it. */
static __device__ __forceinline__ void kutil_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
/* Shared address a of this block -> the same address in the cluster's block of rank q. */
static __device__ __forceinline__ uint32_t kutil_cluster_addr(uint32_t a, int q)
{
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(q));
    return r;
}
/* The f32 at shared address a of the cluster's block of rank q. */
static __device__ __forceinline__ float kutil_cluster_ld(uint32_t a, int q)
{
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n"
                 : "=f"(v)
                 : "r"(kutil_cluster_addr(a, q))
                 : "memory");
    return v;
}
/* The f32 at shared address a of the cluster's blocks of rank 0 .. S - 1 (S <= KUTIL_CLUSTER_MAX),
 * added in rank order (deterministic). All S loads are issued before the first add, so the sum
 * costs one trip through distributed shared memory, not a chain of S. */
static __device__ __forceinline__ float kutil_cluster_sum(uint32_t a, int S)
{
    float v[KUTIL_CLUSTER_MAX];
#pragma unroll
    for (int q = 0; q < KUTIL_CLUSTER_MAX; q++) {
        v[q] = q < S ? kutil_cluster_ld(a, q) : 0.0f;
    }
    float s = v[0];
#pragma unroll
    for (int q = 1; q < KUTIL_CLUSTER_MAX; q++)
        if (q < S)
            s += v[q];
    return s;
}
/* kutil_cluster_sum of four f32 at a (16-byte aligned) at once. */
static __device__ __forceinline__ float4 kutil_cluster_sum4(uint32_t a, int S)
{
    float4 v[KUTIL_CLUSTER_MAX];
#pragma unroll
    for (int q = 0; q < KUTIL_CLUSTER_MAX; q++) {
        v[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (q < S)
            asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                         : "=f"(v[q].x), "=f"(v[q].y), "=f"(v[q].z), "=f"(v[q].w)
                         : "r"(kutil_cluster_addr(a, q))
                         : "memory");
    }
    float4 s = v[0];
#pragma unroll
    for (int q = 1; q < KUTIL_CLUSTER_MAX; q++)
        if (q < S) {
            s.x += v[q].x;
            s.y += v[q].y;
            s.z += v[q].z;
            s.w += v[q].w;
        }
    return s;
}
#endif

/* ---- Programmatic dependent launch (PDL, sm_90+) ----
 * A kernel launched with kutil_launch_pdl may start while the kernel before it on the stream is
 * still running (once every block of that one has called kutil_pdl_trigger, or exited). So such
 * a kernel MUST call kutil_pdl_wait (griddepcontrol.wait: returns when the earlier grids have
 * completed and their writes are visible) in every thread before it reads anything an earlier
 * kernel wrote or writes anything an earlier kernel reads; only constant data (weights) may be
 * read before. kutil_pdl_trigger (griddepcontrol.launch_dependents) lets the next PDL-launched
 * kernel start its prologue; it is harmless in a kernel launched plainly or followed by a plain
 * launch. Both are no-ops below sm_90. kutil_pdl_mode (set by the backend, matmul_set_pdl; 0 on
 * devices below compute capability 9.0) turns the attribute off: then kutil_launch_pdl is a plain
 * launch. Works inside stream capture (CUDA graphs get programmatic edges). */
extern "C" int kutil_pdl_mode;

static __device__ __forceinline__ void kutil_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void kutil_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* kernel<<<grid, block, smem, stream>>>(args...) with the programmatic-stream-serialization
 * attribute when kutil_pdl_mode is on (the kernel must follow the rule above), and the grid's
 * blocks in thread-block clusters of (1, 1, cz) when cz > 1 (grid.z a multiple of cz; sm_90+:
 * K splits summed through distributed shared memory). */
template <typename... P, typename... A>
static inline cudaError_t kutil_launch_pdl_cluster(void (*kernel)(P...), dim3 grid, dim3 block,
                                                   size_t smem, cudaStream_t stream, unsigned cz,
                                                   A... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    unsigned na = 0;
    if (kutil_pdl_mode) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cz > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = 1;
        at[na].val.clusterDim.y = 1;
        at[na++].val.clusterDim.z = cz;
    }
    cfg.attrs = at;
    cfg.numAttrs = na;
    return cudaLaunchKernelEx(&cfg, kernel, ((P)args)...);
}

/* kutil_launch_pdl_cluster without clusters: the PDL launch of every decode-path kernel */
template <typename... P, typename... A>
static inline cudaError_t kutil_launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                           cudaStream_t stream, A... args)
{
    return kutil_launch_pdl_cluster(kernel, grid, block, smem, stream, 1u, args...);
}

#endif
