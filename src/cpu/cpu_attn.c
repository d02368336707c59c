/* CPU reference: causal softmax attention over a KV cache (docs/model.md §2.2 step 5), GQA. */
#include <math.h>
#include <stdlib.h>
#include "common/util.h"
#include "cpu/cpu.h"

void cpu_attention(float *out, const float *q, const float *kc, const float *vc, int n_q, int pos0,
                   int n_head, int n_head_kv, int D, float scale) {
    int grp = n_head / n_head_kv;
    int kv_len = pos0 + n_q;
    float *p = xmalloc(sizeof(float) * kv_len);
    for (int t = 0; t < n_q; t++) {
        int n_keys = pos0 + t + 1; /* causal: keys 0..pos */
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + ((size_t)t * n_head + h) * D;
            int kvh = h / grp;
            for (int j = 0; j < n_keys; j++) {
                const float *kj = kc + ((size_t)j * n_head_kv + kvh) * D;
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)qh[d] * kj[d];
                p[j] = (float)s * scale;
            }
            cpu_softmax(p, n_keys);
            float *oh = out + ((size_t)t * n_head + h) * D;
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int j = 0; j < n_keys; j++)
                    acc += (double)p[j] * vc[((size_t)j * n_head_kv + kvh) * D + d];
                oh[d] = (float)acc;
            }
        }
    }
    free(p);
}
