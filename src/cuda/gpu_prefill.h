/* Prefill kernels (tensor-core GEMM for BF16 and 4-bit weights, MoE grouped GEMM, flash causal
 * attention, chunked Gated DeltaNet): C-linkage entry points over device pointers. The engine
 * (cuda_forward.cu) owns buffers, streams and the schedule; these functions only launch work on
 * `stream` (a cudaStream_t passed as void *, NULL = the default stream) and never allocate or
 * synchronise. Every entry returns 0, TL_ERR_INVALID for shapes or flags it was not built for,
 * or TL_ERR_CUDA when the launch failed.
 *
 * Dtypes: "bf16" buffers hold uint16_t bit patterns of bfloat16. Shapes are row-major, slowest
 * first. Production dimensions come from src/model/shape.h. */
#ifndef TL_GPU_PREFILL_H
#define TL_GPU_PREFILL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ====== Weights of a GEMM. ======
 * note: 4-bit layout ("q4 tiled"). The MLX affine g64 matrix [rows, cols] (U32 words of 8
 * nibbles, lowest bits = lowest column; bf16 scale and bias per 64 columns) is repacked so that
 * one 32-bit load gives a thread of an mma.sync m16n8k16 warp exactly the 8 values of its B
 * fragments for two k16 steps:
 *   w  : u32 [rows/8][cols/32][32]; word (rb, kb, lane) holds row 8*rb + lane/4, columns
 *        32*kb + {2t, 2t+1, 2t+8, 2t+9, 2t+16, 2t+17, 2t+24, 2t+25} (t = lane%4), stored as
 *        nibble positions {0, 4, 1, 5, 2, 6, 3, 7} (pairs (0,4), (1,5) ... share a bf16x2).
 *   sb : u32 [cols/64][rows]; low 16 bits = bf16 scale, high 16 bits = bf16 bias of group.
 * value = scale * q + bias, as in MLX. Sizes: tl_gpu_q4_w_bytes / tl_gpu_q4_sb_bytes. */
typedef struct tl_gpu_gemm_w {
    const void *w;  /* bits 16: bf16 [rows, cols]; bits 4: q4 tiled words (above) */
    const void *sb; /* bits 4: scale/bias words (above); bits 16: NULL, or a low bf16 plane
                     * (W = w + sb; read by the decode GEMV only: the 8-bit router) */
    int bits;       /* 16 or 4 */
    int rows, cols; /* rows % 128 == 0, cols % 64 == 0 */
} tl_gpu_gemm_w;

/* An MLX 4-bit matrix in device memory (as in the checkpoint): w u32 [rows, cols/8], scales and
 * biases bf16 [rows, cols/64]. */
typedef struct tl_gpu_mlx_q4 {
    const uint32_t *w;
    const uint16_t *scales;
    const uint16_t *biases;
} tl_gpu_mlx_q4;

size_t tl_gpu_q4_w_bytes(int rows, int cols);
size_t tl_gpu_q4_sb_bytes(int rows, int cols);

/* Repacks n_mat MLX matrices [n_mat][rows, cols] (contiguous, e.g. stacked experts) into the q4
 * tiled layout, matrix after matrix (dst strides = the byte sizes above). Device to device. */
int tl_gpu_q4_repack(void *dst_w, void *dst_sb, tl_gpu_mlx_q4 src, int n_mat, int rows, int cols,
                     void *stream);

/* note: SwiGLU weights. A fused gate/up GEMM (flag TL_GEMM_SWIGLU) wants gate and up rows
 * interleaved by 8: rows 16j..16j+7 = gate rows 8j..8j+7, rows 16j+8..16j+15 = up rows 8j..
 * so one thread holds the gate and up value of the same output column. These build that
 * [n_mat][2F, cols] matrix from separate gate and up [n_mat][F, cols] (bf16, or MLX q4 which is
 * repacked on the way). For HF's fused gate_up_proj [E, 2F, cols], pass gate = rows 0..F-1 of
 * each expert and up = rows F.., i.e. gate_up + 0 and gate_up + F*cols with src_mat_stride =
 * 2F*cols elements; for separate tensors src_mat_stride = F*cols. */
