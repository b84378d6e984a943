/* Tests common/hf_config.c: both fixture configs, rope and token variants, quantization_config,
 * and one config per validation rule, each checking its specific status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "hf_config.h"

static const char *base_llama =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 256,"
    " \"intermediate_size\": 512, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
    " \"vocab_size\": 1000, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6}";

static const char *base_moe =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 256, \"head_dim\": 64,"
    " \"intermediate_size\": 512, \"num_hidden_layers\": 6, \"num_attention_heads\": 8,"
    " \"num_key_value_heads\": 4, \"vocab_size\": 1000, \"max_position_embeddings\": 4096,"
    " \"rms_norm_eps\": 1e-6, \"num_experts\": 16, \"num_experts_per_tok\": 4,"
    " \"moe_intermediate_size\": 64}";

/* Parses base with the keys of patch (JSON object text) set over it. */
static pd_status_t parse_patched(const char *base, const char *patch, hf_config_t *cfg)
{
    json_t *b = json_loads(base, 0, NULL), *p = json_loads(patch, 0, NULL);
    char *text;
    pd_status_t rc;

    assert_non_null(b);
    assert_non_null(p);
    assert_int_equal(json_object_update(b, p), 0);
    text = json_dumps(b, 0);
    assert_non_null(text);
    rc = hf_config_parse(text, strlen(text), "test.json", cfg);
    free(text);
    json_decref(b);
    json_decref(p);
    return rc;
}

/* As parse_patched with key removed from base. */
static pd_status_t parse_without(const char *base, const char *key, hf_config_t *cfg)
{
    json_t *b = json_loads(base, 0, NULL);
    char *text;
    pd_status_t rc;

    assert_non_null(b);
    assert_int_equal(json_object_del(b, key), 0);
    text = json_dumps(b, 0);
    rc = hf_config_parse(text, strlen(text), "test.json", cfg);
    free(text);
    json_decref(b);
    return rc;
}

static void load_fixture(const char *model, hf_config_t *cfg)
{
    const char *dir = getenv("PD_MODELS_DIR");
    char path[4096];
    assert_non_null(dir);
    snprintf(path, sizeof path, "%s/%s/config.json", dir, model);
    assert_int_equal(hf_config_load(path, cfg), PD_OK);
}

static void test_fixture_llama(void **state)
{
    hf_config_t c;
    (void)state;
    load_fixture("tiny-llama", &c);
    assert_int_equal(c.arch, HF_ARCH_LLAMA);
    assert_string_equal(c.architecture, "LlamaForCausalLM");
    assert_string_equal(c.model_type, "llama");
    assert_int_equal(c.hidden_size, 512);
    assert_int_equal(c.intermediate_size, 1024);
    assert_int_equal(c.num_hidden_layers, 4);
    assert_int_equal(c.num_attention_heads, 4);
    assert_int_equal(c.num_key_value_heads, 2);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.vocab_size, 2048);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.rope_type, 0);
    assert_int_equal(c.bos_token_id, 0);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 1);
    assert_false(c.tie_word_embeddings);
    assert_false(c.attention_bias);
    assert_false(c.mlp_bias);
    assert_int_equal(c.num_experts, 0);
    assert_string_equal(c.quant_format, "");
    assert_string_equal(c.quant_lm_head, "");
    for (int l = 0; l < 4; l++)
        assert_false(hf_config_layer_is_moe(&c, l));
}

static void test_fixture_moe(void **state)
{
    hf_config_t c;
    (void)state;
    load_fixture("tiny-moe", &c);
    assert_int_equal(c.arch, HF_ARCH_QWEN3_MOE);
    assert_string_equal(c.architecture, "Qwen3MoeForCausalLM");
    assert_string_equal(c.model_type, "qwen3_moe");
    assert_int_equal(c.hidden_size, 512);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.num_key_value_heads, 2);
    assert_int_equal(c.num_experts, 8); /* written as num_local_experts */
    assert_int_equal(c.num_experts_per_tok, 2);
    assert_int_equal(c.moe_intermediate_size, 128);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_true(c.norm_topk_prob);
    assert_true(c.rope_theta == 10000.0);
    for (int l = 0; l < 4; l++)
        assert_true(hf_config_layer_is_moe(&c, l));
    assert_false(hf_config_layer_is_moe(&c, 4));
    assert_false(hf_config_layer_is_moe(&c, -1));
}

