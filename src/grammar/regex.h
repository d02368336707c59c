/* The regex subset compiler (src/grammar/regex.c; the subset is described there). */
#ifndef TL_GRAMMAR_REGEX_H
#define TL_GRAMMAR_REGEX_H

#include <stddef.h>

#include "grammar/build.h"

#define TL_REGEX_MAX_REPEAT 1000 /* largest bound of {m,n} */

/* The rule of strings that match re (NUL-terminated) as a whole, or a negative status with err
 * naming the construct that cannot be honoured. */
int tl_regex_rule(tl_gbuild *b, const char *re, char *err, size_t errlen);

#endif
