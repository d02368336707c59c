/* Checkpoint directory -> tl_model: config, the tensor directory over every safetensors file,
 * and the per-layer views of weights.h.
 *
 * Formats (docs/model.md §2, §5.1, §5.3), told apart by the tensor names:
 *   HF   "model.language_model.*" (or "model.*" of a text-only export), "lm_head.weight";
 *        norms zero-centred (we add 1); experts fused 3-D "mlp.experts.gate_up_proj"
 *        [E, 2*ff, embd] (gate rows first) and "mlp.experts.down_proj" [E, embd, ff], or
 *        per-expert "mlp.experts.{e}.{gate,up,down}_proj.weight"; conv1d [C, 1, K].
 *   MLX  "language_model.model.*", "language_model.lm_head"; norms already offset; experts
 *        stacked "mlp.switch_mlp.{gate,up,down}_proj" [E, out, in]; conv1d [C, K, 1]; any
 *        linear may be affine-quantized (U32 weight + scales + biases; bits and group are read
 *        from the shapes and cross-checked with config.json "quantization").
 * "model.visual.*" / "vision_tower.*" are left out of the directory; "mtp.*" stays addressable.
 *
 * Matrices stay in the mapping; 1-D vectors become f32 with the storage convention removed. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "common/status.h"
#include "common/util.h"
#include "model/st.h"
#include "model/weights.h"
#include "model/weights_priv.h"

/* ---- directory: hash of names ---- */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int dir_find(const tl_model_priv *p, const tl_tensor *ts, const char *name) {
    if (!p->hcap) return -1;
    for (size_t i = hash_str(name) & (p->hcap - 1);; i = (i + 1) & (p->hcap - 1)) {
        int k = p->hash[i];
        if (k < 0) return -1;
        if (!strcmp(ts[k].name, name)) return k;
    }
}

const tl_tensor *tl_model_find(const tl_model *m, const char *name) {
    int k = dir_find(m->priv, m->tensors, name);
    return k < 0 ? NULL : &m->tensors[k];
}

const char *tl_model_tensor_file(const tl_model *m, const tl_tensor *t) {
    const tl_model_priv *p = m->priv;
    return p->files[p->tfile[t - m->tensors]].path;
}

static void *keep(tl_model_priv *p, void *ptr) {
    if (p->n_allocs == p->cap_allocs) {
        p->cap_allocs = p->cap_allocs ? 2 * p->cap_allocs : 64;
        p->allocs = xrealloc(p->allocs, p->cap_allocs * sizeof *p->allocs);
    }
    p->allocs[p->n_allocs++] = ptr;
    return ptr;
}

static int skipped_name(const char *n) {
    return !strncmp(n, "model.visual.", 13) || !strncmp(n, "vision_tower.", 13) ||
           !strncmp(n, "visual.", 7);
}

/* Adds every file's tensors to the directory; a name in two files is an error. */
static int build_directory(tl_model *m, char *err, size_t errlen) {
    tl_model_priv *p = m->priv;
    size_t total = 0;
    for (int f = 0; f < p->n_files; f++) total += (size_t)p->files[f].n_tensors;
    m->tensors = xcalloc(total ? total : 1, sizeof *m->tensors);
    p->tfile = xcalloc(total ? total : 1, sizeof *p->tfile);
    p->hcap = 16;
    while (p->hcap < 2 * total) p->hcap *= 2;
    p->hash = xmalloc(p->hcap * sizeof *p->hash);
    for (size_t i = 0; i < p->hcap; i++) p->hash[i] = -1;
    int n = 0;
    for (int f = 0; f < p->n_files; f++) {
        for (int i = 0; i < p->files[f].n_tensors; i++) {
            const tl_tensor *t = &p->files[f].tensors[i];
            if (skipped_name(t->name)) {
                p->n_skipped++;
                p->skipped_bytes += t->nbytes;
                continue;
            }
            size_t h = hash_str(t->name) & (p->hcap - 1);
            while (p->hash[h] >= 0) {
                if (!strcmp(m->tensors[p->hash[h]].name, t->name))
                    return tl_errf(err, errlen, TL_ERR_FORMAT, "tensor '%s' is in both %s and %s",
                                   t->name, p->files[p->tfile[p->hash[h]]].path, p->files[f].path);
                h = (h + 1) & (p->hcap - 1);
            }
            p->hash[h] = n;
            m->tensors[n] = *t;
            p->tfile[n] = f;
            n++;
        }
    }
    m->n_tensors = n;
    return TL_OK;
}

