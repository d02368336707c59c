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
 * "model.visual.*" / "vision_tower.*" are left out of the directory. "mtp.*" (the MTP head,
 * docs/model.md §3) is bound into m->mtp when its layer is there, in either format: the same
 * names, the same conventions as the trunk (MLX: offset norms, switch_mlp experts, quantized
 * linears), experts fused or per expert; it may sit in its own shard.
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
    char name[512]; /* layer_name's result */
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

/* The checkpoint as messages name it: its index.json, or its one safetensors file. */
static const char *ckpt_path(const bind_ctx *b) {
    return b->p->index_path ? b->p->index_path : b->p->files[0].path;
}

static int missing(bind_ctx *b, const char *name) {
    return tl_errf(b->err, b->errlen, TL_ERR_FORMAT, "%s: tensor '%s' is missing", ckpt_path(b),
                   name);
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

/* What one bind_stack call binds: E stacked slices (E = 0: one plain matrix) of `total` rows,
 * of which rows row0 .. row0 + rows - 1 of each slice, `cols` columns wide. shape is the shape
 * the tensors must have: [E,] total, and a last dimension each check fills in. */
typedef struct stack_req {
    const char *module;
    int E, total, row0, rows, cols;
    int nd;           /* 3 when stacked, 2 when plain */
    int64_t shape[3]; /* shape[nd - 1] set per tensor */
} stack_req;

/* Number of views, and the first row of view e in its tensor. */
static int stack_views(const stack_req *r) { return r->E ? r->E : 1; }
static size_t stack_row(const stack_req *r, int e) {
    return (size_t)e * (size_t)r->total + (size_t)r->row0;
}

/* A float (BF16, F16 or F32) tensor [E,] total, cols. */
static int bind_stack_float(bind_ctx *b, stack_req *r, const tl_tensor *w, tl_mat *views) {
    r->shape[r->nd - 1] = r->cols;
    int st = want_shape(b, w, r->nd, r->shape, NULL);
    if (st || (st = want_float(b, w))) return st;
    size_t es = tl_dtype_size(w->dtype);
    for (int e = 0; e < stack_views(r); e++) {
        views[e] = (tl_mat){
            .w = (const uint8_t *)w->data + stack_row(r, e) * (size_t)r->cols * es,
            .wtype = w->dtype,
            .rows = r->rows,
            .cols = r->cols,
        };
    }
    return TL_OK;
}

/* t's last dimension does not fit cols: "<file>: tensor '<name>': shape [...] " + how (a format
 * with one %d, given cols). */
static int bad_width(bind_ctx *b, const tl_tensor *t, const char *how, int cols)
    __attribute__((format(printf, 3, 0)));
static int bad_width(bind_ctx *b, const tl_tensor *t, const char *how, int cols) {
    char got[96], what[128];
    shape_str(got, sizeof got, t->shape, t->ndim);
    snprintf(what, sizeof what, how, cols);
    return tl_errf(b->err, b->errlen, TL_ERR_FORMAT, "%s: tensor '%s': shape %s %s", tfile(b, t),
                   t->name, got, what);
}

/* config.json's word on a quantized module: "quantization" must be there, and a per-module
 * entry must not be false; *bits and *group get what an entry {"bits", "group_size"} asks for
 * (0: no entry). */
static int quant_config(bind_ctx *b, const char *module, const tl_tensor *w, int *bits,
                        int *group) {
    *bits = *group = 0;
    if (!b->m->cfg.quant_bits)
        return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                       "%s: tensor '%s' is quantized (U32) but config.json has no "
                       "\"quantization\"",
                       tfile(b, w), w->name);
    json_t *ov = b->p->quant_json ? json_object_get(b->p->quant_json, module) : NULL;
    if (ov && json_is_false(ov))
        return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                       "%s: tensor '%s' is quantized but config.json quantization['%s'] is "
                       "false",
                       tfile(b, w), w->name, module);
    if (ov && json_is_object(ov)) {
        *bits = (int)json_integer_value(json_object_get(ov, "bits"));
        *group = (int)json_integer_value(json_object_get(ov, "group_size"));
    }
    return TL_OK;
}

