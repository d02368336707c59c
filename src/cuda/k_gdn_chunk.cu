/* Chunked Gated DeltaNet for prefill (chunk 64, WY / UT-transform form of HF
 * torch_chunk_gated_delta_rule). Two kernels per segment of up to 2048 tokens: a prep kernel
 * computes every chunk's state-independent matrices (T, W, U, masked q k^T) in parallel over
 * (chunk, head) into the caller's workspace, then a sequential kernel walks the chunks of each
 * head in order applying them to the state, which stays f32 in shared memory. Two versions of the
 * pair, chosen per call (TL_GDN_KERN_* in gpu.h, else TL_CUDA_GDN): fp32 FMA throughout
 * (gdn_prep_kernel, gdn_seq_kernel), and tensor cores (mma.sync, fp32 accumulation and state):
 * tf32 operands (gdn_prep_tc_kernel<0>, gdn_seq_h_kernel: the operand matrices stored as fp16,
 * which tf32 holds exactly) or 3xTF32 split operands (gdn_prep_tc_kernel<1>,
 * gdn_seq_tc_kernel<1>: f32 records).
 * Never allocates, never synchronises. Invariant: equals the token-by-token recurrence
 * (cpu_gdn_step) up to fp32 rounding (tf32: up to the operand rounding measured in
 * tests/gpu/test_prefill_kernels.c). dev/kernels/gdn_chunk_v1.cu is the one-kernel version. */
#include <string.h>

#include <cuda_fp16.h>

#include "cuda/cuda_common.cuh"
#include "model/shape.h"

#define GC_L             64  /* chunk length */
#define GC_DK            128 /* key dim = value dim */
#define GC_DVB           32  /* value columns per block of the sequential kernel */
#define GC_THREADS       256
#define GC_KT_LD         65 /* row stride of the k transpose: odd, so its column writes spread banks */
#define GC_SEG           2048 /* tokens per prep/sequential launch pair (bounds the workspace) */
#define GC_NH            TL_GDN_N_V_HEAD
#define TL_MIN_INT(a, b) ((a) < (b) ? (a) : (b))

/* Workspace per (chunk, head), floats: W [64][128], Aqk [64][64] (contiguous with W: one copy),
 * U [64][128], gc [64], Qg = q e^gc [64][128], Kd = k e^{gc_63 - gc} [64][128]. */
#define GC_WS_W      0
#define GC_WS_AQK    (GC_WS_W + GC_L * GC_DK)
#define GC_WS_U      (GC_WS_AQK + GC_L * GC_L)
#define GC_WS_G      (GC_WS_U + GC_L * GC_DK)
#define GC_WS_QG     (GC_WS_G + GC_L)
#define GC_WS_KD     (GC_WS_QG + GC_L * GC_DK)
#define GC_WS_FLOATS (GC_WS_KD + GC_L * GC_DK)

/* The tf32 pair's record (gdn_prep_tc_kernel<0> -> gdn_seq_h_kernel), bytes: W, Aqk, Qg, Kd as
 * fp16, U and gc f32. Those four only ever enter the tensor cores as tf32 operands, whose 10-bit
 * mantissa fp16 holds exactly: rounding them once to fp16 (nearest even) instead of to tf32 at
 * each load (nearest, ties away) gives the same precision over fp16's normal range (|x| >= 2^-14;
 * below it the absolute error stays under 2^-25; q, k are L2-normalised and the decays <= 1, so
 * Qg, Kd, Aqk are bounded by 1, and W = T' (k e^gc) by T'). U stays f32: v_new = U - W S is
 * formed in f32 before it is rounded. 88 KB a record instead of 144. */
#define GH_W     0
#define GH_AQK   (GH_W + GC_L * GC_DK * 2)
#define GH_QG    (GH_AQK + GC_L * GC_L * 2)
#define GH_KD    (GH_QG + GC_L * GC_DK * 2)
#define GH_U     (GH_KD + GC_L * GC_DK * 2)
#define GH_G     (GH_U + GC_L * GC_DK * 4)
#define GH_BYTES (GH_G + GC_L * 4)

/* Where the tensor-core prep writes one record: f32 (SPLIT = 1: 3xTF32 needs the low parts) or
 * the fp16 layout above (SPLIT = 0). */
struct gc_rec {
    void *w, *aqk, *qg, *kd;
    float *u, *g;
};
template <int SPLIT> static __device__ __forceinline__ gc_rec gc_rec_at(void *ws, size_t i) {
    gc_rec r;
    if (SPLIT) {
        float *f = (float *)ws + i * GC_WS_FLOATS;
        r.w = f + GC_WS_W, r.aqk = f + GC_WS_AQK, r.qg = f + GC_WS_QG, r.kd = f + GC_WS_KD;
        r.u = f + GC_WS_U, r.g = f + GC_WS_G;
    } else {
        char *b = (char *)ws + i * GH_BYTES;
        r.w = b + GH_W, r.aqk = b + GH_AQK, r.qg = b + GH_QG, r.kd = b + GH_KD;
        r.u = (float *)(b + GH_U), r.g = (float *)(b + GH_G);
    }
    return r;
}
/* Elements idx, idx + 1 of a record matrix: f32, or fp16 rounded to nearest even. */
template <int SPLIT>
static __device__ __forceinline__ void gc_put2(void *m, int idx, float a, float b) {
    if (SPLIT)
        *(float2 *)((float *)m + idx) = make_float2(a, b);
    else
        *(__half2 *)((__half *)m + idx) = __floats2half2_rn(a, b);
}

/* 4 consecutive values of a bf16 (in_f32 = 0) or f32 row, as f32. */
static __device__ __forceinline__ float4 gc_load4(const void *base, size_t idx, int in_f32) {
    if (in_f32) return *(const float4 *)((const float *)base + idx);
    uint2 r = *(const uint2 *)((const uint16_t *)base + idx);
    return make_float4(bf16x2_lo(r.x), bf16x2_hi(r.x), bf16x2_lo(r.y), bf16x2_hi(r.y));
}

/* Loads rows 8w..8w+7 of a chunk's q and k (key head hk) into f32 [64][128] shared arrays
 * (optionally L2-normalised, q scaled by 1/sqrt(128)) of row stride ld; rows past T are zero.
 * Lane holds dims 4*lane..4*lane+3. Kt (if non-NULL) receives the transpose of k,
 * [128][GC_KT_LD]. */
static __device__ __forceinline__ void gc_load_qk(float *sQ, float *sK, float *sKt, int ld,
                                                  const void *q, const void *k, int tok_stride,
                                                  int hk, int t0, int T, int l2, int in_f32,
                                                  int warp, int lane) {
    /* all 8 rows' loads first, so their latencies overlap (the norms' shuffles would otherwise
     * wait for each row in turn) */
    float4 kr[8], qr[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
        int t = t0 + warp * 8 + u;
        kr[u] = qr[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < T) {
            size_t idx = (size_t)t * tok_stride + hk * GC_DK + 4 * lane;
            kr[u] = gc_load4(k, idx, in_f32), qr[u] = gc_load4(q, idx, in_f32);
        }
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
        int i = warp * 8 + u, t = t0 + i;
        float kv[4] = {kr[u].x, kr[u].y, kr[u].z, kr[u].w};
        float qv[4] = {qr[u].x, qr[u].y, qr[u].z, qr[u].w};
        if (t < T && l2) {
            float sk = kv[0] * kv[0] + kv[1] * kv[1] + kv[2] * kv[2] + kv[3] * kv[3];
            float sq = qv[0] * qv[0] + qv[1] * qv[1] + qv[2] * qv[2] + qv[3] * qv[3];
            for (int off = 16; off > 0; off >>= 1) {
                sk += __shfl_xor_sync(0xffffffffu, sk, off);
                sq += __shfl_xor_sync(0xffffffffu, sq, off);
            }
            float rk = 1.0f / sqrtf(sk + 1e-6f);
            float rq = 1.0f / sqrtf(sq + 1e-6f) * (1.0f / sqrtf((float)GC_DK));
            for (int e = 0; e < 4; e++) kv[e] *= rk, qv[e] *= rq;
        }
        *(float4 *)(sK + i * ld + 4 * lane) = make_float4(kv[0], kv[1], kv[2], kv[3]);
        *(float4 *)(sQ + i * ld + 4 * lane) = make_float4(qv[0], qv[1], qv[2], qv[3]);
        if (sKt)
            for (int e = 0; e < 4; e++) sKt[(4 * lane + e) * GC_KT_LD + i] = kv[e];
    }
}

/* Warp 0: inclusive scan of g over the chunk into sG (and the record's gc, rg), beta into sB (2
 * tokens per lane); padded tokens get g = 0, beta = 0. */
