/* The matcher (src/grammar/match.c): sets of pushdown stacks over a compiled grammar, advanced
 * byte by byte, and the public tl_grammar_state API. A stack holds element indices; its top is
 * always a GE_CHAR after expansion (rule references are expanded eagerly, finished rules popped),
 * so a byte is accepted by the stacks whose top range contains it. Identical stacks are merged. */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/grammar_int.h"

void tl_gset_clear(tl_gstack_set *s) {
    s->n = 0;
    s->n_stacks = 0;
    if (++s->gen == 0) { /* stamps wrapped: forget them all */
        if (s->stamp) memset(s->stamp, 0, s->n_slots * sizeof(*s->stamp));
        s->gen = 1;
    }
}

void tl_gset_free(tl_gstack_set *s) {
    free(s->data);
    free(s->off);
    free(s->len);
    free(s->hash);
    free(s->scr);
    free(s->slot);
    free(s->stamp);
    memset(s, 0, sizeof(*s));
}

static uint32_t stack_hash(const int32_t *stk, size_t len) {
    uint32_t h = 2166136261u ^ (uint32_t)len;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint32_t)stk[i]) * 16777619u;
    return h;
}

static int reserve(tl_gstack_set *s, size_t add) {
    if (s->n + add > s->cap) {
        size_t c = s->cap ? s->cap * 2 : 256;
        while (c < s->n + add) c *= 2;
        int32_t *d = realloc(s->data, c * sizeof(*d));
        if (!d) return TL_ERR_NOMEM;
        s->data = d;
        s->cap = c;
    }
    if (s->n_stacks == s->cap_stacks) {
        size_t c = s->cap_stacks ? s->cap_stacks * 2 : 16;
        uint32_t *o = realloc(s->off, c * sizeof(*o)), *l = o ? realloc(s->len, c * sizeof(*l)) : 0;
        if (o) s->off = o;
        if (l) s->len = l;
        uint32_t *h = l ? realloc(s->hash, c * sizeof(*h)) : 0;
        if (!h) return TL_ERR_NOMEM;
        s->hash = h;
        s->cap_stacks = c;
    }
    return 0;
}

static void slot_put(tl_gstack_set *s, uint32_t h, uint32_t idx) {
    size_t m = s->n_slots - 1, i = h & m;
    while (s->stamp[i] == s->gen) i = (i + 1) & m;
    s->stamp[i] = s->gen;
    s->slot[i] = idx + 1;
}

/* Keeps the dedup table at most half full. */
static int grow_slots(tl_gstack_set *s) {
    if (s->n_slots && (s->n_stacks + 1) * 2 <= s->n_slots) return 0;
    size_t n = s->n_slots ? s->n_slots * 2 : 64;
    uint32_t *sl = malloc(n * sizeof(*sl)), *st = calloc(n, sizeof(*st));
    if (!sl || !st) {
        free(sl);
        free(st);
        return TL_ERR_NOMEM;
    }
    free(s->slot);
    free(s->stamp);
    s->slot = sl;
    s->stamp = st;
    s->n_slots = n;
    if (s->gen == 0) s->gen = 1;
    for (size_t i = 0; i < s->n_stacks; i++) slot_put(s, s->hash[i], (uint32_t)i);
    return 0;
}

int tl_gset_contains(const tl_gstack_set *s, const int32_t *stk, size_t len, uint32_t h) {
    if (!s->n_slots) return 0;
    size_t m = s->n_slots - 1;
    for (size_t i = h & m; s->stamp[i] == s->gen; i = (i + 1) & m) {
        uint32_t k = s->slot[i] - 1;
        if (s->hash[k] == h && s->len[k] == len &&
            (len == 0 || memcmp(s->data + s->off[k], stk, len * sizeof(*stk)) == 0))
            return 1;
    }
    return 0;
}

