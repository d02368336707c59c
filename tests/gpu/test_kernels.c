/* Every decode kernel (tl_gpu_* in src/cuda/gpu.h) against the CPU oracle (src/cpu/cpu.h) on
 * random inputs at the production shapes (shape.h), except where a count is cut to keep host
 * memory small (named in the test).
 *
 * Tolerances. The oracle accumulates in double; the kernels in fp32 with a different order. For
 * a dot of K terms of random sign the fp32 rounding error is about sqrt(K) * 2^-24 relative to
 * the sum of |terms|, so NMSE against the oracle is ~1e-13..1e-11 for K <= 4096: a bound of 1e-9
 * leaves 100x headroom while still catching any indexing, layout or dequantization slip (those
 * give NMSE ~ 1). Both sides read the same bf16 / 4-bit weights, so the weight format adds no
 * error. Where the GPU stores bf16 (the KV cache) the check is against the oracle's value rounded
 * to bf16, one ulp allowed. */
#include <math.h>
#include <stdio.h>
#include "engine/sample.h"
#include "gpu_util.h"
#include "gpu/draft_pick_case.h"
#include "gpu/route_plan_case.h"
#include "model/shape.h"

static unsigned long long rs = 0x1234567887654321ull;

/* ---- GEMV ---- */

static void gemv_case(int rows, int cols, int bits, int n_tok, int with_norm, int accumulate) {
    hmat W;
    hmat_random(&W, rows, cols, bits, 0.05f, &rs);
    const tl_mat *parts[1] = {&W.m};
    tl_gpu_gemm_w dW;
    char err[256] = "";
    CHECK_EQ_INT(tl_gpu_mat_upload(&dW, parts, 1, 0, err, sizeof err), 0);
    CHECK_EQ_INT(dW.bits, bits == 4 ? 4 : 16);
    float *x = rand_vec((size_t)n_tok * cols, 1.0f, &rs);
    float *nw = rand_vec(cols, 1.0f, &rs);
    float *y0 = rand_vec((size_t)n_tok * rows, 1.0f, &rs);
    float *ref = (float *)xmalloc(sizeof(float) * n_tok * rows);
    float *xn = (float *)xmalloc(sizeof(float) * cols);
    for (int t = 0; t < n_tok; t++) {
        if (with_norm)
            cpu_rmsnorm(xn, x + (size_t)t * cols, nw, cols, 1e-6f);
        else
            memcpy(xn, x + (size_t)t * cols, sizeof(float) * cols);
        cpu_matvec(ref + (size_t)t * rows, &W.m, xn);
        if (accumulate)
            for (int r = 0; r < rows; r++) ref[(size_t)t * rows + r] += y0[(size_t)t * rows + r];
    }
    float *dx = dev_from(x, sizeof(float) * n_tok * cols),
          *dnw = dev_from(nw, sizeof(float) * cols);
    float *dy = dev_from(y0, sizeof(float) * n_tok * rows);
    CHECK_EQ_INT(tl_gpu_gemv(dy, rows, &dW, dx, cols, with_norm ? dnw : NULL, 1e-6f, n_tok,
                             accumulate, NULL),
                 0);
    CHECK_EQ_INT(tl_gpu_sync(), 0);
    float *got = host_from(dy, (size_t)n_tok * rows);
    char what[96];
    snprintf(what, sizeof what, "gemv %s %dx%d t%d n%d a%d",
             bits == 4   ? "q4"
             : bits == 8 ? "q8->bf16 hi+lo"
                         : "bf16",
             rows, cols, n_tok, with_norm, accumulate);
    check_nmse(what, got, ref, (size_t)n_tok * rows, 1e-9);
    tl_gpu_free(dx), tl_gpu_free(dnw), tl_gpu_free(dy);
    tl_gpu_mat_free(&dW);
    free(x), free(nw), free(y0), free(ref), free(xn), free(got);
    hmat_free(&W);
}

/* The current q4v setting (tl_gpu_q4v_set returns the previous one). */
static int q4v_now(void) {
    int v = tl_gpu_q4v_set(0);
    tl_gpu_q4v_set(v);
    return v;
}

static void test_gemv_bf16(void) {
    gemv_case(2048, TL_N_EMBD, 0, 1, 0, 0);
    gemv_case(9216, TL_N_EMBD, 0, 3, 1, 0); /* attention in-proj, 3 tokens (tile of 2 + 1) */
    gemv_case(2048, 4096, 0, 11, 0, 1);     /* out-proj + residual, tiles of 8 + 2 + 1 */
    gemv_case(257, TL_N_EMBD, 0, 5, 1, 0);  /* router + shared gate: rows not a multiple of 8 */
    /* an 8-bit router (MLX files): dequantized values are not bf16; uploaded as hi + lo bf16
     * planes (~2^-17 relative per weight, NMSE ~1e-11). With hi alone (2^-9) the NMSE would be
     * ~1e-6, over the 1e-9 bound: the case fails if the low plane is dropped. */
    gemv_case(257, TL_N_EMBD, 8, 1, 1, 0);
    gemv_case(257, TL_N_EMBD, 8, 5, 1, 0);
}

/* The micro-batch router on the tensor cores (split bf16 planes of x and W) against the host
 * matvec of the normed input: NMSE <= 1e-9 (bf16 x alone would give ~1e-6: the case fails if the
 * low planes are dropped), and each token alone gives the same bits as in the batch. on_st: on a
 * stream (K cut 8 ways in a cluster up to 1,024 tokens, as on the engine's streams), else none. */
static void router_case(int bits, int n_tok, int on_st) {
    const int rows = 257, cols = TL_N_EMBD;
    hmat W;
    hmat_random(&W, rows, cols, bits, 0.05f, &rs);
    const tl_mat *parts[1] = {&W.m};
    tl_gpu_gemm_w dW;
    char err[256] = "";
    CHECK_EQ_INT(tl_gpu_mat_upload(&dW, parts, 1, 0, err, sizeof err), 0);
    CHECK(bits == 8 ? dW.sb != NULL : dW.sb == NULL);
    float *x = rand_vec((size_t)n_tok * cols, 1.0f, &rs), *nw = rand_vec(cols, 1.0f, &rs);
    float *ref = xmalloc(sizeof(float) * n_tok * rows), *xn = xmalloc(sizeof(float) * cols);
    for (int t = 0; t < n_tok; t++) {
        cpu_rmsnorm(xn, x + (size_t)t * cols, nw, cols, 1e-6f);
        cpu_matvec(ref + (size_t)t * rows, &W.m, xn);
    }
    float *dx = dev_from(x, sizeof(float) * n_tok * cols),
          *dnw = dev_from(nw, sizeof(float) * cols);
    uint16_t *dxh = tl_gpu_malloc((size_t)n_tok * cols * 2),
             *dxl = tl_gpu_malloc((size_t)n_tok * cols * 2);
    float *dy = tl_gpu_malloc(sizeof(float) * n_tok * rows),
          *dy1 = tl_gpu_malloc(sizeof(float) * rows);
    CHECK_EQ_INT(tl_gpu_rmsnorm_bf16x2(dxh, dxl, dx, dnw, n_tok, cols, 1e-6f, NULL), 0);
    tl_gpu_stream st = {0}, *stp = on_st ? &st : NULL;
    CHECK_EQ_INT(tl_gpu_router_gemm(dy, rows, &dW, dxh, dxl, n_tok, stp), 0);
    float *got = host_from(dy, (size_t)n_tok * rows);
    char what[96];
    const int smax = tl_gpu_router_split_max(-1);
    snprintf(what, sizeof what, "router gemm %s t%d%s", bits == 8 ? "q8->bf16 hi+lo" : "bf16",
             n_tok, on_st ? (n_tok <= smax ? " split-K" : " (too many tokens to split)") : "");
    check_nmse(what, got, ref, (size_t)n_tok * rows, 1e-9);
    int diff = 0;
    for (int t = 0; t < n_tok; t += 7) {
        if (n_tok > smax) stp = NULL; /* the split is the same on one side of its limit only */
        CHECK_EQ_INT(tl_gpu_router_gemm(dy1, rows, &dW, dxh + (size_t)t * cols,
                                        dxl + (size_t)t * cols, 1, stp),
                     0);
        float *one = host_from(dy1, rows);
        diff += memcmp(one, got + (size_t)t * rows, sizeof(float) * rows) != 0;
        free(one);
    }
    printf("# %s: tokens alone vs batch: %d differ (want 0)\n", what, diff);
    CHECK_EQ_INT(diff, 0);
    tl_gpu_free(dx), tl_gpu_free(dnw), tl_gpu_free(dxh), tl_gpu_free(dxl), tl_gpu_free(dy);
    tl_gpu_free(dy1), tl_gpu_mat_free(&dW);
    free(x), free(nw), free(ref), free(xn), free(got);
    hmat_free(&W);
}

static void test_router_gemm(void) {
    router_case(8, 37, 1); /* 8-bit router (MLX files): hi + lo planes; not a multiple of 16 */
    router_case(8, 256, 1);
    router_case(0, 19, 1); /* bf16 router: no low plane */
    /* a prefill chunk's call split too (TL_ROUTER_SPLIT_MAX): its tokens alone the same bits */
    int smax = tl_gpu_router_split_max(1024);
    router_case(8, 700, 1);
    tl_gpu_router_split_max(512);
    router_case(8, 700, 1); /* past the limit: unsplit */
    tl_gpu_router_split_max(smax);
    /* the unsplit calls on wgmma (the default from 3,072 tokens; forced here) and on the
     * mma.sync tiles */
    for (int wg = 2; wg >= 0; wg -= 2) {
        printf("# unsplit router calls on %s\n", wg ? "wgmma" : "mma.sync");
        int was = tl_gpu_router_set_wg(wg);
        router_case(8, 37, 0);
        router_case(8, 300, 1);
        router_case(8, 700, 0); /* a prefill chunk's size: no split */
        router_case(0, 333, 0);
        tl_gpu_router_set_wg(was);
    }
}

/* The T tokens' outputs of dW on device x (norm fused) at q4v level lvl, downloaded; *diff +=
 * the tokens whose outputs alone differ in any bit. */
static float *gemv_batch_alone(const tl_gpu_gemm_w *dW, const float *dx, const float *dnw, int T,
                               int lvl, int *diff) {
    int rows = dW->rows, cols = dW->cols, old = tl_gpu_q4v_set(lvl);
    float *dy = tl_gpu_malloc(sizeof(float) * T * rows), *dy1 = tl_gpu_malloc(sizeof(float) * rows);
    CHECK_EQ_INT(tl_gpu_gemv(dy, rows, dW, dx, cols, dnw, 1e-6f, T, 0, NULL), 0);
    float *all = host_from(dy, (size_t)T * rows);
    for (int t = 0; t < T; t++) {
        CHECK_EQ_INT(
            tl_gpu_gemv(dy1, rows, dW, dx + (size_t)t * cols, cols, dnw, 1e-6f, 1, 0, NULL), 0);
        float *one = host_from(dy1, rows);
        *diff += memcmp(one, all + (size_t)t * rows, sizeof(float) * rows) != 0;
        free(one);
    }
    tl_gpu_q4v_set(old);
    tl_gpu_free(dy), tl_gpu_free(dy1);
    return all;
}

/* q4 GEMV: a token's outputs do not depend on the other tokens of its tile (the mma computes each
 * output row of A on its own, q4m_dot and q4v alike), so T tokens together == each token alone,
 * bit for bit; with T <= 2 the q4v dot too, whose bits must differ from q4m_dot's (really the
 * other dot) within NMSE 1e-10. */
static void batch_exact_case(int rows, int cols, int T) {
    hmat W;
    hmat_random(&W, rows, cols, 4, 0.05f, &rs);
    const tl_mat *parts[1] = {&W.m};
    tl_gpu_gemm_w dW;
    char err[256] = "";
    CHECK_EQ_INT(tl_gpu_mat_upload(&dW, parts, 1, 0, err, sizeof err), 0);
    float *x = rand_vec((size_t)T * cols, 1.0f, &rs), *nw = rand_vec(cols, 1.0f, &rs);
    float *dx = dev_from(x, sizeof(float) * T * cols), *dnw = dev_from(nw, sizeof(float) * cols);
    int diff = 0, diff_v = 0;
    float *m = gemv_batch_alone(&dW, dx, dnw, T, 0, &diff);
    printf("# gemv q4 %dx%d, %d tokens vs alone (q4m_dot): %d differ (want 0)\n", rows, cols, T,
           diff);
    CHECK_EQ_INT(diff, 0);
    if (T <= 2) {
        float *v = gemv_batch_alone(&dW, dx, dnw, T, 1, &diff_v);
        int other = memcmp(m, v, sizeof(float) * T * rows) != 0;
        double nm = t_nmse(v, m, (size_t)T * rows);
        printf("# q4v %dx%d: %d tokens vs alone %d differ (want 0); vs q4m_dot %s bits, nmse "
               "%.2e\n",
               rows, cols, T, diff_v, other ? "other" : "THE SAME", nm);
        CHECK_EQ_INT(diff_v, 0);
        CHECK(other);
        CHECK(nm < 1e-10);
        free(v);
    }
    tl_gpu_free(dx), tl_gpu_free(dnw), tl_gpu_mat_free(&dW);
    free(x), free(nw), free(m);
    hmat_free(&W);
}

static void test_gemv_q4_batch_exact(void) { batch_exact_case(2048, 4096, 5); }

static void test_gemv_q4(void) {
    gemv_case(2048, TL_N_EMBD, 4, 1, 0, 0);
    gemv_case(248320 / 8, TL_N_EMBD, 4, 1, 0, 0); /* an LM-head-like row count (many blocks) */
    gemv_case(1024, 768, 4, 3, 1, 1);             /* K = 768: KB not a power of two (chunk loop) */
    gemv_case(3200, 256, 4, 12, 1, 0);            /* the small e2e model's shapes, 12 tokens */
    gemv_case(256, 1024, 4, 12, 0, 1);
    gemv_case(1024, 256, 4, 1, 0, 0);
    gemv_case(12416, TL_N_EMBD, 4, 2, 1, 0); /* GDN in-proj padded to 128 rows */
    gemv_case(2048, 4096, 4, 9, 0, 1);
    gemv_case(2048, TL_N_FF_EXPERT, 4, 4, 0, 0); /* expert down shape */
}

/* ---- embedding, RMSNorm ---- */

static void test_embed(void) {
    for (int bits = 0; bits <= 4; bits += 4) {
        int rows = 4096, cols = TL_N_EMBD;
        hmat E;
        hmat_random(&E, rows, cols, bits, 0.1f, &rs);
        const tl_mat *parts[1] = {&E.m};
        tl_gpu_gemm_w dE;
        char err[256];
        CHECK_EQ_INT(tl_gpu_mat_upload(&dE, parts, 1, 0, err, sizeof err), 0);
        int32_t tok[5] = {0, 7, 4095, 1234, 8};
        int32_t *dt = dev_from(tok, sizeof tok);
        float *dx = tl_gpu_malloc(sizeof(float) * 5 * cols);
        CHECK_EQ_INT(tl_gpu_embed(dx, &dE, dt, 5, NULL), 0);
        float *got = host_from(dx, 5 * (size_t)cols), *ref = xmalloc(sizeof(float) * 5 * cols);
        for (int t = 0; t < 5; t++) cpu_mat_row(ref + (size_t)t * cols, &E.m, tok[t]);
        double ma = t_max_abs_diff(got, ref, 5 * (size_t)cols);
        printf("# embed %s max_abs=%.3e\n", bits ? "q4" : "bf16", ma);
        CHECK(ma <= 1e-6); /* s*q+b in fp32 on both sides: only fma contraction may differ */
        tl_gpu_free(dt), tl_gpu_free(dx), tl_gpu_mat_free(&dE);
        free(got), free(ref), hmat_free(&E);
    }
}

static void test_rmsnorm(void) {
    int n = TL_N_EMBD, rows = 6;
    float *x = rand_vec((size_t)rows * n, 3.0f, &rs), *w = rand_vec(n, 1.0f, &rs);
    int32_t pick[3] = {5, 0, 2};
    float *dx = dev_from(x, sizeof(float) * rows * n), *dw = dev_from(w, sizeof(float) * n);
    int32_t *dp = dev_from(pick, sizeof pick);
    float *dy = tl_gpu_malloc(sizeof(float) * 3 * n);
    CHECK_EQ_INT(tl_gpu_rmsnorm(dy, dx, dw, dp, 3, n, 1e-6f, NULL), 0);
    float *got = host_from(dy, 3 * (size_t)n), *ref = xmalloc(sizeof(float) * 3 * n);
    for (int i = 0; i < 3; i++)
        cpu_rmsnorm(ref + (size_t)i * n, x + (size_t)pick[i] * n, w, n, 1e-6f);
    /* elementwise fp32: atol 1e-6 + rtol 1e-5 (docs/developing.md §3); the sum of squares differs
     * only in order */
    for (int i = 0; i < 3 * n; i++) CHECK_CLOSE(got[i], ref[i], 1e-6, 1e-5);
    tl_gpu_free(dx), tl_gpu_free(dw), tl_gpu_free(dp), tl_gpu_free(dy);
    free(x), free(w), free(got), free(ref);
}

/* The MTP head's input (docs/model.md §3.2 step 1): [rmsnorm(e[t]; w_e) | rmsnorm(h[r_t]; w_h)]
 * with the hidden rows picked (repeated and out of order) against cpu_rmsnorm of each half, at
 * the production width. */
static void test_mtp_cat(void) {
    int n = TL_N_EMBD, T = 5, H = 7;
    float *e = rand_vec((size_t)T * n, 2.0f, &rs), *h = rand_vec((size_t)H * n, 5.0f, &rs);
    float *we = rand_vec(n, 1.0f, &rs), *wh = rand_vec(n, 1.0f, &rs);
    int32_t pick[5] = {6, 0, 3, 3, 1};
    float *de = dev_from(e, sizeof(float) * T * n), *dh = dev_from(h, sizeof(float) * H * n);
    float *dwe = dev_from(we, sizeof(float) * n), *dwh = dev_from(wh, sizeof(float) * n);
    int32_t *dp = dev_from(pick, sizeof pick);
    float *dc = tl_gpu_malloc(sizeof(float) * 2 * T * n);
    CHECK_EQ_INT(tl_gpu_mtp_cat(dc, de, dwe, dh, dp, dwh, T, n, 1e-6f, NULL), 0);
    float *got = host_from(dc, 2 * (size_t)T * n), *ref = xmalloc(sizeof(float) * 2 * T * n);
    for (int t = 0; t < T; t++) {
        cpu_rmsnorm(ref + (size_t)t * 2 * n, e + (size_t)t * n, we, n, 1e-6f);
        cpu_rmsnorm(ref + (size_t)t * 2 * n + n, h + (size_t)pick[t] * n, wh, n, 1e-6f);
    }
    /* elementwise fp32 as test_rmsnorm: atol 1e-6 + rtol 1e-5 (docs/developing.md §3); only the
     * order of the sum of squares differs */
    for (int i = 0; i < 2 * T * n; i++) CHECK_CLOSE(got[i], ref[i], 1e-6, 1e-5);
    CHECK_EQ_INT(tl_gpu_mtp_cat(dc, de, dwe, dh, dp, dwh, -1, n, 1e-6f, NULL), TL_ERR_INVALID);
    tl_gpu_free(de), tl_gpu_free(dh), tl_gpu_free(dwe), tl_gpu_free(dwh), tl_gpu_free(dp);
    tl_gpu_free(dc);
    free(e), free(h), free(we), free(wh), free(got), free(ref);
}