static __device__ __forceinline__ void gc_scan_g(float *sG, float *sB, float *rg, const float *g,
                                                 const float *beta, int t0, int T, int h,
                                                 int lane) {
    float g0 = 0.f, g1 = 0.f, b0 = 0.f, b1 = 0.f;
    int ta = t0 + 2 * lane, tb = ta + 1;
    if (ta < T) g0 = g[(size_t)ta * GC_NH + h], b0 = beta[(size_t)ta * GC_NH + h];
    if (tb < T) g1 = g[(size_t)tb * GC_NH + h], b1 = beta[(size_t)tb * GC_NH + h];
    float s = g0 + g1;
    for (int off = 1; off < 32; off <<= 1) {
        float y = __shfl_up_sync(0xffffffffu, s, off);
        if (lane >= off) s += y;
    }
    float excl = s - (g0 + g1);
    sG[2 * lane] = excl + g0;
    sG[2 * lane + 1] = excl + g0 + g1;
    sB[2 * lane] = b0;
    sB[2 * lane + 1] = b1;
    rg[2 * lane] = excl + g0;
    rg[2 * lane + 1] = excl + g0 + g1;
}

/* T by forward substitution, in place in sA [64][ld] (row stride ld), fp32, threads 0..63 one
 * column each (the others return at once): in, A strictly lower (zero on and above the
 * diagonal); out, (T + I) diag(beta) with T[i][j] = A[i][j] + sum_m A[i][m] T[m][j].
 * note: column j of T depends only on column j of the rows above it, so 64 threads solve
 * independently; A rows are read as warp-wide broadcasts and x[] stays in registers (fully
 * unrolled); x[i] = 0 for i <= j falls out of the recurrence without masking. Each row's sum runs
 * in NACC interleaved partial sums (m mod NACC), so the dependent chain is i / NACC long instead
 * of i (1: gdn_prep_kernel's order, kept as it was). TF32: the output stored rounded to tf32 (the
 * tf32 prep's A operand, tc_load_a_r). The caller synchronises before and after. */
template <int NACC, int TF32>
static __device__ __forceinline__ void gc_solve_T(float *sA, int ld, const float *sB, int tid) {
    if (tid >= GC_L) return;
    const int j = tid;
    float x[GC_L];
#pragma unroll
    for (int i = 0; i < GC_L; i++) {
        float s[NACC];
        s[0] = sA[i * ld + j];
#pragma unroll
        for (int a = 1; a < NACC; a++) s[a] = 0.f;
#pragma unroll
        for (int m = 0; m < i; m++) s[m % NACC] += sA[i * ld + m] * x[m];
#pragma unroll
        for (int w = 1; w < NACC; w *= 2)
#pragma unroll
            for (int a = 0; a + w < NACC; a += 2 * w) s[a] += s[a + w];
        x[i] = s[0];
    }
    bar_sync_named(1, 64);
    float bj = sB[j];
#pragma unroll
    for (int i = 0; i < GC_L; i++) {
        float v = (x[i] + (i == j ? 1.f : 0.f)) * bj;
        sA[i * ld + j] = TF32 ? __uint_as_float(tf32_of(v)) : v;
    }
}

/* ====== Prep: chunk-local WY matrices, parallel over (chunk, head). ======
 * math (chunk tokens i, j = 0..63, gc_i = sum_{t<=i} g_t, HF notation):
 *   A   = -(beta k) k^T * exp(gc_i - gc_j), strictly lower
 *   T   = forward substitution T[i][j] = A[i][j] + sum_m A[i][m] T[m][j], then + I
 *   W   = T (k beta e^gc),  U = T (v beta),  Aqk = q k^T * exp(gc_i - gc_j) for j <= i
 * shapes: q, k, v bf16 or f32 (gpu.h); ws chunk-head record (GC_WS_*), floats.
 * threads: block = (chunk, value head), 256 threads; warp w owns rows 8w..8w+7, the lane columns
 *   lane + 32c; threads 0..63 run the forward substitution, one column of T each.
 * bytes: reads q, k (twice per key head), v once; writes 82 KB per chunk and head.
 * reference: through tl_gpu_gdn_chunk against cpu_gdn_step (tests/gpu/test_prefill_kernels.c). */
#define GP_OFF_K  0
#define GP_OFF_KT (GP_OFF_K + GC_L * GC_DK)
#define GP_OFF_Q  (GP_OFF_KT + GC_DK * GC_KT_LD)
#define GP_OFF_V  (GP_OFF_Q + GC_L * GC_DK)
#define GP_OFF_A  (GP_OFF_V + GC_L * GC_DK)
#define GP_OFF_G  (GP_OFF_A + GC_L * GC_L)
#define GP_OFF_B  (GP_OFF_G + GC_L)
#define GP_SMEM   ((GP_OFF_B + GC_L) * 4)

__global__ void __launch_bounds__(GC_THREADS, 1)
    gdn_prep_kernel(float *ws, const void *q, const void *k, const void *v, int tok_stride,
                    const float *g, const float *beta, int t_seg, int T, int l2, int in_f32) {
    pdl_wait(); /* launched with PDL on the batched path: cuda_common.cuh */
    extern __shared__ __align__(16) float gp_smem[];
    float *sK = gp_smem + GP_OFF_K, *sKt = gp_smem + GP_OFF_KT, *sQ = gp_smem + GP_OFF_Q;
    float *sV = gp_smem + GP_OFF_V, *sA = gp_smem + GP_OFF_A, *sG = gp_smem + GP_OFF_G;
    float *sB = gp_smem + GP_OFF_B;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c = blockIdx.x, h = blockIdx.y, hk = h / (TL_GDN_N_V_HEAD / TL_GDN_N_K_HEAD);
    const int t0 = t_seg + c * GC_L;
    float *rec = ws + ((size_t)c * GC_NH + h) * GC_WS_FLOATS;

    gc_load_qk(sQ, sK, sKt, GC_DK, q, k, tok_stride, hk, t0, T, l2, in_f32, warp, lane);
    for (int u = 0; u < 8; u++) {
        int i = warp * 8 + u, t = t0 + i;
        float4 vv = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < T) vv = gc_load4(v, (size_t)t * tok_stride + h * GC_DK + 4 * lane, in_f32);
        *(float4 *)(sV + i * GC_DK + 4 * lane) = vv;
    }
    if (warp == 0) gc_scan_g(sG, sB, rec + GC_WS_G, g, beta, t0, T, h, lane);
    __syncthreads();
    for (int u = 0; u < 8; u++) {
        int i = warp * 8 + u;
        float eq = expf(sG[i]), ek = expf(sG[GC_L - 1] - sG[i]);
        float4 qv = *(const float4 *)(sQ + i * GC_DK + 4 * lane);
        float4 kv = *(const float4 *)(sK + i * GC_DK + 4 * lane);
        *(float4 *)(rec + GC_WS_QG + i * GC_DK + 4 * lane) =
            make_float4(qv.x * eq, qv.y * eq, qv.z * eq, qv.w * eq);
        *(float4 *)(rec + GC_WS_KD + i * GC_DK + 4 * lane) =
            make_float4(kv.x * ek, kv.y * ek, kv.z * ek, kv.w * ek);
    }

    /* A (to smem) and Aqk (to ws): rows i = 8w+u, columns j = lane, lane+32 */
    {
        float ak[8][2], aq[8][2];
        for (int u = 0; u < 8; u++) ak[u][0] = ak[u][1] = aq[u][0] = aq[u][1] = 0.f;
        for (int d = 0; d < GC_DK; d += 4) {
            float kt[4][2];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                kt[e][0] = sKt[(d + e) * GC_KT_LD + lane];
                kt[e][1] = sKt[(d + e) * GC_KT_LD + lane + 32];
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int i = warp * 8 + u;
                float4 kr = *(const float4 *)(sK + i * GC_DK + d);
                float4 qr = *(const float4 *)(sQ + i * GC_DK + d);
#pragma unroll
                for (int cc = 0; cc < 2; cc++) {
                    ak[u][cc] +=
                        kr.x * kt[0][cc] + kr.y * kt[1][cc] + kr.z * kt[2][cc] + kr.w * kt[3][cc];
                    aq[u][cc] +=
                        qr.x * kt[0][cc] + qr.y * kt[1][cc] + qr.z * kt[2][cc] + qr.w * kt[3][cc];
                }
            }
        }
        for (int u = 0; u < 8; u++) {
            int i = warp * 8 + u;
            float gi = sG[i], bi = sB[i];
            for (int cc = 0; cc < 2; cc++) {
                int j = lane + 32 * cc;
                float dec = j <= i ? expf(gi - sG[j]) : 0.f;
                sA[i * GC_L + j] = j < i ? -bi * ak[u][cc] * dec : 0.f;
                rec[GC_WS_AQK + i * GC_L + j] = aq[u][cc] * dec;
            }
        }
    }
    __syncthreads();

    gc_solve_T<1, 0>(sA, GC_L, sB, tid);
    __syncthreads();

    /* W = (T beta)(k e^gc), U = (T beta) v: rows i = 8w+u, columns lane + 32c */
    {
        float w[8][4], uu[8][4];
        for (int u = 0; u < 8; u++)
            for (int cc = 0; cc < 4; cc++) w[u][cc] = uu[u][cc] = 0.f;
        for (int j = 0; j < GC_L; j += 4) {
            float kr[4][4], vr[4][4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float eg = expf(sG[j + e]);
#pragma unroll
                for (int cc = 0; cc < 4; cc++) {
                    kr[e][cc] = sK[(j + e) * GC_DK + lane + 32 * cc] * eg;
                    vr[e][cc] = sV[(j + e) * GC_DK + lane + 32 * cc];
                }
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                float4 t4 = *(const float4 *)(sA + (warp * 8 + u) * GC_L + j);
                float tt[4] = {t4.x, t4.y, t4.z, t4.w};
#pragma unroll
                for (int e = 0; e < 4; e++)
#pragma unroll
                    for (int cc = 0; cc < 4; cc++) {
                        w[u][cc] += tt[e] * kr[e][cc];
                        uu[u][cc] += tt[e] * vr[e][cc];
                    }
            }
        }
        for (int u = 0; u < 8; u++) {
            int i = warp * 8 + u;
            for (int cc = 0; cc < 4; cc++) {
                rec[GC_WS_W + i * GC_DK + lane + 32 * cc] = w[u][cc];
                rec[GC_WS_U + i * GC_DK + lane + 32 * cc] = uu[u][cc];
            }
        }
    }
}

