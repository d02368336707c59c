/* The 4-bit GEMV machinery on tensor cores ("q4m"), shared by the decode GEMV (k_gemv.cu) and
 * the decode MoE (k_moe.cu): staging of x as bf16 hi/lo rows, the per-tile dot products (q4m_dot
 * for up to 8 tokens, the q4v dot for one or two), the persistent cp.async weight ring, and the
 * bf16 R-row dot of the bf16 GEMV paths. */
#ifndef TL_K_Q4M_CUH
#define TL_K_Q4M_CUH

#include "cuda/cuda_common.cuh"

/* ---- 4-bit GEMV on tensor cores ("q4m") ----
 * note: q4 tiled layout (gpu.h). Tile (rb, kb) = rows 8rb..8rb+7 x columns 32kb..32kb+31,
 * 32 words; in word `lane` nibble n holds column 32kb + 2*(lane%4) + Q4_COL[n] of row
 * 8rb + lane/4, Q4_COL = {0, 8, 16, 24, 1, 9, 17, 25}. Scale/bias word of (row, group g of 64
 * columns) at sb[g * rows + row] (bf16 scale low, bf16 bias high).
 *
 * That word is, after (w >> 4j) & 0x000F000F | 0x43004300, a bf16x2 register holding 128 + q of
 * columns (2t + 8j, 2t + 8j + 1): exactly the B fragment of mma.m16n8k16 (k = columns, n = the 8
 * rows of the tile) for k-step j/2, register j%2. So one weight word per lane feeds two mmas
 * (columns 0-15 and 16-31 of the tile) after 3 shifts and 4 LOP3s, and the +128 is taken out per
 * group: sum (128+q) x = 128 Sx + sum q x, with Sx the group's sum of x.
 * The A operand holds the input: rows 0..7 = up to 8 tokens' x rounded to bf16 (hi), rows 8..15 =
 * the rounding remainders bf16(x - hi) (lo), so the sum over both halves carries x to ~2^-17
 * relative: the GEMV keeps near-fp32 accuracy (tests/gpu/test_kernels.c tolerances) although
 * the tensor cores only take bf16. Lane (g, t) = (lane/4, lane%4) ends with the outputs of token g
 * for rows 8rb + 2t and 8rb + 2t + 1.
 * Per 128 bytes of weights a warp issues 1 load, 7 integer ops, 2 shared loads and 2 mmas (plus
 * ~13 ops per group of two tiles), against ~25 instructions of the CUDA-core version this
 * replaces (nibble -> float, FMA, one lane per tile): the dequantisation no longer limits the
 * bandwidth (notes/2026-12-02-decode-q4m.md).
 *
 * Staged x (shared memory, q4m_stage): token row r at xs + r * q4m_lds(K) (uint4 units); per
 * (kb, t) two uint4, one per k-step s = 0, 1: {hi(c, c+1), lo(c, c+1), hi(c+8, c+9), lo(c+8, c+9)}
 * with c = 32kb + 16s + 2t, i.e. exactly the A registers a0..a3 of that mma (no register moves).
 * The row stride is KB*8 + 1 uint4s (16 bytes over a multiple of 128), so 8 tokens' reads of one
 * (kb) spread over all banks. Group sums Sx [8][KB/2] floats follow the 8 rows (q4m_sx). */
/* Split of K = 32*KB columns for the persistent q4m kernels (k_gemv.cu): KPW tiles per warp
 * (16, else 32, else 8; dividing KB) and KS = KB / KPW warps along K (<= max_ks); 0 or
 * TL_ERR_INVALID when no split fits. */
int q4m_split(int K, int max_ks, int *kpw, int *ks);
/* Where the decode kernels use the q4v dot (k_gemv.cu, TL_Q4V): 0 nowhere, 1 the GEMV and
 * moe_up kernels of one or two tokens, 2 moe_down of single tokens too. */
int cb_q4v_on(void);
__host__ __device__ __forceinline__ int q4m_lds(int K) { return (K >> 5) * 8 + 1; }
__host__ __device__ __forceinline__ size_t q4m_smem(int K, int n_rows) {
    return (size_t)n_rows * q4m_lds(K) * 16 + (size_t)n_rows * (K >> 6) * 4;
}
__device__ __forceinline__ float *q4m_sx(uint4 *xs, int K, int n_rows) {
    return (float *)(xs + (size_t)n_rows * q4m_lds(K));
}

