/* Shared by every .cu file of the CUDA backend: the one launch convention (TL_LAUNCH), the error
 * macros, a kernel's dynamic shared-memory limit raised once (smem_limit), and the device helpers
 * every kernel uses (bf16 conversion, warp/block reductions, programmatic dependent launch,
 * cp.async, ldmatrix, the mma.sync wrappers (bf16, tf32), named barriers, activations, the
 * splitmix64 hash). Header-only; the only state is the read-once TL_CUDA_SYNC switch and
 * smem_limit's once-flags. The 4-bit GEMV machinery shared by the GEMV and MoE kernels is in
 * k_q4m.cuh. */
#ifndef TL_CUDA_COMMON_CUH
#define TL_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "cuda/cb_level.h"
#include "cuda/gpu.h"
#include "common/status.h"
}

/* ====== Error handling and the launch convention ====== */

/* CUDA_TRY: on a CUDA error, log file:line, the call and the error, return TL_ERR_CUDA. */
#define CUDA_TRY(expr)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #expr,                      \
                    cudaGetErrorName(e_), cudaGetErrorString(e_));                                 \
            return TL_ERR_CUDA;                                                                    \
        }                                                                                          \
    } while (0)

/* TRY: return a non-zero tl_status. */
#define TRY(x)                                                                                     \
    do {                                                                                           \
        int st_ = (x);                                                                             \
        if (st_) return st_;                                                                       \
    } while (0)

/* The stream of a launch context (NULL context: the legacy default stream). */
static inline cudaStream_t tl_stream_of(const tl_gpu_stream *st) {
    return st ? (cudaStream_t)st->stream : (cudaStream_t)0;
}

/* 1 if the environment variable name is set to the integer v (the kernels' A/B switches; each
 * caller reads it once and keeps the answer). */
static inline int tl_env_is(const char *name, int v) {
    const char *s = getenv(name);
    return s && atoi(s) == v;
}

/* TL_CUDA_SYNC=1: every launch is followed by a stream synchronize (outside graph capture), so
 * an asynchronous fault names the kernel that caused it. Read once. */
static inline int tl_cuda_sync_each(void) {
    static int v = -1;
    if (v < 0) {
        const char *s = getenv("TL_CUDA_SYNC");
        v = s && atoi(s) != 0;
    }
    return v;
}

/* cuda_bench.cu: records an event after a launch on st->stream (ignored while capturing). */
void tl_gpu_prof_mark(tl_gpu_prof *p, cudaStream_t stream, const char *name);

/* Checks a launch that already happened: the launch error, then under TL_CUDA_SYNC=1 a
 * synchronize; logs "file:line: kernel NAME: error" and returns TL_ERR_CUDA on failure; marks
 * the profiler. */
static inline int tl_launch_check(cudaError_t e, const char *file, int line, const char *name,
                                  const tl_gpu_stream *st) {
    cudaStream_t s = tl_stream_of(st);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e == cudaSuccess && tl_cuda_sync_each()) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(s, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone)
            e = cudaStreamSynchronize(s);
    }
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: kernel %s: %s: %s\n", file, line, name, cudaGetErrorName(e),
                cudaGetErrorString(e));
        return TL_ERR_CUDA;
    }
    if (st && st->prof) tl_gpu_prof_mark(st->prof, s, name);
    return 0;
}

/* 1 when the kernels launched on st trigger their successor after their wait (pdl_enter). */
static inline int tl_pdl_trig(const tl_gpu_stream *st) { return st && st->pdl > 1; }

/* Launches kern<<<grid, block, shm>>>(args) on st's stream, with the programmatic-serialization
 * attribute when st->pdl is set (see pdl_wait below), and checks it (tl_launch_check). */