/* ---- files: index.json or a single model.safetensors (st.c) ---- */

static int open_files(tl_model *m, const char *dir, char *err, size_t errlen) {
    tl_model_priv *p = m->priv;
    tl_st_set set;
    int st = tl_st_set_open(&set, dir, err, errlen);
    p->files = set.files;
    p->n_files = set.n_files;
    p->index_path = set.index_path;
    return st;
}

/* ---- binding ---- */

typedef struct bind_ctx {
    tl_model *m;
    tl_model_priv *p;
    const char *pre;    /* "model.language_model.", "model." or "language_model.model." */
    const char *lmhead; /* full name of the lm_head weight */
    char *err;
    size_t errlen;
    double norm_sum; /* sum of raw RMSNorm1p weights checked by the offset heuristic */
    size_t norm_n;
} bind_ctx;

static const char *fmt_name(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static const char *fmt_name(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return buf;
}

static const char *tfile(bind_ctx *b, const tl_tensor *t) { return tl_model_tensor_file(b->m, t); }

static void shape_str(char *buf, size_t n, const int64_t *shape, int ndim) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int d = 0; d < ndim && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static int is_float(tl_dtype t) { return t == TL_DT_F32 || t == TL_DT_F16 || t == TL_DT_BF16; }

static int missing(bind_ctx *b, const char *name) {
    return tl_errf(b->err, b->errlen, TL_ERR_FORMAT, "%s: tensor '%s' is missing",
                   b->p->index_path ? b->p->index_path : b->p->files[0].path, name);
}

/* Checks t has exactly the given shape. */
static int want_shape(bind_ctx *b, const tl_tensor *t, int ndim, const int64_t *shape,
                      const char *why) {
    int ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->shape[d] == shape[d];
    if (ok) return TL_OK;
    char got[96], want[96];
    shape_str(got, sizeof got, t->shape, t->ndim);
    shape_str(want, sizeof want, shape, ndim);
    return tl_errf(b->err, b->errlen, TL_ERR_FORMAT, "%s: tensor '%s': shape %s, expected %s%s%s",
                   tfile(b, t), t->name, got, want, why ? " " : "", why ? why : "");
}

static int want_float(bind_ctx *b, const tl_tensor *t) {
    if (is_float(t->dtype)) return TL_OK;
    return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                   "%s: tensor '%s': dtype %s, expected BF16, F16 or F32", tfile(b, t), t->name,
                   tl_dtype_name(t->dtype));
}

/* Binds E stacked matrices of `rows` rows starting at row0 of a tensor of `total` rows per
 * slice (E = 0: a plain 2-D matrix, one view). module is the name without ".weight"; when
 * plain is set the tensor name is module itself (HF fused experts have no ".weight"). */
