/* The whole model on the GPU backend against the CPU oracle (cpu_forward), on random models built
 * in memory in the checkpoint formats the loader produces (BF16, MLX 4-bit g64): a small one with
 * the production per-head / per-expert dims and fewer heads, experts, layers and vocabulary, and
 * a full-width one (every production width: 2048 hidden, 16/2 attention heads, 16/32 GDN heads,
 * 512 expert FFN; 4 layers, 16 experts, 4096 vocabulary). Also: chunked prefill == token by
 * token, determinism (same prompt twice, graph replay vs eager), batched == alone, seeded
 * sampling, context-full errors.
 *
 * Tolerance: the oracle keeps the KV cache in fp32, the GPU in bf16 (docs/architecture.md §8): K
 * and V rounded to 8 mantissa bits (relative error <= 2^-9) move the logits by NMSE 3.5e-7..7.2e-7
 * on these 4-layer models (measured on the H200, 2026-12-02; every single kernel alone agrees to
 * ~1e-14, tests/gpu/test_kernels.c). docs/developing.md §3 starts the tiny e2e check at 1e-6 and
 * allows 1e-4 for bf16 KV attention; we use 5e-6 (~7x the measured spread) and require identical
 * greedy tokens whenever the oracle's top-2 margin exceeds 1e-3 (otherwise a near-tie). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "gpu_util.h"
#include "engine/backend.h"
#include "engine/prefix_cache.h"
#include "engine/sample.h"
#include "model/shape.h"

static unsigned long long rs = 0xfeedbeefcafef00dull;

typedef struct rmodel {
    tl_model m;
    hmat mats[64 * 16];
    int n_mats;
    hmat *ex_g, *ex_u, *ex_d; /* per layer n_expert */
    tl_mat *views;
    float *vecs[64 * 16];
    int n_vecs;
} rmodel;

static hmat *rm_mat(rmodel *r, int rows, int cols, int bits, float amp) {
    hmat *h = &r->mats[r->n_mats++];
    hmat_random(h, rows, cols, bits, amp, &rs);
    return h;
}
static float *rm_vec(rmodel *r, size_t n, float base, float amp) {
    float *v = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = base + amp * t_randf(&rs);
    r->vecs[r->n_vecs++] = v;
    return v;
}

static void rm_layer(rmodel *r, tl_layer *L, int il, tl_layer_kind kind, int bits);

static void rm_build(rmodel *r, int full, int bits) {
    memset(r, 0, sizeof *r);
    tl_config *c = &r->m.cfg;
    c->n_embd = full ? TL_N_EMBD : 256;
    c->n_layer = 4;
    c->n_vocab = full ? 4096 : 1024;
    c->n_head = full ? TL_N_HEAD : 4;
    c->n_head_kv = TL_N_HEAD_KV;
    c->head_dim = TL_HEAD_DIM;
    c->n_rot = TL_N_ROT;
    c->rope_theta = TL_ROPE_THETA;
    c->gdn_n_k_head = full ? TL_GDN_N_K_HEAD : 4;
    c->gdn_n_v_head = full ? TL_GDN_N_V_HEAD : 8;
    c->gdn_k_dim = TL_GDN_K_DIM;
    c->gdn_v_dim = TL_GDN_V_DIM;
    c->gdn_conv_k = TL_GDN_CONV_K;
    c->n_expert = 16;
    c->n_expert_used = full ? TL_N_EXPERT_USED : 4;
    c->n_ff_expert = c->n_ff_shared = TL_N_FF_EXPERT;
    c->rms_eps = TL_RMS_EPS;
    c->max_pos = TL_MAX_POS;
    for (int il = 0; il < c->n_layer; il++)
        c->layer_kind[il] = (il + 1) % 4 == 0 ? TL_LAYER_ATTN : TL_LAYER_GDN;
    int D = c->n_embd, E = c->n_expert;
    r->m.tok_embd = rm_mat(r, c->n_vocab, D, bits, 0.5f)->m;
    r->m.output = rm_mat(r, c->n_vocab, D, bits, 0.1f)->m;
    r->m.out_norm = rm_vec(r, D, 1.0f, 0.2f);
    /* experts of n_layer layers and of the MTP head's block (rm_add_mtp) */
    r->ex_g = xcalloc((size_t)(c->n_layer + 1) * E, sizeof(hmat));
    r->ex_u = xcalloc((size_t)(c->n_layer + 1) * E, sizeof(hmat));
    r->ex_d = xcalloc((size_t)(c->n_layer + 1) * E, sizeof(hmat));
    r->views = xcalloc((size_t)(c->n_layer + 1) * 3 * E, sizeof(tl_mat));
    for (int il = 0; il < c->n_layer; il++)
        rm_layer(r, &r->m.layers[il], il, c->layer_kind[il], bits);
}

/* One random layer of kind `kind` into L (its experts in slot il of r's expert arrays). */
static void rm_layer(rmodel *r, tl_layer *L, int il, tl_layer_kind kind, int bits) {
    const tl_config *c = &r->m.cfg;
    int D = c->n_embd, E = c->n_expert, F = c->n_ff_expert, nv = c->gdn_n_v_head;
    int conv = tl_config_gdn_conv_dim(c), val = tl_config_gdn_val_dim(c);
    float a = 0.08f;
    L->kind = kind;
    L->attn_norm = rm_vec(r, D, 1.0f, 0.2f);
    L->ffn_norm = rm_vec(r, D, 1.0f, 0.2f);
    if (L->kind == TL_LAYER_GDN) {
        L->gdn_qkv = rm_mat(r, conv, D, bits, a)->m;
        L->gdn_z = rm_mat(r, val, D, bits, a)->m;
        L->gdn_b = rm_mat(r, nv, D, bits, a)->m;
        L->gdn_a = rm_mat(r, nv, D, bits, a)->m;
        L->gdn_conv = rm_vec(r, (size_t)conv * 4, 0.0f, 0.5f);
        L->gdn_dt_bias = rm_vec(r, nv, 1.0f, 0.5f);
        L->gdn_a_neg = rm_vec(r, nv, -8.0f, 7.0f);
        L->gdn_norm = rm_vec(r, 128, 1.0f, 0.2f);
        L->gdn_out = rm_mat(r, D, val, bits, a)->m;
    } else {
        L->attn_q = rm_mat(r, c->n_head * 512, D, bits, a)->m;
        L->attn_k = rm_mat(r, c->n_head_kv * 256, D, bits, a)->m;
        L->attn_v = rm_mat(r, c->n_head_kv * 256, D, bits, a)->m;
        L->attn_o = rm_mat(r, D, c->n_head * 256, bits, a)->m;
        L->attn_q_norm = rm_vec(r, 256, 1.0f, 0.2f);
        L->attn_k_norm = rm_vec(r, 256, 1.0f, 0.2f);
    }
    L->moe_router = rm_mat(r, E, D, 0, 0.3f)->m;
    L->sh_gate_inp = rm_mat(r, 1, D, 0, a)->m;
    L->sh_gate = rm_mat(r, F, D, bits, a)->m;
    L->sh_up = rm_mat(r, F, D, bits, a)->m;
    L->sh_down = rm_mat(r, D, F, bits, a)->m;
    tl_mat *vg = r->views + (size_t)il * 3 * E, *vu = vg + E, *vd = vu + E;
    for (int e = 0; e < E; e++) {
        hmat *hg = &r->ex_g[il * E + e], *hu = &r->ex_u[il * E + e], *hd = &r->ex_d[il * E + e];
        hmat_random(hg, F, D, bits, a, &rs);
        hmat_random(hu, F, D, bits, a, &rs);
        hmat_random(hd, D, F, bits, a, &rs);
        vg[e] = hg->m, vu[e] = hu->m, vd[e] = hd->m;
    }
    L->exp_gate = vg, L->exp_up = vu, L->exp_down = vd;
}

static void rm_free(rmodel *r) {
    for (int i = 0; i < r->n_mats; i++) hmat_free(&r->mats[i]);
    int n = (r->m.cfg.n_layer + 1) * r->m.cfg.n_expert;
    for (int i = 0; i < n; i++)
        hmat_free(&r->ex_g[i]), hmat_free(&r->ex_u[i]), hmat_free(&r->ex_d[i]);
    for (int i = 0; i < r->n_vecs; i++) free(r->vecs[i]);
    free(r->ex_g), free(r->ex_u), free(r->ex_d), free(r->views);
}

static tl_backend *open_be_kv(const tl_model *m, int max_seqs, int max_ctx, long kv_tokens) {
    tl_cuda_params p = {
        .max_seqs = max_seqs, .max_ctx = max_ctx, .kv_tokens = kv_tokens, .weight_bits = 16};
    tl_backend *b = NULL;
    char err[512] = "";
    int st = tl_backend_cuda_open(&b, m, NULL, &p, err, sizeof err);
    if (st) printf("# backend open failed: %s\n", err);
    CHECK_EQ_INT(st, 0);
    return b;
}

static tl_backend *open_be(const tl_model *m, int max_seqs, int max_ctx) {
    return open_be_kv(m, max_seqs, max_ctx, 0);
}

/* One forward of one entry; logits out (if non-NULL); returns the status. */
static int fwd1(tl_backend *b, int slot, int pos, const int32_t *tok, int n, float *logits) {
    tl_fwd_entry e;
    memset(&e, 0, sizeof e);
    e.slot = slot, e.pos = pos, e.tokens = tok, e.n_tok = n, e.logits = logits;
    char err[256] = "";
    int st = b->forward(b, &e, 1, err, sizeof err);
    if (st) printf("# forward: %s\n", err);
    return st;
}

static int argmax_margin(const float *l, int n, float *margin) {
    int b = 0, s = -1;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    for (int i = 0; i < n; i++)
        if (i != b && (s < 0 || l[i] > l[s])) s = i;
    *margin = l[b] - l[s];
    return b;
}

/* Prefill a prompt then n_steps greedy steps on GPU and CPU; compare logits and tokens. */
static void e2e_case(int full, int bits, int n_steps) {
    rmodel r;
    rm_build(&r, full, bits);
    const tl_config *c = &r.m.cfg;
    int V = c->n_vocab, max_ctx = 128;
    tl_backend *b = open_be(&r.m, 2, max_ctx);
    if (!b) {
        rm_free(&r);
        return;
    }
    cpu_state st;
    CHECK_EQ_INT(cpu_state_init(&st, c, max_ctx), 0);
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = (int32_t)(t_rng_next(&rs) % V);
    float *lg = xmalloc(sizeof(float) * V), *lc = xmalloc(sizeof(float) * V);
    CHECK_EQ_INT(fwd1(b, 1, 0, prompt, 12, lg), 0);
    CHECK_EQ_INT(cpu_forward(&r.m, &st, prompt, 12, lc, NULL), 0);
    double worst = t_nmse(lg, lc, V), first = worst;
    /* Routing near-ties: where the oracle's k-th and (k+1)-th router logits are closer than
     * TIE, any rounding difference may pick the other expert (random 16-expert MoE layers are
     * chaotic), and the residual stream carries that difference into every later step. Logits are
     * held to the bound on the steps before the first such tie; there must be at least half of
     * the steps before it, so a tie cannot hide an error. */
    const float TIE = 3e-4f; /* measured 2026-12-02: a 1.1e-4 gap flipped (small q4, step
                                32), 5.2e-4 did not (small bf16, step 9) */
    int tie_step = st.route_gap < TIE ? -1 : n_steps;
    double worst_pre = tie_step < 0 ? 0.0 : worst;
    float min_gap = st.route_gap;
    int pos = 12, mismatch = 0, decided = 0, first_bad = -1;
    for (int s = 0; s < n_steps; s++) {
        float margin;
        int tc = argmax_margin(lc, V, &margin);
        /* greedy on the device */
        tl_fwd_entry e;
        memset(&e, 0, sizeof e);
        tl_sample_params sp;
        memset(&sp, 0, sizeof sp);
        sp.top_p = 1.0f, sp.repetition_penalty = 1.0f;
        tl_sample_out so;
        uint64_t rng = 7;
        int32_t tok = tc;
        e.slot = 1, e.pos = pos, e.tokens = &tok, e.n_tok = 1, e.logits = lg, e.sample = &sp,
        e.rng = &rng, e.out = &so;
        char err[256];
        CHECK_EQ_INT(b->forward(b, &e, 1, err, sizeof err), 0);
        CHECK_EQ_INT(cpu_forward(&r.m, &st, &tok, 1, lc, NULL), 0);
        pos++;
        double nm = t_nmse(lg, lc, V);
        if (nm > worst || nm != nm) worst = nm;
        if (st.route_gap < min_gap) min_gap = st.route_gap;
        if (tie_step == n_steps && st.route_gap < TIE) tie_step = s;
        if (s < tie_step && (nm > worst_pre || nm != nm)) worst_pre = nm;
        if (first_bad < 0 && !(nm <= 5e-6)) first_bad = s;
        float m2;
        int tc2 = argmax_margin(lc, V, &m2);
        if (m2 > 1e-3f) {
            decided++;
            if (so.token != tc2) mismatch++;
        }
    }
    printf("# e2e %s %s: %d steps, worst logits nmse %.3e (after the prompt %.3e), greedy decided "
           "%d, mismatches %d\n",
           full ? "full-width" : "small", bits ? "q4" : "bf16", n_steps, worst, first, decided,
           mismatch);
    printf("#   smallest routing gap %.2e; first routing near-tie (< %.0e) at step %d; worst nmse "
           "before it %.3e%s\n",
           min_gap, TIE, tie_step, worst_pre, first_bad >= 0 ? "" : " (no step over 5e-6)");
    if (first_bad >= 0) printf("#   first decode step over 5e-6: %d\n", first_bad);
    CHECK(worst_pre <= 5e-6);
    CHECK(tie_step >= n_steps / 2);
    CHECK_EQ_INT(mismatch, 0);
    CHECK(decided >= n_steps / 2);
    b->close(b);
    cpu_state_free(&st);
    free(lg), free(lc);
    rm_free(&r);
}

static void test_e2e_small_bf16(void) { e2e_case(0, 0, 40); }
static void test_e2e_small_q4(void) { e2e_case(0, 4, 40); }
static void test_e2e_fullwidth_bf16(void) { e2e_case(1, 0, 33); }
static void test_e2e_fullwidth_q4(void) { e2e_case(1, 4, 33); }

/* The paged KV pool: a pool of 3 pages (192 tokens) for 3 slots. A step that needs more pages
 * than are free fails with TL_ERR_CONTEXT_FULL and changes nothing; a reset slot's pages go back
 * to the pool; a sequence on reused pages (holding another sequence's stale keys, in another
 * order) gives the same logits bit for bit as on a fresh backend with a full pool. */