/* Row gather/scatter (the MTP hiddens' ring and chain, cuda_spec.cu): bit-exact against the host
 * copy, with both index arrays, with one of them NULL, untouched rows unchanged. */
static void test_copy_rows(void) {
    int n = TL_N_EMBD, NS = 9, ND = 11;
    float *src = rand_vec((size_t)NS * n, 3.0f, &rs), *dst0 = rand_vec((size_t)ND * n, 1.0f, &rs);
    int32_t di[4] = {10, 2, 7, 0}, si[4] = {3, 8, 3, 0};
    float *ds = dev_from(src, sizeof(float) * NS * n), *dd = dev_from(dst0, sizeof(float) * ND * n);
    int32_t *ddi = dev_from(di, sizeof di), *dsi = dev_from(si, sizeof si);
    float *want = xmalloc(sizeof(float) * ND * n);
    memcpy(want, dst0, sizeof(float) * ND * n);
    for (int i = 0; i < 4; i++)
        memcpy(want + (size_t)di[i] * n, src + (size_t)si[i] * n, sizeof(float) * n);
    CHECK_EQ_INT(tl_gpu_copy_rows(dd, ddi, ds, dsi, 4, n, NULL), 0);
    float *got = host_from(dd, (size_t)ND * n);
    CHECK(!memcmp(got, want, sizeof(float) * ND * n));
    free(got);
    for (int i = 0; i < 4; i++) /* source rows 0..3 in order (src_rows NULL) */
        memcpy(want + (size_t)di[i] * n, src + (size_t)i * n, sizeof(float) * n);
    CHECK_EQ_INT(tl_gpu_copy_rows(dd, ddi, ds, NULL, 4, n, NULL), 0);
    got = host_from(dd, (size_t)ND * n);
    CHECK(!memcmp(got, want, sizeof(float) * ND * n));
    CHECK_EQ_INT(tl_gpu_copy_rows(dd, ddi, ds, NULL, 4, 0, NULL), TL_ERR_INVALID);
    tl_gpu_free(ds), tl_gpu_free(dd), tl_gpu_free(ddi), tl_gpu_free(dsi);
    free(src), free(dst0), free(want), free(got);
}

/* f32 -> bf16 on the device (the decode mixers' outputs into the tensor-core GEMMs) equals the
 * host's round-to-nearest-even tl_f32_to_bf16 bit for bit, over random values of many magnitudes
 * (n not a multiple of the block: the grid-stride tail). */
static void test_cast_bf16(void) {
    long n = 1000003;
    float *x = xmalloc(sizeof(float) * n);
    for (long i = 0; i < n; i++) x[i] = t_randf(&rs) * ldexpf(1.0f, (int)(i % 40) - 20);
    float *dx = dev_from(x, sizeof(float) * n);
    uint16_t *dy = tl_gpu_malloc(sizeof(uint16_t) * n), *y = xmalloc(sizeof(uint16_t) * n);
    CHECK_EQ_INT(tl_gpu_cast_bf16(dy, dx, n, NULL), 0);
    CHECK_EQ_INT(tl_gpu_download(y, dy, sizeof(uint16_t) * n), 0);
    long bad = 0;
    for (long i = 0; i < n; i++) bad += y[i] != tl_f32_to_bf16(x[i]);
    CHECK_EQ_INT((int)bad, 0);
    tl_gpu_free(dx), tl_gpu_free(dy);
    free(x), free(y);
}

/* ---- batch metadata on the device ---- */

typedef struct dseqs {
    tl_gpu_seqs s;
    int32_t *buf;
} dseqs;

/* Segments: n_seg of (slot, pos0, n). */
static dseqs make_seqs(int n_seg, const int *slot, const int *pos0, const int *n) {
    int T = 0;
    for (int i = 0; i < n_seg; i++) T += n[i];
    int32_t *h = xcalloc((size_t)3 * T + 4 * n_seg + 8, 4);
    int32_t *tp = h, *ts = h + T, *tg = h + 2 * T, *s0 = h + 3 * T, *sn = s0 + n_seg,
            *ss = sn + n_seg, *sp = ss + n_seg;
    int t = 0;
    for (int i = 0; i < n_seg; i++) {
        s0[i] = t, sn[i] = n[i], ss[i] = slot[i], sp[i] = pos0[i];
        for (int j = 0; j < n[i]; j++, t++) tp[t] = pos0[i] + j, ts[t] = slot[i], tg[t] = i;
    }
    dseqs d;
    size_t bytes = sizeof(int32_t) * ((size_t)3 * T + 4 * n_seg + 8);
    d.buf = dev_from(h, bytes);
    int32_t *b = d.buf;
    d.s.tok_pos = b, d.s.tok_slot = b + T, d.s.tok_seg = b + 2 * T;
    d.s.seg_tok0 = b + 3 * T, d.s.seg_n = b + 3 * T + n_seg, d.s.seg_slot = b + 3 * T + 2 * n_seg;
    d.s.seg_pos0 = b + 3 * T + 3 * n_seg;
    d.s.n_tok = T, d.s.n_seg = n_seg;
    free(h);
    return d;
}

/* The GDN in-projection with conv1d fused (decode: one token per sequence, 3 tokens in slots
 * 2, 0, 1 of 3) gives the same bits as gemv then conv1d: conv outputs, states and the rows >= C;
 * unfused on the persistent q4m kernel, fused on it and on the slice kernel (1 and 2 blocks an SM,
 * k_gemv.cu), which must give the same bits. */
static void conv_fused_case(int T) {
    const int rows = 12416, cols = TL_N_EMBD, C = 8192, n_slot = 3, ld = rows;
    hmat W;
    hmat_random(&W, rows, cols, 4, 0.05f, &rs);
    const tl_mat *parts[1] = {&W.m};
    tl_gpu_gemm_w dW;
    char err[256] = "";
    CHECK_EQ_INT(tl_gpu_mat_upload(&dW, parts, 1, 0, err, sizeof err), 0);
    float *x = rand_vec((size_t)T * cols, 1.0f, &rs), *nw = rand_vec(cols, 1.0f, &rs);
    float *cw = rand_vec((size_t)C * 4, 0.5f, &rs),
          *st = rand_vec((size_t)n_slot * 3 * C, 1.0f, &rs);
    int slot[3] = {2, 0, 1}, pos0[3] = {5, 9, 1}, n[3] = {1, 1, 1};
    dseqs d = make_seqs(T, slot, pos0, n);
    float *dx = dev_from(x, sizeof(float) * T * cols), *dnw = dev_from(nw, sizeof(float) * cols);
    float *dcw = dev_from(cw, sizeof(float) * C * 4);
    float *dst1 = dev_from(st, sizeof(float) * n_slot * 3 * C),
          *dst2 = tl_gpu_malloc(sizeof(float) * n_slot * 3 * C);
    float *dy1 = tl_gpu_malloc(sizeof(float) * T * ld),
          *dy2 = tl_gpu_malloc(sizeof(float) * T * ld);
    float *dc1 = tl_gpu_malloc(sizeof(float) * T * C), *dc2 = tl_gpu_malloc(sizeof(float) * T * C);
    int old_s = tl_gpu_gemv_set_slice(0), old_r = tl_gpu_gemv_set_rows(0);
    CHECK_EQ_INT(tl_gpu_gemv(dy1, ld, &dW, dx, cols, dnw, 1e-6f, T, 0, NULL), 0);
    CHECK_EQ_INT(tl_gpu_conv1d(dc1, dst1, dy1, ld, dcw, C, &d.s, NULL, NULL), 0);
    CHECK_EQ_INT(tl_gpu_sync(), 0);
    float *y1 = host_from(dy1, (size_t)T * ld), *c1 = host_from(dc1, (size_t)T * C);
    float *s1 = host_from(dst1, (size_t)n_slot * 3 * C);
    /* fused: q4m, slice 1 and 2 blocks an SM (q4m_dot: not with the q4v dot on 1 or 2 tokens) */
    int n_mode = q4v_now() && T <= 2 ? 0 : 2;
    for (int mode = 0; mode <= n_mode; mode++) {
        tl_gpu_gemv_set_slice(mode);
        CHECK_EQ_INT(tl_gpu_upload(dst2, st, sizeof(float) * n_slot * 3 * C), 0);
        CHECK_EQ_INT(tl_gpu_gemv_conv1d(dy2, ld, &dW, dx, cols, dnw, 1e-6f, T, dc2, dst2, dcw, C,
                                        d.s.tok_slot, NULL),
                     0);
        CHECK_EQ_INT(tl_gpu_sync(), 0);
        float *y2 = host_from(dy2, (size_t)T * ld), *c2 = host_from(dc2, (size_t)T * C);
        float *s2 = host_from(dst2, (size_t)n_slot * 3 * C);
        int bad_y = 0;
        for (int t = 0; t < T; t++)
            bad_y += memcmp(y1 + (size_t)t * ld + C, y2 + (size_t)t * ld + C,
                            sizeof(float) * (rows - C)) != 0;
        int bad_c = memcmp(c1, c2, sizeof(float) * T * C) != 0,
            bad_s = memcmp(s1, s2, sizeof(float) * n_slot * 3 * C) != 0;
        double nm = t_nmse(c2, c1, (size_t)T * C);
        printf("# gemv+conv1d fused (slice %d, %d tokens, q4v %d) vs unfused: rows>=C differ in "
               "%d tokens, conv out differs %d, state differs %d (conv nmse %.2e)\n",
               mode, T, q4v_now(), bad_y, bad_c, bad_s, nm);
        CHECK_EQ_INT(bad_y, 0);
        CHECK_EQ_INT(bad_c, 0);
        CHECK_EQ_INT(bad_s, 0);
        free(y2), free(c2), free(s2);
    }
    tl_gpu_gemv_set_slice(old_s), tl_gpu_gemv_set_rows(old_r);
    /* the states moved: slot s now ends with the new input of the token in slot s */
    CHECK(memcmp(s1, st, sizeof(float) * n_slot * 3 * C) != 0);
    tl_gpu_free(dx), tl_gpu_free(dnw), tl_gpu_free(dcw), tl_gpu_free(dst1), tl_gpu_free(dst2);
    tl_gpu_free(dy1), tl_gpu_free(dy2), tl_gpu_free(dc1), tl_gpu_free(dc2), tl_gpu_free(d.buf);
    tl_gpu_mat_free(&dW);
    free(x), free(nw), free(cw), free(st), free(y1), free(c1), free(s1);
    hmat_free(&W);
}

static void test_gemv_conv1d_fused(void) { conv_fused_case(3); }

/* One 4-bit GEMV of T tokens into dy (y0 first), the slice kernel at `mode` blocks an SM (0: off)
 * and the rows kernel on or off for the call; the result downloaded into *out. */
static int slice_run(int mode, int rows_on, const tl_gpu_gemm_w *dW, const float *dx,
                     const float *dnw, int T, int acc, const float *y0, float *dy, float **out) {
    int rows = dW->rows;
    CHECK_EQ_INT(tl_gpu_upload(dy, y0, sizeof(float) * T * rows), 0);
    int old_s = tl_gpu_gemv_set_slice(mode), old_r = tl_gpu_gemv_set_rows(rows_on);
    int st = tl_gpu_gemv(dy, rows, dW, dx, dW->cols, dnw, 1e-6f, T, acc, NULL);
    CHECK_EQ_INT(tl_gpu_sync(), 0);
    tl_gpu_gemv_set_slice(old_s), tl_gpu_gemv_set_rows(old_r);
    *out = host_from(dy, (size_t)T * rows);
    return st;
}

/* Every way of the 4-bit GEMV for <= 8 tokens (k_gemv.cu: the slice kernel at 1 or 2 blocks an
 * SM, the rows kernel, both) gives the bits of the persistent q4m kernel (slice 0, rows 0, the
 * default), the norm and the residual included; and with slice and rows on each token of the
 * tile gives the same bits alone (a row of the mma depends only on its own token). Random inputs,
 * so equal bits mean the same products in the same order. The oracle checks are test_gemv_q4's
 * (the default settings run there). */
static void gemv_ways_case(int rows, int cols, int T, int with_norm, int acc) {
    static const int ways[4][2] = {{1, 0}, {2, 0}, {0, 1}, {1, 1}}; /* (slice, rows) */
    hmat W;
    hmat_random(&W, rows, cols, 4, 0.05f, &rs);
    const tl_mat *parts[1] = {&W.m};
    tl_gpu_gemm_w dW;
    char err[256] = "";
    CHECK_EQ_INT(tl_gpu_mat_upload(&dW, parts, 1, 0, err, sizeof err), 0);
    float *x = rand_vec((size_t)T * cols, 1.0f, &rs), *nw = rand_vec(cols, 1.0f, &rs);
    float *y0 = rand_vec((size_t)T * rows, 1.0f, &rs);
    float *dx = dev_from(x, sizeof(float) * T * cols), *dnw = dev_from(nw, sizeof(float) * cols);
    float *dy = tl_gpu_malloc(sizeof(float) * T * rows), *ref, *got, *one;
    const float *n = with_norm ? dnw : NULL;
    int old_v = tl_gpu_q4v_set(0); /* the slice and rows kernels compute q4m_dot's sums */
    CHECK_EQ_INT(slice_run(0, 0, &dW, dx, n, T, acc, y0, dy, &ref), 0);
    int diff0 = 0; /* the default kernel: each token alone (q4m_stage's sums of squares) */
    for (int t = 0; t < T; t++) {
        float *dy1 = tl_gpu_malloc(sizeof(float) * rows);
        CHECK_EQ_INT(slice_run(0, 0, &dW, dx + (size_t)t * cols, n, 1, acc, y0 + (size_t)t * rows,
                               dy1, &one),
                     0);
        diff0 += memcmp(one, ref + (size_t)t * rows, sizeof(float) * rows) != 0;
        free(one), tl_gpu_free(dy1);
    }
    CHECK_EQ_INT(diff0, 0);
    for (int w = 0; w < 4; w++) {
        CHECK_EQ_INT(slice_run(ways[w][0], ways[w][1], &dW, dx, n, T, acc, y0, dy, &got), 0);
        int same = !memcmp(got, ref, sizeof(float) * T * rows), diff = 0;
        for (int t = 0; w == 3 && t < T; t++) { /* slice and rows: each token alone */
            float *dy1 = tl_gpu_malloc(sizeof(float) * rows);
            CHECK_EQ_INT(slice_run(1, 1, &dW, dx + (size_t)t * cols, n, 1, acc,
                                   y0 + (size_t)t * rows, dy1, &one),
                         0);
            diff += memcmp(one, got + (size_t)t * rows, sizeof(float) * rows) != 0;
            free(one), tl_gpu_free(dy1);
        }
        printf("# gemv q4 %dx%d t%d n%d a%d, slice %d rows %d: %s q4m; %d tokens differ alone\n",
               rows, cols, T, with_norm, acc, ways[w][0], ways[w][1],
               same ? "same bits as" : "DIFFERENT from", diff);
        CHECK(same);
        CHECK_EQ_INT(diff, 0);
        free(got);
    }
    tl_gpu_q4v_set(old_v);
    tl_gpu_free(dx), tl_gpu_free(dnw), tl_gpu_free(dy), tl_gpu_mat_free(&dW);
    free(x), free(nw), free(y0), free(ref);
    hmat_free(&W);
}

/* ---- conv1d ---- */

/* Also the per-token state copies of a speculative verify (gpu.h tl_gpu_ring, 3 copies a slot):
 * slot 1 from position 4 (tokens 1..3 of its 5: the first one's state still holds the old
 * state's last entry), slot 3 from position 49 (inside the 70-token segment, in its second
 * 32-token chunk), no copies for the others; each copy equals the oracle's state after that
 * token, bit for bit (copies of inputs), and the slots without copies leave the ring untouched. */
static void test_conv1d(void) {
    int C = 2 * TL_GDN_N_K_HEAD * TL_GDN_K_DIM + TL_GDN_N_V_HEAD * TL_GDN_V_DIM, ld = C + 64;
    /* segments shorter than 3 (state partly kept), longer than the kernel's 32-token chunks */
    int slot[5] = {1, 0, 3, 2, 4}, pos0[5] = {3, 0, 9, 1, 0}, n[5] = {5, 1, 70, 2, 100};
    int T = 178, n_slot = 5, n_seg = 5, RN = 3;
    int32_t rpos[5] = {-1, 4, -1, 49, -1};
    size_t SS = (size_t)3 * C; /* one slot's state */
    float *in = rand_vec((size_t)T * ld, 1.0f, &rs), *w = rand_vec((size_t)C * 4, 0.5f, &rs);
    float *st = rand_vec((size_t)n_slot * SS, 1.0f, &rs);
    float *ring0 = rand_vec((size_t)n_slot * RN * SS, 1.0f, &rs);
    float *ref = xmalloc(sizeof(float) * T * C), *st_ref = xmalloc(sizeof(float) * n_slot * SS);
    float *ring_ref = xmalloc(sizeof(float) * n_slot * RN * SS);
    memcpy(st_ref, st, sizeof(float) * n_slot * SS);
    memcpy(ring_ref, ring0, sizeof(float) * n_slot * RN * SS);
    int t = 0;
    for (int g = 0; g < n_seg; g++)
        for (int j = 0; j < n[g]; j++, t++) {
            float *sr = st_ref + (size_t)slot[g] * SS;
            cpu_conv1d_step(ref + (size_t)t * C, sr, in + (size_t)t * ld, w, C, 4);
            int k = pos0[g] + j - rpos[slot[g]];
            if (rpos[slot[g]] >= 0 && k >= 0 && k < RN)
                memcpy(ring_ref + ((size_t)slot[g] * RN + k) * SS, sr, sizeof(float) * SS);
        }
    dseqs d = make_seqs(n_seg, slot, pos0, n);
    float *din = dev_from(in, sizeof(float) * T * ld), *dw = dev_from(w, sizeof(float) * C * 4);
    float *dst = dev_from(st, sizeof(float) * n_slot * SS),
          *dout = tl_gpu_malloc(sizeof(float) * T * C);
    float *dring = dev_from(ring0, sizeof(float) * n_slot * RN * SS);
    int32_t *drpos = dev_from(rpos, sizeof rpos);
    tl_gpu_ring ring = {dring, drpos, RN};
    CHECK_EQ_INT(tl_gpu_conv1d(dout, dst, din, ld, dw, C, &d.s, &ring, NULL), 0);
    float *got = host_from(dout, (size_t)T * C), *gst = host_from(dst, (size_t)n_slot * SS);
    float *gring = host_from(dring, (size_t)n_slot * RN * SS);
    check_nmse("conv1d out", got, ref, (size_t)T * C, 1e-12);
    check_nmse("conv1d state", gst, st_ref, (size_t)n_slot * SS, 0.0); /* a copy: exact */
    int ring_ok = !memcmp(gring, ring_ref, sizeof(float) * n_slot * RN * SS);
    printf("# conv1d state copies (slots 1 and 3, 3 each) == the oracle's states: %s\n",
           ring_ok ? "yes" : "NO");
    CHECK(ring_ok);
    tl_gpu_free(din), tl_gpu_free(dw), tl_gpu_free(dst), tl_gpu_free(dout), tl_gpu_free(d.buf);
    tl_gpu_free(dring), tl_gpu_free(drpos);
    free(in), free(w), free(st), free(ref), free(st_ref), free(got), free(gst);
    free(ring0), free(ring_ref), free(gring);
}

