/* MLX affine quantization and `tulip quantize`: HF BF16/F32 checkpoint -> MLX 4-bit checkpoint.
 *
 * The writer plans every output tensor first (names, dtypes, shapes are known from the config),
 * assigns them to shards, writes each shard's header, then produces the data tensor by tensor,
 * so a 35B checkpoint never has to be held in memory (largest unit: the embedding, ~270 MB). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "common/status.h"
#include "common/util.h"
#include "model/quant.h"
#include "model/st.h"
#include "model/weights.h"
#include "model/weights_priv.h"

/* ---- the math (see quant.h for the formula and where it comes from) ---- */

void tl_quant_group(const float *x, int group, int bits, uint8_t *q, float *scale, float *bias) {
    const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < group; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    int lo_side = fabsf(lo) > fabsf(hi);
    float s = fmaxf((hi - lo) / n_bins, eps);
    s = lo_side ? s : -s;
    float edge = lo_side ? lo : hi, q0 = rintf(edge / s), b = 0;
    if (q0 != 0) {
        s = edge / q0;
        b = edge;
    }
    for (int i = 0; i < group; i++) {
        float v = rintf((x[i] - b) / s);
        v = fminf(fmaxf(v, 0.0f), n_bins); /* NaN -> 0 through fmaxf */
        q[i] = (uint8_t)v;
    }
    *scale = s;
    *bias = b;
}

void tl_quant_row(const float *x, int n, int bits, int group, uint32_t *words, uint16_t *scales,
                  uint16_t *biases) {
    int per = 32 / bits;
    uint8_t q[512];
    TL_ASSERT(group <= 512 && n % group == 0 && group % per == 0);
    memset(words, 0, (size_t)(n / per) * sizeof *words);
    for (int g = 0; g < n / group; g++) {
        float s, b;
        tl_quant_group(x + (size_t)g * group, group, bits, q, &s, &b);
        scales[g] = tl_f32_to_bf16(s);
        biases[g] = tl_f32_to_bf16(b);
        for (int i = 0; i < group; i++) {
            int c = g * group + i;
            words[c / per] |= (uint32_t)q[i] << ((c % per) * bits);
        }
    }
}

/* ---- the plan ---- */

typedef enum { U_QMAT, U_FMAT, U_VEC, U_RAW } unit_kind;

typedef struct unit {
    char name[192]; /* module (QMAT: ".weight/.scales/.biases" appended) or tensor name */
    unit_kind kind;
    const tl_mat *mats; /* QMAT/FMAT: n_mats views; stacked along a leading dim when > 1 */
    int n_mats, stacked, bits;
    const float *vec;     /* U_VEC: f32 values, written as bf16 */
    const tl_tensor *raw; /* U_RAW: bytes copied as stored */
    int ndim;
    int64_t shape[3]; /* U_VEC/U_RAW output shape */
    size_t bytes;
    int align4; /* keeps 4-byte alignment when laid back to back */
    int shard;
} unit;

typedef struct plan {
    unit *u;
    int n, cap;
    int group, bits;
    json_t *qcfg; /* "quantization" object being built */
} plan;

static unit *plan_add(plan *p, const char *name, unit_kind kind) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->u = xrealloc(p->u, (size_t)p->cap * sizeof *p->u);
    }
    unit *u = &p->u[p->n++];
    memset(u, 0, sizeof *u);
    snprintf(u->name, sizeof u->name, "%s", name);
    u->kind = kind;
    return u;
}

/* A linear layer (or n stacked experts): quantized when its input width allows. */
/* record: write the module's own {group_size, bits} entry into config "quantization" (MLX's
 * quant_predicate does so for the router and shared_expert_gate). */
