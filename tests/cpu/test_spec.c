/* Speculative decoding with the MTP head (docs/architecture.md §3.6) on the CPU backend, tiny
 * model with a head (tests/data/tiny-mtp). The reference is the same engine without
 * speculation:
 *   greedy    the emitted tokens and their logprobs are identical (bit for bit: the CPU
 *             backend computes a verify chunk exactly as token-by-token steps) for K = 1..4,
 *             several prompts, several sessions batched in one engine (speculating and plain
 *             sessions and a prefill chunk in the same step), max_tokens never exceeded;
 *   sampling  the law of the emitted tokens equals the non-speculative sampler's: chi-square of
 *             the counts of each position's token over many short seeded runs (per position,
 *             both engines' counts against each other), the acceptance itself checked on
 *             synthetic laws in tests/cpu/test_sample.c.
 * Drafts come from the real head (whose random weights rarely agree with the trunk) and, to
 * drive the accept and rollback paths at every length, from a wrapper of the backend's draft op
 * that replaces the head's logits by a peak at the reference continuation's token (7 times in
 * 10, else at another token): the engine under test is the real one either way.
 * Also: the counters, a checkpoint without a head (speculation off, the step as before), a
 * prefix-cache hit (the head's rows restored: the session drafts as if computed whole). */
#include <math.h>
#include <stdint.h>
#include "common/util.h"
#include "engine/backend.h"
#include "engine/sample.h"
#include "tulip.h"
#include "t_check.h"

#define MODEL "tests/data/tiny-mtp"

/* kv_tokens 0: the default pool (every slot full). */
static tl_engine *open_engine_kv(const char *model, int k, int max_seqs, long long pc,
                                 long kv_tokens) {
    tl_engine_params ep = {.model_path = model,
                           .backend = TL_BACKEND_CPU,
                           .allow_test_shape = 1,
                           .n_threads = 1,
                           .max_seqs = max_seqs,
                           .max_ctx = 256,
                           .kv_tokens = kv_tokens,
                           .prefix_cache_bytes = pc,
                           .spec_tokens = k};
    char err[512];
    tl_engine *e = NULL;
    if (tl_engine_open(&e, &ep, err, sizeof err)) fprintf(stderr, "tl_engine_open: %s\n", err);
    return e;
}

static tl_engine *open_engine(const char *model, int k, int max_seqs, long long pc) {
    return open_engine_kv(model, k, max_seqs, pc, 0);
}

enum { MAXS = 4, NGEN = 40 };

/* One sequence being generated: its prompt, tokens out, and what the next step feeds. */
typedef struct {
    tl_session *s;
    const int32_t *prompt;
    int n_prompt, fed_prompt, n_gen, max_gen;
    int32_t next;
    int32_t tok[NGEN + TL_MAX_SPEC + 1];
    float lp[NGEN + TL_MAX_SPEC + 1];
    tl_sample_params sp;
    tl_sample_out out[1 + TL_MAX_SPEC];
} gen;

/* The draft wrapper: when on, slot i's draft step j is steered to CHEAT_REF[i][CHEAT_GEN[i]->n_gen
 * + j] (the token the reference emitted there) 7 times in 10. Sessions opened in order on a
 * fresh engine hold slots 0, 1, ... */
static int (*real_draft)(tl_backend *b, const tl_draft_entry *d, int n, char *err, size_t errlen);
static const gen *CHEAT_GEN[MAXS];
static const int32_t *CHEAT_REF[MAXS];
static int cheat_draft(tl_backend *b, const tl_draft_entry *d, int n, char *err, size_t errlen) {
    int rc = real_draft(b, d, n, err, errlen), V = 320;
    for (int i = 0; i < n && !rc; i++) {
        const gen *g = CHEAT_GEN[d[i].slot];
        if (!g) continue;
        int at = g->n_gen + d[i].step;
        if (at >= NGEN) continue;
        uint32_t h = (uint32_t)(at * 2654435761u) ^ (uint32_t)(d[i].slot * 40503u + d[i].step);
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        int t = CHEAT_REF[d[i].slot][at];
        if (h % 10 >= 7) t = (t + 1 + (int)(h % 7)) % V;
        for (int v = 0; v < V; v++) d[i].logits[v] = v == t ? 4.0f : -1.0f;
    }
    return rc;
}

