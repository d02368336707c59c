/* String formats (src/grammar/format.c): "date" (YYYY-MM-DD, day within the month's length,
 * February up to 28), "date-time" (RFC 3339: date, 'T', hh:mm:ss, optional 1-6 digit fraction,
 * 'Z' or +hh:mm / -hh:mm), "time" (the part after 'T'), "uuid" (8-4-4-4-12 hex digits), "email"
 * (dot-separated atoms of [A-Za-z0-9_+-], '@', two or more dot-separated [A-Za-z0-9] labels). */
#include <string.h>

#include "common/status.h"
#include "grammar/format.h"

/* A rule of alternatives, each the byte ranges of one row of pairs "lohi" (e.g. "09" = [0-9]). */
static int ranges(tl_gbuild *b, const char *const *alts, int n) {
    int r = tl_gb_rule(b);
    for (int i = 0; i < n; i++) {
        if (i) tl_gb_alt(b, r);
        for (const char *p = alts[i]; p[0] && p[1]; p += 2)
            tl_gb_char(b, r, (uint8_t)p[0], (uint8_t)p[1]);
    }
    return r;
}

static int date_rule(tl_gbuild *b) {
    /* month-day: MM then day range, grouped by month length */
    static const char *const rows[] = {
        /* 31-day months: 01 03 05 07 08 10 12 */
        "00"
        "11"
        "--"
        "00"
        "19",
        "00"
        "11"
        "--"
        "12"
        "09",
        "00"
        "11"
        "--"
        "33"
        "01",
        "00"
        "33"
        "--"
        "00"
        "19",
        "00"
        "33"
        "--"
        "12"
        "09",
        "00"
        "33"
        "--"
        "33"
        "01",
        "00"
        "55"
        "--"
        "00"
        "19",
        "00"
        "55"
        "--"
        "12"
        "09",
        "00"
        "55"
        "--"
        "33"
        "01",
        "00"
        "77"
        "--"
        "00"
        "19",
        "00"
        "77"
        "--"
        "12"
        "09",
        "00"
        "77"
        "--"
        "33"
        "01",
        "00"
        "88"
        "--"
        "00"
        "19",
        "00"
        "88"
        "--"
        "12"
        "09",
        "00"
        "88"
        "--"
        "33"
        "01",
        "11"
        "00"
        "--"
        "00"
        "19",
        "11"
        "00"
        "--"
        "12"
        "09",
        "11"
        "00"
        "--"
        "33"
        "01",
        "11"
        "22"
        "--"
        "00"
        "19",
        "11"
        "22"
        "--"
        "12"
        "09",
        "11"
        "22"
        "--"
        "33"
        "01",
        /* 30-day months: 04 06 09 11 */
        "00"
        "44"
        "--"
        "00"
        "19",
        "00"
        "44"
        "--"
        "12"
        "09",
        "00"
        "44"
        "--"
        "33"
        "00",
        "00"
        "66"
        "--"
        "00"
        "19",
        "00"
        "66"
        "--"
        "12"
        "09",
        "00"
        "66"
        "--"
        "33"
        "00",
        "00"
        "99"
        "--"
        "00"
        "19",
        "00"
        "99"
        "--"
        "12"
        "09",
        "00"
        "99"
        "--"
        "33"
        "00",
        "11"
        "11"
        "--"
        "00"
        "19",
        "11"
        "11"
        "--"
        "12"
        "09",
        "11"
        "11"
        "--"
        "33"
        "00",
        /* February 01-28 */
        "00"
        "22"
        "--"
        "00"
        "19",
        "00"
        "22"
        "--"
        "11"
        "09",
        "00"
        "22"
        "--"
        "22"
        "08",
    };
    int mdr = ranges(b, rows, (int)(sizeof(rows) / sizeof(rows[0])));
    int r = tl_gb_rule(b);
    for (int i = 0; i < 4; i++) tl_gb_char(b, r, '0', '9');
    tl_gb_char(b, r, '-', '-');
    tl_gb_ref(b, r, mdr);
    return r;
}

/* zero to n digits */
static int digits(tl_gbuild *b, int n) {
    int d = tl_gb_rule(b);
    for (int k = 0; k < n; k++) {
        int r = tl_gb_rule(b);
        tl_gb_alt(b, r);
        tl_gb_char(b, r, '0', '9');
        tl_gb_ref(b, r, d);
        d = r;
    }
    return d;
}

