/* JSON Schema -> grammar compiler (src/grammar/schema.c). Supported: type (lists too), enum,
 * const, anyOf/oneOf (as alternatives), allOf (merged by allof.c), $ref into the document
 * (recursive), properties/required/additionalProperties, items/prefixItems/minItems/maxItems,
 * minLength/maxLength, format (format.c), pattern (regex.c, search semantics), nullable,
 * minimum/maximum/exclusive* (numrange.c), multipleOf 1. Anything else that constrains is refused
 * by name. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/allof.h"
#include "grammar/format.h"
#include "grammar/json_rules.h"
#include "grammar/numrange.h"
#include "grammar/regex.h"
#include "grammar/schema.h"

typedef struct cx {
    tl_gbuild *b;
    tl_jrules *j;
    const json_t *root;
    const json_t **ref_key;
    int *ref_rule, n_ref, cap_ref;
    char *err;
    size_t errlen;
    int depth, merges;
} cx;

static const char *const annot[] = {
    "$schema",    "$id",      "$comment",  "title", "description", "default", "examples",
    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "$anchor", NULL};
static const char *const handled[] = {"type",
                                      "enum",
                                      "const",
                                      "anyOf",
                                      "oneOf",
                                      "allOf",
                                      "$ref",
                                      "nullable",
                                      "properties",
                                      "required",
                                      "additionalProperties",
                                      "items",
                                      "prefixItems",
                                      "minItems",
                                      "maxItems",
                                      "minLength",
                                      "maxLength",
                                      "format",
                                      "pattern",
                                      "minimum",
                                      "maximum",
                                      "exclusiveMinimum",
                                      "exclusiveMaximum",
                                      "multipleOf",
                                      NULL};

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static int check_keys(cx *c, const json_t *s) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (in_list(annot, k) || in_list(handled, k)) continue;
        if (!strcmp(k, "uniqueItems") && json_is_false(v)) continue;
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED, "unsupported schema keyword \"%s\"",
                       k);
    }
    return 0;
}

/* Fails unless s has only annotations and the keywords in ok (NULL-terminated). */
static int only(cx *c, const json_t *s, const char *what, const char *const *ok) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (in_list(annot, k) || in_list(ok, k) || !strcmp(k, what)) continue;
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED,
                       "schema keyword \"%s\" combined with \"%s\" is not supported", k, what);
    }
    return 0;
}

static int c_schema(cx *c, const json_t *s);

enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_INT = 32, T_NUM = 64 };
static const char *const tnames[] = {"null",   "boolean", "object", "array",
                                     "string", "integer", "number"};

int tl_schema_is_annotation(const char *k) { return in_list(annot, k); }

const json_t *tl_schema_resolve(const json_t *root, const char *ref) {
    if (!ref || ref[0] != '#') return NULL;
    const json_t *cur = root;
    const char *p = ref + 1;
    char key[256];
    while (*p == '/' && cur) {
        p++;
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1')) ch = *++p == '0' ? '~' : '/';
            if (n + 1 >= sizeof(key)) return NULL;
            key[n++] = ch;
        }
        key[n] = 0;
        cur = json_is_array(cur) ? json_array_get(cur, (size_t)strtoul(key, NULL, 10))
                                 : json_object_get(cur, key);
    }
    return *p ? NULL : cur;
}

static int c_ref(cx *c, const json_t *s) {
    const char *ref = json_string_value(json_object_get(s, "$ref"));
    const json_t *t = tl_schema_resolve(c->root, ref);
    if (!t)
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED, "$ref \"%s\" cannot be resolved",
                       ref ? ref : "(not a string)");
    for (int i = 0; i < c->n_ref; i++)
        if (c->ref_key[i] == t) return c->ref_rule[i];
    if (c->n_ref == c->cap_ref) {
        int n = c->cap_ref ? c->cap_ref * 2 : 16;
        const json_t **k = realloc(c->ref_key, (size_t)n * sizeof(*k));
        if (k) c->ref_key = k;
        int *r = k ? realloc(c->ref_rule, (size_t)n * sizeof(*r)) : NULL;
        if (!r) return TL_ERR_NOMEM;
        c->ref_rule = r;
        c->cap_ref = n;
    }
    int id = tl_gb_rule(c->b);
    if (id < 0) return id;
    c->ref_key[c->n_ref] = t;
    c->ref_rule[c->n_ref++] = id;
    int body = c_schema(c, t);
    if (body < 0) return body;
    tl_gb_ref(c->b, id, body);
    return id;
}

