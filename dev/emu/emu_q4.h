/* Host helpers of the dev/emu programs (q4_emu.cpp, gemm_emu.cpp): random 4-bit matrices in the
 * q4 tiled layout (src/cuda/gpu.h) and their exact values, random vectors. Needs the device shim
 * (bf16 conversions) and tests/t_check.h (the random generator) included first. */
#ifndef TL_EMU_Q4_H
#define TL_EMU_Q4_H

/* A random 4-bit matrix in the q4 tiled layout (gpu.h): rows x K, scales ~1/64, biases centred. */
struct q4mat {
    tl_gpu_gemm_w m;
    uint32_t *w, *sb;
};
static inline q4mat q4_random(unsigned long long *rng, int rows, int K) {
    q4mat q;
    size_t nw = (size_t)rows * K / 8, ns = (size_t)rows * (K / 64);
    q.w = (uint32_t *)xmalloc(nw * 4), q.sb = (uint32_t *)xmalloc(ns * 4);
    for (size_t i = 0; i < nw; i++) q.w[i] = (uint32_t)(t_rng_next(rng) >> 32);
    for (size_t i = 0; i < ns; i++) {
        float s = (1.0f + 0.5f * t_randf(rng)) / 64.0f,
              b = -7.5f * s * (1.0f + 0.1f * t_randf(rng));
        q.sb[i] = (uint32_t)f2bf(s) | (uint32_t)f2bf(b) << 16;
    }
    q.m = {q.w, q.sb, 4, rows, K};
    return q;
}
static inline void q4_free(q4mat *q) { free(q->w), free(q->sb); }

/* The nibble, scale and bias of W[r][c]: word (rb, kb, lane 4 (r % 8) + t), nibble j + 4h for
 * column 32 kb + 2t + 8j + h (gpu.h Q4_COL). */
static inline void q4_parts(const q4mat &q, int r, int c, int *nib, float *s, float *b) {
    int K = q.m.cols, rows = q.m.rows, cc = c & 31, t = (cc & 7) >> 1, n = (cc >> 3) + 4 * (cc & 1);
    uint32_t word = q.w[((size_t)(r / 8) * (K / 32) + c / 32) * 32 + (r % 8) * 4 + t];
    uint32_t sbw = q.sb[(size_t)(c / 64) * rows + r];
    *nib = (int)((word >> (4 * n)) & 15u);
    *s = bf2f((uint16_t)(sbw & 0xffff)), *b = bf2f((uint16_t)(sbw >> 16));
}
/* W[r][c] exactly: scale times the nibble plus the bias */
static inline double q4_at(const q4mat &q, int r, int c) {
    int nib;
    float s, b;
    q4_parts(q, r, c, &nib, &s, &b);
    return (double)s * nib + (double)b;
}
/* W[r][c] as the prefill GEMMs use it: rounded once to bf16 */
static inline float q4_at_bf16(const q4mat &q, int r, int c) {
    int nib;
    float s, b;
    q4_parts(q, r, c, &nib, &s, &b);
    return bf2f(f2bf(fmaf((float)nib, s, b)));
}

static inline float *rand_vec(unsigned long long *rng, size_t n, float scale) {
    float *v = (float *)xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) v[i] = scale * t_randf(rng);
    return v;
}

#endif