/* Bits per value from the packed width of w (U32 words per row), which must be 4 or 8, agree
 * with config.json (want_bits, 0: any) and give w's whole shape. */
static int quant_bits(bind_ctx *b, stack_req *r, const tl_tensor *w, int want_bits, int *out) {
    int nd = r->nd, cols = r->cols;
    int64_t packed = w->ndim == nd ? w->shape[nd - 1] : 0;
    int bits = packed > 0 && (packed * 32) % cols == 0 ? (int)(packed * 32 / cols) : 0;
    if (bits != 4 && bits != 8)
        return bad_width(b, w, "does not pack %d columns at 4 or 8 bits", cols);
    if (want_bits && want_bits != bits)
        return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                       "%s: tensor '%s' packs %d-bit values but config.json "
                       "quantization['%s'].bits is %d",
                       tfile(b, w), w->name, bits, r->module, want_bits);
    r->shape[nd - 1] = (int64_t)cols * bits / 32;
    *out = bits;
    return want_shape(b, w, nd, r->shape, NULL);
}

/* Groups per row from the scales' width: they must divide cols into groups of whole U32 words,
 * agree with config.json (want_group, 0: any), and scales and biases must have one shape and
 * one float dtype. */
static int quant_groups(bind_ctx *b, stack_req *r, const tl_tensor *s, const tl_tensor *bi,
                        int bits, int want_group, int64_t *out) {
    int nd = r->nd, cols = r->cols, st;
    int64_t ng = s->ndim == nd ? s->shape[nd - 1] : 0;
    if (ng <= 0 || cols % ng || (cols / ng) % (32 / bits))
        return bad_width(b, s, "does not give a group size dividing %d", cols);
    r->shape[nd - 1] = ng;
    if ((st = want_shape(b, s, nd, r->shape, NULL)) || (st = want_shape(b, bi, nd, r->shape, NULL)))
        return st;
    if (want_group && want_group != cols / ng)
        return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                       "%s: tensor '%s' has groups of %lld but config.json "
                       "quantization['%s'].group_size is %d",
                       tfile(b, s), s->name, (long long)(cols / ng), r->module, want_group);
    if ((st = want_float(b, s)) || (st = want_float(b, bi))) return st;
    if (bi->dtype != s->dtype)
        return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                       "%s: tensor '%s': dtype %s differs from its scales' %s", tfile(b, bi),
                       bi->name, tl_dtype_name(bi->dtype), tl_dtype_name(s->dtype));
    *out = ng;
    return TL_OK;
}

/* An affine-quantized module: U32 weight + scales + biases; bits from the packed width, the
 * group from the scales' width, both cross-checked with config.json "quantization". */
