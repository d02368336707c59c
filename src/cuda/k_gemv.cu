/* Decode matvecs: bandwidth-bound GEMV over bf16 or q4-tiled weights for a few tokens at once,
 * with an optional fused RMSNorm of the input and an optional accumulate (residual add), and the
 * embedding lookup. */
#include "cuda/cuda_backend.cuh"

/* gemv_q4_kernel
 *   y[t, r] = (acc ? y[t, r] : 0) + inv_t * sum_c W[r, c] * x[t, c] * nw[c]
 *   inv_t = 1/sqrt(mean(x[t]^2) + eps) and nw = RMSNorm weight when nw != NULL, else 1.
 * W: q4 tiled [rows, K] (rows % 8 == 0, K % 128 == 0); x [n_tok, ldx] f32; y [n_tok, ldy].
 * Threads: 256 = 8 warps; the block first stages its NT input rows in shared memory (times nw,
 *   in nibble order, cuda_common.cuh) and sums x^2; then warp w owns row block rb = 8b + w (8 rows)
 *   for the NT tokens (blockIdx.y = token tile); lanes split as in q4_rb_dot (RS = 1: each lane
 *   reads the 128 contiguous bytes of one (rb, kb) tile per step; RS = 2: 64 bytes).
 * Bytes: rows*K/2 + rows*K/16 per token tile; x from L1/L2.
 * Tested against cpu_matvec (tests/gpu/test_kernels.c: test_gemv_q4). */
template <int NT, int RS>
__global__ void __launch_bounds__(256)
    gemv_q4_kernel(float *y, int ldy, tl_gpu_gemm_w W, const float *x, int ldx, const float *nw,
                   float eps, int n_tok, int accumulate) {
    constexpr int LPK = 32 / RS, NR = 8 / RS;
    extern __shared__ float xs[]; /* [NT][q4_xs_ld(K)] staged x (cuda_common.cuh) */
    __shared__ float s_red[8][NT];
    int t0 = blockIdx.y * NT, nt = min(NT, n_tok - t0);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = W.cols, lds = q4_xs_ld(K);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        float ss = q4_stage_x(xs + t * lds, x + (size_t)(t0 + t) * ldx, nw, K, threadIdx.x, blockDim.x);
        ss = warp_sum(ss);
        if (lane == 0) s_red[warp][t] = ss;
    }
    __syncthreads();
    int rb = blockIdx.x * 8 + warp;
    if (rb * 8 >= W.rows) return;
    float acc[NR][NT];
    q4_rb_dot<NT, RS>(acc, (const uint32_t *)W.w, (const uint32_t *)W.sb, W.rows, K, rb, xs, nt);
    group_reduce<NR * NT>(&acc[0][0], LPK);
    if (lane % LPK) return;
    int part = lane / LPK;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        float inv = 1.0f;
        if (nw) {
            float ss = 0.0f;
            for (int w = 0; w < 8; w++) ss += s_red[w][t];
            inv = rsqrtf(ss / (float)K + eps);
        }
#pragma unroll
        for (int i = 0; i < NR; i++) {
            float *o = y + (size_t)(t0 + t) * ldy + rb * 8 + part * NR + i;
            float v = acc[i][t] * inv;
            *o = accumulate ? *o + v : v;
        }
    }
}

/* gemv_bf16_splitk_kernel: the same contract for bf16 W [rows, K] (K % 256 == 0, any rows).
 * Threads: 256 = 8 warps on the same 8 rows; warp w takes the 16-byte column chunks
 *   (w*32 + lane)*8 + j*2048 of each row (split-K), partial sums meet in shared memory and are
 *   added in warp order (deterministic). grid.x = ceil(rows/8): enough blocks even for the
 *   257-row router.
 * Bytes: rows*K*2 per token tile. Tested against cpu_matvec (test_gemv_bf16). */
template <int NT>
__global__ void __launch_bounds__(256)
    gemv_bf16_splitk_kernel(float *y, int ldy, tl_gpu_gemm_w W, const float *x, int ldx,
                            const float *nw, float eps, int n_tok, int accumulate) {
    __shared__ float s_part[8][8 * NT + NT];
    int t0 = blockIdx.y * NT, nt = min(NT, n_tok - t0);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r0 = blockIdx.x * 8;
    const float *xp[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) xp[t] = x + (size_t)(t0 + min(t, nt - 1)) * ldx;
    float acc[8][NT], ss[NT];
    bf16_rows8_dot<NT>(acc, ss, (const uint16_t *)W.w, W.cols, r0, W.rows, xp, nw, nt, warp, 8);
#pragma unroll
    for (int r = 0; r < 8; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
#pragma unroll
    for (int t = 0; t < NT; t++) ss[t] = warp_sum(ss[t]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < 8; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) s_part[warp][r * NT + t] = acc[r][t];
#pragma unroll
        for (int t = 0; t < NT; t++) s_part[warp][8 * NT + t] = ss[t];
    }
    __syncthreads();
    int i = threadIdx.x;
    if (i >= 8 * NT) return;
    int r = i / NT, t = i % NT;
    if (t >= nt || r0 + r >= W.rows) return;
    float v = 0.0f, sq = 0.0f;
    for (int w = 0; w < 8; w++) v += s_part[w][i], sq += s_part[w][8 * NT + t];
    if (nw) v *= rsqrtf(sq / (float)W.cols + eps);
    float *o = y + (size_t)(t0 + t) * ldy + r0 + r;
    *o = accumulate ? *o + v : v;
}

