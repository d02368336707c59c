/* Flash-style causal prefill attention for the gated full-attention layers (head_dim 256, 16
 * query heads over 2 KV heads) on the tensor cores (mma.sync bf16, fp32 online softmax), with the
 * sigmoid output gate fused into the epilogue. Owns one kernel and tl_gpu_attn_prefill; reads
 * the (possibly paged) bf16 KV cache, never writes it, never allocates or synchronises.
 * Invariant: the cache already holds this chunk's K and V at positions pos0..pos0+n-1. */
#include "cuda/cuda_common.cuh"
#include "model/shape.h"

#define AP_BQ         64  /* queries per block */
#define AP_BK         64  /* keys per tile */
#define AP_D          256 /* head dim */
#define AP_LDS        264 /* smem row stride (bf16): 528 B rows put ldmatrix rows in distinct banks */
#define AP_THREADS    128
#define AP_TILE_ELEMS (AP_BQ * AP_LDS)
#define AP_SMEM       (3 * AP_TILE_ELEMS * 2)

/* math: o[t,h,:] = sigmoid(gate[t,h,:]) * sum_{j <= pos0+t} softmax_j(q[t,h].k[j,h/8] / 16)
 * v[j,h/8] shapes: q/gate bf16 or f32, (t, h, d) at [t*tok_stride + h*head_stride + d]; K/V through
 * the tl_gpu_kv_view; o bf16 [n, 16*256]. threads: block = (64 queries, one q head), 4 warps; warp
 * w owns query rows 16w..16w+15 (mma fragments: a lane holds rows lane/4 and lane/4+8). S = Q K^T
 * per 64-key tile (16 x 64 per warp), online softmax in fp32 on the fragments, P cast to bf16, O +=
 * P V (16 x 256 per warp, 128 fp32 accumulators per lane). K and V tiles are loaded with cp.async,
 * the next K tile while softmax and P V run, the next V tile while the next S runs. bytes: Q once;
 * K, V of the causal prefix once per query tile (8 q heads re-read them from L2). reference:
 * cpu_attention with bf16-rounded inputs (tests/gpu/test_prefill_kernels.c). */
