/* The CPU reference (oracle): plain fp32 C, as close to HF modeling_qwen3_5_moe.py as possible.
 * Every CUDA kernel is tested against these functions on random inputs. Shapes are row-major,
 * slowest first. Nothing here allocates per call except where noted; nothing is approximate
 * (no fast-math): the oracle must be IEEE-faithful. */
#ifndef TL_CPU_H
#define TL_CPU_H

#include <stdint.h>
#include "model/weights.h"

/* ---- elementary ops (cpu_ops.c) ---- */
float cpu_silu(float x);
float cpu_sigmoid(float x);
float cpu_softplus(float x); /* log(1+e^x), torch's threshold 20 */

/* Value of row r, column c of a linear weight (float or affine-quantized). */
float cpu_mat_get(const tl_mat *W, int r, int c);
/* Row r of W dequantized to f32 into dst[cols]. */
void cpu_mat_row(float *dst, const tl_mat *W, int r);

/* y[rows] = W x[cols]. */
void cpu_matvec(float *y, const tl_mat *W, const float *x);
/* Y[n, rows] = X[n, cols] W^T (rows split across the thread pool). */
void cpu_matmul(float *Y, const tl_mat *W, const float *X, int n);

/* y = x / sqrt(mean(x^2) + eps) * w   (w already holds 1+w for RMSNorm1p weights). y may be x. */
void cpu_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* Gated RMSNorm of the GDN output: y = x / sqrt(mean(x^2) + eps) * w * silu(z). y may be x. */
void cpu_rmsnorm_gated(float *y, const float *x, const float *z, const float *w, int n, float eps);
/* x *= 1/sqrt(sum(x^2) + eps). */
void cpu_l2norm(float *x, int n, float eps);
/* NeoX partial RoPE on one head in place: pairs (d, d + n_rot/2) for d < n_rot/2, theta_j =
 * pos * base^(-2j/n_rot); dims >= n_rot untouched. */
void cpu_rope_neox(float *x, int n_rot, int pos, float base);
/* softmax in place over n values (fp32, max-subtracted). */
void cpu_softmax(float *x, int n);

/* ---- blocks (cpu_attn.c, cpu_gdn.c, cpu_moe.c) ---- */

/* Causal depthwise conv + SiLU for one token. state [(K-1), C] holds the previous K-1 pre-conv
 * inputs (oldest first) and is shifted to include x. w [C, K], tap K-1 multiplies x. */
void cpu_conv1d_step(float *out, float *state, const float *x, const float *w, int C, int K);

/* One gated-delta-rule step for all value heads (docs/model.md §2.4 step 7):
 *   S_h <- exp(g_h) S_h;  d = beta_h (v_h - S_h^T k);  S_h <- S_h + k d^T;  o_h = S_h^T q
 * q, k: [n_k_head, Dk] (already L2-normalised, q scaled by 1/sqrt(Dk)); v, o: [n_v_head, Dv];
 * g, beta: [n_v_head]; S: [n_v_head, Dk, Dv]. Value head h reads key head h / (n_v_head/n_k_head).
 */
void cpu_gdn_step(float *o, float *S, const float *q, const float *k, const float *v,
                  const float *g, const float *beta, int n_k_head, int n_v_head, int Dk, int Dv);

/* The same recurrence over T tokens in the chunked (WY / UT-transform) form with chunk size
 * `chunk` (HF torch_chunk_gated_delta_rule); q,k: [T, n_k_head, Dk], v, o: [T, n_v_head, Dv],
 * g, beta: [T, n_v_head]; S is the initial state on entry and the final state on return. */
void cpu_gdn_chunked(float *o, float *S, const float *q, const float *k, const float *v,
                     const float *g, const float *beta, int T, int n_k_head, int n_v_head, int Dk,
                     int Dv, int chunk);

/* Causal attention of n_q query tokens at positions pos0.. over a cache of kv_len = pos0 + n_q
 * tokens. q: [n_q, n_head, D]; kc, vc: [kv_len, n_head_kv, D]; out: [n_q, n_head, D].
 * Query head h uses kv head h / (n_head / n_head_kv). Softmax in fp32 with the given scale. */
