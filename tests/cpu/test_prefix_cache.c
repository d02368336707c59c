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

/* ====== Bookkeeping alone: the cache over a KV pool (kv_pages.h), slots as sequences. ====== */

typedef struct bk {
    tl_kv_pages pool;
    tl_prefix_cache c;
} bk;

static void bk_open(bk *k, int n_page, int n_slot, int n_snap) {
    char err[256];
    CHECK_EQ_INT(tl_kv_pages_init(&k->pool, n_page, n_slot, 16, P, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(tl_pc_init(&k->c, &k->pool, n_snap, 100, 1000, err, sizeof err), 0);
}

static void bk_close(bk *k) {
    tl_pc_free(&k->c);
    tl_kv_pages_free(&k->pool);
}

/* Slot `slot` (empty) computes t[0..n) (its own pages), is snapshotted, then released. */
static int save_in(bk *k, int slot, const char *salt, const int32_t *t, int n, tl_pc_io *io) {
    char err[256];
    CHECK_EQ_INT(tl_kv_pages_reserve(&k->pool, &slot, &n, 1, NULL, err, sizeof err), 0);
    int rc = tl_pc_plan_save(&k->c, salt, t, n, slot, 0, io);
    if (rc == 1) tl_pc_commit(&k->c, io);
    tl_kv_pages_release(&k->pool, slot);
    return rc;
}

static int save(bk *k, const char *salt, const int32_t *t, int n, tl_pc_io *io) {
    return save_in(k, 0, salt, t, n, io);
}

/* What a backend's cache_load does with the pool: the shared pages mapped, a page of the slot's
 * own for the rest (its partial page). */
static int load_into(bk *k, int slot, const tl_pc_io *io) {
    char err[256];
    int rc = tl_kv_pages_map(&k->pool, slot, io->page, io->n_full, err, sizeof err);
    int n = io->n_tok;
    if (!rc) rc = tl_kv_pages_reserve(&k->pool, &slot, &n, 1, NULL, err, sizeof err);
    return rc;
}

static void test_layout(void) {
    int ns = 0;
    char err[256] = "";
    CHECK_EQ_INT(tl_pc_layout(10500, 1000, &ns, err, sizeof err), 0);
    CHECK_EQ_INT(ns, 10); /* the whole budget holds snapshot states; KV pages are the pool's */
    CHECK(tl_pc_layout(999, 1000, &ns, err, sizeof err) == TL_ERR_INVALID);
    CHECK(strstr(err, "at least 1000") != NULL);
    CHECK_EQ_INT(tl_pc_layout(1000, 1000, &ns, err, sizeof err), 0);
    CHECK_EQ_INT(ns, 1);
}

static void test_chain_and_partial(void) {
    bk k;
    bk_open(&k, 16, 2, 4);
    tl_prefix_cache *c = &k.c;
    int32_t a[200], b[200], got[8];
    uint64_t s = 1;
    rand_tokens(a, 200, 50, &s);
    memcpy(b, a, sizeof a);
    b[150] = (a[150] + 1) % 50; /* b shares a's first 150 tokens */
    tl_pc_io io;
    /* a at 150: the slot's 2 full pages are published (no copy), its partial page (22 rows)
     * copied into a new page */
    int slot = 0, n = 150;
    char err[256];
    CHECK_EQ_INT(tl_kv_pages_reserve(&k.pool, &slot, &n, 1, NULL, err, sizeof err), 0);
    int32_t own[3];
    memcpy(own, k.pool.table, sizeof own);
    CHECK_EQ_INT(tl_pc_plan_save(c, NULL, a, 150, 0, 0, &io), 1);
    tl_pc_commit(c, &io);
    CHECK_EQ_INT(io.n_full, 2);
    CHECK_EQ_INT(io.part_rows, 22);
    CHECK_EQ_INT(io.part_src, own[2]);
    CHECK(io.part_dst >= 0 && io.part_dst != own[0] && io.part_dst != own[1] &&
          io.part_dst != own[2]);
    CHECK(k.pool.refs[own[0]] == 2 && k.pool.refs[own[1]] == 2 && k.pool.refs[own[2]] == 1);
    CHECK(k.pool.held[own[0]] && k.pool.held[own[1]] && !k.pool.held[own[2]]);
    CHECK_EQ_INT(k.pool.n_free, 12); /* the slot's 3 pages and the partial copy */
    CHECK_EQ_INT(k.pool.n_idle, 1);  /* the partial copy: only the cache holds it */
    tl_kv_pages_release(&k.pool, 0);
    CHECK_EQ_INT(k.pool.n_free, 13); /* the slot's partial page came back, the rest is cached */
    CHECK_EQ_INT(k.pool.n_idle, 3);
    CHECK_EQ_INT(tl_kv_pages_available(&k.pool), 16);
    CHECK_EQ_INT(save(&k, NULL, a, 150, &io), 2); /* the same snapshot again */
    CHECK_EQ_INT(k.pool.n_free, 13);              /* the slot's duplicate pages went back */
    /* b up to 170: its first two pages are a's (referenced, the slot's own copies stay private and
     * go back), its partial page of 42 rows is new */
    CHECK_EQ_INT(save(&k, NULL, b, 170, &io), 1);
    CHECK_EQ_INT(io.part_rows, 42);
    CHECK_EQ_INT(k.pool.n_free, 12);
    CHECK_EQ_INT(k.c.pg[own[0]].refs, 2); /* both snapshots use a's first pages */
    /* a last save (the slot closes next): the slot's own partial page is kept, nothing copied */
    slot = 1, n = 100;
    CHECK_EQ_INT(tl_kv_pages_reserve(&k.pool, &slot, &n, 1, NULL, err, sizeof err), 0);
    int32_t last_own = k.pool.table[k.pool.max_pages + 1];
    int32_t e100[100]; /* a's first page, then its own tokens */
    memcpy(e100, a, sizeof e100);
    e100[99] = (a[99] + 1) % 50;
    CHECK_EQ_INT(tl_pc_plan_save(c, NULL, e100, 100, 1, 1, &io), 1);
    tl_pc_commit(c, &io);
    CHECK(io.part_rows == 0 && io.part_dst == last_own && k.pool.held[last_own]);
    tl_kv_pages_release(&k.pool, 1);
    CHECK(k.pool.refs[last_own] == 1 && k.pool.held[last_own]); /* cached, idle */
    CHECK_EQ_INT(k.pool.n_free, 11); /* its first page went back: a's is cached */
    /* lookups: a's prompt of 200 finds a at 150 (b diverges at 150); b's finds b's 170 */
    CHECK(tl_pc_lookup(c, NULL, a, 200, 200, got, &io) >= 0);
    CHECK_EQ_INT(io.n_tok, 150);
    CHECK(io.page[0] == own[0] && io.page[1] == own[1]);
    CHECK(tl_pc_lookup(c, NULL, b, 200, 200, got, &io) >= 0);
    CHECK_EQ_INT(io.n_tok, 170);
    /* max_len below 170 gives a's 150 for b too (the same first 150 tokens) */
    CHECK(tl_pc_lookup(c, NULL, b, 200, 169, got, &io) >= 0);
    CHECK_EQ_INT(io.n_tok, 150);
    /* a prompt that differs in the first page finds nothing */
    int32_t d[200];
    memcpy(d, a, sizeof a);
    d[3] = (a[3] + 1) % 50;
    CHECK(tl_pc_lookup(c, NULL, d, 200, 200, got, &io) < 0);
    /* one that ends inside a's partial page finds nothing longer than it */
    CHECK(tl_pc_lookup(c, NULL, a, 149, 149, got, &io) < 0);
    tl_pc_stats st;
    tl_pc_get_stats(c, &st);
    CHECK_EQ_INT(st.queries, 5);
    CHECK_EQ_INT(st.hits, 3);
    CHECK_EQ_INT(st.hit_tokens, 150 + 170 + 150);
    CHECK_EQ_INT(st.pages_used, 5);
    tl_pc_clear(c);
    CHECK_EQ_INT(k.pool.n_free, 16);
    bk_close(&k);
}

/* Two sequences started from one snapshot hold the same page ids (read-only), each its own copy
 * of the partial page; the refcounts count both slots and the cache; eviction while they run
 * frees none of their pages; their release leaves the pages cached (idle) or frees them. */
static void test_sharing(void) {
    bk k;
    bk_open(&k, 16, 3, 4);
    int32_t a[200], got[8];
    uint64_t s = 4;
    rand_tokens(a, 200, 50, &s);
    tl_pc_io io;
    CHECK_EQ_INT(save_in(&k, 2, NULL, a, 150, &io), 1);
    int part = io.part_dst;
    for (int slot = 0; slot < 2; slot++) {
        CHECK(tl_pc_lookup(&k.c, NULL, a, 200, 199, got, &io) >= 0);
        CHECK_EQ_INT(load_into(&k, slot, &io), 0);
    }
    const int32_t *r0 = k.pool.table, *r1 = k.pool.table + k.pool.max_pages;
    CHECK(r0[0] == got[0] && r1[0] == got[0] && r0[1] == got[1] && r1[1] == got[1]);
    CHECK(k.pool.refs[got[0]] == 3 && k.pool.refs[got[1]] == 3);
    CHECK(r0[2] != r1[2] && r0[2] != part && r1[2] != part); /* partial pages: own copies */
    CHECK_EQ_INT(k.pool.n_idle, 1);                          /* the cache's partial page */
    CHECK_EQ_INT(tl_kv_pages_available(&k.pool), 16 - 4);
    /* the pool needs every available page: the snapshot is evicted, the shared pages stay */
    int slot = 2, n = 12 * P;
    char err[256];
    CHECK_EQ_INT(tl_kv_pages_reserve(&k.pool, &slot, &n, 1, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(k.c.st.evictions, 1);
    CHECK(k.pool.refs[got[0]] == 2 && !k.pool.held[got[0]]);
    CHECK(tl_pc_lookup(&k.c, NULL, a, 200, 199, got, &io) < 0);
    CHECK_EQ_INT(k.pool.n_free, 0);
    /* one page more is one too many: nothing left to evict, nothing changed */
    n = 13 * P;
    CHECK(tl_kv_pages_reserve(&k.pool, &slot, &n, 1, NULL, err, sizeof err) == TL_ERR_CONTEXT_FULL);
    for (int i = 0; i < 3; i++) tl_kv_pages_release(&k.pool, i);
    CHECK_EQ_INT(k.pool.n_free, 16);
    bk_close(&k);
}

static void test_salt(void) {
    bk k;
    bk_open(&k, 16, 1, 4);
    int32_t a[100], pages[4];
    uint64_t s = 2;
    rand_tokens(a, 100, 50, &s);
    tl_pc_io io;
    CHECK_EQ_INT(save(&k, "alice", a, 70, &io), 1);
    CHECK(tl_pc_lookup(&k.c, "bob", a, 100, 100, pages, &io) < 0);
    CHECK(tl_pc_lookup(&k.c, NULL, a, 100, 100, pages, &io) < 0);
    CHECK(tl_pc_lookup(&k.c, "alice", a, 100, 100, pages, &io) >= 0);
    int alice0 = pages[0];
    CHECK_EQ_INT(save(&k, "", a, 70, &io), 1); /* no salt: a different snapshot */
    CHECK(tl_pc_lookup(&k.c, NULL, a, 100, 100, pages, &io) >= 0); /* NULL == "" */
    CHECK(pages[0] != alice0);                                     /* and pages of its own */
    bk_close(&k);
}

/* LRU order over snapshots, and the pool's demand evicting the least recently used first. */
static void test_lru(void) {
    bk k;
    bk_open(&k, 64, 2, 3);
    int32_t t[5][80], pages[4];
    uint64_t s = 3;
    for (int i = 0; i < 5; i++) rand_tokens(t[i], 80, 50, &s);
    tl_pc_io io;
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(save(&k, NULL, t[i], 80, &io), 1);
    CHECK(tl_pc_lookup(&k.c, NULL, t[0], 80, 80, pages, &io) >= 0); /* 0 is now the newest */
    CHECK_EQ_INT(save(&k, NULL, t[3], 80, &io), 1);                 /* evicts 1 */
    CHECK(tl_pc_lookup(&k.c, NULL, t[1], 80, 80, pages, &io) < 0);
    CHECK(tl_pc_lookup(&k.c, NULL, t[0], 80, 80, pages, &io) >= 0);
    CHECK(tl_pc_lookup(&k.c, NULL, t[2], 80, 80, pages, &io) >= 0);
    CHECK_EQ_INT(save(&k, NULL, t[4], 80, &io), 1); /* evicts 3, the least recent */
    CHECK(tl_pc_lookup(&k.c, NULL, t[3], 80, 80, pages, &io) < 0);
    tl_pc_stats st;
    tl_pc_get_stats(&k.c, &st);
    CHECK_EQ_INT(st.evictions, 2);
    CHECK_EQ_INT(st.pages_used, 3 * 2);
    /* the pool wants 60 of its 64 pages: 58 are free, so one snapshot goes (the least recent: 2) */
    int slot = 1, n = 60 * P;
    char err[256];
    tl_kv_pages_free(&k.pool);
    tl_pc_free(&k.c);
    CHECK_EQ_INT(tl_kv_pages_init(&k.pool, 64, 2, 64, P, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(tl_pc_init(&k.c, &k.pool, 3, 100, 1000, err, sizeof err), 0);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(save(&k, NULL, t[i], 80, &io), 1);
    CHECK(tl_pc_lookup(&k.c, NULL, t[0], 80, 80, pages, &io) >= 0); /* 1 is the least recent */
    CHECK_EQ_INT(tl_kv_pages_reserve(&k.pool, &slot, &n, 1, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(k.c.st.evictions, 1);
    CHECK(tl_pc_lookup(&k.c, NULL, t[1], 80, 80, pages, &io) < 0);
    CHECK(tl_pc_lookup(&k.c, NULL, t[0], 80, 80, pages, &io) >= 0);
    CHECK(tl_pc_lookup(&k.c, NULL, t[2], 80, 80, pages, &io) >= 0);
    bk_close(&k);
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

/* Every live snapshot against the record of its slot; refcounts against the snapshots and the
 * slots' tables; the pool's counts. */
static void check_invariants(bk *k, const rec *recs) {
    tl_prefix_cache *c = &k->c;
    tl_kv_pages *pool = &k->pool;
    int *refs = calloc((size_t)c->n_page, sizeof(int)), *srefs = calloc((size_t)c->n_page, 4);
    for (int i = 0; i < c->n_snap; i++) {
        const tl_pc_snap *s = &c->sn[i];
        if (!s->used) continue;
        const rec *r = &recs[i];
        CHECK_EQ_INT(s->n_tok, r->n);
        int np = s->n_full + (s->n_tok % P ? 1 : 0), ok = 1;
        for (int q = 0; q < np; q++) refs[s->pages[q]]++;
        for (int q = 0; q < s->n_full; q++) {
            ok &= !memcmp(c->pg_tok + (size_t)s->pages[q] * P, r->tok + q * P, P * 4);
            ok &= c->pg[s->pages[q]].parent == (q ? s->pages[q - 1] : -1);
            ok &= c->pg[s->pages[q]].full == 1;
        }
        ok &= !memcmp(s->tail, r->tok + s->n_full * P, (size_t)(s->n_tok % P) * 4);
        ok &= s->salt == tl_pc_salt_hash(SALTS[r->salt]);
        CHECK(ok);
    }
    for (int sl = 0; sl < pool->max_seqs; sl++)
        for (int q = 0; q < pool->np[sl]; q++) srefs[pool->table[sl * pool->max_pages + q]]++;
    int n_free = 0, n_idle = 0, n_held = 0;
    for (int p = 0; p < c->n_page; p++) {
        CHECK_EQ_INT(c->pg[p].refs, refs[p]);
        CHECK_EQ_INT(pool->held[p], refs[p] > 0);
        CHECK_EQ_INT(pool->refs[p], srefs[p] + (refs[p] > 0));
        n_free += pool->refs[p] == 0;
        n_idle += refs[p] > 0 && srefs[p] == 0;
        n_held += refs[p] > 0;
    }
    CHECK_EQ_INT(pool->n_free, n_free);
    CHECK_EQ_INT(pool->n_idle, n_idle);
    CHECK_EQ_INT(c->n_held, n_held);
    free(refs), free(srefs);
}

/* Saves (slot 0) and lookups at random under pressure, while slot 1 holds a loaded prefix for a
 * while (a running sequence): its pages must keep their content (a published page in its table
 * still holds the tokens it loaded) and never be free. */
static void test_random_stress(void) {
    bk k;
    bk_open(&k, 40, 2, 6);
    tl_prefix_cache *c = &k.c;
    rec *recs = calloc((size_t)c->n_snap, sizeof(rec));
    int32_t base[3][400], q[400], pages[8], run_tok[400];
    int run_n = 0, run_left = 0;
    uint64_t s = 99;
    for (int b = 0; b < 3; b++) rand_tokens(base[b], 400, 4, &s); /* few symbols: many shares */
    long hits = 0, runs = 0;
    for (int it = 0; it < 3000; it++) {
        /* a query: one base with a random tail from a random point */
        int b = (int)(rng_next(&s) % 3), cut = (int)(rng_next(&s) % 400),
            salt = (int)(rng_next(&s) % 3);
        memcpy(q, base[b], sizeof q);
        rand_tokens(q + cut, 400 - cut, 4, &s);
        int n = 1 + (int)(rng_next(&s) % 399);
        tl_pc_io io;
        if (rng_next(&s) % 2) {
            int slot = 0;
            char err[256];
            if (tl_kv_pages_reserve(&k.pool, &slot, &n, 1, NULL, err, sizeof err)) continue;
            int last = (int)(rng_next(&s) % 2); /* the slot is released next either way */
            int rc = tl_pc_plan_save(c, SALTS[salt], q, n, 0, last, &io);
            if (rc == 1 && last)
                CHECK(io.part_rows == 0 && (n % P == 0 || io.part_dst == io.part_src));
            if (rc == 1 && rng_next(&s) % 10 == 0) {
                tl_pc_abort(c, &io); /* a failed backend copy */
            } else if (rc == 1) {
                tl_pc_commit(c, &io);
                memcpy(recs[io.snap].tok, q, sizeof(int32_t) * n);
                recs[io.snap].n = n, recs[io.snap].salt = salt;
            }
            tl_kv_pages_release(&k.pool, 0);
        } else {
            int max_len = 1 + (int)(rng_next(&s) % 400), want = 0;
            for (int i = 0; i < c->n_snap; i++) /* the oracle: longest live prefix */
                if (c->sn[i].used && recs[i].salt == salt && recs[i].n <= max_len &&
                    recs[i].n <= n && common_prefix(recs[i].tok, q, recs[i].n) == recs[i].n)
                    want = TL_MAX(want, recs[i].n);
            int got = tl_pc_lookup(c, SALTS[salt], q, n, max_len, pages, &io) >= 0 ? io.n_tok : 0;
            CHECK_EQ_INT(got, want);
            hits += got > 0;
            if (got > 0 && run_left == 0) {
                c->pinned = io.snap;
                int rc = load_into(&k, 1, &io);
                c->pinned = -1;
                if (!rc) {
                    memcpy(run_tok, q, sizeof(int32_t) * got);
                    run_n = got, run_left = 1 + (int)(rng_next(&s) % 20), runs++;
                } else
                    tl_kv_pages_release(&k.pool, 1);
            }
        }
        if (run_left > 0) { /* the running sequence's pages: held, and what it loaded */
            const int32_t *row = k.pool.table + k.pool.max_pages;
            for (int p = 0; p < run_n / P; p++) {
                CHECK(k.pool.refs[row[p]] >= 1);
                if (c->pg[row[p]].full)
                    CHECK(!memcmp(c->pg_tok + (size_t)row[p] * P, run_tok + p * P, P * 4));
            }
            if (--run_left == 0) tl_kv_pages_release(&k.pool, 1);
        }
        check_invariants(&k, recs);
        if (t_fail_checks) break;
    }
    fprintf(stderr, "  stress: %ld hits, %ld runs, %lld evictions, %lld saves\n", hits, runs,
            c->st.evictions, c->st.saves);
    CHECK(hits > 100); /* the stress exercised hits, not only misses */
    CHECK(runs > 50);
    CHECK(c->st.evictions > 100);
    tl_kv_pages_release(&k.pool, 1);
    tl_pc_clear(c);
    CHECK_EQ_INT(k.pool.n_free, k.pool.n_page);
    free(recs);
    bk_close(&k);
}

/* ====== The engine on the tiny model. ====== */

static tl_engine *open_engine_kv(int max_seqs, long long pc_bytes, long kv_tokens) {
    tl_engine_params ep = {.model_path = MODEL,
                           .backend = TL_BACKEND_CPU,
                           .allow_test_shape = 1,
                           .n_threads = 1,
                           .max_seqs = max_seqs,
                           .max_ctx = 512,
                           .kv_tokens = kv_tokens,
                           .prefix_cache_bytes = pc_bytes};
    char err[512];
    tl_engine *e = NULL;
    if (tl_engine_open(&e, &ep, err, sizeof err)) fprintf(stderr, "tl_engine_open: %s\n", err);
    return e;
}

static tl_engine *open_engine(int max_seqs, long long pc_bytes) {
    return open_engine_kv(max_seqs, pc_bytes, 0);
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
        if (i < n_at - 1) {
            CHECK_EQ_INT(tl_session_prefix_save(s, salt, err, sizeof err), 1);
            continue;
        }
        /* the last one as the scheduler saves a finishing sequence: its last page kept */
        CHECK_EQ_INT(tl_session_prefix_save_last(s, salt, err, sizeof err), 1);
        tl_batch_entry b = {.sess = s, .tokens = t, .n_tok = 1};
        CHECK(tl_engine_step(e, &b, 1, err, sizeof err) == TL_ERR_INVALID); /* sealed */
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

/* Two sessions started from one snapshot, running side by side: their page tables hold the same
 * pool pages for the shared full pages (refcount: both and the cache), each its own last page;
 * interleaved, each gives the tokens and logits of the uncached run (the CPU backend's reset
 * also checks that no page a session held was overwritten: backend_cpu.c store_check). */
static void test_engine_sharing(void) {
    tl_engine *e = open_engine(3, 0);
    if (!e) return;
    int V = tl_engine_config(e)->n_vocab;
    tl_kv_pages *pool = tl_engine_backend_impl(e)->kv_pool(tl_engine_backend_impl(e));
    int32_t t[300], ta[GEN], tb[2][GEN];
    float *la = malloc(sizeof(float) * V * GEN), *lb = malloc(sizeof(float) * V * GEN * 2);
    float *lg = malloc(sizeof(float) * V * 2);
    uint64_t s = 17;
    rand_tokens(t, 300, V, &s);
    int at[] = {200};
    run_saving(e, NULL, t, at, 1);
    char err[256];
    tl_session *x[2];
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(tl_session_open(e, &x[k], err, sizeof err), 0);
        CHECK_EQ_INT(tl_session_prefix_load(x[k], NULL, t, 260, 259, err, sizeof err), 200);
    }
    int sl[2], n = 0; /* the two slots holding pages */
    for (int i = 0; i < pool->max_seqs && n < 2; i++)
        if (pool->np[i]) sl[n++] = i;
    CHECK_EQ_INT(n, 2);
    const int32_t *r0 = pool->table + sl[0] * pool->max_pages,
                  *r1 = pool->table + sl[1] * pool->max_pages;
    CHECK(pool->np[sl[0]] == 4 && pool->np[sl[1]] == 4);
    for (int k = 0; k < 3; k++)
        CHECK(r0[k] == r1[k] && pool->refs[r0[k]] == 3 && pool->held[r0[k]]);
    CHECK(r0[3] != r1[3] && pool->refs[r0[3]] == 1 && pool->refs[r1[3]] == 1);
    for (int i = 200; i < 260; i += 7) /* interleaved chunks */
        for (int k = 0; k < 2; k++)
            CHECK_EQ_INT(feed(e, x[k], t + i, TL_MIN(7, 260 - i), 7, lg + (size_t)k * V), 0);
    for (int k = 0; k < 2; k++) /* greedy, one after the other, the other still open */
        greedy(e, x[k], lg + (size_t)k * V, V, GEN, tb[k], lb + (size_t)k * V * GEN);
    for (int k = 0; k < 2; k++) tl_session_close(x[k]);
    uncached(e, t, 260, GEN, ta, la);
    for (int k = 0; k < 2; k++) {
        CHECK(!memcmp(ta, tb[k], sizeof ta));
        CHECK(!memcmp(la, lb + (size_t)k * V * GEN, sizeof(float) * (size_t)V * GEN));
    }
    tl_kv_stats ks;
    tl_engine_kv_stats(e, &ks); /* cached pages count as free (evicted on demand) */
    CHECK_EQ_INT(ks.pages_free, ks.pages_total);
    CHECK(pool->n_free < pool->n_page);
    free(la), free(lb), free(lg);
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

/* Many conversations interleaved under a budget of a few snapshots and a KV pool barely larger
 * than the running sessions need: each turn starts from the cache when it can, runs while other
 * sessions save and take pages (and so evict snapshots and their pages), and must equal its
 * uncached computation; no page a running session holds is evicted or overwritten (the CPU
 * backend checks every page at each session's close). */
static void test_engine_eviction_stress(void) {
    enum { NC = 6, TURNS = 4, TURN = 40, NS = 3 };
    tl_engine *probe = open_engine(1, 0);
    if (!probe) return;
    tl_backend *b = tl_engine_backend_impl(probe);
    /* 24 snapshots (about two rounds of saves); a pool of 20 pages where the 3 running sessions
     * hold up to 9 (the answers of 4 turns: 192 tokens each) */
    long long budget = 24 * (long long)b->pc_snap_bytes;
    tl_engine_close(probe);
    tl_engine *e = open_engine_kv(NS, budget, 20 * P);
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

/* ====== Snapshots inside a step (issue 14 B: tl_batch_entry.snap_at, backend.h snap_at). ====== */

/* One forward of tokens [pos, pos + n) of slot (snap_at/snap: a point inside, or 0), logits out. */
static int bfwd(tl_backend *b, int slot, const int32_t *t, int pos, int n, int snap_at, int snap,
                float *logits) {
    char err[256];
    tl_fwd_entry x = {.slot = slot,
                      .pos = pos,
                      .tokens = t + pos,
                      .n_tok = n,
                      .logits = logits,
                      .n_prompt = -1,
                      .snap_at = snap_at,
                      .snap = snap};
    int rc = b->forward(b, &x, 1, err, sizeof err);
    if (rc) fprintf(stderr, "forward: %s\n", err);
    return rc;
}

/* The slot's GDN state into snapshot snap (a cache_save of n_tok tokens without a page copy). */
static int bsave(tl_backend *b, int slot, int n_tok, int snap) {
    char err[256];
    tl_pc_io io = {
        .n_tok = n_tok, .n_full = n_tok / P, .part_src = -1, .part_dst = -1, .snap = snap};
    int rc = b->cache_save(b, slot, &io, err, sizeof err);
    if (rc) fprintf(stderr, "cache_save: %s\n", err);
    return rc;
}

/* Backend level, CPU: one forward of [0, N) with the point S inside writes the snapshot that
 * [0, S), a save, then [S, N) write, bit for bit (S on a page boundary, inside a page, one token
 * in, one before the end), and ends in the same state with the same logits. The snapshots are
 * written straight through the backend (the engine's cache holds none yet: fresh engine). */
static void test_backend_in_step_snapshot(void) {
    tl_engine *e = open_engine(2, 0);
    if (!e) {
        CHECK(0);
        return;
    }
    tl_backend *b = tl_engine_backend_impl(e);
    int V = tl_engine_config(e)->n_vocab, N = 230;
    size_t sb = b->pc_snap_bytes;
    int32_t t[230];
    uint64_t s = 99;
    rand_tokens(t, N, V, &s);
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    int at[] = {128, 200, 1, 229, 70};
    for (int k = 0; k < 5; k++) {
        int S = at[k];
        CHECK_EQ_INT(bfwd(b, 0, t, 0, N, S, 0, la), 0);
        CHECK_EQ_INT(bfwd(b, 1, t, 0, S, 0, 0, NULL), 0);
        CHECK_EQ_INT(bsave(b, 1, S, 1), 0);
        CHECK_EQ_INT(bfwd(b, 1, t, S, N - S, 0, 0, lb), 0);
        const void *a = tl_backend_cpu_snapshot(b, 0), *z = tl_backend_cpu_snapshot(b, 1);
        CHECK(a && z && !memcmp(a, z, sb));                /* the snapshot, bit for bit */
        CHECK(!memcmp(la, lb, sizeof(float) * (size_t)V)); /* the logits at N - 1 */
        CHECK_EQ_INT(bsave(b, 0, N, 2), 0);
        CHECK_EQ_INT(bsave(b, 1, N, 3), 0);
        CHECK(!memcmp(tl_backend_cpu_snapshot(b, 2), tl_backend_cpu_snapshot(b, 3), sb));
        CHECK(memcmp(a, tl_backend_cpu_snapshot(b, 2), sb) != 0); /* the state moved on */
        CHECK_EQ_INT(b->reset_slot(b, 0), 0);
        CHECK_EQ_INT(b->reset_slot(b, 1), 0);
    }
    /* a point not inside the entry is refused */
    CHECK_EQ_INT(bfwd(b, 0, t, 0, 10, 10, 0, NULL), TL_ERR_INVALID);
    CHECK_EQ_INT(b->reset_slot(b, 0), 0);
    free(la), free(lb);
    tl_engine_close(e);
}

/* Engine level: a prompt fed in steps that carry snapshot points inside them (tl_batch_entry
 * snap_at, the scheduler's way) leaves snapshots that later prompts hit, with the logits and
 * greedy tokens of computing everything, bit for bit; the stats count each in-step save; a
 * point outside the entry fails the step with TL_ERR_INVALID and changes nothing. */
static void test_engine_in_step_snapshot(void) {
    tl_engine *e = open_engine(2, 0);
    if (!e) {
        CHECK(0);
        return;
    }
    int V = tl_engine_config(e)->n_vocab;
    char err[256];
    int32_t t[300], ta[GEN], tb[GEN];
    float *la = malloc(sizeof(float) * V * GEN), *lb = malloc(sizeof(float) * V * GEN);
    uint64_t s = 31;
    rand_tokens(t, 300, V, &s);
    tl_session *ss = NULL;
    CHECK_EQ_INT(tl_session_open(e, &ss, err, sizeof err), 0);
    tl_batch_entry bad = {.sess = ss, .tokens = t, .n_tok = 100, .snap_at = 100};
    CHECK_EQ_INT(tl_engine_step(e, &bad, 1, err, sizeof err), TL_ERR_INVALID);
    CHECK_EQ_INT(tl_session_n_past(ss), 0);
    /* [0, 150) with a point at 128 (a page boundary), [150, 260) with one at 203 (in a page) */
    tl_batch_entry b1 = {.sess = ss, .tokens = t, .n_tok = 150, .snap_at = 128};
    tl_batch_entry b2 = {.sess = ss, .tokens = t + 150, .n_tok = 110, .snap_at = 203};
    CHECK_EQ_INT(tl_engine_step(e, &b1, 1, err, sizeof err), 0);
    CHECK_EQ_INT(tl_engine_step(e, &b2, 1, err, sizeof err), 0);
    CHECK_EQ_INT(tl_session_n_past(ss), 260);
    tl_session_close(ss);
    tl_prefix_stats st;
    CHECK_EQ_INT(tl_engine_prefix_stats(e, &st), 0);
    CHECK_EQ_INT(st.saves, 2);
    CHECK_EQ_INT(st.snapshots, 2);
    int lens[] = {280, 180, 129}, wants[] = {203, 128, 128};
    for (int k = 0; k < 3; k++) {
        uncached(e, t, lens[k], GEN, ta, la);
        cached(e, NULL, t, lens[k], wants[k], GEN, tb, lb);
        CHECK(!memcmp(ta, tb, sizeof ta));
        CHECK(!memcmp(la, lb, sizeof(float) * (size_t)V * GEN));
    }
    free(la), free(lb);
    tl_engine_close(e);
}

int main(void) {
    T_RUN(test_layout);
    T_RUN(test_chain_and_partial);
    T_RUN(test_sharing);
    T_RUN(test_salt);
    T_RUN(test_lru);
    T_RUN(test_random_stress);
    T_RUN(test_engine_cached_equals_uncached);
    T_RUN(test_engine_sharing);
    T_RUN(test_engine_salt);
    T_RUN(test_engine_off);
    T_RUN(test_engine_eviction_stress);
    T_RUN(test_backend_in_step_snapshot);
    T_RUN(test_engine_in_step_snapshot);
    return t_summary();
}
