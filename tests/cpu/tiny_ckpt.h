/* Test helper: writes a tiny Qwen3.5-MoE checkpoint (config.json + model.safetensors) in the
 * official HF layout with deterministic values, so a test can check every view the loader builds
 * against the value it knows was written. Element i of tensor `name` holds tc_val(name, i)
 * rounded to bf16 (norm vectors are scaled down so they look zero-centred; A_log is a log of a
 * positive number). Options omit a tensor, change one tensor's shape or dtype, or write
 * per-expert tensors instead of the fused ones. */
#ifndef TINY_CKPT_H
#define TINY_CKPT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/util.h"
#include "model/st.h"

/* tiny dims */
enum {
    TC_EMBD = 64,
    TC_LAYERS = 4,
    TC_VOCAB = 40,
    TC_HEAD = 4,
    TC_HEAD_KV = 2,
    TC_HEAD_DIM = 16,
    TC_KH = 2,
    TC_VH = 4,
    TC_KD = 8,
    TC_VD = 8,
    TC_CONVK = 4,
    TC_EXP = 4,
    TC_EXP_USED = 2,
    TC_FF = 16,
    TC_FF_SH = 32,
    TC_KEYDIM = TC_KH * TC_KD,
    TC_VALDIM = TC_VH * TC_VD,
    TC_CONV = 2 * TC_KEYDIM + TC_VALDIM,
};

static inline uint32_t tc_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* The value written at element i of tensor name, before bf16 rounding. */
static inline float tc_raw(const char *name, size_t i) {
    uint32_t h = tc_hash(name) ^ (uint32_t)(i * 2654435761u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float u = (float)(h % 20001u) / 10000.0f - 1.0f; /* [-1, 1] */
    size_t n = strlen(name);
    if (n > 5 && !strcmp(name + n - 5, "A_log")) return 0.5f * u; /* log of 0.6..1.6 */
    if (strstr(name, "norm")) return 0.1f * u;
    return 0.5f * u;
}

static inline float tc_val(const char *name, size_t i) {
    return tl_bf16_to_f32(tl_f32_to_bf16(tc_raw(name, i)));
}

typedef struct tc_opts {
    int per_expert;              /* write mlp.experts.{e}.*_proj.weight instead of fused 3-D */
    const char *omit;            /* leave this tensor out */
    const char *bad_shape;       /* add 1 to dim 0 of this tensor */
    const char *bad_dtype;       /* store this tensor as I32 */
    int text_only;               /* "model." prefix and a flat config */
    int add_offset;              /* store norms already offset by +1 (wrongly, for HF) */
    const char *config_override; /* whole config.json text, if set */
    int mtp;                     /* write the whole MTP head (mtp.*), experts as per_expert says */
} tc_opts;

typedef struct tc_list {
    tl_st_entry e[320];
    void *buf[320];
    int n;
} tc_list;

static inline void tc_add(tc_list *L, const tc_opts *o, const char *name, int ndim, int64_t d0,
                          int64_t d1, int64_t d2) {
    if (o->omit && !strcmp(o->omit, name)) return;
    tl_st_entry *e = &L->e[L->n];
    e->name = xstrdup(name);
    e->ndim = ndim;
    int64_t dims[3] = {d0, d1, d2};
    size_t n = 1;
    for (int d = 0; d < ndim; d++) {
        e->shape[d] = dims[d];
        n *= (size_t)dims[d];
    }
    if (o->bad_shape && !strcmp(o->bad_shape, name))
        e->shape[0] += 1, n = n / (size_t)dims[0] * (size_t)(dims[0] + 1);
    int bad_dt = o->bad_dtype && !strcmp(o->bad_dtype, name);
    e->dtype = bad_dt ? TL_DT_I32 : TL_DT_BF16;
    if (bad_dt) {
        int32_t *p = xcalloc(n, 4);
        L->buf[L->n] = p;
    } else {
        uint16_t *p = xmalloc(n * 2);
        size_t nn = strlen(name);
        int is_norm1p = strstr(name, "layernorm") ||
                        (strstr(name, "norm.weight") && !strstr(name, "linear_attn.norm"));
        for (size_t i = 0; i < n; i++) {
            float v = tc_raw(name, i);
            if (o->add_offset && is_norm1p) v += 1.0f;
            p[i] = tl_f32_to_bf16(v);
        }
        (void)nn;
        L->buf[L->n] = p;
    }
    e->data = L->buf[L->n];
    L->n++;
}

static inline void tc_free(tc_list *L) {
    for (int i = 0; i < L->n; i++) {
        free((void *)L->e[i].name);
        free(L->buf[i]);
    }
    L->n = 0;
}

static inline int tc_is_attn(int il) { return (il + 1) % 4 == 0; }

static inline void tc_config(const char *dir, const tc_opts *o) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (o->config_override) {
        fputs(o->config_override, f);
        fclose(f);
        return;
    }
    const char *fields =
        "\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 64, \"num_hidden_layers\": 4, "
        "\"vocab_size\": 40, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
        "\"head_dim\": 16, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, "
        "\"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8, \"linear_conv_kernel_dim\": 4, "
        "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, "
        "\"shared_expert_intermediate_size\": 32, \"rms_norm_eps\": 1e-06, "
        "\"mtp_num_hidden_layers\": 1, "
        "\"max_position_embeddings\": 4096, \"eos_token_id\": 7, "
        "\"layer_types\": [\"linear_attention\", \"linear_attention\", \"linear_attention\", "
        "\"full_attention\"], "
        "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, "
        "\"partial_rotary_factor\": 0.25}, \"tie_word_embeddings\": false";
    if (o->text_only)
        fprintf(f, "{%s}\n", fields);
    else
        fprintf(f,
                "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": "
                "\"qwen3_5_moe\", \"tie_word_embeddings\": false, \"text_config\": {%s}}\n",
                fields);
    fclose(f);
}

