/* cpu_bench: CPU engine throughput on a model directory (default deploy/models/tiny-llama):
 * prefill tokens/s for a 512-token prompt and decode tokens/s at batch 1 and 8, for each weight /
 * KV format. Prints a table. Usage: cpu_bench [MODEL_DIR] [THREADS] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine.h"
#include "clock.h"
#include "log.h"

static void bench(const char *dir, int threads, pd_wfmt_t w, pd_kvfmt_t kv)
{
    engine_params_t p;
    engine_t *e;
    int32_t prompt[512];
    uint64_t id;
    engine_params_default(&p);
    p.model_dir = dir;
    p.threads = threads;
    p.wfmt = w;
    p.kvfmt = kv;
    if (engine_create(&p, &e) != PD_OK)
        exit(1);
    srand(1);
    for (int i = 0; i < 512; i++)
        prompt[i] = i == 0 ? 0 : 2 + rand() % (engine_model(e)->cfg.vocab_size - 2);
    /* prefill: one 512-token prompt, one new token */
    engine_gen_params_t gp = {.sampling = {0, 0, 1.0f, 0},
                              .max_tokens = 1,
                              .ignore_eos = true,
                              .stop_ids = NULL,
                              .n_stop_ids = 0,
                              .n_generated = 0};
    double t0 = pd_clock_s();
    engine_seq_add(e, prompt, 512, &gp, NULL, NULL, &id);
    engine_run(e);
    double prefill = 512.0 / (pd_clock_s() - t0);
    double dec[2];
    int batches[2] = {1, 8};
    for (int b = 0; b < 2; b++) {
        gp.max_tokens = 129;
        for (int s = 0; s < batches[b]; s++)
            engine_seq_add(e, prompt, 16, &gp, NULL, NULL, &id);
        engine_step(e); /* the prompts and first tokens: not counted */
        t0 = pd_clock_s();
        engine_run(e);
        dec[b] = 128.0 * batches[b] / (pd_clock_s() - t0);
    }
    printf("| %-5s | %-4s | %8.0f | %8.1f | %8.1f |\n", pd_wfmt_name(w), pd_kvfmt_name(kv), prefill,
           dec[0], dec[1]);
    fflush(stdout);
    engine_destroy(e);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "deploy/models/tiny-llama";
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    pd_log_set_level(PD_LOG_WARN);
    printf("CPU engine, %s, %d threads (0 = all cores)\n\n", dir, threads);
    printf("| weights | kv | prefill tok/s (512) | decode tok/s b=1 | decode tok/s b=8 |\n");
    printf("|---|---|---:|---:|---:|\n");
    bench(dir, threads, PD_WFMT_BF16, PD_KV_BF16);
    bench(dir, threads, PD_WFMT_FP8, PD_KV_BF16);
    bench(dir, threads, PD_WFMT_INT4, PD_KV_FP8);
    return 0;
}
