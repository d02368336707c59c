/* Host emulation of the decode GEMV, MoE and sampler kernels (src/cuda/k_gemv.cu, k_moe.cu,
 * k_sample.cu, compiled against the device shim dev/emu/cuda/cuda_common.cuh by
 * dev/emu/q4_emu.sh): every way of the 4-bit GEMV for <= 8 tokens (the persistent q4m kernel,
 * the slice kernel at 1 and 2 blocks an SM, the rows kernel) must give the same bits and match a
 * double host product of the dequantized weights; the fused conv1d epilogue likewise; the bf16
 * (router) GEMV must match a double product; the MoE of 1, 4 and 8 routed tokens through
 * moe_up_route (slice / expert-major kernels) and moe_down after it (early routing) must give the
 * bits of the plain path (route kernel, q4m moe_up, moe_down); the two-pass sampler and the laws
 * with the count bits must give what they give without them, and the laws and greedy tokens what
 * the host sampler (engine/sample.c) gives, with vocabularies of whole float4s or not; the chained
 * drafts' pick (tl_gpu_draft_pick) what the engine's host draws give (tests/gpu/draft_pick_case.h)
 * and the fused route + plan of decode batches what the two kernels give. Random weights and inputs,
 * production per-expert sizes, 16 experts, a 32K vocabulary. For checking indexing without a
 * GPU; the emulation runs a kernel's threads one after another, so it shows no race and no
 * timing. */
#include "cuda/k_gemv.cu"
#include "cuda/k_moe.cu"
#include "cuda/k_sample.cu"

extern "C" {
#include "t_check.h"
#include "common/util.h"
#include "engine/sample.h"
}
#include "emu_q4.h"
#include "gpu/draft_pick_case.h"
#include "gpu/route_plan_case.h"

alignas(16) uint4 xs[(220 * 1024) / 16];   /* the kernels' dynamic shared memory */
alignas(16) uint4 xs_all[(48 * 1024) / 16]; /* moe_down's */
static int all_rows(int y) { return y >= 0; }
int (*emu_head_on)(int) = all_rows;

/* k_moe.cu's prefill half calls into k_gemm.cu, which is not emulated */
int cb_moe_gemm(uint16_t *, const uint16_t *, const tl_gpu_gemm_w *, const int32_t *, int, int, int, int,
                const tl_gpu_stream *) {
    return TL_ERR_UNSUPPORTED;
}

static unsigned long long rs = 0x51ce51ce51ceull;

/* ---- GEMV ---- */

static float *gemv_way(int slice, int rows_on, const q4mat &q, const float *x, const float *nw,
                       int T, int acc, const float *y0) {
    int R = q.m.rows;
    float *y = (float *)xmalloc((size_t)T * R * 4);
    memcpy(y, y0, (size_t)T * R * 4);
    int os = tl_gpu_gemv_set_slice(slice), orr = tl_gpu_gemv_set_rows(rows_on);
    CHECK_EQ_INT(tl_gpu_gemv(y, R, &q.m, x, q.m.cols, nw, 1e-6f, T, acc, NULL), 0);
    tl_gpu_gemv_set_slice(os), tl_gpu_gemv_set_rows(orr);
    return y;
}

/* The double product of the dequantized weights with x (normed when norm), + y0 when acc. */
static float *gemv_double(const q4mat &q, const float *x, const float *nw, int T, int norm, int acc,
                          const float *y0) {
    int R = q.m.rows, K = q.m.cols;
    float *hr = (float *)xmalloc((size_t)T * R * 4);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int c = 0; c < K; c++) ss += (double)x[t * K + c] * x[t * K + c];
        double inv = norm ? 1.0 / sqrt(ss / K + 1e-6) : 1.0;
        for (int r = 0; r < R; r++) {
            double s = 0;
            for (int c = 0; c < K; c++)
                s += q4_at(q, r, c) * x[(size_t)t * K + c] * (norm ? nw[c] : 1.0);
            hr[(size_t)t * R + r] = (float)(s * inv + (acc ? y0[(size_t)t * R + r] : 0.0));
        }
    }
    return hr;
}

/* How many of the T tokens, run alone on the default way, differ in any bit from their rows of
 * the tile's result `all`. */
static int differ_alone(const q4mat &q, const float *x, const float *nw, int T, int acc,
                        const float *y0, const float *all) {
    int R = q.m.rows, K = q.m.cols, n = 0;
    for (int t = 0; t < T; t++) {
        float *one = gemv_way(0, 0, q, x + (size_t)t * K, nw, 1, acc, y0 + (size_t)t * R);
        n += memcmp(one, all + (size_t)t * R, (size_t)R * 4) != 0;
        free(one);
    }
    return n;
}

