/* Shared by every .cu of the decode engine: error macros, warp/block reductions, bf16 and
 * q4-tiled helpers, the stream launchers run on, and the 4-bit row-block dot product that the
 * GEMV and MoE kernels share. */
#ifndef TL_CUDA_COMMON_CUH
#define TL_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "cuda/gpu.h"
#include "common/status.h"
}

/* CUDA_TRY: log file:line, the call and the CUDA error, return TL_ERR_CUDA. */
#define CUDA_TRY(expr)                                                                            \
    do {                                                                                          \
        cudaError_t e_ = (expr);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #expr,                     \
                    cudaGetErrorName(e_), cudaGetErrorString(e_));                                \
            return TL_ERR_CUDA;                                                                   \
        }                                                                                         \
    } while (0)

/* After every launch: the launch error, and with TL_CUDA_SYNC=1 a full sync so a failure names
 * its kernel (never while a graph is being captured). */
#define LAUNCH_CHECK(name)                                                                        \
    do {                                                                                          \
        cudaError_t e_ = cudaGetLastError();                                                      \
        if (e_ == cudaSuccess && tl_cuda_sync_each && !tl_cuda_capturing)                         \
            e_ = cudaStreamSynchronize(tl_cuda_stream);                                           \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: kernel %s: %s: %s\n", __FILE__, __LINE__, name,               \
                    cudaGetErrorName(e_), cudaGetErrorString(e_));                                \
            return TL_ERR_CUDA;                                                                   \
        }                                                                                         \
        tl_cuda_prof_mark(name);                                                                  \
    } while (0)

/* The stream every launcher uses (the backend sets it; tests use the default stream). */
extern cudaStream_t tl_cuda_stream;
extern int tl_cuda_sync_each;
extern int tl_cuda_capturing;
void tl_cuda_prof_mark(const char *name);

#define CEIL_DIV(a, b) (((a) + (b)-1) / (b))

__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * sbuf: 32 floats of shared memory. Fixed reduction order: deterministic. */
__device__ __forceinline__ float block_sum(float v, float *sbuf) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sbuf[w] = v;
    __syncthreads();
    float r = lane < nw ? sbuf[lane] : 0.0f;
    return warp_sum(r);
}
__device__ __forceinline__ float block_max(float v, float *sbuf) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sbuf[w] = v;
    __syncthreads();
    float r = lane < nw ? sbuf[lane] : -INFINITY;
    return warp_max(r);
}

/* note: q4 tiled layout (gpu_prefill.h). In word (rb, kb, lane) nibble n holds column
 * 32*kb + 2*(lane%4) + Q4_COL[n] of row 8*rb + lane/4. */
__device__ __forceinline__ int q4_col(int n) { return (n & 3) * 8 + (n >> 2); }
/* 16^-n for nibbles 0..4 (read in place), 16^-(n-3) for 5..7 (read from w >> 12). */
__device__ __forceinline__ float q4_nib_scale(int n) {
    int e = n < 5 ? n : n - 3;
    return e == 0 ? 1.0f : e == 1 ? 0.0625f : e == 2 ? 0.00390625f : e == 3 ? 0.000244140625f : 1.52587890625e-05f;
}

/* note: x staged for the q4 dot (shared memory). Per input row t and 32-column block kb, 36
 * floats at xs[t*ld + kb*36]: [0..31] = x*xw in nibble order (word j, nibble n at 8j + n, i.e.
 * column 32kb + 2j + q4_col(n)) pre-scaled by q4_nib_scale(n); [32] = the plain sum of the 32
 * (unscaled) values for the bias term; [33..35] pad. The 36-float stride makes the 16-byte reads
 * of 8 consecutive kb land in distinct banks. Reading x straight from global memory (lane = kb,
 * 16 bytes per lane at a 128-byte stride) cost 32 L1 wavefronts per load instruction and made the
 * GEMV L1-bound at ~0.5 TB/s (notes/2026-12-02-cuda-decode.md). */
#define Q4_XS_STRIDE 36
__host__ __device__ __forceinline__ int q4_xs_ld(int K) { return (K >> 5) * Q4_XS_STRIDE; }

/* Stages row x (K floats, times xw if non-NULL) into xs (layout above) with the threads of
 * [tid0, tid0 + nthr) (a multiple of 32, warps whole); returns this thread's partial sum of x^2
 * (raw x). The caller synchronises (block or warp) before reading xs. */
__device__ __forceinline__ float q4_stage_x(float *xs, const float *x, const float *xw, int K,
                                            int tid, int nthr) {
    float ss = 0.0f;
    for (int c = tid; c < K; c += nthr) {
        float v = x[c];
        ss = fmaf(v, v, ss);
        if (xw) v *= xw[c];
        int kb = c >> 5, cc = c & 31, hi = cc >> 3, lo = cc & 7;
        int j = lo >> 1, n = hi + 4 * (lo & 1);
        xs[kb * Q4_XS_STRIDE + j * 8 + n] = v * q4_nib_scale(n);
        float sum = warp_sum(v); /* the warp holds exactly columns 32kb .. 32kb+31 */
        if ((threadIdx.x & 31) == 0) xs[kb * Q4_XS_STRIDE + 32] = sum;
    }
    return ss;
}