static void plan_mat(plan *p, const char *module, const tl_mat *mats, int n, int stacked, int bits,
                     int record) {
    const tl_mat *m = &mats[0];
    int q = m->cols % p->group == 0 && m->cols % (32 / bits) == 0;
    unit *u = plan_add(p, module, q ? U_QMAT : U_FMAT);
    u->mats = mats;
    u->n_mats = n;
    u->stacked = stacked;
    u->bits = bits;
    size_t rows = (size_t)n * (size_t)m->rows;
    if (q) {
        u->bytes = rows * shape_w_row(m->cols, bits) + 2 * rows * (size_t)(m->cols / p->group) * 2;
        u->align4 = 1; /* W is a multiple of 4; S + B together too */
        if (record) {
            json_t *o = json_object();
            json_object_set_new(o, "group_size", json_integer(p->group));
            json_object_set_new(o, "bits", json_integer(bits));
            json_object_set_new(p->qcfg, module, o);
        }
    } else {
        u->bytes = rows * (size_t)m->cols * tl_dtype_size(m->wtype);
        u->align4 = u->bytes % 4 == 0 && tl_dtype_size(m->wtype) >= 2;
    }
}

static void plan_vec(plan *p, const char *name, const float *v, int n) {
    unit *u = plan_add(p, name, U_VEC);
    u->vec = v;
    u->ndim = 1;
    u->shape[0] = n;
    u->bytes = (size_t)n * 2;
    u->align4 = u->bytes % 4 == 0;
}

static int plan_raw(plan *p, const tl_model *m, const char *src, const char *dst, int ndim,
                    const int64_t *shape, char *err, size_t errlen) {
    const tl_tensor *t = tl_model_find(m, src);
    if (!t) return tl_errf(err, errlen, TL_ERR_FORMAT, "tensor '%s' is missing", src);
    unit *u = plan_add(p, dst, U_RAW);
    u->raw = t;
    u->ndim = ndim ? ndim : t->ndim;
    for (int d = 0; d < u->ndim && d < 3; d++) u->shape[d] = ndim ? shape[d] : t->shape[d];
    u->bytes = t->nbytes;
    u->align4 = tl_dtype_size(t->dtype) % 4 == 0 || t->nbytes % 4 == 0;
    if (tl_dtype_size(t->dtype) == 1) u->align4 = 0;
    return TL_OK;
}

/* One decoder layer L: out names "<P>layers.<il>.*", raw tensors read from "<src>layers.<il>.*".
 */
static int plan_layer(plan *p, const tl_model *m, const tl_layer *L, const char *P, const char *src,
                      int il, char *err, size_t errlen) {
    const tl_config *c = &m->cfg;
    char n[192], s[192];
    int st;
#define OUT(fmt) (snprintf(n, sizeof n, "%slayers.%d." fmt, P, il), n)
#define SRC(fmt) (snprintf(s, sizeof s, "%slayers.%d." fmt, src, il), s)
    plan_vec(p, OUT("input_layernorm.weight"), L->attn_norm, c->n_embd);
    plan_vec(p, OUT("post_attention_layernorm.weight"), L->ffn_norm, c->n_embd);
    if (L->kind == TL_LAYER_ATTN) {
        plan_mat(p, OUT("self_attn.q_proj"), &L->attn_q, 1, 0, p->bits, 0);
        plan_mat(p, OUT("self_attn.k_proj"), &L->attn_k, 1, 0, p->bits, 0);
        plan_mat(p, OUT("self_attn.v_proj"), &L->attn_v, 1, 0, p->bits, 0);
        plan_mat(p, OUT("self_attn.o_proj"), &L->attn_o, 1, 0, p->bits, 0);
        plan_vec(p, OUT("self_attn.q_norm.weight"), L->attn_q_norm, c->head_dim);
        plan_vec(p, OUT("self_attn.k_norm.weight"), L->attn_k_norm, c->head_dim);
    } else {
        int64_t conv_shape[3] = {tl_config_gdn_conv_dim(c), c->gdn_conv_k, 1};
        plan_mat(p, OUT("linear_attn.in_proj_qkv"), &L->gdn_qkv, 1, 0, p->bits, 0);
        plan_mat(p, OUT("linear_attn.in_proj_z"), &L->gdn_z, 1, 0, p->bits, 0);
        plan_mat(p, OUT("linear_attn.in_proj_b"), &L->gdn_b, 1, 0, p->bits, 0);
        plan_mat(p, OUT("linear_attn.in_proj_a"), &L->gdn_a, 1, 0, p->bits, 0);
        if ((st = plan_raw(p, m, SRC("linear_attn.conv1d.weight"), OUT("linear_attn.conv1d.weight"),
                           3, conv_shape, err, errlen)) ||
            (st = plan_raw(p, m, SRC("linear_attn.dt_bias"), OUT("linear_attn.dt_bias"), 0, NULL,
                           err, errlen)) ||
            (st = plan_raw(p, m, SRC("linear_attn.A_log"), OUT("linear_attn.A_log"), 0, NULL, err,
                           errlen)) ||
            (st = plan_raw(p, m, SRC("linear_attn.norm.weight"), OUT("linear_attn.norm.weight"), 0,
                           NULL, err, errlen)))
            return st;
        plan_mat(p, OUT("linear_attn.out_proj"), &L->gdn_out, 1, 0, p->bits, 0);
    }
    plan_mat(p, OUT("mlp.gate"), &L->moe_router, 1, 0, 8, 1);
    plan_mat(p, OUT("mlp.shared_expert.gate_proj"), &L->sh_gate, 1, 0, p->bits, 0);
    plan_mat(p, OUT("mlp.shared_expert.up_proj"), &L->sh_up, 1, 0, p->bits, 0);
    plan_mat(p, OUT("mlp.shared_expert.down_proj"), &L->sh_down, 1, 0, p->bits, 0);
    plan_mat(p, OUT("mlp.shared_expert_gate"), &L->sh_gate_inp, 1, 0, 8, 1);
    plan_mat(p, OUT("mlp.switch_mlp.gate_proj"), L->exp_gate, c->n_expert, 1, p->bits, 0);
    plan_mat(p, OUT("mlp.switch_mlp.up_proj"), L->exp_up, c->n_expert, 1, p->bits, 0);
    plan_mat(p, OUT("mlp.switch_mlp.down_proj"), L->exp_down, c->n_expert, 1, p->bits, 0);
#undef OUT
#undef SRC
    return TL_OK;
}

