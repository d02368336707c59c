/* The engine thread (src/server/sched.c) on the tiny model with the CPU backend: batched greedy
 * decoding equals one-at-a-time decoding, cancellation frees the session within a step, the
 * bounded queue answers TL_ERR_BUSY, max_tokens / context limits end with LENGTH (a sequence
 * never holds more than the context), scripted and forced tokens, injected failures (a step, a
 * slot reset), and shutdown cancels what is still running. With a small KV pool (the CPU
 * backend's kv_tokens): admission waits for free pages, running sequences are preempted and
 * recomputed without a trace in their output (greedy and seeded sampling with a penalty equal
 * each sequence run alone), a prompt larger than the pool is refused at submit, and the same
 * holds when the backend does not report its pool (CONTEXT_FULL from the step). */
#include <math.h>
#include <unistd.h>
#include "common/util.h"
#include "engine/backend.h"
#include "server/metrics.h"
#include "server/sched.h"
#include "t_check.h"

#define MODEL "tests/data/tiny-a"
#define EOS   287 /* first eos id of tiny-a's config (<|endoftext|>) */

static tl_engine *open_engine_kv(int max_seqs, int max_ctx, long kv_tokens) {
    tl_engine_params ep = {.model_path = MODEL,
                           .backend = TL_BACKEND_CPU,
                           .allow_test_shape = 1,
                           .n_threads = 1,
                           .max_seqs = max_seqs,
                           .max_ctx = max_ctx,
                           .kv_tokens = kv_tokens};
    char err[512];
    tl_engine *e = NULL;
    if (tl_engine_open(&e, &ep, err, sizeof err)) {
        fprintf(stderr, "tl_engine_open: %s\n", err);
        return NULL;
    }
    return e;
}

static tl_engine *open_engine(int max_seqs, int max_ctx) {
    return open_engine_kv(max_seqs, max_ctx, 0);
}

static tl_job *make_job(int seed, int n_prompt, int max_tokens) {
    tl_job *j = tl_job_new();
    j->prompt = xmalloc(sizeof(int32_t) * (size_t)n_prompt);
    for (int i = 0; i < n_prompt; i++) j->prompt[i] = (int32_t)((seed * 37 + i * 11) % 250 + 3);
    j->n_prompt = n_prompt;
    j->sample = (tl_sample_params){.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    j->max_tokens = max_tokens;
    j->ignore_eos = 1;
    return j;
}

/* Reads a job to its end; returns the finish reason, tokens into out (up to max). */
static int collect(tl_job *j, int32_t *out, int max, int *n_out) {
    tl_sample_out ev[16];
    int n = 0;
    for (;;) {
        int fin, k = tl_job_take(j, ev, 16, &fin);
        for (int i = 0; i < k; i++)
            if (n < max) out[n++] = ev[i].token;
        if (fin) {
            *n_out = n;
            return fin;
        }
        if (!k && tl_job_wait(j, -1, 5000) == 0) {
            *n_out = n;
            return -1; /* stuck */
        }
    }
}

static void wait_sessions(tl_sched *s, int want) {
    int sess = -1;
    for (int i = 0; i < 500; i++) {
        tl_sched_stats(s, NULL, NULL, &sess, NULL);
        if (sess == want) return;
        usleep(2000);
    }
    CHECK_EQ_INT(sess, want);
}

static void test_batched_equals_sequential(void) {
    tl_engine *e = open_engine(4, 256);
    CHECK(e != NULL);
    if (!e) return;
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 8, .step_tokens = 16}; /* small budget: chunked prefill */
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, NULL, err, sizeof err), 0);
    int32_t alone[4][12], batched[4][12];
    int n;
    for (int k = 0; k < 4; k++) {
        tl_job *j = make_job(k, 20 + 9 * k, 12);
        CHECK_EQ_INT(tl_sched_submit(s, j, err, sizeof err), 0);
        CHECK_EQ_INT(collect(j, alone[k], 12, &n), TL_FIN_LENGTH);
        CHECK_EQ_INT(n, 12);
        tl_job_unref(j);
    }
    tl_job *js[4];
    for (int k = 0; k < 4; k++) {
        js[k] = make_job(k, 20 + 9 * k, 12);
        CHECK_EQ_INT(tl_sched_submit(s, js[k], err, sizeof err), 0);
    }
    for (int k = 0; k < 4; k++) {
        CHECK_EQ_INT(collect(js[k], batched[k], 12, &n), TL_FIN_LENGTH);
        CHECK_EQ_INT(n, 12);
        CHECK(!memcmp(alone[k], batched[k], sizeof alone[k]));
        tl_job_unref(js[k]);
    }
    wait_sessions(s, 0);
    tl_sched_free(s);
    tl_engine_close(e);
}