static void gemv_case(int R, int K, int T, int norm, int acc) {
    int old_v = tl_gpu_q4v_set(0); /* every way on q4m_dot (q4v_case: the q4v dot) */
    q4mat q = q4_random(&rs, R, K);
    float *x = rand_vec(&rs, (size_t)T * K, 1.0f), *nw = rand_vec(&rs, K, 1.0f),
          *y0 = rand_vec(&rs, (size_t)T * R, 1.0f);
    float *ref = gemv_way(0, 0, q, x, norm ? nw : NULL, T, acc, y0);
    /* the q4m kernel against the double product (the emulator's own check) */
    float *hr = gemv_double(q, x, nw, T, norm, acc, y0);
    double nm = t_nmse(ref, hr, (size_t)T * R);
    static const int ways[4][2] = {{1, 0}, {2, 0}, {0, 1}, {1, 1}};
    int same = 1;
    for (int w = 0; w < 4; w++) {
        float *got = gemv_way(ways[w][0], ways[w][1], q, x, norm ? nw : NULL, T, acc, y0);
        int s = !memcmp(got, ref, (size_t)T * R * 4);
        if (!s) printf("# gemv %dx%d t%d: slice %d rows %d DIFFERS from q4m\n", R, K, T, ways[w][0],
                       ways[w][1]);
        same &= s;
        free(got);
    }
    /* each token alone gives its bits in the tile (the normed input's sum of squares included) */
    int alone = differ_alone(q, x, norm ? nw : NULL, T, acc, y0, ref);
    printf("# gemv %dx%d t%d n%d a%d: q4m vs double nmse %.2e; slice 1/2, rows, default: %s; "
           "%d tokens differ alone\n",
           R, K, T, norm, acc, nm, same ? "same bits as q4m" : "DIFFERENT", alone);
    CHECK(nm < 1e-8);
    CHECK(same);
    CHECK_EQ_INT(alone, 0);
    tl_gpu_q4v_set(old_v);
    free(x), free(nw), free(y0), free(ref), free(hr), q4_free(&q);
}

static void test_gemv_ways(void) {
    gemv_case(256, 2048, 1, 1, 0); /* KPW 16, KS 4 */
    gemv_case(128, 4096, 3, 0, 1); /* KS 8 */
    gemv_case(64, 8192, 2, 0, 1);  /* KPW 32 */
    gemv_case(96, 768, 5, 1, 1);   /* KPW 8, KS 3 */
    /* 3 chunks a row, rows staged across the block's passes: a normed token alone once gave
     * other bits than in its tile (1 seed in 12 here; the GPU suite on the H200) */
    for (int i = 0; i < 8; i++) gemv_case(64, 768, 8, 1, 1);
    gemv_case(8, 256, 8, 1, 0);    /* one row block, 8 tokens */
    gemv_case(8704, 4096, 1, 0, 0); /* 1088 units: too many for the slice kernel (rows kernel) */
}

/* The q4v dot (one or two tokens, TL_Q4V) against the double product and against q4m_dot (the
 * same accuracy, other bits), and two tokens together == each alone, bit for bit. */
static void q4v_case(int R, int K, int T, int norm, int acc) {
    q4mat q = q4_random(&rs, R, K);
    float *x = rand_vec(&rs, (size_t)T * K, 1.0f), *nw = rand_vec(&rs, K, 1.0f),
          *y0 = rand_vec(&rs, (size_t)T * R, 1.0f);
    int old = tl_gpu_q4v_set(0);
    float *m = gemv_way(0, 0, q, x, norm ? nw : NULL, T, acc, y0);
    tl_gpu_q4v_set(1);
    float *v = gemv_way(0, 0, q, x, norm ? nw : NULL, T, acc, y0);
    float *hr = gemv_double(q, x, nw, T, norm, acc, y0);
    int alone = differ_alone(q, x, norm ? nw : NULL, T, acc, y0, v);
    tl_gpu_q4v_set(old);
    double nv = t_nmse(v, hr, (size_t)T * R), nm = t_nmse(m, hr, (size_t)T * R);
    double d = t_nmse(v, m, (size_t)T * R);
    printf("# q4v %dx%d t%d n%d a%d: nmse vs double %.2e (q4m %.2e), vs q4m %.2e; %d tokens "
           "differ alone\n",
           R, K, T, norm, acc, nv, nm, d, alone);
    CHECK(nv < 1e-8);
    CHECK(memcmp(v, m, (size_t)T * R * 4) != 0 || R * T < 64); /* really the other dot */
    CHECK_EQ_INT(alone, 0);
    free(x), free(nw), free(y0), free(m), free(v), free(hr), q4_free(&q);
}

