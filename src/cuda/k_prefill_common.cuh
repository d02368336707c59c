/* Device helpers shared by the prefill kernels (k_gemm.cu, k_attn_prefill.cu, k_gdn_chunk.cu):
 * cp.async, ldmatrix, mma.sync m16n8k16 bf16, bf16 packing. Header-only, static inline; no state.
 * Everything here is sm_80+ PTX (we build for sm_90a). */
#ifndef TL_K_PREFILL_COMMON_CUH
#define TL_K_PREFILL_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "tulip.h"

#define PF_LAUNCH_CHECK()                                                                          \
    do {                                                                                           \
        if (cudaPeekAtLastError() != cudaSuccess) return TL_ERR_CUDA;                              \
    } while (0)

static __device__ __forceinline__ uint32_t pf_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy global -> shared; src_bytes 0 zero-fills the destination (out of range). */
static __device__ __forceinline__ void pf_cp_async16(void *smem, const void *gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(pf_smem_u32(smem)),
                 "l"(gmem), "r"(src_bytes));
}
static __device__ __forceinline__ void pf_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> static __device__ __forceinline__ void pf_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ void pf_ldmatrix_x4(uint32_t r[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(pf_smem_u32(smem)));
}
static __device__ __forceinline__ void pf_ldmatrix_x4_trans(uint32_t r[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(pf_smem_u32(smem)));
}

/* d += a(16x16, row) * b(16x8, col), bf16 inputs, f32 accumulators. */
static __device__ __forceinline__ void pf_mma_bf16(float d[4], const uint32_t a[4], uint32_t b0,
                                                   uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats -> packed bf16x2 (round to nearest even), lo in the low half. */
static __device__ __forceinline__ uint32_t pf_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
static __device__ __forceinline__ float pf_bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
static __device__ __forceinline__ float pf_bf16_hi(uint32_t v) {
    return __uint_as_float(v & 0xffff0000u);
}
static __device__ __forceinline__ float pf_bf16(uint16_t v) {
    return __uint_as_float((uint32_t)v << 16);
}

#endif
