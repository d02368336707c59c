/* The contract between the engine (engine.c: sessions, sampling, batching API) and a compute
 * backend (CPU reference in src/engine/backend_cpu.c, CUDA in src/cuda/). A backend owns the
 * per-sequence state of `max_seqs` slots (KV cache, conv state, recurrent state) and runs the
 * batched forward. It never sees tokenizer or server types. */
#ifndef TL_BACKEND_H
#define TL_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "tulip.h"
#include "model/weights.h"

/* One sequence's part of a batched forward. Positions pos .. pos+n_tok-1 are computed; the slot's
 * state must hold exactly `pos` tokens before the call and holds pos+n_tok after it. */
typedef struct tl_fwd_entry {
    int slot;
    int pos;
    const int32_t *tokens;
    int n_tok;
    float *logits; /* out: [n_vocab] logits of the last token, or NULL */
    /* device sampling (only read by backends with can_sample): */
    const tl_sample_params *sample; /* NULL: no sample wanted */
    uint64_t *rng;                  /* the sequence's RNG state, advanced by one draw */
    const int32_t *history;         /* all tokens of the sequence so far, incl. this call's */
    int n_history;
    int n_prompt; /* history[0..n_prompt) is prompt, the rest generated */
    tl_sample_out *out;
} tl_fwd_entry;

typedef struct tl_backend {
    const char *name;
    int can_sample; /* 1: forward() samples on the device when e->sample is set */
    void *impl;
    void (*close)(struct tl_backend *b);
    /* Clears the state of a slot (zero KV length, zero conv and recurrent state, KV pages back
     * in the pool). 0, or a negative tl_status when the slot could not be cleared (the engine
     * then keeps it out of use until a later reset succeeds). */
    int (*reset_slot)(struct tl_backend *b, int slot);
    int (*forward)(struct tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen);
} tl_backend;

/* The backend an engine runs on: for tests that inject backend faults (engine.c). */
tl_backend *tl_engine_backend_impl(tl_engine *e);

/* CPU reference backend (always available). */
int tl_backend_cpu_open(tl_backend **out, const tl_model *m, int max_seqs, int max_ctx,
                        int n_threads, char *err, size_t errlen);

#ifndef TL_NO_CUDA
/* CUDA backend: uploads the model, allocates state for max_seqs slots of max_ctx tokens.
 * Returns TL_ERR_UNSUPPORTED (with a message naming the field) for dimensions its kernels were
 * not built for, TL_ERR_CUDA when no usable GPU is present. m may be NULL with random weights. */
typedef struct tl_cuda_params {
    int max_seqs, max_ctx;
    long kv_tokens; /* KV pool size in tokens, shared by the slots; 0 = max_seqs * max_ctx */
    int random_weights;
    uint64_t seed;
    int weight_bits; /* 16 or 4 */
} tl_cuda_params;
int tl_backend_cuda_open(tl_backend **out, const tl_model *m, const tl_config *cfg,
                         const tl_cuda_params *p, char *err, size_t errlen);
#endif

#endif