static void test_q4v(void) {
    q4v_case(256, 2048, 1, 1, 0); /* KPW 16, KS 4 */
    q4v_case(256, 2048, 2, 1, 0);
    q4v_case(128, 4096, 2, 0, 1); /* KS 8, residual */
    q4v_case(96, 768, 1, 1, 1);   /* KPW 8, KS 3 */
    q4v_case(96, 768, 2, 0, 0);
    q4v_case(8, 256, 2, 1, 0); /* one row block */
}

/* The bf16 GEMV (the router: two planes, its first weights loaded before the PDL wait) against a
 * double product: 257 rows (2 a block) and 2048 rows (8 a block), with and without the low plane. */
static void bf16_case(int R, int K, int T, int lo) {
    uint16_t *w = (uint16_t *)xmalloc((size_t)R * K * 2), *wl = (uint16_t *)xmalloc((size_t)R * K * 2);
    for (size_t i = 0; i < (size_t)R * K; i++) {
        float v = 0.05f * t_randf(&rs);
        w[i] = f2bf(v), wl[i] = f2bf(v - bf2f(w[i]));
    }
    tl_gpu_gemm_w m = {w, lo ? wl : NULL, 16, R, K};
    float *x = rand_vec(&rs, (size_t)T * K, 1.0f), *nw = rand_vec(&rs, K, 1.0f);
    float *y = (float *)xcalloc((size_t)T * R, 4), *ref = (float *)xmalloc((size_t)T * R * 4);
    CHECK_EQ_INT(tl_gpu_gemv(y, R, &m, x, K, nw, 1e-6f, T, 0, NULL), 0);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int c = 0; c < K; c++) ss += (double)x[t * K + c] * x[t * K + c];
        double inv = 1.0 / sqrt(ss / K + 1e-6);
        for (int r = 0; r < R; r++) {
            double s = 0;
            for (int c = 0; c < K; c++) {
                size_t i = (size_t)r * K + c;
                s += ((double)bf2f(w[i]) + (lo ? bf2f(wl[i]) : 0.0)) * x[t * K + c] * nw[c];
            }
            ref[(size_t)t * R + r] = (float)(s * inv);
        }
    }
    double nm = t_nmse(y, ref, (size_t)T * R);
    printf("# gemv bf16 %dx%d t%d lo%d: nmse vs double %.2e\n", R, K, T, lo, nm);
    CHECK(nm < 1e-10);
    free(w), free(wl), free(x), free(nw), free(y), free(ref);
}

static void test_gemv_bf16(void) {
    bf16_case(257, 2048, 1, 1);
    bf16_case(257, 2048, 5, 1);
    bf16_case(2048, 4096, 3, 0);
}

/* The fused conv1d epilogue (3 tokens in slots 1, 2, 0): conv outputs, states and rows >= C the
 * same bits on every way. */
static void test_gemv_conv(void) {
    const int R = 512, K = 2048, C = 256, T = 3;
    q4mat q = q4_random(&rs, R, K);
    float *x = rand_vec(&rs, (size_t)T * K, 1.0f), *nw = rand_vec(&rs, K, 1.0f);
    float *cw = rand_vec(&rs, (size_t)C * 4, 0.5f), *st0 = rand_vec(&rs, (size_t)3 * 3 * C, 1.0f);
    int32_t slot[3] = {1, 2, 0};
    float *y[4], *co[4], *st[4];
    static const int ways[4][2] = {{0, 0}, {1, 0}, {2, 0}, {0, 1}};
    for (int w = 0; w < 4; w++) {
        y[w] = (float *)xcalloc((size_t)T * R, 4), co[w] = (float *)xcalloc((size_t)T * C, 4);
        st[w] = (float *)xmalloc((size_t)9 * C * 4);
        memcpy(st[w], st0, (size_t)9 * C * 4);
        int os = tl_gpu_gemv_set_slice(ways[w][0]), orr = tl_gpu_gemv_set_rows(ways[w][1]);
        CHECK_EQ_INT(tl_gpu_gemv_conv1d(y[w], R, &q.m, x, K, nw, 1e-6f, T, co[w], st[w], cw, C,
                                        slot, NULL),
                     0);
        tl_gpu_gemv_set_slice(os), tl_gpu_gemv_set_rows(orr);
    }
    int same = 1;
    for (int w = 1; w < 4; w++) {
        for (int t = 0; t < T; t++)
            same &= !memcmp(y[w] + (size_t)t * R + C, y[0] + (size_t)t * R + C, (R - C) * 4);
        same &= !memcmp(co[w], co[0], (size_t)T * C * 4) && !memcmp(st[w], st[0], (size_t)9 * C * 4);
    }
    int moved = memcmp(st[0], st0, (size_t)9 * C * 4) != 0;
    printf("# gemv + conv1d: slice 1/2 and rows %s q4m; states moved: %d\n",
           same ? "same bits as" : "DIFFERENT from", moved);
    CHECK(same);
    CHECK(moved);
    for (int w = 0; w < 4; w++) free(y[w]), free(co[w]), free(st[w]);
    free(x), free(nw), free(cw), free(st0), q4_free(&q);
}

