/* The CUDA backend's contract, seen from C: device memory, the launch context, the weight layout
 * and upload, and one entry per model operation over device pointers, grouped by model stage
 * with the one-token (decode) and many-token (prefill) variants side by side. tests/gpu checks
 * every entry against the CPU oracle; the backend itself (tl_backend_cuda_open) is declared in
 * engine/backend.h; bench and profiler helpers are at the end.
 *
 * Conventions. Every entry returns 0 or a negative tl_status: TL_ERR_INVALID for shapes or flags
 * it was not built for, TL_ERR_CUDA when a launch failed (logged with the kernel's name and
 * file:line). Entries only launch work on the stream of their tl_gpu_stream (the last argument;
 * NULL = the default stream): they never allocate and never synchronise. Shapes are row-major,
 * slowest first. "bf16" buffers hold uint16_t bit patterns of bfloat16. Decode activations are
 * f32 (the residual stream always); the prefill GEMMs take bf16 activations. Production
 * dimensions come from src/model/shape.h; docs/model.md has the math each entry implements. */
#ifndef TL_GPU_H
#define TL_GPU_H

#include <stddef.h>
#include <stdint.h>
#include "tulip.h"
#include "model/weights.h"
#include "engine/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ====== Device, memory, launch context ====== */

/* Makes `device` (an ordinal among the devices CUDA_VISIBLE_DEVICES leaves visible) the calling
 * thread's current device, checks it can run sm_90a code, and sets the kernels' shared-memory
 * limits (call once before any other entry; outside graph capture). An ordinal out of range is
 * TL_ERR_INVALID naming it and the visible count. */
int tl_gpu_init(int device, char *err, size_t errlen);
/* Devices the runtime sees (after CUDA_VISIBLE_DEVICES); 0 when none or on error. */
int tl_gpu_device_count(void);
void *tl_gpu_malloc(size_t n); /* NULL on failure */
void tl_gpu_free(void *p);
int tl_gpu_upload(void *dst, const void *src, size_t n);
int tl_gpu_download(void *dst, const void *src, size_t n);
int tl_gpu_memset(void *dst, int v, size_t n);
/* Waits for all work, then reports the first error (TL_ERR_CUDA). */
int tl_gpu_sync(void);

/* Where and how an entry launches its kernels. */
typedef struct tl_gpu_prof tl_gpu_prof; /* the per-kernel profiler (cuda_bench.cu) */
typedef struct tl_gpu_stream {
    void *stream;      /* cudaStream_t; NULL = the legacy default stream */
    int pdl;           /* 1: programmatic dependent launch (decode kernels wait for their
                        * predecessor inside the kernel: cuda_common.cuh); 2: that, and the
                        * kernels that wait first trigger their successor right after
                        * (pdl_enter; the batched decode path) */
    tl_gpu_prof *prof; /* NULL, or a profiler that records an event after every launch */
    float *ws;         /* NULL, or device scratch for split-K GEMM partials (tl_gpu_gemm) */
    size_t ws_bytes;
} tl_gpu_stream;

/* ====== Weights ======
 * A device matrix. bits 16: w = bf16 [rows, cols]; sb = NULL, or a low bf16 plane (W = w + sb,
 * read by the decode GEMV only: set for weights that were not bf16 in the checkpoint, e.g. the
 * 8-bit router). bits 4: the "q4 tiled" layout below. rows % 128 == 0, cols % 64 == 0.
 *
 * note: q4 tiled layout. The MLX affine g64 matrix [rows, cols] (U32 words of 8 nibbles, lowest
 * bits = lowest column; bf16 scale and bias per 64 columns) is repacked so that one 32-bit load
 * gives a thread of an mma.sync m16n8k16 warp exactly the 8 values of its B fragments for two
 * k16 steps:
 *   w  : u32 [rows/8][cols/32][32]; word (rb, kb, lane) holds row 8*rb + lane/4, columns
 *        32*kb + {2t, 2t+1, 2t+8, 2t+9, 2t+16, 2t+17, 2t+24, 2t+25} (t = lane%4), stored as
 *        nibble positions {0, 4, 1, 5, 2, 6, 3, 7} (pairs (0,4), (1,5) ... share a bf16x2).
 *   sb : u32 [cols/64][rows]; low 16 bits = bf16 scale, high 16 bits = bf16 bias of group.
 * value = scale * q + bias, as in MLX. Sizes: tl_gpu_q4_w_bytes / tl_gpu_q4_sb_bytes.
 *
 * note: SwiGLU weights. A fused gate/up matrix has gate and up rows interleaved by 8: rows
 * 16j..16j+7 = gate rows 8j..8j+7, rows 16j+8..16j+15 = up rows 8j.., so one thread holds the
 * gate and up value of the same output column.
 *
 * note: stacked experts. The (n_expert + 1) experts of a layer (the shared one last) lie
 * contiguously, expert after expert (gate_up [n * 2F, n_embd], down [n * n_embd, F]); each
 * expert's q4 scale/bias block is contiguous too. */
typedef struct tl_gpu_gemm_w {
    const void *w;
    const void *sb;
    int bits;
    int rows, cols;
} tl_gpu_gemm_w;

size_t tl_gpu_q4_w_bytes(int rows, int cols);
size_t tl_gpu_q4_sb_bytes(int rows, int cols);
/* Size in bytes of a device matrix's weights (w + sb). */
size_t tl_gpu_mat_bytes(const tl_gpu_gemm_w *m);

