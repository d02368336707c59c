/* The 4-bit prefill GEMM on wgmma with the weights as the A operand in registers ("wgr"): dense
 * products and the MoE's grouped GEMMs, the same arguments, plan and epilogues as k_gemm.cu's
 * kernels (k_gemm_common.cuh), which picks it (TL_MOE_WGR, TL_DENSE_WGR, TL_GEMM_TILE=6|7).
 * Launches only: never allocates, never synchronises. */

#include "cuda/k_gemm_common.cuh"
#include "cuda/k_q4m.cuh"
#include "cuda/k_wgmma.cuh"

/* ====== The MoE grouped GEMM on wgmma with the weights as the A operand ("wgr"). ======
 * math: as gemm_mma_kernel's MoE modes (the plan's 128-row tiles, gather or scatter, the same
 *   epilogues) for 4-bit weights.
 * note: the tile's tokens are the wgmma's N (32, 64, 96 or 128: its token count rounded up to
 *   32, chosen per block, so a tile of 40 tokens does not pay for 128) and 64 WGS weight rows
 *   its M (WGS warpgroups of 64). A warp dequantizes the packed nibbles of its 16 rows straight
 *   into A registers (bf16(s q + b), gemm_mma_kernel's values), so dequantized weights never
 *   pass through shared memory and no thread dequantizes for another; the token tile (B) is
 *   read by the tensor cores from 128-byte-swizzled shared memory (wg_desc, wg_swz:
 *   gemm_wg_kernel's tiles). Per k stage and warpgroup: 4 wgmma m64nNk16. The accumulators are
 *   initialised by the first wgmma (scale-d 0), not by ordinary instructions: zeroing them made
 *   ptxas serialise the wgmma (C7515) once several N variants share the kernel.
 * threads: 128 WGS; warp w owns block rows 16w .. 16w + 15 (warpgroup w / 4); lane (g, t) ends
 *   with rows 16w + g (+ 8) for tokens 8j + 2t + {0, 1} (k_wgmma.cuh).
 * pipeline (WR_STAGES deep, cp.async): step k waits for tile k and fences it for the async
 *   proxy, barrier, reads its packed words, waits for its own wgmma of step k - 1 (the A
 *   registers are reused), dequantizes, issues 4 wgmma, barrier (every warpgroup is past step
 *   k - 1), then refills the stage of step k - 1.
 * instructions: the loop is bound by instruction issue, not by the wgmma or memory latency (ncu,
 *   session 18: the LM head at a decode batch of 64 kept 60% of the issue slots busy at 1.26
 *   TB/s; double-buffered A fragments, dequantizing step k + 1 during step k's wgmma, changed
 *   nothing). So a step issues as little as it can: the ring unrolled (constant stage offsets and
 *   descriptors), running copy sources, shared loads through a known-shared pointer, one lop3
 *   for mask and exponent: 127 -> 89 M instructions on that LM head (232 -> 183 us), prefill
 *   +10-12%, decode batches 8 / 64 / 256 -5.5% / -2.3% / -1.1% a step (H100).
 * epilogue: accumulators -> f32 tile [token][row] in shared memory (row stride 4 floats past the
 *   width: the 32 lanes' writes hit 32 banks) -> gm_store2 along output rows (coalesced): a full
 *   block by wr_store_full (a thread keeps one column pair and walks the tokens at a compile-time
 *   stride; the tile's output rows looked up once: the per-pair division and plan lookup it
 *   replaced cost more than the MoE down-projection's 8-stage main loop); with split-K (dense
 *   products of decode batches: k_gemm.cu) the raw sums of blockIdx.z's share of K go to the
 *   workspace (p.ws; gemm_splitk_reduce applies the epilogue) or, the default, stay in shared
 *   memory and the tile's cluster sums them (wr_cluster_reduce); a GDN in-projection's conv
 *   columns go through the conv1d on the way out (wr_store_conv, tl_gpu_gemm_conv1d).
 * PDL: a dense product requests its first weight stages before waiting for the previous kernel
 *   (gm_prologue's order); the MoE waits first (its plan comes from the previous kernel).
 * bytes: per block W of its 64 WGS rows once, the tile's tokens once (from L2); Y written once.
 * reference: cpu_matmul through the MoE plan (tests/gpu/test_prefill_kernels.c, tiles 6 and 7);
 *   the host emulator (dev/emu/gemm_emu.sh) against a double product. */