/* Runs every gen to max_gen tokens, all in one engine, one entry per gen per step. A gen whose
 * index is in `plain` never speculates (spec_max 0); prompts are fed in chunks of 5 (so a
 * prefill chunk often shares a step with decode entries). Returns 0 or the step's status. */
static int run_all(tl_engine *e, gen *g, int n, unsigned plain) {
    char err[256];
    for (;;) {
        tl_batch_entry b[MAXS];
        int m = 0, idx[MAXS];
        for (int i = 0; i < n; i++) {
            gen *x = &g[i];
            if (x->n_gen >= x->max_gen) continue;
            tl_batch_entry *be = &b[m];
            memset(be, 0, sizeof *be);
            be->sess = x->s;
            if (x->fed_prompt < x->n_prompt) {
                int c = TL_MIN(5, x->n_prompt - x->fed_prompt);
                be->tokens = x->prompt + x->fed_prompt;
                be->n_tok = c;
                x->fed_prompt += c;
                if (x->fed_prompt < x->n_prompt) {
                    idx[m++] = i;
                    continue;
                }
            } else {
                be->tokens = &x->next;
                be->n_tok = 1;
                be->spec_max = plain >> i & 1 ? 0 : x->max_gen - x->n_gen - 1;
            }
            be->sample = &x->sp;
            be->out = x->out;
            idx[m++] = i;
        }
        if (!m) return 0;
        int rc = tl_engine_step(e, b, m, err, sizeof err);
        if (rc) {
            fprintf(stderr, "step: %s\n", err);
            return rc;
        }
        for (int j = 0; j < m; j++) {
            gen *x = &g[idx[j]];
            if (!b[j].sample) {
                CHECK_EQ_INT(b[j].n_out, 0);
                continue;
            }
            CHECK(b[j].n_out >= 1 && b[j].n_out <= 1 + b[j].spec_max);
            for (int k = 0; k < b[j].n_out; k++) {
                x->tok[x->n_gen] = x->out[k].token;
                x->lp[x->n_gen++] = x->out[k].logprob;
            }
            x->next = x->out[b[j].n_out - 1].token;
        }
    }
}

static int32_t PROMPTS[4][16];

static void make_prompts(void) {
    uint64_t r = 12345;
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < 16; t++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            PROMPTS[i][t] = (int32_t)((r >> 33) % 287);
        }
}

static void gen_init(tl_engine *e, gen *g, int i, int n_prompt, int max_gen,
                     const tl_sample_params *sp) {
    char err[256];
    memset(g, 0, sizeof *g);
    CHECK_EQ_INT(tl_session_open(e, &g->s, err, sizeof err), 0);
    g->prompt = PROMPTS[i];
    g->n_prompt = n_prompt;
    g->max_gen = max_gen;
    g->sp = *sp;
}

static const tl_sample_params GREEDY = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};

/* The per-position counters (tulip.h tl_spec_stats) add up to the totals: draft i is proposed
 * only where drafts 0..i-1 were, accepted only where they were accepted, none past K. */
static void spec_pos_invariants(const tl_spec_stats *st, int K) {
    long long sd = 0, sa = 0;
    for (int i = 0; i < TL_MAX_SPEC; i++) {
        sd += st->drafted_pos[i], sa += st->accepted_pos[i];
        CHECK(st->accepted_pos[i] <= st->drafted_pos[i]);
        if (i) CHECK(st->drafted_pos[i] <= st->drafted_pos[i - 1]);
        if (i) CHECK(st->accepted_pos[i] <= st->accepted_pos[i - 1]);
        if (i >= K) CHECK(st->drafted_pos[i] == 0);
    }
    CHECK(sd == st->drafted && sa == st->accepted && st->drafted_pos[0] <= st->drafts);
    CHECK(K < 1 || st->drafted_pos[0] > 0);
}

