/* Host sampler: the CPU backend's sampling and the reference for the CUDA sampler. */
#ifndef TL_SAMPLE_H
#define TL_SAMPLE_H

#include <stdint.h>
#include "tulip.h"
#include "engine/backend.h"

/* Seeds a sequence's RNG stream. */
uint64_t tl_rng_seed(uint64_t seed);
/* Next uniform double in [0, 1); advances *s. */
double tl_rng_uniform(uint64_t *s);

/* Samples one token from logits[0..n_vocab) (ids >= n_vocab are never chosen):
 *  1. logprob / top logprobs from log_softmax of the unmodified logits;
 *  1b. the logit bias added, tokens outside `allow` set to -inf (tulip.h); no finite logit left:
 *     token TL_TOKEN_NONE_ALLOWED (non-finite input logits: TL_TOKEN_NON_FINITE, checked first);
 *  2. repetition penalty over history[0..n_history) (HF: l>0 ? l/r : l*r), presence and
 *     frequency penalties over the generated part history[n_prompt..n_history) (OpenAI);
 *  3. temperature <= 0: argmax (ties: lowest id); else softmax(l / T), then min-p (drop
 *     p < min_p * p_max) and top-k, then top-p over the survivors (the smallest most-likely-first
 *     set holding top_p of their mass: renormalised, as vLLM and the CUDA sampler do), draw from
 *     the survivors renormalised with one uniform from *rng.
 * Returns TL_OK or TL_ERR_NOMEM. */
int tl_sample_host(const float *logits, int n_vocab, const tl_sample_params *p, uint64_t *rng,
                   const int32_t *history, int n_history, int n_prompt, tl_sample_out *out);

/* The distribution tl_sample_host draws from (steps 1b-3), dense over n_vocab: probs[i] is the
 * probability of drawing i (0 for tokens the filters drop), a one-hot of the argmax when
 * temperature <= 0. Returns 1, 0 when there is none (non-finite logits, nothing allowed), or
 * TL_ERR_NOMEM. */
int tl_sample_probs(const float *logits, int n_vocab, const tl_sample_params *p,
                    const int32_t *history, int n_history, int n_prompt, float *probs);

/* out->logprob and top logprobs of `token` under the unmodified logits (as tl_sample_host
 * reports them); out->token = token. */
void tl_sample_logprobs(const float *logits, int n_vocab, int token, int n_top, tl_sample_out *out);

/* Speculative rejection sampling of one draft token (docs/architecture.md §3.6): d was drawn
 * from q; with p the target distribution, d is accepted with probability min(1, p[d] / q[d])
 * (one uniform from *rng); otherwise the token returned is drawn from max(0, p - q) renormalised
 * (a second uniform). So the token returned has law p exactly. *accepted says which. p and q are
 * dense over n_vocab (tl_sample_probs). When p - q has no positive mass left (p == q up to
 * rounding) the draw is from p. */
int tl_spec_accept(const float *p, const float *q, int n_vocab, int d, uint64_t *rng,
                   int *accepted);

/* 1 if p has a sparse law (backend.h tl_law): greedy, or 1 <= top_k <= TL_LAW_MAX, with no logit
 * bias, allowed-token mask or top logprobs. */
int tl_law_ok(const tl_sample_params *p);
/* The law of tl_sample_probs in sparse form (p must be tl_law_ok): the survivors most likely
 * first with their renormalised probabilities and their logprobs under the unmodified logits;
 * law->n = 0 when there is none. The host reference of the CUDA law kernels. Returns TL_OK or
 * TL_ERR_NOMEM. */
int tl_sample_law(const float *logits, int n_vocab, const tl_sample_params *p,
                  const int32_t *history, int n_history, int n_prompt, tl_law *law);
/* One token from a law (n >= 1): the first survivor when greedy or the only one (no uniform
 * drawn), else tl_law_pick with one uniform from *rng. */
int tl_law_draw(const tl_law *q, int greedy, uint64_t *rng);
/* The survivor that the uniform u01 in [0, 1) falls on (n >= 1; double sums over the
 * probabilities in order; tl_gpu_draft_pick repeats them on the device). */
int tl_law_pick(const tl_law *q, double u01);
/* tl_spec_accept on laws: d drawn from q, accepted with probability min(1, p(d) / q(d)), else the
 * token drawn from max(0, p - q) renormalised (from p when that has no mass). *logprob: the
 * returned token's logprob under the unmodified logits (it is always one of p's survivors). */
int tl_spec_accept_law(const tl_law *p, const tl_law *q, int d, uint64_t *rng, int *accepted,
                       float *logprob);
/* The logprob of p's survivor `token` under the unmodified logits (NaN if it is none). */
float tl_law_logprob(const tl_law *p, int token);

#endif
