/* Mixture of experts for decode: router top-k, then the selected experts' gate/up and down
 * GEMVs reading only the chosen experts (expert-major weights), with the shared expert handled
 * as expert n_expert of the same stack, and the weighted combine + residual add fused into the
 * down projection (fixed summation order: deterministic). */
#include "cuda/cuda_common.cuh"

#define MAX_K 16
#define ROUTE_PER 8 /* experts per lane: n_expert <= 256 */

/* moe_route_kernel  (MODEL.md §2.5 steps 1-2)
 *   p = softmax(logits[0..n_expert)) in fp32; ids = top-k of p (ties: lower id);
 *   w = p[ids] / sum p[ids];  w_sh = sigmoid(logits[n_expert])
 * Shapes: logits [n_tok, ld]; ids, w [n_tok, k]; w_sh [n_tok]; sh_logit [n_tok] (raw, optional).
 * Threads: one warp per token; lane holds experts lane, lane+32, ... (n_expert <= 256).
 * Bytes: negligible. Tested against cpu_moe_route (test_kernels.c: test_moe_route). */
__global__ void moe_route_kernel(int32_t *ids, float *w, float *w_sh, float *sh_logit,
                                 const float *logits, int ld, int n_expert, int k, int n_tok) {
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= n_tok) return;
    const float *lg = logits + (size_t)t * ld;
    float p[ROUTE_PER]; /* expert lane + 32 i, in registers (fully unrolled loops) */
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < ROUTE_PER; i++) {
        int e = lane + 32 * i;
        p[i] = e < n_expert ? lg[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTE_PER; i++) {
        p[i] = lane + 32 * i < n_expert ? expf(p[i] - mx) : -1.0f;
        sum += fmaxf(p[i], 0.0f);
    }
    sum = warp_sum(sum);
    float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < ROUTE_PER; i++)
        if (p[i] >= 0.0f) p[i] *= inv;
    float wsum = 0.0f, my_w = 0.0f;
    int my_id = 0;
    for (int j = 0; j < k; j++) {
        float best = -1.5f; /* below padding (-1) and taken (-2) never wins */
        int bid = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < ROUTE_PER; i++) {
            int e = lane + 32 * i;
            if (p[i] > best || (p[i] == best && e < bid)) best = p[i], bid = e;
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bid, o);
            if (ob > best || (ob == best && oi < bid)) best = ob, bid = oi;
        }
        wsum += best;
        if (lane == j) my_w = best, my_id = bid;
#pragma unroll
        for (int i = 0; i < ROUTE_PER; i++)
            if (lane + 32 * i == bid) p[i] = -2.0f; /* taken */
    }
    if (lane < k) {
        ids[(size_t)t * k + lane] = my_id;
        w[(size_t)t * k + lane] = my_w / wsum;
    }
    if (lane == 0) {
        w_sh[t] = sigmoid_f(lg[n_expert]);
        if (sh_logit) sh_logit[t] = lg[n_expert];
    }
}

