/* Mixture of experts for decode: router top-k, then the selected experts' gate/up and down
 * GEMVs reading only the chosen experts (expert-major weights), with the shared expert handled
 * as expert n_expert of the same stack, and the weighted combine + residual add fused into the
 * down projection (fixed summation order: deterministic). */
#include "cuda/cuda_common.cuh"

#define MAX_K 16

/* moe_route_kernel  (MODEL.md §2.5 steps 1-2)
 *   p = softmax(logits[0..n_expert)) in fp32; ids = top-k of p (ties: lower id);
 *   w = p[ids] / sum p[ids];  w_sh = sigmoid(logits[n_expert])
 * Shapes: logits [n_tok, ld]; ids, w [n_tok, k]; w_sh [n_tok].
 * Threads: one warp per token; lane holds experts lane, lane+32, ... (n_expert <= 1024).
 * Bytes: negligible. Tested against cpu_moe_route (test_kernels.c: test_moe_route). */
__global__ void moe_route_kernel(int32_t *ids, float *w, float *w_sh, const float *logits, int ld,
                                 int n_expert, int k, int n_tok) {
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= n_tok) return;
    const float *lg = logits + (size_t)t * ld;
    float p[32];
    int nper = CEIL_DIV(n_expert, 32);
    float mx = -INFINITY;
    for (int i = 0; i < 32; i++) {
        if (i >= nper) break;
        int e = lane + 32 * i;
        p[i] = e < n_expert ? lg[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int i = 0; i < 32; i++) {
        if (i >= nper) break;
        p[i] = expf(p[i] - mx);
        sum += p[i];
    }
    sum = warp_sum(sum);
    float inv = 1.0f / sum;
    for (int i = 0; i < 32; i++) {
        if (i >= nper) break;
        p[i] *= inv;
    }
    float sel_w[MAX_K];
    int sel_id[MAX_K];
    float wsum = 0.0f;
    for (int j = 0; j < k; j++) {
        float best = -1.0f;
        int bid = 0x7fffffff;
        for (int i = 0; i < 32; i++) {
            if (i >= nper) break;
            int e = lane + 32 * i;
            if (e < n_expert && (p[i] > best || (p[i] == best && e < bid))) best = p[i], bid = e;
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bid, o);
            if (ob > best || (ob == best && oi < bid)) best = ob, bid = oi;
        }
        sel_w[j] = best, sel_id[j] = bid;
        wsum += best;
        if ((bid & 31) == lane) p[bid >> 5] = -2.0f; /* taken */
    }
    if (lane == 0) {
        for (int j = 0; j < k; j++) {
            ids[(size_t)t * k + j] = sel_id[j];
            w[(size_t)t * k + j] = sel_w[j] / wsum;
        }
        w_sh[t] = sigmoid_f(lg[n_expert]);
    }
}

