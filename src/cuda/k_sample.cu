/* Sampling on the device, so the 248K logits never cross to the host: penalties, temperature,
 * min-p, top-k, top-p, then an exact draw from the surviving tokens (Gumbel-max keyed by the
 * sequence's random key), the chosen token's logprob and the top logprobs. */
#include "cuda/cuda_common.cuh"

#define SB           1024  /* threads per sampling block */
#define CAND_WINDOW  40.0f /* tokens more than 40 nats under the best are never candidates */
#define BISECT_ITERS 40

struct argmax_t {
    float v;
    int i;
};
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}
/* Block argmax (ties: lower index); every thread gets the result. */
__device__ argmax_t block_argmax(float v, int i, float *sv, int *si) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (am_better(ov, oi, v, i)) v = ov, i = oi;
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sv[w] = v, si[w] = i;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
    i = lane < (int)(blockDim.x >> 5) ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (am_better(ov, oi, v, i)) v = ov, i = oi;
    }
    argmax_t r = {v, i};
    return r;
}

__device__ __forceinline__ float apply_pen(float l, int c, const tl_sample_params &P) {
    if ((c & (1 << 30)) && P.repetition_penalty != 1.0f)
        l = l > 0.0f ? l / P.repetition_penalty : l * P.repetition_penalty;
    int n = c & 0xffffff;
    if (n > 0) l -= P.presence_penalty + P.frequency_penalty * (float)n;
    return l;
}

/* Uniform (0,1) from (key, token id): splitmix64 finaliser. */
__device__ __forceinline__ double rng_uniform(uint64_t key, int id) {
    uint64_t z = tl_mix64(key + TL_GOLDEN64 * (uint64_t)(id + 1));
    return ((double)(z >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* sample_kernel
 *   raw lse = log sum_i e^{l_i};  l'_i = pen(l_i) / T
 *   T <= 0: token = argmax pen(l).  Otherwise keep l'_i >= theta, theta = max of: max' - 40,
 *   max' + log(min_p), the k-th largest l' (top-k), the nucleus cut (top-p over the survivors,
 *   found by bisection on theta); token = argmax_i l'_i + Gumbel(key, i) over the survivors.
 *   logprob = l_token - lse; top_logprobs: the n_logprobs largest raw l_i - lse.
 * Shapes: logits [n_rows, V] f32; counts [n_rows, V] i32 or NULL; scratch [n_rows, 2V].
 * Threads: one block of 1024 per row; candidates compacted in index order (deterministic),
 *   every reduction in a fixed order: same key -> same token.
 * Bytes: 1-3 passes over the row (1 MB), plus one pass per requested top logprob.
 * Non-finite logits: token -1 (the engine fails that sequence alone).
 * Tested in test_kernels.c: test_sample_* (greedy vs host argmax, top-k/top-p support,
 *   determinism, penalties, a poisoned row). */
__global__ void __launch_bounds__(SB)
    sample_kernel(tl_sample_out *out, const float *logits, int V, int n_valid,
                  const tl_sample_params *params, const uint64_t *keys, const int32_t *counts,
                  float *scratch) {
    __shared__ float sbuf[32];
    __shared__ int sibuf[32];
    __shared__ int s_off[SB / 32];
    int row = blockIdx.x, tid = threadIdx.x;
    const float *lg = logits + (size_t)row * V;
    const int32_t *cnt = counts ? counts + (size_t)row * V : NULL;
    tl_sample_params P = params[row];
    float *cv = scratch + (size_t)row * 2 * V;
    int *ci = (int *)(cv + V);

    /* raw log-sum-exp; a row with a NaN or +inf logit (a poisoned input or weight: the MoE router
     * turns it into NaN, k_moe.cu), or only -inf ones, has no distribution: token -1 */
    float m = -INFINITY;
    for (int i = tid; i < n_valid; i += SB) m = fmaxf(m, lg[i]);
    m = block_max(m, sbuf);
    float s = 0.0f;
    for (int i = tid; i < n_valid; i += SB) s += expf(lg[i] - m);
    s = block_sum(s, sbuf);
    float lse = m + logf(s);
    if (!isfinite(lse)) { /* NaN from a NaN or +inf logit (block-uniform: no divergence) */
        if (tid == 0) out[row].token = -1, out[row].logprob = NAN, out[row].n_top = 0;
        return;
    }

    int token;
    if (P.temperature <= 0.0f) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = tid; i < n_valid; i += SB) {
            float l = cnt ? apply_pen(lg[i], cnt[i], P) : lg[i];
            if (am_better(l, i, bv, bi)) bv = l, bi = i;
        }
        token = block_argmax(bv, bi, sbuf, sibuf).i;
    } else {
        float invT = 1.0f / P.temperature;
        float mp = -INFINITY;
        for (int i = tid; i < n_valid; i += SB)
            mp = fmaxf(mp, (cnt ? apply_pen(lg[i], cnt[i], P) : lg[i]) * invT);
        mp = block_max(mp, sbuf);
        float theta = mp - CAND_WINDOW;
        if (P.min_p > 0.0f) theta = fmaxf(theta, mp + logf(P.min_p));
        /* compaction in index order: thread tid owns [tid*per, (tid+1)*per) */
        int per = CEIL_DIV(n_valid, SB), i0 = tid * per, i1 = min(n_valid, i0 + per), mine = 0;
        for (int i = i0; i < i1; i++)
            mine += (cnt ? apply_pen(lg[i], cnt[i], P) : lg[i]) * invT >= theta;
        int incl = mine, lane = tid & 31, w = tid >> 5;
        for (int o = 1; o < 32; o <<= 1) {
            int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        if (lane == 31) s_off[w] = incl;
        __syncthreads();
        if (w == 0) {
            int v = s_off[lane], x = v;
            for (int o = 1; o < 32; o <<= 1) {
                int u = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += u;
            }
            s_off[lane] = x - v; /* exclusive */
            if (lane == 31) sibuf[0] = x;
        }
        __syncthreads();
        int n_c = sibuf[0], off = s_off[w] + incl - mine;
        for (int i = i0; i < i1; i++) {
            float l = (cnt ? apply_pen(lg[i], cnt[i], P) : lg[i]) * invT;
            if (l >= theta) cv[off] = l, ci[off] = i, off++;
        }
        __syncthreads();
        if (P.top_k > 0 && P.top_k < n_c) {
            float lo = theta, hi = mp + 1.0f;
            for (int it = 0; it < BISECT_ITERS; it++) {
                float mid = 0.5f * (lo + hi), c = 0.0f;
                for (int i = tid; i < n_c; i += SB) c += cv[i] >= mid;
                c = block_sum(c, sbuf);
                if (c >= (float)P.top_k)
                    lo = mid;
                else
                    hi = mid;
            }
            theta = lo;
        }
        if (P.top_p < 1.0f) {
            float Z = 0.0f;
            for (int i = tid; i < n_c; i += SB)
                if (cv[i] >= theta) Z += expf(cv[i] - mp);
            Z = block_sum(Z, sbuf);
            float lo = theta, hi = mp + 1.0f;
            for (int it = 0; it < BISECT_ITERS; it++) {
                float mid = 0.5f * (lo + hi), ms = 0.0f;
                for (int i = tid; i < n_c; i += SB)
                    if (cv[i] >= mid) ms += expf(cv[i] - mp);
                ms = block_sum(ms, sbuf);
                if (ms >= P.top_p * Z)
                    lo = mid;
                else
                    hi = mid;
            }
            theta = lo;
        }
        uint64_t key = keys[row];
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = tid; i < n_c; i += SB) {
            if (cv[i] < theta) continue;
            double u = rng_uniform(key, ci[i]);
            float sc = cv[i] + (float)(-log(-log(u)));
            if (am_better(sc, ci[i], bv, bi)) bv = sc, bi = ci[i];
        }
        token = block_argmax(bv, bi, sbuf, sibuf).i;
    }
    tl_sample_out *o = out + row;
    if (tid == 0) {
        o->token = token;
        o->logprob = lg[token] - lse;
        o->n_top = P.n_logprobs;
    }
    /* top logprobs: repeated argmax below the previous pick */
    float pv = INFINITY;
    int pi = -1;
    for (int r = 0; r < P.n_logprobs && r < TL_MAX_LOGPROBS; r++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = tid; i < n_valid; i += SB) {
            float l = lg[i];
            if (l < pv || (l == pv && i > pi))
                if (am_better(l, i, bv, bi)) bv = l, bi = i;
        }
        argmax_t a = block_argmax(bv, bi, sbuf, sibuf);
        if (tid == 0) o->top_ids[r] = a.i, o->top_logprobs[r] = a.v - lse;
        pv = a.v, pi = a.i;
    }
}