/* ---- MoE ---- */

static void moe_case(int D, int k, int T) {
    const int E = 16, F = 512;
    q4mat gu = q4_random(&rs, (E + 1) * 2 * F, D), dn = q4_random(&rs, (E + 1) * D, F);
    float *lg = rand_vec(&rs, (size_t)T * (E + 1), 3.0f), *h0 = rand_vec(&rs, (size_t)T * D, 1.0f);
    float *nw = rand_vec(&rs, D, 1.0f);
    float *act[2], *h[2], *w[2], *wsh[2];
    int32_t *ids[2];
    for (int m = 0; m < 2; m++) {
        act[m] = (float *)xcalloc((size_t)T * (k + 1) * F, 4);
        h[m] = (float *)xmalloc((size_t)T * D * 4);
        memcpy(h[m], h0, (size_t)T * D * 4);
        w[m] = (float *)xcalloc((size_t)T * k, 4), wsh[m] = (float *)xcalloc(T, 4);
        ids[m] = (int32_t *)xcalloc((size_t)T * k, 4);
    }
    /* the plain path: route kernel, q4m moe_up, moe_down (q4m_dot, as the slice kernels) */
    int old = tl_gpu_moe_set_slice(0), old_v = tl_gpu_q4v_set(0);
    CHECK_EQ_INT(tl_gpu_moe_route(ids[0], w[0], wsh[0], NULL, lg, E + 1, E, k, T, NULL), 0);
    CHECK_EQ_INT(tl_gpu_moe_up(act[0], &gu.m, h0, nw, 1e-6f, ids[0], k, E, T, NULL), 0);
    CHECK_EQ_INT(tl_gpu_moe_down(h[0], &dn.m, act[0], ids[0], w[0], wsh[0], k, E, T, NULL), 0);
    /* the decode step's: routing in moe_up (slice / expert-major kernels), moe_down early */
    tl_gpu_moe_set_slice(1);
    CHECK_EQ_INT(tl_gpu_moe_up_route(act[1], ids[1], w[1], wsh[1], &gu.m, h0, nw, 1e-6f, lg, E + 1,
                                     k, E, T, NULL),
                 0);
    CHECK_EQ_INT(tl_gpu_moe_down_after_route(h[1], &dn.m, act[1], ids[1], lg, E + 1, w[1], wsh[1], k,
                                             E, T, NULL),
                 0);
    tl_gpu_moe_set_slice(old), tl_gpu_q4v_set(old_v);
    int s_ids = !memcmp(ids[0], ids[1], (size_t)T * k * 4);
    int s_w = !memcmp(w[0], w[1], (size_t)T * k * 4) && !memcmp(wsh[0], wsh[1], (size_t)T * 4);
    int s_act = !memcmp(act[0], act[1], (size_t)T * (k + 1) * F * 4);
    int s_h = !memcmp(h[0], h[1], (size_t)T * D * 4);
    int moved = memcmp(h[0], h0, (size_t)T * D * 4) != 0;
    printf("# moe D%d k%d T%d: ids %s, weights %s, act %s, h %s (h moved: %d)\n", D, k, T,
           s_ids ? "same" : "DIFFER", s_w ? "same" : "DIFFER", s_act ? "same" : "DIFFER",
           s_h ? "same" : "DIFFER", moved);
    CHECK(s_ids && s_w && s_act && s_h && moved);
    for (int m = 0; m < 2; m++) free(act[m]), free(h[m]), free(w[m]), free(wsh[m]), free(ids[m]);
    free(lg), free(h0), free(nw), q4_free(&gu), q4_free(&dn);
}

/* moe_up and moe_down on the q4v dot (one token a block row) against q4m_dot: the same
 * products within NMSE 1e-10 (act and the combined h), other bits. */
