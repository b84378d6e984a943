/* Tests common/dtype.h: bf16 and fp8 e4m3 conversions against exhaustive decoding. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "dtype.h"

static void test_fp8_roundtrip(void **state)
{
    (void)state;
    /* every finite code decodes and encodes back to itself (except -0 -> 0x80 stays) */
    for (int v = 0; v < 256; v++) {
        float f = pd_fp8_to_f32((uint8_t)v);
        if (isnan(f))
            continue;
        assert_int_equal(pd_f32_to_fp8(f), v);
    }
    assert_true(fabsf(pd_fp8_to_f32(0x7e) - 448.0f) == 0.0f);
    assert_int_equal(pd_f32_to_fp8(1e6f), 0x7e);
    assert_int_equal(pd_f32_to_fp8(-1e6f), 0xfe);
    assert_int_equal(pd_f32_to_fp8(NAN), 0x7f);
}

static void test_fp8_nearest(void **state)
{
    (void)state;
    /* the encoder picks the nearest representable value for random inputs */
    srand(1);
    for (int i = 0; i < 100000; i++) {
        float x = ((float)rand() / (float)RAND_MAX - 0.5f) * 1000.0f * powf(10.0f, -(rand() % 6));
        float got = pd_fp8_to_f32(pd_f32_to_fp8(x));
        float best = INFINITY;
        for (int v = 0; v < 256; v++) {
            float f = pd_fp8_to_f32((uint8_t)v);
            if (!isnan(f) && fabsf(f - x) < best)
                best = fabsf(f - x);
        }
        assert_true(fabsf(got - x) <= best);
    }
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(pd_f32_to_bf16(1.0f), 0x3f80);
    assert_true(pd_bf16_to_f32(pd_f32_to_bf16(3.14159f)) == 3.140625f);
    /* ties to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 */
    assert_int_equal(pd_f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80);
    assert_true(isnan(pd_bf16_to_f32(pd_f32_to_bf16(NAN))));
    assert_true(pd_f16_to_f32(0x3c00) == 1.0f);
    assert_true(pd_f16_to_f32(0xc000) == -2.0f);
}

static void test_names(void **state)
{
    pd_dtype_t dt;
    (void)state;
    assert_int_equal(pd_dtype_parse("F8_E4M3", &dt), 0);
    assert_int_equal(dt, PD_DTYPE_F8_E4M3);
    assert_int_equal(pd_dtype_size(PD_DTYPE_BF16), 2);
    assert_int_equal(pd_dtype_parse("Q4", &dt), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_roundtrip),
        cmocka_unit_test(test_fp8_nearest),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