/* ====== Sequential pass over the chunks of one head. ======
 * math: v_new = U - W S;  o = Qg S + Aqk v_new;  S = e^{gc_63} S + Kd^T v_new
 *   (Qg = q e^gc, Kd = k e^{gc_63 - gc} from the prep kernel)
 * shapes: state f32 [32][128][128], or bf16 with TL_GDN_STATE_BF16 (f32 in shared memory, rounded
 *   back once at the end) (slice of 32 value columns per block); o [T, 32, 128].
 * threads: block = (value-column slice, value head), NW = 8 warps; the first two steps map
 *   warp w to chunk rows (64/NW)w.. and the lane to a column; the state update maps warp w to
 *   state rows (128/NW)w... (16 warps measured 4 % slower, notes/2026-12-02-prefill-kernels.md.)
 * Every input of the next chunk is fetched with cp.async while this one computes: W, Aqk, U slice,
 * gc into a second buffer at the start, Qg once step 1 is done with Q, Kd after the state update
 * (it is only needed at the end of the next chunk). bytes: per chunk W 32 KB + Aqk 16 KB + U slice
 * 8 KB + Qg, Kd 64 KB (the 4 slice blocks of a head share them through L2); S read and written
 * once. reference: through tl_gpu_gdn_chunk against cpu_gdn_step
 * (tests/gpu/test_prefill_kernels.c). */
#define GS_OFF_K      0
#define GS_OFF_Q      (GS_OFF_K + GC_L * GC_DK)
#define GS_OFF_S      (GS_OFF_Q + GC_L * GC_DK)
#define GS_OFF_BUF    (GS_OFF_S + GC_DK * GC_DVB) /* 2 buffers of W, Aqk, U slice, gc */
#define GS_BUF_W      0
#define GS_BUF_AQK    (GS_BUF_W + GC_L * GC_DK)
#define GS_BUF_U      (GS_BUF_AQK + GC_L * GC_L)
#define GS_BUF_G      (GS_BUF_U + GC_L * GC_DVB)
#define GS_BUF_FLOATS (GS_BUF_G + GC_L)
#define GS_SMEM       ((GS_OFF_BUF + 2 * GS_BUF_FLOATS) * 4)

template <int NW>
__global__ void __launch_bounds__(NW * 32, 1)
    gdn_seq_kernel(void *o, void *state, const float *ws, int t_seg, int n_chunks, int T,
                   int flags) {
    pdl_wait(); /* launched with PDL on the batched path: cuda_common.cuh */
    extern __shared__ __align__(16) float gs_smem[];
    float *sK = gs_smem + GS_OFF_K, *sQ = gs_smem + GS_OFF_Q, *sS = gs_smem + GS_OFF_S;
    constexpr int THREADS = NW * 32, RW = GC_L / NW, RS = GC_DK / NW; /* rows per warp */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.y;
    const int c0 = blockIdx.x * GC_DVB;
    const int out_f32 = flags & TL_GDN_OUT_F32;
    const int s_bf16 = flags & TL_GDN_STATE_BF16;
    float *Sg = (float *)state + (size_t)h * GC_DK * GC_DK;       /* f32 state */
    uint16_t *Sb = (uint16_t *)state + (size_t)h * GC_DK * GC_DK; /* bf16 state */

    auto rec_of = [&](int c) { return ws + ((size_t)c * GC_NH + h) * GC_WS_FLOATS; };
    auto fetch_buf =
        [&](int c) { /* W, Aqk, U slice, gc of chunk c */
                     if (c >= n_chunks) return;
                     float *buf = gs_smem + GS_OFF_BUF + (c & 1) * GS_BUF_FLOATS;
                     const float *rec = rec_of(c);
                     for (int i = tid; i < (GC_L * GC_DK + GC_L * GC_L) / 4; i += THREADS)
                         cp_async16(buf + 4 * i, rec + GC_WS_W + 4 * i, 16);
                     for (int i = tid; i < GC_L * GC_DVB / 4; i += THREADS) {
                         int r = i / (GC_DVB / 4), cc = i % (GC_DVB / 4);
                         cp_async16(buf + GS_BUF_U + r * GC_DVB + 4 * cc,
                                    rec + GC_WS_U + r * GC_DK + c0 + 4 * cc, 16);
                     }
                     if (tid < GC_L / 4)
                         cp_async16(buf + GS_BUF_G + 4 * tid, rec + GC_WS_G + 4 * tid, 16);
        };
    auto fetch_rows = [&](float *dst, int c,
                          int off) { /* Qg or Kd of chunk c */
                                     if (c >= n_chunks) return;
                                     const float *src = rec_of(c) + off;
                                     for (int i = tid; i < GC_L * GC_DK / 4; i += THREADS)
                                         cp_async16(dst + 4 * i, src + 4 * i, 16);
    };

    for (int u = 0; u < RS; u++) {
        int d = warp * RS + u;
        size_t i = (size_t)d * GC_DK + c0 + lane;
        sS[d * GC_DVB + lane] = s_bf16 ? bf2f(Sb[i]) : Sg[i];
    }
    /* note: cp.async groups, in commit order: buf_0, Q_0, K_0, then per chunk c: buf_{c+1},
     * Q_{c+1}, K_{c+1} (empty past the end), so "all but the newest 1 / 2" below name exactly the
     * groups each step needs. */
    fetch_buf(0);
    cp_async_commit();
    fetch_rows(sQ, 0, GC_WS_QG);
    cp_async_commit();
    fetch_rows(sK, 0, GC_WS_KD);
    cp_async_commit();

    for (int c = 0; c < n_chunks; c++) {
        const int t0 = t_seg + c * GC_L;
        float *buf = gs_smem + GS_OFF_BUF + (c & 1) * GS_BUF_FLOATS;
        const float *sW = buf + GS_BUF_W, *sAqk = buf + GS_BUF_AQK, *sG = buf + GS_BUF_G;
        float *sU = buf + GS_BUF_U;
        cp_async_wait<1>(); /* buf_c and Q_c (K_c may still be in flight) */
        __syncthreads();
        fetch_buf(c + 1);
        cp_async_commit();

        /* v_new = U - W S; o = Qg S: rows i = 8w+u, column lane */
        float vp[RW], oi[RW];
        for (int u = 0; u < RW; u++) vp[u] = oi[u] = 0.f;
        for (int d = 0; d < GC_DK; d += 4) {
            float s4[4];
#pragma unroll
            for (int e = 0; e < 4; e++) s4[e] = sS[(d + e) * GC_DVB + lane];
#pragma unroll
            for (int u = 0; u < RW; u++) {
                int i = warp * RW + u;
                float4 wr = *(const float4 *)(sW + i * GC_DK + d);
                float4 qr = *(const float4 *)(sQ + i * GC_DK + d);
                vp[u] += wr.x * s4[0] + wr.y * s4[1] + wr.z * s4[2] + wr.w * s4[3];
                oi[u] += qr.x * s4[0] + qr.y * s4[1] + qr.z * s4[2] + qr.w * s4[3];
            }
        }
        for (int u = 0; u < RW; u++) sU[(warp * RW + u) * GC_DVB + lane] -= vp[u];
        __syncthreads(); /* v_new complete; Q free */
        fetch_rows(sQ, c + 1, GC_WS_QG);
        cp_async_commit();

        /* o += Aqk v_new */
        for (int j = 0; j < GC_L; j += 4) {
            float vn[4];
#pragma unroll
            for (int e = 0; e < 4; e++) vn[e] = sU[(j + e) * GC_DVB + lane];
#pragma unroll
            for (int u = 0; u < RW; u++) {
                float4 a4 = *(const float4 *)(sAqk + (warp * RW + u) * GC_L + j);
                oi[u] += a4.x * vn[0] + a4.y * vn[1] + a4.z * vn[2] + a4.w * vn[3];
            }
        }
        for (int u = 0; u < RW; u++) {
            int t = t0 + warp * RW + u;
            if (t >= T) continue;
            size_t idx = ((size_t)t * GC_NH + h) * GC_DK + c0 + lane;
            if (out_f32)
                ((float *)o)[idx] = oi[u];
            else
                ((__nv_bfloat16 *)o)[idx] = __float2bfloat16_rn(oi[u]);
        }

        /* S = e^{gL} S + Kd^T v_new: rows d = 16w+u, column lane */
        cp_async_wait<2>(); /* K_c */
        __syncthreads();
        {
            float acc[RS];
            for (int u = 0; u < RS; u++) acc[u] = 0.f;
            for (int j = 0; j < GC_L; j++) {
                float vn = sU[j * GC_DVB + lane];
#pragma unroll
                for (int u4 = 0; u4 < RS / 4; u4++) {
                    float4 kr = *(const float4 *)(sK + j * GC_DK + warp * RS + 4 * u4);
                    acc[4 * u4 + 0] += kr.x * vn;
                    acc[4 * u4 + 1] += kr.y * vn;
                    acc[4 * u4 + 2] += kr.z * vn;
                    acc[4 * u4 + 3] += kr.w * vn;
                }
            }
            float egl = expf(sG[GC_L - 1]);
            for (int u = 0; u < RS; u++) {
                int d = warp * RS + u;
                sS[d * GC_DVB + lane] = sS[d * GC_DVB + lane] * egl + acc[u];
            }
        }
        __syncthreads(); /* K free, S updated */
        fetch_rows(sK, c + 1, GC_WS_KD);
        cp_async_commit();
    }
    cp_async_wait<0>();

    for (int u = 0; u < RS; u++) {
        int d = warp * RS + u;
        size_t i = (size_t)d * GC_DK + c0 + lane;
        if (s_bf16)
            Sb[i] = f2bf(sS[d * GC_DVB + lane]);
        else
            Sg[i] = sS[d * GC_DVB + lane];
    }
}

