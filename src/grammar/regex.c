/* A regular-expression subset compiled into grammar rules (src/grammar/regex.c), for vLLM's
 * structured_outputs.regex / guided_regex. The whole output must match (anchors are implicit;
 * a leading '^' and a trailing '$' are accepted and ignored).
 *
 * Supported: literal characters (UTF-8 too), '.' (any character but "\n"), classes [...] and
 * [^...] of ASCII characters, ranges and the escapes below (a negated class also matches every
 * non-ASCII character), escapes \d \D \w \W \s \S \n \r \t \f \v and a backslash before any
 * punctuation, groups (...) and (?:...), alternation |, quantifiers * + ? {m} {m,} {m,n} (bounds
 * up to TL_REGEX_MAX_REPEAT; a lazy '?' after them is accepted: the language is the same).
 * Refused (TL_ERR_UNSUPPORTED, the construct named): backreferences, lookaround, \b \B, other
 * (?...) groups, non-ASCII class members, anchors elsewhere, possessive quantifiers, and a
 * quantifier on something that can match the empty string.
 *
 * tl_regex_json_rule is the same subset for JSON Schema's `pattern` (docs/architecture.md §9): the
 * rule is the body of a JSON string whose decoded value matches, each character written in one
 * canonical JSON form (`"` `\` and control characters escaped: \" \\ \b \f \n \r \t, others
 * \u00XX; '<' as \u003c when no_lt), with search semantics: every top-level alternative gets
 * "any characters" before it unless it starts with '^' and after it unless it ends with '$'.
 * There \s and \S are refused (ECMA-262 and Python count non-ASCII spaces in them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/json_rules.h"
#include "grammar/regex.h"

typedef struct rx {
    tl_gbuild *b;
    const char *p, *end;
    char *err;
    size_t errlen;
    int depth;
    int json;   /* 0: raw bytes; 1: JSON string body; 2: the same with '<' escaped */
    int search; /* JSON Schema `pattern`: anchors per top-level alternative, else "any" */
    int dollar; /* the last top-level alternative parsed ended with '$' */
} rx;

typedef struct piece {
    int rule; /* negative: an error status */
    int nullable;
} piece;

static piece fail(rx *x, int st, const char *fmt, const char *what) {
    tl_errf(x->err, x->errlen, st, fmt, what);
    return (piece){st, 0};
}

typedef struct bset {
    uint8_t on[128]; /* ASCII members */
    int non_ascii;   /* every multi-byte character too (negated classes, \D \W \S) */
} bset;

static void set_range(bset *s, int lo, int hi, int v) {
    for (int c = lo; c <= hi; c++) s->on[c] = (uint8_t)v;
}

/* The shorthand class of escape c into s (1 if c is one). */
static int shorthand(int c, bset *s) {
    bset t = {{0}, 0};
    int neg = c >= 'A' && c <= 'Z', l = neg ? c + 32 : c;
    if (l == 'd') {
        set_range(&t, '0', '9', 1);
    } else if (l == 'w') {
        set_range(&t, '0', '9', 1);
        set_range(&t, 'A', 'Z', 1);
        set_range(&t, 'a', 'z', 1);
        t.on['_'] = 1;
    } else if (l == 's') {
        set_range(&t, '\t', '\r', 1);
        t.on[' '] = 1;
    } else {
        return 0;
    }
    for (int i = 0; i < 128; i++) s->on[i] |= (uint8_t)(neg ? !t.on[i] : t.on[i]);
    s->non_ascii |= neg;
    return 1;
}

/* A single-character escape (\n, \., ...): its byte, or -1. */
static int escape_byte(int c) {
    switch (c) {
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    case 'f':
        return '\f';
    case 'v':
        return '\v';
    default:
        return c < 128 && c > ' ' && !(c >= '0' && c <= '9') && !(c >= 'A' && c <= 'Z') &&
                       !(c >= 'a' && c <= 'z')
                   ? c
                   : -1;
    }
}

/* In JSON mode, the escape that writes byte c inside a string (into out), or 0 when c is written
 * as itself. */
static int json_escape(const rx *x, int c, char out[8]) {
    if (!x->json || !(c < 0x20 || c == '"' || c == '\\' || (c == '<' && x->json == 2))) return 0;
    static const char shorts[] = "\"\"\\\\\bb\ff\nn\rr\tt"; /* byte, its letter after '\' */
    for (const char *q = shorts; *q; q += 2)
        if (*q == c) return out[0] = '\\', out[1] = q[1], out[2] = 0, 1;
    snprintf(out, 8, "\\u%04x", c);
    return 1;
}

