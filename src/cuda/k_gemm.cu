/* Prefill GEMMs on the tensor cores: Y[n, rows] = X[n, cols] W^T with X bf16 activations and W
 * either BF16 or 4-bit affine g64 (dequantized in the main loop), fp32 accumulation, bf16 or f32
 * output and fused epilogues (residual add, SwiGLU). Two kernels: mma.sync and wgmma (Hopper),
 * picked per shape by gemm_pick_tile; the same kernels run the MoE
 * grouped GEMMs (rows gathered by expert from a routing plan; the plan and combine kernels are in
 * k_moe.cu, the 4-bit repack in cuda_weights.cu). Launches only: never allocates, never
 * synchronises. Invariant: rows % 128 == 0 and cols % 64 == 0 (every production matrix; checked
 * at entry). Sections: tiling, mma.sync kernel, wgmma kernel, dispatch, MoE grouped GEMM. The
 * wgr kernel (wgmma with the weights in A registers) is k_gemm_wgr.cu; what the kernels share
 * (arguments, plan tiles, epilogue store, prologue) is k_gemm_common.cuh. */
#include <stdlib.h>

#include "cuda/k_q4m.cuh"
#include "cuda/k_wgmma.cuh"

/* ====== Tiling. ======
 * Block tile BM (tokens) x BN (weight rows) x 64 (k) with BM = 16*MI*WM and BN = 32*NJ: 4*WM
 * warps as WM (M) x 4 (N), warp tile 16*MI x 8*NJ = MI x NJ mma.sync m16n8k16. Configurations in
 * use: 128x128 (WM 2, NJ 4, MI 4), 64x128 (WM 1, NJ 4, MI 4: small grids and MoE with few tokens
 * per expert), 128x256 (WM 2, NJ 8, MI 4: large problems; fewer shared-memory reads per mma) and
 * 16x128 (WM 1, NJ 4, MI 1: a decode batch's MoE, 2-8 tokens per expert, 4x less wasted tensor
 * work than 64 rows for the same weight traffic; and, with TL_DENSE_WGR_DEC=0, 4-bit dense
 * products of at most 64 tokens, where its 4x more blocks hide the weight stream's latency
 * better: the dense GEMMs of a 64-sequence decode step took 3.7 ms against 4.7 ms with 64x128,
 * but 7.5 against 5.7 at 256; by default those run the wgr kernel, tl_gpu_gemm). A
 * and bf16 B tiles live in shared memory with rows padded to 72 elements (144 B: the 8 row
 * addresses of an ldmatrix hit 8 distinct 16-byte bank groups). note: 4-bit B tiles stay packed in
 * shared memory (BN*32 B per stage instead of BN*128 B) and each thread dequantizes its own B
 * fragments into registers right before the mma (gpu.h describes the nibble order that makes this
 * one 32-bit load per fragment pair). */
#define GM_LDS       72
#define GM_ROW_ALIGN 128 /* rows must be a multiple of this (smallest BN) */

#include "cuda/k_gemm_common.cuh"

template <int BITS, int WM, int NJ, int MI> struct gm_cfg {
    static constexpr int BM = 16 * MI * WM, BN = 32 * NJ, THREADS = 128 * WM;
    static constexpr int A_BYTES = BM * GM_LDS * 2;
    static constexpr int B_BYTES = BITS == 16 ? BN * GM_LDS * 2 : BN * GM_BK / 2 + BN * 4;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    /* note: 8 stages for the 16x128 tile measured no better than 4 (decode batch 64 and 256,
     * 2026-12-04, notes/2026-12-04-router-conv1d.md) */
    static constexpr int STAGES = (3 * STAGE_BYTES <= 120 * 1024 || BITS == 4) ? 4 : 3;
    static constexpr int SMEM = STAGES * STAGE_BYTES;
};

/* ====== The GEMM kernel. ======
 * math: acc[m, n] = sum_k X[src(m), k] * W[n, k]; out[dst(m), n] = epilogue(acc).
 * shapes: X bf16 [*, K]; W bf16 [N, K] or q4 tiled; Y bf16/f32 [*, ldy].
 * threads: 4*WM warps per block (blockIdx.x = BN weight rows, blockIdx.y = BM token rows or one
 *   expert tile of the plan); warp (wm, wn) owns rows wm*64.. and columns wn*8*NJ..; a lane holds
 *   the mma C fragments (row lane/4 (+8), cols 2*(lane%4)+{0,1}).
 * bytes: X read N/BN times (from L2), W read ceil(M/BM) times (L2), Y written once.
 * reference: cpu_matmul (tests/gpu/test_prefill_kernels.c). */
