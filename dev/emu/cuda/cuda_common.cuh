/* Host emulation of the CUDA device environment that src/cuda/k_gdn_chunk.cu, k_gemv.cu and
 * k_moe.cu use, for the programs in dev/emu only: it stands in for src/cuda/cuda_common.cuh
 * (found first on the include path); dev/emu/emu_rt.cpp runs each block's threads as coroutines
 * (ucontext) in one OS thread and emulates mma.sync (m16n8k8 tf32, m16n8k16 bf16) from the PTX
 * fragment layouts, warp shuffles and reductions, __syncthreads, __syncwarp and named barriers.
 * cp.async is a plain copy and PDL does nothing (no overlap: no pipeline race or hand-off can
 * show here, only indexing and arithmetic). Shared memory: kernels' `__shared__` arrays must be
 * static (dev/emu/q4_emu.sh rewrites the sources so), the dynamic ones are the emulator program's
 * globals. TL_LAUNCH runs the grid's blocks in order, only those whose blockIdx.y passes
 * emu_head_on. */
#ifndef TL_CUDA_COMMON_CUH
#define TL_CUDA_COMMON_CUH

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <functional>

extern "C" {
#include "cuda/cb_level.h"
#include "cuda/gpu.h"
#include "common/status.h"
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
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
struct uint4 {
    uint32_t x, y, z, w;
};
static inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
static inline int __ffs(uint32_t v) { return __builtin_ffs((int)v); }
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return {a, b, c, d};
}
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
static inline float __int_as_float(int i) { return __uint_as_float((uint32_t)i); }
static inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
static inline int __popc(uint32_t v) { return __builtin_popcount(v); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* the fast exponential: ex2.approx of x log2(e), the product rounded to float as on the GPU */
static inline float emu_fast_expf(float x) { return exp2f(x * 1.4426950408889634f); }
#define __expf emu_fast_expf /* glibc declares its own __expf */
static inline float ex2_fast(float x) { return exp2f(x); }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
/* CUDA's unsigned overloads (an int max would order keys with the top bit set below the rest) */
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcs(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
/* one OS thread: the atomics are plain read-modify-writes */
template <class T> static inline T atomicAdd(T *p, T v) {
    T o = *p;
    *p = o + v;
    return o;
}
template <class T> static inline T atomicSub(T *p, T v) {
    T o = *p;
    *p = o - v;
    return o;
}
template <class T> static inline T atomicOr(T *p, T v) {
    T o = *p;
    *p = o | v;
    return o;
}
typedef int cudaError_t;
#define cudaSuccess                    0
#define cudaDevAttrMultiProcessorCount 0
static inline cudaError_t cudaGetDevice(int *d) { return *d = 0, 1; } /* cb_grid_cap: 132 SMs */
static inline cudaError_t cudaDeviceGetAttribute(int *v, int a, int d) {
    (void)a, (void)d;
    return *v = 0, 1;
}

/* ---- emulated threads ---- */
extern dim3 threadIdx, blockIdx, blockDim, gridDim;
/* id 0: block; 1 + w: warp w; 100 + n: the first n threads; 1000 + g: warpgroup g; 3000 + 2048 b
 * + n: named barrier b, whichever n threads arrive */
void emu_barrier(int id);
void emu_yield(void); /* lets the block's other threads run (a spin wait) */
void emu_launch(dim3 grid, dim3 block, const std::function<void()> &fn);
extern int (*emu_head_on)(int y);
/* operand rounding of the emulated tensor cores: 0 tf32 (cvt.rna), 1 bf16 (nearest even) */
extern int emu_round_bf16;

static inline void __syncthreads(void) { emu_barrier(0); }
static inline void bar_sync_named(int id, int n) { emu_barrier(3000 + 2048 * id + n); }
float emu_shfl(float v, int src_lane_or_minus1);
uint32_t emu_shfl_u(uint32_t v, int src_lane);
uint32_t emu_reduce_u(uint32_t v, int max); /* the warp's max (1), min (0) or sum (2) */
static inline void __syncwarp(unsigned m = 0xffffffffu) {
    (void)m;
    emu_barrier(1 + (int)threadIdx.x / 32);
}
static inline int __shfl_sync(unsigned m, int v, int src) {
    (void)m;
    return (int)emu_shfl_u((uint32_t)v, src & 31);
}
static inline float __shfl_sync(unsigned m, float v, int src) {
    (void)m;
    return emu_shfl(v, src & 31);
}
uint32_t emu_match_any(uint32_t v); /* the lanes of the warp holding the same v */
static inline unsigned __match_any_sync(unsigned m, int v) {
    (void)m;
    return emu_match_any((uint32_t)v);
}
uint32_t emu_ballot(int pred); /* the lanes of the warp whose pred is non-zero */
static inline unsigned __ballot_sync(unsigned m, int pred) {
    (void)m;
    return emu_ballot(pred);
}
static inline uint32_t __reduce_max_sync(unsigned m, uint32_t v) {
    (void)m;
    return emu_reduce_u(v, 1);
}
static inline uint32_t __reduce_min_sync(unsigned m, uint32_t v) {
    (void)m;
    return emu_reduce_u(v, 0);
}
static inline int __reduce_add_sync(unsigned m, int v) {
    (void)m;
    return (int)emu_reduce_u((uint32_t)v, 2);
}
static inline float __shfl_xor_sync(unsigned m, float v, int off) {
    (void)m;
    return emu_shfl(v, (int)(threadIdx.x & 31) ^ off);
}
static inline float __shfl_up_sync(unsigned m, float v, int off) {
    (void)m;
    int l = (int)(threadIdx.x & 31) - off;
    return emu_shfl(v, l < 0 ? (int)(threadIdx.x & 31) : l);
}
static inline int __shfl_up_sync(unsigned m, int v, int off) {
    (void)m;
    int l = (int)(threadIdx.x & 31) - off;
    return (int)emu_shfl_u((uint32_t)v, l < 0 ? (int)(threadIdx.x & 31) : l);
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
static inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline float bf16x2_half(uint32_t v, int h) {
    return __uint_as_float(h ? v & 0xffff0000u : v << 16);
}
void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
              uint32_t b1);

/* ---- shared-memory operands (k_gemm.cu): ldmatrix, the 32-bit shared address ---- */
extern uint8_t *emu_smem_base; /* the window smem_u32 measures from (1024-byte aligned) */
static inline uint32_t smem_u32(const void *p) {
    return (uint32_t)((const uint8_t *)p - emu_smem_base);
}
void emu_ldmatrix(uint32_t *r, int nmat, const void *p, int trans);
static inline void ldmatrix_x4(uint32_t r[4], const void *p) { emu_ldmatrix(r, 4, p, 0); }
static inline void ldmatrix_x2(uint32_t r[2], const void *p) { emu_ldmatrix(r, 2, p, 0); }
static inline void ldmatrix_x4_trans(uint32_t r[4], const void *p) { emu_ldmatrix(r, 4, p, 1); }
static inline void mma_bf16(float *d, const uint32_t a[4], uint32_t b0, uint32_t b1) {
    mma_bf16(*(float(*)[4])d, a[0], a[1], a[2], a[3], b0, b1);
}
static inline float __shfl_down_sync(unsigned m, float v, int off) {
    (void)m;
    int l = (int)(threadIdx.x & 31) + off;
    return emu_shfl(v, l > 31 ? (int)(threadIdx.x & 31) : l);
}

static inline void cp_async16(void *d, const void *s, int n) {
    memset(d, 0, 16);
    memcpy(d, s, (size_t)n);
}
static inline int tl_env_is(const char *name, int v) {
    const char *s = getenv(name);
    return s && atoi(s) == v;
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
struct __nv_bfloat162 { /* x: the low half */
    uint16_t x, y;
};
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {f2bf(a), f2bf(b)}; }
/* one rounding to bf16 of the f32 result (exact for the dequantization's operands) */
static inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) {
    return {f2bf(bf2f(a.x) - bf2f(b.x)), f2bf(bf2f(a.y) - bf2f(b.y))};
}
static inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
    return {f2bf(fmaf(bf2f(a.x), bf2f(b.x), bf2f(c.x))),
            f2bf(fmaf(bf2f(a.y), bf2f(b.y), bf2f(c.y)))};
}
static inline uint16_t __float2bfloat16_rn(float f) { return f2bf(f); }
static inline uint32_t bf16x2_pack(float lo, float hi) {
    return (uint32_t)f2bf(lo) | (uint32_t)f2bf(hi) << 16;
}
static inline float bf16x2_lo(uint32_t v) { return __uint_as_float(v << 16); }
static inline float bf16x2_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float silu_f(float x) { return x / (1.0f + expf(-x)); }
static inline float conv4_silu(float4 w, float s0, float s1, float s2, float x) {
    float a = w.x * s0;
    a = fmaf(w.y, s1, a);
    a = fmaf(w.z, s2, a);
    a = fmaf(w.w, x, a);
    return silu_f(a);
}
/* Pool token row of (slot, pos) in a paged KV cache (src/cuda/cuda_common.cuh's) */
static inline int kv_row(const tl_gpu_kv_pages &pg, int slot, int pos) {
    return pg.table[(size_t)slot * pg.max_pages + pos / TL_KV_PAGE] * TL_KV_PAGE + pos % TL_KV_PAGE;
}
static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <bool MAX> static inline float block_reduce(float v, float *sbuf) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sbuf[w] = v;
    __syncthreads();
    float r = lane < nw ? sbuf[lane] : (MAX ? -INFINITY : 0.0f);
    return MAX ? warp_max(r) : warp_sum(r);
}
static inline float block_sum(float v, float *sbuf) { return block_reduce<false>(v, sbuf); }
static inline float block_max(float v, float *sbuf) { return block_reduce<true>(v, sbuf); }
static inline uint64_t tl_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
#define TL_GOLDEN64 0x9E3779B97F4A7C15ull
static inline void pdl_wait(void) {}
static inline void pdl_trigger(void) {}
static inline void pdl_enter(int trig) { (void)trig; }
static inline int tl_pdl_trig(const tl_gpu_stream *st) { return st && st->pdl > 1; }
#define CEIL_DIV(a, b) (((a) + (b)-1) / (b))
int cb_grid_cap(void);
int cb_gemv_setup(void);
int cb_moe_setup(void);
static inline float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* ---- launch ---- */
#define TRY(x)                                                                                     \
    do {                                                                                           \
        int st_ = (x);                                                                             \
        if (st_) return st_;                                                                       \
    } while (0)
