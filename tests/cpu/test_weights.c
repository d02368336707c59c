/* tl_model_open on tiny checkpoints written by the test itself (tiny_ckpt.h): every view points
 * at the bytes that were written for it (fused experts split into gate/up halves, per-expert
 * tensors equivalent, RMSNorm1p +1 applied, A_log -> -exp, conv1d [C,1,K] -> [C,K]), and each
 * broken checkpoint gives a non-zero status and a message naming the file/tensor/field. */
#include <math.h>
#include "t_check.h"
#include "tiny_ckpt.h"
#include "model/weights.h"

#define P "model.language_model."

static float mat_at(const tl_mat *m, int r, int c) {
    return tl_load_elem(m->w, m->wtype, (size_t)r * (size_t)m->cols + (size_t)c);
}

/* Every element of a float view equals the written value of `name` at row r0 + r of slice e. */
static int mat_matches(const tl_mat *m, const char *name, size_t base) {
    for (int r = 0; r < m->rows; r++)
        for (int c = 0; c < m->cols; c++)
            if (mat_at(m, r, c) != tc_val(name, base + (size_t)r * m->cols + c)) return 0;
    return 1;
}

static tl_model *open_ok(const char *dir) {
    char err[512] = "";
    tl_model *m = NULL;
    int st = tl_model_open(&m, dir, err, sizeof err);
    if (st) fprintf(stderr, "tl_model_open(%s): %s\n", dir, err);
    CHECK_EQ_INT(st, 0);
    return m;
}

