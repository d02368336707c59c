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

/* What the q4 GEMV kernels write: the rows' destination and the fused input norm / residual /
 * conv epilogue (gemv_emit). */
typedef struct gemv_out {
    float *y;
    const float *nw; /* RMSNorm weight of the input (then s_ss holds the sums of x^2), or NULL */
    float eps;
    int ldy, n_rb, K, KS, t0, nt, accumulate;
    gemv_conv_epi conv;
} gemv_out;

/* The outputs of lane ln of row block rb: token t0 + ln / 4, rows 8 rb + 2 (ln % 4), +1, from the
 * KS K-slices' partial sums part[0], part[pstride], ... (float2 (row, row + 1), added in slice
 * order: deterministic); s_ss[w * 8 + g]: the sums of x^2 of token g by chunk class (q4m_stage). */
__device__ __forceinline__ void gemv_emit(const gemv_out &o, const float *s_ss, int rb, int ln,
                                          const float2 *part, int pstride) {
    int g = ln >> 2, t = ln & 3;
    if (rb >= o.n_rb || g >= o.nt) return;
    float a0 = 0.0f, a1 = 0.0f;
    for (int i = 0; i < o.KS; i++) {
        float2 p = part[(size_t)i * pstride];
        a0 += p.x, a1 += p.y;
    }
    float inv = 1.0f;
    if (o.nw) {
        float sq = 0.0f;
        for (int i = 0; i < 8; i++) sq += s_ss[i * 8 + g];
        inv = rsqrtf(sq / (float)o.K + o.eps);
    }
    int r = rb * 8 + 2 * t, tok = o.t0 + g;
    float v0 = a0 * inv, v1 = a1 * inv;
    const gemv_conv_epi &cv = o.conv;
    if (cv.out && r < cv.C) { /* rows 8rb.. lie wholly inside or outside (C % 8 == 0) */
        float *st = cv.state + (size_t)cv.tok_slot[tok] * 3 * cv.C + r;
        float4 w0 = *(const float4 *)(cv.w + (size_t)r * 4),
               w1 = *(const float4 *)(cv.w + (size_t)r * 4 + 4);
        float2 p0 = *(float2 *)st, p1 = *(float2 *)(st + cv.C), p2 = *(float2 *)(st + 2 * cv.C);
        *(float2 *)(cv.out + (size_t)tok * cv.C + r) =
            make_float2(conv4_silu(w0, p0.x, p1.x, p2.x, v0), conv4_silu(w1, p0.y, p1.y, p2.y, v1));
        *(float2 *)st = p1, *(float2 *)(st + cv.C) = p2,
                 *(float2 *)(st + 2 * cv.C) = make_float2(v0, v1);
        return;
    }
    float *y = o.y + (size_t)tok * o.ldy + r;
    if (o.accumulate) v0 += y[0], v1 += y[1];
    y[0] = v0, y[1] = v1;
}

/* The kernels' common start after the PDL wait: x rows t0 .. t0 + nt - 1 staged (q4m_stage), the
 * sums of x^2 in s_ss when the input is normed. Every thread of the block; ends with a barrier. */
__device__ __forceinline__ void gemv_stage_x(uint4 *xs, float *sx, float *s_ss, const float *x,
                                             int ldx, const gemv_out &o) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane < 8) s_ss[warp * 8 + lane] = 0.0f;
    __syncwarp();
    q4m_stage(xs, sx, x + (size_t)o.t0 * ldx, ldx, o.nw, o.K, o.nt, threadIdx.x, 256,
              o.nw ? s_ss : NULL);
    __syncthreads();
}

