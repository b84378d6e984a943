/* pd_grpc_wire: the pieces of the gRPC-over-HTTP/2 wire format that do not need a session.
 *
 * - The deframer reassembles length-prefixed messages (1 flag byte, 4 bytes big-endian length,
 *   payload) from DATA chunks of any size. Each stream owns one; buffers grow with the bytes that
 *   actually arrive, never with the declared length alone, and are capped at max_msg.
 * - grpc-timeout parsing/formatting, grpc-message percent-encoding, HTTP status -> gRPC code.
 * Pure functions and caller-owned objects: any thread, one thread per object.
 */
#ifndef PD_GRPC_WIRE_H
#define PD_GRPC_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define PD_GRPC_WIRE_HDR_LEN 5

/* The gRPC status codes (name, value): one list for the enum and pd_grpc_wire_code_name(). */
#define PD_GRPC_CODE_LIST(X)                                                                       \
    X(OK, 0)                                                                                       \
    X(CANCELLED, 1)                                                                                \
    X(UNKNOWN, 2)                                                                                  \
    X(INVALID_ARGUMENT, 3)                                                                         \
    X(DEADLINE_EXCEEDED, 4)                                                                        \
    X(NOT_FOUND, 5)                                                                                \
    X(ALREADY_EXISTS, 6)                                                                           \
    X(PERMISSION_DENIED, 7)                                                                        \
    X(RESOURCE_EXHAUSTED, 8)                                                                       \
    X(FAILED_PRECONDITION, 9)                                                                      \
    X(ABORTED, 10)                                                                                 \
    X(OUT_OF_RANGE, 11)                                                                            \
    X(UNIMPLEMENTED, 12)                                                                           \
    X(INTERNAL, 13)                                                                                \
    X(UNAVAILABLE, 14)                                                                             \
    X(DATA_LOSS, 15)                                                                               \
    X(UNAUTHENTICATED, 16)

enum {
#define PD_GRPC__ENUM(name, value) PD_GRPC_##name = value,
    PD_GRPC_CODE_LIST(PD_GRPC__ENUM)
#undef PD_GRPC__ENUM
};

typedef struct {
    uint8_t hdr[PD_GRPC_WIRE_HDR_LEN]; /* the prefix being read */
    size_t hdr_got;                 /* bytes of hdr read so far (5 = payload in progress) */
    uint8_t *buf;                   /* (cap) payload bytes */
    size_t cap, got, want;          /* buffer capacity, payload bytes read, declared length */
    size_t max_msg;                 /* largest accepted payload */
    int ready;                      /* a complete message sits in buf (until the next feed) */
} pd_grpc_wire_deframer_t;

/* Prepares caller-owned storage; accepts messages up to max_msg bytes. */
void pd_grpc_wire_deframer_init(pd_grpc_wire_deframer_t *d, size_t max_msg);

/* Frees the buffer; the storage may be reused after another init. Accepts NULL. */
void pd_grpc_wire_deframer_deinit(pd_grpc_wire_deframer_t *d);

/* Consumes bytes from data[0..len) until one message completes or the input ends; *used_p says
 * how many were consumed. When a message completed, *msg_p and *msg_len_p point at its payload
 * (valid until the next call on d); otherwise *msg_p is NULL. Call again with the rest of the
 * input. Returns PD_OK; PD_ERR_UNSUPPORTED when the compressed flag is 1; PD_ERR_PROTOCOL for any
 * other flag value; PD_ERR_RESOURCE when the declared length exceeds max_msg; PD_ERR_NOMEM. After
 * an error d is unusable (deinit it); the outputs are not written. */
pd_status_t pd_grpc_wire_deframer_feed(pd_grpc_wire_deframer_t *d, const uint8_t *data, size_t len,
                                    size_t *used_p, const uint8_t **msg_p, size_t *msg_len_p);

/* Returns nonzero when d holds part of a message (so END_STREAM now means truncation). */
int pd_grpc_wire_deframer_partial(const pd_grpc_wire_deframer_t *d);

/* A call's custom metadata (headers other than pseudo-headers and gRPC's own): owned,
 * NUL-terminated key / value copies in arrival order. bytes counts key + value lengths, for a
 * caller's size limit. Zero-initialized storage is an empty list. */
typedef struct {
    char *key, *value;
} pd_grpc_wire_md_t;

typedef struct {
    pd_grpc_wire_md_t *items; /* (n) */
    size_t n, bytes;
} pd_grpc_wire_md_list_t;

/* Appends copies of key[0..key_len) and value[0..value_len). Returns PD_OK or PD_ERR_NOMEM (the
 * list is unchanged). */
pd_status_t pd_grpc_wire_md_add(pd_grpc_wire_md_list_t *l, const char *key, size_t key_len,
                                const char *value, size_t value_len);

/* Returns the value of the first entry named key (exact match), or NULL. */
const char *pd_grpc_wire_md_get(const pd_grpc_wire_md_list_t *l, const char *key);

/* Frees every entry; the list is empty afterwards. */
void pd_grpc_wire_md_deinit(pd_grpc_wire_md_list_t *l);

/* Writes the 5-byte prefix of an uncompressed message of len bytes into out. */
void pd_grpc_wire_prefix(uint8_t out[PD_GRPC_WIRE_HDR_LEN], uint32_t len);

/* Parses a grpc-timeout value ("100m", "5S": 1-8 digits then one of H M S m u n) into whole
 * milliseconds, rounding up (1n -> 1 ms). Returns PD_OK or PD_ERR_FORMAT (*ms_p unwritten). */
pd_status_t pd_grpc_wire_timeout_parse(const char *s, size_t len, int64_t *ms_p);

/* Formats ms (>= 0) as a grpc-timeout value into out (at least 12 bytes), picking the finest unit
 * that fits in 8 digits. */
void pd_grpc_wire_timeout_format(char *out, size_t out_len, int64_t ms);

/* Percent-encodes s for grpc-message (bytes outside 0x20..0x7e and '%' become %XX). Returns a
 * malloc'd string, or NULL when out of memory. */
char *pd_grpc_wire_pct_encode(const char *s);

/* Decodes a percent-encoded grpc-message of len bytes; malformed escapes are kept literally.
 * Returns a malloc'd NUL-terminated string, or NULL when out of memory. */
char *pd_grpc_wire_pct_decode(const char *s, size_t len);

/* Maps an HTTP status of a response without grpc-status to a gRPC code, as the gRPC spec's
 * "HTTP to gRPC status code mapping" table does. */
int pd_grpc_wire_http_to_grpc(int http_status);

/* The name of a gRPC status code ("UNAVAILABLE"), "UNKNOWN" for codes outside 0..16. */
const char *pd_grpc_wire_code_name(int code);

/* Converts a gRPC status code received from a peer into a pd_status_t (DATA_LOSS ->
 * PD_ERR_KV_INTEGRITY, UNAVAILABLE -> PD_ERR_UNAVAILABLE, ...). */
pd_status_t pd_grpc_wire_code_to_status(int code);

#endif