static void check_views(tl_model *m, const char *pre) {
    char n[256];
    const tl_config *c = &m->cfg;
    CHECK_EQ_INT(c->n_embd, TC_EMBD);
    CHECK_EQ_INT(c->n_layer, TC_LAYERS);
    CHECK_EQ_INT(c->n_rot, 4);
    CHECK_EQ_INT(m->format, TL_CKPT_HF);
    snprintf(n, sizeof n, "%sembed_tokens.weight", pre);
    CHECK(mat_matches(&m->tok_embd, n, 0));
    CHECK(mat_matches(&m->output, "lm_head.weight", 0));
    snprintf(n, sizeof n, "%snorm.weight", pre);
    for (int i = 0; i < TC_EMBD; i++) CHECK(m->out_norm[i] == 1.0f + tc_val(n, i));
    for (int il = 0; il < TC_LAYERS; il++) {
        const tl_layer *L = &m->layers[il];
        snprintf(n, sizeof n, "%slayers.%d.input_layernorm.weight", pre, il);
        for (int i = 0; i < TC_EMBD; i++) CHECK(L->attn_norm[i] == 1.0f + tc_val(n, i));
        snprintf(n, sizeof n, "%slayers.%d.post_attention_layernorm.weight", pre, il);
        for (int i = 0; i < TC_EMBD; i++) CHECK(L->ffn_norm[i] == 1.0f + tc_val(n, i));
        if (tc_is_attn(il)) {
            CHECK_EQ_INT(L->kind, TL_LAYER_ATTN);
            snprintf(n, sizeof n, "%slayers.%d.self_attn.q_proj.weight", pre, il);
            CHECK_EQ_INT(L->attn_q.rows, 2 * TC_HEAD * TC_HEAD_DIM);
            CHECK(mat_matches(&L->attn_q, n, 0));
            snprintf(n, sizeof n, "%slayers.%d.self_attn.o_proj.weight", pre, il);
            CHECK_EQ_INT(L->attn_o.cols, TC_HEAD * TC_HEAD_DIM);
            CHECK(mat_matches(&L->attn_o, n, 0));
            snprintf(n, sizeof n, "%slayers.%d.self_attn.k_norm.weight", pre, il);
            for (int i = 0; i < TC_HEAD_DIM; i++) CHECK(L->attn_k_norm[i] == 1.0f + tc_val(n, i));
        } else {
            CHECK_EQ_INT(L->kind, TL_LAYER_GDN);
            snprintf(n, sizeof n, "%slayers.%d.linear_attn.in_proj_qkv.weight", pre, il);
            CHECK(mat_matches(&L->gdn_qkv, n, 0));
            snprintf(n, sizeof n, "%slayers.%d.linear_attn.in_proj_a.weight", pre, il);
            CHECK(mat_matches(&L->gdn_a, n, 0));
            snprintf(n, sizeof n, "%slayers.%d.linear_attn.A_log", pre, il);
            for (int i = 0; i < TC_VH; i++)
                CHECK_CLOSE(L->gdn_a_neg[i], -exp((double)tc_val(n, i)), 0, 1e-6);
            snprintf(n, sizeof n, "%slayers.%d.linear_attn.norm.weight", pre, il);
            for (int i = 0; i < TC_VD; i++) CHECK(L->gdn_norm[i] == tc_val(n, i)); /* plain */
            snprintf(n, sizeof n, "%slayers.%d.linear_attn.dt_bias", pre, il);
            for (int i = 0; i < TC_VH; i++) CHECK(L->gdn_dt_bias[i] == tc_val(n, i));
            snprintf(n, sizeof n, "%slayers.%d.linear_attn.conv1d.weight", pre, il);
            /* [C, 1, K] element (ch, 0, k) -> gdn_conv[ch * K + k] */
            for (int ch = 0; ch < TC_CONV; ch++)
                for (int k = 0; k < TC_CONVK; k++)
                    CHECK(L->gdn_conv[ch * TC_CONVK + k] == tc_val(n, (size_t)ch * TC_CONVK + k));
        }
        snprintf(n, sizeof n, "%slayers.%d.mlp.gate.weight", pre, il);
        CHECK(mat_matches(&L->moe_router, n, 0));
        snprintf(n, sizeof n, "%slayers.%d.mlp.shared_expert_gate.weight", pre, il);
        CHECK_EQ_INT(L->sh_gate_inp.rows, 1);
        CHECK(mat_matches(&L->sh_gate_inp, n, 0));
        snprintf(n, sizeof n, "%slayers.%d.mlp.shared_expert.down_proj.weight", pre, il);
        CHECK(mat_matches(&L->sh_down, n, 0));
        /* fused layout: gate = rows 0..ff-1 of slice e, up = rows ff..2ff-1 */
        char gu[256], dn[256];
        snprintf(gu, sizeof gu, "%slayers.%d.mlp.experts.gate_up_proj", pre, il);
        snprintf(dn, sizeof dn, "%slayers.%d.mlp.experts.down_proj", pre, il);
        for (int e = 0; e < TC_EXP; e++) {
            CHECK_EQ_INT(L->exp_gate[e].rows, TC_FF);
            CHECK_EQ_INT(L->exp_gate[e].cols, TC_EMBD);
            CHECK_EQ_INT(L->exp_down[e].rows, TC_EMBD);
            CHECK_EQ_INT(L->exp_down[e].cols, TC_FF);
            CHECK(mat_matches(&L->exp_gate[e], gu, (size_t)e * 2 * TC_FF * TC_EMBD));
            CHECK(mat_matches(&L->exp_up[e], gu, ((size_t)e * 2 * TC_FF + TC_FF) * TC_EMBD));
            CHECK(mat_matches(&L->exp_down[e], dn, (size_t)e * TC_EMBD * TC_FF));
        }
    }
}

static void test_fused_hf(void) {
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "fused");
    tc_opts o = {0};
    CHECK_EQ_INT(tc_write(dir, &o), 0);
    tl_model *m = open_ok(dir);
    if (m) {
        check_views(m, P);
        CHECK(tl_model_find(m, "mtp.fc.weight") != NULL);
        CHECK(tl_model_find(m, "model.visual.patch_embed.proj.weight") == NULL);
        CHECK(tl_model_find(m, "nope") == NULL);
        CHECK_EQ_INT(m->cfg.n_eos, 1);
        CHECK_EQ_INT(m->cfg.eos_ids[0], 7);
    }
    tl_model_close(m);
    tc_rmdir(dir);
}

static void test_per_expert_equals_fused(void) {
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "perexp");
    tc_opts o = {.per_expert = 1};
    CHECK_EQ_INT(tc_write(dir, &o), 0);
    tl_model *m = open_ok(dir);
    if (m) check_views(m, P); /* the same fused-index expectations hold */
    tl_model_close(m);
    tc_rmdir(dir);
}