/* Stacks n_parts host matrices by rows into one device matrix of rows_pad rows (>= the sum;
 * extra rows are zero). 4-bit when every part is MLX affine 4-bit with group 64 and the row
 * offsets are multiples of 8; otherwise bf16 (float parts converted, 8-bit parts dequantized),
 * with the low bf16 plane when a part is not bf16 already. Synchronous; frees with
 * tl_gpu_mat_free. */
int tl_gpu_mat_upload(tl_gpu_gemm_w *out, const tl_mat *const *parts, int n_parts, int rows_pad,
                      char *err, size_t errlen);
void tl_gpu_mat_free(tl_gpu_gemm_w *m);
/* Stacks n experts (gate, up [F, n_embd]; down [n_embd, F]; the shared expert is passed last)
 * expert-major with gate/up interleaved (notes above); q4 when every matrix is MLX 4-bit g64,
 * else bf16. */
int tl_gpu_experts_upload(tl_gpu_gemm_w *gate_up, tl_gpu_gemm_w *down, const tl_mat *const *gate,
                          const tl_mat *const *up, const tl_mat *const *down_src, int n, char *err,
                          size_t errlen);

/* An MLX 4-bit matrix in device memory (as in the checkpoint): w u32 [rows, cols/8], scales and
 * biases bf16 [rows, cols/64]. */
typedef struct tl_gpu_mlx_q4 {
    const uint32_t *w;
    const uint16_t *scales;
    const uint16_t *biases;
} tl_gpu_mlx_q4;
/* Repacks n_mat MLX matrices [n_mat][rows, cols] (contiguous, e.g. stacked experts) into the q4
 * tiled layout, matrix after matrix (dst strides = the byte sizes above). Device to device. */
int tl_gpu_q4_repack(void *dst_w, void *dst_sb, tl_gpu_mlx_q4 src, int n_mat, int rows, int cols,
                     const tl_gpu_stream *st);
/* Builds the interleaved [n_mat][2F, cols] SwiGLU matrix from separate gate and up
 * [n_mat][F, cols] (bf16, or MLX q4 repacked on the way). For HF's fused gate_up_proj
 * [E, 2F, cols], pass gate = gate_up + 0 and up = gate_up + F*cols with src_mat_stride =
 * 2F*cols elements; for separate tensors src_mat_stride = F*cols. */
int tl_gpu_bf16_pack_swiglu(uint16_t *dst, const uint16_t *gate, const uint16_t *up, int n_mat,
                            long long src_mat_stride, int F, int cols, const tl_gpu_stream *st);
int tl_gpu_q4_repack_swiglu(void *dst_w, void *dst_sb, tl_gpu_mlx_q4 gate, tl_gpu_mlx_q4 up,
                            int n_mat, int F, int cols, const tl_gpu_stream *st);

/* ====== Batch description (device arrays) ======
 * A batch is n_tok tokens from n_seg sequences ("segments"); segment s holds tokens
 * seg_tok0[s] .. seg_tok0[s]+seg_n[s]-1 of the batch, consecutive positions seg_pos0[s].., in
 * state slot seg_slot[s]. tok_pos / tok_slot / tok_seg repeat that per token. */
typedef struct tl_gpu_seqs {
    const int32_t *tok_pos, *tok_slot, *tok_seg;
    const int32_t *seg_tok0, *seg_n, *seg_slot, *seg_pos0;
    int n_tok, n_seg;
} tl_gpu_seqs;

/* ====== Embedding and norms ====== */

/* x[t, :] = E[tokens[t], :] (f32). */
int tl_gpu_embed(float *x, const tl_gpu_gemm_w *E, const int32_t *tokens, int n_tok,
                 const tl_gpu_stream *st);
/* y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w (f32), rows of n; rows[i] (if non-NULL) picks the
 * input row of output row i. */
int tl_gpu_rmsnorm(float *y, const float *x, const float *w, const int32_t *rows, int n_out, int n,
                   float eps, const tl_gpu_stream *st);
/* The same with bf16 output (the prefill GEMMs' input). */
int tl_gpu_rmsnorm_bf16(uint16_t *y, const float *x, const float *w, int n_rows, int n, float eps,
                        const tl_gpu_stream *st);
/* The same, plus the low plane yl = bf16(v - y) of each normed value v (yl may be NULL). */
int tl_gpu_rmsnorm_bf16x2(uint16_t *y, uint16_t *yl, const float *x, const float *w, int n_rows,
                          int n, float eps, const tl_gpu_stream *st);
/* The same, plus one dot product a row: g[t * ldg] = sum_c v[t, c] * (G + G->sb)[0, c] of the
 * normed f32 values with row 0 of G (bf16, cols n; its low plane in G->sb when not NULL), in
 * fixed order (a row's bits do not depend on n_rows). The MoE's shared-expert gate: the router
 * GEMM then runs the experts' 256 rows alone (k_router.cu). g NULL: no dot product. */
int tl_gpu_rmsnorm_bf16x2_dot(uint16_t *y, uint16_t *yl, const float *x, const float *w, int n_rows,
                              int n, float eps, const tl_gpu_gemm_w *G, float *g, int ldg,
                              const tl_gpu_stream *st);
/* The MTP head's input (docs/model.md §3.2 step 1): cat [n_tok, 2n] = [rmsnorm(e[t]; w_e) |
 * rmsnorm(h[r]; w_h)] with r = h_rows[t] (h_rows NULL: r = t), the embedding first. */
int tl_gpu_mtp_cat(float *cat, const float *e, const float *w_e, const float *h,
                   const int32_t *h_rows, const float *w_h, int n_tok, int n, float eps,
                   const tl_gpu_stream *st);