__device__ __forceinline__ uint32_t q4m_pack(float a, float b) {
    return (uint32_t)f2bf(a) | ((uint32_t)f2bf(b) << 16);
}

/* Stages rows 0..nt-1 of x (row stride ldx, times xw if non-NULL) into xs/sx (layout above) with
 * threads tid0 .. tid0+nthr-1 of the block (whole warps). If ss is non-NULL (then nthr = 256),
 * ss[w * 8 + r] accumulates the sum of raw x^2 of row r over the row's 32-item chunks c with
 * c % 8 == w, in order of c: the warp that stages chunk c also stages c + 8, so each slot has one
 * writer, and the sums (so a normed token's bits) do not depend on how many rows are staged with
 * it. The caller zeroes ss[0..63] first and adds w = 0..7 in order after a barrier. */
__device__ __forceinline__ void q4m_stage(uint4 *xs, float *sx, const float *x, int ldx,
                                          const float *xw, int K, int nt, int tid, int nthr,
                                          float *ss) {
    int KB = K >> 5, per_row = KB * 4, lds = q4m_lds(K), n_items = nt * per_row;
    int lane = threadIdx.x & 31;
    for (int it = tid; it < n_items; it += nthr) { /* a warp's 32 items lie in one row */
        int r = it / per_row, rem = it - r * per_row, kb = rem >> 2, t = rem & 3;
        const float *xp = x + (size_t)r * ldx + kb * 32 + 2 * t;
        float v[8], sq = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 p = *(const float2 *)(xp + 8 * j);
            v[2 * j] = p.x, v[2 * j + 1] = p.y;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) sq = fmaf(v[i], v[i], sq);
        if (xw) {
            const float *wp = xw + kb * 32 + 2 * t;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 p = *(const float2 *)(wp + 8 * j);
                v[2 * j] *= p.x, v[2 * j + 1] *= p.y;
            }
        }
        float hi[8], lo[8], s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            hi[i] = bf2f(f2bf(v[i]));
            lo[i] = bf2f(f2bf(v[i] - hi[i]));
            s += hi[i] + lo[i];
        }
        uint4 *o = xs + (size_t)r * lds + kb * 8 + t * 2;
        o[0] = make_uint4(q4m_pack(hi[0], hi[1]), q4m_pack(lo[0], lo[1]), q4m_pack(hi[2], hi[3]),
                          q4m_pack(lo[2], lo[3]));
        o[1] = make_uint4(q4m_pack(hi[4], hi[5]), q4m_pack(lo[4], lo[5]), q4m_pack(hi[6], hi[7]),
                          q4m_pack(lo[6], lo[7]));
        /* the 8 consecutive items it & ~7 .. it | 7 are the two kb of one group */
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        if ((it & 7) == 0) sx[r * (KB >> 1) + (kb >> 1)] = s;
        if (ss) {
            sq = warp_sum(sq);
            if (lane == 0) ss[((rem >> 5) & 7) * 8 + r] += sq;
        }
    }
}

/* Loads a warp's KPW weight words (tiles (rb, kb0 .. kb0+KPW-1), one word per lane each) and
 * the scale/bias pairs of rows 8rb + 2t, +1 for its KPW/2 groups. kb0 even. */
template <int KPW>
__device__ __forceinline__ void q4m_load(uint32_t (&wq)[KPW], uint2 (&sbv)[KPW / 2],
                                         const uint32_t *w, const uint32_t *sb, int rows, int K,
                                         int rb, int kb0) {
    int lane = threadIdx.x & 31, KB = K >> 5;
    const uint32_t *wp = w + ((size_t)rb * KB + kb0) * 32 + lane;
#pragma unroll
    for (int i = 0; i < KPW; i++) wq[i] = __ldcs(wp + (size_t)i * 32);
    const uint32_t *sp = sb + (size_t)(kb0 >> 1) * rows + rb * 8 + 2 * (lane & 3);
#pragma unroll
    for (int g = 0; g < KPW / 2; g++) sbv[g] = __ldcs((const uint2 *)(sp + (size_t)g * rows));
}

/* (a & M) | E in one LOP3 (the compiler emits two: LOP3 takes one immediate). */
__device__ __forceinline__ uint32_t q4m_nib(uint32_t a, uint32_t e) {
    uint32_t r;
    asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(r) : "r"(a), "r"(e));
    return r;
}

