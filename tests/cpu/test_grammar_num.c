/* Tests of numeric bounds in schemas (src/grammar/numrange.c, schema.c): integer and number
 * minimum/maximum/exclusive*, random bounds, the grammar's acceptance of numbers near and far
 * from them against plain arithmetic in this file (int64 / exact decimals scaled by 10^16 in
 * __int128, strtod for the double a validator would parse), random walks through the grammar
 * that must stay in range, -0, leading zeros, multipleOf and refused cases. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "t_check.h"

typedef __int128 i128;
#define UNIT   ((i128)10000000000000000LL)
#define MAXINT 9999999999999999LL

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static long long rnd(long long n) { return (long long)(rnd64() % (uint64_t)n); }

static tl_grammar *compile_text(const char *text, int *rc_out, char *err, size_t errlen) {
    json_t *s = json_loads(text, JSON_DECODE_ANY, NULL);
    CHECK(s != NULL);
    tl_grammar *g = NULL;
    *rc_out = s ? tl_grammar_from_schema(s, &g, err, errlen) : -1;
    json_decref(s);
    return g;
}

static int accepts(const tl_grammar *g, const char *doc) {
    tl_grammar_state *st;
    CHECK_EQ_INT(tl_grammar_state_new(g, &st), 0);
    int ok = 1;
    for (const char *p = doc; *p && ok; p++) ok = tl_grammar_accept_byte(st, (uint8_t)*p) == 0;
    ok = ok && tl_grammar_is_complete(st);
    tl_grammar_state_free(st);
    return ok;
}

/* A random integer of 1-16 digits, signed. */
static long long rand_int(void) {
    int nd = 1 + (int)rnd(16);
    long long v = 0;
    for (int i = 0; i < nd; i++) v = v * 10 + rnd(10);
    return rnd(2) ? -v : v;
}

/* Integer bounds: each optional, inclusive or exclusive, a JSON integer or a real k + q/4. */
typedef struct ibound {
    int present, excl, real, q;
    long long k;
} ibound;

static void ibound_json(char *out, size_t n, const char *key, const ibound *b) {
    if (b->real)
        snprintf(out, n, ",\"%s\":%lld.%s", key, b->k, b->q == 1 ? "25" : b->q == 2 ? "5" : "75");
    else
        snprintf(out, n, ",\"%s\":%lld", key, b->k);
}

static void ibound_rand(ibound *b, long long centre) {
    b->present = rnd(4) != 0;
    b->excl = (int)rnd(2);
    b->real = rnd(3) == 0;
    b->q = 1 + (int)rnd(3);
    b->k = rnd(2) ? centre + rnd(2000) - 1000 : rand_int() / (rnd(2) ? 1 : 1000);
    if (b->real) { /* k + q/4 exact in a double: |k| below 2^50; non-negative k for "k.25" */
        b->k = llabs(b->k) % (1LL << 50);
    }
}

/* The integer range (lo, hi) these bounds describe, in plain arithmetic: the real bound is
 * k + q/4 with 0 < q/4 < 1, so floor = k and ceil = k + 1. */
static void ibound_range(const ibound *mn, const ibound *mx, long long *lo, long long *hi) {
    *lo = -MAXINT;
    *hi = MAXINT;
    if (mn->present) {
        long long v = mn->real ? mn->k + 1 : mn->excl ? mn->k + 1 : mn->k;
        if (v > *lo) *lo = v;
    }
    if (mx->present) {
        long long v = mx->real ? mx->k : mx->excl ? mx->k - 1 : mx->k;
        if (v < *hi) *hi = v;
    }
}

static void check_int_value(const tl_grammar *g, long long v, long long lo, long long hi,
                            const char *schema) {
    char doc[40];
    snprintf(doc, sizeof doc, "%lld", v);
    int want = v >= lo && v <= hi && llabs(v) <= MAXINT;
    int got = accepts(g, doc);
    if (got != want) fprintf(stderr, "%s: %s accepted %d, expected %d\n", schema, doc, got, want);
    CHECK_EQ_INT(got, want);
}

