/* Mixture of experts for decode: router top-k, then the selected experts' gate/up and down
 * GEMVs reading only the chosen experts (expert-major weights), with the shared expert handled
 * as expert n_expert of the same stack, and the weighted combine + residual add fused into the
 * down projection (fixed summation order: deterministic). */
#include "cuda/k_q4m.cuh"
#include "cuda/k_gemm.cuh"
#include "cuda/k_rms.cuh"

extern "C" {
#include "common/util.h"
}

#define MAX_K     16
#define ROUTE_PER 8 /* experts per lane: n_expert <= 256 */

/* moe_route_kernel  (docs/model.md §2.5 steps 1-2)
 *   p = softmax(logits[0..n_expert)) in fp32; ids = top-k of p (ties: lower id);
 *   w = p[ids] / sum p[ids];  w_sh = sigmoid(logits[n_expert])
 * Shapes: logits [n_tok, ld]; ids, w [n_tok, k]; w_sh [n_tok]; sh_logit [n_tok] (raw, optional).
 * Threads: one warp per token; lane holds experts lane, lane+32, ... (n_expert <= 256).
 * Bytes: negligible. Tested against cpu_moe_route (test_kernels.c: test_moe_route). */
/* One warp routes token row lg: returns (in lanes j < k) expert id j and its renormalised weight.
 * A row with a NaN or +inf logit (a poisoned input or weight), or only -inf ones, has no softmax:
 * it gets ids 0..k-1, always in range, and NaN weights, so the token's output is NaN and the
 * sampler reports its row (token -1) instead of reading experts out of range. A -inf logit among
 * finite ones is a probability of 0, as in the reference softmax. */
__device__ __forceinline__ void route_warp(int *my_id, float *my_wn, const float *lg, int n_expert,
                                           int k) {
    int lane = threadIdx.x & 31;
    float p[ROUTE_PER]; /* expert lane + 32 i, in registers (fully unrolled loops) */
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < ROUTE_PER; i++) {
        int e = lane + 32 * i;
        p[i] = e < n_expert ? __ldcg(lg + e) : -INFINITY; /* L2: see moe_down_kernel */
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTE_PER; i++) {
        bool valid = lane + 32 * i < n_expert;
        p[i] = valid ? expf(p[i] - mx) : -1.0f;
        sum += valid ? p[i] : 0.0f; /* NaN from a NaN logit, or from +inf (inf - inf) */
    }
    sum = warp_sum(sum);
    if (!isfinite(sum)) { /* no softmax: in-range ids, NaN weights (a warp-uniform branch) */
        *my_id = lane < k ? lane : 0, *my_wn = __int_as_float(0x7fc00000);
        return;
    }
    float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < ROUTE_PER; i++)
        if (p[i] >= 0.0f) p[i] *= inv;
    /* top-k by key = bits(p) + 1 (p >= 0, so the order of the keys is the order of p; 0 =
     * padding or taken): each round the warp's largest key (one redux), then the lowest expert
     * id holding it (another), so ties go to the lower id as in the reference */
    uint32_t key[ROUTE_PER];
#pragma unroll
    for (int i = 0; i < ROUTE_PER; i++) key[i] = p[i] >= 0.0f ? __float_as_uint(p[i]) + 1u : 0u;
    float wsum = 0.0f, my_w = 0.0f;
    int id = 0;
    for (int j = 0; j < k; j++) {
        /* this lane's best, the lowest i among equals: a tree whose left side has the lower i */
        uint32_t tk[ROUTE_PER], ti[ROUTE_PER];
#pragma unroll
        for (int i = 0; i < ROUTE_PER; i++) tk[i] = key[i], ti[i] = i;
#pragma unroll
        for (int w = 1; w < ROUTE_PER; w <<= 1)
#pragma unroll
            for (int i = 0; i + w < ROUTE_PER; i += 2 * w)
                if (tk[i + w] > tk[i]) tk[i] = tk[i + w], ti[i] = ti[i + w];
        uint32_t bk = tk[0], bi = ti[0];
        uint32_t m = __reduce_max_sync(0xffffffffu, bk);
        uint32_t wid = __reduce_min_sync(0xffffffffu, bk == m ? (uint32_t)lane + 32u * bi : ~0u);
        float best = __uint_as_float(m - 1u);
        wsum += best;
        if (lane == j) my_w = best, id = (int)wid;
#pragma unroll
        for (int i = 0; i < ROUTE_PER; i++)
            if ((uint32_t)lane + 32u * i == wid) key[i] = 0u; /* taken */
    }
    *my_id = id, *my_wn = my_w / wsum;
}

__global__ void moe_route_kernel(int32_t *ids, float *w, float *w_sh, float *sh_logit,
                                 const float *logits, int ld, int n_expert, int k, int n_tok) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= n_tok) return;
    const float *lg = logits + (size_t)t * ld;
    int id;
    float wn;
    route_warp(&id, &wn, lg, n_expert, k);
    if (lane < k) {
        ids[(size_t)t * k + lane] = id;
        w[(size_t)t * k + lane] = wn;
    }
    if (lane == 0) {
        w_sh[t] = sigmoid_f(lg[n_expert]);
        if (sh_logit) sh_logit[t] = lg[n_expert];
    }
}

extern "C" int tl_gpu_moe_route(int32_t *ids, float *w, float *w_sh, float *sh_logit,
                                const float *logits, int ld, int n_expert, int k, int n_tok,
                                const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    if (k > MAX_K || k > 32 || n_expert > 32 * ROUTE_PER) return TL_ERR_INVALID;
    TL_LAUNCH(st, "moe_route", moe_route_kernel, dim3(CEIL_DIV(n_tok, 4)), dim3(128), 0, ids, w,
              w_sh, sh_logit, logits, ld, n_expert, k, n_tok);
    return 0;
}

/* Pointer to expert e's slice of a stacked expert matrix (rows_e rows each). */
__device__ __forceinline__ void expert_slice(const tl_gpu_gemm_w &W, int e, int rows_e,
                                             const void **w, const uint32_t **sb) {
    size_t K = (size_t)W.cols;
    if (W.bits == 4) {
        *w = (const uint32_t *)W.w + (size_t)e * rows_e * K / 8;
        *sb = (const uint32_t *)W.sb + (size_t)e * rows_e * (K / 64);
    } else {
        *w = (const uint16_t *)W.w + (size_t)e * rows_e * K;
        *sb = NULL;
    }
}

/* Warp 0 of a moe_up block routes token t (moe_route_kernel's math): s_e[0..k) = its experts,
 * s_e[k] = the shared expert; block 0 publishes ids, weights and the shared gate for moe_down. */
__device__ __forceinline__ void route_block(int *s_e, int32_t *ids, float *wts, float *w_sh,
                                            const float *logits, int ld, int n_expert, int k,
                                            int t) {
    int lane = threadIdx.x & 31, id;
    float wn;
    const float *lg = logits + (size_t)t * ld;
    route_warp(&id, &wn, lg, n_expert, k);
    if (lane < k) s_e[lane] = id;
    if (lane == 0) s_e[k] = n_expert;
    if (blockIdx.x == 0) {
        if (lane < k) ids[(size_t)t * k + lane] = id, wts[(size_t)t * k + lane] = wn;
        if (lane == 0) w_sh[t] = sigmoid_f(lg[n_expert]);
    }
}

/* silu(gate) * up of one output whose input is normed after the products: gv, uv the raw dots of
 * staged token row g, s_ss[w * 8 + g] the sums of its h^2 by chunk class (q4m_stage; added in
 * order of w). */