/* dst[dst_rows[i]] = src[src_rows[i]] for i < n_rows, rows of n f32 (a NULL index array: row i);
 * the destination rows must be distinct. Bit-exact. */
int tl_gpu_copy_rows(float *dst, const int32_t *dst_rows, const float *src, const int32_t *src_rows,
                     int n_rows, int n, const tl_gpu_stream *st);
/* y[i] = x[i] rounded to bf16 (nearest even), i < n: f32 activations into the GEMMs. */
int tl_gpu_cast_bf16(uint16_t *y, const float *x, long n, const tl_gpu_stream *st);

/* ====== Dense projections ====== */

/* Decode: y[t, r] (+)= sum_c W[r, c] * xn[t, c] for r < W->rows, t < n_tok, where xn = x, or
 * rmsnorm(x; norm_w) when norm_w is non-NULL. ldx, ldy: row strides. */
int tl_gpu_gemv(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                const float *norm_w, float eps, int n_tok, int accumulate, const tl_gpu_stream *st);

/* Tests and A/B runs: blocks a SM of the decode GEMV's slice kernel for 4-bit matrices (k_gemv.cu:
 * 0 = off, the persistent q4m kernel only; 1 = default; 2), instead of TL_GEMV_SLICE. Both give
 * the same bits. Returns the previous setting. */
int tl_gpu_gemv_set_slice(int per_sm);
/* Likewise for the rows kernel (k_gemv.cu gemv_q4r_kernel: 4-bit matrices of <= 8 tokens too
 * large for the slice kernel, the LM head) instead of TL_GEMV_ROWS: 1 on (default), 0 off (the
 * persistent q4m kernel; the same bits). Returns the previous setting. */
int tl_gpu_gemv_set_rows(int on);
/* The q4v dot (k_q4m.cuh) instead of TL_Q4V: level 1 the decode GEMV and moe_up kernels of one
 * or two tokens, 2 moe_down too, 0 nowhere (q4m_dot; other bits, the same accuracy). Returns the
 * previous setting. */
int tl_gpu_q4v_set(int on);

/* A micro-batch's router: y[t, r] = sum_c (xh + xl)[t, c] * (w + sb)[r, c] for r < W->rows on
 * the tensor cores (k_router.cu: precision of the GEMV to ~2^-17), xh / xl the bf16 planes of
 * the normed input (tl_gpu_rmsnorm_bf16x2). W bf16, W->cols % 128 == 0; ldy >= W->rows. Up to
 * 1,024 tokens on a stream (st not NULL: the engine's; tl_gpu_router_split_max), K is split 8 ways
 * inside a thread-block cluster (k_router.cu); otherwise (more tokens, or st NULL: tests, the host
 * emulator) never split, on wgmma (router_wg_kernel) from 3,072 tokens (tl_gpu_router_set_wg,
 * TL_ROUTER_WG). A token's result does not depend on n_tok on either side of the split's limit. */
int tl_gpu_router_gemm(float *y, int ldy, const tl_gpu_gemm_w *W, const uint16_t *xh,
                       const uint16_t *xl, int n_tok, const tl_gpu_stream *st);
/* Tests and A/B runs, instead of TL_ROUTER_WG: which unsplit router calls run on wgmma
 * (k_router.cu router_wg_kernel) rather than the mma.sync tiles: 1 (default) those of at least
 * 3,072 tokens, 2 all, 0 none. Returns the previous setting. */
int tl_gpu_router_set_wg(int mode);
/* Tests and A/B runs, instead of TL_ROUTER_SPLIT_MAX: the most tokens whose router call on a
 * stream is split in K (default 1,024); n < 0 only asks. Returns the previous setting. */
int tl_gpu_router_split_max(int n);

/* Prefill: y[n, rows] = x[n, cols] W^T, x bf16 row-major (row stride cols), fp32 accumulate,
 * then the epilogue of `flags`. Any n >= 0 (n == 0 is a no-op). */
enum {
    TL_GEMM_OUT_F32 = 1, /* y (and res) are f32; else bf16 */
    TL_GEMM_SWIGLU = 2,  /* y[n, rows/2] = silu(gate) * up (W interleaved: notes above) */
    TL_GEMM_ADD_RES = 4, /* y = x W^T + res (res same dtype and shape as y; res may be y) */
};
int tl_gpu_gemm(void *y, const void *x, const tl_gpu_gemm_w *w, int n, const void *res, int flags,
                const tl_gpu_stream *st);
/* Split-K (k_gemm.cu): a 4-bit product of n <= TL_GEMM_SPLITK_MAX_N tokens on a small-row matrix
 * splits K when st->ws holds tl_gpu_gemm_ws_bytes(w, n) (0: this matrix never splits); the split
 * depends on the shape only, so a token's result does not depend on n up to the limit. Without
 * the workspace the product runs unsplit (other rounding). */
#define TL_GEMM_SPLITK_MAX_N 256
size_t tl_gpu_gemm_ws_bytes(const tl_gpu_gemm_w *w, int n);

/* ====== Gated DeltaNet (docs/model.md §2.4) ====== */

/* Per-token state copies of a speculative verify (docs/architecture.md §3.6), written by the
 * decode kernels conv1d, gdn and gdn_raw: a token at position p of slot s with pos0[s] >= 0 and
 * 0 <= j = p - pos0[s] < n also writes the state after it to copy j of the slot, at element
 * (s * n + j) * (one slot's state of the kernel's layer) of base, in the state's own layout and
 * dtype. A rollback to any of those positions is then a copy. NULL (or base NULL): none. */
