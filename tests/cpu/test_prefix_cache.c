/* The prefix cache (src/engine/prefix_cache.c, engine.c, backend_cpu.c; docs/architecture.md
 * §4.1).
 *
 * Bookkeeping alone: hand-worked cases (page reuse along a chain, a partial page, salts, the
 * longest hit within max_len, LRU order), then a seeded random stress against a brute-force
 * oracle kept by the test: every live snapshot's tokens (rebuilt from its pages' tokens and its
 * tail) must be exactly what was saved in that slot, every page's reference count must equal the
 * references the live snapshots hold, and every lookup must return the longest live snapshot
 * that is a prefix of the query (computed by the test from its own records).
 *
 * The engine on the tiny model, CPU backend: a session started from the cache gives the same
 * logits as one that computed the whole prompt, bit for bit (the CPU backend computes token by
 * token, so the chunk boundaries do not matter: docs/architecture.md §3.4), and the same greedy
 * tokens; this for a snapshot at a page boundary and one inside a page (the partial page copy).
 * Eviction under a tiny budget with many interleaved conversations never changes a running
 * sequence (each compared with its own uncached computation). A salt isolates. */
#include <stdint.h>
#include "common/status.h"
#include "common/util.h"
#include "engine/backend.h"
#include "engine/prefix_cache.h"
#include "model/config.h"
#include "t_check.h"

#define MODEL "tests/data/tiny-a"
enum { P = TL_PC_PAGE };

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void rand_tokens(int32_t *t, int n, int vocab, uint64_t *s) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)(rng_next(s) % (uint64_t)vocab);
}

/* ====== Bookkeeping alone. ====== */

static tl_prefix_cache make_cache(int n_page, int n_snap) {
    tl_prefix_cache c;
    char err[256];
    CHECK_EQ_INT(tl_pc_init(&c, n_page, n_snap, P, 100, 1000, err, sizeof err), 0);
    return c;
}

static int save(tl_prefix_cache *c, const char *salt, const int32_t *t, int n, int32_t *pages,
                tl_pc_io *io) {
    int rc = tl_pc_plan_save(c, salt, t, n, pages, io);
    if (rc == 1) tl_pc_commit(c, io);
    return rc;
}

static void test_layout(void) {
    int np = 0, ns = 0;
    char err[256] = "";
    CHECK_EQ_INT(tl_pc_layout(10000, 100, 1000, &np, &ns, err, sizeof err), 0);
    CHECK_EQ_INT(ns, 5);  /* half the budget: 5000 / 1000 */
    CHECK_EQ_INT(np, 50); /* the rest: 5000 / 100 */
    CHECK(tl_pc_layout(1199, 100, 1000, &np, &ns, err, sizeof err) == TL_ERR_INVALID);
    CHECK(strstr(err, "at least 1200") != NULL);
    CHECK_EQ_INT(tl_pc_layout(1200, 100, 1000, &np, &ns, err, sizeof err), 0);
    CHECK_EQ_INT(ns, 1);
    CHECK_EQ_INT(np, 2);
}

