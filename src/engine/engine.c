/* Engine: opens the model, picks and owns the backend, hands out sessions (state slots), and runs
 * the batched step: validate every entry, forward through the backend, sample (on the device when
 * the backend can, else on the host from the logits). One thread owns an engine (tulip.h).
 *
 * Slots: free, used by a session, or dirty (the backend could not reset it; it is reset again
 * before it is handed out, and stays out of use while that fails). A session whose state is
 * undefined (a failed reset or a failed forward) refuses steps until a reset succeeds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/status.h"
#include "common/util.h"
#include "engine/backend.h"
#include "engine/prefix_cache.h"
#include "engine/sample.h"
#include "model/weights.h"

enum { SLOT_FREE = 0, SLOT_USED, SLOT_DIRTY };

struct tl_engine {
    tl_model *model; /* NULL with random weights */
    tl_config cfg;
    tl_backend *be;
    int max_seqs, max_ctx;
    int n_sample_vocab;        /* ids >= this are padding: never sampled */
    unsigned char *slot_state; /* SLOT_* per slot */
    float *scratch;            /* [max_seqs, n_vocab] logits for host sampling */
    int pc_on;                 /* the prefix cache (§4.1) is in use */
    tl_prefix_cache pc;
    /* speculative decoding (docs/architecture.md §3.6) */
    int spec_k;        /* draft tokens per step; 0: off */
    float *spec_lg;    /* [max_seqs][spec_k + 1][n_vocab] verify logits */
    float *spec_q;     /* [max_seqs][spec_k][n_vocab] draft logits, then their law q */
    float *spec_p;     /* [n_vocab] a target law */
    int32_t *spec_tok; /* [max_seqs][spec_k + 1]: the fed token, then the drafts */
    tl_law *spec_qlaw; /* [max_seqs][spec_k] the drafts' laws (tl_law_ok parameters) */
    tl_law *spec_plaw; /* [max_seqs][spec_k + 1] the verify rows' laws */
    tl_spec_stats spec;
};

struct tl_session {
    tl_engine *e;
    int slot;
    int32_t *tokens; /* every token consumed */
    int n_tokens, cap;
    int n_prompt; /* tokens before the first sample; -1 until then */
    uint64_t rng;
    int lost;   /* 0, or the status that left the slot's state undefined */
    int sealed; /* a final prefix save gave its last page to the cache: no more steps */
};

/* ====== Opening: model, limits, backend. ====== */

static int load_model(tl_engine *e, const tl_engine_params *p, char *err, size_t errlen) {
    if (p->random_weights) {
        tl_config_set_production(&e->cfg); /* built on the device from a seed */
        return TL_OK;
    }
    if (!p->model_path) return tl_errf(err, errlen, TL_ERR_INVALID, "no model path given");
    int rc = tl_model_open(&e->model, p->model_path, err, errlen);
    if (rc) return rc;
    e->cfg = e->model->cfg;
    if (!p->allow_test_shape) return tl_config_check_production(&e->cfg, err, errlen);
    return TL_OK;
}

static int open_cpu(tl_engine *e, const tl_engine_params *p, char *err, size_t errlen) {
    if (p->device != 0)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "device %d: the CPU backend has no devices (only 0); --device selects a "
                       "CUDA GPU",
                       p->device);
    if (!e->model)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "random weights need the CUDA backend");
    if (p->state_bf16)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "--state-dtype bf16 needs the CUDA backend (the CPU oracle keeps fp32)");
    return tl_backend_cpu_open(&e->be, e->model, e->max_seqs, e->max_ctx, p->kv_tokens,
                               p->n_threads, err, errlen);
}

/* Tries the CUDA backend; why it cannot open goes in cerr. */
static int open_cuda(tl_engine *e, const tl_engine_params *p, char *cerr, size_t n) {
#ifndef TL_NO_CUDA
    tl_cuda_params cp = {.max_seqs = e->max_seqs,
                         .max_ctx = p->max_ctx > 0 ? e->max_ctx : 0, /* 0: the backend chooses */
                         .kv_tokens = p->kv_tokens,
                         .gpu_memory_utilization = p->gpu_memory_utilization,
                         .random_weights = p->random_weights,
                         .seed = p->seed,
                         .weight_bits = p->weight_bits ? p->weight_bits : 16,
                         .state_bf16 = p->state_bf16,
                         /* tulip.h: 0 default, < 0 off; backend.h: < 0 default, 0 off */
                         .prefix_cache_bytes = p->prefix_cache_bytes == 0  ? -1
                                               : p->prefix_cache_bytes < 0 ? 0
                                                                           : p->prefix_cache_bytes,
                         .device = p->device,
                         /* the head is uploaded only when speculation can run (§3.6) */
                         .spec_tokens = p->spec_tokens > 0 && p->spec_tokens <= TL_MAX_SPEC &&
                                                (e->model ? e->model->has_mtp : p->random_weights)
                                            ? p->spec_tokens
                                            : 0};
    return tl_backend_cuda_open(&e->be, e->model, &e->cfg, &cp, cerr, n);
#else
    return tl_errf(cerr, n, TL_ERR_UNSUPPORTED, "this build has no CUDA backend (make cuda)");
#endif
}

/* CPU when asked for; else CUDA. AUTO falls back to the CPU only for a test-shape model: the
 * production model on the CPU is no usable server, so there it is an error naming the reason. */
static int open_backend(tl_engine *e, const tl_engine_params *p, char *err, size_t errlen) {
    if (p->backend == TL_BACKEND_CPU) return open_cpu(e, p, err, errlen);
    if (p->backend != TL_BACKEND_AUTO && p->backend != TL_BACKEND_CUDA)
        return tl_errf(err, errlen, TL_ERR_INVALID, "unknown backend %d", (int)p->backend);
    char cerr[512] = "";
    int rc = open_cuda(e, p, cerr, sizeof cerr);
    if (!rc) return TL_OK;
    e->be = NULL;
    if (!cerr[0]) snprintf(cerr, sizeof cerr, "%s", tl_status_str(rc));
    if (p->backend == TL_BACKEND_CUDA) return tl_errf(err, errlen, rc, "%s", cerr);
    if (!e->model)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "random weights need the CUDA backend, which cannot open: %s", cerr);
    if (!tl_config_check_production(&e->cfg, NULL, 0))
        return tl_errf(err, errlen, rc,
                       "the CUDA backend cannot open: %s; not falling back to the CPU backend, "
                       "which is far too slow to serve this 35B model (--backend cpu forces it)",
                       cerr);
    fprintf(stderr,
            "tulip: the CUDA backend cannot open (%s); test-shape model: using the CPU backend\n",
            cerr);
    return open_cpu(e, p, err, errlen);
}

