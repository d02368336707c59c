/* allOf with several schemas (src/grammar/allof.c; docs/architecture.md §9, "allOf"). The
 * branches (the allOf members, nested allOfs flattened, $ref-only members resolved, and the
 * schema's own other keywords) are merged keyword by keyword where the result accepts exactly
 * the values that every branch accepts; a branch with anyOf/oneOf is distributed over its
 * alternatives; anything else that two branches both constrain is refused naming allOf. */
#include <string.h>

#include "common/status.h"
#include "grammar/allof.h"
#include "grammar/schema.h"

#define MAX_BRANCHES 64
#define MAX_REF_HOPS 32

typedef struct mx {
    const json_t *root;
    const json_t *br[MAX_BRANCHES]; /* borrowed from root, or owned through `own` */
    int n;
    json_t *own; /* an array holding the branch objects this merge made */
    int empty;   /* set with an error that means "no value satisfies every branch" */
    char *err;
    size_t errlen;
} mx;

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

/* A shallow copy of object s without key k, owned by m. */
static json_t *without(mx *m, const json_t *s, const char *k) {
    json_t *c = json_copy((json_t *)s);
    if (!c) return NULL;
    json_object_del(c, k);
    return json_array_append_new(m->own, c) ? NULL : c; /* append_new drops c on failure */
}

static int only_ref(const json_t *s) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k,
                        v) if (strcmp(k, "$ref") && !tl_schema_is_annotation(k)) return 0;
    return 1;
}

/* Adds branch s (flattening its allOf, resolving a lone $ref). */
static int add_branch(mx *m, const json_t *s, int hops) {
    if (json_is_true(s)) return 0;
    if (json_is_false(s))
        return tl_errf(m->err, m->errlen, TL_ERR_UNSUPPORTED, "\"allOf\" with the schema false");
    if (!json_is_object(s))
        return tl_errf(m->err, m->errlen, TL_ERR_INVALID, "\"allOf\" members must be schemas");
    if (json_object_get(s, "$ref")) {
        if (!only_ref(s))
            return tl_errf(m->err, m->errlen, TL_ERR_UNSUPPORTED,
                           "\"allOf\" member with \"$ref\" and other keywords is not supported");
        const char *ref = json_string_value(json_object_get(s, "$ref"));
        const json_t *t = tl_schema_resolve(m->root, ref);
        if (!t)
            return tl_errf(m->err, m->errlen, TL_ERR_UNSUPPORTED, "$ref \"%s\" cannot be resolved",
                           ref ? ref : "(not a string)");
        if (hops >= MAX_REF_HOPS)
            return tl_errf(m->err, m->errlen, TL_ERR_UNSUPPORTED,
                           "\"allOf\" through more than %d $ref hops is not supported",
                           MAX_REF_HOPS);
        return add_branch(m, t, hops + 1);
    }
    const json_t *l = json_object_get(s, "allOf");
    if (l) {
        if (!json_is_array(l) || json_array_size(l) == 0)
            return tl_errf(m->err, m->errlen, TL_ERR_INVALID,
                           "\"allOf\" must be a non-empty array");
        if (hops >= MAX_REF_HOPS)
            return tl_errf(m->err, m->errlen, TL_ERR_UNSUPPORTED, "\"allOf\" nested too deep");
        for (size_t i = 0; i < json_array_size(l); i++) {
            int rc = add_branch(m, json_array_get(l, i), hops + 1);
            if (rc) return rc;
        }
        json_t *rest = without(m, s, "allOf");
        return rest ? add_branch(m, rest, hops + 1) : TL_ERR_NOMEM;
    }
    if (m->n == MAX_BRANCHES)
        return tl_errf(m->err, m->errlen, TL_ERR_UNSUPPORTED,
                       "\"allOf\" with more than %d schemas is not supported", MAX_BRANCHES);
    m->br[m->n++] = s;
    return 0;
}