__global__ void __launch_bounds__(AP_THREADS, 2)
    attn_prefill_kernel(uint16_t *o, tl_gpu_heads qh, tl_gpu_heads gh, tl_gpu_kv_view kv, int n,
                        int pos0, int in_f32) {
    pdl_wait(); /* launched with PDL on the batched path: cuda_common.cuh */
    const void *qv = qh.p, *gatev = gh.p;
    const int q_tok_stride = qh.tok_stride, q_head_stride = qh.head_stride;
    extern __shared__ __align__(128) uint16_t ap_smem[];
    uint16_t *sQ = ap_smem, *sK = ap_smem + AP_TILE_ELEMS, *sV = ap_smem + 2 * AP_TILE_ELEMS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qt = blockIdx.x, h = blockIdx.y, kvh = h / (TL_N_HEAD / TL_N_HEAD_KV);
    const int q0 = qt * AP_BQ;
    const int kv_len = pos0 + n;
    const int q_last = pos0 + min(n, q0 + AP_BQ) - 1; /* last query position of this tile */
    const int n_kt = q_last / AP_BK + 1;

    /* Q tile: 64 rows x 32 chunks of 8 dims; rows past n are zero. f32 q is rounded to bf16 here.
     */
    if (!in_f32) {
        const uint16_t *q = (const uint16_t *)qv;
        for (int c = tid; c < AP_BQ * 32; c += AP_THREADS) {
            int r = c >> 5, ch = c & 31, t = q0 + r;
            const uint16_t *src =
                q + (size_t)(t < n ? t : 0) * q_tok_stride + (size_t)h * q_head_stride + ch * 8;
            cp_async16(sQ + r * AP_LDS + ch * 8, src, t < n ? 16 : 0);
        }
    } else {
        const float *q = (const float *)qv;
        for (int c = tid; c < AP_BQ * 32; c += AP_THREADS) {
            int r = c >> 5, ch = c & 31, t = q0 + r;
            uint4 packed = make_uint4(0, 0, 0, 0);
            if (t < n) {
                const float *src =
                    q + (size_t)t * q_tok_stride + (size_t)h * q_head_stride + ch * 8;
                float4 a = *(const float4 *)src, b = *(const float4 *)(src + 4);
                packed = make_uint4(bf16x2_pack(a.x, a.y), bf16x2_pack(a.z, a.w),
                                    bf16x2_pack(b.x, b.y), bf16x2_pack(b.z, b.w));
            }
            *(uint4 *)(sQ + r * AP_LDS + ch * 8) = packed;
        }
    }
    cp_async_commit();

    auto tile_base = [&](const uint16_t *base, int kpos0) -> const uint16_t * {
        if (kv.pages) {
            int pg = kv.pages[kpos0 / kv.page_tokens];
            return base + (size_t)pg * kv.page_stride +
                   (size_t)(kpos0 % kv.page_tokens) * kv.tok_stride + kvh * AP_D;
        }
        return base + (size_t)kpos0 * kv.tok_stride + kvh * AP_D;
    };
    auto load_kv = [&](uint16_t *dst, const uint16_t *base, int kt) {
        int kpos0 = kt * AP_BK;
        const uint16_t *b = tile_base(base, kpos0);
        for (int c = tid; c < AP_BK * 32; c += AP_THREADS) {
            int r = c >> 5, ch = c & 31, ok = kpos0 + r < kv_len;
            cp_async16(dst + r * AP_LDS + ch * 8, b + (size_t)(ok ? r : 0) * kv.tok_stride + ch * 8,
                       ok ? 16 : 0);
        }
    };
    load_kv(sK, kv.k, 0);
    cp_async_commit();
    load_kv(sV, kv.v, 0);
    cp_async_commit();

    const float sl2 = (1.0f / 16.0f) * 1.4426950408889634f; /* scale * log2(e) */
    float oacc[32][4];
#pragma unroll
    for (int i = 0; i < 32; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const int qpos[2] = {pos0 + q0 + warp * 16 + (lane >> 2),
                         pos0 + q0 + warp * 16 + (lane >> 2) + 8};

    for (int kt = 0; kt < n_kt; kt++) {
        cp_async_wait<1>(); /* Q and K_kt landed (V_kt may be in flight) */
        __syncthreads();

        /* S = Q K^T (16 x 64 per warp) */
        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < AP_D / 16; kk++) {
            uint32_t af[4];
            ldmatrix_x4(af, sQ + (warp * 16 + (lane & 15)) * AP_LDS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t r[4];
                ldmatrix_x4(r, sK + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * AP_LDS + kk * 16 +
                                   ((lane >> 3) & 1) * 8);
                mma_bf16(s[2 * np], af, r[0], r[1]);
                mma_bf16(s[2 * np + 1], af, r[2], r[3]);
            }
        }
        __syncthreads(); /* every warp is done with sK */
        if (kt + 1 < n_kt) load_kv(sK, kv.k, kt + 1);
        cp_async_commit();

        /* online softmax on the fragments: element (row g(+8), key 8*nt + 2*(lane%4) + e) */
        const int kbase = kt * AP_BK;
        const bool diag = kbase + AP_BK - 1 > pos0 + q0; /* some key may be after some query */
        float mnew[2] = {mrow[0], mrow[1]};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int hr = e >> 1, kpos = kbase + nt * 8 + 2 * (lane & 3) + (e & 1);
                float x = s[nt][e] * sl2;
                if (diag && kpos > qpos[hr]) x = -INFINITY;
                s[nt][e] = x;
                mnew[hr] = fmaxf(mnew[hr], x);
            }
        float alpha[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            mnew[hr] = fmaxf(mnew[hr], __shfl_xor_sync(0xffffffffu, mnew[hr], 1));
            mnew[hr] = fmaxf(mnew[hr], __shfl_xor_sync(0xffffffffu, mnew[hr], 2));
            float mref = mnew[hr] == -INFINITY ? 0.f : mnew[hr];
            alpha[hr] = exp2f(mrow[hr] - mref);
            mrow[hr] = mnew[hr];
            mnew[hr] = mref;
        }
        float lsum[2] = {0.f, 0.f};
        uint32_t pf[4][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            float p0 = exp2f(s[nt][0] - mnew[0]), p1 = exp2f(s[nt][1] - mnew[0]);
            float p2 = exp2f(s[nt][2] - mnew[1]), p3 = exp2f(s[nt][3] - mnew[1]);
            lsum[0] += p0 + p1;
            lsum[1] += p2 + p3;
            pf[nt >> 1][(nt & 1) * 2 + 0] = bf16x2_pack(p0, p1);
            pf[nt >> 1][(nt & 1) * 2 + 1] = bf16x2_pack(p2, p3);
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) lrow[hr] = lrow[hr] * alpha[hr] + lsum[hr];
#pragma unroll
        for (int i = 0; i < 32; i++) {
            oacc[i][0] *= alpha[0];
            oacc[i][1] *= alpha[0];
            oacc[i][2] *= alpha[1];
            oacc[i][3] *= alpha[1];
        }

        cp_async_wait<1>(); /* V_kt landed (K_kt+1 may be in flight) */
        __syncthreads();
        /* O += P V: A fragments of P straight from the S fragments (k16 step kk = keys 16kk..) */
#pragma unroll
        for (int kk = 0; kk < AP_BK / 16; kk++) {
            uint32_t a[4] = {pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3]};
#pragma unroll
            for (int dp = 0; dp < AP_D / 16; dp++) {
                uint32_t r[4];
                ldmatrix_x4_trans(r, sV + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * AP_LDS +
                                         dp * 16 + (lane >> 4) * 8);
                mma_bf16(oacc[2 * dp], a, r[0], r[1]);
                mma_bf16(oacc[2 * dp + 1], a, r[2], r[3]);
            }
        }
        __syncthreads(); /* every warp is done with sV */
        if (kt + 1 < n_kt) load_kv(sV, kv.v, kt + 1);
        cp_async_commit();
    }
    cp_async_wait<0>();

    /* finish the row sums across the quad, normalise, gate, store */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        lrow[hr] += __shfl_xor_sync(0xffffffffu, lrow[hr], 1);
        lrow[hr] += __shfl_xor_sync(0xffffffffu, lrow[hr], 2);
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        int t = q0 + warp * 16 + (lane >> 2) + hr * 8;
        if (t >= n) continue;
        float inv = 1.0f / lrow[hr];
        size_t goff = (size_t)t * gh.tok_stride + (size_t)h * gh.head_stride;
        uint16_t *op = o + (size_t)t * (TL_N_HEAD * AP_D) + h * AP_D;
