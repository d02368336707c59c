/* Decode matvecs: bandwidth-bound GEMV over bf16 or q4-tiled weights for a few tokens at once,
 * with an optional fused RMSNorm of the input and an optional accumulate (residual add), and the
 * embedding lookup. */
#include "cuda/k_q4m.cuh"

extern "C" {
#include "common/util.h"
}

/* gemv_q4m_kernel
 *   y[t, r] = (acc ? y[t, r] : 0) + inv_t * sum_c W[r, c] * x[t, c] * nw[c]
 *   inv_t = 1/sqrt(mean(x[t]^2) + eps) and nw = RMSNorm weight when nw != NULL, else 1.
 * W: q4 tiled [rows, K] (rows % 8 == 0, K % 256 == 0); x [n_tok, ldx] f32; y [n_tok, ldy].
 * Tensor-core dot of cuda_common.cuh ("q4m"), persistent: 256 threads = (8 / KS) row blocks x KS
 *   K-slices of KPW tiles; unit u = row blocks u*RBB .. +RBB-1 (RBB = 8 / KS); grid.x blocks (at
 *   most the resident count) loop over the units with the next unit's weights in flight.
 *   blockIdx.y = tile of up to 8 tokens (n_rows = min(8, n_tok) rows staged once per block);
 *   the K-slices meet in shared memory, added in slice order (deterministic).
 * Bytes: rows*K/2 + rows*K/16 per token tile; x from L2.
 * Tested against cpu_matvec (tests/gpu/test_kernels.c: test_gemv_q4). */
/* Fused decode epilogue of the GDN in-projection (conv.out non-NULL): rows r < conv.C are the
 * conv1d inputs of token t; instead of y they produce conv.out[t, r] = conv4_silu(w[r],
 * state[slot_t][0..2][r], value) and shift the state (one token per sequence only). */
typedef struct gemv_conv_epi {
    float *out, *state;
    const float *w;
    const int32_t *tok_slot;
    int C;
} gemv_conv_epi;

template <int KPW>
__global__ void __launch_bounds__(256, 2)
    gemv_q4m_kernel(float *y, int ldy, tl_gpu_gemm_w W, const float *x, int ldx, const float *nw,
                    float eps, int n_tok, int accumulate, int KS, int n_rows, gemv_conv_epi conv) {
    extern __shared__ uint4 xs[];
    __shared__ float s_ss[8 * 8];
    __shared__ float2 s_part[8][32];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = W.cols, KB = K >> 5;
    int RBB = 8 / KS, n_rb = W.rows >> 3, n_units = CEIL_DIV(n_rb, RBB);
    int t0 = blockIdx.y * 8, nt = min(8, n_tok - t0);
    float *sx = q4m_sx(xs, K, n_rows);
    const uint32_t *w = (const uint32_t *)W.w, *sbp = (const uint32_t *)W.sb;
    auto src = [&](int u, int q, const uint32_t **pw, const uint32_t **ps, int *rows, int *rb) {
        *pw = w, *ps = sbp, *rows = W.rows, *rb = u * RBB + q;
        return q < RBB && *rb < n_rb;
    };
    auto prologue = [&]() {
        pdl_trigger();
        pdl_wait();
        if (lane < 8) s_ss[warp * 8 + lane] = 0.0f;
        __syncwarp();
        q4m_stage(xs, sx, x + (size_t)t0 * ldx, ldx, nw, K, nt, threadIdx.x, 256, nw ? s_ss : NULL);
        __syncthreads();
    };
    int g = lane >> 2, t = lane & 3;
    auto emit = [&](int u) {
        int q = warp; /* warps 0 .. RBB-1 write row block u*RBB + warp */
        int rb = u * RBB + q;
        if (q >= RBB || rb >= n_rb || g >= nt) return;
        float a0 = 0.0f, a1 = 0.0f;
        for (int i = 0; i < KS; i++) {
            float2 p = s_part[q * KS + i][lane];
            a0 += p.x, a1 += p.y;
        }
        float inv = 1.0f;
        if (nw) {
            float sq = 0.0f;
            for (int i = 0; i < 8; i++) sq += s_ss[i * 8 + g];
            inv = rsqrtf(sq / (float)K + eps);
        }
        int r = rb * 8 + 2 * t;
        float v0 = a0 * inv, v1 = a1 * inv;
        if (conv.out && r < conv.C) { /* rows 8rb.. lie wholly inside or outside (C % 8 == 0) */
            float *st = conv.state + (size_t)conv.tok_slot[t0 + g] * 3 * conv.C + r;
            float4 w0 = *(const float4 *)(conv.w + (size_t)r * 4),
                   w1 = *(const float4 *)(conv.w + (size_t)r * 4 + 4);
            float2 p0 = *(float2 *)st, p1 = *(float2 *)(st + conv.C),
                   p2 = *(float2 *)(st + 2 * conv.C);
            *(float2 *)(conv.out + (size_t)(t0 + g) * conv.C + r) = make_float2(
                conv4_silu(w0, p0.x, p1.x, p2.x, v0), conv4_silu(w1, p0.y, p1.y, p2.y, v1));
            *(float2 *)st = p1, *(float2 *)(st + conv.C) = p2,
                     *(float2 *)(st + 2 * conv.C) = make_float2(v0, v1);
            return;
        }
        float *o = y + (size_t)(t0 + g) * ldy + r;
        if (accumulate) v0 += o[0], v1 += o[1];
        o[0] = v0, o[1] = v1;
    };
    q4m_persistent<KPW>(blockIdx.x, gridDim.x, n_units, K, KS, src, prologue, emit,
                        xs + min(g, nt - 1) * q4m_lds(K), sx + min(g, nt - 1) * (KB >> 1), s_part,
                        (char *)xs + q4m_smem(K, n_rows));
}