static void q4v_moe_case(int D, int k, int T) {
    const int E = 16, F = 512;
    q4mat gu = q4_random(&rs, (E + 1) * 2 * F, D), dn = q4_random(&rs, (E + 1) * D, F);
    float *lg = rand_vec(&rs, (size_t)T * (E + 1), 3.0f), *h0 = rand_vec(&rs, (size_t)T * D, 1.0f);
    float *nw = rand_vec(&rs, D, 1.0f);
    float *act[2], *h[2];
    float *w = (float *)xcalloc((size_t)T * k, 4), *wsh = (float *)xcalloc(T, 4);
    int32_t *ids = (int32_t *)xcalloc((size_t)T * k, 4);
    CHECK_EQ_INT(tl_gpu_moe_route(ids, w, wsh, NULL, lg, E + 1, E, k, T, NULL), 0);
    int old = tl_gpu_q4v_set(0);
    for (int m = 0; m < 2; m++) { /* q4m_dot; moe_up and moe_down on q4v */
        tl_gpu_q4v_set(m ? 2 : 0);
        act[m] = (float *)xcalloc((size_t)T * (k + 1) * F, 4);
        h[m] = (float *)xmalloc((size_t)T * D * 4);
        memcpy(h[m], h0, (size_t)T * D * 4);
        CHECK_EQ_INT(tl_gpu_moe_up(act[m], &gu.m, h0, nw, 1e-6f, ids, k, E, T, NULL), 0);
        CHECK_EQ_INT(tl_gpu_moe_down(h[m], &dn.m, act[m], ids, w, wsh, k, E, T, NULL), 0);
    }
    tl_gpu_q4v_set(old);
    size_t na = (size_t)T * (k + 1) * F;
    double nact = t_nmse(act[1], act[0], na), nh = t_nmse(h[1], h[0], (size_t)T * D);
    int other = memcmp(act[0], act[1], na * 4) != 0;
    printf("# moe q4v D%d k%d T%d: act nmse vs q4m %.2e (%s bits), h %.2e\n", D, k, T, nact,
           other ? "other" : "SAME", nh);
    CHECK(nact < 1e-10 && nh < 1e-10 && other);
    for (int m = 0; m < 2; m++) free(act[m]), free(h[m]);
    free(w), free(wsh), free(ids), free(lg), free(h0), free(nw), q4_free(&gu), q4_free(&dn);
}

static void test_moe_ways(void) {
    q4v_moe_case(2048, 8, 1);
    q4v_moe_case(2048, 8, 2);
    q4v_moe_case(256, 4, 1);
    moe_case(2048, 8, 1); /* moe_up_q4s */
    moe_case(2048, 8, 4); /* moe_up_q4x */
    moe_case(2048, 8, 8);
    moe_case(256, 4, 1); /* KPW 8, KS 1 */
    moe_case(256, 4, 5);
}

/* ---- sampler with count bits ---- */

/* The sampling of the sampler tests' three rows: the model card's, greedy with a repetition
 * penalty, and a low temperature with top-k 5 and a frequency penalty. */
static void three_rows(tl_sample_params (&p)[3]) {
    memset(p, 0, sizeof p);
    for (int r = 0; r < 3; r++) p[r].top_p = 1.0f, p[r].repetition_penalty = 1.0f;
    p[0].temperature = 1.0f, p[0].top_k = 20, p[0].top_p = 0.95f, p[0].presence_penalty = 1.5f;
    p[1].repetition_penalty = 1.3f; /* greedy */
    p[2].temperature = 0.7f, p[2].top_k = 5, p[2].frequency_penalty = 0.8f;
}

static void test_sample_bits(void) {
    const int V = 32768, R = 3;
    float *lg = rand_vec(&rs, (size_t)R * V, 3.0f);
    int32_t *cnt = (int32_t *)xcalloc((size_t)R * V, 4);
    uint32_t *bits = (uint32_t *)xcalloc((size_t)R * TL_GPU_COUNT_WORDS(V), 4);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 200; i++) {
            int t = (int)(t_rng_next(&rs) % V), stray = (int)(t_rng_next(&rs) % V);
            cnt[(size_t)r * V + t] = i % 3 == 0 ? 1 << 30 : i % 3 == 1 ? 2 : (1 << 30) | 1;
            lg[(size_t)r * V + t] += 4.0f; /* counted tokens near the top */
            bits[r * TL_GPU_COUNT_WORDS(V) + t / 32] |= 1u << (t % 32);
            bits[r * TL_GPU_COUNT_WORDS(V) + stray / 32] |= 1u << (stray % 32); /* a superset */
        }
    tl_sample_params p[R];
    three_rows(p);
    uint64_t keys[R] = {11, 22, 33};
    float *scr = (float *)xmalloc(sizeof(float) * 2 * (size_t)R * V);
    tl_sample_out a[R], b[R];
    CHECK_EQ_INT(tl_gpu_sample(a, lg, V, V, p, p, keys, cnt, bits, NULL, scr, NULL, R, NULL), 0);
    CHECK_EQ_INT(tl_gpu_sample(b, lg, V, V, p, p, keys, cnt, NULL, NULL, scr, NULL, R, NULL), 0);
    int same = 1;
    for (int r = 0; r < R; r++) same &= a[r].token == b[r].token && a[r].logprob == b[r].logprob;
    /* the laws: rows = the logits rows, counts of slot r */
    int32_t li[(3 + TL_LAW_ADJ) * R];
    memset(li, 0, sizeof li);
    for (int r = 0; r < R; r++) li[r] = r, li[R + r] = r;
    float *lscr = (float *)xmalloc(sizeof(float) * tl_gpu_law_scratch_floats(R));
    tl_law la[R], lb[R];
    CHECK_EQ_INT(tl_gpu_sample_law(la, lg, V, V, li, p, p, cnt, bits, li + R, li + 3 * R, lscr, R,
                                   NULL),
                 0);
    CHECK_EQ_INT(tl_gpu_sample_law(lb, lg, V, V, li, p, p, cnt, NULL, li + R, li + 3 * R, lscr, R,
                                   NULL),
                 0);
    int same_law = 1;
    for (int r = 0; r < R; r++) {
        same_law &= la[r].n == lb[r].n && la[r].n > 0;
        for (int i = 0; i < la[r].n && i < lb[r].n; i++)
            same_law &= la[r].id[i] == lb[r].id[i] && la[r].p[i] == lb[r].p[i];
    }
    printf("# sampler with count bits: tokens %d %d %d, same as without: %s; laws: %s\n",
           a[0].token, a[1].token, a[2].token, same ? "yes" : "NO", same_law ? "same" : "DIFFER");
    CHECK(same);
    CHECK(same_law);
    free(lg), free(cnt), free(bits), free(scr), free(lscr);
}