/* ---- GDN step ---- */

/* A device state of n elements (f32, or bf16 when bf16) as host floats. */
static float *state_from(const void *d, size_t n, int bf16) {
    if (!bf16) return host_from(d, n);
    uint16_t *h = xmalloc(n * 2);
    tl_gpu_download(h, d, n * 2);
    float *f = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = tl_bf16_to_f32(h[i]);
    free(h);
    return f;
}

/* bf16: the state in bf16 (--state-dtype bf16): the oracle starts from the same bf16 values and
 * rounds each touched slot's state to bf16 at the end of its segment, as the kernels do. Also
 * the per-token state copies of a speculative verify (gpu.h tl_gpu_ring, 2 a slot): slot 0 from
 * position 1 (after its tokens 1 and 2), slot 2 from position 7 (its one token), none for slot
 * 1; each copy against the oracle's state after that token (rounded to bf16 with a bf16 state:
 * the kernels store a copy from their f32 registers), same bound as the state. */
static void gdn_case(int bf16) {
    const int nk = TL_GDN_N_K_HEAD, nv = TL_GDN_N_V_HEAD, Dd = 128;
    int conv_dim = 2 * nk * Dd + nv * Dd, val = nv * Dd;
    int ld_proj = conv_dim + val + 2 * nv + 16, z_off = conv_dim, b_off = conv_dim + val,
        a_off = b_off + nv;
    int slot[2] = {0, 2}, pos0[2] = {0, 7}, n[2] = {3, 1}, T = 4, n_slot = 3;
    float eps = 1e-6f;
    float *qkv = rand_vec((size_t)T * conv_dim, 1.0f, &rs),
          *proj = rand_vec((size_t)T * ld_proj, 2.0f, &rs);
    float *dtb = rand_vec(nv, 1.0f, &rs), *aneg = xmalloc(sizeof(float) * nv),
          *nw = rand_vec(Dd, 1.0f, &rs);
    for (int h = 0; h < nv; h++) aneg[h] = -(1.0f + 15.0f * (0.5f + 0.5f * t_randf(&rs)));
    size_t SN = (size_t)n_slot * nv * Dd * Dd;
    float *S = rand_vec(SN, 0.3f, &rs), *S_ref = xmalloc(SN * sizeof(float));
    if (bf16)
        for (size_t i = 0; i < SN; i++) S[i] = tl_bf16_to_f32(tl_f32_to_bf16(S[i]));
    memcpy(S_ref, S, SN * sizeof(float));
    float *ref = xmalloc(sizeof(float) * T * val), *ref_raw = xmalloc(sizeof(float) * T * val);
    const int RN = 2;
    int32_t rpos[3] = {1, -1, 7};
    size_t SS = (size_t)nv * Dd * Dd; /* one slot's state */
    float *ring0 = rand_vec((size_t)n_slot * RN * SS, 0.3f, &rs);
    if (bf16)
        for (size_t i = 0; i < (size_t)n_slot * RN * SS; i++)
            ring0[i] = tl_bf16_to_f32(tl_f32_to_bf16(ring0[i]));
    float *ring_ref = xmalloc(sizeof(float) * n_slot * RN * SS);
    memcpy(ring_ref, ring0, sizeof(float) * n_slot * RN * SS);
    float q[16 * 128], k[16 * 128], g[32], beta[32];
    int t = 0;
    for (int sg = 0; sg < 2; sg++)
        for (int j = 0; j < n[sg]; j++, t++) {
            const float *row = qkv + (size_t)t * conv_dim, *pr = proj + (size_t)t * ld_proj;
            memcpy(q, row, sizeof(float) * nk * Dd);
            memcpy(k, row + nk * Dd, sizeof(float) * nk * Dd);
            for (int h = 0; h < nk; h++) {
                cpu_l2norm(q + h * Dd, Dd, 1e-6f);
                cpu_l2norm(k + h * Dd, Dd, 1e-6f);
                for (int d = 0; d < Dd; d++) q[h * Dd + d] *= 1.0f / sqrtf((float)Dd);
            }
            for (int h = 0; h < nv; h++) {
                beta[h] = cpu_sigmoid(pr[b_off + h]);
                g[h] = aneg[h] * cpu_softplus(pr[a_off + h] + dtb[h]);
            }
            float *o = ref + (size_t)t * val;
            cpu_gdn_step(o, S_ref + (size_t)slot[sg] * nv * Dd * Dd, q, k, row + 2 * nk * Dd, g,
                         beta, nk, nv, Dd, Dd);
            memcpy(ref_raw + (size_t)t * val, o, sizeof(float) * val);
            for (int h = 0; h < nv; h++)
                cpu_rmsnorm_gated(o + h * Dd, o + h * Dd, pr + z_off + h * Dd, nw, Dd, eps);
            int rk = pos0[sg] + j - rpos[slot[sg]];
            if (rpos[slot[sg]] >= 0 && rk >= 0 && rk < RN) { /* a state copy after this token */
                float *rr = ring_ref + ((size_t)slot[sg] * RN + rk) * SS;
                memcpy(rr, S_ref + (size_t)slot[sg] * SS, sizeof(float) * SS);
                if (bf16)
                    for (size_t i = 0; i < SS; i++) rr[i] = tl_bf16_to_f32(tl_f32_to_bf16(rr[i]));
            }
            if (bf16 && j == n[sg] - 1) /* end of the segment: the state is stored as bf16 */
                for (size_t i = 0; i < (size_t)nv * Dd * Dd; i++) {
                    float *v = S_ref + (size_t)slot[sg] * nv * Dd * Dd + i;
                    *v = tl_bf16_to_f32(tl_f32_to_bf16(*v));
                }
        }
    dseqs d = make_seqs(2, slot, pos0, n);
    float *dqkv = dev_from(qkv, sizeof(float) * T * conv_dim),
          *dproj = dev_from(proj, sizeof(float) * T * ld_proj);
    float *ddtb = dev_from(dtb, sizeof(float) * nv), *daneg = dev_from(aneg, sizeof(float) * nv);
    size_t esz = bf16 ? 2 : 4;
    uint16_t *S16 = xmalloc(SN * 2);
    for (size_t i = 0; i < SN; i++) S16[i] = tl_f32_to_bf16(S[i]);
    const void *S_up = bf16 ? (const void *)S16 : (const void *)S;
    float *dnw = dev_from(nw, sizeof(float) * Dd);
    void *dS = dev_from(S_up, SN * esz);
    float *dy = tl_gpu_malloc(sizeof(float) * T * val);
    size_t RNN = (size_t)n_slot * RN * SS;
    uint16_t *R16 = xmalloc(RNN * 2);
    for (size_t i = 0; i < RNN; i++) R16[i] = tl_f32_to_bf16(ring0[i]);
    const void *R_up = bf16 ? (const void *)R16 : (const void *)ring0;
    void *dR = dev_from(R_up, RNN * esz);
    int32_t *drpos = dev_from(rpos, sizeof rpos);
    tl_gpu_ring ring = {dR, drpos, RN};
    CHECK_EQ_INT(tl_gpu_gdn(dy, dS, bf16, dqkv, dproj, ld_proj, z_off, b_off, a_off, ddtb, daneg,
                            dnw, nk, nv, eps, &d.s, &ring, NULL),
                 0);
    float *gR = state_from(dR, RNN, bf16);
    check_nmse(bf16 ? "gdn state copies (bf16)" : "gdn state copies", gR, ring_ref, RNN,
               bf16 ? 1e-8 : 1e-9);
    free(gR);
    float *got = host_from(dy, (size_t)T * val), *gS = state_from(dS, SN, bf16);
    /* docs/developing.md §3 starts the GDN step at NMSE 1e-7; fp32 state vs double oracle measures
     * ~1e-13. The bf16 state: the outputs come from f32 registers (same bound); the stored state
     * can round the other way where the f32 values differ in the last bits (~3e-5 of the values
     * by one bf16 step, NMSE ~5e-10): 1e-8. */
    check_nmse(bf16 ? "gdn output (bf16 state)" : "gdn output", got, ref, (size_t)T * val, 1e-9);
    check_nmse(bf16 ? "gdn state (bf16)" : "gdn state", gS, S_ref, SN, bf16 ? 1e-8 : 1e-9);
    /* the column-cut kernel of the batched path: raw output (no gated norm) and the state, from
     * the same initial state; the same tolerance (the same fp32 recurrence per column) */
    CHECK_EQ_INT(tl_gpu_upload(dS, S_up, SN * esz), 0);
    CHECK_EQ_INT(tl_gpu_upload(dR, R_up, RNN * esz), 0);
    CHECK_EQ_INT(tl_gpu_gdn_raw(dy, dS, bf16, dqkv, dproj, ld_proj, b_off, a_off, ddtb, daneg, nk,
                                nv, &d.s, &ring, NULL),
                 0);
    gR = state_from(dR, RNN, bf16);
    check_nmse("gdn state copies (cols)", gR, ring_ref, RNN, bf16 ? 1e-8 : 1e-9);
    free(gR);
    tl_gpu_free(dR), tl_gpu_free(drpos);
    free(R16), free(ring0), free(ring_ref);
    float *got_raw = host_from(dy, (size_t)T * val), *gS2 = state_from(dS, SN, bf16);
    check_nmse("gdn raw output (cols)", got_raw, ref_raw, (size_t)T * val, 1e-9);
    check_nmse("gdn state (cols)", gS2, S_ref, SN, bf16 ? 1e-8 : 1e-9);
    /* the decode path with TL_GDN_COLS=1: the gated norm (f32, in place) after the column cut */
    CHECK_EQ_INT(tl_gpu_gated_rmsnorm_f32(dy, dy, dproj, ld_proj, z_off, dnw, nv, T, eps, NULL), 0);
    float *got_cn = host_from(dy, (size_t)T * val);
    check_nmse("gdn output (cols + gated norm)", got_cn, ref, (size_t)T * val, 1e-9);
    free(got_cn);
    free(got_raw), free(gS2), free(ref_raw);
    tl_gpu_free(dqkv), tl_gpu_free(dproj), tl_gpu_free(ddtb), tl_gpu_free(daneg), tl_gpu_free(dnw);
    tl_gpu_free(dS), tl_gpu_free(dy), tl_gpu_free(d.buf);
    free(qkv), free(proj), free(dtb), free(aneg), free(nw), free(S), free(S_ref), free(ref),
        free(got), free(gS), free(S16);
}

static void test_gdn(void) {
    gdn_case(0);
    gdn_case(1);
}

/* ---- attention prologue and attention ---- */

static float bf16r(float x) { return tl_bf16_to_f32(tl_f32_to_bf16(x)); }

/* A KV page table [n_slot][max_pages] (gpu.h: tl_gpu_kv_pages) over a pool of exactly
 * n_slot * max_pages pages in shuffled order, so a kernel that ignores the table (or reads the
 * wrong entry) reads other positions' keys and fails its oracle check. */
typedef struct kvpages {
    int32_t *h; /* host table */
    int32_t *d; /* device copy */
    int max_pages, n_page;
} kvpages;

static kvpages kvpages_shuffled(int n_slot, int max_ctx) {
    kvpages k;
    k.max_pages = (max_ctx + TL_KV_PAGE - 1) / TL_KV_PAGE;
    k.n_page = n_slot * k.max_pages;
    k.h = xmalloc(sizeof(int32_t) * k.n_page);
    for (int i = 0; i < k.n_page; i++) k.h[i] = i;
    for (int i = k.n_page - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)((t_randf(&rs) * 0.5f + 0.5f) * (float)(i + 1)) % (i + 1);
        int32_t tmp = k.h[i];
        k.h[i] = k.h[j], k.h[j] = tmp;
    }
    k.d = dev_from(k.h, sizeof(int32_t) * k.n_page);
    return k;
}
/* Pool row of (slot, pos): the host twin of the kernels' kv_row. */
static size_t kvpages_row(const kvpages *k, int slot, int pos) {
    return (size_t)k->h[(size_t)slot * k->max_pages + pos / TL_KV_PAGE] * TL_KV_PAGE +
           pos % TL_KV_PAGE;
}
static void kvpages_free(kvpages *k) {
    tl_gpu_free(k->d);
    free(k->h);
}

static void test_qk_rope(void) {
    const int H = TL_N_HEAD, Hk = TL_N_HEAD_KV, HD = TL_HEAD_DIM, max_ctx = 300000;
    int ld = H * 2 * HD + 2 * Hk * HD;
    /* long positions (fp32 angles as HF); 37 tokens x 18 heads: the last block of 8 warps
     * holds only 2 items */
    int slot[1] = {0}, pos0[1] = {262140}, n[1] = {37}, T = 37;
    float *proj = rand_vec((size_t)T * ld, 2.0f, &rs), *qn = rand_vec(HD, 1.0f, &rs),
          *kn = rand_vec(HD, 1.0f, &rs);
    dseqs d = make_seqs(1, slot, pos0, n);
    float *dproj = dev_from(proj, sizeof(float) * T * ld), *dqn = dev_from(qn, HD * 4),
          *dkn = dev_from(kn, HD * 4);
    float *dq = tl_gpu_malloc(sizeof(float) * T * H * HD);
    kvpages kp = kvpages_shuffled(1, max_ctx);
    tl_gpu_kv_pages pg = {kp.d, kp.max_pages};
    size_t kvn = (size_t)kp.n_page * TL_KV_PAGE * Hk * HD;
    uint16_t *dk = tl_gpu_malloc(kvn * 2), *dv = tl_gpu_malloc(kvn * 2);
    CHECK_EQ_INT(tl_gpu_qk_rope_kv(dq, dk, dv, dproj, ld, dqn, dkn, H, Hk, &pg, TL_ROPE_THETA,
                                   1e-6f, &d.s, NULL),
                 0);
    float *got = host_from(dq, (size_t)T * H * HD), *ref = xmalloc(sizeof(float) * T * H * HD);
    uint16_t *gk = xmalloc((size_t)T * Hk * HD * 2), *gv = xmalloc((size_t)T * Hk * HD * 2);
    /* positions 262140..262142 span two pages: each row is read where the table puts it */
    for (int t = 0; t < T; t++) {
        size_t row = kvpages_row(&kp, 0, pos0[0] + t);
        tl_gpu_download(gk + (size_t)t * Hk * HD, dk + row * Hk * HD, (size_t)Hk * HD * 2);
        tl_gpu_download(gv + (size_t)t * Hk * HD, dv + row * Hk * HD, (size_t)Hk * HD * 2);
    }
    int bad = 0;
    for (int t = 0; t < T; t++) {
        const float *pr = proj + (size_t)t * ld;
        for (int h = 0; h < H; h++) {
            float *o = ref + ((size_t)t * H + h) * HD;
            cpu_rmsnorm(o, pr + h * 2 * HD, qn, HD, 1e-6f);
            cpu_rope_neox(o, TL_N_ROT, pos0[0] + t, TL_ROPE_THETA);
        }
        for (int h = 0; h < Hk; h++) {
            float kk[256];
            cpu_rmsnorm(kk, pr + H * 2 * HD + h * HD, kn, HD, 1e-6f);
            cpu_rope_neox(kk, TL_N_ROT, pos0[0] + t, TL_ROPE_THETA);
            for (int i = 0; i < HD; i++) {
                float gkv = tl_bf16_to_f32(gk[((size_t)t * Hk + h) * HD + i]);
                float gvv = tl_bf16_to_f32(gv[((size_t)t * Hk + h) * HD + i]);
                float rv = pr[H * 2 * HD + Hk * HD + h * HD + i];
                /* bf16 storage: the oracle's value rounded to bf16, or one ulp (2^-8 relative) away
                 */
                if (fabsf(gkv - bf16r(kk[i])) > fabsf(kk[i]) * (1.0f / 128.0f) + 1e-6f) bad++;
                if (gvv != bf16r(rv)) bad++;
            }
        }
    }
    CHECK_EQ_INT(bad, 0);
    /* RoPE angles up to 2.6e5 rad: cosf/sinf on device vs host agree to ~1 ulp of the angle
     * reduction; per element atol 1e-5 */
    double ma = t_max_abs_diff(got, ref, (size_t)T * H * HD);
    printf("# qk_rope q max_abs=%.3e\n", ma);
    CHECK(ma <= 1e-5);
    /* q_out NULL: q rotated in place in proj, the same values as into q_out */
    CHECK_EQ_INT(tl_gpu_qk_rope_kv(NULL, dk, dv, dproj, ld, dqn, dkn, H, Hk, &pg, TL_ROPE_THETA,
                                   1e-6f, &d.s, NULL),
                 0);
    float *inpl = host_from(dproj, (size_t)T * ld);
    int differ = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            differ += memcmp(inpl + (size_t)t * ld + h * 2 * HD, got + ((size_t)t * H + h) * HD,
                             HD * sizeof(float)) != 0;
    CHECK_EQ_INT(differ, 0);
    free(inpl);
    tl_gpu_free(dproj), tl_gpu_free(dqn), tl_gpu_free(dkn), tl_gpu_free(dq), tl_gpu_free(dk),
        tl_gpu_free(dv), tl_gpu_free(d.buf);
    free(proj), free(qn), free(kn), free(got), free(ref), free(gk), free(gv);
    kvpages_free(&kp);
}

