/* GPU tests of the prefill kernels (gpu.h) against the CPU oracle (src/cpu/cpu.h) on
 * random inputs at production shapes. Inputs are drawn as bf16 and the oracle gets the same
 * bf16-rounded values as f32, so the comparison measures only the kernels' arithmetic.
 *
 * Metrics and tolerances (docs/developing.md §3; NMSE = sum (a-b)^2 / sum b^2):
 *   GEMM, f32 out:   NMSE <= 1e-9. Products of bf16 are exact in fp32; only the fp32 summation
 *                    order differs from the double-accumulating oracle (~1e-7 relative per dot).
 *   GEMM, bf16 out:  NMSE <= 4e-6. Rounding the output to bf16 alone gives about
 *                    (2^-9)^2 / 3 = 1.3e-6.
 *   GEMM, 4-bit:     NMSE <= 1e-5 against the oracle's exact dequantisation (scale*q + bias in
 *                    f32). The kernel rounds each dequantised weight to bf16 (relative 2^-9).
 *   MoE grouped:     NMSE <= 2e-5: h and the per-slot outputs are bf16 (two more bf16 roundings).
 *   attention:       NMSE <= 1e-4 (docs/developing.md §3 for bf16 KV); P is cast to bf16 for the P
 * V product and the output is bf16, so ~1e-5 is expected.
 *   GDN chunked:     NMSE against cpu_gdn_step run token by token, output and final state, per
 *                    kernel version: 1e-9 for the fp32 FMA and 3xTF32 ones, 2e-6 for tf32 (the
 *                    measurements are at gdn_kerns below). */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t_check.h"
#include "tulip.h"
#include "common/util.h"
#include "cpu/cpu.h"
#include "cuda/gpu.h"
#include "model/shape.h"
#include "cu_check.h"

static unsigned long long rng = 0x9e3779b97f4a7c15ull;

static void *dmalloc(size_t n) {
    void *p = NULL;
    CU(cudaMalloc(&p, n));
    return p;
}
static void *dup_to_dev(const void *h, size_t n) {
    void *p = dmalloc(n);
    CU(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice));
    return p;
}
static void to_host(void *h, const void *d, size_t n) {
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

/* n random bf16 values uniform in [-a, a): bits into hb (if non-NULL), values into f. */
static void rand_bf16(uint16_t *hb, float *f, size_t n, float a) {
    for (size_t i = 0; i < n; i++) {
        uint16_t b = tl_f32_to_bf16(t_randf(&rng) * a);
        if (hb) hb[i] = b;
        if (f) f[i] = tl_bf16_to_f32(b);
    }
}
static void bf16_to_f32(float *f, const uint16_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) f[i] = tl_bf16_to_f32(b[i]);
}

/* NMSE over n values, also printed (so logs carry the measured numbers next to the bound). */
static double report(const char *what, const float *got, const float *ref, size_t n) {
    double e = t_nmse(got, ref, n);
    int finite = 1;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(got[i])) finite = 0;
    printf("  %-44s nmse %.3e  max|d| %.3e%s\n", what, e, t_max_abs_diff(got, ref, n),
           finite ? "" : "  NON-FINITE");
    CHECK(finite);
    return finite ? e : 1.0;
}

/* ====== GEMM ====== */

/* A random MLX 4-bit matrix [rows, cols] on the host, with scales ~ 0.01 and biases ~ -8 scale. */
typedef struct mlx_host {
    uint32_t *w;
    uint16_t *s, *b;
    int rows, cols;
} mlx_host;

static void mlx_rand(mlx_host *m, int rows, int cols) {
    m->rows = rows, m->cols = cols;
    size_t nw = (size_t)rows * cols / 8, ng = (size_t)rows * cols / 64;
    m->w = xmalloc(nw * 4);
    m->s = xmalloc(ng * 2);
    m->b = xmalloc(ng * 2);
    for (size_t i = 0; i < nw; i++) m->w[i] = (uint32_t)(t_rng_next(&rng) >> 17);
    for (size_t i = 0; i < ng; i++) {
        float sc = 0.004f + 0.004f * (t_randf(&rng) + 1.0f);
        m->s[i] = tl_f32_to_bf16(sc);
        m->b[i] = tl_f32_to_bf16(-7.5f * sc + 0.002f * t_randf(&rng));
    }
}
static void mlx_free(mlx_host *m) { free(m->w), free(m->s), free(m->b); }
static tl_mat mlx_view(const mlx_host *m, int r0, int nrows) {
    tl_mat w = {0};
    w.w = m->w + (size_t)r0 * m->cols / 8;
    w.scales = m->s + (size_t)r0 * m->cols / 64;
    w.biases = m->b + (size_t)r0 * m->cols / 64;
    w.wtype = TL_DT_U32, w.stype = TL_DT_BF16, w.bits = 4, w.group = 64;
    w.rows = nrows, w.cols = m->cols;
    return w;
}
static tl_mat bf16_view(const uint16_t *w, int cols, int r0, int nrows) {
    tl_mat m = {0};
    m.w = w + (size_t)r0 * cols;
    m.wtype = TL_DT_BF16;
    m.rows = nrows, m.cols = cols;
    return m;
}

/* Uploads an MLX matrix (or n_mat stacked) and repacks it into a device q4 tl_gpu_gemm_w. */
static tl_gpu_gemm_w q4_upload(const mlx_host *m, int n_mat, int rows) {
    size_t nw = (size_t)m->rows * m->cols / 8, ng = (size_t)m->rows * m->cols / 64;
    tl_gpu_mlx_q4 src = {dup_to_dev(m->w, nw * 4), dup_to_dev(m->s, ng * 2),
                         dup_to_dev(m->b, ng * 2)};
    tl_gpu_gemm_w w = {0};
    w.bits = 4, w.rows = rows, w.cols = m->cols;
    w.w = dmalloc(tl_gpu_q4_w_bytes(rows, m->cols) * n_mat);
    w.sb = dmalloc(tl_gpu_q4_sb_bytes(rows, m->cols) * n_mat);
    CHECK_EQ_INT(tl_gpu_q4_repack((void *)w.w, (void *)w.sb, src, n_mat, rows, m->cols, NULL), 0);
    CU(cudaDeviceSynchronize());
    cudaFree((void *)src.w), cudaFree((void *)src.scales), cudaFree((void *)src.biases);
    return w;
}

/* The GEMM tile shapes (k_gemm.cu): "" = the entry's own choice, then each forced one
 * (0-2 and 5: mma.sync 128x128, 64x128, 128x256, 16x128; 3-4 wgmma 128x256, 64x256; 6-7 the
 * 4-bit MoE's wgr kernel with 2 or 4 warpgroups). */
#define N_TILES_ALL 9
static const char *const tiles[N_TILES_ALL] = {"", "0", "1", "2", "5", "3", "4", "6", "7"};
static int N_TILES = N_TILES_ALL; /* TL_TEST_TILES=mma: only the mma.sync shapes (first 5) */
static void set_tile(const char *t) {
    if (*t)
        setenv("TL_GEMM_TILE", t, 1);
    else
        unsetenv("TL_GEMM_TILE");
}

/* Runs y = x W^T on the GPU (f32 or bf16 out) with every tile shape and compares rows
 * [r0, r0+nr) of every token with cpu_matmul on the oracle's view of W. */
static void gemm_case(const char *name, const tl_gpu_gemm_w *gw, const tl_mat *ref_view, int r0,
                      int n, int out_f32, double tol) {
    int rows = gw->rows, cols = gw->cols, nr = ref_view->rows;
    uint16_t *xb = xmalloc((size_t)n * cols * 2);
    float *xf = xmalloc((size_t)n * cols * 4);
    rand_bf16(xb, xf, (size_t)n * cols, 1.0f);
    void *dx = dup_to_dev(xb, (size_t)n * cols * 2);
    size_t ysz = (size_t)n * rows * (out_f32 ? 4 : 2);
    void *dy = dmalloc(ysz);
    void *hy = xmalloc(ysz);
    float *got = xmalloc((size_t)n * nr * 4), *ref = xmalloc((size_t)n * nr * 4);
    cpu_matmul(ref, ref_view, xf, n);
    for (int ti = 0; ti < N_TILES; ti++) {
        set_tile(tiles[ti]);
        CU(cudaMemset(dy, 0xff, ysz)); /* NaN poison: every element must be written */
        CHECK_EQ_INT(tl_gpu_gemm(dy, dx, gw, n, NULL, out_f32 ? TL_GEMM_OUT_F32 : 0, NULL), 0);
        to_host(hy, dy, ysz);
        for (int t = 0; t < n; t++)
            for (int r = 0; r < nr; r++) {
                size_t i = (size_t)t * rows + r0 + r;
                got[(size_t)t * nr + r] =
                    out_f32 ? ((float *)hy)[i] : tl_bf16_to_f32(((uint16_t *)hy)[i]);
            }
        /* unchecked rows must still have been written (poison gone) */
        int all_written = 1;
        for (size_t i = 0; i < (size_t)n * rows; i++) {
            float v = out_f32 ? ((float *)hy)[i] : tl_bf16_to_f32(((uint16_t *)hy)[i]);
            if (!isfinite(v)) all_written = 0;
        }
        CHECK(all_written);
        char buf[128];
        snprintf(buf, sizeof buf, "%s n=%d %dx%d %s tile=%s", name, n, rows, cols,
                 out_f32 ? "f32" : "bf16", *tiles[ti] ? tiles[ti] : "auto");
        CHECK(report(buf, got, ref, (size_t)n * nr) <= tol);
    }
    set_tile("");
    free(xb), free(xf), free(hy), free(got), free(ref);
    cudaFree(dx), cudaFree(dy);
}