/* A non-negative integer keyword into *out (absent: def). */
static int bound(cx *c, const json_t *s, const char *k, long def, long *out) {
    const json_t *v = json_object_get(s, k);
    *out = def;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "\"%s\" must be a non-negative integer",
                       k);
    if (json_integer_value(v) > TL_GRAMMAR_MAX_REPEAT)
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED, "\"%s\" above %d is not supported", k,
                       TL_GRAMMAR_MAX_REPEAT);
    *out = (long)json_integer_value(v);
    return 0;
}

static int c_format(cx *c, const json_t *s, const json_t *f) {
    static const char *const ok[] = {"type", "nullable", NULL};
    int rc = only(c, s, "format", ok);
    if (rc) return rc;
    rc = json_is_string(f) ? tl_format_rule(c->b, json_string_value(f)) : TL_ERR_UNSUPPORTED;
    if (rc == TL_ERR_UNSUPPORTED)
        return tl_errf(c->err, c->errlen, rc, "unsupported schema keyword \"format\": \"%s\"",
                       json_is_string(f) ? json_string_value(f) : "(not a string)");
    return rc;
}

/* A string whose value contains a match of `pattern` (docs/architecture.md §9). Its intersection
 * with minLength/maxLength is not built: the combination is refused. */
static int c_pattern(cx *c, const json_t *s, const json_t *p) {
    static const char *const ok[] = {"type", "nullable", NULL};
    int rc = only(c, s, "pattern", ok);
    if (rc) return rc;
    if (!json_is_string(p) || strlen(json_string_value(p)) != json_string_length(p))
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID,
                       "schema keyword \"pattern\" must be a string without NUL");
    char why[200] = "";
    int body = tl_regex_json_rule(c->b, json_string_value(p), c->j->no_lt, why, sizeof why);
    if (body < 0)
        return tl_errf(c->err, c->errlen, body, "schema keyword \"pattern\": %s",
                       why[0] ? why : "grammar construction failed");
    int r = tl_gb_rule(c->b);
    tl_gb_lit(c->b, r, "\"", 1);
    tl_gb_ref(c->b, r, body);
    tl_gb_lit(c->b, r, "\"", 1);
    return c->b->err ? c->b->err : r;
}

static int c_string(cx *c, const json_t *s) {
    const json_t *f = json_object_get(s, "format");
    if (f) return c_format(c, s, f);
    const json_t *p = json_object_get(s, "pattern");
    if (p) return c_pattern(c, s, p);
    long mn, mx;
    int rc = bound(c, s, "minLength", 0, &mn);
    if (!rc) rc = bound(c, s, "maxLength", -1, &mx);
    if (rc) return rc;
    if (mx >= 0 && mx < mn)
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "maxLength below minLength");
    return tl_jr_string(c->j, mn, mx);
}

/* 1 if value v is of a type named by "type" (a string or a list; absent: any). */
static int enum_type_ok(const json_t *t, const json_t *v) {
    if (!t) return 1;
    size_t n = json_is_array(t) ? json_array_size(t) : 1;
    for (size_t i = 0; i < n; i++) {
        const char *nm = json_string_value(json_is_array(t) ? json_array_get(t, i) : t);
        if (!nm) continue;
        if ((!strcmp(nm, "null") && json_is_null(v)) ||
            (!strcmp(nm, "boolean") && json_is_boolean(v)) ||
            (!strcmp(nm, "object") && json_is_object(v)) ||
            (!strcmp(nm, "array") && json_is_array(v)) ||
            (!strcmp(nm, "string") && json_is_string(v)) ||
            (!strcmp(nm, "number") && json_is_number(v)) ||
            (!strcmp(nm, "integer") && json_is_integer(v)))
            return 1;
    }
    return 0;
}

