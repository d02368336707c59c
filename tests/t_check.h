/* Minimal test harness: each test binary defines static void test_xxx(void) functions and a main
 * that calls T_RUN(test_xxx) for each, then returns t_summary(). Output: one "PASS name (seconds)"
 * or "FAIL name" line per test (tests/run.sh counts them) and the failing checks on stderr. */
#ifndef T_CHECK_H
#define T_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int t_fail_checks, t_n_pass, t_n_fail;

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                  \
            t_fail_checks++;                                                                       \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long _a = (long long)(a), _b = (long long)(b);                                        \
        if (_a != _b) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s = %lld, %s = %lld\n", __FILE__,        \
                    __LINE__, #a, _a, #b, _b);                                                     \
            t_fail_checks++;                                                                       \
        }                                                                                          \
    } while (0)

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *_a = (a), *_b = (b);                                                           \
        if (!_a || !_b || strcmp(_a, _b) != 0) {                                                   \
            fprintf(stderr, "%s:%d: CHECK_STR failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__,     \
                    _a ? _a : "(null)", _b ? _b : "(null)");                                       \
            t_fail_checks++;                                                                       \
        }                                                                                          \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, atol, rtol)                                                              \
    do {                                                                                           \
        double _a = (a), _b = (b);                                                                 \
        if (!(fabs(_a - _b) <= (atol) + (rtol)*fabs(_b))) {                                        \
            fprintf(stderr, "%s:%d: CHECK_CLOSE failed: %s = %.9g, %s = %.9g\n", __FILE__,         \
                    __LINE__, #a, _a, #b, _b);                                                     \
            t_fail_checks++;                                                                       \
        }                                                                                          \
    } while (0)

#define T_RUN(fn) t_run(#fn, fn)

/* T_ONLY=substring in the environment runs only the tests whose names contain it (debugging,
 * compute-sanitizer on one kernel); the summary then counts only those. */
static inline void t_run(const char *name, void (*fn)(void)) {
    const char *only = getenv("T_ONLY");
    if (only && *only && !strstr(name, only)) return;
    int before = t_fail_checks;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fn();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (t_fail_checks == before) {
        printf("PASS %s (%.2f s)\n", name, s);
        t_n_pass++;
    } else {
        printf("FAIL %s (%.2f s)\n", name, s);
        t_n_fail++;
    }
    fflush(stdout);
}

static inline int t_summary(void) {
    printf("# %d passed, %d failed\n", t_n_pass, t_n_fail);
    return t_n_fail ? 1 : 0;
}

/* Largest |a-b| and normalised mean squared error sum((a-b)^2)/sum(b^2). */
static inline double t_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d) m = d;
    }
    return m;
}

static inline double t_nmse(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? num / den : num;
}

/* Deterministic xorshift random numbers for test inputs (never zeros). */
static inline unsigned long long t_rng_next(unsigned long long *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static inline float t_randf(unsigned long long *s) { /* uniform in [-1, 1) */
    return (float)((t_rng_next(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

#endif
