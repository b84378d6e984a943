#include "chat_template.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* ==== output buffer ==== */

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} ct_buf_t;

static void ct_put(ct_buf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

/* ==== template segments ==== */

typedef enum { SEG_TEXT, SEG_EXPR, SEG_STMT } seg_kind_t;

typedef struct {
    seg_kind_t kind;
    const char *p; /* text, or the tag's inside */
    size_t n;
} seg_t;

typedef struct {
    seg_t *segs;
    size_t n;
    const chat_message_t *msgs;
    size_t n_msgs;
    bool add_gen;
    const char *bos, *eos;
    /* loop state */
    int in_loop;
    size_t idx;
    const char *var;
    size_t var_len;
    ct_buf_t out;
    pd_status_t st;
} ct_t;

static pd_status_t ct_split(const char *t, seg_t **segs_p, size_t *n_p)
{
    size_t cap = 16, n = 0;
    seg_t *segs = malloc(cap * sizeof *segs);
    int trim_next = 0;
    if (!segs)
        return PD_ERR_NOMEM;
    while (*t) {
        const char *open = strstr(t, "{");
        while (open && open[1] != '{' && open[1] != '%' && open[1] != '#')
            open = strchr(open + 1, '{');
        size_t tl = open ? (size_t)(open - t) : strlen(t);
        const char *ts = t;
        if (trim_next)
            while (tl > 0 && isspace((unsigned char)*ts)) {
                ts++;
                tl--;
            }
        trim_next = 0;
        int trim_prev = open && open[2] == '-';
        if (trim_prev)
            while (tl > 0 && isspace((unsigned char)ts[tl - 1]))
                tl--;
        if (n + 2 > cap) {
            cap *= 2;
            seg_t *p = realloc(segs, cap * sizeof *segs);
            if (!p) {
                free(segs);
                return PD_ERR_NOMEM;
            }
            segs = p;
        }
        if (tl)
            segs[n++] = (seg_t){SEG_TEXT, ts, tl};
        if (!open)
            break;
        char kind = open[1];
        const char *close_tag = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        const char *end = strstr(open + 2, close_tag);
        if (!end) {
            free(segs);
            pd_log_error("chat template: unclosed tag at '%.20s'", open);
            return PD_ERR_FORMAT;
        }
        const char *in = open + 2 + (trim_prev ? 1 : 0);
        const char *in_end = end;
        if (in_end > in && in_end[-1] == '-') {
            in_end--;
            trim_next = 1;
        }
        while (in < in_end && isspace((unsigned char)*in))
            in++;
        while (in_end > in && isspace((unsigned char)in_end[-1]))
            in_end--;
        if (kind != '#')
            segs[n++] = (seg_t){kind == '{' ? SEG_EXPR : SEG_STMT, in, (size_t)(in_end - in)};
        t = end + 2;
    }
    *segs_p = segs;
    *n_p = n;
    return PD_OK;
}

/* ==== expressions ==== */

static int ct_word(const char *p, size_t n, const char *w)
{
    size_t l = strlen(w);
    return n >= l && memcmp(p, w, l) == 0 && (n == l || !(isalnum((unsigned char)p[l]) || p[l] == '_'));
}

static void ct_skip(const char **p, const char *end)
{
    while (*p < end && isspace((unsigned char)**p))
        (*p)++;
}

/* Evaluates one operand at *p; returns a pointer to its value (static or into msgs) and length. */
static int ct_operand(ct_t *c, const char **p, const char *end, const char **v, size_t *vl)
{
    ct_skip(p, end);
    if (*p < end && (**p == '\'' || **p == '"')) {
        char q = **p;
        const char *s = ++(*p);
        while (*p < end && **p != q)
            (*p)++;
        if (*p >= end)
            return -1;
        *v = s;
        *vl = (size_t)(*p - s);
        (*p)++;
        return 0;
    }
    const char *s = *p;
    while (*p < end && (isalnum((unsigned char)**p) || **p == '_'))
        (*p)++;
    size_t wl = (size_t)(*p - s);
    if (wl == 0)
        return -1;
    if (ct_word(s, wl, "bos_token")) {
        *v = c->bos;
        *vl = strlen(c->bos);
        return 0;
    }
    if (ct_word(s, wl, "eos_token")) {
        *v = c->eos;
        *vl = strlen(c->eos);
        return 0;
    }
    if (c->in_loop && wl == c->var_len && memcmp(s, c->var, wl) == 0) {
        const char *field;
        size_t fl;
        if (*p < end && **p == '.') {
            (*p)++;
            field = *p;
            while (*p < end && (isalnum((unsigned char)**p) || **p == '_'))
                (*p)++;
            fl = (size_t)(*p - field);
        } else if (*p + 1 < end && **p == '[' && ((*p)[1] == '\'' || (*p)[1] == '"')) {
            char q = (*p)[1];
            field = *p + 2;
            *p = field;
            while (*p < end && **p != q)
                (*p)++;
            fl = (size_t)(*p - field);
            if (*p + 1 >= end || (*p)[1] != ']')
                return -1;
            *p += 2;
        } else {
            return -1;
        }
        const chat_message_t *m = &c->msgs[c->idx];
        if (fl == 4 && memcmp(field, "role", 4) == 0)
            *v = m->role;
        else if (fl == 7 && memcmp(field, "content", 7) == 0)
            *v = m->content;
        else
            return -1;
        *vl = strlen(*v);
        return 0;
    }
    return -1;
}

/* expr := operand ('+' operand)*, appended to out */
static int ct_expr(ct_t *c, const char *p, const char *end, ct_buf_t *out)
{
    for (;;) {
        const char *v;
        size_t vl;
        if (ct_operand(c, &p, end, &v, &vl) != 0)
            return -1;
        ct_put(out, v, vl);
        ct_skip(&p, end);
        if (p >= end)
            return 0;
        if (*p != '+')
            return -1;
        p++;
    }
}

/* cond := term (('and'|'or') term)*; term := ['not'] (flag | expr ('=='|'!=') expr) */
static int ct_cond(ct_t *c, const char *p, const char *end, int *val)
{
    int acc = -1, op = 0; /* op 0 first, 1 and, 2 or */
    for (;;) {
        int neg = 0, t;
        ct_skip(&p, end);
        if (ct_word(p, (size_t)(end - p), "not")) {
            neg = 1;
            p += 3;
            ct_skip(&p, end);
        }
        const char *term_end = p;
        /* the term runs to the next top-level ' and ' / ' or ' */
        while (term_end < end && !(isspace((unsigned char)term_end[-1]) &&
                                   (ct_word(term_end, (size_t)(end - term_end), "and") ||
                                    ct_word(term_end, (size_t)(end - term_end), "or"))))
            term_end++;
        size_t tl = (size_t)(term_end - p);
        while (tl > 0 && isspace((unsigned char)p[tl - 1]))
            tl--;
        if (ct_word(p, tl, "add_generation_prompt") && tl == 21)
            t = c->add_gen;
        else if (ct_word(p, tl, "loop") && tl == 10 && memcmp(p, "loop.first", 10) == 0)
            t = c->in_loop && c->idx == 0;
        else if (tl == 9 && memcmp(p, "loop.last", 9) == 0)
            t = c->in_loop && c->idx + 1 == c->n_msgs;
        else {
            const char *eq = NULL;
            for (const char *q = p; q + 1 < p + tl; q++)
                if ((q[0] == '=' || q[0] == '!') && q[1] == '=') {
                    eq = q;
                    break;
                }
            if (!eq)
                return -1;
            ct_buf_t a = {0}, b = {0};
            int ra = ct_expr(c, p, eq, &a), rb = ct_expr(c, eq + 2, p + tl, &b);
            t = ra == 0 && rb == 0 && a.len == b.len && (a.len == 0 || !memcmp(a.s, b.s, a.len));
            if (eq[0] == '!')
                t = !t;
            free(a.s);
            free(b.s);
            if (ra || rb)
                return -1;
        }
        if (neg)
            t = !t;
        acc = op == 0 ? t : op == 1 ? (acc && t) : (acc || t);
        p = term_end;
        ct_skip(&p, end);
        if (p >= end)
            break;
        if (ct_word(p, (size_t)(end - p), "and")) {
            op = 1;
            p += 3;
        } else if (ct_word(p, (size_t)(end - p), "or")) {
            op = 2;
            p += 2;
        } else {
            return -1;
        }
    }
    *val = acc;
    return 0;
}

/* ==== statements ==== */

static int ct_is(const seg_t *s, const char *w)
{
    return s->kind == SEG_STMT && ct_word(s->p, s->n, w);
}

/* Index of the statement closing the block opened at i (endfor / endif, or for an if block the
 * next elif / else at the same depth when want_branch). */
static size_t ct_match(const ct_t *c, size_t i, int want_branch)
{
    int depth = 0;
    for (size_t k = i + 1; k < c->n; k++) {
        const seg_t *s = &c->segs[k];
        if (ct_is(s, "for") || ct_is(s, "if"))
            depth++;
        else if (ct_is(s, "endfor") || ct_is(s, "endif")) {
            if (depth == 0)
                return k;
            depth--;
        } else if (want_branch && depth == 0 && (ct_is(s, "elif") || ct_is(s, "else")))
            return k;
    }
    return c->n;
}

static void ct_fail(ct_t *c, const seg_t *s)
{
    if (c->st == PD_OK)
        pd_log_error("chat template: unsupported construct '%.*s'", (int)s->n, s->p);
    c->st = PD_ERR_UNSUPPORTED;
}

static void ct_run(ct_t *c, size_t from, size_t to)
{
    for (size_t i = from; i < to && c->st == PD_OK; i++) {
        const seg_t *s = &c->segs[i];
        if (s->kind == SEG_TEXT) {
            ct_put(&c->out, s->p, s->n);
        } else if (s->kind == SEG_EXPR) {
            if (ct_expr(c, s->p, s->p + s->n, &c->out) != 0)
                ct_fail(c, s);
        } else if (ct_is(s, "for")) {
            /* for VAR in messages */
            const char *p = s->p + 3, *end = s->p + s->n;
            ct_skip(&p, end);
            const char *var = p;
            while (p < end && (isalnum((unsigned char)*p) || *p == '_'))
                p++;
            size_t vl = (size_t)(p - var);
            ct_skip(&p, end);
            size_t close = ct_match(c, i, 0);
            if (!ct_word(p, (size_t)(end - p), "in") || close >= c->n || c->in_loop) {
                ct_fail(c, s);
                return;
            }
            p += 2;
            ct_skip(&p, end);
            if (!ct_word(p, (size_t)(end - p), "messages") || (size_t)(end - p) != 8) {
                ct_fail(c, s);
                return;
            }
            c->in_loop = 1;
            c->var = var;
            c->var_len = vl;
            for (c->idx = 0; c->idx < c->n_msgs && c->st == PD_OK; c->idx++)
                ct_run(c, i + 1, close);
            c->in_loop = 0;
            i = close;
        } else if (ct_is(s, "if")) {
            size_t k = i, end_if = i;
            int done = 0;
            /* walk the branches: if / elif ... / else / endif */
            for (;;) {
                const seg_t *b = &c->segs[k];
                size_t next = ct_match(c, k, 1);
                if (next >= c->n) {
                    c->st = PD_ERR_FORMAT;
                    pd_log_error("chat template: unclosed if");
                    return;
                }
                int take = 0;
                if (!done) {
                    if (ct_is(b, "else")) {
                        take = 1;
                    } else {
                        int skip = ct_is(b, "elif") ? 4 : 2;
                        if (ct_cond(c, b->p + skip, b->p + b->n, &take) != 0) {
                            ct_fail(c, b);
                            return;
                        }
                    }
                    if (take) {
                        ct_run(c, k + 1, next);
                        done = 1;
                    }
                }
                if (ct_is(&c->segs[next], "endif")) {
                    end_if = next;
                    break;
                }
                k = next;
            }
            i = end_if;
        } else {
            ct_fail(c, s);
        }
    }
}

pd_status_t chat_template_render(const char *tmpl, const chat_message_t *msgs, size_t n_msgs,
                                 bool add_generation_prompt, const char *bos, const char *eos,
                                 char **out_p)
{
    ct_t c = {0};
    pd_status_t st = ct_split(tmpl, &c.segs, &c.n);
    if (st != PD_OK)
        return st;
    c.msgs = msgs;
    c.n_msgs = n_msgs;
    c.add_gen = add_generation_prompt;
    c.bos = bos ? bos : "";
    c.eos = eos ? eos : "";
    ct_put(&c.out, "", 0);
    ct_run(&c, 0, c.n);
    free(c.segs);
    if (c.out.oom && c.st == PD_OK)
        c.st = PD_ERR_NOMEM;
    if (c.st != PD_OK) {
        free(c.out.s);
        return c.st;
    }
    *out_p = c.out.s;
    return PD_OK;
}
