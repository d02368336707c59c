/* Internal representation shared by the src/grammar sources: the flat rule table of a compiled
 * grammar and the stack-set state of the matcher. Not for use outside src/grammar/. */
#ifndef TL_GRAMMAR_INT_H
#define TL_GRAMMAR_INT_H

#include <stddef.h>
#include <stdint.h>

/* A rule is a run of elements: alternatives separated by GE_ALT, the last ended by GE_END.
 * GE_CHAR matches one byte in [lo, hi]; GE_REF expands rule `ref`. */
enum { GE_END = 0, GE_ALT = 1, GE_CHAR = 2, GE_REF = 3 };

typedef struct tl_gelem {
    uint8_t kind, lo, hi;
    int32_t ref;
} tl_gelem;

struct tl_grammar {
    tl_gelem *el;
    size_t n_el;
    int32_t *rule_start; /* index in el of each rule's first element */
    int n_rules;
    int root;
    int32_t *minrest; /* per element: fewest bytes from it to the end of its alternative
                       * (TL_GRAMMAR_INF when no finite string completes it) */
};

#define TL_GRAMMAR_INF (1 << 29)

/* A set of stacks; each stack is a run of element indices (bottom first), its top a GE_CHAR.
 * An empty stack means the document is complete. */
typedef struct tl_gstack_set {
    int32_t *data;
    size_t n, cap;
    uint32_t *off, *len, *hash;
    size_t n_stacks, cap_stacks;
    int32_t *scr; /* scratch stack, TL_GRAMMAR_MAX_DEPTH + 2 entries */
    /* dedup hash table: slot = stack index + 1, valid when its stamp equals gen */
    uint32_t *slot, *stamp, gen;
    size_t n_slots;
} tl_gstack_set;

#define TL_GRAMMAR_MAX_DEPTH  1024  /* deeper stacks are dropped (nesting limit) */
#define TL_GRAMMAR_MAX_STACKS 16384 /* more live alternatives: TL_ERR_NOMEM */

struct tl_grammar_state {
    const struct tl_grammar *g;
    tl_gstack_set cur, tmp;
};

void tl_gset_clear(tl_gstack_set *s);
void tl_gset_free(tl_gstack_set *s);
int tl_gset_copy(tl_gstack_set *dst, const tl_gstack_set *src);
/* Stack i of s (NULL when it is empty: data may be NULL when every stack is). */
static inline const int32_t *tl_gset_stack(const tl_gstack_set *s, size_t i) {
    return s->len[i] ? s->data + s->off[i] : NULL;
}
/* 1 if s holds the stack stk[0..len) whose stack hash (s->hash's kind) is h, else 0. */
int tl_gset_contains(const tl_gstack_set *s, const int32_t *stk, size_t len, uint32_t h);
/* out = the stacks of `in` advanced over byte b (expanded). out is cleared first. */
int tl_gset_advance(const struct tl_grammar *g, const tl_gstack_set *in, uint8_t b,
                    tl_gstack_set *out);
/* out = the initial stack set of g. */
int tl_gset_init(const struct tl_grammar *g, tl_gstack_set *out);
/* Fewest bytes that complete a document from stack set s (0: complete; TL_GRAMMAR_INF: none). */
int32_t tl_gset_distance(const struct tl_grammar *g, const tl_gstack_set *s);
/* Fills g->minrest (build.c, at finish). */
int tl_grammar_minrest(struct tl_grammar *g);

/* Sets or clears the end ids' bits of mask: set exactly when s is complete (mask.c). */
struct tl_grammar_vocab;
void tl_grammar_mask_ends(const struct tl_grammar_state *s, const struct tl_grammar_vocab *v,
                          const int32_t *end_ids, size_t n_end, uint32_t *mask);

/* The vocabulary byte trie (mask.c). nodes[0] is the root; a node's tokens are tok, then
 * tok_next[tok], ... The same trie flattened in depth-first order (root left out) is what the
 * fast walk scans (cache.c): node i has byte df_byte[i], depth df_depth[i] (1 for a token's first
 * byte), first token df_tok[i], and its subtree ends just before df_end[i]. */
typedef struct tl_tnode {
    int32_t child, sibling; /* first child, next sibling (-1 = none) */
    int32_t tok;            /* first token ending here (-1 = none); more via tok_next */
    uint8_t byte;
} tl_tnode;

struct tl_grammar_vocab {
    tl_tnode *nodes;
    size_t n_nodes, cap_nodes;
    int32_t *tok_next;
    int n_vocab;
    size_t max_len;
    uint8_t *df_byte;
    uint32_t *df_depth;
    int32_t *df_tok, *df_end;
    size_t n_df;
};

#endif
