/* Host emulation of tl_gpu_gdn_chunk (src/cuda/k_gdn_chunk.cu compiled unchanged against the
 * device shim dev/emu/cuda/cuda_common.cuh) against cpu_gdn_step, on the inputs of
 * tests/gpu/test_prefill_kernels.c (random, production shapes, the production flags f32 in,
 * f32 out, L2 norm in the kernel), for a few value heads. For checking the tensor-core kernels'
 * indexing without a GPU and for estimating the error of an operand precision before running
 * it: `emu_round_bf16` rounds the emulated tensor-core operands to bf16 instead of tf32 (the
 * choice not built). Not part of the build or of CI; usage:
 *   make -j2 build/cuda/src/cpu/cpu_gdn.o build/cuda/src/cpu/cpu_ops.o build/cuda/src/common/util.o
 *   g++ -O2 -std=c++17 -Idev/emu -Iinclude -Isrc -Itests dev/emu/gdn_tc_emu.cpp \
 *       build/cuda/src/cpu/cpu_gdn.o build/cuda/src/cpu/cpu_ops.o build/cuda/src/common/util.o \
 *       -lm -o /tmp/gdn_tc_emu
 *   /tmp/gdn_tc_emu T init(0|1) fma|tf32|3xtf32|bf16 [state_bf16 0|1 [io_bf16 0|1]] */
#include <ucontext.h>

#include "../../src/cuda/k_gdn_chunk.cu"

extern "C" {
#include "t_check.h"
#include "common/util.h"
#include "cpu/cpu.h"
}

alignas(16) float gp_smem[GP_SMEM / 4], gs_smem[GS_SMEM / 4], tp_smem[TP_SMEM / 4],
    ts_smem[TS_SMEM / 4];

dim3 threadIdx, blockIdx, blockDim;
int emu_round_bf16;
static const int emu_heads[] = {0, 3};
static int heads_on(int y) { return y == emu_heads[0] || y == emu_heads[1]; }
int (*emu_head_on)(int) = heads_on;

/* ---- coroutine threads ---- */
struct emu_thr {
    ucontext_t ctx;
    int done, wait;
};
enum { EMU_MAX = 256, EMU_STACK = 256 << 10 };
static emu_thr thr[EMU_MAX];
static char *stacks[EMU_MAX];
static ucontext_t sched;
static int cur, nthr;
static const std::function<void()> *body;

static void entry(void) {
    (*body)();
    thr[cur].done = 1;
}
void emu_barrier(int id) {
    thr[cur].wait = id;
    swapcontext(&thr[cur].ctx, &sched);
}
static int in_group(int id, int i) {
    if (id == 0) return 1;
    if (id < 100) return i / 32 == id - 1;
    return i < id - 100;
}
static void run_block(void) {
    for (int i = 0; i < nthr; i++) {
        if (!stacks[i]) stacks[i] = (char *)xmalloc(EMU_STACK);
        getcontext(&thr[i].ctx);
        thr[i].ctx.uc_stack.ss_sp = stacks[i];
        thr[i].ctx.uc_stack.ss_size = EMU_STACK;
        thr[i].ctx.uc_link = &sched;
        makecontext(&thr[i].ctx, entry, 0);
        thr[i].done = 0, thr[i].wait = -1;
    }
    for (;;) {
        for (int i = 0; i < nthr; i++)
            if (!thr[i].done && thr[i].wait < 0) {
                cur = i;
                threadIdx = dim3(i);
                swapcontext(&sched, &thr[i].ctx);
            }
        int alive = 0, released = 0;
        for (int i = 0; i < nthr; i++) alive += !thr[i].done;
        if (!alive) return;
        for (int i = 0; i < nthr; i++) {
            if (thr[i].done || thr[i].wait < 0) continue;
            int id = thr[i].wait, all = 1;
            for (int j = 0; j < nthr; j++)
                if (in_group(id, j) && !thr[j].done && thr[j].wait != id) all = 0;
            if (!all) continue;
            for (int j = 0; j < nthr; j++)
                if (in_group(id, j) && !thr[j].done) thr[j].wait = -1;
            released = 1;
        }
        if (!released) {
            fprintf(stderr, "emu: deadlock in block (%u, %u)\n", blockIdx.x, blockIdx.y);
            abort();
        }
    }
}
void emu_launch(dim3 grid, dim3 block, const std::function<void()> &fn) {
    body = &fn;
    nthr = (int)block.x;
    blockDim = block;
    for (unsigned y = 0; y < grid.y; y++) {
        if (!emu_head_on((int)y)) continue;
        for (unsigned x = 0; x < grid.x; x++) {
            blockIdx = dim3(x, y);
            run_block();
        }
    }
}

