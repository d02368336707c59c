/* tl_buf (src/common/buf.c): contents after many appends of random sizes, printf appends that
 * outgrow the buffer, embedded NUL bytes, a large append, and the sticky out-of-memory error.
 * Every expected byte string is built independently (memcpy into a preallocated array, libc's
 * snprintf), never read back from another tl_buf. */
#include <stdint.h>
#include "t_check.h"
#include "common/buf.h"
#include "tulip.h"

/* The buffer holds exactly want[0..n) followed by a NUL, within its capacity. */
static int holds(const tl_buf *b, const char *want, size_t n) {
    return b->err == 0 && b->n == n && b->p && b->cap > n && b->p[n] == 0 &&
           (n == 0 || !memcmp(b->p, want, n));
}

static void test_buf_empty_and_take(void) {
    tl_buf b = {0};
    CHECK(b.p == NULL);
    size_t len = 99;
    char *s = tl_buf_take(&b, &len); /* never written: an empty string, not NULL */
    CHECK(s && s[0] == 0);
    CHECK_EQ_INT(len, 0);
    free(s);
    CHECK_EQ_INT(tl_buf_append(&b, NULL, 0), 0); /* a 0-byte append still allocates */
    CHECK(holds(&b, "", 0));
    CHECK_EQ_INT(tl_buf_puts(&b, "hello"), 0);
    s = tl_buf_take(&b, &len);
    CHECK_STR(s, "hello");
    CHECK_EQ_INT(len, 5);
    CHECK(b.p == NULL && b.n == 0 && b.cap == 0); /* take resets b */
    free(s);
    tl_buf_init(&b);
    tl_buf_free(&b); /* freeing an empty buffer is fine */
}

/* 20000 appends of 0..300 random bytes (putc for the 1-byte ones) against a plain array. */
static void test_buf_many_appends(void) {
    unsigned long long rng = 0x9E3779B97F4A7C15ull;
    size_t total = 20000 * 300;
    char *want = malloc(total);
    char piece[300];
    size_t n = 0;
    tl_buf b = {0};
    int ok = 1;
    for (int i = 0; i < 20000; i++) {
        size_t k = (size_t)(t_rng_next(&rng) % 301);
        for (size_t j = 0; j < k; j++) piece[j] = (char)(t_rng_next(&rng) >> 56);
        int st = k == 1 ? tl_buf_putc(&b, piece[0]) : tl_buf_append(&b, piece, k);
        memcpy(want + n, piece, k);
        n += k;
        /* the new piece and the terminator every time, everything now and then */
        ok &= st == 0 && b.n == n && b.cap > n && b.p[n] == 0 && !memcmp(b.p + n - k, piece, k);
        if (i % 997 == 0) ok &= holds(&b, want, n);
        if (!ok) break;
    }
    CHECK(ok);
    CHECK(holds(&b, want, n));
    tl_buf_truncate(&b, n / 3);
    CHECK(holds(&b, want, n / 3));
    tl_buf_truncate(&b, n); /* longer than held: no-op */
    CHECK(holds(&b, want, n / 3));
    tl_buf_free(&b);
    free(want);
}

/* printf appends whose output is longer than the room left, including the first one. */
static void test_buf_printf_grows(void) {
    char big[5000], want[200000], one[6000];
    for (size_t i = 0; i < sizeof big - 1; i++) big[i] = (char)('a' + i % 26);
    big[sizeof big - 1] = 0;
    tl_buf b = {0};
    size_t n = 0;
    int ok = 1;
    for (int i = 0; i < 60; i++) {
        int w = (i * 137) % 4999; /* 0 .. 4998 characters of big */
        int k = snprintf(one, sizeof one, "[%d|%.*s|%g]", i, w, big, i / 7.0);
        CHECK_EQ_INT(tl_buf_printf(&b, "[%d|%.*s|%g]", i, w, big, i / 7.0), 0);
        memcpy(want + n, one, (size_t)k);
        n += (size_t)k;
        ok &= holds(&b, want, n);
    }
    CHECK(ok);
    tl_buf_free(&b);
    /* every output length from 0 to 600 after 0..2 bytes already there: some land exactly on
     * the capacity (output + NUL == cap) */
    ok = 1;
    for (int pre = 0; pre < 3; pre++)
        for (int w = 0; w <= 600; w++) {
            tl_buf_append(&b, "pq", (size_t)pre);
            ok &= tl_buf_printf(&b, "%.*s", w, big) == 0;
            memcpy(want, "pq", (size_t)pre);
            memcpy(want + pre, big, (size_t)w);
            ok &= holds(&b, want, (size_t)(pre + w));
            tl_buf_free(&b);
        }
    CHECK(ok);
    /* one printf far larger than the initial capacity, into a buffer with something in it */
    CHECK_EQ_INT(tl_buf_puts(&b, "x"), 0);
    CHECK_EQ_INT(tl_buf_printf(&b, "%s%s", big, big), 0);
    snprintf(want, sizeof want, "x%s%s", big, big);
    CHECK(holds(&b, want, 1 + 2 * strlen(big)));
    tl_buf_free(&b);
}