/* {"anyOf":[{"allOf":[other branches..., b without anyOf/oneOf, alternative]}, ...]} for the
 * first branch b with an anyOf (or oneOf, read as anyOf as everywhere in the compiler). */
static int distribute(mx *m, int bi, const char *what, json_t **out) {
    const json_t *alts = json_object_get(m->br[bi], what);
    if (!json_is_array(alts) || json_array_size(alts) == 0)
        return tl_errf(m->err, m->errlen, TL_ERR_INVALID, "\"%s\" must be a non-empty array", what);
    json_t *rest = without(m, m->br[bi], what), *any = json_array(), *res = json_object();
    int rc = rest && any && res ? 0 : TL_ERR_NOMEM;
    for (size_t a = 0; !rc && a < json_array_size(alts); a++) {
        json_t *l = json_array(), *o = json_object();
        rc = l && o ? 0 : TL_ERR_NOMEM;
        for (int i = 0; !rc && i < m->n; i++)
            rc = json_array_append(l, (json_t *)(i == bi ? rest : m->br[i])) ? TL_ERR_NOMEM : 0;
        if (!rc) rc = json_array_append(l, json_array_get(alts, a)) ? TL_ERR_NOMEM : 0;
        if (!rc) rc = json_object_set(o, "allOf", l) ? TL_ERR_NOMEM : 0;
        if (!rc) rc = json_array_append(any, o) ? TL_ERR_NOMEM : 0;
        json_decref(l);
        json_decref(o);
    }
    if (!rc) rc = json_object_set(res, "anyOf", any) ? TL_ERR_NOMEM : 0;
    json_decref(any);
    if (rc) {
        json_decref(res);
        return rc;
    }
    *out = res;
    return 0;
}

/* ---------------------------------------------------------------- type */

enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_INT = 32, T_NUM = 64 };
static const char *const tnames[] = {"null",   "boolean", "object", "array",
                                     "string", "integer", "number"};

/* The types a branch allows by its "type" (and nullable); all without one. number includes
 * integer. -1 on a malformed type. */
static int branch_types(const json_t *s) {
    const json_t *t = json_object_get(s, "type");
    if (!t) return 127;
    int m = 0;
    size_t n = json_is_array(t) ? json_array_size(t) : 1;
    for (size_t i = 0; i < n; i++) {
        const char *nm = json_string_value(json_is_array(t) ? json_array_get(t, i) : t);
        int bit = 0;
        for (int k = 0; nm && k < 7; k++)
            if (!strcmp(nm, tnames[k])) bit = 1 << k;
        if (!bit) return -1;
        m |= bit == T_NUM ? T_NUM | T_INT : bit;
    }
    if (json_is_true(json_object_get(s, "nullable"))) m |= T_NULL;
    return m;
}

static int merge_type(mx *m, json_t *out) {
    int mask = 127, any = 0;
    for (int i = 0; i < m->n; i++) {
        if (!json_object_get(m->br[i], "type")) continue;
        int t = branch_types(m->br[i]);
        if (t < 0) return tl_errf(m->err, m->errlen, TL_ERR_INVALID, "unknown \"type\" value");
        mask &= t;
        any = 1;
    }
    if (!any) return 0;
    m->empty = !(mask & ~T_NUM);
    if (m->empty)
        return tl_errf(m->err, m->errlen, TL_ERR_INVALID,
                       "\"allOf\": the schemas' \"type\"s have no type in common");
    json_t *l = json_array();
    int rc = l ? 0 : TL_ERR_NOMEM;
    for (int k = 0; !rc && k < 7; k++) {
        if (!(mask & (1 << k)) || ((1 << k) == T_INT && (mask & T_NUM))) continue;
        rc = json_array_append_new(l, json_string(tnames[k])) ? TL_ERR_NOMEM : 0;
    }
    if (!rc) rc = json_object_set(out, "type", l) ? TL_ERR_NOMEM : 0;
    json_decref(l);
    return rc;
}

