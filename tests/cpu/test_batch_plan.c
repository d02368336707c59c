/* Micro-batch planning of a backend step (src/engine/batch_plan.h): the packing iterator against
 * a transcription of the CUDA backend's original two-pass loop (cuda_forward.cu forward_impl at
 * 48db703) on random batches, plus its invariants; tl_mb_fill's metadata against an independent
 * computation (and the logits rows the backend writes: out_row0 + k for output k); the kinds and
 * split counts on table-driven cases and against the original micro_step's formulas. */
#include "common/util.h"
#include "engine/batch_plan.h"
#include "t_check.h"

/* ---- plans: a list of micro-batches, each a run of segments ---- */

typedef struct plan {
    int n_mb, n_segs, cap;
    int *first; /* [n_mb + 1] micro-batch b holds segs[first[b] .. first[b+1]) */
    tl_mb_seg *segs;
} plan;

static void plan_init(plan *pl, int cap) {
    pl->n_mb = 0, pl->n_segs = 0, pl->cap = cap;
    pl->first = calloc((size_t)cap + 1, sizeof(int));
    pl->segs = calloc((size_t)cap, sizeof(tl_mb_seg));
}

static void plan_free(plan *pl) { free(pl->first), free(pl->segs); }

/* Appends a micro-batch; 0 when the plan is full (a runaway iterator). */
static int plan_add(plan *pl, const tl_mb_seg *segs, int n_seg) {
    if (pl->n_mb >= pl->cap || pl->n_segs + n_seg > pl->cap) return 0;
    memcpy(pl->segs + pl->n_segs, segs, (size_t)n_seg * sizeof *segs);
    pl->n_segs += n_seg;
    pl->first[++pl->n_mb] = pl->n_segs;
    return 1;
}

/* The original forward_impl packing loop, with be->max_tok = max_tok, be->max_seqs = max_seg,
 * be->pf_ok = long_min > 0, CB_PF_MIN = long_min, and micro_step = plan_add. */
static void ref_pack(const int *n_tok, int n, int max_tok, int max_seg, int long_min, plan *pl) {
    tl_mb_seg *segs = malloc((size_t)max_seg * sizeof *segs);
    int n_seg = 0, T = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            int big = long_min > 0 && n_tok[i] >= long_min;
            if (big != pass) continue;
            if (big && n_seg > 0) {
                plan_add(pl, segs, n_seg);
                n_seg = 0, T = 0;
            }
            int off = 0;
            while (off < n_tok[i]) {
                int take = TL_MIN(n_tok[i] - off, max_tok - T);
                segs[n_seg].entry = i, segs[n_seg].start = off, segs[n_seg].n = take;
                n_seg++, T += take, off += take;
                if (T == max_tok || n_seg == max_seg || big) {
                    plan_add(pl, segs, n_seg);
                    n_seg = 0, T = 0;
                }
            }
        }
    if (n_seg > 0) plan_add(pl, segs, n_seg);
    free(segs);
}

/* The module's plan; segs is exactly max_seg long so that ASan sees any overrun. */
static void mod_pack(const int *n_tok, int n, int max_tok, int max_seg, int long_min, plan *pl) {
    tl_mb_seg *segs = malloc((size_t)max_seg * sizeof *segs);
    tl_mb_iter it = tl_mb_begin(n_tok, n, max_tok, max_seg, long_min);
    int n_seg = -1, ok = 1;
    while (ok && tl_mb_next(&it, segs, &n_seg)) {
        CHECK(n_seg >= 1 && n_seg <= max_seg);
        ok = n_seg >= 1 && n_seg <= max_seg && plan_add(pl, segs, n_seg);
    }
    CHECK(ok);
    CHECK_EQ_INT(tl_mb_next(&it, segs, &n_seg), 0); /* done stays done */
    CHECK_EQ_INT(n_seg, 0);
    free(segs);
}

static int plans_equal(const plan *a, const plan *b) {
    if (a->n_mb != b->n_mb || a->n_segs != b->n_segs) return 0;
    for (int i = 0; i <= a->n_mb; i++)
        if (a->first[i] != b->first[i]) return 0;
    for (int i = 0; i < a->n_segs; i++) {
        const tl_mb_seg *x = &a->segs[i], *y = &b->segs[i];
        if (x->entry != y->entry || x->start != y->start || x->n != y->n) return 0;
    }
    return 1;
}

/* Invariants of any plan: each token of each entry exactly once and in order; at most max_tok
 * tokens and max_seg segments a micro-batch; a long entry's micro-batches hold only it; no short
 * entry after the first long micro-batch. Returns the number of violations. */