static void test_kv_pool(void) {
    rmodel r;
    rm_build(&r, 0, 4);
    int V = r.m.cfg.n_vocab, n = 126;
    tl_backend *bp = open_be_kv(&r.m, 3, 256, 3 * 64), *bf = open_be(&r.m, 3, 256);
    if (!bp || !bf) {
        if (bp) bp->close(bp);
        if (bf) bf->close(bf);
        rm_free(&r);
        return;
    }
    int32_t a[130], bt[130];
    unsigned long long prs =
        0x5eed0001ull; /* own stream: the later tests' inputs stay as calibrated */
    for (int i = 0; i < 130; i++)
        a[i] = (int32_t)(t_rng_next(&prs) % V), bt[i] = (int32_t)(t_rng_next(&prs) % V);
    float *lp = xmalloc(sizeof(float) * V), *lf = xmalloc(sizeof(float) * V);
    CHECK_EQ_INT(fwd1(bp, 0, 0, a, n, lp), 0);                    /* 2 of 3 pages */
    CHECK_EQ_INT(fwd1(bp, 1, 0, bt, n, lp), TL_ERR_CONTEXT_FULL); /* needs 2, 1 free */
    CHECK_EQ_INT(fwd1(bp, 2, 0, a, 64, NULL), 0);                 /* the last page */
    CHECK_EQ_INT(fwd1(bp, 2, 64, a + 64, 1, NULL), TL_ERR_CONTEXT_FULL);
    CHECK_EQ_INT(bp->reset_slot(bp, 0), 0);
    CHECK_EQ_INT(bp->reset_slot(bp, 2), 0);
    int same = 1;
    CHECK_EQ_INT(fwd1(bp, 1, 0, bt, n, lp), 0);
    CHECK_EQ_INT(fwd1(bf, 1, 0, bt, n, lf), 0);
    same &= !memcmp(lp, lf, sizeof(float) * V);
    for (int s = 0; s < 4; s++) { /* positions 126..129: the third page is taken at 128 */
        CHECK_EQ_INT(fwd1(bp, 1, n + s, bt + n + s, 1, lp), 0);
        CHECK_EQ_INT(fwd1(bf, 1, n + s, bt + n + s, 1, lf), 0);
        same &= !memcmp(lp, lf, sizeof(float) * V);
    }
    printf("# kv pool of 3 pages: full -> CONTEXT_FULL, reused pages == fresh backend bit for bit: "
           "%s\n",
           same ? "yes" : "NO");
    CHECK(same);
    bp->close(bp), bf->close(bf);
    free(lp), free(lf);
    rm_free(&r);
}

/* Chunked prefill (micro-batches of 16 tokens) then decode == the same tokens one by one. */
static void test_prefill_chunked_eq_tokenwise(void) {
    rmodel r;
    rm_build(&r, 0, 4);
    int V = r.m.cfg.n_vocab, n = 37;
    setenv("TL_CUDA_MAX_TOK", "16", 1);
    tl_backend *b = open_be(&r.m, 2, 128);
    unsetenv("TL_CUDA_MAX_TOK");
    if (!b) {
        rm_free(&r);
        return;
    }
    int32_t tok[48];
    for (int i = 0; i < 48; i++) tok[i] = (int32_t)(t_rng_next(&rs) % V);
    float *la = xmalloc(sizeof(float) * V), *lb = xmalloc(sizeof(float) * V);
    CHECK_EQ_INT(fwd1(b, 0, 0, tok, n, la), 0);
    for (int i = 0; i < n; i++) CHECK_EQ_INT(fwd1(b, 1, i, tok + i, 1, i == n - 1 ? lb : NULL), 0);
    /* the GDN and conv recurrences run token by token in both cases; only the attention split
     * count and the GEMV token tiles (lane split RS=1 for one token, RS=2 for tiles) differ, i.e.
     * fp32 summation order, ~1e-13 per kernel; a K/V value that lands on a bf16 rounding boundary
     * then flips one ulp (2^-9), which is what the logits show: NMSE 1.9e-10 measured (H200,
     * 2026-12-02). 1e-8 leaves 50x. */
    check_nmse("chunked vs tokenwise prefill", la, lb, V, 1e-8);
    for (int s = 0; s < 5; s++) {
        CHECK_EQ_INT(fwd1(b, 0, n + s, tok + n + s, 1, la), 0);
        CHECK_EQ_INT(fwd1(b, 1, n + s, tok + n + s, 1, lb), 0);
    }
    check_nmse("... then 5 decode steps", la, lb, V, 1e-8);
    b->close(b);
    free(la), free(lb);
    rm_free(&r);
}

/* Same prompt twice -> bit-identical logits; graph replay == eager launches, bit for bit. */
static void test_determinism(void) {
    rmodel r;
    rm_build(&r, 0, 4);
    int V = r.m.cfg.n_vocab;
    tl_backend *b = open_be(&r.m, 2, 128);
    setenv("TL_CUDA_NO_GRAPH", "1", 1);
    tl_backend *be = open_be(&r.m, 2, 128);
    unsetenv("TL_CUDA_NO_GRAPH");
    if (!b || !be) {
        rm_free(&r);
        return;
    }
    int32_t tok[30];
    for (int i = 0; i < 30; i++) tok[i] = (int32_t)(t_rng_next(&rs) % V);
    float *l1 = xmalloc(sizeof(float) * V * 10), *l2 = xmalloc(sizeof(float) * V * 10),
          *l3 = xmalloc(sizeof(float) * V * 10);
    for (int run = 0; run < 3; run++) {
        tl_backend *x = run == 2 ? be : b;
        float *l = run == 0 ? l1 : run == 1 ? l2 : l3;
        CHECK_EQ_INT(x->reset_slot(x, 0), 0);
        CHECK_EQ_INT(fwd1(x, 0, 0, tok, 20, l), 0);
        for (int s = 1; s < 10; s++)
            CHECK_EQ_INT(fwd1(x, 0, 19 + s, tok + 19 + s, 1, l + (size_t)s * V), 0);
    }
    CHECK(memcmp(l1, l2, sizeof(float) * V * 10) == 0);
    CHECK(memcmp(l1, l3, sizeof(float) * V * 10) == 0);
    b->close(b), be->close(be);
    free(l1), free(l2), free(l3);
    rm_free(&r);
}

/* Decode steps of three sequences batched == each alone; a batched prefill of the three prompts
 * == each alone. Per token the kernels compute the same sums; only the GEMV lane split of a token
 * tile (RS=2) vs a lone token (RS=1) changes the fp32 order for K % 1024 == 0 matrices, so the
 * bound is the one of test_prefill_chunked_eq_tokenwise (1e-8). */
static void test_batched_eq_alone(void) {
    rmodel r;
    rm_build(&r, 0, 0);
    int V = r.m.cfg.n_vocab;
    tl_backend *b = open_be(&r.m, 3, 128);
    if (!b) {
        rm_free(&r);
        return;
    }
    int len[3] = {5, 17, 9};
    int32_t tok[3][40];
    for (int q = 0; q < 3; q++)
        for (int i = 0; i < 40; i++) tok[q][i] = (int32_t)(t_rng_next(&rs) % V);
    float *alone = xmalloc(sizeof(float) * V * 3 * 6), *bat = xmalloc(sizeof(float) * V * 3 * 6);
    char err[256];
    for (int pass = 0; pass < 2; pass++) {
        float *out = pass ? bat : alone;
        for (int q = 0; q < 3; q++) {
            CHECK_EQ_INT(b->reset_slot(b, q), 0);
            CHECK_EQ_INT(fwd1(b, q, 0, tok[q], len[q], out + (size_t)(q * 6) * V), 0);
        }
        for (int s = 1; s < 6; s++) {
            if (!pass) {
                for (int q = 0; q < 3; q++)
                    CHECK_EQ_INT(fwd1(b, q, len[q] + s - 1, &tok[q][len[q] + s - 1], 1,
                                      out + (size_t)(q * 6 + s) * V),
                                 0);
            } else {
                tl_fwd_entry e[3];
                memset(e, 0, sizeof e);
                for (int q = 0; q < 3; q++) {
                    e[q].slot = q, e[q].pos = len[q] + s - 1, e[q].tokens = &tok[q][len[q] + s - 1];
                    e[q].n_tok = 1, e[q].logits = out + (size_t)(q * 6 + s) * V;
                }
                CHECK_EQ_INT(b->forward(b, e, 3, err, sizeof err), 0);
            }
        }
    }
    check_nmse("batched decode vs alone", bat, alone, (size_t)V * 3 * 6, 1e-8);
    /* batched prefill */
    tl_fwd_entry e[3];
    memset(e, 0, sizeof e);
    float *pb = xmalloc(sizeof(float) * V * 3);
    for (int q = 0; q < 3; q++) {
        CHECK_EQ_INT(b->reset_slot(b, q), 0);
        e[q].slot = q, e[q].pos = 0, e[q].tokens = tok[q], e[q].n_tok = len[q],
        e[q].logits = pb + (size_t)q * V;
    }
    CHECK_EQ_INT(b->forward(b, e, 3, err, sizeof err), 0);
    for (int q = 0; q < 3; q++)
        check_nmse("batched prefill vs alone", pb + (size_t)q * V, alone + (size_t)(q * 6) * V, V,
                   1e-8);
    b->close(b);
    free(alone), free(bat), free(pb);
    rm_free(&r);
}

/* Device sampling through the backend: the same rng state gives the same tokens; the rng
 * advances; a context overflow is refused without touching the state. */
static void test_sampling_and_errors(void) {
    rmodel r;
    rm_build(&r, 0, 4);
    int V = r.m.cfg.n_vocab;
    tl_backend *b = open_be(&r.m, 1, 64);
    if (!b) {
        rm_free(&r);
        return;
    }
    int32_t prompt[8];
    for (int i = 0; i < 8; i++) prompt[i] = (int32_t)(t_rng_next(&rs) % V);
    int32_t gen[2][16];
    uint64_t rng_end[2];
    for (int run = 0; run < 2; run++) {
        CHECK_EQ_INT(b->reset_slot(b, 0), 0);
        uint64_t rng = 12345;
        tl_sample_params sp;
        memset(&sp, 0, sizeof sp);
        sp.temperature = 0.8f, sp.top_k = 20, sp.top_p = 0.95f, sp.repetition_penalty = 1.1f,
        sp.presence_penalty = 0.5f;
        int32_t hist[64];
        memcpy(hist, prompt, sizeof prompt);
        int nh = 8, pos = 0;
        const int32_t *in = prompt;
        int n_in = 8;
        for (int s = 0; s < 16; s++) {
            tl_fwd_entry e;
            memset(&e, 0, sizeof e);
            tl_sample_out so;
            e.slot = 0, e.pos = pos, e.tokens = in, e.n_tok = n_in, e.sample = &sp, e.rng = &rng,
            e.out = &so;
            e.history = hist, e.n_history = nh, e.n_prompt = 8;
            char err[256];
            CHECK_EQ_INT(b->forward(b, &e, 1, err, sizeof err), 0);
            CHECK(so.token >= 0 && so.token < V);
            pos += n_in;
            gen[run][s] = so.token;
            hist[nh++] = so.token;
            in = &hist[nh - 1], n_in = 1;
        }
        rng_end[run] = rng;
    }
    CHECK(memcmp(gen[0], gen[1], sizeof gen[0]) == 0);
    CHECK(rng_end[0] == rng_end[1] && rng_end[0] != 12345);
    /* context full: 24 tokens at pos 50 of a 64-token context */
    int32_t many[24] = {0};
    tl_fwd_entry e;
    memset(&e, 0, sizeof e);
    e.slot = 0, e.pos = 50, e.tokens = many, e.n_tok = 24;
    char err[256];
    CHECK_EQ_INT(b->forward(b, &e, 1, err, sizeof err), TL_ERR_CONTEXT_FULL);
    e.pos = 0, e.n_tok = 1, many[0] = V; /* out-of-range token */
    CHECK_EQ_INT(b->forward(b, &e, 1, err, sizeof err), TL_ERR_INVALID);
    b->close(b);
    rm_free(&r);
}

/* One greedy step of n sequences (slots 0..n-1) over their prompts; tokens out. */
static int poison_step(tl_backend *b, int32_t (*prompts)[6], int n, int32_t *tok) {
    tl_fwd_entry e[2];
    tl_sample_out so[2];
    tl_sample_params sp;
    memset(&sp, 0, sizeof sp);
    sp.top_p = 1.0f, sp.repetition_penalty = 1.0f; /* temperature 0: greedy */
    for (int i = 0; i < n; i++) {
        memset(&e[i], 0, sizeof e[i]);
        e[i].slot = i, e[i].pos = 0, e[i].tokens = prompts[i], e[i].n_tok = 6;
        e[i].sample = &sp, e[i].out = &so[i];
    }
    char err[256];
    int st = b->forward(b, e, n, err, sizeof err);
    for (int i = 0; i < n; i++) tok[i] = st ? -2 : so[i].token;
    for (int i = 0; i < n; i++) CHECK_EQ_INT(b->reset_slot(b, i), 0);
    return st;
}

/* No silent failure from non-finite values (issue 11, 2e). (a) A NaN in one router weight of one
 * layer (q4 model: routing fused into moe_up) makes every token's router logits non-finite: the
 * step still succeeds, every sequence gets token -1 (the sampler's "no distribution"), no expert
 * id leaves its range (memcheck runs this test), the device is not lost, and a clean model on a
 * new backend afterwards works. (b) A NaN embedding row of token X (bf16 model: the separate
 * route kernel) poisons only the sequence that contains X: it gets -1, the other sequence of the
 * same batch gets the token it gets alone. */
/* tl_fwd_entry.prepare (the server's constrained-decoding mask, computed while the forward
 * runs): called exactly once per entry, before the sampler reads the parameters. The callback
 * sets an allowed-token mask holding one id; the sampled token must be that id (sampling at
 * temperature 1, top-k 20: without the mask the draw would be one of the model's top 20). */
typedef struct {
    tl_sample_params *sp;
    uint32_t *allow;
    int calls;
} prep_ctx;

static void prep_one(void *ctx) {
    prep_ctx *c = ctx;
    c->calls++;
    c->sp->allow = c->allow;
}

static void test_prepare_callback(void) {
    rmodel r;
    rm_build(&r, 0, 4);
    int V = r.m.cfg.n_vocab, W = (V + 31) / 32;
    tl_backend *b = open_be(&r.m, 2, 64);
    if (!b) {
        rm_free(&r);
        return;
    }
    uint32_t *allow = xcalloc((size_t)W, 4);
    int want = V / 3 + 7, ok = 0;
    allow[want / 32] |= 1u << (want % 32);
    for (int s = 0; s < 4; s++) {
        CHECK_EQ_INT(b->reset_slot(b, 0), 0);
        CHECK_EQ_INT(b->reset_slot(b, 1), 0);
        tl_sample_params sp[2];
        memset(sp, 0, sizeof sp);
        for (int i = 0; i < 2; i++)
            sp[i].temperature = 1.0f, sp[i].top_k = 20, sp[i].top_p = 1.0f,
            sp[i].repetition_penalty = 1.0f;
        prep_ctx pc = {&sp[0], allow, 0};
        int32_t tok[2][5];
        for (int i = 0; i < 10; i++) tok[i / 5][i % 5] = (int32_t)(t_rng_next(&rs) % V);
        tl_fwd_entry e[2];
        tl_sample_out so[2];
        uint64_t rng[2] = {11 + (uint64_t)s, 99};
        memset(e, 0, sizeof e);
        for (int i = 0; i < 2; i++)
            e[i].slot = i, e[i].pos = 0, e[i].tokens = tok[i], e[i].n_tok = 5, e[i].sample = &sp[i],
            e[i].rng = &rng[i], e[i].out = &so[i], e[i].n_prompt = 5;
        e[0].prepare = prep_one, e[0].prepare_ctx = &pc; /* entry 1 has none */
        char err[256];
        CHECK_EQ_INT(b->forward(b, e, 2, err, sizeof err), 0);
        CHECK_EQ_INT(pc.calls, 1);
        ok += so[0].token == want && so[1].token >= 0 && so[1].token < V;
    }
    printf("# prepare callback: masked draws == the one allowed id in %d of 4 steps (want 4)\n",
           ok);
    CHECK_EQ_INT(ok, 4);
    free(allow);
    b->close(b);
    rm_free(&r);
}

