/* attention: paged causal attention over the KV cache (layout common/kv_pool.h), for prefill
 * (many query rows per sequence) and decode (one row per sequence) alike. One block handles one
 * query row and one KV head with all the query heads of that KV group (GQA), over one split of
 * the row's context; when a context is split (few rows, long contexts: flash-decoding), a second
 * kernel merges the splits. The CUDA backend sends prefill-shaped batches with bf16 / fp8 KV to
 * the tensor-core kernel of kernels/attention_flash.h instead. Pointers are device memory.
 * Launchers check shapes (PD_ERR_INVALID), enqueue on `stream`, return the launch status,
 * allocate nothing.
 */
#ifndef PD_KERNELS_ATTENTION_H
#define PD_KERNELS_ATTENTION_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kv_pool.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 (default): bf16 / fp8 KV with head_dim 64 / 128 run on the tensor-core decode kernel
 * (mma.sync, cp.async page staging); 0: the SIMT kernels (kept for comparisons and f32 KV /
 * head_dim 256). Read at each attention_run. */
extern int attention_decode_tc;

/* 0 (default): the tensor-core kernel computes one 16-token tile per warp step; 1: fp8 KV with
 * head_dim 128 takes two tiles per step (their S chains and P V products interleave; blocks of 3
 * warps, 4 per SM). Session 17, not yet measured; the CUDA backend sets it from
 * PD_CUDA_ATTN_PAIR=1 at creation. Read at each attention_run. */
extern int attention_tc_pair;

/* The bf16-KV variant of the tensor-core decode kernel (session 25), bits: 1 blocks of 3 warps,
 * 4 per SM instead of 4 warps, 3 per SM (so batch 64 x 8 KV heads = 512 blocks are one wave of
 * 528, not 1.3 of 396; attention_splits then splits long bf16 contexts like fp8 ones); 2 Q and P
 * as two bf16 parts (hi + lo: 16 bits, one mma per product) instead of three (hi + mid + lo: 24
 * bits, two). The CUDA backend sets it from PD_CUDA_ATTN_BF16=0..3 at creation. Read at each
 * attention_run and attention_splits.
 * Default 1, measured on one H100 (session 25, call s25a, gpu_bench attnbf, us): B 64 / 1k 122.8
 * (v0) -> 114.8, B 1 / 32k 73.2 -> 70.1, B 64 / 8k 828 -> 818, B 16 / 1k 46.1 -> 47.9; the FP8
 * batch-64 decode step 9.14 -> 8.84 ms, batch 1 unchanged; the same sums where each warp's tiles
 * are the same. 2 (two parts) bought 1% more and changes the scores' last bits: off. */
#define ATTENTION_TC_BF16_DEFAULT 1
extern int attention_tc_bf16;

/* Splits of each row's context attention_run will use for n_rows rows and contexts of at most
 * max_ctx tokens in KV format fmt (1 = no split). */
int attention_splits(int n_rows, int n_kv_heads, int max_ctx, pd_kvfmt_t fmt);

/* The (row, KV head, split) blocks attention_splits aims at: 0 (default) its built-in 4 per SM
 * of an H200; else this many (a process-wide switch for `gpu_bench attnsplit`). */
extern int attention_target_blocks;

/* 0 (default): split contexts are merged by a second kernel (attention__merge); 1: by the last
 * block of each (row, KV head) of the tensor-core kernel itself (one launch less per layer;
 * the splits summed one by one in order, where attention__merge sums them in 4 interleaved
 * groups since session 9: equal to ~1 f32 rounding, not bit-identical). Needs n_rows * n_kv_heads
 * <= ATTENTION_SCRATCH_COUNTERS (else the second kernel). Read at each attention_run; the CUDA
 * backend sets it from PD_CUDA_ATTN_FOLD=1 at creation. Off: measured slower (session 8, batch
 * 1 / 32k 77 against 47 us per layer: the last block merges all splits alone). */
extern int attention_fold;

/* Split counters at the start of attention_run's scratch (int32 each; the partials follow):
 * they must be zero before a caller's first attention_run on that scratch, and every call
 * leaves them zero. attention_splits splits only below 396 (row, KV head) blocks. */
#define ATTENTION_SCRATCH_COUNTERS 512

/* Floats of scratch attention_run needs for that many splits (0 when n_splits == 1): the
 * counters, then (n_splits, n_rows, n_heads, head_dim + 2) partials. */
size_t attention_scratch_floats(int n_rows, int n_heads, int head_dim, int n_splits);

/* out (n_rows, n_heads, head_dim) f32 = softmax(q k^T / sqrt(head_dim)) v, q (n_rows, n_heads,
 * head_dim) f32, n_rows = q_start[n_seqs] (the caller passes it), batch arrays device memory,
 * max_ctx >= every ctx_len (bounds the split size). scratch: attention_scratch_floats() f32,
 * its first ATTENTION_SCRATCH_COUNTERS zero (see there).
 * Needs head_dim in {64, 128, 256}, n_heads % n_kv_heads == 0, n_heads / n_kv_heads <= 8. */
pd_status_t attention_run(float *out, float *scratch, const float *q, const void *arena,
                          const kv_layout_t *l, int layer, const pd_attn_batch_t *batch, int n_rows,
                          int n_heads, int max_ctx, int n_splits, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
