/* The engine API (src/engine/engine.c, include/tulip.h) on the tiny model with the CPU backend:
 * tl_engine_step's argument validation (every bad call gets its documented status and changes
 * nothing: the same sessions then give bit-identical tokens and logits to a run that never saw a
 * bad call), the context limit counting the sampled token, failed slot resets and failed
 * forwards (injected by wrapping the backend's functions: the engine under test is the real
 * one), and the backend choice (AUTO falls back to the CPU for a test-shape model only; a
 * production-shaped checkpoint, written sparse, gets an error naming --backend cpu). */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/status.h"
#include "common/util.h"
#include "engine/backend.h"
#include "model/config.h"
#include "model/shape.h"
#include "model/st.h"
#include "t_check.h"

#define MODEL "tests/data/tiny-a"

static tl_engine *open_engine(int max_seqs, int max_ctx) {
    tl_engine_params ep = {.model_path = MODEL,
                           .backend = TL_BACKEND_CPU,
                           .allow_test_shape = 1,
                           .n_threads = 1,
                           .max_seqs = max_seqs,
                           .max_ctx = max_ctx};
    char err[512];
    tl_engine *e = NULL;
    if (tl_engine_open(&e, &ep, err, sizeof err)) fprintf(stderr, "tl_engine_open: %s\n", err);
    return e;
}

static tl_session *open_session(tl_engine *e) {
    char err[256];
    tl_session *s = NULL;
    CHECK_EQ_INT(tl_session_open(e, &s, err, sizeof err), 0);
    return s;
}

/* ====== Validation: a script of good steps, with bad calls between them or not. ====== */

enum { CTX = 40, NSTEP = 6, PA = 10, PB = 7 };

typedef struct {
    int32_t tok_a[NSTEP], tok_b[NSTEP];
    float *logits_a; /* [NSTEP][V] */
} script_out;

static const tl_sample_params SP_A = {
    .temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .repetition_penalty = 1.1f, .seed = 11};
static const tl_sample_params SP_B = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};

/* Calls that must fail with `want` and change nothing. */
static void expect_fail(tl_engine *e, tl_batch_entry *b, int n, int want, tl_session *A,
                        tl_session *B, const char *what) {
    char err[256] = "";
    int na = tl_session_n_past(A), nb = tl_session_n_past(B);
    int st = tl_engine_step(e, b, n, err, sizeof err);
    if (st != want) fprintf(stderr, "  %s: status %d (%s), want %d\n", what, st, err, want);
    CHECK_EQ_INT(st, want);
    CHECK(err[0] != 0);
    CHECK_EQ_INT(tl_session_n_past(A), na);
    CHECK_EQ_INT(tl_session_n_past(B), nb);
}

static void bad_sample_params(tl_engine *e, tl_session *A, tl_session *B, const int32_t *tok) {
    tl_sample_out o;
    tl_sample_params p[16];
    static int32_t ids[TL_MAX_LOGIT_BIAS + 1], neg_id = -1, big_id = 1 << 30;
    static float vals[TL_MAX_LOGIT_BIAS + 1], nan_val = NAN;
    for (int i = 0; i < 16; i++) p[i] = SP_A;
    p[0].top_p = 0, p[1].top_p = 1.5f, p[2].min_p = -0.1f, p[3].min_p = 2,
    p[4].frequency_penalty = NAN;
    p[5].repetition_penalty = 0, p[6].temperature = NAN, p[7].n_logprobs = TL_MAX_LOGPROBS + 1;
    p[8].n_logprobs = -1, p[9].presence_penalty = INFINITY;
    /* token restrictions: too many pairs, pairs without arrays, a negative id, an id past the
     * vocabulary (the engine's check), a non-finite value, a negative count */
    p[10].n_bias = TL_MAX_LOGIT_BIAS + 1, p[10].bias_ids = ids, p[10].bias_vals = vals;
    p[11].n_bias = 1;
    p[12].n_bias = 1, p[12].bias_ids = &neg_id, p[12].bias_vals = vals;
    p[13].n_bias = 1, p[13].bias_ids = &big_id, p[13].bias_vals = vals;
    p[14].n_bias = 1, p[14].bias_ids = ids, p[14].bias_vals = &nan_val;
    p[15].n_bias = -1;
    for (int i = 0; i < 16; i++) {
        tl_batch_entry b = {.sess = A, .tokens = tok, .n_tok = 1, .sample = &p[i], .out = &o};
        expect_fail(e, &b, 1, TL_ERR_INVALID, A, B, "sample params");
    }
}