/* ---- warp collectives ---- */
static float shfl_slot[8][32];
float emu_shfl(float v, int src) {
    int w = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32;
    shfl_slot[w][l] = v;
    emu_barrier(1 + w);
    float r = shfl_slot[w][src];
    emu_barrier(1 + w);
    return r;
}
static uint32_t mma_a[8][32][4], mma_b[8][32][2];
/* m16n8k8 tf32 from the PTX fragment layout: g = lane / 4, t = lane % 4; A: a0 (g, t), a1 (g+8,
 * t), a2 (g, t+4), a3 (g+8, t+4); B: b0 (k t, n g), b1 (k t+4, n g); D: (g + 8 (e/2), 2t + e%2). */
void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    int w = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32;
    memcpy(mma_a[w][l], a, sizeof a);
    mma_b[w][l][0] = b0, mma_b[w][l][1] = b1;
    emu_barrier(1 + w);
    float A[16][8], B[8][8];
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, t = L & 3;
        A[g][t] = __uint_as_float(mma_a[w][L][0]);
        A[g + 8][t] = __uint_as_float(mma_a[w][L][1]);
        A[g][t + 4] = __uint_as_float(mma_a[w][L][2]);
        A[g + 8][t + 4] = __uint_as_float(mma_a[w][L][3]);
        B[t][g] = __uint_as_float(mma_b[w][L][0]);
        B[t + 4][g] = __uint_as_float(mma_b[w][L][1]);
    }
    int g = l >> 2, t = l & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 8; k++) s += A[row][k] * B[k][col];
        d[e] = s;
    }
    emu_barrier(1 + w);
}

/* ---- the comparison ---- */
static unsigned long long rng = 0x9e3779b97f4a7c15ull;
/* as tests/gpu/test_prefill_kernels.c: decay scale by head, 1 down to 1e-3 (slow heads keep the
 * initial state and accumulate drift over the whole segment) */
