/* The per-sequence matcher state (src/grammar/state.c): tl_grammar_state_* and the byte/token
 * accept functions, over the stack sets of match.c. */
#include <stdlib.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/grammar_int.h"

int tl_grammar_state_new(const tl_grammar *g, tl_grammar_state **out) {
    *out = NULL;
    if (!g) return TL_ERR_INVALID;
    tl_grammar_state *s = calloc(1, sizeof(*s));
    if (!s) return TL_ERR_NOMEM;
    s->g = g;
    int rc = tl_gset_init(g, &s->cur);
    if (rc) {
        tl_grammar_state_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void tl_grammar_state_free(tl_grammar_state *s) {
    if (!s) return;
    tl_gset_free(&s->cur);
    tl_gset_free(&s->tmp);
    free(s);
}

int tl_grammar_state_clone(const tl_grammar_state *s, tl_grammar_state **out) {
    *out = NULL;
    tl_grammar_state *c = calloc(1, sizeof(*c));
    if (!c) return TL_ERR_NOMEM;
    c->g = s->g;
    int rc = tl_gset_copy(&c->cur, &s->cur);
    if (rc) {
        tl_grammar_state_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int tl_grammar_accept_byte(tl_grammar_state *s, uint8_t b) {
    int rc = tl_gset_advance(s->g, &s->cur, b, &s->tmp);
    if (rc) return rc;
    if (s->tmp.n_stacks == 0) return TL_ERR_INVALID;
    tl_gstack_set t = s->cur;
    s->cur = s->tmp;
    s->tmp = t;
    return 0;
}

int tl_grammar_accept_bytes(tl_grammar_state *s, const uint8_t *p, size_t n) {
    if (n == 0) return 0;
    tl_grammar_state *c;
    int rc = tl_grammar_state_clone(s, &c);
    for (size_t i = 0; i < n && !rc; i++) rc = tl_grammar_accept_byte(c, p[i]);
    if (!rc) {
        tl_gstack_set t = s->cur;
        s->cur = c->cur;
        c->cur = t;
    }
    tl_grammar_state_free(c);
    return rc;
}

int tl_grammar_is_complete(const tl_grammar_state *s) {
    for (size_t i = 0; i < s->cur.n_stacks; i++)
        if (s->cur.len[i] == 0) return 1;
    return 0;
}

int tl_grammar_can_continue(const tl_grammar_state *s) {
    for (size_t i = 0; i < s->cur.n_stacks; i++)
        if (s->cur.len[i] > 0) return 1;
    return 0;
}
