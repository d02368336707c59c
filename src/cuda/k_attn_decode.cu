/* Gated softmax attention for decode tokens (and, until the flash prefill kernel is wired in,
 * for prefill tokens one query at a time): split-KV partials, then a combine that applies the
 * sigmoid output gate. */
#include "cuda/cuda_backend.cuh"

#define HD 256   /* head dim (TL_HEAD_DIM) */
#define TILE 32  /* keys per shared-memory tile */
#define KW 129   /* K tile row stride in 32-bit words (128 + 1: conflict-free column reads) */

/* attn_split_kernel  (MODEL.md §2.2 step 5)
 *   for query token t, head h (kv head h / G), keys j in this split's range of 0..pos_t:
 *   s_j = (q . k_j) / 16;  m = max s;  l = sum e^{s_j - m};  acc = sum e^{s_j - m} v_j
 * Shapes: q [n_tok, n_head, 256] f32; kc, vc [n_slot][max_ctx][n_kv][256] bf16;
 *   part [n_tok][n_head][n_split][258] f32 (acc[256], m, l).
 * Threads: block (split, kv head, token) of 32*G threads, G = n_head / n_kv query heads (one warp
 *   each) sharing every K/V tile; per 32-key tile a lane scores one key (K row from smem), then
 *   the warp accumulates P V with lane owning dims {2(lane+32i), 2(lane+32i)+1}.
 * Bytes: K and V of the split read once per block (2 * 512 B per key per kv head).
 * Tested against cpu_attention (test_kernels.c: test_attn). */
__global__ void __launch_bounds__(512)
    attn_split_kernel(float *part, const float *q, const uint16_t *kc, const uint16_t *vc,
                      int n_head, int n_kv, int max_ctx, int n_split, int min_chunk,
                      tl_gpu_seqs s) {
    extern __shared__ float smem[];
    pdl_trigger();
    pdl_wait();
    int split = blockIdx.x, hk = blockIdx.y, t = blockIdx.z;
    int G = n_head / n_kv, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *sq = smem;                                 /* [G][256] */
    uint32_t *sk = (uint32_t *)(smem + G * HD);       /* [TILE][KW] */
    uint32_t *sv = sk + TILE * KW;                    /* [TILE][128] */
    int pos = s.tok_pos[t], slot = s.tok_slot[t], kv_len = pos + 1;
    /* at least min_chunk keys per split: at short contexts the trailing splits are empty (they
     * write m = -inf, which the combine skips), so one graph serves every context */
    int chunk = CEIL_DIV(max(CEIL_DIV(kv_len, n_split), min_chunk), TILE) * TILE;
    int s0 = split * chunk, s1 = min(kv_len, s0 + chunk);
    int h = hk * G + warp;
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x)
        sq[i] = q[((size_t)t * n_head + hk * G) * HD + i] * (1.0f / 16.0f);
    float m = -INFINITY, l = 0.0f, acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] = 0.0f;
    const uint16_t *kbase = kc + ((size_t)slot * max_ctx * n_kv + hk) * HD;
    const uint16_t *vbase = vc + ((size_t)slot * max_ctx * n_kv + hk) * HD;
    size_t rstride = (size_t)n_kv * HD;
    for (int j0 = s0; j0 < s1; j0 += TILE) {
        __syncthreads();
        for (int i = threadIdx.x; i < TILE * 32; i += blockDim.x) {
            int r = i >> 5, c16 = i & 31; /* row, 16-byte chunk */
            uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = kv4;
            if (j0 + r < s1) {
                kv4 = *(const uint4 *)(kbase + (size_t)(j0 + r) * rstride + c16 * 8);
                vv4 = *(const uint4 *)(vbase + (size_t)(j0 + r) * rstride + c16 * 8);
            }
            uint32_t *kr = sk + r * KW + c16 * 4;
            kr[0] = kv4.x, kr[1] = kv4.y, kr[2] = kv4.z, kr[3] = kv4.w;
            *(uint4 *)(sv + r * 128 + c16 * 4) = vv4;
        }
        __syncthreads();
        if (warp >= G) continue;
        float sc = -INFINITY;
        if (j0 + lane < s1) {
            const float2 *qh = (const float2 *)(sq + warp * HD);
            const uint32_t *kr = sk + lane * KW;
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f; /* 4 FMA chains */
#pragma unroll 16
            for (int w = 0; w < 128; w += 2) {
                uint32_t kw = kr[w], kw2 = kr[w + 1];
                float2 qq = qh[w], qq2 = qh[w + 1];
                a0 = fmaf(qq.x, __uint_as_float(kw << 16), a0);
                a1 = fmaf(qq.y, __uint_as_float(kw & 0xffff0000u), a1);
                a2 = fmaf(qq2.x, __uint_as_float(kw2 << 16), a2);
                a3 = fmaf(qq2.y, __uint_as_float(kw2 & 0xffff0000u), a3);
            }
            sc = (a0 + a1) + (a2 + a3);
        }
        float m_new = fmaxf(m, warp_max(sc));
        float p = expf(sc - m_new), corr = expf(m - m_new);
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] *= corr;
        m = m_new;
        int nj = min(TILE, s1 - j0);
        for (int jj = 0; jj < nj; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            const uint32_t *vr = sv + jj * 128;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint32_t vw = vr[lane + 32 * i];
                acc[2 * i] = fmaf(pj, __uint_as_float(vw << 16), acc[2 * i]);
                acc[2 * i + 1] = fmaf(pj, __uint_as_float(vw & 0xffff0000u), acc[2 * i + 1]);
            }
        }
    }
    if (warp >= G) return;
    float *o = part + (((size_t)t * n_head + h) * n_split + split) * (HD + 2);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int p2 = lane + 32 * i;
        o[2 * p2] = acc[2 * i];
        o[2 * p2 + 1] = acc[2 * i + 1];
    }
    if (lane == 0) o[HD] = m, o[HD + 1] = l;
}