/* Greedy: K = 0 (reference) and K = 1..4, each with 4 sequences batched (one plain). */
static void test_greedy_exact(void) {
    make_prompts();
    gen ref[4], g[4];
    tl_engine *e0 = open_engine(MODEL, 0, MAXS, -1);
    CHECK(e0 != NULL);
    if (!e0) return;
    CHECK_EQ_INT(tl_engine_spec_tokens(e0), 0);
    static const int NP[4] = {16, 9, 3, 12}, NG[4] = {NGEN, 23, NGEN, 7};
    tl_sample_params sp[4] = {GREEDY, GREEDY, GREEDY, GREEDY};
    sp[1].repetition_penalty = 1.3f; /* penalties see the drafts in the history */
    sp[3].presence_penalty = 0.7f, sp[3].n_logprobs = 3;
    for (int i = 0; i < 4; i++) gen_init(e0, &ref[i], i, NP[i], NG[i], &sp[i]);
    CHECK_EQ_INT(run_all(e0, ref, 4, 0), 0);
    for (int run = 0; run < 2 * TL_MAX_SPEC; run++) {
        int K = run % TL_MAX_SPEC + 1, cheat = run >= TL_MAX_SPEC;
        tl_engine *e = open_engine(MODEL, K, MAXS, -1);
        CHECK(e != NULL);
        if (!e) continue;
        CHECK_EQ_INT(tl_engine_spec_tokens(e), K);
        tl_backend *be = tl_engine_backend_impl(e);
        real_draft = be->draft;
        if (cheat) be->draft = cheat_draft;
        for (int i = 0; i < 4; i++) {
            gen_init(e, &g[i], i, NP[i], NG[i], &sp[i]);
            CHEAT_GEN[i] = &g[i], CHEAT_REF[i] = ref[i].tok;
        }
        CHECK_EQ_INT(run_all(e, g, 4, 1u << 2), 0);
        int same = 1;
        for (int i = 0; i < 4; i++) {
            CHECK_EQ_INT(g[i].n_gen, NG[i]); /* never more than max_tokens */
            same &= !memcmp(g[i].tok, ref[i].tok, sizeof(int32_t) * NG[i]);
            same &= !memcmp(g[i].lp, ref[i].lp, sizeof(float) * NG[i]);
        }
        CHECK(same);
        tl_spec_stats st;
        CHECK_EQ_INT(tl_engine_spec_stats(e, &st), 0);
        printf("# K=%d, %s drafts: %lld verifies, %lld drafted, %lld accepted (%.0f%%)\n", K,
               cheat ? "steered" : "MTP head", st.drafts, st.drafted, st.accepted,
               100.0 * (double)st.accepted / (double)TL_MAX(st.drafted, 1));
        CHECK(st.drafted > 0);
        spec_pos_invariants(&st, K);
        if (cheat) { /* the accept and the rollback paths both ran */
            CHECK(st.accepted > st.drafted / 3);
            CHECK(st.accepted < st.drafted);
        }
        for (int i = 0; i < 4; i++) tl_session_close(g[i].s);
        tl_engine_close(e);
    }
    for (int i = 0; i < 4; i++) tl_session_close(ref[i].s);
    tl_engine_close(e0);
}

/* ====== The engine's chained drafts (backend.h draft_chain) ======
 * A stand-in for the CUDA backend's draft_chain over the CPU backend's draft op: each step's
 * logits from the real head, the law on the host (no penalties: the stand-in has no history),
 * each draft drawn as tl_law_draw draws, with the uniforms the engine handed over. */
static int chain_draw(const tl_law *q, int greedy, const double *u, int *used) {
    return greedy || q->n == 1 ? q->id[0] : tl_law_pick(q, u[(*used)++]);
}

static int (*chain_inner)(tl_backend *b, const tl_draft_entry *d, int n, char *err, size_t errlen);
static int chain_by_steps(tl_backend *b, tl_chain_entry *d, int n, char *err, size_t errlen) {
    static float lg[MAXS][320];
    int32_t chain[MAXS][TL_MAX_SPEC + 1];
    for (int i = 0; i < n; i++) chain[i][0] = d[i].token, d[i].n_drafted = d[i].n_draws = 0;
    for (int j = 0; j < TL_MAX_SPEC; j++) {
        tl_draft_entry s[MAXS];
        int m = 0, who[MAXS];
        for (int i = 0; i < n; i++)
            if (d[i].k > j && d[i].n_drafted == j) {
                s[m] = (tl_draft_entry){
                    .slot = d[i].slot, .step = j, .token = chain[i][j], .logits = lg[m]};
                who[m++] = i;
            }
        if (!m) break;
        int rc = chain_inner(b, s, m, err, errlen);
        if (rc) return rc;
        for (int t = 0; t < m; t++) {
            tl_chain_entry *x = &d[who[t]];
            CHECK_EQ_INT(tl_sample_law(lg[t], 320, x->sample, NULL, 0, 0, &x->law[j]), 0);
            if (x->law[j].n < 1) continue;
            x->drafts[j] = chain[who[t]][j + 1] =
                chain_draw(&x->law[j], x->greedy, x->u, &x->n_draws);
            x->n_drafted = j + 1;
        }
    }
    return 0;
}

