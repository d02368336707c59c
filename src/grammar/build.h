/* Internal grammar builder API (src/grammar/build.c). Errors are sticky: the first failure is
 * kept in b->err and returned by tl_gb_finish; a negative rule id passed in also becomes it. */
#ifndef TL_GRAMMAR_BUILD_H
#define TL_GRAMMAR_BUILD_H

#include "grammar/grammar.h"
#include "grammar/grammar_int.h"

typedef struct tl_grule {
    tl_gelem *e;
    size_t n, cap;
} tl_grule;

typedef struct tl_gbuild {
    tl_grule *r;
    int n, cap;
    int err;
} tl_gbuild;

int tl_gb_rule(tl_gbuild *b); /* a new empty rule (matches the empty string until filled) */
void tl_gb_char(tl_gbuild *b, int r, uint8_t lo, uint8_t hi);
void tl_gb_ref(tl_gbuild *b, int r, int ref);
void tl_gb_alt(tl_gbuild *b, int r); /* starts the next alternative of r */
void tl_gb_lit(tl_gbuild *b, int r, const char *s, size_t n);
int tl_gb_finish(tl_gbuild *b, int root, struct tl_grammar **out);
void tl_gb_free(tl_gbuild *b);

#endif
