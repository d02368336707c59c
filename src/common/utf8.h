/* The one UTF-8 validator and decoder of the library (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF), with the lossy repair every text path uses: each "maximal subpart" of
 * an invalid sequence becomes one U+FFFD (Unicode ch. 3 / WHATWG), which is what Python's
 * bytes.decode(errors="replace") and Rust's String::from_utf8_lossy (HF's decode) both do.
 * tests/t_utf8.h is an independent oracle for the tests; nothing in src/ decodes UTF-8 else. */
#ifndef TL_UTF8_H
#define TL_UTF8_H

#include <stddef.h>
#include <stdint.h>
#include "common/buf.h"

enum { TL_UTF8_INVALID = 0, TL_UTF8_OK = 1, TL_UTF8_TRUNCATED = -1 };

/* Looks at the character starting at s[0] (n >= 1 bytes available). Returns
 *   TL_UTF8_OK: *adv = its length (1..4), *cp = its code point (cp may be NULL);
 *   TL_UTF8_INVALID: *adv = the length of the maximal invalid subpart (>= 1);
 *   TL_UTF8_TRUNCATED: the bytes end inside a so-far valid sequence (*adv = n <= 3).
 * The answer depends on at most the first 4 bytes. The byte ranges are Table 3-7 of the Unicode
 * standard ("well-formed UTF-8 byte sequences"): the second byte's range depends on the lead
 * byte (E0: A0..BF, ED: 80..9F, F0: 90..BF, F4: 80..8F), which rules out overlongs, surrogates
 * and code points above U+10FFFF. Inline: the tokenizer decodes every character of its input. */
static inline int tl_utf8_decode(const void *sv, size_t n, uint32_t *cp, size_t *adv) {
    const uint8_t *s = sv;
    uint8_t c = s[0];
    if (c < 0x80) {
        if (cp) *cp = c;
        *adv = 1;
        return TL_UTF8_OK;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1, v = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2, v = c & 0x0Fu;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3, v = c & 0x07u;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *adv = 1;
        return TL_UTF8_INVALID;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) {
            *adv = n;
            return TL_UTF8_TRUNCATED;
        }
        uint8_t b = s[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) {
            *adv = i;
            return TL_UTF8_INVALID;
        }
        v = v << 6 | (b & 0x3Fu);
    }
    if (cp) *cp = v;
    *adv = need + 1;
    return TL_UTF8_OK;
}

/* Length of the leading run of s that is valid UTF-8 (whole characters only). */
size_t tl_utf8_valid_len(const void *s, size_t n);
/* 1 if all n bytes are valid UTF-8 (NUL bytes included), else 0. */
int tl_utf8_valid(const void *s, size_t n);

/* Writes code point cp (< 0x110000) to out and returns its length (1..4). */
size_t tl_utf8_encode(uint32_t cp, uint8_t out[4]);

/* Writes the lossy repair of s into dst (capacity >= 3 * n) and returns its length. */
size_t tl_utf8_repair(const void *s, size_t n, uint8_t *dst);

/* Streaming repair: the same characters as tl_utf8_repair of all pieces concatenated, emitted
 * as soon as they are decided. A piece may end inside a character: those bytes (at most 3) wait
 * in the carry for the next piece; tl_utf8_repair_end emits them as one U+FFFD. Start from
 * `tl_utf8_carry c = {0}`. Returns 0 or out's error. */
typedef struct tl_utf8_carry {
    uint8_t b[4];
    size_t n;
} tl_utf8_carry;

int tl_utf8_repair_stream(tl_utf8_carry *c, const void *s, size_t n, tl_buf *out);
int tl_utf8_repair_end(tl_utf8_carry *c, tl_buf *out);

#endif
