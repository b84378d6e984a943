/* Fuzz target: node_kv_done_unpack on arbitrary bytes (what another node could send as a KV-done
 * message). Anything it accepts must be within the documented ranges and pack back to a message
 * that unpacks to the same fields. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_verdict.h"
#include "node.h"

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
    node_kv_done_t m, again;
    uint8_t buf[NODE_KV_DONE_MAX];
    size_t len;

    if (node_kv_done_unpack(data, size, "fuzz", &m) != PD_OK) {
        fuzz_verdict = "reject";
        return 0;
    }
    fuzz_verdict = "accept";
    FUZZ_CHECK(m.seq_id >= 1);
    FUZZ_CHECK(m.first_token >= 0);
    FUZZ_CHECK(m.n_tokens >= 1 && m.n_tokens <= INT32_MAX);
    FUZZ_CHECK(m.n_pages >= 1 && m.n_pages <= m.n_tokens);
    FUZZ_CHECK(node_kv_done_pack(&m, buf, sizeof buf, &len) == PD_OK);
    FUZZ_CHECK(node_kv_done_unpack(buf, len, "fuzz", &again) == PD_OK);
    FUZZ_CHECK(again.seq_id == m.seq_id && again.first_token == m.first_token &&
               again.n_tokens == m.n_tokens && again.n_pages == m.n_pages &&
               again.checksum == m.checksum && again.aborted == m.aborted &&
               !memcmp(again.token, m.token, NODE_TOKEN_BYTES));
    FUZZ_CHECK(m.n_slices == 0 || (m.n_slices >= 2 && m.n_slices <= NODE_KV_DONE_SLICES_MAX));
    FUZZ_CHECK(again.n_slices == m.n_slices &&
               !memcmp(again.slice_sums, m.slice_sums, (size_t)m.n_slices * sizeof(uint64_t)));
    return 0;
}
