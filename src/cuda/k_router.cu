/* The MoE router (and shared-expert gate) of a whole micro-batch on the tensor cores: the
 * GEMM-path counterpart of the decode router GEMV, keeping its precision with split bf16
 * planes (docs/architecture.md §5.2). */
#include "cuda/cuda_common.cuh"
#include "cuda/k_wgmma.cuh"

/* router_mma_kernel<TM, TN>
 *   y[t, r] = sum_c (xh[t, c] + xl[t, c]) * (wh[r, c] + wl[r, c]),  r < W.rows, t < n_tok,
 *   computed as xh*wh + xl*wh + xh*wl (the xl*wl term, ~2^-18 of the product, is dropped);
 *   wl = W.sb (the low plane of a non-bf16 router) or absent.
 * Shapes: W bf16 [rows, K] (K % 64 == 0), xh / xl bf16 [n_tok, K], y f32 [n_tok, ldy].
 * Threads: 8 warps; the block owns TM tokens x TN rows, warp (wm, wn) = TM/4 tokens x TN/2 rows
 *   (MI m16 blocks x NJ n8 tiles). K runs in 64-wide tiles through a 3-stage cp.async ring into
 *   shared memory (rows padded to 72 elements: ldmatrix rows hit distinct bank groups); tokens and
 *   rows past the ends load as zeros and are not stored. Each output is one accumulation chain
 *   over k in order (per 16 k: xh*wh, xl*wh, xh*wl), whatever TM and TN, so a token's result does
 *   not depend on n_tok, the other tokens or the tile (batched == alone).
 * Rows: the forward passes the 256 experts' rows only (the shared-expert gate's row is a dot
 *   product in the RMSNorm before it: tl_gpu_rmsnorm_bf16x2_dot), 4 row tiles instead of 5.
 * Tiles: 64 x 64 (two blocks an SM, 108 KB). A 128 x 128 tile (one block an SM, reading x three
 *   times instead of five and W once per 128 tokens: ~170 instead of ~300 MB from L2 a 4K-token
 *   layer) measured the same (prefill 4K 55,315 vs 55,127 tok/s, 16K 50,931 vs 50,919, H100,
 *   session 25) and was removed.
 * Split-K: a micro-batch of at most RT_SPLIT_MAX_T tokens has at most 16 x 4 blocks of 64 x 64,
 *   each streaming all of K (the router took ~26 us at 64 tokens on 5 SMs, 33 us at 512 tokens on
 *   32 blocks: H100, session 29), so on a stream K is
 *   cut into RT_SPLIT shares (grid z), the RT_SPLIT blocks of a tile one cluster: each leaves its
 *   raw sums in its shared memory and block z adds the tile's pairs z, z + RT_SPLIT, ... over the
 *   cluster's blocks in z order (rt_cluster_sum; until session 26 through a workspace and a
 *   router_sum kernel, the same additions in the same order: the same bits, one launch fewer a
 *   layer). The cut depends on the token count's side of RT_SPLIT_MAX_T only, so batched ==
 *   alone still holds below it.
 * FLOPs: 3 * 2 * rows * K per token. Bytes: W (both planes) once per TM tokens, x once per TN
 *   rows, from L2.
 * Tested against a host double reference (tests/gpu/test_kernels.c: test_router_gemm; the host
 *   emulator, dev/emu/gemm_emu.sh, both tiles against each other). */
#define RT_K           64   /* k per stage */
#define RT_LDS         72   /* padded row, elements */
#define RT_STAGES      3    /* cp.async ring */
#define RT_SPLIT       8    /* K shares of a small micro-batch */
#define RT_SPLIT_MAX_T 1024 /* up to this many tokens (default; tl_gpu_router_split_max) */
template <int TM, int TN> struct rt_cfg {
    static constexpr int MI = TM / 64, NJ = TN / 16;         /* m16 blocks, n8 tiles a warp */
    static constexpr int XT = TM * RT_LDS, WT = TN * RT_LDS; /* elements of a plane's tile */
    static constexpr int STAGE = 2 * XT + 2 * WT;            /* xh, xl, wh, wl */
    static constexpr int SMEM = RT_STAGES * STAGE * 2;
    static constexpr int LDO = TN + 2; /* the split's f32 sums in shared memory: row stride */
};

