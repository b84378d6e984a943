/* tp_nccl: tensor parallelism on several GPUs of one host over NCCL (issue 7). For each fixture,
 * TP = the number of visible GPUs (2 here): one thread per rank, each with its own CUDA backend on
 * its GPU and its shards; NCCL all-reduce after o_proj and down_proj, all-gather of the logits.
 * Greedy decoding of every reference prompt with BF16 weights and f32 KV must give transformers'
 * greedy ids, as TP 1 does. Exits 77 (SKIP) with fewer than 2 GPUs or without NCCL.
 * Usage: tp_nccl MODELS_DIR */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <jansson.h>

#include "backend.h"
#include "backend_cuda.h"
#include "model.h"
#include "sampler.h"
#include "tp_comm.h"
#include "tp_kv.h"

#define N_GEN 48
#define PAGE_TOKENS 16

typedef struct {
    int n_cases;
    int32_t ids[16][160];
    int n_ids[16];
    int32_t greedy[16][N_GEN];
} refs_t;

typedef struct {
    const char *dir;
    int rank, size;
    const refs_t *refs;
    pd_backend_t *be;
    tp_comm_t *comm;
    pthread_barrier_t *ready, *go;
    pd_status_t status;
    int32_t tokens[16][N_GEN];
} rank_t;

static void *rank_main(void *arg)
{
    rank_t *r = arg;
    model_t *m = NULL;
    model_ctx_t *ctx = NULL;
    kv_layout_t full, l;
    kv_seq_t seq;
    void *arena = NULL;
    const int n_pages = (160 + N_GEN) / PAGE_TOKENS + 1;

    r->status = backend_cuda_create(r->rank, &r->be);
    pthread_barrier_wait(r->ready); /* main makes the communicators from our streams */
    pthread_barrier_wait(r->go);
    if (r->status != PD_OK || !r->comm)
        return NULL;
    model_load_params_t mp = {r->dir, PD_WFMT_BF16, PD_WFMT_BF16, r->be, false, r->comm};
    if ((r->status = model_load(&mp, &m)) != PD_OK)
        return NULL;
    kv_layout_init(&full, m->cfg.num_hidden_layers, m->cfg.num_key_value_heads, m->cfg.head_dim,
                   PAGE_TOKENS, PD_KV_F32);
    tp_kv_layout(&full, r->size, &l);
    r->be->ops->alloc(r->be, (size_t)n_pages * l.page_bytes, &arena);
    r->be->ops->memset(r->be, arena, 0, (size_t)n_pages * l.page_bytes);
    kv_seq_init(&seq);
    for (int p = 0; p < n_pages; p++)
        kv_seq_push_page(&seq, (kv_page_ref_t){p, 0, 0});
    model_ctx_create(m, &ctx);
    float *lg = malloc((size_t)m->cfg.vocab_size * sizeof *lg);
    for (int c = 0; c < r->refs->n_cases && r->status == PD_OK; c++) {
        int n = r->refs->n_ids[c];
        int32_t q_start[2] = {0, n}, ctx_len[1] = {n}, row = n - 1;
        const kv_seq_t *seqs[1] = {&seq};
        model_batch_t b = {n, r->refs->ids[c], 1, q_start, ctx_len, seqs, 1, &row};
        for (int i = 0; i < N_GEN && r->status == PD_OK; i++) {
            r->status = model_forward(ctx, arena, &l, &b, lg);
            r->tokens[c][i] = sampler_argmax(lg, m->cfg.vocab_size);
            q_start[1] = 1;
            ctx_len[0]++;
            row = 0;
            b.n_tokens = 1;
            b.tokens = &r->tokens[c][i];
        }
    }
    free(lg);
    model_ctx_destroy(ctx);
    r->be->ops->free(r->be, arena);
    kv_seq_deinit(&seq);
    model_destroy(m);
    return NULL;
}

static int run_model(const char *models, const char *name, int size)
{
    char dir[2048], path[4096];
    refs_t refs = {0};
    json_error_t jerr;
    snprintf(dir, sizeof dir, "%s/%s", models, name);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_t *ref = json_load_file(path, 0, &jerr), *cases = json_object_get(ref, "cases"), *c;
    size_t ci;
    json_array_foreach(cases, ci, c)
    {
        json_t *in = json_object_get(c, "input_ids"), *g = json_object_get(c, "greedy_ids");
        refs.n_ids[ci] = (int)json_array_size(in);
        for (int i = 0; i < refs.n_ids[ci]; i++)
            refs.ids[ci][i] = (int32_t)json_integer_value(json_array_get(in, (size_t)i));
        for (int i = 0; i < N_GEN; i++)
            refs.greedy[ci][i] = (int32_t)json_integer_value(json_array_get(g, (size_t)i));
    }
    refs.n_cases = (int)json_array_size(cases);
    json_decref(ref);

    rank_t ranks[8];
    pthread_t th[8];
    pthread_barrier_t ready, go;
    tp_comm_t *comms[8] = {0};
    int devices[8];
    void *streams[8];
    pthread_barrier_init(&ready, NULL, (unsigned)size + 1);
    pthread_barrier_init(&go, NULL, (unsigned)size + 1);
    for (int r = 0; r < size; r++) {
        memset(&ranks[r], 0, sizeof ranks[r]);
        ranks[r] = (rank_t){dir, r, size, &refs, NULL, NULL, &ready, &go, PD_OK, {{0}}};
        pthread_create(&th[r], NULL, rank_main, &ranks[r]);
    }
    pthread_barrier_wait(&ready);
    int ok = 1;
    for (int r = 0; r < size; r++) {
        ok &= ranks[r].status == PD_OK;
        devices[r] = r;
        streams[r] = ranks[r].be ? backend_cuda_stream(ranks[r].be) : NULL;
    }
    pd_status_t st = ok ? tp_comm_nccl_create(size, devices, streams, comms) : PD_ERR_CUDA;
    for (int r = 0; r < size; r++)
        ranks[r].comm = st == PD_OK ? comms[r] : NULL;
    pthread_barrier_wait(&go);
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    int same = 0, agree = 1;
    for (int c = 0; c < refs.n_cases; c++) {
        same += memcmp(ranks[0].tokens[c], refs.greedy[c], sizeof refs.greedy[c]) == 0;
        for (int r = 1; r < size; r++)
            agree &= memcmp(ranks[0].tokens[c], ranks[r].tokens[c], sizeof refs.greedy[c]) == 0;
    }
    printf("%s: TP %d over NCCL (comm %s, ranks %s): %d/%d greedy sequences equal transformers'\n",
           name, size, pd_status_str(st), agree ? "agree" : "DISAGREE", same, refs.n_cases);
    for (int r = 0; r < size; r++) {
        if (ranks[r].status != PD_OK)
            printf("  rank %d: %s\n", r, pd_status_str(ranks[r].status));
        tp_comm_destroy(comms[r]);
        backend_destroy(ranks[r].be);
    }
    fflush(stdout);
    return st == PD_OK && agree && same == refs.n_cases ? 0 : 1;
}

int main(int argc, char **argv)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("fewer than 2 CUDA devices: multi-GPU tests skipped\n");
        return 77;
    }
    const char *models = argc > 1 ? argv[1] : "deploy/models";
    /* BF16 weights against float32 transformers: the CUDA backend's near-f32 GEMM mode */
    setenv("PD_CUDA_BF16_GEMM", "split", 0);
    int size = n >= 2 ? 2 : 1, rc = 0;
    rc |= run_model(models, "tiny-llama", size);
    rc |= run_model(models, "tiny-moe", size);
    return rc;
}