static void bad_calls(tl_engine *e, tl_session *A, tl_session *B, tl_session *foreign) {
    static int32_t tok[2 * CTX];
    int V = tl_engine_config(e)->n_vocab;
    for (int i = 0; i < 2 * CTX; i++) tok[i] = (int32_t)(5 + i);
    tl_sample_out o;
    tl_batch_entry b[5], ok_b = {.sess = B, .tokens = tok, .n_tok = 1};
    b[0] = (tl_batch_entry){.sess = A, .tokens = tok, .n_tok = 1};
    b[1] = ok_b;
    expect_fail(NULL, b, 1, TL_ERR_INVALID, A, B, "no engine");
    expect_fail(e, NULL, 1, TL_ERR_INVALID, A, B, "no entries");
    expect_fail(e, b, -1, TL_ERR_INVALID, A, B, "n < 0");
    expect_fail(e, b, 4, TL_ERR_INVALID, A, B, "n > max_seqs");
    char err[64];
    CHECK_EQ_INT(tl_engine_step(e, b, 0, err, sizeof err), 0); /* n == 0: nothing */
    /* each bad entry after a good one (B), which must not move either */
    tl_batch_entry bad[] = {
        {.sess = NULL, .tokens = tok, .n_tok = 1},
        {.sess = foreign, .tokens = tok, .n_tok = 1},
        {.sess = A, .tokens = NULL, .n_tok = 1},
        {.sess = A, .tokens = tok, .n_tok = 0},
        {.sess = A, .tokens = tok, .n_tok = -3},
        {.sess = B, .tokens = tok, .n_tok = 1}, /* B twice */
        {.sess = A, .tokens = (const int32_t[]){3, V}, .n_tok = 2},
        {.sess = A, .tokens = (const int32_t[]){-1}, .n_tok = 1},
        {.sess = A, .tokens = tok, .n_tok = 1, .sample = &SP_A, .out = NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b[0] = ok_b;
        b[1] = bad[i];
        expect_fail(e, b, 2, TL_ERR_INVALID, A, B, "bad entry");
    }
    bad_sample_params(e, A, B, tok);
    /* the context: n_tok past it, or up to it with a sampled token that would not fit */
    int room = CTX - tl_session_n_past(A);
    b[0] = ok_b;
    b[1] = (tl_batch_entry){.sess = A, .tokens = tok, .n_tok = room + 1};
    expect_fail(e, b, 2, TL_ERR_CONTEXT_FULL, A, B, "past the context");
    b[1] = (tl_batch_entry){.sess = A, .tokens = tok, .n_tok = room, .sample = &SP_B, .out = &o};
    expect_fail(e, b, 2, TL_ERR_CONTEXT_FULL, A, B, "no room for the sampled token");
}

/* Prefill A and B, then NSTEP-1 decode steps; bad calls before every step when `bad`. */
static void run_script(int bad, script_out *r) {
    tl_engine *e = open_engine(3, CTX), *e2 = open_engine(1, CTX);
    if (!e || !e2) {
        CHECK(0);
        tl_engine_close(e), tl_engine_close(e2);
        return;
    }
    int V = tl_engine_config(e)->n_vocab;
    tl_session *A = open_session(e), *B = open_session(e), *F = open_session(e2);
    int32_t pa[PA], pb[PB];
    for (int i = 0; i < PA; i++) pa[i] = (int32_t)(17 * i % 250 + 3);
    for (int i = 0; i < PB; i++) pb[i] = (int32_t)(29 * i % 250 + 3);
    tl_sample_out oa, ob;
    tl_batch_entry b[2] = {{A, pa, PA, &SP_A, &oa, r->logits_a, 0, 0, NULL, NULL, 0, NULL},
                           {B, pb, PB, &SP_B, &ob, NULL, 0, 0, NULL, NULL, 0, NULL}};
    for (int s = 0; s < NSTEP; s++) {
        if (bad) bad_calls(e, A, B, F);
        b[0].logits = r->logits_a + (size_t)s * V;
        char err[256];
        CHECK_EQ_INT(tl_engine_step(e, b, 2, err, sizeof err), 0);
        r->tok_a[s] = oa.token, r->tok_b[s] = ob.token;
        b[0].tokens = &r->tok_a[s], b[0].n_tok = 1;
        b[1].tokens = &r->tok_b[s], b[1].n_tok = 1;
    }
    CHECK_EQ_INT(tl_session_n_past(A), PA + NSTEP - 1);
    tl_session_close(A), tl_session_close(B), tl_session_close(F);
    tl_engine_close(e), tl_engine_close(e2);
}

static void test_step_validation_changes_nothing(void) {
    int V = 320; /* tiny-a's vocabulary */
    script_out clean = {.logits_a = xcalloc((size_t)NSTEP * V, sizeof(float))};
    script_out dirty = {.logits_a = xcalloc((size_t)NSTEP * V, sizeof(float))};
    run_script(0, &clean);
    run_script(1, &dirty);
    CHECK(!memcmp(clean.tok_a, dirty.tok_a, sizeof clean.tok_a));
    CHECK(!memcmp(clean.tok_b, dirty.tok_b, sizeof clean.tok_b));
    CHECK(!memcmp(clean.logits_a, dirty.logits_a, sizeof(float) * NSTEP * V));
    int nonzero = 0;
    for (int i = 0; i < NSTEP * V; i++) nonzero += clean.logits_a[i] != 0;
    CHECK(nonzero > NSTEP * V / 2); /* the logits were written */
    free(clean.logits_a), free(dirty.logits_a);
}

/* The context counts the sampled token: a sequence fills to exactly max_ctx, never past it. */
static void test_context_limit_counts_the_sampled_token(void) {
    tl_engine *e = open_engine(1, 16);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_session *s = open_session(e);
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (int32_t)(i + 3);
    tl_sample_out o;
    char err[256];
    tl_batch_entry b = {s, tok, 15, &SP_B, &o, NULL, 0, 0, NULL, NULL, 0, NULL};
    CHECK_EQ_INT(tl_engine_step(e, &b, 1, err, sizeof err), 0); /* 15 + the sampled 16th */
    b.tokens = &o.token, b.n_tok = 1;
    CHECK_EQ_INT(tl_engine_step(e, &b, 1, err, sizeof err), TL_ERR_CONTEXT_FULL);
    CHECK_EQ_INT(tl_session_n_past(s), 15);
    b.sample = NULL; /* feeding the 16th without sampling fills the context exactly */
    CHECK_EQ_INT(tl_engine_step(e, &b, 1, err, sizeof err), 0);
    CHECK_EQ_INT(tl_session_n_past(s), 16);
    CHECK_EQ_INT(tl_engine_step(e, &b, 1, err, sizeof err), TL_ERR_CONTEXT_FULL);
    CHECK_EQ_INT(tl_session_n_past(s), 16);
    tl_session_close(s);
    tl_engine_close(e);
}

/* ====== Backend faults, injected around the real CPU backend. ====== */

static int (*real_reset)(tl_backend *, int);
static int (*real_forward)(tl_backend *, const tl_fwd_entry *, int, char *, size_t);
static int reset_fail, reset_calls; /* reset_fail: status returned instead of resetting */
static int fwd_fail, fwd_fail_after_running;

static int faulty_reset(tl_backend *b, int slot) {
    reset_calls++;
    return reset_fail ? reset_fail : real_reset(b, slot);
}

/* fwd_fail once: with fwd_fail_after_running the forward runs, then fails (state moved, as a
 * device fault mid-step); without, it fails before touching anything (as a full KV pool). */
static int faulty_forward(tl_backend *b, const tl_fwd_entry *e, int n, char *err, size_t errlen) {
    int st = fwd_fail;
    fwd_fail = 0;
    if (!st) return real_forward(b, e, n, err, errlen);
    if (fwd_fail_after_running) real_forward(b, e, n, err, errlen);
    return tl_errf(err, errlen, st, "injected forward failure");
}

static tl_engine *open_faulty(int max_seqs) {
    tl_engine *e = open_engine(max_seqs, 64);
    if (!e) return NULL;
    tl_backend *be = tl_engine_backend_impl(e);
    real_reset = be->reset_slot, real_forward = be->forward;
    be->reset_slot = faulty_reset, be->forward = faulty_forward;
    reset_fail = reset_calls = fwd_fail = fwd_fail_after_running = 0;
    return e;
}

/* Prefill logits of PROMPT through session s (0 or the step's status). */
static const int32_t PROMPT[] = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38};
enum { NP = sizeof PROMPT / sizeof PROMPT[0] };
static int prefill(tl_engine *e, tl_session *s, float *logits) {
    char err[256];
    tl_batch_entry b = {.sess = s, .tokens = PROMPT, .n_tok = NP, .logits = logits};
    return tl_engine_step(e, &b, 1, err, sizeof err);
}

