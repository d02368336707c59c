/* String formats for the schema compiler (src/grammar/format.c). */
#ifndef TL_GRAMMAR_FORMAT_H
#define TL_GRAMMAR_FORMAT_H

#include "grammar/build.h"

/* The rule of a quoted string in format `name` ("date", "time", "date-time", "uuid", "email"),
 * or TL_ERR_UNSUPPORTED for any other name. */
int tl_format_rule(tl_gbuild *b, const char *name);

#endif