static int bind_stack_quant(bind_ctx *b, stack_req *r, const tl_tensor *w, tl_mat *views) {
    char name[512];
    const tl_tensor *s = tl_model_find(b->m, fmt_name(name, sizeof name, "%s.scales", r->module));
    if (!s) return missing(b, name);
    const tl_tensor *bi = tl_model_find(b->m, fmt_name(name, sizeof name, "%s.biases", r->module));
    if (!bi) return missing(b, name);
    int want_bits, want_group, bits = 0;
    int64_t ng = 0;
    int st = quant_config(b, r->module, w, &want_bits, &want_group);
    if (st || (st = quant_bits(b, r, w, want_bits, &bits)) ||
        (st = quant_groups(b, r, s, bi, bits, want_group, &ng)))
        return st;
    size_t wrow = (size_t)shape_w_row(r->cols, bits), srow = (size_t)ng * tl_dtype_size(s->dtype);
    for (int e = 0; e < stack_views(r); e++) {
        size_t row = stack_row(r, e);
        views[e] = (tl_mat){
            .w = (const uint8_t *)w->data + row * wrow,
            .scales = (const uint8_t *)s->data + row * srow,
            .biases = (const uint8_t *)bi->data + row * srow,
            .wtype = TL_DT_U32,
            .stype = s->dtype,
            .bits = bits,
            .group = (int)(r->cols / ng),
            .rows = r->rows,
            .cols = r->cols,
        };
    }
    return TL_OK;
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
    stack_req r = {.module = module,
                   .E = E,
                   .total = total,
                   .row0 = row0,
                   .rows = rows,
                   .cols = cols,
                   .nd = E ? 3 : 2};
    r.shape[r.nd - 2] = total;
    if (E) r.shape[0] = E;
    if (w->dtype == TL_DT_U32 && !plain) return bind_stack_quant(b, &r, w, views);
    return bind_stack_float(b, &r, w, views);
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

/* "<prefix>layers.<il>.<suffix>" in b->name: valid until the next call (bind_stack and the
 * other binders do not call it, so it may be passed to them). */
static const char *layer_name(bind_ctx *b, int il, const char *suffix) {
    return fmt_name(b->name, sizeof b->name, "%slayers.%d.%s", b->pre, il, suffix);
}

/* The three expert projections of a layer: name, views, and the shape of one expert's matrix. */
typedef struct exp_proj {
    const char *name;
    tl_mat *views;
    int rows, cols;
} exp_proj;

/* HF fused: mlp.experts.gate_up_proj [E, 2ff, d] (gate rows first), mlp.experts.down_proj. */
static int bind_experts_fused(bind_ctx *b, int il, const exp_proj *pr, int E) {
    int ff = pr[0].rows, d = pr[0].cols, st;
    const char *gu = layer_name(b, il, "mlp.experts.gate_up_proj");
    if ((st = bind_stack(b, gu, 1, E, 2 * ff, 0, ff, d, pr[0].views)) ||
        (st = bind_stack(b, gu, 1, E, 2 * ff, ff, ff, d, pr[1].views)))
        return st;
    return bind_stack(b, layer_name(b, il, "mlp.experts.down_proj"), 1, E, d, 0, d, ff,
                      pr[2].views);
}

/* MLX stacked: mlp.switch_mlp.{gate,up,down}_proj [E, out, in] each. */
static int bind_experts_mlx(bind_ctx *b, int il, const exp_proj *pr, int E) {
    char suffix[64];
    for (int k = 0; k < 3; k++) {
        snprintf(suffix, sizeof suffix, "mlp.switch_mlp.%s", pr[k].name);
        int st = bind_stack(b, layer_name(b, il, suffix), 0, E, pr[k].rows, 0, pr[k].rows,
                            pr[k].cols, pr[k].views);
        if (st) return st;
    }
    return TL_OK;
}

/* Per-expert 2-D tensors mlp.experts.{e}.{gate,up,down}_proj.weight. */
static int bind_experts_split(bind_ctx *b, int il, const exp_proj *pr, int E) {
    char suffix[64];
    for (int e = 0; e < E; e++) {
        for (int k = 0; k < 3; k++) {
            snprintf(suffix, sizeof suffix, "mlp.experts.%d.%s", e, pr[k].name);
            int st =
                bind_mat(b, layer_name(b, il, suffix), pr[k].rows, pr[k].cols, &pr[k].views[e]);
            if (st) return st;
        }
    }
    return TL_OK;
}

/* The routed experts, in whichever of the three layouts the file has. */
static int bind_experts(bind_ctx *b, int il, tl_layer *L) {
    const tl_config *c = &b->m->cfg;
    int E = c->n_expert, ff = c->n_ff_expert, d = c->n_embd;
    L->exp_gate = keep(b->p, xcalloc((size_t)E, sizeof(tl_mat)));
    L->exp_up = keep(b->p, xcalloc((size_t)E, sizeof(tl_mat)));
    L->exp_down = keep(b->p, xcalloc((size_t)E, sizeof(tl_mat)));
    const exp_proj pr[3] = {{"gate_proj", L->exp_gate, ff, d},
                            {"up_proj", L->exp_up, ff, d},
                            {"down_proj", L->exp_down, d, ff}};
    if (tl_model_find(b->m, layer_name(b, il, "mlp.experts.gate_up_proj")))
        return bind_experts_fused(b, il, pr, E);
    if (tl_model_find(b->m, layer_name(b, il, "mlp.switch_mlp.gate_proj.weight")))
        return bind_experts_mlx(b, il, pr, E);
    if (tl_model_find(b->m, layer_name(b, il, "mlp.experts.0.gate_proj.weight")))
        return bind_experts_split(b, il, pr, E);
    return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                   "%s: tensor '%slayers.%d.mlp.experts.gate_up_proj' is missing (nor are there "
                   "per-expert mlp.experts.{e}.gate_proj.weight or mlp.switch_mlp.* tensors)",
                   ckpt_path(b), b->pre, il);
}