static void test_text_only_export(void) {
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "textonly");
    tc_opts o = {.text_only = 1};
    CHECK_EQ_INT(tc_write(dir, &o), 0);
    tl_model *m = open_ok(dir);
    if (m) check_views(m, "model.");
    tl_model_close(m);
    tc_rmdir(dir);
}

/* Writes a checkpoint with opts, opens it, expects failure with all substrings in the message. */
static void expect_fail(const char *tag, const tc_opts *o, const char *s1, const char *s2) {
    char dir[256], err[512] = "";
    tc_tmpdir(dir, sizeof dir, tag);
    CHECK_EQ_INT(tc_write(dir, o), 0);
    tl_model *m = NULL;
    int st = tl_model_open(&m, dir, err, sizeof err);
    CHECK(st < 0);
    CHECK(m == NULL);
    if (s1 && !strstr(err, s1)) fprintf(stderr, "[%s] message lacks '%s': %s\n", tag, s1, err);
    if (s2 && !strstr(err, s2)) fprintf(stderr, "[%s] message lacks '%s': %s\n", tag, s2, err);
    CHECK(!s1 || strstr(err, s1));
    CHECK(!s2 || strstr(err, s2));
    tl_model_close(m);
    tc_rmdir(dir);
}

/* The MTP head (docs/model.md §3.1): every view holds the written values (norms +1, fused
 * experts split, per-expert tensors equivalent). */
static void check_mtp(const tl_model *m) {
    CHECK_EQ_INT(m->has_mtp, 1);
    if (!m->has_mtp) return;
    const tl_mtp *x = &m->mtp;
    for (int i = 0; i < TC_EMBD; i++) {
        CHECK(x->norm_emb[i] == 1.0f + tc_val("mtp.pre_fc_norm_embedding.weight", i));
        CHECK(x->norm_hid[i] == 1.0f + tc_val("mtp.pre_fc_norm_hidden.weight", i));
        CHECK(x->norm[i] == 1.0f + tc_val("mtp.norm.weight", i));
        CHECK(x->layer.attn_norm[i] == 1.0f + tc_val("mtp.layers.0.input_layernorm.weight", i));
    }
    CHECK_EQ_INT(x->fc.rows, TC_EMBD);
    CHECK_EQ_INT(x->fc.cols, 2 * TC_EMBD);
    CHECK(mat_matches(&x->fc, "mtp.fc.weight", 0));
    CHECK_EQ_INT(x->layer.kind, TL_LAYER_ATTN);
    CHECK(mat_matches(&x->layer.attn_q, "mtp.layers.0.self_attn.q_proj.weight", 0));
    CHECK(mat_matches(&x->layer.attn_o, "mtp.layers.0.self_attn.o_proj.weight", 0));
    for (int i = 0; i < TC_HEAD_DIM; i++)
        CHECK(x->layer.attn_q_norm[i] == 1.0f + tc_val("mtp.layers.0.self_attn.q_norm.weight", i));
    CHECK(mat_matches(&x->layer.moe_router, "mtp.layers.0.mlp.gate.weight", 0));
    CHECK(mat_matches(&x->layer.sh_up, "mtp.layers.0.mlp.shared_expert.up_proj.weight", 0));
    const char *gu = "mtp.layers.0.mlp.experts.gate_up_proj",
               *dn = "mtp.layers.0.mlp.experts.down_proj";
    for (int e = 0; e < TC_EXP; e++) {
        CHECK(mat_matches(&x->layer.exp_gate[e], gu, (size_t)e * 2 * TC_FF * TC_EMBD));
        CHECK(mat_matches(&x->layer.exp_up[e], gu, ((size_t)e * 2 * TC_FF + TC_FF) * TC_EMBD));
        CHECK(mat_matches(&x->layer.exp_down[e], dn, (size_t)e * TC_EMBD * TC_FF));
    }
}