#define WR_STAGES 4
/* WGS warpgroups of 64 weight rows: BN rows a block; tiles of at most NTM = WR_NT tokens (a
 * 64-token, 8-stage configuration for short chunks lost 2-9% at 512..16K tokens, H100 session 29,
 * and was removed); a stage holds the token tile (NTM tokens x 64 k, bf16, swizzled: X_BYTES),
 * BN rows x 64 packed nibbles, BN scale/bias words; ST = WR_STAGES stages; the f32 output tile
 * [NTM tokens][BN + 4] reuses the stages (and sets the size when larger). */
template <int WGS_> struct wr_cfg {
    static constexpr int WGS = WGS_, NTM = WR_NT, ST = WR_STAGES;
    static constexpr int BN = 64 * WGS, THREADS = 128 * WGS;
    static constexpr int X_BYTES = NTM * 128, Q_BYTES = BN * GM_BK / 2;
    static constexpr int STAGE_BYTES = (X_BYTES + Q_BYTES + BN * 4 + 1023) / 1024 * 1024;
    static constexpr int OUT_BYTES = NTM * (BN + 4) * 4;
    static constexpr int SMEM =
        (ST * STAGE_BYTES > OUT_BYTES + NTM * 4 ? ST * STAGE_BYTES : OUT_BYTES + NTM * 4) +
        1024; /* + the output rows (wr_epilogue's srow) + alignment slack */
};

/* A warp's packed words for one stage: words wl (rows g) and wu (rows g + 8) of the two 32-column
 * halves of its 16 rows r0 .., and those rows' scale/bias words (wr_afrag dequantizes them). */
struct wr_words {
    uint32_t wl[2], wu[2], sl, su;
};
template <class C>
static __device__ __forceinline__ wr_words wr_load_words(const uint8_t *stage, int r0, int lane) {
    const uint32_t *sQ = (const uint32_t *)(stage + C::X_BYTES), *sS = sQ + C::Q_BYTES / 4;
    wr_words q;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        q.wl[h] = sQ[((r0 >> 3) * 2 + h) * 32 + lane];
        q.wu[h] = sQ[((r0 >> 3) * 2 + 2 + h) * 32 + lane];
    }
    q.sl = sS[r0 + (lane >> 2)], q.su = sS[r0 + 8 + (lane >> 2)];
    return q;
}

/* bf16x2 of the two nibbles at bits 0 and 16 of w: s q + b (gemm_mma_kernel's operations); the
 * nibble mask and the exponent e of 128 in one lop3 (q4m_nib) */
static __device__ __forceinline__ uint32_t wr_deq(uint32_t w, uint32_t e, uint32_t s2u,
                                                  uint32_t b2u) {
    const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
    uint32_t xu = q4m_nib(w, e);
    __nv_bfloat162 xv = *(__nv_bfloat162 *)&xu;
    xv = __hfma2(__hsub2(xv, k128), *(__nv_bfloat162 *)&s2u, *(__nv_bfloat162 *)&b2u);
    return *(uint32_t *)&xv;
}
/* The A fragments of a warp's 16 rows for the four k16 steps of one stage (words q). */
static __device__ __forceinline__ void wr_afrag(uint32_t (&af)[4][4], const wr_words &q) {
    const uint32_t e = 0x43004300u;
    uint32_t sll = __byte_perm(q.sl, 0, 0x1010), bll = __byte_perm(q.sl, 0, 0x3232);
    uint32_t suu = __byte_perm(q.su, 0, 0x1010), buu = __byte_perm(q.su, 0, 0x3232);
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int s2 = 0; s2 < 2; s2++) {
            af[2 * h + s2][0] = wr_deq(q.wl[h] >> (8 * s2), e, sll, bll);
            af[2 * h + s2][1] = wr_deq(q.wu[h] >> (8 * s2), e, suu, buu);
            af[2 * h + s2][2] = wr_deq(q.wl[h] >> (8 * s2 + 4), e, sll, bll);
            af[2 * h + s2][3] = wr_deq(q.wu[h] >> (8 * s2 + 4), e, suu, buu);
        }
}

