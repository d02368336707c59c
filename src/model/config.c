/* config.json -> tl_config.
 *
 * Two layouts are accepted (docs/model.md §1): the published multimodal wrapper
 * (architectures ["Qwen3_5MoeForConditionalGeneration"], the language model's fields under
 * "text_config") and a text-only export (model_type "qwen3_5_moe_text", fields at top level).
 * RoPE parameters live in "rope_parameters" (transformers 5) or at the text config's top level
 * (older exports). Stop ids come from eos_token_id (int or list) plus generation_config.json in
 * the same directory. MLX checkpoints add "quantization" with per-module overrides.
 *
 * Every error names the file and the field: "config.json: text_config.num_experts: expected a
 * positive integer". */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/status.h"
#include "common/util.h"
#include "model/config.h"

/* ---- field readers ---- */

typedef struct cfg_ctx {
    const char *path;   /* file name for messages */
    const char *prefix; /* "text_config." or "" */
    json_t *tc;         /* the object holding the text fields */
    json_t *root;
    char *err;
    size_t errlen;
} cfg_ctx;

/* Required positive integer field. */
static int get_pos_int(cfg_ctx *x, const char *key, int *out) {
    json_t *v = json_object_get(x->tc, key);
    if (!v)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: %s%s: missing field", x->path,
                       x->prefix, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 30))
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: %s%s: expected a positive integer",
                       x->path, x->prefix, key);
    *out = (int)json_integer_value(v);
    return TL_OK;
}

/* Optional non-negative integer field (def when absent or null). */
static int get_opt_int(cfg_ctx *x, const char *key, int def, int *out) {
    json_t *v = json_object_get(x->tc, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TL_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: %s%s: expected a non-negative integer", x->path, x->prefix, key);
    *out = (int)json_integer_value(v);
    return TL_OK;
}

/* Optional positive number from obj (def when absent). name is the full field path. */
static int get_opt_num(cfg_ctx *x, json_t *obj, const char *key, const char *name, double def,
                       double *out, int *found) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (found) *found = 0;
    if (!v || json_is_null(v)) {
        *out = def;
        return TL_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: %s: expected a positive number",
                       x->path, name);
    *out = json_number_value(v);
    if (found) *found = 1;
    return TL_OK;
}

static int get_opt_bool(cfg_ctx *x, json_t *obj, const char *key, int def, int *out) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) {
        *out = def;
        return TL_OK;
    }
    if (!json_is_boolean(v))
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: %s%s: expected true or false",
                       x->path, obj == x->tc ? x->prefix : "", key);
    *out = json_is_true(v);
    return TL_OK;
}

static void add_eos(tl_config *c, int id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return;
    if (c->n_eos < (int)(sizeof c->eos_ids / sizeof c->eos_ids[0])) c->eos_ids[c->n_eos++] = id;
}

/* eos_token_id: an integer or a list of integers; anything else is an error naming the field. */
static int read_eos(tl_config *c, json_t *v, const char *path, const char *name, char *err,
                    size_t errlen) {
    if (!v || json_is_null(v)) return TL_OK;
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return tl_errf(err, errlen, TL_ERR_FORMAT, "%s: %s: bad token id", path, name);
        add_eos(c, (int)json_integer_value(v));
        return TL_OK;
    }
    if (!json_is_array(v))
        return tl_errf(err, errlen, TL_ERR_FORMAT, "%s: %s: expected an integer or a list", path,
                       name);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return tl_errf(err, errlen, TL_ERR_FORMAT, "%s: %s[%zu]: expected a token id", path,
                           name, i);
        add_eos(c, (int)json_integer_value(e));
    }
    return TL_OK;
}