typedef struct tl_gpu_ring {
    void *base;
    const int32_t *pos0; /* [n_slot] device; < 0: no copies for that slot */
    int n;
} tl_gpu_ring;

/* Causal depthwise conv (kernel 4) + SiLU over the first C columns of in [n_tok, ld_in], per
 * segment, in token order; state [n_slot][3][C] f32 holds each slot's last 3 pre-conv inputs
 * (oldest first). out [n_tok, C]. w [C, 4]. ring (NULL: none): the state after tokens of
 * a verify, f32 [n_slot][ring->n][3][C]. */
int tl_gpu_conv1d(float *out, float *state, const float *in, int ld_in, const float *w, int C,
                  const tl_gpu_seqs *s, const tl_gpu_ring *ring, const tl_gpu_stream *st);
/* Prefill: tl_gpu_gemm(y, x, w, n, NULL, TL_GEMM_OUT_F32) of a GDN in-projection with the conv1d
 * of tl_gpu_conv1d over its first C rows fused, for one segment (tokens 0 .. n - 1 of the slot
 * whose conv state [3][C] is conv_state): conv_out [n, C] gets the conv outputs, y [n, w->rows]
 * rows >= C only (its first C columns are not written), the state becomes the last three inputs.
 * edge: device scratch of tl_gpu_gemm_conv1d_edge_floats(n, C) floats. Same bits as tl_gpu_gemm
 * + tl_gpu_conv1d. TL_ERR_UNSUPPORTED when this product does not run on the kernel that fuses it
 * (the wgr kernel: 4-bit weights, n > TL_GEMM_SPLITK_MAX_N; C a multiple of its 128 rows) or it is
 * off (on by default; TL_GEMM_CONV=0 or tl_gpu_gemm_set_conv(0) turns it off; set_conv returns
 * the previous setting): then the caller makes the two calls. */
int tl_gpu_gemm_conv1d(float *y, const uint16_t *x, const tl_gpu_gemm_w *w, int n, float *conv_out,
                       float *conv_state, const float *conv_w, int C, float *edge,
                       const tl_gpu_stream *st);
size_t tl_gpu_gemm_conv1d_edge_floats(int max_n, int C);
int tl_gpu_gemm_set_conv(int on);
/* Decode: tl_gpu_gemv (no accumulate) for a q4 GDN in-projection of one token per sequence with
 * the conv1d of tl_gpu_conv1d fused: rows r < C give conv_out[t, r] (SiLU of the conv over
 * conv_state[tok_slot[t]] and the new value, state shifted) instead of y[t, r]; rows >= C go
 * to y as usual. Same bits as tl_gpu_gemv + tl_gpu_conv1d. TL_ERR_INVALID unless W is q4 and
 * C % 8 == 0. */
int tl_gpu_gemv_conv1d(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                       const float *norm_w, float eps, int n_tok, float *conv_out,
                       float *conv_state, const float *conv_w, int C, const int32_t *tok_slot,
                       const tl_gpu_stream *st);
/* Decode: the Gated DeltaNet step (§2.4 steps 4-8) per segment, token by token: q, k, v from
 * qkv [n_tok, 2*nk*128 + nv*128] (conv output), z, b, a from proj [n_tok, ld_proj] at column
 * offsets z_off, b_off, a_off. S [n_slot][nv][128][128] f32, or bf16 when s_bf16 (read into
 * f32 registers, rounded back once per segment). y [n_tok, nv*128] = gated RMSNorm of the output
 * with norm_w [128]. ring (NULL: none): the state after tokens of a verify, [n_slot][ring->n]
 * [nv][128][128] in S's dtype (each copy rounded from the f32 registers when bf16). */
int tl_gpu_gdn(float *y, void *S, int s_bf16, const float *qkv, const float *proj, int ld_proj,
               int z_off, int b_off, int a_off, const float *dt_bias, const float *a_neg,
               const float *norm_w, int n_k_head, int n_v_head, float eps, const tl_gpu_seqs *s,
               const tl_gpu_ring *ring, const tl_gpu_stream *st);
/* The same step without the gated norm (steps 4-7): o [n_tok, nv*128] f32 raw; for many
 * sequences at once (the state is cut by columns into more, smaller blocks; the batched decode
 * path then applies tl_gpu_gated_rmsnorm_bf16). Same results as tl_gpu_gdn up to the order of the
 * q/k norm sums; ring as there. */
int tl_gpu_gdn_raw(float *o, void *S, int s_bf16, const float *qkv, const float *proj, int ld_proj,
                   int b_off, int a_off, const float *dt_bias, const float *a_neg, int n_k_head,
                   int n_v_head, const tl_gpu_seqs *s, const tl_gpu_ring *ring,
                   const tl_gpu_stream *st);
/* Prefill: the gates (§2.4 step 4), fp32: for token t and value head h,
 * g[t,h] = a_neg[h] * softplus(a[t*ld + h] + dt_bias[h]), beta[t,h] = sigmoid(b[t*ld + h]);
 * a, b f32 rows of stride ld (columns of the fused in-projection output); a_neg = -exp(A_log). */
int tl_gpu_gdn_gates(float *g, float *beta, const float *a, const float *b, int ld,
                     const float *dt_bias, const float *a_neg, int T, const tl_gpu_stream *st);