/* Split-K in a cluster (dense products of decode batches, TL_GEMM_SPLITK_CLUSTER): the gridDim.z
 * blocks of a tile are one cluster, each holding the raw f32 sums of its share of K in its
 * shared tile so (ntok tokens x BN rows, row stride lds floats). After a cluster barrier, block z
 * sums the tiles of blocks 0 .. gridDim.z - 1, in that order, from their shared memory for the
 * output pairs z, z + gridDim.z, ... (per pair: gemm_splitk_reduce's arithmetic, SwiGLU columns
 * included) and stores them; a second barrier keeps every tile alive until all have read it. No
 * workspace, no reduce kernel. */
template <int WGS>
static __device__ __forceinline__ void wr_cluster_reduce(const gemm_args &p, const float *so,
                                                         int lds, int m0, int ntok, int tid) {
    typedef wr_cfg<WGS> C;
    const int swiglu = p.flags & TL_GEMM_SWIGLU, nz = gridDim.z;
    const int o0 = swiglu ? blockIdx.x * C::BN / 2 : blockIdx.x * C::BN;
    const int nout = swiglu ? p.N / 2 : p.N; /* dense rows need not fill the last block */
    const int pairs = min(swiglu ? C::BN / 2 : C::BN, nout - o0) / 2;
    const uint32_t so_a = smem_u32(so);
    cluster_sync(); /* every block's sums are in its shared memory */
    for (int i = blockIdx.z * C::THREADS + tid; i < ntok * pairs; i += nz * C::THREADS) {
        int tok = i / pairs, o = 2 * (i % pairs);
        int c = swiglu ? (o / 8) * 16 + o % 8 : o; /* gate column; up: c + 8 */
        uint32_t a = so_a + (uint32_t)(tok * lds + c) * 4;
        float v0 = 0.f, v1 = 0.f, u0 = 0.f, u1 = 0.f;
        for (int z = 0; z < nz; z++) {
            uint32_t r = dsmem_map(a, z);
            float2 g = dsmem_ld2(r);
            v0 += g.x, v1 += g.y;
            if (swiglu) {
                float2 u = dsmem_ld2(r + 32);
                u0 += u.x, u1 += u.y;
            }
        }
        if (swiglu) v0 = silu_f(v0) * u0, v1 = silu_f(v1) * u1;
        gm_store2(p, (size_t)(m0 + tok) * p.ldy + o0 + o, v0, v1);
    }
    cluster_sync(); /* no block leaves while another reads its tile */
}

/* The stores of a full block (NCOL output columns, every one inside y; no split-K workspace):
 * thread tid keeps column pair c = 2 (tid % PAIRS) and walks tokens tid / PAIRS, + THREADS /
 * PAIRS, ..., each token's output row read from srow (its scatter row, filled before the
 * epilogue's barrier): compile-time strides, no division and no plan lookup a pair. A warp
 * stores 32 adjacent pairs of one token row. Unrolled twice only: fully unrolled (ntok <= NT is
 * known) the eight copies (four token classes, SwiGLU or not) grew the kernel from 9.5K to 15.8K
 * instructions; twice, prefill is the same or better (H100, session 21). Decode batches of 256
 * are ~1.5% a step slower than before this store either way, and with the dense products on the
 * old per-pair loop too: not the store's size, not the dense products; unexplained. */
template <int NCOL, int THREADS>
static __device__ __forceinline__ void wr_store_full(const gemm_args &p, const float *so,
                                                     const int *srow, int c0, int ntok, int tid) {
    constexpr int PAIRS = NCOL / 2, STEP = THREADS / PAIRS, LDS = NCOL + 4;
    static_assert(THREADS % PAIRS == 0, "whole token rows a round");
    const int c = 2 * (tid % PAIRS);
#pragma unroll 2
    for (int tok = tid / PAIRS; tok < ntok; tok += STEP) {
        const float2 v = *(const float2 *)(so + tok * LDS + c);
        gm_store2(p, (size_t)srow[tok] * p.ldy + c0 + c, v.x, v.y);
    }
}