static void test_gemm_bf16_matches_oracle(void) {
    static const int shapes[][3] = {
        {8192, 2048, 300},  /* GDN qkv / attention q, ragged n */
        {2048, 4096, 200},  /* GDN out / attention o */
        {512, 2048, 77},    /* attention k/v, expert gate/up rows */
        {2048, 512, 129},   /* expert down */
        {12416, 2048, 200}, /* fused GDN in-projection padded to 128 rows: rows % 256 == 128 */
    };
    for (int s = 0; s < 5; s++) {
        int rows = shapes[s][0], cols = shapes[s][1], n = shapes[s][2];
        uint16_t *wb = xmalloc((size_t)rows * cols * 2);
        rand_bf16(wb, NULL, (size_t)rows * cols, 0.05f);
        tl_gpu_gemm_w gw = {dup_to_dev(wb, (size_t)rows * cols * 2), NULL, 16, rows, cols};
        tl_mat v = bf16_view(wb, cols, 0, rows);
        gemm_case("bf16", &gw, &v, 0, n, 1, 1e-9);
        gemm_case("bf16", &gw, &v, 0, n, 0, 4e-6);
        cudaFree((void *)gw.w);
        free(wb);
    }
}

static void test_gemm_lm_head_rows(void) {
    int rows = TL_N_VOCAB, cols = TL_N_EMBD, n = 40;
    uint16_t *wb = xmalloc((size_t)rows * cols * 2);
    rand_bf16(wb, NULL, (size_t)rows * cols, 0.05f);
    tl_gpu_gemm_w gw = {dup_to_dev(wb, (size_t)rows * cols * 2), NULL, 16, rows, cols};
    tl_mat v = bf16_view(wb, cols, rows - 1024, 1024); /* the last 1024 rows (grid edge) */
    gemm_case("lm_head tail", &gw, &v, rows - 1024, n, 1, 1e-9);
    cudaFree((void *)gw.w);
    free(wb);
}

static void test_gemm_q4_matches_oracle(void) {
    static const int shapes[][3] = {
        {8192, 2048, 300}, {2048, 4096, 130}, {2048, 512, 64}, {12416, 2048, 150}};
    for (int s = 0; s < 4; s++) {
        int rows = shapes[s][0], cols = shapes[s][1], n = shapes[s][2];
        mlx_host m;
        mlx_rand(&m, rows, cols);
        tl_gpu_gemm_w gw = q4_upload(&m, 1, rows);
        tl_mat v = mlx_view(&m, 0, rows);
        gemm_case("q4", &gw, &v, 0, n, 1, 1e-5);
        gemm_case("q4", &gw, &v, 0, n, 0, 1e-5);
        cudaFree((void *)gw.w), cudaFree((void *)gw.sb);
        mlx_free(&m);
    }
}

/* Residual add (in place, f32 and bf16) and the SwiGLU epilogue (bf16 and q4 weights). */
static void test_gemm_epilogues(void) {
    const int F = 512, cols = 2048, n = 150;
    uint16_t *xb = xmalloc((size_t)n * cols * 2);
    float *xf = xmalloc((size_t)n * cols * 4);
    rand_bf16(xb, xf, (size_t)n * cols, 1.0f);
    void *dx = dup_to_dev(xb, (size_t)n * cols * 2);

    /* residual: y = x W^T + y, f32 and bf16 */
    {
        uint16_t *wb = xmalloc((size_t)F * cols * 2);
        rand_bf16(wb, NULL, (size_t)F * cols, 0.05f);
        tl_gpu_gemm_w gw = {dup_to_dev(wb, (size_t)F * cols * 2), NULL, 16, F, cols};
        tl_mat v = bf16_view(wb, cols, 0, F);
        float *ref = xmalloc((size_t)n * F * 4), *res = xmalloc((size_t)n * F * 4);
        float *got = xmalloc((size_t)n * F * 4);
        uint16_t *resb = xmalloc((size_t)n * F * 2);
        rand_bf16(resb, res, (size_t)n * F, 2.0f);
        cpu_matmul(ref, &v, xf, n);
        for (size_t i = 0; i < (size_t)n * F; i++) ref[i] += res[i];
        void *dy = dup_to_dev(res, (size_t)n * F * 4);
        CHECK_EQ_INT(tl_gpu_gemm(dy, dx, &gw, n, dy, TL_GEMM_OUT_F32 | TL_GEMM_ADD_RES, NULL), 0);
        to_host(got, dy, (size_t)n * F * 4);
        CHECK(report("residual f32 in place", got, ref, (size_t)n * F) <= 1e-9);
        void *dyb = dup_to_dev(resb, (size_t)n * F * 2);
        CHECK_EQ_INT(tl_gpu_gemm(dyb, dx, &gw, n, dyb, TL_GEMM_ADD_RES, NULL), 0);
        to_host(resb, dyb, (size_t)n * F * 2);
        bf16_to_f32(got, resb, (size_t)n * F);
        CHECK(report("residual bf16 in place", got, ref, (size_t)n * F) <= 4e-6);
        cudaFree(dy), cudaFree(dyb), cudaFree((void *)gw.w);
        free(wb), free(ref), free(res), free(got), free(resb);
    }

    /* SwiGLU: reference silu(x G^T) * (x U^T) from two oracle matmuls */
    for (int q4 = 0; q4 < 2; q4++) {
        float *g = xmalloc((size_t)n * F * 4), *u = xmalloc((size_t)n * F * 4);
        float *got = xmalloc((size_t)n * F * 4);
        tl_gpu_gemm_w gw = {0};
        mlx_host mg, mu;
        uint16_t *gb = NULL, *ub = NULL;
        if (q4) {
            mlx_rand(&mg, F, cols);
            mlx_rand(&mu, F, cols);
            tl_mat vg = mlx_view(&mg, 0, F), vu = mlx_view(&mu, 0, F);
            cpu_matmul(g, &vg, xf, n);
            cpu_matmul(u, &vu, xf, n);
            size_t nw = (size_t)F * cols / 8, ng = (size_t)F * cols / 64;
            tl_gpu_mlx_q4 sg = {dup_to_dev(mg.w, nw * 4), dup_to_dev(mg.s, ng * 2),
                                dup_to_dev(mg.b, ng * 2)};
            tl_gpu_mlx_q4 su = {dup_to_dev(mu.w, nw * 4), dup_to_dev(mu.s, ng * 2),
                                dup_to_dev(mu.b, ng * 2)};
            gw.bits = 4, gw.rows = 2 * F, gw.cols = cols;
            gw.w = dmalloc(tl_gpu_q4_w_bytes(2 * F, cols));
            gw.sb = dmalloc(tl_gpu_q4_sb_bytes(2 * F, cols));
            CHECK_EQ_INT(
                tl_gpu_q4_repack_swiglu((void *)gw.w, (void *)gw.sb, sg, su, 1, F, cols, NULL), 0);
        } else {
            gb = xmalloc((size_t)F * cols * 2), ub = xmalloc((size_t)F * cols * 2);
            rand_bf16(gb, NULL, (size_t)F * cols, 0.05f);
            rand_bf16(ub, NULL, (size_t)F * cols, 0.05f);
            tl_mat vg = bf16_view(gb, cols, 0, F), vu = bf16_view(ub, cols, 0, F);
            cpu_matmul(g, &vg, xf, n);
            cpu_matmul(u, &vu, xf, n);
            void *dg = dup_to_dev(gb, (size_t)F * cols * 2),
                 *du = dup_to_dev(ub, (size_t)F * cols * 2);
            gw.bits = 16, gw.rows = 2 * F, gw.cols = cols;
            gw.w = dmalloc((size_t)2 * F * cols * 2);
            CHECK_EQ_INT(tl_gpu_bf16_pack_swiglu((uint16_t *)gw.w, dg, du, 1, (long long)F * cols,
                                                 F, cols, NULL),
                         0);
        }
        for (size_t i = 0; i < (size_t)n * F; i++) g[i] = cpu_silu(g[i]) * u[i];
        void *dy = dmalloc((size_t)n * F * 4);
        CU(cudaMemset(dy, 0xff, (size_t)n * F * 4));
        CHECK_EQ_INT(tl_gpu_gemm(dy, dx, &gw, n, NULL, TL_GEMM_OUT_F32 | TL_GEMM_SWIGLU, NULL), 0);
        to_host(got, dy, (size_t)n * F * 4);
        CHECK(report(q4 ? "swiglu q4 f32" : "swiglu bf16 f32", got, g, (size_t)n * F) <=
              (q4 ? 1e-5 : 1e-9));
        cudaFree(dy), cudaFree((void *)gw.w);
        if (q4) cudaFree((void *)gw.sb), mlx_free(&mg), mlx_free(&mu);
        free(gb), free(ub), free(g), free(u), free(got);
    }
    CHECK_EQ_INT(tl_gpu_gemm(NULL, dx, NULL, n, NULL, 0, NULL), TL_ERR_INVALID);
    cudaFree(dx);
    free(xb), free(xf);
}

