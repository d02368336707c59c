/* Timing of the prefill kernels at production shapes (llm.c style: one standalone program that
 * compiles the kernels in, fills inputs on the device, flushes L2 between repeats and prints
 * time | TFLOP/s | % of the bf16 tensor peak). Correctness lives in tests/gpu/
 * test_prefill_kernels.c; this file only times.
 *   make build/cuda/dev/prefill_bench && build/cuda/dev/prefill_bench
 * (linked with the engine's CUDA objects, whose kernels it reaches through gpu.h as the engine
 * does; k_gdn_chunk.cu is compiled in instead of linked, to time its kernels alone, and the
 * superseded GDN kernel gdn_chunk_v1.cu for comparison).
 * Peak used for the percentage: 790 TFLOP/s (dense bf16 measured with torch on this H200,
 * docs/developing.md §4).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cuda/k_gdn_chunk.cu" /* its kernels are timed alone too */
#include "gdn_chunk_v1.cu"
#include "../../tests/gpu/cu_check.h"

#define PEAK_TFLOPS 790.0

#define OK(x)                                                                                      \
    do {                                                                                           \
        int r_ = (x);                                                                              \
        if (r_ != 0) {                                                                             \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #x, r_);                \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)

static __device__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (uint32_t)x;
}
/* bf16 uniform in [-a, a) */
__global__ void fill_bf16(uint16_t *p, size_t n, float a, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float u = (hash32(i, seed) >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        __nv_bfloat16 b = __float2bfloat16_rn(u * a);
        p[i] = *(uint16_t *)&b;
    }
}
__global__ void fill_u32(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = hash32(i, seed);
}
/* scale/bias words: scale ~0.006, bias ~ -7.5 scale */
__global__ void fill_sb(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.004f + 0.004f * (hash32(i, seed) >> 8) * (1.0f / 16777216.0f);
        __nv_bfloat16 sb = __float2bfloat16_rn(s), bb = __float2bfloat16_rn(-7.5f * s);
        p[i] = (uint32_t)(*(uint16_t *)&sb) | ((uint32_t)(*(uint16_t *)&bb) << 16);
    }
}
__global__ void fill_f32(float *p, size_t n, float lo, float hi, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = lo + (hi - lo) * (hash32(i, seed) >> 8) * (1.0f / 16777216.0f);
}
__global__ void fill_ids(int32_t *ids, int n_tok, uint32_t seed) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tok) return;
    int e0 = hash32(t, seed) % 256,
        step = 1 + 2 * (hash32(t, seed + 1) % 127); /* odd: 8 distinct */
    for (int s = 0; s < 8; s++) ids[t * 8 + s] = (e0 + s * step) % 256;
}

static void *dalloc(size_t n) {
    void *p;
    CU(cudaMalloc(&p, n));
    return p;
}
static uint16_t *rand_bf16_dev(size_t n, float a, uint32_t seed) {
    uint16_t *p = (uint16_t *)dalloc(n * 2);
    fill_bf16<<<2048, 256>>>(p, n, a, seed);
    return p;
}

static void *flush_buf;
static int bench_tiles = 8; /* TL_BENCH_TILES=3: the mma.sync shapes only; 5: no 16x128, wgr */
static const size_t FLUSH_BYTES = 256u << 20;

typedef void (*bench_fn)(void *ctx);
static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
/* median ms over reps, L2 flushed before each */
static float time_ms(bench_fn fn, void *ctx, int reps) {
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    fn(ctx);
    fn(ctx);
    CU(cudaDeviceSynchronize());
    float ts[64];
    for (int r = 0; r < reps; r++) {
        CU(cudaMemsetAsync(flush_buf, r, FLUSH_BYTES));
        CU(cudaEventRecord(e0));
        fn(ctx);
        CU(cudaEventRecord(e1));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ts[r], e0, e1));
    }
    CU(cudaGetLastError());
    qsort(ts, reps, sizeof(float), cmp_f);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ts[reps / 2];
}

static void row(const char *name, float ms, double flop) {
    double tf = flop / (ms * 1e-3) / 1e12;
    printf("%-46s %9.3f ms %8.1f TFLOP/s %6.1f%%\n", name, ms, tf, 100.0 * tf / PEAK_TFLOPS);
}