/* The split's sum (see Split-K above): this block's sums acc (the ring is free: every warp is past
 * its last tile) into its shared memory, a cluster barrier, then block z adds its pairs over the
 * cluster's blocks in z order from their shared memory and stores them; a second barrier keeps
 * every block's sums alive until all have read them. */
template <int TM, int TN>
static __device__ __forceinline__ void rt_cluster_sum(float *y, int ldy, int rows, int n_tok,
                                                      const float (&acc)[TM / 64][TN / 16][4],
                                                      float *so, int t0, int r0) {
    typedef rt_cfg<TM, TN> C;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp & 3, wn = warp >> 2;
    __syncthreads();
#pragma unroll
    for (int mi = 0; mi < C::MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < C::NJ; j++) {
                int t = wm * (TM / 4) + mi * 16 + (lane >> 2) + 8 * h;
                int r = wn * (TN / 2) + 8 * j + 2 * (lane & 3);
                *(float2 *)(so + t * C::LDO + r) =
                    make_float2(acc[mi][j][2 * h], acc[mi][j][2 * h + 1]);
            }
    const uint32_t so_a = smem_u32(so);
    cluster_sync();
    for (int i = blockIdx.z * 256 + tid; i < TM * TN / 2; i += gridDim.z * 256) {
        int t = i / (TN / 2), r = 2 * (i % (TN / 2)), tg = t0 + t, rg = r0 + r;
        uint32_t a = so_a + (uint32_t)(t * C::LDO + r) * 4;
        float v0 = 0.0f, v1 = 0.0f;
        for (int z = 0; z < (int)gridDim.z; z++) {
            float2 g = dsmem_ld2(dsmem_map(a, z));
            v0 += g.x, v1 += g.y;
        }
        if (tg >= n_tok) continue;
        if (rg < rows) y[(size_t)tg * ldy + rg] = v0;
        if (rg + 1 < rows) y[(size_t)tg * ldy + rg + 1] = v1;
    }
    cluster_sync();
}
template <int TM, int TN>
__global__ void __launch_bounds__(256)
    router_mma_kernel(float *y, int ldy, tl_gpu_gemm_w W, const uint16_t *xh, const uint16_t *xl,
                      int n_tok, int trig) {
    typedef rt_cfg<TM, TN> C;
    pdl_enter(trig); /* launched with PDL on the batched path: cuda_common.cuh */
    extern __shared__ __align__(16) uint16_t rt_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp & 3, wn = warp >> 2;
    const int t0 = blockIdx.x * TM, r0 = blockIdx.y * TN, K = W.cols;
    const int KT = K / RT_K / gridDim.z, kb = blockIdx.z * KT; /* split-K: z's share */
    const uint16_t *wh = (const uint16_t *)W.w, *wl = (const uint16_t *)W.sb;
    /* this thread's 16-byte chunks of a stage: rows tid/8 + 32 h, column chunk tid%8 */
    auto load = [&](int stage, int kt) {
        uint16_t *s = rt_smem + stage * C::STAGE;
        int c8 = (tid & 7) * 8, k0 = (kb + kt) * RT_K + c8;
#pragma unroll
        for (int h = 0; h < TM / 32; h++) {
            int r = (tid >> 3) + 32 * h, t = t0 + r, tok = t < n_tok ? t : 0;
            cp_async16(s + r * RT_LDS + c8, xh + (size_t)tok * K + k0, t < n_tok ? 16 : 0);
            cp_async16(s + C::XT + r * RT_LDS + c8, xl + (size_t)tok * K + k0, t < n_tok ? 16 : 0);
        }
#pragma unroll
        for (int h = 0; h < TN / 32; h++) {
            int r = (tid >> 3) + 32 * h, w = r0 + r, row = w < W.rows ? w : 0;
            cp_async16(s + 2 * C::XT + r * RT_LDS + c8, wh + (size_t)row * K + k0,
                       w < W.rows ? 16 : 0);
            if (wl)
                cp_async16(s + 2 * C::XT + C::WT + r * RT_LDS + c8, wl + (size_t)row * K + k0,
                           w < W.rows ? 16 : 0);
        }
    };
    float acc[C::MI][C::NJ][4] = {};
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
        const uint16_t *s = rt_smem + (kt % RT_STAGES) * C::STAGE;
        const uint16_t *sw = s + 2 * C::XT;
#pragma unroll
        for (int kk = 0; kk < RT_K / 16; kk++) {
            uint32_t ah[C::MI][4], al[C::MI][4], bh[C::NJ][2], bl[C::NJ][2];
#pragma unroll
            for (int mi = 0; mi < C::MI; mi++) {
                int ar =
                    (wm * (TM / 4) + mi * 16 + (lane & 15)) * RT_LDS + kk * 16 + (lane >> 4) * 8;
                ldmatrix_x4(ah[mi], s + ar);
                ldmatrix_x4(al[mi], s + C::XT + ar);
            }
#pragma unroll
            for (int np = 0; np < C::NJ / 2; np++) {
                int br = (wn * (TN / 2) + np * 16 + (lane >> 4) * 8 + (lane & 7)) * RT_LDS +
                         kk * 16 + ((lane >> 3) & 1) * 8;
                uint32_t r[4];
                ldmatrix_x4(r, sw + br);
                bh[2 * np][0] = r[0], bh[2 * np][1] = r[1];
                bh[2 * np + 1][0] = r[2], bh[2 * np + 1][1] = r[3];
                if (wl) {
                    ldmatrix_x4(r, sw + C::WT + br);
                    bl[2 * np][0] = r[0], bl[2 * np][1] = r[1];
                    bl[2 * np + 1][0] = r[2], bl[2 * np + 1][1] = r[3];
                }
            }
#pragma unroll
            for (int mi = 0; mi < C::MI; mi++)
#pragma unroll
                for (int j = 0; j < C::NJ; j++) {
                    mma_bf16(acc[mi][j], ah[mi], bh[j][0], bh[j][1]);
                    mma_bf16(acc[mi][j], al[mi], bh[j][0], bh[j][1]);
                    if (wl) mma_bf16(acc[mi][j], ah[mi], bl[j][0], bl[j][1]);
                }
        }
    }
    cp_async_wait<0>();
    if (gridDim.z > 1)
        return rt_cluster_sum<TM, TN>(y, ldy, W.rows, n_tok, acc, (float *)rt_smem, t0, r0);