/* Adds a copy of stk unless the set holds it already. */
static int push_unique(tl_gstack_set *s, const int32_t *stk, size_t len) {
    uint32_t h = stack_hash(stk, len);
    int rc = grow_slots(s);
    if (rc) return rc;
    if (tl_gset_contains(s, stk, len, h)) return 0;
    if (s->n_stacks >= TL_GRAMMAR_MAX_STACKS) return TL_ERR_NOMEM;
    rc = reserve(s, len);
    if (rc) return rc;
    if (len) memcpy(s->data + s->n, stk, len * sizeof(*stk));
    s->off[s->n_stacks] = (uint32_t)s->n;
    s->len[s->n_stacks] = (uint32_t)len;
    s->hash[s->n_stacks] = h;
    slot_put(s, h, (uint32_t)s->n_stacks++);
    s->n += len;
    return 0;
}

/* Expands stk[0..len) until its top is a GE_CHAR (or it is empty) and adds the results to out.
 * stk has room for TL_GRAMMAR_MAX_DEPTH + 2 entries; stk[0..len) is restored on return. depth
 * bounds the recursion (left-recursive rules are cut off there). */
static int expand(const struct tl_grammar *g, tl_gstack_set *out, int32_t *stk, size_t len,
                  int depth) {
    if (len == 0) return push_unique(out, stk, 0);
    if (len > TL_GRAMMAR_MAX_DEPTH || depth > 2 * TL_GRAMMAR_MAX_DEPTH) return 0;
    int32_t p = stk[len - 1];
    const tl_gelem *e = &g->el[p];
    if (e->kind == GE_CHAR) return push_unique(out, stk, len);
    if (e->kind != GE_REF) return expand(g, out, stk, len - 1, depth + 1);
    size_t base = len;
    int nk = g->el[p + 1].kind;
    if (nk == GE_END || nk == GE_ALT)
        base = len - 1; /* nothing follows the reference: drop the frame */
    else
        stk[len - 1] = p + 1;
    int rc = 0;
    int32_t a = g->rule_start[e->ref];
    for (;;) {
        stk[base] = a;
        rc = expand(g, out, stk, base + 1, depth + 1);
        if (rc) break;
        while (g->el[a].kind != GE_ALT && g->el[a].kind != GE_END) a++;
        if (g->el[a].kind == GE_END) break;
        a++;
    }
    stk[len - 1] = p;
    return rc;
}

static int ensure_scratch(tl_gstack_set *s) {
    if (!s->scr) s->scr = malloc((TL_GRAMMAR_MAX_DEPTH + 2) * sizeof(*s->scr));
    return s->scr ? 0 : TL_ERR_NOMEM;
}

int tl_gset_init(const struct tl_grammar *g, tl_gstack_set *out) {
    tl_gset_clear(out);
    int rc = ensure_scratch(out);
    if (rc) return rc;
    /* element 0 of every grammar is a REF to the root followed by GE_END (see compile). */
    out->scr[0] = 0;
    return expand(g, out, out->scr, 1, 0);
}

int tl_gset_advance(const struct tl_grammar *g, const tl_gstack_set *in, uint8_t b,
                    tl_gstack_set *out) {
    tl_gset_clear(out);
    int rc = ensure_scratch(out);
    for (size_t i = 0; i < in->n_stacks && !rc; i++) {
        size_t len = in->len[i];
        if (len == 0) continue;
        const int32_t *stk = in->data + in->off[i];
        const tl_gelem *e = &g->el[stk[len - 1]];
        if (b < e->lo || b > e->hi) continue;
        memcpy(out->scr, stk, len * sizeof(*stk));
        out->scr[len - 1] = stk[len - 1] + 1;
        rc = expand(g, out, out->scr, len, 0);
    }
    return rc;
}

int tl_gset_copy(tl_gstack_set *dst, const tl_gstack_set *src) {
    tl_gset_clear(dst);
    for (size_t i = 0; i < src->n_stacks; i++) {
        int rc = push_unique(dst, tl_gset_stack(src, i), src->len[i]);
        if (rc) return rc;
    }
    return 0;
}