/* enum/const: the values' literals, those of another type than "type" left out. */
static int c_enum(cx *c, const json_t *s) {
    static const char *const ok[] = {"type", NULL};
    const json_t *e = json_object_get(s, "enum"), *k = json_object_get(s, "const");
    const json_t *t = json_object_get(s, "type");
    const char *what = k ? "const" : "enum";
    int rc = only(c, s, what, ok);
    if (rc) return rc;
    if (k && e)
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED, "\"const\" together with \"enum\"");
    if (e && (!json_is_array(e) || json_array_size(e) == 0))
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "\"enum\" must be a non-empty array");
    int r = tl_gb_rule(c->b), used = 0;
    size_t n = k ? 1 : json_array_size(e);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = k ? k : json_array_get(e, i);
        if (!enum_type_ok(t, v)) continue;
        int lit = tl_jr_literal(c->j, v);
        if (lit < 0) return lit;
        if (used++) tl_gb_alt(c->b, r);
        tl_gb_ref(c->b, r, lit);
    }
    if (!used)
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "no \"%s\" value has the \"type\"", what);
    return r;
}

static int c_combo(cx *c, const json_t *s, const char *what) {
    const json_t *l = json_object_get(s, what);
    int rc = only(c, s, what, (const char *const[]){NULL});
    if (rc) return rc;
    if (!json_is_array(l) || json_array_size(l) == 0)
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "\"%s\" must be a non-empty array", what);
    if (!strcmp(what, "oneOf") && (rc = tl_oneof_disjoint(c->root, l, c->err, c->errlen)))
        return rc; /* alternatives are oneOf only where no value matches two */
    int r = tl_gb_rule(c->b);
    for (size_t i = 0; i < json_array_size(l); i++) {
        int a = c_schema(c, json_array_get(l, i));
        if (a < 0) return a;
        if (i) tl_gb_alt(c->b, r);
        tl_gb_ref(c->b, r, a);
    }
    return r;
}

/* allOf (and the schema's other keywords): merged into one schema by allof.c, compiled in turn.
 * A distributed anyOf/oneOf comes back as an anyOf of allOfs: each is merged the same way, and
 * one that no value satisfies is left out. With `empty`, a conjunction that no value satisfies
 * sets *empty instead of failing alone. */
#define MAX_MERGES 2000

static int c_allof(cx *c, const json_t *s, int *empty) {
    if (++c->merges > MAX_MERGES)
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED,
                       "\"allOf\" needing more than %d merges is not supported", MAX_MERGES);
    json_t *m;
    int none = 0, rc = tl_allof_merge(c->root, s, &m, &none, c->err, c->errlen);
    if (rc) {
        if (none && empty) *empty = 1;
        return rc;
    }
    const json_t *alts = json_object_get(m, "anyOf");
    if (!alts) {
        rc = c_schema(c, m);
        json_decref(m);
        return rc;
    }
    int r = tl_gb_rule(c->b), used = 0;
    for (size_t i = 0; i < json_array_size(alts) && r >= 0; i++) {
        int e = 0, a = c_allof(c, json_array_get(alts, i), &e);
        if (a < 0 && e) continue;
        if (a < 0) r = a;
        if (a >= 0 && used++) tl_gb_alt(c->b, r);
        if (a >= 0) tl_gb_ref(c->b, r, a);
    }
    json_decref(m);
    if (r >= 0 && !used) {
        if (empty) *empty = 1;
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID,
                       "\"allOf\": no value satisfies every schema in any combination of the "
                       "anyOf/oneOf alternatives");
    }
    if (r >= 0 && c->err) c->err[0] = 0; /* a left-out alternative's message */
    return r;
}

/* {"k":v,...} with any keys and values of rule v. */
static int generic_object(cx *c, int v) {
    tl_gbuild *b = c->b;
    int str = tl_jr_string(c->j, 0, -1), kv = tl_gb_rule(b), o2 = tl_gb_rule(b);
    int r = tl_gb_rule(b);
    tl_gb_ref(b, kv, str);
    tl_gb_char(b, kv, ':', ':');
    tl_gb_ref(b, kv, v);
    tl_gb_char(b, o2, '}', '}');
    tl_gb_alt(b, o2);
    tl_gb_char(b, o2, ',', ',');
    tl_gb_ref(b, o2, kv);
    tl_gb_ref(b, o2, o2);
    tl_gb_lit(b, r, "{}", 2);
    tl_gb_alt(b, r);
    tl_gb_char(b, r, '{', '{');
    tl_gb_ref(b, r, kv);
    tl_gb_ref(b, r, o2);
    return b->err ? b->err : r;
}