static void test_cancel_and_queue_full(void) {
    tl_engine *e = open_engine(2, 4096);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_metrics *m = tl_metrics_new();
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 1, .step_tokens = 64};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, m, err, sizeof err), 0);
    tl_job *run[2], *queued, *extra;
    for (int k = 0; k < 2; k++) {
        run[k] = make_job(k, 8, 4000);
        CHECK_EQ_INT(tl_sched_submit(s, run[k], err, sizeof err), 0);
    }
    CHECK_EQ_INT(tl_job_wait(run[0], -1, 5000), 1);
    CHECK_EQ_INT(tl_job_wait(run[1], -1, 5000), 1);
    wait_sessions(s, 2);
    queued = make_job(5, 8, 4000);
    CHECK_EQ_INT(tl_sched_submit(s, queued, err, sizeof err), 0);
    extra = make_job(6, 8, 4);
    CHECK_EQ_INT(tl_sched_submit(s, extra, err, sizeof err), TL_ERR_BUSY);
    tl_job_unref(extra);

    /* cancel a queued job: it never gets a session */
    tl_job_cancel(queued);
    int32_t toks[8];
    int n;
    CHECK_EQ_INT(collect(queued, toks, 8, &n), TL_FIN_CANCELLED);
    CHECK_EQ_INT(n, 0);
    /* cancel a running one: session freed */
    tl_job_cancel(run[0]);
    int32_t *buf = xmalloc(sizeof(int32_t) * 4000);
    CHECK_EQ_INT(collect(run[0], buf, 4000, &n), TL_FIN_CANCELLED);
    CHECK(n < 4000);
    wait_sessions(s, 1);
    free(buf);
    tl_job_unref(queued);
    tl_job_unref(run[0]);

    /* shutdown cancels the one still running */
    tl_sched_shutdown(s, 0);
    tl_sample_out tmp[64];
    int fin = 0;
    while (tl_job_take(run[1], tmp, 64, &fin) > 0) {
    }
    CHECK_EQ_INT(fin, TL_FIN_CANCELLED);
    extra = make_job(7, 8, 4);
    CHECK_EQ_INT(tl_sched_submit(s, extra, err, sizeof err), TL_ERR_CANCELLED);
    tl_job_unref(extra);
    tl_job_unref(run[1]);
    tl_sched_free(s);
    char *txt = tl_metrics_render(m, &(tl_metrics_gauges){0});
    CHECK(strstr(txt, "tulip_sequences_finished_total{reason=\"cancelled\"} 3\n"));
    free(txt);
    tl_metrics_free(m);
    tl_engine_close(e);
}

static void test_limits_script_force_fail(void) {
    tl_engine *e = open_engine(4, 64);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 8, .step_tokens = 32};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, NULL, err, sizeof err), 0);
    int32_t toks[128];
    int n;

    /* context full: 60 prompt tokens in a 64-token context: 4 generated tokens, the last one
     * the 64th of the sequence */
    tl_job *j = make_job(1, 60, 0);
    CHECK_EQ_INT(tl_sched_submit(s, j, err, sizeof err), 0);
    CHECK_EQ_INT(collect(j, toks, 128, &n), TL_FIN_LENGTH);
    CHECK_EQ_INT(n, 64 - 60);
    tl_job_unref(j);

    /* script: emitted verbatim, then EOS, finish STOP (even with ignore_eos) */
    j = make_job(2, 5, 50);
    j->script = xmalloc(3 * sizeof(int32_t));
    j->script[0] = 100, j->script[1] = 101, j->script[2] = 312;
    j->n_script = 3;
    CHECK_EQ_INT(tl_sched_submit(s, j, err, sizeof err), 0);
    CHECK_EQ_INT(collect(j, toks, 128, &n), TL_FIN_STOP);
    CHECK_EQ_INT(n, 4);
    CHECK_EQ_INT(toks[0], 100);
    CHECK_EQ_INT(toks[2], 312);
    CHECK_EQ_INT(toks[3], EOS);
    tl_job_unref(j);

    /* forced tokens right after the think-end token */
    j = make_job(3, 5, 10);
    j->script = NULL;
    j->force = xmalloc(2 * sizeof(int32_t));
    j->force[0] = 50, j->force[1] = 51;
    j->n_force = 2;
    j->in_think = 0; /* not thinking: forced from the first token */
    CHECK_EQ_INT(tl_sched_submit(s, j, err, sizeof err), 0);
    CHECK_EQ_INT(collect(j, toks, 128, &n), TL_FIN_LENGTH);
    CHECK_EQ_INT(n, 10);
    CHECK_EQ_INT(toks[0], 50);
    CHECK_EQ_INT(toks[1], 51);
    tl_job_unref(j);

    /* injected failure */
    j = make_job(4, 5, 20);
    j->fail_after = 3;
    CHECK_EQ_INT(tl_sched_submit(s, j, err, sizeof err), 0);
    CHECK_EQ_INT(collect(j, toks, 128, &n), TL_FIN_ERROR);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(j->err_status, TL_ERR_INTERNAL);
    tl_job_unref(j);

    wait_sessions(s, 0);
    tl_sched_free(s);
    tl_engine_close(e);
}

/* Reference tokens: n tokens sampled with sp after the prompt, one sequence through
 * tl_engine_step on its own engine (no scheduler, no KV pool, a context with room to spare). */
