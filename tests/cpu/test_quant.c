/* MLX affine quantization: the group formula on hand-worked cases, the packing layout, the
 * error bound, and `tulip quantize` end to end (HF checkpoint -> MLX checkpoint -> loader):
 * every dequantized weight is within the bound of the original, norms/conv/A_log carried over,
 * router and shared_expert_gate at 8 bits. */
#include <jansson.h>
#include <math.h>
#include <unistd.h>
#include "t_check.h"
#include "tiny_ckpt.h"
#include "model/quant.h"
#include "model/weights.h"
#include "tulip.h"

/* Independent dequantizer (the layout of weights.h, written out again here). */
static float deq(const tl_mat *m, int r, int c) {
    if (!m->bits) return tl_load_elem(m->w, m->wtype, (size_t)r * m->cols + c);
    const uint32_t *w = m->w;
    int per = 32 / m->bits, ng = m->cols / m->group;
    uint32_t word = w[(size_t)r * (m->cols / per) + c / per];
    uint32_t q = (word >> ((c % per) * m->bits)) & ((1u << m->bits) - 1);
    float s = tl_load_elem(m->scales, m->stype, (size_t)r * ng + c / m->group);
    float b = tl_load_elem(m->biases, m->stype, (size_t)r * ng + c / m->group);
    return s * (float)q + b;
}

/* Largest |dequantized - original| for a group with stored scale s and bias b. MLX snaps the
 * scale so that zero is a code (s = edge / rint(edge / s0)); with |edge / s0| in [7.5, 15]
 * (4 bits; [127.5, 255] at 8) that can shrink the step by up to 7.5/8, and then the far end of
 * the range needs code 16 (256) and is clamped to 15 (255): one full step of error there, half a
 * step everywhere else. On top: scale and bias rounded to bf16 (relative 2^-9), which moves a
 * value by at most levels*|s|/512 + |b|/512. */
static double qbound(double s, double b, int bits) {
    double levels = (1 << bits) - 1;
    return fabs(s) * (1.0 + levels / 512) + fabs(b) / 512 + 1e-6;
}

static void test_group_hand_cases(void) {
    float x[64] = {0}, s, b;
    uint8_t q[64];
    /* |min| > |max|: scale = 1.5/15 = 0.1, edge = min = -1, q0 = -10 -> s = 0.1, bias = -1 */
    x[0] = -1.0f, x[1] = 0.5f, x[2] = 0.3f;
    tl_quant_group(x, 64, 4, q, &s, &b);
    CHECK_CLOSE(s, 0.1, 1e-7, 0);
    CHECK(b == -1.0f);
    CHECK_EQ_INT(q[0], 0);
    CHECK_EQ_INT(q[1], 15);
    CHECK_EQ_INT(q[2], 13);
    CHECK_EQ_INT(q[3], 10); /* zero maps exactly to code 10 */
    CHECK(s * 10 + b == 0.0f);
    /* |max| >= |min|: the scale is negative and the bias is the maximum */
    memset(x, 0, sizeof x);
    x[0] = 1.0f, x[1] = -0.5f;
    tl_quant_group(x, 64, 4, q, &s, &b);
    CHECK_CLOSE(s, -0.1, 1e-7, 0);
    CHECK(b == 1.0f);
    CHECK_EQ_INT(q[0], 0);
    CHECK_EQ_INT(q[1], 15);
    CHECK_EQ_INT(q[2], 10);
    /* all zero: eps scale, zero bias, codes 0 */
    memset(x, 0, sizeof x);
    tl_quant_group(x, 64, 4, q, &s, &b);
    CHECK(b == 0.0f);
    CHECK(fabsf(s) == 1e-7f);
    CHECK_EQ_INT(q[5], 0);
    /* 8 bits: 255 levels */
    for (int i = 0; i < 64; i++) x[i] = (float)i / 63.0f - 0.25f;
    tl_quant_group(x, 64, 8, q, &s, &b);
    CHECK(b == 0.75f);
    CHECK_EQ_INT(q[63], 0);
    CHECK_EQ_INT(q[0], 255);
}

