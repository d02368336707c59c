/* Attention prologue: per-head q/k RMSNorm1p, partial NeoX RoPE, and the K/V cache write. */
#include "cuda/cuda_common.cuh"

#define HD    256 /* attention head dim (TL_HEAD_DIM) */
#define N_ROT 64  /* rotary dims (TL_N_ROT) */

/* qk_rope_kv_kernel  (docs/model.md §2.2 steps 3-4, §2.3)
 *   q_h = rope(rmsnorm(q_h) * q_norm),  k_h = rope(rmsnorm(k_h) * k_norm),  v_h copied
 *   rope: pairs (d, d+32), d < 32: theta_j = pos * (1 / base^(2j/64)) in fp32 (as HF)
 * Shapes: proj [n_tok, ld_proj]: head h query at h*512, gate at h*512+256 (untouched here), K at
 *   n_head*512, V at n_head*512 + n_kv*256; q_out [n_tok, n_head, 256] f32 (NULL: q in place);
 *   kc, vc paged caches (gpu.h: tl_gpu_kv_pages) [n_page * TL_KV_PAGE][n_kv][256] bf16.
 * Threads: one warp per (token, head), 8 a block of 256; item i = token i / (n_head + n_kv),
 *   head i % (n_head + n_kv): heads 0..n_head-1 are q heads, then n_kv k heads (which also copy
 *   V). Lane l holds dims 8l .. 8l + 7 (two float4 loads); the rotary partner of dim d < 32 is
 *   d + 32, in lane l ^ 4; lane j computes pair j's angle (one powf, cosf, sinf a lane), which
 *   lanes 0..7 take by shuffles. The sum of squares is one warp reduction: no shared memory, no
 *   block barrier (a block of 256 a head with two barriers ran at ~1.7 TB/s: 128 us a
 *   4K-token call on the H100).
 * Bytes: ~(n_head + 2 n_kv) * 256 * 4 read, q f32 + K/V bf16 written per token.
 * Tested against cpu_rmsnorm + cpu_rope_neox (test_kernels.c: test_qk_rope). */
__global__ void qk_rope_kv_kernel(float *q_out, uint16_t *kc, uint16_t *vc, const float *proj,
                                  int ld_proj, const float *q_norm, const float *k_norm, int n_head,
                                  int n_kv, tl_gpu_kv_pages pg, float theta, float eps,
                                  tl_gpu_seqs s) {
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x & 31, nh = n_head + n_kv;
    const int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (item >= s.n_tok * nh) return; /* warp-uniform */
    const int t = item / nh, hh = item - t * nh, d0 = lane * 8;
    const int pos = s.tok_pos[t], slot = s.tok_slot[t];
    const float *pr = proj + (size_t)t * ld_proj;
    const int is_q = hh < n_head, h = is_q ? hh : hh - n_head;
    const float *src = is_q ? pr + h * 2 * HD : pr + n_head * 2 * HD + h * HD;
    const float *nw = is_q ? q_norm : k_norm;
    float x[8], ss = 0.0f;
    {
        float4 a = *(const float4 *)(src + d0), b = *(const float4 *)(src + d0 + 4);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z,
        x[7] = b.w;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) ss = fmaf(x[i], x[i], ss);
    const float r = rsqrtf(warp_sum(ss) / (float)HD + eps);
    const float4 wa = *(const float4 *)(nw + d0), wb = *(const float4 *)(nw + d0 + 4);
    const float w[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = x[i] * r * w[i];
    float y[8];
#pragma unroll
    for (int i = 0; i < 8; i++) y[i] = __shfl_xor_sync(0xffffffffu, x[i], 4);
    /* lane j < 32 computes the angle of rotary pair j once; lanes 0..7 (dims 0..63) take theirs
     * by shuffles, so no lane evaluates more than one powf / cosf / sinf */
    const float inv = 1.0f / powf(theta, (float)(2 * lane) / (float)N_ROT);
    const float ang = (float)pos * inv, ca = cosf(ang), sa = sinf(ang);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int d = d0 + i, j = d & (N_ROT / 2 - 1);
        const float c = __shfl_sync(0xffffffffu, ca, j), sn = __shfl_sync(0xffffffffu, sa, j);
        if (d < N_ROT) x[i] = d < N_ROT / 2 ? x[i] * c - y[i] * sn : x[i] * c + y[i] * sn;
    }
    if (is_q) {
        float *dst = q_out ? q_out + ((size_t)t * n_head + h) * HD + d0
                           : (float *)proj + (size_t)t * ld_proj + h * 2 * HD + d0;
        *(float4 *)dst = make_float4(x[0], x[1], x[2], x[3]);
        *(float4 *)(dst + 4) = make_float4(x[4], x[5], x[6], x[7]);
        return;
    }
    const size_t off = ((size_t)kv_row(pg, slot, pos) * n_kv + h) * HD + d0;
    const float *vs = pr + n_head * 2 * HD + n_kv * HD + h * HD + d0;
    float4 va = *(const float4 *)vs, vb = *(const float4 *)(vs + 4);
    *(uint4 *)(kc + off) = make_uint4(bf16x2_pack(x[0], x[1]), bf16x2_pack(x[2], x[3]),
                                      bf16x2_pack(x[4], x[5]), bf16x2_pack(x[6], x[7]));
    *(uint4 *)(vc + off) = make_uint4(bf16x2_pack(va.x, va.y), bf16x2_pack(va.z, va.w),
                                      bf16x2_pack(vb.x, vb.y), bf16x2_pack(vb.z, vb.w));
}

extern "C" int tl_gpu_qk_rope_kv(float *q_out, uint16_t *kc, uint16_t *vc, const float *proj,
                                 int ld_proj, const float *q_norm, const float *k_norm, int n_head,
                                 int n_kv, const tl_gpu_kv_pages *pg, float theta, float eps,
                                 const tl_gpu_seqs *s, const tl_gpu_stream *st) {
    if (s->n_tok <= 0) return 0;
    if ((ld_proj & 3) || (((uintptr_t)proj | (uintptr_t)q_norm | (uintptr_t)k_norm) & 15))
        return TL_ERR_INVALID; /* float4 rows and norm weights */
    const int items = s->n_tok * (n_head + n_kv);
    TL_LAUNCH(st, "qk_rope_kv", qk_rope_kv_kernel, dim3(CEIL_DIV(items, 8)), dim3(256), 0, q_out,
              kc, vc, proj, ld_proj, q_norm, k_norm, n_head, n_kv, *pg, theta, eps, *s);
    return 0;
}
