/* The standalone norms (the 1+w form: the loader already folded the offset into w): the f32
 * RMSNorm before the LM head, the bf16 RMSNorm of the GEMM paths (with the router's low plane),
 * the gated RMSNorm of the GDN output for the GEMM paths and for the column-cut decode step
 * (TL_GDN_COLS=1; otherwise it is fused into k_gdn_decode.cu), the f32 -> bf16 cast, and the MTP
 * head's small row kernels (concatenation, row copies). The decode path's pre-projection norms
 * are fused into the GEMVs (k_gemv.cu, k_moe.cu). */
#include "cuda/k_rms.cuh"

/* rmsnorm_row_kernel
 *   y[i, c] = x[r, c] / sqrt(mean_c(x[r]^2) + eps) * w[c],  r = rows ? rows[i] : i
 * Shapes: x [*, n] f32, y [n_out, n] f32, w [n] f32.
 * Threads: one block of 256 per output row; block reduction of the sum of squares (fixed order).
 * Bytes: 2 * n * 4 per row. Tested against cpu_rmsnorm (test_kernels.c: test_rmsnorm). */
__global__ void rmsnorm_row_kernel(float *y, const float *x, const float *w, const int32_t *rows,
                                   int n, float eps) {
    __shared__ float sbuf[32];
    pdl_trigger();
    pdl_wait();
    int i = blockIdx.x, r = rows ? rows[i] : i;
    const float *xr = x + (size_t)r * n;
    float s = 0.0f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) s = fmaf(xr[c], xr[c], s);
    s = block_sum(s, sbuf);
    float inv = rsqrtf(s / (float)n + eps);
    for (int c = threadIdx.x; c < n; c += blockDim.x) y[(size_t)i * n + c] = xr[c] * inv * w[c];
}

extern "C" int tl_gpu_rmsnorm(float *y, const float *x, const float *w, const int32_t *rows,
                              int n_out, int n, float eps, const tl_gpu_stream *st) {
    if (n_out <= 0) return 0;
    TL_LAUNCH(st, "rmsnorm", rmsnorm_row_kernel, dim3(n_out), dim3(256), 0, y, x, w, rows, n, eps);
    return 0;
}

/* rmsnorm_bf16_kernel: the same RMSNorm written as bf16, the activation format of the prefill
 * GEMMs (gpu.h). y [n_rows, n] bf16; yl (if non-NULL) gets the low plane bf16(v - y) of each
 * normed value v, for the router's split-precision GEMM (k_router.cu). One block of 256 per row.
 * note: rows of n = 8 * 256 (the model's width): a thread owns 8 contiguous values, read once
 * as two float4 and written as one 16-byte store (yl likewise; k_rms.cuh); other widths take the
 * strided loop. Tested against cpu_rmsnorm (test_kernels.c: test_norms_bf16), through the whole
 * prefill path (test_gpu_e2e.c: test_prefill_gemm_vs_decode) and test_kernels.c: test_router_gemm.
 * With d.g (tl_gpu_rmsnorm_bf16x2_dot): also d.g[i * d.ldg] = sum_c v[c] * (gh[c] + gl[c]), the
 * normed f32 row against one bf16 weight row (its low plane gl optional), each thread's values in
 * column order, then the block sum (fixed order: a row's bits do not depend on the rows beside it).
 */
struct rms_dot {
    const uint16_t *gh, *gl; /* the weight row and its low plane (or NULL) */
    float *g;                /* NULL: no dot product */
    int ldg;
};
static __device__ __forceinline__ float rms_dot_w(const rms_dot &d, int c) {
    return bf2f(d.gh[c]) + (d.gl ? bf2f(d.gl[c]) : 0.0f);
}
__global__ void rmsnorm_bf16_kernel(uint16_t *y, uint16_t *yl, const float *x, const float *w,
                                    int n, float eps, rms_dot d, int trig) {
    pdl_enter(trig); /* launched with PDL on the batched path: cuda_common.cuh */
    __shared__ float sbuf[32];
    int i = blockIdx.x;
    const float *xr = x + (size_t)i * n;
    if (n == 8 * (int)blockDim.x) {
        int c0 = 8 * threadIdx.x;
        float4 a = *(const float4 *)(xr + c0), b = *(const float4 *)(xr + c0 + 4);
        float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        rms_row8(v, w, c0, n, eps, sbuf);
        rms_store8(y + (size_t)i * n + c0, yl ? yl + (size_t)i * n + c0 : NULL, v);
        if (!d.g) return; /* block-uniform */
        float p = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) p = fmaf(v[k], rms_dot_w(d, c0 + k), p);
        p = block_sum(p, sbuf);
        if (threadIdx.x == 0) d.g[(size_t)i * d.ldg] = p;
        return;
    }
    float s = 0.0f, p = 0.0f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) s = fmaf(xr[c], xr[c], s);
    s = block_sum(s, sbuf);
    float inv = rsqrtf(s / (float)n + eps);
    for (int c = threadIdx.x; c < n; c += blockDim.x) {
        float v = xr[c] * inv * w[c];
        uint16_t h = f2bf(v);
        y[(size_t)i * n + c] = h;
        if (yl) yl[(size_t)i * n + c] = f2bf(v - bf2f(h));
        if (d.g) p = fmaf(v, rms_dot_w(d, c), p);
    }
    if (!d.g) return;
    p = block_sum(p, sbuf);
    if (threadIdx.x == 0) d.g[(size_t)i * d.ldg] = p;
}