template <int BITS, int WM, int NJ, int MI>
__global__ void __launch_bounds__(128 * WM, MI == 1 ? 8 : 1) gemm_mma_kernel(gemm_args p) {
    typedef gm_cfg<BITS, WM, NJ, MI> C;
    constexpr int BM = C::BM, BN = C::BN, THREADS = C::THREADS;
    extern __shared__ __align__(128) uint8_t gm_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int n0 = blockIdx.x * BN;
    const uint8_t *wb = p.w;
    const uint32_t *sbb = p.sb;
    const int32_t *perm;
    int m0, m_end;
    /* PDL (batched path): the MoE plan comes from the previous kernel; a dense product's weights
     * do not, and its first stages of them are requested before the wait (prologue below) */
    if (p.mode != GM_DENSE) pdl_enter(p.trig);
    if (!gm_tile<BITS, BM>(p, &wb, &sbb, &perm, &m0, &m_end)) return;

    /* A source rows of this thread's MI chunks: chunk c = tid + THREADS j -> row c/8, 16 B column
     * c%8 */
    const uint16_t *a_src[MI];
    int a_ok[MI];
#pragma unroll
    for (int j = 0; j < MI; j++) {
        int r = (tid >> 3) + (THREADS / 8) * j, m = m0 + r;
        a_ok[j] = m < m_end;
        int src = m;
        if (p.mode == GM_MOE_GATHER && a_ok[j]) src = gm_tok(p, gm_asg(p, perm, m));
        a_src[j] = p.x + (size_t)(a_ok[j] ? src : 0) * p.K + (tid & 7) * 8;
    }

    const int KT = p.K / GM_BK / gridDim.z, kt_base = blockIdx.z * KT; /* split-K: z's share */
    auto load_a = [&](int stage, int kt) {
        uint16_t *sA = (uint16_t *)(gm_smem + stage * C::STAGE_BYTES);
        const int k0 = (kt_base + kt) * GM_BK;
#pragma unroll
        for (int j = 0; j < MI; j++) {
            int r = (tid >> 3) + (THREADS / 8) * j;
            cp_async16(sA + r * GM_LDS + (tid & 7) * 8, a_src[j] + k0, a_ok[j] ? 16 : 0);
        }
    };
    auto load_b = [&](int stage, int kt) {
        uint8_t *s = gm_smem + stage * C::STAGE_BYTES;
        const int k0 = (kt_base + kt) * GM_BK;
        if (BITS == 16) {
            uint16_t *sB = (uint16_t *)(s + C::A_BYTES);
            const uint16_t *wg = (const uint16_t *)wb;
#pragma unroll
            for (int j = 0; j < BN * 8 / THREADS; j++) {
                int r = (tid >> 3) + (THREADS / 8) * j;
                cp_async16(sB + r * GM_LDS + (tid & 7) * 8,
                           wg + (size_t)(n0 + r) * p.K + k0 + (tid & 7) * 8, 16);
            }
        } else {
            uint32_t *sQ = (uint32_t *)(s + C::A_BYTES);
            uint32_t *sS = sQ + BN * GM_BK / 8;
            const uint32_t *wq = (const uint32_t *)wb;
#pragma unroll
            for (int j = 0; j < 2 * BN / THREADS; j++) {
                int c = tid + THREADS * j, rb = c >> 4, ch = c & 15;
                cp_async16(sQ + rb * 64 + ch * 4,
                           wq + ((size_t)(n0 / 8 + rb) * (p.K / 32) + k0 / 32) * 32 + ch * 4, 16);
            }
            if (tid < BN / 4)
                cp_async16(sS + tid * 4, sbb + (size_t)(k0 / 64) * p.N + n0 + tid * 4, 16);
        }
    };
    auto load_stage = [&](int stage, int kt) {
        load_a(stage, kt);
        load_b(stage, kt);
    };

    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;

    gm_prologue<C::STAGES>(KT, p.mode == GM_DENSE, p.trig, load_a, load_b);

    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<C::STAGES - 2>();
        __syncthreads();
        int nk = kt + C::STAGES - 1;
        if (nk < KT) load_stage(nk % C::STAGES, nk);
        cp_async_commit();

        const uint8_t *s = gm_smem + (kt % C::STAGES) * C::STAGE_BYTES;
        const uint16_t *sA = (const uint16_t *)s;
        uint32_t bq[NJ][4];
#pragma unroll
        for (int kk = 0; kk < GM_BK / 16; kk++) {
            uint32_t af[MI][4], bf[NJ][2];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                ldmatrix_x4(af[mi], sA + (wm * 16 * MI + mi * 16 + (lane & 15)) * GM_LDS + kk * 16 +
                                        (lane >> 4) * 8);
            if (BITS == 16) {
                const uint16_t *sB = (const uint16_t *)(s + C::A_BYTES);
#pragma unroll
                for (int np = 0; np < NJ / 2; np++) {
                    uint32_t r[4];
                    ldmatrix_x4(
                        r, sB + (wn * 8 * NJ + np * 16 + (lane >> 4) * 8 + (lane & 7)) * GM_LDS +
                               kk * 16 + ((lane >> 3) & 1) * 8);
                    bf[2 * np][0] = r[0];
                    bf[2 * np][1] = r[1];
                    bf[2 * np + 1][0] = r[2];
                    bf[2 * np + 1][1] = r[3];
                }
            } else {
                if ((kk & 1) == 0) {
                    const uint32_t *sQ = (const uint32_t *)(s + C::A_BYTES);
                    const uint32_t *sS = sQ + BN * GM_BK / 8;
                    const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
#pragma unroll
                    for (int nj = 0; nj < NJ; nj++) {
                        int rb = wn * NJ + nj;
                        uint32_t word = sQ[(rb * 2 + (kk >> 1)) * 32 + lane];
                        uint32_t sbw = sS[rb * 8 + (lane >> 2)];
                        uint32_t s2u = (sbw & 0xffffu) | (sbw << 16);
                        uint32_t b2u = (sbw >> 16) | (sbw & 0xffff0000u);
                        __nv_bfloat162 s2 = *(__nv_bfloat162 *)&s2u, b2 = *(__nv_bfloat162 *)&b2u;
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            uint32_t xu = ((word >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
                            __nv_bfloat162 xv = *(__nv_bfloat162 *)&xu;
                            xv = __hfma2(__hsub2(xv, k128), s2, b2);
                            bq[nj][j] = *(uint32_t *)&xv;
                        }
                    }
                }
#pragma unroll
                for (int nj = 0; nj < NJ; nj++) {
                    bf[nj][0] = bq[nj][(kk & 1) * 2];
                    bf[nj][1] = bq[nj][(kk & 1) * 2 + 1];
                }
            }
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int nj = 0; nj < NJ; nj++) mma_bf16(acc[mi][nj], af[mi], bf[nj][0], bf[nj][1]);
        }
    }
    cp_async_wait<0>();

    /* ---- epilogue ---- */
    if (p.ws) { /* split-K: raw partial sums; gemm_splitk_reduce applies the epilogue */
        float *wz = p.ws + (size_t)blockIdx.z * p.M * p.N;
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int m = m0 + wm * 16 * MI + mi * 16 + (lane >> 2) + h * 8;
                if (m >= m_end) continue;
#pragma unroll
                for (int nj = 0; nj < NJ; nj++)
                    *(float2 *)(wz + (size_t)m * p.N + n0 + wn * 8 * NJ + nj * 8 + 2 * (lane & 3)) =
                        make_float2(acc[mi][nj][2 * h], acc[mi][nj][2 * h + 1]);
            }
        return;
    }
    const int swiglu = p.flags & TL_GEMM_SWIGLU;
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = wm * 16 * MI + mi * 16 + (lane >> 2) + h * 8, m = m0 + r;
            if (m >= m_end) continue;
            size_t orow = (size_t)(p.mode == GM_MOE_SCATTER ? gm_asg(p, perm, m) : m) * p.ldy;
#pragma unroll
            for (int nj = 0; nj < NJ; nj++) {
                float v0 = acc[mi][nj][2 * h], v1 = acc[mi][nj][2 * h + 1];
                int col;
                if (swiglu) {
                    if (nj & 1) continue;
                    float u0 = acc[mi][nj + 1][2 * h], u1 = acc[mi][nj + 1][2 * h + 1];
                    v0 = silu_f(v0) * u0;
                    v1 = silu_f(v1) * u1;
                    col = (n0 + wn * 8 * NJ + nj * 8) / 2 + 2 * (lane & 3);
                } else {
                    col = n0 + wn * 8 * NJ + nj * 8 + 2 * (lane & 3);
                }
                gm_store2(p, orow + col, v0, v1);
            }
        }
    }
}

/* ====== The MoE grouped GEMM of decode batches with the weights as the A operand ("q4w"). ======
 * math: as gemm_mma_kernel (same plan, tile of 16 tokens x 128 weight rows, epilogues), for
 *   4-bit weights and the MoE grouped GEMMs of fewer than 512 tokens (a decode batch's MoE).
 * note: the mma takes 16 weight rows as A (m16) and the tokens as B (n8; a second n8 block only
 *   when the tile has more than 8 tokens), so one mma covers 256 weights instead of 128. The A
 *   registers are the packed nibbles made bf16 128 + q in two integer ops each (gpu.h's q4 tile
 *   order: the word of row-block tile rb holds rows g of an m16 block, tile rb + 1 rows g + 8),
 *   with no scale applied: per group of 64 columns (one k stage) the mma sums d = sum (128 + q) x
 *   into fresh registers, and the stage ends with acc += s d + (b - 128 s) Sx, Sx = the token's
 *   sum of bf16 x over the group (one more mma against an all-ones A). So the weights are used
 *   exactly (q and the fp32 scale; gemm_mma_kernel rounds s q + b to bf16: with f32 outputs the
 *   NMSE vs the oracle was 1e-12 against 2e-6; through the MoE with its bf16 intermediates 5.9e-7
 *   against 1.4e-6) and its inner loop issues ~15 instructions per weight word instead of ~24.
 * threads: 8 warps; warp wn owns weight rows n0 + 16 wn .. + 15 (one m16 block); lane (g, t)
 *   ends with rows g, g + 8 for tokens 2t, 2t + 1 of each n8 block.
 * bytes, pipeline, PDL: as gemm_mma_kernel<4, 1, 4, 1>. TL_GEMM_Q4W=0 runs that kernel instead.
 * reference: cpu_matmul through the MoE plan (tests/gpu/test_prefill_kernels.c, tile 5), and
 *   test_tc_decode_batched (batched == alone, bitwise). */
/* q4w_epilogue: lane (g, t) of the warp owning weight rows r0 .. r0 + 15 holds acc[nb][c] =
 * output (token m0 + 8 nb + 2t + (c & 1), weight row r0 + g + 8 (c >> 1)). SwiGLU: rows g (gate)
 * and g + 8 (up) are one output, column r0 / 2 + g. Else one
 * output per row. Adjacent output columns sit in lanes 4 apart: the even-g lane takes its
 * neighbour's value and stores the pair (gm_store2). */
