/* tl_grammar_compile (src/grammar/compile.c): one entry for every kind of constrained output the
 * server asks for (a schema, any JSON object, a regex, a choice of strings, tool calls), after an
 * optional literal prefix. */
#include <string.h>

#include "common/status.h"
#include "grammar/regex.h"
#include "grammar/schema.h"
#include "grammar/toolcall.h"

static int choice_rule(tl_gbuild *b, const json_t *choices, char *err, size_t errlen) {
    if (!json_is_array(choices) || json_array_size(choices) == 0)
        return tl_errf(err, errlen, TL_ERR_INVALID, "choice must be a non-empty array of strings");
    int r = tl_gb_rule(b);
    for (size_t i = 0; i < json_array_size(choices); i++) {
        const json_t *c = json_array_get(choices, i);
        if (!json_is_string(c))
            return tl_errf(err, errlen, TL_ERR_INVALID, "choice must be an array of strings");
        if (i) tl_gb_alt(b, r);
        tl_gb_lit(b, r, json_string_value(c), json_string_length(c));
    }
    return b->err ? b->err : r;
}

static int body_rule(const tl_grammar_spec *sp, tl_gbuild *b, tl_jrules *j, char *err,
                     size_t errlen) {
    switch (sp->kind) {
    case TL_GRAMMAR_SCHEMA:
        return tl_schema_rule(b, j, sp->schema, sp->schema, err, errlen);
    case TL_GRAMMAR_JSON_OBJECT:
        return tl_schema_json_object(j);
    case TL_GRAMMAR_REGEX:
        return sp->regex ? tl_regex_rule(b, sp->regex, err, errlen)
                         : tl_errf(err, errlen, TL_ERR_INVALID, "regex must be a string");
    case TL_GRAMMAR_CHOICE:
        return choice_rule(b, sp->choices, err, errlen);
    case TL_GRAMMAR_TOOL_CALLS:
        return tl_toolcall_rule(b, j, sp->tools, sp->tool_name, sp->parallel, sp->lenient, err,
                                errlen);
    }
    return tl_errf(err, errlen, TL_ERR_INVALID, "unknown grammar kind");
}

int tl_grammar_compile(const tl_grammar_spec *sp, tl_grammar **out, char *err, size_t errlen) {
    *out = NULL;
    if (err && errlen) err[0] = 0;
    tl_gbuild b = {0};
    tl_jrules j;
    tl_jr_init(&j, &b);
    int body = body_rule(sp, &b, &j, err, errlen), root = body;
    if (body >= 0 && sp->prefix && sp->prefix[0]) {
        root = tl_gb_rule(&b);
        tl_gb_lit(&b, root, sp->prefix, strlen(sp->prefix));
        tl_gb_ref(&b, root, body);
    }
    int rc = root < 0 ? root : tl_gb_finish(&b, root, out);
    tl_gb_free(&b);
    if (rc && err && errlen && !err[0]) tl_errf(err, errlen, rc, "grammar construction failed");
    return rc;
}
