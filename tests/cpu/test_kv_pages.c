/* The paged KV cache's host bookkeeping (src/engine/kv_pages.h): long random sequences of reserve
 * and release checked after every operation against two references written here, a page-count
 * model (a slot holds ceil(L / page_tokens) pages, L the longest length reserved since its last
 * release) and a transcription of the CUDA backend's allocator the module was extracted from
 * (cuda_forward.cu kv_reserve, cuda_runtime.cu cb_reset_slot and the pool setup, at 48db703),
 * plus ownership invariants, the all-or-nothing rule, old_np, bad arguments, caller-provided
 * table storage and page reuse. */
#include "common/status.h"
#include "engine/kv_pages.h"
#include "t_check.h"

/* ---- references ---- */

static long pages_of(long len, int pt) { return (len + pt - 1) / pt; }

/* The page-count model (maxlen, n_free) and the original allocator's exact state (np, table,
 * free stack), which must agree with each other and with the module. */
typedef struct ref_pool {
    int n_page, max_seqs, max_pages, pt;
    long *maxlen; /* [max_seqs] longest length reserved since the last release */
    int n_free;   /* pages in the pool */
    int *np;      /* [max_seqs] original allocator: pages per slot */
    int32_t *table;
    int *free_pg, top;
} ref_pool;

static void ref_init(ref_pool *r, int n_page, int max_seqs, int max_pages, int pt) {
    r->n_page = n_page, r->max_seqs = max_seqs, r->max_pages = max_pages, r->pt = pt;
    r->maxlen = calloc((size_t)max_seqs, sizeof(long));
    r->np = calloc((size_t)max_seqs, sizeof(int));
    r->table = calloc((size_t)max_seqs * max_pages, sizeof(int32_t));
    r->free_pg = calloc((size_t)n_page + 1, sizeof(int));
    /* cuda_runtime.cu: free_pg[i] = n_page - 1 - i, page 0 on top */
    for (int i = 0; i < n_page; i++) r->free_pg[i] = n_page - 1 - i;
    r->top = n_page, r->n_free = n_page;
}

static void ref_free(ref_pool *r) {
    free(r->maxlen), free(r->np), free(r->table), free(r->free_pg);
}

/* Pages the call needs by the count model: per distinct slot, the growth of its page count. */
static long model_need(const ref_pool *r, const int *slot, const int *len, int n) {
    long need = 0;
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int j = 0; j < i; j++) first &= slot[j] != slot[i];
        if (!first) continue;
        long m = r->maxlen[slot[i]];
        for (int j = i; j < n; j++)
            if (slot[j] == slot[i] && len[j] > m) m = len[j];
        need += pages_of(m, r->pt) - pages_of(r->maxlen[slot[i]], r->pt);
    }
    return need;
}

/* A successful reserve: the model's lengths grow; the original kv_reserve's second loop. */
static void ref_reserve(ref_pool *r, const int *slot, const int *len, int n) {
    for (int i = 0; i < n; i++) {
        if (len[i] > r->maxlen[slot[i]]) r->maxlen[slot[i]] = len[i];
        int s = slot[i], have = r->np[s], want = (int)pages_of(len[i], r->pt);
        if (want <= have) continue;
        int32_t *row = r->table + (size_t)s * r->max_pages;
        for (int j = have; j < want; j++) row[j] = r->free_pg[--r->top];
        r->np[s] = want;
    }
}

/* cb_reset_slot */
static void ref_release(ref_pool *r, int s) {
    if (s < 0 || s >= r->max_seqs) return;
    int32_t *row = r->table + (size_t)s * r->max_pages;
    r->n_free += (int)pages_of(r->maxlen[s], r->pt);
    for (int i = r->np[s] - 1; i >= 0; i--) r->free_pg[r->top++] = row[i];
    r->np[s] = 0, r->maxlen[s] = 0;
}

/* ---- checks ---- */

