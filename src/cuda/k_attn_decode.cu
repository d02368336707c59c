/* Gated softmax attention for decode tokens (and, until the flash prefill kernel is wired in,
 * for prefill tokens one query at a time): split-KV partials, then a combine that applies the
 * sigmoid output gate. */
#include "cuda/k_q4m.cuh"

extern "C" {
#include "common/util.h"
}

#define HD   256 /* head dim (TL_HEAD_DIM) */
#define TILE 32  /* keys per shared-memory tile */
#define KW   129 /* K tile row stride in 32-bit words (128 + 1: conflict-free column reads) */

/* attn_split_kernel  (docs/model.md §2.2 step 5)
 *   for query token t, head h (kv head h / G), keys j in this split's range of 0..pos_t:
 *   s_j = (q . k_j) / 16;  m = max s;  l = sum e^{s_j - m};  acc = sum e^{s_j - m} v_j
 * Shapes: q [n_tok, n_head, 256] f32; kc, vc paged (gpu.h) [n_page * 64][n_kv][256] bf16;
 *   part [n_tok][n_head][n_split][258] f32 (acc[256], m, l).
 * Threads: block (split, kv head, token) of 32*G threads, G = n_head / n_kv query heads (one warp
 *   each) sharing every K/V tile; per 32-key tile a lane scores one key (K row from smem), then
 *   the warp accumulates P V with lane owning dims {2(lane+32i), 2(lane+32i)+1}.
 * Tiles start at multiples of 32 keys, so each lies inside one KV page (64 keys).
 * Bytes: K and V of the split read once per block (2 * 512 B per key per kv head).
 * Tested against cpu_attention (test_kernels.c: test_attn). */