template <int NB>
static __device__ __forceinline__ void q4w_epilogue(const gemm_args &p, float (&acc)[NB][4], int m0,
                                                    int m_end, const int32_t *perm, int r0, int g,
                                                    int t) {
    const int swiglu = p.flags & TL_GEMM_SWIGLU;
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int m = m0 + 8 * nb + 2 * t + (c & 1), row = r0 + g + 8 * (c >> 1);
            float v = acc[nb][c];
            if (swiglu) {
                if (c >= 2) continue;
                v = silu_f(v) * acc[nb][c + 2];
                row = r0 / 2 + g;
            }
            float vn = __shfl_down_sync(0xffffffffu, v, 4);
            if ((g & 1) || m >= m_end) continue;
            size_t orow = (size_t)(p.mode == GM_MOE_SCATTER ? gm_asg(p, perm, m) : m) * p.ldy;
            gm_store2(p, orow + row, v, vn);
        }
}

/* The stages of gemm_q4w_kernel: its 16 token rows padded to GM_LDS, then 128 weight rows x 64
 * columns packed, then their 128 scale/bias words (as gemm_mma_kernel<4, 1, 4, 1>). WIDE (the
 * default; TL_Q4W_WIDE=0 for A/B): 4 warps of 32 weight rows each (MB = 2 m16 blocks a warp: the
 * tokens' fragments and their sums Sx, loaded and made once a stage, serve twice the weights;
 * 96 registers, 5 blocks an SM) and the lean loop of q4w_block; else 8 warps of 16 rows and the
 * loop as first written (64 registers, 4 blocks an SM). */
typedef gm_cfg<4, 1, 4, 1> q4w_cfg;
template <bool WIDE> struct q4w_shape {
    static constexpr int MB = WIDE ? 2 : 1, THREADS = 256 / MB, MIN_BLOCKS = WIDE ? 5 : 4;
};

/* One k stage of q4w_block (stage = the group of 64 columns in shared memory at st) for the warp
 * whose m16 blocks are wr0 .. wr0 + MB - 1 (row-block tiles 2 wr and 2 wr + 1, rows g and g + 8):
 * the A fragments of each m16 block's 16 rows (16 registers each), then per n8 block the tokens'
 * B fragments of the four k16 steps, their sums Sx (an mma against an all-ones A) and each m16
 * block's sums d, folded into acc with the group's scale and bias. x_off: the lane's
 * ldmatrix.x4 row offset (elements). */
template <int NB, int MB>
static __device__ __forceinline__ void q4w_stage(const uint8_t *st, float (&acc)[MB][NB][4],
                                                 int wr0, int lane, int x_off) {
    typedef q4w_cfg C;
    const uint32_t ONES = 0x3F803F80u, E = 0x43004300u;
    const int g = lane >> 2;
    const uint16_t *sA = (const uint16_t *)st;
    const uint32_t *sQ = (const uint32_t *)(st + C::A_BYTES), *sS = sQ + 1024;
    auto frags = [&](int wr, uint32_t(&af)[4][4], float &sl, float &cl, float &su, float &cu) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t wl = sQ[(2 * wr) * 64 + h * 32 + lane],
                     wu = sQ[(2 * wr + 1) * 64 + h * 32 + lane];
#pragma unroll
            for (int s2 = 0; s2 < 2; s2++) {
                af[2 * h + s2][0] = q4m_nib(wl >> (8 * s2), E);
                af[2 * h + s2][1] = q4m_nib(wu >> (8 * s2), E);
                af[2 * h + s2][2] = q4m_nib(wl >> (8 * s2 + 4), E);
                af[2 * h + s2][3] = q4m_nib(wu >> (8 * s2 + 4), E);
            }
        }
        uint32_t ul = sS[wr * 16 + g], uh = sS[wr * 16 + g + 8];
        sl = __uint_as_float(ul << 16), su = __uint_as_float(uh << 16);
        cl = fmaf(-128.0f, sl, __uint_as_float(ul & 0xffff0000u));
        cu = fmaf(-128.0f, su, __uint_as_float(uh & 0xffff0000u));
    };
    /* the group's scale and bias: acc += s d + (b - 128 s) Sx */
    auto fold = [](float(&a)[4], const float(&dq)[4], const float(&dsx)[4], float sl, float cl,
                   float su, float cu) {
        a[0] = fmaf(sl, dq[0], fmaf(cl, dsx[0], a[0]));
        a[1] = fmaf(sl, dq[1], fmaf(cl, dsx[1], a[1]));
        a[2] = fmaf(su, dq[2], fmaf(cu, dsx[0], a[2]));
        a[3] = fmaf(su, dq[3], fmaf(cu, dsx[1], a[3]));
    };
    uint32_t af[MB][4][4];
    float sl[MB], cl[MB], su[MB], cu[MB];
#pragma unroll
    for (int mb = 0; mb < MB; mb++) frags(wr0 + mb, af[mb], sl[mb], cl[mb], su[mb], cu[mb]);
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
        float dq[MB][4] = {}, dsx[4] = {};
#pragma unroll
        for (int k2 = 0; k2 < 2; k2++) { /* k16 steps 2 k2 (xb[0..1]) and 2 k2 + 1 (xb[2..3]) */
            uint32_t xb[4];
            ldmatrix_x4(xb, sA + nb * 8 * GM_LDS + x_off + k2 * 32);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int kk = 2 * k2 + h;
                mma_bf16(dsx, ONES, ONES, ONES, ONES, xb[2 * h], xb[2 * h + 1]);
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
                    mma_bf16(dq[mb], af[mb][kk][0], af[mb][kk][1], af[mb][kk][2], af[mb][kk][3],
                             xb[2 * h], xb[2 * h + 1]);
            }
        }
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
            fold(acc[mb][nb], dq[mb], dsx, sl[mb], cl[mb], su[mb], cu[mb]);
    }
}

/* A thread's stage copies in q4w_block: its token chunk (threads < 128; a_bytes 0 past the tile),
 * its WCH weight chunks and (threads < 32) its scale/bias words, from the sources of k stage 0 of
 * the block's share of K to the stage offsets a_dst, w_dst (+ THREADS * 16 j), s_dst. */
template <int WCH> struct q4w_copy {
    const uint16_t *a;
    const uint32_t *w[WCH], *s;
    size_t s_step; /* words between the scale/bias rows of consecutive stages */
    int a_bytes, a_dst, w_dst, s_dst;
    /* thread tid of THREADS: the copies of the next stage into the stage at sm, then the
     * sources advance one stage (the lean loop's running sources) */
    template <int THREADS> __device__ __forceinline__ void next(uint8_t *sm, int tid) {
        next_a(sm, tid);
        next_w<THREADS>(sm, tid);
    }
    /* the token chunk alone, and the weights and scale/bias words alone */
    __device__ __forceinline__ void next_a(uint8_t *sm, int tid) {
        if (tid < 128) cp_async16(sm + a_dst, a, a_bytes);
        a += GM_BK;
    }
    template <int THREADS> __device__ __forceinline__ void next_w(uint8_t *sm, int tid) {
#pragma unroll
        for (int j = 0; j < WCH; j++) {
            cp_async16(sm + w_dst + THREADS * 16 * j, w[j], 16);
            w[j] += 64;
        }
        if (tid < 32) cp_async16(sm + s_dst, s, 16);
        s += s_step;
    }
};

/* The loop as first written (the narrow shape): each stage's copies addressed from its index. */
template <int NB, int MB>
static __device__ __forceinline__ void q4w_loop_first(const q4w_copy<1> &cp, int KT,
                                                      float (&acc)[MB][NB][4], int wr0, int lane,
                                                      int x_off, bool early, int trig) {
    typedef q4w_cfg C;
    extern __shared__ __align__(128) uint8_t gm_smem[];
    const int tid = threadIdx.x;
    auto load_a = [&](int stage, int kt) {
        if (tid < 128)
            cp_async16(gm_smem + stage * C::STAGE_BYTES + cp.a_dst, cp.a + kt * GM_BK, cp.a_bytes);
    };
    auto load_b = [&](int stage, int kt) {
        uint8_t *sm = gm_smem + stage * C::STAGE_BYTES;
        cp_async16(sm + cp.w_dst, cp.w[0] + (size_t)kt * 64, 16);
        if (tid < 32) cp_async16(sm + cp.s_dst, cp.s + (size_t)kt * cp.s_step, 16);
    };
    gm_prologue<C::STAGES>(KT, early, trig, load_a, load_b); /* else the kernel waited (MoE plan) */
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<C::STAGES - 2>();
        __syncthreads();
        int nk = kt + C::STAGES - 1;
        if (nk < KT) load_a(nk % C::STAGES, nk), load_b(nk % C::STAGES, nk);
        cp_async_commit();
        q4w_stage<NB, MB>(gm_smem + (kt % C::STAGES) * C::STAGE_BYTES, acc, wr0, lane, x_off);
    }
}

