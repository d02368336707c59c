/* Private to the prefill GEMM kernels (k_gemm.cu, k_gemm_wgr.cu): the kernels' arguments, the
 * lookup of a block's token tile in the MoE plan, the epilogue's store of two outputs, the
 * cp.async prologue, and the wgr kernel's launch. */
#ifndef TL_K_GEMM_COMMON_CUH
#define TL_K_GEMM_COMMON_CUH

#include "cuda/k_gemm.cuh"

#define GM_BK 64 /* k columns a pipeline stage (one 4-bit group) */

enum { GM_DENSE = 0, GM_MOE_GATHER = 1, GM_MOE_SCATTER = 2 };

typedef struct gemm_args {
    const uint16_t *x; /* A rows, row stride K */
    const uint8_t *w;  /* bf16 [N, K] or q4 words */
    const uint32_t *sb;
    void *y;
    const void *res;
    int M, N, K;
    int ldy; /* elements per output row */
    int flags;
    int mode;             /* GM_DENSE / GM_MOE_GATHER / GM_MOE_SCATTER */
    const int32_t *plan;  /* moe plan (above) */
    long long w_estride;  /* bytes between experts' w */
    long long sb_estride; /* u32 words between experts' sb */
    float *ws;            /* split-K (dense only): f32 partials [gridDim.z][M][N], else NULL */
    int n_sh; /* MoE: 0, or the tokens whose shared expert (expert 256 of w) runs as plan rows
               * M .. M + n_sh - 1 after the routed ones (gm_tile, gm_asg) */
    int trig; /* pdl_enter's: trigger the successor after the wait (tl_pdl_trig) */
    /* conv1d fused into a dense wgr product (tl_gpu_gemm_conv1d; cv_C 0: none): output rows
     * r < cv_C are the conv's inputs: cv_out [M][cv_C] gets the conv1d + SiLU of each token past
     * its tile's first three (wr_store_conv), cv_edge [tile][6][cv_C] the raw values of each
     * tile's first and last three tokens (cb_conv1d_edges finishes from them); y gets rows >= cv_C
     */
    float *cv_out, *cv_edge;
    const float *cv_w; /* [cv_C][4] */
    int cv_C;
} gemm_args;

/* The token rows m0 .. m_end-1 of this block's tile (blockIdx.y): dense, or one expert's tile of
 * the MoE plan, whose weights then start at that expert (wb, sbb advanced). perm: the plan's
 * assignment list (NULL when dense). false: a tile past the plan's count (the block exits).
 * The expert of a routed tile is the largest e with ts[e] <= tile (ts: the plan's tile prefix
 * sums, non-decreasing from ts[0] = 0, so that e is the count of such entries minus one): each
 * lane of every warp tests 8 of the 256 entries, all loads in flight at once, and the warp adds
 * the counts. A binary search here was 8 dependent global loads (~2 us) at the start of every
 * block: 16% of the MoE down-projection's stall samples at a decode batch of 64 (ncu, session
 * 17). Called by every thread of a block, whole warps. */
template <int BITS, int BM>
static __device__ __forceinline__ bool gm_tile(const gemm_args &p, const uint8_t **wb,
                                               const uint32_t **sbb, const int32_t **perm, int *m0,
                                               int *m_end) {
    *perm = NULL;
    if (p.mode == GM_DENSE) {
        *m0 = blockIdx.y * BM, *m_end = p.M;
        return true;
    }
    const int32_t *off = p.plan + PLAN_OFF;
    const int32_t *ts = p.plan + (BM == 128 ? PLAN_TS128 : BM == 64 ? PLAN_TS64 : PLAN_TS16);
    *perm = p.plan + PLAN_PERM;
    const int tile = blockIdx.y, n_routed = ts[256];
    if (tile >= n_routed) { /* past the routed tiles: the shared expert's, if it runs here */
        int s = tile - n_routed;
        if (s * BM >= p.n_sh) return false;
        *m0 = p.M + s * BM, *m_end = p.M + p.n_sh;
        *wb += 256 * p.w_estride;
        if (BITS == 4) *sbb += 256 * p.sb_estride;
        return true;
    }
    const int *tl = ts + 8 * (threadIdx.x & 31);
    int le = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) le += tl[j] <= tile;
    const int e = __reduce_add_sync(0xffffffffu, le) - 1; /* a non-empty expert */
    *m0 = off[e] + (tile - ts[e]) * BM;
    *m_end = off[e + 1];
    *wb += e * p.w_estride;
    if (BITS == 4) *sbb += e * p.sb_estride;
    return true;
}

