/* config.json parsing (published wrapper and text-only export), self-consistency checks and the
 * production-shape check, with the field named in every error. */
#include <stdio.h>
#include <unistd.h>
#include "t_check.h"
#include "model/config.h"

/* The production text_config (docs/model.md §1.3), with a hole where a test splices extra keys. */
#define PROD_FIELDS                                                                                \
    "\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 2048, \"num_hidden_layers\": 40, "     \
    "\"vocab_size\": 248320, \"num_attention_heads\": 16, \"num_key_value_heads\": 2, "            \
    "\"head_dim\": 256, \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 32, "            \
    "\"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128, "                               \
    "\"linear_conv_kernel_dim\": 4, \"num_experts\": 256, \"num_experts_per_tok\": 8, "            \
    "\"moe_intermediate_size\": 512, \"shared_expert_intermediate_size\": 512, "                   \
    "\"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 262144, \"eos_token_id\": 248044, "     \
    "\"full_attention_interval\": 4, \"mtp_num_hidden_layers\": 1"

#define PROD_ROPE                                                                                  \
    "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, "                 \
    "\"partial_rotary_factor\": 0.25, \"mrope_section\": [11, 11, 10], \"mrope_interleaved\": "    \
    "true}"

static int parse(tl_config *c, const char *json, char *err, size_t n) {
    err[0] = 0;
    return tl_config_parse(c, json, "config.json", err, n);
}

static void test_published_wrapper(void) {
    const char *j = "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], "
                    "\"model_type\": \"qwen3_5_moe\", \"tie_word_embeddings\": false, "
                    "\"text_config\": {" PROD_FIELDS ", " PROD_ROPE "}, "
                    "\"vision_config\": {\"depth\": 27}}";
    tl_config c;
    char err[256];
    CHECK_EQ_INT(parse(&c, j, err, sizeof err), 0);
    CHECK_EQ_INT(c.n_embd, 2048);
    CHECK_EQ_INT(c.n_layer, 40);
    CHECK_EQ_INT(c.n_rot, 64);
    CHECK_CLOSE(c.rope_theta, 1e7, 0, 1e-6);
    CHECK_EQ_INT(c.mtp_n_layer, 1);
    CHECK_EQ_INT(c.n_eos, 1);
    CHECK_EQ_INT(c.eos_ids[0], 248044);
    CHECK_EQ_INT(c.tie_embeddings, 0);
    CHECK_EQ_INT(c.quant_bits, 0);
    for (int i = 0; i < 40; i++)
        CHECK_EQ_INT(c.layer_kind[i], (i + 1) % 4 == 0 ? TL_LAYER_ATTN : TL_LAYER_GDN);
    CHECK_EQ_INT(tl_config_check(&c, err, sizeof err), 0);
    CHECK_EQ_INT(tl_config_check_production(&c, err, sizeof err), 0);
}

static void test_text_only_legacy_rope(void) {
    /* flat text export; rope keys at the top level instead of rope_parameters; explicit
     * layer_types with another pattern; eos as a list */
    const char *j =
        "{\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 64, "
        "\"num_hidden_layers\": 3, \"vocab_size\": 50, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"head_dim\": 16, \"linear_num_key_heads\": 2, "
        "\"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, "
        "\"linear_value_head_dim\": 8, \"linear_conv_kernel_dim\": 4, "
        "\"num_experts\": 4, \"num_experts_per_tok\": 2, "
        "\"moe_intermediate_size\": 16, \"shared_expert_intermediate_size\": 16, "
        "\"rope_theta\": 1000000.0, \"partial_rotary_factor\": 0.5, "
        "\"eos_token_id\": [5, 6, 5], \"tie_word_embeddings\": true, "
        "\"layer_types\": [\"full_attention\", \"linear_attention\", \"full_attention\"]}";
    tl_config c;
    char err[256];
    CHECK_EQ_INT(parse(&c, j, err, sizeof err), 0);
    CHECK_EQ_INT(c.n_rot, 8);
    CHECK_CLOSE(c.rope_theta, 1e6, 0, 1e-6);
    CHECK_CLOSE(c.rms_eps, 1e-6, 0, 1e-6); /* HF default when absent */
    CHECK_EQ_INT(c.n_eos, 2);
    CHECK_EQ_INT(c.eos_ids[1], 6);
    CHECK_EQ_INT(c.tie_embeddings, 1);
    CHECK_EQ_INT(c.layer_kind[0], TL_LAYER_ATTN);
    CHECK_EQ_INT(c.layer_kind[1], TL_LAYER_GDN);
    CHECK_EQ_INT(c.layer_kind[2], TL_LAYER_ATTN);
    CHECK_EQ_INT(tl_config_check(&c, err, sizeof err), 0);
    CHECK(tl_config_check_production(&c, err, sizeof err) < 0);
    CHECK(strstr(err, "config.json has hidden_size=64, this engine is built for 2048") != NULL);
}