static void chain_compare(gen (*g)[4], const tl_spec_stats *st, int cheat) {
    int same = st[0].drafted == st[1].drafted && st[0].accepted == st[1].accepted;
    for (int i = 0; i < 4; i++)
        same &= !memcmp(g[0][i].tok, g[1][i].tok, sizeof(int32_t) * NGEN) &&
                !memcmp(g[0][i].lp, g[1][i].lp, sizeof(float) * NGEN);
    printf("# chain vs loop, %s drafts: %lld / %lld drafted, %lld / %lld accepted, tokens %s\n",
           cheat ? "steered" : "head", st[0].drafted, st[1].drafted, st[0].accepted, st[1].accepted,
           same ? "the same" : "DIFFER");
    CHECK(same && st[0].drafted > 0);
    if (cheat) CHECK(st[0].accepted >= 10 && st[0].accepted < st[0].drafted); /* both paths */
}

/* The engine with a backend's draft_chain (the stand-in above) against its loop of draft calls:
 * K = 3, four sequences batched (greedy, two sampled with the sparse laws and their own seeds,
 * one greedy never speculating), with the head's own drafts and with drafts steered to a
 * reference run's tokens (cheat_draft: so drafts are accepted and rejected): the same tokens and
 * logprobs bit for bit and the same drafted and accepted counts, so the chain path consumes each
 * session's RNG exactly as the loop does. */
static void test_chain_vs_loop(void) {
    make_prompts();
    tl_sample_params sp[4] = {GREEDY, GREEDY, GREEDY, GREEDY};
    for (int i = 1; i <= 2; i++)
        sp[i].temperature = 1.0f, sp[i].top_k = 20, sp[i].top_p = 0.95f, sp[i].seed = 7 + i;
    static const int NP[4] = {16, 9, 3, 12};
    static gen ref[4], g[2][4];
    tl_engine *e0 = open_engine(MODEL, 0, MAXS, -1);
    CHECK(e0 != NULL);
    if (!e0) return;
    for (int i = 0; i < 4; i++) gen_init(e0, &ref[i], i, NP[i], NGEN, &sp[i]);
    CHECK_EQ_INT(run_all(e0, ref, 4, 0), 0);
    for (int cheat = 0; cheat < 2; cheat++) {
        tl_spec_stats st[2];
        for (int v = 0; v < 2; v++) {
            tl_engine *e = open_engine(MODEL, 3, MAXS, -1);
            CHECK(e != NULL);
            if (!e) return;
            tl_backend *be = tl_engine_backend_impl(e);
            real_draft = be->draft, chain_inner = cheat ? cheat_draft : be->draft;
            if (v)
                be->draft_chain = chain_by_steps;
            else
                be->draft = chain_inner;
            for (int i = 0; i < 4; i++) {
                gen_init(e, &g[v][i], i, NP[i], NGEN, &sp[i]);
                CHEAT_GEN[i] = &g[v][i], CHEAT_REF[i] = ref[i].tok;
            }
            CHECK_EQ_INT(run_all(e, g[v], 4, 1u << 3), 0);
            CHECK_EQ_INT(tl_engine_spec_stats(e, &st[v]), 0);
            for (int i = 0; i < 4; i++) tl_session_close(g[v][i].s);
            tl_engine_close(e);
        }
        chain_compare(g, st, cheat);
    }
    for (int i = 0; i < 4; i++) tl_session_close(ref[i].s);
    tl_engine_close(e0);
    memset(CHEAT_GEN, 0, sizeof CHEAT_GEN);
}