#pragma unroll
    for (int mi = 0; mi < C::MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int t = t0 + wm * (TM / 4) + mi * 16 + (lane >> 2) + 8 * h;
            if (t >= n_tok) continue;
#pragma unroll
            for (int j = 0; j < C::NJ; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int r = r0 + wn * (TN / 2) + 8 * j + 2 * (lane & 3) + e;
                    if (r < W.rows) y[(size_t)t * ldy + r] = acc[mi][j][2 * h + e];
                }
        }
}

/* router_wg_kernel: router_mma_kernel's y for micro-batches of at least RW_MIN_TOK tokens
 * (prefill chunks; TL_ROUTER_WG=0: the mma.sync kernel) on wgmma, at twice mma.sync's tensor rate.
 * Threads: one warpgroup; the block owns 64 tokens x RW_N rows. LO: W has its low plane. Per
 * 64-wide k stage the tiles xh, xl (64 x 64) and wh, wl (RW_N x 64) sit K-major with the 128-byte
 * swizzle in shared memory (k_wgdesc.cuh) and each k16 step issues xh*wh, xl*wh, xh*wl as
 * m64n128k16 wgmma from shared memory into one accumulator (the mma.sync kernel's three terms in
 * its order); every output is one chain over k whatever the tile, so a token's result does not
 * depend on n_tok. Pipeline: RW_STAGES slots of cp.async copies, RW_STAGES - 2 stages ahead of the
 * one multiplied, whose wgmma stays in flight while the next stage's are issued (wg_wait<1>); the
 * weights of the first stages are requested before the PDL wait (constant), the tokens after it.
 * Grid: ceil(n_tok / 64) x ceil(rows / RW_N); one block an SM (193 KB): a 4K chunk's 128 blocks
 *   are one wave, where the 64 x 64 mma.sync tiles (2 an SM) left 320 and then 256 blocks.
 * Bytes: W once per 64 tokens, x once per 128 rows (from L2). Tested against the host double
 * reference beside the mma.sync kernel (test_kernels.c: test_router_gemm; dev/emu/gemm_emu.sh). */
