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
 *   moe_grouped = on | off    MoE experts registered by moe_prepare run grouped on the device
 *                             (routing offsets on the device, graph-capturable; default on); off:
 *                             moe_prepare declines and the (token, expert) pairs are grouped on
 *                             the host (the path before; comparisons). Set it before
 *                             model_ctx_create.
 * Environment, read by backend_cuda_create() and overriding the options (benchmarks):
 * PD_CUDA_BF16_GEMM=split|one, PD_CUDA_FLASH=0|1, PD_CUDA_FUSED=0|1, and PD_CUDA_FLASH_VARIANT
 * (read at each flash launch, kernels/attention_flash.h).
 */
#ifndef PD_KERNELS_BACKEND_CUDA_H
#define PD_KERNELS_BACKEND_CUDA_H

#include "backend.h"

/* The backend's cudaStream_t (as void *), or NULL when be is not a CUDA backend. */
void *backend_cuda_stream(pd_backend_t *be);

#endif