/* The stores of a conv block of a fused in-projection (gemm_args.cv_*; dense, unsplit, no
 * SwiGLU, every column a conv input): wr_store_full's walk, but token tok's pair goes through the
 * conv1d + SiLU over tokens tok - 3 .. tok of the shared tile (conv4_silu, conv1d_silu_kernel's
 * expression on the same f32 values: the same bits) into cv_out; the first three tokens, whose
 * predecessors lie in the previous tile, are left to cb_conv1d_edges, which reads the raw values
 * of every tile's first and last three tokens from cv_edge (slots 0-2 and 3-5). */
template <int NCOL, int THREADS>
static __device__ __forceinline__ void wr_store_conv(const gemm_args &p, const float *so, int c0,
                                                     int m0, int ntok, int tid) {
    constexpr int PAIRS = NCOL / 2, STEP = THREADS / PAIRS, LDS = NCOL + 4;
    static_assert(THREADS % PAIRS == 0, "whole token rows a round");
    const int c = 2 * (tid % PAIRS), C = p.cv_C;
    const float4 w0 = *(const float4 *)(p.cv_w + (size_t)(c0 + c) * 4);
    const float4 w1 = *(const float4 *)(p.cv_w + (size_t)(c0 + c + 1) * 4);
    float *edge = p.cv_edge + (size_t)blockIdx.y * 6 * C + c0 + c;
    for (int tok = tid / PAIRS; tok < ntok; tok += STEP) {
        const float2 v = *(const float2 *)(so + tok * LDS + c);
        if (tok < 3) *(float2 *)(edge + (size_t)tok * C) = v;
        if (tok >= ntok - 3) *(float2 *)(edge + (size_t)(6 + tok - ntok) * C) = v;
        if (tok < 3) continue;
        const float2 a = *(const float2 *)(so + (tok - 3) * LDS + c);
        const float2 b = *(const float2 *)(so + (tok - 2) * LDS + c);
        const float2 d = *(const float2 *)(so + (tok - 1) * LDS + c);
        *(float2 *)(p.cv_out + (size_t)(m0 + tok) * C + c0 + c) =
            make_float2(conv4_silu(w0, a.x, b.x, d.x, v.x), conv4_silu(w1, a.y, b.y, d.y, v.y));
    }
}

/* Stores a block's outputs: acc (NT tokens as the wgmma N) -> shared tile -> y rows. tid: the
 * thread among the C::THREADS that hold accumulators (warp tid / 32 owns rows 16 (tid / 32) ..);
 * sync: their barrier. The tile's output rows (srow, after the tile) are looked up once, before
 * the barrier. */