__device__ __forceinline__ float moe_swiglu_normed(float gv, float uv, const float *s_ss, int g,
                                                   int K, float eps) {
    float sq = 0.0f;
    for (int i = 0; i < 8; i++) sq += s_ss[i * 8 + g];
    float inv = rsqrtf(sq / (float)K + eps);
    return silu_f(gv * inv) * (uv * inv);
}

/* moe_up's output f of the gate/up row-block pair (rbg, rbg + 1) of slot j, token t: the K-slices'
 * partial sums of the gate rows at g[0], g[pstride], ... and of the up rows at u[...] (float2 of
 * rows 2t', 2t' + 1: r & 1 picks), added in slice order; s_ss: the staging warps' sums of h^2. */
__device__ __forceinline__ void moe_up_emit(float *act, const float2 *gp, const float2 *up,
                                            int pstride, int KS, const float *s_ss, int K,
                                            float eps, int t, int j, int k, int F, int rbg, int r) {
    float gv = 0.0f, uv = 0.0f;
    for (int i = 0; i < KS; i++) {
        float2 a = gp[(size_t)i * pstride], b = up[(size_t)i * pstride];
        gv += (r & 1) ? a.y : a.x;
        uv += (r & 1) ? b.y : b.x;
    }
    act[((size_t)t * (k + 1) + j) * F + 4 * rbg + r] = moe_swiglu_normed(gv, uv, s_ss, 0, K, eps);
}

/* moe_up_kernel  (docs/model.md §2.5 steps 3 and 5, first half)
 *   x = rmsnorm(h[t]; norm_w);  act[t, j, f] = silu(gate_e[f] . x) * (up_e[f] . x)
 *   for j < k: e = ids[t, j]; j == k: e = n_expert (shared expert)
 * Shapes: gate_up stacked [(n_expert+1) * 2F, n_embd], per expert rows interleaved by 8
 *   (16i..16i+7 = gate rows 8i.., 16i+8..16i+15 = up rows 8i..); h [n_tok, n_embd];
 *   act [n_tok, k+1, F].
 * Threads: q4: persistent blocks of 8 warps per token (blockIdx.y) running the q4m loop of
 *   cuda_common.cuh over units (slot j, gate/up row-block pair): 8 / KS row blocks x KS warps
 *   along K; the block stages the normalised input once (times norm_w, summing h^2); the gate
 *   row block 2i and the up row block 2i+1 meet in shared memory. bf16: block of 8 warps per
 *   (32 outputs, slot, token); warp pair (2p, 2p+1) reads the gate and the up row block of
 *   outputs 8p.. (the whole n_embd each).
 * Bytes: (k+1) * 2F * n_embd weights per token (bf16 2 B, q4 0.5625 B per weight).
 * Tested against cpu_ffn_swiglu + cpu_moe_route (test_kernels.c: test_moe). */
template <int KPW, bool V>
__global__ void __launch_bounds__(256, 2)
    moe_up_q4m_kernel(float *act, tl_gpu_gemm_w W, const float *h, const float *norm_w, float eps,
                      int32_t *ids, int k, int n_expert, int F, int KS, const float *logits, int ld,
                      float *wts, float *w_sh) {
    extern __shared__ uint4 xs[];
    __shared__ float s_ss[8 * 8];
    __shared__ float2 s_part[8][32];
    __shared__ int s_e[MAX_K + 1];
    int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int K = W.cols, RBB = 8 / KS, n_rb = 2 * F / 8, upj = CEIL_DIV(n_rb, RBB);
    int n_units = (k + 1) * upj;
    float *sx = q4m_sx(xs, K, 1);
    pdl_wait();
    pdl_trigger(); /* after the wait: the next kernel may read the logits early (moe_down) */
    if (logits) {
        if (warp == 0) route_block(s_e, ids, wts, w_sh, logits, ld, n_expert, k, t);
    } else if (threadIdx.x <= k) {
        s_e[threadIdx.x] = threadIdx.x < k ? ids[(size_t)t * k + threadIdx.x] : n_expert;
    }
    if (lane < 8) s_ss[warp * 8 + lane] = 0.0f;
    __syncthreads();
    const uint32_t *w0 = (const uint32_t *)W.w, *sb0 = (const uint32_t *)W.sb;
    size_t ew = (size_t)2 * F * K / 8, es = (size_t)2 * F * (K / 64);
    auto src = [&](int u, int q, const uint32_t **pw, const uint32_t **ps, int *rows, int *rb) {
        int j = u / upj, e = s_e[j];
        *pw = w0 + e * ew, *ps = sb0 + e * es, *rows = 2 * F, *rb = (u - j * upj) * RBB + q;
        return q < RBB && *rb < n_rb;
    };
    auto prologue = [&]() {
        q4m_stage(xs, sx, h + (size_t)t * K, K, norm_w, K, 1, threadIdx.x, 256, s_ss);
        __syncthreads();
    };
    /* thread (p, r): output 8 * (rb_gate / 2) + r of row-block pair p; lane r/2 of each warp of
     * the pair holds rows r & ~1, r | 1 */
    auto emit = [&](int u) {
        int p = threadIdx.x >> 3, r = threadIdx.x & 7, j = u / upj;
        int rbg = (u - j * upj) * RBB + 2 * p;
        if (p >= RBB / 2 || rbg >= n_rb) return;
        moe_up_emit(act, &s_part[(2 * p) * KS][r >> 1], &s_part[(2 * p + 1) * KS][r >> 1], 32, KS,
                    s_ss, K, eps, t, j, k, F, rbg, r);
    };
    q4m_persistent<KPW, V>(blockIdx.x, gridDim.x, n_units, K, KS, src, prologue, emit, xs, sx,
                           s_part, (char *)xs + q4m_smem(K, 1), 1);
}

/* moe_up_q4s_kernel: moe_up_q4m_kernel with routing for one token (the batch-1 decode step),
 * scheduled as gemv_q4s_kernel (k_gemv.cu): block b owns the units [b * upb, b * upb + upb) of
 * the (k + 1) * upj units (slot-major: the shared expert's, slot k, last); before the PDL wait
 * its warps issue the items of the shared expert (known without the routing), after it warp 0
 * routes, the routed items are issued, each warp runs its items as they land (the shared expert's
 * first) and keeps their partial sums in the items' first 256 bytes; one barrier, then the block
 * writes all its outputs. One block per SM with at most half its registers, so moe_down's blocks
 * can be resident meanwhile and prefetch their experts. Same products, sums and order as
 * moe_up_q4m_kernel: the same bits (test_kernels.c: test_slice_kernels). */