/* "name":value for one declared property. */
static int member(cx *c, const char *name, const json_t *sch) {
    int v = sch ? c_schema(c, sch) : tl_jr_value(c->j);
    if (v < 0) return v;
    json_t *k = json_string(name);
    int lit = k ? tl_jr_literal(c->j, k) : TL_ERR_NOMEM;
    json_decref(k);
    int r = tl_gb_rule(c->b);
    tl_gb_ref(c->b, r, lit);
    tl_gb_char(c->b, r, ':', ':');
    tl_gb_ref(c->b, r, v);
    return c->b->err ? c->b->err : r;
}

static int is_required(const json_t *req, const char *name) {
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!strcmp(json_string_value(json_array_get(req, i)) ?: "", name)) return 1;
    return 0;
}

/* The declared members: properties not false, then required names not in properties. */
static int collect_members(const json_t *props, const json_t *req, const char **names,
                           const json_t **schs) {
    int k = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)props, key, v) {
        if (json_is_false(v)) continue;
        names[k] = key;
        schs[k++] = v;
    }
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *nm = json_string_value(json_array_get(req, i));
        if (!json_object_get(props, nm)) names[k] = nm, schs[k++] = NULL;
    }
    return k;
}

/* Members in order; rule f(i) = members i.. with none written yet, a(i) = the same after at least
 * one (a comma first). Optional members may be skipped. */
static int member_chain(cx *c, const json_t *req, const char **names, const json_t **schs, int k) {
    tl_gbuild *b = c->b;
    int first = tl_gb_rule(b), next_first = -1, next_after = -1;
    for (int i = k; i >= 0; i--) {
        int f = tl_gb_rule(b), a = tl_gb_rule(b);
        if (i == k) {
            tl_gb_char(b, f, '}', '}');
            tl_gb_char(b, a, '}', '}');
        } else {
            int m = member(c, names[i], schs[i]), req_i = is_required(req, names[i]);
            if (m < 0) return m;
            tl_gb_ref(b, f, m);
            tl_gb_ref(b, f, next_after);
            tl_gb_char(b, a, ',', ',');
            tl_gb_ref(b, a, m);
            tl_gb_ref(b, a, next_after);
            if (!req_i) {
                tl_gb_alt(b, f);
                tl_gb_ref(b, f, next_first);
                tl_gb_alt(b, a);
                tl_gb_ref(b, a, next_after);
            }
        }
        next_first = f;
        next_after = a;
    }
    tl_gb_char(b, first, '{', '{');
    tl_gb_ref(b, first, next_first);
    return b->err ? b->err : first;
}

static int declared_object(cx *c, const json_t *props, const json_t *req, int n) {
    const char **names = malloc((size_t)n * sizeof(*names));
    const json_t **schs = malloc((size_t)n * sizeof(*schs));
    int rc = TL_ERR_NOMEM;
    if (names && schs)
        rc = member_chain(c, req, names, schs, collect_members(props, req, names, schs));
    free(names);
    free(schs);
    return rc;
}

static int c_object(cx *c, const json_t *s) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *ap = json_object_get(s, "additionalProperties");
    if ((props && !json_is_object(props)) || (req && !json_is_array(req)) ||
        (ap && !json_is_boolean(ap) && !json_is_object(ap)))
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "malformed object keywords");
    int n = 0;
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *nm = json_string_value(json_array_get(req, i));
        if (!nm) return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "\"required\" needs strings");
        const json_t *p = json_object_get(props, nm);
        if (json_is_false(p) || (!p && json_is_false(ap)))
            return tl_errf(c->err, c->errlen, TL_ERR_INVALID,
                           "required property \"%s\" is forbidden", nm);
        n += !p;
    }
    n += props ? (int)json_object_size(props) : 0;
    if (n == 0 && !json_is_false(ap)) {
        int v = json_is_object(ap) ? c_schema(c, ap) : tl_jr_value(c->j);
        return v < 0 ? v : generic_object(c, v);
    }
    return declared_object(c, props, req, n);
}

