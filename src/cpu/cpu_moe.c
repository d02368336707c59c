/* CPU reference: MoE router and SwiGLU expert FFN (docs/model.md §2.5). */
#include <math.h>
#include <stdlib.h>
#include "common/util.h"
#include "cpu/cpu.h"

void cpu_moe_route(int *ids, float *w, const float *logits, int n_expert, int k) {
    float *p = xmalloc(sizeof(float) * n_expert);
    for (int e = 0; e < n_expert; e++) p[e] = logits[e];
    cpu_softmax(p, n_expert);
    /* selection by repeated max: ties go to the lower id */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= ids[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ids[j] = best;
        w[j] = p[best];
    }
    double sum = 0;
    for (int j = 0; j < k; j++) sum += w[j];
    for (int j = 0; j < k; j++) w[j] = (float)(w[j] / sum);
    free(p);
}

void cpu_ffn_swiglu(float *y, const tl_mat *gate, const tl_mat *up, const tl_mat *down,
                    const float *x, float *tmp) {
    int ff = gate->rows;
    float *a = tmp, *b = tmp + ff;
    cpu_matvec(a, gate, x);
    cpu_matvec(b, up, x);
    for (int i = 0; i < ff; i++) a[i] = cpu_silu(a[i]) * b[i];
    cpu_matvec(y, down, a);
}