static void test_poisoned_router(void) {
    int32_t prompts[2][6] = {{5, 9, 17, 33, 2, 8}, {7, 11, 13, 19, 23, 29}}, tok[2], alone[2];
    for (int pass = 0; pass < 2; pass++) {
        rmodel r;
        rm_build(&r, 0, pass == 0 ? 4 : 0);
        int D = r.m.cfg.n_embd;
        if (pass == 0) /* expert 3 of layer 1, column 17 */
            ((uint16_t *)r.m.layers[1].moe_router.w)[3 * D + 17] = 0x7fc0;
        tl_backend *b = open_be(&r.m, 2, 64);
        if (!b) {
            rm_free(&r);
            return;
        }
        if (pass == 1) {
            CHECK_EQ_INT(poison_step(b, prompts + 1, 1, alone), 0); /* clean: before poisoning */
            b->close(b);
            for (int c = 0; c < D; c++) ((uint16_t *)r.m.tok_embd.w)[(size_t)9 * D + c] = 0x7fc0;
            b = open_be(&r.m, 2, 64);
        }
        CHECK_EQ_INT(poison_step(b, prompts, 2, tok), 0);
        printf("# poisoned %s: tokens %d %d\n", pass == 0 ? "router weight (q4)" : "embedding row",
               tok[0], tok[1]);
        CHECK_EQ_INT(tok[0], -1);
        if (pass == 0) CHECK_EQ_INT(tok[1], -1);
        if (pass == 1) CHECK_EQ_INT(tok[1], alone[0]);
        CHECK_EQ_INT(poison_step(b, prompts + 1, 1, tok), 0); /* the backend still runs */
        if (pass == 1) CHECK_EQ_INT(tok[0], alone[0]);
        b->close(b);
        rm_free(&r);
    }
}

/* The production shape (every width, the full vocabulary, 256 experts) with 4 layers (3 GDN, 1
 * attention): the shape the GEMM paths are built for. */