/* ---- the sampler's laws and tokens against the host sampler ---- */

/* R rows of V logits (ids >= nv are padding): 10 prompt tokens and 6 generated ones (one twice)
 * a row, raised by 4 so the penalties move the top; device laws == tl_sample_law (ids, p to
 * 1e-6, logprobs to 1e-5), the greedy row's token its first survivor, the sampled rows' tokens
 * among their survivors. */
static void law_case(int V, int nv, int ties) {
    enum { R = 3, NP = 10, NG = 6 };
    float *lg = rand_vec(&rs, (size_t)R * V, 3.0f);
    if (ties) /* a plateau: ~2/3 of the ids share the largest value, so a part of 1,940 ids (128
               * parts a row) has more than FCAND (1,024) candidates: the radix selection */
        for (size_t i = 0; i < (size_t)R * V; i++) lg[i] = lg[i] > -1.0f ? 3.0f : lg[i];
    int32_t *cnt = (int32_t *)xcalloc((size_t)R * V, 4), hist[R][NP + NG];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < NP + NG; i++) {
            int t = i == NP + NG - 1 ? hist[r][NP] : (int)(t_rng_next(&rs) % nv);
            hist[r][i] = t;
            if (i < NP)
                cnt[(size_t)r * V + t] |= 1 << 30;
            else
                cnt[(size_t)r * V + t] += 1;
            lg[(size_t)r * V + t] += 4.0f;
        }
    tl_sample_params p[R];
    three_rows(p);
    int32_t li[(3 + TL_LAW_ADJ) * R];
    memset(li, 0, sizeof li);
    for (int r = 0; r < R; r++) li[r] = r, li[R + r] = r;
    float *lscr = (float *)xmalloc(sizeof(float) * tl_gpu_law_scratch_floats(R));
    float *scr = (float *)xmalloc(sizeof(float) * 2 * (size_t)R * V);
    tl_law la[R], lh;
    tl_sample_out o[R];
    uint64_t keys[R] = {5, 6, 7};
    CHECK_EQ_INT(tl_gpu_sample_law(la, lg, V, nv, li, p, p, cnt, NULL, li + R, li + 3 * R, lscr, R,
                                   NULL),
                 0);
    CHECK_EQ_INT(tl_gpu_sample(o, lg, V, nv, p, p, keys, cnt, NULL, NULL, scr, NULL, R, NULL), 0);
    int ok = 1;
    double dp = 0, dl = 0;
    for (int r = 0; r < R; r++) {
        CHECK_EQ_INT(tl_sample_law(lg + (size_t)r * V, nv, &p[r], hist[r], NP + NG, NP, &lh), 0);
        ok &= la[r].n == lh.n && la[r].n > 0;
        for (int i = 0; i < la[r].n && i < lh.n; i++) {
            ok &= la[r].id[i] == lh.id[i];
            dp = fmax(dp, fabs((double)la[r].p[i] - lh.p[i]));
            dl = fmax(dl, fabs((double)la[r].lp[i] - lh.lp[i]));
        }
        int in = 0;
        for (int i = 0; i < lh.n; i++) in |= o[r].token == lh.id[i];
        ok &= r == 1 ? o[r].token == lh.id[0] : in;
    }
    printf("# laws vs host, V %d (n_valid %d): survivors %d %d %d, same ids: %s, max |dp| %.2e, "
           "max |dlogprob| %.2e, tokens %d %d %d\n",
           V, nv, la[0].n, la[1].n, la[2].n, ok ? "yes" : "NO", dp, dl, o[0].token, o[1].token,
           o[2].token);
    CHECK(ok);
    CHECK(dp <= 1e-6);
    CHECK(dl <= 1e-5);
    free(lg), free(cnt), free(lscr), free(scr);
}

