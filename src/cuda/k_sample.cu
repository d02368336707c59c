/* Sampling on the device, so the 248K logits never cross to the host: penalties, temperature,
 * min-p, top-k, top-p, then an exact draw from the surviving tokens (Gumbel-max keyed by the
 * sequence's random key), the chosen token's logprob and the top logprobs. A row whose params
 * carry a logit bias or an allowed-token mask (tulip.h) is first written, restricted, into its
 * row of `restricted` (sample_restrict_*), and sampled from there; its lse, logprob and top
 * logprobs still come from the unmodified logits. Two paths: the
 * two-pass one (greedy, or top-k <= 64 without top logprobs: the server's default) spreads a row
 * over 32 blocks (128 when a launch has at most 8 rows of top-k <= 32); sample_kernel (one block
 * per row) takes every other row and is not launched when there are none. */
#include "cuda/cuda_common.cuh"

#define SB           1024  /* threads per sampling block */
#define CAND_WINDOW  40.0f /* tokens more than 40 nats under the best are never candidates */
#define BISECT_ITERS 40
static_assert(TL_MAX_LOGIT_BIAS <= SB, "sample_restrict_bias_kernel: one thread per bias pair");

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

/* c: bit 30 = in the prompt, low 24 bits = times generated (tl_gpu_penalty_add). */
__device__ __forceinline__ float apply_pen(float l, int c, const tl_sample_params &P) {
    if ((c & ((1 << 30) | 0xffffff)) && P.repetition_penalty != 1.0f)
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

/* ====== Token restrictions (logit bias, allowed-token mask) ======
 * sample_restrict_copy_kernel: r[i] = allow bit i set (or no mask) ? l[i] : -inf, for the rows
 *   with a restriction; grid (ceil(V / 1024), n_rows).
 * sample_restrict_bias_kernel: one block per row, thread j owns pair j (n_bias <= 1024 = SB):
 *   the first pair of each id adds the sum of that id's values (in pair order, as the host
 *   sampler) to the unmodified logit, where the id is allowed. Ids are < n_vocab (the engine
 *   checks). The sampling kernels then read r instead of l for everything but lse and logprobs;
 *   a row left with no finite value samples TL_TOKEN_NONE_ALLOWED. */
__device__ __forceinline__ bool row_restricted(const tl_sample_params &P) {
    return P.n_bias > 0 || P.allow != nullptr;
}

/* The row the sampler draws from: the restricted copy, or the logits themselves. */
__device__ __forceinline__ const float *draw_row(const float *lg, const float *restricted, int row,
                                                 int V, const tl_sample_params &P) {
    return restricted && row_restricted(P) ? restricted + (size_t)row * V : lg;
}

__device__ __forceinline__ bool allowed(const uint32_t *allow, int i) {
    return !allow || ((allow[i >> 5] >> (i & 31)) & 1u);
}

__global__ void __launch_bounds__(SB)
    sample_restrict_copy_kernel(float *restricted, const float *logits, int V,
                                const tl_sample_params *params) {
    int row = blockIdx.y, i = blockIdx.x * SB + threadIdx.x;
    tl_sample_params P = params[row];
    if (!row_restricted(P) || i >= V) return;
    float l = logits[(size_t)row * V + i];
    restricted[(size_t)row * V + i] = allowed(P.allow, i) ? l : -INFINITY;
}

__global__ void __launch_bounds__(SB)
    sample_restrict_bias_kernel(float *restricted, const float *logits, int V,
                                const tl_sample_params *params) {
    __shared__ int sid[TL_MAX_LOGIT_BIAS];
    __shared__ float sval[TL_MAX_LOGIT_BIAS];
    int row = blockIdx.x, j = threadIdx.x;
    tl_sample_params P = params[row];
    int n = min(P.n_bias, TL_MAX_LOGIT_BIAS);
    if (n <= 0) return;
    if (j < n) sid[j] = P.bias_ids[j], sval[j] = P.bias_vals[j];
    __syncthreads();
    if (j >= n) return;
    int id = sid[j];
    if (id < 0 || id >= V || !allowed(P.allow, id)) return;
    for (int k = 0; k < j; k++)
        if (sid[k] == id) return; /* an earlier pair owns this id */
    float b = sval[j];
    for (int k = j + 1; k < n; k++)
        if (sid[k] == id) b += sval[k];
    restricted[(size_t)row * V + id] = logits[(size_t)row * V + id] + b;
}

/* ====== The two-pass path (greedy, or top-k <= FK, no top logprobs) ======
 * sample_part_kernel: the row is cut into np parts of consecutive ids (np = FP, or FP_FEW when a
 *   launch has few rows and every top-k <= FK_FEW: more SMs for the one pass over the row), one
 *   block each; a part records its raw max and sum of exp (for the log-sum-exp), its argmax of
 *   pen(l) (greedy), or its own top-k of l' = pen(l) / T, sorted (value desc, id asc), so the
 *   true top-k is among the np * k candidates.
 * sample_merge_kernel: one block per row merges the parts: lse; greedy: the best argmax; sampled:
 *   the candidates at or above the k-th largest part maximum (a lower bound of the k-th largest
 *   candidate) sorted, the top k, then min-p (relative to the best),
 *   the 40-nat window and top-p over the survivors exactly (the smallest most-likely-first set
 *   holding top_p of their mass, as the host sampler), and the draw: argmax of l' + Gumbel(key,
 *   id) over the survivors, the same draw as sample_kernel's.
 * Bytes: one pass over the row (1 MB), spread over np SMs; the merge reads np * k candidates.
 * The part kernel's VEC variant (the default for vocabularies of whole float4s; TL_SAMPLE_VEC=0
 * for the scalar loop) reads its part as float4s, VEC (4, or 2 at FP_FEW parts) in flight a
 * thread, parts a multiple of 4 ids; its log-sum-exp uses fast exponentials (fma + ex2.approx.ftz:
 * the sum's relative error ~1e-6), and its top-k pre-filter the bound warps_kth, past which only
 * threads holding a candidate scan. The part kernel is bound by instruction issue: at 256 rows
 * the scalar loop issues ~80% of the time at ~25% of DRAM (320 us on the H100); VEC = 4 runs
 * 94 M warp instructions (the scalar loop ~260 M, the first float4 loop 120 M), 138 us
 * (BENCHMARKS.md 2026-12-06 session 16).
 * Rows with top-k = 0 or > FK, or with top logprobs, stay on sample_kernel (it skips the others).
 * Sorting without block-wide networks where the sets are small: the part's threshold (block_kth:
 * warp sorts in registers, then ranks by binary search), its candidates ranked by counting
 * (emit_sorted), the merge's candidates cut at the k-th largest part maximum (merge_gather).
 * Tested in test_kernels.c: test_sample_* (greedy, distribution at V = 8 and at full V for
 * batch 1 (128 parts), 64 and 256 (32 parts) against the exact law, determinism, penalties,
 * poisoned rows; laws at 32 and 128 parts against the host's). */
#define FP       32  /* parts per row */
#define FP_FEW   128 /* parts per row of a launch of at most FEW_ROWS rows, every top-k <= FK_FEW */
#define FEW_ROWS 8
#define FK_FEW   32
#define CMAX     4096 /* most candidates a merge sorts: FP * FK and FP_FEW * FK_FEW */
#define PU       4    /* ids a part thread loads before using them */
#define FK       64   /* largest top-k on the two-pass path */
#define FT       256  /* threads of a part block */
#define FCH      7808 /* most ids a part holds (FP * FCH >= the vocabulary, multiple of FT) */

struct part_rec {
    float m, s; /* raw max and sum of exp(l - m) over the part */
    float gv;   /* greedy: best pen(l); sampled: unused */
    int gi, nc; /* greedy: its id; sampled: candidates written */
};

/* fast: the launch's rows are long enough for the parts' scratch layout (tl_gpu_sample). */
__host__ __device__ __forceinline__ bool fast_row(const tl_sample_params &P, int fast) {
    return fast && P.n_logprobs <= 0 && (P.temperature <= 0.0f || (P.top_k >= 1 && P.top_k <= FK));
}

/* Order-preserving map of a float to u32 (larger float, larger key; NaN never occurs here). */
__device__ __forceinline__ uint32_t fkey(float f) {
    uint32_t u = __float_as_uint(f); /* negative: ~u; else u with the sign bit set */
    return u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u);
}
/* fkey's inverse. */
__device__ __forceinline__ float key_val(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

/* A row's scratch (stride floats a row: 2 * n_vocab for tl_gpu_sample, PART_SCR(np) for the
 * laws): np part records, then np * FK candidates. */
#define PART_SCR(np) ((np) * (int)(sizeof(part_rec) / 4) + 2 * (np)*FK)
#define LAW_SCR      PART_SCR(FP)
__device__ __forceinline__ part_rec *part_recs(float *scratch, int row, size_t stride) {
    return (part_rec *)(scratch + (size_t)row * stride);
}
__device__ __forceinline__ float2 *part_cands(float *scratch, int row, size_t stride, int np) {
    return (float2 *)(scratch + (size_t)row * stride + np * (sizeof(part_rec) / 4));
}

/* A law row's count of token i: the slot's, with the row's adjustments (tl_gpu_sample_law). */
__device__ __forceinline__ int adj_count(int c, int i, const int32_t *adj) {
    for (int a = 0; a < TL_LAW_ADJ; a++) {
        int v = adj[a];
        if (v > 0 && v - 1 == i) c += 1;
        if (v < 0 && -v - 1 == i) c -= 1;
    }
    return c;
}

/* The key of the k-th largest of keys[0..n) (radix select, 8 bits a round) and how many keys
 * equal to it belong to the top k. All FT threads; hist: 256 ints of shared memory. */
__device__ void radix_kth(const uint32_t *keys, int n, int k, int *hist, uint32_t *kth, int *n_eq) {
    __shared__ uint32_t s_prefix;
    __shared__ int s_need;
    uint32_t prefix = 0, mask = 0;
    int need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += FT) hist[d] = 0;
        __syncthreads();
        for (int i0 = 0; i0 < n; i0 += FT) { /* warp-aggregated: most keys share a digit */
            int i = i0 + threadIdx.x;
            bool in = i < n && (keys[i] & mask) == prefix;
            int d = in ? (int)((keys[i] >> shift) & 255) : -1 - (int)(threadIdx.x & 31);
            unsigned same = __match_any_sync(0xffffffffu, d);
            if (in && (threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&hist[d], __popc(same));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int cum = 0, d = 255;
            for (; d > 0; d--) {
                if (cum + hist[d] >= need) break;
                cum += hist[d];
            }
            s_prefix = prefix | ((uint32_t)d << shift), s_need = need - cum;
        }
        __syncthreads();
        prefix = s_prefix, need = s_need, mask |= 255u << shift;
        __syncthreads();
    }
    *kth = prefix, *n_eq = need;
}