static void prod4_cfg(tl_config *c) {
    memset(c, 0, sizeof *c);
    c->n_embd = TL_N_EMBD, c->n_layer = TL_N_LAYER, c->n_vocab = TL_N_VOCAB, c->n_head = TL_N_HEAD;
    c->n_head_kv = TL_N_HEAD_KV, c->head_dim = TL_HEAD_DIM, c->n_rot = TL_N_ROT,
    c->rope_theta = TL_ROPE_THETA;
    c->gdn_n_k_head = TL_GDN_N_K_HEAD, c->gdn_n_v_head = TL_GDN_N_V_HEAD;
    c->gdn_k_dim = TL_GDN_K_DIM, c->gdn_v_dim = TL_GDN_V_DIM, c->gdn_conv_k = TL_GDN_CONV_K;
    c->n_expert = TL_N_EXPERT, c->n_expert_used = TL_N_EXPERT_USED;
    c->n_ff_expert = c->n_ff_shared = TL_N_FF_EXPERT;
    c->rms_eps = TL_RMS_EPS, c->max_pos = TL_MAX_POS;
    c->n_layer = 4;
    for (int il = 0; il < c->n_layer; il++)
        c->layer_kind[il] = (il + 1) % 4 == 0 ? TL_LAYER_ATTN : TL_LAYER_GDN;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The production-shape prefill path (bf16 tensor-core GEMMs, chunked GDN, flash attention,
 * grouped MoE; gpu.h) against the decode path (f32 GEMVs, recurrent GDN) on a 4-layer model with
 * every production width and random 4-bit weights (prod4_cfg): each prompt in one chunk vs token
 * by token. Tolerance: the GEMM path rounds every GEMM input to bf16 (relative 2^-9 per
 * activation), and a routing decision near a tie (8th vs 9th expert) can flip under that, which
 * moves a token's MoE output by ~1/8 and one prompt's logits by up to ~1e-2; the HF comparison
 * measured NMSE 2e-4 for this path on 4 layers (tools/hf_fullwidth.py, 2026-12-02). So the median
 * of five prompts must stay under 1e-2 and every prompt under 3e-2 (a layout or indexing error:
 * ~1), and the greedy top-1 must agree unless the decode path's top-2 margin is below 0.05. Each
 * prompt has its own generator (the same draws whether the test runs alone or in the suite: with
 * the shared one, running it alone drew a prompt at NMSE 1.28e-2 with the top-1 equal, session
 * 24). The last two have 320 and 600 tokens: chunks past 256, whose shared expert ran as dense
 * GEMMs before session 25 (TL_MOE_SHARED_GROUPED=256 still does) and whose dense products run the
 * wgr kernel since then (before: the mma.sync 64x128 tile up to 511 tokens), and past 512. */
static void test_prefill_gemm_vs_decode(void) {
    tl_config c;
    prod4_cfg(&c);
    tl_cuda_params p = {
        .max_seqs = 2, .max_ctx = 1024, .random_weights = 1, .seed = 7, .weight_bits = 4};
    tl_backend *b = NULL;
    char err[512] = "";
    CHECK_EQ_INT(tl_backend_cuda_open(&b, NULL, &c, &p, err, sizeof err), 0);
    if (!b) {
        printf("# %s\n", err);
        return;
    }
    enum { N_PROMPTS = 5 };
    static const int lens[N_PROMPTS] = {64, 64, 64, 320, 600};
    int V = c.n_vocab;
    int32_t *tok = xmalloc(sizeof(int32_t) * (600 + 8));
    float *la = xmalloc(sizeof(float) * V), *lb = xmalloc(sizeof(float) * V);
    double e[N_PROMPTS];
    for (int k = 0; k < N_PROMPTS; k++) {
        const int n = lens[k];
        unsigned long long prs = 0x5eed0632ull + (unsigned)k;
        for (int i = 0; i < n + 8; i++) tok[i] = (int32_t)(t_rng_next(&prs) % TL_N_VOCAB_TOKENS);
        CHECK_EQ_INT(b->reset_slot(b, 0), 0);
        CHECK_EQ_INT(b->reset_slot(b, 1), 0);
        /* the decode path first, so slot 1 takes KV page 0 and the GEMM path's slot 0 reads its
         * cache through a non-identity page table (page 1) */
        for (int i = 0; i < n; i++)
            CHECK_EQ_INT(fwd1(b, 1, i, tok + i, 1, i == n - 1 ? lb : NULL), 0);
        CHECK_EQ_INT(fwd1(b, 0, 0, tok, n, la), 0);
        float ma, mb;
        int ta = argmax_margin(la, V, &ma), tb = argmax_margin(lb, V, &mb);
        e[k] = t_nmse(la, lb, V);
        printf("# prompt %d (%d tokens): prefill GEMM path vs decode path: logits nmse %.3e, top-1 "
               "%d vs %d (margin %.3f)\n",
               k, n, e[k], ta, tb, mb);
        CHECK(e[k] <= 3e-2);
        CHECK(ta == tb || mb < 0.05f);
        for (int s = 0; s < 8; s++) {
            CHECK_EQ_INT(fwd1(b, 0, n + s, tok + n + s, 1, la), 0);
            CHECK_EQ_INT(fwd1(b, 1, n + s, tok + n + s, 1, lb), 0);
        }
        check_nmse("... then 8 decode steps", la, lb, V, 1e-2);
    }
    qsort(e, N_PROMPTS, sizeof e[0], cmp_double);
    double med = e[N_PROMPTS / 2];
    printf("# prefill gemm vs decode logits: median nmse %.3e over %d prompts (tol 1e-2)\n", med,
           N_PROMPTS);
    CHECK(med <= 1e-2);
    b->close(b);
    free(tok), free(la), free(lb);
}

/* A random 4-bit production-shape backend (prod4_cfg) of max_seqs slots, with tc_min (the
 * TL_CUDA_TC_MIN switch, read at open) as given: "1" puts every short micro-batch on the
 * tensor-core decode path, "0" none. The router GEMM serves every batch size on the tensor-core
 * paths (by default batches under 128 tokens use the GEMV, which rounds differently), so that
 * batched == alone holds exactly. */
static tl_backend *open_prod4(int max_seqs, int max_ctx, const char *tc_min) {
    tl_config c;
    prod4_cfg(&c);
    tl_cuda_params p = {.max_seqs = max_seqs,
                        .max_ctx = max_ctx,
                        .random_weights = 1,
                        .seed = 11,
                        .weight_bits = 4};
    tl_backend *b = NULL;
    char err[512] = "";
    setenv("TL_CUDA_TC_MIN", tc_min, 1);
    setenv("TL_CUDA_ROUTER_GEMM_MIN", "1", 1); /* one router kind at every batch size */
    int st = tl_backend_cuda_open(&b, NULL, &c, &p, err, sizeof err);
    unsetenv("TL_CUDA_TC_MIN");
    unsetenv("TL_CUDA_ROUTER_GEMM_MIN");
    if (st) printf("# backend open failed: %s\n", err);
    CHECK_EQ_INT(st, 0);
    return b;
}

/* B sequences: each prompt (3..9 tokens) prefilled alone, then n_steps decode steps, all B
 * together (batched = 1) or one sequence at a time; the tokens fed are the prompt's continuation
 * in tok (teacher forcing, so both runs see the same inputs). Logits of every decode step into
 * out [n_steps][B][V]. */
static void tc_run(tl_backend *b, int B, int n_steps, const int32_t *tok, int V, int batched,
                   float *out) {
    char err[256] = "";
    tl_fwd_entry *e = xcalloc((size_t)B, sizeof *e);
    for (int q = 0; q < B; q++) {
        CHECK_EQ_INT(b->reset_slot(b, q), 0);
        CHECK_EQ_INT(fwd1(b, q, 0, tok + (size_t)q * 16, 3 + q % 7, NULL), 0);
    }
    for (int s = 0; s < n_steps; s++) {
        for (int q = 0; q < B; q++) {
            int pos = 3 + q % 7 + s;
            e[q].slot = q, e[q].pos = pos, e[q].tokens = tok + (size_t)q * 16 + pos, e[q].n_tok = 1;
            e[q].logits = out + ((size_t)s * B + q) * V;
            if (!batched) CHECK_EQ_INT(b->forward(b, &e[q], 1, err, sizeof err), 0);
        }
        if (batched) CHECK_EQ_INT(b->forward(b, e, B, err, sizeof err), 0);
    }
    free(e);
}

/* Batched decode on the tensor cores (cuda_forward.cu) at B = 64 and 256 on the production shape:
 * (1) batched == each sequence alone on the same path: every row's GEMMs, grouped expert GEMMs
 *     (one row per assignment), GDN step and attention compute that row with the same kernels in
 *     the same order whatever the batch, so the logits agree to fp32 rounding (NMSE <= 1e-8, as
 *     test_batched_eq_alone) and the greedy tokens are identical;
 * (2) the tensor-core path vs the GEMV decode path on the same batch: bf16 activations into the
 *     GEMMs against fp32 GEMVs, the rounding of the prefill GEMM path: a rounding can swap a
 *     token's 8th and 9th expert in these random 256-expert layers, which moves that row a lot
 *     and the others little (the per-row NMSE spread is printed). Bound: NMSE <= 1e-2 over all
 *     rows, as test_prefill_gemm_vs_decode and tools/hf_fullwidth.py (GEMM path vs transformers,
 *     measured 2e-4 .. 9e-3 over seeds), and at least 80% of the greedy tokens equal (measured on
 *     the H200 2026-12-03: NMSE 4.4e-3 / 4.2e-3, 89% / 89% at B = 64 / 256); a layout or
 *     dequantization error gives NMSE ~1 and no agreement. tools/hf_fullwidth.py checks this
 *     path against transformers (its "tensor-core decode" mode). */
static void test_tc_decode_batched(void) {
    int S = 256, n_steps = 3, V = TL_N_VOCAB;
    tl_backend *tc = open_prod4(S, 64, "1"), *gv = open_prod4(S, 64, "0");
    if (!tc || !gv) {
        if (tc) tc->close(tc);
        if (gv) gv->close(gv);
        return;
    }
    int32_t *tok = xmalloc(sizeof(int32_t) * S * 16);
    for (int i = 0; i < S * 16; i++) tok[i] = (int32_t)(t_rng_next(&rs) % TL_N_VOCAB_TOKENS);
    size_t n = (size_t)n_steps * S * V;
    float *alone = xmalloc(sizeof(float) * n), *bat = xmalloc(sizeof(float) * n);
    float *gemv = xmalloc(sizeof(float) * n);
    int Bs[2] = {64, 256};
    for (int k = 0; k < 2; k++) {
        int B = Bs[k];
        size_t nb = (size_t)n_steps * B * V;
        tc_run(tc, B, n_steps, tok, V, 0, alone);
        tc_run(tc, B, n_steps, tok, V, 1, bat);
        tc_run(gv, B, n_steps, tok, V, 1, gemv);
        printf("# B = %d\n", B);
        check_nmse("tc batched vs tc alone", bat, alone, nb, 1e-8);
        check_nmse("tc batched vs gemv batched", bat, gemv, nb, 1e-2);
        int rows = n_steps * B, same = 0, agree = 0;
        double *rn = xmalloc(sizeof(double) * rows);
        for (int r = 0; r < rows; r++) {
            float ma, mb, mg;
            int ta = argmax_margin(alone + (size_t)r * V, V, &ma);
            int tb = argmax_margin(bat + (size_t)r * V, V, &mb);
            same += ta == tb;
            agree += tb == argmax_margin(gemv + (size_t)r * V, V, &mg);
            rn[r] = t_nmse(bat + (size_t)r * V, gemv + (size_t)r * V, V);
        }
        qsort(rn, rows, sizeof *rn, cmp_double);
        printf("# greedy tokens: batched == alone %d of %d; tc == gemv %d of %d; per-row nmse tc "
               "vs gemv: median %.2e, 90th pct %.2e, max %.2e\n",
               same, rows, agree, rows, rn[rows / 2], rn[rows * 9 / 10], rn[rows - 1]);
        CHECK_EQ_INT(same, rows);
        CHECK(agree >= rows * 8 / 10);
        free(rn);
    }
    tc->close(tc), gv->close(gv);
    free(tok), free(alone), free(bat), free(gemv);
}

/* Mixed micro-batches (batch_plan.h tl_mb_begin_mixed; cuda_forward.cu mb_long): one step of 6
 * decode tokens (slots 0..5, after 5-token prompts) and prefill chunks of 40 and `chunk` tokens
 * (slots 6, 7, from position 0), on a backend that packs them into one micro-batch and on one
 * with TL_CUDA_NO_MIX=1, where each chunk runs alone on the prefill path; then one decode step of
 * all 8 slots on both (the states and KV the mixed step left behind). chunk = 100: every
 * micro-batch of both runs has <= 256 tokens, so the GEMMs take the same tiles and split and
 * every row is computed by the same kernels in the same order: the states are the same bits, and
 * the decode step after it must match to NMSE <= 1e-8 with the same greedy tokens. The mixed
 * step's own logits differ in the chunks' rows only by the LM head: alone, a chunk's last row
 * goes through the prefill path's f32 GEMV head, mixed through the batched path's bf16 GEMM head
 * (measured 1.2e-6 on the H200): bound 1e-5 there. chunk = 300: the mixed batch (346 tokens) no
 * longer splits K, so the decode rows round differently from the 6-token batch: the GEMM-path
 * bound (1e-2, as test_tc_decode_batched) for both steps. */
static void mixed_case(int chunk, double tol_step, double tol) {
    int V = TL_N_VOCAB, S = 8, n_out = S;
    setenv("TL_CUDA_NO_MIX", "1", 1);
    tl_backend *sep = open_prod4(S, 512, "1");
    unsetenv("TL_CUDA_NO_MIX");
    tl_backend *mix = open_prod4(S, 512, "1");
    if (!sep || !mix) {
        if (sep) sep->close(sep);
        if (mix) mix->close(mix);
        return;
    }
    int32_t *tok = xmalloc(sizeof(int32_t) * S * 512);
    for (int i = 0; i < S * 512; i++) tok[i] = (int32_t)(t_rng_next(&rs) % TL_N_VOCAB_TOKENS);
    float *lg[2], *lg2[2];
    tl_backend *bs[2] = {sep, mix};
    char err[256] = "";
    for (int k = 0; k < 2; k++) {
        tl_backend *b = bs[k];
        lg[k] = xmalloc(sizeof(float) * V * n_out), lg2[k] = xmalloc(sizeof(float) * V * S);
        for (int q = 0; q < 6; q++) CHECK_EQ_INT(fwd1(b, q, 0, tok + (size_t)q * 512, 5, NULL), 0);
        tl_fwd_entry e[8];
        memset(e, 0, sizeof e);
        for (int q = 0; q < S; q++) {
            int n = q < 6 ? 1 : q == 6 ? 40 : chunk, pos = q < 6 ? 5 : 0;
            e[q].slot = q, e[q].pos = pos, e[q].tokens = tok + (size_t)q * 512 + pos;
            e[q].n_tok = n, e[q].logits = lg[k] + (size_t)q * V;
        }
        CHECK_EQ_INT(b->forward(b, e, S, err, sizeof err), 0);
        for (int q = 0; q < S; q++) { /* then one decode step of every slot */
            int pos = q < 6 ? 6 : q == 6 ? 40 : chunk;
            e[q].pos = pos, e[q].tokens = tok + (size_t)q * 512 + pos, e[q].n_tok = 1;
            e[q].logits = lg2[k] + (size_t)q * V;
        }
        CHECK_EQ_INT(b->forward(b, e, S, err, sizeof err), 0);
    }
    char what[96];
    snprintf(what, sizeof what, "mixed step (chunk %d) vs chunks alone", chunk);
    check_nmse(what, lg[1], lg[0], (size_t)V * n_out, tol_step);
    snprintf(what, sizeof what, "... then a decode step of all slots");
    check_nmse(what, lg2[1], lg2[0], (size_t)V * S, tol);
    int same = 0;
    for (int r = 0; r < 2 * S; r++) {
        float m0, m1;
        const float *a = r < S ? lg[0] + (size_t)r * V : lg2[0] + (size_t)(r - S) * V;
        const float *b = r < S ? lg[1] + (size_t)r * V : lg2[1] + (size_t)(r - S) * V;
        same += argmax_margin(a, V, &m0) == argmax_margin(b, V, &m1);
    }
    printf("# greedy tokens equal: %d of %d\n", same, 2 * S);
    if (tol <= 1e-8) CHECK_EQ_INT(same, 2 * S);
    for (int k = 0; k < 2; k++) free(lg[k]), free(lg2[k]);
    free(tok);
    sep->close(sep), mix->close(mix);
}

static void test_mixed_step(void) {
    mixed_case(100, 1e-5, 1e-8);
    mixed_case(300, 1e-2, 1e-2);
}

/* ====== Prefix cache (docs/architecture.md §4.1): the backend's cache_save / cache_load. ======
 * A prompt of 200 tokens: slot 0 prefills 150 and is snapshotted (2 full pages and a partial one
 * of 22 rows); slot 1 starts from that snapshot and prefills the other 50; slot 2 computes the
 * same chunks (0..150, 150..200) from scratch. Same chunk boundaries, so slot 1 == slot 2 bit for
 * bit: logits after the prompt and over 8 greedy steps with repetition and presence penalties
 * (the restored tokens' penalty counts must be there). Against the whole prompt in one chunk
 * (slot 0 again) the chunk boundary moves: on the decode kernels (small model) that is the
 * chunked-prefill spread of test_prefill_chunked_eq_tokenwise, NMSE 1e-8 with the same greedy
 * tokens where the margin is clear; on the GEMM prefill path (production widths, random 4-bit
 * weights) bf16 activations and routing near-ties allow the bound of test_prefill_gemm_vs_decode,
 * NMSE 1e-2 and the same top-1 unless the margin is below 0.05 (the measured value is printed:
 * tighten once known). */
typedef struct pc_run {
    tl_prefix_cache pc;
    tl_backend *b;
    int V;
} pc_run;

static int pc_open(pc_run *r, tl_backend *b, int V) {
    char err[256] = "";
    int ns = 0;
    r->b = b, r->V = V;
    CHECK(b->cache_alloc != NULL && b->kv_pool != NULL);
    if (!b->cache_alloc || !b->kv_pool) return -1;
    int st = tl_pc_layout(b->pc_budget, b->pc_snap_bytes, &ns, err, sizeof err);
    if (!st) st = b->cache_alloc(b, ns, err, sizeof err);
    if (!st)
        st = tl_pc_init(&r->pc, b->kv_pool(b), ns, b->pc_page_bytes, b->pc_snap_bytes, err,
                        sizeof err);
    if (st) printf("# prefix cache: %s\n", err);
    CHECK_EQ_INT(st, 0);
    return st;
}

/* Greedy steps with penalties on the device from slot s at pos: tokens and logits out. */
static void pc_steps(pc_run *r, int slot, int pos, int32_t first, const int32_t *hist0, int n_hist0,
                     int n, int32_t *toks, float *logits) {
    tl_sample_params sp;
    memset(&sp, 0, sizeof sp);
    sp.top_p = 1.0f, sp.repetition_penalty = 1.3f, sp.presence_penalty = 0.5f;
    int32_t *hist = xmalloc(sizeof(int32_t) * (n_hist0 + n + 1));
    memcpy(hist, hist0, sizeof(int32_t) * n_hist0);
    int32_t tok = first;
    uint64_t rng = 5;
    for (int i = 0; i < n; i++) {
        hist[n_hist0 + i] = tok;
        tl_fwd_entry e;
        memset(&e, 0, sizeof e);
        tl_sample_out so;
        e.slot = slot, e.pos = pos + i, e.tokens = &tok, e.n_tok = 1;
        e.logits = logits + (size_t)i * r->V, e.sample = &sp, e.rng = &rng, e.out = &so;
        e.history = hist, e.n_history = n_hist0 + i + 1, e.n_prompt = n_hist0;
        char err[256] = "";
        CHECK_EQ_INT(r->b->forward(r->b, &e, 1, err, sizeof err), 0);
        toks[i] = tok = so.token;
    }
    free(hist);
}

/* V: logits per row; V_tok: token ids drawn below it (the vocabulary without padding). */
static void pc_case(tl_backend *b, int V, int V_tok, const char *what, double tol,
                    float min_margin) {
    pc_run r;
    if (pc_open(&r, b, V)) return;
    enum { N = 200, CUT = 150, G = 8 };
    int32_t tok[N];
    unsigned long long prs = 0x5eed0014ull;
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(t_rng_next(&prs) % (unsigned)V_tok);
    char err[256] = "";
    /* slot 0: the first 150 tokens, snapshotted */
    CHECK_EQ_INT(fwd1(b, 0, 0, tok, CUT, NULL), 0);
    int32_t pages[8];
    tl_pc_io io;
    CHECK_EQ_INT(tl_pc_plan_save(&r.pc, NULL, tok, CUT, 0, 0, &io), 1);
    CHECK_EQ_INT(b->cache_save(b, 0, &io, err, sizeof err), 0);
    tl_pc_commit(&r.pc, &io);
    CHECK_EQ_INT(b->reset_slot(b, 0), 0); /* its full pages stay: the cache holds them */
    /* slot 1: from the cache, then the rest */
    CHECK(tl_pc_lookup(&r.pc, NULL, tok, N, N - 1, pages, &io) >= 0);
    CHECK_EQ_INT(io.n_tok, CUT);
    /* n_prompt 0 as fwd1 passes: every fed token counts as generated in the penalty counts */
    CHECK_EQ_INT(b->cache_load(b, 1, &io, tok, 0, err, sizeof err), 0);
    float *l1 = xmalloc(sizeof(float) * V * (G + 1)), *l2 = xmalloc(sizeof(float) * V * (G + 1));
    float *l0 = xmalloc(sizeof(float) * V * (G + 1));
    CHECK_EQ_INT(fwd1(b, 1, CUT, tok + CUT, N - CUT, l1), 0);
    /* slot 2: the same chunks from scratch; slot 0: the whole prompt at once */
    CHECK_EQ_INT(fwd1(b, 2, 0, tok, CUT, NULL), 0);
    CHECK_EQ_INT(fwd1(b, 2, CUT, tok + CUT, N - CUT, l2), 0);
    CHECK_EQ_INT(fwd1(b, 0, 0, tok, N, l0), 0);
    int same = !memcmp(l1, l2, sizeof(float) * V);
    float m0, m1;
    int t1 = argmax_margin(l1, V, &m1), t0 = argmax_margin(l0, V, &m0);
    double nm = t_nmse(l1, l0, V);
    int32_t g1[G], g2[G], g0[G];
    pc_steps(&r, 1, N, t1, tok, N, G, g1, l1 + V);
    pc_steps(&r, 2, N, t1, tok, N, G, g2, l2 + V);
    pc_steps(&r, 0, N, t1, tok, N, G, g0, l0 + V);
    same &= !memcmp(l1 + V, l2 + V, sizeof(float) * V * G) && !memcmp(g1, g2, sizeof g1);
    /* against one chunk: the steps up to the first token that differs (if any) saw the same
     * inputs, and are compared. A differing token can only come from a near-tie of the penalised
     * logits (the raw ones agree to the tolerance); it is printed, not failed: the penalised
     * values are the device sampler's and not recomputed here. */
    int k = 0;
    while (k < G && g0[k] == g1[k]) k++;
    int n_cmp = k < G ? k + 1 : G;
    double nm_steps = t_nmse(l1 + V, l0 + V, V * n_cmp);
    printf("# prefix cache %s: cached == same chunks from scratch bit for bit: %s; vs one chunk: "
           "logits nmse %.3e after the prompt (top-1 %d vs %d, margin %.3f), %.3e over %d "
           "penalised greedy steps (tokens equal for %d)\n",
           what, same ? "yes" : "NO", nm, t1, t0, m0, nm_steps, n_cmp, k);
    CHECK(same);
    CHECK(nm <= tol);
    CHECK(t1 == t0 || m0 < min_margin);
    CHECK(nm_steps <= tol);
    for (int s = 0; s < 3; s++) CHECK_EQ_INT(b->reset_slot(b, s), 0);
    tl_pc_clear(&r.pc); /* the pool's pages back before the next case */
    tl_pc_free(&r.pc);
    free(l0), free(l1), free(l2);
}

/* Pages shared with running sequences (docs/architecture.md §4.1): slot 0 prefills `cut` tokens
 * of a 200-token prompt and is snapshotted while it keeps running; slots 1 and 2 start from the
 * snapshot, so their page tables hold slot 0's full pages (same ids, pool references 3 slots + the
 * cache); the partial page (cut % 64 rows) is each slot's own copy. Slot 1, then slot 2, then
 * slot 0 prefill the other 200 - cut tokens and run 8 penalised greedy steps, each reading the
 * shared pages after the others wrote past them; then slot 2, reset, computes the same chunks
 * from scratch without the cache. All four must agree bit for bit (the same chunk boundaries and
 * kernels, so the same arithmetic): any write into a shared page, or a shared page handed to
 * another slot, changes the later readers' logits. cut = 128 is the boundary case (no partial
 * page: the next token starts a new page of the sharer's own). */
static void pc_share_case(tl_backend *b, int V, int V_tok, int cut, const char *what) {
    pc_run r;
    if (pc_open(&r, b, V)) return;
    enum { N = 200, G = 8 };
    int32_t tok[N], pages[8];
    unsigned long long prs = 0x5eed0015ull + (unsigned)cut;
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(t_rng_next(&prs) % (unsigned)V_tok);
    char err[256] = "";
    tl_kv_pages *pool = b->kv_pool(b);
    CHECK_EQ_INT(fwd1(b, 0, 0, tok, cut, NULL), 0);
    tl_pc_io io;
    CHECK_EQ_INT(tl_pc_plan_save(&r.pc, NULL, tok, cut, 0, 0, &io), 1);
    CHECK_EQ_INT(b->cache_save(b, 0, &io, err, sizeof err), 0);
    tl_pc_commit(&r.pc, &io);
    int nf = cut / TL_PC_PAGE;
    for (int s = 1; s <= 2; s++) {
        CHECK(tl_pc_lookup(&r.pc, NULL, tok, N, N - 1, pages, &io) >= 0);
        CHECK_EQ_INT(io.n_tok, cut);
        CHECK_EQ_INT(b->cache_load(b, s, &io, tok, 0, err, sizeof err), 0);
    }
    const int32_t *row0 = pool->table, *row1 = pool->table + pool->max_pages,
                  *row2 = pool->table + 2 * pool->max_pages;
    int shared = 1;
    for (int k = 0; k < nf; k++)
        shared &= row1[k] == row0[k] && row2[k] == row0[k] && pool->refs[row0[k]] == 4 &&
                  pool->held[row0[k]];
    if (cut % TL_PC_PAGE) /* each its own partial page, and the cache's copy a fourth */
        shared &= row1[nf] != row0[nf] && row2[nf] != row0[nf] && row1[nf] != row2[nf] &&
                  row1[nf] != pages[nf] && pool->refs[row1[nf]] == 1;
    CHECK(shared);
    float *l[4];
    int32_t g[4][G];
    for (int i = 0; i < 4; i++) l[i] = xmalloc(sizeof(float) * V * (G + 1));
    int order[3] = {1, 2, 0};
    for (int i = 0; i < 3; i++) {
        int s = order[i];
        CHECK_EQ_INT(fwd1(b, s, cut, tok + cut, N - cut, l[s]), 0);
        float m;
        pc_steps(&r, s, N, argmax_margin(l[s], V, &m), tok, N, G, g[s], l[s] + V);
    }
    CHECK_EQ_INT(b->reset_slot(b, 2), 0); /* slot 2 again, from scratch: the reference */
    CHECK_EQ_INT(fwd1(b, 2, 0, tok, cut, NULL), 0);
    CHECK_EQ_INT(fwd1(b, 2, cut, tok + cut, N - cut, l[3]), 0);
    float m;
    pc_steps(&r, 2, N, argmax_margin(l[3], V, &m), tok, N, G, g[3], l[3] + V);
    int same = 1;
    for (int i = 0; i < 3; i++)
        same &=
            !memcmp(l[i], l[3], sizeof(float) * V * (G + 1)) && !memcmp(g[i], g[3], sizeof g[3]);
    printf("# prefix cache %s, cut %d: two sharers and the owner == uncached bit for bit: %s\n",
           what, cut, same ? "yes" : "NO");
    CHECK(same);
    for (int s = 0; s < 3; s++) CHECK_EQ_INT(b->reset_slot(b, s), 0);
    tl_pc_clear(&r.pc);
    CHECK_EQ_INT(pool->n_free, pool->n_page); /* every page back */
    tl_pc_free(&r.pc);
    for (int i = 0; i < 4; i++) free(l[i]);
}

/* The small model r on the decode kernels with a 64 MiB prefix cache, 3 slots of 256 tokens;
 * NULL (the reason printed) when it cannot open. */
static tl_backend *open_pc_small(rmodel *r) {
    tl_cuda_params p = {
        .max_seqs = 3, .max_ctx = 256, .weight_bits = 16, .prefix_cache_bytes = 64ll << 20};
    tl_backend *b = NULL;
    char err[512] = "";
    CHECK_EQ_INT(tl_backend_cuda_open(&b, &r->m, NULL, &p, err, sizeof err), 0);
    if (!b) printf("# %s\n", err);
    return b;
}

static void test_prefix_cache_small(void) {
    rmodel r;
    rm_build(&r, 0, 4);
    tl_backend *b = open_pc_small(&r);
    if (b) {
        pc_case(b, r.m.cfg.n_vocab, r.m.cfg.n_vocab, "small q4, decode kernels", 1e-8, 1e-3f);
        pc_share_case(b, r.m.cfg.n_vocab, r.m.cfg.n_vocab, 150, "small, decode kernels");
        pc_share_case(b, r.m.cfg.n_vocab, r.m.cfg.n_vocab, 128, "small, decode kernels");
        b->close(b);
    }
    rm_free(&r);
}

/* The production-shape 4-layer model (prod4_cfg) on random 4-bit weights with a 1 GiB prefix
 * cache, 3 slots of 512 tokens: the GEMM prefill path of the prefix-cache tests. *c gets its
 * config; NULL (the reason printed) when it cannot open. */
static tl_backend *open_pc_fullwidth(tl_config *c) {
    prod4_cfg(c);
    tl_cuda_params p = {.max_seqs = 3,
                        .max_ctx = 512,
                        .random_weights = 1,
                        .seed = 7,
                        .weight_bits = 4,
                        .prefix_cache_bytes = 1ll << 30};
    tl_backend *b = NULL;
    char err[512] = "";
    CHECK_EQ_INT(tl_backend_cuda_open(&b, NULL, c, &p, err, sizeof err), 0);
    if (!b) printf("# %s\n", err);
    return b;
}

static void test_prefix_cache_gemm_path(void) {
    tl_config c;
    tl_backend *b = open_pc_fullwidth(&c);
    if (!b) return;
    pc_case(b, TL_N_VOCAB, TL_N_VOCAB_TOKENS, "full width q4, GEMM prefill path", 1e-2, 0.05f);
    pc_share_case(b, TL_N_VOCAB, TL_N_VOCAB_TOKENS, 150, "full width q4, GEMM prefill path");
    pc_share_case(b, TL_N_VOCAB, TL_N_VOCAB_TOKENS, 128, "full width q4, GEMM prefill path");
    b->close(b);
}

/* --device (tl_cuda_params.device, docs/deploy.md): an ordinal past the visible devices is
 * refused at open naming it and the count; a backend opened on the last visible device on one
 * thread and stepped from another thread (whose current device is still 0, as the server's
 * engine thread after the loader opened it) computes bit for bit what a device-0 backend stepped
 * on the opening thread computes (same GPU model, same kernels: test_determinism shows a run is
 * bitwise repeatable). On a one-GPU machine the last device is 0 and only the thread hop is
 * exercised; on two or more the stepping thread must switch devices. */
typedef struct dev_job {
    tl_backend *b;
    const int32_t *tok;
    float *l;
    int V, st;
} dev_job;

static void *dev_steps(void *arg) {
    dev_job *j = arg;
    j->st = j->b->reset_slot(j->b, 0);
    if (!j->st) j->st = fwd1(j->b, 0, 0, j->tok, 12, j->l);
    for (int s = 1; s < 6 && !j->st; s++)
        j->st = fwd1(j->b, 0, 11 + s, j->tok + 11 + s, 1, j->l + (size_t)s * j->V);
    return NULL;
}

static void test_device_select(void) {
    int n = tl_gpu_device_count();
    CHECK(n >= 1);
    printf("# %d visible CUDA device(s)\n", n);
    rmodel r;
    rm_build(&r, 0, 4);
    int V = r.m.cfg.n_vocab;
    tl_cuda_params p = {.max_seqs = 1, .max_ctx = 64, .weight_bits = 16, .device = n};
    tl_backend *bad = NULL;
    char err[512] = "", want[64];
    CHECK_EQ_INT(tl_backend_cuda_open(&bad, &r.m, NULL, &p, err, sizeof err), TL_ERR_INVALID);
    CHECK(bad == NULL);
    snprintf(want, sizeof want, "CUDA device %d does not exist: %d visible", n, n);
    CHECK(strstr(err, want) != NULL);
    p.device = -1;
    CHECK_EQ_INT(tl_backend_cuda_open(&bad, &r.m, NULL, &p, err, sizeof err), TL_ERR_INVALID);

    int32_t tok[20];
    for (int i = 0; i < 20; i++) tok[i] = (int32_t)(t_rng_next(&rs) % V);
    float *l0 = xmalloc(sizeof(float) * V * 6), *l1 = xmalloc(sizeof(float) * V * 6);
    tl_backend *b0 = open_be(&r.m, 1, 64);
    p.device = n - 1;
    tl_backend *b1 = NULL;
    CHECK_EQ_INT(tl_backend_cuda_open(&b1, &r.m, NULL, &p, err, sizeof err), 0);
    if (b0 && b1) {
        dev_job j0 = {b0, tok, l0, V, 0}, j1 = {b1, tok, l1, V, 0};
        dev_steps(&j0);
        pthread_t th;
        CHECK_EQ_INT(pthread_create(&th, NULL, dev_steps, &j1), 0);
        pthread_join(th, NULL);
        CHECK_EQ_INT(j0.st, 0);
        CHECK_EQ_INT(j1.st, 0);
        CHECK(memcmp(l0, l1, sizeof(float) * V * 6) == 0);
        dev_steps(&j0); /* the opening thread still steps its own backend after the hop */
        CHECK_EQ_INT(j0.st, 0);
    }
    if (b0) b0->close(b0);
    if (b1) b1->close(b1);
    free(l0), free(l1);
    rm_free(&r);
}

/* ====== Speculative decoding on the GPU (docs/architecture.md §3.6) ====== */

/* A random MTP head (docs/model.md §3.1) for r: one gated-attention + MoE block of the trunk's
 * shapes (its experts in the arrays' last slot), fc [n_embd, 2 n_embd], three norms. */
static void rm_add_mtp(rmodel *r, int bits) {
    const tl_config *c = &r->m.cfg;
    int D = c->n_embd;
    tl_mtp *x = &r->m.mtp;
    x->norm_emb = rm_vec(r, D, 1.0f, 0.2f);
    x->norm_hid = rm_vec(r, D, 1.0f, 0.2f);
    x->fc = rm_mat(r, D, 2 * D, bits, 0.08f)->m;
    rm_layer(r, &x->layer, c->n_layer, TL_LAYER_ATTN, bits);
    x->norm = rm_vec(r, D, 1.0f, 0.2f);
    r->m.has_mtp = 1;
}

/* A backend with the head for up to K draft tokens, speculation on (rollback by the verify's
 * state copies, or with recompute by TL_CUDA_SPEC_RECOMPUTE=1's restore and recompute).
 * TL_CUDA_TC_MIN=0 keeps every micro-batch of a full-width model on the GEMV kernels (the oracle
 * comparisons' path; the tensor-core path's rounding is test_tc_decode_batched's and
 * test_spec_gemm_path's). */
static tl_backend *open_spec(const tl_model *m, int max_seqs, int max_ctx, int K, int recompute) {
    tl_cuda_params p = {
        .max_seqs = max_seqs, .max_ctx = max_ctx, .weight_bits = 16, .spec_tokens = K};
    tl_backend *b = NULL;
    char err[512] = "";
    setenv("TL_CUDA_TC_MIN", "0", 1);
    if (recompute) setenv("TL_CUDA_SPEC_RECOMPUTE", "1", 1);
    int st = tl_backend_cuda_open(&b, m, NULL, &p, err, sizeof err);
    unsetenv("TL_CUDA_TC_MIN");
    unsetenv("TL_CUDA_SPEC_RECOMPUTE");
    if (!st) st = b->spec_init(b, K, err, sizeof err);
    if (st) printf("# spec backend open failed: %s\n", err);
    CHECK_EQ_INT(st, 0);
    return b;
}

/* Draft logits on the GPU against cpu_mtp_forward (the oracle): two sequences (prompts of 12 and
 * 7 tokens, prefilled in one forward, so the head's rows of both come from one micro-batch), then
 * K chained draft steps of both in one draft call each, random draft tokens. The oracle's head
 * cache is filled from cpu_forward_h's hiddens (rows 0 .. n - 2), step 0 reads the trunk's last
 * hidden, step j > 0 the h' of step j - 1. Bound: logits NMSE 5e-6 on the small models, the e2e
 * bound and for the same reason (the GPU keeps the trunk's and the head's K and V in bf16; the head
 * adds one attention + MoE block to the 4 layers); measured on the H200 (2026-12-04) 9.0e-7 (bf16)
 * and 1.6e-6 (q4). At full width the chained steps spread more (each step's input is the previous
 * step's h', 2048 wide, through bf16 K/V and the 4-bit GEMVs): measured 1.63e-5 with the trunk's
 * own prompt logits inside 5e-6, so the full-width bound is 5e-5 (3x that, under the 1e-4
 * docs/developing.md §3 allows for bf16 KV attention; a layout or indexing error gives ~1). Also:
 * the op's errors (a step past K, a slot not ready). */
static void mtp_draft_case(int full, int bits) {
    rmodel r;
    rm_build(&r, full, bits);
    rm_add_mtp(&r, bits);
    const tl_config *c = &r.m.cfg;
    int V = c->n_vocab, D = c->n_embd, K = 3, max_ctx = 64, len[2] = {12, 7};
    tl_backend *b = open_spec(&r.m, 2, max_ctx, K, 0);
    if (!b) {
        rm_free(&r);
        return;
    }
    int32_t prompt[2][12];
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 12; i++) prompt[s][i] = (int32_t)(t_rng_next(&rs) % V);
    tl_fwd_entry e[2];
    memset(e, 0, sizeof e);
    float *lg = xmalloc(sizeof(float) * 2 * V);
    for (int s = 0; s < 2; s++)
        e[s].slot = s, e[s].tokens = prompt[s], e[s].n_tok = len[s], e[s].logits = lg + s * V;
    char err[256] = "";
    CHECK_EQ_INT(b->forward(b, e, 2, err, sizeof err), 0);
    CHECK(b->spec_ready(b, 0) && b->spec_ready(b, 1));
    cpu_state st[2];
    cpu_mtp_state ms[2];
    float *hid = xmalloc(sizeof(float) * 12 * D), *hc[2], *hn = xmalloc(sizeof(float) * D);
    float *lc = xmalloc(sizeof(float) * V), *dg = xmalloc(sizeof(float) * 2 * V);
    float route_gap = INFINITY;
    for (int s = 0; s < 2; s++) {
        CHECK_EQ_INT(cpu_state_init(&st[s], c, max_ctx), 0);
        CHECK_EQ_INT(cpu_mtp_state_init(&ms[s], c, max_ctx), 0);
        CHECK_EQ_INT(cpu_forward_h(&r.m, &st[s], prompt[s], len[s], lc, NULL, hid), 0);
        route_gap = fminf(route_gap, st[s].route_gap);
        check_nmse("mtp case: prompt logits", lg + s * V, lc, V, 5e-6);
        CHECK_EQ_INT(
            cpu_mtp_forward(&r.m, &ms[s], prompt[s] + 1, hid, len[s] - 1, 0, NULL, NULL, NULL), 0);
        hc[s] = xmalloc(sizeof(float) * D);
        memcpy(hc[s], hid + (size_t)(len[s] - 1) * D, sizeof(float) * D);
    }
    double worst = 0;
    for (int j = 0; j < K; j++) {
        tl_draft_entry d[2];
        for (int s = 0; s < 2; s++)
            d[s] = (tl_draft_entry){.slot = s,
                                    .step = j,
                                    .token = (int32_t)(t_rng_next(&rs) % V),
                                    .logits = dg + s * V};
        CHECK_EQ_INT(b->draft(b, d, 2, err, sizeof err), 0);
        for (int s = 0; s < 2; s++) {
            CHECK_EQ_INT(
                cpu_mtp_forward(&r.m, &ms[s], &d[s].token, hc[s], 1, len[s] - 1 + j, hn, lc, NULL),
                0);
            memcpy(hc[s], hn, sizeof(float) * D);
            double nm = t_nmse(dg + s * V, lc, V);
            if (!(nm <= worst)) worst = nm;
        }
    }
    double tol = full ? 5e-5 : 5e-6;
    printf("# mtp drafts %s %s vs cpu_mtp_forward: 2 sequences x %d steps, worst nmse %.3e (tol "
           "%.0e; trunk routing gap %.2e)\n",
           full ? "full-width" : "small", bits ? "q4" : "bf16", K, worst, tol, route_gap);
    CHECK(worst <= tol);
    tl_draft_entry bad = {.slot = 0, .step = K, .token = 1, .logits = dg};
    CHECK_EQ_INT(b->draft(b, &bad, 1, err, sizeof err), TL_ERR_INVALID);
    CHECK_EQ_INT(b->reset_slot(b, 1), 0);
    bad.slot = 1, bad.step = 0;
    CHECK(b->draft(b, &bad, 1, err, sizeof err) != 0); /* an empty slot has no row to draft */
    b->close(b);
    for (int s = 0; s < 2; s++) cpu_state_free(&st[s]), cpu_mtp_state_free(&ms[s]), free(hc[s]);
    free(lg), free(hid), free(hn), free(lc), free(dg);
    rm_free(&r);
}