#define RW_N      128
#define RW_STAGES 4
#define RW_XB     (64 * 128)   /* bytes of a token plane's tile in a stage */
#define RW_WB     (RW_N * 128) /* bytes of a weight plane's tile */
#define RW_STAGE  (2 * RW_XB + 2 * RW_WB)
#define RW_SMEM   (RW_STAGES * RW_STAGE + 1024) /* + the 1024-byte alignment of the tiles */
template <bool LO>
__global__ void __launch_bounds__(128, 1)
    router_wg_kernel(float *y, int ldy, tl_gpu_gemm_w W, const uint16_t *xh, const uint16_t *xl,
                     int n_tok, int trig) {
    extern __shared__ __align__(16) uint8_t rw_raw[];
    uint8_t *sm = rw_raw + ((1024 - (smem_u32(rw_raw) & 1023)) & 1023);
    const int tid = threadIdx.x, t0 = blockIdx.x * 64, r0 = blockIdx.y * RW_N, K = W.cols;
    const int KT = K / RT_K;
    const uint16_t *wh = (const uint16_t *)W.w, *wl = (const uint16_t *)W.sb;
    /* 16-byte chunk i of a tile: row i / 8, chunk i % 8 of its 64 columns (zeros past the ends) */
    auto load_w = [&](int slot, int kt) {
        uint8_t *s = sm + slot * RW_STAGE + 2 * RW_XB;
#pragma unroll
        for (int i = tid; i < RW_N * 8; i += 128) {
            int r = i >> 3, c = i & 7, row = r0 + r, ok = row < W.rows;
            size_t off = (size_t)(ok ? row : 0) * K + kt * RT_K + c * 8;
            cp_async16(s + wg_swz(r, c), wh + off, ok ? 16 : 0);
            if (LO) cp_async16(s + RW_WB + wg_swz(r, c), wl + off, ok ? 16 : 0);
        }
    };
    auto load_x = [&](int slot, int kt) {
        uint8_t *s = sm + slot * RW_STAGE;
#pragma unroll
        for (int i = tid; i < 64 * 8; i += 128) {
            int r = i >> 3, c = i & 7, t = t0 + r, ok = t < n_tok;
            size_t off = (size_t)(ok ? t : 0) * K + kt * RT_K + c * 8;
            cp_async16(s + wg_swz(r, c), xh + off, ok ? 16 : 0);
            cp_async16(s + RW_XB + wg_swz(r, c), xl + off, ok ? 16 : 0);
        }
    };
#pragma unroll
    for (int s = 0; s < RW_STAGES - 2; s++)
        if (s < KT) load_w(s, s);
    pdl_enter(trig); /* the tokens come from the norm kernel before */
#pragma unroll
    for (int s = 0; s < RW_STAGES - 2; s++) {
        if (s < KT) load_x(s, s);
        cp_async_commit();
    }
    float acc[RW_N / 2];
    const uint32_t sa = smem_u32(sm);
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<RW_STAGES - 3>(); /* this thread's copies of stage kt */
        wg_fence_proxy();
        __syncthreads(); /* everyone's; and the wgmma of stage kt - 2 are done (wg_wait<1>) */
        int nk = kt + RW_STAGES - 2;
        if (nk < KT) load_w(nk % RW_STAGES, nk), load_x(nk % RW_STAGES, nk);
        cp_async_commit();
        const uint32_t st = sa + (kt % RW_STAGES) * RW_STAGE;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < RT_K / 16; kk++) {
            const uint64_t dxh = wg_desc(st + kk * 32), dxl = wg_desc(st + RW_XB + kk * 32);
            const uint64_t dwh = wg_desc(st + 2 * RW_XB + kk * 32);
            wg_mma_ss<RW_N>(acc, dxh, dwh, kt | kk); /* the first product starts the sums */
            wg_mma_ss<RW_N>(acc, dxl, dwh, 1);
            if (LO) wg_mma_ss<RW_N>(acc, dxh, wg_desc(st + 2 * RW_XB + RW_WB + kk * 32), 1);
        }
        wg_commit();
        wg_wait<1>();
    }
    wg_wait<0>();
    wg_pin(acc);
    const int lane = tid & 31, w = tid >> 5;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = t0 + 16 * w + (lane >> 2) + 8 * h;
        if (t >= n_tok) continue;
        float *yr = y + (size_t)t * ldy;
#pragma unroll
        for (int j = 0; j < RW_N / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int r = r0 + 8 * j + 2 * (lane & 3) + e;
                if (r < W.rows) yr[r] = acc[4 * j + 2 * h + e];
            }
    }
}