static void test_defaults_and_variants(void **state)
{
    hf_config_t c;
    (void)state;
    assert_int_equal(parse_patched(base_llama, "{}", &c), PD_OK);
    assert_int_equal(c.head_dim, 32); /* 256 / 8 */
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos, 0);
    assert_true(c.rope_theta == 10000.0);

    assert_int_equal(parse_patched(base_llama,
                                   "{\"bos_token_id\": null, \"eos_token_id\": [3, 4, 5],"
                                   " \"rope_theta\": 500000, \"tie_word_embeddings\": true}",
                                   &c),
                     PD_OK);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_token_ids[2], 5);
    assert_true(c.rope_theta == 500000.0);
    assert_true(c.tie_word_embeddings);

    /* llama3 rope, transformers 4 spelling */
    assert_int_equal(parse_patched(base_llama,
                                   "{\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\":"
                                   " \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
                                   " \"high_freq_factor\": 4.0,"
                                   " \"original_max_position_embeddings\": 8192}}",
                                   &c),
                     PD_OK);
    assert_int_equal(c.rope_type, 1);
    assert_true(c.rope_factor == 8.0);
    assert_true(c.rope_low_freq_factor == 1.0);
    assert_true(c.rope_high_freq_factor == 4.0);
    assert_int_equal(c.rope_original_max_position, 8192);

    /* transformers 5 spelling, no top-level rope_theta */
    assert_int_equal(parse_patched(base_llama,
                                   "{\"rope_parameters\": {\"rope_type\": \"llama3\","
                                   " \"rope_theta\": 500000.0, \"factor\": 32, \"low_freq_factor\":"
                                   " 1, \"high_freq_factor\": 4,"
                                   " \"original_max_position_embeddings\": 8192}}",
                                   &c),
                     PD_OK);
    assert_int_equal(c.rope_type, 1);
    assert_true(c.rope_theta == 500000.0);
    assert_true(c.rope_factor == 32.0);

    /* quantized checkpoint */
    assert_int_equal(parse_patched(base_llama,
                                   "{\"quantization_config\": {\"quant_method\": \"pdserve\","
                                   " \"format\": \"int4\", \"group_size\": 128}}",
                                   &c),
                     PD_OK);
    assert_string_equal(c.quant_format, "int4");
    assert_int_equal(c.quant_group_size, 128);
    assert_string_equal(c.quant_lm_head, "bf16");
    assert_int_equal(parse_patched(base_llama,
                                   "{\"quantization_config\": {\"quant_method\": \"pdserve\","
                                   " \"format\": \"fp8\", \"lm_head\": \"fp8\"}}",
                                   &c),
                     PD_OK);
    assert_string_equal(c.quant_format, "fp8");
    assert_string_equal(c.quant_lm_head, "fp8");
}

static void test_moe_layers(void **state)
{
    hf_config_t c;
    (void)state;
    assert_int_equal(parse_patched(base_moe,
                                   "{\"decoder_sparse_step\": 2, \"mlp_only_layers\": [3],"
                                   " \"num_experts\": 16}",
                                   &c),
                     PD_OK);
    assert_int_equal(c.num_experts, 16);
    assert_false(c.norm_topk_prob);
    assert_true(c.mlp_only[3]);
    assert_false(hf_config_layer_is_moe(&c, 0));
    assert_true(hf_config_layer_is_moe(&c, 1));
    assert_false(hf_config_layer_is_moe(&c, 2));
    assert_false(hf_config_layer_is_moe(&c, 3)); /* mlp_only */
    assert_true(hf_config_layer_is_moe(&c, 5));
    assert_false(hf_config_layer_is_moe(&c, 7));
}