/* The MTP head (docs/model.md §3), kept under its own names "mtp.*" in the MLX conventions of
 * the trunk (offset norms, switch_mlp experts, quantized linears; the router 8-bit). */
static int plan_mtp(plan *p, const tl_model *m, char *err, size_t errlen) {
    const tl_mtp *x = &m->mtp;
    int d = m->cfg.n_embd;
    plan_vec(p, "mtp.pre_fc_norm_embedding.weight", x->norm_emb, d);
    plan_vec(p, "mtp.pre_fc_norm_hidden.weight", x->norm_hid, d);
    plan_mat(p, "mtp.fc", &x->fc, 1, 0, p->bits, 0);
    plan_vec(p, "mtp.norm.weight", x->norm, d);
    return plan_layer(p, m, &x->layer, "mtp.", "mtp.", 0, err, errlen);
}

static int build_plan(plan *p, const tl_model *m, char *err, size_t errlen) {
    const tl_config *c = &m->cfg;
    const char *src = ((const tl_model_priv *)m->priv)->prefix;
    const char *P = "language_model.model.";
    char n[192];
    int st;
    snprintf(n, sizeof n, "%sembed_tokens", P);
    plan_mat(p, n, &m->tok_embd, 1, 0, p->bits, 0);
    snprintf(n, sizeof n, "%snorm.weight", P);
    plan_vec(p, n, m->out_norm, c->n_embd);
    if (m->output.w != m->tok_embd.w || !c->tie_embeddings)
        plan_mat(p, "language_model.lm_head", &m->output, 1, 0, p->bits, 0);
    for (int il = 0; il < c->n_layer; il++)
        if ((st = plan_layer(p, m, &m->layers[il], P, src, il, err, errlen))) return st;
    return m->has_mtp ? plan_mtp(p, m, err, errlen) : TL_OK;
}