static void test_chain_and_partial(void) {
    tl_prefix_cache c = make_cache(16, 4);
    int32_t a[200], b[200], pages[8], got[8];
    uint64_t s = 1;
    rand_tokens(a, 200, 50, &s);
    memcpy(b, a, sizeof a);
    b[150] = (a[150] + 1) % 50; /* b shares a's first 150 tokens */
    tl_pc_io io;
    CHECK_EQ_INT(save(&c, NULL, a, 150, pages, &io), 1); /* 2 full pages + 22 tokens */
    CHECK_EQ_INT(io.n_pages, 3);
    CHECK(pages[0] >= 0 && pages[1] >= 0 && pages[2] >= 0);
    CHECK_EQ_INT(c.n_free, 13);
    CHECK_EQ_INT(save(&c, NULL, a, 150, pages, &io), 2); /* the same snapshot again */
    /* b up to 170: its first two pages are a's (nothing to copy), page 2 differs from a's partial
     * page after token 150, so it is new, and its own partial page too */
    CHECK_EQ_INT(save(&c, NULL, b, 170, pages, &io), 1);
    CHECK_EQ_INT(pages[0], -1);
    CHECK_EQ_INT(pages[1], -1);
    CHECK(pages[2] >= 0);
    CHECK_EQ_INT(c.n_free, 12);
    /* lookups: a's prompt of 200 finds a at 150 (b diverges at 150); b's finds b's 170 */
    CHECK(tl_pc_lookup(&c, NULL, a, 200, 200, got, &io) >= 0);
    CHECK_EQ_INT(io.n_tok, 150);
    CHECK(tl_pc_lookup(&c, NULL, b, 200, 200, got, &io) >= 0);
    CHECK_EQ_INT(io.n_tok, 170);
    /* max_len below 170 gives a's 150 for b too (the same first 150 tokens) */
    CHECK(tl_pc_lookup(&c, NULL, b, 200, 169, got, &io) >= 0);
    CHECK_EQ_INT(io.n_tok, 150);
    /* a prompt that differs in the first page finds nothing */
    int32_t d[200];
    memcpy(d, a, sizeof a);
    d[3] = (a[3] + 1) % 50;
    CHECK(tl_pc_lookup(&c, NULL, d, 200, 200, got, &io) < 0);
    /* one that ends inside a's partial page finds nothing longer than it */
    CHECK(tl_pc_lookup(&c, NULL, a, 149, 149, got, &io) < 0);
    tl_pc_stats st;
    tl_pc_get_stats(&c, &st);
    CHECK_EQ_INT(st.queries, 5);
    CHECK_EQ_INT(st.hits, 3);
    CHECK_EQ_INT(st.hit_tokens, 150 + 170 + 150);
    tl_pc_free(&c);
}

static void test_salt(void) {
    tl_prefix_cache c = make_cache(16, 4);
    int32_t a[100], pages[4];
    uint64_t s = 2;
    rand_tokens(a, 100, 50, &s);
    tl_pc_io io;
    CHECK_EQ_INT(save(&c, "alice", a, 70, pages, &io), 1);
    CHECK(tl_pc_lookup(&c, "bob", a, 100, 100, pages, &io) < 0);
    CHECK(tl_pc_lookup(&c, NULL, a, 100, 100, pages, &io) < 0);
    CHECK(tl_pc_lookup(&c, "alice", a, 100, 100, pages, &io) >= 0);
    CHECK_EQ_INT(save(&c, "", a, 70, pages, &io), 1);            /* no salt: a different snapshot */
    CHECK(pages[0] >= 0);                                        /* and pages of its own */
    CHECK(tl_pc_lookup(&c, NULL, a, 100, 100, pages, &io) >= 0); /* NULL == "" */
    tl_pc_free(&c);
}

static void test_lru(void) {
    tl_prefix_cache c = make_cache(64, 3);
    int32_t t[5][80], pages[4];
    uint64_t s = 3;
    for (int i = 0; i < 5; i++) rand_tokens(t[i], 80, 50, &s);
    tl_pc_io io;
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(save(&c, NULL, t[i], 80, pages, &io), 1);
    CHECK(tl_pc_lookup(&c, NULL, t[0], 80, 80, pages, &io) >= 0); /* 0 is now the newest */
    CHECK_EQ_INT(save(&c, NULL, t[3], 80, pages, &io), 1);        /* evicts 1 */
    CHECK(tl_pc_lookup(&c, NULL, t[1], 80, 80, pages, &io) < 0);
    CHECK(tl_pc_lookup(&c, NULL, t[0], 80, 80, pages, &io) >= 0);
    CHECK(tl_pc_lookup(&c, NULL, t[2], 80, 80, pages, &io) >= 0);
    CHECK_EQ_INT(save(&c, NULL, t[4], 80, pages, &io), 1); /* evicts 3, the least recent */
    CHECK(tl_pc_lookup(&c, NULL, t[3], 80, 80, pages, &io) < 0);
    tl_pc_stats st;
    tl_pc_get_stats(&c, &st);
    CHECK_EQ_INT(st.evictions, 2);
    CHECK_EQ_INT(st.pages_used, 3 * 2);
    /* longer than the whole budget of pages: not saved */
    int32_t big[64 * 70];
    rand_tokens(big, 64 * 70, 50, &s);
    CHECK_EQ_INT(save(&c, NULL, big, 64 * 70, NULL, &io), 0);
    tl_pc_free(&c);
}

