/* Built when pdserve is compiled without nvcc: the CUDA backend reports itself unavailable. */
#include "backend.h"
#include "log.h"

pd_status_t backend_cuda_create(int device, pd_backend_t **be_p)
{
    (void)device;
    (void)be_p;
    pd_log_error("backend cuda: this build has no CUDA support (rebuild with nvcc available)");
    return PD_ERR_UNSUPPORTED;
}