/* Every page id in [0, n_page) is held by exactly one slot or free, never both. */
static void check_ownership(const tl_kv_pages *p) {
    int *seen = calloc((size_t)p->n_page + 1, sizeof(int));
    int bad = 0, held = 0;
    for (int s = 0; s < p->max_seqs; s++) {
        CHECK(p->np[s] >= 0 && p->np[s] <= p->max_pages);
        for (int k = 0; k < p->np[s] && k < p->max_pages; k++, held++) {
            int32_t id = p->table[(size_t)s * p->max_pages + k];
            if (id < 0 || id >= p->n_page)
                bad++;
            else
                seen[id]++;
        }
    }
    CHECK(p->n_free >= 0 && p->n_free <= p->n_page);
    for (int i = 0; i < p->n_free && i < p->n_page; i++) {
        int id = p->free_pg[i];
        if (id < 0 || id >= p->n_page)
            bad++;
        else
            seen[id]++;
    }
    for (int i = 0; i < p->n_page; i++) bad += seen[i] != 1;
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(held + p->n_free, p->n_page);
    free(seen);
}

static void check_against_ref(const tl_kv_pages *p, const ref_pool *r) {
    CHECK_EQ_INT(p->n_free, r->n_free);
    CHECK_EQ_INT(r->top, r->n_free); /* the two references agree */
    int bad_np = 0, bad_row = 0, bad_free = 0;
    for (int s = 0; s < p->max_seqs; s++) {
        bad_np += p->np[s] != pages_of(r->maxlen[s], r->pt) || p->np[s] != r->np[s];
        for (int k = 0; k < r->np[s] && k < p->max_pages; k++)
            bad_row +=
                p->table[(size_t)s * p->max_pages + k] != r->table[(size_t)s * r->max_pages + k];
    }
    for (int i = 0; i < r->top && i < p->n_free; i++) bad_free += p->free_pg[i] != r->free_pg[i];
    CHECK_EQ_INT(bad_np, 0);
    CHECK_EQ_INT(bad_row, 0);
    CHECK_EQ_INT(bad_free, 0);
}

typedef struct snap {
    int32_t *table;
    int *np, *free_pg, n_free;
} snap;

static snap snap_take(const tl_kv_pages *p) {
    size_t nt = (size_t)p->max_seqs * p->max_pages;
    snap s = {malloc(nt * sizeof(int32_t)), malloc((size_t)p->max_seqs * sizeof(int)),
              malloc(((size_t)p->n_page + 1) * sizeof(int)), p->n_free};
    memcpy(s.table, p->table, nt * sizeof(int32_t));
    memcpy(s.np, p->np, (size_t)p->max_seqs * sizeof(int));
    memcpy(s.free_pg, p->free_pg, (size_t)p->n_page * sizeof(int));
    return s;
}

/* Nothing changed: the whole table (stale cells too), every np, the free list. */
static int snap_same(const snap *s, const tl_kv_pages *p) {
    size_t nt = (size_t)p->max_seqs * p->max_pages;
    return s->n_free == p->n_free && !memcmp(s->table, p->table, nt * sizeof(int32_t)) &&
           !memcmp(s->np, p->np, (size_t)p->max_seqs * sizeof(int)) &&
           !memcmp(s->free_pg, p->free_pg, (size_t)p->n_page * sizeof(int));
}

static void snap_free(snap *s) { free(s->table), free(s->np), free(s->free_pg); }

/* After a successful reserve: old_np[i] is slot[i]'s page count after entries 0..i-1 (by the
 * count model), and every table cell that changed lies in some [old_np[i], np[slot[i]]). */
static void check_old_np(const tl_kv_pages *p, const snap *before, const int *slot, const int *len,
                         int n, const int *old_np) {
    int bad_old = 0, bad_cell = 0;
    int *cur = malloc((size_t)p->max_seqs * sizeof(int));
    memcpy(cur, before->np, (size_t)p->max_seqs * sizeof(int));
    for (int i = 0; i < n; i++) {
        bad_old += old_np[i] != cur[slot[i]];
        int want = (int)pages_of(len[i], p->page_tokens);
        if (want > cur[slot[i]]) cur[slot[i]] = want;
    }
    for (int s = 0; s < p->max_seqs; s++)
        for (int k = 0; k < p->max_pages; k++) {
            size_t c = (size_t)s * p->max_pages + k;
            if (p->table[c] == before->table[c]) continue;
            int inside = 0;
            for (int i = 0; i < n; i++) inside |= slot[i] == s && old_np[i] <= k && k < p->np[s];
            bad_cell += !inside;
        }
    CHECK_EQ_INT(bad_old, 0);
    CHECK_EQ_INT(bad_cell, 0);
    free(cur);
}