/* Which unsplit calls run router_wg_kernel (TL_ROUTER_WG, read once, or tl_gpu_router_set_wg):
 * 1 (default) those of at least RW_MIN_TOK tokens, 2 all, 0 none. Below ~3K tokens its grid
 * (2 blocks per 64 tokens, one an SM) leaves SMs idle where the mma.sync tiles' (4 per 64 tokens,
 * two an SM) do not: H100, prefill 1K 38,555 vs 38,295 tok/s, 2K 51,337 vs 51,125 (mma.sync vs
 * wgmma, two rounds each); at 4K 55,770 vs 56,135, 16K 50,300 vs 50,700. */
#define RW_MIN_TOK 3072
static cb_level router_wg = {"TL_ROUTER_WG", 1, 2, -1};
extern "C" int tl_gpu_router_set_wg(int mode) { return cb_level_set(&router_wg, mode); }

template <bool LO>
static int router_wg_launch(float *y, int ldy, const tl_gpu_gemm_w *W, const uint16_t *xh,
                            const uint16_t *xl, int n_tok, const tl_gpu_stream *st) {
    if (smem_limit<router_wg_kernel<LO>>(RW_SMEM)) return TL_ERR_CUDA;
    dim3 grid(CEIL_DIV(n_tok, 64), CEIL_DIV(W->rows, RW_N));
    TL_LAUNCH(st, "router_wg", router_wg_kernel<LO>, grid, dim3(128), RW_SMEM, y, ldy, *W, xh, xl,
              n_tok, tl_pdl_trig(st));
    return 0;
}

/* The most tokens of a split call: RT_SPLIT_MAX_T, or TL_ROUTER_SPLIT_MAX (read once; A/B) or
 * tl_gpu_router_split_max. 1,024 since session 29 (256 before: prefill 384 +5.8%, 512 +3.1%, 1K
 * +0.7%; 2,048 lost 2.4% at 2K; H100, BENCHMARKS.md). */
static int router_split_n = -1;
static int router_split_max(void) {
    if (router_split_n < 0) {
        const char *e = getenv("TL_ROUTER_SPLIT_MAX");
        router_split_n = e && *e && atoi(e) > 0 ? atoi(e) : RT_SPLIT_MAX_T;
    }
    return router_split_n;
}
extern "C" int tl_gpu_router_split_max(int n) {
    int was = router_split_max();
    if (n >= 0) router_split_n = n;
    return was;
}

template <int TM, int TN>
static int router_launch(float *y, int ldy, const tl_gpu_gemm_w *W, const uint16_t *xh,
                         const uint16_t *xl, int n_tok, int split, const tl_gpu_stream *st) {
    if (smem_limit<router_mma_kernel<TM, TN>>(rt_cfg<TM, TN>::SMEM)) return TL_ERR_CUDA;
    dim3 grid(CEIL_DIV(n_tok, TM), CEIL_DIV(W->rows, TN), split ? RT_SPLIT : 1);
    /* split: the RT_SPLIT blocks of a tile are one cluster (rt_cluster_sum) */
    TL_LAUNCH_CLUSTER(st, "router_mma", split ? RT_SPLIT : 1, router_mma_kernel<TM, TN>, grid,
                      dim3(256), rt_cfg<TM, TN>::SMEM, y, ldy, *W, xh, xl, n_tok, tl_pdl_trig(st));
    return 0;
}

extern "C" int tl_gpu_router_gemm(float *y, int ldy, const tl_gpu_gemm_w *W, const uint16_t *xh,
                                  const uint16_t *xl, int n_tok, const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    if (W->bits != 16 || W->cols % RT_K || ldy < W->rows) return TL_ERR_INVALID;
    int split = n_tok <= router_split_max() && (W->cols / RT_K) % RT_SPLIT == 0 && st;
    int wg = cb_level_get(&router_wg);
    if (!split && (wg == 2 || (wg == 1 && n_tok >= RW_MIN_TOK)))
        return W->sb ? router_wg_launch<true>(y, ldy, W, xh, xl, n_tok, st)
                     : router_wg_launch<false>(y, ldy, W, xh, xl, n_tok, st);
    return router_launch<64, 64>(y, ldy, W, xh, xl, n_tok, split, st);
}