/* A checkpoint without the head: opening for speculation is refused naming it; a backend opened
 * without it refuses spec_init (UNSUPPORTED), drafts and rollbacks (INVALID) with a message, and
 * forward refuses logits of every token. */
static void test_spec_without_head(void) {
    rmodel r;
    rm_build(&r, 0, 0);
    tl_cuda_params p = {.max_seqs = 2, .max_ctx = 64, .weight_bits = 16, .spec_tokens = 2};
    tl_backend *b = NULL;
    char err[512] = "";
    CHECK_EQ_INT(tl_backend_cuda_open(&b, &r.m, NULL, &p, err, sizeof err), TL_ERR_UNSUPPORTED);
    printf("# open with spec_tokens, no head: %s\n", err);
    CHECK(strstr(err, "MTP") != NULL);
    b = open_be(&r.m, 2, 64);
    if (b) {
        CHECK_EQ_INT(b->spec_init(b, 2, err, sizeof err), TL_ERR_UNSUPPORTED);
        CHECK(strstr(err, "MTP") != NULL);
        CHECK(!b->spec_ready(b, 0));
        float lg[1];
        tl_draft_entry d = {.slot = 0, .step = 0, .token = 1, .logits = lg};
        CHECK_EQ_INT(b->draft(b, &d, 1, err, sizeof err), TL_ERR_INVALID);
        CHECK_EQ_INT(b->rollback(b, 0, 1, err, sizeof err), TL_ERR_INVALID);
        int32_t tok[2] = {1, 2};
        float *al = xmalloc(sizeof(float) * 2 * r.m.cfg.n_vocab);
        tl_fwd_entry e;
        memset(&e, 0, sizeof e);
        e.slot = 0, e.tokens = tok, e.n_tok = 2, e.all_logits = al;
        CHECK_EQ_INT(b->forward(b, &e, 1, err, sizeof err), TL_ERR_UNSUPPORTED);
        free(al);
        b->close(b);
    }
    rm_free(&r);
}