static void test_sample_vs_host(void) {
    law_case(32768, 32768, 0); /* whole float4s, parts of 1024 ids */
    law_case(32768, 32766, 0); /* a padded tail: the last part ends mid-float4 */
    law_case(32770, 32770, 0); /* not a multiple of 4: one id at a time */
    law_case(248320, 248320, 1); /* mass ties: the model vocabulary, the radix selection */
}

/* tests/gpu/test_kernels.c test_sample_law's scenario (six rows of the model's vocabulary, the
 * counts through tl_gpu_penalty_add, adjustments counting tokens in and out, two passes) over
 * many seeds of its draws (EMU_LAW_SEEDS, default 4): device laws == tl_sample_law. A row that
 * differs prints both laws. */
static tl_sample_params law_greedy(void) {
    tl_sample_params p;
    memset(&p, 0, sizeof p);
    p.top_p = 1.0f, p.repetition_penalty = 1.0f;
    return p;
}
static int law_seed_case(unsigned long long seed) {
    enum { R = 6, NP = 30, NG = 20 };
    const int V = TL_N_VOCAB, nv = TL_N_VOCAB_TOKENS;
    unsigned long long g = seed;
    float *lg = rand_vec(&g, (size_t)R * V, 3.0f);
    int32_t hist[2][NP + NG + 8], pos[NP + NG], slot[NP + NG], tok[NP + NG], np[2] = {NP, NP};
    int32_t *dc = (int32_t *)xcalloc((size_t)2 * V, 4);
    uint32_t *dcb = (uint32_t *)xcalloc((size_t)2 * TL_GPU_COUNT_WORDS(V), 4);
    for (int sl = 0; sl < 2; sl++) {
        for (int i = 0; i < NP + NG; i++) {
            int32_t t = (int32_t)(t_rng_next(&g) % 4000) * 61 % nv;
            if (i >= NP && i % 3 == 0) t = hist[sl][i - 2];
            hist[sl][i] = tok[i] = t, pos[i] = i, slot[i] = sl;
            lg[(size_t)(sl + 1) * V + t] += 2.0f;
        }
        CHECK_EQ_INT(tl_gpu_penalty_add(dc, dcb, V, tok, pos, slot, np, NP + NG, NULL), 0);
    }
    tl_sample_params p[R];
    for (int r = 0; r < R; r++) p[r] = law_greedy();
    p[1].temperature = 1.0f, p[1].top_k = 20, p[1].top_p = 0.95f, p[1].presence_penalty = 1.5f;
    p[2].temperature = 0.5f, p[2].top_k = 64, p[2].min_p = 0.01f, p[2].repetition_penalty = 1.3f;
    p[3].temperature = 1.0f, p[3].top_k = 5, p[3].frequency_penalty = 0.7f;
    p[4].presence_penalty = 3.0f;
    p[5].temperature = 2.0f, p[5].top_k = 40, p[5].top_p = 0.5f, p[5].presence_penalty = 1.0f;
    int32_t ints[(3 + TL_LAW_ADJ) * R];
    memset(ints, 0, sizeof ints);
    int nh[R];
    int32_t h[R][NP + NG + 8];
    for (int r = 0; r < R; r++) {
        int sl = r % 2, na = 0;
        ints[r] = R - 1 - r;
        memcpy(h[r], hist[sl], sizeof(int32_t) * (NP + NG));
        nh[r] = NP + NG;
        if (r % 3 == 1)
            for (int a = 0; a < 3; a++) {
                int32_t t = a == 2 ? hist[sl][NP + 1] : (int32_t)(t_rng_next(&g) % (uint32_t)nv);
                ints[3 * R + r * TL_LAW_ADJ + na++] = t + 1, h[r][nh[r]++] = t;
            }
        if (r % 3 == 2)
            for (int a = 0; a < 3; a++) ints[3 * R + r * TL_LAW_ADJ + na++] = -(h[r][--nh[r]] + 1);
        ints[R + r] = sl;
    }
    float *scr = (float *)xmalloc(sizeof(float) * tl_gpu_law_scratch_floats(R));
    tl_law law[R];
    /* the scratch and the laws as a long-running process leaves them: not zeros */
    memset(scr, 0x5a, sizeof(float) * tl_gpu_law_scratch_floats(R));
    memset(law, 0xa5, sizeof law);
    int bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) p[2].top_k = 32, p[5].top_k = 32;
        CHECK_EQ_INT(tl_gpu_sample_law(law, lg, V, nv, ints, p, pass ? p : NULL, dc,
                                       pass ? dcb : NULL, ints + R, ints + 3 * R, scr, R, NULL),
                     0);
        for (int r = 0; r < R; r++) {
            tl_law ref;
            const float *row = lg + (size_t)(R - 1 - r) * V;
            CHECK_EQ_INT(tl_sample_law(row, nv, &p[r], h[r], nh[r], NP, &ref), 0);
            int same = law[r].n == ref.n && ref.n > 0;
            double dp = 0;
            for (int i = 0; i < ref.n && i < law[r].n; i++) {
                same &= law[r].id[i] == ref.id[i];
                dp = fmax(dp, fabs(law[r].p[i] - ref.p[i]));
            }
            if (same && dp < 1e-5) continue;
            bad++;
            printf("# seed %llx pass %d row %d: device %d survivors, host %d, max |dp| %.2g\n", seed,
                   pass, r, law[r].n, ref.n, dp);
            const tl_law *l[2] = {&law[r], &ref};
            for (int k = 0; k < 2; k++) {
                printf("#   %s:", k ? "host" : "device");
                for (int i = 0; i < l[k]->n; i++) {
                    int id = l[k]->id[i], inp = 0, ing = 0;
                    for (int j = 0; j < nh[r]; j++) (j < NP ? inp : ing) += h[r][j] == id;
                    printf(" %d:%.5g(%.5g; count %x, prompt %d gen %d)", id, l[k]->p[i], row[id],
                           dc[(size_t)ints[R + r] * V + id], inp, ing);
                }
                printf("\n");
            }
        }
    }
    free(lg), free(dc), free(dcb), free(scr);
    return bad;
}
static void test_law_seeds(void) {
    const char *e = getenv("EMU_LAW_SEEDS");
    int n = e ? atoi(e) : 4, bad = 0;
    const char *s0 = getenv("EMU_LAW_SEED0");
    unsigned long long base = s0 ? strtoull(s0, NULL, 16) : 0x1234567887654321ull;
    for (int i = 0; i < n; i++) bad += law_seed_case(base + 0x9e3779b97f4a7c15ull * i);
    printf("# law seeds: %d, rows that differ: %d\n", n, bad);
    CHECK_EQ_INT(bad, 0);
}

