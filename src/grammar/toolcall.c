/* The grammar of Qwen3.6 tool calls (src/grammar/toolcall.c), as the chat template writes them
 * and src/tokenizer/parse.c reads them (docs/model.md §4.4):
 *
 *   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
 *
 * NAME is one of the request's tools; the parameters are that tool's declared properties in
 * declaration order (required ones always, optional ones may be skipped, no others); each VALUE
 * is text that parse.c turns into a value valid under the property's schema, following the
 * parser's typing (tl_parse_value_type):
 *   - string-typed (and untyped) parameters: raw text without '<' (which could open a tag), at
 *     least one character, never "null" in any case unless the schema allows null; an enum of
 *     strings gives exactly its members. Other string keywords (minLength, maxLength, format,
 *     pattern) and typeless schemas other than a string enum or {} are refused by name.
 *   - integer, number, boolean, object, array, null: compact JSON under the property's schema
 *     (src/grammar/schema.c), with '<' inside strings written as \u003c.
 * Several calls (parallel) are separated by "\n".
 * Lenient (a forced call to a tool that is not strict): a parameter whose schema the grammar
 * cannot take is written as a value of its declared type(s) only (a string parameter: any raw
 * text), and top-level keywords other than the properties are ignored, so the call still parses
 * with a known name and declared, well-typed parameters; err names the last part relaxed. A
 * strict tool is never relaxed: what cannot be honoured fails by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/status.h"
#include "grammar/schema.h"
#include "grammar/toolcall.h"
#include "tokenizer/parse.h"

typedef struct tc {
    tl_gbuild *b;
    tl_jrules *j;
    char *err;
    size_t errlen;
    int lenient; /* the tool at hand may be relaxed (tl_toolcall_rule) */
    int relaxed; /* parts relaxed so far */
} tc;

/* Raw text: one or more characters, none of them '<'. */
static int raw_chars(tc *c) {
    tl_gbuild *b = c->b;
    int ch = tl_gb_rule(b), more = tl_gb_rule(b), r = tl_gb_rule(b);
    tl_gb_char(b, ch, 0x01, 0x3B);
    tl_gb_alt(b, ch);
    tl_gb_char(b, ch, 0x3D, 0x7F);
    tl_jr_utf8_multi(b, ch, 0);
    tl_gb_ref(b, more, ch); /* more = ch more | empty */
    tl_gb_ref(b, more, more);
    tl_gb_alt(b, more);
    tl_gb_ref(b, r, ch);
    tl_gb_ref(b, r, more);
    return b->err ? b->err : r;
}

/* Raw text that is not "null" in any case: the text is either not 4 characters long and
 * starting with n/u/l/l, or diverges from "null" at some position k (0..3) or goes on after it.
 * Built as: prefix of "null" of length k (any case) then a character that is not the next one,
 * then anything; or all four then at least one more; or a proper prefix alone. */
static int raw_not_null(tc *c) {
    tl_gbuild *b = c->b;
    int any = raw_chars(c), r = tl_gb_rule(b), first = 1;
    if (any < 0) return any;
    static const char nul[] = "null";
    for (int k = 0; k <= 4; k++) {
        /* the first k characters spell "null"[0..k) */
        int pre = tl_gb_rule(b);
        for (int i = 0; i < k; i++) {
            int ci = tl_gb_rule(b);
            tl_gb_char(b, ci, (uint8_t)nul[i], (uint8_t)nul[i]);
            tl_gb_alt(b, ci);
            tl_gb_char(b, ci, (uint8_t)(nul[i] - 32), (uint8_t)(nul[i] - 32));
            tl_gb_ref(b, pre, ci);
        }
        if (k > 0 && k < 4) { /* a proper prefix alone */
            if (!first) tl_gb_alt(b, r);
            tl_gb_ref(b, r, pre);
            first = 0;
        }
        if (!first) tl_gb_alt(b, r);
        first = 0;
        tl_gb_ref(b, r, pre);
        if (k == 4) { /* "null" and more */
            tl_gb_ref(b, r, any);
            continue;
        }
        /* a character other than nul[k] (either case), then optionally more */
        int ch = tl_gb_rule(b), lo = nul[k], up = nul[k] - 32, f = 1;
        for (int x = 1; x < 0x80; x++) {
            if (x == '<' || x == lo || x == up) continue;
            int hi = x;
            while (hi + 1 < 0x80 && hi + 1 != '<' && hi + 1 != lo && hi + 1 != up) hi++;
            if (!f) tl_gb_alt(b, ch);
            tl_gb_char(b, ch, (uint8_t)x, (uint8_t)hi);
            f = 0;
            x = hi;
        }
        tl_jr_utf8_multi(b, ch, 0);
        int opt = tl_gb_rule(b);
        tl_gb_ref(b, opt, any);
        tl_gb_alt(b, opt);
        tl_gb_ref(b, r, ch);
        tl_gb_ref(b, r, opt);
    }
    return b->err ? b->err : r;
}

