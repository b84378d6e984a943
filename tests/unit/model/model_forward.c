/* Tests model_forward_sample (common/model/model_forward.c) on the CPU backend against its
 * definition: model_forward's logits, then sampler_logits_process_ref, sampler_pick with the
 * given draws and sampler_logprobs of the raw rows, bit for bit. tiny-llama, a mixed batch (two
 * prompts in one prefill step: several logit rows, one of them a repeated row), then decode steps
 * of three sequences with greedy, temperature / top-k / top-p rows, penalties, logit bias and
 * min_tokens masks on some rows and logprobs on others; the draws are random (seed printed,
 * PD_TEST_SEED to repeat).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "model.h"
#include "sampler.h"

#define PAGE_TOKENS 16
#define N_SEQ 3
#define MAX_ENT 64

static uint64_t rng;

static uint64_t rnd_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static float rnd_unit(void) /* [0, 1) */
{
    return (float)(rnd_u64() >> 40) / 16777216.0f;
}

typedef struct {
    pd_backend_t *be;
    model_t *m;
    model_ctx_t *ctx;
    kv_layout_t l;
    void *arena;
    kv_seq_t seqs[N_SEQ];
} fix_t;

static int setup(void **state)
{
    fix_t *f = calloc(1, sizeof *f);
    char dir[2048];
    snprintf(dir, sizeof dir, "%s/tiny-llama", getenv("PD_MODELS_DIR"));
    assert_int_equal(backend_cpu_create(2, &f->be), PD_OK);
    model_load_params_t mp = {dir, PD_WFMT_BF16, PD_WFMT_BF16, f->be, false, NULL};
    assert_int_equal(model_load(&mp, &f->m), PD_OK);
    kv_layout_init(&f->l, f->m->cfg.num_hidden_layers, f->m->cfg.num_key_value_heads,
                   f->m->cfg.head_dim, PAGE_TOKENS, PD_KV_F32);
    const int per_seq = 8;
    f->arena = calloc((size_t)(N_SEQ * per_seq), f->l.page_bytes);
    for (int s = 0; s < N_SEQ; s++) {
        kv_seq_init(&f->seqs[s]);
        for (int p = 0; p < per_seq; p++)
            kv_seq_push_page(&f->seqs[s], (kv_page_ref_t){s * per_seq + p, 0, 0});
    }
    assert_int_equal(model_ctx_create(f->m, &f->ctx), PD_OK);
    assert_true(model_ctx_can_sample(f->ctx));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fix_t *f = *state;
    model_ctx_destroy(f->ctx);
    for (int s = 0; s < N_SEQ; s++)
        kv_seq_deinit(&f->seqs[s]);
    free(f->arena);
    model_destroy(f->m);
    backend_destroy(f->be);
    free(f);
    return 0;
}

/* The plan of one step for n rows, random but reproducible from rng. */
typedef struct {
    float temp[8], topp[8], u[8], pen[8 * 3], bias[MAX_ENT];
    int32_t topk[8], ntop[8], ent[MAX_ENT * 4];
    int n_ent;
} plan_t;

static void plan_make(plan_t *p, int n, int vocab, int step)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < n; i++) {
        const int kind = (i + step) % 4;
        p->temp[i] = kind == 0 ? 0.0f : 0.5f + rnd_unit();
        p->topk[i] = kind == 2 ? 20 : 0;
        p->topp[i] = kind == 3 ? 0.9f : 1.0f;
        p->u[i] = kind == 0 ? 0.0f : rnd_unit();
        p->ntop[i] = (i + step) % 3 == 0 ? -1 : (int32_t)((i * 7 + step) % 6);
        p->pen[3 * i] = (i % 2) ? 0.5f : 0.0f;
        p->pen[3 * i + 1] = (i % 2) ? 0.25f : 0.0f;
        p->pen[3 * i + 2] = (i % 2) ? 1.3f : 1.0f;
        if (i % 2 == 0)
            continue;
        /* entries of row i: distinct tokens (a stride through the vocabulary) */
        const int k = 6 + (int)(rnd_u64() % 6), t0 = (int)(rnd_u64() % (uint64_t)vocab);
        for (int j = 0; j < k && p->n_ent < MAX_ENT; j++) {
            int32_t *e = &p->ent[4 * p->n_ent];
            e[0] = i;
            e[1] = (t0 + j * 97) % vocab;
            e[2] = (int32_t)(rnd_u64() % 3);
            e[3] = (j % 3 == 0 ? SAMPLER_ENT_IN_PROMPT : 0) | (j == 5 ? SAMPLER_ENT_MASKED : 0);
            p->bias[p->n_ent] = j == 1 ? 5.0f : (rnd_unit() - 0.5f);
            p->n_ent++;
        }
    }
}

/* One batch both ways: model_forward's logits and the host reference, then
 * model_forward_sample; asserts equal tokens and logprobs. Returns the sampled tokens. */
