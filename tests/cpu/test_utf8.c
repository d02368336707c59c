/* The UTF-8 validator, decoder and lossy repair (src/common/utf8.c) against the independent
 * oracle of tests/t_utf8.h (utf8_ok), on random byte strings and on the edge cases of RFC 3629:
 * overlongs, surrogates, code points above U+10FFFF, truncated sequences. The expected repair is
 * built here from utf8_ok alone (maximal subparts, Unicode ch. 3), and checked once against the
 * example of Unicode's Table 3-8 as Python's bytes.decode(errors="replace") prints it. */
#include <stdint.h>
#include "t_check.h"
#include "t_utf8.h"
#include "common/utf8.h"

/* ---- the oracle's repair ---- */

/* 1 if s[0..m) (m <= 3) can be completed to one valid character. Continuation bytes 80, 90, A0
 * and BF hit every restricted second-byte range (E0: A0.., ED: ..9F, F0: 90.., F4: ..8F). */
static int completable(const uint8_t *s, size_t m) {
    static const uint8_t cont[4] = {0x80, 0x90, 0xA0, 0xBF};
    uint8_t t[4];
    memcpy(t, s, m);
    for (size_t extra = 1, combos = 4; m + extra <= 4; extra++, combos *= 4)
        for (size_t c = 0; c < combos; c++) { /* each extra byte one of the 4 */
            size_t v = c;
            for (size_t j = 0; j < extra; j++, v /= 4) t[m + j] = cont[v % 4];
            if (utf8_ok((const char *)t, m + extra)) return 1;
        }
    return 0;
}

/* Length of the valid character at s (the shortest valid prefix), or 0. */
static size_t oracle_char(const uint8_t *s, size_t n) {
    for (size_t k = 1; k <= 4 && k <= n; k++)
        if (utf8_ok((const char *)s, k)) return k;
    return 0;
}

static size_t oracle_repair(const uint8_t *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        size_t k = oracle_char(s + i, n - i);
        if (k) {
            memcpy(out + o, s + i, k);
            o += k, i += k;
            continue;
        }
        size_t m = 1; /* the maximal subpart: the longest completable prefix, at least 1 byte */
        for (size_t j = 2; j <= 3 && i + j <= n; j++)
            if (completable(s + i, j)) m = j;
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3, i += m;
    }
    return o;
}

/* ---- inputs ---- */

/* Random bytes biased towards what makes UTF-8 interesting: ASCII, continuation bytes, lead
 * bytes of every length and the bytes that can never appear (C0, C1, F5..FF). */
static size_t random_bytes(unsigned long long *rng, uint8_t *s, size_t max) {
    static const uint8_t special[] = {0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1,
                                      0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF};
    size_t n = (size_t)(t_rng_next(rng) % (max + 1));
    for (size_t i = 0; i < n; i++) {
        unsigned long long r = t_rng_next(rng);
        switch (r % 4) {
        case 0:
            s[i] = (uint8_t)('a' + (r >> 8) % 26);
            break;
        case 1:
            s[i] = (uint8_t)(0x80 | ((r >> 8) & 0x3F));
            break;
        case 2:
            s[i] = special[(r >> 8) % sizeof special];
            break;
        default:
            s[i] = (uint8_t)(r >> 8);
        }
    }
    return n;
}

/* ---- tests ---- */

static void test_utf8_random_vs_oracle(void) {
    unsigned long long rng = 0xD1B54A32D192ED03ull;
    uint8_t s[24], got[80], want[80];
    int bad_valid = 0, bad_len = 0, bad_repair = 0, n_valid = 0;
    for (int it = 0; it < 100000; it++) {
        size_t n = random_bytes(&rng, s, sizeof s);
        int ok = utf8_ok((const char *)s, n);
        n_valid += ok;
        bad_valid += tl_utf8_valid(s, n) != ok;
        /* valid_len: a valid prefix, and no valid character starts where it stops */
        size_t L = tl_utf8_valid_len(s, n);
        bad_len += L > n || !utf8_ok((const char *)s, L) || (L < n && oracle_char(s + L, n - L));
        size_t gl = tl_utf8_repair(s, n, got), wl = oracle_repair(s, n, want);
        bad_repair += gl != wl || memcmp(got, want, gl) || !utf8_ok((const char *)got, gl);
    }
    CHECK_EQ_INT(bad_valid, 0);
    CHECK_EQ_INT(bad_len, 0);
    CHECK_EQ_INT(bad_repair, 0);
    CHECK(n_valid > 1000 && n_valid < 90000); /* the inputs hit both answers */
    /* long ASCII runs with a rare other byte (tl_utf8_valid_len's 8-byte ASCII steps) */
    uint8_t t[64];
    for (int it = 0; it < 100000; it++) {
        size_t n = (size_t)(t_rng_next(&rng) % (sizeof t + 1));
        for (size_t i = 0; i < n; i++) {
            unsigned long long r = t_rng_next(&rng);
            t[i] = r % 16 ? (uint8_t)(' ' + (r >> 8) % 95) : (uint8_t)(r >> 8);
        }
        size_t L = tl_utf8_valid_len(t, n);
        bad_len += L > n || !utf8_ok((const char *)t, L) || (L < n && oracle_char(t + L, n - L));
        bad_valid += tl_utf8_valid(t, n) != utf8_ok((const char *)t, n);
    }
    CHECK_EQ_INT(bad_valid, 0);
    CHECK_EQ_INT(bad_len, 0);
}

