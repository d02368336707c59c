/* GDN chunked prefill, version 1 (kept for comparison in prefill_bench.cu; llm.c style): one
 * kernel, block = (32 value columns, head), every chunk-local WY matrix recomputed per block and
 * the chunks walked in order. 2.5 ms per layer at T = 4096 on the H200 (notes/2026-12-02-
 * prefill-kernels.md). Superseded by src/cuda/k_gdn_chunk.cu (parallel prep + sequential pass). */
#include "cuda/cuda_common.cuh"
#include "model/shape.h"

#define G1_L       64  /* chunk length */
#define G1_DK      128 /* key dim */
#define G1_DVB     32  /* value columns per block */
#define G1_THREADS 256

/* Shared memory of one block, in floats. */
#define G1_OFF_K   0                           /* K  [64][128]  (L2-normalised keys) */
#define G1_OFF_KT  (G1_OFF_K + G1_L * G1_DK)   /* Kt [128][64]  (transpose of K) */
#define G1_OFF_Q   (G1_OFF_KT + G1_L * G1_DK)  /* Q  [64][128]  (normalised, scaled) */
#define G1_OFF_W   (G1_OFF_Q + G1_L * G1_DK)   /* W  [64][128]  T (k beta e^gc) */
#define G1_OFF_A   (G1_OFF_W + G1_L * G1_DK)   /* A  [64][64]   -beta k k^T decay, then T beta */
#define G1_OFF_AQK (G1_OFF_A + G1_L * G1_L)    /* Aqk [64][64]  q k^T decay (j <= i) */
#define G1_OFF_V   (G1_OFF_AQK + G1_L * G1_L)  /* V  [64][32]   value slice */
#define G1_OFF_U   (G1_OFF_V + G1_L * G1_DVB)  /* U  [64][32]   T v beta, then v_new */
#define G1_OFF_S   (G1_OFF_U + G1_L * G1_DVB)  /* S  [128][32]  state slice */
#define G1_OFF_G   (G1_OFF_S + G1_DK * G1_DVB) /* gc[64] cumulative log decay */
#define G1_OFF_B   (G1_OFF_G + G1_L)           /* beta[64] */
#define G1_FLOATS  (G1_OFF_B + G1_L)
#define G1_SMEM    (G1_FLOATS * 4)

/* math (per value head h, chunk of tokens i = 0..63, gc_i = sum_{t<=i} g_t, HF notation):
 *   A    = -(beta k) k^T * exp(gc_i - gc_j), strictly lower
 *   T    = (I - ...)^-1 by forward substitution: T[i][j] = A[i][j] + sum_m A[i][m] T[m][j], + I
 *   W    = T (k beta e^gc),   U = T (v beta)
 *   v_new = U - W S,  o = (q e^gc) S + (q k^T * exp(gc_i - gc_j), j <= i) v_new
 *   S    = e^{gc_63} S + (k e^{gc_63 - gc})^T v_new
 * shapes: q,k bf16 (t, hk, d) at [t*stride + hk*128 + d]; v bf16 (t, h, c) at [t*stride + h*128
 *   + c]; g, beta f32 [T, 32]; S f32 [32][128][128]; o [T, 32, 128] bf16 or f32.
 * threads: block = (value-column slice of 32, value head), 256 threads; each step maps warp w to
 *   rows 8w..8w+7 of a chunk matrix and the lane to a column (comments at each step). Chunk-local
 *   matrices (A, T, W) are recomputed by each of the 4 slice blocks of a head.
 * bytes: reads q, k (2 x T x 2048 x 2 B, 4 times), v once, S once; writes o, S once.
 * reference: cpu_gdn_step token by token and cpu_gdn_chunked (tests/gpu/test_prefill_kernels.c). */