/* One decoder layer "<pre>layers.<il>.*" (attention or GDN mixer, MoE). */
static inline void tc_layer(tc_list *L, const tc_opts *o, const char *pre, int il, int attn) {
    char n[256];
#define NM(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    tc_add(L, o, NM("%slayers.%d.input_layernorm.weight", pre, il), 1, TC_EMBD, 0, 0);
    tc_add(L, o, NM("%slayers.%d.post_attention_layernorm.weight", pre, il), 1, TC_EMBD, 0, 0);
    if (attn) {
        tc_add(L, o, NM("%slayers.%d.self_attn.q_proj.weight", pre, il), 2,
               TC_HEAD * TC_HEAD_DIM * 2, TC_EMBD, 0);
        tc_add(L, o, NM("%slayers.%d.self_attn.k_proj.weight", pre, il), 2,
               TC_HEAD_KV * TC_HEAD_DIM, TC_EMBD, 0);
        tc_add(L, o, NM("%slayers.%d.self_attn.v_proj.weight", pre, il), 2,
               TC_HEAD_KV * TC_HEAD_DIM, TC_EMBD, 0);
        tc_add(L, o, NM("%slayers.%d.self_attn.o_proj.weight", pre, il), 2, TC_EMBD,
               TC_HEAD * TC_HEAD_DIM, 0);
        tc_add(L, o, NM("%slayers.%d.self_attn.q_norm.weight", pre, il), 1, TC_HEAD_DIM, 0, 0);
        tc_add(L, o, NM("%slayers.%d.self_attn.k_norm.weight", pre, il), 1, TC_HEAD_DIM, 0, 0);
    } else {
        tc_add(L, o, NM("%slayers.%d.linear_attn.in_proj_qkv.weight", pre, il), 2, TC_CONV, TC_EMBD,
               0);
        tc_add(L, o, NM("%slayers.%d.linear_attn.in_proj_z.weight", pre, il), 2, TC_VALDIM, TC_EMBD,
               0);
        tc_add(L, o, NM("%slayers.%d.linear_attn.in_proj_b.weight", pre, il), 2, TC_VH, TC_EMBD, 0);
        tc_add(L, o, NM("%slayers.%d.linear_attn.in_proj_a.weight", pre, il), 2, TC_VH, TC_EMBD, 0);
        tc_add(L, o, NM("%slayers.%d.linear_attn.conv1d.weight", pre, il), 3, TC_CONV, 1, TC_CONVK);
        tc_add(L, o, NM("%slayers.%d.linear_attn.dt_bias", pre, il), 1, TC_VH, 0, 0);
        tc_add(L, o, NM("%slayers.%d.linear_attn.A_log", pre, il), 1, TC_VH, 0, 0);
        tc_add(L, o, NM("%slayers.%d.linear_attn.norm.weight", pre, il), 1, TC_VD, 0, 0);
        tc_add(L, o, NM("%slayers.%d.linear_attn.out_proj.weight", pre, il), 2, TC_EMBD, TC_VALDIM,
               0);
    }
    tc_add(L, o, NM("%slayers.%d.mlp.gate.weight", pre, il), 2, TC_EXP, TC_EMBD, 0);
    tc_add(L, o, NM("%slayers.%d.mlp.shared_expert.gate_proj.weight", pre, il), 2, TC_FF_SH,
           TC_EMBD, 0);
    tc_add(L, o, NM("%slayers.%d.mlp.shared_expert.up_proj.weight", pre, il), 2, TC_FF_SH, TC_EMBD,
           0);
    tc_add(L, o, NM("%slayers.%d.mlp.shared_expert.down_proj.weight", pre, il), 2, TC_EMBD,
           TC_FF_SH, 0);
    tc_add(L, o, NM("%slayers.%d.mlp.shared_expert_gate.weight", pre, il), 2, 1, TC_EMBD, 0);
    if (!o->per_expert) {
        tc_add(L, o, NM("%slayers.%d.mlp.experts.gate_up_proj", pre, il), 3, TC_EXP, 2 * TC_FF,
               TC_EMBD);
        tc_add(L, o, NM("%slayers.%d.mlp.experts.down_proj", pre, il), 3, TC_EXP, TC_EMBD, TC_FF);
    } else {
        /* same values as the fused tensors: element (e, r, c) of the fused tensor */
        char fused[256];
        for (int e = 0; e < TC_EXP; e++) {
            const char *parts[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int k = 0; k < 3; k++) {
                int rows = k == 2 ? TC_EMBD : TC_FF, cols = k == 2 ? TC_FF : TC_EMBD;
                tc_add(L, o, NM("%slayers.%d.mlp.experts.%d.%s.weight", pre, il, e, parts[k]), 2,
                       rows, cols, 0);
                tl_st_entry *en = &L->e[L->n - 1];
                if (en->dtype != TL_DT_BF16 || strcmp(en->name, n)) continue;
                snprintf(fused, sizeof fused, "%slayers.%d.mlp.experts.%s", pre, il,
                         k == 2 ? "down_proj" : "gate_up_proj");
                uint16_t *p = L->buf[L->n - 1];
                size_t total = k == 2 ? TC_EMBD : 2 * TC_FF, r0 = k == 1 ? TC_FF : 0;
                for (int r = 0; r < rows && r < en->shape[0]; r++)
                    for (int c = 0; c < cols; c++)
                        p[(size_t)r * cols + c] =
                            tl_f32_to_bf16(tc_raw(fused, ((size_t)e * total + r0 + r) * cols + c));
            }
        }
    }
#undef NM
}

