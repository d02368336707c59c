/* Host emulation of the CUDA device environment that src/cuda/k_gdn_chunk.cu uses, for
 * dev/emu/gdn_tc_emu.cpp only: it stands in for src/cuda/cuda_common.cuh (found first on the
 * include path), runs each block's threads as coroutines (ucontext) in one OS thread, and
 * emulates mma.sync m16n8k8 tf32 from the PTX fragment layout, warp shuffles, __syncthreads and
 * named barriers. cp.async is a plain copy (no overlap, so it cannot show pipeline races).
 * TL_LAUNCH runs the grid's blocks in order, only those whose blockIdx.y passes emu_head_on. */
#ifndef TL_CUDA_COMMON_CUH
#define TL_CUDA_COMMON_CUH

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <functional>

extern "C" {
#include "cuda/gpu.h"
#include "common/status.h"
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(a, b)
#define __shared__
#define __align__(n)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    uint32_t x, y;
};
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- emulated threads ---- */
extern dim3 threadIdx, blockIdx, blockDim;
void emu_barrier(int id); /* id 0: block; 1 + w: warp w; 100 + n: the first n threads */
void emu_launch(dim3 grid, dim3 block, const std::function<void()> &fn);
extern int (*emu_head_on)(int y);
/* operand rounding of the emulated tensor cores: 0 tf32 (cvt.rna), 1 bf16 (nearest even) */
extern int emu_round_bf16;

static inline void __syncthreads(void) { emu_barrier(0); }
static inline void bar_sync_named(int id, int n) {
    (void)id;
    emu_barrier(100 + n);
}
float emu_shfl(float v, int src_lane_or_minus1);
static inline float __shfl_xor_sync(unsigned m, float v, int off) {
    (void)m;
    return emu_shfl(v, (int)(threadIdx.x & 31) ^ off);
}
static inline float __shfl_up_sync(unsigned m, float v, int off) {
    (void)m;
    int l = (int)(threadIdx.x & 31) - off;
    return emu_shfl(v, l < 0 ? (int)(threadIdx.x & 31) : l);
}

static inline uint32_t tf32_of(float x) {
    uint32_t u = __float_as_uint(x);
    if (emu_round_bf16) {
        u += 0x7fffu + ((u >> 16) & 1u);
        return u & 0xffff0000u;
    }
    return (u + 0x1000u) & ~0x1fffu;
}
void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

static inline void cp_async16(void *d, const void *s, int n) {
    memset(d, 0, 16);
    memcpy(d, s, (size_t)n);
}
static inline void cp_async_commit(void) {}
template <int N> static inline void cp_async_wait(void) {}

/* ---- scalars ---- */
static inline float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
static inline uint16_t f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
typedef uint16_t __nv_bfloat16;
static inline uint16_t __float2bfloat16_rn(float f) { return f2bf(f); }
static inline uint32_t bf16x2_pack(float lo, float hi) {
    return (uint32_t)f2bf(lo) | (uint32_t)f2bf(hi) << 16;
}
static inline float bf16x2_lo(uint32_t v) { return __uint_as_float(v << 16); }
static inline float bf16x2_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* ---- launch ---- */
#define TRY(x)                                                                                     \
    do {                                                                                           \
        int st_ = (x);                                                                             \
        if (st_) return st_;                                                                       \
    } while (0)
#define CUDA_TRY(x)               (void)(x)
#define cudaFuncSetAttribute(...) 0
#define TL_LAUNCH(st, name, kern, grid, block, shm, ...)                                           \
    emu_launch(grid, block, [&]() { kern(__VA_ARGS__); })

#endif