/* "quantization" (or "quantization_config") of an MLX checkpoint: default bits/group. */
static int read_quant(tl_config *c, cfg_ctx *x) {
    json_t *q = json_object_get(x->root, "quantization");
    const char *qname = "quantization";
    if (!q) {
        q = json_object_get(x->root, "quantization_config");
        qname = "quantization_config";
    }
    if (!q || json_is_null(q)) return TL_OK;
    if (!json_is_object(q))
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: %s: expected an object", x->path,
                       qname);
    json_t *b = json_object_get(q, "bits"), *g = json_object_get(q, "group_size");
    json_t *mode = json_object_get(q, "mode");
    json_t *qm = json_object_get(q, "quant_method");
    if (qm && json_is_string(qm) && !b)
        return tl_errf(x->err, x->errlen, TL_ERR_UNSUPPORTED,
                       "%s: %s.quant_method \"%s\": only MLX affine quantization is supported",
                       x->path, qname, json_string_value(qm));
    if (!b || !json_is_integer(b) || (json_integer_value(b) != 4 && json_integer_value(b) != 8))
        return tl_errf(x->err, x->errlen, TL_ERR_UNSUPPORTED, "%s: %s.bits: expected 4 or 8",
                       x->path, qname);
    if (!g || !json_is_integer(g) || json_integer_value(g) <= 0 || json_integer_value(g) > 4096)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: %s.group_size: expected a positive integer", x->path, qname);
    if (mode && (!json_is_string(mode) || strcmp(json_string_value(mode), "affine")))
        return tl_errf(x->err, x->errlen, TL_ERR_UNSUPPORTED,
                       "%s: %s.mode: only \"affine\" is supported", x->path, qname);
    c->quant_bits = (int)json_integer_value(b);
    c->quant_group = (int)json_integer_value(g);
    return TL_OK;
}

/* ---- the integer fields: JSON key, place in tl_config, production value ---- */

/* In the order they are read and checked, so the first bad one is the one named. `parsed` = 0
 * marks a derived field (checked against production only). */
static const struct cfg_dim {
    const char *key;
    size_t off;
    int production;
    int parsed;
} CFG_DIMS[] = {
    {"hidden_size", offsetof(tl_config, n_embd), TL_N_EMBD, 1},
    {"num_hidden_layers", offsetof(tl_config, n_layer), TL_N_LAYER, 1},
    {"vocab_size", offsetof(tl_config, n_vocab), TL_N_VOCAB, 1},
    {"num_attention_heads", offsetof(tl_config, n_head), TL_N_HEAD, 1},
    {"num_key_value_heads", offsetof(tl_config, n_head_kv), TL_N_HEAD_KV, 1},
    {"head_dim", offsetof(tl_config, head_dim), TL_HEAD_DIM, 1},
    {"head_dim*partial_rotary_factor", offsetof(tl_config, n_rot), TL_N_ROT, 0},
    {"linear_num_key_heads", offsetof(tl_config, gdn_n_k_head), TL_GDN_N_K_HEAD, 1},
    {"linear_num_value_heads", offsetof(tl_config, gdn_n_v_head), TL_GDN_N_V_HEAD, 1},
    {"linear_key_head_dim", offsetof(tl_config, gdn_k_dim), TL_GDN_K_DIM, 1},
    {"linear_value_head_dim", offsetof(tl_config, gdn_v_dim), TL_GDN_V_DIM, 1},
    {"linear_conv_kernel_dim", offsetof(tl_config, gdn_conv_k), TL_GDN_CONV_K, 1},
    {"num_experts", offsetof(tl_config, n_expert), TL_N_EXPERT, 1},
    {"num_experts_per_tok", offsetof(tl_config, n_expert_used), TL_N_EXPERT_USED, 1},
    {"moe_intermediate_size", offsetof(tl_config, n_ff_expert), TL_N_FF_EXPERT, 1},
    {"shared_expert_intermediate_size", offsetof(tl_config, n_ff_shared), TL_N_FF_SHARED, 1},
};
#define N_CFG_DIMS (sizeof CFG_DIMS / sizeof CFG_DIMS[0])

