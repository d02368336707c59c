/* CPU reference: elementary ops and weight access. fp32 values, double accumulators in every
 * reduction, no fast-math: this file defines what "correct" means for the CUDA kernels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "common/pool.h"
#include "common/util.h"
#include "cpu/cpu.h"

float cpu_silu(float x) { return x / (1.0f + expf(-x)); }
float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
float cpu_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch threshold 20 */

void cpu_set_threads(int n) { tl_pool_set_threads(n); }

/* note: affine quantization (MLX): row r holds cols*bits/32 u32 words, value c sits in word
 * c*bits/32 at bit (c % (32/bits))*bits; scale and bias per group of `group` columns. */
void cpu_mat_row(float *dst, const tl_mat *W, int r) {
    if (W->bits == 0) {
        size_t base = (size_t)r * W->cols;
        if (W->wtype == TL_DT_F32) {
            memcpy(dst, (const float *)W->w + base, sizeof(float) * W->cols);
        } else if (W->wtype == TL_DT_BF16) { /* no call per weight */
            const uint16_t *h = (const uint16_t *)W->w + base;
            for (int c = 0; c < W->cols; c++) dst[c] = tl_bf16_to_f32(h[c]);
        } else {
            for (int c = 0; c < W->cols; c++) dst[c] = tl_load_elem(W->w, W->wtype, base + c);
        }
        return;
    }
    int per = 32 / W->bits, words = W->cols / per, ng = W->cols / W->group;
    uint32_t mask = (1u << W->bits) - 1;
    const uint32_t *wr = (const uint32_t *)W->w + (size_t)r * words;
    if (W->bits == 4 && W->group % 8 == 0) { /* the common case, unrolled: same arithmetic */
        for (int g = 0; g < ng; g++) {
            float s = tl_load_elem(W->scales, W->stype, (size_t)r * ng + g);
            float b = tl_load_elem(W->biases, W->stype, (size_t)r * ng + g);
            for (int c = g * W->group; c < (g + 1) * W->group; c += 8) {
                uint32_t w = wr[c / 8];
                for (int k = 0; k < 8; k++) dst[c + k] = s * (float)((w >> (4 * k)) & 15u) + b;
            }
        }
        return;
    }
    int wi = 0, k = 0; /* column c is value k of word wi: c = wi * per + k */
    uint32_t w = wr[0];
    for (int g = 0, c = 0; g < ng; g++) {
        float s = tl_load_elem(W->scales, W->stype, (size_t)r * ng + g);
        float b = tl_load_elem(W->biases, W->stype, (size_t)r * ng + g);
        for (int end = c + W->group; c < end; c++) {
            dst[c] = s * (float)((w >> (k * W->bits)) & mask) + b;
            if (++k == per && c + 1 < W->cols) k = 0, w = wr[++wi];
        }
    }
}

float cpu_mat_get(const tl_mat *W, int r, int c) {
    if (W->bits == 0) return tl_load_elem(W->w, W->wtype, (size_t)r * W->cols + c);
    int per = 32 / W->bits, words = W->cols / per, ng = W->cols / W->group;
    const uint32_t *wr = (const uint32_t *)W->w + (size_t)r * words;
    uint32_t q = (wr[c / per] >> ((c % per) * W->bits)) & ((1u << W->bits) - 1);
    float s = tl_load_elem(W->scales, W->stype, (size_t)r * ng + c / W->group);
    float b = tl_load_elem(W->biases, W->stype, (size_t)r * ng + c / W->group);
    return s * (float)q + b;
}

/* Rows of W against n input vectors; the row is dequantized once and reused for every input. */
static void mat_rows_dot(float *Y, const tl_mat *W, const float *X, int n, int r0, int r1,
                         float *row) {
    for (int r = r0; r < r1; r++) {
        cpu_mat_row(row, W, r);
        for (int t = 0; t < n; t++) {
            const float *x = X + (size_t)t * W->cols;
            double acc = 0;
            for (int c = 0; c < W->cols; c++) acc += (double)row[c] * (double)x[c];
            Y[(size_t)t * W->rows + r] = (float)acc;
        }
    }
}

typedef struct {
    float *Y;
    const tl_mat *W;
    const float *X;
    int n, rows_per_task;
} matmul_job;

static void matmul_task(void *ctx, int i) {
    matmul_job *j = ctx;
    int r0 = i * j->rows_per_task, r1 = TL_MIN(j->W->rows, r0 + j->rows_per_task);
    float stackrow[4096];
    float *row = j->W->cols <= 4096 ? stackrow : xmalloc(sizeof(float) * j->W->cols);
    mat_rows_dot(j->Y, j->W, j->X, j->n, r0, r1, row);
    if (row != stackrow) free(row);
}

void cpu_matmul(float *Y, const tl_mat *W, const float *X, int n) {
    /* Small problems run inline: the pool's hand-off costs more than the work. */
    long work = (long)W->rows * W->cols * n;
    matmul_job j = {Y, W, X, n, 0};
    if (work < (1L << 16)) {
        j.rows_per_task = W->rows;
        matmul_task(&j, 0);
        return;
    }
    j.rows_per_task = TL_MAX(1, TL_MIN(64, W->rows / (4 * tl_pool_threads())));
    tl_pool_for(TL_CEIL_DIV(W->rows, j.rows_per_task), matmul_task, &j);
}

void cpu_matvec(float *y, const tl_mat *W, const float *x) { cpu_matmul(y, W, x, 1); }

void cpu_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] * inv) * w[i];
}

void cpu_rmsnorm_gated(float *y, const float *x, const float *z, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * inv) * cpu_silu(z[i]);
}

void cpu_l2norm(float *x, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)ss + eps);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

/* note: inv_freq and the angle are computed in fp32 exactly as HF does
 * (1 / base^(2j/n_rot) in fp32, angle = float(pos) * inv_freq), so long positions agree. */
void cpu_rope_neox(float *x, int n_rot, int pos, float base) {
    int half = n_rot / 2;
    for (int j = 0; j < half; j++) {
        float inv = 1.0f / powf(base, (float)(2 * j) / (float)n_rot);
        float ang = (float)pos * inv;
        float c = cosf(ang), s = sinf(ang);
        float a = x[j], b = x[j + half];
        x[j] = a * c - b * s;
        x[j + half] = b * c + a * s;
    }
}

void cpu_softmax(float *x, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] / sum);
}