/* Sampling: the law of each emitted position. RUNS short generations (a 10-token prompt, 5
 * tokens, seeds 1..RUNS) without and with speculation (K = 3, the head's drafts); the counts of
 * the token at positions 1..4 (position 0 comes from the prefill, no draft) are compared with a
 * two-sample chi-square (categories with fewer than 10 draws together lumped in one), bound at
 * the upper 3e-7 quantile as in test_sample.c. A wrong residual or acceptance skews these laws
 * by far more: with q in place of p after a rejection the rejected drafts' mass moves. */
enum { RUNS = 1000, LEN = 5 };

static void sample_runs(tl_engine *e, const tl_sample_params *sp0, int (*cnt)[320]) {
    for (int r = 1; r <= RUNS; r++) {
        gen g;
        tl_sample_params sp = *sp0;
        sp.seed = (uint64_t)r;
        gen_init(e, &g, 0, 10, LEN, &sp);
        CHECK_EQ_INT(run_all(e, &g, 1, 0), 0);
        for (int t = 0; t < LEN; t++)
            if (g.tok[t] >= 0 && g.tok[t] < 320) cnt[t][g.tok[t]]++;
        tl_session_close(g.s);
    }
}

/* One parameter set: RUNS generations without and with K = 3, the laws compared. */
static void sampling_law_case(const char *name, const tl_sample_params *sp) {
    static int c0[LEN][320], c1[LEN][320];
    memset(c0, 0, sizeof c0), memset(c1, 0, sizeof c1);
    tl_engine *e0 = open_engine(MODEL, 0, 1, -1), *e1 = open_engine(MODEL, 3, 1, -1);
    CHECK(e0 && e1);
    if (!e0 || !e1) return;
    sample_runs(e0, sp, c0);
    sample_runs(e1, sp, c1);
    tl_spec_stats st;
    tl_engine_spec_stats(e1, &st);
    printf("# sampling (%s), K=3: %lld drafted, %lld accepted (%.0f%%)\n", name, st.drafted,
           st.accepted, 100.0 * (double)st.accepted / (double)TL_MAX(st.drafted, 1));
    CHECK(st.accepted > 0 && st.accepted < st.drafted);
    spec_pos_invariants(&st, 3);
    for (int t = 1; t < LEN; t++) {
        double chi2 = 0;
        int k = 0, la = 0, lb = 0;
        for (int v = 0; v < 320; v++) {
            int a = c0[t][v], b = c1[t][v];
            if (a + b < 10) {
                la += a, lb += b;
                continue;
            }
            chi2 += (double)(a - b) * (a - b) / (a + b), k++;
        }
        if (la + lb > 0) chi2 += (double)(la - lb) * (la - lb) / (la + lb), k++;
        double df = k > 1 ? k - 1 : 1, a3 = 2 / (9 * df), c3 = 1 - a3 + 5 * sqrt(a3);
        double bound = df * c3 * c3 * c3;
        printf("# position %d: %d categories, chi2 %.1f (bound %.0f)\n", t, k, chi2, bound);
        CHECK(chi2 < bound);
    }
    tl_engine_close(e0);
    tl_engine_close(e1);
}

/* The dense path (top-k off: no sparse law) and the sparse-law path (the model card's settings:
 * top-k 20, top-p 0.95, presence penalty 1.5; tl_law_ok). */
static void test_sampling_law(void) {
    make_prompts();
    tl_sample_params dense = {.temperature = 1.0f, .top_p = 1, .repetition_penalty = 1};
    tl_sample_params card = {.temperature = 1.0f,
                             .top_k = 20,
                             .top_p = 0.95f,
                             .presence_penalty = 1.5f,
                             .repetition_penalty = 1};
    sampling_law_case("dense, top-k off", &dense);
    sampling_law_case("sparse laws, model card", &card);
}

/* Speculation off: a checkpoint without a head (tiny-a) opens with it off and runs as before;
 * a count outside 0..TL_MAX_SPEC is refused at open. */