/* Bitonic sort of a[0..n) (n a power of two) by key (.x) descending, index (.y) ascending; all
 * threads of the block. */
__device__ void sort_pairs(uint2 *a, int n) {
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
                int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                uint2 x = a[lo], y = a[hi];
                bool x_first = x.x > y.x || (x.x == y.x && x.y < y.y);
                if (x_first != ((lo & size) == 0)) a[lo] = y, a[hi] = x;
            }
        }
    __syncthreads();
}

#define FCAND 1024 /* candidates of a part sorted directly (more: the radix select) */

/* The k-th largest (1 <= k <= FT) of the FT threads' keys v; every thread gets it. Each warp sorts
 * its 32 keys in registers (bitonic, descending); a key's rank is then its place in its warp plus,
 * for every other warp, how many of that warp's keys come before it (a binary search; equal keys
 * of lower warps come first). No block-wide sorting network: 2 barriers. */
__device__ uint32_t block_kth(uint32_t v, int k) {
    __shared__ uint32_t sw[FT];
    __shared__ uint32_t s_kth;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int id = lane;
    for (int size = 2; size <= 32; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            uint32_t ov = __shfl_xor_sync(0xffffffffu, v, stride);
            int oid = __shfl_xor_sync(0xffffffffu, id, stride);
            bool mine_first = v > ov || (v == ov && id < oid);
            bool lower = (lane & stride) == 0, desc = (lane & size) == 0;
            if ((lower == desc) != mine_first) v = ov, id = oid;
        }
    sw[threadIdx.x] = v;
    __syncthreads();
    int rank = lane;
    for (int x = 0; x < FT / 32; x++) {
        if (x == w) continue;
        const uint32_t *o = sw + x * 32;
        int lo = 0, hi = 32; /* count of o[] before v: o[j] > v, or >= v for a lower warp */
        while (lo < hi) {
            int mid = (lo + hi) >> 1;
            bool before = x < w ? o[mid] >= v : o[mid] > v;
            if (before)
                lo = mid + 1;
            else
                hi = mid;
        }
        rank += lo;
    }
    if (rank == k - 1) s_kth = v;
    __syncthreads();
    return s_kth;
}