/* ---- GEMM ---- */
typedef struct {
    tl_gpu_gemm_w w;
    void *x, *y;
    int n, flags;
} gemm_ctx;
static void gemm_run(void *c) {
    gemm_ctx *g = (gemm_ctx *)c;
    OK(tl_gpu_gemm(g->y, g->x, &g->w, g->n, g->y, g->flags, NULL));
}

static tl_gpu_gemm_w make_w(int bits, int rows, int cols, int n_mat, uint32_t seed) {
    tl_gpu_gemm_w w = {};
    w.bits = bits, w.rows = rows, w.cols = cols;
    if (bits == 16) {
        w.w = rand_bf16_dev((size_t)n_mat * rows * cols, 0.05f, seed);
    } else {
        size_t nw = tl_gpu_q4_w_bytes(rows, cols) / 4 * n_mat,
               ns = tl_gpu_q4_sb_bytes(rows, cols) / 4 * n_mat;
        uint32_t *pw = (uint32_t *)dalloc(nw * 4), *ps = (uint32_t *)dalloc(ns * 4);
        fill_u32<<<2048, 256>>>(pw, nw, seed);
        fill_sb<<<2048, 256>>>(ps, ns, seed + 7);
        w.w = pw, w.sb = ps;
    }
    return w;
}
static void free_w(tl_gpu_gemm_w *w) {
    cudaFree((void *)w->w);
    if (w->sb) cudaFree((void *)w->sb);
}

static void bench_gemm(void) {
    static const struct {
        const char *name;
        int rows, cols, flags;
    } sh[] = {
        {"gdn qkv 8192x2048", 8192, 2048, 0},
        {"gdn in fused 12416x2048", 12416, 2048, 0},
        {"gdn z 4096x2048", 4096, 2048, 0},
        {"gdn out 2048x4096 +res", 2048, 4096, TL_GEMM_ADD_RES},
        {"attn q 8192x2048", 8192, 2048, 0},
        {"attn k 512x2048", 512, 2048, 0},
        {"shared gate_up 1024x2048 swiglu", 1024, 2048, TL_GEMM_SWIGLU},
        {"shared down 2048x512 +res", 2048, 512, TL_GEMM_ADD_RES},
        {"lm_head 248320x2048", 248320, 2048, 0},
    };
    static const int ns[] = {512, 4096};
    for (int bits = 16; bits >= 4; bits -= 12) {
        for (unsigned s = 0; s < sizeof sh / sizeof sh[0]; s++) {
            for (int ni = 0; ni < 2; ni++) {
                int n = ns[ni];
                if (sh[s].rows == 248320 && n > 512) continue;
                gemm_ctx g;
                g.w = make_w(bits, sh[s].rows, sh[s].cols, 1, 11 + s);
                g.n = n;
                g.flags = sh[s].flags;
                g.x = rand_bf16_dev((size_t)n * sh[s].cols, 1.0f, 3);
                g.y = rand_bf16_dev((size_t)n * sh[s].rows, 1.0f, 5);
                double flop = 2.0 * n * sh[s].rows * sh[s].cols;
                char name[96];
                snprintf(name, sizeof name, "gemm %s %s n=%d", bits == 16 ? "bf16" : "q4",
                         sh[s].name, n);
                float ms = time_ms(gemm_run, &g, 15);
                row(name, ms, flop);
                /* the three tile shapes forced (TFLOP/s): 128x128, 64x128, 128x256 */
                printf(
                    "    tiles mma 128x128 / 64x128 / 128x256, wgmma 128x256 / 64x256, mma 16x128, "
                    "wgr 2 / 4 warpgroups:");
                for (int t = 0; t < bench_tiles; t++) {
                    char v[16];
                    snprintf(v, sizeof v, "%d", t);
                    setenv("TL_GEMM_TILE", v, 1);
                    float mt = time_ms(gemm_run, &g, 9);
                    printf(" %7.1f", flop / (mt * 1e-3) / 1e12);
                }
                unsetenv("TL_GEMM_TILE");
                printf("\n");
                free_w(&g.w);
                cudaFree(g.x), cudaFree(g.y);
            }
        }
    }
}

