/* attention_flash: paged causal flash attention on the tensor cores, for prefill-shaped batches
 * (many query rows per sequence): the same op and batch description as attention_run
 * (kernels/attention.h, common/backend.h pd_attn_batch_t), computed as FlashAttention-2 does:
 * one block per (64 or 128 query rows of one sequence, query head), K/V tiles of 32 or 64 tokens
 * gathered from the sequence's pages through its block table into shared memory (cp.async,
 * double buffered), S = Q K^T and O += P V with mma.sync m16n8k16 bf16 (f32 accumulate), online
 * softmax in f32. Four kernel variants (tile shapes, registers); the launcher picks one by the
 * batch size, PD_CUDA_FLASH_VARIANT=0..3 forces one (tests and benchmarks).
 * On Hopper (compute capability 9.0, built with cuda-arch 90a), bf16 pages, head_dim 128 and an
 * even number of query heads per kv head, the launcher runs a FlashAttention-3 style kernel
 * instead (variants 4 and 5: 2 or 3 pipeline stages; 6: a producer that runs ahead; 7: 6 with
 * the softmax overlapping the PV product and setmaxnreg): wgmma (warpgroup MMA) for Q K^T and P V,
 * a producer warpgroup gathering K/V tiles of 128 keys from the pages into swizzled shared
 * memory behind mbarriers, two consumer warpgroups (the two query heads of a block share each
 * K/V tile) doing the online softmax; the mma.sync variants stay for other GPUs, fp8 pages,
 * head_dim 64 and odd groups.
 * Q is rounded to bf16 on load and P to bf16 before the PV product, so results differ from the
 * f32 reference by a few 1e-3 relative (tests/gpu/kernels.c states the tolerance). Earlier pages
 * of a sequence (chunked prefill, prefix-cache hits) are read like the new ones: the query rows
 * sit at the end of the context. K/V pages: bf16, or fp8 e4m3 with per (token, head) scales
 * (staged raw with cp.async, dequantized to bf16 in shared memory). f32 KV is not taken
 * (attention_run keeps it).
 * Pointers are device memory; the launcher checks shapes (PD_ERR_INVALID), enqueues on `stream`,
 * returns the launch status and allocates nothing.
 */
#ifndef PD_KERNELS_ATTENTION_FLASH_H
#define PD_KERNELS_ATTENTION_FLASH_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "kv_pool.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether attention_flash_run takes this layout and head count: KV bf16 or fp8, head_dim 64 or
 * 128, n_heads a multiple of n_kv_heads. */
bool attention_flash_supports(const kv_layout_t *l, int n_heads);

/* out (n_rows, n_heads, head_dim) f32 = softmax(q k^T / sqrt(head_dim)) v over the paged cache,
 * causal, q (n_rows, n_heads, head_dim) f32; batch as attention_run (arrays device memory,
 * n_rows = q_start[n_seqs], passed by the caller; every q_len >= 0 and <= ctx_len). Needs
 * attention_flash_supports(l, n_heads). */
pd_status_t attention_flash_run(float *out, const float *q, const void *arena, const kv_layout_t *l,
                                int layer, const pd_attn_batch_t *batch, int n_rows, int n_heads,
                                cudaStream_t stream);

/* attention_flash_run with a kernel variant (attention_flash.cu lists them): 0..7, or -1 for the
 * default choice (the Hopper kernel where it applies, else by shape); 4..7 fall back to the
 * default choice where the Hopper kernel does not apply. PD_CUDA_FLASH_VARIANT=0..7, read at each
 * launch, overrides both (tests and benchmarks). */
pd_status_t attention_flash_run_variant(float *out, const float *q, const void *arena,
                                        const kv_layout_t *l, int layer,
                                        const pd_attn_batch_t *batch, int n_rows, int n_heads,
                                        int variant, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