static float decay_scale(int h) { return powf(10.0f, -(float)(h % 4)); }

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s T init(0|1) fma|tf32|3xtf32|bf16 [state_bf16]\n", argv[0]);
        return 2;
    }
    const int T = atoi(argv[1]), init = atoi(argv[2]), sb16 = argc > 4 && atoi(argv[4]);
    const int io16 = argc > 5 && atoi(argv[5]);
    int kern = TL_GDN_KERN_TF32;
    if (!strcmp(argv[3], "fma")) kern = TL_GDN_KERN_FMA;
    if (!strcmp(argv[3], "3xtf32")) kern = TL_GDN_KERN_3XTF32;
    if (!strcmp(argv[3], "bf16")) emu_round_bf16 = 1;
    const int HK = 16, HV = 32, DK = 128, DV = 128, stride = 2 * HK * DK + HV * DV;
    float *c = (float *)xmalloc((size_t)T * stride * 4);
    for (size_t i = 0; i < (size_t)T * stride; i++)
        c[i] = tl_bf16_to_f32(tl_f32_to_bf16(t_randf(&rng)));
    float *q = (float *)xmalloc((size_t)T * HK * DK * 4),
          *k = (float *)xmalloc((size_t)T * HK * DK * 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HK; h++) {
            float *qh = q + ((size_t)t * HK + h) * DK, *kh = k + ((size_t)t * HK + h) * DK;
            memcpy(qh, c + (size_t)t * stride + h * DK, DK * 4);
            memcpy(kh, c + (size_t)t * stride + HK * DK + h * DK, DK * 4);
            cpu_l2norm(qh, DK, 1e-6f);
            cpu_l2norm(kh, DK, 1e-6f);
            for (int d = 0; d < DK; d++) qh[d] *= 1.0f / sqrtf((float)DK);
        }
    float *g = (float *)xmalloc((size_t)T * HV * 4), *beta = (float *)xmalloc((size_t)T * HV * 4);
    for (int i = 0; i < T * HV; i++) {
        float a = 2.0f * t_randf(&rng);
        g[i] = -0.5f * cpu_softplus(a) * (i % 7 == 0 ? 6.0f : 1.0f) * decay_scale(i % HV);
        beta[i] = cpu_sigmoid(2.0f * t_randf(&rng));
    }
    size_t ns = (size_t)HV * DK * DV;
    float *S0 = (float *)xmalloc(ns * 4), *S = (float *)xmalloc(ns * 4);
    for (size_t i = 0; i < ns; i++) {
        S0[i] = init ? 0.1f * t_randf(&rng) : 0.f;
        if (sb16) S0[i] = tl_bf16_to_f32(tl_f32_to_bf16(S0[i]));
    }
    uint16_t *S16 = (uint16_t *)xmalloc(ns * 2);
    for (size_t i = 0; i < ns; i++) S16[i] = tl_f32_to_bf16(S0[i]);
    memcpy(S, S0, ns * 4);
    float *o = (float *)xmalloc((size_t)T * HV * DV * 4),
          *o_ref = (float *)xmalloc((size_t)DV * T * 2 * 4);
    void *ws = xmalloc(tl_gpu_gdn_chunk_ws_bytes());
    /* io16: bf16 input and output instead of f32 */
    uint16_t *cb = (uint16_t *)xmalloc((size_t)T * stride * 2);
    uint16_t *ob = (uint16_t *)xmalloc((size_t)T * HV * DV * 2);
    for (size_t i = 0; i < (size_t)T * stride; i++) cb[i] = tl_f32_to_bf16(c[i]);
    void *Sp = sb16 ? (void *)S16 : (void *)S;
    int fl = TL_GDN_L2NORM | kern | (sb16 ? TL_GDN_STATE_BF16 : 0);
    int st = io16 ? tl_gpu_gdn_chunk(ob, Sp, cb, cb + HK * DK, cb + 2 * HK * DK, stride, g, beta, T,
                                     fl, ws, NULL)
                  : tl_gpu_gdn_chunk(o, Sp, c, c + HK * DK, c + 2 * HK * DK, stride, g, beta, T,
                                     fl | TL_GDN_IN_F32 | TL_GDN_OUT_F32, ws, NULL);
    if (io16)
        for (size_t i = 0; i < (size_t)T * HV * DV; i++) o[i] = tl_bf16_to_f32(ob[i]);
    if (st) return fprintf(stderr, "status %d\n", st), 1;
    if (sb16)
        for (size_t i = 0; i < ns; i++) S[i] = tl_bf16_to_f32(S16[i]);
    /* oracle per emulated head, and the comparison */
    float *got = (float *)xmalloc((size_t)T * DV * 2 * 4), *Sr = (float *)xmalloc(DK * DV * 4 * 2);
    float *Sg = (float *)xmalloc(DK * DV * 4 * 2);
    for (int e = 0; e < 2; e++) {
        int h = emu_heads[e];
        float *Sh = Sr + (size_t)e * DK * DV;
        memcpy(Sh, S0 + (size_t)h * DK * DV, DK * DV * 4);
        memcpy(Sg + (size_t)e * DK * DV, S + (size_t)h * DK * DV, DK * DV * 4);
        for (int t = 0; t < T; t++) {
            cpu_gdn_step(o_ref + ((size_t)e * T + t) * DV, Sh, q + ((size_t)t * HK + h / 2) * DK,
                         k + ((size_t)t * HK + h / 2) * DK,
                         c + (size_t)t * stride + 2 * HK * DK + h * DV, g + (size_t)t * HV + h,
                         beta + (size_t)t * HV + h, 1, 1, DK, DV);
            memcpy(got + ((size_t)e * T + t) * DV, o + ((size_t)t * HV + h) * DV, DV * 4);
        }
    }
    printf("T=%d init=%d %s%s%s: output nmse %.3e  state nmse %.3e  (heads %d, %d)\n", T, init,
           argv[3], sb16 ? " bf16-state" : "", io16 ? " bf16-io" : "",
           t_nmse(got, o_ref, (size_t)T * DV * 2), t_nmse(Sg, Sr, (size_t)DK * DV * 2),
           emu_heads[0], emu_heads[1]);
    return 0;
}