static int plan_violations(const plan *pl, const int *n_tok, int n, int max_tok, int max_seg,
                           int long_min) {
    int bad = 0, seen_long = 0;
    int *next = calloc((size_t)n, sizeof(int));
    for (int b = 0; b < pl->n_mb; b++) {
        int f = pl->first[b], ns = pl->first[b + 1] - f, T = 0, any_long = 0, any_short = 0;
        bad += ns < 1 || ns > max_seg;
        for (int k = 0; k < ns; k++) {
            const tl_mb_seg *s = &pl->segs[f + k];
            if (s->entry < 0 || s->entry >= n || s->n < 1) {
                bad++;
                continue;
            }
            bad += s->start != next[s->entry];
            next[s->entry] = s->start + s->n;
            T += s->n;
            int lg = long_min > 0 && n_tok[s->entry] >= long_min;
            any_long |= lg, any_short |= !lg;
        }
        bad += T > max_tok;
        bad += any_long && ns != 1;
        bad += any_short && seen_long;
        seen_long |= any_long;
    }
    for (int i = 0; i < n; i++) bad += next[i] != n_tok[i];
    free(next);
    return bad;
}

/* ---- random batches ---- */

static int rnd(unsigned long long *s, int n) { return (int)(t_rng_next(s) % (unsigned)n); }

static int pick_ntok(unsigned long long *rs) {
    int k = rnd(rs, 20);
    if (k < 10) return 1;
    if (k < 13) return 2 + rnd(rs, 14);
    if (k < 15) return 14 + rnd(rs, 5); /* around long_min 16 */
    if (k < 18) return 19 + rnd(rs, 600);
    return 600 + rnd(rs, 4401);
}

typedef struct batch_cfg {
    int n, max_tok, max_seg, long_min;
    int n_tok[256];
} batch_cfg;

static void pick_batch(unsigned long long *rs, batch_cfg *c) {
    static const int toks[] = {1, 2, 3, 7, 16, 64, 128, 256, 512, 2048, 4096, 8192};
    static const int segs[] = {1, 2, 3, 5, 8, 16, 64, 256, 1024};
    c->n = rnd(rs, 8) == 0 ? 1 + rnd(rs, 256) : 1 + rnd(rs, 64);
    for (int i = 0; i < c->n; i++) c->n_tok[i] = pick_ntok(rs);
    c->max_tok = rnd(rs, 3) ? toks[rnd(rs, 12)] : 1 + rnd(rs, 4096);
    c->max_seg = rnd(rs, 3) ? segs[rnd(rs, 9)] : 1 + rnd(rs, c->n + 3);
    int k = rnd(rs, 10);
    c->long_min = k < 4 ? 0 : k < 8 ? 16 : k == 8 ? 1 + rnd(rs, 3) : 1 + rnd(rs, 6000);
}

static int total_tokens(const batch_cfg *c) {
    int t = 0;
    for (int i = 0; i < c->n; i++) t += c->n_tok[i];
    return t;
}

static void test_pack_matches_original(void) {
    unsigned long long rs = 0x5eed1234ull;
    int n_long = 0, n_split_entry = 0;
    for (int iter = 0; iter < 3000; iter++) {
        batch_cfg c;
        pick_batch(&rs, &c);
        int cap = total_tokens(&c) + 2;
        plan want, got;
        plan_init(&want, cap), plan_init(&got, cap);
        ref_pack(c.n_tok, c.n, c.max_tok, c.max_seg, c.long_min, &want);
        mod_pack(c.n_tok, c.n, c.max_tok, c.max_seg, c.long_min, &got);
        int same = plans_equal(&want, &got);
        int bad = plan_violations(&got, c.n_tok, c.n, c.max_tok, c.max_seg, c.long_min);
        CHECK(same);
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(plan_violations(&want, c.n_tok, c.n, c.max_tok, c.max_seg, c.long_min), 0);
        for (int i = 0; i < c.n; i++) n_long += c.long_min > 0 && c.n_tok[i] >= c.long_min;
        n_split_entry += got.n_segs > c.n;
        plan_free(&want), plan_free(&got);
        if (!same || bad) {
            fprintf(stderr, "  batch %d: n %d max_tok %d max_seg %d long_min %d\n", iter, c.n,
                    c.max_tok, c.max_seg, c.long_min);
            break;
        }
    }
    CHECK(n_long > 1000);        /* the long path was exercised */
    CHECK(n_split_entry > 1000); /* and entries cut across micro-batches */
}

/* A plan as text: micro-batches separated by " | ", segments as entry:start+n. */
static void plan_str(const plan *pl, char *out, size_t cap) {
    size_t len = 0;
    out[0] = 0;
    for (int b = 0; b < pl->n_mb; b++)
        for (int k = pl->first[b]; k < pl->first[b + 1] && len < cap; k++) {
            const tl_mb_seg *s = &pl->segs[k];
            const char *sep = k == 0 ? "" : k == pl->first[b] ? " | " : " ";
            len +=
                (size_t)snprintf(out + len, cap - len, "%s%d:%d+%d", sep, s->entry, s->start, s->n);
        }
}

