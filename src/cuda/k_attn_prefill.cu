/* Flash-style causal prefill attention for the gated full-attention layers (head_dim 256, 16
 * query heads over 2 KV heads) on the tensor cores (bf16, fp32 online softmax), with the sigmoid
 * output gate fused into the epilogue. Owns four kernels (the warp-specialised wgmma one, two
 * query heads a block, with P in registers: the default; the same with P through shared memory,
 * TL_ATTN_WG=2; the one-warpgroup wgmma one, TL_ATTN_WG=1; mma.sync, TL_ATTN_WG=0) and
 * tl_gpu_attn_prefill; reads the (possibly paged) bf16 KV cache, never writes
 * it, never allocates or synchronises.
 * Invariant: the cache already holds this chunk's K and V at positions pos0..pos0+n-1. */
#include "cuda/cuda_common.cuh"
#include "cuda/k_mbar.cuh"
#include "cuda/k_wgmma.cuh"
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
/* The first row (position kpos0, a multiple of AP_BK: never across a page) of KV head kvh's
 * tile in the K or V cache base. */
static __device__ __forceinline__ const uint16_t *
ap_tile_base(const tl_gpu_kv_view &kv, const uint16_t *base, int kpos0, int kvh) {
    if (kv.pages) {
        int pg = kv.pages[kpos0 / kv.page_tokens];
        return base + (size_t)pg * kv.page_stride +
               (size_t)(kpos0 % kv.page_tokens) * kv.tok_stride + kvh * AP_D;
    }
    return base + (size_t)kpos0 * kv.tok_stride + kvh * AP_D;
}

/* The sum of v over the 4 lanes of a quad (the lanes holding one fragment row). */
static __device__ __forceinline__ float ap_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* The online softmax of one 64-key tile on the score fragments (the mma.sync and wgmma D layout:
 * s[4j + c] = row g + 8 (c >> 1) of the warp, key kbase + 8j + 2t + (c & 1)): scales by
 * 1/16 log2(e), masks the keys after the row's query (diag: the tile may hold some), updates the
 * running max m and sum l of the lane's two rows, leaves p = exp2(x - m) in s and returns each
 * row's correction factor exp2(m_old - m_new) in alpha. */
static __device__ __forceinline__ void ap_softmax_tile(float (&s)[32], float (&m)[2], float (&l)[2],
                                                       float (&alpha)[2], int kbase, bool diag,
                                                       const int (&qpos)[2], int t) {
    const float sl2 = (1.0f / 16.0f) * 1.4426950408889634f; /* scale * log2(e) */
    float mnew[2] = {m[0], m[1]};
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int hr = c >> 1, kpos = kbase + 8 * j + 2 * t + (c & 1);
            float x = s[4 * j + c] * sl2;
            if (diag && kpos > qpos[hr]) x = -INFINITY;
            s[4 * j + c] = x;
            mnew[hr] = fmaxf(mnew[hr], x);
        }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        mnew[hr] = fmaxf(mnew[hr], __shfl_xor_sync(0xffffffffu, mnew[hr], 1));
        mnew[hr] = fmaxf(mnew[hr], __shfl_xor_sync(0xffffffffu, mnew[hr], 2));
        float mref = mnew[hr] == -INFINITY ? 0.f : mnew[hr];
        alpha[hr] = exp2f(m[hr] - mref);
        m[hr] = mnew[hr];
        mnew[hr] = mref;
    }
    float lsum[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float p0 = exp2f(s[4 * j + 2 * hr] - mnew[hr]),
                  p1 = exp2f(s[4 * j + 2 * hr + 1] - mnew[hr]);
            s[4 * j + 2 * hr] = p0, s[4 * j + 2 * hr + 1] = p1;
            lsum[hr] += p0 + p1;
        }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) l[hr] = l[hr] * alpha[hr] + lsum[hr];
}

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

    auto load_kv = [&](uint16_t *dst, const uint16_t *base, int kt) {
        int kpos0 = kt * AP_BK;
        const uint16_t *b = ap_tile_base(kv, base, kpos0, kvh);
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
        float s[32];
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] = 0.f;
#pragma unroll
        for (int kk = 0; kk < AP_D / 16; kk++) {
            uint32_t af[4];
            ldmatrix_x4(af, sQ + (warp * 16 + (lane & 15)) * AP_LDS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t r[4];
                ldmatrix_x4(r, sK + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * AP_LDS + kk * 16 +
                                   ((lane >> 3) & 1) * 8);
                mma_bf16(&s[8 * np], af, r[0], r[1]);
                mma_bf16(&s[8 * np + 4], af, r[2], r[3]);
            }
        }
        __syncthreads(); /* every warp is done with sK */
        if (kt + 1 < n_kt) load_kv(sK, kv.k, kt + 1);
        cp_async_commit();

        /* online softmax on the fragments, then P as the next mma's A fragments */
        const int kbase = kt * AP_BK;
        float alpha[2];
        ap_softmax_tile(s, mrow, lrow, alpha, kbase, kbase + AP_BK - 1 > pos0 + q0, qpos, lane & 3);
        uint32_t pf[4][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            pf[nt >> 1][(nt & 1) * 2 + 0] = bf16x2_pack(s[4 * nt], s[4 * nt + 1]);
            pf[nt >> 1][(nt & 1) * 2 + 1] = bf16x2_pack(s[4 * nt + 2], s[4 * nt + 3]);
        }
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
    for (int hr = 0; hr < 2; hr++) lrow[hr] = ap_quad_sum(lrow[hr]);
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