/* pairs[0..n) (key, local id) sorted (key desc, id asc); the first k (k <= n) into cand as
 * (value, i0 + id). Up to 2 * FT pairs by counting each one's rank (one barrier), more by the
 * bitonic network (n <= FCAND; pairs padded to a power of two). */
__device__ void emit_sorted(uint2 *pairs, int n, int k, int i0, float2 *cand) {
    if (n <= 2 * FT) {
        for (int i = threadIdx.x; i < n; i += FT) {
            uint2 p = pairs[i];
            int r = 0;
            for (int j = 0; j < n; j++) {
                uint2 q = pairs[j];
                r += q.x > p.x || (q.x == p.x && q.y < p.y);
            }
            if (r < k) cand[r] = make_float2(key_val(p.x), __int_as_float(i0 + (int)p.y));
        }
        return;
    }
    int n2 = FT;
    while (n2 < n) n2 <<= 1;
    for (int i = n + threadIdx.x; i < n2; i += FT) pairs[i] = make_uint2(0u, 0x7fffffffu);
    sort_pairs(pairs, n2);
    for (int i = threadIdx.x; i < k; i += FT)
        cand[i] = make_float2(key_val(pairs[i].x), __int_as_float(i0 + (int)pairs[i].y));
}

/* Exclusive prefix of c over the block (FT threads) into *off; returns the total. s_cnt: FT / 32
 * ints of shared memory. */
__device__ int block_prefix(int c, int *off, int *s_cnt) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, inc = c;
    for (int o = 1; o < 32; o <<= 1) {
        int a = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += a;
    }
    __syncthreads();
    if (lane == 31) s_cnt[w] = inc;
    __syncthreads();
    int o = inc - c, total = 0;
    for (int x = 0; x < FT / 32; x++) o += x < w ? s_cnt[x] : 0, total += s_cnt[x];
    *off = o;
    return total;
}

/* The part's top k keys (k >= 1) when more than FCAND keys passed a pre-filter (mass ties): the
 * k-th key by radix_kth, then the keys above it and the first of those equal to it (by id),
 * sorted into cand (value, id). */
__device__ void part_topk_radix(const uint32_t *keys, int n, int k, int i0, float2 *cand,
                                uint2 *pairs, int *hist, int *s_cnt) {
    int q = CEIL_DIV(n, FT), j0 = min(n, (int)threadIdx.x * q), j1 = min(n, j0 + q);
    uint32_t kth;
    int n_eq;
    radix_kth(keys, n, k, hist, &kth, &n_eq);
    int gt = 0, eq = 0, og, oe;
    for (int j = j0; j < j1; j++) gt += keys[j] > kth, eq += keys[j] == kth;
    int tg = block_prefix(gt, &og, s_cnt);
    block_prefix(eq, &oe, s_cnt);
    for (int j = j0; j < j1; j++) {
        if (keys[j] > kth)
            pairs[og++] = make_uint2(keys[j], j);
        else if (keys[j] == kth && oe < n_eq)
            pairs[tg + oe++] = make_uint2(keys[j], j);
    }
    __syncthreads();
    emit_sorted(pairs, k, k, i0, cand);
}

/* The part's top k keys (k >= 1) into cand (value, id), sorted (value desc, id asc). Pre-filter:
 * the k-th largest of the threads' own maxima is <= the k-th largest key (k threads hold a key at
 * least that large), so every top-k key is >= it; those candidates (usually about k) are ranked
 * directly. A part with more than FCAND of them (mass ties) goes through radix_kth. */
__device__ void part_topk(const uint32_t *keys, int n, int k, uint32_t tmax, int i0, float2 *cand,
                          uint2 *pairs, int *hist, int *s_cnt) {
    uint32_t t0 = block_kth(tmax, k);
    int q = CEIL_DIV(n, FT), j0 = min(n, (int)threadIdx.x * q), j1 = min(n, j0 + q), c = 0, off;
    for (int j = j0; j < j1; j++) c += keys[j] >= t0;
    int total = block_prefix(c, &off, s_cnt);
    if (total > FCAND) return part_topk_radix(keys, n, k, i0, cand, pairs, hist, s_cnt);
    for (int j = j0; j < j1; j++)
        if (keys[j] >= t0) pairs[off++] = make_uint2(keys[j], j);
    __syncthreads();
    emit_sorted(pairs, total, k, i0, cand);
}

/* A lower bound of the k-th largest of the part's keys (1 <= k <= FK) from the threads' maxima v:
 * each warp's kw = ceil(k / 8) largest (kw rounds of a warp max whose holder drops out), then
 * the k-th largest of those 8 kw values, ranked by counting in one or two warps. The top k of
 * them are maxima of k distinct threads, so at least k keys reach it; a thread without keys (v =
 * 0) can only make the bound 0. Two barriers. (The least of the warps' kw-th largest, the bound
 * first used here, is looser, and the part's sort of its candidates costs their count squared.) */
__device__ uint32_t warps_kth(uint32_t v, int k) {
    __shared__ uint32_t s_w[FK], s_t; /* 8 kw <= 8 ceil(FK / 8) = FK values */
    const int kw = CEIL_DIV(k, FT / 32), nv = kw * (FT / 32), lane = threadIdx.x & 31;
    for (int i = 0; i < kw; i++) {
        uint32_t m = __reduce_max_sync(0xffffffffu, v);
        unsigned hold = __ballot_sync(0xffffffffu, v == m);
        if (lane == __ffs(hold) - 1) v = 0u;
        if (lane == 0) s_w[(threadIdx.x >> 5) * kw + i] = m;
    }
    __syncthreads();
    if ((int)threadIdx.x < nv) {
        const int me = threadIdx.x;
        const uint32_t x = s_w[me];
        int r = 0; /* values before x: larger, or equal at a lower index */
        for (int j = 0; j < nv; j++) r += s_w[j] > x || (s_w[j] == x && j < me);
        if (r == k - 1) s_t = x;
    }
    __syncthreads();
    return s_t;
}

/* part_topk for the VEC part loop, whose thread tid owns the float4s tid, tid + FT, ... of keys
 * (and id 4 n4 + tid of the tail): the cheaper bound warps_kth, and only threads whose own
 * maximum reaches it look at their keys again. */