/* Rule i = "i elements written"; element i is prefixItems[i] or items; the last rule loops when
 * there is no maxItems. */
#define NONE (-1000000) /* no element allowed at this index */

static int c_array(cx *c, const json_t *s) {
    const json_t *pre = json_object_get(s, "prefixItems"), *it = json_object_get(s, "items");
    if (json_is_array(it) && !pre) pre = it, it = NULL;
    if ((pre && !json_is_array(pre)) || (it && !json_is_object(it) && !json_is_boolean(it)))
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "malformed items/prefixItems");
    long mn, mx, k = (long)json_array_size(pre);
    int rc = bound(c, s, "minItems", 0, &mn);
    if (!rc) rc = bound(c, s, "maxItems", -1, &mx);
    if (rc) return rc;
    if (k > TL_GRAMMAR_MAX_REPEAT)
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED, "too many prefixItems");
    int rest = json_is_false(it) ? NONE : json_is_object(it) ? c_schema(c, it) : tl_jr_value(c->j);
    if (rest == NONE && (mx < 0 || mx > k)) mx = k;
    if (rest < 0 && rest != NONE) return rest;
    if (mx >= 0 && mx < mn)
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "maxItems below minItems/prefixItems");
    long limit = mx >= 0 ? mx : (mn > k ? mn : k) > 0 ? (mn > k ? mn : k) : 1;
    int elems[limit + 1];
    for (long i = 0; i <= limit; i++) {
        elems[i] = i < k ? c_schema(c, json_array_get(pre, (size_t)i)) : rest;
        if (elems[i] < 0 && elems[i] != NONE) return elems[i];
    }
    tl_gbuild *b = c->b;
    int r = tl_gb_rule(b), base = -1;
    for (long i = 0; i <= limit; i++) {
        int t = tl_gb_rule(b);
        if (i == 0) base = t;
        int any = 0;
        if (i >= mn) tl_gb_char(b, t, ']', ']'), any = 1;
        if ((mx >= 0 && i == mx) || elems[i] == NONE) continue;
        if (any) tl_gb_alt(b, t);
        if (i > 0) tl_gb_char(b, t, ',', ',');
        tl_gb_ref(b, t, elems[i]);
        tl_gb_ref(b, t, i == limit ? t : t + 1); /* this array's rules are consecutive */
    }
    tl_gb_char(b, r, '[', '[');
    tl_gb_ref(b, r, base);
    return b->err ? b->err : r;
}

static const char *const num_keys[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum",
                                       NULL};

/* One bound keyword k (num_keys[k]) as the least (lower bounds) or greatest (upper) value written,
 * scaled by 10^16 for a number. Exact for the value the bound parses to; an exclusive bound of a
 * number is taken at the next double inside, so a written value that a validator parses into a
 * double is strictly inside too (docs/architecture.md §9, "Numeric bounds"). */
static int num_bound(cx *c, const json_t *v, int k, int integer, tl_i128 *out) {
    int lower = k < 2, excl = k & 1, scale = integer ? 0 : 16;
    if (!json_is_number(v))
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "\"%s\" must be a number", num_keys[k]);
    if (json_is_integer(v) && (integer || !excl)) {
        tl_i128 x = (tl_i128)json_integer_value(v) * (integer ? 1 : TL_NUM_UNIT);
        *out = excl ? (lower ? x + 1 : x - 1) : x;
        return 0;
    }
    double d = json_number_value(v);
    if (json_is_integer(v) && (fabs(d) >= 9e18 || (json_int_t)d != json_integer_value(v)))
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED,
                       "\"%s\": an integer that is not exactly a double is not supported",
                       num_keys[k]);
    if (excl && integer) { /* the next integer strictly inside */
        tl_i128 f = tl_num_scale_double(d, 0, !lower);
        *out = lower ? f + 1 : f - 1;
        return 0;
    }
    if (excl) d = nextafter(d, lower ? INFINITY : -INFINITY);
    *out = tl_num_scale_double(d, scale, lower);
    return 0;
}

