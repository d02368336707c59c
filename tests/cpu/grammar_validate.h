/* A small JSON Schema validator for the subset src/grammar compiles (tests/cpu/test_grammar.c):
 * written from the specification, independent of the grammar, so grammar output can be checked
 * against it. Numbers compare by value (documents are parsed with JSON_DECODE_INT_AS_REAL). */
#ifndef GRAMMAR_VALIDATE_H
#define GRAMMAR_VALIDATE_H

#include <jansson.h>
#include <math.h>
#include <string.h>

static int v_valid(const json_t *root, const json_t *s, const json_t *x);

static int v_equal(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    if (json_typeof(a) != json_typeof(b)) return 0;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!v_equal(json_array_get(a, i), json_array_get(b, i))) return 0;
        return 1;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b)) return 0;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v) {
            const json_t *w = json_object_get(b, k);
            if (!w || !v_equal(v, w)) return 0;
        }
        return 1;
    }
    return json_equal((json_t *)a, (json_t *)b);
}

static int v_type_is(const char *t, const json_t *x) {
    if (!strcmp(t, "null")) return json_is_null(x);
    if (!strcmp(t, "boolean")) return json_is_boolean(x);
    if (!strcmp(t, "object")) return json_is_object(x);
    if (!strcmp(t, "array")) return json_is_array(x);
    if (!strcmp(t, "string")) return json_is_string(x);
    if (!strcmp(t, "number")) return json_is_number(x);
    if (!strcmp(t, "integer"))
        return json_is_number(x) && json_number_value(x) == floor(json_number_value(x));
    return 0;
}

static long v_codepoints(const char *s, size_t len) {
    long n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

static int v_type(const json_t *s, const json_t *x) {
    const json_t *t = json_object_get(s, "type");
    if (json_is_true(json_object_get(s, "nullable")) && json_is_null(x)) return 1;
    if (json_is_string(t)) return v_type_is(json_string_value(t), x);
    if (!json_is_array(t)) return 1;
    for (size_t i = 0; i < json_array_size(t); i++)
        if (v_type_is(json_string_value(json_array_get(t, i)), x)) return 1;
    return 0;
}

static int v_object(const json_t *root, const json_t *s, const json_t *x) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *ap = json_object_get(s, "additionalProperties");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!json_object_get(x, json_string_value(json_array_get(req, i)))) return 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)x, k, v) {
        const json_t *ps = json_object_get(props, k);
        if (ps ? !v_valid(root, ps, v) : ap && !v_valid(root, ap, v)) return 0;
    }
    return 1;
}

static int v_array(const json_t *root, const json_t *s, const json_t *x) {
    const json_t *pre = json_object_get(s, "prefixItems"), *it = json_object_get(s, "items");
    const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    size_t n = json_array_size(x);
    if ((mn && (json_int_t)n < json_integer_value(mn)) ||
        (mx && (json_int_t)n > json_integer_value(mx)))
        return 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *es = i < json_array_size(pre) ? json_array_get(pre, i) : it;
        if (es && !v_valid(root, es, json_array_get(x, i))) return 0;
    }
    return 1;
}

static const json_t *v_ref(const json_t *root, const char *ref) {
    if (!strcmp(ref, "#")) return root;
    if (!strncmp(ref, "#/$defs/", 8))
        return json_object_get(json_object_get(root, "$defs"), ref + 8);
    if (!strncmp(ref, "#/definitions/", 14))
        return json_object_get(json_object_get(root, "definitions"), ref + 14);
    return NULL;
}

static int v_digits(const char *s, int n) {
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

static int v_num(const char *s, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) v = v * 10 + (s[i] - '0');
    return v;
}

/* RFC 3339 full-date; returns the length used (10) or 0. */
static int v_date(const char *s) {
    static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (strlen(s) < 10 || !v_digits(s, 4) || s[4] != '-' || !v_digits(s + 5, 2) || s[7] != '-' ||
        !v_digits(s + 8, 2))
        return 0;
    int y = v_num(s, 4), m = v_num(s + 5, 2), d = v_num(s + 8, 2);
    if (m < 1 || m > 12 || d < 1 || d > mdays[m - 1]) return 0;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && d == 29 && !leap ? 0 : 10;
}