/* Random walk: bytes from "-.0123456789eE+" that the grammar accepts, ending when complete
 * (with probability 1/3 per step) or when nothing more is accepted. Returns the length. */
static size_t walk(const tl_grammar *g, char *out, size_t cap) {
    static const char alpha[] = "-.0123456789eE+";
    tl_grammar_state *st;
    CHECK_EQ_INT(tl_grammar_state_new(g, &st), 0);
    size_t n = 0;
    while (n + 1 < cap) {
        if (tl_grammar_is_complete(st) && rnd(3) == 0) break;
        char ok[sizeof alpha];
        int k = 0;
        for (const char *a = alpha; *a; a++) {
            tl_grammar_state *c;
            CHECK_EQ_INT(tl_grammar_state_clone(st, &c), 0);
            if (tl_grammar_accept_byte(c, (uint8_t)*a) == 0) ok[k++] = *a;
            tl_grammar_state_free(c);
        }
        if (!k) break;
        char b = ok[rnd(k)];
        CHECK_EQ_INT(tl_grammar_accept_byte(st, (uint8_t)b), 0);
        out[n++] = b;
    }
    out[n] = 0;
    CHECK(tl_grammar_is_complete(st));
    tl_grammar_state_free(st);
    return n;
}

static void test_integer_random_bounds(void) {
    int n_cases = 0, n_empty = 0;
    for (int iter = 0; iter < 400; iter++) {
        long long centre = rand_int();
        ibound mn, mx;
        ibound_rand(&mn, centre);
        ibound_rand(&mx, centre);
        char schema[256] = "{\"type\":\"integer\"", part[100];
        if (rnd(4) && !mn.real && !mx.real && mn.k > mx.k) { /* mostly non-empty ranges */
            long long t = mn.k;
            mn.k = mx.k, mx.k = t;
        }
        if (mn.present) {
            ibound_json(part, sizeof part, mn.excl ? "exclusiveMinimum" : "minimum", &mn);
            strcat(schema, part);
        }
        if (mx.present) {
            ibound_json(part, sizeof part, mx.excl ? "exclusiveMaximum" : "maximum", &mx);
            strcat(schema, part);
        }
        strcat(schema, "}");
        long long lo, hi;
        ibound_range(&mn, &mx, &lo, &hi);
        char err[300] = "";
        int rc;
        tl_grammar *g = compile_text(schema, &rc, err, sizeof err);
        if (lo > hi) { /* no integer of the policy satisfies the bounds: refused by name */
            CHECK_EQ_INT(rc, TL_ERR_UNSUPPORTED);
            CHECK(strstr(err, "minimum") != NULL);
            n_empty++;
            continue;
        }
        if (rc) fprintf(stderr, "%s: %s\n", schema, err);
        CHECK_EQ_INT(rc, 0);
        if (!g) continue;
        n_cases++;
        long long probes[] = {lo - 2, lo - 1, lo, lo + 1, hi - 1, hi,
                              hi + 1, hi + 2, 0,  1,      -1,     centre};
        for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
            check_int_value(g, probes[i], lo, hi, schema);
        for (int i = 0; i < 60; i++) {
            long long v = rnd(2) ? rand_int() : lo + rnd(hi - lo + 1 > 0 ? hi - lo + 1 : 1);
            check_int_value(g, v, lo, hi, schema);
        }
        /* -0 is zero; leading zeros, fractions and exponents are never written */
        CHECK_EQ_INT(accepts(g, "-0"), lo <= 0 && hi >= 0);
        CHECK(!accepts(g, "00") && !accepts(g, "-01") && !accepts(g, "1.0") && !accepts(g, "1e1"));
        for (int w = 0; w < 20; w++) {
            char doc[64];
            walk(g, doc, sizeof doc);
            char *end;
            long long v = strtoll(doc, &end, 10);
            CHECK(*end == 0 && doc[0] != 0);
            if (v < lo || v > hi) fprintf(stderr, "%s: walked %s out of range\n", schema, doc);
            CHECK(v >= lo && v <= hi);
        }
        tl_grammar_free(g);
    }
    printf("# integer bounds: %d ranges checked, %d empty ones refused\n", n_cases, n_empty);
    CHECK(n_cases > 250);
}