extern "C" int tl_gpu_moe_route(int32_t *ids, float *w, float *w_sh, const float *logits, int ld,
                                int n_expert, int k, int n_tok) {
    if (n_tok <= 0) return 0;
    if (k > MAX_K || n_expert > 1024) return TL_ERR_INVALID;
    moe_route_kernel<<<CEIL_DIV(n_tok, 4), 128, 0, tl_cuda_stream>>>(ids, w, w_sh, logits, ld,
                                                                      n_expert, k, n_tok);
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
 * Threads: block of 8 warps per (64 outputs f, slot j, token t); warp w computes 8 outputs from
 *   a gate row block and the following up row block.
 * Bytes: (k+1) * 2F * n_embd weights per token (bf16 2 B, q4 0.5625 B per weight).
 * Tested against cpu_ffn_swiglu pieces (test_kernels.c: test_moe). */
template <int BITS>
__global__ void __launch_bounds__(256)
    moe_up_kernel(float *act, tl_gpu_gemm_w W, const float *h, const float *norm_w, float eps,
                  const int32_t *ids, int k, int n_expert, int F) {
    __shared__ float s_inv[1];
    __shared__ float sbuf[32];
    int j = blockIdx.y, t = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int K = W.cols;
    const float *xp[1] = {h + (size_t)t * K};
    block_inv_rms<1>(s_inv, xp, K, 1, eps, sbuf);
    int e = j < k ? ids[(size_t)t * k + j] : n_expert;
    int wi = blockIdx.x * 8 + warp; /* outputs 8wi .. 8wi+7 */
    if (wi * 8 >= F) return;
    const void *w;
    const uint32_t *sb;
    expert_slice(W, e, 2 * F, &w, &sb);
    float g, u;
    if (BITS == 4) {
        float ag[1], au[1];
        q4_rowblock_dot<1>(ag, (const uint32_t *)w, sb, 2 * F, K, 2 * wi, xp, norm_w, 1);
        q4_rowblock_dot<1>(au, (const uint32_t *)w, sb, 2 * F, K, 2 * wi + 1, xp, norm_w, 1);
        q4_reduce<1>(ag);
        q4_reduce<1>(au);
        g = ag[0], u = au[0];
    } else {
        float ag[8][1], au[8][1];
        bf16_rows8_dot<1>(ag, (const uint16_t *)w, K, 16 * wi, 2 * F, xp, norm_w, 1);
        bf16_rows8_dot<1>(au, (const uint16_t *)w, K, 16 * wi + 8, 2 * F, xp, norm_w, 1);
        g = 0.0f, u = 0.0f;
#pragma unroll
        for (int r = 0; r < 8; r++)
            if (lane == r) g = ag[r][0], u = au[r][0];
    }
    if (lane < 8) {
        float inv = s_inv[0];
        act[((size_t)t * (k + 1) + j) * F + 8 * wi + lane] = silu_f(g * inv) * (u * inv);
    }
}

/* moe_down_kernel  (MODEL.md §2.5 steps 3-6, second half)
 *   h[t, r] += sum_{j<k} w[t,j] * (down_{ids[t,j]}[r] . act[t,j]) + w_sh[t] * (down_sh[r] . act[t,k])
 * Shapes: down stacked [(n_expert+1) * n_embd, F]; act [n_tok, k+1, F]; h [n_tok, n_embd].
 * Threads: block of 8 warps per (64 output rows, token); each warp loops over the k+1 experts
 *   for its 8 rows, summing in slot order.
 * Bytes: (k+1) * n_embd * F weights per token. Tested in test_moe. */
template <int BITS>
__global__ void __launch_bounds__(256)
    moe_down_kernel(float *h, tl_gpu_gemm_w W, const float *act, const int32_t *ids,
                    const float *wt, const float *w_sh, int k, int n_expert, int n_embd) {
    int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rb = blockIdx.x * 8 + warp, F = W.cols;
    if (rb * 8 >= n_embd) return;
    float out = 0.0f; /* lane r < 8: row 8rb + r */
    for (int j = 0; j <= k; j++) {
        int e = j < k ? ids[(size_t)t * k + j] : n_expert;
        float wj = j < k ? wt[(size_t)t * k + j] : w_sh[t];
        const float *xp[1] = {act + ((size_t)t * (k + 1) + j) * F};
        const void *w;
        const uint32_t *sb;
        expert_slice(W, e, n_embd, &w, &sb);
        if (BITS == 4) {
            float a[1];
            q4_rowblock_dot<1>(a, (const uint32_t *)w, sb, n_embd, F, rb, xp, NULL, 1);
            q4_reduce<1>(a);
            out = fmaf(wj, a[0], out);
        } else {
            float a[8][1];
            bf16_rows8_dot<1>(a, (const uint16_t *)w, F, 8 * rb, n_embd, xp, NULL, 1);
            float v = 0.0f;
#pragma unroll
            for (int r = 0; r < 8; r++)
                if (lane == r) v = a[r][0];
            out = fmaf(wj, v, out);
        }
    }
    if (lane < 8) h[(size_t)t * n_embd + 8 * rb + lane] += out;
}

extern "C" int tl_gpu_moe_up(float *act, const tl_gpu_gemm_w *gate_up, const float *h,
                             const float *norm_w, float eps, const int32_t *ids, int k,
                             int n_expert, int n_tok) {
    if (n_tok <= 0) return 0;
    int F = gate_up->rows / (n_expert + 1) / 2;
    if (F % 64 || gate_up->cols % 256) return TL_ERR_INVALID;
    dim3 grid(F / 64, k + 1, n_tok);
    if (gate_up->bits == 4)
        moe_up_kernel<4><<<grid, 256, 0, tl_cuda_stream>>>(act, *gate_up, h, norm_w, eps, ids, k, n_expert, F);
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
    if (n_embd % 64 || down->cols % 256) return TL_ERR_INVALID;
    dim3 grid(n_embd / 64, n_tok);
    if (down->bits == 4)
        moe_down_kernel<4><<<grid, 256, 0, tl_cuda_stream>>>(h, *down, act, ids, w, w_sh, k, n_expert, n_embd);
    else
        moe_down_kernel<16><<<grid, 256, 0, tl_cuda_stream>>>(h, *down, act, ids, w, w_sh, k, n_expert, n_embd);
    LAUNCH_CHECK("moe_down");
    return 0;
}
