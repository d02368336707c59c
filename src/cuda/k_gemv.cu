/* Decode matvecs: bandwidth-bound GEMV over bf16 or q4-tiled weights for a few tokens at once,
 * with an optional fused RMSNorm of the input and an optional accumulate (residual add), and the
 * embedding lookup. */
#include "cuda/cuda_common.cuh"

/* gemv_rows8_kernel
 *   y[t, r] = (acc ? y[t, r] : 0) + inv_t * sum_c W[r, c] * x[t, c] * nw[c]
 *   inv_t = 1/sqrt(mean(x[t]^2) + eps) and nw = RMSNorm weight when nw != NULL, else 1.
 * W: bf16 [rows, K] or q4 tiled (rows % 8 == 0, K % 128 == 0); x [n_tok, ldx] f32; y [n_tok, ldy].
 * Threads: 256 = 8 warps; warp w of block b owns rows 64b + 8w .. +7 and the block's NT tokens
 *   (blockIdx.y picks the token tile). bf16: lane reads 16 B of each row per 256-column step;
 *   q4: lane reads 16 B (32 columns of one row) per step (see q4_rowblock_dot).
 * Bytes: the weights once per token tile (rows*K*2, or rows*K/2 + rows*K/16), x from L1/L2.
 * Tested against cpu_matvec (tests/gpu/test_kernels.c: test_gemv_*). */
template <int BITS, int NT>
__global__ void __launch_bounds__(256)
    gemv_rows8_kernel(float *y, int ldy, tl_gpu_gemm_w W, const float *x, int ldx,
                      const float *nw, float eps, int n_tok, int accumulate) {
    __shared__ float s_inv[NT];
    __shared__ float sbuf[32];
    int t0 = blockIdx.y * NT, nt = min(NT, n_tok - t0);
    const float *xp[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) xp[t] = x + (size_t)(t0 + min(t, nt - 1)) * ldx;
    if (nw) block_inv_rms<NT>(s_inv, xp, W.cols, nt, eps, sbuf);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rb = blockIdx.x * 8 + warp;
    if (rb * 8 >= W.rows) return;
    if (BITS == 4) {
        float acc[NT];
        q4_rowblock_dot<NT>(acc, (const uint32_t *)W.w, (const uint32_t *)W.sb, W.rows, W.cols, rb,
                            xp, nw, nt);
        q4_reduce<NT>(acc);
        if (lane < 8) {
            int r = rb * 8 + lane;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                float v = acc[t] * (nw ? s_inv[t] : 1.0f);
                float *o = y + (size_t)(t0 + t) * ldy + r;
                *o = accumulate ? *o + v : v;
            }
        }
    } else {
        float acc[8][NT];
        bf16_rows8_dot<NT>(acc, (const uint16_t *)W.w, W.cols, rb * 8, W.rows, xp, nw, nt);
#pragma unroll
        for (int r = 0; r < 8; r++) {
            if (lane != r || rb * 8 + r >= W.rows) continue;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                float v = acc[r][t] * (nw ? s_inv[t] : 1.0f);
                float *o = y + (size_t)(t0 + t) * ldy + rb * 8 + r;
                *o = accumulate ? *o + v : v;
            }
        }
    }
}

template <int BITS>
static int launch_gemv_bits(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                            const float *nw, float eps, int n_tok, int acc) {
    int nt = n_tok >= 8 ? 8 : n_tok >= 4 ? 4 : n_tok >= 2 ? 2 : 1;
    dim3 grid(CEIL_DIV(W->rows, 64), CEIL_DIV(n_tok, nt));
    switch (nt) {
    case 8: gemv_rows8_kernel<BITS, 8><<<grid, 256, 0, tl_cuda_stream>>>(y, ldy, *W, x, ldx, nw, eps, n_tok, acc); break;
    case 4: gemv_rows8_kernel<BITS, 4><<<grid, 256, 0, tl_cuda_stream>>>(y, ldy, *W, x, ldx, nw, eps, n_tok, acc); break;
    case 2: gemv_rows8_kernel<BITS, 2><<<grid, 256, 0, tl_cuda_stream>>>(y, ldy, *W, x, ldx, nw, eps, n_tok, acc); break;
    default: gemv_rows8_kernel<BITS, 1><<<grid, 256, 0, tl_cuda_stream>>>(y, ldy, *W, x, ldx, nw, eps, n_tok, acc); break;
    }
    LAUNCH_CHECK(BITS == 4 ? "gemv_q4" : "gemv_bf16");
    return 0;
}

extern "C" int tl_gpu_gemv(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                           const float *norm_w, float eps, int n_tok, int accumulate) {
    if (n_tok <= 0) return 0;
    if (W->bits == 4) {
        if (W->rows % 8 || W->cols % 128) return TL_ERR_INVALID;
        return launch_gemv_bits<4>(y, ldy, W, x, ldx, norm_w, eps, n_tok, accumulate);
    }
    if (W->cols % 256) return TL_ERR_INVALID;
    return launch_gemv_bits<16>(y, ldy, W, x, ldx, norm_w, eps, n_tok, accumulate);
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
