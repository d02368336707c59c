/* The CUDA backend seen from C: device memory helpers, the weight upload, and one entry per
 * decode op (over device pointers, on the backend's stream), so tests/gpu can check every kernel
 * against the CPU oracle. The backend itself (tl_backend_cuda_open) is declared in
 * engine/backend.h; bench helpers are at the end.
 *
 * Activations between decode kernels are f32 (the residual stream too); weights are bf16 or the
 * 4-bit "q4 tiled" layout of gpu_prefill.h, so the prefill GEMMs read the same bytes. Shapes are
 * row-major, slowest first. Every entry returns 0 or a negative tl_status. */
#ifndef TL_GPU_H
#define TL_GPU_H

#include <stddef.h>
#include <stdint.h>
#include "tulip.h"
#include "model/weights.h"
#include "engine/backend.h"
#include "cuda/gpu_prefill.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ====== Device and memory ====== */

/* Selects device 0 and checks it can run sm_90a code. */
int tl_gpu_init(char *err, size_t errlen);
void *tl_gpu_malloc(size_t n); /* NULL on failure */
void tl_gpu_free(void *p);
int tl_gpu_upload(void *dst, const void *src, size_t n);
int tl_gpu_download(void *dst, const void *src, size_t n);
int tl_gpu_memset(void *dst, int v, size_t n);
/* Waits for all work, then reports the first error (TL_ERR_CUDA). */
int tl_gpu_sync(void);

/* ====== Weights ======
 * A device matrix is a tl_gpu_gemm_w (gpu_prefill.h): bits 16 = bf16 [rows, cols]; bits 4 = q4
 * tiled words + scale/bias words. tl_gpu_mat_upload stacks `n_parts` host matrices by rows into
 * one device matrix of rows_pad rows (>= the sum; extra rows are zero). It is 4-bit when every part
 * is MLX affine 4-bit with group 64 and the row offsets are multiples of 8; otherwise bf16
 * (float parts converted, 8-bit parts dequantized), with a low bf16 plane in out->sb when a part
 * is not bf16 already (hi + lo holds ~16 bits: the decode GEMV reads both; the prefill GEMM and
 * the embedding read hi only). Frees with tl_gpu_mat_free. */
int tl_gpu_mat_upload(tl_gpu_gemm_w *out, const tl_mat *const *parts, int n_parts, int rows_pad,
                      char *err, size_t errlen);
void tl_gpu_mat_free(tl_gpu_gemm_w *m);
/* Stacks n experts (gate, up [F, n_embd]; down [n_embd, F]; the shared expert is passed last)
 * expert-major: gate_up [n * 2F, n_embd] with each expert's gate/up rows interleaved by 8, down
 * [n * n_embd, F]; q4 when every matrix is MLX 4-bit g64, else bf16. Each expert's q4 scale/bias
 * block is contiguous (gpu_prefill.h: "experts lie contiguously"). */
int tl_gpu_experts_upload(tl_gpu_gemm_w *gate_up, tl_gpu_gemm_w *down, const tl_mat *const *gate,
                          const tl_mat *const *up, const tl_mat *const *down_src, int n, char *err,
                          size_t errlen);
/* Size in bytes of a device matrix's weights (w + sb). */
size_t tl_gpu_mat_bytes(const tl_gpu_gemm_w *m);

/* ====== Batch description (device arrays) ======
 * A batch is n_tok tokens from n_seg sequences ("segments"); segment s holds tokens
 * seg_tok0[s] .. seg_tok0[s]+seg_n[s]-1 of the batch, consecutive positions seg_pos0[s].., in
 * state slot seg_slot[s]. tok_pos / tok_slot / tok_seg repeat that per token. */
typedef struct tl_gpu_seqs {
    const int32_t *tok_pos, *tok_slot, *tok_seg;
    const int32_t *seg_tok0, *seg_n, *seg_slot, *seg_pos0;
    int n_tok, n_seg;
} tl_gpu_seqs;

/* ====== Decode ops (k_*.cu) ====== */