static float *reference_logits(void) {
    tl_engine *e = open_engine(1, 64);
    float *l = xcalloc(320, sizeof(float));
    tl_session *s = e ? open_session(e) : NULL;
    CHECK(s && prefill(e, s, l) == 0);
    tl_session_close(s);
    tl_engine_close(e);
    return l;
}

static void test_failed_reset_keeps_the_slot_out_of_use(void) {
    float *ref = reference_logits(), got[320];
    tl_engine *e = open_faulty(2);
    if (!e) {
        CHECK(0);
        free(ref);
        return;
    }
    char err[256];
    tl_session *s0 = open_session(e), *s1 = open_session(e), *s2 = NULL;
    CHECK_EQ_INT(prefill(e, s0, got), 0);
    CHECK_EQ_INT(prefill(e, s1, got), 0);
    reset_fail = TL_ERR_CUDA; /* the resets fail and leave the state as it was */
    CHECK_EQ_INT(tl_session_close(s0), TL_ERR_CUDA);
    /* the only slot not in use failed to reset: not handed out, and not reported as busy */
    CHECK_EQ_INT(tl_session_open(e, &s2, err, sizeof err), TL_ERR_CUDA);
    CHECK(s2 == NULL && strstr(err, "reset") != NULL);
    CHECK_EQ_INT(tl_session_close(s1), TL_ERR_CUDA);
    CHECK_EQ_INT(tl_session_open(e, &s2, err, sizeof err), TL_ERR_CUDA);
    CHECK(s2 == NULL);
    /* the device recovers: open retries the reset and hands out a clean slot */
    reset_fail = 0;
    int calls = reset_calls;
    CHECK_EQ_INT(tl_session_open(e, &s2, err, sizeof err), 0);
    CHECK_EQ_INT(reset_calls, calls + 1);
    CHECK(s2 && prefill(e, s2, got) == 0 && !memcmp(got, ref, sizeof got));
    tl_session *s3 = open_session(e); /* the other dirty slot, also reset on the way out */
    CHECK(s3 && prefill(e, s3, got) == 0 && !memcmp(got, ref, sizeof got));
    CHECK_EQ_INT(tl_session_open(e, &s1, err, sizeof err), TL_ERR_BUSY);
    /* a failed tl_session_reset: the session refuses steps until a reset succeeds */
    reset_fail = TL_ERR_DEVICE_LOST;
    CHECK_EQ_INT(tl_session_reset(s2), TL_ERR_DEVICE_LOST);
    CHECK_EQ_INT(prefill(e, s2, got), TL_ERR_INVALID);
    reset_fail = 0;
    CHECK_EQ_INT(tl_session_reset(s2), 0);
    CHECK(prefill(e, s2, got) == 0 && !memcmp(got, ref, sizeof got));
    CHECK_EQ_INT(tl_session_close(s2), 0);
    CHECK_EQ_INT(tl_session_close(s3), 0);
    tl_engine_close(e);
    free(ref);
}