/* Segments (slot, pos0, n) of queries over random bf16 caches; H query heads over Hk KV heads
 * (G = H / Hk = 8 takes the tensor-core split kernel unless cuda_core). */
static void attn_run(int H, int n_seg, const int *slot, const int *pos0, const int *n, int n_split,
                     int cuda_core) {
    const int Hk = TL_N_HEAD_KV, HD = TL_HEAD_DIM, max_ctx = 3000, n_slot = 2;
    int ld = H * 2 * HD + 2 * Hk * HD, T = 0;
    for (int i = 0; i < n_seg; i++) T += n[i];
    /* kf/vf: each slot's cache in position order (the oracle's view); kc/vc: the same values in
     * a shuffled page pool (the kernels' view), its spare rows random too */
    kvpages kp = kvpages_shuffled(n_slot, max_ctx);
    tl_gpu_kv_pages pg = {kp.d, kp.max_pages};
    size_t kvn = (size_t)n_slot * max_ctx * Hk * HD,
           pooln = (size_t)kp.n_page * TL_KV_PAGE * Hk * HD;
    uint16_t *kc = xmalloc(pooln * 2), *vc = xmalloc(pooln * 2);
    float *kf = xmalloc(kvn * 4), *vf = xmalloc(kvn * 4);
    for (size_t i = 0; i < pooln; i++)
        kc[i] = tl_f32_to_bf16(2.0f * t_randf(&rs)), vc[i] = tl_f32_to_bf16(t_randf(&rs));
    for (int sl = 0; sl < n_slot; sl++)
        for (int p = 0; p < max_ctx; p++) {
            size_t lo = ((size_t)sl * max_ctx + p) * Hk * HD,
                   ph = kvpages_row(&kp, sl, p) * Hk * HD;
            for (int i = 0; i < Hk * HD; i++)
                kf[lo + i] = tl_bf16_to_f32(kc[ph + i]), vf[lo + i] = tl_bf16_to_f32(vc[ph + i]);
        }
    float *q = rand_vec((size_t)T * H * HD, 1.0f, &rs), *proj = rand_vec((size_t)T * ld, 2.0f, &rs);
    float *ref = xmalloc(sizeof(float) * T * H * HD);
    for (int sg = 0, t = 0; sg < n_seg; sg++)
        for (int k = 0; k < n[sg]; k++, t++) {
            size_t sb = (size_t)slot[sg] * max_ctx * Hk * HD;
            /* one query at position pos over keys 0..pos: cpu_attention with n_q = 1, pos0 = pos */
            cpu_attention(ref + (size_t)t * H * HD, q + (size_t)t * H * HD, kf + sb, vf + sb, 1,
                          pos0[sg] + k, H, Hk, HD, 1.0f / 16.0f);
            for (int h = 0; h < H; h++)
                for (int dd = 0; dd < HD; dd++)
                    ref[((size_t)t * H + h) * HD + dd] *=
                        cpu_sigmoid(proj[(size_t)t * ld + h * 2 * HD + HD + dd]);
        }
    dseqs d = make_seqs(n_seg, slot, pos0, n);
    uint16_t *dk = dev_from(kc, pooln * 2), *dv = dev_from(vc, pooln * 2);
    float *dq = dev_from(q, sizeof(float) * T * H * HD),
          *dproj = dev_from(proj, sizeof(float) * T * ld);
    float *dpart = tl_gpu_malloc(sizeof(float) * T * H * n_split * 258),
          *dout = tl_gpu_malloc(sizeof(float) * T * H * HD);
    /* garbage in the partials: an unwritten (empty) split must never be read */
    float *junk = xmalloc(sizeof(float) * T * H * n_split * 258);
    for (size_t i = 0; i < (size_t)T * H * n_split * 258; i++) junk[i] = NAN;
    CHECK_EQ_INT(tl_gpu_upload(dpart, junk, sizeof(float) * T * H * n_split * 258), 0);
    tl_gpu_attn_opts opt = {cuda_core, 0};
    CHECK_EQ_INT(
        tl_gpu_attn(dout, dpart, dq, dk, dv, dproj, ld, H, Hk, &pg, n_split, &d.s, &opt, NULL), 0);
    CHECK_EQ_INT(tl_gpu_sync(), 0);
    float *got = host_from(dout, (size_t)T * H * HD);
    char what[96];
    snprintf(what, sizeof what, "attention G=%d %s n_split=%d T=%d", H / Hk,
             cuda_core || H / Hk != 8 ? "cuda-core" : "tensor-core", n_split, T);
    /* same bf16 K/V on both sides, fp32 softmax: docs/developing.md §3 allows 1e-4 for bf16 KV; the
     * CUDA-core kernel sees ~1e-12, the tensor-core one (q and p as bf16 hi + lo, ~16 bits) ~1e-11
     */
    check_nmse(what, got, ref, (size_t)T * H * HD, 1e-9);
    tl_gpu_free(dk), tl_gpu_free(dv), tl_gpu_free(dq), tl_gpu_free(dproj), tl_gpu_free(dpart),
        tl_gpu_free(dout), tl_gpu_free(d.buf);
    free(kc), free(vc), free(kf), free(vf), free(q), free(proj), free(ref), free(got), free(junk);
    kvpages_free(&kp);
}

static void test_attn(void) {
    /* five decode queries: positions 0, 31, 32, 1000 (slot 1) and 2999 (slot 0) */
    int slot5[5] = {1, 1, 1, 1, 0}, pos5[5] = {0, 31, 32, 1000, 2999}, n5[5] = {1, 1, 1, 1, 1};
    /* one long query; a prefill-like segment of 11 tokens (new keys 990..1000) + one decode */
    int slot1[1] = {0}, pos1[1] = {2999}, n1[1] = {1};
    int slot2[2] = {1, 0}, pos2[2] = {990, 77}, n2[2] = {11, 1};
    int ns[3] = {128, 3, 1};
    for (int i = 0; i < 3; i++) {
        attn_run(TL_N_HEAD, 5, slot5, pos5, n5, ns[i], 0);
        attn_run(TL_N_HEAD, 5, slot5, pos5, n5, ns[i], 1);
    }
    attn_run(TL_N_HEAD, 1, slot1, pos1, n1, 128, 0);
    attn_run(TL_N_HEAD, 2, slot2, pos2, n2, 64, 0);
    attn_run(TL_N_HEAD, 2, slot2, pos2, n2, 64, 1);
    attn_run(4, 5, slot5, pos5, n5, 64, 0); /* G = 2 (the small test model): CUDA-core kernel */
}

/* ---- MoE ---- */

/* Router logits with a NaN or +inf, or only -inf ones (a poisoned input or weight): those tokens
 * get ids in range and NaN weights (their output turns NaN; the sampler then reports token -1);
 * the other tokens, one with a single -inf logit among them (probability 0), route as the CPU
 * reference does (issue 11, 2e). */
static void test_moe_route_poisoned(void) {
    const int E = TL_N_EXPERT, K = TL_N_EXPERT_USED, T = 6, ld = E + 1;
    float *lg = rand_vec((size_t)T * ld, 4.0f, &rs);
    lg[1 * ld + 77] = NAN, lg[3 * ld + 200] = INFINITY, lg[4 * ld + 0] = -INFINITY;
    for (int e = 0; e < E; e++) lg[5 * ld + e] = -INFINITY;
    float *dl = dev_from(lg, sizeof(float) * T * ld);
    int32_t *dids = tl_gpu_malloc(4 * T * K);
    float *dw = tl_gpu_malloc(4 * T * K), *dsh = tl_gpu_malloc(4 * T);
    CHECK_EQ_INT(tl_gpu_moe_route(dids, dw, dsh, NULL, dl, ld, E, K, T, NULL), 0);
    CHECK_EQ_INT(tl_gpu_sync(), 0);
    int32_t ids[6 * 8];
    float w[6 * 8];
    tl_gpu_download(ids, dids, sizeof ids), tl_gpu_download(w, dw, sizeof w);
    for (int t = 0; t < T; t++) {
        int poisoned = t == 1 || t == 3 || t == 5, rid[8];
        float rw[8];
        if (!poisoned) cpu_moe_route(rid, rw, lg + (size_t)t * ld, E, K);
        for (int j = 0; j < K; j++) {
            CHECK(ids[t * K + j] >= 0 && ids[t * K + j] < E);
            if (poisoned) CHECK(isnan(w[t * K + j]));
            if (!poisoned) CHECK_EQ_INT(ids[t * K + j], rid[j]);
            if (!poisoned) CHECK_CLOSE(w[t * K + j], rw[j], 1e-6, 1e-5);
        }
    }
    tl_gpu_free(dl), tl_gpu_free(dids), tl_gpu_free(dw), tl_gpu_free(dsh);
    free(lg);
}

static void test_moe_route(void) {
    const int E = TL_N_EXPERT, K = TL_N_EXPERT_USED, T = 7, ld = E + 1;
    float *lg = rand_vec((size_t)T * ld, 4.0f, &rs);
    for (int e = 0; e < E; e++)
        lg[6 * ld + e] = 0.25f * (float)(e % 3); /* token 6: many exact ties */
    float *dl = dev_from(lg, sizeof(float) * T * ld);
    int32_t *dids = tl_gpu_malloc(4 * T * K);
    float *dw = tl_gpu_malloc(4 * T * K), *dsh = tl_gpu_malloc(4 * T);
    CHECK_EQ_INT(tl_gpu_moe_route(dids, dw, dsh, NULL, dl, ld, E, K, T, NULL), 0);
    int32_t ids[7 * 8];
    float w[7 * 8], sh[7];
    tl_gpu_download(ids, dids, sizeof ids), tl_gpu_download(w, dw, sizeof w),
        tl_gpu_download(sh, dsh, sizeof sh);
    for (int t = 0; t < T; t++) {
        int rid[8];
        float rw[8];
        cpu_moe_route(rid, rw, lg + (size_t)t * ld, E, K);
        /* same ids in the same order (ties go to the lower id on both sides), weights to fp32
         * rounding */
        for (int j = 0; j < K; j++) {
            CHECK_EQ_INT(ids[t * K + j], rid[j]);
            CHECK_CLOSE(w[t * K + j], rw[j], 1e-6, 1e-5);
        }
        CHECK_CLOSE(sh[t], cpu_sigmoid(lg[(size_t)t * ld + E]), 1e-7, 1e-6);
    }
    tl_gpu_free(dl), tl_gpu_free(dids), tl_gpu_free(dw), tl_gpu_free(dsh);
    free(lg);
}

/* draft_pick_call on the GPU: the host arrays up, one tl_gpu_draft_pick, back down. */
static int pick_on_gpu(tl_gpu_chain *c, int n, const tl_law *laws, int j, int32_t *next,
                       int32_t *adj) {
    tl_gpu_chain *dc = dev_from(c, sizeof *c * n);
    tl_law *dl = dev_from(laws, sizeof *laws * n);
    int32_t *dn = dev_from(next, 4 * (size_t)n), *da = dev_from(adj, 4 * (size_t)n * TL_LAW_ADJ);
    int st = tl_gpu_draft_pick(dc, dl, j, n, dn, da, NULL);
    if (!st) st = tl_gpu_sync();
    tl_gpu_download(c, dc, sizeof *c * n), tl_gpu_download(next, dn, 4 * (size_t)n);
    tl_gpu_download(adj, da, 4 * (size_t)n * TL_LAW_ADJ);
    tl_gpu_free(dc), tl_gpu_free(dl), tl_gpu_free(dn), tl_gpu_free(da);
    return st;
}

/* tl_gpu_draft_pick against the engine's host draws (tests/gpu/draft_pick_case.h): 1, 7 and 300
 * entries (three blocks), 4 steps; then a step past TL_MAX_SPEC is refused. */
static void test_draft_pick(void) {
    int bad = 0, sizes[3] = {1, 7, 300};
    for (int i = 0; i < 3; i++) bad += draft_pick_case(&rs, sizes[i], 4, pick_on_gpu);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(tl_gpu_draft_pick(NULL, NULL, TL_MAX_SPEC, 1, NULL, NULL, NULL), TL_ERR_INVALID);
}

/* tl_gpu_moe_route_plan against tl_gpu_moe_route + tl_gpu_moe_pf_plan on random logits (one
 * token with many exact ties), 1..32 tokens: ids, weights, shared weights and logits bit for bit,
 * the plan's offsets and tile starts bit for bit, and each expert's assignments (perm: in any
 * order inside an expert) the same set. Then the sizes it refuses. */
static void test_moe_route_plan(void) {
    const int E = TL_N_EXPERT, K = TL_N_EXPERT_USED, ld = E + 1, sizes[] = {1, 3, 4, 8, 17, 32};
    const int TM = 32, PN = PLAN_PERM + TM * 8;
    float *dl = tl_gpu_malloc(sizeof(float) * TM * ld);
    int32_t *di[2], *dp[2];
    float *dw[2], *dsh[2], *dsl[2];
    for (int v = 0; v < 2; v++) {
        di[v] = tl_gpu_malloc(4 * TM * K), dp[v] = tl_gpu_malloc(4 * (size_t)PN);
        dw[v] = tl_gpu_malloc(4 * TM * K), dsh[v] = tl_gpu_malloc(4 * TM);
        dsl[v] = tl_gpu_malloc(4 * TM);
    }
    static route_plan_out o[2];
    int bad = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int T = sizes[si], n = T * K;
        float *lg = rand_vec((size_t)T * ld, 4.0f, &rs);
        for (int e = 0; e < E; e++) lg[(T / 2) * ld + e] = 0.25f * (float)(e % 3);
        CHECK_EQ_INT(tl_gpu_upload(dl, lg, sizeof(float) * T * ld), 0);
        for (int v = 0; v < 2; v++) CHECK_EQ_INT(tl_gpu_memset(dp[v], 0xff, 4 * (size_t)PN), 0);
        CHECK_EQ_INT(tl_gpu_moe_route(di[0], dw[0], dsh[0], dsl[0], dl, ld, E, K, T, NULL), 0);
        CHECK_EQ_INT(tl_gpu_moe_pf_plan(dp[0], di[0], T, NULL), 0);
        CHECK_EQ_INT(
            tl_gpu_moe_route_plan(dp[1], di[1], dw[1], dsh[1], dsl[1], dl, ld, E, K, T, NULL), 0);
        CHECK_EQ_INT(tl_gpu_sync(), 0);
        for (int v = 0; v < 2; v++) {
            tl_gpu_download(o[v].ids, di[v], 4 * (size_t)n),
                tl_gpu_download(o[v].w, dw[v], 4 * (size_t)n);
            tl_gpu_download(o[v].sh, dsh[v], 4 * (size_t)T),
                tl_gpu_download(o[v].sl, dsl[v], 4 * (size_t)T);
            tl_gpu_download(o[v].plan, dp[v], 4 * (size_t)(PLAN_PERM + n));
        }
        int same = route_plan_same(o, T, E);
        printf("# moe_route_plan %d tokens: %s\n", T, same ? "== route + plan" : "DIFFERS");
        bad += !same;
        free(lg);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(tl_gpu_moe_route_plan(dp[1], di[1], dw[1], dsh[1], NULL, dl, ld, E, K, 33, NULL),
                 TL_ERR_INVALID);
    CHECK_EQ_INT(tl_gpu_moe_route_plan(dp[1], di[1], dw[1], dsh[1], NULL, dl, ld, E, 7, 4, NULL),
                 TL_ERR_INVALID);
    tl_gpu_free(dl);
    for (int v = 0; v < 2; v++) {
        tl_gpu_free(di[v]), tl_gpu_free(dp[v]), tl_gpu_free(dw[v]), tl_gpu_free(dsh[v]);
        tl_gpu_free(dsl[v]);
    }
}

/* Experts at production per-expert dims (n_embd 2048, F 512, or the small e2e model's n_embd
 * 256) but 16 experts (host memory). */
