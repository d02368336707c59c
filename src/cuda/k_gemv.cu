/* Decode matvecs: bandwidth-bound GEMV over bf16 or q4-tiled weights for a few tokens at once,
 * with an optional fused RMSNorm of the input and an optional accumulate (residual add), and the
 * embedding lookup. */
#include "cuda/cuda_backend.cuh"

/* gemv_q4m_kernel
 *   y[t, r] = (acc ? y[t, r] : 0) + inv_t * sum_c W[r, c] * x[t, c] * nw[c]
 *   inv_t = 1/sqrt(mean(x[t]^2) + eps) and nw = RMSNorm weight when nw != NULL, else 1.
 * W: q4 tiled [rows, K] (rows % 8 == 0, K % 256 == 0); x [n_tok, ldx] f32; y [n_tok, ldy].
 * Tensor-core dot of cuda_common.cuh ("q4m"): 256 threads = 8 warps = (8 >> ks_log2) row blocks
 *   x (1 << ks_log2) K-slices; warp (rb, ks) reads tiles kb = ks*KPW .. +KPW-1 (then every
 *   KS*KPW further), 4 bytes per lane per tile, all KPW loads issued before x is staged (and,
 *   under PDL, before the previous kernel has finished). blockIdx.y = tile of up to 8 tokens
 *   (n_rows = min(8, n_tok) staged rows); the K-slices meet in shared memory, added in slice order.
 * Bytes: rows*K/2 + rows*K/16 per token tile; x from L2.
 * Tested against cpu_matvec (tests/gpu/test_kernels.c: test_gemv_q4). */
template <int KPW>
__global__ void __launch_bounds__(256, 2)
    gemv_q4m_kernel(float *y, int ldy, tl_gpu_gemm_w W, const float *x, int ldx, const float *nw,
                    float eps, int n_tok, int accumulate, int ks_log2, int n_rows) {
    extern __shared__ uint4 xs[];
    __shared__ float s_ss[8 * 8];
    __shared__ float2 s_part[8][32];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = W.cols, KB = K >> 5;
    int KS = 1 << ks_log2, ks = warp & (KS - 1);
    int rb = blockIdx.x * (8 >> ks_log2) + (warp >> ks_log2);
    int live = rb * 8 < W.rows, kb0 = ks * KPW;
    const uint32_t *w = (const uint32_t *)W.w, *sb = (const uint32_t *)W.sb;
    uint32_t wq[KPW];
    uint2 sbv[KPW / 2];
    if (live) q4m_load<KPW>(wq, sbv, w, sb, W.rows, K, rb, kb0);
    pdl_trigger();
    pdl_wait();
    int t0 = blockIdx.y * 8, nt = min(8, n_tok - t0);
    float *sx = q4m_sx(xs, K, n_rows);
    if (lane < 8) s_ss[warp * 8 + lane] = 0.0f;
    __syncwarp();
    q4m_stage(xs, sx, x + (size_t)t0 * ldx, ldx, nw, K, nt, threadIdx.x, 256, nw ? s_ss : NULL);
    __syncthreads();
    int g = lane >> 2, t = lane & 3;
    const uint4 *xrow = g < nt ? xs + g * q4m_lds(K) : NULL;
    const float *sxrow = g < nt ? sx + g * (KB >> 1) : NULL;
    float acc0 = 0.0f, acc1 = 0.0f;
    if (live) {
        q4m_dot<KPW>(acc0, acc1, wq, sbv, xrow, sxrow, kb0);
        for (kb0 += KS * KPW; kb0 < KB; kb0 += KS * KPW) {
            q4m_load<KPW>(wq, sbv, w, sb, W.rows, K, rb, kb0);
            q4m_dot<KPW>(acc0, acc1, wq, sbv, xrow, sxrow, kb0);
        }
    }
    if (KS > 1) {
        s_part[warp][lane] = make_float2(acc0, acc1);
        __syncthreads();
        if (ks) return;
        for (int i = 1; i < KS; i++) {
            float2 p = s_part[warp + i][lane];
            acc0 += p.x, acc1 += p.y;
        }
    }
    if (!live || g >= nt) return;
    float inv = 1.0f;
    if (nw) {
        float sq = 0.0f;
        for (int i = 0; i < 8; i++) sq += s_ss[i * 8 + g];
        inv = rsqrtf(sq / (float)K + eps);
    }
    float *o = y + (size_t)(t0 + g) * ldy + rb * 8 + 2 * t;
    float v0 = acc0 * inv, v1 = acc1 * inv;
    if (accumulate) v0 += o[0], v1 += o[1];
    o[0] = v0, o[1] = v1;
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
    pdl_trigger();
    pdl_wait();
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

#define GEMV_BF16_CASE(NT_)                                                                       \
    case NT_:                                                                                     \
        TL_LAUNCH("gemv_bf16", gemv_bf16_splitk_kernel<NT_>,                                      \
                  dim3(CEIL_DIV(W->rows, 8), CEIL_DIV(n_tok, NT_)), dim3(256), 0, y, ldy, *W, x, ldx, \
                  nw, eps, n_tok, acc);                                                           \
        break;

/* The q4m kernels stage up to 8 token rows of x in dynamic shared memory (K = 4096: 133 KB). */
#define GEMV_MAX_SHM (200 * 1024)
static int gemv_attr_done;
int tl_gpu_gemv_setup(void) {
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4m_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMV_MAX_SHM));
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4m_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMV_MAX_SHM));
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4m_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMV_MAX_SHM));
    gemv_attr_done = 1;
    return 0;
}