static int *dim_field(tl_config *c, size_t i) { return (int *)((char *)c + CFG_DIMS[i].off); }
static int dim_value(const tl_config *c, size_t i) {
    return *(const int *)((const char *)c + CFG_DIMS[i].off);
}

/* ---- parsing, one phase per field group ---- */

/* Phase 1: the object holding the language model's fields (text_config or the top level), and
 * its model_type. */
static int cfg_locate(cfg_ctx *x) {
    if (!json_is_object(x->root))
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: expected a JSON object", x->path);
    json_t *tc = json_object_get(x->root, "text_config");
    if (tc) {
        if (!json_is_object(tc))
            return tl_errf(x->err, x->errlen, TL_ERR_FORMAT, "%s: text_config: expected an object",
                           x->path);
        x->tc = tc;
        x->prefix = "text_config.";
    }
    json_t *mt = json_object_get(x->tc, "model_type");
    if (mt && json_is_string(mt) && !strstr(json_string_value(mt), "qwen3_5_moe") &&
        !strstr(json_string_value(mt), "qwen3_next"))
        return tl_errf(x->err, x->errlen, TL_ERR_UNSUPPORTED,
                       "%s: %smodel_type \"%s\": expected qwen3_5_moe_text (Qwen3.5/3.6 MoE)",
                       x->path, x->prefix, json_string_value(mt));
    return TL_OK;
}

/* Phase 2: the required dimensions, then the optional sizes and rms_norm_eps. */
static int cfg_read_dims(tl_config *c, cfg_ctx *x) {
    int st;
    for (size_t i = 0; i < N_CFG_DIMS; i++)
        if (CFG_DIMS[i].parsed && (st = get_pos_int(x, CFG_DIMS[i].key, dim_field(c, i))))
            return st;
    /* Defaults below are Qwen3_5MoeTextConfig's (HF-cfg) for keys a config may omit. */
    if ((st = get_opt_int(x, "max_position_embeddings", 262144, &c->max_pos))) return st;
    if ((st = get_opt_int(x, "mtp_num_hidden_layers", 0, &c->mtp_n_layer))) return st;
    double d;
    char name[96];
    snprintf(name, sizeof name, "%srms_norm_eps", x->prefix);
    if ((st = get_opt_num(x, x->tc, "rms_norm_eps", name, 1e-6, &d, NULL))) return st;
    c->rms_eps = (float)d;
    return TL_OK;
}

/* A RoPE number: from rope_parameters (rp), else from the text config's top level. */
static int rope_num(cfg_ctx *x, json_t *rp, const char *key, double def, double *out, int *found) {
    char name[96];
    snprintf(name, sizeof name, "%srope_parameters.%s", x->prefix, key);
    int st = get_opt_num(x, rp, key, name, def, out, found);
    if (st || *found) return st;
    snprintf(name, sizeof name, "%s%s", x->prefix, key);
    return get_opt_num(x, x->tc, key, name, def, out, found);
}

/* Phase 3: rope_theta and the rotary dims; rope_parameters is looked for in the text config
 * (also as rope_scaling), then at the top level. */
static int cfg_read_rope(tl_config *c, cfg_ctx *x) {
    json_t *rp = json_object_get(x->tc, "rope_parameters");
    const char *rp_prefix = x->prefix;
    if (!rp) rp = json_object_get(x->tc, "rope_scaling");
    if (!rp && x->tc != x->root) {
        rp = json_object_get(x->root, "rope_parameters");
        rp_prefix = "";
    }
    if (rp && !json_is_object(rp))
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: %srope_parameters: expected an object", x->path, rp_prefix);
    double theta, prf;
    int found = 0, st = rope_num(x, rp, "rope_theta", 0, &theta, &found);
    if (st) return st;
    if (!found)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: %srope_parameters.rope_theta: missing field", x->path, x->prefix);
    c->rope_theta = (float)theta;
    if ((st = rope_num(x, rp, "partial_rotary_factor", 0.25, &prf, &found))) return st;
    if (prf > 1.0)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: %spartial_rotary_factor: %g is above 1", x->path, x->prefix, prf);
    c->n_rot = (int)lround(c->head_dim * prf);
    return TL_OK;
}