template <typename... KArgs, typename... Args>
static inline int tl_launch_at(const char *file, int line, const char *name,
                               const tl_gpu_stream *st, int cluster_z, void (*kern)(KArgs...),
                               dim3 grid, dim3 block, size_t shm, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    int na = 0;
    if (st && st->pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_z > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = 1, at[na].val.clusterDim.y = 1;
        at[na++].val.clusterDim.z = (unsigned)cluster_z;
    }
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = shm;
    cfg.stream = tl_stream_of(st), cfg.attrs = at, cfg.numAttrs = na;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
    return tl_launch_check(e, file, line, name, st);
}

/* TL_LAUNCH(st, "name", kernel, grid, block, shm, args...): the only way a kernel is launched.
 * Returns TL_ERR_CUDA from the enclosing function when the launch fails. TL_LAUNCH_CLUSTER(st,
 * "name", cz, kernel, ...): the same with thread-block clusters of 1 x 1 x cz blocks (cz divides
 * grid.z; cz <= 8, the portable limit). */
#define TL_LAUNCH(st, name, ...) TRY(tl_launch_at(__FILE__, __LINE__, name, st, 1, __VA_ARGS__))
#define TL_LAUNCH_CLUSTER(st, name, cz, ...)                                                       \
    TRY(tl_launch_at(__FILE__, __LINE__, name, st, cz, __VA_ARGS__))

#define CEIL_DIV(a, b) (((a) + (b)-1) / (b))

/* Raises kernel Kern's dynamic shared memory limit to bytes and, with max_carveout, asks for all
 * of L1 as shared memory; once, before its first launch. 0 or TL_ERR_CUDA. */
template <auto Kern> static int smem_limit(int bytes, bool max_carveout = false) {
    static int set;
    if (!set) {
        if (cudaFuncSetAttribute(Kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) !=
                cudaSuccess ||
            (max_carveout &&
             cudaFuncSetAttribute(Kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared) != cudaSuccess))
            return TL_ERR_CUDA;
        set = 1;
    }
    return 0;
}

/* Kernel setup inside the backend (tl_gpu_init calls each once, outside graph capture): the
 * dynamic shared-memory limits of the kernels that need more than 48 KB. */
int cb_gemv_setup(void);
int cb_moe_setup(void);
int cb_attn_setup(void);
/* Resident blocks of the persistent kernels: SMs x 2 (their launch bound); from tl_gpu_init. */
int cb_grid_cap(void);

/* ====== Scalars: bf16, activations, hashing ====== */

__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* f32 -> bf16 bits, round to nearest even; NaN stays NaN. */
__device__ __forceinline__ uint16_t f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* Two floats -> packed bf16x2 (round to nearest even), lo in the low half. */
__device__ __forceinline__ uint32_t bf16x2_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
__device__ __forceinline__ float bf16x2_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16x2_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

/* 2^x by the SFU alone (ex2.approx.ftz: relative error ~2^-22, results under 2^-126 flushed to
 * 0): no denormal fix-up instructions around it, unlike __expf / exp2f without -ftz. */
__device__ __forceinline__ float ex2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* splitmix64 finaliser: the hash behind every random value of the backend (host and device). */
__host__ __device__ __forceinline__ uint64_t tl_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
#define TL_GOLDEN64 0x9E3779B97F4A7C15ull

/* Causal depthwise conv of kernel 4 + SiLU for one channel: w = (w0..w3), s0..s2 the three
 * previous inputs (oldest first), x the new one (conv1d_silu_kernel and the GEMV's fused
 * epilogue share it so both give the same bits). */
__device__ __forceinline__ float conv4_silu(float4 w, float s0, float s1, float s2, float x) {
    float a = w.x * s0;
    a = fmaf(w.y, s1, a);
    a = fmaf(w.z, s2, a);
    a = fmaf(w.w, x, a);
    return silu_f(a);
}

/* Pool token row of (slot, pos) in a paged KV cache (gpu.h: tl_gpu_kv_pages). */
__device__ __forceinline__ int kv_row(const tl_gpu_kv_pages &pg, int slot, int pos) {
    return pg.table[(size_t)slot * pg.max_pages + pos / TL_KV_PAGE] * TL_KV_PAGE + pos % TL_KV_PAGE;
}