static void test_row_packing_and_bound(void) {
    enum { N = 256, G = 64 };
    float x[N];
    uint32_t w[N / 8];
    uint16_t s[N / G], b[N / G];
    uint64_t seed = 12345;
    for (int trial = 0; trial < 50; trial++) {
        for (int i = 0; i < N; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = ((float)(seed >> 40) / (float)(1 << 24) - 0.5f) * (trial % 5 + 1) +
                   (trial % 7 == 0 ? 0.8f : 0.0f); /* some all-positive groups */
        }
        tl_quant_row(x, N, 4, G, w, s, b);
        tl_mat m = {.w = w,
                    .scales = s,
                    .biases = b,
                    .wtype = TL_DT_U32,
                    .stype = TL_DT_BF16,
                    .bits = 4,
                    .group = G,
                    .rows = 1,
                    .cols = N};
        for (int c = 0; c < N; c++) {
            float sc = tl_bf16_to_f32(s[c / G]), bi = tl_bf16_to_f32(b[c / G]);
            double bound = qbound(sc, bi, 4);
            double d = fabs(deq(&m, 0, c) - x[c]);
            if (d > bound) fprintf(stderr, "c %d: |%g - %g| > %g\n", c, deq(&m, 0, c), x[c], bound);
            CHECK(d <= bound);
        }
        /* nibble c of word c/8 at bit 4*(c%8) */
        uint8_t q[G];
        float s0, b0;
        tl_quant_group(x + G, G, 4, q, &s0, &b0);
        for (int i = 0; i < G; i++) CHECK_EQ_INT((w[(G + i) / 8] >> (4 * (i % 8))) & 15, q[i]);
    }
}

/* Every element of an MLX view within the quantization bound of the HF view. */
static int mat_close(const tl_mat *q, const tl_mat *f, double *max_rel) {
    if (q->rows != f->rows || q->cols != f->cols) return 0;
    int ok = 1;
    for (int r = 0; r < q->rows; r++)
        for (int c = 0; c < q->cols; c++) {
            float want = deq(f, r, c), got = deq(q, r, c);
            double bound = 0;
            if (q->bits) {
                int ng = q->cols / q->group;
                float s = tl_load_elem(q->scales, q->stype, (size_t)r * ng + c / q->group);
                float b = tl_load_elem(q->biases, q->stype, (size_t)r * ng + c / q->group);
                bound = qbound(s, b, q->bits);
            }
            if (fabs(got - want) > bound) ok = 0;
            if (bound > 0 && fabs(got - want) / bound > *max_rel)
                *max_rel = fabs(got - want) / bound;
        }
    return ok;
}

static float bf16r(float x) { return tl_bf16_to_f32(tl_f32_to_bf16(x)); }