/* The prefix cache: snapshot states within the budget the backend set aside (CUDA) or the one
 * asked for (default 256 MiB), storage in the backend; its KV pages are the backend's pool pages
 * (so it needs a pool of TL_PC_PAGE-token pages); bookkeeping here. */
static int open_prefix_cache(tl_engine *e, const tl_engine_params *p, char *err, size_t errlen) {
    tl_backend *b = e->be;
    if (p->prefix_cache_bytes < 0 || !b->cache_alloc) return 0;
    tl_kv_pages *pool = b->kv_pool ? b->kv_pool(b) : NULL;
    if (!pool || pool->page_tokens != TL_PC_PAGE) {
        fprintf(stderr, "tulip: no prefix cache: the backend's KV pool has no %d-token pages\n",
                TL_PC_PAGE);
        return 0;
    }
    long long bytes = b->pc_budget > 0            ? b->pc_budget
                      : p->prefix_cache_bytes > 0 ? p->prefix_cache_bytes
                                                  : 256ll << 20;
    int n_snap;
    int rc = tl_pc_layout(bytes, b->pc_snap_bytes, &n_snap, err, errlen);
    if (!rc) rc = b->cache_alloc(b, n_snap, err, errlen);
    if (!rc) rc = tl_pc_init(&e->pc, pool, n_snap, b->pc_page_bytes, b->pc_snap_bytes, err, errlen);
    if (rc) return rc;
    e->pc_on = 1;
    fprintf(stderr,
            "tulip: prefix cache %.2f GiB: %d snapshots of %.1f MiB; KV pages shared with the "
            "pool (%d pages of %d tokens)\n",
            (double)bytes / (1 << 30), n_snap, (double)b->pc_snap_bytes / (1 << 20), pool->n_page,
            TL_PC_PAGE);
    return 0;
}

/* Speculative decoding, when asked for and possible (docs/architecture.md §3.6): the backend's
 * MTP state, the host buffers of drafts and verifies. Off, said once, without an MTP head or a
 * backend that implements it. */
static int open_spec(tl_engine *e, const tl_engine_params *p, char *err, size_t errlen) {
    if (p->spec_tokens < 0 || p->spec_tokens > TL_MAX_SPEC)
        return tl_errf(err, errlen, TL_ERR_INVALID, "speculative tokens %d: not in [0, %d]",
                       p->spec_tokens, TL_MAX_SPEC);
    if (!p->spec_tokens) return 0;
    /* random weights (CUDA): the backend builds a random head */
    const char *off = e->model && !e->model->has_mtp ? "the checkpoint has no MTP head (mtp.*)"
                      : !e->be->spec_init || !e->be->draft || !e->be->rollback || !e->be->spec_ready
                          ? "the backend does not implement it"
                          : NULL;
    if (off) {
        fprintf(stderr, "tulip: speculative decoding off: %s\n", off);
        return 0;
    }
    int K = p->spec_tokens, rc = e->be->spec_init(e->be, K, err, errlen);
    if (rc) return rc;
    size_t V = (size_t)e->cfg.n_vocab, S = (size_t)e->max_seqs;
    /* dense logits only for a backend without laws (with laws, entries without one decode
     * plainly): S x (K + 1) x V floats are 1 GiB at 256 slots */
    int dense = !e->be->can_law;
    if (dense) {
        e->spec_lg = malloc(sizeof(float) * S * (K + 1) * V);
        e->spec_q = malloc(sizeof(float) * S * K * V);
        e->spec_p = malloc(sizeof(float) * V);
    }
    e->spec_tok = malloc(sizeof(int32_t) * S * (K + 1));
    e->spec_qlaw = malloc(sizeof(tl_law) * S * K);
    e->spec_plaw = malloc(sizeof(tl_law) * S * (K + 1));
    if ((dense && (!e->spec_lg || !e->spec_q || !e->spec_p)) || !e->spec_tok || !e->spec_qlaw ||
        !e->spec_plaw)
        return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory for speculative decoding");
    e->spec_k = K;
    fprintf(stderr, "tulip: speculative decoding: up to %d draft tokens per step (MTP head)\n", K);
    return 0;
}

int tl_engine_open(tl_engine **out, const tl_engine_params *p, char *err, size_t errlen) {
    if (!out || !p) return tl_errf(err, errlen, TL_ERR_INVALID, "no engine parameters");
    *out = NULL;
    tl_engine *e = xcalloc(1, sizeof *e);
    double t0 = tl_time_s();
    int rc = load_model(e, p, err, errlen);
    double t1 = tl_time_s();
    e->max_seqs = p->max_seqs > 0 ? p->max_seqs : 16;
    e->max_ctx = p->max_ctx > 0 ? p->max_ctx : TL_MIN(e->cfg.max_pos, 32768); /* CPU default */
    if (e->max_ctx > e->cfg.max_pos) e->max_ctx = e->cfg.max_pos;
    e->n_sample_vocab = e->cfg.n_vocab == TL_N_VOCAB ? TL_N_VOCAB_TOKENS : e->cfg.n_vocab;
    if (!rc && p->kv_tokens < 0)
        rc = tl_errf(err, errlen, TL_ERR_INVALID, "kv_tokens = %ld is negative", p->kv_tokens);
    if (!rc) rc = open_backend(e, p, err, errlen);
    if (!rc) e->max_ctx = e->be->max_ctx; /* the CUDA backend may have chosen it */
    if (!rc && e->model) /* the load time of a checkpoint, always reported (one line) */
        fprintf(stderr,
                "tulip: loaded %s in %.1f s (read and checked %.1f s, %s backend setup %.1f s)\n",
                p->model_path, tl_time_s() - t0, t1 - t0, e->be->name, tl_time_s() - t1);
    if (!rc) rc = open_prefix_cache(e, p, err, errlen);
    if (!rc) rc = open_spec(e, p, err, errlen);
    if (!rc) e->slot_state = xcalloc(e->max_seqs, 1);
    if (!rc && !e->be->can_sample) {
        e->scratch = calloc((size_t)e->max_seqs * e->cfg.n_vocab, sizeof(float));
        if (!e->scratch) rc = tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory for logits");
    }
    if (rc) {
        tl_engine_close(e);
        return rc;
    }
    *out = e;
    return TL_OK;
}

void tl_engine_close(tl_engine *e) {
    if (!e) return;
    if (e->pc_on) tl_pc_free(&e->pc); /* first: it is the pool's reclaim hook */
    if (e->be) e->be->close(e->be);
    if (e->model) tl_model_close(e->model);
    free(e->slot_state);
    free(e->scratch);
    free(e->spec_lg), free(e->spec_q), free(e->spec_p), free(e->spec_tok);
    free(e->spec_qlaw), free(e->spec_plaw);
    free(e);
}

