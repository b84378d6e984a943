/* status: the one status type of the tree, pd_status_t.
 *
 * 0 is success, positive values mean "not yet / try again" (the caller may retry later), negative
 * values are errors. The enum, pd_status_str() and the mappings to gRPC status codes and HTTP
 * status codes are generated from the single X-macro list PD_STATUS_LIST below, so the four can
 * never disagree. Foreign codes (cudaError_t, ucs_status_t, libuv ints, nghttp2 errors) are
 * converted once at the boundary where they appear. All functions are thread-safe (pure).
 */
#ifndef PD_STATUS_H
#define PD_STATUS_H

/* X(name, value, message, grpc_code, http_code)
 * gRPC codes: 0 OK, 1 CANCELLED, 2 UNKNOWN, 3 INVALID_ARGUMENT, 4 DEADLINE_EXCEEDED, 5 NOT_FOUND,
 * 6 ALREADY_EXISTS, 8 RESOURCE_EXHAUSTED, 9 FAILED_PRECONDITION, 10 ABORTED, 11 OUT_OF_RANGE,
 * 12 UNIMPLEMENTED, 13 INTERNAL, 14 UNAVAILABLE, 15 DATA_LOSS. */
#define PD_STATUS_LIST(X)                                                                          \
    X(PD_OK, 0, "ok", 0, 200)                                                                      \
    X(PD_INPROGRESS, 1, "in progress", 2, 202)                                                     \
    X(PD_NO_PAGES, 2, "no free kv pages", 8, 503)                                                  \
    X(PD_AGAIN, 3, "resource busy, try again", 14, 503)                                            \
    X(PD_ERR_INVALID, -1, "invalid argument", 3, 400)                                              \
    X(PD_ERR_NOMEM, -2, "out of memory", 8, 503)                                                   \
    X(PD_ERR_IO, -3, "i/o error", 13, 500)                                                         \
    X(PD_ERR_FORMAT, -4, "malformed input", 3, 400)                                                \
    X(PD_ERR_NOT_FOUND, -5, "not found", 5, 404)                                                   \
    X(PD_ERR_UNSUPPORTED, -6, "unsupported", 12, 501)                                              \
    X(PD_ERR_TOO_LONG, -7, "input too long", 3, 400)                                               \
    X(PD_ERR_KV_INTEGRITY, -8, "kv integrity check failed", 15, 500)                               \
    X(PD_ERR_UNAVAILABLE, -9, "unavailable", 14, 503)                                              \
    X(PD_ERR_DEADLINE, -10, "deadline exceeded", 4, 504)                                           \
    X(PD_ERR_CANCELLED, -11, "cancelled", 1, 499)                                                  \
    X(PD_ERR_RESOURCE, -12, "resource exhausted", 8, 429)                                          \
    X(PD_ERR_PROTOCOL, -13, "protocol error", 13, 400)                                             \
    X(PD_ERR_TRANSPORT, -14, "transport error", 14, 502)                                           \
    X(PD_ERR_CUDA, -15, "cuda error", 13, 500)                                                     \
    X(PD_ERR_INTERNAL, -16, "internal error", 13, 500)                                             \
    X(PD_ERR_EXISTS, -17, "already exists", 6, 409)                                                \
    X(PD_ERR_TP_ABORTED, -18, "tensor-parallel step aborted: a rank failed", 10, 500)

typedef enum {
#define PD_STATUS__ENUM(name, value, msg, grpc, http) name = value,
    PD_STATUS_LIST(PD_STATUS__ENUM)
#undef PD_STATUS__ENUM
} pd_status_t;

/* Returns a static lowercase message for st ("unknown status" for values not in the list). */
const char *pd_status_str(pd_status_t st);

/* Returns the name of st as written in the list ("PD_NO_PAGES"), or "PD_UNKNOWN". */
const char *pd_status_name(pd_status_t st);

/* Returns the gRPC status code for st (2 UNKNOWN for values not in the list). */
int pd_status_grpc_code(pd_status_t st);

/* Returns the HTTP status code for st (500 for values not in the list). */
int pd_status_http_code(pd_status_t st);

#define PD_IS_ERR(st) ((st) < 0)

/* Aborts with file:line and the message when a broken invariant is found. Always compiled in. */
#define PD_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond))                                                                               \
            pd__assert_fail(#cond, __FILE__, __LINE__);                                            \
    } while (0)

#ifdef __cplusplus /* kernels/ include this header from CUDA C++ */
extern "C" [[noreturn]] void pd__assert_fail(const char *expr, const char *file, int line);
#else
_Noreturn void pd__assert_fail(const char *expr, const char *file, int line);
#endif

#endif
