/* The fast mask (src/grammar/cache.c): matcher states interned by their exact stack set, each
 * with its byte transitions memoized, so that the walk over the vocabulary trie (flattened in
 * depth-first order by mask.c) costs one table lookup per trie node once the few states of a
 * grammar position are known; and a small LRU of whole masks keyed by the state a mask starts
 * from (a string interior returns to the same state token after token). Exact by construction:
 * every state and transition is the matcher's own (tl_gset_advance), states are compared stack
 * by stack (the hash only finds candidates), and a state's distance is tl_gset_distance's
 * (docs/architecture.md §9 "Mask"; tests/cpu/test_grammar.c compares with tl_grammar_mask_ref). */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/grammar_int.h"

#define MAX_STATES 2048             /* interned states per cache (~2 KB each with transitions) */
#define HTAB       (2 * MAX_STATES) /* open addressing, at most half full */
#define T_UNKNOWN  0                /* trans[]: not computed yet; T_DEAD: no stack survives */
#define T_DEAD     (-1)             /* else: state id + 1 */

typedef struct dstate {
    tl_gstack_set set; /* a private copy, never modified */
    uint32_t hash;     /* order-independent hash of the set */
    int32_t dist;      /* tl_gset_distance of the set */
} dstate;

typedef struct mentry {
    int32_t root;  /* state the mask starts from (-1: empty entry) */
    int32_t bound; /* the distance bound it was walked with (TL_GRAMMAR_INF: none) */
    int32_t dmax;  /* unbounded entries: the largest distance after an allowed token */
    uint64_t used; /* LRU clock */
    uint32_t *bits;
} mentry;

struct tl_grammar_cache {
    const struct tl_grammar *g;
    const tl_grammar_vocab *v;
    dstate *st;
    int32_t *trans; /* 256 per state */
    int n_st, cap_st;
    int32_t *htab;      /* state id + 1, 0 = empty slot */
    tl_gstack_set *lvl; /* per trie depth: scratch set of a state that is not interned */
    int32_t *lid;       /* per trie depth: the state's id, or -1 (then lvl[d] holds it) */
    mentry *m;
    int n_m;
    size_t n_words;
    uint64_t clock, hits, walks, interned;
};

static uint32_t set_hash(const tl_gstack_set *s) {
    uint32_t h = (uint32_t)s->n_stacks * 0x9E3779B1u;
    for (size_t i = 0; i < s->n_stacks; i++) {
        uint32_t x = s->hash[i];
        x ^= x >> 16;
        x *= 0x85EBCA6Bu;
        x ^= x >> 13;
        h += x; /* a sum: the order of the stacks does not matter */
    }
    return h;
}

/* Both sets hold distinct stacks, so equal sizes and a ⊆ b mean a == b. */
static int set_equal(const tl_gstack_set *a, const tl_gstack_set *b) {
    if (a->n_stacks != b->n_stacks) return 0;
    for (size_t i = 0; i < a->n_stacks; i++)
        if (!tl_gset_contains(b, tl_gset_stack(a, i), a->len[i], a->hash[i])) return 0;
    return 1;
}

static void reset_states(tl_grammar_cache *c) {
    for (int i = 0; i < c->n_st; i++) tl_gset_free(&c->st[i].set);
    c->n_st = 0;
    memset(c->htab, 0, HTAB * sizeof(*c->htab));
    for (int i = 0; i < c->n_m; i++) c->m[i].root = -1; /* keyed by state ids */
}

static int grow_states(tl_grammar_cache *c) {
    if (c->n_st < c->cap_st) return 0;
    int cap = c->cap_st ? 2 * c->cap_st : 32;
    dstate *st = realloc(c->st, (size_t)cap * sizeof(*st));
    if (!st) return TL_ERR_NOMEM;
    c->st = st;
    int32_t *tr = realloc(c->trans, (size_t)cap * 256 * sizeof(*tr));
    if (!tr) return TL_ERR_NOMEM;
    c->trans = tr;
    c->cap_st = cap;
    return 0;
}

