/* libFuzzer target for pd_grpc_wire's deframer: byte 0 picks the chunk size, byte 1 the message
 * limit; the rest is fed in chunks. Checks that every message fits the limit, that consumption
 * always progresses, and that nothing leaks after an error. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_verdict.h"
#include "grpc_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pd_grpc_wire_deframer_t d;
    size_t chunk, max;

    if (size < 2)
        return 0;
    chunk = (size_t)data[0] % 17 + 1;
    max = (size_t)data[1] * 64;
    data += 2;
    size -= 2;
    pd_grpc_wire_deframer_init(&d, max);
    fuzz_verdict = "accept"; /* every byte consumed; "reject" when the deframer refused */
    for (size_t off = 0; off < size;) {
        size_t c = size - off < chunk ? size - off : chunk;
        const uint8_t *p = data + off;
        off += c;
        while (c > 0) {
            const uint8_t *msg;
            size_t used, mlen;
            if (pd_grpc_wire_deframer_feed(&d, p, c, &used, &msg, &mlen) != PD_OK) {
                fuzz_verdict = "reject";
                goto done;
            }
            if (used > c || (used == 0 && !msg))
                abort();
            if (msg && mlen > max)
                abort();
            if (msg && mlen > 0) {
                volatile uint8_t ends = msg[0] ^ msg[mlen - 1]; /* ASan checks the bounds */
                (void)ends;
            }
            p += used;
            c -= used;
        }
    }
    if (pd_grpc_wire_deframer_partial(&d))
        fuzz_verdict = "partial"; /* a message cut off at the end of the input */
done:
    pd_grpc_wire_deframer_deinit(&d);
    return 0;
}
