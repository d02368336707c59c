/* RMSNorm (the 1+w form: the loader already folded the offset into w). The gated RMSNorm of the
 * GDN output is fused into k_gdn_decode.cu, and the pre-projection norms into the GEMVs
 * (k_gemv.cu, k_moe.cu); this standalone kernel serves the final norm before the LM head. */
#include "cuda/cuda_common.cuh"

/* rmsnorm_row_kernel
 *   y[i, c] = x[r, c] / sqrt(mean_c(x[r]^2) + eps) * w[c],  r = rows ? rows[i] : i
 * Shapes: x [*, n] f32, y [n_out, n] f32, w [n] f32.
 * Threads: one block of 256 per output row; block reduction of the sum of squares (fixed order).
 * Bytes: 2 * n * 4 per row. Tested against cpu_rmsnorm (test_kernels.c: test_rmsnorm). */
__global__ void rmsnorm_row_kernel(float *y, const float *x, const float *w, const int32_t *rows,
                                   int n, float eps) {
    __shared__ float sbuf[32];
    int i = blockIdx.x, r = rows ? rows[i] : i;
    const float *xr = x + (size_t)r * n;
    float s = 0.0f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) s = fmaf(xr[c], xr[c], s);
    s = block_sum(s, sbuf);
    float inv = rsqrtf(s / (float)n + eps);
    for (int c = threadIdx.x; c < n; c += blockDim.x) y[(size_t)i * n + c] = xr[c] * inv * w[c];
}

extern "C" int tl_gpu_rmsnorm(float *y, const float *x, const float *w, const int32_t *rows,
                              int n_out, int n, float eps) {
    if (n_out <= 0) return 0;
    rmsnorm_row_kernel<<<n_out, 256, 0, tl_cuda_stream>>>(y, x, w, rows, n, eps);
    LAUNCH_CHECK("rmsnorm");
    return 0;
}