extern "C" int tl_gpu_rmsnorm_bf16(uint16_t *y, const float *x, const float *w, int n_rows, int n,
                                   float eps, const tl_gpu_stream *st) {
    return tl_gpu_rmsnorm_bf16x2(y, NULL, x, w, n_rows, n, eps, st);
}

extern "C" int tl_gpu_rmsnorm_bf16x2(uint16_t *y, uint16_t *yl, const float *x, const float *w,
                                     int n_rows, int n, float eps, const tl_gpu_stream *st) {
    return tl_gpu_rmsnorm_bf16x2_dot(y, yl, x, w, n_rows, n, eps, NULL, NULL, 0, st);
}

extern "C" int tl_gpu_rmsnorm_bf16x2_dot(uint16_t *y, uint16_t *yl, const float *x, const float *w,
                                         int n_rows, int n, float eps, const tl_gpu_gemm_w *G,
                                         float *g, int ldg, const tl_gpu_stream *st) {
    if (n_rows <= 0) return 0;
    rms_dot d = {NULL, NULL, NULL, 0};
    if (g) {
        if (!G || G->bits != 16 || G->rows < 1 || G->cols != n || ldg < 1) return TL_ERR_INVALID;
        d = (rms_dot){(const uint16_t *)G->w, (const uint16_t *)G->sb, g, ldg};
    }
    TL_LAUNCH(st, "rmsnorm_bf16", rmsnorm_bf16_kernel, dim3(n_rows), dim3(256), 0, y, yl, x, w, n,
              eps, d, tl_pdl_trig(st));
    return 0;
}

/* gated_rmsnorm_kernel  (docs/model.md §2.4 step 8, HF Qwen3_5MoeRMSNormGated)
 *   y[t, h*128 + c] = o[t,h,c] / sqrt(mean_c(o[t,h]^2) + eps) * w[c] * silu(z[t, h*128 + c])
 * Shapes: o [n, nv*128] f32; z at proj[t*ld_proj + z_off + ...] (ld_proj, z_off multiples of 4);
 * y [n, nv*128] bf16 (the GEMM paths) or f32 (F32: the decode path after gdn_cols; y may be o).
 * Threads: one warp per (token, head), 8 a block: a lane owns 4 contiguous values (float4 of o
 *   and z, one 8- or 16-byte store after all its reads), the sum of squares by warp shuffles.
 *   (One block of 128 per (token, head) with a block reduction ran at ~40% of the bandwidth:
 *   64K tiny blocks at 2K tokens.)
 * Tested against the host (test_kernels.c: test_norms_bf16, test_gdn_cols_norm) and with the
 * prefill path. */
template <bool F32>
__global__ void gated_rmsnorm_kernel(void *y, const float *o, const float *proj, int ld_proj,
                                     int z_off, const float *w, int nv, int n, float eps,
                                     int trig) {
    pdl_enter(trig); /* launched with PDL on the batched path: cuda_common.cuh */
    int pair = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (pair >= n * nv) return; /* warp-uniform */
    int t = pair / nv, h = pair % nv, c = 4 * lane;
    size_t i = (size_t)pair * 128 + c;
    float4 v = *(const float4 *)(o + i);
    float ss = warp_sum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
    float inv = rsqrtf(ss / 128.0f + eps);
    float4 z = *(const float4 *)(proj + (size_t)t * ld_proj + z_off + h * 128 + c);
    float4 wv = *(const float4 *)(w + c);
    float4 r = make_float4(v.x * inv * wv.x * silu_f(z.x), v.y * inv * wv.y * silu_f(z.y),
                           v.z * inv * wv.z * silu_f(z.z), v.w * inv * wv.w * silu_f(z.w));
    if (F32)
        *(float4 *)((float *)y + i) = r;
    else
        *(uint2 *)((uint16_t *)y + i) = make_uint2(bf16x2_pack(r.x, r.y), bf16x2_pack(r.z, r.w));
}