template <int KPW, bool V>
__global__ void __launch_bounds__(256, 2)
    gemv_q4m_kernel(gemv_out o, tl_gpu_gemm_w W, const float *x, int ldx, int n_rows) {
    extern __shared__ uint4 xs[];
    __shared__ float s_ss[8 * 8];
    __shared__ float2 s_part[8][32];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = W.cols, KB = K >> 5, KS = o.KS;
    int RBB = 8 / KS, n_rb = o.n_rb, n_units = CEIL_DIV(n_rb, RBB);
    o.t0 = blockIdx.y * 8, o.nt = min(8, o.nt - o.t0); /* o.nt: all tokens on entry */
    float *sx = q4m_sx(xs, K, n_rows);
    const uint32_t *w = (const uint32_t *)W.w, *sbp = (const uint32_t *)W.sb;
    auto src = [&](int u, int q, const uint32_t **pw, const uint32_t **ps, int *rows, int *rb) {
        *pw = w, *ps = sbp, *rows = W.rows, *rb = u * RBB + q;
        return q < RBB && *rb < n_rb;
    };
    auto prologue = [&]() {
        pdl_trigger();
        pdl_wait();
        gemv_stage_x(xs, sx, s_ss, x, ldx, o);
    };
    auto emit = [&](int u) { /* warps 0 .. RBB-1 write row block u*RBB + warp */
                             if (warp < RBB)
                                 gemv_emit(o, s_ss, u * RBB + warp, lane, &s_part[warp * KS][lane],
                                           32);
    };
    int gx = V ? 0 : min(lane >> 2, o.nt - 1); /* V: the kernel reads both tokens itself */
    q4m_persistent<KPW, V>(blockIdx.x, gridDim.x, n_units, K, KS, src, prologue, emit,
                           xs + gx * q4m_lds(K), sx + gx * (KB >> 1), s_part,
                           (char *)xs + q4m_smem(K, n_rows), o.nt);
}

/* gemv_q4s_kernel ("slice"): gemv_q4m_kernel's products and sums for one tile of <= 8 tokens,
 * scheduled for the decode chain instead of for long matrices: block b owns the units
 * [b * upb, b * upb + upb) (unit = RBB row blocks x KS K-slices, warp q * KS + ks, exactly as in
 * q4m), and before the PDL wait every warp issues cp.async for all of its work items (weights and
 * scale/bias words, one commit group each) into the block's shared memory: the whole slice is in
 * flight while the previous kernel finishes. After the wait and the x staging each warp runs
 * q4m_dot on its items as they land (no block barrier between items), leaves each item's partial
 * sums in the item's first 256 bytes, and one barrier later the block emits every row block it
 * owns at once (the epilogue's global reads paid once, not once per unit). One block per SM and
 * at most half the SM's registers, so the next kernel's blocks can be resident and prefetch too.
 * Same KPW / KS split, same q4m_dot calls and the same slice order as gemv_q4m_kernel: the same
 * bits (test_kernels.c: test_gemv_q4_slice). */
