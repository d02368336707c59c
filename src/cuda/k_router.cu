/* The MoE router (and shared-expert gate) of a whole micro-batch on the tensor cores: the
 * GEMM-path counterpart of the decode router GEMV, keeping its precision with split bf16
 * planes (docs/architecture.md §4). */
#include "cuda/cuda_common.cuh"

/* router_mma_kernel
 *   y[t, r] = sum_c (xh[t, c] + xl[t, c]) * (wh[r, c] + wl[r, c]),  r < W.rows, t < n_tok,
 *   computed as xh*wh + xh*wl + xl*wh (the xl*wl term, ~2^-18 of the product, is dropped);
 *   wl = W.sb (the low plane of a non-bf16 router) or absent.
 * Shapes: W bf16 [rows, K] (K % (16 * RW_SPLIT) == 0), xh / xl bf16 [n_tok, K], y f32 [n_tok, ldy].
 * Threads: RW_SPLIT warps per block; the block owns 16 tokens x 8 * RW_NT rows; warp w sums the K
 * slice [w, w + 1) * K / RW_SPLIT with mma.sync m16n8k16 (fragments loaded straight from
 * global/L1); the slices meet in shared memory and are added in slice order, so a token's result
 * does not depend on n_tok or on the other tokens (batched == alone, bit for bit). FLOPs: 3 * 2 *
 * rows * K per token. Bytes: W once per 16 tokens from L2, x once per 8 * RW_NT rows. Tested
 * against a host double reference (tests/gpu/test_kernels.c: test_router_gemm). */
#define RW_SPLIT 8
#define RW_NT    2 /* n8 tiles per block: 8 * RW_NT rows */
__global__ void __launch_bounds__(RW_SPLIT * 32)
    router_mma_kernel(float *y, int ldy, tl_gpu_gemm_w W, const uint16_t *xh, const uint16_t *xl,
                      int n_tok) {
    __shared__ float part[RW_SPLIT][16][8 * RW_NT + 1];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    int K = W.cols, t0 = blockIdx.x * 16, r0 = blockIdx.y * 8 * RW_NT, ks = K / RW_SPLIT;
    int ta = min(t0 + g, n_tok - 1), tb = min(t0 + g + 8, n_tok - 1);
    const uint32_t *ah0 = (const uint32_t *)(xh + (size_t)ta * K),
                   *ah1 = (const uint32_t *)(xh + (size_t)tb * K),
                   *al0 = (const uint32_t *)(xl + (size_t)ta * K),
                   *al1 = (const uint32_t *)(xl + (size_t)tb * K);
    const uint32_t *bh[RW_NT], *bl[RW_NT];
    for (int j = 0; j < RW_NT; j++) {
        int r = min(r0 + 8 * j + g, W.rows - 1);
        bh[j] = (const uint32_t *)((const uint16_t *)W.w + (size_t)r * K);
        bl[j] = W.sb ? (const uint32_t *)((const uint16_t *)W.sb + (size_t)r * K) : NULL;
    }
    float acc[RW_NT][4] = {};
    int k_end = (warp + 1) * ks;
#pragma unroll 4
    for (int k = warp * ks; k < k_end; k += 16) {
        int i = (k >> 1) + c; /* u32 index of columns k + 2c, k + 2c + 1 */
        uint32_t a[4] = {__ldg(ah0 + i), __ldg(ah1 + i), __ldg(ah0 + i + 4), __ldg(ah1 + i + 4)};
        uint32_t l[4] = {__ldg(al0 + i), __ldg(al1 + i), __ldg(al0 + i + 4), __ldg(al1 + i + 4)};
#pragma unroll
        for (int j = 0; j < RW_NT; j++) {
            uint32_t b0 = __ldg(bh[j] + i), b1 = __ldg(bh[j] + i + 4);
            mma_bf16(acc[j], a, b0, b1);
            mma_bf16(acc[j], l, b0, b1);
            if (bl[j]) mma_bf16(acc[j], a, __ldg(bl[j] + i), __ldg(bl[j] + i + 4));
        }
    }
#pragma unroll
    for (int j = 0; j < RW_NT; j++) {
        part[warp][g][8 * j + 2 * c] = acc[j][0], part[warp][g][8 * j + 2 * c + 1] = acc[j][1];
        part[warp][g + 8][8 * j + 2 * c] = acc[j][2];
        part[warp][g + 8][8 * j + 2 * c + 1] = acc[j][3];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < 16 * 8 * RW_NT; e += blockDim.x) {
        int tt = e / (8 * RW_NT), rr = e % (8 * RW_NT), t = t0 + tt, r = r0 + rr;
        if (t >= n_tok || r >= W.rows) continue;
        float s = part[0][tt][rr];
        for (int w = 1; w < RW_SPLIT; w++) s += part[w][tt][rr];
        y[(size_t)t * ldy + r] = s;
    }
}

extern "C" int tl_gpu_router_gemm(float *y, int ldy, const tl_gpu_gemm_w *W, const uint16_t *xh,
                                  const uint16_t *xl, int n_tok, const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    if (W->bits != 16 || W->cols % (16 * RW_SPLIT) || ldy < W->rows) return TL_ERR_INVALID;
    dim3 grid(CEIL_DIV(n_tok, 16), CEIL_DIV(W->rows, 8 * RW_NT));
    TL_LAUNCH(st, "router_mma", router_mma_kernel, grid, dim3(RW_SPLIT * 32), 0, y, ldy, *W, xh, xl,
              n_tok);
    return 0;
}
