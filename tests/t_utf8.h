/* Strict UTF-8 validity (RFC 3629: no overlongs, surrogates or code points above U+10FFFF),
 * written independently of the tokenizer's and parser's own checks so tests can use it as an
 * oracle. Shared by tests/cpu/test_parse.c and tests/fuzz/fuzz_parse.c. */
#ifndef T_UTF8_H
#define T_UTF8_H

#include <stddef.h>

static int utf8_ok(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int k = c < 0x80                 ? 1
                : c >= 0xc2 && c <= 0xdf ? 2
                : c >= 0xe0 && c <= 0xef ? 3
                : c >= 0xf0 && c <= 0xf4 ? 4
                                         : 0;
        if (!k || i + (size_t)k > n) return 0;
        for (int j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xc0) != 0x80) return 0;
        if (k == 3 && c == 0xe0 && (unsigned char)s[i + 1] < 0xa0) return 0;
        if (k == 3 && c == 0xed && (unsigned char)s[i + 1] > 0x9f) return 0;
        if (k == 4 && c == 0xf0 && (unsigned char)s[i + 1] < 0x90) return 0;
        if (k == 4 && c == 0xf4 && (unsigned char)s[i + 1] > 0x8f) return 0;
        i += (size_t)k;
    }
    return 1;
}

#endif
