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
#include "engine/prefix_cache.h"

/* A sampling law in sparse form (docs/architecture.md §3.6): the survivors of the sampler's
 * filters (tl_sample_probs) with their probabilities, and what a logprob needs. Speculative
 * decoding drafts and accepts on laws, so a backend that computes them on the device sends a few
 * hundred bytes a row instead of the 248K logits. A parameter set has a sparse law when
 * tl_law_ok (sample.h): greedy, or 1 <= top_k <= TL_LAW_MAX, without logit bias, allowed-token
 * mask or top logprobs. */
#define TL_LAW_MAX 64
/* Count adjustments a law row of the CUDA backend takes (tl_gpu_sample_law): the tokens a
 * speculative step has fed or will feed around the row, at most the fed one and the drafts. */
#define TL_LAW_ADJ (TL_MAX_SPEC + 1)
typedef struct tl_law {
    int32_t n;              /* survivors; 0: the row has no law (a non-finite logit) */
    int32_t id[TL_LAW_MAX]; /* most likely first (ties: lower id first) */
    float p[TL_LAW_MAX];    /* probabilities, summing to 1 (greedy: one survivor of 1) */
    float lp[TL_LAW_MAX];   /* logprobs of id[] under the unmodified logits, rounded as the
                             * backend's own sampler rounds them */
} tl_law;

/* One sequence's part of a batched forward. Positions pos .. pos+n_tok-1 are computed; the slot's
 * state must hold exactly `pos` tokens before the call and holds pos+n_tok after it. */
typedef struct tl_fwd_entry {
    int slot;
    int pos;
    const int32_t *tokens;
    int n_tok;
    float *logits; /* out: [n_vocab] logits of the last token, or NULL */
    /* out: [n_tok, n_vocab] logits of every token, or NULL. Set on a speculative verify
     * (docs/architecture.md §3.6): the slot must then be able to roll back to any length in
     * pos+1 .. pos+n_tok (rollback below). */
    float *all_logits;
    /* out: [n_tok] laws of every token instead of all_logits (backends with can_law), under
     * law_sample; row i's penalties count tokens[0..i] and the history before pos */
    tl_law *all_laws;
    const tl_sample_params *law_sample;
    /* Prefix cache (docs/architecture.md §4.1): snap_at > 0 (pos < snap_at < pos + n_tok): the
     * GDN conv and recurrent state after position snap_at - 1 are written into prefix-cache
     * snapshot `snap` during the forward, as cache_save would write them after a step that ended
     * there (the KV rows stay in the slot's pages: cache_save with io->state_in copies those
     * after the step). 0: none. */
    int snap_at, snap;
    /* device sampling (only read by backends with can_sample): */
    const tl_sample_params *sample; /* NULL: no sample wanted */
    uint64_t *rng;                  /* the sequence's RNG state, advanced by one draw */
    const int32_t *history;         /* all tokens of the sequence so far, incl. this call's */
    int n_history;
    int n_prompt; /* history[0..n_prompt) is prompt, the rest generated */
    tl_sample_out *out;
    /* called before `sample` is read (tulip.h tl_batch_entry.prepare), or NULL */
    void (*prepare)(void *ctx);
    void *prepare_ctx;
} tl_fwd_entry;

/* One MTP draft step of one sequence (docs/architecture.md §3.6, docs/model.md §3.3). The slot
 * holds len tokens. step 0: the head's row at position len - 1, pairing `token` (the sampled,
 * not yet fed token) with the slot's trunk hidden at len - 1 (that row becomes part of the
 * head's cache). step k > 0: the row at position len - 1 + k, pairing `token` (draft k) with the
 * h' of step k - 1 (a speculative row: the verify's rows overwrite it). */
typedef struct tl_draft_entry {
    int slot;
    int step;
    int32_t token;
    float *logits; /* out: [n_vocab] draft logits; NULL when law is given */
    /* out instead of logits (backends with can_law), or NULL: the law of the draft logits under
     * sample, whose penalties count the history before the slot's length and chain[0..step] (the
     * sampled token, then the drafts before this step) */
    tl_law *law;
    const tl_sample_params *sample;
    const int32_t *chain;
} tl_draft_entry;

/* One entry of a whole chain of drafts (draft_chain): k draft steps from `token` (the sampled
 * one, chain[0] of tl_draft_entry), each draft drawn on the backend from its law exactly as
 * tl_law_draw draws it (the first id when greedy or the law has one survivor, else with the
 * next of u[0..k): the uniforms the session's RNG would give, in order). Stops early at an empty
 * law (n_drafted < k). */
