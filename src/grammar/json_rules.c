/* JSON lexical rules (src/grammar/json_rules.c): UTF-8-valid string characters (escapes: the
 * short ones and \uXXXX outside the surrogate range), strings, numbers, literals, any value. */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/json_rules.h"

void tl_jr_init(tl_jrules *j, tl_gbuild *b) {
    j->b = b;
    j->ch = j->str = j->integer = j->number = j->value = -1;
    j->no_lt = 0;
}

static int hex_rule(tl_gbuild *b) {
    int r = tl_gb_rule(b);
    tl_gb_char(b, r, '0', '9');
    tl_gb_alt(b, r);
    tl_gb_char(b, r, 'a', 'f');
    tl_gb_alt(b, r);
    tl_gb_char(b, r, 'A', 'F');
    return r;
}

/* \u followed by four hex digits that are not a UTF-16 surrogate (D800-DFFF). */
static int uescape_rule(tl_gbuild *b) {
    int h = hex_rule(b), r = tl_gb_rule(b);
    static const char lead[][2] = {{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}};
    for (size_t i = 0; i < sizeof(lead) / sizeof(lead[0]); i++) {
        if (i) tl_gb_alt(b, r);
        tl_gb_char(b, r, (uint8_t)lead[i][0], (uint8_t)lead[i][1]);
        for (int k = 0; k < 3; k++) tl_gb_ref(b, r, h);
    }
    tl_gb_alt(b, r);
    tl_gb_char(b, r, 'd', 'd');
    tl_gb_char(b, r, '0', '7');
    tl_gb_ref(b, r, h);
    tl_gb_ref(b, r, h);
    tl_gb_alt(b, r);
    tl_gb_char(b, r, 'D', 'D');
    tl_gb_char(b, r, '0', '7');
    tl_gb_ref(b, r, h);
    tl_gb_ref(b, r, h);
    return r;
}

/* Well-formed UTF-8 sequences of 2-4 bytes, as rows {lead lo, lead hi, 2nd lo, 2nd hi, n}. */
static const uint8_t utf8_rows[][5] = {
    {0xC2, 0xDF, 0x80, 0xBF, 2}, {0xE0, 0xE0, 0xA0, 0xBF, 3}, {0xE1, 0xEC, 0x80, 0xBF, 3},
    {0xED, 0xED, 0x80, 0x9F, 3}, {0xEE, 0xEF, 0x80, 0xBF, 3}, {0xF0, 0xF0, 0x90, 0xBF, 4},
    {0xF1, 0xF3, 0x80, 0xBF, 4}, {0xF4, 0xF4, 0x80, 0x8F, 4},
};

int tl_jr_char(tl_jrules *j) {
    if (j->ch >= 0) return j->ch;
    tl_gbuild *b = j->b;
    int u = uescape_rule(b), r = tl_gb_rule(b);
    tl_gb_char(b, r, 0x20, 0x21);
    tl_gb_alt(b, r);
    if (j->no_lt) {
        tl_gb_char(b, r, 0x23, 0x3B);
        tl_gb_alt(b, r);
        tl_gb_char(b, r, 0x3D, 0x5B);
    } else {
        tl_gb_char(b, r, 0x23, 0x5B);
    }
    tl_gb_alt(b, r);
    tl_gb_char(b, r, 0x5D, 0x7F);
    tl_jr_utf8_multi(b, r, 0);
    static const char esc[] = "\"\\/bfnrt";
    for (const char *e = esc; *e; e++) {
        tl_gb_alt(b, r);
        tl_gb_char(b, r, '\\', '\\');
        tl_gb_char(b, r, (uint8_t)*e, (uint8_t)*e);
    }
    tl_gb_alt(b, r);
    tl_gb_lit(b, r, "\\u", 2);
    tl_gb_ref(b, r, u);
    return j->ch = r;
}

void tl_jr_utf8_multi(tl_gbuild *b, int r, int first) {
    for (size_t i = 0; i < sizeof(utf8_rows) / sizeof(utf8_rows[0]); i++) {
        const uint8_t *w = utf8_rows[i];
        if (!first || i) tl_gb_alt(b, r);
        tl_gb_char(b, r, w[0], w[1]);
        tl_gb_char(b, r, w[2], w[3]);
        for (int k = 2; k < w[4]; k++) tl_gb_char(b, r, 0x80, 0xBF);
    }
}

/* '"' then between min and max (max < 0: any number of) characters, then '"'. Rule i is "i
 * characters written so far"; with no maximum the last one loops on itself. */
int tl_jr_string(tl_jrules *j, long min, long max) {
    int unbounded = max < 0;
    if (unbounded && min == 0 && j->str >= 0) return j->str;
    tl_gbuild *b = j->b;
    long limit = unbounded ? min : max;
    int ch = tl_jr_char(j), first = -1;
    if (ch < 0) return ch;
    for (long i = 0; i <= limit; i++) {
        int r = tl_gb_rule(b);
        if (r < 0) return r;
        if (i == 0) first = r;
        if (i >= min) tl_gb_char(b, r, '"', '"');
        if (i == limit && !unbounded) continue;
        if (i >= min) tl_gb_alt(b, r);
        tl_gb_ref(b, r, ch);
        tl_gb_ref(b, r, i == limit ? r : r + 1); /* rules of one string are consecutive */
    }
    int s = tl_gb_rule(b);
    tl_gb_char(b, s, '"', '"');
    tl_gb_ref(b, s, first);
    if (unbounded && min == 0) j->str = s;
    return b->err ? b->err : s;
}

