/* backend_cuda: extras of the CUDA backend beyond the ops table of common/backend.h (which
 * backend_cuda_create() implements): access to its stream, for benchmarks and graph capture.
 * Same threading rule as the backend: the thread that owns it.
 */
#ifndef PD_KERNELS_BACKEND_CUDA_H
#define PD_KERNELS_BACKEND_CUDA_H

#include "backend.h"

/* The backend's cudaStream_t (as void *), or NULL when be is not a CUDA backend. */
void *backend_cuda_stream(pd_backend_t *be);

#endif
