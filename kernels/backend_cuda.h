/* backend_cuda: extras of the CUDA backend beyond the ops table of common/backend.h (which
 * backend_cuda_create() implements): access to its stream, for benchmarks and graph capture.
 * Same threading rule as the backend: the thread that owns it.
 * Environment read by backend_cuda_create(): PD_CUDA_BF16_GEMM=split (BF16 weights: two GEMMs on
 * the hi + lo split of the activations, near f32; default one bf16 GEMM), PD_CUDA_FLASH=0
 * (no flash attention for prefill-shaped batches).
 */
#ifndef PD_KERNELS_BACKEND_CUDA_H
#define PD_KERNELS_BACKEND_CUDA_H

#include "backend.h"

/* The backend's cudaStream_t (as void *), or NULL when be is not a CUDA backend. */
void *backend_cuda_stream(pd_backend_t *be);

#endif