/* Dense 4-bit products of decode batches (k_gemm.cu): with a workspace on the stream, the
 * products of <= TL_GEMM_SPLITK_MAX_N tokens run the wgr kernel (TL_DENSE_WGR_DEC=0: the 16- and
 * 64-token mma.sync tiles) with K split on small-row matrices. Checked: the matrices of the model
 * that split do (workspace > 0), each against the oracle (f32 out, in-place residual, and
 * SwiGLU), and every token's output bit-identical at n = 200, 1, 37 and 64 (the split depends on
 * the shape only; batched == alone). A matrix of more than one wave of row blocks does not split
 * (no workspace): the same checks without split-K. */
static void splitk_case(int rows, int cols, int flags) {
    const int ns[4] = {200, 1, 37, 64}, nmax = 200;
    int swiglu = (flags & TL_GEMM_SWIGLU) != 0, oc = swiglu ? rows / 2 : rows;
    mlx_host m;
    mlx_rand(&m, rows, cols);
    tl_gpu_gemm_w gw = q4_upload(&m, 1, rows);
    size_t wsb = tl_gpu_gemm_ws_bytes(&gw, nmax);
    CHECK(wsb > 0 || rows / 128 >= 132);
    tl_gpu_stream st = {0};
    st.ws = wsb ? dmalloc(wsb) : NULL, st.ws_bytes = wsb;
    uint16_t *xb = xmalloc((size_t)nmax * cols * 2);
    float *xf = xmalloc((size_t)nmax * cols * 4), *ref = xmalloc((size_t)nmax * rows * 4);
    float *res = xmalloc((size_t)nmax * oc * 4), *got = xmalloc((size_t)nmax * oc * 4);
    float *first = xmalloc((size_t)nmax * oc * 4);
    rand_bf16(xb, xf, (size_t)nmax * cols, 1.0f);
    uint16_t *rb = xmalloc((size_t)nmax * oc * 2);
    rand_bf16(rb, res, (size_t)nmax * oc, 2.0f);
    tl_mat v = mlx_view(&m, 0, rows);
    cpu_matmul(ref, &v, xf, nmax);
    if (swiglu) /* rows interleaved by 8: gate block, then its up block */
        for (int t = 0; t < nmax; t++)
            for (int o = 0; o < oc; o++) {
                int c = (o / 8) * 16 + o % 8;
                ref[(size_t)t * oc + o] =
                    cpu_silu(ref[(size_t)t * rows + c]) * ref[(size_t)t * rows + c + 8];
            }
    if (flags & TL_GEMM_ADD_RES)
        for (size_t i = 0; i < (size_t)nmax * oc; i++) ref[i] += res[i];
    void *dx = dup_to_dev(xb, (size_t)nmax * cols * 2), *dy = dmalloc((size_t)nmax * oc * 4);
    for (int k = 0; k < 4; k++) {
        int n = ns[k];
        if (flags & TL_GEMM_ADD_RES)
            CU(cudaMemcpy(dy, res, (size_t)n * oc * 4, cudaMemcpyHostToDevice));
        else
            CU(cudaMemset(dy, 0xff, (size_t)n * oc * 4));
        CHECK_EQ_INT(tl_gpu_gemm(dy, dx, &gw, n, dy, flags | TL_GEMM_OUT_F32, &st), 0);
        CU(cudaDeviceSynchronize());
        to_host(got, dy, (size_t)n * oc * 4);
        char buf[96];
        snprintf(buf, sizeof buf, "split-K q4 %dx%d flags %d n=%d", rows, cols, flags, n);
        CHECK(report(buf, got, ref, (size_t)n * oc) <= 1e-5);
        if (k == 0)
            memcpy(first, got, (size_t)nmax * oc * 4);
        else /* every token: the same bits at any n */
            CHECK(memcmp(first, got, (size_t)n * oc * 4) == 0);
    }
    cudaFree(dx), cudaFree(dy), cudaFree(st.ws), cudaFree((void *)gw.w), cudaFree((void *)gw.sb);
    mlx_free(&m);
    free(xb), free(xf), free(ref), free(res), free(got), free(first), free(rb);
}

static void test_gemm_splitk(void) {
    splitk_case(2048, 4096, 0);               /* GDN out / attention o */
    splitk_case(2048, 4096, TL_GEMM_ADD_RES); /* ... adding into the residual in place */
    splitk_case(1024, 2048, TL_GEMM_SWIGLU);  /* shared expert gate/up */
    splitk_case(2048, 512, 0);                /* shared expert down */
    splitk_case(12416, 2048, 0);              /* fused GDN in-projection */
    splitk_case(17024, 2048, 0);              /* no split: 133 row blocks (as the LM head) */
    /* the LM head never splits (enough blocks; its tile is the wgmma one) */
    tl_gpu_gemm_w lm = {0};
    lm.bits = 4, lm.rows = TL_N_VOCAB, lm.cols = TL_N_EMBD;
    CHECK(tl_gpu_gemm_ws_bytes(&lm, 64) == 0);
}

/* ====== MoE grouped GEMM ====== */

/* Router ids: 8 distinct experts per token, skewed so some experts get > 128 tokens (several M
 * tiles) and many get none. */
static void moe_ids(int32_t *ids, float *wts, int n_tok) {
    for (int t = 0; t < n_tok; t++) {
        float sum = 0;
        for (int s = 0; s < 8; s++) {
            int e, dup;
            do {
                unsigned r = (unsigned)(t_rng_next(&rng) >> 20);
                e = (r & 1) == 0 ? (int)(r >> 2) % 4 : (int)(r >> 2) % TL_N_EXPERT;
                dup = 0;
                for (int j = 0; j < s; j++) dup |= ids[t * 8 + j] == e;
            } while (dup);
            ids[t * 8 + s] = e;
            wts[t * 8 + s] = 0.1f + (t_randf(&rng) + 1.0f);
            sum += wts[t * 8 + s];
        }
        for (int s = 0; s < 8; s++) wts[t * 8 + s] /= sum;
    }
}

