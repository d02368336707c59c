/* The token mask (src/grammar/mask.c): a byte trie of the vocabulary, built once (and flattened
 * in depth-first order for the fast walk of cache.c), and the reference mask: a depth-first walk
 * of the trie that advances the matcher's stack set one byte per trie edge and prunes a subtree
 * as soon as the set becomes empty. tl_grammar_mask/_within use the fast walk (cache.c), which
 * must give the same bits (tests/cpu/test_grammar.c checks it against this walk). */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/util.h"
#include "grammar/grammar.h"
#include "grammar/grammar_int.h"

typedef tl_tnode tnode;

static int32_t add_node(tl_grammar_vocab *v, uint8_t byte) {
    if (v->n_nodes == v->cap_nodes) {
        size_t c = v->cap_nodes ? v->cap_nodes * 2 : 1024;
        tnode *n = realloc(v->nodes, c * sizeof(*n));
        if (!n) return TL_ERR_NOMEM;
        v->nodes = n;
        v->cap_nodes = c;
    }
    v->nodes[v->n_nodes] = (tnode){-1, -1, -1, byte};
    return (int32_t)v->n_nodes++;
}

/* The child of node `at` for byte b, created if missing. */
static int32_t child(tl_grammar_vocab *v, int32_t at, uint8_t b) {
    int32_t c = v->nodes[at].child;
    for (; c >= 0; c = v->nodes[c].sibling)
        if (v->nodes[c].byte == b) return c;
    c = add_node(v, b);
    if (c < 0) return c;
    v->nodes[c].sibling = v->nodes[at].child;
    v->nodes[at].child = c;
    return c;
}

static int insert(tl_grammar_vocab *v, int32_t id, const uint8_t *s, size_t n) {
    int32_t at = 0;
    for (size_t i = 0; i < n; i++) {
        at = child(v, at, s[i]);
        if (at < 0) return at;
    }
    v->tok_next[id] = v->nodes[at].tok;
    v->nodes[at].tok = id;
    if (n > v->max_len) v->max_len = n;
    return 0;
}

/* Fills the depth-first arrays (df_*) from the linked trie; iterative (tokens may be long). */
static int flatten(tl_grammar_vocab *v) {
    size_t n = v->n_nodes - 1;
    v->df_byte = malloc(n + 1);
    v->df_depth = malloc((n + 1) * sizeof(uint32_t));
    v->df_tok = malloc((n + 1) * sizeof(int32_t));
    v->df_end = malloc((n + 1) * sizeof(int32_t));
    int32_t *stk = malloc((v->max_len + 1) * sizeof(int32_t)),
            *pos = malloc((v->max_len + 1) * sizeof(int32_t));
    if (!v->df_byte || !v->df_depth || !v->df_tok || !v->df_end || !stk || !pos) {
        free(stk);
        free(pos);
        return TL_ERR_NOMEM;
    }
    size_t sp = 0, k = 0;
    int32_t cur = v->nodes[0].child;
    for (;;) {
        for (; cur >= 0; cur = v->nodes[cur].child) { /* descend, numbering in pre-order */
            v->df_byte[k] = v->nodes[cur].byte;
            v->df_depth[k] = (uint32_t)sp + 1;
            v->df_tok[k] = v->nodes[cur].tok;
            stk[sp] = cur;
            pos[sp++] = (int32_t)k++;
        }
        while (sp > 0 && cur < 0) { /* climb until a node with a next sibling */
            sp--;
            v->df_end[pos[sp]] = (int32_t)k;
            cur = v->nodes[stk[sp]].sibling;
        }
        if (cur < 0) break;
    }
    TL_ASSERT(k == n);
    v->n_df = n;
    free(stk);
    free(pos);
    return 0;
}