/* Appends escape esc to rule r; the hex letters of a \u escape in either case. */
static void esc_rule(rx *x, int r, const char *esc) {
    for (const char *q = esc; *q; q++) {
        int lo = q - esc >= 2 && *q >= 'a' && *q <= 'f';
        if (lo) {
            int h = tl_gb_rule(x->b);
            tl_gb_char(x->b, h, (uint8_t)*q, (uint8_t)*q);
            tl_gb_alt(x->b, h);
            tl_gb_char(x->b, h, (uint8_t)(*q - 32), (uint8_t)(*q - 32));
            tl_gb_ref(x->b, r, h);
        } else {
            tl_gb_char(x->b, r, (uint8_t)*q, (uint8_t)*q);
        }
    }
}

static int set_rule(rx *x, const bset *s) {
    int r = tl_gb_rule(x->b), first = 1;
    for (int c = 0; c < 128; c++) {
        if (!s->on[c]) continue;
        char esc[8];
        if (json_escape(x, c, esc)) {
            if (!first) tl_gb_alt(x->b, r);
            esc_rule(x, r, esc);
            first = 0;
            continue;
        }
        int hi = c;
        while (hi + 1 < 128 && s->on[hi + 1] && !json_escape(x, hi + 1, esc)) hi++;
        if (!first) tl_gb_alt(x->b, r);
        tl_gb_char(x->b, r, (uint8_t)c, (uint8_t)hi);
        first = 0;
        c = hi;
    }
    if (s->non_ascii)
        tl_jr_utf8_multi(x->b, r, first);
    else if (first) /* an empty class matches nothing: a rule with no way through */
        tl_gb_char(x->b, r, 1, 0);
    return x->b->err ? x->b->err : r;
}

/* One class member (a character or an escape) into s; *single = its byte when it is one. */
static int class_member(rx *x, bset *s, int *single) {
    int c = (unsigned char)*x->p++;
    *single = -1;
    if (c >= 128) return -1;
    if (c != '\\') return *single = c, 0;
    if (x->p >= x->end) return -1;
    c = (unsigned char)*x->p++;
    if (x->search && (c == 's' || c == 'S')) return -1;
    if (shorthand(c, s)) return 0;
    *single = escape_byte(c);
    return *single >= 0 ? 0 : -1;
}

static piece parse_class(rx *x) {
    bset s = {{0}, 0};
    int neg = x->p < x->end && *x->p == '^';
    if (neg) x->p++;
    int first = 1;
    while (x->p < x->end && (*x->p != ']' || first)) {
        first = 0;
        int lo, hi;
        if (class_member(x, &s, &lo))
            return fail(x, TL_ERR_UNSUPPORTED, "unsupported regex class member in \"%s\"", "[...]");
        if (lo >= 0 && x->p + 1 < x->end && x->p[0] == '-' && x->p[1] != ']') {
            x->p++;
            if (class_member(x, &s, &hi) || hi < lo)
                return fail(x, TL_ERR_UNSUPPORTED, "unsupported regex class range in \"%s\"",
                            "[...]");
            set_range(&s, lo, hi, 1);
        } else if (lo >= 0) {
            s.on[lo] = 1;
        }
    }
    if (x->p >= x->end) return fail(x, TL_ERR_INVALID, "unterminated regex %s", "class");
    x->p++;
    if (neg) {
        for (int i = 0; i < 128; i++) s.on[i] = !s.on[i];
        s.non_ascii = !s.non_ascii;
    }
    return (piece){set_rule(x, &s), 0};
}

static piece parse_alt(rx *x);

/* A literal character: one UTF-8 sequence (validated by length only: the input is a JSON
 * string, so it is well-formed). */
static piece literal(rx *x) {
    const unsigned char *p = (const unsigned char *)x->p;
    size_t n = *p < 0x80 ? 1 : *p < 0xE0 ? 2 : *p < 0xF0 ? 3 : 4;
    if (n > (size_t)(x->end - x->p)) n = (size_t)(x->end - x->p);
    int r = tl_gb_rule(x->b);
    char esc[8];
    if (n == 1 && json_escape(x, *p, esc))
        esc_rule(x, r, esc);
    else
        tl_gb_lit(x->b, r, x->p, n);
    x->p += n;
    return (piece){x->b->err ? x->b->err : r, 0};
}