static void test_off_and_limits(void) {
    tl_engine *e = open_engine("tests/data/tiny-a", 3, 1, -1);
    CHECK(e != NULL);
    if (e) {
        CHECK_EQ_INT(tl_engine_spec_tokens(e), 0);
        gen g;
        gen_init(e, &g, 0, 8, 6, &GREEDY);
        CHECK_EQ_INT(run_all(e, &g, 1, 0), 0);
        CHECK_EQ_INT(g.n_gen, 6);
        tl_spec_stats st;
        CHECK_EQ_INT(tl_engine_spec_stats(e, &st), 0);
        CHECK_EQ_INT(st.drafted, 0);
        tl_session_close(g.s);
        tl_engine_close(e);
    }
    tl_engine_params ep = {.model_path = MODEL,
                           .backend = TL_BACKEND_CPU,
                           .allow_test_shape = 1,
                           .max_ctx = 64,
                           .spec_tokens = TL_MAX_SPEC + 1};
    char err[256] = "";
    tl_engine *bad = NULL;
    CHECK_EQ_INT(tl_engine_open(&bad, &ep, err, sizeof err), TL_ERR_INVALID);
    CHECK(bad == NULL && strstr(err, "speculative tokens 5"));
}

/* Feeds n prompt tokens of g in one step (no sample): what a cache writer computes. */
static void feed_chunk(tl_engine *e, gen *g, int n) {
    char err[256];
    CHECK_EQ_INT(
        tl_engine_step(
            e, &(tl_batch_entry){.sess = g->s, .tokens = g->prompt + g->fed_prompt, .n_tok = n}, 1,
            err, sizeof err),
        0);
    g->fed_prompt += n;
}

/* A session started from a prefix-cache snapshot drafts as if it had computed the prefix: the
 * head's rows come back from the cache's pages and its last hidden from the snapshot. On the
 * trained tiny model (a head whose drafts depend on its KV), the restored session b emits the
 * plain engine's tokens, and drafts and accepts exactly what a session c computed whole with
 * the same chunking (12 tokens, then 4) does on a fresh engine. */
static void test_prefix_cache_hit(void) {
    make_prompts();
    const char *tm = "tests/data/tiny-trained";
    char err[256];
    gen ref, a, b, c, d;
    tl_engine *e0 = open_engine(tm, 0, 2, -1), *e = open_engine(tm, 2, 2, 1 << 24),
              *e2 = open_engine(tm, 2, 2, -1);
    CHECK(e0 && e && e2);
    if (!e0 || !e || !e2) return;
    gen_init(e0, &ref, 1, 16, 20, &GREEDY);
    CHECK_EQ_INT(run_all(e0, &ref, 1, 0), 0);
    /* a computes the prompt's first 12 tokens in one step and snapshots them */
    gen_init(e, &a, 1, 16, 1, &GREEDY);
    feed_chunk(e, &a, 12);
    CHECK_EQ_INT(tl_session_prefix_save(a.s, NULL, err, sizeof err), 1);
    /* d fills the other slot's head cache with another prompt's rows, then b takes that slot
     * (a still holds its own) and starts from the snapshot */
    gen_init(e, &d, 2, 16, 4, &GREEDY);
    CHECK_EQ_INT(run_all(e, &d, 1, 0), 0);
    tl_session_close(d.s);
    gen_init(e, &b, 1, 16, 20, &GREEDY);
    CHECK_EQ_INT(tl_session_prefix_load(b.s, NULL, PROMPTS[1], 16, 15, err, sizeof err), 12);
    b.fed_prompt = 12;
    tl_spec_stats s0, s1, c0, c1;
    tl_engine_spec_stats(e, &s0);
    CHECK_EQ_INT(run_all(e, &b, 1, 0), 0);
    tl_engine_spec_stats(e, &s1);
    /* c: the same chunks computed on a fresh engine */
    gen_init(e2, &c, 1, 16, 20, &GREEDY);
    feed_chunk(e2, &c, 12);
    tl_engine_spec_stats(e2, &c0);
    CHECK_EQ_INT(run_all(e2, &c, 1, 0), 0);
    tl_engine_spec_stats(e2, &c1);
    long long db = s1.drafted - s0.drafted, ab = s1.accepted - s0.accepted;
    long long dc = c1.drafted - c0.drafted, ac = c1.accepted - c0.accepted;
    printf("# restored session: %lld drafted, %lld accepted; computed whole: %lld, %lld\n", db, ab,
           dc, ac);
    CHECK(db > 0 && ab > 0);
    CHECK_EQ_INT(db, dc);
    CHECK_EQ_INT(ab, ac);
    CHECK(!memcmp(b.tok, ref.tok, sizeof(int32_t) * 20));
    CHECK(!memcmp(b.tok, c.tok, sizeof(int32_t) * 20));
    CHECK(!memcmp(b.lp, c.lp, sizeof(float) * 20));
    tl_session_close(a.s);
    tl_session_close(b.s);
    tl_session_close(c.s);
    tl_session_close(ref.s);
    tl_engine_close(e0);
    tl_engine_close(e);
    tl_engine_close(e2);
}