/* integer / number: without bounds the plain rule (exponent allowed); with bounds the range
 * automaton of numrange.c (no exponent). */
static int c_number(cx *c, const json_t *s, int integer) {
    tl_i128 max = integer ? TL_NUM_MAX_INT : TL_NUM_MAX_DEC, lo = -max, hi = max;
    int any = 0;
    for (int k = 0; num_keys[k]; k++) {
        const json_t *v = json_object_get(s, num_keys[k]);
        tl_i128 x = 0;
        if (!v) continue;
        int rc = num_bound(c, v, k, integer, &x);
        if (rc) return rc;
        any = 1;
        if (k < 2 && x > lo) lo = x;
        if (k >= 2 && x < hi) hi = x;
    }
    if (!any) return tl_jr_number(c->j, integer);
    if (lo > hi)
        return tl_errf(
            c->err, c->errlen, TL_ERR_UNSUPPORTED,
            "no %s written by the grammar (at most 16 digits before and after the point) "
            "satisfies \"minimum\"/\"maximum\" and their exclusive forms",
            integer ? "integer" : "number");
    return tl_num_range_rule(c->b, integer, lo, hi);
}

/* multipleOf: only 1 (an integer), which makes "number" "integer". */
static int multiple_of(cx *c, const json_t *s, int *is_one) {
    const json_t *v = json_object_get(s, "multipleOf");
    *is_one = 0;
    if (!v) return 0;
    if (!json_is_number(v) || json_number_value(v) <= 0)
        return tl_errf(c->err, c->errlen, TL_ERR_INVALID,
                       "\"multipleOf\" must be a positive number");
    if (json_number_value(v) != 1.0)
        return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED,
                       "schema keyword \"multipleOf\" is supported only with the value 1");
    *is_one = 1;
    return 0;
}

static int c_type(cx *c, const json_t *s, int t) {
    switch (t) {
    case T_NULL:
        return tl_jr_literal(c->j, json_null());
    case T_BOOL: {
        int r = tl_gb_rule(c->b);
        tl_gb_lit(c->b, r, "true", 4);
        tl_gb_alt(c->b, r);
        tl_gb_lit(c->b, r, "false", 5);
        return c->b->err ? c->b->err : r;
    }
    case T_OBJ:
        return c_object(c, s);
    case T_ARR:
        return c_array(c, s);
    case T_STR:
        return c_string(c, s);
    case T_INT:
        return c_number(c, s, 1);
    default:
        return c_number(c, s, 0);
    }
}

static int type_bit(cx *c, const json_t *v) {
    for (int i = 0; i < 7; i++)
        if (json_is_string(v) && !strcmp(json_string_value(v), tnames[i])) return 1 << i;
    return tl_errf(c->err, c->errlen, TL_ERR_INVALID, "unknown \"type\" value");
}

/* The set of types: "type" (string or list), else those whose keywords appear, else all. */
static int type_set(cx *c, const json_t *s) {
    const json_t *t = json_object_get(s, "type");
    int m = 0;
    if (json_is_array(t)) {
        for (size_t i = 0; i < json_array_size(t); i++) {
            int bit = type_bit(c, json_array_get(t, i));
            if (bit < 0) return bit;
            m |= bit;
        }
    } else if (t) {
        m = type_bit(c, t);
        if (m < 0) return m;
    } else {
        static const char *const obj[] = {"properties", "required", "additionalProperties", NULL};
        static const char *const arr[] = {"items", "prefixItems", "minItems", "maxItems", NULL};
        for (int i = 0; obj[i]; i++) m |= json_object_get(s, obj[i]) ? T_OBJ : 0;
        for (int i = 0; arr[i]; i++) m |= json_object_get(s, arr[i]) ? T_ARR : 0;
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
            json_object_get(s, "format") || json_object_get(s, "pattern"))
            m |= T_STR;
        for (int i = 0; num_keys[i]; i++) m |= json_object_get(s, num_keys[i]) ? T_NUM : 0;
        m |= json_object_get(s, "multipleOf") ? T_NUM : 0;
        if (!m) m = T_NULL | T_BOOL | T_OBJ | T_ARR | T_STR | T_NUM;
    }
    if (m & T_NUM) m &= ~T_INT;
    int one, rc = multiple_of(c, s, &one);
    if (rc) return rc;
    if (one && (m & T_NUM)) m = (m & ~T_NUM) | T_INT;
    if (json_is_true(json_object_get(s, "nullable"))) m |= T_NULL;
    return m ? m : tl_errf(c->err, c->errlen, TL_ERR_INVALID, "empty \"type\" list");
}