template <int KPW>
__global__ void __launch_bounds__(256, 3)
    moe_up_q4s_kernel(float *act, tl_gpu_gemm_w W, const float *h, const float *norm_w, float eps,
                      int32_t *ids, int k, int n_expert, int F, int KS, const float *logits, int ld,
                      float *wts, float *w_sh, int upb) {
    constexpr int SB = KPW * 128 + KPW * 16;
    extern __shared__ uint4 xs[];
    __shared__ float s_ss[8 * 8];
    __shared__ int s_e[MAX_K + 1];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = W.cols;
    int RBB = 8 / KS, n_rb = 2 * F / 8, upj = CEIL_DIV(n_rb, RBB), n_units = (k + 1) * upj;
    int q = warp / KS, kb0 = (warp % KS) * KPW;
    int u0 = blockIdx.x * upb, nu = max(0, min(upb, n_units - u0));
    int n_sh = nu - min(max(k * upj - u0, 0), nu); /* the block's units of slot k: its last */
    char *items = (char *)xs + q4m_smem(K, 1);     /* [upb][8 warps][SB] */
    const uint32_t *w0 = (const uint32_t *)W.w, *sb0 = (const uint32_t *)W.sb;
    size_t ew = (size_t)2 * F * K / 8, es = (size_t)2 * F * (K / 64);
    /* the warp's item m is unit unit_of(m) of the block: the shared expert's first */
    auto unit_of = [&](int m) { return m < n_sh ? nu - n_sh + m : m - n_sh; };
    auto item = [&](int m, int *j, int *rb) {
        int uj = u0 + unit_of(m);
        *j = uj / upj, *rb = (uj - *j * upj) * RBB + q;
        return m < nu && q < RBB && *rb < n_rb;
    };
    auto issue = [&](int m) {
        int j, rb;
        if (item(m, &j, &rb)) {
            int e = j < k ? s_e[j] : n_expert;
            q4m_issue<KPW>(items + (size_t)(unit_of(m) * 8 + warp) * SB, w0 + e * ew, sb0 + e * es,
                           2 * F, K, rb, kb0);
        }
        cp_async_commit();
    };
    for (int m = 0; m < n_sh; m++) issue(m); /* weights only: no PDL wait needed */
    pdl_wait();
    pdl_trigger(); /* after the wait: moe_down may read the logits before its own */
    if (warp == 0) route_block(s_e, ids, wts, w_sh, logits, ld, n_expert, k, 0);
    if (lane < 8) s_ss[warp * 8 + lane] = 0.0f;
    __syncthreads();
    for (int m = n_sh; m < upb; m++) issue(m);
    float *sx = q4m_sx(xs, K, 1);
    q4m_stage(xs, sx, h, K, norm_w, K, 1, threadIdx.x, 256, s_ss);
    __syncthreads();
    for (int m = 0; m < upb; m++) {
        cp_async_wait_dyn(upb - 1 - m);
        __syncwarp();
        int j, rb;
        float a0 = 0.0f, a1 = 0.0f;
        char *it = items + (size_t)(unit_of(m) * 8 + warp) * SB;
        if (item(m, &j, &rb)) q4m_item_dot<KPW>(a0, a1, it, xs, sx, kb0);
        __syncwarp(); /* every lane has read the item before its first bytes take the sums */
        if (m < nu) ((float2 *)it)[lane] = make_float2(a0, a1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nu * RBB * 4; e += 256) { /* (unit, gate/up pair p, output r) */
        int i = e / (RBB * 4), p = (e >> 3) - i * (RBB / 2), r = e & 7;
        int uj = u0 + i, j = uj / upj, rbg = (uj - j * upj) * RBB + 2 * p;
        if (rbg >= n_rb) continue;
        const float2 *gp = (const float2 *)(items + (size_t)(i * 8 + 2 * p * KS) * SB) + (r >> 1);
        const float2 *up =
            (const float2 *)(items + (size_t)(i * 8 + (2 * p + 1) * KS) * SB) + (r >> 1);
        moe_up_emit(act, gp, up, SB / 8, KS, s_ss, K, eps, 0, j, k, F, rbg, r);
    }
}

/* The distinct experts of up to 8 routed tokens (moe_up_q4x_kernel): ue[0 .. nu - 1] in ascending
 * id, the shared expert last; slot[u][t] = token t's slot of expert ue[u] + 1, or 0. */
struct moe_list {
    int ids[8][MAX_K + 1], ue[8 * MAX_K + 1], nu;
    uint32_t bits[8]; /* the routed experts (n_expert <= 256) */
    uint8_t slot[8 * MAX_K + 1][8];
};

/* Warp t routes token t (route_block: block 0 publishes ids and weights), then the block lists
 * the distinct experts into *L: an expert's index is its rank among the routed ones (a popcount
 * of the bitmap below it). Called by every thread; ends with a barrier. */
__device__ __forceinline__ void list_experts(moe_list *L, int32_t *ids, float *wts, float *w_sh,
                                             const float *logits, int ld, int n_expert, int k,
                                             int n_tok) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x < 8) L->bits[threadIdx.x] = 0u;
    for (int i = threadIdx.x; i < (8 * MAX_K + 1) * 8; i += blockDim.x) (&L->slot[0][0])[i] = 0;
    __syncthreads();
    if (warp < n_tok) {
        route_block(L->ids[warp], ids, wts, w_sh, logits, ld, n_expert, k, warp);
        __syncwarp();
        if (lane < k) atomicOr(&L->bits[L->ids[warp][lane] >> 5], 1u << (L->ids[warp][lane] & 31));
    }
    __syncthreads();
    int n_routed = 0;
    for (int w = 0; w < 8; w++) n_routed += __popc(L->bits[w]);
    if (warp < n_tok && lane < k) {
        int e = L->ids[warp][lane], u = __popc(L->bits[e >> 5] & ((1u << (e & 31)) - 1u));
        for (int w = 0; w < (e >> 5); w++) u += __popc(L->bits[w]);
        L->ue[u] = e, L->slot[u][warp] = (uint8_t)(lane + 1);
    }
    if (threadIdx.x < n_tok) L->slot[n_routed][threadIdx.x] = (uint8_t)(k + 1);
    if (threadIdx.x == 0) L->ue[n_routed] = n_expert, L->nu = n_routed + 1;
    __syncthreads();
}

/* moe_up_q4x_kernel: moe_up for 2..8 routed tokens, expert-major. Every block routes all tokens
 * (warp t token t; block 0 publishes ids and weights) and lists the distinct experts in ascending
 * id, the shared expert last, with each token's slot of each (moe_list: slot + 1, 0 = not routed
 * there). A work item is (distinct expert, gate/up row-block pair): warp w of block b takes items
 * b * 8 + w, += gridDim.x * 8, streams the pair's 2 x KS chunks (the gate's K-slices, then the
 * up's; KPW tiles each) through its own ring of Q4M_NS stages without block barriers, with every
 * token as a row of the mma, so each distinct expert is read once for all its tokens. Each K-slice
 * is summed from zero and the slices are added in order, the norm and SwiGLU are
 * moe_swiglu_normed: every token's act has the bits moe_up_q4m_kernel gives it alone
 * (test_kernels.c: test_slice_kernels). Dependents are triggered after the wait (moe_down). */
