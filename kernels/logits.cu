/* logits: GPU logits processing for the sampler (see logits.h). */
#include "kutil.cuh"

extern "C" {
#include "logits.h"
#include "sampler.h"
}

#define LOGITS__THREADS 256

/* ==== kernels ==== */

/* One thread per entry j: logits[row, token] through repetition, frequency and presence
 * penalties, the bias, then the min_tokens mask (the order of sampler_logits_process_ref). */
__global__ void logits__process(float *__restrict__ logits, int n, int vocab,
                                const int32_t *__restrict__ ent, const float *__restrict__ bias,
                                int n_ent, const float *__restrict__ pen)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_ent)
        return;
    const int32_t row = ent[4 * j], tok = ent[4 * j + 1], count = ent[4 * j + 2],
                  flags = ent[4 * j + 3];
    if (row < 0 || row >= n || tok < 0 || tok >= vocab)
        return;
    float *x = logits + (size_t)row * (size_t)vocab + tok;
    const float presence = pen[3 * row], frequency = pen[3 * row + 1],
                repetition = pen[3 * row + 2];
    float v = *x;
    if (repetition != 1.0f && (count > 0 || (flags & SAMPLER_ENT_IN_PROMPT)))
        v = v > 0.0f ? __fdiv_rn(v, repetition) : __fmul_rn(v, repetition);
    /* no contraction into an FMA: the CPU reference rounds each step */
    v = __fsub_rn(v, __fadd_rn(__fmul_rn(frequency, (float)count),
                               __fmul_rn(presence, count > 0 ? 1.0f : 0.0f)));
    v = __fadd_rn(v, bias[j]);
    if (flags & SAMPLER_ENT_MASKED)
        v = -INFINITY;
    *x = v;
}

/* ==== launchers ==== */

extern "C" pd_status_t logits_process_run(float *logits, int n, int vocab, const int32_t *ent,
                                          const float *bias, int n_ent, const float *pen,
                                          cudaStream_t stream)
{
    KUTIL_REQUIRE(n >= 0 && vocab > 0 && n_ent >= 0, "logits_process_run");
    KUTIL_REQUIRE(n_ent == 0 || (logits && ent && bias && pen), "logits_process_run");
    if (n_ent == 0 || n == 0)
        return PD_OK;
    const int blocks = (n_ent + LOGITS__THREADS - 1) / LOGITS__THREADS;
    logits__process<<<blocks, LOGITS__THREADS, 0, stream>>>(logits, n, vocab, ent, bias, n_ent,
                                                            pen);
    return KUTIL_LAUNCHED("logits_process_run");
}