/* ====== Warm-up: the first steps' one-time costs paid before the first request. ====== */

/* One throw-away sequence of n prompt tokens: the prefill (sampled with penalties on), then two
 * decode steps (the second may draft, as a sequence that sampled before does). */
static int warm_seq(tl_engine *e, int n, char *err, size_t errlen) {
    tl_session *s;
    int rc = tl_session_open(e, &s, err, errlen);
    if (rc) return rc;
    int32_t *tok = xmalloc((size_t)n * sizeof *tok);
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 7919L + 11) % e->n_sample_vocab);
    tl_sample_params sp = {.temperature = 1.0f,
                           .top_k = 20,
                           .top_p = 0.95f,
                           .presence_penalty = 1.5f,
                           .repetition_penalty = 1.0f,
                           .seed = 1};
    tl_sample_out out[1 + TL_MAX_SPEC];
    tl_batch_entry b = {.sess = s, .tokens = tok, .n_tok = n, .sample = &sp, .out = out};
    for (int step = 0; step < 3; step++) {
        rc = tl_engine_step(e, &b, 1, err, errlen);
        if (rc || out[b.n_out - 1].token < 0) break;
        tok[0] = out[b.n_out - 1].token;
        b.n_tok = 1;
        b.spec_max = e->spec_k;
        if (s->n_tokens + 2 + e->spec_k > e->max_ctx) break; /* a tiny context */
    }
    free(tok);
    int rc2 = tl_session_close(s);
    return rc ? rc : rc2 ? tl_errf(err, errlen, rc2, "warm-up: the slot did not reset") : 0;
}

int tl_engine_warm_up(tl_engine *e, char *err, size_t errlen) {
    if (!e) return tl_errf(err, errlen, TL_ERR_INVALID, "no engine");
    /* 640: the prefill kernels of long prompts (from 512 tokens), 256: those of short ones */
    static const int lens[] = {640, 256};
    tl_spec_stats keep = e->spec;
    double t0 = tl_time_s();
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++) {
        int n = TL_MIN(lens[i], e->max_ctx - 4);
        if (n > 0) rc = warm_seq(e, n, err, errlen);
    }
    e->spec = keep; /* /metrics counts users' drafts only */
    if (!rc) fprintf(stderr, "tulip: warm-up %.2f s\n", tl_time_s() - t0);
    return rc;
}

const struct tl_config *tl_engine_config(const tl_engine *e) { return &e->cfg; }
tl_backend_kind tl_engine_backend(const tl_engine *e) {
    return strcmp(e->be->name, "cpu") ? TL_BACKEND_CUDA : TL_BACKEND_CPU;
}
int tl_engine_max_ctx(const tl_engine *e) { return e->max_ctx; }
int tl_engine_max_seqs(const tl_engine *e) { return e->max_seqs; }
int tl_engine_spec_tokens(const tl_engine *e) { return e ? e->spec_k : 0; }
int tl_engine_spec_stats(const tl_engine *e, tl_spec_stats *out) {
    if (!e || !out) return TL_ERR_INVALID;
    *out = e->spec;
    return TL_OK;
}
tl_backend *tl_engine_backend_impl(tl_engine *e) { return e->be; }

int tl_engine_kv_stats(const tl_engine *e, tl_kv_stats *out) {
    if (!e || !out) return TL_ERR_INVALID;
    if (e->be->kv_stats) {
        e->be->kv_stats(e->be, out);
        return TL_OK;
    }
    /* no pool: a slot is a page of max_ctx tokens, held while a session uses it */
    long used = 0;
    for (int i = 0; i < e->max_seqs; i++) used += e->slot_state[i] == SLOT_USED;
    *out = (tl_kv_stats){.page_tokens = e->max_ctx,
                         .pages_total = e->max_seqs,
                         .pages_free = e->max_seqs - used,
                         .pages_per_seq = 1};
    return TL_OK;
}

long tl_kv_pages_to_grow(const tl_kv_stats *k, long n_past, long n_tokens) {
    long have = TL_CEIL_DIV(TL_MAX(n_past, 0), k->page_tokens);
    long want = TL_CEIL_DIV(TL_MAX(n_tokens, 0), k->page_tokens);
    return want > have ? want - have : 0;
}

/* ====== Sessions. ====== */

/* A slot for a new session: a free one, else a dirty one whose reset now succeeds. Returns the
 * slot, or -1 with *rc the last failed reset's status (0 when there was no dirty slot). */
static int take_slot(tl_engine *e, int *rc) {
    *rc = 0;
    for (int i = 0; i < e->max_seqs; i++)
        if (e->slot_state[i] == SLOT_FREE) return i;
    for (int i = 0; i < e->max_seqs; i++) {
        if (e->slot_state[i] != SLOT_DIRTY) continue;
        int st = e->be->reset_slot(e->be, i);
        if (!st) return i;
        *rc = st;
    }
    return -1;
}

int tl_session_open(tl_engine *e, tl_session **out, char *err, size_t errlen) {
    if (!e || !out) return tl_errf(err, errlen, TL_ERR_INVALID, "no engine or no session pointer");
    *out = NULL;
    int rc, slot = take_slot(e, &rc);
    if (slot < 0 && rc)
        return tl_errf(err, errlen, rc,
                       "no sequence slot: every free slot failed to reset (%s); the device may "
                       "be unusable",
                       tl_status_str(rc));
    if (slot < 0)
        return tl_errf(err, errlen, TL_ERR_BUSY, "all %d sequence slots are in use", e->max_seqs);
    tl_session *s = calloc(1, sizeof *s);
    if (!s) return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
    s->e = e;
    s->slot = slot;
    s->n_prompt = -1;
    e->slot_state[slot] = SLOT_USED; /* clean: backends start zeroed, and close resets */
    *out = s;
    return TL_OK;
}

int tl_session_close(tl_session *s) {
    if (!s) return TL_OK;
    /* the slot is left clean for the next session: state zeroed, KV pages back in the pool */
    int rc = s->e->be->reset_slot(s->e->be, s->slot);
    s->e->slot_state[s->slot] = rc ? SLOT_DIRTY : SLOT_FREE;
    free(s->tokens);
    free(s);
    return rc;
}

int tl_session_n_past(const tl_session *s) { return s->n_tokens; }

int tl_session_reset(tl_session *s) {
    s->n_tokens = 0;
    s->sealed = 0;
    s->n_prompt = -1;
    s->lost = s->e->be->reset_slot(s->e->be, s->slot);
    return s->lost;
}