__device__ void part_topk_vec(const uint32_t *keys, int n, int k, uint32_t tmax, int i0,
                              float2 *cand, uint2 *pairs, int *hist, int *s_cnt) {
    const uint32_t t0 = warps_kth(tmax, k);
    const int n4 = n >> 2, tid = threadIdx.x;
    const uint4 *k4 = (const uint4 *)keys;
    int c = 0, off;
    if (tmax >= t0) {
        for (int f = tid; f < n4; f += FT) {
            uint4 q = k4[f];
            c += (q.x >= t0) + (q.y >= t0) + (q.z >= t0) + (q.w >= t0);
        }
        for (int j = 4 * n4 + tid; j < n; j += FT) c += keys[j] >= t0;
    }
    int total = block_prefix(c, &off, s_cnt);
    if (total > FCAND) return part_topk_radix(keys, n, k, i0, cand, pairs, hist, s_cnt);
    if (c > 0) {
        for (int f = tid; f < n4; f += FT) {
            uint4 q = k4[f];
            if (q.x >= t0) pairs[off++] = make_uint2(q.x, 4 * f);
            if (q.y >= t0) pairs[off++] = make_uint2(q.y, 4 * f + 1);
            if (q.z >= t0) pairs[off++] = make_uint2(q.z, 4 * f + 2);
            if (q.w >= t0) pairs[off++] = make_uint2(q.w, 4 * f + 3);
        }
        for (int j = 4 * n4 + tid; j < n; j += FT)
            if (keys[j] >= t0) pairs[off++] = make_uint2(keys[j], j);
    }
    __syncthreads();
    emit_sorted(pairs, total, k, i0, cand);
}

/* LAW (tl_gpu_sample_law): row r reads logits row row_of[r] and its counts with adj's
 * adjustments; no restrictions. */
template <bool LAW, int VEC>
__global__ void __launch_bounds__(FT)
    sample_part_kernel(const float *logits, const float *restricted, int V, int n_valid,
                       const tl_sample_params *params, const int32_t *counts,
                       const uint32_t *count_bits, const int32_t *count_slot, float *scratch,
                       int fast, const int32_t *row_of, const int32_t *adj_rows, size_t stride,
                       int np) {
    __shared__ float sbuf[32];
    __shared__ int sibuf[32], hist[256], s_cnt[FT / 32 * 2];
    __shared__ __align__(16) uint32_t keys[FCH];
    __shared__ uint2 pairs[FCAND];
    int row = blockIdx.y, part = blockIdx.x, tid = threadIdx.x;
    tl_sample_params P = params[row];
    if (!fast_row(P, fast)) return;
    const float *lg = logits + (size_t)(LAW ? row_of[row] : row) * V;
    const float *ls = LAW ? lg : draw_row(lg, restricted, row, V, P);
    int cslot = count_slot ? count_slot[row] : row;
    const int32_t *cnt = counts ? counts + (size_t)cslot * V : NULL;
    const uint32_t *cb =
        cnt && count_bits ? count_bits + (size_t)cslot * TL_GPU_COUNT_WORDS(V) : NULL;
    int32_t adj[TL_LAW_ADJ];
    for (int a = 0; a < TL_LAW_ADJ; a++)
        adj[a] = LAW && adj_rows ? adj_rows[row * TL_LAW_ADJ + a] : 0;
    /* VEC (the default, launched only for a vocabulary that is a multiple of 4): rows start
     * 16-byte aligned, so the parts are whole float4s */
    int per = CEIL_DIV(n_valid, np);
    if (VEC) per = (per + 3) & ~3;
    int i0 = min(n_valid, part * per), n = min(n_valid, i0 + per) - i0;
    float m = -INFINITY, s = 0.0f, invT = P.temperature > 0.0f ? 1.0f / P.temperature : 1.0f;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    uint32_t tmax = 0; /* this thread's largest key */
    /* the penalised value of id i0 + j, drawn-from value r, count c (the law's adjustments) */
    auto pen = [&](float r, int c, int j) {
        return cnt ? apply_pen(r, LAW ? adj_count(c, i0 + j, adj) : c, P) : r;
    };
    /* id i0 + j: raw logit l, drawn-from value r, count c */
    auto elem = [&](int j, float l, float r, int c) {
        float lp = pen(r, c, j);
        float mn = fmaxf(m, l);
        s = s * expf(m - mn) + expf(l - mn), m = mn; /* online: fixed order per thread */
        if (P.temperature <= 0.0f) {
            if (am_better(lp, i0 + j, bv, bi)) bv = lp, bi = i0 + j;
        } else {
            keys[j] = fkey(lp * invT);
            tmax = max(tmax, keys[j]);
        }
    };
    /* a count only where its bit says it may be non-zero (no bits: read all) */
    auto count_at = [&](uint32_t w, int j) {
        return cnt && ((w >> ((i0 + j) & 31)) & 1u) ? cnt[i0 + j] : 0;
    };
    if (VEC) {
        /* float4 f = ids 4f .. 4f + 3 of the part; thread tid takes f = tid, tid + FT, ...; PU4
         * of them loaded before any is used (loads in flight). Per float4: the online sum takes
         * the max of the four first (one rescale at most) and e^(l - m) = 2^(l log2e - m log2e)
         * (one fma and one ex2.approx.ftz each; mL = m log2e rounded once, a common factor of
         * every term: the sum's relative error ~1e-6); counts are read only where the float4's
         * four count bits say one may be non-zero; keys are stored as one uint4. The ids past
         * the last whole float4 (the last part only) go through elem, one a thread; elem's own
         * online sum continues from (m, s). */
        const int n4 = n >> 2;
        const bool greedy = P.temperature <= 0.0f, rrow = ls != lg; /* hoisted: loop-invariant */
        const float L2E = 1.4426950408889634f;
        const float4 *l4 = (const float4 *)(lg + i0), *r4 = (const float4 *)(ls + i0);
        uint4 *keys4 = (uint4 *)keys;
        float mL = -INFINITY; /* m log2e */
        constexpr int PU4 = VEC > 0 ? VEC : 1;
        for (int f0 = tid; f0 < n4; f0 += PU4 * FT) {
            float4 lv[PU4];
            uint32_t cw[PU4]; /* the count-bit word of the float4's ids (one word: 4-aligned) */
#pragma unroll
            for (int u = 0; u < PU4; u++) {
                int f = f0 + u * FT;
                bool in = f < n4;
                lv[u] = in ? l4[f] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                cw[u] = in && cb ? cb[(i0 + 4 * f) >> 5] : 0xffffffffu;
            }
#pragma unroll
            for (int u = 0; u < PU4; u++) {
                const int f = f0 + u * FT, j = 4 * f;
                if (f >= n4) break;
                const float4 l = lv[u];
                float4 p = rrow ? r4[f] : l;
                float c4 = fmaxf(fmaxf(l.x, l.y), fmaxf(l.z, l.w));
                if (c4 > m) { /* m = -inf: s is 0 */
                    float cL = c4 * L2E;
                    s *= ex2_fast(mL - cL), m = c4, mL = cL;
                }
                if (m > -INFINITY)
                    s += (ex2_fast(fmaf(l.x, L2E, -mL)) + ex2_fast(fmaf(l.y, L2E, -mL))) +
                         (ex2_fast(fmaf(l.z, L2E, -mL)) + ex2_fast(fmaf(l.w, L2E, -mL)));
                if (cnt && (LAW || ((cw[u] >> ((i0 + j) & 31)) & 15u))) {
                    p.x = pen(p.x, count_at(cw[u], j), j);
                    p.y = pen(p.y, count_at(cw[u], j + 1), j + 1);
                    p.z = pen(p.z, count_at(cw[u], j + 2), j + 2);
                    p.w = pen(p.w, count_at(cw[u], j + 3), j + 3);
                }
                if (greedy) {
                    if (am_better(p.x, i0 + j, bv, bi)) bv = p.x, bi = i0 + j;
                    if (am_better(p.y, i0 + j + 1, bv, bi)) bv = p.y, bi = i0 + j + 1;
                    if (am_better(p.z, i0 + j + 2, bv, bi)) bv = p.z, bi = i0 + j + 2;
                    if (am_better(p.w, i0 + j + 3, bv, bi)) bv = p.w, bi = i0 + j + 3;
                } else {
                    uint4 k4 = make_uint4(fkey(p.x * invT), fkey(p.y * invT), fkey(p.z * invT),
                                          fkey(p.w * invT));
                    keys4[f] = k4;
                    tmax = max(tmax, max(max(k4.x, k4.y), max(k4.z, k4.w)));
                }
            }
        }
        for (int j = 4 * n4 + tid; j < n; j += FT) {
            uint32_t w = cb ? cb[(i0 + j) >> 5] : 0xffffffffu;
            elem(j, lg[i0 + j], ls[i0 + j], count_at(w, j));
        }
    } else {
        /* ids tid, tid + FT, ... in order; PU of them loaded before any is used */
        for (int j0 = tid; j0 < n; j0 += PU * FT) {
            float lv[PU], rv[PU];
            int cv[PU];
            uint32_t cw[PU]; /* the count-bit words of the ids (all ones without bits) */
#pragma unroll
            for (int u = 0; u < PU; u++) {
                int j = j0 + u * FT;
                bool in = j < n;
                lv[u] = in ? lg[i0 + j] : 0.0f;
                rv[u] = in && ls != lg ? ls[i0 + j] : lv[u];
                cw[u] = in && cb ? cb[(i0 + j) >> 5] : 0xffffffffu;
            }
#pragma unroll
            for (int u = 0; u < PU; u++) cv[u] = j0 + u * FT < n ? count_at(cw[u], j0 + u * FT) : 0;
#pragma unroll
            for (int u = 0; u < PU; u++) {
                int j = j0 + u * FT;
                if (j >= n) break;
                elem(j, lv[u], rv[u], cv[u]);
            }
        }
    }
    float M = block_max(m, sbuf);
    float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), sbuf);
    part_rec *rec = part_recs(scratch, row, stride) + part;
    if (P.temperature <= 0.0f) {
        argmax_t a = block_argmax(bv, bi, sbuf, sibuf);
        if (tid == 0) rec->m = M, rec->s = S, rec->gv = a.v, rec->gi = a.i, rec->nc = 0;
        return;
    }
    __syncthreads();
    int k = min(P.top_k, n);
    if (k > 0)
        (VEC ? part_topk_vec : part_topk)(keys, n, k, tmax, i0,
                                          part_cands(scratch, row, stride, np) + part * FK, pairs,
                                          hist, s_cnt);
    if (tid == 0) rec->m = M, rec->s = S, rec->nc = k;
}