/* acc0/acc1 (rows 8rb + 2t, +1; token g = lane/4) += the dot of the loaded tiles with staged row
 * xrow (= xs + g' * q4m_lds(K)) and its group sums sxrow (= sx + g' * KB/2). Lanes whose g has no
 * token pass g' = the last token's row: their D rows are computed and dropped, which costs
 * nothing and keeps every load unpredicated. kb0 = the first tile's column block. */
template <int KPW>
__device__ __forceinline__ void q4m_dot(float &acc0, float &acc1, const uint32_t (&wq)[KPW],
                                        const uint2 (&sbv)[KPW / 2], const uint4 *xrow,
                                        const float *sxrow, int kb0) {
    int t = threadIdx.x & 3;
    const uint32_t E = 0x43004300u;
#pragma unroll
    for (int g = 0; g < KPW / 2; g++) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int kb = kb0 + 2 * g + h;
            uint4 x0 = xrow[kb * 8 + t * 2], x1 = xrow[kb * 8 + t * 2 + 1];
            uint32_t w = wq[2 * g + h];
            mma_bf16(d, x0.x, x0.y, x0.z, x0.w, q4m_nib(w, E), q4m_nib(w >> 4, E));
            mma_bf16(d, x1.x, x1.y, x1.z, x1.w, q4m_nib(w >> 8, E), q4m_nib(w >> 12, E));
        }
        float sxv = sxrow[(kb0 >> 1) + g];
        float s0 = __uint_as_float(sbv[g].x << 16), b0 = __uint_as_float(sbv[g].x & 0xffff0000u);
        float s1 = __uint_as_float(sbv[g].y << 16), b1 = __uint_as_float(sbv[g].y & 0xffff0000u);
        acc0 = fmaf(s0, d[0] + d[2], fmaf(fmaf(-128.0f, s0, b0), sxv, acc0));
        acc1 = fmaf(s1, d[1] + d[3], fmaf(fmaf(-128.0f, s1, b1), sxv, acc1));
    }
}

/* A q4m work item in shared memory (q4m_stage_bytes(KPW) bytes at dst, 16-byte aligned): the
 * KPW tiles (rb, kb0 .. kb0 + KPW - 1) of W (KPW * 128 contiguous bytes) and the scale/bias words
 * of rows 8rb .. 8rb + 7 for their KPW / 2 groups (32 bytes a group), as cp.async by the calling
 * warp (not committed). q4m_item_dot: the item's dot product (q4m_dot) once it has landed. */
template <int KPW>
__device__ __forceinline__ void q4m_issue(char *dst, const uint32_t *W, const uint32_t *S, int rows,
                                          int K, int rb, int kb0) {
    int lane = threadIdx.x & 31;
    const char *ws = (const char *)(W + ((size_t)rb * (K >> 5) + kb0) * 32);
#pragma unroll
    for (int i = 0; i < KPW * 8 / 32; i++)
        cp_async16(dst + (i * 32 + lane) * 16, ws + (i * 32 + lane) * 16, 16);
    if (lane < KPW)
        cp_async16(dst + KPW * 128 + lane * 16,
                   S + (size_t)(kb0 / 2 + (lane >> 1)) * rows + rb * 8 + (lane & 1) * 4, 16);
}

template <int KPW>
__device__ __forceinline__ void q4m_item_dot(float &a0, float &a1, const char *item,
                                             const uint4 *xrow, const float *sxrow, int kb0) {
    int lane = threadIdx.x & 31, t = lane & 3;
    const uint32_t *ws = (const uint32_t *)item, *ss = (const uint32_t *)(item + KPW * 128);
    uint32_t wq[KPW];
    uint2 sbv[KPW / 2];
#pragma unroll
    for (int j = 0; j < KPW; j++) wq[j] = ws[j * 32 + lane];
#pragma unroll
    for (int g = 0; g < KPW / 2; g++) sbv[g] = *(const uint2 *)(ss + g * 8 + 2 * t);
    q4m_dot<KPW>(a0, a1, wq, sbv, xrow, sxrow, kb0);
}