void tl_session_save(const tl_session *s, tl_session_snap *out) {
    out->n_prompt = s->n_prompt;
    out->rng = s->rng;
}

int tl_session_restore(tl_session *s, const tl_session_snap *snap) {
    if (!s || !snap || s->n_tokens != 0) return TL_ERR_INVALID;
    s->n_prompt = snap->n_prompt;
    s->rng = snap->rng;
    return TL_OK;
}

/* ====== Prefix cache (docs/architecture.md §4.1). ====== */

int tl_engine_prefix_enabled(const tl_engine *e) { return e && e->pc_on; }

/* Room for n tokens in the session's history. */
static int history_reserve(tl_session *s, int n) {
    if (n <= s->cap) return 0;
    int cap = TL_MAX(s->cap * 2, n + 64);
    int32_t *nt = realloc(s->tokens, sizeof(int32_t) * cap);
    if (!nt) return TL_ERR_NOMEM;
    s->tokens = nt;
    s->cap = cap;
    return 0;
}

int tl_session_prefix_load(tl_session *s, const char *salt, const int32_t *tokens, int n,
                           int max_len, char *err, size_t errlen) {
    if (!s || !tokens || n < 0 || s->n_tokens != 0 || s->lost)
        return tl_errf(err, errlen, TL_ERR_INVALID, "prefix load: needs an empty, usable session");
    tl_engine *e = s->e;
    if (!e->pc_on) return 0;
    max_len = TL_MIN(max_len, e->max_ctx - 1);
    int32_t *pages = malloc(sizeof(int32_t) * (size_t)(TL_MAX(max_len, 1) / TL_PC_PAGE + 1));
    if (!pages) return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
    tl_pc_io io;
    int hit = tl_pc_lookup(&e->pc, salt, tokens, n, max_len, pages, &io), rc = 0;
    if (hit >= 0 && history_reserve(s, io.n_tok))
        rc = tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
    if (hit >= 0 && !rc) { /* the snapshot stays while the load's page reservation evicts */
        e->pc.pinned = hit;
        rc = e->be->cache_load(e->be, s->slot, &io, tokens, s->n_prompt, err, errlen);
        e->pc.pinned = -1;
    }
    free(pages);
    if (hit < 0 || rc == TL_ERR_CONTEXT_FULL || rc == TL_ERR_NOMEM) return hit < 0 ? 0 : rc;
    if (rc) {
        s->lost = rc;
        return rc;
    }
    memcpy(s->tokens, tokens, sizeof(int32_t) * (size_t)io.n_tok);
    s->n_tokens = io.n_tok;
    return io.n_tok;
}

static int prefix_save(tl_session *s, const char *salt, int last, char *err, size_t errlen) {
    if (!s) return tl_errf(err, errlen, TL_ERR_INVALID, "prefix save: no session");
    tl_engine *e = s->e;
    if (!e->pc_on || s->n_tokens == 0 || s->lost || s->sealed) return 0;
    tl_pc_io io;
    int rc = tl_pc_plan_save(&e->pc, salt, s->tokens, s->n_tokens, s->slot, last, &io);
    if (last) s->sealed = 1; /* its last page may now be the cache's: it must not grow */
    if (rc == 1) {
        int st = e->be->cache_save(e->be, s->slot, &io, err, errlen);
        if (st) {
            tl_pc_abort(&e->pc, &io);
            rc = st;
        } else
            tl_pc_commit(&e->pc, &io);
    } else if (rc == 2)
        rc = 1; /* already cached */
    return rc;
}

int tl_session_prefix_save(tl_session *s, const char *salt, char *err, size_t errlen) {
    return prefix_save(s, salt, 0, err, errlen);
}

int tl_session_prefix_save_last(tl_session *s, const char *salt, char *err, size_t errlen) {
    return prefix_save(s, salt, 1, err, errlen);
}

int tl_engine_prefix_stats(const tl_engine *e, tl_prefix_stats *out) {
    if (!e || !out) return TL_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (!e->pc_on) return 0;
    tl_pc_stats st;
    tl_pc_get_stats(&e->pc, &st);
    *out = (tl_prefix_stats){.queries = st.queries,
                             .hits = st.hits,
                             .hit_tokens = st.hit_tokens,
                             .evictions = st.evictions,
                             .saves = st.saves,
                             .snapshots = st.snaps_used,
                             .bytes_used = st.bytes_used,
                             .bytes_total = st.bytes_total,
                             .snap_bytes = st.snaps_used * (long long)e->pc.snap_bytes};
    return 0;
}

/* ====== The step. ====== */

static int bad_float(float x) { return !isfinite(x); }

int tl_sample_params_check(const tl_sample_params *p, char *err, size_t errlen) {
    const char *bad = NULL;
    if (!p)
        bad = "no sampling parameters";
    else if (bad_float(p->temperature))
        bad = "temperature is not finite";
    else if (!(p->top_p > 0 && p->top_p <= 1))
        bad = "top_p is not in (0, 1]";
    else if (!(p->min_p >= 0 && p->min_p <= 1))
        bad = "min_p is not in [0, 1]";
    else if (bad_float(p->presence_penalty) || bad_float(p->frequency_penalty))
        bad = "a presence or frequency penalty is not finite";
    else if (!(p->repetition_penalty > 0) || bad_float(p->repetition_penalty))
        bad = "repetition_penalty is not a positive number";
    else if (p->n_logprobs < 0 || p->n_logprobs > TL_MAX_LOGPROBS)
        bad = "n_logprobs is not in [0, TL_MAX_LOGPROBS]";
    else if (p->n_bias < 0 || p->n_bias > TL_MAX_LOGIT_BIAS)
        bad = "n_bias is not in [0, TL_MAX_LOGIT_BIAS]";
    else if (p->n_bias > 0 && (!p->bias_ids || !p->bias_vals))
        bad = "n_bias > 0 without bias_ids and bias_vals";
    if (bad) return tl_errf(err, errlen, TL_ERR_INVALID, "%s", bad);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0)
            return tl_errf(err, errlen, TL_ERR_INVALID, "bias_ids[%d] = %d is negative", i,
                           p->bias_ids[i]);
        if (!(fabsf(p->bias_vals[i]) <= 1e30f))
            return tl_errf(err, errlen, TL_ERR_INVALID,
                           "bias_vals[%d] is not finite or beyond 1e30 in magnitude", i);
    }
    return TL_OK;
}