/* x[t, :] = E[tokens[t], :] (f32). */
int tl_gpu_embed(float *x, const tl_gpu_gemm_w *E, const int32_t *tokens, int n_tok);
/* y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, rows of n; rows[i] (if non-NULL) picks the input
 * row of output row i. */
int tl_gpu_rmsnorm(float *y, const float *x, const float *w, const int32_t *rows, int n_out, int n,
                   float eps);
/* y[t, r] (+)= sum_c W[r, c] * xn[t, c] for r < W->rows, t < n_tok, where xn = x, or
 * rmsnorm(x; norm_w) when norm_w is non-NULL. ldx, ldy: row strides. */
int tl_gpu_gemv(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                const float *norm_w, float eps, int n_tok, int accumulate);
/* tl_gpu_gemv (no accumulate) for a q4 GDN in-projection of decode tokens (one per sequence)
 * with the conv1d of tl_gpu_conv1d fused: rows r < C give conv_out[t, r] (SiLU of the conv over
 * conv_state[tok_slot[t]] and the new value, state shifted) instead of y[t, r]; rows >= C go
 * to y as usual. Same bits as tl_gpu_gemv + tl_gpu_conv1d. TL_ERR_INVALID unless W is q4 and
 * C % 8 == 0. */
int tl_gpu_gemv_conv1d(float *y, int ldy, const tl_gpu_gemm_w *W, const float *x, int ldx,
                       const float *norm_w, float eps, int n_tok, float *conv_out,
                       float *conv_state, const float *conv_w, int C, const int32_t *tok_slot);
/* Causal depthwise conv (kernel 4) + SiLU over the first C columns of in [n_tok, ld_in], per
 * segment, in token order; state [n_slot][3][C] f32 holds each slot's last 3 pre-conv inputs
 * (oldest first). out [n_tok, C]. w [C, 4]. */
int tl_gpu_conv1d(float *out, float *state, const float *in, int ld_in, const float *w, int C,
                  const tl_gpu_seqs *s);
/* Gated DeltaNet step (MODEL.md §2.4 steps 4-8) per segment, token by token: q, k, v from
 * qkv [n_tok, 2*nk*128 + nv*128] (conv output), z, b, a from proj [n_tok, ld_proj] at column
 * offsets z_off, b_off, a_off. S [n_slot][nv][128][128] f32. y [n_tok, nv*128] = gated RMSNorm
 * of the output with norm_w [128]. */
int tl_gpu_gdn(float *y, float *S, const float *qkv, const float *proj, int ld_proj, int z_off,
               int b_off, int a_off, const float *dt_bias, const float *a_neg, const float *norm_w,
               int n_k_head, int n_v_head, float eps, const tl_gpu_seqs *s);
/* Paged KV cache. Per attention layer, K and V are each a pool of pages of TL_KV_PAGE tokens,
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

/* Attention prologue: q/k RMSNorm1p + NeoX RoPE (64 dims) from proj [n_tok, ld_proj] (per head
 * [query 256 | gate 256], then K (n_kv*256), then V); q_out [n_tok, n_head, 256] f32 (NULL: q is
 * written back in place of the raw query inside proj); K and V written to the paged caches
 * kc/vc at (slot, pos) through pg. */
int tl_gpu_qk_rope_kv(float *q_out, uint16_t *kc, uint16_t *vc, const float *proj, int ld_proj,
                      const float *q_norm, const float *k_norm, int n_head, int n_kv,
                      const tl_gpu_kv_pages *pg, float theta, float eps, const tl_gpu_seqs *s);
/* Gated attention of each token over its slot's cache positions 0..pos (paged caches kc/vc
 * through pg; split-KV, at most n_split partials per head in part [n_tok * n_head * n_split *
 * 258] f32), then combined and multiplied by sigmoid(gate) from proj: out [n_tok, n_head*256]. */
int tl_gpu_attn(float *out, float *part, const float *q, const uint16_t *kc, const uint16_t *vc,
                const float *proj, int ld_proj, int n_head, int n_kv, const tl_gpu_kv_pages *pg,
                int n_split, const tl_gpu_seqs *s);