static void check_batch(fix_t *f, const model_batch_t *b, int step, int32_t *tok_out)
{
    const int n = b->n_logits, vocab = f->m->cfg.vocab_size;
    float *lg = malloc((size_t)n * vocab * 4), *pl = malloc((size_t)n * vocab * 4);
    int32_t *idx = malloc((size_t)vocab * 4), tok[8];
    float *probs = malloc((size_t)vocab * 4);
    sampler_logprobs_t lp[8], ref;
    plan_t p;

    assert_true(n <= 8);
    plan_make(&p, n, vocab, step);
    assert_int_equal(model_forward(f->ctx, f->arena, &f->l, b, lg), PD_OK);
    memcpy(pl, lg, (size_t)n * vocab * 4);
    sampler_logits_process_ref(pl, n, vocab, p.ent, p.bias, p.n_ent, p.pen);

    model_sampling_t smp = {p.temp, p.topk, p.topp, p.u, p.ntop, p.n_ent, p.ent, p.bias, p.pen};
    memset(lp, 0xab, sizeof lp);
    assert_int_equal(model_forward_sample(f->ctx, f->arena, &f->l, b, &smp, tok, lp), PD_OK);
    for (int i = 0; i < n; i++) {
        sampler_params_t sp = {p.temp[i], p.topk[i], p.topp[i], 0};
        int32_t want = sampler_pick(&sp, pl + (size_t)i * vocab, vocab, p.u[i], idx, probs);
        assert_int_equal(tok[i], want);
        if (p.ntop[i] < 0)
            continue;
        sampler_logprobs(lg + (size_t)i * vocab, vocab, want, p.ntop[i], &ref);
        assert_int_equal(lp[i].token, ref.token);
        assert_int_equal(lp[i].n_top, ref.n_top);
        assert_memory_equal(&lp[i].logprob, &ref.logprob, 4);
        assert_memory_equal(lp[i].top_ids, ref.top_ids, (size_t)ref.n_top * 4);
        assert_memory_equal(lp[i].top_logprobs, ref.top_logprobs, (size_t)ref.n_top * 4);
    }
    memcpy(tok_out, tok, (size_t)n * 4);
    free(lg);
    free(pl);
    free(idx);
    free(probs);
}

static void test_forward_sample(void **state)
{
    fix_t *f = *state;
    const kv_seq_t *sp[N_SEQ] = {&f->seqs[0], &f->seqs[1], &f->seqs[2]};
    int32_t toks[64], qs[N_SEQ + 1], cl[N_SEQ], rows[8], out[8];
    const int vocab = f->m->cfg.vocab_size;

    /* prefill of two prompts (5 and 9 tokens) and the third (3 tokens) in one batch; logit rows:
     * each prompt's last row, one middle row, and the last row twice */
    const int len[N_SEQ] = {5, 9, 3};
    int n_tok = 0;
    for (int s = 0; s < N_SEQ; s++) {
        qs[s] = n_tok;
        for (int i = 0; i < len[s]; i++)
            toks[n_tok++] = (int32_t)(1 + rnd_u64() % (uint64_t)(vocab - 1));
        cl[s] = len[s];
    }
    qs[N_SEQ] = n_tok;
    rows[0] = qs[1] - 1;
    rows[1] = 7;
    rows[2] = qs[2] - 1;
    rows[3] = qs[3] - 1;
    rows[4] = qs[3] - 1;
    model_batch_t b = {n_tok, toks, N_SEQ, qs, cl, sp, 5, rows};
    check_batch(f, &b, 0, out);
    int32_t last[N_SEQ] = {out[0], out[2], out[3]};

    /* decode steps: one token per sequence, every row's logits */
    for (int step = 1; step <= 6; step++) {
        for (int s = 0; s < N_SEQ; s++) {
            toks[s] = last[s];
            qs[s] = s;
            cl[s]++;
            rows[s] = s;
        }
        qs[N_SEQ] = N_SEQ;
        model_batch_t d = {N_SEQ, toks, N_SEQ, qs, cl, sp, N_SEQ, rows};
        check_batch(f, &d, step, out);
        memcpy(last, out, sizeof last);
    }
    /* no logit rows: nothing sampled, no error */
    toks[0] = last[0];
    qs[0] = 0;
    qs[1] = 1;
    cl[0]++;
    model_batch_t z = {1, toks, 1, qs, cl, sp, 0, rows};
    model_sampling_t none = {0};
    assert_int_equal(model_forward_sample(f->ctx, f->arena, &f->l, &z, &none, out, NULL), PD_OK);
}

int main(void)
{
    const char *env = getenv("PD_TEST_SEED");
    rng = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) * 2654435761u + 1;
    rng = rng ? rng : 1;
    printf("# model_forward seed %llu (PD_TEST_SEED)\n", (unsigned long long)rng);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_forward_sample, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