/* Entry i alone and against the entries before it (tulip.h lists what is checked). */
static int check_entry(tl_engine *e, const tl_batch_entry *b, int i, char *err, size_t errlen) {
    const tl_session *s = b[i].sess;
    if (!s || s->e != e)
        return tl_errf(err, errlen, TL_ERR_INVALID, "batch entry %d: no session of this engine", i);
    if (!b[i].tokens || b[i].n_tok <= 0)
        return tl_errf(err, errlen, TL_ERR_INVALID, "batch entry %d: no tokens", i);
    for (int j = 0; j < i; j++)
        if (b[j].sess == s)
            return tl_errf(err, errlen, TL_ERR_INVALID,
                           "batch entries %d and %d: one session twice in one step", j, i);
    if (s->sealed)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "batch entry %d: the session was sealed by a final prefix save; reset or "
                       "close it",
                       i);
    if (s->lost)
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "batch entry %d: the session's state was lost (%s); reset or close it", i,
                       tl_status_str(s->lost));
    for (int t = 0; t < b[i].n_tok; t++)
        if (b[i].tokens[t] < 0 || b[i].tokens[t] >= e->cfg.n_vocab)
            return tl_errf(err, errlen, TL_ERR_INVALID,
                           "batch entry %d: token id %d out of range [0, %d)", i, b[i].tokens[t],
                           e->cfg.n_vocab);
    if (b[i].snap_at && (b[i].snap_at <= s->n_tokens || b[i].snap_at >= s->n_tokens + b[i].n_tok))
        return tl_errf(err, errlen, TL_ERR_INVALID,
                       "batch entry %d: snapshot point %d not inside positions %d .. %d", i,
                       b[i].snap_at, s->n_tokens + 1, s->n_tokens + b[i].n_tok - 1);
    if (b[i].sample && !b[i].out)
        return tl_errf(err, errlen, TL_ERR_INVALID, "batch entry %d: sample without out", i);
    char why[96];
    if (b[i].sample && tl_sample_params_check(b[i].sample, why, sizeof why))
        return tl_errf(err, errlen, TL_ERR_INVALID, "batch entry %d: %s", i, why);
    for (int k = 0; b[i].sample && k < b[i].sample->n_bias; k++)
        if (b[i].sample->bias_ids[k] >= e->cfg.n_vocab)
            return tl_errf(err, errlen, TL_ERR_INVALID,
                           "batch entry %d: bias id %d out of range [0, %d)", i,
                           b[i].sample->bias_ids[k], e->cfg.n_vocab);
    /* a sampled token joins the sequence too: it needs a place in the context */
    int need = b[i].n_tok + (b[i].sample ? 1 : 0);
    if (s->n_tokens + need > e->max_ctx)
        return tl_errf(err, errlen, TL_ERR_CONTEXT_FULL,
                       "sequence of %d tokens + %d%s exceeds the context of %d", s->n_tokens,
                       b[i].n_tok, b[i].sample ? " + 1 sampled" : "", e->max_ctx);
    return TL_OK;
}

static int check_step(tl_engine *e, const tl_batch_entry *b, int n, char *err, size_t errlen) {
    if (!e) return tl_errf(err, errlen, TL_ERR_INVALID, "no engine");
    if (n < 0 || n > e->max_seqs)
        return tl_errf(err, errlen, TL_ERR_INVALID, "%d batch entries: not in [0, %d]", n,
                       e->max_seqs);
    if (n > 0 && !b) return tl_errf(err, errlen, TL_ERR_INVALID, "no batch entries");
    for (int i = 0; i < n; i++) {
        int rc = check_entry(e, b, i, err, errlen);
        if (rc) return rc;
    }
    return TL_OK;
}

/* Room for every entry's tokens (and k[i] drafts) in its session's history (the only
 * allocation of a step). */
static int grow_histories(const tl_batch_entry *b, const int *k, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        tl_session *s = b[i].sess;
        int need = s->n_tokens + b[i].n_tok + k[i];
        if (need <= s->cap) continue;
        int cap = TL_MAX(s->cap * 2, need + 64);
        int32_t *nt = realloc(s->tokens, sizeof(int32_t) * cap);
        if (!nt) return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
        s->tokens = nt;
        s->cap = cap;
    }
    return TL_OK;
}

/* The backend's view of entry b: history appended, RNG seeded at the first sample. */
static void fill_fwd(tl_engine *e, const tl_batch_entry *b, tl_fwd_entry *x) {
    tl_session *s = b->sess;
    memset(x, 0, sizeof *x);
    x->slot = s->slot;
    x->pos = s->n_tokens;
    x->tokens = b->tokens;
    x->n_tok = b->n_tok;
    memcpy(s->tokens + s->n_tokens, b->tokens, sizeof(int32_t) * b->n_tok);
    if (b->sample && s->n_prompt < 0) {
        s->n_prompt = s->n_tokens + b->n_tok;
        s->rng = tl_rng_seed(b->sample->seed);
    }
    x->history = s->tokens;
    x->n_history = s->n_tokens + b->n_tok;
    x->n_prompt = s->n_prompt;
    x->rng = &s->rng;
    x->out = b->out;
    if (e->be->can_sample) {
        x->sample = b->sample;
        x->logits = b->logits;
        x->prepare = b->prepare, x->prepare_ctx = b->prepare_ctx;
    } else {
        x->logits = b->logits   ? b->logits
                    : b->sample ? e->scratch + (size_t)s->slot * e->cfg.n_vocab
                                : NULL;
    }
}

/* ====== Speculative decoding (docs/architecture.md §3.6). ====== */

/* Draft tokens for entry b this step: 0 unless speculation is on and b is a one-token decode
 * entry with a sample (of a session that sampled before, so its RNG is seeded), no allowed-token
 * mask (a grammar's mask depends on the tokens before it) and no logits wanted, whose slot's
 * head is up to date, and whose parameters have a sparse law when the backend computes laws; at
 * most spec_max, and within the context (the verify feeds k + 1 tokens, then one is sampled). */
static int spec_tokens_of(const tl_engine *e, const tl_batch_entry *b) {
    const tl_session *s = b->sess;
    if (!e->spec_k || b->spec_max <= 0 || b->n_tok != 1 || !b->sample || b->sample->allow ||
        b->prepare || b->logits || s->n_prompt < 0 || !e->be->spec_ready(e->be, s->slot))
        return 0;
    /* a backend with laws samples the rest on the device: the dense host path over its whole
     * vocabulary (O(V log V) a row) would cost more than the drafts can save */
    if (e->be->can_law && !tl_law_ok(b->sample)) return 0;
    int k = TL_MIN(e->spec_k, b->spec_max);
    return TL_MAX(0, TL_MIN(k, e->max_ctx - s->n_tokens - 2));
}