/* ====== The wgmma variant (TL_ATTN_WG=1; its tile steps are the default kernel's). ======
 * math, inputs, outputs, masking: as attn_prefill_kernel (the same online softmax on the same
 *   score fragments; the final scaling divides by the row sum instead of multiplying by its
 *   inverse).
 * threads: one warpgroup (128) per block of 64 queries x one q head; warp w owns query rows
 *   16w .. 16w + 15 of S (wgmma D layout, k_wgmma.cuh: lane (g, t) rows g, g + 8, keys 8j + 2t +
 *   {0, 1}: the mma.sync fragments of attn_prefill_kernel).
 * S = Q K^T: 16 wgmma m64n64k16 with Q and K in shared memory, each as four 64-dim sub-tiles
 *   (K-major, 128-byte swizzle: k_wgdesc.cuh). P (bf16) goes to shared memory in that layout too
 *   (a 64-key row per query), each query's correction factor exp(m_old - m_new) beside it.
 * O^T += V^T P^T: O is kept transposed, dims as the wgmma's M and queries as its N, so P is the
 *   B operand straight from shared memory and V^T the A operand in registers, made by
 *   ldmatrix.trans from the V tile (keys x dims, padded rows as attn_prefill_kernel's): four
 *   64-dim blocks x four 16-key steps a tile; V is read from shared memory once a tile, not once
 *   a warp. The correction factors scale O^T's columns before the tile's products.
 * pipeline: attn_prefill_kernel's (K of the next tile loads during softmax and P V, V of the
 *   next during the next S).
 * epilogue: O^T / l into shared memory as f32 [query][dim] (over the K and V tiles; rows of 260
 *   floats put the 32 lanes' writes in 32 banks), then rows of 8 dims: the gate, bf16, 16-byte
 *   stores.
 * smem: Q 32 KB, K 32 KB, V 33 KB, P 8 KB, 2 x 64 floats: ~106 KB, two blocks an SM.
 * reference: cpu_attention (tests/gpu/test_prefill_kernels.c, TL_ATTN_WG=1); the host emulator
 *   (dev/emu/gemm_emu.sh) against a double softmax. */
#define AW_QK_BYTES (4 * 64 * 128) /* four 64-dim sub-tiles of 64 rows */
#define AW_V_BYTES  (AP_BK * AP_LDS * 2)
#define AW_P_BYTES  (64 * 128)
#define AW_OLD      260 /* f32 row stride of the output tile */
#define AW_SMEM     (2 * AW_QK_BYTES + AW_V_BYTES + AW_P_BYTES + 2 * 64 * 4 + 1024)

/* 16-byte chunk ch (8 dims) of row r of a 64 x 256 tile split into four swizzled sub-tiles */
static __device__ __forceinline__ uint32_t aw_chunk(int r, int ch) {
    return (uint32_t)((ch >> 3) * (64 * 128)) + wg_swz(r, ch & 7);
}

/* Q tile of query rows q0 .. q0 + 63 of head h into sQ (four swizzled 64-dim sub-tiles) by the
 * 128 threads tid of one warpgroup: cp.async (bf16 q, committed by the caller) or rounded to bf16
 * here (f32 q); rows past n are zero. */
static __device__ __forceinline__ void aw_load_q(uint8_t *sQ, const tl_gpu_heads &qh, int q0, int h,
                                                 int n, int in_f32, int tid) {
    for (int c = tid; c < AP_BQ * 32; c += AP_THREADS) {
        int r = c >> 5, ch = c & 31, tq = q0 + r;
        size_t off =
            (size_t)(tq < n ? tq : 0) * qh.tok_stride + (size_t)h * qh.head_stride + ch * 8;
        if (!in_f32) {
            cp_async16(sQ + aw_chunk(r, ch), (const uint16_t *)qh.p + off, tq < n ? 16 : 0);
        } else {
            uint4 packed = make_uint4(0, 0, 0, 0);
            if (tq < n) {
                const float *src = (const float *)qh.p + off;
                float4 a = *(const float4 *)src, b = *(const float4 *)(src + 4);
                packed = make_uint4(bf16x2_pack(a.x, a.y), bf16x2_pack(a.z, a.w),
                                    bf16x2_pack(b.x, b.y), bf16x2_pack(b.z, b.w));
            }
            *(uint4 *)(sQ + aw_chunk(r, ch)) = packed;
        }
    }
}

/* S = Q K^T of one 64-key tile (16 wgmma m64n64k16, both operands in shared memory), waited for */
static __device__ __forceinline__ void aw_scores(float (&s)[32], uint32_t sq_a, uint32_t sk_a) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < AP_D / 16; kk++) {
        uint32_t off = (kk >> 2) * (64 * 128) + (kk & 3) * 32;
        wg_mma_ss<64>(s, wg_desc(sq_a + off), wg_desc(sk_a + off), kk);
    }
    wg_commit();
    wg_wait<0>();
}