static void sampled_alone(const int32_t *prompt, int n_prompt, const tl_sample_params *sp,
                          int32_t *out, int n) {
    tl_engine *e = open_engine(1, 256);
    tl_session *ss = NULL;
    char err[256];
    CHECK(e && tl_session_open(e, &ss, err, sizeof err) == 0);
    if (!ss) {
        tl_engine_close(e);
        return;
    }
    tl_sample_out o;
    tl_batch_entry b = {.sess = ss, .tokens = prompt, .n_tok = n_prompt, .sample = sp, .out = &o};
    for (int i = 0; i < n; i++) {
        CHECK_EQ_INT(tl_engine_step(e, &b, 1, err, sizeof err), 0);
        out[i] = o.token;
        b.tokens = &out[i];
        b.n_tok = 1;
    }
    tl_session_close(ss);
    tl_engine_close(e);
}

static void greedy_alone(const int32_t *prompt, int n_prompt, int32_t *out, int n) {
    tl_sample_params sp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    sampled_alone(prompt, n_prompt, &sp, out, n);
}

/* Generation never exceeds the context: a sequence (prompt + emitted tokens) ends with LENGTH
 * holding exactly max_ctx tokens, whatever the prompt length, batched with others and with
 * chunked prefill; the tokens are the ones an unbatched greedy run through the engine gives. A
 * prompt that leaves no room for one token is refused at submit (TL_ERR_CONTEXT_FULL). */
static void test_context_limit(void) {
    enum { CTX = 48 };
    tl_engine *e = open_engine(4, CTX);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 8, .step_tokens = 16};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, NULL, err, sizeof err), 0);
    static const int prompts[] = {CTX - 1, CTX - 2, 30, 5, CTX, CTX + 3, 17};
    enum { NJ = sizeof prompts / sizeof prompts[0] };
    tl_job *js[NJ];
    for (int k = 0; k < NJ; k++) {
        js[k] = make_job(k + 20, prompts[k], k == 6 ? CTX - 17 : 0);
        err[0] = 0;
        CHECK_EQ_INT(tl_sched_submit(s, js[k], err, sizeof err),
                     prompts[k] >= CTX ? TL_ERR_CONTEXT_FULL : 0);
        if (prompts[k] >= CTX) CHECK(strstr(err, "no room for a token") != NULL);
    }
    int32_t toks[2 * CTX];
    for (int k = 0; k < NJ; k++) {
        int n = -1, fin = prompts[k] >= CTX ? 0 : collect(js[k], toks, 2 * CTX, &n);
        if (prompts[k] >= CTX) {
            CHECK_EQ_INT(js[k]->finished, TL_FIN_NONE); /* never queued */
        } else {
            CHECK_EQ_INT(fin, TL_FIN_LENGTH);
            CHECK_EQ_INT(prompts[k] + n, CTX);
            int32_t want[CTX];
            greedy_alone(js[k]->prompt, prompts[k], want, n);
            CHECK(n > 0 && !memcmp(toks, want, sizeof(int32_t) * (size_t)n));
        }
        tl_job_unref(js[k]);
    }
    wait_sessions(s, 0);
    tl_sched_free(s);
    tl_engine_close(e);
}

/* A job with sampling parameters the engine refuses ends with an error of its own; the job
 * batched with it runs on as if alone. */
static void test_bad_params_fail_one_job(void) {
    tl_engine *e = open_engine(2, 64);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 4, .step_tokens = 32};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, NULL, err, sizeof err), 0);
    tl_job *good = make_job(3, 12, 10), *bad = make_job(4, 12, 10);
    bad->sample.top_p = 0;
    CHECK_EQ_INT(tl_sched_submit(s, good, err, sizeof err), 0);
    CHECK_EQ_INT(tl_sched_submit(s, bad, err, sizeof err), 0);
    int32_t toks[16], want[10];
    int n;
    CHECK_EQ_INT(collect(bad, toks, 16, &n), TL_FIN_ERROR);
    CHECK_EQ_INT(bad->err_status, TL_ERR_INVALID);
    CHECK(n == 0 && strstr(bad->err, "top_p") != NULL);
    CHECK_EQ_INT(collect(good, toks, 16, &n), TL_FIN_LENGTH);
    greedy_alone(good->prompt, 12, want, 10);
    CHECK(n == 10 && !memcmp(toks, want, sizeof want));
    tl_job_unref(good);
    tl_job_unref(bad);
    wait_sessions(s, 0);
    tl_sched_free(s);
    tl_engine_close(e);
}

/* Slot resets that fail (injected around the real CPU backend's reset): a transient failure
 * costs the next job its session (an error for that job only) and the slot comes back once a
 * reset succeeds; a lost device makes the server stop taking work. */
static int (*real_reset)(tl_backend *, int);
static int reset_fail;

static int faulty_reset(tl_backend *b, int slot) {
    return reset_fail ? reset_fail : real_reset(b, slot);
}