static void moe_case(int q4, int n_tok) {
    /* E routed experts and the shared one (expert E, stored after them as in the model) */
    const int E = TL_N_EXPERT + 1, F = TL_N_FF_EXPERT, D = TL_N_EMBD;
    uint16_t *xb = xmalloc((size_t)n_tok * D * 2), *shb = xmalloc((size_t)n_tok * D * 2);
    float *xf = xmalloc((size_t)n_tok * D * 4), *shf = xmalloc((size_t)n_tok * D * 4);
    float *res = xmalloc((size_t)n_tok * D * 4), *shl = xmalloc((size_t)n_tok * 4);
    rand_bf16(xb, xf, (size_t)n_tok * D, 1.0f);
    rand_bf16(shb, shf, (size_t)n_tok * D, 0.5f);
    for (size_t i = 0; i < (size_t)n_tok * D; i++) res[i] = t_randf(&rng);
    for (int t = 0; t < n_tok; t++) shl[t] = 2.0f * t_randf(&rng);
    int32_t *ids = xmalloc((size_t)n_tok * 8 * 4);
    float *wts = xmalloc((size_t)n_tok * 8 * 4);
    moe_ids(ids, wts, n_tok);

    /* weights: gate, up [E][F, D] and down [E][D, F] */
    tl_mat *vg = xmalloc(sizeof(tl_mat) * E), *vu = xmalloc(sizeof(tl_mat) * E);
    tl_mat *vd = xmalloc(sizeof(tl_mat) * E);
    tl_gpu_gemm_w wgu = {0}, wd = {0};
    mlx_host mg, mu, md;
    uint16_t *gb = NULL, *ub = NULL, *db = NULL;
    if (q4) {
        mlx_rand(&mg, E * F, D);
        mlx_rand(&mu, E * F, D);
        mlx_rand(&md, E * D, F);
        for (int e = 0; e < E; e++) {
            vg[e] = mlx_view(&mg, e * F, F), vu[e] = mlx_view(&mu, e * F, F);
            vd[e] = mlx_view(&md, e * D, D);
        }
        size_t nw = (size_t)E * F * D / 8, ng = (size_t)E * F * D / 64;
        tl_gpu_mlx_q4 sg = {dup_to_dev(mg.w, nw * 4), dup_to_dev(mg.s, ng * 2),
                            dup_to_dev(mg.b, ng * 2)};
        tl_gpu_mlx_q4 su = {dup_to_dev(mu.w, nw * 4), dup_to_dev(mu.s, ng * 2),
                            dup_to_dev(mu.b, ng * 2)};
        wgu.bits = 4, wgu.rows = 2 * F, wgu.cols = D;
        wgu.w = dmalloc(tl_gpu_q4_w_bytes(2 * F, D) * E);
        wgu.sb = dmalloc(tl_gpu_q4_sb_bytes(2 * F, D) * E);
        CHECK_EQ_INT(tl_gpu_q4_repack_swiglu((void *)wgu.w, (void *)wgu.sb, sg, su, E, F, D, NULL),
                     0);
        CU(cudaDeviceSynchronize());
        cudaFree((void *)sg.w), cudaFree((void *)sg.scales), cudaFree((void *)sg.biases);
        cudaFree((void *)su.w), cudaFree((void *)su.scales), cudaFree((void *)su.biases);
        wd = q4_upload(&md, E, D);
    } else {
        size_t ne = (size_t)E * F * D;
        gb = xmalloc(ne * 2), ub = xmalloc(ne * 2), db = xmalloc(ne * 2);
        rand_bf16(gb, NULL, ne, 0.05f);
        rand_bf16(ub, NULL, ne, 0.05f);
        rand_bf16(db, NULL, ne, 0.05f);
        for (int e = 0; e < E; e++) {
            vg[e] = bf16_view(gb + (size_t)e * F * D, D, 0, F);
            vu[e] = bf16_view(ub + (size_t)e * F * D, D, 0, F);
            vd[e] = bf16_view(db + (size_t)e * F * D, F, 0, D);
        }
        void *dg = dup_to_dev(gb, ne * 2), *du = dup_to_dev(ub, ne * 2);
        wgu.bits = 16, wgu.rows = 2 * F, wgu.cols = D;
        wgu.w = dmalloc(ne * 4);
        CHECK_EQ_INT(
            tl_gpu_bf16_pack_swiglu((uint16_t *)wgu.w, dg, du, E, (long long)F * D, F, D, NULL), 0);
        CU(cudaDeviceSynchronize());
        cudaFree(dg), cudaFree(du);
        wd.bits = 16, wd.rows = D, wd.cols = F;
        wd.w = dup_to_dev(db, ne * 2);
    }

    /* GPU */
    int32_t *dids = dup_to_dev(ids, (size_t)n_tok * 8 * 4);
    float *dwts = dup_to_dev(wts, (size_t)n_tok * 8 * 4);
    int32_t *dplan = dmalloc(tl_gpu_moe_pf_plan_ints(n_tok) * 4);
    void *dx = dup_to_dev(xb, (size_t)n_tok * D * 2), *dsh = dup_to_dev(shb, (size_t)n_tok * D * 2);
    float *dshl = dup_to_dev(shl, (size_t)n_tok * 4);
    uint16_t *dh = dmalloc((size_t)n_tok * 9 * F * 2), *dys = dmalloc((size_t)n_tok * 9 * D * 2);
    size_t nys = (size_t)n_tok * 8 * D; /* routed rows of dys */
    uint16_t *ys0 = xmalloc(nys * 2), *ys1 = xmalloc(nys * 2);
    float *dout = dup_to_dev(res, (size_t)n_tok * D * 4);
    float *got = xmalloc((size_t)n_tok * D * 4);
    /* oracle */
    /* oracle: ref with the given shared output shf, ref_sh with the shared expert's own */
    float *ref = xmalloc((size_t)n_tok * D * 4), *y = xmalloc((size_t)D * 4);
    float *ref_sh = xmalloc((size_t)n_tok * D * 4), *tmp = xmalloc((size_t)2 * F * 4);
    for (int t = 0; t < n_tok; t++) {
        float *r = ref + (size_t)t * D, *rs = ref_sh + (size_t)t * D;
        float sg = cpu_sigmoid(shl[t]);
        const float *xt = xf + (size_t)t * D;
        cpu_ffn_swiglu(y, &vg[E - 1], &vu[E - 1], &vd[E - 1], xt, tmp);
        for (int c = 0; c < D; c++) r[c] = res[(size_t)t * D + c] + sg * shf[(size_t)t * D + c];
        for (int c = 0; c < D; c++) rs[c] = res[(size_t)t * D + c] + sg * y[c];
        for (int s = 0; s < 8; s++) {
            int e = ids[t * 8 + s];
            cpu_ffn_swiglu(y, &vg[e], &vu[e], &vd[e], xt, tmp);
            for (int c = 0; c < D; c++)
                r[c] += wts[t * 8 + s] * y[c], rs[c] += wts[t * 8 + s] * y[c];
        }
    }
    /* sh 1: the shared expert inside the grouped GEMMs (rows 8 n_tok + t of dh and dys); the
     * routed rows must keep their bits */
    for (int ti = 0; ti < N_TILES; ti++)
        for (int sh = 0; sh < 2; sh++) {
            set_tile(tiles[ti]);
            CU(cudaMemcpy(dout, res, (size_t)n_tok * D * 4, cudaMemcpyHostToDevice));
            CU(cudaMemset(dys, 0xff, (size_t)n_tok * 9 * D * 2));
            CU(cudaMemset(dplan, 0xff, tl_gpu_moe_pf_plan_ints(n_tok) * 4));
            CHECK_EQ_INT(tl_gpu_moe_pf_plan(dplan, dids, n_tok, NULL), 0);
            CHECK_EQ_INT(tl_gpu_moe_pf_gate_up(dh, dx, &wgu, dplan, n_tok, sh, NULL), 0);
            CHECK_EQ_INT(tl_gpu_moe_pf_down(dys, dh, &wd, dplan, n_tok, sh, NULL), 0);
            CHECK_EQ_INT(tl_gpu_moe_pf_combine(dout, dout, dys, dwts, sh ? dys + nys : dsh, dshl,
                                               n_tok, TL_GEMM_OUT_F32, NULL),
                         0);
            to_host(got, dout, (size_t)n_tok * D * 4);
            to_host(sh ? ys1 : ys0, dys, nys * 2);
            char buf[128];
            snprintf(buf, sizeof buf, "moe %s n_tok=%d (plan..combine%s) tile=%s",
                     q4 ? "q4" : "bf16", n_tok, sh ? ", shared expert grouped" : "",
                     *tiles[ti] ? tiles[ti] : "auto");
            CHECK(report(buf, got, sh ? ref_sh : ref, (size_t)n_tok * D) <= 2e-5);
            if (sh) CHECK(memcmp(ys0, ys1, nys * 2) == 0);
        }
    set_tile("");

    cudaFree(dids), cudaFree(dwts), cudaFree(dplan), cudaFree(dx), cudaFree(dsh), cudaFree(dshl);
    cudaFree(dh), cudaFree(dys), cudaFree(dout), cudaFree((void *)wgu.w), cudaFree((void *)wd.w);
    if (q4)
        cudaFree((void *)wgu.sb), cudaFree((void *)wd.sb), mlx_free(&mg), mlx_free(&mu),
            mlx_free(&md);
    free(gb), free(ub), free(db), free(vg), free(vu), free(vd);
    free(xb), free(shb), free(xf), free(shf), free(res), free(shl), free(ids), free(wts);
    free(got), free(ref), free(ref_sh), free(y), free(tmp), free(ys0), free(ys1);
}

/* The MoE plan (k_moe.cu) against a host counting sort: offsets, the three tile prefixes, and a
 * perm that lists every assignment once under its own expert. 300 tokens: the one-block kernel;
 * 3000 and 8192 (a prefill chunk: 32 chunks of 2048 assignments): the count / scan / place
 * kernels. Expert 0 is hot (every token), 1..3 warm, the rest spread; bytes past the plan's
 * scratch stay untouched. */
static void plan_check(int n_tok) {
    const int A = n_tok * 8;
    int32_t *ids = xmalloc((size_t)A * 4);
    for (int t = 0; t < n_tok; t++)
        for (int s = 0; s < 8; s++) {
            int e = s < 4 && t % (1 + 3 * s) == 0 ? s : 4 + (int)(t_rng_next(&rng) % 252);
            for (int u = 0; u < s; u++) /* no expert twice in a token */
                if (ids[t * 8 + u] == e) e = 4 + (e + 1 - 4) % 252, u = -1;
            ids[t * 8 + s] = e;
        }
    size_t pn = tl_gpu_moe_pf_plan_ints(n_tok);
    int32_t *dids = dup_to_dev(ids, (size_t)A * 4), *dplan = dmalloc((pn + 64) * 4);
    int32_t *plan = xmalloc((pn + 64) * 4);
    CU(cudaMemset(dplan, 0xff, (pn + 64) * 4));
    CHECK_EQ_INT(tl_gpu_moe_pf_plan(dplan, dids, n_tok, NULL), 0);
    CU(cudaDeviceSynchronize());
    to_host(plan, dplan, (pn + 64) * 4);
    int cnt[256] = {0}, bad = 0, o = 0, t1 = 0, t2 = 0, t3 = 0;
    for (int a = 0; a < A; a++) cnt[ids[a]]++;
    for (int e = 0; e <= 256; e++) {
        bad += plan[PLAN_OFF + e] != o || plan[PLAN_TS128 + e] != t1 || plan[PLAN_TS64 + e] != t2 ||
               plan[PLAN_TS16 + e] != t3;
        if (e == 256) break;
        o += cnt[e], t1 += (cnt[e] + 127) / 128, t2 += (cnt[e] + 63) / 64, t3 += (cnt[e] + 15) / 16;
    }
    char *seen = xcalloc((size_t)A, 1);
    for (int e = 0; e < 256; e++)
        for (int m = plan[PLAN_OFF + e]; m < plan[PLAN_OFF + e + 1]; m++) {
            int a = plan[PLAN_PERM + m];
            bad += a < 0 || a >= A || seen[a] || ids[a] != e;
            if (a >= 0 && a < A) seen[a] = 1;
        }
    for (int i = 0; i < 64; i++) bad += plan[pn + i] != -1;
    printf("# moe plan of %d tokens (%d assignments): %d mismatches with the host sort\n", n_tok, A,
           bad);
    CHECK_EQ_INT(bad, 0);
    cudaFree(dids), cudaFree(dplan);
    free(ids), free(plan), free(seen);
}