/* Layer b (quantized) against a (the source). */
static void compare_layer(const tl_layer *a, const tl_layer *b, const tl_config *c, int bits,
                          int group, double *mrp) {
    double mr = *mrp;
    CHECK_EQ_INT(b->kind, a->kind);
    /* norms are stored as bf16(1 + w), as mlx's conversion rounds them */
    for (int i = 0; i < c->n_embd; i++) CHECK(bf16r(a->attn_norm[i]) == b->attn_norm[i]);
    for (int i = 0; i < c->n_embd; i++) CHECK(bf16r(a->ffn_norm[i]) == b->ffn_norm[i]);
    if (a->kind == TL_LAYER_ATTN) {
        CHECK(mat_close(&b->attn_q, &a->attn_q, &mr));
        CHECK(mat_close(&b->attn_k, &a->attn_k, &mr));
        CHECK(mat_close(&b->attn_v, &a->attn_v, &mr));
        CHECK(mat_close(&b->attn_o, &a->attn_o, &mr));
        for (int i = 0; i < c->head_dim; i++) CHECK(bf16r(a->attn_q_norm[i]) == b->attn_q_norm[i]);
        for (int i = 0; i < c->head_dim; i++) CHECK(bf16r(a->attn_k_norm[i]) == b->attn_k_norm[i]);
    } else {
        CHECK(mat_close(&b->gdn_qkv, &a->gdn_qkv, &mr));
        CHECK(mat_close(&b->gdn_z, &a->gdn_z, &mr));
        CHECK(mat_close(&b->gdn_b, &a->gdn_b, &mr));
        CHECK(mat_close(&b->gdn_a, &a->gdn_a, &mr));
        CHECK(mat_close(&b->gdn_out, &a->gdn_out, &mr));
        int conv = tl_config_gdn_conv_dim(c);
        for (int i = 0; i < conv * c->gdn_conv_k; i++) CHECK(a->gdn_conv[i] == b->gdn_conv[i]);
        for (int i = 0; i < c->gdn_n_v_head; i++) CHECK(a->gdn_a_neg[i] == b->gdn_a_neg[i]);
        for (int i = 0; i < c->gdn_n_v_head; i++) CHECK(a->gdn_dt_bias[i] == b->gdn_dt_bias[i]);
        for (int i = 0; i < c->gdn_v_dim; i++) CHECK(a->gdn_norm[i] == b->gdn_norm[i]);
    }
    CHECK(mat_close(&b->moe_router, &a->moe_router, &mr));
    CHECK(mat_close(&b->sh_gate_inp, &a->sh_gate_inp, &mr));
    CHECK(mat_close(&b->sh_gate, &a->sh_gate, &mr));
    CHECK(mat_close(&b->sh_up, &a->sh_up, &mr));
    CHECK(mat_close(&b->sh_down, &a->sh_down, &mr));
    if (c->n_embd % group == 0) {
        CHECK_EQ_INT(b->moe_router.bits, 8);
        CHECK_EQ_INT(b->sh_gate_inp.bits, 8);
        CHECK_EQ_INT(b->sh_up.bits, bits);
        CHECK_EQ_INT(b->exp_gate[0].bits, bits);
    }
    for (int e = 0; e < c->n_expert; e++) {
        CHECK(mat_close(&b->exp_gate[e], &a->exp_gate[e], &mr));
        CHECK(mat_close(&b->exp_up[e], &a->exp_up[e], &mr));
        CHECK(mat_close(&b->exp_down[e], &a->exp_down[e], &mr));
    }
    *mrp = mr;
}

static void compare_models(const tl_model *h, const tl_model *q, int bits, int group) {
    const tl_config *c = &h->cfg;
    double mr = 0;
    CHECK_EQ_INT(q->format, TL_CKPT_MLX);
    CHECK_EQ_INT(q->cfg.quant_bits, bits);
    CHECK_EQ_INT(q->cfg.quant_group, group);
    CHECK_EQ_INT(q->cfg.n_layer, c->n_layer);
    CHECK(mat_close(&q->tok_embd, &h->tok_embd, &mr));
    CHECK(mat_close(&q->output, &h->output, &mr));
    CHECK_EQ_INT(q->tok_embd.bits, c->n_embd % group ? 0 : bits);
    for (int i = 0; i < c->n_embd; i++) CHECK(q->out_norm[i] == bf16r(h->out_norm[i]));
    for (int il = 0; il < c->n_layer; il++)
        compare_layer(&h->layers[il], &q->layers[il], c, bits, group, &mr);
    /* the MTP head is kept, quantized in the trunk's conventions */
    CHECK_EQ_INT(q->has_mtp, h->has_mtp);
    if (h->has_mtp && q->has_mtp) {
        compare_layer(&h->mtp.layer, &q->mtp.layer, c, bits, group, &mr);
        CHECK(mat_close(&q->mtp.fc, &h->mtp.fc, &mr));
        CHECK_EQ_INT(q->mtp.fc.bits, (2 * c->n_embd) % group ? 0 : bits);
        for (int i = 0; i < c->n_embd; i++) {
            CHECK(q->mtp.norm[i] == bf16r(h->mtp.norm[i]));
            CHECK(q->mtp.norm_emb[i] == bf16r(h->mtp.norm_emb[i]));
            CHECK(q->mtp.norm_hid[i] == bf16r(h->mtp.norm_hid[i]));
        }
    }
    printf("# largest error / bound over all weights: %.3f\n", mr);
    CHECK(mr > 0.05); /* the comparison saw real quantization error (not a float copy) */
}

