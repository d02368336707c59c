/* The regex subset compiler (src/grammar/regex.c; the subset is described there). */
#ifndef TL_GRAMMAR_REGEX_H
#define TL_GRAMMAR_REGEX_H

#include <stddef.h>

#include "grammar/build.h"

#define TL_REGEX_MAX_REPEAT 1000 /* largest bound of {m,n} */

/* The rule of strings that match re (NUL-terminated) as a whole, or a negative status with err
 * naming the construct that cannot be honoured. */
int tl_regex_rule(tl_gbuild *b, const char *re, char *err, size_t errlen);

/* JSON Schema `pattern`: the body (quotes left out) of a JSON string whose decoded value
 * contains a match of re (search semantics; '^' / '$' anchor a top-level alternative); no_lt:
 * '<' is written \u003c (tl_jrules.no_lt). Same errors. */
int tl_regex_json_rule(tl_gbuild *b, const char *re, int no_lt, char *err, size_t errlen);

#endif
