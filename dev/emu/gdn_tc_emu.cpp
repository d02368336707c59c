/* Host emulation of tl_gpu_gdn_chunk (src/cuda/k_gdn_chunk.cu compiled unchanged against the
 * device shim dev/emu/cuda/cuda_common.cuh) against cpu_gdn_step, on the inputs of
 * tests/gpu/test_prefill_kernels.c (random, production shapes, the production flags f32 in,
 * f32 out, L2 norm in the kernel), for a few value heads. For checking the tensor-core kernels'
 * indexing without a GPU and for estimating the error of an operand precision before running
 * it: `emu_round_bf16` rounds the emulated tensor-core operands to bf16 instead of tf32 (the
 * choice not built). Not part of the build or of CI; usage (dev/emu/emu_rt.cpp is the emulator's
 * runtime; the library objects for the oracle):
 *   make -j2 cuda
 *   g++ -O2 -std=c++17 -w -Idev/emu -Iinclude -Isrc -Itests dev/emu/gdn_tc_emu.cpp \
 *       dev/emu/emu_rt.cpp build/cuda/src/{common,model,cpu}/[a-z]*.o -ljansson -lm -lpthread \
 *       -o /tmp/gdn_tc_emu
 *   /tmp/gdn_tc_emu T init(0|1) fma|tf32|3xtf32|bf16 [state_bf16 0|1 [io_bf16 0|1]] */
#include "../../src/cuda/k_gdn_chunk.cu"

extern "C" {
#include "t_check.h"
#include "common/util.h"
#include "cpu/cpu.h"
}

alignas(16) float gp_smem[GP_SMEM / 4], gs_smem[GS_SMEM / 4], tp_smem[TP_SMEM / 4],
    ts_smem[TS_SMEM / 4];

static const int emu_heads[] = {0, 3};
static int heads_on(int y) { return y == emu_heads[0] || y == emu_heads[1]; }
int (*emu_head_on)(int) = heads_on;

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