typedef struct tl_chain_entry {
    int slot, k;
    int32_t token;
    int greedy;
    double u[TL_MAX_SPEC];
    const tl_sample_params *sample; /* tl_law_ok */
    tl_law *law;                    /* out: [k] the draft laws (valid below n_drafted) */
    int32_t *drafts;                /* out: [k] drafts 1 .. n_drafted */
    int n_drafted, n_draws;         /* out: drafts made, uniforms used (a prefix of u) */
} tl_chain_entry;

typedef struct tl_backend {
    const char *name;
    int can_sample; /* 1: forward() samples on the device when e->sample is set */
    int can_law;    /* 1: draft() and forward() fill tl_law rows where asked (speculation) */
    int max_ctx;    /* tokens per slot, set at open (a backend asked for 0 chooses it) */
    void *impl;
    void (*close)(struct tl_backend *b);
    /* The KV pool (tulip.h tl_kv_stats): a slot holding n tokens holds ceil(n / page_tokens)
     * pages; forward() takes the pages its entries grow into, all or nothing (TL_ERR_CONTEXT_FULL
     * when short, no slot changed), reset_slot gives a slot's pages back. NULL: no pool; the
     * engine then reports one page of max_ctx tokens per slot. */
    void (*kv_stats)(struct tl_backend *b, tl_kv_stats *out);
    /* Clears the state of a slot (zero KV length, zero conv and recurrent state, KV pages back
     * in the pool). 0, or a negative tl_status when the slot could not be cleared (the engine
     * then keeps it out of use until a later reset succeeds). */
    int (*reset_slot)(struct tl_backend *b, int slot);
    int (*forward)(struct tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen);

    /* Speculative decoding with the MTP head (docs/architecture.md §3.6). NULL ops: not
     * implemented (the engine runs without speculation and says so once).
     * spec_init: called once after open, before any forward, with the most draft tokens per
     * step (1..4): allocates the head's KV cache per slot and what rollback needs. From then on
     * every forward() also computes the head's rows its entries make computable (row p once the
     * token at p + 1 is known: rows len - 1 .. pos + n_tok - 2 of an entry) and keeps the last
     * trunk hiddens of each slot. 0, TL_ERR_NOMEM, TL_ERR_UNSUPPORTED (no MTP head). */
    int (*spec_init)(struct tl_backend *b, int max_draft, char *err, size_t errlen);
    /* 1 when the slot's head cache covers every row below its length (it may draft); 0 after
     * a prefix-cache load, which restores no head rows (the sequence then decodes plainly). */
    int (*spec_ready)(struct tl_backend *b, int slot);
    /* One draft step for n entries (distinct slots). */
    int (*draft)(struct tl_backend *b, const tl_draft_entry *d, int n, char *err, size_t errlen);
    /* Optional (can_law backends; NULL: the engine calls draft step by step): all the draft
     * steps of n entries (distinct slots) in one call, the drafts drawn on the backend; the
     * same laws, drafts and head rows as draft() with the host drawing between steps. */
    int (*draft_chain)(struct tl_backend *b, tl_chain_entry *d, int n, char *err, size_t errlen);
    /* After a forward with all_logits: the slot back to n_keep tokens (the accepted ones), as if
     * only those had been fed: GDN conv and recurrent state, KV length and pages, the head's
     * rows (valid below n_keep - 1) and its hidden (that of position n_keep - 1). */
    int (*rollback)(struct tl_backend *b, int slot, int n_keep, char *err, size_t errlen);

    /* Prefix cache storage (docs/architecture.md §4.1; the decisions are prefix_cache.c's, the
     * backend only copies). NULL ops: no prefix cache. The cache's KV pages are pool pages,
     * shared through the page tables: kv_pool gives the backend's pool bookkeeping (pages of
     * TL_PC_PAGE tokens). pc_page_bytes: one pool page (the KV of TL_PC_PAGE positions, every
     * attention layer); pc_snap_bytes: one slot's GDN conv and recurrent state; pc_budget: the
     * snapshot budget the backend set aside at open (bytes; 0: none, the engine picks it). */
    size_t pc_page_bytes, pc_snap_bytes;
    long long pc_budget;
    tl_kv_pages *(*kv_pool)(struct tl_backend *b);
    /* Allocates n_snap snapshots (once). 0, TL_ERR_NOMEM / TL_ERR_CUDA. */
    int (*cache_alloc)(struct tl_backend *b, int n_snap, char *err, size_t errlen);
    /* A snapshot of a slot holding exactly io->n_tok tokens: rows [0, io->part_rows) of pool page
     * io->part_src copied into pool page io->part_dst (none when part_rows is 0: no partial page,
     * or the cache keeps the slot's own), the GDN state into snapshot io->snap. The slot is
     * unchanged; its full pages are shared as they are. io->state_in: the state is in the
     * snapshot already (tl_fwd_entry.snap_at) and the slot may hold more than io->n_tok tokens:
     * only the page rows are copied. */
    int (*cache_save)(struct tl_backend *b, int slot, const tl_pc_io *io, char *err, size_t errlen);
    /* Starts an empty slot from the cache: the shared pages io->page[0..n_full) mapped into its
     * page table (read-only: the slot writes only from n_tok on), a page of its own for the
     * partial page (all or nothing: TL_ERR_CONTEXT_FULL when the pool is short, the slot
     * unchanged) with rows [0, n_tok % TL_PC_PAGE) copied from io->page[n_full], the GDN state
     * from the snapshot; tokens[0..n_tok) are the tokens they hold (penalty counts; n_prompt as
     * in tl_fwd_entry). On any other failure the slot's state is undefined (the engine resets
     * it). */
    int (*cache_load)(struct tl_backend *b, int slot, const tl_pc_io *io, const int32_t *tokens,
                      int n_prompt, char *err, size_t errlen);
} tl_backend;