static void quantize_and_compare(const char *in, const char *tag, int bits, int group,
                                 size_t shard) {
    char out[256], err[512] = "";
    tc_tmpdir(out, sizeof out, tag);
    int st = tl_quantize_checkpoint(in, out, bits, group, shard, NULL, err, sizeof err);
    if (st) fprintf(stderr, "quantize %s: %s\n", in, err);
    CHECK_EQ_INT(st, 0);
    tl_model *h = NULL, *q = NULL;
    CHECK_EQ_INT(tl_model_open(&h, in, err, sizeof err), 0);
    st = tl_model_open(&q, out, err, sizeof err);
    if (st) fprintf(stderr, "open quantized %s: %s\n", out, err);
    CHECK_EQ_INT(st, 0);
    if (h && q) {
        compare_models(h, q, bits, group);
        if (!h->has_mtp) CHECK(tl_model_find(q, "mtp.fc.weight") == NULL); /* no head, none kept */
        CHECK(tl_model_find(q, "language_model.model.layers.0.mlp.switch_mlp.gate_proj.weight"));
        CHECK_EQ_INT(q->cfg.n_eos, h->cfg.n_eos);
    }
    tl_model_close(h);
    tl_model_close(q);
    /* the config records the 8-bit overrides as MLX does */
    char p[300], *text = NULL;
    snprintf(p, sizeof p, "%s/config.json", out);
    CHECK_EQ_INT(tl_read_file(p, &text, NULL, err, sizeof err), 0);
    if (text) {
        CHECK(strstr(text, "\"quantization\"") != NULL);
        CHECK(strstr(text, "\"mode\": \"affine\"") != NULL);
        CHECK(strstr(text, "language_model.model.layers.0.mlp.gate\"") != NULL);
    }
    free(text);
    if (shard) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", out);
        CHECK(access(p, R_OK) == 0);
    }
    tc_rmdir(out);
}

static void test_quantize_synthetic(void) {
    char in[256];
    tc_tmpdir(in, sizeof in, "qin");
    tc_opts o = {0};
    CHECK_EQ_INT(tc_write(in, &o), 0);
    quantize_and_compare(in, "qout", 4, 64, 0);
    quantize_and_compare(in, "qout8", 8, 32, 0);
    quantize_and_compare(in, "qshard", 4, 64, 20000); /* several shards + index */
    tc_opts o2 = {.per_expert = 1};
    CHECK_EQ_INT(tc_write(in, &o2), 0);
    quantize_and_compare(in, "qout2", 4, 64, 0);
    tc_opts o3 = {.mtp = 1}, o4 = {.mtp = 1, .per_expert = 1};
    CHECK_EQ_INT(tc_write(in, &o3), 0);
    quantize_and_compare(in, "qmtp", 4, 64, 0);
    quantize_and_compare(in, "qmtp8", 8, 32, 20000); /* MTP spread over shards */
    CHECK_EQ_INT(tc_write(in, &o4), 0);
    quantize_and_compare(in, "qmtp2", 4, 64, 0);
    tc_rmdir(in);
}

static void test_quantize_fixtures(void) {
    if (access("tests/data/tiny-a/config.json", R_OK)) {
        printf("# fixtures not present\n");
        return;
    }
    quantize_and_compare("tests/data/tiny-a", "qa", 4, 64, 0);
    /* tiny-b: hidden 96, ff 48: with group 32 some linears quantize and some stay bf16 */
    quantize_and_compare("tests/data/tiny-b", "qb", 4, 32, 0);
}