/* P (bf16, a 64-key row per query, swizzled as a K-major wgmma tile) and each query row's
 * correction factor into shared memory: warp w's rows 16w + g (+ 8) */
static __device__ __forceinline__ void aw_store_p(uint8_t *sP, float *s_alpha, const float (&s)[32],
                                                  const float (&alpha)[2], int warp, int g, int t) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++)
            *(uint32_t *)(sP + wg_swz(warp * 16 + g + 8 * hr, j) + 4 * t) =
                bf16x2_pack(s[4 * j + 2 * hr], s[4 * j + 2 * hr + 1]);
#pragma unroll
    for (int hr = 0; hr < 2; hr++)
        if (t == 0) s_alpha[warp * 16 + g + 8 * hr] = alpha[hr];
}

/* O^T's column q scaled by query q's correction factor, then O^T += V^T P^T over the tile: V^T
 * from ldmatrix.trans of sV (keys x dims, AP_LDS rows) as the A registers, P^T from sP; committed
 * (the caller waits). */
static __device__ __forceinline__ void aw_pv(float (&oacc)[4][32], const float *s_alpha,
                                             const uint16_t *sV, uint32_t sp_a, int rescale,
                                             int lane, int warp, int t) {
    if (rescale) {
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float a = s_alpha[8 * j + 2 * t + e];
#pragma unroll
                for (int mb = 0; mb < 4; mb++) {
                    oacc[mb][4 * j + e] *= a;
                    oacc[mb][4 * j + 2 + e] *= a;
                }
            }
    }
    uint32_t af[2][4][4]; /* V^T fragments (dims 64mb + 16w .., keys 16ks ..), two blocks */
#pragma unroll
    for (int mb = 0; mb < 4; mb++) {
        uint32_t(&a)[4][4] = af[mb & 1];
        if (mb >= 2) wg_wait<1>(); /* block mb - 2's wgmma read these registers */
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
            ldmatrix_x4_trans(a[ks], sV + (16 * ks + ((lane >> 4) & 1) * 8 + (lane & 7)) * AP_LDS +
                                         64 * mb + 16 * warp + ((lane >> 3) & 1) * 8);
        wg_fence(); /* a and the rescaled oacc were written by ordinary instructions */
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
            wg_mma_rs<64>(oacc[mb], a[ks], wg_desc(sp_a + ks * 32), rescale | ks);
        wg_commit();
    }
}

/* The row sums across the quad into s_l (t == 0 lanes); the caller's barrier follows. */
static __device__ __forceinline__ void aw_row_sums(float *s_l, float (&lrow)[2], int warp, int g,
                                                   int t) {
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        lrow[hr] = ap_quad_sum(lrow[hr]);
        if (t == 0) s_l[warp * 16 + g + 8 * hr] = lrow[hr];
    }
}

/* O^T / l into so as [query][dim] f32 (AW_OLD floats a row) */
static __device__ __forceinline__ void aw_stage_out(float *so, const float (&oacc)[4][32],
                                                    const float *s_l, int warp, int g, int t) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int q = 8 * j + 2 * t + e;
            float inv_l = 1.0f / s_l[q];
#pragma unroll
            for (int mb = 0; mb < 4; mb++) {
                so[q * AW_OLD + 64 * mb + 16 * warp + g] = oacc[mb][4 * j + e] * inv_l;
                so[q * AW_OLD + 64 * mb + 16 * warp + g + 8] = oacc[mb][4 * j + 2 + e] * inv_l;
            }
        }
}

/* The tile's output rows from so (128 threads tid): the gate, bf16, 16-byte stores. so holds
 * row r's dim d at r * ld + d, or (swz) at r * ld + (d ^ 8 (r % 4)) (as_stage_out_r's). */
static __device__ __forceinline__ void aw_store_rows(uint16_t *o, const float *so,
                                                     const tl_gpu_heads &gh, int q0, int h, int n,
                                                     int in_f32, int tid, int ld, bool swz) {
    for (int c = tid; c < AP_BQ * 32; c += AP_THREADS) {
        int r = c >> 5, d0 = (c & 31) * 8, tq = q0 + r;
        if (tq >= n) continue;
        const float *src = so + r * ld + (swz ? d0 ^ ((r & 3) << 3) : d0);
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = src[i];
        if (gh.p) {
            size_t goff = (size_t)tq * gh.tok_stride + (size_t)h * gh.head_stride + d0;
            float gv[8];
            if (in_f32) {
                float4 a = *(const float4 *)((const float *)gh.p + goff);
                float4 b = *(const float4 *)((const float *)gh.p + goff + 4);
                gv[0] = a.x, gv[1] = a.y, gv[2] = a.z, gv[3] = a.w;
                gv[4] = b.x, gv[5] = b.y, gv[6] = b.z, gv[7] = b.w;
            } else {
                uint4 u = *(const uint4 *)((const uint16_t *)gh.p + goff);
                uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
                    gv[2 * i] = bf16x2_lo(w[i]), gv[2 * i + 1] = bf16x2_hi(w[i]);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] *= sigmoid_f(gv[i]);
        }
        *(uint4 *)(o + (size_t)tq * (TL_N_HEAD * AP_D) + h * AP_D + d0) =
            make_uint4(bf16x2_pack(v[0], v[1]), bf16x2_pack(v[2], v[3]), bf16x2_pack(v[4], v[5]),
                       bf16x2_pack(v[6], v[7]));
    }
}