/* layer_types: one "linear_attention" or "full_attention" per layer. */
static int read_layer_types(tl_config *c, cfg_ctx *x, json_t *lt) {
    if (!json_is_array(lt) || (int)json_array_size(lt) != c->n_layer)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: %slayer_types: expected a list of num_hidden_layers=%d strings",
                       x->path, x->prefix, c->n_layer);
    for (int i = 0; i < c->n_layer; i++) {
        const char *s = json_string_value(json_array_get(lt, (size_t)i));
        if (s && !strcmp(s, "linear_attention"))
            c->layer_kind[i] = TL_LAYER_GDN;
        else if (s && !strcmp(s, "full_attention"))
            c->layer_kind[i] = TL_LAYER_ATTN;
        else
            return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                           "%s: %slayer_types[%d]: expected \"linear_attention\" or "
                           "\"full_attention\"",
                           x->path, x->prefix, i);
    }
    return TL_OK;
}

/* Phase 4: tie_word_embeddings (text config first, then top level) and the layer kinds
 * (explicit layer_types, else full_attention_interval). */
static int cfg_read_layers(tl_config *c, cfg_ctx *x) {
    json_t *tie_obj = json_object_get(x->tc, "tie_word_embeddings") ? x->tc : x->root;
    int st = get_opt_bool(x, tie_obj, "tie_word_embeddings", 0, &c->tie_embeddings);
    if (st) return st;
    if (c->n_layer > TL_MAX_LAYERS)
        return tl_errf(x->err, x->errlen, TL_ERR_UNSUPPORTED,
                       "%s: %snum_hidden_layers: %d is above %d", x->path, x->prefix, c->n_layer,
                       TL_MAX_LAYERS);
    json_t *lt = json_object_get(x->tc, "layer_types");
    if (lt && !json_is_null(lt)) return read_layer_types(c, x, lt);
    int every;
    if ((st = get_opt_int(x, "full_attention_interval", TL_FULL_ATTN_EVERY, &every))) return st;
    if (every <= 0)
        return tl_errf(x->err, x->errlen, TL_ERR_FORMAT,
                       "%s: %sfull_attention_interval: expected a positive integer", x->path,
                       x->prefix);
    for (int i = 0; i < c->n_layer; i++)
        c->layer_kind[i] = (i + 1) % every == 0 ? TL_LAYER_ATTN : TL_LAYER_GDN;
    return TL_OK;
}

/* Phase 5: stop ids from eos_token_id of the text config and of the top level. */
static int cfg_read_eos(tl_config *c, cfg_ctx *x) {
    char name[96];
    snprintf(name, sizeof name, "%seos_token_id", x->prefix);
    int st = read_eos(c, json_object_get(x->tc, "eos_token_id"), x->path, name, x->err, x->errlen);
    if (!st && x->tc != x->root)
        st = read_eos(c, json_object_get(x->root, "eos_token_id"), x->path, "eos_token_id", x->err,
                      x->errlen);
    return st;
}

int tl_config_parse(tl_config *c, const char *json, const char *path, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return tl_errf(err, errlen, TL_ERR_FORMAT, "%s: bad JSON at line %d: %s", path, je.line,
                       je.text);
    cfg_ctx x = {path, "", root, root, err, errlen};
    int st = cfg_locate(&x);
    if (!st) st = cfg_read_dims(c, &x);
    if (!st) st = cfg_read_rope(c, &x);
    if (!st) st = cfg_read_layers(c, &x);
    if (!st) st = cfg_read_eos(c, &x);
    if (!st) st = read_quant(c, &x);
    json_decref(root);
    return st;
}

/* generation_config.json next to config.json (if there is one): its eos_token_id adds stop
 * ids. */