int tl_gpu_bf16_pack_swiglu(uint16_t *dst, const uint16_t *gate, const uint16_t *up, int n_mat,
                            long long src_mat_stride, int F, int cols, void *stream);
int tl_gpu_q4_repack_swiglu(void *dst_w, void *dst_sb, tl_gpu_mlx_q4 gate, tl_gpu_mlx_q4 up,
                            int n_mat, int F, int cols, void *stream);

/* ====== Dense GEMM. ====== */

enum {
    TL_GEMM_OUT_F32 = 1, /* y (and res) are f32; else bf16 */
    TL_GEMM_SWIGLU = 2,  /* y[n, rows/2] = silu(gate) * up (W interleaved as above) */
    TL_GEMM_ADD_RES = 4, /* y = x W^T + res (res same dtype and shape as y; res may be y) */
};

/* y[n, rows] = x[n, cols] W^T, x bf16 row-major (row stride cols), fp32 accumulate, then the
 * epilogue of `flags`. Any n >= 0 (n == 0 is a no-op). */
int tl_gpu_gemm(void *y, const void *x, const tl_gpu_gemm_w *w, int n, const void *res, int flags,
                void *stream);

/* ====== MoE prefill (grouped GEMM over the 256 experts). ======
 * 1. tl_gpu_moe_pf_plan groups the n_tok*8 (token, slot) assignments by expert from the router's
 *    top-k ids [n_tok, 8] (i32). plan (i32, tl_gpu_moe_pf_plan_ints(n_tok) entries) holds
 *    expert offsets, tile offsets and the assignment list; its contents are private.
 * 2. tl_gpu_moe_pf_gate_up: h[n_tok*8, F] bf16 = silu(x W_g^T) * (x W_u^T) per assignment, rows in
 *    plan order. w describes ONE expert (rows 2F interleaved, cols TL_N_EMBD); the 256 experts
 *    lie contiguously after it (stride = one expert's bytes of w and of sb).
 * 3. tl_gpu_moe_pf_down: yslot[n_tok*8, cols_out] bf16, row tok*8+slot = h_row W_d^T (w: one
 *    expert [TL_N_EMBD, F], experts contiguous as above).
 * 4. tl_gpu_moe_pf_combine: out[t] = res[t] + sum_s wts[t,s] * yslot[t*8+s]
 *                                 + sigmoid(sh_logit[t]) * shared[t]   (if shared != NULL)
 *    out/res bf16, or f32 with TL_GEMM_OUT_F32; res may be out or NULL; shared bf16 [n_tok,
 *    TL_N_EMBD]; wts f32 [n_tok, 8]; sh_logit f32 [n_tok] = shared_expert_gate . x (the kernel
 *    applies the sigmoid). Sums in slot order (deterministic).
 * The shared expert itself is two dense GEMMs: tl_gpu_gemm(TL_GEMM_SWIGLU) then tl_gpu_gemm. */
size_t tl_gpu_moe_pf_plan_ints(int n_tok);
int tl_gpu_moe_pf_plan(int32_t *plan, const int32_t *ids, int n_tok, void *stream);
int tl_gpu_moe_pf_gate_up(uint16_t *h, const uint16_t *x, const tl_gpu_gemm_w *w_expert0,
                          const int32_t *plan, int n_tok, void *stream);
int tl_gpu_moe_pf_down(uint16_t *yslot, const uint16_t *h, const tl_gpu_gemm_w *w_expert0,
                       const int32_t *plan, int n_tok, void *stream);
int tl_gpu_moe_pf_combine(void *out, const void *res, const uint16_t *yslot, const float *wts,
                          const uint16_t *shared, const float *sh_logit, int n_tok, int flags,
                          void *stream);