template <int KPW>
__global__ void __launch_bounds__(256, 1)
    moe_up_q4x_kernel(float *act, tl_gpu_gemm_w W, const float *h, const float *norm_w, float eps,
                      int32_t *ids, int k, int n_expert, int F, int KS, const float *logits, int ld,
                      float *wts, float *w_sh, int n_tok) {
    constexpr int SB = KPW * 128 + KPW * 16;
    extern __shared__ uint4 xs[];
    __shared__ float s_ss[8 * 8];
    __shared__ moe_list L;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = W.cols, KB = K >> 5;
    int n_rb = 2 * F / 8, n_pair = n_rb / 2;
    pdl_wait();
    pdl_trigger(); /* after the wait: moe_down may read the logits before its own */
    if (lane < 8) s_ss[warp * 8 + lane] = 0.0f;
    list_experts(&L, ids, wts, w_sh, logits, ld, n_expert, k, n_tok);
    float *sx = q4m_sx(xs, K, n_tok);
    q4m_stage(xs, sx, h, K, norm_w, K, n_tok, threadIdx.x, 256, s_ss);
    __syncthreads();
    int n_items = L.nu * n_pair, nch = 2 * KS, g = lane >> 2, t = lane & 3;
    const uint4 *xrow = xs + min(g, n_tok - 1) * q4m_lds(K);
    const float *sxrow = sx + min(g, n_tok - 1) * (KB >> 1);
    char *my = (char *)xs + q4m_smem(K, n_tok) + (size_t)warp * Q4M_NS * SB;
    const uint32_t *w0 = (const uint32_t *)W.w, *sb0 = (const uint32_t *)W.sb;
    size_t ew = (size_t)2 * F * K / 8, es = (size_t)2 * F * (K / 64);
    int i0 = blockIdx.x * 8 + warp, istep = gridDim.x * 8;
    int n_mine = i0 < n_items ? CEIL_DIV(n_items - i0, istep) : 0, n_sub = n_mine * nch;
    auto issue = [&](int it) { /* sub-item it: chunk it % nch of the warp's item it / nch */
                               if (it < n_sub) {
                                   int item = i0 + (it / nch) * istep, c = it % nch,
                                       e = L.ue[item / n_pair];
                                   int rb = 2 * (item % n_pair) + (c >= KS);
                                   q4m_issue<KPW>(my + (it % Q4M_NS) * SB, w0 + e * ew,
                                                  sb0 + e * es, 2 * F, K, rb, (c % KS) * KPW);
                               }
                               cp_async_commit();
    };
    for (int j = 0; j < Q4M_NS - 1; j++) issue(j);
    float s0 = 0.0f, s1 = 0.0f, g0 = 0.0f, g1 = 0.0f; /* this slice-sum; the gate's */
    for (int it = 0; it < n_sub; it++) {
        issue(it + Q4M_NS - 1); /* into the stage sub-item it - 1 used */
        cp_async_wait<Q4M_NS - 1>();
        __syncwarp();
        int c = it % nch;
        float a0 = 0.0f, a1 = 0.0f;
        q4m_item_dot<KPW>(a0, a1, my + (it % Q4M_NS) * SB, xrow, sxrow, (c % KS) * KPW);
        s0 += a0, s1 += a1;
        __syncwarp(); /* every lane has read the stage before the next issue refills it */
        if (c == KS - 1) g0 = s0, g1 = s1, s0 = 0.0f, s1 = 0.0f; /* the gate rows are done */
        if (c == nch - 1) { /* the up rows too: token g's outputs 8 p + 2 t, +1 */
            int item = i0 + (it / nch) * istep, u = item / n_pair, p = item % n_pair;
            int j = g < n_tok ? L.slot[u][g] - 1 : -1;
            if (j >= 0) {
                float *o = act + ((size_t)g * (k + 1) + j) * F + 8 * p + 2 * t;
                o[0] = moe_swiglu_normed(g0, s0, s_ss, g, K, eps);
                o[1] = moe_swiglu_normed(g1, s1, s_ss, g, K, eps);
            }
            s0 = 0.0f, s1 = 0.0f;
        }
    }
    cp_async_wait<0>();
}

__global__ void __launch_bounds__(256)
    moe_up_bf16_kernel(float *act, tl_gpu_gemm_w W, const float *h, const float *norm_w, float eps,
                       const int32_t *ids, int k, int n_expert, int F) {
    __shared__ float s_v[8][8];
    __shared__ float s_ss[8];
    pdl_trigger();
    pdl_wait();
    int j = blockIdx.y, t = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int K = W.cols;
    const float *xrow = h + (size_t)t * K;
    int e = j < k ? ids[(size_t)t * k + j] : n_expert;
    int grp = blockIdx.x * 4 + (warp >> 1); /* outputs 8*grp .. 8*grp+7 */
    int rbl = 2 * grp + (warp & 1);         /* row block inside the expert */
    const void *w;
    const uint32_t *sb;
    expert_slice(W, e, 2 * F, &w, &sb);
    float v = 0.0f, ssum = 0.0f;
    if (grp * 8 < F) {
        const float *xp[1] = {xrow};
        float acc[8][1], ss[1];
        bf16_rows_dot<1>(acc, ss, (const uint16_t *)w, K, 8 * rbl, 2 * F, xp, norm_w, 1, 0, 1);
#pragma unroll
        for (int r = 0; r < 8; r++) {
            float a = warp_sum(acc[r][0]);
            if (lane == r) v = a;
        }
        ssum = warp_sum(ss[0]);
    }
    if (lane < 8) s_v[warp][lane] = v;
    if (lane == 0) s_ss[warp] = ssum;
    __syncthreads();
    if ((warp & 1) || lane >= 8 || grp * 8 >= F) return;
    float inv = rsqrtf(s_ss[warp] / (float)K + eps);
    float g = s_v[warp][lane] * inv, u = s_v[warp + 1][lane] * inv;
    act[((size_t)t * (k + 1) + j) * F + 8 * grp + lane] = silu_f(g) * u;
}

/* One warp of moe_down, 4-bit: row block rb of the expert slice (w, sb; n_embd rows, F columns)
 * dotted with the act row arow, staged in the warp's xs; lane t < 4 ends with rows 2t, 2t + 1 in
 * (a0, a1). The first KPW tiles are loaded before the PDL wait when EARLY. V: the q4v dot (one
 * mma a weight word), else q4m_dot. */
template <int KPW, bool EARLY, bool V>
__device__ __forceinline__ void moe_down_q4(float &a0, float &a1, const uint32_t *w,
                                            const uint32_t *sb, int n_embd, int F, int rb,
                                            const float *arow, uint4 *xs) {
    int KB = F >> 5, lane = threadIdx.x & 31;
    uint32_t wq[KPW], sbw[KPW / 2];
    uint2 sbv[KPW / 2];
    auto load = [&](int kb0) {
        if (V)
            q4v_load<KPW>(wq, sbw, w, sb, n_embd, F, rb, kb0);
        else
            q4m_load<KPW>(wq, sbv, w, sb, n_embd, F, rb, kb0);
    };
    load(0);
    if (EARLY) pdl_wait(); /* the first weights are in flight: now act */
    float *sx = q4m_sx(xs, F, 1);
    q4m_stage(xs, sx, arow, F, NULL, F, 1, lane, 32, NULL);
    __syncwarp();
    float acc = 0.0f;
    q4v_x<KPW> X;
    a0 = 0.0f, a1 = 0.0f;
    for (int kb0 = 0; kb0 < KB; kb0 += KPW) {
        if (kb0) load(kb0);
        if (V) {
            q4v_load_x<KPW>(X, xs, sx, F, 1, kb0);
            q4v_dot<KPW>(acc, wq, sbw, X);
        } else {
            q4m_dot<KPW>(a0, a1, wq, sbv, xs, sx, kb0);
        }
    }
    if (V) q4v_pairs(acc, a0, a1);
}

/* moe_down_kernel  (docs/model.md §2.5 steps 3-6, second half)
 *   h[t, r] += sum_{j<k} w[t,j] * (down_{ids[t,j]}[r] . act[t,j]) + w_sh[t] * (down_sh[r] .
 * act[t,k]) Shapes: down stacked [(n_expert+1) * n_embd, F]; act [n_tok, k+1, F]; h [n_tok,
 * n_embd]. Threads: block of k+1 warps per (8 output rows, token): warp j reads expert j's 8 rows
 * (q4: issues its weight loads, then stages act row j in its own shared memory and runs the q4m
 * dot; bf16: CUDA-core dot); the k+1 partial rows meet in shared memory and are summed in slot
 *   order (deterministic).
 * Bytes: (k+1) * n_embd * F weights per token. Tested in test_moe.
 * With logits (q4, right after moe_up with routing): each warp routes the token again from the
 * router's logits and loads its expert's first weights before the PDL wait. That is safe because
 * both moe_up kernels trigger their dependents only after their own wait, so the router kernel
 * has completed and written the logits when this kernel starts; they are read through L2
 * (__ldcg in route_warp: no stale L1 line from the previous layer). Same ids as moe_up's (same
 * function of the same logits), so the same bits. */