/* ---- MoE ---- */
typedef struct {
    tl_gpu_gemm_w gu, dn;
    int32_t *ids, *plan;
    float *wts, *out;
    uint16_t *x, *h, *ys;
    int n;
} moe_ctx;
static void moe_run(void *c) {
    moe_ctx *m = (moe_ctx *)c;
    OK(tl_gpu_moe_pf_plan(m->plan, m->ids, m->n, NULL));
    OK(tl_gpu_moe_pf_gate_up(m->h, m->x, &m->gu, m->plan, m->n, 0, NULL));
    OK(tl_gpu_moe_pf_down(m->ys, m->h, &m->dn, m->plan, m->n, 0, NULL));
    OK(tl_gpu_moe_pf_combine(m->out, m->out, m->ys, m->wts, NULL, NULL, m->n, TL_GEMM_OUT_F32,
                             NULL));
}
static void moe_gemms_only(void *c) {
    moe_ctx *m = (moe_ctx *)c;
    OK(tl_gpu_moe_pf_gate_up(m->h, m->x, &m->gu, m->plan, m->n, 0, NULL));
    OK(tl_gpu_moe_pf_down(m->ys, m->h, &m->dn, m->plan, m->n, 0, NULL));
}

static void bench_moe(void) {
    /* 256: the largest MoE that runs on the decode-batch kernels (gemm_wgr_of's threshold is
     * 512 tokens); a 256-token prefill takes longer than a 512-token one (session 20) */
    static const int ns[] = {256, 512, 1024, 2048, 4096};
    for (int bits = 16; bits >= 4; bits -= 12) {
        for (int ni = 0; ni < 5; ni++) {
            if (bits == 16 && (ns[ni] == 1024 || ns[ni] == 2048))
                continue; /* 4-bit: the protocol */
            moe_ctx m;
            m.n = ns[ni];
            m.gu = make_w(bits, 1024, 2048, 256, 21);
            m.dn = make_w(bits, 2048, 512, 256, 22);
            m.ids = (int32_t *)dalloc((size_t)m.n * 8 * 4);
            fill_ids<<<(m.n + 255) / 256, 256>>>(m.ids, m.n, 9);
            m.plan = (int32_t *)dalloc(tl_gpu_moe_pf_plan_ints(m.n) * 4);
            m.wts = (float *)dalloc((size_t)m.n * 8 * 4);
            fill_f32<<<256, 256>>>(m.wts, (size_t)m.n * 8, 0.0f, 0.25f, 4);
            m.out = (float *)dalloc((size_t)m.n * 2048 * 4);
            fill_f32<<<256, 256>>>(m.out, (size_t)m.n * 2048, -1.f, 1.f, 6);
            m.x = rand_bf16_dev((size_t)m.n * 2048, 1.0f, 8);
            m.h = (uint16_t *)dalloc((size_t)m.n * 8 * 512 * 2);
            m.ys = (uint16_t *)dalloc((size_t)m.n * 8 * 2048 * 2);
            double flop = 2.0 * m.n * 8 * (1024.0 * 2048 + 2048.0 * 512);
            char name[96];
            snprintf(name, sizeof name, "moe %s n=%d plan+gate_up+down+combine",
                     bits == 16 ? "bf16" : "q4", m.n);
            row(name, time_ms(moe_run, &m, 15), flop);
            snprintf(name, sizeof name, "moe %s n=%d gate_up+down only", bits == 16 ? "bf16" : "q4",
                     m.n);
            row(name, time_ms(moe_gemms_only, &m, 15), flop);
            printf("    tiles mma 128x128 / 64x128 / 128x256, wgmma 128x256 / 64x256, mma 16x128, "
                   "wgr 2 / 4 warpgroups:");
            for (int t = 0; t < bench_tiles; t++) {
                char v[16];
                snprintf(v, sizeof v, "%d", t);
                setenv("TL_GEMM_TILE", v, 1);
                float mt = time_ms(moe_gemms_only, &m, 9);
                printf(" %7.1f", flop / (mt * 1e-3) / 1e12);
            }
            unsetenv("TL_GEMM_TILE");
            printf("\n");
            free_w(&m.gu), free_w(&m.dn);
            cudaFree(m.ids), cudaFree(m.plan), cudaFree(m.wts), cudaFree(m.out);
            cudaFree(m.x), cudaFree(m.h), cudaFree(m.ys);
        }
    }
}