/* The lean loop (the wide shape): the ring run STAGES k stages an iteration (the slot a constant)
 * and the copies from running sources (one add each a stage). */
template <int NB, int MB, int THREADS, int WCH>
static __device__ __forceinline__ void q4w_loop_lean(q4w_copy<WCH> cp, int KT,
                                                     float (&acc)[MB][NB][4], int wr0, int lane,
                                                     int x_off, bool early, int trig) {
    typedef q4w_cfg C;
    extern __shared__ __align__(128) uint8_t gm_smem[];
    const int tid = threadIdx.x;
    /* the next stage to copy, into ring slot `stage` */
    auto load_next = [&](int stage) {
        cp.template next<THREADS>(gm_smem + stage * C::STAGE_BYTES, tid);
    };
    if (early) { /* gm_prologue's order: the weights, the wait, the tokens (group 0 holds all) */
#pragma unroll
        for (int s = 0; s < C::STAGES - 1; s++)
            if (s < KT) cp.template next_w<THREADS>(gm_smem + s * C::STAGE_BYTES, tid);
        pdl_enter(trig);
    }
#pragma unroll
    for (int s = 0; s < C::STAGES - 1; s++) {
        if (s < KT) {
            if (early)
                cp.next_a(gm_smem + s * C::STAGE_BYTES, tid);
            else
                load_next(s);
        }
        cp_async_commit();
    }
    for (int kt0 = 0; kt0 < KT; kt0 += C::STAGES) {
#pragma unroll
        for (int s = 0; s < C::STAGES; s++) {
            if (kt0 + s >= KT) break; /* block-uniform */
            cp_async_wait<C::STAGES - 2>();
            __syncthreads();
            if (kt0 + s + C::STAGES - 1 < KT) load_next((s + C::STAGES - 1) % C::STAGES);
            cp_async_commit();
            q4w_stage<NB, MB>(gm_smem + s * C::STAGE_BYTES, acc, wr0, lane, x_off);
        }
    }
}

/* The main loop and epilogue of one block of a 16-token tile holding NB n8 blocks of tokens
 * (NB * 8 >= its token count), one q4w_stage per k stage. WIDE: the lean loop; PTX 166
 * instructions a warp a stage for 1,024 weight bytes against 140 for 512 (the first loop: about
 * half of those are the copies' address arithmetic and the ring slot's offsets). The lean loop on
 * the narrow shape measured no faster (H100, decode batches 64 and 256: 2026-12-06), the wide
 * shape +2.2% / +0.9%. Both shapes make the same copies, products and sums in the same order:
 * the same bits. */
template <int NB, bool WIDE>
static __device__ __forceinline__ void q4w_block(const gemm_args &p, const uint8_t *wb,
                                                 const uint32_t *sbb, const int32_t *perm, int m0,
                                                 int m_end, bool early) {
    typedef q4w_cfg C;
    typedef q4w_shape<WIDE> M;
    constexpr int MB = M::MB, THREADS = M::THREADS, WCH = 256 / THREADS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n0 = blockIdx.x * 128;
    const int KT = p.K / GM_BK / gridDim.z, kt_base = blockIdx.z * KT;
    q4w_copy<WCH> cp;
    /* tokens: threads 0..127 copy 16 bytes each, token row tid / 8, 16-byte column tid % 8 */
    const int a_row = tid >> 3, a_ok = tid < 128 && m0 + a_row < m_end;
    int a_src = a_ok ? m0 + a_row : 0;
    if (p.mode == GM_MOE_GATHER && a_ok) a_src = gm_tok(p, gm_asg(p, perm, a_src));
    cp.a = p.x + (size_t)a_src * p.K + (tid & 7) * 8 + kt_base * GM_BK;
    /* weights: 256 chunks of 16 bytes a stage; chunk c = tid + THREADS j is 16 bytes of row block
     * c / 16 (2 tiles of 128 B each) and lands at word 4 c of the stage's weights */
    const uint32_t *wq = (const uint32_t *)wb;
#pragma unroll
    for (int j = 0; j < WCH; j++) {
        const int c = tid + THREADS * j;
        cp.w[j] = wq + ((size_t)(n0 / 8 + (c >> 4)) * (p.K / 32) + kt_base * 2) * 32 + (c & 15) * 4;
    }
    cp.s = sbb + (size_t)kt_base * p.N + n0 + tid * 4; /* tid < 32 */
    cp.s_step = p.N, cp.a_bytes = a_ok ? 16 : 0;
    cp.a_dst = (a_row * GM_LDS + (tid & 7) * 8) * 2, cp.w_dst = C::A_BYTES + tid * 16;
    cp.s_dst = C::A_BYTES + 4096 + tid * 16;
    /* ldmatrix.x4 rows: lanes 0-7 the n8 block's tokens at k 0-7, lanes 8-15 at k 8-15, lanes
     * 16-31 the same 16 columns further */
    const int x_off = (lane & 7) * GM_LDS + ((lane >> 3) & 1) * 8 + (lane >> 4) * 16;
    float acc[MB][NB][4] = {};
    if constexpr (WIDE)
        q4w_loop_lean<NB, MB, THREADS>(cp, KT, acc, warp * MB, lane, x_off, early, p.trig);
    else
        q4w_loop_first<NB, MB>(cp, KT, acc, warp * MB, lane, x_off, early, p.trig);
    cp_async_wait<0>();
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
        q4w_epilogue<NB>(p, acc[mb], m0, m_end, perm, n0 + (warp * MB + mb) * 16, lane >> 2,
                         lane & 3);
}

/* The MoE of a decode batch (2-8 tokens per expert; NB 1 or 2 by the tile's token count). A token's
 * outputs do not depend on the tile or NB (each mma column is its own dot product), so batched ==
 * alone stays bitwise. Not for the dense products: with 16- and 32-token q4w tiles they measured
 * no faster at 8-64 tokens and slower at 256 (decode batch 256: 9,290 -> 8,553 tok/s,
 * 2026-12-04), and one kernel must serve every batch size (they run the wgr kernel). */
template <bool WIDE>
__global__ void __launch_bounds__(q4w_shape<WIDE>::THREADS, q4w_shape<WIDE>::MIN_BLOCKS)
    gemm_q4w_kernel(gemm_args p) {
    const uint8_t *wb = p.w;
    const uint32_t *sbb = p.sb;
    const int32_t *perm;
    int m0, m_end;
    /* PDL: gate/up's plan comes from the previous kernel, so it waits first; the down-projection
     * follows gate/up, which waited for the plan before it triggered (pdl_enter): its plan and
     * weights are ready, and it requests its first weight stages before waiting (early) */
    const bool early = p.mode == GM_MOE_SCATTER;
    if (!early) pdl_enter(p.trig);
    if (!gm_tile<4, 16>(p, &wb, &sbb, &perm, &m0, &m_end)) {
        if (early) pdl_enter(p.trig);
        return;
    }
    if (m_end - m0 > 8) /* block-uniform */
        q4w_block<2, WIDE>(p, wb, sbb, perm, m0, m_end, early);
    else
        q4w_block<1, WIDE>(p, wb, sbb, perm, m0, m_end, early);
}

template <int BITS, int WM, int NJ, int MI>
static int launch_gemm(const gemm_args *p, int grid_y, const tl_gpu_stream *st, int ksplit = 1) {
    typedef gm_cfg<BITS, WM, NJ, MI> C;
    /* all of L1 as shared memory: the 16-row tile runs 8 blocks an SM (launch bounds) */
    if (smem_limit<gemm_mma_kernel<BITS, WM, NJ, MI>>(C::SMEM, true)) return TL_ERR_CUDA;
    if (grid_y <= 0) return 0;
    if (grid_y > 65535) return TL_ERR_INVALID;
    dim3 grid(p->N / C::BN, grid_y, ksplit);
    TL_LAUNCH(st, p->mode == GM_DENSE ? "gemm_mma" : "gemm_mma_moe",
              gemm_mma_kernel<BITS, WM, NJ, MI>, grid, dim3(C::THREADS), C::SMEM, *p);
    return 0;
}

