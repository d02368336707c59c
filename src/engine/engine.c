/* Engine: opens the model, picks and owns the backend, hands out sessions (state slots), and runs
 * the batched step: validate every entry, forward through the backend, sample (on the device when
 * the backend can, else on the host from the logits). One thread owns an engine (tulip.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/status.h"
#include "common/util.h"
#include "engine/backend.h"
#include "engine/sample.h"
#include "model/weights.h"

struct tl_engine {
    tl_model *model; /* NULL with random weights */
    tl_config cfg;
    tl_backend *be;
    int max_seqs, max_ctx;
    int n_sample_vocab; /* ids >= this are padding: never sampled */
    unsigned char *slot_used;
    float *scratch; /* [max_seqs, n_vocab] logits for host sampling */
};

struct tl_session {
    tl_engine *e;
    int slot;
    int32_t *tokens; /* every token consumed */
    int n_tokens, cap;
    int n_prompt; /* tokens before the first sample; -1 until then */
    uint64_t rng;
};

int tl_engine_open(tl_engine **out, const tl_engine_params *p, char *err, size_t errlen) {
    *out = NULL;
    tl_engine *e = xcalloc(1, sizeof *e);
    int rc;
    double t0 = tl_time_s(), t1 = t0;
    if (!p->random_weights) {
        if (!p->model_path) {
            free(e);
            return tl_errf(err, errlen, TL_ERR_INVALID, "no model path given");
        }
        rc = tl_model_open(&e->model, p->model_path, err, errlen);
        if (rc) {
            free(e);
            return rc;
        }
        e->cfg = e->model->cfg;
        if (!p->allow_test_shape && (rc = tl_config_check_production(&e->cfg, err, errlen))) {
            tl_engine_close(e);
            return rc;
        }
        t1 = tl_time_s();
    } else {
        tl_config_set_production(&e->cfg); /* built on the device from a seed */
    }
    e->max_seqs = p->max_seqs > 0 ? p->max_seqs : 16;
    e->max_ctx = p->max_ctx > 0 ? p->max_ctx : TL_MIN(e->cfg.max_pos, 32768);
    if (e->max_ctx > e->cfg.max_pos) e->max_ctx = e->cfg.max_pos;
    e->n_sample_vocab = e->cfg.n_vocab == TL_N_VOCAB ? TL_N_VOCAB_TOKENS : e->cfg.n_vocab;

    tl_backend_kind want = p->backend;
    rc = TL_ERR_UNSUPPORTED;
#ifndef TL_NO_CUDA
    if (want == TL_BACKEND_CUDA || want == TL_BACKEND_AUTO) {
        tl_cuda_params cp = {.max_seqs = e->max_seqs,
                             .max_ctx = e->max_ctx,
                             .kv_tokens = p->kv_tokens,
                             .random_weights = p->random_weights,
                             .seed = p->seed,
                             .weight_bits = p->weight_bits ? p->weight_bits : 16};
        char cerr[512] = "";
        rc = tl_backend_cuda_open(&e->be, e->model, &e->cfg, &cp, cerr, sizeof cerr);
        if (rc && want == TL_BACKEND_CUDA) {
            tl_errf(err, errlen, rc, "%s", cerr);
            tl_engine_close(e);
            return rc;
        }
    }
#else
    if (want == TL_BACKEND_CUDA) {
        tl_engine_close(e);
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "this build has no CUDA backend (make cuda)");
    }
#endif
    if (rc) {
        if (!e->model) {
            tl_engine_close(e);
            return tl_errf(err, errlen, TL_ERR_UNSUPPORTED, "random weights need the CUDA backend");
        }
        rc = tl_backend_cpu_open(&e->be, e->model, e->max_seqs, e->max_ctx, p->n_threads, err,
                                 errlen);
        if (rc) {
            tl_engine_close(e);
            return rc;
        }
    }
    if (e->model) /* the load time of a checkpoint, always reported (one line on stderr) */
        fprintf(stderr,
                "tulip: loaded %s in %.1f s (read and checked %.1f s, %s backend setup %.1f s)\n",
                p->model_path, tl_time_s() - t0, t1 - t0, e->be->name, tl_time_s() - t1);
    e->slot_used = xcalloc(e->max_seqs, 1);
    if (!e->be->can_sample) {
        e->scratch = calloc((size_t)e->max_seqs * e->cfg.n_vocab, sizeof(float));
        if (!e->scratch) {
            tl_engine_close(e);
            return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory for logits");
        }
    }
    *out = e;
    return TL_OK;
}

void tl_engine_close(tl_engine *e) {
    if (!e) return;
    if (e->be) e->be->close(e->be);
    if (e->model) tl_model_close(e->model);
    free(e->slot_used);
    free(e->scratch);
    free(e);
}

const struct tl_config *tl_engine_config(const tl_engine *e) { return &e->cfg; }
tl_backend_kind tl_engine_backend(const tl_engine *e) {
    return strcmp(e->be->name, "cpu") ? TL_BACKEND_CUDA : TL_BACKEND_CPU;
}
int tl_engine_max_ctx(const tl_engine *e) { return e->max_ctx; }
int tl_engine_max_seqs(const tl_engine *e) { return e->max_seqs; }

