/* tulip public API: a loaded model (tl_engine), one sequence's state (tl_session), the batched
 * forward+sample step the scheduler drives, and status codes.
 *
 * Threading: an engine and its sessions are owned by one thread (the engine thread). Nothing
 * here is safe to call concurrently on the same engine. Errors: 0 = success, negative tl_status
 * = failure; functions that can fail for a caller-visible reason take (char *err, size_t errlen).
 */
#ifndef TULIP_H
#define TULIP_H

#include <stddef.h>
#include <stdint.h>

typedef enum tl_status {
    TL_OK = 0,
    TL_ERR_INVALID = -1,
    TL_ERR_NOMEM = -2,
    TL_ERR_IO = -3,
    TL_ERR_FORMAT = -4,
    TL_ERR_UNSUPPORTED = -5,
    TL_ERR_CONTEXT_FULL = -6,
    TL_ERR_BUSY = -7,
    TL_ERR_CANCELLED = -8,
    TL_ERR_CUDA = -9,
    TL_ERR_DEVICE_LOST = -10,
    TL_ERR_INTERNAL = -11,
} tl_status;

const char *tl_status_str(int st);

typedef struct tl_engine tl_engine;
typedef struct tl_session tl_session;
struct tl_config;

typedef enum tl_backend_kind {
    TL_BACKEND_AUTO = 0, /* CUDA; when it cannot open, CPU for a test-shape model only (the reason
                            on stderr); the production model gets an error instead */
    TL_BACKEND_CPU = 1,
    TL_BACKEND_CUDA = 2,
} tl_backend_kind;

typedef struct tl_engine_params {
    const char *model_path; /* checkpoint directory (config.json + *.safetensors) */
    tl_backend_kind backend;
    int allow_test_shape; /* accept dimensions other than the production model's */
    int n_threads;        /* CPU backend threads; 0 = all cores */
    int max_seqs;         /* live sessions at once (state slots); 0 = default (16) */
    int max_ctx;          /* tokens per session; 0 = default: CUDA: the model's maximum when the
                             KV pool holds one such sequence, else the pool's size; CPU:
                             min(model max, 32768) */
    long kv_tokens;       /* KV cache pool in tokens (whole pages: tl_kv_stats), shared by all
                             sessions; 0 = CUDA: sized from the GPU's memory, at most
                             max_seqs * max_ctx; CPU: no pool (every session can be full at
                             once). A step that needs a page when none is free fails with
                             TL_ERR_CONTEXT_FULL and changes no session. */
    int random_weights;   /* bench: build a full-size model from `seed`, no checkpoint */
    uint64_t seed;
    int weight_bits; /* random weights: 16 (bf16) or 4 (affine g64) */
    /* CUDA with kv_tokens 0: the fraction of the GPU's memory the process may hold once the KV
     * pool is allocated (weights, activations, state and KV together); 0 = default 0.9 */
    double gpu_memory_utilization;
    /* Prefix cache (docs/architecture.md §4.1): its memory budget in bytes (KV pages and GDN
     * state snapshots together); 0 = default (CUDA: a quarter of the memory left after the
     * weights, state and activations, at most 32 GiB; CPU: 256 MiB); < 0 = off. */
    long long prefix_cache_bytes;
    /* CUDA: the Gated DeltaNet recurrent state in bf16 instead of fp32 (half the bytes per
     * sequence and per decode step; rounding measured in notes/2026-12-04-bf16-state.md) */
    int state_bf16;
    /* CUDA device ordinal among the visible devices (CUDA_VISIBLE_DEVICES, applied by the CUDA
     * runtime, decides which those are); 0 = the first. The CPU backend has only 0: any other
     * value is TL_ERR_INVALID when it is the backend chosen. */
    int device;
    /* Speculative decoding with the checkpoint's MTP head (docs/architecture.md §3.6): draft
     * tokens per step, 0 = off, 1..TL_MAX_SPEC. Turned off, said once on stderr, when the
     * checkpoint has no MTP head or the backend does not implement speculation. With
     * random_weights (CUDA) the head is random too (for measuring costs). */
    int spec_tokens;
} tl_engine_params;

#define TL_MAX_SPEC 4

/* Opens the model at p->model_path (or builds random weights), picks the backend, uploads.
 * On failure *out is NULL and err names the file, tensor and field at fault. */
