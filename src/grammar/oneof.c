/* oneOf: the compiler builds alternatives, which is exactly oneOf only when no value can match
 * two of them. This file decides that conservatively (tl_oneof_disjoint); anything it cannot
 * prove disjoint is refused naming oneOf, never compiled as anyOf (docs/architecture.md §9). */
#include <math.h>
#include <string.h>

#include "common/status.h"
#include "grammar/schema.h"

enum {
    K_NULL = 1,
    K_BOOL = 2,
    K_INT = 4,  /* integers: both "integer" and "number" */
    K_FRAC = 8, /* numbers with a fraction: "number" only */
    K_STR = 16,
    K_ARR = 32,
    K_OBJ = 64,
    K_ALL = 127
};

/* A branch: the JSON kinds it may accept, and its const/enum values when it has them. */
typedef struct {
    unsigned kinds;
    const json_t *node; /* the branch after its $ref chain */
    json_t *vals;       /* owned array of const/enum values, or NULL */
} branch;

static unsigned kind_of_value(const json_t *v) {
    if (json_is_null(v)) return K_NULL;
    if (json_is_boolean(v)) return K_BOOL;
    if (json_is_integer(v)) return K_INT;
    if (json_is_real(v)) return floor(json_real_value(v)) == json_real_value(v) ? K_INT : K_FRAC;
    if (json_is_string(v)) return K_STR;
    return json_is_array(v) ? K_ARR : K_OBJ;
}

static unsigned kind_of_name(const char *t) {
    static const char *const names[] = {"null",   "boolean", "integer", "number",
                                        "string", "array",   "object"};
    static const unsigned kinds[] = {K_NULL, K_BOOL, K_INT, K_INT | K_FRAC, K_STR, K_ARR, K_OBJ};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i])) return kinds[i];
    return K_ALL;
}

/* Follows a chain of {"$ref": ...} (at most 16 hops); NULL when it does not resolve. */
static const json_t *deref(const json_t *root, const json_t *s) {
    for (int hop = 0; s && json_is_object(s) && json_object_get(s, "$ref") && hop < 16; hop++)
        s = tl_schema_resolve(root, json_string_value(json_object_get(s, "$ref")));
    return s;
}

/* The kinds `type` allows, or what the keywords present imply (K_ALL when nothing says). */
static unsigned kinds_of(const json_t *s) {
    const json_t *t = json_object_get(s, "type");
    unsigned k = 0;
    if (json_is_string(t)) k = kind_of_name(json_string_value(t));
    if (json_is_array(t))
        for (size_t i = 0; i < json_array_size(t); i++)
            k |= json_is_string(json_array_get(t, i))
                     ? kind_of_name(json_string_value(json_array_get(t, i)))
                     : K_ALL;
    if (!t) {
        static const char *const obj[] = {"properties", "required", "additionalProperties", NULL};
        static const char *const arr[] = {"items", "prefixItems", "minItems", "maxItems", NULL};
        static const char *const str[] = {"minLength", "maxLength", "pattern", "format", NULL};
        int any = json_object_get(s, "anyOf") || json_object_get(s, "oneOf") ||
                  json_object_get(s, "allOf");
        for (int i = 0; !any && obj[i]; i++) k |= json_object_get(s, obj[i]) ? K_OBJ : 0;
        for (int i = 0; !any && arr[i]; i++) k |= json_object_get(s, arr[i]) ? K_ARR : 0;
        for (int i = 0; !any && str[i]; i++) k |= json_object_get(s, str[i]) ? K_STR : 0;
        if (any || !k) k = K_ALL;
    }
    if (json_is_true(json_object_get(s, "nullable"))) k |= K_NULL;
    return k;
}

/* The branch's const/enum values as a new array, or NULL. */
static json_t *values_of(const json_t *s) {
    const json_t *c = json_object_get(s, "const"), *e = json_object_get(s, "enum");
    if (c) {
        json_t *a = json_array();
        json_array_append(a, (json_t *)c);
        return a;
    }
    return json_is_array(e) ? json_copy((json_t *)e) : NULL;
}

static branch describe(const json_t *root, const json_t *s) {
    branch b = {K_ALL, deref(root, s), NULL};
    if (!json_is_object(b.node)) return b;
    b.vals = values_of(b.node);
    if (b.vals) {
        b.kinds = 0;
        for (size_t i = 0; i < json_array_size(b.vals); i++)
            b.kinds |= kind_of_value(json_array_get(b.vals, i));
    } else {
        b.kinds = kinds_of(b.node);
    }
    return b;
}

static int values_disjoint(const json_t *a, const json_t *b) {
    for (size_t i = 0; i < json_array_size(a); i++)
        for (size_t j = 0; j < json_array_size(b); j++)
            if (json_equal(json_array_get(a, i), json_array_get(b, j))) return 0;
    return 1;
}

static int is_required(const json_t *s, const char *p) {
    const json_t *r = json_object_get(s, "required");
    for (size_t i = 0; i < json_array_size(r); i++)
        if (json_is_string(json_array_get(r, i)) &&
            !strcmp(json_string_value(json_array_get(r, i)), p))
            return 1;
    return 0;
}

/* Two object branches told apart by a discriminator: a property both require whose const/enum
 * values do not meet. */
static int objects_disjoint(const json_t *root, const json_t *a, const json_t *b) {
    const json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    const char *k;
    const json_t *va;
    json_object_foreach((json_t *)pa, k, va) {
        if (!is_required(a, k) || !is_required(b, k)) continue;
        const json_t *x = deref(root, va), *y = deref(root, json_object_get(pb, k));
        json_t *ex = json_is_object(x) ? values_of(x) : NULL;
        json_t *ey = json_is_object(y) ? values_of(y) : NULL;
        int d = ex && ey && values_disjoint(ex, ey);
        json_decref(ex), json_decref(ey);
        if (d) return 1;
    }
    return 0;
}

static int pair_disjoint(const json_t *root, const branch *a, const branch *b) {
    unsigned both = a->kinds & b->kinds;
    if (!both) return 1;
    if (a->vals && b->vals) return values_disjoint(a->vals, b->vals);
    if (both == K_OBJ && json_is_object(a->node) && json_is_object(b->node))
        return objects_disjoint(root, a->node, b->node);
    return 0;
}

int tl_oneof_disjoint(const json_t *root, const json_t *alts, char *err, size_t errlen) {
    size_t n = json_array_size(alts);
    if (n > 64)
        return tl_errf(err, errlen, TL_ERR_UNSUPPORTED,
                       "\"oneOf\" with more than 64 alternatives is not supported");
    branch br[64];
    for (size_t i = 0; i < n; i++) br[i] = describe(root, json_array_get(alts, i));
    int st = 0;
    for (size_t i = 0; i < n && !st; i++)
        for (size_t j = i + 1; j < n && !st; j++)
            if (!pair_disjoint(root, &br[i], &br[j]))
                st = tl_errf(
                    err, errlen, TL_ERR_UNSUPPORTED,
                    "\"oneOf\" alternatives %zu and %zu may both match a value (exactly one "
                    "must): give them different types, different const/enum values or a "
                    "required const discriminator property, or use anyOf",
                    i, j);
    for (size_t i = 0; i < n; i++) json_decref(br[i].vals);
    return st;
}