static void test_failed_slot_reset(void) {
    tl_engine *e = open_engine(1, 64);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_backend *be = tl_engine_backend_impl(e);
    real_reset = be->reset_slot;
    be->reset_slot = faulty_reset;
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 4, .step_tokens = 32};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, NULL, err, sizeof err), 0);
    int32_t ref[6], toks[8];
    int n;
    tl_job *j = make_job(1, 9, 6);
    CHECK_EQ_INT(tl_sched_submit(s, j, err, sizeof err), 0);
    CHECK_EQ_INT(collect(j, ref, 6, &n), TL_FIN_LENGTH);
    tl_job_unref(j);
    for (int round = 0; round < 2; round++) {
        reset_fail = round == 0 ? TL_ERR_CUDA : TL_ERR_DEVICE_LOST;
        j = make_job(1, 9, 6); /* its slot is not reset when it ends */
        CHECK_EQ_INT(tl_sched_submit(s, j, err, sizeof err), 0);
        CHECK_EQ_INT(collect(j, toks, 8, &n), TL_FIN_LENGTH);
        CHECK(n == 6 && !memcmp(toks, ref, sizeof ref));
        tl_job_unref(j);
        j = make_job(1, 9, 6); /* no clean slot for it */
        CHECK_EQ_INT(tl_sched_submit(s, j, err, sizeof err), 0);
        CHECK_EQ_INT(collect(j, toks, 8, &n), TL_FIN_ERROR);
        CHECK_EQ_INT(n, 0);
        CHECK_EQ_INT(j->err_status, reset_fail);
        tl_job_unref(j);
        CHECK_EQ_INT(tl_sched_lost(s), round == 1);
        if (round == 1) break;
        reset_fail = 0; /* recovered: the slot is reset at the next open, and clean */
        j = make_job(1, 9, 6);
        CHECK_EQ_INT(tl_sched_submit(s, j, err, sizeof err), 0);
        CHECK_EQ_INT(collect(j, toks, 8, &n), TL_FIN_LENGTH);
        CHECK(n == 6 && !memcmp(toks, ref, sizeof ref));
        tl_job_unref(j);
    }
    j = make_job(1, 9, 6);
    CHECK_EQ_INT(tl_sched_submit(s, j, err, sizeof err), TL_ERR_DEVICE_LOST);
    tl_job_unref(j);
    reset_fail = 0;
    tl_sched_free(s);
    tl_engine_close(e);
}

/* A sequence whose logits turn NaN (a poisoned model or input; here the real CPU forward's
 * logits are poisoned for the entry that holds token 300): its sample is token -1 (tulip.h), the
 * job ends with an error naming non-finite logits, the job beside it in the same steps gives the
 * tokens it gives alone, and the slot is clean again for the next job (issue 11, 2e). */
static int (*real_fwd)(tl_backend *, const tl_fwd_entry *, int, char *, size_t);

static int poisoning_fwd(tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    int st = real_fwd(b, e, n, err, errlen);
    for (int i = 0; i < n && !st; i++)
        for (int t = 0; t < e[i].n_tok; t++)
            if (e[i].tokens[t] == 300 && e[i].logits) e[i].logits[7] = NAN;
    return st;
}

static void test_poisoned_sequence(void) {
    tl_engine *e = open_engine(2, 64);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_backend *be = tl_engine_backend_impl(e);
    real_fwd = be->forward;
    be->forward = poisoning_fwd;
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 4, .step_tokens = 32};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, NULL, err, sizeof err), 0);
    tl_job *good = make_job(3, 12, 10), *bad = make_job(4, 12, 10);
    bad->prompt[5] = 300;
    CHECK_EQ_INT(tl_sched_submit(s, good, err, sizeof err), 0);
    CHECK_EQ_INT(tl_sched_submit(s, bad, err, sizeof err), 0);
    int32_t toks[16], want[10];
    int n;
    CHECK_EQ_INT(collect(bad, toks, 16, &n), TL_FIN_ERROR);
    CHECK(n == 0 && strstr(bad->err, "non-finite") != NULL);
    CHECK_EQ_INT(collect(good, toks, 16, &n), TL_FIN_LENGTH);
    greedy_alone(good->prompt, 12, want, 10);
    CHECK(n == 10 && !memcmp(toks, want, sizeof want));
    tl_job_unref(good);
    tl_job_unref(bad);
    tl_job *again = make_job(3, 12, 10); /* the failed job's slot was reset at close */
    CHECK_EQ_INT(tl_sched_submit(s, again, err, sizeof err), 0);
    CHECK_EQ_INT(collect(again, toks, 16, &n), TL_FIN_LENGTH);
    CHECK(n == 10 && !memcmp(toks, want, sizeof want));
    tl_job_unref(again);
    wait_sessions(s, 0);
    tl_sched_free(s);
    tl_engine_close(e);
}

/* ---- A small KV pool (pages of TL_CPU_KV_PAGE = 64 tokens). ---- */

static long preemptions_in(tl_metrics *m) {
    char *txt = tl_metrics_render(m, &(tl_metrics_gauges){0});
    const char *p = txt ? strstr(txt, "\ntulip_num_preemptions_total ") : NULL;
    long v = p ? atol(p + strlen("\ntulip_num_preemptions_total ")) : -1;
    free(txt);
    return v;
}

/* Submits NJ jobs to sched s at once and checks every one against the same sequence run alone:
 * each ends with LENGTH at its own max_tokens with exactly the reference tokens. The odd jobs
 * sample (temperature 1, top-k, presence penalty, a seed): a preemption must keep their RNG
 * stream and penalty window. Returns the preemptions summed over the jobs. */