/* ---- the random walk ---- */

static int rnd(unsigned long long *s, int n) { return (int)(t_rng_next(s) % (unsigned)n); }

/* A length for slot s: mostly growing a little (decode) or by a chunk, sometimes not growing,
 * sometimes a jump, sometimes exactly the largest allowed. */
static int pick_len(unsigned long long *rs, const ref_pool *r, int s) {
    int cap = r->max_pages * r->pt, L = (int)r->maxlen[s], k = rnd(rs, 20), len;
    if (k < 6)
        len = L + 1;
    else if (k < 10)
        len = L + rnd(rs, 3 * r->pt + 1);
    else if (k < 13)
        len = rnd(rs, L + 1);
    else if (k < 15)
        len = L;
    else if (k < 18)
        len = rnd(rs, cap + 1);
    else
        len = cap;
    return len > cap ? cap : len;
}

typedef struct walk_cfg {
    int n_page, max_seqs, max_pages, pt, n_ops, caller_table;
    unsigned long long seed;
} walk_cfg;

typedef struct walk_stats {
    int ok, full, invalid, release, dup;
} walk_stats;

/* A call with one bad entry: TL_ERR_INVALID, nothing changed. */
static void op_invalid(tl_kv_pages *p, const ref_pool *r, unsigned long long *rs, int *slot,
                       int *len, int n) {
    int j = rnd(rs, n), kind = rnd(rs, 4), old_np[8];
    if (kind == 0)
        slot[j] = -1 - rnd(rs, 3);
    else if (kind == 1)
        slot[j] = r->max_seqs + rnd(rs, 3);
    else if (kind == 2)
        len[j] = r->max_pages * r->pt + 1 + rnd(rs, 3 * r->pt);
    else
        len[j] = -1 - rnd(rs, 5);
    snap before = snap_take(p);
    char err[256] = "";
    int st = tl_kv_pages_reserve(p, slot, len, n, rnd(rs, 2) ? old_np : NULL, err, sizeof err);
    CHECK_EQ_INT(st, TL_ERR_INVALID);
    CHECK(err[0] != 0);
    CHECK(snap_same(&before, p));
    snap_free(&before);
}

static void op_reserve(tl_kv_pages *p, ref_pool *r, unsigned long long *rs, walk_stats *ws) {
    int n = rnd(rs, 7), slot[8], len[8], old_np[8], dup = 0;
    for (int i = 0; i < n; i++) {
        int rep = i > 0 && rnd(rs, 10) < 3;
        slot[i] = rep ? slot[rnd(rs, i)] : rnd(rs, r->max_seqs);
        dup |= rep;
        len[i] = pick_len(rs, r, slot[i]);
    }
    if (n > 0 && rnd(rs, 12) == 0) {
        op_invalid(p, r, rs, slot, len, n);
        ws->invalid++;
        return;
    }
    long need = model_need(r, slot, len, n);
    snap before = snap_take(p);
    char err[256] = "";
    int use_old = rnd(rs, 3) != 0;
    for (int i = 0; i < 8; i++) old_np[i] = -99;
    int st = tl_kv_pages_reserve(p, slot, len, n, use_old ? old_np : NULL, err, sizeof err);
    if (need > r->n_free) {
        CHECK_EQ_INT(st, TL_ERR_CONTEXT_FULL);
        CHECK(err[0] != 0);
        CHECK(snap_same(&before, p));
        ws->full++;
    } else {
        CHECK_EQ_INT(st, 0);
        if (use_old) check_old_np(p, &before, slot, len, n, old_np);
        ref_reserve(r, slot, len, n);
        r->n_free -= (int)need;
        ws->ok++, ws->dup += dup;
    }
    snap_free(&before);
}

static void op_release(tl_kv_pages *p, ref_pool *r, unsigned long long *rs, walk_stats *ws) {
    int s = rnd(rs, 25) == 0 ? (rnd(rs, 2) ? -1 : r->max_seqs) : rnd(rs, r->max_seqs);
    snap before = snap_take(p);
    int empty = s < 0 || s >= r->max_seqs || r->maxlen[s] == 0;
    tl_kv_pages_release(p, s);
    if (empty) CHECK(snap_same(&before, p)); /* out of range or holding nothing: a no-op */
    ref_release(r, s);
    ws->release++;
    snap_free(&before);
}