/* *id = the interned state equal to s, added if new; -1 when the table is full. */
static int intern(tl_grammar_cache *c, const tl_gstack_set *s, int32_t *id) {
    uint32_t h = set_hash(s);
    size_t i = h & (HTAB - 1);
    for (; c->htab[i]; i = (i + 1) & (HTAB - 1)) {
        int32_t k = c->htab[i] - 1;
        if (c->st[k].hash == h && set_equal(&c->st[k].set, s)) {
            *id = k;
            return 0;
        }
    }
    *id = -1;
    if (c->n_st >= MAX_STATES) return 0;
    int rc = grow_states(c);
    if (rc) return rc;
    dstate *d = &c->st[c->n_st];
    memset(d, 0, sizeof(*d));
    if ((rc = tl_gset_copy(&d->set, s))) {
        tl_gset_free(&d->set);
        return rc;
    }
    d->hash = h;
    d->dist = tl_gset_distance(c->g, s);
    memset(c->trans + (size_t)c->n_st * 256, 0, 256 * sizeof(*c->trans));
    c->htab[i] = c->n_st + 1;
    *id = c->n_st++;
    c->interned++;
    return 0;
}

static const tl_gstack_set *set_at(const tl_grammar_cache *c, size_t d) {
    return c->lid[d] >= 0 ? &c->st[c->lid[d]].set : &c->lvl[d];
}

/* The state at trie depth d: depth d-1's advanced over byte b (memoized when d-1's state is
 * interned). 1 if some stack survives, 0 if none, < 0 on error. */
static int step(tl_grammar_cache *c, size_t d, uint8_t b) {
    int32_t from = c->lid[d - 1];
    if (from >= 0) {
        int32_t t = c->trans[(size_t)from * 256 + b];
        if (t == T_DEAD) return 0;
        if (t > 0) {
            c->lid[d] = t - 1;
            return 1;
        }
    }
    int rc = tl_gset_advance(c->g, set_at(c, d - 1), b, &c->lvl[d]);
    if (rc) return rc;
    int alive = c->lvl[d].n_stacks > 0;
    int32_t id = -1;
    if (alive && (rc = intern(c, &c->lvl[d], &id))) return rc;
    if (from >= 0 && (!alive || id >= 0))
        c->trans[(size_t)from * 256 + b] = alive ? id + 1 : T_DEAD;
    c->lid[d] = id;
    return alive;
}

static int32_t dist_at(const tl_grammar_cache *c, size_t d) {
    return c->lid[d] >= 0 ? c->st[c->lid[d]].dist : tl_gset_distance(c->g, &c->lvl[d]);
}

/* The trie part of the mask from the state at depth 0 (lid[0] / lvl[0]): bits[] for every
 * token whose bytes are accepted and after which the distance is at most bound; *dmax = the
 * largest such distance over the tokens accepted (bound or not). */
static int walk(tl_grammar_cache *c, int32_t bound, uint32_t *bits, int32_t *dmax) {
    const tl_grammar_vocab *v = c->v;
    memset(bits, 0, c->n_words * sizeof(*bits));
    int32_t dm = -1;
    for (size_t i = 0; i < v->n_df;) {
        size_t d = v->df_depth[i];
        int rc = step(c, d, v->df_byte[i]);
        if (rc < 0) return rc;
        if (rc == 0) { /* prune the subtree */
            i = (size_t)v->df_end[i];
            continue;
        }
        if (v->df_tok[i] >= 0) {
            int32_t dist = dist_at(c, d);
            if (dist > dm) dm = dist;
            if (bound >= TL_GRAMMAR_INF || dist <= bound)
                for (int32_t t = v->df_tok[i]; t >= 0; t = v->tok_next[t])
                    bits[t >> 5] |= 1u << (t & 31);
        }
        i++;
    }
    *dmax = dm;
    c->walks++;
    return 0;
}