/* Conversations under cache pressure with speculation (K = 3) on tests/data/tiny-mtp: NC
 * conversations of TURNS turns, NS at a time in one engine whose cache holds a few snapshots and
 * whose pool barely holds the running sessions (so saves evict snapshots and their pages, and
 * pages come back to other slots with stale head rows). Each turn loads the longest cached
 * prefix, feeds the rest in chunks of 7, saves at the prompt's end and after generating G tokens
 * (as the server does): the tokens must equal the plain engine's for the same conversation
 * computed uncached; restored turns draft. */
static void test_cache_pressure(void) {
    enum { NC = 6, NS = 3, TURNS = 4, TURN = 24, G = 12 };
    const char *tm = MODEL;
    tl_engine *probe = open_engine(tm, 3, NS, 1 << 24);
    if (!probe) {
        CHECK(0);
        return;
    }
    long long budget = 10 * (long long)tl_engine_backend_impl(probe)->pc_snap_bytes;
    tl_engine_close(probe);
    char err[512];
    tl_engine *e = open_engine_kv(tm, 3, NS, budget, 16 * 64), *e0 = open_engine(tm, 0, 1, -1);
    CHECK(e != NULL && e0 != NULL);
    if (!e || !e0) {
        if (e) tl_engine_close(e);
        if (e0) tl_engine_close(e0);
        return;
    }
    int V = tl_engine_config(e)->n_vocab;
    static int32_t conv[NC][TURNS * (TURN + G)];
    int len[NC] = {0}, same = 1;
    long long restored = 0, drafted_restored = 0;
    uint64_t r = 99;
    for (int turn = 0; turn < TURNS; turn++)
        for (int c0 = 0; c0 < NC; c0 += NS) {
            gen g[NS];
            int got[NS];
            for (int k = 0; k < NS; k++) {
                int c = c0 + k;
                for (int t = 0; t < TURN; t++) {
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    conv[c][len[c] + t] = (int32_t)((r >> 33) % (uint64_t)V);
                }
                len[c] += TURN;
                memset(&g[k], 0, sizeof g[k]);
                CHECK_EQ_INT(tl_session_open(e, &g[k].s, err, sizeof err), 0);
                g[k].prompt = conv[c], g[k].n_prompt = len[c], g[k].max_gen = G, g[k].sp = GREEDY;
                got[k] = tl_session_prefix_load(g[k].s, NULL, conv[c], len[c], len[c] - 1, err,
                                                sizeof err);
                CHECK(got[k] >= 0);
                g[k].fed_prompt = TL_MAX(got[k], 0);
                restored += got[k] > 0 ? got[k] : 0;
            }
            for (int any = 1; any;) { /* all but the last chunk, interleaved */
                any = 0;
                for (int k = 0; k < NS; k++) {
                    int m = TL_MIN(7, g[k].n_prompt - g[k].fed_prompt - 1);
                    if (m <= 0) continue;
                    feed_chunk(e, &g[k], m);
                    if (g[k].fed_prompt == g[k].n_prompt - 1) /* a save at the prompt's end */
                        CHECK(tl_session_prefix_save(g[k].s, NULL, err, sizeof err) >= 0);
                    any = 1;
                }
            }
            tl_spec_stats s0, s1;
            tl_engine_spec_stats(e, &s0);
            CHECK_EQ_INT(run_all(e, g, NS, 0), 0);
            tl_engine_spec_stats(e, &s1);
            if (got[0] > 0 && got[1] > 0 && got[2] > 0) /* every session of the group restored */
                drafted_restored += s1.drafted - s0.drafted;
            for (int k = 0; k < NS; k++) {
                int c = c0 + k;
                CHECK(tl_session_prefix_save(g[k].s, NULL, err, sizeof err) >= 0);
                tl_session_close(g[k].s);
                gen ref;
                memset(&ref, 0, sizeof ref);
                CHECK_EQ_INT(tl_session_open(e0, &ref.s, err, sizeof err), 0);
                ref.prompt = conv[c], ref.n_prompt = len[c], ref.max_gen = G, ref.sp = GREEDY;
                CHECK_EQ_INT(run_all(e0, &ref, 1, 0), 0);
                tl_session_close(ref.s);
                same &= !memcmp(ref.tok, g[k].tok, sizeof(int32_t) * G);
                memcpy(conv[c] + len[c], g[k].tok, sizeof(int32_t) * G);
                len[c] += G;
            }
        }
    tl_prefix_stats st;
    tl_engine_prefix_stats(e, &st);
    printf("# cache pressure: %lld tokens restored, %lld evictions, %lld drafted by groups that "
           "all restored\n",
           restored, st.evictions, drafted_restored);
    CHECK(same);
    CHECK(restored > 0 && st.evictions > 0 && drafted_restored > 0);
    tl_engine_close(e);
    tl_engine_close(e0);
}

