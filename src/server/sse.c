/* SSE framing (see sse.h). JSON from tl_oai_dump never contains a raw newline (strings are
 * escaped), so one data line per event is always correct. */
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "server/sse.h"

/* Frames are small and the stream has no error path: like xrealloc, running out of memory
 * ends the process (xbuf_append). */
void tl_sbuf_put(tl_sbuf *b, const char *s, size_t n) { xbuf_append(&b->b, s, n); }

void tl_sbuf_free(tl_sbuf *b) {
    tl_buf_free(&b->b);
    b->off = 0;
}

size_t tl_sbuf_read(tl_sbuf *b, char *out, size_t max) {
    size_t k = TL_MIN(max, b->b.n - b->off);
    if (k == 0) return 0;
    memcpy(out, b->b.p + b->off, k);
    b->off += k;
    if (b->off == b->b.n) {
        tl_buf_truncate(&b->b, 0);
        b->off = 0;
    }
    return k;
}

void tl_sse_data(tl_sbuf *b, const char *json) {
    tl_sbuf_put(b, "data: ", 6);
    tl_sbuf_put(b, json, strlen(json));
    tl_sbuf_put(b, "\n\n", 2);
}

void tl_sse_done(tl_sbuf *b) { tl_sbuf_put(b, "data: [DONE]\n\n", 14); }

void tl_sse_comment(tl_sbuf *b, const char *text) {
    tl_sbuf_put(b, ": ", 2);
    tl_sbuf_put(b, text, strlen(text));
    tl_sbuf_put(b, "\n\n", 2);
}