static void test_quantize_refusals(void) {
    char err[512] = "";
    CHECK(tl_quantize_checkpoint("tests/data/tiny-a", "tests/data/tiny-a", 4, 64, 0, NULL, err,
                                 sizeof err) < 0);
    CHECK(tl_quantize_checkpoint("/nonexistent-dir", "/tmp/tulip-q-none", 3, 64, 0, NULL, err,
                                 sizeof err) < 0);
    CHECK(strstr(err, "bits") != NULL);
    CHECK(tl_quantize_checkpoint("/nonexistent-dir", "/tmp/tulip-q-none", 4, 64, 0, NULL, err,
                                 sizeof err) < 0);
    CHECK(strstr(err, "/nonexistent-dir") != NULL);
    tc_rmdir("/tmp/tulip-q-none");
}

/* ---- end to end: the 4-bit model and its dequantized F32 copy give the same logits ---- */

typedef struct dq_list {
    tl_st_entry e[2048];
    void *buf[2048];
    int n;
} dq_list;

static void dq_mat(dq_list *L, const char *name, const tl_mat *m) {
    float *v = xmalloc((size_t)m->rows * m->cols * sizeof *v);
    for (int r = 0; r < m->rows; r++)
        for (int c = 0; c < m->cols; c++) v[(size_t)r * m->cols + c] = deq(m, r, c);
    L->e[L->n] = (tl_st_entry){.name = xstrdup(name),
                               .dtype = TL_DT_F32,
                               .ndim = 2,
                               .shape = {m->rows, m->cols},
                               .data = v};
    L->buf[L->n++] = v;
}