/* One law's bits: survivors, ids, probabilities and logprobs. */
static int law_same(const tl_law *a, const tl_law *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (a->id[i] != b->id[i] || memcmp(&a->p[i], &b->p[i], 4) ||
            memcmp(&a->lp[i], &b->lp[i], 4))
            return 0;
    return 1;
}

/* Drafts chained on the device (draft_chain) against the step-by-step drafts with the host
 * drawing between steps (draft + tl_law_draw, as the engine did): three sequences wanting 3, 1
 * and 2 drafts (the chain runs them sorted, 3 rows, then 2, then 1), two with the model card's
 * sampling (top-k 20, top-p 0.95, presence penalty 1.5: the penalty counts the chain's tokens)
 * and one greedy. The drafts do not change a slot's state, so both runs start alike and must
 * give the same laws bit for bit, the same drafts, and use the same uniforms. Then the op's
 * errors: k past K, a slot twice. */
static void mtp_chain_case(int full, const char *mode) {
    rmodel r;
    rm_build(&r, full, 4);
    rm_add_mtp(&r, 4);
    int V = r.m.cfg.n_vocab, K = 3, N = 3, kk[3] = {3, 1, 2}, len[3] = {12, 7, 9};
    setenv("TL_CUDA_SPEC_CHAIN", mode, 1);
    tl_backend *b = open_spec(&r.m, N, 64, K, 0);
    unsetenv("TL_CUDA_SPEC_CHAIN");
    int chains = b && b->draft_chain;
    CHECK(chains);
    if (!chains) {
        if (b) b->close(b);
        rm_free(&r);
        return;
    }
    int32_t prompt[3][12], t0[3];
    tl_fwd_entry e[3];
    memset(e, 0, sizeof e);
    float *lg = xmalloc(sizeof(float) * N * V);
    for (int s = 0; s < N; s++) {
        for (int i = 0; i < 12; i++) prompt[s][i] = (int32_t)(t_rng_next(&rs) % V);
        e[s].slot = s, e[s].tokens = prompt[s], e[s].n_tok = len[s], e[s].logits = lg + s * V;
        t0[s] = (int32_t)(t_rng_next(&rs) % V);
    }
    char err[256] = "";
    CHECK_EQ_INT(b->forward(b, e, N, err, sizeof err), 0);
    tl_sample_params sp[3];
    for (int s = 0; s < N; s++) {
        memset(&sp[s], 0, sizeof sp[s]);
        sp[s].temperature = s == 1 ? 0.0f : 1.0f, sp[s].top_k = 20, sp[s].top_p = 0.95f;
        sp[s].repetition_penalty = 1.0f, sp[s].presence_penalty = 1.5f;
        CHECK(tl_law_ok(&sp[s]));
    }
    /* step by step: the engine's loop before draft_chain */
    tl_law law_a[3][TL_MAX_SPEC], law_b[3][TL_MAX_SPEC];
    int32_t chain[3][TL_MAX_SPEC + 1], drafts_b[3][TL_MAX_SPEC];
    int draws_a[3] = {0, 0, 0};
    for (int s = 0; s < N; s++) chain[s][0] = t0[s];
    for (int j = 0; j < K; j++) {
        tl_draft_entry d[3];
        int nd = 0;
        for (int s = 0; s < N; s++)
            if (kk[s] > j)
                d[nd++] = (tl_draft_entry){.slot = s,
                                           .step = j,
                                           .token = chain[s][j],
                                           .law = &law_a[s][j],
                                           .sample = &sp[s],
                                           .chain = chain[s]};
        CHECK_EQ_INT(b->draft(b, d, nd, err, sizeof err), 0);
        for (int s = 0; s < N; s++) {
            if (kk[s] <= j) continue;
            CHECK(law_a[s][j].n >= 1);
            uint64_t rng = 1000 + s;
            for (int u = 0; u < draws_a[s]; u++) tl_rng_uniform(&rng);
            uint64_t before = rng;
            chain[s][j + 1] = tl_law_draw(&law_a[s][j], sp[s].temperature <= 0, &rng);
            draws_a[s] += rng != before;
        }
    }
    /* chained on the device, entries in another order than their k */
    tl_chain_entry c[3];
    for (int s = 0; s < N; s++) {
        c[s] = (tl_chain_entry){.slot = s,
                                .k = kk[s],
                                .token = t0[s],
                                .greedy = sp[s].temperature <= 0,
                                .sample = &sp[s],
                                .law = law_b[s],
                                .drafts = drafts_b[s]};
        uint64_t rng = 1000 + s;
        for (int j = 0; j < kk[s]; j++) c[s].u[j] = tl_rng_uniform(&rng);
    }
    CHECK_EQ_INT(b->draft_chain(b, c, N, err, sizeof err), 0);
    int same = 1;
    for (int s = 0; s < N; s++) {
        same &= c[s].n_drafted == kk[s] && c[s].n_draws == draws_a[s];
        for (int j = 0; j < kk[s] && j < c[s].n_drafted; j++)
            same &= law_same(&law_a[s][j], &law_b[s][j]) && drafts_b[s][j] == chain[s][j + 1];
        printf("# chain %s seq %d: %d drafts (%d draws) %s\n", full ? "full-width" : "small", s,
               c[s].n_drafted, c[s].n_draws, same ? "== step by step" : "DIFFER");
    }
    CHECK(same);
    /* sequence 0 alone, twice (TL_CUDA_SPEC_CHAIN=2: captured, then replayed) */
    for (int rep = 0; rep < 2; rep++) {
        memset(law_b[0], 0, sizeof law_b[0]);
        CHECK_EQ_INT(b->draft_chain(b, c, 1, err, sizeof err), 0);
        int one = c[0].n_drafted == kk[0] && c[0].n_draws == draws_a[0];
        for (int j = 0; j < kk[0] && one; j++)
            one = law_same(&law_a[0][j], &law_b[0][j]) && drafts_b[0][j] == chain[0][j + 1];
        printf("# chain alone, call %d: %s\n", rep, one ? "== step by step" : "DIFFERS");
        CHECK(one);
    }
    c[0].k = K + 1;
    CHECK_EQ_INT(b->draft_chain(b, c, 1, err, sizeof err), TL_ERR_INVALID);
    c[0].k = 1, c[1] = c[0];
    CHECK_EQ_INT(b->draft_chain(b, c, 2, err, sizeof err), TL_ERR_INVALID);
    b->close(b);
    free(lg);
    rm_free(&r);
}
static void test_mtp_chain_small(void) { mtp_chain_case(0, "1"); }
static void test_mtp_chain_fullwidth(void) { mtp_chain_case(1, "1"); }
static void test_mtp_chain_graph(void) { mtp_chain_case(1, "2"); }

static void test_mtp_draft_small_bf16(void) { mtp_draft_case(0, 0); }
static void test_mtp_draft_small_q4(void) { mtp_draft_case(0, 4); }
static void test_mtp_draft_fullwidth_q4(void) { mtp_draft_case(1, 4); }

/* prompts of 52 tokens: the verifies and drafts cross the first KV page boundary (64), so
 * draft pages and their return on rollback are exercised */
enum { SP_N = 24, SP_P = 52, SP_SEQ = 3 };

/* The reference: SP_SEQ prompts decoded greedily without speculation, batched (slots 0..2):
 * ref[s][i] the i-th token (ref[s][0] from the prompt's logits), lg[s][i] its logits. */
typedef struct sp_ref {
    int32_t prompt[SP_SEQ][SP_P], tok[SP_SEQ][SP_N + 1];
    float *lg[SP_SEQ]; /* [SP_N + 1][V] */
    float margin[SP_SEQ][SP_N + 1];
} sp_ref;

static void sp_reference(tl_backend *b, sp_ref *r, int V) {
    tl_fwd_entry e[SP_SEQ];
    char err[256];
    for (int s = 0; s < SP_SEQ; s++) r->lg[s] = xmalloc(sizeof(float) * (SP_N + 1) * V);
    for (int i = 0; i <= SP_N; i++) {
        memset(e, 0, sizeof e);
        for (int s = 0; s < SP_SEQ; s++) {
            e[s].slot = s, e[s].logits = r->lg[s] + (size_t)i * V;
            e[s].pos = i ? SP_P + i - 1 : 0;
            e[s].tokens = i ? &r->tok[s][i - 1] : r->prompt[s], e[s].n_tok = i ? 1 : SP_P;
        }
        CHECK_EQ_INT(b->forward(b, e, SP_SEQ, err, sizeof err), 0);
        for (int s = 0; s < SP_SEQ; s++)
            r->tok[s][i] = argmax_margin(r->lg[s] + (size_t)i * V, V, &r->margin[s][i]);
    }
}

/* Steering: whether draft j of a verify at emitted count `at` is replaced by the reference token
 * (7 times in 10, a fixed hash), so acceptance and rollback run at every length. */
static int sp_steer(int s, int at, int j) {
    uint32_t h = (uint32_t)(at * 2654435761u) ^ (uint32_t)(s * 40503u + j * 977u);
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    return h % 10 < 7;
}

/* One speculating sequence of the run. */
typedef struct sp_seq {
    int slot, n_out, diverged, compared;
    int32_t hist[SP_P + SP_N + 8]; /* prompt, then the emitted tokens */
    int32_t vt[TL_MAX_SPEC + 1];   /* the verify's tokens: t0, drafts */
    int k;
} sp_seq;

/* The page pool holds exactly each slot's ceil(len / 64) pages (a rollback returned the rest). */
static void sp_check_pages(tl_backend *b, const int *len, int n) {
    tl_kv_stats ks;
    b->kv_stats(b, &ks);
    int held = 0;
    for (int i = 0; i < n; i++) held += TL_CEIL_DIV(len[i], ks.page_tokens);
    CHECK_EQ_INT(ks.pages_total - ks.pages_free, held);
}

/* A verify's law rows (all_laws under lp) against the host's tl_sample_law of the same logits
 * rows (all_logits) and histories: row i counts the history before pos and tokens 0..i. The same
 * survivors, probabilities to 1e-5. */
static void sp_check_laws(const sp_seq *x, int pos, const float *al, const tl_law *laws,
                          const tl_sample_params *lp, int V) {
    int32_t h[SP_P + SP_N + TL_MAX_SPEC + 8];
    memcpy(h, x->hist, sizeof(int32_t) * pos);
    int nv = TL_MIN(V, TL_N_VOCAB_TOKENS), bad = 0;
    for (int i = 0; i <= x->k; i++) {
        h[pos + i] = x->vt[i];
        tl_law ref;
        CHECK_EQ_INT(tl_sample_law(al + (size_t)i * V, nv, lp, h, pos + i + 1, SP_P, &ref), 0);
        int same = laws[i].n == ref.n && ref.n > 0;
        for (int j = 0; same && j < ref.n; j++)
            same = laws[i].id[j] == ref.id[j] && fabsf(laws[i].p[j] - ref.p[j]) <= 1e-5f;
        if (!same)
            printf("#   verify law row %d at pos %d: %d survivors (host %d), best %d (host %d)\n",
                   i, pos, laws[i].n, ref.n, laws[i].id[0], ref.id[0]);
        bad += !same;
    }
    CHECK_EQ_INT(bad, 0);
}

/* One step of the run: K chained drafts of sequences 0 and 1 (steered), the verify of both and a
 * plain decode token of sequence 2 in one forward; acceptance on the host by argmax (the
 * engine's greedy rule), rollback of the rejected drafts. Every verify row that follows only
 * reference tokens is compared with the reference's logits at that position. */
static int sp_step(tl_backend *b, const sp_ref *r, sp_seq *q, int K, int V, double *worst) {
    char err[256];
    float *dl = xmalloc(sizeof(float) * 2 * V), *al = xmalloc(sizeof(float) * 2 * (K + 1) * V);
    float *pl = xmalloc(sizeof(float) * V);
    for (int s = 0; s < 2; s++) {
        q[s].k = TL_MIN(K, SP_N - q[s].n_out); /* never past the reference */
        q[s].vt[0] = q[s].hist[SP_P + q[s].n_out - 1];
    }
    for (int j = 0; j < K; j++) {
        tl_draft_entry d[2];
        int nd = 0, who[2];
        for (int s = 0; s < 2; s++)
            if (q[s].k > j)
                who[nd] = s, d[nd++] = (tl_draft_entry){.slot = q[s].slot,
                                                        .step = j,
                                                        .token = q[s].vt[j],
                                                        .logits = dl + (size_t)s * V};
        if (!nd) break;
        CHECK_EQ_INT(b->draft(b, d, nd, err, sizeof err), 0);
        for (int t = 0; t < nd; t++) {
            int s = who[t], at = q[s].n_out + j;
            float m;
            int32_t dt = argmax_margin(dl + (size_t)s * V, V, &m);
            if (sp_steer(s, at, j)) dt = r->tok[s][at];
            q[s].vt[j + 1] = dt;
        }
    }
    tl_fwd_entry e[3];
    memset(e, 0, sizeof e);
    for (int s = 0; s < 2; s++) {
        e[s].slot = q[s].slot, e[s].pos = SP_P + q[s].n_out - 1, e[s].tokens = q[s].vt;
        e[s].n_tok = q[s].k + 1, e[s].all_logits = al + (size_t)s * (K + 1) * V;
        e[s].n_prompt = SP_P;
    }
    /* sequence 0's verify rows also as laws under penalised sampling (cuda_spec.cu's law rows,
     * each with its own count adjustments): checked against tl_sample_law below */
    tl_sample_params lp;
    memset(&lp, 0, sizeof lp);
    lp.temperature = 1.0f, lp.top_k = 20, lp.top_p = 0.95f, lp.presence_penalty = 1.5f;
    lp.frequency_penalty = 0.5f, lp.repetition_penalty = 1.2f;
    tl_law laws[TL_MAX_SPEC + 1];
    e[0].all_laws = laws, e[0].law_sample = &lp;
    /* sequence 2 decodes plainly in the same step (its own reference position) */
    int n_e = q[2].n_out <= SP_N ? 3 : 2;
    if (n_e == 3) {
        e[2].slot = q[2].slot, e[2].pos = SP_P + q[2].n_out - 1, e[2].n_prompt = SP_P;
        e[2].tokens = &q[2].hist[SP_P + q[2].n_out - 1], e[2].n_tok = 1, e[2].logits = pl;
    }
    CHECK_EQ_INT(b->forward(b, e, n_e, err, sizeof err), 0);
    if (n_e == 3) {
        double nm = t_nmse(pl, r->lg[2] + (size_t)q[2].n_out * V, V);
        if (!(nm <= *worst)) *worst = nm;
        float m;
        q[2].hist[SP_P + q[2].n_out] = argmax_margin(pl, V, &m);
        q[2].n_out++;
    }
    sp_check_laws(&q[0], e[0].pos, al, laws, &lp, V);
    for (int s = 0; s < 2; s++) {
        int acc = 0, stop = 0;
        for (int i = 0; i <= q[s].k && !stop; i++) {
            const float *row = al + ((size_t)s * (K + 1) + i) * V;
            int at = q[s].n_out; /* this row predicts reference token `at` */
            float m;
            int32_t y = argmax_margin(row, V, &m);
            if (!q[s].diverged) {
                double nm = t_nmse(row, r->lg[s] + (size_t)at * V, V);
                if (!(nm <= *worst)) *worst = nm;
                if (r->margin[s][at] <= 1e-3f)
                    q[s].diverged = 1; /* a near-tie: the two runs may part here */
                else {
                    q[s].compared++;
                    CHECK_EQ_INT(y, r->tok[s][at]);
                }
            }
            q[s].hist[SP_P + q[s].n_out++] = y;
            stop = i == q[s].k || q[s].vt[i + 1] != y;
            if (!stop) acc++;
        }
        int n_keep = e[s].pos + 1 + acc;
        if (acc < q[s].k) CHECK_EQ_INT(b->rollback(b, q[s].slot, n_keep, err, sizeof err), 0);
    }
    free(dl), free(al), free(pl);
    return 0;
}