int tl_engine_open(tl_engine **out, const tl_engine_params *p, char *err, size_t errlen);
void tl_engine_close(tl_engine *e);
/* Runs throw-away sequences through tl_engine_step (prefills of 640 and 256 tokens, each with
 * two decode steps after it, sampled, drafting when speculation is on) so that one-time costs
 * (the CUDA runtime loading each kernel at its first launch, decode graphs captured at first
 * use) are paid here and not by the first request. Needs a free session slot; leaves every slot
 * as it was and the speculation counters unchanged; says its time on stderr (one line). */
int tl_engine_warm_up(tl_engine *e, char *err, size_t errlen);
const struct tl_config *tl_engine_config(const tl_engine *e);
tl_backend_kind tl_engine_backend(const tl_engine *e);
int tl_engine_max_ctx(const tl_engine *e);
int tl_engine_max_seqs(const tl_engine *e);
/* Draft tokens per step of speculative decoding in effect (0: off). */
int tl_engine_spec_tokens(const tl_engine *e);

/* Speculative decoding counters since open (vLLM's spec_decode metrics). */
typedef struct tl_spec_stats {
    long long drafts;   /* verify steps of one sequence (each drafted 1..K tokens) */
    long long drafted;  /* draft tokens proposed */
    long long accepted; /* of them, accepted by the verify */
    /* wall seconds of the steps that speculated, by phase: the backend's draft calls, the host's
     * draft laws and draws, the forward (verify and the step's other entries), the acceptance
     * (target laws, draws, rollbacks) */
    double s_draft, s_draft_host, s_forward, s_accept;
    /* per draft position i (0: the first draft): verify steps that drafted more than i tokens,
     * and of them those whose draft i was accepted (so were drafts 0..i-1) */
    long long drafted_pos[TL_MAX_SPEC], accepted_pos[TL_MAX_SPEC];
} tl_spec_stats;
int tl_engine_spec_stats(const tl_engine *e, tl_spec_stats *out);

/* The KV cache pool, in pages. A session holding n tokens holds exactly ceil(n / page_tokens)
 * pages (pages are taken as positions are computed and all given back at reset or close), so
 * what a sequence still needs follows from its length alone (tl_kv_pages_to_grow). The CUDA
 * backend's pages are 64 tokens; the CPU backend, which has no pool unless kv_tokens is set,
 * reports one page of max_ctx tokens per slot. */
typedef struct tl_kv_stats {
    int page_tokens;    /* tokens a page holds */
    long pages_total;   /* pages in the pool */
    long pages_free;    /* pages no session holds */
    long pages_per_seq; /* pages one session can hold at most (ceil(max_ctx / page_tokens)) */
} tl_kv_stats;

/* Fills *out; 0, or TL_ERR_INVALID without an engine or out. */
int tl_engine_kv_stats(const tl_engine *e, tl_kv_stats *out);
/* Pages a sequence of n_past tokens must still be given to hold n_tokens (0 when it has them). */
long tl_kv_pages_to_grow(const tl_kv_stats *k, long n_past, long n_tokens);

/* A session is one sequence: its KV cache, conv state and recurrent state, and the tokens it
 * has consumed. Opening one takes a clean state slot: TL_ERR_BUSY when all are taken; the
 * backend's status when the only ones left could not be reset (the device is failing). */
int tl_session_open(tl_engine *e, tl_session **out, char *err, size_t errlen);
/* Frees the session and resets its slot for the next one. A failed reset is returned (the
 * session is freed all the same); that slot stays out of use until a reset of it succeeds. */
int tl_session_close(tl_session *s);
int tl_session_n_past(const tl_session *s); /* tokens consumed so far */
/* Back to an empty sequence. On failure (the backend's status) the session refuses steps until
 * a reset succeeds. */
int tl_session_reset(tl_session *s);

/* What a sequence carries besides its tokens and its KV: where its prompt ends (-1 before the
 * first sample) and its sampler's RNG state. Preemption by recompute uses it: the scheduler
 * saves it, closes the session (its pages go back to the pool), and later feeds the same tokens
 * to a new session restored from it, whose samples then continue the old sequence's RNG stream
 * and penalty window as if it had never stopped. */
typedef struct tl_session_snap {
    int n_prompt;
    uint64_t rng;
} tl_session_snap;
void tl_session_save(const tl_session *s, tl_session_snap *out);
/* On a session that holds no tokens (just opened or reset); TL_ERR_INVALID otherwise. */
int tl_session_restore(tl_session *s, const tl_session_snap *snap);

/* ====== Prefix cache (docs/architecture.md §4.1). ======
 * A snapshot is a sequence's state (KV and GDN conv + recurrent state) after its first n tokens,
 * kept under a salt (NULL or "" = none; different salts never share). */