/* Every 1- and 2-byte string, every 3-byte string with a 3-byte lead, and 4-byte strings with a
 * 4-byte lead over a set of second..fourth bytes that covers every range boundary. */
static void test_utf8_exhaustive_short(void) {
    int bad = 0;
    uint8_t s[4];
    for (int a = 0; a < 256; a++) {
        s[0] = (uint8_t)a;
        bad += tl_utf8_valid(s, 1) != utf8_ok((const char *)s, 1);
        for (int b = 0; b < 256; b++) {
            s[1] = (uint8_t)b;
            bad += tl_utf8_valid(s, 2) != utf8_ok((const char *)s, 2);
            if (a < 0xE0 || a > 0xEF) continue;
            for (int c = 0; c < 256; c++) {
                s[2] = (uint8_t)c;
                bad += tl_utf8_valid(s, 3) != utf8_ok((const char *)s, 3);
            }
        }
    }
    static const uint8_t t[] = {0x00, 0x41, 0x7F, 0x80, 0x81, 0x8E, 0x8F, 0x90, 0x91, 0x9E,
                                0x9F, 0xA0, 0xA1, 0xBE, 0xBF, 0xC0, 0xC2, 0xE0, 0xF4, 0xFF};
    for (int a = 0xF0; a <= 0xFF; a++)
        for (size_t b = 0; b < sizeof t; b++)
            for (size_t c = 0; c < sizeof t; c++)
                for (size_t d = 0; d < sizeof t; d++) {
                    uint8_t u[4] = {(uint8_t)a, t[b], t[c], t[d]};
                    bad += tl_utf8_valid(u, 4) != utf8_ok((const char *)u, 4);
                }
    CHECK_EQ_INT(bad, 0);
}

/* Every scalar value encodes to the RFC 3629 length, the oracle accepts it, and it decodes back. */
static void test_utf8_encode_decode_all_scalars(void) {
    int bad = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        uint8_t b[4];
        size_t len = tl_utf8_encode(cp, b), adv = 0;
        size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        uint32_t back = UINT32_MAX;
        int r = tl_utf8_decode(b, len, &back, &adv);
        bad += len != want || !utf8_ok((const char *)b, len) || r != TL_UTF8_OK || adv != len ||
               back != cp;
    }
    CHECK_EQ_INT(bad, 0);
}

typedef struct {
    const char *bytes;
    int status;  /* of tl_utf8_decode on all the bytes */
    size_t adv;  /* its *adv */
    uint32_t cp; /* when TL_UTF8_OK */
} edge;