/* Greedy output with speculation equals decoding without it, for K = 1..4: two speculating
 * sequences and one plain one share every step, drafts steered to the reference 7 times in 10
 * so that every acceptance length and rollback occurs. The reference is this GPU's own plain
 * decoding (slots 0..2 of the same backend). Checked: every emitted token equals the reference's
 * where its top-2 margin exceeds 1e-3 (the first near-tie ends the comparison of that sequence;
 * at least half of the two sequences' tokens must be compared), and every verify row's logits
 * (including rows after a rollback, i.e. rollback then continue == never drafted) against the
 * reference's at the same position: NMSE <= 1e-6. Both runs use the same kernels in f32 except the
 * split-KV attention's partition (a verify is not a one-token micro-batch) and the recompute's
 * segment length, which change only the order of f32 sums (~1e-12); a wrong GDN state or KV length
 * (a rejected draft left in) moves logits by NMSE > 1e-3. Then the pages each slot holds, a
 * rollback past the verify (refused), and the penalty counts: a device-sampled step with a strong
 * negative presence penalty after rollbacks picks the host sampler's token over the accepted
 * history (stale counts would still hold the rejected drafts). TL_CUDA_TC_MIN=0 keeps the
 * full-width model on the GEMV path for both runs (the tensor-core path's rounding is
 * test_tc_decode_batched's; open_spec). Rollback by the verify's state copies (the default), and
 * once (small q4) by TL_CUDA_SPEC_RECOMPUTE=1's restore and recompute. */
static void spec_greedy_case(int full, int bits, int recompute) {
    rmodel rm;
    rm_build(&rm, full, bits);
    rm_add_mtp(&rm, bits);
    const tl_config *c = &rm.m.cfg;
    int V = c->n_vocab;
    tl_backend *b = open_spec(&rm.m, 6, 128, TL_MAX_SPEC, recompute);
    if (!b) {
        rm_free(&rm);
        return;
    }
    sp_ref *r = xcalloc(1, sizeof *r);
    /* the case's own generator: the same prompts alone (T_ONLY=spec) as in the suite */
    unsigned long long prs = 0x5bec5bec00ull + (unsigned)(4 * full + 2 * (bits != 0) + recompute);
    for (int s = 0; s < SP_SEQ; s++)
        for (int i = 0; i < SP_P; i++) r->prompt[s][i] = (int32_t)(t_rng_next(&prs) % V);
    sp_reference(b, r, V);
    char err[256];
    for (int K = 1; K <= TL_MAX_SPEC; K++) {
        sp_seq q[SP_SEQ];
        memset(q, 0, sizeof q);
        tl_fwd_entry e[SP_SEQ];
        memset(e, 0, sizeof e);
        float *lg = xmalloc(sizeof(float) * SP_SEQ * V);
        for (int s = 0; s < SP_SEQ; s++) {
            q[s].slot = 3 + s;
            CHECK_EQ_INT(b->reset_slot(b, q[s].slot), 0);
            memcpy(q[s].hist, r->prompt[s], sizeof r->prompt[s]);
            e[s].slot = q[s].slot, e[s].tokens = r->prompt[s], e[s].n_tok = SP_P;
            e[s].logits = lg + (size_t)s * V, e[s].n_prompt = SP_P;
        }
        CHECK_EQ_INT(b->forward(b, e, SP_SEQ, err, sizeof err), 0);
        for (int s = 0; s < SP_SEQ; s++) {
            float m;
            q[s].hist[SP_P] = argmax_margin(lg + (size_t)s * V, V, &m);
            CHECK_EQ_INT(q[s].hist[SP_P], r->tok[s][0]);
            q[s].n_out = 1;
        }
        double worst = 0;
        int steps = 0;
        while (q[0].n_out <= SP_N && q[1].n_out <= SP_N) {
            sp_step(b, r, q, K, V, &worst);
            steps++;
            int len[6] = {SP_P + SP_N, SP_P + SP_N, SP_P + SP_N};
            for (int s = 0; s < SP_SEQ; s++) len[3 + s] = SP_P + q[s].n_out - 1;
            sp_check_pages(b, len, 6);
        }
        printf("# spec greedy %s %s%s K=%d: %d steps for %d + %d tokens, compared %d + %d, worst "
               "logits nmse %.3e (tol 1e-6)\n",
               full ? "full-width" : "small", bits ? "q4" : "bf16",
               recompute ? " (restore + recompute)" : "", K, steps, q[0].n_out, q[1].n_out,
               q[0].compared, q[1].compared, worst);
        CHECK(worst <= 1e-6);
        /* coverage: half of both sequences' tokens compared (a near-tie ends one early) */
        CHECK(q[0].compared + q[1].compared >= SP_N);
        CHECK(steps < SP_N); /* the steered drafts were accepted: fewer steps than tokens */
        /* a rollback without a verify before it is refused */
        CHECK_EQ_INT(b->rollback(b, q[0].slot, SP_P, err, sizeof err), TL_ERR_INVALID);
        /* penalty counts after rollbacks: device greedy with presence -20 == the host sampler */
        {
            sp_seq *x = &q[0];
            int pos = SP_P + x->n_out - 1;
            tl_sample_params sp;
            memset(&sp, 0, sizeof sp);
            sp.top_p = 1.0f, sp.repetition_penalty = 1.0f, sp.presence_penalty = -20.0f;
            tl_sample_out so, ho;
            uint64_t rng = 3, hr = 3;
            tl_fwd_entry pe;
            memset(&pe, 0, sizeof pe);
            pe.slot = x->slot, pe.pos = pos, pe.tokens = &x->hist[pos], pe.n_tok = 1;
            pe.logits = lg, pe.sample = &sp, pe.rng = &rng, pe.out = &so;
            pe.history = x->hist, pe.n_history = pos + 1, pe.n_prompt = SP_P;
            CHECK_EQ_INT(b->forward(b, &pe, 1, err, sizeof err), 0);
            CHECK_EQ_INT(tl_sample_host(lg, V, &sp, &hr, x->hist, pos + 1, SP_P, &ho), 0);
            printf("#   presence -20 after rollbacks: device token %d, host %d\n", so.token,
                   ho.token);
            CHECK_EQ_INT(so.token, ho.token);
        }
        free(lg);
    }
    b->close(b);
    for (int s = 0; s < SP_SEQ; s++) free(r->lg[s]);
    free(r);
    rm_free(&rm);
}

static void test_spec_greedy_small_bf16(void) { spec_greedy_case(0, 0, 0); }
static void test_spec_greedy_small_q4(void) { spec_greedy_case(0, 4, 0); }
static void test_spec_greedy_fullwidth_q4(void) { spec_greedy_case(1, 4, 0); }
static void test_spec_greedy_recompute(void) { spec_greedy_case(0, 4, 1); }

/* The head's rows on the tensor-core path: production widths (random 4-bit weights), a prompt of
 * 64 tokens prefilled as one chunk (the GEMM path: its head rows through fc and the in-projection
 * as GEMMs) in slot 0 and token by token (the GEMV path) in slot 1; three chained draft steps of
 * both must agree within the bound of test_prefill_gemm_vs_decode (NMSE 1e-2: bf16 activations
 * into the GEMMs) and pick the same top-1 unless its margin is small. Then the verify logits on
 * that path: 4-token verifies of both slots in one micro-batch of 8 tokens (the batched
 * tensor-core decode path) against the same tokens fed one at a time, same bound. */
static void test_spec_gemm_path(void) {
    tl_config c;
    prod4_cfg(&c);
    tl_cuda_params p = {.max_seqs = 2,
                        .max_ctx = 512,
                        .random_weights = 1,
                        .seed = 7,
                        .weight_bits = 4,
                        .spec_tokens = 3};
    tl_backend *b = NULL;
    char err[512] = "";
    int st = tl_backend_cuda_open(&b, NULL, &c, &p, err, sizeof err);
    if (!st) st = b->spec_init(b, 3, err, sizeof err);
    CHECK_EQ_INT(st, 0);
    if (st) {
        printf("# %s\n", err);
        if (b) b->close(b);
        return;
    }
    int V = c.n_vocab, n = 64;
    int32_t *tok = xmalloc(sizeof(int32_t) * (n + 8));
    for (int i = 0; i < n + 8; i++) tok[i] = (int32_t)(t_rng_next(&rs) % TL_N_VOCAB_TOKENS);
    float *la = xmalloc(sizeof(float) * 4 * V), *lb = xmalloc(sizeof(float) * 4 * V);
    for (int i = 0; i < n; i++) CHECK_EQ_INT(fwd1(b, 1, i, tok + i, 1, NULL), 0);
    CHECK_EQ_INT(fwd1(b, 0, 0, tok, n, NULL), 0);
    for (int j = 0; j < 3; j++) {
        tl_draft_entry d[2] = {{.slot = 0, .step = j, .token = tok[n + j], .logits = la},
                               {.slot = 1, .step = j, .token = tok[n + j], .logits = lb}};
        CHECK_EQ_INT(b->draft(b, d, 2, err, sizeof err), 0);
        float ma, mb;
        int ta = argmax_margin(la, V, &ma), tb = argmax_margin(lb, V, &mb);
        printf("# draft step %d, head rows by GEMM vs GEMV: top-1 %d vs %d (margin %.3f)\n", j, ta,
               tb, mb);
        check_nmse("mtp draft gemm vs gemv rows", la, lb, V, 1e-2);
        CHECK(ta == tb || mb < 0.05f);
    }
    tl_fwd_entry e[2];
    memset(e, 0, sizeof e);
    for (int s = 0; s < 2; s++)
        e[s].slot = s, e[s].pos = n, e[s].tokens = tok + n, e[s].n_tok = 4,
        e[s].all_logits = s ? lb : la;
    CHECK_EQ_INT(b->forward(b, e, 2, err, sizeof err), 0); /* 8 tokens: the tensor-core path */
    CHECK_EQ_INT(b->rollback(b, 1, n + 1, err, sizeof err), 0);
    float *lc = xmalloc(sizeof(float) * V);
    for (int i = 1; i < 4; i++) {
        CHECK_EQ_INT(fwd1(b, 1, n + i, tok + n + i, 1, lc), 0);
        check_nmse("verify row (tensor cores) vs decode", la + (size_t)i * V, lc, V, 1e-2);
    }
    b->close(b);
    free(tok), free(la), free(lb), free(lc);
}

/* ====== Snapshots inside a step (issue 14 B; backend.h snap_at, docs/architecture.md §4.1) ======
 * One forward of [pos0, N) with the snapshot point S inside it (slot 0) against [pos0, S) computed
 * alone, saved, then [S, N) (slot 1, the reference, saved under another salt): the two snapshots'
 * conv and recurrent state, the logits at N - 1, and a load of the in-step snapshot (slot 2) then
 * [S, N) against the reference's logits. Cases: S at a page boundary and inside one, S one and two
 * tokens into the segment (the conv rows from the slot's earlier state), S - pos0 a multiple of
 * 64 and not, S one before the end; with_short: a 10-token entry of another slot in the same
 * forward (a mixed micro-batch: on the GEMM path the long segment takes gdn_tc's cut).
 * Small model (decode kernels): the micro-batch is cut at S, so alone it computes exactly what the
 * reference computes: bit for bit; with another entry in the micro-batch the GEMV lane split
 * moves the fp32 order (test_batched_eq_alone's bound, 1e-8). GEMM path: only the chunked GDN is
 * cut (its chunks start at pos0 as in the reference), but the projections see N - pos0 rows
 * instead of S - pos0 (another GEMM tile, split-K), so the states differ by that rounding, carried
 * through the MoE: bound `tol` (the logits bound pc_case uses on this path). Measured on the H200
 * (210b738): bitwise in 6 of the 8 cases; S = 2 from 0 conv 9.2e-4, recurrent 2.2e-3, logits
 * 2.2e-6; S = 101 from 100 5.9e-6 / 1.3e-5 / 7.0e-7 (a first piece under 16 tokens runs on other
 * kernels): 1e-2 is 4.5x the worst. */
typedef struct mid_shape {
    int n_gdn, conv_n, rec_n; /* GDN layers; floats of one layer's conv / recurrent state */
} mid_shape;

static mid_shape mid_shape_of(const tl_config *c) {
    mid_shape m = {0, 3 * tl_config_gdn_conv_dim(c), c->gdn_n_v_head * 128 * 128};
    for (int il = 0; il < c->n_layer; il++) m.n_gdn += c->layer_kind[il] == TL_LAYER_GDN;
    return m;
}

/* One forward of slot: [pos, pos + n) with the point snap_at (0: none) into snapshot snap. */
static int fwd_snap(tl_backend *b, int slot, int pos, const int32_t *tok, int n, int snap_at,
                    int snap, float *logits, int short_slot, const int32_t *short_tok) {
    tl_fwd_entry e[2];
    memset(e, 0, sizeof e);
    e[0].slot = slot, e[0].pos = pos, e[0].tokens = tok + pos, e[0].n_tok = n;
    e[0].logits = logits, e[0].snap_at = snap_at, e[0].snap = snap;
    e[1].slot = short_slot, e[1].tokens = short_tok, e[1].n_tok = 10; /* pos 0 */
    char err[256] = "";
    int st = b->forward(b, e, short_slot >= 0 ? 2 : 1, err, sizeof err);
    if (st) printf("# forward: %s\n", err);
    return st;
}