/* ====== Tensor-core versions: mma.sync m16n8k8 with tf32 operands, fp32 accumulate ======
 * The same two passes, every product on the tensor cores; the state stays f32 in shared memory
 * between chunks. The 3xTF32 pair keeps the FMA pair's f32 records; the tf32 pair writes fp16
 * operand records (GH_*) for its own sequential kernel (gdn_seq_h_kernel). SPLIT = 0: operands
 * rounded to tf32 (10-bit mantissa, relative 2^-11). SPLIT = 1: 3xTF32, x = hi + lo with hi =
 * tf32(x), lo = tf32(x - hi), a b ~ hi*hi + hi*lo + lo*hi (the dropped lo*lo and the rounding of lo
 * leave ~2^-21 relative: fp32-like products, 3x the mma). Fragment layout of m16n8k8.tf32 (PTX ISA,
 * "Matrix Fragments for mma.m16n8k8"), g = lane / 4, t = lane % 4: a0 (row g, col t), a1 (g + 8,
 * t), a2 (g, t + 4), a3 (g + 8, t + 4); b0 (k t, n g), b1 (k t + 4, n g); c0, c1 (row g, cols 2t,
 * 2t + 1), c2, c3 (row g + 8, same cols). Shared-memory row strides are padded so that the fragment
 * loads are free of bank conflicts: row-major A and n-major B read address row*ld + t (+ g*ld),
 * which wants ld = 4 mod 32; k-major B and transposed A read t*ld + g, which wants ld = 8 mod 32.
 */

struct tc_frag_a {
    uint32_t h[4], l[4]; /* hi and (SPLIT) lo parts */
};
struct tc_frag_b {
    uint32_t h[2], l[2];
};

template <int SPLIT>
static __device__ __forceinline__ void tc_split(uint32_t &h, uint32_t &l, float x) {
    h = tf32_of(x);
    if (SPLIT) l = tf32_of(x - __uint_as_float(h));
}

/* A fragment of the 16x8 block at column k0 of A (origin at the tile's first row): A(m, k) =
 * A[m * ld + k], or A[k * ld + m] when AT (A stored transposed). */
template <int SPLIT, bool AT>
static __device__ __forceinline__ void tc_load_a(tc_frag_a &f, const float *A, int ld, int k0,
                                                 int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int m = g + 8 * (e & 1), k = k0 + t + 4 * (e >> 1);
        tc_split<SPLIT>(f.h[e], f.l[e], AT ? A[k * ld + m] : A[m * ld + k]);
    }
}
/* The same from an fp16 matrix (the tf32 record's operands): fp16 is exact in tf32, so the value
 * widened to f32 is the operand, no rounding (SPLIT = 0 only). */
template <int SPLIT, bool AT>
static __device__ __forceinline__ void tc_load_a(tc_frag_a &f, const __half *A, int ld, int k0,
                                                 int lane) {
    static_assert(SPLIT == 0, "fp16 operands are for the tf32 kernels");
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int m = g + 8 * (e & 1), k = k0 + t + 4 * (e >> 1);
        f.h[e] = __float_as_uint(__half2float(AT ? A[k * ld + m] : A[m * ld + k]));
    }
}

/* B fragment of the 8x8 block at row k0 of B (origin at the tile's first column): B(k, n) =
 * B[k * ld + n], or B[n * ld + k] when BT. */
template <int SPLIT, bool BT>
static __device__ __forceinline__ void tc_load_b(tc_frag_b &f, const float *B, int ld, int k0,
                                                 int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        int k = k0 + t + 4 * e;
        tc_split<SPLIT>(f.h[e], f.l[e], BT ? B[g * ld + k] : B[k * ld + g]);
    }
}

/* d += a b, the small terms first. */
template <int SPLIT>
static __device__ __forceinline__ void tc_mma(float (&d)[4], const tc_frag_a &a,
                                              const tc_frag_b &b) {
    if (SPLIT) {
        mma_tf32(d, a.l, b.h[0], b.h[1]);
        mma_tf32(d, a.h, b.l[0], b.l[1]);
    }
    mma_tf32(d, a.h, b.h[0], b.h[1]);
}

/* ====== Prep on tensor cores ======
 * math: as gdn_prep_kernel. K K^T and q K^T [64x64, k = 128], then W = T' (k e^gc) and U = T' v
 * [64x128, k = 64] with T' = (T + I) diag(beta), by mma; T itself by the fp32 forward
 * substitution of gc_solve_T (64 independent columns, 4 partial sums per row; a blocked mma
 * solve is not done) on warps 0-1 while warps 2-7 write Qg, Kd and e^gc, then load v over q.
 *   Shared memory holds k (then k e^gc over it), q-then-v, A / T' and the gates (87 KB): two
 *   blocks an SM, so one block's loads and solve overlap the other's products; v loads during
 *   the solve instead of up front. k e^gc, v and T' are stored as the W / U products' operands
 *   (tc_round: tf32 bits with SPLIT = 0), so those loops load no conversions.
 * shapes: as gdn_prep_kernel; the record of gc_rec_at (fp16 operands with SPLIT = 0).
 * threads: block = (chunk, value head), 256 threads. K K^T, q K^T: warp w owns rows 16(w/2)..
 *   and columns 32(w%2).. (warps 1 and 3 hold only zeros above the diagonal and skip the mma).
 *   W, U: warp w owns rows 16(w%4).. and columns 64(w/4)..; T' is lower triangular, so row block
 *   r needs only its first 16(r+1) columns.
 * bytes: as gdn_prep_kernel. reference: through tl_gpu_gdn_chunk against cpu_gdn_step
 * (tests/gpu/test_prefill_kernels.c). */
#define TP_LDK    132 /* q, k rows (row-major A, n-major B): 4 mod 32 */
#define TP_LDV    136 /* v rows (k-major B): 8 mod 32 */
#define TP_LDT    68  /* A, then T' (row-major A) */
#define TP_OFF_K  0
#define TP_OFF_QV (TP_OFF_K + GC_L * TP_LDK) /* q [64][TP_LDK], later v [64][TP_LDV] */
#define TP_OFF_A  (TP_OFF_QV + GC_L * TP_LDV)
#define TP_OFF_G  (TP_OFF_A + GC_L * TP_LDT)
#define TP_OFF_B  (TP_OFF_G + GC_L)
#define TP_SMEM   ((TP_OFF_B + GC_L) * 4) /* 87 KB: two blocks an SM */