/* One broken config: expects failure and the substrings. */
static void bad(const char *json, const char *s1, const char *s2) {
    tl_config c;
    char err[512];
    int st = parse(&c, json, err, sizeof err);
    CHECK(st < 0);
    if ((s1 && !strstr(err, s1)) || (s2 && !strstr(err, s2)))
        fprintf(stderr, "message '%s' lacks '%s' / '%s'\n", err, s1, s2 ? s2 : "");
    CHECK(!s1 || strstr(err, s1));
    CHECK(!s2 || strstr(err, s2));
}

static void test_errors(void) {
    bad("{\"text_config\": {", "config.json", "bad JSON");
    bad("[]", "config.json", "object");
    bad("{\"text_config\": 3}", "config.json: text_config", "object");
    bad("{\"text_config\": {\"hidden_size\": 64}}", "config.json: text_config.num_hidden_layers",
        "missing");
    /* non-positive and wrong-typed values name the field */
    bad("{\"text_config\": {\"hidden_size\": 64, \"num_hidden_layers\": -4}}",
        "config.json: text_config.num_hidden_layers", "positive integer");
    bad("{\"text_config\": {\"hidden_size\": \"64\"}}", "config.json: text_config.hidden_size",
        "positive integer");
    bad("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 8, "
        "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8, "
        "\"linear_num_key_heads\": 1, \"linear_num_value_heads\": 1, \"linear_key_head_dim\": 8, "
        "\"linear_value_head_dim\": 8, \"linear_conv_kernel_dim\": 4, \"num_experts\": 0}",
        "config.json: num_experts", "positive integer");
    bad("{\"text_config\": {" PROD_FIELDS "}}", "text_config.rope_parameters.rope_theta",
        "missing");
    bad("{\"text_config\": {" PROD_FIELDS ", \"rope_parameters\": {\"rope_theta\": -1}}}",
        "text_config.rope_parameters.rope_theta", "positive number");
    bad("{\"text_config\": {" PROD_FIELDS ", " PROD_ROPE
        ", \"layer_types\": [\"full_attention\"]}}",
        "text_config.layer_types", "40");
    bad("{\"text_config\": {" PROD_FIELDS ", " PROD_ROPE ", \"eos_token_id\": \"x\"}}", "duplicate",
        NULL);
    bad("{\"text_config\": {\"model_type\": \"llama\"}}", "model_type \"llama\"", NULL);
    bad("{\"quantization\": {\"bits\": 3, \"group_size\": 64}, \"text_config\": {" PROD_FIELDS
        ", " PROD_ROPE "}}",
        "quantization.bits", NULL);
}

static void test_quantization(void) {
    const char *j =
        "{\"quantization\": {\"group_size\": 64, \"bits\": 4, \"mode\": \"affine\", "
        "\"language_model.model.layers.0.mlp.gate\": {\"group_size\": 64, \"bits\": 8}}, "
        "\"text_config\": {" PROD_FIELDS ", " PROD_ROPE "}}";
    tl_config c;
    char err[256];
    CHECK_EQ_INT(parse(&c, j, err, sizeof err), 0);
    CHECK_EQ_INT(c.quant_bits, 4);
    CHECK_EQ_INT(c.quant_group, 64);
}