static void test_moe_plan(void) {
    plan_check(300);
    plan_check(3000);
    plan_check(8192);
}

/* The combine with the next layer's norm folded in (tl_gpu_moe_pf_combine_norm): its f32 rows
 * and its bf16 normed rows bit for bit those of the combine then tl_gpu_rmsnorm_bf16, and the
 * normed rows within one bf16 rounding of a double RMSNorm of the combined rows. */
static void test_moe_combine_norm(void) {
    const int T = 37, D = TL_N_EMBD;
    uint16_t *ys = xmalloc((size_t)T * 9 * D * 2), *y1 = xmalloc((size_t)T * D * 2);
    uint16_t *y2 = xmalloc((size_t)T * D * 2);
    float *res = xmalloc((size_t)T * D * 4), *wts = xmalloc((size_t)T * 8 * 4);
    float *shl = xmalloc((size_t)T * 4), *nw = xmalloc((size_t)D * 4);
    float *o1 = xmalloc((size_t)T * D * 4), *o2 = xmalloc((size_t)T * D * 4);
    rand_bf16(ys, NULL, (size_t)T * 9 * D, 2.0f);
    for (size_t i = 0; i < (size_t)T * D; i++) res[i] = 3.0f * t_randf(&rng);
    for (int i = 0; i < T * 8; i++) wts[i] = 0.1f + 0.5f * (t_randf(&rng) + 1.0f);
    for (int t = 0; t < T; t++) shl[t] = 2.0f * t_randf(&rng);
    for (int c = 0; c < D; c++) nw[c] = 1.0f + 0.5f * t_randf(&rng);
    void *dys = dup_to_dev(ys, (size_t)T * 9 * D * 2), *dwts = dup_to_dev(wts, (size_t)T * 32);
    void *dshl = dup_to_dev(shl, (size_t)T * 4), *dnw = dup_to_dev(nw, (size_t)D * 4);
    void *dout = dmalloc((size_t)T * D * 4), *dy = dmalloc((size_t)T * D * 2);
    const uint16_t *dsh = (const uint16_t *)dys + (size_t)T * 8 * D;
    CU(cudaMemcpy(dout, res, (size_t)T * D * 4, cudaMemcpyHostToDevice));
    CHECK_EQ_INT(tl_gpu_moe_pf_combine(dout, dout, dys, dwts, dsh, dshl, T, TL_GEMM_OUT_F32, NULL),
                 0);
    CHECK_EQ_INT(tl_gpu_rmsnorm_bf16(dy, dout, dnw, T, D, 1e-6f, NULL), 0);
    to_host(o1, dout, (size_t)T * D * 4);
    to_host(y1, dy, (size_t)T * D * 2);
    CU(cudaMemcpy(dout, res, (size_t)T * D * 4, cudaMemcpyHostToDevice));
    CU(cudaMemset(dy, 0xff, (size_t)T * D * 2));
    CHECK_EQ_INT(tl_gpu_moe_pf_combine_norm(dout, dout, dys, dwts, dsh, dshl, T, TL_GEMM_OUT_F32,
                                            dnw, dy, 1e-6f, NULL),
                 0);
    to_host(o2, dout, (size_t)T * D * 4);
    to_host(y2, dy, (size_t)T * D * 2);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int c = 0; c < D; c++) ss += (double)o1[t * D + c] * o1[t * D + c];
        double inv = 1.0 / sqrt(ss / D + 1e-6);
        for (int c = 0; c < D; c++) {
            double ref = o1[t * D + c] * inv * nw[c];
            bad += fabs(tl_bf16_to_f32(y1[t * D + c]) - ref) > fabs(ref) * 0x1p-8 + 1e-6;
        }
    }
    int same_out = memcmp(o1, o2, (size_t)T * D * 4) == 0,
        same_y = memcmp(y1, y2, (size_t)T * D * 2) == 0;
    printf("# combine + norm folded: rows %s, normed rows %s the separate kernels'; %d normed "
           "values outside one bf16 rounding of a double norm\n",
           same_out ? "==" : "!=", same_y ? "==" : "!=", bad);
    CHECK(same_out && same_y);
    CHECK_EQ_INT(bad, 0);
    /* the fold needs f32 rows and an output */
    CHECK(tl_gpu_moe_pf_combine_norm(dout, dout, dys, dwts, dsh, dshl, T, 0, dnw, dy, 1e-6f,
                                     NULL) == TL_ERR_INVALID);
    CHECK(tl_gpu_moe_pf_combine_norm(dout, dout, dys, dwts, dsh, dshl, T, TL_GEMM_OUT_F32, dnw,
                                     NULL, 1e-6f, NULL) == TL_ERR_INVALID);
    cudaFree(dys), cudaFree(dwts), cudaFree(dshl), cudaFree(dnw), cudaFree(dout), cudaFree(dy);
    free(ys), free(y1), free(y2), free(res), free(wts), free(shl), free(nw), free(o1), free(o2);
}

static void test_moe_grouped_matches_oracle(void) {
    moe_case(1, 160);
    moe_case(1, 300); /* 128-token tiles of 128 + 128 + 44: the wgr kernel's classes 128 and 64 */
    moe_case(0, 100);
}

/* ====== Attention ====== */

/* n queries at pos0 over a cache of pos0+n; paged: pages of 64 tokens in a shuffled pool. */
static void attn_case(int n, int pos0, int paged, int with_gate, int in_f32) {
    const int H = TL_N_HEAD, HKV = TL_N_HEAD_KV, D = TL_HEAD_DIM, kv_len = pos0 + n;
    const int qstride = H * 2 * D; /* q_proj output layout: per head [query | gate] */
    uint16_t *qb = xmalloc((size_t)n * qstride * 2);
    rand_bf16(qb, NULL, (size_t)n * qstride, 1.0f);
    float *qf = xmalloc((size_t)n * H * D * 4), *gf = xmalloc((size_t)n * H * D * 4);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                qf[((size_t)t * H + h) * D + d] =
                    tl_bf16_to_f32(qb[(size_t)t * qstride + h * 2 * D + d]);
                gf[((size_t)t * H + h) * D + d] =
                    tl_bf16_to_f32(qb[(size_t)t * qstride + h * 2 * D + D + d]);
            }
    size_t kvn = (size_t)kv_len * HKV * D;
    uint16_t *kb = xmalloc(kvn * 2), *vb = xmalloc(kvn * 2);
    float *kf = xmalloc(kvn * 4), *vf = xmalloc(kvn * 4);
    rand_bf16(kb, kf, kvn, 1.0f);
    rand_bf16(vb, vf, kvn, 1.0f);

    tl_gpu_kv_view kv = {0};
    void *dk, *dv, *dpages = NULL;
    int n_pages = (kv_len + 63) / 64;
    if (paged) {
        /* pool of n_pages + 3 pages; logical page p lives at physical perm[p] */
        int pool = n_pages + 3, tok_stride = HKV * D;
        int32_t *perm = xmalloc(sizeof(int32_t) * pool);
        for (int i = 0; i < pool; i++) perm[i] = i;
        for (int i = pool - 1; i > 0; i--) {
            int j = (int)(t_rng_next(&rng) % (unsigned)(i + 1)), tmp = perm[i];
            perm[i] = perm[j], perm[j] = tmp;
        }
        size_t page_elems = (size_t)64 * tok_stride;
        uint16_t *pk = xmalloc(pool * page_elems * 2), *pv = xmalloc(pool * page_elems * 2);
        for (size_t i = 0; i < pool * page_elems; i++) pk[i] = pv[i] = 0x7fc0; /* NaN elsewhere */
        for (int p = 0; p < kv_len; p++) {
            size_t dst = (size_t)perm[p / 64] * page_elems + (size_t)(p % 64) * tok_stride;
            memcpy(pk + dst, kb + (size_t)p * tok_stride, tok_stride * 2);
            memcpy(pv + dst, vb + (size_t)p * tok_stride, tok_stride * 2);
        }
        dk = dup_to_dev(pk, pool * page_elems * 2);
        dv = dup_to_dev(pv, pool * page_elems * 2);
        dpages = dup_to_dev(perm, sizeof(int32_t) * pool);
        kv.pages = dpages, kv.page_tokens = 64, kv.page_stride = (long long)page_elems;
        kv.tok_stride = tok_stride;
        free(pk), free(pv), free(perm);
    } else {
        dk = dup_to_dev(kb, kvn * 2);
        dv = dup_to_dev(vb, kvn * 2);
        kv.tok_stride = HKV * D;
    }
    kv.k = dk, kv.v = dv;
    uint16_t *dq = dup_to_dev(qb, (size_t)n * qstride * 2);
    float *dqf = NULL;
    if (in_f32) { /* the same bf16 values as f32 (the kernel rounds q to bf16 anyway) */
        float *qall = xmalloc((size_t)n * qstride * 4);
        bf16_to_f32(qall, qb, (size_t)n * qstride);
        dqf = dup_to_dev(qall, (size_t)n * qstride * 4);
        free(qall);
    }
    uint16_t *dout = dmalloc((size_t)n * H * D * 2);
    tl_gpu_heads qh = {in_f32 ? (const void *)dqf : (const void *)dq, qstride, 2 * D};
    tl_gpu_heads gh = {NULL, qstride, 2 * D};
    if (with_gate) gh.p = in_f32 ? (const void *)(dqf + D) : (const void *)(dq + D);
    uint16_t *ob = xmalloc((size_t)n * H * D * 2);
    float *got = xmalloc((size_t)n * H * D * 4), *ref = xmalloc((size_t)n * H * D * 4);
    cpu_attention(ref, qf, kf, vf, n, pos0, H, HKV, D, 1.0f / 16.0f);
    if (with_gate)
        for (size_t i = 0; i < (size_t)n * H * D; i++) ref[i] *= cpu_sigmoid(gf[i]);
    static const char *kname[4] = {"", " wgmma", " wgmma-ws-psmem", " wgmma-ws"};
    /* TL_ATTN_WG: mma.sync, wgmma, warp-specialised with P in shared memory, the default
     * (warp-specialised, P in registers) */
    for (int wg = 0; wg < 4; wg++) {
        char v[2] = {(char)('0' + wg), 0};
        setenv("TL_ATTN_WG", v, 1);
        CU(cudaMemset(dout, 0xff, (size_t)n * H * D * 2));
        CHECK_EQ_INT(
            tl_gpu_attn_prefill(dout, &qh, &gh, &kv, n, pos0, in_f32 ? TL_ATTN_IN_F32 : 0, NULL),
            0);
        to_host(ob, dout, (size_t)n * H * D * 2);
        bf16_to_f32(got, ob, (size_t)n * H * D);
        char buf[112];
        snprintf(buf, sizeof buf, "attn%s n=%d pos0=%d%s%s%s", kname[wg], n, pos0,
                 paged ? " paged" : "", with_gate ? " gated" : "", in_f32 ? " f32-in" : "");
        CHECK(report(buf, got, ref, (size_t)n * H * D) <= 1e-4);
    }
    unsetenv("TL_ATTN_WG");
    cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout);
    if (dqf) cudaFree(dqf);
    if (dpages) cudaFree(dpages);
    free(qb), free(qf), free(gf), free(kb), free(vb), free(kf), free(vf), free(ob), free(got),
        free(ref);
}