/* Split of K = 32*KB columns for the q4m kernels: KPW tiles per warp step (32, 16 or 8, dividing
 * KB) and 2^ks_log2 warps along K (at most 8 and at most KB/KPW; max_ks_log2 caps it). */
void q4m_split(int K, int max_ks_log2, int *kpw, int *ks_log2) {
    int KB = K >> 5;
    *kpw = KB % 32 == 0 ? 32 : KB % 16 == 0 ? 16 : 8;
    int l = 0;
    while (l < max_ks_log2 && (KB / *kpw) >= (2 << l)) l++;
    *ks_log2 = l;
}

static int launch_gemv(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                       const float *nw, float eps, int n_tok, int acc) {
    if (!gemv_attr_done && !tl_cuda_capturing) {
        int st = tl_gpu_gemv_setup();
        if (st) return st;
    }
    if (W->bits == 4) {
        int kpw, ksl, n_rows = n_tok < 8 ? n_tok : 8;
        q4m_split(W->cols, 3, &kpw, &ksl);
        size_t shm = q4m_smem(W->cols, n_rows);
        if (shm > GEMV_MAX_SHM) return TL_ERR_INVALID;
        dim3 grid(CEIL_DIV(W->rows / 8, 8 >> ksl), CEIL_DIV(n_tok, 8));
        if (kpw == 32)
            TL_LAUNCH("gemv_q4", gemv_q4m_kernel<32>, grid, dim3(256), shm, y, ldy, *W, x, ldx, nw, eps, n_tok, acc, ksl, n_rows);
        else if (kpw == 16)
            TL_LAUNCH("gemv_q4", gemv_q4m_kernel<16>, grid, dim3(256), shm, y, ldy, *W, x, ldx, nw, eps, n_tok, acc, ksl, n_rows);
        else
            TL_LAUNCH("gemv_q4", gemv_q4m_kernel<8>, grid, dim3(256), shm, y, ldy, *W, x, ldx, nw, eps, n_tok, acc, ksl, n_rows);
        return 0;
    }
    int nt = n_tok >= 8 ? 8 : n_tok >= 4 ? 4 : n_tok >= 2 ? 2 : 1;
    switch (nt) {
        GEMV_BF16_CASE(8)
        GEMV_BF16_CASE(4)
        GEMV_BF16_CASE(2)
        GEMV_BF16_CASE(1)
    }
    return 0;
}

extern "C" int tl_gpu_gemv(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                           const float *norm_w, float eps, int n_tok, int accumulate) {
    if (n_tok <= 0) return 0;
    if (W->bits == 4 && (W->rows % 8 || W->cols % 256)) return TL_ERR_INVALID; /* q4m tiles */
    if (W->bits == 16 && W->cols % 256) return TL_ERR_INVALID;
    return launch_gemv(y, ldy, W, x, ldx, norm_w, eps, n_tok, accumulate);
}

/* embed_row_kernel
 *   x[t, c] = E[tok[t], c] (bf16, or q4 tiled dequantized: scale * q + bias)
 * Threads: one block of 256 per token; thread c handles columns c, c+256, ...
 * Bytes: one row of E per token. Tested in test_gpu_e2e (whole model vs cpu_forward). */
__global__ void embed_row_kernel(float *x, tl_gpu_gemm_w E, const int32_t *tok) {
    pdl_trigger();
    pdl_wait();
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
    TL_LAUNCH("embed", embed_row_kernel, dim3(n_tok), dim3(256), 0, x, *E, tokens);
    return 0;
}