__global__ void __launch_bounds__(AP_THREADS, 2)
    attn_prefill_wg_kernel(uint16_t *o, tl_gpu_heads qh, tl_gpu_heads gh, tl_gpu_kv_view kv, int n,
                           int pos0, int in_f32) {
    pdl_wait(); /* launched with PDL on the batched path: cuda_common.cuh */
    extern __shared__ uint8_t aw_smem_raw[];
    uint8_t *sQ = aw_smem_raw + ((0u - smem_u32(aw_smem_raw)) & 1023u); /* stays a shared pointer */
    uint8_t *sK = sQ + AW_QK_BYTES, *sP = sK + AW_QK_BYTES + AW_V_BYTES;
    uint16_t *sV = (uint16_t *)(sK + AW_QK_BYTES);
    float *s_alpha = (float *)(sP + AW_P_BYTES), *s_l = s_alpha + 64;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int qt = blockIdx.x, h = blockIdx.y, kvh = h / (TL_N_HEAD / TL_N_HEAD_KV);
    const int q0 = qt * AP_BQ, kv_len = pos0 + n;
    const int q_last = pos0 + min(n, q0 + AP_BQ) - 1, n_kt = q_last / AP_BK + 1;

    aw_load_q(sQ, qh, q0, h, n, in_f32, tid);
    cp_async_commit();
    auto load_k = [&](int kt) {
        int kpos0 = kt * AP_BK;
        const uint16_t *b = ap_tile_base(kv, kv.k, kpos0, kvh);
        for (int c = tid; c < AP_BK * 32; c += AP_THREADS) {
            int r = c >> 5, ch = c & 31, ok = kpos0 + r < kv_len;
            cp_async16(sK + aw_chunk(r, ch), b + (size_t)(ok ? r : 0) * kv.tok_stride + ch * 8,
                       ok ? 16 : 0);
        }
    };
    auto load_v = [&](int kt) {
        int kpos0 = kt * AP_BK;
        const uint16_t *b = ap_tile_base(kv, kv.v, kpos0, kvh);
        for (int c = tid; c < AP_BK * 32; c += AP_THREADS) {
            int r = c >> 5, ch = c & 31, ok = kpos0 + r < kv_len;
            cp_async16(sV + r * AP_LDS + ch * 8, b + (size_t)(ok ? r : 0) * kv.tok_stride + ch * 8,
                       ok ? 16 : 0);
        }
    };
    load_k(0);
    cp_async_commit();
    load_v(0);
    cp_async_commit();

    const uint32_t sq_a = smem_u32(sQ), sk_a = smem_u32(sK), sp_a = smem_u32(sP);
    float oacc[4][32]; /* O^T, dim block mb: (dim 64mb + 16w + g + 8hh, query 8j + 2t + e) */
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const int qpos[2] = {pos0 + q0 + warp * 16 + g, pos0 + q0 + warp * 16 + g + 8};

    for (int kt = 0; kt < n_kt; kt++) {
        cp_async_wait<1>(); /* Q and K_kt landed (V_kt may be in flight) */
        wg_fence_proxy();
        __syncthreads();
        float s[32]; /* S: (query row 16w + g + 8hr, key 8j + 2t + e) at s[4j + 2hr + e] */
        aw_scores(s, sq_a, sk_a);
        __syncthreads(); /* the wgmma is done with sK */
        if (kt + 1 < n_kt) load_k(kt + 1);
        cp_async_commit();

        /* online softmax on the fragments, as attn_prefill_kernel; P to shared memory */
        const int kbase = kt * AP_BK;
        float alpha[2];
        ap_softmax_tile(s, mrow, lrow, alpha, kbase, kbase + AP_BK - 1 > pos0 + q0, qpos, t);
        aw_store_p(sP, s_alpha, s, alpha, warp, g, t);

        cp_async_wait<1>(); /* V_kt landed (K_kt+1 may be in flight) */
        wg_fence_proxy();   /* P, written by ordinary stores, is read by the wgmma */
        __syncthreads();
        aw_pv(oacc, s_alpha, sV, sp_a, kt > 0, lane, warp, t);
        wg_wait<0>();
        __syncthreads(); /* every warp is done with sV and sP */
        if (kt + 1 < n_kt) load_v(kt + 1);
        cp_async_commit();
    }
    cp_async_wait<0>();

    aw_row_sums(s_l, lrow, warp, g, t);
    __syncthreads();
    float *so = (float *)sK; /* 64 x AW_OLD floats over the K and V tiles */
    aw_stage_out(so, oacc, s_l, warp, g, t);
    __syncthreads();
    aw_store_rows(o, so, gh, q0, h, n, in_f32, tid, AW_OLD, false);
}