template <int BITS, int KPW, bool EARLY, bool V>
__device__ __forceinline__ void moe_down_body(float *h, const tl_gpu_gemm_w &W, const float *act,
                                              const int32_t *ids, const float *logits, int ld,
                                              const float *wt, const float *w_sh, int k,
                                              int n_expert, int n_embd) {
    extern __shared__ uint4 xs_all[]; /* q4: per warp the staged act row */
    __shared__ float s_v[17][8];
    pdl_trigger();
    int t = blockIdx.y, j = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rb = blockIdx.x, F = W.cols, e;
    if (EARLY) { /* q4 only: route again before the wait (see the contract above) */
        int id;
        float wn;
        route_warp(&id, &wn, logits + (size_t)t * ld, n_expert, k);
        id = __shfl_sync(0xffffffffu, id, j < k ? j : 0);
        e = j < k ? id : n_expert;
    } else {
        pdl_wait();
        e = j < k ? ids[(size_t)t * k + j] : n_expert;
    }
    const float *arow = act + ((size_t)t * (k + 1) + j) * F;
    const void *w;
    const uint32_t *sb;
    expert_slice(W, e, n_embd, &w, &sb);
    if (BITS == 4) {
        float a0, a1;
        moe_down_q4<KPW, EARLY, V>(a0, a1, (const uint32_t *)w, sb, n_embd, F, rb, arow,
                                   xs_all + (size_t)j * CEIL_DIV(q4m_smem(F, 1), 16));
        if (lane < 4) s_v[j][2 * lane] = a0, s_v[j][2 * lane + 1] = a1;
    } else {
        const float *xp[1] = {arow};
        float acc[8][1], ss[1];
        bf16_rows_dot<1>(acc, ss, (const uint16_t *)w, F, 8 * rb, n_embd, xp, NULL, 1, 0, 1);
#pragma unroll
        for (int r = 0; r < 8; r++) {
            float a = warp_sum(acc[r][0]);
            if (lane == 0) s_v[j][r] = a;
        }
    }
    __syncthreads();
    if (threadIdx.x >= 8) return;
    int r = threadIdx.x;
    float out = 0.0f;
    for (int jj = 0; jj <= k; jj++) {
        float wj = jj < k ? wt[(size_t)t * k + jj] : w_sh[t];
        out = fmaf(wj, s_v[jj][r], out);
    }
    h[(size_t)t * n_embd + 8 * rb + r] += out;
}

template <int BITS, int KPW, bool V>
__global__ void moe_down_kernel(float *h, tl_gpu_gemm_w W, const float *act, const int32_t *ids,
                                const float *wt, const float *w_sh, int k, int n_expert,
                                int n_embd) {
    moe_down_body<BITS, KPW, false, V>(h, W, act, ids, NULL, 0, wt, w_sh, k, n_expert, n_embd);
}

/* The early form: at most MOE_DOWN_EARLY_K + 1 warps, registers for 3 blocks an SM, so two of
 * its blocks fit beside a moe_up_q4s block and prefetch while it runs. */
#define MOE_DOWN_EARLY_K 8
template <int KPW, bool V>
__global__ void __launch_bounds__(32 * (MOE_DOWN_EARLY_K + 1), 3)
    moe_down_early_kernel(float *h, tl_gpu_gemm_w W, const float *act, const float *logits, int ld,
                          const float *wt, const float *w_sh, int k, int n_expert, int n_embd) {
    moe_down_body<4, KPW, true, V>(h, W, act, NULL, logits, ld, wt, w_sh, k, n_expert, n_embd);
}

/* moe_up's x staging + weight rings exceed the default 48 KB of dynamic shared memory. */
#define MOE_MAX_SHM (220 * 1024)
/* Raises moe_up's dynamic shared memory limit (tl_gpu_init). */
int cb_moe_setup(void) {
#define MOE_SHM_ATTR(kern)                                                                         \
    CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_MAX_SHM))
    MOE_SHM_ATTR((moe_up_q4m_kernel<8, false>));
    MOE_SHM_ATTR((moe_up_q4m_kernel<16, false>));
    MOE_SHM_ATTR((moe_up_q4m_kernel<32, false>));
    MOE_SHM_ATTR((moe_up_q4m_kernel<8, true>));
    MOE_SHM_ATTR((moe_up_q4m_kernel<16, true>));
    MOE_SHM_ATTR(moe_up_q4s_kernel<8>);
    MOE_SHM_ATTR(moe_up_q4s_kernel<16>);
    MOE_SHM_ATTR(moe_up_q4s_kernel<32>);
    MOE_SHM_ATTR(moe_up_q4x_kernel<8>);
    MOE_SHM_ATTR(moe_up_q4x_kernel<16>);
    MOE_SHM_ATTR(moe_up_q4x_kernel<32>);
#undef MOE_SHM_ATTR
    return 0;
}

/* The small-batch MoE levers (TL_MOE_SLICE=1; default 0: measured slower on the H200):
 * moe_up_q4s_kernel for one token with routing, moe_up_q4x_kernel for 2..8, and moe_down routing
 * early after moe_up_route. Same bits either way. */
static cb_level moe_slice = {"TL_MOE_SLICE", 0, 1, -1};
static int moe_slice_on(void) { return cb_level_get(&moe_slice); }
extern "C" int tl_gpu_moe_set_slice(int on) { return cb_level_set(&moe_slice, on); }

/* moe_up_q4s_kernel for one routed token when its items fit (1 launched, 0 not, < 0 error). */
static int launch_moe_up_q4s(float *act, const tl_gpu_gemm_w *gate_up, const float *h,
                             const float *norm_w, float eps, int32_t *ids, int k, int n_expert,
                             int F, int kpw, int ks, const float *logits, int ld, float *wts,
                             float *w_sh, const tl_gpu_stream *st) {
    int K = gate_up->cols, n_units = (k + 1) * CEIL_DIV(2 * F / 8, 8 / ks);
    int upb = CEIL_DIV(n_units, cb_grid_cap() / 2);
    size_t shm = q4m_smem(K, 1) + (size_t)upb * 8 * q4m_stage_bytes(kpw);
    if (upb > Q4S_UMAX || shm > MOE_MAX_SHM) return 0;
    auto kern = kpw == 32   ? moe_up_q4s_kernel<32>
                : kpw == 16 ? moe_up_q4s_kernel<16>
                            : moe_up_q4s_kernel<8>;
    TL_LAUNCH(st, "moe_up_q4s", kern, dim3(CEIL_DIV(n_units, upb)), dim3(256), shm, act, *gate_up,
              h, norm_w, eps, ids, k, n_expert, F, ks, logits, ld, wts, w_sh, upb);
    return 1;
}

