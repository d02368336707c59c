/* Helpers: dying allocators for small bookkeeping (and dying tl_buf appends), timers, whole-file
 * reads, float formats. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/status.h"
#include "common/util.h"

void tl_assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    abort();
}

void tl_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tulip: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) tl_die("out of memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) tl_die("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) tl_die("out of memory reallocating %zu bytes", n);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

void xbuf_check(const tl_buf *b) {
    if (b->err) tl_die("out of memory growing a %zu-byte buffer", b->cap);
}

void xbuf_append(tl_buf *b, const void *s, size_t n) {
    tl_buf_append(b, s, n);
    xbuf_check(b);
}

void xbuf_puts(tl_buf *b, const char *s) { xbuf_append(b, s, strlen(s)); }

double tl_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tl_read_file(const char *path, char **out, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return tl_errf(err, errlen, TL_ERR_IO, "%s: %s", path, strerror(errno));
    tl_buf b = {0};
    for (;;) { /* read into the free space; double the buffer when it is full */
        if (b.n + 1 >= b.cap && tl_buf_reserve(&b, b.cap ? b.cap : 1 << 16)) break;
        size_t r = fread(b.p + b.n, 1, b.cap - b.n - 1, f);
        b.n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (b.err || bad) {
        int nomem = b.err != 0;
        tl_buf_free(&b);
        return nomem ? tl_errf(err, errlen, TL_ERR_NOMEM, "%s: out of memory", path)
                     : tl_errf(err, errlen, TL_ERR_IO, "%s: read error", path);
    }
    b.p[b.n] = 0;
    *out = tl_buf_take(&b, len);
    return TL_OK;
}

char *tl_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = xmalloc(a + b + 2);
    memcpy(s, dir, a);
    s[a] = '/';
    memcpy(s + a + 1, name, b + 1);
    return s;
}

int tl_n_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

uint16_t tl_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float tl_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) {
            u = s;
        } else { /* subnormal: normalise */
            e = 1;
            while (!(m & 0x400)) {
                m <<= 1;
                e--;
            }
            m &= 0x3ff;
            u = s | ((e + 112) << 23) | (m << 13);
        }
    } else if (e == 31) {
        u = s | 0x7f800000 | (m << 13);
    } else {
        u = s | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