static int read_generation_config(tl_config *c, const char *path, char *err, size_t errlen) {
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0;
    char *gpath = xmalloc(dl + 32), *text = NULL;
    memcpy(gpath, path, dl);
    strcpy(gpath + dl, "generation_config.json");
    int st = TL_OK;
    FILE *f = fopen(gpath, "rb");
    if (f) {
        fclose(f);
        st = tl_read_file(gpath, &text, NULL, err, errlen);
    }
    if (text) {
        json_error_t je;
        json_t *g = json_loads(text, 0, &je);
        free(text);
        if (!g || !json_is_object(g))
            st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: bad JSON at line %d: %s", gpath,
                         g ? 0 : je.line, g ? "expected an object" : je.text);
        else
            st =
                read_eos(c, json_object_get(g, "eos_token_id"), gpath, "eos_token_id", err, errlen);
        json_decref(g);
    }
    free(gpath);
    return st;
}

int tl_config_load(tl_config *c, const char *path, char *err, size_t errlen) {
    char *text = NULL;
    int st = tl_read_file(path, &text, NULL, err, errlen);
    if (st) return st;
    st = tl_config_parse(c, text, path, err, errlen);
    free(text);
    return st ? st : read_generation_config(c, path, err, errlen);
}

/* ---- checks ---- */

/* Every matrix dimension the loader derives must fit an int (tl_mat rows/cols). */
static int check_derived(const tl_config *c, char *err, size_t errlen) {
    int64_t conv_ch =
        2 * (int64_t)c->gdn_n_k_head * c->gdn_k_dim + (int64_t)c->gdn_n_v_head * c->gdn_v_dim;
    const struct {
        const char *what;
        int64_t v;
    } derived[] = {
        {"num_attention_heads*head_dim*2", (int64_t)c->n_head * c->head_dim * 2},
        {"num_key_value_heads*head_dim", (int64_t)c->n_head_kv * c->head_dim},
        {"2*linear_num_key_heads*linear_key_head_dim + "
         "linear_num_value_heads*linear_value_head_dim",
         conv_ch},
        {"linear_conv_kernel_dim x conv channels", conv_ch * c->gdn_conv_k},
        {"moe_intermediate_size*2", (int64_t)c->n_ff_expert * 2},
    };
    for (size_t i = 0; i < sizeof derived / sizeof derived[0]; i++)
        if (derived[i].v > INT32_MAX)
            return tl_errf(err, errlen, TL_ERR_FORMAT, "config.json: %s = %lld is too large",
                           derived[i].what, (long long)derived[i].v);
    return TL_OK;
}

/* Head counts that must divide, rotary dims, expert counts, positive scalars. */
static int check_relations(const tl_config *c, char *err, size_t errlen) {
    if (c->n_head % c->n_head_kv)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "config.json: num_attention_heads=%d is not a multiple of "
                       "num_key_value_heads=%d",
                       c->n_head, c->n_head_kv);
    if (c->gdn_n_v_head % c->gdn_n_k_head)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "config.json: linear_num_value_heads=%d is not a multiple of "
                       "linear_num_key_heads=%d",
                       c->gdn_n_v_head, c->gdn_n_k_head);
    if (c->n_rot <= 0 || c->n_rot % 2 || c->n_rot > c->head_dim)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "config.json: rotary dims %d (head_dim x partial_rotary_factor) must be "
                       "even and in 2..head_dim=%d",
                       c->n_rot, c->head_dim);
    if (c->n_expert_used > c->n_expert)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "config.json: num_experts_per_tok=%d is above num_experts=%d",
                       c->n_expert_used, c->n_expert);
    if (!(c->rms_eps > 0) || !(c->rope_theta > 0))
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "config.json: rms_norm_eps and rope_theta must be positive");
    if (c->max_pos <= 0)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "config.json: max_position_embeddings=%d: expected a positive value",
                       c->max_pos);
    return TL_OK;
}