/* ====== The wgmma GEMM (Hopper warpgroup MMA). ======
 * math, shapes, epilogue: as gemm_mma_kernel.
 * threads: WGS warpgroups (128 threads each); warpgroup g owns token rows 64g..64g+63 of the
 *   block tile (BM = 64*WGS) and all BN = 256 weight rows: one wgmma m64n256k16 per k16 step
 *   with A and B read by the tensor cores straight from shared memory (descriptors), 128 fp32
 *   accumulators per thread (row 16*warp + lane/4 (+8), cols 8j + 2*(lane%4) + {0,1}).
 * note: shared tiles are K-major rows of 64 bf16 = 128 B with the 128-byte swizzle (16-byte
 *   chunk c of row r stored at chunk c ^ (r % 8)), 1024-byte aligned, which is what the
 *   descriptors (SBO 1024 B, swizzle mode 1) describe; the k16 step advances the start address
 *   by 32 B. cp.async fills them (generic proxy), so every writer fences (fence.proxy.async)
 *   before the barrier that precedes the wgmma.
 * note: 4-bit weights arrive packed (q4 tiled) through the same cp.async pipeline; all threads
 *   dequantize tile k+1 into one of two bf16 B buffers while the wgmma of tile k runs.
 * pipeline (STAGES deep): top of step k waits for tile k, barrier, issues 4 wgmma, waits for
 *   the wgmma of step k-1 (wait_group 1), barrier, then refills the stage step k-1 used.
 * reference: cpu_matmul (tests/gpu/test_prefill_kernels.c, tiles 3 and 4). */
#define WG_BN     256
#define WG_STAGES 4

template <int BITS, int WGS> struct wg_cfg {
    static constexpr int BM = 64 * WGS, THREADS = 128 * WGS;
    static constexpr int A_BYTES = BM * 128;
    static constexpr int B_BYTES = BITS == 16 ? WG_BN * 128 : WG_BN * GM_BK / 2 + WG_BN * 4;
    static constexpr int STAGE_BYTES = (A_BYTES + B_BYTES + 1023) / 1024 * 1024;
    static constexpr int BBUF_BYTES = BITS == 16 ? 0 : 2 * WG_BN * 128;
    static constexpr int SMEM = WG_STAGES * STAGE_BYTES + BBUF_BYTES + 1024; /* + alignment slack */
};

template <int BITS, int WGS>
__global__ void __launch_bounds__(128 * WGS, 1) gemm_wg_kernel(gemm_args p) {
    pdl_enter(p.trig); /* launched with PDL on the batched path: cuda_common.cuh */
    typedef wg_cfg<BITS, WGS> C;
    constexpr int BM = C::BM, THREADS = C::THREADS;
    extern __shared__ uint8_t wg_smem_raw[];
    uint8_t *smem = wg_smem_raw + ((0u - smem_u32(wg_smem_raw)) & 1023u); /* stays shared */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3;
    const int n0 = blockIdx.x * WG_BN;
    const uint8_t *wb = p.w;
    const uint32_t *sbb = p.sb;
    const int32_t *perm;
    int m0, m_end;
    if (!gm_tile<BITS, BM>(p, &wb, &sbb, &perm, &m0, &m_end)) return;

    /* A rows of this thread's chunks: chunk c = tid + THREADS j -> row c/8, 16-byte chunk c%8 */
    constexpr int A_CH = BM * 8 / THREADS; /* 4 */
    const uint16_t *a_src[A_CH];
    int a_ok[A_CH];
#pragma unroll
    for (int j = 0; j < A_CH; j++) {
        int r = (tid >> 3) + (THREADS / 8) * j, m = m0 + r;
        a_ok[j] = m < m_end;
        int src = m;
        if (p.mode == GM_MOE_GATHER && a_ok[j]) src = gm_tok(p, gm_asg(p, perm, m));
        a_src[j] = p.x + (size_t)(a_ok[j] ? src : 0) * p.K + (tid & 7) * 8;
    }
    const int KT = p.K / GM_BK;
    const uint32_t smem_s = smem_u32(smem);
    uint8_t *bbuf = smem + WG_STAGES * C::STAGE_BYTES;

    auto load_stage = [&](int stage, int kt) {
        uint8_t *s = smem + stage * C::STAGE_BYTES;
        const int k0 = kt * GM_BK;
#pragma unroll
        for (int j = 0; j < A_CH; j++) {
            int r = (tid >> 3) + (THREADS / 8) * j;
            cp_async16(s + wg_swz(r, tid & 7), a_src[j] + k0, a_ok[j] ? 16 : 0);
        }
        if (BITS == 16) {
            const uint16_t *wg16 = (const uint16_t *)wb;
#pragma unroll
            for (int j = 0; j < WG_BN * 8 / THREADS; j++) {
                int r = (tid >> 3) + (THREADS / 8) * j, ok = n0 + r < p.N;
                cp_async16(s + C::A_BYTES + wg_swz(r, tid & 7),
                           wg16 + (size_t)(ok ? n0 + r : 0) * p.K + k0 + (tid & 7) * 8,
                           ok ? 16 : 0);
            }
        } else {
            uint32_t *sQ = (uint32_t *)(s + C::A_BYTES);
            uint32_t *sS = sQ + WG_BN * GM_BK / 8;
            const uint32_t *wq4 = (const uint32_t *)wb;
#pragma unroll
            for (int j = 0; j < 2 * WG_BN / THREADS; j++) {
                int c = tid + THREADS * j, rb = c >> 4, ch = c & 15, ok = n0 + 8 * rb < p.N;
                cp_async16(sQ + rb * 64 + ch * 4,
                           wq4 + ((size_t)(ok ? n0 / 8 + rb : 0) * (p.K / 32) + k0 / 32) * 32 +
                               ch * 4,
                           ok ? 16 : 0);
            }
            if (tid < WG_BN / 4) {
                int ok = n0 + 4 * tid < p.N;
                cp_async16(sS + tid * 4, sbb + (size_t)(k0 / 64) * p.N + (ok ? n0 + tid * 4 : 0),
                           ok ? 16 : 0);
            }
        }
    };
    /* q4: packed tile of stage -> bf16 swizzled B buffer. Unit = (row n, 32-column block kb):
     * the 4 words of lanes 4(n%8)..+3 hold columns 2t + 8j + {0,1} (t = word, j = pair), so
     * chunk j (8 consecutive columns) is pair j of the 4 words in order. */
    auto dequant = [&](int stage, int buf) {
        const uint32_t *sQ = (const uint32_t *)(smem + stage * C::STAGE_BYTES + C::A_BYTES);
        const uint32_t *sS = sQ + WG_BN * GM_BK / 8;
        uint8_t *dst = bbuf + buf * WG_BN * 128;
        const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
#pragma unroll
        for (int j = 0; j < 2 * WG_BN / THREADS; j++) {
            int u = tid + THREADS * j, n = u >> 1, kb = u & 1;
            uint4 w4 = *(const uint4 *)(sQ + ((n >> 3) * 2 + kb) * 32 + 4 * (n & 7));
            uint32_t sbw = sS[n];
            uint32_t s2u = (sbw & 0xffffu) | (sbw << 16), b2u = (sbw >> 16) | (sbw & 0xffff0000u);
            __nv_bfloat162 s2 = *(__nv_bfloat162 *)&s2u, b2 = *(__nv_bfloat162 *)&b2u;
            uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
            for (int pj = 0; pj < 4; pj++) {
                uint32_t o[4];
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    uint32_t xu = ((w[t] >> (4 * pj)) & 0x000F000Fu) | 0x43004300u;
                    __nv_bfloat162 xv = *(__nv_bfloat162 *)&xu;
                    xv = __hfma2(__hsub2(xv, k128), s2, b2);
                    o[t] = *(uint32_t *)&xv;
                }
                *(uint4 *)(dst + wg_swz(n, kb * 4 + pj)) = make_uint4(o[0], o[1], o[2], o[3]);
            }
        }
    };

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.f;

