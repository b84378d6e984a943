#include "status.h"

#include <stdio.h>
#include <stdlib.h>

const char *pd_status_str(pd_status_t st)
{
    switch (st) {
#define PD_STATUS__STR(name, value, msg, grpc, http)                                               \
    case name:                                                                                     \
        return msg;
        PD_STATUS_LIST(PD_STATUS__STR)
#undef PD_STATUS__STR
    }
    return "unknown status";
}

const char *pd_status_name(pd_status_t st)
{
    switch (st) {
#define PD_STATUS__NAME(name, value, msg, grpc, http)                                              \
    case name:                                                                                     \
        return #name;
        PD_STATUS_LIST(PD_STATUS__NAME)
#undef PD_STATUS__NAME
    }
    return "PD_UNKNOWN";
}

int pd_status_grpc_code(pd_status_t st)
{
    switch (st) {
#define PD_STATUS__GRPC(name, value, msg, grpc, http)                                              \
    case name:                                                                                     \
        return grpc;
        PD_STATUS_LIST(PD_STATUS__GRPC)
#undef PD_STATUS__GRPC
    }
    return 2;
}

int pd_status_http_code(pd_status_t st)
{
    switch (st) {
#define PD_STATUS__HTTP(name, value, msg, grpc, http)                                              \
    case name:                                                                                     \
        return http;
        PD_STATUS_LIST(PD_STATUS__HTTP)
#undef PD_STATUS__HTTP
    }
    return 500;
}

void pd__assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "pdserve: assertion failed: %s (%s:%d)\n", expr, file, line);
    fflush(stderr);
    abort();
}