static int moe_up_impl(float *act, const tl_gpu_gemm_w *gate_up, const float *h,
                       const float *norm_w, float eps, int32_t *ids, int k, int n_expert, int n_tok,
                       const float *logits, int ld, float *wts, float *w_sh,
                       const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    int F = gate_up->rows / (n_expert + 1) / 2, K = gate_up->cols;
    if (F % 8 || K % 256) return TL_ERR_INVALID;
    if (gate_up->bits != 4) {
        if (logits) return TL_ERR_INVALID; /* the bf16 path routes with tl_gpu_moe_route */
        dim3 grid(CEIL_DIV(F, 32), k + 1, n_tok);
        TL_LAUNCH(st, "moe_up", moe_up_bf16_kernel, grid, dim3(256), 0, act, *gate_up, h, norm_w,
                  eps, ids, k, n_expert, F);
        return 0;
    }
    int kpw, ks;
    /* at most 4 K-slices: a unit keeps a gate/up row-block pair */
    if (q4m_split(K, 4, &kpw, &ks) || (8 / ks) % 2 || k > MAX_K || k > 32 ||
        n_expert > 32 * ROUTE_PER)
        return TL_ERR_INVALID;
    if (logits && n_tok == 1 && moe_slice_on()) {
        int rc = launch_moe_up_q4s(act, gate_up, h, norm_w, eps, ids, k, n_expert, F, kpw, ks,
                                   logits, ld, wts, w_sh, st);
        if (rc) return rc < 0 ? rc : 0;
    }
    if (logits && n_tok >= 2 && n_tok <= 8 && moe_slice_on()) {
        size_t shm = q4m_smem(K, n_tok) + (size_t)8 * Q4M_NS * q4m_stage_bytes(kpw);
        int n_items = (TL_MIN(n_tok * k, n_expert) + 1) * (2 * F / 8 / 2);
        if (shm <= MOE_MAX_SHM) {
            auto kern = kpw == 32   ? moe_up_q4x_kernel<32>
                        : kpw == 16 ? moe_up_q4x_kernel<16>
                                    : moe_up_q4x_kernel<8>;
            TL_LAUNCH(st, "moe_up_q4x", kern, dim3(TL_MIN(cb_grid_cap() / 2, CEIL_DIV(n_items, 8))),
                      dim3(256), shm, act, *gate_up, h, norm_w, eps, ids, k, n_expert, F, ks,
                      logits, ld, wts, w_sh, n_tok);
            return 0;
        }
    }
    size_t shm = q4m_smem(K, 1) + (size_t)8 * Q4M_NS * q4m_stage_bytes(kpw);
    if (shm > MOE_MAX_SHM) return TL_ERR_INVALID;
    int n_units = (k + 1) * CEIL_DIV(2 * F / 8, 8 / ks);
    dim3 grid(TL_MAX(1, TL_MIN(n_units, cb_grid_cap() / n_tok)), n_tok);
    bool v = kpw <= 16 && cb_q4v_on(); /* one token a block row */
    auto kern = kpw == 32 ? moe_up_q4m_kernel<32, false>
                : v       ? (kpw == 16 ? moe_up_q4m_kernel<16, true> : moe_up_q4m_kernel<8, true>)
                    : (kpw == 16 ? moe_up_q4m_kernel<16, false> : moe_up_q4m_kernel<8, false>);
    TL_LAUNCH(st, "moe_up", kern, grid, dim3(256), shm, act, *gate_up, h, norm_w, eps, ids, k,
              n_expert, F, ks, logits, ld, wts, w_sh);
    return 0;
}

extern "C" int tl_gpu_moe_up(float *act, const tl_gpu_gemm_w *gate_up, const float *h,
                             const float *norm_w, float eps, const int32_t *ids, int k,
                             int n_expert, int n_tok, const tl_gpu_stream *st) {
    return moe_up_impl(act, gate_up, h, norm_w, eps, (int32_t *)ids, k, n_expert, n_tok, NULL, 0,
                       NULL, NULL, st);
}

extern "C" int tl_gpu_moe_up_route(float *act, int32_t *ids, float *w, float *w_sh,
                                   const tl_gpu_gemm_w *gate_up, const float *h,
                                   const float *norm_w, float eps, const float *logits, int ld,
                                   int k, int n_expert, int n_tok, const tl_gpu_stream *st) {
    return moe_up_impl(act, gate_up, h, norm_w, eps, ids, k, n_expert, n_tok, logits, ld, w, w_sh,
                       st);
}

static int moe_down_impl(float *h, const tl_gpu_gemm_w *down, const float *act, const int32_t *ids,
                         const float *logits, int ld, const float *w, const float *w_sh, int k,
                         int n_expert, int n_tok, const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    int n_embd = down->rows / (n_expert + 1), F = down->cols;
    if (n_embd % 8 || F % 256 || k + 1 > 17) return TL_ERR_INVALID;
    dim3 grid(n_embd / 8, n_tok), block(32 * (k + 1));
    if (down->bits != 4) {
        TL_LAUNCH(st, "moe_down", (moe_down_kernel<16, 8, false>), grid, block, 0, h, *down, act,
                  ids, w, w_sh, k, n_expert, n_embd);
        return 0;
    }
    int kpw, ks;
    if (q4m_split(F, 8, &kpw, &ks)) return TL_ERR_INVALID; /* one warp loops over the ks chunks */
    size_t shm = (size_t)(k + 1) * (CEIL_DIV(q4m_smem(F, 1), 16) * 16);
    if (shm > 48 * 1024) return TL_ERR_INVALID;
    bool v = kpw <= 16 && cb_q4v_on() >= 2; /* one token a block */
    if (logits && k <= MOE_DOWN_EARLY_K && n_expert <= 32 * ROUTE_PER && kpw <= 16) {
        auto kern =
            v ? (kpw == 16 ? moe_down_early_kernel<16, true> : moe_down_early_kernel<8, true>)
              : (kpw == 16 ? moe_down_early_kernel<16, false> : moe_down_early_kernel<8, false>);
        TL_LAUNCH(st, "moe_down_early", kern, grid, block, shm, h, *down, act, logits, ld, w, w_sh,
                  k, n_expert, n_embd);
        return 0;
    }
    auto kern = kpw == 32 ? moe_down_kernel<4, 32, false>
                : v       ? (kpw == 16 ? moe_down_kernel<4, 16, true> : moe_down_kernel<4, 8, true>)
                    : (kpw == 16 ? moe_down_kernel<4, 16, false> : moe_down_kernel<4, 8, false>);
    TL_LAUNCH(st, "moe_down", kern, grid, block, shm, h, *down, act, ids, w, w_sh, k, n_expert,
              n_embd);
    return 0;
}

extern "C" int tl_gpu_moe_down(float *h, const tl_gpu_gemm_w *down, const float *act,
                               const int32_t *ids, const float *w, const float *w_sh, int k,
                               int n_expert, int n_tok, const tl_gpu_stream *st) {
    return moe_down_impl(h, down, act, ids, NULL, 0, w, w_sh, k, n_expert, n_tok, st);
}

extern "C" int tl_gpu_moe_down_after_route(float *h, const tl_gpu_gemm_w *down, const float *act,
                                           const int32_t *ids, const float *logits, int ld,
                                           const float *w, const float *w_sh, int k, int n_expert,
                                           int n_tok, const tl_gpu_stream *st) {
    return moe_down_impl(h, down, act, ids, moe_slice_on() ? logits : NULL, ld, w, w_sh, k,
                         n_expert, n_tok, st);
}

/* ====== Prefill MoE: plan, grouped GEMMs (k_gemm.cu), combine. ====== */

/* math: counting sort of the n_tok*8 assignments a = tok*8 + slot by expert id.
 * plan: off[257] (prefix of counts), tile prefixes for 128-, 64- and 16-row tiles, perm[n*8].
 * threads: one block of 1024. Counting and placing are warp-aggregated: the lanes of a warp that
 *   hold the same expert (__match_any_sync) add their number with one shared-memory atomic and
 *   take consecutive places by their rank among themselves, so a hot expert costs one atomic a
 *   warp, not 32. The four prefixes are block scans (warp shuffles, then across the 8 warps of
 *   the first 256 threads), not one thread's loop. The order inside an expert is arbitrary, which
 *   cannot change any result: each output row depends only on its own input row. */