static void test_check(void) {
    const char *j = "{\"text_config\": {" PROD_FIELDS ", " PROD_ROPE "}}";
    tl_config c, b;
    char err[256];
    CHECK_EQ_INT(parse(&c, j, err, sizeof err), 0);
    b = c;
    b.n_head_kv = 3;
    CHECK(tl_config_check(&b, err, sizeof err) < 0);
    CHECK(strstr(err, "num_attention_heads=16 is not a multiple of num_key_value_heads=3") != NULL);
    b = c;
    b.gdn_n_k_head = 5;
    CHECK(tl_config_check(&b, err, sizeof err) < 0);
    CHECK(strstr(err, "linear_num_value_heads") != NULL);
    b = c;
    b.n_rot = 7;
    CHECK(tl_config_check(&b, err, sizeof err) < 0);
    CHECK(strstr(err, "rotary") != NULL);
    b = c;
    b.n_rot = 512;
    CHECK(tl_config_check(&b, err, sizeof err) < 0);
    b = c;
    b.n_expert_used = 300;
    CHECK(tl_config_check(&b, err, sizeof err) < 0);
    CHECK(strstr(err, "num_experts_per_tok=300") != NULL);
    b = c;
    b.head_dim = 1 << 28; /* 16 heads x 2^28 x 2 overflows an int */
    b.n_rot = 64;
    CHECK(tl_config_check(&b, err, sizeof err) < 0);
    CHECK(strstr(err, "num_attention_heads*head_dim*2") && strstr(err, "too large"));
    b = c;
    b.n_layer = TL_MAX_LAYERS + 1;
    CHECK(tl_config_check(&b, err, sizeof err) < 0);
    CHECK(strstr(err, "num_hidden_layers") != NULL);
    /* production mismatches name the field */
    b = c;
    b.n_layer = 4;
    CHECK(tl_config_check_production(&b, err, sizeof err) < 0);
    CHECK(strstr(err, "config.json has num_hidden_layers=4, this engine is built for 40") != NULL);
    b = c;
    b.n_ff_expert = 256;
    CHECK(tl_config_check_production(&b, err, sizeof err) < 0);
    CHECK(strstr(err, "moe_intermediate_size=256") != NULL);
    b = c;
    b.layer_kind[0] = TL_LAYER_ATTN;
    CHECK(tl_config_check_production(&b, err, sizeof err) < 0);
    CHECK(strstr(err, "layer_types[0]") != NULL);
    b = c;
    b.rope_theta = 1e6f;
    CHECK(tl_config_check_production(&b, err, sizeof err) < 0);
    CHECK(strstr(err, "rope_theta") != NULL);
}

/* tl_config_load merges generation_config.json's eos list. */
static void test_load_generation_config(void) {
    const char *p = "tests/data/tiny-a/config.json";
    if (access(p, R_OK)) {
        printf("# %s not present\n", p);
        return;
    }
    tl_config c;
    char err[256];
    CHECK_EQ_INT(tl_config_load(&c, p, err, sizeof err), 0);
    CHECK_EQ_INT(c.n_eos, 2); /* 287 from config.json, 289 added from generation_config.json */
    int has287 = 0, has289 = 0;
    for (int i = 0; i < c.n_eos; i++) has287 |= c.eos_ids[i] == 287, has289 |= c.eos_ids[i] == 289;
    CHECK(has287 && has289);
    CHECK_EQ_INT(tl_config_check(&c, err, sizeof err), 0);
    CHECK(tl_config_load(&c, "/nonexistent/config.json", err, sizeof err) < 0);
    CHECK(strstr(err, "/nonexistent/config.json") != NULL);
}

int main(void) {
    T_RUN(test_published_wrapper);
    T_RUN(test_text_only_legacy_rope);
    T_RUN(test_errors);
    T_RUN(test_quantization);
    T_RUN(test_check);
    T_RUN(test_load_generation_config);
    return t_summary();
}