/* ---------------------------------------------------------------- object */

static int is_required(const json_t *s, const char *name) {
    const json_t *req = json_object_get(s, "required");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!strcmp(json_string_value(json_array_get(req, i)) ?: "", name)) return 1;
    return 0;
}

static int has_obj_keys(const json_t *s) {
    return json_object_get(s, "properties") || json_object_get(s, "required") ||
           json_object_get(s, "additionalProperties");
}

/* The schema of member `name` in the merge: allOf of what each object branch says about it
 * (its property schema, or its additionalProperties schema when not declared there); NULL
 * after an error; *forbidden when a branch forbids it. */
static json_t *member_schema(mx *m, const char *name, int *forbidden) {
    json_t *l = json_array();
    *forbidden = 0;
    for (int i = 0; l && i < m->n; i++) {
        const json_t *b = m->br[i], *p = json_object_get(json_object_get(b, "properties"), name);
        if (!has_obj_keys(b)) continue;
        if (!p) p = json_object_get(b, "additionalProperties");
        if (json_is_false(p)) *forbidden = 1;
        if (json_is_object(p) && json_array_append(l, (json_t *)p)) {
            json_decref(l);
            return NULL;
        }
    }
    if (!l) return NULL;
    json_t *r;
    if (json_array_size(l) == 0)
        r = json_true();
    else if (json_array_size(l) == 1)
        r = json_incref(json_array_get(l, 0));
    else
        r = json_pack("{sO}", "allOf", l);
    json_decref(l);
    return r;
}

/* Every name declared by a properties or required of an object branch, in order, once. */
static int member_names(mx *m, json_t *names) {
    for (int i = 0; i < m->n; i++) {
        const json_t *props = json_object_get(m->br[i], "properties"), *v;
        const json_t *req = json_object_get(m->br[i], "required");
        if ((props && !json_is_object(props)) || (req && !json_is_array(req)))
            return tl_errf(m->err, m->errlen, TL_ERR_INVALID, "malformed object keywords");
        const char *k;
        json_object_foreach((json_t *)props, k, v) {
            if (json_object_set_new(names, k, json_true())) return TL_ERR_NOMEM;
        }
        for (size_t j = 0; j < json_array_size(req); j++) {
            const char *nm = json_string_value(json_array_get(req, j));
            if (!nm)
                return tl_errf(m->err, m->errlen, TL_ERR_INVALID, "\"required\" needs strings");
            if (json_object_set_new(names, nm, json_true())) return TL_ERR_NOMEM;
        }
    }
    return 0;
}

/* Object keywords of two or more branches: properties = each name's member_schema (a name some
 * branch forbids is left out, or is an error when required), required = the union, and only the
 * declared names (additionalProperties false). With no names at all: additionalProperties is
 * false if any says so, else the allOf of their schemas. */
static int merge_object(mx *m, json_t *out) {
    json_t *names = json_object(), *props = json_object(), *req = json_array(), *v;
    int rc = names && props && req ? member_names(m, names) : TL_ERR_NOMEM;
    const char *k;
    json_object_foreach(names, k, v) {
        if (rc) break;
        int forbidden, required = 0;
        for (int i = 0; i < m->n; i++) required |= is_required(m->br[i], k);
        json_t *ms = member_schema(m, k, &forbidden);
        if (!ms)
            rc = TL_ERR_NOMEM;
        else if (forbidden && required) {
            m->empty = 1;
            rc = tl_errf(m->err, m->errlen, TL_ERR_INVALID,
                         "\"allOf\": required property \"%s\" is forbidden by another schema", k);
        } else if (!forbidden && json_object_set(props, k, ms))
            rc = TL_ERR_NOMEM;
        else if (!forbidden && required && json_array_append_new(req, json_string(k)))
            rc = TL_ERR_NOMEM;
        json_decref(ms);
    }
    if (!rc && json_object_size(names)) {
        rc = json_object_set(out, "properties", props) || json_object_set(out, "required", req) ||
                     json_object_set_new(out, "additionalProperties", json_false())
                 ? TL_ERR_NOMEM
                 : 0;
    } else if (!rc) {
        int dummy;
        json_t *ap = member_schema(m, "", &dummy); /* no names: "" is undeclared everywhere */
        if (!ap)
            rc = TL_ERR_NOMEM;
        else if (json_object_set(out, "additionalProperties", dummy ? json_false() : ap))
            rc = TL_ERR_NOMEM;
        json_decref(ap);
    }
    json_decref(names);
    json_decref(props);
    json_decref(req);
    return rc;
}