static void dq_raw(dq_list *L, const tl_model *h, const char *name) {
    const tl_tensor *t = tl_model_find(h, name);
    TL_ASSERT(t);
    L->e[L->n] =
        (tl_st_entry){.name = xstrdup(name), .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
    for (int d = 0; d < t->ndim; d++) L->e[L->n].shape[d] = t->shape[d];
    L->buf[L->n++] = NULL;
}

static void dq_norm(dq_list *L, const char *name, const float *v, int n) {
    float *x = xmalloc((size_t)n * sizeof *x);
    for (int i = 0; i < n; i++) x[i] = v[i] - 1.0f;
    L->e[L->n] = (tl_st_entry){
        .name = xstrdup(name), .dtype = TL_DT_F32, .ndim = 1, .shape = {n}, .data = x};
    L->buf[L->n++] = x;
}

/* Writes q's weights dequantized to F32 under HF names (per-expert form); vectors copied from h. */
static int write_dequantized(const tl_model *q, const tl_model *h, const char *in,
                             const char *dir) {
    dq_list *L = xcalloc(1, sizeof *L);
    char n[256];
    const char *P = "model.language_model.";
    const tl_config *c = &q->cfg;
#define NM(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    dq_mat(L, NM("%sembed_tokens.weight", P), &q->tok_embd);
    dq_mat(L, "lm_head.weight", &q->output);
    for (int il = 0; il < c->n_layer; il++) {
        const tl_layer *Y = &q->layers[il];
        if (Y->kind == TL_LAYER_ATTN) {
            dq_mat(L, NM("%slayers.%d.self_attn.q_proj.weight", P, il), &Y->attn_q);
            dq_mat(L, NM("%slayers.%d.self_attn.k_proj.weight", P, il), &Y->attn_k);
            dq_mat(L, NM("%slayers.%d.self_attn.v_proj.weight", P, il), &Y->attn_v);
            dq_mat(L, NM("%slayers.%d.self_attn.o_proj.weight", P, il), &Y->attn_o);
        } else {
            dq_mat(L, NM("%slayers.%d.linear_attn.in_proj_qkv.weight", P, il), &Y->gdn_qkv);
            dq_mat(L, NM("%slayers.%d.linear_attn.in_proj_z.weight", P, il), &Y->gdn_z);
            dq_mat(L, NM("%slayers.%d.linear_attn.in_proj_b.weight", P, il), &Y->gdn_b);
            dq_mat(L, NM("%slayers.%d.linear_attn.in_proj_a.weight", P, il), &Y->gdn_a);
            dq_mat(L, NM("%slayers.%d.linear_attn.out_proj.weight", P, il), &Y->gdn_out);
        }
        dq_mat(L, NM("%slayers.%d.mlp.gate.weight", P, il), &Y->moe_router);
        dq_mat(L, NM("%slayers.%d.mlp.shared_expert.gate_proj.weight", P, il), &Y->sh_gate);
        dq_mat(L, NM("%slayers.%d.mlp.shared_expert.up_proj.weight", P, il), &Y->sh_up);
        dq_mat(L, NM("%slayers.%d.mlp.shared_expert.down_proj.weight", P, il), &Y->sh_down);
        dq_mat(L, NM("%slayers.%d.mlp.shared_expert_gate.weight", P, il), &Y->sh_gate_inp);
        for (int e = 0; e < c->n_expert; e++) {
            dq_mat(L, NM("%slayers.%d.mlp.experts.%d.gate_proj.weight", P, il, e), &Y->exp_gate[e]);
            dq_mat(L, NM("%slayers.%d.mlp.experts.%d.up_proj.weight", P, il, e), &Y->exp_up[e]);
            dq_mat(L, NM("%slayers.%d.mlp.experts.%d.down_proj.weight", P, il, e), &Y->exp_down[e]);
        }
    }
    /* RMSNorm1p weights back to HF's zero-centred form: bf16(1+w) - 1 is exact in f32 and the
     * HF loader's +1 restores the MLX value bit for bit */
    dq_norm(L, NM("%snorm.weight", P), q->out_norm, c->n_embd);
    for (int il = 0; il < c->n_layer; il++) {
        const tl_layer *Y = &q->layers[il];
        dq_norm(L, NM("%slayers.%d.input_layernorm.weight", P, il), Y->attn_norm, c->n_embd);
        dq_norm(L, NM("%slayers.%d.post_attention_layernorm.weight", P, il), Y->ffn_norm,
                c->n_embd);
        if (Y->kind == TL_LAYER_ATTN) {
            dq_norm(L, NM("%slayers.%d.self_attn.q_norm.weight", P, il), Y->attn_q_norm,
                    c->head_dim);
            dq_norm(L, NM("%slayers.%d.self_attn.k_norm.weight", P, il), Y->attn_k_norm,
                    c->head_dim);
        }
    }
    /* 2-byte tensors last so every F32 stays aligned */
    for (int il = 0; il < c->n_layer; il++) {
        if (q->layers[il].kind != TL_LAYER_ATTN) {
            dq_raw(L, h, NM("%slayers.%d.linear_attn.conv1d.weight", P, il));
            dq_raw(L, h, NM("%slayers.%d.linear_attn.dt_bias", P, il));
            dq_raw(L, h, NM("%slayers.%d.linear_attn.A_log", P, il));
            dq_raw(L, h, NM("%slayers.%d.linear_attn.norm.weight", P, il));
        }
    }
#undef NM
    char err[512], p[300], src[300];
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int st = tl_st_write(p, L->e, L->n, err, sizeof err);
    if (st) fprintf(stderr, "write_dequantized: %s\n", err);
    const char *files[2] = {"config.json", "generation_config.json"};
    for (int i = 0; !st && i < 2; i++) {
        char *text = NULL;
        size_t len = 0;
        snprintf(src, sizeof src, "%s/%s", in, files[i]);
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (tl_read_file(src, &text, &len, err, sizeof err)) continue;
        FILE *f = fopen(p, "wb");
        fwrite(text, 1, len, f);
        fclose(f);
        free(text);
    }
    for (int i = 0; i < L->n; i++) {
        free((void *)L->e[i].name);
        free(L->buf[i]);
    }
    free(L);
    return st;
}

/* Prefill logits of a prompt through the CPU engine. */
static int engine_logits(const char *dir, const int32_t *ids, int n, float *logits) {
    tl_engine_params ep = {.model_path = dir,
                           .backend = TL_BACKEND_CPU,
                           .allow_test_shape = 1,
                           .n_threads = 1,
                           .max_seqs = 1,
                           .max_ctx = 64};
    tl_engine *e = NULL;
    tl_session *s = NULL;
    char err[512];
    int st = tl_engine_open(&e, &ep, err, sizeof err);
    if (!st) st = tl_session_open(e, &s, err, sizeof err);
    if (!st) {
        tl_batch_entry be = {.sess = s, .tokens = ids, .n_tok = n, .logits = logits};
        st = tl_engine_step(e, &be, 1, err, sizeof err);
    }
    if (st) fprintf(stderr, "engine on %s: %s\n", dir, err);
    tl_session_close(s);
    tl_engine_close(e);
    return st;
}

static void test_quantized_forward_matches_dequantized(void) {
    const char *in = "tests/data/tiny-a";
    if (access("tests/data/tiny-a/config.json", R_OK)) {
        printf("# fixtures not present\n");
        return;
    }
    char qdir[256], ddir[256], err[512];
    tc_tmpdir(qdir, sizeof qdir, "fq");
    tc_tmpdir(ddir, sizeof ddir, "fd");
    CHECK_EQ_INT(tl_quantize_checkpoint(in, qdir, 4, 64, 0, NULL, err, sizeof err), 0);
    tl_model *h = NULL, *q = NULL;
    CHECK_EQ_INT(tl_model_open(&h, in, err, sizeof err), 0);
    CHECK_EQ_INT(tl_model_open(&q, qdir, err, sizeof err), 0);
    int nv = h ? h->cfg.n_vocab : 0;
    if (h && q) CHECK_EQ_INT(write_dequantized(q, h, in, ddir), 0);
    tl_model_close(h);
    tl_model_close(q);
    if (!nv) return;
    const int32_t ids[6] = {100, 41, 201, 281, 133, 174};
    float *lq = xcalloc((size_t)nv, sizeof *lq), *ld = xcalloc((size_t)nv, sizeof *ld);
    CHECK_EQ_INT(engine_logits(qdir, ids, 6, lq), 0);
    CHECK_EQ_INT(engine_logits(ddir, ids, 6, ld), 0);
    /* Same weight values (s*q+b in f32 both ways); only the order of float operations inside
     * the matvec may differ, so logits agree to f32 rounding (~1e-6 relative). */
    double md = t_max_abs_diff(lq, ld, (size_t)nv), mx = 0;
    for (int i = 0; i < nv; i++) mx = fmax(mx, fabs(ld[i]));
    printf("# 4-bit vs dequantized f32: max |logit diff| %.3g (max |logit| %.3g)\n", md, mx);
    CHECK(mx > 0.1);
    CHECK(md <= 1e-4 * (1 + mx));
    free(lq);
    free(ld);
    tc_rmdir(qdir);
    tc_rmdir(ddir);
}

/* A quantized checkpoint whose config.json disagrees with its tensors is refused by name. */
static void test_mlx_config_mismatch(void) {
    char in[256], out[256], err[512] = "", cp[300];
    tc_tmpdir(in, sizeof in, "mmin");
    tc_tmpdir(out, sizeof out, "mmout");
    tc_opts o = {0};
    CHECK_EQ_INT(tc_write(in, &o), 0);
    CHECK_EQ_INT(tl_quantize_checkpoint(in, out, 4, 64, 0, NULL, err, sizeof err), 0);
    snprintf(cp, sizeof cp, "%s/config.json", out);
    json_t *root = json_load_file(cp, 0, NULL);
    CHECK(root != NULL);
    if (!root) return;
    const char *mod = "language_model.model.layers.2.mlp.gate";
    json_t *q = json_object_get(root, "quantization");
    /* router entry says 4 bits, tensors hold 8 */
    json_object_set_new(json_object_get(q, mod), "bits", json_integer(4));
    json_dump_file(root, cp, 0);
    tl_model *m = NULL;
    CHECK(tl_model_open(&m, out, err, sizeof err) < 0);
    CHECK(strstr(err, "layers.2.mlp.gate.weight") && strstr(err, "8-bit") &&
          strstr(err, ".bits is 4"));
    /* module marked unquantized */
    json_object_set_new(q, mod, json_false());
    json_dump_file(root, cp, 0);
    CHECK(tl_model_open(&m, out, err, sizeof err) < 0);
    CHECK(strstr(err, "layers.2.mlp.gate.weight") && strstr(err, "false"));
    /* no quantization at all */
    json_object_del(root, "quantization");
    json_object_del(root, "quantization_config");
    json_dump_file(root, cp, 0);
    CHECK(tl_model_open(&m, out, err, sizeof err) < 0);
    CHECK(strstr(err, "no \"quantization\"") != NULL);
    CHECK(m == NULL);
    json_decref(root);
    tc_rmdir(in);
    tc_rmdir(out);
}

/* tests/data/tiny-a-mlx was written by mlx-lm's own converter from tiny-a: the loader reads it
 * (unpadded header, so the data is misaligned in the file) and `tulip quantize` of tiny-a writes
 * the very same tensors, byte for byte. */
static void test_matches_mlx_lm_conversion(void) {
    const char *ref = "tests/data/tiny-a-mlx";
    if (access("tests/data/tiny-a-mlx/config.json", R_OK) ||
        access("tests/data/tiny-a/config.json", R_OK)) {
        printf("# fixtures not present\n");
        return;
    }
    char out[256], err[512] = "";
    tc_tmpdir(out, sizeof out, "vsmlx");
    CHECK_EQ_INT(tl_quantize_checkpoint("tests/data/tiny-a", out, 4, 64, 0, NULL, err, sizeof err),
                 0);
    tl_model *r = NULL, *o = NULL;
    int st = tl_model_open(&r, ref, err, sizeof err);
    if (st) fprintf(stderr, "open %s: %s\n", ref, err);
    CHECK_EQ_INT(st, 0);
    CHECK_EQ_INT(tl_model_open(&o, out, err, sizeof err), 0);
    if (r && o) {
        CHECK_EQ_INT(r->format, TL_CKPT_MLX);
        CHECK_EQ_INT(r->n_tensors, o->n_tensors);
        int same = 0;
        for (int i = 0; i < r->n_tensors; i++) {
            const tl_tensor *a = &r->tensors[i], *b = tl_model_find(o, a->name);
            int ok = b && a->dtype == b->dtype && a->ndim == b->ndim && a->nbytes == b->nbytes &&
                     !memcmp(a->shape, b->shape, sizeof a->shape) &&
                     !memcmp(a->data, b->data, a->nbytes);
            if (!ok) fprintf(stderr, "differs from mlx-lm: %s\n", a->name);
            same += ok;
        }
        printf("# %d of %d tensors identical to mlx-lm's conversion\n", same, r->n_tensors);
        CHECK_EQ_INT(same, r->n_tensors);
        CHECK(same > 100);
        CHECK_EQ_INT(r->layers[0].moe_router.bits, 8);
        CHECK_EQ_INT(r->layers[0].exp_down[3].bits, 0); /* ff 32 < group 64: left bf16 */
        CHECK_EQ_INT(r->layers[3].attn_q.bits, 4);
    }
    tl_model_close(r);
    tl_model_close(o);
    tc_rmdir(out);
}

int main(void) {
    T_RUN(test_group_hand_cases);
    T_RUN(test_row_packing_and_bound);
    T_RUN(test_quantize_synthetic);
    T_RUN(test_quantize_fixtures);
    T_RUN(test_quantize_refusals);
    T_RUN(test_quantized_forward_matches_dequantized);
    T_RUN(test_mlx_config_mismatch);
    T_RUN(test_matches_mlx_lm_conversion);
    return t_summary();
}