static void test_failed_forward(void) {
    float *ref = reference_logits(), got[320];
    tl_engine *e = open_faulty(2);
    if (!e) {
        CHECK(0);
        free(ref);
        return;
    }
    tl_session *s = open_session(e);
    /* a full KV pool (the backend changed nothing): the same step then runs as if never tried */
    fwd_fail = TL_ERR_CONTEXT_FULL;
    CHECK_EQ_INT(prefill(e, s, got), TL_ERR_CONTEXT_FULL);
    CHECK_EQ_INT(tl_session_n_past(s), 0);
    CHECK(prefill(e, s, got) == 0 && !memcmp(got, ref, sizeof got));
    /* a fault mid-step: the session's state is undefined, so it refuses steps until reset */
    fwd_fail = TL_ERR_INTERNAL, fwd_fail_after_running = 1;
    CHECK_EQ_INT(tl_session_reset(s), 0);
    CHECK_EQ_INT(prefill(e, s, got), TL_ERR_INTERNAL);
    CHECK_EQ_INT(prefill(e, s, got), TL_ERR_INVALID);
    CHECK_EQ_INT(tl_session_reset(s), 0);
    CHECK(prefill(e, s, got) == 0 && !memcmp(got, ref, sizeof got));
    tl_session_close(s);
    tl_engine_close(e);
    free(ref);
}

