/* Fuzz target: hf_config_parse on arbitrary bytes. Anything it accepts must satisfy the invariants
 * the model code relies on. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_verdict.h"
#include "hf_config.h"

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);         \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hf_config_t c;
    int n_moe = 0;

    if (hf_config_parse((const char *)data, size, "fuzz", &c) != PD_OK) {
        fuzz_verdict = "reject";
        return 0;
    }
    fuzz_verdict = "accept";
    FUZZ_CHECK(c.arch == HF_ARCH_LLAMA || c.arch == HF_ARCH_QWEN3_MOE ||
               c.arch == HF_ARCH_GLM4_MOE || c.arch == HF_ARCH_DEEPSEEK_V3);
    FUZZ_CHECK(memchr(c.architecture, 0, sizeof c.architecture));
    FUZZ_CHECK(memchr(c.model_type, 0, sizeof c.model_type));
    FUZZ_CHECK(memchr(c.quant_format, 0, sizeof c.quant_format));
    FUZZ_CHECK(memchr(c.quant_lm_head, 0, sizeof c.quant_lm_head));
    FUZZ_CHECK(c.hidden_size > 0 && c.intermediate_size > 0 && c.vocab_size > 0);
    FUZZ_CHECK(c.num_hidden_layers > 0 && c.num_hidden_layers <= HF_MAX_LAYERS);
    FUZZ_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0);
    FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0);
    FUZZ_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0);
    FUZZ_CHECK(c.rms_norm_eps > 0 && c.rope_theta > 0);
    FUZZ_CHECK(c.rope_type == HF_ROPE_DEFAULT || c.rope_type == HF_ROPE_LLAMA3 ||
               (c.rope_type == HF_ROPE_YARN && c.arch == HF_ARCH_DEEPSEEK_V3 && c.rope_factor > 0 &&
                c.rope_original_max_position > 0));
    FUZZ_CHECK(c.rotary_dim >= 2 && c.rotary_dim % 2 == 0);
    FUZZ_CHECK(c.bos_token_id >= -1 && c.bos_token_id < c.vocab_size);
    FUZZ_CHECK(c.n_eos >= 0 && c.n_eos <= HF_MAX_EOS);
    for (int i = 0; i < c.n_eos; i++)
        FUZZ_CHECK(c.eos_token_ids[i] >= 0 && c.eos_token_ids[i] < c.vocab_size);
    for (int l = -1; l <= c.num_hidden_layers; l++)
        n_moe += hf_config_layer_is_moe(&c, l);
    if (c.arch == HF_ARCH_LLAMA)
        FUZZ_CHECK(n_moe == 0 && c.num_experts == 0);
    if (c.arch == HF_ARCH_GLM4_MOE || c.arch == HF_ARCH_DEEPSEEK_V3)
        FUZZ_CHECK(c.n_group >= 1 && c.num_experts % c.n_group == 0 && c.topk_group <= c.n_group &&
                   c.routed_scaling_factor > 0 &&
                   c.num_experts_per_tok <= c.topk_group * (c.num_experts / c.n_group));
    if (c.arch == HF_ARCH_DEEPSEEK_V3)
        FUZZ_CHECK(c.kv_lora_rank > 0 && c.qk_rope_head_dim % 2 == 0 &&
                   c.rotary_dim == c.qk_rope_head_dim && c.v_head_dim > 0);
    if (c.arch != HF_ARCH_LLAMA)
        FUZZ_CHECK(c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_experts &&
                   c.decoder_sparse_step >= 1 && c.moe_intermediate_size > 0);
    return 0;
}
