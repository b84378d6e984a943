#include "dtype.h"

static const struct {
    const char *name;
    size_t size;
} dtype_info[PD_DTYPE__COUNT] = {
    [PD_DTYPE_F32] = {"F32", 4},  [PD_DTYPE_F16] = {"F16", 2},          [PD_DTYPE_BF16] = {"BF16", 2},
    [PD_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [PD_DTYPE_F64] = {"F64", 8}, [PD_DTYPE_I8] = {"I8", 1},
    [PD_DTYPE_U8] = {"U8", 1},    [PD_DTYPE_I16] = {"I16", 2},          [PD_DTYPE_I32] = {"I32", 4},
    [PD_DTYPE_I64] = {"I64", 8},  [PD_DTYPE_BOOL] = {"BOOL", 1},
};

size_t pd_dtype_size(pd_dtype_t dt)
{
    return (unsigned)dt < PD_DTYPE__COUNT ? dtype_info[dt].size : 0;
}

const char *pd_dtype_name(pd_dtype_t dt)
{
    return (unsigned)dt < PD_DTYPE__COUNT ? dtype_info[dt].name : "?";
}

int pd_dtype_parse(const char *name, pd_dtype_t *dt_p)
{
    for (int i = 0; i < PD_DTYPE__COUNT; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *dt_p = (pd_dtype_t)i;
            return 0;
        }
    }
    return -1;
}
