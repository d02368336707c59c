/* Numbers inside bounds (src/grammar/numrange.c): digit automata for integer and decimal ranges
 * (docs/architecture.md §9, "Numeric bounds"). A range of digit strings of one length is walked
 * digit by digit with two flags, "still equal to the lower bound's prefix" and "still equal to
 * the upper bound's"; each (position, flags) is one rule, so a range costs at most 4 rules per
 * digit position. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/util.h"
#include "grammar/numrange.h"

/* The n digits of v (0 <= v < 10^n), zero-padded, into s[0..n). */
static void put_digits(tl_i128 v, int n, char *s) {
    for (int i = n - 1; i >= 0; i--) {
        s[i] = (char)('0' + (int)(v % 10));
        v /= 10;
    }
}

static int n_digits(tl_i128 v) {
    int n = 1;
    for (; v >= 10; v /= 10) n++;
    return n;
}

/* Digit strings between lo and hi (both n digits). For an integer part (frac = 0) exactly n
 * digits; for a fraction (frac = 1, n = 16) 0 to 16 digits read as zero-padded to 16, written
 * after a '.' when there is at least one. */
typedef struct dfa {
    tl_gbuild *b;
    char lo[17], hi[17];
    int n, frac;
    int memo[17][2][2];
} dfa;

static int zeros_from(const char *s, int pos, int n) {
    for (int i = pos; i < n; i++)
        if (s[i] != '0') return 0;
    return 1;
}

static int dstate(dfa *d, int pos, int tl, int th) {
    if (d->memo[pos][tl][th] >= 0) return d->memo[pos][tl][th];
    tl_gbuild *b = d->b;
    int r = tl_gb_rule(b), alts = 0;
    if (r < 0) return r;
    d->memo[pos][tl][th] = r;
    /* the end: an integer part has exactly n digits; a fraction may stop wherever the rest, read
     * as zeros, is still at or above the lower bound (zeros never exceed the upper one) */
    if (d->frac ? (!tl || zeros_from(d->lo, pos, d->n)) : pos == d->n) alts = 1;
    if (pos == d->n) return r;
    int dlo = tl ? d->lo[pos] : '0', dhi = th ? d->hi[pos] : '9';
    for (int c = dlo; c <= dhi;) {
        int ntl = tl && c == d->lo[pos], nth = th && c == d->hi[pos], e = c;
        while (e + 1 <= dhi && (tl && e + 1 == d->lo[pos]) == ntl &&
               (th && e + 1 == d->hi[pos]) == nth)
            e++;
        int nx = dstate(d, pos + 1, ntl, nth);
        if (nx < 0) return nx;
        if (alts++) tl_gb_alt(b, r);
        if (d->frac && pos == 0) tl_gb_char(b, r, '.', '.');
        tl_gb_char(b, r, (uint8_t)c, (uint8_t)e);
        tl_gb_ref(b, r, nx);
        c = e + 1;
    }
    TL_ASSERT(alts > 0); /* lo <= hi leaves at least one digit or the end at every state */
    return b->err ? b->err : r;
}

static int dfa_rule(tl_gbuild *b, tl_i128 lo, tl_i128 hi, int n, int frac) {
    dfa d = {.b = b, .n = n, .frac = frac};
    memset(d.memo, 0xff, sizeof d.memo);
    put_digits(lo, n, d.lo);
    put_digits(hi, n, d.hi);
    return dstate(&d, 0, 1, 1);
}

/* Integers in [x, y] (0 <= x <= y), no leading zeros: one automaton per digit count. */
static int int_range(tl_gbuild *b, tl_i128 x, tl_i128 y) {
    int r = tl_gb_rule(b), first = 1;
    tl_i128 p = 1; /* 10^(L-1) */
    for (int L = 1; L <= n_digits(y); L++, p *= 10) {
        tl_i128 a = L == 1 ? 0 : p, z = p * 10 - 1;
        if (a < x) a = x;
        if (z > y) z = y;
        if (a > z) continue;
        int s = dfa_rule(b, a, z, L, 0);
        if (!first) tl_gb_alt(b, r);
        tl_gb_ref(b, r, s);
        first = 0;
    }
    return b->err ? b->err : r;
}

/* Integer part I then fraction f with I in [x, y] and f (16 digits) in [fx, fy]. */
static int int_frac(tl_gbuild *b, tl_i128 x, tl_i128 y, tl_i128 fx, tl_i128 fy) {
    int i = int_range(b, x, y), f = dfa_rule(b, fx, fy, 16, 1), r = tl_gb_rule(b);
    tl_gb_ref(b, r, i);
    tl_gb_ref(b, r, f);
    return b->err ? b->err : r;
}

/* Magnitudes (no sign) in [a, z], 0 <= a <= z. */
static int magnitude(tl_gbuild *b, int integer, tl_i128 a, tl_i128 z) {
    if (integer) return int_range(b, a, z);
    tl_i128 U = TL_NUM_UNIT, ai = a / U, af = a % U, zi = z / U, zf = z % U;
    if (ai == zi) return int_frac(b, ai, ai, af, zf);
    int r = tl_gb_rule(b);
    tl_gb_ref(b, r, int_frac(b, ai, ai, af, U - 1));
    if (ai + 1 <= zi - 1) {
        tl_gb_alt(b, r);
        tl_gb_ref(b, r, int_frac(b, ai + 1, zi - 1, 0, U - 1));
    }
    tl_gb_alt(b, r);
    tl_gb_ref(b, r, int_frac(b, zi, zi, 0, zf));
    return b->err ? b->err : r;
}

int tl_num_range_rule(tl_gbuild *b, int integer, tl_i128 lo, tl_i128 hi) {
    tl_i128 max = integer ? TL_NUM_MAX_INT : TL_NUM_MAX_DEC;
    TL_ASSERT(lo <= hi && lo >= -max && hi <= max);
    int r = tl_gb_rule(b);
    if (hi >= 0) tl_gb_ref(b, r, magnitude(b, integer, lo > 0 ? lo : 0, hi));
    if (lo <= 0) { /* '-' then a magnitude: -0 is zero, so it comes with 0 */
        if (hi >= 0) tl_gb_alt(b, r);
        tl_gb_char(b, r, '-', '-');
        tl_gb_ref(b, r, magnitude(b, integer, hi < 0 ? -hi : 0, -lo));
    }
    return b->err ? b->err : r;
}

tl_i128 tl_num_scale_double(double d, int scale, int up) {
    if (d > 1e17) d = 1e17;
    if (d < -1e17) d = -1e17;
    int neg = d < 0;
    char buf[1200]; /* 18 integer digits, '.', 1100 fraction digits: every double exactly */
    snprintf(buf, sizeof buf, "%.1100f", neg ? -d : d);
    tl_i128 m = 0;
    const char *p = buf;
    for (; *p >= '0' && *p <= '9'; p++) m = m * 10 + (*p - '0');
    TL_ASSERT(*p == '.');
    p++;
    for (int i = 0; i < scale; i++, p++) m = m * 10 + (*p - '0');
    int inexact = 0;
    for (; *p; p++) inexact |= *p != '0';
    /* m = floor(|d| * 10^scale); the rounding direction flips with the sign */
    if (neg) return -(m + ((!up) && inexact));
    return m + (up && inexact);
}