/* A (strictly lower, into sA) and Aqk (into the record) from K K^T and q K^T. */
template <int SPLIT>
static __device__ __forceinline__ void tp_kk_qk(float *sA, const gc_rec &rec, const float *sK,
                                                const float *sQ, const float *sG, const float *sB,
                                                int warp, int lane) {
    const int mt = warp >> 1, nh = warp & 1, g = lane >> 2, t = lane & 3;
    float ak[4][4], aq[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) ak[nt][e] = aq[nt][e] = 0.f;
    if (!(nh == 1 && mt < 2)) {
#pragma unroll 2
        for (int k0 = 0; k0 < GC_DK; k0 += 8) {
            tc_frag_a fk, fq;
            tc_load_a<SPLIT, false>(fk, sK + 16 * mt * TP_LDK, TP_LDK, k0, lane);
            tc_load_a<SPLIT, false>(fq, sQ + 16 * mt * TP_LDK, TP_LDK, k0, lane);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                tc_frag_b fb;
                tc_load_b<SPLIT, true>(fb, sK + (32 * nh + 8 * nt) * TP_LDK, TP_LDK, k0, lane);
                tc_mma<SPLIT>(ak[nt], fk, fb);
                tc_mma<SPLIT>(aq[nt], fq, fb);
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int i = 16 * mt + g + 8 * r, j = 32 * nh + 8 * nt + 2 * t;
            float gi = sG[i], bi = sB[i], a2[2], q2[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float dec = j + e <= i ? expf(gi - sG[j + e]) : 0.f;
                a2[e] = j + e < i ? -bi * ak[nt][2 * r + e] * dec : 0.f;
                q2[e] = aq[nt][2 * r + e] * dec;
            }
            *(float2 *)(sA + i * TP_LDT + j) = make_float2(a2[0], a2[1]);
            gc_put2<SPLIT>(rec.aqk, i * GC_L + j, q2[0], q2[1]);
        }
}

/* B operands stored already rounded (SPLIT = 0): the prep's k e^gc and v, the sequential
 * kernels' S (a rounded copy beside it) and v_new (in place) are written through tc_round, so a
 * fragment is their bits, with no conversion at each of the several loads of every value; with
 * SPLIT = 1 they are f32 and split as they load. The same operands either way. */
template <int SPLIT>
static __device__ __forceinline__ void tc_load_b_r(tc_frag_b &f, const float *B, int ld, int k0,
                                                   int lane) {
    if (SPLIT) return tc_load_b<SPLIT, false>(f, B, ld, k0, lane);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e = 0; e < 2; e++) f.h[e] = __float_as_uint(B[(k0 + t + 4 * e) * ld + g]);
}
/* The same for a row-major A operand (the prep's T', stored rounded by gc_solve_T). */
template <int SPLIT>
static __device__ __forceinline__ void tc_load_a_r(tc_frag_a &f, const float *A, int ld, int k0,
                                                   int lane) {
    if (SPLIT) return tc_load_a<SPLIT, false>(f, A, ld, k0, lane);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e = 0; e < 4; e++)
        f.h[e] = __float_as_uint(A[(g + 8 * (e & 1)) * ld + k0 + t + 4 * (e >> 1)]);
}
template <int SPLIT> static __device__ __forceinline__ float tc_round(float x) {
    return SPLIT ? x : __uint_as_float(tf32_of(x));
}
template <int SPLIT> static __device__ __forceinline__ float4 tc_round4(float4 v) {
    return make_float4(tc_round<SPLIT>(v.x), tc_round<SPLIT>(v.y), tc_round<SPLIT>(v.z),
                       tc_round<SPLIT>(v.w));
}

/* W = T' (k e^gc) and U = T' v into the record (sKg: k e^gc, in place of k; both B operands
 * stored through tc_round). */
template <int SPLIT>
static __device__ __forceinline__ void tp_wu(const gc_rec &rec, const float *sA, const float *sKg,
                                             const float *sV, int warp, int lane) {
    const int mt = warp & 3, nh = warp >> 2, g = lane >> 2, t = lane & 3;
    float aw[8][4], au[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) aw[nt][e] = au[nt][e] = 0.f;
    for (int k0 = 0; k0 < 16 * (mt + 1); k0 += 8) {
        tc_frag_a ft;
        tc_load_a_r<SPLIT>(ft, sA + 16 * mt * TP_LDT, TP_LDT, k0, lane);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            tc_frag_b fk, fv;
            tc_load_b_r<SPLIT>(fk, sKg + 64 * nh + 8 * nt, TP_LDK, k0, lane);
            tc_load_b_r<SPLIT>(fv, sV + 64 * nh + 8 * nt, TP_LDV, k0, lane);
            tc_mma<SPLIT>(aw[nt], ft, fk);
            tc_mma<SPLIT>(au[nt], ft, fv);
        }
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int i = 16 * mt + g + 8 * r, n = 64 * nh + 8 * nt + 2 * t;
            gc_put2<SPLIT>(rec.w, i * GC_DK + n, aw[nt][2 * r], aw[nt][2 * r + 1]);
            *(float2 *)(rec.u + i * GC_DK + n) = make_float2(au[nt][2 * r], au[nt][2 * r + 1]);
        }
}