/* ====== Backend choice. ====== */

static void test_auto_falls_back_for_a_test_shape(void) {
    tl_engine_params ep = {.model_path = MODEL,
                           .backend = TL_BACKEND_AUTO,
                           .allow_test_shape = 1,
                           .n_threads = 1,
                           .max_seqs = 1,
                           .max_ctx = 16};
    tl_engine *e = NULL;
    char err[512] = "";
    CHECK_EQ_INT(tl_engine_open(&e, &ep, err, sizeof err), 0);
    CHECK(e && tl_engine_backend(e) == TL_BACKEND_CPU);
    tl_engine_close(e);
    ep.backend = TL_BACKEND_CUDA; /* this test is built without CUDA */
    CHECK_EQ_INT(tl_engine_open(&e, &ep, err, sizeof err), TL_ERR_UNSUPPORTED);
    CHECK(e == NULL && strstr(err, "no CUDA backend") != NULL);
    ep.backend = (tl_backend_kind)7;
    CHECK_EQ_INT(tl_engine_open(&e, &ep, err, sizeof err), TL_ERR_INVALID);
}

#include "prod_ckpt.h"

static void test_production_model_never_falls_back(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/tulip-test-%d-prod", (int)getpid());
    char err[512] = "";
    if (pc_write(dir, err, sizeof err)) {
        fprintf(stderr, "writing the sparse checkpoint: %s\n", err);
        CHECK(0);
        return;
    }
    tl_engine_params ep = {
        .model_path = dir, .backend = TL_BACKEND_AUTO, .n_threads = 1, .max_seqs = 1, .max_ctx = 8};
    tl_engine *e = NULL;
    int st = tl_engine_open(&e, &ep, err, sizeof err);
    CHECK(st < 0 && e == NULL);
    CHECK(strstr(err, "no CUDA backend") != NULL); /* why CUDA could not open */
    CHECK(strstr(err, "--backend cpu") != NULL);   /* and how to force the CPU */
    ep.allow_test_shape = 1;                       /* still the production shape */
    CHECK(tl_engine_open(&e, &ep, err, sizeof err) < 0 && e == NULL);
    ep.backend = TL_BACKEND_CPU; /* asked for explicitly: the CPU it is */
    CHECK_EQ_INT(tl_engine_open(&e, &ep, err, sizeof err), 0);
    CHECK(e && tl_engine_backend(e) == TL_BACKEND_CPU);
    tl_engine_close(e);
    pc_remove(dir);
}

int main(void) {
    T_RUN(test_step_validation_changes_nothing);
    T_RUN(test_context_limit_counts_the_sampled_token);
    T_RUN(test_failed_reset_keeps_the_slot_out_of_use);
    T_RUN(test_failed_forward);
    T_RUN(test_auto_falls_back_for_a_test_shape);
    T_RUN(test_production_model_never_falls_back);
    return t_summary();
}
