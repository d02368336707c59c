/* tl_buf (see buf.h): growth by doubling, a NUL kept after the bytes, and a sticky
 * TL_ERR_NOMEM instead of exiting when memory runs out. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/buf.h"
#include "common/status.h"

void tl_buf_init(tl_buf *b) { memset(b, 0, sizeof *b); }

int tl_buf_reserve(tl_buf *b, size_t extra) {
    if (b->err) return b->err;
    if (b->n >= SIZE_MAX / 2 || extra >= SIZE_MAX / 2 - b->n) return b->err = TL_ERR_NOMEM;
    size_t need = b->n + extra + 1;
    if (need <= b->cap) return TL_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return b->err = TL_ERR_NOMEM;
    if (!b->p) p[0] = 0;
    b->p = p;
    b->cap = cap;
    return TL_OK;
}

int tl_buf_puts(tl_buf *b, const char *s) { return tl_buf_append(b, s, strlen(s)); }

int tl_buf_vprintf(tl_buf *b, const char *fmt, va_list ap) {
    if (b->err) return b->err;
    va_list ap2;
    va_copy(ap2, ap);
    char small[1];
    int k = vsnprintf(b->cap > b->n ? b->p + b->n : small,
                      b->cap > b->n ? b->cap - b->n : sizeof small, fmt, ap2);
    va_end(ap2);
    if (k < 0) return TL_ERR_INVALID; /* a bad format; the buffer is unchanged */
    if ((size_t)k >= (b->cap > b->n ? b->cap - b->n : 0)) {
        int st = tl_buf_reserve(b, (size_t)k);
        if (st) {
            if (b->p) b->p[b->n] = 0;
            return st;
        }
        vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    }
    b->n += (size_t)k;
    return TL_OK;
}

int tl_buf_printf(tl_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int st = tl_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return st;
}

void tl_buf_truncate(tl_buf *b, size_t n) {
    if (!b->p || n > b->n) return;
    b->n = n;
    b->p[n] = 0;
}

char *tl_buf_take(tl_buf *b, size_t *len) {
    if (!b->err && !b->p) tl_buf_reserve(b, 0);
    char *p = b->err ? NULL : b->p;
    if (len) *len = p ? b->n : 0;
    if (!p) free(b->p);
    tl_buf_init(b);
    return p;
}

void tl_buf_free(tl_buf *b) {
    free(b->p);
    tl_buf_init(b);
}