static int bind_stack(bind_ctx *b, const char *module, int plain, int E, int total, int row0,
                      int rows, int cols, tl_mat *views) {
    char name[512];
    const tl_tensor *w =
        tl_model_find(b->m, plain ? module : fmt_name(name, sizeof name, "%s.weight", module));
    if (!w) return missing(b, plain ? module : name);
    int nd = E ? 3 : 2, nv = E ? E : 1;
    int64_t shape[3];
    int i = 0;
    if (E) shape[i++] = E;
    shape[i++] = total;
    if (w->dtype == TL_DT_U32 && !plain) {
        /* affine-quantized: bits from the packed width, group from the scales' width */
        const tl_tensor *s = tl_model_find(b->m, fmt_name(name, sizeof name, "%s.scales", module));
        if (!s) return missing(b, name);
        const tl_tensor *bi = tl_model_find(b->m, fmt_name(name, sizeof name, "%s.biases", module));
        if (!bi) return missing(b, name);
        if (!b->m->cfg.quant_bits)
            return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                           "%s: tensor '%s' is quantized (U32) but config.json has no "
                           "\"quantization\"",
                           tfile(b, w), w->name);
        /* a per-module entry in config.json "quantization" must agree with the shapes */
        json_t *ov = b->p->quant_json ? json_object_get(b->p->quant_json, module) : NULL;
        if (ov && json_is_false(ov))
            return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                           "%s: tensor '%s' is quantized but config.json quantization['%s'] is "
                           "false",
                           tfile(b, w), w->name, module);
        int want_bits = 0, want_group = 0;
        if (ov && json_is_object(ov)) {
            want_bits = (int)json_integer_value(json_object_get(ov, "bits"));
            want_group = (int)json_integer_value(json_object_get(ov, "group_size"));
        }
        int64_t packed = w->ndim == nd ? w->shape[nd - 1] : 0;
        int bits = packed > 0 && (packed * 32) % cols == 0 ? (int)(packed * 32 / cols) : 0;
        if (bits != 4 && bits != 8) {
            char got[96];
            shape_str(got, sizeof got, w->shape, w->ndim);
            return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                           "%s: tensor '%s': shape %s does not pack %d columns at 4 or 8 bits",
                           tfile(b, w), w->name, got, cols);
        }
        if (want_bits && want_bits != bits)
            return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                           "%s: tensor '%s' packs %d-bit values but config.json "
                           "quantization['%s'].bits is %d",
                           tfile(b, w), w->name, bits, module, want_bits);
        shape[i] = (int64_t)cols * bits / 32;
        int st = want_shape(b, w, nd, shape, NULL);
        if (st) return st;
        int64_t ng = s->ndim == nd ? s->shape[nd - 1] : 0;
        if (ng <= 0 || cols % ng || (cols / ng) % (32 / bits)) {
            char got[96];
            shape_str(got, sizeof got, s->shape, s->ndim);
            return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                           "%s: tensor '%s': shape %s does not give a group size dividing %d",
                           tfile(b, s), s->name, got, cols);
        }
        shape[i] = ng;
        if ((st = want_shape(b, s, nd, shape, NULL)) || (st = want_shape(b, bi, nd, shape, NULL)))
            return st;
        if (want_group && want_group != cols / ng)
            return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                           "%s: tensor '%s' has groups of %lld but config.json "
                           "quantization['%s'].group_size is %d",
                           tfile(b, s), s->name, (long long)(cols / ng), module, want_group);
        if ((st = want_float(b, s)) || (st = want_float(b, bi))) return st;
        if (bi->dtype != s->dtype)
            return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                           "%s: tensor '%s': dtype %s differs from its scales' %s", tfile(b, bi),
                           bi->name, tl_dtype_name(bi->dtype), tl_dtype_name(s->dtype));
        size_t wrow = (size_t)shape_w_row(cols, bits), srow = (size_t)ng * tl_dtype_size(s->dtype);
        for (int e = 0; e < nv; e++) {
            size_t r = (size_t)e * (size_t)total + (size_t)row0;
            views[e] = (tl_mat){
                .w = (const uint8_t *)w->data + r * wrow,
                .scales = (const uint8_t *)s->data + r * srow,
                .biases = (const uint8_t *)bi->data + r * srow,
                .wtype = TL_DT_U32,
                .stype = s->dtype,
                .bits = bits,
                .group = (int)(cols / ng),
                .rows = rows,
                .cols = cols,
            };
        }
        return TL_OK;
    }
    shape[i] = cols;
    int st = want_shape(b, w, nd, shape, NULL);
    if (st || (st = want_float(b, w))) return st;
    size_t es = tl_dtype_size(w->dtype);
    for (int e = 0; e < nv; e++) {
        size_t r = (size_t)e * (size_t)total + (size_t)row0;
        views[e] = (tl_mat){
            .w = (const uint8_t *)w->data + r * (size_t)cols * es,
            .wtype = w->dtype,
            .rows = rows,
            .cols = cols,
        };
    }
    return TL_OK;
}