static void moe_case(int bits, int D, int K, int T) {
    const int E = 16, F = TL_N_FF_EXPERT;
    hmat g[17], u[17], dn[17], router, shg;
    for (int e = 0; e <= E; e++) {
        hmat_random(&g[e], F, D, bits, 0.05f, &rs);
        hmat_random(&u[e], F, D, bits, 0.05f, &rs);
        hmat_random(&dn[e], D, F, bits, 0.05f, &rs);
    }
    hmat_random(&router, E, D, 0, 0.05f, &rs);
    hmat_random(&shg, 1, D, 0, 0.05f, &rs);
    tl_layer L;
    memset(&L, 0, sizeof L);
    tl_mat eg[16], eu[16], ed[16];
    for (int e = 0; e < E; e++) eg[e] = g[e].m, eu[e] = u[e].m, ed[e] = dn[e].m;
    L.exp_gate = eg, L.exp_up = eu, L.exp_down = ed;
    L.sh_gate = g[E].m, L.sh_up = u[E].m, L.sh_down = dn[E].m;
    L.moe_router = router.m, L.sh_gate_inp = shg.m;
    float *h = rand_vec((size_t)T * D, 1.0f, &rs), *nw = rand_vec(D, 1.0f, &rs);
    /* oracle: docs/model.md §2.5 with the CPU functions */
    float *ref = xmalloc(sizeof(float) * T * D), *xn = xmalloc(sizeof(float) * D),
          *tmp = xmalloc(sizeof(float) * 2 * F);
    float *y = xmalloc(sizeof(float) * D), lg[17];
    for (int t = 0; t < T; t++) {
        cpu_rmsnorm(xn, h + (size_t)t * D, nw, D, 1e-6f);
        cpu_matvec(lg, &router.m, xn);
        cpu_matvec(lg + E, &shg.m, xn);
        int ids[16];
        float w[16];
        cpu_moe_route(ids, w, lg, E, K);
        double acc[2048] = {0};
        for (int j = 0; j < K; j++) {
            cpu_ffn_swiglu(y, &eg[ids[j]], &eu[ids[j]], &ed[ids[j]], xn, tmp);
            for (int i = 0; i < D; i++) acc[i] += (double)w[j] * y[i];
        }
        cpu_ffn_swiglu(y, &g[E].m, &u[E].m, &dn[E].m, xn, tmp);
        float sg = cpu_sigmoid(lg[E]);
        for (int i = 0; i < D; i++)
            ref[(size_t)t * D + i] = h[(size_t)t * D + i] + (float)acc[i] + sg * y[i];
    }
    /* device: the backend's upload path (expert-major, shared expert last) */
    tl_gpu_gemm_w dgu, ddn, drt;
    char err[256];
    const tl_mat *gp[17], *up_[17], *dp[17];
    for (int e = 0; e <= E; e++) gp[e] = &g[e].m, up_[e] = &u[e].m, dp[e] = &dn[e].m;
    CHECK_EQ_INT(tl_gpu_experts_upload(&dgu, &ddn, gp, up_, dp, E + 1, err, sizeof err), 0);
    CHECK_EQ_INT(dgu.bits, bits ? 4 : 16);
    const tl_mat *rp[2] = {&router.m, &shg.m};
    CHECK_EQ_INT(tl_gpu_mat_upload(&drt, rp, 2, 0, err, sizeof err), 0);
    float *dh = dev_from(h, sizeof(float) * T * D), *dnwv = dev_from(nw, sizeof(float) * D);
    float *dlg = tl_gpu_malloc(sizeof(float) * T * (E + 1)),
          *dwt = tl_gpu_malloc(sizeof(float) * T * K);
    float *dsh = tl_gpu_malloc(sizeof(float) * T),
          *dact = tl_gpu_malloc(sizeof(float) * T * (K + 1) * F);
    int32_t *dids = tl_gpu_malloc(sizeof(int32_t) * T * K);
    CHECK_EQ_INT(tl_gpu_gemv(dlg, E + 1, &drt, dh, D, dnwv, 1e-6f, T, 0, NULL), 0);
    CHECK_EQ_INT(tl_gpu_moe_route(dids, dwt, dsh, NULL, dlg, E + 1, E, K, T, NULL), 0);
    CHECK_EQ_INT(tl_gpu_moe_up(dact, &dgu, dh, dnwv, 1e-6f, dids, K, E, T, NULL), 0);
    CHECK_EQ_INT(tl_gpu_moe_down(dh, &ddn, dact, dids, dwt, dsh, K, E, T, NULL), 0);
    CHECK_EQ_INT(tl_gpu_sync(), 0);
    float *got = host_from(dh, (size_t)T * D);
    /* the decode step's fused form (routing inside moe_up, moe_down after it): same ids,
     * bit-identical h, with the batch-1 slice kernels off (0) and on (1: moe_up_q4s when T = 1,
     * moe_down routing early) */
    /* the slice kernels (mode 1) compute q4m_dot's sums: not beside the q4v dot */
    for (int mode = 0; bits && mode <= (q4v_now() ? 0 : 1); mode++) {
        int32_t *hid = (int32_t *)host_from(dids, (size_t)T * K), *hid2;
        float *dh2 = dev_from(h, sizeof(float) * T * D);
        int old = tl_gpu_moe_set_slice(mode);
        CHECK_EQ_INT(tl_gpu_memset(dids, 0xff, sizeof(int32_t) * T * K), 0);
        CHECK_EQ_INT(tl_gpu_moe_up_route(dact, dids, dwt, dsh, &dgu, dh2, dnwv, 1e-6f, dlg, E + 1,
                                         K, E, T, NULL),
                     0);
        CHECK_EQ_INT(
            tl_gpu_moe_down_after_route(dh2, &ddn, dact, dids, dlg, E + 1, dwt, dsh, K, E, T, NULL),
            0);
        CHECK_EQ_INT(tl_gpu_sync(), 0);
        tl_gpu_moe_set_slice(old);
        hid2 = (int32_t *)host_from(dids, (size_t)T * K);
        float *got2 = host_from(dh2, (size_t)T * D);
        int same_ids = !memcmp(hid, hid2, sizeof(int32_t) * T * K);
        int same_h = !memcmp(got, got2, sizeof(float) * T * D);
        printf("# moe_up_route + down (slice %d) D%d k%d T%d: ids %s, h %s (want both same)\n",
               mode, D, K, T, same_ids ? "same" : "DIFFER", same_h ? "same" : "DIFFER");
        CHECK(same_ids);
        CHECK(same_h);
        tl_gpu_free(dh2);
        free(hid), free(hid2), free(got2);
    }
    char what[64];
    snprintf(what, sizeof what, "moe %s D%d k%d T%d", bits ? "q4" : "bf16", D, K, T);
    check_nmse(what, got, ref, (size_t)T * D, 1e-9);
    tl_gpu_mat_free(&dgu), tl_gpu_mat_free(&ddn), tl_gpu_mat_free(&drt);
    tl_gpu_free(dh), tl_gpu_free(dnwv), tl_gpu_free(dlg), tl_gpu_free(dwt), tl_gpu_free(dsh),
        tl_gpu_free(dact), tl_gpu_free(dids);
    for (int e = 0; e <= E; e++) hmat_free(&g[e]), hmat_free(&u[e]), hmat_free(&dn[e]);
    hmat_free(&router), hmat_free(&shg);
    free(h), free(nw), free(ref), free(xn), free(tmp), free(y), free(got);
}

static void test_moe(void) {
    moe_case(0, TL_N_EMBD, TL_N_EXPERT_USED, 3);
    moe_case(4, TL_N_EMBD, TL_N_EXPERT_USED, 3);
    moe_case(4, 256, 4, 12); /* the small e2e model's MoE, a 12-token prompt */
}

static void test_slice_kernels(void) {
    int old_v = tl_gpu_q4v_set(0); /* the slice kernels compute q4m_dot's sums (moe_case) */
    moe_case(4, TL_N_EMBD, TL_N_EXPERT_USED, 1); /* batch 1: moe_up_q4s, early moe_down */
    moe_case(4, 256, 4, 1);                      /* the small model's shapes (KPW 8) */
    moe_case(4, TL_N_EMBD, TL_N_EXPERT_USED, 4); /* a verify's 4 tokens: moe_up_q4x */
    moe_case(4, TL_N_EMBD, TL_N_EXPERT_USED, 8);
    moe_case(4, 256, 4, 5);
    tl_gpu_q4v_set(old_v);
    gemv_ways_case(12416, TL_N_EMBD, 1, 1, 0); /* GDN in-proj: KPW 16, KS 4, 6 units */
    gemv_ways_case(2048, 4096, 1, 0, 1);       /* GDN out-proj + residual: KS 8 */
    gemv_ways_case(2048, 4096, 4, 0, 1);       /* attention o-proj, 4 tokens: KS 8 */
    /* K = 8192 (no model shape) for KPW 32: at 2 tokens; at 4 the q4m kernel's staged x and its
     * weight stages (280 KB) exceed shared memory */
    gemv_ways_case(2048, 8192, 2, 0, 1);
    gemv_ways_case(9216, TL_N_EMBD, 5, 1, 0); /* attention in-proj, a verify's 5 tokens */
    for (int i = 0; i < 4; i++) /* K = 768: KPW 8, KS 3 (6 of 8 warps), rows staged in 2 passes */
        gemv_ways_case(1024, 768, 8, 1, 1);
    gemv_ways_case(200, 256, 2, 0, 0);              /* fewer units than blocks */
    gemv_ways_case(248320 / 8, TL_N_EMBD, 1, 0, 0); /* the LM head: too large for the slice */
    gemv_ways_case(248320 / 8, TL_N_EMBD, 5, 0, 0);
}

/* ---- sampling ---- */

static tl_sample_params greedy_params(void) {
    tl_sample_params p;
    memset(&p, 0, sizeof p);
    p.top_p = 1.0f, p.repetition_penalty = 1.0f;
    return p;
}

/* Device count bits (gpu.h TL_GPU_COUNT_WORDS) of host counts [rows][V]: every non-zero count's
 * bit, and as many other bits set at random (a superset, as the backend's bits become after a
 * rollback): a sampler must give the same results with them as with the counts alone. */
static uint32_t *count_bits_of(const int32_t *counts, int rows, int V) {
    size_t W = TL_GPU_COUNT_WORDS(V), n = (size_t)rows * W;
    uint32_t *b = xcalloc(n, sizeof(uint32_t));
    unsigned long long brs = 0xb175b175ull; /* own stream: the tests' draws stay as they were */
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < V; i++)
            if (counts[(size_t)r * V + i]) {
                b[r * W + i / 32] |= 1u << (i % 32);
                int j = (int)(t_rng_next(&brs) % (unsigned)V); /* a stray bit, count 0 or not */
                b[r * W + j / 32] |= 1u << (j % 32);
            }
    uint32_t *d = dev_from(b, sizeof(uint32_t) * n);
    free(b);
    return d;
}

static int run_sample_no_bits; /* run_sample passes no count bits (test_sample_count_bits) */

/* Runs the sampler on rows of logits with per-row params/keys; returns the outputs. Rows with
 * token restrictions (host pointers in p) get device copies of their bias pairs and bitset, and
 * the launch a restricted-logits buffer, as cuda_forward.cu stages them. */
static void run_sample(tl_sample_out *out, const float *lg, int V, int n_valid,
                       const tl_sample_params *p, const uint64_t *keys, const int32_t *counts,
                       int rows) {
    tl_sample_params *pd = xmalloc(sizeof(tl_sample_params) * rows);
    void **fr = xcalloc((size_t)rows * 3, sizeof(void *));
    int any_restrict = 0;
    for (int r = 0; r < rows; r++) {
        pd[r] = p[r];
        if (p[r].n_bias > 0) {
            pd[r].bias_ids = fr[3 * r] = dev_from(p[r].bias_ids, 4 * (size_t)p[r].n_bias);
            pd[r].bias_vals = fr[3 * r + 1] = dev_from(p[r].bias_vals, 4 * (size_t)p[r].n_bias);
        }
        if (p[r].allow)
            pd[r].allow = fr[3 * r + 2] = dev_from(p[r].allow, 4 * (size_t)(V + 31) / 32);
        any_restrict |= p[r].n_bias > 0 || p[r].allow;
    }
    float *dl = dev_from(lg, sizeof(float) * (size_t)rows * V);
    tl_sample_params *dp = dev_from(pd, sizeof(tl_sample_params) * rows);
    uint64_t *dk = dev_from(keys, 8 * (size_t)rows);
    int32_t *dc = counts ? dev_from(counts, 4 * (size_t)rows * V) : NULL;
    uint32_t *dcb = counts && !run_sample_no_bits ? count_bits_of(counts, rows, V) : NULL;
    float *scr = tl_gpu_malloc(sizeof(float) * 2 * (size_t)rows * V);
    float *rl = any_restrict ? tl_gpu_malloc(sizeof(float) * (size_t)rows * V) : NULL;
    tl_sample_out *dout = tl_gpu_malloc(sizeof(tl_sample_out) * rows);
    /* the host params as the backend passes them: the launch shape follows the rows */
    CHECK_EQ_INT(tl_gpu_sample(dout, dl, V, n_valid, dp, p, dk, dc, dcb, NULL, scr, rl, rows, NULL),
                 0);
    CHECK_EQ_INT(tl_gpu_sync(), 0);
    tl_gpu_download(out, dout, sizeof(tl_sample_out) * rows);
    tl_gpu_free(dl), tl_gpu_free(dp), tl_gpu_free(dk), tl_gpu_free(dc), tl_gpu_free(scr),
        tl_gpu_free(dout), tl_gpu_free(rl), tl_gpu_free(dcb);
    for (int i = 0; i < 3 * rows; i++) tl_gpu_free(fr[i]);
    free(fr), free(pd);
}

static void test_sample_greedy_logprobs(void) {
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS;
    float *lg = rand_vec((size_t)2 * V, 5.0f, &rs);
    lg[V - 1] = 100.0f;               /* a padding id: must never be picked */
    lg[V + 777] = lg[V + 778] = 9.0f; /* exact tie in row 1: lower id wins */
    tl_sample_params p[2] = {greedy_params(), greedy_params()};
    p[0].n_logprobs = 5, p[1].n_logprobs = 3;
    uint64_t keys[2] = {1, 2};
    tl_sample_out out[2];
    run_sample(out, lg, V, nv, p, keys, NULL, 2);
    for (int r = 0; r < 2; r++) {
        const float *l = lg + (size_t)r * V;
        int best = 0;
        double mx = -1e30, s = 0;
        for (int i = 0; i < nv; i++)
            if (l[i] > l[best]) best = i;
        for (int i = 0; i < nv; i++) mx = l[i] > mx ? l[i] : mx;
        for (int i = 0; i < nv; i++) s += exp((double)l[i] - mx);
        double lse = mx + log(s);
        CHECK_EQ_INT(out[r].token, best);
        CHECK_CLOSE(out[r].logprob, l[best] - lse, 1e-4, 1e-5);
        CHECK_EQ_INT(out[r].n_top, p[r].n_logprobs);
        CHECK_EQ_INT(out[r].top_ids[0], best);
        for (int j = 1; j < p[r].n_logprobs; j++) {
            int a = out[r].top_ids[j - 1], b = out[r].top_ids[j];
            CHECK(l[b] < l[a] || (l[b] == l[a] && b > a));
            CHECK_CLOSE(out[r].top_logprobs[j], l[b] - lse, 1e-4, 1e-5);
        }
    }
    CHECK_EQ_INT(out[1].token, 777);
    CHECK_EQ_INT(out[1].top_ids[1], 778);
    free(lg);
}

/* Many draws of a small distribution: frequencies within 5 sigma of the renormalised target. */
static void sample_dist_case(const char *name, float temp, int top_k, float top_p, float min_p) {
    const int V = 8, rows = 4000;
    float base[8] = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 2.2f, -3.0f};
    float *lg = xmalloc(sizeof(float) * V * rows);
    tl_sample_params *p = xmalloc(sizeof(tl_sample_params) * rows);
    uint64_t *keys = xmalloc(8 * rows);
    for (int r = 0; r < rows; r++) {
        memcpy(lg + (size_t)r * V, base, sizeof base);
        p[r] = greedy_params();
        p[r].temperature = temp, p[r].top_k = top_k, p[r].top_p = top_p, p[r].min_p = min_p;
        keys[r] = 0x9E3779B97F4A7C15ull * (uint64_t)(r + 1);
    }
    tl_sample_out *out = xmalloc(sizeof(tl_sample_out) * rows);
    run_sample(out, lg, V, V, p, keys, NULL, rows);
    double pr[8], mx = -1e30, s = 0;
    for (int i = 0; i < V; i++) mx = base[i] / temp > mx ? base[i] / temp : mx;
    for (int i = 0; i < V; i++) s += pr[i] = exp(base[i] / temp - mx);
    for (int i = 0; i < V; i++) pr[i] /= s;
    /* the kernel's order: top-k and min-p (relative to the best token), then top-p over the
     * survivors */
    int keep[8];
    double pmax = 0;
    for (int i = 0; i < V; i++) pmax = pr[i] > pmax ? pr[i] : pmax;
    for (int i = 0; i < V; i++) {
        int rank = 0;
        for (int j = 0; j < V; j++) rank += pr[j] > pr[i];
        keep[i] = (top_k <= 0 || rank < top_k) && (min_p <= 0 || pr[i] >= min_p * pmax);
    }
    if (top_p < 1.0f) { /* smallest set of the top tokens with mass >= top_p of the kept mass */
        double kept = 0;
        for (int i = 0; i < V; i++) kept += keep[i] ? pr[i] : 0;
        for (int i = 0; i < V; i++) {
            if (!keep[i]) continue;
            double above = 0;
            for (int j = 0; j < V; j++)
                if (keep[j] && pr[j] > pr[i]) above += pr[j];
            if (above >= top_p * kept) keep[i] = 0;
        }
    }
    double z = 0;
    for (int i = 0; i < V; i++) z += keep[i] ? pr[i] : 0;
    int cnt[8] = {0};
    for (int r = 0; r < rows; r++) {
        CHECK(out[r].token >= 0 && out[r].token < V);
        if (out[r].token >= 0 && out[r].token < V) cnt[out[r].token]++;
    }
    int bad = 0;
    for (int i = 0; i < V; i++) {
        double q = keep[i] ? pr[i] / z : 0, f = (double)cnt[i] / rows;
        double sigma = sqrt(q * (1 - q) / rows) + 1e-9;
        if (!keep[i] && cnt[i]) bad++;
        if (keep[i] && fabs(f - q) > 5 * sigma + 1e-3) bad++;
    }
    printf("# sample %-10s freq:", name);
    for (int i = 0; i < V; i++) printf(" %.3f", (double)cnt[i] / rows);
    printf("\n");
    CHECK_EQ_INT(bad, 0);
    free(lg), free(p), free(keys), free(out);
}

/* A row with a NaN or an infinity (a poisoned model) samples token -1, greedy or not; the rows
 * beside it are unaffected (issue 11, 2e). */
static void test_sample_poisoned(void) {
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS;
    float *lg = rand_vec((size_t)3 * V, 5.0f, &rs);
    tl_sample_params p[3] = {greedy_params(), greedy_params(), greedy_params()};
    p[2].temperature = 1.0f, p[2].top_k = 20, p[2].top_p = 0.95f;
    uint64_t keys[3] = {1, 2, 3};
    tl_sample_out clean[3], out[3];
    run_sample(clean, lg, V, nv, p, keys, NULL, 3);
    lg[(size_t)1 * V + 4242] = NAN;
    run_sample(out, lg, V, nv, p, keys, NULL, 3);
    CHECK_EQ_INT(out[1].token, -1);
    CHECK_EQ_INT(out[0].token, clean[0].token);
    CHECK_EQ_INT(out[2].token, clean[2].token);
    lg[(size_t)1 * V + 4242] = 1.0f, lg[(size_t)2 * V + 9] = INFINITY;
    run_sample(out, lg, V, nv, p, keys, NULL, 3);
    CHECK_EQ_INT(out[1].token, clean[1].token);
    CHECK_EQ_INT(out[2].token, -1);
    free(lg);
}

/* The two-pass sampler at full vocabulary (the server's case: top-k <= 64, no top logprobs):
 * a few strong tokens spread over the parts (two of them tied), the rest of the vocabulary far
 * below; temperature, top-k, min-p, top-p and a presence penalty on one of the strong tokens
 * (its count) give an exact law computed here in double, following the host sampler's order
 * (top-k and min-p, then top-p over the survivors). n_rows rows a launch with their own keys,
 * n_launch launches: every draw must be a survivor, and the chi-square statistic over the
 * survivors must stay under the 1e-4 tail of its distribution. */