extern "C" int tl_gpu_moe_route(int32_t *ids, float *w, float *w_sh, float *sh_logit,
                                const float *logits, int ld, int n_expert, int k, int n_tok) {
    if (n_tok <= 0) return 0;
    if (k > MAX_K || k > 32 || n_expert > 32 * ROUTE_PER) return TL_ERR_INVALID;
    moe_route_kernel<<<CEIL_DIV(n_tok, 4), 128, 0, tl_cuda_stream>>>(ids, w, w_sh, sh_logit,
                                                                      logits, ld, n_expert, k, n_tok);
    LAUNCH_CHECK("moe_route");
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

/* moe_up_kernel  (MODEL.md §2.5 steps 3 and 5, first half)
 *   x = rmsnorm(h[t]; norm_w);  act[t, j, f] = silu(gate_e[f] . x) * (up_e[f] . x)
 *   for j < k: e = ids[t, j]; j == k: e = n_expert (shared expert)
 * Shapes: gate_up stacked [(n_expert+1) * 2F, n_embd], per expert rows interleaved by 8
 *   (16i..16i+7 = gate rows 8i.., 16i+8..16i+15 = up rows 8i..); h [n_tok, n_embd];
 *   act [n_tok, k+1, F].
 * Threads: block of 8 warps per (32 outputs f, slot j, token t); q4: the block stages the
 *   normalised input in shared memory first (and sums h^2); warp pair (2p, 2p+1) reads the gate
 *   and the up row block of outputs 8p.. (one 8-row block each, the whole n_embd) and meets in
 *   shared memory.
 * Bytes: (k+1) * 2F * n_embd weights per token (bf16 2 B, q4 0.5625 B per weight).
 * Tested against cpu_ffn_swiglu + cpu_moe_route (test_kernels.c: test_moe). */
template <int BITS>
__global__ void __launch_bounds__(256)
    moe_up_kernel(float *act, tl_gpu_gemm_w W, const float *h, const float *norm_w, float eps,
                  const int32_t *ids, int k, int n_expert, int F) {
    extern __shared__ float xs[]; /* q4: the staged normalised input (cuda_common.cuh) */
    __shared__ float s_v[8][8];
    __shared__ float s_ss[8];
    int j = blockIdx.y, t = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int K = W.cols;
    const float *xrow = h + (size_t)t * K;
    int e = j < k ? ids[(size_t)t * k + j] : n_expert;
    int grp = blockIdx.x * 4 + (warp >> 1);      /* outputs 8*grp .. 8*grp+7 */
    int rbl = 2 * grp + (warp & 1);              /* row block inside the expert */
    const void *w;
    const uint32_t *sb;
    expert_slice(W, e, 2 * F, &w, &sb);
    float v = 0.0f, ssum = 0.0f;
    if (BITS == 4) {
        float ss = warp_sum(q4_stage_x(xs, xrow, norm_w, K, threadIdx.x, blockDim.x));
        if (lane == 0) s_ss[warp] = ss;
        __syncthreads();
        for (int i = 0; i < 8; i++) ssum += s_ss[i];
        if (grp * 8 < F) {
            float acc[8][1];
            q4_rb_dot<1, 1>(acc, (const uint32_t *)w, sb, 2 * F, K, rbl, xs, 1);
            group_reduce<8>(&acc[0][0], 32);
#pragma unroll
            for (int r = 0; r < 8; r++)
                if (lane == r) v = acc[r][0];
        }
    } else if (grp * 8 < F) {
        const float *xp[1] = {xrow};
        float acc[8][1], ss[1];
        bf16_rows8_dot<1>(acc, ss, (const uint16_t *)w, K, 8 * rbl, 2 * F, xp, norm_w, 1, 0, 1);
#pragma unroll
        for (int r = 0; r < 8; r++) {
            float a = warp_sum(acc[r][0]);
            if (lane == r) v = a;
        }
        ssum = warp_sum(ss[0]);
    }
    __syncthreads(); /* s_ss reads are done before s_v is written (q4); bf16: s_v below */
    if (lane < 8) s_v[warp][lane] = v;
    if (BITS != 4 && lane == 0) s_ss[warp] = ssum;
    __syncthreads();
    if ((warp & 1) || lane >= 8 || grp * 8 >= F) return;
    float inv = rsqrtf((BITS == 4 ? ssum : s_ss[warp]) / (float)K + eps);
    float g = s_v[warp][lane] * inv, u = s_v[warp + 1][lane] * inv;
    act[((size_t)t * (k + 1) + j) * F + 8 * grp + lane] = silu_f(g) * u;
}

/* moe_down_kernel  (MODEL.md §2.5 steps 3-6, second half)
 *   h[t, r] += sum_{j<k} w[t,j] * (down_{ids[t,j]}[r] . act[t,j]) + w_sh[t] * (down_sh[r] . act[t,k])
 * Shapes: down stacked [(n_expert+1) * n_embd, F]; act [n_tok, k+1, F]; h [n_tok, n_embd].
 * Threads: block of k+1 warps per (8 output rows, token): warp j stages act row j (q4) and
 *   reads expert j's 8 rows; the k+1 partial rows meet in shared memory and are summed in slot
 *   order (deterministic).
 * Bytes: (k+1) * n_embd * F weights per token. Tested in test_moe. */
template <int BITS>
__global__ void moe_down_kernel(float *h, tl_gpu_gemm_w W, const float *act, const int32_t *ids,
                                const float *wt, const float *w_sh, int k, int n_expert,
                                int n_embd) {
    extern __shared__ float xs_all[]; /* q4: per warp the staged act row (cuda_common.cuh) */
    __shared__ float s_v[17][8];
    int t = blockIdx.y, j = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rb = blockIdx.x, F = W.cols;
    int e = j < k ? ids[(size_t)t * k + j] : n_expert;
    const float *arow = act + ((size_t)t * (k + 1) + j) * F;
    const void *w;
    const uint32_t *sb;
    expert_slice(W, e, n_embd, &w, &sb);
    if (BITS == 4) {
        float *xs = xs_all + (size_t)j * q4_xs_ld(F);
        q4_stage_x(xs, arow, NULL, F, lane, 32);
        __syncwarp();
        float acc[4][1];
        q4_rb_dot<1, 2>(acc, (const uint32_t *)w, sb, n_embd, F, rb, xs, 1);
        group_reduce<4>(&acc[0][0], 16);
        if ((lane & 15) == 0)
#pragma unroll
            for (int i = 0; i < 4; i++) s_v[j][(lane >> 4) * 4 + i] = acc[i][0];
    } else {
        const float *xp[1] = {arow};
        float acc[8][1], ss[1];
        bf16_rows8_dot<1>(acc, ss, (const uint16_t *)w, F, 8 * rb, n_embd, xp, NULL, 1, 0, 1);
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

extern "C" int tl_gpu_moe_up(float *act, const tl_gpu_gemm_w *gate_up, const float *h,
                             const float *norm_w, float eps, const int32_t *ids, int k,
                             int n_expert, int n_tok) {
    if (n_tok <= 0) return 0;
    int F = gate_up->rows / (n_expert + 1) / 2;
    if (F % 8 || gate_up->cols % 256) return TL_ERR_INVALID;
    dim3 grid(CEIL_DIV(F, 32), k + 1, n_tok);
    size_t shm = (size_t)q4_xs_ld(gate_up->cols) * sizeof(float);
    if (gate_up->bits == 4 && shm > 48 * 1024) return TL_ERR_INVALID;
    if (gate_up->bits == 4)
        moe_up_kernel<4><<<grid, 256, shm, tl_cuda_stream>>>(act, *gate_up, h, norm_w, eps, ids, k, n_expert, F);
    else
        moe_up_kernel<16><<<grid, 256, 0, tl_cuda_stream>>>(act, *gate_up, h, norm_w, eps, ids, k, n_expert, F);
    LAUNCH_CHECK("moe_up");
    return 0;
}

extern "C" int tl_gpu_moe_down(float *h, const tl_gpu_gemm_w *down, const float *act,
                               const int32_t *ids, const float *w, const float *w_sh, int k,
                               int n_expert, int n_tok) {
    if (n_tok <= 0) return 0;
    int n_embd = down->rows / (n_expert + 1);
    if (n_embd % 8 || down->cols % 256 || k + 1 > 17)
        return TL_ERR_INVALID;
    dim3 grid(n_embd / 8, n_tok);
    size_t shm = (size_t)(k + 1) * q4_xs_ld(down->cols) * sizeof(float);
    if (down->bits == 4 && shm > 48 * 1024) return TL_ERR_INVALID;
    if (down->bits == 4)
        moe_down_kernel<4><<<grid, 32 * (k + 1), shm, tl_cuda_stream>>>(h, *down, act, ids, w, w_sh, k, n_expert, n_embd);
    else
        moe_down_kernel<16><<<grid, 32 * (k + 1), 0, tl_cuda_stream>>>(h, *down, act, ids, w, w_sh, k, n_expert, n_embd);
    LAUNCH_CHECK("moe_down");
    return 0;
}
