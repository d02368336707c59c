/* Host sampler: the CPU backend's sampling and the reference for the CUDA sampler. */
#ifndef TL_SAMPLE_H
#define TL_SAMPLE_H

#include <stdint.h>
#include "tulip.h"

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

#endif
