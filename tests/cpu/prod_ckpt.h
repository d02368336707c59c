/* Test helper: a checkpoint with the production model's shape (config.json as published,
 * model.safetensors in the official HF layout with every tensor the loader binds) whose data is
 * one sparse hole: ~67 GB apparent, a few kB on disk, all weights zero. For tests of what happens
 * with the production model before any weight is used (backend choice); never run it. */
#ifndef PROD_CKPT_H
#define PROD_CKPT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/status.h"
#include "model/shape.h"
#include "model/st.h"

/* The production text_config (the published config.json's values). */
static const char PC_CONFIG[] =
    "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": "
    "\"qwen3_5_moe\", \"tie_word_embeddings\": false, \"text_config\": {"
    "\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 2048, \"num_hidden_layers\": 40, "
    "\"vocab_size\": 248320, \"num_attention_heads\": 16, \"num_key_value_heads\": 2, "
    "\"head_dim\": 256, \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 32, "
    "\"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128, "
    "\"linear_conv_kernel_dim\": 4, \"num_experts\": 256, \"num_experts_per_tok\": 8, "
    "\"moe_intermediate_size\": 512, \"shared_expert_intermediate_size\": 512, "
    "\"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 262144, \"eos_token_id\": 248044, "
    "\"full_attention_interval\": 4, \"mtp_num_hidden_layers\": 1, \"rope_parameters\": "
    "{\"rope_type\": \"default\", \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25, "
    "\"mrope_section\": [11, 11, 10], \"mrope_interleaved\": true}}}";

typedef struct {
    tl_st_entry *e;
    char (*names)[96];
    int n, cap;
} pc_list;

static void pc_add(pc_list *l, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->e = realloc(l->e, sizeof *l->e * (size_t)l->cap);
        l->names = realloc(l->names, sizeof *l->names * (size_t)l->cap);
    }
    snprintf(l->names[l->n], sizeof l->names[l->n], "model.language_model.%s", name);
    tl_st_entry *e = &l->e[l->n];
    memset(e, 0, sizeof *e);
    e->dtype = TL_DT_BF16;
    e->ndim = ndim;
    e->shape[0] = d0, e->shape[1] = d1, e->shape[2] = d2;
    l->n++;
}

static void pc_layer(pc_list *l, int il) {
    const int64_t D = TL_N_EMBD, HD = TL_HEAD_DIM, FF = TL_N_FF_EXPERT, E = TL_N_EXPERT;
    const int64_t kd = TL_GDN_N_K_HEAD * TL_GDN_K_DIM, vd = TL_GDN_N_V_HEAD * TL_GDN_V_DIM;
    char n[96];
#define PC(suffix, ...) (snprintf(n, sizeof n, "layers.%d." suffix, il), pc_add(l, n, __VA_ARGS__))
    PC("input_layernorm.weight", 1, D, 0, 0);
    PC("post_attention_layernorm.weight", 1, D, 0, 0);
    if ((il + 1) % 4 == 0) {
        PC("self_attn.q_proj.weight", 2, TL_N_HEAD * HD * 2, D, 0);
        PC("self_attn.k_proj.weight", 2, TL_N_HEAD_KV * HD, D, 0);
        PC("self_attn.v_proj.weight", 2, TL_N_HEAD_KV * HD, D, 0);
        PC("self_attn.o_proj.weight", 2, D, TL_N_HEAD * HD, 0);
        PC("self_attn.q_norm.weight", 1, HD, 0, 0);
        PC("self_attn.k_norm.weight", 1, HD, 0, 0);
    } else {
        PC("linear_attn.in_proj_qkv.weight", 2, 2 * kd + vd, D, 0);
        PC("linear_attn.in_proj_z.weight", 2, vd, D, 0);
        PC("linear_attn.in_proj_b.weight", 2, TL_GDN_N_V_HEAD, D, 0);
        PC("linear_attn.in_proj_a.weight", 2, TL_GDN_N_V_HEAD, D, 0);
        PC("linear_attn.conv1d.weight", 3, 2 * kd + vd, 1, TL_GDN_CONV_K);
        PC("linear_attn.dt_bias", 1, TL_GDN_N_V_HEAD, 0, 0);
        PC("linear_attn.A_log", 1, TL_GDN_N_V_HEAD, 0, 0);
        PC("linear_attn.norm.weight", 1, TL_GDN_V_DIM, 0, 0);
        PC("linear_attn.out_proj.weight", 2, D, vd, 0);
    }
    PC("mlp.gate.weight", 2, E, D, 0);
    PC("mlp.shared_expert.gate_proj.weight", 2, TL_N_FF_SHARED, D, 0);
    PC("mlp.shared_expert.up_proj.weight", 2, TL_N_FF_SHARED, D, 0);
    PC("mlp.shared_expert.down_proj.weight", 2, D, TL_N_FF_SHARED, 0);
    PC("mlp.shared_expert_gate.weight", 2, 1, D, 0);
    PC("mlp.experts.gate_up_proj", 3, E, 2 * FF, D);
    PC("mlp.experts.down_proj", 3, E, D, FF);
#undef PC
}

/* Writes dir/config.json and dir/model.safetensors (header, then a hole to the full size). */
static int pc_write(const char *dir, char *err, size_t errlen) {
    char path[512];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(PC_CONFIG, f) < 0 || fclose(f))
        return tl_errf(err, errlen, TL_ERR_IO, "cannot write %s", path);
    pc_list l = {0};
    pc_add(&l, "embed_tokens.weight", 2, TL_N_VOCAB, TL_N_EMBD, 0);
    pc_add(&l, "norm.weight", 1, TL_N_EMBD, 0, 0);
    for (int il = 0; il < TL_N_LAYER; il++) pc_layer(&l, il);
    pc_add(&l, "lm_head.weight", 2, TL_N_VOCAB, TL_N_EMBD, 0);
    snprintf(l.names[l.n - 1], sizeof l.names[0], "lm_head.weight"); /* no model prefix */
    size_t data = 0;
    for (int i = 0; i < l.n; i++) {
        l.e[i].name = l.names[i];
        data += tl_st_entry_nbytes(&l.e[i]);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    int st = f ? tl_st_write_header(f, l.e, l.n, path, err, errlen)
               : tl_errf(err, errlen, TL_ERR_IO, "cannot write %s", path);
    if (f) {
        long hdr = ftell(f);
        if (fclose(f) || truncate(path, hdr + (off_t)data))
            st = st ? st : tl_errf(err, errlen, TL_ERR_IO, "cannot size %s", path);
    }
    free(l.e);
    free(l.names);
    return st;
}

static void pc_remove(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

#endif