/* Snapshot bytes a vs z: NMSE of the conv and of the recurrent parts (f32 state), bitwise flag. */
static void mid_cmp(const mid_shape *m, const float *a, const float *z, double *nm_conv,
                    double *nm_rec, int *same) {
    size_t rec = (size_t)m->n_gdn * m->rec_n, conv = (size_t)m->n_gdn * m->conv_n;
    *nm_rec = t_nmse(a, z, rec);
    *nm_conv = t_nmse(a + rec, z + rec, conv);
    *same = !memcmp(a, z, (rec + conv) * sizeof(float));
}

static void mid_case(tl_backend *b, const tl_config *c, int V_tok, const char *what, int pos0,
                     int S, int with_short, int bitwise, double tol) {
    pc_run r;
    int V = c->n_vocab;
    if (pc_open(&r, b, V)) return;
    enum { N = 200 };
    mid_shape m = mid_shape_of(c);
    size_t sb = b->pc_snap_bytes;
    CHECK_EQ_INT((long)sb, (long)(m.n_gdn * (size_t)(m.conv_n + m.rec_n) * sizeof(float)));
    int32_t tok[N], stok[10], pages[8];
    unsigned long long prs = 0x5eed0016ull + (unsigned)(S * 7 + pos0);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(t_rng_next(&prs) % (unsigned)V_tok);
    for (int i = 0; i < 10; i++) stok[i] = (int32_t)(t_rng_next(&prs) % (unsigned)V_tok);
    char err[256] = "";
    float *la = xmalloc(sizeof(float) * V), *lb = xmalloc(sizeof(float) * V);
    float *lc = xmalloc(sizeof(float) * V);
    float *sa = xmalloc(sb), *sz = xmalloc(sb);
    /* slot 0: [pos0, N) in one forward, the point S inside; the snapshot planned after it */
    if (pos0) CHECK_EQ_INT(fwd1(b, 0, 0, tok, pos0, NULL), 0);
    int si = tl_pc_reserve(&r.pc, NULL, tok, S);
    CHECK(si >= 0);
    CHECK_EQ_INT(fwd_snap(b, 0, pos0, tok, N - pos0, S, si, la, with_short ? 2 : -1, stok), 0);
    tl_pc_io io;
    CHECK_EQ_INT(tl_pc_plan_save_at(&r.pc, NULL, tok, S, 0, si, &io), 1);
    CHECK(io.state_in && io.snap == si);
    CHECK_EQ_INT(b->cache_save(b, 0, &io, err, sizeof err), 0);
    tl_pc_commit(&r.pc, &io);
    /* slot 1: the reference, [pos0, S) alone, saved (salt "ref"), then [S, N) */
    if (pos0) CHECK_EQ_INT(fwd1(b, 1, 0, tok, pos0, NULL), 0);
    CHECK_EQ_INT(fwd1(b, 1, pos0, tok + pos0, S - pos0, NULL), 0);
    CHECK_EQ_INT(tl_pc_plan_save(&r.pc, "ref", tok, S, 1, 0, &io), 1);
    int sref = io.snap;
    CHECK_EQ_INT(b->cache_save(b, 1, &io, err, sizeof err), 0);
    tl_pc_commit(&r.pc, &io);
    CHECK_EQ_INT(fwd1(b, 1, S, tok + S, N - S, lb), 0);
    CHECK_EQ_INT(tl_backend_cuda_snapshot(b, si, sa), 0);
    CHECK_EQ_INT(tl_backend_cuda_snapshot(b, sref, sz), 0);
    double nm_conv, nm_rec;
    int same;
    mid_cmp(&m, sa, sz, &nm_conv, &nm_rec, &same);
    /* slot 2: the in-step snapshot loaded, then [S, N) (slots 0 and 1 reset first: the small
     * backend's pool holds three sequences, the cache's pages come out of it) */
    for (int q = 0; q < 3; q++) CHECK_EQ_INT(b->reset_slot(b, q), 0);
    CHECK(tl_pc_lookup(&r.pc, NULL, tok, N, N - 1, pages, &io) == si);
    CHECK_EQ_INT(io.n_tok, S);
    CHECK_EQ_INT(b->cache_load(b, 2, &io, tok, 0, err, sizeof err), 0);
    CHECK_EQ_INT(fwd1(b, 2, S, tok + S, N - S, lc), 0);
    double nm_ab = t_nmse(la, lb, V), nm_cb = t_nmse(lc, lb, V);
    int same_c = !memcmp(lc, lb, sizeof(float) * V);
    float mb, mc;
    int tb = argmax_margin(lb, V, &mb), tc = argmax_margin(lc, V, &mc);
    printf("# in-step snapshot %s, [%d, %d) point %d%s: state == split %s (conv nmse %.3e, "
           "recurrent %.3e); logits at N-1 nmse %.3e; loaded + rest vs split: %s, nmse %.3e, "
           "top-1 %d vs %d (margin %.3f)\n",
           what, pos0, N, S, with_short ? " + a short entry" : "", same ? "bitwise" : "NOT bitwise",
           nm_conv, nm_rec, nm_ab, same_c ? "bitwise" : "not bitwise", nm_cb, tc, tb, mb);
    if (bitwise) {
        CHECK(same);
        CHECK(same_c);
        CHECK(!memcmp(la, lb, sizeof(float) * V));
    }
    CHECK(nm_conv <= tol && nm_rec <= tol);
    CHECK(nm_ab <= tol && nm_cb <= tol);
    CHECK(tc == tb || mb < 0.05f);
    for (int s = 0; s < 3; s++) CHECK_EQ_INT(b->reset_slot(b, s), 0);
    tl_pc_clear(&r.pc);
    CHECK_EQ_INT(b->kv_pool(b)->n_free, b->kv_pool(b)->n_page);
    tl_pc_free(&r.pc);
    free(la), free(lb), free(lc), free(sa), free(sz);
}

static const int MID_CASES[][3] = {/* pos0, S, with_short */
                                   {0, 128, 0},   {0, 150, 0},   {0, 2, 0},   {100, 101, 0},
                                   {100, 164, 0}, {100, 199, 0}, {0, 150, 1}, {100, 164, 1}};

static void test_prefix_mid_entry_small(void) {
    rmodel r;
    rm_build(&r, 0, 4);
    tl_backend *b = open_pc_small(&r);
    if (b) {
        for (size_t k = 0; k < sizeof MID_CASES / sizeof MID_CASES[0]; k++) {
            const int *q = MID_CASES[k];
            mid_case(b, &r.m.cfg, r.m.cfg.n_vocab, "small q4, decode kernels (cut micro-batch)",
                     q[0], q[1], q[2], !q[2], 1e-8);
        }
        b->close(b);
    }
    rm_free(&r);
}

static void test_prefix_mid_entry_gemm(void) {
    tl_config c;
    tl_backend *b = open_pc_fullwidth(&c);
    if (!b) return;
    for (size_t k = 0; k < sizeof MID_CASES / sizeof MID_CASES[0]; k++) {
        const int *q = MID_CASES[k];
        mid_case(b, &c, TL_N_VOCAB_TOKENS, "full width q4, GEMM path (chunked GDN cut)", q[0], q[1],
                 q[2], 0, 1e-2);
    }
    b->close(b);
}

/* ====== A prefix-cache hit drafts (docs/architecture.md §3.6) ======
 * The small q4 model with a head (K = 2), a 64 MiB cache, 3 slots of 256 tokens. Two ways to
 * take the snapshot of the first S = 150 tokens (2 full pages, a partial one of 22 rows):
 *   after the step  slot 0 prefills S and is saved: its ring's hidden of S - 1 goes with it;
 *   in the step     slot 2 prefills 200 tokens with the point S inside (fwd_snap): the hidden is
 *                   the micro-batch's row of S - 1.
 * Slot 1 loads the snapshot and must report spec_ready; then one draft call of slot 1 and a
 * reference slot holding the same S tokens computed whole (slot 0), both with token S: the same
 * hidden, the same head KV rows (full pages shared, the partial page copied with the head's
 * layer), the same kernels, so the same draft logits (bit for bit after the step; in the step the
 * hidden comes from a micro-batch cut at S, printed, NMSE <= 1e-6). Without the hidden or the head
 * layer's partial rows the logits move by far more (the hidden is the head's input). */
static void spec_pc_draft(tl_backend *b, int V, int slot_ref, const int32_t *tok, int S,
                          const char *what, int bitwise) {
    char err[256] = "";
    CHECK(b->spec_ready(b, 1));
    float *l = xmalloc(sizeof(float) * 2 * V);
    tl_draft_entry d[2];
    memset(d, 0, sizeof d);
    d[0].slot = slot_ref, d[0].token = tok[S], d[0].logits = l;
    d[1].slot = 1, d[1].token = tok[S], d[1].logits = l + V;
    CHECK_EQ_INT(b->draft(b, d, 2, err, sizeof err), 0);
    double nm = t_nmse(l + V, l, V);
    int same = !memcmp(l, l + V, sizeof(float) * V);
    printf("# prefix-cache hit drafts (%s): draft logits vs computed whole: %s, nmse %.3e\n", what,
           same ? "bitwise" : "not bitwise", nm);
    if (bitwise) CHECK(same);
    CHECK(nm <= 1e-6);
    free(l);
}

static void test_spec_prefix_cache(void) {
    rmodel rm;
    rm_build(&rm, 0, 4);
    rm_add_mtp(&rm, 4);
    int V = rm.m.cfg.n_vocab;
    tl_cuda_params p = {.max_seqs = 3,
                        .max_ctx = 256,
                        .weight_bits = 16,
                        .spec_tokens = 2,
                        .prefix_cache_bytes = 64ll << 20};
    tl_backend *b = NULL;
    char err[512] = "";
    setenv("TL_CUDA_TC_MIN", "0", 1);
    int st = tl_backend_cuda_open(&b, &rm.m, NULL, &p, err, sizeof err);
    unsetenv("TL_CUDA_TC_MIN");
    if (!st) st = b->spec_init(b, 2, err, sizeof err);
    if (st) printf("# %s\n", err);
    CHECK_EQ_INT(st, 0);
    pc_run r;
    if (st || pc_open(&r, b, V)) {
        if (b) b->close(b);
        rm_free(&rm);
        return;
    }
    enum { N = 200, S = 150 };
    int32_t tok[N], tok2[N], pages[8];
    unsigned long long prs = 0x5eed0017ull;
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(t_rng_next(&prs) % (unsigned)V);
    for (int i = 0; i < N; i++) tok2[i] = (int32_t)(t_rng_next(&prs) % (unsigned)V);
    tl_pc_io io;
    /* after the step */
    CHECK_EQ_INT(fwd1(b, 0, 0, tok, S, NULL), 0);
    CHECK_EQ_INT(tl_pc_plan_save(&r.pc, NULL, tok, S, 0, 0, &io), 1);
    CHECK_EQ_INT(b->cache_save(b, 0, &io, err, sizeof err), 0);
    tl_pc_commit(&r.pc, &io);
    CHECK(tl_pc_lookup(&r.pc, NULL, tok, N, N - 1, pages, &io) >= 0);
    CHECK_EQ_INT(io.n_tok, S);
    CHECK_EQ_INT(b->cache_load(b, 1, &io, tok, 0, err, sizeof err), 0);
    spec_pc_draft(b, V, 0, tok, S, "snapshot after the step", 1);
    for (int q = 0; q < 3; q++) CHECK_EQ_INT(b->reset_slot(b, q), 0);
    tl_pc_clear(&r.pc);
    /* in the step */
    int si = tl_pc_reserve(&r.pc, NULL, tok2, S);
    CHECK(si >= 0);
    CHECK_EQ_INT(fwd_snap(b, 2, 0, tok2, N, S, si, NULL, -1, NULL), 0);
    CHECK_EQ_INT(tl_pc_plan_save_at(&r.pc, NULL, tok2, S, 2, si, &io), 1);
    CHECK_EQ_INT(b->cache_save(b, 2, &io, err, sizeof err), 0);
    tl_pc_commit(&r.pc, &io);
    CHECK_EQ_INT(b->reset_slot(b, 2), 0);
    CHECK(tl_pc_lookup(&r.pc, NULL, tok2, N, N - 1, pages, &io) == si);
    CHECK_EQ_INT(b->cache_load(b, 1, &io, tok2, 0, err, sizeof err), 0);
    CHECK_EQ_INT(fwd1(b, 0, 0, tok2, S, NULL), 0);
    spec_pc_draft(b, V, 0, tok2, S, "snapshot in the step", 0);
    for (int q = 0; q < 3; q++) CHECK_EQ_INT(b->reset_slot(b, q), 0);
    tl_pc_clear(&r.pc);
    tl_pc_free(&r.pc);
    b->close(b);
    rm_free(&rm);
}

int main(int argc, char **argv) {
    char err[256];
    if (tl_gpu_init(0, err, sizeof err)) {
        printf("FAIL gpu_init: %s\n", err);
        return 1;
    }
    int quick =
        argc > 1 && !strcmp(argv[1], "--quick"); /* compute-sanitizer run: small model only */
    T_RUN(test_e2e_small_bf16);
    T_RUN(test_e2e_small_q4);
    if (!quick) {
        T_RUN(test_e2e_fullwidth_bf16);
        T_RUN(test_e2e_fullwidth_q4);
    }
    T_RUN(test_prefill_chunked_eq_tokenwise);
    T_RUN(test_kv_pool);
    T_RUN(test_determinism);
    T_RUN(test_batched_eq_alone);
    T_RUN(test_sampling_and_errors);
    T_RUN(test_prepare_callback);
    if (!quick) T_RUN(test_prefill_gemm_vs_decode);
    if (!quick) T_RUN(test_tc_decode_batched);
    if (!quick) T_RUN(test_mixed_step);
    T_RUN(test_poisoned_router); /* after the others: the tests above keep their random draws */
    T_RUN(test_prefix_cache_small);
    if (!quick) T_RUN(test_prefix_cache_gemm_path);
    T_RUN(test_device_select);
    T_RUN(test_spec_without_head);
    T_RUN(test_mtp_draft_small_bf16);
    T_RUN(test_mtp_draft_small_q4);
    T_RUN(test_mtp_chain_small);
    T_RUN(test_mtp_chain_fullwidth);
    T_RUN(test_mtp_chain_graph);
    if (!quick) T_RUN(test_mtp_draft_fullwidth_q4);
    T_RUN(test_spec_greedy_small_bf16);
    T_RUN(test_spec_greedy_small_q4);
    if (!quick) T_RUN(test_spec_greedy_fullwidth_q4);
    T_RUN(test_spec_greedy_recompute);
    T_RUN(test_spec_prefix_cache);
    if (!quick) T_RUN(test_spec_gemm_path);
    T_RUN(test_prefix_mid_entry_small); /* appended: the tests above keep their random draws */
    if (!quick) T_RUN(test_prefix_mid_entry_gemm);
    return t_summary();
}