/* ---- the one-mma-per-word dot for one or two tokens ("q4v") ----
 * q4m_dot spends two mmas on each weight word (rows 8..15 of A hold the lo halves of x) and reads
 * x's A registers from shared memory for every tile. q4v takes the word of lane (g, t) (row g of
 * the tile, columns 2t + Q4_COL[n]) as the A fragment of one mma.m16n8k16 over 32 columns:
 * A[g][k] = W[g][k], A[g + 8][k] = W[g][16 + k] (k < 16), i.e. a0 = nib(w), a1 = nib(w >> 8),
 * a2 = nib(w >> 4), a3 = nib(w >> 12). B's column n carries token n >> 2's x, the hi (n & 2 = 0)
 * or lo half, of columns 16 (n & 1) + 0..15: then D[g][2t'] (c0 of lane (g, t')) and
 * D[g + 8][2t' + 1] (c3) are row g's products with token t' >> 1's hi (t' even) or lo (t' odd)
 * half of the first and the second 16 columns, and lane (g, t) keeps c0 + c3 (c1, c2 are cross
 * terms, dropped). A warp's B registers do not change across its units (a fixed K-slice): they
 * are read from the staged x once (q4v_load_x: 2 per tile), so the tiles need no shared-memory
 * x reads. Per group of 64 columns the lane adds s * (its half's sum), and the even lane also
 * (b - 128 s) * Sx; the two halves meet by one shuffle (q4v_pairs). Accuracy as q4m_dot's (the
 * same hi + lo split, fp32 accumulation); the summation order differs, so the bits do too. */
template <int KPW> struct q4v_x {
    uint32_t b[KPW][2]; /* B registers of the warp's tiles kb0 .. kb0 + KPW - 1 */
    float sx[KPW / 2];  /* group sums of token t >> 1 (q4m_sx) for its KPW / 2 groups */
};

/* X := the B registers and group sums of the warp's K-slice (tiles kb0.., even) for nt = 1 or
 * 2 staged tokens (q4m_stage layout at xs, sx). */
template <int KPW>
__device__ __forceinline__ void q4v_load_x(q4v_x<KPW> &X, const uint4 *xs, const float *sx, int K,
                                           int nt, int kb0) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, KB = K >> 5;
    const uint4 *row = xs + (size_t)min(g >> 2, nt - 1) * q4m_lds(K) + t * 2 + (g & 1);
    bool lo = g & 2;
#pragma unroll
    for (int j = 0; j < KPW; j++) {
        uint4 v = row[(kb0 + j) * 8]; /* {hi(c, c+1), lo(c, c+1), hi(c+8, c+9), lo(c+8, c+9)} */
        X.b[j][0] = lo ? v.y : v.x;
        X.b[j][1] = lo ? v.w : v.z;
    }
    const float *s = sx + (size_t)min(t >> 1, nt - 1) * (KB >> 1) + (kb0 >> 1);
#pragma unroll
    for (int q = 0; q < KPW / 2; q++) X.sx[q] = s[q];
}

/* acc (row g of the tile, token t >> 1, half t & 1) += the dot of the loaded words with X;
 * sbw[q] = row g's scale/bias word of group q. */
template <int KPW>
__device__ __forceinline__ void q4v_dot(float &acc, const uint32_t (&wq)[KPW],
                                        const uint32_t (&sbw)[KPW / 2], const q4v_x<KPW> &X) {
    const uint32_t E = 0x43004300u;
    bool even = !(threadIdx.x & 1);
#pragma unroll
    for (int q = 0; q < KPW / 2; q++) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t w = wq[2 * q + h];
            mma_bf16(d, q4m_nib(w, E), q4m_nib(w >> 8, E), q4m_nib(w >> 4, E), q4m_nib(w >> 12, E),
                     X.b[2 * q + h][0], X.b[2 * q + h][1]);
        }
        float s = __uint_as_float(sbw[q] << 16), b = __uint_as_float(sbw[q] & 0xffff0000u);
        float base = even ? fmaf(fmaf(-128.0f, s, b), X.sx[q], acc) : acc;
        acc = fmaf(s, d[0] + d[3], base);
    }
}

/* The words of tiles (rb, kb0 .. kb0 + KPW - 1) as q4m_load, and row g's scale/bias words of
 * their KPW / 2 groups (g = lane / 4), for q4v_dot. */
template <int KPW>
__device__ __forceinline__ void q4v_load(uint32_t (&wq)[KPW], uint32_t (&sbw)[KPW / 2],
                                         const uint32_t *w, const uint32_t *sb, int rows, int K,
                                         int rb, int kb0) {
    int lane = threadIdx.x & 31;
    const uint32_t *wp = w + ((size_t)rb * (K >> 5) + kb0) * 32 + lane;
#pragma unroll
    for (int i = 0; i < KPW; i++) wq[i] = __ldcs(wp + (size_t)i * 32);
    const uint32_t *sp = sb + (size_t)(kb0 >> 1) * rows + rb * 8 + (lane >> 2);
#pragma unroll
    for (int q = 0; q < KPW / 2; q++) sbw[q] = __ldcs(sp + (size_t)q * rows);
}

