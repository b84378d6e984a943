/* pdctl: the command-line tool of pdserve (local model commands and cluster ops commands). */
#include <stdio.h>
#include <string.h>

#include "pdctl.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} pdctl_cmd_t;

static const pdctl_cmd_t pdctl_cmds[] = {
    {"tokenize", pdctl_tokenize, "tokenize --model DIR [--no-bos] TEXT"},
    {"generate", pdctl_generate,
     "generate --model DIR --prompt TEXT --max-tokens N [--temperature T --top-p P --top-k K "
     "--seed S] [--weights bf16|fp8|int4] [--kv bf16|fp8] [--prefill-weights W --prefill-kv K] "
     "[--presence-penalty F --frequency-penalty F --repetition-penalty F --logit-bias ID=BIAS "
     "--min-tokens N --stop-token-id ID --logprobs N] [--n N] [--json] [--logits-out FILE]"},
    {"ppl", pdctl_ppl,
     "ppl --model DIR --text-file F [--window 512] [--weights bf16|fp8|int4] [--kv bf16|fp8]"},
    {"quantize", pdctl_quantize,
     "quantize --model DIR --format int4|fp8 --out DIR2 [--lm-head bf16|fp8|int4]"},
    {"agree", pdctl_agree,
     "agree --model DIR --reference reference.json [--weights ...] [--kv ...] (teacher-forced "
     "top-1 agreement)"},
    {"synth", pdctl_synth,
     "synth --arch llama-3-8b|llama-3-70b|qwen3-30b-a3b --out DIR [--layers N] [--seed S] "
     "[--hidden H] [--experts E] [--context N] [--shard-mib M] [--config-only] (random-weight "
     "checkpoint of a published shape)"},
    {"kv-plan", pdctl_kv_plan, "kv-plan --model DIR --budget BYTES [--page-tokens N] [--json]"},
    {"up", pdctl_up,
     "up --config FILE [--detach] [--log-dir DIR] [--timeout-s N] [--grace-s N] (start the "
     "nodes of FILE placed on this machine)"},
    {"down", pdctl_down, "down --config FILE [--grace-s N] (stop what pdctl up started)"},
    {"health", pdctl_health,
     "health --config FILE | --addr HOST:PORT ... [--json] [--timeout-ms N] [TLS]"},
    {"generate", pdctl_generate,
     "generate --router HOST:PORT --prompt TEXT --max-tokens N [--temperature T --top-p P "
     "--top-k K --seed S --stop STR ... --ignore-eos] [--json] [--timeout-ms N] [TLS]"},
    {"models", pdctl_models, "models --router HOST:PORT [--timeout-ms N] [TLS]"},
    {"nodes", pdctl_nodes,
     "nodes --router HOST:PORT | --config FILE [--json] [TLS] (the router's nodes and their "
     "state)"},
    {"drain", pdctl_drain,
     "drain NODE --router HOST:PORT | --config FILE [--wait-s N] [--json] [TLS] (no new work to "
     "NODE; "
     "waits until its running requests are done: state drained)"},
    {"undrain", pdctl_undrain, "undrain NODE --router HOST:PORT | --config FILE [--json] [TLS]"},
};

static void pdctl_usage(FILE *f)
{
    fprintf(f, "usage: pdctl COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof pdctl_cmds / sizeof pdctl_cmds[0]; i++)
        fprintf(f, "  pdctl %s\n", pdctl_cmds[i].help);
    fprintf(f, "\nmodel options: --backend cpu|cuda --threads N --lm-head bf16|fp8|int4 "
               "--kv-budget BYTES --page-tokens N --tracker tagged|noop\n");
    fprintf(f, "TLS (to a router with router.tls_cert): --tls-ca FILE (PEM CAs; $PDSERVE_TLS_CA) "
               "--tls-server-name NAME ($PDSERVE_TLS_SERVER_NAME; default: the router's host); "
               "with --config, on when the file gives the router a certificate\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        pdctl_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof pdctl_cmds / sizeof pdctl_cmds[0]; i++)
        if (strcmp(argv[1], pdctl_cmds[i].name) == 0)
            return pdctl_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "pdctl: unknown command '%s'\n", argv[1]);
    pdctl_usage(stderr);
    return 2;
}