/* Gated full attention: q (with its gate half), k, v, o and the per-head q/k norms. */
static int bind_attn(bind_ctx *b, int il, tl_layer *L) {
    const tl_config *c = &b->m->cfg;
    int d = c->n_embd, hd = c->head_dim, st;
    if ((st = bind_mat(b, layer_name(b, il, "self_attn.q_proj"), c->n_head * hd * 2, d,
                       &L->attn_q)) ||
        (st = bind_mat(b, layer_name(b, il, "self_attn.k_proj"), c->n_head_kv * hd, d,
                       &L->attn_k)) ||
        (st = bind_mat(b, layer_name(b, il, "self_attn.v_proj"), c->n_head_kv * hd, d,
                       &L->attn_v)) ||
        (st = bind_mat(b, layer_name(b, il, "self_attn.o_proj"), d, c->n_head * hd, &L->attn_o)) ||
        (st = bind_vec(b, layer_name(b, il, "self_attn.q_norm.weight"), hd, VEC_NORM1P, 0,
                       &L->attn_q_norm)))
        return st;
    return bind_vec(b, layer_name(b, il, "self_attn.k_norm.weight"), hd, VEC_NORM1P, 0,
                    &L->attn_k_norm);
}

/* Gated DeltaNet: the four input projections, conv1d, dt_bias, A_log, the norm, out_proj. */
static int bind_gdn(bind_ctx *b, int il, tl_layer *L) {
    const tl_config *c = &b->m->cfg;
    int d = c->n_embd, conv = tl_config_gdn_conv_dim(c), vd = tl_config_gdn_val_dim(c),
        nv = c->gdn_n_v_head, st;
    if ((st = bind_mat(b, layer_name(b, il, "linear_attn.in_proj_qkv"), conv, d, &L->gdn_qkv)) ||
        (st = bind_mat(b, layer_name(b, il, "linear_attn.in_proj_z"), vd, d, &L->gdn_z)) ||
        (st = bind_mat(b, layer_name(b, il, "linear_attn.in_proj_b"), nv, d, &L->gdn_b)) ||
        (st = bind_mat(b, layer_name(b, il, "linear_attn.in_proj_a"), nv, d, &L->gdn_a)) ||
        (st = bind_conv(b, layer_name(b, il, "linear_attn.conv1d.weight"), conv, c->gdn_conv_k,
                        &L->gdn_conv)) ||
        (st = bind_vec(b, layer_name(b, il, "linear_attn.dt_bias"), nv, VEC_PLAIN, 0,
                       &L->gdn_dt_bias)) ||
        (st =
             bind_vec(b, layer_name(b, il, "linear_attn.A_log"), nv, VEC_ALOG, 0, &L->gdn_a_neg)) ||
        (st = bind_vec(b, layer_name(b, il, "linear_attn.norm.weight"), c->gdn_v_dim, VEC_PLAIN, 0,
                       &L->gdn_norm)))
        return st;
    return bind_mat(b, layer_name(b, il, "linear_attn.out_proj"), d, vd, &L->gdn_out);
}