static void test_attn_prefill_matches_oracle(void) {
    attn_case(300, 0, 0, 1, 0);   /* whole prompt, ragged last tile */
    attn_case(130, 650, 0, 0, 0); /* chunked prefill: cache already holds 650 tokens */
    attn_case(200, 333, 1, 1, 0); /* paged cache, unaligned pos0 */
    attn_case(1024, 0, 1, 1, 0);
    attn_case(300, 100, 0, 1, 1); /* f32 q and gate */
}

/* ====== Gated DeltaNet ====== */

/* Kernel versions of tl_gpu_gdn_chunk (gpu.h TL_GDN_KERN_*) and their bounds against
 * cpu_gdn_step (NMSE, output and final state, f32 state). Measured before the GPU run on the host
 * emulation of these kernels (dev/emu/gdn_tc_emu.cpp: the kernel source compiled for the host,
 * mma.sync emulated from the PTX fragment layout) at T = 100..4096 on these inputs:
 *   fma    (fp32 FMA):                         output 1e-13..3e-13, state 2e-13..3e-13
 *   tf32   (operands rounded to tf32):         output 2.4e-7..3.4e-7, state 1.7e-7..2.6e-7
 *   3xtf32 (split operands, hi*hi+hi*lo+lo*hi): output 3e-13..6e-13, state 2e-13..4e-13
 *   (bf16 operands, not built: output 1.6e-5..2.2e-5, state 1.1e-5..1.6e-5 -- over the 1e-5 of
 *   docs/developing.md §3, and 4x the mma rate would buy little: the kernels are bound by the
 *   chunk-serial chain, not by mma throughput; so tf32 is the fast version.)
 * The tf32 error does not grow with the length (2048 and 4096 tokens within 1.5x of 100): the
 * state stays f32 and only the operand copies are rounded. Bounds: ~6x the measured tf32 spread;
 * the fp32-like versions 1e-9 (three orders above the measurement: the GPU's exp and summation
 * order differ from the host's at the 1e-13 level). */
static const struct {
    int flag;
    const char *name;
    double tol;
} gdn_kerns[] = {
    {TL_GDN_KERN_FMA, "fma", 1e-9},
    {TL_GDN_KERN_TF32, "tf32", 2e-6},
    {TL_GDN_KERN_3XTF32, "3xtf32", 1e-9},
};
#define N_GDN_KERNS 3

/* log-decay scale of value head h: 1, 0.1, 0.01, 0.001 (slow heads keep the initial state and
 * carry their error over the whole segment, as the slow heads of the real model do) */
static float gdn_decay_scale(int h) { return powf(10.0f, -(float)(h % 4)); }

/* The kernel TL_CUDA_GDN selects when flags name none (the switch's documented default: tf32). */
static int gdn_env_kern(void) {
    const char *e = getenv("TL_CUDA_GDN");
    if (e && !strcmp(e, "fma")) return 0;
    if (e && !strcmp(e, "3xtf32")) return 2;
    return 1;
}

typedef struct {
    int T, stride;
    uint16_t *cb;                     /* conv output rows q | k | v, bf16 */
    float *q, *k, *v, *g, *beta, *S0; /* oracle inputs (q, k normalised as the kernel does) */
    float *o_ref, *S_ref;             /* oracle from S0 */
    float *o_b, *S_b;                 /* oracle from bf16(S0) (== o_ref, S_ref when S0 = 0) */
    uint16_t *dc;
    float *dcf, *dg, *db, *dS, *dof;
    void *dws;
} gdn_data;

static void gdn_oracle(const gdn_data *d, float *o, float *S) {
    const int HK = TL_GDN_N_K_HEAD, HV = TL_GDN_N_V_HEAD, DK = TL_GDN_K_DIM, DV = TL_GDN_V_DIM;
    for (int t = 0; t < d->T; t++)
        cpu_gdn_step(o + (size_t)t * HV * DV, S, d->q + (size_t)t * HK * DK,
                     d->k + (size_t)t * HK * DK, d->v + (size_t)t * HV * DV, d->g + (size_t)t * HV,
                     d->beta + (size_t)t * HV, HK, HV, DK, DV);
}

/* Random inputs at production shapes (32 value heads, 16 key heads, 128 dims) and both oracles. */
static void gdn_data_make(gdn_data *d, int T, int init) {
    const int HK = TL_GDN_N_K_HEAD, HV = TL_GDN_N_V_HEAD, DK = TL_GDN_K_DIM, DV = TL_GDN_V_DIM;
    const int stride = 2 * HK * DK + HV * DV; /* conv output row: q | k | v */
    memset(d, 0, sizeof *d);
    d->T = T, d->stride = stride;
    d->cb = xmalloc((size_t)T * stride * 2);
    rand_bf16(d->cb, NULL, (size_t)T * stride, 1.0f);
    d->q = xmalloc((size_t)T * HK * DK * 4), d->k = xmalloc((size_t)T * HK * DK * 4);
    d->v = xmalloc((size_t)T * HV * DV * 4);
    for (int t = 0; t < T; t++) {
        const uint16_t *row = d->cb + (size_t)t * stride;
        for (int i = 0; i < HK * DK; i++) {
            d->q[(size_t)t * HK * DK + i] = tl_bf16_to_f32(row[i]);
            d->k[(size_t)t * HK * DK + i] = tl_bf16_to_f32(row[HK * DK + i]);
        }
        for (int i = 0; i < HV * DV; i++)
            d->v[(size_t)t * HV * DV + i] = tl_bf16_to_f32(row[2 * HK * DK + i]);
        for (int h = 0; h < HK; h++) {
            cpu_l2norm(d->q + ((size_t)t * HK + h) * DK, DK, 1e-6f);
            cpu_l2norm(d->k + ((size_t)t * HK + h) * DK, DK, 1e-6f);
            for (int e = 0; e < DK; e++) d->q[((size_t)t * HK + h) * DK + e] *= 1.0f / sqrtf(DK);
        }
    }
    d->g = xmalloc((size_t)T * HV * 4), d->beta = xmalloc((size_t)T * HV * 4);
    for (int i = 0; i < T * HV; i++) {
        /* g = -exp(A_log) softplus(a + dt_bias): small decays, some strong ones, slow heads */
        float a = 2.0f * t_randf(&rng);
        d->g[i] = -0.5f * cpu_softplus(a) * (i % 7 == 0 ? 6.0f : 1.0f) * gdn_decay_scale(i % HV);
        d->beta[i] = cpu_sigmoid(2.0f * t_randf(&rng));
    }
    size_t ns = (size_t)HV * DK * DV, no = (size_t)T * HV * DV;
    d->S0 = xmalloc(ns * 4);
    for (size_t i = 0; i < ns; i++) d->S0[i] = init ? 0.1f * t_randf(&rng) : 0.0f;
    d->o_ref = xmalloc(no * 4), d->S_ref = xmalloc(ns * 4);
    memcpy(d->S_ref, d->S0, ns * 4);
    gdn_oracle(d, d->o_ref, d->S_ref);
    d->o_b = d->o_ref, d->S_b = d->S_ref;
    if (init) {
        d->o_b = xmalloc(no * 4), d->S_b = xmalloc(ns * 4);
        for (size_t i = 0; i < ns; i++) d->S_b[i] = tl_bf16_to_f32(tl_f32_to_bf16(d->S0[i]));
        gdn_oracle(d, d->o_b, d->S_b);
    }
    float *cf = xmalloc((size_t)T * stride * 4);
    bf16_to_f32(cf, d->cb, (size_t)T * stride);
    d->dc = dup_to_dev(d->cb, (size_t)T * stride * 2);
    d->dcf = dup_to_dev(cf, (size_t)T * stride * 4);
    free(cf);
    d->dg = dup_to_dev(d->g, (size_t)T * HV * 4), d->db = dup_to_dev(d->beta, (size_t)T * HV * 4);
    d->dS = dmalloc(ns * 4), d->dof = dmalloc(no * 4);
    d->dws = dmalloc(tl_gpu_gdn_chunk_ws_bytes());
}