/* gemv_bf16_splitk_kernel: the same contract for bf16 W [rows, K] (K % 256 == 0, any rows);
 * with W.sb non-NULL, W.sb is a second bf16 plane (the low bits of non-bf16 weights) and
 * W = W.w + W.sb.
 * Threads: 256 = 8 warps on the same R rows; warp w takes the 16-byte column chunks
 *   (w*32 + lane)*8 + j*2048 of each row (split-K), partial sums meet in shared memory and are
 *   added in warp order (deterministic). grid.x = ceil(rows/R): R = 8, or R = 2 for matrices of
 *   at most 1024 rows (the 257-row router: 129 blocks instead of 33, which left most SMs idle).
 * Bytes: rows*K*2 per token tile. Tested against cpu_matvec (test_gemv_bf16). */
template <int NT, int R>
__global__ void __launch_bounds__(256)
    gemv_bf16_splitk_kernel(float *y, int ldy, tl_gpu_gemm_w W, const float *x, int ldx,
                            const float *nw, float eps, int n_tok, int accumulate) {
    __shared__ float s_part[8][R * NT + NT];
    pdl_trigger();
    pdl_wait();
    int t0 = blockIdx.y * NT, nt = min(NT, n_tok - t0);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r0 = blockIdx.x * R;
    const float *xp[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) xp[t] = x + (size_t)(t0 + min(t, nt - 1)) * ldx;
    float acc[R][NT], ss[NT];
    bf16_rows_dot<NT>(acc, ss, (const uint16_t *)W.w, W.cols, r0, W.rows, xp, nw, nt, warp, 8);
    if (W.sb) { /* the low bf16 plane of non-bf16 weights (8-bit router): y = hi x + lo x */
        float acc2[R][NT], ss2[NT];
        bf16_rows_dot<NT>(acc2, ss2, (const uint16_t *)W.sb, W.cols, r0, W.rows, xp, nw, nt, warp,
                          8);
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] += acc2[r][t];
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
#pragma unroll
    for (int t = 0; t < NT; t++) ss[t] = warp_sum(ss[t]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) s_part[warp][r * NT + t] = acc[r][t];
#pragma unroll
        for (int t = 0; t < NT; t++) s_part[warp][R * NT + t] = ss[t];
    }
    __syncthreads();
    int i = threadIdx.x;
    if (i >= R * NT) return;
    int r = i / NT, t = i % NT;
    if (t >= nt || r0 + r >= W.rows) return;
    float v = 0.0f, sq = 0.0f;
    for (int w = 0; w < 8; w++) v += s_part[w][i], sq += s_part[w][R * NT + t];
    if (nw) v *= rsqrtf(sq / (float)W.cols + eps);
    float *o = y + (size_t)(t0 + t) * ldy + r0 + r;
    *o = accumulate ? *o + v : v;
}

#define GEMV_BF16_CASE(NT_)                                                                        \
    case NT_:                                                                                      \
        if (W->rows <= 1024)                                                                       \
            TL_LAUNCH(st, "gemv_bf16", (gemv_bf16_splitk_kernel<NT_, 2>),                          \
                      dim3(CEIL_DIV(W->rows, 2), CEIL_DIV(n_tok, NT_)), dim3(256), 0, y, ldy, *W,  \
                      x, ldx, nw, eps, n_tok, acc);                                                \
        else                                                                                       \
            TL_LAUNCH(st, "gemv_bf16", (gemv_bf16_splitk_kernel<NT_, 8>),                          \
                      dim3(CEIL_DIV(W->rows, 8), CEIL_DIV(n_tok, NT_)), dim3(256), 0, y, ldy, *W,  \
                      x, ldx, nw, eps, n_tok, acc);                                                \
        break;