#define GEMV_CASE(NT_)                                                                            \
    case NT_:                                                                                     \
        if (W->bits == 16)                                                                        \
            gemv_bf16_splitk_kernel<NT_><<<dim3(CEIL_DIV(W->rows, 8), CEIL_DIV(n_tok, NT_)), 256, 0, \
                                           tl_cuda_stream>>>(y, ldy, *W, x, ldx, nw, eps, n_tok, acc); \
        else if (W->cols % 1024 == 0 && NT_ == 1)                                                 \
            gemv_q4_kernel<NT_, 1><<<dim3(CEIL_DIV(W->rows, 64), CEIL_DIV(n_tok, NT_)), 256, shm, \
                                     tl_cuda_stream>>>(y, ldy, *W, x, ldx, nw, eps, n_tok, acc);  \
        else                                                                                      \
            gemv_q4_kernel<NT_, 2><<<dim3(CEIL_DIV(W->rows, 64), CEIL_DIV(n_tok, NT_)), 256, shm, \
                                     tl_cuda_stream>>>(y, ldy, *W, x, ldx, nw, eps, n_tok, acc);  \
        break;

/* The q4 kernels stage x in dynamic shared memory (up to 8 tokens of K = 4096: 147 KB). */
#define GEMV_MAX_SHM (8 * 4608 * 4)
static int gemv_attr_done;
int tl_gpu_gemv_setup(void) {
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4_kernel<1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMV_MAX_SHM));
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4_kernel<1, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMV_MAX_SHM));
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4_kernel<2, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMV_MAX_SHM));
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4_kernel<4, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMV_MAX_SHM));
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4_kernel<8, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMV_MAX_SHM));
    gemv_attr_done = 1;
    return 0;
}

static int launch_gemv(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                       const float *nw, float eps, int n_tok, int acc) {
    int nt = n_tok >= 8 ? 8 : n_tok >= 4 ? 4 : n_tok >= 2 ? 2 : 1;
    size_t shm = (size_t)nt * q4_xs_ld(W->cols) * sizeof(float);
    if (W->bits == 4 && shm > GEMV_MAX_SHM) return TL_ERR_INVALID;
    if (!gemv_attr_done && !tl_cuda_capturing) {
        int st = tl_gpu_gemv_setup();
        if (st) return st;
    }
    switch (nt) {
        GEMV_CASE(8)
        GEMV_CASE(4)
        GEMV_CASE(2)
        GEMV_CASE(1)
    }
    LAUNCH_CHECK(W->bits == 4 ? "gemv_q4" : "gemv_bf16");
    return 0;
}

extern "C" int tl_gpu_gemv(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                           const float *norm_w, float eps, int n_tok, int accumulate) {
    if (n_tok <= 0) return 0;
    if (W->bits == 4 && (W->rows % 8 || W->cols % 256)) return TL_ERR_INVALID;
    if (W->bits == 16 && W->cols % 256) return TL_ERR_INVALID;
    return launch_gemv(y, ldy, W, x, ldx, norm_w, eps, n_tok, accumulate);
}

/* embed_row_kernel
 *   x[t, c] = E[tok[t], c] (bf16, or q4 tiled dequantized: scale * q + bias)
 * Threads: one block of 256 per token; thread c handles columns c, c+256, ...
 * Bytes: one row of E per token. Tested in test_gpu_e2e (whole model vs cpu_forward). */
__global__ void embed_row_kernel(float *x, tl_gpu_gemm_w E, const int32_t *tok) {
    int t = blockIdx.x, id = tok[t], K = E.cols;
    float *o = x + (size_t)t * K;
    if (E.bits == 16) {
        const uint16_t *row = (const uint16_t *)E.w + (size_t)id * K;
        for (int c = threadIdx.x; c < K; c += blockDim.x) o[c] = bf2f(row[c]);
        return;
    }
    const uint32_t *w = (const uint32_t *)E.w, *sb = (const uint32_t *)E.sb;
    int rb = id >> 3, r8 = id & 7, KB = K >> 5;
    for (int c = threadIdx.x; c < K; c += blockDim.x) {
        int kb = c >> 5, cc = c & 31;
        /* invert column -> (lane t, nibble n): cc = 2t + q4_col(n) */
        int hi = cc >> 3, lo = cc & 7; /* q4_col(n) = 8*(n&3) + (n>>2); 2t in 0..6 */
        int t = lo >> 1, n = hi + 4 * (lo & 1);
        uint32_t word = w[((size_t)rb * KB + kb) * 32 + r8 * 4 + t];
        uint32_t s2 = sb[(size_t)(kb >> 1) * E.rows + id];
        float q = (float)((word >> (4 * n)) & 15u);
        o[c] = __uint_as_float(s2 << 16) * q + __uint_as_float(s2 & 0xffff0000u);
    }
}

extern "C" int tl_gpu_embed(float *x, const tl_gpu_gemm_w *E, const int32_t *tokens, int n_tok) {
    if (n_tok <= 0) return 0;
    embed_row_kernel<<<n_tok, 256, 0, tl_cuda_stream>>>(x, *E, tokens);
    LAUNCH_CHECK("embed");
    return 0;
}
