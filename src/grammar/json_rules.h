/* Grammar rules for JSON's lexical pieces (src/grammar/json_rules.c): string characters, strings
 * with length bounds, numbers, literals and any value. Compact JSON, no whitespace. */
#ifndef TL_GRAMMAR_JSON_RULES_H
#define TL_GRAMMAR_JSON_RULES_H

#include <jansson.h>

#include "grammar/build.h"

typedef struct tl_jrules {
    tl_gbuild *b;
    int ch, str, integer, number, value; /* cached rule ids, -1 until built */
    int no_lt; /* set before the first rule: no raw '<' inside strings (only \u003c), for JSON
                * embedded in markup whose tags start with '<' (tool-call values) */
} tl_jrules;

#define TL_GRAMMAR_MAX_DIGITS 16   /* digits of an integer part or a fraction; exponent: 2 */
#define TL_GRAMMAR_MAX_REPEAT 4096 /* largest bound of minLength/maxLength/minItems/maxItems */

void tl_jr_init(tl_jrules *j, tl_gbuild *b);
/* Appends to rule r one alternative per well-formed multi-byte UTF-8 sequence shape (the first
 * without a separating GE_ALT when first is set). */
void tl_jr_utf8_multi(tl_gbuild *b, int r, int first);
int tl_jr_char(tl_jrules *j);                       /* one code point inside a string */
int tl_jr_string(tl_jrules *j, long min, long max); /* max < 0 = unbounded */
int tl_jr_number(tl_jrules *j, int integer);
int tl_jr_value(tl_jrules *j);                    /* any JSON value */
int tl_jr_literal(tl_jrules *j, const json_t *v); /* v's compact serialization */

#endif