__global__ void __launch_bounds__(512)
    attn_split_kernel(float *part, const float *q, const uint16_t *kc, const uint16_t *vc,
                      int n_head, int n_kv, tl_gpu_kv_pages pg, int n_split, int min_chunk,
                      tl_gpu_seqs s) {
    extern __shared__ float smem[];
    pdl_trigger();
    pdl_wait();
    int split = blockIdx.x, hk = blockIdx.y, t = blockIdx.z;
    int G = n_head / n_kv, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *sq = smem;                           /* [G][256] */
    uint32_t *sk = (uint32_t *)(smem + G * HD); /* [TILE][KW] */
    uint32_t *sv = sk + TILE * KW;              /* [TILE][128] */
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
    size_t rstride = (size_t)n_kv * HD;
    for (int j0 = s0; j0 < s1; j0 += TILE) {
        __syncthreads();
        size_t tbase = (size_t)kv_row(pg, slot, j0) * rstride + hk * HD; /* the tile's page */
        const uint16_t *kbase = kc + tbase, *vbase = vc + tbase;
        for (int i = threadIdx.x; i < TILE * 32; i += blockDim.x) {
            int r = i >> 5, c16 = i & 31; /* row, 16-byte chunk */
            uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = kv4;
            if (j0 + r < s1) {
                kv4 = *(const uint4 *)(kbase + (size_t)r * rstride + c16 * 8);
                vv4 = *(const uint4 *)(vbase + (size_t)r * rstride + c16 * 8);
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

/* attn_tc_split_kernel: the same partials as attn_split_kernel on tensor cores, for G = 8 query
 * heads per KV head (the production 16/2). mma.m16n8k16 with the 16 A rows = [8 heads' hi; the
 * same 8 heads' lo] where hi = bf16(x), lo = bf16(x - hi), so fp32 q and fp32 softmax weights
 * keep ~16 mantissa bits (the two D rows of a head are added):
 *   S (16 x 8 keys)  = [Qhi; Qlo] (16 x 256) . K^T     (16 k-steps of 16 dims, two n-tiles)
 *   O (16 x 256)    += [Phi; Plo] (16 x 16 keys) . V   (P straight from S's D registers)
 * Threads: block (split, kv head, token) of 4 warps; the split's keys go to the warps in tiles
 *   of 16 (warp w: tiles w, w+4, ...), each warp streams its K and V tiles (8 KB each) through
 *   its own 2-stage cp.async ring (rows XOR-swizzled by 16-byte chunk: ldmatrix is
 *   conflict-free) and keeps its own online softmax (m, l per head in a quad of lanes) and O
 *   (lane: head lane/4, dims 8c + 2(lane%4) + {0,1} of n-tile c); at the end the 4 warps merge
 *   in shared memory in warp order (deterministic). Tiles wholly before the segment's first new
 *   position are issued before the PDL wait (those keys were written by earlier steps). A tile
 *   starts at a multiple of 16 keys, so it lies inside one KV page (64 keys).
 * chunk = keys per split = a multiple of 64 >= max(ceil(kv_len / n_use), min_chunk).
 * Bytes: K and V of the split once (2 * 512 B per key). Tested against cpu_attention
 * (test_kernels.c: test_attn). */
#define ATC_WARPS 4
#define ATC_KEYS  16                  /* keys per warp tile */
#define ATC_TILE  (ATC_KEYS * HD * 2) /* bytes of one K (or V) tile: 8 KB */
#define ATC_RING  (ATC_WARPS * 2 * 2 * ATC_TILE)
#define ATC_SMEM  (16 * 32 * 16 + ATC_RING) /* Q fragments + rings: 136 KB */

__device__ __forceinline__ uint32_t atc_hi_lo(float a, float b, uint32_t *lo) {
    float ha = bf2f(f2bf(a)), hb = bf2f(f2bf(b));
    *lo = q4m_pack(a - ha, b - hb);
    return q4m_pack(ha, hb);
}

__global__ void __launch_bounds__(ATC_WARPS * 32, 1)
    attn_tc_split_kernel(float *part, const float *q, const uint16_t *kc, const uint16_t *vc,
                         int n_head, int n_kv, tl_gpu_kv_pages pg, int n_split, int n_use,
                         int min_chunk, tl_gpu_seqs s) {
    extern __shared__ uint4 smem4[];
    uint4 *sq = smem4;                      /* [16 k-steps][32 lanes] A fragments */
    char *ring = (char *)(smem4 + 16 * 32); /* [warp][stage][K tile | V tile] */
    int split = blockIdx.x, hk = blockIdx.y, t = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int pos = s.tok_pos[t], slot = s.tok_slot[t], kv_len = pos + 1;
    int first_new = s.seg_pos0[s.tok_seg[t]];
    int chunk = CEIL_DIV(max(CEIL_DIV(kv_len, n_use), min_chunk), 64) * 64;
    int s0 = split * chunk, s1 = min(kv_len, s0 + chunk);
    pdl_trigger();
    float *pbase = part + (((size_t)t * n_head + hk * 8) * n_split + split) * (HD + 2);
    if (s0 >= s1) { /* empty split (short context): m = -inf, which the combine skips */
        pdl_wait();
        if (threadIdx.x < 8) pbase[(size_t)threadIdx.x * n_split * (HD + 2) + HD] = -INFINITY;
        return;
    }
    size_t rstride = (size_t)n_kv * HD;
    char *my = ring + (size_t)warp * 2 * 2 * ATC_TILE;
    /* lane's 16-byte chunk of each of a tile's 16 rows; row r lands at chunk (lane ^ (r & 7)) */
    auto issue = [&](int j0, int stage) {
        char *dk = my + stage * 2 * ATC_TILE, *dv = dk + ATC_TILE;
        size_t tbase = (size_t)kv_row(pg, slot, j0) * rstride + hk * HD; /* the tile's page */
        const uint16_t *kbase = kc + tbase, *vbase = vc + tbase;
#pragma unroll
        for (int r = 0; r < ATC_KEYS; r++) {
            int ok = j0 + r < s1;
            size_t off = (size_t)(ok ? r : 0) * rstride + lane * 8;
            int dst = r * 512 + ((lane ^ (r & 7)) << 4);
            cp_async16(dk + dst, kbase + off, ok ? 16 : 0);
            cp_async16(dv + dst, vbase + off, ok ? 16 : 0);
        }
        cp_async_commit();
    };
    int j = s0 + warp * ATC_KEYS; /* this warp's first tile */
    int early = j < s1 && j + ATC_KEYS <= first_new;
    if (early) issue(j, 0);
    pdl_wait();
    if (j < s1 && !early) issue(j, 0);
    /* Q of the 8 heads (scaled by 1/16, exact) as A fragments: entry (ks, lane) = rows g (hi)
     * and g+8 (lo) at dims 16ks + 2tq + {0,1} and + 8 */
    const float *qb = q + ((size_t)t * n_head + hk * 8) * HD;
    for (int i = threadIdx.x; i < 16 * 32; i += ATC_WARPS * 32) {
        int ks = i >> 5, l = i & 31, gg = l >> 2, tt = l & 3;
        const float *qp = qb + gg * HD + ks * 16 + 2 * tt;
        float2 a = *(const float2 *)qp, b = *(const float2 *)(qp + 8);
        uint4 f;
        f.x = atc_hi_lo(a.x * 0.0625f, a.y * 0.0625f, &f.y);
        f.z = atc_hi_lo(b.x * 0.0625f, b.y * 0.0625f, &f.w);
        sq[i] = f;
    }
    __syncthreads();
    float o[32][4];
#pragma unroll
    for (int c = 0; c < 32; c++) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    /* ldmatrix row addresses: K (non-trans) matrices (keys 0-7 | 8-15) x (chunk 2ks | 2ks+1),
     * V (trans) matrices (keys 0-7 | 8-15) x (chunk 2c | 2c+1) */
    int mi = lane >> 3, r8 = lane & 7;
    int k_row = (mi >> 1) * 8 + r8, k_hc = mi & 1;
    int v_row = (mi & 1) * 8 + r8, v_hc = mi >> 1;
    for (int i = 0; j < s1; i++, j += ATC_WARPS * ATC_KEYS) {
        int stage = i & 1, jn = j + ATC_WARPS * ATC_KEYS;
        __syncwarp(); /* every lane is done with the stage refilled next */
        if (jn < s1) {
            issue(jn, stage ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp();
        const char *sk = my + stage * 2 * ATC_TILE, *sv = sk + ATC_TILE;
        float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const char *krow = sk + k_row * 512;
#pragma unroll
        for (int ks = 0; ks < 16; ks++) {
            uint4 a = sq[ks * 32 + lane];
            uint32_t b[4];
            ldmatrix_x4(b, krow + (((2 * ks + k_hc) ^ r8) << 4));
            mma_bf16(d0, a.x, a.y, a.z, a.w, b[0], b[1]);
            mma_bf16(d1, a.x, a.y, a.z, a.w, b[2], b[3]);
        }
        /* head g's scores of keys 2tq, 2tq+1, 8+2tq, 9+2tq: hi row + lo row */
        float sc[4] = {d0[0] + d0[2], d0[1] + d0[3], d1[0] + d1[2], d1[1] + d1[3]};
        int kk[4] = {2 * tq, 2 * tq + 1, 8 + 2 * tq, 9 + 2 * tq};
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (j + kk[e] >= s1) sc[e] = -INFINITY;
        float mt = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        float m_new = fmaxf(m, mt); /* finite: key j < s1 is in every tile */
        float corr = expf(m - m_new), p[4];
#pragma unroll
        for (int e = 0; e < 4; e++) p[e] = expf(sc[e] - m_new);
        l = fmaf(l, corr, (p[0] + p[1]) + (p[2] + p[3]));
        m = m_new;
#pragma unroll
        for (int c = 0; c < 32; c++)
            o[c][0] *= corr, o[c][1] *= corr, o[c][2] *= corr, o[c][3] *= corr;
        uint32_t pa[4];
        pa[0] = atc_hi_lo(p[0], p[1], &pa[1]);
        pa[2] = atc_hi_lo(p[2], p[3], &pa[3]);
        const char *vrow = sv + v_row * 512;
#pragma unroll
        for (int c2 = 0; c2 < 16; c2++) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, vrow + (((2 * c2 + v_hc) ^ r8) << 4));
            mma_bf16(o[2 * c2], pa[0], pa[1], pa[2], pa[3], b[0], b[1]);
            mma_bf16(o[2 * c2 + 1], pa[0], pa[1], pa[2], pa[3], b[2], b[3]);
        }
    }
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    /* merge the warps: the rings are free once every warp is past its loop */
    __syncthreads();
    float *sm_o = (float *)ring;              /* [warp][8 heads][256] */
    float *sm_ml = sm_o + ATC_WARPS * 8 * HD; /* [warp][8][m, l] */
    float *wo = sm_o + (size_t)(warp * 8 + g) * HD;
#pragma unroll
    for (int c = 0; c < 32; c++)
        *(float2 *)(wo + 8 * c + 2 * tq) = make_float2(o[c][0] + o[c][2], o[c][1] + o[c][3]);
    if (tq == 0) sm_ml[(warp * 8 + g) * 2] = m, sm_ml[(warp * 8 + g) * 2 + 1] = l;
    __syncthreads();
    int hh = threadIdx.x >> 4, d0i = threadIdx.x & 15; /* head hh, dims d0i + 16 i */
    float mw[ATC_WARPS], M = -INFINITY, L = 0.0f;
#pragma unroll
    for (int w = 0; w < ATC_WARPS; w++) mw[w] = sm_ml[(w * 8 + hh) * 2], M = fmaxf(M, mw[w]);
#pragma unroll
    for (int w = 0; w < ATC_WARPS; w++) {
        mw[w] = mw[w] == -INFINITY ? 0.0f : expf(mw[w] - M);
        L = fmaf(mw[w], sm_ml[(w * 8 + hh) * 2 + 1], L);
    }
    float *po = pbase + (size_t)hh * n_split * (HD + 2);
#pragma unroll 4
    for (int i = 0; i < 16; i++) {
        int d = d0i + 16 * i;
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < ATC_WARPS; w++) a = fmaf(mw[w], sm_o[(size_t)(w * 8 + hh) * HD + d], a);
        po[d] = a;
    }
    if (d0i == 0) po[HD] = M, po[HD + 1] = L;
}

/* attn_combine_gate_kernel
 *   M = max_s m_s;  o[d] = sum_s e^{m_s - M} acc_s[d] / sum_s e^{m_s - M} l_s
 *   out[t, h*256 + d] = o[d] * sigmoid(gate[t, h, d])     (docs/model.md §2.2 step 6)
 * Threads: one block of 256 (8 warps) per (token, head): thread s < n_split reads split s's
 *   (m, l); warp w accumulates splits w, w+8, ...; thread d adds the 8 warp sums of dim d.
 * Bytes: n_split * 258 * 4 in.
 * Tested with attn_split_kernel (test_attn). */
__global__ void __launch_bounds__(256)
    attn_combine_gate_kernel(float *out, const float *part, const float *proj, int ld_proj,
                             int n_head, int n_split, int n_use) {
    __shared__ float s_w[HD];
    __shared__ float s_acc[8][HD];
    __shared__ float sbuf[32];
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x, warp = d >> 5, lane = d & 31;
    const float *p = part + ((size_t)t * n_head + h) * n_split * (HD + 2);
    /* splits 0 .. n_use-1 of the n_split-strided partials; thread s < n_use reads split s's (m, l);
     * then warp w sums splits w, w+8, ... over all 256 dims (lane: dims 2*lane + 64j, float2
     * loads), and the 8 warp sums are added in warp order (deterministic). One thread per dim
     * looping over every split was a chain of n_split dependent L2 reads: ~18 us at 128 splits. */
    float m = d < n_use ? p[d * (HD + 2) + HD] : -INFINITY;
    float M = block_max(m, sbuf);
    float w = (d < n_use && m != -INFINITY) ? expf(m - M) : 0.0f;
    float L = block_sum(w != 0.0f ? w * p[d * (HD + 2) + HD + 1] : 0.0f, sbuf);
    s_w[d] = w;
    __syncthreads();
    float2 acc[4] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
    for (int sp = warp; sp < n_use; sp += 8) {
        float ws = s_w[sp];
        if (ws == 0.0f) continue; /* empty split: its acc was never written */
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

/* Raises the kernels' dynamic shared memory limits (tl_gpu_init). */
int cb_attn_setup(void) {
    CUDA_TRY(cudaFuncSetAttribute(attn_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  16 * HD * 4 + TILE * KW * 4 + TILE * 128 * 4));
    CUDA_TRY(cudaFuncSetAttribute(attn_tc_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  ATC_SMEM));
    return 0;
}

extern "C" int tl_gpu_attn(float *out, float *part, const float *q, const uint16_t *kc,
                           const uint16_t *vc, const float *proj, int ld_proj, int n_head, int n_kv,
                           const tl_gpu_kv_pages *pg, int n_split, const tl_gpu_seqs *s,
                           const tl_gpu_attn_opts *opt, const tl_gpu_stream *st) {
    if (s->n_tok <= 0) return 0;
    int G = n_head / n_kv;
    if (G < 1 || G > 16 || n_head % n_kv || n_split < 1 || n_split > HD) return TL_ERR_INVALID;
    int n_use = n_split, cuda_core = opt && opt->cuda_core;
    int min_chunk = opt && opt->min_chunk > 0 ? opt->min_chunk : TILE;
    if (G == 8 && !cuda_core) {
        /* one block per SM (136 KB of shared memory): as many splits as fill the SMs once */
        n_use = TL_MAX(1, TL_MIN(n_split, cb_grid_cap() / 2 / (n_kv * s->n_tok)));
        dim3 grid(n_use, n_kv, s->n_tok);
        TL_LAUNCH(st, "attn_split", attn_tc_split_kernel, grid, dim3(ATC_WARPS * 32), ATC_SMEM,
                  part, q, kc, vc, n_head, n_kv, *pg, n_split, n_use, min_chunk, *s);
    } else {
        size_t shm = (size_t)G * HD * 4 + TILE * KW * 4 + TILE * 128 * 4;
        dim3 grid(n_split, n_kv, s->n_tok);
        TL_LAUNCH(st, "attn_split", attn_split_kernel, grid, dim3(32 * G), shm, part, q, kc, vc,
                  n_head, n_kv, *pg, n_split, min_chunk, *s);
    }
    TL_LAUNCH(st, "attn_combine", attn_combine_gate_kernel, dim3(s->n_tok, n_head), dim3(HD), 0,
              out, part, proj, ld_proj, n_head, n_split, n_use);
    return 0;
}
