#include "dtype.h"

#include <string.h>

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

const char *const pd_wfmt_names[PD_WFMT_COUNT + 1] = {
    [PD_WFMT_BF16] = "bf16",           [PD_WFMT_FP8] = "fp8",
    [PD_WFMT_INT4] = "int4",           [PD_WFMT_F32] = "f32",
    [PD_WFMT_FP8_BLOCK] = "fp8-block", [PD_WFMT_COUNT] = NULL};
const char *const pd_kvfmt_names[PD_KV_COUNT + 1] = {
    [PD_KV_BF16] = "bf16", [PD_KV_FP8] = "fp8", [PD_KV_F32] = "f32", [PD_KV_COUNT] = NULL};

static int dtype__find(const char *const *names, const char *name)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

int pd_wfmt_parse(const char *name, pd_wfmt_t *fmt_p)
{
    int i = dtype__find(pd_wfmt_names, name);
    if (i < 0)
        return -1;
    *fmt_p = (pd_wfmt_t)i;
    return 0;
}

int pd_kvfmt_parse(const char *name, pd_kvfmt_t *fmt_p)
{
    int i = dtype__find(pd_kvfmt_names, name);
    if (i < 0)
        return -1;
    *fmt_p = (pd_kvfmt_t)i;
    return 0;
}

const char *pd_wfmt_name(pd_wfmt_t fmt)
{
    return (unsigned)fmt < PD_WFMT_COUNT ? pd_wfmt_names[fmt] : "?";
}

const char *pd_kvfmt_name(pd_kvfmt_t fmt)
{
    return (unsigned)fmt < PD_KV_COUNT ? pd_kvfmt_names[fmt] : "?";
}
