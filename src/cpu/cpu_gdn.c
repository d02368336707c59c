/* CPU reference: Gated DeltaNet pieces (docs/model.md §2.4): the causal depthwise conv with its
 * rolling state, the recurrent gated delta rule, and the same rule in chunked (WY) form.
 * State S of a value head is [Dk, Dv] (rows = key dim), as HF stores it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "common/util.h"
#include "cpu/cpu.h"

void cpu_conv1d_step(float *out, float *state, const float *x, const float *w, int C, int K) {
    for (int ch = 0; ch < C; ch++) {
        double acc = 0;
        for (int k = 0; k < K - 1; k++)
            acc += (double)w[(size_t)ch * K + k] * state[(size_t)k * C + ch];
        acc += (double)w[(size_t)ch * K + K - 1] * x[ch];
        out[ch] = cpu_silu((float)acc);
    }
    /* shift: drop the oldest input, append x */
    if (K > 1) {
        memmove(state, state + C, sizeof(float) * (size_t)C * (K - 2));
        memcpy(state + (size_t)C * (K - 2), x, sizeof(float) * C);
    }
}

void cpu_gdn_step(float *o, float *S, const float *q, const float *k, const float *v,
                  const float *g, const float *beta, int n_k_head, int n_v_head, int Dk, int Dv) {
    int rep = n_v_head / n_k_head;
    double *m = xmalloc(sizeof(double) * Dv);
    for (int h = 0; h < n_v_head; h++) {
        float *Sh = S + (size_t)h * Dk * Dv;
        const float *kh = k + (size_t)(h / rep) * Dk, *qh = q + (size_t)(h / rep) * Dk;
        const float *vh = v + (size_t)h * Dv;
        float decay = expf(g[h]);
        for (size_t i = 0; i < (size_t)Dk * Dv; i++) Sh[i] *= decay;
        for (int c = 0; c < Dv; c++) m[c] = 0;
        for (int r = 0; r < Dk; r++)
            for (int c = 0; c < Dv; c++) m[c] += (double)Sh[(size_t)r * Dv + c] * kh[r];
        for (int c = 0; c < Dv; c++) m[c] = (double)beta[h] * ((double)vh[c] - m[c]);
        for (int r = 0; r < Dk; r++)
            for (int c = 0; c < Dv; c++) Sh[(size_t)r * Dv + c] += (float)((double)kh[r] * m[c]);
        for (int c = 0; c < Dv; c++) {
            double acc = 0;
            for (int r = 0; r < Dk; r++) acc += (double)Sh[(size_t)r * Dv + c] * qh[r];
            o[(size_t)h * Dv + c] = (float)acc;
        }
    }
    free(m);
}

/* Chunked form, per value head and chunk of C tokens with in-chunk cumulative log decay b_t:
 *   S_t   = e^{b_t} S_0 + sum_{i<=t} e^{b_t-b_i} k_i d_i^T
 *   d_t   = beta_t (v_t - e^{b_t} S_0^T k_t - sum_{i<t} e^{b_t-b_i} (k_i.k_t) d_i)
 *         => (I + A) D = beta*V - beta*e^{b} (K S_0),  A[t,i] = beta_t e^{b_t-b_i} k_t.k_i (i<t)
 *   o_t   = e^{b_t} S_0^T q_t + sum_{i<=t} e^{b_t-b_i} (k_i.q_t) d_i
 *   S_C   = e^{b_C} S_0 + sum_i e^{b_C-b_i} k_i d_i^T
 * D is found by forward substitution (the UT transform, written as a solve). */
void cpu_gdn_chunked(float *o, float *S, const float *q, const float *k, const float *v,
                     const float *g, const float *beta, int T, int n_k_head, int n_v_head, int Dk,
                     int Dv, int chunk) {
    int rep = n_v_head / n_k_head;
    double *b = xmalloc(sizeof(double) * chunk);
    double *D = xmalloc(sizeof(double) * (size_t)chunk * Dv);
    double *S0 = xmalloc(sizeof(double) * (size_t)Dk * Dv);
    for (int h = 0; h < n_v_head; h++) {
        float *Sh = S + (size_t)h * Dk * Dv;
        int kh = h / rep;
        for (int t0 = 0; t0 < T; t0 += chunk) {
            int C = TL_MIN(chunk, T - t0);
#define KV(t) (k + ((size_t)(t0 + (t)) * n_k_head + kh) * Dk)
#define QV(t) (q + ((size_t)(t0 + (t)) * n_k_head + kh) * Dk)
#define VV(t) (v + ((size_t)(t0 + (t)) * n_v_head + h) * Dv)
#define GV(t) (g[(size_t)(t0 + (t)) * n_v_head + h])
#define BV(t) (beta[(size_t)(t0 + (t)) * n_v_head + h])
            for (size_t i = 0; i < (size_t)Dk * Dv; i++) S0[i] = Sh[i];
            double acc = 0;
            for (int t = 0; t < C; t++) b[t] = (acc += GV(t));
            for (int t = 0; t < C; t++) {
                const float *kt = KV(t);
                double et = exp(b[t]);
                for (int c = 0; c < Dv; c++) {
                    double ks = 0;
                    for (int r = 0; r < Dk; r++) ks += (double)kt[r] * S0[(size_t)r * Dv + c];
                    D[(size_t)t * Dv + c] = BV(t) * ((double)VV(t)[c] - et * ks);
                }
                for (int i = 0; i < t; i++) {
                    double kk = 0;
                    const float *ki = KV(i);
                    for (int r = 0; r < Dk; r++) kk += (double)kt[r] * ki[r];
                    double a = BV(t) * exp(b[t] - b[i]) * kk;
                    for (int c = 0; c < Dv; c++) D[(size_t)t * Dv + c] -= a * D[(size_t)i * Dv + c];
                }
            }
            for (int t = 0; t < C; t++) {
                const float *qt = QV(t);
                double et = exp(b[t]);
                for (int c = 0; c < Dv; c++) {
                    double qs = 0;
                    for (int r = 0; r < Dk; r++) qs += (double)qt[r] * S0[(size_t)r * Dv + c];
                    double out = et * qs;
                    for (int i = 0; i <= t; i++) {
                        double kq = 0;
                        const float *ki = KV(i);
                        for (int r = 0; r < Dk; r++) kq += (double)ki[r] * qt[r];
                        out += exp(b[t] - b[i]) * kq * D[(size_t)i * Dv + c];
                    }
                    o[((size_t)(t0 + t) * n_v_head + h) * Dv + c] = (float)out;
                }
            }
            double eC = exp(b[C - 1]);
            for (int r = 0; r < Dk; r++)
                for (int c = 0; c < Dv; c++) {
                    double s = eC * S0[(size_t)r * Dv + c];
                    for (int i = 0; i < C; i++)
                        s += exp(b[C - 1] - b[i]) * KV(i)[r] * D[(size_t)i * Dv + c];
                    Sh[(size_t)r * Dv + c] = (float)s;
                }
#undef KV
#undef QV
#undef VV
#undef GV
#undef BV
        }
    }
    free(b);
    free(D);
    free(S0);
}