/* Header entries of one unit (1 or 3), names kept in nb[3][208]. */
static int unit_entries(const unit *u, int group, tl_st_entry *e, char nb[3][208]) {
    const tl_mat *m = &u->mats[0];
    int nd = 0;
    if (u->kind == U_QMAT || u->kind == U_FMAT) {
        int64_t lead = u->stacked ? u->n_mats : 0;
        int k = u->kind == U_QMAT ? 3 : 1;
        static const char *suf[3] = {"weight", "scales", "biases"};
        for (int i = 0; i < k; i++) {
            snprintf(nb[i], 208, "%s.%s", u->name, suf[i]);
            e[i] = (tl_st_entry){.name = nb[i]};
            nd = 0;
            if (lead) e[i].shape[nd++] = lead;
            e[i].shape[nd++] = m->rows;
            if (u->kind == U_FMAT) {
                e[i].dtype = m->wtype;
                e[i].shape[nd++] = m->cols;
            } else if (i == 0) {
                e[i].dtype = TL_DT_U32;
                e[i].shape[nd++] = (int64_t)m->cols * u->bits / 32;
            } else {
                e[i].dtype = TL_DT_BF16;
                e[i].shape[nd++] = m->cols / group;
            }
            e[i].ndim = nd;
        }
        return k;
    }
    snprintf(nb[0], 208, "%s", u->name);
    e[0] = (tl_st_entry){.name = nb[0], .ndim = u->ndim};
    e[0].dtype = u->kind == U_VEC ? TL_DT_BF16 : u->raw->dtype;
    for (int d = 0; d < u->ndim; d++) e[0].shape[d] = u->shape[d];
    return 1;
}

/* One quantized unit being computed: rows [r0, r1) of the stacked output per worker. */
typedef struct qjob {
    const unit *u;
    int group;
    size_t nrows;
    uint32_t *W;
    uint16_t *S, *B;
} qjob;

typedef struct qpart {
    qjob *job;
    size_t r0, r1;
} qpart;

static void *quant_rows(void *arg) {
    qpart *pt = arg;
    const qjob *j = pt->job;
    const unit *u = j->u;
    int rows = u->mats[0].rows, cols = u->mats[0].cols, ng = cols / j->group;
    size_t wpr = (size_t)cols * u->bits / 32;
    float *x = xmalloc((size_t)cols * sizeof *x);
    for (size_t orow = pt->r0; orow < pt->r1; orow++) {
        const tl_mat *m = &u->mats[orow / (size_t)rows];
        size_t base = (orow % (size_t)rows) * (size_t)cols;
        for (int c = 0; c < cols; c++) x[c] = tl_load_elem(m->w, m->wtype, base + (size_t)c);
        tl_quant_row(x, cols, u->bits, j->group, j->W + orow * wpr, j->S + orow * (size_t)ng,
                     j->B + orow * (size_t)ng);
    }
    free(x);
    return NULL;
}

static int write_unit(FILE *fp, const unit *u, int group, const char *path, char *err,
                      size_t errlen) {
    int ok = 1;
    if (u->kind == U_VEC) {
        /* 1+w rounded to bf16: what mlx's sanitize computes (w + 1.0 on a bf16 array) */
        for (int64_t i = 0; ok && i < u->shape[0]; i++) {
            uint16_t h = tl_f32_to_bf16(u->vec[i]);
            ok = fwrite(&h, 2, 1, fp) == 1;
        }
    } else if (u->kind == U_RAW) {
        ok = !u->bytes || fwrite(u->raw->data, 1, u->bytes, fp) == u->bytes;
    } else if (u->kind == U_FMAT) {
        for (int e = 0; ok && e < u->n_mats; e++) {
            const tl_mat *m = &u->mats[e];
            size_t nb = (size_t)m->rows * (size_t)m->cols * tl_dtype_size(m->wtype);
            ok = fwrite(m->w, 1, nb, fp) == nb;
        }
    } else {
        const tl_mat *m0 = &u->mats[0];
        int ng = m0->cols / group;
        size_t nrows = (size_t)u->n_mats * (size_t)m0->rows, wpr = (size_t)m0->cols * u->bits / 32;
        qjob job = {.u = u, .group = group, .nrows = nrows};
        job.W = malloc(nrows * wpr * 4);
        job.S = malloc(nrows * (size_t)ng * 2);
        job.B = malloc(nrows * (size_t)ng * 2);
        if (!job.W || !job.S || !job.B) {
            free(job.W), free(job.S), free(job.B);
            return tl_errf(err, errlen, TL_ERR_NOMEM, "%s: out of memory quantizing '%s'", path,
                           u->name);
        }
        /* rows are independent: split them over threads when there is enough work */
        int nt = nrows * (size_t)m0->cols >= ((size_t)1 << 16) ? TL_MIN(tl_n_cpus(), 32) : 1;
        pthread_t th[32];
        qpart part[32];
        int started = 0;
        for (int t = 0; t < nt; t++) {
            part[t] =
                (qpart){&job, nrows * (size_t)t / (size_t)nt, nrows * (size_t)(t + 1) / (size_t)nt};
            if (t > 0 && pthread_create(&th[t], NULL, quant_rows, &part[t]) == 0)
                started |= 1 << t;
            else if (t > 0)
                quant_rows(&part[t]);
        }
        quant_rows(&part[0]);
        for (int t = 1; t < nt; t++)
            if (started & (1 << t)) pthread_join(th[t], NULL);
        ok = fwrite(job.W, 4, nrows * wpr, fp) == nrows * wpr &&
             fwrite(job.S, 2, nrows * (size_t)ng, fp) == nrows * (size_t)ng &&
             fwrite(job.B, 2, nrows * (size_t)ng, fp) == nrows * (size_t)ng;
        free(job.W), free(job.S), free(job.B);
    }
    return ok ? TL_OK : tl_errf(err, errlen, TL_ERR_IO, "%s: write error", path);
}