/* 1 when the engine has a prefix cache. */
int tl_engine_prefix_enabled(const tl_engine *e);
/* Starts an empty session (no tokens yet) from the longest snapshot under salt that is a prefix
 * of tokens[0..n) and at most max_len tokens long: the session then holds those tokens (their KV
 * and state as if computed), and the caller feeds tokens from there. Returns the tokens restored
 * (0: no hit, or no cache), or a negative status: TL_ERR_INVALID (a session not empty, bad
 * arguments), TL_ERR_CONTEXT_FULL (no KV pages for the prefix; the session is unchanged: feed
 * the tokens as without a cache), anything else from the backend (the session's state is then
 * lost: reset or close it). Counts a query and, on a hit, the hit and its tokens. */
int tl_session_prefix_load(tl_session *s, const char *salt, const int32_t *tokens, int n,
                           int max_len, char *err, size_t errlen);
/* Snapshots the session's state after every token it holds, under salt (LRU: the least recently
 * used snapshots make room). 1: saved (or was already cached); 0: nothing saved (no cache, an
 * empty session, or no free KV page for its partial page); negative: the backend failed (the
 * session is unchanged, the cache is as before). */
int tl_session_prefix_save(tl_session *s, const char *salt, char *err, size_t errlen);
/* The same for a session that is about to be closed or reset: its last, partial KV page is handed
 * to the cache instead of copied (so the snapshot needs no free page). The session then refuses
 * steps (TL_ERR_INVALID) until it is reset. */
int tl_session_prefix_save_last(tl_session *s, const char *salt, char *err, size_t errlen);

typedef struct tl_prefix_stats {
    long long queries;     /* tl_session_prefix_load calls */
    long long hits;        /* of them, those that restored a prefix */
    long long hit_tokens;  /* tokens restored */
    long long evictions;   /* snapshots evicted to make room */
    long long saves;       /* snapshots taken */
    long snapshots;        /* snapshots held now */
    long long bytes_used;  /* snapshot states and KV pages held now */
    long long bytes_total; /* the snapshot budget plus the KV pool (whose pages it shares) */
    long long snap_bytes;  /* bytes of snapshot states held now */
} tl_prefix_stats;
/* Fills *out (all zero without a cache); 0, or TL_ERR_INVALID without an engine or out. */
int tl_engine_prefix_stats(const tl_engine *e, tl_prefix_stats *out);

/* Sampling parameters for one step. temperature <= 0 means greedy (argmax). */
typedef struct tl_sample_params {
    float temperature;
    int top_k;                /* <= 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float presence_penalty;   /* OpenAI: over tokens generated so far */
    float frequency_penalty;  /* OpenAI: over tokens generated so far */
    float repetition_penalty; /* HF/vLLM: over prompt and generated tokens; 1 = off */
    uint64_t seed;            /* RNG stream of this sequence, seeded at its first sample */
    int n_logprobs;           /* top logprobs to return, 0..TL_MAX_LOGPROBS */
    /* Token restrictions (docs/architecture.md §3.5), in host memory that stays valid for the
     * tl_engine_step call. Applied to the logits before the penalties, temperature, min-p,
     * top-k and top-p; logprob and top logprobs stay those of the unmodified logits. */
    const int32_t *bias_ids; /* logit_bias: bias_vals[i] is added to the logit of bias_ids[i] */
    const float *bias_vals;  /* (a repeated id gets the sum of its values, in order) */
    int n_bias;              /* 0..TL_MAX_LOGIT_BIAS */
    const uint32_t *allow;   /* NULL, or a bitset of n_vocab bits (bit i % 32 of word i / 32):
                              * only tokens whose bit is set may be sampled (their logit + bias;
                              * the others are -inf). No allowed token with a finite logit:
                              * token TL_TOKEN_NONE_ALLOWED. */
} tl_sample_params;

#define TL_MAX_LOGPROBS   20
#define TL_MAX_LOGIT_BIAS 1024
/* tl_sample_out.token values that are not tokens: */
#define TL_TOKEN_NON_FINITE   (-1) /* the logits held a NaN or +inf, or no finite value */
#define TL_TOKEN_NONE_ALLOWED (-2) /* allow/bias left no token with a finite logit */