extern "C" int tl_gpu_sample(tl_sample_out *out, const float *logits, int n_vocab, int n_valid,
                             const tl_sample_params *params, const uint64_t *keys,
                             const int32_t *counts, float *scratch, int n_rows,
                             const tl_gpu_stream *st) {
    if (n_rows <= 0) return 0;
    TL_LAUNCH(st, "sample", sample_kernel, dim3(n_rows), dim3(SB), 0, out, logits, n_vocab, n_valid,
              params, keys, counts, scratch);
    return 0;
}

/* penalty_counts_kernel: counts[tok] |= 1<<30 for every history token; += 1 for generated ones.
 * Integer atomics: the result does not depend on their order. */
__global__ void penalty_counts_kernel(int32_t *counts, const int32_t *hist, int n_hist,
                                      int n_prompt, int V) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_hist) return;
    int tok = hist[i];
    if (tok < 0 || tok >= V) return;
    atomicOr(&counts[tok], 1 << 30);
    if (i >= n_prompt) atomicAdd(&counts[tok], 1);
}

extern "C" int tl_gpu_penalty_counts(int32_t *counts, const int32_t *hist, int n_hist, int n_prompt,
                                     int n_vocab, const tl_gpu_stream *st) {
    CUDA_TRY(cudaMemsetAsync(counts, 0, sizeof(int32_t) * n_vocab, tl_stream_of(st)));
    if (n_hist <= 0) return 0;
    TL_LAUNCH(st, "penalty_counts", penalty_counts_kernel, dim3(CEIL_DIV(n_hist, 256)), dim3(256),
              0, counts, hist, n_hist, n_prompt, n_vocab);
    return 0;
}