/* Prefill: the delta rule (§2.4 step 7) over T tokens of one sequence in chunks of 64, equal to
 * the token-by-token recurrence. q,k bf16 (f32 with TL_GDN_IN_F32): element (t, hk, d) at
 * q[t*tok_stride + hk*128 + d] (16 key heads); v likewise: (t, hv, d) at v[t*tok_stride +
 * hv*128 + d] (32 value heads, head hv reads key head hv/2) -- e.g. q, k, v = conv_out + 0,
 * 2048, 4096 with tok_stride 8192. g (log decay) and beta f32 [T, 32]. state f32 [32][128 (key
 * dim)][128 (value dim)], read and written in place. o [T, 32, 128] bf16 (f32 with
 * TL_GDN_OUT_F32). TL_GDN_L2NORM: q and k are raw; the kernel L2-normalises them (eps 1e-6,
 * fp32) and scales q by 1/sqrt(128). Without it they must be normalised already. ws: device
 * scratch of tl_gpu_gdn_chunk_ws_bytes() bytes (fixed, ~150 MB; any T), owned by the caller.
 * TL_GDN_KERN_*: which kernels (0: the TL_CUDA_GDN switch, default tf32): fp32 FMA, tensor cores
 * with tf32 operands, or tensor cores with 3xTF32 split operands (fp32-like products). */
enum {
    TL_GDN_L2NORM = 1,
    TL_GDN_OUT_F32 = 2,
    TL_GDN_IN_F32 = 4,
    TL_GDN_STATE_BF16 = 8, /* state bf16 (f32 inside the kernel, rounded once per segment) */
    TL_GDN_KERN_FMA = 16,
    TL_GDN_KERN_TF32 = 32,
    TL_GDN_KERN_3XTF32 = 48,
    TL_GDN_KERN_MASK = 48,
};
size_t tl_gpu_gdn_chunk_ws_bytes(void);
int tl_gpu_gdn_chunk(void *o, void *state, const void *q, const void *k, const void *v,
                     int tok_stride, const float *g, const float *beta, int T, int flags, void *ws,
                     const tl_gpu_stream *st);
/* Prefill: y bf16 [n, nv*128] = RMSNorm(o; w) * silu(z) per value head (o f32 [n, nv*128], z at
 * column z_off of proj rows of stride ld_proj). */
int tl_gpu_gated_rmsnorm_bf16(uint16_t *y, const float *o, const float *proj, int ld_proj,
                              int z_off, const float *w, int nv, int n, float eps,
                              const tl_gpu_stream *st);
/* The same with y f32 (y may be o): the decode path after tl_gpu_gdn_raw (TL_GDN_COLS=1). */
int tl_gpu_gated_rmsnorm_f32(float *y, const float *o, const float *proj, int ld_proj, int z_off,
                             const float *w, int nv, int n, float eps, const tl_gpu_stream *st);

/* ====== Gated attention (docs/model.md §2.2, §2.3) ======
 * Paged KV cache. Per attention layer, K and V are each a pool of pages of TL_KV_PAGE tokens,
 * [n_page][TL_KV_PAGE][n_kv][256] bf16: position p of slot s lives at token row
 *   table[s * max_pages + p / TL_KV_PAGE] * TL_KV_PAGE + p % TL_KV_PAGE
 * of the pool. table [n_slot][max_pages] int32 (device) holds page ids; every attention layer
 * uses the same ids. Entries past a slot's length are never read. TL_KV_PAGE is a multiple of
 * the key tiles of every attention kernel (32, 64), so a tile never straddles two pages. */
#define TL_KV_PAGE 64
typedef struct tl_gpu_kv_pages {
    const int32_t *table;
    int max_pages;
} tl_gpu_kv_pages;

/* Prefix cache copies (k_page_copy.cu, docs/architecture.md §4.1): for each of n_pairs page pairs
 * (device int32 [n_pairs][3]: source page, destination page, rows) and each of n_layer layers,
 * token rows 0..rows-1 of the source page are copied to the destination page. A pool is
 * [n_layer][pages][TL_KV_PAGE][row_elems] bf16 with src_pages / dst_pages pages a layer (the KV
 * cache: row_elems = n_kv * 256). row_elems a multiple of 8 and both pools 16-byte aligned, else
 * TL_ERR_INVALID. Bit-exact. */
int tl_gpu_kv_page_copy(uint16_t *dst, int dst_pages, const uint16_t *src, int src_pages,
                        const int32_t *pairs, int n_pairs, int n_layer, int row_elems,
                        const tl_gpu_stream *st);

/* q/k RMSNorm1p + NeoX RoPE (64 dims) from proj [n_tok, ld_proj] (per head [query 256 | gate
 * 256], then K (n_kv*256), then V); q_out [n_tok, n_head, 256] f32 (NULL: q is written back in
 * place of the raw query inside proj); K and V written to the paged caches kc/vc at (slot, pos)
 * through pg. Decode and prefill. */
int tl_gpu_qk_rope_kv(float *q_out, uint16_t *kc, uint16_t *vc, const float *proj, int ld_proj,
                      const float *q_norm, const float *k_norm, int n_head, int n_kv,
                      const tl_gpu_kv_pages *pg, float theta, float eps, const tl_gpu_seqs *s,
                      const tl_gpu_stream *st);
/* Decode: gated attention of each token over its slot's cache positions 0..pos (paged caches
 * kc/vc through pg; split-KV, at most n_split partials per head in part [n_tok * n_head *
 * n_split * 258] f32), then combined and multiplied by sigmoid(gate) from proj: out [n_tok,
 * n_head*256]. opt (NULL: defaults) selects the kernel variant. */