static void test_mtp(void) {
    char dir[256];
    for (int per_expert = 0; per_expert < 2; per_expert++) {
        tc_tmpdir(dir, sizeof dir, per_expert ? "mtp-perexp" : "mtp-fused");
        tc_opts o = {.mtp = 1, .per_expert = per_expert};
        CHECK_EQ_INT(tc_write(dir, &o), 0);
        tl_model *m = open_ok(dir);
        if (m) {
            check_views(m, P);
            check_mtp(m);
        }
        tl_model_close(m);
        tc_rmdir(dir);
    }
    /* only mtp.fc (as the tiny fixtures): no head, MTP off, the model loads */
    tc_tmpdir(dir, sizeof dir, "mtp-none");
    tc_opts o = {0};
    CHECK_EQ_INT(tc_write(dir, &o), 0);
    tl_model *m = open_ok(dir);
    if (m) CHECK_EQ_INT(m->has_mtp, 0);
    tl_model_close(m);
    tc_rmdir(dir);
    /* a head with a malformed or missing tensor is an error naming it */
    tc_opts b1 = {.mtp = 1, .bad_shape = "mtp.fc.weight"};
    expect_fail("mtp-shape", &b1, "'mtp.fc.weight': shape [65, 128], expected [64, 128]", NULL);
    tc_opts b2 = {.mtp = 1, .bad_shape = "mtp.layers.0.self_attn.k_proj.weight"};
    expect_fail("mtp-shape2", &b2, "mtp.layers.0.self_attn.k_proj.weight", "expected [32, 64]");
    tc_opts b3 = {.mtp = 1, .omit = "mtp.norm.weight"};
    expect_fail("mtp-miss", &b3, "'mtp.norm.weight' is missing", NULL);
    tc_opts b4 = {.mtp = 1, .per_expert = 1, .omit = "mtp.layers.0.mlp.experts.3.up_proj.weight"};
    expect_fail("mtp-miss2", &b4, "mtp.layers.0.mlp.experts.3.up_proj.weight", "missing");
}

static void test_missing_tensor(void) {
    tc_opts o = {.omit = P "layers.3.self_attn.k_proj.weight"};
    expect_fail("miss", &o, "layers.3.self_attn.k_proj.weight", "missing");
    tc_opts o2 = {.omit = P "layers.1.mlp.experts.down_proj"};
    expect_fail("miss2", &o2, "layers.1.mlp.experts.down_proj", "missing");
    tc_opts o3 = {.omit = P "layers.0.mlp.experts.gate_up_proj"};
    expect_fail("miss3", &o3, "gate_up_proj", "missing");
    tc_opts o4 = {.omit = "lm_head.weight"};
    expect_fail("miss4", &o4, "lm_head.weight", "missing");
}

static void test_wrong_shape(void) {
    tc_opts o = {.bad_shape = P "layers.0.linear_attn.in_proj_z.weight"};
    expect_fail("shape", &o, "in_proj_z.weight", "[33, 64], expected [32, 64]");
    tc_opts o2 = {.bad_shape = P "layers.2.mlp.experts.gate_up_proj"};
    expect_fail("shape2", &o2, "gate_up_proj", "expected [4, 32, 64]");
    tc_opts o3 = {.bad_shape = P "layers.3.self_attn.q_norm.weight"};
    expect_fail("shape3", &o3, "q_norm.weight", "model.safetensors");
}

static void test_wrong_dtype(void) {
    tc_opts o = {.bad_dtype = P "layers.0.linear_attn.out_proj.weight"};
    expect_fail("dtype", &o, "out_proj.weight", "dtype I32");
    tc_opts o2 = {.bad_dtype = P "layers.1.linear_attn.A_log"};
    expect_fail("dtype2", &o2, "A_log", "dtype I32");
}

static void test_norm_offset_refused(void) {
    tc_opts o = {.add_offset = 1};
    expect_fail("offset", &o, "zero-centred", "average");
    /* the diagnostic switch loads it anyway (and then the +1 is applied once more) */
    char dir[256], err[512] = "";
    tc_tmpdir(dir, sizeof dir, "offset-skip");
    CHECK_EQ_INT(tc_write(dir, &o), 0);
    setenv("TL_NORM_CHECK", "0", 1);
    tl_model *m = NULL;
    CHECK_EQ_INT(tl_model_open(&m, dir, err, sizeof err), 0);
    unsetenv("TL_NORM_CHECK");
    if (m) CHECK(m->out_norm[0] > 1.5f);
    tl_model_close(m);
    tc_rmdir(dir);
}