/* RFC 3339 full-time (the whole rest of s). */
static int v_time(const char *s) {
    if (strlen(s) < 9 || !v_digits(s, 2) || s[2] != ':' || !v_digits(s + 3, 2) || s[5] != ':' ||
        !v_digits(s + 6, 2) || v_num(s, 2) > 23 || v_num(s + 3, 2) > 59 || v_num(s + 6, 2) > 59)
        return 0;
    s += 8;
    if (*s == '.') {
        int n = 0;
        while (s[1 + n] >= '0' && s[1 + n] <= '9') n++;
        if (!n) return 0;
        s += 1 + n;
    }
    if ((s[0] == 'Z' || s[0] == 'z') && !s[1]) return 1;
    return (s[0] == '+' || s[0] == '-') && strlen(s) == 6 && v_digits(s + 1, 2) && s[3] == ':' &&
           v_digits(s + 4, 2) && v_num(s + 1, 2) <= 23 && v_num(s + 4, 2) <= 59;
}

static int v_email(const char *s) {
    const char *at = strchr(s, '@');
    if (!at || at == s || strchr(at + 1, '@') || !strchr(at + 1, '.')) return 0;
    for (const char *p = s; *p; p++) /* no empty dot-separated parts on either side */
        if (*p == '.' &&
            (p == s || p[-1] == '.' || p[-1] == '@' || p[1] == '.' || p[1] == '@' || !p[1]))
            return 0;
    return at[1] != '.';
}

static int v_format(const char *f, const char *s) {
    if (!strcmp(f, "date")) return v_date(s) && !s[10];
    if (!strcmp(f, "time")) return v_time(s);
    if (!strcmp(f, "date-time"))
        return v_date(s) && (s[10] == 'T' || s[10] == 't') && v_time(s + 11);
    if (!strcmp(f, "email")) return v_email(s);
    if (!strcmp(f, "uuid")) {
        if (strlen(s) != 36) return 0;
        for (int i = 0; i < 36; i++)
            if (i == 8 || i == 13 || i == 18 || i == 23 ? s[i] != '-'
                                                        : !strchr("0123456789abcdefABCDEF", s[i]))
                return 0;
        return 1;
    }
    return 0;
}

static int v_valid(const json_t *root, const json_t *s, const json_t *x) {
    if (json_is_boolean(s)) return json_is_true(s);
    const json_t *t;
    if ((t = json_object_get(s, "$ref")))
        return v_valid(root, v_ref(root, json_string_value(t)), x);
    if ((t = json_object_get(s, "const")) && !v_equal(t, x)) return 0;
    if ((t = json_object_get(s, "enum"))) {
        int any = 0;
        for (size_t i = 0; i < json_array_size(t); i++) any |= v_equal(json_array_get(t, i), x);
        if (!any) return 0;
    }
    if ((t = json_object_get(s, "anyOf")) || (t = json_object_get(s, "oneOf"))) {
        int cnt = 0;
        for (size_t i = 0; i < json_array_size(t); i++)
            cnt += v_valid(root, json_array_get(t, i), x);
        if (json_object_get(s, "oneOf") ? cnt != 1 : cnt == 0) return 0;
    }
    if ((t = json_object_get(s, "allOf")))
        for (size_t i = 0; i < json_array_size(t); i++)
            if (!v_valid(root, json_array_get(t, i), x)) return 0;
    if (!v_type(s, x)) return 0;
    if (json_is_object(x) && !v_object(root, s, x)) return 0;
    if (json_is_array(x) && !v_array(root, s, x)) return 0;
    if (json_is_number(x)) { /* numeric bounds, compared as doubles (the test values are small) */
        double v = json_number_value(x);
        const json_t *b;
        if ((b = json_object_get(s, "minimum")) && v < json_number_value(b)) return 0;
        if ((b = json_object_get(s, "maximum")) && v > json_number_value(b)) return 0;
        if ((b = json_object_get(s, "exclusiveMinimum")) && v <= json_number_value(b)) return 0;
        if ((b = json_object_get(s, "exclusiveMaximum")) && v >= json_number_value(b)) return 0;
    }
    if (json_is_string(x)) {
        long n = v_codepoints(json_string_value(x), json_string_length(x));
        const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
        if ((mn && n < json_integer_value(mn)) || (mx && n > json_integer_value(mx))) return 0;
        const json_t *f = json_object_get(s, "format");
        if (f && !v_format(json_string_value(f), json_string_value(x))) return 0;
    }
    return 1;
}

#endif