/* Tokens of one prefix cache page (both backends). */
#define TL_PC_PAGE 64

/* The backend an engine runs on: for tests that inject backend faults (engine.c). */
tl_backend *tl_engine_backend_impl(tl_engine *e);

/* CPU reference backend (always available). Each slot holds max_ctx tokens of KV. Its pool of
 * pages of TL_CPU_KV_PAGE tokens is kept with kv_pages.c as the CUDA backend keeps its own: with
 * kv_tokens > 0 that many tokens that all slots share (the memory is still max_ctx per slot, but
 * the sequences together hold no more than the pool, exactly as on the GPU: the scheduler's
 * admission and preemption are tested this way); kv_tokens 0: every slot full. */
#define TL_CPU_KV_PAGE 64
int tl_backend_cpu_open(tl_backend **out, const tl_model *m, int max_seqs, int max_ctx,
                        long kv_tokens, int n_threads, char *err, size_t errlen);

/* For tests: the CPU backend's prefix-cache snapshot `snap` (pc_snap_bytes bytes), or NULL. */
const void *tl_backend_cpu_snapshot(const tl_backend *b, int snap);

#ifndef TL_NO_CUDA
/* CUDA backend: uploads the model, allocates state for max_seqs slots of max_ctx tokens.
 * Returns TL_ERR_UNSUPPORTED (with a message naming the field) for dimensions its kernels were
 * not built for, TL_ERR_CUDA when no usable GPU is present. m may be NULL with random weights. */
typedef struct tl_cuda_params {
    int max_seqs;
    int max_ctx;    /* 0: max_position_embeddings if the pool holds one such sequence, else the
                       pool's size (tl_backend.max_ctx says which) */
    long kv_tokens; /* KV pool size in tokens, shared by the slots; 0 = from the GPU's memory */
    int random_weights;
    uint64_t seed;
    int weight_bits; /* 16 or 4 */
    /* kv_tokens 0: the fraction of the GPU's memory in use once the pool is allocated (the pool
     * at most max_seqs * max_ctx); 0 = 0.9 */
    double gpu_memory_utilization;
    /* Prefix cache budget set aside before the KV pool is sized: > 0 bytes; < 0 = a default
     * from the free memory; 0 = no prefix cache (direct users such as tests/gpu get none unless
     * they ask; the engine maps its own convention, tulip.h, onto this one). */
    long long prefix_cache_bytes;
    int state_bf16; /* GDN recurrent state in bf16 (tl_engine_params) */
    /* CUDA device ordinal among the visible ones (CUDA_VISIBLE_DEVICES, applied by the runtime);
     * every entry point makes it current on its calling thread. */
    int device;
    /* > 0: the most MTP draft tokens a step (1..TL_MAX_SPEC; docs/architecture.md §3.6): the
     * MTP head is uploaded (random with random_weights), its KV gets a layer in the pool and
     * the buffers of drafts, verifies and rollbacks are allocated at open; spec_init may then
     * ask for up to this many. 0: no speculation (spec_init fails). */
    int spec_tokens;
} tl_cuda_params;
int tl_backend_cuda_open(tl_backend **out, const tl_model *m, const tl_config *cfg,
                         const tl_cuda_params *p, char *err, size_t errlen);
/* For tests: the CUDA backend's prefix-cache snapshot `snap` (pc_snap_bytes bytes) into host
 * memory out, after the work queued so far. 0, TL_ERR_INVALID, TL_ERR_CUDA. */
int tl_backend_cuda_snapshot(tl_backend *b, int snap, void *out);
#endif

#endif