/* One token from a dense law (tl_sample_probs) with one uniform; greedy laws are one-hot. */
static int draw_dense(const float *q, int V, uint64_t *rng) {
    double tot = 0, acc = 0;
    for (int i = 0; i < V; i++) tot += q[i];
    double u = tl_rng_uniform(rng) * tot;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (q[i] <= 0) continue;
        acc += q[i];
        last = i;
        if (u < acc) return i;
    }
    return last;
}

/* Draft j + 1 of entry x from its law d->law (computed here from the logits when the backend
 * cannot): greedy, the first survivor; else one draw from the session's RNG. No law (non-finite
 * logits): the drafts end before it (*k = j). */
static int draft_law(tl_engine *e, tl_batch_entry *x, const tl_draft_entry *d, int j, int *k) {
    tl_session *s = x->sess;
    if (!e->be->can_law) {
        int rc = tl_sample_law(d->logits, e->n_sample_vocab, x->sample, s->tokens,
                               s->n_tokens + 1 + j, s->n_prompt, d->law);
        if (rc) return rc;
    }
    if (d->law->n < 1) {
        *k = j;
        return 0;
    }
    int32_t dt = tl_law_draw(d->law, x->sample->temperature <= 0, &s->rng);
    e->spec_tok[(size_t)s->slot * (e->spec_k + 1) + j + 1] = dt;
    s->tokens[s->n_tokens + 1 + j] = dt;
    return 0;
}

/* The drafts of spec_draft in one backend call (draft_chain): the draws on the backend with the
 * uniforms each session's RNG would give, then the RNG advanced past those used: the same
 * drafts, laws and RNG state as the step-by-step loop. */
static int spec_chain(tl_engine *e, tl_batch_entry *b, int *k, int n, char *err, size_t errlen) {
    int K = e->spec_k;
    tl_chain_entry stackc[16];
    tl_chain_entry *c = n <= 16 ? stackc : calloc(n, sizeof *c);
    int *ent = malloc(sizeof(int) * (size_t)n);
    if (!c || !ent) {
        if (c != stackc) free(c);
        free(ent);
        return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
    }
    int nc = 0;
    for (int i = 0; i < n; i++) {
        if (k[i] < 1) continue;
        tl_session *s = b[i].sess;
        int32_t *tok = e->spec_tok + (size_t)s->slot * (K + 1);
        tok[0] = b[i].tokens[0], s->tokens[s->n_tokens] = tok[0];
        tl_chain_entry *x = &c[nc];
        *x = (tl_chain_entry){.slot = s->slot,
                              .k = k[i],
                              .token = tok[0],
                              .greedy = b[i].sample->temperature <= 0,
                              .sample = b[i].sample,
                              .law = e->spec_qlaw + (size_t)s->slot * K,
                              .drafts = tok + 1};
        uint64_t r = s->rng;
        for (int j = 0; j < k[i]; j++) x->u[j] = tl_rng_uniform(&r);
        ent[nc++] = i;
    }
    double t0 = tl_time_s();
    int rc = nc ? e->be->draft_chain(e->be, c, nc, err, errlen) : 0;
    e->spec.s_draft += tl_time_s() - t0;
    for (int t = 0; t < nc && !rc; t++) {
        tl_session *s = b[ent[t]].sess;
        k[ent[t]] = c[t].n_drafted;
        for (int j = 0; j < c[t].n_drafted; j++) s->tokens[s->n_tokens + 1 + j] = c[t].drafts[j];
        for (int j = 0; j < c[t].n_draws; j++) tl_rng_uniform(&s->rng);
    }
    if (c != stackc) free(c);
    free(ent);
    return rc;
}

/* Whether spec_chain serves these entries: a backend that chains (it makes the laws itself),
 * every drafting entry's sampling one with a law. */
static int chain_ok(const tl_engine *e, const tl_batch_entry *b, const int *k, int n) {
    if (!e->be->draft_chain) return 0;
    for (int i = 0; i < n; i++)
        if (k[i] > 0 && !tl_law_ok(b[i].sample)) return 0;
    return 1;
}

/* The drafts: k[i] chained steps of the MTP head per entry, all entries' step j in one backend
 * call. Each draft is drawn from its own law q (the sampling parameters applied to the draft
 * logits, with the drafts before it in the history): the argmax when greedy, else one draw from
 * the session's RNG. A draft whose logits are not finite ends that entry's drafts there. The
 * session's history holds the fed token and the drafts past its length (not counted yet). */
static int spec_draft(tl_engine *e, tl_batch_entry *b, int *k, int n, char *err, size_t errlen) {
    size_t V = (size_t)e->cfg.n_vocab;
    int K = e->spec_k, Vs = e->n_sample_vocab;
    if (chain_ok(e, b, k, n)) return spec_chain(e, b, k, n, err, errlen);
    tl_draft_entry stackd[64];
    tl_draft_entry *d = n <= 64 ? stackd : calloc(n, sizeof *d);
    int *ent = malloc(sizeof(int) * (size_t)n);
    if (!d || !ent) {
        if (d != stackd) free(d);
        free(ent);
        return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
    }
    int rc = 0;
    for (int j = 0; j < K && !rc; j++) {
        int nd = 0;
        for (int i = 0; i < n; i++) {
            if (k[i] <= j) continue;
            tl_session *s = b[i].sess;
            int32_t *tok = e->spec_tok + (size_t)s->slot * (K + 1);
            if (j == 0) tok[0] = b[i].tokens[0], s->tokens[s->n_tokens] = tok[0];
            int lawm = tl_law_ok(b[i].sample);
            d[nd] = (tl_draft_entry){.slot = s->slot,
                                     .step = j,
                                     .token = tok[j],
                                     .logits = e->spec_q ? e->spec_q + ((size_t)s->slot * K + j) * V
                                                         : NULL,
                                     .law = lawm ? e->spec_qlaw + (size_t)s->slot * K + j : NULL,
                                     .sample = b[i].sample,
                                     .chain = tok};
            ent[nd++] = i;
        }
        if (!nd) break;
        double t0 = tl_time_s();
        rc = e->be->draft(e->be, d, nd, err, errlen);
        double t1 = tl_time_s();
        e->spec.s_draft += t1 - t0;
        for (int t = 0; t < nd && !rc; t++) {
            tl_batch_entry *x = &b[ent[t]];
            tl_session *s = x->sess;
            if (d[t].law) {
                rc = draft_law(e, x, &d[t], j, &k[ent[t]]);
                if (rc) rc = tl_errf(err, errlen, rc, "drafting: %s", tl_status_str(rc));
                continue;
            }
            float *q = d[t].logits;
            int ok =
                tl_sample_probs(q, Vs, x->sample, s->tokens, s->n_tokens + 1 + j, s->n_prompt, q);
            if (ok < 0) rc = tl_errf(err, errlen, ok, "drafting: %s", tl_status_str(ok));
            if (ok != 1) {
                k[ent[t]] = j; /* no law to draw from: the drafts end before this one */
                continue;
            }
            int32_t dt = x->sample->temperature <= 0 ? draw_dense(q, Vs, &(uint64_t){1})
                                                     : draw_dense(q, Vs, &s->rng);
            e->spec_tok[(size_t)s->slot * (K + 1) + j + 1] = dt;
            s->tokens[s->n_tokens + 1 + j] = dt;
        }
        e->spec.s_draft_host += tl_time_s() - t1;
    }
    if (d != stackd) free(d);
    free(ent);
    return rc;
}