#pragma unroll
        for (int nt = 0; nt < 32; nt++) {
            int d = nt * 8 + 2 * (lane & 3);
            float v0 = oacc[nt][2 * hr] * inv, v1 = oacc[nt][2 * hr + 1] * inv;
            if (gatev) {
                float g0, g1;
                if (in_f32) {
                    float2 gv = *(const float2 *)((const float *)gatev + goff + d);
                    g0 = gv.x, g1 = gv.y;
                } else {
                    uint32_t gv = *(const uint32_t *)((const uint16_t *)gatev + goff + d);
                    g0 = bf16x2_lo(gv), g1 = bf16x2_hi(gv);
                }
                v0 *= sigmoid_f(g0);
                v1 *= sigmoid_f(g1);
            }
            *(uint32_t *)(op + d) = bf16x2_pack(v0, v1);
        }
    }
}

extern "C" int tl_gpu_attn_prefill(uint16_t *o, const tl_gpu_heads *q, const tl_gpu_heads *gate,
                                   const tl_gpu_kv_view *kv, int n, int pos0, int flags,
                                   const tl_gpu_stream *st) {
    if (!o || !q || !q->p || !kv || !kv->k || !kv->v || n < 0 || pos0 < 0) return TL_ERR_INVALID;
    tl_gpu_heads g = {NULL, 0, 0};
    if (gate && gate->p) g = *gate;
    if (q->tok_stride % 8 || q->head_stride % 8 || g.tok_stride % 8 || g.head_stride % 8 ||
        kv->tok_stride % 8 || kv->tok_stride < 512)
        return TL_ERR_INVALID;
    if (kv->pages && (kv->page_tokens <= 0 || kv->page_tokens % AP_BK || kv->page_stride % 8))
        return TL_ERR_INVALID;
    if (n == 0) return 0;
    static int attr_set;
    if (!attr_set) {
        if (cudaFuncSetAttribute(attn_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 AP_SMEM) != cudaSuccess)
            return TL_ERR_CUDA;
        attr_set = 1;
    }
    dim3 grid((n + AP_BQ - 1) / AP_BQ, TL_N_HEAD);
    TL_LAUNCH(st, "attn_prefill", attn_prefill_kernel, grid, dim3(AP_THREADS), AP_SMEM, o, *q, g,
              *kv, n, pos0, (int)(flags & TL_ATTN_IN_F32));
    return 0;
}