static int copy_file(const char *src, const char *dst, char *err, size_t errlen) {
    char *buf = NULL;
    size_t n = 0;
    int st = tl_read_file(src, &buf, &n, err, errlen);
    if (st) return st;
    FILE *f = fopen(dst, "wb");
    if (!f) {
        free(buf);
        return tl_errf(err, errlen, TL_ERR_IO, "%s: %s", dst, strerror(errno));
    }
    int ok = fwrite(buf, 1, n, f) == n;
    ok &= fclose(f) == 0;
    free(buf);
    return ok ? TL_OK : tl_errf(err, errlen, TL_ERR_IO, "%s: write error", dst);
}

static int write_config(const char *in_dir, const char *out_dir, json_t *q, char *err,
                        size_t errlen) {
    char *ip = tl_path_join(in_dir, "config.json"), *op = tl_path_join(out_dir, "config.json");
    json_error_t je;
    int st = TL_OK;
    json_t *root = json_load_file(ip, 0, &je);
    if (!root || !json_is_object(root)) {
        st = tl_errf(err, errlen, TL_ERR_FORMAT, "%s: bad JSON: %s", ip, je.text);
    } else {
        json_object_set(root, "quantization", q);
        json_object_set(root, "quantization_config", q);
        if (json_dump_file(root, op, JSON_INDENT(2) | JSON_PRESERVE_ORDER))
            st = tl_errf(err, errlen, TL_ERR_IO, "%s: write error", op);
    }
    json_decref(root);
    free(ip);
    free(op);
    return st;
}

