/* config.json -> tl_config.
 *
 * Two layouts are accepted (MODEL.md §1): the published multimodal wrapper
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

int tl_config_parse(tl_config *c, const char *json, const char *path, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return tl_errf(err, errlen, TL_ERR_FORMAT, "%s: bad JSON at line %d: %s", path, je.line,
                       je.text);
    int st = TL_OK;
    if (!json_is_object(root)) {
        st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: expected a JSON object", path);
        goto done;
    }
    cfg_ctx x = {path, "", root, root, err, errlen};
    json_t *tc = json_object_get(root, "text_config");
    if (tc) {
        if (!json_is_object(tc)) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: text_config: expected an object", path);
            goto done;
        }
        x.tc = tc;
        x.prefix = "text_config.";
    }
    json_t *mt = json_object_get(x.tc, "model_type");
    if (mt && json_is_string(mt) && !strstr(json_string_value(mt), "qwen3_5_moe") &&
        !strstr(json_string_value(mt), "qwen3_next")) {
        st = tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                     "%s: %smodel_type \"%s\": expected qwen3_5_moe_text (Qwen3.5/3.6 MoE)", path,
                     x.prefix, json_string_value(mt));
        goto done;
    }

    if ((st = get_pos_int(&x, "hidden_size", &c->n_embd))) goto done;
    if ((st = get_pos_int(&x, "num_hidden_layers", &c->n_layer))) goto done;
    if ((st = get_pos_int(&x, "vocab_size", &c->n_vocab))) goto done;
    if ((st = get_pos_int(&x, "num_attention_heads", &c->n_head))) goto done;
    if ((st = get_pos_int(&x, "num_key_value_heads", &c->n_head_kv))) goto done;
    if ((st = get_pos_int(&x, "head_dim", &c->head_dim))) goto done;
    if ((st = get_pos_int(&x, "linear_num_key_heads", &c->gdn_n_k_head))) goto done;
    if ((st = get_pos_int(&x, "linear_num_value_heads", &c->gdn_n_v_head))) goto done;
    if ((st = get_pos_int(&x, "linear_key_head_dim", &c->gdn_k_dim))) goto done;
    if ((st = get_pos_int(&x, "linear_value_head_dim", &c->gdn_v_dim))) goto done;
    if ((st = get_pos_int(&x, "linear_conv_kernel_dim", &c->gdn_conv_k))) goto done;
    if ((st = get_pos_int(&x, "num_experts", &c->n_expert))) goto done;
    if ((st = get_pos_int(&x, "num_experts_per_tok", &c->n_expert_used))) goto done;
    if ((st = get_pos_int(&x, "moe_intermediate_size", &c->n_ff_expert))) goto done;
    if ((st = get_pos_int(&x, "shared_expert_intermediate_size", &c->n_ff_shared))) goto done;
    /* Defaults below are Qwen3_5MoeTextConfig's (HF-cfg) for keys a config may omit. */
    if ((st = get_opt_int(&x, "max_position_embeddings", 262144, &c->max_pos))) goto done;
    if ((st = get_opt_int(&x, "mtp_num_hidden_layers", 0, &c->mtp_n_layer))) goto done;
    double d;
    char name[96];
    snprintf(name, sizeof name, "%srms_norm_eps", x.prefix);
    if ((st = get_opt_num(&x, x.tc, "rms_norm_eps", name, 1e-6, &d, NULL))) goto done;
    c->rms_eps = (float)d;

    /* rope: rope_parameters (text config, then top level), then legacy top-level keys. */
    json_t *rp = json_object_get(x.tc, "rope_parameters");
    const char *rp_name = "rope_parameters";
    if (!rp) rp = json_object_get(x.tc, "rope_scaling");
    if (!rp && x.tc != root) {
        rp = json_object_get(root, "rope_parameters");
        x.prefix = "";
    }
    if (rp && !json_is_object(rp)) {
        st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: %s%s: expected an object", path, x.prefix,
                     rp_name);
        goto done;
    }
    const char *pre = tc ? "text_config." : "";
    int found = 0;
    snprintf(name, sizeof name, "%s%s.rope_theta", pre, rp_name);
    if ((st = get_opt_num(&x, rp, "rope_theta", name, 0, &d, &found))) goto done;
    if (!found) {
        snprintf(name, sizeof name, "%srope_theta", pre);
        if ((st = get_opt_num(&x, x.tc, "rope_theta", name, 0, &d, &found))) goto done;
    }
    if (!found) {
        st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: %srope_parameters.rope_theta: missing field",
                     path, pre);
        goto done;
    }
    c->rope_theta = (float)d;
    double prf;
    snprintf(name, sizeof name, "%s%s.partial_rotary_factor", pre, rp_name);
    if ((st = get_opt_num(&x, rp, "partial_rotary_factor", name, 0, &prf, &found))) goto done;
    if (!found) {
        snprintf(name, sizeof name, "%spartial_rotary_factor", pre);
        if ((st = get_opt_num(&x, x.tc, "partial_rotary_factor", name, 0.25, &prf, NULL)))
            goto done;
    }
    if (prf > 1.0) {
        st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: %spartial_rotary_factor: %g is above 1", path,
                     pre, prf);
        goto done;
    }
    c->n_rot = (int)lround(c->head_dim * prf);
    x.prefix = pre;

    /* tie_word_embeddings: text config first, then top level. */
    json_t *tie_obj = json_object_get(x.tc, "tie_word_embeddings") ? x.tc : root;
    if ((st = get_opt_bool(&x, tie_obj, "tie_word_embeddings", 0, &c->tie_embeddings))) goto done;

    /* layer kinds: explicit layer_types, else full_attention_interval. */
    if (c->n_layer > TL_MAX_LAYERS) {
        st = tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "%s: %snum_hidden_layers: %d is above %d",
                     path, pre, c->n_layer, TL_MAX_LAYERS);
        goto done;
    }
    json_t *lt = json_object_get(x.tc, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != c->n_layer) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT,
                         "%s: %slayer_types: expected a list of num_hidden_layers=%d strings", path,
                         pre, c->n_layer);
            goto done;
        }
        for (int i = 0; i < c->n_layer; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && !strcmp(s, "linear_attention"))
                c->layer_kind[i] = TL_LAYER_GDN;
            else if (s && !strcmp(s, "full_attention"))
                c->layer_kind[i] = TL_LAYER_ATTN;
            else {
                st = tl_errf(err, errlen, TL_ERR_FORMAT,
                             "%s: %slayer_types[%d]: expected \"linear_attention\" or "
                             "\"full_attention\"",
                             path, pre, i);
                goto done;
            }
        }
    } else {
        int every;
        if ((st = get_opt_int(&x, "full_attention_interval", TL_FULL_ATTN_EVERY, &every)))
            goto done;
        if (every <= 0) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT,
                         "%s: %sfull_attention_interval: expected a positive integer", path, pre);
            goto done;
        }
        for (int i = 0; i < c->n_layer; i++)
            c->layer_kind[i] = (i + 1) % every == 0 ? TL_LAYER_ATTN : TL_LAYER_GDN;
    }

    snprintf(name, sizeof name, "%seos_token_id", pre);
    if ((st = read_eos(c, json_object_get(x.tc, "eos_token_id"), path, name, err, errlen)))
        goto done;
    if (x.tc != root && (st = read_eos(c, json_object_get(root, "eos_token_id"), path,
                                       "eos_token_id", err, errlen)))
        goto done;
    if ((st = read_quant(c, &x))) goto done;