/* ====== Causal prefill attention (gated, head_dim 256, 16 q heads / 2 kv heads). ======
 * note: KV cache view. Position p, kv head h, dim d of K lives at
 *   k[page(p) * page_stride + (p % page_tokens) * tok_stride + h * 256 + d]
 * with page(p) = pages[p / page_tokens], or with pages == NULL at k[p * tok_stride + h*256 + d].
 * page_tokens must be a multiple of 64. V likewise. bf16. */
typedef struct tl_gpu_kv_view {
    const uint16_t *k, *v;
    const int32_t *pages;  /* device [n_pages] page ids of this sequence, or NULL */
    int page_tokens;       /* tokens per page (pages != NULL) */
    long long page_stride; /* elements between pages */
    int tok_stride;        /* elements between positions inside a page (>= 512) */
} tl_gpu_kv_view;

/* o[t, h*256 + d] = sigmoid(gate[t,h,d]) * sum_j softmax_j(q_t . k_j / 16) v_j[d], j <= pos0+t,
 * for n queries at positions pos0..pos0+n-1 over the cache 0..pos0+n-1 (which must already hold
 * this chunk's K and V). q/gate bf16 (f32 with TL_ATTN_IN_F32; q is rounded to bf16 for the
 * tensor cores): element (t, h, d) at q[t*q->tok_stride + h*q->head_stride + d] (q after q_norm
 * and RoPE), gate likewise with its own strides, or gate->p == NULL (no gate). Strides are in
 * elements, multiples of 8. o bf16 [n, 16*256]. fp32 softmax. */
enum { TL_ATTN_IN_F32 = 1 };
typedef struct tl_gpu_heads {
    const void *p;
    int tok_stride, head_stride;
} tl_gpu_heads;
int tl_gpu_attn_prefill(uint16_t *o, const tl_gpu_heads *q, const tl_gpu_heads *gate,
                        const tl_gpu_kv_view *kv, int n, int pos0, int flags, void *stream);

/* ====== Chunked Gated DeltaNet (chunk 64). ======
 * The delta rule of MODEL.md §2.4 step 7 over T tokens of one sequence, equal to cpu_gdn_step
 * applied token by token. q,k bf16 (f32 with TL_GDN_IN_F32): element (t, hk, d) at
 * q[t*tok_stride + hk*128 + d] (16 key heads); v likewise: (t, hv, d) at v[t*tok_stride + hv*128
 * + d] (32 value heads, head hv reads key head hv/2) -- e.g. q, k, v = conv_out + 0, 2048, 4096
 * with tok_stride 8192. g (log decay) and beta f32 [T, 32]. state f32 [32][128 (key dim)][128
 * (value dim)], read and written in place. o [T, 32, 128] bf16 (f32 with TL_GDN_OUT_F32).
 * TL_GDN_L2NORM: q and k are raw; the kernel L2-normalises them (eps 1e-6, fp32) and scales q by
 * 1/sqrt(128), as HF's use_qk_l2norm_in_kernel. Without it they must be normalised already.
 * ws: device scratch of tl_gpu_gdn_chunk_ws_bytes() bytes (fixed, ~150 MB; any T), owned by the
 * caller, free again when the work on `stream` is done. */
enum {
    TL_GDN_L2NORM = 1,
    TL_GDN_OUT_F32 = 2,
    TL_GDN_IN_F32 = 4,
};
size_t tl_gpu_gdn_chunk_ws_bytes(void);
/* Gates from the projections (MODEL.md §2.4 step 4), fp32: for token t and value head h,
 * g[t,h] = a_neg[h] * softplus(a[t*ld + h] + dt_bias[h]), beta[t,h] = sigmoid(b[t*ld + h]);
 * a, b f32 rows of stride ld (e.g. columns of the fused in-projection output); a_neg = -exp(A_log).
 */
int tl_gpu_gdn_gates(float *g, float *beta, const float *a, const float *b, int ld,
                     const float *dt_bias, const float *a_neg, int T, void *stream);
int tl_gpu_gdn_chunk(void *o, float *state, const void *q, const void *k, const void *v,
                     int tok_stride, const float *g, const float *beta, int T, int flags, void *ws,
                     void *stream);

#ifdef __cplusplus
}
#endif

#endif