template <int WGS, int NT, class Sync>
static __device__ __forceinline__ void wr_epilogue(const gemm_args &p, float (&acc)[NT / 2],
                                                   float *so, const int32_t *perm, int m0,
                                                   int m_end, int tid, Sync sync) {
    typedef wr_cfg<WGS> C;
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    /* split-K: the raw sums of this block's share of K (the SwiGLU comes after the sum) */
    const int split = gridDim.z > 1;
    const int swiglu = !split && (p.flags & TL_GEMM_SWIGLU), ncol = swiglu ? C::BN / 2 : C::BN;
    const int lds = ncol + 4, r0 = warp * 16;
    const int ntok = min(m_end - m0, NT);
    int *srow = (int *)(so + NT * lds);
#pragma unroll
    for (int j = 0; j < NT / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float *row = so + (8 * j + 2 * t + e) * lds;
            if (swiglu) {
                row[r0 / 2 + g] = silu_f(acc[4 * j + e]) * acc[4 * j + 2 + e];
            } else {
                row[r0 + g] = acc[4 * j + e];
                row[r0 + 8 + g] = acc[4 * j + 2 + e];
            }
        }
    if (tid < ntok) srow[tid] = p.mode == GM_MOE_SCATTER ? gm_asg(p, perm, m0 + tid) : m0 + tid;
    sync();
    if (split && !p.ws) return wr_cluster_reduce<WGS>(p, so, lds, m0, ntok, tid);
    const int c0 = swiglu ? blockIdx.x * C::BN / 2 : blockIdx.x * C::BN;
    const int nout = swiglu ? p.N / 2 : p.N; /* dense rows need not fill the last block */
    const int pairs = min(ncol, nout - c0) / 2;
    float *wz = p.ws ? p.ws + (size_t)blockIdx.z * p.M * p.N : NULL; /* dense only */
    if (p.cv_C && c0 < p.cv_C) /* host-checked: dense, unsplit, cv_C % BN == 0 */
        return wr_store_conv<C::BN, C::THREADS>(p, so, c0, m0, ntok, tid);
    if (!wz && 2 * pairs == ncol) {
        if (swiglu) return wr_store_full<C::BN / 2, C::THREADS>(p, so, srow, c0, ntok, tid);
        return wr_store_full<C::BN, C::THREADS>(p, so, srow, c0, ntok, tid);
    }
    for (int i = tid; i < ntok * pairs; i += C::THREADS) {
        int tok = i / pairs, c = 2 * (i % pairs), m = m0 + tok;
        if (wz) {
            *(float2 *)(wz + (size_t)m * p.N + c0 + c) =
                make_float2(so[tok * lds + c], so[tok * lds + c + 1]);
            continue;
        }
        gm_store2(p, (size_t)srow[tok] * p.ldy + c0 + c, so[tok * lds + c], so[tok * lds + c + 1]);
    }
}

/* A block's stage copies (cp.async; every thread of the wgr kernel loads), from running sources
 * that advance one k tile a call: loader thread i of NTHR copies the token chunks i + NTHR j (row
 * (i >> 3) + NTHR / 8 j, 16-byte column i & 7 of the stage's 64 k; rows past m_end load zeros,
 * MoE gathers read their token's row), the weight chunks i + NTHR h (row block c >> 4, 16 bytes
 * c & 15 of its 256; rows past N load zeros) and, for i < BN / 4, the scale/bias words of rows
 * 4i .. 4i + 3. kb: the block's first k tile (split-K). */
template <class C, int NT, int NTHR> struct wr_stream {
    static constexpr int XC = (NT * 8 + NTHR - 1) / NTHR, WC = 2 * C::BN / NTHR;
    const uint16_t *xb; /* the chunks' column in the next k tile; chunk j's row at xo[j] */
    int xo[XC];
    const uint32_t *w[WC], *s;
    uint32_t x_ok, w_ok, s_ok; /* bit j: chunk j reads (else zero fill) */
    int s_step;

    __device__ __forceinline__ wr_stream(const gemm_args &p, const uint8_t *wb, const uint32_t *sb,
                                         const int32_t *perm, int m0, int m_end, int i, int kb,
                                         int n0) {
        x_ok = w_ok = 0;
#pragma unroll
        for (int j = 0; j < XC; j++) {
            int m = m0 + (i >> 3) + NTHR / 8 * j, ok = m < m_end;
            x_ok |= (uint32_t)ok << j;
            int src = ok ? m : m0;
            if (p.mode == GM_MOE_GATHER) src = gm_tok(p, gm_asg(p, perm, src));
            xo[j] = src * p.K;
        }
        xb = p.x + (i & 7) * 8 + kb * GM_BK;
#pragma unroll
        for (int h = 0; h < WC; h++) {
            const int c = i + NTHR * h, rb = c >> 4, ok = n0 + 8 * rb < p.N;
            w_ok |= (uint32_t)ok << h;
            w[h] = (const uint32_t *)wb +
                   ((size_t)(ok ? n0 / 8 + rb : 0) * (p.K / 32) + kb * 2) * 32 + (c & 15) * 4;
        }
        s_ok = n0 + 4 * i < p.N;
        s = sb + (size_t)kb * p.N + (s_ok ? n0 + i * 4 : 0);
        s_step = p.N;
    }
    /* the token chunks of the next k tile into the stage at st (thread i) */
    __device__ __forceinline__ void xn(uint8_t *st, int i) {
#pragma unroll
        for (int j = 0; j < XC; j++) {
            const int r = (i >> 3) + NTHR / 8 * j;
            if (r < NT) cp_async16(st + wg_swz(r, i & 7), xb + xo[j], (x_ok >> j) & 1 ? 16 : 0);
        }
        xb += GM_BK;
    }
    /* the weight chunks and scale/bias words of the next k tile */
    __device__ __forceinline__ void wn(uint8_t *st, int i) {
        uint32_t *sQ = (uint32_t *)(st + C::X_BYTES);
#pragma unroll
        for (int h = 0; h < WC; h++) {
            const int c = i + NTHR * h;
            cp_async16(sQ + (c >> 4) * 64 + (c & 15) * 4, w[h], (w_ok >> h) & 1 ? 16 : 0);
            w[h] += 64;
        }
        if (i < C::BN / 4) cp_async16(sQ + C::Q_BYTES / 4 + i * 4, s, s_ok ? 16 : 0);
        s += s_step;
    }
};

