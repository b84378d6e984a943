/* backend_cuda: extras of the CUDA backend beyond the ops table of common/backend.h (which
 * backend_cuda_create() implements): access to its stream, for benchmarks and graph capture.
 * Same threading rule as the backend: the thread that owns it.
 *
 * Options (ops->set_option, backend_set_options; a node's `backend_options = "k=v,k=v"` in the
 * cluster config):
 *   bf16_gemm = one | split   BF16 (and dequantized INT4) GEMMs: one bf16 GEMM on bf16(x)
 *                             (default), or two on the hi + lo split of x (near f32; the checks
 *                             against float32 transformers use it)
 *   flash = on | off          flash attention for prefill-shaped batches (default on); off keeps
 *                             attention_run for every batch (comparisons)
 *   flash_variant = auto | 0..3   the flash attention kernel (attention_flash.cu; default auto:
 *                             chosen by shape)
 *   fused = on | off          the fused ops add_rmsnorm / silu_mul_fp8 / matmul_fp8 (default on);
 *                             off leaves them out of the ops table (the model runs the plain ops)
 *   fp8_accum = exact | fast  FP8 GEMMs of >= 512 rows (prefill; cuBLASLt): the exact fp8
 *                             accumulation (default: cuBLASLt's periodic promotion to f32) or
 *                             the fast one (~10% faster GEMMs at n 8192, 8192-token prefill
 *                             -5%, but max error 4e-3 / 8e-3 of max |out| at K 4096 / 14336
 *                             against the 2e-3 the FP8 matmul cases allow: docs/performance.md,
 *                             session 5); decode batches always take the exact one
 *   int4_gemm = fp8 | bf16    INT4 GEMMs above the INT4 mma kernels' n (prefill): on the FP8
 *                             tensor cores (default): the weight as e4m3 q - z with its group
 *                             scales, the activations e4m3 in 1x128 blocks, cuBLASLt's VEC128
 *                             block scaling (Hopper, cuBLAS 12.9+; a shape it has no GEMM for
 *                             runs bf16, logged once); or dequantized to bf16 for one bf16 GEMM.
 *                             W4A8: the activations lose the bits FP8 weights' W8A8 loses (ppl
 *                             +0.14% against +0.06% for bf16 on tiny-llama). 8192-token prefill
 *                             268.5 -> 220.2 ms (session 8). The model asks act_quant and
 *                             has the fused norm / SiLU-mul ops make the 1x128-block
 *                             activations (quantized once for q, k, v; the gate_up product
 *                             kept as bf16 for the SiLU-mul, as FP8's). The bf16 hi + lo split
 *                             accuracy mode keeps bf16. PD_CUDA_INT4_GEMM=fp8|bf16 overrides
 *                             it.
 *   moe_grouped = on | off    MoE experts registered by moe_prepare run grouped on the device
 *                             (routing offsets on the device, graph-capturable; default on); off:
 *                             moe_prepare declines and the (token, expert) pairs are grouped on
 *                             the host (the path before; comparisons). Set it before
 *                             model_ctx_create.
 *   pdl = on | off            programmatic dependent launch (kernels/kutil.cuh) of the decode-path
 *                             GEMVs (matmul_w4gemv, the f32 GEMV, the FP8 mma; sm_90+ only, a
 *                             plain launch below): a GEMV's first weight loads overlap the kernel
 *                             before it. Process-wide; read at launch, so set it before graphs
 *                             are captured. Default: CUDA_PDL_DEFAULT in backend_cuda.c.
 *                             PD_CUDA_PDL=0|1 overrides it.
 *   w4wg_cluster = on | off   INT4 decode GEMMs on matmul_w4wg (n 25..256, sm_90a) add their K
 *                             splits inside thread-block clusters through distributed shared
 *                             memory (one launch, no partial sums in global memory; the same
 *                             values) instead of a second launch. Default on (session 22, one
 *                             H100: q / k / v 24.6 -> 21.2 us and o 20.2 -> 19.5 at n 64, the
 *                             INT4 batch-64 step 6.43 -> 6.29 ms). Set it before graphs are
 *                             captured.
 *                             PD_CUDA_W4WG_CLUSTER=0|1 overrides it.
 *   fp8_group = on | off      the q, k, v projections of FP8 weights at decode batches up to 8
 *                             as one launch of the FP8 mma kernel (matmul_fp8_mma_group; with
 *                             more than one K split only under PD_CUDA_FP8_CLUSTER=1). Session
 *                             22, default off until measured. PD_CUDA_FP8_GROUP=0|1 overrides
 *                             it.
 *   w8wg = off | on | N       FP8 matmuls of n tokens, N <= n <= 64 (on: 1), on matmul_w8wg, the
 *                             wgmma GEMM fed by TMA (kernels/matmul_w8wg.cu; sm_90a build on a
 *                             compute capability 9.0 device, else ignored) instead of the FP8
 *                             GEMV / mma kernel / cuBLASLt, for weights of at most 4096 rows
 *                             (PD_CUDA_W8WG_ROWS=R sets the limit, 0: every weight). Default
 *                             17: at n 64 it beats cuBLASLt on the 8B o and down and loses on
 *                             gate_up and the fused q / k / v (session 22); the FP8 batch-64
 *                             step 8.58 -> 7.94 ms on an H200 (session 24, docs/performance.md,
 *                             s24 round). Set it before graphs are captured. PD_CUDA_W8WG=N
 *                             overrides it (0: off).
 * Environment, read by backend_cuda_create() and overriding the options (benchmarks):
 * PD_CUDA_BF16_GEMM=split|one, PD_CUDA_FLASH=0|1, PD_CUDA_FUSED=0|1, and PD_CUDA_FLASH_VARIANT
 * (read at each flash launch, kernels/attention_flash.h); PD_CUDA_LT_FAST_ACCUM=0|1 (fp8_accum
 * exact | fast). Benchmark knobs of the FP8 GEMMs (cuBLASLt, n > 8): PD_CUDA_LT_ALGO=i (the
 * i-th heuristic candidate, default 0; cuBLASLt 13.0 offers one for these shapes),
 * PD_CUDA_GU_BF16=0 (matmul_silu_fp8 keeps the gate_up product in f32 instead of bf16),
 * PD_CUDA_QKV_BF16=1 (qkv_rope_write: the q, k, v GEMMs write bf16 and kv_rope_write_bf16 reads
 * it; default off until measured).
 * PD_CUDA_MOE_GMM=1: the grouped MoE matmul through moe_gmm (session 5: x read from global
 * memory), =2: through moe_gmm2 (x staged in shared memory, SIMT f32; the default in sessions
 * 6-7), instead of moe_gmm3 (mma.sync on the staged rows for FP8 and INT4, the default since
 * session 8; BF16 weights run moe_gmm2). Read at creation; backend_cuda_set_moe_gmm below.
 * PD_CUDA_ATTN_FOLD=1: decode attention merges split contexts inside the tensor-core kernel
 * (attention_fold, kernels/attention.h; process-wide; measured slower in session 8, so off).
 * PD_CUDA_FP8_CLUSTER=1: the FP8 mma kernel of decode batches (matmul_fp8_mma, n <= 8 by
 * default) adds its K splits inside thread-block clusters (matmul_fp8_cluster, kernels/matmul.h;
 * process-wide; session 22, off until measured).
 * PD_CUDA_ATTN_PAIR=1: the FP8-KV decode attention (head_dim 128) computes two 16-token tiles per
 * warp step (attention_tc_pair, kernels/attention.h; session 17, off until measured).
 * PD_CUDA_ATTN_BF16=0..3: the BF16-KV decode attention's variant (attention_tc_bf16,
 * kernels/attention.h; 0: blocks of 4 warps, 3 per SM (before session 25); 1 (default): blocks
 * of 3 warps, 4 per SM; 2: two bf16 parts of Q and P instead of three; 3: both).
 * PD_CUDA_GEMV_WIDE=0|1: the FP8 f32 GEMV (matmul_gemv: gate_up at batch 1) with 8-byte or
 * 16-byte weight loads (matmul_gemv_fp8_wide, kernels/matmul.h; 16 by default since session 25).
 * PD_CUDA_MLA_TILE=0: the GLM-4.5 / DeepSeek-V3 MLA attention through the untiled kernel (one
 * block per head re-reading the context) instead of the tiled one (8 heads per block share
 * 32-token latent tiles in shared memory; family_mla_tile, kernels/family.h; the default since
 * session 17).
 * A / B switches of the decode step (default on; =0 the earlier path): PD_CUDA_WG_ACT (the fused
 * ops write matmul_w4wg's f16 activation image, act_quant's PD_ACT_F16WG), PD_CUDA_SAMPLE_SPLIT
 * (greedy rows across blocks), PD_CUDA_ROPE_WARPS (RoPE + KV write a warp per (token, head)),
 * PD_CUDA_W4BULK (matmul_w4gemv's bulk-fed weight ring, sm_90+; matmul_set_w4bulk),
 * PD_CUDA_GEMV_FUSE / option gemv_fuse (default OFF, session 14: no faster; 1 / 2 (on) / 3:
 * matmul_fused, the norms, residual adds and (2, 3) SiLU·mul inside the INT4 slice GEMV; off:
 * matmul_fused_ok says no and the model runs the plain ops).
 */