void cpu_attention(float *out, const float *q, const float *kc, const float *vc, int n_q, int pos0,
                   int n_head, int n_head_kv, int D, float scale);

/* Router: p = softmax(logits[n_expert]); top-k by p (ties: lower id first); weights renormalised
 * to sum 1. ids[k], w[k] in descending order of p. */
void cpu_moe_route(int *ids, float *w, const float *logits, int n_expert, int k);

/* y[n_embd] = down (silu(gate x) * (up x)); tmp needs 2*n_ff floats. */
void cpu_ffn_swiglu(float *y, const tl_mat *gate, const tl_mat *up, const tl_mat *down,
                    const float *x, float *tmp);

/* ---- whole model (cpu_forward.c) ---- */

/* One sequence's state: KV cache of the attention layers, conv and recurrent state of the GDN
 * layers. Allocated for max_ctx tokens. */
typedef struct cpu_state {
    int max_ctx;
    int n_past;
    float *kv_k[TL_MAX_LAYERS]; /* attention layers: [max_ctx, n_head_kv, head_dim] */
    float *kv_v[TL_MAX_LAYERS];
    float *conv[TL_MAX_LAYERS]; /* gdn layers: [(K-1), conv_dim] */
    float *rec[TL_MAX_LAYERS];  /* gdn layers: [n_v_head, Dk, Dv] */
    /* Smallest router-logit gap between the k-th chosen expert and the best expert left out,
     * over every layer and token of the last cpu_forward: a routing near-tie, where any other
     * rounding may pick the other expert (tests use it to tell such a flip from an error). */
    float route_gap;
} cpu_state;

int cpu_state_init(cpu_state *st, const tl_config *c, int max_ctx);
void cpu_state_free(cpu_state *st);
void cpu_state_reset(cpu_state *st, const tl_config *c);

/* Runs n tokens at positions st->n_past.. through the model, updating st. logits (if non-NULL)
 * receives [n_vocab] logits of the last token; all_logits (if non-NULL) [n, n_vocab] of every
 * token. Returns TL_ERR_CONTEXT_FULL if n_past + n > max_ctx (state unchanged). */
int cpu_forward(const tl_model *m, cpu_state *st, const int32_t *tokens, int n, float *logits,
                float *all_logits);

/* cpu_forward, and hidden (if non-NULL) receives [n, n_embd] final-normed hidden states (the
 * lm_head's input; the MTP head's input, docs/model.md §3.3). */
int cpu_forward_h(const tl_model *m, cpu_state *st, const int32_t *tokens, int n, float *logits,
                  float *all_logits, float *hidden);

/* ---- the MTP head (docs/model.md §3.2) ---- */

/* Its KV cache for one sequence: [max_ctx, n_head_kv, head_dim] K and V (f32). */
typedef struct cpu_mtp_state {
    int max_ctx;
    float *k, *v;
} cpu_mtp_state;

int cpu_mtp_state_init(cpu_mtp_state *s, const tl_config *c, int max_ctx);
void cpu_mtp_state_free(cpu_mtp_state *s);

/* n MTP rows at positions pos0 .. pos0+n-1 (the positions of their hidden states). Row i pairs
 * tokens[i] (the token after that position) with hidden[i] ([n_embd]: the trunk's final-normed
 * hidden, or the h' of the previous draft step) and attends over rows 0..pos0+i of s (rows
 * below pos0 must have been computed before; rows from pos0 on are written). h_out ([n, n_embd],
 * may be NULL) receives RMSNorm1p(t; mtp.norm), the next draft step's hidden; logits ([n_vocab])
 * the last row's draft logits, all_logits ([n, n_vocab]) every row's. TL_ERR_INVALID without an
 * MTP head or with a bad token, TL_ERR_CONTEXT_FULL past max_ctx. */
int cpu_mtp_forward(const tl_model *m, cpu_mtp_state *s, const int32_t *tokens, const float *hidden,
                    int n, int pos0, float *h_out, float *logits, float *all_logits);

/* Thread count for cpu_matmul (0 = all cores). */
void cpu_set_threads(int n);

#endif