static piece parse_atom(rx *x) {
    char c = *x->p;
    if (c == '(') {
        x->p++;
        if (x->p < x->end && *x->p == '?') {
            if (x->p + 1 < x->end && x->p[1] == ':')
                x->p += 2;
            else
                return fail(x, TL_ERR_UNSUPPORTED, "unsupported regex construct \"%s\"", "(?");
        }
        if (++x->depth > 100) return fail(x, TL_ERR_UNSUPPORTED, "regex %s", "nested too deep");
        piece in = parse_alt(x);
        x->depth--;
        if (in.rule < 0) return in;
        if (x->p >= x->end || *x->p != ')')
            return fail(x, TL_ERR_INVALID, "unbalanced %s in the regex", "(");
        x->p++;
        return in;
    }
    if (c == '[') {
        x->p++;
        return parse_class(x);
    }
    if (c == '.') {
        x->p++;
        bset s = {{0}, 1};
        set_range(&s, 0, 127, 1);
        s.on['\n'] = 0;
        return (piece){set_rule(x, &s), 0};
    }
    if (c == '\\') {
        if (x->p + 1 >= x->end) return fail(x, TL_ERR_INVALID, "regex ends with %s", "\\");
        int e = (unsigned char)x->p[1];
        x->p += 2;
        bset s = {{0}, 0};
        if (x->search && (e == 's' || e == 'S')) {
            char what[3] = {'\\', (char)e, 0};
            return fail(x, TL_ERR_UNSUPPORTED, "unsupported regex escape \"%s\"", what);
        }
        if (shorthand(e, &s)) return (piece){set_rule(x, &s), 0};
        int byte = escape_byte(e);
        if (byte < 0) {
            char what[3] = {'\\', (char)e, 0};
            return fail(x, TL_ERR_UNSUPPORTED, "unsupported regex escape \"%s\"", what);
        }
        s.on[byte] = 1;
        return (piece){set_rule(x, &s), 0};
    }
    if (c == '^' || c == '$')
        return fail(x, TL_ERR_UNSUPPORTED, "regex anchor \"%s\" inside the pattern",
                    c == '^' ? "^" : "$");
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return fail(x, TL_ERR_INVALID, "regex quantifier \"%s\" with nothing before it", "*+?{");
    return literal(x);
}

/* {m}, {m,}, {m,n} after the '{'; returns 0 with *mn, *mx (-1: unbounded), or -1. */
static int parse_braces(rx *x, long *mn, long *mx) {
    char *e;
    *mn = strtol(x->p, &e, 10);
    if (e == x->p || e >= x->end) return -1;
    *mx = *mn;
    if (*e == ',') {
        const char *q = e + 1;
        *mx = -1;
        if (q < x->end && *q != '}') {
            *mx = strtol(q, &e, 10);
            if (e == q) return -1;
        } else {
            e = (char *)q;
        }
    }
    if (e >= x->end || *e != '}' || *mn < 0 || (*mx >= 0 && *mx < *mn)) return -1;
    x->p = e + 1;
    return 0;
}

/* x repeated mn..mx times (mx < 0: no bound) as rules. */
static int repeat(rx *x, int atom, long mn, long mx) {
    tl_gbuild *b = x->b;
    int tail;     /* what follows the mn mandatory copies */
    if (mx < 0) { /* star: tail = atom tail | empty */
        tail = tl_gb_rule(b);
        tl_gb_ref(b, tail, atom);
        tl_gb_ref(b, tail, tail);
        tl_gb_alt(b, tail);
    } else { /* up to mx - mn optional copies, nested: opt_k = empty | atom opt_{k-1} */
        tail = tl_gb_rule(b);
        for (long k = 0; k < mx - mn; k++) {
            int r = tl_gb_rule(b);
            tl_gb_alt(b, r);
            tl_gb_ref(b, r, atom);
            tl_gb_ref(b, r, tail);
            tail = r;
        }
    }
    int r = tl_gb_rule(b);
    for (long k = 0; k < mn; k++) tl_gb_ref(b, r, atom);
    tl_gb_ref(b, r, tail);
    return b->err ? b->err : r;
}