/* q4v_dot over a landed q4m item (q4m_issue layout). */
template <int KPW>
__device__ __forceinline__ void q4v_item_dot(float &acc, const char *item, const q4v_x<KPW> &X) {
    int lane = threadIdx.x & 31;
    const uint32_t *ws = (const uint32_t *)item, *ss = (const uint32_t *)(item + KPW * 128);
    uint32_t wq[KPW], sbw[KPW / 2];
#pragma unroll
    for (int j = 0; j < KPW; j++) wq[j] = ws[j * 32 + lane];
#pragma unroll
    for (int q = 0; q < KPW / 2; q++) sbw[q] = ss[q * 8 + (lane >> 2)];
    q4v_dot<KPW>(acc, wq, sbw, X);
}

/* The q4v lane sums in q4m_dot's layout: (a0, a1) of lane (g, t) = token g's rows 2t, 2t + 1
 * (tokens 0 and 1; lanes g >= 2 get token 1's, their callers drop them). Whole warp. */
__device__ __forceinline__ void q4v_pairs(float acc, float &a0, float &a1) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    acc += __shfl_xor_sync(0xffffffffu, acc, 1); /* hi + lo: lanes (r, 2 tok), (r, 2 tok + 1) */
    int tok2 = 2 * min(g, 1);
    a0 = __shfl_sync(0xffffffffu, acc, 8 * t + tok2);
    a1 = __shfl_sync(0xffffffffu, acc, 8 * t + 4 + tok2);
}

/* cp.async.wait_group with a run-time count n (0 <= n < 8): the slice kernels' items. */
#define Q4S_UMAX 8 /* work items a warp at most in the slice kernels */
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
    switch (n) {
    case 0:
        cp_async_wait<0>();
        break;
    case 1:
        cp_async_wait<1>();
        break;
    case 2:
        cp_async_wait<2>();
        break;
    case 3:
        cp_async_wait<3>();
        break;
    case 4:
        cp_async_wait<4>();
        break;
    case 5:
        cp_async_wait<5>();
        break;
    case 6:
        cp_async_wait<6>();
        break;
    default:
        cp_async_wait<7>();
        break;
    }
}

/* Persistent q4m loop. The block's 8 warps form (8 / KS) row-block lanes q x KS K-slices ks
 * (warp = q * KS + ks; warps past RBB * KS idle); work "unit" u gives warp (q, ks) the tiles
 * kb = ks*KPW .. +KPW-1 of one row block (src(u, q, &w, &sb, &rows, &rb) says which, false if
 * none). The block runs units u, u + ustep, ... < n_units. Each warp streams its units' weights
 * (KPW*128 contiguous bytes) and scale/bias words (KPW/2 groups x 32 bytes) through its own ring
 * of Q4M_NS shared-memory stages with cp.async, Q4M_NS-1 units ahead: the bytes in flight per SM
 * no longer cost registers (the register double buffer reached ~1.7 TB/s on the LM head, bound by
 * memory parallelism; notes/2026-12-02-decode-q4m.md). The first units are issued before
 * prologue() runs (the PDL wait and the x staging go there, so those loads overlap the previous
 * kernel). After each unit the warps' (acc0, acc1) meet in s_part[warp][lane]; emit(u) reads them
 * between two barriers. Called by every thread of the block (barriers inside); ring = the
 * block's Q4M_NS * 8 * q4m_stage_bytes(KPW) bytes of shared memory (16-byte aligned).
 * V (nt = 1 or 2 tokens): the q4v dot; xrow / sxrow are then the staged rows of token 0 (xs,
 * q4m_sx), read once into registers after prologue(). Else q4m_dot on lane's rows xrow, sxrow. */
#define Q4M_NS 4
__host__ __device__ __forceinline__ int q4m_stage_bytes(int kpw) { return kpw * 128 + kpw * 16; }

