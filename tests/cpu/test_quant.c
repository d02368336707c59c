/* MLX affine quantization: the group formula on hand-worked cases, the packing layout, the
 * error bound, and `tulip quantize` end to end (HF checkpoint -> MLX checkpoint -> loader):
 * every dequantized weight is within the bound of the original, norms/conv/A_log carried over,
 * router and shared_expert_gate at 8 bits. */
#include <math.h>
#include <unistd.h>
#include "t_check.h"
#include "tiny_ckpt.h"
#include "model/quant.h"
#include "model/weights.h"

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
        tl_mat m = {.w = w, .scales = s, .biases = b, .wtype = TL_DT_U32, .stype = TL_DT_BF16,
                    .bits = 4, .group = G, .rows = 1, .cols = N};
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
            if (bound > 0 && fabs(got - want) / bound > *max_rel) *max_rel = fabs(got - want) / bound;
        }
    return ok;
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
    for (int i = 0; i < c->n_embd; i++) CHECK(q->out_norm[i] == h->out_norm[i]);
    for (int il = 0; il < c->n_layer; il++) {
        const tl_layer *a = &h->layers[il], *b = &q->layers[il];
        CHECK_EQ_INT(b->kind, a->kind);
        for (int i = 0; i < c->n_embd; i++) CHECK(a->attn_norm[i] == b->attn_norm[i]);
        for (int i = 0; i < c->n_embd; i++) CHECK(a->ffn_norm[i] == b->ffn_norm[i]);
        if (a->kind == TL_LAYER_ATTN) {
            CHECK(mat_close(&b->attn_q, &a->attn_q, &mr));
            CHECK(mat_close(&b->attn_k, &a->attn_k, &mr));
            CHECK(mat_close(&b->attn_v, &a->attn_v, &mr));
            CHECK(mat_close(&b->attn_o, &a->attn_o, &mr));
            for (int i = 0; i < c->head_dim; i++) CHECK(a->attn_q_norm[i] == b->attn_q_norm[i]);
            for (int i = 0; i < c->head_dim; i++) CHECK(a->attn_k_norm[i] == b->attn_k_norm[i]);
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
        CHECK(tl_model_find(q, "mtp.fc.weight") == NULL); /* MLX drops MTP */
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

int main(void) {
    T_RUN(test_group_hand_cases);
    T_RUN(test_row_packing_and_bound);
    T_RUN(test_quantize_synthetic);
    T_RUN(test_quantize_fixtures);
    T_RUN(test_quantize_refusals);
    return t_summary();
}