/* ====== The warp-specialised wgmma variants (PR, P in registers: the default since session 23).
 * ====== math, inputs, outputs: attn_prefill_wg_kernel's, whose per-tile steps they run (aw_*).
 * threads: two consumer warpgroups and a producer warpgroup (384; setmaxnreg gives the
 *   producer's registers to the consumers, 40 / 232). Block = 64 queries of the two query heads
 *   2y, 2y + 1, which read the same KV head: warpgroup w runs head 2y + w as
 *   attn_prefill_wg_kernel's block does, so each K and V tile is copied once for two heads (half
 *   the L2 reads), and the two warpgroups, meeting only at the stages, overlap each other's
 *   softmax with their wgmma as two blocks on an SM do.
 * PR (P in registers, the default): O = P V as FA3 computes it, not transposed: the softmax's
 *   P (bf16) stays in the registers it was computed in, which are exactly the A fragments of the
 *   next wgmma (the S accumulator layout is the A register layout), and V is the B operand read
 *   N-major from shared memory (imm-trans-b; V tiles stored as K's, four swizzled 64-dim
 *   sub-tiles: wg_desc_mn with LBO 8 KB between them, SBO 1 KB between 8-key groups): four
 *   m64n256k16 a tile instead of sixteen m64n64k16, no P or correction factors through shared
 *   memory, no named barriers in the loop, no V fragments in registers; a row's correction
 *   factor and sum stay in the lane that holds its accumulators. FA3's intra-warpgroup order:
 *   S of tile k and P V of tile k - 1 issued together, tile k's softmax while P V runs
 *   (as_consume_r). H100: 8K causal 379 -> 406 TFLOP/s, 4K after 28K cached 414 -> 437; the same
 *   order without the overlap measured between the two (removed). Else (PR false, TL_ATTN_WG=2,
 *   the default of sessions 22-23) attn_prefill_wg_kernel's O^T += V^T P^T with P through
 *   shared memory.
 * pipeline: 2-slot rings for K and for V. The producer copies K of tile kt into K slot kt % 2
 *   once both warpgroups released K of tile kt - 2 (mbarrier emptyK[slot], one arrival a
 *   consumer warp), its copies' completion arriving on fullK[slot] (cp.async.mbarrier.arrive.noinc,
 *   one a thread; thread i copies 16-byte column i % 32 of rows i / 32 + 4 j); V likewise. A
 *   consumer waits on fullK, fences the copies for the wgmma (async proxy), runs S, releases K;
 *   V after its P V. Without PR, P and the correction factors go through the warpgroup's own
 *   shared buffers (named barriers 1 + w of 128 threads).
 * not done (without PR): S of tile kt + 1 issued before tile kt's softmax needs a second score
 *   set; next to O^T's 128 accumulators and the V^T fragments ptxas spilled and serialised the
 *   wgmma (C7512) at the 232 registers a consumer gets.
 * epilogue: both warpgroups past their last tile (named barrier 3, 256 threads), warpgroup w's
 *   O / l over K slot w and V slot w, then attn_prefill_wg_kernel's row stores.
 * smem: Q 2 x 32 KB, (K 32 KB + V 33 KB) x 2, P 2 x 8 KB, factors and sums 1 KB, 8 mbarriers:
 *   ~213 KB, one block an SM (PR leaves P and the factors unused).
 * reference: cpu_attention (tests/gpu/test_prefill_kernels.c, default and TL_ATTN_WG=2); dev/emu.
 */
#define AS_THREADS     (3 * AP_THREADS)
#define AS_STAGE_BYTES (AW_QK_BYTES + AW_V_BYTES) /* K slot s, then V slot s */
#define AS_SMEM        (2 * AW_QK_BYTES + 2 * AS_STAGE_BYTES + 2 * AW_P_BYTES + 4 * 64 * 4 + 64 + 1024)
static_assert(AS_STAGE_BYTES >= AP_BQ * AW_OLD * 4, "a warpgroup's output tile fits a stage");
static_assert(AS_STAGE_BYTES % 1024 == 0 && AW_QK_BYTES % 1024 == 0, "V slots 1024-byte aligned");

/* the ring's mbarriers: full then empty, of K then of V, two slots each */
struct as_bars {
    uint64_t fk[2], fv[2], ek[2], ev[2];
};

/* The producer warpgroup (thread i): tiles 0 .. n_kt - 1 of KV head kvh into the slots; V as
 * padded rows, or (PR) as K's swizzled sub-tiles. */