static void gdn_data_free(gdn_data *d) {
    if (d->o_b != d->o_ref) free(d->o_b), free(d->S_b);
    free(d->cb), free(d->q), free(d->k), free(d->v), free(d->g), free(d->beta), free(d->S0);
    free(d->o_ref), free(d->S_ref);
    cudaFree(d->dc), cudaFree(d->dcf), cudaFree(d->dg), cudaFree(d->db), cudaFree(d->dS);
    cudaFree(d->dof), cudaFree(d->dws);
}

/* One call from S0 (f32, or rounded to bf16 with TL_GDN_STATE_BF16): f32 input (dcf) with
 * TL_GDN_IN_F32, else bf16 (dc); output and final state back as f32. */
static void gdn_run(const gdn_data *d, int flags, float *o, float *S) {
    const int HK = TL_GDN_N_K_HEAD, HV = TL_GDN_N_V_HEAD, DK = TL_GDN_K_DIM, DV = TL_GDN_V_DIM;
    size_t ns = (size_t)HV * DK * DV, no = (size_t)d->T * HV * DV;
    int s16 = flags & TL_GDN_STATE_BF16, o32 = flags & TL_GDN_OUT_F32;
    uint16_t *tmp = xmalloc((ns > no ? ns : no) * 2);
    if (s16) {
        for (size_t i = 0; i < ns; i++) tmp[i] = tl_f32_to_bf16(d->S0[i]);
        CU(cudaMemcpy(d->dS, tmp, ns * 2, cudaMemcpyHostToDevice));
    } else {
        CU(cudaMemcpy(d->dS, d->S0, ns * 4, cudaMemcpyHostToDevice));
    }
    CU(cudaMemset(d->dof, 0xff, no * 4));
    const void *in = flags & TL_GDN_IN_F32 ? (const void *)d->dcf : (const void *)d->dc;
    size_t esz = flags & TL_GDN_IN_F32 ? 4 : 2;
    const char *base = in;
    CHECK_EQ_INT(tl_gpu_gdn_chunk(d->dof, d->dS, base, base + HK * DK * esz,
                                  base + 2 * HK * DK * esz, d->stride, d->dg, d->db, d->T,
                                  flags | TL_GDN_L2NORM, d->dws, NULL),
                 0);
    if (o32) {
        to_host(o, d->dof, no * 4);
    } else {
        to_host(tmp, d->dof, no * 2);
        bf16_to_f32(o, tmp, no);
    }
    if (s16) {
        to_host(tmp, d->dS, ns * 2);
        bf16_to_f32(S, tmp, ns);
    } else {
        to_host(S, d->dS, ns * 4);
    }
    free(tmp);
}

/* Every kernel version on one segment of T tokens from a zero (init 0) or random initial state:
 * the production call (f32 in, f32 out, f32 state), bf16 state, bf16 in and out; then the new
 * kernels against the old, and the default choice (TL_CUDA_GDN) against the version it names. */
static void gdn_case(int T, int init) {
    const int HV = TL_GDN_N_V_HEAD, DK = TL_GDN_K_DIM, DV = TL_GDN_V_DIM;
    size_t ns = (size_t)HV * DK * DV, no = (size_t)T * HV * DV;
    gdn_data d;
    gdn_data_make(&d, T, init);
    float *o[N_GDN_KERNS], *S[N_GDN_KERNS];
    float *o2 = xmalloc(no * 4), *S2 = xmalloc(ns * 4);
    char buf[128];
    const int prod = TL_GDN_IN_F32 | TL_GDN_OUT_F32;
    for (int kk = 0; kk < N_GDN_KERNS; kk++) {
        const char *nm = gdn_kerns[kk].name;
        double tol = gdn_kerns[kk].tol;
        int kf = gdn_kerns[kk].flag;
        o[kk] = xmalloc(no * 4), S[kk] = xmalloc(ns * 4);
        gdn_run(&d, prod | kf, o[kk], S[kk]);
        snprintf(buf, sizeof buf, "gdn %s T=%d init=%d output vs step", nm, T, init);
        CHECK(report(buf, o[kk], d.o_ref, no) <= tol);
        snprintf(buf, sizeof buf, "gdn %s T=%d init=%d state vs step", nm, T, init);
        CHECK(report(buf, S[kk], d.S_ref, ns) <= tol);

        /* bf16 state: the oracle runs from the same bf16 initial state in f32; the kernel rounds
         * the state to bf16 at the end of each 2048-token launch. Emulated: output 7e-8..9e-8
         * (fma, 3xtf32) and 4.2e-7..4.4e-7 (tf32) at 2117 and 4096 tokens, from the rounding
         * between the two launches; state 2.8e-6 (4096) to 4.7e-6 (2117: rounded twice within 69
         * tokens, the slow heads keep both), bf16 being relative 2^-9. Bound: 1e-5, as before. */
        gdn_run(&d, prod | TL_GDN_STATE_BF16 | kf, o2, S2);
        snprintf(buf, sizeof buf, "gdn %s T=%d init=%d bf16 state: output", nm, T, init);
        CHECK(report(buf, o2, d.o_b, no) <= 1e-5);
        snprintf(buf, sizeof buf, "gdn %s T=%d init=%d bf16 state: state", nm, T, init);
        CHECK(report(buf, S2, d.S_b, ns) <= 1e-5);

        /* bf16 in (the same values), bf16 out: the output rounding alone is NMSE ~2.5e-6
         * (round to nearest with 8 significant bits: ulp^2 / 12 relative, 2^-14 / 12 times the
         * mean 1/m^2 over the mantissa m); emulated 2.8e-6 (fma, 3xtf32), 3.1e-6 (tf32) at 2117
         * tokens. Bound: 6e-6 above the kernel's. */
        gdn_run(&d, kf, o2, S2);
        snprintf(buf, sizeof buf, "gdn %s T=%d init=%d bf16 in/out: output", nm, T, init);
        CHECK(report(buf, o2, d.o_ref, no) <= 6e-6 + tol);
        snprintf(buf, sizeof buf, "gdn %s T=%d init=%d bf16 in/out: state", nm, T, init);
        CHECK(report(buf, S2, d.S_ref, ns) <= tol);
    }
    /* new against old: each tensor-core version against the FMA one, the same bound as against
     * the oracle (the FMA kernels are ~1e-13 from it) */
    for (int kk = 1; kk < N_GDN_KERNS; kk++) {
        snprintf(buf, sizeof buf, "gdn %s vs fma T=%d init=%d output", gdn_kerns[kk].name, T, init);
        CHECK(report(buf, o[kk], o[0], no) <= gdn_kerns[kk].tol);
        snprintf(buf, sizeof buf, "gdn %s vs fma T=%d init=%d state", gdn_kerns[kk].name, T, init);
        CHECK(report(buf, S[kk], S[0], ns) <= gdn_kerns[kk].tol);
    }
    /* no TL_GDN_KERN_* bits: the version TL_CUDA_GDN names (default tf32), bit for bit */
    {
        int ek = gdn_env_kern();
        gdn_run(&d, prod, o2, S2);
        CHECK(!memcmp(o2, o[ek], no * 4) && !memcmp(S2, S[ek], ns * 4));
    }
    for (int kk = 0; kk < N_GDN_KERNS; kk++) free(o[kk]), free(S[kk]);
    free(o2), free(S2);
    gdn_data_free(&d);
}