/* ====== Reductions ====== */

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
/* Sum (or max) over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the
 * result. sbuf: 32 floats of shared memory. Fixed reduction order: deterministic. */
template <bool MAX> __device__ __forceinline__ float block_reduce(float v, float *sbuf) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sbuf[w] = v;
    __syncthreads();
    float r = lane < nw ? sbuf[lane] : (MAX ? -INFINITY : 0.0f);
    return MAX ? warp_max(r) : warp_sum(r);
}
__device__ __forceinline__ float block_sum(float v, float *sbuf) {
    return block_reduce<false>(v, sbuf);
}
__device__ __forceinline__ float block_max(float v, float *sbuf) {
    return block_reduce<true>(v, sbuf);
}

/* ====== Programmatic dependent launch (PDL) ======
 * Decode kernels are launched with the programmatic-serialization attribute (TL_LAUNCH on a
 * context with pdl set), so kernel N+1 may start while kernel N drains. Every kernel that can be
 * launched that way calls pdl_wait() before it reads anything an earlier kernel wrote or writes
 * anything an earlier kernel reads; only constant data (weights) may be touched before it. Both
 * instructions are no-ops in a kernel launched without the attribute. pdl_trigger() lets the next
 * kernel's blocks be scheduled as soon as every block of this one has started. */
__device__ __forceinline__ void pdl_wait(void) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void pdl_trigger(void) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
/* pdl_enter: pdl_wait(), then, when trig (tl_pdl_trig: a stream with pdl 2, the batched decode
 * path), pdl_trigger(): how a kernel that acts only after its predecessor starts. Once every block
 * of it has passed this point, the next kernel's blocks may be scheduled beside its own (they
 * launch during its last wave instead of after its last block) and run their part before their
 * own pdl_wait: everything launched before this kernel is complete by then, so that part may read
 * anything but this kernel's outputs (weights; gdn_cols: the recurrent state). Measured (session
 * 26, H100): decode batches 8 / 64 -5% / -2% a step with the trigger; a prefill chunk lost what
 * PDL gives it (512 tokens -4.5%, 1K -5%: the same as no PDL at all), so its stream has pdl 1. */
__device__ __forceinline__ void pdl_enter(int trig) {
    pdl_wait();
    if (trig) pdl_trigger();
}

/* ====== Thread-block clusters (sm_90) ======
 * cluster_sync: every thread of every block of the cluster arrives (release) and waits (acquire):
 * shared-memory writes before it are visible to the cluster's other blocks after it.
 * dsmem_map: the cluster-shared address of this block's shared address a in block `rank`;
 * dsmem_ld2: a float2 from such an address (another block's shared memory). */
__device__ __forceinline__ void cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
}
__device__ __forceinline__ uint32_t dsmem_map(uint32_t a, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ float2 dsmem_ld2(uint32_t a) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(a)
                 : "memory");
    return v;
}

/* ====== cp.async, ldmatrix, mma.sync (sm_80+ PTX; we build for sm_90a) ====== */

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* 16-byte async copy global -> shared; src_bytes 0 zero-fills the destination (out of range). */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(smem)));
}
/* Two 8x8 matrices: lanes 0-7 give the first's row addresses, 8-15 the second's. */
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(smem)));
}

/* d += a(16x16, row) * b(16x8, col): mma.sync m16n8k16, bf16 inputs, f32 accumulators. */
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16(float *d, const uint32_t a[4], uint32_t b0, uint32_t b1) {
    mma_bf16(*(float(*)[4])d, a[0], a[1], a[2], a[3], b0, b1);
}

/* x rounded to tf32 (nearest, ties away from zero: cvt.rna), as an f32 bit pattern. */
__device__ __forceinline__ uint32_t tf32_of(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
/* d += a(16x8, row) * b(8x8, col): mma.sync m16n8k8, tf32 inputs, f32 accumulators. */
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Barrier id (1..15) over the first n threads of the block (n a multiple of 32). */
__device__ __forceinline__ void bar_sync_named(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

#endif