template <int KPW>
__global__ void __launch_bounds__(256, 2)
    gemv_q4s_kernel(gemv_out o, tl_gpu_gemm_w W, const float *x, int ldx, int n_rows, int upb) {
    constexpr int SB = KPW * 128 + KPW * 16;
    extern __shared__ uint4 xs[];
    __shared__ float s_ss[8 * 8];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = W.cols, KB = K >> 5, KS = o.KS;
    int RBB = 8 / KS, q = warp / KS, kb0 = (warp % KS) * KPW;
    int u0 = blockIdx.x * upb, nu = max(0, min(upb, CEIL_DIV(o.n_rb, RBB) - u0));
    o.t0 = 0;
    char *items = (char *)xs + q4m_smem(K, n_rows); /* [upb][8 warps][SB] */
    const uint32_t *w = (const uint32_t *)W.w, *sbp = (const uint32_t *)W.sb;
    for (int i = 0; i < upb; i++) { /* weights only: no PDL wait needed */
        int rb = (u0 + i) * RBB + q;
        if (i < nu && q < RBB && rb < o.n_rb)
            q4m_issue<KPW>(items + (size_t)(i * 8 + warp) * SB, w, sbp, W.rows, K, rb, kb0);
        cp_async_commit();
    }
    pdl_trigger();
    pdl_wait();
    float *sx = q4m_sx(xs, K, n_rows);
    gemv_stage_x(xs, sx, s_ss, x, ldx, o);
    int g = lane >> 2, gx = min(g, o.nt - 1);
    const uint4 *xrow = xs + gx * q4m_lds(K);
    const float *sxrow = sx + gx * (KB >> 1);
    for (int i = 0; i < upb; i++) {
        cp_async_wait_dyn(upb - 1 - i);
        __syncwarp();
        int rb = (u0 + i) * RBB + q;
        float a0 = 0.0f, a1 = 0.0f;
        char *it = items + (size_t)(i * 8 + warp) * SB;
        if (i < nu && q < RBB && rb < o.n_rb) q4m_item_dot<KPW>(a0, a1, it, xrow, sxrow, kb0);
        __syncwarp(); /* every lane has read the item before its first bytes take the sums */
        ((float2 *)it)[lane] = make_float2(a0, a1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nu * RBB * 32; e += 256) {
        int i = e / (RBB * 32), qq = (e >> 5) - i * RBB, ln = e & 31;
        const float2 *part = (const float2 *)(items + (size_t)(i * 8 + qq * KS) * SB) + ln;
        gemv_emit(o, s_ss, (u0 + i) * RBB + qq, ln, part, SB / 8);
    }
}

/* gemv_q4r_kernel ("rows"): for matrices too large for the slice kernel (the LM head), one tile
 * of <= 8 tokens. Each warp owns whole row blocks (all of K): rb = blockIdx.x * 8 + warp, then
 * += gridDim.x * 8, and streams their tiles in chunks of KPW (= q4m's K-slices) through its own
 * ring of Q4M_NS shared-memory stages, Q4M_NS - 1 chunks ahead (the first ones before the PDL
 * wait). After the x staging no block barrier: a warp writes its rows as soon as their last chunk
 * is in, so one slow warp no longer holds the other seven (gemv_q4m_kernel meets its KS K-slices
 * at a barrier every unit). Each chunk's dot starts from zero and the chunks are added in order,
 * exactly as q4m adds its K-slices: the same bits (tests/gpu/test_kernels.c: test_slice_kernels).
 */
template <int KPW>
__global__ void __launch_bounds__(256, 2)
    gemv_q4r_kernel(gemv_out o, tl_gpu_gemm_w W, const float *x, int ldx, int n_rows) {
    constexpr int SB = KPW * 128 + KPW * 16;
    extern __shared__ uint4 xs[];
    __shared__ float s_ss[8 * 8];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = W.cols, KB = K >> 5;
    int nch = KB / KPW, rb0 = blockIdx.x * 8 + warp, rstep = gridDim.x * 8;
    int n_items = (rb0 < o.n_rb ? CEIL_DIV(o.n_rb - rb0, rstep) : 0) * nch;
    o.t0 = 0;
    char *my = (char *)xs + q4m_smem(K, n_rows) + (size_t)warp * Q4M_NS * SB;
    const uint32_t *w = (const uint32_t *)W.w, *sbp = (const uint32_t *)W.sb;
    /* item it: chunk it % nch of the warp's row block it / nch */
    auto issue = [&](int it) {
        if (it < n_items) {
            int r = it / nch;
            q4m_issue<KPW>(my + (it % Q4M_NS) * SB, w, sbp, W.rows, K, rb0 + r * rstep,
                           (it - r * nch) * KPW);
        }
        cp_async_commit();
    };
    for (int j = 0; j < Q4M_NS - 1; j++) issue(j); /* weights only: no PDL wait needed */
    pdl_trigger();
    pdl_wait();
    float *sx = q4m_sx(xs, K, n_rows);
    gemv_stage_x(xs, sx, s_ss, x, ldx, o);
    int gx = min(lane >> 2, o.nt - 1);
    const uint4 *xrow = xs + gx * q4m_lds(K);
    const float *sxrow = sx + gx * (KB >> 1);
    o.KS = 1;
    float s0 = 0.0f, s1 = 0.0f; /* the row block's K-slices so far, added in order */
    for (int it = 0; it < n_items; it++) {
        issue(it + Q4M_NS - 1); /* into the stage item it - 1 used */
        cp_async_wait<Q4M_NS - 1>();
        __syncwarp();
        int r = it / nch, ch = it - r * nch;
        float a0 = 0.0f, a1 = 0.0f;
        q4m_item_dot<KPW>(a0, a1, my + (it % Q4M_NS) * SB, xrow, sxrow, ch * KPW);
        s0 += a0, s1 += a1;
        __syncwarp(); /* every lane has read the stage before the next issue refills it */
        if (ch == nch - 1) {
            float2 p = make_float2(s0, s1);
            gemv_emit(o, s_ss, rb0 + r * rstep, lane, &p, 0);
            s0 = 0.0f, s1 = 0.0f;
        }
    }
    cp_async_wait<0>();
}

/* gemv_bf16_splitk_kernel: the same contract for bf16 W [rows, K] (K % 256 == 0, any rows);
 * with W.sb non-NULL, W.sb is a second bf16 plane (the low bits of non-bf16 weights) and
 * W = W.w + W.sb.
 * Threads: 256 = 8 warps on the same R rows; warp w takes the 16-byte column chunks
 *   (w*32 + lane)*8 + j*2048 of each row (split-K), partial sums meet in shared memory and are
 *   added in warp order (deterministic). grid.x = ceil(rows/R): R = 8, or R = 2 for matrices of
 *   at most 1024 rows (the 257-row router: 129 blocks instead of 33, which left most SMs idle).
 * The weights of each warp's first column chunk are loaded before the PDL wait (for the 2048-wide
 * router that is all of them: its 2 MB stream while the previous kernel finishes).
 * Bytes: rows*K*2 per token tile. Tested against cpu_matvec (test_gemv_bf16). */
template <int NT, int R>
__global__ void __launch_bounds__(256)
    gemv_bf16_splitk_kernel(float *y, int ldy, tl_gpu_gemm_w W, const float *x, int ldx,
                            const float *nw, float eps, int n_tok, int accumulate) {
    __shared__ float s_part[8][R * NT + NT];
    int t0 = blockIdx.y * NT, nt = min(NT, n_tok - t0);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r0 = blockIdx.x * R;
    uint4 pre[R], pre2[R]; /* the first step's weights of both planes, before the PDL wait */
    bf16_rows_first<R>(pre, (const uint16_t *)W.w, W.cols, r0, W.rows, warp);
    if (W.sb) bf16_rows_first<R>(pre2, (const uint16_t *)W.sb, W.cols, r0, W.rows, warp);
    pdl_trigger();
    pdl_wait();
    const float *xp[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) xp[t] = x + (size_t)(t0 + min(t, nt - 1)) * ldx;
    float acc[R][NT], ss[NT];
    bf16_rows_dot<NT>(acc, ss, (const uint16_t *)W.w, W.cols, r0, W.rows, xp, nw, nt, warp, 8, pre);
    if (W.sb) { /* the low bf16 plane of non-bf16 weights (8-bit router): y = hi x + lo x */
        float acc2[R][NT], ss2[NT];
        bf16_rows_dot<NT>(acc2, ss2, (const uint16_t *)W.sb, W.cols, r0, W.rows, xp, nw, nt, warp,
                          8, pre2);
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
/* Raises the q4m / q4s kernels' dynamic shared memory limit (tl_gpu_init). */
int cb_gemv_setup(void) {
#define GEMV_SHM_ATTR(kern)                                                                        \
    CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMV_MAX_SHM))
    GEMV_SHM_ATTR((gemv_q4m_kernel<8, false>));
    GEMV_SHM_ATTR((gemv_q4m_kernel<16, false>));
    GEMV_SHM_ATTR((gemv_q4m_kernel<32, false>));
    GEMV_SHM_ATTR((gemv_q4m_kernel<8, true>));
    GEMV_SHM_ATTR((gemv_q4m_kernel<16, true>));
    GEMV_SHM_ATTR(gemv_q4s_kernel<8>);
    GEMV_SHM_ATTR(gemv_q4s_kernel<16>);
    GEMV_SHM_ATTR(gemv_q4s_kernel<32>);
    GEMV_SHM_ATTR(gemv_q4r_kernel<8>);
    GEMV_SHM_ATTR(gemv_q4r_kernel<16>);
    GEMV_SHM_ATTR(gemv_q4r_kernel<32>);
#undef GEMV_SHM_ATTR
    return 0;
}

/* Blocks a SM of the slice kernel (TL_GEMV_SLICE: 1 or 2; default 0 = off, gemv_q4m only: the
 * slice kernels measured slower on the H200, BENCHMARKS.md session 8), or what a test set with
 * tl_gpu_gemv_set_slice. */
static cb_level gemv_slice = {"TL_GEMV_SLICE", 0, 2, -1};
extern "C" int tl_gpu_gemv_set_slice(int per_sm) { return cb_level_set(&gemv_slice, per_sm); }

/* Where the q4v dot runs (k_q4m.cuh cb_q4v_on): TL_Q4V=0|1|2 or tl_gpu_q4v_set; default 1. */
static cb_level q4v = {"TL_Q4V", 1, 2, -1};
int cb_q4v_on(void) { return cb_level_get(&q4v); }
extern "C" int tl_gpu_q4v_set(int level) { return cb_level_set(&q4v, level); }

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

/* The rows kernel for one tile of <= 8 tokens (TL_GEMV_ROWS=1 or tl_gpu_gemv_set_rows(1): on;
 * off by default, measured slower on the H200).
 * 1 if launched, 0 if not, < 0 on a launch error. */
static cb_level gemv_rows = {"TL_GEMV_ROWS", 0, 1, -1};
extern "C" int tl_gpu_gemv_set_rows(int on) { return cb_level_set(&gemv_rows, on); }
static int launch_q4r(const gemv_out &o, const tl_gpu_gemm_w *W, const float *x, int ldx, int kpw,
                      int n_rows, const tl_gpu_stream *st) {
    if (!cb_level_get(&gemv_rows) || o.nt > 8) return 0;
    size_t shm = q4m_smem(W->cols, n_rows) + (size_t)8 * Q4M_NS * q4m_stage_bytes(kpw);
    if (shm > GEMV_MAX_SHM) return 0;
    auto kern = kpw == 32   ? gemv_q4r_kernel<32>
                : kpw == 16 ? gemv_q4r_kernel<16>
                            : gemv_q4r_kernel<8>;
    TL_LAUNCH(st, o.conv.out ? "gemv_q4r_conv1d" : "gemv_q4r", kern,
              dim3(TL_MIN(cb_grid_cap(), CEIL_DIV(o.n_rb, 8))), dim3(256), shm, o, *W, x, ldx,
              n_rows);
    return 1;
}

/* The slice kernel when it applies (one tile of <= 8 tokens, at most Q4S_UMAX units a block in
 * shared memory): 1 if launched, 0 if not, < 0 on a launch error. */
static int launch_q4s(const gemv_out &o, const tl_gpu_gemm_w *W, const float *x, int ldx, int kpw,
                      int n_rows, const tl_gpu_stream *st) {
    int per_sm = cb_level_get(&gemv_slice);
    if (!per_sm || o.nt > 8) return 0;
    int n_units = CEIL_DIV(o.n_rb, 8 / o.KS);
    int upb = CEIL_DIV(n_units, cb_grid_cap() / 2 * per_sm);
    size_t shm = q4m_smem(W->cols, n_rows) + (size_t)upb * 8 * q4m_stage_bytes(kpw);
    if (upb > Q4S_UMAX || shm > GEMV_MAX_SHM) return 0;
    auto kern = kpw == 32   ? gemv_q4s_kernel<32>
                : kpw == 16 ? gemv_q4s_kernel<16>
                            : gemv_q4s_kernel<8>;
    TL_LAUNCH(st, o.conv.out ? "gemv_q4s_conv1d" : "gemv_q4s", kern, dim3(CEIL_DIV(n_units, upb)),
              dim3(256), shm, o, *W, x, ldx, n_rows, upb);
    return 1;
}

static int launch_gemv(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                       const float *nw, float eps, int n_tok, int acc, gemv_conv_epi conv,
                       const tl_gpu_stream *st) {
    if (W->bits == 4) {
        int kpw, ks, n_rows = n_tok < 8 ? n_tok : 8;
        if (q4m_split(W->cols, 8, &kpw, &ks)) return TL_ERR_INVALID;
        gemv_out o = {y, nw, eps, ldy, W->rows / 8, W->cols, ks, 0, n_tok, acc, conv};
        int rc = launch_q4s(o, W, x, ldx, kpw, n_rows, st);
        if (!rc) rc = launch_q4r(o, W, x, ldx, kpw, n_rows, st);
        if (rc) return rc < 0 ? rc : 0;
        size_t shm = q4m_smem(W->cols, n_rows) + (size_t)8 * Q4M_NS * q4m_stage_bytes(kpw);
        if (shm > GEMV_MAX_SHM) return TL_ERR_INVALID;
        int n_units = CEIL_DIV(W->rows / 8, 8 / ks), n_tt = CEIL_DIV(n_tok, 8);
        dim3 grid(TL_MAX(1, TL_MIN(n_units, cb_grid_cap() / n_tt)), n_tt);
        bool v = n_tok <= 2 && kpw <= 16 && cb_q4v_on();
        auto kern = kpw == 32 ? gemv_q4m_kernel<32, false>
                    : v       ? (kpw == 16 ? gemv_q4m_kernel<16, true> : gemv_q4m_kernel<8, true>)
                        : (kpw == 16 ? gemv_q4m_kernel<16, false> : gemv_q4m_kernel<8, false>);
        TL_LAUNCH(st, conv.out ? "gemv_q4_conv1d" : "gemv_q4", kern, grid, dim3(256), shm, o, *W, x,
                  ldx, n_rows);
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