/* ---------------------------------------------------------------- scalars */

static int num_cmp(const json_t *a, const json_t *b) {
    if (json_is_integer(a) && json_is_integer(b))
        return (json_integer_value(a) > json_integer_value(b)) -
               (json_integer_value(a) < json_integer_value(b));
    double x = json_number_value(a), y = json_number_value(b);
    return (x > y) - (x < y);
}

/* enum/const: the values in every branch's set that has one. */
static int merge_enum(mx *m, json_t *out) {
    json_t *acc = NULL;
    for (int i = 0; i < m->n; i++) {
        const json_t *e = json_object_get(m->br[i], "enum"),
                     *c = json_object_get(m->br[i], "const");
        if (!e && !c) continue;
        if (e && (!json_is_array(e) || json_array_size(e) == 0)) {
            json_decref(acc);
            return tl_errf(m->err, m->errlen, TL_ERR_INVALID, "\"enum\" must be a non-empty array");
        }
        json_t *set = c ? json_pack("[O]", c) : json_incref((json_t *)e);
        if (e && c) { /* both in one branch: their intersection */
            json_decref(set);
            set = json_array();
            for (size_t j = 0; set && j < json_array_size(e); j++)
                if (json_equal(json_array_get(e, j), (json_t *)c))
                    json_array_append(set, (json_t *)c);
        }
        if (!acc) {
            acc = set;
            continue;
        }
        json_t *nx = json_array();
        for (size_t j = 0; nx && set && j < json_array_size(acc); j++)
            for (size_t q = 0; q < json_array_size(set); q++)
                if (json_equal(json_array_get(acc, j), json_array_get(set, q))) {
                    json_array_append(nx, json_array_get(acc, j));
                    break;
                }
        json_decref(acc);
        json_decref(set);
        acc = nx;
        if (!acc) return TL_ERR_NOMEM;
    }
    if (!acc) return 0;
    if (json_array_size(acc) == 0) {
        json_decref(acc);
        m->empty = 1;
        return tl_errf(m->err, m->errlen, TL_ERR_INVALID,
                       "\"allOf\": the schemas' \"enum\"/\"const\" have no value in common");
    }
    return json_object_set_new(out, "enum", acc) ? TL_ERR_NOMEM : 0;
}

/* ---------------------------------------------------------------- the merge */

/* keywords whose merge is the largest (lower bounds) or smallest (upper bounds) value */
static const char *const lower[] = {"minItems", "minLength", "minimum", "exclusiveMinimum", NULL};
static const char *const upper[] = {"maxItems", "maxLength", "maximum", "exclusiveMaximum", NULL};

/* Keyword k of every branch that has it: the tightest bound, the one value they all share, or
 * for `items` schemas their allOf; anything else is refused. */