/* ---- the chained drafts' pick and the decode batches' route + plan ---- */

static int pick_on_emu(tl_gpu_chain *c, int n, const tl_law *laws, int j, int32_t *next,
                       int32_t *adj) {
    return tl_gpu_draft_pick(c, laws, j, n, next, adj, NULL);
}
static void test_draft_pick(void) {
    int bad = 0, sizes[3] = {1, 7, 300};
    for (int i = 0; i < 3; i++) bad += draft_pick_case(&rs, sizes[i], 4, pick_on_emu);
    printf("# draft_pick: %d mismatches with the host draws\n", bad);
    CHECK_EQ_INT(bad, 0);
}

/* tl_gpu_moe_route_plan against tl_gpu_moe_route + tl_gpu_moe_pf_plan (256 experts, 1..32
 * tokens, one token of exact ties): ids, weights, shared weights and logits bit for bit, the
 * plan's offsets and tile starts, and each expert's assignments as a set. */
static void test_route_plan(void) {
    const int E = 256, K = 8, ld = E + 1, sizes[] = {1, 3, 4, 9, 32};
    int bad = 0;
    for (int si = 0; si < 5; si++) {
        int T = sizes[si];
        float *lg = rand_vec(&rs, (size_t)T * ld, 4.0f);
        for (int e = 0; e < E; e++) lg[(T / 2) * ld + e] = 0.25f * (float)(e % 3);
        static route_plan_out o[2];
        memset(o, 0xff, sizeof o);
        CHECK_EQ_INT(tl_gpu_moe_route(o[0].ids, o[0].w, o[0].sh, o[0].sl, lg, ld, E, K, T, NULL), 0);
        CHECK_EQ_INT(tl_gpu_moe_pf_plan(o[0].plan, o[0].ids, T, NULL), 0);
        CHECK_EQ_INT(tl_gpu_moe_route_plan(o[1].plan, o[1].ids, o[1].w, o[1].sh, o[1].sl, lg, ld, E,
                                           K, T, NULL),
                     0);
        int same = route_plan_same(o, T, E);
        printf("# moe_route_plan %d tokens: %s\n", T, same ? "== route + plan" : "DIFFERS");
        bad += !same;
        free(lg);
    }
    CHECK_EQ_INT(bad, 0);
}

int main(void) {
    T_RUN(test_draft_pick);
    T_RUN(test_route_plan);
    T_RUN(test_law_seeds);
    T_RUN(test_sample_vs_host);
    T_RUN(test_sample_bits);
    T_RUN(test_q4v);
    T_RUN(test_gemv_ways);
    T_RUN(test_gemv_conv);
    T_RUN(test_gemv_bf16);
    T_RUN(test_moe_ways);
    return t_summary();
}