/* A decimal string of the number policy without exponent -> its value * 10^16 (exact). */
static i128 dec_scaled(const char *s) {
    int neg = *s == '-';
    s += neg;
    i128 ip = 0, fp = 0, w = UNIT;
    for (; *s >= '0' && *s <= '9'; s++) ip = ip * 10 + (*s - '0');
    if (*s == '.')
        for (s++; *s; s++) w /= 10, fp += (*s - '0') * w;
    i128 v = ip * UNIT + fp;
    return neg ? -v : v;
}

/* A random number string near the scaled value c (or anywhere), of the policy's shape. */
static void rand_number(char *out, size_t n, i128 c) {
    i128 v = c;
    switch (rnd(4)) {
    case 0:
        v = c + (i128)(rnd(2001) - 1000);
        break; /* last digits */
    case 1:
        v = c + (i128)(rnd(2001) - 1000) * (UNIT / 1000);
        break; /* thousandths */
    case 2:
        v = (i128)rand_int() * UNIT + (i128)rnd(10000) * (UNIT / 10000);
        break;
    default:
        break;
    }
    i128 a = v < 0 ? -v : v, ip = a / UNIT, fp = a % UNIT;
    char fd[17];
    for (int i = 15; i >= 0; i--) fd[i] = (char)('0' + (int)(fp % 10)), fp /= 10;
    fd[16] = 0;
    int nf = 16;
    while (nf > 0 && fd[nf - 1] == '0') nf--;
    if (rnd(3) == 0 && nf < 16) nf += (int)rnd(16 - nf + 1); /* trailing zeros */
    fd[nf] = 0;
    snprintf(out, n, "%s%lld%s%s", v < 0 ? "-" : "", (long long)ip, nf ? "." : "", fd);
}

/* Number bounds k + q/16 (exact decimals). Inclusive bounds: acceptance equals the exact
 * comparison. Exclusive: every accepted value is strictly inside both exactly and as the double
 * strtod parses it, and every value at least one double spacing inside is accepted. */