static int bind_mat(bind_ctx *b, const char *module, int rows, int cols, tl_mat *out) {
    return bind_stack(b, module, 0, 0, rows, 0, rows, cols, out);
}

enum vec_kind {
    VEC_PLAIN,  /* as stored */
    VEC_NORM1P, /* RMSNorm1p weight: +1 for HF, as stored for MLX */
    VEC_ALOG,   /* A_log -> -exp(A_log) */
};

/* A 1-D float tensor of n values -> f32 (kept in priv). count: include in the offset check. */
static int bind_vec(bind_ctx *b, const char *name, int n, enum vec_kind kind, int count,
                    float **out) {
    const tl_tensor *t = tl_model_find(b->m, name);
    if (!t) return missing(b, name);
    int64_t shape[1] = {n};
    int st = want_shape(b, t, 1, shape, NULL);
    if (st || (st = want_float(b, t))) return st;
    float *v = keep(b->p, xmalloc((size_t)n * sizeof *v));
    for (int i = 0; i < n; i++) {
        float x = tl_load_elem(t->data, t->dtype, (size_t)i);
        if (count) {
            b->norm_sum += x;
            b->norm_n++;
        }
        if (kind == VEC_NORM1P && b->m->format == TL_CKPT_HF) x += 1.0f;
        if (kind == VEC_ALOG) x = -expf(x);
        v[i] = x;
    }
    *out = v;
    return TL_OK;
}

/* conv1d.weight: HF [C, 1, K], MLX [C, K, 1], or squeezed [C, K]: all the same bytes. */
static int bind_conv(bind_ctx *b, const char *name, int C, int K, float **out) {
    const tl_tensor *t = tl_model_find(b->m, name);
    if (!t) return missing(b, name);
    int64_t hf[3] = {C, 1, K}, mlx[3] = {C, K, 1}, sq[2] = {C, K};
    int st;
    if (t->ndim == 2)
        st = want_shape(b, t, 2, sq, NULL);
    else if (t->ndim == 3 && t->shape[1] == 1 && K != 1)
        st = want_shape(b, t, 3, hf, NULL);
    else
        st = want_shape(b, t, 3, b->m->format == TL_CKPT_MLX ? mlx : hf,
                        b->m->format == TL_CKPT_MLX ? "(MLX stores [C, K, 1])"
                                                    : "(HF stores [C, 1, K])");
    if (st || (st = want_float(b, t))) return st;
    float *v = keep(b->p, xmalloc((size_t)C * (size_t)K * sizeof *v));
    for (size_t i = 0; i < (size_t)C * (size_t)K; i++) v[i] = tl_load_elem(t->data, t->dtype, i);
    *out = v;
    return TL_OK;
}