template <bool PR>
static __device__ __forceinline__ void as_produce(uint8_t *stage0, as_bars *b,
                                                  const tl_gpu_kv_view &kv, int kvh, int kv_len,
                                                  int n_kt, int i) {
    const int lane = i & 31, r0 = i >> 5;
    for (int kt = 0; kt < n_kt; kt++) {
        const int sl = kt & 1, fill = kt >> 1, kpos0 = kt * AP_BK;
        uint8_t *sK = stage0 + sl * AS_STAGE_BYTES, *sV = sK + AW_QK_BYTES;
        if (fill > 0) mbar_wait(&b->ek[sl], (fill - 1) & 1); /* both released K of kt - 2 */
        const uint16_t *src = ap_tile_base(kv, kv.k, kpos0, kvh) + lane * 8;
#pragma unroll 4
        for (int r = r0; r < AP_BK; r += AP_THREADS / 32) {
            const int ok = kpos0 + r < kv_len;
            cp_async16(sK + aw_chunk(r, lane), src + (size_t)(ok ? r : 0) * kv.tok_stride,
                       ok ? 16 : 0);
        }
        mbar_arrive_cp_async(&b->fk[sl]);
        if (fill > 0) mbar_wait(&b->ev[sl], (fill - 1) & 1);
        src = ap_tile_base(kv, kv.v, kpos0, kvh) + lane * 8;
#pragma unroll 4
        for (int r = r0; r < AP_BK; r += AP_THREADS / 32) {
            const int ok = kpos0 + r < kv_len;
            uint8_t *dst = PR ? sV + aw_chunk(r, lane) : sV + (r * AP_LDS + lane * 8) * 2;
            cp_async16(dst, src + (size_t)(ok ? r : 0) * kv.tok_stride, ok ? 16 : 0);
        }
        mbar_arrive_cp_async(&b->fv[sl]);
    }
    cp_async_wait<0>();
}

/* A consumer warpgroup's running state over the tiles. */
struct as_cons {
    uint8_t *stage0, *sP;
    float *s_alpha;
    as_bars *b;
    uint32_t sq_a, sp_a;
    int pos0, q0, lane, warp, g, t, wg;
    int qpos[2];
    float mrow[2], lrow[2];

    __device__ __forceinline__ uint8_t *k_slot(int kt) const {
        return stage0 + (kt & 1) * AS_STAGE_BYTES;
    }
    /* K of tile kt landed and fenced for the wgmma */
    __device__ __forceinline__ void wait_k(int kt) {
        mbar_wait(&b->fk[kt & 1], (kt >> 1) & 1);
        wg_fence_proxy(); /* the producer's copies (generic proxy) before the wgmma's reads */
    }
    /* the tile's softmax on s, P and the factors through shared memory, then O^T += V^T P^T
     * (committed, not waited for) */
    __device__ __forceinline__ void softmax_pv(float (&oacc)[4][32], float (&s)[32], int kt) {
        const int kbase = kt * AP_BK;
        float alpha[2];
        ap_softmax_tile(s, mrow, lrow, alpha, kbase, kbase + AP_BK - 1 > pos0 + q0, qpos, t);
        bar_sync_named(1 + wg, AP_THREADS); /* the warpgroup's P V of tile kt - 1 is done */
        aw_store_p(sP, s_alpha, s, alpha, warp, g, t);
        wg_fence_proxy(); /* P, written by ordinary stores, is read by the wgmma */
        bar_sync_named(1 + wg, AP_THREADS);
        mbar_wait(&b->fv[kt & 1], (kt >> 1) & 1);
        aw_pv(oacc, s_alpha, (const uint16_t *)(k_slot(kt) + AW_QK_BYTES), sp_a, kt > 0, lane, warp,
              t);
    }
    /* PR steps. o[4j + 2h + e] = (query 16w + g + 8h, dim 8j + 2t + e). The tile's softmax on
     * s and its rows' correction factors; then (pack_p) P as the A fragments of the P V wgmma
     * (keys 16ks .. 16ks + 15 in pf[ks]: attn_prefill_kernel's). */
    __device__ __forceinline__ void softmax_s(float (&alpha)[2], float (&s)[32], int kt) {
        const int kbase = kt * AP_BK;
        ap_softmax_tile(s, mrow, lrow, alpha, kbase, kbase + AP_BK - 1 > pos0 + q0, qpos, t);
    }
    static __device__ __forceinline__ void pack_p(uint32_t (&pf)[4][4], const float (&s)[32]) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            pf[j >> 1][(j & 1) * 2 + 0] = bf16x2_pack(s[4 * j], s[4 * j + 1]);
            pf[j >> 1][(j & 1) * 2 + 1] = bf16x2_pack(s[4 * j + 2], s[4 * j + 3]);
        }
    }
    /* O += P V of tile kt once its V landed (committed, not waited for; kt 0 sets O) */
    __device__ __forceinline__ void pv_r(float (&o)[128], const uint32_t (&pf)[4][4], int kt) {
        mbar_wait(&b->fv[kt & 1], (kt >> 1) & 1);
        wg_fence_proxy(); /* V's copies before the wgmma's reads */
        wg_fence();       /* pf and the rescaled o were written by ordinary instructions */
        const uint32_t sv_a = smem_u32(k_slot(kt) + AW_QK_BYTES);
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
            wg_mma_rs_tb256(o, pf[ks], wg_desc_mn(sv_a + ks * 2048, 64 * 128, 1024), kt > 0 || ks);
        wg_commit();
    }
};

/* O's rows scaled by their correction factors */
static __device__ __forceinline__ void as_rescale(float (&o)[128], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < 32; j++) {
        o[4 * j] *= alpha[0], o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1], o[4 * j + 3] *= alpha[1];
    }
}