static void test_number_random_bounds(void) {
    int n_cases = 0;
    for (int iter = 0; iter < 300; iter++) {
        long long k[2];
        int q[2], present[2], excl[2];
        for (int j = 0; j < 2; j++) {
            k[j] = rnd(2) ? rnd(41) - 20 : (long long)(rnd(2000001)) - 1000000;
            q[j] = (int)rnd(16);
            present[j] = rnd(4) != 0;
            excl[j] = (int)rnd(2);
        }
        if (present[0] && present[1] && k[0] > k[1]) {
            long long t = k[0];
            k[0] = k[1], k[1] = t;
        }
        char schema[256] = "{\"type\":\"number\"";
        double bd[2];
        i128 bs[2];
        for (int j = 0; j < 2; j++) {
            bd[j] = (double)k[j] + q[j] / 16.0;
            bs[j] = (i128)k[j] * UNIT + (i128)q[j] * (UNIT / 16);
            if (!present[j]) continue;
            char part[100];
            snprintf(part, sizeof part, ",\"%s%s\":%.4f", excl[j] ? "exclusive" : "",
                     j ? (excl[j] ? "Maximum" : "maximum") : (excl[j] ? "Minimum" : "minimum"),
                     bd[j]);
            strcat(schema, part);
        }
        strcat(schema, "}");
        char err[300] = "";
        int rc;
        tl_grammar *g = compile_text(schema, &rc, err, sizeof err);
        int empty =
            present[0] && present[1] && (bs[0] > bs[1] || (bs[0] == bs[1] && (excl[0] || excl[1])));
        if (empty) {
            CHECK_EQ_INT(rc, TL_ERR_UNSUPPORTED);
            continue;
        }
        if (rc) fprintf(stderr, "%s: %s\n", schema, err);
        CHECK_EQ_INT(rc, 0);
        if (!g) continue;
        n_cases++;
        for (int i = 0; i < 150; i++) {
            char doc[64];
            rand_number(doc, sizeof doc, i % 3 == 2 ? 0 : bs[i % 2]);
            i128 x = dec_scaled(doc);
            double xd = strtod(doc, NULL);
            int got = accepts(g, doc), exact_in = 1, sound = 1, margin_in = 1;
            for (int j = 0; j < 2; j++) {
                if (!present[j]) continue;
                /* one double spacing at the bound, in units of 10^-16, plus slack */
                i128 m =
                    (i128)(fabs(bd[j] - nextafter(bd[j], j ? -INFINITY : INFINITY)) * 1e16) + 2;
                int lower = j == 0;
                int in = lower ? x >= bs[j] : x <= bs[j];
                int strict = lower ? x > bs[j] && xd > bd[j] : x < bs[j] && xd < bd[j];
                int inside_m = lower ? x >= bs[j] + m : x <= bs[j] - m;
                exact_in &= in;
                sound &= excl[j] ? strict : in;
                margin_in &= excl[j] ? inside_m : in;
            }
            if (!excl[0] && !excl[1] && got != exact_in)
                fprintf(stderr, "%s: %s accepted %d, expected %d\n", schema, doc, got, exact_in);
            if (!excl[0] && !excl[1]) CHECK_EQ_INT(got, exact_in);
            if (got && !sound) fprintf(stderr, "%s: %s accepted outside\n", schema, doc);
            CHECK(!got || sound);
            if (margin_in && !got) fprintf(stderr, "%s: %s refused inside\n", schema, doc);
            CHECK(!margin_in || got);
        }
        for (int w = 0; w < 20; w++) {
            char doc[64];
            walk(g, doc, sizeof doc);
            if (present[0] || present[1]) /* with bounds, no exponent */
                CHECK(strchr(doc, 'e') == NULL && strchr(doc, 'E') == NULL);
            i128 x = dec_scaled(doc);
            double xd = strtod(doc, NULL);
            for (int j = 0; j < 2; j++) {
                if (!present[j]) continue;
                int lower = j == 0, ok = lower ? (excl[j] ? x > bs[j] && xd > bd[j] : x >= bs[j])
                                               : (excl[j] ? x < bs[j] && xd < bd[j] : x <= bs[j]);
                if (!ok) fprintf(stderr, "%s: walked %s out of range\n", schema, doc);
                CHECK(ok);
            }
        }
        tl_grammar_free(g);
    }
    printf("# number bounds: %d ranges checked\n", n_cases);
    CHECK(n_cases > 200);
}