static int run_mix(tl_sched *s, int nj, int max_tokens) {
    tl_job *js[16];
    char err[256];
    for (int k = 0; k < nj; k++) {
        js[k] = make_job(k + 40, 20 + 7 * k, max_tokens);
        if (k % 2)
            js[k]->sample = (tl_sample_params){.temperature = 1,
                                               .top_k = 20,
                                               .top_p = 0.95f,
                                               .presence_penalty = 1.5f,
                                               .repetition_penalty = 1,
                                               .seed = 1000 + k};
        CHECK_EQ_INT(tl_sched_submit(s, js[k], err, sizeof err), 0);
    }
    int n_preempt = 0;
    for (int k = 0; k < nj; k++) {
        int32_t toks[128], want[128];
        int n = -1;
        CHECK_EQ_INT(collect(js[k], toks, 128, &n), TL_FIN_LENGTH);
        CHECK_EQ_INT(n, max_tokens);
        sampled_alone(js[k]->prompt, js[k]->n_prompt, &js[k]->sample, want, max_tokens);
        CHECK(n == max_tokens && !memcmp(toks, want, sizeof(int32_t) * (size_t)n));
        n_preempt += js[k]->n_preempt;
        tl_job_unref(js[k]);
    }
    return n_preempt;
}

/* Eight sequences growing to 90..139 tokens (2 or 3 pages each) in 4 slots over a pool of 6
 * pages: the pool runs short as they decode, the newest yield and are recomputed; every one
 * completes with its own max_tokens, tokens as alone, and the preemptions are counted. */
static void test_pool_preemption(void) {
    tl_engine *e = open_engine_kv(4, 256, 6 * 64);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_kv_stats k;
    CHECK_EQ_INT(tl_engine_kv_stats(e, &k), 0);
    CHECK(k.page_tokens == 64 && k.pages_total == 6 && k.pages_free == 6 && k.pages_per_seq == 4);
    CHECK_EQ_INT(tl_kv_pages_to_grow(&k, 0, 65), 2);
    CHECK_EQ_INT(tl_kv_pages_to_grow(&k, 64, 65), 1);
    CHECK_EQ_INT(tl_kv_pages_to_grow(&k, 65, 128), 0);
    tl_metrics *m = tl_metrics_new();
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 16, .step_tokens = 32};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, m, err, sizeof err), 0);
    int n_preempt = run_mix(s, 8, 70);
    CHECK(n_preempt > 0);
    CHECK_EQ_INT(preemptions_in(m), n_preempt);
    wait_sessions(s, 0);
    tl_sched_kv_stats(s, &k);
    CHECK_EQ_INT(k.pages_free, 6); /* every page back */
    char *txt = tl_metrics_render(m, &(tl_metrics_gauges){0});
    CHECK(strstr(txt, "tulip_sequences_finished_total{reason=\"length\"} 8\n"));
    free(txt);
    tl_sched_free(s);
    tl_metrics_free(m);
    tl_engine_close(e);
}

/* Admission waits for pages: three jobs whose prompt and first token need 2 of the 3 pages run
 * one after another although 4 slots are free (each starts after the previous one's last token)
 * and none is ever preempted. */
static void test_pool_admission_waits(void) {
    tl_engine *e = open_engine_kv(4, 256, 3 * 64);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 8, .step_tokens = 32};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, NULL, err, sizeof err), 0);
    tl_job *js[3];
    for (int k = 0; k < 3; k++) {
        js[k] = make_job(k + 60, 70, 50); /* 120 tokens at the end: 2 pages */
        CHECK_EQ_INT(tl_sched_submit(s, js[k], err, sizeof err), 0);
    }
    for (int k = 0; k < 3; k++) {
        int32_t toks[64], want[50];
        int n = -1;
        CHECK_EQ_INT(collect(js[k], toks, 64, &n), TL_FIN_LENGTH);
        greedy_alone(js[k]->prompt, 70, want, 50);
        CHECK(n == 50 && !memcmp(toks, want, sizeof want));
        CHECK_EQ_INT(js[k]->n_preempt, 0);
        if (k > 0) CHECK(js[k]->t_admit >= js[k - 1]->t_last);
    }
    for (int k = 0; k < 3; k++) tl_job_unref(js[k]);
    wait_sessions(s, 0);
    tl_sched_free(s);
    tl_engine_close(e);
}

/* A pool of 2 pages (128 tokens) under a context of 256: one sequence holds at most 128 tokens.
 * A prompt of 128 can never run (it and one token need 3 pages): refused at submit naming the
 * pool. A prompt of 100 ends with LENGTH at 128 tokens, as alone. */
static void test_pool_too_small_for_prompt(void) {
    tl_engine *e = open_engine_kv(2, 256, 128);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_sched *s;
    char err[256] = "";
    tl_sched_params sp = {.max_queue = 4, .step_tokens = 64};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(tl_sched_seq_tokens(s), 128);
    tl_job *big = make_job(1, 128, 4), *ok = make_job(2, 100, 0);
    CHECK_EQ_INT(tl_sched_submit(s, big, err, sizeof err), TL_ERR_CONTEXT_FULL);
    CHECK(strstr(err, "KV cache pages") != NULL);
    tl_job_unref(big);
    CHECK_EQ_INT(tl_sched_submit(s, ok, err, sizeof err), 0);
    int32_t toks[64], want[28];
    int n = -1;
    CHECK_EQ_INT(collect(ok, toks, 64, &n), TL_FIN_LENGTH);
    greedy_alone(ok->prompt, 100, want, 28);
    CHECK(n == 28 && !memcmp(toks, want, sizeof want));
    tl_job_unref(ok);
    wait_sessions(s, 0);
    tl_sched_free(s);
    tl_engine_close(e);
}