static void test_missing_config_field(void) {
    tc_opts o = {.config_override = "{\"text_config\": {\"hidden_size\": 64}}"};
    expect_fail("cfg", &o, "config.json", "text_config.num_hidden_layers");
}

static void test_no_files(void) {
    char dir[256], err[512] = "";
    tc_tmpdir(dir, sizeof dir, "nofiles");
    tc_opts o = {0};
    tc_config(dir, &o);
    tl_model *m = NULL;
    CHECK(tl_model_open(&m, dir, err, sizeof err) < 0);
    CHECK(strstr(err, "model.safetensors") != NULL);
    tc_rmdir(dir);
}

/* Splits the tiny checkpoint over two shards with an index; then breaks the index. */
static void write_index(const char *dir, const char *body) {
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(p, "w");
    fputs(body, f);
    fclose(f);
}

static void test_sharded(void) {
    char dir[256], err[512] = "", p[512], q[512];
    tc_tmpdir(dir, sizeof dir, "shard");
    tc_opts o = {0};
    CHECK_EQ_INT(tc_write(dir, &o), 0);
    /* shard 1 = the whole file renamed; shard 2 = one extra tensor */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(q, sizeof q, "%s/model-00001-of-00002.safetensors", dir);
    CHECK_EQ_INT(rename(p, q), 0);
    float extra[2] = {1, 2};
    tl_st_entry e = {
        .name = "mtp.extra", .dtype = TL_DT_F32, .ndim = 1, .shape = {2}, .data = extra};
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    CHECK_EQ_INT(tl_st_write(p, &e, 1, err, sizeof err), 0);
    write_index(dir, "{\"metadata\": {}, \"weight_map\": {\"lm_head.weight\": "
                     "\"model-00001-of-00002.safetensors\", \"mtp.extra\": "
                     "\"model-00002-of-00002.safetensors\"}}");
    tl_model *m = open_ok(dir);
    if (m) {
        check_views(m, P);
        const tl_tensor *t = tl_model_find(m, "mtp.extra");
        CHECK(t && t->dtype == TL_DT_F32 && tl_load_elem(t->data, t->dtype, 1) == 2.0f);
    }
    tl_model_close(m);

    /* a tensor the index places in a file that lacks it */
    write_index(dir, "{\"weight_map\": {\"lm_head.weight\": \"model-00002-of-00002.safetensors\", "
                     "\"mtp.extra\": \"model-00001-of-00002.safetensors\"}}");
    m = NULL;
    CHECK(tl_model_open(&m, dir, err, sizeof err) < 0);
    CHECK(strstr(err, "index.json") && strstr(err, "does not contain"));
    /* bad JSON, missing weight_map, shard missing, path escaping the directory */
    write_index(dir, "{\"weight_map\": {\"lm_head.weight\": ");
    CHECK(tl_model_open(&m, dir, err, sizeof err) < 0);
    CHECK(strstr(err, "index.json") && strstr(err, "bad JSON"));
    write_index(dir, "{\"metadata\": {}}");
    CHECK(tl_model_open(&m, dir, err, sizeof err) < 0);
    CHECK(strstr(err, "weight_map") != NULL);
    write_index(dir,
                "{\"weight_map\": {\"lm_head.weight\": \"model-00009-of-00009.safetensors\"}}");
    CHECK(tl_model_open(&m, dir, err, sizeof err) < 0);
    CHECK(strstr(err, "model-00009-of-00009.safetensors") != NULL);
    write_index(dir, "{\"weight_map\": {\"lm_head.weight\": \"../../etc/passwd\"}}");
    CHECK(tl_model_open(&m, dir, err, sizeof err) < 0);
    CHECK(strstr(err, "weight_map['lm_head.weight']") != NULL);
    write_index(dir, "{\"weight_map\": {\"lm_head.weight\": 3}}");
    CHECK(tl_model_open(&m, dir, err, sizeof err) < 0);
    CHECK(strstr(err, "weight_map['lm_head.weight']") != NULL);
    /* the same tensor in two shards */
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    e.name = "lm_head.weight";
    e.dtype = TL_DT_BF16;
    e.ndim = 2;
    e.shape[0] = TC_VOCAB;
    e.shape[1] = TC_EMBD;
    uint16_t *z = xcalloc(TC_VOCAB * TC_EMBD, 2);
    e.data = z;
    CHECK_EQ_INT(tl_st_write(p, &e, 1, err, sizeof err), 0);
    free(z);
    write_index(dir,
                "{\"weight_map\": {\"lm_head.weight\": \"model-00002-of-00002.safetensors\", "
                "\"model.language_model.norm.weight\": \"model-00001-of-00002.safetensors\"}}");
    CHECK(tl_model_open(&m, dir, err, sizeof err) < 0);
    CHECK(strstr(err, "lm_head.weight") && strstr(err, "both"));
    CHECK(m == NULL);
    tc_rmdir(dir);
}

