/* Tests common/chat_template.c on the fixtures' ChatML template, a Llama-3 style template with
 * whitespace control and conditions, and refusal of constructs outside the subset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "chat_template.h"

static const chat_message_t msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};

static void test_chatml(void **s)
{
    const char *t = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                    "{% endif %}";
    char *out;
    (void)s;
    assert_int_equal(chat_template_render(t, msgs, 2, true, "<s>", "</s>", &out), PD_OK);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                             "<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    assert_int_equal(chat_template_render(t, msgs, 2, false, "<s>", "</s>", &out), PD_OK);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                             "<|im_end|>\n");
    free(out);
}

static void test_llama3_style(void **s)
{
    const char *t = "{{- bos_token }}\n{%- for message in messages %}\n"
                    "    {%- if message.role == 'system' and loop.first %}"
                    "{{- '[SYS]' + message.content + '[/SYS]' }}\n"
                    "    {%- elif message.role != 'system' %}"
                    "{{- '<' + message.role + '>' + message.content }}\n"
                    "    {%- endif %}\n{%- endfor %}\n"
                    "{%- if add_generation_prompt %}{{- '<assistant>' }}{%- endif %}";
    char *out;
    (void)s;
    assert_int_equal(chat_template_render(t, msgs, 2, true, "<s>", "</s>", &out), PD_OK);
    assert_string_equal(out, "<s>[SYS]Be brief.[/SYS]<user>Hi<assistant>");
    free(out);
}

static void test_refused(void **s)
{
    char *out = NULL;
    (void)s;
    assert_int_equal(chat_template_render("{{ messages | length }}", msgs, 2, true, "", "", &out),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(chat_template_render("{% set x = 1 %}", msgs, 2, true, "", "", &out),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(chat_template_render("{% if add_generation_prompt %}x", msgs, 2, true, "",
                                          "", &out),
                     PD_ERR_FORMAT);
    assert_int_equal(chat_template_render("{{ unclosed", msgs, 2, true, "", "", &out),
                     PD_ERR_FORMAT);
    assert_null(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml),
        cmocka_unit_test(test_llama3_style),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
