/* Small helpers shared by every subsystem: allocation that dies on OOM (bookkeeping only,
 * never request-sized buffers), always-on asserts, timers, file reading. */
#ifndef TL_UTIL_H
#define TL_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "common/buf.h"

#define TL_ASSERT(c)                                                                               \
    do {                                                                                           \
        if (!(c)) tl_assert_fail(__FILE__, __LINE__, #c);                                          \
    } while (0)
#ifdef TL_DEBUG
#define TL_DASSERT(c) TL_ASSERT(c)
#else
#define TL_DASSERT(c) ((void)0)
#endif
#define TL_MIN(a, b)      ((a) < (b) ? (a) : (b))
#define TL_MAX(a, b)      ((a) > (b) ? (a) : (b))
#define TL_CEIL_DIV(a, b) (((a) + (b)-1) / (b))

void tl_assert_fail(const char *file, int line, const char *expr) __attribute__((noreturn));
void tl_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* tl_buf appends for writers whose contract has no error path (the output parser, the server's
 * per-request text): like xrealloc, they end the process when memory runs out. xbuf_check does
 * the same for a buffer another writer filled. */
void xbuf_append(tl_buf *b, const void *s, size_t n);
void xbuf_puts(tl_buf *b, const char *s);
void xbuf_check(const tl_buf *b);

/* Monotonic clock in seconds. */
double tl_time_s(void);

/* Reads a whole file into a NUL-terminated malloc'd buffer. Returns 0 or a negative tl_status. */
int tl_read_file(const char *path, char **out, size_t *len, char *err, size_t errlen);

/* dir + "/" + name in a new xmalloc'd string. */
char *tl_path_join(const char *dir, const char *name);

/* Number of online CPUs (at least 1). */
int tl_n_cpus(void);

/* bf16 / f16 <-> f32 (round to nearest even for f32 -> bf16). bf16 -> f32 is exact and inline
 * (the CPU oracle widens whole weight rows with it). */
static inline float tl_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t tl_f32_to_bf16(float f);
float tl_f16_to_f32(uint16_t h);

#endif