static walk_stats run_walk(const walk_cfg *c) {
    walk_stats ws = {0};
    size_t nt = (size_t)c->max_seqs * c->max_pages;
    int32_t *buf = c->caller_table ? malloc(nt * sizeof(int32_t)) : NULL;
    for (size_t i = 0; buf && i < nt; i++) buf[i] = -7;
    tl_kv_pages p;
    char err[256];
    int st =
        tl_kv_pages_init(&p, c->n_page, c->max_seqs, c->max_pages, c->pt, buf, err, sizeof err);
    CHECK_EQ_INT(st, 0);
    if (st) return ws;
    if (buf) CHECK(p.table == buf);
    ref_pool r;
    ref_init(&r, c->n_page, c->max_seqs, c->max_pages, c->pt);
    unsigned long long rs = c->seed * 0x9E3779B97F4A7C15ull + 1;
    for (int op = 0; op < c->n_ops; op++) {
        int before = t_fail_checks;
        if (rnd(&rs, 10) < 7)
            op_reserve(&p, &r, &rs, &ws);
        else
            op_release(&p, &r, &rs, &ws);
        check_ownership(&p);
        check_against_ref(&p, &r);
        if (t_fail_checks != before) {
            fprintf(stderr, "  walk seed %llu: first failure at op %d\n", c->seed, op);
            break;
        }
    }
    tl_kv_pages_free(&p);
    ref_free(&r);
    free(buf); /* still ours: tl_kv_pages_free must not have freed it (ASan would say so) */
    return ws;
}

static void test_random_walks(void) {
    static const walk_cfg cfgs[] = {
        {40, 6, 12, 8, 6000, 0, 1},    {200, 16, 32, 64, 6000, 1, 2}, {5, 3, 4, 1, 4000, 0, 3},
        {64, 8, 8, 16, 4000, 1, 4},    {1, 2, 3, 5, 2000, 0, 5},      {0, 2, 2, 4, 500, 1, 6},
        {300, 16, 64, 64, 8000, 0, 7}, {17, 4, 9, 3, 5000, 1, 8},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        const walk_cfg *c = &cfgs[i];
        walk_stats ws = run_walk(c);
        /* the walk reached every kind of operation it was meant to */
        CHECK(ws.ok > c->n_ops / 10);
        CHECK(ws.invalid > 0);
        CHECK(ws.release > c->n_ops / 10);
        CHECK(ws.dup > 0);
        if (c->n_page < c->max_seqs * c->max_pages)
            CHECK(ws.full > 0);
        else
            CHECK_EQ_INT(ws.full, 0); /* a pool for every slot at full length never fills */
    }
}

/* ---- targeted cases ---- */

static void test_init_args(void) {
    tl_kv_pages p;
    char err[256];
    static const int bad[][4] = {{-1, 2, 2, 4}, {4, 0, 2, 4}, {4, 2, 0, 4}, {4, 2, 2, 0}};
    for (int i = 0; i < 4; i++) {
        err[0] = 0;
        CHECK_EQ_INT(
            tl_kv_pages_init(&p, bad[i][0], bad[i][1], bad[i][2], bad[i][3], NULL, err, sizeof err),
            TL_ERR_INVALID);
        CHECK(err[0] != 0);
    }
    /* NULL table: allocated, zero pages held, every page free, page 0 handed out first */
    CHECK_EQ_INT(tl_kv_pages_init(&p, 6, 3, 4, 10, NULL, err, sizeof err), 0);
    CHECK(p.table != NULL);
    CHECK_EQ_INT(p.n_free, 6);
    for (int s = 0; s < 3; s++) CHECK_EQ_INT(p.np[s], 0);
    int slot[] = {1}, len[] = {25}, old_np[1];
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, len, 1, old_np, err, sizeof err), 0);
    CHECK_EQ_INT(old_np[0], 0);
    CHECK_EQ_INT(p.np[1], 3);
    for (int k = 0; k < 3; k++) CHECK_EQ_INT(p.table[1 * 4 + k], k);
    check_ownership(&p);
    tl_kv_pages_free(&p);
}