/* Bitonic sort of c[0..n) (n a power of two <= 2 * blockDim) by value desc, id asc. */
__device__ void sort_cands(float2 *c, int n) {
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
                int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                bool up = ((lo & size) == 0);
                float2 a = c[lo], b = c[hi];
                bool a_first =
                    a.x > b.x || (a.x == b.x && __float_as_int(a.y) < __float_as_int(b.y));
                if (a_first != up) c[lo] = b, c[hi] = a;
            }
        }
    __syncthreads();
}

/* One row's law (LAW) from the merged candidates: the first `keep` of c (sorted) with their
 * probabilities renormalised over them (ex[i] = e^(c[i] - c[0]), in double), and their logprobs
 * under the unmodified logits. */
__device__ void write_law(tl_law *law, const float2 *c, const double *ex, int keep, const float *lg,
                          float lse) {
    __shared__ double s_tot;
    if (threadIdx.x == 0) {
        double tot = 0;
        for (int i = 0; i < keep; i++) tot += ex[i];
        s_tot = tot, law->n = keep;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < keep; i += blockDim.x) {
        int id = __float_as_int(c[i].y);
        law->id[i] = id;
        law->p[i] = (float)(ex[i] / s_tot);
        law->lp[i] = lg[id] - lse;
    }
}

/* The merge's lse from the np part records: lane l folds records l, l + 32, ... in order, then
 * the warp combines the lanes (a fixed order: the same records, the same result). */
__device__ float merge_lse(const part_rec *rec, int np) {
    int lane = threadIdx.x & 31;
    float m = -INFINITY, s = 0.0f, rm[FP_FEW / 32], rs[FP_FEW / 32];
#pragma unroll
    for (int u = 0; u < FP_FEW / 32; u++) {
        int p = lane + 32 * u;
        rm[u] = p < np ? rec[p].m : -INFINITY, rs[u] = p < np ? rec[p].s : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < FP_FEW / 32; u++) {
        float mn = fmaxf(m, rm[u]);
        if (mn == -INFINITY) continue;
        s = (m == -INFINITY ? 0.0f : s * expf(m - mn)) +
            (rm[u] == -INFINITY ? 0.0f : rs[u] * expf(rm[u] - mn));
        m = mn;
    }
    float M = warp_max(m);
    float S = warp_sum(m == -INFINITY ? 0.0f : s * expf(m - M));
    return M + logf(S);
}

/* Gathers into c (sorted: value desc, id asc) every part candidate at or above L, the kk-th
 * largest part maximum (-inf with fewer than kk non-empty parts): kk candidates are >= L, so the
 * top kk are among them. Returns their count, or -1 past CMAX (cannot happen for the launch
 * shapes tl_gpu_sample picks: np * kk <= CMAX). */