/* The MoE block: router, shared expert and its gate, then the routed experts. */
static int bind_moe(bind_ctx *b, int il, tl_layer *L) {
    const tl_config *c = &b->m->cfg;
    int d = c->n_embd, fs = c->n_ff_shared, st;
    if ((st = bind_mat(b, layer_name(b, il, "mlp.gate"), c->n_expert, d, &L->moe_router)) ||
        (st = bind_mat(b, layer_name(b, il, "mlp.shared_expert.gate_proj"), fs, d, &L->sh_gate)) ||
        (st = bind_mat(b, layer_name(b, il, "mlp.shared_expert.up_proj"), fs, d, &L->sh_up)) ||
        (st = bind_mat(b, layer_name(b, il, "mlp.shared_expert.down_proj"), d, fs, &L->sh_down)) ||
        (st = bind_mat(b, layer_name(b, il, "mlp.shared_expert_gate"), 1, d, &L->sh_gate_inp)))
        return st;
    return bind_experts(b, il, L);
}

/* One decoder layer into L: its two norms (count: in the offset check), the mixer of kind,
 * the MoE block. */
static int bind_layer_into(bind_ctx *b, int il, tl_layer *L, tl_layer_kind kind, int count) {
    const tl_config *c = &b->m->cfg;
    int d = c->n_embd, st;
    L->kind = kind;
    if ((st = bind_vec(b, layer_name(b, il, "input_layernorm.weight"), d, VEC_NORM1P, count,
                       &L->attn_norm)) ||
        (st = bind_vec(b, layer_name(b, il, "post_attention_layernorm.weight"), d, VEC_NORM1P,
                       count, &L->ffn_norm)))
        return st;
    st = L->kind == TL_LAYER_ATTN ? bind_attn(b, il, L) : bind_gdn(b, il, L);
    return st ? st : bind_moe(b, il, L);
}

static int bind_layer(bind_ctx *b, int il) {
    return bind_layer_into(b, il, &b->m->layers[il], b->m->cfg.layer_kind[il], 1);
}

/* The MTP head (docs/model.md §3.1), when the checkpoint has it: config mtp_num_hidden_layers
 * >= 1 and any of mtp.pre_fc_norm_* / mtp.layers.0.* present (a file with only mtp.fc and
 * mtp.norm, such as the tiny test fixtures, has no usable head). Then every tensor must be
 * there with its shape. Its norms stay out of the offset check (they follow the trunk's
 * convention, but are not part of what the check measured). */
static int bind_mtp(bind_ctx *b) {
    tl_model *m = b->m;
    const tl_config *c = &m->cfg;
    int d = c->n_embd, st;
    if (c->mtp_n_layer < 1 || !(tl_model_find(m, "mtp.pre_fc_norm_embedding.weight") ||
                                tl_model_find(m, "mtp.pre_fc_norm_hidden.weight") ||
                                tl_model_find(m, "mtp.layers.0.input_layernorm.weight")))
        return TL_OK;
    tl_mtp *x = &m->mtp;
    const char *pre = b->pre;
    b->pre = "mtp.";
    if (!(st = bind_vec(b, "mtp.pre_fc_norm_embedding.weight", d, VEC_NORM1P, 0, &x->norm_emb)) &&
        !(st = bind_vec(b, "mtp.pre_fc_norm_hidden.weight", d, VEC_NORM1P, 0, &x->norm_hid)) &&
        !(st = bind_mat(b, "mtp.fc", d, 2 * d, &x->fc)) &&
        !(st = bind_layer_into(b, 0, &x->layer, TL_LAYER_ATTN, 0)))
        st = bind_vec(b, "mtp.norm.weight", d, VEC_NORM1P, 0, &x->norm);
    b->pre = pre;
    m->has_mtp = st == TL_OK;
    return st;
}

/* Which of the three name layouts the file uses, told by where embed_tokens is: sets b->pre,
 * b->lmhead, the format and priv's prefix. */