#define CUDA_TRY(x)               (void)(x)
#define cudaFuncSetAttribute(...) 0
template <auto Kern> static int smem_limit(int, bool = false) { return 0; }
/* variadic: a kernel template's arguments hold commas */
template <class K, class... A>
static inline void emu_launch_kernel(K kern, dim3 grid, dim3 block, size_t shm, A... args) {
    (void)shm;
    emu_launch(grid, block, [&]() { kern(args...); });
}
#define TL_LAUNCH(st, name, ...) emu_launch_kernel(__VA_ARGS__)
/* thread-block clusters are not emulated (the blocks run one after another): a kernel that
 * reaches cluster_sync stops the emulator (TL_GEMM_SPLITK_CLUSTER=0 keeps the split-K GEMMs off
 * them) */
#define TL_LAUNCH_CLUSTER(st, name, cz, ...) emu_launch_kernel(__VA_ARGS__)
static inline void cluster_sync(void) {
    fprintf(stderr,
            "emulator: thread-block clusters are not emulated (TL_GEMM_SPLITK_CLUSTER=0)\n");
    abort();
}
static inline uint32_t dsmem_map(uint32_t a, uint32_t rank) { return (void)rank, a; }
static inline float2 dsmem_ld2(uint32_t a) { return (void)a, make_float2(0.0f, 0.0f); }

#endif
