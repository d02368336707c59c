/* The MoE router (and shared-expert gate) of a whole micro-batch on the tensor cores: the
 * GEMM-path counterpart of the decode router GEMV, keeping its precision with split bf16
 * planes (docs/architecture.md §5.2). */
#include "cuda/cuda_common.cuh"

/* router_mma_kernel
 *   y[t, r] = sum_c (xh[t, c] + xl[t, c]) * (wh[r, c] + wl[r, c]),  r < W.rows, t < n_tok,
 *   computed as xh*wh + xl*wh + xh*wl (the xl*wl term, ~2^-18 of the product, is dropped);
 *   wl = W.sb (the low plane of a non-bf16 router) or absent.
 * Shapes: W bf16 [rows, K] (K % 64 == 0), xh / xl bf16 [n_tok, K], y f32 [n_tok, ldy].
 * Threads: 8 warps; the block owns 64 tokens x 64 rows, warp (wm, wn) = 16 tokens x 32 rows
 *   (4 n8 tiles). K runs in 64-wide tiles through a 3-stage cp.async ring into shared memory
 *   (rows padded to 72 elements: ldmatrix rows hit distinct bank groups); tokens and rows past
 *   the ends load as zeros and are not stored. Each output is one accumulation chain over k in
 *   order, so a token's result does not depend on n_tok or the other tokens (batched == alone).
 * Split-K: a micro-batch of at most RT_SPLIT_MAX_T tokens has at most 4 x 5 blocks of 64 x 64,
 *   each streaming all of K (the router took ~26 us at 64 tokens on 5 SMs), so with a workspace
 *   on the stream K is cut into RT_SPLIT shares (grid z); block z writes its raw sums to plane z
 *   of the workspace and router_sum_kernel adds the planes in z order. The cut depends on the
 *   token count's side of RT_SPLIT_MAX_T only, so batched == alone still holds below it.
 * FLOPs: 3 * 2 * rows * K per token. Bytes: W (both planes) once per 64 tokens, x once per 64
 *   rows, from L2.
 * Tested against a host double reference (tests/gpu/test_kernels.c: test_router_gemm). */
#define RT_M           64              /* tokens per block */
#define RT_N           64              /* router rows per block */
#define RT_K           64              /* k per stage */
#define RT_LDS         72              /* padded row, elements */
#define RT_TILE        (RT_M * RT_LDS) /* elements of one 64-row tile */
#define RT_STAGE       (4 * RT_TILE)   /* xh, xl, wh, wl */
#define RT_STAGES      3               /* cp.async ring: 108 KB, two blocks an SM */
#define RT_SMEM        (RT_STAGES * RT_STAGE * 2)
#define RT_SPLIT       8   /* K shares of a small micro-batch */
#define RT_SPLIT_MAX_T 256 /* up to this many tokens */
__global__ void __launch_bounds__(256)
    router_mma_kernel(float *y, int ldy, tl_gpu_gemm_w W, const uint16_t *xh, const uint16_t *xl,
                      int n_tok) {
    pdl_wait(); /* launched with PDL on the batched path: cuda_common.cuh */
    extern __shared__ __align__(16) uint16_t rt_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp & 3, wn = warp >> 2;
    const int t0 = blockIdx.x * RT_M, r0 = blockIdx.y * RT_N, K = W.cols;
    const int KT = K / RT_K / gridDim.z, kb = blockIdx.z * KT; /* split-K: z's share */
    const uint16_t *wh = (const uint16_t *)W.w, *wl = (const uint16_t *)W.sb;
    /* this thread's 16-byte chunks of a stage: row tid/8 and tid/8 + 32, column chunk tid%8 */
    auto load = [&](int stage, int kt) {
        uint16_t *s = rt_smem + stage * RT_STAGE;
        int c8 = (tid & 7) * 8, k0 = (kb + kt) * RT_K + c8;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = (tid >> 3) + 32 * h, t = t0 + r, w = r0 + r;
            int tok = t < n_tok ? t : 0, row = w < W.rows ? w : 0;
            cp_async16(s + r * RT_LDS + c8, xh + (size_t)tok * K + k0, t < n_tok ? 16 : 0);
            cp_async16(s + RT_TILE + r * RT_LDS + c8, xl + (size_t)tok * K + k0,
                       t < n_tok ? 16 : 0);
            cp_async16(s + 2 * RT_TILE + r * RT_LDS + c8, wh + (size_t)row * K + k0,
                       w < W.rows ? 16 : 0);
            if (wl)
                cp_async16(s + 3 * RT_TILE + r * RT_LDS + c8, wl + (size_t)row * K + k0,
                           w < W.rows ? 16 : 0);
        }
    };
    float acc[4][4] = {};
