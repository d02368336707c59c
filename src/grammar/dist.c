/* Distance to completion (src/grammar/dist.c): the fewest bytes that finish a document from a
 * matcher state, from each rule's shortest expansion (a fixed point over the rules) and, per
 * element, the shortest rest of its alternative. The server uses it to steer a constrained
 * output to a complete document before max_tokens (docs/architecture.md §9). */
#include <stdlib.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/grammar_int.h"

static int32_t sat_add(int32_t a, int32_t b) {
    int64_t s = (int64_t)a + b;
    return s >= TL_GRAMMAR_INF ? TL_GRAMMAR_INF : (int32_t)s;
}

static int32_t elem_cost(const struct tl_grammar *g, const int32_t *minlen, size_t k) {
    const tl_gelem *e = &g->el[k];
    return e->kind == GE_CHAR ? 1 : e->kind == GE_REF ? minlen[e->ref] : 0;
}

/* Shortest expansion of every rule: iterated until nothing shrinks (each pass is monotone). */
static void rule_minlen(const struct tl_grammar *g, int32_t *minlen) {
    for (int r = 0; r < g->n_rules; r++) minlen[r] = TL_GRAMMAR_INF;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < g->n_rules; r++) {
            int32_t best = TL_GRAMMAR_INF, sum = 0;
            for (size_t k = (size_t)g->rule_start[r];; k++) {
                int kind = g->el[k].kind;
                if (kind == GE_ALT || kind == GE_END) {
                    if (sum < best) best = sum;
                    sum = 0;
                    if (kind == GE_END) break;
                    continue;
                }
                sum = sat_add(sum, elem_cost(g, minlen, k));
            }
            if (best < minlen[r]) minlen[r] = best, changed = 1;
        }
    }
}

int tl_grammar_minrest(struct tl_grammar *g) {
    int32_t *minlen = malloc(((size_t)g->n_rules + 1) * sizeof(*minlen));
    g->minrest = malloc(g->n_el * sizeof(*g->minrest));
    if (!minlen || !g->minrest) {
        free(minlen);
        return TL_ERR_NOMEM;
    }
    rule_minlen(g, minlen);
    int32_t next = 0;
    for (size_t k = g->n_el; k-- > 0;) {
        int kind = g->el[k].kind;
        if (kind == GE_ALT || kind == GE_END)
            next = 0;
        else
            next = sat_add(next, elem_cost(g, minlen, k));
        g->minrest[k] = next;
    }
    free(minlen);
    return 0;
}

int32_t tl_gset_distance(const struct tl_grammar *g, const tl_gstack_set *s) {
    int32_t best = TL_GRAMMAR_INF;
    for (size_t i = 0; i < s->n_stacks && best > 0; i++) {
        const int32_t *stk = tl_gset_stack(s, i);
        int32_t d = 0;
        for (uint32_t k = 0; k < s->len[i] && d < best; k++) d = sat_add(d, g->minrest[stk[k]]);
        if (d < best) best = d;
    }
    return best;
}

int tl_grammar_distance(const tl_grammar_state *s) { return tl_gset_distance(s->g, &s->cur); }