static void test_utf8_edge_cases(void) {
    static const edge cases[] = {
        /* boundaries of each length (RFC 3629 table) */
        {"\x7F", TL_UTF8_OK, 1, 0x7F},
        {"\xC2\x80", TL_UTF8_OK, 2, 0x80},
        {"\xDF\xBF", TL_UTF8_OK, 2, 0x7FF},
        {"\xE0\xA0\x80", TL_UTF8_OK, 3, 0x800},
        {"\xED\x9F\xBF", TL_UTF8_OK, 3, 0xD7FF},
        {"\xEE\x80\x80", TL_UTF8_OK, 3, 0xE000},
        {"\xEF\xBF\xBF", TL_UTF8_OK, 3, 0xFFFF},
        {"\xE2\x82\xAC", TL_UTF8_OK, 3, 0x20AC},
        {"\xF0\x90\x80\x80", TL_UTF8_OK, 4, 0x10000},
        {"\xF0\x9F\x98\x80", TL_UTF8_OK, 4, 0x1F600},
        {"\xF4\x8F\xBF\xBF", TL_UTF8_OK, 4, 0x10FFFF},
        /* overlongs: the lead (C0, C1) or the second byte is out of range */
        {"\xC0\x80", TL_UTF8_INVALID, 1, 0},
        {"\xC1\xBF", TL_UTF8_INVALID, 1, 0},
        {"\xE0\x80\x80", TL_UTF8_INVALID, 1, 0},
        {"\xE0\x9F\xBF", TL_UTF8_INVALID, 1, 0},
        {"\xF0\x80\x80\x80", TL_UTF8_INVALID, 1, 0},
        {"\xF0\x8F\xBF\xBF", TL_UTF8_INVALID, 1, 0},
        /* surrogates U+D800, U+DFFF */
        {"\xED\xA0\x80", TL_UTF8_INVALID, 1, 0},
        {"\xED\xBF\xBF", TL_UTF8_INVALID, 1, 0},
        /* above U+10FFFF */
        {"\xF4\x90\x80\x80", TL_UTF8_INVALID, 1, 0},
        {"\xF5\x80\x80\x80", TL_UTF8_INVALID, 1, 0},
        {"\xFF", TL_UTF8_INVALID, 1, 0},
        /* lone continuation bytes */
        {"\x80", TL_UTF8_INVALID, 1, 0},
        {"\xBF\x41", TL_UTF8_INVALID, 1, 0},
        /* truncated: the bytes end inside a valid prefix */
        {"\xC3", TL_UTF8_TRUNCATED, 1, 0},
        {"\xE2\x82", TL_UTF8_TRUNCATED, 2, 0},
        {"\xF0\x9F\x98", TL_UTF8_TRUNCATED, 3, 0},
        /* cut short by a non-continuation byte: the maximal subpart ends before it */
        {"\xE2\x82\x41", TL_UTF8_INVALID, 2, 0},
        {"\xF0\x9F\x98\x41", TL_UTF8_INVALID, 3, 0},
        {"\xF0\x9F\x41", TL_UTF8_INVALID, 2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const edge *e = &cases[i];
        size_t n = strlen(e->bytes), adv = 99;
        uint32_t cp = UINT32_MAX;
        int r = tl_utf8_decode(e->bytes, n, &cp, &adv);
        if (r != e->status || adv != e->adv || (r == TL_UTF8_OK && cp != e->cp))
            fprintf(stderr, "case %zu: status %d adv %zu cp %X\n", i, r, adv, cp);
        CHECK_EQ_INT(r, e->status);
        CHECK_EQ_INT(adv, e->adv);
        if (e->status == TL_UTF8_OK) CHECK_EQ_INT(cp, e->cp);
        CHECK_EQ_INT(tl_utf8_valid(e->bytes, n), utf8_ok(e->bytes, n));
    }
    CHECK(tl_utf8_valid("a\0b", 3)); /* NUL is a character */
}

/* Unicode's Table 3-8 example; the expected text is Python's
 * b"\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64".decode("utf-8", "replace"). */
static void test_utf8_repair_table_3_8(void) {
    static const char in[] = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
    static const char want[] = "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                               "b\xEF\xBF\xBD"
                               "c\xEF\xBF\xBD\xEF\xBF\xBD"
                               "d";
    uint8_t out[3 * sizeof in];
    size_t n = tl_utf8_repair(in, sizeof in - 1, out);
    CHECK_EQ_INT(n, sizeof want - 1);
    CHECK(!memcmp(out, want, sizeof want - 1));
    n = oracle_repair((const uint8_t *)in, sizeof in - 1, out); /* the oracle agrees */
    CHECK(n == sizeof want - 1 && !memcmp(out, want, n));
}

/* The streaming repair over random splits equals the repair of the whole. */
static void test_utf8_repair_stream_splits(void) {
    unsigned long long rng = 0x2545F4914F6CDD1Dull;
    uint8_t s[40], want[130];
    int bad = 0;
    for (int it = 0; it < 30000; it++) {
        size_t n = random_bytes(&rng, s, sizeof s);
        size_t wl = tl_utf8_repair(s, n, want);
        tl_buf out = {0};
        tl_utf8_carry c = {0};
        size_t pos = 0;
        while (pos < n) {
            size_t k = (size_t)(t_rng_next(&rng) % 5); /* pieces of 0..4 bytes */
            if (k > n - pos) k = n - pos;
            bad += tl_utf8_repair_stream(&c, s + pos, k, &out) != 0;
            bad += c.n > 3 || !utf8_ok(out.p ? out.p : "", out.n); /* only whole characters */
            pos += k;
        }
        bad += tl_utf8_repair_end(&c, &out) != 0 || c.n != 0;
        bad += out.n != wl || (wl && memcmp(out.p, want, wl));
        tl_buf_free(&out);
    }
    CHECK_EQ_INT(bad, 0);
}

int main(void) {
    T_RUN(test_utf8_random_vs_oracle);
    T_RUN(test_utf8_exhaustive_short);
    T_RUN(test_utf8_encode_decode_all_scalars);
    T_RUN(test_utf8_edge_cases);
    T_RUN(test_utf8_repair_table_3_8);
    T_RUN(test_utf8_repair_stream_splits);
    return t_summary();
}