static int merge_key(mx *m, const char *k, json_t *out) {
    const json_t *first = NULL, *best = NULL;
    int all_equal = 1, lo = in_list(lower, k), up = in_list(upper, k), schemas = 1, rc = 0;
    json_t *vals = json_array();
    if (!vals) return TL_ERR_NOMEM;
    for (int i = 0; i < m->n && !rc; i++) {
        const json_t *v = json_object_get(m->br[i], k);
        if (!v) continue;
        if ((lo || up) && !json_is_number(v))
            rc = tl_errf(m->err, m->errlen, TL_ERR_INVALID, "\"%s\" must be a number", k);
        if (!first) first = best = v;
        all_equal &= json_equal((json_t *)first, (json_t *)v);
        if ((lo || up) && !rc && num_cmp(v, best) == (lo ? 1 : -1)) best = v;
        schemas &= json_is_object(v) || json_is_true(v);
        if (!rc && json_array_append(vals, (json_t *)v)) rc = TL_ERR_NOMEM;
    }
    if (rc) {
    } else if (lo || up || all_equal) {
        rc = json_object_set(out, k, (json_t *)best) ? TL_ERR_NOMEM : 0;
    } else if (!strcmp(k, "items") && schemas) {
        rc = json_object_set_new(out, k, json_pack("{sO}", "allOf", vals)) ? TL_ERR_NOMEM : 0;
    } else {
        rc = tl_errf(m->err, m->errlen, TL_ERR_UNSUPPORTED,
                     "\"allOf\" whose schemas give different \"%s\" is not supported", k);
    }
    json_decref(vals);
    return rc;
}

static int is_obj_key(const char *k) {
    return !strcmp(k, "properties") || !strcmp(k, "required") || !strcmp(k, "additionalProperties");
}

static int merge_all(mx *m, json_t *out) {
    int rc = merge_type(m, out), n_obj = 0, n_tuple = 0, n_items = 0;
    for (int i = 0; i < m->n; i++) {
        const json_t *b = m->br[i];
        n_obj += has_obj_keys(b);
        n_tuple += json_object_get(b, "prefixItems") || json_is_array(json_object_get(b, "items"));
        n_items += json_object_get(b, "prefixItems") || json_object_get(b, "items");
    }
    if (!rc && n_tuple && n_items > 1)
        return tl_errf(m->err, m->errlen, TL_ERR_UNSUPPORTED,
                       "\"allOf\" with \"prefixItems\" beside another schema's items is not "
                       "supported");
    if (!rc && n_obj > 1) rc = merge_object(m, out);
    if (!rc) rc = merge_enum(m, out);
    for (int i = 0; !rc && i < m->n; i++) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)m->br[i], k, v) {
            if (tl_schema_is_annotation(k) || json_object_get(out, k) || !strcmp(k, "type") ||
                !strcmp(k, "nullable") || !strcmp(k, "enum") || !strcmp(k, "const") ||
                (n_obj > 1 && is_obj_key(k)))
                continue;
            if ((rc = merge_key(m, k, out))) break;
        }
    }
    return rc;
}

int tl_allof_merge(const json_t *root, const json_t *s, json_t **out, int *empty, char *err,
                   size_t errlen) {
    mx m = {.root = root, .own = json_array(), .err = err, .errlen = errlen};
    *out = NULL;
    *empty = 0;
    if (!m.own) return TL_ERR_NOMEM;
    int rc = add_branch(&m, s, 0);
    for (int i = 0; !rc && i < m.n; i++) {
        const char *what = json_object_get(m.br[i], "anyOf")   ? "anyOf"
                           : json_object_get(m.br[i], "oneOf") ? "oneOf"
                                                               : NULL;
        if (what && !strcmp(what, "oneOf")) /* exactly one: only where no value matches two */
            rc = tl_oneof_disjoint(root, json_object_get(m.br[i], "oneOf"), err, errlen);
        if (what) {
            if (!rc) rc = distribute(&m, i, what, out);
            json_decref(m.own);
            return rc;
        }
    }
    json_t *res = rc ? NULL : json_object();
    if (!rc && !res) rc = TL_ERR_NOMEM;
    if (!rc) rc = merge_all(&m, res);
    json_decref(m.own);
    if (rc) {
        json_decref(res);
        *empty = m.empty && rc == TL_ERR_INVALID;
        return rc;
    }
    *out = res;
    return 0;
}
