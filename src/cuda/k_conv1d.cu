/* Short causal depthwise convolution (kernel 4) with a rolling state, + SiLU: the GDN input
 * mixing of docs/model.md §2.4 step 2. */
#include "cuda/k_gemm_common.cuh"

/* conv1d_silu_kernel
 *   out[t, ch] = silu( sum_{k=0..3} w[ch, k] * c_{t-3+k}[ch] ),  c_t = in[t, ch] for the
 *   segment's tokens, and c_{-3..-1} = state[slot][0..2][ch] (oldest first); the state becomes
 *   the segment's last three inputs c_{n-3..n-1}.
 * Shapes: in [n_tok, ld_in] (first C columns used), out [n_tok, C], w [C, 4], state
 *   [n_slot][3][C] f32.
 * Threads: one thread per (segment, channel, chunk of CV_CHUNK tokens), sliding over its chunk;
 *   a chunk after the first reads its three predecessors from `in`. Only chunk 0 reads and
 *   writes the state (it computes the new state from `in` right after reading the old one), so
 *   the chunks run in parallel without a race. Every output is the same expression as in a
 *   token-serial loop: bit-identical to it.
 * Ring (gpu.h tl_gpu_ring; a speculative verify): chunk 0's thread also writes the state after
 * each token with a copy, c_{i-2}, c_{i-1}, c_i, from the old state and `in` (no reads of out).
 * Bytes: in + out (8 * C per token) + state (2 * 12 * C per segment) + w (+ 12 * C per copy).
 * Tested against cpu_conv1d_step (test_kernels.c: test_conv1d, with copies). */
#define CV_CHUNK 32
__global__ void conv1d_silu_kernel(float *out, float *state, const float *in, int ld_in,
                                   const float *w, int C, tl_gpu_seqs s, tl_gpu_ring ring) {
    pdl_trigger();
    pdl_wait();
    int ch = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y, i0 = blockIdx.z * CV_CHUNK;
    if (ch >= C) return;
    int n = s.seg_n[g];
    if (i0 >= n) return;
    const float *ic = in + (size_t)s.seg_tok0[g] * ld_in + ch;
    float *oc = out + (size_t)s.seg_tok0[g] * C + ch;
    float s0, s1, s2;
    if (i0 == 0) {
        float *st = state + (size_t)s.seg_slot[g] * 3 * C + ch;
        s0 = st[0], s1 = st[C], s2 = st[2 * C];
        float old[3] = {s0, s1, s2};
        for (int k = 0; k < 3; k++) {
            int j = n - 3 + k; /* c_j; j < 0: the old state's entry j + 3 */
            st[(size_t)k * C] = j >= 0 ? ic[(size_t)j * ld_in] : old[j + 3];
        }
        int slot = s.seg_slot[g], p0 = ring.base ? ring.pos0[slot] : -1;
        if (p0 >= 0) { /* copies of the state after tokens i (positions p0 .. p0 + ring.n - 1) */
            int pos = s.seg_pos0[g];
            for (int i = max(0, p0 - pos); i < min(n, p0 + ring.n - pos); i++) {
                float *rc =
                    (float *)ring.base + ((size_t)slot * ring.n + (pos + i - p0)) * 3 * C + ch;
                for (int k = 0; k < 3; k++) {
                    int j = i - 2 + k;
                    rc[(size_t)k * C] = j >= 0 ? ic[(size_t)j * ld_in] : old[j + 3];
                }
            }
        }
    } else {
        s0 = ic[(size_t)(i0 - 3) * ld_in], s1 = ic[(size_t)(i0 - 2) * ld_in];
        s2 = ic[(size_t)(i0 - 1) * ld_in];
    }
    float4 wv = *(const float4 *)(w + (size_t)ch * 4);
    int i1 = min(n, i0 + CV_CHUNK);
    for (int i = i0; i < i1; i++) {
        float xv = ic[(size_t)i * ld_in];
        oc[(size_t)i * C] = conv4_silu(wv, s0, s1, s2, xv);
        s0 = s1, s1 = s2, s2 = xv;
    }
}

extern "C" int tl_gpu_conv1d(float *out, float *state, const float *in, int ld_in, const float *w,
                             int C, const tl_gpu_seqs *s, const tl_gpu_ring *ring,
                             const tl_gpu_stream *st) {
    if (s->n_seg <= 0) return 0;
    tl_gpu_ring r = {NULL, NULL, 0};
    if (ring && ring->base) r = *ring;
    int longest = s->n_tok - s->n_seg + 1; /* every segment has at least one token */
    dim3 grid(CEIL_DIV(C, 256), s->n_seg, CEIL_DIV(longest, CV_CHUNK));
    TL_LAUNCH(st, "conv1d", conv1d_silu_kernel, grid, dim3(256), 0, out, state, in, ld_in, w, C, *s,
              r);
    return 0;
}

/* conv1d_edges_kernel: the rest of a conv1d fused into the in-projection's wgr product
 * (wr_store_conv, k_gemm_wgr.cu), which wrote every output but the first three tokens of each
 * WR_NT-token tile. Thread (channel ch, tile j) computes tile j's first min(3, its tokens)
 * outputs from raw inputs c_t (edge slots of the tile holding t; c_{-3..-1} = the old state);
 * tile 0's thread then writes the new state c_{n-3..n-1} (after reading the old one, which no
 * other thread reads). conv1d_silu_kernel's expression on the same values: the same bits.
 * Bytes: 6 * C floats read a tile + 3 * C written, the state. */
__device__ __forceinline__ float cv_edge_raw(const float *edge, const float *old, int C, int n,
                                             int t) {
    if (t < 0) return old[t + 3];
    int j = t / WR_NT, o = t - j * WR_NT, len = min(WR_NT, n - j * WR_NT);
    int slot = o < 3 ? o : 6 + o - len; /* o >= len - 3 here: every t asked lies at an edge */
    return edge[((size_t)j * 6 + slot) * C];
}

__global__ void conv1d_edges_kernel(float *out, float *state, const float *edge, const float *w,
                                    int C, int n, int trig) {
    pdl_enter(trig);
    int ch = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y;
    if (ch >= C) return;
    const float *ed = edge + ch;
    float old[3] = {0.f, 0.f, 0.f};
    float *st = state + ch;
    if (j == 0) old[0] = st[0], old[1] = st[C], old[2] = st[2 * C];
    float4 wv = *(const float4 *)(w + (size_t)ch * 4);
    int t0 = j * WR_NT, t1 = min(n, t0 + 3);
    for (int t = t0; t < t1; t++)
        out[(size_t)t * C + ch] =
            conv4_silu(wv, cv_edge_raw(ed, old, C, n, t - 3), cv_edge_raw(ed, old, C, n, t - 2),
                       cv_edge_raw(ed, old, C, n, t - 1), cv_edge_raw(ed, old, C, n, t));
    if (j == 0)
        for (int k = 0; k < 3; k++) st[(size_t)k * C] = cv_edge_raw(ed, old, C, n, n - 3 + k);
}

int cb_conv1d_edges(float *out, float *state, const float *edge, const float *w, int C, int n,
                    const tl_gpu_stream *st) {
    if (n <= 0) return 0;
    TL_LAUNCH(st, "conv1d_edges", conv1d_edges_kernel, dim3(CEIL_DIV(C, 256), CEIL_DIV(n, WR_NT)),
              dim3(256), 0, out, state, edge, w, C, n, tl_pdl_trig(st));
    return 0;
}