static void test_buf_embedded_nul(void) {
    tl_buf b = {0};
    static const char bytes[] = {'a', 0, 'b', 0, 0, 'c'};
    CHECK_EQ_INT(tl_buf_append(&b, bytes, sizeof bytes), 0);
    CHECK_EQ_INT(tl_buf_putc(&b, 0), 0);
    CHECK_EQ_INT(tl_buf_printf(&b, "%c%s", 0, "z"), 0); /* %c of 0 writes one NUL byte */
    static const char want[] = {'a', 0, 'b', 0, 0, 'c', 0, 0, 'z'};
    CHECK(holds(&b, want, sizeof want));
    size_t len = 0;
    char *s = tl_buf_take(&b, &len);
    CHECK_EQ_INT(len, sizeof want);
    CHECK(s && !memcmp(s, want, sizeof want) && s[len] == 0);
    free(s);
}

/* 48 MiB in one append, then more on top of it. */
static void test_buf_large_append(void) {
    size_t n = (size_t)48 << 20;
    char *src = malloc(n);
    for (size_t i = 0; i < n; i++) src[i] = (char)(i * 2654435761u >> 24);
    tl_buf b = {0};
    CHECK_EQ_INT(tl_buf_puts(&b, "head"), 0);
    CHECK_EQ_INT(tl_buf_append(&b, src, n), 0);
    CHECK_EQ_INT(tl_buf_puts(&b, "tail"), 0);
    CHECK_EQ_INT(b.n, n + 8);
    CHECK(b.cap > b.n && b.p[b.n] == 0);
    CHECK(!memcmp(b.p, "head", 4) && !memcmp(b.p + 4, src, n) && !memcmp(b.p + 4 + n, "tail", 4));
    tl_buf_free(&b);
    free(src);
}

/* A size no allocator can give: TL_ERR_NOMEM, the contents kept, and every later write refused
 * until the buffer is freed; take gives NULL. */
static void test_buf_nomem_is_sticky(void) {
    tl_buf b = {0};
    CHECK_EQ_INT(tl_buf_puts(&b, "kept"), 0);
    static const char one = 'x';
    volatile size_t huge = SIZE_MAX - 8; /* not a constant: the compiler would refuse the call */
    CHECK_EQ_INT(tl_buf_append(&b, &one, huge), TL_ERR_NOMEM);
    CHECK_EQ_INT(b.err, TL_ERR_NOMEM);
    CHECK(b.n == 4 && !memcmp(b.p, "kept", 5));
    CHECK_EQ_INT(tl_buf_putc(&b, 'y'), TL_ERR_NOMEM);
    CHECK_EQ_INT(tl_buf_puts(&b, "more"), TL_ERR_NOMEM);
    CHECK_EQ_INT(tl_buf_printf(&b, "%d", 42), TL_ERR_NOMEM);
    CHECK_EQ_INT(tl_buf_reserve(&b, 1), TL_ERR_NOMEM);
    CHECK_EQ_INT(b.n, 4);
    size_t len = 7;
    CHECK(tl_buf_take(&b, &len) == NULL);
    CHECK_EQ_INT(len, 0);
    CHECK(b.p == NULL && b.err == 0); /* take reset it: usable again */
    CHECK_EQ_INT(tl_buf_puts(&b, "again"), 0);
    CHECK(holds(&b, "again", 5));
    CHECK_EQ_INT(tl_buf_reserve(&b, SIZE_MAX / 2), TL_ERR_NOMEM);
    tl_buf_free(&b);
}

int main(void) {
    T_RUN(test_buf_empty_and_take);
    T_RUN(test_buf_many_appends);
    T_RUN(test_buf_printf_grows);
    T_RUN(test_buf_embedded_nul);
    T_RUN(test_buf_large_append);
    T_RUN(test_buf_nomem_is_sticky);
    return t_summary();
}