/* Writes the checkpoint into dir (created). Returns 0 or the writer's status. */
static inline int tc_write(const char *dir, const tc_opts *o) {
    mkdir(dir, 0755);
    tc_config(dir, o);
    tc_list *L = xcalloc(1, sizeof *L);
    const char *pre = o->text_only ? "model." : "model.language_model.";
    char n[256];
#define NM(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    tc_add(L, o, NM("%sembed_tokens.weight", pre), 2, TC_VOCAB, TC_EMBD, 0);
    tc_add(L, o, NM("%snorm.weight", pre), 1, TC_EMBD, 0, 0);
    tc_add(L, o, "lm_head.weight", 2, TC_VOCAB, TC_EMBD, 0);
    for (int il = 0; il < TC_LAYERS; il++) tc_layer(L, o, pre, il, tc_is_attn(il));
    tc_add(L, o, "mtp.fc.weight", 2, TC_EMBD, 2 * TC_EMBD, 0);
    if (o->mtp) {
        tc_add(L, o, "mtp.pre_fc_norm_embedding.weight", 1, TC_EMBD, 0, 0);
        tc_add(L, o, "mtp.pre_fc_norm_hidden.weight", 1, TC_EMBD, 0, 0);
        tc_add(L, o, "mtp.norm.weight", 1, TC_EMBD, 0, 0);
        tc_layer(L, o, "mtp.", 0, 1);
    }
    tc_add(L, o, "model.visual.patch_embed.proj.weight", 3, 8, 3, 4);
#undef NM
    snprintf(n, sizeof n, "%s/model.safetensors", dir);
    char err[256];
    int st = tl_st_write(n, L->e, L->n, err, sizeof err);
    if (st) fprintf(stderr, "tc_write: %s\n", err);
    tc_free(L);
    free(L);
    return st;
}

/* A fresh directory under /tmp for one test. */
static inline void tc_tmpdir(char *buf, size_t n, const char *tag) {
    snprintf(buf, n, "/tmp/tulip-test-%d-%s", (int)getpid(), tag);
    mkdir(buf, 0755);
}

static inline void tc_rmdir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
}

#endif