__device__ int merge_gather(const part_rec *rec, const float2 *pc, int np, int kk, float2 *c) {
    __shared__ float s_pm[FP_FEW];
    __shared__ float s_L;
    __shared__ int s_cnt[FT / 32];
    int tid = threadIdx.x;
    float pm = tid < np && rec[tid].nc > 0 ? pc[tid * FK].x : -INFINITY;
    if (tid < np) s_pm[tid] = pm;
    if (tid == 0) s_L = -INFINITY;
    __syncthreads();
    if (tid < np && pm > -INFINITY) {
        int r = 0;
        for (int q = 0; q < np; q++) r += s_pm[q] > pm || (s_pm[q] == pm && q < tid);
        if (r == kk - 1) s_L = pm;
    }
    __syncthreads();
    float L = s_L;
    int nsel = 0, off;
    const float2 *q = pc + tid * FK;
    if (tid < np) { /* a prefix of the part's sorted list; 8 values loaded at a time */
        int nc = rec[tid].nc;
        for (int j0 = 0; j0 < nc; j0 += 8) {
            float v[8];
            int cn = 0;
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = j0 + u < nc ? q[j0 + u].x : -INFINITY;
#pragma unroll
            for (int u = 0; u < 8; u++) cn += j0 + u < nc && v[u] >= L;
            nsel += cn;
            if (cn < 8) break;
        }
    }
    int total = block_prefix(nsel, &off, s_cnt);
    if (total > CMAX) return -1;
#pragma unroll 4
    for (int j = 0; j < nsel; j++) c[off + j] = q[j];
    int n2 = 1;
    while (n2 < total) n2 <<= 1;
    for (int i = total + tid; i < n2; i += FT)
        c[i] = make_float2(-INFINITY, __int_as_float(0x7fffffff));
    sort_cands(c, n2);
    return total;
}