/* The tiles one after another: S, softmax, P V (O^T as float[4][32]). */
static __device__ __forceinline__ void as_consume(as_cons &c, float (&oacc)[4][32], int n_kt) {
    for (int kt = 0; kt < n_kt; kt++) {
        float s[32];
        c.wait_k(kt);
        aw_scores(s, c.sq_a, smem_u32(c.k_slot(kt)));
        if (c.lane == 0) mbar_arrive(&c.b->ek[kt & 1]); /* this warp is done with K */
        c.softmax_pv(oacc, s, kt);
        wg_wait<0>();
        if (c.lane == 0) mbar_arrive(&c.b->ev[kt & 1]);
    }
}

/* PR, in FA3's intra-warpgroup order: S of tile kt is issued, then P V of tile kt - 1, and
 * tile kt's softmax runs while that P V is on the tensor cores; once it is done, O is rescaled
 * by tile kt's factors and tile kt's P packed into the A fragments (not before: the in-flight
 * wgmma reads them). */
static __device__ __forceinline__ void as_consume_r(as_cons &c, float (&o)[128], int n_kt) {
    float s[32], alpha[2];
    uint32_t pf[4][4];
    c.wait_k(0);
    aw_scores(s, c.sq_a, smem_u32(c.k_slot(0)));
    if (c.lane == 0) mbar_arrive(&c.b->ek[0]);
    c.softmax_s(alpha, s, 0);
    c.pack_p(pf, s);
    for (int kt = 1; kt < n_kt; kt++) {
        c.wait_k(kt);
        wg_fence(); /* s was read and written by the softmax */
#pragma unroll
        for (int kk = 0; kk < AP_D / 16; kk++) {
            uint32_t off = (kk >> 2) * (64 * 128) + (kk & 3) * 32;
            wg_mma_ss<64>(s, wg_desc(c.sq_a + off), wg_desc(smem_u32(c.k_slot(kt)) + off), kk);
        }
        wg_commit();
        c.pv_r(o, pf, kt - 1);
        wg_wait<1>(); /* S of tile kt is done */
        wg_pin(s);
        if (c.lane == 0) mbar_arrive(&c.b->ek[kt & 1]);
        c.softmax_s(alpha, s, kt);
        wg_wait<0>(); /* P V of tile kt - 1 is done */
        wg_pin(o);
        if (c.lane == 0) mbar_arrive(&c.b->ev[(kt - 1) & 1]);
        as_rescale(o, alpha);
        c.pack_p(pf, s);
    }
    c.pv_r(o, pf, n_kt - 1);
    wg_wait<0>();
    wg_pin(o);
    if (c.lane == 0) mbar_arrive(&c.b->ev[(n_kt - 1) & 1]);
}

/* PR: O / l into so as [query][dim] f32, 256 floats a row, dims XOR 8 (query % 4) (8-byte
 * stores of a half-warp in distinct banks); l = the row sums (already summed across the quad) */
static __device__ __forceinline__ void as_stage_out_r(float *so, const float (&o)[128],
                                                      const float (&l)[2], int warp, int g, int t) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int q = warp * 16 + g + 8 * h;
        const float inv_l = 1.0f / l[h];
        float *row = so + q * 256;
#pragma unroll
        for (int j = 0; j < 32; j++)
            *(float2 *)(row + ((8 * j + 2 * t) ^ ((q & 3) << 3))) =
                make_float2(o[4 * j + 2 * h] * inv_l, o[4 * j + 2 * h + 1] * inv_l);
    }
}