typedef struct tl_gpu_attn_opts {
    int cuda_core; /* 1: the CUDA-core split kernel even where the tensor-core one applies (G =
                    * 8 query heads per KV head); TL_CUDA_ATTN_NO_TC=1 */
    int min_chunk; /* keys per split at least (0: 32); TL_CUDA_ATTN_MIN_CHUNK */
} tl_gpu_attn_opts;
int tl_gpu_attn(float *out, float *part, const float *q, const uint16_t *kc, const uint16_t *vc,
                const float *proj, int ld_proj, int n_head, int n_kv, const tl_gpu_kv_pages *pg,
                int n_split, const tl_gpu_seqs *s, const tl_gpu_attn_opts *opt,
                const tl_gpu_stream *st);

/* Prefill: causal flash attention of one sequence (16 q heads / 2 kv heads, head_dim 256).
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
                        const tl_gpu_kv_view *kv, int n, int pos0, int flags,
                        const tl_gpu_stream *st);

/* ====== Mixture of experts (docs/model.md §2.5) ====== */

/* Router from logits [n_tok, ld] (n_expert router logits, then the shared-expert gate logit):
 * fp32 softmax, top-k (ties: lower id), renormalised; ids/w [n_tok, k]; w_sh [n_tok] =
 * sigmoid(shared gate logit); sh_logit (NULL or [n_tok]) = the raw shared gate logit. A token
 * whose router logits hold a NaN or an infinity gets ids 0..k-1 (never out of range) and NaN
 * weights: its output turns NaN and the sampler reports its row (tl_gpu_sample: token -1);
 * the other tokens are unaffected (tests/gpu/test_kernels.c: poisoned router). */
int tl_gpu_moe_route(int32_t *ids, float *w, float *w_sh, float *sh_logit, const float *logits,
                     int ld, int n_expert, int k, int n_tok, const tl_gpu_stream *st);
/* Decode: act [n_tok, k+1, F] = silu(gate_e x) * (up_e x) for the k routed experts of each token
 * and the shared one (expert n_expert of the stack), x = rmsnorm(h; norm_w). */
int tl_gpu_moe_up(float *act, const tl_gpu_gemm_w *gate_up, const float *h, const float *norm_w,
                  float eps, const int32_t *ids, int k, int n_expert, int n_tok,
                  const tl_gpu_stream *st);
/* Decode, q4 experts only: tl_gpu_moe_route fused into tl_gpu_moe_up (every block routes its
 * token from logits [n_tok, ld]; ids, w, w_sh are written as tl_gpu_moe_route writes them). */
int tl_gpu_moe_up_route(float *act, int32_t *ids, float *w, float *w_sh,
                        const tl_gpu_gemm_w *gate_up, const float *h, const float *norm_w,
                        float eps, const float *logits, int ld, int k, int n_expert, int n_tok,
                        const tl_gpu_stream *st);
/* Decode: h[t] += sum_j w_j down_j act_j + w_sh down_sh act_sh (fixed order: deterministic). */
int tl_gpu_moe_down(float *h, const tl_gpu_gemm_w *down, const float *act, const int32_t *ids,
                    const float *w, const float *w_sh, int k, int n_expert, int n_tok,
                    const tl_gpu_stream *st);
/* tl_gpu_moe_down right after tl_gpu_moe_up_route on the same stream, with the logits that call
 * routed: the kernel routes the token again before its PDL wait and prefetches its experts'
 * weights while moe_up runs (k_moe.cu moe_down_kernel; valid because moe_up's kernels let their
 * dependents start only after their own wait). Same bits as tl_gpu_moe_down. */
int tl_gpu_moe_down_after_route(float *h, const tl_gpu_gemm_w *down, const float *act,
                                const int32_t *ids, const float *logits, int ld, const float *w,
                                const float *w_sh, int k, int n_expert, int n_tok,
                                const tl_gpu_stream *st);
/* Tests and A/B runs: the batch-1 MoE levers on (1, default) or off (0) instead of TL_MOE_SLICE:
 * moe_up's slice kernel for one routed token and moe_down's early routing. Returns the previous. */
int tl_gpu_moe_set_slice(int on);

/* Prefill (grouped GEMM over the 256 experts):
 * 1. tl_gpu_moe_pf_plan groups the n_tok*8 (token, slot) assignments by expert from the router's
 *    top-k ids [n_tok, 8] (i32). plan (i32, tl_gpu_moe_pf_plan_ints(n_tok) entries) holds
 *    expert offsets off[257], the tile starts of 128-, 64- and 16-row tiles [257] each, then
 *    perm[n_tok*8] (assignment ids grouped by expert, in any order inside an expert) and the
 *    plan kernels' scratch (PLAN_* below; read by the grouped GEMMs, k_gemm.cuh).
 * 2. tl_gpu_moe_pf_gate_up: h[n_tok*8, F] bf16 = silu(x W_g^T) * (x W_u^T) per assignment, rows in
 *    plan order. w describes ONE expert (rows 2F interleaved, cols TL_N_EMBD); the 256 experts
 *    lie contiguously after it (stride = one expert's bytes of w and of sb).
 * 3. tl_gpu_moe_pf_down: yslot[n_tok*8, cols_out] bf16, row tok*8+slot = h_row W_d^T (w: one
 *    expert [TL_N_EMBD, F], experts contiguous as above).
 *    shared = 1 (both calls): expert 256 of w, the shared expert (same shape, stored after the
 *    routed ones), also runs for every token t, as rows 8 n_tok + t of h and of yslot (which
 *    then hold 9 n_tok rows); pass yslot + 8 n_tok rows as the combine's `shared`.
 * 4. tl_gpu_moe_pf_combine: out[t] = res[t] + sum_s wts[t,s] * yslot[t*8+s]
 *                                 + sigmoid(sh_logit[t]) * shared[t]   (if shared != NULL)
 *    out/res bf16, or f32 with TL_GEMM_OUT_F32; res may be out or NULL; shared bf16 [n_tok,
 *    TL_N_EMBD]; wts f32 [n_tok, 8]; sh_logit f32 [n_tok]. Sums in slot order (deterministic).
 * Else the shared expert is two dense GEMMs: tl_gpu_gemm(TL_GEMM_SWIGLU) then tl_gpu_gemm. */
