/* allOf with several schemas (src/grammar/allof.c): merged into one schema where the merge is
 * exact, refused naming allOf where it is not (docs/architecture.md §9, "allOf"). */
#ifndef TL_GRAMMAR_ALLOF_H
#define TL_GRAMMAR_ALLOF_H

#include <jansson.h>

/* s is a schema object with "allOf"; its other keywords are one more schema of the conjunction.
 * *out (a new reference) is one schema without allOf at its top that accepts exactly the values
 * valid under every one of them (with anyOf/oneOf in a branch: an anyOf of allOfs, one per
 * alternative, to be compiled in turn). $ref inside root. Returns 0, or TL_ERR_UNSUPPORTED /
 * TL_ERR_INVALID / TL_ERR_NOMEM with err naming allOf and the keyword; *empty is set with
 * TL_ERR_INVALID when no value satisfies them all (types, enums or a required property forbidden
 * by another branch), so that a distributed alternative can be dropped. */
int tl_allof_merge(const json_t *root, const json_t *s, json_t **out, int *empty, char *err,
                   size_t errlen);

#endif