/* A finished stream frees its slot for the busy check at once, not at the step's sweep: with
 * TL_TEST_SWEEP_DELAY_MS holding each step 1 s between delivery and sweep, two streams that
 * have ended still count as running in the published stats, yet the next two requests are taken
 * (one queued past max_queue: slots are free for it) and only the fifth gets 429. Before, the
 * check used the published count and the second was refused: a wave of streams ending together
 * sent their clients' next requests into that window (BENCHMARKS.md 2026-12-06, 256 clients). */
static void test_busy_counts_finished(void) {
    tl_engine *e = open_engine(2, 4096);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 1, .step_tokens = 64};
    setenv("TL_TEST_SWEEP_DELAY_MS", "1000", 1);
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, NULL, err, sizeof err), 0);
    unsetenv("TL_TEST_SWEEP_DELAY_MS");
    tl_job *a = make_job(1, 8, 2), *b = make_job(2, 8, 2);
    CHECK_EQ_INT(tl_sched_submit(s, a, err, sizeof err), 0);
    CHECK_EQ_INT(tl_sched_submit(s, b, err, sizeof err), 0);
    int32_t toks[8];
    int n, running = -1;
    CHECK_EQ_INT(collect(a, toks, 8, &n), TL_FIN_LENGTH);
    CHECK_EQ_INT(collect(b, toks, 8, &n), TL_FIN_LENGTH);
    tl_sched_stats(s, NULL, &running, NULL, NULL);
    CHECK(running >= 1); /* inside the window: the last step has not swept b yet */
    tl_job *c = make_job(3, 8, 2), *d = make_job(4, 8, 2), *x = make_job(5, 8, 2);
    CHECK_EQ_INT(tl_sched_submit(s, c, err, sizeof err), 0);
    CHECK_EQ_INT(tl_sched_submit(s, d, err, sizeof err), 0);
    CHECK_EQ_INT(tl_sched_submit(s, x, err, sizeof err), TL_ERR_BUSY);
    CHECK_EQ_INT(collect(c, toks, 8, &n), TL_FIN_LENGTH);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(collect(d, toks, 8, &n), TL_FIN_LENGTH);
    CHECK_EQ_INT(n, 2);
    tl_job_unref(a), tl_job_unref(b), tl_job_unref(c), tl_job_unref(d), tl_job_unref(x);
    tl_sched_free(s);
    tl_engine_close(e);
}

/* The queue is full while a job waits for pages, not slots: 429 (TL_ERR_BUSY) for the next. */
static void test_pool_queue_full(void) {
    tl_engine *e = open_engine_kv(2, 4096, 4096);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 1, .step_tokens = 2048};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, NULL, err, sizeof err), 0);
    tl_job *a = make_job(1, 4000, 96), *b = make_job(2, 200, 4), *c = make_job(3, 8, 4);
    CHECK_EQ_INT(tl_sched_submit(s, a, err, sizeof err), 0);
    CHECK_EQ_INT(tl_job_wait(a, -1, 20000), 1);              /* a holds 63 of the 64 pages */
    CHECK_EQ_INT(tl_sched_submit(s, b, err, sizeof err), 0); /* needs 4: waits */
    CHECK_EQ_INT(tl_sched_submit(s, c, err, sizeof err), TL_ERR_BUSY);
    int32_t toks[128];
    int n;
    CHECK_EQ_INT(collect(a, toks, 128, &n), TL_FIN_LENGTH);
    CHECK_EQ_INT(n, 96);
    CHECK_EQ_INT(collect(b, toks, 128, &n), TL_FIN_LENGTH);
    CHECK_EQ_INT(n, 4);
    CHECK(b->t_admit >= a->t_last);
    tl_job_unref(a);
    tl_job_unref(b);
    tl_job_unref(c);
    wait_sessions(s, 0);
    tl_sched_free(s);
    tl_engine_close(e);
}

/* A backend that does not report its pool (kv_stats NULL: the engine then reports one page of
 * max_ctx per slot), over the CPU backend's real pool of 4 pages: admission is optimistic and
 * steps fail with CONTEXT_FULL; the scheduler preempts the newest and holds admission, and every
 * sequence still completes as alone. */
static void test_pool_unreported(void) {
    tl_engine *e = open_engine_kv(4, 128, 4 * 64);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_engine_backend_impl(e)->kv_stats = NULL;
    tl_kv_stats k;
    tl_engine_kv_stats(e, &k);
    CHECK(k.page_tokens == 128 && k.pages_total == 4 && k.pages_free == 4);
    tl_metrics *m = tl_metrics_new();
    tl_sched *s;
    char err[256];
    tl_sched_params sp = {.max_queue = 16, .step_tokens = 32};
    CHECK_EQ_INT(tl_sched_create(&s, e, &sp, m, err, sizeof err), 0);
    int n_preempt = run_mix(s, 6, 60);
    CHECK(n_preempt > 0);
    CHECK_EQ_INT(preemptions_in(m), n_preempt);
    wait_sessions(s, 0);
    tl_sched_free(s);
    tl_metrics_free(m);
    tl_engine_close(e);
}