template <bool F32>
static int gated_rmsnorm(void *y, const float *o, const float *proj, int ld_proj, int z_off,
                         const float *w, int nv, int n, float eps, const tl_gpu_stream *st) {
    if (n <= 0) return 0;
    if (ld_proj % 4 || z_off % 4) return TL_ERR_INVALID;
    unsigned blocks = (unsigned)(((long)n * nv + 7) / 8);
    TL_LAUNCH(st, F32 ? "gated_rmsnorm_f32" : "gated_rmsnorm_bf16", gated_rmsnorm_kernel<F32>,
              dim3(blocks), dim3(256), 0, y, o, proj, ld_proj, z_off, w, nv, n, eps,
              tl_pdl_trig(st));
    return 0;
}
extern "C" int tl_gpu_gated_rmsnorm_bf16(uint16_t *y, const float *o, const float *proj,
                                         int ld_proj, int z_off, const float *w, int nv, int n,
                                         float eps, const tl_gpu_stream *st) {
    return gated_rmsnorm<false>(y, o, proj, ld_proj, z_off, w, nv, n, eps, st);
}
extern "C" int tl_gpu_gated_rmsnorm_f32(float *y, const float *o, const float *proj, int ld_proj,
                                        int z_off, const float *w, int nv, int n, float eps,
                                        const tl_gpu_stream *st) {
    return gated_rmsnorm<true>(y, o, proj, ld_proj, z_off, w, nv, n, eps, st);
}

/* cast_bf16_kernel: y[i] = bf16(x[i]) (round to nearest even), the f32 outputs of the decode
 * mixers into the tensor-core GEMMs (cuda_forward.cu: batched decode). Grid-stride, 4 per thread.
 * Tested against the host rounding (test_kernels.c: test_cast_bf16). */
__global__ void cast_bf16_kernel(uint16_t *y, const float *x, long n, int trig) {
    pdl_enter(trig); /* launched with PDL on the batched path: cuda_common.cuh */
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = f2bf(x[i]);
}

extern "C" int tl_gpu_cast_bf16(uint16_t *y, const float *x, long n, const tl_gpu_stream *st) {
    if (n <= 0) return 0;
    long blocks = (n + 255) / 256 < 1056 ? (n + 255) / 256 : 1056;
    TL_LAUNCH(st, "cast_bf16", cast_bf16_kernel, dim3((unsigned)blocks), dim3(256), 0, y, x, n,
              tl_pdl_trig(st));
    return 0;
}

/* mtp_cat_kernel  (docs/model.md §3.2 step 1: the MTP head's input)
 *   cat[t, 0:n]  = rmsnorm(e[t]; w_e)
 *   cat[t, n:2n] = rmsnorm(h[r]; w_h),  r = h_rows ? h_rows[t] : t
 * Shapes: e [n_tok, n] f32 (the token's embedding), h [*, n] f32 (a hidden picked by row),
 * cat [n_tok, 2n] f32. Threads: one block of 256 per (token, half); block reduction as
 * rmsnorm_row_kernel. Tested against cpu_rmsnorm (test_kernels.c: test_mtp_cat). */
__global__ void mtp_cat_kernel(float *cat, const float *e, const float *w_e, const float *h,
                               const int32_t *h_rows, const float *w_h, int n, float eps) {
    __shared__ float sbuf[32];
    int t = blockIdx.x, half = blockIdx.y;
    const float *xr = half ? h + (size_t)(h_rows ? h_rows[t] : t) * n : e + (size_t)t * n;
    const float *w = half ? w_h : w_e;
    float s = 0.0f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) s = fmaf(xr[c], xr[c], s);
    s = block_sum(s, sbuf);
    float inv = rsqrtf(s / (float)n + eps);
    float *y = cat + (size_t)t * 2 * n + (size_t)half * n;
    for (int c = threadIdx.x; c < n; c += blockDim.x) y[c] = xr[c] * inv * w[c];
}

extern "C" int tl_gpu_mtp_cat(float *cat, const float *e, const float *w_e, const float *h,
                              const int32_t *h_rows, const float *w_h, int n_tok, int n, float eps,
                              const tl_gpu_stream *st) {
    if (n_tok < 0 || n <= 0) return TL_ERR_INVALID;
    if (n_tok == 0) return 0;
    TL_LAUNCH(st, "mtp_cat", mtp_cat_kernel, dim3(n_tok, 2), dim3(256), 0, cat, e, w_e, h, h_rows,
              w_h, n, eps);
    return 0;
}

/* copy_rows_kernel: dst[dr, :] = src[sr, :], dr = dst_rows ? dst_rows[i] : i, sr likewise, for
 * i < n_rows (rows of n f32; the destination rows must be distinct). Threads: one block of 256
 * per row. Bit-exact; tested in test_kernels.c: test_copy_rows. */
__global__ void copy_rows_kernel(float *dst, const int32_t *dst_rows, const float *src,
                                 const int32_t *src_rows, int n) {
    int i = blockIdx.x;
    float *d = dst + (size_t)(dst_rows ? dst_rows[i] : i) * n;
    const float *s = src + (size_t)(src_rows ? src_rows[i] : i) * n;
    for (int c = threadIdx.x; c < n; c += blockDim.x) d[c] = s[c];
}

extern "C" int tl_gpu_copy_rows(float *dst, const int32_t *dst_rows, const float *src,
                                const int32_t *src_rows, int n_rows, int n,
                                const tl_gpu_stream *st) {
    if (n_rows < 0 || n <= 0) return TL_ERR_INVALID;
    if (n_rows == 0) return 0;
    TL_LAUNCH(st, "copy_rows", copy_rows_kernel, dim3(n_rows), dim3(256), 0, dst, dst_rows, src,
              src_rows, n);
    return 0;
}