done:
    json_decref(root);
    return st;
}

int tl_config_load(tl_config *c, const char *path, char *err, size_t errlen) {
    char *text = NULL;
    int st = tl_read_file(path, &text, NULL, err, errlen);
    if (st) return st;
    st = tl_config_parse(c, text, path, err, errlen);
    free(text);
    if (st) return st;

    /* generation_config.json next to config.json: its eos_token_id list adds stop ids. */
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0;
    char *gpath = xmalloc(dl + 32);
    memcpy(gpath, path, dl);
    strcpy(gpath + dl, "generation_config.json");
    FILE *f = fopen(gpath, "rb");
    if (f) {
        fclose(f);
        if ((st = tl_read_file(gpath, &text, NULL, err, errlen))) goto done;
        json_error_t je;
        json_t *g = json_loads(text, 0, &je);
        free(text);
        if (!g || !json_is_object(g)) {
            st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: bad JSON at line %d: %s", gpath,
                         g ? 0 : je.line, g ? "expected an object" : je.text);
            json_decref(g);
            goto done;
        }
        st = read_eos(c, json_object_get(g, "eos_token_id"), gpath, "eos_token_id", err, errlen);
        json_decref(g);
    }
done:
    free(gpath);
    return st;
}

int tl_config_check(const tl_config *c, char *err, size_t errlen) {
#define POS(f, key)                                                                                \
    if (c->f <= 0)                                                                                 \
        return tl_errf(err, errlen, TL_ERR_FORMAT,                                                 \
                       "config.json: %s=%d: expected a positive value", key, c->f);
    POS(n_embd, "hidden_size")
    POS(n_layer, "num_hidden_layers")
    POS(n_vocab, "vocab_size")
    POS(n_head, "num_attention_heads")
    POS(n_head_kv, "num_key_value_heads")
    POS(head_dim, "head_dim")
    POS(gdn_n_k_head, "linear_num_key_heads")
    POS(gdn_n_v_head, "linear_num_value_heads")
    POS(gdn_k_dim, "linear_key_head_dim")
    POS(gdn_v_dim, "linear_value_head_dim")
    POS(gdn_conv_k, "linear_conv_kernel_dim")
    POS(n_expert, "num_experts")
    POS(n_expert_used, "num_experts_per_tok")
    POS(n_ff_expert, "moe_intermediate_size")
    POS(n_ff_shared, "shared_expert_intermediate_size")
#undef POS
    if (c->n_layer > TL_MAX_LAYERS)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "config.json: num_hidden_layers=%d is above the limit %d", c->n_layer,
                       TL_MAX_LAYERS);
    if (c->n_expert > 65536)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "config.json: num_experts=%d is above the limit 65536", c->n_expert);
    /* every matrix dimension the loader derives must fit an int (tl_mat rows/cols) */
    const struct {
        const char *what;
        int64_t v;
    } derived[] = {
        {"num_attention_heads*head_dim*2", (int64_t)c->n_head * c->head_dim * 2},
        {"num_key_value_heads*head_dim", (int64_t)c->n_head_kv * c->head_dim},
        {"2*linear_num_key_heads*linear_key_head_dim + "
         "linear_num_value_heads*linear_value_head_dim",
         2 * (int64_t)c->gdn_n_k_head * c->gdn_k_dim + (int64_t)c->gdn_n_v_head * c->gdn_v_dim},
        {"linear_conv_kernel_dim x conv channels",
         (2 * (int64_t)c->gdn_n_k_head * c->gdn_k_dim + (int64_t)c->gdn_n_v_head * c->gdn_v_dim) *
             c->gdn_conv_k},
        {"moe_intermediate_size*2", (int64_t)c->n_ff_expert * 2},
    };
    for (size_t i = 0; i < sizeof derived / sizeof derived[0]; i++)
        if (derived[i].v > INT32_MAX)
            return tl_errf(err, errlen, TL_ERR_FORMAT, "config.json: %s = %lld is too large",
                           derived[i].what, (long long)derived[i].v);
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
    for (int i = 0; i < c->n_layer; i++)
        if (c->layer_kind[i] != TL_LAYER_GDN && c->layer_kind[i] != TL_LAYER_ATTN)
            return tl_errf(err, errlen, TL_ERR_FORMAT, "config.json: layer_types[%d]: bad kind", i);
    if (c->quant_bits) {
        if (c->quant_bits != 4 && c->quant_bits != 8)
            return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                           "config.json: quantization.bits=%d: expected 4 or 8", c->quant_bits);
        if (c->quant_group <= 0)
            return tl_errf(err, errlen, TL_ERR_FORMAT,
                           "config.json: quantization.group_size=%d: expected a positive value",
                           c->quant_group);
    }
    return TL_OK;
}