/* ---- attention ---- */
typedef struct {
    uint16_t *o, *q;
    tl_gpu_kv_view kv;
    int n, pos0;
} attn_ctx;
static void attn_run(void *c) {
    attn_ctx *a = (attn_ctx *)c;
    tl_gpu_heads q = {a->q, 16 * 512, 512}, g = {a->q + 256, 16 * 512, 512};
    OK(tl_gpu_attn_prefill(a->o, &q, &g, &a->kv, a->n, a->pos0, 0, NULL));
}
static void bench_attn(void) {
    static const int cases[][2] = {{512, 0}, {4096, 0}, {4096, 28672}, {8192, 0}};
    for (int c = 0; c < 4; c++) {
        attn_ctx a = {};
        a.n = cases[c][0], a.pos0 = cases[c][1];
        int kv_len = a.n + a.pos0;
        a.q = rand_bf16_dev((size_t)a.n * 16 * 512, 1.0f, 31);
        a.o = (uint16_t *)dalloc((size_t)a.n * 4096 * 2);
        a.kv.k = rand_bf16_dev((size_t)kv_len * 512, 1.0f, 32);
        a.kv.v = rand_bf16_dev((size_t)kv_len * 512, 1.0f, 33);
        a.kv.tok_stride = 512;
        /* causal pairs: sum over queries of (pos0 + t + 1) keys; 4 flop per pair per dim (QK, PV)
         */
        double pairs = (double)a.n * a.pos0 + (double)a.n * (a.n + 1) / 2;
        double flop = 4.0 * 16 * 256 * pairs;
        char name[96];
        snprintf(name, sizeof name, "attn prefill n=%d pos0=%d", a.n, a.pos0);
        row(name, time_ms(attn_run, &a, 10), flop);
        cudaFree(a.q), cudaFree(a.o), cudaFree((void *)a.kv.k), cudaFree((void *)a.kv.v);
    }
}