static piece parse_quant(rx *x, piece a) {
    while (a.rule >= 0 && x->p < x->end && strchr("*+?{", *x->p)) {
        long mn, mx;
        char q = *x->p++;
        if (q == '*')
            mn = 0, mx = -1;
        else if (q == '+')
            mn = 1, mx = -1;
        else if (q == '?')
            mn = 0, mx = 1;
        else if (parse_braces(x, &mn, &mx))
            return fail(x, TL_ERR_INVALID, "malformed regex quantifier %s", "{m,n}");
        if (mn > TL_REGEX_MAX_REPEAT || mx > TL_REGEX_MAX_REPEAT)
            return fail(x, TL_ERR_UNSUPPORTED, "regex repetition bound above %s", "1000");
        if (x->p < x->end && *x->p == '+')
            return fail(x, TL_ERR_UNSUPPORTED, "unsupported regex construct \"%s\"",
                        "possessive quantifier");
        if (x->p < x->end && *x->p == '?') x->p++; /* lazy: same language */
        if (a.nullable)
            return fail(x, TL_ERR_UNSUPPORTED, "regex %s",
                        "quantifier on an expression that can match the empty string");
        a = (piece){repeat(x, a.rule, mn, mx), mn == 0};
    }
    return a;
}

static piece parse_concat(rx *x) {
    int r = tl_gb_rule(x->b), nullable = 1;
    while (x->p < x->end && *x->p != '|' && *x->p != ')') {
        if (*x->p == '$' && x->depth == 0 &&
            (x->p + 1 == x->end || (x->search && x->p[1] == '|'))) {
            x->p++;
            x->dollar = 1;
            break;
        }
        piece a = parse_quant(x, parse_atom(x));
        if (a.rule < 0) return a;
        tl_gb_ref(x->b, r, a.rule);
        nullable &= a.nullable;
    }
    return (piece){x->b->err ? x->b->err : r, nullable};
}

static piece parse_alt(rx *x) {
    int r = tl_gb_rule(x->b), nullable = 0;
    for (int i = 0;; i++) {
        piece c = parse_concat(x);
        if (c.rule < 0) return c;
        if (i) tl_gb_alt(x->b, r);
        tl_gb_ref(x->b, r, c.rule);
        nullable |= c.nullable;
        if (x->p >= x->end || *x->p != '|') break;
        x->p++;
    }
    return (piece){x->b->err ? x->b->err : r, nullable};
}

int tl_regex_rule(tl_gbuild *b, const char *re, char *err, size_t errlen) {
    rx x = {b, re, re + strlen(re), err, errlen, 0, 0, 0, 0};
    if (x.p < x.end && *x.p == '^') x.p++;
    piece p = parse_alt(&x);
    if (p.rule >= 0 && x.p < x.end)
        return tl_errf(err, errlen, TL_ERR_INVALID, "unbalanced \")\" in the regex");
    return p.rule;
}

/* One top-level alternative under search semantics: "any"* before it unless it starts with '^',
 * after it unless it ends with '$'. */
static piece search_alternative(rx *x, int any) {
    int caret = x->p < x->end && *x->p == '^';
    x->p += caret;
    x->dollar = 0;
    piece c = parse_concat(x);
    if (c.rule < 0) return c;
    int r = tl_gb_rule(x->b);
    if (!caret) tl_gb_ref(x->b, r, any);
    tl_gb_ref(x->b, r, c.rule);
    if (!x->dollar) tl_gb_ref(x->b, r, any);
    return (piece){x->b->err ? x->b->err : r, 0};
}

int tl_regex_json_rule(tl_gbuild *b, const char *re, int no_lt, char *err, size_t errlen) {
    rx x = {b, re, re + strlen(re), err, errlen, 0, no_lt ? 2 : 1, 1, 0};
    bset all = {{0}, 1};
    set_range(&all, 0, 127, 1);
    int ch = set_rule(&x, &all), any = ch < 0 ? ch : repeat(&x, ch, 0, -1);
    if (any < 0) return any;
    int r = tl_gb_rule(b);
    for (int i = 0;; i++) {
        piece c = search_alternative(&x, any);
        if (c.rule < 0) return c.rule;
        if (i) tl_gb_alt(b, r);
        tl_gb_ref(b, r, c.rule);
        if (x.p >= x.end || *x.p != '|') break;
        x.p++;
    }
    if (x.p < x.end) return tl_errf(err, errlen, TL_ERR_INVALID, "unbalanced \")\" in the regex");
    return b->err ? b->err : r;
}