#pragma unroll
    for (int s = 0; s < WG_STAGES - 1; s++) {
        if (s < KT) load_stage(s, s);
        cp_async_commit();
    }
    if (BITS == 4) {
        cp_async_wait<WG_STAGES - 2>();
        __syncthreads();
        dequant(0, 0);
    }

    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<WG_STAGES - 2>(); /* tile kt */
        wg_fence_proxy();
        __syncthreads();
        const uint32_t sa = smem_s + (kt % WG_STAGES) * C::STAGE_BYTES + wg * 64 * 128;
        const uint32_t sb = BITS == 16 ? smem_s + (kt % WG_STAGES) * C::STAGE_BYTES + C::A_BYTES
                                       : smem_u32(bbuf) + (kt & 1) * WG_BN * 128;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < GM_BK / 16; kk++)
            wg_mma_m64n256k16(acc, wg_desc(sa + kk * 32), wg_desc(sb + kk * 32));
        wg_commit();
        wg_wait<1>();
        __syncthreads(); /* every warpgroup is done with step kt-1's stage and B buffer */
        int nk = kt + WG_STAGES - 1;
        if (nk < KT) load_stage(nk % WG_STAGES, nk);
        cp_async_commit();
        if (BITS == 4 && kt + 1 < KT) {
            cp_async_wait<WG_STAGES - 2>(); /* tile kt+1 */
            __syncthreads();
            dequant((kt + 1) % WG_STAGES, (kt + 1) & 1);
        }
    }
    wg_wait<0>();
    cp_async_wait<0>();

    /* ---- epilogue (fragment layout as mma.sync m16n8, warp wq of the warpgroup) ---- */
    const int swiglu = p.flags & TL_GEMM_SWIGLU;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = wg * 64 + wq * 16 + (lane >> 2) + h * 8, m = m0 + r;
        if (m >= m_end) continue;
        size_t orow = (size_t)(p.mode == GM_MOE_SCATTER ? gm_asg(p, perm, m) : m) * p.ldy;
#pragma unroll
        for (int nj = 0; nj < WG_BN / 8; nj++) {
            if (n0 + nj * 8 >= p.N) break; /* rows % 256 == 128: the last block's upper half */
            float v0 = acc[4 * nj + 2 * h], v1 = acc[4 * nj + 2 * h + 1];
            int col;
            if (swiglu) {
                if (nj & 1) continue;
                float u0 = acc[4 * (nj + 1) + 2 * h], u1 = acc[4 * (nj + 1) + 2 * h + 1];
                v0 = silu_f(v0) * u0;
                v1 = silu_f(v1) * u1;
                col = (n0 + nj * 8) / 2 + 2 * (lane & 3);
            } else {
                col = n0 + nj * 8 + 2 * (lane & 3);
            }
            gm_store2(p, orow + col, v0, v1);
        }
    }
}

template <int BITS, int WGS>
static int launch_gemm_wg(const gemm_args *p, int grid_y, const tl_gpu_stream *st) {
    typedef wg_cfg<BITS, WGS> C;
    if (smem_limit<gemm_wg_kernel<BITS, WGS>>(C::SMEM)) return TL_ERR_CUDA;
    if (grid_y <= 0) return 0;
    if (grid_y > 65535) return TL_ERR_INVALID;
    dim3 grid((p->N + WG_BN - 1) / WG_BN, grid_y);
    TL_LAUNCH(st, "gemm_wg", gemm_wg_kernel<BITS, WGS>, grid, dim3(C::THREADS), C::SMEM, *p);
    return 0;
}

/* Tile shapes: 0 = 128x128, 1 = 64x128, 2 = 128x256 (mma.sync); 3 = 128x256, 4 = 64x256 (wgmma);
 * 5 = 16x128 (mma.sync, one m16 row of tokens: the MoE of a decode batch, ~2-8 tokens per
 * expert); 6, 7 = the MoE's wgr kernel with 2 or 4 warpgroups (4-bit MoE only: up to 128 tokens
 * x 128 or 256 weight rows). */
enum { GM_T128 = 0, GM_T64 = 1, GM_T256 = 2, GM_WG128 = 3, GM_WG64 = 4, GM_T16 = 5, GM_WGR = 6 };

/* 1 unless TL_Q4W_WIDE=0 (read once): gemm_q4w_kernel on its wide shape (q4w_shape). */
static cb_level q4w_wide = {"TL_Q4W_WIDE", 1, 1, -1};

template <bool WIDE>
static int launch_q4w_as(const gemm_args *p, int grid_y, const tl_gpu_stream *st) {
    if (smem_limit<gemm_q4w_kernel<WIDE>>(q4w_cfg::SMEM, true)) return TL_ERR_CUDA;
    if (grid_y <= 0) return 0;
    if (grid_y > 65535) return TL_ERR_INVALID;
    TL_LAUNCH(st, "gemm_q4w_moe", gemm_q4w_kernel<WIDE>, dim3(p->N / 128, grid_y),
              dim3(q4w_shape<WIDE>::THREADS), q4w_cfg::SMEM, *p);
    return 0;
}

static int launch_q4w(const gemm_args *p, int grid_y, const tl_gpu_stream *st) {
    return cb_level_get(&q4w_wide) ? launch_q4w_as<true>(p, grid_y, st)
                                   : launch_q4w_as<false>(p, grid_y, st);
}

/* 1 unless TL_GEMM_Q4W=0: the MoE grouped GEMMs on the 16-token 4-bit tile run gemm_q4w_kernel. */
static cb_level gemm_q4w = {"TL_GEMM_Q4W", 1, 1, -1};

static int gemm_launch(const gemm_args *p, int bits, int tile, int grid_y, const tl_gpu_stream *st,
                       int ksplit = 1) {
    if (bits == 4 && tile == GM_T16 && p->mode != GM_DENSE && ksplit == 1 &&
        cb_level_get(&gemm_q4w))
        return launch_q4w(p, grid_y, st);
#define GM_CASE(B, T, WM, NJ, MI)                                                                  \
    if (bits == B && tile == T) return launch_gemm<B, WM, NJ, MI>(p, grid_y, st, ksplit);
    GM_CASE(16, GM_T128, 2, 4, 4)
    GM_CASE(16, GM_T64, 1, 4, 4)
    GM_CASE(16, GM_T256, 2, 8, 4)
    GM_CASE(16, GM_T16, 1, 4, 1)
    GM_CASE(4, GM_T128, 2, 4, 4)
    GM_CASE(4, GM_T64, 1, 4, 4)
    GM_CASE(4, GM_T256, 2, 8, 4)
    GM_CASE(4, GM_T16, 1, 4, 1)
#undef GM_CASE
    if (tile == GM_WG128)
        return bits == 4 ? launch_gemm_wg<4, 2>(p, grid_y, st)
                         : launch_gemm_wg<16, 2>(p, grid_y, st);
    if (tile == GM_WG64)
        return bits == 4 ? launch_gemm_wg<4, 1>(p, grid_y, st)
                         : launch_gemm_wg<16, 1>(p, grid_y, st);
    return TL_ERR_INVALID;
}

/* note: tile choice, from the forced-tile sweeps in notes/2026-12-02-prefill-kernels.md (runs 2
 * and 4). With >= 128 blocks of 128x256 the wgmma kernel wins by 1.3-1.9x (bf16 up to 543
 * TFLOP/s, 4-bit up to 410). Below that: bf16 wgmma 64x256; 4-bit mma.sync 64x128 (two blocks
 * per SM hide the in-register dequantisation better than the wgmma kernel's dequantise-to-
 * shared step at low occupancy). The wgmma kernel also takes rows % 256 == 128 (the fused GDN
 * in-projection padded to 12416 rows: 537 TFLOP/s bf16, 410 4-bit at n = 4096, run 5): the last
 * block's missing rows load as zeros and are not stored. TL_GEMM_TILE (0 mma 128x128, 1 mma 64x128,
 * 2 mma 128x256, 3 wgmma 128x256, 4 wgmma 64x256) forces one, for the tests and the dev bench. */