/* TL_ERR_INVALID (with the field named) unless: temperature and the penalties are finite, top_p
 * is in (0, 1], min_p in [0, 1], repetition_penalty > 0, n_logprobs in [0, TL_MAX_LOGPROBS]
 * (top_k <= 0 is off), n_bias in [0, TL_MAX_LOGIT_BIAS] with bias_ids and bias_vals set when
 * n_bias > 0, every bias id >= 0 and every value finite. tl_engine_step checks every entry's
 * parameters with it, and the bias ids against n_vocab. */
int tl_sample_params_check(const tl_sample_params *p, char *err, size_t errlen);

typedef struct tl_sample_out {
    int32_t token; /* TL_TOKEN_NON_FINITE (-1): the logits were not finite (NaN or infinity: a
                    * poisoned model or input), nothing was sampled; the other entries of the
                    * step are unaffected, this session's state is not finite either (reset or
                    * close it). TL_TOKEN_NONE_ALLOWED (-2): the entry's allow/bias left no
                    * candidate; nothing was sampled, the session is fine. */
    float logprob; /* log-softmax of the chosen token under the unmodified logits */
    int n_top;
    int32_t top_ids[TL_MAX_LOGPROBS];
    float top_logprobs[TL_MAX_LOGPROBS];
} tl_sample_out;

/* One sequence's part of a batched step: append n_tok tokens to sess (a prefill chunk, or one
 * decode token), then, if sample is non-NULL, sample the next token from the logits of the last
 * one into *out, and, if logits is non-NULL, copy those logits ([n_vocab] f32) there.
 * Generated tokens are not fed back automatically: the next step passes them in `tokens`. */
typedef struct tl_batch_entry {
    tl_session *sess;
    const int32_t *tokens;
    int n_tok;
    const tl_sample_params *sample;
    tl_sample_out *out;
    float *logits;
    /* Speculative decoding (docs/architecture.md §3.6): at most this many tokens may be emitted
     * beyond the sample (0: none); `out` then has room for 1 + spec_max samples. The engine
     * drafts only for a one-token entry with a sample, of a session that has sampled before,
     * without an `allow` mask and without `logits`, and never past the context. */
    int spec_max;
    /* out: samples written, out[0 .. n_out) in order (0 without a sample, else 1 + the drafts
     * accepted). All but the last were fed to the session already (it holds n_tok + n_out - 1
     * more tokens); the last is the new sample, fed by the next step as before. */
    int n_out;
    /* Called once during the step, after the forward is under way and before `sample` is read
     * (CUDA: while the GPU runs the step's kernels), so the caller can finish what `sample`
     * points to, e.g. a grammar's allowed-token mask computed on the CPU in the shadow of the
     * forward (server: constrained decoding). The calls of different entries may run at the
     * same time on different threads (CUDA: the CPU worker pool), so a callback may touch only
     * its own entry's state. NULL: none. The engine drafts no tokens for such an entry. */
    void (*prepare)(void *ctx);
    void *prepare_ctx;
    /* Prefix cache (docs/architecture.md §4.1): snap_at > 0, with n_past < snap_at < n_past +
     * n_tok: a snapshot of the session after its first snap_at tokens, under snap_salt, taken
     * inside this step (the state that tl_session_prefix_save would save after a step ending
     * there, without ending the step there). Like that call it is best effort: no snapshot when
     * the cache has no room, and a failed copy only costs the snapshot. 0: none (and ignored
     * without a prefix cache). */
    int snap_at;
    const char *snap_salt;
} tl_batch_entry;

/* Runs one forward over all entries (each session at most once per call). n == 0 does nothing.
 * Every entry is checked before anything changes; a bad one fails the whole call with no session
 * changed:
 *   TL_ERR_INVALID       e NULL; n < 0 or n > max_seqs; entries NULL with n > 0; an entry with no
 *                        session or one of another engine, tokens NULL or n_tok <= 0; a session
 *                        twice; a session whose state was lost (below); a token id outside
 *                        [0, n_vocab); snap_at not 0 and not inside the entry; sample without
 *                        out; sample params that
 *                        tl_sample_params_check refuses;
 *   TL_ERR_CONTEXT_FULL  n_past + n_tok exceeds max_ctx, or reaches it with a sample asked for
 *                        (the sampled token is part of the sequence too: a sequence never holds
 *                        more than max_ctx tokens). Also from the backend when its KV pool is
 *                        out of pages; no session changed then either.
 * Any other failure during the forward or sampling leaves the state of the batch's sessions
 * undefined: they refuse steps (TL_ERR_INVALID) until tl_session_reset succeeds. */
int tl_engine_step(tl_engine *e, tl_batch_entry *entries, int n, char *err, size_t errlen);

#endif