static int allows_null(const json_t *prop) {
    const json_t *t = json_object_get(prop, "type");
    if (json_is_true(json_object_get(prop, "nullable"))) return 1;
    for (size_t i = 0; i < json_array_size(t); i++)
        if (!strcmp(json_string_value(json_array_get(t, i)) ?: "", "null")) return 1;
    return 0;
}

static const char *const str_ok[] = {
    "type",     "enum",        "const",      "nullable", "title",     "default", "examples",
    "$comment", "description", "deprecated", "readOnly", "writeOnly", NULL};

/* A string enum (or const) as raw alternatives; members with '<', "null" or non-strings are
 * refused. */
static int raw_enum(tc *c, const char *pname, const json_t *prop) {
    const json_t *e = json_object_get(prop, "enum"), *k = json_object_get(prop, "const");
    size_t n = k ? 1 : json_array_size(e);
    int r = tl_gb_rule(c->b);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = k ? k : json_array_get(e, i);
        const char *s = json_string_value(v);
        if (!s || strchr(s, '<') || !s[0] || !strcasecmp(s, "null"))
            return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED,
                           "tool parameter \"%s\": enum value that is not a non-empty string "
                           "without '<' (other than \"null\")",
                           pname);
        if (i) tl_gb_alt(c->b, r);
        tl_gb_lit(c->b, r, s, strlen(s));
    }
    if (!n)
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "tool parameter \"%s\": empty enum",
                       pname);
    return c->b->err ? c->b->err : r;
}

static int str_value(tc *c, const char *pname, const json_t *prop) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)prop, k, v) {
        int ok = 0;
        for (const char *const *o = str_ok; *o && !ok; o++) ok = !strcmp(*o, k);
        if (!ok)
            return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED,
                           "unsupported schema keyword \"%s\" in tool parameter \"%s\" (a "
                           "string parameter takes type, enum and const)",
                           k, pname);
    }
    if (json_object_get(prop, "enum") || json_object_get(prop, "const"))
        return raw_enum(c, pname, prop);
    return allows_null(prop) ? raw_chars(c) : raw_not_null(c);
}

static int param_strict(tc *c, const char *pname, const json_t *root, const json_t *prop) {
    if (!prop || tl_parse_value_type(prop) == TL_PVAL_STR) return str_value(c, pname, prop);
    int r = tl_schema_rule(c->b, c->j, root, prop, c->err, c->errlen);
    if (r < 0 && c->err && c->errlen) {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", c->err);
        tl_errf(c->err, c->errlen, r, "tool parameter \"%s\": %s", pname, tmp);
    }
    return r;
}

/* A parameter's value; lenient, a schema the grammar cannot take becomes its declared type(s)
 * only: {"type": T} (any raw text for a string parameter), or any JSON value. */
static int param_value(tc *c, const char *pname, const json_t *root, const json_t *prop) {
    int r = param_strict(c, pname, root, prop);
    if (r != TL_ERR_UNSUPPORTED || !c->lenient) return r;
    c->relaxed++;
    size_t n = strlen(c->err);
    if (n + 40 < c->errlen)
        snprintf(c->err + n, c->errlen - n, ": its type only (tool not strict)");
    if (tl_parse_value_type(prop) == TL_PVAL_STR)
        return allows_null(prop) ? raw_chars(c) : raw_not_null(c);
    json_t *t = json_object_get(prop, "type"), *loose = json_object();
    if (!loose) return TL_ERR_NOMEM;
    if (t) json_object_set(loose, "type", t);
    char scratch[64] = "";
    r = tl_schema_rule(c->b, c->j, root, loose, scratch, sizeof scratch);
    json_decref(loose);
    return r >= 0 ? r : tl_jr_value(c->j);
}

/* "<parameter=P>\nVALUE\n</parameter>\n" */
static int param_rule(tc *c, const char *pname, const json_t *root, const json_t *prop) {
    if (strpbrk(pname, "<>\n\r") || !pname[0])
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED,
                       "tool parameter name \"%s\" cannot be written in a tool call", pname);
    int v = param_value(c, pname, root, prop);
    if (v < 0) return v;
    int r = tl_gb_rule(c->b);
    tl_gb_lit(c->b, r, "<parameter=", 11);
    tl_gb_lit(c->b, r, pname, strlen(pname));
    tl_gb_lit(c->b, r, ">\n", 2);
    tl_gb_ref(c->b, r, v);
    tl_gb_lit(c->b, r, "\n</parameter>\n", 14);
    return c->b->err ? c->b->err : r;
}

static int is_required(const json_t *req, const char *name) {
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!strcmp(json_string_value(json_array_get(req, i)) ?: "", name)) return 1;
    return 0;
}

/* A tool's parameters are written as its object's properties: any other top-level keyword
 * (allOf, anyOf, $ref, patternProperties, ...) would go unenforced, so it is refused by name;
 * "type" must be "object". */
