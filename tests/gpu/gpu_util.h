/* Helpers shared by the GPU tests: random host matrices in the checkpoint formats the loader
 * hands the backend (BF16, MLX affine 4-bit g64), device buffers, comparisons. */
#ifndef TL_TEST_GPU_UTIL_H
#define TL_TEST_GPU_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "t_check.h"
#include "common/util.h"
#include "cpu/cpu.h"
#include "cuda/gpu.h"

/* A host matrix plus the buffers its views point into. */
typedef struct hmat {
    tl_mat m;
    void *w, *s, *b;
} hmat;

/* bits 0: BF16 values uniform * amp; bits 4 (8): MLX affine g64, random nibbles (bytes), bf16
 * scale in [0.5, 1.5) * amp / Q and bias -Q * scale * u, u in [0.8, 1.2), Q = 7.5 (127.5) (values
 * not centred, so the bias path is exercised). */
static inline void hmat_random(hmat *h, int rows, int cols, int bits, float amp,
                               unsigned long long *rs) {
    memset(h, 0, sizeof *h);
    h->m.rows = rows, h->m.cols = cols, h->m.bits = bits;
    if (bits == 0) {
        uint16_t *w = (uint16_t *)xmalloc((size_t)rows * cols * 2);
        for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = tl_f32_to_bf16(amp * t_randf(rs));
        h->w = w;
        h->m.w = w, h->m.wtype = TL_DT_BF16;
        return;
    }
    size_t nw = (size_t)rows * cols / (32 / bits), ng = (size_t)rows * cols / 64;
    float Q = bits == 8 ? 127.5f : 7.5f;
    uint32_t *w = (uint32_t *)xmalloc(nw * 4);
    uint16_t *s = (uint16_t *)xmalloc(ng * 2), *b = (uint16_t *)xmalloc(ng * 2);
    for (size_t i = 0; i < nw; i++) w[i] = (uint32_t)(t_rng_next(rs) >> 17);
    for (size_t i = 0; i < ng; i++) {
        float sc = amp / Q * (1.0f + 0.5f * t_randf(rs));
        s[i] = tl_f32_to_bf16(sc);
        b[i] = tl_f32_to_bf16(-Q * sc * (1.0f + 0.2f * t_randf(rs)));
    }
    h->w = w, h->s = s, h->b = b;
    h->m.w = w, h->m.scales = s, h->m.biases = b;
    h->m.wtype = TL_DT_U32, h->m.stype = TL_DT_BF16, h->m.group = 64;
}
static inline void hmat_free(hmat *h) {
    free(h->w), free(h->s), free(h->b);
    memset(h, 0, sizeof *h);
}

static inline float *rand_vec(size_t n, float amp, unsigned long long *rs) {
    float *v = (float *)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = amp * t_randf(rs);
    return v;
}
static inline void *dev_from(const void *h, size_t n) {
    void *d = tl_gpu_malloc(n);
    if (d) tl_gpu_upload(d, h, n);
    return d;
}
static inline float *host_from(const void *d, size_t n_floats) {
    float *h = (float *)xmalloc(n_floats * sizeof(float));
    tl_gpu_download(h, d, n_floats * sizeof(float));
    return h;
}

/* NMSE check with a printed line: "# name: nmse=... max_abs=...". */
static inline void check_nmse(const char *what, const float *got, const float *ref, size_t n,
                              double tol) {
    double e = t_nmse(got, ref, n), ma = t_max_abs_diff(got, ref, n);
    printf("# %-28s nmse=%.3e max_abs=%.3e (tol %.0e)\n", what, e, ma, tol);
    CHECK(e <= tol);
    for (size_t i = 0; i < n; i++)
        if (got[i] != got[i]) {
            CHECK(!"NaN in GPU output");
            break;
        }
}

#endif
