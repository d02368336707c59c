/* UTF-8 validation, encoding and lossy repair (see utf8.h; the decoder itself is inline
 * there). */
#include <string.h>
#include "common/status.h"
#include "common/utf8.h"

static const uint8_t FFFD[3] = {0xEF, 0xBF, 0xBD};

size_t tl_utf8_valid_len(const void *sv, size_t n) {
    const uint8_t *s = sv;
    size_t i = 0, adv;
    while (i < n) {
        if (s[i] < 0x80) { /* ASCII: 8 bytes at a time while none has its high bit set */
            for (uint64_t w; i + 8 <= n; i += 8) {
                memcpy(&w, s + i, 8);
                if (w & 0x8080808080808080ull) break;
            }
            while (i < n && s[i] < 0x80) i++;
            continue;
        }
        if (tl_utf8_decode(s + i, n - i, NULL, &adv) != TL_UTF8_OK) return i;
        i += adv;
    }
    return n;
}

int tl_utf8_valid(const void *s, size_t n) { return tl_utf8_valid_len(s, n) == n; }

size_t tl_utf8_encode(uint32_t cp, uint8_t o[4]) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tl_utf8_repair(const void *sv, size_t n, uint8_t *dst) {
    const uint8_t *s = sv;
    size_t i = 0, o = 0, adv;
    while (i < n) {
        if (tl_utf8_decode(s + i, n - i, NULL, &adv) == TL_UTF8_OK) {
            memcpy(dst + o, s + i, adv);
            o += adv;
        } else {
            memcpy(dst + o, FFFD, 3);
            o += 3;
        }
        i += adv;
    }
    return o;
}

/* Finishes the character the carry began, using the first bytes of s. Returns how many bytes
 * of s it used (the carry is then empty), or n when the character is still unfinished (then
 * all of s joined the carry). A carry is a valid prefix, so the maximal subpart that fails
 * ends at or after its last byte: the bytes of s it does not use start afresh. */
static size_t carry_finish(tl_utf8_carry *c, const uint8_t *s, size_t n, tl_buf *out) {
    uint8_t tmp[8];
    size_t k = n < 4 ? n : 4, m = c->n + k, adv;
    memcpy(tmp, c->b, c->n);
    memcpy(tmp + c->n, s, k);
    int r = tl_utf8_decode(tmp, m, NULL, &adv);
    if (r == TL_UTF8_TRUNCATED) { /* only when s ran out: 4 more bytes decide any character */
        memcpy(c->b, tmp, m);
        c->n = m;
        return n;
    }
    tl_buf_append(out, r == TL_UTF8_OK ? tmp : FFFD, r == TL_UTF8_OK ? adv : 3);
    size_t used = adv - c->n;
    c->n = 0;
    return used;
}

int tl_utf8_repair_stream(tl_utf8_carry *c, const void *sv, size_t n, tl_buf *out) {
    const uint8_t *s = sv;
    if (!n) return out->err;
    size_t i = c->n ? carry_finish(c, s, n, out) : 0;
    size_t run = i, adv; /* s[run .. i) is valid and not yet appended */
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int r = tl_utf8_decode(s + i, n - i, NULL, &adv);
        if (r == TL_UTF8_OK) {
            i += adv;
            continue;
        }
        tl_buf_append(out, s + run, i - run);
        if (r == TL_UTF8_TRUNCATED) {
            memcpy(c->b, s + i, adv);
            c->n = adv;
            return out->err;
        }
        tl_buf_append(out, FFFD, 3);
        run = i += adv;
    }
    tl_buf_append(out, s + run, n - run);
    return out->err;
}

int tl_utf8_repair_end(tl_utf8_carry *c, tl_buf *out) {
    if (c->n) tl_buf_append(out, FFFD, 3);
    c->n = 0;
    return out->err;
}