/* One k step of a block's ring on stage s (a constant where the caller's loop is unrolled, so the
 * stage offset and the descriptors are too): the stage's tile landed (cp.async group), the warp's
 * packed words dequantized into A fragments, four wgmma (scale-d 0 at kt == 0: they start the
 * accumulators), then a barrier: every warpgroup is past the previous step, whose stage the caller
 * refills next. d0hi | d0lo: the descriptor of the ring's base (wg_desc). */
template <class C, int NT>
static __device__ __forceinline__ void wr_step(float (&acc)[NT / 2], const uint8_t *smem, int s,
                                               uint64_t d0hi, uint32_t d0lo, int r0, int lane,
                                               int kt) {
    cp_async_wait<C::ST - 2>(); /* tile kt */
    wg_fence_proxy();
    __syncthreads();
    const wr_words q = wr_load_words<C>(smem + s * C::STAGE_BYTES, r0, lane);
    wg_wait<0>(); /* this warpgroup's wgmma of the previous step read its A registers */
    uint32_t af[4][4];
    wr_afrag(af, q);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        wg_mma_rs<NT>(acc, af[kk], d0hi | (d0lo + (uint32_t)((s * C::STAGE_BYTES + kk * 32) >> 4)),
                      kt | kk);
    wg_commit();
    __syncthreads(); /* every warpgroup is past the previous step: its stage is free */
}

/* One block of a tile of at most NT tokens (rows m0 .. m_end - 1 of the plan). The ring runs
 * STAGES steps an iteration, so stage offsets and the wgmma descriptors are constants past one
 * base (a descriptor's address field is the shared address / 16: the offset adds to it). */
template <class C, int NT>
static __device__ __forceinline__ void wr_block(const gemm_args &p, uint8_t *smem,
                                                const uint8_t *wb, const uint32_t *sbb,
                                                const int32_t *perm, int m0, int m_end) {
    static_assert(NT <= C::NTM, "the stage holds NTM tokens");
    constexpr int S = C::ST;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r0 = warp * 16;
    const int KT = p.K / GM_BK / gridDim.z, kb = blockIdx.z * KT; /* split-K: z's share */
    wr_stream<C, NT, C::THREADS> cs(p, wb, sbb, perm, m0, m_end, tid, kb, blockIdx.x * C::BN);
    /* gm_prologue's order: the weights of stages 0 .. S - 2, the wait (dense), then the tokens */
#pragma unroll
    for (int s = 0; s < S - 1; s++)
        if (s < KT) cs.wn(smem + s * C::STAGE_BYTES, tid);
    if (p.mode == GM_DENSE) pdl_enter(p.trig);
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < KT) cs.xn(smem + s * C::STAGE_BYTES, tid);
        cp_async_commit();
    }
    float acc[NT / 2]; /* the first wgmma (scale-d 0) initialises them */
    /* the descriptors' high word is the same for every stage; the offsets add to the low word's
     * address field without a carry (shared addresses < 256 KB): a 32-bit add, no 64-bit one */
    const uint64_t d0 = wg_desc(smem_u32(smem));
    const uint32_t d0lo = (uint32_t)d0;
    const uint64_t d0hi = d0 & 0xffffffff00000000ull;
    for (int kt0 = 0; kt0 < KT; kt0 += S) {
#pragma unroll
        for (int s = 0; s < S; s++) {
            const int kt = kt0 + s;
            if (kt >= KT) break; /* block-uniform */
            wr_step<C, NT>(acc, smem, s, d0hi, d0lo, r0, lane, kt);
            if (kt + S - 1 < KT) {
                uint8_t *nx = smem + ((s + S - 1) % S) * C::STAGE_BYTES;
                cs.wn(nx, tid), cs.xn(nx, tid);
            }
            cp_async_commit();
        }
    }
    wg_wait<0>();
    cp_async_wait<0>();
    __syncthreads(); /* the stages become the output tile */
    wr_epilogue<C::WGS, NT>(p, acc, (float *)smem, perm, m0, m_end, threadIdx.x,
                            [] { __syncthreads(); });
}