#define PLAN_OFF   0
#define PLAN_TS128 257
#define PLAN_TS64  514
#define PLAN_TS16  771
#define PLAN_PERM  1028
size_t tl_gpu_moe_pf_plan_ints(int n_tok);
int tl_gpu_moe_pf_plan(int32_t *plan, const int32_t *ids, int n_tok, const tl_gpu_stream *st);
/* tl_gpu_moe_route then tl_gpu_moe_pf_plan in one launch, for 1 <= n_tok <= 32 and k == 8
 * (TL_ERR_INVALID otherwise): the same ids, w, w_sh, sh_logit and plan. */
int tl_gpu_moe_route_plan(int32_t *plan, int32_t *ids, float *w, float *w_sh, float *sh_logit,
                          const float *logits, int ld, int n_expert, int k, int n_tok,
                          const tl_gpu_stream *st);
int tl_gpu_moe_pf_gate_up(uint16_t *h, const uint16_t *x, const tl_gpu_gemm_w *w_expert0,
                          const int32_t *plan, int n_tok, int shared, const tl_gpu_stream *st);
int tl_gpu_moe_pf_down(uint16_t *yslot, const uint16_t *h, const tl_gpu_gemm_w *w_expert0,
                       const int32_t *plan, int n_tok, int shared, const tl_gpu_stream *st);
int tl_gpu_moe_pf_combine(void *out, const void *res, const uint16_t *yslot, const float *wts,
                          const uint16_t *shared, const float *sh_logit, int n_tok, int flags,
                          const tl_gpu_stream *st);
/* The combine (flags must hold TL_GEMM_OUT_F32) that also writes yn [n_tok, TL_N_EMBD] bf16 =
 * RMSNorm(out row) with weight nw, bit for bit what tl_gpu_rmsnorm_bf16 of out would give: the
 * next layer's input norm folded into this layer's last kernel. nw NULL: tl_gpu_moe_pf_combine. */
int tl_gpu_moe_pf_combine_norm(void *out, const void *res, const uint16_t *yslot, const float *wts,
                               const uint16_t *shared, const float *sh_logit, int n_tok, int flags,
                               const float *nw, uint16_t *yn, float eps, const tl_gpu_stream *st);

/* ====== Sampling ======
 * One row of logits [n_rows, n_vocab] per entry (see k_sample.cu): greedy rows and rows with
 * 1 <= top_k <= 64 and no top logprobs take the two-pass path (the row cut into 32 parts, then
 * one merge), the others one block per row. Penalty counts (NULL: none) are rows of n_vocab i32,
 * bit 30 = seen anywhere, low 24 bits = times generated; row r of the logits reads counts row
 * count_slot[r] (count_slot NULL: row r). `params` is a device array
 * of tl_sample_params; keys [n_rows] u64 random keys; counts (NULL or [n_rows, n_vocab] i32
 * penalty counts, bit 30 = seen anywhere, low 24 bits = times generated); scratch [n_rows,
 * 2*n_vocab] f32. out: device tl_sample_out [n_rows]. Only ids < n_valid are sampled.
 * Token restrictions (tulip.h): a row whose params have n_bias > 0 or allow set reads
 * bias_ids/bias_vals/allow as DEVICE pointers and is sampled from its row of `restricted`
 * ([n_rows, n_vocab] f32, written here; NULL when no row has a restriction, and then every
 * row's n_bias must be 0 and allow NULL); bias ids must be in [0, n_vocab). A row left with no
 * finite candidate samples TL_TOKEN_NONE_ALLOWED. h_params: a host copy of params, or NULL; with
 * it the launch shape fits the rows (more parts a row for a few rows of small top-k, no launch of
 * the one-block path when every row takes the two-pass one). */
int tl_gpu_sample(tl_sample_out *out, const float *logits, int n_vocab, int n_valid,
                  const tl_sample_params *params, const tl_sample_params *h_params,
                  const uint64_t *keys, const int32_t *counts, const uint32_t *count_bits,
                  const int32_t *count_slot, float *scratch, float *restricted, int n_rows,
                  const tl_gpu_stream *st);
/* Words of a slot's row of count_bits: bit i (word i / 32, bit i % 32) set wherever the slot's
 * count of token i may be non-zero. The bits are a superset (tl_gpu_penalty_add sets them, only
 * a slot reset clears them), so the samplers read a count only where its bit is set: the two-pass
 * sampler then streams 1/32 of the counts' bytes instead of all of them. count_bits NULL: every
 * count is read. */
#define TL_GPU_COUNT_WORDS(n_vocab) (((n_vocab) + 31) / 32)
/* Penalty counts kept per slot across steps, updated as tokens are fed: for each token t of a
 * batch (tokens, tok_pos, tok_slot as in tl_gpu_seqs), counts[tok_slot[t]][tokens[t]] gets 1
 * more when the token was generated (n_prompt[slot] >= 0 and tok_pos[t] >= n_prompt[slot]),
 * else bit 30 (prompt; n_prompt[slot] < 0: all prompt so far). The repetition penalty applies
 * where either is set, presence and frequency to the generated count. counts
 * [n_slot][n_vocab]; count_bits (or NULL) [n_slot][TL_GPU_COUNT_WORDS(n_vocab)] gets the token's
 * bit; the backend zeroes a slot's rows of both when it resets the slot. */