static void test_caller_table(void) {
    int32_t buf[3 * 4];
    for (int i = 0; i < 12; i++) buf[i] = -5;
    tl_kv_pages p;
    char err[256];
    CHECK_EQ_INT(tl_kv_pages_init(&p, 10, 3, 4, 2, buf, err, sizeof err), 0);
    CHECK(p.table == buf);
    int slot[] = {2, 0}, len[] = {7, 3};
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, len, 2, NULL, err, sizeof err), 0);
    /* written into the caller's storage: slot 2 gets pages 0..3, slot 0 pages 4, 5 */
    static const int32_t want2[] = {0, 1, 2, 3}, want0[] = {4, 5};
    for (int k = 0; k < 4; k++) CHECK_EQ_INT(buf[2 * 4 + k], want2[k]);
    for (int k = 0; k < 2; k++) CHECK_EQ_INT(buf[0 * 4 + k], want0[k]);
    for (int k = 0; k < 4; k++) CHECK_EQ_INT(buf[1 * 4 + k], -5); /* slot 1 untouched */
    check_ownership(&p);
    tl_kv_pages_free(&p); /* must not free buf (a stack array: ASan would report it) */
    CHECK_EQ_INT(buf[2 * 4 + 3], 3);
}

static void test_release_and_reuse(void) {
    tl_kv_pages p;
    char err[256];
    CHECK_EQ_INT(tl_kv_pages_init(&p, 8, 3, 8, 4, NULL, err, sizeof err), 0);
    snap s0 = snap_take(&p);
    tl_kv_pages_release(&p, 1); /* empty slot */
    tl_kv_pages_release(&p, -1);
    tl_kv_pages_release(&p, 3);
    CHECK(snap_same(&s0, &p));
    snap_free(&s0);
    int slot[] = {0}, len[] = {32}; /* all 8 pages */
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, len, 1, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(p.n_free, 0);
    int slot1[] = {1}, len1[] = {1};
    err[0] = 0;
    snap s1 = snap_take(&p);
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot1, len1, 1, NULL, err, sizeof err),
                 TL_ERR_CONTEXT_FULL);
    CHECK(err[0] != 0);
    CHECK(snap_same(&s1, &p));
    snap_free(&s1);
    int32_t held[8];
    memcpy(held, p.table, sizeof held);
    tl_kv_pages_release(&p, 0);
    CHECK_EQ_INT(p.np[0], 0);
    CHECK_EQ_INT(p.n_free, 8);
    /* the released pages come back in their old order (cb_reset_slot pushes row[0] last) */
    int len2[] = {20}, old_np[1];
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot1, len2, 1, old_np, err, sizeof err), 0);
    CHECK_EQ_INT(old_np[0], 0);
    CHECK_EQ_INT(p.np[1], 5);
    for (int k = 0; k < 5; k++) CHECK_EQ_INT(p.table[1 * 8 + k], held[k]);
    check_ownership(&p);
    tl_kv_pages_free(&p);
}

/* Truncation (a rolled-back verify): the slot keeps the pages of its first len positions, in
 * place; the rest return to the pool; growing again takes free pages. */
static void test_truncate(void) {
    tl_kv_pages p;
    char err[256];
    CHECK_EQ_INT(tl_kv_pages_init(&p, 8, 2, 8, 4, NULL, err, sizeof err), 0);
    int slot[] = {0}, len[] = {21}; /* 6 pages */
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, len, 1, NULL, err, sizeof err), 0);
    int32_t held[6];
    memcpy(held, p.table, sizeof held);
    tl_kv_pages_truncate(&p, 0, 17); /* 5 pages */
    CHECK_EQ_INT(p.np[0], 5);
    CHECK_EQ_INT(p.n_free, 3);
    tl_kv_pages_truncate(&p, 0, 20); /* still 5 */
    CHECK_EQ_INT(p.np[0], 5);
    tl_kv_pages_truncate(&p, 0, 30); /* never grows */
    CHECK_EQ_INT(p.np[0], 5);
    tl_kv_pages_truncate(&p, 0, 9); /* 3 pages */
    CHECK_EQ_INT(p.np[0], 3);
    CHECK_EQ_INT(p.n_free, 5);
    for (int k = 0; k < 3; k++) CHECK_EQ_INT(p.table[k], held[k]);
    tl_kv_pages_truncate(&p, 5, 0); /* bad slot: nothing */
    CHECK_EQ_INT(p.n_free, 5);
    check_ownership(&p);
    tl_kv_pages_free(&p);
}