template <int WGS>
__global__ void __launch_bounds__(128 * WGS, WGS == 2 ? 2 : 1) gemm_wgr_kernel(gemm_args p) {
    typedef wr_cfg<WGS> C;
    extern __shared__ uint8_t wr_smem_raw[];
    /* aligned by an offset, so the compiler still sees a shared-memory pointer (an integer round
     * trip made every stage read a generic load, the shared window's base recomputed each step) */
    uint8_t *smem = wr_smem_raw + ((0u - smem_u32(wr_smem_raw)) & 1023u);
    const uint8_t *wb = p.w;
    const uint32_t *sbb = p.sb;
    const int32_t *perm;
    int m0, m_end;
    if (p.mode != GM_DENSE) pdl_enter(p.trig); /* the MoE plan; a dense product waits in wr_block */
    if (!gm_tile<4, WR_NT>(p, &wb, &sbb, &perm, &m0, &m_end)) return;
    int nc = (min(m_end - m0, WR_NT) + 31) / 32; /* block-uniform */
    if (nc == 4) return wr_block<C, 128>(p, smem, wb, sbb, perm, m0, m_end);
    if (nc == 3) return wr_block<C, 96>(p, smem, wb, sbb, perm, m0, m_end);
    if (nc == 2)
        wr_block<C, 64>(p, smem, wb, sbb, perm, m0, m_end);
    else
        wr_block<C, 32>(p, smem, wb, sbb, perm, m0, m_end);
}

/* ksplit > 1: with p->ws, the partials to the workspace (gemm_splitk_reduce follows); without, the
 * ksplit blocks of a tile as one cluster (wr_cluster_reduce; ksplit <= 8). */
template <int WGS>
static int launch_gemm_wgr(const gemm_args *p, int grid_y, int ksplit, const tl_gpu_stream *st) {
    typedef wr_cfg<WGS> C;
    auto kern = gemm_wgr_kernel<WGS>;
    if (smem_limit<gemm_wgr_kernel<WGS>>(C::SMEM)) return TL_ERR_CUDA;
    if (grid_y <= 0) return 0;
    if (grid_y > 65535 || ksplit < 1 || (ksplit > 1 && p->mode != GM_DENSE) ||
        (ksplit == 1 && p->ws) || (!p->ws && ksplit > 8) || (p->K / GM_BK) % ksplit)
        return TL_ERR_INVALID;
    dim3 grid((p->N + C::BN - 1) / C::BN, grid_y, ksplit);
    if (ksplit > 1 && !p->ws)
        TL_LAUNCH_CLUSTER(st, "gemm_wgr_cluster", ksplit, kern, grid, dim3(C::THREADS), C::SMEM,
                          *p);
    else
        TL_LAUNCH(st, p->mode == GM_DENSE ? "gemm_wgr" : "gemm_wgr_moe", kern, grid,
                  dim3(C::THREADS), C::SMEM, *p);
    return 0;
}

int cb_gemm_wgr(const gemm_args *p, int wgs, int tiles, int ksplit, const tl_gpu_stream *st) {
    return wgs == 2 ? launch_gemm_wgr<2>(p, tiles, ksplit, st)
                    : launch_gemm_wgr<4>(p, tiles, ksplit, st);
}