int tl_config_check_production(const tl_config *c, char *err, size_t errlen) {
    static const char hint[] = "is this the Qwen3.6-35B-A3B checkpoint?";
#define EQ(f, key, want)                                                                           \
    if (c->f != (want))                                                                            \
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,                                            \
                       "config.json has %s=%d, this engine is built for %d: %s", key, c->f,        \
                       (int)(want), hint);
    EQ(n_embd, "hidden_size", TL_N_EMBD)
    EQ(n_layer, "num_hidden_layers", TL_N_LAYER)
    EQ(n_vocab, "vocab_size", TL_N_VOCAB)
    EQ(n_head, "num_attention_heads", TL_N_HEAD)
    EQ(n_head_kv, "num_key_value_heads", TL_N_HEAD_KV)
    EQ(head_dim, "head_dim", TL_HEAD_DIM)
    EQ(n_rot, "head_dim*partial_rotary_factor", TL_N_ROT)
    EQ(gdn_n_k_head, "linear_num_key_heads", TL_GDN_N_K_HEAD)
    EQ(gdn_n_v_head, "linear_num_value_heads", TL_GDN_N_V_HEAD)
    EQ(gdn_k_dim, "linear_key_head_dim", TL_GDN_K_DIM)
    EQ(gdn_v_dim, "linear_value_head_dim", TL_GDN_V_DIM)
    EQ(gdn_conv_k, "linear_conv_kernel_dim", TL_GDN_CONV_K)
    EQ(n_expert, "num_experts", TL_N_EXPERT)
    EQ(n_expert_used, "num_experts_per_tok", TL_N_EXPERT_USED)
    EQ(n_ff_expert, "moe_intermediate_size", TL_N_FF_EXPERT)
    EQ(n_ff_shared, "shared_expert_intermediate_size", TL_N_FF_SHARED)