/* A slot repeated in one call: the longest length counts (the original kv_reserve counted every
 * entry's growth and would have refused {35, 35, 20} in a pool of 4 pages). */
static void test_repeated_slot(void) {
    tl_kv_pages p;
    char err[256];
    CHECK_EQ_INT(tl_kv_pages_init(&p, 4, 2, 4, 10, NULL, err, sizeof err), 0);
    int slot[] = {0, 0, 0}, len[] = {35, 35, 20}, old_np[3];
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, len, 3, old_np, err, sizeof err), 0);
    CHECK_EQ_INT(p.np[0], 4);
    CHECK_EQ_INT(old_np[0], 0);
    CHECK_EQ_INT(old_np[1], 4);
    CHECK_EQ_INT(old_np[2], 4);
    tl_kv_pages_release(&p, 0);
    int len2[] = {10, 40}, old2[2];
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, len2, 2, old2, err, sizeof err), 0);
    CHECK_EQ_INT(old2[0], 0);
    CHECK_EQ_INT(old2[1], 1);
    CHECK_EQ_INT(p.np[0], 4);
    check_ownership(&p);
    /* a call that grows slot 0 three times and slot 1 once, one page short: refused, and the
     * rollback restores slot 0's count from before its first entry */
    tl_kv_pages_release(&p, 0);
    int l3[] = {10};
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, l3, 1, NULL, err, sizeof err), 0);
    int slot4[] = {0, 0, 1, 0}, l4[] = {20, 40, 1, 30};
    snap s = snap_take(&p);
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot4, l4, 4, NULL, err, sizeof err), TL_ERR_CONTEXT_FULL);
    CHECK(snap_same(&s, &p));
    CHECK_EQ_INT(p.np[0], 1);
    snap_free(&s);
    int l5[] = {20, 40, 30}, old5[3];
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, l5, 3, old5, err, sizeof err), 0);
    CHECK_EQ_INT(p.np[0], 4);
    CHECK_EQ_INT(old5[0], 1);
    CHECK_EQ_INT(old5[1], 2);
    CHECK_EQ_INT(old5[2], 4);
    CHECK_EQ_INT(p.n_free, 0);
    check_ownership(&p);
    tl_kv_pages_free(&p);
}

/* All or nothing across slots, the message naming the pages needed, empty calls, boundaries. */
static void test_all_or_nothing(void) {
    tl_kv_pages p;
    char err[256];
    CHECK_EQ_INT(tl_kv_pages_init(&p, 5, 3, 4, 10, NULL, err, sizeof err), 0);
    int slot[] = {0, 1}, len[] = {30, 21}, old_np[2] = {-9, -9};
    snap s = snap_take(&p);
    err[0] = 0;
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, len, 2, old_np, err, sizeof err),
                 TL_ERR_CONTEXT_FULL);
    CHECK(snap_same(&s, &p));
    CHECK(strstr(err, " 6 ") != NULL); /* needs 6 pages; 5 of 5 free */
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, len, 0, NULL, err, sizeof err), 0);
    CHECK(snap_same(&s, &p));
    int zero[] = {0, 0};
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, slot, zero, 2, old_np, err, sizeof err), 0);
    CHECK(snap_same(&s, &p));
    snap_free(&s);
    int s2[] = {2}, full[] = {40}, over[] = {41};
    s = snap_take(&p);
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, s2, over, 1, NULL, err, sizeof err), TL_ERR_INVALID);
    CHECK(snap_same(&s, &p));
    snap_free(&s);
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, s2, full, 1, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(p.np[2], 4);
    CHECK_EQ_INT(p.n_free, 1);
    check_ownership(&p);
    tl_kv_pages_free(&p);
}

