/* The grammar builder (src/grammar/build.c): rules are built one by one as element vectors
 * (any order, forward references allowed) and flattened into a tl_grammar at the end. */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/build.h"

int tl_gb_rule(tl_gbuild *b) {
    if (b->n == b->cap) {
        int c = b->cap ? b->cap * 2 : 64;
        tl_grule *r = realloc(b->r, (size_t)c * sizeof(*r));
        if (!r) {
            b->err = TL_ERR_NOMEM;
            return TL_ERR_NOMEM;
        }
        b->r = r;
        b->cap = c;
    }
    memset(&b->r[b->n], 0, sizeof(b->r[0]));
    return b->n++;
}

static void put(tl_gbuild *b, int r, uint8_t kind, uint8_t lo, uint8_t hi, int32_t ref) {
    if (b->err || r < 0) {
        if (!b->err) b->err = r;
        return;
    }
    tl_grule *v = &b->r[r];
    if (v->n == v->cap) {
        size_t c = v->cap ? v->cap * 2 : 8;
        tl_gelem *e = realloc(v->e, c * sizeof(*e));
        if (!e) {
            b->err = TL_ERR_NOMEM;
            return;
        }
        v->e = e;
        v->cap = c;
    }
    v->e[v->n++] = (tl_gelem){kind, lo, hi, ref};
}

void tl_gb_char(tl_gbuild *b, int r, uint8_t lo, uint8_t hi) { put(b, r, GE_CHAR, lo, hi, 0); }

void tl_gb_ref(tl_gbuild *b, int r, int ref) {
    if (ref < 0 && !b->err) b->err = ref;
    put(b, r, GE_REF, 0, 0, ref);
}

void tl_gb_alt(tl_gbuild *b, int r) { put(b, r, GE_ALT, 0, 0, 0); }

void tl_gb_lit(tl_gbuild *b, int r, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) tl_gb_char(b, r, (uint8_t)s[i], (uint8_t)s[i]);
}

void tl_gb_free(tl_gbuild *b) {
    for (int i = 0; i < b->n; i++) free(b->r[i].e);
    free(b->r);
    memset(b, 0, sizeof(*b));
}

/* Element 0 is a reference to the root followed by GE_END; then every rule, GE_END-terminated. */
int tl_gb_finish(tl_gbuild *b, int root, struct tl_grammar **out) {
    *out = NULL;
    if (b->err) return b->err;
    if (root < 0) return root;
    size_t n = 2;
    for (int i = 0; i < b->n; i++) n += b->r[i].n + 1;
    struct tl_grammar *g = calloc(1, sizeof(*g));
    if (g) g->el = malloc(n * sizeof(tl_gelem));
    if (g && g->el) g->rule_start = malloc(((size_t)b->n + 1) * sizeof(int32_t));
    if (!g || !g->el || !g->rule_start) {
        tl_grammar_free(g);
        return TL_ERR_NOMEM;
    }
    g->el[0] = (tl_gelem){GE_REF, 0, 0, root};
    g->el[1] = (tl_gelem){GE_END, 0, 0, 0};
    size_t k = 2;
    for (int i = 0; i < b->n; i++) {
        g->rule_start[i] = (int32_t)k;
        if (b->r[i].n) memcpy(g->el + k, b->r[i].e, b->r[i].n * sizeof(tl_gelem));
        k += b->r[i].n;
        g->el[k++] = (tl_gelem){GE_END, 0, 0, 0};
    }
    g->n_el = k;
    g->n_rules = b->n;
    g->root = root;
    int rc = tl_grammar_minrest(g);
    if (rc) {
        tl_grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

void tl_grammar_free(tl_grammar *g) {
    if (!g) return;
    free(g->el);
    free(g->rule_start);
    free(g->minrest);
    free(g);
}
