/* backend_cpu_family: the CPU reference of the ops GLM-4.5 and DeepSeek-V3 / Kimi K2 add to the
 * ops table (backend.h: bias_add ... latent_attention). Internal to the CPU backend: backend_cpu.c
 * puts these in its table; the contracts are the table's. pool is the backend's thread pool. */
#ifndef PD_BACKEND_CPU_FAMILY_H
#define PD_BACKEND_CPU_FAMILY_H

#include "backend.h"
#include "threadpool.h"

void backend_cpu__bias_add(pd_backend_t *be, float *x, const float *bias, int n, int d);
void backend_cpu__rope_partial(pd_backend_t *be, float *x, const int32_t *pos,
                               const float *inv_freq, int n, int n_heads, int head_dim, int rot_dim,
                               bool interleave, float scale);
void backend_cpu__moe_route_grouped(pd_backend_t *be, int32_t *ids, float *weights,
                                    const float *logits, const float *bias, int n, int n_experts,
                                    int k, int n_group, int topk_group, bool norm, float scale);
void backend_cpu__head_matmul(pd_backend_t *be, float *out, const float *x, const uint16_t *w,
                              int n, int n_heads, int nout, int kin, int x_stride);
void backend_cpu__latent_write(pd_backend_t *be, void *arena, const kv_layout_t *l, int layer,
                               const float *c, const float *kpe, const int32_t *slots, int n,
                               int r);
void backend_cpu__latent_attention(pd_backend_t *be, float *out, const float *q_lat,
                                   const float *q_pe, const void *arena, const kv_layout_t *l,
                                   int layer, const pd_attn_batch_t *batch, int n_heads, int r,
                                   int pe_stride, float scale);

/* the backend's thread pool (backend_cpu.c) */
threadpool_t *backend_cpu__pool(pd_backend_t *be);

#endif