static void sample_full_law(int n_rows, int n_launch) {
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS, NS = 7;
    const int ids[7] = {17, 40000, 40001, 120003, 199999, 248000, 7777};
    const float val[7] = {6.0f, 5.6f, 5.6f, 5.3f, 6.3f, 4.0f, 2.0f};
    float *lg = xmalloc(sizeof(float) * V * (size_t)n_rows);
    int32_t *cnt = xcalloc((size_t)V * n_rows, 4);
    unsigned long long r0 = 0x5eed;
    for (int i = 0; i < V; i++) lg[i] = -4.0f - 6.0f * t_randf(&r0) * t_randf(&r0);
    for (int j = 0; j < NS; j++) lg[ids[j]] = val[j];
    cnt[199999] = (1 << 30) | 1; /* generated once: presence 1.0 takes 6.3 down to 5.3 */
    for (int r = 1; r < n_rows; r++) {
        memcpy(lg + (size_t)r * V, lg, sizeof(float) * V);
        memcpy(cnt + (size_t)r * V, cnt, 4 * (size_t)V);
    }
    tl_sample_params P = greedy_params();
    P.temperature = 0.8f, P.top_k = 6, P.min_p = 0.1f, P.top_p = 0.8f, P.presence_penalty = 1.0f;
    /* the law: penalised logits / T, top 6 (ties: lower id), min-p, then top-p */
    double l[7], q[7] = {0}, best = -1e30, tot = 0, cum = 0;
    int order[7], keep = 0;
    for (int j = 0; j < NS; j++) l[j] = (val[j] - (ids[j] == 199999 ? 1.0 : 0.0)) / 0.8;
    for (int j = 0; j < NS; j++) order[j] = j;
    for (int a = 0; a < NS; a++)
        for (int b = a + 1; b < NS; b++)
            if (l[order[b]] > l[order[a]] ||
                (l[order[b]] == l[order[a]] && ids[order[b]] < ids[order[a]])) {
                int t = order[a];
                order[a] = order[b], order[b] = t;
            }
    best = l[order[0]];
    while (keep < 6 && exp(l[order[keep]] - best) >= 0.1) tot += exp(l[order[keep]] - best), keep++;
    int k2 = 0;
    while (k2 < keep) {
        cum += exp(l[order[k2++]] - best);
        if (cum >= 0.8 * tot) break;
    }
    double z = 0;
    for (int a = 0; a < k2; a++) z += exp(l[order[a]] - best);
    for (int a = 0; a < k2; a++) q[order[a]] = exp(l[order[a]] - best) / z;
    tl_sample_params *p = xmalloc(sizeof(tl_sample_params) * n_rows);
    uint64_t *keys = xmalloc(8 * (size_t)n_rows);
    tl_sample_out *out = xmalloc(sizeof(tl_sample_out) * n_rows);
    int hits[7] = {0}, stray = 0, n = 0;
    for (int it = 0; it < n_launch; it++) {
        for (int r = 0; r < n_rows; r++)
            p[r] = P, keys[r] = 0x9E3779B97F4A7C15ull * (uint64_t)(it * n_rows + r + 1);
        run_sample(out, lg, V, nv, p, keys, cnt, n_rows);
        for (int r = 0; r < n_rows; r++, n++) {
            int j = 0;
            while (j < NS && ids[j] != out[r].token) j++;
            if (j == NS || q[j] == 0)
                stray++;
            else
                hits[j]++;
        }
    }
    double chi2 = 0;
    for (int j = 0; j < NS; j++)
        if (q[j] > 0) chi2 += (hits[j] - n * q[j]) * (hits[j] - n * q[j]) / (n * q[j]);
    printf("# full-vocab law (rows %d x %d): survivors %d, chi2 %.2f (df %d), stray %d; freq",
           n_rows, n_launch, k2, chi2, k2 - 1, stray);
    for (int j = 0; j < NS; j++) printf(" %.3f/%.3f", (double)hits[j] / n, q[j]);
    printf("\n");
    CHECK_EQ_INT(stray, 0);
    CHECK(k2 == 4);     /* top-p cuts the tie loser 199999 (the law is as designed) */
    CHECK(chi2 < 21.1); /* df 3: P(chi2 > 21.1) < 1e-4 */
    free(lg), free(cnt), free(p), free(keys), free(out);
}

/* Greedy on the two-pass path at full vocabulary: the penalised argmax, ties to the lower id,
 * across parts; the logprob against a double log-sum-exp. */
static void test_sample_greedy_full(void) {
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS;
    float *lg = rand_vec((size_t)3 * V, 4.0f, &rs);
    lg[123456] = lg[200001] = 50.0f;           /* row 0: a tie across parts: 123456 */
    lg[V + 5] = 30.0f, lg[V + 240000] = 29.9f; /* row 1: repetition 2.0 on 5 -> 240000 */
    lg[2 * V + nv + 3] = 99.0f;                /* row 2: a padding id must never win */
    int32_t *cnt = xcalloc((size_t)3 * V, 4);
    cnt[V + 5] = 1 << 30;
    tl_sample_params p[3] = {greedy_params(), greedy_params(), greedy_params()};
    p[1].repetition_penalty = 2.0f;
    uint64_t keys[3] = {1, 2, 3};
    tl_sample_out out[3];
    run_sample(out, lg, V, nv, p, keys, cnt, 3);
    CHECK_EQ_INT(out[0].token, 123456);
    CHECK_EQ_INT(out[1].token, 240000);
    int best = 0;
    for (int i = 1; i < nv; i++)
        if (lg[2 * (size_t)V + i] > lg[2 * (size_t)V + best]) best = i;
    CHECK_EQ_INT(out[2].token, best);
    double mx = -1e30, s = 0;
    for (int i = 0; i < nv; i++) mx = fmax(mx, lg[i]);
    for (int i = 0; i < nv; i++) s += exp((double)lg[i] - mx);
    CHECK_CLOSE(out[0].logprob, 50.0 - (mx + log(s)), 1e-4, 1e-5);
    free(lg), free(cnt);
}

static void test_sample_full_vocab_law(void) {
    sample_full_law(1, 2000);
    sample_full_law(64, 40);
    sample_full_law(256, 8);
}

static void test_sample_distribution(void) {
    sample_dist_case("T=1", 1.0f, 0, 1.0f, 0.0f);
    sample_dist_case("T=0.7", 0.7f, 0, 1.0f, 0.0f);
    sample_dist_case("top_k=3", 1.0f, 3, 1.0f, 0.0f);
    sample_dist_case("top_p=0.6", 1.0f, 0, 0.6f, 0.0f);
    sample_dist_case("min_p=0.2", 1.0f, 0, 1.0f, 0.2f);
    sample_dist_case("k4,p0.8", 1.0f, 4, 0.8f, 0.0f);
}

static void test_sample_determinism_penalties(void) {
    const int V = TL_N_VOCAB;
    float *lg = rand_vec((size_t)3 * V, 3.0f, &rs);
    tl_sample_params p[3];
    for (int r = 0; r < 3; r++) {
        p[r] = greedy_params();
        p[r].temperature = 1.0f, p[r].top_k = 50, p[r].top_p = 0.95f;
    }
    memcpy(lg + V, lg, sizeof(float) * V); /* rows 0 and 1 identical with the same key */
    uint64_t keys[3] = {42, 42, 43};
    tl_sample_out a[3], b[3];
    run_sample(a, lg, V, TL_N_VOCAB_TOKENS, p, keys, NULL, 3);
    run_sample(b, lg, V, TL_N_VOCAB_TOKENS, p, keys, NULL, 3);
    for (int r = 0; r < 3; r++) CHECK_EQ_INT(a[r].token, b[r].token);
    CHECK_EQ_INT(a[0].token, a[1].token);
    /* penalties: token 5 best by 0.5, token 6 second; repetition 2.0 on a prompt token 5 halves
     * its positive logit -> 6 wins; presence 1.0 on generated 6 then -> back to 5 for row 2 */
    float *l2 = xcalloc((size_t)3 * V, sizeof(float));
    for (int r = 0; r < 3; r++) l2[(size_t)r * V + 5] = 4.0f, l2[(size_t)r * V + 6] = 3.5f;
    int32_t *cnt = xcalloc((size_t)3 * V, 4);
    tl_sample_params q[3] = {greedy_params(), greedy_params(), greedy_params()};
    q[1].repetition_penalty = 2.0f;
    cnt[(size_t)V + 5] = 1 << 30;
    q[2].presence_penalty = 1.0f;
    q[2].repetition_penalty = 1.0f;
    cnt[(size_t)2 * V + 5] = (1 << 30) | 1;
    uint64_t k3[3] = {1, 2, 3};
    tl_sample_out o[3];
    run_sample(o, l2, V, TL_N_VOCAB_TOKENS, q, k3, cnt, 3);
    CHECK_EQ_INT(o[0].token, 5);
    CHECK_EQ_INT(o[1].token, 6);
    CHECK_EQ_INT(o[2].token, 6);
    /* counts kept per slot as tokens are fed: slot 1 gets prompt [5, 9] then generated [6, 6]
     * (n_prompt 2) in two batches; slot 0 gets [7] before its prompt length is known (-1) */
    int32_t tok1[3] = {5, 9, 7}, pos1[3] = {0, 1, 0}, slot1[3] = {1, 1, 0};
    int32_t tok2[2] = {6, 6}, pos2[2] = {2, 3}, slot2[2] = {1, 1}, np[2] = {-1, 2};
    int32_t *dcs = tl_gpu_malloc(4 * (size_t)2 * V), *dnp = dev_from(np, sizeof np);
    size_t W = TL_GPU_COUNT_WORDS(V);
    uint32_t *dcb = tl_gpu_malloc(4 * 2 * W);
    CHECK_EQ_INT(tl_gpu_memset(dcb, 0, 4 * 2 * W), 0);
    int32_t *dt1 = dev_from(tok1, sizeof tok1), *dp1 = dev_from(pos1, sizeof pos1),
            *ds1 = dev_from(slot1, sizeof slot1), *dt2 = dev_from(tok2, sizeof tok2),
            *dp2 = dev_from(pos2, sizeof pos2), *ds2 = dev_from(slot2, sizeof slot2);
    CHECK_EQ_INT(tl_gpu_memset(dcs, 0, 4 * (size_t)2 * V), 0);
    CHECK_EQ_INT(tl_gpu_penalty_add(dcs, dcb, V, dt1, dp1, ds1, dnp, 3, NULL), 0);
    CHECK_EQ_INT(tl_gpu_penalty_add(dcs, dcb, V, dt2, dp2, ds2, dnp, 2, NULL), 0);
    int32_t *hc = xmalloc(4 * (size_t)2 * V);
    tl_gpu_download(hc, dcs, 4 * (size_t)2 * V);
    int nonzero = 0;
    for (size_t i = 0; i < (size_t)2 * V; i++) nonzero += hc[i] != 0;
    CHECK_EQ_INT(nonzero, 4);
    CHECK_EQ_INT(hc[7], 1 << 30);
    CHECK_EQ_INT(hc[V + 5], 1 << 30);
    CHECK_EQ_INT(hc[V + 9], 1 << 30);
    CHECK_EQ_INT(hc[V + 6], 2); /* generated: a count, no prompt bit */
    /* the count bits: set exactly where the counts are */
    uint32_t *hb = xmalloc(4 * 2 * W);
    tl_gpu_download(hb, dcb, 4 * 2 * W);
    int bits_ok = 1;
    for (int sl = 0; sl < 2; sl++)
        for (int i = 0; i < V; i++)
            bits_ok &= ((hb[sl * W + i / 32] >> (i % 32)) & 1u) == (hc[(size_t)sl * V + i] != 0);
    CHECK(bits_ok);
    free(hb);
    /* the sampler reads a row's counts through count_slot: logits 6 = 4.0, 5 = 3.5; frequency
     * 1.0 takes 6 (generated twice in slot 1) to 2.0, so 5 wins with slot 1's counts; slot 0
     * never saw 6, so 6 wins with slot 0's */
    tl_sample_params qr = greedy_params();
    qr.frequency_penalty = 1.0f;
    float *l3 = xcalloc((size_t)V, sizeof(float));
    l3[6] = 4.0f, l3[5] = 3.5f;
    float *dl2 = dev_from(l3, sizeof(float) * V);
    free(l3);
    tl_sample_params *dq = dev_from(&qr, sizeof qr);
    uint64_t key1 = 1;
    uint64_t *dk1 = dev_from(&key1, 8);
    float *scr = tl_gpu_malloc(sizeof(float) * 2 * (size_t)V);
    tl_sample_out *dout = tl_gpu_malloc(sizeof(tl_sample_out)), so;
    int32_t one = 1, zero = 0;
    int32_t *drs1 = dev_from(&one, 4), *drs0 = dev_from(&zero, 4);
    CHECK_EQ_INT(tl_gpu_sample(dout, dl2, V, TL_N_VOCAB_TOKENS, dq, NULL, dk1, dcs, dcb, drs1, scr,
                               NULL, 1, NULL),
                 0);
    tl_gpu_download(&so, dout, sizeof so);
    CHECK_EQ_INT(so.token, 5);
    CHECK_EQ_INT(tl_gpu_sample(dout, dl2, V, TL_N_VOCAB_TOKENS, dq, NULL, dk1, dcs, dcb, drs0, scr,
                               NULL, 1, NULL),
                 0);
    tl_gpu_download(&so, dout, sizeof so);
    CHECK_EQ_INT(so.token, 6);
    void *fr[] = {dcs, dnp, dt1, dp1, ds1, dt2, dp2, ds2, dl2, dq, dk1, scr, dout, drs1, drs0, dcb};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) tl_gpu_free(fr[i]);
    free(hc);
    free(lg), free(l2), free(cnt);
}

/* ---- token restrictions (logit bias, allowed-token mask) ---- */

/* Random restrictions for one row at full vocabulary: an allowed set of about 1/8 of the ids
 * (mask rows), and bias pairs on random ids with values in [-10, 10], some repeated, some on
 * banned ids, one +100 on an allowed id on every fourth row (it must win). */
typedef struct {
    uint32_t *allow;
    int32_t ids[TL_MAX_LOGIT_BIAS];
    float vals[TL_MAX_LOGIT_BIAS];
    int n;
} restr;

static uint32_t rand_u32(unsigned long long *r) {
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*r >> 32);
}

static void restr_random(restr *x, int V, int nv, int with_mask, int n_bias, int force,
                         unsigned long long *r) {
    int W = (V + 31) / 32;
    x->allow = NULL, x->n = n_bias;
    if (with_mask) {
        x->allow = xcalloc((size_t)W, 4);
        for (int w = 0; w < W; w++) /* about 1/8 of the bits */
            x->allow[w] = rand_u32(r) & rand_u32(r) & rand_u32(r);
    }
    for (int j = 0; j < n_bias; j++) {
        int id = (int)((t_randf(r) * 0.5f + 0.5f) * (nv - 1));
        if (j % 7 == 6) id = x->ids[j / 2]; /* repeated ids: their values add */
        x->ids[j] = id, x->vals[j] = 10.0f * t_randf(r);
    }
    if (force && n_bias > 0) {
        int id = 4321;
        if (x->allow) x->allow[id / 32] |= 1u << (id % 32);
        x->ids[0] = id, x->vals[0] = 100.0f;
    }
}

static void restr_apply(const restr *x, tl_sample_params *p) {
    p->allow = x->allow, p->n_bias = x->n;
    p->bias_ids = x->n ? x->ids : NULL, p->bias_vals = x->n ? x->vals : NULL;
}

/* Greedy with restrictions on random logits at full vocabulary against the host sampler
 * (src/engine/sample.c): the same token exactly (both add the same floats in the same order,
 * then take the argmax: no tolerance), the logprob of the unmodified logits (1e-4 absolute, the
 * float log-sum-exp of test_sample_greedy_logprobs). Rows cover both device paths (two-pass:
 * no top logprobs; one block a row: top logprobs), mask only, bias only, both, a repetition
 * penalty after the restrictions, a +100 bias that forces its token, and rows without any
 * restriction beside restricted ones (they must equal an unrestricted launch). */
static void test_sample_restrict_greedy(void) {
    enum { ROWS = 12 };
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS;
    float *lg = rand_vec((size_t)ROWS * V, 5.0f, &rs);
    int32_t *cnt = xcalloc((size_t)ROWS * V, 4);
    restr *x = xcalloc(ROWS, sizeof *x);
    tl_sample_params p[ROWS];
    uint64_t keys[ROWS];
    int32_t hist[64];
    for (int i = 0; i < 64; i++) hist[i] = (int32_t)((t_randf(&rs) * 0.5f + 0.5f) * (nv - 1));
    for (int r = 0; r < ROWS; r++) {
        p[r] = greedy_params(), keys[r] = (uint64_t)r + 1;
        int mask = r % 3 != 1, n_bias = r % 3 != 0 ? (r < 6 ? 50 : TL_MAX_LOGIT_BIAS) : 0;
        if (r == 10 || r == 11) mask = 0, n_bias = 0; /* unrestricted rows in the launch */
        restr_random(&x[r], V, nv, mask, n_bias, r % 3 == 2, &rs);
        restr_apply(&x[r], &p[r]);
        if (r % 2) p[r].n_logprobs = 3; /* the one-block path */
        if (r == 5 || r == 8) {         /* repetition over a history after the restrictions */
            p[r].repetition_penalty = 1.7f;
            for (int i = 0; i < 64; i++) cnt[(size_t)r * V + hist[i]] = 1 << 30;
            for (int i = 0; i < 64; i += 3) lg[(size_t)r * V + hist[i]] = 12.0f; /* leaders */
        }
    }
    tl_sample_out out[ROWS], plain[ROWS];
    run_sample(out, lg, V, nv, p, keys, cnt, ROWS);
    int forced = 0, n_forced = 0;
    for (int r = 0; r < ROWS; r++) {
        tl_sample_out h;
        uint64_t rng = 1;
        int pen = p[r].repetition_penalty != 1.0f;
        CHECK_EQ_INT(tl_sample_host(lg + (size_t)r * V, nv, &p[r], &rng, pen ? hist : NULL,
                                    pen ? 64 : 0, pen ? 64 : 0, &h),
                     0);
        printf("# restrict greedy row %2d (mask %d, bias %4d, top %d): device %6d host %6d\n", r,
               p[r].allow != NULL, p[r].n_bias, p[r].n_logprobs, out[r].token, h.token);
        CHECK_EQ_INT(out[r].token, h.token);
        CHECK(h.token >= 0);
        if (h.token >= 0) CHECK_CLOSE(out[r].logprob, h.logprob, 1e-4, 1e-5);
        if (h.token >= 0 && p[r].allow) CHECK(p[r].allow[h.token / 32] >> (h.token % 32) & 1u);
        if (r % 3 == 2 && p[r].n_bias > 0) forced += out[r].token == 4321, n_forced++;
    }
    CHECK(n_forced >= 1);
    CHECK_EQ_INT(forced, n_forced);
    /* the unrestricted rows equal a launch with no restricted row at all */
    run_sample(plain, lg + (size_t)10 * V, V, nv, &p[10], &keys[10], cnt + (size_t)10 * V, 2);
    CHECK_EQ_INT(plain[0].token, out[10].token);
    CHECK_EQ_INT(plain[1].token, out[11].token);
    for (int r = 0; r < ROWS; r++) free(x[r].allow);
    free(x), free(lg), free(cnt);
}