/* The verify entry of a speculating session: its token and the k drafts, logits of each. */
static void spec_fill(tl_engine *e, const tl_batch_entry *b, int k, tl_fwd_entry *x) {
    int slot = b->sess->slot;
    x->tokens = e->spec_tok + (size_t)slot * (e->spec_k + 1);
    x->n_tok = k + 1;
    x->n_history = x->pos + k + 1;
    x->logits = NULL;
    x->sample = NULL;
    x->all_logits =
        e->spec_lg ? e->spec_lg + (size_t)slot * (e->spec_k + 1) * e->cfg.n_vocab : NULL;
    if (tl_law_ok(b->sample) && e->be->can_law) {
        x->all_laws = e->spec_plaw + (size_t)slot * (e->spec_k + 1);
        x->law_sample = b->sample;
        x->all_logits = NULL;
    }
}

/* Acceptance of one verified entry: draft i against the target at verify row i (the row after
 * the fed token and drafts 1..i), in order, until one is rejected; then the correction, or the
 * bonus token from the last row when all were accepted. Greedy: accepted when the target's own
 * greedy sample (tl_sample_host) is the draft, so the tokens and logprobs are those of decoding
 * without speculation. Sampling: tl_spec_accept (min(1, p/q), else a draw from max(0, p - q)),
 * so each token has the target's law. The session keeps the fed token and the accepted drafts;
 * the backend rolls the rest back. */
/* Verify row i's law: the backend's, or computed here from the row's logits. */
static int row_law(tl_engine *e, const tl_batch_entry *b, const tl_fwd_entry *f, int i,
                   tl_law **out) {
    tl_session *s = b->sess;
    *out = e->spec_plaw + (size_t)s->slot * (e->spec_k + 1) + i;
    if (f->all_laws) return 0;
    return tl_sample_law(f->all_logits + (size_t)i * e->cfg.n_vocab, e->n_sample_vocab, b->sample,
                         s->tokens, s->n_tokens + 1 + i, s->n_prompt, *out);
}

/* One emitted token: `token` with its logprob under row law p (none: the non-finite marker). */
static void law_out(const tl_law *p, int token, tl_sample_out *o) {
    memset(o, 0, sizeof *o);
    o->token = p->n < 1 ? TL_TOKEN_NON_FINITE : token;
    o->logprob = p->n < 1 ? NAN : tl_law_logprob(p, token);
}

/* spec_finish on laws (tl_law_ok parameters): the same acceptance, each row's law and each
 * draft's law instead of dense distributions; returns the number of tokens emitted. */
static int finish_laws(tl_engine *e, tl_batch_entry *b, const tl_fwd_entry *f, int *acc, int *rc) {
    tl_session *s = b->sess;
    int k = f->n_tok - 1, greedy = b->sample->temperature <= 0, n_out = 0, stop = 0;
    const int32_t *tok = f->tokens;
    tl_law *p;
    for (int i = 0; i < k && !stop && !*rc; i++) {
        tl_sample_out *o = &b->out[n_out++];
        if ((*rc = row_law(e, b, f, i, &p))) break;
        if (p->n < 1 || greedy) {
            law_out(p, p->id[0], o);
            stop = p->n < 1 || o->token != tok[i + 1];
            continue;
        }
        const tl_law *q = e->spec_qlaw + (size_t)s->slot * e->spec_k + i;
        int a, t = tl_spec_accept_law(p, q, tok[i + 1], &s->rng, &a, &o->logprob);
        o->token = t, o->n_top = 0;
        stop = !a;
    }
    *acc = stop ? n_out - 1 : n_out;
    if (!*rc && !stop && !(*rc = row_law(e, b, f, k, &p))) /* all accepted: the bonus token */
        law_out(p, p->n < 1 ? 0 : tl_law_draw(p, greedy, &s->rng), &b->out[n_out++]);
    return n_out;
}

/* spec_finish on dense rows (parameters without a sparse law): the target's law over the whole
 * vocabulary per row (tl_sample_probs), the drafts' from spec_q; returns the tokens emitted. */
static int finish_dense(tl_engine *e, tl_batch_entry *b, const tl_fwd_entry *f, int *acc, int *rc) {
    tl_session *s = b->sess;
    const tl_sample_params *sp = b->sample;
    int K = e->spec_k, k = f->n_tok - 1, Vs = e->n_sample_vocab, base = s->n_tokens;
    size_t V = (size_t)e->cfg.n_vocab;
    const int32_t *tok = f->tokens;
    int greedy = sp->temperature <= 0, n_out = 0, stop = 0;
    for (int i = 0; i < k && !stop && !*rc; i++) {
        const float *row = f->all_logits + (size_t)i * V;
        tl_sample_out *o = &b->out[n_out++];
        int nh = base + 1 + i;
        if (greedy) {
            *rc = tl_sample_host(row, Vs, sp, &s->rng, s->tokens, nh, s->n_prompt, o);
            stop = o->token != tok[i + 1];
            continue;
        }
        int ok = tl_sample_probs(row, Vs, sp, s->tokens, nh, s->n_prompt, e->spec_p);
        if (ok != 1) { /* no target law (non-finite): the sampler says which */
            *rc = ok < 0 ? ok : tl_sample_host(row, Vs, sp, &s->rng, s->tokens, nh, s->n_prompt, o);
            stop = 1;
            continue;
        }
        const float *q = e->spec_q + ((size_t)s->slot * K + i) * V;
        int a, t = tl_spec_accept(e->spec_p, q, Vs, tok[i + 1], &s->rng, &a);
        tl_sample_logprobs(row, Vs, t, sp->n_logprobs, o);
        stop = !a;
    }
    *acc = stop ? n_out - 1 : n_out;
    if (!*rc && !stop) /* every draft accepted: the bonus token */
        *rc = tl_sample_host(f->all_logits + (size_t)k * V, Vs, sp, &s->rng, s->tokens,
                             base + 1 + k, s->n_prompt, &b->out[n_out++]);
    return n_out;
}