/* tl_engine_warm_up (what tulip serve and bench run first on CUDA): on an engine with
 * speculation it returns 0, leaves no page held, every slot free and the counters at zero, and
 * the sessions after it emit exactly what an engine without the warm-up emits (greedy, K = 2). */
static void test_warm_up(void) {
    make_prompts();
    char err[256];
    static const int NP[2] = {16, 9}, NG[2] = {NGEN, 23};
    tl_sample_params sp[2] = {GREEDY, GREEDY};
    sp[1].presence_penalty = 0.7f;
    gen ref[2], g[2];
    tl_engine *e0 = open_engine(MODEL, 2, MAXS, -1), *e = open_engine(MODEL, 2, MAXS, -1);
    CHECK(e0 && e);
    if (!e0 || !e) return;
    tl_kv_stats k0, k1;
    CHECK_EQ_INT(tl_engine_kv_stats(e, &k0), 0);
    CHECK_EQ_INT(tl_engine_warm_up(e, err, sizeof err), 0);
    CHECK_EQ_INT(tl_engine_kv_stats(e, &k1), 0);
    CHECK_EQ_INT(k1.pages_free, k0.pages_free);
    CHECK_EQ_INT(k1.pages_free, k1.pages_total);
    tl_spec_stats st;
    CHECK_EQ_INT(tl_engine_spec_stats(e, &st), 0);
    CHECK_EQ_INT((int)st.drafts, 0);
    CHECK_EQ_INT((int)st.drafted, 0);
    tl_session *s[MAXS], *extra;
    for (int i = 0; i < MAXS; i++) CHECK_EQ_INT(tl_session_open(e, &s[i], err, sizeof err), 0);
    CHECK_EQ_INT(tl_session_open(e, &extra, err, sizeof err), TL_ERR_BUSY);
    for (int i = 0; i < MAXS; i++) tl_session_close(s[i]);
    for (int i = 0; i < 2; i++) {
        gen_init(e0, &ref[i], i, NP[i], NG[i], &sp[i]);
        gen_init(e, &g[i], i, NP[i], NG[i], &sp[i]);
    }
    CHECK_EQ_INT(run_all(e0, ref, 2, 0), 0);
    CHECK_EQ_INT(run_all(e, g, 2, 0), 0);
    for (int i = 0; i < 2; i++) {
        CHECK(!memcmp(g[i].tok, ref[i].tok, sizeof(int32_t) * NG[i]));
        CHECK(!memcmp(g[i].lp, ref[i].lp, sizeof(float) * NG[i]));
        tl_session_close(ref[i].s), tl_session_close(g[i].s);
    }
    tl_engine_close(e0);
    tl_engine_close(e);
}

int main(void) {
    T_RUN(test_greedy_exact);
    T_RUN(test_sampling_law);
    T_RUN(test_chain_vs_loop);
    T_RUN(test_off_and_limits);
    T_RUN(test_prefix_cache_hit);
    T_RUN(test_cache_pressure);
    T_RUN(test_warm_up);
    return t_summary();
}