/* 1: tl_gpu_attn uses the CUDA-core split kernel even where the tensor-core one applies (G = 8
 * query heads per KV head); for tests and the TL_CUDA_ATTN_NO_TC=1 switch. */
void tl_gpu_attn_force_cuda_core(int on);
/* Router from logits [n_tok, ld] (n_expert router logits, then the shared-expert gate logit):
 * fp32 softmax, top-k (ties: lower id), renormalised; ids/w [n_tok, k]; w_sh [n_tok] =
 * sigmoid(shared gate logit); sh_logit (NULL or [n_tok]) = the raw shared gate logit. */
int tl_gpu_moe_route(int32_t *ids, float *w, float *w_sh, float *sh_logit, const float *logits,
                     int ld, int n_expert, int k, int n_tok);
/* Experts: act [n_tok, k+1, F] = silu(gate_e x) * (up_e x) for the k routed experts of each token
 * and the shared one (expert n_expert of the stack), x = rmsnorm(h; norm_w). gate_up: the stacked
 * experts, each [2F, n_embd] with gate/up rows interleaved by 8 (gpu_prefill.h). Then
 * h[t] += sum_j w_j down_j act_j + w_sh down_sh act_sh (fixed order: deterministic). */
int tl_gpu_moe_up(float *act, const tl_gpu_gemm_w *gate_up, const float *h, const float *norm_w,
                  float eps, const int32_t *ids, int k, int n_expert, int n_tok);
/* q4 experts only: tl_gpu_moe_route fused into tl_gpu_moe_up (every block routes its token from
 * logits [n_tok, ld]; ids, w, w_sh are written as tl_gpu_moe_route writes them, for moe_down). */
int tl_gpu_moe_up_route(float *act, int32_t *ids, float *w, float *w_sh,
                        const tl_gpu_gemm_w *gate_up, const float *h, const float *norm_w,
                        float eps, const float *logits, int ld, int k, int n_expert, int n_tok);
int tl_gpu_moe_down(float *h, const tl_gpu_gemm_w *down, const float *act, const int32_t *ids,
                    const float *w, const float *w_sh, int k, int n_expert, int n_tok);

/* Sampling, one row of logits [n_rows, n_vocab] per entry (see k_sample.cu). `params` is a
 * device array of tl_sample_params; keys [n_rows] u64 random keys; counts (NULL or [n_rows,
 * n_vocab] i32 penalty counts, bit 30 = seen anywhere, low 24 bits = times generated); scratch
 * [n_rows, 2*n_vocab] f32. out: device tl_sample_out [n_rows]. Only ids < n_valid are sampled. */
int tl_gpu_sample(tl_sample_out *out, const float *logits, int n_vocab, int n_valid,
                  const tl_sample_params *params, const uint64_t *keys, const int32_t *counts,
                  float *scratch, int n_rows);
/* Builds penalty counts for one row from history [n_hist] (first n_prompt are prompt). */
int tl_gpu_penalty_counts(int32_t *counts, const int32_t *hist, int n_hist, int n_prompt,
                          int n_vocab);

/* ====== Bench helpers ====== */

/* Bytes a decode step of one token reads and writes at context kv_len (weights touched, KV,
 * recurrent and conv state), from the backend's uploaded weights. */
double tl_cuda_decode_bytes(const tl_backend *b, int kv_len);
/* Measured device-to-device copy bandwidth (read + write bytes / s) over `bytes`. */
double tl_gpu_measure_bw(size_t bytes);
/* Per-kernel timing of the next eager forward: on = 1 enables, then tl_cuda_prof_report prints
 * a table (name, calls, ms, share) to f and clears it. Graph replay is bypassed while on. */
void tl_cuda_prof_enable(tl_backend *b, int on);
void tl_cuda_prof_report(tl_backend *b, void *file);
/* tulip bench --ops: after a decode step, times each decode op of one token in place (a graph of
 * back-to-back launches, PDL as in the step) and prints a table to file. */
int tl_cuda_bench_ops(tl_backend *b, void *file);
/* Device memory used by weights / state (bytes). */
size_t tl_cuda_weight_bytes(const tl_backend *b);

#ifdef __cplusplus
}
#endif

#endif