/* The assignment of MoE plan row m: a routed one (token * 8 + slot, from the plan's list perm) or,
 * past the plan's p.M rows, the shared expert's row m itself (token m - p.M). A gathering GEMM
 * reads token gm_tok(a); a scattering one writes output row a (rows M .. M + n_sh - 1: the shared
 * expert's outputs, after the routed ones). */
static __device__ __forceinline__ int gm_asg(const gemm_args &p, const int32_t *perm, int m) {
    return m < p.M ? perm[m] : m;
}
static __device__ __forceinline__ int gm_tok(const gemm_args &p, int a) {
    return a < p.M ? a >> 3 : a - p.M;
}

/* The epilogue of two adjacent outputs (v0, v1) at element idx of y:
 * SwiGLU already applied by the caller; + res (TL_GEMM_ADD_RES); f32 or bf16 store. */
static __device__ __forceinline__ void gm_store2(const gemm_args &p, size_t idx, float v0,
                                                 float v1) {
    if (p.flags & TL_GEMM_OUT_F32) {
        if (p.flags & TL_GEMM_ADD_RES) {
            float2 rv = *(const float2 *)((const float *)p.res + idx);
            v0 += rv.x;
            v1 += rv.y;
        }
        *(float2 *)((float *)p.y + idx) = make_float2(v0, v1);
    } else {
        if (p.flags & TL_GEMM_ADD_RES) {
            uint32_t rv = *(const uint32_t *)((const uint16_t *)p.res + idx);
            v0 += bf16x2_lo(rv);
            v1 += bf16x2_hi(rv);
        }
        *(uint32_t *)((uint16_t *)p.y + idx) = bf16x2_pack(v0, v1);
    }
}

/* The pipeline prologue of the mma kernels: the first STAGES - 1 stages' weights, the wait for
 * the previous kernel (dense products only: their weights do not depend on it; a MoE plan does,
 * and its kernel waited before reading it), then those stages' activations. cp.async group 0
 * holds every prologue weight tile, so the main loop's waits stay correct. */
template <int STAGES, class LoadA, class LoadB>
static __device__ __forceinline__ void gm_prologue(int KT, bool dense, int trig, LoadA load_a,
                                                   LoadB load_b) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++)
        if (s < KT) load_b(s, s);
    if (dense) pdl_enter(trig);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < KT) load_a(s, s);
        cp_async_commit();
    }
}

/* The wgr kernel (k_gemm_wgr.cu) with wgs (2 or 4) warpgroups over `tiles` token tiles (grid y;
 * WR_NT tokens each, or the MoE plan's 128-row tiles), K split ksplit ways (dense only, p->ws set
 * when ksplit > 1: raw partials for gemm_splitk_reduce). */
#define WR_NT 128
int cb_gemm_wgr(const gemm_args *p, int wgs, int tiles, int ksplit, const tl_gpu_stream *st);

/* The conv1d outputs a fused product (gemm_args.cv_*) left out, its first three tokens of each
 * WR_NT-token tile, from the tiles' edge values and the old conv state [3][C] of the one segment
 * (tokens 0 .. n - 1); then the state becomes the last three inputs (k_conv1d.cu). */
int cb_conv1d_edges(float *out, float *state, const float *edge, const float *w, int C, int n,
                    const tl_gpu_stream *st);

#endif
