/* Fuzz target: safetensors_open_memory on arbitrary bytes. Anything it accepts must be internally
 * consistent: every tensor lies inside the input, its size matches its shape, and lookups agree. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_verdict.h"
#include "safetensors.h"

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);         \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    safetensors_t *st;
    const safetensors_tensor_t *got;
    size_t covered = 0;

    if (safetensors_open_memory(data, size, "fuzz", &st) != PD_OK) {
        fuzz_verdict = "reject";
        return 0;
    }
    fuzz_verdict = "accept";
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const safetensors_tensor_t *t = safetensors_at(st, i);
        uint64_t n = pd_dtype_size(t->dtype);
        FUZZ_CHECK(t && t->name);
        FUZZ_CHECK(t->n_dims >= 0 && t->n_dims <= SAFETENSORS_MAX_DIMS);
        for (int d = 0; d < t->n_dims; d++) {
            FUZZ_CHECK(t->shape[d] >= 0);
            n *= (uint64_t)t->shape[d]; /* cannot wrap: the reader checked */
        }
        FUZZ_CHECK(n == t->nbytes);
        FUZZ_CHECK((const uint8_t *)t->data >= data + 8);
        FUZZ_CHECK((const uint8_t *)t->data + t->nbytes <= data + size);
        FUZZ_CHECK(safetensors_find(st, t->name) == t);
        FUZZ_CHECK(safetensors_get(st, t->name, t->dtype, t->n_dims, t->shape, &got) == PD_OK);
        FUZZ_CHECK(got == t);
        covered += t->nbytes;
    }
    FUZZ_CHECK(safetensors_at(st, safetensors_count(st)) == NULL);
    if (safetensors_count(st) > 0) /* the tensors tile the data area exactly */
        FUZZ_CHECK((const uint8_t *)safetensors_at(st, 0)->data + covered == data + size);
    (void)safetensors_metadata(st, "format");
    safetensors_close(st);
    return 0;
}