/* Zero to n digits: rule k = empty | digit, rule k-1. */
static int digits_upto(tl_gbuild *b, int n) {
    int prev = tl_gb_rule(b); /* zero digits */
    for (int k = 1; k <= n; k++) {
        int r = tl_gb_rule(b);
        tl_gb_alt(b, r);
        tl_gb_char(b, r, '0', '9');
        tl_gb_ref(b, r, prev);
        prev = r;
    }
    return prev;
}

/* -?(0|[1-9][0-9]{0,15}), and for a number (.[0-9]{1,16})? ([eE][+-]?[0-9]{1,2})?: digit counts
 * are bounded (as llama.cpp's JSON grammars do) so every number is a finite double and a model
 * cannot loop on digits. */
int tl_jr_number(tl_jrules *j, int integer) {
    int *cache = integer ? &j->integer : &j->number;
    if (*cache >= 0) return *cache;
    tl_gbuild *b = j->b;
    int d = digits_upto(b, TL_GRAMMAR_MAX_DIGITS - 1), d2 = digits_upto(b, 1);
    int mag = tl_gb_rule(b), r = tl_gb_rule(b);
    tl_gb_char(b, mag, '0', '0');
    tl_gb_alt(b, mag);
    tl_gb_char(b, mag, '1', '9');
    tl_gb_ref(b, mag, d);
    int fr = tl_gb_rule(b), ex = tl_gb_rule(b), sign = tl_gb_rule(b);
    tl_gb_alt(b, fr);
    tl_gb_char(b, fr, '.', '.');
    tl_gb_char(b, fr, '0', '9');
    tl_gb_ref(b, fr, d);
    tl_gb_alt(b, sign);
    tl_gb_char(b, sign, '+', '+');
    tl_gb_alt(b, sign);
    tl_gb_char(b, sign, '-', '-');
    tl_gb_char(b, ex, 'e', 'e');
    tl_gb_alt(b, ex);
    tl_gb_char(b, ex, 'E', 'E');
    int exr = tl_gb_rule(b); /* ex holds the e/E choice; exr the optional exponent */
    tl_gb_alt(b, exr);
    tl_gb_ref(b, exr, ex);
    tl_gb_ref(b, exr, sign);
    tl_gb_char(b, exr, '0', '9');
    tl_gb_ref(b, exr, d2);
    for (int neg = 0; neg < 2; neg++) {
        if (neg) {
            tl_gb_alt(b, r);
            tl_gb_char(b, r, '-', '-');
        }
        tl_gb_ref(b, r, mag);
        if (!integer) {
            tl_gb_ref(b, r, fr);
            tl_gb_ref(b, r, exr);
        }
    }
    return b->err ? b->err : (*cache = r);
}

int tl_jr_literal(tl_jrules *j, const json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s) return TL_ERR_NOMEM;
    int r = tl_gb_rule(j->b);
    for (const char *p = s; *p; p++) /* '<' occurs only inside strings: escaped under no_lt */
        if (*p == '<' && j->no_lt)
            tl_gb_lit(j->b, r, "\\u003c", 6);
        else
            tl_gb_char(j->b, r, (uint8_t)*p, (uint8_t)*p);
    free(s);
    return j->b->err ? j->b->err : r;
}

/* Any value: objects {"k":v,...} and arrays [v,...] of any values, strings, numbers, literals. */
int tl_jr_value(tl_jrules *j) {
    if (j->value >= 0) return j->value;
    tl_gbuild *b = j->b;
    int v = tl_gb_rule(b), str = tl_jr_string(j, 0, -1), num = tl_jr_number(j, 0);
    if (v < 0 || str < 0 || num < 0) return b->err ? b->err : TL_ERR_NOMEM;
    j->value = v;
    int kv = tl_gb_rule(b), o2 = tl_gb_rule(b), a2 = tl_gb_rule(b);
    tl_gb_ref(b, kv, str);
    tl_gb_char(b, kv, ':', ':');
    tl_gb_ref(b, kv, v);
    tl_gb_char(b, o2, '}', '}'); /* o2: after a member */
    tl_gb_alt(b, o2);
    tl_gb_char(b, o2, ',', ',');
    tl_gb_ref(b, o2, kv);
    tl_gb_ref(b, o2, o2);
    tl_gb_char(b, a2, ']', ']'); /* a2: after an element */
    tl_gb_alt(b, a2);
    tl_gb_char(b, a2, ',', ',');
    tl_gb_ref(b, a2, v);
    tl_gb_ref(b, a2, a2);
    tl_gb_lit(b, v, "{}", 2);
    tl_gb_alt(b, v);
    tl_gb_char(b, v, '{', '{');
    tl_gb_ref(b, v, kv);
    tl_gb_ref(b, v, o2);
    tl_gb_alt(b, v);
    tl_gb_lit(b, v, "[]", 2);
    tl_gb_alt(b, v);
    tl_gb_char(b, v, '[', '[');
    tl_gb_ref(b, v, v);
    tl_gb_ref(b, v, a2);
    static const char *lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        tl_gb_alt(b, v);
        tl_gb_lit(b, v, lits[i], strlen(lits[i]));
    }
    tl_gb_alt(b, v);
    tl_gb_ref(b, v, str);
    tl_gb_alt(b, v);
    tl_gb_ref(b, v, num);
    return b->err ? b->err : v;
}