__global__ void __launch_bounds__(G1_THREADS, 1)
    gdn_chunk_v1_kernel(void *o, float *state, const uint16_t *q, const uint16_t *k,
                        const uint16_t *v, int tok_stride, const float *g, const float *beta, int T,
                        int flags) {
    extern __shared__ __align__(16) float g1_smem[];
    float *sK = g1_smem + G1_OFF_K, *sKt = g1_smem + G1_OFF_KT, *sQ = g1_smem + G1_OFF_Q;
    float *sW = g1_smem + G1_OFF_W, *sA = g1_smem + G1_OFF_A, *sAqk = g1_smem + G1_OFF_AQK;
    float *sV = g1_smem + G1_OFF_V, *sU = g1_smem + G1_OFF_U, *sS = g1_smem + G1_OFF_S;
    float *sG = g1_smem + G1_OFF_G, *sB = g1_smem + G1_OFF_B;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.y, hk = h / (TL_GDN_N_V_HEAD / TL_GDN_N_K_HEAD);
    const int c0 = blockIdx.x * G1_DVB;
    const int l2 = flags & TL_GDN_L2NORM, out_f32 = flags & TL_GDN_OUT_F32;
    float *Sg = state + (size_t)h * G1_DK * G1_DK;

    /* state slice: thread owns rows d = warp*16 + u, column lane */
    for (int u = 0; u < 16; u++) {
        int d = warp * 16 + u;
        sS[d * G1_DVB + lane] = Sg[(size_t)d * G1_DK + c0 + lane];
    }

    for (int t0 = 0; t0 < T; t0 += G1_L) {
        /* ---- 1. load the chunk: warp w loads rows 8w..8w+7, lane holds dims 4*lane..+3 ---- */
        for (int u = 0; u < 8; u++) {
            int i = warp * 8 + u, t = t0 + i;
            float kv[4] = {0, 0, 0, 0}, qv[4] = {0, 0, 0, 0};
            if (t < T) {
                const uint16_t *kp = k + (size_t)t * tok_stride + hk * G1_DK + 4 * lane;
                const uint16_t *qp = q + (size_t)t * tok_stride + hk * G1_DK + 4 * lane;
                uint2 kr = *(const uint2 *)kp, qr = *(const uint2 *)qp;
                kv[0] = bf16x2_lo(kr.x), kv[1] = bf16x2_hi(kr.x);
                kv[2] = bf16x2_lo(kr.y), kv[3] = bf16x2_hi(kr.y);
                qv[0] = bf16x2_lo(qr.x), qv[1] = bf16x2_hi(qr.x);
                qv[2] = bf16x2_lo(qr.y), qv[3] = bf16x2_hi(qr.y);
                if (l2) {
                    float sk = kv[0] * kv[0] + kv[1] * kv[1] + kv[2] * kv[2] + kv[3] * kv[3];
                    float sq = qv[0] * qv[0] + qv[1] * qv[1] + qv[2] * qv[2] + qv[3] * qv[3];
                    for (int off = 16; off > 0; off >>= 1) {
                        sk += __shfl_xor_sync(0xffffffffu, sk, off);
                        sq += __shfl_xor_sync(0xffffffffu, sq, off);
                    }
                    float rk = 1.0f / sqrtf(sk + 1e-6f);
                    float rq = 1.0f / sqrtf(sq + 1e-6f) * (1.0f / sqrtf((float)G1_DK));
                    for (int e = 0; e < 4; e++) kv[e] *= rk, qv[e] *= rq;
                }
            }
            *(float4 *)(sK + i * G1_DK + 4 * lane) = make_float4(kv[0], kv[1], kv[2], kv[3]);
            *(float4 *)(sQ + i * G1_DK + 4 * lane) = make_float4(qv[0], qv[1], qv[2], qv[3]);
            for (int e = 0; e < 4; e++) sKt[(4 * lane + e) * G1_L + i] = kv[e];
            float vv = 0.f;
            if (t < T) vv = bf2f(v[(size_t)t * tok_stride + h * G1_DK + c0 + lane]);
            sV[i * G1_DVB + lane] = vv;
        }
        if (warp == 0) {
            /* inclusive scan of g over the chunk (2 values per lane) */
            float g0 = 0.f, g1 = 0.f, b0 = 0.f, b1 = 0.f;
            int ta = t0 + 2 * lane, tb = ta + 1;
            if (ta < T)
                g0 = g[(size_t)ta * TL_GDN_N_V_HEAD + h],
                b0 = beta[(size_t)ta * TL_GDN_N_V_HEAD + h];
            if (tb < T)
                g1 = g[(size_t)tb * TL_GDN_N_V_HEAD + h],
                b1 = beta[(size_t)tb * TL_GDN_N_V_HEAD + h];
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
        }
        __syncthreads();

        /* ---- 2. A and Aqk: thread rows i = 8w+u, columns j = lane, lane+32 ---- */
        {
            float ak[8][2], aq[8][2];
            for (int u = 0; u < 8; u++) ak[u][0] = ak[u][1] = aq[u][0] = aq[u][1] = 0.f;
            for (int d = 0; d < G1_DK; d += 4) {
                float kt[4][2];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    kt[e][0] = sKt[(d + e) * G1_L + lane];
                    kt[e][1] = sKt[(d + e) * G1_L + lane + 32];
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    int i = warp * 8 + u;
                    float4 kr = *(const float4 *)(sK + i * G1_DK + d);
                    float4 qr = *(const float4 *)(sQ + i * G1_DK + d);
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        ak[u][c] +=
                            kr.x * kt[0][c] + kr.y * kt[1][c] + kr.z * kt[2][c] + kr.w * kt[3][c];
                        aq[u][c] +=
                            qr.x * kt[0][c] + qr.y * kt[1][c] + qr.z * kt[2][c] + qr.w * kt[3][c];
                    }
                }
            }
            for (int u = 0; u < 8; u++) {
                int i = warp * 8 + u;
                float gi = sG[i], bi = sB[i];
                for (int c = 0; c < 2; c++) {
                    int j = lane + 32 * c;
                    float dec = j <= i ? expf(gi - sG[j]) : 0.f;
                    sA[i * G1_L + j] = j < i ? -bi * ak[u][c] * dec : 0.f;
                    sAqk[i * G1_L + j] = aq[u][c] * dec;
                }
            }
        }
        __syncthreads();

        /* ---- 3. T by forward substitution, one column per thread (threads 0..63) ----
         * note: column j of T only depends on column j of the rows above it, so 64 threads solve
         * independently; A rows are read as warp-wide broadcasts; x[] stays in registers (fully
         * unrolled). x[i] = 0 for i <= j falls out of the recurrence without masking. */
        if (tid < G1_L) {
            const int j = tid;
            float x[G1_L];
#pragma unroll
            for (int i = 0; i < G1_L; i++) {
                float s = sA[i * G1_L + j];
#pragma unroll
                for (int m = 0; m < i; m++) s += sA[i * G1_L + m] * x[m];
                x[i] = s;
            }
            asm volatile("bar.sync 1, 64;\n" ::);
            float bj = sB[j];
#pragma unroll
            for (int i = 0; i < G1_L; i++) sA[i * G1_L + j] = (x[i] + (i == j ? 1.f : 0.f)) * bj;
        }
        __syncthreads();

        /* ---- 4. W = (T beta) (k e^gc) and U = (T beta) v: rows i = 8w+u, cols lane (+32v) ---- */
        {
            float w[8][4], uu[8];
            for (int u = 0; u < 8; u++) {
                uu[u] = 0.f;
                for (int c = 0; c < 4; c++) w[u][c] = 0.f;
            }
            for (int j = 0; j < G1_L; j += 4) {
                float kr[4][4], vr[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float eg = expf(sG[j + e]);
#pragma unroll
                    for (int c = 0; c < 4; c++) kr[e][c] = sK[(j + e) * G1_DK + lane + 32 * c] * eg;
                    vr[e] = sV[(j + e) * G1_DVB + lane];
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    float4 t4 = *(const float4 *)(sA + (warp * 8 + u) * G1_L + j);
                    float tt[4] = {t4.x, t4.y, t4.z, t4.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
#pragma unroll
                        for (int c = 0; c < 4; c++) w[u][c] += tt[e] * kr[e][c];
                        uu[u] += tt[e] * vr[e];
                    }
                }
            }
            for (int u = 0; u < 8; u++) {
                int i = warp * 8 + u;
                for (int c = 0; c < 4; c++) sW[i * G1_DK + lane + 32 * c] = w[u][c];
                sU[i * G1_DVB + lane] = uu[u];
            }
        }
        __syncthreads();

        /* ---- 5. v_new = U - W S; o = (q e^gc) S + Aqk v_new: rows i = 8w+u, column lane ---- */
        {
            float vp[8], oi[8];
            for (int u = 0; u < 8; u++) vp[u] = oi[u] = 0.f;
            for (int d = 0; d < G1_DK; d += 4) {
                float s4[4];
#pragma unroll
                for (int e = 0; e < 4; e++) s4[e] = sS[(d + e) * G1_DVB + lane];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    int i = warp * 8 + u;
                    float4 wr = *(const float4 *)(sW + i * G1_DK + d);
                    float4 qr = *(const float4 *)(sQ + i * G1_DK + d);
                    vp[u] += wr.x * s4[0] + wr.y * s4[1] + wr.z * s4[2] + wr.w * s4[3];
                    oi[u] += qr.x * s4[0] + qr.y * s4[1] + qr.z * s4[2] + qr.w * s4[3];
                }
            }
            for (int u = 0; u < 8; u++) {
                int i = warp * 8 + u;
                sU[i * G1_DVB + lane] -= vp[u];
                oi[u] *= expf(sG[i]);
            }
            __syncthreads();
            for (int j = 0; j < G1_L; j += 4) {
                float vn[4];
#pragma unroll
                for (int e = 0; e < 4; e++) vn[e] = sU[(j + e) * G1_DVB + lane];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    float4 a4 = *(const float4 *)(sAqk + (warp * 8 + u) * G1_L + j);
                    oi[u] += a4.x * vn[0] + a4.y * vn[1] + a4.z * vn[2] + a4.w * vn[3];
                }
            }
            for (int u = 0; u < 8; u++) {
                int t = t0 + warp * 8 + u;
                if (t >= T) continue;
                size_t idx = ((size_t)t * TL_GDN_N_V_HEAD + h) * G1_DK + c0 + lane;
                if (out_f32)
                    ((float *)o)[idx] = oi[u];
                else
                    ((__nv_bfloat16 *)o)[idx] = __float2bfloat16_rn(oi[u]);
            }
        }

        /* ---- 6. S = e^{gL} S + (k e^{gL - gc})^T v_new: rows d = 16w+u, column lane ---- */
        {
            const float gl = sG[G1_L - 1];
            float acc[16];
            for (int u = 0; u < 16; u++) acc[u] = 0.f;
            for (int j = 0; j < G1_L; j++) {
                float vn = sU[j * G1_DVB + lane] * expf(gl - sG[j]);
#pragma unroll
                for (int u4 = 0; u4 < 4; u4++) {
                    float4 kr = *(const float4 *)(sK + j * G1_DK + warp * 16 + 4 * u4);
                    acc[4 * u4 + 0] += kr.x * vn;
                    acc[4 * u4 + 1] += kr.y * vn;
                    acc[4 * u4 + 2] += kr.z * vn;
                    acc[4 * u4 + 3] += kr.w * vn;
                }
            }
            float egl = expf(gl);
            for (int u = 0; u < 16; u++) {
                int d = warp * 16 + u;
                sS[d * G1_DVB + lane] = sS[d * G1_DVB + lane] * egl + acc[u];
            }
        }
        __syncthreads();
    }

    for (int u = 0; u < 16; u++) {
        int d = warp * 16 + u;
        Sg[(size_t)d * G1_DK + c0 + lane] = sS[d * G1_DVB + lane];
    }
}

static int tl_gpu_gdn_chunk_v1(void *o, float *state, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, int tok_stride, const float *g, const float *beta,
                               int T, int flags, const tl_gpu_stream *st) {
    if (!o || !state || !q || !k || !v || !g || !beta || T < 0) return TL_ERR_INVALID;
    if (tok_stride < 0 || tok_stride % 4 || ((uintptr_t)q | (uintptr_t)k) % 8)
        return TL_ERR_INVALID;
    if (T == 0) return 0;
    static int attr_set;
    if (!attr_set) {
        if (cudaFuncSetAttribute(gdn_chunk_v1_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 G1_SMEM) != cudaSuccess)
            return TL_ERR_CUDA;
        attr_set = 1;
    }
    dim3 grid(G1_DK / G1_DVB, TL_GDN_N_V_HEAD);
    TL_LAUNCH(st, "gdn_chunk_v1", gdn_chunk_v1_kernel, grid, dim3(G1_THREADS), G1_SMEM, o, state, q,
              k, v, tok_stride, g, beta, T, flags);
    return 0;
}
