/* The schema compiler's rule-level entry points (src/grammar/schema.c), for grammars that embed
 * JSON values in other text (src/grammar/compile.c: tool calls, prefixes). */
#ifndef TL_GRAMMAR_SCHEMA_H
#define TL_GRAMMAR_SCHEMA_H

#include <jansson.h>

#include "grammar/json_rules.h"

/* The rule of `schema` in builder b (j over the same builder); $ref resolves inside root.
 * Returns the rule id or a negative status with err naming the keyword (as
 * tl_grammar_from_schema). */
int tl_schema_rule(tl_gbuild *b, tl_jrules *j, const json_t *root, const json_t *schema, char *err,
                   size_t errlen);
/* The node a JSON pointer "#", "#/a/b" (with ~0 ~1) names inside root, or NULL (also for NULL). */
const json_t *tl_schema_resolve(const json_t *root, const char *ref);
/* 1 if k is an annotation keyword (title, description, $defs, ...): ignored by the compiler. */
int tl_schema_is_annotation(const char *k);
/* 0 when no value can match two of the oneOf alternatives `alts` (provably: different JSON
 * types, different const/enum values, or a required property with different const/enum values
 * in object branches), else TL_ERR_UNSUPPORTED with err naming oneOf (src/grammar/oneof.c). */
int tl_oneof_disjoint(const json_t *root, const json_t *alts, char *err, size_t errlen);
/* The rule of any JSON object ({"type":"json_object"}). */
int tl_schema_json_object(tl_jrules *j);

#endif