template <int KPW, bool V, class Src, class Prologue, class Emit>
__device__ __forceinline__ void
q4m_persistent(int u, int ustep, int n_units, int K, int KS, Src src, Prologue prologue, Emit emit,
               const uint4 *xrow, const float *sxrow, float2 (*s_part)[32], char *ring, int nt) {
    constexpr int SB = KPW * 128 + KPW * 16;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, q = warp / KS, kb0 = (warp % KS) * KPW;
    char *my = ring + (size_t)warp * Q4M_NS * SB;
    unsigned live = 0; /* bit j: stage j holds a unit of this warp */
    auto issue = [&](int uu, int stage) {
        const uint32_t *W, *S;
        int rows, rb;
        live &= ~(1u << stage);
        if (uu < n_units && src(uu, q, &W, &S, &rows, &rb)) {
            live |= 1u << stage;
            q4m_issue<KPW>(my + stage * SB, W, S, rows, K, rb, kb0);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int j = 0; j < Q4M_NS - 1; j++) issue(u + j * ustep, j);
    prologue();
    q4v_x<KPW> X;
    if (V) q4v_load_x<KPW>(X, xrow, sxrow, K, nt, kb0);
    for (int i = 0; u < n_units; i++, u += ustep) {
        int stage = i % Q4M_NS;
        issue(u + (Q4M_NS - 1) * ustep, (i + Q4M_NS - 1) % Q4M_NS);
        cp_async_wait<Q4M_NS - 1>();
        __syncwarp();
        float a0 = 0.0f, a1 = 0.0f;
        if (V) {
            float acc = 0.0f;
            if (live & (1u << stage)) q4v_item_dot<KPW>(acc, my + stage * SB, X);
            q4v_pairs(acc, a0, a1);
        } else if (live & (1u << stage)) {
            q4m_item_dot<KPW>(a0, a1, my + stage * SB, xrow, sxrow, kb0);
        }
        s_part[warp][lane] = make_float2(a0, a1);
        __syncthreads(); /* also: every lane has read this stage before it is refilled */
        emit(u);
        __syncthreads();
    }
    cp_async_wait<0>();
}

/* Dot of bf16 rows r0..r0+R-1 (rows >= n_rows skipped) with NT inputs over the columns
 * c = (slice*32 + lane)*8 + j*256*n_slices (16 bytes per row per lane per step); n_slices = 1
 * covers all columns in one warp. ss[t] accumulates raw x^2 over the same columns. Returns
 * per-lane partial sums (reduce with warp_sum or across warps). pre: the first step's weights,
 * loaded earlier by bf16_rows_first (same values, so the same sums), or NULL. */
/* Loads the weights of bf16_rows_dot's first step (rows r0.., column chunk (slice*32 + lane)*8)
 * into pre: a caller issues them before its PDL wait and passes pre to bf16_rows_dot. */
template <int R>
__device__ __forceinline__ void bf16_rows_first(uint4 (&pre)[R], const uint16_t *w, int K, int r0,
                                                int n_rows, int slice) {
    int c = (slice * 32 + (threadIdx.x & 31)) * 8;
#pragma unroll
    for (int r = 0; r < R; r++)
        pre[r] = c < K && r0 + r < n_rows ? __ldg((const uint4 *)(w + (size_t)(r0 + r) * K + c))
                                          : make_uint4(0, 0, 0, 0);
}

template <int NT, int R>
__device__ __forceinline__ void bf16_rows_dot(float (&acc)[R][NT], float (&ss)[NT],
                                              const uint16_t *w, int K, int r0, int n_rows,
                                              const float *const (&x)[NT], const float *xw, int nt,
                                              int slice, int n_slices, const uint4 *pre = NULL) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        ss[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][t] = 0.0f;
    }
    for (int c = (slice * 32 + lane) * 8; c < K; c += 256 * n_slices) {
        uint4 q[R];
        bool first = pre && c == (slice * 32 + lane) * 8;
#pragma unroll
        for (int r = 0; r < R; r++)
            q[r] = first             ? pre[r]
                   : r0 + r < n_rows ? __ldg((const uint4 *)(w + (size_t)(r0 + r) * K + c))
                                     : make_uint4(0, 0, 0, 0);
        float4 wa = make_float4(1, 1, 1, 1), wb = wa;
        if (xw) wa = __ldg((const float4 *)(xw + c)), wb = __ldg((const float4 *)(xw + c + 4));
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            float4 a = __ldg((const float4 *)(x[t] + c)), b = __ldg((const float4 *)(x[t] + c + 4));
            float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            float xm[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                ss[t] = fmaf(xv[i], xv[i], ss[t]);
                xv[i] *= xm[i];
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                uint32_t u[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    acc[r][t] = fmaf(__uint_as_float(u[i] << 16), xv[2 * i], acc[r][t]);
                    acc[r][t] = fmaf(__uint_as_float(u[i] & 0xffff0000u), xv[2 * i + 1], acc[r][t]);
                }
            }
        }
    }
}

#endif