int tl_session_open(tl_engine *e, tl_session **out, char *err, size_t errlen) {
    *out = NULL;
    for (int i = 0; i < e->max_seqs; i++) {
        if (e->slot_used[i]) continue;
        tl_session *s = calloc(1, sizeof *s);
        if (!s) return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
        s->e = e;
        s->slot = i;
        s->n_prompt = -1;
        e->slot_used[i] = 1; /* clean: backends start zeroed, and close resets */
        *out = s;
        return TL_OK;
    }
    return tl_errf(err, errlen, TL_ERR_BUSY, "all %d sequence slots are in use", e->max_seqs);
}

void tl_session_close(tl_session *s) {
    if (!s) return;
    /* the slot is left clean for the next session: state zeroed, KV pages back in the pool */
    s->e->be->reset_slot(s->e->be, s->slot);
    s->e->slot_used[s->slot] = 0;
    free(s->tokens);
    free(s);
}

int tl_session_n_past(const tl_session *s) { return s->n_tokens; }

void tl_session_reset(tl_session *s) {
    s->n_tokens = 0;
    s->n_prompt = -1;
    s->e->be->reset_slot(s->e->be, s->slot);
}

int tl_engine_step(tl_engine *e, tl_batch_entry *b, int n, char *err, size_t errlen) {
    if (n <= 0) return TL_OK;
    tl_fwd_entry stackf[64];
    tl_fwd_entry *f = n <= 64 ? stackf : calloc(n, sizeof *f);
    if (!f) return tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
    int rc = TL_OK;
    /* validate everything before changing anything */
    for (int i = 0; i < n && !rc; i++) {
        tl_session *s = b[i].sess;
        if (!s || s->e != e || b[i].n_tok <= 0 || !b[i].tokens)
            rc = tl_errf(err, errlen, TL_ERR_INVALID, "batch entry %d: no session or no tokens", i);
        else if (s->n_tokens + b[i].n_tok > e->max_ctx)
            rc = tl_errf(err, errlen, TL_ERR_CONTEXT_FULL,
                         "sequence of %d tokens + %d exceeds the context of %d", s->n_tokens,
                         b[i].n_tok, e->max_ctx);
        else if (b[i].sample && !b[i].out)
            rc = tl_errf(err, errlen, TL_ERR_INVALID, "batch entry %d: sample without out", i);
        for (int j = 0; j < i && !rc; j++)
            if (b[j].sess == s)
                rc = tl_errf(err, errlen, TL_ERR_INVALID, "session twice in one step");
        for (int t = 0; t < b[i].n_tok && !rc; t++)
            if (b[i].tokens[t] < 0 || b[i].tokens[t] >= e->cfg.n_vocab)
                rc = tl_errf(err, errlen, TL_ERR_INVALID, "token id %d out of range [0, %d)",
                             b[i].tokens[t], e->cfg.n_vocab);
    }
    for (int i = 0; i < n && !rc; i++) {
        tl_session *s = b[i].sess;
        if (s->n_tokens + b[i].n_tok > s->cap) {
            int cap = TL_MAX(s->cap * 2, s->n_tokens + b[i].n_tok + 64);
            int32_t *nt = realloc(s->tokens, sizeof(int32_t) * cap);
            if (!nt) {
                rc = tl_errf(err, errlen, TL_ERR_NOMEM, "out of memory");
                break;
            }
            s->tokens = nt;
            s->cap = cap;
        }
    }
    if (rc) goto done;
    for (int i = 0; i < n; i++) {
        tl_session *s = b[i].sess;
        tl_fwd_entry *x = &f[i];
        memset(x, 0, sizeof *x);
        x->slot = s->slot;
        x->pos = s->n_tokens;
        x->tokens = b[i].tokens;
        x->n_tok = b[i].n_tok;
        memcpy(s->tokens + s->n_tokens, b[i].tokens, sizeof(int32_t) * b[i].n_tok);
        if (b[i].sample && s->n_prompt < 0) {
            s->n_prompt = s->n_tokens + b[i].n_tok;
            s->rng = tl_rng_seed(b[i].sample->seed);
        }
        x->history = s->tokens;
        x->n_history = s->n_tokens + b[i].n_tok;
        x->n_prompt = s->n_prompt;
        x->rng = &s->rng;
        x->out = b[i].out;
        if (e->be->can_sample) {
            x->sample = b[i].sample;
            x->logits = b[i].logits;
        } else {
            x->logits = b[i].logits   ? b[i].logits
                        : b[i].sample ? e->scratch + (size_t)s->slot * e->cfg.n_vocab
                                      : NULL;
        }
    }
    rc = e->be->forward(e->be, f, n, err, errlen);
    if (rc)
        goto done; /* the backend's state is undefined now: callers reset or drop the sessions */
    for (int i = 0; i < n; i++) {
        tl_session *s = b[i].sess;
        s->n_tokens += b[i].n_tok;
        if (b[i].sample && !e->be->can_sample) {
            rc = tl_sample_host(f[i].logits, e->n_sample_vocab, b[i].sample, &s->rng, s->tokens,
                                s->n_tokens, s->n_prompt, b[i].out);
            if (rc) {
                tl_errf(err, errlen, rc, "sampling: %s", tl_status_str(rc));
                goto done;
            }
        }
    }
done:
    if (f != stackf) free(f);
    return rc;
}
