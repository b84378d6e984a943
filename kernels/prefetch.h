/* prefetch: asks L2 to fetch device memory ahead of the kernel that will read it (the decode
 * step's weight streams; backend_cuda.c's option l2_prefetch). Nothing is written anywhere: a
 * prefetch only moves lines into L2, so a late, early or lost one changes no result, only the
 * time. The launcher checks its arguments (PD_ERR_INVALID), enqueues on `stream`, allocates
 * nothing. Same threading rule as the backend.
 */
#ifndef PD_KERNELS_PREFETCH_H
#define PD_KERNELS_PREFETCH_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* regions of one launch: a weight's data, scales and zeros, up to three weights */
#define PREFETCH_MAX_REGIONS 9
/* the stride of a partial prefetch: the first part of every PREFETCH_STRIDE bytes */
#define PREFETCH_STRIDE 8192

typedef struct {
    const void *p[PREFETCH_MAX_REGIONS]; /* device memory */
    size_t bytes[PREFETCH_MAX_REGIONS];
    int n;
} prefetch_regions_t;

/* Fetches into L2 the first (frac * PREFETCH_STRIDE) bytes, rounded up to 16, of every
 * PREFETCH_STRIDE bytes of each region (frac >= 1: the whole region), so that a kernel that
 * streams the regions in any order of large pieces finds about frac of its bytes in L2. A region's
 * first bytes up to 16-byte alignment and its last bytes past it are left out. frac <= 0 or no
 * region: nothing is enqueued. */
pd_status_t prefetch_l2(const prefetch_regions_t *r, double frac, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