template <int SPLIT>
__global__ void __launch_bounds__(GC_THREADS, 2)
    gdn_prep_tc_kernel(float *ws, const void *q, const void *k, const void *v, int tok_stride,
                       const float *g, const float *beta, int t_seg, int T, int l2, int in_f32) {
    pdl_wait(); /* launched with PDL on the batched path: cuda_common.cuh */
    extern __shared__ __align__(16) float tp_smem[];
    float *sK = tp_smem + TP_OFF_K, *sQV = tp_smem + TP_OFF_QV, *sA = tp_smem + TP_OFF_A;
    float *sG = tp_smem + TP_OFF_G, *sB = tp_smem + TP_OFF_B;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c = blockIdx.x, h = blockIdx.y, hk = h / (TL_GDN_N_V_HEAD / TL_GDN_N_K_HEAD);
    const int t0 = t_seg + c * GC_L;
    const gc_rec rec = gc_rec_at<SPLIT>(ws, (size_t)c * GC_NH + h);

    gc_load_qk(sQV, sK, NULL, TP_LDK, q, k, tok_stride, hk, t0, T, l2, in_f32, warp, lane);
    if (warp == 0) gc_scan_g(sG, sB, rec.g, g, beta, t0, T, h, lane);
    __syncthreads();
    tp_kk_qk<SPLIT>(sA, rec, sK, sQV, sG, sB, warp, lane);
    __syncthreads();
    if (warp < 2) {
        gc_solve_T<4, !SPLIT>(sA, TP_LDT, sB, tid);
    } else {
        /* meanwhile warps 2..7: Qg = q e^gc, Kd = k e^{gc_63 - gc} (to the record), k e^gc over
         * k (each warp its own rows), then v over q (q's last reader is this loop) */
        for (int i = warp - 2; i < GC_L; i += 6) {
            float eq = expf(sG[i]), ek = expf(sG[GC_L - 1] - sG[i]);
            float4 qv = *(const float4 *)(sQV + i * TP_LDK + 4 * lane);
            float4 kv = *(const float4 *)(sK + i * TP_LDK + 4 * lane);
            const int e = i * GC_DK + 4 * lane;
            gc_put2<SPLIT>(rec.qg, e, qv.x * eq, qv.y * eq);
            gc_put2<SPLIT>(rec.qg, e + 2, qv.z * eq, qv.w * eq);
            gc_put2<SPLIT>(rec.kd, e, kv.x * ek, kv.y * ek);
            gc_put2<SPLIT>(rec.kd, e + 2, kv.z * ek, kv.w * ek);
            *(float4 *)(sK + i * TP_LDK + 4 * lane) =
                tc_round4<SPLIT>(make_float4(kv.x * eq, kv.y * eq, kv.z * eq, kv.w * eq));
        }
        bar_sync_named(2, GC_THREADS - 64);
        float4 vv[11]; /* rows warp - 2 + 6 u: every load issued before the first store */
#pragma unroll
        for (int u = 0; u < 11; u++) {
            int i = warp - 2 + 6 * u, t = t0 + i;
            vv[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (i < GC_L && t < T)
                vv[u] = gc_load4(v, (size_t)t * tok_stride + h * GC_DK + 4 * lane, in_f32);
        }
#pragma unroll
        for (int u = 0; u < 11; u++) {
            int i = warp - 2 + 6 * u;
            if (i < GC_L) *(float4 *)(sQV + i * TP_LDV + 4 * lane) = tc_round4<SPLIT>(vv[u]);
        }
    }
    __syncthreads();
    tp_wu<SPLIT>(rec, sA, sK, sQV, warp, lane);
}

/* ====== Sequential pass on tensor cores over f32 records (3xTF32: SPLIT = 1) ======
 * math: as gdn_seq_kernel: v_new = U - W S; o = Qg S + Aqk v_new; S = e^{gc_63} S + Kd^T v_new,
 *   each product by mma (W S, Qg S: [64x128] x [128x32]; Aqk v_new: [64x64] x [64x32], lower
 *   triangular, so row block r needs 16(r+1) columns; Kd^T v_new: [128x64] x [64x32]). The
 *   state slice stays f32 in shared memory across all chunks of the launch; only its operand
 *   copies are rounded (tf32, or split with SPLIT), never the state itself.
 * shapes: as gdn_seq_kernel.
 * threads: block = (32-column slice of the value dim, value head), 8 warps. W S, Qg S, Aqk v_new:
 *   warp w owns output rows 16(w%4).. and columns 16(w/4)..; the state update: warp w owns state
 *   rows 16w.. and all 32 columns.
 * The cp.async pipeline is gdn_seq_kernel's (the same groups in the same order), into padded
 * rows. bytes: as gdn_seq_kernel. reference: through tl_gpu_gdn_chunk against cpu_gdn_step
 * (tests/gpu/test_prefill_kernels.c). */
#define TS_LDW        132 /* W, Qg rows (row-major A): 4 mod 32 */
#define TS_LDKD       136 /* Kd rows (transposed A): 8 mod 32 */
#define TS_LDA        68  /* Aqk rows (row-major A) */
#define TS_LDS        40  /* state slice [128][32] and U / v_new slice [64][32] (k-major B) */
#define TS_OFF_S      0
#define TS_OFF_Q      (TS_OFF_S + GC_DK * TS_LDS)
#define TS_OFF_K      (TS_OFF_Q + GC_L * TS_LDW)
#define TS_OFF_BUF    (TS_OFF_K + GC_L * TS_LDKD) /* 2 buffers of W, Aqk, U slice, gc */
#define TS_BUF_W      0
#define TS_BUF_AQK    (TS_BUF_W + GC_L * TS_LDW)
#define TS_BUF_U      (TS_BUF_AQK + GC_L * TS_LDA)
#define TS_BUF_G      (TS_BUF_U + GC_L * TS_LDS)
#define TS_BUF_FLOATS (TS_BUF_G + GC_L)
#define TS_SMEM       ((TS_OFF_BUF + 2 * TS_BUF_FLOATS) * 4)

/* Copies (cp.async) ROWS x N16 16-byte pieces from src (row stride SLD bytes) to dst (DLD): each
 * thread its ROWS * N16 / GC_THREADS pieces at constant strides (no loop, no division: the
 * generic loop with a thread-dependent trip count was ~20% of gdn_seq_h's stall samples). Both
 * tensor-core sequential kernels copy through it. */
template <int ROWS, int N16, int DLD, int SLD>
static __device__ __forceinline__ void gc_fetch(char *dst, const char *src, int tid) {
    static_assert((ROWS * N16) % GC_THREADS == 0 && GC_THREADS % N16 == 0, "whole passes");
    constexpr int RSTEP = GC_THREADS / N16; /* rows a pass */
    const int r = tid / N16, cc = tid % N16;
    dst += r * DLD + 16 * cc;
    src += (size_t)r * SLD + 16 * cc;
#pragma unroll
    for (int j = 0; j < ROWS * N16 / GC_THREADS; j++)
        cp_async16(dst + j * RSTEP * DLD, src + (size_t)j * RSTEP * SLD, 16);
}

/* 64 rows of COLS floats, row strides DLD / SLD floats (gc_fetch). */
template <int COLS, int DLD, int SLD>
static __device__ __forceinline__ void ts_fetch(float *dst, const float *src, int tid) {
    gc_fetch<GC_L, COLS / 4, DLD * 4, SLD * 4>((char *)dst, (const char *)src, tid);
}

/* The output tile of one warp: rows 16 mt.., columns c0 + 16 nh.. (2 n-tiles), o f32 or bf16. */
static __device__ __forceinline__ void ts_store_o(void *o, const float (&oo)[2][4], int out_f32,
                                                  int t0, int T, int h, int col, int mt, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int tt = t0 + 16 * mt + g + 8 * r;
            if (tt >= T) continue;
            size_t idx = ((size_t)tt * GC_NH + h) * GC_DK + col + 8 * nt + 2 * t;
            if (out_f32)
                *(float2 *)((float *)o + idx) = make_float2(oo[nt][2 * r], oo[nt][2 * r + 1]);
            else
                *(uint32_t *)((uint16_t *)o + idx) = bf16x2_pack(oo[nt][2 * r], oo[nt][2 * r + 1]);
        }
}

/* W, Aqk, the U slice (columns c0..c0+31) and gc of one chunk record into a buffer. */
static __device__ __forceinline__ void ts_fetch_buf(float *buf, const float *rec, int c0, int tid) {
    ts_fetch<GC_DK, TS_LDW, GC_DK>(buf + TS_BUF_W, rec + GC_WS_W, tid);
    ts_fetch<GC_L, TS_LDA, GC_L>(buf + TS_BUF_AQK, rec + GC_WS_AQK, tid);
    ts_fetch<GC_DVB, TS_LDS, GC_DK>(buf + TS_BUF_U, rec + GC_WS_U + c0, tid);
    if (tid < GC_L / 4) cp_async16(buf + TS_BUF_G + 4 * tid, rec + GC_WS_G + 4 * tid, 16);
}

/* The state slice [128][32] between global (f32, or bf16 with s_bf16) and shared memory. */
static __device__ __forceinline__ void ts_state_io(float *sS, void *state, int h, int c0,
                                                   int s_bf16, int store, int tid) {
    float *Sg = (float *)state + (size_t)h * GC_DK * GC_DK;
    uint16_t *Sb = (uint16_t *)state + (size_t)h * GC_DK * GC_DK;
    for (int i = tid; i < GC_DK * GC_DVB; i += GC_THREADS) {
        int d = i / GC_DVB, cc = i % GC_DVB;
        size_t gi = (size_t)d * GC_DK + c0 + cc;
        float *ss = sS + d * TS_LDS + cc;
        if (store && s_bf16)
            Sb[gi] = f2bf(*ss);
        else if (store)
            Sg[gi] = *ss;
        else
            *ss = s_bf16 ? bf2f(Sb[gi]) : Sg[gi];
    }
}

/* oo = Qg S and v_new = U - W S (in place of U; tc_round) for the warp's tile: rows 16 mt..,
 * columns 16 nh.. of the slice. sSb: S as the B operand (tc_load_b_r). */
template <int SPLIT, class TA>
static __device__ __forceinline__ void ts_state_products(float (&oo)[2][4], const TA *sW,
                                                         const TA *sQ, int ldw, const float *sSb,
                                                         float *sU, int mt, int nh, int lane) {
    const int g = lane >> 2, t = lane & 3;
    float vp[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) vp[nt][e] = oo[nt][e] = 0.f;
#pragma unroll 4
    for (int k0 = 0; k0 < GC_DK; k0 += 8) {
        tc_frag_a fw, fq;
        tc_load_a<SPLIT, false>(fw, sW + 16 * mt * ldw, ldw, k0, lane);
        tc_load_a<SPLIT, false>(fq, sQ + 16 * mt * ldw, ldw, k0, lane);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            tc_frag_b fs;
            tc_load_b_r<SPLIT>(fs, sSb + 16 * nh + 8 * nt, TS_LDS, k0, lane);
            tc_mma<SPLIT>(vp[nt], fw, fs);
            tc_mma<SPLIT>(oo[nt], fq, fs);
        }
    }
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float2 *p = (float2 *)(sU + (16 * mt + g + 8 * r) * TS_LDS + 16 * nh + 8 * nt + 2 * t);
            float2 u = *p;
            *p = make_float2(tc_round<SPLIT>(u.x - vp[nt][2 * r]),
                             tc_round<SPLIT>(u.y - vp[nt][2 * r + 1]));
        }
}

/* oo += Aqk v_new for the warp's tile (Aqk lower triangular: row block mt needs 16(mt+1)
 * columns). */
template <int SPLIT, class TA>
static __device__ __forceinline__ void ts_aqk(float (&oo)[2][4], const TA *sAqk, int lda,
                                              const float *sU, int mt, int nh, int lane) {
    for (int k0 = 0; k0 < 16 * (mt + 1); k0 += 8) {
        tc_frag_a fa;
        tc_load_a<SPLIT, false>(fa, sAqk + 16 * mt * lda, lda, k0, lane);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            tc_frag_b fv;
            tc_load_b_r<SPLIT>(fv, sU + 16 * nh + 8 * nt, TS_LDS, k0, lane);
            tc_mma<SPLIT>(oo[nt], fa, fv);
        }
    }
}