static int bind_experts(bind_ctx *b, int il, tl_layer *L) {
    const tl_config *c = &b->m->cfg;
    char name[512], mod[512];
    int E = c->n_expert, ff = c->n_ff_expert, d = c->n_embd, st;
    L->exp_gate = keep(b->p, xcalloc((size_t)E, sizeof(tl_mat)));
    L->exp_up = keep(b->p, xcalloc((size_t)E, sizeof(tl_mat)));
    L->exp_down = keep(b->p, xcalloc((size_t)E, sizeof(tl_mat)));
    const char *pre = b->pre;
    fmt_name(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj", pre, il);
    if (tl_model_find(b->m, name)) { /* HF fused: [E, 2ff, d], gate rows first */
        if ((st = bind_stack(b, name, 1, E, 2 * ff, 0, ff, d, L->exp_gate)) ||
            (st = bind_stack(b, name, 1, E, 2 * ff, ff, ff, d, L->exp_up)))
            return st;
        fmt_name(name, sizeof name, "%slayers.%d.mlp.experts.down_proj", pre, il);
        return bind_stack(b, name, 1, E, d, 0, d, ff, L->exp_down);
    }
    fmt_name(name, sizeof name, "%slayers.%d.mlp.switch_mlp.gate_proj.weight", pre, il);
    if (tl_model_find(b->m, name)) { /* MLX stacked: [E, ff, d] each */
        fmt_name(mod, sizeof mod, "%slayers.%d.mlp.switch_mlp.gate_proj", pre, il);
        if ((st = bind_stack(b, mod, 0, E, ff, 0, ff, d, L->exp_gate))) return st;
        fmt_name(mod, sizeof mod, "%slayers.%d.mlp.switch_mlp.up_proj", pre, il);
        if ((st = bind_stack(b, mod, 0, E, ff, 0, ff, d, L->exp_up))) return st;
        fmt_name(mod, sizeof mod, "%slayers.%d.mlp.switch_mlp.down_proj", pre, il);
        return bind_stack(b, mod, 0, E, d, 0, d, ff, L->exp_down);
    }
    fmt_name(name, sizeof name, "%slayers.%d.mlp.experts.0.gate_proj.weight", pre, il);
    if (tl_model_find(b->m, name)) { /* per-expert 2-D tensors */
        for (int e = 0; e < E; e++) {
            fmt_name(mod, sizeof mod, "%slayers.%d.mlp.experts.%d.gate_proj", pre, il, e);
            if ((st = bind_mat(b, mod, ff, d, &L->exp_gate[e]))) return st;
            fmt_name(mod, sizeof mod, "%slayers.%d.mlp.experts.%d.up_proj", pre, il, e);
            if ((st = bind_mat(b, mod, ff, d, &L->exp_up[e]))) return st;
            fmt_name(mod, sizeof mod, "%slayers.%d.mlp.experts.%d.down_proj", pre, il, e);
            if ((st = bind_mat(b, mod, d, ff, &L->exp_down[e]))) return st;
        }
        return TL_OK;
    }
    return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                   "%s: tensor '%slayers.%d.mlp.experts.gate_up_proj' is missing (nor are there "
                   "per-expert mlp.experts.{e}.gate_proj.weight or mlp.switch_mlp.* tensors)",
                   b->p->index_path ? b->p->index_path : b->p->files[0].path, pre, il);
}