/* PR: P in registers (the default); else P through shared memory (TL_ATTN_WG=2) */
template <bool PR>
__global__ void __launch_bounds__(AS_THREADS, 1)
    attn_prefill_ws_kernel(uint16_t *o, tl_gpu_heads qh, tl_gpu_heads gh, tl_gpu_kv_view kv, int n,
                           int pos0, int in_f32) {
    pdl_wait(); /* launched with PDL on the batched path: cuda_common.cuh */
    extern __shared__ uint8_t aw_smem_raw[];
    uint8_t *base = aw_smem_raw + ((0u - smem_u32(aw_smem_raw)) & 1023u);
    uint8_t *stage0 = base + 2 * AW_QK_BYTES, *sP0 = stage0 + 2 * AS_STAGE_BYTES;
    float *sf = (float *)(sP0 + 2 * AW_P_BYTES); /* alpha of wg 0, 1, then l of wg 0, 1 */
    as_bars *bars = (as_bars *)(sf + 4 * 64);
    const int tid = threadIdx.x, lane = tid & 31;
    /* heaviest query tiles first: the causal tail is short */
    const int qt = gridDim.x - 1 - blockIdx.x, kvh = 2 * blockIdx.y / (TL_N_HEAD / TL_N_HEAD_KV);
    const int q0 = qt * AP_BQ, kv_len = pos0 + n;
    const int q_last = pos0 + min(n, q0 + AP_BQ) - 1, n_kt = q_last / AP_BK + 1;
    if (tid == 0)
        for (int sl = 0; sl < 2; sl++) {
            mbar_init(&bars->fk[sl], AP_THREADS), mbar_init(&bars->fv[sl], AP_THREADS);
            mbar_init(&bars->ek[sl], 8), mbar_init(&bars->ev[sl], 8);
        }
    __syncthreads();
    if (tid >= 2 * AP_THREADS) { /* the roles never merge: ptxas budgets each */
        regs_dec<40>();
        return as_produce<PR>(stage0, bars, kv, kvh, kv_len, n_kt, tid - 2 * AP_THREADS);
    }
    regs_inc<232>();

    const int wg = tid >> 7, ltid = tid & 127, warp = ltid >> 5, g = lane >> 2, t = lane & 3;
    const int h = 2 * blockIdx.y + wg;
    uint8_t *sQ = base + wg * AW_QK_BYTES;
    aw_load_q(sQ, qh, q0, h, n, in_f32, ltid);
    cp_async_commit();
    cp_async_wait<0>();
    wg_fence_proxy();
    bar_sync_named(1 + wg, AP_THREADS); /* the warpgroup's Q tile is in place */

    as_cons c;
    c.stage0 = stage0, c.sP = sP0 + wg * AW_P_BYTES, c.s_alpha = sf + wg * 64, c.b = bars;
    c.sq_a = smem_u32(sQ), c.sp_a = smem_u32(c.sP);
    c.pos0 = pos0, c.q0 = q0, c.lane = lane, c.warp = warp, c.g = g, c.t = t, c.wg = wg;
    c.qpos[0] = pos0 + q0 + warp * 16 + g, c.qpos[1] = c.qpos[0] + 8;
    c.mrow[0] = c.mrow[1] = -INFINITY, c.lrow[0] = c.lrow[1] = 0.f;
    float *so = (float *)(stage0 + wg * AS_STAGE_BYTES); /* the output tile, after the loop */
    if constexpr (PR) {
        float oacc[128]; /* O: (query 16w + g + 8h, dim 8j + 2t + e) at oacc[4j + 2h + e] */
        as_consume_r(c, oacc, n_kt);
#pragma unroll
        for (int hr = 0; hr < 2; hr++) c.lrow[hr] = ap_quad_sum(c.lrow[hr]);
        bar_sync_named(3, 2 * AP_THREADS); /* both warpgroups are past their last tile */
        as_stage_out_r(so, oacc, c.lrow, warp, g, t);
    } else {
        float oacc[4][32]; /* O^T, dim block mb: (dim 64mb + 16w + g + 8hh, query 8j + 2t + e) */
        as_consume(c, oacc, n_kt);
        float *s_l = sf + (2 + wg) * 64;
        aw_row_sums(s_l, c.lrow, warp, g, t);
        bar_sync_named(3, 2 * AP_THREADS); /* both warpgroups are past their last tile */
        aw_stage_out(so, oacc, s_l, warp, g, t);
    }
    bar_sync_named(1 + wg, AP_THREADS);
    aw_store_rows(o, so, gh, q0, h, n, in_f32, ltid, PR ? 256 : AW_OLD, PR);
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
    if (smem_limit<attn_prefill_kernel>(AP_SMEM) || smem_limit<attn_prefill_wg_kernel>(AW_SMEM) ||
        smem_limit<attn_prefill_ws_kernel<false>>(AS_SMEM) ||
        smem_limit<attn_prefill_ws_kernel<true>>(AS_SMEM))
        return TL_ERR_CUDA;
    dim3 grid((n + AP_BQ - 1) / AP_BQ, TL_N_HEAD);
    /* the warp-specialised kernel with P in registers unless TL_ATTN_WG=2 (warp-specialised, P
     * through shared memory: the default of sessions 22-23), 1 (one warpgroup a head) or 0
     * (mma.sync); read at each call: the tests switch it. H100, session 23: 128K prefill 22,131
     * -> 22,873 tok/s, the kernel at 8K causal 379 -> 406 TFLOP/s. */
    const char *wg = getenv("TL_ATTN_WG");
    const int kind = wg && *wg ? atoi(wg) : 3;
    const dim3 gws(grid.x, TL_N_HEAD / 2);
    const int f32 = (int)(flags & TL_ATTN_IN_F32);
    if (kind == 2)
        TL_LAUNCH(st, "attn_prefill_ws", attn_prefill_ws_kernel<false>, gws, dim3(AS_THREADS),
                  AS_SMEM, o, *q, g, *kv, n, pos0, f32);
    else if (kind != 0 && kind != 1)
        TL_LAUNCH(st, "attn_prefill_wsr", attn_prefill_ws_kernel<true>, gws, dim3(AS_THREADS),
                  AS_SMEM, o, *q, g, *kv, n, pos0, f32);
    else if (kind == 1)
        TL_LAUNCH(st, "attn_prefill_wg", attn_prefill_wg_kernel, grid, dim3(AP_THREADS), AW_SMEM, o,
                  *q, g, *kv, n, pos0, f32);
    else
        TL_LAUNCH(st, "attn_prefill", attn_prefill_kernel, grid, dim3(AP_THREADS), AP_SMEM, o, *q,
                  g, *kv, n, pos0, f32);
    return 0;
}
