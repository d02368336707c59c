/* Attention prologue: per-head q/k RMSNorm1p, partial NeoX RoPE, and the K/V cache write. */
#include "cuda/cuda_common.cuh"

#define HD    256 /* attention head dim (TL_HEAD_DIM) */
#define N_ROT 64  /* rotary dims (TL_N_ROT) */

/* qk_rope_kv_kernel  (docs/model.md §2.2 steps 3-4, §2.3)
 *   q_h = rope(rmsnorm(q_h) * q_norm),  k_h = rope(rmsnorm(k_h) * k_norm),  v_h copied
 *   rope: pairs (d, d+32), d < 32: theta_j = pos * (1 / base^(2j/64)) in fp32 (as HF)
 * Shapes: proj [n_tok, ld_proj]: head h query at h*512, gate at h*512+256 (untouched here), K at
 *   n_head*512, V at n_head*512 + n_kv*256; q_out [n_tok, n_head, 256] f32;
 *   kc, vc paged caches (gpu.h: tl_gpu_kv_pages) [n_page * TL_KV_PAGE][n_kv][256] bf16.
 * Threads: one block of 256 (thread = dim) per (token, head), heads 0..n_head-1 are q heads,
 *   then n_kv k heads (which also copy V).
 * Bytes: ~(n_head + 2 n_kv) * 256 * 4 read, q f32 + K/V bf16 written per token.
 * Tested against cpu_rmsnorm + cpu_rope_neox (test_kernels.c: test_qk_rope). */
__global__ void qk_rope_kv_kernel(float *q_out, uint16_t *kc, uint16_t *vc, const float *proj,
                                  int ld_proj, const float *q_norm, const float *k_norm, int n_head,
                                  int n_kv, tl_gpu_kv_pages pg, float theta, float eps,
                                  tl_gpu_seqs s) {
    __shared__ float sx[HD];
    __shared__ float sbuf[32];
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, hh = blockIdx.y, d = threadIdx.x;
    int pos = s.tok_pos[t], slot = s.tok_slot[t];
    const float *pr = proj + (size_t)t * ld_proj;
    int is_q = hh < n_head, h = is_q ? hh : hh - n_head;
    float x = is_q ? pr[h * 2 * HD + d] : pr[n_head * 2 * HD + h * HD + d];
    float ss = block_sum(x * x, sbuf);
    x = x * rsqrtf(ss / (float)HD + eps) * (is_q ? q_norm[d] : k_norm[d]);
    sx[d] = x;
    __syncthreads();
    if (d < N_ROT) {
        int j = d & (N_ROT / 2 - 1);
        float inv = 1.0f / powf(theta, (float)(2 * j) / (float)N_ROT);
        float ang = (float)pos * inv;
        float c = cosf(ang), sn = sinf(ang);
        x = d < N_ROT / 2 ? sx[d] * c - sx[d + N_ROT / 2] * sn : sx[d] * c + sx[d - N_ROT / 2] * sn;
    }
    if (is_q) {
        __syncthreads(); /* every thread has read its element before the in-place write */
        if (q_out)
            q_out[((size_t)t * n_head + h) * HD + d] = x;
        else
            ((float *)proj)[(size_t)t * ld_proj + h * 2 * HD + d] = x;
    } else {
        size_t off = ((size_t)kv_row(pg, slot, pos) * n_kv + h) * HD + d;
        kc[off] = f2bf(x);
        vc[off] = f2bf(pr[n_head * 2 * HD + n_kv * HD + h * HD + d]);
    }
}

extern "C" int tl_gpu_qk_rope_kv(float *q_out, uint16_t *kc, uint16_t *vc, const float *proj,
                                 int ld_proj, const float *q_norm, const float *k_norm, int n_head,
                                 int n_kv, const tl_gpu_kv_pages *pg, float theta, float eps,
                                 const tl_gpu_seqs *s, const tl_gpu_stream *st) {
    if (s->n_tok <= 0) return 0;
    dim3 grid(s->n_tok, n_head + n_kv);
    TL_LAUNCH(st, "qk_rope_kv", qk_rope_kv_kernel, grid, dim3(HD), 0, q_out, kc, vc, proj, ld_proj,
              q_norm, k_norm, n_head, n_kv, *pg, theta, eps, *s);
    return 0;
}