static int spec_finish(tl_engine *e, tl_batch_entry *b, const tl_fwd_entry *f, char *err,
                       size_t errlen) {
    tl_session *s = b->sess;
    int k = f->n_tok - 1, base = s->n_tokens, acc = 0, rc = 0;
    int n_out =
        tl_law_ok(b->sample) ? finish_laws(e, b, f, &acc, &rc) : finish_dense(e, b, f, &acc, &rc);
    if (rc) return tl_errf(err, errlen, rc, "sampling: %s", tl_status_str(rc));
    if (acc < k) rc = e->be->rollback(e->be, s->slot, base + 1 + acc, err, errlen);
    if (rc) return rc;
    s->n_tokens = base + 1 + acc;
    b->n_out = n_out;
    e->spec.drafts++;
    e->spec.drafted += k;
    e->spec.accepted += acc;
    for (int i = 0; i < k; i++) e->spec.drafted_pos[i]++;
    for (int i = 0; i < acc; i++) e->spec.accepted_pos[i]++;
    return 0;
}

/* After a forward: advance each session, sample on the host when the backend does not. */
static int finish_step(tl_engine *e, tl_batch_entry *b, const tl_fwd_entry *f, int n, char *err,
                       size_t errlen) {
    for (int i = 0; i < n; i++) {
        tl_session *s = b[i].sess;
        if (f[i].all_logits || f[i].all_laws) { /* a speculative verify (§3.6) */
            int rc = spec_finish(e, &b[i], &f[i], err, errlen);
            if (rc) return rc;
            continue;
        }
        s->n_tokens += b[i].n_tok;
        b[i].n_out = b[i].sample ? 1 : 0;
        if (!b[i].sample || e->be->can_sample) continue;
        if (b[i].prepare) b[i].prepare(b[i].prepare_ctx);
        int rc = tl_sample_host(f[i].logits, e->n_sample_vocab, b[i].sample, &s->rng, s->tokens,
                                s->n_tokens, s->n_prompt, b[i].out);
        if (rc) return tl_errf(err, errlen, rc, "sampling: %s", tl_status_str(rc));
    }
    return TL_OK;
}

/* Snapshots inside the step (tulip.h tl_batch_entry.snap_at, §4.1), before the forward: a
 * reserved snapshot slot for each (history appended by fill_fwd); an entry that gets none (no
 * cache, already cached, no room) takes no snapshot. */
static void snap_reserve(tl_engine *e, const tl_batch_entry *b, tl_fwd_entry *f, int n) {
    for (int i = 0; i < n; i++) {
        f[i].snap_at = 0;
        if (!b[i].snap_at || !e->pc_on) continue;
        int si = tl_pc_reserve(&e->pc, b[i].snap_salt, b[i].sess->tokens, b[i].snap_at);
        if (si >= 0) f[i].snap_at = b[i].snap_at, f[i].snap = si;
    }
}

/* After the forward: each reserved snapshot planned (its pages published) and its partial page
 * copied, or given back when the step failed (ok 0). A failed copy only costs the snapshot. */
static void snap_finish(tl_engine *e, const tl_batch_entry *b, const tl_fwd_entry *f, int n,
                        int ok) {
    for (int i = 0; i < n; i++) {
        if (!f[i].snap_at) continue;
        if (!ok) {
            tl_pc_unreserve(&e->pc, f[i].snap);
            continue;
        }
        tl_pc_io io;
        const tl_session *s = b[i].sess;
        char why[256];
        int rc = tl_pc_plan_save_at(&e->pc, b[i].snap_salt, s->tokens, f[i].snap_at, s->slot,
                                    f[i].snap, &io);
        if (rc != 1) continue;
        int st = e->be->cache_save(e->be, s->slot, &io, why, sizeof why);
        if (st) {
            tl_pc_abort(&e->pc, &io);
            fprintf(stderr, "tulip: prefix cache snapshot failed: %s\n", why);
        } else
            tl_pc_commit(&e->pc, &io);
    }
}

static void mark_lost(const tl_batch_entry *b, int n, int rc) {
    for (int i = 0; i < n; i++) b[i].sess->lost = rc;
}

int tl_engine_step(tl_engine *e, tl_batch_entry *b, int n, char *err, size_t errlen) {
    int rc = check_step(e, b, n, err, errlen); /* everything before changing anything */
    if (rc || n == 0) return rc;
    tl_fwd_entry stackf[64];
    int stackk[64];
    uint64_t stackr[64];
    tl_fwd_entry *f = n <= 64 ? stackf : calloc(n, sizeof *f);
    int *k = n <= 64 ? stackk : calloc(n, sizeof *k);
    uint64_t *rng0 = n <= 64 ? stackr : calloc(n, sizeof *rng0);
    if (!f || !k || !rng0) {
        if (f != stackf) free(f), free(k), free(rng0);
        return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
    }
    int any = 0;
    for (int i = 0; i < n; i++) {
        k[i] = spec_tokens_of(e, &b[i]);
        any |= k[i] > 0;
        rng0[i] = b[i].sess->rng;
        b[i].n_out = 0;
    }
    rc = grow_histories(b, k, n, err, errlen);
    if (!rc && any) {
        rc = spec_draft(e, b, k, n, err, errlen);
        if (rc) mark_lost(b, n, rc);
    }
    if (!rc) {
        for (int i = 0; i < n; i++) fill_fwd(e, &b[i], &f[i]);
        for (int i = 0; i < n; i++)
            if (k[i]) spec_fill(e, &b[i], k[i], &f[i]);
        snap_reserve(e, b, f, n);
        double t0 = tl_time_s();
        rc = e->be->forward(e->be, f, n, err, errlen);
        if (any) e->spec.s_forward += tl_time_s() - t0;
        snap_finish(e, b, f, n, rc == 0);
        /* a full KV pool changes no session (tulip.h): the draws of the drafts are undone (the
         * head's rows the drafts wrote are valid ones or above the slot's length); any other
         * failure leaves the state of every session in the batch undefined: they refuse steps
         * until reset */
        if (rc == TL_ERR_CONTEXT_FULL)
            for (int i = 0; i < n; i++) b[i].sess->rng = rng0[i];
        if (rc && rc != TL_ERR_CONTEXT_FULL) mark_lost(b, n, rc);
    }
    if (!rc) {
        double t0 = tl_time_s();
        rc = finish_step(e, b, f, n, err, errlen);
        if (any) e->spec.s_accept += tl_time_s() - t0;
        if (rc) mark_lost(b, n, rc);
    }
    if (f != stackf) free(f), free(k), free(rng0);
    return rc;
}