/* Dot of row block rb (8 rows) of a q4 tiled matrix with NT staged input rows (xs, layout
 * above, row stride q4_xs_ld(K)). Lane mapping: LPK = 32/RS lanes per row group; lane L handles
 * rows part*NR .. part*NR+NR-1 of the block (part = L / LPK, NR = 8/RS) and, per step, the 32
 * columns of kb = L % LPK + step*LPK: it reads the NR consecutive 16-byte lane words of those rows
 * in the (rb, kb) tile (NR*16 contiguous bytes), their NR scale/bias words (NR*4 contiguous bytes)
 * and the staged x once for NR rows. Afterwards reduce with group_reduce (offsets below LPK). */
template <int NT, int RS>
__device__ __forceinline__ void q4_rb_dot(float (&acc)[8 / RS][NT], const uint32_t *w,
                                          const uint32_t *sb, int rows, int K, int rb,
                                          const float *xs, int nt) {
    constexpr int LPK = 32 / RS, NR = 8 / RS;
    int lane = threadIdx.x & 31, kl = lane % LPK, part = lane / LPK;
    int KB = K >> 5, ldx = q4_xs_ld(K);
    const uint4 *wp = (const uint4 *)(w + (size_t)rb * KB * 32) + part * NR;
    const uint32_t *sbp = sb + (size_t)rb * 8 + part * NR;
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < NR; i++) acc[i][t] = 0.0f;
#pragma unroll(NT == 1 ? 2 : 1)
    for (int kb = kl; kb < KB; kb += LPK) {
        uint4 q[NR];
        uint32_t s2[NR];
#pragma unroll
        for (int i = 0; i < NR; i++) q[i] = __ldg(wp + (size_t)kb * 8 + i);
#pragma unroll
        for (int i = 0; i < NR; i += 4) {
            uint4 v = __ldg((const uint4 *)(sbp + (size_t)(kb >> 1) * rows) + i / 4);
            s2[i] = v.x, s2[i + 1] = v.y, s2[i + 2] = v.z, s2[i + 3] = v.w;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            const float4 *xp = (const float4 *)(xs + (size_t)t * ldx + kb * Q4_XS_STRIDE);
            float xv[32];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 v = xp[i];
                xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
            }
            float sx = xs[(size_t)t * ldx + kb * Q4_XS_STRIDE + 32];
            /* note: nibble -> float without I2F: (w & 0xF<<4n) | 0x4B000000 is the float
             * 2^23 + q*16^n exactly (n <= 4; nibbles 5..7 are read from w >> 12), so LOP3 + FADD
             * give q*16^n; the 16^-n is in the staged x. */
#pragma unroll
            for (int r = 0; r < NR; r++) {
                uint32_t qw[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
                float sq = 0.0f;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t lo = qw[j], hi = qw[j] >> 12;
#pragma unroll
                    for (int n = 0; n < 8; n++) {
                        uint32_t bits = n < 5 ? (lo & (15u << (4 * n))) : (hi & (15u << (4 * (n - 3))));
                        float f = __uint_as_float(bits | 0x4B000000u) - 8388608.0f;
                        sq = fmaf(f, xv[8 * j + n], sq);
                    }
                }
                float sc = __uint_as_float(s2[r] << 16), bi = __uint_as_float(s2[r] & 0xffff0000u);
                acc[r][t] = fmaf(sc, sq, fmaf(bi, sx, acc[r][t]));
            }
        }
    }
}
/* Sum over the LPK lanes of a row group (xor offsets 1 .. LPK/2). */
template <int N> __device__ __forceinline__ void group_reduce(float *v, int lpk) {
#pragma unroll
    for (int i = 0; i < N; i++)
        for (int o = 1; o < lpk; o <<= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
}

/* Dot of bf16 rows r0..r0+7 (rows >= n_rows skipped) with NT inputs over the columns
 * c = (slice*32 + lane)*8 + j*256*n_slices (16 bytes per row per lane per step); n_slices = 1
 * covers all columns in one warp. ss[t] accumulates raw x^2 over the same columns. Returns
 * per-lane partial sums (reduce with warp_sum or across warps). */
template <int NT>
__device__ __forceinline__ void bf16_rows8_dot(float (&acc)[8][NT], float (&ss)[NT],
                                               const uint16_t *w, int K, int r0, int n_rows,
                                               const float *const (&x)[NT], const float *xw,
                                               int nt, int slice, int n_slices) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        ss[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < 8; r++) acc[r][t] = 0.0f;
    }
    for (int c = (slice * 32 + lane) * 8; c < K; c += 256 * n_slices) {
        uint4 q[8];
#pragma unroll
        for (int r = 0; r < 8; r++)
            q[r] = r0 + r < n_rows ? __ldg((const uint4 *)(w + (size_t)(r0 + r) * K + c)) : make_uint4(0, 0, 0, 0);
        float4 wa = make_float4(1, 1, 1, 1), wb = wa;
        if (xw) wa = __ldg((const float4 *)(xw + c)), wb = __ldg((const float4 *)(xw + c + 4));
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            float4 a = __ldg((const float4 *)(x[t] + c)), b = __ldg((const float4 *)(x[t] + c + 4));
            float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            float xm[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                ss[t] = fmaf(xv[i], xv[i], ss[t]);
                xv[i] *= xm[i];
            }
#pragma unroll
            for (int r = 0; r < 8; r++) {
                uint32_t u[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    acc[r][t] = fmaf(__uint_as_float(u[i] << 16), xv[2 * i], acc[r][t]);
                    acc[r][t] = fmaf(__uint_as_float(u[i] & 0xffff0000u), xv[2 * i + 1], acc[r][t]);
                }
            }
        }
    }
}

#endif