#pragma unroll
    for (int st = 0; st < RT_STAGES - 1; st++) {
        if (st < KT) load(st, st);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<RT_STAGES - 2>(); /* tile kt */
        __syncthreads();                /* and every warp is past tile kt - 1: its stage is free */
        if (kt + RT_STAGES - 1 < KT) load((kt + RT_STAGES - 1) % RT_STAGES, kt + RT_STAGES - 1);
        cp_async_commit();
        const uint16_t *s = rt_smem + (kt % RT_STAGES) * RT_STAGE;
#pragma unroll
        for (int kk = 0; kk < RT_K / 16; kk++) {
            uint32_t ah[4], al[4], bh[4][2], bl[4][2];
            int ar = (wm * 16 + (lane & 15)) * RT_LDS + kk * 16 + (lane >> 4) * 8;
            ldmatrix_x4(ah, s + ar);
            ldmatrix_x4(al, s + RT_TILE + ar);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                int br = (wn * 32 + np * 16 + (lane >> 4) * 8 + (lane & 7)) * RT_LDS + kk * 16 +
                         ((lane >> 3) & 1) * 8;
                uint32_t r[4];
                ldmatrix_x4(r, s + 2 * RT_TILE + br);
                bh[2 * np][0] = r[0], bh[2 * np][1] = r[1];
                bh[2 * np + 1][0] = r[2], bh[2 * np + 1][1] = r[3];
                if (wl) {
                    ldmatrix_x4(r, s + 3 * RT_TILE + br);
                    bl[2 * np][0] = r[0], bl[2 * np][1] = r[1];
                    bl[2 * np + 1][0] = r[2], bl[2 * np + 1][1] = r[3];
                }
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                mma_bf16(acc[j], ah, bh[j][0], bh[j][1]);
                mma_bf16(acc[j], al, bh[j][0], bh[j][1]);
                if (wl) mma_bf16(acc[j], ah, bl[j][0], bl[j][1]);
            }
        }
    }
    cp_async_wait<0>();
    y += (size_t)blockIdx.z * n_tok * ldy; /* split: plane z of the workspace */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = t0 + wm * 16 + (lane >> 2) + 8 * h;
        if (t >= n_tok) continue;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int r = r0 + wn * 32 + 8 * j + 2 * (lane & 3) + e;
                if (r < W.rows) y[(size_t)t * ldy + r] = acc[j][2 * h + e];
            }
    }
}

extern "C" size_t tl_gpu_router_ws_bytes(int rows, int n_tok) {
    n_tok = n_tok < RT_SPLIT_MAX_T ? n_tok : RT_SPLIT_MAX_T;
    return (size_t)RT_SPLIT * n_tok * rows * sizeof(float);
}

/* y[t, r] = sum over z of ws[z][t][r] (planes of n_tok x rows), in z order. */
__global__ void router_sum_kernel(float *y, int ldy, const float *ws, int rows, int n_tok,
                                  int n_split) {
    pdl_wait();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_tok * rows) return;
    const size_t plane = (size_t)n_tok * rows;
    float v = 0.0f;
    for (int z = 0; z < n_split; z++) v += ws[z * plane + i];
    y[(size_t)(i / rows) * ldy + i % rows] = v;
}

extern "C" int tl_gpu_router_gemm(float *y, int ldy, const tl_gpu_gemm_w *W, const uint16_t *xh,
                                  const uint16_t *xl, int n_tok, const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    if (W->bits != 16 || W->cols % RT_K || ldy < W->rows) return TL_ERR_INVALID;
    int split = n_tok <= RT_SPLIT_MAX_T && (W->cols / RT_K) % RT_SPLIT == 0 && st && st->ws &&
                st->ws_bytes >= tl_gpu_router_ws_bytes(W->rows, n_tok);
    static int attr_set;
    if (!attr_set) {
        if (cudaFuncSetAttribute(router_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 RT_SMEM) != cudaSuccess)
            return TL_ERR_CUDA;
        attr_set = 1;
    }
    dim3 grid(CEIL_DIV(n_tok, RT_M), CEIL_DIV(W->rows, RT_N), split ? RT_SPLIT : 1);
    TL_LAUNCH(st, "router_mma", router_mma_kernel, grid, dim3(256), RT_SMEM, split ? st->ws : y,
              split ? W->rows : ldy, *W, xh, xl, n_tok);
    if (split)
        TL_LAUNCH(st, "router_sum", router_sum_kernel, dim3(CEIL_DIV(n_tok * W->rows, 256)),
                  dim3(256), 0, y, ldy, st->ws, W->rows, n_tok, RT_SPLIT);
    return 0;
}