int tl_gpu_penalty_add(int32_t *counts, uint32_t *count_bits, int n_vocab, const int32_t *tokens,
                       const int32_t *tok_pos, const int32_t *tok_slot, const int32_t *n_prompt,
                       int n_tok, const tl_gpu_stream *st);
/* The generated tokens tokens[0..n_tok) (HOST array, n_tok <= TL_LAW_ADJ) of `slot` taken out of
 * its counts (1 less each): a speculative rollback's rejected drafts. */
int tl_gpu_penalty_sub(int32_t *counts, int n_vocab, const int32_t *tokens, int slot, int n_tok,
                       const tl_gpu_stream *st);
/* Sampling laws (engine/backend.h tl_law) of n_rows rows instead of draws, for speculative
 * decoding: row r is logits row row_of[r] (device [n_rows] i32), under params[r] (tl_law_ok:
 * greedy or 1 <= top_k <= TL_LAW_MAX, no restrictions, no top logprobs), with the counts of
 * slot count_slot[r] adjusted by adj[r][0..TL_LAW_ADJ) (device i32; v > 0: token v - 1 counted
 * once more as generated, v < 0: token -v - 1 once less, 0: nothing). The same filters and
 * survivors as tl_gpu_sample's two-pass path (and the host's tl_sample_law, 40-nat window
 * included); logprobs as tl_gpu_sample rounds them. laws: device [n_rows]; h_params: a host
 * copy of params or NULL (as tl_gpu_sample's); scratch: device, tl_gpu_law_scratch_floats(R)
 * f32 for launches of up to R rows. TL_ERR_UNSUPPORTED when n_valid is too large for the
 * two-pass parts. */
int tl_gpu_sample_law(tl_law *laws, const float *logits, int n_vocab, int n_valid,
                      const int32_t *row_of, const tl_sample_params *params,
                      const tl_sample_params *h_params, const int32_t *counts,
                      const uint32_t *count_bits, const int32_t *count_slot, const int32_t *adj,
                      float *scratch, int n_rows, const tl_gpu_stream *st);
size_t tl_gpu_law_scratch_floats(int max_rows);
/* The parts a row of tl_gpu_sample_law is cut into for these n_rows host parameters: launches
 * with the same count run the same kernels (a captured graph's key). */
int tl_gpu_law_parts(const tl_sample_params *h_params, int n_rows);
/* One entry of drafts chained on the device (cuda_spec.cu draft_chain): the host fills u, k,
 * greedy, tok, live = 1 and zeroes the rest; tl_gpu_draft_pick fills the rest. */
typedef struct tl_gpu_chain {
    double u[TL_MAX_SPEC]; /* uniforms in [0, 1) the draws take in order (the session RNG's) */
    int32_t k;             /* drafts wanted */
    int32_t greedy;        /* 1: a draft is its law's first id (no draw) */
    int32_t tok;           /* the token the next step feeds (in: the sampled one) */
    int32_t live;          /* 0 once k drafts are drawn or a law was empty */
    int32_t n_drafted, n_draws;
    int32_t drafts[TL_MAX_SPEC];
} tl_gpu_chain;
/* Draft step j of n chained entries (one thread each): entry i draws draft j + 1 from laws[i]
 * exactly as the host's tl_law_draw does (engine/sample.c: the same double sums, the next
 * uniform of c[i].u where it draws), records it, and writes the token the next step feeds to
 * next_tok[i] (device, may be NULL) and, as a penalty adjustment (token + 1), to
 * adj[i * TL_LAW_ADJ + j + 1] (device, may be NULL). An entry whose law is empty, or that
 * has its k drafts, stops (live 0) and feeds its last token again. */
int tl_gpu_draft_pick(tl_gpu_chain *c, const tl_law *laws, int j, int n, int32_t *next_tok,
                      int32_t *adj, const tl_gpu_stream *st);

/* ====== Bench and profiler (cuda_bench.cu) ====== */

/* Bytes a decode step of one token reads and writes at context kv_len (weights touched, KV,
 * recurrent and conv state), from the backend's uploaded weights. */
double tl_cuda_decode_bytes(const tl_backend *b, int kv_len);
/* Measured device-to-device copy bandwidth (read + write bytes / s) over `bytes`. */
double tl_gpu_measure_bw(size_t bytes);
/* Per-kernel timing of the next eager forward: on = 1 enables, then tl_cuda_prof_report prints
 * a table (name, calls, ms, share) to f and clears it. Graph replay is bypassed while on. */
void tl_cuda_prof_enable(tl_backend *b, int on);
void tl_cuda_prof_report(tl_backend *b, void *file);
/* on = 1: synchronize, then cudaProfilerStart; on = 0: synchronize, then cudaProfilerStop. The
 * launches in between are what `ncu --profile-from-start off` profiles (tulip bench
 * --profile-range; bench/prefill_profile.sh); without a profiler attached both are no-ops.
 * 0 or TL_ERR_CUDA (the CUDA error printed). */
int tl_gpu_profiler_range(int on);
/* tulip bench --ops: after a decode step, times each decode op of one token in place (a graph of
 * back-to-back launches, PDL as in the step) and prints a table to file. */
int tl_cuda_bench_ops(tl_backend *b, void *file);
/* Device memory used by weights (bytes). */
size_t tl_cuda_weight_bytes(const tl_backend *b);

#ifdef __cplusplus
}
#endif

#endif