/* S = e^{gc_63} S + Kd^T v_new on state rows 16 warp.. (all 32 columns of the slice); with
 * SPLIT = 0 also its tf32-rounded copy sSr (the products' B operand). */
template <int SPLIT, class TA>
static __device__ __forceinline__ void ts_update(float *sS, float *sSr, const TA *sK, int ldk,
                                                 const float *sU, float egl, int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
    float acc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.f;
#pragma unroll 2
    for (int k0 = 0; k0 < GC_L; k0 += 8) {
        tc_frag_a fk;
        tc_load_a<SPLIT, true>(fk, sK + 16 * warp, ldk, k0, lane);
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            tc_frag_b fv;
            tc_load_b_r<SPLIT>(fv, sU + 8 * nt, TS_LDS, k0, lane);
            tc_mma<SPLIT>(acc[nt], fk, fv);
        }
    }
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = (16 * warp + g + 8 * r) * TS_LDS + 8 * nt + 2 * t;
            float2 s = *(float2 *)(sS + i);
            s.x = s.x * egl + acc[nt][2 * r], s.y = s.y * egl + acc[nt][2 * r + 1];
            *(float2 *)(sS + i) = s;
            if (!SPLIT) *(float2 *)(sSr + i) = make_float2(tc_round<0>(s.x), tc_round<0>(s.y));
        }
}

template <int SPLIT>
__global__ void __launch_bounds__(GC_THREADS, 1)
    gdn_seq_tc_kernel(void *o, void *state, const float *ws, int t_seg, int n_chunks, int T,
                      int flags) {
    pdl_wait(); /* launched with PDL on the batched path: cuda_common.cuh */
    extern __shared__ __align__(16) float ts_smem[];
    float *sS = ts_smem + TS_OFF_S, *sQ = ts_smem + TS_OFF_Q, *sK = ts_smem + TS_OFF_K;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.y, c0 = blockIdx.x * GC_DVB;
    const int mt = warp & 3, nh = warp >> 2; /* W S, Qg S, Aqk v_new tile */
    const int out_f32 = flags & TL_GDN_OUT_F32, s_bf16 = flags & TL_GDN_STATE_BF16;
    const float *rec0 = ws + (size_t)h * GC_WS_FLOATS; /* chunk c: + c * GC_NH * GC_WS_FLOATS */
    const size_t rec_stride = (size_t)GC_NH * GC_WS_FLOATS;

    ts_state_io(sS, state, h, c0, s_bf16, 0, tid);
    /* note: cp.async groups as in gdn_seq_kernel: buf_0, Q_0, K_0, then per chunk c: buf_{c+1},
     * Q_{c+1}, K_{c+1} (empty past the end). */
    ts_fetch_buf(ts_smem + TS_OFF_BUF, rec0, c0, tid);
    cp_async_commit();
    ts_fetch<GC_DK, TS_LDW, GC_DK>(sQ, rec0 + GC_WS_QG, tid);
    cp_async_commit();
    ts_fetch<GC_DK, TS_LDKD, GC_DK>(sK, rec0 + GC_WS_KD, tid);
    cp_async_commit();

    for (int c = 0; c < n_chunks; c++) {
        const int t0 = t_seg + c * GC_L, more = c + 1 < n_chunks;
        const float *next = rec0 + (size_t)(more ? c + 1 : c) * rec_stride; /* chunk c + 1 */
        float *buf = ts_smem + TS_OFF_BUF + (c & 1) * TS_BUF_FLOATS;
        cp_async_wait<1>(); /* buf_c and Q_c (K_c may still be in flight) */
        __syncthreads();
        if (more) ts_fetch_buf(ts_smem + TS_OFF_BUF + ((c + 1) & 1) * TS_BUF_FLOATS, next, c0, tid);
        cp_async_commit();

        float oo[2][4];
        ts_state_products<SPLIT>(oo, buf + TS_BUF_W, sQ, TS_LDW, sS, buf + TS_BUF_U, mt, nh, lane);
        __syncthreads(); /* v_new complete; Q free */
        if (more) ts_fetch<GC_DK, TS_LDW, GC_DK>(sQ, next + GC_WS_QG, tid);
        cp_async_commit();

        ts_aqk<SPLIT>(oo, buf + TS_BUF_AQK, TS_LDA, buf + TS_BUF_U, mt, nh, lane);
        ts_store_o(o, oo, out_f32, t0, T, h, c0 + 16 * nh, mt, lane);

        cp_async_wait<2>(); /* K_c */
        __syncthreads();
        ts_update<SPLIT>(sS, sS, sK, TS_LDKD, buf + TS_BUF_U, expf(buf[TS_BUF_G + GC_L - 1]), warp,
                         lane);
        __syncthreads(); /* K free, S updated */
        if (more) ts_fetch<GC_DK, TS_LDKD, GC_DK>(sK, next + GC_WS_KD, tid);
        cp_async_commit();
    }
    cp_async_wait<0>();
    ts_state_io(sS, state, h, c0, s_bf16, 1, tid);
}

/* ====== Sequential pass over the fp16 records (the tf32 pair) ======
 * math: gdn_seq_tc_kernel's, the same products in the same order (W S, Qg S, Aqk v_new, Kd^T
 *   v_new by mma.sync tf32; W, Aqk, Qg, Kd widened from fp16 exactly, S and v_new rounded to tf32
 *   as there); the state slice stays f32 in shared memory.
 * pipeline: a record is 88 KB, so shared memory holds two chunks' operands (W, Qg, Kd, Aqk, the U
 *   slice, gc: 71 KB a buffer) and chunk c + 1's copies go out as one cp.async group at the start
 *   of step c, a whole step before they are read (the f32 kernel's single Qg and Kd buffers gave
 *   their copies half a step: ncu, session 19, a 2048-token launch 177 us at 31% of DRAM
 *   bandwidth, latency-bound). Two barriers a step: chunk c landed and step c - 1 done (its
 *   buffer free); v_new complete.
 * threads, tiles: gdn_seq_tc_kernel's. reference: through tl_gpu_gdn_chunk against cpu_gdn_step
 *   (tests/gpu/test_prefill_kernels.c). */
#define TH_LDW       136 /* W, Qg rows, fp16 (row-major A): 68 words, 4 mod 32 */
#define TH_LDA       72  /* Aqk rows, fp16 (row-major A): 36 words, 4 mod 32 */
#define TH_LDKD      144 /* Kd rows, fp16 (transposed A): 72 words, 8 mod 32 */
#define TH_W         0   /* byte offsets in a buffer */
#define TH_QG        (TH_W + GC_L * TH_LDW * 2)
#define TH_KD        (TH_QG + GC_L * TH_LDW * 2)
#define TH_AQK       (TH_KD + GC_L * TH_LDKD * 2)
#define TH_U         (TH_AQK + GC_L * TH_LDA * 2) /* f32 [64][TS_LDS] */
#define TH_G         (TH_U + GC_L * TS_LDS * 4)
#define TH_BUF_BYTES (TH_G + GC_L * 4)
#define TH_OFF_SR    (GC_DK * TS_LDS)         /* floats: the state's tf32 copy after it */
#define TH_OFF_BUF   (2 * GC_DK * TS_LDS * 4) /* bytes: the buffers after both */
#define TH_SMEM      (TH_OFF_BUF + 2 * TH_BUF_BYTES)

/* One chunk's record (fp16 layout) into a buffer: W, Qg, Kd, Aqk, the U slice c0.., gc. */
static __device__ __forceinline__ void th_fetch_chunk(char *buf, const char *rec, int c0, int tid) {
    gc_fetch<GC_L, GC_DK / 8, TH_LDW * 2, GC_DK * 2>(buf + TH_W, rec + GH_W, tid);
    gc_fetch<GC_L, GC_DK / 8, TH_LDW * 2, GC_DK * 2>(buf + TH_QG, rec + GH_QG, tid);
    gc_fetch<GC_L, GC_DK / 8, TH_LDKD * 2, GC_DK * 2>(buf + TH_KD, rec + GH_KD, tid);
    gc_fetch<GC_L, GC_L / 8, TH_LDA * 2, GC_L * 2>(buf + TH_AQK, rec + GH_AQK, tid);
    gc_fetch<GC_L, GC_DVB / 4, TS_LDS * 4, GC_DK * 4>(buf + TH_U, rec + GH_U + c0 * 4, tid);
    if (tid < GC_L / 4) cp_async16(buf + TH_G + 16 * tid, rec + GH_G + 16 * tid, 16);
}