static int bind_layer(bind_ctx *b, int il) {
    const tl_config *c = &b->m->cfg;
    tl_layer *L = &b->m->layers[il];
    char n[512];
    const char *pre = b->pre;
    int d = c->n_embd, st;
    L->kind = c->layer_kind[il];
#define MOD(fmt) fmt_name(n, sizeof n, "%slayers.%d." fmt, pre, il)
    if ((st = bind_vec(b, MOD("input_layernorm.weight"), d, VEC_NORM1P, 1, &L->attn_norm)) ||
        (st = bind_vec(b, MOD("post_attention_layernorm.weight"), d, VEC_NORM1P, 1, &L->ffn_norm)))
        return st;
    if (L->kind == TL_LAYER_ATTN) {
        int hd = c->head_dim;
        if ((st = bind_mat(b, MOD("self_attn.q_proj"), c->n_head * hd * 2, d, &L->attn_q)) ||
            (st = bind_mat(b, MOD("self_attn.k_proj"), c->n_head_kv * hd, d, &L->attn_k)) ||
            (st = bind_mat(b, MOD("self_attn.v_proj"), c->n_head_kv * hd, d, &L->attn_v)) ||
            (st = bind_mat(b, MOD("self_attn.o_proj"), d, c->n_head * hd, &L->attn_o)) ||
            (st =
                 bind_vec(b, MOD("self_attn.q_norm.weight"), hd, VEC_NORM1P, 0, &L->attn_q_norm)) ||
            (st = bind_vec(b, MOD("self_attn.k_norm.weight"), hd, VEC_NORM1P, 0, &L->attn_k_norm)))
            return st;
    } else {
        int conv = tl_config_gdn_conv_dim(c), vd = tl_config_gdn_val_dim(c), nv = c->gdn_n_v_head;
        if ((st = bind_mat(b, MOD("linear_attn.in_proj_qkv"), conv, d, &L->gdn_qkv)) ||
            (st = bind_mat(b, MOD("linear_attn.in_proj_z"), vd, d, &L->gdn_z)) ||
            (st = bind_mat(b, MOD("linear_attn.in_proj_b"), nv, d, &L->gdn_b)) ||
            (st = bind_mat(b, MOD("linear_attn.in_proj_a"), nv, d, &L->gdn_a)) ||
            (st = bind_conv(b, MOD("linear_attn.conv1d.weight"), conv, c->gdn_conv_k,
                            &L->gdn_conv)) ||
            (st = bind_vec(b, MOD("linear_attn.dt_bias"), nv, VEC_PLAIN, 0, &L->gdn_dt_bias)) ||
            (st = bind_vec(b, MOD("linear_attn.A_log"), nv, VEC_ALOG, 0, &L->gdn_a_neg)) ||
            (st = bind_vec(b, MOD("linear_attn.norm.weight"), c->gdn_v_dim, VEC_PLAIN, 0,
                           &L->gdn_norm)) ||
            (st = bind_mat(b, MOD("linear_attn.out_proj"), d, vd, &L->gdn_out)))
            return st;
    }
    int fs = c->n_ff_shared;
    if ((st = bind_mat(b, MOD("mlp.gate"), c->n_expert, d, &L->moe_router)) ||
        (st = bind_mat(b, MOD("mlp.shared_expert.gate_proj"), fs, d, &L->sh_gate)) ||
        (st = bind_mat(b, MOD("mlp.shared_expert.up_proj"), fs, d, &L->sh_up)) ||
        (st = bind_mat(b, MOD("mlp.shared_expert.down_proj"), d, fs, &L->sh_down)) ||
        (st = bind_mat(b, MOD("mlp.shared_expert_gate"), 1, d, &L->sh_gate_inp)))
        return st;
#undef MOD
    return bind_experts(b, il, L);
}