/* The random stress's oracle: what the test saved in each snapshot slot. */
typedef struct {
    int32_t tok[400];
    int n;
    int salt;
} rec;

static const char *SALTS[] = {NULL, "s1", "s2"};

static int common_prefix(const int32_t *a, const int32_t *b, int n) {
    int i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* Every live snapshot against the record of its slot; refcounts against the snapshots. */
static void check_invariants(tl_prefix_cache *c, const rec *recs) {
    int *refs = calloc((size_t)c->n_page, sizeof(int));
    for (int i = 0; i < c->n_snap; i++) {
        const tl_pc_snap *s = &c->sn[i];
        if (!s->used) continue;
        const rec *r = &recs[i];
        CHECK_EQ_INT(s->n_tok, r->n);
        int np = s->n_full + (s->n_tok % P ? 1 : 0), ok = 1;
        for (int k = 0; k < np; k++) refs[s->pages[k]]++;
        for (int k = 0; k < s->n_full; k++) {
            ok &= !memcmp(c->pg_tok + (size_t)s->pages[k] * P, r->tok + k * P, P * 4);
            ok &= c->pg[s->pages[k]].parent == (k ? s->pages[k - 1] : -1);
            ok &= c->pg[s->pages[k]].full == 1;
        }
        ok &= !memcmp(s->tail, r->tok + s->n_full * P, (size_t)(s->n_tok % P) * 4);
        ok &= s->salt == tl_pc_salt_hash(SALTS[r->salt]);
        CHECK(ok);
    }
    int n_free = 0;
    for (int p = 0; p < c->n_page; p++) {
        CHECK_EQ_INT(c->pg[p].refs, refs[p]);
        n_free += refs[p] == 0;
    }
    CHECK_EQ_INT(c->n_free, n_free);
    free(refs);
}

static void test_random_stress(void) {
    tl_prefix_cache c = make_cache(40, 6);
    rec *recs = calloc((size_t)c.n_snap, sizeof(rec));
    int32_t base[3][400], q[400], pages[8];
    uint64_t s = 99;
    for (int b = 0; b < 3; b++) rand_tokens(base[b], 400, 4, &s); /* few symbols: many shares */
    long hits = 0;
    for (int it = 0; it < 3000; it++) {
        /* a query: one base with a random tail from a random point */
        int b = (int)(rng_next(&s) % 3), cut = (int)(rng_next(&s) % 400),
            salt = (int)(rng_next(&s) % 3);
        memcpy(q, base[b], sizeof q);
        rand_tokens(q + cut, 400 - cut, 4, &s);
        int n = 1 + (int)(rng_next(&s) % 399);
        tl_pc_io io;
        if (rng_next(&s) % 2) {
            int rc = tl_pc_plan_save(&c, SALTS[salt], q, n, pages, &io);
            if (rc == 1 && rng_next(&s) % 10 == 0) {
                tl_pc_abort(&c, &io); /* a failed backend copy */
            } else if (rc == 1) {
                tl_pc_commit(&c, &io);
                memcpy(recs[io.snap].tok, q, sizeof(int32_t) * n);
                recs[io.snap].n = n, recs[io.snap].salt = salt;
            }
        } else {
            int max_len = 1 + (int)(rng_next(&s) % 400), want = 0;
            for (int i = 0; i < c.n_snap; i++) /* the oracle: longest live prefix */
                if (c.sn[i].used && recs[i].salt == salt && recs[i].n <= max_len &&
                    recs[i].n <= n && common_prefix(recs[i].tok, q, recs[i].n) == recs[i].n)
                    want = TL_MAX(want, recs[i].n);
            int got = tl_pc_lookup(&c, SALTS[salt], q, n, max_len, pages, &io) >= 0 ? io.n_tok : 0;
            CHECK_EQ_INT(got, want);
            hits += got > 0;
        }
        check_invariants(&c, recs);
        if (t_fail_checks) break;
    }
    CHECK(hits > 100); /* the stress exercised hits, not only misses */
    CHECK(c.st.evictions > 100);
    tl_pc_clear(&c);
    CHECK_EQ_INT(c.n_free, c.n_page);
    free(recs);
    tl_pc_free(&c);
}

/* ====== The engine on the tiny model. ====== */

static tl_engine *open_engine(int max_seqs, long long pc_bytes) {
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

/* Feeds t[0..n) to s in chunks of `chunk`, the last one with logits into `logits` (if set). */
static int feed(tl_engine *e, tl_session *s, const int32_t *t, int n, int chunk, float *logits) {
    char err[256];
    for (int i = 0; i < n; i += chunk) {
        int m = TL_MIN(chunk, n - i);
        tl_batch_entry b = {
            .sess = s, .tokens = t + i, .n_tok = m, .logits = i + m == n ? logits : NULL};
        int rc = tl_engine_step(e, &b, 1, err, sizeof err);
        if (rc) {
            fprintf(stderr, "step: %s\n", err);
            return rc;
        }
    }
    return 0;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Greedy continuation of gen tokens from a session whose last logits are in lg; logits of every
 * step into out [gen][V]. */
static void greedy(tl_engine *e, tl_session *s, float *lg, int V, int gen, int32_t *toks,
                   float *out) {
    for (int i = 0; i < gen; i++) {
        memcpy(out + (size_t)i * V, lg, sizeof(float) * V);
        toks[i] = argmax(lg, V);
        CHECK_EQ_INT(feed(e, s, &toks[i], 1, 1, lg), 0);
    }
}

/* The whole prompt computed, then gen greedy tokens: the reference side. */
static void uncached(tl_engine *e, const int32_t *t, int n, int gen, int32_t *toks, float *out) {
    int V = tl_engine_config(e)->n_vocab;
    char err[256];
    tl_session *s = NULL;
    float *lg = malloc(sizeof(float) * V);
    CHECK_EQ_INT(tl_session_open(e, &s, err, sizeof err), 0);
    CHECK_EQ_INT(feed(e, s, t, n, 37, lg), 0);
    greedy(e, s, lg, V, gen, toks, out);
    tl_session_close(s);
    free(lg);
}

/* The prompt from the cache (expecting `want` restored tokens), the rest computed. */
static void cached(tl_engine *e, const char *salt, const int32_t *t, int n, int want, int gen,
                   int32_t *toks, float *out) {
    int V = tl_engine_config(e)->n_vocab;
    char err[256];
    tl_session *s = NULL;
    float *lg = malloc(sizeof(float) * V);
    CHECK_EQ_INT(tl_session_open(e, &s, err, sizeof err), 0);
    int got = tl_session_prefix_load(s, salt, t, n, n - 1, err, sizeof err);
    CHECK_EQ_INT(got, want);
    CHECK_EQ_INT(tl_session_n_past(s), TL_MAX(got, 0));
    CHECK_EQ_INT(feed(e, s, t + got, n - got, 23, lg), 0);
    greedy(e, s, lg, V, gen, toks, out);
    tl_session_close(s);
    free(lg);
}

/* Runs a prompt, snapshotting at each of at[0..n_at), then closes it. */
static void run_saving(tl_engine *e, const char *salt, const int32_t *t, const int *at, int n_at) {
    char err[256];
    tl_session *s = NULL;
    CHECK_EQ_INT(tl_session_open(e, &s, err, sizeof err), 0);
    int done = 0;
    for (int i = 0; i < n_at; i++) {
        CHECK_EQ_INT(feed(e, s, t + done, at[i] - done, 50, NULL), 0);
        done = at[i];
        CHECK_EQ_INT(tl_session_prefix_save(s, salt, err, sizeof err), 1);
    }
    tl_session_close(s);
}

enum { GEN = 8 };

static void test_engine_cached_equals_uncached(void) {
    tl_engine *e = open_engine(2, 0);
    CHECK(e != NULL);
    if (!e) return;
    CHECK(tl_engine_prefix_enabled(e));
    int V = tl_engine_config(e)->n_vocab;
    int32_t t[300], ta[GEN], tb[GEN];
    float *la = malloc(sizeof(float) * V * GEN), *lb = malloc(sizeof(float) * V * GEN);
    uint64_t s = 7;
    rand_tokens(t, 300, V, &s);
    int at[] = {128, 200}; /* a page boundary; inside a page (200 = 3 * 64 + 8) */
    run_saving(e, NULL, t, at, 2);
    /* prompts of 260 (hit at 200), of 150 (hit at 128: 200 is longer than it), of 129 (128:
     * one token left to compute) */
    int lens[] = {260, 150, 129}, wants[] = {200, 128, 128};
    for (int k = 0; k < 3; k++) {
        uncached(e, t, lens[k], GEN, ta, la);
        cached(e, NULL, t, lens[k], wants[k], GEN, tb, lb);
        CHECK(!memcmp(ta, tb, sizeof ta));                       /* greedy tokens */
        CHECK(!memcmp(la, lb, sizeof(float) * (size_t)V * GEN)); /* logits, bitwise */
    }
    /* a prompt that differs at token 150: the 128 snapshot, not the 200 one */
    t[150] = (t[150] + 1) % V;
    uncached(e, t, 260, GEN, ta, la);
    cached(e, NULL, t, 260, 128, GEN, tb, lb);
    CHECK(!memcmp(la, lb, sizeof(float) * (size_t)V * GEN));
    tl_prefix_stats st;
    CHECK_EQ_INT(tl_engine_prefix_stats(e, &st), 0);
    CHECK_EQ_INT(st.queries, 4);
    CHECK_EQ_INT(st.hits, 4);
    CHECK_EQ_INT(st.hit_tokens, 200 + 128 + 128 + 128);
    CHECK_EQ_INT(st.saves, 2);
    CHECK_EQ_INT(st.snapshots, 2);
    CHECK(st.bytes_used > 0 && st.bytes_used <= st.bytes_total);
    free(la);
    free(lb);
    tl_engine_close(e);
}

static void test_engine_salt(void) {
    tl_engine *e = open_engine(1, 0);
    if (!e) return;
    int V = tl_engine_config(e)->n_vocab;
    int32_t t[100];
    uint64_t s = 8;
    rand_tokens(t, 100, V, &s);
    int at[] = {70};
    run_saving(e, "tenant-a", t, at, 1);
    char err[256];
    tl_session *x = NULL;
    CHECK_EQ_INT(tl_session_open(e, &x, err, sizeof err), 0);
    CHECK_EQ_INT(tl_session_prefix_load(x, "tenant-b", t, 100, 99, err, sizeof err), 0);
    CHECK_EQ_INT(tl_session_prefix_load(x, NULL, t, 100, 99, err, sizeof err), 0);
    CHECK_EQ_INT(tl_session_prefix_load(x, "tenant-a", t, 100, 99, err, sizeof err), 70);
    /* a session that holds tokens cannot load */
    CHECK_EQ_INT(tl_session_prefix_load(x, "tenant-a", t, 100, 99, err, sizeof err),
                 TL_ERR_INVALID);
    tl_session_close(x);
    tl_engine_close(e);
}

static void test_engine_off(void) {
    tl_engine *e = open_engine(1, -1);
    if (!e) return;
    CHECK(!tl_engine_prefix_enabled(e));
    int32_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    char err[256];
    tl_session *x = NULL;
    CHECK_EQ_INT(tl_session_open(e, &x, err, sizeof err), 0);
    CHECK_EQ_INT(feed(e, x, t, 10, 10, NULL), 0);
    CHECK_EQ_INT(tl_session_prefix_save(x, NULL, err, sizeof err), 0);
    tl_session_close(x);
    tl_engine_close(e);
    /* a budget below one snapshot is an error at open, naming the least */
    tl_engine_params ep = {.model_path = MODEL,
                           .backend = TL_BACKEND_CPU,
                           .allow_test_shape = 1,
                           .n_threads = 1,
                           .max_seqs = 1,
                           .max_ctx = 64,
                           .prefix_cache_bytes = 1000};
    CHECK(tl_engine_open(&e, &ep, err, sizeof err) == TL_ERR_INVALID);
    CHECK(strstr(err, "prefix cache") != NULL);
}

/* Many conversations interleaved under a budget of a few snapshots: each turn starts from the
 * cache when it can, runs while other sessions save (and so evict), and must equal its
 * uncached computation. */
static void test_engine_eviction_stress(void) {
    enum { NC = 6, TURNS = 4, TURN = 40, NS = 3 };
    tl_engine *probe = open_engine(1, 0);
    if (!probe) return;
    tl_backend *b = tl_engine_backend_impl(probe);
    /* room for about 20 pages (half the budget) and at least 3 snapshots: far less than the
     * conversations need */
    long long budget =
        2 * TL_MAX(3 * (long long)b->pc_snap_bytes, 20 * (long long)b->pc_page_bytes);
    tl_engine_close(probe);
    tl_engine *e = open_engine(NS, budget);
    if (!e) return;
    int V = tl_engine_config(e)->n_vocab;
    static int32_t conv[NC][TURNS * TURN + TURNS * GEN];
    int len[NC] = {0};
    uint64_t s = 11;
    int32_t ta[GEN], tb[GEN];
    float *la = malloc(sizeof(float) * V * GEN), *lb = malloc(sizeof(float) * V * GEN);
    float *lgs = malloc(sizeof(float) * V * NS);
    long restored = 0;
    char err[256];
    for (int turn = 0; turn < TURNS; turn++) {
        for (int c0 = 0; c0 < NC; c0 += NS) { /* NS conversations at once, stepped together */
            tl_session *ss[NS];
            int got[NS];
            for (int k = 0; k < NS; k++) {
                int c = c0 + k;
                rand_tokens(conv[c] + len[c], TURN, V, &s); /* this turn's new text */
                len[c] += TURN;
                CHECK_EQ_INT(tl_session_open(e, &ss[k], err, sizeof err), 0);
                got[k] = tl_session_prefix_load(ss[k], NULL, conv[c], len[c], len[c] - 1, err,
                                                sizeof err);
                CHECK(got[k] >= 0);
                restored += got[k];
            }
            /* interleave: each session one chunk at a time, saving as it goes */
            for (int pos = 0;; pos++) {
                int any = 0;
                for (int k = 0; k < NS; k++) {
                    int c = c0 + k, done = tl_session_n_past(ss[k]);
                    if (done >= len[c]) continue;
                    any = 1;
                    int m = TL_MIN(13, len[c] - done);
                    CHECK_EQ_INT(feed(e, ss[k], conv[c] + done, m, m, lgs + (size_t)k * V), 0);
                    CHECK(tl_session_prefix_save(ss[k], NULL, err, sizeof err) >= 0);
                }
                if (!any) break;
            }
            for (int k = 0; k < NS; k++) { /* the turn's answer, appended to the conversation */
                int c = c0 + k;
                greedy(e, ss[k], lgs + (size_t)k * V, V, GEN, tb, lb);
                tl_session_close(ss[k]);
                uncached(e, conv[c], len[c], GEN, ta, la);
                CHECK(!memcmp(ta, tb, sizeof ta));
                CHECK(!memcmp(la, lb, sizeof(float) * (size_t)V * GEN));
                memcpy(conv[c] + len[c], tb, sizeof tb);
                len[c] += GEN;
            }
        }
    }
    tl_prefix_stats st;
    tl_engine_prefix_stats(e, &st);
    fprintf(stderr, "  eviction stress: %ld tokens restored, %lld evictions\n", restored,
            st.evictions);
    CHECK(st.evictions > 10); /* the budget really was under pressure */
    CHECK(restored > 0);      /* and the cache was still used */
    CHECK(st.bytes_used <= st.bytes_total);
    free(la), free(lb), free(lgs);
    tl_engine_close(e);
}

int main(void) {
    T_RUN(test_layout);
    T_RUN(test_chain_and_partial);
    T_RUN(test_salt);
    T_RUN(test_lru);
    T_RUN(test_random_stress);
    T_RUN(test_engine_cached_equals_uncached);
    T_RUN(test_engine_salt);
    T_RUN(test_engine_off);
    T_RUN(test_engine_eviction_stress);
    return t_summary();
}
