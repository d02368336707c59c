/* tl_buf: the one growable byte buffer (tokenizer scanner and arenas, chat template output,
 * parser text, SSE frames, metrics text, file reads, request bodies).
 *
 * Contract: the bytes are p[0 .. n); after any successful append or reserve p is non-NULL and
 * p[n] == 0, so text can be used as a C string (it may hold NULs of its own). Start from
 * `tl_buf b = {0}` (or tl_buf_init) and release with tl_buf_free or tl_buf_take.
 *
 * Errors: allocation failure never exits. The call returns TL_ERR_NOMEM and the buffer keeps it
 * in `err` (sticky): every later append does nothing and returns the same status, so a writer
 * with many appends may check once at the end (tl_buf_take returns NULL then). */
#ifndef TL_BUF_H
#define TL_BUF_H

#include <stdarg.h>
#include <stddef.h>
#include <string.h>

typedef struct tl_buf {
    char *p;    /* NULL until the first append or reserve */
    size_t n;   /* bytes held, without the terminating NUL */
    size_t cap; /* bytes allocated at p */
    int err;    /* 0, or the first failure (TL_ERR_NOMEM); sticky */
} tl_buf;

void tl_buf_init(tl_buf *b);
/* Makes room for `extra` more bytes plus the NUL (capacity grows by doubling). 0 or err. */
int tl_buf_reserve(tl_buf *b, size_t extra);

/* Appends n bytes of s (s may be NULL when n == 0; a 0-byte append still allocates). Inline:
 * the tokenizer's loader appends a million short strings. */
static inline int tl_buf_append(tl_buf *b, const void *s, size_t n) {
    if (n >= b->cap - b->n || b->err) { /* also before the first allocation (cap 0) */
        int st = tl_buf_reserve(b, n);
        if (st) return st;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static inline int tl_buf_putc(tl_buf *b, char c) {
    if (b->cap - b->n < 2 || b->err) {
        int st = tl_buf_reserve(b, 1);
        if (st) return st;
    }
    b->p[b->n++] = c;
    b->p[b->n] = 0;
    return 0;
}

int tl_buf_puts(tl_buf *b, const char *s);
int tl_buf_printf(tl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tl_buf_vprintf(tl_buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Shortens to n bytes (n <= b->n), keeping the memory; no-op on a never-allocated buffer. */
void tl_buf_truncate(tl_buf *b, size_t n);
/* Hands the bytes to the caller (NUL-terminated, malloc'd; *len = n when len is not NULL) and
 * resets b. A never-written buffer gives an empty string; a failed one gives NULL (and frees). */
char *tl_buf_take(tl_buf *b, size_t *len);
void tl_buf_free(tl_buf *b);

#endif