#undef EQ
    if (fabsf(c->rope_theta - TL_ROPE_THETA) > 1e-3f * TL_ROPE_THETA)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "config.json has rope_theta=%g, this engine is built for %g: %s",
                       (double)c->rope_theta, (double)TL_ROPE_THETA, hint);
    if (fabsf(c->rms_eps - TL_RMS_EPS) > 1e-3f * TL_RMS_EPS)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "config.json has rms_norm_eps=%g, this engine is built for %g: %s",
                       (double)c->rms_eps, (double)TL_RMS_EPS, hint);
    for (int i = 0; i < c->n_layer; i++) {
        tl_layer_kind want = (i + 1) % TL_FULL_ATTN_EVERY == 0 ? TL_LAYER_ATTN : TL_LAYER_GDN;
        if (c->layer_kind[i] != want)
            return tl_errf(
                err, errlen, TL_ERR_UNSUPPORTED,
                "config.json has layer_types[%d]=%s, this engine is built for %s "
                "(full attention every %d layers): %s",
                i, c->layer_kind[i] == TL_LAYER_ATTN ? "full_attention" : "linear_attention",
                want == TL_LAYER_ATTN ? "full_attention" : "linear_attention", TL_FULL_ATTN_EVERY,
                hint);
    }
    return TL_OK;
}

void tl_config_set_production(tl_config *c) {
    memset(c, 0, sizeof *c);
    c->n_embd = TL_N_EMBD, c->n_layer = TL_N_LAYER, c->n_vocab = TL_N_VOCAB;
    c->n_head = TL_N_HEAD, c->n_head_kv = TL_N_HEAD_KV, c->head_dim = TL_HEAD_DIM;
    c->n_rot = TL_N_ROT, c->rope_theta = TL_ROPE_THETA;
    c->gdn_n_k_head = TL_GDN_N_K_HEAD, c->gdn_n_v_head = TL_GDN_N_V_HEAD;
    c->gdn_k_dim = TL_GDN_K_DIM, c->gdn_v_dim = TL_GDN_V_DIM, c->gdn_conv_k = TL_GDN_CONV_K;
    c->n_expert = TL_N_EXPERT, c->n_expert_used = TL_N_EXPERT_USED;
    c->n_ff_expert = TL_N_FF_EXPERT, c->n_ff_shared = TL_N_FF_SHARED;
    c->rms_eps = TL_RMS_EPS, c->max_pos = TL_MAX_POS;
    c->eos_ids[0] = 248046, c->eos_ids[1] = 248044, c->n_eos = 2;
    for (int il = 0; il < c->n_layer; il++)
        c->layer_kind[il] = (il + 1) % TL_FULL_ATTN_EVERY == 0 ? TL_LAYER_ATTN : TL_LAYER_GDN;
}