/* Hand-worked cases (the brief's: for maximum 5, 5.0 and 5.000 are in, 5.01 is not). */
static void test_number_hand(void) {
    static const struct {
        const char *schema, *yes[6], *no[6];
    } cases[] = {
        {"{\"type\":\"number\",\"maximum\":5}",
         {"5", "5.0", "5.000", "4.9999999999999999", "-9999999999999999.9999999999999999", NULL},
         {"5.01", "5.0000000000000001", "6", "5e0", "05", NULL}},
        {"{\"type\":\"number\",\"minimum\":-1.5,\"exclusiveMaximum\":0}",
         {"-1.5", "-1.50", "-0.0000000000000001", "-1", "-0.5", NULL},
         {"-1.5000000000000001", "0", "-0", "0.0", "-2", NULL}},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":0}",
         {"0", "-0", "0.000", "-0.0", NULL},
         {"0.0000000000000001", "-0.0000000000000001", "1", NULL}},
        /* 0.1 is the double 0.1000000000000000055...: as a maximum, 0.1 is in; as a minimum, the
         * decimal 0.1 is below it, so the first value in is 0.1000000000000001 */
        {"{\"type\":\"number\",\"maximum\":0.1}",
         {"0.1", "0.0999", "-3", NULL},
         {"0.1000000000000001", "0.11", NULL}},
        {"{\"type\":\"number\",\"minimum\":0.1}",
         {"0.1000000000000001", "0.2", "7", NULL},
         {"0.1", "0.0999", NULL}},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":-1,\"maximum\":1e3}",
         {"0", "-0", "999", "1000", NULL},
         {"-1", "1001", "1000.0", "1e3", NULL}},
        {"{\"type\":\"integer\",\"minimum\":2.5,\"exclusiveMaximum\":4.5}",
         {"3", "4", NULL},
         {"2", "5", NULL}},
        {"{\"type\":\"number\",\"multipleOf\":1,\"minimum\":-2}",
         {"-2", "-0", "17", NULL},
         {"-3", "1.5", "2.0", NULL}},
        {"{\"type\":\"integer\",\"multipleOf\":1.0}", {"12", "-7", NULL}, {"1.5", NULL}},
        {"{\"minimum\":10}", {"10", "10.5", NULL}, {"9.99", "\"x\"", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[300] = "";
        int rc;
        tl_grammar *g = compile_text(cases[i].schema, &rc, err, sizeof err);
        if (rc) fprintf(stderr, "%s: %s\n", cases[i].schema, err);
        CHECK_EQ_INT(rc, 0);
        if (!g) continue;
        for (int j = 0; cases[i].yes[j]; j++) {
            if (!accepts(g, cases[i].yes[j]))
                fprintf(stderr, "%s refuses %s\n", cases[i].schema, cases[i].yes[j]);
            CHECK(accepts(g, cases[i].yes[j]));
        }
        for (int j = 0; cases[i].no[j]; j++) {
            if (accepts(g, cases[i].no[j]))
                fprintf(stderr, "%s accepts %s\n", cases[i].schema, cases[i].no[j]);
            CHECK(!accepts(g, cases[i].no[j]));
        }
        tl_grammar_free(g);
    }
}

static void test_number_refused(void) {
    static const struct {
        const char *schema, *keyword;
        int rc;
    } cases[] = {
        {"{\"type\":\"integer\",\"multipleOf\":2}", "multipleOf", TL_ERR_UNSUPPORTED},
        {"{\"type\":\"number\",\"multipleOf\":0.01}", "multipleOf", TL_ERR_UNSUPPORTED},
        {"{\"type\":\"number\",\"multipleOf\":0}", "multipleOf", TL_ERR_INVALID},
        {"{\"type\":\"number\",\"minimum\":\"3\"}", "minimum", TL_ERR_INVALID},
        {"{\"type\":\"number\",\"exclusiveMinimum\":true}", "exclusiveMinimum", TL_ERR_INVALID},
        {"{\"type\":\"integer\",\"minimum\":1e17}", "minimum", TL_ERR_UNSUPPORTED},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "minimum", TL_ERR_UNSUPPORTED},
        {"{\"type\":\"number\",\"exclusiveMinimum\":1,\"exclusiveMaximum\":1}", "minimum",
         TL_ERR_UNSUPPORTED},
        {"{\"type\":\"number\",\"exclusiveMaximum\":9007199254740993}", "exclusiveMaximum",
         TL_ERR_UNSUPPORTED},
        {"{\"enum\":[1,2],\"minimum\":2}", "minimum", TL_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[300] = "";
        int rc;
        tl_grammar *g = compile_text(cases[i].schema, &rc, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].keyword))
            fprintf(stderr, "%s: rc %d, \"%s\"\n", cases[i].schema, rc, err);
        CHECK_EQ_INT(rc, cases[i].rc);
        CHECK(g == NULL);
        CHECK(strstr(err, cases[i].keyword) != NULL);
    }
}

int main(void) {
    T_RUN(test_integer_random_bounds);
    T_RUN(test_number_random_bounds);
    T_RUN(test_number_hand);
    T_RUN(test_number_refused);
    return t_summary();
}