/* Sharing (the prefix cache's use, kv_pages.h): a hand-worked sequence of hold, map, take,
 * release and unhold with the references, free and idle counts after each, and the reclaim hook:
 * called with the pages needed when the free ones are short but the idle ones would do, not
 * called when even they would not. */
typedef struct {
    tl_kv_pages *p;
    int calls, last_need;
    int32_t drop[4];
    int n_drop;
} reclaim_log;

static void reclaim_cb(void *ctx, int need) {
    reclaim_log *r = ctx;
    r->calls++, r->last_need = need;
    while (r->n_drop > 0 && r->p->n_free < need) tl_kv_pages_unhold(r->p, r->drop[--r->n_drop]);
}

static void test_sharing(void) {
    tl_kv_pages p;
    char err[256];
    CHECK_EQ_INT(tl_kv_pages_init(&p, 6, 3, 4, 10, NULL, err, sizeof err), 0);
    reclaim_log rl = {.p = &p};
    p.reclaim = reclaim_cb, p.reclaim_ctx = &rl;
    int s0 = 0, l0 = 25;
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, &s0, &l0, 1, NULL, err, sizeof err), 0); /* 3 pages */
    int32_t a = p.table[0], b = p.table[1];
    tl_kv_pages_hold(&p, a), tl_kv_pages_hold(&p, b); /* the cache shares slot 0's pages */
    CHECK(p.refs[a] == 2 && p.refs[b] == 2 && p.n_idle == 0 && p.n_free == 3);
    int32_t c = tl_kv_pages_take(&p); /* a page of the cache's own: idle */
    CHECK(c >= 0 && p.refs[c] == 1 && p.held[c] && p.n_idle == 1 && p.n_free == 2);
    int32_t ids[2] = {a, b};
    CHECK_EQ_INT(tl_kv_pages_map(&p, 1, ids, 2, err, sizeof err), 0);
    CHECK(p.np[1] == 2 && p.table[4] == a && p.table[5] == b && p.refs[a] == 3);
    CHECK(tl_kv_pages_map(&p, 1, ids, 2, err, sizeof err) == TL_ERR_INVALID); /* not empty */
    int32_t bad[1] = {p.free_pg[0]};
    CHECK(tl_kv_pages_map(&p, 2, bad, 1, err, sizeof err) == TL_ERR_INVALID); /* a free page */
    tl_kv_pages_release(&p, 0);
    CHECK(p.refs[a] == 2 && p.n_free == 3 && p.n_idle == 1); /* slot 0's third page came back */
    tl_kv_pages_release(&p, 1);
    CHECK(p.refs[a] == 1 && p.n_idle == 3 && p.n_free == 3 && tl_kv_pages_available(&p) == 6);
    /* 4 pages for slot 2: one short, the hook drops c (the last listed) and that is enough */
    rl.drop[0] = a, rl.drop[1] = b, rl.drop[2] = c, rl.n_drop = 3;
    int s2 = 2, l2 = 40;
    CHECK_EQ_INT(tl_kv_pages_reserve(&p, &s2, &l2, 1, NULL, err, sizeof err), 0);
    CHECK(rl.calls == 1 && rl.last_need == 4 && rl.n_drop == 2 && !p.held[c]);
    CHECK(p.n_free == 0 && p.n_idle == 2);
    /* 3 more than available: no call, nothing changes */
    int s1 = 1, l1 = 30;
    CHECK(tl_kv_pages_reserve(&p, &s1, &l1, 1, NULL, err, sizeof err) == TL_ERR_CONTEXT_FULL);
    CHECK(rl.calls == 1 && p.n_idle == 2);
    tl_kv_pages_unhold(&p, a), tl_kv_pages_unhold(&p, b);
    tl_kv_pages_release(&p, 2);
    CHECK(p.n_free == 6 && p.n_idle == 0);
    check_ownership(&p);
    tl_kv_pages_free(&p);
}

int main(void) {
    T_RUN(test_sharing);
    T_RUN(test_truncate);
    T_RUN(test_init_args);
    T_RUN(test_caller_table);
    T_RUN(test_release_and_reuse);
    T_RUN(test_repeated_slot);
    T_RUN(test_all_or_nothing);
    T_RUN(test_random_walks);
    return t_summary();
}