/* Nothing allowed: TL_TOKEN_NONE_ALLOWED on both paths, greedy and sampled (an empty mask, and a
 * mask whose only allowed id has a -inf logit); the rows beside it are unaffected. */
static void test_sample_restrict_none(void) {
    enum { ROWS = 6 };
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS, W = (V + 31) / 32;
    float *lg = rand_vec((size_t)ROWS * V, 5.0f, &rs);
    uint32_t *empty = xcalloc((size_t)W, 4), *one = xcalloc((size_t)W, 4);
    one[777 / 32] = 1u << (777 % 32);
    tl_sample_params p[ROWS];
    uint64_t keys[ROWS];
    for (int r = 0; r < ROWS; r++) {
        p[r] = greedy_params(), keys[r] = 100 + (uint64_t)r;
        lg[(size_t)r * V + 777] = -INFINITY;
    }
    p[0].allow = empty;                                        /* greedy, two-pass */
    p[1].allow = one, p[1].n_logprobs = 2;                     /* greedy, one block */
    p[2].allow = empty, p[2].temperature = 1, p[2].top_k = 20; /* sampled, two-pass */
    p[3].allow = one, p[3].temperature = 1;                    /* sampled, one block */
    p[5].temperature = 1, p[5].top_k = 20;                     /* 4, 5: no restriction */
    tl_sample_out out[ROWS], clean[2];
    run_sample(out, lg, V, nv, p, keys, NULL, ROWS);
    for (int r = 0; r < 4; r++) CHECK_EQ_INT(out[r].token, TL_TOKEN_NONE_ALLOWED);
    run_sample(clean, lg + (size_t)4 * V, V, nv, &p[4], &keys[4], NULL, 2);
    CHECK_EQ_INT(out[4].token, clean[0].token);
    CHECK_EQ_INT(out[5].token, clean[1].token);
    CHECK(out[4].token >= 0 && out[5].token >= 0);
    free(lg), free(empty), free(one);
}

/* Sampled with restrictions at full vocabulary, on both device paths, against the exact law of
 * the host sampler's definitions (computed here in double, as sample_full_law): a few strong
 * tokens spread over the parts, the bulk 50+ nats below (outside the 40-nat window, ~1e-17 of
 * the mass), one strong token banned by the mask, one pushed out by a -100 bias, a weak token
 * lifted by +3.5 into the candidates, a repeated-id bias, then T, top-k/min-p/top-p. Every draw
 * must be a survivor, and the chi-square statistic under its 1e-4 tail. The host sampler draws
 * from the same law: its draws are counted too and must also stay inside the survivors. */
static void sample_restrict_law(int two_pass, int n_rows, int n_launch) {
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS, NS = 8, W = (V + 31) / 32;
    const int ids[8] = {17, 40000, 40001, 120003, 199999, 248000, 7777, 99999};
    const float val[8] = {6.0f, 5.6f, 5.2f, 5.3f, 6.3f, 4.0f, 2.0f, 2.5f};
    float *lg = xmalloc(sizeof(float) * V * (size_t)n_rows);
    unsigned long long r0 = 0x5eed;
    for (int i = 0; i < V; i++) lg[i] = -60.0f + 10.0f * t_randf(&r0) * t_randf(&r0);
    for (int j = 0; j < NS; j++) lg[ids[j]] = val[j];
    for (int r = 1; r < n_rows; r++) memcpy(lg + (size_t)r * V, lg, sizeof(float) * V);
    uint32_t *allow = xmalloc(4 * (size_t)W);
    memset(allow, 0xff, 4 * (size_t)W);
    allow[199999 / 32] &= ~(1u << (199999 % 32)); /* the best token is banned */
    int32_t bid[4] = {40000, 99999, 40001, 40001};
    float bval[4] = {-100.0f, 3.5f, 0.25f, 0.25f}; /* 99999: 6.0; 40001: 5.7 */
    tl_sample_params P = greedy_params();
    P.temperature = 0.8f, P.top_k = two_pass ? 6 : 0, P.min_p = 0.05f, P.top_p = 0.9f;
    P.allow = allow, P.n_bias = 4, P.bias_ids = bid, P.bias_vals = bval;
    double l[8], q[8] = {0}, best = -1e30, tot = 0, cum = 0;
    int order[8], keep = 0, kk = two_pass ? 6 : NS;
    for (int j = 0; j < NS; j++) {
        double b = 0;
        for (int k = 0; k < 4; k++) b += bid[k] == ids[j] ? bval[k] : 0;
        l[j] = ids[j] == 199999 ? -INFINITY : (val[j] + b) / 0.8;
        order[j] = j;
    }
    for (int a = 0; a < NS; a++)
        for (int b = a + 1; b < NS; b++)
            if (l[order[b]] > l[order[a]] ||
                (l[order[b]] == l[order[a]] && ids[order[b]] < ids[order[a]])) {
                int t = order[a];
                order[a] = order[b], order[b] = t;
            }
    best = l[order[0]];
    while (keep < kk && exp(l[order[keep]] - best) >= 0.05)
        tot += exp(l[order[keep]] - best), keep++;
    int k2 = 0;
    while (k2 < keep) {
        cum += exp(l[order[k2++]] - best);
        if (cum >= 0.9 * tot) break;
    }
    double z = 0;
    for (int a = 0; a < k2; a++) z += exp(l[order[a]] - best);
    for (int a = 0; a < k2; a++) q[order[a]] = exp(l[order[a]] - best) / z;
    tl_sample_params *p = xmalloc(sizeof(tl_sample_params) * n_rows);
    uint64_t *keys = xmalloc(8 * (size_t)n_rows);
    tl_sample_out *out = xmalloc(sizeof(tl_sample_out) * n_rows);
    int hits[8] = {0}, hhits[8] = {0}, stray = 0, hstray = 0, n = 0;
    for (int it = 0; it < n_launch; it++) {
        for (int r = 0; r < n_rows; r++)
            p[r] = P, keys[r] = 0x9E3779B97F4A7C15ull * (uint64_t)(it * n_rows + r + 1);
        run_sample(out, lg, V, nv, p, keys, NULL, n_rows);
        for (int r = 0; r < n_rows; r++, n++) {
            int j = 0;
            while (j < NS && ids[j] != out[r].token) j++;
            if (j == NS || q[j] == 0)
                stray++;
            else
                hits[j]++;
            if (n % 16) continue; /* the host sampler sorts the vocabulary: 1 draw in 16 */
            tl_sample_out h;
            uint64_t rng = tl_rng_seed(keys[r]);
            CHECK_EQ_INT(tl_sample_host(lg, nv, &P, &rng, NULL, 0, 0, &h), 0);
            for (j = 0; j < NS && ids[j] != h.token; j++) {
            }
            if (j == NS || q[j] == 0)
                hstray++;
            else
                hhits[j]++;
        }
    }
    double chi2 = 0;
    for (int j = 0; j < NS; j++)
        if (q[j] > 0) chi2 += (hits[j] - n * q[j]) * (hits[j] - n * q[j]) / (n * q[j]);
    printf("# restricted law (%s, rows %d x %d): survivors %d, chi2 %.2f (df %d), stray %d, "
           "host stray %d; freq",
           two_pass ? "two-pass" : "one block", n_rows, n_launch, k2, chi2, k2 - 1, stray, hstray);
    for (int j = 0; j < NS; j++) printf(" %.3f/%.3f", (double)hits[j] / n, q[j]);
    printf("\n");
    CHECK_EQ_INT(stray, 0);
    CHECK_EQ_INT(hstray, 0);
    CHECK(k2 == 4);     /* 99999 (6.0), 17 (6.0), 40001 (5.7), 120003 (5.3): top-p keeps 4 */
    CHECK(chi2 < 21.1); /* df 3: P(chi2 > 21.1) < 1e-4 */
    free(lg), free(allow), free(p), free(keys), free(out);
}

/* A grammar's mask: only a few tokens allowed in the full vocabulary (the rest of each part is
 * -inf, so the two-pass path's per-part top-k meets mass ties), at the server's default sampling
 * (temperature 1, top-k 20, top-p 0.95, presence penalty 1.5 over counts): every draw is an
 * allowed token, never TL_TOKEN_NONE_ALLOWED or a stray id. Allowed sets of 1, 2, 7, 25 and 300
 * ids below 151,669 (the Qwen3 tokenizer's size, as on the lent GPU), 64 rows x 8 launches each. */
static void test_sample_sparse_mask(void) {
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS, W = (V + 31) / 32, R = 64;
    const int sizes[5] = {1, 2, 7, 25, 300};
    unsigned long long r0 = 0xa110;
    float *lg = xmalloc(sizeof(float) * V * (size_t)R);
    for (size_t i = 0; i < (size_t)V * R; i++) lg[i] = 3.0f * t_randf(&r0);
    int32_t *cnt = xcalloc((size_t)V * R, sizeof(int32_t));
    for (int i = 0; i < 4000; i++) cnt[t_rng_next(&r0) % ((uint64_t)V * R)] = 1 | (1 << 30);
    uint32_t *allow = xmalloc(4 * (size_t)W);
    tl_sample_params *p = xmalloc(sizeof(tl_sample_params) * R);
    uint64_t *keys = xmalloc(8 * (size_t)R);
    tl_sample_out *out = xmalloc(sizeof(tl_sample_out) * R);
    int bad = 0, draws = 0;
    for (int si = 0; si < 5; si++) {
        memset(allow, 0, 4 * (size_t)W);
        for (int j = 0; j < sizes[si]; j++) {
            int id = (int)(t_rng_next(&r0) % 151669);
            allow[id / 32] |= 1u << (id % 32);
        }
        for (int it = 0; it < 8; it++) {
            for (int r = 0; r < R; r++) {
                p[r] = greedy_params();
                p[r].temperature = 1.0f, p[r].top_k = 20, p[r].top_p = 0.95f;
                p[r].presence_penalty = 1.5f, p[r].allow = allow;
                keys[r] = 0x9E3779B97F4A7C15ull * (uint64_t)(si * 1000 + it * R + r + 1);
            }
            run_sample(out, lg, V, nv, p, keys, cnt, R);
            for (int r = 0; r < R; r++, draws++) {
                int t = out[r].token;
                int ok = t >= 0 && t < V && ((allow[t / 32] >> (t % 32)) & 1u);
                if (!ok && bad < 5)
                    printf("# sparse mask (%d allowed) row %d: token %d not allowed\n", sizes[si],
                           r, t);
                bad += !ok;
            }
        }
    }
    printf("# sparse masks: %d of %d draws outside the allowed set (want 0)\n", bad, draws);
    CHECK_EQ_INT(bad, 0);
    free(lg), free(cnt), free(allow), free(p), free(keys), free(out);
}

static void test_sample_restrict_law(void) {
    sample_restrict_law(1, 64, 40);
    sample_restrict_law(0, 64, 40);
}

/* tl_gpu_kv_page_copy (the prefix cache's page copies) against a host copy, bit for bit, at the
 * production row (2 KV heads x 256) over 10 layers: random bf16 pools, random page pairs with
 * every row count 1..64 at some point, and the rows past each pair's count untouched. */
static void test_kv_page_copy(void) {
    enum { L = 10, SP = 12, DP = 9, NP = 6, ROW = TL_N_HEAD_KV * 256 };
    size_t ns = (size_t)L * SP * TL_KV_PAGE * ROW, nd = (size_t)L * DP * TL_KV_PAGE * ROW;
    uint16_t *hs = xmalloc(ns * 2), *hd = xmalloc(nd * 2), *want = xmalloc(nd * 2);
    uint16_t *got = xmalloc(nd * 2);
    unsigned long long r = 0xc0ffee14ull;
    for (size_t i = 0; i < ns; i++) hs[i] = (uint16_t)t_rng_next(&r);
    for (size_t i = 0; i < nd; i++) hd[i] = (uint16_t)t_rng_next(&r);
    int ok = 1;
    for (int rep = 0; rep < 12 && ok; rep++) {
        int32_t pairs[3 * NP];
        int used[DP] = {0};
        for (int p = 0; p < NP; p++) { /* distinct destinations: the copies do not overlap */
            int d;
            do d = (int)(t_rng_next(&r) % DP);
            while (used[d]);
            used[d] = 1;
            pairs[3 * p] = (int32_t)(t_rng_next(&r) % SP), pairs[3 * p + 1] = d;
            pairs[3 * p + 2] = rep == 0 && p == 0 ? 64 : 1 + (int)((rep * NP + p) % 64);
        }
        memcpy(want, hd, nd * 2);
        for (int l = 0; l < L; l++)
            for (int p = 0; p < NP; p++)
                memcpy(want + ((size_t)l * DP + pairs[3 * p + 1]) * TL_KV_PAGE * ROW,
                       hs + ((size_t)l * SP + pairs[3 * p]) * TL_KV_PAGE * ROW,
                       (size_t)pairs[3 * p + 2] * ROW * 2);
        uint16_t *ds = dev_from(hs, ns * 2), *dd = dev_from(hd, nd * 2);
        int32_t *dp = dev_from(pairs, sizeof pairs);
        CHECK_EQ_INT(tl_gpu_kv_page_copy(dd, DP, ds, SP, dp, NP, L, ROW, NULL), 0);
        CHECK_EQ_INT(tl_gpu_sync(), 0);
        tl_gpu_download(got, dd, nd * 2);
        ok = !memcmp(got, want, nd * 2);
        tl_gpu_free(ds), tl_gpu_free(dd), tl_gpu_free(dp);
    }
    printf("# kv_page_copy: 12 random sets of 6 page pairs x 10 layers == host copy: %s\n",
           ok ? "yes" : "NO");
    CHECK(ok);
    CHECK_EQ_INT(tl_gpu_kv_page_copy(hd, 1, hs, 1, NULL, 1, 1, 12, NULL), TL_ERR_INVALID);
    free(hs), free(hd), free(want), free(got);
}

/* A law row that differs from tl_sample_law's: both laws, the logits of their tokens and the
 * row's count adjustments on stdout. */
static void law_mismatch(const tl_law *g, const tl_law *h, const float *row, int nh, int np,
                         const int32_t *adj) {
    const tl_law *l[2] = {g, h};
    for (int k = 0; k < 2; k++) {
        printf("#   %s law (%d):", k ? "host" : "gpu", l[k]->n);
        for (int i = 0; i < l[k]->n; i++)
            printf(" %d:%.6g/%.6g", l[k]->id[i], l[k]->p[i], row[l[k]->id[i]]);
        printf("\n");
    }
    printf("#   history %d (prompt %d), adjustments:", nh, np);
    for (int a = 0; a < TL_LAW_ADJ; a++) printf(" %d", adj[a]);
    printf("\n");
}

/* tl_gpu_sample_law against the host's tl_sample_law on random full-vocabulary rows, as
 * speculative decoding uses it: rows read through a row map (in reverse order), counts of two
 * slots built by tl_gpu_penalty_add from a prompt and a generated part, adjusted per row (tokens
 * counted in, as a draft row's chain; tokens taken out, as a verify row's later drafts), and the
 * host given the history those counts and adjustments stand for. Then tl_gpu_penalty_sub takes
 * generated tokens out again (a rollback). Laws: the same survivors in the same order (ties to
 * the lower id), probabilities within 1e-5, logprobs within 1e-5 (float lse vs double). */