/* The transformers-made fixtures (tools/make_fixtures.py), when present. */
static void test_fixtures(void) {
    const char *dirs[] = {"tests/data/tiny-a", "tests/data/tiny-b"};
    for (int i = 0; i < 2; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/config.json", dirs[i]);
        if (access(p, R_OK)) {
            printf("# %s not present yet\n", dirs[i]);
            continue;
        }
        tl_model *m = open_ok(dirs[i]);
        if (!m) continue;
        CHECK_EQ_INT(m->format, TL_CKPT_HF);
        CHECK(m->cfg.n_layer > 0);
        CHECK(tl_model_find(m, "mtp.fc.weight") != NULL);
        CHECK(tl_model_find(m, "model.visual.patch_embed.proj.weight") == NULL);
        /* generation_config.json adds its eos list to config's */
        CHECK(m->cfg.n_eos >= 2);
        const tl_tensor *nw = tl_model_find(m, "model.language_model.norm.weight");
        CHECK(nw != NULL);
        for (int j = 0; nw && j < m->cfg.n_embd; j++)
            CHECK(m->out_norm[j] == 1.0f + tl_load_elem(nw->data, nw->dtype, (size_t)j));
        for (int il = 0; il < m->cfg.n_layer; il++) {
            const tl_layer *L = &m->layers[il];
            char n[256];
            int ff = m->cfg.n_ff_expert, d = m->cfg.n_embd;
            snprintf(n, sizeof n, "model.language_model.layers.%d.mlp.experts.gate_up_proj", il);
            const tl_tensor *gu = tl_model_find(m, n);
            snprintf(n, sizeof n, "model.language_model.layers.%d.mlp.experts.1.up_proj.weight",
                     il);
            const tl_tensor *up1 = tl_model_find(m, n);
            CHECK(gu || up1);
            if (gu) /* expert 1's up half starts at row 2ff + ff of the fused tensor */
                CHECK((const char *)L->exp_up[1].w ==
                      (const char *)gu->data + (size_t)(3 * ff) * d * 2);
            if (up1) CHECK(L->exp_up[1].w == up1->data);
            CHECK(L->exp_gate && L->exp_up && L->exp_down);
            CHECK(L->attn_norm && L->ffn_norm);
            if (L->kind == TL_LAYER_GDN) CHECK(L->gdn_a_neg[0] < 0);
        }
        tl_model_close(m);
    }
}

int main(void) {
    T_RUN(test_fused_hf);
    T_RUN(test_per_expert_equals_fused);
    T_RUN(test_text_only_export);
    T_RUN(test_missing_tensor);
    T_RUN(test_wrong_shape);
    T_RUN(test_wrong_dtype);
    T_RUN(test_norm_offset_refused);
    T_RUN(test_missing_config_field);
    T_RUN(test_no_files);
    T_RUN(test_sharded);
    T_RUN(test_fixtures);
    T_RUN(test_mtp);
    return t_summary();
}