static int bind_model(tl_model *m, char *err, size_t errlen) {
    bind_ctx b = {.m = m, .p = m->priv, .err = err, .errlen = errlen};
    const tl_config *c = &m->cfg;
    char n[512];
    static const struct {
        const char *pre, *lmhead;
        tl_ckpt_format fmt;
    } layouts[] = {
        {"model.language_model.", "lm_head", TL_CKPT_HF},
        {"language_model.model.", "language_model.lm_head", TL_CKPT_MLX},
        {"model.", "lm_head", TL_CKPT_HF},
    };
    int li = -1;
    for (int i = 0; i < 3 && li < 0; i++)
        if (tl_model_find(m, fmt_name(n, sizeof n, "%sembed_tokens.weight", layouts[i].pre)))
            li = i;
    if (li < 0)
        return tl_errf(
            err, errlen, TL_ERR_FORMAT,
            "%s: tensor 'model.language_model.embed_tokens.weight' is missing (also "
            "looked for 'model.embed_tokens.weight', 'language_model.model.embed_tokens.weight')",
            b.p->index_path ? b.p->index_path : b.p->files[0].path);
    b.pre = layouts[li].pre;
    b.lmhead = layouts[li].lmhead;
    m->format = layouts[li].fmt;
    /* an MLX conversion of a text-only export keeps "model." but stacks experts as switch_mlp */
    if (m->format == TL_CKPT_HF &&
        tl_model_find(m,
                      fmt_name(n, sizeof n, "%slayers.0.mlp.switch_mlp.gate_proj.weight", b.pre)))
        m->format = TL_CKPT_MLX;
    snprintf(b.p->prefix, sizeof b.p->prefix, "%s", b.pre);

    int st;
    if ((st = bind_mat(&b, fmt_name(n, sizeof n, "%sembed_tokens", b.pre), c->n_vocab, c->n_embd,
                       &m->tok_embd)))
        return st;
    if ((st = bind_vec(&b, fmt_name(n, sizeof n, "%snorm.weight", b.pre), c->n_embd, VEC_NORM1P, 1,
                       &m->out_norm)))
        return st;
    if (tl_model_find(m, fmt_name(n, sizeof n, "%s.weight", b.lmhead)) || !c->tie_embeddings) {
        if ((st = bind_mat(&b, b.lmhead, c->n_vocab, c->n_embd, &m->output))) return st;
    } else {
        m->output = m->tok_embd;
    }
    for (int il = 0; il < c->n_layer; il++)
        if ((st = bind_layer(&b, il))) return st;

    /* Norm storage check (docs/model.md §2.1): zero-centred weights average near 0, offset ones
     * near
     * 1. A wrong convention would silently scale every activation, so refuse it. The midpoints
     * assume the trained weights' mean is within 0.5 of the convention's centre; that was not
     * measurable here (no real weights), so TL_NORM_CHECK=0 skips the check and the message
     * says so. */
    double mean = b.norm_n ? b.norm_sum / (double)b.norm_n : 0;
    b.p->norm_mean = mean;
    const char *skip = getenv("TL_NORM_CHECK");
    if (skip && !strcmp(skip, "0")) return TL_OK;
    if (m->format == TL_CKPT_HF && mean >= 0.5)
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "%s: RMSNorm weights (input_layernorm, post_attention_layernorm, norm) "
                       "average %.3f: HF checkpoints store them zero-centred (near 0); this file "
                       "looks already offset (+1), i.e. converted with HF names (TL_NORM_CHECK=0 "
                       "loads it anyway)",
                       b.p->files[0].path, mean);
    if (m->format == TL_CKPT_MLX && (mean < 0.5 || mean >= 1.5))
        return tl_errf(err, errlen, TL_ERR_FORMAT,
                       "%s: RMSNorm weights (input_layernorm, post_attention_layernorm, norm) "
                       "average %.3f: MLX checkpoints store them offset (near 1); %s "
                       "(TL_NORM_CHECK=0 loads it anyway)",
                       b.p->files[0].path, mean,
                       mean < 0.5 ? "this file looks zero-centred (the +1 is missing)"
                                  : "this file looks offset twice (+2)");
    return TL_OK;
}

int tl_model_open(tl_model **out, const char *dir, char *err, size_t errlen) {
    *out = NULL;
    tl_model *m = xcalloc(1, sizeof *m);
    tl_model_priv *p = xcalloc(1, sizeof *p);
    m->priv = p;
    p->dir = xstrdup(dir);
    char *cpath = tl_path_join(dir, "config.json");
    int st = tl_config_load(&m->cfg, cpath, err, errlen);
    if (!st && m->cfg.quant_bits) {
        json_t *root = json_load_file(cpath, 0, NULL);
        json_t *q = root ? json_object_get(root, "quantization") : NULL;
        if (!q && root) q = json_object_get(root, "quantization_config");
        if (json_is_object(q)) p->quant_json = json_incref(q);
        json_decref(root);
    }
    free(cpath);
    if (st || (st = tl_config_check(&m->cfg, err, errlen)) ||
        (st = open_files(m, dir, err, errlen)) || (st = build_directory(m, err, errlen)) ||
        (st = bind_model(m, err, errlen))) {
        tl_model_close(m);
        return st;
    }
    *out = m;
    return TL_OK;
}

void tl_model_close(tl_model *m) {
    if (!m) return;
    tl_model_priv *p = m->priv;
    if (p) {
        for (int f = 0; f < p->n_files; f++) tl_st_close(&p->files[f]);
        free(p->files);
        for (size_t i = 0; i < p->n_allocs; i++) free(p->allocs[i]);
        free(p->allocs);
        free(p->hash);
        free(p->tfile);
        free(p->dir);
        free(p->index_path);
        json_decref(p->quant_json);
        free(p);
    }
    free(m->tensors);
    free(m);
}
