/* Server-sent events as OpenAI streams them, into a growable byte buffer that the HTTP reader
 * drains: "data: {json}\n\n" per chunk, "data: [DONE]\n\n" at the end, ": keepalive\n\n"
 * comments while nothing happens, and after the headers are out an error travels as one
 * "data: {"error":{...}}\n\n" frame followed by the end of the stream without [DONE] (the
 * official Python client raises APIError on it; tests/py/test_server.py pins that). */
#ifndef TL_SERVER_SSE_H
#define TL_SERVER_SSE_H

#include <stddef.h>
#include "common/buf.h"

typedef struct tl_sbuf {
    tl_buf b;
    size_t off; /* bytes already consumed by the reader */
} tl_sbuf;

void tl_sbuf_put(tl_sbuf *b, const char *s, size_t n);
void tl_sbuf_free(tl_sbuf *b);
/* Copies up to max unread bytes to out; returns the count. Resets the buffer when drained. */
size_t tl_sbuf_read(tl_sbuf *b, char *out, size_t max);
static inline size_t tl_sbuf_unread(const tl_sbuf *b) { return b->b.n - b->off; }

/* "data: <json>\n\n"; json is a compact one-line JSON text (no raw newlines). */
void tl_sse_data(tl_sbuf *b, const char *json);
void tl_sse_done(tl_sbuf *b);
void tl_sse_comment(tl_sbuf *b, const char *text);

#endif