static void test_errors(void **state)
{
    hf_config_t c, before;
    (void)state;
    memset(&c, 0x5a, sizeof c);
    before = c;

    /* invalid json, wrong top level, duplicate keys */
    assert_int_equal(hf_config_parse("{\"a\": ", 6, "bad.json", &c), PD_ERR_FORMAT);
    assert_int_equal(hf_config_parse("[]", 2, NULL, &c), PD_ERR_FORMAT);
    assert_int_equal(
        hf_config_parse("{\"a\": 1, \"a\": 2}", strlen("{\"a\": 1, \"a\": 2}"), NULL, &c),
        PD_ERR_FORMAT);
    assert_int_equal(hf_config_parse("", 0, NULL, &c), PD_ERR_FORMAT);
    assert_memory_equal(&c, &before, sizeof c); /* untouched on failure */

    /* architecture */
    assert_int_equal(parse_without(base_llama, "architectures", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"architectures\": []}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"architectures\": \"LlamaForCausalLM\"}", &c),
                     PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"architectures\": [\"GPT2LMHeadModel\"]}", &c),
                     PD_ERR_UNSUPPORTED);

    /* missing required, wrong type, non-positive */
    assert_int_equal(parse_without(base_llama, "hidden_size", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_without(base_llama, "rms_norm_eps", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"hidden_size\": \"256\"}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"hidden_size\": 256.0}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"hidden_size\": 0}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"vocab_size\": -5}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"num_hidden_layers\": 9999999999}", &c),
                     PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"rms_norm_eps\": 0}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"rope_theta\": -1}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"tie_word_embeddings\": 1}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"model_type\": 3}", &c), PD_ERR_FORMAT);

    /* shape consistency */
    assert_int_equal(parse_patched(base_llama, "{\"num_key_value_heads\": 3}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"num_attention_heads\": 7}", &c),
                     PD_ERR_FORMAT); /* 256 % 7, no head_dim */
    assert_int_equal(parse_patched(base_llama, "{\"num_hidden_layers\": 257}", &c),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(parse_patched(base_llama, "{\"num_hidden_layers\": 256}", &c), PD_OK);

    /* tokens */
    assert_int_equal(parse_patched(base_llama, "{\"bos_token_id\": 1000}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"eos_token_id\": [1, \"2\"]}", &c),
                     PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", &c),
                     PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"eos_token_id\": \"</s>\"}", &c), PD_ERR_FORMAT);

    /* rope */
    assert_int_equal(parse_patched(base_llama, "{\"rope_scaling\": {\"rope_type\": \"yarn\"}}", &c),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(parse_patched(base_llama,
                                   "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8}}",
                                   &c),
                     PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama, "{\"rope_parameters\": 5}", &c), PD_ERR_FORMAT);

    /* moe */
    assert_int_equal(parse_without(base_moe, "num_experts", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_without(base_moe, "moe_intermediate_size", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_moe, "{\"num_experts_per_tok\": 17}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_moe, "{\"decoder_sparse_step\": 0}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_moe, "{\"mlp_only_layers\": [6]}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_moe, "{\"mlp_only_layers\": 1}", &c), PD_ERR_FORMAT);

    /* quantization */
    assert_int_equal(
        parse_patched(base_llama, "{\"quantization_config\": {\"quant_method\": \"gptq\"}}", &c),
        PD_ERR_UNSUPPORTED);
    assert_int_equal(parse_patched(base_llama,
                                   "{\"quantization_config\": {\"quant_method\": \"pdserve\","
                                   " \"format\": \"int4\"}}",
                                   &c),
                     PD_ERR_FORMAT);
    assert_int_equal(parse_patched(base_llama,
                                   "{\"quantization_config\": {\"quant_method\": \"pdserve\","
                                   " \"format\": \"int3\", \"group_size\": 64}}",
                                   &c),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(parse_patched(base_llama,
                                   "{\"quantization_config\": {\"quant_method\": \"pdserve\","
                                   " \"format\": \"this-is-way-too-long-for-the-field\"}}",
                                   &c),
                     PD_ERR_FORMAT);

    /* file errors */
    assert_int_equal(hf_config_load("/nonexistent/config.json", &c), PD_ERR_IO);
}

/* ==== GLM-4.5 and DeepSeek-V3 / Kimi K2: the published config.json files (values as shipped,
 * auto_map and other ignored keys left out) ==== */

static const char *cfg_deepseek_v3 =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"attention_bias\": false,"
    " \"bos_token_id\": 0, \"eos_token_id\": 1, \"ep_size\": 1, \"first_k_dense_replace\": 3,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 7168, \"intermediate_size\": 18432,"
    " \"kv_lora_rank\": 512, \"max_position_embeddings\": 163840, \"model_type\": \"deepseek_v3\","
    " \"moe_intermediate_size\": 2048, \"moe_layer_freq\": 1, \"n_group\": 8,"
    " \"n_routed_experts\": 256, \"n_shared_experts\": 1, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 61,"
    " \"num_key_value_heads\": 128, \"num_nextn_predict_layers\": 1, \"pretraining_tp\": 1,"
    " \"q_lora_rank\": 1536, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,"
    " \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\","
    " \"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}, \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0,"
    " \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
    " \"rope_theta\": 10000, \"routed_scaling_factor\": 2.5, \"scoring_func\": \"sigmoid\","
    " \"seq_aux\": true, \"tie_word_embeddings\": false, \"topk_group\": 4,"
    " \"topk_method\": \"noaux_tc\", \"torch_dtype\": \"bfloat16\", \"use_cache\": true,"
    " \"v_head_dim\": 128, \"vocab_size\": 129280}";

static const char *cfg_kimi_k2 =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"attention_bias\": false,"
    " \"bos_token_id\": 163584, \"eos_token_id\": 163585, \"first_k_dense_replace\": 1,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 7168, \"intermediate_size\": 18432,"
    " \"kv_lora_rank\": 512, \"max_position_embeddings\": 131072, \"model_type\": \"kimi_k2\","
    " \"moe_intermediate_size\": 2048, \"moe_layer_freq\": 1, \"n_group\": 1,"
    " \"n_routed_experts\": 384, \"n_shared_experts\": 1, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 64, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 61,"
    " \"num_key_value_heads\": 64, \"num_nextn_predict_layers\": 0, \"pretraining_tp\": 1,"
    " \"q_lora_rank\": 1536, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,"
    " \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\","
    " \"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}, \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0, \"factor\": 32.0,"
    " \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096,"
    " \"type\": \"yarn\"}, \"rope_theta\": 50000.0, \"routed_scaling_factor\": 2.827,"
    " \"scoring_func\": \"sigmoid\", \"seq_aux\": true, \"tie_word_embeddings\": false,"
    " \"topk_group\": 1, \"topk_method\": \"noaux_tc\", \"torch_dtype\": \"bfloat16\","
    " \"use_cache\": true, \"v_head_dim\": 128, \"vocab_size\": 163840}";

static const char *cfg_glm45 =
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"attention_bias\": true,"
    " \"attention_dropout\": 0.0, \"pad_token_id\": 151329, \"eos_token_id\": [151329, 151336,"
    " 151338], \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 5120,"
    " \"partial_rotary_factor\": 0.5, \"initializer_range\": 0.02, \"intermediate_size\": 12288,"
    " \"max_position_embeddings\": 131072, \"model_type\": \"glm4_moe\","
    " \"moe_intermediate_size\": 1536, \"norm_topk_prob\": true, \"num_attention_heads\": 96,"
    " \"n_group\": 1, \"topk_group\": 1, \"n_routed_experts\": 160, \"n_shared_experts\": 1,"
    " \"routed_scaling_factor\": 2.5, \"num_experts_per_tok\": 8, \"first_k_dense_replace\": 3,"
    " \"num_hidden_layers\": 92, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": null, \"rope_theta\": 1000000, \"num_nextn_predict_layers\": 1,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"use_cache\": true,"
    " \"use_qk_norm\": true, \"vocab_size\": 151552}";

static void test_published_deepseek_v3(void **state)
{
    hf_config_t c;
    int heads, dim, sides;
    (void)state;
    assert_int_equal(hf_config_parse(cfg_deepseek_v3, strlen(cfg_deepseek_v3), NULL, &c), PD_OK);
    assert_int_equal(c.arch, HF_ARCH_DEEPSEEK_V3);
    assert_true(hf_config_is_mla(&c));
    assert_int_equal(c.q_lora_rank, 1536);
    assert_int_equal(c.kv_lora_rank, 512);
    assert_int_equal(c.qk_nope_head_dim, 128);
    assert_int_equal(c.qk_rope_head_dim, 64);
    assert_int_equal(c.v_head_dim, 128);
    assert_int_equal(c.rotary_dim, 64);
    assert_false(c.rope_interleave); /* transformers 4 configs leave it out (the model default) */
    assert_int_equal(c.rope_type, HF_ROPE_YARN);
    assert_true(c.rope_factor == 40.0);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.rope_original_max_position, 4096);
    assert_true(c.rope_beta_fast == 32.0 && c.rope_beta_slow == 1.0);
    assert_true(c.rope_mscale == 1.0 && c.rope_mscale_all_dim == 1.0);
    assert_int_equal(c.num_experts, 256);
    assert_int_equal(c.num_experts_per_tok, 8);
    assert_int_equal(c.n_group, 8);
    assert_int_equal(c.topk_group, 4);
    assert_int_equal(c.n_shared_experts, 1);
    assert_true(c.routed_scaling_factor == 2.5);
    assert_true(c.norm_topk_prob && c.moe_sigmoid);
    assert_int_equal(c.first_k_dense_replace, 3);
    assert_false(hf_config_layer_is_moe(&c, 2));
    assert_true(hf_config_layer_is_moe(&c, 3));
    assert_true(hf_config_layer_is_moe(&c, 60));
    assert_string_equal(c.quant_format, "fp8_block");
    assert_int_equal(c.quant_block_n, 128);
    assert_int_equal(c.quant_block_k, 128);
    /* MLA: one latent head of 512 + 64 values per token and layer */
    hf_config_kv_shape(&c, &heads, &dim, &sides);
    assert_int_equal(heads, 1);
    assert_int_equal(dim, 576);
    assert_int_equal(sides, 1);
}

static void test_published_kimi_k2(void **state)
{
    hf_config_t c;
    (void)state;
    /* beta_fast == beta_slow (1.0, 1.0) is what Kimi K2 ships */
    assert_int_equal(hf_config_parse(cfg_kimi_k2, strlen(cfg_kimi_k2), NULL, &c), PD_OK);
    assert_int_equal(c.arch, HF_ARCH_DEEPSEEK_V3);
    assert_string_equal(c.model_type, "kimi_k2");
    assert_int_equal(c.num_attention_heads, 64);
    assert_int_equal(c.num_experts, 384);
    assert_int_equal(c.n_group, 1);
    assert_int_equal(c.topk_group, 1);
    assert_true(c.routed_scaling_factor == 2.827);
    assert_true(c.rope_theta == 50000.0);
    assert_true(c.rope_factor == 32.0);
    assert_true(c.rope_beta_fast == 1.0 && c.rope_beta_slow == 1.0);
    assert_int_equal(c.first_k_dense_replace, 1);
    assert_false(hf_config_layer_is_moe(&c, 0));
    assert_true(hf_config_layer_is_moe(&c, 1));
    assert_int_equal(c.bos_token_id, 163584);
}

static void test_published_glm45(void **state)
{
    hf_config_t c;
    int heads, dim, sides;
    (void)state;
    assert_int_equal(hf_config_parse(cfg_glm45, strlen(cfg_glm45), NULL, &c), PD_OK);
    assert_int_equal(c.arch, HF_ARCH_GLM4_MOE);
    assert_false(hf_config_is_mla(&c));
    assert_true(c.attention_bias);
    assert_true(c.use_qk_norm);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.rotary_dim, 64); /* partial_rotary_factor 0.5 at the top level */
    assert_int_equal(c.rope_type, HF_ROPE_DEFAULT);
    assert_true(c.rope_theta == 1000000.0);
    assert_int_equal(c.num_experts, 160);
    assert_int_equal(c.moe_intermediate_size, 1536);
    assert_int_equal(c.first_k_dense_replace, 3);
    assert_int_equal(c.n_eos, 3);
    assert_true(c.routed_scaling_factor == 2.5);
    assert_true(c.moe_sigmoid);
    assert_string_equal(c.quant_format, "");
    hf_config_kv_shape(&c, &heads, &dim, &sides);
    assert_int_equal(heads, 8);
    assert_int_equal(dim, 128);
    assert_int_equal(sides, 2);
    /* GLM-4.5-Air's differences */
    assert_int_equal(parse_patched(cfg_glm45,
                                   "{\"hidden_size\": 4096, \"num_hidden_layers\": 46,"
                                   " \"n_routed_experts\": 128, \"moe_intermediate_size\": 1408,"
                                   " \"intermediate_size\": 10944, \"first_k_dense_replace\": 1,"
                                   " \"use_qk_norm\": false}",
                                   &c),
                     PD_OK);
    assert_false(c.use_qk_norm);
    assert_int_equal(c.num_experts, 128);
    assert_true(hf_config_layer_is_moe(&c, 1));
}

/* The fixtures, as transformers 5 writes them (rope_parameters with partial_rotary_factor,
 * rope_interleave, yarn with rope_type and type) */
static void test_fixture_families(void **state)
{
    hf_config_t c;
    (void)state;
    load_fixture("tiny-glm", &c);
    assert_int_equal(c.arch, HF_ARCH_GLM4_MOE);
    assert_int_equal(c.rotary_dim, 64);
    assert_int_equal(c.num_experts, 8);
    assert_int_equal(c.n_shared_experts, 1);
    assert_false(hf_config_layer_is_moe(&c, 0));
    assert_true(hf_config_layer_is_moe(&c, 1));
    load_fixture("tiny-dsv3", &c);
    assert_int_equal(c.arch, HF_ARCH_DEEPSEEK_V3);
    assert_true(c.rope_interleave);
    assert_int_equal(c.rope_type, HF_ROPE_YARN);
    assert_true(c.rope_factor == 4.0);
    assert_int_equal(c.rope_original_max_position, 512);
    assert_int_equal(c.rotary_dim, 32);
    assert_int_equal(c.q_lora_rank, 192);
    assert_int_equal(c.kv_lora_rank, 128);
    assert_int_equal(c.n_group, 2);
    assert_int_equal(c.topk_group, 1);
    assert_string_equal(c.quant_format, "");
}

static void test_family_errors(void **state)
{
    hf_config_t c;
    (void)state;
    /* DeepSeek-V2's softmax / greedy routing is another model */
    assert_int_equal(parse_patched(cfg_deepseek_v3, "{\"scoring_func\": \"softmax\"}", &c),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(parse_patched(cfg_deepseek_v3, "{\"topk_method\": \"greedy\"}", &c),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(parse_patched(cfg_deepseek_v3, "{\"topk_group\": 9}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(cfg_deepseek_v3, "{\"n_group\": 7}", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(cfg_deepseek_v3, "{\"moe_layer_freq\": 2}", &c),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(parse_patched(cfg_deepseek_v3, "{\"qk_rope_head_dim\": 63}", &c),
                     PD_ERR_FORMAT);
    assert_int_equal(parse_without(cfg_deepseek_v3, "kv_lora_rank", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_without(cfg_glm45, "n_routed_experts", &c), PD_ERR_FORMAT);
    assert_int_equal(parse_patched(cfg_deepseek_v3,
                                   "{\"quantization_config\": {\"quant_method\": \"fp8\","
                                   " \"fmt\": \"e5m2\", \"weight_block_size\": [128, 128]}}",
                                   &c),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(parse_patched(cfg_deepseek_v3,
                                   "{\"quantization_config\": {\"quant_method\": \"fp8\","
                                   " \"weight_block_size\": [128]}}",
                                   &c),
                     PD_ERR_FORMAT);
    assert_int_equal(parse_patched(cfg_glm45, "{\"partial_rotary_factor\": 1.5}", &c),
                     PD_ERR_FORMAT);
    /* yarn stays DeepSeek-V3's: a Llama with it is refused, not run with the wrong frequencies */
    assert_int_equal(
        parse_patched(base_llama, "{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}}", &c),
        PD_ERR_UNSUPPORTED);
    /* factor absent: max_position_embeddings / original_max_position_embeddings */
    assert_int_equal(parse_patched(cfg_deepseek_v3,
                                   "{\"rope_scaling\": {\"type\": \"yarn\","
                                   " \"original_max_position_embeddings\": 4096}}",
                                   &c),
                     PD_OK);
    assert_true(c.rope_factor == 40.0);
    assert_true(c.rope_mscale == 0 && c.rope_mscale_all_dim == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_llama),
        cmocka_unit_test(test_fixture_moe),
        cmocka_unit_test(test_defaults_and_variants),
        cmocka_unit_test(test_moe_layers),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_published_deepseek_v3),
        cmocka_unit_test(test_published_kimi_k2),
        cmocka_unit_test(test_published_glm45),
        cmocka_unit_test(test_fixture_families),
        cmocka_unit_test(test_family_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