int tl_grammar_vocab_new(const char *const *bytes, const size_t *lens, int n_vocab,
                         tl_grammar_vocab **out) {
    *out = NULL;
    if (n_vocab < 0) return TL_ERR_INVALID;
    tl_grammar_vocab *v = calloc(1, sizeof(*v));
    if (!v) return TL_ERR_NOMEM;
    v->n_vocab = n_vocab;
    v->tok_next = malloc(((size_t)n_vocab + 1) * sizeof(int32_t));
    int rc = v->tok_next ? add_node(v, 0) : TL_ERR_NOMEM;
    for (int i = 0; i < n_vocab && rc >= 0; i++)
        if (bytes[i] && lens[i] > 0) rc = insert(v, i, (const uint8_t *)bytes[i], lens[i]);
    if (rc >= 0 && v->n_nodes > (size_t)INT32_MAX) rc = TL_ERR_NOMEM;
    if (rc >= 0) rc = flatten(v);
    if (rc < 0) {
        tl_grammar_vocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

void tl_grammar_vocab_free(tl_grammar_vocab *v) {
    if (!v) return;
    free(v->nodes);
    free(v->tok_next);
    free(v->df_byte);
    free(v->df_depth);
    free(v->df_tok);
    free(v->df_end);
    free(v);
}

int tl_grammar_vocab_size(const tl_grammar_vocab *v) { return v->n_vocab; }

typedef struct walk {
    const struct tl_grammar *g;
    const tl_grammar_vocab *v;
    tl_gstack_set *sets; /* sets[d]: the state after the d bytes of the current trie path */
    uint32_t *mask;
    int32_t max_dist; /* a token is allowed only if the distance after it is at most this */
} walk;

/* Children of node `at` (reached with sets[d]): allowed tokens are marked, subtrees walked. */
static int walk_node(walk *w, int32_t at, size_t d) {
    for (int32_t c = w->v->nodes[at].child; c >= 0; c = w->v->nodes[c].sibling) {
        const tnode *n = &w->v->nodes[c];
        int rc = tl_gset_advance(w->g, &w->sets[d], n->byte, &w->sets[d + 1]);
        if (rc) return rc;
        if (w->sets[d + 1].n_stacks == 0) continue; /* prune the subtree */
        if (n->tok >= 0 && (w->max_dist >= TL_GRAMMAR_INF ||
                            tl_gset_distance(w->g, &w->sets[d + 1]) <= w->max_dist))
            for (int32_t t = n->tok; t >= 0; t = w->v->tok_next[t])
                w->mask[t >> 5] |= 1u << (t & 31);
        if (n->child >= 0 && (rc = walk_node(w, c, d + 1))) return rc;
    }
    return 0;
}

int tl_grammar_mask(const tl_grammar_state *s, const tl_grammar_vocab *v, const int32_t *end_ids,
                    size_t n_end, uint32_t *mask) {
    return tl_grammar_mask_within(s, v, end_ids, n_end, -1, mask);
}

int tl_grammar_mask_within(const tl_grammar_state *s, const tl_grammar_vocab *v,
                           const int32_t *end_ids, size_t n_end, int max_dist, uint32_t *mask) {
    tl_grammar_cache *c;
    int rc = tl_grammar_cache_new(s->g, v, 0, &c);
    if (rc) return rc;
    rc = tl_grammar_mask_cached(c, s, end_ids, n_end, max_dist, mask);
    tl_grammar_cache_free(c);
    return rc;
}

void tl_grammar_mask_ends(const tl_grammar_state *s, const tl_grammar_vocab *v,
                          const int32_t *end_ids, size_t n_end, uint32_t *mask) {
    int done = tl_grammar_is_complete(s);
    for (size_t i = 0; i < n_end; i++) {
        int32_t t = end_ids[i];
        if (t < 0 || t >= v->n_vocab) continue;
        if (done)
            mask[t >> 5] |= 1u << (t & 31);
        else
            mask[t >> 5] &= ~(1u << (t & 31));
    }
}

int tl_grammar_mask_ref(const tl_grammar_state *s, const tl_grammar_vocab *v,
                        const int32_t *end_ids, size_t n_end, int max_dist, uint32_t *mask) {
    memset(mask, 0, ((size_t)v->n_vocab + 31) / 32 * sizeof(uint32_t));
    walk w = {s->g, v, calloc(v->max_len + 1, sizeof(tl_gstack_set)), mask,
              max_dist < 0 || max_dist >= TL_GRAMMAR_INF ? TL_GRAMMAR_INF : max_dist};
    if (!w.sets) return TL_ERR_NOMEM;
    w.sets[0] = s->cur; /* borrowed: only read */
    int rc = walk_node(&w, 0, 0);
    for (size_t d = 1; d <= v->max_len; d++) tl_gset_free(&w.sets[d]);
    free(w.sets);
    if (rc) return rc;
    tl_grammar_mask_ends(s, v, end_ids, n_end, mask);
    return 0;
}