/* LAW (tl_gpu_sample_law): writes laws[row] instead of drawing; row r reads logits row_of[r]. */
template <bool LAW>
__global__ void __launch_bounds__(FT)
    sample_merge_kernel(tl_sample_out *out, const float *logits, int V,
                        const tl_sample_params *params, const uint64_t *keys, float *scratch,
                        int fast, tl_law *laws, const int32_t *row_of, size_t stride, int np) {
    __shared__ float2 c[CMAX];
    __shared__ double ex[FK];
    __shared__ float sbuf[32];
    __shared__ int sibuf[32];
    int row = blockIdx.x, tid = threadIdx.x;
    tl_sample_params P = params[row];
    if (!fast_row(P, fast)) return;
    const part_rec *rec = part_recs(scratch, row, stride);
    const float *lg = logits + (size_t)(LAW ? row_of[row] : row) * V;
    int lane = tid & 31;
    float lse = merge_lse(rec, np);
    tl_sample_out *o = LAW ? NULL : out + row;
    tl_law *law = LAW ? laws + row : NULL;
    if (!isfinite(lse)) { /* NaN from a NaN or +inf logit: no distribution */
        if (tid == 0 && LAW) law->n = 0;
        if (tid == 0 && !LAW) o->token = -1, o->logprob = NAN, o->n_top = 0;
        return;
    }
    int token;
    if (P.temperature <= 0.0f) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int p = lane; p < np; p += 32)
            if (am_better(rec[p].gv, rec[p].gi, bv, bi)) bv = rec[p].gv, bi = rec[p].gi;
        for (int d = 16; d > 0; d >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, d);
            int oi = __shfl_xor_sync(0xffffffffu, bi, d);
            if (am_better(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        token = bv == -INFINITY ? TL_TOKEN_NONE_ALLOWED : bi;
        if (LAW) {
            if (tid == 0) {
                law->n = token >= 0, law->id[0] = token, law->p[0] = 1.0f;
                law->lp[0] = token >= 0 ? lg[token] - lse : NAN;
            }
            return;
        }
    } else {
        int n = merge_gather(rec, part_cands(scratch, row, stride, np), np, P.top_k, c);
        if (n < 0 || c[0].x == -INFINITY) {
            /* the restrictions left nothing (block-uniform), or more candidates than the merge
             * holds (a launch shape tl_gpu_sample never picks): no token */
            if (tid == 0 && LAW) law->n = 0;
            if (tid == 0 && !LAW)
                o->token = n < 0 ? -1 : TL_TOKEN_NONE_ALLOWED, o->logprob = NAN, o->n_top = 0;
            return;
        }
        /* survivors: the top k, within 40 nats and min-p of the best, then the top-p prefix */
        int kk = min(P.top_k, n);
        float best = c[0].x, floor_v = best - CAND_WINDOW;
        if (P.min_p > 0.0f) floor_v = fmaxf(floor_v, best + logf(P.min_p));
        for (int i = tid; i < kk; i += FT) ex[i] = exp((double)c[i].x - best);
        __shared__ int s_keep;
        __syncthreads();
        if (tid == 0) {
            int keep = 0;
            double tot = 0, cum = 0;
            while (keep < kk && c[keep].x >= floor_v) tot += ex[keep], keep++;
            if (P.top_p > 0.0f && P.top_p < 1.0f) {
                int k2 = 0;
                while (k2 < keep) {
                    cum += ex[k2++];
                    if (cum >= (double)P.top_p * tot) break;
                }
                keep = k2;
            }
            s_keep = keep < 1 ? 1 : keep;
        }
        __syncthreads();
        if (LAW) {
            write_law(law, c, ex, s_keep, lg, lse);
            return;
        }
        uint64_t key = keys[row];
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = tid; i < s_keep; i += FT) {
            int id = __float_as_int(c[i].y);
            float sc = c[i].x + (float)(-log(-log(rng_uniform(key, id))));
            if (am_better(sc, id, bv, bi)) bv = sc, bi = id;
        }
        token = block_argmax(bv, bi, sbuf, sibuf).i;
    }
    if (tid == 0) {
        o->token = token;
        o->logprob = token >= 0 ? lg[token] - lse : NAN;
        o->n_top = 0;
    }
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
    sample_kernel(tl_sample_out *out, const float *logits, const float *restricted, int V,
                  int n_valid, const tl_sample_params *params, const uint64_t *keys,
                  const int32_t *counts, const int32_t *count_slot, float *scratch, int fast) {
    __shared__ float sbuf[32];
    __shared__ int sibuf[32];
    __shared__ int s_off[SB / 32];
    int row = blockIdx.x, tid = threadIdx.x;
    const float *lg = logits + (size_t)row * V;
    const int32_t *cnt = counts ? counts + (size_t)(count_slot ? count_slot[row] : row) * V : NULL;
    tl_sample_params P = params[row];
    if (fast_row(P, fast)) return; /* sample_part_kernel + sample_merge_kernel took it */
    const float *ls = draw_row(lg, restricted, row, V, P);
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
    tl_sample_out *o = out + row;
    if (P.temperature <= 0.0f) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = tid; i < n_valid; i += SB) {
            float l = cnt ? apply_pen(ls[i], cnt[i], P) : ls[i];
            if (am_better(l, i, bv, bi)) bv = l, bi = i;
        }
        argmax_t a = block_argmax(bv, bi, sbuf, sibuf);
        token = a.v == -INFINITY ? TL_TOKEN_NONE_ALLOWED : a.i;
    } else {
        float invT = 1.0f / P.temperature;
        float mp = -INFINITY;
        for (int i = tid; i < n_valid; i += SB)
            mp = fmaxf(mp, (cnt ? apply_pen(ls[i], cnt[i], P) : ls[i]) * invT);
        mp = block_max(mp, sbuf);
        if (mp == -INFINITY) { /* the restrictions left nothing (block-uniform) */
            if (tid == 0) o->token = TL_TOKEN_NONE_ALLOWED, o->logprob = NAN, o->n_top = 0;
            return;
        }
        float theta = mp - CAND_WINDOW;
        if (P.min_p > 0.0f) theta = fmaxf(theta, mp + logf(P.min_p));
        /* compaction in index order: thread tid owns [tid*per, (tid+1)*per) */
        int per = CEIL_DIV(n_valid, SB), i0 = tid * per, i1 = min(n_valid, i0 + per), mine = 0;
        for (int i = i0; i < i1; i++)
            mine += (cnt ? apply_pen(ls[i], cnt[i], P) : ls[i]) * invT >= theta;
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
            float l = (cnt ? apply_pen(ls[i], cnt[i], P) : ls[i]) * invT;
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
    if (token < 0) { /* greedy with nothing left (block-uniform) */
        if (tid == 0) o->token = token, o->logprob = NAN, o->n_top = 0;
        return;
    }
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

/* The part kernel's loop for np parts a row (TL_SAMPLE_VEC, read once): 0 = id by id; 2 or 4 =
 * whole float4s, that many in flight a thread; default 4 at FP parts (many rows: 256 rows 148 ->
 * 138 us against 2) and 2 at FP_FEW (a thread has ~2 float4s: 1 row 6.4 against 7.6 us; H100,
 * BENCHMARKS.md 2026-12-06 session 16). float4s only for rows of whole float4s. */
static int sample_vec(int n_vocab, int np) {
    static int v = -1;
    if (v < 0)
        v = tl_env_is("TL_SAMPLE_VEC", 0)   ? 0
            : tl_env_is("TL_SAMPLE_VEC", 2) ? 2
            : tl_env_is("TL_SAMPLE_VEC", 4) ? 4
                                            : 1;
    if (n_vocab % 4) return 0;
    return v == 1 ? (np == FP_FEW ? 2 : 4) : v;
}
typedef void (*part_fn)(const float *, const float *, int, int, const tl_sample_params *,
                        const int32_t *, const uint32_t *, const int32_t *, float *, int,
                        const int32_t *, const int32_t *, size_t, int);
template <bool LAW> static part_fn part_kernel(int n_vocab, int np) {
    int v = sample_vec(n_vocab, np);
    return v == 4   ? sample_part_kernel<LAW, 4>
           : v == 2 ? sample_part_kernel<LAW, 2>
                    : sample_part_kernel<LAW, 0>;
}

/* Parts a row on the two-pass path: FP_FEW for at most FEW_ROWS rows whose params (host copies,
 * hp) are all greedy or of top-k <= FK_FEW, when a row's scratch (stride floats) holds them;
 * else FP. */
static int pick_parts(const tl_sample_params *hp, int n_rows, size_t stride) {
    if (!hp || n_rows > FEW_ROWS || stride < (size_t)PART_SCR(FP_FEW)) return FP;
    for (int r = 0; r < n_rows; r++)
        if (hp[r].temperature > 0.0f && hp[r].top_k > FK_FEW) return FP;
    return FP_FEW;
}

extern "C" int tl_gpu_sample(tl_sample_out *out, const float *logits, int n_vocab, int n_valid,
                             const tl_sample_params *params, const tl_sample_params *h_params,
                             const uint64_t *keys, const int32_t *counts,
                             const uint32_t *count_bits, const int32_t *count_slot, float *scratch,
                             float *restricted, int n_rows, const tl_gpu_stream *st) {
    if (n_rows <= 0) return 0;
    if (restricted) {
        TL_LAUNCH(st, "sample_restrict_copy", sample_restrict_copy_kernel,
                  dim3(CEIL_DIV(n_vocab, SB), n_rows), dim3(SB), 0, restricted, logits, n_vocab,
                  params);
        TL_LAUNCH(st, "sample_restrict_bias", sample_restrict_bias_kernel, dim3(n_rows), dim3(SB),
                  0, restricted, logits, n_vocab, params);
    }
    /* the two-pass path needs each part in shared memory and its records in the row's scratch */
    int np = pick_parts(h_params, n_rows, 2 * (size_t)n_vocab);
    int fast = n_valid <= np * FCH && 2 * n_vocab >= PART_SCR(np), slow = !h_params || !fast;
    for (int r = 0; h_params && fast && r < n_rows; r++) slow |= !fast_row(h_params[r], fast);
    if (fast) {
        size_t stride = 2 * (size_t)n_vocab;
        TL_LAUNCH(st, "sample_part", part_kernel<false>(n_vocab, np), dim3(np, n_rows), dim3(FT), 0,
                  logits, (const float *)restricted, n_vocab, n_valid, params, counts, count_bits,
                  count_slot, scratch, fast, (const int32_t *)NULL, (const int32_t *)NULL, stride,
                  np);
        TL_LAUNCH(st, "sample_merge", sample_merge_kernel<false>, dim3(n_rows), dim3(FT), 0, out,
                  logits, n_vocab, params, keys, scratch, fast, (tl_law *)NULL,
                  (const int32_t *)NULL, stride, np);
    }
    if (!slow) return 0; /* every row took the two-pass path */
    TL_LAUNCH(st, "sample", sample_kernel, dim3(n_rows), dim3(SB), 0, out, logits,
              (const float *)restricted, n_vocab, n_valid, params, keys, counts, count_slot,
              scratch, fast);
    return 0;
}

/* penalty_add_kernel: one thread per fed token; integer atomics, so the counts do not depend on
 * their order. */
__global__ void penalty_add_kernel(int32_t *counts, uint32_t *count_bits, int V,
                                   const int32_t *tokens, const int32_t *tok_pos,
                                   const int32_t *tok_slot, const int32_t *n_prompt, int n_tok) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tok) return;
    int tok = tokens[t], slot = tok_slot[t], np = n_prompt[slot];
    if (tok < 0 || tok >= V) return;
    int32_t *c = counts + (size_t)slot * V + tok;
    if (count_bits)
        atomicOr(count_bits + (size_t)slot * TL_GPU_COUNT_WORDS(V) + (tok >> 5), 1u << (tok & 31));
    if (np >= 0 && tok_pos[t] >= np)
        atomicAdd(c, 1);
    else
        atomicOr(c, 1 << 30);
}