/* hh:mm:ss(.f{1,6})?(Z|[+-]hh:mm) */
static int time_rule(tl_gbuild *b) {
    static const char *const hh[] = {"0109", "2203"}, *const mm[] = {"0509"},
                             *const sg[] = {"++", "--"};
    int h = ranges(b, hh, 2), m = ranges(b, mm, 1), sign = ranges(b, sg, 2);
    int frac = tl_gb_rule(b), off = tl_gb_rule(b), d5 = digits(b, 5);
    tl_gb_alt(b, frac);
    tl_gb_char(b, frac, '.', '.');
    tl_gb_char(b, frac, '0', '9');
    tl_gb_ref(b, frac, d5);
    tl_gb_char(b, off, 'Z', 'Z');
    tl_gb_alt(b, off);
    tl_gb_ref(b, off, sign);
    tl_gb_ref(b, off, h);
    tl_gb_char(b, off, ':', ':');
    tl_gb_ref(b, off, m);
    int r = tl_gb_rule(b);
    tl_gb_ref(b, r, h);
    tl_gb_char(b, r, ':', ':');
    tl_gb_ref(b, r, m);
    tl_gb_char(b, r, ':', ':');
    tl_gb_ref(b, r, m);
    tl_gb_ref(b, r, frac);
    tl_gb_ref(b, r, off);
    return r;
}

static int uuid_rule(tl_gbuild *b) {
    static const char *const hx[] = {"09", "af", "AF"};
    int h = ranges(b, hx, 3), r = tl_gb_rule(b);
    static const int groups[] = {8, 4, 4, 4, 12};
    for (int g = 0; g < 5; g++) {
        if (g) tl_gb_char(b, r, '-', '-');
        for (int k = 0; k < groups[g]; k++) tl_gb_ref(b, r, h);
    }
    return r;
}

/* One or more chars of class c, then ( sep and again )* with sep '.' ; min_parts 1 or 2. */
static int dotted(tl_gbuild *b, int c, int min_parts) {
    int more = tl_gb_rule(b), atom = tl_gb_rule(b), tail = tl_gb_rule(b);
    tl_gb_alt(b, more); /* more: zero or more chars */
    tl_gb_ref(b, more, c);
    tl_gb_ref(b, more, more);
    tl_gb_ref(b, atom, c);
    tl_gb_ref(b, atom, more);
    tl_gb_alt(b, tail); /* tail: ( '.' atom )* */
    tl_gb_char(b, tail, '.', '.');
    tl_gb_ref(b, tail, atom);
    tl_gb_ref(b, tail, tail);
    int r = tl_gb_rule(b);
    tl_gb_ref(b, r, atom);
    if (min_parts > 1) {
        tl_gb_char(b, r, '.', '.');
        tl_gb_ref(b, r, atom);
    }
    tl_gb_ref(b, r, tail);
    return r;
}

static int email_rule(tl_gbuild *b) {
    static const char *const lc[] = {"az", "AZ", "09", "__", "++", "--"};
    int local = dotted(b, ranges(b, lc, 6), 1), dom = dotted(b, ranges(b, lc, 3), 2);
    int r = tl_gb_rule(b);
    tl_gb_ref(b, r, local);
    tl_gb_char(b, r, '@', '@');
    tl_gb_ref(b, r, dom);
    return r;
}

int tl_format_rule(tl_gbuild *b, const char *name) {
    int inner;
    if (!strcmp(name, "date"))
        inner = date_rule(b);
    else if (!strcmp(name, "time"))
        inner = time_rule(b);
    else if (!strcmp(name, "date-time")) {
        int d = date_rule(b), t = time_rule(b);
        inner = tl_gb_rule(b);
        tl_gb_ref(b, inner, d);
        tl_gb_char(b, inner, 'T', 'T');
        tl_gb_ref(b, inner, t);
    } else if (!strcmp(name, "uuid"))
        inner = uuid_rule(b);
    else if (!strcmp(name, "email"))
        inner = email_rule(b);
    else
        return TL_ERR_UNSUPPORTED;
    int r = tl_gb_rule(b);
    tl_gb_char(b, r, '"', '"');
    tl_gb_ref(b, r, inner);
    tl_gb_char(b, r, '"', '"');
    return b->err ? b->err : r;
}