static int c_schema(cx *c, const json_t *s) {
    if (json_is_true(s)) return tl_jr_value(c->j);
    if (!json_is_object(s))
        return tl_errf(c->err, c->errlen, json_is_false(s) ? TL_ERR_UNSUPPORTED : TL_ERR_INVALID,
                       json_is_false(s) ? "schema false" : "a schema must be an object");
    if (++c->depth > 200) return tl_errf(c->err, c->errlen, TL_ERR_UNSUPPORTED, "schema too deep");
    int r = check_keys(c, s);
    if (r) goto out;
    if (json_object_get(s, "allOf")) {
        r = c_allof(c, s, NULL);
    } else if (json_object_get(s, "$ref")) {
        r = only(c, s, "$ref", (const char *const[]){NULL});
        if (!r) r = c_ref(c, s);
    } else if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        r = c_enum(c, s);
    } else if (json_object_get(s, "anyOf") || json_object_get(s, "oneOf")) {
        r = c_combo(c, s, json_object_get(s, "anyOf") ? "anyOf" : "oneOf");
    } else {
        int m = r = type_set(c, s);
        if (m > 0) r = tl_gb_rule(c->b);
        for (int i = 0, first = 1; m > 0 && i < 7 && r >= 0; i++) {
            if (!(m & (1 << i))) continue;
            int t = c_type(c, s, 1 << i);
            if (t < 0) r = t;
            if (!first) tl_gb_alt(c->b, r);
            if (t >= 0) tl_gb_ref(c->b, r, t);
            first = 0;
        }
    }
out:
    c->depth--;
    return r;
}

static int finish(cx *c, int root, tl_grammar **out) {
    int rc = root < 0 ? root : tl_gb_finish(c->b, root, out);
    tl_gb_free(c->b);
    free(c->ref_key);
    free(c->ref_rule);
    if (rc && c->err && !c->err[0]) tl_errf(c->err, c->errlen, rc, "grammar construction failed");
    return rc;
}

int tl_schema_rule(tl_gbuild *b, tl_jrules *j, const json_t *root, const json_t *schema, char *err,
                   size_t errlen) {
    cx c = {.b = b, .j = j, .root = root, .err = err, .errlen = errlen};
    int r = c_schema(&c, schema);
    free(c.ref_key);
    free(c.ref_rule);
    if (r < 0 && err && !err[0]) tl_errf(err, errlen, r, "grammar construction failed");
    return r;
}

int tl_grammar_from_schema(const json_t *schema, tl_grammar **out, char *err, size_t errlen) {
    *out = NULL;
    if (err && errlen) err[0] = 0;
    tl_gbuild b = {0};
    tl_jrules j;
    cx c = {.b = &b, .j = &j, .root = schema, .err = err, .errlen = errlen};
    tl_jr_init(&j, &b);
    return finish(&c, c_schema(&c, schema), out);
}

int tl_schema_json_object(tl_jrules *j) {
    cx c = {.b = j->b, .j = j};
    int v = tl_jr_value(j);
    return v < 0 ? v : generic_object(&c, v);
}

int tl_grammar_json_object(tl_grammar **out, char *err, size_t errlen) {
    *out = NULL;
    if (err && errlen) err[0] = 0;
    tl_gbuild b = {0};
    tl_jrules j;
    cx c = {.b = &b, .j = &j, .err = err, .errlen = errlen};
    tl_jr_init(&j, &b);
    return finish(&c, tl_schema_json_object(&j), out);
}