/* The q4m kernels stage up to 8 token rows of x in dynamic shared memory (K = 4096: 133 KB)
 * and keep their weight rings there (8 warps x Q4M_NS stages: 74 KB at KPW 16). */
#define GEMV_MAX_SHM (220 * 1024) /* + static shared memory <= the 227 KB opt-in limit */
/* Raises the q4m kernels' dynamic shared memory limit (tl_gpu_init). */
int cb_gemv_setup(void) {
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4m_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  GEMV_MAX_SHM));
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4m_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  GEMV_MAX_SHM));
    CUDA_TRY(cudaFuncSetAttribute(gemv_q4m_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  GEMV_MAX_SHM));
    return 0;
}

int q4m_split(int K, int max_ks, int *kpw, int *ks) {
    int KB = K >> 5;
    static const int cand[3] = {16, 8, 32}; /* 32 spills (fallback for K > 4096 only) */
    for (int i = 0; i < 3; i++)
        if (KB % cand[i] == 0 && KB / cand[i] <= max_ks) {
            *kpw = cand[i], *ks = KB / cand[i];
            return 0;
        }
    return TL_ERR_INVALID;
}

static int grid_cap;
int cb_grid_cap(void) {
    if (!grid_cap) {
        int dev = 0, n_sm = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            n_sm = 132;
        grid_cap = 2 * n_sm;
    }
    return grid_cap;
}

static int launch_gemv(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                       const float *nw, float eps, int n_tok, int acc, gemv_conv_epi conv,
                       const tl_gpu_stream *st) {
    if (W->bits == 4) {
        int kpw, ks, n_rows = n_tok < 8 ? n_tok : 8;
        if (q4m_split(W->cols, 8, &kpw, &ks)) return TL_ERR_INVALID;
        size_t shm = q4m_smem(W->cols, n_rows) + (size_t)8 * Q4M_NS * q4m_stage_bytes(kpw);
        if (shm > GEMV_MAX_SHM) return TL_ERR_INVALID;
        int n_units = CEIL_DIV(W->rows / 8, 8 / ks), n_tt = CEIL_DIV(n_tok, 8);
        dim3 grid(TL_MAX(1, TL_MIN(n_units, cb_grid_cap() / n_tt)), n_tt);
        auto kern = kpw == 32   ? gemv_q4m_kernel<32>
                    : kpw == 16 ? gemv_q4m_kernel<16>
                                : gemv_q4m_kernel<8>;
        TL_LAUNCH(st, conv.out ? "gemv_q4_conv1d" : "gemv_q4", kern, grid, dim3(256), shm, y, ldy,
                  *W, x, ldx, nw, eps, n_tok, acc, ks, n_rows, conv);
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
                           const float *norm_w, float eps, int n_tok, int accumulate,
                           const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    if (W->bits == 4 && (W->rows % 8 || W->cols % 256)) return TL_ERR_INVALID; /* q4m tiles */
    if (W->bits == 16 && W->cols % 256) return TL_ERR_INVALID;
    gemv_conv_epi none = {NULL, NULL, NULL, NULL, 0};
    return launch_gemv(y, ldy, W, x, ldx, norm_w, eps, n_tok, accumulate, none, st);
}

extern "C" int tl_gpu_gemv_conv1d(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x,
                                  int ldx, const float *norm_w, float eps, int n_tok,
                                  float *conv_out, float *conv_state, const float *conv_w, int C,
                                  const int32_t *tok_slot, const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    if (W->bits != 4 || W->rows % 8 || W->cols % 256 || C % 8 || C > W->rows) return TL_ERR_INVALID;
    gemv_conv_epi conv = {conv_out, conv_state, conv_w, tok_slot, C};
    return launch_gemv(y, ldy, W, x, ldx, norm_w, eps, n_tok, 0, conv, st);
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

extern "C" int tl_gpu_embed(float *x, const tl_gpu_gemm_w *E, const int32_t *tokens, int n_tok,
                            const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    TL_LAUNCH(st, "embed", embed_row_kernel, dim3(n_tok), dim3(256), 0, x, *E, tokens);
    return 0;
}