/* penalty_sub_kernel: the generated tokens t.t[0..n) of one slot taken out of its counts again
 * (a speculative rollback); one thread a token. */
struct sub_tokens {
    int32_t t[TL_LAW_ADJ];
};
__global__ void penalty_sub_kernel(int32_t *counts, int V, sub_tokens t, int slot, int n_tok) {
    int i = threadIdx.x;
    if (i < n_tok && t.t[i] >= 0 && t.t[i] < V) atomicSub(counts + (size_t)slot * V + t.t[i], 1);
}

extern "C" int tl_gpu_penalty_add(int32_t *counts, uint32_t *count_bits, int n_vocab,
                                  const int32_t *tokens, const int32_t *tok_pos,
                                  const int32_t *tok_slot, const int32_t *n_prompt, int n_tok,
                                  const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    TL_LAUNCH(st, "penalty_add", penalty_add_kernel, dim3(CEIL_DIV(n_tok, 256)), dim3(256), 0,
              counts, count_bits, n_vocab, tokens, tok_pos, tok_slot, n_prompt, n_tok);
    return 0;
}

extern "C" int tl_gpu_penalty_sub(int32_t *counts, int n_vocab, const int32_t *tokens, int slot,
                                  int n_tok, const tl_gpu_stream *st) {
    if (n_tok <= 0) return 0;
    if (n_tok > TL_LAW_ADJ) return TL_ERR_INVALID;
    sub_tokens t;
    for (int i = 0; i < n_tok; i++) t.t[i] = tokens[i];
    TL_LAUNCH(st, "penalty_sub", penalty_sub_kernel, dim3(1), dim3(32), 0, counts, n_vocab, t, slot,
              n_tok);
    return 0;
}

/* tl_gpu_draft_pick: one thread an entry; the draw is tl_law_pick's (engine/sample.c), term for
 * term. */
__global__ void draft_pick_kernel(tl_gpu_chain *ch, const tl_law *laws, int j, int n,
                                  int32_t *next_tok, int32_t *adj) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    tl_gpu_chain *c = ch + i;
    const tl_law *q = laws + i;
    int32_t tok = c->tok;
    if (c->live && q->n < 1) c->live = 0;
    if (c->live) {
        if (c->greedy || q->n == 1) {
            tok = q->id[0];
        } else {
            double tot = 0, acc = 0;
            for (int a = 0; a < q->n; a++) tot += q->p[a];
            double u = c->u[c->n_draws++] * tot;
            int last = 0, hit = -1;
            for (int a = 0; a < q->n && hit < 0; a++) {
                if (q->p[a] <= 0) continue;
                acc += q->p[a], last = a;
                if (u < acc) hit = a;
            }
            tok = q->id[hit >= 0 ? hit : last];
        }
        c->drafts[j] = tok, c->n_drafted = j + 1, c->tok = tok;
        if (j + 1 >= c->k) c->live = 0;
    }
    if (next_tok) next_tok[i] = tok;
    if (adj && j + 1 < TL_LAW_ADJ) adj[(size_t)i * TL_LAW_ADJ + j + 1] = tok + 1;
}

extern "C" int tl_gpu_draft_pick(tl_gpu_chain *c, const tl_law *laws, int j, int n,
                                 int32_t *next_tok, int32_t *adj, const tl_gpu_stream *st) {
    if (n <= 0) return 0;
    if (j < 0 || j >= TL_MAX_SPEC) return TL_ERR_INVALID;
    TL_LAUNCH(st, "draft_pick", draft_pick_kernel, dim3(CEIL_DIV(n, 128)), dim3(128), 0, c, laws, j,
              n, next_tok, adj);
    return 0;
}

extern "C" size_t tl_gpu_law_scratch_floats(int max_rows) {
    size_t n = (size_t)max_rows * PART_SCR(FP);
    size_t f = (size_t)(max_rows < FEW_ROWS ? max_rows : FEW_ROWS) * PART_SCR(FP_FEW);
    return n > f ? n : f;
}

extern "C" int tl_gpu_law_parts(const tl_sample_params *h_params, int n_rows) {
    return pick_parts(h_params, n_rows, (size_t)PART_SCR(FP_FEW));
}

extern "C" int tl_gpu_sample_law(tl_law *laws, const float *logits, int n_vocab, int n_valid,
                                 const int32_t *row_of, const tl_sample_params *params,
                                 const tl_sample_params *h_params, const int32_t *counts,
                                 const uint32_t *count_bits, const int32_t *count_slot,
                                 const int32_t *adj, float *scratch, int n_rows,
                                 const tl_gpu_stream *st) {
    if (n_rows <= 0) return 0;
    if (n_valid > FP * FCH) return TL_ERR_UNSUPPORTED; /* a part must fit in shared memory */
    int np = pick_parts(h_params, n_rows, (size_t)PART_SCR(FP_FEW));
    size_t stride = (size_t)PART_SCR(np);
    TL_LAUNCH(st, "sample_law_part", part_kernel<true>(n_vocab, np), dim3(np, n_rows), dim3(FT), 0,
              logits, (const float *)NULL, n_vocab, n_valid, params, counts, count_bits, count_slot,
              scratch, 1, row_of, adj, stride, np);
    TL_LAUNCH(st, "sample_law_merge", sample_merge_kernel<true>, dim3(n_rows), dim3(FT), 0,
              (tl_sample_out *)NULL, logits, n_vocab, params, (const uint64_t *)NULL, scratch, 1,
              laws, row_of, stride, np);
    return 0;
}