/* g and beta from projection columns (fused in-proj layout: a, b at offsets of a wide row). */
static void test_gdn_gates_match_oracle(void) {
    const int T = 333, HV = TL_GDN_N_V_HEAD, ld = 100;
    float *proj = xmalloc((size_t)T * ld * 4), *dtb = xmalloc(HV * 4), *aneg = xmalloc(HV * 4);
    for (int i = 0; i < T * ld; i++) proj[i] = 12.0f * t_randf(&rng); /* crosses softplus' 20 */
    for (int h = 0; h < HV; h++) dtb[h] = 10.0f * t_randf(&rng), aneg[h] = -expf(t_randf(&rng));
    float *dp = dup_to_dev(proj, (size_t)T * ld * 4), *ddt = dup_to_dev(dtb, HV * 4);
    float *dan = dup_to_dev(aneg, HV * 4), *dg = dmalloc((size_t)T * HV * 4),
          *db = dmalloc((size_t)T * HV * 4);
    CHECK_EQ_INT(tl_gpu_gdn_gates(dg, db, dp + 3, dp + 3 + HV, ld, ddt, dan, T, NULL), 0);
    float *g = xmalloc((size_t)T * HV * 4), *b = xmalloc((size_t)T * HV * 4);
    float *gr = xmalloc((size_t)T * HV * 4), *br = xmalloc((size_t)T * HV * 4);
    to_host(g, dg, (size_t)T * HV * 4);
    to_host(b, db, (size_t)T * HV * 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HV; h++) {
            gr[t * HV + h] = aneg[h] * cpu_softplus(proj[(size_t)t * ld + 3 + h] + dtb[h]);
            br[t * HV + h] = cpu_sigmoid(proj[(size_t)t * ld + 3 + HV + h]);
        }
    /* elementwise fp32 (docs/developing.md §3): |d| <= 1e-6 + 1e-5 |ref| */
    int bad = 0;
    for (int i = 0; i < T * HV; i++) {
        if (!(fabsf(g[i] - gr[i]) <= 1e-6f + 1e-5f * fabsf(gr[i]))) bad++;
        if (!(fabsf(b[i] - br[i]) <= 1e-6f + 1e-5f * fabsf(br[i]))) bad++;
    }
    report("gdn gates g", g, gr, (size_t)T * HV);
    report("gdn gates beta", b, br, (size_t)T * HV);
    CHECK_EQ_INT(bad, 0);
    cudaFree(dp), cudaFree(ddt), cudaFree(dan), cudaFree(dg), cudaFree(db);
    free(proj), free(dtb), free(aneg), free(g), free(b), free(gr), free(br);
}

/* Segments of 64, 100, 2048, 4096 tokens (and 2117: two launches, the second ragged), from a
 * zero and from a random initial state. */
static void test_gdn_chunk_matches_recurrence(void) {
    static const int Ts[] = {64, 100, 2048, 4096};
    for (int i = 0; i < 4; i++)
        for (int init = 0; init < 2; init++) gdn_case(Ts[i], init);
    gdn_case(2048 + 64 + 5, 1); /* more than one workspace segment */
}

/* ====== The conv1d fused into the GDN in-projection (tl_gpu_gemm_conv1d) ======
 * Against the two calls it replaces (tl_gpu_gemm + tl_gpu_conv1d), bit for bit: the conv outputs,
 * the conv state after the segment and the projection's rows past C; token counts with a last
 * tile of 1, 2, 3 and more tokens, a state of random values (slot 1 of 2). The unfused conv1d is
 * itself checked against the CPU oracle (test_kernels.c: test_conv1d). */
static void gemm_conv_case(int n, int rows, int K, int C) {
    mlx_host m;
    mlx_rand(&m, rows, K);
    tl_gpu_gemm_w w = q4_upload(&m, 1, rows);
    uint16_t *xb = xmalloc((size_t)n * K * 2);
    rand_bf16(xb, NULL, (size_t)n * K, 1.0f);
    float *cw = xmalloc((size_t)C * 4 * 4), *st0 = xmalloc((size_t)2 * 3 * C * 4);
    for (size_t i = 0; i < (size_t)C * 4; i++) cw[i] = 0.5f * t_randf(&rng);
    for (size_t i = 0; i < (size_t)2 * 3 * C; i++) st0[i] = t_randf(&rng);
    void *dx = dup_to_dev(xb, (size_t)n * K * 2);
    float *dcw = dup_to_dev(cw, (size_t)C * 16), *dst = dup_to_dev(st0, (size_t)6 * C * 4);
    size_t ysz = (size_t)n * rows * 4, osz = (size_t)n * C * 4;
    float *dy = dmalloc(ysz), *dout = dmalloc(osz);
    float *dedge = dmalloc(tl_gpu_gemm_conv1d_edge_floats(n, C) * 4);
    int32_t meta[4] = {0, n, 1, 0}; /* seg_tok0, seg_n, seg_slot, seg_pos0 */
    int32_t *dm = dup_to_dev(meta, sizeof meta);
    tl_gpu_seqs sq = {0};
    sq.seg_tok0 = dm, sq.seg_n = dm + 1, sq.seg_slot = dm + 2, sq.seg_pos0 = dm + 3;
    sq.n_tok = n, sq.n_seg = 1;
    float *y[2], *out[2], *stt[2];
    for (int fused = 0; fused < 2; fused++) {
        y[fused] = xmalloc(ysz), out[fused] = xmalloc(osz), stt[fused] = xmalloc((size_t)24 * C);
        CU(cudaMemcpy(dst, st0, (size_t)6 * C * 4, cudaMemcpyHostToDevice));
        CU(cudaMemset(dy, 0xff, ysz));
        CU(cudaMemset(dout, 0xff, osz)); /* NaN poison: every output must be written */
        if (fused) {
            CHECK_EQ_INT(tl_gpu_gemm_conv1d(dy, dx, &w, n, dout, dst + 3 * C, dcw, C, dedge, NULL),
                         0);
        } else {
            CHECK_EQ_INT(tl_gpu_gemm(dy, dx, &w, n, NULL, TL_GEMM_OUT_F32, NULL), 0);
            CHECK_EQ_INT(tl_gpu_conv1d(dout, dst, dy, rows, dcw, C, &sq, NULL, NULL), 0);
        }
        to_host(y[fused], dy, ysz);
        to_host(out[fused], dout, osz);
        to_host(stt[fused], dst, (size_t)24 * C);
    }
    size_t bad_out = 0, bad_y = 0, bad_st = 0;
    for (size_t i = 0; i < (size_t)n * C; i++)
        bad_out += memcmp(&out[0][i], &out[1][i], 4) != 0 || !isfinite(out[1][i]);
    for (int t = 0; t < n; t++)
        for (int r = C; r < rows; r++) {
            size_t i = (size_t)t * rows + r;
            bad_y += memcmp(&y[0][i], &y[1][i], 4) != 0 || !isfinite(y[1][i]);
        }
    bad_st = memcmp(stt[0], stt[1], (size_t)24 * C) != 0;
    printf("  conv1d fused n=%d %dx%d C=%d: outputs differing %zu, rows past C %zu, state %zu\n", n,
           rows, K, C, bad_out, bad_y, bad_st);
    CHECK(bad_out == 0 && bad_y == 0 && bad_st == 0);
    for (int f = 0; f < 2; f++) free(y[f]), free(out[f]), free(stt[f]);
    mlx_free(&m), free(xb), free(cw), free(st0);
    cudaFree(dx), cudaFree(dcw), cudaFree(dst), cudaFree(dy), cudaFree(dout), cudaFree(dedge);
    cudaFree(dm), cudaFree((void *)w.w), cudaFree((void *)w.sb);
}

static void test_gemm_conv1d(void) {
    int was = tl_gpu_gemm_set_conv(1);
    static const int ns[] = {257, 258, 259, 300, 385, 640};
    for (int i = 0; i < 6; i++) gemm_conv_case(ns[i], 512, 512, 256);
    gemm_conv_case(1000, 12416, 2048, 8192); /* the model's in-projection and conv */
    /* where the fused path does not apply: the caller's two calls */
    mlx_host m;
    mlx_rand(&m, 256, 256);
    tl_gpu_gemm_w w = q4_upload(&m, 1, 256);
    float *d = dmalloc(4096);
    uint16_t *dx = dmalloc(4096);
    CHECK_EQ_INT(tl_gpu_gemm_conv1d(d, dx, &w, 256, d, d, d, 128, d, NULL), TL_ERR_UNSUPPORTED);
    setenv("TL_GEMM_TILE", "1", 1);
    CHECK_EQ_INT(tl_gpu_gemm_conv1d(d, dx, &w, 300, d, d, d, 128, d, NULL), TL_ERR_UNSUPPORTED);
    unsetenv("TL_GEMM_TILE");
    CHECK_EQ_INT(tl_gpu_gemm_conv1d(d, dx, &w, 300, d, d, d, 64, d, NULL), TL_ERR_UNSUPPORTED);
    tl_gpu_gemm_set_conv(0);
    CHECK_EQ_INT(tl_gpu_gemm_conv1d(d, dx, &w, 300, d, d, d, 128, d, NULL), TL_ERR_UNSUPPORTED);
    tl_gpu_gemm_set_conv(was);
    mlx_free(&m), cudaFree(d), cudaFree(dx), cudaFree((void *)w.w), cudaFree((void *)w.sb);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("FAIL no CUDA device\n");
        return 1;
    }
    const char *tt = getenv("TL_TEST_TILES");
    if (tt && !strcmp(tt, "mma")) N_TILES = 5;
    T_RUN(test_gemm_bf16_matches_oracle);
    T_RUN(test_gemm_lm_head_rows);
    T_RUN(test_gemm_q4_matches_oracle);
    T_RUN(test_gemm_epilogues);
    T_RUN(test_gemm_splitk);
    T_RUN(test_gemm_conv1d);
    T_RUN(test_moe_plan);
    T_RUN(test_moe_combine_norm);
    T_RUN(test_moe_grouped_matches_oracle);
    T_RUN(test_attn_prefill_matches_oracle);
    T_RUN(test_gdn_gates_match_oracle);
    T_RUN(test_gdn_chunk_matches_recurrence);
    return t_summary();
}