/* Layer kinds and the MLX quantization defaults. */
static int check_kinds_quant(const tl_config *c, char *err, size_t errlen) {
    for (int i = 0; i < c->n_layer; i++)
        if (c->layer_kind[i] != TL_LAYER_GDN && c->layer_kind[i] != TL_LAYER_ATTN)
            return tl_errf(err, errlen, TL_ERR_FORMAT, "config.json: layer_types[%d]: bad kind", i);
    if (!c->quant_bits) return TL_OK;
    if (c->quant_bits != 4 && c->quant_bits != 8)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "config.json: quantization.bits=%d: expected 4 or 8", c->quant_bits);
    if (c->quant_group <= 0)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "config.json: quantization.group_size=%d: expected a positive value",
                       c->quant_group);
    return TL_OK;
}

int tl_config_check(const tl_config *c, char *err, size_t errlen) {
    for (size_t i = 0; i < N_CFG_DIMS; i++)
        if (CFG_DIMS[i].parsed && dim_value(c, i) <= 0)
            return tl_errf(err, errlen, TL_ERR_FORMAT,
                           "config.json: %s=%d: expected a positive value", CFG_DIMS[i].key,
                           dim_value(c, i));
    if (c->n_layer > TL_MAX_LAYERS)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "config.json: num_hidden_layers=%d is above the limit %d", c->n_layer,
                       TL_MAX_LAYERS);
    if (c->n_expert > 65536)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "config.json: num_experts=%d is above the limit 65536", c->n_expert);
    int st = check_derived(c, err, errlen);
    if (!st) st = check_relations(c, err, errlen);
    if (!st) st = check_kinds_quant(c, err, errlen);
    return st;
}

static tl_layer_kind production_kind(int il) {
    return (il + 1) % TL_FULL_ATTN_EVERY == 0 ? TL_LAYER_ATTN : TL_LAYER_GDN;
}

static const char *kind_name(tl_layer_kind k) {
    return k == TL_LAYER_ATTN ? "full_attention" : "linear_attention";
}

int tl_config_check_production(const tl_config *c, char *err, size_t errlen) {
    static const char hint[] = "is this the Qwen3.6-35B-A3B checkpoint?";
    for (size_t i = 0; i < N_CFG_DIMS; i++)
        if (dim_value(c, i) != CFG_DIMS[i].production)
            return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                           "config.json has %s=%d, this engine is built for %d: %s",
                           CFG_DIMS[i].key, dim_value(c, i), CFG_DIMS[i].production, hint);
    if (fabsf(c->rope_theta - TL_ROPE_THETA) > 1e-3f * TL_ROPE_THETA)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "config.json has rope_theta=%g, this engine is built for %g: %s",
                       (double)c->rope_theta, (double)TL_ROPE_THETA, hint);
    if (fabsf(c->rms_eps - TL_RMS_EPS) > 1e-3f * TL_RMS_EPS)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "config.json has rms_norm_eps=%g, this engine is built for %g: %s",
                       (double)c->rms_eps, (double)TL_RMS_EPS, hint);
    for (int i = 0; i < c->n_layer; i++)
        if (c->layer_kind[i] != production_kind(i))
            return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                           "config.json has layer_types[%d]=%s, this engine is built for %s "
                           "(full attention every %d layers): %s",
                           i, kind_name(c->layer_kind[i]), kind_name(production_kind(i)),
                           TL_FULL_ATTN_EVERY, hint);
    return TL_OK;
}

void tl_config_set_production(tl_config *c) {
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < N_CFG_DIMS; i++) *dim_field(c, i) = CFG_DIMS[i].production;
    c->rope_theta = TL_ROPE_THETA, c->rms_eps = TL_RMS_EPS, c->max_pos = TL_MAX_POS;
    c->eos_ids[0] = 248046, c->eos_ids[1] = 248044, c->n_eos = 2;
    for (int il = 0; il < c->n_layer; il++) c->layer_kind[il] = production_kind(il);
}
