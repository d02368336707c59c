/* Model configuration read from config.json (published multimodal wrapper with text_config, or a
 * text-only export). Every field is checked for self-consistency; tl_config_check_production
 * additionally checks it against shape.h and names the first field that differs. */
#ifndef TL_CONFIG_H
#define TL_CONFIG_H

#include <stddef.h>
#include "model/shape.h"

typedef enum tl_layer_kind {
    TL_LAYER_GDN = 0,  /* linear_attention: Gated DeltaNet */
    TL_LAYER_ATTN = 1, /* full_attention: gated softmax attention */
} tl_layer_kind;

typedef struct tl_config {
    int n_embd;    /* hidden_size */
    int n_layer;   /* num_hidden_layers */
    int n_vocab;   /* vocab_size (embedding / lm_head rows) */
    int n_head;    /* num_attention_heads */
    int n_head_kv; /* num_key_value_heads */
    int head_dim;  /* head_dim */
    int n_rot;     /* head_dim * partial_rotary_factor */
    float rope_theta;
    int gdn_n_k_head; /* linear_num_key_heads */
    int gdn_n_v_head; /* linear_num_value_heads */
    int gdn_k_dim;    /* linear_key_head_dim */
    int gdn_v_dim;    /* linear_value_head_dim */
    int gdn_conv_k;   /* linear_conv_kernel_dim */
    int n_expert;     /* num_experts */
    int n_expert_used;
    int n_ff_expert; /* moe_intermediate_size */
    int n_ff_shared; /* shared_expert_intermediate_size */
    float rms_eps;
    int max_pos; /* max_position_embeddings */
    int tie_embeddings;
    int mtp_n_layer; /* mtp_num_hidden_layers (0 if absent) */
    int eos_ids[4];  /* stop ids: <|im_end|> and <|endoftext|> when known */
    int n_eos;
    int quant_bits;  /* MLX "quantization".bits: 4 or 8 (0 = not quantized) */
    int quant_group; /* MLX "quantization".group_size */
    tl_layer_kind layer_kind[TL_MAX_LAYERS];
} tl_config;

/* Derived sizes. */
static inline int tl_config_gdn_key_dim(const tl_config *c) {
    return c->gdn_n_k_head * c->gdn_k_dim;
}
static inline int tl_config_gdn_val_dim(const tl_config *c) {
    return c->gdn_n_v_head * c->gdn_v_dim;
}
static inline int tl_config_gdn_conv_dim(const tl_config *c) {
    return 2 * tl_config_gdn_key_dim(c) + tl_config_gdn_val_dim(c);
}

/* Parses config.json text (path is used only in messages). */
int tl_config_parse(tl_config *c, const char *json, const char *path, char *err, size_t errlen);
/* Reads and parses a config.json file. */
int tl_config_load(tl_config *c, const char *path, char *err, size_t errlen);
/* Self-consistency (positive dims, divisibility, layer kinds). */
int tl_config_check(const tl_config *c, char *err, size_t errlen);
/* Equality with shape.h, naming the first mismatching field and its expected value. */
int tl_config_check_production(const tl_config *c, char *err, size_t errlen);
/* Fills c with the production shape of shape.h (random-weight models, benchmarks); stop ids are
 * Qwen3.6's <|im_end|> and <|endoftext|>. */
void tl_config_set_production(tl_config *c);

#endif
