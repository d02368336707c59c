/* Short causal depthwise convolution (kernel 4) with a rolling state, + SiLU: the GDN input
 * mixing of docs/model.md §2.4 step 2. */
#include "cuda/cuda_common.cuh"

/* conv1d_silu_kernel
 *   out[t, ch] = silu( sum_{k=0..3} w[ch, k] * c_{t-3+k}[ch] ),  c_{t} = in[t, ch]; the three
 *   inputs before a segment's first token come from state[slot][0..2][ch] (oldest first), which
 *   is shifted to the segment's last three inputs at the end.
 * Shapes: in [n_tok, ld_in] (first C columns used), out [n_tok, C], w [C, 4], state
 *   [n_slot][3][C] f32.
 * Threads: one thread per (segment, channel), looping over the segment's tokens in order.
 * Bytes: in + out (8 * C per token) + state (2 * 12 * C per segment) + w.
 * Tested against cpu_conv1d_step (test_kernels.c: test_conv1d). */
__global__ void conv1d_silu_kernel(float *out, float *state, const float *in, int ld_in,
                                   const float *w, int C, tl_gpu_seqs s) {
    pdl_trigger();
    pdl_wait();
    int ch = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y;
    if (ch >= C) return;
    int slot = s.seg_slot[g], t0 = s.seg_tok0[g], n = s.seg_n[g];
    float *st = state + (size_t)slot * 3 * C + ch;
    float s0 = st[0], s1 = st[C], s2 = st[2 * C];
    float4 wv = *(const float4 *)(w + (size_t)ch * 4);
    for (int i = 0; i < n; i++) {
        size_t t = (size_t)(t0 + i);
        float xv = in[t * ld_in + ch];
        out[t * C + ch] = conv4_silu(wv, s0, s1, s2, xv);
        s0 = s1, s1 = s2, s2 = xv;
    }
    st[0] = s0, st[C] = s1, st[2 * C] = s2;
}

extern "C" int tl_gpu_conv1d(float *out, float *state, const float *in, int ld_in, const float *w,
                             int C, const tl_gpu_seqs *s, const tl_gpu_stream *st) {
    if (s->n_seg <= 0) return 0;
    dim3 grid(CEIL_DIV(C, 256), s->n_seg);
    TL_LAUNCH(st, "conv1d", conv1d_silu_kernel, grid, dim3(256), 0, out, state, in, ld_in, w, C,
              *s);
    return 0;
}
