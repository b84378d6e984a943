/* chat_template: renders a Hugging Face chat template (tokenizer_config.json "chat_template", a
 * Jinja template) for the OpenAI chat API. A small Jinja subset, enough for ChatML / Llama-3 /
 * Qwen style templates: literal text; {{ expr }}; {% for m in messages %}...{% endfor %};
 * {% if cond %}...{% elif cond %}...{% else %}...{% endif %}; {# comments #}; "-" whitespace
 * control. Expressions: m['role'], m.content, bos_token, eos_token, 'literals', a + b.
 * Conditions: add_generation_prompt, loop.first, loop.last, expr == expr, expr != expr, not cond,
 * cond and cond, cond or cond. Anything else is refused with PD_ERR_UNSUPPORTED (never rendered
 * wrongly). Pure functions, any thread.
 */
#ifndef PD_CHAT_TEMPLATE_H
#define PD_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

typedef struct {
    const char *role;
    const char *content;
} chat_message_t;

/* Renders tmpl; *out_p is malloc'd and NUL-terminated. PD_ERR_UNSUPPORTED (construct outside the
 * subset, logged with its text), PD_ERR_FORMAT (unbalanced blocks), PD_ERR_NOMEM. */
pd_status_t chat_template_render(const char *tmpl, const chat_message_t *msgs, size_t n_msgs,
                                 bool add_generation_prompt, const char *bos, const char *eos,
                                 char **out_p);

#endif