/* Hand-written plans: the flush before the first long entry, a long entry cut by max_tok, a
 * short entry cut across micro-batches, max_seg flushing, the long_min boundary. */
static void test_pack_cases(void) {
    static const struct {
        int n, n_tok[6], max_tok, max_seg, long_min;
        const char *want;
    } cases[] = {
        {4, {1, 40, 1, 5}, 16, 8, 16, "0:0+1 2:0+1 3:0+5 | 1:0+16 | 1:16+16 | 1:32+8"},
        {4, {1, 40, 1, 5}, 16, 8, 0, "0:0+1 1:0+15 | 1:15+16 | 1:31+9 2:0+1 3:0+5"},
        {4, {1, 40, 1, 5}, 64, 8, 0, "0:0+1 1:0+40 2:0+1 3:0+5"},
        {4, {1, 40, 1, 5}, 64, 2, 0, "0:0+1 1:0+40 | 2:0+1 3:0+5"},
        {5, {1, 1, 1, 1, 1}, 64, 2, 16, "0:0+1 1:0+1 | 2:0+1 3:0+1 | 4:0+1"},
        {5, {1, 1, 1, 1, 1}, 1, 8, 16, "0:0+1 | 1:0+1 | 2:0+1 | 3:0+1 | 4:0+1"},
        {3, {16, 15, 1}, 64, 8, 16, "1:0+15 2:0+1 | 0:0+16"},
        {3, {16, 15, 1}, 64, 8, 17, "0:0+16 1:0+15 2:0+1"},
        {2, {20, 17}, 64, 8, 16, "0:0+20 | 1:0+17"},
        {3, {3, 20, 3}, 4, 8, 16, "0:0+3 2:0+1 | 2:1+2 | 1:0+4 | 1:4+4 | 1:8+4 | 1:12+4 | 1:16+4"},
        {2, {5, 2}, 3, 1, 1, "0:0+3 | 0:3+2 | 1:0+2"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        plan got;
        plan_init(&got, 64);
        mod_pack(cases[k].n_tok, cases[k].n, cases[k].max_tok, cases[k].max_seg, cases[k].long_min,
                 &got);
        char str[512];
        plan_str(&got, str, sizeof str);
        CHECK_STR(str, cases[k].want);
        plan_free(&got);
    }
    /* an empty batch: no micro-batch */
    tl_mb_seg seg;
    int ns = -1;
    tl_mb_iter it = tl_mb_begin(NULL, 0, 16, 1, 16);
    CHECK_EQ_INT(tl_mb_next(&it, &seg, &ns), 0);
    CHECK_EQ_INT(ns, 0);
}

/* ---- mixed packing (tl_mb_begin_mixed) ---- */

static void mod_pack_mixed(const int *n_tok, int n, int max_tok, int max_seg, int long_min,
                           plan *pl) {
    tl_mb_seg *segs = malloc((size_t)max_seg * sizeof *segs);
    tl_mb_iter it = tl_mb_begin_mixed(n_tok, n, max_tok, max_seg, long_min);
    int n_seg = -1, ok = 1;
    while (ok && tl_mb_next(&it, segs, &n_seg))
        ok = n_seg >= 1 && n_seg <= max_seg && plan_add(pl, segs, n_seg);
    CHECK(ok);
    CHECK_EQ_INT(tl_mb_next(&it, segs, &n_seg), 0);
    free(segs);
}

/* Invariants of a mixed plan: each token of each entry once and in order; at most max_tok tokens
 * and max_seg segments a micro-batch; every short entry's tokens before every long entry's;
 * inside a micro-batch, after a segment of >= long_min tokens only such segments; and a
 * micro-batch ends only when full (max_tok or max_seg), at the end, or when the next segment is
 * a long entry's with less than long_min tokens of room. Returns the number of violations. */
static int mixed_violations(const plan *pl, const int *n_tok, int n, int max_tok, int max_seg,
                            int long_min) {
    int bad = 0, seen_long = 0;
    int *next = calloc((size_t)n, sizeof(int));
    for (int b = 0; b < pl->n_mb; b++) {
        int f = pl->first[b], ns = pl->first[b + 1] - f, T = 0, in_long = 0;
        bad += ns < 1 || ns > max_seg;
        for (int k = 0; k < ns; k++) {
            const tl_mb_seg *s = &pl->segs[f + k];
            bad += s->start != next[s->entry];
            next[s->entry] = s->start + s->n;
            T += s->n;
            int lg_entry = n_tok[s->entry] >= long_min, lg_seg = s->n >= long_min;
            bad += !lg_entry && seen_long;
            seen_long |= lg_entry;
            bad += in_long && !lg_seg;
            in_long |= lg_seg;
        }
        bad += T > max_tok;
        if (b + 1 < pl->n_mb && T < max_tok && ns < max_seg) {
            const tl_mb_seg *nx = &pl->segs[pl->first[b + 1]];
            int room = max_tok - T, rest = n_tok[nx->entry] - nx->start;
            bad += !(n_tok[nx->entry] >= long_min && TL_MIN(room, rest) < long_min);
        }
    }
    for (int i = 0; i < n; i++) bad += next[i] != n_tok[i];
    free(next);
    return bad;
}

static void test_pack_mixed(void) {
    unsigned long long rs = 0x313ed5ull;
    int n_joined = 0;
    for (int iter = 0; iter < 3000; iter++) {
        batch_cfg c;
        pick_batch(&rs, &c);
        int cap = total_tokens(&c) + 2;
        plan got;
        plan_init(&got, cap);
        mod_pack_mixed(c.n_tok, c.n, c.max_tok, c.max_seg, c.long_min, &got);
        int bad = c.long_min > 0
                      ? mixed_violations(&got, c.n_tok, c.n, c.max_tok, c.max_seg, c.long_min)
                      : 0;
        if (c.long_min == 0) { /* no long path: the same plan as unmixed */
            plan want;
            plan_init(&want, cap);
            mod_pack(c.n_tok, c.n, c.max_tok, c.max_seg, 0, &want);
            bad += !plans_equal(&want, &got);
            plan_free(&want);
        }
        for (int b = 0; b < got.n_mb && c.long_min > 0; b++) { /* short + long in one batch */
            int sh = 0, lg = 0;
            for (int k = got.first[b]; k < got.first[b + 1]; k++) {
                int big = c.n_tok[got.segs[k].entry] >= c.long_min;
                sh |= !big, lg |= big;
            }
            n_joined += sh && lg;
        }
        CHECK_EQ_INT(bad, 0);
        plan_free(&got);
        if (bad) {
            fprintf(stderr, "  batch %d: n %d max_tok %d max_seg %d long_min %d\n", iter, c.n,
                    c.max_tok, c.max_seg, c.long_min);
            break;
        }
    }
    CHECK(n_joined > 300); /* decode tokens and prefill chunks did share micro-batches */
    static const struct {
        int n, n_tok[6], max_tok, max_seg, long_min;
        const char *want;
    } cases[] = {
        /* the decodes and both prompts in one micro-batch */
        {4, {1, 40, 1, 20}, 64, 8, 16, "0:0+1 2:0+1 1:0+40 3:0+20"},
        /* room for 22 of the 40: joins; the rest starts the next micro-batch */
        {3, {1, 40, 1}, 24, 8, 16, "0:0+1 2:0+1 1:0+22 | 1:22+18"},
        /* room for 10 < 16: the micro-batch ends before the long entry */
        {3, {1, 40, 5}, 16, 8, 16, "0:0+1 2:0+5 | 1:0+16 | 1:16+16 | 1:32+8"},
        /* a long entry's short tail leads the next micro-batch, another long one joins */
        {3, {1, 40, 30}, 32, 8, 16, "0:0+1 1:0+31 | 1:31+9 2:0+23 | 2:23+7"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        plan got;
        plan_init(&got, 64);
        mod_pack_mixed(cases[k].n_tok, cases[k].n, cases[k].max_tok, cases[k].max_seg,
                       cases[k].long_min, &got);
        char str[512];
        plan_str(&got, str, sizeof str);
        CHECK_STR(str, cases[k].want);
        plan_free(&got);
    }
}

/* ---- tl_mb_fill ---- */

typedef struct fill_buf {
    tl_mb_meta m;
} fill_buf;

/* Metadata arrays of exactly max_tok / max_seg entries each (separate blocks, for ASan). */
static fill_buf fill_alloc(int max_tok, int max_seg) {
    fill_buf f;
    int32_t **tok[] = {&f.m.tokens, &f.m.tok_pos, &f.m.tok_slot, &f.m.tok_seg};
    int32_t **seg[] = {&f.m.seg_tok0, &f.m.seg_n, &f.m.seg_slot, &f.m.seg_pos0, &f.m.out_rows};
    for (int i = 0; i < 4; i++) *tok[i] = malloc((size_t)max_tok * sizeof(int32_t));
    for (int i = 0; i < 5; i++) *seg[i] = malloc((size_t)max_seg * sizeof(int32_t));
    return f;
}

static void fill_release(fill_buf *f) {
    free(f->m.tokens), free(f->m.tok_pos), free(f->m.tok_slot), free(f->m.tok_seg);
    free(f->m.seg_tok0), free(f->m.seg_n), free(f->m.seg_slot), free(f->m.seg_pos0);
    free(f->m.out_rows);
}

/* Checks one micro-batch's metadata and info against a computation from the segments; returns the
 * number of mismatches. */
static int fill_mismatches(const tl_fwd_entry *e, const tl_mb_seg *segs, int n_seg,
                           const int *row_of, const tl_mb_meta *m, const tl_mb_info *info) {
    int bad = 0, t = 0, n_out = 0, row0 = -1, single = 1, max_kv = 0;
    for (int s = 0; s < n_seg; s++) {
        const tl_fwd_entry *en = &e[segs[s].entry];
        bad += m->seg_tok0[s] != t || m->seg_n[s] != segs[s].n || m->seg_slot[s] != en->slot ||
               m->seg_pos0[s] != en->pos + segs[s].start;
        for (int j = 0; j < segs[s].n; j++, t++) {
            int p = segs[s].start + j;
            bad += m->tokens[t] != en->tokens[p] || m->tok_pos[t] != en->pos + p ||
                   m->tok_slot[t] != en->slot || m->tok_seg[t] != s;
            if (en->pos + p + 1 > max_kv) max_kv = en->pos + p + 1; /* keys 0 .. pos */
        }
        single &= segs[s].n == 1;
        if (segs[s].start + segs[s].n == en->n_tok && row_of[segs[s].entry] >= 0) {
            if (row0 < 0) row0 = row_of[segs[s].entry];
            bad += m->out_rows[n_out] != t - 1;
            n_out++;
        }
    }
    bad += info->n_tok != t || info->n_seg != n_seg || info->n_out != n_out;
    bad += info->out_row0 != (row0 < 0 ? 0 : row0);
    bad += info->all_single != single || info->max_kv != max_kv;
    return bad;
}

/* Output k of a micro-batch lands in logits row out_row0 + k (the backend's LM head writes
 * n_out consecutive rows): that must be its entry's row_of. Returns the mismatches. */
static int row_mismatches(const tl_fwd_entry *e, const tl_mb_seg *segs, int n_seg,
                          const int *row_of, const tl_mb_info *info) {
    int bad = 0, k = 0;
    for (int s = 0; s < n_seg; s++)
        if (segs[s].start + segs[s].n == e[segs[s].entry].n_tok && row_of[segs[s].entry] >= 0)
            bad += row_of[segs[s].entry] != info->out_row0 + k++;
    return bad;
}

typedef struct rand_step {
    batch_cfg c;
    tl_fwd_entry e[256];
    int32_t *toks;
    float dummy;
} rand_step;

/* Random entries: slots, positions, token ids; about half want an output row (logits set). */
static void pick_step(unsigned long long *rs, rand_step *st) {
    pick_batch(rs, &st->c);
    st->toks = malloc((size_t)total_tokens(&st->c) * sizeof(int32_t));
    int32_t *t = st->toks;
    for (int i = 0; i < st->c.n; i++) {
        tl_fwd_entry *en = &st->e[i];
        memset(en, 0, sizeof *en);
        en->slot = rnd(rs, 512), en->pos = rnd(rs, 4) ? rnd(rs, 200000) : 0;
        en->n_tok = st->c.n_tok[i], en->tokens = t;
        for (int j = 0; j < en->n_tok; j++) *t++ = rnd(rs, 248320);
        en->logits = rnd(rs, 2) ? &st->dummy : NULL;
    }
}

/* tl_mb_rows gives the entries that want logits or a sample distinct rows 0 .. n_rows-1 and the
 * others -1; returns the number of violations. */
static int rows_violations(const tl_fwd_entry *e, int n, const int *row_of, int n_rows) {
    int bad = 0, want = 0;
    int *hit = calloc((size_t)n + 1, sizeof(int));
    for (int i = 0; i < n; i++) {
        int w = e[i].logits || e[i].sample;
        want += w;
        if (!w)
            bad += row_of[i] != -1;
        else if (row_of[i] < 0 || row_of[i] >= n_rows)
            bad++;
        else
            hit[row_of[i]]++;
    }
    bad += n_rows != want;
    for (int r = 0; r < n_rows && r <= n; r++) bad += hit[r] != 1;
    free(hit);
    return bad;
}

static void test_fill(void) {
    unsigned long long rs = 0xf111ull;
    int n_out_mb = 0;
    for (int iter = 0; iter < 1500; iter++) {
        rand_step st;
        pick_step(&rs, &st);
        batch_cfg *c = &st.c;
        int row_of[256];
        for (int i = 0; i < c->n; i++) row_of[i] = rnd(&rs, 3) ? rnd(&rs, 1000) : -1;
        fill_buf fb = fill_alloc(c->max_tok, c->max_seg);
        tl_mb_seg *segs = malloc((size_t)c->max_seg * sizeof *segs);
        tl_mb_iter it = tl_mb_begin(c->n_tok, c->n, c->max_tok, c->max_seg, c->long_min);
        int ns, bad = 0;
        while (tl_mb_next(&it, segs, &ns)) {
            tl_mb_info info;
            memset(&info, 0xab, sizeof info);
            tl_mb_fill(st.e, segs, ns, row_of, &fb.m, &info);
            bad += fill_mismatches(st.e, segs, ns, row_of, &fb.m, &info);
            n_out_mb += info.n_out > 1;
        }
        CHECK_EQ_INT(bad, 0);
        free(segs), fill_release(&fb), free(st.toks);
        if (bad) break;
    }
    CHECK(n_out_mb > 100);
}

/* With rows numbered by tl_mb_rows, every micro-batch's outputs land in their own rows. (The
 * original forward_impl numbered them in entry order: see the scheduler's step below.) */
static void test_fill_rows(void) {
    unsigned long long rs = 0x0ddba11ull;
    int bad = 0;
    for (int iter = 0; iter < 1500 && !bad; iter++) {
        rand_step st;
        pick_step(&rs, &st);
        batch_cfg *c = &st.c;
        int row_of[256];
        int n_rows = tl_mb_rows(st.e, c->n, c->long_min, row_of);
        bad += rows_violations(st.e, c->n, row_of, n_rows);
        fill_buf fb = fill_alloc(c->max_tok, c->max_seg);
        tl_mb_seg *segs = malloc((size_t)c->max_seg * sizeof *segs);
        for (int mix = 0; mix < 2; mix++) { /* plain and mixed packing: the same rows */
            tl_mb_iter it =
                mix ? tl_mb_begin_mixed(c->n_tok, c->n, c->max_tok, c->max_seg, c->long_min)
                    : tl_mb_begin(c->n_tok, c->n, c->max_tok, c->max_seg, c->long_min);
            int ns;
            while (tl_mb_next(&it, segs, &ns)) {
                tl_mb_info info;
                tl_mb_fill(st.e, segs, ns, row_of, &fb.m, &info);
                bad += row_mismatches(st.e, segs, ns, row_of, &info);
            }
        }
        free(segs), fill_release(&fb), free(st.toks);
        if (bad) fprintf(stderr, "  step %d: outputs land in other entries' rows\n", iter);
    }
    CHECK_EQ_INT(bad, 0);
}

/* The scheduler's usual step: a decode, a prompt's last chunk of 40 tokens, another prompt's last
 * chunk of 5 (sampled on the device: sample set, no logits), a decode wanting nothing. The
 * 5-token chunk runs with the first decode, before the 40-token one, so it gets row 1; in entry
 * order (the original numbering) it had row 2 but the LM head wrote its logits into row 1, which
 * the long chunk then overwrote. */
static void test_rows_scheduler_step(void) {
    static const int32_t tk[40] = {0};
    float lg;
    tl_sample_params sp = {.top_p = 1, .repetition_penalty = 1};
    tl_fwd_entry e[4] = {{.slot = 0, .pos = 9, .tokens = tk, .n_tok = 1, .logits = &lg},
                         {.slot = 1, .pos = 0, .tokens = tk, .n_tok = 40, .logits = &lg},
                         {.slot = 2, .pos = 0, .tokens = tk, .n_tok = 5, .sample = &sp},
                         {.slot = 3, .pos = 7, .tokens = tk, .n_tok = 1}};
    int n_tok[4] = {1, 40, 5, 1}, row_of[4], ns;
    static const int want16[4] = {0, 2, 1, -1}, want0[4] = {0, 1, 2, -1};
    CHECK_EQ_INT(tl_mb_rows(e, 4, 16, row_of), 3);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(row_of[i], want16[i]);
    fill_buf fb = fill_alloc(64, 8);
    tl_mb_seg segs[8];
    tl_mb_iter it = tl_mb_begin(n_tok, 4, 64, 8, 16);
    int n_mb = 0, bad = 0;
    tl_mb_info info[4];
    while (n_mb < 4 && tl_mb_next(&it, segs, &ns)) {
        tl_mb_fill(e, segs, ns, row_of, &fb.m, &info[n_mb]);
        bad += row_mismatches(e, segs, ns, row_of, &info[n_mb++]);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(n_mb, 2);
    CHECK_EQ_INT(info[0].n_out, 2); /* the first decode and the 5-token chunk: rows 0, 1 */
    CHECK_EQ_INT(info[0].out_row0, 0);
    CHECK_EQ_INT(info[1].n_out, 1); /* the 40-token chunk: row 2 */
    CHECK_EQ_INT(info[1].out_row0, 2);
    /* without the long path everything runs in entry order, and so do the rows */
    CHECK_EQ_INT(tl_mb_rows(e, 4, 0, row_of), 3);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(row_of[i], want0[i]);
    fill_release(&fb);
}

/* ---- kinds and splits ---- */

static void test_kind_of(void) {
    static const struct {
        int n_tok, n_seg, all_single, long_min, max_decode;
        tl_mb_kind want;
    } cases[] = {
        {16, 1, 0, 16, 64, TL_MB_LONG},    /* n_tok == long_min */
        {15, 1, 0, 16, 64, TL_MB_GENERIC}, /* one below */
        {17, 1, 0, 16, 64, TL_MB_LONG},
        {100, 2, 0, 16, 64, TL_MB_GENERIC}, /* two segments are never long */
        {5000, 1, 0, 0, 64, TL_MB_GENERIC}, /* long_min 0: no long path */
        {1, 1, 1, 0, 64, TL_MB_DECODE},     /* one decode token */
        {1, 1, 1, 16, 64, TL_MB_DECODE},    /* below long_min */
        {1, 1, 1, 1, 64, TL_MB_LONG},       /* long is decided first */
        {8, 8, 1, 16, 8, TL_MB_DECODE},     /* n_tok == max_decode */
        {9, 9, 1, 16, 8, TL_MB_GENERIC},    /* one more */
        {16, 16, 1, 16, 64, TL_MB_DECODE},  /* 16 singles are not one long segment */
        {8, 7, 0, 16, 64, TL_MB_GENERIC},   /* a two-token segment */
        {64, 64, 1, 0, 64, TL_MB_DECODE},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tl_mb_info info = {.n_tok = cases[k].n_tok,
                           .n_seg = cases[k].n_seg,
                           .all_single = cases[k].all_single,
                           .max_kv = 100};
        tl_mb_kind got = tl_mb_kind_of(&info, cases[k].long_min, cases[k].max_decode);
        if (got != cases[k].want) fprintf(stderr, "  kind case %zu: got %d\n", k, (int)got);
        CHECK_EQ_INT(got, cases[k].want);
    }
}

static void test_attn_splits(void) {
    static const struct {
        tl_mb_kind kind;
        int n_tok, max_kv, max_split, part_rows, want;
    } cases[] = {
        {TL_MB_DECODE, 4, 0, 128, 2048, 128}, /* decode: always max_split */
        {TL_MB_DECODE, 64, 100000, 128, 8192, 128},
        {TL_MB_DECODE, 3, 5, 7, 10, 7},
        {TL_MB_GENERIC, 4, 0, 128, 2048, 1}, /* max_kv 0: at least 1 */
        {TL_MB_GENERIC, 4, 1, 128, 2048, 1},
        {TL_MB_GENERIC, 4, 32, 128, 2048, 1}, /* one per 32 keys */
        {TL_MB_GENERIC, 4, 33, 128, 2048, 2},
        {TL_MB_GENERIC, 4, 10000, 128, 2048, 128},  /* capped by max_split */
        {TL_MB_GENERIC, 100, 10000, 128, 2048, 20}, /* 2048 / 100 partial rows a token */
        {TL_MB_GENERIC, 100, 320, 128, 2048, 10},   /* 320 keys: 10 */
        {TL_MB_GENERIC, 100, 321, 128, 2048, 11},
        {TL_MB_GENERIC, 5000, 9000, 128, 2048, 1}, /* part_rows < n_tok */
        {TL_MB_GENERIC, 2048, 9000, 128, 2048, 1}, /* part_rows == n_tok */
        {TL_MB_GENERIC, 1024, 9000, 128, 2048, 2},
        {TL_MB_LONG, 4096, 4096, 128, 16384, 4}, /* long: the same rule */
        {TL_MB_LONG, 16, 64, 128, 16384, 2},
        {TL_MB_GENERIC, 3, 100000, 1, 2048, 1}, /* max_split 1 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tl_mb_info info = {.n_tok = cases[k].n_tok, .n_seg = 1, .max_kv = cases[k].max_kv};
        int got = tl_mb_attn_splits(&info, cases[k].kind, cases[k].max_split, cases[k].part_rows);
        if (got != cases[k].want) fprintf(stderr, "  splits case %zu: got %d\n", k, got);
        CHECK_EQ_INT(got, cases[k].want);
    }
}

/* The original micro_step: decode = all_single && T <= max_seqs; n_split = CB_DECODE_SPLIT when
 * decode, else max(1, min(CB_DECODE_SPLIT, part_rows / T)) capped by max(1, ceil(max_kv / 32));
 * the prefill path (pf_ok, one segment, T >= CB_PF_MIN) was taken before the decode test. */
static void test_kind_splits_match_original(void) {
    unsigned long long rs = 0xc0ffeeull;
    int bad = 0, seen[3] = {0};
    for (int iter = 0; iter < 20000; iter++) {
        tl_mb_info info;
        info.n_seg = rnd(&rs, 3) ? 1 + rnd(&rs, 64) : 1;
        info.all_single = rnd(&rs, 2);
        info.n_tok = info.all_single ? info.n_seg : info.n_seg + rnd(&rs, 5000);
        info.max_kv = rnd(&rs, 4) ? info.n_tok + rnd(&rs, 100000) : info.n_tok;
        int long_min = rnd(&rs, 2) ? 16 : 0, max_seqs = 1 + rnd(&rs, 128);
        int split = 128, part_rows = TL_MAX(max_seqs * split, 2048);
        int prefill = long_min > 0 && info.n_seg == 1 && info.n_tok >= long_min;
        int decode = info.all_single && info.n_tok <= max_seqs;
        int n_split = split;
        if (!decode) {
            n_split = TL_MAX(1, TL_MIN(split, part_rows / info.n_tok));
            n_split = TL_MIN(n_split, TL_MAX(1, TL_CEIL_DIV(info.max_kv, 32)));
        }
        tl_mb_kind k = tl_mb_kind_of(&info, long_min, max_seqs);
        tl_mb_kind want = prefill ? TL_MB_LONG : decode ? TL_MB_DECODE : TL_MB_GENERIC;
        bad += k != want;
        if (!prefill) bad += tl_mb_attn_splits(&info, k, split, part_rows) != n_split;
        seen[k]++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(seen[0] > 1000 && seen[1] > 1000 && seen[2] > 1000);
}

/* Cuts (tl_mb_iter.cut, a snapshot point inside an entry): on random batches, mixed or not, every
 * token once and in order, no segment across a cut, a micro-batch ends at each cut, the token and
 * segment limits hold; without a cut, the plan of the iterator without cuts. */
static int cut_violations(const plan *pl, const int *n_tok, const int *cut, int n, int max_tok,
                          int max_seg) {
    int bad = 0;
    int *next = calloc((size_t)n, sizeof(int));
    for (int b = 0; b < pl->n_mb; b++) {
        int f = pl->first[b], ns = pl->first[b + 1] - f, T = 0;
        bad += ns < 1 || ns > max_seg;
        for (int k = 0; k < ns; k++) {
            const tl_mb_seg *sg = &pl->segs[f + k];
            int c = cut[sg->entry];
            bad += sg->start != next[sg->entry];
            next[sg->entry] = sg->start + sg->n;
            T += sg->n;
            bad += c > sg->start && c < sg->start + sg->n; /* across the cut */
            bad += c == sg->start + sg->n && c < n_tok[sg->entry] && k != ns - 1; /* not the end */
        }
        bad += T > max_tok;
    }
    for (int i = 0; i < n; i++) bad += next[i] != n_tok[i];
    free(next);
    return bad;
}

static void pack_cut(const batch_cfg *c, const int *cut, int mixed, plan *pl) {
    tl_mb_seg *segs = malloc((size_t)c->max_seg * sizeof *segs);
    tl_mb_iter it = mixed ? tl_mb_begin_mixed(c->n_tok, c->n, c->max_tok, c->max_seg, c->long_min)
                          : tl_mb_begin(c->n_tok, c->n, c->max_tok, c->max_seg, c->long_min);
    it.cut = cut;
    int n_seg, ok = 1;
    while (ok && tl_mb_next(&it, segs, &n_seg)) ok = plan_add(pl, segs, n_seg);
    CHECK(ok);
    free(segs);
}

static void test_pack_cuts(void) {
    unsigned long long rs = 0xc47c475ull;
    int n_cut = 0;
    for (int iter = 0; iter < 2000; iter++) {
        batch_cfg c;
        pick_batch(&rs, &c);
        int cut[256] = {0}, any = 0;
        for (int i = 0; i < c.n; i++)
            if (c.n_tok[i] > 1 && rnd(&rs, 3) == 0) cut[i] = 1 + rnd(&rs, c.n_tok[i] - 1), any = 1;
        int mixed = rnd(&rs, 2), cap = total_tokens(&c) + 2;
        plan got, want;
        plan_init(&got, cap);
        pack_cut(&c, cut, mixed, &got);
        int bad = cut_violations(&got, c.n_tok, cut, c.n, c.max_tok, c.max_seg);
        if (bad) fprintf(stderr, "iter %d: %d violations (mixed %d)\n", iter, bad, mixed);
        CHECK_EQ_INT(bad, 0);
        if (!any) { /* no cut: the plain iterator's plan */
            plan_init(&want, cap);
            pack_cut(&c, NULL, mixed, &want);
            CHECK(plans_equal(&got, &want));
            plan_free(&want);
        }
        n_cut += any;
        plan_free(&got);
    }
    CHECK(n_cut > 500);
}

int main(void) {
    T_RUN(test_pack_cases);
    T_RUN(test_pack_matches_original);
    T_RUN(test_pack_mixed);
    T_RUN(test_pack_cuts);
    T_RUN(test_fill);
    T_RUN(test_fill_rows);
    T_RUN(test_rows_scheduler_step);
    T_RUN(test_kind_of);
    T_RUN(test_attn_splits);
    T_RUN(test_kind_splits_match_original);
    return t_summary();
}