#ifndef PD_KERNELS_BACKEND_CUDA_H
#define PD_KERNELS_BACKEND_CUDA_H

#include "backend.h"

/* 1: act_quant answers PD_ACT_F16 for tiled INT4 weights where matmul would run the INT4 K-split
 * GEMV (matmul.h matmul_int4_ksplit_route), so that the fused add + RMSNorm and SiLU·mul write its
 * f16 rows (elementwise_add_rmsnorm_f16 / elementwise_silu_mul_f16) instead of a
 * matmul_quant_act_f16 launch before each GEMV (session 28, not yet measured); 0 (default): not.
 * From PD_CUDA_KS_ACT=1 at backend creation. */
extern int backend_cuda_ks_act;

/* Option w8wg's default value: FP8 decode matmuls from this n (weights of at most
 * PD_CUDA_W8WG_ROWS rows, default 4096) run on matmul_w8wg. The harness and benchmarks that turn
 * the option off restore it with backend_set_options(be, "w8wg=" BACKEND_CUDA_W8WG_DEFAULT). */
#define BACKEND_CUDA_W8WG_DEFAULT "17"

/* The backend's cudaStream_t (as void *), or NULL when be is not a CUDA backend. */
void *backend_cuda_stream(pd_backend_t *be);

/* The backend's cuBLASLt handle (bound to its stream) and workspace, for benchmarks that call
 * kernels/matmul.h's cuBLASLt launchers directly; false (nothing set) when be is not CUDA. */
bool backend_cuda_lt(pd_backend_t *be, void **lt_p, void **ws_p, size_t *ws_bytes_p);

/* int4_gemm for the harness: on 1 = fp8, 0 = bf16. Returns the setting before (1 or 0), -2 when
 * be is not CUDA. A shape cuBLASLt has no VEC128 GEMM for runs bf16 either way
 * (kernels/matmul.h, matmul_gemm_fp8_blk_ok). */
int backend_cuda_set_int4_fp8(pd_backend_t *be, int on);

/* The grouped MoE matmul of moe_experts' device path: 1 moe_gmm (what PD_CUDA_MOE_GMM=1 sets at
 * creation), 2 moe_gmm2, 3 moe_gmm3 (tensor cores; the default), for the harness and
 * benchmarks. Returns the kernel that was set before (1..3, to restore it), 0 (nothing set) when
 * be is not CUDA or kernel is none of these. Takes effect at the next call (a captured graph keeps
 * the kernel it was captured with). */
int backend_cuda_set_moe_gmm(pd_backend_t *be, int kernel);

#endif