static int gemm_tile_env(void) {
    const char *e = getenv("TL_GEMM_TILE");
    return e && *e ? atoi(e) : -1;
}
static int gemm_forced_tile(int rows) {
    int f = gemm_tile_env();
    return f >= 0 && f <= 5 && !(f == GM_T256 && rows % 256) ? f : -1;
}

static int gemm_pick_tile(int n, int rows, int cols, int bits) {
    int forced = gemm_forced_tile(rows);
    if (forced >= 0) return forced;
    long b256 = (long)((rows + 255) / 256) * ((n + 127) / 128);
    if (b256 >= 128) return GM_WG128;
    if (bits == 4 && n <= 64) return GM_T16; /* 4x the blocks of 64x128 at a decode batch */
    return bits == 4 ? GM_T64 : GM_WG64;
}

/* ====== Split-K for decode batches. ======
 * note: a dense 4-bit product of a decode batch (n <= TL_GEMM_SPLITK_MAX_N tokens: the wgr kernel,
 * or the 16x128 and 64x128 tiles with TL_DENSE_WGR_DEC=0) has few blocks per matrix (the
 * out-projection: 16 of 128 rows, K = 4096) whose long K loops leave the weight stream
 * latency-bound (the dense GEMMs of a 64-sequence step: 3.2 ms for ~1 GB,
 * notes/2026-12-03-batched-decode.md). So K is split over gridDim.z blocks whose f32 partials are
 * summed in z order before the epilogue: on the wgr kernel inside the tile's cluster (default, at
 * most 8 splits), else through the stream's workspace and gemm_splitk_reduce.
 * The split depends only on the matrix shape (doubling while the blocks of one 16-token tile are
 * under one wave of the H200's 132 SMs and every share keeps >= 4 k tiles), never on n: a token's
 * result is the same at any batch up to the limit. TL_GEMM_SPLITK=0 turns it off (A/B). */
#define GM_SPLITK_SMS 132

/* 1 unless TL_GEMM_SPLITK_CLUSTER=0 (read once): a split wgr product sums its partials inside
 * the tile's cluster (wr_cluster_reduce, k_gemm_wgr.cu; at most 8 splits, the portable cluster
 * size) instead of through the workspace and gemm_splitk_reduce. */
static cb_level splitk_cluster = {"TL_GEMM_SPLITK_CLUSTER", 1, 1, -1};
/* 1 unless TL_GEMM_SPLITK=0 (read once): the 4-bit dense products of decode batches split K. */
static cb_level splitk = {"TL_GEMM_SPLITK", 1, 1, -1};

static int gemm_splitk_of(const tl_gpu_gemm_w *w) {
    if (!cb_level_get(&splitk) || w->bits != 4) return 1;
    int xb = w->rows / 128, kt = w->cols / GM_BK, s = 1;
    int smax = cb_level_get(&splitk_cluster) ? 8 : 64;
    while (xb * s < GM_SPLITK_SMS && kt % (2 * s) == 0 && kt / (2 * s) >= 4 && s < smax) s *= 2;
    return s;
}

extern "C" size_t tl_gpu_gemm_ws_bytes(const tl_gpu_gemm_w *w, int n) {
    int s = w ? gemm_splitk_of(w) : 1;
    n = n < TL_GEMM_SPLITK_MAX_N ? n : TL_GEMM_SPLITK_MAX_N;
    return s > 1 ? (size_t)s * n * w->rows * sizeof(float) : 0;
}

/* y = epilogue(sum over z of ws[z]): one thread per two adjacent outputs. SwiGLU: output o of a
 * row takes gate column (o / 8) * 16 + o % 8 and up column that + 8 (rows interleaved by 8). */
__global__ void gemm_splitk_reduce(gemm_args p, int ksplit) {
    pdl_enter(p.trig);
    const int swiglu = p.flags & TL_GEMM_SWIGLU;
    const int pairs = (swiglu ? p.N / 2 : p.N) / 2;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)p.M * pairs) return;
    int m = (int)(i / pairs), o = (int)(i % pairs) * 2;
    int c = swiglu ? (o / 8) * 16 + o % 8 : o;
    const size_t zs = (size_t)p.M * p.N, at = (size_t)m * p.N + c;
    float v0 = 0.f, v1 = 0.f, u0 = 0.f, u1 = 0.f;
    for (int z = 0; z < ksplit; z++) {
        float2 g = *(const float2 *)(p.ws + z * zs + at);
        v0 += g.x, v1 += g.y;
        if (swiglu) {
            float2 u = *(const float2 *)(p.ws + z * zs + at + 8);
            u0 += u.x, u1 += u.y;
        }
    }
    if (swiglu) v0 = silu_f(v0) * u0, v1 = silu_f(v1) * u1;
    gm_store2(p, (size_t)m * p.ldy + o, v0, v1);
}

/* The reduce of a split product: y = epilogue(sum of the ksplit partials in p->ws). */
static int splitk_reduce(const gemm_args *p, int ksplit, const tl_gpu_stream *st) {
    long pairs = (long)p->M * ((p->flags & TL_GEMM_SWIGLU) ? p->N / 4 : p->N / 2);
    TL_LAUNCH(st, "gemm_splitk_reduce", gemm_splitk_reduce, dim3((unsigned)CEIL_DIV(pairs, 256)),
              dim3(256), 0, *p, ksplit);
    return 0;
}

/* 1 unless TL_DENSE_WGR_DEC=0: the dense 4-bit products of decode batches run the wgr kernel. */
static cb_level dense_dec_wgr = {"TL_DENSE_WGR_DEC", 1, 1, -1};

/* Token rows of a tile shape's block. */
static int tile_bm(int tile) {
    return tile == GM_T16 ? 16 : tile == GM_T64 || tile == GM_WG64 ? 64 : 128;
}

static int gemm_w_ok(const tl_gpu_gemm_w *w) {
    if (!w || !w->w || (w->bits != 16 && w->bits != 4)) return 0;
    if (w->bits == 4 && !w->sb) return 0;
    return w->rows > 0 && w->cols > 0 && w->rows % GM_ROW_ALIGN == 0 && w->cols % GM_BK == 0;
}

/* The wgr kernel's warpgroups for a 4-bit GEMM, 0 for another kernel: TL_GEMM_TILE=6 forces 2
 * (TL_GEMM_TILE=7: 4); else TL_MOE_WGR (MoE GEMMs) or TL_DENSE_WGR (dense products) = 2 or 4
 * takes it from min_tok tokens (a prefill chunk: the MoE from 512, the dense products from 257,
 * where the decode batches' split path ends); default 2, `0`
 * off (H200, BENCHMARKS.md session 8: 2 beat the old tiles by 4-5% each, 4 lost). note: 4
 * warpgroups (256 weight rows a block) halve the token tile's re-reads from L2 at one block an
 * SM, which measured slower. */
static int gemm_wgr_of(const char *env, int *cached, int n_tok, int min_tok) {
    if (*cached < 0) {
        const char *e = getenv(env);
        *cached = !e || !*e ? 2 : atoi(e) == 2 || atoi(e) == 4 ? atoi(e) : 0;
    }
    int f = gemm_tile_env();
    if (f == GM_WGR || f == GM_WGR + 1) return f == GM_WGR ? 2 : 4;
    return f < 0 && n_tok >= min_tok ? *cached : 0;
}

/* The wgr kernel's warpgroups for a dense product of n tokens, 0 for another kernel: past the
 * decode batches' split path (<= 256 tokens; chunks of 257-511 tokens ran the mma.sync 64x128
 * tile until session 25, 15% slower at a 320-token prefill, H100). */
static int dense_wgr_of(const tl_gpu_gemm_w *w, int n) {
    static int dense_wgr = -1;
    return w->bits == 4 ? gemm_wgr_of("TL_DENSE_WGR", &dense_wgr, n, TL_GEMM_SPLITK_MAX_N + 1) : 0;
}