/* ====== Prefix cache (docs/architecture.md §4.1, §6.1). ====== */

static tl_engine *open_engine_pc(int max_seqs, long long pc_bytes) {
    tl_engine_params ep = {.model_path = MODEL,
                           .backend = TL_BACKEND_CPU,
                           .allow_test_shape = 1,
                           .n_threads = 1,
                           .max_seqs = max_seqs,
                           .max_ctx = 512,
                           .prefix_cache_bytes = pc_bytes};
    char err[512];
    tl_engine *e = NULL;
    if (tl_engine_open(&e, &ep, err, sizeof err)) fprintf(stderr, "tl_engine_open: %s\n", err);
    return e;
}

static tl_job *job_from(const int32_t *t, int n, int snap_at, const char *salt, int max_tokens) {
    tl_job *j = tl_job_new();
    j->prompt = xmalloc(sizeof(int32_t) * (size_t)n);
    memcpy(j->prompt, t, sizeof(int32_t) * (size_t)n);
    j->n_prompt = n;
    j->sample = (tl_sample_params){.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    j->max_tokens = max_tokens;
    j->ignore_eos = 1;
    j->snap_at = snap_at;
    j->cache_salt = salt ? strdup(salt) : NULL;
    return j;
}

/* Runs the jobs (submitted together) on s; tokens into out[k], returns nothing. */
static void run_jobs(tl_sched *s, tl_job **js, int n, int32_t (*out)[8], int *cached) {
    char err[256];
    int got;
    for (int k = 0; k < n; k++) CHECK_EQ_INT(tl_sched_submit(s, js[k], err, sizeof err), 0);
    for (int k = 0; k < n; k++) {
        CHECK_EQ_INT(collect(js[k], out[k], 8, &got), TL_FIN_LENGTH);
        CHECK_EQ_INT(got, 8);
        if (cached) cached[k] = js[k]->n_cached;
        tl_job_unref(js[k]);
    }
}

/* A conversation of turns, served with and without the cache: the same greedy tokens, and the
 * cached tokens the snapshot points promise (the end of the last message, the end of the
 * generation); a salt sees none of it; three concurrent jobs with one prefix: the first computes
 * it, the others wait for its snapshot and reuse it. */
static void test_prefix_cache_turns(void) {
    tl_engine *eon = open_engine_pc(3, 0), *eoff = open_engine_pc(3, -1);
    CHECK(eon && eoff);
    if (!eon || !eoff) return;
    CHECK(!tl_engine_prefix_enabled(eoff));
    tl_sched *son, *soff;
    char err[256];
    tl_sched_params sp = {.max_queue = 8, .step_tokens = 16, .snap_every = 64};
    CHECK_EQ_INT(tl_sched_create(&son, eon, &sp, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(tl_sched_create(&soff, eoff, &sp, NULL, err, sizeof err), 0);
    int32_t t[200], a[1][8], b[1][8];
    for (int i = 0; i < 200; i++) t[i] = (int32_t)((i * 7919 + 13) % 250 + 3);
    /* turn 1: 60 tokens, the last message ends at 50 */
    int c[3];
    tl_job *j1 = job_from(t, 60, 50, NULL, 8), *j1o = job_from(t, 60, 50, NULL, 8);
    run_jobs(son, &j1, 1, a, c);
    CHECK_EQ_INT(c[0], 0);
    run_jobs(soff, &j1o, 1, b, NULL);
    CHECK(!memcmp(a, b, sizeof a));
    /* turn 2: the first 50 tokens again, then 40 others (the earlier answer re-rendered) */
    int32_t t2[90];
    memcpy(t2, t, 50 * 4);
    for (int i = 50; i < 90; i++) t2[i] = (int32_t)((i * 31 + 5) % 250 + 3);
    tl_job *j2 = job_from(t2, 90, 80, NULL, 8), *j2o = job_from(t2, 90, 80, NULL, 8);
    run_jobs(son, &j2, 1, a, c);
    CHECK_EQ_INT(c[0], 50);
    run_jobs(soff, &j2o, 1, b, NULL);
    CHECK(!memcmp(a, b, sizeof a));
    /* a continuation of turn 2's generated text: the end-of-generation snapshot (90 + 7 fed) */
    int32_t t3[110];
    memcpy(t3, t2, 90 * 4);
    memcpy(t3 + 90, a[0], 8 * 4);
    for (int i = 98; i < 110; i++) t3[i] = (int32_t)((i * 17 + 1) % 250 + 3);
    tl_job *j3 = job_from(t3, 110, 0, NULL, 8), *j3o = job_from(t3, 110, 0, NULL, 8);
    run_jobs(son, &j3, 1, a, c);
    CHECK_EQ_INT(c[0], 97);
    run_jobs(soff, &j3o, 1, b, NULL);
    CHECK(!memcmp(a, b, sizeof a));
    /* the same under a salt: nothing cached for it */
    tl_job *j4 = job_from(t3, 110, 0, "other", 8);
    run_jobs(son, &j4, 1, a, c);
    CHECK_EQ_INT(c[0], 0);
    CHECK(!memcmp(a, b, sizeof a));
    /* concurrent sharers: three new prompts sharing 150 tokens, submitted at once */
    int32_t t5[3][160];
    tl_job *js[3], *jo[3];
    int32_t o5[3][8], r5[3][8];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 160; i++) t5[k][i] = (int32_t)((i * 101 + 7) % 250 + 3);
        t5[k][155] = (int32_t)(3 + k); /* they differ after 150 */
        js[k] = job_from(t5[k], 160, 150, NULL, 8);
        jo[k] = job_from(t5[k], 160, 150, NULL, 8);
    }
    run_jobs(son, js, 3, o5, c);
    CHECK_EQ_INT(c[0], 0);
    CHECK_EQ_INT(c[1], 150);
    CHECK_EQ_INT(c[2], 150);
    run_jobs(soff, jo, 3, r5, NULL);
    CHECK(!memcmp(o5, r5, sizeof o5));
    tl_prefix_stats ps;
    tl_sched_prefix_stats(son, &ps);
    CHECK_EQ_INT(ps.queries, 7);
    CHECK_EQ_INT(ps.hits, 4);
    CHECK_EQ_INT(ps.hit_tokens, 50 + 97 + 150 + 150);
    tl_sched_free(son);
    tl_sched_free(soff);
    tl_engine_close(eon);
    tl_engine_close(eoff);
}

/* The prefill entries the engine thread's forwards saw (test_cached_turn_one_step). */
static int (*rec_real_fwd)(tl_backend *, const tl_fwd_entry *, int, char *, size_t);
static int rec_n, rec_pos[64], rec_ntok[64], rec_snap[64];

static int recording_fwd(tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        if (e[i].n_tok > 1 && rec_n < 64)
            rec_pos[rec_n] = e[i].pos, rec_ntok[rec_n] = e[i].n_tok,
            rec_snap[rec_n++] = e[i].snap_at;
    return rec_real_fwd(b, e, n, err, errlen);
}

/* A cached turn is one engine step (issue 14 B): after the load of the earlier turn's snapshot,
 * its new tokens are prefilled in one forward whose entry carries the new snapshot point (the
 * last message's end) inside it; the next turn then hits that snapshot, and every turn gives the
 * greedy tokens of an engine without a cache. */
static void test_cached_turn_one_step(void) {
    tl_engine *eon = open_engine_pc(2, 0), *eoff = open_engine_pc(2, -1);
    CHECK(eon && eoff);
    if (!eon || !eoff) return;
    tl_backend *be = tl_engine_backend_impl(eon);
    rec_real_fwd = be->forward;
    be->forward = recording_fwd;
    tl_sched *son, *soff;
    char err[256];
    tl_sched_params sp = {.max_queue = 8, .step_tokens = 256, .snap_every = 4096};
    CHECK_EQ_INT(tl_sched_create(&son, eon, &sp, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(tl_sched_create(&soff, eoff, &sp, NULL, err, sizeof err), 0);
    int32_t t[3][140], a[1][8], b[1][8];
    int lens[3] = {60, 100, 140}, snaps[3] = {50, 90, 133}, hit[3] = {0, 50, 90};
    for (int k = 0; k < 3; k++) /* turn k: turn k - 1 up to its snapshot point, then new text */
        for (int i = 0; i < 140; i++)
            t[k][i] = k && i < hit[k] ? t[k - 1][i] : (int32_t)((i * 7919 + 29 * k) % 250 + 3);
    for (int k = 0; k < 3; k++) {
        int c;
        rec_n = 0;
        tl_job *j = job_from(t[k], lens[k], snaps[k], NULL, 8),
               *jo = job_from(t[k], lens[k], snaps[k], NULL, 8);
        run_jobs(son, &j, 1, a, &c);
        run_jobs(soff, &jo, 1, b, NULL);
        CHECK(!memcmp(a, b, sizeof a));
        CHECK_EQ_INT(c, hit[k]);
        CHECK_EQ_INT(rec_n, 1); /* one prefill step */
        CHECK_EQ_INT(rec_pos[0], hit[k]);
        CHECK_EQ_INT(rec_ntok[0], lens[k] - hit[k]);
        CHECK_EQ_INT(rec_snap[0], snaps[k]);
    }
    tl_prefix_stats ps;
    tl_sched_prefix_stats(son, &ps);
    CHECK_EQ_INT(ps.hits, 2);
    CHECK_EQ_INT(ps.hit_tokens, 50 + 90);
    tl_sched_free(son);
    tl_sched_free(soff);
    be->forward = rec_real_fwd;
    tl_engine_close(eon);
    tl_engine_close(eoff);
}

int main(void) {
    T_RUN(test_batched_equals_sequential);
    T_RUN(test_cancel_and_queue_full);
    T_RUN(test_limits_script_force_fail);
    T_RUN(test_context_limit);
    T_RUN(test_bad_params_fail_one_job);
    T_RUN(test_failed_slot_reset);
    T_RUN(test_poisoned_sequence);
    T_RUN(test_pool_preemption);
    T_RUN(test_pool_admission_waits);
    T_RUN(test_pool_too_small_for_prompt);
    T_RUN(test_pool_queue_full);
    T_RUN(test_busy_counts_finished);
    T_RUN(test_pool_unreported);
    T_RUN(test_prefix_cache_turns);
    T_RUN(test_cached_turn_one_step);
    return t_summary();
}
