/* The loaded model: config, the tensor directory of every file, and per-layer views that the CPU
 * reference and the GPU upload read. Matrices stay where the file mapping put them (no copies);
 * small 1-D vectors are converted once to f32 with the storage convention removed (the +1 of
 * zero-centred RMSNorm weights applied, conv1d laid out [conv_dim, K]) so consumers never see
 * which checkpoint format they came from.
 *
 * Shapes in comments are row-major, slowest first (PyTorch order). */
#ifndef TL_WEIGHTS_H
#define TL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>
#include "model/config.h"

typedef enum tl_dtype {
    TL_DT_F32 = 0,
    TL_DT_F16,
    TL_DT_BF16,
    TL_DT_U32,
    TL_DT_I32,
    TL_DT_U8,
    TL_DT_I8,
    TL_DT_I64,
    TL_DT_U16,
    TL_DT_I16,
    TL_DT_F64,
    TL_DT_BOOL,
    TL_DT_F8_E4M3,
    TL_DT_COUNT
} tl_dtype;

size_t tl_dtype_size(tl_dtype t);
const char *tl_dtype_name(tl_dtype t);

#define TL_MAX_DIMS 8 /* safetensors allows any rank; vision conv weights are 5-D */

/* One tensor as stored in a file (data points into the mapping). */
typedef struct tl_tensor {
    const char *name;
    const void *data;
    tl_dtype dtype;
    int ndim;
    int64_t shape[TL_MAX_DIMS];
    size_t nbytes;
} tl_tensor;

/* A linear weight [rows, cols] (y = W x), either float (bits == 0: w is F32/F16/BF16, row-major,
 * row stride = cols) or affine-quantized MLX style (bits 4 or 8: w is U32 [rows, cols*bits/32],
 * 32/bits values per word, lowest bits = lowest column; scales and biases [rows, cols/group] in
 * BF16/F16/F32; value = scale * q + bias). Views into stacked expert tensors point at the slice. */
typedef struct tl_mat {
    const void *w;
    const void *scales;
    const void *biases;
    tl_dtype wtype; /* dtype of w (U32 when quantized) */
    tl_dtype stype; /* dtype of scales and biases */
    int bits;       /* 0, 4 or 8 */
    int group;      /* quantization group along cols */
    int rows, cols;
} tl_mat;

/* One decoder layer. Only the fields of its kind are set. */
typedef struct tl_layer {
    tl_layer_kind kind;
    float *attn_norm; /* [n_embd] input_layernorm, offset applied */
    float *ffn_norm;  /* [n_embd] post_attention_layernorm, offset applied */

    /* gated full attention */
    tl_mat attn_q; /* [n_head*head_dim*2, n_embd]: per head [query(head_dim) | gate(head_dim)] */
    tl_mat attn_k; /* [n_head_kv*head_dim, n_embd] */
    tl_mat attn_v; /* [n_head_kv*head_dim, n_embd] */
    tl_mat attn_o; /* [n_embd, n_head*head_dim] */
    float *attn_q_norm; /* [head_dim] offset applied */
    float *attn_k_norm; /* [head_dim] offset applied */

    /* gated deltanet */
    tl_mat gdn_qkv;     /* [2*key_dim + val_dim, n_embd]: rows q | k | v */
    tl_mat gdn_z;       /* [val_dim, n_embd] */
    tl_mat gdn_b;       /* [n_v_head, n_embd] */
    tl_mat gdn_a;       /* [n_v_head, n_embd] */
    float *gdn_conv;    /* [conv_dim, conv_k]: tap conv_k-1 multiplies the current input */
    float *gdn_dt_bias; /* [n_v_head] */
    float *gdn_a_neg;   /* [n_v_head] = -exp(A_log) */
    float *gdn_norm;    /* [v_dim] plain weight (no offset) */
    tl_mat gdn_out;     /* [n_embd, val_dim] */

    /* mixture of experts */
    tl_mat moe_router;  /* [n_expert, n_embd] */
    tl_mat *exp_gate;   /* n_expert views, each [n_ff_expert, n_embd] */
    tl_mat *exp_up;     /* n_expert views, each [n_ff_expert, n_embd] */
    tl_mat *exp_down;   /* n_expert views, each [n_embd, n_ff_expert] */
    tl_mat sh_gate;     /* [n_ff_shared, n_embd] */
    tl_mat sh_up;       /* [n_ff_shared, n_embd] */
    tl_mat sh_down;     /* [n_embd, n_ff_shared] */
    tl_mat sh_gate_inp; /* [1, n_embd] shared_expert_gate */
} tl_layer;

/* The multi-token-prediction head (docs/model.md §3): mtp.* of the checkpoint. */
typedef struct tl_mtp {
    float *norm_emb; /* [n_embd] mtp.pre_fc_norm_embedding, offset applied */
    float *norm_hid; /* [n_embd] mtp.pre_fc_norm_hidden, offset applied */
    tl_mat fc;       /* [n_embd, 2*n_embd]: columns [embedding | hidden] */
    tl_layer layer;  /* mtp.layers.0: gated full attention + MoE (kind TL_LAYER_ATTN) */
    float *norm;     /* [n_embd] mtp.norm, offset applied */
} tl_mtp;

typedef enum tl_ckpt_format {
    TL_CKPT_HF = 0,  /* official safetensors: zero-centred norms (+1), fused experts */
    TL_CKPT_MLX = 1, /* mlx-lm / mlx-vlm: offset norms, switch_mlp, affine quantization */
} tl_ckpt_format;

typedef struct tl_model {
    tl_config cfg;
    tl_ckpt_format format;
    tl_mat tok_embd; /* [n_vocab, n_embd] */
    float *out_norm; /* [n_embd] offset applied */
    tl_mat output;   /* [n_vocab, n_embd] lm_head */
    tl_layer layers[TL_MAX_LAYERS];
    /* 1 when the checkpoint has the MTP head (config mtp_num_hidden_layers >= 1 and mtp.* tensors
     * beyond fc/norm present; every one of them then bound and checked), else 0 (speculative
     * decoding is then off). */
    int has_mtp;
    tl_mtp mtp;

    /* tensor directory over all files (MTP tensors stay addressable here) */
    tl_tensor *tensors;
    int n_tensors;
    void *priv; /* file mappings, owned strings */
} tl_model;

/* Opens a checkpoint directory (config.json + model.safetensors or an index of shards) and binds
 * every tensor, checking names, shapes and dtypes against the config. On failure returns a
 * negative status with err naming the file, tensor and field. */
int tl_model_open(tl_model **out, const char *dir, char *err, size_t errlen);
void tl_model_close(tl_model *m);
/* Looks a tensor up by its name in the file (NULL if absent). */
const tl_tensor *tl_model_find(const tl_model *m, const char *name);
/* Path of the file holding t (an entry of m->tensors). */
const char *tl_model_tensor_file(const tl_model *m, const tl_tensor *t);

/* Element r of row-major float data of a dtype (F32/F16/BF16). */
float tl_load_elem(const void *data, tl_dtype t, size_t i);

#endif