/* The kernels' arguments of a dense product y = epilogue(x W^T) of n tokens (tl_gpu_gemm's). */
static gemm_args dense_args(void *y, const void *x, const tl_gpu_gemm_w *w, int n, const void *res,
                            int flags, const tl_gpu_stream *st) {
    gemm_args p = {};
    p.x = (const uint16_t *)x;
    p.w = (const uint8_t *)w->w;
    p.sb = (const uint32_t *)w->sb;
    p.y = y;
    p.res = res;
    p.M = n;
    p.N = w->rows;
    p.K = w->cols;
    p.ldy = (flags & TL_GEMM_SWIGLU) ? w->rows / 2 : w->rows;
    p.flags = flags;
    p.mode = GM_DENSE;
    p.trig = tl_pdl_trig(st);
    return p;
}

extern "C" int tl_gpu_gemm(void *y, const void *x, const tl_gpu_gemm_w *w, int n, const void *res,
                           int flags, const tl_gpu_stream *st) {
    if (n < 0 || !gemm_w_ok(w) || !y || !x) return TL_ERR_INVALID;
    if ((flags & TL_GEMM_ADD_RES) && !res) return TL_ERR_INVALID;
    if (n == 0) return 0;
    gemm_args p = dense_args(y, x, w, n, res, flags, st);
    int wgs = dense_wgr_of(w, n);
    if (wgs) return cb_gemm_wgr(&p, wgs, (n + WR_NT - 1) / WR_NT, 1, st);
    int ks = gemm_splitk_of(w);
    int ws_ok = ks == 1 || (st && st->ws && tl_gpu_gemm_ws_bytes(w, n) <= st->ws_bytes);
    /* a decode batch's dense 4-bit product: the wgr kernel (weights dequantized once per block
     * for all its tokens), K split by the matrix's shape alone (batched == alone, bitwise) */
    if (w->bits == 4 && n <= TL_GEMM_SPLITK_MAX_N && ws_ok && gemm_tile_env() < 0 &&
        cb_level_get(&dense_dec_wgr)) {
        if (ks > 1 && cb_level_get(&splitk_cluster))
            return cb_gemm_wgr(&p, 2, (n + WR_NT - 1) / WR_NT, ks, st);
        if (ks > 1) p.ws = st->ws;
        TRY(cb_gemm_wgr(&p, 2, (n + WR_NT - 1) / WR_NT, ks, st));
        return ks > 1 ? splitk_reduce(&p, ks, st) : 0;
    }
    int tile = gemm_pick_tile(n, w->rows, w->cols, w->bits), bm = tile_bm(tile);
    if (ks > 1 && n <= TL_GEMM_SPLITK_MAX_N && (tile == GM_T16 || tile == GM_T64) && ws_ok) {
        p.ws = st->ws;
        TRY(gemm_launch(&p, w->bits, tile, (n + bm - 1) / bm, st, ks));
        return splitk_reduce(&p, ks, st);
    }
    return gemm_launch(&p, w->bits, tile, (n + bm - 1) / bm, st);
}

/* ====== A GDN in-projection with its conv1d (a prefill chunk of one sequence). ======
 * note: the conv1d kernel moved 8 bytes a conv column and token through DRAM (the projection's f32
 * output read back, its output written: 3.3 ms of a 4K prefill, H100 session 23) that the wgr
 * product already holds in shared memory in its epilogue. On by default (H100 session 29: 4K
 * prefill 73.5 -> 71.4 ms, 16K 320 -> 314 ms); TL_GEMM_CONV=0 (read once) or
 * tl_gpu_gemm_set_conv(0) turns it off (A/B, tests).
 */
static cb_level gemm_conv = {"TL_GEMM_CONV", 1, 1, -1};
extern "C" int tl_gpu_gemm_set_conv(int on) { return cb_level_set(&gemm_conv, on); }

extern "C" size_t tl_gpu_gemm_conv1d_edge_floats(int max_n, int C) {
    return (size_t)((max_n + WR_NT - 1) / WR_NT) * 6 * C;
}

extern "C" int tl_gpu_gemm_conv1d(float *y, const uint16_t *x, const tl_gpu_gemm_w *w, int n,
                                  float *conv_out, float *conv_state, const float *conv_w, int C,
                                  float *edge, const tl_gpu_stream *st) {
    if (n < 0 || !gemm_w_ok(w) || !y || !x || !conv_out || !conv_state || !conv_w || !edge ||
        C <= 0 || C > w->rows)
        return TL_ERR_INVALID;
    int wgs = dense_wgr_of(w, n);
    if (!cb_level_get(&gemm_conv) || !wgs || C % (64 * wgs)) return TL_ERR_UNSUPPORTED;
    gemm_args p = dense_args(y, x, w, n, NULL, TL_GEMM_OUT_F32, st);
    p.cv_out = conv_out, p.cv_edge = edge, p.cv_w = conv_w, p.cv_C = C;
    TRY(cb_gemm_wgr(&p, wgs, (n + WR_NT - 1) / WR_NT, 1, st));
    return cb_conv1d_edges(conv_out, conv_state, edge, conv_w, C, n, st);
}

/* ====== The MoE grouped GEMM (k_gemm.cuh; the plan and combine are in k_moe.cu). ====== */

/* Upper bound on the grouped GEMM's M tiles of bm rows: the plan's rows, one partial tile per
 * non-empty expert (at most 256), the shared expert's rows. */
static int moe_max_tiles(const gemm_args *p, int bm) {
    return (p->M + bm - 1) / bm + (p->M < 256 ? p->M : 256) + (p->n_sh + bm - 1) / bm;
}

int cb_moe_gemm(uint16_t *y, const uint16_t *x, const tl_gpu_gemm_w *w, const int32_t *plan,
                int n_tok, int gather, int flags, int shared, const tl_gpu_stream *st) {
    int mode = gather ? GM_MOE_GATHER : GM_MOE_SCATTER;
    if (!y || !x || !plan || n_tok < 0 || !gemm_w_ok(w)) return TL_ERR_INVALID;
    if (n_tok == 0) return 0;
    gemm_args p = {};
    p.x = x;
    p.w = (const uint8_t *)w->w;
    p.sb = (const uint32_t *)w->sb;
    p.y = y;
    p.M = n_tok * 8;
    p.N = w->rows;
    p.K = w->cols;
    p.ldy = (flags & TL_GEMM_SWIGLU) ? w->rows / 2 : w->rows;
    p.flags = flags;
    p.mode = mode;
    p.trig = tl_pdl_trig(st);
    p.plan = plan;
    p.n_sh = shared ? n_tok : 0;
    if (w->bits == 16) {
        p.w_estride = (long long)w->rows * w->cols * 2;
    } else {
        p.w_estride = (long long)tl_gpu_q4_w_bytes(w->rows, w->cols);
        p.sb_estride = (long long)tl_gpu_q4_sb_bytes(w->rows, w->cols) / 4;
    }
    /* note: MoE tiles (run 4 sweep): at n_tok = 4096 (~128 tokens per expert) wgmma 128x256
     * (bf16 286 TFLOP/s, 4-bit 240); at 512 mma.sync 64x128 (55 / 75); below 512 (a decode
     * batch: n_tok / 32 tokens per expert on average) 16x128. grid = upper bound on M
     * tiles (every non-empty expert adds at most one partial tile), the blocks past the plan's
     * tile count exit at once; the shared expert's tiles (p.n_sh rows) come after them. */
    static int moe_wgr = -1;
    int wgs = w->bits == 4 ? gemm_wgr_of("TL_MOE_WGR", &moe_wgr, n_tok, 512) : 0;
    if (wgs) return cb_gemm_wgr(&p, wgs, moe_max_tiles(&p, WR_NT), 1, st);
    int tile = gemm_forced_tile(w->rows);
    if (tile < 0) tile = n_tok >= 3072 ? GM_WG128 : n_tok < 512 ? GM_T16 : GM_T64;
    return gemm_launch(&p, w->bits, tile, moe_max_tiles(&p, tile_bm(tile)), st);
}
