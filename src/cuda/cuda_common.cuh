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

/* Dot of row block rb (8 rows) of a q4 tiled matrix with NT input rows. Lane L handles row
 * 8*rb + L%8 and, per step, the 32 columns of kb = 4*step + L/8 (16 bytes: the 4 words of that
 * row's lanes). x[t] points at input row t; xw (or NULL) multiplies x elementwise (RMSNorm
 * weight). After the call acc[t] holds this lane's partial sum; reduce with q4_reduce. */
template <int NT>
__device__ __forceinline__ void q4_rowblock_dot(float (&acc)[NT], const uint32_t *w,
                                                const uint32_t *sb, int rows, int K, int rb,
                                                const float *const (&x)[NT], const float *xw,
                                                int nt) {
    int lane = threadIdx.x & 31, r8 = lane & 7, kq = lane >> 3;
    int KB = K >> 5, row = rb * 8 + r8;
    const uint4 *wp = (const uint4 *)(w + ((size_t)rb * KB) * 32) + r8;
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int kb = kq; kb < KB; kb += 4) {
        uint4 q = __ldg(wp + (size_t)kb * 8);
        uint32_t s2 = __ldg(sb + (size_t)(kb >> 1) * rows + row);
        float sc = __uint_as_float(s2 << 16), bi = __uint_as_float(s2 & 0xffff0000u);
        float xw_[32];
        if (xw) {
            const float4 *p = (const float4 *)(xw + kb * 32);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 v = __ldg(p + i);
                xw_[4 * i] = v.x, xw_[4 * i + 1] = v.y, xw_[4 * i + 2] = v.z, xw_[4 * i + 3] = v.w;
            }
        }
        uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            float xv[32];
            const float4 *p = (const float4 *)(x[t] + kb * 32);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 v = __ldg(p + i);
                xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
            }
            if (xw) {
#pragma unroll
                for (int i = 0; i < 32; i++) xv[i] *= xw_[i];
            }
            float sq = 0.0f, sx = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int n = 0; n < 8; n++) {
                    float xx = xv[2 * j + q4_col(n)];
                    sq = fmaf((float)((qw[j] >> (4 * n)) & 15u), xx, sq);
                }
            }
#pragma unroll
            for (int i = 0; i < 32; i++) sx += xv[i];
            acc[t] = fmaf(sc, sq, fmaf(bi, sx, acc[t]));
        }
    }
}
/* Sum the partials of the 4 lanes sharing a row: afterwards lanes 0..7 hold rows 0..7. */
template <int NT> __device__ __forceinline__ void q4_reduce(float (&acc)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], 8);
        acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], 16);
    }
}

/* Dot of bf16 rows r0..r0+7 (rows >= n_rows skipped) with NT inputs: lane covers 8 consecutive
 * columns per 256-column step. After the call acc[r][t] holds the full sum in every lane. */
template <int NT>
__device__ __forceinline__ void bf16_rows8_dot(float (&acc)[8][NT], const uint16_t *w, int K,
                                               int r0, int n_rows, const float *const (&x)[NT],
                                               const float *xw, int nt) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < 8; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    for (int c = lane * 8; c < K; c += 256) {
        float xv[NT][8];
        float4 wa = make_float4(1, 1, 1, 1), wb = wa;
        if (xw) wa = __ldg((const float4 *)(xw + c)), wb = __ldg((const float4 *)(xw + c + 4));
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            float4 a = __ldg((const float4 *)(x[t] + c)), b = __ldg((const float4 *)(x[t] + c + 4));
            xv[t][0] = a.x * wa.x, xv[t][1] = a.y * wa.y, xv[t][2] = a.z * wa.z, xv[t][3] = a.w * wa.w;
            xv[t][4] = b.x * wb.x, xv[t][5] = b.y * wb.y, xv[t][6] = b.z * wb.z, xv[t][7] = b.w * wb.w;
        }
#pragma unroll
        for (int r = 0; r < 8; r++) {
            if (r0 + r >= n_rows) break;
            uint4 q = __ldg((const uint4 *)(w + (size_t)(r0 + r) * K + c));
            uint32_t u[4] = {q.x, q.y, q.z, q.w};
            float wf[8];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                wf[2 * i] = __uint_as_float(u[i] << 16);
                wf[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
#pragma unroll
                for (int i = 0; i < 8; i++) acc[r][t] = fmaf(wf[i], xv[t][i], acc[r][t]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 8; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
}

/* 1/rms of NT input rows of length K computed by the whole block into s_inv[NT]. */
template <int NT>
__device__ __forceinline__ void block_inv_rms(float *s_inv, const float *const (&x)[NT], int K,
                                              int nt, float eps, float *sbuf) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        float s = 0.0f;
        for (int c = threadIdx.x; c < K; c += blockDim.x) s = fmaf(x[t][c], x[t][c], s);
        s = block_sum(s, sbuf);
        if (threadIdx.x == 0) s_inv[t] = rsqrtf(s / (float)K + eps);
    }
    __syncthreads();
}

#endif