__global__ void __launch_bounds__(GC_THREADS, 1)
    gdn_seq_h_kernel(void *o, void *state, const void *ws, int t_seg, int n_chunks, int T,
                     int flags) {
    pdl_wait(); /* launched with PDL on the batched path: cuda_common.cuh */
    extern __shared__ __align__(16) float th_smem[];
    float *sS = th_smem, *sSr = th_smem + TH_OFF_SR;
    char *bufs = (char *)th_smem + TH_OFF_BUF;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.y, c0 = blockIdx.x * GC_DVB;
    const int mt = warp & 3, nh = warp >> 2; /* W S, Qg S, Aqk v_new tile */
    const int out_f32 = flags & TL_GDN_OUT_F32, s_bf16 = flags & TL_GDN_STATE_BF16;
    const char *rec0 = (const char *)ws + (size_t)h * GH_BYTES; /* chunk c: + c * rec_stride */
    const size_t rec_stride = (size_t)GC_NH * GH_BYTES;

    ts_state_io(sS, state, h, c0, s_bf16, 0, tid);
    for (int i = tid; i < GC_DK * GC_DVB; i += GC_THREADS) { /* ts_state_io's elements */
        int e = (i / GC_DVB) * TS_LDS + i % GC_DVB;
        sSr[e] = tc_round<0>(sS[e]);
    }
    th_fetch_chunk(bufs, rec0, c0, tid);
    cp_async_commit();
    for (int c = 0; c < n_chunks; c++) {
        char *buf = bufs + (c & 1) * TH_BUF_BYTES;
        cp_async_wait<0>(); /* chunk c */
        __syncthreads();    /* every thread's part of it; step c - 1 done, its buffer free */
        if (c + 1 < n_chunks)
            th_fetch_chunk(bufs + ((c + 1) & 1) * TH_BUF_BYTES, rec0 + (c + 1) * rec_stride, c0,
                           tid);
        cp_async_commit();
        const __half *sW = (const __half *)(buf + TH_W), *sQ = (const __half *)(buf + TH_QG);
        const __half *sK = (const __half *)(buf + TH_KD), *sA = (const __half *)(buf + TH_AQK);
        float *sU = (float *)(buf + TH_U);
        const float egl = expf(((const float *)(buf + TH_G))[GC_L - 1]);
        float oo[2][4];
        ts_state_products<0>(oo, sW, sQ, TH_LDW, sSr, sU, mt, nh, lane);
        __syncthreads(); /* v_new complete; every warp has read S */
        ts_aqk<0>(oo, sA, TH_LDA, sU, mt, nh, lane);
        ts_store_o(o, oo, out_f32, t_seg + c * GC_L, T, h, c0 + 16 * nh, mt, lane);
        ts_update<0>(sS, sSr, sK, TH_LDKD, sU, egl, warp, lane);
    }
    __syncthreads(); /* every warp's last update */
    ts_state_io(sS, state, h, c0, s_bf16, 1, tid);
}

/* math: g = a_neg softplus(a + dt_bias) (torch softplus, threshold 20), beta = sigmoid(b).
 * threads: one per (token, head). reference: cpu_softplus / cpu_sigmoid in the test. */
__global__ void gdn_gates_kernel(float *g, float *beta, const float *a, const float *b, int ld,
                                 const float *dt_bias, const float *a_neg, int T) {
    pdl_wait(); /* launched with PDL on the batched path: cuda_common.cuh */
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * GC_NH) return;
    int t = i / GC_NH, h = i % GC_NH;
    float x = a[(size_t)t * ld + h] + dt_bias[h];
    g[i] = a_neg[h] * softplus_f(x);
    beta[i] = sigmoid_f(b[(size_t)t * ld + h]);
}

extern "C" int tl_gpu_gdn_gates(float *g, float *beta, const float *a, const float *b, int ld,
                                const float *dt_bias, const float *a_neg, int T,
                                const tl_gpu_stream *st) {
    if (!g || !beta || !a || !b || !dt_bias || !a_neg || T < 0 || ld < GC_NH) return TL_ERR_INVALID;
    if (T == 0) return 0;
    TL_LAUNCH(st, "gdn_gates", gdn_gates_kernel, dim3((T * GC_NH + 255) / 256), dim3(256), 0, g,
              beta, a, b, ld, dt_bias, a_neg, T);
    return 0;
}

extern "C" size_t tl_gpu_gdn_chunk_ws_bytes(void) {
    return (size_t)(GC_SEG / GC_L) * GC_NH * GC_WS_FLOATS * 4;
}

/* The kernel pair of a call: flags' TL_GDN_KERN_* field, else TL_CUDA_GDN (read once; fma,
 * tf32, 3xtf32; default tf32, an unknown value says so on stderr and keeps the default). */
static int gdn_kernel_choice(int flags) {
    static int env = -1;
    if (flags & TL_GDN_KERN_MASK) return flags & TL_GDN_KERN_MASK;
    if (env < 0) {
        const char *e = getenv("TL_CUDA_GDN");
        int v = TL_GDN_KERN_TF32;
        if (e && !strcmp(e, "fma"))
            v = TL_GDN_KERN_FMA;
        else if (e && !strcmp(e, "3xtf32"))
            v = TL_GDN_KERN_3XTF32;
        else if (e && *e && strcmp(e, "tf32"))
            fprintf(stderr, "TL_CUDA_GDN=%s: not fma, tf32 or 3xtf32; using tf32\n", e);
        env = v;
    }
    return env;
}

static int gdn_set_smem(void) {
    CUDA_TRY(cudaFuncSetAttribute(gdn_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  GP_SMEM));
    CUDA_TRY(cudaFuncSetAttribute(gdn_seq_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  GS_SMEM));
    CUDA_TRY(cudaFuncSetAttribute(gdn_prep_tc_kernel<0>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, TP_SMEM));
    CUDA_TRY(cudaFuncSetAttribute(gdn_prep_tc_kernel<1>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, TP_SMEM));
    CUDA_TRY(cudaFuncSetAttribute(gdn_seq_h_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  TH_SMEM));
    CUDA_TRY(cudaFuncSetAttribute(gdn_seq_tc_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  TS_SMEM));
    return 0;
}

extern "C" int tl_gpu_gdn_chunk(void *o, void *state, const void *q, const void *k, const void *v,
                                int tok_stride, const float *g, const float *beta, int T, int flags,
                                void *ws, const tl_gpu_stream *st) {
    if (!o || !state || !q || !k || !v || !g || !beta || !ws || T < 0) return TL_ERR_INVALID;
    if (tok_stride < 0 || tok_stride % 4 || ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) % 16)
        return TL_ERR_INVALID;
    if (T == 0) return 0;
    static int attr_set;
    if (!attr_set) {
        TRY(gdn_set_smem());
        attr_set = 1;
    }
    const int kern = gdn_kernel_choice(flags), l2 = flags & TL_GDN_L2NORM;
    const int in_f32 = flags & TL_GDN_IN_F32;
    const dim3 seq_grid(GC_DK / GC_DVB, GC_NH);
    for (int t_seg = 0; t_seg < T; t_seg += GC_SEG) {
        int n_chunks = (TL_MIN_INT(T - t_seg, GC_SEG) + GC_L - 1) / GC_L;
        dim3 prep_grid(n_chunks, GC_NH);
        const float *cws = (const float *)ws;
        if (kern == TL_GDN_KERN_FMA) {
            TL_LAUNCH(st, "gdn_prep", gdn_prep_kernel, prep_grid, dim3(GC_THREADS), GP_SMEM,
                      (float *)ws, q, k, v, tok_stride, g, beta, t_seg, T, l2, in_f32);
            TL_LAUNCH(st, "gdn_seq", gdn_seq_kernel<8>, seq_grid, dim3(256), GS_SMEM, o, state, cws,
                      t_seg, n_chunks, T, flags);
        } else if (kern == TL_GDN_KERN_TF32) {
            TL_LAUNCH(st, "gdn_prep_tc", gdn_prep_tc_kernel<0>, prep_grid, dim3(GC_THREADS),
                      TP_SMEM, (float *)ws, q, k, v, tok_stride, g, beta, t_seg, T, l2, in_f32);
            TL_LAUNCH(st, "gdn_seq_h", gdn_seq_h_kernel, seq_grid, dim3(GC_THREADS), TH_SMEM, o,
                      state, (const void *)ws, t_seg, n_chunks, T, flags);
        } else {
            TL_LAUNCH(st, "gdn_prep_3xtf32", gdn_prep_tc_kernel<1>, prep_grid, dim3(GC_THREADS),
                      TP_SMEM, (float *)ws, q, k, v, tok_stride, g, beta, t_seg, T, l2, in_f32);
            TL_LAUNCH(st, "gdn_seq_3xtf32", gdn_seq_tc_kernel<1>, seq_grid, dim3(GC_THREADS),
                      TS_SMEM, o, state, cws, t_seg, n_chunks, T, flags);
        }
    }
    return 0;
}
