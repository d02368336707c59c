/* The tool-call grammar (src/grammar/toolcall.c; the format is described there). */
#ifndef TL_GRAMMAR_TOOLCALL_H
#define TL_GRAMMAR_TOOLCALL_H

#include <jansson.h>

#include "grammar/json_rules.h"

/* The rule of one tool call (several separated by "\n" when parallel) to any of tools (only the
 * one named `only` when it is not NULL). Sets j->no_lt (j must be fresh). A negative status with
 * err naming what cannot be honoured. lenient: a tool without "strict": true gets the parts of
 * its parameters' schema the grammar cannot take relaxed instead (toolcall.c); err then names
 * the last part relaxed (untouched when none was). */
int tl_toolcall_rule(tl_gbuild *b, tl_jrules *j, const json_t *tools, const char *only,
                     int parallel, int lenient, char *err, size_t errlen);

#endif