int tl_grammar_cache_new(const tl_grammar *g, const tl_grammar_vocab *v, int n_masks,
                         tl_grammar_cache **out) {
    *out = NULL;
    if (!g || !v || n_masks < 0) return TL_ERR_INVALID;
    tl_grammar_cache *c = calloc(1, sizeof(*c));
    if (!c) return TL_ERR_NOMEM;
    c->g = g;
    c->v = v;
    c->n_words = ((size_t)v->n_vocab + 31) / 32;
    c->htab = calloc(HTAB, sizeof(*c->htab));
    c->lvl = calloc(v->max_len + 1, sizeof(*c->lvl));
    c->lid = calloc(v->max_len + 1, sizeof(*c->lid));
    c->m = calloc((size_t)n_masks + 1, sizeof(*c->m));
    int rc = c->htab && c->lvl && c->lid && c->m ? 0 : TL_ERR_NOMEM;
    for (int i = 0; i < n_masks && !rc; i++) {
        c->m[i].root = -1;
        c->m[i].bits = malloc(c->n_words * sizeof(uint32_t));
        if (!c->m[i].bits) rc = TL_ERR_NOMEM;
        c->n_m = i + 1;
    }
    if (rc) {
        tl_grammar_cache_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void tl_grammar_cache_free(tl_grammar_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n_st; i++) tl_gset_free(&c->st[i].set);
    for (size_t d = 0; c->lvl && d <= c->v->max_len; d++) tl_gset_free(&c->lvl[d]);
    for (int i = 0; i < c->n_m; i++) free(c->m[i].bits);
    free(c->st);
    free(c->trans);
    free(c->htab);
    free(c->lvl);
    free(c->lid);
    free(c->m);
    free(c);
}

void tl_grammar_cache_stats(const tl_grammar_cache *c, uint64_t *hits, uint64_t *walks,
                            uint64_t *states) {
    *hits = c->hits;
    *walks = c->walks;
    *states = c->interned;
}

/* The cached mask from state root under bound, or NULL. */
static const mentry *lookup(tl_grammar_cache *c, int32_t root, int32_t bound) {
    for (int i = 0; i < c->n_m; i++) {
        mentry *e = &c->m[i];
        if (e->root != root) continue;
        if (e->bound == bound || (e->bound == TL_GRAMMAR_INF && bound >= e->dmax)) {
            e->used = ++c->clock;
            return e;
        }
    }
    return NULL;
}

static mentry *victim(tl_grammar_cache *c, const mentry *keep) {
    mentry *best = NULL;
    for (int i = 0; i < c->n_m; i++)
        if (&c->m[i] != keep && (!best || c->m[i].used < best->used)) best = &c->m[i];
    return best;
}

/* Walks from root (already at depth 0) under bound into a cache entry, or straight into mask
 * when no entry is free. */
static int walk_into(tl_grammar_cache *c, int32_t root, int32_t bound, const mentry *keep,
                     uint32_t *mask) {
    mentry *e = root >= 0 ? victim(c, keep) : NULL;
    int32_t dm;
    if (!e) return walk(c, bound, mask, &dm);
    e->root = -1;
    int rc = walk(c, bound, e->bits, &dm);
    if (rc) return rc;
    *e = (mentry){root, bound, dm, ++c->clock, e->bits};
    memcpy(mask, e->bits, c->n_words * sizeof(*mask));
    return 0;
}

int tl_grammar_mask_cached(tl_grammar_cache *c, const tl_grammar_state *s, const int32_t *end_ids,
                           size_t n_end, int max_dist, uint32_t *mask) {
    if (s->g != c->g) return TL_ERR_INVALID;
    int32_t bound = max_dist < 0 || max_dist >= TL_GRAMMAR_INF ? TL_GRAMMAR_INF : max_dist;
    if (c->n_st >= MAX_STATES) reset_states(c);
    int32_t root;
    int rc = intern(c, &s->cur, &root);
    if (rc) return rc;
    const mentry *e = root >= 0 ? lookup(c, root, bound) : NULL;
    if (e) {
        c->hits++;
        memcpy(mask, e->bits, c->n_words * sizeof(*mask));
    } else {
        c->lid[0] = root;
        if (root < 0 && (rc = tl_gset_copy(&c->lvl[0], &s->cur))) return rc;
        /* unbounded first: its dmax then answers every bound at or above it */
        if (root >= 0 && c->n_m > 0 && bound < TL_GRAMMAR_INF && !lookup(c, root, TL_GRAMMAR_INF)) {
            if ((rc = walk_into(c, root, TL_GRAMMAR_INF, NULL, mask))) return rc;
            e = lookup(c, root, bound);
        }
        if (e)
            memcpy(mask, e->bits, c->n_words * sizeof(*mask));
        else if ((rc = walk_into(c, root, bound, lookup(c, root, TL_GRAMMAR_INF), mask)))
            return rc;
    }
    tl_grammar_mask_ends(s, c->v, end_ids, n_end, mask);
    return 0;
}