static __device__ __forceinline__ int plan_warp_incl_scan(int v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

/* Thread e < 256 writes the exclusive prefix of v over e into plan[at + e] (and the total into
 * plan[at + 256]); sw: 8 ints of shared memory. Every thread of the block calls it. */
static __device__ __forceinline__ int plan_prefix(int32_t *plan, int at, int v, int *sw) {
    const int e = threadIdx.x, lane = e & 31, w = e >> 5;
    int incl = e < 256 ? plan_warp_incl_scan(v, lane) : 0;
    if (e < 256 && lane == 31) sw[w] = incl;
    __syncthreads();
    int before = 0;
    if (e < 256)
        for (int k = 0; k < w; k++) before += sw[k];
    int excl = before + incl - v;
    if (e < 256) plan[at + e] = excl;
    if (e == 255) plan[at + 256] = excl + v;
    __syncthreads(); /* sw is reused by the next prefix */
    return excl;
}

/* Counts assignments [a0, a1) by expert into cnt (shared, zeroed by the caller), warp-aggregated.
 */
static __device__ __forceinline__ void plan_count(int *cnt, const int32_t *ids, int a0, int a1) {
    const int lane = threadIdx.x & 31;
    /* whole warps: the match is collective */
    for (int base = a0; base < a1; base += blockDim.x) {
        int a = base + threadIdx.x, e = a < a1 ? ids[a] : -1;
        unsigned m = __match_any_sync(0xffffffffu, e);
        if (e >= 0 && e < 256 && lane == __ffs(m) - 1) atomicAdd(&cnt[e], __popc(m));
    }
}

/* Places assignments [a0, a1) at cur[e]++ (shared cursors) in the plan's perm, warp-aggregated. */
static __device__ __forceinline__ void plan_place(int32_t *plan, int *cur, const int32_t *ids,
                                                  int a0, int a1) {
    const int lane = threadIdx.x & 31;
    for (int base = a0; base < a1; base += blockDim.x) {
        int a = base + threadIdx.x, e = a < a1 ? ids[a] : -1;
        unsigned m = __match_any_sync(0xffffffffu, e);
        int leader = __ffs(m) - 1, pos = 0;
        bool ok = e >= 0 && e < 256;
        if (ok && lane == leader) pos = atomicAdd(&cur[e], __popc(m));
        pos = __shfl_sync(0xffffffffu, pos, leader);
        if (ok) plan[PLAN_PERM + pos + __popc(m & ((1u << lane) - 1))] = a;
    }
}

/* The four prefixes of the counts c (thread e < 256) into the plan; returns e's offset. */
static __device__ __forceinline__ int plan_prefixes(int32_t *plan, int c, int *sw) {
    int o = plan_prefix(plan, PLAN_OFF, c, sw);
    plan_prefix(plan, PLAN_TS128, (c + 127) / 128, sw);
    plan_prefix(plan, PLAN_TS64, (c + 63) / 64, sw);
    plan_prefix(plan, PLAN_TS16, (c + 15) / 16, sw);
    return o;
}

__global__ void moe_plan_kernel(int32_t *plan, const int32_t *ids, int n_asg, int trig) {
    pdl_enter(trig); /* launched with PDL on the batched path: cuda_common.cuh */
    __shared__ int cnt[256], cur[256], sw[8];
    for (int e = threadIdx.x; e < 256; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    plan_count(cnt, ids, 0, n_asg);
    __syncthreads();
    int o = plan_prefixes(plan, threadIdx.x < 256 ? cnt[threadIdx.x] : 0, sw);
    if (threadIdx.x < 256) cur[threadIdx.x] = o;
    __syncthreads();
    plan_place(plan, cur, ids, 0, n_asg);
}

/* moe_route_plan_kernel: moe_route_kernel then moe_plan_kernel in one block of 1024 threads, for
 * micro-batches of at most ROUTE_PLAN_MAX tokens (the batched decode path): warp t routes token
 * t, the block then plans from the ids it wrote (visible to it after the barrier): one
 * dependent launch less a layer, the same ids, weights and plan (perm in any order inside an
 * expert, as moe_plan_kernel's). */
#define ROUTE_PLAN_MAX 32
__global__ void __launch_bounds__(1024)
    moe_route_plan_kernel(int32_t *plan, int32_t *ids, float *w, float *w_sh, float *sh_logit,
                          const float *logits, int ld, int n_expert, int n_tok, int trig) {
    pdl_enter(trig);
    __shared__ int cnt[256], cur[256], sw[8];
    int t = threadIdx.x >> 5, lane = threadIdx.x & 31, k = 8;
    if (t < n_tok) {
        const float *lg = logits + (size_t)t * ld;
        int id;
        float wn;
        route_warp(&id, &wn, lg, n_expert, k);
        if (lane < k) ids[(size_t)t * k + lane] = id, w[(size_t)t * k + lane] = wn;
        if (lane == 0) {
            w_sh[t] = sigmoid_f(lg[n_expert]);
            if (sh_logit) sh_logit[t] = lg[n_expert];
        }
    }
    for (int e = threadIdx.x; e < 256; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    plan_count(cnt, ids, 0, n_tok * k);
    __syncthreads();
    int o = plan_prefixes(plan, threadIdx.x < 256 ? cnt[threadIdx.x] : 0, sw);
    if (threadIdx.x < 256) cur[threadIdx.x] = o;
    __syncthreads();
    plan_place(plan, cur, ids, 0, n_tok * k);
}

extern "C" int tl_gpu_moe_route_plan(int32_t *plan, int32_t *ids, float *w, float *w_sh,
                                     float *sh_logit, const float *logits, int ld, int n_expert,
                                     int k, int n_tok, const tl_gpu_stream *st) {
    if (!plan || !ids || n_tok < 1 || n_tok > ROUTE_PLAN_MAX || k != 8 ||
        n_expert > 32 * ROUTE_PER || n_expert > 256)
        return TL_ERR_INVALID;
    TL_LAUNCH(st, "moe_route_plan", moe_route_plan_kernel, dim3(1), dim3(1024), 0, plan, ids, w,
              w_sh, sh_logit, logits, ld, n_expert, n_tok, tl_pdl_trig(st));
    return 0;
}

/* ---- The plan of a prefill chunk: PLAN_CHUNK assignments a block, three kernels. ----
 * One block of 1024 threads walks n_asg assignments twice (78 us a call at a 4K-token chunk's
 * 32K assignments on the H100, 3% of that prefill), so from PLAN_MB_MIN assignments on: each
 * chunk counts its own into the scratch after perm ([n_chunk][256]), one block turns those into
 * each chunk's base per expert (chunks in order, then the four prefixes), and each chunk places
 * its assignments from its bases. The same plan but for the order inside an expert, which no
 * result depends on. */
#define PLAN_CHUNK  2048
#define PLAN_MB_MIN 4096

__global__ void moe_plan_count_kernel(int32_t *scratch, const int32_t *ids, int n_asg, int trig) {
    pdl_enter(trig);
    __shared__ int cnt[256];
    for (int e = threadIdx.x; e < 256; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    int a0 = blockIdx.x * PLAN_CHUNK;
    plan_count(cnt, ids, a0, min(a0 + PLAN_CHUNK, n_asg));
    __syncthreads();
    for (int e = threadIdx.x; e < 256; e += blockDim.x) scratch[blockIdx.x * 256 + e] = cnt[e];
}

__global__ void moe_plan_scan_kernel(int32_t *plan, int32_t *scratch, int n_chunk, int trig) {
    pdl_enter(trig);
    __shared__ int sw[8];
    const int e = threadIdx.x; /* 256 threads */
    int c = 0;
    for (int b = 0; b < n_chunk; b++) {
        int v = scratch[b * 256 + e];
        scratch[b * 256 + e] = c;
        c += v;
    }
    int o = plan_prefixes(plan, c, sw);
    for (int b = 0; b < n_chunk; b++) scratch[b * 256 + e] += o;
}

__global__ void moe_plan_place_kernel(int32_t *plan, const int32_t *scratch, const int32_t *ids,
                                      int n_asg, int trig) {
    pdl_enter(trig);
    __shared__ int cur[256];
    for (int e = threadIdx.x; e < 256; e += blockDim.x) cur[e] = scratch[blockIdx.x * 256 + e];
    __syncthreads();
    int a0 = blockIdx.x * PLAN_CHUNK;
    plan_place(plan, cur, ids, a0, min(a0 + PLAN_CHUNK, n_asg));
}

extern "C" size_t tl_gpu_moe_pf_plan_ints(int n_tok) {
    size_t n_asg = (size_t)n_tok * 8, n_chunk = (n_asg + PLAN_CHUNK - 1) / PLAN_CHUNK;
    return PLAN_PERM + n_asg + (n_asg >= PLAN_MB_MIN ? n_chunk * 256 : 0);
}

extern "C" int tl_gpu_moe_pf_plan(int32_t *plan, const int32_t *ids, int n_tok,
                                  const tl_gpu_stream *st) {
    if (!plan || !ids || n_tok < 0) return TL_ERR_INVALID;
    int n_asg = n_tok * 8, trig = tl_pdl_trig(st);
    if (n_asg < PLAN_MB_MIN) {
        TL_LAUNCH(st, "moe_plan", moe_plan_kernel, dim3(1), dim3(1024), 0, plan, ids, n_asg, trig);
        return 0;
    }
    int n_chunk = CEIL_DIV(n_asg, PLAN_CHUNK);
    int32_t *scratch = plan + PLAN_PERM + n_asg;
    TL_LAUNCH(st, "moe_plan_count", moe_plan_count_kernel, dim3(n_chunk), dim3(1024), 0, scratch,
              ids, n_asg, trig);
    TL_LAUNCH(st, "moe_plan_scan", moe_plan_scan_kernel, dim3(1), dim3(256), 0, plan, scratch,
              n_chunk, trig);
    TL_LAUNCH(st, "moe_plan_place", moe_plan_place_kernel, dim3(n_chunk), dim3(1024), 0, plan,
              scratch, ids, n_asg, trig);
    return 0;
}

extern "C" int tl_gpu_moe_pf_gate_up(uint16_t *h, const uint16_t *x, const tl_gpu_gemm_w *w_expert0,
                                     const int32_t *plan, int n_tok, int shared,
                                     const tl_gpu_stream *st) {
    return cb_moe_gemm(h, x, w_expert0, plan, n_tok, 1, TL_GEMM_SWIGLU, shared, st);
}

extern "C" int tl_gpu_moe_pf_down(uint16_t *yslot, const uint16_t *h,
                                  const tl_gpu_gemm_w *w_expert0, const int32_t *plan, int n_tok,
                                  int shared, const tl_gpu_stream *st) {
    return cb_moe_gemm(yslot, h, w_expert0, plan, n_tok, 0, 0, shared, st);
}

/* math: out[t] = res[t] + sum_s w[t,s] y[t*8+s] + sigmoid(l[t]) sh[t], fp32, slots in order;
 *   with nw (f32 out, n_embd = 8 x 256: one pass of the loop) also yn[t] = bf16 RMSNorm(out[t])
 *   with weight nw: the next layer's input norm folded in, rmsnorm_bf16_kernel's bits (k_rms.cuh).
 * threads: one block of 256 per token, 8 columns per thread (16-byte loads of yslot).
 * bytes: n_tok * (8*2048*2 + 2048*(2|4)*2 + 2048*2) (+ 2048*2 for yn). */
__global__ void moe_combine_kernel(void *out, const void *res, const uint16_t *yslot,
                                   const float *wts, const uint16_t *sh, const float *sh_logit,
                                   int n_embd, int out_f32, const float *nw, uint16_t *yn,
                                   float eps, int trig) {
    pdl_enter(trig); /* launched with PDL on the batched path: cuda_common.cuh */
    __shared__ float sbuf[32];
    const int t = blockIdx.x;
    for (int c0 = threadIdx.x * 8; c0 < n_embd; c0 += blockDim.x * 8) {
        float acc[8];
        for (int i = 0; i < 8; i++) acc[i] = 0.f;
        for (int s = 0; s < 8; s++) {
            float ws = wts[t * 8 + s];
            uint4 v = *(const uint4 *)(yslot + ((size_t)t * 8 + s) * n_embd + c0);
            uint32_t u[4] = {v.x, v.y, v.z, v.w};
            for (int i = 0; i < 4; i++) {
                acc[2 * i] += ws * bf16x2_lo(u[i]);
                acc[2 * i + 1] += ws * bf16x2_hi(u[i]);
            }
        }
        if (sh) {
            float gs = sigmoid_f(sh_logit[t]);
            uint4 v = *(const uint4 *)(sh + (size_t)t * n_embd + c0);
            uint32_t u[4] = {v.x, v.y, v.z, v.w};
            for (int i = 0; i < 4; i++) {
                acc[2 * i] += gs * bf16x2_lo(u[i]);
                acc[2 * i + 1] += gs * bf16x2_hi(u[i]);
            }
        }
        size_t base = (size_t)t * n_embd + c0;
        if (out_f32) { /* 16-byte loads and stores: the same sums */
            float4 r0 = make_float4(0.f, 0.f, 0.f, 0.f), r1 = r0;
            if (res) {
                r0 = *(const float4 *)((const float *)res + base);
                r1 = *(const float4 *)((const float *)res + base + 4);
            }
            float v[8] = {r0.x + acc[0], r0.y + acc[1], r0.z + acc[2], r0.w + acc[3],
                          r1.x + acc[4], r1.y + acc[5], r1.z + acc[6], r1.w + acc[7]};
            *(float4 *)((float *)out + base) = make_float4(v[0], v[1], v[2], v[3]);
            *(float4 *)((float *)out + base + 4) = make_float4(v[4], v[5], v[6], v[7]);
            if (nw) { /* block-uniform; the loop's only pass (2048 columns, 256 threads) */
                rms_row8(v, nw, c0, n_embd, eps, sbuf);
                rms_store8(yn + base, NULL, v);
            }
        } else {
            uint32_t o[4];
            for (int i = 0; i < 4; i++) {
                float r0 = 0.f, r1 = 0.f;
                if (res) {
                    r0 = bf2f(((const uint16_t *)res)[base + 2 * i]);
                    r1 = bf2f(((const uint16_t *)res)[base + 2 * i + 1]);
                }
                o[i] = bf16x2_pack(r0 + acc[2 * i], r1 + acc[2 * i + 1]);
            }
            *(uint4 *)((uint16_t *)out + base) = make_uint4(o[0], o[1], o[2], o[3]);
        }
    }
}

extern "C" int tl_gpu_moe_pf_combine(void *out, const void *res, const uint16_t *yslot,
                                     const float *wts, const uint16_t *shared,
                                     const float *sh_logit, int n_tok, int flags,
                                     const tl_gpu_stream *st) {
    return tl_gpu_moe_pf_combine_norm(out, res, yslot, wts, shared, sh_logit, n_tok, flags, NULL,
                                      NULL, 0.0f, st);
}

extern "C" int tl_gpu_moe_pf_combine_norm(void *out, const void *res, const uint16_t *yslot,
                                          const float *wts, const uint16_t *shared,
                                          const float *sh_logit, int n_tok, int flags,
                                          const float *nw, uint16_t *yn, float eps,
                                          const tl_gpu_stream *st) {
    if (!out || !yslot || !wts || n_tok < 0 || (shared && !sh_logit)) return TL_ERR_INVALID;
    if (nw && (!yn || !(flags & TL_GEMM_OUT_F32))) return TL_ERR_INVALID;
    if (n_tok == 0) return 0;
    TL_LAUNCH(st, "moe_combine", moe_combine_kernel, dim3(n_tok), dim3(256), 0, out, res, yslot,
              wts, shared, sh_logit, 2048, (int)(flags & TL_GEMM_OUT_F32), nw, yn, eps,
              tl_pdl_trig(st));
    return 0;
}