int tl_quantize_checkpoint(const char *in_dir, const char *out_dir, int bits, int group,
                           size_t shard_bytes, void (*progress)(const char *msg), char *err,
                           size_t errlen) {
    if (bits != 4 && bits != 8)
        return tl_errf(err, errlen, TL_ERR_INVALID, "quantize: bits must be 4 or 8, not %d", bits);
    if (group < 32 || group > 512 || group % 32)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "quantize: group size must be a multiple of 32 in 32..512, not %d", group);
    if (!shard_bytes) shard_bytes = (size_t)5 << 30;
    char rin[PATH_MAX], rout[PATH_MAX];
    if (mkdir(out_dir, 0755) && errno != EEXIST)
        return tl_errf(err, errlen, TL_ERR_IO, "%s: %s", out_dir, strerror(errno));
    if (realpath(in_dir, rin) && realpath(out_dir, rout) && !strcmp(rin, rout))
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "quantize: --out must be a different directory from --in");
    tl_model *m = NULL;
    int st = tl_model_open(&m, in_dir, err, errlen);
    if (st) return st;
    plan p = {.group = group, .bits = bits, .qcfg = json_object()};
    json_object_set_new(p.qcfg, "group_size", json_integer(group));
    json_object_set_new(p.qcfg, "bits", json_integer(bits));
    json_object_set_new(p.qcfg, "mode", json_string("affine"));
    char **paths = NULL;
    int n_shards = 0;
    if (m->format != TL_CKPT_HF) {
        st = tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                     "quantize: %s is already an MLX checkpoint; give the HF BF16 one", in_dir);
        goto done;
    }
    if ((st = build_plan(&p, m, err, errlen))) goto done;

    /* shards: consecutive units up to shard_bytes each */
    size_t cur = 0;
    for (int i = 0; i < p.n; i++) {
        if (cur && cur + p.u[i].bytes > shard_bytes) {
            n_shards++;
            cur = 0;
        }
        p.u[i].shard = n_shards;
        cur += p.u[i].bytes;
    }
    n_shards++;
    paths = xcalloc((size_t)n_shards, sizeof *paths);
    json_t *wmap = json_object();
    size_t total = 0;
    for (int s = 0; s < n_shards && !st; s++) {
        char fname[64];
        if (n_shards == 1)
            snprintf(fname, sizeof fname, "model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        paths[s] = tl_path_join(out_dir, fname);
        /* order: 4-aligned units first, then the 2-byte ones, so every tensor stays aligned */
        int cnt = 0;
        for (int i = 0; i < p.n; i++) cnt += p.u[i].shard == s;
        int *ord = xmalloc((size_t)(cnt ? cnt : 1) * sizeof *ord), k = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < p.n; i++)
                if (p.u[i].shard == s && p.u[i].align4 == !pass) ord[k++] = i;
        tl_st_entry *ent = xcalloc((size_t)cnt * 3 + 1, sizeof *ent);
        char(*names)[208] = xcalloc((size_t)cnt * 3 + 1, sizeof *names);
        int ne = 0;
        for (int i = 0; i < cnt; i++) {
            const unit *u = &p.u[ord[i]];
            int add = unit_entries(u, group, ent + ne, names + ne);
            for (int j = 0; j < add; j++) {
                ent[ne + j].name = names[ne + j];
                json_object_set_new(wmap, names[ne + j], json_string(fname));
            }
            ne += add;
        }
        FILE *fp = fopen(paths[s], "wb");
        if (!fp) {
            st = tl_errf(err, errlen, TL_ERR_IO, "%s: %s", paths[s], strerror(errno));
        } else {
            st = tl_st_write_header(fp, ent, ne, paths[s], err, errlen);
            int last_layer = -1;
            for (int i = 0; !st && i < cnt; i++) {
                const unit *u = &p.u[ord[i]];
                int il = -1;
                const char *lp = strstr(u->name, ".layers.");
                if (lp) il = atoi(lp + 8);
                if (progress && il != last_layer && il >= 0) {
                    char msg[160];
                    snprintf(msg, sizeof msg, "%s: layer %d/%d", fname, il + 1, m->cfg.n_layer);
                    progress(msg);
                    last_layer = il;
                }
                st = write_unit(fp, u, group, paths[s], err, errlen);
                total += u->bytes;
            }
            if (fclose(fp) && !st)
                st = tl_errf(err, errlen, TL_ERR_IO, "%s: write error", paths[s]);
        }
        free(ord);
        free(ent);
        free(names);
    }
    if (!st && n_shards > 1) {
        json_t *idx = json_object(), *meta = json_object();
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
        json_object_set_new(idx, "metadata", meta);
        json_object_set(idx, "weight_map", wmap);
        char *ip = tl_path_join(out_dir, "model.safetensors.index.json");
        if (json_dump_file(idx, ip, JSON_INDENT(2)))
            st = tl_errf(err, errlen, TL_ERR_IO, "%s: write error", ip);
        free(ip);
        json_decref(idx);
    }
    json_decref(wmap);
    if (!st) st = write_config(in_dir, out_dir, p.qcfg, err, errlen);
    /* the files a server needs besides weights */
    static const char *aux[] = {
        "generation_config.json",  "tokenizer.json",    "tokenizer_config.json",
        "special_tokens_map.json", "vocab.json",        "merges.txt",
        "chat_template.jinja",     "chat_template.json"};
    for (size_t i = 0; !st && i < sizeof aux / sizeof aux[0]; i++) {
        char *a = tl_path_join(in_dir, aux[i]), *b = tl_path_join(out_dir, aux[i]);
        struct stat sb;
        if (stat(a, &sb) == 0 && S_ISREG(sb.st_mode)) st = copy_file(a, b, err, errlen);
        free(a);
        free(b);
    }
done:
    for (int s = 0; paths && s < n_shards; s++) free(paths[s]);
    free(paths);
    free(p.u);
    json_decref(p.qcfg);
    tl_model_close(m);
    return st;
}