static int params_check(tc *c, const json_t *params) {
    static const char *const ok[] = {"type",  "properties",  "required", "additionalProperties",
                                     "$defs", "definitions", NULL};
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)params, k, v) {
        int good = tl_schema_is_annotation(k);
        for (const char *const *o = ok; *o && !good; o++) good = !strcmp(*o, k);
        if (!good) {
            tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED,
                    "unsupported schema keyword \"%s\" at the top of a tool's parameters (they "
                    "are an object's properties, required and additionalProperties)%s",
                    k, c->lenient ? ": ignored (tool not strict)" : "");
            if (!c->lenient) return TL_ERR_UNSUPPORTED;
            c->relaxed++;
        }
    }
    const json_t *t = json_object_get(params, "type");
    if (t && !(json_is_string(t) && !strcmp(json_string_value(t), "object")) && !c->lenient)
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED,
                       "tool parameters of a \"type\" other than \"object\" are not supported");
    return 0;
}

/* The parameters in order, optional ones skippable: chain[i] = param_i chain[i+1] (| chain[i+1]
 * when optional); then "</function>\n". */
static int params_rule(tc *c, const json_t *params) {
    int st = params_check(c, params);
    if (st) return st;
    const json_t *props = json_object_get(params, "properties");
    const json_t *req = json_object_get(params, "required");
    int next = tl_gb_rule(c->b);
    tl_gb_lit(c->b, next, "</function>\n", 12);
    /* required names without a property come last, as raw strings */
    for (size_t i = json_array_size(req); i-- > 0;) {
        const char *nm = json_string_value(json_array_get(req, i));
        if (!nm || json_object_get(props, nm)) continue;
        int p = param_rule(c, nm, params, NULL), r = tl_gb_rule(c->b);
        if (p < 0) return p;
        tl_gb_ref(c->b, r, p);
        tl_gb_ref(c->b, r, next);
        next = r;
    }
    size_t n = json_object_size(props);
    const char **names = n ? calloc(n, sizeof(*names)) : NULL;
    if (n && !names) return TL_ERR_NOMEM;
    size_t k = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)props, key, v) names[k++] = key;
    int rc = 0;
    for (size_t i = n; i-- > 0 && rc >= 0;) {
        const json_t *prop = json_object_get(props, names[i]);
        if (json_is_false(prop)) continue;
        int p = param_rule(c, names[i], params, json_is_object(prop) ? prop : NULL);
        if (p < 0) {
            rc = p;
            break;
        }
        int r = tl_gb_rule(c->b);
        tl_gb_ref(c->b, r, p);
        tl_gb_ref(c->b, r, next);
        if (!is_required(req, names[i])) {
            tl_gb_alt(c->b, r);
            tl_gb_ref(c->b, r, next);
        }
        next = r;
    }
    free(names);
    return rc < 0 ? rc : c->b->err ? c->b->err : next;
}

/* "<function=NAME>\n" params "</function>\n" for one tool. */
static int function_rule(tc *c, const json_t *fn, int lenient) {
    c->lenient = lenient && !json_is_true(json_object_get(fn, "strict"));
    const char *name = json_string_value(json_object_get(fn, "name"));
    if (!name || !name[0] || strpbrk(name, "<>\n\r"))
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED,
                       "tool name \"%s\" cannot be written in a tool call", name ? name : "");
    const json_t *params = json_object_get(fn, "parameters");
    int p = params ? params_rule(c, params) : -1;
    if (!params) {
        p = tl_gb_rule(c->b);
        tl_gb_lit(c->b, p, "</function>\n", 12);
    }
    if (p < 0) return p;
    int r = tl_gb_rule(c->b);
    tl_gb_lit(c->b, r, "<function=", 10);
    tl_gb_lit(c->b, r, name, strlen(name));
    tl_gb_lit(c->b, r, ">\n", 2);
    tl_gb_ref(c->b, r, p);
    return c->b->err ? c->b->err : r;
}

int tl_toolcall_rule(tl_gbuild *b, tl_jrules *j, const json_t *tools, const char *only,
                     int parallel, int lenient, char *err, size_t errlen) {
    tc c = {b, j, err, errlen, 0, 0};
    j->no_lt = 1;
    int fns = tl_gb_rule(b), n = 0;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!fn || (only && (!name || strcmp(name, only)))) continue;
        int f = function_rule(&c, fn, lenient);
        if (f < 0) return f;
        if (n++) tl_gb_alt(b, fns);
        tl_gb_ref(b, fns, f);
    }
    if (!n) return tl_errf(err, errlen, TL_ERR_INVALID, "no tool to call");
    int call = tl_gb_rule(b);
    tl_gb_lit(b, call, "<tool_call>\n", 12);
    tl_gb_ref(b, call, fns);
    tl_gb_lit(b, call, "</tool_call>", 12);
    if (!parallel) return b->err ? b->err : call;
    int more = tl_gb_rule(b), r = tl_gb_rule(b); /* more = "\n" call more | empty */
    tl_gb_char(b, more, '\n', '\n');
    tl_gb_ref(b, more, call);
    tl_gb_ref(b, more, more);
    tl_gb_alt(b, more);
    tl_gb_ref(b, r, call);
    tl_gb_ref(b, r, more);
    return b->err ? b->err : r;
}