/* ---- GDN ---- */
typedef struct {
    uint16_t *c;
    float *S, *g, *b;
    uint16_t *o;
    void *ws;
    int T, kern; /* TL_GDN_KERN_* */
} gdn_ctx;
static void gdn_run(void *p) {
    gdn_ctx *g = (gdn_ctx *)p;
    OK(tl_gpu_gdn_chunk(g->o, g->S, g->c, g->c + 2048, g->c + 4096, 8192, g->g, g->b, g->T,
                        TL_GDN_L2NORM | g->kern, g->ws, NULL));
}
/* the two halves of the tensor-core pair alone (tf32: SPLIT 0, 3xTF32: SPLIT 1) */
template <int SPLIT> static void gdn_run_prep_tc(void *p) {
    gdn_ctx *g = (gdn_ctx *)p;
    for (int t_seg = 0; t_seg < g->T; t_seg += GC_SEG) {
        int n_chunks = (TL_MIN_INT(g->T - t_seg, GC_SEG) + GC_L - 1) / GC_L;
        gdn_prep_tc_kernel<SPLIT><<<dim3(n_chunks, GC_NH), GC_THREADS, TP_SMEM>>>(
            (float *)g->ws, g->c, g->c + 2048, g->c + 4096, 8192, g->g, g->b, t_seg, g->T, 1, 0);
    }
}
template <int SPLIT> static void gdn_run_seq_tc(void *p) {
    gdn_ctx *g = (gdn_ctx *)p;
    for (int t_seg = 0; t_seg < g->T; t_seg += GC_SEG) {
        int n_chunks = (TL_MIN_INT(g->T - t_seg, GC_SEG) + GC_L - 1) / GC_L;
        gdn_seq_tc_kernel<SPLIT><<<dim3(GC_DK / GC_DVB, GC_NH), GC_THREADS, TS_SMEM>>>(
            g->o, g->S, (const float *)g->ws, t_seg, n_chunks, g->T, 0);
    }
}
/* the two halves of v2 alone (same launches as tl_gpu_gdn_chunk) */
static void gdn_run_prep(void *p) {
    gdn_ctx *g = (gdn_ctx *)p;
    for (int t_seg = 0; t_seg < g->T; t_seg += GC_SEG) {
        int n_chunks = (TL_MIN_INT(g->T - t_seg, GC_SEG) + GC_L - 1) / GC_L;
        gdn_prep_kernel<<<dim3(n_chunks, GC_NH), GC_THREADS, GP_SMEM>>>(
            (float *)g->ws, g->c, g->c + 2048, g->c + 4096, 8192, g->g, g->b, t_seg, g->T, 1, 0);
    }
}
template <int NW> static void gdn_run_seq(void *p) {
    gdn_ctx *g = (gdn_ctx *)p;
    for (int t_seg = 0; t_seg < g->T; t_seg += GC_SEG) {
        int n_chunks = (TL_MIN_INT(g->T - t_seg, GC_SEG) + GC_L - 1) / GC_L;
        gdn_seq_kernel<NW><<<dim3(GC_DK / GC_DVB, GC_NH), NW * 32, GS_SMEM>>>(
            g->o, g->S, (const float *)g->ws, t_seg, n_chunks, g->T, 0);
    }
}
static void gdn_run_v1(void *p) {
    gdn_ctx *g = (gdn_ctx *)p;
    OK(tl_gpu_gdn_chunk_v1(g->o, g->S, g->c, g->c + 2048, g->c + 4096, 8192, g->g, g->b, g->T,
                           TL_GDN_L2NORM, NULL));
}
static void bench_gdn(void) {
    static const int Ts[] = {512, 4096};
    for (int i = 0; i < 2; i++) {
        gdn_ctx g;
        g.T = Ts[i];
        g.c = rand_bf16_dev((size_t)g.T * 8192, 1.0f, 41);
        g.S = (float *)dalloc(32 * 128 * 128 * 4);
        fill_f32<<<256, 256>>>(g.S, 32 * 128 * 128, -0.1f, 0.1f, 42);
        g.g = (float *)dalloc((size_t)g.T * 32 * 4);
        fill_f32<<<256, 256>>>(g.g, (size_t)g.T * 32, -1.0f, -0.01f, 43);
        g.b = (float *)dalloc((size_t)g.T * 32 * 4);
        fill_f32<<<256, 256>>>(g.b, (size_t)g.T * 32, 0.1f, 0.9f, 44);
        g.o = (uint16_t *)dalloc((size_t)g.T * 4096 * 2);
        g.ws = dalloc(tl_gpu_gdn_chunk_ws_bytes());
        /* useful flop of the chunked form per head and chunk of 64 (fp32, not tensor cores):
         * kk^T, qk^T, W, U, W S, q S, Aqk v_new, state update */
        double per_chunk = 2.0 * (64.0 * 64 * 128 * 2 + 64.0 * 64 * 128 + 64.0 * 64 * 128 +
                                  64.0 * 128 * 128 * 2 + 64.0 * 64 * 128 + 64.0 * 128 * 128);
        double flop = per_chunk * 32 * ((g.T + 63) / 64);
        char name[96];
        static const struct {
            int kern;
            const char *name;
        } vers[] = {{-1, "v1 (fp32 CUDA cores)"},
                    {TL_GDN_KERN_FMA, "v2 (fp32 CUDA cores)"},
                    {TL_GDN_KERN_TF32, "tc tf32"},
                    {TL_GDN_KERN_3XTF32, "tc 3xtf32"}};
        for (int ver = 0; ver < 4; ver++) {
            snprintf(name, sizeof name, "gdn chunk %s T=%d", vers[ver].name, g.T);
            g.kern = vers[ver].kern;
            float ms = time_ms(g.kern < 0 ? gdn_run_v1 : gdn_run, &g, 10);
            row(name, ms, flop);
            printf("    -> %.0f tok/s per layer, 30 layers: %.2f ms\n", g.T / (ms * 1e-3), 30 * ms);
        }
        printf("    v2 prep only %.3f ms, sequential only %.3f ms\n", time_ms(gdn_run_prep, &g, 10),
               time_ms(gdn_run_seq<8>, &g, 10));
        printf("    tc tf32 prep only %.3f ms, sequential only %.3f ms\n",
               time_ms(gdn_run_prep_tc<0>, &g, 10), time_ms(gdn_run_seq_tc<0>, &g, 10));
        printf("    tc 3xtf32 prep only %.3f ms, sequential only %.3f ms\n",
               time_ms(gdn_run_prep_tc<1>, &g, 10), time_ms(gdn_run_seq_tc<1>, &g, 10));
        cudaFree(g.c), cudaFree(g.S), cudaFree(g.g), cudaFree(g.b), cudaFree(g.o), cudaFree(g.ws);
    }
}

int main(int argc, char **argv) {
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("# %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    flush_buf = dalloc(FLUSH_BYTES);
    if (getenv("TL_BENCH_TILES")) bench_tiles = atoi(getenv("TL_BENCH_TILES"));
    const char *only = argc > 1 ? argv[1] : "";
    if (!*only || strstr(only, "gemm")) bench_gemm();
    if (!*only || strstr(only, "moe")) bench_moe();
    if (!*only || strstr(only, "attn")) bench_attn();
    if (!*only || strstr(only, "gdn")) bench_gdn();
    CU(cudaDeviceSynchronize());
    return 0;
}