static void test_sample_law(void) {
    enum { R = 6, NP = 30, NG = 20 };
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS;
    float *lg = rand_vec((size_t)R * V, 3.0f, &rs);
    int32_t hist[2][NP + NG + 8], pos[NP + NG], slot[NP + NG], tok[NP + NG], np[2] = {NP, NP};
    int32_t *dc = tl_gpu_malloc(4 * (size_t)2 * V), *dnp = dev_from(np, sizeof np);
    CHECK_EQ_INT(tl_gpu_memset(dc, 0, 4 * (size_t)2 * V), 0);
    size_t W = TL_GPU_COUNT_WORDS(V);
    uint32_t *dcb = tl_gpu_malloc(4 * 2 * W);
    CHECK_EQ_INT(tl_gpu_memset(dcb, 0, 4 * 2 * W), 0);
    for (int sl = 0; sl < 2; sl++) {
        for (int i = 0; i < NP + NG; i++) { /* a few repeats: generated tokens seen twice */
            int32_t t = (int32_t)(t_rng_next(&rs) % 4000) * 61 % nv;
            if (i >= NP && i % 3 == 0) t = hist[sl][i - 2];
            hist[sl][i] = tok[i] = t, pos[i] = i, slot[i] = sl;
            lg[(size_t)(sl + 1) * V + t] += 2.0f; /* penalised tokens near the top */
        }
        int32_t *dt = dev_from(tok, sizeof tok), *dp = dev_from(pos, sizeof pos),
                *ds = dev_from(slot, sizeof slot);
        CHECK_EQ_INT(tl_gpu_penalty_add(dc, dcb, V, dt, dp, ds, dnp, NP + NG, NULL), 0);
        tl_gpu_free(dt), tl_gpu_free(dp), tl_gpu_free(ds);
    }
    tl_sample_params p[R];
    for (int r = 0; r < R; r++) p[r] = greedy_params();
    p[1].temperature = 1.0f, p[1].top_k = 20, p[1].top_p = 0.95f, p[1].presence_penalty = 1.5f;
    p[2].temperature = 0.5f, p[2].top_k = 64, p[2].min_p = 0.01f, p[2].repetition_penalty = 1.3f;
    p[3].temperature = 1.0f, p[3].top_k = 5, p[3].frequency_penalty = 0.7f;
    p[4].presence_penalty = 3.0f; /* greedy with penalties */
    p[5].temperature = 2.0f, p[5].top_k = 40, p[5].top_p = 0.5f, p[5].presence_penalty = 1.0f;
    int32_t ints[(3 + TL_LAW_ADJ) * R] = {0};
    int nh[R];
    int32_t h[R][NP + NG + 8];
    for (int r = 0; r < R; r++) {
        int sl = r % 2, na = 0;
        ints[r] = R - 1 - r; /* logits row: reversed */
        memcpy(h[r], hist[sl], sizeof(int32_t) * (NP + NG));
        nh[r] = NP + NG;
        if (r % 3 == 1) /* counted in: two new tokens and one already generated */
            for (int a = 0; a < 3; a++) {
                int32_t t = a == 2 ? hist[sl][NP + 1] : (int32_t)(t_rng_next(&rs) % (uint32_t)nv);
                ints[3 * R + r * TL_LAW_ADJ + na++] = t + 1, h[r][nh[r]++] = t;
            }
        if (r % 3 == 2) /* taken out: the last three generated tokens */
            for (int a = 0; a < 3; a++) ints[3 * R + r * TL_LAW_ADJ + na++] = -(h[r][--nh[r]] + 1);
        ints[R + r] = sl;
    }
    float *dl = dev_from(lg, sizeof(float) * (size_t)R * V);
    int32_t *di = dev_from(ints, sizeof ints);
    float *scr = tl_gpu_malloc(sizeof(float) * tl_gpu_law_scratch_floats(R));
    tl_law *dlaw = tl_gpu_malloc(sizeof(tl_law) * R), law[R];
    /* pass 0: no host params (32 parts a row), no count bits; pass 1: host params, every top-k
     * <= 32 (128 parts a row for these 6 rows), the count bits penalty_add set */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) p[2].top_k = 32, p[5].top_k = 32;
        tl_sample_params *dpp = dev_from(p, sizeof p);
        CHECK_EQ_INT(tl_gpu_sample_law(dlaw, dl, V, nv, di, dpp, pass ? p : NULL, dc,
                                       pass ? dcb : NULL, di + R, di + 3 * R, scr, R, NULL),
                     0);
        CHECK_EQ_INT(tl_gpu_sync(), 0);
        tl_gpu_download(law, dlaw, sizeof law);
        tl_gpu_free(dpp);
        double dp_max = 0, dl_max = 0;
        int same = 1;
        for (int r = 0; r < R; r++) {
            tl_law ref;
            const float *row = lg + (size_t)(R - 1 - r) * V;
            CHECK_EQ_INT(tl_sample_law(row, nv, &p[r], h[r], nh[r], NP, &ref), 0);
            same &= law[r].n == ref.n && ref.n > 0;
            for (int i = 0; i < ref.n && i < law[r].n; i++) {
                same &= law[r].id[i] == ref.id[i];
                dp_max = fmax(dp_max, fabs(law[r].p[i] - ref.p[i]));
                dl_max = fmax(dl_max, fabs(law[r].lp[i] - ref.lp[i]));
            }
            printf("# pass %d, law row %d: %d survivors (host %d), best %d (host %d)\n", pass, r,
                   law[r].n, ref.n, law[r].id[0], ref.id[0]);
            if (law[r].n != ref.n || memcmp(law[r].id, ref.id, sizeof(int32_t) * ref.n))
                law_mismatch(&law[r], &ref, row, nh[r], NP, ints + 3 * R + r * TL_LAW_ADJ);
        }
        printf("# pass %d: laws vs tl_sample_law: max |dp| %.2g, max |dlogprob| %.2g\n", pass,
               dp_max, dl_max);
        CHECK(same);
        CHECK(dp_max < 1e-5);
        CHECK(dl_max < 1e-5);
    }
    /* rollback: two generated tokens of slot 1 out again */
    int32_t out2[2] = {hist[1][NP + NG - 1], hist[1][NP + NG - 2]};
    int32_t before[2], after[2];
    tl_gpu_download(before, dc + V + out2[0], 4), tl_gpu_download(before + 1, dc + V + out2[1], 4);
    CHECK_EQ_INT(tl_gpu_penalty_sub(dc, V, out2, 1, 2, NULL), 0);
    CHECK_EQ_INT(tl_gpu_sync(), 0);
    tl_gpu_download(after, dc + V + out2[0], 4), tl_gpu_download(after + 1, dc + V + out2[1], 4);
    int twice = out2[0] == out2[1];
    CHECK_EQ_INT(after[0], before[0] - 1 - twice);
    CHECK_EQ_INT(after[1], before[1] - 1 - twice);
    CHECK_EQ_INT(after[0] & 0xffffff, (before[0] & 0xffffff) - 1 - twice);
    tl_gpu_free(dl), tl_gpu_free(di), tl_gpu_free(scr), tl_gpu_free(dlaw);
    tl_gpu_free(dc), tl_gpu_free(dnp), tl_gpu_free(dcb);
    free(lg);
}

/* The count bits change which counts the two-pass sampler reads, never a result: 64 and 256 rows
 * at the model card's settings (and greedy with a repetition penalty), each row with ~300
 * counted tokens (prompt bits, generated counts, both), sampled with the bits (a superset) and
 * without: the same tokens, logprobs and top entries, bit for bit. */
static void test_sample_count_bits(void) {
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS;
    for (int k = 0; k < 2; k++) {
        int rows = k ? 256 : 64;
        float *lg = rand_vec((size_t)rows * V, 3.0f, &rs);
        int32_t *cnt = xcalloc((size_t)rows * V, 4);
        tl_sample_params *p = xmalloc(sizeof(tl_sample_params) * rows);
        uint64_t *keys = xmalloc(8 * (size_t)rows);
        for (int r = 0; r < rows; r++) {
            for (int i = 0; i < 300; i++) {
                int t = (int)(t_rng_next(&rs) % (unsigned)nv);
                cnt[(size_t)r * V + t] = i % 3 == 0 ? 1 << 30 : i % 3 == 1 ? 2 : (1 << 30) | 1;
                lg[(size_t)r * V + t] += 4.0f; /* counted tokens near the top */
            }
            p[r] = greedy_params();
            if (r % 4) /* the model card's sampling */
                p[r].temperature = 1.0f, p[r].top_k = 20, p[r].top_p = 0.95f,
                p[r].presence_penalty = 1.5f;
            else
                p[r].repetition_penalty = 1.3f, p[r].n_logprobs = 3;
            keys[r] = 0x9E3779B97F4A7C15ull * (uint64_t)(r + 1);
        }
        tl_sample_out *a = xcalloc(rows, sizeof(tl_sample_out)),
                      *b = xcalloc(rows, sizeof(tl_sample_out));
        run_sample(a, lg, V, nv, p, keys, cnt, rows);
        run_sample_no_bits = 1;
        run_sample(b, lg, V, nv, p, keys, cnt, rows);
        run_sample_no_bits = 0;
        int differ = 0;
        for (int r = 0; r < rows; r++) {
            int d = a[r].token != b[r].token || a[r].logprob != b[r].logprob ||
                    a[r].n_top != b[r].n_top;
            for (int i = 0; !d && i < a[r].n_top && i < TL_MAX_LOGPROBS; i++)
                d = a[r].top_ids[i] != b[r].top_ids[i] ||
                    a[r].top_logprobs[i] != b[r].top_logprobs[i];
            differ += d;
        }
        printf("# count bits, %d rows: %d rows differ from the sampler without bits (want 0)\n",
               rows, differ);
        CHECK_EQ_INT(differ, 0);
        free(lg), free(cnt), free(p), free(keys), free(a), free(b);
    }
}

/* rmsnorm_bf16x2_dot's row product (the MoE's shared gate) against the host in double: g[t] =
 * normed row t . (gh + gl), written at a stride, within 1e-5 of the sum of |terms|; with and
 * without the low plane; each row alone gives the same bits as in the batch; the planes' outputs
 * equal rmsnorm_bf16x2's. */
static void norms_bf16_dot_case(const float *dx, const float *dw, const float *x, const float *w,
                                int rows, int n) {
    float *gf = rand_vec((size_t)2 * n, 0.05f, &rs);
    uint16_t *gq = xmalloc((size_t)2 * n * 2);
    for (int c = 0; c < n; c++) {
        gq[c] = tl_f32_to_bf16(gf[c]);
        gq[n + c] = tl_f32_to_bf16(gf[c] - tl_bf16_to_f32(gq[c]) + 1e-3f * gf[n + c]);
    }
    uint16_t *dg = tl_gpu_malloc((size_t)2 * n * 2), *dy = tl_gpu_malloc((size_t)rows * n * 2),
             *dl = tl_gpu_malloc((size_t)rows * n * 2), *dy0 = tl_gpu_malloc((size_t)rows * n * 2);
    CHECK_EQ_INT(tl_gpu_upload(dg, gq, (size_t)2 * n * 2), 0);
    const int ldg = 3;
    float *dgo = tl_gpu_malloc(sizeof(float) * rows * ldg), *dg1 = tl_gpu_malloc(sizeof(float));
    for (int lo = 0; lo < 2; lo++) {
        tl_gpu_gemm_w G = {dg, lo ? (const void *)(dg + n) : NULL, 16, 1, n};
        CHECK_EQ_INT(tl_gpu_rmsnorm_bf16x2_dot(dy, dl, dx, dw, rows, n, 1e-6f, &G, dgo, ldg, NULL),
                     0);
        CHECK_EQ_INT(tl_gpu_rmsnorm_bf16x2(dy0, NULL, dx, dw, rows, n, 1e-6f, NULL), 0);
        float *got = host_from(dgo, (size_t)rows * ldg);
        uint16_t *y = xmalloc((size_t)rows * n * 2), *y0 = xmalloc((size_t)rows * n * 2);
        tl_gpu_download(y, dy, (size_t)rows * n * 2);
        tl_gpu_download(y0, dy0, (size_t)rows * n * 2);
        int bad = 0, alone = 0;
        for (int r = 0; r < rows; r++) {
            double ss = 0, ref = 0, mag = 0;
            for (int c = 0; c < n; c++) ss += (double)x[(size_t)r * n + c] * x[(size_t)r * n + c];
            double inv = 1.0 / sqrt(ss / n + 1e-6);
            for (int c = 0; c < n; c++) {
                double gw = tl_bf16_to_f32(gq[c]) + (lo ? tl_bf16_to_f32(gq[n + c]) : 0.0);
                double term = x[(size_t)r * n + c] * inv * w[c] * gw;
                ref += term, mag += fabs(term);
            }
            bad += fabs(got[(size_t)r * ldg] - ref) > 1e-5 * mag + 1e-7;
            CHECK_EQ_INT(tl_gpu_rmsnorm_bf16x2_dot(dy0, NULL, dx + (size_t)r * n, dw, 1, n, 1e-6f,
                                                   &G, dg1, 1, NULL),
                         0);
            float one;
            tl_gpu_download(&one, dg1, sizeof one);
            alone += memcmp(&one, &got[(size_t)r * ldg], sizeof one) != 0;
        }
        int same = memcmp(y, y0, (size_t)rows * n * 2) == 0;
        printf("# rmsnorm_bf16x2_dot %d x %d%s: %d dots off the double reference, %d rows alone "
               "differ (want 0), planes as rmsnorm_bf16x2: %s\n",
               rows, n, lo ? " (low plane)" : "", bad, alone, same ? "yes" : "no");
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(alone, 0);
        CHECK(same);
        CHECK_EQ_INT(tl_gpu_rmsnorm_bf16x2_dot(dy, dl, dx, dw, rows, n, 1e-6f, NULL, dgo, 1, NULL),
                     TL_ERR_INVALID);
        free(got), free(y), free(y0);
    }
    tl_gpu_free(dg), tl_gpu_free(dy), tl_gpu_free(dl), tl_gpu_free(dy0), tl_gpu_free(dgo);
    tl_gpu_free(dg1);
    free(gf), free(gq);
}

/* The bf16 RMSNorms of the prefill path (k_norm.cu) against the host in double: rmsnorm_bf16x2 at
 * the model's width (the vectorised path) and at 200 columns (the strided one), its low plane
 * included; the gated norm of the GDN output with z read through the strided projection. Each
 * bf16 output within one rounding (2^-8 relative) of the reference, hi + lo within 2^-16;
 * misaligned z offsets are refused. */
static void norms_bf16_rms_case(int rows, int n) {
    float *x = rand_vec((size_t)rows * n, 3.0f, &rs), *w = rand_vec(n, 1.0f, &rs);
    float *dx = dev_from(x, sizeof(float) * rows * n), *dw = dev_from(w, sizeof(float) * n);
    uint16_t *dy = tl_gpu_malloc((size_t)rows * n * 2), *dl = tl_gpu_malloc((size_t)rows * n * 2);
    CHECK_EQ_INT(tl_gpu_rmsnorm_bf16x2(dy, dl, dx, dw, rows, n, 1e-6f, NULL), 0);
    uint16_t *y = xmalloc((size_t)rows * n * 2), *l = xmalloc((size_t)rows * n * 2);
    tl_gpu_download(y, dy, (size_t)rows * n * 2);
    tl_gpu_download(l, dl, (size_t)rows * n * 2);
    int bad_hi = 0, bad_lo = 0;
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int c = 0; c < n; c++) ss += (double)x[(size_t)r * n + c] * x[(size_t)r * n + c];
        double inv = 1.0 / sqrt(ss / n + 1e-6);
        for (int c = 0; c < n; c++) {
            size_t i = (size_t)r * n + c;
            double ref = x[i] * inv * w[c], hi = tl_bf16_to_f32(y[i]);
            bad_hi += fabs(hi - ref) > fabs(ref) * 0x1p-8 + 1e-6;
            bad_lo += fabs(hi + tl_bf16_to_f32(l[i]) - ref) > fabs(ref) * 0x1p-16 + 1e-6;
        }
    }
    printf("# rmsnorm_bf16x2 %d x %d: %d outside one bf16 rounding, %d hi+lo outside 2^-16\n", rows,
           n, bad_hi, bad_lo);
    CHECK_EQ_INT(bad_hi, 0);
    CHECK_EQ_INT(bad_lo, 0);
    norms_bf16_dot_case(dx, dw, x, w, rows, n);
    tl_gpu_free(dx), tl_gpu_free(dw), tl_gpu_free(dy), tl_gpu_free(dl);
    free(x), free(w), free(y), free(l);
}
static void norms_bf16_gated_case(int n, int nv, int ld, int z_off) {
    size_t no = (size_t)n * nv * 128;
    float *o = rand_vec(no, 2.0f, &rs), *proj = rand_vec((size_t)n * ld, 3.0f, &rs);
    float *w = rand_vec(128, 1.0f, &rs);
    float *d_o = dev_from(o, no * 4), *dp = dev_from(proj, (size_t)n * ld * 4),
          *dw = dev_from(w, 128 * 4);
    uint16_t *dy = tl_gpu_malloc(no * 2), *y = xmalloc(no * 2);
    CHECK_EQ_INT(tl_gpu_gated_rmsnorm_bf16(dy, d_o, dp, ld, z_off, dw, nv, n, 1e-6f, NULL), 0);
    tl_gpu_download(y, dy, no * 2);
    int bad = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nv; h++) {
            const float *ov = o + ((size_t)t * nv + h) * 128;
            double ss = 0;
            for (int c = 0; c < 128; c++) ss += (double)ov[c] * ov[c];
            double inv = 1.0 / sqrt(ss / 128 + 1e-6);
            for (int c = 0; c < 128; c++) {
                double z = proj[(size_t)t * ld + z_off + h * 128 + c];
                double ref = ov[c] * inv * w[c] * (z / (1.0 + exp(-z)));
                double got = tl_bf16_to_f32(y[((size_t)t * nv + h) * 128 + c]);
                bad += fabs(got - ref) > fabs(ref) * 0x1p-8 + 1e-6;
            }
        }
    printf("# gated_rmsnorm_bf16 %d tokens x %d heads: %d outside one bf16 rounding\n", n, nv, bad);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(tl_gpu_gated_rmsnorm_bf16(dy, d_o, dp, ld, z_off + 2, dw, nv, n, 1e-6f, NULL),
                 TL_ERR_INVALID);
    tl_gpu_free(d_o), tl_gpu_free(dp), tl_gpu_free(dw), tl_gpu_free(dy);
    free(o), free(proj), free(w), free(y);
}
/* The q4v dot (k_q4m.cuh, TL_Q4V) of the decode GEMV, moe_up and moe_down: the
 * model's decode shapes against the CPU oracle (gemv_case, moe_case: NMSE 1e-9), two tokens ==
 * each alone, the GDN in-projection's fused conv1d == gemv then conv1d. Appended to the suite so
 * the tests above keep their random draws. */
static void test_q4v(void) {
    int old = tl_gpu_q4v_set(2);                  /* the GEMV, moe_up and moe_down */
    gemv_case(12416, TL_N_EMBD, 4, 1, 1, 0);      /* GDN in-projection: KPW 16, KS 4 */
    gemv_case(2048, 4096, 4, 1, 0, 1);            /* out-projection + residual: KS 8 */
    gemv_case(9216, TL_N_EMBD, 4, 2, 1, 0);       /* attention in-projection, 2 tokens */
    gemv_case(248320 / 8, TL_N_EMBD, 4, 1, 0, 0); /* LM-head-like row count */
    gemv_case(1024, 768, 4, 2, 1, 1);             /* KPW 8, KS 3 */
    gemv_case(3200, 256, 4, 1, 1, 0);             /* the small e2e model */
    moe_case(4, TL_N_EMBD, TL_N_EXPERT_USED, 1);
    moe_case(4, TL_N_EMBD, TL_N_EXPERT_USED, 2);
    moe_case(4, 256, 4, 1);
    conv_fused_case(1);
    conv_fused_case(2);
    tl_gpu_q4v_set(old);
    batch_exact_case(12416, TL_N_EMBD, 2);
    batch_exact_case(2048, 4096, 2);
}

static void test_norms_bf16(void) {
    norms_bf16_rms_case(5, TL_N_EMBD);
    norms_bf16_rms_case(3, 200);
    norms_bf16_gated_case(7, 32, 12416, 8192);
}

int main(void) {
    char err[256];
    if (tl_gpu_init(0, err, sizeof err)) {
        printf("FAIL gpu_init: %s\n", err);
        return 1;
    }
    T_RUN(test_gemv_bf16);
    T_RUN(test_router_gemm);
    T_RUN(test_gemv_q4);
    T_RUN(test_gemv_q4_batch_exact);
    T_RUN(test_gemv_conv1d_fused);
    T_RUN(test_embed);
    T_RUN(test_rmsnorm);
    T_RUN(test_mtp_cat);
    T_RUN(test_copy_rows);
    T_RUN(test_cast_bf16);
    T_RUN(test_conv1d);
    T_RUN(test_gdn);
    T_RUN(test_qk_rope);
    T_RUN(test_attn);
    T_RUN(test_moe_route);
    T_RUN(test_moe_route_poisoned);
    T_RUN(test_moe_route_plan);
    T_RUN(test_draft_pick);
    T_RUN(test_moe);
    T_RUN(test_sample_greedy_logprobs);
    T_RUN(test_sample_distribution);
    T_RUN(test_sample_poisoned);
    T_RUN(test_sample_greedy_full);
    T_RUN(test_sample_full_vocab_law);
    T_RUN(test_sample_determinism_penalties);
    T_RUN(test_sample_restrict_greedy);
    T_RUN(test_sample_restrict_none);
    T_RUN(test_sample_restrict_law);
    T_RUN(test_sample_sparse_mask);
    T_RUN(test_kv_page_copy);
    T_RUN(test_sample_law);
    T_RUN(test_slice_kernels); /* appended: the tests above keep their random draws */
    T_RUN(test_sample_count_bits);
    T_RUN(test_norms_bf16);
    T_RUN(test_q4v);
    return t_summary();
}
