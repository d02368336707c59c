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
/* out = the stacks of `in` advanced over byte b (expanded). out is cleared first. */
int tl_gset_advance(const struct tl_grammar *g, const tl_gstack_set *in, uint8_t b,
                    tl_gstack_set *out);
/* out = the initial stack set of g. */
int tl_gset_init(const struct tl_grammar *g, tl_gstack_set *out);
/* Fewest bytes that complete a document from stack set s (0: complete; TL_GRAMMAR_INF: none). */
int32_t tl_gset_distance(const struct tl_grammar *g, const tl_gstack_set *s);
/* Fills g->minrest (build.c, at finish). */
int tl_grammar_minrest(struct tl_grammar *g);

#endif