/* attn_combine_gate_kernel
 *   M = max_s m_s;  o[d] = sum_s e^{m_s - M} acc_s[d] / sum_s e^{m_s - M} l_s
 *   out[t, h*256 + d] = o[d] * sigmoid(gate[t, h, d])     (MODEL.md §2.2 step 6)
 * Threads: one block of 256 (8 warps) per (token, head): thread s < n_split reads split s's
 *   (m, l); warp w accumulates splits w, w+8, ...; thread d adds the 8 warp sums of dim d.
 * Bytes: n_split * 258 * 4 in.
 * Tested with attn_split_kernel (test_attn). */
__global__ void __launch_bounds__(256)
    attn_combine_gate_kernel(float *out, const float *part, const float *proj, int ld_proj,
                             int n_head, int n_split) {
    __shared__ float s_w[HD];
    __shared__ float s_acc[8][HD];
    __shared__ float sbuf[32];
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x, warp = d >> 5, lane = d & 31;
    const float *p = part + ((size_t)t * n_head + h) * n_split * (HD + 2);
    /* thread s < n_split reads split s's (m, l); then warp w sums splits w, w+8, ... over all
     * 256 dims (lane: dims 2*lane + 64j, float2 loads), and the 8 warp sums are added in warp
     * order (deterministic). One thread per dim looping over every split was a chain of n_split
     * dependent L2 reads: ~18 us at 128 splits. */
    float m = d < n_split ? p[d * (HD + 2) + HD] : -INFINITY;
    float M = block_max(m, sbuf);
    float w = (d < n_split && m != -INFINITY) ? expf(m - M) : 0.0f;
    float L = block_sum(w != 0.0f ? w * p[d * (HD + 2) + HD + 1] : 0.0f, sbuf);
    s_w[d] = w;
    __syncthreads();
    float2 acc[4] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
    for (int sp = warp; sp < n_split; sp += 8) {
        float ws = s_w[sp];
        const float2 *ps = (const float2 *)(p + (size_t)sp * (HD + 2));
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 v = ps[lane + 32 * j];
            acc[j].x = fmaf(v.x, ws, acc[j].x), acc[j].y = fmaf(v.y, ws, acc[j].y);
        }
    }
#pragma unroll
    for (int j = 0; j < 4; j++) *(float2 *)&s_acc[warp][2 * (lane + 32 * j)] = acc[j];
    __syncthreads();
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) o += s_acc[i][d];
    float gate = proj[(size_t)t * ld_proj + h * 2 * HD + HD + d];
    out[((size_t)t * n_head + h) * HD + d] = o / L * sigmoid_f(gate);
}

static int attn_attr_done;
int tl_attn_min_chunk = TILE; /* keys per split at least (TL_CUDA_ATTN_MIN_CHUNK, backend open) */

/* Raises the kernel's dynamic shared memory limit (once; not allowed inside graph capture). */
int tl_gpu_attn_setup(void) {
    CUDA_TRY(cudaFuncSetAttribute(attn_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  16 * HD * 4 + TILE * KW * 4 + TILE * 128 * 4));
    attn_attr_done = 1;
    return 0;
}

extern "C" int tl_gpu_attn(float *out, float *part, const float *q, const uint16_t *kc,
                           const uint16_t *vc, const float *proj, int ld_proj, int n_head,
                           int n_kv, int max_ctx, int n_split, const tl_gpu_seqs *s) {
    if (s->n_tok <= 0) return 0;
    int G = n_head / n_kv;
    if (G < 1 || G > 16 || n_head % n_kv || n_split < 1 || n_split > HD) return TL_ERR_INVALID;
    size_t shm = (size_t)G * HD * 4 + TILE * KW * 4 + TILE * 128 * 4;
    if (!attn_attr_done) {
        int st = tl_gpu_attn_setup();
        if (st) return st;
    }
    dim3 grid(n_split, n_kv, s->n_tok);
    TL_LAUNCH("attn_split", attn_split_kernel, grid, dim3(32 * G), shm, part, q, kc, vc, n_head,
              n_kv, max_ctx, n_split, tl_attn_min_chunk, *s);
    TL_LAUNCH("attn_combine", attn_combine_gate_kernel, dim3(s->n_tok, n_head), dim3(HD), 0, out,
              part, proj, ld_proj, n_head, n_split);
    return 0;
}