static int find_layout(bind_ctx *b) {
    tl_model *m = b->m;
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
            b->err, b->errlen, TL_ERR_FORMAT,
            "%s: tensor 'model.language_model.embed_tokens.weight' is missing (also "
            "looked for 'model.embed_tokens.weight', 'language_model.model.embed_tokens.weight')",
            ckpt_path(b));
    b->pre = layouts[li].pre;
    b->lmhead = layouts[li].lmhead;
    m->format = layouts[li].fmt;
    /* an MLX conversion of a text-only export keeps "model." but stacks experts as switch_mlp */
    if (m->format == TL_CKPT_HF &&
        tl_model_find(m, layer_name(b, 0, "mlp.switch_mlp.gate_proj.weight")))
        m->format = TL_CKPT_MLX;
    snprintf(b->p->prefix, sizeof b->p->prefix, "%s", b->pre);
    return TL_OK;
}

/* The embedding, the final norm and lm_head (the embedding again when tied and absent). */
static int bind_globals(bind_ctx *b) {
    tl_model *m = b->m;
    const tl_config *c = &m->cfg;
    char n[512];
    int st;
    if ((st = bind_mat(b, fmt_name(n, sizeof n, "%sembed_tokens", b->pre), c->n_vocab, c->n_embd,
                       &m->tok_embd)))
        return st;
    if ((st = bind_vec(b, fmt_name(n, sizeof n, "%snorm.weight", b->pre), c->n_embd, VEC_NORM1P, 1,
                       &m->out_norm)))
        return st;
    if (!tl_model_find(m, fmt_name(n, sizeof n, "%s.weight", b->lmhead)) && c->tie_embeddings) {
        m->output = m->tok_embd;
        return TL_OK;
    }
    return bind_mat(b, b->lmhead, c->n_vocab, c->n_embd, &m->output);
}

/* Norm storage check (docs/model.md §2.1): zero-centred weights average near 0, offset ones near
 * 1. A wrong convention would silently scale every activation, so refuse it. The midpoints
 * assume the trained weights' mean is within 0.5 of the convention's centre; that was not
 * measurable here (no real weights), so TL_NORM_CHECK=0 skips the check and the message says
 * so. */
static int check_norm_offset(bind_ctx *b) {
    double mean = b->norm_n ? b->norm_sum / (double)b->norm_n : 0;
    b->p->norm_mean = mean;
    const char *skip = getenv("TL_NORM_CHECK");
    if (skip && !strcmp(skip, "0")) return TL_OK;
    if (b->m->format == TL_CKPT_HF && mean >= 0.5)
        return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                       "%s: RMSNorm weights (input_layernorm, post_attention_layernorm, norm) "
                       "average %.3f: HF checkpoints store them zero-centred (near 0); this file "
                       "looks already offset (+1), i.e. converted with HF names (TL_NORM_CHECK=0 "
                       "loads it anyway)",
                       b->p->files[0].path, mean);
    if (b->m->format == TL_CKPT_MLX && (mean < 0.5 || mean >= 1.5))
        return tl_errf(b->err, b->errlen, TL_ERR_FORMAT,
                       "%s: RMSNorm weights (input_layernorm, post_attention_layernorm, norm) "
                       "average %.3f: MLX checkpoints store them offset (near 1); %s "
                       "(TL_NORM_CHECK=0 loads it anyway)",
                       b->p->files[0].path, mean,
                       mean < 0.5 ? "this file looks zero-centred (the +1 is missing)"
                                  : "this file looks offset twice (+2)");
    return TL_OK;
}

/* Layout, then the global tensors, every layer, and the norm convention check. */
static int bind_model(tl_model *m, char *err, size_t errlen) {
    bind_ctx b = {.m = m, .p = m->priv, .err = err, .errlen = errlen};
    int st = find_layout(&b);
    if (st || (st = bind_globals(&b))) return st;
    for (int il = 0; il < m->cfg.n_layer; il++)
        if ((st = bind_layer(&b, il))) return st;
    if ((st = bind_mtp(&b))) return st;
    return check_norm_offset(&b);
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
