/* The RMSNorm of one row held 8 values a thread, shared by rmsnorm_bf16_kernel (k_norm.cu) and
 * the MoE combine that folds the next layer's norm (k_moe.cu), so both give the same bits. */
#ifndef TL_K_RMS_CUH
#define TL_K_RMS_CUH

#include "cuda/cuda_common.cuh"

/* A row of n = 8 blockDim.x values whose thread i holds v = columns 8i .. 8i + 7: v *= inv w
 * (inv = 1 / sqrt(mean of squares + eps)). Every thread of the block (a barrier). */
__device__ __forceinline__ void rms_row8(float (&v)[8], const float *w, int c0, int n, float eps,
                                         float *sbuf) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) s = fmaf(v[k], v[k], s);
    float inv = rsqrtf(block_sum(s, sbuf) / (float)n + eps);
    float4 wa = *(const float4 *)(w + c0), wb = *(const float4 *)(w + c0 + 4);
    float wv[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = v[k] * inv * wv[k];
}
/* v as 8 bf16 (one 16-byte store) and, when yl, the low planes bf16(v - bf16(v)). */
__device__ __forceinline__ void rms_store8(uint16_t *y, uint16_t *yl, const float (&v)[8]) {
    uint32_t h[4], l[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        h[k] = bf16x2_pack(v[2 * k], v[2 * k + 1]);
        l[k] = bf16x2_pack(v[2 * k] - bf16x2_lo(h[k]), v[2 * k + 1] - bf16x2_hi(h[k]));
    }
    *(uint4 *)y = make_uint4(h[0], h[1], h[2], h[3]);
    if (yl) *(uint4 *)yl = make_uint4(l[0], l[1], l[2], l[3]);
}

#endif
